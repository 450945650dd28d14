#!/usr/bin/env bash
# ana-multipath-kernel-host-rdma-rxe: ANA (issue #19) with the Linux host's native multipath.
# OUR target listens three times for one subsystem (namespace 1 in ANA group 1, a 64 MiB brd):
# tcp 127.0.0.1:4420 (A), tcp 127.0.0.2:4420 (B), rdma rxe:4420 (R). The host connects all three
# paths: one multipath disk; `nvme list-subsys` and each path's ana_state show the configured
# states. fio randrw with crc32c verify (2 jobs) runs 60 s through the multipath disk while the
# states flip every 10 s (ctl set-ana-state: A -> B -> R; then listener A is removed and added
# back by ctl, optimized again; then B; the last flip by editing the file and SIGHUP): every
# change reaches the host (ana_state), the I/O follows the optimized path (the paths' own write
# counters), and fio ends with no error and no mismatch. A fourth listener serving another
# subsystem only refuses a connect to this one (and logs why).
# Then the same with OUR initiator (verdict ana-multipath-initiator): the target started again
# the same way, multipath_check (tests/examples/multipath_check.rs: one multipath Namespace per
# worker over the three paths, 2 workers writing random 4 KiB blocks and reading back random
# earlier ones, 75 s, then every written block read back) runs through the same flips (ctl:
# A -> B -> R, A removed and added back, A, B; SIGHUP): after each, its per-second per-path
# lines show every worker's namespace in the new states and the calls going to the optimized
# path only; it ends with 0 errors and 0 mismatches. Per-phase call counts go to report.txt.
# vm-needs: build rdma
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"

MP_NQN=nqn.2026-11.io.nvmf-rs:ana
OTHER_NQN=nqn.2026-11.io.nvmf-rs:ana-other

write_cfg() { # STATE_A STATE_B STATE_R
  cat >"$OUT/target.yaml" <<EOF
listeners:
  - { transport: tcp, address: 127.0.0.1, port: 4420, ana: { 1: $1 } }
  - { transport: tcp, address: 127.0.0.2, port: 4420, ana: { 1: $2 } }
  - { transport: rdma, address: $RXE_IP, port: 4420, ana: { 1: $3 } }
  - { transport: tcp, address: 127.0.0.1, port: 4422, subsystems: [ "$OTHER_NQN" ] }
subsystems:
  - nqn: $MP_NQN
    allow_any_host: true
    namespaces: [ { nsid: 1, path: $DEVICE, ana_group: 1 } ]
  - nqn: $OTHER_NQN
    allow_any_host: true
    namespaces: [ { nsid: 1, null: 16MiB } ]
EOF
}

# path_of TR ADDR PORT -> the nvmeXcYnZ path disk of that controller (prints the name)
path_of() {
  local c want="traddr=$2,trsvcid=$3" p
  for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$MP_NQN" ] || continue
    [ "$(cat "$c/transport")" = "$1" ] || continue
    grep -q "$want" "$c/address" || continue
    for p in "$c"/nvme*c*n1; do [ -e "$p" ] && { basename "$p"; return 0; }; done
  done
  return 1
}

ana_of() { cat "/sys/block/$1/ana_state" 2>/dev/null; }
writes_of() { awk '{print $5}' "/sys/block/$1/stat"; } # sectors written

# wait_states P1 S1 P2 S2 P3 S3 [SECONDS]: until every path shows its state.
wait_states() {
  local end=$((SECONDS + ${7:-20})) ok
  while :; do
    ok=1
    [ "$(ana_of "$1")" = "$2" ] || ok=0
    [ "$(ana_of "$3")" = "$4" ] || ok=0
    [ "$(ana_of "$5")" = "$6" ] || ok=0
    [ $ok = 1 ] && return 0
    [ $SECONDS -ge $end ] && { REASON="ana_state $1=$(ana_of "$1") $3=$(ana_of "$3") $5=$(ana_of "$5"), want $2 $4 $6"; return 1; }
    sleep 0.5
  done
}

