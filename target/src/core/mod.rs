//! The transport-agnostic controller core: subsystems, controllers, queues.
//!
//! No sockets, no verbs, no io_uring here. A transport owns one [`Queue`] per connection (TCP
//! socket or RDMA QP) and pumps it:
//!
//! ```text
//! capsule in -> Queue::parse(sqe)          -> Cmd (direction + length + SGL) or an error CQE
//!            -> transport moves host data into the slot buffer (in-capsule / R2T / RDMA_READ)
//!            -> Queue::execute(cmd, buf, now) -> Exec::Done (admin/fabrics, data in buf)
//!                                              | Exec::Io(IoOp) (backend runs it on buf)
//!                                              | Exec::Deferred (AER: completes later)
//!            -> backend completion -> Queue::complete_io(cmd, result) -> Cqe
//!            -> transport sends data (ToHost) then the CQE
//! ```
//! Time is passed in (`now`); timers are data (`poll_timeout`), never tasks.
//!
//! Queues of one controller may live on different threads: the controller state they share
//! (CC/CSTS, the keep-alive stamp, features, AER slots, the error log) is in
//! `controller::Controller` behind atomics and one small mutex. What happens on another
//! thread (a reset tearing down I/O queues, a keep-alive expiry, a namespace change raising an
//! event) reaches a queue through [`Queue::poll_event`]; a transport that sleeps can register
//! a [`Waker`] with [`Queue::set_waker`] to be told to poll.

mod admin;
mod auth;
mod concat;
mod controller;
mod discovery;
mod fabrics_cmd;
mod fused;
mod io;
mod lease;
mod queue;
mod rangelock;
mod reservation;
pub mod stats;
mod subsystem;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

pub use lease::LeaseClock;
pub use queue::QueueStats;
pub use reservation::{ResvStore, SaveDone};

use nvme::sgl::Sgl;
use nvme::{Cqe, Sqe, Status};

/// The fabric a queue runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrType {
    Tcp,
    Rdma,
}

/// What a transport offers; Identify and the discovery log are derived from it.
#[derive(Debug, Clone)]
pub struct TransportCaps {
    pub trtype: TrType,
    /// In-capsule data bytes accepted on I/O queues (IOCCSZ = (64 + this) / 16).
    pub in_capsule_data: u32,
    /// The slot buffer's size: the most data a command moves through the backend at once.
    pub max_io_size: u32,
    /// Largest transfer of one command, bytes (MDTS is derived with a 4 KiB page; at least
    /// `max_io_size`). Reads, Writes and Compares larger than `max_io_size` move in
    /// [`Piece`]s of it, one after another through the same buffer.
    pub max_transfer: u32,
    /// Largest queue depth (CAP.MQES + 1) accepted at Connect.
    pub max_queue_depth: u16,
}

/// What one transport connection can carry, told to the core when its queue is created: the
/// core validates Connect and every SGL against it, so no transport repeats those checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// In-capsule data bytes the connection takes while it is (or is not yet) an admin queue.
    pub in_capsule_admin: u32,
    /// In-capsule data bytes it takes as an I/O queue.
    pub in_capsule_io: u32,
    /// The deepest queue the connection was set up for (NVMe/RDMA: the RECVs posted for the CM
    /// request, `hsqsize + 1`); `None`: up to `TransportCaps::max_queue_depth`. A Connect asking
    /// for more gets Invalid Parameters at SQSIZE.
    pub max_depth: Option<u16>,
    /// The queue the connection was set up for (NVMe/RDMA: the CM request's qid); `None`: any.
    /// A Connect naming another gets Invalid Parameters at QID.
    pub qid: Option<u16>,
}

/// In-capsule data an NVMe/TCP admin queue always takes (Linux `NVME_TCP_ADMIN_CCSZ`), which
/// covers Connect data.
pub const TCP_ADMIN_IN_CAPSULE: u32 = 8192;

