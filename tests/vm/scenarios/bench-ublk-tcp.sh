#!/usr/bin/env bash
# bench-ublk-tcp: the same fio job on /dev/ublkbN (nvmf-ublk) and on the kernel's nvme-tcp device,
# both against one of our targets (64 MiB ramdisk, NVMe/TCP 127.0.0.1) in one boot, alternating,
# 3 trials each of 4k randread QD1 and QD32 (NVMF_VM_PERF_RUNTIME s, default 10). A measurement
# (the report's table), not a test: it fails only if a run cannot be made. Under TCG emulation
# the numbers say how the two paths compare here, not what hardware does.
# vm-needs: build ublk
# vm-kernel: 6.12
# vm-timeout: 600
# vm-in-all: no
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../ublk-lib.sh"

job() { # DEV QD TAG -> IOPS
  fio --name="$3" --filename="$1" --ioengine=libaio --direct=1 --rw=randread --bs=4k \
    --iodepth="$2" --time_based --runtime="${NVMF_VM_PERF_RUNTIME:-10}" --ramp_time=2 \
    --output-format=json --output="$OUT/fio-$3.json" >&2 || return 1
  sed -n 's/^[[:space:]]*"iops" : \([0-9]*\).*/\1/p' "$OUT/fio-$3.json" | head -n 1
}

bench_case() {
  local label=$SCENARIO dev kdev qd t u k
  teardown
  dev=$(vm_ramdisk 64) || { fail "$label" "vm_ramdisk 64 failed"; return; }
  start_our_target tcp 127.0.0.1 "$dev" || { fail "$label" "$REASON"; return; }
  ublk_start tcp 127.0.0.1 || { fail "$label" "$REASON"; return; }
  host_connect tcp 127.0.0.1 "$PORT" "$OUR_NQN" || { ublk_kill; fail "$label" "$REASON"; return; }
  kdev=$DEV
  echo "| case | trial | nvmf-ublk $UDEV IOPS | kernel nvme-tcp $kdev IOPS | ublk / kernel |" >>"$OUT/report.txt"
  echo "|---|---|---|---|---|" >>"$OUT/report.txt"
  for qd in 1 32; do
    for t in 1 2 3; do
      if [ $((t % 2)) = 1 ]; then
        u=$(job "$UDEV" $qd "ublk-qd$qd-$t") && k=$(job "$kdev" $qd "kernel-qd$qd-$t")
      else
        k=$(job "$kdev" $qd "kernel-qd$qd-$t") && u=$(job "$UDEV" $qd "ublk-qd$qd-$t")
      fi || { ublk_kill; fail "$label" "fio failed at QD$qd trial $t"; return; }
      echo "| 4k randread QD$qd | $t | $u | $k | $(awk -v a="$u" -v b="$k" 'BEGIN { printf "%.2f", a / b }') |" >>"$OUT/report.txt"
    done
  done
  host_disconnect "$OUR_NQN" || { ublk_kill; fail "$label" "$REASON"; return; }
  ublk_stop || { fail "$label" "$REASON"; return; }
  stop_our_target || { fail "$label" "$REASON"; return; }
  pass "$label"
}

bench_case
