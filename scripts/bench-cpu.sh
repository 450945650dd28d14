#!/usr/bin/env bash
# CPU that follows the load (issue #40): for each `target.polling` mode (adaptive, busy,
# interrupt) one nvmf-target (1 poller thread, a null namespace, pinned to CPU $TARGET_CPU)
# serves nvmf-bench (pinned to CPU $CLIENT_CPU) 4 KiB random reads over NVMe/TCP loopback at
# saturation (QD1, QD8) and below it (--rate_iops 10,000 and 50,000 at QD1 and QD8). Each row:
# IOPS, the target's CPU per I/O (its control socket's process CPU time over the run) and the
# bench's own (getrusage), in microseconds, and the same as a multiple of that mode's CPU per
# I/O at saturation and the same depth. One target at a time, modes taking turns within a
# round; ROUNDS rounds, medians.
#
#   scripts/bench-cpu.sh                        # builds release binaries first
#   RUNTIME=5 ROUNDS=3 MODES="adaptive interrupt" scripts/bench-cpu.sh
NAME=bench-cpu
source "$(dirname "$0")/bench-lib.sh"
RUNTIME=${RUNTIME:-5}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-adaptive busy interrupt}
LOADS=${LOADS:-sat:1 sat:8 10000:1 50000:1 10000:8 50000:8}
TARGET_CPU=${TARGET_CPU:-0}
export CLIENT_CPU=${CLIENT_CPU:-1}
NQN=nqn.2026-11.io.nvmf-rs:bench-cpu

declare -A iops tcpu ccpu
for r in $(seq "$ROUNDS"); do
    # One target at a time (a busy poller spins its core even when idle), modes taking turns.
    for mode in $(in_turn "$r" $MODES); do
        RUST_LOG=info start_target "$mode" "{ nsid: 1, null: 1GiB }" "threads: 1, polling: $mode"
        taskset -a -cp "$TARGET_CPU" "$pid" >/dev/null
        for load in $LOADS; do
            rate=${load%%:*} qd=${load##*:}
            extra=()
            [ "$rate" = sat ] || extra=(--rate_iops "$rate")
            f=$dir/$mode-$rate-$qd-$r.json
            bench "$f" --rw randread --bs 4k --iodepth "$qd" --runtime "$RUNTIME" \
                --target-stats "$dir/$mode.sock" "${extra[@]}"
            iops[$mode,$load]+="$(jq -r "$TCP_RESULT.total.iops" "$f") "
            tcpu[$mode,$load]+="$(jq -r "$TCP_RESULT.target_cpu.usec_per_io // 0" "$f") "
            ccpu[$mode,$load]+="$(jq -r "$TCP_RESULT.cpu.usec_per_io // 0" "$f") "
        done
        wake=$(sed -n 's/.*wake_latency_us=\([0-9.]*\).*/\1/p' "$dir/$mode.log" | head -n 1)
        [ -z "$wake" ] || echo "round $r $mode: measured wake-up latency ${wake} us" >&2
        stop_target
        grep -h "poller time and spins" "$dir/$mode.log" | sed 's/^.*INFO //' >&2 || true
    done
done
med() { tr ' ' '\n' | grep -v '^$' | median; }

echo "nvmf-target CPU per I/O by polling mode: 4k randread, NVMe/TCP loopback, 1 poller thread on CPU $TARGET_CPU, nvmf-bench on CPU $CLIENT_CPU, ${RUNTIME}s per run, median of $ROUNDS alternating rounds; $(tcp_settings)"
printf '%-10s %-9s %4s %10s %12s %8s %12s %8s\n' mode rate qd IOPS "target us/io" "x sat" "bench us/io" "x sat"
for mode in $MODES; do
    for load in $LOADS; do
        rate=${load%%:*} qd=${load##*:}
        i=$(echo "${iops[$mode,$load]}" | med)
        t=$(echo "${tcpu[$mode,$load]}" | med)
        c=$(echo "${ccpu[$mode,$load]}" | med)
        ts=$(echo "${tcpu[$mode,sat:$qd]:-}" | med 2>/dev/null || echo 0)
        cs=$(echo "${ccpu[$mode,sat:$qd]:-}" | med 2>/dev/null || echo 0)
        awk -v m="$mode" -v r="$rate" -v q="$qd" -v i="$i" -v t="$t" -v c="$c" -v ts="$ts" -v cs="$cs" \
            'BEGIN { printf "%-10s %-9s %4s %10.0f %12.2f %8s %12.2f %8s\n", m, r, q, i, t,
                     (ts > 0 ? sprintf("%.2f", t / ts) : "-"), c, (cs > 0 ? sprintf("%.2f", c / cs) : "-") }'
    done
done
