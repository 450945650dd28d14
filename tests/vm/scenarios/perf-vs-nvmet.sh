#!/usr/bin/env bash
# perf-vs-nvmet: benchmark (issue #6 goal 4): the kernel host's fio 4k randread QD32 against the
# Linux kernel target and against ours, over tcp and rdma/rxe, same RAM disk, same run, in
# interleaved trials (nvmet, ours, nvmet, ours, ...); the median of the per-trial ratios is the
# figure. Passes when every run completes; the trials and medians go to the run's summary.
# vm-needs: build rdma
# vm-timeout: 1500
source "$(dirname "$0")/../lib.sh"

# Knobs: NVMF_VM_PERF_TRIALS (5 alternations: single trials swing 0.6x-1.3x under emulation, a
# median of 3 moved by 0.2x between runs), NVMF_VM_PERF_RUNTIME (fio seconds, 10),
# NVMF_VM_PERF_MODES (our target's configurations, each a name=YAML pair separated by ';';
# default: "default=", the embedded defaults; e.g. add ";idle0=target: { idle_poll_us: 0 }" (the
# poller sleeps as soon as it is idle: in a 2-vCPU guest a spinning poller competes with the
# kernel host and rxe for the CPUs); each mode adds a fio run per trial, ~30-90 s under TCG),
# NVMF_VM_PERF_TRANSPORTS ("tcp rdma"), NVMF_VM_PERF_BASE_BIN (another nvmf-target build, e.g.
# of the commit before a change: adds mode "base", that binary on its defaults, to every trial,
# so before and after are measured side by side in one run), NVMF_VM_PERF_CPU_DETAIL=1 (writes
# cpu-TAG.txt per fio run: the guest's /proc/stat, softirq and interrupt counts and the busiest
# threads' CPU ticks and context switches over the run; how completions reach the host, e.g.
# IRQ_POLL softirqs per I/O, shows there).
TRIALS=${NVMF_VM_PERF_TRIALS:-5}
TRANSPORTS=${NVMF_VM_PERF_TRANSPORTS:-tcp rdma}
BASE_BIN=${NVMF_VM_PERF_BASE_BIN:-}
DETAIL=false
[ "${NVMF_VM_PERF_CPU_DETAIL:-0}" = 1 ] && DETAIL=true
export NVMF_VM_PERF_RUNTIME=${NVMF_VM_PERF_RUNTIME:-10}
MODES=${NVMF_VM_PERF_MODES:-"default="}
[ -n "$BASE_BIN" ] && MODES="base=;$MODES"

# median: of the numbers on stdin, one a line.
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# iops_of DEV TAG: fio_iops in this shell (not a command substitution, so REASON survives); sets IOPS.
# Also sets GUEST: "BUSY% US" of the whole guest (kernel host, fio, the target, rxe) while fio
# ran: the share of all vCPUs not idle, and busy vCPU time per I/O (over the ramp as well).
iops_of() {
  local a b
  IOPS=
  $DETAIL && snap "$WORK/snap0"
  a=$(cpu_jiffies)
  fio_iops "$1" "$2" >"$WORK/iops" || return 1
  b=$(cpu_jiffies)
  $DETAIL && snap "$WORK/snap1" && breakdown "$WORK/snap0" "$WORK/snap1" >"$OUT/cpu-$2.txt"
  IOPS=$(cat "$WORK/iops")
  [ -n "$IOPS" ] || { REASON="no IOPS in $OUT/fio-$2.json"; return 1; }
  GUEST=$(guest_cpu "$a" "$b" "$IOPS" $((NVMF_VM_PERF_RUNTIME + FIO_RAMP_SECS)))
}

# snap DIR: the guest's CPU, softirq and interrupt counters and every thread's CPU ticks and
# context switches now (taken outside the fio window, so the guest busy figures exclude it).
snap() {
  local t
  mkdir -p "$1"
  cat /proc/stat >"$1/stat"
  cat /proc/softirqs >"$1/softirqs"
  cat /proc/interrupts >"$1/interrupts"
  : >"$1/tasks"
  for t in /proc/[0-9]*/task/[0-9]*; do
    # TID COMM TICKS VOLUNTARY NONVOLUNTARY (comm may hold spaces: it ends at the last ") ").
    awk -v t="${t##*/}" 'FNR == 1 && FILENAME ~ /stat$/ {
        comm = $0; sub(/^[0-9]+ \(/, "", comm); rest = comm; sub(/.*\) /, "", rest)
        comm = substr(comm, 1, length(comm) - length(rest) - 2); gsub(/ /, "_", comm)
        split(rest, f, " "); ticks = f[12] + f[13]
      }
      /^voluntary_ctxt_switches/ { v = $2 } /^nonvoluntary_ctxt_switches/ { nv = $2 }
      END { if (comm != "") print t, comm, ticks, v + 0, nv + 0 }' "$t/stat" "$t/status" 2>/dev/null >>"$1/tasks"
  done
}

