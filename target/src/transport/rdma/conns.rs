//! The NVMe/RDMA half of a poller: its connections (QPs and their CQs) and, per RDMA device,
//! a protection domain, a completion channel (in the poller's epoll, armed only before the
//! poller sleeps) and the memory region over the poller's buffer pool.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use ::rdma::{
    AccessFlags, CmEventType, CmId, CompChannel, Context, Mr, Pd, Transport, WorkCompletion,
};
use nix::sys::epoll::{EpollEvent, EpollFlags};
use nvme::rdma::CmReject;
use tracing::{debug, info, warn};

use super::conn::{Conn, Env, Setup};
use super::params::{check_connect, size_queue, DeviceLimits};
use super::request::{ReqState, STATE_COUNT};
use super::srq::SharedRecv;
use super::{CmNote, RdmaOptions};
use crate::core::{Target, TransportCaps, Waker};
use crate::transport::conns::{epoll_key, Conns, Cx, PollerStats};
use crate::transport::{ConnStats, Kind};

/// Completions taken per CQ poll.
const WC_BATCH: usize = 32;

/// What only an RDMA poller half has to report (the connection counters are in
/// [`TransportStats`](crate::transport::conns::TransportStats)); published every tick and
/// when connections go away.
#[derive(Debug, Default)]
pub struct VerbsStats {
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
    /// (read with [`VerbsStats::regions`]).
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

impl VerbsStats {
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

/// What the CM thread hands a poller (inside [`ToPoller::Rdma`]).
pub(crate) enum RdmaMsg {
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
}

/// What a poller needs to serve NVMe/RDMA connections (the target has RDMA listeners).
#[derive(Clone)]
pub(crate) struct RdmaSetup {
    pub options: RdmaOptions,
    /// To the CM thread: connections accepted and released.
    pub notes: mpsc::Sender<CmNote>,
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
    /// Bytes per pool buffer (buffer `i` is at `i * buf_size` in `pool_mr`).
    pub buf_size: usize,
    pub limits: DeviceLimits,
    /// `max_qp_init_rd_atom`.
    pub max_ord: u32,
    pub send_with_inv: bool,
    pub name: String,
}

/// A poller's NVMe/RDMA connections and the devices they run on.
pub(crate) struct RdmaConns {
    // Field order is drop order: connections (QPs, CQs, their regions, per-I/O regions on pool
    // memory), then the devices (pool regions). The poller drops its store (the pool memory)
    // after this.
    conns: Vec<Option<Conn>>,
    devs: Vec<DevRes>,
    poller: usize,
    target: Arc<Target>,
    caps: TransportCaps,
    setup: RdmaSetup,
    stats: Arc<PollerStats>,
    /// rdma_cm tag -> connection key.
    tags: HashMap<u64, u32>,
    free_keys: Vec<u32>,
    live: usize,
    wcs: Vec<WorkCompletion>,
    closed_totals: ConnStats,
    closed_io_mrs: u64,
    /// Wakes this poller (its queues' core events: AER completions, range-lock releases, a
    /// fused pair's next step).
    waker: Waker,
}

impl RdmaConns {
    /// `caps.trtype` must be RDMA.
    pub fn new(
        poller: usize,
        target: Arc<Target>,
        caps: TransportCaps,
        setup: RdmaSetup,
        stats: Arc<PollerStats>,
        waker: Waker,
    ) -> RdmaConns {
        RdmaConns {
            waker,
            conns: Vec::new(),
            devs: Vec::new(),
            poller,
            target,
            caps,
            setup,
            stats,
            tags: HashMap::new(),
            free_keys: Vec::new(),
            live: 0,
            wcs: vec![WorkCompletion::default(); WC_BATCH],
            closed_totals: ConnStats::default(),
            closed_io_mrs: 0,
        }
    }

