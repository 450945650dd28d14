# Gateway-group helpers for the gateway-* scenarios (sourced after lib.sh). The scenario sets
# GW_NQN, GW_GROUP, GW_IMAGE and GW_SERIAL; gw_cluster sets CONF.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
A_PID= B_PID= CEPH_UP=

# gw_cluster: the test cluster in the guest and the 32 MiB image GW_IMAGE (REASON on failure).
gw_cluster() {
  step "start the test cluster" env CEPH_MEMSTORE_BYTES=268435456 bash "$REPO/scripts/ceph-cluster.sh" start "$WORK/ceph" || return 1
  CONF=$WORK/ceph/ceph.conf
  CEPH_UP=$WORK/ceph
  step "rbd create rbd/$GW_IMAGE" rbd -c "$CONF" create --size 32 "rbd/$GW_IMAGE"
}

# gw_cfg NAME ADDR HOME CNTLID_MIN CNTLID_MAX [with-subsystems]: a gateway's file (only the
# one that seeds the group's configuration has subsystems).
gw_cfg() {
  {
    echo "listeners:"
    echo "  - { transport: tcp, address: $2, port: 4420 }"
    if [ "${6:-}" = with-subsystems ]; then
      echo "subsystems:"
      echo "  - nqn: $GW_NQN"
      echo "    allow_any_host: true"
      echo "    serial: $GW_SERIAL"
      echo "    namespaces:"
      echo "      - { nsid: 1, rbd: { pool: rbd, image: $GW_IMAGE, conf: $CONF } }"
    fi
    echo "target: { threads: 1, cntlid_min: $4, cntlid_max: $5 }"
    echo "gateway: { group: $GW_GROUP, name: $1, pool: rbd, conf: $CONF, ana_groups: $3 }"
  } >"$OUT/gw-$1.yaml"
}

# gw_start NAME ADDR LOG: start it (log appended), wait for its listener; sets GW_PID.
gw_start() {
  RUST_LOG=${RUST_LOG:-info} NO_COLOR=1 "$NVMF_TARGET_BIN" --config "$OUT/gw-$1.yaml" \
    --control-socket "$WORK/gw-$1.sock" >>"$3" 2>&1 &
  GW_PID=$!
  vm_wait_listen tcp "$2" 4420 30 || { REASON="gateway $1 does not listen on $2:4420: $(tail -n 1 "$3")"; return 1; }
}

# gw_up: gateway A on 127.0.0.1 (home of ANA group 1; its file seeds the group's
# configuration) and B on 127.0.0.2 (no subsystems in its file: it takes the group's), both
# started (A_PID, B_PID); 1 + REASON on failure.
gw_up() {
  gw_cfg gw-a 127.0.0.1 "[1]" 1 32767 with-subsystems
  gw_cfg gw-b 127.0.0.2 "[]" 32768 65519
  gw_start gw-a 127.0.0.1 "$OUT/gw-a.log" || return 1
  A_PID=$GW_PID
  gw_start gw-b 127.0.0.2 "$OUT/gw-b.log" || return 1
  B_PID=$GW_PID
  grep -q "took the group's configuration" "$OUT/gw-b.log" || { REASON="B did not take the group's configuration"; return 1; }
}

# gw_stop_both: SIGTERM A and B; 1 + REASON if one exits with an error.
gw_stop_both() {
  local p
  for p in $A_PID $B_PID; do kill -TERM "$p"; done
  for p in $A_PID $B_PID; do wait "$p" || { REASON="a gateway exited with status $? after SIGTERM"; A_PID= B_PID=; return 1; }; done
  A_PID= B_PID=
}

# gw_logs_clean: no ERROR line or panic in any gateway log.
gw_logs_clean() {
  local bad
  bad=$(grep -hE '(^|[[:space:]])ERROR([[:space:]:]|$)|panicked' "$OUT"/gw-*.log | head -n 1)
  [ -z "$bad" ] || { REASON="ERROR in a gateway's log: $(echo "$bad" | cut -c1-200)"; return 1; }
}

gw_cleanup() {
  for p in $A_PID $B_PID; do kill -KILL "$p" 2>/dev/null; done
  [ -z "$CEPH_UP" ] || bash "$REPO/scripts/ceph-cluster.sh" stop "$CEPH_UP" >/dev/null 2>&1
}
