//! Wiring: configuration → devices, controller core, listeners and poller threads.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use config::{Backing, Config, Transport};
use tracing::{info, warn};

use crate::backend::{
    BufPool, Deallocate, Device, DeviceSpec, Devices, FileSpec, RbdSpec, Ring, RingConfig,
};
use crate::core::{
    HostKeys, HostSpec, ListenerInfo, NamespaceSpec, Reconfigured, SubsystemSpec, Target,
    TargetParams, TrType, TransportCaps,
};
use crate::resv_store::{state_file, FileResvStore};
use crate::store::RingStore;
use crate::transport::adaptive::{self, PollMode};
use crate::transport::conns::{PollerHandle, PollerStats};
use crate::transport::listen::{BindError, Bound, Listeners, RdmaListenerSet, TcpListeners};
use crate::transport::poller::{self, PollerConfig};
use crate::transport::rdma::{ListenError, RdmaOptions, SendWithInvalidate};
use crate::transport::DeviceUpdate;

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

/// Why a reload was rejected (the running configuration is unchanged).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    #[error("namespace storage: {0}")]
    Device(#[from] crate::backend::DeviceError),
    /// A new listener could not be bound (its transport's error, as it says it).
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("registering device {index} with the pollers' rings: {reason}")]
    Register { index: u32, reason: String },
}

impl From<BindError> for StartError {
    fn from(e: BindError) -> StartError {
        match e {
            BindError::Tcp { addr, source } => StartError::Listen {
                addr,
                transport: "tcp",
                source,
            },
            BindError::Rdma(e) => StartError::Rdma(e),
        }
    }
}

/// What a reload did, for the log.
#[derive(Debug, Default)]
pub struct ReloadReport {
    pub core: Reconfigured,
    pub listeners_added: Vec<SocketAddr>,
    pub listeners_removed: Vec<SocketAddr>,
    /// Backing stores opened (namespaces added, or changed and so reopened).
    pub devices_opened: usize,
    /// Backing stores closed (namespaces removed, or changed).
    pub devices_released: usize,
    /// Changes that were not applied (they need a restart).
    pub not_applied: Vec<String>,
}

impl ReloadReport {
    pub fn is_empty(&self) -> bool {
        self.core.is_empty()
            && self.listeners_added.is_empty()
            && self.listeners_removed.is_empty()
            && self.devices_opened == 0
            && self.devices_released == 0
    }
}

/// How long a reload waits for the pollers to register a device.
const REGISTER_LIMIT: Duration = Duration::from_secs(5);

/// Where each configured namespace lives: (subsystem NQN, NSID) -> its configuration and its
/// backend device slot.
type NsSlots = BTreeMap<(String, u32), (config::Namespace, u32)>;

/// What a reload must do to the namespaces' backing stores.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct NsPlan {
    /// Namespaces whose configuration is unchanged: they keep their device slot.
    pub keep: Vec<((String, u32), u32)>,
    /// Namespaces to open (new, or changed: path, size, block size, read-only, uuid or
    /// kind; a changed namespace is a removal plus an addition).
    pub open: Vec<((String, u32), config::Namespace)>,
    /// Device slots no namespace uses any more.
    pub release: Vec<u32>,
}

/// Compare the running namespaces with a new configuration. `resized(slot)` tells whether
/// the storage behind a device slot changed size since it was opened (a file grown with
/// `truncate`): such a namespace is reopened too.
pub(crate) fn plan_namespaces(
    running: &NsSlots,
    new: &Config,
    resized: impl Fn(u32) -> bool,
) -> NsPlan {
    let mut plan = NsPlan::default();
    let mut used = BTreeSet::new();
    for s in &new.subsystems {
        for ns in &s.namespaces {
            let key = (s.nqn.clone(), ns.nsid);
            match running.get(&key) {
                Some((old, slot)) if old == ns && !resized(*slot) => {
                    used.insert(*slot);
                    plan.keep.push((key, *slot));
                }
                _ => plan.open.push((key, ns.clone())),
            }
        }
    }
    plan.release = running
        .values()
        .map(|&(_, slot)| slot)
        .filter(|slot| !used.contains(slot))
        .collect();
    plan
}

fn device_spec(ns: &config::Namespace) -> DeviceSpec {
    match &ns.backing {
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
        Backing::Rbd(img) => DeviceSpec::Rbd(RbdSpec {
            conf: img.conf.clone(),
            user: img.user.clone(),
            pool: img.pool.clone(),
            namespace: img.namespace.clone(),
            image: img.image.clone(),
            block_size: ns.block_size.unwrap_or(config::DEFAULT_BLOCK_SIZE),
            read_only: ns.read_only,
        }),
    }
}

/// The reservation state file of every namespace that can persist one.
fn resv_files(
    slots: &NsSlots,
    devices: &[Option<Arc<Device>>],
) -> std::collections::HashMap<(String, u32), std::path::PathBuf> {
    slots
        .iter()
        .filter_map(|(key, &(_, slot))| {
            let d = devices.get(slot as usize)?.as_ref()?;
            Some((key.clone(), state_file(d)?))
        })
        .collect()
}

