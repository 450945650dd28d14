//! The NVMe/RDMA request machine without a device: a recording queue pair ([`FakeQp`]: posted
//! work requests wait until the test completes them, in order, as a device would; moving the
//! QP to the error state flushes everything outstanding), a device with a pool registration,
//! per-I/O READ sinks and an optional shared receive queue ([`FakeDev`]), the in-memory store,
//! and a clock that only moves when a test moves it. The host side writes capsules into posted
//! RECVs and decodes the CQEs of the SENDs it is given.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::rdma::{RemoteBuf, SendFlags, SendOp, SendWr, Sge, WcStatus, WorkCompletion};
use nvme::fabrics::{connect_sqe, ConnectData};
use nvme::identify::feat;
use nvme::opcode::io;
use nvme::sgl::Sgl;
use nvme::{Cqe, Sqe, Status};
use proptest::prelude::*;

use super::*;
use crate::core::tests::{rw_sqe as rw, test_target, Host, HOSTID, HOSTNQN, SUBNQN};
use crate::core::TrType;
use crate::transport::mem::MemStore;
use crate::transport::rdma::conns::RegionKind;
use crate::transport::rdma::params::{size_queue, split_wr_id, DeviceLimits};
use crate::transport::Kind;

type Result<T> = std::result::Result<T, ::rdma::Error>;

/// Where the fake's memory "lives": the response area's SGEs point here.
const RSP_BASE: u64 = 0x10_0000;
const RSP_LKEY: u32 = 0x51;
const POOL_LKEY: u32 = 0x77;
/// The host's keyed buffers.
const HOST_ADDR: u64 = 0x7f00_0000_0000;
const HOST_RKEY: u32 = 0x1234;

/// A posted send work request, as recorded.
#[derive(Debug, Clone, Copy)]
struct Posted {
    wr_id: u64,
    op: SendOp,
    signaled: bool,
    inline: bool,
    len: u64,
    lkey: u32,
}

#[derive(Default)]
struct QpState {
    alive: bool,
    /// Own RECV area (none on a shared receive queue): bytes and the strides posted.
    recv_area: Vec<u8>,
    stride: usize,
    recvs: VecDeque<u32>,
    rsp: Vec<u8>,
    /// Send queue, oldest first.
    sq: VecDeque<Posted>,
    /// Completions waiting in the CQ.
    cq: VecDeque<WorkCompletion>,
    /// The next post_send takes only this many work requests, then fails.
    fail_post_after: Option<usize>,
    /// Moving to the error state flushes what is outstanding (off: a device whose flushes
    /// never come).
    flush_on_error: bool,
    error: bool,
    disconnected: bool,
    /// Every response the host got: (cid, status).
    responses: Vec<(u16, Status)>,
    /// post_send calls and work requests posted.
    post_calls: u32,
    posted: Vec<Posted>,
}

/// The recording queue pair; the test keeps a handle on the same state.
#[derive(Clone)]
struct FakeQp(Rc<RefCell<QpState>>);

impl QpLink for FakeQp {
    fn has_qp(&self) -> bool {
        self.0.borrow().alive
    }

    fn destroy_qp(&mut self) {
        let mut s = self.0.borrow_mut();
        s.alive = false;
        s.sq.clear();
        s.recvs.clear();
        // As mlx5 does: the QP's completions not yet polled leave its CQ with it.
        s.cq.clear();
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let mut s = self.0.borrow_mut();
        s.post_calls += 1;
        assert!(s.alive, "post on a destroyed queue pair");
        let take = s.fail_post_after.take().unwrap_or(wrs.len()).min(wrs.len());
        for wr in &wrs[..take] {
            assert_eq!(wr.sges.len(), 1);
            let sge = wr.sges[0];
            let p = Posted {
                wr_id: wr.wr_id,
                op: wr.op,
                signaled: wr.flags.contains(SendFlags::SIGNALED),
                inline: wr.flags.contains(SendFlags::INLINE),
                len: wr.byte_len(),
                lkey: sge.lkey(),
            };
            if let SendOp::Send | SendOp::SendWithInv { .. } = wr.op {
                // The host receives the CQE: read it where the SGE points (inline sends are
                // copied at post time, so read it now either way).
                assert_eq!(sge.lkey(), RSP_LKEY);
                let off = (sge.addr() - RSP_BASE) as usize;
                let cqe = Cqe::decode(&s.rsp[off..off + 16]).expect("a 16-byte CQE");
                s.responses.push((cqe.cid(), cqe.status()));
            }
            if s.error {
                // Posted to a QP in the error state: flushed at once.
                s.cq.push_back(WorkCompletion::new(p.wr_id, WcStatus::WrFlushErr, 0));
            } else {
                s.sq.push_back(p);
            }
            s.posted.push(p);
        }
        if take < wrs.len() {
            return Err(::rdma::Error::Post {
                call: "ibv_post_send",
                errno: libc::ENOMEM,
                posted: take,
            });
        }
        Ok(())
    }

    fn has_recv_area(&self) -> bool {
        self.0.borrow().stride > 0
    }

    fn post_recvs(&self, n: u32) -> Result<()> {
        let mut s = self.0.borrow_mut();
        s.recvs.extend(0..n);
        Ok(())
    }

    fn repost_recv(&self, recv: u32) -> Result<()> {
        let mut s = self.0.borrow_mut();
        assert!(!s.recvs.contains(&recv), "RECV {recv} posted twice");
        if s.error {
            s.cq.push_back(WorkCompletion::new(
                wr_id(WrKind::Recv, recv),
                WcStatus::WrFlushErr,
                0,
            ));
        } else {
            s.recvs.push_back(recv);
        }
        Ok(())
    }

