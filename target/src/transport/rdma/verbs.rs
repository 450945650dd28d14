//! What an NVMe/RDMA connection does to its queue pair and device, behind two small traits, so
//! the connection's request machine ([`super::conn::Conn`]) runs on the verbs in the daemon
//! ([`QpRes`], [`super::conns::DevRes`]) and on a recording stand-in in its unit tests
//! (`conn_tests.rs`: no device, no memory registration, completions when the test says).
//!
//! The traits carry no protocol: which work request to post when, credits, ordering, rollback
//! and teardown all stay in the machine.

use std::sync::Arc;

use ::rdma::{CmId, Cq, Mr, Qp, SendWr, Sge, WorkCompletion};
use tracing::debug;

use super::conns::{DevRes, RegionInfo, RegionKind};
use super::params::{wr_id, WrKind};
use crate::transport::rdma::params::CQE_BYTES;

type Result<T> = std::result::Result<T, ::rdma::Error>;

/// One connection's queue pair, completion queue, CM id and its own memory: the RECV area
/// (none on a shared receive queue) and the response area (16 bytes per request slot).
pub(super) trait QpLink {
    /// Whether the queue pair still exists (it is destroyed early when its flushes never come).
    fn has_qp(&self) -> bool;
    /// Destroys the queue pair: every DMA on its work requests ends.
    fn destroy_qp(&mut self);
    /// Posts a chain of send work requests (one doorbell). A partial post is
    /// `rdma::Error::Post { posted, .. }`.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()>;
    /// Whether the connection has its own RECV area (false on a shared receive queue).
    fn has_recv_area(&self) -> bool;
    /// Posts RECVs over strides `0..n` of the own RECV area (work request ids
    /// `wr_id(Recv, i)`). A partial post is `rdma::Error::Post { posted, .. }`.
    fn post_recvs(&self, n: u32) -> Result<()>;
    /// Posts RECV `recv` of the own area again.
    fn repost_recv(&self, recv: u32) -> Result<()>;
    /// Copies bytes `at..` of own RECV `recv` into `dst`.
    fn read_recv(&self, recv: u32, at: usize, dst: &mut [u8]) -> Result<()>;
    /// Writes the 16-byte CQE of `slot` into the response area; its SGE.
    fn response(&self, slot: usize, cqe: &[u8; CQE_BYTES]) -> Result<Sge>;
    /// Polls the completion queue.
    fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize>;
    /// Moves the queue pair to the error state (every posted work request is flushed).
    fn set_error(&self) -> Result<()>;
    /// `rdma_disconnect`.
    fn disconnect(&self) -> Result<()>;
    /// Appends the connection's own memory regions.
    fn regions(&self, out: &mut Vec<RegionInfo>);
    /// How many memory regions [`QpLink::regions`] appends.
    fn regions_held(&self) -> usize;
}

/// A poller's device: its registration of the buffer pool, per-I/O READ sinks (iWARP), and
/// the shared receive queue.
pub(super) trait DevLink {
    /// A per-I/O registration of an RDMA READ sink; deregistered when dropped.
    type Sink;
    /// iWARP: READ sinks need a registration of their own with remote write access.
    fn iwarp(&self) -> bool;
    /// The SGE of the first `len` bytes of pool buffer `buf`.
    fn pool_sge(&self, buf: u32, len: usize) -> Result<Sge>;
    /// Registers `[ptr, ptr + len)` as an RDMA READ sink (local and remote write).
    ///
    /// # Safety
    /// The memory must stay valid, and not be used through Rust references, until the sink is
    /// dropped.
    unsafe fn read_sink(&self, ptr: *mut u8, len: usize) -> Result<(Sge, Self::Sink)>;
    /// The region record of a sink (diagnostics and tests).
    fn sink_info(sink: &Self::Sink) -> RegionInfo;
    /// Whether the device has a shared receive queue.
    fn has_srq(&self) -> bool;
    /// Shared RECV `i` completed (succeeded or flushed): false if `i` is no shared RECV.
    fn srq_completed(&self, i: u32) -> bool;
    /// Posts shared RECV `i` again.
    fn srq_repost(&self, i: u32) -> Result<()>;
    /// Copies bytes `at..` of shared RECV `i` into `dst`.
    fn srq_read(&self, i: u32, at: usize, dst: &mut [u8]) -> Result<()>;
}

