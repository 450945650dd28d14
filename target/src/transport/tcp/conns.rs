//! The NVMe/TCP half of a poller: its sockets (registered in the poller's epoll under their
//! connection key) and their [`Conn`]s. A plain socket is received through the poller's
//! [`RecvRing`] where the kernel has it (`target.tcp_receive`): a multishot receive per socket,
//! whose completions [`TcpConns::poll`] hands to the connections (epoll then only reports that
//! a socket can take more output); TLS sockets, and every socket without the ring, are read
//! when epoll reports them readable.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nix::sys::epoll::{EpollEvent, EpollFlags};
use tracing::{debug, info, warn};

use super::tls::{Accepted, NetWire};
use super::{Conn, Wants, SLOT_STATES};
use crate::backend::{Received, RecvRing};
use crate::core::{Target, TransportCaps, Waker};
use crate::transport::conns::{Conns, Cx, PollerStats};
use crate::transport::{ConnStats, ReqRef};

/// The epoll key of the receive ring's eventfd (below the poller's own keys, above any
/// connection's).
pub(crate) const RECV_RING_KEY: u64 = u64::MAX - 2;
/// Receive buffers of the ring, and their size: 4 MiB per poller that has TCP connections.
const RECV_BUFS: u16 = 256;
const RECV_BUF_SIZE: u32 = 16 * 1024;

/// How a connection's socket is received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rx {
    /// Read when epoll reports it readable.
    Epoll,
    /// Through the receive ring, under the tag `generation << 32 | key`.
    Ring,
}

/// A poller's NVMe/TCP connections.
pub(crate) struct TcpConns {
    poller: usize,
    target: Arc<Target>,
    caps: TransportCaps,
    conns: Vec<Option<Conn>>,
    /// Whether EPOLLOUT is armed, per connection.
    out_armed: Vec<bool>,
    free_keys: Vec<u32>,
    /// Connections in `conns`.
    live: usize,
    /// Connections that stopped reading before their socket was empty ([`Conn::left_ready`]).
    left_ready: usize,
    /// `target.tcp_receive`, and the ring once the first connection needs it (None: not
    /// made yet, not wanted, or the kernel lacks it; `ring_failed` says which).
    receive: config::TcpReceive,
    ring: Option<RecvRing>,
    ring_failed: bool,
    /// Per key: how its socket is received, and its generation (a receive's tag carries it,
    /// so a completion of a closed connection never reaches the one that reuses its key).
    rx: Vec<Rx>,
    generation: Vec<u32>,
    /// Ring receives that ended (buffers ran out) and must be started again, by key.
    restart: Vec<u32>,
    /// Scratch lists: the ring's completions, and the keys they reached.
    received: Vec<Received>,
    touched: Vec<u32>,
    wants: Wants,
    closed_totals: ConnStats,
}

impl TcpConns {
    pub fn new(
        poller: usize,
        target: Arc<Target>,
        caps: TransportCaps,
        receive: config::TcpReceive,
    ) -> TcpConns {
        TcpConns {
            poller,
            target,
            caps,
            conns: Vec::new(),
            out_armed: Vec::new(),
            free_keys: Vec::new(),
            live: 0,
            left_ready: 0,
            receive,
            ring: None,
            ring_failed: false,
            rx: Vec::new(),
            generation: Vec::new(),
            restart: Vec::new(),
            received: Vec::with_capacity(usize::from(RECV_BUFS) * 2),
            touched: Vec::new(),
            wants: Wants::default(),
            closed_totals: ConnStats::default(),
        }
    }

    /// Makes the receive ring (on the poller's thread, at its first plain connection) and puts
    /// its eventfd into epoll. Returns whether the ring is there. With `tcp_receive: io_uring`
    /// a kernel without it is an error at start-up (see [`TcpConns::check_receive`]).
    fn ensure_ring(&mut self, cx: &mut Cx<'_>) -> bool {
        if self.ring.is_some() {
            return true;
        }
        if self.ring_failed || self.receive == config::TcpReceive::Epoll {
            return false;
        }
        let made = RecvRing::new(RECV_BUFS, RECV_BUF_SIZE).and_then(|r| {
            // Disarmed until the poller is about to sleep (`prepare_sleep`): armed while it
            // spins, every receive would signal epoll and with it the readiness watch.
            let ev = EpollEvent::new(EpollFlags::EPOLLONESHOT, RECV_RING_KEY);
            cx.epoll.add(r.eventfd(), ev)?;
            Ok(r)
        });
        match made {
            Ok(r) => {
                debug!(
                    poller = self.poller,
                    "NVMe/TCP sockets received through io_uring"
                );
                self.ring = Some(r);
                true
            }
            Err(e) => {
                info!(poller = self.poller, error = %e,
                    "no io_uring receive ring (Linux 6.1+); NVMe/TCP sockets are read after epoll");
                self.ring_failed = true;
                false
            }
        }
    }

