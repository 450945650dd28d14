//! NVMe/RDMA at the wire level, against the daemon in this process, with a raw rdma_cm/verbs
//! host built here: CM rejects and their private data, the accept reply, keyed SGL data in
//! both directions (RDMA READ and RDMA WRITE by the target), in-capsule data, bad capsules,
//! and that every buffer and memory region comes back after the connections end.
//!
//! Needs a real RDMA device: run it in the test VM (`tests/vm/vm.sh --rdma both`), once per
//! device, with `NVMF_TEST_RDMA_IP` set to the device's address (`$RXE_IP`, `$SIW_IP`; without
//! it `RXE_IP`, then `SIW_IP` is used). Without RDMA it prints "skipped: no RDMA device" and
//! passes, unless `NVMF_REQUIRE_RDMA=1` (the VM suite), where it fails.

#[path = "common/rdma.rs"]
mod rdma_common;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nvme::fabrics::{self, ConnectData, PropSize};
use nvme::identify::{cns, IdentifyCmd, IdentifyController};
use nvme::rdma::{CmReply, CmRequest};
use nvme::sgl::Sgl;
use nvme::{Sqe, Status};
use nvmf_target::daemon::Daemon;
use rdma::CmEventType;
use rdma_common::*;

const BLOCK: u64 = 4096;

