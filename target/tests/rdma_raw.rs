//! NVMe/RDMA at the wire level, against the daemon in this process, with a raw rdma_cm/verbs
//! host built here: CM rejects and their private data, the accept reply, keyed SGL data in
//! both directions (RDMA READ and RDMA WRITE by the target), in-capsule data, bad capsules,
//! and that every buffer and memory region comes back after the connections end.
//!
//! Needs a real RDMA device: run it in the test VM (`tests/vm/vm.sh --rdma both`), once per
//! device, with `NVMF_TEST_RDMA_IP` set to the device's address (`$RXE_IP`, `$SIW_IP`; without
//! it `RXE_IP`, then `SIW_IP` is used). Without RDMA it prints "skipped: no RDMA device" and
//! passes, unless `NVMF_REQUIRE_RDMA=1` (the VM suite), where it fails.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::fabrics::{self, ConnectData, PropSize};
use nvme::identify::{cns, IdentifyCmd, IdentifyController};
use nvme::rdma::{CmReply, CmRequest};
use nvme::sgl::Sgl;
use nvme::{Cqe, Sqe, Status};
use nvmf_target::daemon::Daemon;
use nvmf_target::transport::rdma::RdmaPollerStats;
use rdma::{
    AccessFlags, CmEventType, CmId, ConnParam, Cq, EventChannel, Mr, Pd, Qp, QpInitAttr, RecvWr,
    SendWr, WcOpcode, WorkCompletion,
};

const TIMEOUT: Duration = Duration::from_secs(20);
const NQN: &str = "nqn.2026-11.io.nvmf-rs:rdma-raw";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:5a0c3f52-6d2b-4c1e-9b7a-1d2e3f405162";
const NRECV: usize = 32;
const DATA: usize = 64 * 1024;
const BLOCK: u64 = 4096;
/// `target.in_capsule_data` in the test configuration.
const IN_CAPSULE: usize = 8192;

