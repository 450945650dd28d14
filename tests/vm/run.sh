#!/usr/bin/env bash
# run.sh - the VM test suite: real Linux NVMe-oF peers (kernel host, kernel target nvmet) and real
# soft-RDMA (rxe, siw) against our target and initiator, inside one qemu VM (tests/vm/vm.sh).
#
#   tests/vm/run.sh [options] [ci | all | SCENARIO...]
#
# `ci` is the tier scripts/test.sh (and so CI) runs: every peer and transport once and the fault
# scenarios that guard data, inside CI's time budget. `all` is the full tier, run by hand: every
# scenario but the named-only variants, with the sanity checks, the benchmarks and every fault
# scenario on both rxe and siw.
#
# Options:
#   --no-setup     do not run scripts/vm-setup.sh first (it is a fast no-op once done)
#   --no-build     use the binaries already in the cargo target dir (default: build them)
#   --results DIR  results directory (default: results/vm-<timestamp>/ in the repository)
#   --list [ci]    print the scenario names of `all` (or of `ci`) and exit
#   -v, --verbose  show the guest kernel console on stderr
#   -h, --help     this text
#
# Prints one line per verdict, `PASS name`, `FAIL name: reason` or `SKIP name: reason`, and last
# a line `N passed, N failed, N skipped`.
# Exit status: 0 = no FAIL; 1 = at least one FAIL, or the VM could not be set up / booted / ran
# out of time (that is reported as FAIL lines too); 2 = bad usage.
# Environment: NVMF_VM_SUITE_LIMIT (cap on the VM's wall time, default 4200 s), NVMF_VM_EXTRA_SECS
# (added to every scenario's time limit, e.g. 600 with NVMF_VM_SOAK_SECS=600); passed to the
# scenarios: NVMF_TEST_BREAK (see README), RUST_LOG, NVMF_VM_* knobs.
set -u
set -o pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
bad_usage() { echo "run.sh: $*" >&2; exit 2; }

