#!/usr/bin/env bash
# rdma-wire-rxe: the in-process NVMe/RDMA wire tests (target/tests/rdma_raw.rs, rdma_host.rs,
# rdma_access.rs) on rxe0: raw rdma_cm/verbs host against the daemon, bad private data and
# capsules, buffers and MRs back to idle; access control (no target region remotely accessible,
# a peer RDMA WRITE into the pool refused, host NQN refusal and discovery filtering over RDMA);
# rdma/tests/windows.rs: a memory window's key, once invalidated by the peer or locally, opens
# nothing (what the initiator relies on to open a buffer for one command).
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && rdma_wire "$SCENARIO" "$RXE_IP" rdma_raw rdma_host rdma_access transport_alloc windows
