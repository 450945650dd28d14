//! Persistent reservations of one namespace (NVMe Base 2.0, 8.19): registrants by host
//! identifier, the reservation and its holder, the access rules every I/O command is checked
//! against, and the Register/Acquire/Release/Report commands. Pure state: no I/O, no clock.
//!
//! Registrations belong to hosts, not controllers: every controller of a host (same Host
//! Identifier from Connect) shares its registration, as the spec and nvmet have it.
//!
//! Persist Through Power Loss: where the daemon can store the state ([`ResvStore`]: next to a
//! file namespace), a host may turn PTPL on (Register with CPTPL); from then on every change is
//! handed to the store as bytes ([`ResvState::encode`]) before the command completes, and a
//! namespace created at start-up or by a reload starts from what the store kept. A change
//! counts once it is saved: until then the I/O path checks the state before it, the command
//! waits ([`Change::Saving`]: a store such as a gateway group's saves on a thread of its own, so
//! the poller never waits for the cluster) and the namespace's next reservation command waits
//! behind it ([`Change::Busy`]).
//!
//! A command that preempts a registration, releases a registrants-only or all-registrants
//! reservation, or preempts/clears a reservation names the hosts to notify; the queue hands
//! each notice to every controller of that host (Reservation Notification log 80h, its event,
//! the mask feature 82h: `controller.rs`).
//!
//! Preempt and Abort fences the preempted hosts (`io.rs`, `Fence`): it completes once their I/O
//! queues have no write admitted before it still in flight; their later writes are refused at
//! parse. Nothing is cancelled: the wait is for those writes to finish.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use nvme::resv::{
    notice, AcquireAction, AcquireCmd, ChangePtpl, RegisterAction, RegisterCmd, ReleaseAction,
    ReleaseCmd, Report, ResvType,
};
use nvme::Status;

/// A host's 128-bit Host Identifier (Connect HOSTID).
pub type HostId = [u8; 16];

/// What a command that failed a reservation rule gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResvError {
    /// Reservation Conflict.
    Conflict,
    /// Invalid Field in Command (a type or action the rules do not allow here).
    InvalidField,
}

impl ResvError {
    pub fn status(self) -> Status {
        match self {
            ResvError::Conflict => Status::RESERVATION_CONFLICT,
            ResvError::InvalidField => Status::INVALID_FIELD,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registrant {
    host: HostId,
    key: u64,
}

/// The reservation, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    rtype: ResvType,
    /// The holder; for the all-registrants types every registrant holds it and this is the
    /// host that acquired it.
    holder: HostId,
}

/// One namespace's reservation state.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResvState {
    gen: u32,
    registrants: Vec<Registrant>,
    held: Option<Held>,
    ptpl: bool,
    /// Reservation notifications the last command raised: (host, `nvme::resv::notice` type),
    /// for every controller of that host. Taken by [`NsReservation::command`]; not state.
    notices: Vec<(HostId, u8)>,
}

/// Whether a command reads or writes (the two groups of the spec's "Command Behavior in the
/// Presence of a Reservation"; Flush and Dataset Management count as writes, as in nvmet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl ResvState {
    fn key_of(&self, host: &HostId) -> Option<u64> {
        self.registrants
            .iter()
            .find(|r| &r.host == host)
            .map(|r| r.key)
    }

    fn holds(&self, host: &HostId) -> bool {
        match self.held {
            None => false,
            Some(h) if h.rtype.all_registrants() => self.key_of(host).is_some(),
            Some(h) => &h.holder == host,
        }
    }

    /// The reservation's type, if one is held.
    pub fn rtype(&self) -> Option<ResvType> {
        self.held.map(|h| h.rtype)
    }

    /// May `host` run a command of this kind? The spec's access table: the holder may do
    /// anything; registrants may too under types 3 to 6; everyone else may read under the
    /// Write Exclusive types and nothing more.
    pub fn check(&self, host: &HostId, access: Access) -> Result<(), ResvError> {
        let Some(h) = self.held else { return Ok(()) };
        if self.holds(host) {
            return Ok(());
        }
        if h.rtype.registrants_have_access() && self.key_of(host).is_some() {
            return Ok(());
        }
        if access == Access::Read && h.rtype.others_may_read() {
            return Ok(());
        }
        Err(ResvError::Conflict)
    }

    /// The host's key must be `crkey` (or it may be ignored); it must be registered.
    fn check_key(&self, host: &HostId, crkey: u64, ignore: bool) -> Result<(), ResvError> {
        match self.key_of(host) {
            Some(k) if ignore || k == crkey => Ok(()),
            _ => Err(ResvError::Conflict),
        }
    }

