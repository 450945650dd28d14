//! The NVMe/TCP half of a poller: its sockets (registered in the poller's epoll under their
//! connection key) and their [`Conn`]s. A plain socket is received through the poller's
//! [`SocketRing`] where the kernel has it (`target.tcp_receive`): a multishot receive per socket,
//! whose completions [`TcpConns::poll`] hands to the connections (epoll then only reports that
//! a socket can take more output); TLS sockets, and every socket without the ring, are read
//! when epoll reports them readable. When several ring-received connections have output in the
//! same pass, their sends go out through the ring too, in one `io_uring_enter`
//! (`target.tcp_send`).

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nix::sys::epoll::{EpollEvent, EpollFlags};
use tracing::{debug, info, warn};

use super::tls::{Accepted, NetWire};
use super::{Conn, Wants, SLOT_STATES};
use crate::backend::{Received, SocketRing, SEND_TAG};
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

/// Iovecs of one send through the ring.
const SEND_IOV: usize = 64;

/// The message header and iovecs of a connection's send through the ring, kept (boxed: at a
/// fixed address) from the `io_uring_enter` that submits it until its completion.
struct SendMsg {
    msg: libc::msghdr,
    iov: [libc::iovec; SEND_IOV],
}

// SAFETY: the raw pointers point into the poller's own buffers and into the box itself; a
// SendMsg is only used by the thread that owns its TcpConns.
unsafe impl Send for SendMsg {}

impl SendMsg {
    fn new() -> Box<SendMsg> {
        // SAFETY: msghdr and iovec are plain data; all-zero is a valid empty header and iovec.
        Box::new(unsafe { std::mem::zeroed() })
    }
}

/// One connection key of the poller.
struct Key {
    conn: Option<Conn>,
    /// Whether EPOLLOUT is armed.
    out_armed: bool,
    /// How its socket is received, and its generation (a receive's tag carries it, so a
    /// completion of a closed connection never reaches the one that reuses its key).
    rx: Rx,
    generation: u32,
    /// For sends through the ring (made at the key's first one).
    send: Option<Box<SendMsg>>,
    /// Set by a send through the ring in this pass: whether the queue drained.
    sent: Option<bool>,
}

impl Key {
    /// Its tag as key `k` (see [`TcpConns::tag`]).
    fn tag(&self, k: usize) -> u64 {
        u64::from(self.generation & 0x7fff_ffff) << 32 | k as u64
    }
}

