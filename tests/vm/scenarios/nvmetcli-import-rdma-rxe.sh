#!/usr/bin/env bash
# nvmetcli-import-rdma-rxe: every nvmetcli save file in config/tests/data/nvmetcli/ (saved by
# nvmetcli itself from this VM's Linux 6.1 target: nvmetcli-save-rdma-rxe) is converted with
# `nvmf-target import-nvmetcli`, the daemon is started on the result, and the Linux host
# connects to every (port, subsystem) pair the file exported, over TCP and RDMA, with the host
# NQN the subsystem allows, and reads from each namespace. The files' namespace paths are
# pointed at storage in this VM first (their scratch files; /dev/ram0 stays).
# vm-needs: build rdma
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
label=$SCENARIO
teardown
need_rdma RXE_IP || { skip "$label" "no rxe address"; exit 0; }
DATA=$(cd "$(dirname "$0")/../../../config/tests/data/nvmetcli" && pwd)
dev=$(vm_ramdisk 64) || { fail "$label" "no ramdisk"; exit 0; }
bin=$(target_bin) || { fail "$label" "$REASON"; exit 0; }
modprobe -a nvme-fabrics nvme-tcp nvme-rdma >>"$STEPS" 2>&1
# The host NQN to connect with: the one a subsystem's list names, else the VM's own.
HOSTS_ALLOWED=$(python3 -c '
import json, sys
for f in sys.argv[1:]:
    for s in json.load(open(f)).get("subsystems", []):
        for h in s.get("allowed_hosts", []):
            print(s["nqn"], h)' "$DATA"/*.json)
files=0
for json in "$DATA"/*.json; do
  name=$(basename "$json" .json)
  # Storage for the saved paths: scratch files of the save run become files here.
  sed -E "s#/tmp/vm-scratch/[^/\"]+/#$WORK/#g" "$json" >"$WORK/$name.json"
  for f in $(grep -o "$WORK/[^\"]*" "$WORK/$name.json" | sort -u); do truncate -s 32M "$f"; done
  step "import-nvmetcli $name" "$bin" import-nvmetcli "$WORK/$name.json" || { fail "$label" "$REASON"; exit 0; }
  cp "$WORK/step.out" "$OUT/$name.import.txt"
  "$bin" import-nvmetcli "$WORK/$name.json" >"$WORK/$name.yaml" 2>/dev/null
  cp "$WORK/$name.yaml" "$OUT/$name.yaml"
  env RUST_LOG=info NO_COLOR=1 "$bin" --config "$WORK/$name.yaml" --control-socket "$WORK/$name.sock" \
    >"$OUT/target-$name.log" 2>&1 &
  TARGET_PID=$!
  pairs=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for p in d.get("ports", []):
    a = p["addr"]
    for s in p.get("subsystems", []):
        print(a["trtype"], a["traddr"], a["trsvcid"], s)' "$WORK/$name.json")
  n=0
  while read -r tr addr svc nqn; do
    [ -n "$tr" ] || continue
    vm_wait_listen "$tr" "$addr" "$svc" 20 || { fail "$label" "$name: our target does not listen on $tr $addr:$svc"; exit 0; }
    host=$(awk -v n="$nqn" '$1 == n { print $2; exit }' <<<"$HOSTS_ALLOWED")
    hostarg=()
    [ -n "$host" ] && hostarg=(--hostnqn="$host")
    step "$name: nvme connect -t $tr -a $addr -s $svc -n $nqn ${hostarg[*]}" \
      nvme connect -t "$tr" -a "$addr" -s "$svc" -n "$nqn" "${hostarg[@]}" || { fail "$label" "$name: $REASON"; exit 0; }
    CONNECTED+=("$nqn")
    ctrl=""
    end=$((SECONDS + 10))
    while [ -z "$ctrl" ] && [ $SECONDS -lt $end ]; do
      for c in /sys/class/nvme/nvme*; do
        [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$nqn" ] && [ "$(cat "$c/transport")" = "$tr" ] && ctrl=$(basename "$c")
      done
      sleep 0.3
    done
    [ -n "$ctrl" ] || { fail "$label" "$name: no controller for $nqn over $tr"; exit 0; }
    nsdev=$(ls -d /sys/class/nvme/"$ctrl"/nvme*n* 2>/dev/null | head -n 1)
    nsdev=/dev/$(basename "${nsdev:-none}" | sed -E 's/c[0-9]+n/n/')
    end=$((SECONDS + 10))
    until [ -b "$nsdev" ] || [ $SECONDS -ge $end ]; do sleep 0.3; done
    step "$name: read 1 MiB from $nsdev" dd if="$nsdev" of=/dev/null bs=64k count=16 iflag=direct status=none ||
      { fail "$label" "$name: $REASON"; exit 0; }
    step "$name: nvme disconnect -n $nqn" nvme disconnect -n "$nqn" || { fail "$label" "$REASON"; exit 0; }
    CONNECTED=()
    echo "$name: $tr $addr:$svc $nqn ${host:+(host $host) }served to the Linux host" | tee -a "$OUT/report.txt"
    n=$((n + 1))
  done <<<"$pairs"
  [ $n -gt 0 ] || { fail "$label" "$name: no (port, subsystem) pair to connect to"; exit 0; }
  kill -TERM "$TARGET_PID"; wait "$TARGET_PID"; TARGET_PID=
  files=$((files + 1))
done
[ $files -ge 3 ] || { fail "$label" "only $files nvmetcli files (want at least 3)"; exit 0; }
pass "$label"
