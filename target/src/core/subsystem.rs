//! Subsystems, namespaces, the controller registry and target-wide lookups.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use nvme::fabrics::{CNTLID_MAX, CNTLID_MIN};
use nvme::DISCOVERY_NQN;

use super::controller::Controller;
use super::controller::Gone;
use super::rangelock::RangeLocks;
use super::reservation::{NsReservation, ResvStore};
use super::stats::{ControllerMetrics, IoTotals, NsTotals, SubsystemMetrics};
use super::{
    HostKeys, HostSpec, ListenerInfo, NamespaceSpec, Reconfigured, SubsystemSpec, Target,
    TargetParams,
};

/// Namespaces of a subsystem at one point in time, by NSID.
#[derive(Debug, Default)]
pub(crate) struct NsTable {
    pub by_nsid: BTreeMap<u32, NamespaceSpec>,
    /// Each namespace's reservations; a namespace that a reconfiguration keeps (same NSID,
    /// same backing store and geometry) keeps its reservation state.
    resv: BTreeMap<u32, Arc<NsReservation>>,
    /// Each NSID's range locks (fused Compare and Write). Every table of a subsystem carries
    /// the locks of every NSID it ever had, whatever the reconfigurations did, so a write
    /// registered under one table is released under any later one.
    locks: BTreeMap<u32, Arc<RangeLocks>>,
}

impl NsTable {
    /// A table from configured namespaces; NSIDs 0 and FFFFFFFFh cannot name a namespace and
    /// are left out (the configuration layer rejects them first). Reservation state is taken
    /// from `old` for namespaces that stay the same.
    fn from_specs(
        specs: Vec<NamespaceSpec>,
        old: Option<&NsTable>,
        subnqn: &str,
        store: Option<&Arc<dyn ResvStore>>,
    ) -> NsTable {
        let mut by_nsid = BTreeMap::new();
        let mut resv = BTreeMap::new();
        let mut locks = old.map(|o| o.locks.clone()).unwrap_or_default();
        for n in specs {
            if n.nsid == 0 || n.nsid == u32::MAX {
                tracing::warn!(nsid = n.nsid, "ignoring a namespace with a reserved NSID");
                continue;
            }
            let kept = old
                .filter(|o| o.get(n.nsid).is_some_and(|o| same_namespace(o, &n)))
                .and_then(|o| o.resv.get(&n.nsid).cloned());
            let r =
                kept.unwrap_or_else(|| Arc::new(NsReservation::with_store(store, subnqn, n.nsid)));
            resv.insert(n.nsid, r);
            locks.entry(n.nsid).or_default();
            by_nsid.insert(n.nsid, n);
        }
        NsTable {
            by_nsid,
            resv,
            locks,
        }
    }

    pub fn get(&self, nsid: u32) -> Option<&NamespaceSpec> {
        self.by_nsid.get(&nsid)
    }

    /// The namespace's reservation state.
    pub fn reservation(&self, nsid: u32) -> Option<&Arc<NsReservation>> {
        self.resv.get(&nsid)
    }
    /// The namespace's range locks (also for an NSID this table no longer has, if an earlier
    /// table of the subsystem had it).
    pub fn locks(&self, nsid: u32) -> Option<&Arc<RangeLocks>> {
        self.locks.get(&nsid)
    }
    /// Highest NSID in use (Identify Controller NN).
    pub fn max_nsid(&self) -> u32 {
        self.by_nsid.keys().next_back().copied().unwrap_or(0)
    }
}

/// Who may connect to a subsystem.
#[derive(Debug)]
struct Access {
    allow_any_host: bool,
    hosts: Vec<HostSpec>,
    policy: nvme::auth::Policy,
}

/// A configured subsystem (or the discovery subsystem).
pub(crate) struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    /// Who may connect; replaced on reconfiguration (read at Connect and by the discovery
    /// log only).
    access: RwLock<Access>,
    pub discovery: bool,
    /// The namespace table; replaced as a whole on reconfiguration.
    ns: RwLock<Arc<NsTable>>,
    /// Bumped after every replacement of `ns` so queues can cache the table lock-free.
    ns_gen: AtomicU64,
    /// I/O statistics of queues that are gone (scrapes add the live ones).
    retired_io: Mutex<IoTotals>,
}

