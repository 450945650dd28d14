#!/usr/bin/env bash
# gateway-failover-kernel-host-tcp: a gateway group (issue #39) under the Linux host's native
# multipath. A single-node Ceph cluster runs in the guest (scripts/ceph-cluster.sh); two of OUR
# targets, gateway A on tcp 127.0.0.1:4420 (home of ANA group 1) and gateway B on tcp
# 127.0.0.2:4420, export the 32 MiB image rbd/gw1 as one subsystem (`gateway: { group, pool }`,
# disjoint controller IDs; A's file seeds the group's configuration in RADOS, B's file has no
# subsystems and takes it). Nobody sets an ANA state: A takes the group's lease in RADOS and
# serves it optimized, B reports it inaccessible; B's discovery log lists A's listener. The
# host connects both paths (one multipath disk; `nvme list-subsys` goes to the report). fio
# randwrite with crc32c verify runs 45 s on the disk; at 15 s A is killed (SIGKILL): B takes
# the lapsed lease by itself and its path turns optimized within ANATT (10 s; the time goes to
# the report); 6 s after that A is started again: it rejoins, B gives the group back (failback) and
# A's path is optimized again. fio must end with 0 errors and 0 verify failures. Then `rbd
# resize` to 48 MiB: both paths and the multipath disk show the new size within 10 s, without
# reconnecting (A taking the image's lock back did not fence the live B).
# vm-needs: build
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../gateway-lib.sh"

GW_NQN=nqn.2026-11.io.nvmf-rs:gw GW_GROUP=vm GW_IMAGE=gw1 GW_SERIAL=NVMFRSGWVM01


path_of() { # ADDR -> the nvmeXcYnZ path disk of the controller connected to ADDR:4420
  local c p
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$GW_NQN" ] || continue
    grep -q "traddr=$1,trsvcid=4420" "$c/address" || continue
    for p in "$c"/nvme*c*n1; do [ -e "$p" ] && { basename "$p"; return 0; }; done
  done
  return 1
}
ana_of() { cat "/sys/block/$1/ana_state" 2>/dev/null; }

wait_states() { # SA SB SECONDS: until path A shows SA and path B SB
  local end=$((SECONDS + $3))
  until [ "$(ana_of "$P1")" = "$1" ] && [ "$(ana_of "$P2")" = "$2" ]; do
    [ $SECONDS -ge $end ] && { REASON="ana_state A=$(ana_of "$P1") B=$(ana_of "$P2"), want $1 $2 within $3 s"; return 1; }
    sleep 0.2
  done
}

list_subsys() { { echo "nvme list-subsys ($1):"; nvme list-subsys "$DEV" 2>&1 | sed 's/^/  /'; } >>"$OUT/report.txt"; }

