//! The NVMe/RDMA link of a host queue ([`RdmaLink`]): an rdma_cm connection, a QP with its own
//! CQ, the SQE and CQE buffers and a registered buffer pool. The tags, completions and waiting
//! are the [`Queue`](crate::Queue)'s.

use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags};
use nvme::rdma::{CmReply, CmRequest};
use nvme::sgl::Sgl;
use nvme::{Cqe, Sqe};
use rdma::{
    active, next_rkey, AccessFlags, CmId, CompChannel, ConnParam, Cq, EventChannel, Mr, Mw, MwBind,
    Pd, Qp, QpInitAttr, SendWr, WorkCompletion,
};

use super::error::{rejected, RdmaError};
use super::ledger::{KeyFate, Ledger, Wr};
use super::pool::{IoMr, Pool, RdmaBuf, RegisteredBuf};
use crate::cmd::Dir;
use crate::error::{CmdError, Error};
use crate::queue::{sealed, Carry, Io, Link, PostError, Queue, QueueParams, WaitFds};
use crate::spin::poll_timeout;
use crate::state::CmdEvent;
use rdma::active::ConnectError;

/// Bytes of one SQE slot and of one CQE RECV buffer.
pub(super) const SQE_LEN: usize = 64;
pub(super) const CQE_LEN: usize = 16;
/// `wr_id` bit marking a RECV (the low 32 bits are the RECV buffer index); SENDs carry the tag.
pub(super) const RECV_FLAG: u64 = 1 << 32;
/// `wr_id` bit marking a memory window bind (low 16 bits: the tag).
pub(super) const BIND_FLAG: u64 = 1 << 33;
/// `wr_id` bit marking a LOCAL_INV (low 16 bits: the tag).
pub(super) const INV_FLAG: u64 = 1 << 34;
/// `wr_id` of the zero-length RDMA WRITE that nudges an iWARP target's receive stream.
pub(super) const NUDGE_FLAG: u64 = 1 << 35;
/// iWARP: how long a new queue waits for its first response before it nudges the target's
/// receive stream with a zero-length RDMA WRITE. Linux's siw (6.1) installs its receive
/// callback on an accepted connection's socket only after it has sent the MPA reply; a first
/// capsule that arrives in between stays unread in the target's socket until more data
/// comes, and the Fabrics Connect waits for it. A zero-length RDMA WRITE names no memory
/// (no key is checked for zero bytes) and is that data. Seen in the test VM under load: the
/// in-process wire tests' Connect unanswered for 20 s, 6 times in 60 runs.
pub(super) const NUDGE_AFTER: Duration = Duration::from_secs(1);
/// How commands open their buffers to the target: `auto` (the default: memory windows where
/// the device has them and is not rxe, else a registration per command), `windows` (wherever
/// the device has them, rxe too) or `register` (a registration per command everywhere).
pub const KEYS_ENV: &str = "NVMF_RDMA_KEYS";
/// Work completions taken per `ibv_poll_cq`.
const POLL_BATCH: usize = 32;
/// Longest wait for the flush completions of a failed or closing queue.
const DRAIN_WAIT: Duration = Duration::from_secs(2);
/// Deepest queue accepted (hrqsize = depth + 1 must fit the 16-bit CM field with room).
const MAX_DEPTH: u16 = 4096;

/// The rdma_cm connection and its verbs objects. The QP holds its CM id, PD and CQ; the CQ its
/// completion channel (the rdma crate forces the destruction order).
struct Conn {
    qid: u16,
    /// Send-queue entries left, work completions owed, the tags' keys.
    ledger: Ledger,
    timeout: Duration,
    wcs: Box<[WorkCompletion]>,
    /// Shut after a failure ([`Link::shut`]): the drop has nothing left to drain.
    shut: bool,
    /// How commands open their buffers to the target. Dropped after the drain and before the
    /// QP and the pool: a bound rxe window holds a reference on its QP (destroying the QP then
    /// stalls in the kernel) and on its region (which rxe then refuses to deregister).
    keys: Keys,
    qp: Qp,
    cq: Arc<Cq>,
    comp: Arc<CompChannel>,
    id: CmId,
    ch: EventChannel,
    /// The device is iWARP (siw): reported in Debug, used by the bring-up log.
    iwarp: bool,
    /// The device is rxe: its own remote-invalidation bit is read
    /// ([`WorkCompletion::rxe_invalidated_rkey`]), and no other provider's.
    rxe: bool,
    dev: String,
    /// iWARP, no response yet: when to nudge the target's receive stream ([`NUDGE_AFTER`]).
    nudge_at: Option<Instant>,
}

