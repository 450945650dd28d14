//! The host queue: one type for both transports.
//!
//! [`Queue`] owns everything about a queue's commands that does not depend on the transport:
//! the tags and their slots (one per command in flight), each command's state
//! ([`crate::state`]), deadlines, completion delivery ([`Queue::reap`], [`Queue::poll`], the
//! synchronous [`Queue::run_borrowed`]), statistics, how a wait spins and sleeps
//! ([`crate::spin`]), and the failure fan-out (a failed queue completes every command it
//! held). It is generic over a [`Link`], the transport's half, implemented once for NVMe/TCP
//! ([`crate::tcp::TcpLink`]) and once for NVMe/RDMA ([`crate::rdma::RdmaLink`]): post a
//! command's capsule, pump (send what is queued, process what arrived, without blocking),
//! sleep until there may be progress, shut down. [`AnyLink`](crate::AnyLink) is either, chosen
//! at connect time.
//!
//! A link reports what happens to a command through [`Io`]: the response's result
//! ([`Io::record`]) and the two events of the state machine ([`Io::event`]); the queue finishes
//! the command when both have been seen.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::cmd::{PSDT_MASK, PSDT_SGL};
use nvme::Sqe;

use crate::cmd::{Completion, Data, DataRef, Dir, Stats, SubmitError};
use crate::error::{CmdError, Error};
use crate::spin::{Spin, SpinScore, SpinWindow};
use crate::state::{next, CmdEvent, CmdState};

/// A data buffer a queue can carry: `Vec<u8>` (NVMe/TCP), [`crate::RdmaBuf`] (registered memory
/// of an NVMe/RDMA queue's pool) or [`crate::AnyBuf`] (either, for an [`crate::AnyQueue`]).
pub trait Buf: Deref<Target = [u8]> + DerefMut + Send + Debug + Sized + 'static {
    /// This buffer type made from a plain vector, if it can hold one.
    #[doc(hidden)]
    fn from_vec(v: Vec<u8>) -> Option<Self>;
}

impl Buf for Vec<u8> {
    fn from_vec(v: Vec<u8>) -> Option<Self> {
        Some(v)
    }
}

pub(crate) mod sealed {
    /// Only this crate's links implement [`super::Link`].
    pub trait Sealed {}
}

/// How a link carries a caller's buffer ([`Link::check_buf`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carry {
    /// As it is.
    Direct,
    /// Through a link buffer: one copy per byte (in for a write, out for a read).
    Staged,
}

/// Why a link did not post a command.
#[derive(Debug)]
pub enum PostError {
    /// Refused (no room): the queue is fine, the caller gets the error.
    Refused(Error),
    /// The transport broke: the queue fails.
    Failed(Error),
}

/// The transport's half of a [`Queue`]: NVMe/TCP ([`crate::tcp::TcpLink`]), NVMe/RDMA
/// ([`crate::rdma::RdmaLink`]) or either ([`AnyLink`](crate::AnyLink)). Implemented in this
/// crate only; its methods are the queue's business.
pub trait Link: Send + Debug + sealed::Sealed {
    /// The data buffer type of the queue.
    type Buf: Buf;

    /// Queue identifier (0 = admin).
    #[doc(hidden)]
    fn qid(&self) -> u16;
    /// Tags the queue has (slots) and how many of them it may use at once.
    #[doc(hidden)]
    fn tags(&self) -> (u16, u16);
    /// A buffer of `len` bytes suited to this link.
    #[doc(hidden)]
    fn alloc_buf(&self, len: usize) -> Result<Self::Buf, Error>;
    /// Whether `buf` can carry data on this link as it is, or must be staged in one of
    /// [`Link::alloc_buf`]'s buffers (a plain vector on RDMA), or is refused.
    #[doc(hidden)]
    fn check_buf(&self, buf: &Self::Buf) -> Result<Carry, Error>;
    /// Whether borrowed data ([`DataRef`]) must be staged in one of [`Link::alloc_buf`]'s
    /// buffers (RDMA: the device reaches registered memory only).
    #[doc(hidden)]
    fn stages_borrowed(&self) -> bool;
    /// Largest write carried in the capsule.
    #[doc(hidden)]
    fn in_capsule_limit(&self) -> u32;
    #[doc(hidden)]
    fn set_icd_max(&mut self, bytes: u32);
    /// Send (or queue) the capsule of command `tag`, whose slot is filled in; `sqe` has its CID
    /// and PSDT set, the link sets the data pointer (the queue keeps the SQE as posted).
    #[doc(hidden)]
    fn post(
        &mut self,
        io: &mut Io<'_, '_, Self::Buf>,
        tag: u16,
        sqe: &mut Sqe,
    ) -> Result<(), PostError>;
    /// Make progress without blocking: send what is queued and, with `read`, process what
    /// arrived.
    #[doc(hidden)]
    fn pump(&mut self, io: &mut Io<'_, '_, Self::Buf>, read: bool) -> Result<(), Error>;
    /// Whether a read now can only find nothing (every command in flight was posted since the
    /// last read found the link empty): a queue that will sleep anyway skips it.
    #[doc(hidden)]
    fn quiet(&self, inflight: usize) -> bool;
    /// Sleep until there may be progress, or `wake`.
    #[doc(hidden)]
    fn sleep(&mut self, io: &mut Io<'_, '_, Self::Buf>, wake: Instant) -> Result<(), Error>;
    /// [`Link::sleep`] split for another event loop: get ready to wait and say on what
    /// (`None`: there is progress to make now).
    #[doc(hidden)]
    fn prepare_wait(&mut self, io: &mut Io<'_, '_, Self::Buf>) -> Result<Option<WaitFds>, Error>;
    /// After the wait [`Link::prepare_wait`] asked for (a descriptor fired).
    #[doc(hidden)]
    fn after_wait(&mut self, io: &mut Io<'_, '_, Self::Buf>) -> Result<(), Error>;
    /// The occasional check of a spinning queue (RDMA: connection-manager events).
    #[doc(hidden)]
    fn check(&mut self, io: &mut Io<'_, '_, Self::Buf>) -> Result<(), Error>;
    /// The queue failed: stop the transport so no buffer handed back is still in its use.
    #[doc(hidden)]
    fn shut(&mut self);
    /// Whether waits may learn to skip spinning ([`crate::spin`]): not on RDMA, where a sleep
    /// on the completion channel costs far more than a spin budget (rxe on Linux 6.12 under
    /// emulation: I/O 2.5x slower when waits slept at once).
    #[doc(hidden)]
    fn learns_spin(&self) -> bool {
        true
    }
}

