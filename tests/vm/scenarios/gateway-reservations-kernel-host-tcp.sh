#!/usr/bin/env bash
# gateway-reservations-kernel-host-tcp: reservations kept by a gateway group (issue #39), with
# nvme-cli and the Linux host. A single-node Ceph cluster in the guest; two of OUR targets,
# gateway A on tcp 127.0.0.1:4420 (home of ANA group 1) and B on 127.0.0.2:4420, export the
# image rbd/resv1 as one subsystem (`gateway:`; the group's configuration and reservation
# state live in RADOS). The host's native multipath is off (nvme_core multipath=N) and two
# host NQNs are each connected through both gateways: four controllers, four disks. Host 1
# registers and acquires Write Exclusive through A and host 2's write there gets Reservation
# Conflict. A is killed (SIGKILL): through B, host 2 is still refused, host 1 writes, and
# `resv-report --eds` names host 1 the holder. Host 2 preempts through B and host 1's next
# write is refused. Every gateway is then restarted (B stopped, A and B started again, A
# takes its group back): the report through A is the one B gave before. Last, `rbd resize`:
# all four disks (both hosts, both gateways) show the new size within 10 s, no reconnect.
# vm-needs: build
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../gateway-lib.sh"

GW_NQN=nqn.2026-11.io.nvmf-rs:gwresv GW_GROUP=vmr GW_IMAGE=resv1 GW_SERIAL=NVMFRSGWRV01
H1=nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555501
H2=nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555502


dev_of() { # HOSTNQN ADDR -> /dev/nvmeXnY of that host's controller through ADDR
  local c n
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$GW_NQN" ] || continue
    [ "$(cat "$c/hostnqn" 2>/dev/null)" = "$1" ] || continue
    grep -q "traddr=$2,trsvcid=4420" "$c/address" || continue
    for n in "$c"/nvme*n1; do [ -e "$n" ] && { echo "/dev/$(basename "$n")"; return 0; }; done
  done
  return 1
}

# write_as DEV: one 4 KiB write with nvme-cli (its status in $WORK/step.out).
write_as() {
  step "nvme write $1" nvme write "$1" --start-block=8 --block-count=0 --data-size=4096 --data="$WORK/block"
}
refused() { # DEV WHO
  if write_as "$1"; then REASON="$2's write through $1 was not refused"; return 1; fi
  grep -qi "reservation conflict" "$WORK/step.out" ||
    { REASON="$2's refused write did not say Reservation Conflict: $(tr '\n' ' ' <"$WORK/step.out" | cut -c1-160)"; return 1; }
  echo "$2: write through $1 refused with Reservation Conflict" | tee -a "$OUT/report.txt" >>"$STEPS"
}
report() { # DEV -> the --eds report as one line of JSON (also into the report)
  nvme resv-report "$1" --eds -o json 2>>"$STEPS" | tr -d ' \n'
}
# until_serving DEV: until the gateway behind DEV answers a report (it holds the group).
until_serving() {
  local end=$((SECONDS + 30))
  until nvme resv-report "$1" --eds -o json >/dev/null 2>&1; do
    [ $SECONDS -ge $end ] && { REASON="no report through $1 within 30 s"; return 1; }
    sleep 0.5
  done
}