    fn read_recv(&self, recv: u32, at: usize, dst: &mut [u8]) -> Result<()> {
        let s = self.0.borrow();
        let off = recv as usize * s.stride + at;
        dst.copy_from_slice(&s.recv_area[off..off + dst.len()]);
        Ok(())
    }

    fn response(&self, slot: usize, cqe: &[u8; CQE_BYTES]) -> Result<Sge> {
        let mut s = self.0.borrow_mut();
        let off = slot * CQE_BYTES;
        s.rsp[off..off + CQE_BYTES].copy_from_slice(cqe);
        Ok(Sge::new(RSP_BASE + off as u64, CQE_BYTES as u32, RSP_LKEY))
    }

    fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize> {
        let mut s = self.0.borrow_mut();
        let n = wcs.len().min(s.cq.len());
        for (w, c) in wcs.iter_mut().zip(s.cq.drain(..n)) {
            *w = c;
        }
        Ok(n)
    }

    fn set_error(&self) -> Result<()> {
        let mut s = self.0.borrow_mut();
        s.error = true;
        if s.flush_on_error {
            flush_all(&mut s);
        }
        Ok(())
    }

    fn disconnect(&self) -> Result<()> {
        self.0.borrow_mut().disconnected = true;
        Ok(())
    }

    fn regions(&self, out: &mut Vec<RegionInfo>) {
        out.push(RegionInfo {
            kind: RegionKind::Response,
            addr: RSP_BASE,
            len: self.0.borrow().rsp.len(),
            lkey: RSP_LKEY,
            rkey: 0,
            access: ::rdma::AccessFlags::empty(),
        });
    }

    fn regions_held(&self) -> usize {
        1
    }
}

/// Every outstanding work request completes with a flush error (send queue in order, then the
/// RECVs), as a device does when its queue pair enters the error state.
fn flush_all(s: &mut QpState) {
    while let Some(p) = s.sq.pop_front() {
        s.cq.push_back(WorkCompletion::new(p.wr_id, WcStatus::WrFlushErr, 0));
    }
    while let Some(r) = s.recvs.pop_front() {
        s.cq.push_back(WorkCompletion::new(
            wr_id(WrKind::Recv, r),
            WcStatus::WrFlushErr,
            0,
        ));
    }
}

/// The device: pool SGEs, READ sinks counted while they live, optionally a shared receive
/// queue of `srq_depth` strides.
struct FakeDev {
    iwarp: bool,
    buf_size: usize,
    sinks: Rc<Cell<usize>>,
    srq: Option<RefCell<FakeSrq>>,
}

struct FakeSrq {
    area: Vec<u8>,
    stride: usize,
    depth: u32,
    posted: VecDeque<u32>,
}

/// A READ sink registration; counted while alive.
struct FakeSink {
    live: Rc<Cell<usize>>,
}

impl Drop for FakeSink {
    fn drop(&mut self) {
        self.live.set(self.live.get() - 1);
    }
}

impl DevLink for FakeDev {
    type Sink = FakeSink;

    fn iwarp(&self) -> bool {
        self.iwarp
    }

    fn pool_sge(&self, buf: u32, len: usize) -> Result<Sge> {
        assert!(len <= self.buf_size);
        Ok(Sge::new(
            0x2000_0000 + (buf as usize * self.buf_size) as u64,
            len as u32,
            POOL_LKEY,
        ))
    }

    unsafe fn read_sink(&self, ptr: *mut u8, len: usize) -> Result<(Sge, FakeSink)> {
        self.sinks.set(self.sinks.get() + 1);
        Ok((
            Sge::new(ptr as u64, len as u32, 0x5100 + self.sinks.get() as u32),
            FakeSink {
                live: self.sinks.clone(),
            },
        ))
    }

    fn sink_info(_: &FakeSink) -> RegionInfo {
        RegionInfo {
            kind: RegionKind::ReadSink,
            addr: 0,
            len: 0,
            lkey: 0,
            rkey: 0,
            access: ::rdma::AccessFlags::empty(),
        }
    }

    fn has_srq(&self) -> bool {
        self.srq.is_some()
    }

    fn srq_completed(&self, i: u32) -> bool {
        self.srq.as_ref().is_some_and(|q| i < q.borrow().depth)
    }

    fn srq_repost(&self, i: u32) -> Result<()> {
        let mut q = self.srq.as_ref().expect("an SRQ").borrow_mut();
        assert!(!q.posted.contains(&i), "shared RECV {i} posted twice");
        q.posted.push_back(i);
        Ok(())
    }

    fn srq_read(&self, i: u32, at: usize, dst: &mut [u8]) -> Result<()> {
        let q = self.srq.as_ref().expect("an SRQ").borrow();
        let off = i as usize * q.stride + at;
        dst.copy_from_slice(&q.area[off..off + dst.len()]);
        Ok(())
    }
}

/// Transport limits of the rig: 16 KiB buffers, 64 KiB transfers (in pieces), 4 KiB in-capsule.
fn caps() -> TransportCaps {
    TransportCaps {
        trtype: TrType::Rdma,
        in_capsule_data: 4096,
        max_io_size: 16 * 1024,
        max_transfer: 64 * 1024,
        max_queue_depth: 32,
    }
}

