#!/usr/bin/env bash
# The main job on a fresh machine: build, start nvmf-target on its embedded default, and run
# nvmf-bench against it on every transport available here (RDMA rows say why they are missing).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -p nvmf-target -p nvmf-bench
exec build/release/nvmf-bench --demo "$@"
