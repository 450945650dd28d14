//! I/O that survives the loss of its connection: [`ReconnectingNamespace`] (synchronous)
//! and [`ReconnectingQueue`] (asynchronous, NVMe/TCP and NVMe/RDMA).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::Sqe;

use crate::any_queue::{AnyBuf, AnyQueue};
use crate::cmd::{rw_submit_methods, Completion, Data, Dir, NsInfo, SubmitError, Transport};
use crate::controller::{ConnectOptions, Controller, ControllerInfo, Namespace};
use crate::error::{CmdError, Error};
use crate::rdma::MAX_BUF;

/// How a [`ReconnectingNamespace`] or [`ReconnectingQueue`] reconnects: exponential backoff
/// between attempts, bounded by a number of attempts and a total time per failure.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconnectPolicy {
    /// Most connection attempts for one failed call (0: never reconnect, fail at once).
    pub max_attempts: u32,
    /// No attempt starts later than this after the failure (`None`: only `max_attempts`
    /// bounds the wait).
    pub max_total: Option<Duration>,
    /// Wait before the first attempt.
    pub initial_delay: Duration,
    /// Longest wait between two attempts.
    pub max_delay: Duration,
    /// Factor from one wait to the next (at least 1).
    pub multiplier: f64,
}

impl Default for ReconnectPolicy {
    /// 100 ms, doubling up to 5 s, for up to 60 s or 30 attempts.
    fn default() -> ReconnectPolicy {
        ReconnectPolicy {
            max_attempts: 30,
            max_total: Some(Duration::from_secs(60)),
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            multiplier: 2.0,
        }
    }
}

impl ReconnectPolicy {
    /// The wait before attempt `attempt` (1 is the first): `initial_delay *
    /// multiplier^(attempt - 1)`, at most `max_delay`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let m = if self.multiplier.is_finite() {
            self.multiplier.max(1.0)
        } else {
            1.0
        };
        let exp = attempt.saturating_sub(1).min(i32::MAX as u32) as i32;
        let secs = self.initial_delay.as_secs_f64() * m.powi(exp);
        let cap = self.max_delay.max(self.initial_delay);
        if secs.is_finite() && secs < cap.as_secs_f64() {
            Duration::from_secs_f64(secs)
        } else {
            cap
        }
    }
}

/// Counters of a [`ReconnectingNamespace`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconnectStats {
    /// Connections re-established after a failure.
    pub reconnects: u64,
    /// Connection attempts that failed.
    pub failed_attempts: u64,
    /// Calls ([`ReconnectingNamespace`]) or commands ([`ReconnectingQueue`]) run again after
    /// their connection failed.
    pub retries: u64,
    /// Calls that gave up ([`Error::ReconnectGaveUp`]).
    pub gave_up: u64,
    /// Time from the last failure seen to the connection being back.
    pub last_outage: Option<Duration>,
}

/// One connection: the namespace's queue goes before its controller.
struct Conn {
    ns: Namespace,
    ctrl: Controller,
}

