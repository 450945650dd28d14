//! One NVMe/RDMA queue: an rdma_cm connection, a QP with its own CQ, the SQE and CQE buffers,
//! a registered buffer pool and a slot per tag.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nvme::cmd::{PSDT_MASK, PSDT_SGL};
use nvme::rdma::{CmReply, CmRequest};
use nvme::sgl::Sgl;
use nvme::{Cqe, Sqe};
use rdma::{
    active, AccessFlags, CmId, CompChannel, ConnParam, Cq, EventChannel, Mr, Pd, Qp, QpInitAttr,
    SendWr, WorkCompletion,
};

use super::error::{connect_error, RdmaError};
use super::pool::{Pool, RdmaBuf};
use super::state::{next, CmdEvent, CmdState};
use crate::error::{CmdError, Error};
use crate::queue::{Completion, Data, DataRef, Dir, QueueParams, Stats, SubmitError};
use crate::spin::{Spin, SpinWindow};

/// Bytes of one SQE slot and of one CQE RECV buffer.
pub(super) const SQE_LEN: usize = 64;
pub(super) const CQE_LEN: usize = 16;
/// `wr_id` bit marking a RECV (the low 32 bits are the RECV buffer index); SENDs carry the tag.
pub(super) const RECV_FLAG: u64 = 1 << 32;
/// Work completions taken per `ibv_poll_cq`.
const POLL_BATCH: usize = 32;
/// Longest wait for the flush completions of a failed or closing queue.
const DRAIN_WAIT: Duration = Duration::from_secs(2);
/// Deepest queue accepted (hrqsize = depth + 1 must fit the 16-bit CM field with room).
const MAX_DEPTH: u16 = 4096;

/// The rdma_cm connection and its verbs objects. The QP holds its CM id, PD and CQ; the CQ its
/// completion channel (the rdma crate forces the destruction order).
struct Conn {
    qp: Qp,
    cq: Arc<Cq>,
    comp: Arc<CompChannel>,
    id: CmId,
    ch: EventChannel,
    /// The device is iWARP (siw): reported in Debug, used by the bring-up log.
    iwarp: bool,
    dev: String,
}

/// Per-tag state.
#[derive(Debug, Default)]
struct Slot {
    state: CmdState,
    user_data: u64,
    /// The data buffer while the command runs (owned by the queue, returned at completion).
    buf: Option<RdmaBuf>,
    /// A borrowed-buffer command ([`RdmaQueue::run_borrowed`]): offset in the caller's buffer.
    ext_off: Option<usize>,
    dir: Dir,
    len: u32,
    /// The rkey named in the keyed SGL (none for in-capsule or no data).
    rkey: Option<u32>,
    result: Option<Result<u64, CmdError>>,
    deadline: Option<Instant>,
}

/// One NVMe/RDMA I/O queue (also used for the admin queue). Not shared between threads: give
/// each thread its own. See the [module doc](crate::rdma) for the data path, the buffer pool and
/// the rkey exposure it implies.
///
/// The methods are those of [`crate::IoQueue`], with [`RdmaBuf`] in place of `Vec<u8>`: take
/// buffers from [`RdmaQueue::alloc_buf`], [`submit`](RdmaQueue::submit) them in [`Data`], get
/// them back in the [`Completion`].
pub struct RdmaQueue {
    qid: u16,
    conn: Conn,
    /// `tags` SQE slots (local access only: they are SENT, never addressed by the target).
    cmd_mr: Mr,
    /// `nrecv` CQE RECV buffers.
    rsp_mr: Mr,
    nrecv: u32,
    nsend: u32,
    pool: Pool,
    slots: Box<[Slot]>,
    free: Vec<u16>,
    inflight: usize,
    done: VecDeque<u16>,
    ext_done: Vec<u16>,
    /// Send-queue entries that may still be posted (one per command; returned by its SEND's
    /// completion), so the SQ never overflows.
    sq_free: u32,
    /// RECVs posted and not yet completed.
    recv_posted: u32,
    icd_max: u32,
    timeout: Duration,
    spin: Spin,
    failed: Option<Arc<Error>>,
    wcs: Box<[WorkCompletion]>,
    spins: u32,
    stats: Stats,
}

