#!/usr/bin/env bash
# initiator-vs-kernel-target-tcp: our initiator (nvmf-bench, randwrite+verify) against
# the Linux target (nvmet) over NVMe/TCP. SKIP while nvmf-bench lacks the options used.
# vm-needs: build
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
bench_vs_kernel_target "$SCENARIO" tcp 127.0.0.1
