#!/usr/bin/env bash
# soak-randrw-rdma-rxe: a mixed random read/write soak with crc32c verification over NVMe/RDMA on
# rxe0 (nvmf-bench, 2 queues, QD16, NVMF_VM_SOAK_SECS=60 s): 0 mismatches, clean target log.
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && soak_randrw "$SCENARIO" "$RXE_IP"