/// What [`KEYS_ENV`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyPolicy {
    Auto,
    Windows,
    Register,
}

impl KeyPolicy {
    fn parse(v: Option<&str>) -> Result<Self, Error> {
        match v {
            None | Some("" | "auto") => Ok(KeyPolicy::Auto),
            Some("windows") => Ok(KeyPolicy::Windows),
            Some("register") => Ok(KeyPolicy::Register),
            Some(v) => Err(Error::InvalidArgument(format!(
                "{KEYS_ENV}={v:?}: expected auto, windows or register"
            ))),
        }
    }

    /// Whether a queue uses memory windows on a device that has (type 2) windows or not, and
    /// is rxe or not. Not on rxe unless asked: rxe in Linux 6.1 replays a bind when it
    /// retransmits and fails it ([`rdma::DeviceAttr::is_rxe`]); one CI run in three of a
    /// loaded VM hit it.
    fn windows(self, has_windows: bool, rxe: bool) -> bool {
        match self {
            KeyPolicy::Auto => has_windows && !rxe,
            KeyPolicy::Windows => has_windows,
            KeyPolicy::Register => false,
        }
    }
}

/// The NVMe/RDMA link of a [`Queue`]; `B` is the queue's buffer type ([`RdmaBuf`] for an
/// [`crate::RdmaQueue`], [`crate::AnyBuf`] inside an [`crate::AnyQueue`]). See the
/// [module doc](crate::rdma) for the data path, the buffer pool and the keys that open a buffer
/// to the target for one command.
pub struct RdmaLink<B = RdmaBuf> {
    qid: u16,
    conn: Conn,
    /// `tags` SQE slots (local access only: they are SENT, never addressed by the target).
    cmd_mr: Mr,
    /// `nrecv` CQE RECV buffers.
    rsp_mr: Mr,
    nrecv: u32,
    pool: Pool,
    tags: u16,
    /// Tags the target can hold at once (its CM reply's crqsize, when smaller).
    usable: u16,
    icd_max: u32,
    _buf: PhantomData<fn() -> B>,
}

/// How a command opens its buffer to the target, and only for the command (the [module
/// doc](crate::rdma), "Keys").
enum Keys {
    /// A type 2 memory window per tag, bound over the buffer in the post that sends the
    /// command (a fresh key each time) and invalidated by the target's SEND_WITH_INV or a
    /// LOCAL_INV before the command completes.
    Windows { mws: Box<[Mw]> },
    /// A registration of the buffer per command, dropped when its response arrives (devices
    /// without windows: siw). Two system calls per command with data.
    PerIo { mrs: Box<[Option<IoMr>]> },
}

impl Keys {
    fn name(&self) -> &'static str {
        match self {
            Keys::Windows { .. } => "memory windows",
            Keys::PerIo { .. } => "per-I/O registration",
        }
    }
}

impl<B> fmt::Debug for RdmaLink<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaLink")
            .field("qid", &self.qid)
            .field("device", &self.conn.dev)
            .field("iwarp", &self.conn.iwarp)
            .field("rxe", &self.conn.rxe)
            .field("qp_num", &self.conn.qp.qp_num())
            .field("depth", &self.tags)
            .field("recvs", &self.nrecv)
            .field("icd_max", &self.icd_max)
            .field("keys", &self.conn.keys.name())
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

fn limit_error(what: &str, want: u32, have: u32, depth: u16) -> Error {
    Error::InvalidArgument(format!(
        "queue depth {depth} needs {want} {what}; the RDMA device allows {have}"
    ))
}

impl<B: RegisteredBuf> Queue<RdmaLink<B>> {
    /// The RDMA device the queue runs on (e.g. `rxe0`).
    pub fn device(&self) -> &str {
        self.link().device()
    }

    /// Bytes of memory this queue's pool has registered (for local access only: a command
    /// opens its own buffer to the target, for the command).
    pub fn registered_bytes(&self) -> usize {
        self.link().registered_bytes()
    }

