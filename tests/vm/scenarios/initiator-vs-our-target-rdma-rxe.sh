#!/usr/bin/env bash
# initiator-vs-our-target-rdma-rxe: nvmf-bench against our target over
# NVMe/RDMA on rxe0.
# vm-needs: build rdma
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && bench_vs_our_target "$SCENARIO" rdma "$RXE_IP"