impl Subsystem {
    fn from_spec(spec: SubsystemSpec, store: Option<&Arc<dyn ResvStore>>) -> Subsystem {
        let table = NsTable::from_specs(spec.namespaces, None, &spec.nqn, store);
        Subsystem {
            nqn: spec.nqn,
            serial: spec.serial,
            model: spec.model,
            access: RwLock::new(Access {
                allow_any_host: spec.allow_any_host,
                hosts: spec.hosts,
                policy: spec.auth_policy,
            }),
            discovery: false,
            ns: RwLock::new(Arc::new(table)),
            ns_gen: AtomicU64::new(1),
            retired_io: Mutex::new(IoTotals::default()),
        }
    }

    fn discovery() -> Subsystem {
        Subsystem {
            nqn: DISCOVERY_NQN.to_string(),
            serial: String::new(),
            model: "nvmf-rs discovery".to_string(),
            access: RwLock::new(Access {
                allow_any_host: true,
                hosts: Vec::new(),
                policy: nvme::auth::Policy::default(),
            }),
            discovery: true,
            ns: RwLock::new(Arc::new(NsTable::default())),
            ns_gen: AtomicU64::new(1),
            retired_io: Mutex::new(IoTotals::default()),
        }
    }

    /// Whether `hostnqn` may connect (nvmet `nvmet_host_allowed`: everyone may use discovery).
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        if self.discovery {
            return true;
        }
        let a = self.access.read().unwrap_or_else(PoisonError::into_inner);
        a.allow_any_host || a.hosts.iter().any(|h| h.nqn == hostnqn)
    }

    /// What a host must authenticate with: its secrets and the subsystem's policy; `None` if
    /// it connects without authentication (no keys, or a subsystem open to any host, as nvmet).
    pub fn host_auth(&self, hostnqn: &str) -> Option<(HostKeys, nvme::auth::Policy)> {
        if self.discovery {
            return None;
        }
        let a = self.access.read().unwrap_or_else(PoisonError::into_inner);
        if a.allow_any_host {
            return None;
        }
        a.hosts
            .iter()
            .find(|h| h.nqn == hostnqn)
            .and_then(|h| h.keys.clone())
            .map(|k| (k, a.policy.clone()))
    }

    /// The configured TLS PSK of host `hostnqn` here (whether or not the subsystem is open
    /// to any host: the key is the channel's, not an access rule).
    pub fn host_tls_psk(&self, hostnqn: &str) -> Option<nvme::tls::ConfiguredPsk> {
        if self.discovery {
            return None;
        }
        let a = self.access.read().unwrap_or_else(PoisonError::into_inner);
        a.hosts
            .iter()
            .find(|h| h.nqn == hostnqn)
            .and_then(|h| h.tls_psk.clone())
    }

    /// Replace who may connect and with which secrets; true if it changed. Controllers already
    /// connected stay (as with nvmet, removing a host from a subsystem, or changing its keys,
    /// only affects new connections and new authentication transactions).
    fn set_access(
        &self,
        allow_any_host: bool,
        hosts: &[HostSpec],
        policy: &nvme::auth::Policy,
    ) -> bool {
        let mut a = self.access.write().unwrap_or_else(PoisonError::into_inner);
        if a.allow_any_host == allow_any_host && a.hosts == hosts && a.policy == *policy {
            return false;
        }
        a.allow_any_host = allow_any_host;
        a.hosts = hosts.to_vec();
        a.policy = policy.clone();
        true
    }

    pub fn retire_io(&self, t: &IoTotals) {
        self.retired_io
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(t);
    }

    /// The current namespace table and its generation.
    pub fn namespaces(&self) -> (u64, Arc<NsTable>) {
        let t = self.ns.read().unwrap_or_else(PoisonError::into_inner);
        (self.ns_gen.load(Ordering::Acquire), t.clone())
    }

    pub fn ns_generation(&self) -> u64 {
        self.ns_gen.load(Ordering::Acquire)
    }

    /// Replace the namespace table; returns the NSIDs that were added, removed or changed.
    fn replace_namespaces(
        &self,
        namespaces: Vec<NamespaceSpec>,
        store: Option<&Arc<dyn ResvStore>>,
    ) -> Vec<u32> {
        let mut slot = self.ns.write().unwrap_or_else(PoisonError::into_inner);
        let old = slot.clone();
        let new = NsTable::from_specs(namespaces, Some(&old), &self.nqn, store);
        let mut changed: Vec<u32> = Vec::new();
        for (nsid, n) in &new.by_nsid {
            match old.get(*nsid) {
                Some(o) if same_namespace(o, n) => {}
                _ => changed.push(*nsid),
            }
        }
        changed.extend(old.by_nsid.keys().filter(|k| !new.by_nsid.contains_key(k)));
        changed.sort_unstable();
        *slot = Arc::new(new);
        self.ns_gen.fetch_add(1, Ordering::AcqRel);
        changed
    }
}

