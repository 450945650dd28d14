#!/usr/bin/env bash
# auth-kernel-host-rdma-rxe: DH-HMAC-CHAP (issue #18) between the Linux 6.12 NVMe host and OUR
# target, over NVMe/TCP (127.0.0.1) and NVMe/RDMA (rxe). Keys from `nvme gen-dhchap-key`.
# Per transport, three subsystems (one 16 MiB file namespace each):
#   auth-uni    sha256 / null       host key in a key file (mode 0600): unidirectional
#   auth-bi     sha384 / ffdhe2048  host and controller key inline: bidirectional
#   auth-bi512  sha512 / null       bidirectional
# The host connects with the right keys (fio write+verify), to auth-bi also one way (its own
# secret only: accepted, as nvmet accepts it), then is refused, at once, with a wrong host key
# (with and without a controller key), a wrong controller key and no key; the target logs why, and never a key. Over
# TCP, the key file is rotated and the target reloaded (SIGHUP) while the host is connected: the
# host's I/O goes on, it re-authenticates with the new key (sysfs dhchap_secret), and the old key
# is refused on a new connect. Runs on the 6.12 guest kernel (its host has NVME_HOST_AUTH); rxe
# only (siw is built for 6.1).
# vm-needs: build rdma
# vm-kernel: 6.12
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"

HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:3f1c6a2e-5d4b-4c3a-9e8f-0a1b2c3d4e5f
HOSTID=3f1c6a2e-5d4b-4c3a-9e8f-0a1b2c3d4e5f
SUB_UNI=nqn.2026-11.io.nvmf-rs:auth-uni
SUB_BI=nqn.2026-11.io.nvmf-rs:auth-bi
SUB_BI512=nqn.2026-11.io.nvmf-rs:auth-bi512

gen_key() { # HMAC(1-3) -> a DHHC-1 secret
  nvme gen-dhchap-key --hmac="$1" --nqn="$HOSTNQN" 2>>"$STEPS" | grep -m1 -o 'DHHC-1:[^ ]*'
}

# auth_connect LABEL TR ADDR NQN EXPECT(ok|refused) [nvme connect args...]
auth_connect() {
  local label=$1 tr=$2 addr=$3 nqn=$4 expect=$5 t0 rc secs
  shift 5
  t0=$SECONDS
  nvme connect -t "$tr" -a "$addr" -s "$PORT" -n "$nqn" --hostnqn="$HOSTNQN" --hostid="$HOSTID" \
    --ctrl-loss-tmo=5 "$@" >"$WORK/connect.out" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
  echo "$label: nvme connect $tr $nqn -> rc $rc in ${secs}s: $(tr '\n' ' ' <"$WORK/connect.out" | cut -c1-160)" | tee -a "$OUT/report.txt" >>"$STEPS"
  if [ "$expect" = ok ]; then
    [ $rc = 0 ] || { REASON="$label: connect failed: $(head -c 200 "$WORK/connect.out")"; return 1; }
    CONNECTED+=("$nqn")
    local end=$((SECONDS + 15))
    until DEV=$(nvme_dev_for "$nqn"); do
      [ $SECONDS -ge $end ] && { REASON="$label: no block device for $nqn"; return 1; }
      sleep 0.5
    done
    udevadm settle 2>/dev/null
  else
    if [ $rc = 0 ]; then
      nvme disconnect -n "$nqn" >>"$STEPS" 2>&1
      REASON="$label: the connect succeeded, it must be refused"; return 1
    fi
    # At once: the host reads our Failure1 instead of waiting for its admin timeout.
    [ $secs -le 5 ] || { REASON="$label: refused only after ${secs}s (the host waited for a timeout)"; return 1; }
  fi
}

# kat_capture NQN KEY [CTRL_KEY]: the Challenge -> Reply pairs of NQN's transactions in the
# target's trace log (wire data), with the key the Linux host answered with, appended to
# $OUT/kat.txt: known-answer vectors for nvme/tests/kat.rs (the kernel's response, transformed
# key included, to our challenge).
kat_capture() {
  python3 - "$OUT/target.log" "$OUT/kat.txt" "$HOSTNQN" "$@" <<'PY' >>"$STEPS" 2>&1
import re, sys
log, out, hostnqn, subnqn, key = sys.argv[1:6]
ctrl_key = sys.argv[6] if len(sys.argv) > 6 else "-"
pend, vecs = {}, []
for line in open(log, errors="replace"):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    m = re.search(r"authentication message (to|from) the host.*?qid=(\d+).*?subsys=(\S+).*?msg=([0-9a-f]+)", line)
    if not m or m.group(3) != subnqn:
        continue
    way, qid, msg = m.group(1), m.group(2), m.group(4)
    if way == "to" and msg.startswith("0101"):
        pend[qid] = msg
    elif way == "from" and msg.startswith("0102") and qid in pend:
        vecs.append(pend.pop(qid) + " " + msg)
seen = set(open(out).read().split()) if __import__("os").path.exists(out) else set()
with open(out, "a") as f:
    for v in vecs:
        c, r = v.split()
        if c in seen:
            continue
        f.write(f"hostnqn={hostnqn} subnqn={subnqn} key={key} ctrl_key={ctrl_key} challenge={c} reply={r}\n")
print(f"kat_capture {subnqn}: {len(vecs)} vector(s)")
PY
}

