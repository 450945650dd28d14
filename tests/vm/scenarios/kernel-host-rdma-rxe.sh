#!/usr/bin/env bash
# kernel-host-rdma-rxe: as kernel-host-tcp, over NVMe/RDMA on rxe0 (Soft-RoCE).
# SKIP while our target has no RDMA transport.
# vm-needs: build rdma
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && kernel_host_vs_our_target "$SCENARIO" rdma "$RXE_IP"