impl QueueLimits {
    /// NVMe/TCP: 8 KiB on the admin queue, the configured size on I/O queues, any qid and any
    /// depth up to the caps.
    pub fn tcp(caps: &TransportCaps) -> QueueLimits {
        QueueLimits {
            in_capsule_admin: TCP_ADMIN_IN_CAPSULE,
            in_capsule_io: caps.in_capsule_data,
            max_depth: None,
            qid: None,
        }
    }

    /// The most in-capsule data any command may carry on this connection (to size receive
    /// paths before Connect says what the queue is).
    pub fn max_in_capsule(&self) -> u32 {
        self.in_capsule_admin.max(self.in_capsule_io)
    }
}

/// A listener, as the discovery log reports it, with what it serves: the subsystems (`None`:
/// all) and its Asymmetric Namespace Access state per ANA group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerInfo {
    pub trtype: TrType,
    pub traddr: String,
    pub trsvcid: String,
    pub port_id: u16,
    pub subsystems: Option<Vec<String>>,
    /// `nvme::log::ana_state` codes indexed by ANA group (1 to [`ANA_GROUPS`]; 0 unused).
    pub ana: Arc<Vec<u8>>,
    /// NVMe/TCP with TLS: required (plain connections refused) or allowed; `None`: plain only.
    pub tls: Option<config::TlsMode>,
}

/// ANA groups a namespace may be in (1 to this): Identify ANAGRPMAX and NANAGRPID, as nvmet.
pub const ANA_GROUPS: u32 = 128;

impl ListenerInfo {
    /// A listener that serves every subsystem, every ANA group optimized.
    pub fn new(trtype: TrType, traddr: String, trsvcid: String, port_id: u16) -> ListenerInfo {
        ListenerInfo {
            trtype,
            traddr,
            trsvcid,
            port_id,
            subsystems: None,
            ana: all_optimized(),
            tls: None,
        }
    }

    /// Set the state of ANA group `group` (`nvme::log::ana_state`).
    pub fn set_ana(&mut self, group: u32, state: u8) {
        if let Some(s) = Arc::make_mut(&mut self.ana).get_mut(group as usize) {
            *s = state;
        }
    }

    /// This listener's state for ANA group `group`.
    pub fn ana_state(&self, group: u32) -> u8 {
        self.ana
            .get(group as usize)
            .copied()
            .unwrap_or(nvme::log::ana_state::OPTIMIZED)
    }

    /// Whether this listener serves subsystem `nqn` (discovery always).
    pub fn serves(&self, nqn: &str) -> bool {
        nqn == nvme::DISCOVERY_NQN
            || self
                .subsystems
                .as_ref()
                .is_none_or(|s| s.iter().any(|n| n == nqn))
    }

    /// Whether a connection of `trtype` that arrived on `local` came through this listener.
    pub(crate) fn accepted(&self, trtype: TrType, local: std::net::SocketAddr) -> bool {
        self.trtype == trtype
            && self.trsvcid == local.port().to_string()
            && self
                .traddr
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a == local.ip() || a.is_unspecified())
    }

    /// The same listener (address, port and transport), whatever it serves.
    pub(crate) fn same_endpoint(&self, o: &ListenerInfo) -> bool {
        self.trtype == o.trtype && self.traddr == o.traddr && self.trsvcid == o.trsvcid
    }
}

/// Every ANA group optimized.
pub(crate) fn all_optimized() -> Arc<Vec<u8>> {
    Arc::new(vec![
        nvme::log::ana_state::OPTIMIZED;
        ANA_GROUPS as usize + 1
    ])
}