auth_case() { # TR ADDR
  local tr=$1 addr=$2 label="auth-$1" f ctrl
  teardown
  : >"$OUT/report.txt.$tr"
  KEY_UNI=$(gen_key 1) && KEY_BI=$(gen_key 2) && CKEY_BI=$(gen_key 3) && KEY_BI512=$(gen_key 3) &&
    CKEY_BI512=$(gen_key 1) && WRONG=$(gen_key 1) || { fail "$label" "nvme gen-dhchap-key failed"; return; }
  umask 077
  echo "$KEY_UNI" >"$WORK/uni.key"
  umask 022
  for f in uni bi bi512; do truncate -s 16M "$WORK/$f.img"; done
  EXTRA_SUBSYSTEMS="  - nqn: $SUB_UNI
    hosts: [ { nqn: \"$HOSTNQN\", dhchap_key_file: $WORK/uni.key } ]
    dhchap_hashes: [ sha256 ]
    dhchap_dhgroups: [ null ]
    namespaces: [ { nsid: 1, path: $WORK/uni.img } ]
  - nqn: $SUB_BI
    hosts: [ { nqn: \"$HOSTNQN\", dhchap_key: \"$KEY_BI\", dhchap_ctrl_key: \"$CKEY_BI\" } ]
    dhchap_hashes: [ sha384 ]
    dhchap_dhgroups: [ ffdhe2048 ]
    namespaces: [ { nsid: 1, path: $WORK/bi.img } ]
  - nqn: $SUB_BI512
    hosts: [ { nqn: \"$HOSTNQN\", dhchap_key: \"$KEY_BI512\", dhchap_ctrl_key: \"$CKEY_BI512\" } ]
    dhchap_hashes: [ sha512 ]
    dhchap_dhgroups: [ null ]
    namespaces: [ { nsid: 1, path: $WORK/bi512.img } ]" \
    RUST_LOG="${RUST_LOG:-info},nvmf_target::core::auth=trace" start_our_target "$tr" "$addr" "$(vm_ramdisk 16)"; local rc=$?
  [ $rc = 0 ] || { fail "$label" "$REASON"; return; }
  modprobe -a nvme-fabrics "nvme-$tr" >>"$STEPS" 2>&1
  # The Linux host waits 60 s x retries for a lost admin command: lower it so that a target
  # that tears down before its Failure1 arrives shows up as a slow refusal, not a hang.
  echo 10 >/sys/module/nvme_core/parameters/admin_timeout 2>/dev/null

  auth_connect "$label uni" "$tr" "$addr" "$SUB_UNI" ok --dhchap-secret="$KEY_UNI" || { fail "$label" "$REASON"; return; }
  fio_verify "$DEV" 4k 8M || { fail "$label" "$REASON"; return; }
  kat_capture "$SUB_UNI" "$KEY_UNI"
  if [ "$tr" = tcp ]; then
    # Rotate the key file and reload: the connected host keeps working, re-authenticates with
    # the new key, and the old key no longer connects.
    local newkey; newkey=$(gen_key 1)
    ( umask 077; echo "$newkey" >"$WORK/uni.key.new" ) && mv "$WORK/uni.key.new" "$WORK/uni.key"
    kill -HUP "$TARGET_PID"
    wait_for_line "$OUT/target.log" 'reload applied|reload: no changes' 10 "$TARGET_PID" || { fail "$label" "reload: $REASON"; return; }
    grep -q 'hosts_changed.*auth-uni' "$OUT/target.log" || { fail "$label" "the reload did not see the new key"; return; }
    dd if="$DEV" of=/dev/null bs=4k count=256 iflag=direct status=none || { fail "$label" "I/O failed after the key rotation"; return; }
    local n0; n0=$(grep -c 'host re-authenticated' "$OUT/target.log")
    ctrl=$(ls -d /sys/class/nvme/nvme* 2>/dev/null | while read -r c; do [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$SUB_UNI" ] && basename "$c"; done | head -n 1)
    echo "$newkey" >"/sys/class/nvme/$ctrl/dhchap_secret" || { fail "$label" "writing $ctrl/dhchap_secret failed"; return; }
    sleep 3
    local n1; n1=$(grep -c 'host re-authenticated' "$OUT/target.log")
    echo "re-authentication after rotation: $((n1 - n0)) queue(s) re-authenticated" | tee -a "$OUT/report.txt" >>"$STEPS"
    [ $((n1 - n0)) -ge 1 ] || { fail "$label" "no queue re-authenticated after the host's new key"; return; }
    dd if="$DEV" of=/dev/null bs=4k count=256 iflag=direct status=none || { fail "$label" "I/O failed after re-authentication"; return; }
    host_disconnect "$SUB_UNI" || { fail "$label" "$REASON"; return; }
    auth_connect "$label uni old key" "$tr" "$addr" "$SUB_UNI" refused --dhchap-secret="$KEY_UNI" || { fail "$label" "$REASON"; return; }
    KEY_UNI=$newkey
  else
    host_disconnect "$SUB_UNI" || { fail "$label" "$REASON"; return; }
  fi

  auth_connect "$label bi" "$tr" "$addr" "$SUB_BI" ok --dhchap-secret="$KEY_BI" --dhchap-ctrl-secret="$CKEY_BI" || { fail "$label" "$REASON"; return; }
  fio_verify "$DEV" 4k 8M || { fail "$label" "$REASON"; return; }
  host_disconnect "$SUB_BI" || { fail "$label" "$REASON"; return; }
  # One way: the host entry has a controller key, the host gives only its own secret (no
  # challenge for the controller): accepted, as nvmet 6.12 accepts it (issue #38, item 6).
  # NVMF_VM_AUTH_ONEWAY_TRANSPORTS: where (CI: tcp; default both).
  local oneway=0
  if [[ " ${NVMF_VM_AUTH_ONEWAY_TRANSPORTS:-tcp rdma} " == *" $tr "* ]]; then
    oneway=1
    local oneway0; oneway0=$(grep -c 'host authenticated.*bidirectional=false' "$OUT/target.log")
    auth_connect "$label bi one-way" "$tr" "$addr" "$SUB_BI" ok --dhchap-secret="$KEY_BI" || { fail "$label" "$REASON"; return; }
    fio_verify "$DEV" 4k 4M || { fail "$label" "$REASON"; return; }
    host_disconnect "$SUB_BI" || { fail "$label" "$REASON"; return; }
    local oneway1; oneway1=$(grep -c 'host authenticated.*bidirectional=false' "$OUT/target.log")
    echo "one-way authentication to an entry with a controller key: $((oneway1 - oneway0)) queue(s)" | tee -a "$OUT/report.txt" >>"$STEPS"
    [ $((oneway1 - oneway0)) -ge 2 ] || { fail "$label" "the target did not log one-way authentication of the admin and I/O queues"; return; }
  fi
  auth_connect "$label bi512" "$tr" "$addr" "$SUB_BI512" ok --dhchap-secret="$KEY_BI512" --dhchap-ctrl-secret="$CKEY_BI512" || { fail "$label" "$REASON"; return; }
  fio_verify "$DEV" 128k 8M || { fail "$label" "$REASON"; return; }
  kat_capture "$SUB_BI512" "$KEY_BI512" "$CKEY_BI512"
  host_disconnect "$SUB_BI512" || { fail "$label" "$REASON"; return; }

  local before; before=$(grep -c 'authentication failed' "$OUT/target.log")
  auth_connect "$label wrong host key" "$tr" "$addr" "$SUB_BI" refused --dhchap-secret="$WRONG" --dhchap-ctrl-secret="$CKEY_BI" || { fail "$label" "$REASON"; return; }
  if [ $oneway = 1 ]; then
    auth_connect "$label wrong host key one-way" "$tr" "$addr" "$SUB_BI" refused --dhchap-secret="$WRONG" || { fail "$label" "$REASON"; return; }
  fi
  auth_connect "$label wrong controller key" "$tr" "$addr" "$SUB_BI" refused --dhchap-secret="$KEY_BI" --dhchap-ctrl-secret="$WRONG" || { fail "$label" "$REASON"; return; }
  auth_connect "$label no key" "$tr" "$addr" "$SUB_UNI" refused || { fail "$label" "$REASON"; return; }
  sleep 1
  local after; after=$(grep -c 'authentication failed' "$OUT/target.log")
  [ $((after - before)) -ge $((2 + oneway)) ] || { fail "$label" "the target logged $((after - before)) authentication failures for the $((2 + oneway)) wrong keys"; return; }
  grep -q 'closed the queue without authenticating' "$OUT/target.log" || { fail "$label" "the target did not log the keyless host"; return; }
  grep -E 'authentication failed|without authenticating' "$OUT/target.log" | head -n 4 | cut -c1-300 >>"$OUT/report.txt"
  # No secret in the log (the base64 part of every key).
  for k in "$KEY_UNI" "$KEY_BI" "$CKEY_BI" "$KEY_BI512" "$CKEY_BI512" "$WRONG"; do
    f=$(echo "$k" | cut -d: -f3)
    grep -qF "$f" "$OUT/target.log" && { fail "$label" "a key appears in the target log"; return; }
  done
  stop_our_target || { fail "$label" "$REASON"; return; }
  check_target_log || { fail "$label" "$REASON"; return; }
  pass "$label"
}

uname -r >>"$STEPS"
echo "# Linux $(uname -r) host: DH-HMAC-CHAP Challenge (nvmf-target) -> Reply (the kernel), null DH group" >"$OUT/kat.txt"
auth_case tcp 127.0.0.1
if need_rdma RXE_IP; then auth_case rdma "$RXE_IP"; fi
cleanup