/// How a rig is built.
#[derive(Debug, Clone, Copy)]
struct Opts {
    depth: u32,
    bufs: usize,
    ord: u8,
    /// Send queue entries (credits); default two per slot plus one.
    sq_depth: Option<u32>,
    iwarp: bool,
    srq: bool,
    inline: bool,
    /// Namespace 1's store has a compare-and-write of its own, of one block.
    native_caw: bool,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            depth: 8,
            bufs: 8,
            ord: 4,
            sq_depth: None,
            iwarp: false,
            srq: false,
            inline: true,
            native_caw: false,
        }
    }
}

struct Rig {
    conn: Conn<FakeQp, FakeDev>,
    qp: Rc<RefCell<QpState>>,
    dev: FakeDev,
    store: MemStore,
    need_buf: VecDeque<ReqRef>,
    now: Instant,
    sq_depth: u32,
    _admin: Host,
}

impl Rig {
    fn new(o: Opts) -> Rig {
        let target = test_target();
        if o.native_caw {
            let mut subs = crate::core::tests::test_subsystems();
            subs[0].namespaces[0].native_caw = 4096;
            target.reconfigure(subs, crate::core::tests::test_listeners());
        }
        let now = Instant::now();
        let mut admin = Host::new(&target, crate::core::tests::tcp_caps(), now);
        let cntlid = admin.bring_up(SUBNQN, HOSTNQN);
        admin
            .set_features(feat::NUM_QUEUES, 3 | 3 << 16, &[])
            .ok_result();
        let limits = DeviceLimits {
            max_qp_wr: 4096,
            max_cqe: 65536,
        };
        let z = size_queue(o.depth, false, caps().in_capsule_data, limits).expect("sizing");
        let sq_depth = o.sq_depth.unwrap_or(z.max_send_wr);
        let qp = Rc::new(RefCell::new(QpState {
            alive: true,
            recv_area: if o.srq {
                Vec::new()
            } else {
                vec![0; z.recvs as usize * z.recv_stride]
            },
            stride: if o.srq { 0 } else { z.recv_stride },
            rsp: vec![0; z.slots as usize * CQE_BYTES],
            flush_on_error: true,
            ..QpState::default()
        }));
        let dev = FakeDev {
            iwarp: o.iwarp,
            buf_size: caps().max_io_size as usize,
            sinks: Rc::new(Cell::new(0)),
            srq: o.srq.then(|| {
                let depth = 2 * o.depth;
                RefCell::new(FakeSrq {
                    area: vec![0; depth as usize * z.recv_stride],
                    stride: z.recv_stride,
                    depth,
                    posted: (0..depth).collect(),
                })
            }),
        };
        let mut conn = Conn::with_link(
            FakeQp(qp.clone()),
            LinkSetup {
                tag: 1,
                key: 3,
                dev_index: 0,
                cm_qid: 1,
                sizing: z,
                ord: o.ord,
                srq: o.srq,
                send_with_inv: true,
                inline_rsp: o.inline,
                sq_depth,
                target,
                caps: caps(),
                peer: "fake".into(),
                local: None,
                waker: Arc::new(|| {}),
            },
        );
        conn.post_all_recvs().expect("RECVs");
        let mut r = Rig {
            conn,
            qp,
            dev,
            store: MemStore::new(o.bufs, caps().max_io_size as usize),
            need_buf: VecDeque::new(),
            now,
            sq_depth,
            _admin: admin,
        };
        r.with_env(|c, env| c.established(env));
        let d = ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN);
        let sgl = Sgl::InCapsule {
            offset: 0,
            len: 1024,
        };
        r.capsule(
            &connect_sqe(0xc0, 1, o.depth as u16 - 1, 0, 0, sgl),
            &d.encode(),
        );
        r.settle();
        assert_eq!(r.responses(), vec![(0xc0, Status::SUCCESS)], "connect");
        r
    }

    fn with_env<R>(
        &mut self,
        f: impl FnOnce(&mut Conn<FakeQp, FakeDev>, &mut Env<'_, FakeDev>) -> R,
    ) -> R {
        let mut env = Env {
            store: &mut self.store,
            dev: &self.dev,
            need_buf: &mut self.need_buf,
            now: self.now,
        };
        f(&mut self.conn, &mut env)
    }

    /// The host sends a capsule: into the next posted RECV (own or shared), completed.
    fn capsule(&mut self, sqe: &Sqe, data: &[u8]) {
        assert!(
            self.try_capsule(sqe, data),
            "no RECV posted for the capsule"
        );
    }

    fn try_capsule(&mut self, sqe: &Sqe, data: &[u8]) -> bool {
        let mut bytes = sqe.encode().to_vec();
        bytes.extend_from_slice(data);
        let mut q = self.qp.borrow_mut();
        if q.error {
            return false;
        }
        let recv = if let Some(srq) = &self.dev.srq {
            let mut srq = srq.borrow_mut();
            let Some(i) = srq.posted.pop_front() else {
                return false;
            };
            let off = i as usize * srq.stride;
            srq.area[off..off + bytes.len()].copy_from_slice(&bytes);
            i
        } else {
            let Some(i) = q.recvs.pop_front() else {
                return false;
            };
            let off = i as usize * q.stride;
            q.recv_area[off..off + bytes.len()].copy_from_slice(&bytes);
            i
        };
        q.cq.push_back(WorkCompletion::new(
            wr_id(WrKind::Recv, recv),
            WcStatus::Success,
            bytes.len() as u32,
        ));
        true
    }

    /// The device completes the `n` oldest posted send work requests (successfully).
    fn complete(&mut self, n: usize) {
        let mut q = self.qp.borrow_mut();
        for _ in 0..n {
            let Some(p) = q.sq.pop_front() else { break };
            if p.signaled {
                let len = match p.op {
                    SendOp::RdmaRead { .. } => p.len as u32,
                    _ => 0,
                };
                q.cq.push_back(WorkCompletion::new(p.wr_id, WcStatus::Success, len));
            }
        }
    }

    /// One poller pass: the CQ, the backend, the buffer FIFO, the staged sends, the timers.
    fn pass(&mut self) -> bool {
        let mut wcs = vec![WorkCompletion::default(); 8];
        let mut moved = false;
        let mut polls = 0;
        while self.with_env(|c, env| c.poll(&mut wcs, env)) > 0 {
            moved = true;
            polls += 1;
            assert!(
                polls < 10_000,
                "completions without end: {:?}",
                self.qp.borrow().cq.front()
            );
        }
        // The device reports the last WQE of a QP on a shared receive queue once its work
        // requests are flushed.
        if self.conn.srq && self.qp.borrow().error && self.qp.borrow().sq.is_empty() {
            self.conn.last_wqe_reached();
        }
        let mut done = Vec::new();
        self.store.reap(&mut done);
        for (ud, res) in done {
            let r = ReqRef::from_user_data(ud);
            assert_eq!((r.kind, r.conn), (Kind::Rdma, 3));
            self.with_env(|c, env| c.backend_done(r.slot, res, env));
            moved = true;
        }
        moved |= self.serve_buffers();
        moved |= self.with_env(|c, env| c.flush_sends(env));
        self.with_env(|c, env| c.tick(env));
        self.check();
        moved
    }

    fn serve_buffers(&mut self) -> bool {
        let mut moved = false;
        while let Some(&r) = self.need_buf.front() {
            if self.conn.is_closing() {
                self.need_buf.clear();
                break;
            }
            let Some(b) = self.store.alloc_buf() else {
                break;
            };
            self.need_buf.pop_front();
            self.with_env(|c, env| c.buffer_granted(r.slot, b, env));
            moved = true;
        }
        moved
    }

    /// Passes, completing everything the device holds, until nothing moves.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            let moved = self.pass();
            let outstanding = self.qp.borrow().sq.len();
            self.complete(outstanding);
            if !moved && outstanding == 0 {
                return;
            }
        }
        panic!("the connection never settled");
    }

    fn responses(&mut self) -> Vec<(u16, Status)> {
        std::mem::take(&mut self.qp.borrow_mut().responses)
    }

    fn posted(&mut self) -> Vec<Posted> {
        std::mem::take(&mut self.qp.borrow_mut().posted)
    }

    /// The books balance (checked after every pass).
    fn check(&self) {
        let c = &self.conn;
        let mut states = [0u32; super::super::request::STATE_COUNT];
        for r in &c.slots {
            states[r.state() as usize] += 1;
        }
        for st in ReqState::ALL {
            assert_eq!(c.counts.get(st), states[st as usize], "count of {st:?}");
        }
        let held = c.slots.iter().filter(|r| r.buf.is_some()).count();
        assert_eq!(
            held,
            self.store.buffers_in_use(),
            "every pool buffer has one owner"
        );
        assert_eq!(c.io_mrs, self.dev.sinks.get(), "READ sinks alive");
        assert_eq!(c.io_inflight as usize, self.store.inflight());
        // Send-queue credits: what is free plus what the requests hold is the whole queue
        // (while there is a queue pair).
        let held_wrs: u32 = c.slots.iter().map(|r| r.wrs).sum();
        if c.link.has_qp() {
            assert_eq!(c.sq_free + held_wrs, self.sq_depth, "send-queue credits");
        }
        assert!(c.reads_out <= c.ord, "READs beyond the negotiated depth");
        if c.link.has_qp() && !self.qp.borrow().error {
            assert!(
                self.qp.borrow().sq.len() as u32 <= self.sq_depth,
                "send queue overflow"
            );
        }
        for r in &c.slots {
            if r.state() == ReqState::Free {
                assert!(r.buf.is_none() && r.cmd.is_none() && r.read_mr.is_none() && r.wrs == 0);
            }
        }
    }

    fn idle(&self) -> bool {
        self.conn.counts.get(ReqState::Free) as usize == self.conn.slots.len()
            && self.store.buffers_in_use() == 0
            && self.dev.sinks.get() == 0
    }
}

