//! Queue pairs created through rdma_cm, and allocation-free work request posting.

use std::fmt;
use std::mem::{self, MaybeUninit};
use std::ptr;
use std::sync::Arc;

use rdma_sys::*;

use crate::cm::{CmId, CmIdInner};
use crate::cq::Cq;
use crate::error::{check_minus1, check_ret, Error, Result};
use crate::mr::{Mr, Pd, RemoteBuf, Sge};
use crate::mw::MwBind;
use crate::srq::Srq;

/// Most work requests one [`Qp::post_send`] / [`Qp::post_recv_list`] call links into a single
/// provider call (they live in a stack array). Longer lists are posted in chunks of this size.
/// 64: a poller pass's responses at queue depth 32 (RDMA WRITE + SEND each) in one post.
pub const MAX_CHAIN: usize = 64;

/// What to create a QP with. The QP type is always RC.
#[derive(Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// CQ for send-queue completions.
    pub send_cq: &'a Arc<Cq>,
    /// CQ for receive-queue completions (may be the same CQ).
    pub recv_cq: &'a Arc<Cq>,
    /// Shared receive queue; with one, the QP has no receive queue of its own.
    pub srq: Option<&'a Arc<Srq>>,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Bytes a send may carry inline.
    pub max_inline_data: u32,
    /// Signal every send WR, ignoring [`SendFlags::SIGNALED`].
    pub sq_sig_all: bool,
}

impl<'a> QpInitAttr<'a> {
    /// The common shape: one CQ for both queues, no SRQ, one SGE per work request, no inline
    /// data, only flagged sends signaled. Adjust the rest with struct update syntax
    /// (`QpInitAttr { max_send_sge: 2, ..QpInitAttr::new(&cq, 64, 32) }`).
    pub fn new(cq: &'a Arc<Cq>, max_send_wr: u32, max_recv_wr: u32) -> QpInitAttr<'a> {
        QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr,
            max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            sq_sig_all: false,
        }
    }
}

/// The capacities a QP was actually created with (providers may round up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline data bytes per send.
    pub max_inline_data: u32,
}

/// QP states (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialized.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error: every posted and newly posted WR completes with `WrFlushErr`.
    Err,
    /// A value this crate does not know.
    Other(u32),
}

impl QpState {
    fn from_raw(s: ibv_qp_state::Type) -> Self {
        use ibv_qp_state::*;
        match s {
            IBV_QPS_RESET => Self::Reset,
            IBV_QPS_INIT => Self::Init,
            IBV_QPS_RTR => Self::Rtr,
            IBV_QPS_RTS => Self::Rts,
            IBV_QPS_SQD => Self::Sqd,
            IBV_QPS_SQE => Self::Sqe,
            IBV_QPS_ERR => Self::Err,
            o => Self::Other(o),
        }
    }
}

/// An RC queue pair created on a [`CmId`] with `rdma_create_qp`, so rdma_cm performs the state
/// transitions during connect/accept.
///
/// The QP keeps its id, PD, CQs and SRQ alive and is destroyed (`rdma_destroy_qp`) before any
/// of them. It is `Send` but not `Sync`: one thread (the poller) owns it and posts on it. The
/// slow-path state calls ([`state`](Self::state), [`set_error`](Self::set_error)) are
/// serialized with rdma_cm's own use of the QP through the id's channel lock.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<nvmf_rdma::Qp>(); // a QP is owned by one poller, never shared
/// ```
pub struct Qp {
    raw: *mut ibv_qp,
    qp_num: u32,
    caps: QpCaps,
    has_srq: bool,
    id: Arc<CmIdInner>,
    _pd: Arc<Pd>,
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    _srq: Option<Arc<Srq>>,
}

// SAFETY: the QP handle may move between threads; posting is thread-safe in libibverbs
// providers (they lock the work queues). Not Sync by design: one owner posts, without sharing.
unsafe impl Send for Qp {}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &self.qp_num)
            .field("caps", &self.caps)
            .finish()
    }
}

