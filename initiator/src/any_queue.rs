//! What the NVMe/TCP and NVMe/RDMA queues have in common.
//!
//! - [`Queue`]: the asynchronous API of both queue types, generic over the buffer type
//!   (`Vec<u8>` over TCP, [`RdmaBuf`] over RDMA), for code that runs on either.
//! - [`AnyQueue`]: a queue of either transport, as the [`crate::Controller`] and a
//!   [`crate::Namespace`] hold it.

use std::fmt::Debug;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use nvme::Sqe;

use crate::controller::{rw_submit_methods, write_zeroes_sqe, NsInfo, Transport};
use crate::error::Error;
use crate::queue::{Completion, Data, DataRef, Dir, IoQueue, Stats, SubmitError};
use crate::rdma::{RdmaBuf, RdmaQueue};

/// The asynchronous queue API, implemented by [`IoQueue`] (NVMe/TCP, `Vec<u8>` buffers) and
/// [`RdmaQueue`] (NVMe/RDMA, registered [`RdmaBuf`]s). Take buffers from
/// [`Queue::alloc_buf`] and the same code runs zero-copy on RDMA.
///
/// ```no_run
/// use initiator::{Controller, NsInfo, Queue};
///
/// fn read_some<Q: Queue>(q: &mut Q, ns: &NsInfo) -> Result<(), initiator::Error> {
///     let bs = ns.block_size as usize;
///     for i in 0..8u64 {
///         let buf = q.alloc_buf(8 * bs)?;
///         q.submit_read(ns, i * 8, buf, i).map_err(|e| e.error)?;
///     }
///     let mut done = Vec::new();
///     while q.in_flight() > 0 {
///         q.reap(&mut done, 1, None)?;
///     }
///     for c in &done {
///         c.result.map_err(initiator::Error::from)?;
///     }
///     Ok(())
/// }
/// ```
pub trait Queue: Send {
    /// The data buffer type.
    type Buf: Deref<Target = [u8]> + DerefMut + Send + Debug;

    /// A buffer of `len` bytes suited to this queue (contents unspecified).
    fn alloc_buf(&self, len: usize) -> Result<Self::Buf, Error>;
    /// Submit a command (see [`IoQueue::submit`], [`RdmaQueue::submit`]).
    fn submit(
        &mut self,
        sqe: Sqe,
        data: Data<Self::Buf>,
        user_data: u64,
    ) -> Result<u16, SubmitError<Self::Buf>>;
    /// Collect completions, waiting for at least `min` or `timeout`.
    fn reap(
        &mut self,
        out: &mut Vec<Completion<Self::Buf>>,
        min: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error>;
    /// Collect completions that are ready, without waiting.
    fn poll(&mut self, out: &mut Vec<Completion<Self::Buf>>) -> Result<usize, Error> {
        self.reap(out, 0, Some(Duration::ZERO))
    }
    /// Counters.
    fn stats(&self) -> Stats;
    /// Commands submitted and not yet reaped.
    fn in_flight(&self) -> usize;
    /// Number of tags.
    fn depth(&self) -> usize;
    /// Free tags.
    fn free_slots(&self) -> usize;
    /// Queue identifier.
    fn qid(&self) -> u16;
    /// Why the queue failed, if it did.
    fn error(&self) -> Option<&Error>;
    /// Whether the queue can still be used.
    fn is_failed(&self) -> bool {
        self.error().is_some()
    }

    rw_submit_methods!(, Self::Buf, u16);

    /// Submit a Write Zeroes of `nlb` blocks (1..=65536) at `slba`.
    fn submit_write_zeroes(
        &mut self,
        ns: &NsInfo,
        slba: u64,
        nlb: u32,
        user_data: u64,
    ) -> Result<u16, SubmitError<Self::Buf>> {
        match write_zeroes_sqe(ns, slba, nlb) {
            Ok(sqe) => self.submit(sqe, Data::None, user_data),
            Err(error) => Err(SubmitError { error, buf: None }),
        }
    }
}

impl Queue for IoQueue {
    type Buf = Vec<u8>;

