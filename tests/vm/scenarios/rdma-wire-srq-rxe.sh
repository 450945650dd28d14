#!/usr/bin/env bash
# rdma-wire-srq-rxe: the in-process NVMe/RDMA wire tests (rdma_raw.rs, rdma_access.rs) on rxe0 with
# every test daemon on a shared receive queue (target.rdma_srq_depth 64, NVMF_TEST_RDMA_SRQ_DEPTH):
# CM rejects, keyed SGLs, in-capsule data, bad capsules, buffers and regions back (and every shared
# RECV reposted) after the connections end, no region remotely accessible.
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
export NVMF_TEST_RDMA_SRQ_DEPTH=${NVMF_VM_RDMA_SRQ_DEPTH:-64}
need_rdma RXE_IP && rdma_wire "$SCENARIO" "$RXE_IP" rdma_raw rdma_access transport_alloc
