#!/usr/bin/env bash
# Two NVMe-oF targets driven by the same client: SPDK's spdk_nvme_perf on one core (CPU 1)
# against target A and target B, each with a null namespace on the other core (CPU 0), over
# NVMe/TCP on loopback. A and B are `spdk` (SPDK's nvmf_tgt on one core), `ours` (this tree's
# nvmf-target, `threads: 1`) or the path of another nvmf-target binary (an older build, to check
# for a regression). Each round starts A, runs every workload, stops it, then does the same with
# B (the order alternates between rounds, and only one target runs at a time: SPDK's busy-polls
# its core), so each pair sees the same moment of a shared machine. Prints per round both IOPS
# and their ratio B/A, then per workload the median of the paired ratios. A measurement, not a
# test: exit 0 whatever the ratios. Not part of CI or scripts/test.sh.
#
#   ../shared/tools/build-spdk.sh first (SPDK v23.01.1 in /tmp/spdk-src), then:
#   scripts/bench-targets.sh                              # A=spdk B=ours, 5 rounds of 5 s
#   A=/tmp/base-build/release/nvmf-target B=ours scripts/bench-targets.sh   # before/after
#   ROUNDS=7 RUNTIME=10 WORKLOADS="randread:4k:1 randread:4k:32 read:128k:8" (the default)
#
# SPDK's apps need hugepages: the script reserves HUGEPAGES (default 1024 x 2 MiB) and mounts
# hugetlbfs on /dev/hugepages when it is not there (root).
NAME=bench-targets
source "$(dirname "$0")/bench-lib.sh"
SPDK_DIR=${SPDK_DIR:-/tmp/spdk-src}
ROUNDS=${ROUNDS:-5}
RUNTIME=${RUNTIME:-5}
A=${A:-spdk}
B=${B:-ours}
WORKLOADS=${WORKLOADS:-randread:4k:1 randread:4k:32 read:128k:8}
NQN=nqn.2026-11.io.nvmf-rs:bench-targets
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b1c2a52-2f4e-4f0e-9d1e-5e0f3c2a7b10
TGT_CPU=0 CLIENT_CPU=1

perf_bin=$SPDK_DIR/build/examples/perf
tgt_bin=$SPDK_DIR/build/bin/nvmf_tgt
need=("$perf_bin")
[ "$A" = spdk ] || [ "$B" = spdk ] && need+=("$tgt_bin")
for b in "${need[@]}"; do
    [ -x "$b" ] || { echo "$NAME: $b missing: build SPDK first (../shared/tools/build-spdk.sh)" >&2; exit 2; }
done
for t in "$A" "$B"; do
    case $t in spdk | ours) ;; *) [ -x "$t" ] || { echo "$NAME: $t: not spdk, ours or an nvmf-target binary" >&2; exit 2; } ;; esac
done
export LD_LIBRARY_PATH=$SPDK_DIR/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ "$(nproc)" -ge 2 ] || { echo "$NAME: needs 2 cores (target on one, client on the other)" >&2; exit 2; }

mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages; }
want=${HUGEPAGES:-1024}
[ "$(cat /proc/sys/vm/nr_hugepages)" -ge "$want" ] || echo "$want" >/proc/sys/vm/nr_hugepages

spdk_pid=
bench_extra_cleanup() {
    [ -z "$spdk_pid" ] || kill "$spdk_pid" 2>/dev/null || true
    rm -f /dev/hugepages/bench-targets* 2>/dev/null || true
}

