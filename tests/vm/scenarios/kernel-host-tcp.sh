#!/usr/bin/env bash
# kernel-host-tcp: the Linux NVMe/TCP host against OUR target (nvmf-target) on a
# 64 MiB brd ramdisk: discover, connect, size check, fio write+verify (4k, then 128k), disconnect,
# SIGTERM, and no ERROR line in the target log. A second namespace is `read_only: true`: the host
# must see it read-only and fail a write to it (issue #19). Namespace 3 is a null_blk that takes
# discards and 4 a file: DLFEAT per backend, and the host's blkdiscard reaches the null_blk as
# discards, not writes (check_deallocate). NVMF_TEST_BREAK=wrong-address connects to a
# wrong port on purpose (the check must then FAIL). The target receives and sends every NVMe/TCP
# byte through its io_uring socket ring (`tcp_receive: io_uring` refuses to start without it,
# `tcp_send: io_uring` sends through it even for one connection): the ring path on Linux 6.1.
# vm-needs: build
# vm-timeout: 900
source "$(dirname "$0")/../lib.sh"
TARGET_YAML="target: { tcp_receive: io_uring, tcp_send: io_uring }" RO_NS=1 \
  kernel_host_vs_our_target "$SCENARIO" tcp 127.0.0.1
