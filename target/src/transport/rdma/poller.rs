//! RDMA poller threads: each owns its connections (QPs and their CQs), its io_uring ring and
//! buffer pool, and per RDMA device a protection domain, a completion channel and the pool's
//! memory region. Run-to-completion, no locks on the I/O path; busy-polls while there is
//! traffic and sleeps in epoll (completion channels, a wake eventfd) after `idle_poll`.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use ::rdma::{
    AccessFlags, CmEventType, CmId, CompChannel, Context, Mr, Pd, Transport, WorkCompletion,
};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::EventFd;
use nvme::rdma::CmReject;
use tracing::{debug, error, info, warn};

use super::conn::{Conn, Env, Setup};
use super::params::{check_connect, size_queue, DeviceLimits};
use super::request::{ReqState, STATE_COUNT};
use super::srq::SharedRecv;
use super::{CmNote, RdmaOptions};
use crate::core::{Target, TransportCaps};
use crate::store::RingStore;
use crate::transport::thread::PollerThread;
use crate::transport::{ConnStats, DeviceUpdate, Store};

const WAKE_KEY: u64 = u64::MAX;
/// Timer granularity for keep-alive checks, core events and the drain deadline.
const TICK: Duration = Duration::from_millis(50);
/// Completions taken per CQ poll.
const WC_BATCH: usize = 32;
/// How long shutdown waits for flushes and backend operations.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

/// Counters an RDMA poller publishes (every tick, and when connections go away).
#[derive(Debug, Default)]
pub struct RdmaPollerStats {
    /// Live NVMe/RDMA connections (queues).
    pub connections: AtomicUsize,
    /// Commands received.
    pub commands: AtomicU64,
    /// Completions with an error status, and failed work requests.
    pub errors: AtomicU64,
    /// Payload bytes the CPU copied (in-capsule write data into pool buffers).
    pub copied_bytes: AtomicU64,
    /// Capsule bytes received plus bytes RDMA READ from hosts.
    pub rx_bytes: AtomicU64,
    /// Response bytes sent plus bytes RDMA WRITTEN to hosts.
    pub tx_bytes: AtomicU64,
    /// Read payload bytes RDMA WRITTEN to hosts.
    pub tx_payload: AtomicU64,
    /// Pool buffers currently handed out.
    pub buffers_in_use: AtomicUsize,
    /// io_uring_enter system calls of this poller's backend ring so far.
    pub ring_enters: AtomicU64,
    /// Memory regions registered now: one pool region per device in use (plus its shared
    /// receive area with `rdma_srq_depth`), two per connection (RECV and response buffers;
    /// only the response buffers on a shared receive queue), one per iWARP RDMA READ in flight.
    pub mrs_registered: AtomicUsize,
    /// RECVs posted now on this poller's shared receive queues (all devices; 0 without
    /// `rdma_srq_depth`). Back to `rdma_srq_depth` per device once no capsule is held.
    pub srq_recvs_posted: AtomicUsize,
    /// Per-I/O memory regions registered so far (iWARP RDMA READ sinks).
    pub io_mrs_total: AtomicU64,
    /// Requests in each [`ReqState`] over all connections (index = state).
    pub requests: [AtomicU32; STATE_COUNT],
    /// For diagnostics and tests: every memory region the poller holds, as of the last publish
    /// (read with [`RdmaPollerStats::regions`]).
    regions: Mutex<Vec<RegionInfo>>,
    /// For tests: the last iWARP RDMA READ sink registered (its key and rights), kept after the
    /// sink is deregistered so a test can check that the key no longer works.
    last_read_sink: Mutex<Option<RegionInfo>>,
}

/// What a memory region the RDMA poller holds is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// The poller's buffer pool, once per device.
    Pool,
    /// A connection's RECV buffers.
    Recv,
    /// The shared receive queue's RECV buffers, once per device (`rdma_srq_depth > 0`).
    SrqRecv,
    /// A connection's response (SEND) buffers.
    Response,
    /// iWARP: one request's RDMA READ sink, registered while its READ is in flight.
    ReadSink,
}

