#!/usr/bin/env bash
# A single-node Ceph test cluster: one ceph-mon and one ceph-osd (memstore) on 127.0.0.1 (or
# $CEPH_ADDR: a second cluster next to the first, e.g. 127.0.0.2), no manager, no
# authentication, pool `rbd`. Used by the host tests of RBD namespaces and by hand.
#   scripts/ceph-cluster.sh start [DIR]     installs the packages if needed, starts the daemons
#                                           (DIR defaults to $CEPH_DIR or /tmp/nvmf-ceph) and
#                                           prints the path of its ceph.conf
#   scripts/ceph-cluster.sh stop [DIR]      stops the daemons and removes DIR
#   scripts/ceph-cluster.sh osd-stop|osd-cont [DIR]   SIGSTOP / SIGCONT the OSD (a store that
#                                           stops answering, nothing lost: memstore)
#   scripts/ceph-cluster.sh ops [DIR]      the OSD's operations in flight (JSON): where a
#                                           client op that never completes waits
# Idempotent: `start` on a running cluster only prints its conf.
set -euo pipefail
cmd=${1:-start}
dir=${2:-${CEPH_DIR:-/tmp/nvmf-ceph}}
conf=$dir/ceph.conf
addr=${CEPH_ADDR:-127.0.0.1}

source "$(dirname "${BASH_SOURCE[0]}")/apt-lib.sh"
install_packages() {
  apt_ensure ceph-cluster ceph-mon ceph-osd ceph-common librbd-dev librados-dev uuid-runtime
}

pid_of() { cat "$dir/run/$1.pid" 2>/dev/null || true; }
alive() { local p; p=$(pid_of "$1"); [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

stop() {
  for d in osd.0 mon.a; do
    local p; p=$(pid_of "$d")
    if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
      kill -CONT "$p" 2>/dev/null || true
      kill "$p" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$p" 2>/dev/null || true
    fi
  done
  # Daemons whose pid files are gone (a directory removed under them).
  pkill -9 -f "ceph-(mon|osd) -c $conf" 2>/dev/null || true
  rm -rf "$dir"
}

start() {
  if alive mon.a && alive osd.0; then echo "$conf"; return; fi
  # Only the conf's path goes to stdout (callers capture it); the tools and daemons write to
  # stderr, and the daemons keep no descriptor of the caller's stdout.
  exec 3>&1 1>&2
  install_packages
  stop
  # The monitor's ports (msgr2 3300, msgr1 6789) on $addr: another cluster there would
  # answer our daemons with its own fsid.
  if ss -Hltn 2>/dev/null | awk '{print $4}' | grep -Eq "^(${addr//./\\.}|0\\.0\\.0\\.0|\\*|\\[::\\]):(3300|6789)\$"; then
    echo "ceph-cluster: a Ceph monitor already listens on port 3300 or 6789 (another test cluster? stop it: $0 stop DIR)" >&2
    exit 1
  fi
  mkdir -p "$dir"/{mon,osd0,run}
  local fsid; fsid=$(uuidgen)
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = $addr
public addr = $addr
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
osd objectstore = memstore
memstore device bytes = ${CEPH_MEMSTORE_BYTES:-2147483648}
osd data = $dir/osd\$id
mon data = $dir/mon
run dir = $dir/run
pid file = $dir/run/\$name.pid
log file = $dir/\$name.log
osd crush chooseleaf type = 0
mon warn on pool no redundancy = false
# A throw-away monitor on a build machine's disk: it refuses to start below 5% free by default
# (a disk full of build trees), and its store is a few MiB.
mon data avail crit = 1
osd pool default pg autoscale mode = off
# The read lease of the only OSD's PGs: osd_heartbeat_grace (20 s) x 3 = 60 s (0.8 by default:
# 16 s, renewed every half). Ceph 16 (Debian 12's) leaves a PG that outlived its lease "laggy"
# for good when it has no replica to renew it with (the OSD stopped and continued, as
# ceph/ceph-container#1682 reproduces; the recheck was fixed in Ceph 18): its client ops wait
# "for readable" forever. Seen here: osd-stop for 10 s on a busy machine parked a write in
# such a PG (dump_ops_in_flight, 'ops' below). A cluster with replicas renews through them;
# this one only needs a lease longer than a stop plus a renewal period.
osd pool default read lease ratio = 3
# The script puts the OSD into the CRUSH map itself: an OSD that does it at start sends monitor
# commands before it knows the cluster's fsid on a slow machine (a VM under emulation), gets
# 'wrong fsid', and exits.
osd crush update on start = false
osd class update on start = false
[mon]
admin socket = $dir/run/\$name.asok
[osd]
admin socket = $dir/run/\$name.asok
EOF
  (cd "$dir" && monmaptool --create --add a "$addr" --fsid "$fsid" monmap >/dev/null)
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap"
  ceph-mon -c "$conf" -i a </dev/null 3>&-
  # The OSD is registered under a uuid of its own and made with it (the manual deployment's
  # order), so the monitor never sees an OSD whose uuid it does not know.
  local id osd_uuid; osd_uuid=$(uuidgen)
  id=$(timeout 60 ceph -c "$conf" osd create "$osd_uuid")
  ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$osd_uuid" 2>/dev/null
  timeout 60 ceph -c "$conf" osd crush add "osd.$id" 1.0 root=default >/dev/null
  ceph-osd -c "$conf" -i "$id" </dev/null 3>&-
  timeout 60 ceph -c "$conf" osd pool create rbd 8
  # Up when a write reaches the OSD (started again if it stopped on its way up).
  for _ in $(seq 60); do
    alive osd.0 || ceph-osd -c "$conf" -i "$id" </dev/null 3>&- || true
    if timeout 10 rados -c "$conf" -p rbd put nvmf-ready /dev/null 2>/dev/null; then
      timeout 60 rbd -c "$conf" pool init rbd
      echo "$conf" >&3
      return
    fi
    sleep 0.5
  done
  echo "ceph-cluster: the OSD did not come up (logs in $dir)" >&2
  exit 1
}

case $cmd in
  start) start ;;
  stop) stop ;;
  osd-stop) kill -STOP "$(pid_of osd.0)" ;;
  osd-cont) kill -CONT "$(pid_of osd.0)" ;;
  ops) timeout 20 ceph -c "$conf" daemon osd.0 dump_ops_in_flight ;;
  *) echo "usage: $0 start|stop|osd-stop|osd-cont|ops [DIR]" >&2; exit 2 ;;
esac