/// A namespace as the core sees it (the bytes live in the backend).
#[derive(Debug, Clone)]
pub struct NamespaceSpec {
    pub nsid: u32,
    /// Capacity in logical blocks.
    pub blocks: u64,
    /// log2 of the logical block size (9 or 12).
    pub lba_shift: u8,
    /// The backend's index for this namespace's device (opaque to the core).
    pub device: u32,
    pub nguid: [u8; 16],
    pub uuid: [u8; 16],
    /// Write protected (`read_only` in the configuration): Identify reports it (NSATTR bit 0,
    /// so the Linux host marks the disk read-only) and writes fail with Namespace Is Write
    /// Protected before they reach the backend.
    pub read_only: bool,
    /// Deallocated blocks read back as zeroes (the backend frees them: null device, hole
    /// punching in a file). Identify reports it in DLFEAT; otherwise DLFEAT says "not
    /// reported" (block devices discard, and what they read afterwards is theirs to say).
    pub deallocate_zeroes: bool,
    /// The ANA group (1 to [`ANA_GROUPS`]): each listener has a state per group.
    pub ana_group: u32,
    /// The largest fused Compare and Write, in bytes, that the store runs as one operation of
    /// its own ([`IoKind::CompareAndWrite`]), atomic against every gateway of a shared image:
    /// a pair of at most this many bytes that stays within one aligned unit of it (RBD: 512,
    /// one sector, all that librbd 16's compare-and-write takes); 0 for none. Any other pair
    /// is a Compare then a Write under the namespace's range lock: atomic against every command
    /// of this target, which is all that reaches a local store (and an RBD image served by
    /// one gateway at a time, as a gateway group serves it).
    pub native_caw: u32,
    /// The store may lose a completed write until a flush (`Device::volatile_cache`): the
    /// controller reports a volatile write cache when any namespace of its subsystem has one.
    pub volatile_cache: bool,
}

/// A subsystem as configured.
#[derive(Debug, Clone)]
pub struct SubsystemSpec {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub hosts: Vec<HostSpec>,
    /// The hashes and DH groups DH-HMAC-CHAP may use with this subsystem's hosts.
    pub auth_policy: nvme::auth::Policy,
    pub namespaces: Vec<NamespaceSpec>,
}

/// A host allowed on a subsystem, with its DH-HMAC-CHAP secrets when it must authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    pub nqn: String,
    pub keys: Option<HostKeys>,
    /// The host's configured TLS PSK (NVMe/TCP listeners with `tls`).
    pub tls_psk: Option<nvme::tls::ConfiguredPsk>,
}

/// A host's secret and, for bidirectional authentication, the controller's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostKeys {
    pub host: nvme::auth::Secret,
    pub ctrl: Option<nvme::auth::Secret>,
}

impl From<&str> for HostSpec {
    fn from(nqn: &str) -> HostSpec {
        HostSpec {
            nqn: nqn.to_owned(),
            keys: None,
            tls_psk: None,
        }
    }
}

impl From<String> for HostSpec {
    fn from(nqn: String) -> HostSpec {
        HostSpec {
            nqn,
            keys: None,
            tls_psk: None,
        }
    }
}

/// Target-wide parameters.
#[derive(Debug, Clone)]
pub struct TargetParams {
    /// Smallest KATO a host may set, ms (smaller values are raised to this).
    pub keep_alive_ms_min: u32,
    /// Where reservations persist through power loss; `None`: nowhere (RESCAP.PTPLC clear).
    pub resv_store: Option<Arc<dyn ResvStore>>,
    /// How long a DH-HMAC-CHAP transaction may take before the queue is torn down.
    pub auth_timeout: std::time::Duration,
    /// Whether the data that ends a successful read completes it whatever the host's SQ flow
    /// control (NVMe/TCP `target.c2h_success: always`, as SPDK's target does); false: only
    /// where the host disabled SQ flow control, as the specification says.
    pub data_completes_always: bool,
    /// The controller IDs this target hands out (`target.cntlid_min..=cntlid_max`): targets
    /// that serve one subsystem to the same hosts take disjoint ranges, so a host's paths
    /// through them are distinct controllers of one subsystem (Linux rejects a duplicate
    /// cntlid).
    pub cntlid_range: std::ops::RangeInclusive<u16>,
}

/// The default [`TargetParams::auth_timeout`].
pub const AUTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Called (from any thread) when a queue has something for [`Queue::poll_event`].
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// Shared, thread-safe target state: subsystems, the controller registry, discovery.
pub struct Target {
    inner: subsystem::TargetInner,
}