/// A memory region the RDMA poller holds: where it is, its keys and its access rights (the
/// rights it was registered with, [`Mr::access`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    pub kind: RegionKind,
    pub addr: u64,
    pub len: usize,
    pub lkey: u32,
    pub rkey: u32,
    pub access: AccessFlags,
}

impl RegionInfo {
    pub(super) fn of(kind: RegionKind, mr: &Mr) -> RegionInfo {
        RegionInfo {
            kind,
            addr: mr.addr(),
            len: mr.len(),
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            access: mr.access(),
        }
    }
}

impl RdmaPollerStats {
    /// Requests currently in `state`.
    pub fn requests_in(&self, state: ReqState) -> u32 {
        self.requests[state as usize].load(Ordering::Relaxed)
    }

    /// For diagnostics and tests: the memory regions the poller held at its last publish
    /// (every 50 ms and whenever a connection goes away): the pool region per device (and its
    /// shared receive area), each connection's RECV and response regions, and the iWARP READ
    /// sinks in flight then.
    pub fn regions(&self) -> Vec<RegionInfo> {
        self.regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// For tests: takes the record of the last iWARP RDMA READ sink registered since the last
    /// call (published with the other counters). The region itself is deregistered when its
    /// READ completes; the record stays so a test can try the stale key.
    pub fn take_last_read_sink(&self) -> Option<RegionInfo> {
        self.last_read_sink
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// What the CM thread hands a poller.
pub(super) enum ToPoller {
    /// A CONNECT_REQUEST routed to this poller (the id is tagged `tag` already).
    Connect {
        tag: u64,
        id: Arc<CmId>,
        private_data: Vec<u8>,
        /// The event's `initiator_depth`: the host's responder resources (IRD).
        peer_ird: u8,
    },
    /// A CM event for one of this poller's connections.
    Event {
        tag: u64,
        kind: CmEventType,
        status: i32,
    },
    /// The device reported a fatal QP event for one of this poller's connections.
    QpFatal { tag: u64, what: &'static str },
    /// IBV_EVENT_QP_LAST_WQE_REACHED for one of this poller's connections (on an SRQ).
    LastWqeReached { tag: u64 },
    /// A backend device slot changed (configuration reload).
    Device(DeviceUpdate),
}

/// The CM thread's handle on a poller.
pub(super) type RdmaPollerHandle = PollerThread<ToPoller, RdmaPollerStats>;

/// Settings of one RDMA poller.
#[derive(Clone)]
pub(super) struct PollerCfg {
    pub id: usize,
    pub caps: TransportCaps,
    pub idle_poll: Duration,
    pub options: RdmaOptions,
    pub stop: Arc<AtomicBool>,
}

/// Starts a poller thread; `make_store` runs on it (rings are per thread).
pub(super) fn spawn<F>(
    target: Arc<Target>,
    cfg: PollerCfg,
    notes: mpsc::Sender<CmNote>,
    make_store: F,
) -> std::io::Result<RdmaPollerHandle>
where
    F: FnOnce() -> std::io::Result<RingStore> + Send + 'static,
{
    PollerThread::spawn(
        format!("nvmf-rdma-{}", cfg.id),
        "RDMA poller",
        move |rx, wake, stats| {
            let store = make_store()?;
            let mut p = Poller::new(target, cfg, store, rx, wake, stats, notes)?;
            Ok(move || p.run())
        },
    )
}

/// A device this poller serves connections on.
pub(super) struct DevRes {
    // Field order is drop order: the shared receive queue and the pool's memory region before
    // their PD.
    /// The shared receive queue (`rdma_srq_depth > 0` and the device has SRQs).
    pub srq: Option<SharedRecv>,
    /// The poller's whole buffer pool, `LOCAL_WRITE`: RDMA WRITE sources, and RDMA READ sinks
    /// on InfiniBand/RoCE.
    pub pool_mr: Mr,
    pub chan: Arc<CompChannel>,
    pub pd: Arc<Pd>,
    pub ctx: Arc<Context>,
    /// iWARP (siw): READ sinks are registered per I/O with REMOTE_WRITE, 1 SGE.
    pub iwarp: bool,
    pub limits: DeviceLimits,
    /// `max_qp_init_rd_atom`.
    pub max_ord: u32,
    pub send_with_inv: bool,
    pub name: String,
}

struct Poller {
    // Field order is drop order: connections (QPs, CQs, their regions, per-I/O regions on pool
    // memory), then the devices (pool regions), then the store, which owns the pool memory.
    conns: Vec<Option<Conn>>,
    devs: Vec<DevRes>,
    store: RingStore,
    target: Arc<Target>,
    cfg: PollerCfg,
    rx: mpsc::Receiver<ToPoller>,
    wake: Arc<EventFd>,
    notes: mpsc::Sender<CmNote>,
    stats: Arc<RdmaPollerStats>,
    epoll: Epoll,
    /// rdma_cm tag -> connection key.
    tags: HashMap<u64, u32>,
    free_keys: Vec<u32>,
    need_buf: VecDeque<(u32, u32)>,
    done: Vec<(u64, Result<u32, i32>)>,
    wcs: Vec<WorkCompletion>,
    closed_totals: ConnStats,
    closed_io_mrs: u64,
}

impl Poller {
    fn new(
        target: Arc<Target>,
        cfg: PollerCfg,
        store: RingStore,
        rx: mpsc::Receiver<ToPoller>,
        wake: Arc<EventFd>,
        stats: Arc<RdmaPollerStats>,
        notes: mpsc::Sender<CmNote>,
    ) -> std::io::Result<Poller> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&*wake, EpollEvent::new(EpollFlags::EPOLLIN, WAKE_KEY))?;
        Ok(Poller {
            conns: Vec::new(),
            devs: Vec::new(),
            store,
            target,
            cfg,
            rx,
            wake,
            notes,
            stats,
            epoll,
            tags: HashMap::new(),
            free_keys: Vec::new(),
            need_buf: VecDeque::with_capacity(1024),
            done: Vec::with_capacity(1024),
            wcs: vec![WorkCompletion::default(); WC_BATCH],
            closed_totals: ConnStats::default(),
            closed_io_mrs: 0,
        })
    }

    fn run(&mut self) {
        let mut events = vec![EpollEvent::empty(); 16];
        let mut last_work = Instant::now();
        let mut next_tick = Instant::now() + TICK;
        loop {
            if self.cfg.stop.load(Ordering::Relaxed) {
                self.shutdown();
                return;
            }
            let now = Instant::now();
            let mut progress = self.drain_control(now);
            progress |= self.poll_cqs(now);
            progress |= self.reap_backend(now);
            progress |= self.grant_buffers(now);
            if now >= next_tick {
                next_tick = now + TICK;
                self.tick(now);
            }
            // Last in the pass: everything above may have staged responses.
            progress |= self.flush_sends(now);
            self.remove_finished();
            if progress {
                last_work = now;
                continue;
            }
            let busy = now.duration_since(last_work) < self.cfg.idle_poll
                || self.store.inflight() > 0
                || !self.need_buf.is_empty();
            if busy {
                continue;
            }
            // Going to sleep: arm every CQ, then look once more for completions that arrived
            // before the arm.
            if self.arm_cqs(now) {
                last_work = now;
                continue;
            }
            let ms = next_tick
                .saturating_duration_since(Instant::now())
                .as_millis()
                .clamp(1, 1000) as u16;
            let n = match self.epoll.wait(&mut events, EpollTimeout::from(ms)) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => {
                    error!(error = %e, "epoll_wait failed; RDMA poller exits");
                    return;
                }
            };
            for ev in &events[..n] {
                if ev.data() == WAKE_KEY {
                    let _ = self.wake.read();
                } else if let Some(d) = self.devs.get(ev.data() as usize) {
                    // Acknowledge the completion events; the CQs are polled next.
                    loop {
                        match d.chan.try_get_event() {
                            Ok(Some(_)) => {}
                            Ok(None) => break,
                            Err(e) => {
                                warn!(device = %d.name, error = %e, "reading the completion channel failed");
                                break;
                            }
                        }
                    }
                }
            }
            if n > 0 {
                last_work = Instant::now();
            }
        }
    }

    /// Runs `f` on connection `k` with its environment borrowed from the poller.
    fn with_conn<R>(
        &mut self,
        k: usize,
        now: Instant,
        f: impl FnOnce(&mut Conn, &mut Env<'_>) -> R,
    ) -> Option<R> {
        let Poller {
            conns,
            devs,
            store,
            need_buf,
            ..
        } = self;
        let c = conns.get_mut(k)?.as_mut()?;
        let mut env = Env {
            store,
            dev: &devs[c.dev],
            need_buf,
            now,
        };
        Some(f(c, &mut env))
    }

    fn drain_control(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Ok(m) = self.rx.try_recv() {
            any = true;
            match m {
                ToPoller::Connect {
                    tag,
                    id,
                    private_data,
                    peer_ird,
                } => self.on_connect(tag, id, &private_data, peer_ird),
                ToPoller::Event { tag, kind, status } => {
                    let Some(&k) = self.tags.get(&tag) else {
                        debug!(tag, event = %kind, "CM event for a connection already released");
                        continue;
                    };
                    self.with_conn(k as usize, now, |c, env| match kind {
                        CmEventType::Established => c.established(env),
                        CmEventType::Disconnected => c.close("host disconnected", env),
                        CmEventType::TimewaitExit => c.close("time-wait exit", env),
                        CmEventType::DeviceRemoval => c.close("RDMA device removed", env),
                        CmEventType::AddrChange => c.close("address changed", env),
                        other => {
                            if !c.is_closing() {
                                warn!(peer = %c.peer, event = %other, status, "connection failed");
                            }
                            c.close("connection error", env)
                        }
                    });
                }
                ToPoller::Device(u) => u.apply(&mut self.store),
                ToPoller::LastWqeReached { tag } => {
                    if let Some(&k) = self.tags.get(&tag) {
                        self.with_conn(k as usize, now, |c, _| c.last_wqe_reached());
                    }
                }
                ToPoller::QpFatal { tag, what } => {
                    if let Some(&k) = self.tags.get(&tag) {
                        self.with_conn(k as usize, now, |c, env| {
                            if !c.is_closing() {
                                warn!(peer = %c.peer, event = what, "queue pair error");
                            }
                            c.close(what, env)
                        });
                    }
                }
            }
        }
        any
    }

    /// A CONNECT_REQUEST: check it, set the queue pair up with every RECV posted, accept.
    fn on_connect(&mut self, tag: u64, id: Arc<CmId>, private_data: &[u8], peer_ird: u8) {
        let peer = id
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "?".into());
        let reject = |st: nvme::rdma::CmStatus| {
            if let Err(e) = id.reject(&CmReject::new(st).encode()) {
                debug!(%peer, error = %e, "rdma_reject failed");
            }
        };
        let dev = match self.device_for(&id) {
            Ok(d) => d,
            Err(e) => {
                warn!(%peer, error = %e, "cannot use the RDMA device of a connect request");
                reject(nvme::rdma::CmStatus::NoRsc);
                let _ = self.notes.send(CmNote::Released { tag });
                return;
            }
        };
        let d = &self.devs[dev];
        let caps = &self.cfg.caps;
        let checked = check_connect(
            private_data,
            u32::from(caps.max_queue_depth),
            peer_ird,
            d.max_ord,
        )
        .and_then(|a| {
            size_queue(a.depth, a.req.qid == 0, caps.in_capsule_data, d.limits).map(|z| (a, z))
        });
        let (acc, sizing) = match checked {
            Ok(v) => v,
            Err(st) => {
                info!(%peer, status = %st, "rejecting NVMe/RDMA connect request");
                reject(st);
                let _ = self.notes.send(CmNote::Released { tag });
                return;
            }
        };
        let key = match self.free_keys.pop() {
            Some(k) => k,
            None => {
                self.conns.push(None);
                self.conns.len() as u32 - 1
            }
        };
        let setup = Setup {
            tag,
            key,
            id: id.clone(),
            cm_qid: acc.req.qid,
            sizing,
            ord: acc.ord,
            dev_index: dev,
            dev: d,
            target: self.target.clone(),
            caps: caps.clone(),
            send_with_inv: d.send_with_inv,
        };
        let conn = Conn::new(setup).and_then(|c| c.accept().map(|()| c));
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                warn!(%peer, error = %e, "setting up an NVMe/RDMA queue failed");
                reject(nvme::rdma::CmStatus::NoRsc);
                self.free_keys.push(key);
                let _ = self.notes.send(CmNote::Released { tag });
                return;
            }
        };
        debug!(poller = self.cfg.id, %peer, device = %d.name, qid = acc.req.qid,
            depth = acc.depth, ord = acc.ord, in_capsule = sizing.in_capsule,
            send_wr = sizing.max_send_wr, "accepted NVMe/RDMA connection");
        if let Some(qp_num) = conn.qp_num() {
            let _ = self.notes.send(CmNote::Accepted { tag, qp_num });
        }
        self.tags.insert(tag, key);
        self.conns[key as usize] = Some(conn);
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// The device resources for the device `id` is bound to, created on first use.
    fn device_for(&mut self, id: &CmId) -> Result<usize, ::rdma::Error> {
        if let Some(i) = self.devs.iter().position(|d| id.is_on(&d.ctx)) {
            return Ok(i);
        }
        let ctx = id.context()?.ok_or_else(|| {
            ::rdma::Error::InvalidArgument("the connection is bound to no device".into())
        })?;
        let attr = ctx.query_device()?;
        let pd = Arc::new(Pd::new(&ctx)?);
        let chan = Arc::new(CompChannel::new(&ctx)?);
        let pool = self.store.ring().pool();
        // SAFETY: the region is the poller's whole buffer pool, owned by `self.store`, which
        // is dropped after `self.devs` (field order) and never unmapped before; buffers are
        // only reached by Rust code while no work request names them (the request state
        // machine), and with LOCAL_WRITE only, no peer can write the region.
        let pool_mr = unsafe {
            Mr::register_external(
                &pd,
                pool.base_ptr().as_ptr(),
                pool.len(),
                AccessFlags::LOCAL_WRITE,
            )
        }?;
        let iwarp = ctx.transport() == Transport::Iwarp;
        let send_with_inv = self.cfg.options.send_with_invalidate.enabled(iwarp);
        let name = ctx.name();
        let want = self.cfg.options.srq_depth;
        let srq = if want == 0 {
            None
        } else if attr.max_srq == 0 || attr.max_srq_wr == 0 {
            warn!(poller = self.cfg.id, device = %name,
                "the RDMA device has no shared receive queues: rdma_srq_depth ignored, each \
                 queue pair posts its own RECVs");
            None
        } else {
            let depth = want.min(attr.max_srq_wr);
            if depth < want {
                info!(poller = self.cfg.id, device = %name, rdma_srq_depth = want,
                    max_srq_wr = attr.max_srq_wr, "rdma_srq_depth lowered to the device's maximum");
            }
            Some(SharedRecv::new(&pd, depth, self.cfg.caps.in_capsule_data)?)
        };
        let i = self.devs.len();
        self.epoll
            .add(chan.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
            .map_err(|e| ::rdma::Error::Verbs {
                call: "epoll_ctl",
                errno: e as i32,
            })?;
        info!(poller = self.cfg.id, device = %name, transport = ?ctx.transport(),
            max_qp_wr = attr.max_qp_wr, max_qp_init_rd_atom = attr.max_qp_init_rd_atom,
            send_with_invalidate = send_with_inv, pool_bytes = pool.len(),
            srq_depth = srq.as_ref().map_or(0, |q| q.depth()),
            srq_bytes = srq.as_ref().map_or(0, |q| q.mr().len()),
            "RDMA device ready");
        self.devs.push(DevRes {
            srq,
            pool_mr,
            chan,
            pd,
            ctx,
            iwarp,
            limits: DeviceLimits {
                max_qp_wr: attr.max_qp_wr,
                max_cqe: attr.max_cqe,
            },
            max_ord: attr.max_qp_init_rd_atom,
            send_with_inv,
            name,
        });
        Ok(i)
    }

    fn poll_cqs(&mut self, now: Instant) -> bool {
        let mut any = false;
        let mut wcs = std::mem::take(&mut self.wcs);
        for k in 0..self.conns.len() {
            loop {
                let n = self
                    .with_conn(k, now, |c, env| c.poll(&mut wcs, env))
                    .unwrap_or(0);
                any |= n > 0;
                if n < wcs.len() {
                    break;
                }
            }
        }
        self.wcs = wcs;
        any
    }

    fn reap_backend(&mut self, now: Instant) -> bool {
        self.done.clear();
        self.store.reap(&mut self.done);
        let any = !self.done.is_empty();
        for i in 0..self.done.len() {
            let (ud, res) = self.done[i];
            let (k, slot) = ((ud >> 32) as usize, ud as u32);
            if self
                .with_conn(k, now, |c, env| c.backend_done(slot, res, env))
                .is_none()
            {
                warn!(
                    user_data = ud,
                    "backend completion for a connection that is gone"
                );
            }
        }
        any
    }

    /// Serves requests waiting for a pool buffer, FIFO over all connections.
    fn grant_buffers(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Some(&(k, slot)) = self.need_buf.front() {
            let live = matches!(self.conns.get(k as usize), Some(Some(c)) if !c.is_closing());
            if !live {
                self.need_buf.pop_front();
                continue;
            }
            let Some(b) = self.store.alloc_buf() else {
                break;
            };
            self.need_buf.pop_front();
            self.with_conn(k as usize, now, |c, env| c.buffer_granted(slot, b, env));
            any = true;
        }
        any
    }

    /// Posts every connection's staged responses. True if any were staged.
    fn flush_sends(&mut self, now: Instant) -> bool {
        let mut any = false;
        for k in 0..self.conns.len() {
            any |= self
                .with_conn(k, now, |c, env| c.flush_sends(env))
                .unwrap_or(false);
        }
        any
    }

    /// Arms every CQ and polls once more. True if a completion arrived meanwhile.
    fn arm_cqs(&mut self, now: Instant) -> bool {
        for c in self.conns.iter().flatten() {
            if c.has_qp() {
                if let Err(e) = c.cq().req_notify(false) {
                    warn!(peer = %c.peer, error = %e, "arming a completion queue failed");
                }
            }
        }
        self.poll_cqs(now)
    }

    fn tick(&mut self, now: Instant) {
        for k in 0..self.conns.len() {
            self.with_conn(k, now, |c, env| c.tick(env));
        }
        self.publish();
    }

    fn remove_finished(&mut self) {
        for k in 0..self.conns.len() {
            if matches!(&self.conns[k], Some(c) if c.is_finished()) {
                self.remove(k);
            }
        }
    }

    fn remove(&mut self, k: usize) {
        let Some(c) = self.conns[k].take() else {
            return;
        };
        self.closed_totals.add(&c.stats);
        self.closed_io_mrs += c.io_mrs_total;
        self.tags.remove(&c.tag);
        self.free_keys.push(k as u32);
        self.stats.connections.fetch_sub(1, Ordering::Relaxed);
        debug!(poller = self.cfg.id, peer = %c.peer, qid = ?c.qid(), "NVMe/RDMA connection released");
        if let Some(r) = c.last_read_sink {
            *self
                .stats
                .last_read_sink
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(r);
        }
        let tag = c.tag;
        // Completions still in its CQ may name RECVs of a shared receive queue: give those back.
        let mut c = c;
        c.reclaim_srq_recvs(&self.devs[c.dev]);
        // Destroys the QP, then (unless the CM thread still holds it) the CM id, the CQ and
        // the connection's memory regions.
        drop(c);
        let _ = self.notes.send(CmNote::Released { tag });
        self.publish();
    }

    fn publish(&mut self) {
        self.publish_regions();
        let mut t = self.closed_totals;
        let mut io_mrs_total = self.closed_io_mrs;
        let mut mrs = self.devs.len() + self.devs.iter().filter(|d| d.srq.is_some()).count();
        let srq_posted: u32 = self
            .devs
            .iter()
            .flat_map(|d| &d.srq)
            .map(|q| q.posted())
            .sum();
        let mut states = [0u32; STATE_COUNT];
        for c in self.conns.iter().flatten() {
            t.add(&c.stats);
            io_mrs_total += c.io_mrs_total;
            mrs += c.regions_held() + c.io_mrs;
            for (s, n) in states.iter_mut().zip(c.counts().0) {
                *s += n;
            }
        }
        let s = &self.stats;
        s.commands.store(t.commands, Ordering::Relaxed);
        s.errors.store(t.errors, Ordering::Relaxed);
        s.copied_bytes.store(t.copied_bytes, Ordering::Relaxed);
        s.rx_bytes.store(t.rx_bytes, Ordering::Relaxed);
        s.tx_bytes.store(t.tx_bytes, Ordering::Relaxed);
        s.tx_payload.store(t.tx_payload, Ordering::Relaxed);
        s.buffers_in_use
            .store(self.store.buffers_in_use(), Ordering::Relaxed);
        s.ring_enters
            .store(self.store.ring_enters(), Ordering::Relaxed);
        s.mrs_registered.store(mrs, Ordering::Relaxed);
        s.srq_recvs_posted
            .store(srq_posted as usize, Ordering::Relaxed);
        s.io_mrs_total.store(io_mrs_total, Ordering::Relaxed);
        for (a, n) in s.requests.iter().zip(states) {
            a.store(n, Ordering::Relaxed);
        }
    }

    /// Publishes the regions held now and the last READ sink registered (for diagnostics and
    /// tests). The list is sized for the most the connections can hold (every slot with a READ
    /// sink), so it grows when a connection arrives, never with the number of writes in flight.
    fn publish_regions(&mut self) {
        let most = 2 * self.devs.len()
            + self
                .conns
                .iter()
                .flatten()
                .map(|c| c.max_regions())
                .sum::<usize>();
        let mut regions = self.stats.regions.lock().unwrap_or_else(|e| e.into_inner());
        regions.clear();
        regions.reserve(most);
        for d in &self.devs {
            regions.push(RegionInfo::of(RegionKind::Pool, &d.pool_mr));
            if let Some(q) = &d.srq {
                regions.push(q.region());
            }
        }
        let mut last = None;
        for c in self.conns.iter_mut().flatten() {
            c.regions(&mut regions);
            last = c.last_read_sink.take().or(last);
        }
        drop(regions);
        if last.is_some() {
            *self
                .stats
                .last_read_sink
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = last;
        }
    }

    /// Closes every connection, waits (bounded) for flushes and backend operations, releases
    /// everything.
    fn shutdown(&mut self) {
        let now = Instant::now();
        for k in 0..self.conns.len() {
            self.with_conn(k, now, |c, env| c.close("target shutting down", env));
        }
        let deadline = now + SHUTDOWN_LIMIT;
        loop {
            let now = Instant::now();
            self.poll_cqs(now);
            self.reap_backend(now);
            for k in 0..self.conns.len() {
                // Past the drain limit this destroys QPs whose flushes never came.
                self.with_conn(k, now, |c, env| c.tick(env));
            }
            self.remove_finished();
            if self.conns.iter().all(Option::is_none) || now >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let left = self.conns.iter().flatten().count();
        if left > 0 {
            warn!(
                poller = self.cfg.id,
                connections = left,
                "RDMA connections still busy at shutdown (backend operations in flight)"
            );
        }
        for k in 0..self.conns.len() {
            self.remove(k);
        }
        self.publish();
        // Unregister the devices' descriptors before the channels close.
        for d in &self.devs {
            let _ = self.epoll.delete(d.chan.as_fd());
        }
        info!(poller = self.cfg.id, "RDMA poller stopped");
    }
}