    /// Tells every registrant but `except` of a `kind` notification.
    fn notify_registrants(&mut self, except: &HostId, kind: u8) {
        for r in &self.registrants {
            if &r.host != except {
                self.notices.push((r.host, kind));
            }
        }
    }

    /// Drops `host`'s registration; a reservation it alone held goes with it (for the
    /// all-registrants types, with the last registrant).
    fn unregister(&mut self, host: &HostId) {
        self.registrants.retain(|r| &r.host != host);
        if let Some(h) = self.held {
            let gone = if h.rtype.all_registrants() {
                self.registrants.is_empty()
            } else {
                &h.holder == host
            };
            if gone {
                self.held = None;
            }
        }
    }

    /// Reservation Register. `ptpl_capable`: whether the namespace can persist the state.
    pub fn register(
        &mut self,
        host: &HostId,
        c: &RegisterCmd,
        ptpl_capable: bool,
    ) -> Result<(), ResvError> {
        if c.ptpl != ChangePtpl::NoChange && !ptpl_capable {
            return Err(ResvError::InvalidField);
        }
        match c.action {
            RegisterAction::Register => match self.key_of(host) {
                // Registering again with the same key changes nothing and succeeds.
                Some(k) if k == c.nrkey => {}
                Some(_) => return Err(ResvError::Conflict),
                None => {
                    self.registrants.push(Registrant {
                        host: *host,
                        key: c.nrkey,
                    });
                    self.gen = self.gen.wrapping_add(1);
                }
            },
            RegisterAction::Unregister => {
                self.check_key(host, c.crkey, c.ignore_key)?;
                let was = self.held;
                self.unregister(host);
                // A registrants-only or all-registrants reservation that went with the holder
                // is released for the registrants left.
                if let (Some(h), None) = (was, self.held) {
                    if h.rtype.registrants_have_access() {
                        self.notify_registrants(host, notice::RESERVATION_RELEASED);
                    }
                }
                self.gen = self.gen.wrapping_add(1);
            }
            RegisterAction::Replace => {
                match self.registrants.iter_mut().find(|r| &r.host == host) {
                    Some(r) if c.ignore_key || r.key == c.crkey => r.key = c.nrkey,
                    Some(_) => return Err(ResvError::Conflict),
                    // Not registered: with IEKEY, replacing "any" key registers the new one.
                    None if c.ignore_key => self.registrants.push(Registrant {
                        host: *host,
                        key: c.nrkey,
                    }),
                    None => return Err(ResvError::Conflict),
                }
                self.gen = self.gen.wrapping_add(1);
            }
        }
        match c.ptpl {
            ChangePtpl::NoChange => {}
            ChangePtpl::Clear => self.ptpl = false,
            ChangePtpl::Set => self.ptpl = true,
        }
        Ok(())
    }

    /// Reservation Acquire (acquire, preempt, preempt and abort).
    pub fn acquire(&mut self, host: &HostId, c: &AcquireCmd) -> Result<(), ResvError> {
        // IEKEY is reserved in Acquire since NVMe 1.3 (RESCAP bit 7): nvmet and SPDK refuse it.
        if c.ignore_key {
            return Err(ResvError::InvalidField);
        }
        self.check_key(host, c.crkey, false)?;
        match c.action {
            AcquireAction::Acquire => match self.held {
                None => {
                    self.held = Some(Held {
                        rtype: c.rtype,
                        holder: *host,
                    });
                    Ok(())
                }
                Some(h) if h.rtype == c.rtype && self.holds(host) => Ok(()),
                Some(_) => Err(ResvError::Conflict),
            },
            AcquireAction::Preempt | AcquireAction::PreemptAndAbort => self.preempt(host, c),
        }
    }

    fn preempt(&mut self, host: &HostId, c: &AcquireCmd) -> Result<(), ResvError> {
        // Unregisters every other registrant whose key is `key` (each is told its registration
        // was preempted); false if there was none.
        let drop_key = |s: &mut ResvState, key: u64| {
            let victims: Vec<HostId> = s
                .registrants
                .iter()
                .filter(|r| r.key == key && &r.host != host)
                .map(|r| r.host)
                .collect();
            for v in &victims {
                s.unregister(v);
                s.notices.push((*v, notice::REGISTRATION_PREEMPTED));
            }
            !victims.is_empty()
        };
        let before = self.held;
        self.preempt_inner(host, c, drop_key)?;
        if self.held.is_some() && self.held != before {
            // The reservation changed hands or type: the registrants still there hear of it.
            self.notify_registrants(host, notice::RESERVATION_PREEMPTED);
        }
        self.gen = self.gen.wrapping_add(1);
        Ok(())
    }