impl Target {
    pub fn new(
        subsystems: Vec<SubsystemSpec>,
        listeners: Vec<ListenerInfo>,
        params: TargetParams,
    ) -> Arc<Target> {
        Arc::new(Target {
            inner: subsystem::TargetInner::new(subsystems, listeners, params),
        })
    }
    /// Number of live controllers (metrics and tests).
    pub fn controller_count(&self) -> usize {
        self.inner.controller_count()
    }
    /// The discovery log generation counter (changes only when the configuration does).
    pub fn genctr(&self) -> u64 {
        self.inner.genctr.load(std::sync::atomic::Ordering::Acquire)
    }
    /// Tell the controllers of subsystem `subnqn` that namespace `nsid` changed (resized,
    /// added, removed): it goes into their Changed Namespace List and, where the host enabled
    /// it, a Namespace Attribute Changed event completes an AER. False if there is no such
    /// subsystem.
    pub fn notify_namespace_changed(&self, subnqn: &str, nsid: u32) -> bool {
        self.inner.notify_namespace_changed(subnqn, nsid)
    }
    /// Replace the namespaces of subsystem `subnqn` (e.g. on a configuration reload) and
    /// notify its controllers of each NSID added, removed or changed. False if there is no
    /// such subsystem.
    pub fn set_namespaces(&self, subnqn: &str, namespaces: Vec<NamespaceSpec>) -> bool {
        self.inner.set_namespaces(subnqn, namespaces)
    }
    /// Move to a new configuration (SIGHUP reload): subsystems, their hosts and namespaces,
    /// and the listeners the discovery log reports. Connected hosts learn of namespace
    /// changes through AENs and the Changed Namespace List; controllers of removed subsystems
    /// are disconnected. See [`Reconfigured`] for what is reported back.
    pub fn reconfigure(
        &self,
        subsystems: Vec<SubsystemSpec>,
        listeners: Vec<ListenerInfo>,
    ) -> Reconfigured {
        self.inner.reconfigure(subsystems, listeners)
    }

    /// The listeners of the other gateways of a group, which the discovery log lists after
    /// this target's own (with the same subsystems and host checks). True if the log changed
    /// (discovery controllers get the Discovery Log Page Change event).
    pub fn set_remote_listeners(&self, listeners: Vec<ListenerInfo>) -> bool {
        self.inner.set_remote_listeners(listeners)
    }

    /// Reads the reservation state of the namespaces in ANA groups `groups` again from the
    /// reservation store (a gateway about to serve them takes what the group keeps); returns
    /// how many namespaces.
    pub fn reload_reservations(&self, groups: &std::collections::BTreeSet<u32>) -> usize {
        self.inner.reload_reservations(groups)
    }

    /// Writes in flight on controllers whose subsystem has a namespace in ANA groups `groups`.
    pub fn writes_in_flight(&self, groups: &std::collections::BTreeSet<u32>) -> u64 {
        self.inner.writes_in_flight(groups)
    }
    /// Per-subsystem, per-namespace and per-controller I/O statistics, summed now from the
    /// queues' own counters (see [`stats`]).
    pub fn io_metrics(&self) -> Vec<stats::SubsystemMetrics> {
        self.inner.io_metrics()
    }
    /// NQNs of the configured subsystems.
    pub fn subsystem_nqns(&self) -> Vec<String> {
        self.inner
            .subsystem_list()
            .iter()
            .map(|s| s.nqn.clone())
            .collect()
    }
}

/// What [`Target::reconfigure`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconfigured {
    pub subsystems_added: Vec<String>,
    pub subsystems_removed: Vec<String>,
    /// Serial or model changed: replaced as a whole, its controllers disconnected.
    pub subsystems_replaced: Vec<String>,
    /// Subsystems whose allowed hosts changed (applies to new connections).
    pub hosts_changed: Vec<String>,
    /// Per subsystem, the NSIDs added, removed or changed (increasing).
    pub namespaces_changed: Vec<(String, Vec<u32>)>,
    pub listeners_changed: bool,
    /// Listeners whose ANA states changed (their hosts got the ANA change event).
    pub ana_changed: Vec<ListenerInfo>,
    /// Controllers disconnected because their subsystem went away.
    pub controllers_disconnected: usize,
}

