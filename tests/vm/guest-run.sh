#!/usr/bin/env bash
# guest-run.sh RESULTS_DIR SCENARIO... - runs inside the VM (started by tests/vm/run.sh through
# tests/vm/vm.sh): runs each scenario in turn under its own time limit, with its output in
# RESULTS_DIR/SCENARIO/output.log, and prints its verdict lines on stdout as they come.
# A scenario that times out, or ends without a verdict, gets a FAIL line written for it here.
# Exits 0 once every scenario ran (the verdicts carry the results); non-zero = harness error.
set -u
set -o pipefail

R=${1:?usage: guest-run.sh RESULTS_DIR SCENARIO...}
shift
HERE=$(cd "$(dirname "$0")" && pwd)
[ -n "${VM_GUEST:-}" ] || { echo "guest-run.sh: must run inside the VM (tests/vm/run.sh)" >&2; exit 2; }
[ -w "$R" ] || { echo "guest-run.sh: results dir $R is not writable in the guest" >&2; exit 2; }

header() { sed -n "s/^# $1: *//p" "$2" | head -n 1; }

up=$(cut -d' ' -f1 /proc/uptime)
echo "vm: guest up, kernel booted ${up%.*} s ago" >&2
{
  echo "guest kernel uptime when the runner started: $up s"
  echo "kernel: $(uname -r)"
  echo "fio: $(fio --version)  nvme-cli: $(nvme version | head -n 1)"
  rdma link 2>/dev/null
} >"$R/guest-info.txt"

for s in "$@"; do
  f=$HERE/scenarios/$s.sh
  out=$R/$s
  mkdir -p "$out"
  t=$(header vm-timeout "$f"); t=$((${t:-300} + ${NVMF_VM_EXTRA_SECS:-0}))
  echo "nvmf-vm: begin $s" >/dev/kmsg
  echo "vm: --- $s (limit ${t} s)" >&2
  t0=$SECONDS
  # timeout signals the whole process group: the scenario's target, fio, nvme-cli go with it.
  SCENARIO=$s VM_RESULTS=$R timeout -k 10 "$t" bash "$f" >"$out/output.log" 2>&1
  rc=$?
  dt=$((SECONDS - t0))
  echo "nvmf-vm: end $s (exit $rc, $dt s)" >/dev/kmsg
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    echo "FAIL $s: timed out after ${t} s (last step: $(grep '^+ ' "$out/steps.log" 2>/dev/null | tail -n 1 | cut -c3-160))" >>"$out/verdicts"
  elif [ ! -s "$out/verdicts" ]; then
    echo "FAIL $s: ended (exit $rc) without a verdict: $(tail -n 1 "$out/output.log" | cut -c1-160)" >>"$out/verdicts"
  elif [ $rc != 0 ] && ! grep -q '^FAIL ' "$out/verdicts"; then
    echo "FAIL $s: exited with status $rc after its verdict: $(tail -n 1 "$out/output.log" | cut -c1-160)" >>"$out/verdicts"
  fi
  cat "$out/verdicts"
  echo "$s $dt" >>"$R/timings.txt"
  echo "vm: --- $s done in $dt s" >&2
  # Whatever a killed scenario left behind must not leak into the next one.
  nvme disconnect-all >/dev/null 2>&1
  nvmet_clear >/dev/null 2>&1
done
dmesg >"$R/dmesg.txt"
exit 0