/// A namespace with the synchronous block API of [`Namespace`] that reconnects and retries
/// when its connection fails.
///
/// A plain [`Namespace`] fails every command once its queue fails (target gone, connection
/// reset, a command older than [`ConnectOptions::timeout`]), and stays failed. A
/// [`ReconnectingNamespace`] then drops the whole controller, connects again with exponential
/// backoff ([`ReconnectPolicy`]) and runs the failed command again, the way the Linux host's
/// error recovery does (`nvme_tcp_error_recovery`: tear the queues down without a shutdown,
/// reconnect every `reconnect_delay`, give up after `ctrl_loss_tmo`).
///
/// # What is retried
/// Read, Write, Flush, Write Zeroes and Dataset Management (deallocate) are idempotent at
/// the block level: running one again leaves the blocks as one successful run would. A
/// command that failed with the connection may well have reached the media before the
/// failure; the retry writes the same bytes again. (The one case this does not cover is a
/// namespace shared with another host that writes the same blocks in between: then the retry
/// can overwrite that host's newer data, as it can with the Linux host.) The synchronous API
/// has one operation in flight per handle, so a retry never reorders writes.
///
/// A Flush retried on a new connection covers what the target holds now. Writes acknowledged
/// before a target *crash* (power loss, kernel panic) and not yet flushed may be gone, and
/// the retried Flush cannot tell; a killed target *process* loses nothing it acknowledged
/// (nvmf-target writes with O_DIRECT, and the kernel keeps what a dead process wrote). Code
/// that must know should write again what it wrote since its last successful Flush when
/// [`ReconnectStats::reconnects`] moved.
///
/// Only failures of the transport are retried: a closed or reset connection, a protocol
/// error, a termination request, a timeout, a data digest mismatch. An answer from the
/// controller ([`Error::status`] is `Some`, e.g. LBA Out of Range or a write-protected
/// namespace) and a local error (an unaligned range) return at once, without reconnecting.
///
/// # Giving up
/// The budget of [`ReconnectPolicy`] runs from the first failure of one call until that call
/// succeeds: at most `max_attempts` connection attempts, and no attempt starts later than
/// `max_total` after the failure. Past either, the call fails with
/// [`Error::ReconnectGaveUp`], which carries the last failure. Each attempt is itself bounded
/// by [`ConnectOptions::timeout`] per wait, so the call returns at the latest about
/// `max_total` plus one attempt's bring-up after the failure. The handle stays usable: the
/// next call starts a new budget with a new attempt.
///
/// Every reconnect is checked against the first connection: the subsystem NQN, the serial
/// number and the namespace's geometry must be the same, or the call gives up at once (a
/// different device behind the same address must not receive the retried writes).
///
/// A reconnect brings the controller up with the same [`ConnectOptions`], so every queue it
/// creates authenticates again (DH-HMAC-CHAP) when the controller asks; an authentication
/// failure ([`Error::Auth`]) gives up at once too: the secret it refused is still the one
/// configured.
///
/// ```no_run
/// use std::time::Duration;
/// use nvmf_initiator::{ConnectOptions, ReconnectPolicy, ReconnectingNamespace};
///
/// let mut opts = ConnectOptions::tcp("127.0.0.1", 4420, "nqn.2026-11.io.nvmf-rs:default");
/// opts.timeout = Duration::from_secs(5);
/// let policy = ReconnectPolicy {
///     max_total: Some(Duration::from_secs(30)),
///     ..ReconnectPolicy::default()
/// };
/// let mut ns = ReconnectingNamespace::connect(opts, 1, policy)?;
/// let data = vec![0x5au8; 4096];
/// ns.write_at(&data, 0)?; // survives a target restart in the middle
/// let mut back = vec![0u8; 4096];
/// ns.read_at(&mut back, 0)?;
/// assert_eq!(back, data);
/// println!("reconnects: {}", ns.stats().reconnects);
/// # Ok::<(), nvmf_initiator::Error>(())
/// ```
pub struct ReconnectingNamespace {
    link: Link,
    conn: Option<Conn>,
}

impl std::fmt::Debug for ReconnectingNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconnectingNamespace")
            .field("link", &self.link)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

/// Where one failure stands in its reconnect budget.
struct Budget {
    since: Instant,
    attempts: u32,
    last: Arc<Error>,
}

impl Budget {
    fn start(cause: Error) -> Budget {
        Budget {
            since: Instant::now(),
            attempts: 0,
            last: Arc::new(cause),
        }
    }
}

