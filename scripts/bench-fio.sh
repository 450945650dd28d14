#!/usr/bin/env bash
# fio with the nvmf engine (libnvmf_fio.so) against nvmf-bench, the same job on the same target
# (issue #37): one nvmf-target (1 poller thread, a null namespace, pinned to CPU $TARGET_CPU),
# 4 KiB random reads over NVMe/TCP loopback, the client pinned to CPU $CLIENT_CPU. Cases:
#   qd1            iodepth 1
#   qd32           iodepth 32; fio with iodepth_batch_submit=16 iodepth_batch_complete_min=16,
#                  what deep-queue fio jobs use with any engine (nvmf-bench batches by itself)
#   qd32-defaults  iodepth 32, fio's batch defaults (one commit and one reap per I/O)
# Each row: IOPS, p50/p99 completion latency and client CPU per I/O (fio: usr+sys over its run;
# nvmf-bench: getrusage) for both, and fio's IOPS over nvmf-bench's; last, what fio itself costs
# per I/O (its null engine with the same options), part of fio's CPU per I/O. Clients take turns within
# a round; ROUNDS rounds, medians (the ratio is the median of the per-round ratios).
# The VM half (fio on the kernel's nvme-tcp device against the same target): tests/vm/run.sh
# bench-fio-engine-tcp.
#
#   scripts/bench-fio.sh                       # builds release binaries first
#   RUNTIME=4 ROUNDS=5 CASES="qd1 qd32" scripts/bench-fio.sh
NAME=bench-fio
source "$(dirname "$0")/bench-lib.sh"
[ -n "${NO_BUILD:-}" ] || cargo build --release -p nvmf-fio
command -v fio >/dev/null || { echo "$NAME: needs fio (scripts/setup.sh installs it)" >&2; exit 2; }
RUNTIME=${RUNTIME:-4}
ROUNDS=${ROUNDS:-5}
CASES=${CASES:-qd1 qd32 qd32-defaults}
TARGET_CPU=${TARGET_CPU:-0}
export CLIENT_CPU=${CLIENT_CPU:-1}
NQN=nqn.2026-11.io.nvmf-rs:bench-fio
ENGINE=$(realpath "$BIN/libnvmf_fio.so")

start_target t "{ nsid: 1, null: 4GiB }" "threads: 1"
taskset -a -cp "$TARGET_CPU" "$pid" >/dev/null

# fio_run JSON CASE [ENGINE]: the engine (or fio's own null engine: what fio itself costs per
# I/O) against the target; fio's JSON report in JSON.
fio_run() {
    local out=$1 case=$2 qd=1 extra=() engine=("--ioengine=external:$ENGINE")
    local name=(--filename="trtype=tcp traddr=127.0.0.1 trsvcid=$port subnqn=${NQN//:/\\:} ns=1")
    [ "${3:-}" = null ] && engine=(--ioengine=null) name=(--size=4g)
    case $case in
        qd1) qd=1 ;;
        qd32) qd=32 extra=(--iodepth_batch_submit=16 --iodepth_batch_complete_min=16) ;;
        qd32-defaults) qd=32 ;;
    esac
    taskset -c "$CLIENT_CPU" fio "${engine[@]}" --name=bench --thread=1 "${name[@]}" \
        --rw=randread --bs=4k --iodepth="$qd" "${extra[@]}" --time_based --runtime="$RUNTIME" \
        --output-format=json --output="$out" ||
        { echo "$NAME: fio $case failed:" >&2; cat "$out" >&2; exit 1; }
    [ "$(jq '.jobs[0].error' "$out")" = 0 ] || { echo "$NAME: fio $case: error" >&2; cat "$out" >&2; exit 1; }
}

declare -A fi fl fh fc bi bl bh bc ratio nc
for r in $(seq "$ROUNDS"); do
    for case in $CASES; do
        qd=${case#qd}; qd=${qd%-defaults}
        for client in $(in_turn "$r" fio bench); do
            f=$dir/$client-$case-$r.json
            if [ "$client" = fio ]; then
                fio_run "$f" "$case"
                fi[$case]+="$(jq '.jobs[0].read.iops' "$f") "
                fl[$case]+="$(jq '.jobs[0].read.clat_ns.percentile["50.000000"] / 1000' "$f") "
                fh[$case]+="$(jq '.jobs[0].read.clat_ns.percentile["99.000000"] / 1000' "$f") "
                fc[$case]+="$(jq '(.jobs[0].usr_cpu + .jobs[0].sys_cpu) / 100 * .jobs[0].read.runtime * 1000 / .jobs[0].read.total_ios' "$f") "
            else
                bench "$f" --rw randread --bs 4k --iodepth "$qd" --runtime "$RUNTIME"
                bi[$case]+="$(jq -r "$TCP_RESULT.total.iops" "$f") "
                bl[$case]+="$(jq -r "$TCP_RESULT.total.lat_ns.p50 / 1000" "$f") "
                bh[$case]+="$(jq -r "$TCP_RESULT.total.lat_ns.p99 / 1000" "$f") "
                bc[$case]+="$(jq -r "$TCP_RESULT.cpu.usec_per_io" "$f") "
            fi
        done
        fio_run "$dir/null-$case-$r.json" "$case" null
        nc[$case]+="$(jq '1e6 / .jobs[0].read.iops' "$dir/null-$case-$r.json") "
        a=$(jq '.jobs[0].read.iops' "$dir/fio-$case-$r.json")
        b=$(jq -r "$TCP_RESULT.total.iops" "$dir/bench-$case-$r.json")
        ratio[$case]+="$(awk -v a="$a" -v b="$b" 'BEGIN { print a / b }') "
        echo "round $r $case: fio $a IOPS, nvmf-bench $b IOPS" >&2
    done
done
stop_target
med() { tr ' ' '\n' | grep -v '^$' | median; }

echo "fio + libnvmf_fio.so against nvmf-bench: 4k randread, NVMe/TCP loopback, nvmf-target (1 poller, null namespace) on CPU $TARGET_CPU, client on CPU $CLIENT_CPU, ${RUNTIME}s per run, median of $ROUNDS alternating rounds; $(tcp_settings)"
printf '%-14s | %9s %7s %7s %6s | %9s %7s %7s %6s | %9s\n' case "fio IOPS" "p50 us" "p99 us" "us/io" \
    "bench IOPS" "p50 us" "p99 us" "us/io" "fio/bench"
for case in $CASES; do
    printf '%-14s | %9.0f %7.1f %7.1f %6.2f | %9.0f %7.1f %7.1f %6.2f | %9.3f\n' "$case" \
        "$(echo "${fi[$case]}" | med)" "$(echo "${fl[$case]}" | med)" "$(echo "${fh[$case]}" | med)" \
        "$(echo "${fc[$case]}" | med)" "$(echo "${bi[$case]}" | med)" "$(echo "${bl[$case]}" | med)" \
        "$(echo "${bh[$case]}" | med)" "$(echo "${bc[$case]}" | med)" "$(echo "${ratio[$case]}" | med)"
done
echo "fio's own time per I/O (its null engine, same options, same CPU; in fio's us/io above):" \
    "$(for case in $CASES; do printf '%s %.2f us  ' "$case" "$(echo "${nc[$case]}" | med)"; done)"