/// What a queue waits on when it has nothing to do ([`Queue::prepare_wait`]): up to two
/// descriptors, each to be readable, or also writable when its flag is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitFds {
    pub fds: [Option<(std::os::fd::RawFd, bool)>; 2],
}

/// Where a slot's data lives.
#[derive(Debug, Default)]
pub(crate) enum SlotBuf<B> {
    #[default]
    None,
    /// Owned by the slot until completion ([`Queue::submit`]).
    Owned(B),
    /// At this offset of the caller's borrowed buffer ([`Queue::run_borrowed`]).
    Ext(usize),
    /// A link buffer holding (writes) or receiving (reads) the piece of the borrowed buffer at
    /// this offset, for links that stage borrowed data.
    Staged(B, usize),
    /// The caller's buffer (`caller`) and the link buffer carrying its data (`link`), for a
    /// submitted buffer the link cannot reach (a plain vector on RDMA).
    Copied { caller: B, link: B },
}

/// Per-tag state.
#[derive(Debug)]
pub(crate) struct Slot<B> {
    pub state: CmdState,
    /// The command as posted (CID, PSDT and data pointer included).
    pub sqe: Sqe,
    /// Submission number on this queue.
    pub seq: u64,
    pub user_data: u64,
    pub buf: SlotBuf<B>,
    pub dir: Dir,
    pub len: u32,
    /// The response's result (set when it arrives, or by the failure).
    pub result: Option<Result<u64, CmdError>>,
    pub deadline: Deadline,
}

/// When a command in flight times out. A command is stamped at the first clock reading after
/// it was posted (a wait's deadline check), not at its submission: at deep queue depths many
/// commands share one reading and most complete before any. So a deadline is never earlier
/// than submission + timeout, and at most one check interval (1024 spins, or the start of a
/// sleep) later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// None (an Asynchronous Event Request waits for an event, however long).
    Never,
    /// The queue timeout applies from the next clock reading.
    Unstamped,
    At(Instant),
}

impl<B> Default for Slot<B> {
    fn default() -> Slot<B> {
        Slot {
            state: CmdState::Free,
            sqe: Sqe::new(0, 0),
            seq: 0,
            user_data: 0,
            buf: SlotBuf::None,
            dir: Dir::None,
            len: 0,
            result: None,
            deadline: Deadline::Never,
        }
    }
}

impl<B> Slot<B> {
    /// The buffer the link moves data through, if the slot owns one.
    pub fn own_buf(&self) -> Option<&B> {
        match &self.buf {
            SlotBuf::Owned(b) | SlotBuf::Staged(b, _) | SlotBuf::Copied { link: b, .. } => Some(b),
            _ => None,
        }
    }
}

/// What the queue keeps per command, and what a link reaches through [`Io`].
#[derive(Debug)]
pub(crate) struct Core<B> {
    pub slots: Box<[Slot<B>]>,
    /// Finished commands submitted with [`Queue::submit`], in completion order.
    done: VecDeque<u16>,
    /// Finished commands of [`Queue::run_borrowed`].
    ext_done: Vec<u16>,
    pub stats: Stats,
    /// Where the queue's deadlines read the time.
    pub(crate) clock: Clock,
}

/// Where a queue's time comes from: the system's monotonic clock, or (unit tests) a clock the
/// test holds, which a sleep moves to its wake-up time at once (deadlines and timeouts are
/// tested without waiting for them).
#[derive(Debug, Clone, Default)]
pub(crate) enum Clock {
    #[default]
    Real,
    #[cfg(test)]
    Virtual(Arc<std::sync::Mutex<Instant>>),
}