/// What a reconnecting handle keeps across connections: how to connect, the policy, the
/// identity the first connection found, the counters.
struct Link {
    opts: ConnectOptions,
    policy: ReconnectPolicy,
    info: NsInfo,
    subnqn: String,
    serial: String,
    stats: ReconnectStats,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("addr", &self.opts.addr)
            .field("port", &self.opts.port)
            .field("subnqn", &self.subnqn)
            .field("info", &self.info)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Link {
    /// The first connection (no retry: a first connection that fails is a configuration
    /// problem), with one I/O queue (`opts.queues` is set to 1).
    fn first(
        mut opts: ConnectOptions,
        nsid: u32,
        policy: ReconnectPolicy,
    ) -> Result<(Link, Conn), Error> {
        opts.queues = 1;
        let conn = open(&opts, nsid)?;
        let c = conn.ctrl.info();
        let link = Link {
            info: *conn.ns.info(),
            subnqn: c.subnqn.clone(),
            serial: c.serial.clone(),
            opts,
            policy,
            stats: ReconnectStats::default(),
        };
        Ok((link, conn))
    }

    /// Connect again within `b`'s budget, waiting the policy's backoff before each attempt.
    fn reconnect(&mut self, b: &mut Budget) -> Result<Conn, Error> {
        loop {
            let elapsed = b.since.elapsed();
            let remaining = self.policy.max_total.map(|t| t.saturating_sub(elapsed));
            if b.attempts >= self.policy.max_attempts || remaining == Some(Duration::ZERO) {
                return Err(self.give_up(b));
            }
            let mut delay = self.policy.delay(b.attempts + 1);
            if let Some(r) = remaining {
                delay = delay.min(r);
            }
            std::thread::sleep(delay);
            b.attempts += 1;
            match open(&self.opts, self.info.nsid).and_then(|c| self.same_device(c)) {
                Ok(conn) => {
                    let outage = b.since.elapsed();
                    tracing::warn!(
                        attempt = b.attempts,
                        cntlid = conn.ctrl.info().cntlid,
                        outage_ms = outage.as_millis() as u64,
                        "reconnected"
                    );
                    self.stats.reconnects += 1;
                    self.stats.last_outage = Some(outage);
                    return Ok(conn);
                }
                Err(e) => {
                    self.stats.failed_attempts += 1;
                    tracing::warn!(
                        attempt = b.attempts,
                        max_attempts = self.policy.max_attempts,
                        error = %e,
                        "reconnect attempt failed"
                    );
                    // A refused secret does not get better by asking again.
                    let permanent = matches!(e, Error::Controller(_) | Error::Auth { .. });
                    b.last = Arc::new(e);
                    if permanent {
                        return Err(self.give_up(b));
                    }
                }
            }
        }
    }

    fn give_up(&mut self, b: &Budget) -> Error {
        self.stats.gave_up += 1;
        let e = Error::ReconnectGaveUp {
            attempts: b.attempts,
            elapsed: b.since.elapsed(),
            cause: b.last.clone(),
        };
        tracing::warn!(error = %e, "giving up");
        e
    }

    /// Refuse a connection to something else than the device of the first connection.
    fn same_device(&self, conn: Conn) -> Result<Conn, Error> {
        let c = conn.ctrl.info();
        let info = conn.ns.info();
        let what = if c.subnqn != self.subnqn {
            format!("subsystem NQN {:?}, was {:?}", c.subnqn, self.subnqn)
        } else if c.serial != self.serial {
            format!("serial number {:?}, was {:?}", c.serial, self.serial)
        } else if *info != self.info {
            format!("namespace {info:?}, was {:?}", self.info)
        } else {
            return Ok(conn);
        };
        // Shut the stranger down cleanly: it is alive, just not ours.
        let Conn { ns, ctrl } = conn;
        drop(ns);
        let _ = ctrl.shutdown();
        Err(Error::Controller(format!(
            "after reconnecting: the device changed: {what}"
        )))
    }
}

impl Conn {
    /// Tags of the connection's queue.
    fn ns_queue_depth(&self) -> usize {
        self.ns.queue_ref().depth()
    }

    /// Drop a broken connection without a shutdown handshake (the target frees its side
    /// when its keep-alive timer fires, or has already, with the connection).
    fn abandon(self) {
        let Conn { ns, ctrl } = self;
        drop(ns);
        ctrl.abandon();
    }

    fn shutdown(self) -> Result<(), Error> {
        let Conn { ns, ctrl } = self;
        drop(ns);
        ctrl.shutdown()
    }
}

impl ReconnectingNamespace {
    /// Connect (once, no retry: a first connection that fails is a configuration problem)
    /// with one I/O queue (`opts.queues` is set to 1) and open namespace `nsid`.
    pub fn connect(
        opts: ConnectOptions,
        nsid: u32,
        policy: ReconnectPolicy,
    ) -> Result<ReconnectingNamespace, Error> {
        let (link, conn) = Link::first(opts, nsid, policy)?;
        Ok(ReconnectingNamespace {
            link,
            conn: Some(conn),
        })
    }

    /// The namespace's geometry (the same on every connection).
    pub fn info(&self) -> &NsInfo {
        &self.link.info
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.link.info.size()
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.link.info.block_size
    }

    /// The policy in force.
    pub fn policy(&self) -> &ReconnectPolicy {
        &self.link.policy
    }

    /// Change the policy (applies from the next failure on).
    pub fn set_policy(&mut self, policy: ReconnectPolicy) {
        self.link.policy = policy;
    }

    /// Counters: reconnects, failed attempts, retried calls, give-ups.
    pub fn stats(&self) -> ReconnectStats {
        self.link.stats
    }

