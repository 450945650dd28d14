#!/usr/bin/env bash
# soak-randrw-rdma-srq-rxe: soak-randrw-rdma-rxe (crc32c-verified random read/write, 2 queues, QD16)
# with our target on a shared receive queue (target.rdma_srq_depth ${NVMF_VM_RDMA_SRQ_DEPTH:-512}).
# vm-in-all: no
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
TARGET_YAML="target: { rdma_srq_depth: ${NVMF_VM_RDMA_SRQ_DEPTH:-512} }"
need_rdma RXE_IP && soak_randrw "$SCENARIO" "$RXE_IP"
