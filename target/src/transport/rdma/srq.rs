//! The shared receive queue of one poller on one device (`target.rdma_srq_depth > 0`).
//!
//! One [`Srq`] and one registered receive area of `depth` strides (`LOCAL_WRITE` only), shared
//! by every queue pair the poller has on the device. RECV `i` is one SGE over stride `i` and
//! carries `wr_id(WrKind::Recv, i)`; its completion arrives on the CQ of the queue pair that
//! consumed it, so the connection owning that CQ parses the capsule in place and gives stride
//! `i` back with [`SharedRecv::repost`] once the capsule (and any in-capsule data) is consumed,
//! also when the connection is closing: a stride belongs to the pool, not to a connection.
//!
//! Flow control: each host is told its own queue depth (`crqsize = hsqsize + 1`), which the
//! pool does not reserve. A burst of more capsules than there are posted strides is answered
//! by the device with RNR NAKs and retried by the host (RNR retry 7: no limit), as with SPDK's
//! SRQ; on iWARP a capsule without a posted RECV is a protocol error (the QP terminates),
//! which is why the depth should cover the commands in flight over all the poller's hosts.

use std::cell::Cell;
use std::sync::Arc;

use ::rdma::{AccessFlags, Mr, Pd, Srq};

use super::conns::{RegionInfo, RegionKind};
use super::params::{wr_id, WrKind, SQE_BYTES};

/// A poller's shared receive queue on one device and its receive area.
pub(super) struct SharedRecv {
    // Field order is drop order: the SRQ (no QP uses it any more: connections are dropped
    // before the devices) before the area its RECVs pointed into.
    srq: Arc<Srq>,
    mr: Mr,
    stride: usize,
    depth: u32,
    /// RECVs posted and not completed (a connection's completions decrement it).
    posted: Cell<u32>,
}

impl SharedRecv {
    /// Creates the SRQ with `depth` RECVs of `64 + in_capsule` bytes (rounded to 64) on `pd`
    /// and posts all of them.
    pub fn new(pd: &Arc<Pd>, depth: u32, in_capsule: u32) -> Result<SharedRecv, ::rdma::Error> {
        let stride = (SQE_BYTES + in_capsule as usize).next_multiple_of(64);
        let srq = Arc::new(Srq::new(pd, depth, 1)?);
        let mr = Mr::alloc(pd, depth as usize * stride, AccessFlags::LOCAL_WRITE)?;
        let s = SharedRecv {
            srq,
            mr,
            stride,
            depth,
            posted: Cell::new(0),
        };
        s.srq
            .post_recv_slots(&s.mr, stride, depth as usize, wr_id(WrKind::Recv, 0))?;
        s.posted.set(depth);
        Ok(s)
    }

    /// The SRQ, for queue pairs to attach to.
    pub fn srq(&self) -> &Arc<Srq> {
        &self.srq
    }

    /// RECV buffers in the pool.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Bytes of one RECV buffer.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// RECVs posted now.
    pub fn posted(&self) -> u32 {
        self.posted.get()
    }

    /// The receive area (capsules are read from it in place).
    pub fn mr(&self) -> &Mr {
        &self.mr
    }

    /// A RECV of stride `i` completed (successfully or flushed): it is no longer posted.
    pub fn completed(&self, i: u32) -> bool {
        if i >= self.depth {
            return false;
        }
        self.posted.set(self.posted.get().saturating_sub(1));
        true
    }

    /// Posts stride `i` again.
    pub fn repost(&self, i: u32) -> Result<(), ::rdma::Error> {
        let sge = self.mr.sge(i as usize * self.stride, self.stride)?;
        self.srq.post_recv(wr_id(WrKind::Recv, i), &[sge])?;
        self.posted.set(self.posted.get() + 1);
        Ok(())
    }

    /// The receive area as a region record (for [`super::RdmaPollerStats::regions`]).
    pub fn region(&self) -> RegionInfo {
        RegionInfo::of(RegionKind::SrqRecv, &self.mr)
    }
}