    /// How this queue's commands open their buffers to the target: `"memory windows"` or
    /// `"per-I/O registration"`.
    pub fn key_mode(&self) -> &'static str {
        self.link().key_mode()
    }
}

impl<B: RegisteredBuf> RdmaLink<B> {
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
    ) -> Result<RdmaLink<B>, Error> {
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
        let iwarp = ctx.transport() == rdma::Transport::Iwarp;
        let policy = KeyPolicy::parse(std::env::var(KEYS_ENV).ok().as_deref())?;
        let rxe = attr.is_rxe();
        let windows = policy.windows((attr.mw_type_2b || attr.max_mw > 0) && !iwarp, rxe);
        let nrecv = Ledger::recvs(tags);
        let nsend = Ledger::sq_entries(tags, windows);
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
        let mws = if windows {
            match (0..tags)
                .map(|_| Mw::alloc(&pd))
                .collect::<Result<Box<[Mw]>, _>>()
            {
                Ok(m) => Some(m),
                // Asked for: the caller wants to know.
                Err(e) if policy == KeyPolicy::Windows => return Err(e.into()),
                Err(e) => {
                    tracing::debug!(qid, error = %e, "no memory windows: a registration per command");
                    None
                }
            }
        } else {
            None
        };
        let keys = match mws {
            Some(mws) => Keys::Windows { mws },
            None => Keys::PerIo {
                mrs: (0..tags).map(|_| None).collect(),
            },
        };
        let slab_access = match keys {
            Keys::Windows { .. } => AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            Keys::PerIo { .. } => AccessFlags::LOCAL_WRITE,
        };
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
        let dev = ctx.name();
        tracing::debug!(qid, device = %dev, iwarp, depth = usable, keys = keys.name(),
            "NVMe/RDMA queue connected");
        Ok(RdmaLink {
            qid,
            conn: Conn {
                qid,
                ledger: Ledger::new(tags, matches!(keys, Keys::Windows { .. }), rxe),
                timeout: p.timeout,
                wcs: (0..POLL_BATCH).map(|_| WorkCompletion::default()).collect(),
                shut: false,
                keys,
                qp,
                cq,
                comp,
                id,
                ch,
                iwarp,
                rxe,
                dev,
                nudge_at: iwarp.then(|| Instant::now() + NUDGE_AFTER),
            },
            cmd_mr,
            rsp_mr,
            nrecv,
            pool: Pool::new(&pd, slab_access),
            tags,
            usable,
            icd_max: 0,
            _buf: PhantomData,
        })
    }

    /// The same link for another buffer type (its pool hands out [`RdmaBuf`]s either way).
    pub(crate) fn retype<C: RegisteredBuf>(self) -> RdmaLink<C> {
        RdmaLink {
            qid: self.qid,
            conn: self.conn,
            cmd_mr: self.cmd_mr,
            rsp_mr: self.rsp_mr,
            nrecv: self.nrecv,
            pool: self.pool,
            tags: self.tags,
            usable: self.usable,
            icd_max: self.icd_max,
            _buf: PhantomData,
        }
    }

    /// The RDMA device the link runs on (e.g. `rxe0`).
    pub fn device(&self) -> &str {
        &self.conn.dev
    }

    /// Bytes of memory this link's pool has registered (local access only).
    pub fn registered_bytes(&self) -> usize {
        self.pool.registered().0
    }

    /// How the link's commands open their buffers to the target: `"memory windows"` or
    /// `"per-I/O registration"`.
    pub fn key_mode(&self) -> &'static str {
        self.conn.keys.name()
    }

    fn protocol_error(&self, msg: String) -> Error {
        RdmaError::Protocol { qid: self.qid, msg }.into()
    }

    /// Take the work completions the CQ has and process them. Returns how many there were.
    fn process_cq(&mut self, io: &mut Io<'_, '_, B>) -> Result<usize, Error> {
        let mut total = 0;
        loop {
            let n = self.conn.cq.poll(&mut self.conn.wcs)?;
            for i in 0..n {
                let wc = self.conn.wcs[i].clone();
                self.on_wc(io, &wc)?;
            }
            total += n;
            if n < self.conn.wcs.len() {
                return Ok(total);
            }
        }
    }

    fn on_wc(&mut self, io: &mut Io<'_, '_, B>, wc: &WorkCompletion) -> Result<(), Error> {
        let wr = Wr::of(wc.wr_id());
        if let Wr::Recv(_) = wr {
            self.conn.nudge_at = None;
        }
        self.conn.ledger.completed(wr);
        if !wc.is_ok() {
            return Err(RdmaError::Completion {
                qid: self.qid,
                op: wr.name(),
                status: wc.status(),
                vendor_err: wc.vendor_err(),
            }
            .into());
        }
        match wr {
            Wr::Recv(idx) => self.on_response(io, idx as usize, wc),
            Wr::Bind(_) | Wr::Nudge => Ok(()),
            // The key is dead: the response recorded before can complete the command.
            Wr::Inv(tag) => io
                .event(tag, CmdEvent::Response)
                .map_err(|msg| self.protocol_error(msg)),
            Wr::Send(tag) => io
                .event(tag, CmdEvent::SendCompleted)
                .map_err(|msg| self.protocol_error(msg)),
        }
    }

    /// A CQE arrived in RECV buffer `idx`.
    fn on_response(
        &mut self,
        io: &mut Io<'_, '_, B>,
        idx: usize,
        wc: &WorkCompletion,
    ) -> Result<(), Error> {
        if (wc.byte_len() as usize) < CQE_LEN {
            let n = wc.byte_len();
            return Err(self.protocol_error(format!(
                "unexpected completion length {n} (a CQE is 16 bytes)"
            )));
        }
        let mut raw = [0u8; CQE_LEN];
        // Repost the RECV before the command completes: its tag can be reused (and a new
        // response be sent) only after that, so a RECV is always waiting for every response.
        self.rsp_mr.read_at(idx * CQE_LEN, &mut raw)?;
        let sge = self.rsp_mr.sge(idx * CQE_LEN, CQE_LEN)?;
        self.conn.qp.post_recv(Wr::Recv(idx as u32).id(), &[sge])?;
        self.conn.ledger.recv_reposted();
        let cqe = Cqe::decode(&raw).expect("16 bytes");
        let tag = cqe.cid();
        if !io.awaits_response(tag) {
            return Err(self.protocol_error(format!(
                "response for command {tag}, which is not waiting for one (bad command_id)"
            )));
        }
        let fate = self
            .conn
            .ledger
            .response(tag, wc.invalidated_rkey(), wc.rxe_invalidated_rkey())
            .map_err(|msg| self.protocol_error(msg))?;
        // Whether the command's key is dead once this returns (else a LOCAL_INV is out).
        let mut dead = true;
        match fate {
            KeyFate::NoKey => {}
            KeyFate::InvalidatedByTarget => io.stats().keys_invalidated_by_target += 1,
            KeyFate::InvalidateLocally(k) => {
                self.conn
                    .qp
                    .post_send(&[SendWr::local_inv(Wr::Inv(tag).id(), k).signaled()])?;
                self.conn.ledger.local_inv_posted();
                io.stats().keys_invalidated_locally += 1;
                dead = false;
            }
            KeyFate::Deregister => {
                if let Keys::PerIo { mrs } = &mut self.conn.keys {
                    // Deregistered: the key opens nothing any more.
                    mrs[tag as usize] = None;
                }
            }
        }
        let st = cqe.status();
        io.record(
            tag,
            if st.is_success() {
                Ok(cqe.result.get())
            } else {
                Err(CmdError::Status(st))
            },
        );
        if !dead {
            return Ok(());
        }
        io.event(tag, CmdEvent::Response)
            .map_err(|msg| self.protocol_error(msg))
    }

    /// Read one rdma_cm event if there is one. After ESTABLISHED every event ends the queue
    /// (DISCONNECTED, DEVICE_REMOVAL, ADDR_CHANGE, TIMEWAIT_EXIT), as on the Linux host.
    fn check_cm(&mut self, io: &mut Io<'_, '_, B>) -> Result<(), Error> {
        io.stats().syscalls += 1;
        match self.conn.ch.try_get_event()? {
            None => Ok(()),
            Some(ev) => {
                // Responses already in the CQ still count.
                self.process_cq(io)?;
                Err(RdmaError::Disconnected {
                    qid: self.qid,
                    event: ev.event_type(),
                }
                .into())
            }
        }
    }
}

