#!/usr/bin/env bash
# The project's test command (README): host tests and a short fuzz run, then the VM suite (real
# soft-RDMA and the Linux NVMe-oF host/target inside a qemu VM).
#   scripts/test.sh            host tests, fuzz and the VM suite's CI tier (tests/vm/run.sh ci)
#   scripts/test.sh --full     the same with the VM suite's full tier (tests/vm/run.sh all: also
#                              the sanity checks, benchmarks, SRQ variants, faults on rxe and siw)
#   scripts/test.sh --host     host tests only (no VM)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}

if [ "$mode" = --host ]; then bash scripts/setup.sh; else bash scripts/setup.sh --vm; fi

echo "== build" >&2
cargo build --workspace --all-targets
# One package per invocation, as tests/vm/run.sh builds them (built together their shared
# dependencies get other features, and the VM suite would build the target again).
cargo build --release -p nvmf-target
cargo build --release -p nvmf-bench

echo "== Ceph test cluster (scripts/ceph-cluster.sh)" >&2
# One mon and one memstore OSD on 127.0.0.1, for the RBD namespaces' tests; stopped on exit.
export CEPH_DIR=${CEPH_DIR:-/tmp/nvmf-ceph-test}
NVMF_CEPH_CONF=$(bash scripts/ceph-cluster.sh start "$CEPH_DIR")
export NVMF_CEPH_CONF
trap 'bash scripts/ceph-cluster.sh stop "$CEPH_DIR"' EXIT

echo "== host tests (cargo test --workspace)" >&2
# The property tests draw their cases from a fixed seed here, so a run is repeatable (a plain
# `cargo test` draws a new one each time; PROPTEST_CASES=100000 explores further).
PROPTEST_RNG_SEED=${PROPTEST_RNG_SEED:-1764115200} cargo test --workspace
bash scripts/ceph-cluster.sh stop "$CEPH_DIR"
trap - EXIT

echo "== fuzz (10 s per target)" >&2
bash scripts/fuzz.sh --ci

[ "$mode" = --host ] && exit 0

tier=ci
[ "$mode" = --full ] && tier=all
echo "== VM suite ($tier tier)" >&2
bash tests/vm/run.sh "$tier"