impl Clock {
    #[inline]
    pub(crate) fn now(&self) -> Instant {
        match self {
            Clock::Real => Instant::now(),
            #[cfg(test)]
            Clock::Virtual(t) => *t.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// A virtual clock at the system's now.
    #[cfg(test)]
    pub(crate) fn virtual_now() -> Clock {
        Clock::Virtual(Arc::new(std::sync::Mutex::new(Instant::now())))
    }

    /// A virtual clock: move it forward to `t` (a sleep until `t` that takes no time).
    #[cfg(test)]
    pub(crate) fn pass_until(&self, t: Instant) {
        if let Clock::Virtual(v) = self {
            let mut now = v.lock().unwrap_or_else(|p| p.into_inner());
            *now = (*now).max(t);
        }
    }
}

impl<B> Core<B> {
    /// `tags` free slots and room for as many completions (no allocation once running).
    fn new(tags: usize, stats: Stats) -> Core<B> {
        Core {
            slots: (0..tags).map(|_| Slot::default()).collect(),
            done: VecDeque::with_capacity(tags),
            ext_done: Vec::with_capacity(tags),
            stats,
            clock: Clock::Real,
        }
    }

    fn finish(&mut self, tag: u16) {
        let slot = &mut self.slots[tag as usize];
        slot.deadline = Deadline::Never;
        self.stats.completed += 1;
        if matches!(slot.result, Some(Ok(_))) {
            self.stats.payload_bytes += slot.len as u64;
        }
        if matches!(slot.buf, SlotBuf::Ext(_) | SlotBuf::Staged(..)) {
            self.ext_done.push(tag);
        } else {
            self.done.push_back(tag);
        }
    }
}

/// A link's view of the queue while it works: the slots (their buffers, the caller's borrowed
/// buffer), the statistics, and the way to report what happened to a command.
pub struct Io<'a, 'e, B> {
    pub(crate) core: &'a mut Core<B>,
    pub(crate) ext: &'a mut DataRef<'e>,
}

impl<B: Buf> Io<'_, '_, B> {
    pub(crate) fn slot(&self, tag: u16) -> Option<&Slot<B>> {
        self.core.slots.get(tag as usize)
    }

    pub(crate) fn stats(&mut self) -> &mut Stats {
        &mut self.core.stats
    }

    /// Whether command `tag` exists and is waiting for its response.
    pub(crate) fn awaits_response(&self, tag: u16) -> bool {
        self.slot(tag)
            .is_some_and(|s| s.state.awaits_response() && s.result.is_none())
    }

    /// The bytes `[off, off + len)` of command `tag`'s data, for sending.
    pub(crate) fn data(&self, tag: u16, off: u32, len: u32) -> &[u8] {
        let slot = &self.core.slots[tag as usize];
        let (off, len) = (off as usize, len as usize);
        match (&slot.buf, &*self.ext) {
            (SlotBuf::Owned(v) | SlotBuf::Staged(v, _) | SlotBuf::Copied { link: v, .. }, _) => {
                &v[off..off + len]
            }
            (SlotBuf::Ext(base), DataRef::Write(b)) => &b[base + off..base + off + len],
            // Only write slots have transmit data, and borrowed-buffer slots exist only inside
            // `run_borrowed`, which passes its buffer to every pump.
            _ => unreachable!("write data of a slot without a write buffer"),
        }
    }

    /// Command `tag`'s whole receive buffer.
    pub(crate) fn data_mut(&mut self, tag: u16) -> &mut [u8] {
        let slot = &mut self.core.slots[tag as usize];
        let len = slot.len as usize;
        match (&mut slot.buf, &mut *self.ext) {
            (SlotBuf::Owned(v) | SlotBuf::Staged(v, _) | SlotBuf::Copied { link: v, .. }, _) => {
                &mut v[..len]
            }
            (SlotBuf::Ext(base), DataRef::Read(b)) => &mut b[*base..*base + len],
            // Read data is accepted only for read slots, and borrowed-buffer slots exist only
            // inside `run_borrowed`, which passes its buffer to every pump.
            _ => unreachable!("read data for a slot without a read buffer"),
        }
    }

    /// The response to command `tag` carried this result (the event comes separately).
    pub(crate) fn record(&mut self, tag: u16, res: Result<u64, CmdError>) {
        self.core.slots[tag as usize].result = Some(res);
    }

    /// Move command `tag` through the state machine; it is finished when both events have
    /// been seen. `Err` names an event that cannot happen now (the peer broke the protocol).
    pub(crate) fn event(&mut self, tag: u16, ev: CmdEvent) -> Result<(), String> {
        let Some(slot) = self.core.slots.get_mut(tag as usize) else {
            return Err(format!(
                "command {tag}: {ev:?} for a tag the queue does not have"
            ));
        };
        match next(slot.state, ev) {
            Some(n) => {
                slot.state = n;
                if n == CmdState::Done {
                    self.core.finish(tag);
                }
                Ok(())
            }
            None => Err(format!("command {tag}: {ev:?} while {:?}", slot.state)),
        }
    }
}

/// What [`Queue::reap_with`] hands each completion to, with the command as posted and its data
/// direction.
pub(crate) type OnCompletion<'a, B> = dyn FnMut(Completion<B>, &Sqe, Dir) + 'a;

/// Parameters of one queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueParams {
    pub qid: u16,
    /// Tags (commands in flight at most).
    pub depth: u16,
    pub hdgst: bool,
    pub ddgst: bool,
    pub timeout: Duration,
    /// How waits spin before they sleep.
    pub spin: Spin,
}

/// A command's completion deadline: the queue timeout (stamped later, see [`Deadline`]),
/// except for an Asynchronous Event Request, which by design completes only when the
/// controller has an event to report.
fn deadline_for(sqe: &Sqe, qid: u16) -> Deadline {
    if qid == 0 && sqe.opcode == nvme::opcode::admin::ASYNC_EVENT_REQUEST {
        Deadline::Never
    } else {
        Deadline::Unstamped
    }
}

/// One host queue (an I/O queue or the admin queue) over the link `L`. Not shared between
/// threads: give each thread its own.
///
/// [`IoQueue`](crate::IoQueue) is the NVMe/TCP queue (`Vec<u8>` buffers),
/// [`RdmaQueue`](crate::RdmaQueue) the NVMe/RDMA one (registered [`crate::RdmaBuf`]s from
/// [`Queue::alloc_buf`]: zero-copy), [`AnyQueue`](crate::AnyQueue) either (what
/// [`crate::Controller::take_queue`] hands out). Code for any of them is generic over the link:
///
/// ```no_run
/// use nvmf_initiator::{Link, NsInfo, Queue};
///
/// fn read_some<L: Link>(q: &mut Queue<L>, ns: &NsInfo) -> Result<(), nvmf_initiator::Error> {
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
///         c.result.map_err(nvmf_initiator::Error::from)?;
///     }
///     Ok(())
/// }
/// ```
#[derive(Debug)]
pub struct Queue<L: Link> {
    // First: dropping the link stops the transport before the slots' buffers go.
    link: L,
    core: Core<L::Buf>,
    qid: u16,
    free: Vec<u16>,
    inflight: usize,
    failed: Option<Arc<Error>>,
    timeout: Duration,
    spin: Spin,
    /// Whether spinning has been paying (see [`crate::spin`]).
    score: SpinScore,
    spins: u32,
    /// Commands submitted so far (numbers them in [`Slot::seq`]).
    submitted: u64,
}

impl<L: Link> Queue<L> {
    /// A queue over a connected link.
    pub(crate) fn new(link: L, timeout: Duration, spin: Spin) -> Queue<L> {
        let (tags, usable) = link.tags();
        let score = SpinScore::new(link.learns_spin());
        let tags = tags.max(1);
        Queue {
            qid: link.qid(),
            link,
            core: Core::new(tags as usize, Stats::default()),
            free: (0..usable.clamp(1, tags)).rev().collect(),
            inflight: 0,
            failed: None,
            timeout,
            spin,
            score,
            spins: 0,
            submitted: 0,
        }
    }

