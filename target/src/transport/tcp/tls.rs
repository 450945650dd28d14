//! NVMe/TCP over TLS 1.3 with pre-shared keys (NVMe TCP Transport 1.1, 3.6) on the target side:
//! the acceptor of a listener with `tls` runs the handshakes, and a poller gets a connection
//! only once its channel is up, so a host that never finishes a handshake ties up its own
//! socket and nothing else (dropped after [`HANDSHAKE_TIMEOUT`], as nvmet's
//! `tls_handshake_timeout`).
//!
//! After the handshake the session goes to kernel TLS where the kernel has it: the connection
//! is then a plain socket to the poller (gathered sends from the pool, reads into the stage, as
//! without TLS). Elsewhere (no `tls` module) the records run in user space ([`NetWire::Tls`]),
//! one copy each way. Which one is logged per connection and counted.

use std::io::{self, IoSlice, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use config::TlsMode;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use tls::{Handshake, KeyLookup, PskIdentity, ServerConfig, Session, TlsStream};
use tracing::{debug, info, warn};
use zeroize::Zeroizing;

use super::wire::Wire;
use crate::core::Target;
use crate::transport::conns::PollerHandle;

/// A listener's `tls`, as its acceptor reads it for each new connection (a reload may change
/// it; connections already made keep what they have).
#[derive(Debug)]
pub struct TlsSetting(std::sync::atomic::AtomicU8);

impl TlsSetting {
    pub fn new(mode: Option<TlsMode>) -> TlsSetting {
        TlsSetting(std::sync::atomic::AtomicU8::new(Self::code(mode)))
    }

    fn code(mode: Option<TlsMode>) -> u8 {
        match mode {
            None => 0,
            Some(TlsMode::Required) => 1,
            Some(TlsMode::Allowed) => 2,
        }
    }

    pub fn set(&self, mode: Option<TlsMode>) {
        self.0.store(Self::code(mode), Ordering::Relaxed);
    }

    pub fn get(&self) -> Option<TlsMode> {
        match self.0.load(Ordering::Relaxed) {
            1 => Some(TlsMode::Required),
            2 => Some(TlsMode::Allowed),
            _ => None,
        }
    }
}

/// How long a host has to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes an acceptor runs at once; connections past this wait in the listen backlog.
const MAX_HANDSHAKES: usize = 1024;

/// TLS connections made, per kind of record layer, and handshakes that failed (metrics).
#[derive(Debug, Default)]
pub struct TlsCounters {
    pub kernel: AtomicU64,
    pub user: AtomicU64,
    pub failed: AtomicU64,
    pub timed_out: AtomicU64,
}

/// The process's counters.
pub fn counters() -> &'static TlsCounters {
    static C: std::sync::OnceLock<TlsCounters> = std::sync::OnceLock::new();
    C.get_or_init(TlsCounters::default)
}

/// Who does a TLS connection's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Records {
    /// Kernel TLS (the socket's `tls` ULP).
    Kernel,
    /// OpenSSL in this process.
    User,
}

/// A connection an acceptor hands to a poller.
#[derive(Debug)]
pub struct Accepted {
    pub wire: NetWire,
    /// The PSK identity of a TLS channel (its Connect must be for the identity's NQNs).
    pub tls: Option<PskIdentity>,
}

impl Accepted {
    pub fn plain(sock: TcpStream) -> Accepted {
        Accepted {
            wire: NetWire::Plain(sock),
            tls: None,
        }
    }
}

/// The byte stream of an NVMe/TCP connection: a socket (plain, or with kernel TLS), or TLS
/// records in user space over one.
#[derive(Debug)]
pub enum NetWire {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl NetWire {
    fn sock(&self) -> &TcpStream {
        match self {
            NetWire::Plain(s) => s,
            NetWire::Tls(t) => t.get_ref(),
        }
    }

    /// Non-blocking, no Nagle (what the poller needs).
    pub fn prepare(&self) -> io::Result<()> {
        self.sock().set_nonblocking(true)?;
        self.sock().set_nodelay(true)
    }
}

impl AsFd for NetWire {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock().as_fd()
    }
}

