//! A path: one connection to a namespace, brought up again as one [`ReconnectPolicy`] says,
//! and checked to lead to the same namespace every time. The namespace's path set
//! ([`crate::Namespace`]) and the asynchronous [`crate::ReconnectingQueue`] use it; the
//! status of every path of a namespace is kept in one [`Shared`] ([`PathMonitor`] reads it).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nvme::identify::{self, cns, IdentifyController, IdentifyNamespace};

use crate::cmd::{NsInfo, Transport};
use crate::controller::{ConnectOptions, Controller, ControllerInfo, NsQueue};
use crate::error::{CmdError, Error};
use crate::multipath::AnaState;

/// Largest ANA log read (a controller claiming more is cut off here).
const MAX_ANA_LOG: usize = 4 << 20;

/// How a path reconnects after its connection failed: exponential backoff between attempts,
/// bounded by a number of attempts and a total time per failure.
///
/// One policy serves every form of [`crate::Namespace`]: a one-path namespace reconnects
/// within the call that saw the failure and gives up with [`Error::ReconnectGaveUp`]; each
/// path of a multipath namespace reconnects in the background
/// ([`crate::MultipathOptions::reconnect`], unbounded by default) and stops trying
/// ([`PathState::Refused`]) once its policy gives up.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconnectPolicy {
    /// Most connection attempts for one failure (0: never reconnect, fail at once).
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
    /// Never reconnect: the first failure of the connection is the call's error.
    pub fn never() -> ReconnectPolicy {
        ReconnectPolicy {
            max_attempts: 0,
            ..ReconnectPolicy::default()
        }
    }

    /// Reconnect for as long as the namespace is open (the paths of a multipath namespace):
    /// 100 ms, doubling up to 5 s.
    pub fn forever() -> ReconnectPolicy {
        ReconnectPolicy {
            max_attempts: u32::MAX,
            max_total: None,
            ..ReconnectPolicy::default()
        }
    }

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

/// Counters of a namespace's paths (every form counts the same way; a one-path namespace
/// has no ANA counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Connections re-established after a failure.
    pub reconnects: u64,
    /// Connection attempts that failed.
    pub failed_attempts: u64,
    /// Calls (synchronous API) or commands ([`crate::ReconnectingQueue`]) run again after
    /// their connection failed.
    pub retries: u64,
    /// Calls that gave up ([`Error::ReconnectGaveUp`], [`Error::NoUsablePath`]).
    pub gave_up: u64,
    /// Time from the last failure seen to the connection being back.
    pub last_outage: Option<Duration>,
    /// Calls moved to another path after theirs failed.
    pub path_failovers: u64,
    /// Calls run again after an ANA status (Inaccessible, Persistent Loss, Transition).
    pub ana_retries: u64,
    /// ANA change events received.
    pub ana_events: u64,
    /// Changes of a path's ANA state seen.
    pub ana_changes: u64,
    /// Calls that had to wait for a usable path.
    pub waits: u64,
}

/// Whether a path's connection is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathState {
    /// Connected (I/O goes there when its ANA state allows).
    Connected,
    /// The connection failed; it is being brought up again (or waits for the next call).
    Failed,
    /// Given up: the path leads elsewhere, refused the host, or its policy ran out.
    Refused,
}

/// A snapshot of one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    pub transport: Transport,
    pub addr: String,
    pub port: u16,
    pub state: PathState,
    /// The namespace's ANA state through this path (`None`: not read yet).
    pub ana_state: Option<AnaState>,
    /// The namespace's ANA group (0: the controller has no ANA).
    pub ana_group: u32,
    /// The controller's ID while connected.
    pub cntlid: Option<u16>,
    /// Calls sent on this path.
    pub commands: u64,
    /// Calls that left this path for another.
    pub failovers: u64,
    pub reconnects: u64,
    pub last_error: Option<String>,
}

