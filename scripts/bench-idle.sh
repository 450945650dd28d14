#!/usr/bin/env bash
# Idle CPU with connected hosts (issue #40): for each `target.polling` mode one nvmf-target
# (1 poller thread, a null namespace) holds HOSTS idle controllers (the idle_hosts example: each
# its own host NQN, one I/O queue, keep-alives every 5 s and nothing else), and its CPU time
# (/proc utime + stime) is taken over IDLE_SECS once they are all connected, as % of one core.
#
#   scripts/bench-idle.sh                       # HOSTS=64 IDLE_SECS=10 MODES="adaptive busy interrupt"
NAME=bench-idle
source "$(dirname "$0")/bench-lib.sh"
HOSTS=${HOSTS:-64}
IDLE_SECS=${IDLE_SECS:-10}
MODES=${MODES:-adaptive busy interrupt}
NQN=nqn.2026-11.io.nvmf-rs:bench-idle
cargo build --release -p nvmf-tests --example idle_hosts
EX=build/release/examples/idle_hosts

declare -A cpu
for mode in $MODES; do
    RUST_LOG=warn start_target "$mode" "{ nsid: 1, null: 1GiB }" "threads: 1, polling: $mode"
    "$EX" --transport tcp --traddr 127.0.0.1 --trsvcid "$port" --subnqn "$NQN" \
        --hosts "$HOSTS" --secs $((IDLE_SECS + 4)) >"$dir/$mode.hosts" &
    hosts_pid=$!
    for _ in $(seq 300); do grep -q connected "$dir/$mode.hosts" 2>/dev/null && break; sleep 0.1; done
    grep -q "$HOSTS connected" "$dir/$mode.hosts" || { echo "$NAME: the hosts did not connect" >&2; exit 1; }
    sleep 1
    t0=$(ticks "$pid")
    sleep "$IDLE_SECS"
    t1=$(ticks "$pid")
    cpu[$mode]=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v s="$IDLE_SECS" 'BEGIN { printf "%.2f", 100 * d / hz / s }')
    wait "$hosts_pid"
    stop_target
done
echo "nvmf-target CPU with $HOSTS connected idle hosts (keep-alives only), over ${IDLE_SECS}s, 1 poller thread"
for mode in $MODES; do printf '%-10s %6s%% of a core\n' "$mode" "${cpu[$mode]}"; done