#[test]
fn nvme_rdma_wire_protocol_against_the_daemon() {
    let Some(ip) = rdma_ip_or_skip() else {
        return;
    };
    // The address under test is one of this machine's RDMA addresses. The probe binds an
    // rdma_cm id to each address; in the VM, right after another scenario added or removed
    // RDMA links, siw has answered ENODEV for a few moments (seen once in ~100 runs; the
    // target's listener waits for it the same way), so look again for up to 10 s.
    let mut local = Vec::new();
    for _ in 0..20 {
        local = nvmf_target::transport::rdma::local_rdma_ipv4();
        if local
            .iter()
            .any(|a| IpAddr::V4(a.addr) == ip && !a.device.is_empty())
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert!(
        local
            .iter()
            .any(|a| IpAddr::V4(a.addr) == ip && !a.device.is_empty()),
        "{ip} not among the RDMA addresses {local:?} (looked for 10 s)"
    );
    let dir = std::env::temp_dir().join(format!("nvmf-rdma-raw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = format!(
        "listeners:\n  - {{ transport: rdma, address: {ip}, port: 4433 }}\n\
         subsystems:\n  - nqn: {NQN}\n    allow_any_host: true\n    namespaces:\n      \
         - {{ nsid: 1, path: {}, size: 16MiB, block_size: 4096 }}\n\
         target:\n  threads: 2\n  in_capsule_data: {IN_CAPSULE}\n  max_queue_depth: 128\n{}",
        dir.join("ns1.img").display(),
        srq_yaml()
    );
    let cfg = config::Config::from_yaml_str(&yaml, "rdma_raw test")
        .unwrap()
        .config;
    let daemon = Daemon::start(&cfg).expect("daemon with an RDMA listener starts");
    let addr = SocketAddr::new(ip, 4433);
    assert_eq!(daemon.rdma_addrs, vec![addr]);

    // ---- CM rejects carry NVMe/RDMA reject private data (nvmet's statuses) ----
    let admin = CmRequest {
        qid: 0,
        hrqsize: 32,
        hsqsize: 31,
        cntlid: 0,
    };
    // Private data shorter than 32 bytes. IB/RoCE carry a fixed-size REQ private data field,
    // padded with zeros, so there the target sees qid 0 with hsqsize 0; iWARP keeps the length.
    let short = &admin.encode()[..4];
    let want = if device_is_iwarp(addr) { 1 } else { 4 };
    assert_eq!(
        reject_status(open(addr, short, 16)),
        want,
        "short private data"
    );
    let mut bad_fmt = admin.encode();
    bad_fmt[0] = 1;
    assert_eq!(reject_status(open(addr, &bad_fmt, 16)), 2, "recfmt 1");
    let big_admin = CmRequest {
        hrqsize: 64,
        hsqsize: 63,
        ..admin
    };
    assert_eq!(
        reject_status(open(addr, &big_admin.encode(), 16)),
        4,
        "admin queue of 64"
    );
    let big_io = CmRequest {
        qid: 1,
        hrqsize: 1024,
        hsqsize: 1023,
        cntlid: 0,
    };
    assert_eq!(
        reject_status(open(addr, &big_io.encode(), 16)),
        4,
        "I/O queue beyond MQES"
    );
    let no_rq = CmRequest {
        hrqsize: 0,
        ..admin
    };
    assert_eq!(
        reject_status(open(addr, &no_rq.encode(), 16)),
        5,
        "hrqsize 0"
    );
    assert_eq!(
        reject_status(open(addr, &admin.encode(), 0)),
        7,
        "host serves no READs"
    );
    wait_released(&daemon);

    // ---- admin queue: accept reply, keyed Connect data (RDMA READ), registers ----
    let mut a = connect(addr, admin);
    let rep = CmReply::decode(&a.reply).expect("NVMe/RDMA accept private data");
    assert_eq!(rep.crqsize, 32, "crqsize = hsqsize + 1");
    let cntlid = a.nvme_connect(0, 31, fabrics::CNTLID_DYNAMIC);
    assert_ne!(cntlid, 0);
    let cid = a.cid();
    let cap = a
        .ok(&fabrics::property_get_sqe(cid, 0, PropSize::Eight), &[])
        .result
        .get();
    assert_eq!((cap & 0xffff) + 1, 128, "CAP.MQES + 1 = max_queue_depth");
    let cid = a.cid();
    let cc = fabrics::Cc::new(true, 0, 0, 0, 0, 6, 4).0 as u64;
    a.ok(
        &fabrics::property_set_sqe(cid, 0x14, cc, PropSize::Four),
        &[],
    );
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let cid = a.cid();
        let csts = a.ok(&fabrics::property_get_sqe(cid, 0x1c, PropSize::Four), &[]);
        if csts.result.get() & 1 == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "CSTS.RDY never set");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Identify Controller: 4 KiB to host memory by RDMA WRITE chained with the response.
    a.data_mr.fill(0, 4096, 0xEE).unwrap();
    let cid = a.cid();
    let id = IdentifyCmd {
        cns: cns::CTRL,
        cntid: 0,
        cnssid: 0,
        csi: 0,
        nsid: 0,
    }
    .to_sqe(cid, a.keyed(0, 4096).encode());
    a.ok(&id, &[]);
    let mut buf = vec![0u8; 4096];
    a.data_mr.read_at(0, &mut buf).unwrap();
    let idc = IdentifyController::decode(&buf).unwrap();
    assert_eq!(idc.cntlid.get(), cntlid);
    assert_ne!(idc.sgls.get() & (1 << 2), 0, "keyed SGLs (SGLS bit 2)");
    assert_ne!(
        idc.sgls.get() & (1 << 20),
        0,
        "in-capsule data (SGLS bit 20)"
    );
    assert_eq!(idc.ioccsz.get() as usize, (64 + IN_CAPSULE) / 16);
    assert_eq!(idc.maxcmd.get(), 128);

    // In-capsule data on the admin queue: its RECVs hold only the SQE (as nvmet's).
    let cid = a.cid();
    let mut sf = Sqe::new(nvme::opcode::admin::SET_FEATURES, cid);
    sf.cdw10 = u32::from(nvme::identify::feat::TIMESTAMP).into();
    sf.dptr = Sgl::InCapsule { offset: 0, len: 8 }.encode();
    let c = a.exec(&sf, &[]);
    assert_eq!(c.status(), Status::SGL_INVALID_OFFSET.dnr(), "{c:?}");

    // ---- I/O queue: in-capsule Connect, writes by RDMA READ and in-capsule, reads back ----
    let io = CmRequest {
        qid: 1,
        hrqsize: 32,
        hsqsize: 31,
        cntlid,
    };
    let mut q = connect(addr, io);
    assert_eq!(CmReply::decode(&q.reply).unwrap().crqsize, 32);
    let copied0 = sum(&daemon.poller_stats(), |s| {
        s.rdma.copied_bytes.load(Ordering::Relaxed)
    });
    let data = ConnectData::new([7; 16], cntlid, NQN, HOSTNQN).encode();
    let cid = q.cid();
    let sqe = fabrics::connect_sqe(
        cid,
        1,
        31,
        0,
        0,
        Sgl::InCapsule {
            offset: 0,
            len: 1024,
        },
    );
    q.ok(&sqe, &data);

    // 32 KiB written by the target's RDMA READ from host memory.
    let w = pattern(1, 32 * 1024);
    q.data_mr.write_at(0, &w).unwrap();
    let cid = q.cid();
    q.ok(
        &io_sqe(nvme::opcode::io::WRITE, cid, 8, 8, q.keyed(0, w.len())),
        &[],
    );
    // 4 KiB in-capsule at LBA 100.
    let w2 = pattern(2, 4096);
    let cid = q.cid();
    let sgl = Sgl::InCapsule {
        offset: 0,
        len: 4096,
    };
    q.ok(&io_sqe(nvme::opcode::io::WRITE, cid, 100, 1, sgl), &w2);
    let copied = sum(&daemon.poller_stats(), |s| {
        s.rdma.copied_bytes.load(Ordering::Relaxed)
    }) - copied0;
    // Stats are published every 50 ms: wait for them to include both in-capsule copies.
    let deadline = Instant::now() + TIMEOUT;
    let mut copied = copied;
    while copied < 1024 + 4096 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        copied = sum(&daemon.poller_stats(), |s| {
            s.rdma.copied_bytes.load(Ordering::Relaxed)
        }) - copied0;
    }
    assert_eq!(copied, 1024 + 4096, "in-capsule bytes copied");

    // Read both back by the target's RDMA WRITE into host memory.
    q.data_mr.fill(0, DATA, 0).unwrap();
    let cid = q.cid();
    q.ok(
        &io_sqe(nvme::opcode::io::READ, cid, 8, 8, q.keyed(0, w.len())),
        &[],
    );
    let cid = q.cid();
    q.ok(
        &io_sqe(nvme::opcode::io::READ, cid, 100, 1, q.keyed(40960, 4096)),
        &[],
    );
    let mut got = vec![0u8; w.len()];
    q.data_mr.read_at(0, &mut got).unwrap();
    assert!(
        got == w,
        "RDMA READ write / RDMA WRITE read round trip differs"
    );
    let mut got2 = vec![0u8; 4096];
    q.data_mr.read_at(40960, &mut got2).unwrap();
    assert!(got2 == w2, "in-capsule write read back differs");

    // A keyed SGL shorter than the transfer: rejected before any data moves.
    let cid = q.cid();
    let c = q.exec(
        &io_sqe(
            nvme::opcode::io::READ,
            cid,
            0,
            2,
            q.keyed(0, BLOCK as usize),
        ),
        &[],
    );
    assert_eq!(c.status(), Status::SGL_INVALID_DATA.dnr(), "{c:?}");
    // In-capsule data beyond the capsule size the target advertises.
    let cid = q.cid();
    let big = Sgl::InCapsule {
        offset: 0,
        len: (IN_CAPSULE + 4096) as u32,
    };
    let c = q.exec(&io_sqe(nvme::opcode::io::WRITE, cid, 0, 3, big), &[]);
    assert_eq!(c.status(), Status::SGL_INVALID_OFFSET.dnr(), "{c:?}");

    // A capsule shorter than an SQE ends the queue (nvmet: fatal error).
    q.send_raw(&[0u8; 32]);
    q.wait_event(CmEventType::Disconnected);
    drop(q);

    // The admin queue still works, then the host disconnects it.
    let cid = a.cid();
    a.ok(&fabrics::property_get_sqe(cid, 0x1c, PropSize::Four), &[]);
    a.id.disconnect().unwrap();
    a.wait_event(CmEventType::Disconnected);
    drop(a);

    wait_released(&daemon);
    let st = daemon.poller_stats();
    assert!(sum(&st, |s| s.rdma.commands.load(Ordering::Relaxed)) >= 14);
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
