#!/usr/bin/env bash
# kernel-host-reload-rdma-rxe: SIGHUP reload of our target under the Linux host over rdma: an added
# namespace appears on the host (AEN) and passes fio verify, a removed one disappears, a broken
# config is rejected with file:line while namespace 1 keeps serving.
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && kernel_host_reload "$SCENARIO" rdma "$RXE_IP"