    /// The same queue over another link type (`f` converts the link); nothing may be in
    /// flight.
    pub(crate) fn map_link<M: Link>(self, f: impl FnOnce(L) -> M) -> Queue<M> {
        debug_assert_eq!(self.inflight, 0);
        let Queue {
            link,
            core,
            qid,
            free,
            inflight,
            failed,
            timeout,
            spin,
            score,
            spins,
            submitted,
        } = self;
        let link = f(link);
        Queue {
            score: if link.learns_spin() {
                score
            } else {
                SpinScore::new(false)
            },
            link,
            core: Core::new(core.slots.len(), core.stats),
            qid,
            free,
            inflight,
            failed,
            timeout,
            spin,
            spins,
            submitted,
        }
    }

    /// The transport half.
    pub fn link(&self) -> &L {
        &self.link
    }

    /// Queue identifier (0 = admin).
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Number of tags.
    pub fn depth(&self) -> usize {
        self.core.slots.len()
    }

    /// Commands submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.inflight
    }

    /// Free tags.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// The in-capsule data limit for writes on this queue (0: none in the capsule).
    pub fn in_capsule_limit(&self) -> u32 {
        self.link.in_capsule_limit()
    }

    /// The unit tests' clock (see [`Clock`]).
    #[cfg(test)]
    pub(crate) fn set_clock(&mut self, clock: Clock) {
        self.core.clock = clock;
    }

    pub(crate) fn set_icd_max(&mut self, bytes: u32) {
        self.link.set_icd_max(bytes);
    }

    /// Counters (see [`Stats`]).
    pub fn stats(&self) -> Stats {
        self.core.stats
    }

    /// Why the queue failed, if it did.
    pub fn error(&self) -> Option<&Error> {
        self.failed.as_deref()
    }

    /// Whether the queue can still be used.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Spin without bound instead of sleeping after the spin budget
    /// ([`crate::ConnectOptions::poll_spin`]) while waiting: a busy core while I/O is in flight.
    pub fn set_busy_poll(&mut self, on: bool) {
        self.spin.always = on;
    }

    /// A buffer of `len` bytes suited to this queue (contents unspecified): a vector over
    /// NVMe/TCP; over NVMe/RDMA a buffer from the queue's registered pool (1 byte to 8 MiB),
    /// whose memory the target reads or writes directly. The first buffer of a size class
    /// registers a slab (a slow path); later ones come from the free list.
    pub fn alloc_buf(&self, len: usize) -> Result<L::Buf, Error> {
        self.link.alloc_buf(len)
    }

    pub(crate) fn failed_error(&self) -> Option<Error> {
        self.failed.as_ref().map(|c| Error::QueueFailed {
            qid: self.qid,
            cause: c.clone(),
        })
    }