    /// Whether `tcp_receive` can be had here: `io_uring` on a kernel without it is refused at
    /// start-up rather than at the first connection.
    pub fn check_receive(receive: config::TcpReceive) -> Result<(), String> {
        if receive != config::TcpReceive::IoUring {
            return Ok(());
        }
        RecvRing::new(2, 4096).map(drop).map_err(|e| {
            format!("target.tcp_receive: io_uring needs Linux 6.1 or later (io_uring: {e})")
        })
    }

    fn tag(&self, k: usize) -> u64 {
        u64::from(self.generation[k]) << 32 | k as u64
    }

    /// Starts the ring's receive on connection `k`'s socket (submitted at once: from now on
    /// its bytes arrive through the ring).
    fn start_receive(&mut self, k: usize) -> std::io::Result<()> {
        let tag = self.tag(k);
        let (Some(ring), Some(c)) = (self.ring.as_mut(), self.conns[k].as_ref()) else {
            return Err(std::io::Error::other("no ring or connection"));
        };
        ring.recv(c.wire().as_fd().as_raw_fd(), tag)?;
        ring.submit()
    }

    /// A connection the acceptor handed over; `waker` wakes the poller (core events).
    pub fn add(&mut self, a: Accepted, waker: Waker, cx: &mut Cx<'_>) {
        let mut conn = match Conn::new(a, self.target.clone(), self.caps.clone(), waker) {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "cannot set up a new connection");
                return;
            }
        };
        let k = match self.free_keys.pop() {
            Some(k) => k as usize,
            None => {
                self.conns.push(None);
                self.out_armed.push(false);
                self.rx.push(Rx::Epoll);
                self.generation.push(0);
                self.conns.len() - 1
            }
        };
        self.generation[k] = self.generation[k].wrapping_add(1);
        let ring = matches!(conn.wire(), NetWire::Plain(_)) && self.ensure_ring(cx);
        self.rx[k] = if ring { Rx::Ring } else { Rx::Epoll };
        let ev = EpollEvent::new(self.interest(k, false), k as u64);
        if let Err(e) = cx.epoll.add(conn.wire(), ev) {
            warn!(error = %e, "epoll add failed");
            self.free_keys.push(k as u32);
            return;
        }
        debug!(poller = self.poller, peer = %conn.peer, ring, "new NVMe/TCP connection");
        conn.conn_key = k as u32;
        self.out_armed[k] = false;
        self.conns[k] = Some(conn);
        self.live += 1;
        if ring {
            if let Err(e) = self.start_receive(k) {
                warn!(error = %e, "cannot receive through io_uring; reading after epoll");
                self.rx[k] = Rx::Epoll;
                self.modify(k, false, cx);
            }
        }
    }

    /// What epoll watches on connection `k`'s socket: input too unless the ring receives it
    /// (then edge-triggered, so a hang-up is reported once: the ring reports it as well).
    fn interest(&self, k: usize, output: bool) -> EpollFlags {
        let mut f = match self.rx[k] {
            Rx::Epoll => EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP,
            Rx::Ring => EpollFlags::EPOLLET,
        };
        if output {
            f |= EpollFlags::EPOLLOUT;
        }
        f
    }

    fn modify(&mut self, k: usize, output: bool, cx: &mut Cx<'_>) {
        let mut ev = EpollEvent::new(self.interest(k, output), k as u64);
        if let Some(c) = self.conns[k].as_ref() {
            let _ = cx.epoll.modify(c.wire(), &mut ev);
        }
    }

    /// One completion of the receive ring: bytes for a connection (its buffer goes back to
    /// the ring at once), its end of stream, or the end of its receive.
    fn on_received(&mut self, r: Received, cx: &mut Cx<'_>) {
        let k = (r.tag & u64::from(u32::MAX)) as usize;
        let current = k < self.conns.len()
            && self.rx[k] == Rx::Ring
            && r.tag >> 32 == u64::from(self.generation[k]);
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let c = match self.conns.get_mut(k) {
            Some(Some(c)) if current => c,
            _ => {
                // A closed connection's last completions.
                if let Some(b) = r.buf {
                    ring.recycle(b);
                }
                return;
            }
        };
        if r.res > 0 {
            let data = r.buf.and_then(|b| ring.buf(b, r.res as usize));
            match data {
                Some(bytes) => {
                    c.on_received(bytes, cx.store, cx.now, &mut self.wants);
                    if self.touched.last() != Some(&(k as u32)) {
                        self.touched.push(k as u32);
                    }
                }
                None => {
                    // Not a buffer of the ring: the stream has a hole; it cannot go on.
                    warn!(buf = ?r.buf, len = r.res, "receive completion without its data");
                    c.close(cx.store, "receive completion without its data");
                }
            }
            if let Some(b) = r.buf {
                ring.recycle(b);
            }
        } else if r.res == 0 {
            c.close(cx.store, "host closed the connection");
        } else if r.res == -libc::ENOBUFS {
            // Every buffer was in use: this receive ended; `poll` starts it again.
        } else if r.res != -libc::ECANCELED {
            c.receive_failed(cx.store, std::io::Error::from_raw_os_error(-r.res));
        }
        if !r.more && r.res != 0 && !c.is_closing() {
            self.restart.push(k as u32);
        }
        self.take_wants(k as u32, cx);
    }

    fn take_wants(&mut self, k: u32, cx: &mut Cx<'_>) {
        for slot in self.wants.need_buffer.drain(..) {
            cx.need_buf.push_back(ReqRef::tcp(k, u32::from(slot)));
        }
    }

    fn remove(&mut self, k: usize, cx: &mut Cx<'_>) {
        if let Some(c) = self.conns[k].take() {
            if self.rx[k] == Rx::Ring {
                // The receive holds the socket open until it ends: end it now (its last
                // completions carry the old generation and are dropped).
                let tag = self.tag(k);
                if let Some(r) = self.ring.as_mut() {
                    if let Err(e) = r.cancel(tag).and_then(|()| r.submit()) {
                        warn!(error = %e, "cannot cancel a socket's receive");
                    }
                }
                self.rx[k] = Rx::Epoll;
            }
            self.left_ready -= usize::from(c.left_ready());
            let _ = cx.epoll.delete(c.wire());
            self.closed_totals.add(&c.stats_now());
            self.free_keys.push(k as u32);
            self.live -= 1;
            debug!(poller = self.poller, peer = %c.peer, "connection released");
        }
    }
}