/// What the namespace knows of one path (behind [`Shared`]).
pub(crate) struct PathStatus {
    pub(crate) transport: Transport,
    pub(crate) addr: String,
    pub(crate) port: u16,
    pub(crate) state: PathState,
    /// Connection number (a new connection, a new epoch).
    pub(crate) epoch: u64,
    /// A new connection's queue, for the I/O side to take.
    pub(crate) pending: Option<NsQueue>,
    pub(crate) ana_state: Option<AnaState>,
    pub(crate) ana_group: u32,
    pub(crate) anatt: Option<Duration>,
    pub(crate) cntlid: Option<u16>,
    pub(crate) last_error: Option<String>,
    pub(crate) commands: u64,
    pub(crate) failovers: u64,
    pub(crate) reconnects: u64,
    /// The I/O side saw connection `epoch` fail.
    pub(crate) io_failed: Option<u64>,
    /// The I/O side asks for the ANA log to be read again.
    pub(crate) refresh: bool,
}

impl PathStatus {
    pub(crate) fn new(opts: &ConnectOptions) -> PathStatus {
        PathStatus::of(opts.transport, &opts.addr, opts.port)
    }

    /// A path not connected yet to `addr:port` over `transport`.
    fn of(transport: Transport, addr: &str, port: u16) -> PathStatus {
        PathStatus {
            transport,
            addr: addr.to_string(),
            port,
            state: PathState::Failed,
            epoch: 0,
            pending: None,
            ana_state: None,
            ana_group: 0,
            anatt: None,
            cntlid: None,
            last_error: None,
            commands: 0,
            failovers: 0,
            reconnects: 0,
            io_failed: None,
            refresh: false,
        }
    }

    /// The path of a namespace opened on a controller the caller keeps.
    pub(crate) fn direct(transport: Transport, addr: &str, port: u16, cntlid: u16) -> PathStatus {
        let mut p = PathStatus::of(transport, addr, port);
        p.connected(cntlid);
        p
    }

    /// The path's connection number `epoch + 1` is up, as controller `cntlid`.
    pub(crate) fn connected(&mut self, cntlid: u16) {
        self.state = PathState::Connected;
        self.epoch += 1;
        self.cntlid = Some(cntlid);
    }

    pub(crate) fn info(&self) -> PathInfo {
        PathInfo {
            transport: self.transport,
            addr: self.addr.clone(),
            port: self.port,
            state: self.state,
            ana_state: self.ana_state,
            ana_group: self.ana_group,
            cntlid: self.cntlid,
            commands: self.commands,
            failovers: self.failovers,
            reconnects: self.reconnects,
            last_error: self.last_error.clone(),
        }
    }

    /// The ANA state if I/O may go to this path now.
    pub(crate) fn usable(&self) -> Option<AnaState> {
        (self.state == PathState::Connected)
            .then_some(self.ana_state)
            .flatten()
            .filter(|s| s.is_usable())
    }

    /// One line for an error message.
    pub(crate) fn describe(&self) -> String {
        let tr = match self.transport {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        };
        let ana = self
            .ana_state
            .map_or_else(|| "ANA state unknown".to_string(), |s| s.to_string());
        let mut s = format!("{tr} {}:{} ", self.addr, self.port);
        match self.state {
            PathState::Connected => {
                s.push_str(&format!("connected, {ana} (group {})", self.ana_group))
            }
            PathState::Failed => s.push_str(&format!("failed (last {ana})")),
            PathState::Refused => s.push_str("refused"),
        }
        if let Some(e) = &self.last_error {
            s.push_str(&format!(", last error: {e}"));
        }
        s
    }
}

pub(crate) struct SharedState {
    pub(crate) stop: bool,
    pub(crate) paths: Vec<PathStatus>,
    pub(crate) stats: PathStats,
    pub(crate) policy: ReconnectPolicy,
}

/// The paths' status, shared by the namespace, its path threads and its monitors.
pub(crate) struct Shared {
    state: Mutex<SharedState>,
    pub(crate) cv: Condvar,
}

