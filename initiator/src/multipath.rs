//! A namespace's path set of several paths ([`AnaPaths`]): Asymmetric Namespace Access (ANA)
//! path selection and failover, a thread per path (the behaviour is documented on
//! [`crate::Namespace::multipath`]).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvme::identify;
use nvme::log::{self as nvlog, ana_state, AsyncEvent};
use nvme::Status;

use crate::cmd::{NsInfo, Transport};
use crate::controller::{ConnectOptions, Controller, NsQueue};
use crate::discovery::discover_with;
use crate::error::Error;
use crate::path::{
    connect_path, is_permanent, is_transport_failure, one_host, Budget, Connected, Link, PathState,
    PathStatus, ReconnectPolicy, Shared, SharedState,
};

/// The wait without ANATT from any path.
const DEFAULT_ANATT: Duration = Duration::from_secs(10);
/// How long a path thread waits for an event before it looks at its requests again.
const EVENT_SLICE: Duration = Duration::from_millis(50);
/// How long a call waiting for a usable path sleeps before it asks for the logs again.
const WAIT_SLICE: Duration = Duration::from_millis(200);

/// An Asymmetric Namespace Access state (NVMe Base 2.0, 8.20.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnaState {
    /// ANA Optimized (01h): the preferred path.
    Optimized,
    /// ANA Non-Optimized (02h): usable, when no optimized path is.
    NonOptimized,
    /// ANA Inaccessible (03h): I/O fails with Asymmetric Access Inaccessible.
    Inaccessible,
    /// ANA Persistent Loss (04h): I/O fails with Asymmetric Access Persistent Loss.
    PersistentLoss,
    /// ANA Change (0Fh): changing; I/O fails with Asymmetric Access Transition.
    Change,
    /// A value the specification reserves.
    Reserved(u8),
}

impl AnaState {
    /// From the 4-bit state of an ANA group descriptor.
    pub fn from_raw(v: u8) -> AnaState {
        match v & 0x0f {
            ana_state::OPTIMIZED => AnaState::Optimized,
            ana_state::NON_OPTIMIZED => AnaState::NonOptimized,
            ana_state::INACCESSIBLE => AnaState::Inaccessible,
            ana_state::PERSISTENT_LOSS => AnaState::PersistentLoss,
            ana_state::CHANGE => AnaState::Change,
            v => AnaState::Reserved(v),
        }
    }

    /// The state an I/O status implies (Asymmetric Access Persistent Loss, Inaccessible,
    /// Transition), `None` for any other status.
    pub fn from_status(s: Status) -> Option<AnaState> {
        match s.code() {
            c if c == Status::ANA_PERSISTENT_LOSS.code() => Some(AnaState::PersistentLoss),
            c if c == Status::ANA_INACCESSIBLE.code() => Some(AnaState::Inaccessible),
            c if c == Status::ANA_TRANSITION.code() => Some(AnaState::Change),
            _ => None,
        }
    }

    /// Whether I/O may be sent in this state (optimized or non-optimized).
    pub fn is_usable(self) -> bool {
        matches!(self, AnaState::Optimized | AnaState::NonOptimized)
    }
}

impl std::fmt::Display for AnaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnaState::Optimized => f.write_str("optimized"),
            AnaState::NonOptimized => f.write_str("non-optimized"),
            AnaState::Inaccessible => f.write_str("inaccessible"),
            AnaState::PersistentLoss => f.write_str("persistent-loss"),
            AnaState::Change => f.write_str("change"),
            AnaState::Reserved(v) => write!(f, "reserved state {v:#x}"),
        }
    }
}

/// Which of several usable paths of the same state a call goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PathPolicy {
    /// The first in the order the paths were given (all I/O on one path while it is usable;
    /// the Linux host's `numa` policy on one node).
    #[default]
    First,
    /// In turn, call by call (the Linux host's `round-robin`).
    RoundRobin,
}