impl Conns for TcpConns {
    fn ready(&mut self, key: u32, f: EpollFlags, cx: &mut Cx<'_>) -> bool {
        let ring = self.rx.get(key as usize) == Some(&Rx::Ring);
        let Some(Some(c)) = self.conns.get_mut(key as usize) else {
            return false;
        };
        if f.intersects(EpollFlags::EPOLLOUT) {
            c.flush(cx.store, cx.now);
        }
        if ring {
            // Input, end of stream and errors come through the ring.
            return true;
        }
        if f.intersects(
            EpollFlags::EPOLLIN
                | EpollFlags::EPOLLERR
                | EpollFlags::EPOLLHUP
                | EpollFlags::EPOLLRDHUP,
        ) {
            let before = c.left_ready();
            c.on_readable(cx.store, cx.now, &mut self.wants);
            self.left_ready = self.left_ready + usize::from(c.left_ready()) - usize::from(before);
            self.take_wants(key, cx);
        }
        true
    }

    fn poll(&mut self, cx: &mut Cx<'_>) -> bool {
        // Sockets read after epoll are handled in `ready`; this reaps the receive ring.
        let Some(ring) = self.ring.as_mut() else {
            return false;
        };
        if !ring.pending() && self.restart.is_empty() {
            return false;
        }
        let mut received = std::mem::take(&mut self.received);
        if let Err(e) = ring.reap(&mut received) {
            warn!(error = %e, "receive ring: io_uring_enter failed");
        }
        let any = !received.is_empty();
        self.touched.clear();
        for r in received.drain(..) {
            self.on_received(r, cx);
        }
        self.received = received;
        // Every completion is taken: what a connection still wants of a large payload it
        // reads from its socket now (those bytes follow the ones the ring delivered).
        let mut touched = std::mem::take(&mut self.touched);
        for &k in &touched {
            if let Some(Some(c)) = self.conns.get_mut(k as usize) {
                c.read_direct_now(cx.store, cx.now, &mut self.wants);
                self.take_wants(k, cx);
            }
        }
        touched.clear();
        self.touched = touched;
        // Receives that ran out of buffers start again now that the buffers are back.
        while let Some(k) = self.restart.pop() {
            let k = k as usize;
            let live = matches!(&self.conns[k], Some(c) if !c.is_closing());
            if live && self.rx[k] == Rx::Ring {
                if let Err(e) = self.start_receive(k) {
                    warn!(error = %e, "cannot restart a socket's receive");
                    if let Some(c) = self.conns[k].as_mut() {
                        c.close(cx.store, "receive failed");
                    }
                }
            }
        }
        any
    }

