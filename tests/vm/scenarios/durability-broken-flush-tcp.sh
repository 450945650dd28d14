#!/usr/bin/env bash
# durability-broken-flush-tcp: the crash-point checker catches a broken target (issue #36). The
# same run as durability-kernel-host-tcp's block backend, against an nvmf-target built with the
# test-only feature `test-noop-flush` (Flush completes without flushing, FUA writes lose their
# FUA; run.sh builds it into build/noflush, never over the real binary): `crashpoint check` must
# fail, naming the first lost write and the mark of the flush it was promised by.
# vm-needs: build noflush
# vm-timeout: 600
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/../durability-lib.sh"
trap 'teardown; lw_release; cd / && rm -rf "$WORK"' EXIT

[ -n "${NVMF_NOFLUSH_BIN:-}" ] && [ -x "$NVMF_NOFLUSH_BIN" ] ||
  { fail "$SCENARIO" "the broken target is not available: ${NVMF_NOFLUSH_NOTE:-NVMF_NOFLUSH_BIN unset}"; exit 0; }
NVMF_TARGET_BIN=$NVMF_NOFLUSH_BIN EXPECT_LOST=1 crashpoint_case "$SCENARIO" tcp 127.0.0.1 block &&
  pass "$SCENARIO"
