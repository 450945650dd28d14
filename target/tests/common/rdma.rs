//! A raw rdma_cm/verbs NVMe/RDMA host for the in-process RDMA tests (rdma_raw.rs,
//! rdma_access.rs): CM connect with NVMe/RDMA private data, capsules over SEND/RECV, keyed SGL
//! buffers the target reads and writes, and the daemon's RDMA counters.
//!
//! Included with `#[path = "common/rdma.rs"] mod rdma_common;` (not through `common/mod.rs`,
//! which installs the allocation-counting allocator).
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::fabrics::{self, ConnectData, PropSize};
use nvme::rdma::CmRequest;
use nvme::sgl::Sgl;
use nvme::{Cqe, Sqe};
use nvmf_target::daemon::Daemon;
use nvmf_target::transport::conns::PollerStats;
use nvmf_target::transport::rdma::RegionKind;
use rdma::active::{self, ConnectError};
use rdma::{
    AccessFlags, CmEventType, CmId, ConnParam, Cq, EventChannel, Mr, Pd, Qp, QpInitAttr, RecvWr,
    SendWr, WcOpcode, WorkCompletion,
};

pub const TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`Host::exec`] waits on iWARP before it nudges the target's receive stream.
pub const NUDGE_AFTER: Duration = Duration::from_secs(1);
/// The work request id of that nudge (a zero-length RDMA WRITE).
const NUDGE_WR_ID: u64 = 1_000_001;
pub const NQN: &str = "nqn.2026-11.io.nvmf-rs:rdma-raw";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:5a0c3f52-6d2b-4c1e-9b7a-1d2e3f405162";
pub const NRECV: usize = 32;
pub const DATA: usize = 64 * 1024;
/// `target.in_capsule_data` in the test configuration.
pub const IN_CAPSULE: usize = 8192;

pub fn rdma_ip() -> Option<IpAddr> {
    ["NVMF_TEST_RDMA_IP", "RXE_IP", "SIW_IP"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .map(|s| s.parse().expect("an IP address"))
}

/// The RDMA address under test, or None when the test is to be skipped (it prints so); with
/// `NVMF_REQUIRE_RDMA=1` (the VM suite) a missing address fails the test instead. Also sends
/// the in-process daemon's log (`RUST_LOG`, default `warn`) to the test's output, so a failed
/// test in the VM suite's steps.log shows what the target said.
pub fn rdma_ip_or_skip() -> Option<IpAddr> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
    let Some(ip) = rdma_ip() else {
        if std::env::var("NVMF_REQUIRE_RDMA").as_deref() == Ok("1") {
            panic!("NVMF_REQUIRE_RDMA=1 but no RDMA address (NVMF_TEST_RDMA_IP, RXE_IP, SIW_IP)");
        }
        eprintln!("skipped: no RDMA device (set NVMF_TEST_RDMA_IP to run this test)");
        return None;
    };
    Some(ip)
}

/// Whether the device that routes to `addr` is iWARP.
pub fn device_is_iwarp(addr: SocketAddr) -> bool {
    let ch = EventChannel::new().unwrap();
    let (_id, ctx) = active::resolve(&ch, 8, addr, Instant::now() + TIMEOUT).unwrap();
    ctx.transport() == rdma::Transport::Iwarp
}

/// A host-side connection: QP, CQ, registered buffers, CM id.
pub struct Host {
    // Field order is drop order: the QP before the buffers its work requests name.
    pub qp: Qp,
    pub id: CmId,
    pub cq: Arc<Cq>,
    pub recv_mr: Mr,
    pub send_mr: Mr,
    /// Host memory the target reads from and writes to (the keyed SGL buffers).
    pub data_mr: Mr,
    _pd: Arc<Pd>,
    pub ch: EventChannel,
    pub reply: Vec<u8>,
    /// The RDMA READs the target lets this host have outstanding towards it: the accept's
    /// responder resources, which the CM reports as the event's `initiator_depth` (turned to
    /// this side's point of view).
    pub granted_reads: u8,
    /// The NQNs `nvme_connect` sends.
    pub subnqn: String,
    pub hostnqn: String,
    pub next_cid: u16,
    /// iWARP (siw): [`Host::exec`] may have to nudge the target's receive stream.
    pub iwarp: bool,
}

pub enum Outcome {
    Connected(Box<Host>),
    Rejected { status: i32, data: Vec<u8> },
}

pub fn expect_event(ch: &EventChannel, want: CmEventType) -> rdma::CmEvent {
    let ev = ch
        .get_event(Some(TIMEOUT))
        .unwrap()
        .unwrap_or_else(|| panic!("timed out waiting for {want}"));
    assert_eq!(ev.event_type(), want, "status {}", ev.status());
    ev
}

pub fn open(addr: SocketAddr, pdata: &[u8], responder_resources: u8) -> Outcome {
    open_with(addr, pdata, responder_resources, 0)
}