    fn preempt_inner(
        &mut self,
        host: &HostId,
        c: &AcquireCmd,
        drop_key: impl Fn(&mut ResvState, u64) -> bool,
    ) -> Result<(), ResvError> {
        match self.held {
            Some(h) if h.rtype.all_registrants() => {
                if c.prkey == 0 {
                    // Every other registrant goes; the preempting host holds a new reservation.
                    for r in &self.registrants {
                        if &r.host != host {
                            self.notices.push((r.host, notice::REGISTRATION_PREEMPTED));
                        }
                    }
                    self.registrants.retain(|r| &r.host == host);
                    self.held = Some(Held {
                        rtype: c.rtype,
                        holder: *host,
                    });
                } else if !drop_key(self, c.prkey) {
                    return Err(ResvError::Conflict);
                }
            }
            Some(h) => {
                let holder_key = self.key_of(&h.holder);
                if holder_key == Some(c.prkey) {
                    // The holder is preempted: its registration (and every other with that
                    // key) goes, and the preempting host holds the reservation, of the type
                    // it asks for.
                    drop_key(self, c.prkey);
                    self.held = Some(Held {
                        rtype: c.rtype,
                        holder: *host,
                    });
                } else if c.prkey == 0 {
                    return Err(ResvError::InvalidField);
                } else if !drop_key(self, c.prkey) {
                    return Err(ResvError::Conflict);
                }
            }
            None => {
                if c.prkey == 0 {
                    return Err(ResvError::InvalidField);
                }
                if !drop_key(self, c.prkey) {
                    return Err(ResvError::Conflict);
                }
            }
        }
        Ok(())
    }

    /// Reservation Release (release, clear).
    pub fn release(&mut self, host: &HostId, c: &ReleaseCmd) -> Result<(), ResvError> {
        if c.ignore_key {
            return Err(ResvError::InvalidField);
        }
        self.check_key(host, c.crkey, false)?;
        match c.action {
            ReleaseAction::Release => {
                let Some(h) = self.held else { return Ok(()) };
                if !self.holds(host) {
                    // Releasing a reservation one does not hold succeeds and changes nothing.
                    return Ok(());
                }
                if h.rtype as u8 != c.rtype {
                    return Err(ResvError::InvalidField);
                }
                self.held = None;
                if h.rtype.registrants_have_access() {
                    self.notify_registrants(host, notice::RESERVATION_RELEASED);
                }
            }
            ReleaseAction::Clear => {
                self.notify_registrants(host, notice::RESERVATION_PREEMPTED);
                self.held = None;
                self.registrants.clear();
                self.gen = self.gen.wrapping_add(1);
            }
        }
        Ok(())
    }

    /// The Reservation Report contents.
    pub fn report(&self) -> Report {
        Report {
            gen: self.gen,
            rtype: self.rtype(),
            ptpl: self.ptpl,
            regctl: u16::try_from(self.registrants.len()).unwrap_or(u16::MAX),
            registrants: self
                .registrants
                .iter()
                .map(|r| (r.host, r.key, self.holds(&r.host)))
                .collect(),
        }
    }
}

const MAGIC: &[u8; 8] = b"NVMFRSV1";

impl ResvState {
    /// Set Features Reservation Persistence: turns PTPL on or off (Invalid Field where the
    /// namespace cannot persist).
    pub fn set_ptpl(&mut self, on: bool, capable: bool) -> Result<(), ResvError> {
        if !capable {
            return Err(ResvError::InvalidField);
        }
        self.ptpl = on;
        Ok(())
    }

