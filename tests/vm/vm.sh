#!/usr/bin/env bash
# vm.sh - run one shell command as root inside a throw-away qemu VM booting Debian 12's 6.1
# kernel, with this machine's root filesystem shared read-only (9p, tmpfs overlays via
# virtme-ng), so binaries built on the host run unchanged in the guest. The guest has real
# soft-RDMA (Soft-RoCE rxe, soft-iWARP siw) and the Linux NVMe-oF host and target (nvmet).
#
#   tests/vm/vm.sh [options] [--] 'command run by bash inside the VM'
#
# Options:
#   --rdma MODE    none (default) | rxe | siw | both: create soft-RDMA devices on dummy netdevs:
#                    rxe0 on 192.168.78.1, siw0 on 192.168.78.2 (see NVMF_VM_NET).
#                  Exported to the command: RXE_DEV/RXE_IP, SIW_DEV/SIW_IP, and RDMA_DEV/RDMA_IP
#                  (rxe when present, else siw).
#   --rw DIR       make host directory DIR writable from the guest (repeatable). Every other write
#                  in the guest lands in a tmpfs overlay and is thrown away.
#   --timeout S    wall-clock limit for the whole VM, boot included (default 900).
#   -v, --verbose  show the guest kernel console (boot log, oopses) on stderr.
#   -h, --help     this text.
#
# Exit status (distinct on purpose):
#   the command's own status  when the command ran (commands should avoid using 124 and 125);
#   124                       the VM hit --timeout;
#   125                       harness error: prerequisite missing (run scripts/vm-setup.sh), the VM
#                             did not boot, or guest-side setup (modules, RDMA devices) failed.
#
# In the guest: root, cwd = the caller's cwd (read-only unless under --rw; use /tmp or
# $VM_SCRATCH for scratch files), PATH as on the host, configfs mounted, lo up, no network to the
# outside (all traffic stays inside the guest), `ulimit -l unlimited` (siw charges every memory
# registration against RLIMIT_MEMLOCK, even for root; the guest default is 8 MiB).
# Shell functions available to the command (also exported to child bash scripts):
#   vm_ramdisk [MB]          load brd (RAM disk that keeps data), print /dev/ram0
#   vm_null_blk [GB]         load null_blk (discards data, fastest), print /dev/nullb0
#   nvmet_export NQN DEV TRTYPE ADDR [PORT]   export DEV through the kernel target (configfs)
#   nvmet_clear              remove every kernel-target port, subsystem and namespace
#   nvme_dev_for NQN         print the host block device (/dev/nvmeXnY) of a connected NQN
#   vm_wait_listen tcp|rdma ADDR PORT [SECONDS]   wait until someone listens there
#
# Environment: NVMF_VM_KERNEL (vmlinuz path; default: the newest /boot/vmlinuz-<series>.*-amd64 with
#   rdma_rxe), NVMF_VM_KERNEL_SERIES (6.1, the default, or 6.12: Debian 12's second kernel, with
#   NVMe in-band authentication; siw is built for 6.1 only, so 6.12 takes --rdma rxe or none),
#   NVMF_VM_MEM (default 3G), NVMF_VM_CPUS (2), NVMF_VM_ACCEL (auto|kvm|tcg),
#   NVMF_VM_NET (first three octets of the guest RDMA addresses, default 192.168.78),
#   NVMF_VM_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/nvmf-rs; holds siw-<kver>.ko).
set -u
set -o pipefail

die() { echo "vm.sh: $*" >&2; exit 125; }

NVMF_VM_MEM=${NVMF_VM_MEM:-3G}
NVMF_VM_CPUS=${NVMF_VM_CPUS:-2}
NVMF_VM_ACCEL=${NVMF_VM_ACCEL:-auto}
NVMF_VM_NET=${NVMF_VM_NET:-192.168.78}
NVMF_VM_CACHE=${NVMF_VM_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/nvmf-rs}
NVMF_VM_KERNEL_SERIES=${NVMF_VM_KERNEL_SERIES:-6.1}

RDMA=none
RW=()
TIMEOUT=900
VERBOSE=0
CMD=
while [ $# -gt 0 ]; do
  case $1 in
    --rdma) RDMA=${2:?--rdma needs a value}; shift 2 ;;
    --rdma=*) RDMA=${1#*=}; shift ;;
    --rw) RW+=("${2:?--rw needs a directory}"); shift 2 ;;
    --rw=*) RW+=("${1#*=}"); shift ;;
    --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift 2 ;;
    --timeout=*) TIMEOUT=${1#*=}; shift ;;
    -v|--verbose) VERBOSE=1; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; CMD="$*"; break ;;
    -*) die "unknown option '$1' (try --help)" ;;
    *) CMD="$*"; break ;;
  esac
