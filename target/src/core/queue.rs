//! The queue pipeline: parse (validation, data direction and length, SGL checks), execute
//! dispatch, and the one completion funnel that fills sq_head, sq_id and cid, counts errors
//! and records them in the controller's error log.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nvme::log::trtype;
use nvme::opcode::{fctype, io};
use nvme::sgl::Sgl;
use nvme::{Cqe, Sqe, Status};

use super::controller::{Controller, Gone};
use super::stats::IoClass;
use super::subsystem::NsTable;
use super::{
    Cmd, Exec, IoKind, IoOp, NamespaceSpec, Queue, QueueEvent, QueueLimits, Target, TrType,
    TransportCaps, Waker, Xfer,
};

/// SQE byte offsets, for the Error Information log's Parameter Error Location.
pub(crate) mod loc {
    pub const OPCODE: u16 = 0;
    pub const FLAGS: u16 = 1;
    pub const NSID: u16 = 4;
    pub const DPTR: u16 = 24;
    pub const CDW10: u16 = 40;
    pub const CDW11: u16 = 44;
    pub const CDW12: u16 = 48;
    pub const CDW14: u16 = 56;
    /// Not specific to a field.
    pub const NONE: u16 = 0xffff;
}

/// A command rejection: the status, where the offending field is, and the result dword
/// (Connect Invalid Parameters carries IATTR/IPO there).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reject {
    pub status: Status,
    pub loc: u16,
    pub result: u64,
    pub lba: u64,
}

impl Reject {
    pub fn new(status: Status, loc: u16) -> Reject {
        Reject {
            status,
            loc,
            result: 0,
            lba: 0,
        }
    }
    /// Status with DNR.
    pub fn dnr(status: Status, loc: u16) -> Reject {
        Reject::new(status.dnr(), loc)
    }
    pub fn with_result(mut self, result: u64) -> Reject {
        self.result = result;
        self
    }
    pub fn with_lba(mut self, lba: u64) -> Reject {
        self.lba = lba;
        self
    }
}

/// What parsing decided about a command's data.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parsed {
    pub xfer: Xfer,
    /// Where to point when the length is too large.
    pub len_loc: u16,
}

impl Parsed {
    pub fn none() -> Parsed {
        Parsed {
            xfer: Xfer::None,
            len_loc: loc::NONE,
        }
    }
    pub fn to_host(len: u32, len_loc: u16) -> Parsed {
        Parsed {
            xfer: Xfer::ToHost(len),
            len_loc,
        }
    }
    pub fn from_host(len: u32, len_loc: u16) -> Parsed {
        Parsed {
            xfer: Xfer::FromHost(len),
            len_loc,
        }
    }
}

/// What an executed command turned into.
pub(crate) enum Outcome {
    Done { result: u64, data_len: u32 },
    Io(IoOp),
    Deferred,
}

impl Outcome {
    pub fn ok() -> Outcome {
        Outcome::Done {
            result: 0,
            data_len: 0,
        }
    }
    pub fn result(result: u64) -> Outcome {
        Outcome::Done {
            result,
            data_len: 0,
        }
    }
    pub fn data(data_len: u32) -> Outcome {
        Outcome::Done {
            result: 0,
            data_len,
        }
    }
}

/// Where a queue is in its life.
pub(crate) enum Link {
    /// Only a Connect may come.
    Unconnected,
    /// Admin queue of a controller.
    Admin(Arc<Controller>),
    /// I/O queue; `epoch` is the controller's reset epoch at Connect.
    Io { ctrl: Arc<Controller>, epoch: u32 },
    /// Torn down: the transport should close the connection.
    Closed,
}