impl Reconfigured {
    /// Whether what the discovery log reports changed.
    pub fn discovery_changed(&self) -> bool {
        !self.subsystems_added.is_empty()
            || !self.subsystems_removed.is_empty()
            || !self.subsystems_replaced.is_empty()
            || !self.hosts_changed.is_empty()
            || self.listeners_changed
    }
    /// Nothing changed at all.
    pub fn is_empty(&self) -> bool {
        !self.discovery_changed()
            && self.namespaces_changed.is_empty()
            && self.ana_changed.is_empty()
    }
}

/// Data movement a parsed command needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xfer {
    None,
    /// Host to controller: this many bytes must be in the slot buffer before `execute`.
    FromHost(u32),
    /// Controller to host: up to this many bytes come back from `execute`/the backend.
    ToHost(u32),
}

/// A parsed command, kept in the transport's request slot until completion.
#[derive(Debug)]
pub struct Cmd {
    pub sqe: Sqe,
    pub xfer: Xfer,
    /// The data SGL; `None` when the command moves no data.
    pub sgl: Option<Sgl>,
    /// The range-lock registration of an executing write (see `rangelock`), given back when
    /// the core sees its completion ([`Queue::complete_io`] or [`Queue::abandon`]).
    pub(crate) hold: rangelock::Held,
    /// The part of the data in the slot buffer now: all of it, or for a transfer larger than
    /// the buffer the current piece (see [`Cmd::next_piece`]).
    pub piece: Piece,
}

/// Bytes `offset..offset + len` of a command's data: what its slot buffer holds now (from
/// byte 0 of the buffer). Every piece but the last is as long as the buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Piece {
    pub offset: u32,
    pub len: u32,
}

impl Cmd {
    /// The placeholder a transport keeps for a command the core refused at parse.
    pub fn refused(sqe: Sqe) -> Cmd {
        Cmd {
            sqe,
            xfer: Xfer::None,
            sgl: None,
            hold: rangelock::Held::NONE,
            piece: Piece::default(),
        }
    }

    /// The command's data length (either direction).
    pub fn data_len(&self) -> u32 {
        match self.xfer {
            Xfer::None => 0,
            Xfer::FromHost(n) | Xfer::ToHost(n) => n,
        }
    }

    /// Whether the current piece ends the data (always, for a command moved in one go).
    pub fn is_last_piece(&self) -> bool {
        self.piece.offset + self.piece.len >= self.data_len()
    }

    /// Moves on to the next piece; false (and nothing changes) after the last.
    pub fn next_piece(&mut self) -> bool {
        if self.is_last_piece() {
            return false;
        }
        let unit = self.piece.len;
        self.piece.offset += unit;
        self.piece.len = unit.min(self.data_len() - self.piece.offset);
        true
    }
}

/// A copy of the command without its range-lock registration (that stays with the original).
impl Clone for Cmd {
    fn clone(&self) -> Cmd {
        Cmd {
            sqe: self.sqe,
            xfer: self.xfer,
            sgl: self.sgl,
            hold: rangelock::Held::NONE,
            piece: self.piece,
        }
    }
}

/// A backend operation. Offsets and lengths are bytes, already range-checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoOp {
    pub device: u32,
    pub kind: IoKind,
    pub offset: u64,
    pub len: u32,
}

impl IoOp {
    /// A Compare and Write run as one backend op: the command ID of the Write whose buffer it
    /// needs (the transport lends it with [`IoOp::lend_write_buf`]).
    pub fn caw_write_cid(&self) -> Option<u16> {
        match self.kind {
            IoKind::CompareAndWrite { write_cid, .. } => Some(write_cid),
            _ => None,
        }
    }

