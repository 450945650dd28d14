//! One ublk queue on its thread: a task per tag turns block requests into NVMe commands, and a
//! reaper task sends them and collects the completions, all on one executor whose reactor
//! waits for the ublk ring and the NVMe queue's descriptors at once.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use initiator::{rw_sqe, AnyBuf, AnyQueue, CmdError, Completion, Data, Reconnector, WaitFds};
use libublk::io::{with_task_io_ring, with_task_io_ring_mut, UblkDev, UblkQueue};
use libublk::uring_async::{ublk_reap_io_events_with_update_queue, ublk_wake_task};
use libublk::{sys, BufDesc, UblkError};
use nvme::opcode::io;
use nvme::Sqe;
use tracing::{error, info, warn};

use crate::Caps;

/// How often the reaper looks at a queue with commands in flight even without an event (the
/// NVMe queue checks its command deadlines when polled).
const TICK: Duration = Duration::from_secs(1);

/// A tag's result meaning: the connection failed under the command; send it again once the
/// queue is back.
const RETRY: i32 = i32::MIN;

/// A descriptor the reactor watches: the NVMe queue's (it owns it; this only borrows it while
/// the queue lives, and the watch is dropped first).
struct Fd(RawFd);

impl AsFd for Fd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to the NVMe queue, which outlives every `Fd` (the
        // watches are dropped with the `Nvme` that holds both, before its queue: see `Drop`).
        unsafe { BorrowedFd::borrow_raw(self.0) }
    }
}

/// Which of a tag's buffers a command holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Out {
    #[default]
    None,
    Data,
    Range,
}

/// One tag: its buffers, and its NVMe command's result once completed (bytes or -errno).
#[derive(Default)]
struct Tag {
    /// The tag's data buffer while no command holds it.
    buf: Option<AnyBuf>,
    /// The tag's DSM range buffer (16 bytes) while no command holds it.
    range: Option<AnyBuf>,
    out: Out,
    /// The NVMe command's result, until the tag's task takes it.
    done: Option<i32>,
    waker: Option<Waker>,
}

/// The NVMe side of one ublk queue.
struct Nvme {
    q: RefCell<AnyQueue>,
    /// The connection the queue belongs to, and what brings a new one.
    gen: Cell<u64>,
    rc: Arc<Reconnector>,
    /// Tags waiting for the queue to come back.
    retry: RefCell<Vec<Waker>>,
    /// A command met an ANA or path status: send nothing more on this connection, and move
    /// to another path once its commands are back.
    leave: Cell<bool>,
    tags: RefCell<Vec<Tag>>,
    /// The length each tag's data buffer was made with.
    cap: usize,
    inflight: Cell<usize>,
    reaper: RefCell<Option<Waker>>,
    /// The connection failed for good (the reconnect policy gave up): every request fails
    /// from now on.
    failed: Cell<bool>,
    watches: RefCell<Vec<(RawFd, Rc<smol::Async<Fd>>)>>,
    caps: Caps,
}

impl Drop for Nvme {
    fn drop(&mut self) {
        // Before the queue (a field dropped after this runs) closes the descriptors.
        self.watches.get_mut().clear();
    }
}

impl Nvme {
    fn wake_reaper(&self) {
        if let Some(w) = self.reaper.borrow_mut().take() {
            w.wake();
        }
    }

    /// Runs the request of `iod` on tag `tag`: the NVMe command's result as ublk wants it
    /// (bytes transferred, or -errno).
    async fn run(&self, tag: u16, iod: &sys::ublksrv_io_desc) -> i32 {
        loop {
            if self.failed.get() {
                return -libc::EIO;
            }
            let gen = self.gen.get();
            match self.submit(tag, iod) {
                Ok(true) => {}
                // Nothing to send (a flush without a volatile write cache).
                Ok(false) => return 0,
                // The queue is down: wait for the new one (the reaper brings it).
                Err(RETRY) => {
                    self.wake_reaper();
                    Back { nv: self, gen }.await;
                    continue;
                }
                Err(e) => return e,
            }
            self.inflight.set(self.inflight.get() + 1);
            self.wake_reaper();
            match (Done { nv: self, tag }).await {
                RETRY => Back { nv: self, gen }.await,
                r => return r,
            }
        }
    }