    /// Submit a command. The queue sets the command identifier (the returned tag), PSDT and
    /// the data pointer (in-capsule data for a write that fits; otherwise a transport SGL over
    /// TCP, a keyed SGL naming the buffer over RDMA). The buffer comes back in the
    /// [`Completion`]. Over RDMA a buffer from this queue's [`Queue::alloc_buf`] is used in
    /// place (zero-copy); a plain vector of an [`crate::AnyQueue`] is carried in a pool buffer
    /// (one copy per byte); a registered buffer of another queue is refused.
    pub fn submit(
        &mut self,
        sqe: Sqe,
        data: Data<L::Buf>,
        user_data: u64,
    ) -> Result<u16, SubmitError<L::Buf>> {
        let (dir, buf) = match data {
            Data::None => (Dir::None, None),
            Data::ToController(v) => (Dir::ToCtrl, Some(v)),
            Data::FromController(v) => (Dir::FromCtrl, Some(v)),
        };
        let len = buf.as_ref().map_or(0, |b| b.len());
        let Ok(len) = u32::try_from(len) else {
            let error = Error::InvalidArgument(format!("buffer of {len} bytes"));
            return Err(SubmitError { error, buf });
        };
        if let Some(error) = self.failed_error() {
            return Err(SubmitError { error, buf });
        }
        let carry = match buf.as_ref().map(|b| self.link.check_buf(b)) {
            Some(Err(error)) => return Err(SubmitError { error, buf }),
            Some(Ok(c)) => c,
            None => Carry::Direct,
        };
        if self.free.is_empty() {
            return Err(SubmitError {
                error: Error::QueueFull,
                buf,
            });
        }
        let sb = match (buf, carry) {
            (None, _) => SlotBuf::None,
            (Some(v), Carry::Direct) => SlotBuf::Owned(v),
            (Some(caller), Carry::Staged) => match self.link.alloc_buf(caller.len()) {
                Ok(mut link) => {
                    if dir == Dir::ToCtrl {
                        link.copy_from_slice(&caller);
                        self.core.stats.memcpy_bytes += caller.len() as u64;
                    }
                    SlotBuf::Copied { caller, link }
                }
                Err(error) => {
                    return Err(SubmitError {
                        error,
                        buf: Some(caller),
                    })
                }
            },
        };
        self.start(sqe, dir, len, sb, user_data, &mut DataRef::None)
            .map_err(|(error, sb)| SubmitError {
                error,
                buf: match sb {
                    SlotBuf::Owned(b) | SlotBuf::Copied { caller: b, .. } => Some(b),
                    _ => None,
                },
            })
    }

    /// Start a command on a free tag (the caller checked there is one).
    fn start(
        &mut self,
        mut sqe: Sqe,
        dir: Dir,
        len: u32,
        buf: SlotBuf<L::Buf>,
        user_data: u64,
        ext: &mut DataRef<'_>,
    ) -> Result<u16, (Error, SlotBuf<L::Buf>)> {
        let tag = self.free.pop().expect("caller checked for a free tag");
        sqe.cid = tag.into();
        sqe.flags = (sqe.flags & !PSDT_MASK) | PSDT_SGL;
        self.submitted += 1;
        self.core.slots[tag as usize] = Slot {
            state: next(CmdState::Free, CmdEvent::Posted).expect("a free tag can be posted"),
            sqe,
            seq: self.submitted,
            user_data,
            buf,
            dir,
            len,
            result: None,
            deadline: deadline_for(&sqe, self.qid),
        };
        let posted = self.link.post(
            &mut Io {
                core: &mut self.core,
                ext,
            },
            tag,
            &mut sqe,
        );
        match posted {
            Ok(()) => {
                self.core.slots[tag as usize].sqe = sqe;
                self.inflight += 1;
                self.core.stats.commands += 1;
                Ok(tag)
            }
            Err(e) => {
                let slot = std::mem::take(&mut self.core.slots[tag as usize]);
                self.free.push(tag);
                let e = match e {
                    PostError::Refused(e) => e,
                    PostError::Failed(e) => self.fail(e),
                };
                Err((e, slot.buf))
            }
        }
    }

    fn release(&mut self, tag: u16) -> Slot<L::Buf> {
        let slot = std::mem::take(&mut self.core.slots[tag as usize]);
        debug_assert_eq!(next(slot.state, CmdEvent::Reaped), Some(CmdState::Free));
        self.free.push(tag);
        self.inflight -= 1;
        slot
    }