    /// Names the Write's buffer in a Compare and Write op.
    pub fn lend_write_buf(&mut self, buf: Option<u32>) {
        if let IoKind::CompareAndWrite { write_buf, .. } = &mut self.kind {
            *write_buf = buf;
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    /// A Write with Force Unit Access (CDW12 bit 30): durable when it completes.
    WriteFua,
    Flush,
    WriteZeroes,
    /// Deallocate byte ranges: the first `ranges` entries of the command's buffer (the one
    /// `execute` was given, which the transport hands the backend with the op), written there
    /// over the DSM range list they came from (see [`trim_ranges`]).
    Trim {
        ranges: u16,
    },
    /// Read the range and compare it with the command's buffer (the host's data): the op
    /// fails with EILSEQ where they differ (Compare Failure).
    Compare,
    /// A fused Compare and Write as one operation of a store that has it (RBD: librbd's
    /// compare-and-write, one operation on the OSD, so atomic against every gateway of a
    /// shared image; see [`NamespaceSpec::native_caw`]): compare the range with the command's
    /// buffer (the Compare's data) and, only where it is equal, write the Write's data there;
    /// fails with EILSEQ on a difference. The core names the Write by its command ID
    /// (`write_cid`, a command the transport holds deferred with its data); the transport,
    /// which owns the buffers, fills in `write_buf` before it submits.
    CompareAndWrite {
        write_cid: u16,
        write_buf: Option<u32>,
    },
}

/// One entry of a Trim's range list in the command buffer: byte offset then byte length, each
/// a little-endian u64. The same size as a DSM range, so `execute` rewrites the host's list in
/// place and a Trim allocates nothing.
pub const TRIM_RANGE_SIZE: usize = 16;

/// The (offset, length) byte ranges of a Trim of `count` ranges, from its command buffer (an
/// entry the buffer is too short for is not returned).
pub fn trim_ranges(buf: &[u8], count: u16) -> impl Iterator<Item = (u64, u64)> + '_ {
    buf.chunks_exact(TRIM_RANGE_SIZE)
        .take(count as usize)
        .map(|e| {
            let (off, len) = e.split_at(8);
            (
                u64::from_le_bytes(off.try_into().expect("8 bytes")),
                u64::from_le_bytes(len.try_into().expect("8 bytes")),
            )
        })
}

/// Writes entry `i` of a Trim's range list into `buf`.
pub fn put_trim_range(buf: &mut [u8], i: usize, offset: u64, len: u64) {
    let e = &mut buf[i * TRIM_RANGE_SIZE..(i + 1) * TRIM_RANGE_SIZE];
    e[..8].copy_from_slice(&offset.to_le_bytes());
    e[8..].copy_from_slice(&len.to_le_bytes());
}

/// What `execute` decided.
#[derive(Debug)]
pub enum Exec {
    /// Finished now. For `Xfer::ToHost`, the first `data_len` bytes of the buffer go to the host
    /// before the CQE.
    Done { cqe: Cqe, data_len: u32 },
    /// Run this on the backend with the slot buffer, then call [`Queue::complete_io`].
    Io(IoOp),
    /// Completes later (an Asynchronous Event Request; a write waiting for a range lock; a
    /// fused command waiting for its partner): the slot keeps its buffer, and the queue's
    /// events say what becomes of it ([`QueueEvent::Complete`] or [`QueueEvent::Resume`]).
    Deferred,
}

/// Something the queue wants the transport to do outside a command's own flow.
#[derive(Debug)]
pub enum QueueEvent {
    /// Send this CQE (a completed AER, a deferred command that failed): the slot of the
    /// deferred command with this CID completes without data.
    Complete(Cqe),
    /// Execute the deferred command with this CID again ([`Queue::execute`] with its slot's
    /// buffer) and carry out what that returns.
    Resume(u16),
    /// Tear the connection down (keep-alive expiry, controller reset/fatal, shutdown).
    Disconnect(&'static str),
}

/// One submission/completion queue pair's protocol state (one per connection).
pub struct Queue {
    target: Arc<Target>,
    caps: TransportCaps,
    limits: QueueLimits,
    /// The remote address, for logs.
    peer: String,
    link: queue::Link,
    qid: u16,
    /// sqsize + 1; 0 until connected.
    depth: u16,
    /// SQ head as reported in CQEs: entries consumed so far, modulo `depth`.
    sqhd: u16,
    /// Connect asked for SQ flow control off (CATTR bit 2): CQEs carry SQHD FFFFh.
    sqhd_disabled: bool,
    /// Identity of this queue (a qid can be reused by a later connection).
    token: u64,
    /// The last `now` the transport passed in and it on the controller's clock (ns since the
    /// controller's creation): the commands of one poller pass share one `now`, so each I/O's
    /// start, keep-alive stamp and completion reuse one conversion.
    clock: std::cell::Cell<Option<(Instant, u64)>>,
    counters: Arc<queue::Counters>,
    ns_cache: Option<(u64, Arc<subsystem::NsTable>)>,
    events: VecDeque<QueueEvent>,
    /// In-band authentication of this queue.
    auth: auth::QueueAuth,
    /// A Reservation Acquire (Preempt and Abort) waiting for the preempted hosts' writes.
    fence: Option<queue::Fence>,
    /// A reservation command whose change is being saved.
    resv_save: Option<queue::ResvSave>,
    /// Reservation commands waiting for a save to end (this queue's, or another's on the same
    /// namespace): (CID, NSID).
    resv_waiting: Vec<(u16, u32)>,
    /// Fused Compare and Write pairs in progress on this queue.
    fused: fused::Fused,
    /// Writes deferred because a range lock was in the way: (CID, NSID, byte offset, length).
    blocked: Vec<(u16, u32, u64, u64)>,
    /// A Disconnect event was handed out already.
    teardown_sent: bool,
    /// Identify MDTS and the transfer limit it states.
    mdts: u8,
    max_xfer: u32,
    waker: Option<Waker>,
    /// The target-side address of this connection: which listener it came through (what it
    /// serves, its ANA states), and the address wildcard listeners report in the discovery log.
    local_addr: Option<std::net::SocketAddr>,
    /// This queue's listener's ANA states, as of the target's ANA generation.
    ana: Option<(u64, Arc<Vec<u8>>)>,
    /// The TLS PSK identity the connection's channel was made with: its host and subsystem
    /// NQNs must be the Connect's.
    tls: Option<nvme::tls::PskIdentity>,
}

impl Queue {
    /// A new, unconnected queue with NVMe/TCP's limits ([`QueueLimits::tcp`]): the first
    /// command must be a Fabrics Connect.
    pub fn new(target: Arc<Target>, caps: TransportCaps, peer: String) -> Queue {
        let limits = QueueLimits::tcp(&caps);
        Queue::build(target, caps, limits, peer)
    }
    /// A new, unconnected queue on a connection that can carry only `limits`.
    pub fn with_limits(
        target: Arc<Target>,
        caps: TransportCaps,
        limits: QueueLimits,
        peer: String,
    ) -> Queue {
        Queue::build(target, caps, limits, peer)
    }
    /// The most in-capsule data a command may carry on this queue now (its limits as an admin
    /// queue until an I/O Connect succeeded).
    pub fn in_capsule_limit(&self) -> u32 {
        self.in_capsule_now()
    }
    /// Whether the host disabled SQ flow control at Connect (CATTR bit 2): CQEs carry SQHD
    /// FFFFh, and an NVMe/TCP C2HData PDU may then complete the command (SUCCESS flag).
    pub fn sq_flow_control_disabled(&self) -> bool {
        self.sqhd_disabled
    }
    /// Whether the data transfer that ends a successful command may complete it without a
    /// response capsule (NVMe/TCP: the SUCCESS flag on the last C2HData PDU, TP 8000 / NVMe/TCP
    /// 1.0 section 3.6.2.7): where the host disabled SQ flow control, or everywhere when the
    /// target is set to (`target.c2h_success: always`).
    pub fn data_completes_success(&self) -> bool {
        self.sqhd_disabled || self.target.inner().params.data_completes_always
    }
    /// Queue id, once connected.
    pub fn qid(&self) -> Option<u16> {
        self.ctrl().map(|_| self.qid)
    }
    /// Queue depth (sqsize + 1) once connected; 0 before.
    pub fn depth(&self) -> u16 {
        self.depth
    }
    /// The controller ID, once connected.
    pub fn cntlid(&self) -> Option<u16> {
        self.ctrl().map(|c| c.cntlid)
    }
    /// The largest data transfer one command may ask for (what Identify MDTS states).
    pub fn max_transfer(&self) -> u32 {
        self.max_xfer
    }
    /// This queue's counters.
    pub fn stats(&self) -> QueueStats {
        self.counters.snapshot()
    }
    /// The target-side address of this connection (`TcpStream::local_addr()`, the RDMA CM
    /// id's local address): it tells which listener the host came through (what that serves,
    /// its ANA states), and the discovery log reports its IP for wildcard listeners.
    pub fn set_local_addr(&mut self, local: std::net::SocketAddr) {
        self.local_addr = Some(local);
    }
    /// The connection runs over TLS made with `identity` (NVMe/TCP 1.1 3.6.1.5: a Connect
    /// whose Host NQN or Subsystem NQN is not the identity's is refused).
    pub fn set_tls_identity(&mut self, identity: nvme::tls::PskIdentity) {
        self.tls = Some(identity);
    }
    /// Register a function to call (from any thread) when [`Queue::poll_event`] has
    /// something: an AER completion, or a teardown decided elsewhere (controller reset from the
    /// admin queue, keep-alive expiry).
    pub fn set_waker(&mut self, waker: Waker) {
        self.install_waker(waker)
    }
    /// Parse a command: validate it, decide its data direction and length. `now` (the
    /// transport's clock, read once per pass) starts the command's latency.
    pub fn parse(&mut self, sqe: &Sqe, now: Instant) -> Result<Cmd, Cqe> {
        self.parse_cmd(sqe, now)
    }
    /// Execute a parsed command whose host data (if any) is in `buf`; again, with the same
    /// buffer, when [`QueueEvent::Resume`] names a deferred command.
    pub fn execute(&mut self, cmd: &mut Cmd, buf: &mut [u8], now: Instant) -> Exec {
        self.execute_cmd(cmd, buf, now)
    }
    /// Completion of a backend op: `Ok(())` or the errno it failed with, at `now`. For a
    /// command moved in pieces, of its last piece (see [`Queue::piece_done`]).
    pub fn complete_io(&mut self, cmd: &mut Cmd, res: Result<(), i32>, now: Instant) -> Cqe {
        self.complete_io_cmd(cmd, res, now)
    }
    /// Completion of the backend op of a piece that is not the last: `None` to go on with
    /// the next piece ([`Cmd::next_piece`], then move its data and `execute` again), or the
    /// CQE that ends the command (the piece failed).
    pub fn piece_done(&mut self, cmd: &mut Cmd, res: Result<(), i32>, now: Instant) -> Option<Cqe> {
        self.leave_range(cmd);
        match res {
            Ok(()) => None,
            Err(_) => Some(self.complete_io_cmd(cmd, res, now)),
        }
    }
    /// A backend op completed on a connection that is closing (no CQE will be sent): what the
    /// command held (a range-lock registration) is given back.
    pub fn abandon(&mut self, cmd: &mut Cmd) {
        self.leave_range(cmd)
    }
    /// Completion with a transport-detected status (e.g. a data transfer error), at `now`.
    pub fn complete_status(&mut self, cmd: &Cmd, status: Status, now: Instant) -> Cqe {
        self.complete_with_status(cmd, status, now)
    }
    /// Next instant `handle_timeout` must be called at.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_timeout()
    }
    pub fn handle_timeout(&mut self, now: Instant) {
        self.on_timeout(now)
    }
    /// Events for the transport (completed AERs, disconnect requests).
    pub fn poll_event(&mut self) -> Option<QueueEvent> {
        self.next_event()
    }
    /// The transport connection is gone; release what the queue holds.
    pub fn disconnected(&mut self) {
        self.release()
    }
}

// Transports move queues to poller threads and share the target between them.
const _: () = {
    const fn send<T: Send>() {}
    const fn send_sync<T: Send + Sync>() {}
    send::<Queue>();
    send::<Cmd>();
    send_sync::<Target>();
};

impl Drop for Queue {
    fn drop(&mut self) {
        self.release()
    }
}
