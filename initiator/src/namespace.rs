//! [`Namespace`]: one namespace over a set of paths, with the synchronous block API written
//! once for every form of the set.

use std::sync::Arc;

use nvme::resv;

use crate::any_queue::AnyQueue;
use crate::cmd::NsInfo;
use crate::controller::{ConnectOptions, ControllerInfo, NsQueue};
use crate::error::Error;
use crate::multipath::{AnaPaths, MultipathOptions};
use crate::path::{
    first_path, is_transport_failure, Budget, Connected, Link, PathInfo, PathMonitor, PathState,
    PathStats, PathStatus, ReconnectPolicy, Shared,
};

/// A namespace with a synchronous block API, over a set of paths (connections to its
/// controllers). Offsets and lengths are in bytes and must be multiples of
/// [`Namespace::block_size`].
///
/// The set takes three forms; every operation works on each of them:
/// - **one path that does not reconnect**: [`crate::Controller::open_namespace`], on one of
///   the I/O queues of a controller the caller keeps. A failure of the connection is the
///   call's error, and every call after it fails too.
/// - **one path that reconnects**: [`Namespace::connect`] owns its controller. On a transport
///   failure (connection closed or reset, a protocol error, a termination request, a command
///   older than [`ConnectOptions::timeout`], a data digest mismatch) it drops the controller,
///   connects again with the backoff of its [`ReconnectPolicy`] and runs the failed call
///   again, the way the Linux host's error recovery does (`nvme_tcp_error_recovery`: tear the
///   queues down without a shutdown, reconnect every `reconnect_delay`, give up after
///   `ctrl_loss_tmo`). Past the policy's attempts or total time the call fails with
///   [`Error::ReconnectGaveUp`], which carries the last failure; the next call starts a new
///   budget.
/// - **several paths** ([`Namespace::multipath`], [`Namespace::discover`]): each call goes
///   to an ANA optimized path, else a non-optimized one ([`crate::PathPolicy`] among equals;
///   the controllers' ANA logs are read again on the ANA change event, on an ANA status and
///   every [`MultipathOptions::ana_poll`]), runs again on another path when its path fails
///   or answers an ANA status, and a failed path reconnects in the background under
///   [`MultipathOptions::reconnect`]. A call that finds no usable path waits for one up to
///   the paths' ANATT ([`MultipathOptions::no_path_timeout`]), then fails with
///   [`Error::NoUsablePath`], which describes every path.
///
/// # What is run again
/// Read, Write, Compare, Flush, Write Zeroes, Dataset Management (deallocate) and the
/// reservation commands are run again after a transport failure: the block operations are
/// idempotent (running one again leaves the blocks as one successful run would; a command
/// that failed with the connection may well have reached the media before the failure), and
/// a reservation command run again finds the state it set (Register and Acquire answer
/// Reservation Conflict or succeed as the first run left it). The one case this does not
/// cover is a namespace shared with another host that writes the same blocks in between:
/// then the retry can overwrite that host's newer data, as it can with the Linux host. One
/// call is in flight per handle, so a retry never reorders writes. Compare and Write is not
/// run again once it may have reached a controller (it is not idempotent): its path is failed
/// and the error returned.
///
/// A Flush run again on a new connection covers what the target holds now. Writes
/// acknowledged before a target *crash* (power loss) and not yet flushed may be gone, and the
/// retried Flush cannot tell; a killed target *process* loses nothing it acknowledged
/// (nvmf-target writes with O_DIRECT). Code that must know writes again what it wrote since
/// its last successful Flush when [`PathStats::reconnects`] moved.
///
/// An answer of the controller ([`Error::status`] is `Some`, e.g. LBA Out of Range or a
/// write-protected namespace; ANA statuses excepted with several paths) and a local error
/// (an unaligned range) return at once, without reconnecting.
///
/// Every new connection is checked against the first: the subsystem NQN, the namespace's
/// geometry and NGUID (and, with one path, the serial number) must be the same, or the path
/// is given up at once (a different device behind the same address must not receive the
/// retried writes). A reconnect authenticates again (DH-HMAC-CHAP) with the same
/// [`ConnectOptions`]; a refused secret ([`Error::Auth`]) gives up at once too.
///
/// ```no_run
/// use std::time::Duration;
/// use nvmf_initiator::{ConnectOptions, Namespace, ReconnectPolicy};
///
/// let mut opts = ConnectOptions::tcp("127.0.0.1", 4420, "nqn.2026-11.io.nvmf-rs:default");
/// opts.timeout = Duration::from_secs(5);
/// let policy = ReconnectPolicy {
///     max_total: Some(Duration::from_secs(30)),
///     ..ReconnectPolicy::default()
/// };
/// let mut ns = Namespace::connect(opts, 1, policy)?;
/// let bs = ns.block_size() as usize;
/// let data = vec![0x5au8; 16 * bs];
/// ns.write_at(&data, 0)?; // survives a target restart in the middle
/// let mut back = vec![0u8; 16 * bs];
/// ns.read_at(&mut back, 0)?;
/// assert_eq!(back, data);
/// ns.write_zeroes(0, 16 * bs as u64)?;
/// ns.trim(&[(0, 8 * bs as u64)])?;
/// println!("reconnects: {}", ns.stats().reconnects);
/// # Ok::<(), nvmf_initiator::Error>(())
/// ```
pub struct Namespace {
    info: NsInfo,
    shared: Arc<Shared>,
    paths: Paths,
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("info", &self.info)
            .field("paths", &self.paths())
            .finish()
    }
}