resv_case() {
  local label=$SCENARIO end d1a d1b d2a d2b rep before after
  teardown
  [ -n "$NVMF_TARGET_BIN" ] && [ -x "$NVMF_TARGET_BIN" ] || { fail "$label" "nvmf-target not available"; return; }
  gw_cluster || { fail "$label" "$REASON"; return; }
  head -c 4096 /dev/urandom >"$WORK/block"
  gw_up || { fail "$label" "$REASON"; return; }

  # The host's multipath off: each controller its own disk.
  # (nvme_rdma too: an earlier scenario in the same boot may have loaded it, and it holds
  # nvme_core.)
  modprobe -r nvme_rdma nvme_tcp nvme_fabrics nvme_core >>"$STEPS" 2>&1
  modprobe nvme_core multipath=N && modprobe -a nvme-fabrics nvme-tcp ||
    { fail "$label" "cannot load nvme_core with multipath=N"; return; }
  [ "$(cat /sys/module/nvme_core/parameters/multipath)" = N ] ||
    { fail "$label" "nvme_core multipath is not off (still loaded: $(lsmod | awk '/^nvme/ {printf "%s(%s) ", $1, $3}'))"; return; }
  # Each host from its own source address too (nvme-cli takes a second controller to the same
  # address and subsystem for the first one again, whatever the host NQN).
  local src
  for h in "$H1" "$H2"; do
    src=127.0.0.1${h: -1}
    for a in 127.0.0.1 127.0.0.2; do
      step "nvme connect -a $a as host ${h: -1}" nvme connect -t tcp -a "$a" -s 4420 -n "$GW_NQN" --hostnqn="$h" \
        --hostid="${h##*uuid:}" --host-traddr="$src" --ctrl-loss-tmo=120 --reconnect-delay=2 || { fail "$label" "$REASON"; return; }
    done
  done
  CONNECTED+=("$GW_NQN")
  udevadm settle 2>/dev/null
  end=$((SECONDS + 15))
  until d1a=$(dev_of "$H1" 127.0.0.1) && d1b=$(dev_of "$H1" 127.0.0.2) && d2a=$(dev_of "$H2" 127.0.0.1) && d2b=$(dev_of "$H2" 127.0.0.2); do
    [ $SECONDS -ge $end ] && { fail "$label" "not four disks (host 1: ${d1a:-} ${d1b:-}, host 2: ${d2a:-} ${d2b:-})"; return; }
    sleep 0.5
  done
  echo "disks: host 1 via A $d1a, via B $d1b; host 2 via A $d2a, via B $d2b" | tee -a "$OUT/report.txt" >>"$STEPS"
  until_serving "$d1a" || { fail "$label" "A: $REASON"; return; }

  step "host 1 registers through A" nvme resv-register "$d1a" --nrkey=0x1111 --rrega=0 || { fail "$label" "$REASON"; return; }
  step "host 2 registers through A" nvme resv-register "$d2a" --nrkey=0x2222 --rrega=0 || { fail "$label" "$REASON"; return; }
  step "host 1 acquires Write Exclusive through A" nvme resv-acquire "$d1a" --crkey=0x1111 --rtype=1 --racqa=0 ||
    { fail "$label" "$REASON"; return; }
  write_as "$d1a" || { fail "$label" "host 1 (the holder) cannot write through A: $REASON"; return; }
  refused "$d2a" "host 2" || { fail "$label" "through A: $REASON"; return; }

  # A dies: B takes the group and its reservation over.
  kill -KILL "$A_PID"; wait "$A_PID" 2>/dev/null; A_PID=
  log "gateway A killed (SIGKILL)"
  until_serving "$d1b" || { fail "$label" "B after A died: $REASON"; return; }
  refused "$d2b" "host 2" || { fail "$label" "through B after A died: $REASON"; return; }
  write_as "$d1b" || { fail "$label" "host 1 (the holder) cannot write through B: $REASON"; return; }
  rep=$(report "$d1b")
  echo "report through B after A died: $rep" | tee -a "$OUT/report.txt" >>"$STEPS"
  grep -q '"rtype":1' <<<"$rep" && grep -q '"regctl":2' <<<"$rep" &&
    grep -qE '"rcsts":1,"rkey":4369' <<<"$rep" ||
    { fail "$label" "B's report does not name host 1 (key 0x1111) the Write Exclusive holder: $rep"; return; }
  step "host 2 preempts host 1 through B" nvme resv-acquire "$d2b" --crkey=0x2222 --prkey=0x1111 --rtype=1 --racqa=1 ||
    { fail "$label" "$REASON"; return; }
  refused "$d1b" "host 1" || { fail "$label" "after the preempt: $REASON"; return; }
  before=$(report "$d2b")
  echo "report through B after the preempt: $before" | tee -a "$OUT/report.txt" >>"$STEPS"

  # Every gateway restarted: B stopped, A and B started again; A takes its group back.
  kill -TERM "$B_PID"; wait "$B_PID"; B_PID=
  gw_start gw-a 127.0.0.1 "$OUT/gw-a2.log" || { fail "$label" "restart A: $REASON"; return; }
  A_PID=$GW_PID
  gw_start gw-b 127.0.0.2 "$OUT/gw-b2.log" || { fail "$label" "restart B: $REASON"; return; }
  B_PID=$GW_PID
  until_serving "$d2a" || { fail "$label" "A after the restarts: $REASON"; return; }
  after=$(report "$d2a")
  echo "report through A after every gateway restarted: $after" | tee -a "$OUT/report.txt" >>"$STEPS"
  [ "$after" = "$before" ] || { fail "$label" "the report changed across the restarts: before $before, after $after"; return; }
  refused "$d1a" "host 1" || { fail "$label" "after the restarts: $REASON"; return; }
  write_as "$d2a" || { fail "$label" "host 2 (the holder now) cannot write through A: $REASON"; return; }

  # `rbd resize`: both hosts see the new size through both gateways, without reconnecting.
  local d sz want=$((48 * 1024 * 1024 / 512)) t0=$SECONDS
  step "rbd resize rbd/$GW_IMAGE to 48 MiB" rbd -c "$CONF" resize --size 48 "rbd/$GW_IMAGE" || { fail "$label" "$REASON"; return; }
  for d in "$d1a" "$d1b" "$d2a" "$d2b"; do
    until sz=$(cat "/sys/block/${d#/dev/}/size") && [ "$sz" = "$want" ]; do
      [ $((SECONDS - t0)) -ge 10 ] && { fail "$label" "$d still has $sz sectors 10 s after the resize (want $want)"; return; }
      sleep 0.2
    done
  done
  echo "rbd resize 32 -> 48 MiB: all four disks (both hosts, both gateways) at 48 MiB within $((SECONDS - t0)) s" |
    tee -a "$OUT/report.txt" >>"$STEPS"

  step "nvme disconnect -n $GW_NQN" nvme disconnect -n "$GW_NQN" || { fail "$label" "$REASON"; return; }
  CONNECTED=()
  gw_stop_both || { fail "$label" "$REASON"; return; }
  gw_logs_clean || { fail "$label" "$REASON"; return; }
  pass "$label"
}

stop_all() {
  gw_cleanup
  # Later scenarios expect the host's multipath on.
  nvme disconnect-all >/dev/null 2>&1
  modprobe -r nvme_rdma nvme_tcp nvme_fabrics nvme_core >/dev/null 2>&1
  modprobe nvme_core >/dev/null 2>&1
}
trap 'teardown; stop_all; cd / && rm -rf "$WORK"' EXIT
resv_case
