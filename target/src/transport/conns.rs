//! What a poller asks of a transport, and what the two share: the [`Conns`] interface the
//! loop (`poller`) drives each transport's connections through (`tcp::TcpConns`,
//! `rdma::conns::RdmaConns`), the [`Cx`] they borrow from the poller while they handle an
//! event, their epoll keys, the counters a poller publishes, and the [`PollerHandle`] through
//! which acceptors and the rdma_cm thread hand a poller its connections.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nix::sys::epoll::{Epoll, EpollFlags};

use super::rdma::conns::{RdmaMsg, VerbsStats};
use super::tcp::tls::Accepted;
use super::thread::PollerThread;
use super::{ConnStats, DeviceUpdate, Kind, ReqRef};
use crate::store::RingStore;

/// Epoll key bit of an RDMA completion channel (the low bits name the device); a key without
/// it is a TCP connection's.
pub(crate) const RDMA_KEY: u64 = 1 << 62;
/// The epoll key under which a transport registers its descriptor `index` (a TCP connection's
/// key, an RDMA device's index).
pub(crate) fn epoll_key(kind: Kind, index: u32) -> u64 {
    match kind {
        Kind::Tcp => u64::from(index),
        Kind::Rdma => RDMA_KEY | u64::from(index),
    }
}

/// Counters of one transport's connections on a poller.
#[derive(Debug, Default)]
pub struct TransportStats {
    /// Live connections (queues).
    pub connections: AtomicUsize,
    /// Commands received.
    pub commands: AtomicU64,
    /// Completions with an error status, protocol errors, failed work requests.
    pub errors: AtomicU64,
    /// Payload bytes the CPU copied in user space (in-capsule write data into pool buffers).
    pub copied_bytes: AtomicU64,
    /// Bytes received from hosts (PDUs; RDMA: capsules plus bytes RDMA READ).
    pub rx_bytes: AtomicU64,
    /// Bytes sent to hosts (PDUs; RDMA: responses plus bytes RDMA WRITTEN).
    pub tx_bytes: AtomicU64,
    /// Read payload bytes sent to hosts.
    pub tx_payload: AtomicU64,
}

impl TransportStats {
    pub(crate) fn store(&self, connections: usize, t: &ConnStats) {
        self.connections.store(connections, Ordering::Relaxed);
        self.commands.store(t.commands, Ordering::Relaxed);
        self.errors.store(t.errors, Ordering::Relaxed);
        self.copied_bytes.store(t.copied_bytes, Ordering::Relaxed);
        self.rx_bytes.store(t.rx_bytes, Ordering::Relaxed);
        self.tx_bytes.store(t.tx_bytes, Ordering::Relaxed);
        self.tx_payload.store(t.tx_payload, Ordering::Relaxed);
    }
}

/// Counters a poller publishes every tick and when connections come and go (read by
/// stats/metrics and tests).
#[derive(Debug, Default)]
pub struct PollerStats {
    pub tcp: TransportStats,
    pub rdma: TransportStats,
    /// Registered I/O buffers held by commands (returns to 0 when idle).
    pub buffers_in_use: AtomicUsize,
    /// io_uring_enter system calls of this poller's backend ring so far.
    pub ring_enters: AtomicU64,
    /// NVMe/TCP sends through the socket ring, and the io_uring_enter calls that made them.
    pub tcp_ring_sends: AtomicU64,
    pub tcp_ring_send_enters: AtomicU64,
    /// Nanoseconds of passes that did work, of passes that spun without work, and blocked in
    /// epoll, so far.
    pub work_ns: AtomicU64,
    pub spin_ns: AtomicU64,
    pub sleep_ns: AtomicU64,
    /// The wake-up latency the poller's spin policy works with.
    pub wake_latency_ns: AtomicU64,
    /// Memory regions, shared receive queues and request states of the RDMA connections.
    pub verbs: VerbsStats,
    /// NVMe/TCP request slots in each [`SlotState`](super::tcp::SlotState) over all
    /// connections (index = state).
    pub tcp_requests: [AtomicU32; super::tcp::SLOT_STATES],
}