fn keyed(len: u32) -> Sgl {
    Sgl::Keyed {
        addr: HOST_ADDR,
        len,
        key: HOST_RKEY,
        invalidate: true,
    }
}

fn read(cid: u16, slba: u64, blocks: u32) -> Sqe {
    rw(io::READ, cid, slba, blocks, keyed(blocks * 4096))
}

fn write(cid: u16, slba: u64, blocks: u32) -> Sqe {
    rw(io::WRITE, cid, slba, blocks, keyed(blocks * 4096))
}

fn write_in_capsule(cid: u16, slba: u64) -> Sqe {
    let sgl = Sgl::InCapsule {
        offset: 0,
        len: 4096,
    };
    rw(io::WRITE, cid, slba, 1, sgl)
}

fn kind(p: &Posted) -> WrKind {
    split_wr_id(p.wr_id).expect("an id of ours").0
}

#[test]
fn read_data_goes_out_as_an_rdma_write_chained_with_the_send() {
    let mut r = Rig::new(Opts::default());
    r.posted();
    r.capsule(&read(5, 8, 2), &[]);
    r.pass(); // capsule -> backend
    r.pass(); // backend done -> staged -> posted
    let p = r.posted();
    assert_eq!(
        r.qp.borrow().post_calls,
        2,
        "connect, then one post for WRITE + SEND"
    );
    assert_eq!(p.len(), 2);
    assert_eq!(kind(&p[0]), WrKind::Write);
    assert!(
        !p[0].signaled,
        "the WRITE is unsignaled: its SEND accounts for it"
    );
    assert_eq!(p[0].len, 8192);
    assert_eq!(p[0].lkey, POOL_LKEY);
    match p[0].op {
        SendOp::RdmaWrite { remote } => assert_eq!(
            remote,
            RemoteBuf {
                addr: HOST_ADDR,
                len: 8192,
                rkey: HOST_RKEY
            }
        ),
        op => panic!("expected an RDMA WRITE, got {op:?}"),
    }
    assert_eq!(kind(&p[1]), WrKind::Send);
    assert!(p[1].signaled && p[1].inline);
    assert_eq!(
        p[1].op,
        SendOp::SendWithInv { rkey: HOST_RKEY },
        "keyed-invalidate SGL with data: SEND_WITH_INVALIDATE"
    );
    assert_eq!(r.responses(), vec![(5, Status::SUCCESS)]);
    // The buffer stays with the request until the SEND completes.
    assert_eq!(r.store.buffers_in_use(), 1);
    r.complete(2);
    r.pass();
    assert!(r.idle());
    assert_eq!(r.qp.borrow().recvs.len(), 8, "every RECV reposted");
}

