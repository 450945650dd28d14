//! Completion channels, completion queues and work completions.

use std::fmt;
use std::mem;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use rdma_sys::*;

use crate::device::Context;
use crate::error::{check_ret, from_errno, last_errno, Error, Result};
use crate::sys::{deadline, set_nonblocking, wait_readable};

/// A completion channel (`ibv_comp_channel`): a descriptor that becomes readable when an armed
/// CQ gets a completion. Its descriptor is non-blocking, for epoll/poll loops.
pub struct CompChannel {
    raw: *mut ibv_comp_channel,
    ctx: Arc<Context>,
}

// SAFETY: the channel is a kernel descriptor; ibv_get_cq_event is a read() on it, safe from any
// thread. Destroyed once, in Drop, after every CQ using it (they hold an Arc).
unsafe impl Send for CompChannel {}
// SAFETY: as above; concurrent readers each get distinct events.
unsafe impl Sync for CompChannel {}

impl fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// The channel's descriptor, borrowed for as long as the channel lives (to poll or epoll it).
impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to the channel, which stays open while `self` is
        // borrowed; the caller cannot close it through a BorrowedFd.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }
}

impl CompChannel {
    /// `ibv_create_comp_channel`; the descriptor is set non-blocking.
    pub fn new(ctx: &Arc<Context>) -> Result<CompChannel> {
        // SAFETY: ctx.raw is an open context, kept open by the stored Arc.
        let raw = unsafe { ibv_create_comp_channel(ctx.raw) };
        if raw.is_null() {
            return Err(from_errno("ibv_create_comp_channel"));
        }
        let ch = CompChannel {
            raw,
            ctx: ctx.clone(),
        };
        set_nonblocking("fcntl(comp_channel)", ch.fd())?;
        Ok(ch)
    }

    /// The descriptor to watch for readability.
    pub fn fd(&self) -> RawFd {
        // SAFETY: raw is a live channel.
        unsafe { (*self.raw).fd }
    }

    /// The context the channel belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Takes one completion event if one is pending: `Ok(Some(tag))` names the CQ by the tag
    /// given to [`Cq::with_channel`]; `Ok(None)` if none is pending.
    ///
    /// The event is acknowledged before this returns, so [`Cq`]'s Drop never waits for it. The
    /// CQ is disarmed by the event: call [`Cq::req_notify`] again, then poll it empty.
    pub fn try_get_event(&self) -> Result<Option<u64>> {
        let mut cq: *mut ibv_cq = ptr::null_mut();
        let mut cq_ctx: *mut libc::c_void = ptr::null_mut();
        // SAFETY: raw is a live channel; the out-pointers are valid.
        let r = unsafe { ibv_get_cq_event(self.raw, &mut cq, &mut cq_ctx) };
        if r != 0 {
            let errno = last_errno();
            if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                return Ok(None);
            }
            return Err(Error::Verbs {
                call: "ibv_get_cq_event",
                errno,
            });
        }
        // SAFETY: cq was just returned by ibv_get_cq_event: ibv_destroy_cq cannot complete
        // before this event is acknowledged, so the pointer is live here; acked exactly once.
        unsafe { ibv_ack_cq_events(cq, 1) };
        Ok(Some(cq_ctx as usize as u64))
    }

    /// Waits up to `timeout` (`None`: forever) for a completion event; `Ok(None)` on timeout.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<u64>> {
        let dl = deadline(timeout);
        loop {
            if let Some(tag) = self.try_get_event()? {
                return Ok(Some(tag));
            }
            if !wait_readable(self.fd(), dl)? {
                return Ok(None);
            }
        }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created in new; CQs using it hold an Arc<CompChannel>, so none is left.
        let r = unsafe { ibv_destroy_comp_channel(self.raw) };
        if r != 0 {
            tracing::warn!(errno = r, "ibv_destroy_comp_channel failed");
        }
    }
}

/// A completion queue (`ibv_cq`).
///
/// Polling needs only `&self`. The intended use is one poller thread that owns its CQs and QPs
/// and polls them in batches into a reused `[WorkCompletion]` array, with no locking of its own.
pub struct Cq {
    pub(crate) raw: *mut ibv_cq,
    ctx: Arc<Context>,
    channel: Option<Arc<CompChannel>>,
}

