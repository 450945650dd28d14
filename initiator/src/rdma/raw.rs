//! A raw NVMe/RDMA host for tests that send exactly the bytes they want (bad input, protocol
//! corner cases): any CM private data, any SQE (the caller's command identifier, flags and
//! data pointer are sent as given), any in-capsule data, and a registered buffer the caller
//! names in keyed SGLs by hand. Nothing is checked or rewritten on the way out; every response
//! and connection event is handed back as it came. Behind the `raw` cargo feature (the
//! `rdma_bad_input` example is its user); the library's own queues never use it.
//!
//! Connection setup is the one of [`super::RdmaLink`] ([`rdma::active`]'s address and route
//! resolution and connect, every RECV posted before `rdma_connect`, the Linux host's connection
//! parameters); only the private data and the sizes are the caller's.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::sgl::Sgl;
use nvme::{Cqe, Sqe};
use rdma::active::{self, ConnectError, Step};
use rdma::{
    AccessFlags, CmEventType, CmId, ConnParam, Cq, EventChannel, Mr, Pd, Qp, QpInitAttr, SendWr,
    Transport, WcStatus, WorkCompletion,
};

use super::error::rejected;
use super::queue::connect_error;
use super::queue::{CQE_LEN, NUDGE_AFTER, NUDGE_FLAG, RECV_FLAG, SQE_LEN};
use crate::error::Error;

/// Capsule slots: SENDs that may be in flight at once (the send queue depth).
const SLOTS: usize = 128;
/// In-capsule data a slot can carry after its SQE.
pub const MAX_IN_CAPSULE: usize = 16 * 1024;
const SLOT_LEN: usize = SQE_LEN + MAX_IN_CAPSULE;
/// The registered buffer the caller names in keyed SGLs.
pub const HOST_BUF_LEN: usize = 1 << 20;

/// How a connection attempt ended.
#[derive(Debug)]
pub enum Outcome {
    /// ESTABLISHED; the reply's `crqsize` when its private data carried one.
    Connected(Box<RawConn>, Option<u16>),
    /// REJECTED: the CM status, the reject's private data as received, and the library's
    /// reading of it.
    Rejected {
        cm_status: i32,
        private_data: Vec<u8>,
        detail: String,
    },
    /// Any other CM event in answer to the connect (UNREACHABLE, CONNECT_ERROR, ...).
    Other(CmEventType, i32),
}

/// What the connection reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A response capsule.
    Cqe(Cqe),
    /// A RECV or SEND completed in error (`op`, status): the QP is in the error state.
    WcError(&'static str, WcStatus),
    /// An rdma_cm event (DISCONNECTED, ...).
    Cm(CmEventType),
    /// Nothing within the wait.
    Timeout,
}

/// One raw NVMe/RDMA connection. Drop disconnects and reaps the flushed work requests.
pub struct RawConn {
    qp: Qp,
    cq: Arc<Cq>,
    id: CmId,
    ch: EventChannel,
    slots: Mr,
    rsp: Mr,
    host: Mr,
    next_slot: usize,
    sends_out: u32,
    recvs_out: u32,
    pending: VecDeque<Event>,
    wcs: Box<[WorkCompletion]>,
    /// iWARP, no response yet: when to nudge the target's receive stream, as the library's
    /// queues do (Linux siw can leave a new connection's first capsule unread; DESIGN.md, "A
    /// first capsule left unread"). The nudge's completion is not an [`Event`].
    nudge_at: Option<Instant>,
}

impl std::fmt::Debug for RawConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawConn")
            .field("qp_num", &self.qp.qp_num())
            .field("sends_out", &self.sends_out)
            .field("recvs_out", &self.recvs_out)
            .finish_non_exhaustive()
    }
}

impl RawConn {
    /// Resolve `dst`, create a QP with `nrecv` response RECVs (all posted first) and
    /// `rdma_connect` with `private_data` as given.
    pub fn connect(
        dst: SocketAddr,
        private_data: &[u8],
        nrecv: u32,
        timeout: Duration,
    ) -> Result<Outcome, Error> {
        RawConn::connect_with_ird(dst, private_data, nrecv, timeout, None)
    }

