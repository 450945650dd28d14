#!/usr/bin/env bash
# initiator-vs-our-target-rdma-srq-siw: nvmf-bench against our target over NVMe/RDMA on siw0, the
# target on a shared receive queue (target.rdma_srq_depth ${NVMF_VM_RDMA_SRQ_DEPTH:-512}).
# vm-in-all: no
# vm-needs: build rdma
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
TARGET_YAML="target: { rdma_srq_depth: ${NVMF_VM_RDMA_SRQ_DEPTH:-512} }"
need_rdma SIW_IP && bench_vs_our_target "$SCENARIO" rdma "$SIW_IP"