ctl_ana() { # TR ADDR PORT STATE
  step "ctl set-ana-state $*" "$NVMF_TARGET_BIN" ctl --control-socket "$CTL" set-ana-state "$1" "$2" "$3" 1 "$4"
}

list_subsys() { # LABEL: nvme list-subsys of the multipath disk, into the report
  { echo "nvme list-subsys ($1):"; nvme list-subsys "$DEV" 2>&1 | sed 's/^/  /'; } >>"$OUT/report.txt"
}

# flip A B R: the three paths' states (ctl), then wait for the host to see them and for the
# I/O to move to the optimized one; about 10 s a phase.
flip() {
  local t0=$SECONDS want
  ctl_ana tcp 127.0.0.1 4420 "$1" && ctl_ana tcp 127.0.0.2 4420 "$2" && ctl_ana rdma "$RXE_IP" 4420 "$3" || return 1
  wait_states "$P1" "$1" "$P2" "$2" "$P3" "$3" || return 1
  for want in "$P1:$1" "$P2:$2" "$P3:$3"; do
    if [ "${want#*:}" = optimized ]; then moved_to "${want%%:*}" || return 1; fi
  done
  sleep $((10 - (SECONDS - t0) > 0 ? 10 - (SECONDS - t0) : 0))
}

# moved_to PATH: the next 2 s of fio writes go through PATH (its counter grows, the others'
# do not). A window with no write on any path (the host still requeuing what it held while no
# path was usable: "no usable path - requeuing I/O") is measured again, up to 3 times.
moved_to() {
  local a0 b0 c0 a1 b1 c1 try
  for try in 1 2 3; do
    read -r a0 b0 c0 < <(echo "$(writes_of "$P1") $(writes_of "$P2") $(writes_of "$P3")")
    sleep 2
    read -r a1 b1 c1 < <(echo "$(writes_of "$P1") $(writes_of "$P2") $(writes_of "$P3")")
    echo "writes (sectors) over 2 s: $P1 +$((a1 - a0)) $P2 +$((b1 - b0)) $P3 +$((c1 - c0)); want $1" | tee -a "$OUT/report.txt" >>"$STEPS"
    [ $((a1 - a0 + b1 - b0 + c1 - c0)) -gt 0 ] && break
  done
  case $1 in
    "$P1") [ $((a1 - a0)) -gt 0 ] && [ $((b1 - b0)) = 0 ] && [ $((c1 - c0)) = 0 ] ;;
    "$P2") [ $((b1 - b0)) -gt 0 ] && [ $((a1 - a0)) = 0 ] && [ $((c1 - c0)) = 0 ] ;;
    "$P3") [ $((c1 - c0)) -gt 0 ] && [ $((a1 - a0)) = 0 ] && [ $((b1 - b0)) = 0 ] ;;
  esac || { REASON="the I/O did not move to $1"; return 1; }
}