// SAFETY: the CQ handle can be used from any thread; destroyed once in Drop after every QP using
// it (they hold an Arc<Cq>).
unsafe impl Send for Cq {}
// SAFETY: libibverbs providers serialize ibv_poll_cq and ibv_req_notify_cq on a CQ with the CQ's
// own lock (rxe, siw, mlx5 unless explicitly configured single-threaded), so &Cq may be shared;
// QPs need this to hold an Arc<Cq>.
unsafe impl Sync for Cq {}

impl fmt::Debug for Cq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cq")
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl Cq {
    /// A CQ with room for at least `cqe` completions and no completion channel (busy polling).
    pub fn new(ctx: &Arc<Context>, cqe: u32) -> Result<Cq> {
        Self::create(ctx, cqe, None, 0)
    }

    /// A CQ whose completion events go to `channel`, reported there as `tag`.
    pub fn with_channel(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: &Arc<CompChannel>,
        tag: u64,
    ) -> Result<Cq> {
        if channel.ctx.raw != ctx.raw {
            return Err(Error::InvalidArgument(
                "completion channel belongs to another device context".into(),
            ));
        }
        Self::create(ctx, cqe, Some(channel), tag)
    }

    fn create(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<&Arc<CompChannel>>,
        tag: u64,
    ) -> Result<Cq> {
        let n = libc::c_int::try_from(cqe)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| Error::InvalidArgument(format!("CQ size {cqe} out of range")))?;
        let ch = channel.map_or(ptr::null_mut(), |c| c.raw);
        // The tag is stored as the CQ context pointer; it is only ever read back as an integer.
        let cq_ctx = tag as usize as *mut libc::c_void;
        // SAFETY: ctx is open; ch is NULL or a live channel of the same context (both kept
        // alive by the Arcs stored below).
        let raw = unsafe { ibv_create_cq(ctx.raw, n, cq_ctx, ch, 0) };
        if raw.is_null() {
            return Err(from_errno("ibv_create_cq"));
        }
        Ok(Cq {
            raw,
            ctx: ctx.clone(),
            channel: channel.cloned(),
        })
    }

    /// Number of entries the CQ actually holds (at least what was asked).
    pub fn capacity(&self) -> u32 {
        // SAFETY: raw is a live CQ; cqe is set at creation.
        unsafe { (*self.raw).cqe }.max(0) as u32
    }

    /// The context the CQ belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The completion channel, if any.
    pub fn channel(&self) -> Option<&Arc<CompChannel>> {
        self.channel.as_ref()
    }

    /// Polls up to `wcs.len()` completions into `wcs`; returns how many were written.
    ///
    /// The entries are written in place by the provider (no copy, no allocation).
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize> {
        let n = libc::c_int::try_from(wcs.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: raw is a live CQ; WorkCompletion is repr(transparent) over ibv_wc, so the
        // provider writes at most n valid ibv_wc entries into the slice.
        let r = unsafe { ibv_poll_cq(self.raw, n, wcs.as_mut_ptr().cast::<ibv_wc>()) };
        if r < 0 {
            // ibv_poll_cq reports failure as a negative value; errno is not reliably set.
            return Err(Error::Verbs {
                call: "ibv_poll_cq",
                errno: libc::EIO,
            });
        }
        Ok(r as usize)
    }

    /// Arms the CQ: the next completion (or, with `solicited_only`, the next solicited one)
    /// raises an event on the completion channel. After arming, poll once more to catch
    /// completions that arrived before the arm.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.channel.is_none() {
            return Err(Error::InvalidArgument(
                "req_notify on a CQ without a channel".into(),
            ));
        }
        // SAFETY: raw is a live CQ with a completion channel.
        let r = unsafe { ibv_req_notify_cq(self.raw, solicited_only as libc::c_int) };
        check_ret("ibv_req_notify_cq", r)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created in create; QPs using it hold an Arc<Cq>, so none is left; channel
        // events are acknowledged as soon as they are read, so this does not block.
        let r = unsafe { ibv_destroy_cq(self.raw) };
        if r != 0 {
            tracing::warn!(errno = r, "ibv_destroy_cq failed");
        }
    }
}

