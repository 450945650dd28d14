//! The daemon's one interface to the transports' listeners ([`Listeners`]): NVMe/TCP acceptor
//! threads ([`TcpListeners`]) and the NVMe/RDMA rdma_cm thread ([`RdmaListenerSet`]). Both
//! hand connections to the same pollers, through which the daemon also updates devices and
//! reads statistics, so listening is the only thing it asks of a transport. Start-up and
//! reload go through the same calls: bind every listener, then start them all.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use config::Transport;
use tracing::info;

use super::conns::PollerHandle;
use super::poller::PollerConfig;
use super::rdma::{ListenError, Listening, RdmaOptions, RdmaStarting, RdmaTransport};
use super::tcp::tls::TlsSetting;
use crate::core::Target;

/// Why a listener could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("listener {addr} (tcp): {source}")]
    Tcp {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Rdma(#[from] ListenError),
}

/// A listener [`Listeners::bind`] set up: it serves once [`Listeners::start`]ed; dropped
/// instead, it is given back (its socket closed, or the rdma_cm thread stops listening).
pub struct Bound {
    listener: config::Listener,
    addr: SocketAddr,
    end: BoundEnd,
}

/// What a [`Bound`] holds of its transport.
enum BoundEnd {
    /// NVMe/TCP: the bound socket (nothing accepts from it before `start`).
    Tcp(TcpListener),
    /// NVMe/RDMA: the rdma_cm thread already listens.
    Rdma(Listening),
}

impl Bound {
    /// The address it is bound to (port 0 in the configuration resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The listener as configured.
    pub fn listener(&self) -> &config::Listener {
        &self.listener
    }
}

/// The listeners of one transport, as the daemon drives them at start, on reload and at
/// shutdown. Start-up binds every configured listener (so the discovery log can name the bound
/// addresses), starts the pollers (each [`configure_poller`](Self::configure_poller)d by every
/// transport), has each transport [`serve`](Self::serve) through them, then starts the bound
/// listeners. A reload binds every new listener first, then starts them all, or drops them all
/// when a later step fails, so a failed reload leaves the listeners as they were.
pub trait Listeners: Send {
    fn transport(&self) -> Transport;
    /// The listeners serving now with their bound addresses, in the order they started.
    fn running(&self) -> Vec<(config::Listener, SocketAddr)>;
    /// What each poller needs from this transport (before the pollers start).
    fn configure_poller(&self, _pc: &mut PollerConfig) {}
    /// The pollers run: start the transport's own threads, handing connections to `pollers`,
    /// until `stop` is set. [`start`](Self::start) needs this; [`bind`](Self::bind) does not.
    fn serve(
        &mut self,
        target: &Arc<Target>,
        pollers: &Arc<Vec<PollerHandle>>,
        stop: &Arc<AtomicBool>,
    ) -> std::io::Result<()>;
    /// Bind `l`. NVMe/RDMA listens at once (the rdma_cm thread owns its listeners); NVMe/TCP
    /// accepts nothing before `start`.
    fn bind(&mut self, l: &config::Listener) -> Result<Bound, BindError>;
    /// Serve a bound listener (one this transport bound); its address.
    fn start(&mut self, b: Bound) -> std::io::Result<SocketAddr>;
    /// The listener bound to `addr` takes `l`'s settings (subsystems, ANA states).
    fn update(&mut self, addr: SocketAddr, l: config::Listener);
    /// Stop listening on `addr`; connected hosts stay.
    fn close(&mut self, addr: SocketAddr);
    /// After the daemon's stop flag is set: stop listening and join the transport's threads.
    fn shut(self: Box<Self>);
}

/// A running NVMe/TCP listener and its acceptor thread.
struct TcpRun {
    listener: config::Listener,
    bound: SocketAddr,
    /// The listener's `tls` as its acceptor reads it for each new connection.
    tls: Arc<TlsSetting>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpRun {
    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Bind an NVMe/TCP listener.
fn bind_tcp(l: &config::Listener) -> Result<Bound, BindError> {
    let addr = SocketAddr::new(l.address, l.port);
    let sock = TcpListener::bind(addr).map_err(|source| BindError::Tcp { addr, source })?;
    Ok(Bound {
        listener: l.clone(),
        addr: sock.local_addr().unwrap_or(addr),
        end: BoundEnd::Tcp(sock),
    })
}

/// NVMe/TCP listeners: one acceptor thread each, handing connections to the pollers (after
/// the TLS handshake on a listener with `tls`).
#[derive(Default)]
pub struct TcpListeners {
    /// Set by [`Listeners::serve`].
    pollers: Option<Arc<Vec<PollerHandle>>>,
    /// The TLS server side (keys looked up in the target's current configuration); set by
    /// [`Listeners::serve`].
    tls: Option<tls::ServerConfig>,
    runs: Vec<TcpRun>,
}

impl Listeners for TcpListeners {
    fn transport(&self) -> Transport {
        Transport::Tcp
    }

    fn running(&self) -> Vec<(config::Listener, SocketAddr)> {
        self.runs
            .iter()
            .map(|r| (r.listener.clone(), r.bound))
            .collect()
    }

    fn serve(
        &mut self,
        target: &Arc<Target>,
        pollers: &Arc<Vec<PollerHandle>>,
        _stop: &Arc<AtomicBool>,
    ) -> std::io::Result<()> {
        // The acceptors have their own stop flags (a reload closes one listener); `shut`
        // sets them all.
        self.pollers = Some(pollers.clone());
        let keys = Arc::new(super::tcp::tls::TargetKeys(target.clone()));
        self.tls = Some(tls::ServerConfig::new(keys).map_err(std::io::Error::other)?);
        Ok(())
    }

    fn bind(&mut self, l: &config::Listener) -> Result<Bound, BindError> {
        bind_tcp(l)
    }

    fn start(&mut self, b: Bound) -> std::io::Result<SocketAddr> {
        let BoundEnd::Tcp(sock) = b.end else {
            return Err(std::io::Error::other("not an NVMe/TCP listener"));
        };
        let Some(pollers) = &self.pollers else {
            return Err(std::io::Error::other("NVMe/TCP is not serving yet"));
        };
        let Some(cfg) = self.tls.clone() else {
            return Err(std::io::Error::other("NVMe/TCP is not serving yet"));
        };
        let bound = b.addr;
        // Each acceptor has its own stop flag, so a reload can close one listener.
        let stop = Arc::new(AtomicBool::new(false));
        let tls = Arc::new(TlsSetting::new(b.listener.tls));
        let (p, s, t) = (pollers.clone(), stop.clone(), tls.clone());
        let thread = std::thread::Builder::new()
            .name(format!("nvmf-accept-{bound}"))
            .spawn(move || super::tcp::tls::run_acceptor(sock, t, cfg, p, s))?;
        info!(address = %bound, tls = ?b.listener.tls, "NVMe/TCP listener up");
        self.runs.push(TcpRun {
            listener: b.listener,
            bound,
            tls,
            stop,
            thread: Some(thread),
        });
        Ok(bound)
    }

    fn update(&mut self, addr: SocketAddr, l: config::Listener) {
        if let Some(r) = self.runs.iter_mut().find(|r| r.bound == addr) {
            if r.listener.tls != l.tls {
                info!(address = %addr, tls = ?l.tls, "NVMe/TCP listener's TLS changed (new connections)");
                r.tls.set(l.tls);
            }
            r.listener = l;
        }
    }

    fn close(&mut self, addr: SocketAddr) {
        if let Some(i) = self.runs.iter().position(|r| r.bound == addr) {
            let mut r = self.runs.remove(i);
            r.stop();
            info!(address = %r.bound, "NVMe/TCP listener closed (connected hosts stay)");
        }
    }

    fn shut(mut self: Box<Self>) {
        for r in self.runs.iter_mut() {
            r.stop();
        }
    }
}

/// NVMe/RDMA listeners: the rdma_cm thread listens on all of them and routes connection
/// requests to the pollers.
pub struct RdmaListenerSet {
    state: RdmaState,
    /// As configured, with the bound address, in the order they started.
    listeners: Vec<(config::Listener, SocketAddr)>,
}

enum RdmaState {
    /// Before [`Listeners::serve`]: binding on the channel the rdma_cm thread will own.
    Starting(RdmaStarting),
    Serving(RdmaTransport),
    /// `serve` failed.
    Gone,
}

impl RdmaListenerSet {
    pub fn new(options: RdmaOptions) -> RdmaListenerSet {
        RdmaListenerSet {
            state: RdmaState::Starting(RdmaStarting::new(options)),
            listeners: Vec::new(),
        }
    }
}

impl Listeners for RdmaListenerSet {
    fn transport(&self) -> Transport {
        Transport::Rdma
    }

    fn running(&self) -> Vec<(config::Listener, SocketAddr)> {
        self.listeners.clone()
    }

    fn configure_poller(&self, pc: &mut PollerConfig) {
        if let RdmaState::Starting(s) = &self.state {
            pc.rdma = Some(s.poller_setup());
        }
    }

    fn serve(
        &mut self,
        _target: &Arc<Target>,
        pollers: &Arc<Vec<PollerHandle>>,
        stop: &Arc<AtomicBool>,
    ) -> std::io::Result<()> {
        match std::mem::replace(&mut self.state, RdmaState::Gone) {
            RdmaState::Starting(s) => {
                self.state = RdmaState::Serving(s.start(pollers.clone(), stop.clone())?);
                Ok(())
            }
            other => {
                self.state = other;
                Err(std::io::Error::other("NVMe/RDMA is already serving"))
            }
        }
    }

    fn bind(&mut self, l: &config::Listener) -> Result<Bound, BindError> {
        let addr = SocketAddr::new(l.address, l.port);
        let listening = match &mut self.state {
            RdmaState::Starting(s) => s.listen(addr)?,
            RdmaState::Serving(t) => t.listen(addr)?,
            RdmaState::Gone => {
                return Err(BindError::Rdma(ListenError {
                    addr,
                    source: ::rdma::Error::Verbs {
                        call: "rdma_listen (the NVMe/RDMA transport did not start)",
                        errno: libc::ESHUTDOWN,
                    },
                }))
            }
        };
        Ok(Bound {
            listener: l.clone(),
            addr: listening.addr(),
            end: BoundEnd::Rdma(listening),
        })
    }

    fn start(&mut self, b: Bound) -> std::io::Result<SocketAddr> {
        let BoundEnd::Rdma(listening) = b.end else {
            return Err(std::io::Error::other("not an NVMe/RDMA listener"));
        };
        if !matches!(self.state, RdmaState::Serving(_)) {
            return Err(std::io::Error::other("NVMe/RDMA is not serving yet"));
        }
        let addr = listening.keep();
        self.listeners.push((b.listener, addr));
        Ok(addr)
    }

    fn update(&mut self, addr: SocketAddr, l: config::Listener) {
        if let Some(e) = self.listeners.iter_mut().find(|(_, a)| *a == addr) {
            e.0 = l;
        }
    }

    fn close(&mut self, addr: SocketAddr) {
        if let RdmaState::Serving(t) = &mut self.state {
            t.unlisten(addr);
        }
        self.listeners.retain(|(_, a)| *a != addr);
    }

    fn shut(self: Box<Self>) {
        // The rdma_cm thread first: no connection is routed to a poller that is stopping.
        if let RdmaState::Serving(t) = self.state {
            t.join();
        }
    }
}
