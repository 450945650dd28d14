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
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/release}
RUNTIME=${RUNTIME:-5}
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-1}
DIR=${DIR:-build}
NQN=nqn.2026-11.io.nvmf-rs:bench-sqpoll
[ -n "${NO_BUILD:-}" ] || cargo build --release -p nvmf-target -p nvmf-initiator
command -v jq >/dev/null || { echo "bench-sqpoll: needs jq" >&2; exit 2; }

dir=$(mktemp -d)
img=$(realpath "$(mktemp -p "$DIR" bench-sqpoll.XXXXXX.img)")
pid=
cleanup() {
    [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
    rm -rf "$dir" "$img"
}
trap cleanup EXIT
# A written (not sparse) file, so reads hit the disk path.
dd if=/dev/urandom of="$img" bs=1M count=256 status=none

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

rows=()
for round in $(seq "$ROUNDS"); do
    for sq in false true; do
        port=$(free_port)
        cat >"$dir/t.yaml" <<YAML
listeners:
  - { transport: tcp, address: 127.0.0.1, port: $port }
subsystems:
  - nqn: $NQN
    allow_any_host: true
    namespaces:
      - { nsid: 1, path: $img }
target: { threads: $THREADS, sqpoll: $sq, sqpoll_idle_ms: 10 }
YAML
        RUST_LOG=info "$BIN/nvmf-target" --config "$dir/t.yaml" \
            --control-socket "$dir/t.sock" 2>"$dir/t.log" &
        pid=$!
        for _ in $(seq 100); do
            (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
            sleep 0.1
        done
        want=$([ "$sq" = true ] && echo SqPoll || echo DeferTaskrun)
        for _ in $(seq 50); do grep -q "mode=$want" "$dir/t.log" && break; sleep 0.1; done
        grep -q "mode=$want" "$dir/t.log" || { echo "bench-sqpoll: ring not in $want mode:" >&2; cat "$dir/t.log" >&2; exit 1; }
        for qd in 1 32; do
            t0=$(ticks "$pid")
            "$BIN/nvmf-bench" --transport tcp --traddr 127.0.0.1 --trsvcid "$port" --subnqn "$NQN" \
                --nsid 1 --rw randread --bs 4k --iodepth "$qd" --runtime "$RUNTIME" \
                --output-format json >"$dir/r.json"
            t1=$(ticks "$pid")
            r='.workloads[0].results[] | select(.transport == "tcp")'
            st=$(jq -r "$r.status" "$dir/r.json")
            [ "$st" = ok ] || { echo "bench-sqpoll: sqpoll=$sq QD$qd: $st" >&2; cat "$dir/r.json" >&2; exit 1; }
            iops=$(jq -r "$r.total.iops | floor" "$dir/r.json")
            ios=$(jq -r "$r.total.ios" "$dir/r.json")
            p50=$(jq -r "$r.total.lat_ns.p50 / 1000" "$dir/r.json")
            cpu=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$ios" 'BEGIN { printf "%.2f", 1e6 * d / hz / n }')
            rows+=("$(printf '%-6s %-7s %-5s %10s %10s %14s' "$round" "$sq" "QD$qd" "$iops" "$p50" "$cpu")")
        done
        kill "$pid"
        wait "$pid" || true
        pid=
    done
done
echo "nvmf-target io_uring SQPOLL off vs on: 4k randread of an O_DIRECT file in $DIR, ${RUNTIME}s per cell, $THREADS poller thread(s)"
printf '%-6s %-7s %-5s %10s %10s %14s\n' round sqpoll qd IOPS "p50 us" "target us/IO"
printf '%s\n' "${rows[@]}"