/// Turns a failed connection setup ([`rdma::active`]) of queue `qid` into the library's error:
/// a timeout names the step it waited for (`timeout` is the connect timeout), an unexpected
/// event becomes [`RdmaError::Cm`] and a reject is decoded by [`rejected`].
pub(super) fn connect_error(qid: u16, timeout: Duration, e: ConnectError) -> Error {
    match e {
        ConnectError::Timeout { step } => Error::Timeout(timeout, step.as_str()),
        ConnectError::Event {
            step,
            event,
            status,
        } => RdmaError::Cm {
            qid,
            during: step.as_str(),
            event,
            status,
        }
        .into(),
        ConnectError::Rejected {
            status,
            private_data,
        } => rejected(qid, status, &private_data).into(),
        ConnectError::Verbs(e) => e.into(),
    }
}

impl<B> sealed::Sealed for RdmaLink<B> {}

impl<B: RegisteredBuf> Link for RdmaLink<B> {
    type Buf = B;

    fn qid(&self) -> u16 {
        self.qid
    }

    fn tags(&self) -> (u16, u16) {
        (self.tags, self.usable)
    }

    fn alloc_buf(&self, len: usize) -> Result<B, Error> {
        B::from_rdma(self.pool.alloc(len)?).ok_or_else(|| {
            Error::InvalidArgument("this queue's buffers cannot hold registered memory".into())
        })
    }