/// The core's subsystems for `cfg`, with every namespace's device slot from `slots`.
fn subsystem_specs(
    cfg: &Config,
    slots: &NsSlots,
    devices: &[Option<Arc<Device>>],
) -> Vec<SubsystemSpec> {
    cfg.subsystems
        .iter()
        .map(|s| SubsystemSpec {
            nqn: s.nqn.clone(),
            serial: s.serial.clone(),
            model: s.model.clone(),
            allow_any_host: s.allow_any_host,
            hosts: s
                .hosts
                .iter()
                .map(|h| HostSpec {
                    nqn: h.nqn.clone(),
                    keys: h.dhchap_key.as_ref().map(|k| HostKeys {
                        host: k.secret.clone(),
                        ctrl: h.dhchap_ctrl_key.as_ref().map(|c| c.secret.clone()),
                    }),
                    tls_psk: h.tls_psk.as_ref().map(|k| k.psk.clone()),
                })
                .collect(),
            auth_policy: nvme::auth::Policy {
                hashes: s.dhchap_hashes.clone(),
                dhgroups: s.dhchap_dhgroups.clone(),
            },
            namespaces: s
                .namespaces
                .iter()
                .filter_map(|ns| {
                    let &(_, slot) = slots.get(&(s.nqn.clone(), ns.nsid))?;
                    let d = devices.get(slot as usize)?.as_ref()?;
                    let bs = d.block_size();
                    Some(NamespaceSpec {
                        nsid: ns.nsid,
                        blocks: d.size_bytes() / bs as u64,
                        lba_shift: bs.trailing_zeros() as u8,
                        device: slot,
                        nguid: ns.uuid.0,
                        uuid: ns.uuid.0,
                        read_only: ns.read_only,
                        deallocate_zeroes: d.deallocate() == Deallocate::Zeroes,
                        ana_group: ns.ana_group,
                        native_caw: d.native_caw(),
                        volatile_cache: d.volatile_cache(),
                    })
                })
                .collect(),
        })
        .collect()
}

/// A running target.
pub struct Daemon {
    target: Arc<Target>,
    stop: Arc<AtomicBool>,
    pollers: Arc<Vec<PollerHandle>>,
    /// Each transport's listeners, NVMe/TCP first (the discovery log's order): NVMe/TCP always
    /// (a reload may add its first listener), NVMe/RDMA when the target started with one.
    transports: Vec<Box<dyn Listeners>>,
    /// The configuration running now (target settings and metrics as started).
    cfg: Config,
    /// Backend device slots (index = the core's device number); `None` once released.
    /// Slots are never reused: an operation queued for a released slot fails instead of
    /// reaching another namespace's storage.
    devices: Vec<Option<Arc<Device>>>,
    ns_slots: NsSlots,
    /// Where reservations persist (PTPL), kept in step with `ns_slots`.
    resv_store: Arc<FileResvStore>,
    /// Bound TCP listener addresses (port 0 in the config is resolved here).
    pub tcp_addrs: Vec<SocketAddr>,
    /// Bound RDMA listener addresses.
    pub rdma_addrs: Vec<SocketAddr>,
    /// Told by storage that changed under a namespace (an RBD image resized by anyone).
    storage: Arc<StorageWatch>,
    /// The configuration as given (`cfg` is it with the gateway group's ANA states applied).
    base: Config,
    /// A gateway's view of its group (`None`: not a gateway): the ANA groups it holds, which
    /// override the listeners' states.
    gateway: Option<crate::gateway::View>,
    /// ANA groups this gateway took with its last views whose RBD images are still being
    /// taken over ([`Daemon::take_over_rbd`]: the previous owner's lock broken, or this
    /// gateway found fenced itself): reported in ANA Change (hosts retry, and hold the
    /// commands) until that is done, so that no command reaches an image through a client a
    /// peer fenced (librbd would hold it until the host's timeout). By group, the takeover
    /// that must end (a group lost and taken again waits for its newer takeover).
    taking_over: BTreeMap<u32, u64>,
    /// Groups whose takeover ended, with the takeover's number, written by its thread (which
    /// then raises the storage change that brings the daemon's thread to
    /// [`Daemon::refresh_storage`]).
    taken: Arc<Mutex<Vec<(u32, u64)>>>,
    /// Takeovers started (numbers them).
    takeovers: u64,
}

/// Storage changes reported from other threads (librbd's update watches, a fenced client):
/// raised, they wake the thread that owns the daemon (main: a signal), which then calls
/// [`Daemon::refresh_storage`].
#[derive(Default)]
struct StorageWatch {
    changed: crate::backend::Signal,
}

impl StorageWatch {
    /// Has `dev` (an RBD image) report its header changes, and its client being fenced, here.
    fn watch(self: &Arc<Self>, dev: &Device) {
        let Some(img) = dev.rbd() else { return };
        let me = Arc::clone(self);
        dev.fenced().on_raise(Arc::new(move || me.changed.raise()));
        let me = Arc::clone(self);
        if let Err(e) = img.watch(move || me.changed.raise()) {
            warn!(image = img.name(), error = %e, "no update watch on the image: a resize will be seen only at a reload");
        }
    }
}

impl Daemon {
    /// Open the namespaces, bind every listener and start the poller threads.
    pub fn start(cfg: &Config) -> Result<Daemon, StartError> {
        Self::start_with(cfg, None)
    }