fn rdma_ip() -> Option<IpAddr> {
    ["NVMF_TEST_RDMA_IP", "RXE_IP", "SIW_IP"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .map(|s| s.parse().expect("an IP address"))
}

/// Whether the device that routes to `addr` is iWARP.
fn device_is_iwarp(addr: SocketAddr) -> bool {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(8).unwrap();
    id.resolve_addr(None, addr, TIMEOUT).unwrap();
    expect_event(&ch, CmEventType::AddrResolved);
    let ctx = id.context().unwrap().expect("bound to a device");
    ctx.transport() == rdma::Transport::Iwarp
}

/// A host-side connection: QP, CQ, registered buffers, CM id.
struct Host {
    // Field order is drop order: the QP before the buffers its work requests name.
    qp: Qp,
    id: CmId,
    cq: Arc<Cq>,
    recv_mr: Mr,
    send_mr: Mr,
    /// Host memory the target reads from and writes to (the keyed SGL buffers).
    data_mr: Mr,
    _pd: Arc<Pd>,
    ch: EventChannel,
    reply: Vec<u8>,
    next_cid: u16,
}

enum Outcome {
    Connected(Box<Host>),
    Rejected { status: i32, data: Vec<u8> },
}

fn expect_event(ch: &EventChannel, want: CmEventType) -> rdma::CmEvent {
    let ev = ch
        .get_event(Some(TIMEOUT))
        .unwrap()
        .unwrap_or_else(|| panic!("timed out waiting for {want}"));
    assert_eq!(ev.event_type(), want, "status {}", ev.status());
    ev
}

fn open(addr: SocketAddr, pdata: &[u8], responder_resources: u8) -> Outcome {
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(7).unwrap();
    id.resolve_addr(None, addr, TIMEOUT).unwrap();
    expect_event(&ch, CmEventType::AddrResolved);
    id.resolve_route(TIMEOUT).unwrap();
    expect_event(&ch, CmEventType::RouteResolved);
    let ctx = id.context().unwrap().expect("bound to a device");
    let pd = Arc::new(Pd::new(&ctx).unwrap());
    let cq = Arc::new(Cq::new(&ctx, 256).unwrap());
    let qp = Qp::create(
        &id,
        &pd,
        &QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            max_send_wr: 64,
            max_recv_wr: NRECV as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            sq_sig_all: false,
        },
    )
    .unwrap();
    let recv_mr = Mr::alloc(&pd, NRECV * 16, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..NRECV {
        qp.post_recv(i as u64, &[recv_mr.sge(i * 16, 16).unwrap()])
            .unwrap();
    }
    let send_mr = Mr::alloc(&pd, 64 + IN_CAPSULE, AccessFlags::empty()).unwrap();
    let data_mr = Mr::alloc(
        &pd,
        DATA,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )
    .unwrap();
    id.connect(&ConnParam {
        private_data: pdata,
        responder_resources,
        initiator_depth: 0,
        flow_control: true,
        retry_count: 7,
        rnr_retry_count: 7,
    })
    .unwrap();
    let ev = ch
        .get_event(Some(TIMEOUT))
        .unwrap()
        .expect("an answer to the connect");
    match ev.event_type() {
        CmEventType::Established => Outcome::Connected(Box::new(Host {
            qp,
            id,
            cq,
            recv_mr,
            send_mr,
            data_mr,
            _pd: pd,
            reply: ev.private_data().to_vec(),
            ch,
            next_cid: 1,
        })),
        CmEventType::Rejected => Outcome::Rejected {
            status: ev.status(),
            data: ev.private_data().to_vec(),
        },
        other => panic!("connect ended with {other} (status {})", ev.status()),
    }
}

fn connect(addr: SocketAddr, req: CmRequest) -> Box<Host> {
    match open(addr, &req.encode(), 16) {
        Outcome::Connected(h) => h,
        Outcome::Rejected { status, data } => {
            panic!("{req:?} rejected: status {status}, data {data:?}")
        }
    }
}

/// The NVMe/RDMA reject status carried by a REJECTED event.
fn reject_status(o: Outcome) -> u16 {
    match o {
        Outcome::Connected(_) => panic!("connect accepted, expected a reject"),
        Outcome::Rejected { status, data } => {
            assert!(
                data.len() >= 4,
                "reject without NVMe/RDMA private data (status {status})"
            );
            assert_eq!(&data[..2], &[0, 0], "recfmt");
            u16::from_le_bytes([data[2], data[3]])
        }
    }
}

impl Host {
    fn keyed(&self, off: usize, len: usize) -> Sgl {
        Sgl::Keyed {
            addr: self.data_mr.addr() + off as u64,
            len: len as u32,
            key: self.data_mr.rkey(),
            invalidate: false,
        }
    }

    fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        self.next_cid
    }

    /// SENDs `bytes` as a capsule.
    fn send_raw(&self, bytes: &[u8]) {
        self.send_mr.write_at(0, bytes).unwrap();
        let sge = self.send_mr.sge(0, bytes.len()).unwrap();
        self.qp
            .post_send(&[SendWr::send(1_000_000, &[sge]).signaled()])
            .unwrap();
    }

    /// Sends a capsule (SQE plus in-capsule data) and returns the response.
    fn exec(&mut self, sqe: &Sqe, inline: &[u8]) -> Cqe {
        let mut capsule = sqe.encode().to_vec();
        capsule.extend_from_slice(inline);
        self.send_raw(&capsule);
        let deadline = Instant::now() + TIMEOUT;
        let (mut sent, mut cqe) = (false, None);
        let mut wc = [WorkCompletion::default()];
        while !sent || cqe.is_none() {
            assert!(
                Instant::now() < deadline,
                "no response to {sqe:?} (sent: {sent})"
            );
            if self.cq.poll(&mut wc).unwrap() == 0 {
                std::thread::sleep(Duration::from_micros(100));
                continue;
            }
            let [w] = &wc;
            assert!(w.is_ok(), "host work request failed: {w:?}");
            match w.opcode() {
                WcOpcode::Send => sent = true,
                WcOpcode::Recv => {
                    assert_eq!(w.byte_len(), 16, "response length");
                    let slot = w.wr_id() as usize;
                    let mut b = [0u8; 16];
                    self.recv_mr.read_at(slot * 16, &mut b).unwrap();
                    self.qp
                        .post_recv_list(&[RecvWr {
                            wr_id: slot as u64,
                            sges: &[self.recv_mr.sge(slot * 16, 16).unwrap()],
                        }])
                        .unwrap();
                    cqe = Some(Cqe::decode(&b).unwrap());
                }
                other => panic!("unexpected host completion {other:?}"),
            }
        }
        let cqe = cqe.unwrap();
        assert_eq!(cqe.cid(), sqe.cid(), "response to another command");
        cqe
    }

    fn ok(&mut self, sqe: &Sqe, inline: &[u8]) -> Cqe {
        let c = self.exec(sqe, inline);
        assert!(c.status().is_success(), "{sqe:?} failed: {:?}", c.status());
        c
    }

    /// Fabrics Connect with the data in host memory (keyed SGL: the target RDMA READs it).
    fn nvme_connect(&mut self, qid: u16, sqsize: u16, cntlid: u16) -> u16 {
        let data = ConnectData::new([7; 16], cntlid, NQN, HOSTNQN).encode();
        self.data_mr.write_at(0, &data).unwrap();
        let cid = self.cid();
        let sqe = fabrics::connect_sqe(cid, qid, sqsize, 0, 30_000, self.keyed(0, 1024));
        self.ok(&sqe, &[]).result.get() as u16
    }

    /// Waits for a CM event (e.g. DISCONNECTED after the target closed the queue).
    fn wait_event(&self, want: CmEventType) {
        expect_event(&self.ch, want);
    }
}

