#!/usr/bin/env bash
# perf-vs-nvmet: benchmark (issue #6 goal 4): the kernel host's fio 4k randread QD32 against the
# Linux kernel target and against ours, over tcp and rdma/rxe, same RAM disk, same run. Passes when
# every run completes; the IOPS table and ratios go to the run's summary.
# vm-needs: build rdma
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && perf_vs_nvmet "$SCENARIO"