impl Qp {
    /// `rdma_create_qp` on `id` with `pd` and `attr`. The PD, CQs and SRQ must belong to the
    /// device context the id is bound to (after address resolution or from a CONNECT_REQUEST).
    pub fn create(id: &CmId, pd: &Arc<Pd>, attr: &QpInitAttr<'_>) -> Result<Qp> {
        if !id.is_on(pd.context()) {
            return Err(Error::InvalidArgument(
                "the PD belongs to another device than the CM id (or the id is unbound)".into(),
            ));
        }
        if attr.send_cq.context().raw != pd.context().raw
            || attr.recv_cq.context().raw != pd.context().raw
        {
            return Err(Error::InvalidArgument(
                "a CQ belongs to another device than the PD".into(),
            ));
        }
        if let Some(srq) = attr.srq {
            if srq.pd().raw != pd.raw {
                return Err(Error::InvalidArgument(
                    "the SRQ belongs to another PD".into(),
                ));
            }
        }
        // SAFETY: ibv_qp_init_attr is plain data; zero is valid.
        let mut init: ibv_qp_init_attr = unsafe { mem::zeroed() };
        init.send_cq = attr.send_cq.raw;
        init.recv_cq = attr.recv_cq.raw;
        init.srq = attr.srq.map_or(ptr::null_mut(), |s| s.raw);
        init.cap = ibv_qp_cap {
            max_send_wr: attr.max_send_wr,
            max_recv_wr: if attr.srq.is_some() {
                0
            } else {
                attr.max_recv_wr
            },
            max_send_sge: attr.max_send_sge,
            max_recv_sge: if attr.srq.is_some() {
                0
            } else {
                attr.max_recv_sge
            },
            max_inline_data: attr.max_inline_data,
        };
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = attr.sq_sig_all as libc::c_int;
        let inner = id.inner.clone();
        let _g = inner.channel.lock();
        // SAFETY: the id is live and on pd's context (checked); pd, CQs and SRQ are live and
        // are kept alive by the Arcs stored in the Qp; init is a valid attribute block that
        // librdmacm updates with the actual capacities.
        let r = unsafe { rdma_create_qp(inner.raw, pd.raw, &mut init) };
        check_minus1("rdma_create_qp", r)?;
        // SAFETY: on success id->qp is the new QP.
        let raw = unsafe { (*inner.raw).qp };
        // SAFETY: raw is the live QP.
        let qp_num = unsafe { (*raw).qp_num };
        drop(_g);
        let caps = QpCaps {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: init.cap.max_recv_sge,
            max_inline_data: init.cap.max_inline_data,
        };
        Ok(Qp {
            raw,
            qp_num,
            caps,
            has_srq: attr.srq.is_some(),
            id: inner,
            _pd: pd.clone(),
            _send_cq: attr.send_cq.clone(),
            _recv_cq: attr.recv_cq.clone(),
            _srq: attr.srq.cloned(),
        })
    }

