//! Asynchronous I/O that survives the loss of its connection: [`ReconnectingQueue`]
//! (NVMe/TCP and NVMe/RDMA), on one path of [`crate::path`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::Sqe;

use crate::any_queue::{AnyBuf, AnyQueue};
use crate::cmd::{rw_submit_methods, Completion, Data, Dir, NsInfo, SubmitError, Transport};
use crate::controller::{ConnectOptions, ControllerInfo, NsQueue};
use crate::error::{CmdError, Error};
use crate::multipath::{classify, AnaPaths, Failure, MultipathOptions};
use crate::path::{
    first_path, is_transport_failure, Budget, Connected, Link, PathStats, ReconnectPolicy, Shared,
};
use crate::rdma::MAX_BUF;

/// The asynchronous counterpart of a [`crate::Namespace`] that reconnects
/// ([`ReconnectingQueue::connect`], one path) or has several paths
/// ([`ReconnectingQueue::multipath`]): up to a queue depth of commands in flight
/// ([`crate::Queue`]'s `submit` / `reap` API, `Vec<u8>` buffers). (A namespace on a
/// controller the caller keeps has its queue itself: [`crate::Namespace::queue`].) A
/// command on the connection is kept by the connection's queue itself (its slot holds the SQE,
/// the buffer and the caller's value); only commands waiting for a connection are held here.
/// When the connection fails,
/// every command it took down comes back with its buffer; after the reconnect they are
/// submitted again in the order they were first submitted, ahead of anything submitted
/// since, and complete as if nothing had happened. Completions carry the caller's
/// `user_data`; `tag` is the tag on the connection that completed the command.
///
/// Retry rules and the budget are those of [`crate::Namespace`]; the budget runs from a
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
    paths: QPaths,
    info: NsInfo,
    /// A path is NVMe/RDMA: buffers are bounded by the pool's.
    rdma: bool,
    /// The paths' status and counters.
    shared: Arc<Shared>,
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
    /// Several paths: since when this queue waits for a usable one.
    since: Option<Instant>,
    /// Several paths: a command came back with an ANA or path status; no more go to this
    /// path, and once its queue has none in flight the queue moves to another.
    draining: Option<(Failure, Error)>,
    /// Completions of the connection's queue with their SQEs and data directions (reused: no
    /// allocation per I/O).
    scratch: Vec<(Completion<AnyBuf>, Sqe, Dir)>,
}

/// The path set under the queue (one per queue: an indirection per command would cost
/// more than the variants' sizes).
#[allow(clippy::large_enum_variant)]
enum QPaths {
    /// One path, reconnected within `reap` as the policy says.
    One { link: Link, conn: Option<Connected> },
    /// Several, reconnecting in their threads; the queue uses one at a time (the first
    /// usable by ANA state) and moves to another when it fails.
    Ana {
        set: AnaPaths,
        /// The path in use and its connection's epoch.
        cur: Option<(usize, u64)>,
    },
}

impl QPaths {
    fn queue(&mut self) -> Option<&mut AnyQueue> {
        match self {
            QPaths::One { conn, .. } => conn.as_mut().map(|c| c.ns.queue()),
            QPaths::Ana { set, cur } => {
                let (i, _) = (*cur)?;
                set.queue(i).map(NsQueue::queue)
            }
        }
    }

    fn in_flight(&self) -> usize {
        match self {
            QPaths::One { conn, .. } => conn.as_ref().map_or(0, |c| c.ns.queue_ref().in_flight()),
            QPaths::Ana { set, cur } => cur
                .and_then(|(i, _)| set.queue_ref(i))
                .map_or(0, |q| q.queue_ref().in_flight()),
        }
    }

