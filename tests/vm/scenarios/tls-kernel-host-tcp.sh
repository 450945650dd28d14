#!/usr/bin/env bash
# tls-kernel-host-tcp: NVMe/TCP over TLS 1.3 (PSK) between the Linux 6.12 host and OUR target,
# and our initiator against Linux's nvmet with TLS (issue #38). The Linux side's handshakes are
# tlshd's (ktls-utils) and its keys nvme-cli's (`gen-tls-key`, `check-tls-key --insert` into
# the kernel's .nvme keyring): Debian 12 has neither, so they come from
# ../shared/tools/build-tls-tools.sh (into /opt/nvme-tls, or NVMF_TLS_TOOLS), built from the
# ktls-utils, libnvme and nvme-cli sources; without them this scenario is SKIPped (full tier).
#   - `nvme discover --tls` lists our subsystem with sectype tls13, treq required;
#   - `nvme connect --tls` with a v0 key (NVMe0R01), fio write + crc32c verify; then with a v1
#     key next to it (the host prefers NVMe1R01), fio 128k verify; our target logs the
#     identity and records=Kernel for every queue;
#   - refused: plain NVMe/TCP on the `tls: required` listener, and a wrong PSK under the same
#     identity (a key of random bytes given by serial);
#   - our initiator (nvmf-bench --tls-psk, v1 identity) against nvmet with addr_tsas tls1.3:
#     a crc32c-verified random write and read-back.
# vm-needs: build
# vm-kernel: 6.12
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"

PFX=${NVMF_TLS_TOOLS:-/opt/nvme-tls}
NVME=$PFX/sbin/nvme
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:4d6c1e2a-9b3f-4a5e-8c7d-2e1f0a9b8c7d
HOSTID=4d6c1e2a-9b3f-4a5e-8c7d-2e1f0a9b8c7d
SUB=nqn.2026-11.io.nvmf-rs:tls-host
DISC=nqn.2014-08.org.nvmexpress.discovery
# Our initiator's host NQN against nvmet.
BHOST=nqn.2014-08.org.nvmexpress:uuid:4d6c1e2a-9b3f-4a5e-8c7d-2e1f0a9b8c7e
SECRET=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
TLSHD_PID=

ctrl_tls_key() { # NQN -> the sysfs tls_key of its controller
  local c
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] && { cat "$c/tls_key" 2>/dev/null; return 0; }
  done
  return 1
}

tls_connect() { # LABEL EXPECT(ok|refused) [nvme connect args]
  local label=$1 expect=$2 rc t0=$SECONDS end
  shift 2
  timeout 120 "$NVME" connect -t tcp -a 127.0.0.1 -s "$PORT" -n "$SUB" --hostnqn="$HOSTNQN" \
    --hostid="$HOSTID" --ctrl-loss-tmo=5 "$@" >"$WORK/connect.out" 2>&1
  rc=$?
  echo "$label: nvme connect -> rc $rc in $((SECONDS - t0)) s: $(tr '\n' ' ' <"$WORK/connect.out" | cut -c1-160)" | tee -a "$OUT/report.txt" >>"$STEPS"
  if [ "$expect" = ok ]; then
    [ $rc = 0 ] || { REASON="$label: connect failed: $(head -c 200 "$WORK/connect.out")"; return 1; }
    CONNECTED+=("$SUB")
    end=$((SECONDS + 15))
    until DEV=$(nvme_dev_for "$SUB"); do
      [ $SECONDS -ge $end ] && { REASON="$label: no block device for $SUB"; return 1; }
      sleep 0.5
    done
    udevadm settle 2>/dev/null
  else
    if [ $rc = 0 ]; then
      nvme disconnect -n "$SUB" >>"$STEPS" 2>&1
      REASON="$label: the connect succeeded, it must be refused"; return 1
    fi
    [ $rc != 124 ] || { REASON="$label: nvme connect hung"; return 1; }
  fi
}

