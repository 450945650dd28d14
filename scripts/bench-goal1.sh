#!/usr/bin/env bash
# Issue #6 goal 1, measured as a median of interleaved trials: NVMe/TCP loopback 128 KiB
# sequential read (QD8, one job, a null namespace, one target thread) against the raw loopback
# TCP stream of the same bytes. One nvmf-target; TRIALS (default 7) runs of
#   nvmf-bench --rw read --bs 128k --iodepth 8 --runtime RUNTIME --raw-tcp-baseline
# each of which measures the NVMe/TCP read and then the raw stream (nvmf-bench's own baseline,
# half the runtime) back to back, so both see the same moment of a shared machine. Prints each
# trial's ratio and the median; exit 0 whatever the ratio (a measurement, not a test).
#
#   scripts/bench-goal1.sh                    # builds release binaries first
#   NO_BUILD=1 TRIALS=9 RUNTIME=4 QD=8 scripts/bench-goal1.sh
NAME=bench-goal1
source "$(dirname "$0")/bench-lib.sh"
RUNTIME=${RUNTIME:-3}
TRIALS=${TRIALS:-7}
QD=${QD:-8}
NQN=nqn.2026-11.io.nvmf-rs:bench-goal1
start_target goal1 "{ nsid: 1, null: 4GiB }" "threads: 1"

echo "128k read QD$QD, null namespace, 1 target thread; ${RUNTIME}s NVMe/TCP then $(awk -v r="$RUNTIME" 'BEGIN { print r / 2 }')s raw stream per trial"
printf '%-6s %12s %12s %8s\n' trial "nvme MiB/s" "raw MiB/s" ratio
ratios=()
for t in $(seq "$TRIALS"); do
    bench "$dir/r.json" --nsid 1 --rw read --bs 128k --iodepth "$QD" --runtime "$RUNTIME" \
        --raw-tcp-baseline
    w='.workloads[0]'
    nv=$(jq -r "$TCP_RESULT.total.mib_s" "$dir/r.json")
    raw=$(jq -r "$w.raw_tcp_baseline.stream.mib_s // empty" "$dir/r.json")
    [ -n "$raw" ] || { echo "bench-goal1: trial $t: no raw stream: $(jq -c "$w.raw_tcp_baseline" "$dir/r.json")" >&2; exit 1; }
    r=$(awk -v a="$nv" -v b="$raw" 'BEGIN { printf "%.3f", a / b }')
    ratios+=("$r")
    printf '%-6s %12.0f %12.0f %7.0f%%\n' "$t" "$nv" "$raw" "$(awk -v r="$r" 'BEGIN { print 100 * r }')"
done
printf '%s\n' "${ratios[@]}" | sort -g | awk -v n="$TRIALS" '
    { v[NR] = $1 }
    END {
        m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        printf "median %.0f%% of the raw stream (range %.0f%%-%.0f%%); goal >= 80%%: %s\n",
            100 * m, 100 * v[1], 100 * v[n], (m >= 0.8 ? "met" : "NOT met")
    }'