    /// [`Daemon::start`], with the reservation state kept in `resv` (a gateway group's store)
    /// instead of files next to the namespaces.
    pub fn start_with(
        cfg: &Config,
        resv: Option<Arc<dyn crate::core::ResvStore>>,
    ) -> Result<Daemon, StartError> {
        // A gateway serves no ANA group until it holds the group's lease.
        let gateway = cfg.gateway.as_ref().map(|_| crate::gateway::View {
            leased: leased_groups(cfg),
            ..Default::default()
        });
        let base = cfg.clone();
        let cfg = &overlay(gateway.as_ref(), &BTreeMap::new(), cfg);
        // Namespaces -> devices (index = the core's device id).
        let mut devices = Vec::new();
        let mut ns_slots = NsSlots::new();
        let storage = Arc::new(StorageWatch::default());
        for s in &cfg.subsystems {
            for ns in &s.namespaces {
                let dev = Device::open(&device_spec(ns))?;
                storage.watch(&dev);
                devices.push(Some(Arc::new(dev)));
                ns_slots.insert(
                    (s.nqn.clone(), ns.nsid),
                    (ns.clone(), devices.len() as u32 - 1),
                );
            }
        }
        let subsystems = subsystem_specs(cfg, &ns_slots, &devices);
        let resv_store = Arc::new(FileResvStore::default());
        resv_store.set(resv_files(&ns_slots, &devices));

        // Listeners, through the same interface a reload uses: NVMe/TCP always (a reload may
        // add its first listener), NVMe/RDMA when configured. The RDMA ones are bound first,
        // so that a machine without RDMA fails before anything else is set up; the discovery
        // log lists them in the transports' order (NVMe/TCP first), each in the file's order.
        let mut transports: Vec<Box<dyn Listeners>> = vec![Box::new(TcpListeners::default())];
        if !listeners_of(cfg, Transport::Rdma).is_empty() {
            let options = RdmaOptions {
                send_with_invalidate: SendWithInvalidate::from_env()
                    .map_err(StartError::RdmaOption)?,
                inline_responses: crate::transport::rdma::inline_responses_from_env()
                    .map_err(StartError::RdmaOption)?,
                srq_depth: cfg.target.rdma_srq_depth,
            };
            transports.push(Box::new(RdmaListenerSet::new(options)));
        }
        let mut bound: Vec<(usize, Bound)> = Vec::new();
        for ti in (0..transports.len()).rev() {
            for l in listeners_of(cfg, transports[ti].transport()) {
                bound.push((ti, transports[ti].bind(&l)?));
            }
        }
        bound.sort_by_key(|&(ti, _)| ti);
        let bound_addrs: Vec<(config::Listener, SocketAddr)> = bound
            .iter()
            .map(|(_, b)| (b.listener().clone(), b.addr()))
            .collect();
        let infos = listener_infos(bound_addrs.iter());

        let t = &cfg.target;
        let target = Target::new(
            subsystems,
            infos,
            TargetParams {
                keep_alive_ms_min: t.keep_alive_ms_min,
                resv_store: Some(resv.unwrap_or_else(|| resv_store.clone())),
                auth_timeout: crate::core::AUTH_TIMEOUT,
                data_completes_always: t.c2h_success == config::C2hSuccess::Always,
                cntlid_range: t.cntlid_min..=t.cntlid_max,
            },
        );
        let caps = TransportCaps {
            trtype: TrType::Tcp,
            in_capsule_data: t.in_capsule_data.bytes() as u32,
            max_io_size: t.io_unit().bytes() as u32,
            max_transfer: t.max_io_size.bytes() as u32,
            max_queue_depth: t.max_queue_depth as u16,
        };
        let poll = match t.polling {
            config::Polling::Adaptive => PollMode::Adaptive {
                max_spin: Duration::from_micros(t.idle_poll_us as u64),
            },
            config::Polling::Busy => PollMode::Busy,
            config::Polling::Interrupt => PollMode::Interrupt,
        };
        // What a sleeping poller pays per wake-up on this machine (the adaptive policy spins
        // only through gaps shorter than that).
        let wake_latency = adaptive::measure_wake_latency(50);
        tracing::info!(polling = %t.polling, wake_latency_us = wake_latency.as_secs_f64() * 1e6,
            "poller wake-up latency measured");
        let stop = Arc::new(AtomicBool::new(false));
        let buffers = (2 * t.max_queue_depth).clamp(64, 1024);
        let (sqpoll, sqpoll_idle_ms, iopoll) = (t.sqpoll, t.sqpoll_idle_ms, t.iopoll);
        // Each poller's ring learns the devices of the start-up configuration here, and those
        // a reload adds through `DeviceUpdate` messages.
        let initial: Vec<(u32, Arc<Device>)> = devices
            .iter()
            .enumerate()
            .filter_map(|(i, d)| Some((i as u32, d.clone()?)))
            .collect();
        let io = caps.max_io_size as usize;
        let make_store = move || {
            let pool = BufPool::new(buffers, io).map_err(std::io::Error::other)?;
            let cfg = RingConfig {
                sq_entries: 256,
                max_inflight: 2 * buffers,
                sqpoll: sqpoll.then(|| Duration::from_millis(sqpoll_idle_ms.into())),
                iopoll,
            };
            let mut ring = Ring::new(cfg, Arc::new(Devices::default()), pool)
                .map_err(std::io::Error::other)?;
            for (i, d) in &initial {
                ring.set_device(*i, Some(d))?;
            }
            info!(
                mode = ?ring.mode(),
                buffers,
                iopoll,
                polled_devices = ring.polled_devices(),
                "io_uring backend ring ready"
            );
            Ok(RingStore::new(ring))
        };
        // One poller per thread, each serving every transport.
        let mut pollers = Vec::new();
        for id in 0..t.threads as usize {
            let mut pc = PollerConfig {
                id,
                caps: caps.clone(),
                poll,
                wake_latency,
                tcp_receive: t.tcp_receive,
                tcp_send: t.tcp_send,
                stop: stop.clone(),
                rdma: None,
            };
            for tr in &transports {
                tr.configure_poller(&mut pc);
            }
            let h = poller::spawn(target.clone(), pc, make_store.clone())
                .map_err(StartError::Poller)?;
            pollers.push(h);
        }
        let pollers = Arc::new(pollers);
        for tr in transports.iter_mut() {
            tr.serve(&target, &pollers, &stop)
                .map_err(StartError::Poller)?;
        }
        for (ti, b) in bound {
            transports[ti].start(b).map_err(StartError::Poller)?;
        }
        let mut d = Daemon {
            target,
            stop,
            pollers,
            transports,
            cfg: cfg.clone(),
            devices,
            ns_slots,
            resv_store,
            tcp_addrs: Vec::new(),
            rdma_addrs: Vec::new(),
            storage,
            base,
            gateway,
            taking_over: BTreeMap::new(),
            taken: Arc::default(),
            takeovers: 0,
        };
        d.note_addrs();
        Ok(d)
    }

