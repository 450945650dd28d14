//! Poller threads, one per core (`target.threads`), each serving connections of every
//! transport: run-to-completion loops that own their connections, one io_uring backend ring
//! and one registered buffer pool. A pass reads socket readiness from epoll, polls the RDMA
//! completion queues, reaps the backend ring, grants waiting requests their buffers (FIFO over
//! both transports), then sends what is queued. They spin while that pays and block in epoll
//! (sockets, RDMA completion channels armed just before, a wake eventfd) otherwise: see
//! [`super::adaptive`]. Each poller counts the time it spends working, spinning and sleeping.
//!
//! Each transport's connections sit behind [`Conns`] (`tcp::TcpConns`,
//! `rdma::conns::RdmaConns`), and the loop drives them only through it: it knows nothing of
//! sockets or queue pairs (only the messages that bring it a new connection name one).

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::EventFd;
use tracing::{debug, error, info, warn};

use super::adaptive::{PollMode, SpinPolicy};
use super::conns::{Conns, Cx, PollerHandle, PollerStats, ToPoller, RDMA_KEY};
use super::rdma::conns::{RdmaConns, RdmaSetup};
use super::tcp::TcpConns;
use super::tcp::RECV_RING_KEY;
use super::thread::PollerThread;
use super::{Kind, ReqRef, Store};
use crate::backend::ReadyWatch;
use crate::core::{Target, TrType, TransportCaps};
use crate::store::RingStore;

/// Epoll key of the wake eventfd.
const WAKE_KEY: u64 = u64::MAX;
/// Epoll key of the eventfd librbd's results signal (registered once the poller first sleeps
/// with librbd operations in flight).
const RBD_KEY: u64 = u64::MAX - 1;
/// Timer granularity for keep-alive checks, core events and RDMA drain deadlines.
const TICK: Duration = Duration::from_millis(50);
/// How long shutdown waits for flushes and backend operations.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

/// Settings of one poller.
#[derive(Clone)]
pub struct PollerConfig {
    pub id: usize,
    /// The NVMe/TCP limits (`trtype` TCP); RDMA connections get the same with `trtype` RDMA.
    pub caps: TransportCaps,
    /// How the poller waits for work.
    pub poll: PollMode,
    /// The wake-up latency measured at start ([`super::adaptive::measure_wake_latency`]).
    pub wake_latency: Duration,
    /// How NVMe/TCP sockets are received (`target.tcp_receive`).
    pub tcp_receive: config::TcpReceive,
    /// How NVMe/TCP output is sent (`target.tcp_send`).
    pub tcp_send: config::TcpSend,
    pub stop: Arc<AtomicBool>,
    /// Set when the target has RDMA listeners.
    pub(crate) rdma: Option<RdmaSetup>,
}

/// Start poller thread `nvmf-poller-<id>`. `make_store` runs on the new thread (rings are per
/// thread).
pub fn spawn<F>(
    target: Arc<Target>,
    cfg: PollerConfig,
    make_store: F,
) -> std::io::Result<PollerHandle>
where
    F: FnOnce() -> std::io::Result<RingStore> + Send + 'static,
{
    let thread = PollerThread::spawn(
        format!("nvmf-poller-{}", cfg.id),
        "poller",
        move |rx, wake, stats| {
            let store = make_store()?;
            let mut p = Poller::new(target, cfg, store, rx, wake, stats)?;
            Ok(move || p.run())
        },
    )?;
    Ok(PollerHandle { thread })
}

/// What a pass does about readiness before its work: one decision per pass from what the
/// [`ReadyWatch`] saw, with this invariant: every signal before the watch's last re-arm was
/// followed by an `epoll_wait` (the re-arm is always followed by one in the same pass), and
/// whatever that pass left ready without a new signal (a socket it stopped reading before it
/// was empty, more events than one wait returns) is reported by the transports. A busy pass
/// whose watch saw nothing and that nothing was left over makes no system call. While passes
/// keep finding events (a stream of commands) a signal is left unconsumed and epoll is asked
/// as it is: re-arming each of those passes would add a system call per pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Nothing new: skip `epoll_wait`.
    Skip,
    /// Ask epoll (blocking, no watch, a stream of events, or something left ready).
    Wait,
    /// The watch fired: consume its signal first (re-arm), then ask epoll, so a signal after
    /// the re-arm shows in the watch and one before it in this `epoll_wait`.
    RearmThenWait,
}

