#!/usr/bin/env bash
# soak-randrw-nvmet-rdma-siw: soak-randrw-rdma-siw's run (nvmf-bench randrw 4k, 2 queues, QD16,
# crc32c verify, NVMF_VM_SOAK_SECS) against the Linux kernel target (nvmet on the RAM disk)
# instead of ours: when a long siw soak against our target ends with a dropped connection, this
# says whether the initiator and siw do the same without our target.
# vm-in-all: no
# vm-needs: build rdma
# vm-timeout: 420
source "$(dirname "$0")/../lib.sh"
need_rdma SIW_IP && soak_randrw "$SCENARIO" "$SIW_IP" kernel