    /// The state as bytes for a [`ResvStore`]: magic, generation, PTPL, the reservation (type
    /// 0 for none, holder), then each registrant's host identifier and key; little endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(48 + 24 * self.registrants.len());
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&self.gen.to_le_bytes());
        v.push(u8::from(self.ptpl));
        match self.held {
            Some(h) => {
                v.push(h.rtype as u8);
                v.extend_from_slice(&h.holder);
            }
            None => {
                v.push(0);
                v.extend_from_slice(&[0; 16]);
            }
        }
        v.extend_from_slice(&(self.registrants.len() as u32).to_le_bytes());
        for r in &self.registrants {
            v.extend_from_slice(&r.host);
            v.extend_from_slice(&r.key.to_le_bytes());
        }
        v
    }

    /// The state [`ResvState::encode`] wrote; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<ResvState> {
        let rest = b.strip_prefix(MAGIC)?;
        let (gen, rest) = rest.split_first_chunk::<4>()?;
        let (&[ptpl, rtype], rest) = rest.split_first_chunk::<2>()?;
        let (holder, rest) = rest.split_first_chunk::<16>()?;
        let (n, mut rest) = rest.split_first_chunk::<4>()?;
        let n = u32::from_le_bytes(*n) as usize;
        if rest.len() != n.checked_mul(24)? || ptpl > 1 {
            return None;
        }
        let mut registrants = Vec::with_capacity(n);
        for _ in 0..n {
            let (host, r) = rest.split_first_chunk::<16>()?;
            let (key, r) = r.split_first_chunk::<8>()?;
            registrants.push(Registrant {
                host: *host,
                key: u64::from_le_bytes(*key),
            });
            rest = r;
        }
        let held = match rtype {
            0 => None,
            t => Some(Held {
                rtype: ResvType::from_u8(t)?,
                holder: *holder,
            }),
        };
        Some(ResvState {
            gen: u32::from_le_bytes(*gen),
            registrants,
            held,
            ptpl: ptpl == 1,
            notices: Vec::new(),
        })
    }
}

/// Where reservation state persists through power loss (the daemon: a file next to a file
/// namespace, written and fsynced under a temporary name, then renamed). Keyed by subsystem
/// NQN and NSID.
pub trait ResvStore: Send + Sync + std::fmt::Debug {
    /// Whether this namespace can persist its state (RESCAP.PTPLC).
    fn capable(&self, subnqn: &str, nsid: u32) -> bool;
    /// The bytes last saved for the namespace, if any.
    fn load(&self, subnqn: &str, nsid: u32) -> Option<Vec<u8>>;
    /// Saves `state`, or with `None` forgets what was saved (PTPL turned off).
    fn save(&self, subnqn: &str, nsid: u32, state: Option<&[u8]>) -> std::io::Result<()>;
    /// [`ResvStore::save`], with the result handed to `done`, which may run on another thread
    /// after this returns (a store whose saves take long: the caller is a poller). By default
    /// the save runs here and `done` before this returns.
    fn save_then(&self, subnqn: &str, nsid: u32, state: Option<Vec<u8>>, done: SaveDone) {
        done(self.save(subnqn, nsid, state.as_deref()))
    }
    /// The state is shared with other targets (a gateway group): every change is saved, PTPL
    /// or not, and [`NsReservation::reload`] reads it again when this target starts serving
    /// the namespace.
    fn shared(&self) -> bool {
        false
    }
}

/// What [`ResvStore::save_then`] hands the result to.
pub type SaveDone = Box<dyn FnOnce(std::io::Result<()>) + Send>;

/// What a reservation command did ([`NsReservation::command`]).
#[derive(Debug)]
pub enum Change {
    /// Done (saved, or nothing to save): the hosts to notify.
    Done(Vec<(HostId, u8)>),
    /// The change is being saved: the command's result comes through the slot.
    Saving(Arc<SaveSlot>),
    /// Another command's change on this namespace is being saved: run the command again
    /// after it ([`NsReservation::saving`] says when).
    Busy,
}

/// Where a change being saved leaves the command's result (the hosts to notify, or the
/// status to fail it with).
#[derive(Debug, Default)]
pub struct SaveSlot(Mutex<Option<Result<Notices, Status>>>);

/// The hosts a change tells, and what (a Reservation Notification log page type).
pub type Notices = Vec<(HostId, u8)>;

impl SaveSlot {
    /// The result, once the save ended (taken: `None` again after).
    pub fn take(&self) -> Option<Result<Notices, Status>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// A namespace's state and whether a change of it is being saved.
#[derive(Debug, Default)]
struct Guarded {
    state: ResvState,
    saving: bool,
}

/// Where one namespace persists (a store and its key).
#[derive(Debug)]
struct Persist {
    store: std::sync::Arc<dyn ResvStore>,
    subnqn: String,
    nsid: u32,
}

/// A namespace's reservation state as queues share it: the I/O path reads `held` (one relaxed
/// load) and takes the lock only while a reservation exists.
#[derive(Debug, Default)]
pub struct NsReservation {
    held: AtomicBool,
    state: Mutex<Guarded>,
    /// Set when the namespace can persist its state.
    persist: Option<Persist>,
}

impl NsReservation {
    /// The state of namespace `nsid` of `subnqn`: what `store` kept if PTPL was on, empty
    /// otherwise.
    pub fn with_store(
        store: Option<&std::sync::Arc<dyn ResvStore>>,
        subnqn: &str,
        nsid: u32,
    ) -> NsReservation {
        let Some(store) = store.filter(|s| s.capable(subnqn, nsid)) else {
            return NsReservation::default();
        };
        let state = match store.load(subnqn, nsid) {
            Some(b) => ResvState::decode(&b).unwrap_or_else(|| {
                tracing::error!(
                    subnqn,
                    nsid,
                    "stored reservation state unreadable; starting empty"
                );
                ResvState::default()
            }),
            None => ResvState::default(),
        };
        NsReservation {
            held: AtomicBool::new(state.held.is_some()),
            state: Mutex::new(Guarded {
                state,
                saving: false,
            }),
            persist: Some(Persist {
                store: store.clone(),
                subnqn: subnqn.to_owned(),
                nsid,
            }),
        }
    }

