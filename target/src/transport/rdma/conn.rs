//! One NVMe/RDMA queue: its queue pair, RECV and response buffers, request slots and the
//! request state machine (see [`super::request`]).
//!
//! Buffers and keys:
//! - RECV buffers (one [`Mr`] per connection, `LOCAL_WRITE`): RECV `i` is one SGE of
//!   `recv_stride` bytes, the 64-byte SQE followed by the in-capsule data area (I/O queues
//!   only). With `rdma_srq_depth` the connection has none: its QP takes RECVs from the
//!   poller's shared receive queue on the device ([`super::srq`]), a RECV completion names the
//!   shared buffer by its wr_id, and the buffer goes back to the SRQ once consumed (also while
//!   the connection closes). In-capsule write data is copied into a pool buffer (counted in `copied_bytes`):
//!   the backend runs O_DIRECT on fixed pool buffers only, and tying a pool buffer to each
//!   posted RECV would pin `hsqsize + 1` buffers per queue for capsules that mostly carry none.
//! - Response buffers (one [`Mr`], no remote access): 16 bytes per slot, the SEND source.
//! - Data: the poller's pool, registered once per device with `LOCAL_WRITE` only. RDMA WRITE
//!   sources use that lkey, and so do RDMA READ sinks on InfiniBand/RoCE. On iWARP a READ sink
//!   needs `REMOTE_WRITE`, which would let the host write anywhere in a pool-wide region, so
//!   each READ registers just its own buffer slice (`LOCAL_WRITE | REMOTE_WRITE`) and
//!   deregisters it when the READ completes: the exposure is one I/O's buffer while its READ
//!   is in flight (rdma-binding notes §5, §6).
//!
//! Ordering rules kept here (rdma-binding notes §8):
//! - every RECV is posted before `rdma_accept`;
//! - a command's RECV is reposted as soon as its capsule is consumed (SQE decoded, in-capsule
//!   data copied), always before its response SEND is posted;
//! - capsules that arrive before ESTABLISHED wait (their RECVs stay consumed) and run once the
//!   connection is established;
//! - read data goes out as RDMA WRITE chained with the response SEND, only the SEND signaled;
//!   SEND_WITH_INVALIDATE only for a keyed-invalidate SGL (0x4F) that moved data and only where
//!   enabled;
//! - responses are staged as they complete and posted together when the poller's pass ends
//!   ([`Conn::flush_sends`]): one `ibv_post_send` (one doorbell) for all of a pass's responses
//!   on the connection. On soft-RoCE that is also one run of the kernel's requester for them
//!   and one completion event for the host, instead of one per response;
//! - the send queue never overflows (credits) and RDMA READs never exceed the negotiated
//!   initiator depth (FIFO wait lists beyond).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::rdma::{
    AccessFlags, CmId, ConnParam, Cq, Mr, Qp, QpInitAttr, RemoteBuf, SendWr, WcStatus,
    WorkCompletion, MAX_CHAIN,
};
use nvme::rdma::CmReply;
use nvme::sgl::Sgl;
use nvme::{Sqe, Status};
use std::net::SocketAddr;
use tracing::{debug, info, warn};

use super::conns::{DevRes, RegionInfo};
use super::params::{split_wr_id, wr_id, QueueSizing, WrKind, CQE_BYTES, SQE_BYTES};
use super::request::{Req, ReqState, StagedSend, StateCounts};
use super::verbs::{DevLink, QpLink, QpRes};
use crate::core::{Cmd, Exec, Queue, QueueEvent, QueueLimits, Target, TransportCaps, Xfer};
use crate::transport::{ConnStats, ReqRef, Store};

/// How long a closing connection waits for the flush completions of its posted work requests
/// before it destroys the QP anyway (which ends any DMA) and releases their buffers.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// How long a closing QP on a shared receive queue, its send queue flushed, waits for
/// IBV_EVENT_QP_LAST_WQE_REACHED before it is destroyed anyway. rxe and siw (Linux 6.1 in the
/// test VM) never raise the event (SPDK skips the wait on soft-RoCE for the same reason); a
/// RECV the QP had taken from the SRQ and flushed meanwhile is reaped from its CQ before the
/// destroy ([`Conn::reclaim_srq_recvs`]), and one it took and never completed would be lost to
/// the pool (visible in `srq_recvs_posted`).
const LAST_WQE_WAIT: Duration = Duration::from_secs(1);

/// What a connection borrows from its poller while it handles an event.
pub(super) struct Env<'a, D: DevLink = DevRes> {
    pub store: &'a mut dyn Store,
    pub dev: &'a D,
    /// The poller's FIFO of requests (of every transport) waiting for a pool buffer.
    pub need_buf: &'a mut VecDeque<ReqRef>,
    pub now: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Accepted; ESTABLISHED not seen yet. Capsules wait.
    Accepting,
    Live,
    /// Torn down: waiting for flushes and backend operations.
    Closing {
        since: Instant,
    },
}

/// What a new connection is set up with.
pub(super) struct Setup<'a> {
    pub tag: u64,
    pub key: u32,
    pub id: Arc<CmId>,
    pub cm_qid: u16,
    pub sizing: QueueSizing,
    pub ord: u8,
    pub dev_index: usize,
    pub dev: &'a DevRes,
    pub target: Arc<Target>,
    pub caps: TransportCaps,
    pub send_with_inv: bool,
    /// Response SENDs inline where the device allows it (see [`Conn`]'s `inline_rsp`).
    pub inline_rsp: bool,
    /// Wakes the poller when the core has events for this queue.
    pub waker: crate::core::Waker,
}

/// What [`Conn::with_link`] builds a connection with besides its queue pair.
pub(super) struct LinkSetup {
    pub tag: u64,
    pub key: u32,
    pub dev_index: usize,
    pub cm_qid: u16,
    pub sizing: QueueSizing,
    pub ord: u8,
    /// The QP takes its RECVs from the device's shared receive queue.
    pub srq: bool,
    pub send_with_inv: bool,
    pub inline_rsp: bool,
    /// Send-queue entries the connection may use.
    pub sq_depth: u32,
    pub target: Arc<Target>,
    pub caps: TransportCaps,
    pub peer: String,
    pub local: Option<SocketAddr>,
    pub waker: crate::core::Waker,
}

