#!/usr/bin/env bash
# kernel-host-rdma-rxe: as kernel-host-tcp, over NVMe/RDMA on rxe0 (Soft-RoCE), with the target
# also listening on NVMe/TCP and running `threads: 2`: exactly 2 poller threads serve both
# transports (the Linux host over RDMA, then nvmf-bench write+verify over TCP).
# vm-needs: build rdma
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && kernel_host_vs_our_target "$SCENARIO" rdma "$RXE_IP" tcp