    /// Reads the state again from the store (a gateway that starts serving the namespace
    /// takes the state its previous server left). No-op without a store.
    pub fn reload(&self) {
        let Some(p) = &self.persist else { return };
        let state = match p.store.load(&p.subnqn, p.nsid) {
            Some(b) => ResvState::decode(&b).unwrap_or_else(|| {
                tracing::error!(subnqn = %p.subnqn, nsid = p.nsid, "stored reservation state unreadable; keeping the one held");
                self.lock().state.clone()
            }),
            None => ResvState::default(),
        };
        let mut h = self.lock();
        h.state = state;
        self.held.store(h.state.held.is_some(), Ordering::Release);
    }

    /// Whether the state can persist through power loss (RESCAP.PTPLC).
    pub fn ptpl_capable(&self) -> bool {
        self.persist.is_some()
    }

    /// Runs a reservation command on the state. A change is saved (while PTPL is on, or when
    /// it was just turned off, or always with a shared store) before it counts: with a store
    /// that saves at once this returns the result; with one that saves on another thread the
    /// state stays as it was (the I/O path checks that) until the save ends, the result comes
    /// through [`Change::Saving`]'s slot and `waker` is called. If saving fails the change is
    /// dropped and the command fails with Internal Error, so what the host was told is what
    /// a restart finds.
    pub fn command(
        self: &Arc<Self>,
        f: impl FnOnce(&mut ResvState, bool) -> Result<(), ResvError>,
        waker: Option<&super::Waker>,
    ) -> Result<Change, Status> {
        let mut h = self.lock();
        if h.saving {
            return Ok(Change::Busy);
        }
        let before = h.state.clone();
        let r = f(&mut h.state, self.ptpl_capable());
        let notices = std::mem::take(&mut h.state.notices);
        let save = match (&r, &self.persist) {
            (Ok(()), Some(p)) => {
                let (s, shared) = (&h.state, p.store.shared());
                (*s != before && (s.ptpl || before.ptpl || shared))
                    .then(|| (s.ptpl || shared).then(|| s.encode()))
            }
            _ => None,
        };
        let (Some(bytes), Some(p)) = (save, &self.persist) else {
            self.held.store(h.state.held.is_some(), Ordering::Release);
            r.map_err(ResvError::status)?;
            return Ok(Change::Done(notices));
        };
        // Not counted until saved: the state before stays, and the namespace's next command
        // waits.
        let next = std::mem::replace(&mut h.state, before);
        h.saving = true;
        drop(h);
        let slot = Arc::new(SaveSlot::default());
        let (me, out, waker) = (Arc::clone(self), Arc::clone(&slot), waker.cloned());
        p.store.save_then(
            &p.subnqn,
            p.nsid,
            bytes,
            Box::new(move |res| {
                let r = me.saved(next, notices, res);
                *out.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
                if let Some(w) = waker {
                    w();
                }
            }),
        );
        match slot.take() {
            Some(Ok(n)) => Ok(Change::Done(n)),
            Some(Err(st)) => Err(st),
            None => Ok(Change::Saving(slot)),
        }
    }

    /// A save ended: the change counts if it was kept.
    fn saved(
        &self,
        next: ResvState,
        notices: Vec<(HostId, u8)>,
        res: std::io::Result<()>,
    ) -> Result<Vec<(HostId, u8)>, Status> {
        let mut h = self.lock();
        h.saving = false;
        if let Err(e) = res {
            if let Some(p) = &self.persist {
                tracing::error!(subnqn = %p.subnqn, nsid = p.nsid, error = %e,
                    "cannot save the reservation state; the command fails");
            }
            return Err(Status::INTERNAL);
        }
        h.state = next;
        self.held.store(h.state.held.is_some(), Ordering::Release);
        Ok(notices)
    }

