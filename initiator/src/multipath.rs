//! One namespace over several paths: [`MultipathNamespace`], with Asymmetric Namespace Access
//! (ANA) path selection and failover (the behaviour is documented on the type).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvme::identify::{self, cns, IdentifyController, IdentifyNamespace};
use nvme::log::{self as nvlog, ana_state, AsyncEvent};
use nvme::Status;

use crate::cmd::{NsInfo, Transport};
use crate::controller::{ConnectOptions, Controller, Namespace};
use crate::discovery::discover_with;
use crate::error::Error;
use crate::reconnect::is_transport_failure;

/// The wait without ANATT from any path.
const DEFAULT_ANATT: Duration = Duration::from_secs(10);
/// How long a path thread waits for an event before it looks at its requests again.
const EVENT_SLICE: Duration = Duration::from_millis(50);
/// How long a call waiting for a usable path sleeps before it asks for the logs again.
const WAIT_SLICE: Duration = Duration::from_millis(200);
/// Largest ANA log read (a controller claiming more is cut off here).
const MAX_ANA_LOG: usize = 4 << 20;

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

/// How a [`MultipathNamespace`] selects paths, watches them and brings them back.
#[derive(Debug, Clone, PartialEq)]
pub struct MultipathOptions {
    /// Among usable paths of the best state.
    pub policy: PathPolicy,
    /// Read every connected path's ANA log this often besides the events (`None`: only on
    /// events and ANA statuses).
    pub ana_poll: Option<Duration>,
    /// Wait before the first reconnect attempt of a failed path.
    pub reconnect_delay: Duration,
    /// Longest wait between two reconnect attempts (the wait doubles up to it).
    pub reconnect_max_delay: Duration,
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
            reconnect_delay: Duration::from_millis(100),
            reconnect_max_delay: Duration::from_secs(5),
            no_path_timeout: None,
        }
    }
}

impl MultipathOptions {
    /// The wait before reconnect attempt `attempt` (1 is the first).
    fn reconnect_wait(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(20);
        let d = self.reconnect_delay.saturating_mul(1 << exp);
        d.min(self.reconnect_max_delay.max(self.reconnect_delay))
    }
}

/// Whether a path is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathState {
    /// Connected: usable if its ANA state is.
    Connected,
    /// Not connected (the connection failed, or the first connection did not come up): its
    /// thread tries again with backoff.
    Failed,
    /// Given up for good: it leads to another namespace than the other paths, or refused the
    /// host's authentication. [`PathInfo::last_error`] says which.
    Refused,
}

/// One path of a [`MultipathNamespace`] as [`MultipathNamespace::paths`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    pub transport: Transport,
    /// Address and port of the listener.
    pub addr: String,
    pub port: u16,
    pub state: PathState,
    /// The namespace's ANA state on this path; the last one known while the path is not
    /// connected, `None` before its first connection.
    pub ana_state: Option<AnaState>,
    /// The namespace's ANA group (ANAGRPID), 0 before the first connection.
    pub ana_group: u32,
    /// Controller ID of the current connection.
    pub cntlid: Option<u16>,
    /// Calls of the block API sent on this path (one call split into several commands, or
    /// failed and run again elsewhere, counts once here).
    pub commands: u64,
    /// Calls that failed on this path (transport failure or ANA status) and ran again.
    pub failovers: u64,
    /// Times the path was connected again after a failure.
    pub reconnects: u64,
    /// The last failure on the path (connection, reconnect attempt, ANA status).
    pub last_error: Option<String>,
}

/// Counters of a [`MultipathNamespace`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MultipathStats {
    /// Calls run again on another path after their path's transport failed.
    pub path_failovers: u64,
    /// Calls run again after an ANA status (301h-303h).
    pub ana_retries: u64,
    /// Asymmetric Namespace Access Change events received.
    pub ana_events: u64,
    /// Path state changes found in ANA logs.
    pub ana_changes: u64,
    /// Failed paths connected again.
    pub reconnects: u64,
    /// Calls that had to wait for a usable path.
    pub waits: u64,
    /// Calls that failed with [`Error::NoUsablePath`].
    pub gave_up: u64,
}

