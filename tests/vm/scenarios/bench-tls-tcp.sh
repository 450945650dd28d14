#!/usr/bin/env bash
# bench-tls-tcp: benchmark (issue #38): scripts/bench-tls.sh inside the VM, where the kernel has
# TLS: NVMe/TCP over TLS 1.3 with kernel TLS on both ends (our initiator and target) against
# plain NVMe/TCP, 4k randread QD32 and 128k read QD8, alternating rounds, medians of the
# per-round ratios (the goal: kernel TLS within 0.8x of plain at 128k). Under TCG emulation the
# absolute numbers mean little; the ratio is the figure. Passes when every run completes.
# vm-needs: build
# vm-kernel: 6.12
# vm-in-all: no
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"

bench_tls() {
  local label=$SCENARIO root
  teardown
  root=$(cd "$(dirname "$0")/../../.." && pwd)
  [ -n "$NVMF_TARGET_BIN" ] && [ -n "$NVMF_BENCH_BIN" ] || { skip "$label" "nvmf-target or nvmf-bench not built"; return; }
  mkdir -p "$WORK/bin"
  ln -sf "$NVMF_TARGET_BIN" "$WORK/bin/nvmf-target"
  ln -sf "$NVMF_BENCH_BIN" "$WORK/bin/nvmf-bench"
  if step "scripts/bench-tls.sh (kernel TLS)" env NO_BUILD=1 BIN="$WORK/bin" \
      ROUNDS="${NVMF_VM_TLS_ROUNDS:-5}" RUNTIME="${NVMF_VM_TLS_RUNTIME:-5}" bash "$root/scripts/bench-tls.sh"; then
    cp "$WORK/step.out" "$OUT/bench-tls.txt"
    sed -n '/== summary/,$p' "$WORK/step.out" | tee -a "$OUT/report.txt"
    grep -q 'records=Kernel' "$WORK/step.out" || { fail "$label" "the target did not use kernel TLS"; return; }
    pass "$label"
  else
    cp "$WORK/step.out" "$OUT/bench-tls.txt"
    fail "$label" "$REASON"
  fi
}

bench_tls
cleanup