/// One NVMe/RDMA connection (one NVMe queue): the request machine, on a queue pair `Q` of a
/// device `D` ([`QpRes`] and [`DevRes`] in the daemon; recording stand-ins in the unit tests).
pub(super) struct Conn<Q: QpLink = QpRes, D: DevLink = DevRes> {
    // Field order is drop order: the queue pair and its memory first, then the requests
    // (per-I/O READ sinks on pool memory).
    link: Q,
    /// Response SENDs carry the 16-byte CQE inline (copied into the work request at post
    /// time). Besides sparing the device a memory lookup, this avoids a soft-iWARP race: siw
    /// copies a SEND of at most a header's worth of bytes from the sender's memory when it
    /// builds the frame, with `copy_from_user` while `in_syscall` is set by a thread posting in
    /// `ibv_post_send`; its transmit kthread, woken by socket write space, can build the same
    /// queue pair's frame meanwhile and then fails that copy (no user memory in a kthread):
    /// "wqe type 3 processing failed: -14", a catastrophic TERMINATE, the connection gone. An
    /// inline SEND is copied from the work request, never from user memory. (The kernel target
    /// posts from kernel memory and never takes that path.)
    inline_rsp: bool,
    slots: Vec<Req<D::Sink>>,
    /// rdma_cm tag of this connection (what the CM thread names it by).
    pub tag: u64,
    /// Index in the poller's connection table (backend user_data upper half).
    pub key: u32,
    /// Index of its device in the poller's device table.
    pub dev: usize,
    pub peer: String,
    cm_qid: u16,
    sizing: QueueSizing,
    ord: u32,
    send_with_inv: bool,
    queue: Queue,
    phase: Phase,
    counts: StateCounts,
    free_slots: Vec<u32>,
    /// Send-queue entries not in use.
    sq_free: u32,
    /// RDMA READs posted and not completed.
    reads_out: u32,
    read_wait: VecDeque<u32>,
    send_wait: VecDeque<u32>,
    /// Slots whose response is staged (accounted for, in TransferringToHost or Completing),
    /// in order, until [`Conn::flush_sends`] posts them.
    staged: Vec<u32>,
    /// Received capsules (RECV index, byte length) waiting for ESTABLISHED or a free slot.
    capsule_wait: VecDeque<(u32, u32)>,
    /// RECVs posted on the connection's own receive queue (always 0 on a shared one).
    recvs_posted: u32,
    /// The QP receives through the device's shared receive queue.
    srq: bool,
    /// IBV_EVENT_QP_LAST_WQE_REACHED arrived (shared receive queue: the QP in the error
    /// state takes no more RECVs from it).
    last_wqe: bool,
    /// Signaled send WRs (SENDs, READs) posted and not completed.
    signaled_out: u32,
    /// Backend operations in flight.
    io_inflight: u32,
    /// Per-I/O memory regions registered now (iWARP READ sinks).
    pub io_mrs: usize,
    /// Per-I/O memory regions registered over the connection's life.
    pub io_mrs_total: u64,
    /// The last iWARP READ sink registered, until the poller publishes it (for tests).
    pub last_read_sink: Option<RegionInfo>,
    pub stats: ConnStats,
}

impl Conn<QpRes, DevRes> {
    /// Creates the CQ and QP on the connection's id, allocates and registers the RECV and
    /// response buffers and posts every RECV. The caller accepts next.
    pub fn new(s: Setup<'_>) -> Result<Conn, ::rdma::Error> {
        let dev = s.dev;
        let z = s.sizing;
        let cq = Arc::new(Cq::with_channel(
            &dev.ctx,
            z.cq_entries,
            &dev.chan,
            s.key as u64,
        )?);
        let attr = |max_inline_data| QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            srq: dev.srq.as_ref().map(|q| q.srq()),
            max_send_wr: z.max_send_wr,
            max_recv_wr: z.recvs,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data,
            sq_sig_all: false,
        };
        // Responses go inline (see `inline_rsp`); a device without inline sends gets a QP
        // without.
        let qp = match Qp::create(
            &s.id,
            &dev.pd,
            &attr(if s.inline_rsp { CQE_BYTES as u32 } else { 0 }),
        ) {
            Ok(qp) => qp,
            Err(e) if s.inline_rsp => {
                debug!(device = %dev.name, error = %e, "no inline sends: responses SEND from their buffer");
                Qp::create(&s.id, &dev.pd, &attr(0))?
            }
            Err(e) => return Err(e),
        };
        let caps = qp.caps();
        let srq = dev.srq.is_some();
        let recv_mr = if srq {
            None
        } else {
            Some(Mr::alloc(
                &dev.pd,
                z.recvs as usize * z.recv_stride,
                AccessFlags::LOCAL_WRITE,
            )?)
        };
        let rsp_mr = Mr::alloc(&dev.pd, z.slots as usize * CQE_BYTES, AccessFlags::empty())?;
        let peer =
            s.id.peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|| "?".into());
        let local = s.id.local_addr();
        let link = QpRes {
            qp: Some(qp),
            id: s.id,
            cq,
            recv_mr,
            recv_stride: z.recv_stride,
            rsp_mr,
        };
        let mut c = Conn::with_link(
            link,
            LinkSetup {
                tag: s.tag,
                key: s.key,
                dev_index: s.dev_index,
                cm_qid: s.cm_qid,
                sizing: z,
                ord: s.ord,
                srq,
                send_with_inv: s.send_with_inv,
                inline_rsp: caps.max_inline_data >= CQE_BYTES as u32,
                // The provider may round the send queue up; credits use what was asked for.
                sq_depth: z.max_send_wr.min(caps.max_send_wr),
                target: s.target,
                caps: s.caps,
                peer,
                local,
                waker: s.waker,
            },
        );
        c.post_all_recvs()?;
        Ok(c)
    }

    /// `rdma_accept` with the NVMe/RDMA reply (crqsize = the RECVs posted; on a shared
    /// receive queue the host's queue depth, which the pool serves without reserving it), ORD
    /// as negotiated, no responder resources (the host never reads from the target, as with
    /// nvmet), RNR retry 7 (a host that finds no shared RECV posted retries without limit).
    pub fn accept(&self) -> Result<(), ::rdma::Error> {
        let rep = CmReply {
            crqsize: self.sizing.recvs as u16,
        }
        .encode();
        self.link.id.accept(&ConnParam {
            private_data: &rep,
            responder_resources: 0,
            initiator_depth: self.ord as u8,
            flow_control: true,
            retry_count: 7,
            rnr_retry_count: 7,
        })
    }

    pub fn qp_num(&self) -> Option<u32> {
        self.link.qp.as_ref().map(|q| q.qp_num())
    }

    pub fn cq(&self) -> &Arc<Cq> {
        &self.link.cq
    }
}

impl<Q: QpLink, D: DevLink> Conn<Q, D> {
    /// The request machine on `link`, before any RECV is posted.
    pub(super) fn with_link(link: Q, s: LinkSetup) -> Conn<Q, D> {
        let z = s.sizing;
        let mut slots = Vec::with_capacity(z.slots as usize);
        slots.resize_with(z.slots as usize, Req::new);
        let mut c = Conn {
            link,
            inline_rsp: s.inline_rsp,
            sq_free: s.sq_depth,
            slots,
            tag: s.tag,
            key: s.key,
            dev: s.dev_index,
            // The core validates Connect (qid, SQSIZE) and in-capsule SGLs against what this
            // connection was set up for.
            queue: Queue::with_limits(
                s.target,
                s.caps,
                QueueLimits {
                    in_capsule_admin: z.in_capsule,
                    in_capsule_io: z.in_capsule,
                    max_depth: Some(z.recvs.min(u32::from(u16::MAX)) as u16),
                    qid: Some(s.cm_qid),
                },
                s.peer.clone(),
            ),
            peer: s.peer,
            cm_qid: s.cm_qid,
            sizing: z,
            ord: u32::from(s.ord),
            send_with_inv: s.send_with_inv,
            phase: Phase::Accepting,
            counts: StateCounts::new(z.slots),
            free_slots: (0..z.slots).rev().collect(),
            reads_out: 0,
            read_wait: VecDeque::with_capacity(z.slots as usize),
            send_wait: VecDeque::with_capacity(z.slots as usize),
            staged: Vec::with_capacity(z.slots as usize),
            capsule_wait: VecDeque::with_capacity(z.recvs as usize),
            recvs_posted: 0,
            srq: s.srq,
            last_wqe: false,
            signaled_out: 0,
            io_inflight: 0,
            io_mrs: 0,
            io_mrs_total: 0,
            last_read_sink: None,
            stats: ConnStats::default(),
        };
        // Which listener the host came through (what it serves, its ANA states).
        if let Some(local) = s.local {
            c.queue.set_local_addr(local);
        }
        c.queue.set_waker(s.waker);
        c
    }

