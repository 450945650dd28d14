//! [`AsyncQueue`]: futures over a queue.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use nvme::opcode::io;
use nvme::Sqe;

use crate::cmd::{rw_cmd, Data, NsInfo};
use crate::error::Error;
use crate::queue::{Link, Queue};

enum Slot<B> {
    /// In flight; the waker of the future that waits for it.
    Pending(Option<Waker>),
    /// Completed, not yet taken by its future.
    Done(Result<(), Error>, Option<B>),
    /// Its future was dropped: the completion is discarded.
    Abandoned,
}

struct State<L: Link> {
    q: Queue<L>,
    next: u64,
    slots: HashMap<u64, Slot<L::Buf>>,
    /// Futures waiting for a free tag.
    tag_waiters: Vec<Waker>,
    /// The queue failed: every later command gets this.
    failed: Option<String>,
}

struct Shared<L: Link> {
    state: Mutex<State<L>>,
    work: Condvar,
    stop: AtomicBool,
}

impl<L: Link> Shared<L> {
    fn lock(&self) -> MutexGuard<'_, State<L>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An async face for a queue: futures that work on any executor (the library depends on no
/// runtime), many commands in flight at once on one queue.
///
/// [`AsyncQueue::new`] moves a [`Queue`] behind a mutex and starts one driver thread
/// (`nvmf-async-q<qid>`) that reaps completions while commands are in flight (each wait holds
/// the queue at most 200 µs) and wakes the futures they finish; it sleeps
/// on a condition variable when nothing is in flight. A future submits its command on its
/// first poll; when every tag is busy it waits for one. Dropping a future whose command is in
/// flight abandons the result (the buffer is freed when the completion arrives).
///
/// ```no_run
/// # async fn f() -> Result<(), nvmf_initiator::Error> {
/// use nvmf_initiator::{AsyncQueue, ConnectOptions, Controller};
/// let mut ctrl = Controller::connect(ConnectOptions::tcp("127.0.0.1", 4420, "nqn.2026-11.io.nvmf-rs:default"))?;
/// let ns = ctrl.namespaces()[0];
/// let q = AsyncQueue::new(ctrl.take_io_queue().expect("an I/O queue"))?;
/// let (a, b) = (q.read(&ns, 0, vec![0u8; 4096]), q.write(&ns, 8, vec![7u8; 4096]));
/// let (a, b) = (a.await?, b.await?); // any executor
/// # let _ = (a, b); Ok(()) }
/// ```
pub struct AsyncQueue<L: Link> {
    shared: Arc<Shared<L>>,
    driver: Option<JoinHandle<()>>,
}

impl<L: Link> std::fmt::Debug for AsyncQueue<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncQueue").finish_non_exhaustive()
    }
}

/// The longest one reap holds the queue (futures submitting meanwhile wait that long).
pub const REAP_WAIT: Duration = Duration::from_micros(200);

impl<L: Link + 'static> AsyncQueue<L> {
    /// Takes `q` and starts its driver thread.
    pub fn new(q: Queue<L>) -> Result<AsyncQueue<L>, Error> {
        let qid = q.qid();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                q,
                next: 0,
                slots: HashMap::new(),
                tag_waiters: Vec::new(),
                failed: None,
            }),
            work: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let driver = std::thread::Builder::new()
            .name(format!("nvmf-async-q{qid}"))
            .spawn(move || drive(&s))?;
        Ok(AsyncQueue {
            shared,
            driver: Some(driver),
        })
    }

    /// Reads whole blocks at `slba` into `buf` (its length: a multiple of the block size);
    /// resolves to the buffer.
    pub fn read(&self, ns: &NsInfo, slba: u64, buf: L::Buf) -> CmdFuture<L> {
        self.rw(io::READ, ns, slba, buf)
    }

    /// Writes `buf` (whole blocks) at `slba`; resolves to the buffer.
    pub fn write(&self, ns: &NsInfo, slba: u64, buf: L::Buf) -> CmdFuture<L> {
        self.rw(io::WRITE, ns, slba, buf)
    }

    /// Flush of namespace `ns`; resolves to no buffer.
    pub fn flush(&self, ns: &NsInfo) -> CmdFuture<L> {
        let mut sqe = Sqe::new(io::FLUSH, 0);
        sqe.nsid = ns.nsid.into();
        self.command(sqe, Data::None)
    }

    fn rw(&self, opcode: u8, ns: &NsInfo, slba: u64, buf: L::Buf) -> CmdFuture<L> {
        match rw_cmd(opcode, ns, slba, buf) {
            Ok((sqe, data)) => self.command(sqe, data),
            Err(e) => CmdFuture {
                shared: Arc::clone(&self.shared),
                step: Step::Failed(Some(e.error)),
            },
        }
    }

    /// Any command (the SQE's CID is the queue's business); resolves to the buffer, if any.
    pub fn command(&self, sqe: Sqe, data: Data<L::Buf>) -> CmdFuture<L> {
        CmdFuture {
            shared: Arc::clone(&self.shared),
            step: Step::New(Some((sqe, data))),
        }
    }
}