    fn alloc_buf(&self, len: usize) -> Result<Vec<u8>, Error> {
        Ok(vec![0; len])
    }
    fn submit(&mut self, sqe: Sqe, data: Data, user_data: u64) -> Result<u16, SubmitError> {
        IoQueue::submit(self, sqe, data, user_data)
    }
    fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error> {
        IoQueue::reap(self, out, min, timeout)
    }
    fn stats(&self) -> Stats {
        IoQueue::stats(self)
    }
    fn in_flight(&self) -> usize {
        IoQueue::in_flight(self)
    }
    fn depth(&self) -> usize {
        IoQueue::depth(self)
    }
    fn free_slots(&self) -> usize {
        IoQueue::free_slots(self)
    }
    fn qid(&self) -> u16 {
        IoQueue::qid(self)
    }
    fn error(&self) -> Option<&Error> {
        IoQueue::error(self)
    }
}

impl Queue for RdmaQueue {
    type Buf = RdmaBuf;

    fn alloc_buf(&self, len: usize) -> Result<RdmaBuf, Error> {
        RdmaQueue::alloc_buf(self, len)
    }
    fn submit(
        &mut self,
        sqe: Sqe,
        data: Data<RdmaBuf>,
        user_data: u64,
    ) -> Result<u16, SubmitError<RdmaBuf>> {
        RdmaQueue::submit(self, sqe, data, user_data)
    }
    fn reap(
        &mut self,
        out: &mut Vec<Completion<RdmaBuf>>,
        min: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error> {
        RdmaQueue::reap(self, out, min, timeout)
    }
    fn stats(&self) -> Stats {
        RdmaQueue::stats(self)
    }
    fn in_flight(&self) -> usize {
        RdmaQueue::in_flight(self)
    }
    fn depth(&self) -> usize {
        RdmaQueue::depth(self)
    }
    fn free_slots(&self) -> usize {
        RdmaQueue::free_slots(self)
    }
    fn qid(&self) -> u16 {
        RdmaQueue::qid(self)
    }
    fn error(&self) -> Option<&Error> {
        RdmaQueue::error(self)
    }
}

/// An I/O (or admin) queue of either transport.
#[derive(Debug)]
pub enum AnyQueue {
    /// NVMe/TCP.
    Tcp(IoQueue),
    /// NVMe/RDMA.
    Rdma(RdmaQueue),
}

/// A command's completion deadline: the queue timeout, except for an Asynchronous Event
/// Request, which by design completes only when the controller has an event to report.
pub(crate) fn deadline_for(sqe: &Sqe, qid: u16, timeout: Duration) -> Option<std::time::Instant> {
    if qid == 0 && sqe.opcode == nvme::opcode::admin::ASYNC_EVENT_REQUEST {
        None
    } else {
        Some(std::time::Instant::now() + timeout)
    }
}

macro_rules! each {
    ($self:expr, $q:ident => $e:expr) => {
        match $self {
            AnyQueue::Tcp($q) => $e,
            AnyQueue::Rdma($q) => $e,
        }
    };
}

impl AnyQueue {
    /// The queue's transport.
    pub fn transport(&self) -> Transport {
        match self {
            AnyQueue::Tcp(_) => Transport::Tcp,
            AnyQueue::Rdma(_) => Transport::Rdma,
        }
    }

    /// Queue identifier (0 = admin).
    pub fn qid(&self) -> u16 {
        each!(self, q => q.qid())
    }

    /// Number of tags.
    pub fn depth(&self) -> usize {
        each!(self, q => q.depth())
    }

    /// Commands submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        each!(self, q => q.in_flight())
    }

    /// Free tags.
    pub fn free_slots(&self) -> usize {
        each!(self, q => q.free_slots())
    }