fn io_sqe(op: u8, cid: u16, lba: u64, blocks: u32, sgl: Sgl) -> Sqe {
    let mut s = Sqe::new(op, cid);
    s.nsid = 1.into();
    s.dptr = sgl.encode();
    s.cdw10 = (lba as u32).into();
    s.cdw11 = ((lba >> 32) as u32).into();
    s.cdw12 = (blocks - 1).into();
    s
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn sum<F: Fn(&RdmaPollerStats) -> u64>(stats: &[Arc<RdmaPollerStats>], f: F) -> u64 {
    stats.iter().map(|s| f(s)).sum()
}

/// Waits until the pollers report no connection, no buffer in use and only the pool regions.
fn wait_released(d: &Daemon) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let st = d.rdma_stats();
        let conns = sum(&st, |s| s.connections.load(Ordering::Relaxed) as u64);
        let bufs = sum(&st, |s| s.buffers_in_use.load(Ordering::Relaxed) as u64);
        // One pool region per poller that has served a connection on the device.
        let mrs = sum(&st, |s| s.mrs_registered.load(Ordering::Relaxed) as u64);
        if conns == 0 && bufs == 0 && mrs <= st.len() as u64 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not released: {conns} connections, {bufs} buffers, {mrs} memory regions"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

use std::sync::atomic::Ordering;

#[test]
fn nvme_rdma_wire_protocol_against_the_daemon() {
    let Some(ip) = rdma_ip() else {
        if std::env::var("NVMF_REQUIRE_RDMA").as_deref() == Ok("1") {
            panic!("NVMF_REQUIRE_RDMA=1 but no RDMA address (NVMF_TEST_RDMA_IP, RXE_IP, SIW_IP)");
        }
        eprintln!("skipped: no RDMA device (set NVMF_TEST_RDMA_IP to run this test)");
        return;
    };
    // The address under test is one of this machine's RDMA addresses.
    let local = nvmf_target::transport::rdma::local_rdma_ipv4();
    assert!(
        local
            .iter()
            .any(|a| IpAddr::V4(a.addr) == ip && !a.device.is_empty()),
        "{ip} not among the RDMA addresses {local:?}"
    );
    let dir = std::env::temp_dir().join(format!("nvmf-rdma-raw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = format!(
        "listeners:\n  - {{ transport: rdma, address: {ip}, port: 4433 }}\n\
         subsystems:\n  - nqn: {NQN}\n    allow_any_host: true\n    namespaces:\n      \
         - {{ nsid: 1, path: {}, size: 16MiB, block_size: 4096 }}\n\
         target:\n  threads: 2\n  in_capsule_data: {IN_CAPSULE}\n  max_queue_depth: 128\n",
        dir.join("ns1.img").display()
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
    let copied0 = sum(&daemon.rdma_stats(), |s| {
        s.copied_bytes.load(Ordering::Relaxed)
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
    let copied = sum(&daemon.rdma_stats(), |s| {
        s.copied_bytes.load(Ordering::Relaxed)
    }) - copied0;
    // Stats are published every 50 ms: wait for them to include both in-capsule copies.
    let deadline = Instant::now() + TIMEOUT;
    let mut copied = copied;
    while copied < 1024 + 4096 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        copied = sum(&daemon.rdma_stats(), |s| {
            s.copied_bytes.load(Ordering::Relaxed)
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
    let st = daemon.rdma_stats();
    assert!(sum(&st, |s| s.commands.load(Ordering::Relaxed)) >= 14);
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