#[test]
fn write_data_is_pulled_by_rdma_read_then_executed() {
    let mut r = Rig::new(Opts::default());
    r.posted();
    r.capsule(&write(6, 0, 3), &[]);
    r.pass();
    let p = r.posted();
    assert_eq!(p.len(), 1);
    assert_eq!(kind(&p[0]), WrKind::Read);
    assert!(p[0].signaled);
    assert_eq!(p[0].len, 12288);
    assert_eq!(r.conn.counts.get(ReqState::TransferringFromHost), 1);
    assert_eq!(r.store.submitted, 0, "nothing runs before the data is in");
    r.complete(1);
    r.pass();
    assert_eq!(r.store.submitted, 1);
    r.settle();
    assert_eq!(r.responses(), vec![(6, Status::SUCCESS)]);
    assert!(r.idle());
}

#[test]
fn reads_beyond_the_negotiated_depth_wait_their_turn() {
    let mut r = Rig::new(Opts {
        ord: 1,
        ..Opts::default()
    });
    r.posted();
    for cid in 1..=3 {
        r.capsule(&write(cid, cid as u64 * 8, 1), &[]);
    }
    r.pass();
    assert_eq!(r.posted().len(), 1, "one READ at a time with ORD 1");
    assert_eq!(r.conn.counts.get(ReqState::ReadPending), 2);
    r.complete(1);
    r.pass();
    let p = r.posted();
    assert_eq!(p.iter().filter(|p| kind(p) == WrKind::Read).count(), 1);
    r.settle();
    let mut cids: Vec<u16> = r.responses().iter().map(|x| x.0).collect();
    cids.sort_unstable();
    assert_eq!(cids, vec![1, 2, 3]);
    assert!(r.idle());
}

#[test]
fn responses_wait_for_send_queue_room() {
    // Three entries: one read response (WRITE + SEND) fits, the next waits for its SEND.
    let mut r = Rig::new(Opts {
        sq_depth: Some(3),
        ..Opts::default()
    });
    r.posted();
    for cid in 1..=3 {
        r.capsule(&read(cid, 0, 1), &[]);
    }
    r.pass();
    r.pass();
    assert_eq!(r.posted().len(), 2, "one response's two work requests");
    assert_eq!(r.conn.counts.get(ReqState::ReadyToComplete), 2);
    r.complete(2);
    r.pass();
    assert_eq!(
        r.posted().len(),
        2,
        "the next response, once room came back"
    );
    r.settle();
    assert_eq!(r.responses().len(), 3);
    assert!(r.idle());
}

#[test]
fn a_partly_failed_post_takes_back_the_responses_it_did_not_post() {
    let mut r = Rig::new(Opts::default());
    r.posted();
    for cid in 1..=3 {
        r.capsule(&read(cid, 0, 1), &[]);
    }
    // Three read responses staged in one pass: 6 work requests. The device takes 3: the first
    // response and the second's WRITE, without its SEND.
    r.qp.borrow_mut().fail_post_after = Some(3);
    r.pass();
    let p = r.posted();
    assert_eq!(p.len(), 3);
    assert!(r.conn.is_closing(), "a failed post closes the queue");
    assert_eq!(
        r.responses(),
        vec![(1, Status::SUCCESS)],
        "only the first response left"
    );
    // The flush brings back what was posted; everything is released.
    r.settle();
    assert!(r.conn.is_finished());
    assert!(r.idle());
}

#[test]
fn in_capsule_data_is_copied_and_its_recv_reposted_before_the_response() {
    let mut r = Rig::new(Opts::default());
    r.posted();
    let before = r.qp.borrow().recvs.len();
    r.capsule(&write_in_capsule(9, 4), &[0x6b; 4096]);
    r.pass();
    assert_eq!(
        r.qp.borrow().recvs.len(),
        before,
        "reposted once the data was copied"
    );
    assert_eq!(r.store.submitted, 1);
    r.settle();
    assert_eq!(r.responses(), vec![(9, Status::SUCCESS)]);
    assert_eq!(
        r.conn.stats.copied_bytes,
        1024 + 4096,
        "Connect data and this write"
    );
    assert!(r.idle());
}

