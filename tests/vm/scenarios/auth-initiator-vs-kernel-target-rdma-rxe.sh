#!/usr/bin/env bash
# auth-initiator-vs-kernel-target-rdma-rxe: OUR initiator (nvmf-bench) authenticates with
# DH-HMAC-CHAP to the Linux 6.12 kernel target (nvmet, keys in configfs
# hosts/<hostnqn>/dhchap_*), over NVMe/TCP and NVMe/RDMA (rxe): bidirectional sha512/ffdhe2048
# with a verified write job; over TCP also sha256/null and sha384/ffdhe3072, and a wrong host key
# and a wrong controller key refused with the step named. The sha256/null exchange is kept as
# known-answer vectors of the kernel's controller response (kat-ctrl.txt, see nvme/tests/kat.rs),
# and one sha256/ffdhe2048 exchange by tests/examples/auth_kat.rs (a seeded host, so the DH side
# replays: kat-dh.txt).
# vm-needs: build rdma
# vm-kernel: 6.12
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"

HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:7d2e9b41-6c3f-4a58-b1e0-9f8e7d6c5b4a
KNQN=nqn.2026-11.io.nvmf-rs:kernel-auth
N=/sys/kernel/config/nvmet

gen_key() { nvme gen-dhchap-key --hmac="$1" --nqn="$HOSTNQN" 2>>"$STEPS" | grep -m1 -o 'DHHC-1:[^ ]*'; }

# nvmet_host_keys KEY CKEY HASH GROUP: the host's entry (its keys, hash and group) in configfs.
nvmet_host_keys() {
  local h=$N/hosts/$HOSTNQN
  [ -d "$h" ] || mkdir "$h" || { REASON="mkdir $h failed"; return 1; }
  echo "$1" >"$h/dhchap_key" && echo "$2" >"$h/dhchap_ctrl_key" && echo "hmac($3)" >"$h/dhchap_hash" &&
    echo "$4" >"$h/dhchap_dhgroup" || { REASON="configuring $h failed"; return 1; }
}

# bench_auth LABEL EXPECT(ok|STEP) TR ADDR KEY CKEY: a verified write job; EXPECT ok, or the step
# the refusal must name. The trace of the exchange goes to $OUT/bench-LABEL.txt.
bench_auth() {
  local label=$1 expect=$2 tr=$3 addr=$4 key=$5 ckey=$6 b rc t0=$SECONDS
  b=$(bench_bin) || return 1
  RUST_LOG=warn,nvmf_initiator::auth=trace timeout 300 "$b" --transport "$tr" --traddr "$addr" \
    --trsvcid "$PORT" --subnqn "$KNQN" --hostnqn "$HOSTNQN" --dhchap-secret "$key" \
    --dhchap-ctrl-secret "$ckey" --rw=randwrite --bs=4k --iodepth=16 --size=8M --verify=crc32c \
    >"$OUT/bench-$label.txt" 2>&1
  rc=$?
  echo "$label: nvmf-bench $tr -> exit $rc in $((SECONDS - t0)) s: $(grep -m1 -E 'authentication failed|IOPS|iops' "$OUT/bench-$label.txt" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160)" | tee -a "$OUT/report.txt" >>"$STEPS"
  if [ "$expect" = ok ]; then
    [ $rc = 0 ] || { REASON="$label: nvmf-bench failed (exit $rc): $(grep -m1 -iE 'error|failed' "$OUT/bench-$label.txt" | cut -c1-200)"; return 1; }
  else
    [ $rc != 0 ] || { REASON="$label: nvmf-bench succeeded with a wrong key"; return 1; }
    grep -q "authentication failed on queue 0 at $expect" "$OUT/bench-$label.txt" ||
      { REASON="$label: no 'authentication failed on queue 0 at $expect': $(grep -m1 -iE 'error' "$OUT/bench-$label.txt" | cut -c1-200)"; return 1; }
  fi
}

# kat_ctrl LABEL KEY CKEY: our Reply -> the kernel's Success1 pairs (by qid) from the trace.
kat_ctrl() {
  python3 - "$OUT/bench-$1.txt" "$OUT/kat-ctrl.txt" "$HOSTNQN" "$KNQN" "$2" "$3" <<'PY' >>"$STEPS" 2>&1
import re, sys
log, out, hostnqn, subnqn, key, ckey = sys.argv[1:7]
pend, n = {}, 0
with open(out, "a") as f:
    for line in open(log, errors="replace"):
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        m = re.search(r"authentication message (to|from) the controller.*?qid=(\d+).*?msg=([0-9a-f]+)", line)
        if not m:
            continue
        way, qid, msg = m.groups()
        if way == "to" and msg.startswith("0102"):
            pend[qid] = msg
        elif way == "from" and msg.startswith("0103") and qid in pend:
            f.write(f"hostnqn={hostnqn} subnqn={subnqn} key={key} ctrl_key={ckey} reply={pend.pop(qid)} success1={msg}\n")
            n += 1
print(f"kat_ctrl: {n} vector(s)")
PY
}