    /// The in-capsule data limit for writes.
    pub fn in_capsule_limit(&self) -> u32 {
        each!(self, q => q.in_capsule_limit())
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        each!(self, q => q.stats())
    }

    /// Why the queue failed, if it did.
    pub fn error(&self) -> Option<&Error> {
        each!(self, q => q.error())
    }

    /// Whether the queue can still be used.
    pub fn is_failed(&self) -> bool {
        each!(self, q => q.is_failed())
    }

    /// Spin instead of sleeping while waiting.
    pub fn set_busy_poll(&mut self, on: bool) {
        each!(self, q => q.set_busy_poll(on))
    }

    /// The NVMe/TCP queue, if it is one.
    pub fn as_tcp(&mut self) -> Option<&mut IoQueue> {
        match self {
            AnyQueue::Tcp(q) => Some(q),
            AnyQueue::Rdma(_) => None,
        }
    }

    /// The NVMe/RDMA queue, if it is one.
    pub fn as_rdma(&mut self) -> Option<&mut RdmaQueue> {
        match self {
            AnyQueue::Rdma(q) => Some(q),
            AnyQueue::Tcp(_) => None,
        }
    }

    /// MAXH2CDATA of an NVMe/TCP queue (0 over RDMA).
    pub(crate) fn maxh2cdata(&self) -> u32 {
        match self {
            AnyQueue::Tcp(q) => q.maxh2cdata(),
            AnyQueue::Rdma(_) => 0,
        }
    }

    pub(crate) fn set_icd_max(&mut self, bytes: u32) {
        each!(self, q => q.set_icd_max(bytes))
    }

    pub(crate) fn run_borrowed(
        &mut self,
        what: &'static str,
        dir: Dir,
        ext: &mut DataRef<'_>,
        cmds: &mut dyn Iterator<Item = (Sqe, usize, u32)>,
    ) -> Result<u64, Error> {
        each!(self, q => q.run_borrowed(what, dir, ext, cmds))
    }

    /// Post an Asynchronous Event Request (admin queue, no data, no deadline).
    pub(crate) fn submit_aer(&mut self) -> Result<u16, Error> {
        let sqe = Sqe::new(nvme::opcode::admin::ASYNC_EVENT_REQUEST, 0);
        match self {
            AnyQueue::Tcp(q) => q.submit(sqe, Data::None, 0).map_err(|e| e.error),
            AnyQueue::Rdma(q) => q.submit(sqe, Data::None, 0).map_err(|e| e.error),
        }
    }

    /// Completions of commands posted with [`AnyQueue::submit_aer`] (the only ones submitted
    /// asynchronously on an admin queue), waiting at most `timeout` for the first.
    pub(crate) fn reap_aers(
        &mut self,
        timeout: Duration,
    ) -> Result<Vec<Result<u64, crate::error::CmdError>>, Error> {
        Ok(match self {
            AnyQueue::Tcp(q) => {
                let mut out = Vec::new();
                q.reap(&mut out, 1, Some(timeout))?;
                out.into_iter().map(|c| c.result).collect()
            }
            AnyQueue::Rdma(q) => {
                let mut out = Vec::new();
                q.reap(&mut out, 1, Some(timeout))?;
                out.into_iter().map(|c| c.result).collect()
            }
        })
    }

    pub(crate) fn execute(
        &mut self,
        what: &'static str,
        sqe: Sqe,
        ext: DataRef<'_>,
    ) -> Result<u64, Error> {
        each!(self, q => q.execute(what, sqe, ext))
    }
}

impl From<IoQueue> for AnyQueue {
    fn from(q: IoQueue) -> AnyQueue {
        AnyQueue::Tcp(q)
    }
}

impl From<RdmaQueue> for AnyQueue {
    fn from(q: RdmaQueue) -> AnyQueue {
        AnyQueue::Rdma(q)
    }
}