    /// Fail the queue: stop the transport, then complete everything in flight (a command
    /// whose response arrived keeps it: the target did execute it).
    fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            let timeout = matches!(e, Error::Timeout(..));
            tracing::warn!(qid = self.qid, error = %e, "queue failed");
            self.failed = Some(Arc::new(e));
            self.link.shut();
            let err = if timeout {
                CmdError::Timeout
            } else {
                CmdError::QueueFailed
            };
            // In submission order, so a caller that submits them again keeps it.
            let mut live: Vec<u16> = (0..self.core.slots.len() as u16)
                .filter(|&t| self.core.slots[t as usize].state.in_flight())
                .collect();
            live.sort_by_key(|&t| self.core.slots[t as usize].seq);
            for tag in live {
                let s = &mut self.core.slots[tag as usize];
                s.result.get_or_insert(Err(err));
                s.state = next(s.state, CmdEvent::QueueFailed).expect("in flight");
                self.core.finish(tag);
            }
        }
        self.failed_error().expect("set above")
    }

    /// Send what is queued and process what arrived, without blocking (`read`: also read).
    fn pump(&mut self, ext: &mut DataRef<'_>, read: bool) -> Result<(), Error> {
        if let Some(e) = self.failed_error() {
            return Err(e);
        }
        let r = self.link.pump(
            &mut Io {
                core: &mut self.core,
                ext,
            },
            read,
        );
        r.map_err(|e| self.fail(e))
    }

    /// Wait for the link: with `spin`, return at once (checking the command deadlines and the
    /// link every 1024th time); else sleep until there may be progress, a command times out,
    /// or `until`.
    fn wait(&mut self, until: Option<Instant>, spin: bool) -> Result<(), Error> {
        self.spins = self.spins.wrapping_add(1);
        if spin && self.spins % 1024 != 0 {
            std::hint::spin_loop();
            return Ok(());
        }
        let now = self.core.clock.now();
        let mut oldest: Option<Instant> = None;
        for s in self.core.slots.iter_mut() {
            if !s.state.in_flight() || s.result.is_some() {
                continue;
            }
            let d = match s.deadline {
                Deadline::Never => continue,
                Deadline::Unstamped => {
                    let d = now + self.timeout;
                    s.deadline = Deadline::At(d);
                    d
                }
                Deadline::At(d) => d,
            };
            oldest = Some(oldest.map_or(d, |o| o.min(d)));
        }
        if oldest.is_some_and(|d| d <= now) {
            return Err(self.fail(Error::Timeout(self.timeout, "a command completion")));
        }
        let mut ext = DataRef::None;
        let mut io = Io {
            core: &mut self.core,
            ext: &mut ext,
        };
        let r = if spin {
            self.link.check(&mut io)
        } else {
            let wake = match (oldest, until) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(now + self.timeout),
            };
            self.link.sleep(&mut io, wake)
        };
        r.map_err(|e| self.fail(e))
    }

    /// Collect completions into `out` (appended), waiting until at least `min` are available
    /// (at most as many as are in flight) or `timeout` passes (`None`: the queue's I/O timeout
    /// bounds every wait through the command deadlines). Returns how many were added.
    ///
    /// When the queue fails, the completions of every command it held are returned (with
    /// [`CmdError::QueueFailed`] or [`CmdError::Timeout`]); once none are left, `reap` returns
    /// the failure.
    pub fn reap(
        &mut self,
        out: &mut Vec<Completion<L::Buf>>,
        min: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error> {
        self.reap_with(min, timeout, &mut |c, _, _| out.push(c))
    }

    /// [`Queue::reap`], handing each completion to `each` with the command as it was posted and
    /// its data direction (what a caller needs to submit it again: [`crate::ReconnectingQueue`]).
    pub(crate) fn reap_with(
        &mut self,
        min: usize,
        timeout: Option<Duration>,
        each: &mut OnCompletion<'_, L::Buf>,
    ) -> Result<usize, Error> {
        let until = timeout.map(|t| self.core.clock.now() + t);
        let want = min.min(self.inflight);
        let mut got = 0;
        // Skip the first read when it can only find nothing (see `Link::quiet`) and this call
        // will sleep at once: the sleep waits for the link, and the pass after it reads. At
        // QD1 over TCP that makes an I/O three system calls (send, poll, read) instead of
        // four. A queue that spins first reads at once.
        let mut window = SpinWindow::default();
        let mut skip_rx = want > 0
            && self.spin == Spin::NEVER
            && timeout.is_none_or(|t| t >= Duration::from_millis(1))
            && self.core.done.is_empty()
            && self.link.quiet(self.inflight);
        loop {
            let skipped = std::mem::take(&mut skip_rx);
            let pumped = self.pump(&mut DataRef::None, !skipped);
            while let Some(tag) = self.core.done.pop_front() {
                let s = self.release(tag);
                let result = s.result.unwrap_or(Err(CmdError::QueueFailed));
                let buf = match s.buf {
                    SlotBuf::Owned(b) => Some(b),
                    SlotBuf::Copied {
                        mut caller,
                        link: b,
                    } => {
                        if s.dir == Dir::FromCtrl && result.is_ok() {
                            caller.copy_from_slice(&b);
                            self.core.stats.memcpy_bytes += b.len() as u64;
                        }
                        Some(caller)
                    }
                    _ => None,
                };
                let c = Completion {
                    tag,
                    user_data: s.user_data,
                    result,
                    buf,
                };
                each(c, &s.sqe, s.dir);
                got += 1;
            }
            if let Err(e) = pumped {
                return if got > 0 { Ok(got) } else { Err(e) };
            }
            if got >= want {
                window.finish(&mut self.score);
                return Ok(got);
            }
            // After a pass without a read, wait (sleep) once whatever the time: never return
            // without having looked at the link.
            if !skipped && until.is_some_and(|u| self.core.clock.now() >= u) {
                return Ok(got);
            }
            // A failure here (a command timed out) completed everything in flight: the next
            // pass hands those completions out, then reports the failure.
            let spin = !skipped && window.spin(self.spin, &mut self.score);
            let _ = self.wait(until, spin);
        }
    }

    /// Send what submissions have queued (NVMe/TCP: capsules submitted since the last wait
    /// leave in one `writev`), without looking for completions: for a caller that submits in
    /// bursts and reaps later (fio's commit). Waits send on their own.
    pub fn send(&mut self) -> Result<(), Error> {
        self.pump(&mut DataRef::None, false)
    }

    /// Collect completions that are ready, without waiting.
    pub fn poll(&mut self, out: &mut Vec<Completion<L::Buf>>) -> Result<usize, Error> {
        self.reap(out, 0, Some(Duration::ZERO))
    }

    /// For a caller that waits in its own event loop (an async executor, an io_uring) instead
    /// of in [`Queue::reap`]: after [`Queue::poll`] found nothing, this gets the link ready to
    /// wait (over RDMA it arms the completion queue) and says on which descriptors; `None`
    /// when there is progress to make already (poll again). Once one fired, call
    /// [`Queue::after_wait`], then [`Queue::poll`]. Command timeouts are checked by `poll`,
    /// so the loop should also call it now and then (every second or so) while commands are
    /// in flight.
    pub fn prepare_wait(&mut self) -> Result<Option<WaitFds>, Error> {
        if let Some(e) = self.failed_error() {
            return Err(e);
        }
        let mut ext = DataRef::None;
        let mut io = Io {
            core: &mut self.core,
            ext: &mut ext,
        };
        let r = self.link.prepare_wait(&mut io);
        r.map_err(|e| self.fail(e))
    }

    /// A descriptor [`Queue::prepare_wait`] named fired (or the wait ended anyway).
    pub fn after_wait(&mut self) -> Result<(), Error> {
        let mut ext = DataRef::None;
        let mut io = Io {
            core: &mut self.core,
            ext: &mut ext,
        };
        let r = self.link.after_wait(&mut io);
        r.map_err(|e| self.fail(e))
    }

    /// The slot buffer for a piece `[off, off + len)` of a borrowed buffer: the borrowed
    /// memory itself, or a link buffer (filled for a write) when the link stages.
    fn borrowed_buf(
        &mut self,
        dir: Dir,
        ext: &DataRef<'_>,
        off: usize,
        len: u32,
    ) -> Result<SlotBuf<L::Buf>, Error> {
        // Without data there is nothing to stage; `Ext` still marks the command as one of
        // `run_borrowed`'s (its completion goes to `ext_done`).
        if !self.link.stages_borrowed() || len == 0 {
            return Ok(SlotBuf::Ext(off));
        }
        let mut b = self.link.alloc_buf(len as usize)?;
        if dir == Dir::ToCtrl {
            let DataRef::Write(src) = ext else {
                return Err(Error::InvalidArgument(
                    "write command without write data".into(),
                ));
            };
            b.copy_from_slice(&src[off..off + len as usize]);
            self.core.stats.memcpy_bytes += len as u64;
        }
        Ok(SlotBuf::Staged(b, off))
    }

    /// Run commands whose data are consecutive pieces of one borrowed buffer, as many at a
    /// time as there are free tags, and wait for all of them. `cmds` yields `(sqe, offset,
    /// length)` within `ext`. Returns the CQE result of the last command (for single-command
    /// use) or the first failure.
    pub(crate) fn run_borrowed(
        &mut self,
        what: &'static str,
        dir: Dir,
        ext: &mut DataRef<'_>,
        cmds: &mut dyn Iterator<Item = (Sqe, usize, u32)>,
    ) -> Result<u64, Error> {
        let mut pending = 0usize;
        let mut first_err: Option<CmdError> = None;
        let mut local_err: Option<Error> = None;
        let mut last = 0u64;
        let mut next_cmd = cmds.next();
        let mut window = SpinWindow::default();
        loop {
            if let Some(e) = self.failed_error() {
                return Err(e);
            }
            while first_err.is_none() && local_err.is_none() && !self.free.is_empty() {
                let Some((sqe, off, len)) = next_cmd.take() else {
                    break;
                };
                let buf = match self.borrowed_buf(dir, ext, off, len) {
                    Ok(b) => b,
                    Err(e) => {
                        local_err = Some(e);
                        break;
                    }
                };
                if let Err((e, _)) = self.start(sqe, dir, len, buf, 0, ext) {
                    local_err = Some(e);
                    break;
                }
                pending += 1;
                next_cmd = cmds.next();
            }
            if pending == 0 {
                break;
            }
            let pumped = self.pump(ext, true);
            while let Some(tag) = self.core.ext_done.pop() {
                let s = self.release(tag);
                pending -= 1;
                match s.result.unwrap_or(Err(CmdError::QueueFailed)) {
                    Ok(v) => {
                        last = v;
                        if let (Dir::FromCtrl, DataRef::Read(dst), SlotBuf::Staged(b, off)) =
                            (s.dir, &mut *ext, &s.buf)
                        {
                            dst[*off..*off + b.len()].copy_from_slice(b);
                            self.core.stats.memcpy_bytes += b.len() as u64;
                        }
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            let all_done =
                pending == 0 && (first_err.is_some() || local_err.is_some() || next_cmd.is_none());
            if let Err(e) = pumped {
                // The connection died. Commands that completed before stay completed; if ours
                // all did, report them, else the queue failure (more telling than "failed").
                return match first_err {
                    None if all_done && local_err.is_none() => Ok(last),
                    Some(s @ CmdError::Status(_)) => Err(Error::from_cmd(what, s)),
                    _ => Err(e),
                };
            }
            if all_done {
                window.finish(&mut self.score);
                break;
            }
            if pending > 0 {
                // On failure the pump of the next pass reports it, after collecting the slots.
                let spin = window.spin(self.spin, &mut self.score);
                let _ = self.wait(None, spin);
            }
        }
        match (first_err, local_err) {
            (Some(e), _) => Err(Error::from_cmd(what, e)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(last),
        }
    }

    /// Run a fused pair (FUSE first, FUSE second: Compare and Write) whose data are pieces
    /// `(offset, length)` of one borrowed buffer, and wait for both. The controller requires
    /// the two to be adjacent in the submission queue and holds the first until the second
    /// arrives, so they are posted back to back or not at all: two tags must be free (else
    /// [`Error::QueueFull`], nothing sent) and both buffers ready before the first is posted,
    /// and nothing else can be submitted on this queue meanwhile (the caller holds it). A
    /// first posted without its second leaves the queue unusable: it is failed.
    ///
    /// Returns each command's own result, in the order given (their completions may come in
    /// either order); `Err` only when nothing was sent or the queue failed before either
    /// completed.
    pub(crate) fn run_fused(
        &mut self,
        dir: Dir,
        ext: &mut DataRef<'_>,
        pair: [(Sqe, usize, u32); 2],
    ) -> Result<[Result<u64, CmdError>; 2], Error> {
        if let Some(e) = self.failed_error() {
            return Err(e);
        }
        if self.free.len() < 2 {
            return Err(Error::QueueFull);
        }
        let bufs = [
            self.borrowed_buf(dir, ext, pair[0].1, pair[0].2)?,
            self.borrowed_buf(dir, ext, pair[1].1, pair[1].2)?,
        ];
        for (i, ((sqe, _, len), buf)) in pair.into_iter().zip(bufs).enumerate() {
            if let Err((e, _)) = self.start(sqe, dir, len, buf, i as u64, ext) {
                if i == 0 {
                    return Err(e);
                }
                // The first is posted and waits for its partner: fail the queue (completing
                // the first with the failure) rather than post anything else after it.
                self.fail(e);
                break;
            }
        }
        let mut res: [Option<Result<u64, CmdError>>; 2] = [None, None];
        let mut window = SpinWindow::default();
        loop {
            let pumped = self.pump(ext, true);
            while let Some(tag) = self.core.ext_done.pop() {
                let s = self.release(tag);
                let r = s.result.unwrap_or(Err(CmdError::QueueFailed));
                if r.is_ok() {
                    if let (Dir::FromCtrl, DataRef::Read(dst), SlotBuf::Staged(b, off)) =
                        (s.dir, &mut *ext, &s.buf)
                    {
                        dst[*off..*off + b.len()].copy_from_slice(b);
                        self.core.stats.memcpy_bytes += b.len() as u64;
                    }
                }
                res[s.user_data as usize] = Some(r);
            }
            if let [Some(a), Some(b)] = res {
                window.finish(&mut self.score);
                return Ok([a, b]);
            }
            // A failed queue completes everything it held (collected above), so both are in
            // unless the second was never posted.
            pumped?;
            let spin = window.spin(self.spin, &mut self.score);
            let _ = self.wait(None, spin);
        }
    }

    /// Run one command with an optional borrowed buffer and wait for it.
    pub(crate) fn execute(
        &mut self,
        what: &'static str,
        sqe: Sqe,
        mut ext: DataRef<'_>,
    ) -> Result<u64, Error> {
        let (dir, len) = match &ext {
            DataRef::None => (Dir::None, 0),
            DataRef::Read(b) => (Dir::FromCtrl, b.len()),
            DataRef::Write(b) => (Dir::ToCtrl, b.len()),
        };
        let len = u32::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("{what}: {len} bytes")))?;
        let mut one = std::iter::once((sqe, 0usize, len));
        self.run_borrowed(what, dir, &mut ext, &mut one)
    }

    /// Post an Asynchronous Event Request (admin queue, no data, no deadline).
    pub(crate) fn submit_aer(&mut self) -> Result<u16, Error> {
        let sqe = Sqe::new(nvme::opcode::admin::ASYNC_EVENT_REQUEST, 0);
        self.submit(sqe, Data::None, 0).map_err(|e| e.error)
    }

    /// Completions of commands posted with [`Queue::submit_aer`] (the only ones submitted
    /// asynchronously on an admin queue), waiting at most `timeout` for the first.
    pub(crate) fn reap_aers(
        &mut self,
        timeout: Duration,
    ) -> Result<Vec<Result<u64, CmdError>>, Error> {
        let mut out = Vec::new();
        self.reap(&mut out, 1, Some(timeout))?;
        Ok(out.into_iter().map(|c| c.result).collect())
    }

    crate::cmd::rw_submit_methods!(pub, L::Buf, u16);

    /// Submit a Write Zeroes of `nlb` blocks (1..=65536) at `slba`.
    pub fn submit_write_zeroes(
        &mut self,
        ns: &crate::cmd::NsInfo,
        slba: u64,
        nlb: u32,
        user_data: u64,
    ) -> Result<u16, SubmitError<L::Buf>> {
        match crate::cmd::write_zeroes_sqe(ns, slba, nlb) {
            Ok(sqe) => self.submit(sqe, Data::None, user_data),
            Err(error) => Err(SubmitError { error, buf: None }),
        }
    }
}
