#!/usr/bin/env bash
# rdma-wire-siw: the in-process NVMe/RDMA wire tests (target/tests/rdma_raw.rs, rdma_access.rs,
# rdma/tests/windows.rs: siw has no memory windows and says so)
# on siw0 (iWARP: per-I/O READ sink registration; a stale sink key is refused).
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
need_rdma SIW_IP && rdma_wire "$SCENARIO" "$SIW_IP" rdma_raw rdma_access transport_alloc windows
