#!/usr/bin/env bash
# bench-srq-ab-rdma-rxe: A/B of our target with per-QP receive queues (rdma_srq_depth 0) and with a
# shared receive queue (rdma_srq_depth ${NVMF_VM_RDMA_SRQ_DEPTH:-512}), same VM, same RAM disk:
# nvmf-bench 4k randread QD32 (${NVMF_VM_SRQ_AB_RUNTIME:-10} s, time based) on rxe0, three rounds
# alternating A and B; the registered memory (gauges) of each run goes to report.txt. Passes when
# every run completes and the target logs are clean; no verdict on speed (TCG: ratios only).
# vm-in-all: no
# vm-needs: build rdma
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
srq_ab() {
  local label=$1 addr=$2 b dev depth round secs=${NVMF_VM_SRQ_AB_RUNTIME:-10}
  teardown
  log "case $label: $addr:$PORT"
  b=$(bench_bin) || { skip "$label" "$REASON"; return; }
  dev=$(vm_ramdisk $RAMDISK_MB) || { fail "$label" "vm_ramdisk $RAMDISK_MB failed"; return; }
  : >"$OUT/report.txt"
  for round in 1 2 3; do
    for depth in 0 "${NVMF_VM_RDMA_SRQ_DEPTH:-512}"; do
      TARGET_YAML="target: { rdma_srq_depth: $depth }"
      start_our_target rdma "$addr" "$dev" || { fail "$label" "$REASON"; return; }
      step "round $round rdma_srq_depth $depth: nvmf-bench randread 4k qd32 ${secs}s" timeout 300 "$b" \
        --transport rdma --traddr "$addr" --trsvcid "$PORT" --subnqn "$OUR_NQN" --rw=randread --bs=4k \
        --iodepth=32 --size=32M --time_based --runtime="$secs" --target-stats "$CTL" ||
        { fail "$label" "$REASON"; return; }
      { echo "round $round, rdma_srq_depth $depth (rxe, TCG-emulated VM):"; grep -iE 'iops|mrs|regions|registered' "$WORK/step.out"; echo; } >>"$OUT/report.txt"
      cp "$WORK/step.out" "$OUT/bench-r$round-srq$depth.txt"
      cp "$OUT/target.log" "$OUT/target-r$round-srq$depth.log"
      stop_our_target || { fail "$label" "$REASON"; return; }
      check_target_log || { fail "$label" "rdma_srq_depth $depth: $REASON"; return; }
    done
  done
  TARGET_YAML=
  cat "$OUT/report.txt"
  pass "$label"
}
need_rdma RXE_IP && srq_ab "$SCENARIO" "$RXE_IP"
