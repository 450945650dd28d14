#!/usr/bin/env bash
# link-drop-rdma-rxe: a network drop under NVMe/RDMA on rxe. What is dropped: the host end of a veth
# pair (ip link set ldh down); the target runs in its own network namespace on the other end
# (10.79.0.2, device rxet) and the hosts in the root namespace (10.79.0.1, device rxeh), so
# every RDMA packet crosses the veth and a down end really cuts the path. (The suite's own
# rxe0 has host and target on one address of a dummy netdev: traffic never leaves the guest's
# stack; the scenario first measures what downing such a netdev does, on a device and netdev of
# its own, and writes it to report.txt.) Checks: a plain host
# (nvmf-bench --io_timeout 3) fails with an error within its timeout; the target, hearing
# nothing, drops every controller after KATO (4 s) and its RDMA gauges return to idle; two
# reconnecting hosts (reconnect_check: reconnecting Namespace + ReconnectingQueue) recover after
# link up with 0 mismatches; a fresh host then passes io_check. NVMF_TEST_BREAK=no-link-drop
# leaves the link up (the teardown and plain-host checks must fail).
# vm-needs: build rdma
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
link_drop_rdma "$SCENARIO" rxe
rc_stop
