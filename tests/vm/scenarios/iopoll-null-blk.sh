#!/usr/bin/env bash
# iopoll-null-blk: `target.iopoll: true` drives a block device with poll queues through an
# IORING_SETUP_IOPOLL ring. The device is a memory-backed null_blk (configfs) created with
# poll_queues=2, so sysfs queue/io_poll is 1; our target serves it over NVMe/TCP and must log
# polled_devices=1; the initiator's io_check (write/read/verify, flush, zeroes, trim) passes
# through it; then 4k randread QD1/QD16 with iopoll off and on, side by side (report.txt; no
# verdict on speed).
# vm-needs: build
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"

NB=/sys/kernel/config/nullb/nullb7
nullb_down() {
  [ -d "$NB" ] || return 0
  echo 0 >"$NB/power" 2>/dev/null
  rmdir "$NB" 2>/dev/null
}
trap 'nullb_down; cleanup' EXIT

# A 64 MiB memory-backed null_blk whose tag set has 2 poll queues (the configfs device takes its
# poll_queues default from the module parameter).
nullb_up() {
  modprobe null_blk nr_devices=0 poll_queues=2 || { REASON="modprobe null_blk failed"; return 1; }
  [ -d /sys/kernel/config/nullb ] || mount -t configfs none /sys/kernel/config 2>/dev/null
  mkdir "$NB" || { REASON="mkdir $NB failed"; return 1; }
  echo 64 >"$NB/size" && echo 4096 >"$NB/blocksize" && echo 1 >"$NB/memory_backed" &&
    echo 2 >"$NB/queue_mode" || { REASON="configuring $NB failed"; return 1; }
  [ -e "$NB/poll_queues" ] && echo 2 >"$NB/poll_queues"
  echo 1 >"$NB/power" || { REASON="powering $NB failed"; return 1; }
  local end=$((SECONDS + 10))
  while [ ! -b /dev/nullb7 ] && [ $SECONDS -lt $end ]; do sleep 0.2; done
  [ -b /dev/nullb7 ] || { REASON="/dev/nullb7 did not appear"; return 1; }
  local p
  p=$(cat /sys/block/nullb7/queue/io_poll 2>/dev/null)
  echo "nullb7: $(cat "$NB/size") MiB, poll_queues $(cat "$NB/poll_queues" 2>/dev/null || echo '?'), queue/io_poll $p, max_sectors_kb $(cat /sys/block/nullb7/queue/max_sectors_kb), max_segment_size $(cat /sys/block/nullb7/queue/max_segment_size), max_segments $(cat /sys/block/nullb7/queue/max_segments)" >>"$STEPS"
  [ "$p" = 1 ] || { REASON="/sys/block/nullb7/queue/io_poll is '$p', not 1: the device cannot be polled"; return 1; }
}

bench_qd() { # QD -> "IOPS p50_us" of a 4k randread run
  local qd=$1 b=$NVMF_BENCH_BIN
  step "nvmf-bench 4k randread QD$qd (iopoll $IOPOLL)" timeout 120 "$b" --transport tcp \
    --traddr 127.0.0.1 --trsvcid "$PORT" --subnqn "$OUR_NQN" --rw randread --bs 4k \
    --iodepth "$qd" --runtime 8 --output-format json >/dev/null || return 1
  sed -n '/^{/,$p' "$WORK/step.out" >"$WORK/r.json"
  awk '
    /"transport": "tcp"/ { t = 1 }
    t && /"iops":/ && !i { gsub(/[,"]/, ""); i = $2 }
    t && /"p50":/ && !p { gsub(/[,"]/, ""); p = $2 }
    END { if (i == "") exit 1; printf "%d %.1f\n", i, p / 1000 }' "$WORK/r.json"
}

label=$SCENARIO
teardown
nullb_up || { fail "$label" "$REASON"; exit 0; }
# The kernel side alone: fio's io_uring engine with hipri (IOPOLL) verifies on the device.
if command -v fio >/dev/null; then
  step "fio io_uring hipri verify on /dev/nullb7" timeout 120 fio --name=hipri --filename=/dev/nullb7 \
    --ioengine=io_uring --hipri=1 --direct=1 --rw=randwrite --bs=16k --iodepth=8 --size=8M \
    --verify=crc32c --do_verify=1 || { fail "$label" "IOPOLL does not work on this device even for fio: $REASON"; exit 0; }
fi
# The backend's polled ring alone (target/tests/iopoll.rs).
t=${NVMF_IOPOLL_TEST:-}
[ -n "$t" ] && [ -x "$t" ] || { fail "$label" "target/tests/iopoll.rs not built (NVMF_IOPOLL_TEST='$t')"; exit 0; }
step "backend polled ring on /dev/nullb7 (target/tests/iopoll.rs)" env NVMF_IOPOLL_DEV=/dev/nullb7 \
  timeout 120 "$t" --nocapture || { fail "$label" "$REASON"; exit 0; }
cp "$WORK/step.out" "$OUT/iopoll-test.txt"
grep -q SKIP "$WORK/step.out" && { fail "$label" "iopoll test skipped in the VM"; exit 0; }
rows=()
for IOPOLL in true false; do
  TARGET_YAML="target: { iopoll: $IOPOLL }"
  start_our_target tcp 127.0.0.1 /dev/nullb7 || { fail "$label" "$REASON"; exit 0; }
  want=$([ $IOPOLL = true ] && echo 1 || echo 0)
  end=$((SECONDS + 10))
  until grep -q "polled_devices=$want" "$OUT/target.log" || [ $SECONDS -ge $end ]; do sleep 0.2; done
  grep -q "polled_devices=$want" "$OUT/target.log" ||
    { fail "$label" "target log does not say polled_devices=$want with iopoll $IOPOLL"; exit 0; }
  log "iopoll $IOPOLL: $(grep -o 'polled_devices=[0-9]*' "$OUT/target.log" | head -n 1)"
  if [ $IOPOLL = true ]; then
    run_iocheck tcp 127.0.0.1 "$OUR_NQN" || { fail "$label" "io_check through the polled ring: $REASON"; exit 0; }
  fi
  for qd in 1 16; do
    r=$(bench_qd $qd) || { fail "$label" "bench QD$qd iopoll $IOPOLL: $REASON"; exit 0; }
    rows+=("$(printf '%-7s %-5s %10s %10s' "$IOPOLL" "QD$qd" $r)")
  done
  stop_our_target || { fail "$label" "$REASON"; exit 0; }
  check_target_log || { fail "$label" "$REASON"; exit 0; }
  cp "$OUT/target.log" "$OUT/target-iopoll-$IOPOLL.log"
done
{
  echo "iopoll-null-blk: our target on a memory-backed null_blk with 2 poll queues, NVMe/TCP loopback in the VM (TCG: ratios only)"
  printf '%-7s %-5s %10s %10s\n' iopoll qd IOPS "p50 us"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/report.txt"
pass "$label"