    fn check_buf(&self, buf: &B) -> Result<Carry, Error> {
        match buf.as_rdma() {
            Some(b) if self.pool.owns(b) => Ok(Carry::Direct),
            // Plain memory: carried in a pool buffer.
            None => Ok(Carry::Staged),
            Some(_) => Err(Error::InvalidArgument(format!(
                "the buffer does not come from this queue's pool (queue {} takes its own \
                 alloc_buf)",
                self.qid
            ))),
        }
    }

    fn stages_borrowed(&self) -> bool {
        true
    }

    fn in_capsule_limit(&self) -> u32 {
        self.icd_max
    }

    /// Largest write sent in the capsule (bytes; 0: none). Needs a second send SGE.
    fn set_icd_max(&mut self, bytes: u32) {
        self.icd_max = if self.conn.qp.caps().max_send_sge >= 2 {
            bytes
        } else {
            0
        };
    }

    fn post(&mut self, io: &mut Io<'_, '_, B>, tag: u16, sqe: &mut Sqe) -> Result<(), PostError> {
        let slot = io.slot(tag).expect("the queue posts its own tags");
        let (dir, len) = (slot.dir, slot.len);
        let buf = slot.own_buf().and_then(RegisteredBuf::as_rdma);
        let incapsule = dir == Dir::ToCtrl && len > 0 && len <= self.icd_max;
        let keyed = buf.is_some() && !incapsule;
        let windows = matches!(self.conn.keys, Keys::Windows { .. });
        if !self.conn.ledger.can_post(keyed) {
            // Cannot happen: the SQ has room for every tag's work requests; refuse rather than
            // overflow it.
            return Err(PostError::Refused(Error::QueueFull));
        }
        // The rights the command gives the target over its buffer: it RDMA_WRITEs read data
        // and RDMA_READs write data.
        let access = if dir == Dir::FromCtrl {
            AccessFlags::REMOTE_WRITE
        } else {
            AccessFlags::REMOTE_READ
        };
        let (sgl, rkey) = match buf {
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
                let key = match &mut self.conn.keys {
                    Keys::Windows { mws } => next_rkey(mws[tag as usize].rkey()),
                    Keys::PerIo { mrs } => {
                        let m = b.register_io(access).map_err(PostError::Refused)?;
                        let k = m.rkey();
                        mrs[tag as usize] = Some(m);
                        k
                    }
                };
                (
                    Sgl::Keyed {
                        addr: b.addr(),
                        len,
                        key,
                        // A window's key is the target's to invalidate with its response.
                        invalidate: windows,
                    },
                    Some(key),
                )
            }
        };
        sqe.dptr = sgl.encode();
        let off = tag as usize * SQE_LEN;
        let posted = self
            .cmd_mr
            .write_at(off, &sqe.encode())
            .and_then(|()| self.cmd_mr.sge(off, SQE_LEN))
            .and_then(|sqe_sge| match (buf, &self.conn.keys, rkey) {
                (Some(b), _, _) if incapsule => {
                    let sges = [sqe_sge, b.sge()];
                    self.conn
                        .qp
                        .post_send(&[SendWr::send(tag as u64, &sges).signaled()])
                }
                (Some(b), Keys::Windows { mws }, Some(key)) => {
                    let (mr, offset) = b.slab();
                    let bind = MwBind {
                        wr_id: Wr::Bind(tag).id(),
                        mw: &mws[tag as usize],
                        mr,
                        offset,
                        len: len as usize,
                        access,
                        rkey: key,
                        signaled: false,
                    };
                    let sges = [sqe_sge];
                    self.conn
                        .qp
                        .post_bind_send(&bind, &[SendWr::send(tag as u64, &sges).signaled()])
                }
                _ => {
                    let sges = [sqe_sge];
                    self.conn
                        .qp
                        .post_send(&[SendWr::send(tag as u64, &sges).signaled()])
                }
            });
        if let Err(e) = posted {
            if let Keys::PerIo { mrs } = &mut self.conn.keys {
                mrs[tag as usize] = None;
            }
            return Err(PostError::Failed(e.into()));
        }
        match (&self.conn.keys, rkey) {
            (Keys::Windows { .. }, Some(_)) => io.stats().keys_bound += 1,
            (Keys::PerIo { .. }, Some(_)) => {
                // ibv_reg_mr now, ibv_dereg_mr at the response.
                io.stats().keys_registered += 1;
                io.stats().syscalls += 2;
            }
            _ => {}
        }
        self.conn.ledger.posted(tag, rkey);
        Ok(())
    }

    fn pump(&mut self, io: &mut Io<'_, '_, B>, _read: bool) -> Result<(), Error> {
        if let Some(at) = self.conn.nudge_at {
            self.conn.nudge_if_due(at)?;
        }
        self.process_cq(io).map(|_| ())
    }

    fn quiet(&self, _inflight: usize) -> bool {
        false
    }

    fn sleep(&mut self, io: &mut Io<'_, '_, B>, mut wake: Instant) -> Result<(), Error> {
        if let Some(at) = self.conn.nudge_at {
            self.conn.nudge_if_due(at)?;
            wake = self.conn.nudge_at.map_or(wake, |at| wake.min(at));
        }
        // Arm, then look once more: a completion that came before the arm raises no event.
        self.conn.cq.req_notify(false)?;
        if self.process_cq(io)? > 0 {
            return Ok(());
        }
        let mut fds = [
            PollFd::new(self.conn.comp.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.conn.ch.as_fd(), PollFlags::POLLIN),
        ];
        io.stats().syscalls += 1;
        match poll(&mut fds, poll_timeout(wake)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(Error::Io(std::io::Error::from(e))),
        }
        let cm_ready = fds[1].revents().is_some_and(|r| !r.is_empty());
        // Acknowledge the completion events (the next wait re-arms).
        while self.conn.comp.try_get_event()?.is_some() {
            io.stats().syscalls += 1;
        }
        if cm_ready {
            self.check_cm(io)?;
        }
        Ok(())
    }

    fn check(&mut self, io: &mut Io<'_, '_, B>) -> Result<(), Error> {
        self.check_cm(io)
    }

    fn prepare_wait(&mut self, io: &mut Io<'_, '_, B>) -> Result<Option<WaitFds>, Error> {
        use std::os::fd::AsRawFd;
        if let Some(at) = self.conn.nudge_at {
            self.conn.nudge_if_due(at)?;
        }
        // Arm, then look once more: a completion that came before the arm raises no event.
        self.conn.cq.req_notify(false)?;
        if self.process_cq(io)? > 0 {
            return Ok(None);
        }
        Ok(Some(WaitFds {
            fds: [
                Some((self.conn.comp.as_fd().as_raw_fd(), false)),
                Some((self.conn.ch.as_fd().as_raw_fd(), false)),
            ],
        }))
    }

    fn after_wait(&mut self, io: &mut Io<'_, '_, B>) -> Result<(), Error> {
        // Acknowledge the completion events (the next wait re-arms).
        while self.conn.comp.try_get_event()?.is_some() {
            io.stats().syscalls += 1;
        }
        self.check_cm(io)
    }

    fn learns_spin(&self) -> bool {
        false
    }

    fn shut(&mut self) {
        self.conn.shut = true;
        self.conn.quiesce(true);
        // The QP is in the error state: no key reaches a buffer any more. Drop the per-command
        // registrations before the queue hands the buffers back.
        if let Keys::PerIo { mrs } = &mut self.conn.keys {
            mrs.iter_mut().for_each(|m| *m = None);
        }
    }
}

