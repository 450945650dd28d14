//! A namespace that survives the loss of its connection: [`ReconnectingNamespace`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::controller::{ConnectOptions, Controller, ControllerInfo, Namespace, NsInfo};
use crate::error::{CmdError, Error};

/// How a [`ReconnectingNamespace`] reconnects: exponential backoff between attempts, bounded
/// by a number of attempts and a total time per failed call.
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
    /// Calls run again after their connection failed.
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
/// ```no_run
/// use std::time::Duration;
/// use initiator::{ConnectOptions, ReconnectPolicy, ReconnectingNamespace};
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
/// # Ok::<(), initiator::Error>(())
/// ```
pub struct ReconnectingNamespace {
    opts: ConnectOptions,
    policy: ReconnectPolicy,
    info: NsInfo,
    subnqn: String,
    serial: String,
    conn: Option<Conn>,
    stats: ReconnectStats,
}

impl std::fmt::Debug for ReconnectingNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconnectingNamespace")
            .field("addr", &self.opts.addr)
            .field("port", &self.opts.port)
            .field("subnqn", &self.subnqn)
            .field("info", &self.info)
            .field("connected", &self.conn.is_some())
            .field("stats", &self.stats)
            .finish()
    }
}

/// Where one failed call stands in its reconnect budget.
struct Budget {
    since: Instant,
    attempts: u32,
    last: Arc<Error>,
}

impl ReconnectingNamespace {
    /// Connect (once, no retry: a first connection that fails is a configuration problem)
    /// with one I/O queue (`opts.queues` is set to 1) and open namespace `nsid`.
    pub fn connect(
        mut opts: ConnectOptions,
        nsid: u32,
        policy: ReconnectPolicy,
    ) -> Result<ReconnectingNamespace, Error> {
        opts.queues = 1;
        let conn = open(&opts, nsid)?;
        let c = conn.ctrl.info();
        Ok(ReconnectingNamespace {
            info: *conn.ns.info(),
            subnqn: c.subnqn.clone(),
            serial: c.serial.clone(),
            opts,
            policy,
            conn: Some(conn),
            stats: ReconnectStats::default(),
        })
    }

    /// The namespace's geometry (the same on every connection).
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

    /// The policy in force.
    pub fn policy(&self) -> &ReconnectPolicy {
        &self.policy
    }

    /// Change the policy (applies from the next failure on).
    pub fn set_policy(&mut self, policy: ReconnectPolicy) {
        self.policy = policy;
    }

    /// Counters: reconnects, failed attempts, retried calls, give-ups.
    pub fn stats(&self) -> ReconnectStats {
        self.stats
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
        match self.conn.take() {
            Some(Conn { ns, ctrl }) => {
                drop(ns);
                ctrl.shutdown()
            }
            None => Ok(()),
        }
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
                let b = budget.get_or_insert_with(|| Budget {
                    since: Instant::now(),
                    attempts: 0,
                    last: Arc::new(Error::Closed),
                });
                self.reconnect(b)?;
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
            self.abandon();
            self.stats.retries += 1;
            let err = Arc::new(err);
            match &mut budget {
                Some(b) => b.last = err,
                None => {
                    budget = Some(Budget {
                        since: Instant::now(),
                        attempts: 0,
                        last: err,
                    })
                }
            }
        }
    }

    /// Drop the broken connection without a shutdown handshake (the target frees its side
    /// when its keep-alive timer fires, or has already, with the connection).
    fn abandon(&mut self) {
        if let Some(Conn { ns, ctrl }) = self.conn.take() {
            drop(ns);
            ctrl.abandon();
        }
    }

    /// Connect again within `b`'s budget, waiting the policy's backoff before each attempt.
    fn reconnect(&mut self, b: &mut Budget) -> Result<(), Error> {
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
                    self.conn = Some(conn);
                    self.stats.reconnects += 1;
                    self.stats.last_outage = Some(outage);
                    return Ok(());
                }
                Err(e) => {
                    self.stats.failed_attempts += 1;
                    tracing::warn!(
                        attempt = b.attempts,
                        max_attempts = self.policy.max_attempts,
                        error = %e,
                        "reconnect attempt failed"
                    );
                    let permanent = matches!(e, Error::Controller(_));
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
        | Error::Rdma(_) => true,
        Error::Command { err, .. } => !matches!(err, CmdError::Status(_)),
        Error::Status { .. }
        | Error::Controller(_)
        | Error::InvalidArgument(_)
        | Error::QueueFull
        | Error::Unsupported(_)
        | Error::ReconnectGaveUp { .. } => false,
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
