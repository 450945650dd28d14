#!/usr/bin/env bash
# kernel-target-tcp-sanity: Linux host <-> Linux target (nvmet) over NVMe/TCP on 127.0.0.1:
# discover, connect, fio write+verify. Proves the VM's peers work, so other failures are ours.
# vm-needs: none
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
kernel_host_vs_kernel_target "$SCENARIO" tcp 127.0.0.1
