#!/usr/bin/env bash
# An RBD namespace against librbd used directly: the same image on the same single-node
# cluster (scripts/ceph-cluster.sh, started here in its own directory, memstore), read and
# written through nvmf-target (one poller thread, NVMe/TCP loopback) and by fio's rbd engine
# (librbd in fio's process: what users of a gateway compare against). With SPDK built with
# bdev_rbd (WITH_RBD=1 ../shared/tools/build-spdk.sh), SPDK's nvmf_tgt serving the image through
# bdev_rbd joins. CLIENT says what drives both NVMe-oF targets: `perf` (spdk_nvme_perf, the
# default with SPDK; it busy-polls its core, which the OSD then lacks) or `bench` (nvmf-bench,
# which sleeps when it waits; the default without SPDK). Per round every client runs each workload once, in alternating order;
# per workload it prints each round's IOPS, CPU per I/O (the client's and target's user+system,
# and the OSD's) and at the end the median of the paired ratios. A measurement, not a test: exit
# 0 whatever the ratios. Not part of CI or scripts/test.sh.
#
#   scripts/bench-rbd.sh                             # 5 rounds of 5 s
#   CLIENT=bench scripts/bench-rbd.sh                # nvmf-bench drives both targets
#   ROUNDS=7 RUNTIME=10 WORKLOADS="randread:4k:32 randwrite:4k:32 read:128k:8 randread:4k:1"
#
# The image (IMAGE_MIB, default 512) is filled once before the rounds, so reads reach the OSD's
# data (a never-written object reads as zeroes without any).
NAME=bench-rbd
source "$(dirname "$0")/bench-lib.sh"
ROUNDS=${ROUNDS:-5}
RUNTIME=${RUNTIME:-5}
WORKLOADS=${WORKLOADS:-randread:4k:32 randwrite:4k:32 read:128k:8 randread:4k:1}
IMAGE_MIB=${IMAGE_MIB:-512}
CLIENT=${CLIENT:-}
# Our target's `target:` settings (e.g. "threads: 1, poll: interrupt").
OURS_SETTINGS=${OURS_SETTINGS:-threads: 1}
NQN=nqn.2026-11.io.nvmf-rs:bench-rbd
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:6b1c2a52-2f4e-4f0e-9d1e-5e0f3c2a7b11
command -v fio >/dev/null || { echo "$NAME: needs fio (apt-get install fio)" >&2; exit 2; }

SPDK_DIR=${SPDK_DIR:-/tmp/spdk-src}
spdk=
if [ -x "$SPDK_DIR/build/bin/nvmf_tgt" ] && grep -Eq '^CONFIG_RBD\??=y' "$SPDK_DIR/mk/config.mk" 2>/dev/null; then
    spdk=1
    TGT_CPU=0 CLIENT_CPU=1
    source "$(dirname "$0")/spdk-lib.sh"
fi

# The cluster: a directory of its own, 4 GiB of memstore; stopped on exit.
ceph_dir=$dir/ceph
CEPH_MEMSTORE_BYTES=$((4 << 30)) bash scripts/ceph-cluster.sh start "$ceph_dir" >/dev/null
conf=$ceph_dir/ceph.conf
# fio's librbd reads $CEPH_CONF; the same client settings as the target's (no client cache).
printf '[client]\nrbd cache = false\n' >>"$conf"
export CEPH_CONF=$conf
prev_cleanup=$(declare -f bench_extra_cleanup)
eval "${prev_cleanup/bench_extra_cleanup/spdk_extra_cleanup}"
bench_extra_cleanup() {
    spdk_extra_cleanup
    bash scripts/ceph-cluster.sh stop "$ceph_dir" >/dev/null 2>&1 || true
}
osd_pid=$(cat "$ceph_dir/run/osd.0.pid")
rbd -c "$conf" create --size "$IMAGE_MIB" rbd/bench
echo "$NAME: filling the ${IMAGE_MIB} MiB image" >&2
fio --name=fill --ioengine=rbd --clientname=admin --pool=rbd --rbdname=bench --rw=write --bs=1m \
    --iodepth=8 --output="$dir/fill.out" >/dev/null

# Our target (one poller thread) on the image.
start_ours() {
    start_target ours "{ nsid: 1, rbd: { pool: rbd, image: bench, conf: $conf } }" "$OURS_SETTINGS"
    [ -z "$spdk" ] || taskset -pc "$TGT_CPU" "$pid" >/dev/null
}

# SPDK's nvmf_tgt with the image as an rbd bdev (what ceph-nvmeof runs).
start_spdk_rbd() {
    start_spdk '{ "method": "bdev_rbd_register_cluster", "params": { "name": "c0", "config_file": "'"$conf"'", "user_id": "admin" } },
    { "method": "bdev_rbd_create", "params": { "name": "Rbd0", "pool_name": "rbd", "rbd_name": "bench", "block_size": 4096, "cluster_name": "c0" } }' Rbd0
}

# CPU seconds (user + system) of this shell's waited-for children, from `times`, in CPU_NOW
# (called in this shell: in $(...) it would count a subshell's children).
child_cpu() {
    times >"$dir/times"
    CPU_NOW=$(tail -n 1 "$dir/times" | awk '{ t = 0
        for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] }
        printf "%.4f", t }')
}

