#!/usr/bin/env bash
# bench-compare-tcp-rdma-rxe: nvmf-bench --compare tcp,rdma against our target listening on both
# transports on rxe0's address: the side-by-side table (IOPS, latency, CPU and copies per I/O) goes
# to the run's summary; RDMA must copy 0 payload bytes.
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && bench_compare_our_target "$SCENARIO" "$RXE_IP"