    /// `wake` is called (from any thread) when storage under a namespace changed by itself
    /// (an RBD image was resized); the daemon's thread then calls
    /// [`Daemon::refresh_storage`].
    pub fn on_storage_change(&self, wake: impl Fn() + Send + Sync + 'static) {
        self.storage.changed.on_raise(Arc::new(wake));
    }

    /// If storage reported a change since the last call: applies the running configuration
    /// again, which opens every resized namespace anew and tells the hosts (Namespace
    /// Attribute Changed). `None` when nothing was reported.
    pub fn refresh_storage(&mut self) -> Option<Result<ReloadReport, ReloadError>> {
        if !self.storage.changed.take() {
            return None;
        }
        // Takeovers that ended: their groups are served optimized with this reload (which
        // also opens a fenced image again).
        let taken = std::mem::take(&mut *self.taken.lock().unwrap_or_else(PoisonError::into_inner));
        for (g, n) in taken {
            if self.taking_over.get(&g) == Some(&n) {
                self.taking_over.remove(&g);
            }
        }
        // A fenced client serves nothing any more: its namespaces are opened again (as a
        // resized one is) on a new connection.
        for d in self.devices.iter().flatten() {
            if d.fenced().is_raised() {
                if let Some(img) = d.rbd() {
                    warn!(image = img.name(), client = %img.ioctx().cluster().client_name(), "this gateway's cluster client was blocklisted (another gateway fenced it): opening the image again on a new connection");
                    crate::backend::rbd_forget_cluster(img.ioctx().cluster());
                }
            }
        }
        let cfg = self.base.clone();
        Some(self.reload(&cfg))
    }

    /// `tcp_addrs` and `rdma_addrs` from the running listeners.
    fn note_addrs(&mut self) {
        let addrs = |t: Transport| -> Vec<SocketAddr> {
            self.transports
                .iter()
                .filter(|s| s.transport() == t)
                .flat_map(|s| s.running())
                .map(|(_, a)| a)
                .collect()
        };
        (self.tcp_addrs, self.rdma_addrs) = (addrs(Transport::Tcp), addrs(Transport::Rdma));
    }

    /// Every running listener with its bound address, NVMe/TCP first.
    fn running(&self) -> Vec<(config::Listener, SocketAddr)> {
        self.transports.iter().flat_map(|t| t.running()).collect()
    }

    /// The configuration running now (as given: without the gateway group's ANA states).
    pub fn config(&self) -> &Config {
        &self.base
    }

    /// A gateway's new view of its group: the ANA groups it holds are served optimized on
    /// every listener and the others inaccessible (hosts get the ANA change event; RBD images
    /// of a group taken over are fenced from a dead holder), and the discovery log lists the
    /// live peers' listeners.
    pub fn apply_gateway_view(
        &mut self,
        view: crate::gateway::View,
    ) -> Result<ReloadReport, ReloadError> {
        let remote: Vec<ListenerInfo> = view
            .peers
            .iter()
            .flat_map(|p| p.record.listeners.iter())
            .filter(|l| !l.address.is_unspecified())
            .enumerate()
            .map(|(i, l)| {
                // Port ids past this target's own.
                let addr = SocketAddr::new(l.address, l.port);
                listener_info(l.transport, addr, 0x100 + i as u16, &l.subsystems)
            })
            .collect();
        self.target.set_remote_listeners(remote);
        // Groups this gateway starts serving: their namespaces' reservations are read again
        // from the group's store first (they are inaccessible here until the reload below).
        let newly: BTreeSet<u32> = view
            .owned
            .iter()
            .filter(|g| !self.gateway.as_ref().is_some_and(|v| v.owned.contains(g)))
            .copied()
            .collect();
        if !newly.is_empty() {
            let n = self.target.reload_reservations(&newly);
            info!(groups = ?newly, namespaces = n, "reservations read from the gateway group");
        }
        self.taking_over.retain(|g, _| view.owned.contains(g));
        // After the view is in place: the new view's live peers are the clients spared.
        self.gateway = Some(view);
        self.takeovers += 1;
        let n = self.takeovers;
        let checking = self.take_over_rbd(&newly, Some(n));
        if !checking.is_empty() {
            info!(groups = ?checking, "taking the groups' RBD images over: ANA change until done");
        }
        self.taking_over
            .extend(checking.into_iter().map(|g| (g, n)));
        let base = self.base.clone();
        self.reload(&base)
    }

