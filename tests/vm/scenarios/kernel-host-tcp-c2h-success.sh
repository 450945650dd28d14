#!/usr/bin/env bash
# kernel-host-tcp-c2h-success: the Linux NVMe/TCP host, which keeps SQ flow control on (no
# --disable-sqflow), against our target with `target.c2h_success: always`: every successful
# read's last C2HData PDU carries SUCCESS and no response capsule follows (as SPDK's target
# does by default); the host must complete its reads from the data PDU alone. Same checks as
# kernel-host-tcp (fio write+verify at 4k and 128k, reservations, Compare, large commands).
# vm-needs: build
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
TARGET_YAML="target: { c2h_success: always }"
kernel_host_vs_our_target "$SCENARIO" tcp 127.0.0.1
