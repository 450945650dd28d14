//! Gateway groups (`gateway:` in the configuration): several targets in front of the same RBD
//! images act as one set of NVM subsystems. What they share lives in RADOS, in the group's pool:
//!
//! - `nvmf.<group>`: one extended attribute per gateway, `gw.<name>`, its [`Record`] (the
//!   cluster clients it uses, its home ANA groups, its listeners);
//! - `nvmf.<group>.gw.<name>`: the gateway's liveness, an exclusive lock with a duration (the
//!   OSD forgets it when it is not renewed: a dead gateway drops out by itself);
//! - `nvmf.<group>.ana.<g>`: ANA group `g`'s lease, the same kind of lock. Its holder serves
//!   the group optimized; every other gateway reports it inaccessible.
//!
//! - `nvmf.<group>.config`: the group's configuration (its subsystems, as YAML) and its
//!   `version` attribute; every gateway watches it, and the one that changes it sends a notify
//!   (each also reads the version every round, should a notify be lost).
//!
//! One thread per gateway renews its locks every third of the lease and decides, each round,
//! what to do with each group ([`plan`], pure): renew what it holds, give a group back to its
//! home gateway when that one is up again (failback), take its own groups, and take any
//! group whose home gateway is down once the lease has lapsed. What it holds and which peers
//! are alive reach the daemon's thread as a [`View`] (the daemon turns it into ANA states and
//! discovery entries). A gateway that cannot renew a lease in time stops reporting the group
//! optimized before the lease can pass to another gateway: each renewal is bounded (the
//! connection's operation timeout) and a lease whose last renewal is too old is dropped
//! without waiting for the call.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use config::Transport;
use tracing::{info, warn};

/// A listener as the group's other gateways see it (their discovery logs list it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerListener {
    pub transport: Transport,
    pub address: IpAddr,
    pub port: u16,
    /// The subsystems it serves (`None`: all).
    pub subsystems: Option<Vec<String>>,
}

/// What a gateway publishes about itself (`gw.<name>` on the group's object).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// Its cluster connections (`client.<id>`): a gateway taking a group over does not fence
    /// these (a live gateway hands an image's lock over when asked).
    pub clients: Vec<String>,
    /// Its home ANA groups.
    pub home: Vec<u32>,
    pub listeners: Vec<PeerListener>,
}

impl Record {
    /// One item per line: `client NAME`, `home G`, `listen tcp|rdma ADDRESS PORT [NQN,...]`.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        for c in &self.clients {
            s.push_str(&format!("client {c}\n"));
        }
        for g in &self.home {
            s.push_str(&format!("home {g}\n"));
        }
        for l in &self.listeners {
            let t = match l.transport {
                Transport::Tcp => "tcp",
                Transport::Rdma => "rdma",
            };
            s.push_str(&format!("listen {t} {} {}", l.address, l.port));
            if let Some(nqns) = &l.subsystems {
                s.push(' ');
                s.push_str(&nqns.join(","));
            }
            s.push('\n');
        }
        s
    }

    /// The inverse of [`Record::encode`]; lines it does not understand are skipped (a newer
    /// gateway may add some).
    pub fn parse(text: &str) -> Record {
        let mut r = Record::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["client", c] => r.clients.push((*c).to_owned()),
                ["home", g] => r.home.extend(g.parse::<u32>().ok()),
                ["listen", t, a, p, rest @ ..] if rest.len() <= 1 => {
                    let transport = match *t {
                        "tcp" => Transport::Tcp,
                        "rdma" => Transport::Rdma,
                        _ => continue,
                    };
                    let (Ok(address), Ok(port)) = (a.parse(), p.parse()) else {
                        continue;
                    };
                    let subsystems = rest
                        .first()
                        .map(|n| n.split(',').map(str::to_owned).collect());
                    r.listeners.push(PeerListener {
                        transport,
                        address,
                        port,
                        subsystems,
                    });
                }
                _ => {}
            }
        }
        r
    }
}

/// A live gateway of the group other than this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub record: Record,
}

/// What the daemon acts on: the ANA groups this gateway holds, among those it watches, and
/// the live peers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct View {
    pub owned: BTreeSet<u32>,
    /// Every group whose state the leases decide (the others are not the group's business).
    pub leased: BTreeSet<u32>,
    pub peers: Vec<Peer>,
}

/// What to do with one ANA group this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Held: renew it.
    Renew,
    /// Held, but its home gateway is up again and failback is on: give it back.
    Release,
    /// Not held: try to take it (it is this gateway's, or its home gateway is down).
    Take,
    /// Not held and not for this gateway now.
    Wait,
}

/// This round's step for group `g`. `settled`: this gateway has been up for a whole lease
/// (before that it leaves other gateways' groups alone, so that a group starting up together
/// lands on its home gateways).
pub fn plan(
    g: u32,
    held: bool,
    home: &[u32],
    failback: bool,
    settled: bool,
    peers: &[Peer],
) -> Step {
    let mine = home.contains(&g);
    let home_peer_up = peers.iter().any(|p| p.record.home.contains(&g));
    match (held, mine) {
        (true, false) if failback && home_peer_up => Step::Release,
        (true, _) => Step::Renew,
        (false, true) => Step::Take,
        (false, false) if !home_peer_up && settled => Step::Take,
        (false, false) => Step::Wait,
    }
}

const LEASE_LOCK: &str = "lease";
/// The group configuration object's version attribute (decimal, from 1).
const VERSION_ATTR: &str = "version";