    /// [`RawConn::connect`] announcing `ird` RDMA READs this host serves at once
    /// (`responder_resources`; None: the device's maximum, as the Linux host does).
    pub fn connect_with_ird(
        dst: SocketAddr,
        private_data: &[u8],
        nrecv: u32,
        timeout: Duration,
        ird: Option<u8>,
    ) -> Result<Outcome, Error> {
        let deadline = Instant::now() + timeout;
        let ch = EventChannel::new()?;
        let (id, ctx) =
            active::resolve(&ch, 0, dst, deadline).map_err(|e| connect_error(0, timeout, e))?;
        let attr = ctx.query_device()?;
        let nsend = (SLOTS as u32).min(attr.max_qp_wr);
        let nrecv = nrecv.clamp(1, attr.max_qp_wr);
        let pd = Arc::new(Pd::new(&ctx)?);
        let cq = Arc::new(Cq::new(&ctx, nsend + nrecv)?);
        let qp = Qp::create(
            &id,
            &pd,
            &QpInitAttr {
                max_send_sge: attr.max_sge.clamp(1, 2),
                ..QpInitAttr::new(&cq, nsend, nrecv)
            },
        )?;
        let slots = Mr::alloc(&pd, SLOTS * SLOT_LEN, AccessFlags::empty())?;
        let rsp = Mr::alloc(&pd, nrecv as usize * CQE_LEN, AccessFlags::LOCAL_WRITE)?;
        let host = Mr::alloc(
            &pd,
            HOST_BUF_LEN,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        )?;
        qp.post_recv_slots(&rsp, CQE_LEN, nrecv as usize, RECV_FLAG)?;
        let param = ConnParam {
            private_data,
            responder_resources: ird.unwrap_or(attr.max_qp_rd_atom.min(255) as u8),
            initiator_depth: 0,
            flow_control: true,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        let crqsize = match active::connect(&ch, &id, &param, deadline) {
            Ok(ev) => nvme::rdma::CmReply::decode(ev.private_data())
                .ok()
                .map(|r| r.crqsize),
            Err(ConnectError::Rejected {
                status,
                private_data,
            }) => {
                let detail = rejected(0, status, &private_data).to_string();
                return Ok(Outcome::Rejected {
                    cm_status: status,
                    private_data,
                    detail,
                });
            }
            Err(ConnectError::Event {
                step: Step::Connect,
                event,
                status,
            }) => return Ok(Outcome::Other(event, status)),
            Err(e) => return Err(connect_error(0, timeout, e)),
        };
        let conn = RawConn {
            qp,
            cq,
            id,
            ch,
            slots,
            rsp,
            host,
            next_slot: 0,
            sends_out: 0,
            recvs_out: nrecv,
            pending: VecDeque::new(),
            wcs: (0..32).map(|_| WorkCompletion::default()).collect(),
            nudge_at: (ctx.transport() == Transport::Iwarp).then(|| Instant::now() + NUDGE_AFTER),
        };
        Ok(Outcome::Connected(Box::new(conn), crqsize))
    }

    /// The registered buffer (1 MiB) that keyed SGLs may name.
    pub fn host_buf(&self) -> &Mr {
        &self.host
    }

    /// A keyed SGL (subtype 0) naming `[off, off + len)` of the host buffer with its real rkey.
    pub fn keyed(&self, off: usize, len: u32) -> [u8; 16] {
        Sgl::Keyed {
            addr: self.host.addr() + off as u64,
            len,
            key: self.host.rkey(),
            invalidate: false,
        }
        .encode()
    }

    /// SEND one capsule: `sqe` exactly as given, followed by `data` in the capsule (up to
    /// [`MAX_IN_CAPSULE`] bytes). Waits for a free send slot first if all are in flight.
    pub fn send(&mut self, sqe: &Sqe, data: &[u8]) -> Result<(), Error> {
        if data.len() > MAX_IN_CAPSULE {
            return Err(Error::InvalidArgument(format!(
                "{} bytes of in-capsule data (at most {MAX_IN_CAPSULE})",
                data.len()
            )));
        }
        let end = Instant::now() + Duration::from_secs(5);
        while self.sends_out as usize >= SLOTS.min(self.qp.caps().max_send_wr as usize) {
            if Instant::now() >= end {
                return Err(Error::Timeout(Duration::from_secs(5), "a free send slot"));
            }
            self.poll_once()?;
        }
        let off = self.next_slot * SLOT_LEN;
        self.next_slot = (self.next_slot + 1) % SLOTS;
        self.slots.write_at(off, &sqe.encode())?;
        let mut sges = vec![self.slots.sge(off, SQE_LEN)?];
        if !data.is_empty() {
            self.slots.write_at(off + SQE_LEN, data)?;
            sges.push(self.slots.sge(off + SQE_LEN, data.len())?);
        }
        self.qp
            .post_send(&[SendWr::send(off as u64, &sges).signaled()])?;
        self.sends_out += 1;
        Ok(())
    }

    /// The next response or connection event, waiting at most `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Result<Event, Error> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Ok(e);
            }
            if self.poll_once()? == 0 {
                if Instant::now() >= end {
                    return Ok(Event::Timeout);
                }
                self.nudge_if_due()?;
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Send `sqe` (+ in-capsule `data`) and wait for the response with its command identifier;
    /// responses for other commands are dropped. Any other event ends the wait.
    pub fn command(&mut self, sqe: &Sqe, data: &[u8], timeout: Duration) -> Result<Event, Error> {
        self.send(sqe, data)?;
        let end = Instant::now() + timeout;
        loop {
            match self.next(end.saturating_duration_since(Instant::now()))? {
                Event::Cqe(c) if c.cid() != sqe.cid() => continue,
                e => return Ok(e),
            }
        }
    }

    /// iWARP, no response since connecting and [`NUDGE_AFTER`] gone by: one zero-length RDMA
    /// WRITE (it names no memory), so that a target whose siw left the first capsule unread
    /// reads it.
    fn nudge_if_due(&mut self) -> Result<(), Error> {
        let Some(at) = self.nudge_at else {
            return Ok(());
        };
        if Instant::now() < at
            || self.sends_out as usize >= SLOTS.min(self.qp.caps().max_send_wr as usize)
        {
            return Ok(());
        }
        self.nudge_at = None;
        self.qp
            .post_send(&[SendWr::zero_length_write(NUDGE_FLAG).signaled()])?;
        self.sends_out += 1;
        Ok(())
    }

    /// One pass over the CQ and the CM channel; returns how many events it queued.
    fn poll_once(&mut self) -> Result<usize, Error> {
        let n = self.cq.poll(&mut self.wcs)?;
        let before = self.pending.len();
        for i in 0..n {
            let wc = self.wcs[i].clone();
            let recv = wc.wr_id() & RECV_FLAG != 0;
            if recv {
                self.recvs_out -= 1;
                self.nudge_at = None;
            } else {
                self.sends_out -= 1;
            }
            if wc.wr_id() & NUDGE_FLAG != 0 {
                // Failed or flushed too when the target has already dropped the connection:
                // what the caller waits for tells that, not the nudge.
                continue;
            }
            if !wc.is_ok() {
                let op = if recv { "RECV" } else { "SEND" };
                self.pending.push_back(Event::WcError(op, wc.status()));
                continue;
            }
            if recv {
                let idx = (wc.wr_id() & 0xffff_ffff) as usize;
                let mut raw = [0u8; CQE_LEN];
                self.rsp.read_at(idx * CQE_LEN, &mut raw)?;
                let sge = self.rsp.sge(idx * CQE_LEN, CQE_LEN)?;
                self.qp.post_recv(wc.wr_id(), &[sge])?;
                self.recvs_out += 1;
                let cqe = Cqe::decode(&raw).expect("16 bytes");
                self.pending.push_back(Event::Cqe(cqe));
            }
        }
        if let Some(ev) = self.ch.try_get_event()? {
            self.pending.push_back(Event::Cm(ev.event_type()));
        }
        Ok(self.pending.len() - before)
    }
}

impl Drop for RawConn {
    fn drop(&mut self) {
        let _ = self.id.disconnect();
        let _ = self.qp.set_error();
        let end = Instant::now() + Duration::from_secs(2);
        while (self.recvs_out > 0 || self.sends_out > 0) && Instant::now() < end {
            match self.cq.poll(&mut self.wcs) {
                Ok(0) => std::thread::sleep(Duration::from_micros(200)),
                Ok(n) => {
                    for wc in &self.wcs[..n] {
                        if wc.wr_id() & RECV_FLAG != 0 {
                            self.recvs_out = self.recvs_out.saturating_sub(1);
                        } else {
                            self.sends_out = self.sends_out.saturating_sub(1);
                        }
                    }
                }
                Err(_) => break,
            }
        }
    }
}
