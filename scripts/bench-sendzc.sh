#!/usr/bin/env bash
# Zero-copy send (io_uring SENDMSG_ZC) against a copying SENDMSG on loopback TCP, per message
# size (issue #40): the measurement behind nvmf-target's sends staying copying sends. Runs
# tests/examples/send_zc.rs (sender thread on CPU $SEND_CPU, receiver on CPU $RECV_CPU); see it
# for what each column means.
#
#   scripts/bench-sendzc.sh                     # builds the example first
#   SECS=1 ROUNDS=5 SIZES=4k,64k,1m scripts/bench-sendzc.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${NO_BUILD:-}" ] || cargo build --release -p nvmf-tests --example send_zc
exec build/release/examples/send_zc --secs "${SECS:-1}" --rounds "${ROUNDS:-5}" \
    --sizes "${SIZES:-4k,16k,64k,128k,1m}" --inflight "${INFLIGHT:-8}" \
    --send-cpu "${SEND_CPU:-0}" --recv-cpu "${RECV_CPU:-1}"