ana_case() {
  local label=ana-multipath bin rc fio_pid
  teardown
  need_rdma RXE_IP || return
  DEVICE=$(vm_ramdisk 64) || { fail "$label" "vm_ramdisk failed"; return; }
  bin=$(target_bin) || { fail "$label" "$REASON"; return; }
  write_cfg optimized inaccessible inaccessible
  RUST_LOG=${RUST_LOG:-info} NO_COLOR=1 "$bin" --config "$OUT/target.yaml" --control-socket "$CTL" >"$OUT/target.log" 2>&1 &
  TARGET_PID=$!
  vm_wait_listen tcp 127.0.0.2 4420 20 && vm_wait_listen rdma "$RXE_IP" 4420 20 ||
    { fail "$label" "the target does not listen: $(tail -n 1 "$OUT/target.log")"; return; }
  modprobe -a nvme-tcp nvme-rdma >>"$STEPS" 2>&1
  echo "nvme_core multipath=$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)" >>"$STEPS"
  local hostnqn hostid
  hostnqn=nqn.2014-08.org.nvmexpress:uuid:1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b
  hostid=1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b
  for p in "tcp 127.0.0.1 4420" "tcp 127.0.0.2 4420" "rdma $RXE_IP 4420"; do
    set -- $p
    step "nvme connect -t $1 -a $2 -s $3 -n $MP_NQN" nvme connect -t "$1" -a "$2" -s "$3" -n "$MP_NQN" \
      --hostnqn="$hostnqn" --hostid="$hostid" --ctrl-loss-tmo=15 || { fail "$label" "$REASON"; return; }
  done
  CONNECTED+=("$MP_NQN")
  # The other subsystem's listener does not serve this one.
  if nvme connect -t tcp -a 127.0.0.1 -s 4422 -n "$MP_NQN" --hostnqn="$hostnqn" --hostid="$hostid" >>"$STEPS" 2>&1; then
    fail "$label" "a listener that serves $OTHER_NQN only let the host connect to $MP_NQN"; return
  fi
  grep -q "the listener does not serve the subsystem" "$OUT/target.log" || { fail "$label" "no log line for the refused connect"; return; }
  udevadm settle 2>/dev/null
  local end=$((SECONDS + 15))
  until DEV=$(nvme_dev_for "$MP_NQN") && P1=$(path_of tcp 127.0.0.1 4420) && P2=$(path_of tcp 127.0.0.2 4420) && P3=$(path_of rdma "$RXE_IP" 4420); do
    [ $SECONDS -ge $end ] && { fail "$label" "no multipath disk with three paths (DEV=${DEV:-} P1=${P1:-} P2=${P2:-} P3=${P3:-})"; return; }
    sleep 0.5
  done
  log "multipath disk $DEV, paths $P1 (A, tcp 127.0.0.1) $P2 (B, tcp 127.0.0.2) $P3 (R, rdma)"
  echo "multipath disk $DEV: paths $P1 tcp 127.0.0.1, $P2 tcp 127.0.0.2, $P3 rdma $RXE_IP" | tee -a "$OUT/report.txt" >>"$STEPS"
  wait_states "$P1" optimized "$P2" inaccessible "$P3" inaccessible 10 || { fail "$label" "at connect: $REASON"; return; }

  list_subsys "at connect"
  # fio through the multipath disk for the whole dance, verifying what it wrote.
  fio --name=ana --filename="$DEV" --ioengine=libaio --direct=1 --rw=randrw --rwmixread=50 --bs=4k \
    --iodepth=8 --numjobs=2 --size=16M --offset_increment=16M --group_reporting --time_based \
    --runtime=75 --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_backlog=256 \
    --output="$OUT/fio.txt" &
  fio_pid=$!
  sleep 3
  moved_to "$P1" || { kill "$fio_pid"; fail "$label" "$REASON"; return; }
  flip inaccessible optimized inaccessible || { kill "$fio_pid"; fail "$label" "$REASON"; return; }
  flip inaccessible inaccessible optimized || { kill "$fio_pid"; fail "$label" "$REASON"; return; }
  list_subsys "R optimized"
  # Listener A goes away (its connected path stays, with its last states) and comes back,
  # every group optimized by default: the host is told.
  step "ctl remove-listener tcp 127.0.0.1 4420" "$NVMF_TARGET_BIN" ctl --control-socket "$CTL" remove-listener tcp 127.0.0.1 4420 ||
    { kill "$fio_pid"; fail "$label" "$REASON"; return; }
  sleep 2
  step "ctl add-listener tcp 127.0.0.1 4420" "$NVMF_TARGET_BIN" ctl --control-socket "$CTL" add-listener tcp 127.0.0.1 4420 ||
    { kill "$fio_pid"; fail "$label" "$REASON"; return; }
  flip optimized inaccessible inaccessible || { kill "$fio_pid"; fail "$label" "after re-adding A: $REASON"; return; }
  flip inaccessible optimized inaccessible || { kill "$fio_pid"; fail "$label" "$REASON"; return; }
  # The file (SIGHUP): A optimized again, B persistent loss, R in change.
  write_cfg optimized persistent-loss change
  kill -HUP "$TARGET_PID"
  wait_states "$P1" optimized "$P2" persistent-loss "$P3" change || { kill "$fio_pid"; fail "$label" "after SIGHUP: $REASON"; return; }
  moved_to "$P1" || { kill "$fio_pid"; fail "$label" "$REASON"; return; }
  list_subsys "after SIGHUP"
  wait "$fio_pid"; rc=$?
  grep -E '^[[:space:]]+(write|read):|err=' "$OUT/fio.txt" | head -n 4 >>"$OUT/report.txt"
  [ $rc = 0 ] || { fail "$label" "fio failed (exit $rc) across the ANA changes: $(grep -m1 -iE 'verify|err=' "$OUT/fio.txt" | cut -c1-160)"; return; }
  grep -q 'err= 0' "$OUT/fio.txt" || { fail "$label" "fio reports errors"; return; }
  grep -qiE 'verify.*(fail|mismatch|bad)' "$OUT/fio.txt" && { fail "$label" "fio found a verify mismatch"; return; }
  host_disconnect "$MP_NQN" || { fail "$label" "$REASON"; return; }
  stop_our_target || { fail "$label" "$REASON"; return; }
  check_target_log || { fail "$label" "$REASON"; return; }
  pass "$label"
}

