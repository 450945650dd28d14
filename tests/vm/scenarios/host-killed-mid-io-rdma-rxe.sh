#!/usr/bin/env bash
# host-killed-mid-io-rdma-rxe: an nvmf-bench host SIGKILLed with writes in flight over NVMe/RDMA
# on rxe0: our target frees every buffer and memory region (stats back to idle) and serves a
# second host (write/read/verify, flush, trim).
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && host_killed_mid_io "$SCENARIO" "$RXE_IP"