impl fmt::Debug for RdmaQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaQueue")
            .field("qid", &self.qid)
            .field("device", &self.conn.dev)
            .field("iwarp", &self.conn.iwarp)
            .field("qp_num", &self.conn.qp.qp_num())
            .field("depth", &self.slots.len())
            .field("recvs", &self.nrecv)
            .field("in_flight", &self.inflight)
            .field("icd_max", &self.icd_max)
            .field("pool", &self.pool)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

fn limit_error(what: &str, want: u32, have: u32, depth: u16) -> Error {
    Error::InvalidArgument(format!(
        "queue depth {depth} needs {want} {what}; the RDMA device allows {have}"
    ))
}

impl RdmaQueue {
    /// Connect one queue to `dst` the way the Linux host does (`nvme_rdma_route_resolved`):
    /// resolve address and route, create the QP and post one RECV per response the queue can
    /// receive, then `rdma_connect` with the NVMe/RDMA CM request (qid, hrqsize = depth + 1,
    /// hsqsize = depth, cntlid). Fabrics Connect is the caller's next step.
    ///
    /// `p.depth` is the number of tags (commands in flight); the SQSIZE the caller then puts in
    /// Connect is `p.depth` too (0's based: one entry more than can be in flight).
    pub(crate) fn connect(
        dst: &SocketAddr,
        p: &QueueParams,
        cntlid: u16,
    ) -> Result<RdmaQueue, Error> {
        let qid = p.qid;
        let tags = p.depth.max(1);
        if tags > MAX_DEPTH {
            return Err(Error::InvalidArgument(format!(
                "NVMe/RDMA queue depth {tags} (at most {MAX_DEPTH})"
            )));
        }
        let deadline = Instant::now() + p.timeout;
        let ch = EventChannel::new()?;
        let (id, ctx) = active::resolve(&ch, qid as u64, *dst, deadline)
            .map_err(|e| connect_error(qid, p.timeout, e))?;
        let attr = ctx.query_device()?;
        let nrecv = tags as u32 + 1;
        let nsend = tags as u32 + 1;
        if nsend > attr.max_qp_wr {
            return Err(limit_error("work requests", nsend, attr.max_qp_wr, tags));
        }
        if nsend + nrecv > attr.max_cqe {
            return Err(limit_error("CQ entries", nsend + nrecv, attr.max_cqe, tags));
        }
        let pd = Arc::new(Pd::new(&ctx)?);
        let comp = Arc::new(CompChannel::new(&ctx)?);
        let cq = Arc::new(Cq::with_channel(&ctx, nsend + nrecv, &comp, qid as u64)?);
        // Two send SGEs: the SQE and in-capsule data.
        let qp = Qp::create(
            &id,
            &pd,
            &QpInitAttr {
                max_send_sge: attr.max_sge.clamp(1, 2),
                ..QpInitAttr::new(&cq, nsend, nrecv)
            },
        )?;
        let cmd_mr = Mr::alloc(&pd, tags as usize * SQE_LEN, AccessFlags::empty())?;
        let rsp_mr = Mr::alloc(&pd, nrecv as usize * CQE_LEN, AccessFlags::LOCAL_WRITE)?;
        // Every RECV before rdma_connect: the target may answer as soon as it is connected.
        qp.post_recv_slots(&rsp_mr, CQE_LEN, nrecv as usize, RECV_FLAG)?;
        let req = CmRequest {
            qid,
            hrqsize: nrecv as u16,
            hsqsize: tags,
            cntlid,
        }
        .encode();
        let param = ConnParam {
            private_data: &req,
            // The target RDMA_READs our write data: accept as many READs as the device can.
            responder_resources: attr.max_qp_rd_atom.min(255) as u8,
            // This host never issues RDMA READs (as the Linux host leaves it: 0).
            initiator_depth: 0,
            flow_control: true,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        let ev = active::connect(&ch, &id, &param, deadline)
            .map_err(|e| connect_error(qid, p.timeout, e))?;
        // The reply's crqsize bounds the commands the target can hold (the Linux host ignores
        // it; honouring it costs nothing). No or malformed reply data: trust hsqsize.
        let mut usable = tags;
        if let Ok(rep) = CmReply::decode(ev.private_data()) {
            if rep.crqsize > 0 && rep.crqsize < tags {
                tracing::warn!(
                    qid,
                    crqsize = rep.crqsize,
                    depth = tags,
                    "target's receive queue is smaller than the queue depth: using crqsize"
                );
                usable = rep.crqsize;
            }
        }
        let iwarp = ctx.transport() == rdma::Transport::Iwarp;
        let dev = ctx.name();
        tracing::debug!(qid, device = %dev, iwarp, depth = usable, "NVMe/RDMA queue connected");
        Ok(RdmaQueue {
            qid,
            conn: Conn {
                qp,
                cq,
                comp,
                id,
                ch,
                iwarp,
                dev,
            },
            cmd_mr,
            rsp_mr,
            nrecv,
            nsend,
            pool: Pool::new(&pd),
            slots: (0..tags).map(|_| Slot::default()).collect(),
            free: (0..usable).rev().collect(),
            inflight: 0,
            done: VecDeque::with_capacity(tags as usize),
            ext_done: Vec::with_capacity(tags as usize),
            sq_free: nsend,
            recv_posted: nrecv,
            icd_max: 0,
            timeout: p.timeout,
            spin: p.spin,
            failed: None,
            wcs: (0..POLL_BATCH).map(|_| WorkCompletion::default()).collect(),
            spins: 0,
            stats: Stats::default(),
        })
    }

    /// Largest write sent in the capsule (bytes; 0: none). Needs a second send SGE.
    pub(crate) fn set_icd_max(&mut self, bytes: u32) {
        self.icd_max = if self.conn.qp.caps().max_send_sge >= 2 {
            bytes
        } else {
            0
        };
    }

    /// Queue identifier (0 = admin).
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Number of tags.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Commands submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.inflight
    }