# ---------------- the same with our initiator: multipath_check ----------------
NVMF_MPCHECK_BIN=${NVMF_MPCHECK_BIN:-}
MP_SECS=${NVMF_VM_MPCHECK_SECS:-75} # the workload; the flips below take about 65 s
MP_OUT= MP_PID= MP_T=
MP_A=tcp:127.0.0.1:4420 MP_B=tcp:127.0.0.2:4420 MP_R= # MP_R: rdma:$RXE_IP:4420, set in the case

# mp_last_t: the last second multipath_check printed in full (its `t=N ios=` line comes after
# the second's path lines).
mp_last_t() { sed -n 's/^multipath_check: t=\([0-9]*\) ios=.*/\1/p' "$MP_OUT" | tail -n 1; }
# mp_field T PATH KEY: KEY=value of PATH's line for second T.
mp_field() { grep -m1 "^multipath_check: t=$1 path=$2 " "$MP_OUT" | tr ' ' '\n' | sed -n "s/^$3=//p"; }
mp_alive() { kill -0 "$MP_PID" 2>/dev/null || { REASON="multipath_check ended early: $(tail -n 1 "$MP_OUT" | cut -c1-200)"; return 1; }; }

# mp_wait_t T: until second T is printed.
mp_wait_t() {
  local end=$((SECONDS + 20)) t
  while t=$(mp_last_t); [ "${t:-0}" -lt "$1" ]; do
    mp_alive || return 1
    [ $SECONDS -ge $end ] && { REASON="multipath_check printed no second $1 (last ${t:-none})"; return 1; }
    sleep 0.3
  done
}

# mp_wait_states SA SB SR: until a second's lines show these states on A, B, R (as every
# worker's namespace sees them); MP_T = that second.
mp_wait_states() {
  local end=$((SECONDS + 20)) t a= b= r=
  while :; do
    t=$(mp_last_t)
    if [ -n "$t" ]; then
      a=$(mp_field "$t" "$MP_A" state) b=$(mp_field "$t" "$MP_B" state) r=$(mp_field "$t" "$MP_R" state)
      [ "$a $b $r" = "$1 $2 $3" ] && { MP_T=$t; return 0; }
    fi
    mp_alive || return 1
    [ $SECONDS -ge $end ] && { REASON="multipath_check sees A=$a B=$b R=$r at t=$t, want $1 $2 $3"; return 1; }
    sleep 0.3
  done
}

