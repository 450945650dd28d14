#!/usr/bin/env bash
# Sends through io_uring against sendmsg (issue #40, `target.tcp_send`): for each mode
# (sendmsg, auto, io_uring) one nvmf-target (1 poller thread, a null namespace, pinned to CPU
# $TARGET_CPU) serves nvmf-bench (pinned to CPU $CLIENT_CPU) over NVMe/TCP loopback with one
# connection per job: LOADS are JOBS:QD:BS (random reads). Each row: IOPS, the target's CPU per
# I/O, its system calls per I/O (perf stat over the middle of the run, when perf is there), and
# the median of the per-round IOPS ratios against `sendmsg`. One target at a time, modes taking
# turns within a round; ROUNDS rounds, medians.
#
#   scripts/bench-send.sh                       # builds release binaries first
#   RUNTIME=4 ROUNDS=5 LOADS="4:8:4k" scripts/bench-send.sh
NAME=bench-send
source "$(dirname "$0")/bench-lib.sh"
RUNTIME=${RUNTIME:-4}
ROUNDS=${ROUNDS:-5}
MODES=${MODES:-sendmsg auto io_uring}
LOADS=${LOADS:-1:1:4k 8:1:4k 4:8:4k 4:4:128k}
TARGET_CPU=${TARGET_CPU:-0}
export CLIENT_CPU=${CLIENT_CPU:-1}
NQN=nqn.2026-11.io.nvmf-rs:bench-send
perf=
perf stat -e raw_syscalls:sys_enter -- true >/dev/null 2>&1 && perf=1

declare -A iops tcpu sys ratio
for r in $(seq "$ROUNDS"); do
    for mode in $(in_turn "$r" $MODES); do
        RUST_LOG=info start_target "$mode" "{ nsid: 1, null: 1GiB }" "threads: 1, tcp_send: $mode"
        taskset -a -cp "$TARGET_CPU" "$pid" >/dev/null
        for load in $LOADS; do
            IFS=: read -r jobs qd bs <<<"$load"
            f=$dir/$mode-$jobs-$qd-$bs-$r.json
            p=$dir/$mode-$jobs-$qd-$bs-$r.perf
            pp=
            if [ -n "$perf" ]; then
                # Start a second into the run, end a second before its end.
                (sleep 1; exec perf stat -x, -e raw_syscalls:sys_enter -p "$pid" -o "$p" -- sleep $((RUNTIME - 2))) &
                pp=$!
            fi
            bench "$f" --rw randread --bs "$bs" --iodepth "$qd" --numjobs "$jobs" --runtime "$RUNTIME" \
                --target-stats "$dir/$mode.sock"
            [ -z "$pp" ] || wait "$pp"
            i=$(jq -r "$TCP_RESULT.total.iops" "$f")
            iops[$mode,$load]+="$i "
            tcpu[$mode,$load]+="$(jq -r "$TCP_RESULT.target_cpu.usec_per_io // 0" "$f") "
            if [ -n "$perf" ]; then
                n=$(awk -F, '/raw_syscalls/ { print $1 }' "$p")
                sys[$mode,$load]+="$(awk -v n="$n" -v i="$i" -v s=$((RUNTIME - 2)) 'BEGIN { printf "%.3f", n / (i * s) }') "
            fi
        done
        stop_target
    done
    # Paired ratios of this round against sendmsg.
    for mode in $MODES; do
        for load in $LOADS; do
            a=$(echo "${iops[$mode,$load]}" | awk '{ print $NF }')
            b=$(echo "${iops[sendmsg,$load]}" | awk '{ print $NF }')
            ratio[$mode,$load]+="$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }') "
        done
    done
done
med() { tr ' ' '\n' | grep -v '^$' | median; }

echo "nvmf-target sends by tcp_send mode: random reads, NVMe/TCP loopback, a connection per job, 1 poller thread on CPU $TARGET_CPU, nvmf-bench on CPU $CLIENT_CPU, ${RUNTIME}s per run, median of $ROUNDS alternating rounds; $(tcp_settings)"
printf '%-9s %5s %4s %6s %10s %12s %10s %12s\n' mode jobs qd bs IOPS "target us/io" "syscalls/io" "x sendmsg"
for mode in $MODES; do
    for load in $LOADS; do
        IFS=: read -r jobs qd bs <<<"$load"
        i=$(echo "${iops[$mode,$load]}" | med)
        t=$(echo "${tcpu[$mode,$load]}" | med)
        s=-
        [ -z "$perf" ] || s=$(echo "${sys[$mode,$load]}" | med)
        x=$(echo "${ratio[$mode,$load]}" | med)
        printf '%-9s %5s %4s %6s %10.0f %12.2f %10s %12s\n' "$mode" "$jobs" "$qd" "$bs" "$i" "$t" "$s" "$x"
    done
done