    /// Posts every RECV of the connection's own area (none on a shared receive queue).
    pub(super) fn post_all_recvs(&mut self) -> Result<(), ::rdma::Error> {
        if !self.link.has_recv_area() {
            return Ok(());
        }
        match self.link.post_recvs(self.sizing.recvs) {
            Ok(()) => {
                self.recvs_posted = self.sizing.recvs;
                Ok(())
            }
            Err(e) => {
                if let ::rdma::Error::Post { posted, .. } = e {
                    self.recvs_posted = posted as u32;
                }
                Err(e)
            }
        }
    }

    pub fn qid(&self) -> Option<u16> {
        self.queue.qid()
    }

    /// This connection's counters, with the core queue's commands and error completions.
    pub fn stats_now(&self) -> ConnStats {
        self.stats.with_queue(&self.queue.stats())
    }

    pub fn is_closing(&self) -> bool {
        matches!(self.phase, Phase::Closing { .. })
    }

    /// Everything posted has come back and no backend operation is in flight: the
    /// connection can be dropped. On a shared receive queue the QP has no RECVs of its own;
    /// it may still have taken one from the SRQ, so (verbs rule for a QP on an SRQ) it is
    /// destroyed only after IBV_EVENT_QP_LAST_WQE_REACHED, and its CQ is reaped once more
    /// before ([`Conn::reclaim_srq_recvs`]).
    pub fn is_finished(&self) -> bool {
        self.is_closing() && self.io_inflight == 0 && (!self.link.has_qp() || self.drained())
    }

    /// The QP's work requests have all completed (flushed).
    fn drained(&self) -> bool {
        self.recvs_posted == 0 && self.signaled_out == 0 && (!self.srq || self.last_wqe)
    }

    /// IBV_EVENT_QP_LAST_WQE_REACHED for this connection's QP.
    pub fn last_wqe_reached(&mut self) {
        debug!(peer = %self.peer, "last WQE reached: the queue pair takes no more shared RECVs");
        self.last_wqe = true;
    }

    /// Memory regions the connection holds besides per-I/O READ sinks.
    pub fn regions_held(&self) -> usize {
        self.link.regions_held()
    }