/// The real [`QpLink`].
pub(super) struct QpRes {
    // Field order is drop order: the QP first (it holds the CM id, PD and CQ alive), then the
    // CM id, the CQ, and the buffers the QP used.
    pub qp: Option<Qp>,
    pub id: Arc<CmId>,
    pub cq: Arc<Cq>,
    /// The connection's own RECV buffers; None on a shared receive queue.
    pub recv_mr: Option<Mr>,
    pub recv_stride: usize,
    pub rsp_mr: Mr,
}

impl QpLink for QpRes {
    fn has_qp(&self) -> bool {
        self.qp.is_some()
    }

    fn destroy_qp(&mut self) {
        self.qp = None;
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        match &self.qp {
            Some(qp) => qp.post_send(wrs),
            None => Err(::rdma::Error::InvalidArgument(
                "queue pair destroyed".into(),
            )),
        }
    }

    fn has_recv_area(&self) -> bool {
        self.recv_mr.is_some()
    }

    fn post_recvs(&self, n: u32) -> Result<()> {
        let (Some(qp), Some(mr)) = (&self.qp, &self.recv_mr) else {
            return Ok(());
        };
        qp.post_recv_slots(mr, self.recv_stride, n as usize, wr_id(WrKind::Recv, 0))
    }

    fn repost_recv(&self, recv: u32) -> Result<()> {
        let (Some(qp), Some(mr)) = (&self.qp, &self.recv_mr) else {
            return Err(::rdma::Error::InvalidArgument(
                "no queue pair or RECV area".into(),
            ));
        };
        let stride = self.recv_stride;
        let sge = mr.sge(recv as usize * stride, stride)?;
        qp.post_recv(wr_id(WrKind::Recv, recv), &[sge])
    }

    fn read_recv(&self, recv: u32, at: usize, dst: &mut [u8]) -> Result<()> {
        let Some(mr) = &self.recv_mr else {
            return Err(::rdma::Error::InvalidArgument("no RECV area".into()));
        };
        mr.read_at(recv as usize * self.recv_stride + at, dst)
    }

    fn response(&self, slot: usize, cqe: &[u8; CQE_BYTES]) -> Result<Sge> {
        let off = slot * CQE_BYTES;
        self.rsp_mr.write_at(off, cqe)?;
        self.rsp_mr.sge(off, CQE_BYTES)
    }

    fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize> {
        self.cq.poll(wcs)
    }

    fn set_error(&self) -> Result<()> {
        match &self.qp {
            Some(qp) => qp.set_error(),
            None => Ok(()),
        }
    }

    fn disconnect(&self) -> Result<()> {
        self.id.disconnect()
    }

    fn regions(&self, out: &mut Vec<RegionInfo>) {
        if let Some(mr) = &self.recv_mr {
            out.push(RegionInfo::of(RegionKind::Recv, mr));
        }
        out.push(RegionInfo::of(RegionKind::Response, &self.rsp_mr));
    }

    fn regions_held(&self) -> usize {
        1 + usize::from(self.recv_mr.is_some())
    }
}

impl DevLink for DevRes {
    type Sink = Mr;

    fn iwarp(&self) -> bool {
        self.iwarp
    }

    fn pool_sge(&self, buf: u32, len: usize) -> Result<Sge> {
        self.pool_mr.sge(buf as usize * self.buf_size, len)
    }

    unsafe fn read_sink(&self, ptr: *mut u8, len: usize) -> Result<(Sge, Mr)> {
        use ::rdma::AccessFlags;
        // SAFETY: the caller keeps [ptr, ptr + len) valid and unreferenced until the Mr drops.
        let mr = unsafe {
            Mr::register_external(
                &self.pd,
                ptr,
                len,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
        }?;
        let sge = mr.sge(0, len)?;
        Ok((sge, mr))
    }

    fn sink_info(sink: &Mr) -> RegionInfo {
        RegionInfo::of(RegionKind::ReadSink, sink)
    }

    fn has_srq(&self) -> bool {
        self.srq.is_some()
    }

    fn srq_completed(&self, i: u32) -> bool {
        self.srq.as_ref().is_some_and(|q| q.completed(i))
    }

    fn srq_repost(&self, i: u32) -> Result<()> {
        match &self.srq {
            Some(q) => q.repost(i),
            None => {
                debug!(
                    i,
                    "repost to a shared receive queue the device does not have"
                );
                Err(::rdma::Error::InvalidArgument(
                    "no shared receive queue".into(),
                ))
            }
        }
    }

    fn srq_read(&self, i: u32, at: usize, dst: &mut [u8]) -> Result<()> {
        match &self.srq {
            Some(q) => q.mr().read_at(i as usize * q.stride() + at, dst),
            None => Err(::rdma::Error::InvalidArgument("no RECV area".into())),
        }
    }
}
