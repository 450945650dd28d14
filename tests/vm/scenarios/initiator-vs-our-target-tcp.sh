#!/usr/bin/env bash
# initiator-vs-our-target-tcp: nvmf-bench against our target over NVMe/TCP
# (then SIGTERM, clean target log).
# vm-needs: build
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
bench_vs_our_target "$SCENARIO" tcp 127.0.0.1