    /// Whether a connection is up (false after a give-up, until the next call reconnects).
    pub fn is_connected(&self) -> bool {
        self.conn.is_some()
    }

    /// The current controller's bring-up facts (its CNTLID changes with every reconnect).
    pub fn controller_info(&self) -> Option<&ControllerInfo> {
        self.conn.as_ref().map(|c| c.ctrl.info())
    }

    /// Read `buf.len()` bytes at byte `offset` ([`Namespace::read_at`]).
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        self.run("Read", |ns| ns.read_at(buf, offset))
    }

    /// Write `buf` at byte `offset` ([`Namespace::write_at`]).
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> Result<(), Error> {
        self.run("Write", |ns| ns.write_at(buf, offset))
    }

    /// Flush the volatile write cache ([`Namespace::flush`]).
    pub fn flush(&mut self) -> Result<(), Error> {
        self.run("Flush", |ns| ns.flush())
    }

    /// Write zeroes over `len` bytes at `offset` ([`Namespace::write_zeroes`]).
    pub fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<(), Error> {
        self.run("Write Zeroes", |ns| ns.write_zeroes(offset, len))
    }

    /// Deallocate byte ranges ([`Namespace::trim`]).
    pub fn trim(&mut self, ranges: &[(u64, u64)]) -> Result<(), Error> {
        self.run("Dataset Management", |ns| ns.trim(ranges))
    }

    /// Shut the controller down (CC.SHN) if connected.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.conn.take().map_or(Ok(()), Conn::shutdown)
    }

    /// Run `op` on the namespace, reconnecting and running it again while it fails with
    /// the transport.
    fn run<T>(
        &mut self,
        what: &'static str,
        mut op: impl FnMut(&mut Namespace) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut budget: Option<Budget> = None;
        loop {
            if self.conn.is_none() {
                let b = budget.get_or_insert_with(|| Budget::start(Error::Closed));
                self.conn = Some(self.link.reconnect(b)?);
            }
            let conn = self.conn.as_mut().expect("connected above");
            let err = match op(&mut conn.ns) {
                Ok(v) => return Ok(v),
                Err(e) if !is_transport_failure(&e) => return Err(e),
                Err(e) => e,
            };
            tracing::warn!(
                op = what,
                cntlid = conn.ctrl.info().cntlid,
                error = %err,
                "connection failed; reconnecting to retry"
            );
            self.conn.take().expect("connected").abandon();
            self.link.stats.retries += 1;
            match &mut budget {
                Some(b) => b.last = Arc::new(err),
                None => budget = Some(Budget::start(err)),
            }
        }
    }
}