# mp_moved_to LABEL WANT(A|B|R): from the second after MP_T (the first second of the phase is
# the transition) to 3 s later, the calls grow on WANT's path only; the counts go to the report.
mp_moved_to() {
  local label=$1 want=$2 t0=$((MP_T + 1)) t1=$((MP_T + 4)) x p c0 c1 d line ok=1
  mp_wait_t "$t1" || return 1
  line="initiator phase '$label' (states at t=$MP_T, calls t=$t0..$t1):"
  for x in A B R; do
    p=MP_$x; p=${!p}
    c0=$(mp_field "$t0" "$p" calls) c1=$(mp_field "$t1" "$p" calls)
    d=$((c1 - c0))
    line+=" $x +$d (total $c1, $(mp_field "$t1" "$p" conn))"
    if [ "$x" = "$want" ]; then [ "$d" -gt 0 ] || ok=0; else [ "$d" = 0 ] || ok=0; fi
  done
  echo "$line; want $want" | tee -a "$OUT/report.txt" >>"$STEPS"
  [ $ok = 1 ] || { REASON="phase '$label': the calls did not go to $want only: ${line#*: }"; return 1; }
}

# mp_flip LABEL SA SB SR WANT: the three paths' states (ctl), then wait for the initiator to see
# them and the calls to move to WANT; about 10 s a phase.
mp_flip() {
  local t0=$SECONDS
  ctl_ana tcp 127.0.0.1 4420 "$2" && ctl_ana tcp 127.0.0.2 4420 "$3" && ctl_ana rdma "$RXE_IP" 4420 "$4" || return 1
  mp_wait_states "$2" "$3" "$4" || return 1
  mp_moved_to "$1" "$5" || return 1
  sleep $((10 - (SECONDS - t0) > 0 ? 10 - (SECONDS - t0) : 0))
}