    /// Free tags.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// The in-capsule data limit for writes on this queue (0: every write by RDMA_READ).
    pub fn in_capsule_limit(&self) -> u32 {
        self.icd_max
    }

    /// Counters. `socket_payload_bytes` is always 0 and `memcpy_bytes` counts only the copies
    /// of the borrowed-buffer calls ([`crate::Namespace`], admin commands): data in
    /// [`RdmaBuf`]s is placed by the device. `syscalls` counts completion-channel sleeps and
    /// event reads (posting is the provider's doorbell and not counted).
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Why the queue failed, if it did.
    pub fn error(&self) -> Option<&Error> {
        self.failed.as_deref()
    }

    /// Whether the queue can still be used.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Spin on the CQ instead of sleeping on the completion channel while waiting.
    pub fn set_busy_poll(&mut self, on: bool) {
        self.spin.always = on;
    }

    /// The RDMA device the queue runs on (e.g. `rxe0`).
    pub fn device(&self) -> &str {
        &self.conn.dev
    }

    /// Bytes of memory this queue's pool has registered (and so exposed to the target).
    pub fn registered_bytes(&self) -> usize {
        self.pool.registered().0
    }

    /// A buffer of `len` bytes (1 byte to 8 MiB) from this queue's registered pool. Submitted
    /// on this queue, its memory is what the target reads or writes: no copy. Contents are
    /// unspecified. The first buffer of a size class registers a slab (a slow path); later
    /// ones come from the free list.
    pub fn alloc_buf(&self, len: usize) -> Result<RdmaBuf, Error> {
        self.pool.alloc(len)
    }

    fn failed_error(&self) -> Option<Error> {
        self.failed.as_ref().map(|c| Error::QueueFailed {
            qid: self.qid,
            cause: c.clone(),
        })
    }

    /// Submit a command. The queue sets the command identifier (the returned tag), PSDT and the
    /// data pointer: a keyed SGL (subtype 0: no remote invalidation) naming the buffer, or
    /// in-capsule data for a write that fits. The buffer must come from this queue's
    /// [`alloc_buf`](RdmaQueue::alloc_buf); it comes back in the [`Completion`].
    pub fn submit(
        &mut self,
        sqe: Sqe,
        data: Data<RdmaBuf>,
        user_data: u64,
    ) -> Result<u16, SubmitError<RdmaBuf>> {
        let (dir, buf) = match data {
            Data::None => (Dir::None, None),
            Data::ToController(b) => (Dir::ToCtrl, Some(b)),
            Data::FromController(b) => (Dir::FromCtrl, Some(b)),
        };
        if let Some(error) = self.failed_error() {
            return Err(SubmitError { error, buf });
        }
        if buf.as_ref().is_some_and(|b| !self.pool.owns(b)) {
            let error = Error::InvalidArgument(format!(
                "the buffer comes from another queue's pool (queue {} takes its own alloc_buf)",
                self.qid
            ));
            return Err(SubmitError { error, buf });
        }
        if self.free.is_empty() {
            return Err(SubmitError {
                error: Error::QueueFull,
                buf,
            });
        }
        self.start(sqe, dir, buf, None, user_data)
            .map_err(|(error, buf)| SubmitError { error, buf })
    }

