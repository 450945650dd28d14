# The nvmf-ublk scenarios' steps (sourced after lib.sh).

# ublk_start TRTYPE ADDR [ARGS...]: nvmf-ublk against our target's subsystem on ADDR:PORT, two
# queues; waits (20 s) for the device path on its output and the block device. Sets UDEV and
# UPID (REASON and 1 on failure, nvmf-ublk killed).
ublk_start() {
  local tr=$1 addr=$2 end
  shift 2
  [ -n "${NVMF_UBLK_BIN:-}" ] && [ -x "$NVMF_UBLK_BIN" ] ||
    { REASON="nvmf-ublk not available: ${NVMF_UBLK_NOTE:-NVMF_UBLK_BIN unset}"; return 1; }
  step "modprobe ublk_drv" modprobe ublk_drv || return 1
  RUST_LOG=info NO_COLOR=1 "$NVMF_UBLK_BIN" --transport "$tr" --traddr "$addr" --trsvcid "$PORT" \
    --subnqn "$OUR_NQN" --queues 2 "$@" >"$OUT/ublk.out" 2>"$OUT/ublk.log" &
  UPID=$!
  end=$((SECONDS + 20))
  until UDEV=$(grep -m1 -E '^/dev/ublkb[0-9]+$' "$OUT/ublk.out"); do
    kill -0 "$UPID" 2>/dev/null || { wait "$UPID"; REASON="nvmf-ublk exited ($?) before the device was ready: $(tail -n 1 "$OUT/ublk.log" | cut -c1-200)"; UPID=; return 1; }
    [ $SECONDS -ge $end ] && { ublk_kill; REASON="no device path on nvmf-ublk's output in 20 s"; return 1; }
    sleep 0.2
  done
  udevadm settle 2>/dev/null
  end=$((SECONDS + 10))
  until [ -b "$UDEV" ]; do
    [ $SECONDS -ge $end ] && { ublk_kill; REASON="$UDEV is not a block device 10 s after it was printed"; return 1; }
    sleep 0.2
  done
  log "nvmf-ublk (pid $UPID) serves $UDEV"
}

ublk_kill() { [ -n "${UPID:-}" ] && { kill -KILL "$UPID" 2>/dev/null; wait "$UPID" 2>/dev/null; UPID=; }; }

# ublk_stop: SIGTERM; nvmf-ublk must exit 0 within 10 s and the device be gone 5 s later, with
# no error in its log (REASON and 1 otherwise).
ublk_stop() {
  local end rc
  kill -TERM "$UPID"
  end=$((SECONDS + 10))
  while kill -0 "$UPID" 2>/dev/null; do
    [ $SECONDS -ge $end ] && { ublk_kill; REASON="nvmf-ublk still running 10 s after SIGTERM"; return 1; }
    sleep 0.2
  done
  wait "$UPID"; rc=$?; UPID=
  [ $rc = 0 ] || { REASON="nvmf-ublk exited with $rc after SIGTERM: $(tail -n 1 "$OUT/ublk.log" | cut -c1-200)"; return 1; }
  end=$((SECONDS + 5))
  while [ -e "$UDEV" ]; do
    [ $SECONDS -ge $end ] && { REASON="$UDEV still exists 5 s after nvmf-ublk exited"; return 1; }
    sleep 0.2
  done
  if grep -qE 'ERROR|panicked' "$OUT/ublk.log"; then
    REASON="nvmf-ublk's log has errors: $(grep -m1 -E 'ERROR|panicked' "$OUT/ublk.log" | cut -c1-200)"
    return 1
  fi
  echo "SIGTERM: nvmf-ublk exited 0 and $UDEV is gone" | tee -a "$OUT/report.txt" >>"$STEPS"
}

# ublk_case TRTYPE ADDR: the whole ublk-* case (see ublk-tcp.sh).
ublk_case() {
  local label=$SCENARIO tr=$1 addr=$2 dev secs=${NVMF_VM_UBLK_SECS:-60} rc fpid mnt=$WORK/mnt
  teardown
  dev=$(vm_ramdisk 64) || { fail "$label" "vm_ramdisk 64 failed"; return; }
  start_our_target "$tr" "$addr" "$dev" || { fail "$label" "$REASON"; return; }
  ublk_start "$tr" "$addr" || { fail "$label" "$REASON"; return; }
  check_size "$UDEV" $((64 << 20)) || { ublk_kill; fail "$label" "$REASON"; return; }
  fio_verify "$UDEV" 4k 32M >>"$OUT/report.txt" || { ublk_kill; fail "$label" "raw device: $REASON"; return; }
  # xfsprogs refuses file systems under 300 MB outside fstests; these variables are fstests'.
  step "mkfs.xfs $UDEV" env TEST_DIR="$WORK" TEST_DEV="$UDEV" QA_CHECK_FS=1 mkfs.xfs -q -f "$UDEV" ||
    { ublk_kill; fail "$label" "$REASON"; return; }
  mkdir -p "$mnt"
  step "mount $UDEV" mount "$UDEV" "$mnt" || { ublk_kill; fail "$label" "$REASON"; return; }
  # The target is SIGKILLed a third into the run and started again 3 s later (same config,
  # same ramdisk): nvmf-ublk stalls the requests, reconnects and sends them again.
  log "fio randrw+verify on xfs for ${secs} s, the target restarted once"
  fio --name=fs --directory="$mnt" --size=24M --rw=randrw \
    --bs=4k --iodepth=16 --ioengine=libaio --direct=1 --verify=crc32c --verify_fatal=1 \
    --time_based --runtime="$secs" --output="$OUT/fio-fs.txt" >/dev/null 2>&1 &
  fpid=$!
  sleep $((secs / 3))
  kill_target
  sleep 3
  start_our_target "$tr" "$addr" "$dev" || { kill "$fpid"; umount -l "$mnt"; ublk_kill; fail "$label" "restart: $REASON"; return; }
  echo "target SIGKILLed $((secs / 3)) s into fio and started again 3 s later" >>"$OUT/report.txt"
  wait "$fpid"
  rc=$?
  grep -E '^[[:space:]]+(write|read):|err=' "$OUT/fio-fs.txt" | head -n 3 >>"$OUT/report.txt"
  [ $rc = 0 ] || { umount "$mnt"; ublk_kill; fail "$label" "fio on xfs failed across the target restart: $(grep -m1 -iE 'verify|err=' "$OUT/fio-fs.txt" | cut -c1-160)"; return; }
  grep -q 'err= 0' "$OUT/fio-fs.txt" || { umount "$mnt"; ublk_kill; fail "$label" "fio on xfs reports errors"; return; }
  grep -q 'the NVMe queue is back' "$OUT/ublk.log" ||
    { umount "$mnt"; ublk_kill; fail "$label" "nvmf-ublk did not reconnect (no 'the NVMe queue is back' in its log)"; return; }
  echo "nvmf-ublk reconnected: $(grep -c 'the NVMe queue is back' "$OUT/ublk.log") queue(s) back, fio err=0, no verify failure" >>"$OUT/report.txt"
  step "fstrim $mnt" fstrim -v "$mnt" || { umount "$mnt"; ublk_kill; fail "$label" "$REASON"; return; }
  step "umount $mnt" umount "$mnt" || { ublk_kill; fail "$label" "$REASON"; return; }
  ublk_stop || { fail "$label" "$REASON"; return; }
  stop_our_target || { fail "$label" "$REASON"; return; }
  check_target_log || { fail "$label" "$REASON"; return; }
  pass "$label"
}