initiator_case() {
  local label=ana-multipath-initiator bin rc b
  teardown
  need_rdma RXE_IP || return
  b=$NVMF_MPCHECK_BIN
  [ -n "$b" ] && [ -x "$b" ] || { fail "$label" "multipath_check not available: ${NVMF_MPCHECK_NOTE:-NVMF_MPCHECK_BIN unset}"; return; }
  DEVICE=$(vm_ramdisk 64) || { fail "$label" "vm_ramdisk failed"; return; }
  bin=$(target_bin) || { fail "$label" "$REASON"; return; }
  # The kernel host case's target log stays as target-kernel-host.log.
  [ -s "$OUT/target.log" ] && mv "$OUT/target.log" "$OUT/target-kernel-host.log"
  write_cfg optimized inaccessible inaccessible
  RUST_LOG=${RUST_LOG:-info} NO_COLOR=1 "$bin" --config "$OUT/target.yaml" --control-socket "$CTL" >"$OUT/target.log" 2>&1 &
  TARGET_PID=$!
  vm_wait_listen tcp 127.0.0.1 4420 20 && vm_wait_listen tcp 127.0.0.2 4420 20 && vm_wait_listen rdma "$RXE_IP" 4420 20 ||
    { fail "$label" "the target does not listen: $(tail -n 1 "$OUT/target.log")"; return; }
  MP_R=rdma:$RXE_IP:4420 MP_OUT=$OUT/multipath_check.txt
  echo "+ [multipath_check] $b --path $MP_A --path $MP_B --path $MP_R --subnqn $MP_NQN --seconds $MP_SECS" >>"$STEPS"
  RUST_LOG=${NVMF_VM_MPCHECK_LOG:-warn} NO_COLOR=1 "$b" --path "$MP_A" --path "$MP_B" --path "$MP_R" \
    --subnqn "$MP_NQN" --nsid 1 --seconds "$MP_SECS" --threads 2 --region-mib 16 \
    >"$MP_OUT" 2>"$OUT/multipath_check.err" &
  MP_PID=$!
  wait_for_line "$MP_OUT" 'I/O running' 60 "$MP_PID" || { fail "$label" "multipath_check: $REASON"; return; }
  grep 'opened namespace' "$MP_OUT" >>"$STEPS"
  # At the start: A optimized.
  mp_wait_states optimized inaccessible inaccessible && mp_moved_to "A optimized (start)" A ||
    { kill "$MP_PID"; fail "$label" "$REASON"; return; }
  mp_flip "B optimized" inaccessible optimized inaccessible B || { kill "$MP_PID"; fail "$label" "$REASON"; return; }
  mp_flip "R optimized" inaccessible inaccessible optimized R || { kill "$MP_PID"; fail "$label" "$REASON"; return; }
  # Listener A goes away (the connected paths stay, with their last states) and comes back
  # with every group optimized: A and R both optimized, the calls on A (the first path).
  step "ctl remove-listener tcp 127.0.0.1 4420" "$NVMF_TARGET_BIN" ctl --control-socket "$CTL" remove-listener tcp 127.0.0.1 4420 ||
    { kill "$MP_PID"; fail "$label" "$REASON"; return; }
  sleep 2
  step "ctl add-listener tcp 127.0.0.1 4420" "$NVMF_TARGET_BIN" ctl --control-socket "$CTL" add-listener tcp 127.0.0.1 4420 ||
    { kill "$MP_PID"; fail "$label" "$REASON"; return; }
  mp_flip "A re-added, optimized" optimized inaccessible inaccessible A || { kill "$MP_PID"; fail "$label" "after re-adding A: $REASON"; return; }
  mp_flip "B optimized again" inaccessible optimized inaccessible B || { kill "$MP_PID"; fail "$label" "$REASON"; return; }
  # The file (SIGHUP): A optimized again, B persistent loss, R in change.
  write_cfg optimized persistent-loss change
  kill -HUP "$TARGET_PID"
  mp_wait_states optimized persistent-loss change && mp_moved_to "after SIGHUP: A optimized" A ||
    { kill "$MP_PID"; fail "$label" "after SIGHUP: $REASON"; return; }
  # The rest of the run and the final read-back of every written block.
  local end=$((SECONDS + MP_SECS + 180))
  while kill -0 "$MP_PID" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 1; done
  if kill -0 "$MP_PID" 2>/dev/null; then
    kill "$MP_PID"; wait "$MP_PID" 2>/dev/null
    fail "$label" "multipath_check did not end within $((MP_SECS + 180)) s of the last phase: $(tail -n 1 "$MP_OUT" | cut -c1-200)"; return
  fi
  wait "$MP_PID"; rc=$?
  grep -E '^multipath_check: (worker [0-9]+: (ana_retries|final)|done)' "$MP_OUT" | tee -a "$OUT/report.txt" >>"$STEPS"
  [ $rc = 0 ] || { fail "$label" "multipath_check failed (exit $rc): $(grep -m1 -E 'MISMATCH|failed:' "$MP_OUT" | cut -c1-200) $(tail -n 1 "$MP_OUT" | cut -c1-120)"; return; }
  grep -qE '^multipath_check: done ios=[1-9][0-9]* errors=0 mismatches=0 ' "$MP_OUT" ||
    { fail "$label" "multipath_check: $(grep -m1 '^multipath_check: done' "$MP_OUT")"; return; }
  stop_our_target || { fail "$label" "$REASON"; return; }
  check_target_log || { fail "$label" "$REASON"; return; }
  pass "$label"
}

ana_case
# NVMF_VM_ANA_INITIATOR=0 (the CI tier): the kernel host's half only.
if [ "${NVMF_VM_ANA_INITIATOR:-1}" = 1 ]; then
  initiator_case
else
  log "initiator half not run (NVMF_VM_ANA_INITIATOR=0: the CI tier)"
fi
cleanup
