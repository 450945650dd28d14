#!/usr/bin/env bash
# durability-kernel-host-rdma-rxe: durability-kernel-host-tcp over NVMe/RDMA on rxe0 (block and
# file backends, and xfs on the host's disk), every crash point of the dm-log-writes log checked.
# vm-needs: build rdma
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../durability-lib.sh"
trap 'teardown; lw_release; cd / && rm -rf "$WORK"' EXIT

need_rdma RXE_IP &&
  crashpoint_case "$SCENARIO" rdma "$RXE_IP" block &&
  crashpoint_case "$SCENARIO" rdma "$RXE_IP" file &&
  crashpoint_xfs_case "$SCENARIO" rdma "$RXE_IP" &&
  pass "$SCENARIO"