    /// The QP number (what completions and async events report).
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The capacities the QP was created with.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Posts one RECV of `sges` (scatter) identified by `wr_id`.
    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.post_recv_list(&[RecvWr { wr_id, sges }])
    }

    /// Posts a list of RECVs, linked into one provider call per [`MAX_CHAIN`] entries.
    /// On failure, [`Error::Post`] says how many from the start were posted.
    pub fn post_recv_list(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.has_srq {
            return Err(Error::InvalidArgument(
                "this QP receives through its SRQ: post on the Srq".into(),
            ));
        }
        post_recv_chunks(wrs, self.caps.max_recv_sge, "ibv_post_recv", |head, bad| {
            // SAFETY: raw is a live QP; head is a valid linked list of WRs whose SGE arrays
            // outlive the call; the provider copies everything before returning.
            unsafe { ibv_post_recv(self.raw, head, bad) }
        })
    }

    /// Posts one single-SGE RECV for each of the first `n` `slot_len`-byte slots of `mr`: slot
    /// `i` (bytes `[i * slot_len, (i + 1) * slot_len)`) with `wr_id = base + i`. The usual way
    /// to fill the receive queue before `rdma_connect`/`rdma_accept`, as the peer may SEND as
    /// soon as the connection is up. On failure, [`Error::Post`] says how many were posted.
    pub fn post_recv_slots(&self, mr: &Mr, slot_len: usize, n: usize, base: u64) -> Result<()> {
        post_slots(mr, slot_len, n, base, |wrs| self.post_recv_list(wrs))
    }

    /// Posts `wrs` as one linked list (chunks of [`MAX_CHAIN`]) with a single `ibv_post_send`
    /// per chunk, e.g. RDMA_WRITE(s) followed by the response SEND, only the SEND signaled.
    /// On failure, [`Error::Post`] says how many from the start were posted.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.post_chain(None, wrs)
    }

    /// Posts a memory window bind followed by `wrs` in one `ibv_post_send` (at most
    /// [`MAX_CHAIN`] in all): the bind takes effect before the later work requests run, so a
    /// SEND that names the new key reaches the peer only once the key opens the range. On
    /// success the window's [`Mw::rkey`](crate::Mw::rkey) is the new key. On failure,
    /// [`Error::Post`] counts the bind as the first work request (a partial post leaves the
    /// window's key as it was: fail the queue pair).
    pub fn post_bind_send(&self, bind: &MwBind<'_>, wrs: &[SendWr<'_>]) -> Result<()> {
        bind.validate(&self._pd)?;
        if wrs.len() >= MAX_CHAIN {
            return Err(Error::InvalidArgument(format!(
                "a bind and {} work requests exceed one chain of {MAX_CHAIN}",
                wrs.len()
            )));
        }
        self.post_chain(Some(bind), wrs)?;
        bind.mw.set_rkey(bind.rkey);
        Ok(())
    }

    fn post_chain(&self, bind: Option<&MwBind<'_>>, wrs: &[SendWr<'_>]) -> Result<()> {
        for wr in wrs {
            wr.validate(&self.caps)?;
        }
        let lead = usize::from(bind.is_some());
        let mut posted = 0;
        let mut rest = wrs;
        let mut first = true;
        while first || !rest.is_empty() {
            let room = if first { MAX_CHAIN - lead } else { MAX_CHAIN };
            let (chunk, tail) = rest.split_at(rest.len().min(room));
            let bind = if first { bind } else { None };
            first = false;
            rest = tail;
            let n = chunk.len() + usize::from(bind.is_some());
            if n == 0 {
                break;
            }
            let mut arr: [MaybeUninit<ibv_send_wr>; MAX_CHAIN] =
                [const { MaybeUninit::uninit() }; MAX_CHAIN];
            let head = build_send_chain(bind, chunk, &mut arr);
            let mut bad: *mut ibv_send_wr = ptr::null_mut();
            // SAFETY: raw is a live QP; head is a linked list of n initialized WRs in `arr`,
            // whose SGE arrays (borrowed from `wrs`) and window/region handles (borrowed by
            // `bind`) outlive the call.
            let r = unsafe { ibv_post_send(self.raw, head, &mut bad) };
            if r != 0 {
                let done = failed_index(head, bad, n);
                return Err(Error::Post {
                    call: "ibv_post_send",
                    errno: errno_of(r),
                    posted: posted + done,
                });
            }
            posted += n;
        }
        Ok(())
    }

    /// The QP's current state as the provider reports it (`ibv_query_qp`), or `Ok(None)` when
    /// the provider does not report states: siw's kernel `query_qp` fills in capacities only,
    /// so its answer reads RESET. A QP created through rdma_cm is never in RESET (creation
    /// moves it to INIT), which is how that case is recognized.
    pub fn state(&self) -> Result<Option<QpState>> {
        // SAFETY: both attribute blocks are plain data; zero is valid.
        let mut attr: ibv_qp_attr = unsafe { mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { mem::zeroed() };
        let _g = self.id.channel.lock();
        // SAFETY: raw is a live QP; out-pointers are valid.
        let r = unsafe {
            ibv_query_qp(
                self.raw,
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        check_ret("ibv_query_qp", r)?;
        Ok(match QpState::from_raw(attr.qp_state) {
            QpState::Reset => None,
            s => Some(s),
        })
    }

    /// Moves the QP to the error state: every outstanding WR completes with `WrFlushErr`.
    /// This is the first step of a drain; reap until every posted WR has come back, then drop.
    /// A QP that is already in the error state (e.g. after rdma_cm's disconnect handling) is
    /// left as it is.
    pub fn set_error(&self) -> Result<()> {
        // SAFETY: plain data; zero is valid.
        let mut attr: ibv_qp_attr = unsafe { mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        let r = {
            let _g = self.id.channel.lock();
            // SAFETY: raw is a live QP; only the state is modified.
            unsafe { ibv_modify_qp(self.raw, &mut attr, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32) }
        };
        match check_ret("ibv_modify_qp(ERR)", r) {
            Ok(()) => Ok(()),
            // Some providers refuse ERR -> ERR; that is the state we want.
            Err(e) => match self.state() {
                Ok(Some(QpState::Err)) => Ok(()),
                _ => Err(e),
            },
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let _g = self.id.channel.lock();
        // SAFETY: the QP was created on this id by rdma_create_qp; the id, PD, CQs and SRQ are
        // still alive (our Arcs are dropped after this). rdma_destroy_qp destroys the QP and
        // clears id->qp; it destroys no CQ of ours (it only frees CQs it created itself).
        unsafe { rdma_destroy_qp(self.id.raw) };
    }
}

fn errno_of(r: libc::c_int) -> i32 {
    if r > 0 {
        r
    } else {
        crate::error::last_errno()
    }
}

/// Index of `bad` in the list starting at `head` (= how many were posted before it).
fn failed_index<T: Linked>(head: *mut T, bad: *mut T, len: usize) -> usize {
    let mut p = head;
    let mut i = 0;
    while !p.is_null() && i < len {
        if p == bad {
            return i;
        }
        // SAFETY: p walks the list we built; each node is initialized.
        p = unsafe { (*p).next_ptr() };
        i += 1;
    }
    // The provider did not say which one failed: assume none of the chunk was posted.
    0
}

trait Linked {
    fn next_ptr(&self) -> *mut Self;
}
impl Linked for ibv_send_wr {
    fn next_ptr(&self) -> *mut Self {
        self.next
    }
}
impl Linked for ibv_recv_wr {
    fn next_ptr(&self) -> *mut Self {
        self.next
    }
}

/// One single-SGE RECV for each of the first `n` `slot_len`-byte slots of `mr` (slot `i` with
/// `wr_id = base + i`), handed to `post` as one list (a QP's or an SRQ's `post_recv_list`).
pub(crate) fn post_slots(
    mr: &Mr,
    slot_len: usize,
    n: usize,
    base: u64,
    post: impl FnOnce(&[RecvWr<'_>]) -> Result<()>,
) -> Result<()> {
    let sges = (0..n)
        .map(|i| {
            let off = i.checked_mul(slot_len).ok_or_else(|| {
                Error::InvalidArgument(format!("{n} RECV slots of {slot_len} bytes"))
            })?;
            mr.sge(off, slot_len)
        })
        .collect::<Result<Vec<Sge>>>()?;
    let wrs: Vec<RecvWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| RecvWr {
            wr_id: base + i as u64,
            sges: std::slice::from_ref(s),
        })
        .collect();
    post(&wrs)
}

pub(crate) fn post_recv_chunks(
    wrs: &[RecvWr<'_>],
    max_sge: u32,
    call: &'static str,
    mut post: impl FnMut(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> libc::c_int,
) -> Result<()> {
    for wr in wrs {
        if wr.sges.len() > max_sge as usize {
            return Err(Error::InvalidArgument(format!(
                "RECV with {} SGEs exceeds the queue's max_recv_sge {max_sge}",
                wr.sges.len()
            )));
        }
    }
    let mut posted = 0;
    for chunk in wrs.chunks(MAX_CHAIN) {
        let mut arr: [MaybeUninit<ibv_recv_wr>; MAX_CHAIN] =
            [const { MaybeUninit::uninit() }; MAX_CHAIN];
        let head = build_recv_chain(chunk, &mut arr);
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        let r = post(head, &mut bad);
        if r != 0 {
            let done = failed_index(head, bad, chunk.len());
            return Err(Error::Post {
                call,
                errno: errno_of(r),
                posted: posted + done,
            });
        }
        posted += chunk.len();
    }
    Ok(())
}

/// One receive work request: where an incoming SEND's bytes go.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Reported back in the completion.
    pub wr_id: u64,
    /// Scatter list (bounds-checked SGEs from [`crate::Mr::sge`]).
    pub sges: &'a [Sge],
}

fn build_recv_chain(
    wrs: &[RecvWr<'_>],
    arr: &mut [MaybeUninit<ibv_recv_wr>; MAX_CHAIN],
) -> *mut ibv_recv_wr {
    debug_assert!(!wrs.is_empty() && wrs.len() <= MAX_CHAIN);
    let base = arr.as_mut_ptr().cast::<ibv_recv_wr>();
    for (i, wr) in wrs.iter().enumerate() {
        let next = if i + 1 < wrs.len() {
            base.wrapping_add(i + 1)
        } else {
            ptr::null_mut::<ibv_recv_wr>()
        };
        arr[i].write(ibv_recv_wr {
            wr_id: wr.wr_id,
            next,
            // Providers only read the SGE array; the C prototype lacks const.
            sg_list: wr.sges.as_ptr().cast::<ibv_sge>().cast_mut(),
            num_sge: wr.sges.len() as libc::c_int,
        });
    }
    base
}

bitflags::bitflags! {
    /// Send work request flags (`IBV_SEND_*`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct SendFlags: u32 {
        /// Wait for earlier RDMA READs to complete before this WR starts.
        const FENCE = ibv_send_flags::IBV_SEND_FENCE.0;
        /// Generate a completion for this WR.
        const SIGNALED = ibv_send_flags::IBV_SEND_SIGNALED.0;
        /// Set the solicited-event bit (SENDs).
        const SOLICITED = ibv_send_flags::IBV_SEND_SOLICITED.0;
        /// Copy the data into the WR at post time (SEND/RDMA WRITE; up to `max_inline_data`).
        const INLINE = ibv_send_flags::IBV_SEND_INLINE.0;
    }
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND into the peer's next RECV.
    Send,
    /// SEND that also invalidates `rkey` at the peer (NVMe/RDMA response with subtype 0xF).
    SendWithInv {
        /// The rkey the peer must invalidate.
        rkey: u32,
    },
    /// RDMA WRITE of the gather list into the peer's buffer.
    RdmaWrite {
        /// Peer address and rkey.
        remote: RemoteBuf,
    },
    /// RDMA READ from the peer's buffer into the scatter list (the local SGEs need
    /// `LOCAL_WRITE`, plus `REMOTE_WRITE` on iWARP; siw allows 1 SGE).
    RdmaRead {
        /// Peer address and rkey.
        remote: RemoteBuf,
    },
    /// Invalidates `rkey` (a bound memory window's key) locally; no SGEs. Not on siw.
    LocalInv {
        /// The key to invalidate.
        rkey: u32,
    },
}

/// One send work request. Build with [`SendWr::send`], [`SendWr::send_with_inv`],
/// [`SendWr::write`], [`SendWr::zero_length_write`] or [`SendWr::read`], then add flags.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Reported back in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Gather list (scatter list for READ).
    pub sges: &'a [Sge],
    /// Flags.
    pub flags: SendFlags,
}

impl<'a> SendWr<'a> {
    /// SEND of `sges`.
    pub fn send(wr_id: u64, sges: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            op: SendOp::Send,
            sges,
            flags: SendFlags::empty(),
        }
    }
    /// SEND_WITH_INV of `sges`, invalidating `rkey` at the peer.
    pub fn send_with_inv(wr_id: u64, sges: &'a [Sge], rkey: u32) -> Self {
        SendWr {
            wr_id,
            op: SendOp::SendWithInv { rkey },
            sges,
            flags: SendFlags::empty(),
        }
    }
    /// RDMA WRITE of `sges` to `remote`.
    pub fn write(wr_id: u64, sges: &'a [Sge], remote: RemoteBuf) -> Self {
        SendWr {
            wr_id,
            op: SendOp::RdmaWrite { remote },
            sges,
            flags: SendFlags::empty(),
        }
    }
    /// RDMA WRITE of no bytes, naming no memory (the receiver checks no key for zero bytes):
    /// it touches nothing at the peer but is data on the wire. On iWARP it makes a peer whose
    /// Linux siw left a new connection's first message unread in its socket read it (DESIGN.md,
    /// "A first capsule left unread").
    pub fn zero_length_write(wr_id: u64) -> SendWr<'static> {
        SendWr::write(
            wr_id,
            &[],
            RemoteBuf {
                addr: 0,
                len: 0,
                rkey: 0,
            },
        )
    }
    /// RDMA READ from `remote` into `sges`.
    pub fn read(wr_id: u64, sges: &'a [Sge], remote: RemoteBuf) -> Self {
        SendWr {
            wr_id,
            op: SendOp::RdmaRead { remote },
            sges,
            flags: SendFlags::empty(),
        }
    }
    /// LOCAL_INV of `rkey`.
    pub fn local_inv(wr_id: u64, rkey: u32) -> Self {
        SendWr {
            wr_id,
            op: SendOp::LocalInv { rkey },
            sges: &[],
            flags: SendFlags::empty(),
        }
    }
    /// Adds `SIGNALED`.
    pub fn signaled(mut self) -> Self {
        self.flags |= SendFlags::SIGNALED;
        self
    }
    /// Adds `INLINE`.
    pub fn inline(mut self) -> Self {
        self.flags |= SendFlags::INLINE;
        self
    }
    /// Adds `FENCE`.
    pub fn fence(mut self) -> Self {
        self.flags |= SendFlags::FENCE;
        self
    }
    /// Adds `SOLICITED`.
    pub fn solicited(mut self) -> Self {
        self.flags |= SendFlags::SOLICITED;
        self
    }

    /// Total bytes of the gather/scatter list.
    pub fn byte_len(&self) -> u64 {
        self.sges.iter().map(|s| s.len() as u64).sum()
    }

    fn validate(&self, caps: &QpCaps) -> Result<()> {
        if self.sges.len() > caps.max_send_sge as usize {
            return Err(Error::InvalidArgument(format!(
                "send WR with {} SGEs exceeds max_send_sge {}",
                self.sges.len(),
                caps.max_send_sge
            )));
        }
        if let SendOp::RdmaWrite { remote } | SendOp::RdmaRead { remote } = self.op {
            if self.byte_len() > remote.len {
                return Err(Error::InvalidArgument(format!(
                    "RDMA of {} bytes exceeds the {}-byte remote buffer",
                    self.byte_len(),
                    remote.len
                )));
            }
        }
        if self.flags.contains(SendFlags::INLINE) {
            if matches!(self.op, SendOp::RdmaRead { .. }) {
                return Err(Error::InvalidArgument("RDMA READ cannot be inline".into()));
            }
            if self.byte_len() > caps.max_inline_data as u64 {
                return Err(Error::InvalidArgument(format!(
                    "inline send of {} bytes exceeds max_inline_data {}",
                    self.byte_len(),
                    caps.max_inline_data
                )));
            }
        }
        Ok(())
    }

    fn to_raw(self, next: *mut ibv_send_wr) -> ibv_send_wr {
        // SAFETY: ibv_send_wr is integers, pointers and unions of those; zero is valid.
        let mut w: ibv_send_wr = unsafe { mem::zeroed() };
        w.wr_id = self.wr_id;
        w.next = next;
        // Providers only read the SGE array; the C prototype lacks const.
        w.sg_list = self.sges.as_ptr().cast::<ibv_sge>().cast_mut();
        w.num_sge = self.sges.len() as libc::c_int;
        w.send_flags = self.flags.bits();
        match self.op {
            SendOp::Send => w.opcode = ibv_wr_opcode::IBV_WR_SEND,
            SendOp::SendWithInv { rkey } => {
                w.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
                w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            }
            SendOp::RdmaWrite { remote } => {
                w.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                w.wr.rdma = rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
            }
            SendOp::RdmaRead { remote } => {
                w.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
                w.wr.rdma = rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
            }
            SendOp::LocalInv { rkey } => {
                w.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
                w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
            }
        }
        w
    }
}

/// Links `bind` (if any) and `wrs` into `arr`; returns the head.
fn build_send_chain(
    bind: Option<&MwBind<'_>>,
    wrs: &[SendWr<'_>],
    arr: &mut [MaybeUninit<ibv_send_wr>; MAX_CHAIN],
) -> *mut ibv_send_wr {
    let lead = usize::from(bind.is_some());
    let n = lead + wrs.len();
    debug_assert!(n > 0 && n <= MAX_CHAIN);
    let base = arr.as_mut_ptr().cast::<ibv_send_wr>();
    let next_of = |i: usize| {
        if i + 1 < n {
            base.wrapping_add(i + 1)
        } else {
            ptr::null_mut::<ibv_send_wr>()
        }
    };
    if let Some(b) = bind {
        arr[0].write(b.to_raw(next_of(0)));
    }
    for (i, wr) in wrs.iter().enumerate() {
        arr[lead + i].write(wr.to_raw(next_of(lead + i)));
    }
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(addr: u64, len: u32) -> Sge {
        Sge(ibv_sge {
            addr,
            length: len,
            lkey: 0x11,
        })
    }

    fn caps() -> QpCaps {
        QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }

    #[test]
    fn write_then_send_chain_links_and_encodes() {
        let data = [sge(0x1000, 4096)];
        let rsp = [sge(0x9000, 16)];
        let remote = RemoteBuf {
            addr: 0xdead_0000,
            len: 4096,
            rkey: 0x1234,
        };
        let wrs = [
            SendWr::write(1, &data, remote),
            SendWr::send_with_inv(2, &rsp, 0x1234).signaled(),
        ];
        let mut arr = [const { MaybeUninit::uninit() }; MAX_CHAIN];
        let head = build_send_chain(None, &wrs, &mut arr);
        // SAFETY: build_send_chain initialized two linked entries starting at head.
        unsafe {
            let w0 = &*head;
            assert_eq!(w0.wr_id, 1);
            assert_eq!(w0.opcode, ibv_wr_opcode::IBV_WR_RDMA_WRITE);
            assert_eq!(w0.send_flags, 0);
            assert_eq!(w0.num_sge, 1);
            assert_eq!((*w0.sg_list).addr, 0x1000);
            assert_eq!(w0.wr.rdma.remote_addr, 0xdead_0000);
            assert_eq!(w0.wr.rdma.rkey, 0x1234);
            let w1 = &*w0.next;
            assert_eq!(w1.wr_id, 2);
            assert_eq!(w1.opcode, ibv_wr_opcode::IBV_WR_SEND_WITH_INV);
            assert_eq!(w1.send_flags, ibv_send_flags::IBV_SEND_SIGNALED.0);
            assert_eq!(w1.imm_data_invalidated_rkey_union.invalidated_rkey, 0x1234);
            assert!(w1.next.is_null());
            assert_eq!(failed_index(head, w0.next, 2), 1);
            assert_eq!(failed_index(head, head, 2), 0);
        }
    }

    #[test]
    fn recv_chain_links() {
        let a = [sge(0x1000, 64)];
        let b = [sge(0x2000, 64)];
        let wrs = [RecvWr { wr_id: 7, sges: &a }, RecvWr { wr_id: 8, sges: &b }];
        let mut arr = [const { MaybeUninit::uninit() }; MAX_CHAIN];
        let head = build_recv_chain(&wrs, &mut arr);
        // SAFETY: two initialized linked entries.
        unsafe {
            assert_eq!((*head).wr_id, 7);
            assert_eq!((*(*head).sg_list).addr, 0x1000);
            let n = (*head).next;
            assert_eq!((*n).wr_id, 8);
            assert_eq!((*(*n).sg_list).addr, 0x2000);
            assert!((*n).next.is_null());
        }
    }

    #[test]
    fn recv_chunks_report_partial_posts() {
        let s = [sge(0x1000, 64)];
        let n = MAX_CHAIN as u64 + 4;
        let wrs: Vec<RecvWr<'_>> = (0..n).map(|i| RecvWr { wr_id: i, sges: &s }).collect();
        let mut calls = 0;
        // Second chunk fails at its 3rd WR: MAX_CHAIN + 2 were posted.
        let r = post_recv_chunks(&wrs, 1, "test", |head, bad| {
            calls += 1;
            if calls == 2 {
                // SAFETY: the chunk has 4 linked WRs; point at the third.
                unsafe { *bad = (*(*head).next).next };
                libc::ENOMEM
            } else {
                0
            }
        });
        match r {
            Err(Error::Post {
                call: "test",
                errno,
                posted,
            }) => {
                assert_eq!(errno, libc::ENOMEM);
                assert_eq!(posted, MAX_CHAIN + 2);
            }
            other => panic!("{other:?}"),
        }
        let two = [sge(0, 1), sge(1, 1)];
        assert!(post_recv_chunks(
            &[RecvWr {
                wr_id: 0,
                sges: &two
            }],
            1,
            "t",
            |_, _| 0
        )
        .is_err());
    }

    #[test]
    fn send_validation() {
        let c = caps();
        let three = [sge(0, 1), sge(1, 1), sge(2, 1)];
        assert!(SendWr::send(0, &three).validate(&c).is_err());
        let big = [sge(0, 100)];
        assert!(SendWr::send(0, &big).inline().validate(&c).is_err());
        assert!(SendWr::send(0, &big).validate(&c).is_ok());
        let small = [sge(0, 64)];
        assert!(SendWr::send(0, &small).inline().validate(&c).is_ok());
        let remote = RemoteBuf {
            addr: 0,
            len: 50,
            rkey: 1,
        };
        assert!(SendWr::write(0, &small, remote).validate(&c).is_err());
        assert!(SendWr::read(0, &small, RemoteBuf { len: 64, ..remote })
            .inline()
            .validate(&c)
            .is_err());
        assert!(SendWr::read(0, &small, RemoteBuf { len: 64, ..remote })
            .validate(&c)
            .is_ok());
    }
}