/// The path set. (The one-path form stays inline: it is what every call of a one-path
/// namespace reaches, and boxing it would add an indirection per call.)
#[allow(clippy::large_enum_variant)]
enum Paths {
    /// One path; its failures are handled within the call that sees them.
    One(OnePath),
    /// Several, chosen by ANA state, each reconnecting in a thread of its own.
    Ana(AnaPaths),
}

/// The connection of a one-path namespace (one per namespace: the variants' sizes do not
/// matter, an indirection per call would).
#[allow(clippy::large_enum_variant)]
enum OneConn {
    /// On a controller the caller keeps.
    Direct(NsQueue),
    /// On a controller of its own.
    Owned(Connected),
}

impl OneConn {
    fn queue(&mut self) -> &mut NsQueue {
        match self {
            OneConn::Direct(q) => q,
            OneConn::Owned(c) => &mut c.ns,
        }
    }
}

struct OnePath {
    /// `None` after a give-up, until the next call connects again.
    conn: Option<OneConn>,
    /// How to connect again (`None`: the controller is the caller's; no reconnect).
    link: Option<Link>,
}

impl OnePath {
    /// Run `op` on the connection, reconnecting and running it again while it fails with
    /// the transport (unless `resend` is false and it may have reached the controller).
    fn run<T>(
        &mut self,
        shared: &Shared,
        what: &'static str,
        resend: bool,
        mut op: impl FnMut(&mut NsQueue) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut budget: Option<Budget> = None;
        loop {
            let link = self.link.as_ref();
            if self.conn.is_none() {
                let Some(link) = link else {
                    return Err(Error::Closed);
                };
                let b = budget.get_or_insert_with(|| Budget::start(Error::Closed));
                let c = link.reconnect(shared, b, &mut |d| {
                    std::thread::sleep(d);
                    true
                })?;
                let mut g = shared.lock();
                let p = &mut g.paths[0];
                p.epoch += 1;
                p.state = PathState::Connected;
                p.cntlid = Some(c.info().cntlid);
                drop(g);
                self.conn = Some(OneConn::Owned(c));
            }
            let q = self.conn.as_mut().expect("connected above").queue();
            let sent = !q.queue_ref().is_failed();
            let err = match op(q) {
                Ok(v) => return Ok(v),
                Err(e) if !is_transport_failure(&e) => return Err(e),
                Err(e) => e,
            };
            let mut g = shared.lock();
            let p = &mut g.paths[0];
            p.last_error = Some(err.to_string());
            let Some(link) = link else {
                // The caller's controller: its queue stays failed; so does the path.
                p.state = PathState::Failed;
                p.cntlid = None;
                return Err(err);
            };
            tracing::warn!(
                op = what,
                path = %link.label(),
                cntlid = ?p.cntlid,
                error = %err,
                "connection failed; reconnecting to retry"
            );
            p.state = PathState::Failed;
            p.cntlid = None;
            if let Some(OneConn::Owned(c)) = self.conn.take() {
                c.abandon();
            }
            if !resend && sent {
                return Err(err);
            }
            g.stats.retries += 1;
            drop(g);
            match &mut budget {
                Some(b) => b.last = Arc::new(err),
                None => budget = Some(Budget::start(err)),
            }
        }
    }

    fn shutdown(&mut self) -> Result<(), Error> {
        match self.conn.take() {
            Some(OneConn::Owned(c)) => c.shutdown(),
            _ => Ok(()),
        }
    }
}

impl Namespace {
    /// A namespace on a queue of a controller the caller keeps (no reconnect).
    pub(crate) fn direct(q: NsQueue, status: PathStatus) -> Namespace {
        Namespace {
            info: *q.info(),
            shared: Shared::new(vec![status], ReconnectPolicy::never()),
            paths: Paths::One(OnePath {
                conn: Some(OneConn::Direct(q)),
                link: None,
            }),
        }
    }