#[test]
fn closing_flushes_every_posted_request_and_frees_everything() {
    let mut r = Rig::new(Opts {
        iwarp: true,
        ..Opts::default()
    });
    r.posted();
    // One request in each waiting place: a READ in flight (with its iWARP sink), a backend
    // op in flight, a response posted, a capsule parked behind the buffer pool...
    r.capsule(&write(1, 0, 2), &[]);
    r.capsule(&read(2, 0, 1), &[]);
    r.pass();
    r.pass();
    assert_eq!(r.dev.sinks.get(), 1, "the READ's sink is registered");
    r.capsule(&read(3, 0, 1), &[]);
    r.pass();
    assert!(!r.idle());
    r.with_env(|c, env| c.close("host disconnected", env));
    assert!(r.qp.borrow().disconnected && r.qp.borrow().error);
    assert!(!r.conn.is_finished(), "posted work requests still out");
    r.settle();
    assert!(r.conn.is_finished());
    assert!(r.idle(), "every slot, buffer and sink released");
    assert!(r.qp.borrow().recvs.is_empty());
}

/// A fused Compare (`FUSE_FIRST`) and Write (`FUSE_SECOND`) of one block, data in capsule.
fn send_caw(r: &mut Rig, cids: (u16, u16), slba: u64) {
    let sgl = Sgl::InCapsule {
        offset: 0,
        len: 4096,
    };
    let mut c = rw(io::COMPARE, cids.0, slba, 1, sgl);
    c.flags |= nvme::cmd::FUSE_FIRST;
    let mut w = rw(io::WRITE, cids.1, slba, 1, sgl);
    w.flags |= nvme::cmd::FUSE_SECOND;
    r.capsule(&c, &[0x11; 4096]);
    r.capsule(&w, &[0x22; 4096]);
}

#[test]
fn a_compare_and_write_the_store_runs_as_one_op_uses_both_buffers() {
    let mut r = Rig::new(Opts {
        native_caw: true,
        ..Opts::default()
    });
    send_caw(&mut r, (5, 6), 3);
    r.settle();
    assert_eq!(r.store.compare_and_writes.len(), 1, "one op for the pair");
    let (cmp, write, first) = r.store.compare_and_writes[0];
    assert!(cmp.is_some() && write.is_some() && cmp != write);
    assert_eq!(first, 0x22, "the Write's data");
    let mut st = r.responses();
    st.sort_unstable_by_key(|s| s.0);
    assert_eq!(st, vec![(5, Status::SUCCESS), (6, Status::SUCCESS)]);
    assert!(r.idle());
}

#[test]
fn closing_while_a_compare_and_write_runs_frees_both_buffers_after_it() {
    let mut r = Rig::new(Opts {
        native_caw: true,
        ..Opts::default()
    });
    send_caw(&mut r, (5, 6), 3);
    // The capsules are taken and the Compare resumed, without reaping the backend.
    let mut wcs = vec![WorkCompletion::default(); 8];
    for _ in 0..4 {
        r.with_env(|c, env| c.poll(&mut wcs, env));
        r.with_env(|c, env| c.tick(env));
    }
    assert_eq!(r.store.inflight(), 1, "the pair's op runs");
    assert_eq!(r.store.buffers_in_use(), 2);
    r.with_env(|c, env| c.close("host disconnected", env));
    assert_eq!(r.store.buffers_in_use(), 2, "both buffers stay with the op");
    r.settle();
    assert!(r.conn.is_finished());
    assert!(r.idle(), "every slot and buffer released");
}

#[test]
fn a_flush_while_live_closes_the_queue() {
    let mut r = Rig::new(Opts::default());
    let recv = r.qp.borrow_mut().recvs.pop_front().unwrap();
    r.qp.borrow_mut().cq.push_back(WorkCompletion::new(
        wr_id(WrKind::Recv, recv),
        WcStatus::WrFlushErr,
        0,
    ));
    r.pass();
    assert!(r.conn.is_closing());
    r.settle();
    assert!(r.conn.is_finished());
}

#[test]
fn a_failed_work_request_closes_the_queue_and_counts_an_error() {
    let mut r = Rig::new(Opts::default());
    r.posted();
    r.capsule(&write(1, 0, 1), &[]);
    r.pass();
    let p = r.qp.borrow_mut().sq.pop_front().unwrap();
    r.qp.borrow_mut()
        .cq
        .push_back(WorkCompletion::new(p.wr_id, WcStatus::RemAccessErr, 0));
    r.pass();
    assert!(r.conn.is_closing());
    assert_eq!(r.conn.stats.errors, 1);
    r.settle();
    assert!(r.conn.is_finished() && r.idle());
    assert!(r.responses().is_empty());
}

#[test]
fn a_queue_pair_whose_flushes_never_come_is_destroyed_at_the_drain_limit() {
    let mut r = Rig::new(Opts::default());
    r.posted();
    r.capsule(&write(1, 0, 1), &[]);
    r.pass();
    r.qp.borrow_mut().flush_on_error = false;
    r.with_env(|c, env| c.close("host disconnected", env));
    r.pass();
    assert!(!r.conn.is_finished(), "the READ is still out");
    r.now += DRAIN_LIMIT - Duration::from_millis(1);
    r.pass();
    assert!(!r.conn.is_finished() && r.conn.has_qp());
    r.now += Duration::from_millis(2);
    r.pass();
    assert!(!r.conn.has_qp(), "destroyed: its DMA is over");
    assert!(r.conn.is_finished() && r.idle());
}

