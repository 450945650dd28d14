//! Subsystems, namespaces, the controller registry and target-wide lookups.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use nvme::fabrics::{CNTLID_MAX, CNTLID_MIN};
use nvme::DISCOVERY_NQN;

use super::controller::Controller;
use super::{ListenerInfo, NamespaceSpec, SubsystemSpec, Target, TargetParams};

/// Namespaces of a subsystem at one point in time, by NSID.
#[derive(Debug, Default)]
pub(crate) struct NsTable {
    pub by_nsid: BTreeMap<u32, NamespaceSpec>,
}

impl NsTable {
    /// A table from configured namespaces; NSIDs 0 and FFFFFFFFh cannot name a namespace and
    /// are left out (the configuration layer rejects them first).
    fn from_specs(specs: Vec<NamespaceSpec>) -> NsTable {
        let mut by_nsid = BTreeMap::new();
        for n in specs {
            if n.nsid == 0 || n.nsid == u32::MAX {
                tracing::warn!(nsid = n.nsid, "ignoring a namespace with a reserved NSID");
                continue;
            }
            by_nsid.insert(n.nsid, n);
        }
        NsTable { by_nsid }
    }

    pub fn get(&self, nsid: u32) -> Option<&NamespaceSpec> {
        self.by_nsid.get(&nsid)
    }
    /// Highest NSID in use (Identify Controller NN).
    pub fn max_nsid(&self) -> u32 {
        self.by_nsid.keys().next_back().copied().unwrap_or(0)
    }
}

/// A configured subsystem (or the discovery subsystem).
pub(crate) struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    pub discovery: bool,
    /// The namespace table; replaced as a whole on reconfiguration.
    ns: RwLock<Arc<NsTable>>,
    /// Bumped after every replacement of `ns` so queues can cache the table lock-free.
    ns_gen: AtomicU64,
}

impl Subsystem {
    fn from_spec(spec: SubsystemSpec) -> Subsystem {
        let table = NsTable::from_specs(spec.namespaces);
        Subsystem {
            nqn: spec.nqn,
            serial: spec.serial,
            model: spec.model,
            allow_any_host: spec.allow_any_host,
            hosts: spec.hosts,
            discovery: false,
            ns: RwLock::new(Arc::new(table)),
            ns_gen: AtomicU64::new(1),
        }
    }

    fn discovery() -> Subsystem {
        Subsystem {
            nqn: DISCOVERY_NQN.to_string(),
            serial: String::new(),
            model: "nvmf-rs discovery".to_string(),
            allow_any_host: true,
            hosts: Vec::new(),
            discovery: true,
            ns: RwLock::new(Arc::new(NsTable::default())),
            ns_gen: AtomicU64::new(1),
        }
    }

    /// Whether `hostnqn` may connect (nvmet `nvmet_host_allowed`: everyone may use discovery).
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.discovery || self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
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
    fn replace_namespaces(&self, namespaces: Vec<NamespaceSpec>) -> Vec<u32> {
        let new = NsTable {
            by_nsid: namespaces.into_iter().map(|n| (n.nsid, n)).collect(),
        };
        let mut slot = self.ns.write().unwrap_or_else(PoisonError::into_inner);
        let old = slot.clone();
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
}

/// Live controllers by cntlid, shared by every queue of the target.
pub(crate) struct Registry {
    ctrls: HashMap<u16, Arc<Controller>>,
    /// Next cntlid to try: allocation goes round robin so a just-freed cntlid is not handed out
    /// again at once (a late I/O Connect must not find a stranger's controller).
    next: u16,
}

impl Registry {
    fn new() -> Registry {
        Registry {
            ctrls: HashMap::new(),
            next: CNTLID_MIN,
        }
    }
}

/// Target-wide state behind [`Target`].
pub(crate) struct TargetInner {
    pub params: TargetParams,
    pub listeners: Vec<ListenerInfo>,
    pub subsystems: BTreeMap<String, Arc<Subsystem>>,
    pub discovery: Arc<Subsystem>,
    pub registry: Mutex<Registry>,
    /// Discovery log generation counter: changes only when what the discovery log reports
    /// changes (subsystems, hosts, listeners). The configuration is fixed for a Target's life,
    /// so it is constant today; reconfiguration must bump it.
    pub genctr: AtomicU64,
    /// Source of queue identities (to tell a queue from its successor on the same qid).
    pub next_queue_token: AtomicU64,
}

impl TargetInner {
    pub fn new(
        subsystems: Vec<SubsystemSpec>,
        listeners: Vec<ListenerInfo>,
        params: TargetParams,
    ) -> TargetInner {
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
            map.insert(s.nqn.clone(), Arc::new(Subsystem::from_spec(s)));
        }
        TargetInner {
            params,
            listeners,
            subsystems: map,
            discovery: Arc::new(Subsystem::discovery()),
            registry: Mutex::new(Registry::new()),
            genctr: AtomicU64::new(1),
            next_queue_token: AtomicU64::new(1),
        }
    }

    /// The subsystem (or discovery subsystem) named by `nqn`.
    pub fn find_subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        self.subsystems.get(nqn).cloned()
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Allocate a cntlid and register the controller `make` builds with it. None when all
    /// cntlids are in use.
    pub fn register(&self, make: impl FnOnce(u16) -> Arc<Controller>) -> Option<Arc<Controller>> {
        let mut reg = self.registry();
        let span = (CNTLID_MAX - CNTLID_MIN) as u32 + 1;
        for i in 0..span {
            let id = CNTLID_MIN + ((reg.next - CNTLID_MIN) as u32 + i).rem_euclid(span) as u16;
            if let Entry::Vacant(slot) = reg.ctrls.entry(id) {
                let ctrl = make(id);
                slot.insert(ctrl.clone());
                reg.next = if id == CNTLID_MAX { CNTLID_MIN } else { id + 1 };
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

    /// Replace a subsystem's namespaces and raise Namespace Attribute Changed events on its
    /// controllers for every NSID that changed. False if there is no such subsystem.
    pub fn set_namespaces(&self, nqn: &str, namespaces: Vec<NamespaceSpec>) -> bool {
        let Some(subsys) = self.subsystems.get(nqn) else {
            return false;
        };
        let changed = subsys.replace_namespaces(namespaces);
        for ctrl in self.controllers_of(nqn) {
            for &nsid in &changed {
                ctrl.namespace_changed(nsid);
            }
        }
        true
    }

    /// Raise a Namespace Attribute Changed event for `nsid` on every controller of `nqn`.
    pub fn notify_namespace_changed(&self, nqn: &str, nsid: u32) -> bool {
        if !self.subsystems.contains_key(nqn) {
            return false;
        }
        for ctrl in self.controllers_of(nqn) {
            ctrl.namespace_changed(nsid);
        }
        true
    }
}

impl Target {
    pub(crate) fn inner(&self) -> &TargetInner {
        &self.inner
    }
}
