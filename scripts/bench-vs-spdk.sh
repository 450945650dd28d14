#!/usr/bin/env bash
# Our initiator (nvmf-bench) against SPDK's (spdk_nvme_perf), driven against the same target:
# SPDK's nvmf_tgt and ours, each with a null namespace on one core (core 0), over NVMe/TCP on
# loopback; the client runs on the other core (core 1). For each target and each round, every
# workload runs once with spdk_nvme_perf and once with nvmf-bench (the order alternates between
# rounds), so each pair sees the same moment of a shared machine. Prints per round the two IOPS,
# their ratio (nvmf-bench / perf) and each client's CPU time per I/O (user + system, from the
# shell's `times`), then per workload the median of the paired ratios. A measurement, not a test:
# exit 0 whatever the ratios. Not part of CI or scripts/test.sh.
#
#   ../shared/tools/build-spdk.sh first (SPDK v23.01.1 in /tmp/spdk-src), then:
#   scripts/bench-vs-spdk.sh                       # both targets, 5 rounds of 5 s
#   TARGETS=ours ROUNDS=7 RUNTIME=10 scripts/bench-vs-spdk.sh
#   TARGETS="spdk /path/to/older/nvmf-target"    # spdk, ours, or an nvmf-target binary
#   WORKLOADS="randread:4k:1 randread:4k:32 read:128k:8"   # rw:bs:iodepth (the default)
#   SPDK_DIR=/path/to/spdk NO_BUILD=1 BIN=build/release
#
# SPDK's apps need hugepages: the script reserves HUGEPAGES (default 1024 x 2 MiB) and mounts
# hugetlbfs on /dev/hugepages when it is not there (root). Its own nvmf-bench flags: BENCH_FLAGS.
NAME=bench-vs-spdk
source "$(dirname "$0")/bench-lib.sh"
ROUNDS=${ROUNDS:-5}
RUNTIME=${RUNTIME:-5}
TARGETS=${TARGETS:-spdk ours}
WORKLOADS=${WORKLOADS:-randread:4k:1 randread:4k:32 read:128k:8}
BENCH_FLAGS=${BENCH_FLAGS:-}
NQN=nqn.2026-11.io.nvmf-rs:bench-vs-spdk
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b1c2a52-2f4e-4f0e-9d1e-5e0f3c2a7b10
TGT_CPU=0 CLIENT_CPU=1

source "$(dirname "$0")/spdk-lib.sh"

# Children's CPU seconds (user + system) so far, from the shell's `times` (run in this shell:
# in a pipeline or $(...) it would report a subshell's children). Sets CPU_NOW.
child_cpu() {
    times >"$dir/times"
    CPU_NOW=$(tail -n 1 "$dir/times" | awk '{
        t = 0
        for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] }
        printf "%.4f", t }')
}

# result IOPS CPU0 CPU1: sets IOPS and CPU (client CPU microseconds per I/O over the run).
result() {
    IOPS=$(printf '%.0f' "$1")
    CPU=$(awk -v i="$1" -v c0="$2" -v c1="$3" -v t="$RUNTIME" 'BEGIN { printf "%.2f", 1e6 * (c1 - c0) / (i * t) }')
}

# run_perf RW BS QD: sets IOPS and CPU
run_perf() {
    local c0 c1
    child_cpu; c0=$CPU_NOW
    spdk_perf "$@"
    child_cpu; c1=$CPU_NOW
    result "$IOPS" "$c0" "$c1"
}

# run_bench RW BS QD: sets IOPS and CPU
run_bench() {
    local rw=$1 bs=$2 qd=$3 c0 c1
    child_cpu; c0=$CPU_NOW
    # shellcheck disable=SC2086 # BENCH_FLAGS is a list
    bench "$dir/bench.json" --nsid 1 --rw "$rw" --bs "$bs" --iodepth "$qd" --runtime "$RUNTIME" $BENCH_FLAGS
    child_cpu; c1=$CPU_NOW
    result "$(jq -r "$TCP_RESULT.total.iops" "$dir/bench.json")" "$c0" "$c1"
}


# shellcheck disable=SC2086 # TARGETS is a list
check_targets $TARGETS
echo "nvmf-bench vs spdk_nvme_perf: NVMe/TCP 127.0.0.1, null namespace, target on CPU $TGT_CPU, client on CPU $CLIENT_CPU; $ROUNDS rounds of ${RUNTIME}s per client; $(tcp_settings)"
summary=()
for tgt in $TARGETS; do
    SETTINGS= start "$tgt"
    echo
    echo "== target: $(case $tgt in spdk) echo "SPDK nvmf_tgt" ;; ours) echo "nvmf-target (ours)" ;; *) echo "$tgt" ;; esac)"
    printf '%-16s %5s %11s %11s %7s %13s %13s\n' workload round "perf IOPS" "bench IOPS" ratio "perf us/IO" "bench us/IO"
    for wl in $WORKLOADS; do
        IFS=: read -r rw bs qd <<<"$wl"
        ratios=()
        for r in $(seq "$ROUNDS"); do
            for client in $(in_turn "$r" perf bench); do
                if [ "$client" = perf ]; then
                    run_perf "$rw" "$bs" "$qd"; p_iops=$IOPS p_cpu=$CPU
                else
                    run_bench "$rw" "$bs" "$qd"; b_iops=$IOPS b_cpu=$CPU
                fi
            done
            ratio=$(awk -v a="$b_iops" -v b="$p_iops" 'BEGIN { printf "%.3f", a / b }')
            ratios+=("$ratio")
            printf '%-16s %5s %11s %11s %7s %13s %13s\n' "$rw $bs QD$qd" "$r" "$p_iops" "$b_iops" "$ratio" "$p_cpu" "$b_cpu"
        done
        m=$(printf '%s\n' "${ratios[@]}" | median)
        summary+=("$(printf '%-6s %-16s median nvmf-bench/perf %.2f (rounds: %s)' "$tgt" "$rw $bs QD$qd" "$m" "${ratios[*]}")")
    done
    stop "$tgt"
done
echo
printf '%s\n' "${summary[@]}"