# Suite order: the kernel<->kernel sanity checks first (they validate the VM), then our target
# under the kernel host, then our initiator. Scenario files not listed here run last.
ORDER=(
  kernel-target-tcp-sanity kernel-target-rdma-sanity
  rdma-wire-rxe rdma-wire-siw
  kernel-host-tcp kernel-host-rdma-rxe kernel-host-rdma-siw
  initiator-vs-kernel-target-tcp initiator-vs-kernel-target-rdma-rxe initiator-vs-kernel-target-rdma-siw
  initiator-vs-our-target-tcp initiator-vs-our-target-rdma-rxe initiator-vs-our-target-rdma-siw
  initiator-local-inv-rdma-rxe
  bench-compare-tcp-rdma-rxe bench-suite-rdma-rxe host-killed-mid-io-rdma-rxe host-killed-mid-io-rdma-siw
  bad-input-rdma-rxe bad-input-rdma-siw
  target-restart-rdma-rxe target-restart-rdma-siw link-drop-rdma-rxe link-drop-rdma-siw
  kernel-host-reload-tcp kernel-host-reload-rdma-rxe soak-randrw-rdma-rxe soak-randrw-rdma-siw
  iopoll-null-blk perf-vs-nvmet ana-multipath-kernel-host-rdma-rxe
  auth-kernel-host-rdma-rxe auth-initiator-vs-kernel-target-rdma-rxe
  kernel-host-rbd-rdma-rxe gateway-failover-kernel-host-tcp gateway-reservations-kernel-host-tcp
  durability-kernel-host-tcp durability-kernel-host-rdma-rxe durability-broken-flush-tcp
  tls-initiator-vs-our-target-tcp tls-kernel-host-tcp
)
# `ci`: the CI tier. Our target under the Linux host on tcp, rxe (in the ANA and authentication
# scenarios) and siw; our initiator against
# nvmet (tcp, siw) and against our target (siw; on rxe with local invalidation; ours against ours
# over tcp is the host tests' loopback, so its VM form runs in `all`); the in-process wire tests on rxe and on
# siw with a shared receive queue (access control, 0 allocations per I/O); and the scenarios that
# guard data: a host killed mid-I/O, bad input next to a verifying host, a target restart under
# reconnecting hosts, SIGHUP reload under the Linux host, a verified soak on siw;
# ANA multipath under the Linux host and our initiator (two TCP addresses and rxe, states
# flipping under fio; our initiator's multipath_check half runs in `all`); a gateway group of
# two targets on an RBD image (a Ceph cluster in the guest) failing over and back under the
# Linux host's multipath (gateway A killed under fio verify); every crash point of a
# dm-log-writes log under the Linux host over tcp (block and file backends, xfs on top); in-band
# authentication both ways with Linux 6.12 (its own VM boot), and NVMe/TCP over TLS with kernel
# TLS on both ends (our initiator and target, in the same 6.12 boot).
# The same fault scenarios on the other RDMA device, the dropped link (link-drop-*; the host
# tests drop a veth link under NVMe/TCP), kernel-host-rdma-rxe, the sanity checks, the SRQ
# variants and the benchmarks run in `all` (CI's time budget: .ci/run took 39.8 min with them,
# 39.0 min at the last landing before initiator-vs-our-target-tcp moved to `all`).
CI_TIER=(
  rdma-wire-rxe rdma-wire-srq-siw
  kernel-host-tcp kernel-host-rdma-siw
  initiator-vs-kernel-target-tcp initiator-vs-kernel-target-rdma-siw
  initiator-vs-our-target-rdma-siw
  initiator-local-inv-rdma-rxe
  host-killed-mid-io-rdma-siw bad-input-rdma-rxe target-restart-rdma-rxe
  kernel-host-reload-tcp soak-randrw-rdma-siw ana-multipath-kernel-host-rdma-rxe
  gateway-failover-kernel-host-tcp durability-kernel-host-tcp
  auth-kernel-host-rdma-rxe auth-initiator-vs-kernel-target-rdma-rxe
  tls-initiator-vs-our-target-tcp fio-engine-rdma-rxe
)
# `all`: every scenario but those whose header says `vm-in-all: no` (variants and benchmarks
# that run when named).
all_scenarios() {
  local s f
  for s in "${ORDER[@]}"; do [ -f "$HERE/scenarios/$s.sh" ] && echo "$s"; done
  for f in "$HERE"/scenarios/*.sh; do
    s=$(basename "$f" .sh)
    [[ " ${ORDER[*]} " == *" $s "* ]] || echo "$s"
  done | while read -r s; do [ "$(header vm-in-all "$s")" = no ] || echo "$s"; done
}
header() { sed -n "s/^# $1: *//p" "$HERE/scenarios/$2.sh" | head -n 1; }

SETUP=1 BUILD=1 VERBOSE=() RESULTS='' SEL=()
while [ $# -gt 0 ]; do
  case $1 in
    --no-setup) SETUP=0 ;;
    --no-build) BUILD=0 ;;
    --results) RESULTS=${2:?--results needs a directory}; shift ;;
    --results=*) RESULTS=${1#*=} ;;
    --list) if [ "${2:-}" = ci ]; then printf '%s\n' "${CI_TIER[@]}"; else all_scenarios; fi; exit 0 ;;
    -v|--verbose) VERBOSE=(-v) ;;
    -h|--help) usage; exit 0 ;;
    all) mapfile -t -O "${#SEL[@]}" SEL < <(all_scenarios) ;;
    ci) SEL+=("${CI_TIER[@]}"); CI_KNOBS=1 ;;
    -*) bad_usage "unknown option '$1' (try --help)" ;;
    *) [ -f "$HERE/scenarios/$1.sh" ] || bad_usage "no scenario '$1' (tests/vm/run.sh --list)"; SEL+=("$1") ;;
  esac
  shift