#[test]
fn shared_recvs_completed_but_not_polled_go_back_before_the_queue_pair_is_destroyed() {
    // Found by the property test: a read executing, two more capsules in the CQ not polled
    // yet, the host disconnects and the flushes never come. At the drain limit the QP is
    // destroyed, and with it (mlx5) its completions: the two shared RECVs must be back first.
    let mut r = Rig::new(Opts {
        depth: 2,
        srq: true,
        ..Opts::default()
    });
    r.capsule(&read(1, 0, 1), &[]);
    r.pass();
    r.capsule(&read(2, 0, 1), &[]);
    r.capsule(&read(3, 0, 1), &[]);
    r.qp.borrow_mut().flush_on_error = false;
    r.with_env(|c, env| c.close("host disconnected", env));
    r.now += DRAIN_LIMIT;
    r.with_env(|c, env| c.tick(env));
    assert!(!r.conn.has_qp(), "destroyed at the drain limit");
    r.settle();
    assert!(r.conn.is_finished() && r.idle());
    r.conn.reclaim_srq_recvs(&r.dev);
    let srq = r.dev.srq.as_ref().unwrap().borrow();
    assert_eq!(
        srq.posted.len() as u32,
        srq.depth,
        "every shared RECV went back to the pool"
    );
}

#[test]
fn a_host_hoarding_shared_recvs_is_cut_off() {
    // Depth 2: 4 request slots. Reads whose backend never completes hold all of them; more
    // capsules than the depth then wait in the connection, and the next one closes it.
    let mut r = Rig::new(Opts {
        depth: 2,
        srq: true,
        ..Opts::default()
    });
    for cid in 1..=4 {
        r.capsule(&read(cid, 0, 1), &[]);
    }
    let mut wcs = vec![WorkCompletion::default(); 8];
    r.with_env(|c, env| c.poll(&mut wcs, env));
    assert_eq!(r.store.inflight(), 4);
    for cid in 5..=7 {
        r.capsule(&read(cid, 0, 1), &[]);
        r.with_env(|c, env| c.poll(&mut wcs, env));
    }
    assert!(
        r.conn.is_closing(),
        "held more capsules than its queue depth"
    );
    r.settle();
    assert!(r.conn.is_finished() && r.idle());
    let srq = r.dev.srq.as_ref().unwrap().borrow();
    assert_eq!(
        srq.posted.len() as u32,
        srq.depth,
        "every shared RECV went back to the pool"
    );
}

#[test]
fn large_reads_and_writes_move_in_pieces_through_one_buffer() {
    let mut r = Rig::new(Opts::default());
    r.posted();
    // 40 KiB through 16 KiB buffers: READs of 16K, 16K, 8K at increasing host offsets.
    r.capsule(&write(1, 0, 10), &[]);
    r.settle();
    let p = r.posted();
    let reads: Vec<RemoteBuf> = p
        .iter()
        .filter_map(|p| match p.op {
            SendOp::RdmaRead { remote } => Some(remote),
            _ => None,
        })
        .collect();
    let offsets: Vec<(u64, u64)> = reads.iter().map(|b| (b.addr - HOST_ADDR, b.len)).collect();
    assert_eq!(offsets, vec![(0, 16384), (16384, 16384), (32768, 8192)]);
    assert_eq!(r.store.submitted, 3);
    // A 40 KiB read: two signaled piece WRITEs, then the last piece chained with the SEND.
    r.capsule(&read(2, 0, 10), &[]);
    r.settle();
    let p = r.posted();
    let writes: Vec<(u64, bool)> = p
        .iter()
        .filter_map(|p| match p.op {
            SendOp::RdmaWrite { remote } => Some((remote.addr - HOST_ADDR, p.signaled)),
            _ => None,
        })
        .collect();
    assert_eq!(writes, vec![(0, true), (16384, true), (32768, false)]);
    assert_eq!(
        r.responses(),
        vec![(1, Status::SUCCESS), (2, Status::SUCCESS)]
    );
    assert!(r.idle());
}

// ---------------------------------------------------------------------------------------------
// Random interleavings
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Op {
    Read(u32),
    Write(u32),
    WriteInCapsule,
    Flush,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// The host sends its next capsule (if a RECV is posted).
    Capsule,
    /// The device completes the `n` oldest send work requests.
    Complete(usize),
    /// One work request fails (not a flush).
    FailOne,
    /// The poller polls the CQ.
    Poll,
    /// The backend completes what it has.
    Reap,
    /// The poller serves its buffer FIFO.
    Grant,
    /// The poller posts the staged responses.
    FlushSends,
    /// The next post takes only `n` work requests.
    PartialPost(usize),
    /// Time passes and the connection ticks.
    Tick(u64),
    /// The backend fails or heals.
    FailBackend(bool),
    /// The host disconnects.
    Disconnect,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u32..=10).prop_map(Op::Read),
        (1u32..=10).prop_map(Op::Write),
        Just(Op::WriteInCapsule),
        Just(Op::Flush),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => Just(Step::Capsule),
        6 => (1usize..6).prop_map(Step::Complete),
        1 => Just(Step::FailOne),
        5 => Just(Step::Poll),
        4 => Just(Step::Reap),
        2 => Just(Step::Grant),
        4 => Just(Step::FlushSends),
        1 => (0usize..4).prop_map(Step::PartialPost),
        1 => (0u64..3000).prop_map(Step::Tick),
        1 => any::<bool>().prop_map(Step::FailBackend),
        1 => Just(Step::Disconnect),
    ]
}