/// How a multipath [`crate::Namespace`] selects paths, watches them and brings them back.
#[derive(Debug, Clone, PartialEq)]
pub struct MultipathOptions {
    /// Among usable paths of the best state.
    pub policy: PathPolicy,
    /// Read every connected path's ANA log this often besides the events (`None`: only on
    /// events and ANA statuses).
    pub ana_poll: Option<Duration>,
    /// How each failed path reconnects in the background (its thread stops trying, and
    /// the path is [`PathState::Refused`], when the policy gives up).
    pub reconnect: ReconnectPolicy,
    /// How long a call waits for a usable path (`None`: the paths' longest ANATT, 10 s if
    /// none reports one).
    pub no_path_timeout: Option<Duration>,
}

impl Default for MultipathOptions {
    /// First optimized path, the log read every second, reconnects from 100 ms doubling up to
    /// 5 s, the wait for a path bounded by ANATT.
    fn default() -> MultipathOptions {
        MultipathOptions {
            policy: PathPolicy::First,
            ana_poll: Some(Duration::from_secs(1)),
            reconnect: ReconnectPolicy::forever(),
            no_path_timeout: None,
        }
    }
}

/// A connected path, owned by its thread.
struct Live {
    ctrl: Controller,
    epoch: u64,
    /// The controller reports ANA (CMIC bit 3): read its log.
    ana: bool,
    /// An Asynchronous Event Request is posted.
    aer: bool,
    grpid: u32,
    /// Bytes of ANA log to read.
    log_len: usize,
    next_poll: Option<Instant>,
}

/// The namespace's state in an ANA log: the group listing `nsid`, else group `grpid`.
fn ana_state_in(log: &[u8], nsid: u32, grpid: u32) -> Option<AnaState> {
    let le32 = |b: &[u8]| u32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
    let ngrps = u16::from_le_bytes([*log.get(8)?, *log.get(9)?]) as usize;
    let mut off = 16usize;
    let mut by_group = None;
    for _ in 0..ngrps {
        let d = log.get(off..off + 32)?;
        let (id, nnsids, state) = (le32(&d[0..4]), le32(&d[4..8]) as usize, d[16]);
        let state = AnaState::from_raw(state);
        let list = log.get(off + 32..(off + 32).saturating_add(nnsids.saturating_mul(4)));
        if let Some(list) = list {
            if list.chunks_exact(4).any(|c| le32(c) == nsid) {
                return Some(state);
            }
        }
        if id == grpid {
            by_group = Some(state);
        }
        off = off
            .saturating_add(32)
            .saturating_add(nnsids.saturating_mul(4));
    }
    by_group
}

/// Whether status `s` is about the path rather than the command: an ANA status (the
/// namespace is not accessible through this controller now), another path related status
/// (SCT 3h), or Command Aborted due to SQ Deletion (a target tearing the controller down).
/// Another path may run the command.
pub fn is_path_status(s: Status) -> bool {
    AnaState::from_status(s).is_some() || s.sct() == 3 || s.code() == Status::ABORT_QUEUE.code()
}

/// The namespace's ANA state in `ctrl`'s ANA log (a log of `log_len` bytes at most; a log
/// that does not list the namespace's group says Inaccessible).
pub(crate) fn read_ana_state(
    ctrl: &Controller,
    log_len: usize,
    nsid: u32,
    grpid: u32,
) -> Result<AnaState, Error> {
    let mut buf = vec![0u8; log_len.div_ceil(4) * 4];
    ctrl.get_log_page(nvlog::lid::ANA, 0, 0, &mut buf)?;
    Ok(ana_state_in(&buf, nsid, grpid).unwrap_or_else(|| {
        tracing::warn!(grpid, "the ANA log does not list the namespace's group");
        AnaState::Inaccessible
    }))
}

/// How a failed call's error counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// An ANA status: the path is in that state now.
    Ana(AnaState),
    /// The path failed: its transport, another path related status (SCT 3h: Internal Path
    /// Error, Controller or Host Pathing Error, ...), or a command aborted because the
    /// controller deleted its queue (the target tearing the controller down).
    Path,
    /// The command's own outcome: returned to the caller.
    Other,
}

