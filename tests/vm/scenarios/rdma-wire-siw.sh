#!/usr/bin/env bash
# rdma-wire-siw: the in-process NVMe/RDMA wire tests (target/tests/rdma_raw.rs) on siw0
# (iWARP: per-I/O READ sink registration).
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
need_rdma SIW_IP && rdma_wire "$SCENARIO" "$SIW_IP" rdma_raw
