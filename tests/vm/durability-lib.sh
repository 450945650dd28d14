# shellcheck shell=bash
# Crash-point helpers for the durability-* scenarios (issue #36; sourced after lib.sh). The
# namespace's backing store sits on dm-log-writes: brd's /dev/ram0 holds the data (the
# device-mapper target `nvmf-lw` maps its first LW_MB MiB), /dev/ram1 the log, /dev/ram2 is the
# scratch disk the checker mounts replayed states from. The crashpoint example
# (tests/examples/crashpoint.rs) writes through the Linux host and checks the log afterwards.
LW=nvmf-lw LW_MB=32 LW_BLOCKS=4096
CRASHPOINT_SECS=${NVMF_VM_CRASHPOINT_SECS:-12}
# 16 KiB buffers: the workload's 64 KiB writes (and xfs's larger ones) move in pieces.
PIECES_YAML="target: { io_unit_size: 16KiB }"

crashpoint_bin() { # -> path of the crashpoint example, or REASON and 1
  [ -n "${NVMF_CRASHPOINT_BIN:-}" ] && [ -x "$NVMF_CRASHPOINT_BIN" ] ||
    { REASON="crashpoint not available: ${NVMF_CRASHPOINT_NOTE:-NVMF_CRASHPOINT_BIN unset}"; return 1; }
  echo "$NVMF_CRASHPOINT_BIN"
}

# lw_up: fresh RAM disks and the logging device /dev/mapper/$LW (REASON on failure).
lw_up() {
  lw_down
  rmmod brd 2>/dev/null
  [ -b /dev/ram0 ] && { REASON="brd is busy (cannot reload it with three disks)"; return 1; }
  step "modprobe brd (3 x 192 MiB)" modprobe brd rd_nr=3 rd_size=$((192 * 1024)) max_part=0 || return 1
  step "modprobe dm-log-writes" modprobe dm-log-writes || return 1
  udevadm settle 2>/dev/null
  step "dmsetup create $LW (log-writes)" dmsetup create "$LW" \
    --table "0 $((LW_MB * 2048)) log-writes /dev/ram0 /dev/ram1" || return 1
  udevadm settle 2>/dev/null
  [ -b "/dev/mapper/$LW" ] || { REASON="no /dev/mapper/$LW"; return 1; }
}

# lw_down: remove the logging device (its log's super block is final then) and nothing else.
lw_down() {
  dmsetup info "$LW" >/dev/null 2>&1 || return 0
  umount "$WORK/fs" 2>/dev/null
  dmsetup remove "$LW" >>"$STEPS" 2>&1
}

# lw_release: the RAM disks go too (later scenarios load brd their own way).
lw_release() {
  lw_down
  umount "$WORK/mnt" 2>/dev/null
  rmmod brd 2>/dev/null
}

# crashpoint_case LABEL TRTYPE ADDR BACKEND: our target serves the logged device as a block
# device (BACKEND=block) or a 16 MiB file on ext4 on it (BACKEND=file); the Linux host runs
# `crashpoint blocks` (stamped writes, 64 KiB ones moved in pieces by the target, FUA, Write
# Zeroes, a flush and a mark every 200 ms); then
# every flush/FUA point and mark of the log is checked (`crashpoint check`).
crashpoint_case() {
  local label=$1 tr=$2 addr=$3 backend=$4 cp ns rec=$OUT/record-$4.txt check_args=() blocks_args=() out rc
  teardown
  cp=$(crashpoint_bin) || { fail "$label" "$REASON"; return 1; }
  lw_up || { fail "$label" "$REASON"; return 1; }
  case $backend in
    block) ns=/dev/mapper/$LW ;;
    file)
      step "mkfs.ext4 on $LW" mkfs.ext4 -q -F "/dev/mapper/$LW" || { fail "$label" "$REASON"; return 1; }
      mkdir -p "$WORK/fs" && mount "/dev/mapper/$LW" "$WORK/fs" || { fail "$label" "cannot mount ext4 on $LW"; return 1; }
      # Written out (not sparse) and synced before the workload: O_DIRECT overwrites need no
      # allocation, as a preallocated image's would.
      step "16 MiB namespace file" dd if=/dev/zero of="$WORK/fs/nvmf.img" bs=1M count=16 conv=fsync status=none ||
        { fail "$label" "$REASON"; return 1; }
      ns=$WORK/fs/nvmf.img
      check_args=(--file nvmf.img --scratch /dev/ram2 --mnt "$WORK/mnt")
      # A file punches holes: deallocated blocks read zeroes (DLFEAT), so discards are checked.
      blocks_args=(--discard-every 24)
      ;;
  esac
  TARGET_YAML="$PIECES_YAML" start_our_target "$tr" "$addr" "$ns"; rc=$?
  [ $rc = 3 ] && { skip "$label" "$REASON"; return 1; }
  [ $rc = 0 ] || { fail "$label" "$REASON"; return 1; }
  host_connect "$tr" "$addr" "$PORT" "$OUR_NQN" || { fail "$label" "$REASON"; return 1; }
  # dm-log-writes caches (it takes flushes), and so does a file: VWC, so the host flushes.
  check_write_cache "$DEV" "write back" || { fail "$label" "$REASON"; return 1; }
  out=$OUT/crashpoint-blocks-$backend.txt
  step "crashpoint blocks on $DEV ($backend backend, ${CRASHPOINT_SECS} s)" \
    "$cp" blocks --dev "$DEV" --blocks "$LW_BLOCKS" --secs "$CRASHPOINT_SECS" --mark-dev "$LW" --record "$rec" "${blocks_args[@]}" ||
    { fail "$label" "$REASON"; return 1; }
  cp "$WORK/step.out" "$out"
  grep '^crashpoint blocks:' "$out" | sed "s/^/$backend: /" | tee -a "$OUT/report.txt"
  host_disconnect "$OUR_NQN" || { fail "$label" "$REASON"; return 1; }
  stop_our_target || { fail "$label" "$REASON"; return 1; }
  check_target_log || { fail "$label" "$REASON"; return 1; }
  umount "$WORK/fs" 2>/dev/null
  lw_down
  out=$OUT/crashpoint-check-$backend.txt
  "$cp" check --log /dev/ram1 --record "$rec" --device-bytes $((LW_MB * 1048576)) "${check_args[@]}" >"$out" 2>&1
  rc=$?
  sed "s/^/$backend: /" "$out" | tee -a "$OUT/report.txt"
  if [ -n "${EXPECT_LOST:-}" ]; then
    # A broken target: the checker must name a lost write and its mark.
    case $rc in
      1) grep -q '^first finding: at mark .*(lost write)' "$out" && return 0
         fail "$label" "$backend backend: the checker failed the broken target, but not with a lost write at a mark: $(grep -m1 '^first finding' "$out" | cut -c1-200)"; return 1 ;;
      0) fail "$label" "$backend backend: the checker found nothing wrong with a target whose Flush does nothing"; return 1 ;;
      *) fail "$label" "$backend backend: crashpoint check failed: $(tail -n 1 "$out" | cut -c1-200)"; return 1 ;;
    esac
  fi
  case $rc in
    0) ;;
    1) fail "$label" "$backend backend: $(grep -m1 '^first finding\|^marks of the record' "$out" | cut -c1-220)"; return 1 ;;
    *) fail "$label" "$backend backend: crashpoint check failed: $(tail -n 1 "$out" | cut -c1-200)"; return 1 ;;
  esac
  return 0
}