pub(crate) fn classify(e: &Error) -> Failure {
    match e.status() {
        Some(s) => match AnaState::from_status(s) {
            Some(state) => Failure::Ana(state),
            None if is_path_status(s) => Failure::Path,
            None => Failure::Other,
        },
        None if is_transport_failure(e) => Failure::Path,
        None => Failure::Other,
    }
}

/// The thread of one path.
struct PathThread {
    idx: usize,
    shared: Arc<Shared>,
    link: Link,
    mp: MultipathOptions,
}

impl PathThread {
    fn stopped(&self) -> bool {
        self.shared.lock().stop
    }

    fn label(&self) -> String {
        self.link.label()
    }

    /// Put a new connection into use.
    fn publish(&self, c: Connected) -> Live {
        let Connected {
            ctrl,
            ns,
            ana,
            aen,
            grpid,
            anatt,
            log_len,
            ..
        } = c;
        let mut aer = false;
        if aen {
            match ctrl
                .enable_async_events(identify::ctrl::OAES_ANA_CHANGE)
                .and_then(|()| ctrl.submit_async_event_request())
            {
                Ok(()) => aer = true,
                Err(e) => tracing::warn!(path = %self.label(), error = %e,
                    "ANA change events not available; polling the ANA log"),
            }
        }
        let cntlid = ctrl.info().cntlid;
        let mut g = self.shared.lock();
        let p = &mut g.paths[self.idx];
        p.epoch += 1;
        let epoch = p.epoch;
        p.state = PathState::Connected;
        p.pending = Some(ns);
        p.ana_group = grpid;
        p.anatt = anatt;
        p.cntlid = Some(cntlid);
        p.io_failed = None;
        // Not usable until the log says so (and a controller without ANA is optimized).
        p.ana_state = if ana { None } else { Some(AnaState::Optimized) };
        p.refresh = ana;
        drop(g);
        self.shared.cv.notify_all();
        Live {
            ctrl,
            epoch,
            ana,
            aer,
            grpid,
            log_len,
            next_poll: None,
        }
    }

    /// Mark the path failed (connection `epoch`, if still current) with `e`.
    fn mark_failed(&self, epoch: Option<u64>, e: &Error) {
        let mut g = self.shared.lock();
        let p = &mut g.paths[self.idx];
        if epoch.is_none_or(|ep| ep == p.epoch) {
            p.state = PathState::Failed;
            p.pending = None;
            p.cntlid = None;
        }
        p.last_error = Some(e.to_string());
        drop(g);
        self.shared.cv.notify_all();
    }

    /// Read the ANA log and record the state, again if the I/O side asked for another read
    /// while this one ran.
    fn refresh(&self, live: &mut Live) -> Result<(), Error> {
        for _ in 0..4 {
            self.shared.lock().paths[self.idx].refresh = false;
            let state = if live.ana {
                match read_ana_state(&live.ctrl, live.log_len, self.link.nsid, live.grpid) {
                    Ok(state) => state,
                    Err(e) if is_transport_failure(&e) => return Err(e),
                    Err(e) => {
                        tracing::warn!(path = %self.label(), error = %e,
                            "cannot read the ANA log: taking the path as optimized");
                        live.ana = false;
                        AnaState::Optimized
                    }
                }
            } else {
                AnaState::Optimized
            };
            let mut g = self.shared.lock();
            if g.paths[self.idx].refresh {
                continue;
            }
            let p = &mut g.paths[self.idx];
            let old = p.ana_state.replace(state);
            if old != Some(state) {
                if old.is_some() {
                    tracing::info!(path = %self.label(), from = ?old, to = %state, "ANA state changed");
                    g.stats.ana_changes += 1;
                }
                drop(g);
                self.shared.cv.notify_all();
            }
            break;
        }
        live.next_poll = self.mp.ana_poll.map(|d| Instant::now() + d);
        Ok(())
    }