    /// Connect (once, no retry: a first connection that fails is a configuration problem)
    /// with one I/O queue (`opts.queues` is set to 1) and open namespace `nsid`; the
    /// namespace owns the controller and reconnects as `policy` says
    /// ([`ReconnectPolicy::never`]: not at all).
    pub fn connect(
        mut opts: ConnectOptions,
        nsid: u32,
        policy: ReconnectPolicy,
    ) -> Result<Namespace, Error> {
        opts.queues = 1;
        let (c, link, shared) = first_path(opts, nsid, policy)?;
        Ok(Namespace {
            info: c.identity.info,
            shared,
            paths: Paths::One(OnePath {
                conn: Some(OneConn::Owned(c)),
                link: Some(link),
            }),
        })
    }

    /// Open namespace `nsid` over several paths to one subsystem (one [`ConnectOptions`] per
    /// path; the first path's host NQN, host ID and DH-HMAC-CHAP secrets go to every path).
    /// The paths connect in parallel; a path that fails to connect is retried in the
    /// background, and the call fails only when none connects ([`Error::NoUsablePath`]). It
    /// returns once every connected path has read its ANA state (within ANATT).
    pub fn multipath(
        paths: Vec<ConnectOptions>,
        nsid: u32,
        opts: MultipathOptions,
    ) -> Result<Namespace, Error> {
        let (info, shared, ana) = AnaPaths::open(paths, nsid, opts)?;
        Ok(Namespace {
            info,
            shared,
            paths: Paths::Ana(ana),
        })
    }

    /// [`Namespace::multipath`] over every path to `subnqn` that the discovery controller at
    /// `discovery` lists (NVMe/TCP and NVMe/RDMA entries; a wildcard address means the
    /// discovery controller's own).
    pub fn discover(
        discovery: ConnectOptions,
        subnqn: &str,
        nsid: u32,
        opts: MultipathOptions,
    ) -> Result<Namespace, Error> {
        let paths = crate::multipath::discovered_paths(&discovery, subnqn)?;
        Self::multipath(paths, nsid, opts)
    }

    /// The namespace's geometry (the same on every path and connection).
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

    /// Every path, in the order given (one for the one-path forms).
    pub fn paths(&self) -> Vec<PathInfo> {
        self.monitor().paths()
    }

    /// Counters: reconnects, failed attempts, calls run again, give-ups, failovers, ANA.
    pub fn stats(&self) -> PathStats {
        self.shared.lock().stats
    }

    /// A view of the paths for another thread.
    pub fn monitor(&self) -> PathMonitor {
        PathMonitor {
            shared: self.shared.clone(),
        }
    }

    /// The reconnect policy in force (of every path).
    pub fn policy(&self) -> ReconnectPolicy {
        self.shared.lock().policy.clone()
    }

    /// Change the reconnect policy (applies from the next failure on; a namespace on a
    /// controller the caller keeps never reconnects).
    pub fn set_policy(&mut self, policy: ReconnectPolicy) {
        self.shared.lock().policy = policy;
    }

    /// Whether a path is connected (false after a give-up, until the next call reconnects).
    pub fn is_connected(&self) -> bool {
        self.shared
            .lock()
            .paths
            .iter()
            .any(|p| p.state == PathState::Connected)
    }

    /// The controller of a one-path namespace that owns it ([`Namespace::connect`]; its
    /// CNTLID changes with every reconnect), while connected.
    pub fn controller_info(&self) -> Option<&ControllerInfo> {
        match &self.paths {
            Paths::One(OnePath {
                conn: Some(OneConn::Owned(c)),
                ..
            }) => Some(c.info()),
            _ => None,
        }
    }

    /// The I/O queue of a one-path namespace, for the asynchronous API (it stays bound to
    /// this handle); `None` with several paths or while disconnected.
    pub fn queue(&mut self) -> Option<&mut AnyQueue> {
        match &mut self.paths {
            Paths::One(OnePath { conn: Some(c), .. }) => Some(c.queue().queue()),
            _ => None,
        }
    }

    /// The options of a multipath namespace.
    pub fn multipath_options(&self) -> Option<&MultipathOptions> {
        match &self.paths {
            Paths::Ana(a) => Some(a.options()),
            Paths::One(_) => None,
        }
    }

    /// Shut the controllers this namespace owns down (CC.SHN); a controller the caller keeps
    /// stays up.
    pub fn shutdown(mut self) -> Result<(), Error> {
        match &mut self.paths {
            Paths::One(one) => one.shutdown(),
            Paths::Ana(ana) => ana.close(),
        }
    }

    /// Run `op` on the path set: the one place where every operation meets failures.
    fn run<T>(
        &mut self,
        what: &'static str,
        resend: bool,
        op: impl FnMut(&mut NsQueue) -> Result<T, Error>,
    ) -> Result<T, Error> {
        match &mut self.paths {
            Paths::One(one) => one.run(&self.shared, what, resend, op),
            Paths::Ana(ana) => ana.run(what, resend, op),
        }
    }

