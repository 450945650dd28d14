#!/usr/bin/env bash
# nvmetcli-save-rdma-rxe: builds a Linux kernel target (nvmet) configuration with the features
# `nvmf-target import-nvmetcli` must carry over or name (two subsystems, allowed hosts,
# allow_any_host, serial/model, block-device and file namespaces with uuid/nguid, a disabled
# namespace, buffered I/O, TCP and RDMA ports, a port serving one subsystem, a port serving none,
# a port parameter) and two smaller ones, saves each with nvmetcli's own save (the `nvmet`
# Python module of an nvmetcli checkout named by NVMF_VM_NVMETCLI_DIR) into the report dir:
# nvmetcli-saved.json (all of it), nvmetcli-tcp.json (one TCP port, one subsystem with a host
# list), nvmetcli-rdma.json (one RDMA port, an any-host subsystem). config/tests/data/nvmetcli/
# holds what this scenario saved (linux-6.1-{rxe,tcp,rdma}.json); nvmetcli-import-rdma-rxe
# serves them. Not in `all`: it produces data, it checks nothing of ours.
# vm-in-all: no
# vm-needs: rdma
# vm-timeout: 300
source "$(dirname "$0")/../lib.sh"
label=$SCENARIO
teardown
[ -n "${NVMF_VM_NVMETCLI_DIR:-}" ] && [ -f "$NVMF_VM_NVMETCLI_DIR/nvmet/nvme.py" ] ||
  { fail "$label" "NVMF_VM_NVMETCLI_DIR must name an nvmetcli checkout (with nvmet/nvme.py)"; exit 0; }
need_rdma RXE_IP || { skip "$label" "no rxe address"; exit 0; }
N=/sys/kernel/config/nvmet
modprobe -a nvmet nvmet-tcp nvmet-rdma || { fail "$label" "modprobe nvmet failed"; exit 0; }
dev=$(vm_ramdisk 64) || { fail "$label" "no ramdisk"; exit 0; }
truncate -s 32M "$WORK/file-ns.img" "$WORK/file-ns2.img"
A=nqn.2014-08.org.nvmexpress:nvmf-rs-import-a
B=testnqn
HOST=nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427
set -e
mkdir "$N/hosts/$HOST"
mkdir "$N/subsystems/$A"
echo 0 >"$N/subsystems/$A/attr_allow_any_host"
ln -s "$N/hosts/$HOST" "$N/subsystems/$A/allowed_hosts/$HOST"
echo IMPORTA0001 >"$N/subsystems/$A/attr_serial"
[ -e "$N/subsystems/$A/attr_model" ] && echo "nvmf-rs import test" >"$N/subsystems/$A/attr_model"
mkdir "$N/subsystems/$A/namespaces/1"
echo -n "$dev" >"$N/subsystems/$A/namespaces/1/device_path"
echo 6a0d1a1c-5b3e-4c2f-9d8e-7f6a5b4c3d2e >"$N/subsystems/$A/namespaces/1/device_uuid"
echo 1 >"$N/subsystems/$A/namespaces/1/enable"
mkdir "$N/subsystems/$A/namespaces/2"
echo -n "$WORK/file-ns.img" >"$N/subsystems/$A/namespaces/2/device_path"
echo 1 >"$N/subsystems/$A/namespaces/2/buffered_io"
echo 1 >"$N/subsystems/$A/namespaces/2/enable"
mkdir "$N/subsystems/$A/namespaces/3"
echo -n "$WORK/file-ns2.img" >"$N/subsystems/$A/namespaces/3/device_path"
mkdir "$N/subsystems/$B"
echo 1 >"$N/subsystems/$B/attr_allow_any_host"
mkdir "$N/subsystems/$B/namespaces/10"
echo -n "$WORK/file-ns2.img" >"$N/subsystems/$B/namespaces/10/device_path"
# The scratch directory is tmpfs, which takes no O_DIRECT on 6.1: file namespaces go buffered.
echo 1 >"$N/subsystems/$B/namespaces/10/buffered_io"
echo 1 >"$N/subsystems/$B/namespaces/10/enable"
port() { # ID TRTYPE ADDR SVC SUBSYSTEM...
  local p=$N/ports/$1 s
  mkdir "$p"
  echo "$2" >"$p/addr_trtype"; echo ipv4 >"$p/addr_adrfam"; echo "$3" >"$p/addr_traddr"; echo "$4" >"$p/addr_trsvcid"
  shift 4
  for s in "$@"; do ln -s "$N/subsystems/$s" "$p/subsystems/$s"; done
}
port 1 tcp 127.0.0.1 4420 "$A" "$B"
port 2 rdma "$RXE_IP" 4420 "$A"
[ -e "$N/ports/2/param_inline_data_size" ] && echo 16384 >"$N/ports/2/param_inline_data_size" || true
port 3 tcp 127.0.0.1 4421
set +e
save() { # FILE
  step "nvmetcli save $1" python3 -c "import sys; sys.path.insert(0, sys.argv[1]); from nvmet import nvme; nvme.Root().save_to_file(sys.argv[2])" \
    "$NVMF_VM_NVMETCLI_DIR" "$OUT/$1" || return 1
  log "saved $1: $(wc -c <"$OUT/$1") bytes"
}
save nvmetcli-saved.json || { fail "$label" "$REASON"; exit 0; }
nvmet_clear
# Two more: one TCP port serving one subsystem whose host list names the host NQN the import
# scenario connects with; one RDMA port serving an any-host subsystem.
set -e
C=nqn.2014-08.org.nvmexpress:nvmf-rs-import-tcp
H2=nqn.2014-08.org.nvmexpress:uuid:5d1c9a2e-3f4b-4c6d-8e7f-a0b1c2d3e4f5
mkdir "$N/hosts/$H2" "$N/subsystems/$C"
echo 0 >"$N/subsystems/$C/attr_allow_any_host"
ln -s "$N/hosts/$H2" "$N/subsystems/$C/allowed_hosts/$H2"
mkdir "$N/subsystems/$C/namespaces/1"
echo -n "$dev" >"$N/subsystems/$C/namespaces/1/device_path"
echo 1 >"$N/subsystems/$C/namespaces/1/enable"
port 5 tcp 127.0.0.1 4420 "$C"
set +e
save nvmetcli-tcp.json || { fail "$label" "$REASON"; exit 0; }
nvmet_clear
set -e
R=nqn.2014-08.org.nvmexpress:nvmf-rs-import-rdma
mkdir "$N/subsystems/$R"
echo 1 >"$N/subsystems/$R/attr_allow_any_host"
mkdir "$N/subsystems/$R/namespaces/7"
echo -n "$dev" >"$N/subsystems/$R/namespaces/7/device_path"
echo 1 >"$N/subsystems/$R/namespaces/7/enable"
port 6 rdma "$RXE_IP" 4420 "$R"
set +e
save nvmetcli-rdma.json || { fail "$label" "$REASON"; exit 0; }
nvmet_clear
pass "$label"