    /// Post the capsule of a command on a free tag (the caller checked there is one and that
    /// the queue has not failed).
    fn start(
        &mut self,
        mut sqe: Sqe,
        dir: Dir,
        buf: Option<RdmaBuf>,
        ext_off: Option<usize>,
        user_data: u64,
    ) -> Result<u16, (Error, Option<RdmaBuf>)> {
        if self.sq_free == 0 {
            // Cannot happen while every tag holds at most one send WR; refuse rather than
            // overflow the SQ.
            return Err((Error::QueueFull, buf));
        }
        let tag = self.free.pop().expect("caller checked for a free tag");
        let len = buf.as_ref().map_or(0, |b| b.len() as u32);
        sqe.cid = tag.into();
        sqe.flags = (sqe.flags & !PSDT_MASK) | PSDT_SGL;
        let incapsule = dir == Dir::ToCtrl && len > 0 && len <= self.icd_max;
        let (sgl, rkey) = match &buf {
            // No data: keyed, all zero (nvme_rdma_set_sg_null).
            None => (
                Sgl::Keyed {
                    addr: 0,
                    len: 0,
                    key: 0,
                    invalidate: false,
                },
                None,
            ),
            Some(_) if incapsule => (Sgl::InCapsule { offset: 0, len }, None),
            Some(b) => {
                let r = b.remote();
                (
                    Sgl::Keyed {
                        addr: r.addr,
                        len,
                        key: r.rkey,
                        invalidate: false,
                    },
                    Some(r.rkey),
                )
            }
        };
        sqe.dptr = sgl.encode();
        let off = tag as usize * SQE_LEN;
        let posted = self
            .cmd_mr
            .write_at(off, &sqe.encode())
            .and_then(|()| self.cmd_mr.sge(off, SQE_LEN))
            .and_then(|sqe_sge| match &buf {
                Some(b) if incapsule => {
                    let sges = [sqe_sge, b.sge()];
                    self.conn
                        .qp
                        .post_send(&[SendWr::send(tag as u64, &sges).signaled()])
                }
                _ => {
                    let sges = [sqe_sge];
                    self.conn
                        .qp
                        .post_send(&[SendWr::send(tag as u64, &sges).signaled()])
                }
            });
        if let Err(e) = posted {
            self.free.push(tag);
            return Err((self.fail(e.into()), buf));
        }
        self.sq_free -= 1;
        let slot = &mut self.slots[tag as usize];
        *slot = Slot {
            state: next(CmdState::Free, CmdEvent::Posted).expect("a free tag can be posted"),
            user_data,
            buf,
            ext_off,
            dir,
            len,
            rkey,
            result: None,
            deadline: crate::any_queue::deadline_for(&sqe, self.qid, self.timeout),
        };
        self.inflight += 1;
        self.stats.commands += 1;
        Ok(tag)
    }

    /// Move `tag` through the state machine; an impossible event fails the queue.
    fn advance(&mut self, tag: u16, ev: CmdEvent) -> Result<(), Error> {
        let s = self.slots[tag as usize].state;
        match next(s, ev) {
            Some(n) => {
                self.slots[tag as usize].state = n;
                if n == CmdState::Done {
                    self.finish(tag);
                }
                Ok(())
            }
            None => {
                let msg = format!("command {tag}: {ev:?} while {s:?}");
                Err(self.protocol_error(msg))
            }
        }
    }

    fn finish(&mut self, tag: u16) {
        let slot = &mut self.slots[tag as usize];
        slot.deadline = None;
        self.stats.completed += 1;
        if matches!(slot.result, Some(Ok(_))) {
            self.stats.payload_bytes += slot.len as u64;
        }
        if slot.ext_off.is_some() {
            self.ext_done.push(tag);
        } else {
            self.done.push_back(tag);
        }
    }

    fn release(&mut self, tag: u16) -> Slot {
        let slot = std::mem::take(&mut self.slots[tag as usize]);
        debug_assert_eq!(next(slot.state, CmdEvent::Reaped), Some(CmdState::Free));
        self.free.push(tag);
        self.inflight -= 1;
        slot
    }

