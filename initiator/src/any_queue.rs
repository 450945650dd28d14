//! A queue of either transport, chosen at connect time: [`AnyLink`] and its buffer [`AnyBuf`].
//! The [`crate::Controller`] and a [`crate::Namespace`] hold their queues as
//! [`AnyQueue`](crate::AnyQueue) (`Queue<AnyLink>`); the one place the two transports are told
//! apart at run time is [`AnyLink`]'s `match` per link operation.

use std::ops::{Deref, DerefMut};
use std::time::Instant;

use nvme::Sqe;

use crate::cmd::Transport;
use crate::error::Error;
use crate::queue::{sealed, Buf, Carry, Io, Link, PostError, Queue, WaitFds};
use crate::rdma::{RdmaBuf, RdmaLink, RegisteredBuf};
use crate::tcp::TcpLink;

/// An NVMe/TCP queue (`Vec<u8>` buffers).
pub type IoQueue = Queue<TcpLink>;
/// An NVMe/RDMA queue (registered [`RdmaBuf`]s from [`Queue::alloc_buf`]: zero-copy).
pub type RdmaQueue = Queue<RdmaLink>;
/// A queue of either transport ([`AnyBuf`]s), as [`crate::Controller::take_queue`] hands it
/// out.
pub type AnyQueue = Queue<AnyLink>;

/// A data buffer of an [`AnyQueue`](crate::AnyQueue): a vector (NVMe/TCP) or registered memory
/// (NVMe/RDMA), as the queue's [`Queue::alloc_buf`] made it. Dereferences to its bytes.
#[derive(Debug)]
pub enum AnyBuf {
    /// Plain memory.
    Vec(Vec<u8>),
    /// A buffer of an NVMe/RDMA queue's registered pool.
    Rdma(RdmaBuf),
}

impl Deref for AnyBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            AnyBuf::Vec(v) => v,
            AnyBuf::Rdma(b) => b,
        }
    }
}

impl DerefMut for AnyBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            AnyBuf::Vec(v) => v,
            AnyBuf::Rdma(b) => b,
        }
    }
}

impl AnyBuf {
    /// Sets the length to `len` (a transfer shorter or longer than the last, in the same
    /// memory), keeping the bytes: for a buffer reused across commands of different sizes (a
    /// fio engine's io_u, a block device's request buffer). `cap`: the length it was made
    /// with (a vector: `vec![0; cap]` or the queue's `alloc_buf(cap)`; a registered buffer
    /// knows its own).
    pub fn set_len(&mut self, cap: usize, len: usize) -> Result<(), Error> {
        match self {
            AnyBuf::Rdma(r) => r.set_len(len),
            AnyBuf::Vec(v) => {
                if len > cap || len > v.capacity() {
                    return Err(Error::InvalidArgument(format!(
                        "{len} bytes in a buffer of {cap}"
                    )));
                }
                // SAFETY: the vector was made with `cap` initialized bytes and since then
                // only its length has changed (callers write through its memory, never past
                // `cap`): the bytes up to `cap` are still initialized, and
                // `len <= cap <= capacity`.
                unsafe { v.set_len(len) };
                Ok(())
            }
        }
    }
}

impl From<Vec<u8>> for AnyBuf {
    fn from(v: Vec<u8>) -> AnyBuf {
        AnyBuf::Vec(v)
    }
}

impl Buf for AnyBuf {
    fn from_vec(v: Vec<u8>) -> Option<Self> {
        Some(AnyBuf::Vec(v))
    }
}

impl RegisteredBuf for AnyBuf {
    fn as_rdma(&self) -> Option<&RdmaBuf> {
        match self {
            AnyBuf::Rdma(b) => Some(b),
            AnyBuf::Vec(_) => None,
        }
    }
    fn from_rdma(b: RdmaBuf) -> Option<Self> {
        Some(AnyBuf::Rdma(b))
    }
}

/// The link of an [`AnyQueue`](crate::AnyQueue): NVMe/TCP or NVMe/RDMA.
#[derive(Debug)]
pub enum AnyLink {
    /// NVMe/TCP.
    Tcp(TcpLink<AnyBuf>),
    /// NVMe/RDMA.
    Rdma(RdmaLink<AnyBuf>),
}

macro_rules! each {
    ($self:expr, $l:ident => $e:expr) => {
        match $self {
            AnyLink::Tcp($l) => $e,
            AnyLink::Rdma($l) => $e,
        }
    };
}

