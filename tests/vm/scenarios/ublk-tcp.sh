#!/usr/bin/env bash
# ublk-tcp: nvmf-ublk (issue #37) exposes our target's namespace (64 MiB ramdisk, NVMe/TCP
# 127.0.0.1) as /dev/ublkbN through Linux 6.12's ublk driver, two ublk queues (two NVMe I/O
# queues). It prints the device path alone on a line once the device is ready; the device has
# the namespace's size; fio randwrite with crc32c verify runs on the raw device; then
# mkfs.xfs, mount, fio randrw with crc32c verify on a file for 60 s (NVMF_VM_UBLK_SECS) while
# the target is SIGKILLed and started again (nvmf-ublk stalls the requests, reconnects and sends
# them again: fio ends with err=0 and no verify failure), fstrim
# (discards: Dataset Management), unmount; SIGTERM removes the device (gone from /dev within
# 5 s) and nvmf-ublk exits 0; the target's log stays clean.
# vm-needs: build ublk
# vm-kernel: 6.12
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../ublk-lib.sh"
ublk_case tcp 127.0.0.1