    fn protocol_error(&mut self, msg: String) -> Error {
        let qid = self.qid;
        self.fail(RdmaError::Protocol { qid, msg }.into())
    }

    /// Take the work completions the CQ has and process them. Returns how many there were.
    fn process_cq(&mut self) -> Result<usize, Error> {
        let mut total = 0;
        loop {
            let n = match self.conn.cq.poll(&mut self.wcs) {
                Ok(n) => n,
                Err(e) => return Err(self.fail(e.into())),
            };
            for i in 0..n {
                let wc = self.wcs[i].clone();
                self.on_wc(&wc)?;
            }
            total += n;
            if n < self.wcs.len() {
                return Ok(total);
            }
        }
    }

    fn on_wc(&mut self, wc: &WorkCompletion) -> Result<(), Error> {
        let id = wc.wr_id();
        let recv = id & RECV_FLAG != 0;
        if recv {
            self.recv_posted -= 1;
        } else {
            self.sq_free += 1;
        }
        if !wc.is_ok() {
            let e = RdmaError::Completion {
                qid: self.qid,
                op: if recv { "RECV" } else { "capsule SEND" },
                status: wc.status(),
                vendor_err: wc.vendor_err(),
            };
            return Err(self.fail(e.into()));
        }
        if recv {
            self.on_response((id & 0xffff_ffff) as usize, wc)
        } else {
            let tag = (id & 0xffff) as u16;
            if tag as usize >= self.slots.len() {
                return Err(self.protocol_error(format!("SEND completion for tag {tag}")));
            }
            self.advance(tag, CmdEvent::SendCompleted)
        }
    }

    /// A CQE arrived in RECV buffer `idx`.
    fn on_response(&mut self, idx: usize, wc: &WorkCompletion) -> Result<(), Error> {
        if (wc.byte_len() as usize) < CQE_LEN {
            let n = wc.byte_len();
            return Err(self.protocol_error(format!(
                "unexpected completion length {n} (a CQE is 16 bytes)"
            )));
        }
        let mut raw = [0u8; CQE_LEN];
        let read = self.rsp_mr.read_at(idx * CQE_LEN, &mut raw);
        // Repost the RECV before the command completes: its tag can be reused (and a new
        // response be sent) only after that, so a RECV is always waiting for every response.
        let reposted = read
            .and_then(|()| self.rsp_mr.sge(idx * CQE_LEN, CQE_LEN))
            .and_then(|sge| self.conn.qp.post_recv(RECV_FLAG | idx as u64, &[sge]));
        if let Err(e) = reposted {
            return Err(self.fail(e.into()));
        }
        self.recv_posted += 1;
        let cqe = Cqe::decode(&raw).expect("16 bytes");
        let tag = cqe.cid();
        let waiting = self
            .slots
            .get(tag as usize)
            .is_some_and(|s| s.state.awaits_response());
        if !waiting {
            return Err(self.protocol_error(format!(
                "response for command {tag}, which is not waiting for one (bad command_id)"
            )));
        }
        if let Some(inv) = wc.invalidated_rkey() {
            // Every keyed SGL of this host has subtype 0 (no invalidation): a target that
            // invalidates anyway has just killed a pool slab's key (nvme_rdma_process_nvme_rsp:
            // "Bogus remote invalidation").
            let named = self.slots[tag as usize].rkey;
            return Err(self.protocol_error(format!(
                "bogus remote invalidation of rkey {inv:#x} by the response to command {tag} \
                 (its SGL named {named:x?} and asked for no invalidation)"
            )));
        }
        let st = cqe.status();
        self.slots[tag as usize].result = Some(if st.is_success() {
            Ok(cqe.result.get())
        } else {
            Err(CmdError::Status(st))
        });
        self.advance(tag, CmdEvent::Response)
    }

    /// Read one rdma_cm event if there is one. After ESTABLISHED every event ends the queue
    /// (DISCONNECTED, DEVICE_REMOVAL, ADDR_CHANGE, TIMEWAIT_EXIT), as on the Linux host.
    fn check_cm(&mut self) -> Result<(), Error> {
        self.stats.syscalls += 1;
        match self.conn.ch.try_get_event() {
            Ok(None) => Ok(()),
            Ok(Some(ev)) => {
                // Responses already in the CQ still count.
                self.process_cq()?;
                let qid = self.qid;
                Err(self.fail(
                    RdmaError::Disconnected {
                        qid,
                        event: ev.event_type(),
                    }
                    .into(),
                ))
            }
            Err(e) => Err(self.fail(e.into())),
        }
    }