    fn backend_done(
        &mut self,
        conn: u32,
        slot: u32,
        res: Result<u32, i32>,
        cx: &mut Cx<'_>,
    ) -> bool {
        match self.conns.get_mut(conn as usize) {
            Some(Some(c)) => {
                c.backend_done(slot as u16, res, cx.store, cx.now);
                true
            }
            _ => false,
        }
    }

    fn takes_buffer(&self, conn: u32) -> bool {
        matches!(self.conns.get(conn as usize), Some(Some(c)) if !c.is_closing())
    }

    fn buffer_granted(&mut self, conn: u32, slot: u32, buf: u32, cx: &mut Cx<'_>) {
        let Some(Some(c)) = self.conns.get_mut(conn as usize) else {
            return;
        };
        c.buffer_granted(slot as u16, buf, cx.store, cx.now);
    }

    fn tick(&mut self, cx: &mut Cx<'_>) {
        for c in self.conns.iter_mut().flatten() {
            c.tick(cx.store, cx.now);
        }
    }

    fn woken(&mut self, cx: &mut Cx<'_>) {
        // Core events (AER completions, controller resets, keep-alive expiry on another
        // thread) wake the poller.
        self.tick(cx);
    }

    fn flush(&mut self, cx: &mut Cx<'_>) -> bool {
        for k in 0..self.conns.len() {
            let Some(c) = self.conns[k].as_mut() else {
                continue;
            };
            let drained = c.flush(cx.store, cx.now);
            if drained == self.out_armed[k] && !c.is_closing() {
                self.modify(k, !drained, cx);
                self.out_armed[k] = !drained;
            }
            let Some(c) = self.conns[k].as_ref() else {
                continue;
            };
            if c.is_finished() {
                self.remove(k, cx);
            }
        }
        // Progress on TCP is what epoll reported.
        false
    }

    fn prepare_sleep(&mut self, cx: &mut Cx<'_>) -> bool {
        let Some(ring) = self.ring.as_mut() else {
            return false;
        };
        // Arm the ring's eventfd for one wake-up (it disarms itself when it fires), then look
        // once more: work that came before the arm would not signal it again.
        ring.drain_eventfd();
        let mut ev = EpollEvent::new(
            EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT,
            RECV_RING_KEY,
        );
        if let Err(e) = cx.epoll.modify(ring.eventfd(), &mut ev) {
            warn!(error = %e, "cannot arm the receive ring's eventfd; polling");
            return true;
        }
        ring.pending()
    }

    fn left_ready(&self) -> bool {
        self.left_ready > 0
    }

    fn close_all(&mut self, reason: &str, cx: &mut Cx<'_>) {
        for c in self.conns.iter_mut().flatten() {
            c.flush(cx.store, cx.now);
            c.close(cx.store, reason);
        }
    }

    fn remove_all(&mut self, cx: &mut Cx<'_>) {
        for k in 0..self.conns.len() {
            self.remove(k, cx);
        }
    }

    fn live(&self) -> usize {
        self.live
    }

    fn publish(&mut self, stats: &PollerStats, _cx: &mut Cx<'_>) {
        let mut t = self.closed_totals;
        let mut states = [0u32; SLOT_STATES];
        for c in self.conns.iter().flatten() {
            t.add(&c.stats_now());
            for (s, n) in states.iter_mut().zip(c.state_counts()) {
                *s += n;
            }
        }
        stats.tcp.store(self.live, &t);
        for (a, n) in stats.tcp_requests.iter().zip(states) {
            a.store(n, Ordering::Relaxed);
        }
    }
}