# measure CLIENT RW BS QD: one run; sets IOPS, CLI (client + target CPU us per I/O), TGT (the
# target's alone) and OSD (the OSD's CPU us per I/O).
measure() {
    local client=$1 rw=$2 bs=$3 qd=$4 c0 c1 o0 o1 t0 t1 tp=
    case $client in
        ours-*) tp=$pid ;;
        spdk-*) tp=$spdk_pid ;;
    esac
    child_cpu; c0=$CPU_NOW; o0=$(ticks "$osd_pid"); t0=0
    [ -z "$tp" ] || t0=$(ticks "$tp")
    case $client in
        fio)
            fio --name=w --ioengine=rbd --clientname=admin --pool=rbd --rbdname=bench --rw="$rw" \
                --bs="$bs" --iodepth="$qd" --runtime="$RUNTIME" --time_based --output-format=json \
                --output="$dir/fio.json" >/dev/null
            IOPS=$(jq '[.jobs[0].read.iops, .jobs[0].write.iops] | add' "$dir/fio.json")
            ;;
        ours-bench | spdk-bench)
            bench "$dir/bench.json" --nsid 1 --rw "$rw" --bs "$bs" --iodepth "$qd" --runtime "$RUNTIME"
            IOPS=$(jq -r "$TCP_RESULT.total.iops" "$dir/bench.json")
            ;;
        ours-perf | spdk-perf)
            local w=$rw
            spdk_perf "$w" "$bs" "$qd"
            ;;
    esac
    child_cpu; c1=$CPU_NOW; o1=$(ticks "$osd_pid"); t1=0
    [ -z "$tp" ] || t1=$(ticks "$tp")
    read -r IOPS CLI TGT OSD < <(awk -v i="$IOPS" -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" \
        -v o0="$o0" -v o1="$o1" -v hz="$hz" -v r="$RUNTIME" 'BEGIN {
        n = i * r; printf "%.0f %.1f %.1f %.1f\n", i, 1e6 * ((c1 - c0) + (t1 - t0) / hz) / n,
            1e6 * (t1 - t0) / hz / n, 1e6 * (o1 - o0) / hz / n }')
}


[ -n "$CLIENT" ] || { if [ -n "$spdk" ]; then CLIENT=perf; else CLIENT=bench; fi; }
case $CLIENT in
    perf) [ -n "$spdk" ] || { echo "$NAME: CLIENT=perf needs SPDK" >&2; exit 2; }; clients="fio ours-perf spdk-perf" ;;
    bench) clients="fio ours-bench"; [ -z "$spdk" ] || clients+=" spdk-bench" ;;
    *) echo "$NAME: CLIENT is perf or bench" >&2; exit 2 ;;
esac
echo "RBD namespace vs librbd: image rbd/bench ${IMAGE_MIB} MiB on a single-node memstore cluster, NVMe/TCP 127.0.0.1," \
    "our target: { $OURS_SETTINGS }; $ROUNDS rounds of ${RUNTIME}s per client; clients: $clients; $(tcp_settings)"
[ -n "$spdk" ] || echo "(SPDK with bdev_rbd not found in $SPDK_DIR: WITH_RBD=1 ../shared/tools/build-spdk.sh adds SPDK's target)"
echo "CPU columns: us of CPU per I/O, client + target (fio: its own process, librbd included) / the target alone / OSD"
summary=()
for wl in $WORKLOADS; do
    IFS=: read -r rw bs qd <<<"$wl"
    echo
    echo "== $rw $bs QD$qd"
    declare -A iops=()
    r_ours=() r_spdk=()
    for r in $(seq "$ROUNDS"); do
        line="round $r:"
        # shellcheck disable=SC2086 # clients is a list
        for c in $(in_turn "$r" $clients); do
            case $c in
                ours-*) start_ours ;;
                spdk-*) start_spdk_rbd ;;
            esac
            measure "$c" "$rw" "$bs" "$qd"
            case $c in
                ours-*) stop_target ;;
                spdk-*) stop_spdk ;;
            esac
            iops[$c]=$IOPS
            line+=$(printf '  %s %s IOPS (%s/%s/%s us)' "$c" "$IOPS" "$CLI" "$TGT" "$OSD")
        done
        ours=${iops[ours-bench]:-${iops[ours-perf]:-0}}
        q=$(awk -v a="$ours" -v b="${iops[fio]}" 'BEGIN { printf "%.3f", a / b }')
        r_ours+=("$q")
        line+="  ours/fio $q"
        if [ -n "$spdk" ]; then
            q=$(awk -v a="$ours" -v b="${iops[spdk-perf]:-${iops[spdk-bench]}}" 'BEGIN { printf "%.3f", a / b }')
            r_spdk+=("$q")
            line+="  ours/spdk $q"
        fi
        echo "$line"
    done
    s=$(printf '%-18s ours/fio-rbd median %.2f (%s)' "$rw $bs QD$qd" "$(printf '%s\n' "${r_ours[@]}" | median)" "${r_ours[*]}")
    [ -z "$spdk" ] || s+=$(printf '; ours/spdk-bdev_rbd median %.2f (%s)' "$(printf '%s\n' "${r_spdk[@]}" | median)" "${r_spdk[*]}")
    summary+=("$s")
done
echo
printf '%s\n' "${summary[@]}"