/// The asynchronous counterpart of [`ReconnectingNamespace`]: up to a queue depth of
/// commands in flight ([`crate::Queue`]'s `submit` / `reap` API, `Vec<u8>` buffers). A
/// command on the connection is kept by the connection's queue itself (its slot holds the SQE,
/// the buffer and the caller's value); only commands waiting for a connection are held here.
/// When the connection fails,
/// every command it took down comes back with its buffer; after the reconnect they are
/// submitted again in the order they were first submitted, ahead of anything submitted
/// since, and complete as if nothing had happened. Completions carry the caller's
/// `user_data`; `tag` is the tag on the connection that completed the command.
///
/// Retry rules and the budget are those of [`ReconnectingNamespace`]; the budget runs from a
/// failure until a command completes successfully on a new connection (so a command that
/// takes every connection down exhausts it). A command that fails with a data digest error
/// while the connection stays up is submitted again on the same connection, at most
/// `max_attempts` times, then completes with the error. Commands in flight together have no
/// defined order (NVMe gives none), with or without a reconnect: keep overlapping writes
/// apart.
/// Waiting for a reconnect can make [`ReconnectingQueue::reap`] take longer than its
/// `timeout`, up to the policy's bound.
///
/// Over NVMe/RDMA the caller's `Vec<u8>` stays with the queue while its command runs, and
/// the queue carries the data in a buffer of the current connection's registered pool: one
/// copy per byte (into the pool for a write at submission, out of it for a read at
/// completion).
/// Registered buffers belong to their
/// connection's protection domain and die with it; the caller's `Vec` is what survives a
/// reconnect and is sent again. (Zero-copy I/O without reconnects: [`crate::RdmaQueue`].)
///
/// ```no_run
/// use nvmf_initiator::{ConnectOptions, ReconnectPolicy, ReconnectingQueue};
///
/// let opts = ConnectOptions::tcp("127.0.0.1", 4420, "nqn.2026-11.io.nvmf-rs:default");
/// let mut q = ReconnectingQueue::connect(opts, 1, ReconnectPolicy::default())?;
/// let ns = *q.info();
/// let bs = ns.block_size as usize;
/// for i in 0..32u64 {
///     q.submit_write(&ns, i * 8, vec![i as u8; 8 * bs], i).map_err(|e| e.error)?;
/// }
/// let mut done = Vec::new();
/// while q.in_flight() > 0 {
///     q.reap(&mut done, 1, None)?;
/// }
/// assert!(done.iter().all(|c| c.result.is_ok()));
/// # Ok::<(), nvmf_initiator::Error>(())
/// ```
pub struct ReconnectingQueue {
    link: Link,
    conn: Option<Conn>,
    /// The connection failed: reconnect before anything else.
    broken: bool,
    /// Commands in flight at most (the first connection's queue depth).
    depth: usize,
    next_seq: u64,
    /// Commands on no connection, waiting for one, in the order they go out. Commands on the
    /// connection are the connection's queue's own (its slots keep each command's SQE, buffer
    /// and value, and a failed queue hands them back in submission order).
    held: VecDeque<Held>,
    /// Per tag of the current connection's queue: how often the command on it was submitted
    /// again on the same connection (after a data digest error).
    tries: Box<[u32]>,
    budget: Option<Budget>,
    /// Completions of the connection's queue with their SQEs and data directions (reused: no
    /// allocation per I/O).
    scratch: Vec<(Completion<AnyBuf>, Sqe, Dir)>,
}

/// A command waiting for a connection.
struct Held {
    sqe: Sqe,
    data: Data,
    user_data: u64,
    tries: u32,
}

impl std::fmt::Debug for ReconnectingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconnectingQueue")
            .field("link", &self.link)
            .field("connected", &self.conn.is_some())
            .field("in_flight", &self.in_flight())
            .field("held", &self.held.len())
            .finish()
    }
}

/// A command's direction and the caller's buffer.
fn split(data: Data) -> (Dir, Option<Vec<u8>>) {
    match data {
        Data::None => (Dir::None, None),
        Data::ToController(b) => (Dir::ToCtrl, Some(b)),
        Data::FromController(b) => (Dir::FromCtrl, Some(b)),
    }
}

fn join(dir: Dir, buf: Option<Vec<u8>>) -> Data {
    match (dir, buf) {
        (Dir::ToCtrl, Some(b)) => Data::ToController(b),
        (Dir::FromCtrl, Some(b)) => Data::FromController(b),
        _ => Data::None,
    }
}

impl ReconnectingQueue {
    /// Connect over NVMe/TCP or NVMe/RDMA (once, no retry) with one I/O queue of
    /// `opts.queue_depth` and open namespace `nsid`.
    pub fn connect(
        opts: ConnectOptions,
        nsid: u32,
        policy: ReconnectPolicy,
    ) -> Result<ReconnectingQueue, Error> {
        let (link, conn) = Link::first(opts, nsid, policy)?;
        let depth = conn.ctrl.info().io_queue_depth as usize;
        let tags = conn.ns_queue_depth();
        Ok(ReconnectingQueue {
            link,
            conn: Some(conn),
            broken: false,
            depth,
            next_seq: 0,
            held: VecDeque::with_capacity(depth),
            tries: vec![0; tags].into_boxed_slice(),
            budget: None,
            scratch: Vec::with_capacity(depth),
        })
    }

    /// The namespace's geometry.
    pub fn info(&self) -> &NsInfo {
        &self.link.info
    }

    /// Counters: reconnects, failed attempts, commands submitted again, give-ups.
    pub fn stats(&self) -> ReconnectStats {
        self.link.stats
    }

    /// Change the policy (applies from the next failure on).
    pub fn set_policy(&mut self, policy: ReconnectPolicy) {
        self.link.policy = policy;
    }

    /// Commands submitted and not yet reaped (including those waiting for a reconnect).
    pub fn in_flight(&self) -> usize {
        self.held.len()
            + self
                .conn
                .as_ref()
                .map_or(0, |c| c.ns.queue_ref().in_flight())
    }

