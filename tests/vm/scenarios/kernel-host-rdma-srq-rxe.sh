#!/usr/bin/env bash
# kernel-host-rdma-srq-rxe: kernel-host-rdma-rxe with our target on a shared receive queue
# (target.rdma_srq_depth ${NVMF_VM_RDMA_SRQ_DEPTH:-512}: room for the admin queue and both I/O
# queues of 128 the Linux host opens, so no capsule finds the pool empty).
# vm-in-all: no
# vm-needs: build rdma
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
TARGET_YAML="target: { rdma_srq_depth: ${NVMF_VM_RDMA_SRQ_DEPTH:-512} }"
need_rdma RXE_IP && kernel_host_vs_our_target "$SCENARIO" rdma "$RXE_IP"