    /// Runs `f` on connection `k` with its environment borrowed from the poller.
    fn with_conn<R>(
        &mut self,
        k: usize,
        cx: &mut Cx<'_>,
        f: impl FnOnce(&mut Conn, &mut Env<'_>) -> R,
    ) -> Option<R> {
        let RdmaConns { conns, devs, .. } = self;
        let c = conns.get_mut(k)?.as_mut()?;
        let mut env = Env {
            store: cx.store,
            dev: &devs[c.dev],
            need_buf: cx.need_buf,
            now: cx.now,
        };
        Some(f(c, &mut env))
    }

    /// A message from the CM thread.
    pub fn message(&mut self, m: RdmaMsg, cx: &mut Cx<'_>) {
        match m {
            RdmaMsg::Connect {
                tag,
                id,
                private_data,
                peer_ird,
            } => self.on_connect(tag, id, &private_data, peer_ird, cx),
            RdmaMsg::Event { tag, kind, status } => {
                let Some(&k) = self.tags.get(&tag) else {
                    debug!(tag, event = %kind, "CM event for a connection already released");
                    return;
                };
                self.with_conn(k as usize, cx, |c, env| match kind {
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
            RdmaMsg::LastWqeReached { tag } => {
                if let Some(&k) = self.tags.get(&tag) {
                    self.with_conn(k as usize, cx, |c, _| c.last_wqe_reached());
                }
            }
            RdmaMsg::QpFatal { tag, what } => {
                if let Some(&k) = self.tags.get(&tag) {
                    self.with_conn(k as usize, cx, |c, env| {
                        if !c.is_closing() {
                            warn!(peer = %c.peer, event = what, "queue pair error");
                        }
                        c.close(what, env)
                    });
                }
            }
        }
    }

    /// A CONNECT_REQUEST: check it, set the queue pair up with every RECV posted, accept.
    fn on_connect(
        &mut self,
        tag: u64,
        id: Arc<CmId>,
        private_data: &[u8],
        peer_ird: u8,
        cx: &mut Cx<'_>,
    ) {
        let peer = id
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "?".into());
        let notes = self.setup.notes.clone();
        let reject = |st: nvme::rdma::CmStatus| {
            if let Err(e) = id.reject(&CmReject::new(st).encode()) {
                debug!(%peer, error = %e, "rdma_reject failed");
            }
            let _ = notes.send(CmNote::Released { tag });
        };
        let dev = match self.device_for(&id, cx) {
            Ok(d) => d,
            Err(e) => {
                warn!(%peer, error = %e, "cannot use the RDMA device of a connect request");
                reject(nvme::rdma::CmStatus::NoRsc);
                return;
            }
        };
        let d = &self.devs[dev];
        let caps = &self.caps;
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
            inline_rsp: self.setup.options.inline_responses,
            waker: self.waker.clone(),
        };
        let conn = Conn::new(setup).and_then(|c| c.accept().map(|()| c));
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                warn!(%peer, error = %e, "setting up an NVMe/RDMA queue failed");
                self.free_keys.push(key);
                reject(nvme::rdma::CmStatus::NoRsc);
                return;
            }
        };
        debug!(poller = self.poller, %peer, device = %d.name, qid = acc.req.qid,
            depth = acc.depth, ord = acc.ord, in_capsule = sizing.in_capsule,
            send_wr = sizing.max_send_wr, "accepted NVMe/RDMA connection");
        if let Some(qp_num) = conn.qp_num() {
            let _ = self.setup.notes.send(CmNote::Accepted { tag, qp_num });
        }
        self.tags.insert(tag, key);
        self.conns[key as usize] = Some(conn);
        self.live += 1;
    }

    /// The device resources for the device `id` is bound to, created on first use.
    fn device_for(&mut self, id: &CmId, cx: &mut Cx<'_>) -> Result<usize, ::rdma::Error> {
        if let Some(i) = self.devs.iter().position(|d| id.is_on(&d.ctx)) {
            return Ok(i);
        }
        let ctx = id.context()?.ok_or_else(|| {
            ::rdma::Error::InvalidArgument("the connection is bound to no device".into())
        })?;
        let attr = ctx.query_device()?;
        let pd = Arc::new(Pd::new(&ctx)?);
        let chan = Arc::new(CompChannel::new(&ctx)?);
        let pool = cx.store.ring().pool();
        // SAFETY: the region is the poller's whole buffer pool, owned by the poller's store,
        // which the poller drops after this connection table (field order) and never unmaps
        // before; buffers are only reached by Rust code while no work request names them (the
        // request state machine), and with LOCAL_WRITE only, no peer can write the region.
        let pool_mr = unsafe {
            Mr::register_external(
                &pd,
                pool.base_ptr().as_ptr(),
                pool.len(),
                AccessFlags::LOCAL_WRITE,
            )
        }?;
        let iwarp = ctx.transport() == Transport::Iwarp;
        let send_with_inv = self.setup.options.send_with_invalidate.enabled(iwarp);
        let name = ctx.name();
        let want = self.setup.options.srq_depth;
        let srq = if want == 0 {
            None
        } else if attr.max_srq == 0 || attr.max_srq_wr == 0 {
            warn!(poller = self.poller, device = %name,
                "the RDMA device has no shared receive queues: rdma_srq_depth ignored, each \
                 queue pair posts its own RECVs");
            None
        } else {
            let depth = want.min(attr.max_srq_wr);
            if depth < want {
                info!(poller = self.poller, device = %name, rdma_srq_depth = want,
                    max_srq_wr = attr.max_srq_wr, "rdma_srq_depth lowered to the device's maximum");
            }
            Some(SharedRecv::new(&pd, depth, self.caps.in_capsule_data)?)
        };
        let i = self.devs.len();
        cx.epoll
            .add(
                chan.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, epoll_key(Kind::Rdma, i as u32)),
            )
            .map_err(|e| ::rdma::Error::Verbs {
                call: "epoll_ctl",
                errno: e as i32,
            })?;
        info!(poller = self.poller, device = %name, transport = ?ctx.transport(),
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
            buf_size: pool.buf_size(),
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

    fn remove(&mut self, k: usize) {
        let Some(mut c) = self.conns[k].take() else {
            return;
        };
        self.closed_totals.add(&c.stats_now());
        self.closed_io_mrs += c.io_mrs_total;
        self.tags.remove(&c.tag);
        self.free_keys.push(k as u32);
        self.live -= 1;
        debug!(poller = self.poller, peer = %c.peer, qid = ?c.qid(), "NVMe/RDMA connection released");
        if let Some(r) = c.last_read_sink {
            *self
                .stats
                .verbs
                .last_read_sink
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(r);
        }
        let tag = c.tag;
        // Completions still in its CQ may name RECVs of a shared receive queue: give those back.
        c.reclaim_srq_recvs(&self.devs[c.dev]);
        // Destroys the QP, then (unless the CM thread still holds it) the CM id, the CQ and
        // the connection's memory regions.
        drop(c);
        let _ = self.setup.notes.send(CmNote::Released { tag });
        // The poller publishes the counters when its connection count changes.
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
        let v = &self.stats.verbs;
        let mut regions = v.regions.lock().unwrap_or_else(|e| e.into_inner());
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
            *v.last_read_sink.lock().unwrap_or_else(|e| e.into_inner()) = last;
        }
    }
}

impl Conns for RdmaConns {
    fn ready(&mut self, key: u32, _flags: EpollFlags, _cx: &mut Cx<'_>) -> bool {
        let Some(d) = self.devs.get(key as usize) else {
            return false;
        };
        // Acknowledge the completion events; the CQs are polled in the same pass.
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
        true
    }