# breakdown DIR0 DIR1: what changed between two snaps.
breakdown() {
  echo "== /proc/stat (ticks): cpu user nice system idle iowait irq softirq steal"
  paste -d' ' <(grep '^cpu' "$1/stat") <(grep '^cpu' "$2/stat") |
    awk '{ n = NF / 2; printf "%s", $1; for (i = 2; i <= 9; i++) printf " %d", $(i + n) - $i; print "" }'
  echo "== softirqs, per CPU"
  paste -d' ' "$1/softirqs" "$2/softirqs" |
    awk 'NR > 1 { n = NF / 2; printf "%s", $1; for (i = 2; i <= n; i++) printf " %d", $(i + n) - $i; print "" }'
  echo "== interrupts that fired, per CPU"
  paste -d' ' "$1/interrupts" "$2/interrupts" | awk -v cpus="$(nproc)" 'NR > 1 {
    n = NF / 2; s = 0; line = $1; for (i = 2; i <= 1 + cpus; i++) { d = $(i + n) - $i; line = line " " d; s += d }
    if (s > 0) print line }'
  echo "== busiest threads: ticks, tid, comm, context switches (voluntary, involuntary)"
  awk 'NR == FNR { k[$1] = $3; v[$1] = $4; nv[$1] = $5; next }
    { d = $3 - k[$1]; if (d > 0 || $4 + $5 - v[$1] - nv[$1] > 100) print d, $1, $2, $4 - v[$1], $5 - nv[$1] }' \
    "$1/tasks" "$2/tasks" | sort -rn | head -20
}

# cpu_jiffies: "BUSY IDLE" clock ticks of all CPUs so far (/proc/stat: user nice system idle
# iowait irq softirq steal).
cpu_jiffies() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6; exit }' /proc/stat; }

# guest_cpu "BUSY0 IDLE0" "BUSY1 IDLE1" IOPS SECONDS: "BUSY% US_PER_IO".
guest_cpu() {
  awk -v a="$1" -v b="$2" -v iops="$3" -v secs="$4" -v hz="$(getconf CLK_TCK)" 'BEGIN {
    split(a, x, " "); split(b, y, " "); busy = y[1] - x[1]; idle = y[2] - x[2]
    if (busy + idle <= 0 || iops <= 0) { print "- -"; exit }
    printf "%.0f%% %.0f\n", 100 * busy / (busy + idle), busy * 1e6 / hz / (iops * secs)
  }'
}

# nvmet_trial TR ADDR DEV TAG: export DEV on nvmet, connect the kernel host, fio, disconnect,
# tear down; sets IOPS.
nvmet_trial() {
  local tr=$1 addr=$2 dev=$3 tag=$4
  kernel_target_up "$tr" "$addr" "$dev" || return 1
  host_connect "$tr" "$addr" "$PORT" "$KERNEL_NQN" || return 1
  iops_of "$DEV" "$tag" || return 1
  host_disconnect "$KERNEL_NQN" || return 1
  step "nvmet_clear" nvmet_clear
}

# ours_trial TR ADDR DEV TAG YAML [BIN]: our target (BIN, default the build under test, with
# the extra YAML), the same host and fio; sets IOPS.
ours_trial() {
  local tr=$1 addr=$2 dev=$3 tag=$4 bin=$NVMF_TARGET_BIN rc
  TARGET_YAML=$5
  [ -n "${6:-}" ] && NVMF_TARGET_BIN=$6
  start_our_target "$tr" "$addr" "$dev"; rc=$?
  NVMF_TARGET_BIN=$bin
  TARGET_YAML=
  [ $rc = 0 ] || return 1
  host_connect "$tr" "$addr" "$PORT" "$OUR_NQN" || return 1
  iops_of "$DEV" "$tag" || return 1
  host_disconnect "$OUR_NQN" || return 1
  PERCMD=$(stat_json | per_command)
  stop_our_target || return 1
  cp "$OUT/target.log" "$OUT/target-$tag.log"
  check_target_log
}

# per_command: from `stats --json` on stdin, "CPU_US ENTERS" per command the target received
# (its CPU time and io_uring_enter calls over its whole life: fresh for each trial); "-" where
# the target has no such counter (an older NVMF_VM_PERF_BASE_BIN).
per_command() {
  awk -F'[,:{}]' '{
    for (i = 1; i < NF; i++) {
      if ($i == "\"cpu_ns\"") cpu = $(i + 1)
      if ($i == "\"commands\"") c += $(i + 1)
      if ($i == "\"io_uring_enters\"") { e += $(i + 1); have = 1 }
    }
  } END {
    if (c == 0) { print "- -"; exit }
    printf "%.0f %s\n", cpu / 1000 / c, (have ? sprintf("%.2f", e / c) : "-")
  }'
}