fn same_namespace(a: &NamespaceSpec, b: &NamespaceSpec) -> bool {
    a.blocks == b.blocks
        && a.lba_shift == b.lba_shift
        && a.device == b.device
        && a.nguid == b.nguid
        && a.uuid == b.uuid
        && a.ana_group == b.ana_group
}

/// Live controllers by cntlid, shared by every queue of the target.
pub(crate) struct Registry {
    ctrls: HashMap<u16, Arc<Controller>>,
    /// Next cntlid to try: allocation goes round robin so a just-freed cntlid is not handed out
    /// again at once (a late I/O Connect must not find a stranger's controller).
    next: u16,
}

impl Registry {
    fn new(range: &std::ops::RangeInclusive<u16>) -> Registry {
        Registry {
            ctrls: HashMap::new(),
            next: *range.start(),
        }
    }
}

/// How long a removed subsystem's NQN is answered as "not here now, retry" rather than "no
/// such subsystem" (with DNR, after which a Linux 6.12 host deletes its controller).
pub(crate) const GONE_GRACE: std::time::Duration = std::time::Duration::from_secs(120);

/// Target-wide state behind [`Target`].
pub(crate) struct TargetInner {
    pub params: TargetParams,
    /// Replaced as a whole by [`TargetInner::reconfigure`]; read at Connect and by the
    /// discovery log, never on the I/O path.
    listeners: RwLock<Arc<Vec<ListenerInfo>>>,
    /// Other gateways' listeners (a gateway group): listed by the discovery log, never
    /// connected through here.
    remote_listeners: RwLock<Arc<Vec<ListenerInfo>>>,
    subsystems: RwLock<BTreeMap<String, Arc<Subsystem>>>,
    /// Subsystems a reconfiguration removed, and when: a Connect for one of them within
    /// [`GONE_GRACE`] is refused without DNR (it may be coming back: a remove and add by
    /// `ctl`, a gateway between two configurations), so hosts keep retrying.
    gone: Mutex<BTreeMap<String, std::time::Instant>>,
    pub discovery: Arc<Subsystem>,
    pub registry: Mutex<Registry>,
    /// Discovery log generation counter: changes only when what the discovery log reports
    /// changes (subsystems, hosts, listeners), i.e. on a reconfiguration that touches them.
    pub genctr: AtomicU64,
    /// Source of queue identities (to tell a queue from its successor on the same qid).
    pub next_queue_token: AtomicU64,
    /// Bumped whenever a listener's ANA states or a namespace's ANA group may have changed:
    /// queues cache their listener's states and look again when it moves.
    pub ana_gen: AtomicU64,
    /// The ANA log's change count: bumped on every ANA state change.
    pub ana_change_count: AtomicU64,
    /// TLS PSKs generated by secure channel concatenation (`concat`).
    generated_psks: Mutex<super::concat::GeneratedPsks>,
    /// Until when a gateway group's leases let this target serve each ANA group.
    pub leases: Arc<super::LeaseClock>,
}

impl TargetInner {
    pub fn new(
        subsystems: Vec<SubsystemSpec>,
        listeners: Vec<ListenerInfo>,
        params: TargetParams,
    ) -> TargetInner {
        let subsystems = subsystem_map(subsystems, params.resv_store.as_ref());
        let registry = Mutex::new(Registry::new(&params.cntlid_range));
        TargetInner {
            params,
            listeners: RwLock::new(Arc::new(listeners)),
            remote_listeners: RwLock::new(Arc::new(Vec::new())),
            subsystems: RwLock::new(subsystems),
            gone: Mutex::new(BTreeMap::new()),
            discovery: Arc::new(Subsystem::discovery()),
            registry,
            genctr: AtomicU64::new(1),
            next_queue_token: AtomicU64::new(1),
            ana_gen: AtomicU64::new(1),
            ana_change_count: AtomicU64::new(1),
            generated_psks: Mutex::default(),
            leases: Arc::default(),
        }
    }