impl<L: Link> Drop for AsyncQueue<L> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.work.notify_all();
        if let Some(d) = self.driver.take() {
            let _ = d.join();
        }
    }
}

/// The driver: reap while anything is in flight, sleep otherwise.
fn drive<L: Link>(s: &Shared<L>) {
    let mut out = Vec::new();
    loop {
        let mut wake = Vec::new();
        {
            let mut st = s.lock();
            if s.stop.load(Ordering::Acquire) {
                break;
            }
            if st.q.in_flight() == 0 {
                let _g = s
                    .work
                    .wait_timeout(st, Duration::from_millis(100))
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            let r = st.q.reap(&mut out, 1, Some(REAP_WAIT));
            if let Err(e) = r {
                if !matches!(e, Error::Timeout(..)) {
                    // The queue is gone: every command waiting fails with this.
                    let msg = e.to_string();
                    for (_, slot) in st.slots.iter_mut() {
                        if let Slot::Pending(w) = slot {
                            if let Some(w) = w.take() {
                                wake.push(w);
                            }
                            *slot = Slot::Done(Err(Error::Controller(msg.clone())), None);
                        }
                    }
                    st.failed = Some(msg);
                }
            }
            for c in out.drain(..) {
                let res = c
                    .result
                    .map(drop)
                    .map_err(|e| Error::from_cmd("command", e));
                match st.slots.remove(&c.user_data) {
                    Some(Slot::Pending(w)) => {
                        wake.extend(w);
                        st.slots.insert(c.user_data, Slot::Done(res, c.buf));
                    }
                    Some(Slot::Abandoned) | None => {}
                    Some(done @ Slot::Done(..)) => {
                        st.slots.insert(c.user_data, done);
                    }
                }
            }
            wake.append(&mut st.tag_waiters);
        }
        for w in wake {
            w.wake();
        }
    }
}

enum Step<L: Link> {
    New(Option<(Sqe, Data<L::Buf>)>),
    InFlight(u64),
    Failed(Option<Error>),
    Finished,
}

/// One command as a future: resolves to the buffer it was given (read data in it), or `None`
/// for a command without data.
#[must_use = "a command is sent when its future is polled"]
pub struct CmdFuture<L: Link> {
    shared: Arc<Shared<L>>,
    step: Step<L>,
}

impl<L: Link> Unpin for CmdFuture<L> {}

impl<L: Link> Future for CmdFuture<L> {
    type Output = Result<Option<L::Buf>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match &mut this.step {
            Step::Finished => panic!("CmdFuture polled after it completed"),
            Step::Failed(e) => {
                let e = e.take().expect("an error once");
                this.step = Step::Finished;
                Poll::Ready(Err(e))
            }
            Step::New(cmd) => {
                let mut st = this.shared.lock();
                if let Some(f) = &st.failed {
                    let e = Error::Controller(f.clone());
                    drop(st);
                    this.step = Step::Finished;
                    return Poll::Ready(Err(e));
                }
                let (sqe, data) = cmd.take().expect("submitted once");
                let from_ctrl = matches!(data, Data::FromController(_));
                let ud = st.next;
                st.next += 1;
                match st.q.submit(sqe, data, ud) {
                    Ok(_) => {
                        st.slots.insert(ud, Slot::Pending(Some(cx.waker().clone())));
                        drop(st);
                        this.shared.work.notify_one();
                        this.step = Step::InFlight(ud);
                        Poll::Pending
                    }
                    Err(e) if matches!(e.error, Error::QueueFull) => {
                        // Every tag is busy: wait for a completion and try again.
                        let data = match e.buf {
                            Some(b) if from_ctrl => Data::FromController(b),
                            Some(b) => Data::ToController(b),
                            None => Data::None,
                        };
                        *cmd = Some((sqe, data));
                        st.tag_waiters.push(cx.waker().clone());
                        Poll::Pending
                    }
                    Err(e) => {
                        drop(st);
                        this.step = Step::Finished;
                        Poll::Ready(Err(e.error))
                    }
                }
            }
            Step::InFlight(ud) => {
                let ud = *ud;
                let mut st = this.shared.lock();
                match st.slots.remove(&ud) {
                    Some(Slot::Done(res, buf)) => {
                        drop(st);
                        this.step = Step::Finished;
                        Poll::Ready(res.map(|()| buf))
                    }
                    Some(Slot::Pending(_)) | None | Some(Slot::Abandoned) => {
                        st.slots.insert(ud, Slot::Pending(Some(cx.waker().clone())));
                        Poll::Pending
                    }
                }
            }
        }
    }
}

impl<L: Link> Drop for CmdFuture<L> {
    fn drop(&mut self) {
        if let Step::InFlight(ud) = self.step {
            let mut st = self.shared.lock();
            if let Some(Slot::Pending(_)) = st.slots.get(&ud) {
                st.slots.insert(ud, Slot::Abandoned);
            } else {
                st.slots.remove(&ud);
            }
        }
    }
}