    /// Stop the QP and wait (bounded) until the device has returned every posted work request,
    /// so no buffer handed back afterwards is still addressed by the device. `failed`: the
    /// connection is already broken; siw then may not flush what its dead stream held, which
    /// is no longer reachable by the peer either, so running out of time is not news.
    fn quiesce(&mut self, failed: bool) {
        if let Err(e) = self.conn.qp.set_error() {
            tracing::debug!(qid = self.qid, error = %e, "moving the QP to ERR failed");
        }
        if let Err(e) = self.conn.id.disconnect() {
            tracing::debug!(qid = self.qid, error = %e, "rdma_disconnect failed");
        }
        let end = Instant::now() + self.timeout.min(DRAIN_WAIT);
        while self.recv_posted > 0 || self.sq_free < self.nsend {
            match self.conn.cq.poll(&mut self.wcs) {
                Ok(0) if Instant::now() >= end => {
                    let (recvs, sends) = (self.recv_posted, self.nsend - self.sq_free);
                    if failed {
                        tracing::debug!(qid = self.qid, recvs, sends, "work requests not flushed");
                    } else {
                        tracing::warn!(qid = self.qid, recvs, sends, "work requests not flushed");
                    }
                    return;
                }
                Ok(0) => std::thread::sleep(Duration::from_micros(200)),
                Ok(n) => {
                    for wc in &self.wcs[..n] {
                        if wc.wr_id() & RECV_FLAG != 0 {
                            self.recv_posted = self.recv_posted.saturating_sub(1);
                        } else {
                            self.sq_free = (self.sq_free + 1).min(self.nsend);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(qid = self.qid, error = %e, "polling the CQ while draining");
                    return;
                }
            }
        }
    }

    /// Fail the queue: stop and drain the QP, then complete everything in flight.
    fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            let timeout = matches!(e, Error::Timeout(..));
            tracing::warn!(qid = self.qid, error = %e, "NVMe/RDMA queue failed");
            self.failed = Some(Arc::new(e));
            self.quiesce(true);
            let err = if timeout {
                CmdError::Timeout
            } else {
                CmdError::QueueFailed
            };
            for tag in 0..self.slots.len() as u16 {
                let s = &mut self.slots[tag as usize];
                if !s.state.in_flight() {
                    continue;
                }
                // A command whose response arrived keeps it: the target did execute it.
                s.result.get_or_insert(Err(err));
                s.state = next(s.state, CmdEvent::QueueFailed).expect("in flight");
                self.finish(tag);
            }
        }
        self.failed_error().expect("set above")
    }

