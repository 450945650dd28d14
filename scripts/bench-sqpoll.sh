#!/usr/bin/env bash
# io_uring SQPOLL on vs off (`target.sqpoll`), side by side in one run: for each mode start an
# nvmf-target whose namespace 1 is an O_DIRECT file (in DIR, default the repository's build/
# directory: a real file system, not tmpfs, so io_uring reads go straight to the block layer),
# then run nvmf-bench 4 KiB random reads at QD1 and QD32 for RUNTIME seconds each (default 5)
# and report IOPS, p50 and the target's CPU time per I/O (/proc/PID/stat utime+stime of the
# whole process, which includes its SQPOLL kernel threads). ROUNDS (default 2) alternates the
# modes off/on/off/on... so machine noise falls on both.
#
#   scripts/bench-sqpoll.sh                   # builds release binaries first
#   NO_BUILD=1 RUNTIME=5 ROUNDS=2 THREADS=1 scripts/bench-sqpoll.sh
NAME=bench-sqpoll
source "$(dirname "$0")/bench-lib.sh"
RUNTIME=${RUNTIME:-5}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-1}
DIR=${DIR:-build}
NQN=nqn.2026-11.io.nvmf-rs:bench-sqpoll

img=$(realpath "$(mktemp -p "$DIR" bench-sqpoll.XXXXXX.img)")
bench_extra_cleanup() { rm -f "$img"; }
# A written (not sparse) file, so reads hit the disk path.
dd if=/dev/urandom of="$img" bs=1M count=256 status=none

rows=()
for round in $(seq "$ROUNDS"); do
    for sq in false true; do
        start_target t "{ nsid: 1, path: $img }" "threads: $THREADS, sqpoll: $sq, sqpoll_idle_ms: 10"
        want=$([ "$sq" = true ] && echo SqPoll || echo DeferTaskrun)
        for _ in $(seq 50); do grep -q "mode=$want" "$dir/t.log" && break; sleep 0.1; done
        grep -q "mode=$want" "$dir/t.log" || { echo "bench-sqpoll: ring not in $want mode:" >&2; cat "$dir/t.log" >&2; exit 1; }
        for qd in 1 32; do
            t0=$(ticks "$pid")
            bench "$dir/r.json" --nsid 1 --rw randread --bs 4k --iodepth "$qd" --runtime "$RUNTIME"
            t1=$(ticks "$pid")
            r=$TCP_RESULT
            iops=$(jq -r "$r.total.iops | floor" "$dir/r.json")
            ios=$(jq -r "$r.total.ios" "$dir/r.json")
            p50=$(jq -r "$r.total.lat_ns.p50 / 1000" "$dir/r.json")
            cpu=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$ios" 'BEGIN { printf "%.2f", 1e6 * d / hz / n }')
            rows+=("$(printf '%-6s %-7s %-5s %10s %10s %14s' "$round" "$sq" "QD$qd" "$iops" "$p50" "$cpu")")
        done
        stop_target
    done
done
echo "nvmf-target io_uring SQPOLL off vs on: 4k randread of an O_DIRECT file in $DIR, ${RUNTIME}s per cell, $THREADS poller thread(s)"
printf '%-6s %-7s %-5s %10s %10s %14s\n' round sqpoll qd IOPS "p50 us" "target us/IO"
printf '%s\n' "${rows[@]}"