impl Conn {
    /// iWARP, no response since connecting and the nudge's instant `at` (`nudge_at`) gone by:
    /// one zero-length RDMA WRITE, so that a target whose siw left the first capsule unread
    /// reads it.
    fn nudge_if_due(&mut self, at: Instant) -> Result<(), Error> {
        if Instant::now() < at || !self.ledger.can_nudge() {
            return Ok(());
        }
        self.nudge_at = None;
        self.qp
            .post_send(&[SendWr::zero_length_write(Wr::Nudge.id()).signaled()])?;
        self.ledger.nudge_posted();
        tracing::info!(qid = self.qid, device = %self.dev, after = ?NUDGE_AFTER,
            "no response yet over iWARP: a zero-length RDMA WRITE to move the target's receive \
             stream (Linux siw can leave a new connection's first capsule unread)");
        Ok(())
    }

    /// Stop the QP and wait (bounded) until the device has returned every posted work request,
    /// so no buffer handed back afterwards is still addressed by the device. `failed`: the
    /// connection is already broken; siw then may not flush what its dead stream held, which
    /// is no longer reachable by the peer either, so running out of time is not news.
    fn quiesce(&mut self, failed: bool) {
        if let Err(e) = self.qp.set_error() {
            tracing::debug!(qid = self.qid, error = %e, "moving the QP to ERR failed");
        }
        if let Err(e) = self.id.disconnect() {
            tracing::debug!(qid = self.qid, error = %e, "rdma_disconnect failed");
        }
        let end = Instant::now() + self.timeout.min(DRAIN_WAIT);
        while self.ledger.owed() != (0, 0) {
            match self.cq.poll(&mut self.wcs) {
                Ok(0) if Instant::now() >= end => {
                    let (recvs, sends) = self.ledger.owed();
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
                        self.ledger.flushed(Wr::of(wc.wr_id()));
                    }
                }
                Err(e) => {
                    tracing::warn!(qid = self.qid, error = %e, "polling the CQ while draining");
                    return;
                }
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Disconnect and let the device return every work request before the QP, the CQE
        // buffers and the in-flight pool buffers go away (the link's MRs and pool are dropped
        // after its connection).
        if !self.shut {
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
    fn memory_windows_by_default_where_the_device_has_them_and_is_not_rxe() {
        use KeyPolicy::*;
        assert_eq!(KeyPolicy::parse(None).unwrap(), Auto);
        assert_eq!(KeyPolicy::parse(Some("")).unwrap(), Auto);
        assert_eq!(KeyPolicy::parse(Some("auto")).unwrap(), Auto);
        assert_eq!(KeyPolicy::parse(Some("windows")).unwrap(), Windows);
        assert_eq!(KeyPolicy::parse(Some("register")).unwrap(), Register);
        let e = KeyPolicy::parse(Some("fast")).unwrap_err().to_string();
        assert!(
            e.contains("NVMF_RDMA_KEYS=\"fast\"") && e.contains("register"),
            "{e}"
        );
        // (has windows, rxe) -> windows: mlx5-like, rxe, siw-like.
        let cases = [(true, false), (true, true), (false, false)];
        let got = |p: KeyPolicy| cases.map(|(w, rxe)| p.windows(w, rxe));
        assert_eq!(got(Auto), [true, false, false]);
        assert_eq!(got(Windows), [true, true, false]);
        assert_eq!(got(Register), [false, false, false]);
    }

    #[test]
    fn keyed_sgls_of_both_key_modes() {
        // With a memory window the target is asked to invalidate the key (subtype 0xF).
        let w = Sgl::Keyed {
            addr: 0x7f00_1234_5000,
            len: 4096,
            key: 0x0102_0304,
            invalidate: true,
        }
        .encode();
        assert_eq!(w[15], 0x4f);
        // A per-command registration is never invalidated remotely (subtype 0: recent rxe
        // refuses to invalidate a user MR, see rdma-binding notes, section 6).
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