# start TARGET: starts it on TGT_CPU listening on 127.0.0.1:$port.
start() {
    case $1 in
        spdk)
            port=$(free_port)
            cat >"$dir/spdk.json" <<EOF
{ "subsystems": [
  { "subsystem": "bdev", "config": [
    { "method": "bdev_null_create", "params": { "name": "Null0", "num_blocks": 262144, "block_size": 4096 } } ] },
  { "subsystem": "nvmf", "config": [
    { "method": "nvmf_create_transport", "params": { "trtype": "TCP" } },
    { "method": "nvmf_create_subsystem", "params": { "nqn": "$NQN", "allow_any_host": true, "serial_number": "SPDK00000000000001" } },
    { "method": "nvmf_subsystem_add_ns", "params": { "nqn": "$NQN", "namespace": { "bdev_name": "Null0", "nsid": 1 } } },
    { "method": "nvmf_subsystem_add_listener", "params": { "nqn": "$NQN",
      "listen_address": { "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "$port" } } } ] } ] }
EOF
            "$tgt_bin" -m "$((1 << TGT_CPU))" -s 512 -i 1 -r "$dir/spdk.sock" --json "$dir/spdk.json" \
                >"$dir/spdk.log" 2>&1 &
            spdk_pid=$!
            for _ in $(seq 200); do
                (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
                kill -0 "$spdk_pid" 2>/dev/null || break
                sleep 0.1
            done
            echo "$NAME: nvmf_tgt did not listen:" >&2
            cat "$dir/spdk.log" >&2
            exit 1
            ;;
        ours)
            start_target ours "{ nsid: 1, null: 1GiB }" "threads: 1"
            taskset -pc "$TGT_CPU" "$pid" >/dev/null
            ;;
        *)
            local saved=$BIN
            BIN=$(dirname "$1")
            start_target other "{ nsid: 1, null: 1GiB }" "threads: 1"
            BIN=$saved
            taskset -pc "$TGT_CPU" "$pid" >/dev/null
            ;;
    esac
}
stop() {
    if [ "$1" = spdk ]; then
        kill "$spdk_pid"
        wait "$spdk_pid" || true
        spdk_pid=
    else
        stop_target
    fi
}

# run_perf RW BS QD: sets IOPS.
run_perf() {
    local rw=$1 bs=$2 qd=$3
    taskset -c "$CLIENT_CPU" "$perf_bin" -q "$qd" -o "$(numfmt --from=iec "${bs^^}")" -w "$rw" -t "$RUNTIME" \
        -c "$((1 << CLIENT_CPU))" -s 512 -i 2 \
        -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$NQN hostnqn:$HOSTNQN" \
        >"$dir/perf.out" 2>&1 || { echo "$NAME: spdk_nvme_perf failed:" >&2; cat "$dir/perf.out" >&2; exit 1; }
    IOPS=$(awk '/^Total/ { printf "%.0f", $3 }' "$dir/perf.out")
    [ -n "$IOPS" ] || { echo "$NAME: no Total line from spdk_nvme_perf:" >&2; cat "$dir/perf.out" >&2; exit 1; }
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "spdk_nvme_perf against A=$A and B=$B: NVMe/TCP 127.0.0.1, null namespace, target on CPU $TGT_CPU, client on CPU $CLIENT_CPU; $ROUNDS rounds of ${RUNTIME}s per target and workload"
declare -A iops ratios
for r in $(seq "$ROUNDS"); do
    for t in $([ $((r % 2)) = 1 ] && echo "A B" || echo "B A"); do
        tgt=${!t}
        start "$tgt"
        for wl in $WORKLOADS; do
            IFS=: read -r rw bs qd <<<"$wl"
            run_perf "$rw" "$bs" "$qd"
            iops[$t,$wl]=$IOPS
        done
        stop "$tgt"
    done
    for wl in $WORKLOADS; do
        IFS=: read -r rw bs qd <<<"$wl"
        ratio=$(awk -v b="${iops[B,$wl]}" -v a="${iops[A,$wl]}" 'BEGIN { printf "%.3f", b / a }')
        ratios[$wl]="${ratios[$wl]:-} $ratio"
        printf 'round %d  %-16s A %9s  B %9s  B/A %s\n' "$r" "$rw $bs QD$qd" "${iops[A,$wl]}" "${iops[B,$wl]}" "$ratio"
    done
done
echo
for wl in $WORKLOADS; do
    IFS=: read -r rw bs qd <<<"$wl"
    # shellcheck disable=SC2086
    m=$(printf '%s\n' ${ratios[$wl]} | median)
    printf '%-16s median B/A %.2f (rounds:%s)\n' "$rw $bs QD$qd" "$m" "${ratios[$wl]}"
done