    /// A change of this namespace's state is being saved ([`Change::Busy`] until it ends).
    pub fn saving(&self) -> bool {
        self.lock().saving
    }

    /// Checks an I/O command of `host` against the reservation.
    #[inline]
    pub fn check(&self, host: &HostId, access: Access) -> Result<(), ResvError> {
        if !self.held.load(Ordering::Acquire) {
            return Ok(());
        }
        self.lock().state.check(host, access)
    }

    /// The Reservation Report contents.
    pub fn report(&self) -> Report {
        self.lock().state.report()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Guarded> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme::resv::{AcquireAction as A, RegisterAction as R, ReleaseAction as L};

    const H1: HostId = [1; 16];
    const H2: HostId = [2; 16];
    const H3: HostId = [3; 16];

    fn reg(s: &mut ResvState, h: &HostId, key: u64) -> Result<(), ResvError> {
        s.register(
            h,
            &RegisterCmd {
                action: R::Register,
                ignore_key: false,
                ptpl: ChangePtpl::NoChange,
                crkey: 0,
                nrkey: key,
            },
            false,
        )
    }

    fn acq(
        s: &mut ResvState,
        h: &HostId,
        action: A,
        t: ResvType,
        crkey: u64,
        prkey: u64,
    ) -> Result<(), ResvError> {
        s.acquire(
            h,
            &AcquireCmd {
                action,
                ignore_key: false,
                rtype: t,
                crkey,
                prkey,
            },
        )
    }

    fn rel(
        s: &mut ResvState,
        h: &HostId,
        action: L,
        t: ResvType,
        crkey: u64,
    ) -> Result<(), ResvError> {
        s.release(
            h,
            &ReleaseCmd {
                action,
                ignore_key: false,
                rtype: t as u8,
                crkey,
            },
        )
    }

    /// The spec's access table, for every type: H1 holds (key 1), H2 is a registrant (key 2),
    /// H3 is not registered. Columns: read and write by the holder, a registrant, a stranger.
    #[test]
    fn access_rules_per_type() {
        use Access::{Read, Write};
        use ResvType::*;
        let ok = Ok(());
        let no = Err(ResvError::Conflict);
        #[rustfmt::skip]
        let table = [
            //                                 holder R/W   registrant R/W   other R/W
            (WriteExclusive,                   [ok, ok,     ok, no,          ok, no]),
            (ExclusiveAccess,                  [ok, ok,     no, no,          no, no]),
            (WriteExclusiveRegistrantsOnly,    [ok, ok,     ok, ok,          ok, no]),
            (ExclusiveAccessRegistrantsOnly,   [ok, ok,     ok, ok,          no, no]),
            (WriteExclusiveAllRegistrants,     [ok, ok,     ok, ok,          ok, no]),
            (ExclusiveAccessAllRegistrants,    [ok, ok,     ok, ok,          no, no]),
        ];
        for (t, want) in table {
            let mut s = ResvState::default();
            reg(&mut s, &H1, 1).unwrap();
            reg(&mut s, &H2, 2).unwrap();
            // Without a reservation, registered or not, everything is allowed.
            for h in [&H1, &H2, &H3] {
                assert_eq!(s.check(h, Write), ok);
            }
            acq(&mut s, &H1, A::Acquire, t, 1, 0).unwrap();
            let got = [
                s.check(&H1, Read),
                s.check(&H1, Write),
                s.check(&H2, Read),
                s.check(&H2, Write),
                s.check(&H3, Read),
                s.check(&H3, Write),
            ];
            assert_eq!(got, want, "{t:?}");
            // The registrant's view of who holds it (report RCSTS).
            let holders: Vec<bool> = s.report().registrants.iter().map(|r| r.2).collect();
            assert_eq!(holders, [true, t.all_registrants()], "{t:?}");
        }
    }

    #[test]
    fn register_rules() {
        let mut s = ResvState::default();
        reg(&mut s, &H1, 10).unwrap();
        assert_eq!(s.gen, 1);
        // Same key again: success, nothing changes; another key: conflict.
        reg(&mut s, &H1, 10).unwrap();
        assert_eq!(s.gen, 1);
        assert_eq!(reg(&mut s, &H1, 11), Err(ResvError::Conflict));
        let c = |action, ignore_key, crkey, nrkey| RegisterCmd {
            action,
            ignore_key,
            ptpl: ChangePtpl::NoChange,
            crkey,
            nrkey,
        };
        // Replace needs the current key unless IEKEY.
        assert_eq!(
            s.register(&H1, &c(R::Replace, false, 9, 12), false),
            Err(ResvError::Conflict)
        );
        s.register(&H1, &c(R::Replace, false, 10, 12), false)
            .unwrap();
        s.register(&H1, &c(R::Replace, true, 0, 13), false).unwrap();
        assert_eq!(s.key_of(&H1), Some(13));
        // Replace by an unregistered host: only with IEKEY (then it registers).
        assert_eq!(
            s.register(&H2, &c(R::Replace, false, 0, 5), false),
            Err(ResvError::Conflict)
        );
        s.register(&H2, &c(R::Replace, true, 0, 5), false).unwrap();
        // Unregister: key or IEKEY; an unregistered host gets a conflict.
        assert_eq!(
            s.register(&H2, &c(R::Unregister, false, 4, 0), false),
            Err(ResvError::Conflict)
        );
        s.register(&H2, &c(R::Unregister, true, 0, 0), false)
            .unwrap();
        assert_eq!(
            s.register(&H2, &c(R::Unregister, true, 0, 0), false),
            Err(ResvError::Conflict)
        );
        // PTPL changes need a capable namespace.
        let mut p = c(R::Register, false, 0, 13);
        p.ptpl = ChangePtpl::Set;
        assert_eq!(s.register(&H1, &p, false), Err(ResvError::InvalidField));
        s.register(&H1, &p, true).unwrap();
        assert!(s.report().ptpl);
    }

    #[test]
    fn acquire_release_and_unregister() {
        use ResvType::*;
        let mut s = ResvState::default();
        // Only registrants with the right key acquire.
        assert_eq!(
            acq(&mut s, &H1, A::Acquire, WriteExclusive, 1, 0),
            Err(ResvError::Conflict)
        );
        reg(&mut s, &H1, 1).unwrap();
        reg(&mut s, &H2, 2).unwrap();
        assert_eq!(
            acq(&mut s, &H1, A::Acquire, WriteExclusive, 9, 0),
            Err(ResvError::Conflict)
        );
        acq(&mut s, &H1, A::Acquire, WriteExclusive, 1, 0).unwrap();
        // Again, same type: fine; another type or another host: conflict.
        acq(&mut s, &H1, A::Acquire, WriteExclusive, 1, 0).unwrap();
        assert_eq!(
            acq(&mut s, &H1, A::Acquire, ExclusiveAccess, 1, 0),
            Err(ResvError::Conflict)
        );
        assert_eq!(
            acq(&mut s, &H2, A::Acquire, WriteExclusive, 2, 0),
            Err(ResvError::Conflict)
        );
        // A non-holder's release is a no-op success; the holder's needs the right type.
        rel(&mut s, &H2, L::Release, WriteExclusive, 2).unwrap();
        assert_eq!(s.rtype(), Some(WriteExclusive));
        assert_eq!(
            rel(&mut s, &H1, L::Release, ExclusiveAccess, 1),
            Err(ResvError::InvalidField)
        );
        rel(&mut s, &H1, L::Release, WriteExclusive, 1).unwrap();
        assert_eq!(s.rtype(), None);
        // The holder unregistering takes the reservation with it.
        acq(&mut s, &H1, A::Acquire, ExclusiveAccess, 1, 0).unwrap();
        s.register(
            &H1,
            &RegisterCmd {
                action: R::Unregister,
                ignore_key: false,
                ptpl: ChangePtpl::NoChange,
                crkey: 1,
                nrkey: 0,
            },
            false,
        )
        .unwrap();
        assert_eq!(s.rtype(), None);
        // All registrants: every registrant holds it; it lasts until the last one leaves or a
        // holder releases it.
        reg(&mut s, &H1, 1).unwrap();
        acq(&mut s, &H2, A::Acquire, ExclusiveAccessAllRegistrants, 2, 0).unwrap();
        acq(&mut s, &H1, A::Acquire, ExclusiveAccessAllRegistrants, 1, 0).unwrap();
        rel(&mut s, &H1, L::Release, ExclusiveAccessAllRegistrants, 1).unwrap();
        assert_eq!(s.rtype(), None);
        // Clear drops everything and bumps the generation.
        acq(&mut s, &H2, A::Acquire, WriteExclusive, 2, 0).unwrap();
        let g = s.gen;
        rel(&mut s, &H1, L::Clear, WriteExclusive, 1).unwrap();
        assert_eq!((s.rtype(), s.registrants.len(), s.gen), (None, 0, g + 1));
        // IEKEY in Acquire/Release is refused.
        reg(&mut s, &H1, 1).unwrap();
        let mut a = AcquireCmd {
            action: A::Acquire,
            ignore_key: true,
            rtype: WriteExclusive,
            crkey: 1,
            prkey: 0,
        };
        assert_eq!(s.acquire(&H1, &a), Err(ResvError::InvalidField));
        a.ignore_key = false;
        s.acquire(&H1, &a).unwrap();
    }

    #[test]
    fn preempt() {
        use ResvType::*;
        let mut s = ResvState::default();
        reg(&mut s, &H1, 1).unwrap();
        reg(&mut s, &H2, 2).unwrap();
        reg(&mut s, &H3, 3).unwrap();
        // No reservation: PRKEY 0 is invalid; an unknown key conflicts; a known one unregisters.
        assert_eq!(
            acq(&mut s, &H1, A::Preempt, WriteExclusive, 1, 0),
            Err(ResvError::InvalidField)
        );
        assert_eq!(
            acq(&mut s, &H1, A::Preempt, WriteExclusive, 1, 99),
            Err(ResvError::Conflict)
        );
        acq(&mut s, &H1, A::Preempt, WriteExclusive, 1, 3).unwrap();
        assert_eq!(s.key_of(&H3), None);
        assert_eq!(s.rtype(), None);
        // Preempting the holder: it is unregistered and the preempter holds the new type.
        acq(&mut s, &H2, A::Acquire, ExclusiveAccess, 2, 0).unwrap();
        let g = s.gen;
        acq(
            &mut s,
            &H1,
            A::PreemptAndAbort,
            WriteExclusiveRegistrantsOnly,
            1,
            2,
        )
        .unwrap();
        assert_eq!(s.key_of(&H2), None);
        assert_eq!(
            s.held,
            Some(Held {
                rtype: WriteExclusiveRegistrantsOnly,
                holder: H1
            })
        );
        assert_eq!(s.gen, g + 1);
        // All registrants, PRKEY 0: every other registrant goes, the preempter holds it.
        reg(&mut s, &H2, 2).unwrap();
        reg(&mut s, &H3, 3).unwrap();
        rel(&mut s, &H1, L::Release, WriteExclusiveRegistrantsOnly, 1).unwrap();
        acq(&mut s, &H2, A::Acquire, WriteExclusiveAllRegistrants, 2, 0).unwrap();
        acq(&mut s, &H3, A::Preempt, ExclusiveAccess, 3, 0).unwrap();
        assert_eq!(s.registrants.len(), 1);
        assert_eq!(
            s.held,
            Some(Held {
                rtype: ExclusiveAccess,
                holder: H3
            })
        );
        assert_eq!(s.check(&H1, Access::Read), Err(ResvError::Conflict));
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut s = ResvState::default();
        assert_eq!(ResvState::decode(&s.encode()), Some(s.clone()));
        reg(&mut s, &H1, 1).unwrap();
        reg(&mut s, &H2, u64::MAX).unwrap();
        acq(
            &mut s,
            &H2,
            A::Acquire,
            ResvType::ExclusiveAccessRegistrantsOnly,
            u64::MAX,
            0,
        )
        .unwrap();
        s.ptpl = true;
        let b = s.encode();
        assert_eq!(ResvState::decode(&b), Some(s));
        // Anything else is refused, not misread.
        assert_eq!(ResvState::decode(&b[..b.len() - 1]), None);
        assert_eq!(ResvState::decode(b"NVMFRSV0"), None);
        let mut bad = b.clone();
        bad[13] = 9;
        assert_eq!(ResvState::decode(&bad), None, "reservation type 9");
    }

    #[test]
    fn flag_follows_the_reservation() {
        let r = Arc::new(NsReservation::default());
        assert_eq!(r.check(&H2, Access::Write), Ok(()));
        let c = r.command(
            |s, _| {
                reg(s, &H1, 1)?;
                acq(s, &H1, A::Acquire, ResvType::ExclusiveAccess, 1, 0)
            },
            None,
        );
        assert!(matches!(c, Ok(Change::Done(_))), "{c:?}");
        assert_eq!(r.check(&H2, Access::Read), Err(ResvError::Conflict));
        let c = r.command(
            |s, _| rel(s, &H1, L::Release, ResvType::ExclusiveAccess, 1),
            None,
        );
        assert!(matches!(c, Ok(Change::Done(_))), "{c:?}");
        assert!(!r.held.load(Ordering::Relaxed));
        assert_eq!(r.check(&H2, Access::Write), Ok(()));
    }
}
