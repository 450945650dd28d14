#!/usr/bin/env bash
# bad-input-rdma-siw: the live bad-input table over NVMe/RDMA on siw0 (rdma_bad_input: bad CM
# private data, reserved opcodes, bad SGLs, MDTS, LBA/NSID, queue overflow, wrong cntlid/qid,
# I/O before CC.EN, Property Set CAP, bogus rkeys) against our target while a good host runs
# nvmf-bench --verify=crc32c: every row passes, the good host sees no error, no panic.
# vm-needs: build rdma
# vm-timeout: 480
source "$(dirname "$0")/../lib.sh"
need_rdma SIW_IP && bad_input_rdma "$SCENARIO" "$SIW_IP"
