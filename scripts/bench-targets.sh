#!/usr/bin/env bash
# Two NVMe-oF targets driven by the same client: SPDK's spdk_nvme_perf on one core (CPU 1)
# against target A and target B, each with a null namespace on the other core (CPU 0), over
# NVMe/TCP on loopback. A and B are `spdk` (SPDK's nvmf_tgt on one core), `ours` (this tree's
# nvmf-target, `threads: 1`) or the path of another nvmf-target binary (an older build, to check
# for a regression). Each round runs every workload on a freshly started A, then on a freshly
# started B (the order alternates between rounds, and only one target runs at a time: SPDK's
# busy-polls its core), so each pair sees the same moment of a shared machine. Prints per round both IOPS
# and their ratio B/A, then per workload the median of the paired ratios. A measurement, not a
# test: exit 0 whatever the ratios. Not part of CI or scripts/test.sh.
#
#   ../shared/tools/build-spdk.sh first (SPDK v23.01.1 in /tmp/spdk-src), then:
#   scripts/bench-targets.sh                              # A=spdk B=ours, 5 rounds of 5 s
#   A=/tmp/base-build/release/nvmf-target B=ours scripts/bench-targets.sh   # before/after
#   ROUNDS=7 RUNTIME=10 WORKLOADS="randread:4k:1 randread:4k:32 read:128k:8" (the default)
#   A=ours B=ours B_SETTINGS="c2h_success: always" scripts/bench-targets.sh  # a setting's effect
# A_SETTINGS / B_SETTINGS: more `target:` settings for that side when it is one of ours.
# RAW=1 also measures, per round and workload, the ceiling both sit on: a plain loopback TCP
# socket pair doing the same exchange with no protocol at all (nvmf-bench --raw-tcp-cpus: a
# busy-polling server on CPU 0 answering each 72-byte request with a BS-byte reply, a spinning
# client on CPU 1 keeping QD requests in flight), and prints A and B as fractions of it.
#
# SPDK's apps need hugepages: the script reserves HUGEPAGES (default 1024 x 2 MiB) and mounts
# hugetlbfs on /dev/hugepages when it is not there (root).
NAME=bench-targets
source "$(dirname "$0")/bench-lib.sh"
ROUNDS=${ROUNDS:-5}
RUNTIME=${RUNTIME:-5}
A=${A:-spdk}
B=${B:-ours}
WORKLOADS=${WORKLOADS:-randread:4k:1 randread:4k:32 read:128k:8}
RAW=${RAW:-0}
NQN=nqn.2026-11.io.nvmf-rs:bench-targets
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b1c2a52-2f4e-4f0e-9d1e-5e0f3c2a7b10
TGT_CPU=0 CLIENT_CPU=1

source "$(dirname "$0")/spdk-lib.sh"
check_targets "$A" "$B"

# raw RW BS QD: sets RAW_IOPS, the raw TCP ping-pong's reply rate (nvmf-bench runs its NVMe
# job against a fresh nvmf-target first, then the baseline with its threads pinned).
raw() {
    start ours
    taskset -c "$CLIENT_CPU" "$BIN/nvmf-bench" --transport tcp --traddr 127.0.0.1 --trsvcid "$port" \
        --subnqn "$NQN" --rw "$1" --bs "$2" --iodepth "$3" --runtime "$RUNTIME" --hipri \
        --raw-tcp-cpus "$TGT_CPU,$CLIENT_CPU" --output-format json >"$dir/raw.json" 2>"$dir/raw.err" ||
        { echo "$NAME: nvmf-bench --raw-tcp-cpus failed:" >&2; cat "$dir/raw.err" >&2; exit 1; }
    stop ours
    RAW_IOPS=$(jq -r '.workloads[0].raw_tcp_baseline.pingpong.iops | floor' "$dir/raw.json")
}


echo "spdk_nvme_perf against A=$A and B=$B: NVMe/TCP 127.0.0.1, null namespace, target on CPU $TGT_CPU, client on CPU $CLIENT_CPU; $ROUNDS rounds of ${RUNTIME}s per target and workload; $(tcp_settings)"
declare -A iops ratios
for r in $(seq "$ROUNDS"); do
    # Per workload A and B back to back (a fresh target each run), so the two runs of a pair
    # are seconds apart: this machine's speed changes over tens of seconds.
    for wl in $WORKLOADS; do
        IFS=: read -r rw bs qd <<<"$wl"
        for t in $(in_turn "$r" A B); do
            tgt=${!t}
            settings_var=${t}_SETTINGS
            SETTINGS=${!settings_var:-} start "$tgt"
            spdk_perf "$rw" "$bs" "$qd"
            iops[$t,$wl]=$IOPS
            stop "$tgt"
        done
        if [ "$RAW" = 1 ]; then
            raw "$rw" "$bs" "$qd"
            iops[raw,$wl]=$RAW_IOPS
        fi
    done
    for wl in $WORKLOADS; do
        IFS=: read -r rw bs qd <<<"$wl"
        ratio=$(awk -v b="${iops[B,$wl]}" -v a="${iops[A,$wl]}" 'BEGIN { printf "%.3f", b / a }')
        ratios[$wl]="${ratios[$wl]:-} $ratio"
        printf 'round %d  %-16s A %9s  B %9s  B/A %s' "$r" "$rw $bs QD$qd" "${iops[A,$wl]}" "${iops[B,$wl]}" "$ratio"
        if [ "$RAW" = 1 ]; then
            read -r ra rb < <(awk -v a="${iops[A,$wl]}" -v b="${iops[B,$wl]}" -v r="${iops[raw,$wl]}" \
                'BEGIN { printf "%.3f %.3f\n", a / r, b / r }')
            ratios[A/raw,$wl]="${ratios[A/raw,$wl]:-} $ra"
            ratios[B/raw,$wl]="${ratios[B/raw,$wl]:-} $rb"
            printf '  raw %9s  A/raw %s  B/raw %s' "${iops[raw,$wl]}" "$ra" "$rb"
        fi
        printf '\n'
    done
done
echo
for wl in $WORKLOADS; do
    IFS=: read -r rw bs qd <<<"$wl"
    # shellcheck disable=SC2086
    m=$(printf '%s\n' ${ratios[$wl]} | median)
    printf '%-16s median B/A %.2f (rounds:%s)\n' "$rw $bs QD$qd" "$m" "${ratios[$wl]}"
    if [ "$RAW" = 1 ]; then
        for side in A B; do
            # shellcheck disable=SC2086
            m=$(printf '%s\n' ${ratios[$side/raw,$wl]} | median)
            printf '%-16s median %s/raw %.2f (rounds:%s)\n' "" "$side" "$m" "${ratios[$side/raw,$wl]}"
        done
    fi
done