done
[ ${#SEL[@]} -gt 0 ] || mapfile -t SEL < <(all_scenarios)
# The CI tier's shorter forms (CI's time budget; `all` runs the long ones): a 30 s soak, the
# ANA scenario without its initiator half (tests/tests/multipath.rs covers that on the host),
# shorter crash-point workloads, one-way authentication and kernel TLS in one form each.
if [ "${CI_KNOBS:-0}" = 1 ]; then
  export NVMF_VM_SOAK_SECS=${NVMF_VM_SOAK_SECS:-30}
  export NVMF_VM_ANA_INITIATOR=${NVMF_VM_ANA_INITIATOR:-0}
  # Crash points: 5 s of writes per backend, a mark every 32 file replacements under xfs.
  export NVMF_VM_CRASHPOINT_SECS=${NVMF_VM_CRASHPOINT_SECS:-5}
  export NVMF_VM_CRASHPOINT_BATCH=${NVMF_VM_CRASHPOINT_BATCH:-32}
  # One-way DH-HMAC-CHAP over tcp only (rdma too in `all`); kernel TLS with the v1 identity only
  # (the v0 one too in `all`; both are in the host tests).
  export NVMF_VM_AUTH_ONEWAY_TRANSPORTS=${NVMF_VM_AUTH_ONEWAY_TRANSPORTS:-tcp}
  export NVMF_VM_TLS_IDENTITIES=${NVMF_VM_TLS_IDENTITIES:-v1}
fi

RESULTS=${RESULTS:-$ROOT/results/vm-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$RESULTS" || { echo "run.sh: cannot create $RESULTS" >&2; exit 1; }
RESULTS=$(realpath "$RESULTS")
EXTRA=$RESULTS/run-verdicts # verdicts given on the host (setup, build, VM trouble)
: >"$EXTRA"
T_START=$SECONDS
echo "run.sh: ${#SEL[@]} scenario(s): ${SEL[*]}" >&2
echo "run.sh: results in $RESULTS" >&2

host_fail() { echo "FAIL $1: $2" | tee -a "$EXTRA"; }

# Count every verdict line, print the closing line and exit.
finish() {
  local pass fail skip rc=0
  local s files=("$EXTRA")
  for s in "${SEL[@]}"; do [ -f "$RESULTS/$s/verdicts" ] && files+=("$RESULTS/$s/verdicts"); done
  cat "${files[@]}" | grep -E '^(PASS|FAIL|SKIP) ' >"$RESULTS/summary.txt"
  pass=$(grep -c '^PASS ' "$RESULTS/summary.txt")
  fail=$(grep -c '^FAIL ' "$RESULTS/summary.txt")
  skip=$(grep -c '^SKIP ' "$RESULTS/summary.txt")
  {
    echo
    echo "total wall time: $((SECONDS - T_START)) s"
    [ -s "$RESULTS/harness-notes.txt" ] && cat "$RESULTS/harness-notes.txt"
    [ -f "$RESULTS/timings.txt" ] && sed 's/^/scenario time (s): /' "$RESULTS/timings.txt"
    # Measurements a scenario wants in the summary (e.g. the tcp-vs-rdma table).
    for s in "${SEL[@]}"; do
      [ -s "$RESULTS/$s/report.txt" ] || continue
      echo
      echo "== $s"
      cat "$RESULTS/$s/report.txt"
    done
  } >>"$RESULTS/summary.txt"
  echo "run.sh: results in $RESULTS (summary.txt); total $((SECONDS - T_START)) s" >&2
  echo "$pass passed, $fail failed, $skip skipped"
  [ "$fail" = 0 ] || rc=1
  exit $rc
}

# ---------------- 1. prerequisites ----------------
if [ $SETUP = 1 ]; then
  if ! "$ROOT/scripts/vm-setup.sh" >"$RESULTS/vm-setup.log" 2>&1; then
    host_fail vm-setup "scripts/vm-setup.sh failed: $(tail -n 1 "$RESULTS/vm-setup.log")"
    for s in "${SEL[@]}"; do host_fail "$s" "not run: the VM could not be set up"; done
    finish
  fi
fi

# ---------------- 2. host build ----------------
need_build=0 need_ublk=0
for s in "${SEL[@]}"; do
  [[ " $(header vm-needs "$s") " == *" build "* ]] && need_build=1
  # nvmf-ublk (and libublk) only for the scenarios that use it (`vm-needs: ublk`).
  [[ " $(header vm-needs "$s") " == *" ublk "* ]] && need_ublk=1
done

declare -A BIN=() NOTE=()
if [ $need_build = 1 ]; then
  TDIR=$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])') ||
    TDIR=${CARGO_TARGET_DIR:-$ROOT/build}
  # package:binary[:example[:features]]
  for pkg_bin in nvmf-target:nvmf-target nvmf-bench:nvmf-bench nvmf-tests:io_check:example \
      nvmf-tests:reconnect_check:example nvmf-tests:rdma_bad_input:example:raw \
      nvmf-tests:auth_kat:example nvmf-tests:multipath_check:example \
      nvmf-tests:caw_race:example nvmf-tests:crashpoint:example nvmf-fio:libnvmf_fio.so:lib \
      nvmf-ublk:nvmf-ublk; do
    IFS=: read -r pkg bin kind feat <<<"$pkg_bin"
    [ "$pkg" = nvmf-ublk ] && [ $need_ublk = 0 ] && continue
    sel=() path=$TDIR/release/$bin
    [ "$kind" = example ] && sel=(--example "$bin") path=$TDIR/release/examples/$bin
    [ "$kind" = lib ] && sel=(--lib)
    [ -n "$feat" ] && sel+=(--features "$feat")
    if [ $BUILD = 1 ]; then
      echo "run.sh: cargo build --release -p $pkg ${sel[*]}" >&2
      t0=$SECONDS
      if (cd "$ROOT" && cargo build --release -p "$pkg" "${sel[@]}") >"$RESULTS/build-$bin.log" 2>&1; then
        echo "run.sh: built $bin in $((SECONDS - t0)) s" >&2
      else
        NOTE[$bin]="cargo build --release -p $pkg ${sel[*]} failed (build-$bin.log)"
        host_fail "build-$bin" "cargo build --release -p $pkg ${sel[*]} failed: $(grep -m1 -E '^error' "$RESULTS/build-$bin.log" | cut -c1-160)"
        continue
      fi
    fi
    if [ -x "$path" ] || { [ "$kind" = lib ] && [ -f "$path" ]; }; then
      BIN[$bin]=$path
    else
      NOTE[$bin]="$path does not exist"
    fi
  done
fi

# A BROKEN target (Flush does nothing, FUA is dropped: the `test-noop-flush` feature) for the
# scenarios whose header says `vm-needs: noflush`: built into a directory of its own, so the
# real binary is never it.
NOFLUSH_BIN='' NOFLUSH_NOTE=''
need_noflush=0
for s in "${SEL[@]}"; do
  [[ " $(header vm-needs "$s") " == *" noflush "* ]] && need_noflush=1
done
if [ $need_noflush = 1 ]; then
  NOFLUSH_DIR=${TDIR:-$ROOT/build}/noflush
  if [ $BUILD = 1 ]; then
    echo "run.sh: cargo build --release -p nvmf-target --features test-noop-flush --target-dir $NOFLUSH_DIR" >&2
    t0=$SECONDS
    if (cd "$ROOT" && cargo build --release -p nvmf-target --features test-noop-flush --target-dir "$NOFLUSH_DIR") \
        >"$RESULTS/build-nvmf-target-noflush.log" 2>&1; then
      echo "run.sh: built the broken nvmf-target in $((SECONDS - t0)) s" >&2
    else
      NOFLUSH_NOTE="the test-noop-flush build failed (build-nvmf-target-noflush.log)"
    fi
  fi
  if [ -x "$NOFLUSH_DIR/release/nvmf-target" ]; then NOFLUSH_BIN=$NOFLUSH_DIR/release/nvmf-target
  else NOFLUSH_NOTE=${NOFLUSH_NOTE:-$NOFLUSH_DIR/release/nvmf-target does not exist}; fi
fi

# The in-process RDMA wire tests (target/tests/rdma_raw.rs, rdma_host.rs, rdma_access.rs,
# transport_alloc.rs, rdma/tests/windows.rs): built here, run in the guest by the rdma-wire-*
# scenarios.
RDMA_TESTS=
if [ $need_build = 1 ]; then
  echo "run.sh: cargo test --release -p nvmf-target -p nvmf-rdma --test rdma_raw --test rdma_host --test rdma_access --test transport_alloc --test windows --no-run" >&2
  if (cd "$ROOT" && cargo test --release -p nvmf-target -p nvmf-rdma --test rdma_raw --test rdma_host --test rdma_access --test transport_alloc --test windows --no-run \
      --message-format=json) >"$RESULTS/build-rdma-tests.json" 2>"$RESULTS/build-rdma-tests.log"; then
    RDMA_TESTS=$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("rdma_raw", "rdma_host", "rdma_access", "transport_alloc", "windows"):
        print(m["target"]["name"] + "=" + m["executable"])' "$RESULTS/build-rdma-tests.json" | tr '\n' ' ')
  else
    host_fail "build-rdma-tests" "cargo test --no-run of the RDMA wire tests failed: $(grep -m1 -E '^error' "$RESULTS/build-rdma-tests.log" | cut -c1-160)"
  fi
fi

# The backend's polled-ring test (target/tests/iopoll.rs): built here, run by iopoll-null-blk.
IOPOLL_TEST=
if [ $need_build = 1 ]; then
  echo "run.sh: cargo test --release -p nvmf-target --test iopoll --no-run" >&2
  if (cd "$ROOT" && cargo test --release -p nvmf-target --test iopoll --no-run \
      --message-format=json) >"$RESULTS/build-iopoll-test.json" 2>"$RESULTS/build-iopoll-test.log"; then
    IOPOLL_TEST=$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "iopoll":
        print(m["executable"])' "$RESULTS/build-iopoll-test.json")
  else
    host_fail "build-iopoll-test" "cargo test --no-run of target/tests/iopoll.rs failed: $(grep -m1 -E '^error' "$RESULTS/build-iopoll-test.log" | cut -c1-160)"
  fi
fi

# ---------------- 3. one VM per guest kernel ----------------
# Scenarios run in one VM per kernel series their header asks for (`vm-kernel: 6.12`; default
# 6.1). 6.12 has no siw build: its VM gets rxe only.
envs=(
  NVMF_TARGET_BIN="${BIN[nvmf-target]:-}" NVMF_TARGET_NOTE="${NOTE[nvmf-target]:-}"
  NVMF_BENCH_BIN="${BIN[nvmf-bench]:-}" NVMF_BENCH_NOTE="${NOTE[nvmf-bench]:-}"
  NVMF_IOCHECK_BIN="${BIN[io_check]:-}" NVMF_IOCHECK_NOTE="${NOTE[io_check]:-}"
  NVMF_RECONNECT_BIN="${BIN[reconnect_check]:-}" NVMF_RECONNECT_NOTE="${NOTE[reconnect_check]:-}"
  NVMF_RDMA_TESTS="$RDMA_TESTS"
  NVMF_IOPOLL_TEST="$IOPOLL_TEST"
  NVMF_BADINPUT_BIN="${BIN[rdma_bad_input]:-}" NVMF_BADINPUT_NOTE="${NOTE[rdma_bad_input]:-}"
  NVMF_AUTHKAT_BIN="${BIN[auth_kat]:-}" NVMF_AUTHKAT_NOTE="${NOTE[auth_kat]:-}"
  NVMF_MPCHECK_BIN="${BIN[multipath_check]:-}" NVMF_MPCHECK_NOTE="${NOTE[multipath_check]:-}"
  NVMF_CAWRACE_BIN="${BIN[caw_race]:-}" NVMF_CAWRACE_NOTE="${NOTE[caw_race]:-}"
  NVMF_CRASHPOINT_BIN="${BIN[crashpoint]:-}" NVMF_CRASHPOINT_NOTE="${NOTE[crashpoint]:-}"
  NVMF_FIO_ENGINE="${BIN[libnvmf_fio.so]:-}" NVMF_FIO_ENGINE_NOTE="${NOTE[libnvmf_fio.so]:-}"
  NVMF_UBLK_BIN="${BIN[nvmf-ublk]:-}" NVMF_UBLK_NOTE="${NOTE[nvmf-ublk]:-}"
  NVMF_NOFLUSH_BIN="$NOFLUSH_BIN" NVMF_NOFLUSH_NOTE="$NOFLUSH_NOTE"
  NVMF_TEST_BREAK="${NVMF_TEST_BREAK:-}" RUST_LOG="${RUST_LOG:-info}" RUST_BACKTRACE=1
)
for v in $(compgen -e | grep '^NVMF_VM_' || true); do envs+=("$v=${!v}"); done

# $1 = kernel series; the rest: its scenarios. The per-scenario limits guard against hangs;
# their sum can exceed what CI allows (90 min for build and all), so each VM is capped as well.
boot_vm() {
  local series=$1 s t rdma=none need_rdma=0 vm_limit=180 cap=${NVMF_VM_SUITE_LIMIT:-4200} vm_rc
  shift
  for s in "$@"; do
    [[ " $(header vm-needs "$s") " == *" rdma "* ]] && need_rdma=1
    t=$(header vm-timeout "$s"); vm_limit=$((vm_limit + ${t:-300} + ${NVMF_VM_EXTRA_SECS:-0} + 15))
  done
  [ "$vm_limit" -le "$cap" ] || vm_limit=$cap
  if [ $need_rdma = 1 ]; then
    rdma=both
    [ "$series" = 6.1 ] || rdma=rxe
  fi
  local cmd="env $(printf '%q ' "${envs[@]}" NVMF_VM_KERNEL_SERIES="$series") bash $(printf '%q ' "$HERE/guest-run.sh" "$RESULTS" "$@")"
  echo "run.sh: booting the VM (kernel $series, --rdma $rdma, limit ${vm_limit} s)" >&2
  local t0=$SECONDS
  # Verdict lines (stdout) go straight through; progress and harness messages (stderr) are also
  # kept in vm-<series>.log.
  {
    NVMF_VM_KERNEL_SERIES=$series "$HERE/vm.sh" "${VERBOSE[@]}" --rdma "$rdma" --rw "$RESULTS" --timeout "$vm_limit" -- "$cmd" 2>&1 1>&3 3>&- |
      tee "$RESULTS/vm-$series.log" >&2 3>&-
    vm_rc=${PIPESTATUS[0]}
  } 3>&1
  echo "run.sh: VM (kernel $series) finished in $((SECONDS - t0)) s (vm.sh exit $vm_rc)" >&2
  # A guest that stopped under the harness (vm.sh 125: qemu/vng died, no verdict from the
  # guest) is booted once more for the scenarios it left without a verdict; the first try is
  # kept as <scenario>.crashed/ and said in the summary. Verdicts already given stand.
  local left=()
  for s in "$@"; do [ -s "$RESULTS/$s/verdicts" ] || left+=("$s"); done
  if [ "$vm_rc" = 125 ] && [ -z "${RETRIED:-}" ] && [ ${#left[@]} -gt 0 ] &&
     grep -q 'stopped before the command finished' "$RESULTS/vm-$series.log"; then
    echo "run.sh: the VM (kernel $series) stopped under the harness; booting it once more for: ${left[*]}" >&2
    echo "harness: the kernel $series VM stopped unexpectedly ($(grep -m1 -E '^vm\.sh' "$RESULTS/vm-$series.log" | cut -c1-160)); booted again for: ${left[*]}" >>"$RESULTS/harness-notes.txt"
    for s in "${left[@]}"; do
      [ -d "$RESULTS/$s" ] && rm -rf "$RESULTS/$s.crashed" && mv "$RESULTS/$s" "$RESULTS/$s.crashed"
    done
    mv "$RESULTS/vm-$series.log" "$RESULTS/vm-$series.crashed.log"
    RETRIED=1 boot_vm "$series" "${left[@]}"
    return
  fi
  case $vm_rc in
    0) ;;
    124) host_fail "vm-$series" "the VM ran out of time (${vm_limit} s)" ;;
    125) host_fail "vm-$series" "harness error (vm.sh exit 125): $(grep -m1 -E '^vm\.sh' "$RESULTS/vm-$series.log" | cut -c1-200)" ;;
    *) host_fail "vm-$series" "the guest runner failed (vm.sh exit $vm_rc): $(tail -n 1 "$RESULTS/vm-$series.log" | cut -c1-200)" ;;
  esac
  for s in "$@"; do
    [ -s "$RESULTS/$s/verdicts" ] || host_fail "$s" "not run (vm.sh exit $vm_rc)"
  done
}

declare -A BY_KERNEL=()
for s in "${SEL[@]}"; do
  k=$(header vm-kernel "$s"); k=${k:-6.1}
  BY_KERNEL[$k]+="$s "
done
for k in $(printf '%s\n' "${!BY_KERNEL[@]}" | sort -V); do
  # shellcheck disable=SC2086 # scenario names have no spaces
  boot_vm "$k" ${BY_KERNEL[$k]}
done
finish