    /// The generated TLS PSKs (secure channel concatenation).
    pub(crate) fn generated_psks(&self) -> std::sync::MutexGuard<'_, super::concat::GeneratedPsks> {
        self.generated_psks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Live controllers of `subsys` whose host is `hostid` (reservation notifications).
    pub fn host_controllers(
        &self,
        subsys: &Arc<Subsystem>,
        hostid: &[u8; 16],
    ) -> Vec<Arc<Controller>> {
        self.registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ctrls
            .values()
            .filter(|c| Arc::ptr_eq(&c.subsys, subsys) && &c.hostid == hostid)
            .cloned()
            .collect()
    }

    /// Whether subsystem `nqn`, not configured now, was removed less than [`GONE_GRACE`]
    /// before `now`.
    pub fn recently_removed(&self, nqn: &str, now: std::time::Instant) -> bool {
        self.gone
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(nqn)
            .is_some_and(|&at| now.saturating_duration_since(at) < GONE_GRACE)
    }

    /// The TLS PSK that the identity a host offers names (`nvme::tls`): made from the host's
    /// configured key in the subsystem the identity names (for the discovery subsystem, the
    /// key the host has in the subsystems, when they agree). `Err` says why there is none, and
    /// never holds a key.
    pub fn tls_psk(
        &self,
        id: &nvme::tls::PskIdentity,
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
        if id.generated {
            // Made by secure channel concatenation, for a host that authenticates here.
            let s = self
                .find_subsystem(&id.subnqn)
                .ok_or_else(|| format!("no subsystem {}", id.subnqn))?;
            if s.host_auth(&id.hostnqn).is_none() {
                return Err(format!(
                    "host {} has no DH-HMAC-CHAP key in {}: a generated PSK is not taken",
                    id.hostnqn, id.subnqn
                ));
            }
            return self
                .generated_psks()
                .get(id, std::time::Instant::now())
                .ok_or_else(|| {
                    "no such generated PSK here (not generated by this target, replaced, or \
                     older than an hour)"
                        .into()
                });
        }
        let key = if id.subnqn == DISCOVERY_NQN {
            let keys: Vec<nvme::tls::ConfiguredPsk> = self
                .subsystems()
                .values()
                .filter_map(|s| s.host_tls_psk(&id.hostnqn))
                .collect();
            let first = keys
                .first()
                .ok_or_else(|| format!("host {} has no tls_psk", id.hostnqn))?;
            if keys.iter().any(|k| k != first) {
                return Err(format!(
                    "host {} has different TLS PSKs in its subsystems: the discovery \
                     controller cannot tell which to use",
                    id.hostnqn
                ));
            }
            first.clone()
        } else {
            let s = self
                .find_subsystem(&id.subnqn)
                .ok_or_else(|| format!("no subsystem {}", id.subnqn))?;
            s.host_tls_psk(&id.hostnqn)
                .ok_or_else(|| format!("host {} has no tls_psk in {}", id.hostnqn, id.subnqn))?
        };
        if key.hash() != id.hash {
            return Err(format!(
                "the identity is for a {} key, and the host's key is {}",
                id.hash,
                key.hash()
            ));
        }
        let retained = key.retained(&id.hostnqn);
        if !id.digest_matches(&retained) {
            return Err("the identity's PSK digest is not the configured key's".into());
        }
        Ok(id.tls_psk(&retained))
    }

