#!/usr/bin/env bash
# kernel-host-rbd-rdma-rxe: the Linux host against OUR target serving a Ceph RBD image, over
# NVMe/RDMA (rxe) and then NVMe/TCP. A single-node cluster runs in the guest
# (scripts/ceph-cluster.sh: one mon, one memstore OSD on 127.0.0.1, the host's packages through the
# shared root). Namespace 2 is the 32 MiB image rbd/vm1: over RDMA fio writes and verifies it
# (4k), `rbd resize` to 48 MiB reaches the host's disk without reconnecting, over TCP fio writes
# and verifies 128k blocks, and the image read with `rbd export` (librbd, not through us) equals
# what the host reads from the disk. Then SIGTERM and no ERROR line in the target log.
# vm-needs: build rdma
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
REPO=$(cd "$(dirname "$0")/../../.." && pwd)

rbd_case() {
  local label=$1 conf dev rbd_dev end got rc
  teardown
  need_rdma RXE_IP || return
  step "start the test cluster" env CEPH_MEMSTORE_BYTES=268435456 bash "$REPO/scripts/ceph-cluster.sh" start "$WORK/ceph" ||
    { fail "$label" "$REASON"; return; }
  conf=$WORK/ceph/ceph.conf
  CEPH_UP=$WORK/ceph
  step "rbd create rbd/vm1" rbd -c "$conf" create --size 32 rbd/vm1 || { fail "$label" "$REASON"; return; }
  dev=$(vm_ramdisk $RAMDISK_MB) || { fail "$label" "vm_ramdisk $RAMDISK_MB failed"; return; }
  EXTRA_NAMESPACES="      - { nsid: 2, rbd: { pool: rbd, image: vm1, conf: $conf } }" \
    start_our_target rdma "$RXE_IP" "$dev" tcp; rc=$?
  [ $rc = 3 ] && { skip "$label" "$REASON"; return; }
  [ $rc = 0 ] || { fail "$label" "$REASON"; return; }

  host_connect rdma "$RXE_IP" "$PORT" "$OUR_NQN" || { fail "$label" "$REASON"; return; }
  rbd_dev=${DEV%n1}n2
  end=$((SECONDS + 15))
  until [ -b "$rbd_dev" ]; do
    [ $SECONDS -ge $end ] && { fail "$label" "no $rbd_dev (the RBD namespace) after connect"; return; }
    sleep 0.5
  done
  check_size "$rbd_dev" $((32 << 20)) || { fail "$label" "$REASON"; return; }
  fio_verify "$rbd_dev" 4k 16M || { fail "$label" "over rdma: $REASON"; return; }

  step "rbd resize rbd/vm1 to 48 MiB" rbd -c "$conf" resize --size 48 rbd/vm1 || { fail "$label" "$REASON"; return; }
  end=$((SECONDS + 20))
  until [ "$(blockdev --getsize64 "$rbd_dev" 2>/dev/null)" = $((48 << 20)) ]; do
    if [ $SECONDS -ge $end ]; then
      fail "$label" "$rbd_dev is $(blockdev --getsize64 "$rbd_dev") bytes 20 s after rbd resize to 48 MiB"; return
    fi
    sleep 0.5
  done
  log "the host sees the resized image: $rbd_dev is 48 MiB"
  host_disconnect "$OUR_NQN" || { fail "$label" "$REASON"; return; }

  host_connect tcp "$RXE_IP" "$PORT" "$OUR_NQN" || { fail "$label" "$REASON"; return; }
  rbd_dev=${DEV%n1}n2
  end=$((SECONDS + 15))
  until [ -b "$rbd_dev" ]; do
    [ $SECONDS -ge $end ] && { fail "$label" "no $rbd_dev over tcp"; return; }
    sleep 0.5
  done
  check_size "$rbd_dev" $((48 << 20)) || { fail "$label" "$REASON"; return; }
  fio_verify "$rbd_dev" 128k 16M || { fail "$label" "over tcp: $REASON"; return; }
  step "rbd export rbd/vm1" rbd -c "$conf" export --no-progress rbd/vm1 "$WORK/vm1.raw" || { fail "$label" "$REASON"; return; }
  step "read $rbd_dev" dd if="$rbd_dev" of="$WORK/host.raw" bs=1M iflag=direct status=none || { fail "$label" "$REASON"; return; }
  cmp "$WORK/vm1.raw" "$WORK/host.raw" >"$WORK/cmp.out" 2>&1 ||
    { fail "$label" "the image (rbd export) differs from what the host reads: $(head -c 200 "$WORK/cmp.out")"; return; }
  got=$(stat -c %s "$WORK/host.raw")
  log "rbd export and the host's read agree on $got bytes"
  host_disconnect "$OUR_NQN" || { fail "$label" "$REASON"; return; }
  stop_our_target || { fail "$label" "$REASON"; return; }
  check_target_log || { fail "$label" "$REASON"; return; }
  pass "$label"
}

CEPH_UP=
stop_cluster() { [ -z "$CEPH_UP" ] || bash "$REPO/scripts/ceph-cluster.sh" stop "$CEPH_UP" >/dev/null 2>&1; }
trap 'teardown; stop_cluster; cd / && rm -rf "$WORK"' EXIT
rbd_case "$SCENARIO"