tls_host_case() {
  local label=$SCENARIO dev key n0 n1 kern up ser bad ring
  teardown
  [ -x "$NVME" ] && [ -x "$PFX/sbin/tlshd" ] || {
    skip "$label" "no tlshd and TLS-capable nvme-cli in $PFX (build them: ../shared/tools/build-tls-tools.sh, README 'TLS')"; return; }
  command -v keyctl >/dev/null || { skip "$label" "no keyctl (keyutils)"; return; }
  modprobe -a tls nvme-keyring nvme-fabrics nvme-tcp nvmet nvmet-tcp 2>>"$STEPS" || { fail "$label" "modprobe failed"; return; }
  mkdir -p /etc/tlshd && printf '[debug]\nloglevel=1\n\n[authenticate]\nkeyrings=.nvme\n' >/etc/tlshd/config
  keyctl session tlshd-session "$PFX/sbin/tlshd" -s -c /etc/tlshd/config >>"$OUT/tlshd.log" 2>&1 &
  TLSHD_PID=$!
  sleep 2
  kill -0 "$TLSHD_PID" 2>/dev/null || { fail "$label" "tlshd did not start: $(tail -n 2 "$OUT/tlshd.log")"; return; }
  key=$("$NVME" gen-tls-key --hmac=1 --secret="$SECRET" 2>>"$STEPS") || { fail "$label" "nvme gen-tls-key failed"; return; }
  for n in "$SUB" "$DISC"; do
    "$NVME" check-tls-key --keydata="$key" --hostnqn="$HOSTNQN" --subsysnqn="$n" --insert >>"$STEPS" 2>&1 ||
      { fail "$label" "nvme check-tls-key --insert ($n) failed"; return; }
  done
  dev=$(vm_ramdisk 64) || { fail "$label" "vm_ramdisk failed"; return; }
  EXTRA_SUBSYSTEMS="  - nqn: $SUB
    hosts: [ { nqn: \"$HOSTNQN\", tls_psk: \"$key\" } ]
    namespaces: [ { nsid: 1, path: $WORK/tls.img, size: 32MiB } ]" \
    LISTENER_EXTRA="    tls: required" start_our_target tcp 127.0.0.1 "$dev" || { fail "$label" "$REASON"; return; }

  # Discovery over TLS: the PSK the host has for the discovery NQN.
  timeout 120 "$NVME" discover -t tcp -a 127.0.0.1 -s "$PORT" --hostnqn="$HOSTNQN" --hostid="$HOSTID" --tls \
    >"$OUT/discovery.txt" 2>&1 || { fail "$label" "nvme discover --tls failed: $(tail -n 2 "$OUT/discovery.txt" | tr '\n' ' ')"; return; }
  grep -q "subnqn: *$SUB" "$OUT/discovery.txt" || { fail "$label" "the discovery log does not list $SUB"; return; }
  grep -qi 'sectype: *tls13' "$OUT/discovery.txt" || { fail "$label" "no 'sectype: tls13' in the discovery log"; return; }
  grep -qi 'treq: *required' "$OUT/discovery.txt" || { fail "$label" "no 'treq: required' in the discovery log"; return; }
  echo "discovery over TLS: $(grep -iE 'sectype|treq' "$OUT/discovery.txt" | sort -u | tr -s ' \n' ' ')" | tee -a "$OUT/report.txt" >>"$STEPS"

  # v0 key: the host offers NVMe0R01.
  tls_connect "tls v0" ok --tls || { fail "$label" "$REASON"; return; }
  fio_verify "$DEV" 4k 8M || { fail "$label" "$REASON"; return; }
  host_disconnect "$SUB" || { fail "$label" "$REASON"; return; }
  grep -q "TLS channel up.*NVMe0R01 $HOSTNQN $SUB" "$OUT/target.log" || { fail "$label" "the target did not log the v0 identity"; return; }
  # A v1 key next to it: the host prefers NVMe1R01.
  "$NVME" check-tls-key --keydata="$key" --hostnqn="$HOSTNQN" --subsysnqn="$SUB" --identity=1 --insert >>"$STEPS" 2>&1 ||
    { fail "$label" "inserting the v1 key failed"; return; }
  tls_connect "tls v1" ok --tls || { fail "$label" "$REASON"; return; }
  fio_verify "$DEV" 128k 8M || { fail "$label" "$REASON"; return; }
  host_disconnect "$SUB" || { fail "$label" "$REASON"; return; }
  grep -q "TLS channel up.*NVMe1R01 $HOSTNQN $SUB " "$OUT/target.log" || { fail "$label" "the target did not log the v1 identity"; return; }
  up=$(grep -c 'TLS channel up' "$OUT/target.log")
  kern=$(grep -c 'TLS channel up.*records=Kernel' "$OUT/target.log")
  echo "our target: $up TLS queues up, $kern with kernel TLS; identities: $(grep -o 'identity=NVMe[01]R0[12]' "$OUT/target.log" | sort | uniq -c | tr -s ' \n' ' ')" | tee -a "$OUT/report.txt" >>"$STEPS"
  [ "$kern" = "$up" ] || { fail "$label" "$kern of $up queues used kernel TLS"; return; }

  # Refused: plain NVMe/TCP, and a wrong PSK under the v0 identity (given by serial).
  n0=$(grep -c 'TLS handshake failed' "$OUT/target.log")
  tls_connect "plain" refused || { fail "$label" "$REASON"; return; }
  grep -q 'not a TLS record' "$OUT/target.log" || { fail "$label" "the plain connection was not refused at its first bytes"; return; }
  ring=$(keyctl newring nvme-wrong @u)
  bad=$(head -c 32 /dev/urandom | keyctl padd psk "NVMe0R01 $HOSTNQN $SUB" "$ring" 2>>"$STEPS") &&
    keyctl setperm "$bad" 0x3f030000 || { fail "$label" "cannot make the wrong key"; return; }
  tls_connect "wrong psk" refused --tls --tls-key="$bad" || { fail "$label" "$REASON"; return; }
  sleep 1
  n1=$(grep -c 'TLS handshake failed' "$OUT/target.log")
  [ $((n1 - n0)) -ge 2 ] || { fail "$label" "the target logged $((n1 - n0)) failed handshakes for 2 refusals"; return; }
  grep 'TLS handshake failed' "$OUT/target.log" | tail -n 2 | cut -c1-260 >>"$OUT/report.txt"
  stop_our_target || { fail "$label" "$REASON"; return; }
  check_target_log || { fail "$label" "$REASON"; return; }
  grep -qF "$(echo "$key" | cut -d: -f3)" "$OUT/target.log" && { fail "$label" "the key appears in the target log"; return; }
  pass "$label"
}

# Our initiator against nvmet with TLS (tlshd serves the handshake with the key in .nvme).
initiator_vs_nvmet_tls() {
  local label=$SCENARIO-initiator b key dev S=/sys/kernel/config/nvmet/subsystems/$KERNEL_NQN P=/sys/kernel/config/nvmet/ports/7
  [ -n "$TLSHD_PID" ] || return 0
  b=$(bench_bin) || { skip "$label" "$REASON"; return; }
  key=$("$NVME" gen-tls-key --hmac=1 2>>"$STEPS") || { fail "$label" "nvme gen-tls-key failed"; return; }
  "$NVME" check-tls-key --keydata="$key" --hostnqn="$BHOST" --subsysnqn="$KERNEL_NQN" --identity=1 --insert >>"$STEPS" 2>&1 ||
    { fail "$label" "inserting the key for nvmet failed"; return; }
  dev=$(vm_ramdisk 64) || { fail "$label" "vm_ramdisk failed"; return; }
  {
    mkdir "$S" && echo 0 >"$S/attr_allow_any_host" && mkdir "$S/namespaces/1" &&
      echo -n "$dev" >"$S/namespaces/1/device_path" && echo 1 >"$S/namespaces/1/enable" &&
      mkdir "/sys/kernel/config/nvmet/hosts/$BHOST" && ln -s "/sys/kernel/config/nvmet/hosts/$BHOST" "$S/allowed_hosts/$BHOST" &&
      mkdir "$P" && echo tcp >"$P/addr_trtype" && echo ipv4 >"$P/addr_adrfam" && echo 127.0.0.1 >"$P/addr_traddr" &&
      echo "$((PORT + 1))" >"$P/addr_trsvcid" && echo tls1.3 >"$P/addr_tsas" && echo required >"$P/addr_treq" &&
      ln -s "$S" "$P/subsystems/$KERNEL_NQN"
  } 2>>"$STEPS" || { fail "$label" "nvmet TLS port set-up failed"; return; }
  if step "nvmf-bench --tls-psk against nvmet (tsas tls1.3) randrw 4k verify" timeout 300 "$b" --transport tcp \
      --traddr 127.0.0.1 --trsvcid "$((PORT + 1))" --subnqn "$KERNEL_NQN" --hostnqn "$BHOST" --tls-psk "$key" \
      --rw=randrw --bs=4k --iodepth=8 --numjobs=2 --offset_increment=8m --size=8M --verify=crc32c; then
    cp "$WORK/step.out" "$OUT/bench-nvmet-tls.txt"
    echo "our initiator vs nvmet over TLS: $(grep -E 'IOPS' "$WORK/step.out" | tr -s ' \n' ' ' | cut -c1-200)" | tee -a "$OUT/report.txt" >>"$STEPS"
    grep -q "Using psk identity\|Handshake with" "$OUT/tlshd.log" || true
    pass "$label"
  else
    cp "$WORK/step.out" "$OUT/bench-nvmet-tls.txt"
    fail "$label" "$REASON"
  fi
}

uname -r >>"$STEPS"
tls_host_case
initiator_vs_nvmet_tls
[ -n "$TLSHD_PID" ] && kill "$TLSHD_PID" 2>/dev/null
cleanup