    /// Before the connection is dropped: completions still in its CQ that name shared RECVs
    /// (a capsule that arrived, or a flush, not reaped yet) give those buffers back to the
    /// SRQ. Everything else in the CQ is stale (the requests were released).
    pub fn reclaim_srq_recvs(&mut self, dev: &D) {
        if !self.srq || !dev.has_srq() {
            return;
        }
        let mut wcs = vec![WorkCompletion::default(); 16];
        loop {
            let n = match self.link.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    warn!(peer = %self.peer, error = %e, "polling the completion queue failed");
                    return;
                }
            };
            for wc in &wcs[..n] {
                if let Some((WrKind::Recv, i)) = split_wr_id(wc.wr_id()) {
                    if dev.srq_completed(i) {
                        if let Err(e) = dev.srq_repost(i) {
                            warn!(peer = %self.peer, error = %e, "reposting a shared RECV failed");
                        }
                    }
                }
            }
            if n < wcs.len() {
                return;
            }
        }
    }

    /// Copies bytes `at..` of RECV buffer `recv` (the connection's own, or the shared
    /// receive queue's) into `dst`.
    fn read_recv(
        &self,
        dev: &D,
        recv: u32,
        at: usize,
        dst: &mut [u8],
    ) -> Result<(), ::rdma::Error> {
        if self.link.has_recv_area() {
            self.link.read_recv(recv, at, dst)
        } else if self.srq {
            dev.srq_read(recv, at, dst)
        } else {
            Err(::rdma::Error::InvalidArgument("no RECV area".into()))
        }
    }

    pub fn counts(&self) -> &StateCounts {
        &self.counts
    }

    /// Whether the CQ can still produce completions worth polling.
    pub fn has_qp(&self) -> bool {
        self.link.has_qp()
    }

    fn set(&mut self, slot: u32, to: ReqState) {
        self.counts.set(slot, &mut self.slots[slot as usize], to);
    }

    fn state(&self, slot: u32) -> ReqState {
        self.slots[slot as usize].state()
    }

    // ---- events from the poller ------------------------------------------------------------

    /// ESTABLISHED: run the capsules that arrived before it.
    pub fn established(&mut self, env: &mut Env<'_, D>) {
        if self.phase == Phase::Accepting {
            debug!(peer = %self.peer, cm_qid = self.cm_qid, "NVMe/RDMA queue established");
            self.phase = Phase::Live;
            self.serve_waiters(env);
        }
    }

    /// Polls the CQ once (up to `wcs.len()` completions) and handles them. Returns how many.
    pub fn poll(&mut self, wcs: &mut [WorkCompletion], env: &mut Env<'_, D>) -> usize {
        if !self.link.has_qp() {
            return 0;
        }
        let n = match self.link.poll(wcs) {
            Ok(n) => n,
            Err(e) => {
                warn!(peer = %self.peer, error = %e, "polling the completion queue failed");
                self.close("completion queue error", env);
                return 0;
            }
        };
        for wc in &wcs[..n] {
            self.on_wc(wc, env);
        }
        if n > 0 {
            self.serve_waiters(env);
        }
        n
    }

    fn on_wc(&mut self, wc: &WorkCompletion, env: &mut Env<'_, D>) {
        let Some((kind, idx)) = split_wr_id(wc.wr_id()) else {
            warn!(peer = %self.peer, wr_id = wc.wr_id(), "completion with an unknown work request id");
            return;
        };
        let ok = wc.is_ok();
        match kind {
            WrKind::Recv => {
                if self.srq {
                    let known = env.dev.srq_completed(idx);
                    if !known {
                        warn!(peer = %self.peer, idx, "RECV completion for an unknown shared buffer");
                        return;
                    }
                } else if idx >= self.sizing.recvs {
                    warn!(peer = %self.peer, idx, "RECV completion for an unknown buffer");
                    return;
                } else {
                    self.recvs_posted = self.recvs_posted.saturating_sub(1);
                }
                if ok {
                    self.stats.rx_bytes += u64::from(wc.byte_len());
                    self.on_capsule(idx, wc.byte_len(), env);
                } else {
                    self.wc_error(wc, "RECV", env);
                    if self.srq {
                        // A flushed shared RECV: the buffer belongs to the pool.
                        self.repost(idx, env);
                    }
                }
            }
            WrKind::Send => {
                if !matches!(
                    self.slot_state(idx),
                    Some(ReqState::TransferringToHost | ReqState::Completing)
                ) {
                    debug!(peer = %self.peer, slot = idx, "SEND completion for a request not sending");
                    return;
                }
                self.signaled_out -= 1;
                let r = &mut self.slots[idx as usize];
                self.sq_free += std::mem::take(&mut r.wrs);
                if !ok {
                    self.wc_error(wc, "SEND", env);
                }
                self.release(idx, env);
            }
            WrKind::Read => {
                if self.slot_state(idx) != Some(ReqState::TransferringFromHost) {
                    debug!(peer = %self.peer, slot = idx, "READ completion for a request not reading");
                    return;
                }
                self.signaled_out -= 1;
                self.reads_out -= 1;
                let r = &mut self.slots[idx as usize];
                self.sq_free += std::mem::take(&mut r.wrs);
                if r.read_mr.take().is_some() {
                    self.io_mrs -= 1;
                }
                if !ok {
                    self.wc_error(wc, "RDMA READ", env);
                    self.release(idx, env);
                    return;
                }
                if self.is_closing() {
                    self.release(idx, env);
                    return;
                }
                self.stats.rx_bytes += u64::from(wc.byte_len());
                self.set(idx, ReqState::ReadyToExecute);
                self.advance(idx, env);
            }
            // A piece of a large read (signaled): the next piece goes on.
            WrKind::Write if self.slot_state(idx) == Some(ReqState::TransferringPiece) => {
                self.signaled_out -= 1;
                let r = &mut self.slots[idx as usize];
                self.sq_free += std::mem::take(&mut r.wrs);
                if !ok {
                    self.wc_error(wc, "RDMA WRITE", env);
                    self.release(idx, env);
                    return;
                }
                if self.is_closing() {
                    self.release(idx, env);
                    return;
                }
                if let Some(cmd) = self.slots[idx as usize].cmd.as_mut() {
                    cmd.next_piece();
                }
                self.set(idx, ReqState::ReadyToExecute);
                self.advance(idx, env);
            }
            // Unsignaled: only a failure or a flush reports it; its SEND accounts for it.
            WrKind::Write => {
                if !ok {
                    self.wc_error(wc, "RDMA WRITE", env);
                }
            }
        }
    }

    /// The most entries `regions` can append: its receive and response regions and one READ
    /// sink per request slot.
    pub fn max_regions(&self) -> usize {
        2 + self.slots.len()
    }

    /// Appends the memory regions this connection holds (for diagnostics and tests).
    pub fn regions(&self, out: &mut Vec<RegionInfo>) {
        self.link.regions(out);
        let sinks = self.slots.iter().filter_map(|r| r.read_mr.as_ref());
        out.extend(sinks.map(D::sink_info));
    }

    fn slot_state(&self, slot: u32) -> Option<ReqState> {
        self.slots.get(slot as usize).map(|r| r.state())
    }

    /// A failed completion: a flush is expected while closing; anything else ends the
    /// connection (the QP is in the error state now), as in nvmet_rdma_error_comp.
    fn wc_error(&mut self, wc: &WorkCompletion, what: &str, env: &mut Env<'_, D>) {
        let status = wc.status();
        if self.is_closing() {
            if status != WcStatus::WrFlushErr {
                debug!(peer = %self.peer, what, %status, "failed completion while closing");
            }
            return;
        }
        if status == WcStatus::WrFlushErr {
            debug!(peer = %self.peer, what, "work request flushed: the queue pair left RTS");
            self.close("queue pair flushed", env);
        } else {
            warn!(peer = %self.peer, qid = ?self.queue.qid(), what, %status,
                vendor_err = wc.vendor_err(), "RDMA work request failed: closing the queue");
            self.stats.errors += 1;
            self.close("work request failed", env);
        }
    }

    /// A command capsule arrived in RECV `recv`.
    fn on_capsule(&mut self, recv: u32, byte_len: u32, env: &mut Env<'_, D>) {
        if self.srq && self.capsule_wait.len() >= self.sizing.recvs as usize {
            // More capsules held than the host's queue depth: they would starve the other
            // queues of the shared pool.
            warn!(peer = %self.peer, held = self.capsule_wait.len(),
                "host exceeds its queue depth on a shared receive queue: closing the queue");
            self.stats.errors += 1;
            self.close("host exceeded its queue depth", env);
        }
        match self.phase {
            // The queue is going away: its own RECV is not reposted, a shared one goes back.
            Phase::Closing { .. } => {
                if self.srq {
                    self.repost(recv, env);
                }
            }
            Phase::Accepting => self.capsule_wait.push_back((recv, byte_len)),
            Phase::Live if !self.capsule_wait.is_empty() => {
                self.capsule_wait.push_back((recv, byte_len))
            }
            Phase::Live => self.start_capsule(recv, byte_len, env),
        }
    }

    /// Takes a slot for the capsule in RECV `recv` and parses it.
    fn start_capsule(&mut self, recv: u32, byte_len: u32, env: &mut Env<'_, D>) {
        if (byte_len as usize) < SQE_BYTES {
            // nvmet: "Ctrl Fatal Error: capsule size less than 64 bytes".
            warn!(peer = %self.peer, byte_len, "capsule shorter than 64 bytes: closing the queue");
            self.stats.errors += 1;
            self.close("capsule shorter than an SQE", env);
            return;
        }
        let Some(slot) = self.free_slots.pop() else {
            self.capsule_wait.push_back((recv, byte_len));
            return;
        };
        let mut raw = [0u8; SQE_BYTES];
        if let Err(e) = self.read_recv(env.dev, recv, 0, &mut raw) {
            warn!(peer = %self.peer, error = %e, "RECV buffer out of range");
            self.free_slots.push(slot);
            self.close("internal error", env);
            return;
        }
        let sqe = match Sqe::decode(&raw) {
            Ok(s) => s,
            Err(e) => {
                warn!(peer = %self.peer, error = %e, "undecodable SQE");
                self.free_slots.push(slot);
                self.close("internal error", env);
                return;
            }
        };
        let data_bytes = byte_len - SQE_BYTES as u32;
        let cmd = match self.queue.parse(&sqe, env.now) {
            Ok(cmd) => cmd,
            Err(cqe) => {
                let r = &mut self.slots[slot as usize];
                r.cmd = Some(Cmd::refused(sqe));
                r.cqe = Some(cqe);
                r.data_len = 0;
                self.set(slot, ReqState::ReadyToComplete);
                if self.repost(recv, env) {
                    self.advance(slot, env);
                }
                return;
            }
        };
        let in_capsule = match (cmd.xfer, cmd.sgl) {
            (Xfer::FromHost(len), Some(Sgl::InCapsule { .. })) => Some(len),
            _ => None,
        };
        let no_data = cmd.xfer == Xfer::None;
        self.slots[slot as usize].cmd = Some(cmd);
        // The core checked the SGL against what this queue's RECVs hold (its limits); the capsule
        // must carry the data it describes.
        let bad = match in_capsule {
            Some(len) if len > data_bytes => Some(Status::SGL_INVALID_DATA),
            _ => None,
        };
        if let Some(st) = bad {
            self.fail(slot, st.dnr(), env.now);
            if self.repost(recv, env) {
                self.advance(slot, env);
            }
            return;
        }
        if in_capsule.is_some() {
            // The data stays in the RECV buffer until it is copied into a pool buffer.
            self.slots[slot as usize].recv = Some(recv);
            self.set(slot, ReqState::NeedBuffer);
        } else {
            let next = if no_data {
                ReqState::ReadyToExecute
            } else {
                ReqState::NeedBuffer
            };
            self.set(slot, next);
            if !self.repost(recv, env) {
                // The connection is closing; close() released the request.
                return;
            }
        }
        self.advance(slot, env);
    }

    /// Completes a request with a transport-detected status (before any data moved).
    fn fail(&mut self, slot: u32, st: Status, now: Instant) {
        let r = &mut self.slots[slot as usize];
        let cmd = r.cmd.as_ref().expect("a failing request has its command");
        r.cqe = Some(self.queue.complete_status(cmd, st, now));
        r.data_len = 0;
        self.set(slot, ReqState::ReadyToComplete);
    }

    /// Reposts RECV `recv` (a shared one to the SRQ, also while closing). False (and the
    /// connection closes) if the post fails.
    fn repost(&mut self, recv: u32, env: &mut Env<'_, D>) -> bool {
        let r = if self.link.has_recv_area() {
            if !self.link.has_qp() {
                return false;
            }
            let r = self.link.repost_recv(recv);
            if r.is_ok() {
                self.recvs_posted += 1;
            }
            r
        } else if self.srq && env.dev.has_srq() {
            env.dev.srq_repost(recv)
        } else {
            return false;
        };
        match r {
            Ok(()) => !self.is_closing(),
            Err(e) => {
                if !self.is_closing() {
                    warn!(peer = %self.peer, error = %e, "reposting a RECV failed: closing the queue");
                    self.close("RECV repost failed", env);
                } else if self.srq {
                    // The stride is lost to the shared pool (published in srq_recvs_posted).
                    warn!(peer = %self.peer, recv, error = %e, "reposting a shared RECV failed");
                }
                false
            }
        }
    }

    /// The one transition function: moves a request on as far as it can go now.
    fn advance(&mut self, slot: u32, env: &mut Env<'_, D>) {
        loop {
            if self.is_closing() {
                return;
            }
            let s = slot as usize;
            match self.state(slot) {
                ReqState::NeedBuffer => {
                    let Some(b) = env.store.alloc_buf() else {
                        env.need_buf.push_back(ReqRef::rdma(self.key, slot));
                        return;
                    };
                    self.slots[s].buf = Some(b);
                    self.buffer_ready(slot, env);
                }
                ReqState::ReadPending => {
                    if self.slots[s].queued {
                        return;
                    }
                    if !self.read_wait.is_empty() || !self.can_read() {
                        self.slots[s].queued = true;
                        self.read_wait.push_back(slot);
                        return;
                    }
                    self.post_read(slot, env);
                }
                ReqState::ReadyToExecute => self.execute(slot, env),
                ReqState::ReadyToComplete => {
                    if self.slots[s].queued {
                        return;
                    }
                    if !self.send_wait.is_empty() || self.sq_free < self.response_wrs(slot) {
                        self.slots[s].queued = true;
                        self.send_wait.push_back(slot);
                        return;
                    }
                    self.post_response(slot, env);
                }
                ReqState::Free
                | ReqState::TransferringFromHost
                | ReqState::Executing
                | ReqState::Deferred
                | ReqState::TransferringToHost
                | ReqState::Completing
                | ReqState::TransferringPiece => return,
            }
        }
    }

    /// A buffer waiting request got one from the poller's FIFO.
    pub fn buffer_granted(&mut self, slot: u32, buf: u32, env: &mut Env<'_, D>) {
        if self.is_closing() || self.slot_state(slot) != Some(ReqState::NeedBuffer) {
            env.store.free_buf(buf);
            return;
        }
        self.slots[slot as usize].buf = Some(buf);
        self.buffer_ready(slot, env);
        self.advance(slot, env);
    }

    /// The request has its buffer: bring host data in, or go execute.
    fn buffer_ready(&mut self, slot: u32, env: &mut Env<'_, D>) {
        let r = &mut self.slots[slot as usize];
        let b = r.buf.expect("buffer just assigned");
        let cmd = r.cmd.as_ref().expect("request has its command");
        match (cmd.xfer, cmd.sgl) {
            (Xfer::FromHost(len), Some(Sgl::InCapsule { .. })) => {
                let recv = r.recv.take().expect("in-capsule data is held in its RECV");
                let dst = &mut env.store.buf(b)[..len as usize];
                // The RECV buffer's bounds were checked against the capsule length at parse time.
                if let Err(e) = self.read_recv(env.dev, recv, SQE_BYTES, dst) {
                    warn!(peer = %self.peer, error = %e, "in-capsule data out of range");
                    self.fail(slot, Status::INTERNAL, env.now);
                } else {
                    self.stats.copied_bytes += u64::from(len);
                    self.set(slot, ReqState::ReadyToExecute);
                }
                self.repost(recv, env);
            }
            (Xfer::FromHost(len), Some(Sgl::Keyed { .. })) if len > 0 => {
                self.set(slot, ReqState::ReadPending)
            }
            _ => self.set(slot, ReqState::ReadyToExecute),
        }
    }

    fn can_read(&self) -> bool {
        self.reads_out < self.ord && self.sq_free >= 1
    }

    /// Posts the RDMA READ of a request's host data into its buffer.
    fn post_read(&mut self, slot: u32, env: &mut Env<'_, D>) {
        let s = slot as usize;
        let r = &self.slots[s];
        let b = r.buf.expect("reading request has a buffer");
        let Some(remote) = self.piece_remote(slot) else {
            self.fail(slot, Status::INTERNAL, env.now);
            return;
        };
        let len = remote.len as u32;
        let (sge, mr) = if env.dev.iwarp() {
            let ptr = env.store.buf(b).as_mut_ptr();
            // SAFETY: [ptr, ptr + len) lies inside pool buffer `b` (len ≤ the transfer limit ≤
            // the buffer size), which this request owns until it is released; the pool memory
            // outlives every connection of the poller (the store is dropped last), and the sink
            // is deregistered (dropped) when the READ completes or the request is released,
            // which happens before the buffer goes back to the pool. No Rust reference to the
            // buffer exists while the READ is in flight (state TransferringFromHost).
            match unsafe { env.dev.read_sink(ptr, len as usize) } {
                Ok((sge, sink)) => (sge, Some(sink)),
                Err(e) => {
                    warn!(peer = %self.peer, error = %e,
                        "registering an RDMA READ sink failed: failing the command");
                    self.fail(slot, Status::DATA_XFER_ERROR, env.now);
                    return;
                }
            }
        } else {
            match env.dev.pool_sge(b, len as usize) {
                Ok(sge) => (sge, None),
                Err(e) => {
                    warn!(peer = %self.peer, error = %e, "pool SGE out of range");
                    self.fail(slot, Status::INTERNAL, env.now);
                    return;
                }
            }
        };
        if !self.link.has_qp() {
            return;
        }
        let wr = SendWr::read(
            wr_id(WrKind::Read, slot),
            std::slice::from_ref(&sge),
            remote,
        )
        .signaled();
        match self.link.post_send(&[wr]) {
            Ok(()) => {
                self.sq_free -= 1;
                self.reads_out += 1;
                self.signaled_out += 1;
                let r = &mut self.slots[s];
                r.wrs = 1;
                if let Some(mr) = mr {
                    self.last_read_sink = Some(D::sink_info(&mr));
                    r.read_mr = Some(mr);
                    self.io_mrs += 1;
                    self.io_mrs_total += 1;
                }
                self.set(slot, ReqState::TransferringFromHost);
            }
            Err(e) => {
                warn!(peer = %self.peer, error = %e, "posting an RDMA READ failed: closing the queue");
                self.close("RDMA READ post failed", env);
            }
        }
    }

    fn execute(&mut self, slot: u32, env: &mut Env<'_, D>) {
        let s = slot as usize;
        let mut cmd = self.slots[s].cmd.take().expect("request has its command");
        let ex = match self.slots[s].buf {
            Some(b) => self.queue.execute(&mut cmd, env.store.buf(b), env.now),
            None => self.queue.execute(&mut cmd, &mut [], env.now),
        };
        self.slots[s].cmd = Some(cmd);
        match ex {
            Exec::Done { cqe, data_len } => {
                let r = &mut self.slots[s];
                r.cqe = Some(cqe);
                r.data_len = data_len;
                self.set(slot, ReqState::ReadyToComplete);
            }
            Exec::Io(mut op) => {
                // A Compare and Write's Write lends its buffer (without it the backend
                // refuses the op: EINVAL).
                if let Some(p) = op.caw_write_cid().and_then(|c| self.deferred_slot(c)) {
                    op.lend_write_buf(self.slots[p as usize].buf);
                    self.slots[s].caw_partner = Some(p);
                    self.set(p, ReqState::Executing);
                }
                self.set(slot, ReqState::Executing);
                self.io_inflight += 1;
                let ud = ReqRef::rdma(self.key, slot).user_data();
                env.store.submit(&op, self.slots[s].buf, ud);
            }
            // The request keeps its buffer: the command may be resumed with its data.
            Exec::Deferred => self.set(slot, ReqState::Deferred),
        }
    }

    /// A backend operation of this connection completed.
    pub fn backend_done(&mut self, slot: u32, res: Result<u32, i32>, env: &mut Env<'_, D>) {
        if self.slot_state(slot) != Some(ReqState::Executing) {
            warn!(peer = %self.peer, slot, "backend completion for a request not executing");
            return;
        }
        self.io_inflight -= 1;
        let partner = self.slots[slot as usize].caw_partner.take();
        if self.is_closing() {
            for s in std::iter::once(slot).chain(partner) {
                if let Some(cmd) = self.slots[s as usize].cmd.as_mut() {
                    self.queue.abandon(cmd);
                }
                self.release(s, env);
            }
            return;
        }
        if let Some(p) = partner {
            // The Write of a Compare and Write: the core resumes it (done) or fails it.
            self.set(p, ReqState::Deferred);
        }
        let r = &mut self.slots[slot as usize];
        let cmd = r.cmd.as_mut().expect("executing request has its command");
        if !cmd.is_last_piece() {
            match self.queue.piece_done(cmd, res.map(|_| ()), env.now) {
                Some(cqe) => {
                    r.cqe = Some(cqe);
                    r.data_len = 0;
                    self.set(slot, ReqState::ReadyToComplete);
                }
                None if matches!(cmd.xfer, Xfer::ToHost(_)) => {
                    self.post_piece_write(slot, env);
                    return;
                }
                None => {
                    cmd.next_piece();
                    self.set(slot, ReqState::ReadPending);
                }
            }
            self.advance(slot, env);
            return;
        }
        let cqe = self.queue.complete_io(cmd, res.map(|_| ()), env.now);
        r.data_len = match cmd.xfer {
            Xfer::ToHost(_) if cqe.status().is_success() => cmd.piece.len,
            _ => 0,
        };
        r.cqe = Some(cqe);
        self.set(slot, ReqState::ReadyToComplete);
        self.advance(slot, env);
    }

    /// Where the request's current piece of data lives in the host's memory (its keyed SGL,
    /// from the piece's offset; all of the data unless it is larger than the buffer).
    fn piece_remote(&self, slot: u32) -> Option<RemoteBuf> {
        let cmd = self.slots[slot as usize].cmd.as_ref()?;
        let Some(Sgl::Keyed { addr, key, .. }) = cmd.sgl else {
            return None;
        };
        Some(RemoteBuf {
            addr: addr + u64::from(cmd.piece.offset),
            len: u64::from(cmd.piece.len),
            rkey: key,
        })
    }

    /// Writes the piece of read data in the request's buffer to the host (signaled; the next
    /// piece is read into the buffer when it completes).
    fn post_piece_write(&mut self, slot: u32, env: &mut Env<'_, D>) {
        let s = slot as usize;
        let (Some(b), Some(remote)) = (self.slots[s].buf, self.piece_remote(slot)) else {
            self.fail(slot, Status::INTERNAL, env.now);
            self.advance(slot, env);
            return;
        };
        let len = remote.len as u32;
        if self.sq_free < 1 {
            // The send queue holds two entries per request unless the device allows fewer.
            warn!(peer = %self.peer, "no send-queue room for a piece of read data: failing the command");
            self.fail(slot, Status::DATA_XFER_ERROR, env.now);
            self.advance(slot, env);
            return;
        }
        // The request is still `Executing` (its backend op is done): if nothing gets posted it
        // waits on nothing, so it is released here, or its buffer would never come back.
        let sge = match env.dev.pool_sge(b, len as usize) {
            Ok(sge) => sge,
            Err(e) => {
                warn!(peer = %self.peer, error = %e, "pool SGE out of range");
                self.close("internal error", env);
                self.release(slot, env);
                return;
            }
        };
        if !self.link.has_qp() {
            self.release(slot, env);
            return;
        }
        let wr = SendWr::write(
            wr_id(WrKind::Write, slot),
            std::slice::from_ref(&sge),
            remote,
        )
        .signaled();
        match self.link.post_send(&[wr]) {
            Ok(()) => {
                self.sq_free -= 1;
                self.signaled_out += 1;
                self.slots[s].wrs = 1;
                self.stats.tx_bytes += u64::from(len);
                self.stats.tx_payload += u64::from(len);
                self.set(slot, ReqState::TransferringPiece);
            }
            Err(e) => {
                warn!(peer = %self.peer, error = %e, "posting an RDMA WRITE failed: closing the queue");
                self.close("RDMA WRITE post failed", env);
                self.release(slot, env);
            }
        }
    }

    fn response_wrs(&self, slot: u32) -> u32 {
        if self.slots[slot as usize].data_len > 0 {
            2
        } else {
            1
        }
    }

    /// Posts the response: RDMA WRITE of the read data (if any) chained with the SEND of the
    /// CQE, one post, only the SEND signaled.
    fn post_response(&mut self, slot: u32, env: &mut Env<'_, D>) {
        let s = slot as usize;
        let keyed = match self.slots[s].cmd.as_ref().and_then(|c| c.sgl) {
            Some(Sgl::Keyed {
                addr,
                len,
                key,
                invalidate,
            }) => Some((addr, len, key, invalidate)),
            _ => None,
        };
        if self.slots[s].data_len > 0 && keyed.is_none() {
            // parse only hands out ToHost transfers with a keyed SGL on RDMA.
            warn!(peer = %self.peer, "read data without a keyed SGL: failing the command");
            self.fail(slot, Status::INTERNAL, env.now);
        }
        let r = &mut self.slots[s];
        let cqe = r.cqe.take().expect("a completing request has its CQE");
        let data_len = r.data_len;
        let rsp = match self.link.response(s, &cqe.encode()) {
            Ok(sge) => sge,
            Err(e) => {
                warn!(peer = %self.peer, error = %e, "response buffer out of range");
                self.close("internal error", env);
                return;
            }
        };
        // SEND_WITH_INVALIDATE only for the keyed-invalidate subtype with data, as nvmet does
        // (a key the host did not ask to invalidate makes it log "Bogus remote invalidation").
        let inv = match keyed {
            Some((_, len, key, true)) if self.send_with_inv && len > 0 => Some(key),
            _ => None,
        };
        if !self.link.has_qp() {
            return;
        }
        let data = if data_len > 0 {
            let (addr, len, key, _) = keyed.expect("checked above");
            let b = self.slots[s]
                .buf
                .expect("read data is in the request's buffer");
            let sge = match env.dev.pool_sge(b, data_len as usize) {
                Ok(sge) => sge,
                Err(e) => {
                    warn!(peer = %self.peer, error = %e, "pool SGE out of range");
                    self.close("internal error", env);
                    return;
                }
            };
            // The last piece of the data (all of it, unless it was larger than the buffer).
            let piece_off = self.slots[s].cmd.as_ref().map_or(0, |c| c.piece.offset);
            let remote = RemoteBuf {
                addr: addr + u64::from(piece_off),
                len: u64::from(len - piece_off),
                rkey: key,
            };
            Some((sge, remote))
        } else {
            None
        };
        let (wrs, next) = match data {
            Some(_) => (2, ReqState::TransferringToHost),
            None => (1, ReqState::Completing),
        };
        // Accounted for now (the send queue room, the completion to come), posted by the
        // connection's next flush, at the end of the poller's pass at the latest.
        self.sq_free -= wrs;
        self.signaled_out += 1;
        let r = &mut self.slots[s];
        r.wrs = wrs;
        r.send = Some(StagedSend { rsp, data, inv });
        self.staged.push(slot);
        self.set(slot, next);
    }

    /// Posts the staged responses in order, as few `ibv_post_send` calls as [`MAX_CHAIN`]
    /// allows (one for up to 32 read responses), and counts what was posted in the transmit
    /// statistics. A failed post closes the queue; the responses it did not post are taken back
    /// (send-queue room and completion count returned) and released with the rest.
    /// Returns whether anything was staged.
    pub fn flush_sends(&mut self, env: &mut Env<'_, D>) -> bool {
        if self.staged.is_empty() {
            return false;
        }
        // Staged entries [0, posted) are on the send queue.
        let mut posted = 0;
        let mut failure = None;
        if self.link.has_qp() {
            let filler = SendWr::send(0, &[]);
            let mut wrs = [filler; MAX_CHAIN];
            while posted < self.staged.len() {
                let (mut n, mut end) = (0, posted);
                for &slot in &self.staged[posted..] {
                    let st = self.slots[slot as usize]
                        .send
                        .as_ref()
                        .expect("a staged slot has its work requests");
                    if n + 1 + usize::from(st.data.is_some()) > MAX_CHAIN {
                        break;
                    }
                    if let Some((sge, remote)) = &st.data {
                        let id = wr_id(WrKind::Write, slot);
                        wrs[n] = SendWr::write(id, std::slice::from_ref(sge), *remote);
                        n += 1;
                    }
                    let id = wr_id(WrKind::Send, slot);
                    let rsp = std::slice::from_ref(&st.rsp);
                    let send = match st.inv {
                        Some(k) => SendWr::send_with_inv(id, rsp, k),
                        None => SendWr::send(id, rsp),
                    }
                    .signaled();
                    wrs[n] = if self.inline_rsp { send.inline() } else { send };
                    n += 1;
                    end += 1;
                }
                match self.link.post_send(&wrs[..n]) {
                    Ok(()) => posted = end,
                    Err(e) => {
                        // A response is posted when its SEND (its last WR) is.
                        if let ::rdma::Error::Post { posted: ok, .. } = e {
                            let mut done = 0;
                            for &slot in &self.staged[posted..end] {
                                done += self.slots[slot as usize].wrs as usize;
                                if done > ok {
                                    break;
                                }
                                posted += 1;
                            }
                        }
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        for i in 0..self.staged.len() {
            let slot = self.staged[i];
            let r = &mut self.slots[slot as usize];
            let data_len = r
                .send
                .take()
                .and_then(|st| st.data)
                .map_or(0, |(d, _)| d.len());
            if i < posted {
                self.stats.tx_bytes += CQE_BYTES as u64 + u64::from(data_len);
                self.stats.tx_payload += u64::from(data_len);
                continue;
            }
            // Not posted: back to ReadyToComplete, which the close below releases.
            self.sq_free += std::mem::take(&mut r.wrs);
            self.signaled_out -= 1;
            self.set(slot, ReqState::ReadyToComplete);
        }
        let unposted = self.staged.len() - posted;
        self.staged.clear();
        if unposted > 0 {
            match failure {
                Some(e) => {
                    warn!(peer = %self.peer, error = %e, unposted, "posting responses failed: closing the queue")
                }
                None => {
                    debug!(peer = %self.peer, unposted, "responses staged on a queue without a QP")
                }
            }
            self.close("response post failed", env);
        }
        true
    }

    /// Frees a request's buffer, memory region and slot; reposts a RECV it still held.
    fn release(&mut self, slot: u32, env: &mut Env<'_, D>) {
        let s = slot as usize;
        if self.slots[s].state() == ReqState::Free {
            return;
        }
        let r = &mut self.slots[s];
        if let Some(b) = r.buf.take() {
            env.store.free_buf(b);
        }
        if r.read_mr.take().is_some() {
            self.io_mrs -= 1;
        }
        r.send = None;
        let recv = r.recv.take();
        r.cmd = None;
        r.cqe = None;
        r.data_len = 0;
        r.wrs = 0;
        r.queued = false;
        r.caw_partner = None;
        self.set(slot, ReqState::Free);
        self.free_slots.push(slot);
        if let Some(recv) = recv {
            if !self.is_closing() || self.srq {
                self.repost(recv, env);
            }
        }
    }

    /// Gives waiting requests what became free: send-queue room to responses first (they
    /// free slots and credits), then READ credits, then slots to waiting capsules.
    fn serve_waiters(&mut self, env: &mut Env<'_, D>) {
        loop {
            if self.phase != Phase::Live {
                return;
            }
            let mut progress = false;
            while let Some(&slot) = self.send_wait.front() {
                if self.sq_free < self.response_wrs(slot) {
                    break;
                }
                self.send_wait.pop_front();
                self.slots[slot as usize].queued = false;
                // The front waiter goes now: `advance` would queue it again behind the other
                // waiters (its rule for newcomers), and two waiters would swap places forever.
                self.post_response(slot, env);
                self.advance(slot, env);
                progress = true;
                if self.is_closing() {
                    return;
                }
            }
            while let Some(&slot) = self.read_wait.front() {
                if !self.can_read() || !self.send_wait.is_empty() {
                    break;
                }
                self.read_wait.pop_front();
                self.slots[slot as usize].queued = false;
                // As above: the front waiter posts its READ now.
                self.post_read(slot, env);
                self.advance(slot, env);
                progress = true;
                if self.is_closing() {
                    return;
                }
            }
            while !self.free_slots.is_empty() {
                let Some((recv, len)) = self.capsule_wait.pop_front() else {
                    break;
                };
                self.start_capsule(recv, len, env);
                progress = true;
                if self.is_closing() {
                    return;
                }
            }
            if !progress {
                return;
            }
        }
    }

    /// The deferred command with this CID.
    fn deferred_slot(&self, cid: u16) -> Option<u32> {
        (0..self.slots.len() as u32).find(|&i| {
            let r = &self.slots[i as usize];
            r.state() == ReqState::Deferred && r.cmd.as_ref().is_some_and(|c| c.sqe.cid() == cid)
        })
    }

    /// Keep-alive and other timers, core events (AER completions, teardown requests), and the
    /// drain deadline of a closing connection.
    pub fn tick(&mut self, env: &mut Env<'_, D>) {
        match self.phase {
            Phase::Live => {
                if self.queue.poll_timeout().is_some_and(|t| t <= env.now) {
                    self.queue.handle_timeout(env.now);
                }
                while let Some(ev) = self.queue.poll_event() {
                    match ev {
                        QueueEvent::Complete(cqe) => match self.deferred_slot(cqe.cid()) {
                            Some(slot) => {
                                let r = &mut self.slots[slot as usize];
                                r.cqe = Some(cqe);
                                r.data_len = 0;
                                self.set(slot, ReqState::ReadyToComplete);
                                self.advance(slot, env);
                            }
                            None => {
                                warn!(peer = %self.peer, cid = cqe.cid(),
                                        "event for an unknown deferred command")
                            }
                        },
                        QueueEvent::Resume(cid) => match self.deferred_slot(cid) {
                            Some(slot) => {
                                self.set(slot, ReqState::ReadyToExecute);
                                self.advance(slot, env);
                            }
                            None => {
                                warn!(peer = %self.peer, cid, "resume of an unknown deferred command")
                            }
                        },
                        QueueEvent::Disconnect(reason) => {
                            self.close(reason, env);
                            return;
                        }
                    }
                }
            }
            Phase::Closing { since } => {
                if self.link.has_qp()
                    && self.srq
                    && !self.last_wqe
                    && self.signaled_out == 0
                    && env.now.duration_since(since) >= LAST_WQE_WAIT
                {
                    debug!(peer = %self.peer, "no Last WQE Reached event within 1 s of the error \
                        state (send queue flushed): destroying the queue pair");
                    self.last_wqe = true;
                }
                if self.link.has_qp()
                    && !self.drained()
                    && env.now.duration_since(since) >= DRAIN_LIMIT
                {
                    warn!(peer = %self.peer, recvs = self.recvs_posted, sends = self.signaled_out,
                        shared_rq = self.srq, last_wqe = self.last_wqe,
                        "flush completions missing after the drain limit: destroying the queue pair");
                    // Shared RECVs completed in the CQ go back first: some providers (mlx5)
                    // purge a QP's completions from its CQ when it is destroyed.
                    self.reclaim_srq_recvs(env.dev);
                    // Destroying the QP ends all DMA on its work requests: their buffers can
                    // go back.
                    self.link.destroy_qp();
                    self.recvs_posted = 0;
                    self.signaled_out = 0;
                    for slot in 0..self.slots.len() as u32 {
                        if self.state(slot).waits_on_device() {
                            if self.state(slot) == ReqState::TransferringFromHost {
                                self.reads_out -= 1;
                            }
                            self.release(slot, env);
                        }
                    }
                }
            }
            Phase::Accepting => {}
        }
    }

    /// Tears the queue down (peer disconnect, error, keep-alive expiry, controller teardown,
    /// shutdown): the core forgets the queue, rdma_disconnect tells the host, the QP goes to
    /// the error state so every posted work request comes back as a flush, and requests that
    /// wait on nothing but software are released at once.
    pub fn close(&mut self, reason: &str, env: &mut Env<'_, D>) {
        if self.is_closing() {
            return;
        }
        info!(peer = %self.peer, qid = ?self.queue.qid(), cm_qid = self.cm_qid, reason,
            "closing NVMe/RDMA queue");
        self.phase = Phase::Closing { since: env.now };
        // Responses completed before the close go out first (a failure here takes them back
        // to ReadyToComplete; its nested close returns at once, the phase being set).
        self.flush_sends(env);
        self.queue.disconnected();
        if let Err(e) = self.link.disconnect() {
            // EINVAL when the connection is already gone.
            debug!(peer = %self.peer, error = %e, "rdma_disconnect");
        }
        if self.link.has_qp() {
            if let Err(e) = self.link.set_error() {
                warn!(peer = %self.peer, error = %e, "moving the queue pair to the error state failed");
            }
        }
        while let Some((recv, _)) = self.capsule_wait.pop_front() {
            if self.srq {
                self.repost(recv, env);
            }
        }
        self.read_wait.clear();
        self.send_wait.clear();
        for slot in 0..self.slots.len() as u32 {
            match self.state(slot) {
                ReqState::NeedBuffer
                | ReqState::ReadPending
                | ReqState::ReadyToExecute
                | ReqState::ReadyToComplete
                | ReqState::Deferred => self.release(slot, env),
                ReqState::Free
                | ReqState::TransferringFromHost
                | ReqState::Executing
                | ReqState::TransferringToHost
                | ReqState::Completing
                | ReqState::TransferringPiece => {}
            }
        }
    }
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;