impl Wire for NetWire {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            NetWire::Plain(s) => s.recv(buf),
            NetWire::Tls(t) => t.read(buf),
        }
    }

    fn send(&mut self, iov: &[IoSlice<'_>]) -> io::Result<Option<usize>> {
        match self {
            NetWire::Plain(s) => s.send(iov),
            NetWire::Tls(t) => t.send_gather(iov),
        }
    }

    fn drain(&mut self) -> io::Result<bool> {
        match self {
            NetWire::Plain(_) => Ok(true),
            NetWire::Tls(t) => t.drain(),
        }
    }

    fn shutdown(&mut self) {
        let _ = self.sock().shutdown(std::net::Shutdown::Both);
    }

    fn peer(&self) -> String {
        self.sock().peer()
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        TcpStream::local_addr(self.sock()).ok()
    }
}

/// The target's keys as the handshake looks them up: the host's configured PSK in the
/// subsystem the identity names (always the current configuration: reloads and `ctl`
/// change what new handshakes find, live connections keep their session).
pub struct TargetKeys(pub Arc<Target>);

impl KeyLookup for TargetKeys {
    fn tls_psk(&self, id: &PskIdentity) -> Result<Zeroizing<Vec<u8>>, String> {
        self.0.inner().tls_psk(id)
    }
}

/// One connection the acceptor is working on.
enum Pending {
    /// `tls: allowed`: waiting for the first byte (a TLS handshake record or an ICReq).
    Peek(TcpStream),
    Handshake(Box<Handshake<TcpStream>>),
    /// Handed on (a placeholder while the item is taken apart).
    Gone,
}

