#!/usr/bin/env bash
# ublk-rdma-rxe: ublk-tcp over NVMe/RDMA on rxe0 (Linux 6.12): nvmf-ublk exposes our target's
# namespace as /dev/ublkbN (two queues), raw fio verify, xfs + fio randrw verify across a
# target restart (the tags' buffers move to the new connection's registered memory), fstrim,
# SIGTERM removes the device; the NVMe side waits on the RDMA completion channel
# (Queue::prepare_wait) in the same reactor as the ublk ring.
# vm-needs: build ublk rdma
# vm-kernel: 6.12
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../ublk-lib.sh"
need_rdma RXE_IP && ublk_case rdma "$RXE_IP"
