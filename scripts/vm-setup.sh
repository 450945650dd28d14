#!/usr/bin/env bash
# vm-setup.sh - install everything the VM test suite (tests/vm/) needs, as root, idempotently.
#
#   scripts/vm-setup.sh            # install / build what is missing; fast no-op when done
#   scripts/vm-setup.sh --force    # redo every step even if the stamp says it is done
#   scripts/vm-setup.sh --check    # only report whether setup is complete (exit 0/1)
#
# What it provides (Debian 12 "bookworm", amd64):
#   - qemu-system-x86 + virtme-ng (`vng`, from PyPI) to boot a throw-away VM that shares this
#     machine's root filesystem read-only;
#   - Debian's 6.1 kernel image (linux-image-amd64) for that VM: it carries nvmet, nvmet-tcp,
#     nvmet-rdma, nvme-tcp, nvme-rdma, rdma_rxe, brd, null_blk as modules;
#   - Debian 12's second kernel, 6.12 (linux-image-6.12.107+deb12-amd64-unsigned), for the
#     scenarios whose header says `vm-kernel: 6.12`: its host and nvmet have NVMe in-band
#     authentication (DH-HMAC-CHAP); those run on rxe only (siw is built for 6.1 alone);
#   - siw.ko (soft-iWARP), which Debian's 6.1 image does not ship: built out of tree from
#     linux-source-6.1 against linux-headers, cached under $NVMF_VM_CACHE;
#   - the peers and tools the scenarios drive: rdma-core, ibverbs-utils, rdmacm-utils, perftest,
#     nvme-cli, fio, busybox-static, kmod, iproute2.
#
# Environment: NVMF_VM_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/nvmf-rs).
# Exit status: 0 = ready; 1 = a step failed (the message says which).
set -u
set -o pipefail

NVMF_VM_CACHE=${NVMF_VM_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/nvmf-rs}
STAMP=$NVMF_VM_CACHE/vm-setup.stamp
# Bump when the package list or the siw build changes, so old stamps are not trusted.
SETUP_VERSION=2

APT_PACKAGES=(
  # qemu-system-x86 (bookworm: 7.2) conflicts with the newer backported qemu-utils these images
  # ship. Pinning qemu-utils and qemu-system-common to bookworm (a downgrade, hence
  # --allow-downgrades below) lets apt resolve everything in one transaction.
  qemu-system-x86 qemu-utils/bookworm qemu-system-common/bookworm
  linux-image-amd64 linux-headers-amd64 linux-source-6.1
  linux-image-6.12.107+deb12-amd64-unsigned
  make gcc xz-utils
  busybox-static kmod iproute2
  rdma-core ibverbs-utils ibverbs-providers libibverbs-dev librdmacm-dev rdmacm-utils perftest
  nvme-cli fio
  dmsetup xfsprogs e2fsprogs
)
# Binaries whose presence the fast path checks (one per package that matters).
KEY_BINARIES=(qemu-system-x86_64 vng nvme fio rdma ibv_devinfo rping ib_write_bw busybox modinfo ip
  dmsetup mkfs.xfs xfs_repair mkfs.ext4)

log() { echo "vm-setup: $*" >&2; }
die() { echo "vm-setup: ERROR: $*" >&2; exit 1; }

