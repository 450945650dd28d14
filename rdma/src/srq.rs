//! Shared receive queues.

use std::fmt;
use std::mem;
use std::sync::Arc;

use rdma_sys::*;

use crate::error::{from_errno, Result};
use crate::mr::{Mr, Pd, Sge};
use crate::qp::{post_recv_chunks, post_slots, RecvWr};

/// A shared receive queue (`ibv_srq`): one pool of RECVs for many QPs of a PD.
pub struct Srq {
    pub(crate) raw: *mut ibv_srq,
    max_wr: u32,
    max_sge: u32,
    pd: Arc<Pd>,
}

// SAFETY: the SRQ handle may be used from any thread; destroyed once, in Drop, after every QP
// using it (they hold an Arc<Srq>).
unsafe impl Send for Srq {}
// SAFETY: providers lock the SRQ inside ibv_post_srq_recv, so several QPs' pollers may repost
// to one SRQ concurrently; QPs need this to hold an Arc<Srq>.
unsafe impl Sync for Srq {}

impl fmt::Debug for Srq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Srq")
            .field("max_wr", &self.max_wr)
            .field("max_sge", &self.max_sge)
            .finish()
    }
}

impl Srq {
    /// `ibv_create_srq` on `pd` with room for `max_wr` RECVs of up to `max_sge` SGEs.
    pub fn new(pd: &Arc<Pd>, max_wr: u32, max_sge: u32) -> Result<Srq> {
        // SAFETY: ibv_srq_init_attr is plain data; zero is valid.
        let mut init: ibv_srq_init_attr = unsafe { mem::zeroed() };
        init.attr = ibv_srq_attr {
            max_wr,
            max_sge,
            srq_limit: 0,
        };
        // SAFETY: pd is live (kept alive by the stored Arc); init is valid and is updated with
        // the actual sizes.
        let raw = unsafe { ibv_create_srq(pd.raw, &mut init) };
        if raw.is_null() {
            return Err(from_errno("ibv_create_srq"));
        }
        Ok(Srq {
            raw,
            max_wr: init.attr.max_wr,
            max_sge: init.attr.max_sge,
            pd: pd.clone(),
        })
    }

    /// Actual depth.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Actual SGEs per RECV.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The PD of the SRQ.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// Posts one RECV.
    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.post_recv_list(&[RecvWr { wr_id, sges }])
    }

    /// Posts a list of RECVs (see [`crate::Qp::post_recv_list`]).
    pub fn post_recv_list(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        post_recv_chunks(wrs, self.max_sge, "ibv_post_srq_recv", |head, bad| {
            // SAFETY: raw is a live SRQ; head is a valid linked list whose SGE arrays outlive
            // the call; the provider copies everything before returning.
            unsafe { ibv_post_srq_recv(self.raw, head, bad) }
        })
    }

    /// Posts one single-SGE RECV for each of the first `n` `slot_len`-byte slots of `mr`, slot
    /// `i` with `wr_id = base + i` (as [`crate::Qp::post_recv_slots`]). On failure,
    /// [`crate::Error::Post`] says how many were posted.
    pub fn post_recv_slots(&self, mr: &Mr, slot_len: usize, n: usize, base: u64) -> Result<()> {
        post_slots(mr, slot_len, n, base, |wrs| self.post_recv_list(wrs))
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: created in new; QPs using it hold an Arc<Srq>, so none is left.
        let r = unsafe { ibv_destroy_srq(self.raw) };
        if r != 0 {
            tracing::warn!(errno = r, "ibv_destroy_srq failed");
        }
    }
}