impl sealed::Sealed for AnyLink {}

impl Link for AnyLink {
    type Buf = AnyBuf;

    fn qid(&self) -> u16 {
        each!(self, l => l.qid())
    }
    fn tags(&self) -> (u16, u16) {
        each!(self, l => l.tags())
    }
    fn alloc_buf(&self, len: usize) -> Result<AnyBuf, Error> {
        each!(self, l => l.alloc_buf(len))
    }
    fn check_buf(&self, buf: &AnyBuf) -> Result<Carry, Error> {
        each!(self, l => l.check_buf(buf))
    }
    fn stages_borrowed(&self) -> bool {
        each!(self, l => l.stages_borrowed())
    }
    fn in_capsule_limit(&self) -> u32 {
        each!(self, l => l.in_capsule_limit())
    }
    fn set_icd_max(&mut self, bytes: u32) {
        each!(self, l => l.set_icd_max(bytes))
    }
    fn post(
        &mut self,
        io: &mut Io<'_, '_, AnyBuf>,
        tag: u16,
        sqe: &mut Sqe,
    ) -> Result<(), PostError> {
        each!(self, l => l.post(io, tag, sqe))
    }
    fn pump(&mut self, io: &mut Io<'_, '_, AnyBuf>, read: bool) -> Result<(), Error> {
        each!(self, l => l.pump(io, read))
    }
    fn quiet(&self, inflight: usize) -> bool {
        each!(self, l => l.quiet(inflight))
    }
    fn sleep(&mut self, io: &mut Io<'_, '_, AnyBuf>, wake: Instant) -> Result<(), Error> {
        each!(self, l => l.sleep(io, wake))
    }
    fn check(&mut self, io: &mut Io<'_, '_, AnyBuf>) -> Result<(), Error> {
        each!(self, l => l.check(io))
    }
    fn prepare_wait(&mut self, io: &mut Io<'_, '_, AnyBuf>) -> Result<Option<WaitFds>, Error> {
        each!(self, l => l.prepare_wait(io))
    }
    fn after_wait(&mut self, io: &mut Io<'_, '_, AnyBuf>) -> Result<(), Error> {
        each!(self, l => l.after_wait(io))
    }
    fn shut(&mut self) {
        each!(self, l => l.shut())
    }

    fn learns_spin(&self) -> bool {
        each!(self, l => l.learns_spin())
    }
}

impl AnyLink {
    /// The link's transport.
    pub fn transport(&self) -> Transport {
        match self {
            AnyLink::Tcp(_) => Transport::Tcp,
            AnyLink::Rdma(_) => Transport::Rdma,
        }
    }
}

/// A queue of either transport, split by transport (the typed queues need no run-time choice
/// per operation and take their own buffer types).
#[derive(Debug)]
pub enum TypedQueue {
    /// NVMe/TCP.
    Tcp(IoQueue),
    /// NVMe/RDMA.
    Rdma(RdmaQueue),
}

impl Queue<AnyLink> {
    /// The queue's transport.
    pub fn transport(&self) -> Transport {
        self.link().transport()
    }

    /// This queue as the queue type of its transport ([`IoQueue`] with `Vec<u8>`
    /// buffers, [`RdmaQueue`] with [`RdmaBuf`]s). Nothing may be in flight (the queue
    /// comes back otherwise).
    // Both variants are a whole queue, moved once when a queue is handed out.
    #[allow(clippy::result_large_err)]
    pub fn into_typed(self) -> Result<TypedQueue, Queue<AnyLink>> {
        if self.in_flight() > 0 {
            return Err(self);
        }
        Ok(match self.link().transport() {
            Transport::Tcp => TypedQueue::Tcp(self.map_link(|l| match l {
                AnyLink::Tcp(t) => t.retype(),
                AnyLink::Rdma(_) => unreachable!("transport checked"),
            })),
            Transport::Rdma => TypedQueue::Rdma(self.map_link(|l| match l {
                AnyLink::Rdma(r) => r.retype(),
                AnyLink::Tcp(_) => unreachable!("transport checked"),
            })),
        })
    }

    /// MAXH2CDATA of an NVMe/TCP queue (0 over RDMA).
    pub(crate) fn maxh2cdata(&self) -> u32 {
        match self.link() {
            AnyLink::Tcp(l) => l.maxh2cdata(),
            AnyLink::Rdma(_) => 0,
        }
    }
}