/// The object keeping group `group`'s configuration (its subsystems, as YAML).
fn config_obj(group: &str) -> String {
    format!("nvmf.{group}.config")
}

/// Object `oid`'s content and its version attribute, read so that the content is that
/// version's (the version read again after it); `None` when no version is stored.
fn read_versioned(io: &rbd::IoCtx, oid: &str) -> Result<Option<(u64, Vec<u8>)>, String> {
    let version = || -> Result<Option<u64>, String> {
        match io.xattr(oid, VERSION_ATTR).map_err(|e| e.to_string())? {
            None => Ok(None),
            Some(v) => String::from_utf8_lossy(&v)
                .parse()
                .map(Some)
                .map_err(|_| format!("{oid}: a version that is not a number")),
        }
    };
    for _ in 0..5 {
        let Some(v) = version()? else { return Ok(None) };
        let data = io.read_full(oid).map_err(|e| e.to_string())?;
        if version()? == Some(v) {
            return Ok(Some((v, data.unwrap_or_default())));
        }
    }
    Err(format!("{oid}: changing too fast to read"))
}

/// The group configuration's text: a configuration document with the subsystems and a
/// placeholder listener (a valid file of its own; secrets written in it, key files as paths).
pub fn group_text(subsystems: &[config::Subsystem]) -> String {
    let c = config::Config {
        listeners: vec![config::Listener::new(
            Transport::Tcp,
            std::net::Ipv4Addr::LOCALHOST.into(),
            config::DEFAULT_PORT,
        )],
        subsystems: subsystems.to_vec(),
        target: config::TargetSettings::default(),
        metrics: None,
        gateway: None,
    };
    c.to_yaml_with_secrets()
}

/// The subsystems of a group configuration's text, checked as a configuration file is
/// (namespace files and Ceph configuration files must exist here too).
pub fn parse_group_text(text: &str, origin: &str) -> Result<Vec<config::Subsystem>, String> {
    config::Config::from_yaml_str(text, origin)
        .map(|l| l.config.subsystems)
        .map_err(|e| e.to_string().trim().to_owned())
}

/// Why `file`'s subsystems are not the group's: the first difference, as a key path and the
/// two values. `None` when they are the same.
pub fn subsystems_difference(
    file: &[config::Subsystem],
    group: &[config::Subsystem],
) -> Option<String> {
    if file == group {
        return None;
    }
    let value = |s: &[config::Subsystem]| serde_json::to_value(s).unwrap_or_default();
    let (a, b) = (value(file), value(group));
    Some(
        first_difference(&a, &b, "subsystems".into())
            .unwrap_or_else(|| "the DH-HMAC-CHAP secrets of some host differ".into()),
    )
}

fn first_difference(a: &serde_json::Value, b: &serde_json::Value, path: String) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => first_difference(u, v, p),
                    (Some(u), None) => Some(format!("{p}: {u} here, absent in the group's")),
                    (None, Some(v)) => Some(format!("{p}: absent here, {v} in the group's")),
                    (None, None) => None,
                }
            })
        }
        (Value::Array(x), Value::Array(y)) => (0..x.len().max(y.len())).find_map(|i| {
            let p = format!("{path}[{i}]");
            match (x.get(i), y.get(i)) {
                (Some(u), Some(v)) => first_difference(u, v, p),
                (Some(u), None) => Some(format!("{p}: {u} here, absent in the group's")),
                (None, Some(v)) => Some(format!("{p}: absent here, {v} in the group's")),
                (None, None) => None,
            }
        }),
        _ if a == b => None,
        _ => Some(format!("{path}: {a} here, {b} in the group's")),
    }
}
const ALIVE_LOCK: &str = "alive";

struct Shared {
    state: Mutex<SharedState>,
    cv: Condvar,
    wake: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
    /// The member's cluster context and settings, for calls from the daemon's thread.
    io: Mutex<Option<(Arc<rbd::IoCtx>, config::Gateway)>>,
}

impl Shared {
    /// The member's cluster context and settings.
    fn member(&self) -> Option<(Arc<rbd::IoCtx>, config::Gateway)> {
        self.io
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(io, c)| (Arc::clone(io), c.clone()))
    }

    fn wake(&self) {
        if let Some(w) = &*self.wake.lock().unwrap_or_else(PoisonError::into_inner) {
            w();
        }
    }
}

#[derive(Default)]
struct SharedState {
    stop: bool,
    /// Groups to watch (from the configuration: namespaces' groups and the home groups).
    wanted: BTreeSet<u32>,
    listeners: Vec<PeerListener>,
    /// The latest view, not yet taken by the daemon.
    view: Option<View>,
    /// The version of the group's configuration this gateway runs (0: none stored).
    version: u64,
    /// A newer group configuration, not yet taken by the daemon.
    subsystems: Option<Vec<config::Subsystem>>,
    /// A notify came for the group's configuration object: read it now, not at the next round.
    poked: bool,
    /// The groups the daemon serves, as it last said after applying a view and draining what
    /// it gave up ([`Gateway::applied`]).
    applied: Option<BTreeSet<u32>>,
    /// The last view published (for [`Gateway::status_reader`]).
    last: View,
}

/// What `nvmf-target stats` and the metrics endpoint say about a gateway.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    pub group: String,
    pub name: String,
    /// The ANA groups whose lease this gateway holds.
    pub serving: BTreeSet<u32>,
    /// The ANA groups the leases decide.
    pub leased: BTreeSet<u32>,
    /// The live peers' names.
    pub peers: Vec<String>,
    /// The version of the group's configuration running here.
    pub config_version: u64,
}