    /// Read `buf.len()` bytes at byte `offset` (pieces up to MDTS, at most
    /// [`crate::SPLIT_BYTES`], run in parallel on the queue; data lands directly in `buf`).
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        self.run("Read", true, |q| q.read_at(buf, offset))
    }

    /// Write `buf` at byte `offset`.
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> Result<(), Error> {
        self.run("Write", true, |q| q.write_at(buf, offset))
    }

    /// Write `buf` at byte `offset` with Force Unit Access (CDW12 bit 30): when this returns,
    /// the data is on non-volatile media, whatever the controller's write cache (a Flush of
    /// just these blocks).
    pub fn write_fua_at(&mut self, buf: &[u8], offset: u64) -> Result<(), Error> {
        self.run("Write", true, |q| q.write_fua_at(buf, offset))
    }

    /// Compare `buf` with the namespace's contents at byte `offset` (Compare, split like a
    /// write): `Ok(true)` if they are equal, `Ok(false)` if the controller answered Compare
    /// Failure.
    pub fn compare_at(&mut self, buf: &[u8], offset: u64) -> Result<bool, Error> {
        self.run("Compare", true, |q| q.compare_at(buf, offset))
    }

    /// Compare and Write (a fused operation): if the blocks at byte `offset` hold exactly
    /// `compare`, replace them with `write` and return `Ok(true)`; if they differ, change
    /// nothing and return `Ok(false)`.
    ///
    /// The controller executes the pair atomically with respect to every other write to
    /// those blocks, from this or any other host and controller: no write lands between the
    /// comparison and the write, and no read or compare sees `write` partly applied. That
    /// makes it a test-and-set on a block range (a lock word, a generation counter) shared by
    /// hosts with nothing else in common.
    ///
    /// `compare` and `write` must have the same length, a whole number of blocks, at most
    /// one command's transfer (MDTS, [`ControllerInfo::max_transfer`]) and the controller's
    /// atomic unit (ACWU), else [`Error::InvalidArgument`] (nothing is sent). The controller
    /// must report Compare and Write in FUSES, else [`Error::Unsupported`]. It is two
    /// commands posted back to back on one queue (Compare with FUSE first, Write with FUSE
    /// second), so two of its tags must be free ([`Error::QueueFull`] otherwise: commands of
    /// the asynchronous API in flight).
    ///
    /// `Ok(false)` means the Compare completed with Compare Failure (the Write is then
    /// aborted with Command Aborted due to Failed Fused Command). Any other failure of either
    /// command is `Err`; after a transport failure the write may or may not have happened,
    /// and the pair is not sent again (the path is failed, or reconnected for the next call).
    pub fn compare_and_write(
        &mut self,
        compare: &[u8],
        write: &[u8],
        offset: u64,
    ) -> Result<bool, Error> {
        self.run("Compare and Write", false, |q| {
            q.compare_and_write(compare, write, offset)
        })
    }

    /// Flush the volatile write cache.
    pub fn flush(&mut self) -> Result<(), Error> {
        self.run("Flush", true, |q| q.flush())
    }

    /// Write zeroes over `len` bytes at `offset` (Write Zeroes, up to 65536 blocks each).
    pub fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<(), Error> {
        self.run("Write Zeroes", true, |q| q.write_zeroes(offset, len))
    }

    /// Deallocate byte ranges `(offset, len)` (Dataset Management with AD, up to 256 ranges
    /// per command).
    pub fn trim(&mut self, ranges: &[(u64, u64)]) -> Result<(), Error> {
        self.run("Dataset Management", true, |q| q.trim(ranges))
    }

    /// Reservation Register: register, unregister or replace this host's key (the host is
    /// the Host Identifier of [`ConnectOptions::hostid`]; every controller of the host shares
    /// the registration). A refusal is [`Error::Status`] with Reservation Conflict.
    pub fn reservation_register(&mut self, c: &resv::RegisterCmd) -> Result<(), Error> {
        self.run("Reservation Register", true, |q| q.reservation_register(c))
    }

    /// Reservation Acquire: acquire, preempt, or preempt and abort.
    pub fn reservation_acquire(&mut self, c: &resv::AcquireCmd) -> Result<(), Error> {
        self.run("Reservation Acquire", true, |q| q.reservation_acquire(c))
    }

    /// Reservation Release: release or clear.
    pub fn reservation_release(&mut self, c: &resv::ReleaseCmd) -> Result<(), Error> {
        self.run("Reservation Release", true, |q| q.reservation_release(c))
    }

    /// Reservation Report (extended format: fabrics Host Identifiers are 128 bits), with
    /// room for 63 registrants.
    pub fn reservation_report(&mut self) -> Result<resv::Report, Error> {
        self.run("Reservation Report", true, |q| q.reservation_report())
    }
}