/// Per-queue counters, written only by the owning queue's thread (relaxed atomics so the
/// admin queue can sum them for the SMART log).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Per-namespace, per-status and latency statistics (sized at I/O queue Connect).
    pub io: super::stats::IoCounters,
    commands: AtomicU64,
    errors: AtomicU64,
    bytes_read: AtomicU64,
    pub(super) bytes_written: AtomicU64,
    read_cmds: AtomicU64,
    pub(super) write_cmds: AtomicU64,
    /// Write-group commands (Write, Write Zeroes, DSM, Flush) parsed and not yet completed:
    /// what a Preempt and Abort waits for on the preempted hosts' queues.
    writes_in_flight: AtomicU32,
}

impl Counters {
    /// Write-group commands parsed and not yet completed.
    pub fn writes_in_flight(&self) -> u32 {
        self.writes_in_flight.load(Ordering::Acquire)
    }
}

/// Write-group I/O commands (the reservation rules' write group).
fn is_write_group(opcode: u8) -> bool {
    matches!(opcode, io::WRITE | io::WRITE_ZEROES | io::DSM | io::FLUSH)
}

/// A Preempt and Abort that completes once the preempted hosts' I/O queues have no write in
/// flight that was admitted before it (their later writes are refused at parse).
pub(crate) struct Fence {
    pub cmd: Cmd,
    pub queues: Vec<Arc<Counters>>,
    /// When it was deferred (its latency is counted up to there: the core reads no clock).
    pub started: Instant,
}

/// A reservation command whose change a store is saving ([`super::reservation::Change`]).
pub(crate) struct ResvSave {
    pub cmd: Cmd,
    pub nsid: u32,
    pub slot: Arc<super::reservation::SaveSlot>,
    /// Preempt and Abort: fenced once saved.
    pub preempt_abort: bool,
    pub started: Instant,
}

impl Fence {
    pub(crate) fn done(&self) -> bool {
        self.queues
            .iter()
            .all(|c| c.writes_in_flight.load(Ordering::Acquire) == 0)
    }
}

pub(super) fn bump(c: &AtomicU64, by: u64) {
    // Single writer: a load and a store avoid a locked read-modify-write.
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl Counters {
    pub fn snapshot(&self) -> QueueStats {
        QueueStats {
            commands: self.commands.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            read_cmds: self.read_cmds.load(Ordering::Relaxed),
            write_cmds: self.write_cmds.load(Ordering::Relaxed),
        }
    }
}

/// A queue's counters (see [`Queue::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Commands parsed (every SQE handed to `parse`).
    pub commands: u64,
    /// Completions with a non-success status.
    pub errors: u64,
    /// Payload bytes of successful Reads (controller to host).
    pub bytes_read: u64,
    /// Payload bytes of successful Writes (host to controller).
    pub bytes_written: u64,
    /// Successful Read commands.
    pub read_cmds: u64,
    /// Successful Write commands.
    pub write_cmds: u64,
}

impl QueueStats {
    pub(crate) fn add(&mut self, o: &QueueStats) {
        self.commands += o.commands;
        self.errors += o.errors;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.read_cmds += o.read_cmds;
        self.write_cmds += o.write_cmds;
    }
}

/// MDTS (log2 of 4 KiB pages) and the transfer limit it implies for a transport's
/// `max_io_size`. MDTS 0 means "no limit", so the smallest limit that can be stated is 8 KiB:
/// smaller sizes are treated as 8 KiB.
pub(crate) fn mdts_for(max_io_size: u32) -> (u8, u32) {
    let pages = (max_io_size / 4096).max(2);
    let mdts = 31 - pages.leading_zeros();
    (mdts as u8, 4096u32 << mdts)
}

impl Queue {
    pub(super) fn build(
        target: Arc<Target>,
        caps: TransportCaps,
        limits: QueueLimits,
        peer: String,
    ) -> Queue {
        let (mdts, max_xfer) = mdts_for(caps.max_transfer.max(caps.max_io_size));
        let token = target
            .inner()
            .next_queue_token
            .fetch_add(1, Ordering::Relaxed);
        Queue {
            target,
            caps,
            limits,
            peer,
            link: Link::Unconnected,
            qid: 0,
            depth: 0,
            sqhd: 0,
            sqhd_disabled: false,
            token,
            clock: std::cell::Cell::new(None),
            counters: Arc::new(Counters::default()),
            ns_cache: None,
            fence: None,
            resv_save: None,
            resv_waiting: Vec::new(),
            fused: Default::default(),
            blocked: Vec::new(),
            events: VecDeque::new(),
            teardown_sent: false,
            mdts,
            max_xfer,
            waker: None,
            local_addr: None,
            ana: None,
            tls: None,
            auth: Default::default(),
        }
    }

