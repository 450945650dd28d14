#!/usr/bin/env bash
# fio-engine-rdma-rxe: fio with the nvmf engine (libnvmf_fio.so) against our target over
# NVMe/RDMA on rxe0: fio/jobs/rdma-verify.fio (crc32c verify on one queue, then two), with the
# io_u buffers registered (0 copies per payload byte).
# vm-needs: build rdma
# vm-timeout: 480
source "$(dirname "$0")/../lib.sh"
need_rdma RXE_IP && fio_engine_vs_our_target "$SCENARIO" rdma "$RXE_IP"