    /// After a view that gave groups up was applied (they are inaccessible here, so no new
    /// command on their namespaces is admitted): waits, at most `limit`, for the writes still
    /// in flight on their subsystems' controllers, so none lands after the next gateway
    /// starts serving them (a Compare and Write there must see them). True if drained.
    pub fn drain_groups(&self, groups: &BTreeSet<u32>, limit: Duration) -> bool {
        let t = Instant::now();
        loop {
            let n = self.target.writes_in_flight(groups);
            if n == 0 {
                return true;
            }
            if t.elapsed() >= limit {
                warn!(
                    ?groups,
                    writes = n,
                    "handing ANA groups over with writes still in flight"
                );
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The ANA groups this gateway serves now (empty when not a gateway).
    pub fn owned_groups(&self) -> BTreeSet<u32> {
        self.gateway
            .as_ref()
            .map(|v| v.owned.clone())
            .unwrap_or_default()
    }

    /// This target's running listeners as the group's other gateways list them.
    pub fn peer_listeners(&self) -> Vec<crate::gateway::PeerListener> {
        self.running()
            .into_iter()
            .map(|(l, a)| crate::gateway::PeerListener {
                transport: l.transport,
                address: a.ip(),
                port: a.port(),
                subsystems: l.subsystems.clone(),
            })
            .collect()
    }

    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// Per-poller counters (each poller serves both transports).
    pub fn poller_stats(&self) -> Vec<Arc<PollerStats>> {
        self.pollers.iter().map(|p| p.stats().clone()).collect()
    }

    /// Whether the target serves NVMe/RDMA (it started with an RDMA listener).
    pub fn has_rdma(&self) -> bool {
        self.transports
            .iter()
            .any(|t| t.transport() == Transport::Rdma)
    }

    /// The number of running listeners (TCP and RDMA).
    pub fn listener_count(&self) -> usize {
        self.running().len()
    }

    /// Apply a new (already validated) configuration: namespaces, subsystems, allowed hosts
    /// and NVMe/TCP listeners. Everything that can fail (opening storage, binding ports,
    /// registering devices with every poller's ring) happens before anything visible
    /// changes, so an error leaves the running configuration as it was. Target settings,
    /// the metrics endpoint and the first NVMe/RDMA listener of a target started without one
    /// are not changed (reported in `not_applied`: they need a restart).
    pub fn reload(&mut self, new: &Config) -> Result<ReloadReport, ReloadError> {
        let mut report = ReloadReport::default();
        let mut base = new.clone();
        if base.target != self.cfg.target {
            report
                .not_applied
                .push("`target` settings (they apply at the next start)".into());
            base.target = self.cfg.target.clone();
        }
        if base.metrics != self.cfg.metrics {
            report
                .not_applied
                .push("`metrics` (the endpoint changes at the next start)".into());
            base.metrics = self.cfg.metrics.clone();
        }
        if base.gateway != self.base.gateway {
            report
                .not_applied
                .push("`gateway` (the group is joined at the next start)".into());
            base.gateway = self.base.gateway.clone();
        }
        if let Some(v) = &mut self.gateway {
            v.leased = leased_groups(&base);
        }
        let mut new = overlay(self.gateway.as_ref(), &self.taking_over, &base);
        // New listeners join their running transport; a transport the target started without
        // has no threads to serve them, so they wait for a restart. (NVMe/TCP needs nothing
        // but the pollers, which serve every transport: it always runs.)
        let mut to_bind: Vec<(usize, config::Listener)> = Vec::new();
        for tr in [Transport::Tcp, Transport::Rdma] {
            let wanted = listeners_of(&new, tr);
            match self.transports.iter().position(|t| t.transport() == tr) {
                Some(ti) => {
                    let running = self.transports[ti].running();
                    to_bind.extend(
                        wanted
                            .into_iter()
                            .filter(|l| !running.iter().any(|(o, _)| o.same_endpoint(l)))
                            .map(|l| (ti, l)),
                    );
                }
                None if !wanted.is_empty() => report.not_applied.push(format!(
                    "new {} listeners: this target started without one, so it has no {} \
                     transport (restart to add the first)",
                    transport_name(tr),
                    transport_name(tr),
                )),
                None => {}
            }
        }

        // 1. Open storage for new and changed namespaces.
        let plan = plan_namespaces(&self.ns_slots, &new, |slot| self.file_resized(slot));
        let mut opened = Vec::new();
        for (key, ns) in &plan.open {
            let dev = Device::open(&device_spec(ns))?;
            self.storage.watch(&dev);
            opened.push((key.clone(), ns.clone(), Arc::new(dev)));
        }
        // 2. Bind the new listeners (given back below if a later step fails).
        let mut bound = Vec::new();
        for (ti, l) in &to_bind {
            match self.transports[*ti].bind(l) {
                Ok(b) => bound.push((*ti, b)),
                // `bound` is dropped: the listeners bound so far are given back.
                Err(e) => return Err(e.into()),
            }
        }
        // 3. Every poller's ring learns the new devices (slots are never reused).
        let first = self.devices.len() as u32;
        let added: Vec<(u32, Arc<Device>)> = opened
            .iter()
            .enumerate()
            .map(|(i, (_, _, d))| (first + i as u32, d.clone()))
            .collect();
        for (i, (index, dev)) in added.iter().enumerate() {
            if let Err(reason) = self.update_pollers(*index, Some(dev.clone())) {
                // Undo what the pollers registered so far.
                for (index, _) in &added[..=i] {
                    let _ = self.update_pollers(*index, None);
                }
                drop(bound);
                return Err(ReloadError::Register {
                    index: *index,
                    reason,
                });
            }
        }
        // Nothing can fail from here on.
        for ((key, ns, dev), (index, _)) in opened.into_iter().zip(&added) {
            self.devices.push(Some(dev));
            self.ns_slots.insert(key, (ns, *index));
        }
        report.devices_opened = added.len();
        let mut slots = NsSlots::new();
        for (key, slot) in &plan.keep {
            if let Some(v) = self.ns_slots.get(key) {
                slots.insert(key.clone(), (v.0.clone(), *slot));
            }
        }
        for (key, _) in &plan.open {
            if let Some(v) = self.ns_slots.get(key) {
                slots.insert(key.clone(), v.clone());
            }
        }
        self.ns_slots = slots;

        // 4. Listeners: close the removed ones, start the new ones; the ones kept take what
        // they serve and their ANA states from the new configuration.
        for t in self.transports.iter_mut() {
            for (l, addr) in t.running() {
                match new.listeners.iter().find(|n| n.same_endpoint(&l)) {
                    Some(n) => t.update(addr, n.clone()),
                    None => {
                        t.close(addr);
                        report.listeners_removed.push(addr);
                    }
                }
            }
        }
        for (ti, b) in bound {
            let addr = b.addr();
            match self.transports[ti].start(b) {
                Ok(a) => report.listeners_added.push(a),
                Err(e) => warn!(address = %addr, error = %e, "cannot start the listener"),
            }
        }
        self.note_addrs();
        let running = self.running();

        // 5. The core: subsystems, hosts, namespaces (hosts get their AENs here).
        let specs = subsystem_specs(&new, &self.ns_slots, &self.devices);
        self.resv_store
            .set(resv_files(&self.ns_slots, &self.devices));
        report.core = self
            .target
            .reconfigure(specs, listener_infos(running.iter()));

        // 6. Storage no namespace uses any more: the rings forget it, its file is closed.
        for slot in plan.release {
            if let Err(reason) = self.update_pollers(slot, None) {
                warn!(index = slot, %reason, "could not unregister a released device");
            }
            if let Some(d) = self.devices.get_mut(slot as usize) {
                *d = None;
            }
            report.devices_released += 1;
        }
        new.listeners = running.into_iter().map(|(l, _)| l).collect();
        if self.gateway.is_none() {
            // A gateway takes its images over with each new view (apply_gateway_view).
            let optimized = |cfg: &Config, group: u32| {
                cfg.listeners
                    .iter()
                    .any(|l| l.ana_state(group) == config::AnaState::Optimized)
            };
            let groups: BTreeSet<u32> = self
                .ns_slots
                .values()
                .map(|(ns, _)| ns.ana_group)
                .filter(|&g| optimized(&new, g) && !optimized(&self.cfg, g))
                .collect();
            self.take_over_rbd(&groups, None);
        }
        self.cfg = new;
        self.base = base;
        Ok(report)
    }

    /// The RBD namespaces of ANA `groups`, which this target starts serving (a reload or `ctl
    /// set-ana-state` made it their owner, or a gateway took their leases): their images'
    /// exclusive locks held by other clients are broken, which fences the old owner (the
    /// cluster blocklists it) and lets this target write at once instead of waiting for a dead
    /// owner's watch to time out. On a thread of its own: it talks to the cluster. With
    /// `report` (the takeover's number), the thread puts the groups in `taken` when done and
    /// raises the storage change. Returns the groups that have RBD images.
    fn take_over_rbd(&self, groups: &BTreeSet<u32>, report: Option<u64>) -> BTreeSet<u32> {
        let mut with_images = BTreeSet::new();
        let images: Vec<(Arc<rbd::Image>, Arc<crate::backend::Signal>)> = self
            .ns_slots
            .values()
            .filter(|(ns, _)| groups.contains(&ns.ana_group))
            .filter_map(|(ns, slot)| {
                let d = self.devices.get(*slot as usize)?.as_ref()?;
                let img = d.rbd()?.clone();
                with_images.insert(ns.ana_group);
                Some((img, Arc::clone(d.fenced())))
            })
            .collect();
        if images.is_empty() {
            return with_images;
        }
        // The group's live gateways give the images' locks up when asked: only the dead are
        // fenced.
        let spare: Vec<String> = self
            .gateway
            .iter()
            .flat_map(|v| v.peers.iter())
            .flat_map(|p| p.record.clients.iter().cloned())
            .collect();
        let done = report.map(|n| {
            (
                Arc::clone(&self.taken),
                Arc::clone(&self.storage),
                with_images.iter().map(|&g| (g, n)).collect::<Vec<_>>(),
            )
        });
        let spawned = std::thread::Builder::new()
            .name("nvmf-rbd-takeover".into())
            .spawn(move || {
                for (img, fenced) in images {
                    match img.break_foreign_lock_except(&spare) {
                        Ok(owners) if owners.is_empty() => {}
                        Ok(owners) => info!(image = img.name(), ?owners, "took over the image: the previous owner's exclusive lock was broken (it is blocklisted)"),
                        // This gateway was fenced itself (while it stalled, a peer took the
                        // image over): the daemon opens it again on a new connection.
                        Err(e) if e.errno == crate::backend::EBLOCKLISTED => fenced.raise(),
                        Err(e) => warn!(image = img.name(), error = %e, "could not break the previous owner's lock; writes wait for it"),
                    }
                }
                if let Some((taken, storage, groups)) = done {
                    taken.lock().unwrap_or_else(PoisonError::into_inner).extend(groups);
                    storage.changed.raise();
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the RBD takeover thread: serving the groups as they are");
            if report.is_some() {
                return BTreeSet::new();
            }
        }
        with_images
    }

    /// Whether the regular file (or RBD image) behind device slot `slot` is no longer the
    /// length it was opened with (block devices and null devices: never).
    fn file_resized(&self, slot: u32) -> bool {
        let Some(Some(d)) = self.devices.get(slot as usize) else {
            return false;
        };
        if d.kind() == crate::backend::DeviceKind::Rbd {
            return d.fenced().is_raised() || d.rbd_resized();
        }
        if d.kind() != crate::backend::DeviceKind::File {
            return false;
        }
        d.path()
            .and_then(|p| std::fs::metadata(p).ok())
            .is_some_and(|m| m.len() != d.size_bytes())
    }

    /// Send a device slot change to every poller and wait for all of them.
    fn update_pollers(&self, index: u32, device: Option<Arc<Device>>) -> Result<(), String> {
        let (tx, rx) = mpsc::channel();
        let u = DeviceUpdate {
            index,
            device,
            done: tx,
        };
        let mut expected = 0;
        for p in self.pollers.iter() {
            if p.update_device(DeviceUpdate {
                index: u.index,
                device: u.device.clone(),
                done: u.done.clone(),
            }) {
                expected += 1;
            }
        }
        drop(u);
        let deadline = Instant::now() + REGISTER_LIMIT;
        for _ in 0..expected {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err("a poller did not answer in time".into()),
            }
        }
        Ok(())
    }

    /// Stop accepting, close every connection (in-flight backend operations are waited for,
    /// bounded), join the threads.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::Relaxed);
        for p in self.pollers.iter() {
            p.wake();
        }
        // The listeners first (the rdma_cm thread too): no connection is routed to a poller
        // that is stopping.
        for t in self.transports {
            t.shut();
        }
        match Arc::try_unwrap(self.pollers) {
            Ok(mut ps) => ps.iter_mut().for_each(|p| p.join()),
            Err(_) => tracing::warn!("poller handles still shared at shutdown"),
        }
    }
}

/// How the logs name a transport.
fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::Tcp => "NVMe/TCP",
        Transport::Rdma => "NVMe/RDMA",
    }
}

/// The listeners of `transport` in `cfg`.
fn listeners_of(cfg: &Config, transport: Transport) -> Vec<config::Listener> {
    cfg.listeners
        .iter()
        .filter(|l| l.transport == transport)
        .cloned()
        .collect()
}

/// The discovery log's entries for `listeners` (with their bound addresses), port ids from 1
/// in that order.
fn listener_infos<'a>(
    listeners: impl Iterator<Item = &'a (config::Listener, SocketAddr)>,
) -> Vec<ListenerInfo> {
    listeners
        .enumerate()
        .map(|(i, (l, b))| {
            let mut info = listener_info(l.transport, *b, i as u16 + 1, &l.subsystems);
            info.tls = l.tls;
            for (&group, &state) in &l.ana {
                info.set_ana(group, ana_code(state));
            }
            info
        })
        .collect()
}