    fn connected(&self) -> bool {
        match self {
            QPaths::One { conn, .. } => conn.is_some(),
            QPaths::Ana { cur, .. } => cur.is_some(),
        }
    }
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
            .field("info", &self.info)
            .field("connected", &self.paths.connected())
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
        mut opts: ConnectOptions,
        nsid: u32,
        policy: ReconnectPolicy,
    ) -> Result<ReconnectingQueue, Error> {
        let rdma = opts.transport == Transport::Rdma;
        opts.queues = 1;
        let (conn, link, shared) = first_path(opts, nsid, policy)?;
        let depth = conn.info().io_queue_depth as usize;
        let tags = conn.ns.queue_ref().depth();
        let info = conn.identity.info;
        let paths = QPaths::One {
            link,
            conn: Some(conn),
        };
        Ok(Self::new(paths, info, rdma, shared, depth, tags))
    }

    /// Open namespace `nsid` over several paths, as [`crate::Namespace::multipath`] does
    /// (each path with one I/O queue of its `queue_depth`, reconnecting in the background).
    /// The queue sends every command on one path at a time, the first usable by ANA state
    /// ([`MultipathOptions::policy`] is not used), and moves to another when that path fails
    /// (its commands in flight are submitted again there, as after a reconnect) or answers an
    /// ANA or path status (the commands that did are sent again on the other path once the
    /// first has none in flight). With no usable path, `reap` waits for one as long as a
    /// multipath namespace's call would, then fails the waiting commands with
    /// [`Error::NoUsablePath`].
    pub fn multipath(
        paths: Vec<ConnectOptions>,
        nsid: u32,
        opts: MultipathOptions,
    ) -> Result<ReconnectingQueue, Error> {
        let rdma = paths.iter().any(|p| p.transport == Transport::Rdma);
        let (info, shared, mut set) = AnaPaths::open(paths, nsid, opts)?;
        let mut since = None;
        let (i, epoch) = set.usable("open", &mut since)?;
        let tags = set.queue_ref(i).map_or(0, |q| q.queue_ref().depth());
        let paths = QPaths::Ana {
            set,
            cur: Some((i, epoch)),
        };
        Ok(Self::new(paths, info, rdma, shared, tags, tags))
    }

    fn new(
        paths: QPaths,
        info: NsInfo,
        rdma: bool,
        shared: Arc<Shared>,
        depth: usize,
        tags: usize,
    ) -> ReconnectingQueue {
        ReconnectingQueue {
            paths,
            info,
            rdma,
            shared,
            broken: false,
            depth,
            next_seq: 0,
            held: VecDeque::with_capacity(depth),
            tries: vec![0; tags].into_boxed_slice(),
            budget: None,
            since: None,
            draining: None,
            scratch: Vec::with_capacity(depth),
        }
    }

    /// The namespace's geometry.
    pub fn info(&self) -> &NsInfo {
        &self.info
    }

    /// Counters: reconnects, failed attempts, commands submitted again, give-ups.
    pub fn stats(&self) -> PathStats {
        self.shared.lock().stats
    }

    /// Change the policy (applies from the next failure on).
    pub fn set_policy(&mut self, policy: ReconnectPolicy) {
        self.shared.lock().policy = policy;
    }

    /// Commands submitted and not yet reaped (including those waiting for a reconnect).
    pub fn in_flight(&self) -> usize {
        self.held.len() + self.paths.in_flight()
    }

    /// Commands in flight at most.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Whether a working connection is up.
    pub fn is_connected(&self) -> bool {
        self.paths.connected() && !self.broken
    }

    /// The current controller's bring-up facts (one path).
    pub fn controller_info(&self) -> Option<&ControllerInfo> {
        match &self.paths {
            QPaths::One { conn, .. } => conn.as_ref().map(|c| c.info()),
            QPaths::Ana { .. } => None,
        }
    }

    /// Every path, as [`crate::Namespace::paths`] reports them.
    pub fn paths(&self) -> Vec<crate::PathInfo> {
        crate::PathMonitor {
            shared: self.shared.clone(),
        }
        .paths()
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
        let q = self.paths.queue().expect("connected");
        let scratch = &mut self.scratch;
        q.reap_with(min, wait, &mut |c, sqe, dir| scratch.push((c, *sqe, dir)))
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
        if self.rdma {
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
        let open = !self.broken && self.held.is_empty() && self.draining.is_none();
        match self.paths.queue() {
            Some(q) if open => match Self::put(q, &mut self.tries, h) {
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
            },
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
                if self.paths.connected() {
                    let _ = self.take(0, Some(Duration::ZERO));
                    debug_assert_eq!(
                        self.paths.in_flight(),
                        0,
                        "a broken queue is a failed queue"
                    );
                    got += self.absorb(out, true);
                }
            }
            if self.broken || !self.paths.connected() {
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
            let need = want.saturating_sub(got).min(self.paths.in_flight());
            let reaped = self.take(need, wait);
            let failed = self.paths.queue().is_some_and(|q| q.is_failed());
            got += self.absorb(out, failed);
            if let Err(e) = reaped {
                self.broken = true;
                self.budget.get_or_insert_with(|| Budget::start(e));
            }
            if !self.broken {
                self.drained();
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
            let ana = matches!(self.paths, QPaths::Ana { .. });
            match c.result {
                Err(CmdError::Status(st))
                    if ana
                        && classify(&Error::from_cmd("I/O", CmdError::Status(st)))
                            != Failure::Other =>
                {
                    // Another path may serve it: once this one has nothing in flight.
                    let err = Error::from_cmd("I/O", CmdError::Status(st));
                    if self.draining.is_none() {
                        self.draining = Some((classify(&err), err));
                    }
                    self.held.push_back(Held {
                        sqe,
                        data: join(dir, buf),
                        user_data: c.user_data,
                        tries,
                    });
                }
                Err(e)
                    if !matches!(e, CmdError::Status(_))
                        && (failed || tries < self.shared.lock().policy.max_attempts) =>
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
                        self.since = None;
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

    /// Several paths: once the path that answered an ANA or path status (or one that is not
    /// optimized while another is) has nothing in flight, leave it (the next `recover` picks
    /// another).
    fn drained(&mut self) {
        let QPaths::Ana { set, cur } = &mut self.paths else {
            return;
        };
        let Some((i, epoch)) = *cur else { return };
        if self.draining.is_none() && set.better_than(i) {
            // An optimized path is usable while this one is not: move to it.
            self.draining = Some((Failure::Other, Error::Closed));
        }
        if self.draining.is_none()
            || set
                .queue_ref(i)
                .is_some_and(|q| q.queue_ref().in_flight() > 0)
        {
            return;
        }
        let (failure, err) = self.draining.take().expect("checked above");
        if failure != Failure::Other {
            set.failed(i, epoch, failure, &err);
        }
        *cur = None;
    }

    /// Drop the failed connection and connect again within the budget (one path), or move to
    /// another usable path (several).
    fn recover(&mut self) -> Result<(), Error> {
        self.broken = false;
        let b = self
            .budget
            .get_or_insert_with(|| Budget::start(Error::Closed));
        match &mut self.paths {
            QPaths::One { link, conn } => {
                if let Some(c) = conn.take() {
                    tracing::warn!(
                        cntlid = c.info().cntlid,
                        in_flight = self.held.len(),
                        "connection failed; reconnecting to submit the in-flight commands again"
                    );
                    c.abandon();
                }
                *conn = Some(link.reconnect(&self.shared, b, &mut |d| {
                    std::thread::sleep(d);
                    true
                })?);
            }
            QPaths::Ana { set, cur } => {
                if let Some((i, epoch)) = cur.take() {
                    // Its queue failed: the path's thread reconnects it.
                    set.failed(i, epoch, Failure::Path, &b.last);
                }
                self.draining = None;
                *cur = Some(set.usable("I/O", &mut self.since)?);
            }
        }
        let tags = self.paths.queue().map_or(0, |q| q.depth());
        if self.tries.len() != tags {
            self.tries = vec![0; tags].into_boxed_slice();
        }
        Ok(())
    }

    /// Submit held commands in their order while there are free tags.
    fn submit_held(&mut self) {
        if self.held.is_empty() || self.broken || self.draining.is_some() {
            return;
        }
        let Some(q) = self.paths.queue() else {
            return;
        };
        while q.free_slots() > 0 {
            let Some(h) = self.held.pop_front() else {
                break;
            };
            match Self::put(q, &mut self.tries, h) {
                Ok(()) => self.shared.lock().stats.retries += 1,
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

    /// Shut the controllers down (CC.SHN) if connected; commands still in flight are dropped.
    pub fn shutdown(mut self) -> Result<(), Error> {
        match &mut self.paths {
            QPaths::One { conn, .. } => conn.take().map_or(Ok(()), Connected::shutdown),
            QPaths::Ana { set, cur } => {
                *cur = None;
                set.close()
            }
        }
    }
}