/// The reservation state of the group's namespaces, in RADOS (`nvmf.<group>.resv.<nqn>.<nsid>`:
/// the state's bytes and a `version` attribute). Only the gateway serving a namespace (the
/// lease holder of its ANA group: the others answer its commands ANA Inaccessible) changes
/// it; it reads the state when it starts serving the group and saves every change with a
/// write guarded by the version it read, so a gateway that lost the group without knowing it
/// yet cannot overwrite what the new server did (its command fails instead). The writes of
/// reservation commands run on a thread of the store's own (`nvmf-resv-save`), so a poller
/// never waits for the cluster.
#[derive(Debug)]
pub struct GroupResvStore {
    objects: Arc<ResvObjects>,
    /// The saving thread's queue (started with the first save).
    saver: Mutex<Option<std::sync::mpsc::Sender<SaveJob>>>,
}

/// A save for the saving thread: (subsystem NQN, NSID, state, where the result goes).
type SaveJob = (String, u32, Option<Vec<u8>>, crate::core::SaveDone);

/// The reservation objects of a group.
#[derive(Debug)]
struct ResvObjects {
    io: Arc<rbd::IoCtx>,
    group: String,
    /// The version each namespace's state was read at (0: none stored; `u64::MAX`: the read
    /// failed, so nothing may be written over what is there).
    versions: Mutex<BTreeMap<(String, u32), u64>>,
}

impl ResvObjects {
    fn obj(&self, subnqn: &str, nsid: u32) -> String {
        format!("nvmf.{}.resv.{subnqn}.{nsid}", self.group)
    }
}

impl crate::core::ResvStore for GroupResvStore {
    fn capable(&self, _subnqn: &str, _nsid: u32) -> bool {
        true
    }

    fn load(&self, subnqn: &str, nsid: u32) -> Option<Vec<u8>> {
        self.objects.load(subnqn, nsid)
    }

    fn save(&self, subnqn: &str, nsid: u32, state: Option<&[u8]>) -> std::io::Result<()> {
        self.objects.save(subnqn, nsid, state)
    }

    fn save_then(
        &self,
        subnqn: &str,
        nsid: u32,
        state: Option<Vec<u8>>,
        done: crate::core::SaveDone,
    ) {
        let mut saver = self.saver.lock().unwrap_or_else(PoisonError::into_inner);
        if saver.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<SaveJob>();
            let objects = Arc::clone(&self.objects);
            let started = std::thread::Builder::new()
                .name("nvmf-resv-save".into())
                .spawn(move || {
                    for (subnqn, nsid, state, done) in rx {
                        done(objects.save(&subnqn, nsid, state.as_deref()));
                    }
                });
            match started {
                Ok(_) => *saver = Some(tx),
                Err(e) => {
                    drop(saver);
                    return done(Err(std::io::Error::other(format!(
                        "cannot start the reservation saving thread: {e}"
                    ))));
                }
            }
        }
        let job = (subnqn.to_owned(), nsid, state, done);
        if let Some(Err(std::sync::mpsc::SendError((_, _, _, done)))) =
            saver.as_ref().map(|tx| tx.send(job))
        {
            // The thread is gone (it does not end while the store lives): fail the command.
            drop(saver);
            done(Err(std::io::Error::other(
                "the reservation saving thread is gone",
            )));
        }
    }

    fn shared(&self) -> bool {
        true
    }
}

impl ResvObjects {
    fn load(&self, subnqn: &str, nsid: u32) -> Option<Vec<u8>> {
        let oid = self.obj(subnqn, nsid);
        let (version, data) = match read_versioned(&self.io, &oid) {
            Ok(Some((v, d))) => (v, (!d.is_empty()).then_some(d)),
            Ok(None) => (0, None),
            Err(e) => {
                tracing::error!(subnqn, nsid, error = %e, "cannot read the group's reservation state: reservation commands fail until it is read");
                (u64::MAX, None)
            }
        };
        self.versions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((subnqn.to_owned(), nsid), version);
        data
    }

    fn save(&self, subnqn: &str, nsid: u32, state: Option<&[u8]>) -> std::io::Result<()> {
        let key = (subnqn.to_owned(), nsid);
        let mut versions = self.versions.lock().unwrap_or_else(PoisonError::into_inner);
        let v = versions.get(&key).copied().unwrap_or(0);
        if v == u64::MAX {
            return Err(std::io::Error::other(
                "the group's reservation state could not be read",
            ));
        }
        let expect = v.to_string();
        let ok = self
            .io
            .write_guarded(
                &self.obj(subnqn, nsid),
                VERSION_ATTR,
                (v > 0).then_some(expect.as_bytes()),
                (v + 1).to_string().as_bytes(),
                state.unwrap_or_default(),
            )
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if !ok {
            versions.insert(key, u64::MAX);
            return Err(std::io::Error::other(
                "the group's reservation state changed under this gateway (another gateway serves the namespace)",
            ));
        }
        versions.insert(key, v + 1);
        Ok(())
    }
}

/// A group member: joined ([`Gateway::join`]), then running ([`Gateway::run`]).
pub struct Gateway {
    shared: Arc<Shared>,
    /// Until `run` moves it to the thread.
    member: Option<Member>,
    thread: Option<JoinHandle<()>>,
}