    /// Submits the command for `iod` on tag `tag` (`false`: none is needed).
    fn submit(&self, tag: u16, iod: &sys::ublksrv_io_desc) -> Result<bool, i32> {
        let op = iod.op_flags & 0xff;
        let fua = iod.op_flags & sys::UBLK_IO_F_FUA != 0;
        let ns = &self.caps.ns;
        let bs = u64::from(ns.block_size);
        let off = iod.start_sector << 9;
        let len = u64::from(iod.nr_sectors) << 9;
        if op != sys::UBLK_IO_OP_FLUSH && (off % bs != 0 || len % bs != 0 || len == 0) {
            warn!(op, off, len, "a request that is not whole blocks");
            return Err(-libc::EINVAL);
        }
        let slba = off / bs;
        let nlb = len / bs;
        let user = u64::from(tag);
        if self.leave.get() {
            return Err(RETRY);
        }
        let mut q = self.q.borrow_mut();
        let mut tags = self.tags.borrow_mut();
        let t = &mut tags[usize::from(tag)];
        let submitted = match op {
            sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE => {
                let Some(mut b) = t.buf.take() else {
                    return Err(-libc::EIO);
                };
                if b.set_len(self.cap, len as usize).is_err() {
                    t.buf = Some(b);
                    return Err(-libc::EINVAL);
                }
                let opcode = if op == sys::UBLK_IO_OP_READ {
                    io::READ
                } else {
                    io::WRITE
                };
                t.out = Out::Data;
                let mut sqe = rw_sqe(opcode, ns.nsid, slba, nlb as u32);
                if fua && opcode == io::WRITE {
                    // NVM Command Set: FUA is CDW12 bit 30.
                    sqe.cdw12 = (sqe.cdw12.get() | 1 << 30).into();
                }
                let data = if opcode == io::READ {
                    Data::FromController(b)
                } else {
                    Data::ToController(b)
                };
                q.submit(sqe, data, user).map_err(|e| {
                    t.buf = e.buf;
                    e.error
                })
            }
            sys::UBLK_IO_OP_FLUSH => {
                if !self.caps.vwc {
                    return Ok(false);
                }
                t.out = Out::None;
                let mut sqe = Sqe::new(io::FLUSH, 0);
                sqe.nsid = ns.nsid.into();
                q.submit(sqe, Data::None, user).map_err(|e| e.error)
            }
            sys::UBLK_IO_OP_DISCARD => {
                let Some(mut r) = t.range.take() else {
                    return Err(-libc::EIO);
                };
                let Ok(nlb) = u32::try_from(nlb) else {
                    t.range = Some(r);
                    return Err(-libc::EINVAL);
                };
                r[..16].fill(0);
                r[4..8].copy_from_slice(&nlb.to_le_bytes());
                r[8..16].copy_from_slice(&slba.to_le_bytes());
                t.out = Out::Range;
                let mut sqe = Sqe::new(io::DSM, 0);
                sqe.nsid = ns.nsid.into();
                // One range (NR is 0's based); CDW11 bit 2: Attribute - Deallocate.
                sqe.cdw11 = 4.into();
                q.submit(sqe, Data::ToController(r), user).map_err(|e| {
                    t.range = e.buf;
                    e.error
                })
            }
            sys::UBLK_IO_OP_WRITE_ZEROES => {
                let Ok(n) = u32::try_from(nlb) else {
                    return Err(-libc::EINVAL);
                };
                if n > 1 << 16 {
                    return Err(-libc::EINVAL);
                }
                t.out = Out::None;
                let sqe = rw_sqe(io::WRITE_ZEROES, ns.nsid, slba, n);
                q.submit(sqe, Data::None, user).map_err(|e| e.error)
            }
            _ => return Err(-libc::EOPNOTSUPP),
        };
        match submitted {
            Ok(_) => Ok(true),
            Err(_) if q.is_failed() => Err(RETRY),
            Err(e) => {
                warn!(tag, error = %e, "cannot submit the NVMe command");
                Err(-libc::EIO)
            }
        }
    }