done
[ -n "$CMD" ] || die "no command given (try --help)"
case $RDMA in none|rxe|siw|both) ;; *) die "--rdma must be none, rxe, siw or both (got '$RDMA')" ;; esac
[[ $TIMEOUT =~ ^[0-9]+$ ]] && [ "$TIMEOUT" -gt 0 ] || die "--timeout must be a positive number of seconds"

# ---------------- host-side prerequisites ----------------
SETUP_HINT="run scripts/vm-setup.sh as root"
command -v vng >/dev/null || die "virtme-ng (vng) not found: $SETUP_HINT"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found: $SETUP_HINT"

pick_kernel() {
  local k v
  if [ -n "${NVMF_VM_KERNEL:-}" ]; then echo "$NVMF_VM_KERNEL"; return 0; fi
  for k in $(ls /boot/vmlinuz-"$NVMF_VM_KERNEL_SERIES".*-amd64 2>/dev/null | sort -V -r); do
    v=${k#/boot/vmlinuz-}
    if compgen -G "/lib/modules/$v/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko*" >/dev/null; then
      echo "$k"
      return 0
    fi
  done
  return 1
}
KERNEL=$(pick_kernel) || die "no Debian $NVMF_VM_KERNEL_SERIES kernel with rdma_rxe in /boot: $SETUP_HINT"
[ -r "$KERNEL" ] || die "kernel image $KERNEL is not readable"
KVER=${KERNEL#/boot/vmlinuz-}
[ -d "/lib/modules/$KVER" ] || die "no /lib/modules/$KVER for $KERNEL"
SIW_KO=$NVMF_VM_CACHE/siw-$KVER.ko
if [ "$RDMA" = siw ] || [ "$RDMA" = both ]; then
  [ -s "$SIW_KO" ] || die "no $SIW_KO (siw.ko is built by the setup): $SETUP_HINT"
fi

if [ "$NVMF_VM_ACCEL" = auto ]; then
  # These hosts expose a nested "PVM" KVM (kvm_pvm) that only runs PVM-enabled guest kernels; a
  # stock Debian kernel never gets past its decompressor there. Use KVM only when it is a real
  # hardware KVM, else TCG (software emulation, ~40 s boot on 2 cores).
  if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ] &&
     { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
    NVMF_VM_ACCEL=kvm
  else
    NVMF_VM_ACCEL=tcg
  fi
fi

RW_ABS=()
for d in "${RW[@]}"; do
  [ -d "$d" ] || die "--rw $d: not a directory"
  RW_ABS+=("$(realpath "$d")")
done

# Per-run control directory, shared read-write with the guest: holds the guest script and the
# guest's report of how the command ended. Not under /tmp: the guest mounts an overlay there.
mkdir -p "$NVMF_VM_CACHE" || die "cannot create $NVMF_VM_CACHE"
CTL=$(mktemp -d "$NVMF_VM_CACHE/run.XXXXXX") || die "mktemp in $NVMF_VM_CACHE failed"
trap 'rm -rf "$CTL"' EXIT

# ---------------- the guest script ----------------
guest_helpers() {
cat <<'EOF'
vm_ramdisk() { # [MB=64] -> /dev/ram0; reloads brd when the current disk is smaller
  local mb=${1:-64} cur
  if [ -b /dev/ram0 ]; then
    cur=$(( $(blockdev --getsize64 /dev/ram0) / 1048576 ))
    if [ "$cur" -ge "$mb" ]; then echo /dev/ram0; return 0; fi
    rmmod brd || { echo "vm_ramdisk: /dev/ram0 is ${cur} MiB and busy" >&2; return 1; }
  fi
  modprobe brd rd_nr=1 rd_size=$((mb * 1024)) max_part=0 || return 1
  udevadm settle 2>/dev/null; [ -b /dev/ram0 ] || { echo "vm_ramdisk: no /dev/ram0" >&2; return 1; }
  echo /dev/ram0
}
vm_null_blk() { # [GB=4] -> /dev/nullb0
  [ -b /dev/nullb0 ] || modprobe null_blk nr_devices=1 gb=${1:-4} queue_mode=2 irqmode=0 || return 1
  echo /dev/nullb0
}
nvmet_export() { # NQN BLOCKDEV TRTYPE(tcp|rdma) TRADDR [TRSVCID=4420]
  local nqn=$1 dev=$2 tr=$3 addr=$4 svc=${5:-4420} N=/sys/kernel/config/nvmet s p id
  modprobe -a nvmet "nvmet-$tr" || return 1
  s=$N/subsystems/$nqn
  if [ ! -d "$s" ]; then
    mkdir "$s" && echo 1 >"$s/attr_allow_any_host" && mkdir "$s/namespaces/1" &&
      echo -n "$dev" >"$s/namespaces/1/device_path" && echo 1 >"$s/namespaces/1/enable" || return 1
  fi
  p=
  for id in "$N"/ports/*; do # reuse a port with the same address
    [ -d "$id" ] || continue
    if [ "$(cat "$id/addr_trtype")" = "$tr" ] && [ "$(cat "$id/addr_traddr")" = "$addr" ] &&
       [ "$(cat "$id/addr_trsvcid")" = "$svc" ]; then p=$id; break; fi
  done
  if [ -z "$p" ]; then
    id=1; while [ -e "$N/ports/$id" ]; do id=$((id + 1)); done; p=$N/ports/$id
    mkdir "$p" && echo "$tr" >"$p/addr_trtype" && echo ipv4 >"$p/addr_adrfam" &&
      echo "$addr" >"$p/addr_traddr" && echo "$svc" >"$p/addr_trsvcid" || return 1
  fi
  [ -e "$p/subsystems/$nqn" ] || ln -s "$s" "$p/subsystems/$nqn"
}
nvmet_clear() { # tear down every kernel-target object (ports first: they pin subsystems)
  local N=/sys/kernel/config/nvmet l p s n rc=0
  [ -d "$N" ] || return 0
  for l in "$N"/ports/*/subsystems/*; do [ -L "$l" ] && { rm -f "$l" || rc=1; }; done
  for p in "$N"/ports/*; do [ -d "$p" ] && { rmdir "$p" || rc=1; }; done
  for s in "$N"/subsystems/*; do
    [ -d "$s" ] || continue
    for n in "$s"/namespaces/*; do
      [ -d "$n" ] || continue
      echo 0 >"$n/enable"; rmdir "$n" || rc=1
    done
    for l in "$s"/allowed_hosts/*; do [ -L "$l" ] && rm -f "$l"; done
    rmdir "$s" || rc=1
  done
  return $rc
}
nvme_dev_for() { # NQN -> /dev/nvmeXnY (the multipath head node when CONFIG_NVME_MULTIPATH=y)
  local b
  for b in /sys/block/nvme*; do
    [[ $(basename "$b") =~ ^nvme[0-9]+n[0-9]+$ ]] || continue
    if [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$1" ]; then echo "/dev/$(basename "$b")"; return 0; fi
  done
  return 1
}
vm_wait_listen() { # tcp|rdma ADDR PORT [SECONDS=20] -> 0 once a listener is there
  local tr=$1 addr=$2 port=$3 end=$((SECONDS + ${4:-20}))
  while [ $SECONDS -lt $end ]; do
    case $tr in
      tcp) ss -Hltn "src $addr:$port" 2>/dev/null | grep -q . && return 0 ;;
      rdma) rdma resource show cm_id 2>/dev/null | grep -w LISTEN | grep -q "src-addr $addr:$port\b" && return 0 ;;
      *) echo "vm_wait_listen: unknown transport $tr" >&2; return 2 ;;
    esac
    sleep 0.5
  done
  return 1
}
export -f vm_ramdisk vm_null_blk nvmet_export nvmet_clear nvme_dev_for vm_wait_listen
EOF
}

guest_setup() { # shell code that prepares the guest; failures end the VM with 125
cat <<EOF
exec </dev/null
export VM_GUEST=1 PATH=$(printf %q "$PATH"):/usr/local/sbin:/usr/sbin:/sbin HOME=/root
export VM_SCRATCH=/tmp/vm-scratch; mkdir -p "\$VM_SCRATCH"
vm_fail() { echo "vm.sh(guest): \$*" >&2; dmesg | tail -20 >&2; echo 125 >$CTL/rc; exit 125; }
ulimit -l unlimited || vm_fail "ulimit -l unlimited"
modprobe configfs 2>/dev/null
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config || vm_fail "mount configfs"
ip link set lo up || vm_fail "ip link set lo up"
EOF
if [ "$RDMA" != none ]; then
cat <<EOF
modprobe -a ib_uverbs rdma_ucm dummy || vm_fail "modprobe ib_uverbs rdma_ucm dummy"
EOF
fi
if [ "$RDMA" = rxe ] || [ "$RDMA" = both ]; then
cat <<EOF
modprobe rdma_rxe || vm_fail "modprobe rdma_rxe"
ip link add rdma_rxe0 type dummy && ip addr add $NVMF_VM_NET.1/32 dev rdma_rxe0 &&
  ip link set rdma_rxe0 up || vm_fail "dummy netdev rdma_rxe0"
rdma link add rxe0 type rxe netdev rdma_rxe0 || vm_fail "rdma link add rxe0"
export RXE_DEV=rxe0 RXE_IP=$NVMF_VM_NET.1
EOF
fi
if [ "$RDMA" = siw ] || [ "$RDMA" = both ]; then
cat <<EOF
modprobe libcrc32c; grep -q '^siw ' /proc/modules || insmod $SIW_KO || vm_fail "insmod $SIW_KO"
ip link add rdma_siw0 type dummy && ip addr add $NVMF_VM_NET.2/32 dev rdma_siw0 &&
  ip link set rdma_siw0 up || vm_fail "dummy netdev rdma_siw0"
rdma link add siw0 type siw netdev rdma_siw0 || vm_fail "rdma link add siw0"
export SIW_DEV=siw0 SIW_IP=$NVMF_VM_NET.2
EOF
fi
if [ "$RDMA" != none ]; then
cat <<'EOF'
if [ -n "${RXE_DEV:-}" ]; then export RDMA_DEV=$RXE_DEV RDMA_IP=$RXE_IP; else export RDMA_DEV=$SIW_DEV RDMA_IP=$SIW_IP; fi
for d in ${RXE_DEV:-} ${SIW_DEV:-}; do
  ibv_devinfo -d "$d" 2>/dev/null | grep -q 'state:.*PORT_ACTIVE' || vm_fail "RDMA device $d is not PORT_ACTIVE"
done
EOF
fi
}

{
  echo '#!/bin/bash'
  echo '# ---- helpers (tests/vm/vm.sh) ----'
  guest_helpers
  echo '# ---- guest setup ----'
  guest_setup
  printf 'cd %q 2>/dev/null || cd /\n' "$PWD"
  echo "echo booted >$CTL/booted"
  echo '# ---- command ----'
  printf '( %s\n)\n' "$CMD"
  echo "echo \$? >$CTL/rc"
} >"$CTL/guest.sh"

VNG=(vng --run "$KERNEL" -m "$NVMF_VM_MEM" -p "$NVMF_VM_CPUS" --cwd / --user root --rwdir="$CTL")
[ "$NVMF_VM_ACCEL" = tcg ] && VNG+=(--disable-kvm)
[ "$VERBOSE" = 1 ] && VNG+=(--verbose)
for d in "${RW_ABS[@]}"; do VNG+=(--rwdir="$d"); done
VNG+=(--exec "bash $CTL/guest.sh")

# qemu reopens /proc/self/fd/1 and /proc/self/fd/2; were those regular files, it would write
# from offset 0 and clobber them. Hand it pipes (the two cats) whatever the caller redirects to.
{ timeout -k 15 "$TIMEOUT" "${VNG[@]}" </dev/null 2>&1 1>&3 3>&- | cat >&2 3>&-; } 3>&1 | cat
vng_rc=${PIPESTATUS[0]}

if [ "$vng_rc" = 124 ] || [ "$vng_rc" = 137 ]; then
  echo "vm.sh: VM timed out after ${TIMEOUT}s" >&2
  exit 124
fi
if [ ! -f "$CTL/booted" ]; then
  [ -f "$CTL/rc" ] && exit 125 # guest setup failed; vm_fail said why
  echo "vm.sh: the VM did not boot to the command (vng exit status $vng_rc; re-run with -v for the console)" >&2
  exit 125
fi
if [ ! -f "$CTL/rc" ]; then
  echo "vm.sh: the VM stopped before the command finished (vng exit status $vng_rc: guest crash or poweroff?)" >&2
  exit 125
fi
exit "$(cat "$CTL/rc")"