    /// Commands in flight at most.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Whether a working connection is up.
    pub fn is_connected(&self) -> bool {
        self.conn.is_some() && !self.broken
    }

    /// The current controller's bring-up facts.
    pub fn controller_info(&self) -> Option<&ControllerInfo> {
        self.conn.as_ref().map(|c| c.ctrl.info())
    }

    fn queue(conn: &mut Conn) -> &mut AnyQueue {
        conn.ns.queue()
    }

    /// Put a command on the connection's queue (a plain vector: over NVMe/RDMA the queue
    /// carries its data in a pool buffer). On failure the caller's buffer comes back.
    // The command comes back on failure (rare: the connection broke); no boxing for it.
    #[allow(clippy::result_large_err)]
    fn put(q: &mut AnyQueue, tries: &mut [u32], h: Held) -> Result<(), (Error, Held)> {
        let (dir, buf) = split(h.data);
        let data = match (dir, buf) {
            (Dir::ToCtrl, Some(b)) => crate::Data::ToController(AnyBuf::Vec(b)),
            (Dir::FromCtrl, Some(b)) => crate::Data::FromController(AnyBuf::Vec(b)),
            _ => crate::Data::None,
        };
        match q.submit(h.sqe, data, h.user_data) {
            Ok(tag) => {
                if let Some(t) = tries.get_mut(tag as usize) {
                    *t = h.tries;
                }
                Ok(())
            }
            Err(SubmitError { error, buf }) => {
                let buf = match buf {
                    Some(AnyBuf::Vec(v)) => Some(v),
                    _ => None,
                };
                Err((
                    error,
                    Held {
                        data: join(dir, buf),
                        ..h
                    },
                ))
            }
        }
    }

    /// Collect completions of the connection's queue into `scratch`.
    fn take(&mut self, min: usize, wait: Option<Duration>) -> Result<usize, Error> {
        let conn = self.conn.as_mut().expect("connected");
        let scratch = &mut self.scratch;
        Self::queue(conn).reap_with(min, wait, &mut |c, sqe, dir| scratch.push((c, *sqe, dir)))
    }

    /// Submit a command ([`crate::Queue::submit`]); returns its sequence number. While the
    /// connection is down, or older commands wait for it, the command waits too and goes out
    /// after them.
    pub fn submit(&mut self, sqe: Sqe, data: Data, user_data: u64) -> Result<u64, SubmitError> {
        if self.in_flight() >= self.depth {
            let (_, buf) = split(data);
            return Err(SubmitError {
                error: Error::QueueFull,
                buf,
            });
        }
        let seq = self.next_seq;
        if self.link.opts.transport == Transport::Rdma {
            let len = match &data {
                Data::ToController(b) | Data::FromController(b) => Some(b.len()),
                Data::None => None,
            };
            if let Some(len) = len.filter(|&l| l == 0 || l > MAX_BUF) {
                let (_, buf) = split(data);
                return Err(SubmitError {
                    error: Error::InvalidArgument(format!(
                        "RDMA buffer of {len} bytes (1..={MAX_BUF} bytes)"
                    )),
                    buf,
                });
            }
        }
        let h = Held {
            sqe,
            data,
            user_data,
            tries: 0,
        };
        match &mut self.conn {
            Some(c) if !self.broken && self.held.is_empty() => {
                match Self::put(Self::queue(c), &mut self.tries, h) {
                    Ok(()) => {}
                    Err((error, h)) if is_transport_failure(&error) => {
                        self.broken = true;
                        self.budget.get_or_insert_with(|| Budget::start(error));
                        self.held.push_back(h);
                    }
                    Err((error, h)) => {
                        let (_, buf) = split(h.data);
                        return Err(SubmitError { error, buf });
                    }
                }
            }
            _ => self.held.push_back(h),
        }
        self.next_seq += 1;
        Ok(seq)
    }

    rw_submit_methods!(pub, Vec<u8>, u64);