    /// A completion from the NVMe queue: the tag's result and its buffer back.
    fn complete(&self, c: Completion<AnyBuf>) {
        let mut tags = self.tags.borrow_mut();
        let Some(t) = tags.get_mut(c.user_data as usize) else {
            return;
        };
        let out = std::mem::take(&mut t.out);
        let res = match &c.result {
            Ok(_) if out == Out::Data => c.buf.as_ref().map_or(0, |b| b.len() as i32),
            Ok(_) => 0,
            // The transport failed under it (not the controller's answer): again, later.
            Err(e) if !matches!(e, CmdError::Status(_)) => RETRY,
            // The namespace is not reachable through this path now: again, on another.
            Err(CmdError::Status(s)) if initiator::is_path_status(*s) => {
                if !self.leave.replace(true) {
                    warn!(status = %s, "a path status: moving to another path");
                }
                RETRY
            }
            Err(e) => {
                warn!(tag = c.user_data, error = %e, "NVMe command failed");
                -libc::EIO
            }
        };
        match out {
            Out::Data => t.buf = c.buf,
            Out::Range => t.range = c.buf,
            Out::None => {}
        }
        t.done = Some(res);
        if let Some(w) = t.waker.take() {
            w.wake();
        }
        self.inflight.set(self.inflight.get().saturating_sub(1));
    }

    /// Sends, collects completions, and waits for the NVMe queue's descriptors while commands
    /// are in flight; never ends (the queue's thread ends when ublk stops the device).
    async fn reap(&self) {
        let mut out = Vec::new();
        // One timer for every wait (reset each time): a wait allocates nothing.
        let mut tick = smol::Timer::after(TICK);
        loop {
            let polled = self.q.borrow_mut().poll(&mut out);
            for c in out.drain(..) {
                self.complete(c);
            }
            let dead = polled.is_err() || self.q.borrow().is_failed();
            let left = self.leave.get() && self.inflight.get() == 0;
            if (dead || left) && !self.failed.get() {
                self.reconnect();
                continue;
            }
            if self.inflight.get() == 0 || self.failed.get() {
                Park { nv: self }.await;
                continue;
            }
            let fds = match self.q.borrow_mut().prepare_wait() {
                Ok(Some(f)) => f,
                Ok(None) => continue,
                Err(_) => continue,
            };
            tick.set_after(TICK);
            self.wait(fds, &mut tick).await;
            let _ = self.q.borrow_mut().after_wait();
        }
    }

