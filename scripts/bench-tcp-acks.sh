#!/usr/bin/env bash
# What each client's traffic asks of a target's TCP over loopback NVMe/TCP (acknowledgements,
# data packets, pacing, retransmissions): TARGET (`spdk`: SPDK's nvmf_tgt; `ours`: this tree's nvmf-target, `threads: 1`;
# or the path of another nvmf-target binary) runs with a 1 GiB null namespace on CPU 0, and
# spdk_nvme_perf and nvmf-bench (CPU 1) run WORKLOAD in turn, the order flipping every round.
# `perf stat` counts on each CPU, for RECORD seconds from SKIP seconds into each run: pure ACKs
# (66-byte packets on lo, either socket's; at 128k reads nearly all are the client's), data
# packets (over 1000 bytes), the TCP pacing timer armed (`tcp_pace_kick`: the congestion control
# paces, as bbr does; cubic does not) and retransmitted segments. Prints per round and client
# the IOPS, the first three per I/O by the CPU they happened on, and the retransmissions. The
# client runs on CPU 1 only, so an ACK its socket sends from CPU 0 was sent in the softirq that
# delivered the data there (loopback receives a packet on the CPU that sent it), and one from
# CPU 1 by the client itself, mostly from its reads (see the README on 128k reads). A
# measurement, not a test; not part of CI or scripts/test.sh.
# Needs Linux `perf` (Debian: linux-perf) and root.
#
#   ../shared/tools/build-spdk.sh first (SPDK v23.01.1 in /tmp/spdk-src), then:
#   scripts/bench-tcp-acks.sh                             # TARGET=spdk, read:128k:8, 3 rounds
#   TARGET=ours WORKLOAD=randread:4k:32 ROUNDS=5 scripts/bench-tcp-acks.sh
# RUNTIME (default 8 s) per client; BENCH_FLAGS: more nvmf-bench flags.
NAME=bench-tcp-acks
source "$(dirname "$0")/bench-lib.sh"
TARGET=${TARGET:-spdk}
WORKLOAD=${WORKLOAD:-read:128k:8}
ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-8}
RECORD=${RECORD:-4}
SKIP=${SKIP:-2}
BENCH_FLAGS=${BENCH_FLAGS:-}
NQN=nqn.2026-11.io.nvmf-rs:bench-tcp-acks
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b1c2a52-2f4e-4f0e-9d1e-5e0f3c2a7b10
TGT_CPU=0 CLIENT_CPU=1
command -v perf >/dev/null || { echo "$NAME: needs perf (Debian: apt-get install linux-perf)" >&2; exit 2; }
[ $((SKIP + RECORD)) -lt "$RUNTIME" ] || { echo "$NAME: SKIP + RECORD must be less than RUNTIME" >&2; exit 2; }
source "$(dirname "$0")/spdk-lib.sh"
check_targets "$TARGET"
IFS=: read -r rw bs qd <<<"$WORKLOAD"
[ -n "$qd" ] || { echo "$NAME: WORKLOAD is rw:bs:iodepth, not $WORKLOAD" >&2; exit 2; }
pace=$(awk '$3 == "tcp_pace_kick" { print $1 }' /proc/kallsyms)
case $pace in
    '' | 0000000000000000) echo "$NAME: no address for tcp_pace_kick in /proc/kallsyms (run as root)" >&2; exit 2 ;;
esac

# count CLIENT: runs the client while perf stat counts; sets IOPS and writes $dir/count.csv.
count() {
    (sleep "$SKIP" && perf stat -x, -A -a -o "$dir/count.csv" \
        -e net:net_dev_xmit --filter 'len == 66' -e net:net_dev_xmit --filter 'len > 1000' \
        -e timer:hrtimer_start --filter "function == 0x$pace" -e tcp:tcp_retransmit_skb \
        -- sleep "$RECORD" >/dev/null 2>&1) &
    local rec=$!
    if [ "$1" = perf ]; then
        spdk_perf "$rw" "$bs" "$qd"
    else
        # shellcheck disable=SC2086 # BENCH_FLAGS is a list
        bench "$dir/bench.json" --nsid 1 --rw "$rw" --bs "$bs" --iodepth "$qd" --runtime "$RUNTIME" $BENCH_FLAGS
        IOPS=$(jq -r "$TCP_RESULT.total.iops | floor" "$dir/bench.json")
    fi
    wait "$rec" || { echo "$NAME: perf stat failed" >&2; exit 1; }
}

echo "$NAME: $rw $bs QD$qd against $TARGET on CPU $TGT_CPU, clients on CPU $CLIENT_CPU; counted ${RECORD}s of each ${RUNTIME}s run; $(tcp_settings)"
printf '%-5s %-6s %8s  %15s  %15s  %15s  %7s\n' round client IOPS "ACKs/IO: CPU0 1" "data/IO: CPU0 1" "pacing/IO: 0 1" retrans
SETTINGS= start "$TARGET"
for r in $(seq "$ROUNDS"); do
    for client in $(in_turn "$r" perf bench); do
        count "$client"
        # perf stat -x, -A: "CPU0,<count>,,<event>,..." once per event and CPU, in -e order.
        awk -F, -v n="$((IOPS * RECORD))" -v r="$r" -v c="$client" -v iops="$IOPS" '
            /^CPU/ {
                cpu = substr($1, 4) + 0
                if (cpu > 1) next
                k = (cpu == 0) ? ++seen0 : ++seen1
                if ($2 ~ /^[0-9]+$/) v[k, cpu] = $2   # else "<not counted>": left out, printed as -
            }
            function per_io(x) { return (x == "") ? sprintf(" %7s", "-") : sprintf(" %7.3f", x / n) }
            END {
                printf "%-5s %-6s %8d ", r, c, iops
                for (k = 1; k <= 3; k++) printf "%s%s", per_io(v[k, 0]), per_io(v[k, 1])
                if (v[4, 0] == "" || v[4, 1] == "") printf "  %7s\n", "-"
                else printf "  %7d\n", v[4, 0] + v[4, 1]
            }' "$dir/count.csv"
    done
done
stop "$TARGET"
