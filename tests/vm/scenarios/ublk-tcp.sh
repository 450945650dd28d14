#!/usr/bin/env bash
# ublk-tcp: nvmf-ublk (issue #37) exposes our target's namespace (64 MiB ramdisk, NVMe/TCP
# 127.0.0.1) as /dev/ublkbN through Linux 6.12's ublk driver, two ublk queues (two NVMe I/O
# queues). It prints the device path alone on a line once the device is ready; the device has
# the namespace's size; fio randwrite with crc32c verify runs on the raw device; then
# mkfs.xfs, mount, fio randrw with crc32c verify on a file for 20 s (NVMF_VM_UBLK_SECS), fstrim
# (discards: Dataset Management), unmount; SIGTERM removes the device (gone from /dev within
# 5 s) and nvmf-ublk exits 0; the target's log stays clean.
# vm-needs: build ublk
# vm-kernel: 6.12
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"

ublk_case() {
  local label=$SCENARIO dev udev upid end secs=${NVMF_VM_UBLK_SECS:-20} rc mnt=$WORK/mnt
  teardown
  [ -n "${NVMF_UBLK_BIN:-}" ] && [ -x "$NVMF_UBLK_BIN" ] ||
    { fail "$label" "nvmf-ublk not available: ${NVMF_UBLK_NOTE:-NVMF_UBLK_BIN unset}"; return; }
  step "modprobe ublk_drv" modprobe ublk_drv || { fail "$label" "$REASON"; return; }
  dev=$(vm_ramdisk 64) || { fail "$label" "vm_ramdisk 64 failed"; return; }
  start_our_target tcp 127.0.0.1 "$dev" || { fail "$label" "$REASON"; return; }
  RUST_LOG=info NO_COLOR=1 "$NVMF_UBLK_BIN" --transport tcp --traddr 127.0.0.1 --trsvcid "$PORT" \
    --subnqn "$OUR_NQN" --queues 2 >"$OUT/ublk.out" 2>"$OUT/ublk.log" &
  upid=$!
  end=$((SECONDS + 20))
  until udev=$(grep -m1 -E '^/dev/ublkb[0-9]+$' "$OUT/ublk.out"); do
    kill -0 "$upid" 2>/dev/null || { wait "$upid"; fail "$label" "nvmf-ublk exited ($?) before the device was ready: $(tail -n 1 "$OUT/ublk.log" | cut -c1-200)"; return; }
    [ $SECONDS -ge $end ] && { kill -KILL "$upid"; fail "$label" "no device path on nvmf-ublk's output in 20 s"; return; }
    sleep 0.2
  done
  udevadm settle 2>/dev/null
  end=$((SECONDS + 10))
  until [ -b "$udev" ]; do
    [ $SECONDS -ge $end ] && { kill -KILL "$upid"; fail "$label" "$udev is not a block device 10 s after it was printed"; return; }
    sleep 0.2
  done
  log "nvmf-ublk (pid $upid) serves $udev"
  check_size "$udev" $((64 << 20)) || { kill -KILL "$upid"; fail "$label" "$REASON"; return; }
  fio_verify "$udev" 4k 32M >>"$OUT/report.txt" || { kill -KILL "$upid"; fail "$label" "raw device: $REASON"; return; }
  # xfsprogs refuses file systems under 300 MB outside fstests; these variables are fstests'.
  step "mkfs.xfs $udev" env TEST_DIR="$WORK" TEST_DEV="$udev" QA_CHECK_FS=1 mkfs.xfs -q -f "$udev" || { kill -KILL "$upid"; fail "$label" "$REASON"; return; }
  mkdir -p "$mnt"
  step "mount $udev" mount "$udev" "$mnt" || { kill -KILL "$upid"; fail "$label" "$REASON"; return; }
  step "fio randrw+verify on xfs for ${secs} s" fio --name=fs --directory="$mnt" --size=24M --rw=randrw \
    --bs=4k --iodepth=16 --ioengine=libaio --direct=1 --verify=crc32c --verify_fatal=1 \
    --time_based --runtime="$secs" --output="$OUT/fio-fs.txt"
  rc=$?
  grep -E '^[[:space:]]+(write|read):|err=' "$OUT/fio-fs.txt" | head -n 3 >>"$OUT/report.txt"
  [ $rc = 0 ] || { umount "$mnt"; kill -KILL "$upid"; fail "$label" "fio on xfs failed: $(grep -m1 -iE 'verify|err=' "$OUT/fio-fs.txt" | cut -c1-160)"; return; }
  grep -q 'err= 0' "$OUT/fio-fs.txt" || { umount "$mnt"; kill -KILL "$upid"; fail "$label" "fio on xfs reports errors"; return; }
  step "fstrim $mnt" fstrim -v "$mnt" || { umount "$mnt"; kill -KILL "$upid"; fail "$label" "$REASON"; return; }
  step "umount $mnt" umount "$mnt" || { kill -KILL "$upid"; fail "$label" "$REASON"; return; }
  # SIGTERM removes the device.
  kill -TERM "$upid"
  end=$((SECONDS + 10))
  while kill -0 "$upid" 2>/dev/null; do
    [ $SECONDS -ge $end ] && { kill -KILL "$upid"; fail "$label" "nvmf-ublk still running 10 s after SIGTERM"; return; }
    sleep 0.2
  done
  wait "$upid"; rc=$?
  [ $rc = 0 ] || { fail "$label" "nvmf-ublk exited with $rc after SIGTERM: $(tail -n 1 "$OUT/ublk.log" | cut -c1-200)"; return; }
  end=$((SECONDS + 5))
  while [ -e "$udev" ]; do
    [ $SECONDS -ge $end ] && { fail "$label" "$udev still exists 5 s after nvmf-ublk exited"; return; }
    sleep 0.2
  done
  echo "SIGTERM: nvmf-ublk exited 0 and $udev is gone" | tee -a "$OUT/report.txt" >>"$STEPS"
  grep -E 'ERROR|panicked' "$OUT/ublk.log" | head -n 3 | grep -q . && { fail "$label" "nvmf-ublk's log has errors: $(grep -m1 -E 'ERROR|panicked' "$OUT/ublk.log" | cut -c1-200)"; return; }
  stop_our_target || { fail "$label" "$REASON"; return; }
  check_target_log || { fail "$label" "$REASON"; return; }
  pass "$label"
}

ublk_case
