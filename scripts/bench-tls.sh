#!/usr/bin/env bash
# NVMe/TCP over TLS 1.3 against plain NVMe/TCP, side by side in one run (issue #38): one
# nvmf-target (one poller thread, a null namespace, so the storage costs nothing) with a plain
# listener and a `tls: required` one, and nvmf-bench against each in alternating order per
# round. Where the kernel has the `tls` module both ends hand their sessions to kernel TLS
# (the VM: tests/vm/scenarios/bench-tls-tcp.sh runs this script there); elsewhere (this host)
# the records run in user space (OpenSSL, one copy each way). Per workload it prints each
# round's IOPS and CPU per I/O (client + target, user + system) and the median of the per-round
# TLS/plain ratios. A measurement, not a test: exit 0 whatever the ratios. Not part of CI.
#
#   scripts/bench-tls.sh                                  # 5 rounds of 5 s
#   ROUNDS=7 RUNTIME=10 WORKLOADS="randread:4k:32 read:128k:8" scripts/bench-tls.sh
NAME=bench-tls
source "$(dirname "$0")/bench-lib.sh"
ROUNDS=${ROUNDS:-5}
RUNTIME=${RUNTIME:-5}
WORKLOADS=${WORKLOADS:-randread:4k:32 read:128k:8}
NQN=nqn.2026-11.io.nvmf-rs:bench-tls
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:2c3d4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f

modprobe tls 2>/dev/null || true
if [ -r /proc/net/tls_stat ]; then records=kernel; else records=user-space; fi

# The key: 32 bytes from /dev/urandom in the interchange format (CRC-32 little-endian).
python3 -c 'import base64,os,zlib
k=os.urandom(32)
print("NVMeTLSkey-1:01:"+base64.b64encode(k+zlib.crc32(k).to_bytes(4,"little")).decode()+":")' >"$dir/host.psk"
chmod 600 "$dir/host.psk"

plain_port=$(free_port)
tls_port=$(free_port)
cat >"$dir/t.yaml" <<YAML
listeners:
  - { transport: tcp, address: 127.0.0.1, port: $plain_port }
  - { transport: tcp, address: 127.0.0.1, port: $tls_port, tls: required }
subsystems:
  - nqn: $NQN
    hosts: [ { nqn: "$HOSTNQN", tls_psk_file: $dir/host.psk } ]
    namespaces: [ { nsid: 1, null: 4GiB } ]
target: { threads: 1 }
YAML
RUST_LOG=${RUST_LOG:-info} "$BIN/nvmf-target" --config "$dir/t.yaml" 2>"$dir/t.log" &
pid=$!
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$tls_port") 2>/dev/null && break
    sleep 0.1
done

# run MODE RW BS QD: one nvmf-bench run; sets IOPS and CPU (us per I/O, client + target).
run() {
    local mode=$1 rw=$2 bs=$3 qd=$4 p=$plain_port extra=() t0 t1 c0 c1
    if [ "$mode" = tls ]; then p=$tls_port; extra=(--tls-psk-file "$dir/host.psk"); fi
    t0=$(ticks "$pid")
    c0=$(awk '{ print $14 + $15 + $16 + $17 }' /proc/$$/stat)
    "$BIN/nvmf-bench" --transport tcp --traddr 127.0.0.1 --trsvcid "$p" --subnqn "$NQN" \
        --hostnqn "$HOSTNQN" "${extra[@]}" --output-format json --nsid 1 --rw "$rw" --bs "$bs" \
        --iodepth "$qd" --runtime "$RUNTIME" >"$dir/b.json"
    t1=$(ticks "$pid")
    c1=$(awk '{ print $14 + $15 + $16 + $17 }' /proc/$$/stat)
    local st
    st=$(jq -r "$TCP_RESULT.status" "$dir/b.json")
    [ "$st" = ok ] || { echo "$NAME: $mode $rw $bs: $st" >&2; cat "$dir/b.json" >&2; exit 1; }
    IOPS=$(jq -r "$TCP_RESULT.total.iops" "$dir/b.json")
    CPU=$(awk -v i="$IOPS" -v r="$RUNTIME" -v d="$(( (t1 - t0) + (c1 - c0) ))" -v hz="$hz" \
        'BEGIN { printf "%.1f", 1e6 * d / hz / (i * r) }')
}


echo "NVMe/TCP with TLS 1.3 ($records records) vs plain: one target thread, a null namespace, 127.0.0.1;" \
    "$ROUNDS rounds of ${RUNTIME}s, alternating; kernel $(uname -r); $(tcp_settings)"
echo "CPU: us of CPU per I/O, client + target"
summary=()
for wl in $WORKLOADS; do
    IFS=: read -r rw bs qd <<<"$wl"
    echo
    echo "== $rw $bs QD$qd"
    ratios=()
    for r in $(seq "$ROUNDS"); do
        declare -A iops=() cpu=()
        for m in $(in_turn "$r" plain tls); do
            run "$m" "$rw" "$bs" "$qd"
            iops[$m]=$IOPS
            cpu[$m]=$CPU
        done
        ratio=$(awk -v a="${iops[tls]}" -v b="${iops[plain]}" 'BEGIN { printf "%.3f", a / b }')
        ratios+=("$ratio")
        printf 'round %d: plain %8.0f IOPS %5s us/IO   tls %8.0f IOPS %5s us/IO   tls/plain %s\n' \
            "$r" "${iops[plain]}" "${cpu[plain]}" "${iops[tls]}" "${cpu[tls]}" "$ratio"
    done
    med=$(printf '%s\n' "${ratios[@]}" | median)
    echo "median tls/plain IOPS: $med"
    summary+=("$rw $bs QD$qd: tls/plain $med")
done
echo
echo "== summary ($records records)"
printf '%s\n' "${summary[@]}"
grep -c 'TLS channel up' "$dir/t.log" | sed 's/^/TLS queues set up: /'
grep -o 'records=[A-Za-z]*' "$dir/t.log" | sort | uniq -c