struct Item {
    what: Pending,
    peer: SocketAddr,
    deadline: Instant,
}

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Accepts on an NVMe/TCP listener. Without `tls` a connection goes to a poller at once; with
/// it, handshakes run here (many at once, non-blocking), and a connection goes to a poller
/// once its channel is up (or at once, plain, when `allowed` and the host starts with an
/// ICReq).
pub fn run_acceptor(
    listener: TcpListener,
    mode: Arc<TlsSetting>,
    cfg: ServerConfig,
    pollers: Arc<Vec<PollerHandle>>,
    stop: Arc<AtomicBool>,
) {
    let _ = listener.set_nonblocking(true);
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut next = 0usize;
    let mut items: Vec<Item> = Vec::new();
    let mut give = |a: Accepted| {
        pollers[next % pollers.len()].give(a);
        next += 1;
    };
    while !stop.load(Ordering::Relaxed) {
        // New connections, while there is room.
        while items.len() < MAX_HANDSHAKES {
            match listener.accept() {
                Ok((sock, peer)) => {
                    debug!(%peer, listener = %local, "accepted");
                    if let Err(e) = sock.set_nonblocking(true) {
                        warn!(%peer, error = %e, "cannot set up a new connection");
                        continue;
                    }
                    let what = match mode.get() {
                        None => {
                            give(Accepted::plain(sock));
                            continue;
                        }
                        Some(TlsMode::Allowed) => Pending::Peek(sock),
                        Some(TlsMode::Required) => match Session::server(&cfg) {
                            Ok(s) => Pending::Handshake(Box::new(Handshake::new(sock, s))),
                            Err(e) => {
                                warn!(%peer, error = %e, "cannot start a TLS session");
                                continue;
                            }
                        },
                    };
                    items.push(Item {
                        what,
                        peer,
                        deadline: Instant::now() + HANDSHAKE_TIMEOUT,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    warn!(error = %e, listener = %local, "accept failed");
                    std::thread::sleep(Duration::from_millis(100));
                    break;
                }
            }
        }
        // Work on each until it would block.
        let now = Instant::now();
        let mut i = 0;
        while i < items.len() {
            match advance(&mut items[i], &cfg) {
                Ok(Some(a)) => {
                    items.swap_remove(i);
                    give(a);
                }
                Ok(None) if now >= items[i].deadline => {
                    let it = items.swap_remove(i);
                    counters().timed_out.fetch_add(1, Ordering::Relaxed);
                    info!(peer = %it.peer, listener = %local, timeout_s = HANDSHAKE_TIMEOUT.as_secs(),
                        "TLS handshake not finished in time: connection dropped");
                }
                Ok(None) => i += 1,
                Err(why) => {
                    let it = items.swap_remove(i);
                    counters().failed.fetch_add(1, Ordering::Relaxed);
                    info!(peer = %it.peer, listener = %local, reason = %why,
                        "TLS handshake failed: connection closed");
                }
            }
        }
        // Wait for any of them, or the listener, or the next deadline (200 ms at most, to
        // see `stop`).
        let wait = items
            .iter()
            .map(|it| it.deadline.saturating_duration_since(Instant::now()))
            .min()
            .unwrap_or(Duration::from_millis(200))
            .min(Duration::from_millis(200));
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(items.len() + 1);
        if items.len() < MAX_HANDSHAKES {
            fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
        }
        for it in &items {
            let (fd, out) = match &it.what {
                Pending::Peek(s) => (s.as_fd(), false),
                Pending::Handshake(h) => (h.socket().as_fd(), h.wants_write()),
                Pending::Gone => continue,
            };
            let mut f = PollFlags::POLLIN;
            if out {
                f |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(fd, f));
        }
        let ms = u16::try_from(wait.as_millis().max(1)).unwrap_or(200);
        let _ = nix::poll::poll(&mut fds, PollTimeout::from(ms));
    }
}

/// Moves one connection on: `Some` when it is ready for a poller, `None` when it waits for
/// its socket, `Err` when it is to be closed (the reason, for the log).
fn advance(it: &mut Item, cfg: &ServerConfig) -> Result<Option<Accepted>, String> {
    if let Pending::Peek(sock) = &it.what {
        let mut b = [0u8; 1];
        // SAFETY: a 1-byte buffer we own; MSG_PEEK leaves the byte in the socket.
        let r = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e.to_string()),
            };
        }
        if r == 0 {
            return Err("closed before sending anything".into());
        }
        let Pending::Peek(sock) = std::mem::replace(&mut it.what, Pending::Gone) else {
            unreachable!("matched above")
        };
        if b[0] != TLS_HANDSHAKE {
            debug!(peer = %it.peer, "plain NVMe/TCP on a listener that allows TLS");
            return Ok(Some(Accepted::plain(sock)));
        }
        let s = Session::server(cfg).map_err(|e| e.to_string())?;
        it.what = Pending::Handshake(Box::new(Handshake::new(sock, s)));
    }
    let Pending::Handshake(h) = &mut it.what else {
        return Err("nothing to work on".into());
    };
    match h.step() {
        Ok(false) => Ok(None),
        Ok(true) => {
            let Pending::Handshake(h) = std::mem::replace(&mut it.what, Pending::Gone) else {
                unreachable!("matched above")
            };
            established(*h, it.peer).map(Some)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A completed handshake: to kernel TLS if it takes it, else user-space records.
fn established(h: Handshake<TcpStream>, peer: SocketAddr) -> Result<Accepted, String> {
    let (sock, sess) = h.into_parts();
    let identity = sess
        .identity()
        .ok_or("the handshake ended without a PSK identity")?;
    if sess.input_pending() != 0 {
        return Err("data past the handshake in the session's buffer".into());
    }
    let cipher = sess.cipher();
    let records = match sess.ktls_keys() {
        Some(keys) => match tls::ktls::enable(sock.as_fd(), &keys) {
            Ok(()) => Records::Kernel,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOPROTOOPT)) => {
                Records::User
            }
            Err(e) => {
                // Part of the socket may already be in the kernel's hands: not usable.
                return Err(format!("kernel TLS set-up failed: {e}"));
            }
        },
        None => Records::User,
    };
    let wire = match records {
        Records::Kernel => {
            counters().kernel.fetch_add(1, Ordering::Relaxed);
            NetWire::Plain(sock)
        }
        Records::User => {
            counters().user.fetch_add(1, Ordering::Relaxed);
            NetWire::Tls(Box::new(TlsStream::new(sock, sess)))
        }
    };
    info!(%peer, identity = %identity, cipher, records = ?records, "TLS channel up");
    Ok(Accepted {
        wire,
        tls: Some(identity),
    })
}