    /// The subsystem (or discovery subsystem) named by `nqn`.
    pub fn find_subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        self.subsystems().get(nqn).cloned()
    }

    fn subsystems(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Subsystem>>> {
        self.subsystems
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Every configured subsystem (not the discovery subsystem), by NQN.
    pub fn subsystem_list(&self) -> Vec<Arc<Subsystem>> {
        self.subsystems().values().cloned().collect()
    }

    /// The listeners the discovery log reports.
    pub fn listeners(&self) -> Arc<Vec<ListenerInfo>> {
        self.listeners
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads the reservation state of every namespace in one of `groups` (ANA groups) again
    /// from the store: what a gateway does before it starts serving the groups.
    pub fn reload_reservations(&self, groups: &std::collections::BTreeSet<u32>) -> usize {
        let mut n = 0;
        for s in self.subsystem_list() {
            let (_, table) = s.namespaces();
            for (nsid, spec) in &table.by_nsid {
                if groups.contains(&spec.ana_group) {
                    if let Some(r) = table.reservation(*nsid) {
                        r.reload();
                        n += 1;
                    }
                }
            }
        }
        n
    }

    /// Writes in flight on the I/O queues of every controller of a subsystem that has a
    /// namespace in one of `groups` (ANA groups): what a gateway waits to drain before it hands
    /// the groups to another.
    pub fn writes_in_flight(&self, groups: &std::collections::BTreeSet<u32>) -> u64 {
        let ctrls: Vec<Arc<Controller>> = self.registry().ctrls.values().cloned().collect();
        ctrls
            .iter()
            .filter(|c| {
                let (_, table) = c.subsys.namespaces();
                table
                    .by_nsid
                    .values()
                    .any(|n| groups.contains(&n.ana_group))
            })
            .flat_map(|c| c.io_counters())
            .map(|q| u64::from(q.writes_in_flight()))
            .sum()
    }

    /// Other gateways' listeners, which the discovery log lists after this target's own.
    pub fn remote_listeners(&self) -> Arc<Vec<ListenerInfo>> {
        self.remote_listeners
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the other gateways' listeners; if the discovery log changes, its generation
    /// moves and discovery controllers that asked get the Discovery Log Page Change event.
    pub fn set_remote_listeners(&self, listeners: Vec<ListenerInfo>) -> bool {
        {
            let mut l = self
                .remote_listeners
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if same_listeners(&l, &listeners) {
                return false;
            }
            *l = Arc::new(listeners);
        }
        self.genctr.fetch_add(1, Ordering::AcqRel);
        let ctrls: Vec<Arc<Controller>> = self.registry().ctrls.values().cloned().collect();
        for c in ctrls.iter().filter(|c| c.is_discovery()) {
            c.discovery_changed();
        }
        true
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Allocate a cntlid and register the controller `make` builds with it. None when all
    /// cntlids are in use.
    pub fn register(&self, make: impl FnOnce(u16) -> Arc<Controller>) -> Option<Arc<Controller>> {
        let (min, max) = (
            *self.params.cntlid_range.start(),
            *self.params.cntlid_range.end(),
        );
        let (min, max) = (min.max(CNTLID_MIN), max.min(CNTLID_MAX));
        if min > max {
            return None;
        }
        let mut reg = self.registry();
        let span = (max - min) as u32 + 1;
        let next = reg.next.clamp(min, max);
        for i in 0..span {
            let id = min + ((next - min) as u32 + i).rem_euclid(span) as u16;
            if let Entry::Vacant(slot) = reg.ctrls.entry(id) {
                let ctrl = make(id);
                slot.insert(ctrl.clone());
                reg.next = if id == max { min } else { id + 1 };
                return Some(ctrl);
            }
        }
        None
    }

    pub fn lookup(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.registry().ctrls.get(&cntlid).cloned()
    }

    /// Remove `ctrl` from the registry (if it is still the one registered under its cntlid).
    pub fn unregister(&self, ctrl: &Arc<Controller>) {
        let mut reg = self.registry();
        if reg
            .ctrls
            .get(&ctrl.cntlid)
            .is_some_and(|c| Arc::ptr_eq(c, ctrl))
        {
            reg.ctrls.remove(&ctrl.cntlid);
            drop(reg);
            tracing::info!(cntlid = ctrl.cntlid, subsys = %ctrl.subsys.nqn, host = %ctrl.hostnqn,
                transport = %ctrl.transport(), peer = %ctrl.peer, reason = %ctrl.gone().reason(),
                "controller disconnected");
        }
    }

    pub fn controller_count(&self) -> usize {
        self.registry().ctrls.len()
    }

    /// Controllers of subsystem `nqn`.
    pub fn controllers_of(&self, nqn: &str) -> Vec<Arc<Controller>> {
        self.registry()
            .ctrls
            .values()
            .filter(|c| c.subsys.nqn == nqn)
            .cloned()
            .collect()
    }

    /// Statistics per subsystem (every configured one), its namespaces (every configured
    /// one, with zeros if unused) and its live controllers.
    pub fn io_metrics(&self) -> Vec<SubsystemMetrics> {
        let ctrls: Vec<Arc<Controller>> = self.registry().ctrls.values().cloned().collect();
        self.subsystem_list()
            .into_iter()
            .map(|s| {
                let mut io = s
                    .retired_io
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                let mut controllers = Vec::new();
                for c in ctrls.iter().filter(|c| Arc::ptr_eq(&c.subsys, &s)) {
                    io.add(&c.io_metrics(false));
                    controllers.push(ControllerMetrics {
                        cntlid: c.cntlid,
                        hostnqn: c.hostnqn.clone(),
                        transport: c.transport(),
                        peer: c.peer.clone(),
                        io: c.io_metrics(true),
                        queues: c.queue_metrics(),
                    });
                }
                controllers.sort_by_key(|c| c.cntlid);
                for nsid in s.namespaces().1.by_nsid.keys() {
                    io.namespaces.entry(*nsid).or_insert_with(NsTotals::default);
                }
                SubsystemMetrics {
                    nqn: s.nqn.clone(),
                    io,
                    controllers,
                }
            })
            .collect()
    }

    /// Replace a subsystem's namespaces and raise Namespace Attribute Changed events on its
    /// controllers for every NSID that changed. False if there is no such subsystem.
    pub fn set_namespaces(&self, nqn: &str, namespaces: Vec<NamespaceSpec>) -> bool {
        let Some(subsys) = self.subsystems().get(nqn).cloned() else {
            return false;
        };
        let changed = subsys.replace_namespaces(namespaces, self.params.resv_store.as_ref());
        for ctrl in self.controllers_of(nqn) {
            for &nsid in &changed {
                ctrl.namespace_changed(nsid);
            }
        }
        true
    }

    /// Raise a Namespace Attribute Changed event for `nsid` on every controller of `nqn`.
    pub fn notify_namespace_changed(&self, nqn: &str, nsid: u32) -> bool {
        if !self.subsystems().contains_key(nqn) {
            return false;
        }
        for ctrl in self.controllers_of(nqn) {
            ctrl.namespace_changed(nsid);
        }
        true
    }
}

impl TargetInner {
    /// Move to a new configuration (a reload): subsystems that are new appear, those no
    /// longer configured go away with their controllers, host lists and listeners are
    /// replaced, and every namespace added, removed or changed (as `same_namespace` judges:
    /// size, block size, backing device, identifiers) is reported to the connected
    /// controllers of its subsystem as a Namespace Attribute Changed event plus a Changed
    /// Namespace List entry. A subsystem whose serial or model changed is replaced as a whole:
    /// Identify data must not change under a connected host.
    pub fn reconfigure(
        &self,
        subsystems: Vec<SubsystemSpec>,
        listeners: Vec<ListenerInfo>,
    ) -> Reconfigured {
        let mut out = Reconfigured::default();
        let mut new_map = BTreeMap::new();
        let mut ns_changes: Vec<(Arc<Subsystem>, Vec<u32>)> = Vec::new();
        let mut removed: Vec<Arc<Subsystem>> = Vec::new();
        {
            let mut map = self
                .subsystems
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let mut wanted = subsystem_specs(subsystems);
            for (nqn, old) in map.iter() {
                match wanted.remove(nqn) {
                    Some(spec) if spec.serial == old.serial && spec.model == old.model => {
                        if old.set_access(spec.allow_any_host, &spec.hosts, &spec.auth_policy) {
                            out.hosts_changed.push(nqn.clone());
                        }
                        let changed = old
                            .replace_namespaces(spec.namespaces, self.params.resv_store.as_ref());
                        if !changed.is_empty() {
                            out.namespaces_changed.push((nqn.clone(), changed.clone()));
                            ns_changes.push((old.clone(), changed));
                        }
                        new_map.insert(nqn.clone(), old.clone());
                    }
                    Some(spec) => {
                        out.subsystems_replaced.push(nqn.clone());
                        removed.push(old.clone());
                        new_map.insert(
                            nqn.clone(),
                            Arc::new(Subsystem::from_spec(spec, self.params.resv_store.as_ref())),
                        );
                    }
                    None => {
                        out.subsystems_removed.push(nqn.clone());
                        removed.push(old.clone());
                    }
                }
            }
            {
                let mut gone = self.gone.lock().unwrap_or_else(PoisonError::into_inner);
                let now = std::time::Instant::now();
                gone.retain(|_, at| now.saturating_duration_since(*at) < GONE_GRACE);
                for nqn in &out.subsystems_removed {
                    gone.insert(nqn.clone(), now);
                }
                for nqn in wanted.keys() {
                    gone.remove(nqn);
                }
            }
            for (nqn, spec) in wanted {
                out.subsystems_added.push(nqn.clone());
                new_map.insert(
                    nqn,
                    Arc::new(Subsystem::from_spec(spec, self.params.resv_store.as_ref())),
                );
            }
            *map = new_map;
        }
        {
            let mut l = self
                .listeners
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            // Listeners whose ANA states changed, and listeners added back (their connected
            // hosts may have had other states): their hosts are told.
            for n in &listeners {
                let before = l.iter().find(|o| o.same_endpoint(n));
                if before.is_none_or(|o| o.ana != n.ana) {
                    out.ana_changed.push(n.clone());
                }
            }
            if !same_listeners(&l, &listeners) {
                out.listeners_changed = true;
            }
            // Always replaced: ANA states and served subsystems are not what discovery sees.
            *l = Arc::new(listeners);
        }
        // Queues look at their listener's ANA states again (a namespace may also have moved to
        // another group).
        self.ana_gen.fetch_add(1, Ordering::AcqRel);
        if !out.ana_changed.is_empty() {
            self.ana_change_count.fetch_add(1, Ordering::AcqRel);
        }
        // Controllers of subsystems that are gone (or replaced) are failed: their queues see
        // it through `poll_event` and the transports close the connections.
        let ctrls: Vec<Arc<Controller>> = self.registry().ctrls.values().cloned().collect();
        for c in &ctrls {
            if removed.iter().any(|s| Arc::ptr_eq(s, &c.subsys)) && c.fail(Gone::Removed) {
                out.controllers_disconnected += 1;
            }
        }
        for l in &out.ana_changed {
            for c in ctrls.iter().filter(|c| c.came_through(l)) {
                c.ana_changed();
            }
        }
        for (subsys, nsids) in &ns_changes {
            for c in ctrls.iter().filter(|c| Arc::ptr_eq(&c.subsys, subsys)) {
                for &nsid in nsids {
                    c.namespace_changed(nsid);
                }
            }
        }
        // What the discovery log reports changed: a new generation, and a Discovery Log
        // Page Change event for the discovery controllers that asked for it.
        if out.discovery_changed() {
            self.genctr.fetch_add(1, Ordering::AcqRel);
            for c in ctrls.iter().filter(|c| c.is_discovery()) {
                c.discovery_changed();
            }
        }
        out
    }
}

/// Subsystems by NQN, leaving out the discovery NQN and duplicates (the configuration layer
/// rejects both first).
fn subsystem_specs(subsystems: Vec<SubsystemSpec>) -> BTreeMap<String, SubsystemSpec> {
    let mut map = BTreeMap::new();
    for s in subsystems {
        if s.nqn == DISCOVERY_NQN {
            tracing::warn!("ignoring a subsystem named like the discovery subsystem");
            continue;
        }
        if map.contains_key(&s.nqn) {
            tracing::warn!(nqn = %s.nqn, "ignoring duplicate subsystem");
            continue;
        }
        map.insert(s.nqn.clone(), s);
    }
    map
}

fn subsystem_map(
    subsystems: Vec<SubsystemSpec>,
    store: Option<&Arc<dyn ResvStore>>,
) -> BTreeMap<String, Arc<Subsystem>> {
    subsystem_specs(subsystems)
        .into_iter()
        .map(|(nqn, s)| (nqn, Arc::new(Subsystem::from_spec(s, store))))
        .collect()
}

/// Whether the discovery log would be the same (endpoints, port ids and what they serve).
fn same_listeners(a: &[ListenerInfo], b: &[ListenerInfo]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.same_endpoint(y) && x.port_id == y.port_id && x.subsystems == y.subsystems
        })
}

impl Target {
    pub(crate) fn inner(&self) -> &TargetInner {
        &self.inner
    }

    /// Until when each ANA group may be served (a gateway's member thread keeps it).
    pub fn leases(&self) -> Arc<super::LeaseClock> {
        Arc::clone(&self.inner.leases)
    }
}
