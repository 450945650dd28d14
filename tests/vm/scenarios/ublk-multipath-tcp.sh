#!/usr/bin/env bash
# ublk-multipath-tcp: nvmf-ublk over two paths (issue #37): two of our targets, on 127.0.0.1
# and 127.0.0.2, export the same 64 MiB of storage as one subsystem (two controllers of one
# namespace, as a dual-headed array: each its own loop device over one file, since a target
# opens its block device exclusively), and nvmf-ublk is given both (--traddr twice). fio
# randrw with crc32c verify runs on xfs for 60 s (NVMF_VM_UBLK_SECS) and the target serving
# the path in use is SIGKILLed a third into it: nvmf-ublk moves to the other path, fio ends
# with err=0 and no verify failure; SIGTERM removes the device.
# vm-needs: build ublk
# vm-kernel: 6.12
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../ublk-lib.sh"

label=$SCENARIO
secs=${NVMF_VM_UBLK_SECS:-60}
mnt=$WORK/mnt
B_PID= LOOPS=()
stop_b() {
  [ -n "$B_PID" ] && { kill -TERM "$B_PID" 2>/dev/null; wait "$B_PID" 2>/dev/null; B_PID=; }
  local l
  for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null; done
  LOOPS=()
}
run_case() {
  local dev devb bin rc fpid
  teardown
  truncate -s 64M "$WORK/shared.img" || { fail "$label" "truncate failed"; return; }
  modprobe loop 2>>"$STEPS"
  dev=$(losetup -f --show "$WORK/shared.img") && LOOPS+=("$dev") &&
    devb=$(losetup -f --show "$WORK/shared.img") && LOOPS+=("$devb") ||
    { stop_b; fail "$label" "losetup failed: $(losetup -f 2>&1 | tail -n 1)"; return; }
  bin=$(target_bin) || { fail "$label" "$REASON"; return; }
  # B: the second head, a target of its own on 127.0.0.2 with the same namespace.
  cat >"$OUT/target-b.yaml" <<YAML
listeners:
  - { transport: tcp, address: 127.0.0.2, port: $PORT }
subsystems:
  - nqn: $OUR_NQN
    allow_any_host: true
    namespaces:
      - { nsid: 1, path: $devb }
YAML
  RUST_LOG=info NO_COLOR=1 "$bin" --config "$OUT/target-b.yaml" >"$OUT/target-b.log" 2>&1 &
  B_PID=$!
  vm_wait_listen tcp 127.0.0.2 "$PORT" 20 || { stop_b; fail "$label" "target B does not listen: $(tail -n 1 "$OUT/target-b.log")"; return; }
  start_our_target tcp 127.0.0.1 "$dev" || { stop_b; fail "$label" "$REASON"; return; }
  ublk_start tcp 127.0.0.1 --traddr 127.0.0.2 || { stop_b; fail "$label" "$REASON"; return; }
  check_size "$UDEV" $((64 << 20)) || { ublk_kill; stop_b; fail "$label" "$REASON"; return; }
  step "mkfs.xfs $UDEV" env TEST_DIR="$WORK" TEST_DEV="$UDEV" QA_CHECK_FS=1 mkfs.xfs -q -f "$UDEV" ||
    { ublk_kill; stop_b; fail "$label" "$REASON"; return; }
  mkdir -p "$mnt"
  step "mount $UDEV" mount "$UDEV" "$mnt" || { ublk_kill; stop_b; fail "$label" "$REASON"; return; }
  log "fio randrw+verify on xfs for ${secs} s, target A (the path in use) killed at $((secs / 3)) s"
  fio --name=fs --directory="$mnt" --size=24M --rw=randrw --bs=4k --iodepth=16 --ioengine=libaio \
    --direct=1 --verify=crc32c --verify_fatal=1 --time_based --runtime="$secs" \
    --output="$OUT/fio-fs.txt" >/dev/null 2>&1 &
  fpid=$!
  sleep $((secs / 3))
  kill_target
  echo "target A (127.0.0.1, the path in use) SIGKILLed $((secs / 3)) s into fio; B (127.0.0.2) stays" >>"$OUT/report.txt"
  wait "$fpid"; rc=$?
  grep -E '^[[:space:]]+(write|read):|err=' "$OUT/fio-fs.txt" | head -n 3 >>"$OUT/report.txt"
  [ $rc = 0 ] && grep -q 'err= 0' "$OUT/fio-fs.txt" ||
    { umount -l "$mnt"; ublk_kill; stop_b; fail "$label" "fio on xfs failed across the path loss: $(grep -m1 -iE 'verify|err=' "$OUT/fio-fs.txt" | cut -c1-160)"; return; }
  grep -q 'the NVMe queue is back' "$OUT/ublk.log" ||
    { umount -l "$mnt"; ublk_kill; stop_b; fail "$label" "nvmf-ublk did not move to the other path"; return; }
  grep -m1 'reconnected' "$OUT/ublk.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200 >>"$OUT/report.txt"
  echo "nvmf-ublk moved to path B: fio err=0, no verify failure" >>"$OUT/report.txt"
  step "umount $mnt" umount "$mnt" || { ublk_kill; stop_b; fail "$label" "$REASON"; return; }
  ublk_stop || { stop_b; fail "$label" "$REASON"; return; }
  stop_b
  if sed 's/\x1b\[[0-9;]*m//g' "$OUT/target-b.log" | grep -qE '(^|[[:space:]])ERROR([[:space:]:]|$)|panicked'; then
    fail "$label" "target B's log has errors: $(grep -m1 -E 'ERROR|panicked' "$OUT/target-b.log" | cut -c1-200)"; return
  fi
  pass "$label"
}
run_case
