#!/usr/bin/env bash
# initiator-vs-our-target-rdma-siw: nvmf-bench against our target over
# NVMe/RDMA on siw0.
# vm-needs: build rdma
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
need_rdma SIW_IP && bench_vs_our_target "$SCENARIO" rdma "$SIW_IP"