    /// The controller this queue belongs to, if connected.
    pub(crate) fn ctrl(&self) -> Option<&Arc<Controller>> {
        match &self.link {
            Link::Admin(c) | Link::Io { ctrl: c, .. } => Some(c),
            _ => None,
        }
    }

    pub(crate) fn trtype_code(&self) -> u8 {
        match self.caps.trtype {
            TrType::Tcp => trtype::TCP,
            TrType::Rdma => trtype::RDMA,
        }
    }

    /// Largest in-capsule data this queue takes.
    pub(super) fn in_capsule_now(&self) -> u32 {
        match self.link {
            Link::Io { .. } => self.limits.in_capsule_io,
            _ => self.limits.in_capsule_admin,
        }
    }

    /// Refresh the cached namespace table if the subsystem replaced it.
    pub(super) fn refresh_ns_cache(&mut self) {
        let subsys = match &self.link {
            Link::Admin(c) | Link::Io { ctrl: c, .. } => &c.subsys,
            _ => return,
        };
        let gen = subsys.ns_generation();
        if !matches!(&self.ns_cache, Some((g, _)) if *g == gen) {
            self.ns_cache = Some(subsys.namespaces());
        }
    }

    /// The namespace table of this queue's subsystem (admin paths).
    pub(crate) fn namespaces(&mut self) -> Option<Arc<NsTable>> {
        self.refresh_ns_cache();
        self.ns_cache.as_ref().map(|(_, t)| t.clone())
    }

    /// The listener this queue's connection came through (`None` before the transport said
    /// where it arrived, or once a reload removed the listener).
    pub(crate) fn listener(&self) -> Option<super::ListenerInfo> {
        let local = self.local_addr?;
        let trtype = self.caps.trtype;
        self.target
            .inner()
            .listeners()
            .iter()
            .filter(|l| l.accepted(trtype, local))
            // A listener on the very address before one on the wildcard address.
            .min_by_key(|l| {
                l.traddr
                    .parse::<std::net::IpAddr>()
                    .map_or(true, |a| a.is_unspecified())
            })
            .cloned()
    }

    /// This queue's path's ANA state for `group` (`nvme::log::ana_state`): one atomic load
    /// and an index while nothing changed (the listener's states are cached per ANA
    /// generation).
    pub(crate) fn ana_state(&mut self, group: u32) -> u8 {
        let gen = self.target.inner().ana_gen.load(Ordering::Acquire);
        if !matches!(&self.ana, Some((g, _)) if *g == gen) {
            // A reload that removed the listener leaves its connected hosts their last
            // states (they are told again if the listener comes back).
            let states = match (self.listener(), self.ana.take()) {
                (Some(l), _) => l.ana.clone(),
                (None, Some((_, old))) => old,
                (None, None) => super::all_optimized(),
            };
            self.ana = Some((gen, states));
        }
        let state = self
            .ana
            .as_ref()
            .and_then(|(_, s)| s.get(group as usize).copied())
            .unwrap_or(nvme::log::ana_state::OPTIMIZED);
        // A served group whose gateway lease ran out: in change until the daemon applies the
        // gateway's next view (core::lease).
        let served = matches!(
            state,
            nvme::log::ana_state::OPTIMIZED | nvme::log::ana_state::NON_OPTIMIZED
        );
        if served && self.target.inner().leases.expired(group) {
            return nvme::log::ana_state::CHANGE;
        }
        state
    }

