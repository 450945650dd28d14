# SPDK's side of the scripts/bench-*.sh comparisons (sourced after bench-lib.sh, not run): its
# binaries from SPDK_DIR (default /tmp/spdk-src, built by ../shared/tools/build-spdk.sh),
# hugepages for DPDK, SPDK's nvmf_tgt with a null namespace, spdk_nvme_perf, and starting and
# stopping either target by name. The sourcing script sets NAME, NQN, HOSTNQN, TGT_CPU,
# CLIENT_CPU and RUNTIME.
SPDK_DIR=${SPDK_DIR:-/tmp/spdk-src}
perf_bin=$SPDK_DIR/build/examples/perf
tgt_bin=$SPDK_DIR/build/bin/nvmf_tgt
for b in "$perf_bin" "$tgt_bin"; do
    [ -x "$b" ] || { echo "$NAME: $b missing: build SPDK first (../shared/tools/build-spdk.sh)" >&2; exit 2; }
done
export LD_LIBRARY_PATH=$SPDK_DIR/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ "$(nproc)" -ge 2 ] || { echo "$NAME: needs 2 cores (target on one, client on the other)" >&2; exit 2; }

# Hugepages for SPDK (DPDK's EAL).
mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages; }
want=${HUGEPAGES:-1024}
[ "$(cat /proc/sys/vm/nr_hugepages)" -ge "$want" ] || echo "$want" >/proc/sys/vm/nr_hugepages
[ "$(cat /proc/sys/vm/nr_hugepages)" -ge "$want" ] ||
    echo "$NAME: only $(cat /proc/sys/vm/nr_hugepages) hugepages could be reserved (wanted $want)" >&2

spdk_pid=
bench_extra_cleanup() {
    [ -z "$spdk_pid" ] || kill "$spdk_pid" 2>/dev/null || true
    rm -f /dev/hugepages/"$NAME"* 2>/dev/null || true
}

# start_spdk [BDEVS BDEV]: nvmf_tgt on TGT_CPU with a TCP transport, the bdev subsystem's
# config entries BDEVS (JSON objects; default a null bdev Null0 of 1 GiB in 4 KiB blocks) and
# bdev BDEV (default Null0) as namespace 1 of $NQN, any host allowed, listening on
# 127.0.0.1:$port (a free port, set here).
start_spdk() {
    local bdevs=${1:-'{ "method": "bdev_null_create", "params": { "name": "Null0", "num_blocks": 262144, "block_size": 4096 } }'}
    local bdev=${2:-Null0}
    port=$(free_port)
    cat >"$dir/spdk.json" <<EOF
{ "subsystems": [
  { "subsystem": "bdev", "config": [ $bdevs ] },
  { "subsystem": "nvmf", "config": [
    { "method": "nvmf_create_transport", "params": { "trtype": "TCP" } },
    { "method": "nvmf_create_subsystem", "params": { "nqn": "$NQN", "allow_any_host": true, "serial_number": "SPDK00000000000001" } },
    { "method": "nvmf_subsystem_add_ns", "params": { "nqn": "$NQN", "namespace": { "bdev_name": "$bdev", "nsid": 1 } } },
    { "method": "nvmf_subsystem_add_listener", "params": { "nqn": "$NQN",
      "listen_address": { "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "$port" } } } ] } ] }
EOF
    "$tgt_bin" -m "$((1 << TGT_CPU))" -s 512 -i 1 -r "$dir/spdk.sock" --json "$dir/spdk.json" \
        >"$dir/spdk.log" 2>&1 &
    spdk_pid=$!
    for _ in $(seq 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        kill -0 "$spdk_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "$NAME: nvmf_tgt did not listen on 127.0.0.1:$port:" >&2
    cat "$dir/spdk.log" >&2
    exit 1
}

stop_spdk() {
    kill "$spdk_pid"
    wait "$spdk_pid" || true
    spdk_pid=
}

# spdk_perf RW BS QD: spdk_nvme_perf on CLIENT_CPU for RUNTIME seconds against 127.0.0.1:$port;
# sets IOPS (its Total line).
spdk_perf() {
    local rw=$1 bs=$2 qd=$3
    taskset -c "$CLIENT_CPU" "$perf_bin" -q "$qd" -o "$(numfmt --from=iec "${bs^^}")" -w "$rw" -t "$RUNTIME" \
        -c "$((1 << CLIENT_CPU))" -s 512 -i 2 \
        -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$NQN hostnqn:$HOSTNQN" \
        >"$dir/perf.out" 2>&1 || { echo "$NAME: spdk_nvme_perf failed:" >&2; cat "$dir/perf.out" >&2; exit 1; }
    IOPS=$(awk '/^Total/ { printf "%.0f", $3 }' "$dir/perf.out")
    [ -n "$IOPS" ] || { echo "$NAME: no Total line from spdk_nvme_perf:" >&2; cat "$dir/perf.out" >&2; exit 1; }
}

# check_targets TARGET...: each is `spdk`, `ours` or the path of an nvmf-target binary.
check_targets() {
    local t
    for t in "$@"; do
        case $t in spdk | ours) ;; *) [ -x "$t" ] || { echo "$NAME: $t: not spdk, ours or an nvmf-target binary" >&2; exit 2; } ;; esac
    done
}

# start TARGET: SPDK's nvmf_tgt (`spdk`), this tree's nvmf-target (`ours`) or another
# nvmf-target binary (its path; ours and others `threads: 1` plus $SETTINGS) on TGT_CPU with a
# 1 GiB null namespace, listening on 127.0.0.1:$port. stop TARGET ends it.
start() {
    case $1 in
        spdk) start_spdk ;;
        *)
            local saved=$BIN
            [ "$1" = ours ] || BIN=$(dirname "$1")
            start_target tgt "{ nsid: 1, null: 1GiB }" "threads: 1${SETTINGS:+, $SETTINGS}"
            BIN=$saved
            taskset -pc "$TGT_CPU" "$pid" >/dev/null
            ;;
    esac
}
stop() { if [ "$1" = spdk ]; then stop_spdk; else stop_target; fi; }