    fn poll(&mut self, cx: &mut Cx<'_>) -> bool {
        let mut any = false;
        let mut wcs = std::mem::take(&mut self.wcs);
        for k in 0..self.conns.len() {
            loop {
                let n = self
                    .with_conn(k, cx, |c, env| c.poll(&mut wcs, env))
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

    fn backend_done(
        &mut self,
        conn: u32,
        slot: u32,
        res: Result<u32, i32>,
        cx: &mut Cx<'_>,
    ) -> bool {
        self.with_conn(conn as usize, cx, |c, env| c.backend_done(slot, res, env))
            .is_some()
    }

    fn takes_buffer(&self, conn: u32) -> bool {
        matches!(self.conns.get(conn as usize), Some(Some(c)) if !c.is_closing())
    }

    fn buffer_granted(&mut self, conn: u32, slot: u32, buf: u32, cx: &mut Cx<'_>) {
        self.with_conn(conn as usize, cx, |c, env| c.buffer_granted(slot, buf, env));
    }

    fn tick(&mut self, cx: &mut Cx<'_>) {
        for k in 0..self.conns.len() {
            self.with_conn(k, cx, |c, env| c.tick(env));
        }
    }

    fn woken(&mut self, cx: &mut Cx<'_>) {
        // Core events (AER completions, a range lock released, a fused pair's next step)
        // are carried out now, not on the next tick.
        self.tick(cx);
    }

    fn flush(&mut self, cx: &mut Cx<'_>) -> bool {
        let mut any = false;
        for k in 0..self.conns.len() {
            any |= self
                .with_conn(k, cx, |c, env| c.flush_sends(env))
                .unwrap_or(false);
        }
        for k in 0..self.conns.len() {
            if matches!(&self.conns[k], Some(c) if c.is_finished()) {
                self.remove(k);
            }
        }
        any
    }

    fn sleeps_unmeasured(&self) -> bool {
        self.live() > 0
    }

    fn prepare_sleep(&mut self, cx: &mut Cx<'_>) -> bool {
        // Arm every CQ, then look once more for completions that arrived before the arm.
        for c in self.conns.iter().flatten() {
            if c.has_qp() {
                if let Err(e) = c.cq().req_notify(false) {
                    warn!(peer = %c.peer, error = %e, "arming a completion queue failed");
                }
            }
        }
        self.poll(cx)
    }

    fn close_all(&mut self, reason: &str, cx: &mut Cx<'_>) {
        for k in 0..self.conns.len() {
            self.with_conn(k, cx, |c, env| c.close(reason, env));
        }
    }

    fn remove_all(&mut self, cx: &mut Cx<'_>) {
        let left = self.live;
        if left > 0 {
            warn!(
                poller = self.poller,
                connections = left,
                "RDMA connections still busy at shutdown (backend operations in flight)"
            );
        }
        for k in 0..self.conns.len() {
            self.remove(k);
        }
        // Unregister the devices' descriptors before the channels close.
        for d in &self.devs {
            let _ = cx.epoll.delete(d.chan.as_fd());
        }
    }

    fn live(&self) -> usize {
        self.live
    }

    fn publish(&mut self, stats: &PollerStats, _cx: &mut Cx<'_>) {
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
            t.add(&c.stats_now());
            io_mrs_total += c.io_mrs_total;
            mrs += c.regions_held() + c.io_mrs;
            for (s, n) in states.iter_mut().zip(c.counts().0) {
                *s += n;
            }
        }
        stats.rdma.store(self.live, &t);
        let v = &stats.verbs;
        v.mrs_registered.store(mrs, Ordering::Relaxed);
        v.srq_recvs_posted
            .store(srq_posted as usize, Ordering::Relaxed);
        v.io_mrs_total.store(io_mrs_total, Ordering::Relaxed);
        for (a, n) in v.requests.iter().zip(states) {
            a.store(n, Ordering::Relaxed);
        }
    }
}
