#!/usr/bin/env bash
# bench-suite-rdma-rxe: benchmark (issue #6): `nvmf-bench --suite --transport rdma` on rxe0's address:
# our target (1 then 2 threads, null and tmpfs-file namespaces) over NVMe/RDMA, with the raw-verbs
# RDMA WRITE/READ stream and SEND/RECV ping-pong and the local io_uring measured in the same run; the
# table goes to the run's summary. FAILs only on errors (I/O errors, failed runs, a run or baseline
# that moved nothing), never on speed.
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"

# Knobs: NVMF_VM_SUITE_RUNTIME (per NVMe run; baselines half; default 1s), NVMF_VM_SUITE_FILE
# (the tmpfs file namespace, default 32M: it is written in full first, slowly under TCG).
bench_suite_rdma() {
  local label=$1 addr=$2 b t rc rt=${NVMF_VM_SUITE_RUNTIME:-1s}
  teardown
  log "case $label: nvmf-bench --suite --transport rdma --traddr $addr"
  b=$(bench_bin) || { skip "$label" "$REASON"; return; }
  t=$(target_bin) || { skip "$label" "$REASON"; return; }
  # --suite starts the nvmf-target next to nvmf-bench.
  [ "$(dirname "$b")" = "$(dirname "$t")" ] ||
    { fail "$label" "nvmf-bench ($b) and nvmf-target ($t) are not in one directory"; return; }
  echo "+ [nvmf-bench --suite --transport rdma] $b --suite --transport rdma --traddr $addr --runtime $rt" >>"$STEPS"
  local t0=$SECONDS
  timeout 360 "$b" --suite --transport rdma --traddr "$addr" --runtime "$rt" \
    --suite-dir /dev/shm --suite-file-size "${NVMF_VM_SUITE_FILE:-32M}" >"$OUT/suite.txt" 2>"$OUT/suite.err"
  rc=$?
  cat "$OUT/suite.err" >>"$STEPS"
  echo "  -> exit $rc in $((SECONDS - t0)) s" >>"$STEPS"
  {
    echo "\$ nvmf-bench --suite --transport rdma --traddr $addr --runtime $rt (rxe, TCG-emulated VM with $(nproc) vCPUs; $((SECONDS - t0)) s)"
    cat "$OUT/suite.txt"
  } >"$OUT/report.txt"
  cat "$OUT/report.txt"
  if [ $rc = 124 ]; then fail "$label" "nvmf-bench --suite did not finish within 360 s"; return; fi
  if [ $rc != 0 ]; then
    fail "$label" "nvmf-bench --suite exited with $rc: $(grep -m1 'nvmf-bench --suite:.*\(error\|fail\|nothing\|no I/O\|:.*:\)' "$OUT/suite.err" | cut -c1-200)"
    return
  fi
  # Belt and braces: the exit status covers these; a table that says them is a failure too.
  if grep -qE 'FAILED|ERRORS' "$OUT/suite.txt"; then
    fail "$label" "the table reports a failure: $(grep -m1 -E 'FAILED|ERRORS' "$OUT/suite.txt" | cut -c1-200)"
    return
  fi
  grep -q 'raw-rdma send ping-pong' "$OUT/suite.txt" && grep -q 'raw-rdma write stream' "$OUT/suite.txt" ||
    { fail "$label" "the table has no raw-rdma baseline rows"; return; }
  pass "$label"
}

need_rdma RXE_IP && bench_suite_rdma "$SCENARIO" "$RXE_IP"
