#!/usr/bin/env bash
# bench-fio-engine-tcp: benchmark (issue #37): the same fio job, 4k randread at QD1 and QD32,
# against our target over NVMe/TCP (127.0.0.1, one RAM disk) three ways in one run: fio with our
# engine (libnvmf_fio.so), nvmf-bench, and fio (io_uring, O_DIRECT) on the kernel host's
# nvme-tcp block device, in interleaved trials; medians and the ratios to the kernel host go to
# report.txt. Passes when every run completes. The host half (engine against nvmf-bench on
# loopback, no VM): scripts/bench-fio.sh.
# Knobs: NVMF_VM_FIOBENCH_TRIALS (3), NVMF_VM_FIOBENCH_RUNTIME (fio seconds, 10).
# vm-needs: build
# vm-in-all: no
# vm-timeout: 1500
source "$(dirname "$0")/../lib.sh"
TRIALS=${NVMF_VM_FIOBENCH_TRIALS:-3}
RUNTIME=${NVMF_VM_FIOBENCH_RUNTIME:-10}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# one_run WHO QD TAG: one measured run; prints its IOPS (and nothing else on stdout: step's log
# lines go to stderr).
one_run() {
  local who=$1 qd=$2 tag=$3 batch=() f=$OUT/$3.json
  [ "$qd" -gt 1 ] && batch=(--iodepth_batch_submit=$((qd / 2)) --iodepth_batch_complete_min=$((qd / 2)))
  case $who in
    engine)
      step "fio engine qd$qd ($tag)" fio --ioengine="external:$NVMF_FIO_ENGINE" --name="$tag" --thread=1 \
        --filename="trtype=tcp traddr=127.0.0.1 trsvcid=$PORT subnqn=${OUR_NQN//:/\\:} ns=1" \
        --rw=randread --bs=4k --iodepth="$qd" "${batch[@]}" --time_based --runtime="$RUNTIME" \
        --output-format=json --output="$f" >&2 || return 1
      jq '.jobs[0].read.iops | floor' "$f" ;;
    kernel)
      step "fio io_uring qd$qd on $DEV ($tag)" fio --ioengine=io_uring --direct=1 --name="$tag" \
        --filename="$DEV" --rw=randread --bs=4k --iodepth="$qd" "${batch[@]}" --time_based \
        --runtime="$RUNTIME" --output-format=json --output="$f" >&2 || return 1
      jq '.jobs[0].read.iops | floor' "$f" ;;
    bench)
      step "nvmf-bench qd$qd ($tag)" "$(bench_bin)" --transport tcp --traddr 127.0.0.1 --trsvcid "$PORT" \
        --subnqn "$OUR_NQN" --rw randread --bs 4k --iodepth "$qd" --runtime "$RUNTIME" \
        --output-format json >&2 || return 1
      cp "$WORK/step.out" "$f"
      jq '.workloads[0].results[] | select(.transport == "tcp") | .total.iops | floor' "$f" ;;
  esac
}

bench_fio_engine() {
  local label=$1 dev rc t qd who iops
  teardown
  [ -n "${NVMF_FIO_ENGINE:-}" ] && [ -f "$NVMF_FIO_ENGINE" ] ||
    { fail "$label" "the fio engine is not available: ${NVMF_FIO_ENGINE_NOTE:-NVMF_FIO_ENGINE unset}"; return; }
  bench_bin >/dev/null || { fail "$label" "$REASON"; return; }
  dev=$(vm_ramdisk $RAMDISK_MB) || { fail "$label" "vm_ramdisk $RAMDISK_MB failed"; return; }
  step "fill $dev" dd if=/dev/urandom of="$dev" bs=1M count=$RAMDISK_MB oflag=direct || { fail "$label" "$REASON"; return; }
  start_our_target tcp 127.0.0.1 "$dev"; rc=$?
  [ $rc = 0 ] || { fail "$label" "$REASON"; return; }
  host_connect tcp 127.0.0.1 "$PORT" "$OUR_NQN" || { fail "$label" "$REASON"; return; }
  : >"$WORK/iops"
  for ((t = 1; t <= TRIALS; t++)); do
    for qd in 1 32; do
      for who in engine bench kernel; do
        iops=$(one_run "$who" "$qd" "$who-qd$qd-$t") || { fail "$label" "$REASON"; return; }
        [ "${iops:-0}" -gt 0 ] || { fail "$label" "$who qd$qd trial $t: 0 IOPS"; return; }
        echo "$who $qd $iops" | tee -a "$WORK/iops"
      done
    done
  done
  host_disconnect "$OUR_NQN" || { fail "$label" "$REASON"; return; }
  stop_our_target || { fail "$label" "$REASON"; return; }
  {
    echo "4k randread against our target (NVMe/TCP 127.0.0.1, ${RAMDISK_MB} MiB brd), ${RUNTIME}s runs, $TRIALS interleaved trials,"
    echo "QD32 runs with iodepth_batch_submit=16 iodepth_batch_complete_min=16 (fio); TCG-emulated VM with $(nproc) vCPUs: ratios only"
    printf '%-4s %12s %12s %12s %14s %14s\n' qd "fio+engine" nvmf-bench "fio+kernel" "engine/kernel" "engine/bench"
    for qd in 1 32; do
      e=$(awk -v q=$qd '$1 == "engine" && $2 == q { print $3 }' "$WORK/iops" | median)
      b=$(awk -v q=$qd '$1 == "bench" && $2 == q { print $3 }' "$WORK/iops" | median)
      k=$(awk -v q=$qd '$1 == "kernel" && $2 == q { print $3 }' "$WORK/iops" | median)
      awk -v q=$qd -v e="$e" -v b="$b" -v k="$k" 'BEGIN { printf "%-4s %12.0f %12.0f %12.0f %13.2fx %13.2fx\n", q, e, b, k, e / k, e / b }'
    done
  } | tee "$OUT/report.txt"
  pass "$label"
}

bench_fio_engine "$SCENARIO"
