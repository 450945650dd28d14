#!/usr/bin/env bash
# durability-kernel-host-tcp: what the Linux host was told is durable is durable at every crash
# point (issue #36). Our target serves, over tcp 127.0.0.1, a namespace whose backing store
# sits on dm-log-writes: first the block backend (the logged device itself), then the file
# backend (a file on ext4 on it). The host writes stamped blocks (some FUA, some Write Zeroes)
# and flushes; after each completed flush a mark goes into the log. The log is then replayed:
# at every flush/FUA entry every block is some version of itself, at every mark every write
# completed before that flush was sent (and every FUA write completed before the mark) is
# there (file backend: the replayed device mounted, as after a crash, at each mark). Last, xfs
# on the host's disk (block backend): files replaced with fsync, and at every mark the replayed
# xfs mounts, holds every file replaced before it whole, and passes `xfs_repair -n`.
# vm-needs: build
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../durability-lib.sh"
trap 'teardown; lw_release; cd / && rm -rf "$WORK"' EXIT

crashpoint_case "$SCENARIO" tcp 127.0.0.1 block &&
  crashpoint_case "$SCENARIO" tcp 127.0.0.1 file &&
  crashpoint_xfs_case "$SCENARIO" tcp 127.0.0.1 &&
  pass "$SCENARIO"