    /// One namespace, copied out of the cached table: the I/O path takes no lock and touches
    /// no shared reference count.
    pub(crate) fn namespace_spec(&mut self, nsid: u32) -> Option<NamespaceSpec> {
        self.refresh_ns_cache();
        self.ns_cache
            .as_ref()
            .and_then(|(_, t)| t.get(nsid).cloned())
    }

    // ---- parse -------------------------------------------------------------------------

    pub(super) fn parse_cmd(&mut self, sqe: &Sqe, now: Instant) -> Result<Cmd, Cqe> {
        bump(&self.counters.commands, 1);
        // Counted before the reservation check in parse: a Preempt and Abort that changes the
        // reservation after this point sees the count (the check and the preempt serialize on
        // the namespace's reservation mutex).
        let t = self.io_clock(sqe, now);
        let counted = t.is_some() && is_write_group(sqe.opcode);
        if counted {
            self.writes_started(1);
        }
        // The entry is consumed now, whatever becomes of it.
        if self.depth > 0 {
            self.sqhd = ((self.sqhd as u32 + 1) % self.depth as u32) as u16;
        }
        let parsed = self.parse_inner(sqe).and_then(|p| {
            let sgl = self.check_sgl(sqe, p)?;
            let len = match p.xfer {
                Xfer::None => 0,
                Xfer::FromHost(n) | Xfer::ToHost(n) => n,
            };
            Ok(Cmd {
                sqe: *sqe,
                xfer: p.xfer,
                sgl,
                hold: super::rangelock::Held::NONE,
                piece: super::Piece {
                    offset: 0,
                    len: len.min(self.caps.max_io_size.max(1)),
                },
            })
        });
        self.fused_parsed(sqe, parsed.is_ok(), now);
        match parsed {
            Ok(cmd) => {
                // Parse never changes the link of a command this clock applies to (Connect is a
                // Fabrics command, which has none), so one reading serves both.
                if let Some(t) = t {
                    self.counters.io.start(sqe.cid(), t);
                }
                Ok(cmd)
            }
            Err(r) => {
                if counted {
                    self.writes_started(-1);
                }
                Err(self.reject_cqe(sqe, r))
            }
        }
    }

    /// Single writer (this queue's thread); read by a Preempt and Abort on another thread.
    fn writes_started(&self, by: i32) {
        let c = &self.counters.writes_in_flight;
        c.store(
            c.load(Ordering::Relaxed).wrapping_add_signed(by),
            Ordering::Release,
        );
    }

    /// For an I/O command on an I/O queue (what the per-namespace statistics count), `now` in
    /// ns on the controller's clock. The core reads no clock: the transport passes its time in.
    fn io_clock(&self, sqe: &Sqe, now: Instant) -> Option<u64> {
        match &self.link {
            Link::Io { ctrl, .. } if !sqe.is_fabrics() => Some(self.ctrl_ns(ctrl, now)),
            _ => None,
        }
    }

    /// `now` on the clock of `ctrl` (this queue's controller), converted once per `now`.
    pub(super) fn ctrl_ns(&self, ctrl: &Controller, now: Instant) -> u64 {
        if let Some((at, ns)) = self.clock.get() {
            if at == now {
                return ns;
            }
        }
        let ns = ctrl.since_base(now);
        self.clock.set(Some((now, ns)));
        ns
    }

    /// A parsed I/O command completed with `status`: per-namespace statistics.
    pub(super) fn io_done(&self, cmd: &Cmd, status: Status, now: Instant) {
        let Some(t) = self.io_clock(&cmd.sqe, now) else {
            return;
        };
        if is_write_group(cmd.sqe.opcode) {
            self.writes_started(-1);
        }
        let class = match cmd.sqe.opcode {
            io::READ => IoClass::Read,
            io::WRITE => IoClass::Write,
            _ => IoClass::Other,
        };
        let bytes = match cmd.xfer {
            Xfer::ToHost(n) | Xfer::FromHost(n) => n as u64,
            Xfer::None => 0,
        };
        self.counters.io.finish(
            cmd.sqe.cid(),
            cmd.sqe.nsid.get(),
            class,
            status.code(),
            bytes,
            t,
        );
    }