gw_case() {
  local label=$SCENARIO rc fio_pid t0 took end hostnqn hostid
  teardown
  [ -n "$NVMF_TARGET_BIN" ] && [ -x "$NVMF_TARGET_BIN" ] || { fail "$label" "nvmf-target not available"; return; }
  gw_cluster || { fail "$label" "$REASON"; return; }
  gw_up || { fail "$label" "$REASON"; return; }
  end=$((SECONDS + 20))
  until grep -q "took the ANA group's lease" "$OUT/gw-a.log"; do
    [ $SECONDS -ge $end ] && { fail "$label" "gateway A did not take its lease in 20 s"; return; }
    sleep 0.5
  done

  modprobe -a nvme-fabrics nvme-tcp >>"$STEPS" 2>&1
  # B's discovery log lists A's listener too (each gateway publishes its own in RADOS).
  end=$((SECONDS + 15))
  until nvme discover -t tcp -a 127.0.0.2 -s 4420 >"$OUT/discover-b.txt" 2>&1 && grep -q "traddr:[[:space:]]*127.0.0.1" "$OUT/discover-b.txt"; do
    [ $SECONDS -ge $end ] && { fail "$label" "B's discovery log does not list A's listener: $(tr '\n' ' ' <"$OUT/discover-b.txt" | cut -c1-200)"; return; }
    sleep 1
  done
  hostnqn=nqn.2014-08.org.nvmexpress:uuid:2c3d4e5f-6071-4829-8a0b-1c2d3e4f5a6c
  hostid=2c3d4e5f-6071-4829-8a0b-1c2d3e4f5a6c
  for a in 127.0.0.1 127.0.0.2; do
    step "nvme connect -t tcp -a $a -s 4420 -n $GW_NQN" nvme connect -t tcp -a "$a" -s 4420 -n "$GW_NQN" \
      --hostnqn="$hostnqn" --hostid="$hostid" --ctrl-loss-tmo=120 --reconnect-delay=2 || { fail "$label" "$REASON"; return; }
  done
  CONNECTED+=("$GW_NQN")
  udevadm settle 2>/dev/null
  end=$((SECONDS + 15))
  until DEV=$(nvme_dev_for "$GW_NQN") && P1=$(path_of 127.0.0.1) && P2=$(path_of 127.0.0.2); do
    [ $SECONDS -ge $end ] && { fail "$label" "no multipath disk with two paths (DEV=${DEV:-} P1=${P1:-} P2=${P2:-})"; return; }
    sleep 0.5
  done
  echo "multipath disk $DEV: path $P1 gateway A (127.0.0.1), $P2 gateway B (127.0.0.2)" | tee -a "$OUT/report.txt" >>"$STEPS"
  wait_states optimized inaccessible 10 || { fail "$label" "at connect: $REASON"; return; }
  list_subsys "at connect"

  fio --name=gw --filename="$DEV" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
    --iodepth=8 --numjobs=2 --size=12M --offset_increment=12M --group_reporting --time_based \
    --runtime=45 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_backlog=128 \
    --output="$OUT/fio.txt" &
  fio_pid=$!
  sleep 15
  # Gateway A dies.
  kill -KILL "$A_PID"; wait "$A_PID" 2>/dev/null; A_PID=
  t0=$SECONDS
  log "gateway A killed (SIGKILL)"
  until [ "$(ana_of "$P2")" = optimized ]; do
    if [ $((SECONDS - t0)) -ge 10 ]; then kill "$fio_pid"; fail "$label" "B's path is $(ana_of "$P2") 10 s (ANATT) after A was killed"; return; fi
    sleep 0.2
  done
  took=$((SECONDS - t0))
  echo "gateway A killed: B's path optimized after ${took} s (ANATT 10 s)" | tee -a "$OUT/report.txt" >>"$STEPS"
  list_subsys "A killed"
  sleep 6
  # A comes back: it rejoins and B gives the group back.
  gw_start gw-a 127.0.0.1 "$OUT/gw-a2.log" || { kill "$fio_pid"; fail "$label" "restart: $REASON"; return; }
  A_PID=$GW_PID
  t0=$SECONDS
  wait_states optimized inaccessible 30 || { kill "$fio_pid"; fail "$label" "after A restarted: $REASON"; return; }
  echo "gateway A restarted: its path optimized again after $((SECONDS - t0)) s (failback)" | tee -a "$OUT/report.txt" >>"$STEPS"
  list_subsys "A back"
  wait "$fio_pid"; rc=$?
  grep -E '^[[:space:]]+(write|read):|err=' "$OUT/fio.txt" | head -n 4 >>"$OUT/report.txt"
  [ $rc = 0 ] || { fail "$label" "fio failed (exit $rc) across the failover: $(grep -m1 -iE 'verify|err=' "$OUT/fio.txt" | cut -c1-160)"; return; }
  grep -q 'err= 0' "$OUT/fio.txt" || { fail "$label" "fio reports errors"; return; }
  grep -qiE 'verify.*(fail|mismatch|bad)' "$OUT/fio.txt" && { fail "$label" "fio found a verify mismatch"; return; }
  grep -q "took over the image" "$OUT/gw-b.log" || { fail "$label" "B did not fence A (no 'took over the image' in its log)"; return; }
  grep -q "failback: giving the ANA group back" "$OUT/gw-b.log" || { fail "$label" "B did not give the group back"; return; }
  # A resize reaches the host through both gateways.
  step "rbd resize rbd/$GW_IMAGE to 48 MiB" rbd -c "$CONF" resize --size 48 "rbd/$GW_IMAGE" || { fail "$label" "$REASON"; return; }
  t0=$SECONDS
  until [ "$(cat "/sys/block/$P1/size")" = 98304 ] && [ "$(blockdev --getsize64 "$DEV")" = $((48 << 20)) ]; do
    [ $((SECONDS - t0)) -ge 10 ] && { fail "$label" "10 s after rbd resize to 48 MiB: path A $(cat "/sys/block/$P1/size") sectors, $DEV $(blockdev --getsize64 "$DEV") bytes"; return; }
    sleep 0.2
  done
  echo "rbd resize to 48 MiB: path A and $DEV show it after $((SECONDS - t0)) s" | tee -a "$OUT/report.txt" >>"$STEPS"
  # The standby path too: gateway B (it served the group before the failback) must not have
  # been fenced by A taking the lock back (a live peer is spared), so its update watch sees
  # the resize.
  until [ "$(cat "/sys/block/$P2/size")" = 98304 ]; do
    [ $((SECONDS - t0)) -ge 10 ] && { fail "$label" "10 s after rbd resize to 48 MiB: path B (standby) $(cat "/sys/block/$P2/size") sectors"; return; }
    sleep 0.2
  done
  echo "path B (standby) shows it after $((SECONDS - t0)) s" | tee -a "$OUT/report.txt" >>"$STEPS"
  if grep -q "took over the image" "$OUT/gw-a2.log"; then
    fail "$label" "A, back, fenced the live B: $(grep -m1 'took over the image' "$OUT/gw-a2.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200)"; return
  fi
  step "nvme disconnect -n $GW_NQN" nvme disconnect -n "$GW_NQN" || { fail "$label" "$REASON"; return; }
  CONNECTED=()
  gw_stop_both || { fail "$label" "$REASON"; return; }
  gw_logs_clean || { fail "$label" "$REASON"; return; }
  pass "$label"
}

trap 'teardown; gw_cleanup; cd / && rm -rf "$WORK"' EXIT
gw_case