/// One work completion, layout-identical to `struct ibv_wc` so [`Cq::poll`] fills a
/// `[WorkCompletion]` in place.
///
/// For a failed completion only [`wr_id`](Self::wr_id), [`status`](Self::status),
/// [`vendor_err`](Self::vendor_err) and [`qp_num`](Self::qp_num) are meaningful.
#[repr(transparent)]
pub struct WorkCompletion(ibv_wc);

impl Default for WorkCompletion {
    fn default() -> Self {
        // SAFETY: ibv_wc is integers and a union of integers; all-zero is valid.
        WorkCompletion(unsafe { mem::zeroed() })
    }
}

impl Clone for WorkCompletion {
    fn clone(&self) -> Self {
        // SAFETY: ibv_wc is plain old data; a bitwise copy is a valid copy.
        WorkCompletion(unsafe { ptr::read(&self.0) })
    }
}

impl WorkCompletion {
    /// A completion of work request `wr_id` with `status` and `byte_len`, as a device would
    /// report it (for code that stands in for a device, such as tests of a request machine).
    pub fn new(wr_id: u64, status: WcStatus, byte_len: u32) -> WorkCompletion {
        let mut wc = WorkCompletion::default();
        wc.0.wr_id = wr_id;
        wc.0.status = status.to_raw();
        wc.0.byte_len = byte_len;
        wc
    }

    /// The `wr_id` of the work request that completed.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// Completion status.
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.0.status)
    }

    /// True when the status is `Success`.
    pub fn is_ok(&self) -> bool {
        self.0.status == ibv_wc_status::IBV_WC_SUCCESS
    }

    /// What completed (only meaningful on success).
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(self.0.opcode)
    }

    /// Bytes received (RECV) or read (RDMA READ).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// Completion flags.
    pub fn flags(&self) -> WcFlags {
        WcFlags::from_bits_retain(self.0.wc_flags)
    }

    /// The rkey the peer invalidated with SEND_WITH_INV (flag `WITH_INV`). siw's user library
    /// never reports it (rdma-binding notes §4); rxe reports it its own way
    /// ([`rxe_invalidated_rkey`](Self::rxe_invalidated_rkey)).
    pub fn invalidated_rkey(&self) -> Option<u32> {
        // SAFETY: both union members are u32, so either read is a valid u32.
        let rkey = unsafe { self.0.imm_data_invalidated_rkey_union.invalidated_rkey };
        self.flags().contains(WcFlags::WITH_INV).then_some(rkey)
    }

    /// The key field of a RECV with bit 2 (`RXE_WITH_INV`) set: how rxe reports a SEND_WITH_INV
    /// (measured in the test VM, Linux 6.1: rxe writes the kernel's `IB_WC_WITH_INVALIDATE`,
    /// bit 2, into user CQEs, where libibverbs reads `IBV_WC_IP_CSUM_OK`). Another provider may
    /// set that bit for its own meaning (checksum offload), so this is a hint: believe it only
    /// when the key is the one the receiver asked the peer to invalidate.
    pub fn rxe_invalidated_rkey(&self) -> Option<u32> {
        // SAFETY: as in `invalidated_rkey`.
        let rkey = unsafe { self.0.imm_data_invalidated_rkey_union.invalidated_rkey };
        (self.flags().contains(WcFlags::RXE_WITH_INV) && self.opcode() == WcOpcode::Recv)
            .then_some(rkey)
    }

    /// Immediate data in host order (flag `WITH_IMM`).
    pub fn imm_data(&self) -> Option<u32> {
        // SAFETY: both union members are u32, so either read is a valid u32.
        let imm = unsafe { self.0.imm_data_invalidated_rkey_union.imm_data };
        self.flags()
            .contains(WcFlags::WITH_IMM)
            .then_some(u32::from_be(imm))
    }

    /// Number of the local QP the work request belonged to.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// Vendor-specific error syndrome (failed completions).
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("flags", &self.flags())
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