    /// Run the path until the namespace closes; returns the shutdown's result.
    fn run(self, initial: Option<Connected>) -> Result<(), Error> {
        let mut live = initial.map(|c| self.publish(c));
        let mut budget: Option<Budget> = None;
        loop {
            if self.stopped() {
                break;
            }
            let Some(l) = live.as_mut() else {
                let b = budget.get_or_insert_with(|| {
                    let last = self.shared.lock().paths[self.idx].last_error.clone();
                    Budget::start(Error::Controller(
                        last.unwrap_or_else(|| "not connected".into()),
                    ))
                });
                match self
                    .link
                    .reconnect(&self.shared, b, &mut |d| self.shared.sleep(d))
                {
                    Ok(c) => {
                        budget = None;
                        live = Some(self.publish(c));
                    }
                    Err(_) if self.stopped() => break,
                    Err(e) => {
                        tracing::warn!(path = %self.label(), error = %e, "giving the path up");
                        let mut g = self.shared.lock();
                        g.paths[self.idx].state = PathState::Refused;
                        g.paths[self.idx].last_error = Some(e.to_string());
                        drop(g);
                        self.shared.cv.notify_all();
                        return Ok(());
                    }
                }
                continue;
            };
            let (io_failed, refresh) = {
                let g = self.shared.lock();
                let p = &g.paths[self.idx];
                (p.io_failed == Some(l.epoch), p.refresh)
            };
            let mut failure = None;
            if io_failed {
                failure = Some(None);
            } else if refresh || l.next_poll.is_some_and(|t| Instant::now() >= t) {
                if let Err(e) = self.refresh(l) {
                    failure = Some(Some(e));
                }
            } else if l.aer {
                match l.ctrl.wait_async_event(EVENT_SLICE) {
                    Ok(None) => {}
                    Ok(Some(dw0)) => {
                        let ev = AsyncEvent::decode(dw0);
                        tracing::debug!(path = %self.label(), event = ?ev, "asynchronous event");
                        if ev == AsyncEvent::ANA_CHANGE {
                            self.shared.lock().stats.ana_events += 1;
                        }
                        if let Err(e) = l.ctrl.submit_async_event_request() {
                            l.aer = false;
                            if is_transport_failure(&e) {
                                failure = Some(Some(e));
                            }
                        }
                        self.shared.lock().paths[self.idx].refresh = true;
                    }
                    Err(e) if is_transport_failure(&e) => failure = Some(Some(e)),
                    Err(e) => {
                        tracing::warn!(path = %self.label(), error = %e,
                            "Asynchronous Event Request failed; polling the ANA log");
                        l.aer = false;
                    }
                }
            } else {
                let wait = l
                    .next_poll
                    .map_or(EVENT_SLICE, |t| t.saturating_duration_since(Instant::now()))
                    .min(EVENT_SLICE);
                let g = self.shared.lock();
                if !g.stop && !g.paths[self.idx].refresh {
                    drop(self.shared.cv.wait_timeout(g, wait));
                }
            }
            if let Some(cause) = failure {
                let l = live.take().expect("connected");
                if let Some(e) = &cause {
                    tracing::warn!(path = %self.label(), error = %e, "path failed");
                    self.mark_failed(Some(l.epoch), e);
                } else {
                    tracing::warn!(path = %self.label(), "path failed (I/O)");
                }
                l.ctrl.abandon();
            }
        }
        match live {
            Some(l) => {
                self.shared.lock().paths[self.idx].pending = None;
                l.ctrl.shutdown()
            }
            None => Ok(()),
        }
    }
}

/// Several paths of a namespace, each owned by a thread of its own.
pub(crate) struct AnaPaths {
    shared: Arc<Shared>,
    /// Per path: the queue of its current connection (with the connection's epoch).
    local: Vec<Option<(u64, NsQueue)>>,
    threads: Vec<JoinHandle<Result<(), Error>>>,
    opts: MultipathOptions,
    /// Where round-robin looks first.
    next: usize,
}