struct Member {
    cfg: config::Gateway,
    io: Arc<rbd::IoCtx>,
    lease: Duration,
    /// Bound on one call to the cluster (the connection's operation timeouts).
    op_timeout: Duration,
    group_obj: String,
    started: Instant,
    /// Held leases and when each was last renewed (the time the call was made).
    held: BTreeMap<u32, Instant>,
    peers: Vec<Peer>,
    published: Option<View>,
    record: String,
    /// Holds its liveness lock (since start-up).
    joined: bool,
    /// The watch on the group's configuration object (none while the object does not exist
    /// or the watch could not be made; retried every round).
    watch: Option<rbd::ObjectWatch>,
    /// Where the core reads until when each held group may be served (`core::LeaseClock`):
    /// kept in step with `held` before every view goes out.
    leases: Arc<crate::core::LeaseClock>,
}

impl Gateway {
    /// Joins the group of `file` (its `gateway` section) before the daemon starts: connects
    /// to the cluster (bounded: the error names the cluster, pool and group), claims this
    /// gateway's name, and settles the subsystems with the group's configuration: a file
    /// without `subsystems` takes the group's, a file with them seeds a group that has none
    /// and must otherwise match it (the error names the first difference). Returns the
    /// configuration to run.
    pub fn join(file: &config::Config) -> Result<(Gateway, config::Config), String> {
        let Some(cfg) = &file.gateway else {
            return Err("no `gateway` section".into());
        };
        let lease = Duration::from_secs(cfg.lease_secs.into());
        let op_timeout = lease / 4;
        let t = op_timeout.as_secs().max(1).to_string();
        let settings = [
            ("client_mount_timeout", "15"),
            ("rados_osd_op_timeout", t.as_str()),
            ("rados_mon_op_timeout", t.as_str()),
        ];
        let what = format!("gateway group {} (pool {})", cfg.group, cfg.pool);
        let cluster = rbd::Cluster::connect(&cfg.conf, &cfg.user, &settings)
            .map_err(|e| format!("{what}: {e}"))?;
        let io = rbd::IoCtx::open(&cluster, &cfg.pool, &cfg.namespace)
            .map_err(|e| format!("{what}: {e}"))?;
        let mut m = Member {
            group_obj: format!("nvmf.{}", cfg.group),
            cfg: cfg.clone(),
            io,
            lease,
            op_timeout,
            started: Instant::now(),
            held: BTreeMap::new(),
            peers: Vec::new(),
            published: None,
            record: String::new(),
            joined: false,
            watch: None,
            leases: Arc::default(),
        };
        // Liveness first: its errors (no permission on the pool, a name taken by a live
        // gateway) stop the start-up. A gateway restarted after a crash finds its own old
        // lock and waits for it to lapse (a live namesake would keep renewing it).
        let deadline = Instant::now() + lease + lease / 2;
        loop {
            match m.alive() {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline && e.contains("another live gateway") => {
                    std::thread::sleep(lease / 6);
                }
                Err(e) => return Err(format!("{what}: {e}")),
            }
        }
        let (version, run) = m.settle_config(file).map_err(|e| format!("{what}: {e}"))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(SharedState {
                version,
                ..SharedState::default()
            }),
            cv: Condvar::new(),
            wake: Mutex::new(None),
            io: Mutex::new(Some((Arc::clone(&m.io), cfg.clone()))),
        });
        Ok((
            Gateway {
                shared,
                member: Some(m),
                thread: None,
            },
            run,
        ))
    }

    /// Starts the member's thread: leases for the `wanted` ANA groups, `listeners` published
    /// for the peers, the group's configuration watched. `wake` is called (on that thread)
    /// when a new [`View`] or group configuration is ready ([`Gateway::take_view`],
    /// [`Gateway::take_subsystems`]).
    /// `leases` is the core's ([`crate::core::Target::leases`]): the member bounds each
    /// group it holds there by the group's last renewal.
    pub fn run(
        &mut self,
        wanted: BTreeSet<u32>,
        listeners: Vec<PeerListener>,
        leases: Arc<crate::core::LeaseClock>,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> Result<(), String> {
        let Some(mut m) = self.member.take() else {
            return Err("the gateway runs already".into());
        };
        m.leases = leases;
        m.bound_leases();
        {
            let mut s = self.state();
            s.wanted = wanted;
            s.listeners = listeners;
        }
        *self
            .shared
            .wake
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Box::new(wake));
        let sh = Arc::clone(&self.shared);
        let thread = std::thread::Builder::new()
            .name("nvmf-gateway".into())
            .spawn(move || m.run(sh))
            .map_err(|e| format!("cannot start the gateway thread: {e}"))?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Stores `subsystems` as the group's configuration (every gateway applies it within a
    /// round). Refused if the group's configuration changed since this gateway last saw it
    /// (another gateway's change, not applied here yet).
    pub fn store_subsystems(&self, subsystems: &[config::Subsystem]) -> Result<(), String> {
        let (io, cfg) = self.member();
        let obj = config_obj(&cfg.group);
        let mut s = self.state();
        let v = s.version;
        let expect = v.to_string();
        let ok = io
            .write_guarded(
                &obj,
                VERSION_ATTR,
                (v > 0).then_some(expect.as_bytes()),
                (v + 1).to_string().as_bytes(),
                group_text(subsystems).as_bytes(),
            )
            .map_err(|e| e.to_string())?;
        if !ok {
            return Err(format!(
                "the group's configuration changed meanwhile (another gateway); it is applied \
                 here within {} s: try again then",
                cfg.lease_secs / 3 + 1
            ));
        }
        s.version = v + 1;
        drop(s);
        // The other gateways watch the object: tell them now rather than at their next round
        // (they read the version every round too, should a notify be lost). The notify waits
        // for every watcher's acknowledgement, a dead gateway's until its watch times out, so
        // it is sent from a thread of its own.
        let timeout = Duration::from_secs(cfg.lease_secs.into()) / 4;
        let sent = std::thread::Builder::new()
            .name("nvmf-gw-notify".into())
            .spawn(move || match io.notify(&obj, timeout) {
                Ok(true) => {}
                Ok(false) => {
                    info!(object = %obj, "a gateway did not acknowledge the configuration notify in time (it reads the version at its next round)")
                }
                Err(e) => {
                    warn!(error = %e, "cannot notify the group's gateways (they read the version at their next round)")
                }
            });
        if let Err(e) = sent {
            warn!(error = %e, "cannot start the notify thread (the group's gateways read the version at their next round)");
        }
        Ok(())
    }

    /// Where the group's namespaces keep their reservation state.
    pub fn resv_store(&self) -> Arc<GroupResvStore> {
        let (io, cfg) = self.member();
        Arc::new(GroupResvStore {
            objects: Arc::new(ResvObjects {
                io,
                group: cfg.group,
                versions: Mutex::new(BTreeMap::new()),
            }),
            saver: Mutex::new(None),
        })
    }

    /// A reader of this gateway's [`Status`], for other threads (the metrics endpoint).
    pub fn status_reader(&self) -> Arc<dyn Fn() -> Status + Send + Sync> {
        let sh = Arc::clone(&self.shared);
        Arc::new(move || {
            let (group, name) = sh
                .member()
                .map(|(_, c)| (c.group, c.name))
                .unwrap_or_default();
            let s = sh.state.lock().unwrap_or_else(PoisonError::into_inner);
            Status {
                group,
                name,
                serving: s.last.owned.clone(),
                leased: s.last.leased.clone(),
                peers: s.last.peers.iter().map(|p| p.name.clone()).collect(),
                config_version: s.version,
            }
        })
    }

    /// The daemon applied a view: it serves `owned` now, and what it gave up has no write in
    /// flight any more (or the wait for them ended). A failback waits for this before it
    /// gives the lease back.
    pub fn applied(&self, owned: BTreeSet<u32>) {
        self.state().applied = Some(owned);
        self.shared.cv.notify_all();
    }

    /// The group's subsystems, when another gateway changed them since the last call.
    pub fn take_subsystems(&self) -> Option<Vec<config::Subsystem>> {
        self.state().subsystems.take()
    }

    /// The member's cluster context and settings (set at join).
    fn member(&self) -> (Arc<rbd::IoCtx>, config::Gateway) {
        match self.shared.member() {
            Some(m) => m,
            None => unreachable!("set at join"),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SharedState> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The groups to watch and this gateway's listeners changed (a reload).
    pub fn update(&self, wanted: BTreeSet<u32>, listeners: Vec<PeerListener>) {
        let mut s = self.state();
        s.wanted = wanted;
        s.listeners = listeners;
        self.shared.cv.notify_all();
    }

    /// The view published since the last call, if any.
    pub fn take_view(&self) -> Option<View> {
        self.state().view.take()
    }

    /// Gives up every lease and leaves the group (its peers take its groups over at once).
    pub fn stop(mut self) {
        self.state().stop = true;
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(mut m) = self.member.take() {
            m.leave();
        }
    }
}

impl Member {
    /// The group's configuration now, as `(version, text)` (`None`: none stored), read so
    /// that the text is the version's (the version read again after it).
    fn read_group(&self) -> Result<Option<(u64, String)>, String> {
        let obj = config_obj(&self.cfg.group);
        match read_versioned(&self.io, &obj)? {
            None => Ok(None),
            Some((v, data)) => String::from_utf8(data)
                .map(|text| Some((v, text)))
                .map_err(|_| format!("{obj}: not UTF-8")),
        }
    }

    /// Start-up: the configuration to run and the group version it is.
    fn settle_config(&mut self, file: &config::Config) -> Result<(u64, config::Config), String> {
        let obj = config_obj(&self.cfg.group);
        for _ in 0..5 {
            match self.read_group()? {
                None if file.subsystems.is_empty() => {
                    info!(group = %self.cfg.group, "the group has no configuration yet: serving none until a gateway stores one");
                    return Ok((0, file.clone()));
                }
                None => {
                    let text = group_text(&file.subsystems);
                    if self
                        .io
                        .write_guarded(&obj, VERSION_ATTR, None, b"1", text.as_bytes())
                        .map_err(|e| e.to_string())?
                    {
                        info!(group = %self.cfg.group, subsystems = file.subsystems.len(), "seeded the group's configuration from this gateway's file");
                        return Ok((1, file.clone()));
                    }
                    // Another gateway seeded it first: compare with that.
                }
                Some((v, text)) => {
                    let group = parse_group_text(&text, &obj)?;
                    if file.subsystems.is_empty() {
                        info!(group = %self.cfg.group, version = v, subsystems = group.len(), "took the group's configuration");
                        let mut run = file.clone();
                        run.subsystems = group;
                        return Ok((v, run));
                    }
                    if let Some(d) = subsystems_difference(&file.subsystems, &group) {
                        return Err(format!(
                            "this gateway's `subsystems` differ from the group's configuration \
                             ({obj}, version {v}): {d}. Remove `subsystems` from the file to take \
                             the group's, or change the group with `nvmf-target ctl`"
                        ));
                    }
                    return Ok((v, file.clone()));
                }
            }
        }
        Err(format!("{obj}: could not settle the group's configuration"))
    }

    /// Each round, and on a notify (`notified`): a newer group configuration is handed to the
    /// daemon.
    fn poll_config(&mut self, sh: &Shared, notified: bool) {
        let known = sh
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .version;
        let obj = config_obj(&self.cfg.group);
        let newer = match self.io.xattr(&obj, VERSION_ATTR) {
            Ok(Some(v)) => String::from_utf8_lossy(&v)
                .parse::<u64>()
                .is_ok_and(|v| v > known),
            Ok(None) => false,
            Err(e) => {
                warn!(group = %self.cfg.group, error = %e, "cannot read the group's configuration version");
                false
            }
        };
        if !newer {
            return;
        }
        match self.read_group() {
            Ok(Some((v, text))) => match parse_group_text(&text, &obj) {
                Ok(subs) => {
                    {
                        let mut s = sh.state.lock().unwrap_or_else(PoisonError::into_inner);
                        if v <= s.version {
                            return;
                        }
                        s.version = v;
                        s.subsystems = Some(subs);
                    }
                    let via = if notified { "notify" } else { "round" };
                    info!(group = %self.cfg.group, version = v, via = %via, "the group's configuration changed");
                    sh.wake();
                }
                Err(e) => {
                    warn!(group = %self.cfg.group, version = v, "the group's configuration cannot be applied here: {e}");
                    sh.state
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .version = v;
                }
            },
            Ok(None) => {}
            Err(e) => {
                warn!(group = %self.cfg.group, error = %e, "cannot read the group's configuration")
            }
        }
    }

    fn member_obj(&self) -> String {
        format!("nvmf.{}.gw.{}", self.cfg.group, self.cfg.name)
    }

    fn lease_obj(&self, g: u32) -> String {
        format!("nvmf.{}.ana.{g}", self.cfg.group)
    }

    /// Renews this gateway's liveness (taking it at start: a live gateway of the same name
    /// is an error).
    fn alive(&mut self) -> Result<(), String> {
        let first = !self.joined;
        let ok = self
            .io
            .lock_exclusive(
                &self.member_obj(),
                ALIVE_LOCK,
                &self.cfg.name,
                self.lease,
                false,
            )
            .map_err(|e| e.to_string())?;
        if ok {
            self.joined = true;
        }
        if !ok && first {
            return Err(format!(
                "another live gateway is named `{}` in group `{}` (give each its own \
                 `gateway.name`)",
                self.cfg.name, self.cfg.group
            ));
        }
        if !ok {
            warn!(group = %self.cfg.group, name = %self.cfg.name, "this gateway's liveness lock is held by another client (a second gateway of the same name?): the peers do not see this one");
        }
        Ok(())
    }

    fn publish_record(&mut self, listeners: &[PeerListener]) -> Result<(), rbd::Error> {
        let mut clients = crate::backend::rbd_client_names();
        clients.push(self.io.cluster().client_name());
        let rec = Record {
            clients,
            home: self.cfg.ana_groups.clone(),
            listeners: listeners.to_vec(),
        }
        .encode();
        if rec != self.record {
            self.io.set_xattr(
                &self.group_obj,
                &format!("gw.{}", self.cfg.name),
                rec.as_bytes(),
            )?;
            self.record = rec;
        }
        Ok(())
    }

    /// The live peers: every registered gateway but this one whose liveness lock is held.
    fn read_peers(&self) -> Result<Vec<Peer>, rbd::Error> {
        let mut peers = Vec::new();
        for (key, value) in self.io.xattrs(&self.group_obj)? {
            let Some(name) = key.strip_prefix("gw.") else {
                continue;
            };
            if name == self.cfg.name {
                continue;
            }
            let obj = format!("nvmf.{}.gw.{name}", self.cfg.group);
            if self.io.lockers(&obj, ALIVE_LOCK)?.is_empty() {
                continue;
            }
            peers.push(Peer {
                name: name.to_owned(),
                record: Record::parse(&String::from_utf8_lossy(&value)),
            });
        }
        Ok(peers)
    }

    /// Whether a lease renewed at `at` may still be counted on through one more call.
    fn fresh(&self, at: Instant) -> bool {
        at.elapsed() + self.op_timeout < self.lease * 9 / 10
    }

    /// Drops the leases whose renewal is too old to trust; true if any.
    fn drop_stale(&mut self) -> bool {
        let stale: Vec<u32> = self
            .held
            .iter()
            .filter(|&(_, &at)| !self.fresh(at))
            .map(|(&g, _)| g)
            .collect();
        for g in &stale {
            warn!(group = %self.cfg.group, ana_group = g, "lease not renewed in time: reporting the ANA group inaccessible");
            self.held.remove(g);
        }
        !stale.is_empty()
    }

    /// Watches the group's configuration object (when it is not watched yet, or the watch
    /// broke): a notify sets `poked` and wakes the member's thread, which reads the new
    /// configuration at once.
    fn ensure_watch(&mut self, sh: &Arc<Shared>) {
        if self.watch.as_ref().is_some_and(|w| !w.broken()) {
            return;
        }
        // Dropped here, with no lock held (the drop waits for a callback in progress, which
        // takes the state's lock).
        self.watch = None;
        let weak = Arc::downgrade(sh);
        let poke = move || {
            if let Some(sh) = weak.upgrade() {
                sh.state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .poked = true;
                sh.cv.notify_all();
            }
        };
        match self
            .io
            .watch(&config_obj(&self.cfg.group), self.lease, poke)
        {
            Ok(w) => self.watch = Some(w),
            // No configuration stored yet: the version read of each round finds the first.
            Err(e) if e.errno == libc::ENOENT => {}
            Err(e) => {
                warn!(group = %self.cfg.group, error = %e, "cannot watch the group's configuration (changes are read every round)")
            }
        }
    }

    fn run(mut self, sh: Arc<Shared>) {
        let tick = self.lease / 3;
        let mut next = Instant::now();
        loop {
            let (wanted, listeners, poked) = {
                let mut s = sh.state.lock().unwrap_or_else(PoisonError::into_inner);
                if s.stop {
                    break;
                }
                let poked = std::mem::take(&mut s.poked);
                (s.wanted.clone(), s.listeners.clone(), poked)
            };
            if Instant::now() >= next {
                next = Instant::now() + tick;
                self.ensure_watch(&sh);
                self.round(&sh, &wanted, &listeners);
            } else if poked {
                self.poll_config(&sh, true);
            }
            let s = sh.state.lock().unwrap_or_else(PoisonError::into_inner);
            let left = next.saturating_duration_since(Instant::now());
            let (s, _) = sh
                .cv
                .wait_timeout_while(s, left, |s| !s.stop && !s.poked)
                .unwrap_or_else(PoisonError::into_inner);
            if s.stop {
                break;
            }
        }
        self.leave();
    }

    fn round(&mut self, sh: &Shared, wanted: &BTreeSet<u32>, listeners: &[PeerListener]) {
        let group = self.cfg.group.clone();
        // What keeps this gateway's standing first (liveness, then the leases it holds), the
        // reads after: on a slow cluster the renewals are not late behind them.
        if let Err(e) = self.alive() {
            warn!(%group, error = %e, "cannot renew this gateway's liveness");
        }
        let held: Vec<u32> = self
            .held
            .keys()
            .filter(|g| wanted.contains(g))
            .copied()
            .collect();
        for g in held {
            if self.drop_stale() {
                self.publish(sh, wanted);
            }
            if !self.held.contains_key(&g) {
                continue;
            }
            let at = Instant::now();
            match self.io.lock_exclusive(
                &self.lease_obj(g),
                LEASE_LOCK,
                &self.cfg.name,
                self.lease,
                true,
            ) {
                Ok(true) => {
                    self.held.insert(g, at);
                }
                Ok(false) | Err(_) => {
                    warn!(%group, ana_group = g, "lease lost: reporting the ANA group inaccessible");
                    self.held.remove(&g);
                    self.publish(sh, wanted);
                }
            }
        }
        if let Err(e) = self.publish_record(listeners) {
            warn!(%group, error = %e, "cannot publish this gateway's listeners");
        }
        match self.read_peers() {
            Ok(p) => self.peers = p,
            Err(e) => warn!(%group, error = %e, "cannot read the group's gateways"),
        }
        self.poll_config(sh, false);
        let settled = self.started.elapsed() >= self.lease;
        // Groups no longer watched are given back.
        let gone: Vec<u32> = self
            .held
            .keys()
            .filter(|g| !wanted.contains(g))
            .copied()
            .collect();
        for g in gone {
            self.held.remove(&g);
            let _ = self
                .io
                .unlock(&self.lease_obj(g), LEASE_LOCK, &self.cfg.name);
        }
        for &g in wanted {
            if self.drop_stale() {
                self.publish(sh, wanted);
            }
            let held = self.held.contains_key(&g);
            let step = plan(
                g,
                held,
                &self.cfg.ana_groups,
                self.cfg.failback,
                settled,
                &self.peers,
            );
            let obj = self.lease_obj(g);
            let at = Instant::now();
            match step {
                Step::Wait => {}
                Step::Release => {
                    // Inaccessible here and drained first (the daemon says so), then the
                    // lease goes: the home gateway's first command sees every write made here.
                    self.held.remove(&g);
                    self.publish(sh, wanted);
                    let deadline = Instant::now() + self.lease / 3;
                    let mut s = sh.state.lock().unwrap_or_else(PoisonError::into_inner);
                    while s.applied.as_ref().is_none_or(|a| a.contains(&g)) && !s.stop {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            warn!(%group, ana_group = g, "failback: the daemon did not confirm in time; giving the lease back anyway");
                            break;
                        }
                        s = sh
                            .cv
                            .wait_timeout(s, left)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                    drop(s);
                    info!(%group, ana_group = g, "failback: giving the ANA group back to its home gateway");
                    if let Err(e) = self.io.unlock(&obj, LEASE_LOCK, &self.cfg.name) {
                        warn!(%group, ana_group = g, error = %e, "cannot give the lease back (it lapses by itself)");
                    }
                }
                // Renewed at the start of the round.
                Step::Renew => {}
                Step::Take => match self.io.lock_exclusive(
                    &obj,
                    LEASE_LOCK,
                    &self.cfg.name,
                    self.lease,
                    false,
                ) {
                    Ok(true) => {
                        info!(%group, ana_group = g, "took the ANA group's lease: serving it optimized");
                        self.held.insert(g, at);
                    }
                    Ok(false) => {}
                    Err(e) => {
                        warn!(%group, ana_group = g, error = %e, "cannot take the lease")
                    }
                },
            }
        }
        self.drop_stale();
        self.publish(sh, wanted);
    }

    /// The core's bound of every ANA group from `held`: a held group until its last renewal
    /// stops being trustworthy (as `fresh` counts it), any other not at all.
    fn bound_leases(&self) {
        for g in 1..=crate::core::ANA_GROUPS {
            let until = self.held.get(&g).map(|&at| at + self.lease * 9 / 10);
            self.leases.hold_until(g, until);
        }
    }

    /// Hands the daemon a new view if it differs from the last one (the core's lease bounds
    /// are brought in step with the held leases first, also when the view is the same).
    fn publish(&mut self, sh: &Shared, wanted: &BTreeSet<u32>) {
        self.bound_leases();
        let view = View {
            owned: self.held.keys().copied().collect(),
            leased: wanted.clone(),
            peers: self.peers.clone(),
        };
        if self.published.as_ref() == Some(&view) {
            return;
        }
        self.published = Some(view.clone());
        {
            let mut s = sh.state.lock().unwrap_or_else(PoisonError::into_inner);
            s.last = view.clone();
            s.view = Some(view);
        }
        sh.wake();
    }

    /// Leaving: every lease and the liveness lock are given back and the record removed, so
    /// the peers need not wait for them to lapse.
    fn leave(&mut self) {
        let held = std::mem::take(&mut self.held);
        self.bound_leases();
        for g in held.into_keys() {
            let _ = self
                .io
                .unlock(&self.lease_obj(g), LEASE_LOCK, &self.cfg.name);
        }
        let _ = self
            .io
            .remove_xattr(&self.group_obj, &format!("gw.{}", self.cfg.name));
        let _ = self
            .io
            .unlock(&self.member_obj(), ALIVE_LOCK, &self.cfg.name);
        info!(group = %self.cfg.group, name = %self.cfg.name, "left the gateway group");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str, home: &[u32]) -> Peer {
        Peer {
            name: name.into(),
            record: Record {
                home: home.to_vec(),
                ..Record::default()
            },
        }
    }

    #[test]
    fn records_round_trip_and_skip_what_they_do_not_know() {
        let r = Record {
            clients: vec!["client.4123".into(), "client.4124".into()],
            home: vec![1, 3],
            listeners: vec![
                PeerListener {
                    transport: Transport::Tcp,
                    address: "127.0.0.2".parse().unwrap(),
                    port: 4420,
                    subsystems: None,
                },
                PeerListener {
                    transport: Transport::Rdma,
                    address: "fe80::1".parse().unwrap(),
                    port: 4421,
                    subsystems: Some(vec!["nqn.a:x".into(), "nqn.a:y".into()]),
                },
            ],
        };
        let text = r.encode();
        assert_eq!(Record::parse(&text), r);
        let extra = format!("{text}future thing 1 2\nlisten fc a b\nhome x\n");
        assert_eq!(Record::parse(&extra), r);
    }

    fn subsystems(serial: &str, null: &str) -> Vec<config::Subsystem> {
        let text = format!(
            "listeners: [ {{ transport: tcp, address: 127.0.0.1 }} ]\n\
             subsystems:\n  - nqn: nqn.2026-11.io.example:a\n    serial: {serial}\n    \
             hosts: [ {{ nqn: nqn.2026-11.io.example:h, dhchap_key: \"DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:\" }} ]\n    \
             namespaces: [ {{ nsid: 1, null: {null} }} ]\n"
        );
        config::Config::from_yaml_str(&text, "t.yaml")
            .unwrap()
            .config
            .subsystems
    }

    #[test]
    fn the_group_configuration_round_trips_with_its_secrets() {
        let subs = subsystems("S1", "1GiB");
        let text = group_text(&subs);
        assert!(text.contains("DHHC-1:00:"), "{text}");
        assert_eq!(parse_group_text(&text, "nvmf.g.config").unwrap(), subs);
        assert!(parse_group_text("subsystems: [", "nvmf.g.config").is_err());
    }

    #[test]
    fn a_difference_from_the_group_is_named_by_its_key_path() {
        let (a, b) = (subsystems("S1", "1GiB"), subsystems("S2", "1GiB"));
        assert_eq!(subsystems_difference(&a, &a), None);
        assert_eq!(
            subsystems_difference(&a, &b).unwrap(),
            "subsystems[0].serial: \"S1\" here, \"S2\" in the group's"
        );
        let c = subsystems("S1", "2GiB");
        assert!(
            subsystems_difference(&a, &c)
                .unwrap()
                .starts_with("subsystems[0].namespaces[0].null:"),
            "{:?}",
            subsystems_difference(&a, &c)
        );
        assert_eq!(
            subsystems_difference(&a, &[]).unwrap(),
            format!(
                "subsystems[0]: {} here, absent in the group's",
                serde_json::to_value(&a[0]).unwrap()
            )
        );
    }

    #[test]
    fn a_gateway_takes_its_own_groups_and_others_only_when_their_home_is_down() {
        let none: &[Peer] = &[];
        // Its own group: taken at once, renewed while held.
        assert_eq!(plan(1, false, &[1], true, false, none), Step::Take);
        assert_eq!(plan(1, true, &[1], true, false, none), Step::Renew);
        // Another's group whose home gateway is up: left to it.
        let up = [peer("b", &[2])];
        assert_eq!(plan(2, false, &[1], true, true, &up), Step::Wait);
        // Its home gateway is down: taken, but not before this gateway has settled.
        assert_eq!(plan(2, false, &[1], true, false, none), Step::Wait);
        assert_eq!(plan(2, false, &[1], true, true, none), Step::Take);
        // Held while its home gateway came back: given back with failback, kept without.
        assert_eq!(plan(2, true, &[1], true, true, &up), Step::Release);
        assert_eq!(plan(2, true, &[1], false, true, &up), Step::Renew);
        // A group nobody calls home: whoever settled first.
        assert_eq!(plan(5, false, &[], true, true, &up), Step::Take);
        assert_eq!(plan(5, true, &[], true, true, &up), Step::Renew);
    }
}