# crashpoint_xfs_case LABEL TRTYPE ADDR: xfs on the Linux host's disk (our target's block backend
# on the logged device); `crashpoint files` replaces files the fsync way and marks the log; at
# every mark the replayed xfs is mounted (log recovery), every file checked, and `xfs_repair -n`
# must pass.
crashpoint_xfs_case() {
  local label=$1 tr=$2 addr=$3 cp rec=$OUT/record-xfs.txt out rc
  teardown
  cp=$(crashpoint_bin) || { fail "$label" "$REASON"; return 1; }
  lw_up || { fail "$label" "$REASON"; return 1; }
  TARGET_YAML="$PIECES_YAML" start_our_target "$tr" "$addr" "/dev/mapper/$LW"; rc=$?
  [ $rc = 3 ] && { skip "$label" "$REASON"; return 1; }
  [ $rc = 0 ] || { fail "$label" "$REASON"; return 1; }
  host_connect "$tr" "$addr" "$PORT" "$OUR_NQN" || { fail "$label" "$REASON"; return 1; }
  # xfsprogs refuses file systems under 300 MB outside fstests; these variables are fstests'.
  step "mkfs.xfs on $DEV" env TEST_DIR="$WORK" TEST_DEV="$DEV" QA_CHECK_FS=1 mkfs.xfs -q -f "$DEV" ||
    { fail "$label" "$REASON"; return 1; }
  mkdir -p "$WORK/hostfs" && mount "$DEV" "$WORK/hostfs" || { fail "$label" "cannot mount xfs on $DEV"; return 1; }
  step "crashpoint files on xfs on $DEV (${CRASHPOINT_SECS} s)" \
    "$cp" files --dir "$WORK/hostfs" --secs "$CRASHPOINT_SECS" --batch "${NVMF_VM_CRASHPOINT_BATCH:-8}" --mark-dev "$LW" --record "$rec" ||
    { umount "$WORK/hostfs"; fail "$label" "$REASON"; return 1; }
  grep '^crashpoint files:' "$WORK/step.out" | sed 's/^/xfs: /' | tee -a "$OUT/report.txt"
  umount "$WORK/hostfs" || { fail "$label" "cannot unmount the host's xfs"; return 1; }
  host_disconnect "$OUR_NQN" || { fail "$label" "$REASON"; return 1; }
  stop_our_target || { fail "$label" "$REASON"; return 1; }
  check_target_log || { fail "$label" "$REASON"; return 1; }
  lw_down
  out=$OUT/crashpoint-check-xfs.txt
  "$cp" check --log /dev/ram1 --record "$rec" --device-bytes $((LW_MB * 1048576)) --files \
    --scratch /dev/ram2 --mnt "$WORK/mnt" >"$out" 2>&1
  rc=$?
  sed 's/^/xfs: /' "$out" | tee -a "$OUT/report.txt"
  case $rc in
    0) return 0 ;;
    1) fail "$label" "xfs on top: $(grep -m1 '^first finding\|^marks of the record' "$out" | cut -c1-220)"; return 1 ;;
    *) fail "$label" "xfs on top: crashpoint check failed: $(tail -n 1 "$out" | cut -c1-200)"; return 1 ;;
  esac
}