/// Like [`open`], also asking for `initiator_depth` RDMA READs towards the target.
pub fn open_with(
    addr: SocketAddr,
    pdata: &[u8],
    responder_resources: u8,
    initiator_depth: u8,
) -> Outcome {
    let deadline = Instant::now() + TIMEOUT;
    let ch = EventChannel::new().unwrap();
    let (id, ctx) = active::resolve(&ch, 7, addr, deadline).unwrap();
    let iwarp = ctx.transport() == rdma::Transport::Iwarp;
    let pd = Arc::new(Pd::new(&ctx).unwrap());
    let cq = Arc::new(Cq::new(&ctx, 256).unwrap());
    let qp = Qp::create(&id, &pd, &QpInitAttr::new(&cq, 64, NRECV as u32)).unwrap();
    let recv_mr = Mr::alloc(&pd, NRECV * 16, AccessFlags::LOCAL_WRITE).unwrap();
    qp.post_recv_slots(&recv_mr, 16, NRECV, 0).unwrap();
    let send_mr = Mr::alloc(&pd, 64 + IN_CAPSULE, AccessFlags::empty()).unwrap();
    let data_mr = Mr::alloc(
        &pd,
        DATA,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )
    .unwrap();
    let param = ConnParam {
        private_data: pdata,
        responder_resources,
        initiator_depth,
        flow_control: true,
        retry_count: 7,
        rnr_retry_count: 7,
    };
    match active::connect(&ch, &id, &param, deadline) {
        Ok(ev) => Outcome::Connected(Box::new(Host {
            qp,
            id,
            cq,
            recv_mr,
            send_mr,
            data_mr,
            _pd: pd,
            reply: ev.private_data().to_vec(),
            granted_reads: ev.initiator_depth(),
            subnqn: NQN.into(),
            hostnqn: HOSTNQN.into(),
            ch,
            next_cid: 1,
            iwarp,
        })),
        Err(ConnectError::Rejected {
            status,
            private_data,
        }) => Outcome::Rejected {
            status,
            data: private_data,
        },
        Err(e) => panic!("connect failed: {e}"),
    }
}

pub fn connect(addr: SocketAddr, req: CmRequest) -> Box<Host> {
    match open(addr, &req.encode(), 16) {
        Outcome::Connected(h) => h,
        Outcome::Rejected { status, data } => {
            panic!("{req:?} rejected: status {status}, data {data:?}")
        }
    }
}