    /// Collect completions into `out` (appended), waiting until at least `min` are available
    /// (at most as many as are in flight) or `timeout` passes; reconnects (and submits the
    /// failed commands again) on the way when the connection fails. Returns how many were
    /// added.
    ///
    /// When the policy gives up, every command still waiting for a connection is appended to
    /// `out` with [`CmdError::QueueFailed`] (its buffer returned) and the call returns
    /// [`Error::ReconnectGaveUp`].
    pub fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error> {
        let until = timeout.map(|t| Instant::now() + t);
        let want = min.min(self.in_flight());
        let mut got = 0;
        loop {
            if self.broken {
                // A failed queue hands out every command it held at once, without waiting:
                // collect them before dropping it.
                if self.conn.is_some() {
                    let _ = self.take(0, Some(Duration::ZERO));
                    debug_assert_eq!(
                        self.conn.as_mut().map_or(0, |c| Self::queue(c).in_flight()),
                        0,
                        "a broken queue is a failed queue"
                    );
                    got += self.absorb(out, true);
                }
            }
            if self.broken || self.conn.is_none() {
                if let Err(e) = self.recover() {
                    self.fail_held(out);
                    return Err(e);
                }
            }
            self.submit_held();
            if self.broken {
                continue;
            }
            let wait = until.map(|u| u.saturating_duration_since(Instant::now()));
            let q = Self::queue(self.conn.as_mut().expect("connected"));
            let need = want.saturating_sub(got).min(q.in_flight());
            let reaped = self.take(need, wait);
            let failed = Self::queue(self.conn.as_mut().expect("connected")).is_failed();
            got += self.absorb(out, failed);
            if let Err(e) = reaped {
                self.broken = true;
                self.budget.get_or_insert_with(|| Budget::start(e));
            }
            if got >= want || until.is_some_and(|u| Instant::now() >= u) {
                return Ok(got);
            }
        }
    }

    /// Sort the completions in `scratch`: answers (success or NVMe status) go to `out`;
    /// commands the transport failed are held for resubmission, on a new connection if the
    /// queue `failed` (ahead of anything submitted since, in their submission order), else on
    /// the same one (a data digest error), at most `max_attempts` times each. Returns how many
    /// went to `out`.
    fn absorb(&mut self, out: &mut Vec<Completion>, failed: bool) -> usize {
        let mut got = 0;
        let mut scratch = std::mem::take(&mut self.scratch);
        // A failed queue completes its commands in submission order: they go back to the
        // front of the held list in that order.
        let mut front = 0;
        for (c, sqe, dir) in scratch.drain(..) {
            let buf = match c.buf {
                Some(AnyBuf::Vec(v)) => Some(v),
                _ => None,
            };
            let tries = self.tries.get(c.tag as usize).copied().unwrap_or(0);
            match c.result {
                Err(e)
                    if !matches!(e, CmdError::Status(_))
                        && (failed || tries < self.link.policy.max_attempts) =>
                {
                    let h = Held {
                        sqe,
                        data: join(dir, buf),
                        user_data: c.user_data,
                        tries: if failed { tries } else { tries + 1 },
                    };
                    if failed {
                        // Taken down with the connection: keep it for the next one.
                        self.broken = true;
                        self.budget.get_or_insert_with(|| {
                            Budget::start(Error::Command {
                                what: "I/O",
                                err: e,
                            })
                        });
                        self.held.insert(front, h);
                        front += 1;
                    } else {
                        self.held.push_back(h);
                    }
                }
                result => {
                    if result.is_ok() {
                        self.budget = None;
                    }
                    out.push(Completion {
                        tag: c.tag,
                        user_data: c.user_data,
                        result,
                        buf,
                    });
                    got += 1;
                }
            }
        }
        self.scratch = scratch;
        got
    }

    /// Drop the failed connection and connect again within the budget.
    fn recover(&mut self) -> Result<(), Error> {
        if let Some(c) = self.conn.take() {
            tracing::warn!(
                cntlid = c.ctrl.info().cntlid,
                in_flight = self.held.len(),
                "connection failed; reconnecting to submit the in-flight commands again"
            );
            c.abandon();
        }
        self.broken = false;
        let b = self
            .budget
            .get_or_insert_with(|| Budget::start(Error::Closed));
        let conn = self.link.reconnect(b)?;
        let tags = conn.ns_queue_depth();
        if self.tries.len() != tags {
            self.tries = vec![0; tags].into_boxed_slice();
        }
        self.conn = Some(conn);
        Ok(())
    }