bitflags::bitflags! {
    /// Work completion flags (`IBV_WC_*` of `wc_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct WcFlags: u32 {
        /// A GRH is present (UD only).
        const GRH = ibv_wc_flags::IBV_WC_GRH.0;
        /// Immediate data is valid.
        const WITH_IMM = ibv_wc_flags::IBV_WC_WITH_IMM.0;
        /// The peer invalidated an rkey (SEND_WITH_INV); see `invalidated_rkey`.
        const WITH_INV = ibv_wc_flags::IBV_WC_WITH_INV.0;
        /// Bit 2: `IBV_WC_IP_CSUM_OK` in libibverbs, but what rxe sets on a RECV whose SEND
        /// invalidated a key (the kernel's `IB_WC_WITH_INVALIDATE`); see
        /// `rxe_invalidated_rkey`.
        const RXE_WITH_INV = ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
    }
}

/// What a completion is for (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// SEND (any SEND variant).
    Send,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// Atomic compare-and-swap.
    CompSwap,
    /// Atomic fetch-and-add.
    FetchAdd,
    /// Memory window bind.
    BindMw,
    /// Local invalidate.
    LocalInv,
    /// A RECV consumed by an incoming SEND.
    Recv,
    /// A RECV consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
    /// A value this crate does not model.
    Other(u32),
}

impl WcOpcode {
    fn from_raw(o: ibv_wc_opcode::Type) -> Self {
        use ibv_wc_opcode::*;
        match o {
            IBV_WC_SEND => Self::Send,
            IBV_WC_RDMA_WRITE => Self::RdmaWrite,
            IBV_WC_RDMA_READ => Self::RdmaRead,
            IBV_WC_COMP_SWAP => Self::CompSwap,
            IBV_WC_FETCH_ADD => Self::FetchAdd,
            IBV_WC_BIND_MW => Self::BindMw,
            IBV_WC_LOCAL_INV => Self::LocalInv,
            IBV_WC_RECV => Self::Recv,
            IBV_WC_RECV_RDMA_WITH_IMM => Self::RecvRdmaWithImm,
            o => Self::Other(o),
        }
    }
}