/// The NVMe/RDMA reject status carried by a REJECTED event.
pub fn reject_status(o: Outcome) -> u16 {
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
    pub fn keyed(&self, off: usize, len: usize) -> Sgl {
        Sgl::Keyed {
            addr: self.data_mr.addr() + off as u64,
            len: len as u32,
            key: self.data_mr.rkey(),
            invalidate: false,
        }
    }

    pub fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        self.next_cid
    }

    /// SENDs `bytes` as a capsule.
    pub fn send_raw(&self, bytes: &[u8]) {
        self.send_mr.write_at(0, bytes).unwrap();
        let sge = self.send_mr.sge(0, bytes.len()).unwrap();
        self.qp
            .post_send(&[SendWr::send(1_000_000, &[sge]).signaled()])
            .unwrap();
    }

    /// Posts a zero-length RDMA WRITE (signaled, wr_id [`NUDGE_WR_ID`]): on iWARP it makes the
    /// target's siw read what an accept race left in its socket ([`Host::exec`]). It names no
    /// memory: the receiver checks no key for zero bytes.
    pub fn nudge(&self, why: &str) {
        eprintln!(
            "{why} after {NUDGE_AFTER:?} on iWARP: a zero-length RDMA WRITE to move the target's \
             receive stream (siw accept race)"
        );
        // The connection may have ended meanwhile (its QP in the error state): nothing to move.
        if let Err(e) = self
            .qp
            .post_send(&[SendWr::zero_length_write(NUDGE_WR_ID).signaled()])
        {
            eprintln!("the zero-length RDMA WRITE was not posted: {e}");
        }
    }

    /// Sends a capsule (SQE plus in-capsule data) and returns the response.
    ///
    /// On iWARP, a response missing for [`NUDGE_AFTER`] gets one zero-length RDMA WRITE behind
    /// the capsule (it names no memory: the receiver checks no key for zero bytes). Linux siw
    /// (6.1 in the test VM) installs its receive callback on an accepted connection's socket
    /// only after sending the MPA reply, so a first capsule that arrives in between stays
    /// unread in the target's socket until more data comes (seen in the VM suite on a loaded
    /// machine: a Connect unanswered for 20 s); the WRITE is that data. A target that does not
    /// answer still fails here after [`TIMEOUT`].
    pub fn exec(&mut self, sqe: &Sqe, inline: &[u8]) -> Cqe {
        let mut capsule = sqe.encode().to_vec();
        capsule.extend_from_slice(inline);
        self.send_raw(&capsule);
        let t0 = Instant::now();
        let deadline = t0 + TIMEOUT;
        let (mut sent, mut cqe, mut nudged) = (false, None, false);
        let mut wc = [WorkCompletion::default()];
        while !sent || cqe.is_none() {
            assert!(
                Instant::now() < deadline,
                "no response to {sqe:?} (sent: {sent}, stream nudged: {nudged})"
            );
            if self.cq.poll(&mut wc).unwrap() == 0 {
                if self.iwarp && sent && !nudged && t0.elapsed() >= NUDGE_AFTER {
                    nudged = true;
                    self.nudge(&format!("no response to cid {}", sqe.cid()));
                }
                std::thread::sleep(Duration::from_micros(100));
                continue;
            }
            let [w] = &wc;
            assert!(w.is_ok(), "host work request failed: {w:?}");
            match w.opcode() {
                WcOpcode::Send => sent = true,
                WcOpcode::RdmaWrite if w.wr_id() == NUDGE_WR_ID => {}
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

    pub fn ok(&mut self, sqe: &Sqe, inline: &[u8]) -> Cqe {
        let c = self.exec(sqe, inline);
        assert!(c.status().is_success(), "{sqe:?} failed: {:?}", c.status());
        c
    }

    /// Fabrics Connect with the data in host memory (keyed SGL: the target RDMA READs it).
    pub fn nvme_connect(&mut self, qid: u16, sqsize: u16, cntlid: u16) -> u16 {
        let c = self.try_nvme_connect(qid, sqsize, cntlid);
        assert!(c.status().is_success(), "Connect failed: {:?}", c.status());
        c.result.get() as u16
    }

    /// Fabrics Connect to `self.subnqn` as `self.hostnqn` (keyed SGL data); the response.
    pub fn try_nvme_connect(&mut self, qid: u16, sqsize: u16, cntlid: u16) -> Cqe {
        let data = ConnectData::new([7; 16], cntlid, &self.subnqn, &self.hostnqn).encode();
        self.data_mr.write_at(0, &data).unwrap();
        let cid = self.cid();
        let sqe = fabrics::connect_sqe(cid, qid, sqsize, 0, 30_000, self.keyed(0, 1024));
        self.exec(&sqe, &[])
    }

    /// Sets CC.EN and waits for CSTS.RDY (admin queue after Connect).
    pub fn enable(&mut self) {
        let cid = self.cid();
        let cc = fabrics::Cc::new(true, 0, 0, 0, 0, 6, 4).0 as u64;
        self.ok(
            &fabrics::property_set_sqe(cid, 0x14, cc, PropSize::Four),
            &[],
        );
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let cid = self.cid();
            let csts = self.ok(&fabrics::property_get_sqe(cid, 0x1c, PropSize::Four), &[]);
            if csts.result.get() & 1 == 1 {
                return;
            }
            assert!(Instant::now() < deadline, "CSTS.RDY never set");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for a CM event (e.g. DISCONNECTED after the target closed the queue).
    pub fn wait_event(&self, want: CmEventType) {
        expect_event(&self.ch, want);
    }
}

pub fn io_sqe(op: u8, cid: u16, lba: u64, blocks: u32, sgl: Sgl) -> Sqe {
    let mut s = Sqe::new(op, cid);
    s.nsid = 1.into();
    s.dptr = sgl.encode();
    s.cdw10 = (lba as u32).into();
    s.cdw11 = ((lba >> 32) as u32).into();
    s.cdw12 = (blocks - 1).into();
    s
}

pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

pub fn sum<F: Fn(&PollerStats) -> u64>(stats: &[Arc<PollerStats>], f: F) -> u64 {
    stats.iter().map(|s| f(s)).sum()
}

/// `target.rdma_srq_depth` line for a test daemon's YAML from `NVMF_TEST_RDMA_SRQ_DEPTH`
/// (the `rdma-wire-srq-*` VM scenarios run the wire tests with a shared receive queue), or "".
pub fn srq_yaml() -> String {
    match std::env::var("NVMF_TEST_RDMA_SRQ_DEPTH") {
        Ok(v) if !v.is_empty() && v != "0" => format!("  rdma_srq_depth: {v}\n"),
        _ => String::new(),
    }
}

/// Waits until the pollers report no connection, no buffer in use and only the per-device
/// regions (the pool, and the shared receive area with `rdma_srq_depth`).
pub fn wait_released(d: &Daemon) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let st = d.poller_stats();
        let conns = sum(&st, |s| s.rdma.connections.load(Ordering::Relaxed) as u64);
        let bufs = sum(&st, |s| s.buffers_in_use.load(Ordering::Relaxed) as u64);
        // One pool region (and shared receive area) per poller that has served a connection.
        let mrs = sum(&st, |s| {
            s.verbs.mrs_registered.load(Ordering::Relaxed) as u64
        });
        let per_dev = sum(&st, |s| {
            let r = s.verbs.regions();
            r.iter()
                .filter(|r| matches!(r.kind, RegionKind::Pool | RegionKind::SrqRecv))
                .count() as u64
        });
        if conns == 0 && bufs == 0 && mrs <= per_dev.max(st.len() as u64) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not released: {conns} connections, {bufs} buffers, {mrs} memory regions"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
