#!/usr/bin/env bash
# Adaptive vs busy polling, in one run: for each `target.polling` mode start an nvmf-target,
#  1. measure its CPU time over IDLE_SECS (default 10) with no host connected (/proc/PID/stat
#     utime+stime, as % of one core), then
#  2. run nvmf-bench 4 KiB random reads at QD1 for RUNTIME seconds (default 10) and report
#     the latency p50/p99.
# Both targets have the same configuration apart from `polling`, and run one after the other
# on the same machine. Namespace 1 is a null device (the polling path without storage in the
# way), namespace 2 a file; NSID=2 measures the file.
#
#   scripts/bench-polling.sh                  # builds release binaries first
#   NO_BUILD=1 BIN=build/debug scripts/bench-polling.sh
#   IDLE_SECS=10 RUNTIME=10 THREADS=1 NSID=1 scripts/bench-polling.sh
NAME=bench-polling
source "$(dirname "$0")/bench-lib.sh"
IDLE_SECS=${IDLE_SECS:-10}
RUNTIME=${RUNTIME:-10}
THREADS=${THREADS:-1}
NSID=${NSID:-1}
NQN=nqn.2026-11.io.nvmf-rs:bench-polling

declare -A idle p50 p99 iops
for mode in adaptive busy; do
    RUST_LOG=warn start_target "$mode" "{ nsid: 1, null: 1GiB }
{ nsid: 2, path: $dir/$mode.img, size: 256MiB }" "threads: $THREADS, polling: $mode"
    sleep 1 # let the pollers settle after the probe connection
    t0=$(ticks "$pid")
    sleep "$IDLE_SECS"
    t1=$(ticks "$pid")
    idle[$mode]=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$IDLE_SECS" \
        'BEGIN { printf "%.2f", 100 * d / hz / s }')
    bench "$dir/$mode.json" --nsid "$NSID" --rw randread --bs 4k --iodepth 1 --runtime "$RUNTIME"
    r=$TCP_RESULT
    p50[$mode]=$(jq -r "$r.total.lat_ns.p50 / 1000" "$dir/$mode.json")
    p99[$mode]=$(jq -r "$r.total.lat_ns.p99 / 1000" "$dir/$mode.json")
    iops[$mode]=$(jq -r "$r.total.iops | floor" "$dir/$mode.json")
    stop_target
done

echo "nvmf-target polling: idle CPU over ${IDLE_SECS}s (no hosts), 4k randread QD1 over ${RUNTIME}s, nsid $NSID, $THREADS poller thread(s)"
printf '%-9s %14s %10s %10s %10s\n' mode "idle CPU %" "p50 us" "p99 us" IOPS
for mode in adaptive busy; do
    printf '%-9s %14s %10s %10s %10s\n' "$mode" "${idle[$mode]}" "${p50[$mode]}" "${p99[$mode]}" "${iops[$mode]}"
done
awk -v a="${p50[adaptive]}" -v b="${p50[busy]}" -v c="${p99[adaptive]}" -v d="${p99[busy]}" \
    'BEGIN { printf "adaptive vs busy: p50 %+.1f%%, p99 %+.1f%%\n", 100 * (a - b) / b, 100 * (c - d) / d }'