perf_vs_nvmet_trials() {
  local label=$1 dev tr addr i t k o m name goal line
  local -a names=() yamls=() pairs=()
  teardown
  target_bin >/dev/null || { skip "$label" "$REASON"; return; }
  if [ -n "$BASE_BIN" ] && [ ! -x "$BASE_BIN" ]; then fail "$label" "NVMF_VM_PERF_BASE_BIN=$BASE_BIN is not executable"; return; fi
  IFS=';' read -r -a pairs <<<"$MODES"
  for m in "${pairs[@]}"; do names+=("${m%%=*}"); yamls+=("${m#*=}"); done
  dev=$(vm_ramdisk $RAMDISK_MB) || { fail "$label" "vm_ramdisk $RAMDISK_MB failed"; return; }
  # Fill the disk, so reads hit real pages on both targets.
  step "fill $dev" dd if=/dev/urandom of="$dev" bs=1M count=$RAMDISK_MB oflag=direct || { fail "$label" "$REASON"; return; }
  {
    echo "fio 4k randread iodepth=32 numjobs=1 ${NVMF_VM_PERF_RUNTIME}s (+${FIO_RAMP_SECS}s ramp), kernel host, ${RAMDISK_MB} MiB brd,"
    echo "$TRIALS interleaved trials per transport (nvmet, then ours in each mode); TCG-emulated VM with $(nproc) vCPUs: ratios only"
    for i in "${!names[@]}"; do
      if [ "${names[$i]}" = base ]; then echo "  ours[base]: $BASE_BIN, defaults"; else echo "  ours[${names[$i]}]: ${yamls[$i]:-(defaults)}"; fi
    done
    echo
    printf '%-6s %-6s %-14s %10s %10s %8s %11s %12s %12s %12s\n' tr trial who IOPS nvmet ratio "guest busy" "guest us/IO" "tgt us/cmd" "enters/cmd"
  } >"$OUT/report.txt"
  for tr in $TRANSPORTS; do
    addr=127.0.0.1
    [ $tr = rdma ] && addr=$RXE_IP
    : >"$WORK/ratios"
    for ((t = 1; t <= TRIALS; t++)); do
      teardown
      nvmet_trial "$tr" "$addr" "$dev" "nvmet-$tr-$t" || { fail "$label" "$REASON"; return; }
      k=$IOPS
      [ "${k:-0}" -gt 0 ] || { fail "$label" "fio measured 0 IOPS against nvmet ($tr, trial $t)"; return; }
      printf '%-6s %-6s %-14s %10d %10s %8s %11s %12s\n' "$tr" "$t" nvmet "$k" "" "" $GUEST | tee -a "$OUT/report.txt"
      for i in "${!names[@]}"; do
        name=${names[$i]}
        local bin=
        [ "$name" = base ] && bin=$BASE_BIN
        ours_trial "$tr" "$addr" "$dev" "ours-$tr-$name-$t" "${yamls[$i]}" ${bin:+"$bin"} || { fail "$label" "$REASON"; return; }
        o=$IOPS
        [ "${o:-0}" -gt 0 ] || { fail "$label" "fio measured 0 IOPS against ours[$name] ($tr, trial $t)"; return; }
        line=$(awk -v o="$o" -v k="$k" 'BEGIN { printf "%.3f", o / k }')
        echo "$name $line" >>"$WORK/ratios"
        printf '%-6s %-6s %-14s %10d %10d %7.2fx %11s %12s %12s %12s\n' "$tr" "$t" "ours[$name]" "$o" "$k" "$line" $GUEST $PERCMD | tee -a "$OUT/report.txt"
      done
    done
    goal=1.0
    [ $tr = tcp ] && goal=1.5
    for name in "${names[@]}"; do
      m=$(awk -v n="$name" '$1 == n { print $2 }' "$WORK/ratios" | median)
      line=$(awk -v t="$tr" -v n="$name" -v m="$m" -v g="$goal" -v all="$(awk -v n="$name" '$1 == n { printf "%s%.2f", s, $2; s = " " }' "$WORK/ratios")" \
        'BEGIN { printf "median %-4s ours[%s] / nvmet = %.2fx (trials: %s); goal >= %sx: %s", t, n, m, all, g, (m >= g ? "met" : "NOT met") }')
      echo "$line" | tee -a "$WORK/medians"
    done
  done
  { echo; cat "$WORK/medians"; } >>"$OUT/report.txt"
  pass "$label"
}

need_rdma RXE_IP && perf_vs_nvmet_trials "$SCENARIO"