    /// Submit held commands in their order while there are free tags.
    fn submit_held(&mut self) {
        if self.held.is_empty() || self.broken {
            return;
        }
        let Some(c) = self.conn.as_mut() else {
            return;
        };
        let q = Self::queue(c);
        while q.free_slots() > 0 {
            let Some(h) = self.held.pop_front() else {
                break;
            };
            match Self::put(q, &mut self.tries, h) {
                Ok(()) => self.link.stats.retries += 1,
                Err((_, h)) => {
                    // The new connection failed already.
                    self.held.push_front(h);
                    self.broken = true;
                    break;
                }
            }
        }
    }

    /// Hand every held command back as failed.
    fn fail_held(&mut self, out: &mut Vec<Completion>) {
        for h in self.held.drain(..) {
            out.push(Completion {
                tag: 0,
                user_data: h.user_data,
                result: Err(CmdError::QueueFailed),
                buf: split(h.data).1,
            });
        }
    }

    /// Shut the controller down (CC.SHN) if connected; commands still in flight are dropped.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.conn.take().map_or(Ok(()), Conn::shutdown)
    }
}

/// Connect with `opts` and open namespace `nsid`.
fn open(opts: &ConnectOptions, nsid: u32) -> Result<Conn, Error> {
    let mut ctrl = Controller::connect(opts.clone())?;
    let ns = ctrl.open_namespace(nsid)?;
    Ok(Conn { ns, ctrl })
}

/// Whether `e` says the connection failed (reconnect and retry) rather than how the
/// controller or this library answered the command (return it).
pub(crate) fn is_transport_failure(e: &Error) -> bool {
    match e {
        Error::Io(_)
        | Error::Timeout(..)
        | Error::Closed
        | Error::Protocol(_)
        | Error::TermReq { .. }
        | Error::QueueFailed { .. }
        | Error::Rdma(_)
        // A handshake that failed may be a target going away mid-way, or a key the target
        // has not been given yet: retried, as the Linux host retries it.
        | Error::Tls(_) => true,
        Error::Command { err, .. } => !matches!(err, CmdError::Status(_)),
        Error::Status { .. }
        | Error::Controller(_)
        | Error::Auth { .. }
        | Error::InvalidArgument(_)
        | Error::QueueFull
        | Error::Unsupported(_)
        | Error::ReconnectGaveUp { .. }
        | Error::NoUsablePath { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme::Status;

    #[test]
    fn backoff_grows_by_the_multiplier_up_to_the_cap() {
        let p = ReconnectPolicy {
            max_attempts: 10,
            max_total: None,
            initial_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(300),
            multiplier: 2.0,
        };
        let ms: Vec<u128> = (1..=6).map(|a| p.delay(a).as_millis()).collect();
        assert_eq!(ms, [50, 100, 200, 300, 300, 300]);
        assert_eq!(p.delay(u32::MAX), Duration::from_millis(300));
        // A multiplier below 1 (or not a number) does not shrink the wait.
        for m in [0.5, f64::NAN, f64::INFINITY] {
            let p = ReconnectPolicy {
                multiplier: m,
                ..p.clone()
            };
            assert_eq!(p.delay(3), Duration::from_millis(50), "multiplier {m}");
        }
    }

    #[test]
    fn only_transport_failures_are_retried() {
        let retried = [
            Error::Closed,
            Error::Io(std::io::ErrorKind::ConnectionReset.into()),
            Error::Timeout(Duration::from_secs(1), "a command completion"),
            Error::QueueFailed {
                qid: 1,
                cause: Arc::new(Error::Closed),
            },
            Error::TermReq { fes: 1, fei: 0 },
            Error::Command {
                what: "Read",
                err: CmdError::DataDigest,
            },
            Error::Command {
                what: "Read",
                err: CmdError::QueueFailed,
            },
        ];
        for e in &retried {
            assert!(is_transport_failure(e), "{e}");
        }
        let answered = [
            Error::Status {
                what: "Write",
                status: Status::LBA_RANGE,
            },
            Error::Command {
                what: "Write",
                err: CmdError::Status(Status::LBA_RANGE),
            },
            Error::InvalidArgument("unaligned".into()),
            Error::Unsupported("Write Zeroes"),
            Error::Controller("KAS is 0".into()),
            Error::Auth {
                qid: 0,
                step: "reply",
                detail: "the controller rejected the host".into(),
            },
            Error::ReconnectGaveUp {
                attempts: 3,
                elapsed: Duration::from_secs(1),
                cause: Arc::new(Error::Closed),
            },
        ];
        for e in &answered {
            assert!(!is_transport_failure(e), "{e}");
        }
    }
}