impl AnaPaths {
    /// Connect every path (one I/O queue each, the first path's host NQN and host ID, and its
    /// DH-HMAC-CHAP secrets where a path has none) at the same time; fails if none connects
    /// (the error names each path's failure); a path that failed is tried again in the
    /// background. The first path to connect (in the order given) fixes the namespace: one
    /// that leads elsewhere (another subsystem, geometry or NGUID) is refused.
    pub(crate) fn open(
        paths: Vec<ConnectOptions>,
        nsid: u32,
        opts: MultipathOptions,
    ) -> Result<(NsInfo, Arc<Shared>, AnaPaths), Error> {
        let mut paths = one_host(paths)?;
        for p in &mut paths {
            p.queues = 1;
        }
        let first = paths[0].clone();
        let results: Vec<Result<Connected, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = paths
                .iter()
                .map(|o| s.spawn(move || connect_path(o, nsid)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Controller("connecting thread panicked".into()))
                    })
                })
                .collect()
        });
        let Some(mut identity) = results
            .iter()
            .find_map(|r| r.as_ref().ok().map(|c| c.identity.clone()))
        else {
            let why: Vec<String> = paths
                .iter()
                .zip(&results)
                .map(|(o, r)| match r {
                    Err(e) => format!("{}:{}: {e}", o.addr, o.port),
                    Ok(_) => unreachable!("no path connected"),
                })
                .collect();
            return Err(Error::NoUsablePath {
                what: "open",
                waited: Duration::ZERO,
                paths: why.join("; "),
            });
        };
        // The controllers of several gateways may have serial numbers of their own.
        identity.serial = None;
        let statuses = paths.iter().map(PathStatus::new).collect();
        let shared = Shared::new(statuses, opts.reconnect.clone());
        let mut threads = Vec::with_capacity(paths.len());
        let mut expect = Vec::new();
        for (idx, (o, r)) in paths.into_iter().zip(results).enumerate() {
            let initial = match r {
                Ok(c) => match identity.mismatch(&c.identity) {
                    None => Some(c),
                    Some(what) => {
                        let e = format!("the path leads to another device: {what}");
                        tracing::warn!(path = %format!("{}:{}", o.addr, o.port), "{e}");
                        let mut g = shared.lock();
                        g.paths[idx].state = PathState::Refused;
                        g.paths[idx].last_error = Some(e);
                        drop(g);
                        let _ = c.ctrl.shutdown();
                        continue;
                    }
                },
                Err(e) => {
                    tracing::warn!(path = %format!("{}:{}", o.addr, o.port), error = %e,
                        "path did not connect; retrying in the background");
                    let mut g = shared.lock();
                    g.paths[idx].last_error = Some(e.to_string());
                    if is_permanent(&e) {
                        g.paths[idx].state = PathState::Refused;
                        continue;
                    }
                    None
                }
            };
            if initial.is_some() {
                expect.push(idx);
            }
            let t = PathThread {
                idx,
                shared: shared.clone(),
                link: Link {
                    opts: o,
                    nsid,
                    identity: identity.clone(),
                    idx,
                },
                mp: opts.clone(),
            };
            let name = format!("nvmf-path-{idx}");
            let h = std::thread::Builder::new()
                .name(name)
                .spawn(move || t.run(initial))?;
            threads.push(h);
        }
        // Return with the ANA states known (each path's thread reads its log first thing).
        let deadline = Instant::now() + first.timeout.min(DEFAULT_ANATT);
        let mut g = shared.lock();
        while expect.iter().any(|&i| {
            let p = &g.paths[i];
            p.epoch == 0 || (p.state == PathState::Connected && p.ana_state.is_none())
        }) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = shared
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let n = g.paths.len();
        drop(g);
        let paths = AnaPaths {
            shared: shared.clone(),
            local: (0..n).map(|_| None).collect(),
            threads,
            opts,
            next: 0,
        };
        Ok((identity.info, shared, paths))
    }

    pub(crate) fn options(&self) -> &MultipathOptions {
        &self.opts
    }

    /// Stop the path threads; they shut their controllers down.
    pub(crate) fn close(&mut self) -> Result<(), Error> {
        self.local.clear();
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
        let mut first = Ok(());
        for t in self.threads.drain(..) {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(Error::Controller("path thread panicked".into())));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// The wait for a usable path.
    fn no_path_wait(&self, g: &SharedState) -> Duration {
        self.opts.no_path_timeout.unwrap_or_else(|| {
            g.paths
                .iter()
                .filter_map(|p| p.anatt)
                .max()
                .unwrap_or(DEFAULT_ANATT)
        })
    }

    /// Take new connections, drop dead ones, and pick the path for the next call (counting
    /// the call on it).
    fn select(&mut self, g: &mut SharedState) -> Option<usize> {
        for (i, p) in g.paths.iter_mut().enumerate() {
            if let Some(ns) = p.pending.take() {
                self.local[i] = Some((p.epoch, ns));
            }
            let current = p.state == PathState::Connected
                && self.local[i].as_ref().is_some_and(|(e, _)| *e == p.epoch);
            if !current {
                self.local[i] = None;
            }
        }
        let n = g.paths.len();
        let start = match self.opts.policy {
            PathPolicy::First => 0,
            PathPolicy::RoundRobin => self.next % n,
        };
        let pick = [AnaState::Optimized, AnaState::NonOptimized]
            .into_iter()
            .find_map(|want| {
                (0..n)
                    .map(|k| (start + k) % n)
                    .find(|&i| self.local[i].is_some() && g.paths[i].usable() == Some(want))
            })?;
        self.next = pick + 1;
        g.paths[pick].commands += 1;
        Some(pick)
    }

    /// Run `op` on a usable path, again on another after an ANA status or a transport
    /// failure, waiting for a usable path when there is none. Without `resend`, a call that
    /// failed on a path whose queue was usable when it started (it may have reached the
    /// controller) is not sent again: the path is failed over and the error returned.
    pub(crate) fn run<T>(
        &mut self,
        what: &'static str,
        resend: bool,
        mut op: impl FnMut(&mut NsQueue) -> Result<T, Error>,
    ) -> Result<T, Error> {
        // Since the first failure or wait of this call.
        let mut since: Option<Instant> = None;
        loop {
            let (i, epoch) = self.usable(what, &mut since)?;
            let ns = self.queue(i).expect("selected a connected path");
            // A queue failed before the call sends nothing (the call reports the failure).
            let sent = !ns.queue_ref().is_failed();
            let err = match op(ns) {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let failure = classify(&err);
            if failure == Failure::Other {
                return Err(err);
            }
            self.failed(i, epoch, failure, &err);
            if !resend && sent && failure == Failure::Path {
                return Err(err);
            }
            let start = *since.get_or_insert_with(Instant::now);
            let elapsed = start.elapsed();
            let mut g = self.shared.lock();
            if elapsed >= self.no_path_wait(&g) {
                return Err(self.give_up(&mut g, what, elapsed, Some(err)));
            }
        }
    }

    /// A usable path (its index and connection epoch), waiting for one while there is none,
    /// up to the no-path wait counted from `since` (set here when the wait starts).
    pub(crate) fn usable(
        &mut self,
        what: &'static str,
        since: &mut Option<Instant>,
    ) -> Result<(usize, u64), Error> {
        let shared = self.shared.clone();
        let mut waited = false;
        let mut asked: Option<Instant> = None;
        loop {
            let mut g = shared.lock();
            if let Some(i) = self.select(&mut g) {
                let epoch = self.local[i].as_ref().map_or(0, |(e, _)| *e);
                return Ok((i, epoch));
            }
            let start = *since.get_or_insert_with(Instant::now);
            let limit = self.no_path_wait(&g);
            let elapsed = start.elapsed();
            if !waited {
                waited = true;
                g.stats.waits += 1;
            }
            if elapsed >= limit {
                return Err(self.give_up(&mut g, what, elapsed, None));
            }
            // Ask every connected path that is not usable to read its log again.
            if asked.is_none_or(|t| t.elapsed() >= WAIT_SLICE) {
                asked = Some(Instant::now());
                for p in g.paths.iter_mut() {
                    if p.state == PathState::Connected {
                        p.refresh = true;
                    }
                }
                shared.cv.notify_all();
            }
            let slice = (limit - elapsed).min(WAIT_SLICE);
            drop(shared.cv.wait_timeout(g, slice));
        }
    }

    /// The queue of path `i`'s current connection.
    pub(crate) fn queue(&mut self, i: usize) -> Option<&mut NsQueue> {
        self.local.get_mut(i)?.as_mut().map(|(_, q)| q)
    }

    /// Whether a path in a better ANA state than path `i`'s is usable (optimized, while `i`
    /// is not).
    pub(crate) fn better_than(&self, i: usize) -> bool {
        let g = self.shared.lock();
        g.paths.get(i).and_then(PathStatus::usable) != Some(AnaState::Optimized)
            && g.paths
                .iter()
                .enumerate()
                .any(|(j, p)| j != i && p.usable() == Some(AnaState::Optimized))
    }

    pub(crate) fn queue_ref(&self, i: usize) -> Option<&NsQueue> {
        self.local.get(i)?.as_ref().map(|(_, q)| q)
    }

    /// Path `i` (connection `epoch`) failed a command with `err`: an ANA status gives it the
    /// state the status implies and asks for its log; a path failure hands the connection back
    /// to its thread to reconnect.
    pub(crate) fn failed(&mut self, i: usize, epoch: u64, failure: Failure, err: &Error) {
        let mut g = self.shared.lock();
        if let Failure::Ana(state) = failure {
            tracing::debug!(path = i, error = %err, "ANA status; trying another path");
            let p = &mut g.paths[i];
            if p.epoch == epoch {
                p.ana_state = Some(state);
                p.refresh = true;
            }
            p.failovers += 1;
            p.last_error = Some(err.to_string());
            g.stats.ana_retries += 1;
        } else {
            tracing::warn!(path = i, error = %err, "path failed; trying another path");
            self.local[i] = None;
            let p = &mut g.paths[i];
            if p.epoch == epoch {
                p.state = PathState::Failed;
                p.io_failed = Some(epoch);
                p.cntlid = None;
                p.pending = None;
            }
            p.failovers += 1;
            p.last_error = Some(err.to_string());
            g.stats.path_failovers += 1;
        }
        drop(g);
        self.shared.cv.notify_all();
    }

    fn give_up(
        &self,
        g: &mut SharedState,
        what: &'static str,
        waited: Duration,
        last: Option<Error>,
    ) -> Error {
        g.stats.gave_up += 1;
        let mut paths: Vec<String> = g.paths.iter().map(PathStatus::describe).collect();
        if let Some(e) = last {
            paths.push(format!("last failure: {e}"));
        }
        let e = Error::NoUsablePath {
            what,
            waited,
            paths: paths.join("; "),
        };
        tracing::warn!(error = %e, "giving up");
        e
    }
}

impl Drop for AnaPaths {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// The paths the discovery log at `discovery` lists for `subnqn`.
pub(crate) fn discovered_paths(
    discovery: &ConnectOptions,
    subnqn: &str,
) -> Result<Vec<ConnectOptions>, Error> {
    let entries = discover_with(discovery)?;
    let mut paths: Vec<ConnectOptions> = Vec::new();
    for e in entries {
        if e.subtype != nvlog::subtype::NVME || e.subnqn != subnqn {
            continue;
        }
        let transport = match e.trtype {
            nvlog::trtype::TCP => Transport::Tcp,
            nvlog::trtype::RDMA => Transport::Rdma,
            t => {
                tracing::debug!(
                    trtype = t,
                    "skipping a discovery entry of another transport"
                );
                continue;
            }
        };
        let Ok(port) = e.trsvcid.parse::<u16>() else {
            tracing::warn!(trsvcid = %e.trsvcid, "skipping a discovery entry with a bad port");
            continue;
        };
        let wildcard = e.traddr.is_empty()
            || e.traddr
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_unspecified());
        let addr = if wildcard {
            discovery.addr.clone()
        } else {
            e.traddr.clone()
        };
        if paths
            .iter()
            .any(|p| p.transport == transport && p.addr == addr && p.port == port)
        {
            continue;
        }
        paths.push(ConnectOptions {
            transport,
            addr,
            port,
            subnqn: subnqn.to_string(),
            ..discovery.clone()
        });
    }
    if paths.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "the discovery log at {}:{} lists no path to {subnqn}",
            discovery.addr, discovery.port
        )));
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme::log::{ana_log, AnaGroup};

    fn group(grpid: u32, state: u8, nsids: &[u32]) -> AnaGroup {
        AnaGroup {
            grpid,
            change_count: 1,
            state,
            nsids: nsids.to_vec(),
        }
    }

    #[test]
    fn ana_state_from_the_log() {
        let log = ana_log(
            3,
            &[
                group(1, ana_state::OPTIMIZED, &[1, 3]),
                group(2, ana_state::INACCESSIBLE, &[2]),
                group(4, ana_state::CHANGE, &[]),
            ],
            false,
        );
        assert_eq!(ana_state_in(&log, 3, 1), Some(AnaState::Optimized));
        // The NSID list wins over ANAGRPID.
        assert_eq!(ana_state_in(&log, 2, 1), Some(AnaState::Inaccessible));
        assert_eq!(ana_state_in(&log, 7, 4), Some(AnaState::Change));
        assert_eq!(ana_state_in(&log, 7, 9), None);
        // Return Groups Only: by group.
        let rgo = ana_log(3, &[group(2, ana_state::NON_OPTIMIZED, &[2])], true);
        assert_eq!(ana_state_in(&rgo, 2, 2), Some(AnaState::NonOptimized));
        // Truncated or padded logs do not panic.
        assert_eq!(ana_state_in(&log[..40], 3, 1), None);
        let mut padded = log.clone();
        padded.resize(4096, 0);
        assert_eq!(ana_state_in(&padded, 3, 1), Some(AnaState::Optimized));
        assert_eq!(ana_state_in(&[], 1, 1), None);
    }

    #[test]
    fn ana_statuses_map_to_states() {
        assert_eq!(
            AnaState::from_status(Status::ANA_INACCESSIBLE),
            Some(AnaState::Inaccessible)
        );
        assert_eq!(
            AnaState::from_status(Status::ANA_PERSISTENT_LOSS.dnr()),
            Some(AnaState::PersistentLoss)
        );
        assert_eq!(
            AnaState::from_status(Status::ANA_TRANSITION),
            Some(AnaState::Change)
        );
        assert_eq!(AnaState::from_status(Status::LBA_RANGE), None);
        assert!(AnaState::NonOptimized.is_usable());
        assert!(!AnaState::Change.is_usable());
        assert_eq!(AnaState::from_raw(0x0f), AnaState::Change);
        assert_eq!(AnaState::from_raw(0x07), AnaState::Reserved(7));
        assert_eq!(AnaState::NonOptimized.to_string(), "non-optimized");
    }

    #[test]
    fn failures_are_classified() {
        let st = |status| Error::Status {
            what: "Write",
            status,
        };
        assert_eq!(
            classify(&st(Status::ANA_TRANSITION)),
            Failure::Ana(AnaState::Change)
        );
        assert_eq!(classify(&st(Status::ABORT_QUEUE)), Failure::Path);
        assert_eq!(classify(&st(Status::HOST_PATH_ERROR.dnr())), Failure::Path);
        assert_eq!(classify(&st(Status::INTERNAL_PATH_ERROR)), Failure::Path);
        assert_eq!(classify(&Error::Closed), Failure::Path);
        assert_eq!(classify(&st(Status::LBA_RANGE)), Failure::Other);
        assert_eq!(classify(&st(Status::COMPARE_FAILED)), Failure::Other);
        assert_eq!(
            classify(&Error::InvalidArgument("unaligned".into())),
            Failure::Other
        );
    }
}