impl Check {
    /// `fired`: the watch's state (`None`: no watch); `left_ready`: a descriptor the last
    /// pass left ready that no new signal will report; `streaming`: the last pass's
    /// `epoll_wait` reported something.
    fn of(busy: bool, fired: Option<bool>, left_ready: bool, streaming: bool) -> Check {
        match fired {
            _ if !busy => Check::Wait,
            None => Check::Wait,
            Some(true) if streaming => Check::Wait,
            Some(true) => Check::RearmThenWait,
            Some(false) if left_ready => Check::Wait,
            Some(false) => Check::Skip,
        }
    }
}

struct Poller {
    // Field order is drop order: the connections (QPs and memory regions over the pool) before
    // the store, which owns the pool memory.
    rdma: Option<RdmaConns>,
    tcp: TcpConns,
    store: RingStore,
    cfg: PollerConfig,
    rx: mpsc::Receiver<ToPoller>,
    wake: Arc<EventFd>,
    stats: Arc<PollerStats>,
    epoll: Epoll,
    /// Readiness of `epoll` without a system call (None: the kernel lacks it, or it failed).
    watch: Option<ReadyWatch>,
    need_buf: VecDeque<ReqRef>,
    done: Vec<(u64, Result<u32, i32>)>,
    /// librbd's results eventfd is in `epoll` (see `watch_ring`).
    ring_watched: bool,
    /// Time spent working, spinning and sleeping so far.
    times: PollerTimes,
}

/// Where a poller's time went.
#[derive(Debug, Default, Clone, Copy)]
struct PollerTimes {
    /// Passes that did something.
    work: Duration,
    /// Passes that found nothing and did not block.
    spin: Duration,
    /// Blocked in epoll.
    sleep: Duration,
}

/// Borrows the poller's parts for a transport call: `cx!(self, now)` is a [`Cx`] and leaves
/// `self.tcp`, `self.rdma` and `self.stats` free.
macro_rules! cx {
    ($p:ident, $now:expr) => {
        &mut Cx {
            store: &mut $p.store,
            need_buf: &mut $p.need_buf,
            epoll: &$p.epoll,
            now: $now,
        }
    };
}

/// Each transport's connections, as the loop drives them: `for c in each!(self) { .. }` leaves
/// the poller's other fields free for a [`Cx`].
macro_rules! each {
    ($p:ident) => {
        std::iter::once(&mut $p.tcp as &mut dyn Conns)
            .chain($p.rdma.as_mut().map(|r| r as &mut dyn Conns))
    };
}

/// The connections of transport `kind` (`None`: a poller without RDMA).
macro_rules! of_kind {
    ($p:ident, $kind:expr) => {
        match $kind {
            Kind::Tcp => Some(&mut $p.tcp as &mut dyn Conns),
            Kind::Rdma => $p.rdma.as_mut().map(|r| r as &mut dyn Conns),
        }
    };
}

