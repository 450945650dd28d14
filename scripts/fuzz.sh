#!/usr/bin/env bash
# Fuzz the wire parsers, the YAML configuration and the target's NVMe/TCP connection with
# cargo-fuzz (libFuzzer; needs the nightly toolchain). Targets and invariants: fuzz/README.md.
#   scripts/fuzz.sh --ci             every target for FUZZ_SECONDS (default 10) from the
#                                    committed seeds only (fresh corpus); scripts/test.sh runs it
#   scripts/fuzz.sh [TARGET...]      longer runs: FUZZ_SECONDS (default 600) per target; the
#                                    corpus grows in build/fuzz/corpus/TARGET
#   scripts/fuzz.sh --list           the targets
# Prints execs, execs/s and crashes per target; exits non-zero if any target crashed. Crash
# inputs land in build/fuzz/artifacts/TARGET/ (replay: build/<host>/release/TARGET FILE).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(sqe_cqe pdu_stream tcp_conn sgl connect_data discovery_log config_yaml)
TOOLCHAIN=${FUZZ_TOOLCHAIN:-nightly}

ci=0
names=()
for a in "$@"; do
  case $a in
    --ci) ci=1 ;;
    --list) printf '%s\n' "${TARGETS[@]}"; exit 0 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $a" >&2; exit 2 ;;
    *) names+=("$a") ;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=("${TARGETS[@]}")
secs=${FUZZ_SECONDS:-$([ $ci = 1 ] && echo 10 || echo 600)}

if ! rustup run "$TOOLCHAIN" rustc --version >/dev/null 2>&1; then
  echo "fuzz.sh: the $TOOLCHAIN toolchain is missing (cargo-fuzz needs nightly: rustup toolchain install nightly)" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: cargo-fuzz is missing: run scripts/setup.sh" >&2
  exit 1
fi
host=$(rustup run "$TOOLCHAIN" rustc -vV | sed -n 's/^host: //p')
# Build dir: build/ (.cargo/config.toml), per target triple, so it never clashes with the
# workspace's stable builds. -a: debug assertions and overflow checks on; AddressSanitizer.
echo "== fuzz: building ${names[*]} ($TOOLCHAIN)" >&2
mkdir -p build/fuzz/logs
if ! cargo "+$TOOLCHAIN" fuzz build -a >build/fuzz/logs/build.log 2>&1; then
  tail -40 build/fuzz/logs/build.log >&2
  exit 1
fi
bin=build/$host/release

max_len() {
  case $1 in
    pdu_stream|tcp_conn) echo 16384 ;;
    config_yaml) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

failed=0
summary=()
for t in "${names[@]}"; do
  [ -x "$bin/$t" ] || { echo "fuzz.sh: no target $t (see --list)" >&2; exit 2; }
  if [ $ci = 1 ]; then
    corpus=build/fuzz/ci-corpus/$t
    rm -rf "$corpus"
  else
    corpus=build/fuzz/corpus/$t
  fi
  art=build/fuzz/artifacts/$t/
  log=build/fuzz/logs/$t.log
  mkdir -p "$corpus" "$art" "$(dirname "$log")"
  echo "== fuzz: $t for ${secs}s" >&2
  rc=0
  "$bin/$t" "$corpus" "fuzz/seeds/$t" -max_total_time="$secs" -max_len="$(max_len "$t")" \
    -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$art" \
    >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  crashes=$(grep -c 'Test unit written' "$log" || true)
  if [ "$rc" != 0 ] || [ "$crashes" != 0 ]; then
    failed=1
    grep -m1 -B2 -A12 -E 'panicked|ERROR: libFuzzer|ERROR: AddressSanitizer' "$log" >&2 || tail -30 "$log" >&2
  fi
  summary+=("$(printf '%-14s %12s execs %8s execs/s %3s crashes  corpus %s' "$t" "${execs:-?}" "${rate:-?}" "$crashes" "$(ls "$corpus" | wc -l)")")
done
echo "== fuzz summary (${secs}s per target; logs in build/fuzz/logs/)" >&2
printf '%s\n' "${summary[@]}" >&2
exit $failed
