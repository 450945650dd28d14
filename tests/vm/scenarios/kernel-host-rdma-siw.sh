#!/usr/bin/env bash
# kernel-host-rdma-siw: as kernel-host-tcp, over NVMe/RDMA on siw0 (soft-iWARP).
# SKIP while our target has no RDMA transport.
# vm-needs: build rdma
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_rdma SIW_IP && kernel_host_vs_our_target "$SCENARIO" rdma "$SIW_IP"