    /// Wait until a completion or CM event may be there, a command times out, or `until`. With
    /// `spin`, return at once (checking the deadlines and the CM channel every 1024th time).
    fn wait(&mut self, until: Option<Instant>, spin: bool) -> Result<(), Error> {
        self.spins = self.spins.wrapping_add(1);
        if spin && self.spins % 1024 != 0 {
            std::hint::spin_loop();
            return Ok(());
        }
        let now = Instant::now();
        let oldest = self
            .slots
            .iter()
            .filter(|s| s.state.in_flight())
            .filter_map(|s| s.deadline)
            .min();
        if oldest.is_some_and(|d| d <= now) {
            return Err(self.fail(Error::Timeout(self.timeout, "a command completion")));
        }
        if spin {
            return self.check_cm();
        }
        // Arm, then look once more: a completion that came before the arm raises no event.
        if let Err(e) = self.conn.cq.req_notify(false) {
            return Err(self.fail(e.into()));
        }
        if self.process_cq()? > 0 {
            return Ok(());
        }
        let wake = match (oldest, until) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(now + self.timeout),
        };
        let ms = wake
            .saturating_duration_since(now)
            .as_millis()
            .clamp(1, i32::MAX as u128) as i32;
        let (comp_fd, cm_fd) = (self.conn.comp.fd(), self.conn.ch.fd());
        // SAFETY: both descriptors belong to channels owned by this queue, open until it drops;
        // they are only borrowed for this poll call.
        let (comp_fd, cm_fd) = unsafe {
            (
                BorrowedFd::borrow_raw(comp_fd),
                BorrowedFd::borrow_raw(cm_fd),
            )
        };
        let mut fds = [
            PollFd::new(comp_fd, PollFlags::POLLIN),
            PollFd::new(cm_fd, PollFlags::POLLIN),
        ];
        self.stats.syscalls += 1;
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(self.fail(Error::Io(std::io::Error::from(e)))),
        }
        let cm_ready = fds[1].revents().is_some_and(|r| !r.is_empty());
        // Acknowledge the completion events (the next wait re-arms).
        loop {
            match self.conn.comp.try_get_event() {
                Ok(Some(_)) => self.stats.syscalls += 1,
                Ok(None) => break,
                Err(e) => return Err(self.fail(e.into())),
            }
        }
        if cm_ready {
            self.check_cm()?;
        }
        Ok(())
    }

    fn pump(&mut self) -> Result<(), Error> {
        if let Some(e) = self.failed_error() {
            return Err(e);
        }
        self.process_cq().map(|_| ())
    }

    /// Collect completions into `out` (appended), waiting until at least `min` are available
    /// (at most as many as are in flight) or `timeout` passes (`None`: the queue's I/O timeout
    /// bounds every wait through the command deadlines). Returns how many were added.
    ///
    /// When the queue fails, the completions of every command it held are returned (with
    /// [`CmdError::QueueFailed`] or [`CmdError::Timeout`]); once none are left, `reap` returns
    /// the failure.
    pub fn reap(
        &mut self,
        out: &mut Vec<Completion<RdmaBuf>>,
        min: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error> {
        let until = timeout.map(|t| Instant::now() + t);
        let want = min.min(self.inflight);
        let mut got = 0;
        let mut window = SpinWindow::default();
        loop {
            let pumped = self.pump();
            while let Some(tag) = self.done.pop_front() {
                let s = self.release(tag);
                out.push(Completion {
                    tag,
                    user_data: s.user_data,
                    result: s.result.unwrap_or(Err(CmdError::QueueFailed)),
                    buf: s.buf,
                });
                got += 1;
            }
            if let Err(e) = pumped {
                return if got > 0 { Ok(got) } else { Err(e) };
            }
            if got >= want {
                return Ok(got);
            }
            if until.is_some_and(|u| Instant::now() >= u) {
                return Ok(got);
            }
            // A failure here completed everything in flight: the next pass hands those
            // completions out, then reports the failure.
            let spin = window.spin(self.spin);
            let _ = self.wait(until, spin);
        }
    }

    /// Collect completions that are ready, without waiting.
    pub fn poll(&mut self, out: &mut Vec<Completion<RdmaBuf>>) -> Result<usize, Error> {
        self.reap(out, 0, Some(Duration::ZERO))
    }

    /// Run commands whose data are consecutive pieces of one borrowed buffer, as many at a time
    /// as there are free tags, and wait for all of them. Each piece goes through a pool buffer:
    /// one copy per byte (counted in `memcpy_bytes`). `cmds` yields `(sqe, offset, length)`
    /// within `ext`. Returns the CQE result of the last command or the first failure.
    pub(crate) fn run_borrowed(
        &mut self,
        what: &'static str,
        dir: Dir,
        ext: &mut DataRef<'_>,
        cmds: &mut dyn Iterator<Item = (Sqe, usize, u32)>,
    ) -> Result<u64, Error> {
        let mut pending = 0usize;
        let mut first_err: Option<CmdError> = None;
        let mut local_err: Option<Error> = None;
        let mut last = 0u64;
        let mut next_cmd = cmds.next();
        let mut window = SpinWindow::default();
        loop {
            if let Some(e) = self.failed_error() {
                return Err(e);
            }
            while first_err.is_none() && local_err.is_none() && !self.free.is_empty() {
                let Some((sqe, off, len)) = next_cmd.take() else {
                    break;
                };
                let buf = match self.borrowed_buf(dir, ext, off, len) {
                    Ok(b) => b,
                    Err(e) => {
                        local_err = Some(e);
                        break;
                    }
                };
                if let Err((e, _)) = self.start(sqe, dir, buf, Some(off), 0) {
                    local_err = Some(e);
                    break;
                }
                pending += 1;
                next_cmd = cmds.next();
            }
            if pending == 0 {
                break;
            }
            let pumped = self.pump();
            while let Some(tag) = self.ext_done.pop() {
                let s = self.release(tag);
                pending -= 1;
                match s.result.unwrap_or(Err(CmdError::QueueFailed)) {
                    Ok(v) => {
                        last = v;
                        if let (Dir::FromCtrl, DataRef::Read(dst), Some(b), Some(off)) =
                            (s.dir, &mut *ext, &s.buf, s.ext_off)
                        {
                            dst[off..off + b.len()].copy_from_slice(b);
                            self.stats.memcpy_bytes += b.len() as u64;
                        }
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            let all_done =
                pending == 0 && (first_err.is_some() || local_err.is_some() || next_cmd.is_none());
            if let Err(e) = pumped {
                return match first_err {
                    None if all_done && local_err.is_none() => Ok(last),
                    Some(s @ CmdError::Status(_)) => Err(Error::from_cmd(what, s)),
                    _ => Err(e),
                };
            }
            if all_done {
                break;
            }
            if pending > 0 {
                let spin = window.spin(self.spin);
                let _ = self.wait(None, spin);
            }
        }
        match (first_err, local_err) {
            (Some(e), _) => Err(Error::from_cmd(what, e)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(last),
        }
    }

    /// The pool buffer for a piece `[off, off + len)` of a borrowed buffer (filled for a write).
    fn borrowed_buf(
        &mut self,
        dir: Dir,
        ext: &DataRef<'_>,
        off: usize,
        len: u32,
    ) -> Result<Option<RdmaBuf>, Error> {
        if len == 0 {
            return Ok(None);
        }
        let mut b = self.pool.alloc(len as usize)?;
        if dir == Dir::ToCtrl {
            let DataRef::Write(src) = ext else {
                return Err(Error::InvalidArgument(
                    "write command without write data".into(),
                ));
            };
            b.copy_from_slice(&src[off..off + len as usize]);
            self.stats.memcpy_bytes += len as u64;
        }
        Ok(Some(b))
    }

    /// Run one command with an optional borrowed buffer and wait for it.
    pub(crate) fn execute(
        &mut self,
        what: &'static str,
        sqe: Sqe,
        mut ext: DataRef<'_>,
    ) -> Result<u64, Error> {
        let (dir, len) = match &ext {
            DataRef::None => (Dir::None, 0),
            DataRef::Read(b) => (Dir::FromCtrl, b.len()),
            DataRef::Write(b) => (Dir::ToCtrl, b.len()),
        };
        let len = u32::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("{what}: {len} bytes")))?;
        let mut one = std::iter::once((sqe, 0usize, len));
        self.run_borrowed(what, dir, &mut ext, &mut one)
    }
}

impl Drop for RdmaQueue {
    fn drop(&mut self) {
        // Disconnect and let the device return every work request before the QP, the CQE
        // buffers and the in-flight pool buffers go away.
        if self.failed.is_none() {
            self.quiesce(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_ids_keep_sends_and_recvs_apart() {
        for tag in [0u16, 1, 127, u16::MAX] {
            assert_eq!(tag as u64 & RECV_FLAG, 0);
        }
        let r = RECV_FLAG | 4095;
        assert_ne!(r & RECV_FLAG, 0);
        assert_eq!(r & 0xffff_ffff, 4095);
        // hrqsize = depth + 1 fits the 16-bit CM field at the deepest queue.
        assert!((MAX_DEPTH as u32 + 1) <= u16::MAX as u32);
    }

    #[test]
    fn keyed_sgl_is_subtype_zero() {
        // The descriptor this queue puts in every data command (never 0x4F: see rdma-binding
        // notes, section 6).
        let d = Sgl::Keyed {
            addr: 0x7f00_1234_5000,
            len: 131072,
            key: 0xabcd,
            invalidate: false,
        }
        .encode();
        assert_eq!(d[15], nvme::sgl::kind::KEYED_DATA_BLOCK);
        assert_eq!(&d[8..11], &[0x00, 0x00, 0x02]);
        assert_eq!(u32::from_le_bytes(d[11..15].try_into().unwrap()), 0xabcd);
        let none = Sgl::Keyed {
            addr: 0,
            len: 0,
            key: 0,
            invalidate: false,
        }
        .encode();
        assert_eq!(none, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40]);
    }
}