/// A discovery log entry's listener: `transport` at `addr`, port id `port_id`, serving
/// `subsystems` (`None`: all).
fn listener_info(
    transport: Transport,
    addr: SocketAddr,
    port_id: u16,
    subsystems: &Option<Vec<String>>,
) -> ListenerInfo {
    let trtype = match transport {
        Transport::Tcp => TrType::Tcp,
        Transport::Rdma => TrType::Rdma,
    };
    let mut info = ListenerInfo::new(
        trtype,
        addr.ip().to_string(),
        addr.port().to_string(),
        port_id,
    );
    info.subsystems = subsystems.clone();
    info
}

/// The ANA groups a gateway's leases decide: those of its namespaces and its home groups.
pub fn leased_groups(cfg: &Config) -> BTreeSet<u32> {
    cfg.subsystems
        .iter()
        .flat_map(|s| s.namespaces.iter().map(|n| n.ana_group))
        .chain(
            cfg.gateway
                .iter()
                .flat_map(|g| g.ana_groups.iter().copied()),
        )
        .collect()
}

/// `cfg` with a gateway's ANA states: each leased group optimized on every listener if held
/// (in change while `changing`: its images are being taken over), inaccessible if not
/// (unchanged without a gateway view).
fn overlay(
    view: Option<&crate::gateway::View>,
    changing: &BTreeMap<u32, u64>,
    cfg: &Config,
) -> Config {
    let mut out = cfg.clone();
    let Some(v) = view else { return out };
    for l in &mut out.listeners {
        for &g in &v.leased {
            if v.owned.contains(&g) && changing.contains_key(&g) {
                l.ana.insert(g, config::AnaState::Change);
            } else if v.owned.contains(&g) {
                l.ana.remove(&g);
            } else {
                l.ana.insert(g, config::AnaState::Inaccessible);
            }
        }
    }
    out
}