# Newest installed Debian 6.1 (or $1) *-amd64 kernel whose module tree has rdma_rxe (prints the
# version).
kernel_version() {
  local k v
  for k in $(ls /boot/vmlinuz-"${1:-6.1}".*-amd64 2>/dev/null | sort -V -r); do
    v=${k#/boot/vmlinuz-}
    if compgen -G "/lib/modules/$v/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko*" >/dev/null; then
      echo "$v"
      return 0
    fi
  done
  return 1
}

siw_path() { echo "$NVMF_VM_CACHE/siw-$1.ko"; }

# Everything the stamp promises, checked cheaply.
check_ready() {
  local b kv
  [ -f "$STAMP" ] || { echo "no stamp $STAMP"; return 1; }
  [ "$(sed -n 's/^version=//p' "$STAMP")" = "$SETUP_VERSION" ] || { echo "stamp is from another setup version"; return 1; }
  for b in "${KEY_BINARIES[@]}"; do
    command -v "$b" >/dev/null || { echo "missing binary: $b"; return 1; }
  done
  kv=$(kernel_version) || { echo "no /boot/vmlinuz-6.1.*-amd64 with rdma_rxe"; return 1; }
  kernel_version 6.12 >/dev/null || { echo "no /boot/vmlinuz-6.12.*-amd64 with rdma_rxe"; return 1; }
  [ -r "/boot/vmlinuz-$kv" ] || { echo "/boot/vmlinuz-$kv not readable"; return 1; }
  [ -s "$(siw_path "$kv")" ] || { echo "no siw.ko for $kv in $NVMF_VM_CACHE"; return 1; }
  return 0
}

install_packages() {
  export DEBIAN_FRONTEND=noninteractive
  local lock=(-o DPkg::Lock::Timeout=900)
  log "apt-get update"
  apt-get "${lock[@]}" update -qq || die "apt-get update failed"
  log "apt-get install ${APT_PACKAGES[*]}"
  apt-get "${lock[@]}" install -y -q --no-install-recommends --allow-downgrades "${APT_PACKAGES[@]}" \
    >"$NVMF_VM_CACHE/apt-install.log" 2>&1 ||
    { tail -30 "$NVMF_VM_CACHE/apt-install.log" >&2; die "apt-get install failed (log: $NVMF_VM_CACHE/apt-install.log)"; }
}

install_vng() {
  if command -v vng >/dev/null; then return 0; fi
  log "pip install virtme-ng"
  python3 -m pip install -q virtme-ng || die "pip install virtme-ng failed"
  hash -r
  command -v vng >/dev/null || die "virtme-ng installed but 'vng' is not on PATH ($PATH)"
}

build_siw() { # $1 = kernel version
  local kv=$1 out src b dir
  out=$(siw_path "$kv")
  [ -s "$out" ] && return 0
  [ -d "/lib/modules/$kv/build" ] || die "no /lib/modules/$kv/build: install linux-headers-$kv"
  src=$(ls /usr/src/linux-source-*.tar.xz 2>/dev/null | sort -V | tail -1)
  [ -n "$src" ] || die "no /usr/src/linux-source-*.tar.xz: install linux-source-6.1"
  b=$(mktemp -d /tmp/nvmf-siw.XXXXXX) || die "mktemp failed"
  log "building siw.ko for $kv from $src"
  tar -C "$b" -xf "$src" --strip-components=1 --wildcards '*/drivers/infiniband/sw/siw/*' ||
    { rm -rf "$b"; die "extracting drivers/infiniband/sw/siw from $src failed"; }
  dir=$b/drivers/infiniband/sw/siw
  if ! make -C "/lib/modules/$kv/build" M="$dir" CONFIG_RDMA_SIW=m modules >"$b/build.log" 2>&1; then
    tail -40 "$b/build.log" >&2
    rm -rf "$b"
    die "building siw.ko failed"
  fi
  # Must match the kernel it will be loaded into.
  [ "$(modinfo -F vermagic "$dir/siw.ko" | cut -d' ' -f1)" = "$kv" ] ||
    { rm -rf "$b"; die "built siw.ko has the wrong vermagic"; }
  strip --strip-debug -o "$out.tmp" "$dir/siw.ko" && mv "$out.tmp" "$out" ||
    { rm -rf "$b"; die "storing $out failed"; }
  rm -rf "$b"
  log "built $out"
}

main() {
  local mode=setup
  case ${1:-} in
    --force) mode=force ;;
    --check) mode=check ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    "") ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac

  local why
  if why=$(check_ready); then
    [ "$mode" = force ] || { log "already set up (kernel $(kernel_version), stamp $STAMP)"; exit 0; }
  else
    [ "$mode" = check ] && { log "not set up: $why"; exit 1; }
    log "setting up: $why"
  fi
  [ "$mode" = check ] && exit 0

  [ "$(id -u)" = 0 ] || die "must run as root (apt-get, /boot)"
  mkdir -p "$NVMF_VM_CACHE" || die "cannot create $NVMF_VM_CACHE"
  local t0=$SECONDS kv
  [ "$mode" = force ] && rm -f "$STAMP" "$NVMF_VM_CACHE"/siw-*.ko
  install_packages
  install_vng
  kv=$(kernel_version) || die "no /boot/vmlinuz-6.1.*-amd64 whose modules include rdma_rxe after install"
  build_siw "$kv"
  printf 'version=%s\nkernel=%s\ndate=%s\n' "$SETUP_VERSION" "$kv" "$(date -u +%FT%TZ)" >"$STAMP"
  why=$(check_ready) || die "setup finished but the check still fails: $why"
  log "done in $((SECONDS - t0)) s (kernel $kv, siw $(siw_path "$kv"))"
}

main "$@"
