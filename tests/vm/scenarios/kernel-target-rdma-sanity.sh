#!/usr/bin/env bash
# kernel-target-rdma-sanity: Linux host <-> Linux target (nvmet) over NVMe/RDMA, on rxe0
# (Soft-RoCE) and on siw0 (soft-iWARP): discover, connect, fio write+verify. One verdict each.
# vm-needs: rdma
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && kernel_host_vs_kernel_target "$SCENARIO/rxe" rdma "$RXE_IP"
need_rdma SIW_IP && kernel_host_vs_kernel_target "$SCENARIO/siw" rdma "$SIW_IP"
