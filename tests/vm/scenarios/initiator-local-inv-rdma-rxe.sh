#!/usr/bin/env bash
# initiator-local-inv-rdma-rxe: our initiator (io_check) against our target on rxe0 with the
# target's SEND_WITH_INVALIDATE off (NVMF_RDMA_SEND_WITH_INV=off): every memory window key the
# initiator binds comes back alive in a plain SEND, and the initiator must invalidate it itself
# (LOCAL_INV) before the command completes: io_check verifies the data and checks that every
# window bound was invalidated; here every one of them locally. Then io_check runs every
# operation of the block API on each form of the initiator's Namespace over NVMe/RDMA: one
# path, one that reconnects, and two paths (rxe and NVMe/TCP on the same address and port).
# vm-needs: build rdma
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
# rxe gets a registration per command by default (it replays binds when it retransmits): ask
# for windows.
export NVMF_RDMA_KEYS=windows
label=$SCENARIO
if need_rdma RXE_IP; then
  teardown
  log "case $label: rdma $RXE_IP:$PORT, target SEND_WITH_INV off"
  if dev=$(vm_ramdisk $RAMDISK_MB); then
    NVMF_VM_TARGET_ENV="NVMF_RDMA_SEND_WITH_INV=off ${NVMF_VM_TARGET_ENV:-}" start_our_target rdma "$RXE_IP" "$dev" tcp; rc=$?
    if [ $rc != 0 ]; then
      fail "$label" "$REASON"
    elif ! IOCHECK_EXTRA="--forms-with tcp" run_iocheck rdma "$RXE_IP" "$OUR_NQN"; then
      fail "$label" "$REASON"
    elif [ "$(grep -cE '^forms: (plain|reconnecting|multipath): every operation ok' "$OUT/io_check-rdma.txt")" != 3 ]; then
      fail "$label" "io_check did not run every operation on the three forms: $(grep -m1 -E '^forms|FAILED' "$OUT/io_check-rdma.txt")"
    elif ! grep -qE 'buffer keys: [1-9][0-9]* windows bound \(0 invalidated by the target, [1-9][0-9]* locally\)' "$OUT/io_check-rdma.txt"; then
      fail "$label" "io_check did not invalidate its window keys locally: $(grep -m1 'buffer keys' "$OUT/io_check-rdma.txt")"
    elif ! stop_our_target || ! check_target_log; then
      fail "$label" "$REASON"
    else
      log "ok: $(grep -m1 'buffer keys' "$OUT/io_check-rdma.txt")"
      grep -E '^forms: ' "$OUT/io_check-rdma.txt" | while read -r l; do log "$l"; done
      pass "$label"
    fi
  else
    fail "$label" "vm_ramdisk $RAMDISK_MB failed"
  fi
fi
