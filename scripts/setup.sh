#!/usr/bin/env bash
# Installs what building and running nvmf-rs needs on Debian 12 (idempotent; root or sudo).
#   scripts/setup.sh          build dependencies (libibverbs/librdmacm and librbd/librados
#                             headers, libclang 14, fio and its 3.33 source for the nvmf-fio
#                             engine's headers)
#   scripts/setup.sh --vm     also the VM suite's dependencies (qemu, 6.1 kernel, virtme-ng, ...)
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/apt-lib.sh
apt_ensure setup pkg-config libibverbs-dev librdmacm-dev libibverbs1 librdmacm1 ibverbs-providers \
  libclang1-14 libclang-common-14-dev gcc iproute2 librbd-dev librados-dev libssl-dev fio
# fio has no -dev package: the nvmf-fio engine builds against Debian's fio 3.33 source tree.
bash scripts/fio-source.sh
if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found: install a Rust toolchain >= 1.85 (rustup) first" >&2
  exit 1
fi
# cargo-fuzz for scripts/fuzz.sh (the fuzz targets build with the nightly toolchain that comes
# with the machine image; cargo-fuzz itself builds with stable).
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "setup: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --version 0.13.2 --locked --quiet
fi
if [ "${1:-}" = --vm ]; then
  bash scripts/vm-setup.sh
fi