/// What a transport's connections borrow from their poller while they handle an event.
pub(crate) struct Cx<'a> {
    pub store: &'a mut RingStore,
    /// The poller's FIFO of requests waiting for a pool buffer.
    pub need_buf: &'a mut VecDeque<ReqRef>,
    pub epoll: &'a Epoll,
    pub now: Instant,
}

/// The connections of one transport on a poller: all the loop asks of a transport.
pub(crate) trait Conns {
    /// The descriptor this transport registered under epoll key `key` (see [`epoll_key`]) is
    /// ready. False if nothing is registered there any more.
    fn ready(&mut self, key: u32, flags: EpollFlags, cx: &mut Cx<'_>) -> bool;
    /// Look for work that epoll does not report (RDMA completion queues). True on progress.
    fn poll(&mut self, cx: &mut Cx<'_>) -> bool;
    /// A backend operation of request `slot` of connection `conn` finished. False if the
    /// connection is gone.
    fn backend_done(
        &mut self,
        conn: u32,
        slot: u32,
        res: Result<u32, i32>,
        cx: &mut Cx<'_>,
    ) -> bool;
    /// Whether connection `conn` still takes a buffer it waited for.
    fn takes_buffer(&self, conn: u32) -> bool;
    fn buffer_granted(&mut self, conn: u32, slot: u32, buf: u32, cx: &mut Cx<'_>);
    /// Timers: keep-alive, core events, drain deadlines.
    fn tick(&mut self, cx: &mut Cx<'_>);
    /// The poller was woken (a core event may wait).
    fn woken(&mut self, cx: &mut Cx<'_>);
    /// Send what is queued; release finished connections. True if anything was sent that no
    /// readiness event accounts for (RDMA responses staged by this pass).
    fn flush(&mut self, cx: &mut Cx<'_>) -> bool;
    /// The poller is about to block in epoll: arm what must wake it, then look once more.
    /// True if there was work after all.
    fn prepare_sleep(&mut self, cx: &mut Cx<'_>) -> bool;
    /// Tear every connection down (shutdown).
    fn close_all(&mut self, reason: &str, cx: &mut Cx<'_>);
    /// Release every connection, finished or not (the end of shutdown).
    fn remove_all(&mut self, cx: &mut Cx<'_>);
    /// Connections held.
    fn live(&self) -> usize;
    /// Whether this half left a descriptor ready that no new signal will report (a socket it
    /// stopped reading before it was empty): the next busy pass must ask epoll, which reports
    /// it again (level-triggered), while the readiness watch only sees new signals.
    fn left_ready(&self) -> bool {
        false
    }
    /// Whether a sleep of the poller now waits on something other than sockets (RDMA
    /// completion channels), whose wake-ups the adaptive policy did not measure
    /// ([`super::adaptive::SpinPolicy::next_window`]).
    fn sleeps_unmeasured(&self) -> bool {
        false
    }
    fn publish(&mut self, stats: &PollerStats, cx: &mut Cx<'_>);
}

/// What a poller takes on its channel (each send also wakes it).
pub(crate) enum ToPoller {
    /// A new NVMe/TCP connection from an acceptor.
    Tcp(Accepted),
    /// From the rdma_cm thread.
    Rdma(RdmaMsg),
    /// A backend device slot changed (configuration reload).
    Device(DeviceUpdate),
}

/// The handle acceptors, the rdma_cm thread and the daemon use to reach a poller.
pub struct PollerHandle {
    pub(crate) thread: PollerThread<ToPoller, PollerStats>,
}

impl PollerHandle {
    pub fn give(&self, a: Accepted) {
        self.thread.send(ToPoller::Tcp(a));
    }

    pub(crate) fn send_rdma(&self, m: RdmaMsg) -> bool {
        self.thread.send(ToPoller::Rdma(m))
    }

    pub fn wake(&self) {
        self.thread.wake();
    }

    /// Hand the poller a device slot change (configuration reload); false if it is gone.
    pub fn update_device(&self, u: DeviceUpdate) -> bool {
        self.thread.send(ToPoller::Device(u))
    }

    pub fn stats(&self) -> &Arc<PollerStats> {
        &self.thread.stats
    }

    pub fn join(&mut self) {
        self.thread.join();
    }
}