# kat_dh ADDR: auth_kat (seeded host) against nvmet with sha256 / ffdhe2048, bidirectional;
# its vector goes to kat-dh.txt.
kat_dh() {
  local b=${NVMF_AUTHKAT_BIN:-} h key ckey seed
  [ -x "$b" ] || { REASON="auth_kat not built: ${NVMF_AUTHKAT_NOTE:-}"; return 1; }
  h=$("$b" --addr 127.0.0.1:1 --subnqn x --key x --ctrl-key x --print-hostnqn) || { REASON="auth_kat --print-hostnqn failed"; return 1; }
  key=$(nvme gen-dhchap-key --hmac=1 --nqn="$h" 2>>"$STEPS" | grep -m1 -o 'DHHC-1:[^ ]*')
  ckey=$(nvme gen-dhchap-key --hmac=2 --nqn="$h" 2>>"$STEPS" | grep -m1 -o 'DHHC-1:[^ ]*')
  local hd=$N/hosts/$h s=$N/subsystems/$KNQN
  mkdir -p "$hd" && echo "$key" >"$hd/dhchap_key" && echo "$ckey" >"$hd/dhchap_ctrl_key" &&
    echo "hmac(sha256)" >"$hd/dhchap_hash" && echo ffdhe2048 >"$hd/dhchap_dhgroup" &&
    ln -s "$hd" "$s/allowed_hosts/$h" || { REASON="configuring nvmet for auth_kat failed"; return 1; }
  for seed in 1 2; do
    step "auth_kat seed $seed" "$b" --addr "$1:$PORT" --subnqn "$KNQN" --key "$key" --ctrl-key "$ckey" --seed "$seed" || return 1
    grep -m1 '^hostnqn=' "$WORK/step.out" >>"$OUT/kat-dh.txt"
  done
  rm -f "$s/allowed_hosts/$h"; rmdir "$hd" 2>/dev/null
  echo "auth_kat: $(grep -c '^hostnqn=' "$OUT/kat-dh.txt") sha256/ffdhe2048 vectors from nvmet" | tee -a "$OUT/report.txt" >>"$STEPS"
}

case_tr() { # TR ADDR
  local tr=$1 addr=$2 label="auth-initiator-$1" dev key ckey
  teardown
  dev=$(vm_ramdisk 16) || { fail "$label" "vm_ramdisk failed"; return; }
  modprobe -a nvmet "nvmet-$tr" || { fail "$label" "modprobe nvmet-$tr failed"; return; }
  key=$(gen_key 3) && ckey=$(gen_key 2) || { fail "$label" "nvme gen-dhchap-key failed"; return; }
  # The subsystem allows our host only (nvmet_export leaves an existing subsystem as it is).
  local s=$N/subsystems/$KNQN
  mkdir "$s" && echo 0 >"$s/attr_allow_any_host" && mkdir "$s/namespaces/1" &&
    echo -n "$dev" >"$s/namespaces/1/device_path" && echo 1 >"$s/namespaces/1/enable" ||
    { fail "$label" "creating $s failed"; return; }
  nvmet_host_keys "$key" "$ckey" sha512 ffdhe2048 || { fail "$label" "$REASON"; return; }
  ln -s "$N/hosts/$HOSTNQN" "$s/allowed_hosts/$HOSTNQN" || { fail "$label" "allowed_hosts link failed"; return; }
  nvmet_export "$KNQN" "$dev" "$tr" "$addr" "$PORT" || { fail "$label" "nvmet_export failed"; return; }
  bench_auth "$tr-sha512-ffdhe2048" ok "$tr" "$addr" "$key" "$ckey" || { fail "$label" "$REASON"; return; }
  if [ "$tr" = tcp ]; then
    nvmet_host_keys "$key" "$ckey" sha384 ffdhe3072 || { fail "$label" "$REASON"; return; }
    bench_auth "$tr-sha384-ffdhe3072" ok "$tr" "$addr" "$key" "$ckey" || { fail "$label" "$REASON"; return; }
    nvmet_host_keys "$key" "$ckey" sha256 null || { fail "$label" "$REASON"; return; }
    bench_auth "$tr-sha256-null" ok "$tr" "$addr" "$key" "$ckey" || { fail "$label" "$REASON"; return; }
    kat_ctrl "$tr-sha256-null" "$key" "$ckey"
    local wrong; wrong=$(gen_key 3)
    bench_auth "$tr-wrong-host-key" reply "$tr" "$addr" "$wrong" "$ckey" || { fail "$label" "$REASON"; return; }
    bench_auth "$tr-wrong-ctrl-key" success1 "$tr" "$addr" "$key" "$wrong" || { fail "$label" "$REASON"; return; }
    kat_dh "$addr" || { fail "$label" "$REASON"; return; }
  fi
  nvmet_clear
  rmdir "$N/hosts/$HOSTNQN" 2>/dev/null
  pass "$label"
}

uname -r >>"$STEPS"
echo "# Linux $(uname -r) target (nvmet): our DH-HMAC-CHAP Reply -> the kernel's Success1 (controller response), null DH group" >"$OUT/kat-ctrl.txt"
echo "# Linux $(uname -r) target (nvmet), sha256 / ffdhe2048: its Challenge, the seeded host's Reply, its Success1" >"$OUT/kat-dh.txt"
case_tr tcp 127.0.0.1
if need_rdma RXE_IP; then case_tr rdma "$RXE_IP"; fi
cleanup