    fn parse_inner(&mut self, sqe: &Sqe) -> Result<Parsed, Reject> {
        // PSDT must say "SGL, MPTR is a buffer" (nvmet_req_init); FUSE: only Compare and
        // Write (fused.rs).
        if !sqe.uses_sgl() {
            return Err(Reject::dnr(Status::INVALID_FIELD, loc::FLAGS));
        }
        self.check_fuse(sqe)?;
        match &self.link {
            Link::Unconnected => self.parse_unconnected(sqe),
            Link::Closed => Err(Reject::new(Status::ABORT_QUEUE, loc::NONE)),
            Link::Admin(ctrl) => {
                let ctrl = ctrl.clone();
                if ctrl.gone() != Gone::Alive {
                    return Err(Reject::new(Status::ABORT_QUEUE, loc::NONE));
                }
                self.auth_gate(sqe)?;
                if sqe.is_fabrics() {
                    self.parse_fabrics_admin(sqe)
                } else if !ctrl.ready() {
                    // nvmet_check_ctrl_status: nothing but Fabrics commands before CSTS.RDY.
                    Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::OPCODE))
                } else if ctrl.is_discovery() {
                    self.parse_discovery(sqe)
                } else {
                    self.parse_admin(sqe)
                }
            }
            Link::Io { ctrl, epoch } => {
                if ctrl.gone() != Gone::Alive || ctrl.io_epoch() != *epoch {
                    return Err(Reject::new(Status::ABORT_QUEUE, loc::NONE));
                }
                self.auth_gate(sqe)?;
                if sqe.is_fabrics() {
                    self.parse_fabrics_io(sqe)
                } else if !ctrl.ready() {
                    Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::OPCODE))
                } else {
                    self.parse_io(sqe)
                }
            }
        }
    }

    /// Check the data SGL against the command's transfer and what this transport accepts.
    fn check_sgl(&self, sqe: &Sqe, p: Parsed) -> Result<Option<Sgl>, Reject> {
        let (len, to_ctrl) = match p.xfer {
            Xfer::None => (0, false),
            Xfer::FromHost(n) => (n, true),
            Xfer::ToHost(n) => (n, false),
        };
        if len > self.max_xfer {
            return Err(Reject::dnr(Status::INVALID_FIELD, p.len_loc));
        }
        // Only Read, Write and Compare move in pieces (and not a fused pair, whose ACWU is
        // one buffer): anything else must fit the slot buffer.
        let piecewise = matches!(self.link, Link::Io { .. })
            && !sqe.is_fabrics()
            && matches!(sqe.opcode, io::READ | io::WRITE | io::COMPARE)
            && sqe.flags & nvme::cmd::FUSE_MASK == 0;
        if len > self.caps.max_io_size && !piecewise {
            return Err(Reject::dnr(Status::INVALID_FIELD, p.len_loc));
        }
        let bad = |s: Status| Err(Reject::dnr(s, loc::DPTR));
        if len == 0 {
            // Hosts describe "no data" with a zero-length descriptor of their usual type
            // (Linux: Transport on TCP, Keyed on RDMA); only its length matters.
            return match Sgl::decode(&sqe.dptr) {
                Ok(s) if !s.is_empty() => bad(Status::SGL_INVALID_DATA),
                _ => Ok(None),
            };
        }
        let Ok(sgl) = Sgl::decode(&sqe.dptr) else {
            return bad(Status::SGL_INVALID_TYPE);
        };
        match (self.caps.trtype, sgl) {
            (_, Sgl::InCapsule { offset, len: l }) => {
                // In-capsule data only flows host to controller (nvmet-tcp/-rdma answer
                // Invalid Field for an in-capsule read), and ICDOFF is 0.
                if !to_ctrl {
                    return Err(Reject::dnr(Status::INVALID_FIELD, loc::DPTR));
                }
                if offset != 0 {
                    return bad(Status::SGL_INVALID_OFFSET);
                }
                if l != len {
                    return bad(Status::SGL_INVALID_DATA);
                }
                if l > self.in_capsule_now() {
                    // nvmet reports too much in-capsule data as an invalid offset.
                    return bad(Status::SGL_INVALID_OFFSET);
                }
            }
            (TrType::Tcp, Sgl::Transport { .. }) | (TrType::Rdma, Sgl::Keyed { .. }) => {
                if sgl.len() != len {
                    return bad(Status::SGL_INVALID_DATA);
                }
            }
            _ => return bad(Status::SGL_INVALID_TYPE),
        }
        Ok(Some(sgl))
    }

    // ---- execute -----------------------------------------------------------------------

    pub(super) fn execute_cmd(&mut self, cmd: &mut Cmd, buf: &mut [u8], now: Instant) -> Exec {
        // The slot buffer holds the current piece (all of the data, but for large Reads,
        // Writes and Compares).
        let need = cmd.piece.len as usize;
        let out = if buf.len() < need {
            tracing::error!(
                need,
                have = buf.len(),
                "slot buffer smaller than the transfer"
            );
            Err(Reject::dnr(Status::INTERNAL, loc::NONE))
        } else {
            self.execute_inner(cmd, &mut buf[..need], now)
        };
        if !matches!(out, Ok(Outcome::Io(_))) {
            // A range registration is held only while the backend runs the write.
            self.leave_range(cmd);
        }
        match out {
            Ok(Outcome::Done { result, data_len }) => {
                self.io_done(cmd, Status::SUCCESS, now);
                Exec::Done {
                    cqe: self.cqe(cmd.sqe.cid(), Status::SUCCESS, result),
                    data_len,
                }
            }
            Ok(Outcome::Io(op)) => Exec::Io(op),
            Ok(Outcome::Deferred) => Exec::Deferred,
            Err(r) => {
                self.io_done(cmd, r.status, now);
                Exec::Done {
                    cqe: self.reject_cqe(&cmd.sqe, r),
                    data_len: 0,
                }
            }
        }
    }

    fn execute_inner(
        &mut self,
        cmd: &mut Cmd,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<Outcome, Reject> {
        let sqe = &cmd.sqe;
        match &self.link {
            Link::Unconnected => {
                if sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT {
                    self.exec_connect(sqe, buf, now)
                } else {
                    Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::OPCODE))
                }
            }
            Link::Closed => Err(Reject::new(Status::ABORT_QUEUE, loc::NONE)),
            Link::Admin(ctrl) => {
                let ctrl = ctrl.clone();
                if ctrl.gone() != Gone::Alive {
                    return Err(Reject::new(Status::ABORT_QUEUE, loc::NONE));
                }
                ctrl.touch_ns(self.ctrl_ns(&ctrl, now), false);
                if sqe.is_fabrics() {
                    self.exec_fabrics(sqe, buf, now)
                } else if !ctrl.ready() {
                    Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::OPCODE))
                } else if ctrl.is_discovery() {
                    self.exec_discovery(&ctrl, cmd, buf, now)
                } else {
                    self.exec_admin(&ctrl, cmd, buf, now)
                }
            }
            Link::Io { ctrl, epoch } => {
                // No Arc clone here: the controller is shared with other threads and its
                // refcount is not worth bouncing once per I/O.
                if ctrl.gone() != Gone::Alive || ctrl.io_epoch() != *epoch {
                    return Err(Reject::new(Status::ABORT_QUEUE, loc::NONE));
                }
                ctrl.touch_ns(self.ctrl_ns(ctrl, now), false);
                let ready = ctrl.ready();
                if sqe.is_fabrics() {
                    self.exec_fabrics(sqe, buf, now)
                } else if !ready {
                    Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::OPCODE))
                } else {
                    self.exec_io(cmd, buf, now)
                }
            }
        }
    }

    // ---- completion ----------------------------------------------------------------------

    /// The completion funnel: every CQE is built here.
    pub(crate) fn cqe(&self, cid: u16, status: Status, result: u64) -> Cqe {
        let mut c = Cqe::new(cid, status, result);
        c.sq_head = if self.sqhd_disabled {
            0xffff
        } else {
            self.sqhd
        }
        .into();
        c.sq_id = self.qid.into();
        c
    }

    /// A failed command's CQE: counted, and recorded in the controller's error log.
    pub(crate) fn reject_cqe(&mut self, sqe: &Sqe, r: Reject) -> Cqe {
        bump(&self.counters.errors, 1);
        self.counters.io.error(r.status.code());
        if let Some(ctrl) = self.ctrl() {
            ctrl.record_error(
                self.qid,
                sqe.cid(),
                r.status,
                r.loc,
                r.lba,
                sqe.nsid.get(),
                self.trtype_code(),
            );
        }
        tracing::debug!(qid = self.qid, cid = sqe.cid(), opcode = sqe.opcode, status = ?r.status,
            "command failed");
        self.cqe(sqe.cid(), r.status, r.result)
    }

    pub(super) fn complete_io_cmd(
        &mut self,
        cmd: &mut Cmd,
        res: Result<(), i32>,
        now: Instant,
    ) -> Cqe {
        self.leave_range(cmd);
        if cmd.sqe.flags & nvme::cmd::FUSE_MASK != 0 {
            self.fused_completed(cmd, res.is_ok(), now);
        }
        let sqe = &cmd.sqe;
        match res {
            Ok(()) => {
                match (sqe.opcode, cmd.xfer) {
                    (io::READ, Xfer::ToHost(n)) => {
                        bump(&self.counters.bytes_read, n as u64);
                        bump(&self.counters.read_cmds, 1);
                    }
                    (io::WRITE, Xfer::FromHost(n)) => {
                        bump(&self.counters.bytes_written, n as u64);
                        bump(&self.counters.write_cmds, 1);
                    }
                    _ => {}
                }
                self.io_done(cmd, Status::SUCCESS, now);
                self.cqe(sqe.cid(), Status::SUCCESS, 0)
            }
            Err(errno) => {
                let r = super::io::errno_to_status(sqe, errno);
                self.io_done(cmd, r.status, now);
                self.reject_cqe(sqe, r)
            }
        }
    }

    pub(super) fn complete_with_status(&mut self, cmd: &Cmd, status: Status, now: Instant) -> Cqe {
        self.fused_failed(cmd, now);
        self.io_done(cmd, status, now);
        if status.is_success() {
            self.cqe(cmd.sqe.cid(), status, 0)
        } else {
            self.reject_cqe(&cmd.sqe, Reject::new(status, loc::NONE))
        }
    }

    // ---- timers and events -------------------------------------------------------------

    pub(super) fn next_timeout(&self) -> Option<Instant> {
        let keep_alive = match &self.link {
            Link::Admin(ctrl) => ctrl.keep_alive_deadline(),
            _ => None,
        };
        match (keep_alive, self.auth.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(super) fn on_timeout(&mut self, now: Instant) {
        self.auth_timeout(now);
        let Link::Admin(ctrl) = &self.link else {
            return;
        };
        if ctrl.keep_alive_deadline().is_some_and(|d| now >= d) {
            tracing::warn!(cntlid = ctrl.cntlid, kato_ms = ctrl.kato_ms(), peer = %self.peer,
                "keep-alive timer expired");
            ctrl.fail(Gone::KeepAlive);
            self.target.inner().unregister(ctrl);
        }
    }

    pub(super) fn next_event(&mut self) -> Option<QueueEvent> {
        if let Some(ev) = self.events.pop_front() {
            return Some(ev);
        }
        if matches!(self.link, Link::Io { .. } | Link::Admin(_)) && !self.teardown_sent {
            if matches!(self.link, Link::Io { .. }) {
                self.fused_poll();
            }
            // Reservation commands (Set Features PTPL on the admin queue).
            self.resv_poll();
            if let Some(ev) = self.events.pop_front() {
                return Some(ev);
            }
        }
        match &self.link {
            Link::Admin(ctrl) => {
                // Polled on every loop: borrow, do not clone (the refcount shares a cache
                // line with state the I/O threads read).
                let gone = ctrl.gone();
                if gone != Gone::Alive {
                    if !self.teardown_sent {
                        self.teardown_sent = true;
                        self.target.inner().unregister(ctrl);
                        return Some(QueueEvent::Disconnect(gone.reason()));
                    }
                    return None;
                }
                let done = ctrl.take_aer_completions();
                for (cid, result) in done {
                    let c = self.cqe(cid, Status::SUCCESS, result as u64);
                    self.events.push_back(QueueEvent::Complete(c));
                }
            }
            Link::Io { .. } if self.teardown_sent => return None,
            Link::Io { ctrl, epoch } => {
                if let Some(f) = &self.fence {
                    if f.done() {
                        let f = self.fence.take().expect("checked just above");
                        self.io_done(&f.cmd, Status::SUCCESS, f.started);
                        let c = self.cqe(f.cmd.sqe.cid(), Status::SUCCESS, 0);
                        return Some(QueueEvent::Complete(c));
                    }
                }
                let gone = ctrl.gone();
                let why = if gone != Gone::Alive {
                    Some(gone)
                } else if ctrl.io_epoch() != *epoch {
                    Some(ctrl.io_epoch_reason())
                } else {
                    None
                };
                if let Some(why) = why {
                    self.teardown_sent = true;
                    ctrl.detach_io(self.qid, self.token);
                    return Some(QueueEvent::Disconnect(why.reason()));
                }
            }
            Link::Unconnected | Link::Closed => {}
        }
        self.events.pop_front()
    }

    /// Release what the queue holds; idempotent (also run on drop).
    pub(super) fn release(&mut self) {
        if let (
            Some(ctrl),
            super::auth::QueueAuth::Required {
                authenticated: false,
                ..
            },
        ) = (self.ctrl(), &self.auth)
        {
            tracing::warn!(cntlid = ctrl.cntlid, qid = self.qid, host = %ctrl.hostnqn,
                subsys = %ctrl.subsys.nqn, peer = %self.peer,
                "the host closed the queue without authenticating (it must authenticate: has it a key?)");
        }
        self.auth = super::auth::QueueAuth::TornDown;
        self.fused_release();
        match std::mem::replace(&mut self.link, Link::Closed) {
            Link::Admin(ctrl) => {
                ctrl.set_admin_waker(None);
                ctrl.drop_aers();
                ctrl.fail(Gone::AdminLost);
                self.target.inner().unregister(&ctrl);
            }
            Link::Io { ctrl, .. } => ctrl.detach_io(self.qid, self.token),
            Link::Unconnected | Link::Closed => {}
        }
    }

    pub(super) fn install_waker(&mut self, w: Waker) {
        match &self.link {
            Link::Admin(ctrl) => ctrl.set_admin_waker(Some(w.clone())),
            Link::Io { ctrl, .. } => ctrl.set_io_waker(self.qid, self.token, Some(w.clone())),
            _ => {}
        }
        self.waker = Some(w);
    }

    /// Build the IoOp for a Trim of `ranges` ranges, listed in the command buffer (used by
    /// io.rs).
    pub(crate) fn trim_op(device: u32, ranges: u16) -> IoOp {
        IoOp {
            device,
            kind: IoKind::Trim { ranges },
            offset: 0,
            len: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mdts_from_max_io_size() {
        assert_eq!(mdts_for(8192), (1, 8192));
        assert_eq!(mdts_for(128 * 1024), (5, 128 * 1024));
        assert_eq!(mdts_for(128 * 1024 + 4096), (5, 128 * 1024));
        assert_eq!(mdts_for(4096), (1, 8192));
        assert_eq!(mdts_for(100), (1, 8192));
        assert_eq!(mdts_for(u32::MAX), (19, 1 << 31));
    }
}