impl Poller {
    fn new(
        target: Arc<Target>,
        cfg: PollerConfig,
        store: RingStore,
        rx: mpsc::Receiver<ToPoller>,
        wake: Arc<EventFd>,
        stats: Arc<PollerStats>,
    ) -> std::io::Result<Self> {
        TcpConns::check_receive(cfg.tcp_receive).map_err(std::io::Error::other)?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&*wake, EpollEvent::new(EpollFlags::EPOLLIN, WAKE_KEY))?;
        let watch = match ReadyWatch::new(epoll.0.as_fd()) {
            Ok(w) => Some(w),
            Err(e) => {
                debug!(error = %e, "no io_uring readiness watch; busy polls call epoll_wait");
                None
            }
        };
        let rdma = cfg.rdma.clone().map(|setup| {
            let caps = TransportCaps {
                trtype: TrType::Rdma,
                ..cfg.caps.clone()
            };
            let wake = wake.clone();
            let waker: crate::core::Waker = Arc::new(move || {
                let _ = wake.write(1);
            });
            RdmaConns::new(cfg.id, target.clone(), caps, setup, stats.clone(), waker)
        });
        Ok(Poller {
            rdma,
            tcp: TcpConns::new(
                cfg.id,
                target,
                cfg.caps.clone(),
                cfg.tcp_receive,
                cfg.tcp_send,
            ),
            store,
            cfg,
            rx,
            wake,
            stats,
            epoll,
            watch,
            need_buf: VecDeque::with_capacity(1024),
            done: Vec::with_capacity(1024),
            ring_watched: false,
            times: PollerTimes::default(),
        })
    }

    /// Puts the eventfd librbd's results signal into `epoll`, so the poller can sleep while
    /// librbd works (its ring also polls that eventfd, and takes the results when reaped).
    /// Done the first time it is needed, and kept. False if it failed (the poller then keeps
    /// polling while operations are in flight).
    fn watch_ring(&mut self) -> bool {
        let r = match self.store.ring().librbd_eventfd() {
            Some(fd) => self
                .epoll
                .add(fd, EpollEvent::new(EpollFlags::EPOLLIN, RBD_KEY))
                .map_err(std::io::Error::from),
            None => Err(std::io::Error::other("no librbd operation yet")),
        };
        match r {
            Ok(()) => {
                self.ring_watched = true;
                true
            }
            Err(e) => {
                warn!(error = %e, "cannot watch the backend ring's eventfd; polling while librbd works");
                false
            }
        }
    }

    fn live(&self) -> usize {
        let rdma = self.rdma.as_ref().map(|r| r as &dyn Conns);
        std::iter::once(&self.tcp as &dyn Conns)
            .chain(rdma)
            .map(|c| c.live())
            .sum()
    }

    fn run(&mut self) {
        let mut events = vec![EpollEvent::empty(); 64];
        let mut last_work = Instant::now();
        let mut next_tick = Instant::now() + TICK;
        // One clock read per pass (a busy-polling pass is little more than an epoll_wait or a
        // CQ poll and this read): deciding whether to block uses the previous pass's time, a
        // few microseconds old, against the policy's spin window.
        let mut now = Instant::now();
        // The last epoll_wait filled `events` (more may be ready than it returned); the last
        // pass's epoll_wait reported something.
        let mut more_events = false;
        let mut streaming = false;
        let mut policy = SpinPolicy::new(self.cfg.poll, self.cfg.wake_latency);
        // How long to spin after the last work; whether the last pass did anything (an idle
        // gap ends at the next pass that does); whether the poller blocked in this gap.
        let mut window = policy.next_window(true);
        let mut worked = true;
        let mut slept = false;
        loop {
            if self.cfg.stop.load(Ordering::Relaxed) {
                info!(
                    poller = self.cfg.id,
                    caught = policy.caught,
                    missed = policy.missed,
                    work_s = self.times.work.as_secs_f64(),
                    spin_s = self.times.spin.as_secs_f64(),
                    sleep_s = self.times.sleep.as_secs_f64(),
                    "poller time and spins"
                );
                self.shutdown();
                return;
            }
            // No spin window while operations wait for librbd: their results come from
            // librbd's threads through an eventfd (a wake-up happens on that side anyway), and
            // a spin here takes the CPU those threads, and the cluster's daemons on a shared
            // machine, need to produce them (4k randread QD32 through one poller, measured:
            // 0.65x fio's librbd spinning, 0.81-0.86x sleeping; target CPU per I/O 43 -> 33 us).
            let mut busy = (now.saturating_duration_since(last_work) < window
                && self.store.ring().waiting_on_librbd() == 0)
                || self.store.inflight_polled() > 0
                || !self.need_buf.is_empty();
            if !busy && self.store.inflight() > 0 && !self.ring_watched {
                // Sleeping with librbd operations in flight: their results must wake epoll.
                busy = !self.watch_ring();
            }
            let mut progress = false;
            if !busy {
                // Going to block: RDMA arms its completion queues and polls them once more.
                for c in each!(self) {
                    if c.prepare_sleep(cx!(self, now)) {
                        busy = true;
                        progress = true;
                    }
                }
            }
            let timeout = if busy {
                EpollTimeout::ZERO
            } else {
                let ms = next_tick
                    .saturating_duration_since(now)
                    .as_millis()
                    .clamp(1, 1000) as u16;
                EpollTimeout::from(ms)
            };
            let left_ready = more_events || each!(self).any(|c| c.left_ready());
            let fired = self.watch.as_mut().map(|w| w.fired());
            let check = Check::of(busy, fired, left_ready, streaming);
            if check == Check::RearmThenWait {
                if let Some(Err(e)) = self.watch.as_mut().map(|w| w.rearm()) {
                    warn!(error = %e, "readiness watch failed; polling with epoll_wait");
                    self.watch = None;
                }
            }
            let skip = check == Check::Skip;
            // Only a pass that may block reads the clock before its wait (to count the sleep).
            let wait_from = (!busy).then(Instant::now);
            let n = if skip {
                // A spin-wait hint between checks (frees the core's pipeline for an SMT
                // sibling; the check itself is a load).
                std::hint::spin_loop();
                0
            } else {
                match self.epoll.wait(&mut events, timeout) {
                    Ok(n) => n,
                    Err(nix::errno::Errno::EINTR) => 0,
                    Err(e) => {
                        error!(error = %e, "epoll_wait failed; poller exits");
                        return;
                    }
                }
            };
            more_events = n == events.len();
            streaming = n > 0;
            let t = Instant::now();
            // The time since the last pass's clock read was that pass's (working if it did
            // anything, spinning if not), up to this pass's sleep.
            let active = wait_from.unwrap_or(t).saturating_duration_since(now);
            let acct = if worked {
                &mut self.times.work
            } else {
                &mut self.times.spin
            };
            *acct += active;
            if let Some(w) = wait_from {
                self.times.sleep += t.saturating_duration_since(w);
                slept = true;
            }
            now = t;
            let live = self.live();
            progress |= n > 0;
            for ev in &events[..n] {
                let key = ev.data();
                if key == RBD_KEY {
                    // The ring takes librbd's results (and resets the eventfd) in the reap below.
                } else if key == RECV_RING_KEY {
                    // Receive work is due: the TCP half's `poll` below reaps its ring.
                } else if key == WAKE_KEY {
                    let _ = self.wake.read();
                    self.drain_messages(now);
                    for c in each!(self) {
                        c.woken(cx!(self, now));
                    }
                } else {
                    let kind = if key & RDMA_KEY != 0 {
                        Kind::Rdma
                    } else {
                        Kind::Tcp
                    };
                    if let Some(c) = of_kind!(self, kind) {
                        c.ready(key as u32, ev.events(), cx!(self, now));
                    }
                }
            }
            for c in each!(self) {
                progress |= c.poll(cx!(self, now));
            }
            progress |= self.reap_backend(now);
            progress |= self.grant_buffers(now);
            if now >= next_tick {
                next_tick = now + TICK;
                for c in each!(self) {
                    c.tick(cx!(self, now));
                }
                self.publish(now);
            }
            // Last in the pass: everything above may have queued PDUs or staged responses.
            for c in each!(self) {
                progress |= c.flush(cx!(self, now));
            }
            if self.live() != live {
                self.publish(now);
            }
            if progress {
                if !worked || slept {
                    // An idle gap ended (after empty passes, or in this pass's sleep): the
                    // policy learns whether its spin caught the work, and sets the next gap's
                    // window.
                    policy.gap_ended(slept);
                    let measured = !each!(self).any(|c| c.sleeps_unmeasured());
                    window = policy.next_window(measured);
                }
                slept = false;
                last_work = now;
            }
            worked = progress;
            if !progress && self.store.inflight() > 0 {
                // Waiting on the backend only (librbd's threads too want this core). io_uring runs what it cannot do without
                // blocking (buffered reads of tmpfs on this machine's kernel: every one) on
                // an io-wq worker thread of this process; spinning here keeps it off this
                // core, and on a machine with fewer free cores than busy threads it then waits
                // for a scheduler tick (4k QD1 tmpfs p50: 88-132 us against 9 us for the
                // same read by a plain io_uring that blocks). Yielding lets it run at once
                // and costs one system call per empty pass when nothing else is runnable.
                std::thread::yield_now();
            }
        }
    }

    /// New connections, rdma_cm events and device slot changes.
    fn drain_messages(&mut self, now: Instant) {
        while let Ok(m) = self.rx.try_recv() {
            match m {
                ToPoller::Device(u) => u.apply(&mut self.store),
                ToPoller::Tcp(sock) => {
                    let wake = self.wake.clone();
                    let waker: crate::core::Waker = Arc::new(move || {
                        let _ = wake.write(1);
                    });
                    self.tcp.add(sock, waker, cx!(self, now));
                }
                ToPoller::Rdma(m) => match self.rdma.as_mut() {
                    Some(r) => r.message(m, cx!(self, now)),
                    None => warn!("an rdma_cm message for a poller without RDMA"),
                },
            }
        }
    }

    /// Backend completions, each to its connection. True if there were any.
    fn reap_backend(&mut self, now: Instant) -> bool {
        self.done.clear();
        self.store.reap(&mut self.done);
        let any = !self.done.is_empty();
        for i in 0..self.done.len() {
            let (ud, res) = self.done[i];
            let r = ReqRef::from_user_data(ud);
            let found = of_kind!(self, r.kind)
                .is_some_and(|c| c.backend_done(r.conn, r.slot, res, cx!(self, now)));
            if !found {
                warn!(
                    user_data = ud,
                    "backend completion for a connection that is gone"
                );
            }
        }
        any
    }

    /// Serves requests waiting for a pool buffer, FIFO over all connections of both
    /// transports. True if any got one.
    fn grant_buffers(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Some(&r) = self.need_buf.front() {
            let live = of_kind!(self, r.kind).is_some_and(|c| c.takes_buffer(r.conn));
            if !live {
                self.need_buf.pop_front();
                continue;
            }
            let Some(b) = self.store.alloc_buf() else {
                break;
            };
            self.need_buf.pop_front();
            if let Some(c) = of_kind!(self, r.kind) {
                c.buffer_granted(r.conn, r.slot, b, cx!(self, now));
            }
            any = true;
        }
        any
    }

    fn publish(&mut self, now: Instant) {
        let stats = self.stats.clone();
        for c in each!(self) {
            c.publish(&stats, cx!(self, now));
        }
        stats
            .buffers_in_use
            .store(self.store.buffers_in_use(), Ordering::Relaxed);
        stats
            .ring_enters
            .store(self.store.ring_enters(), Ordering::Relaxed);
        let ns = |d: Duration| d.as_nanos() as u64;
        stats.work_ns.store(ns(self.times.work), Ordering::Relaxed);
        stats.spin_ns.store(ns(self.times.spin), Ordering::Relaxed);
        stats
            .sleep_ns
            .store(ns(self.times.sleep), Ordering::Relaxed);
        stats
            .wake_latency_ns
            .store(ns(self.cfg.wake_latency), Ordering::Relaxed);
    }

    /// Close every connection, wait (bounded) for flushes and in-flight backend operations,
    /// release everything.
    fn shutdown(&mut self) {
        let now = Instant::now();
        for c in each!(self) {
            c.close_all("target shutting down", cx!(self, now));
        }
        let deadline = now + SHUTDOWN_LIMIT;
        loop {
            let now = Instant::now();
            for c in each!(self) {
                c.poll(cx!(self, now));
            }
            self.reap_backend(now);
            for c in each!(self) {
                // Past the drain limit this destroys RDMA QPs whose flushes never came.
                c.tick(cx!(self, now));
            }
            for c in each!(self) {
                c.flush(cx!(self, now));
            }
            if (self.live() == 0 && self.store.inflight() == 0) || now >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let now = Instant::now();
        for c in each!(self) {
            c.remove_all(cx!(self, now));
        }
        self.publish(now);
        info!(poller = self.cfg.id, "poller stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_pass_asks_epoll_only_after_a_signal_or_what_it_left_ready() {
        let both = [false, true];
        for (left, streaming) in both.iter().flat_map(|&l| both.map(|s| (l, s))) {
            // Blocking, or no watch: always epoll_wait.
            for fired in [None, Some(false), Some(true)] {
                assert_eq!(Check::of(false, fired, left, streaming), Check::Wait);
            }
            assert_eq!(Check::of(true, None, left, streaming), Check::Wait);
            // A signal after passes that found nothing: consume it, then ask epoll.
            assert_eq!(
                Check::of(true, Some(true), left, false),
                Check::RearmThenWait
            );
            // A signal while events keep coming: ask epoll, leave the signal (no re-arm).
            assert_eq!(Check::of(true, Some(true), left, true), Check::Wait);
        }
        // No signal since the last re-arm: epoll only for what the last pass left ready, else
        // no system call (also right after a pass that found events).
        for streaming in both {
            assert_eq!(Check::of(true, Some(false), true, streaming), Check::Wait);
            assert_eq!(Check::of(true, Some(false), false, streaming), Check::Skip);
        }
    }
}