    /// The queue failed (every command it had came back for a retry): get a queue of a new
    /// connection (blocking this queue's thread: its requests stall meanwhile, as the
    /// Linux host's do while it reconnects), move the tags' buffers to it over NVMe/RDMA (the
    /// old ones are the dead connection's registered memory), and wake the tags to send
    /// their commands again. When the policy gives up, requests fail from now on.
    fn reconnect(&self) {
        let failed_gen = self.gen.get();
        warn!(
            gen = failed_gen,
            "the NVMe queue failed: stalling requests while reconnecting"
        );
        let got = self.rc.queue_again(failed_gen);
        match got {
            Ok((gen, nq)) => {
                if let Err(e) = self.adopt(&nq) {
                    error!(error = %e, "cannot move the tags' buffers to the new queue");
                    self.failed.set(true);
                } else {
                    info!(
                        gen,
                        "the NVMe queue is back: sending the stalled requests again"
                    );
                }
                self.watches.borrow_mut().clear();
                *self.q.borrow_mut() = nq;
                self.gen.set(gen);
                self.leave.set(false);
            }
            Err(e) => {
                error!(error = %e, "reconnecting failed: requests fail from now on");
                self.failed.set(true);
            }
        }
        for w in self.retry.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Over NVMe/RDMA: give every tag buffers of `nq` (registered memory of the new
    /// connection) with the old ones' contents (a write waiting to go again has its data
    /// there). Plain memory (NVMe/TCP) stays.
    fn adopt(&self, nq: &AnyQueue) -> Result<(), initiator::Error> {
        if nq.transport() != initiator::Transport::Rdma {
            return Ok(());
        }
        let mut tags = self.tags.borrow_mut();
        for t in tags.iter_mut() {
            for (slot, len) in [(&mut t.buf, self.cap), (&mut t.range, 16)] {
                let mut b = nq.alloc_buf(len)?;
                if let Some(old) = slot.as_ref() {
                    let n = old.len().min(b.len());
                    b[..n].copy_from_slice(&old[..n]);
                }
                *slot = Some(b);
            }
        }
        Ok(())
    }

    /// Until a descriptor of `fds` is ready, or `tick` fires.
    async fn wait(&self, fds: WaitFds, tick: &mut smol::Timer) {
        let [a, b] = fds
            .fds
            .map(|f| f.and_then(|(fd, write)| Some((self.watch(fd)?, write))));
        let ready = smol::future::or(ready_of(a), ready_of(b));
        smol::future::or(ready, async {
            tick.await;
        })
        .await
    }

    /// The reactor's watch of `fd` (made the first time).
    fn watch(&self, fd: RawFd) -> Option<Rc<smol::Async<Fd>>> {
        let mut w = self.watches.borrow_mut();
        if let Some((_, a)) = w.iter().find(|(f, _)| *f == fd) {
            return Some(Rc::clone(a));
        }
        match smol::Async::new(Fd(fd)) {
            Ok(a) => {
                let a = Rc::new(a);
                w.push((fd, Rc::clone(&a)));
                Some(a)
            }
            Err(e) => {
                error!(fd, error = %e, "cannot watch the NVMe queue's descriptor");
                None
            }
        }
    }
}

/// Until `w`'s descriptor is readable (or also writable, with its flag); never without one.
async fn ready_of(w: Option<(Rc<smol::Async<Fd>>, bool)>) {
    match w {
        Some((a, true)) => {
            let _ = smol::future::or(a.readable(), a.writable()).await;
        }
        Some((a, false)) => {
            let _ = a.readable().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// The reaper waits here while no command is in flight and no tag waits for a new queue (a
/// submission wakes it).
struct Park<'a> {
    nv: &'a Nvme,
}

impl Future for Park<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let nv = self.nv;
        // Commands to collect, or tags waiting for a queue of a new connection.
        let work = nv.inflight.get() > 0 || nv.leave.get() || nv.q.borrow().is_failed();
        if work && !nv.failed.get() {
            return Poll::Ready(());
        }
        *self.nv.reaper.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// A tag's task waits here for the queue to come back after a failure (a newer connection
/// than `gen`, or the policy gave up).
struct Back<'a> {
    nv: &'a Nvme,
    gen: u64,
}

impl Future for Back<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.nv.gen.get() > self.gen || self.nv.failed.get() {
            return Poll::Ready(());
        }
        self.nv.retry.borrow_mut().push(cx.waker().clone());
        Poll::Pending
    }
}

/// A tag's task waits here for its command's completion.
struct Done<'a> {
    nv: &'a Nvme,
    tag: u16,
}