/// The ANA log's code for a configured state.
fn ana_code(s: config::AnaState) -> u8 {
    use nvme::log::ana_state as code;
    match s {
        config::AnaState::Optimized => code::OPTIMIZED,
        config::AnaState::NonOptimized => code::NON_OPTIMIZED,
        config::AnaState::Inaccessible => code::INACCESSIBLE,
        config::AnaState::PersistentLoss => code::PERSISTENT_LOSS,
        config::AnaState::Change => code::CHANGE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml: &str) -> Config {
        let d = std::env::temp_dir().join(format!("nvmf-plan-{}.yaml", std::process::id()));
        let yaml = format!("listeners: [ {{ transport: tcp, address: 127.0.0.1 }} ]\n{yaml}");
        std::fs::write(&d, yaml).unwrap();
        let c = Config::load(&d).unwrap().config;
        let _ = std::fs::remove_file(&d);
        c
    }

    fn slots(c: &Config) -> NsSlots {
        let mut m = NsSlots::new();
        for s in &c.subsystems {
            for ns in &s.namespaces {
                let i = m.len() as u32;
                m.insert((s.nqn.clone(), ns.nsid), (ns.clone(), i));
            }
        }
        m
    }

    const A: &str = "nqn.2026-11.io.test:a";
    const B: &str = "nqn.2026-11.io.test:b";

    #[test]
    fn namespace_plan_keeps_opens_and_releases() {
        let old = cfg(&format!(
            "subsystems:\n  - nqn: {A}\n    namespaces:\n      - {{ nsid: 1, null: 1MiB }}\n      \
             - {{ nsid: 2, path: /tmp/x.img, size: 1MiB }}\n      - {{ nsid: 3, null: 1MiB }}\n  \
             - nqn: {B}\n    namespaces:\n      - {{ nsid: 1, null: 1MiB }}\n"
        ));
        let running = slots(&old);
        // Same configuration: everything kept.
        let p = plan_namespaces(&running, &old, |_| false);
        assert!(p.open.is_empty() && p.release.is_empty(), "{p:?}");
        assert_eq!(p.keep.len(), 4);
        // A: 1 unchanged, 2 resized (reopened), 3 removed, 4 added; B removed.
        let new = cfg(&format!(
            "subsystems:\n  - nqn: {A}\n    namespaces:\n      - {{ nsid: 1, null: 1MiB }}\n      \
             - {{ nsid: 2, path: /tmp/x.img, size: 2MiB }}\n      - {{ nsid: 4, null: 1MiB }}\n"
        ));
        let p = plan_namespaces(&running, &new, |_| false);
        assert_eq!(p.keep, vec![((A.to_string(), 1), 0)]);
        let open: Vec<(String, u32)> = p.open.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(open, vec![(A.to_string(), 2), (A.to_string(), 4)]);
        let mut rel = p.release.clone();
        rel.sort_unstable();
        assert_eq!(rel, vec![1, 2, 3], "A/2 (changed), A/3 and B/1");
        // A path change and a read-only flip are changes too.
        let new = cfg(&format!(
            "subsystems:\n  - nqn: {A}\n    namespaces:\n      - {{ nsid: 1, null: 1MiB, read_only: true }}\n      \
             - {{ nsid: 2, path: /tmp/y.img, size: 1MiB }}\n      - {{ nsid: 3, null: 1MiB }}\n"
        ));
        let p = plan_namespaces(&running, &new, |_| false);
        let open: Vec<u32> = p.open.iter().map(|(k, _)| k.1).collect();
        assert_eq!(open, vec![1, 2]);
        // Unchanged configuration, but the file behind slot 1 (A/2) was resized.
        let p = plan_namespaces(&running, &old, |slot| slot == 1);
        let open: Vec<(String, u32)> = p.open.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(open, vec![(A.to_string(), 2)]);
        assert_eq!(p.release, vec![1]);
    }

    #[test]
    fn listener_ports_are_numbered_in_order_with_their_transport() {
        let l = |t, p| {
            (
                config::Listener::new(t, [127, 0, 0, 1].into(), p),
                SocketAddr::from(([127, 0, 0, 1], p)),
            )
        };
        // `Daemon::running` lists NVMe/TCP first.
        let infos = listener_infos(
            [
                l(Transport::Tcp, 4420),
                l(Transport::Tcp, 4421),
                l(Transport::Rdma, 4420),
            ]
            .iter(),
        );
        let got: Vec<(TrType, &str, u16)> = infos
            .iter()
            .map(|i| (i.trtype, i.trsvcid.as_str(), i.port_id))
            .collect();
        assert_eq!(
            got,
            vec![
                (TrType::Tcp, "4420", 1),
                (TrType::Tcp, "4421", 2),
                (TrType::Rdma, "4420", 3)
            ]
        );
    }
}
