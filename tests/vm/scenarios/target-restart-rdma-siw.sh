#!/usr/bin/env bash
# target-restart-rdma-siw: our target (file namespace, NVMe/RDMA on siw0) SIGKILLed and restarted
# (same config and file) under two reconnecting hosts of our initiator (reconnect_check:
# reconnecting Namespace verified writes, ReconnectingQueue QD32 writes): both reconnect, the
# in-flight writes are resubmitted, every acknowledged write reads back, the restarted target's
# RDMA gauges return to idle and a fresh host passes io_check; killed for good, both hosts fail
# with ReconnectGaveUp within the policy's bound.
# vm-needs: build rdma
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
need_rdma SIW_IP && target_restart_rdma "$SCENARIO" "$SIW_IP"
rc_stop