/// What every path must lead to: the first connection's subsystem and namespace.
#[derive(Debug, Clone)]
struct Identity {
    subnqn: String,
    info: NsInfo,
    nguid: [u8; 16],
}

/// A path as its thread and the I/O side share it.
struct PathStatus {
    transport: Transport,
    addr: String,
    port: u16,
    state: PathState,
    /// Bumped with every connection.
    epoch: u64,
    /// A new connection's I/O handle, for the I/O side to take.
    pending: Option<Namespace>,
    ana_state: Option<AnaState>,
    ana_group: u32,
    anatt: Option<Duration>,
    cntlid: Option<u16>,
    last_error: Option<String>,
    commands: u64,
    failovers: u64,
    reconnects: u64,
    /// The I/O side saw connection `epoch` fail: its thread drops it and reconnects.
    io_failed: Option<u64>,
    /// Read the ANA log again.
    refresh: bool,
}

impl PathStatus {
    fn info(&self) -> PathInfo {
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

    fn usable(&self) -> Option<AnaState> {
        (self.state == PathState::Connected)
            .then_some(self.ana_state)
            .flatten()
            .filter(|s| s.is_usable())
    }

    fn describe(&self) -> String {
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

struct SharedState {
    stop: bool,
    paths: Vec<PathStatus>,
    stats: MultipathStats,
}

struct Shared {
    state: Mutex<SharedState>,
    /// Signalled on every path change (new connection, state, failure) and on stop.
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, SharedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A handle on the path states of a [`MultipathNamespace`] for another thread (the namespace
/// itself may be busy doing I/O in its own).
#[derive(Clone)]
pub struct PathMonitor {
    shared: Arc<Shared>,
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
    pub fn stats(&self) -> MultipathStats {
        self.shared.lock().stats
    }
}

/// A namespace opened over several paths, with the synchronous block API of [`Namespace`],
/// ANA-aware path selection and failover.
///
/// A path is one controller of the subsystem, reached through one listener (address, port,
/// transport), as [`ConnectOptions`] describes it. [`MultipathNamespace::open`] connects every
/// path given (one I/O queue each, all with the first path's host identity, so the target sees
/// one host with several controllers); [`MultipathNamespace::discover`] reads the discovery log
/// and opens every path it lists for the subsystem, over whichever transports it lists.
///
/// # Path selection
/// Each call of the block API (`read_at`, `write_at`, ...) runs on one path: an
/// [optimized](AnaState::Optimized) one if there is any ([`PathPolicy::First`]: the first in
/// the order given; [`PathPolicy::RoundRobin`]: in turn), else a
/// [non-optimized](AnaState::NonOptimized) one. A path in the inaccessible, persistent loss or
/// change state, or whose connection is down, is never used.
///
/// A path's state is its controller's ANA log (Get Log Page 0Ch, with the NSID lists): the
/// state of the group that lists the namespace, else of the group Identify Namespace names
/// (ANAGRPID). A controller that does not report ANA (CMIC bit 3 clear) counts as optimized.
/// The log is read again
/// - when an I/O on the path completes with an ANA status (Asymmetric Access Persistent Loss,
///   Inaccessible or Transition: 301h-303h): the path takes the state the status implies at
///   once, the call runs again on another usable path, and the log is read in the background;
/// - when the controller raises the Asymmetric Namespace Access Change event (an Asynchronous
///   Event Request is kept posted on every path that reports ANA change notices);
/// - every [`MultipathOptions::ana_poll`] (1 s by default), in case an event was missed.
///
/// Every path has a thread of its own that owns its controller: it waits for the events,
/// reads the log, and brings a failed connection back. The thread calling the block API only
/// does I/O on the chosen path's queue and takes one uncontended lock per call to pick it.
///
/// # Failover
/// When a call fails because of its path (the transport: connection closed or reset,
/// timeout, protocol error, what a [`crate::ReconnectingNamespace`] retries; another path
/// related status, SCT 3h; or Command Aborted due to SQ Deletion, which a target answers when
/// it tears the controller down), the path is marked failed and the call runs again on another
/// usable path: the caller's call does not fail. The path's thread drops the controller and
/// connects again with exponential backoff ([`MultipathOptions::reconnect_delay`] doubling up
/// to [`MultipathOptions::reconnect_max_delay`]) for as long as the namespace is open, checks
/// that the new connection leads to the same namespace (subsystem NQN, geometry, NGUID), and
/// puts the path back into use.
///
/// Running a call again is safe for the reasons given for [`crate::ReconnectingNamespace`]:
/// Read, Write, Flush, Write Zeroes and deallocate are idempotent at the block level, and the
/// synchronous API has one call in flight per handle. What multipathing adds: a write the
/// failed path had already handed to the target may still land after its retry on the other
/// path. It carries the same data, and the next call starts only after the retry completed,
/// so this matters only when another host writes the same blocks in that moment. A Flush runs
/// on one path, as the Linux host sends it: NVMe defines it for the writes that controller
/// completed, which on targets whose controllers share the namespace's cache (nvmf-target and
/// Linux nvmet flush the backing store) is every write.
///
/// An answer from the controller other than an ANA status (LBA Out of Range, a write-protected
/// namespace, ...) and a local error (an unaligned range) return at once.
///
/// # No usable path
/// When no path is usable the call waits for one: for up to the longest ANA Transition Time
/// (ANATT, Identify Controller) of the paths, 10 s if none reports one, or
/// [`MultipathOptions::no_path_timeout`]; meanwhile every connected path's log is read again
/// and reconnects go on. Past that, or when ANA statuses and path failures keep a call from
/// completing for that long, the call fails with [`Error::NoUsablePath`], which names every
/// path and its state.
///
/// # Reporting
/// [`MultipathNamespace::paths`] (and [`PathMonitor::paths`], from another thread) gives per
/// path the transport, address and port, ANA group and state, whether it is connected, its
/// last error, and the calls sent on it; [`MultipathNamespace::stats`] counts failovers,
/// ANA retries, events and reconnects.
///
/// # Closing
/// [`MultipathNamespace::shutdown`] (or dropping the handle) closes the I/O queues, stops the
/// path threads and shuts every connected controller down (CC.SHN). It waits for the threads:
/// one in the middle of a connection attempt finishes it first (bounded by
/// [`ConnectOptions::timeout`]).
///
/// ```no_run
/// use nvmf_initiator::{ConnectOptions, MultipathNamespace};
///
/// let nqn = "nqn.2026-11.io.nvmf-rs:default";
/// let paths = vec![
///     ConnectOptions::tcp("10.0.0.1", 4420, nqn),
///     ConnectOptions::tcp("10.0.0.2", 4420, nqn),
/// ];
/// let mut ns = MultipathNamespace::open(paths, 1)?;
/// let mut buf = vec![0u8; ns.block_size() as usize];
/// ns.read_at(&mut buf, 0)?;
/// for p in ns.paths() {
///     println!("{}:{} {:?} {:?} {} calls", p.addr, p.port, p.state, p.ana_state, p.commands);
/// }
/// # Ok::<(), nvmf_initiator::Error>(())
/// ```
pub struct MultipathNamespace {
    shared: Arc<Shared>,
    /// The I/O handle of each path and the connection (epoch) it belongs to.
    local: Vec<Option<(u64, Namespace)>>,
    threads: Vec<JoinHandle<Result<(), Error>>>,
    info: NsInfo,
    opts: MultipathOptions,
    /// Next path to try first ([`PathPolicy::RoundRobin`]).
    next: usize,
}

impl std::fmt::Debug for MultipathNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultipathNamespace")
            .field("info", &self.info)
            .field("paths", &self.paths())
            .finish()
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

/// What one connection attempt brings.
struct Connected {
    ctrl: Controller,
    ns: Namespace,
    ana: bool,
    aen: bool,
    grpid: u32,
    anatt: Option<Duration>,
    log_len: usize,
    identity: Identity,
}

/// Connect one path: the controller, Identify Controller and Namespace, the namespace's I/O
/// handle.
fn connect_path(opts: &ConnectOptions, nsid: u32) -> Result<Connected, Error> {
    let mut ctrl = Controller::connect(opts.clone())?;
    let idc = IdentifyController::decode(&ctrl.identify(cns::CTRL, 0)?[..]).expect("4096 bytes");
    let idn = IdentifyNamespace::decode(&ctrl.identify(cns::NS, nsid)?[..]).expect("4096 bytes");
    let ns = ctrl.open_namespace(nsid)?;
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

/// Why `found` is not the namespace `want` describes, if it is not.
fn identity_mismatch(want: &Identity, found: &Identity) -> Option<String> {
    if found.subnqn != want.subnqn {
        Some(format!(
            "subsystem NQN {:?}, the other paths {:?}",
            found.subnqn, want.subnqn
        ))
    } else if found.info != want.info {
        Some(format!(
            "namespace {:?}, the other paths {:?}",
            found.info, want.info
        ))
    } else if want.nguid != [0; 16] && found.nguid != want.nguid {
        Some("a namespace with another NGUID".to_string())
    } else {
        None
    }
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

/// How a failed call's error counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// An ANA status: the path is in that state now.
    Ana(AnaState),
    /// The path failed: its transport, another path related status (SCT 3h: Internal Path
    /// Error, Controller or Host Pathing Error, ...), or a command aborted because the
    /// controller deleted its queue (the target tearing the controller down).
    Path,
    /// The command's own outcome: returned to the caller.
    Other,
}

fn classify(e: &Error) -> Failure {
    match e.status() {
        Some(s) => match AnaState::from_status(s) {
            Some(state) => Failure::Ana(state),
            None if s.sct() == 3 || s.code() == Status::ABORT_QUEUE.code() => Failure::Path,
            None => Failure::Other,
        },
        None if is_transport_failure(e) => Failure::Path,
        None => Failure::Other,
    }
}

/// Whether a connection error means the path will not get better by trying again.
fn is_permanent(e: &Error) -> bool {
    matches!(e, Error::Controller(_) | Error::Auth { .. })
}

/// The thread of one path.
struct PathThread {
    idx: usize,
    shared: Arc<Shared>,
    opts: ConnectOptions,
    nsid: u32,
    mp: MultipathOptions,
    identity: Identity,
}

impl PathThread {
    fn stopped(&self) -> bool {
        self.shared.lock().stop
    }

    /// Sleep `d` unless stopped first; false if stopped.
    fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        let mut g = self.shared.lock();
        loop {
            if g.stop {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            g = self
                .shared
                .cv
                .wait_timeout(g, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn label(&self) -> String {
        format!("{}:{}", self.opts.addr, self.opts.port)
    }

    /// Put a new connection into use.
    fn publish(&self, c: Connected, first: bool) -> Live {
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
        if !first {
            p.reconnects += 1;
            g.stats.reconnects += 1;
        }
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
                let mut buf = vec![0u8; live.log_len.div_ceil(4) * 4];
                match live.ctrl.get_log_page(nvlog::lid::ANA, 0, 0, &mut buf) {
                    Ok(()) => ana_state_in(&buf, self.nsid, live.grpid).unwrap_or_else(|| {
                        tracing::warn!(path = %self.label(), grpid = live.grpid,
                            "the ANA log does not list the namespace's group");
                        AnaState::Inaccessible
                    }),
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
        let mut live = initial.map(|c| self.publish(c, true));
        let mut attempt = 0u32;
        loop {
            if self.stopped() {
                break;
            }
            let Some(l) = live.as_mut() else {
                attempt += 1;
                if !self.sleep(self.mp.reconnect_wait(attempt)) {
                    break;
                }
                let c = connect_path(&self.opts, self.nsid).and_then(|c| {
                    match identity_mismatch(&self.identity, &c.identity) {
                        None => Ok(c),
                        Some(what) => Err(Error::Controller(format!(
                            "the path leads to another namespace: {what}"
                        ))),
                    }
                });
                match c {
                    Ok(c) => {
                        tracing::warn!(path = %self.label(), attempt, "path reconnected");
                        attempt = 0;
                        live = Some(self.publish(c, false));
                    }
                    Err(e) => {
                        tracing::debug!(path = %self.label(), attempt, error = %e,
                            "reconnect attempt failed");
                        self.mark_failed(None, &e);
                        if is_permanent(&e) {
                            tracing::warn!(path = %self.label(), error = %e, "giving the path up");
                            self.shared.lock().paths[self.idx].state = PathState::Refused;
                            self.shared.cv.notify_all();
                            return Ok(());
                        }
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

impl MultipathNamespace {
    /// Open namespace `nsid` over `paths` (one [`ConnectOptions`] per path, all for the same
    /// subsystem) with the default [`MultipathOptions`].
    pub fn open(paths: Vec<ConnectOptions>, nsid: u32) -> Result<MultipathNamespace, Error> {
        Self::open_with(paths, nsid, MultipathOptions::default())
    }

    /// Open namespace `nsid` over `paths`. Every path connects with one I/O queue and the
    /// first path's host NQN and host ID (and its DH-HMAC-CHAP secrets where a path has none),
    /// at the same time; the call returns once each has connected or failed. It fails if no
    /// path connects (the error names each path's); a path that failed is tried again in the
    /// background. The first path to connect (in the order given) fixes the namespace: one
    /// that leads elsewhere (another subsystem, geometry or NGUID) is refused.
    pub fn open_with(
        paths: Vec<ConnectOptions>,
        nsid: u32,
        opts: MultipathOptions,
    ) -> Result<MultipathNamespace, Error> {
        let Some(first) = paths.first().cloned() else {
            return Err(Error::InvalidArgument("no paths".into()));
        };
        let mut paths = paths;
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
            p.queues = 1;
        }
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
        let Some(identity) = results
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
        let statuses = paths
            .iter()
            .map(|o| PathStatus {
                transport: o.transport,
                addr: o.addr.clone(),
                port: o.port,
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
            })
            .collect();
        let shared = Arc::new(Shared {
            state: Mutex::new(SharedState {
                stop: false,
                paths: statuses,
                stats: MultipathStats::default(),
            }),
            cv: Condvar::new(),
        });
        let mut threads = Vec::with_capacity(paths.len());
        let mut expect = Vec::new();
        for (idx, (o, r)) in paths.into_iter().zip(results).enumerate() {
            let initial = match r {
                Ok(c) => match identity_mismatch(&identity, &c.identity) {
                    None => Some(c),
                    Some(what) => {
                        let e = format!("the path leads to another namespace: {what}");
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
                opts: o,
                nsid,
                mp: opts.clone(),
                identity: identity.clone(),
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
        Ok(MultipathNamespace {
            shared,
            local: (0..n).map(|_| None).collect(),
            threads,
            info: identity.info,
            opts,
            next: 0,
        })
    }

    /// Read the discovery log at `discovery` (its transport, address, port, host identity
    /// and timeouts; its `subnqn` is not used) and open namespace `nsid` over every path it
    /// lists for `subnqn`, with the default [`MultipathOptions`].
    pub fn discover(
        discovery: ConnectOptions,
        subnqn: &str,
        nsid: u32,
    ) -> Result<MultipathNamespace, Error> {
        Self::discover_with(discovery, subnqn, nsid, MultipathOptions::default())
    }

    /// [`MultipathNamespace::discover`] with options. Every NVMe/TCP and NVMe/RDMA entry for
    /// `subnqn` becomes a path (in the log's order; a wildcard address is replaced by the
    /// discovery controller's), connecting with `discovery`'s host identity and settings.
    pub fn discover_with(
        discovery: ConnectOptions,
        subnqn: &str,
        nsid: u32,
        opts: MultipathOptions,
    ) -> Result<MultipathNamespace, Error> {
        let paths = discovered_paths(&discovery, subnqn)?;
        Self::open_with(paths, nsid, opts)
    }

    /// The namespace's geometry (the same on every path).
    pub fn info(&self) -> &NsInfo {
        &self.info
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.info.size()
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.info.block_size
    }

    /// Every path, in the order given: transport, address, ANA state, connected or not,
    /// calls sent.
    pub fn paths(&self) -> Vec<PathInfo> {
        self.monitor().paths()
    }

    /// Counters: failovers, ANA retries and events, reconnects, waits.
    pub fn stats(&self) -> MultipathStats {
        self.shared.lock().stats
    }

    /// A handle for watching the paths from another thread.
    pub fn monitor(&self) -> PathMonitor {
        PathMonitor {
            shared: self.shared.clone(),
        }
    }

    /// The options in force.
    pub fn options(&self) -> &MultipathOptions {
        &self.opts
    }

    /// Read `buf.len()` bytes at byte `offset` ([`Namespace::read_at`]).
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        self.run("Read", |ns| ns.read_at(buf, offset))
    }

    /// Write `buf` at byte `offset` ([`Namespace::write_at`]).
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> Result<(), Error> {
        self.run("Write", |ns| ns.write_at(buf, offset))
    }

    /// Compare `buf` with the namespace's contents at byte `offset`
    /// ([`Namespace::compare_at`]).
    pub fn compare_at(&mut self, buf: &[u8], offset: u64) -> Result<bool, Error> {
        self.run("Compare", |ns| ns.compare_at(buf, offset))
    }

    /// Compare and Write ([`Namespace::compare_and_write`]) through one path.
    ///
    /// Unlike the other calls, a pair that may have reached the controller is not sent again
    /// on another path: after a transport or path failure once it was submitted, the error is
    /// returned (the path is failed over for later calls). The pair may have executed before
    /// the path broke, and sent again it would compare against its own write and report a
    /// Compare Failure for a write that happened. An ANA status (nothing executed), a path
    /// already known to be down, and the wait for a usable path are handled as for any call.
    pub fn compare_and_write(
        &mut self,
        compare: &[u8],
        write: &[u8],
        offset: u64,
    ) -> Result<bool, Error> {
        self.run_with("Compare and Write", false, |ns| {
            ns.compare_and_write(compare, write, offset)
        })
    }

    /// Flush the volatile write cache ([`Namespace::flush`]) through one path (see
    /// [`MultipathNamespace`] on what it covers).
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

    /// Close every path: shut each controller down (CC.SHN). Returns the first failure.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.close()
    }

    fn close(&mut self) -> Result<(), Error> {
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
    /// failure, waiting for a usable path when there is none.
    fn run<T>(
        &mut self,
        what: &'static str,
        op: impl FnMut(&mut Namespace) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.run_with(what, true, op)
    }

    /// [`MultipathNamespace::run`]; without `resend`, a call that failed on a path whose
    /// queue was usable when it started (it may have reached the controller) is not sent
    /// again: the path is failed over and the error returned.
    fn run_with<T>(
        &mut self,
        what: &'static str,
        resend: bool,
        mut op: impl FnMut(&mut Namespace) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let shared = self.shared.clone();
        // Since the first failure or wait of this call.
        let mut since: Option<Instant> = None;
        let mut waited = false;
        let mut asked: Option<Instant> = None;
        loop {
            let mut g = shared.lock();
            let pick = self.select(&mut g);
            let Some(i) = pick else {
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
                continue;
            };
            drop(g);
            let (epoch, ns) = self.local[i].as_mut().expect("selected a connected path");
            let epoch = *epoch;
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
            let give_back = !resend && sent && failure == Failure::Path;
            let mut g = shared.lock();
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
            shared.cv.notify_all();
            if give_back {
                return Err(err);
            }
            let start = *since.get_or_insert_with(Instant::now);
            let elapsed = start.elapsed();
            if elapsed >= self.no_path_wait(&g) {
                return Err(self.give_up(&mut g, what, elapsed, Some(err)));
            }
        }
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

impl Drop for MultipathNamespace {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// The paths the discovery log at `discovery` lists for `subnqn`.
fn discovered_paths(
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

    #[test]
    fn reconnect_waits_double_up_to_the_cap() {
        let o = MultipathOptions {
            reconnect_delay: Duration::from_millis(100),
            reconnect_max_delay: Duration::from_millis(500),
            ..MultipathOptions::default()
        };
        let w: Vec<u128> = (1..=5).map(|a| o.reconnect_wait(a).as_millis()).collect();
        assert_eq!(w, [100, 200, 400, 500, 500]);
        assert_eq!(o.reconnect_wait(u32::MAX), Duration::from_millis(500));
    }
}
