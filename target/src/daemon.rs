//! Wiring: configuration → devices, controller core, listeners and poller threads.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use config::{Backing, Config, Transport};
use tracing::info;

use crate::backend::{BufPool, DeviceSpec, Devices, FileSpec, Ring, RingConfig};
use crate::core::{
    ListenerInfo, NamespaceSpec, SubsystemSpec, Target, TargetParams, TrType, TransportCaps,
};
use crate::store::RingStore;
use crate::transport::poller::{self, PollerConfig, PollerHandle, PollerStats};
use crate::transport::rdma::{
    ListenError, RdmaConfig, RdmaListeners, RdmaOptions, RdmaPollerStats, RdmaTransport,
    SendWithInvalidate,
};

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("namespace storage: {0}")]
    Device(#[from] crate::backend::DeviceError),
    #[error("listener {addr} ({transport}): {source}")]
    Listen {
        addr: SocketAddr,
        transport: &'static str,
        source: std::io::Error,
    },
    /// An RDMA listener could not be set up (no RDMA on this machine, or the address is not
    /// on an RDMA-capable interface).
    #[error(transparent)]
    Rdma(#[from] ListenError),
    /// A bad RDMA transport option.
    #[error("rdma transport: {0}")]
    RdmaOption(String),
    #[error("poller thread: {0}")]
    Poller(std::io::Error),
}

/// A running target.
pub struct Daemon {
    target: Arc<Target>,
    stop: Arc<AtomicBool>,
    pollers: Arc<Vec<PollerHandle>>,
    acceptors: Vec<JoinHandle<()>>,
    rdma: Option<RdmaTransport>,
    /// Bound TCP listener addresses (port 0 in the config is resolved here).
    pub tcp_addrs: Vec<SocketAddr>,
    /// Bound RDMA listener addresses.
    pub rdma_addrs: Vec<SocketAddr>,
}

impl Daemon {
    /// Open the namespaces, bind every listener and start the poller threads.
    pub fn start(cfg: &Config) -> Result<Daemon, StartError> {
        // Namespaces → devices (index = the core's device id).
        let mut specs = Vec::new();
        let mut subsystems = Vec::new();
        for s in &cfg.subsystems {
            let mut namespaces = Vec::new();
            for ns in &s.namespaces {
                let spec = match &ns.backing {
                    Backing::File { path, size } => DeviceSpec::File(FileSpec {
                        path: path.clone(),
                        size: size.map(|s| s.bytes()),
                        block_size: ns.block_size,
                        read_only: ns.read_only,
                        buffered: false,
                    }),
                    Backing::Null { size } => DeviceSpec::Null {
                        size: size.bytes(),
                        block_size: ns.block_size.unwrap_or(config::DEFAULT_BLOCK_SIZE),
                    },
                };
                specs.push(spec);
                namespaces.push((ns.nsid, specs.len() as u32 - 1, ns.uuid.0));
            }
            subsystems.push((s, namespaces));
        }
        let devices = Arc::new(Devices::open(&specs)?);
        let subsystems = subsystems
            .into_iter()
            .map(|(s, nss)| SubsystemSpec {
                nqn: s.nqn.clone(),
                serial: s.serial.clone(),
                model: s.model.clone(),
                allow_any_host: s.allow_any_host,
                hosts: s.hosts.clone(),
                namespaces: nss
                    .into_iter()
                    .map(|(nsid, dev, uuid)| {
                        let d = devices.get(dev).expect("device opened above");
                        let bs = d.block_size();
                        NamespaceSpec {
                            nsid,
                            blocks: d.size_bytes() / bs as u64,
                            lba_shift: bs.trailing_zeros() as u8,
                            device: dev,
                            nguid: uuid,
                            uuid,
                        }
                    })
                    .collect(),
            })
            .collect();

        // Listeners. RDMA ones are bound first, all on one rdma_cm event channel, so that a
        // machine without RDMA fails before anything else is set up.
        let rdma_wanted: Vec<(usize, SocketAddr)> = cfg
            .listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| l.transport == Transport::Rdma)
            .map(|(i, l)| (i, SocketAddr::new(l.address, l.port)))
            .collect();
        let rdma_options = RdmaOptions {
            send_with_invalidate: SendWithInvalidate::from_env().map_err(StartError::RdmaOption)?,
        };
        let rdma_listeners = if rdma_wanted.is_empty() {
            None
        } else {
            let addrs: Vec<SocketAddr> = rdma_wanted.iter().map(|&(_, a)| a).collect();
            Some(RdmaListeners::bind(&addrs)?)
        };
        let rdma_bound = rdma_listeners
            .as_ref()
            .map(|l| l.local_addrs())
            .unwrap_or_default();
        let mut tcp = Vec::new();
        let mut infos = Vec::new();
        for (i, l) in cfg.listeners.iter().enumerate() {
            let addr = SocketAddr::new(l.address, l.port);
            match l.transport {
                Transport::Tcp => {
                    let sock = TcpListener::bind(addr).map_err(|source| StartError::Listen {
                        addr,
                        transport: "tcp",
                        source,
                    })?;
                    let bound = sock.local_addr().unwrap_or(addr);
                    infos.push(ListenerInfo {
                        trtype: TrType::Tcp,
                        traddr: bound.ip().to_string(),
                        trsvcid: bound.port().to_string(),
                        port_id: i as u16 + 1,
                    });
                    tcp.push((sock, bound));
                }
                Transport::Rdma => {
                    let k = rdma_wanted
                        .iter()
                        .position(|&(j, _)| j == i)
                        .expect("collected above");
                    let bound = rdma_bound[k];
                    infos.push(ListenerInfo {
                        trtype: TrType::Rdma,
                        traddr: bound.ip().to_string(),
                        trsvcid: bound.port().to_string(),
                        port_id: i as u16 + 1,
                    });
                }
            }
        }

        let t = &cfg.target;
        let target = Target::new(
            subsystems,
            infos,
            TargetParams {
                keep_alive_ms_min: t.keep_alive_ms_min,
            },
        );
        let caps = TransportCaps {
            trtype: TrType::Tcp,
            in_capsule_data: t.in_capsule_data.bytes() as u32,
            max_io_size: t.max_io_size.bytes() as u32,
            max_queue_depth: t.max_queue_depth as u16,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let buffers = (2 * t.max_queue_depth).clamp(64, 1024);
        let rdma = match rdma_listeners {
            Some(listeners) => {
                let devs = devices.clone();
                let io = caps.max_io_size as usize;
                let make_store = move || {
                    let pool = BufPool::new(buffers, io).map_err(std::io::Error::other)?;
                    let cfg = RingConfig {
                        sq_entries: 256,
                        max_inflight: 2 * buffers,
                    };
                    let ring = Ring::new(cfg, devs.clone(), pool).map_err(std::io::Error::other)?;
                    Ok(RingStore::new(ring))
                };
                let rcfg = RdmaConfig {
                    caps: TransportCaps {
                        trtype: TrType::Rdma,
                        ..caps.clone()
                    },
                    threads: t.threads as usize,
                    idle_poll: Duration::from_micros(t.idle_poll_us as u64),
                    options: rdma_options,
                    stop: stop.clone(),
                };
                Some(
                    RdmaTransport::start(listeners, target.clone(), rcfg, make_store)
                        .map_err(StartError::Poller)?,
                )
            }
            None => None,
        };
        let mut pollers = Vec::new();
        // TCP pollers serve only TCP connections: none without a TCP listener.
        let tcp_threads = if tcp.is_empty() {
            0
        } else {
            t.threads as usize
        };
        for id in 0..tcp_threads {
            let pc = PollerConfig {
                id,
                caps: caps.clone(),
                idle_poll: Duration::from_micros(t.idle_poll_us as u64),
                stop: stop.clone(),
            };
            let devs = devices.clone();
            let io = caps.max_io_size as usize;
            let h = poller::spawn(target.clone(), pc, move || {
                let pool = BufPool::new(buffers, io).map_err(std::io::Error::other)?;
                let cfg = RingConfig {
                    sq_entries: 256,
                    max_inflight: 2 * buffers,
                };
                let ring = Ring::new(cfg, devs, pool).map_err(std::io::Error::other)?;
                Ok(RingStore::new(ring))
            })
            .map_err(StartError::Poller)?;
            pollers.push(h);
        }
        let pollers = Arc::new(pollers);
        let mut acceptors = Vec::new();
        let mut tcp_addrs = Vec::new();
        for (sock, bound) in tcp {
            info!(address = %bound, "NVMe/TCP listener up");
            tcp_addrs.push(bound);
            let (p, s) = (pollers.clone(), stop.clone());
            acceptors.push(
                std::thread::Builder::new()
                    .name(format!("nvmf-accept-{bound}"))
                    .spawn(move || poller::run_acceptor(sock, p, s))
                    .map_err(StartError::Poller)?,
            );
        }
        let rdma_addrs = rdma
            .as_ref()
            .map(|r| r.local_addrs().to_vec())
            .unwrap_or_default();
        Ok(Daemon {
            target,
            stop,
            pollers,
            acceptors,
            rdma,
            tcp_addrs,
            rdma_addrs,
        })
    }

    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// Per-poller counters.
    pub fn poller_stats(&self) -> Vec<Arc<PollerStats>> {
        self.pollers.iter().map(|p| p.stats.clone()).collect()
    }

    /// Per-RDMA-poller counters (empty without RDMA listeners).
    pub fn rdma_stats(&self) -> Vec<Arc<RdmaPollerStats>> {
        self.rdma.as_ref().map(|r| r.stats()).unwrap_or_default()
    }

    /// Stop accepting, close every connection (in-flight backend operations are waited for,
    /// bounded), join the threads.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for p in self.pollers.iter() {
            p.wake();
        }
        for a in self.acceptors.drain(..) {
            let _ = a.join();
        }
        if let Some(r) = self.rdma.take() {
            r.join();
        }
        match Arc::try_unwrap(self.pollers) {
            Ok(mut ps) => ps.iter_mut().for_each(|p| p.join()),
            Err(_) => tracing::warn!("poller handles still shared at shutdown"),
        }
    }
}
