#!/usr/bin/env bash
# initiator-vs-kernel-target-rdma-siw: nvmf-bench against the Linux target over
# NVMe/RDMA on siw0.
# vm-needs: build rdma
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
need_rdma SIW_IP && bench_vs_kernel_target "$SCENARIO" rdma "$SIW_IP"
