#!/usr/bin/env bash
# User-space instructions per I/O, counted by valgrind's callgrind: a count, not a time, so it
# repeats on a shared, noisy machine where IOPS ratios swing by 2x between rounds.
#
# SIDE=target (the default): target A and target B (`ours`, this tree's nvmf-target, or the path
# of another nvmf-target binary) each run under callgrind (`threads: 1`, a 1 GiB null namespace,
# NVMe/TCP on 127.0.0.1, CPU 0) while a client (CPU 1) reads from it for RUNTIME seconds; the
# poller thread's instructions (`Poller::run` and all it calls) divided by the I/Os the client
# completed are printed per round, then the median ratio B/A.
# SIDE=client: the client is counted instead. A and B are nvmf-bench binaries (`ours` is this
# tree's); each runs under callgrind on CPU 1 against this tree's nvmf-target (CPU 0, natively),
# and its job thread's instructions (`run_job` and all it calls: the initiator's queue, the
# bench's bookkeeping) are divided by its I/Os.
# Only user space is counted: system calls and the kernel's TCP path (most of the CPU on
# loopback) are not. A measurement, not a test.
#
#   scripts/bench-instructions.sh                         # A=ours B=ours: the count's spread
#   A=/tmp/base-build/release/nvmf-target B=ours scripts/bench-instructions.sh   # before/after
#   SIDE=client A=/tmp/base-build/release/nvmf-bench B=ours QD=1 scripts/bench-instructions.sh
#   CLIENT=perf (spdk_nvme_perf: ../shared/tools/build-spdk.sh first; SIDE=target only) or bench
#   (nvmf-bench, the default); RW=randread BS=4k QD=32 RUNTIME=10 ROUNDS=1; TARGET_SETTINGS
#   (default "c2h_success: always").
NAME=bench-instructions
source "$(dirname "$0")/bench-lib.sh"
A=${A:-ours}
B=${B:-ours}
CLIENT=${CLIENT:-bench}
SIDE=${SIDE:-target}
case "$SIDE" in
    target) ;;
    client) [ "$CLIENT" = bench ] || { echo "$NAME: SIDE=client counts nvmf-bench (CLIENT=bench)" >&2; exit 2; } ;;
    *) echo "$NAME: SIDE is target or client, not $SIDE" >&2; exit 2 ;;
esac
RW=${RW:-randread} BS=${BS:-4k} QD=${QD:-32}
RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-1}
TARGET_SETTINGS=${TARGET_SETTINGS:-c2h_success: always}
NQN=nqn.2026-11.io.nvmf-rs:bench-instructions
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b1c2a52-2f4e-4f0e-9d1e-5e0f3c2a7b10
TGT_CPU=0 CLIENT_CPU=1
command -v valgrind >/dev/null || { echo "$NAME: needs valgrind" >&2; exit 2; }
[ "$CLIENT" != perf ] || source "$(dirname "$0")/spdk-lib.sh"

binary() {
    if [ "$1" != ours ]; then echo "$1"
    elif [ "$SIDE" = client ]; then echo "$BIN/nvmf-bench"
    else echo "$BIN/nvmf-target"; fi
}

# count TAG BINARY: sets PER_IO (instructions per I/O) and IOS. BINARY is the side counted.
count() {
    local tag=$1 bin=$2 ir tgt=$2 bench_bin=$BIN/nvmf-bench
    local vg=(valgrind --tool=callgrind --callgrind-out-file="$dir/$tag.cg" --collect-atstart=no)
    local on_target=("${vg[@]}" --toggle-collect='*Poller*run*') on_client=()
    if [ "$SIDE" = client ]; then
        tgt=$BIN/nvmf-target bench_bin=$2
        on_target=() on_client=("${vg[@]}" --toggle-collect='*run_job*')
    fi
    port=$(free_port)
    {
        printf 'listeners:\n  - { transport: tcp, address: 127.0.0.1, port: %s }\n' "$port"
        printf 'subsystems:\n  - nqn: %s\n    allow_any_host: true\n' "$NQN"
        printf '    namespaces:\n      - { nsid: 1, null: 1GiB }\n'
        printf 'target: { threads: 1, %s }\n' "$TARGET_SETTINGS"
    } >"$dir/$tag.yaml"
    taskset -c "$TGT_CPU" "${on_target[@]}" "$tgt" --config "$dir/$tag.yaml" --control-socket "$dir/$tag.sock" 2>"$dir/$tag.log" &
    pid=$!
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || { echo "$NAME: $tgt did not start:" >&2; cat "$dir/$tag.log" >&2; exit 1; }
        sleep 0.1
    done
    if [ "$CLIENT" = perf ]; then
        spdk_perf "$RW" "$BS" "$QD"
        IOS=$((IOPS * RUNTIME))
    else
        taskset -c "$CLIENT_CPU" "${on_client[@]}" "$bench_bin" --transport tcp --traddr 127.0.0.1 \
            --trsvcid "$port" --subnqn "$NQN" --nsid 1 --rw "$RW" --bs "$BS" --iodepth "$QD" \
            --runtime "$RUNTIME" --output-format json >"$dir/bench.json" 2>"$dir/bench.err" ||
            { echo "$NAME: nvmf-bench failed:" >&2; cat "$dir/bench.err" >&2; exit 1; }
        IOS=$(jq -r "$TCP_RESULT.total.iops * $RUNTIME | floor" "$dir/bench.json")
    fi
    kill "$pid"
    wait "$pid" || true
    pid=
    ir=$(awk '/^summary:/ { print $2 }' "$dir/$tag.cg")
    [ -n "$ir" ] && [ "$IOS" -gt 0 ] || { echo "$NAME: no count from $bin" >&2; exit 1; }
    PER_IO=$((ir / IOS))
}


echo "$NAME: callgrind instructions per I/O of the $([ "$SIDE" = client ] && echo "client's job thread" || echo "target's poller thread"); $RW $BS QD$QD, client $CLIENT, ${RUNTIME}s; A=$A B=$B"
ratios=()
for r in $(seq "$ROUNDS"); do
    for side in $(in_turn "$r" A B); do
        if [ "$side" = A ]; then count a "$(binary "$A")"; a=$PER_IO a_ios=$IOS
        else count b "$(binary "$B")"; b=$PER_IO b_ios=$IOS; fi
    done
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')
    ratios+=("$ratio")
    printf 'round %s  A %6s instr/IO (%s I/Os)  B %6s instr/IO (%s I/Os)  B/A %s\n' \
        "$r" "$a" "$a_ios" "$b" "$b_ios" "$ratio"
done
printf 'median B/A %.3f (rounds: %s)\n' "$(printf '%s\n' "${ratios[@]}" | median)" "${ratios[*]}"