impl Shared {
    pub(crate) fn new(paths: Vec<PathStatus>, policy: ReconnectPolicy) -> Arc<Shared> {
        Arc::new(Shared {
            state: Mutex::new(SharedState {
                stop: false,
                paths,
                stats: PathStats::default(),
                policy,
            }),
            cv: Condvar::new(),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, SharedState> {
        // A panic while holding the lock leaves plain counters behind: keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleep `d` unless the namespace closes first (then `false`).
    pub(crate) fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        let mut g = self.lock();
        loop {
            if g.stop {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            g = self
                .cv
                .wait_timeout(g, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// A view of a namespace's paths that another thread can keep (the namespace's own calls
/// take `&mut`).
#[derive(Clone)]
pub struct PathMonitor {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for PathMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PathMonitor")
            .field("paths", &self.paths())
            .finish()
    }
}

impl PathMonitor {
    /// Every path, in the order given.
    pub fn paths(&self) -> Vec<PathInfo> {
        self.shared
            .lock()
            .paths
            .iter()
            .map(PathStatus::info)
            .collect()
    }

    /// The namespace's counters.
    pub fn stats(&self) -> PathStats {
        self.shared.lock().stats
    }
}

/// What must stay the same on every connection of a namespace's paths.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) subnqn: String,
    /// Checked when the namespace has one path (the controllers of several gateways may
    /// differ in it).
    pub(crate) serial: Option<String>,
    pub(crate) info: NsInfo,
    pub(crate) nguid: [u8; 16],
}

impl Identity {
    /// How `found` differs from this identity, if it does.
    pub(crate) fn mismatch(&self, found: &Identity) -> Option<String> {
        if found.subnqn != self.subnqn {
            Some(format!(
                "subsystem NQN {:?}, was {:?}",
                found.subnqn, self.subnqn
            ))
        } else if self.serial.is_some() && found.serial != self.serial {
            Some(format!(
                "serial number {:?}, was {:?}",
                found.serial.as_deref().unwrap_or(""),
                self.serial.as_deref().unwrap_or("")
            ))
        } else if found.info != self.info {
            Some(format!("namespace {:?}, was {:?}", found.info, self.info))
        } else if self.nguid != [0; 16] && found.nguid != self.nguid {
            Some("a namespace with another NGUID".to_string())
        } else {
            None
        }
    }
}

/// One connection of a path: its controller, the namespace's queue on it and what
/// Identify said about ANA.
pub(crate) struct Connected {
    pub(crate) ctrl: Controller,
    pub(crate) ns: NsQueue,
    /// The controller reports ANA (CMIC bit 3).
    pub(crate) ana: bool,
    /// ... and the ANA change event (OAES bit 11).
    pub(crate) aen: bool,
    pub(crate) grpid: u32,
    pub(crate) anatt: Option<Duration>,
    /// Bytes of a whole ANA log.
    pub(crate) log_len: usize,
    pub(crate) identity: Identity,
}

impl Connected {
    pub(crate) fn info(&self) -> &ControllerInfo {
        self.ctrl.info()
    }

    /// Drop a broken connection without a shutdown handshake (the target frees its side
    /// when its keep-alive timer fires, or has already, with the connection).
    pub(crate) fn abandon(self) {
        drop(self.ns);
        self.ctrl.abandon();
    }

    pub(crate) fn shutdown(self) -> Result<(), Error> {
        drop(self.ns);
        self.ctrl.shutdown()
    }
}

/// Connect with `opts` (one I/O queue) and open namespace `nsid`.
pub(crate) fn connect_path(opts: &ConnectOptions, nsid: u32) -> Result<Connected, Error> {
    let mut ctrl = Controller::connect(opts.clone())?;
    let idc = IdentifyController::decode(&ctrl.identify(cns::CTRL, 0)?[..]).expect("4096 bytes");
    let idn = IdentifyNamespace::decode(&ctrl.identify(cns::NS, nsid)?[..]).expect("4096 bytes");
    let ns = ctrl.open_queue(nsid)?;
    let ana = idc.cmic & identify::ctrl::CMIC_ANA != 0;
    let aen = ana && idc.oaes.get() & identify::ctrl::OAES_ANA_CHANGE != 0;
    let groups = idc
        .nanagrpid
        .get()
        .max(idc.anagrpmax.get())
        .clamp(1, 1 << 16) as usize;
    let nn = idc.nn.get().max(idc.mnan.get()).min(1 << 20) as usize;
    let log_len = (16 + groups * 32 + nn * 4).min(MAX_ANA_LOG);
    let identity = Identity {
        subnqn: ctrl.info().subnqn.clone(),
        serial: Some(ctrl.info().serial.clone()),
        info: *ns.info(),
        nguid: idn.nguid,
    };
    Ok(Connected {
        ctrl,
        ns,
        ana,
        aen,
        grpid: idn.anagrpid.get(),
        anatt: (idc.anatt > 0).then(|| Duration::from_secs(idc.anatt as u64)),
        log_len,
        identity,
    })
}

/// The first connection of a one-path handle (once, no retry: a first connection that fails
/// is a configuration problem) with `opts.queues` I/O queues, how to connect it again, and
/// its status under `policy`.
pub(crate) fn first_path(
    opts: ConnectOptions,
    nsid: u32,
    policy: ReconnectPolicy,
) -> Result<(Connected, Link, Arc<Shared>), Error> {
    let c = connect_path(&opts, nsid)?;
    let mut status = PathStatus::new(&opts);
    status.connected(c.info().cntlid);
    let link = Link {
        opts,
        nsid,
        identity: c.identity.clone(),
        idx: 0,
    };
    Ok((c, link, Shared::new(vec![status], policy)))
}

/// The paths of one namespace as one host: every path for the first's subsystem (else an
/// error), with the first's host NQN and host ID, and its DH-HMAC-CHAP secrets where a path
/// has none (the target sees one host with several controllers).
pub(crate) fn one_host(mut paths: Vec<ConnectOptions>) -> Result<Vec<ConnectOptions>, Error> {
    let Some(first) = paths.first().cloned() else {
        return Err(Error::InvalidArgument("no paths".into()));
    };
    for p in &mut paths {
        if p.subnqn != first.subnqn {
            return Err(Error::InvalidArgument(format!(
                "paths to different subsystems: {} and {}",
                first.subnqn, p.subnqn
            )));
        }
        p.hostnqn.clone_from(&first.hostnqn);
        p.hostid = first.hostid;
        if p.dhchap.is_none() {
            p.dhchap.clone_from(&first.dhchap);
        }
    }
    Ok(paths)
}

/// Where one failure stands in its reconnect budget.
pub(crate) struct Budget {
    since: Instant,
    attempts: u32,
    pub(crate) last: Arc<Error>,
}

impl Budget {
    pub(crate) fn start(cause: Error) -> Budget {
        Budget {
            since: Instant::now(),
            attempts: 0,
            last: Arc::new(cause),
        }
    }
}

/// How to connect a path again: its options, the namespace, the identity to find there.
pub(crate) struct Link {
    pub(crate) opts: ConnectOptions,
    pub(crate) nsid: u32,
    pub(crate) identity: Identity,
    /// The path's index in [`SharedState::paths`].
    pub(crate) idx: usize,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("addr", &self.opts.addr)
            .field("port", &self.opts.port)
            .field("identity", &self.identity)
            .finish()
    }
}

impl Link {
    pub(crate) fn label(&self) -> String {
        format!("{}:{}", self.opts.addr, self.opts.port)
    }

    /// Connect again within `b`'s budget under the namespace's policy, waiting the backoff
    /// before each attempt (`sleep` returns `false` when the namespace closes: then the
    /// result is the budget's last failure).
    pub(crate) fn reconnect(
        &self,
        shared: &Shared,
        b: &mut Budget,
        sleep: &mut dyn FnMut(Duration) -> bool,
    ) -> Result<Connected, Error> {
        reconnect_any(std::slice::from_ref(self), 0, shared, b, sleep, &|_| Ok(())).map(|(_, c)| c)
    }

    fn give_up(&self, shared: &Shared, b: &Budget) -> Error {
        shared.lock().stats.gave_up += 1;
        let e = Error::ReconnectGaveUp {
            attempts: b.attempts,
            elapsed: b.since.elapsed(),
            cause: b.last.clone(),
        };
        tracing::warn!(path = %self.label(), error = %e, "giving up");
        e
    }

    /// Refuse a connection to something else than the device of the first connection.
    pub(crate) fn same_device(&self, c: Connected) -> Result<Connected, Error> {
        let Some(what) = self.identity.mismatch(&c.identity) else {
            return Ok(c);
        };
        // Shut the stranger down cleanly: it is alive, just not ours.
        let _ = c.shutdown();
        Err(Error::Controller(format!(
            "the path leads to another device: {what}"
        )))
    }
}

/// The one reconnect loop of the crate: connect again within `b`'s budget under the
/// namespace's policy, waiting the backoff before each attempt, trying `links` in turn from
/// `start` (one attempt each), and keeping a connection only if it leads to the same device
/// and `accept` takes it. Returns the link that connected and its connection. With one link,
/// a permanent failure (a refused secret, another device) gives up at once; with several,
/// the others are tried.
pub(crate) fn reconnect_any(
    links: &[Link],
    start: usize,
    shared: &Shared,
    b: &mut Budget,
    sleep: &mut dyn FnMut(Duration) -> bool,
    accept: &dyn Fn(&Connected) -> Result<(), Error>,
) -> Result<(usize, Connected), Error> {
    let policy = shared.lock().policy.clone();
    let n = links.len().max(1);
    loop {
        let link = &links[(start + b.attempts as usize) % n];
        let elapsed = b.since.elapsed();
        let remaining = policy.max_total.map(|t| t.saturating_sub(elapsed));
        if b.attempts >= policy.max_attempts || remaining == Some(Duration::ZERO) {
            return Err(link.give_up(shared, b));
        }
        let mut delay = policy.delay(b.attempts + 1);
        if let Some(r) = remaining {
            delay = delay.min(r);
        }
        if !sleep(delay) {
            return Err(Error::Closed);
        }
        b.attempts += 1;
        let tried = connect_path(&link.opts, link.nsid)
            .and_then(|c| link.same_device(c))
            .and_then(|c| match accept(&c) {
                Ok(()) => Ok(c),
                Err(e) => {
                    let _ = c.shutdown();
                    Err(e)
                }
            });
        match tried {
            Ok(c) => {
                let outage = b.since.elapsed();
                tracing::warn!(
                    path = %link.label(),
                    attempt = b.attempts,
                    cntlid = c.info().cntlid,
                    outage_ms = outage.as_millis() as u64,
                    "reconnected"
                );
                let mut g = shared.lock();
                g.stats.reconnects += 1;
                g.stats.last_outage = Some(outage);
                g.paths[link.idx].reconnects += 1;
                return Ok((link.idx, c));
            }
            Err(e) => {
                tracing::warn!(
                    path = %link.label(),
                    attempt = b.attempts,
                    max_attempts = policy.max_attempts,
                    error = %e,
                    "reconnect attempt failed"
                );
                let permanent = is_permanent(&e) && links.len() == 1;
                let mut g = shared.lock();
                g.stats.failed_attempts += 1;
                g.paths[link.idx].last_error = Some(e.to_string());
                drop(g);
                b.last = Arc::new(e);
                // A refused secret, or another device, does not get better by asking again.
                if permanent {
                    return Err(link.give_up(shared, b));
                }
            }
        }
    }
}

/// Whether a reconnect that failed with `e` would fail the same way again: the controller's
/// answer about the host, a refused secret, another device.
pub(crate) fn is_permanent(e: &Error) -> bool {
    matches!(e, Error::Controller(_) | Error::Auth { .. })
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

    fn identity(nguid: u8, serial: Option<&str>) -> Identity {
        Identity {
            subnqn: "nqn.a".into(),
            serial: serial.map(str::to_string),
            info: NsInfo {
                nsid: 1,
                blocks: 100,
                block_size: 512,
                metadata_size: 0,
            },
            nguid: [nguid; 16],
        }
    }

    #[test]
    fn a_path_to_another_device_is_told_apart() {
        let one = identity(1, Some("s1"));
        assert_eq!(one.mismatch(&identity(1, Some("s1"))), None);
        assert!(one.mismatch(&identity(2, Some("s1"))).is_some(), "NGUID");
        assert!(one.mismatch(&identity(1, Some("s2"))).is_some(), "serial");
        let mut bigger = identity(1, Some("s1"));
        bigger.info.blocks = 200;
        assert!(one.mismatch(&bigger).unwrap().contains("namespace"));
        // Several paths: the serial is not compared, a zero NGUID matches any.
        let several = identity(0, None);
        assert_eq!(several.mismatch(&identity(3, Some("s9"))), None);
    }
}