impl Future for Done<'_> {
    type Output = i32;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<i32> {
        let mut tags = self.nv.tags.borrow_mut();
        let t = &mut tags[usize::from(self.tag)];
        if let Some(r) = t.done.take() {
            return Poll::Ready(r);
        }
        t.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Commits tag `tag`'s result and waits for its next request: the command goes into the ring
/// at the first poll, and is submitted at once (the ring's own wait may be parked already,
/// woken by the NVMe side, not the ring).
async fn commit(q: &UblkQueue<'_>, tag: u16, addr: *const u8, res: i32) -> Result<i32, UblkError> {
    let mut f = std::pin::pin!(q.submit_io_commit_cmd(tag, BufDesc::RawAddress(addr), res));
    if let Some(r) = smol::future::poll_once(f.as_mut()).await {
        return r;
    }
    with_task_io_ring_mut(|r| r.submit()).map_err(UblkError::IOError)?;
    f.await
}

async fn tag_task(q: &UblkQueue<'_>, nv: &Nvme, tag: u16) -> Result<(), UblkError> {
    // The tag's buffer: the same one until a reconnect over NVMe/RDMA replaces it.
    let addr = || {
        let tags = nv.tags.borrow();
        tags[usize::from(tag)].buf.as_ref().map(|b| b.as_ptr())
    };
    let first = addr().ok_or(UblkError::OtherError(-libc::ENOMEM))?;
    q.submit_io_prep_cmd(tag, BufDesc::RawAddress(first), 0, None)
        .await?;
    loop {
        let iod = *q.get_iod(tag);
        let res = nv.run(tag, &iod).await;
        let at = addr().ok_or(UblkError::OtherError(-libc::ENOMEM))?;
        commit(q, tag, at, res).await?;
    }
}

/// Serves ublk queue `qid` of `dev` with NVMe queue `nq` until the device stops.
pub fn serve(qid: u16, dev: &UblkDev, nq: AnyQueue, gen: u64, rc: Arc<Reconnector>, caps: Caps) {
    let depth = dev.dev_info.queue_depth;
    let cap = dev.dev_info.max_io_buf_bytes as usize;
    let mut tags = Vec::with_capacity(usize::from(depth));
    for _ in 0..depth {
        let buf = nq.alloc_buf(cap);
        let range = nq.alloc_buf(16);
        match (buf, range) {
            (Ok(b), Ok(r)) => tags.push(Tag {
                buf: Some(b),
                range: Some(r),
                ..Tag::default()
            }),
            (Err(e), _) | (_, Err(e)) => {
                error!(qid, error = %e, "cannot allocate the queue's buffers");
                // The device's start waits for every queue: it fails instead (libublk's only
                // public way to say a queue failed is its mlock flag).
                dev.notify_buffer_registration_complete(true);
                return;
            }
        }
    }
    let nv = Rc::new(Nvme {
        q: RefCell::new(nq),
        gen: Cell::new(gen),
        rc,
        retry: RefCell::new(Vec::new()),
        leave: Cell::new(false),
        tags: RefCell::new(tags),
        cap,
        inflight: Cell::new(0),
        reaper: RefCell::new(None),
        failed: Cell::new(false),
        watches: RefCell::new(Vec::new()),
        caps,
    });
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            error!(qid, error = %e, "cannot set up the ublk queue");
            dev.notify_buffer_registration_complete(true);
            return;
        }
    };
    let exe = Rc::new(smol::LocalExecutor::new());
    let mut tasks = Vec::new();
    for tag in 0..depth {
        let (q, nv) = (Rc::clone(&q), Rc::clone(&nv));
        tasks.push(exe.spawn(async move {
            match tag_task(&q, &nv, tag).await {
                Ok(()) | Err(UblkError::QueueIsDown) => {}
                Err(e) => error!(qid, tag, error = %e, "ublk request task failed"),
            }
        }));
    }
    let reaper = {
        let nv = Rc::clone(&nv);
        exe.spawn(async move { nv.reap().await })
    };
    // The tags' buffers are the NVMe queue's, not libublk's `IoBuf`s (whose registration
    // libublk counts before it starts the device): this queue says it is ready itself.
    dev.notify_buffer_registration_complete(false);
    let exe2 = Rc::clone(&exe);
    let q2 = Rc::clone(&q);
    smol::block_on(exe.run(async move {
        if let Err(e) = drive_ring(&exe2, &q2, tasks).await {
            error!(qid, error = %e, "ublk queue failed");
        }
    }));
    drop(reaper);
}

/// The ublk ring's events, through the executor's reactor (which also watches the NVMe
/// queue), until every tag task ended (the device stopped).
async fn drive_ring(
    exe: &smol::LocalExecutor<'_>,
    q: &UblkQueue<'_>,
    tasks: Vec<smol::Task<()>>,
) -> Result<(), UblkError> {
    use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
    let fd = with_task_io_ring(|r| r.as_raw_fd());
    // SAFETY: the ring's descriptor, wrapped only to be watched; given back (not closed)
    // below, the ring owns it.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    let ring = smol::Async::new(file).map_err(UblkError::IOError)?;
    let poll_uring = || async {
        with_task_io_ring_mut(|r| r.submit_and_wait(0)).map_err(UblkError::IOError)?;
        ring.readable().await.map_err(UblkError::IOError)?;
        Ok(false)
    };
    let reap = |timeout| {
        ublk_reap_io_events_with_update_queue(q, timeout, None, |cqe| {
            ublk_wake_task(cqe.user_data(), cqe)
        })
    };
    let run_ops = || while exe.try_tick() {};
    let done = || tasks.iter().all(|t| t.is_finished());
    let r = libublk::run_uring_tasks(poll_uring, reap, run_ops, done).await;
    if let Ok(f) = ring.into_inner() {
        let _ = f.into_raw_fd();
    }
    r
}