/// A poller's NVMe/TCP connections.
pub(crate) struct TcpConns {
    poller: usize,
    target: Arc<Target>,
    caps: TransportCaps,
    keys: Vec<Key>,
    free_keys: Vec<u32>,
    /// Connections in `conns`.
    live: usize,
    /// Connections that stopped reading before their socket was empty ([`Conn::left_ready`]).
    left_ready: usize,
    /// `target.tcp_receive`, and the ring once the first connection needs it (None: not
    /// made yet, not wanted, or the kernel lacks it; `ring_failed` says which).
    receive: config::TcpReceive,
    ring: Option<SocketRing>,
    ring_failed: bool,
    /// The ring signals its eventfd (between `prepare_sleep` and the next `poll`).
    notifying: bool,
    /// Sends through the ring, and the enters that submitted them, so far.
    ring_sends: u64,
    ring_send_enters: u64,
    /// `target.tcp_send`: sends go through the ring in a pass where at least this many
    /// ring-received connections have output (`usize::MAX`: never).
    ring_send_min: usize,
    /// Ring receives that ended (buffers ran out) and must be started again, by key.
    restart: Vec<u32>,
    /// The ring's receive completions not handled yet (reaped with sends, or by `poll`), and
    /// the keys they reached.
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
        send: config::TcpSend,
    ) -> TcpConns {
        TcpConns {
            poller,
            target,
            caps,
            keys: Vec::new(),
            free_keys: Vec::new(),
            live: 0,
            left_ready: 0,
            receive,
            ring: None,
            ring_failed: false,
            notifying: false,
            ring_sends: 0,
            ring_send_enters: 0,
            ring_send_min: match send {
                config::TcpSend::Auto => 2,
                config::TcpSend::IoUring => 1,
                config::TcpSend::Sendmsg => usize::MAX,
            },
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
        let made = SocketRing::new(RECV_BUFS, RECV_BUF_SIZE).and_then(|r| {
            // Edge-triggered: each signal is one event, and the counter needs no reads. The
            // ring signals it only while the poller sleeps (`prepare_sleep` turns it on, `poll`
            // off): while it spins, every receive would signal epoll and the readiness watch.
            let ev = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLET, RECV_RING_KEY);
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
        SocketRing::new(2, 4096).map(drop).map_err(|e| {
            format!("target.tcp_receive: io_uring needs Linux 6.1 or later (io_uring: {e})")
        })
    }

    /// Tag of key `k`'s receive and sends: its generation (31 bits: the top one is
    /// [`SEND_TAG`]) and the key.
    fn tag(&self, k: usize) -> u64 {
        self.keys[k].tag(k)
    }

    fn conn(&mut self, k: usize) -> Option<&mut Conn> {
        self.keys.get_mut(k).and_then(|e| e.conn.as_mut())
    }

    /// Starts the ring's receive on connection `k`'s socket (submitted at once: from now on
    /// its bytes arrive through the ring).
    fn start_receive(&mut self, k: usize) -> std::io::Result<()> {
        let tag = self.tag(k);
        let (Some(ring), Some(c)) = (self.ring.as_mut(), self.keys[k].conn.as_ref()) else {
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
                self.keys.push(Key {
                    conn: None,
                    out_armed: false,
                    rx: Rx::Epoll,
                    generation: 0,
                    send: None,
                    sent: None,
                });
                self.keys.len() - 1
            }
        };
        self.keys[k].generation = self.keys[k].generation.wrapping_add(1);
        let ring = matches!(conn.wire(), NetWire::Plain(_)) && self.ensure_ring(cx);
        self.keys[k].rx = if ring { Rx::Ring } else { Rx::Epoll };
        let ev = EpollEvent::new(self.interest(k, false), k as u64);
        if let Err(e) = cx.epoll.add(conn.wire(), ev) {
            warn!(error = %e, "epoll add failed");
            self.free_keys.push(k as u32);
            return;
        }
        debug!(poller = self.poller, peer = %conn.peer, ring, "new NVMe/TCP connection");
        conn.conn_key = k as u32;
        self.keys[k].out_armed = false;
        self.keys[k].conn = Some(conn);
        self.live += 1;
        if ring {
            if let Err(e) = self.start_receive(k) {
                warn!(error = %e, "cannot receive through io_uring; reading after epoll");
                self.keys[k].rx = Rx::Epoll;
                self.modify(k, false, cx);
            }
        }
    }

    /// What epoll watches on connection `k`'s socket: input too unless the ring receives it
    /// (then edge-triggered, so a hang-up is reported once: the ring reports it as well).
    fn interest(&self, k: usize, output: bool) -> EpollFlags {
        let mut f = match self.keys[k].rx {
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
        if let Some(c) = self.keys[k].conn.as_ref() {
            let _ = cx.epoll.modify(c.wire(), &mut ev);
        }
    }

    /// One completion of the receive ring: bytes for a connection (its buffer goes back to
    /// the ring at once), its end of stream, or the end of its receive.
    fn on_received(&mut self, r: Received, cx: &mut Cx<'_>) {
        let k = (r.tag & u64::from(u32::MAX)) as usize;
        let current = k < self.keys.len() && self.keys[k].rx == Rx::Ring && r.tag == self.tag(k);
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let c = match self.keys.get_mut(k).and_then(|e| e.conn.as_mut()) {
            Some(c) if current => c,
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

    /// Whether connection `k` sends through the ring if this pass does.
    fn ring_sender(&self, k: usize) -> bool {
        let e = &self.keys[k];
        e.rx == Rx::Ring
            && e.conn
                .as_ref()
                .is_some_and(|c| c.has_output() && !c.is_closing())
    }

    /// Sends the output of every ring-received connection through the ring in one
    /// `io_uring_enter`, when at least `ring_send_min` of them have output; each one's result
    /// goes to its key's `sent` for `flush`. Receive completions reaped on the way wait in
    /// `received` for the next `poll`.
    fn send_through_ring(&mut self, cx: &mut Cx<'_>) {
        if self.ring.is_none() || self.ring_send_min == usize::MAX {
            return;
        }
        let mut senders = 0;
        for k in 0..self.keys.len() {
            senders += usize::from(self.ring_sender(k));
            if senders >= self.ring_send_min {
                break;
            }
        }
        if senders < self.ring_send_min {
            return;
        }
        let mut queued = 0;
        for k in 0..self.keys.len() {
            if !self.ring_sender(k) {
                continue;
            }
            let tag = self.tag(k);
            let (Some(ring), e) = (self.ring.as_mut(), &mut self.keys[k]) else {
                return;
            };
            let Some(c) = e.conn.as_mut() else { continue };
            let m = e.send.get_or_insert_with(SendMsg::new);
            let n = c.send_gather(&mut m.iov, cx.store, cx.now);
            if n == 0 {
                continue;
            }
            m.msg.msg_iov = m.iov.as_mut_ptr();
            m.msg.msg_iovlen = n as _;
            let fd = c.wire().as_fd().as_raw_fd();
            // SAFETY: the header and iovecs live in the key's box, which stays until the
            // TcpConns is dropped; the bytes they point at stay queued in the connection, which
            // is not touched before `send_done` below (and its buffers are released only
            // through `send_done`); `wait_sends` returns only once every send has completed.
            match unsafe { ring.send(fd, &m.msg, tag) } {
                Ok(()) => queued += 1,
                Err(e) => {
                    // Not queued: `flush` sends it with `sendmsg`.
                    warn!(error = %e, "cannot queue a send on the ring");
                }
            }
        }
        if queued == 0 {
            return;
        }
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        self.ring_sends += queued;
        self.ring_send_enters += 1;
        let mut got = std::mem::take(&mut self.received);
        if let Err(e) = ring.wait_sends(&mut got) {
            // The ring cannot be entered: its sends may not have gone out. Stop sending through
            // it, and close the connections it sent for (their sockets are shut down: a send
            // the ring would still submit later sends nothing).
            warn!(error = %e, "send ring: io_uring_enter failed; sending with sendmsg");
            self.ring_send_min = usize::MAX;
            for k in 0..self.keys.len() {
                if self.ring_sender(k) && self.keys[k].send.is_some() {
                    if let Some(c) = self.keys[k].conn.as_mut() {
                        c.close(cx.store, "send ring failed");
                    }
                }
            }
        }
        // Send completions are handled now; receive completions stay, in order, for `poll`.
        let keys = &mut self.keys;
        got.retain(|r| {
            if r.tag & SEND_TAG == 0 {
                return true;
            }
            let k = (r.tag & u64::from(u32::MAX)) as usize;
            let Some(e) = keys.get_mut(k).filter(|e| r.tag & !SEND_TAG == e.tag(k)) else {
                return false;
            };
            let res = match r.res {
                n if n >= 0 => Ok(Some(n as usize)),
                n if n == -libc::EAGAIN => Ok(None),
                n => Err(std::io::Error::from_raw_os_error(-n)),
            };
            if let Some(c) = e.conn.as_mut() {
                e.sent = Some(c.send_done(res, cx.store, cx.now));
            }
            false
        });
        self.received = got;
    }

    fn remove(&mut self, k: usize, cx: &mut Cx<'_>) {
        if let Some(c) = self.keys[k].conn.take() {
            if self.keys[k].rx == Rx::Ring {
                // The receive holds the socket open until it ends: end it now (its last
                // completions carry the old generation and are dropped).
                let tag = self.tag(k);
                if let Some(r) = self.ring.as_mut() {
                    if let Err(e) = r.cancel(tag).and_then(|()| r.submit()) {
                        warn!(error = %e, "cannot cancel a socket's receive");
                    }
                }
                self.keys[k].rx = Rx::Epoll;
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
        let ring = self.keys.get(key as usize).map(|e| e.rx) == Some(Rx::Ring);
        let Some(c) = self.conn(key as usize) else {
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
            let wants = &mut self.wants;
            let Some(c) = self.keys[key as usize].conn.as_mut() else {
                return false;
            };
            c.on_readable(cx.store, cx.now, wants);
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
        if self.notifying {
            ring.notify(false);
            self.notifying = false;
        }
        let due = ring.pending();
        if !due && self.restart.is_empty() && self.received.is_empty() {
            return false;
        }
        // After the completions the enter of a send through the ring reaped (they came first;
        // that enter ran the receives due then, so without new work there is none to enter for).
        let mut received = std::mem::take(&mut self.received);
        if due {
            if let Err(e) = ring.reap(&mut received) {
                warn!(error = %e, "receive ring: io_uring_enter failed");
            }
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
            if let Some(c) = self.keys[k as usize].conn.as_mut() {
                c.read_direct_now(cx.store, cx.now, &mut self.wants);
                self.take_wants(k, cx);
            }
        }
        touched.clear();
        self.touched = touched;
        // Receives that ran out of buffers start again now that the buffers are back.
        while let Some(k) = self.restart.pop() {
            let k = k as usize;
            let live = matches!(&self.keys[k].conn, Some(c) if !c.is_closing());
            if live && self.keys[k].rx == Rx::Ring {
                if let Err(e) = self.start_receive(k) {
                    warn!(error = %e, "cannot restart a socket's receive");
                    if let Some(c) = self.keys[k].conn.as_mut() {
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
        match self.conn(conn as usize) {
            Some(c) => {
                c.backend_done(slot as u16, res, cx.store, cx.now);
                true
            }
            None => false,
        }
    }

    fn takes_buffer(&self, conn: u32) -> bool {
        matches!(self.keys.get(conn as usize), Some(Key { conn: Some(c), .. }) if !c.is_closing())
    }

    fn buffer_granted(&mut self, conn: u32, slot: u32, buf: u32, cx: &mut Cx<'_>) {
        if let Some(c) = self.conn(conn as usize) {
            c.buffer_granted(slot as u16, buf, cx.store, cx.now);
        }
    }

    fn tick(&mut self, cx: &mut Cx<'_>) {
        for c in self.keys.iter_mut().filter_map(|e| e.conn.as_mut()) {
            c.tick(cx.store, cx.now);
        }
    }

    fn woken(&mut self, cx: &mut Cx<'_>) {
        // Core events (AER completions, controller resets, keep-alive expiry on another
        // thread) wake the poller.
        self.tick(cx);
    }

    fn flush(&mut self, cx: &mut Cx<'_>) -> bool {
        self.send_through_ring(cx);
        for k in 0..self.keys.len() {
            let e = &mut self.keys[k];
            let sent = e.sent.take();
            let Some(c) = e.conn.as_mut() else {
                continue;
            };
            let drained = match sent {
                Some(drained) => drained,
                None => c.flush(cx.store, cx.now),
            };
            if drained == e.out_armed && !c.is_closing() {
                e.out_armed = !drained;
                self.modify(k, !drained, cx);
            }
            if self.keys[k].conn.as_ref().is_some_and(|c| c.is_finished()) {
                self.remove(k, cx);
            }
        }
        // Progress on TCP is what epoll reported.
        false
    }

    fn prepare_sleep(&mut self, _cx: &mut Cx<'_>) -> bool {
        let Some(ring) = self.ring.as_mut() else {
            return false;
        };
        // Let the ring signal its eventfd while the poller sleeps (no system call), then look
        // once more: work that came before would not signal it.
        ring.notify(true);
        self.notifying = true;
        ring.pending() || !self.received.is_empty()
    }

    fn left_ready(&self) -> bool {
        self.left_ready > 0
    }

    fn close_all(&mut self, reason: &str, cx: &mut Cx<'_>) {
        for c in self.keys.iter_mut().filter_map(|e| e.conn.as_mut()) {
            c.flush(cx.store, cx.now);
            c.close(cx.store, reason);
        }
    }

    fn remove_all(&mut self, cx: &mut Cx<'_>) {
        for k in 0..self.keys.len() {
            self.remove(k, cx);
        }
    }

    fn live(&self) -> usize {
        self.live
    }

    fn publish(&mut self, stats: &PollerStats, _cx: &mut Cx<'_>) {
        let mut t = self.closed_totals;
        let mut states = [0u32; SLOT_STATES];
        for c in self.keys.iter().filter_map(|e| e.conn.as_ref()) {
            t.add(&c.stats_now());
            for (s, n) in states.iter_mut().zip(c.state_counts()) {
                *s += n;
            }
        }
        stats.tcp.store(self.live, &t);
        stats
            .tcp_ring_sends
            .store(self.ring_sends, Ordering::Relaxed);
        stats
            .tcp_ring_send_enters
            .store(self.ring_send_enters, Ordering::Relaxed);
        for (a, n) in stats.tcp_requests.iter().zip(states) {
            a.store(n, Ordering::Relaxed);
        }
    }
}