fn run_interleaving(o: Opts, ops: &[Op], steps: &[Step]) {
    let mut r = Rig::new(o);
    let mut pending: VecDeque<(Sqe, Vec<u8>)> = VecDeque::new();
    let mut owed = BTreeMap::new();
    for (i, &op) in ops.iter().enumerate() {
        let cid = 100 + i as u16;
        let slba = (i as u64 * 16) % 2000;
        let (sqe, data) = match op {
            Op::Read(n) => (read(cid, slba, n), vec![]),
            Op::Write(n) => (write(cid, slba, n), vec![]),
            Op::WriteInCapsule => (write_in_capsule(cid, slba), vec![0x3c; 4096]),
            Op::Flush => {
                let mut s = Sqe::new(io::FLUSH, cid);
                s.nsid = 1.into();
                (s, vec![])
            }
        };
        pending.push_back((sqe, data));
        owed.insert(cid, ());
    }
    let mut faulted = false;
    let mut answered: BTreeMap<u16, u32> = BTreeMap::new();
    let mut wcs = vec![WorkCompletion::default(); 4];
    for &s in steps {
        match s {
            Step::Capsule => {
                if let Some((sqe, data)) = pending.front().cloned() {
                    if r.try_capsule(&sqe, &data) {
                        pending.pop_front();
                    }
                }
            }
            Step::Complete(n) => r.complete(n),
            Step::FailOne => {
                let mut q = r.qp.borrow_mut();
                if let Some(p) = q.sq.pop_front() {
                    q.cq.push_back(WorkCompletion::new(p.wr_id, WcStatus::RetryExcErr, 0));
                    faulted = true;
                }
            }
            Step::Poll => {
                r.with_env(|c, env| c.poll(&mut wcs, env));
            }
            Step::Reap => {
                let mut done = Vec::new();
                r.store.reap(&mut done);
                for (ud, res) in done {
                    let q = ReqRef::from_user_data(ud);
                    r.with_env(|c, env| c.backend_done(q.slot, res, env));
                }
            }
            Step::Grant => {
                r.serve_buffers();
            }
            Step::FlushSends => {
                r.with_env(|c, env| c.flush_sends(env));
            }
            Step::PartialPost(n) => {
                r.qp.borrow_mut().fail_post_after = Some(n);
                faulted = true;
            }
            Step::Tick(ms) => {
                r.now += Duration::from_millis(ms);
                r.with_env(|c, env| c.tick(env));
            }
            Step::FailBackend(f) => r.store.fail = f.then_some(libc::EIO),
            Step::Disconnect => {
                r.with_env(|c, env| c.close("host disconnected", env));
                faulted = true;
            }
        }
        r.check();
        for (cid, _) in r.responses() {
            *answered.entry(cid).or_default() += 1;
        }
    }
    // Then the host sends the rest, the device completes everything, the backend heals.
    r.store.fail = None;
    r.qp.borrow_mut().fail_post_after = None;
    for _ in 0..1000 {
        if let Some((sqe, data)) = pending.front().cloned() {
            if r.try_capsule(&sqe, &data) {
                pending.pop_front();
            }
        }
        r.settle();
        for (cid, _) in r.responses() {
            *answered.entry(cid).or_default() += 1;
        }
        if pending.is_empty() || r.conn.is_closing() {
            break;
        }
    }
    r.settle();
    for (cid, _) in r.responses() {
        *answered.entry(cid).or_default() += 1;
    }
    assert!(
        answered.values().all(|&n| n == 1),
        "answered twice: {answered:?}"
    );
    if !faulted && !r.conn.is_closing() {
        let want: Vec<u16> = owed.keys().copied().collect();
        let got: Vec<u16> = answered.keys().copied().collect();
        assert_eq!(got, want, "every command answered");
    }
    if !r.conn.is_closing() {
        r.with_env(|c, env| c.close("host disconnected", env));
    }
    r.settle();
    assert!(r.conn.is_finished(), "a closed connection drains");
    assert!(r.idle(), "no slot, buffer or sink leaked");
    // What the poller does before it drops a finished connection.
    r.conn.reclaim_srq_recvs(&r.dev);
    if let Some(srq) = &r.dev.srq {
        let q = srq.borrow();
        assert_eq!(
            q.posted.len() as u32,
            q.depth,
            "every shared RECV back in the pool"
        );
    }
}

fn opts() -> impl Strategy<Value = Opts> {
    (
        2u32..6,
        1usize..5,
        1u8..4,
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(None), (3u32..8).prop_map(Some)],
    )
        .prop_map(|(depth, bufs, ord, iwarp, srq, sq_depth)| Opts {
            depth,
            bufs,
            ord,
            sq_depth,
            iwarp,
            srq,
            inline: true,
            native_caw: false,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any order of capsules, device completions (and failures, partial posts), CQ polls,
    /// backend completions (and failures), buffer grants, flushes, time and disconnects, on
    /// own or shared RECVs, RoCE or iWARP: the books (states, buffers, sinks, send-queue
    /// credits, READ depth) balance after every step, every command is answered at most
    /// once (exactly once without faults), and in the end everything is released.
    #[test]
    fn random_interleavings_never_leak_a_slot_buffer_or_credit(
        o in opts(),
        ops in proptest::collection::vec(op(), 1..30),
        steps in proptest::collection::vec(step(), 0..150),
    ) {
        run_interleaving(o, &ops, &steps);
    }
}