macro_rules! wc_status {
    ($( $(#[$m:meta])* $name:ident = $c:ident, )*) => {
        /// Work completion status (`enum ibv_wc_status`). `Display` is libibverbs'
        /// `ibv_wc_status_str`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum WcStatus {
            $( $(#[$m])* $name, )*
            /// A value this crate does not know.
            Other(u32),
        }

        impl WcStatus {
            /// Maps the C value.
            pub fn from_raw(s: u32) -> Self {
                match s {
                    $( ibv_wc_status::$c => Self::$name, )*
                    o => Self::Other(o),
                }
            }

            /// The C value.
            pub fn to_raw(self) -> u32 {
                match self {
                    $( Self::$name => ibv_wc_status::$c, )*
                    Self::Other(o) => o,
                }
            }
        }
    };
}

wc_status! {
    /// The work request completed.
    Success = IBV_WC_SUCCESS,
    /// Local length error (e.g. a SEND larger than the RECV buffer).
    LocLenErr = IBV_WC_LOC_LEN_ERR,
    /// Local QP operation error.
    LocQpOpErr = IBV_WC_LOC_QP_OP_ERR,
    /// Local EE context operation error.
    LocEecOpErr = IBV_WC_LOC_EEC_OP_ERR,
    /// Local protection error (bad lkey or address).
    LocProtErr = IBV_WC_LOC_PROT_ERR,
    /// Flushed because the QP went to the error state.
    WrFlushErr = IBV_WC_WR_FLUSH_ERR,
    /// Memory window bind error.
    MwBindErr = IBV_WC_MW_BIND_ERR,
    /// Bad response.
    BadRespErr = IBV_WC_BAD_RESP_ERR,
    /// Local access error.
    LocAccessErr = IBV_WC_LOC_ACCESS_ERR,
    /// Remote invalid request.
    RemInvReqErr = IBV_WC_REM_INV_REQ_ERR,
    /// Remote access error (bad rkey, address or rights).
    RemAccessErr = IBV_WC_REM_ACCESS_ERR,
    /// Remote operation error.
    RemOpErr = IBV_WC_REM_OP_ERR,
    /// Transport retry count exceeded.
    RetryExcErr = IBV_WC_RETRY_EXC_ERR,
    /// RNR retry count exceeded (the peer had no RECV posted).
    RnrRetryExcErr = IBV_WC_RNR_RETRY_EXC_ERR,
    /// Local RDD violation.
    LocRddViolErr = IBV_WC_LOC_RDD_VIOL_ERR,
    /// Remote invalid RD request.
    RemInvRdReqErr = IBV_WC_REM_INV_RD_REQ_ERR,
    /// Remote aborted.
    RemAbortErr = IBV_WC_REM_ABORT_ERR,
    /// Invalid EE context number.
    InvEecnErr = IBV_WC_INV_EECN_ERR,
    /// Invalid EE context state.
    InvEecStateErr = IBV_WC_INV_EEC_STATE_ERR,
    /// Fatal error.
    FatalErr = IBV_WC_FATAL_ERR,
    /// Response timeout.
    RespTimeoutErr = IBV_WC_RESP_TIMEOUT_ERR,
    /// General error.
    GeneralErr = IBV_WC_GENERAL_ERR,
    /// Tag matching error.
    TmErr = IBV_WC_TM_ERR,
    /// Tag matching rendezvous incomplete.
    TmRndvIncomplete = IBV_WC_TM_RNDV_INCOMPLETE,
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: ibv_wc_status_str accepts any value and returns a static string (or "unknown").
        let s = unsafe { crate::sys::c_str_to_string(ibv_wc_status_str(self.to_raw())) };
        f.write_str(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trip_and_display() {
        for raw in 0..=24u32 {
            assert_eq!(WcStatus::from_raw(raw).to_raw(), raw);
        }
        assert_eq!(WcStatus::from_raw(0), WcStatus::Success);
        assert_eq!(WcStatus::from_raw(5), WcStatus::WrFlushErr);
        assert_eq!(WcStatus::from_raw(99), WcStatus::Other(99));
        assert_eq!(WcStatus::Success.to_string(), "success");
        assert_eq!(
            WcStatus::WrFlushErr.to_string(),
            "Work Request Flushed Error"
        );
        assert_eq!(WcStatus::RemAccessErr.to_string(), "remote access error");
    }

    #[test]
    fn wc_layout_and_accessors() {
        assert_eq!(mem::size_of::<WorkCompletion>(), mem::size_of::<ibv_wc>());
        let mut wc = WorkCompletion::default();
        assert!(wc.is_ok());
        wc.0.wr_id = 42;
        wc.0.opcode = ibv_wc_opcode::IBV_WC_RECV;
        wc.0.byte_len = 64;
        wc.0.wc_flags = ibv_wc_flags::IBV_WC_WITH_INV.0;
        wc.0.imm_data_invalidated_rkey_union.invalidated_rkey = 0xabcd;
        assert_eq!(wc.wr_id(), 42);
        assert_eq!(wc.opcode(), WcOpcode::Recv);
        assert_eq!(wc.byte_len(), 64);
        assert_eq!(wc.invalidated_rkey(), Some(0xabcd));
        assert_eq!(wc.imm_data(), None);
        let c = wc.clone();
        assert_eq!(c.invalidated_rkey(), Some(0xabcd));
        wc.0.wc_flags = 0;
        assert_eq!(wc.invalidated_rkey(), None);
        assert_eq!(wc.rxe_invalidated_rkey(), None);
        // rxe's encoding (GRH | kernel IB_WC_WITH_INVALIDATE), as seen in the test VM.
        wc.0.wc_flags = ibv_wc_flags::IBV_WC_GRH.0 | (1 << 2);
        assert_eq!(wc.invalidated_rkey(), None);
        assert_eq!(wc.rxe_invalidated_rkey(), Some(0xabcd));
        wc.0.opcode = ibv_wc_opcode::IBV_WC_SEND;
        assert_eq!(wc.rxe_invalidated_rkey(), None, "only a RECV carries one");
        wc.0.opcode = ibv_wc_opcode::IBV_WC_RECV;
        wc.0.wc_flags = 0;
        wc.0.status = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
        assert!(!wc.is_ok());
        assert_eq!(wc.status(), WcStatus::WrFlushErr);
    }
}
