//! The NVMe/TCP half of a poller: its sockets (registered in the poller's epoll under their
//! connection key) and their [`Conn`]s.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use nix::sys::epoll::{EpollEvent, EpollFlags};
use tracing::{debug, warn};

use super::tls::Accepted;
use super::{Conn, Wants, SLOT_STATES};
use crate::core::{Target, TransportCaps, Waker};
use crate::transport::conns::{Conns, Cx, PollerStats};
use crate::transport::{ConnStats, ReqRef};

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
    wants: Wants,
    closed_totals: ConnStats,
}

impl TcpConns {
    pub fn new(poller: usize, target: Arc<Target>, caps: TransportCaps) -> TcpConns {
        TcpConns {
            poller,
            target,
            caps,
            conns: Vec::new(),
            out_armed: Vec::new(),
            free_keys: Vec::new(),
            live: 0,
            left_ready: 0,
            wants: Wants::default(),
            closed_totals: ConnStats::default(),
        }
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
                self.conns.len() - 1
            }
        };
        let ev = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP, k as u64);
        if let Err(e) = cx.epoll.add(conn.wire(), ev) {
            warn!(error = %e, "epoll add failed");
            self.free_keys.push(k as u32);
            return;
        }
        debug!(poller = self.poller, peer = %conn.peer, "new NVMe/TCP connection");
        conn.conn_key = k as u32;
        self.out_armed[k] = false;
        self.conns[k] = Some(conn);
        self.live += 1;
    }

    fn take_wants(&mut self, k: u32, cx: &mut Cx<'_>) {
        for slot in self.wants.need_buffer.drain(..) {
            cx.need_buf.push_back(ReqRef::tcp(k, u32::from(slot)));
        }
    }

    fn remove(&mut self, k: usize, cx: &mut Cx<'_>) {
        if let Some(c) = self.conns[k].take() {
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
        let Some(Some(c)) = self.conns.get_mut(key as usize) else {
            return false;
        };
        if f.intersects(EpollFlags::EPOLLOUT) {
            c.flush(cx.store, cx.now);
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

    fn poll(&mut self, _cx: &mut Cx<'_>) -> bool {
        // Sockets report through epoll.
        false
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
                let mut f = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
                if !drained {
                    f |= EpollFlags::EPOLLOUT;
                }
                let _ = cx.epoll.modify(c.wire(), &mut EpollEvent::new(f, k as u64));
                self.out_armed[k] = !drained;
            }
            if c.is_finished() {
                self.remove(k, cx);
            }
        }
        // Progress on TCP is what epoll reported.
        false
    }

    fn prepare_sleep(&mut self, _cx: &mut Cx<'_>) -> bool {
        false
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
