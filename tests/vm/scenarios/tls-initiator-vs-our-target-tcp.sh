#!/usr/bin/env bash
# tls-initiator-vs-our-target-tcp: NVMe/TCP over TLS 1.3 (PSK) with kernel TLS on both ends
# (issue #38): our target with a `tls: required` listener, our initiator (nvmf-bench) with the
# host's key. Both hand their sessions to the kernel after the handshake: the target logs
# `records=Kernel` for every queue, and /proc/net/tls_stat counts two software TX and RX
# sessions per queue (host and target). A crc32c-verified random write and read, with the v1
# and the v0 identity (CI: v1 only); then refused: a wrong key, and plain NVMe/TCP. Linux 6.12 (its tls
# module; the 6.1 kernel has one too, this rides the 6.12 boot of the auth scenarios).
# vm-needs: build
# vm-kernel: 6.12
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"

HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:0b9d2c4e-7a1f-4c3b-9e8d-1f2a3b4c5d6e
SUB=nqn.2026-11.io.nvmf-rs:tls

# psk_text SEED -> an NVMeTLSkey-1:01 interchange key (32 bytes derived from SEED, CRC-32 LE).
psk_text() {
  python3 -c 'import base64,hashlib,sys,zlib
k=hashlib.sha256(sys.argv[1].encode()).digest()
print("NVMeTLSkey-1:01:"+base64.b64encode(k+zlib.crc32(k).to_bytes(4,"little")).decode()+":")' "$1"
}

tls_stat() { # FIELD -> value in /proc/net/tls_stat
  awk -v f="$1" '$1 == f { print $2 }' /proc/net/tls_stat
}

tls_bench() { # LABEL EXPECT(ok|fail) [nvmf-bench args...]
  local label=$1 expect=$2 b rc
  shift 2
  b=$(bench_bin) || return 1
  timeout 300 "$b" --transport tcp --traddr 127.0.0.1 --trsvcid "$PORT" --subnqn "$SUB" \
    --hostnqn "$HOSTNQN" --rw=randrw --bs=4k --iodepth=8 --numjobs=2 --offset_increment=8m \
    --size=8M --verify=crc32c "$@" >"$WORK/bench.out" 2>&1
  rc=$?
  cp "$WORK/bench.out" "$OUT/bench-$label.txt"
  echo "$label: nvmf-bench rc $rc: $(grep -E 'IOPS|error|verify' "$WORK/bench.out" | head -n 3 | tr '\n' ' ' | cut -c1-240)" | tee -a "$OUT/report.txt" >>"$STEPS"
  if [ "$expect" = ok ]; then
    [ $rc = 0 ] || { REASON="$label: nvmf-bench failed (rc $rc): $(tail -n 3 "$WORK/bench.out" | tr '\n' ' ' | cut -c1-300)"; return 1; }
  else
    [ $rc != 0 ] || { REASON="$label: nvmf-bench succeeded, it must be refused"; return 1; }
  fi
}

tls_case() {
  local label=$SCENARIO dev dev2 key wrong before after up kern
  teardown
  bench_bin >/dev/null || { skip "$label" "$REASON"; return; }
  modprobe tls 2>>"$STEPS" || { fail "$label" "no tls module in $(uname -r)"; return; }
  [ -r /proc/net/tls_stat ] || { fail "$label" "no /proc/net/tls_stat after modprobe tls"; return; }
  key=$(psk_text host) && wrong=$(psk_text other) || { fail "$label" "cannot make keys"; return; }
  ( umask 077; echo "$key" >"$WORK/host.psk" )
  dev=$(vm_ramdisk 64) || { fail "$label" "vm_ramdisk failed"; return; }
  EXTRA_SUBSYSTEMS="  - nqn: $SUB
    hosts: [ { nqn: \"$HOSTNQN\", tls_psk_file: $WORK/host.psk } ]
    namespaces: [ { nsid: 1, path: $WORK/tls.img, size: 32MiB } ]" \
    LISTENER_EXTRA="    tls: required" start_our_target tcp 127.0.0.1 "$dev" || { fail "$label" "$REASON"; return; }
  before=$(tls_stat TlsTxSw)
  # NVMF_VM_TLS_IDENTITIES: the identity forms offered (CI: v1; default both).
  local ids=${NVMF_VM_TLS_IDENTITIES:-v1 v0} id runs=0
  for id in $ids; do
    case $id in
      v1) tls_bench v1 ok --tls-psk-file "$WORK/host.psk" || { fail "$label" "$REASON"; return; } ;;
      v0) tls_bench v0 ok --tls-psk "$key" --tls-identity 0 || { fail "$label" "$REASON"; return; } ;;
    esac
    runs=$((runs + 1))
    grep -q "identity=NVMe${id#v}R01" "$OUT/target.log" || { fail "$label" "no $id identity in the target log"; return; }
  done
  after=$(tls_stat TlsTxSw)
  up=$(grep -c 'TLS channel up' "$OUT/target.log")
  kern=$(grep -c 'TLS channel up.*records=Kernel' "$OUT/target.log")
  echo "TLS queues: $up up, $kern with kernel TLS on the target; tls_stat TlsTxSw $before -> $after (host and target sessions)" | tee -a "$OUT/report.txt" >>"$STEPS"
  # Each run: admin + 2 I/O queues, each a kernel TX session on both ends.
  [ "$up" -ge $((3 * runs)) ] && [ "$kern" = "$up" ] || { fail "$label" "$kern of $up TLS queues used kernel TLS on the target"; return; }
  [ $((after - before)) -ge $((2 * up)) ] || { fail "$label" "tls_stat counted $((after - before)) kernel TX sessions for $up queues (host + target: $((2 * up)))"; return; }
  tls_bench wrong-key fail --tls-psk "$wrong" || { fail "$label" "$REASON"; return; }
  tls_bench plain fail || { fail "$label" "$REASON"; return; }
  wait_for_line "$OUT/target.log" 'TLS handshake failed' 10 "$TARGET_PID" || { fail "$label" "the target did not log the refused handshakes"; return; }
  grep -qF "$(echo "$key" | cut -d: -f3)" "$OUT/target.log" "$OUT"/bench-*.txt && { fail "$label" "a key appears in a log"; return; }
  stop_our_target || { fail "$label" "$REASON"; return; }
  check_target_log || { fail "$label" "$REASON"; return; }
  pass "$label"
}

uname -r >>"$STEPS"
tls_case
cleanup
