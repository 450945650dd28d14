//! A controller's state shared by its admin queue and its I/O queues (which may live on other
//! threads).
//!
//! What the I/O path reads (CSTS, the fatal flag, the reset epoch, the keep-alive stamp) is in
//! atomics; everything else sits behind one small mutex taken only by admin commands, timers,
//! queue attach/detach and error recording.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nvme::fabrics::{Cc, Csts};
use nvme::identify::ctrl as idc;
use nvme::log::{AsyncEvent, ErrorLogEntry, MAX_CHANGED_NS};
use nvme::Status;
use zerocopy::FromZeros;

use super::queue::{Counters, QueueStats};
use super::stats::IoTotals;
use super::subsystem::Subsystem;
use super::{TransportCaps, Waker};

/// Error log entries kept per controller (Identify ELPE + 1).
pub(crate) const ERROR_LOG_SLOTS: usize = 64;
/// Outstanding Asynchronous Event Requests allowed (Identify AERL + 1), as nvmet.
pub(crate) const MAX_AERS: usize = 4;
/// I/O queues granted at most by Set Features Number of Queues. Independent of the number of
/// poller threads: queues are spread over pollers by the transports.
pub(crate) const MAX_IO_QUEUES: u16 = 64;
/// Keep-alive timer granularity reported in Identify KAS, in 100 ms units.
pub(crate) const KAS_100MS: u16 = 1;
/// Keep-alive timeout a discovery controller gets when the host asks for none: nvmet uses
/// two minutes so that abandoned discovery sessions are cleaned up.
pub(crate) const DISCOVERY_DEFAULT_KATO_MS: u32 = 120_000;
/// Asynchronous events the controller may be asked to report on an I/O controller (Set
/// Features 0Bh): SMART critical warnings (bits 7:0, never raised here) and the OAES bits.
pub(crate) const AEN_IO_SUPPORTED: u32 = 0xff | idc::OAES_NS_ATTR | idc::OAES_ANA_CHANGE;
pub(crate) const AEN_DISC_SUPPORTED: u32 = idc::OAES_DISC_CHANGE;

/// Asynchronous Event Configuration after Connect and after a reset: the optional notices are
/// on (as nvmet), SMART warnings off.
/// Reservation notifications a controller keeps for the host to read.
const MAX_RESV_NOTICES: usize = 255;
/// The `aen_masked` bit for Reservation Log Page Available (a bit no Asynchronous Event
/// Configuration field uses: the event is not configurable there).
const RESV_EVENT_CLASS: u32 = 1 << 29;

fn default_aen(discovery: bool) -> u32 {
    if discovery {
        idc::OAES_DISC_CHANGE
    } else {
        idc::OAES_NS_ATTR | idc::OAES_ANA_CHANGE
    }
}

/// Why a controller or queue is going away; the transport logs the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Gone {
    Alive = 0,
    KeepAlive = 1,
    AdminLost = 2,
    Reset = 3,
    Shutdown = 4,
    Fatal = 5,
    /// The subsystem was removed (or replaced) by a configuration reload.
    Removed = 6,
    /// The host failed DH-HMAC-CHAP authentication, or did not finish it in time.
    AuthFailed = 7,
}

impl Gone {
    fn from_u8(v: u8) -> Gone {
        match v {
            1 => Gone::KeepAlive,
            2 => Gone::AdminLost,
            3 => Gone::Reset,
            4 => Gone::Shutdown,
            5 => Gone::Fatal,
            6 => Gone::Removed,
            7 => Gone::AuthFailed,
            _ => Gone::Alive,
        }
    }
    pub fn reason(self) -> &'static str {
        match self {
            Gone::Alive => "alive",
            Gone::KeepAlive => "keep-alive expired",
            Gone::AdminLost => "admin queue disconnected",
            Gone::Reset => "controller reset",
            Gone::Shutdown => "controller shutdown",
            Gone::Fatal => "controller fatal error",
            Gone::AuthFailed => "authentication failed",
            Gone::Removed => "subsystem removed by a configuration reload",
        }
    }
}

/// An attached I/O queue as the controller sees it.
struct IoQueueSlot {
    token: u64,
    counters: Arc<Counters>,
    waker: Option<Waker>,
}

/// State behind the controller mutex.
pub(crate) struct CtrlInner {
    /// Number of I/O queue pairs granted (Set Features 07h); qids 1..=this may connect.
    pub io_queues: u16,
    /// Whether the host set the Number of Queues feature since the last reset.
    pub io_queues_set: bool,
    /// Attached I/O queues by qid.
    io: BTreeMap<u16, IoQueueSlot>,
    /// Counters of I/O queues already detached (for the SMART log).
    retired: QueueStats,
    /// Their I/O statistics (also added to the subsystem's when they detach).
    retired_io: IoTotals,
    /// Asynchronous Event Configuration (Set Features 0Bh).
    pub aen_enabled: u32,
    /// Event classes reported and not yet cleared by reading their log page with RAE = 0.
    aen_masked: u32,
    /// Outstanding AER command identifiers.
    aer_cids: Vec<u16>,
    /// Events waiting for an AER.
    events: VecDeque<AsyncEvent>,
    /// Changed Namespace List; `None` = more than 1024 changed (reported as FFFFFFFFh).
    changed_ns: Option<Vec<u32>>,
    /// Reservation Notification log pages not yet read: (type, NSID), oldest first.
    resv_log: VecDeque<(u8, u32)>,
    /// Reservation notifications created so far (the log page's Log Page Count).
    resv_count: u64,
    /// Reservation Notification Mask (feature 82h) per NSID; `resv_mask_all` for the rest.
    resv_mask: BTreeMap<u32, u32>,
    resv_mask_all: u32,
    /// Error Information log, newest last.
    errors: VecDeque<ErrorLogEntry>,
    err_count: u64,
    /// Timestamp feature: host value in ms and when it was set.
    pub timestamp: Option<(u64, Instant)>,
    /// Keep-alive timeout the Connect established (restored on reset).
    pub connect_kato_ms: u32,
    /// Admin queue waker.
    admin_waker: Option<Waker>,
}

/// One controller.
pub(crate) struct Controller {
    pub cntlid: u16,
    pub subsys: Arc<Subsystem>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// The admin queue's remote address (for logs).
    pub peer: String,
    /// The admin queue's local address: the listener the host came through (its ANA states).
    pub local: Option<std::net::SocketAddr>,
    /// What the admin queue's transport offers (Identify reports from it).
    pub caps: TransportCaps,
    /// Creation time; keep-alive stamps are offsets from it.
    pub base: Instant,
    cc: AtomicU32,
    csts: AtomicU32,
    /// Set once the controller is going away as a whole; see `gone_reason`.
    gone: AtomicU8,
    /// Bumped whenever all I/O queues must be torn down (reset, shutdown).
    io_epoch: AtomicU32,
    io_epoch_reason: AtomicU8,
    kato_ms: AtomicU32,
    /// Last host activity, ns after `base`.
    last_seen_ns: AtomicU64,
    /// An event was queued: the admin queue should pair events with AERs.
    aen_pending: AtomicBool,
    /// The admin queue is over TLS, or generated a TLS PSK: I/O queues must come over TLS.
    tls_io: AtomicBool,
    inner: Mutex<CtrlInner>,
}

impl Controller {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cntlid: u16,
        subsys: Arc<Subsystem>,
        hostnqn: String,
        hostid: [u8; 16],
        caps: TransportCaps,
        kato_ms: u32,
        now: Instant,
        peer: String,
        local: Option<std::net::SocketAddr>,
    ) -> Controller {
        let aen_enabled = default_aen(subsys.discovery);
        Controller {
            cntlid,
            subsys,
            hostnqn,
            hostid,
            peer,
            local,
            caps,
            base: now,
            cc: AtomicU32::new(0),
            csts: AtomicU32::new(0),
            gone: AtomicU8::new(Gone::Alive as u8),
            io_epoch: AtomicU32::new(0),
            io_epoch_reason: AtomicU8::new(Gone::Alive as u8),
            kato_ms: AtomicU32::new(kato_ms),
            last_seen_ns: AtomicU64::new(0),
            aen_pending: AtomicBool::new(false),
            tls_io: AtomicBool::new(false),
            inner: Mutex::new(CtrlInner {
                io_queues: MAX_IO_QUEUES,
                io_queues_set: false,
                io: BTreeMap::new(),
                retired: QueueStats::default(),
                retired_io: IoTotals::default(),
                aen_enabled,
                aen_masked: 0,
                aer_cids: Vec::new(),
                events: VecDeque::new(),
                changed_ns: Some(Vec::new()),
                resv_log: VecDeque::new(),
                resv_count: 0,
                resv_mask: BTreeMap::new(),
                resv_mask_all: 0,
                errors: VecDeque::new(),
                err_count: 0,
                timestamp: None,
                connect_kato_ms: kato_ms,
                admin_waker: None,
            }),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, CtrlInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// "tcp" or "rdma" (for logs and metrics).
    pub fn transport(&self) -> &'static str {
        match self.caps.trtype {
            super::TrType::Tcp => "tcp",
            super::TrType::Rdma => "rdma",
        }
    }

    /// From now on this controller's I/O queues must come over TLS (its admin queue is
    /// over TLS, or negotiated a TLS PSK).
    pub fn require_tls_io(&self) {
        self.tls_io.store(true, Ordering::Relaxed);
    }

    /// Whether I/O queues must come over TLS.
    pub fn tls_io_required(&self) -> bool {
        self.tls_io.load(Ordering::Relaxed)
    }

    pub fn is_discovery(&self) -> bool {
        self.subsys.discovery
    }

    pub fn cc(&self) -> u32 {
        self.cc.load(Ordering::Acquire)
    }

    pub fn csts(&self) -> u32 {
        self.csts.load(Ordering::Acquire)
    }

    /// CSTS.RDY: the controller accepts non-fabrics commands.
    pub fn ready(&self) -> bool {
        self.csts() & Csts::RDY != 0
    }

    pub fn gone(&self) -> Gone {
        Gone::from_u8(self.gone.load(Ordering::Acquire))
    }

    pub fn io_epoch(&self) -> u32 {
        self.io_epoch.load(Ordering::Acquire)
    }

    pub fn io_epoch_reason(&self) -> Gone {
        Gone::from_u8(self.io_epoch_reason.load(Ordering::Acquire))
    }

    pub fn kato_ms(&self) -> u32 {
        self.kato_ms.load(Ordering::Acquire)
    }

    pub fn set_kato_ms(&self, ms: u32, now: Instant) {
        self.kato_ms.store(ms, Ordering::Release);
        self.touch(now, true);
    }

    pub(crate) fn since_base(&self, now: Instant) -> u64 {
        now.checked_duration_since(self.base)
            .unwrap_or_default()
            .as_nanos()
            .min(u64::MAX as u128) as u64
    }

    /// Record host activity. With Traffic Based Keep Alive (CTRATT.TBKAS) any command counts;
    /// to keep I/O threads from bouncing the cache line, a non-forced touch only stores when
    /// the stamp is older than 1/16 of KATO.
    pub fn touch(&self, now: Instant, force: bool) {
        self.touch_ns(self.since_base(now), force);
    }

    /// [`Controller::touch`] at `t`, ns on this controller's clock ([`Controller::since_base`]).
    pub(crate) fn touch_ns(&self, t: u64, force: bool) {
        if self.kato_ms() == 0 {
            return;
        }
        let last = self.last_seen_ns.load(Ordering::Relaxed);
        let slack = self.kato_ms() as u64 * 1_000_000 / 16;
        if t > last && (force || t - last > slack) {
            // fetch_max: a thread with an older `now` must not move the stamp back.
            self.last_seen_ns.fetch_max(t, Ordering::Relaxed);
        }
    }

    /// When the keep-alive timer fires, if it runs.
    pub fn keep_alive_deadline(&self) -> Option<Instant> {
        let kato = self.kato_ms();
        if kato == 0 || self.gone() != Gone::Alive {
            return None;
        }
        let last = Duration::from_nanos(self.last_seen_ns.load(Ordering::Relaxed));
        Some(self.base + last + Duration::from_millis(kato as u64))
    }

    /// The controller goes away as a whole: set CSTS.CFS, mark it gone and wake every queue.
    /// Returns false if it was already gone.
    pub fn fail(&self, why: Gone) -> bool {
        if self
            .gone
            .compare_exchange(
                Gone::Alive as u8,
                why as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return false;
        }
        self.csts.fetch_or(Csts::CFS, Ordering::AcqRel);
        let wakers: Vec<Waker> = {
            let mut g = self.lock();
            g.aer_cids.clear();
            g.io.values()
                .filter_map(|s| s.waker.clone())
                .chain(g.admin_waker.clone())
                .collect()
        };
        for w in wakers {
            w();
        }
        true
    }

    pub fn set_admin_waker(&self, w: Option<Waker>) {
        self.lock().admin_waker = w;
    }

    /// Property Set CC, edge-triggered like nvmet `nvmet_update_cc`. Returns the AER command
    /// identifiers a reset aborted (to be completed by the admin queue).
    pub fn update_cc(&self, new: u32, now: Instant) -> Vec<u16> {
        let mut g = self.lock();
        let old = Cc(self.cc.swap(new, Ordering::AcqRel));
        let new = Cc(new);
        let mut aborted = Vec::new();
        let mut wake = Vec::new();
        if new.en() && !old.en() {
            self.start(new, now);
        }
        if !new.en() && old.en() {
            aborted = self.reset(&mut g, Gone::Reset, &mut wake);
        }
        if new.shn() != Cc::SHN_NONE && old.shn() == Cc::SHN_NONE {
            aborted.extend(self.reset(&mut g, Gone::Shutdown, &mut wake));
            self.csts.fetch_or(Csts::SHST_COMPLETE, Ordering::AcqRel);
        }
        if new.shn() == Cc::SHN_NONE && old.shn() != Cc::SHN_NONE {
            self.csts.fetch_and(!Csts::SHST_MASK, Ordering::AcqRel);
        }
        drop(g);
        // Wakers run without the lock: they may poll the queue they wake.
        for w in wake {
            w();
        }
        aborted
    }

    /// CC.EN 0 -> 1: check the configuration, then CSTS.RDY (or CSTS.CFS on a bad one).
    fn start(&self, cc: Cc, now: Instant) {
        // Only I/O controllers check the entry sizes: nvmet notes that the spec wants a
        // discovery controller to check they are zero, but hosts set them anyway.
        let sizes_ok = self.is_discovery() || (cc.iosqes() == 6 && cc.iocqes() == 4);
        let css_ok =
            cc.css() == Cc::CSS_NVM || (self.is_discovery() && cc.css() == Cc::CSS_ADMIN_ONLY);
        // CAP.MPSMIN = MPSMAX = 0 (4 KiB) and only round robin arbitration.
        let ok = sizes_ok && css_ok && cc.mps() == 0 && cc.ams() == 0;
        self.csts
            .store(if ok { Csts::RDY } else { Csts::CFS }, Ordering::Release);
        if ok {
            // The keep-alive timer ran since Connect (to clean up hosts that die before
            // enabling); restart it now, as nvmet does.
            self.touch(now, true);
        } else {
            tracing::warn!(
                cntlid = self.cntlid,
                cc = cc.0,
                "CC rejected: controller fatal"
            );
        }
    }

    /// Controller reset (CC.EN 1 -> 0) or shutdown: drop RDY, tear down the I/O queues, return
    /// features to their defaults, drop pending events; returns the aborted AERs.
    fn reset(&self, g: &mut CtrlInner, why: Gone, wake: &mut Vec<Waker>) -> Vec<u16> {
        self.csts.fetch_and(!Csts::RDY, Ordering::AcqRel);
        self.io_epoch_reason.store(why as u8, Ordering::Release);
        self.io_epoch.fetch_add(1, Ordering::AcqRel);
        let detached = std::mem::take(&mut g.io);
        for slot in detached.values() {
            g.retired.add(&slot.counters.snapshot());
            self.retire_io(g, &slot.counters);
            wake.extend(slot.waker.clone());
        }
        g.io_queues = MAX_IO_QUEUES;
        g.io_queues_set = false;
        g.aen_enabled = default_aen(self.is_discovery());
        g.aen_masked = 0;
        g.events.clear();
        g.timestamp = None;
        self.kato_ms.store(g.connect_kato_ms, Ordering::Release);
        std::mem::take(&mut g.aer_cids)
    }

    /// Attach I/O queue `qid`. Errors: the qid is taken.
    pub fn attach_io(
        &self,
        qid: u16,
        token: u64,
        counters: Arc<Counters>,
        waker: Option<Waker>,
    ) -> Result<(), ()> {
        let mut g = self.lock();
        if g.io.contains_key(&qid) {
            return Err(());
        }
        g.io.insert(
            qid,
            IoQueueSlot {
                token,
                counters,
                waker,
            },
        );
        Ok(())
    }

    /// The counters of every attached I/O queue.
    pub fn io_counters(&self) -> Vec<Arc<Counters>> {
        self.lock()
            .io
            .values()
            .map(|s| s.counters.clone())
            .collect()
    }

    /// Detach I/O queue `qid` if `token` still owns it.
    pub fn detach_io(&self, qid: u16, token: u64) {
        let mut g = self.lock();
        if g.io.get(&qid).is_some_and(|s| s.token == token) {
            if let Some(slot) = g.io.remove(&qid) {
                g.retired.add(&slot.counters.snapshot());
                self.retire_io(&mut g, &slot.counters);
            }
        }
    }

    pub fn set_io_waker(&self, qid: u16, token: u64, w: Option<Waker>) {
        let mut g = self.lock();
        if let Some(s) = g.io.get_mut(&qid).filter(|s| s.token == token) {
            s.waker = w;
        }
    }

    /// A detached queue's I/O statistics go to the controller's and the subsystem's totals.
    fn retire_io(&self, g: &mut CtrlInner, c: &Counters) {
        let mut t = IoTotals::default();
        c.io.add_to(&mut t, false);
        g.retired_io.add(&t);
        self.subsys.retire_io(&t);
    }

    /// I/O statistics of this controller: its live queues, plus (`with_retired`) the queues
    /// it had before.
    pub fn io_metrics(&self, with_retired: bool) -> IoTotals {
        let g = self.lock();
        let mut t = if with_retired {
            g.retired_io.clone()
        } else {
            IoTotals::default()
        };
        for s in g.io.values() {
            s.counters.io.add_to(&mut t, true);
        }
        t
    }

    /// Each live I/O queue's counters, by qid.
    pub fn queue_metrics(&self) -> Vec<(u16, IoTotals)> {
        let g = self.lock();
        g.io.iter()
            .map(|(qid, s)| {
                let mut t = IoTotals::default();
                s.counters.io.add_to(&mut t, true);
                (*qid, t)
            })
            .collect()
    }

    pub fn has_io_queues(&self) -> bool {
        !self.lock().io.is_empty()
    }

    /// Totals over all I/O queues this controller has had (SMART log).
    pub fn io_totals(&self) -> QueueStats {
        let g = self.lock();
        let mut t = g.retired;
        for s in g.io.values() {
            t.add(&s.counters.snapshot());
        }
        t
    }

    /// Record a failed command in the Error Information log; returns the error count.
    #[allow(clippy::too_many_arguments)]
    pub fn record_error(
        &self,
        sqid: u16,
        cid: u16,
        status: Status,
        loc: u16,
        lba: u64,
        nsid: u32,
        trtype: u8,
    ) {
        let mut g = self.lock();
        g.err_count += 1;
        let mut e = ErrorLogEntry::new_zeroed();
        e.error_count = g.err_count.into();
        e.sqid = sqid.into();
        e.cmdid = cid.into();
        e.status_field = status.to_cqe_field(false).into();
        e.param_error_location = loc.into();
        e.lba = lba.into();
        e.nsid = nsid.into();
        e.trtype = trtype;
        if g.errors.len() == ERROR_LOG_SLOTS {
            g.errors.pop_front();
        }
        g.errors.push_back(e);
    }

    /// Error log entries, newest first, and the lifetime error count.
    pub fn error_log(&self) -> (Vec<ErrorLogEntry>, u64) {
        let g = self.lock();
        (g.errors.iter().rev().copied().collect(), g.err_count)
    }

    /// A namespace changed: record it in the Changed Namespace List and, if the host enabled
    /// the event and it is not masked, queue a Namespace Attribute Changed event.
    pub fn namespace_changed(&self, nsid: u32) {
        let waker = {
            let mut g = self.lock();
            if let Some(list) = &mut g.changed_ns {
                if !list.contains(&nsid) {
                    if list.len() == MAX_CHANGED_NS {
                        g.changed_ns = None;
                    } else {
                        list.push(nsid);
                    }
                }
            }
            self.queue_event(&mut g, idc::OAES_NS_ATTR, AsyncEvent::NS_CHANGED)
        };
        if let Some(w) = waker {
            w();
        }
    }

    /// Whether the host came through listener `l`.
    pub fn came_through(&self, l: &super::ListenerInfo) -> bool {
        self.local.is_some_and(|a| l.accepted(self.caps.trtype, a))
    }

    /// The ANA states of this controller's path changed: queue an Asymmetric Namespace Access
    /// Change event if the host enabled it and has not been told already (it reads the ANA
    /// log, which clears the mask).
    pub fn ana_changed(&self) {
        let waker = {
            let mut g = self.lock();
            self.queue_event(&mut g, idc::OAES_ANA_CHANGE, AsyncEvent::ANA_CHANGE)
        };
        if let Some(w) = waker {
            w();
        }
    }

    /// The discovery log changed: queue a Discovery Log Page Change event if the host enabled
    /// it and has not been told already.
    pub fn discovery_changed(&self) {
        let waker = {
            let mut g = self.lock();
            self.queue_event(&mut g, idc::OAES_DISC_CHANGE, AsyncEvent::DISCOVERY_CHANGED)
        };
        if let Some(w) = waker {
            w();
        }
    }

    /// A reservation notification of `kind` (`nvme::resv::notice`) for namespace `nsid`: unless
    /// the host masked that type for the namespace (feature 82h), it goes into the Reservation
    /// Notification log (at most 255 waiting; older ones are lost, the count still says how
    /// many there were) and raises Reservation Log Page Available, which needs no
    /// Asynchronous Event Configuration bit.
    pub fn reservation_notice(&self, nsid: u32, kind: u8) {
        let waker = {
            let mut g = self.lock();
            let mask = g.resv_mask.get(&nsid).copied().unwrap_or(g.resv_mask_all);
            if mask & nvme::resv::mask::of(kind) != 0 {
                return;
            }
            g.resv_count = g.resv_count.wrapping_add(1).max(1);
            if g.resv_log.len() == MAX_RESV_NOTICES {
                g.resv_log.pop_front();
            }
            g.resv_log.push_back((kind, nsid));
            if g.aen_masked & RESV_EVENT_CLASS != 0 {
                None
            } else {
                g.aen_masked |= RESV_EVENT_CLASS;
                g.events.push_back(AsyncEvent::RESV_LOG_AVAILABLE);
                self.aen_pending.store(true, Ordering::Release);
                g.admin_waker.clone()
            }
        };
        if let Some(w) = waker {
            w();
        }
    }

    /// Get Log Page 80h: the oldest reservation notification (consumed), or an empty page.
    /// Without `rae` the next notification raises the event again.
    pub fn take_resv_notice(&self, rae: bool) -> nvme::resv::NotificationLog {
        let mut g = self.lock();
        let (kind, nsid) = g.resv_log.pop_front().unwrap_or((0, 0));
        let log = nvme::resv::NotificationLog {
            count: if kind == 0 { 0 } else { g.resv_count },
            kind,
            available: u8::try_from(g.resv_log.len()).unwrap_or(u8::MAX),
            nsid,
        };
        if !rae {
            g.aen_masked &= !RESV_EVENT_CLASS;
        }
        log
    }

    /// Set Features 82h: the notification mask of `nsid` (FFFFFFFFh: every namespace).
    pub fn set_resv_mask(&self, nsid: u32, mask: u32) {
        let mut g = self.lock();
        if nsid == u32::MAX {
            g.resv_mask.clear();
            g.resv_mask_all = mask;
        } else {
            g.resv_mask.insert(nsid, mask);
        }
    }

    /// Get Features 82h.
    pub fn resv_mask(&self, nsid: u32) -> u32 {
        let g = self.lock();
        g.resv_mask.get(&nsid).copied().unwrap_or(g.resv_mask_all)
    }

    /// Queue `ev` (class bit `class`) if enabled and not masked; returns the admin waker to
    /// call once the lock is released.
    fn queue_event(&self, g: &mut CtrlInner, class: u32, ev: AsyncEvent) -> Option<Waker> {
        if g.aen_enabled & class == 0 || g.aen_masked & class != 0 {
            return None;
        }
        g.aen_masked |= class;
        g.events.push_back(ev);
        self.aen_pending.store(true, Ordering::Release);
        g.admin_waker.clone()
    }

    /// Read (and unless `rae`, clear) the Changed Namespace List.
    pub fn take_changed_ns(&self, rae: bool) -> Option<Vec<u32>> {
        let mut g = self.lock();
        // A Namespace List is in increasing NSID order.
        let out = g.changed_ns.clone().map(|mut l| {
            l.sort_unstable();
            l
        });
        if !rae {
            g.changed_ns = Some(Vec::new());
            g.aen_masked &= !idc::OAES_NS_ATTR;
        }
        out
    }

    /// The host read a log page with RAE = 0: events of `class` may be reported again.
    pub fn unmask_event(&self, class: u32) {
        self.lock().aen_masked &= !class;
    }

    /// An AER arrived. Ok(Some(result)) completes it at once with a pending event,
    /// Ok(None) holds it, Err if the limit is reached.
    pub fn submit_aer(&self, cid: u16) -> Result<Option<u32>, ()> {
        let mut g = self.lock();
        if let Some(ev) = g.events.pop_front() {
            return Ok(Some(ev.encode()));
        }
        if g.aer_cids.len() >= MAX_AERS {
            return Err(());
        }
        g.aer_cids.push(cid);
        Ok(None)
    }

    /// Pair queued events with held AERs: (cid, result) for each completed AER.
    pub fn take_aer_completions(&self) -> Vec<(u16, u32)> {
        // Load first: this runs on every poll, and a read leaves the cache line shared.
        if !self.aen_pending.load(Ordering::Acquire)
            || !self.aen_pending.swap(false, Ordering::AcqRel)
        {
            return Vec::new();
        }
        let mut g = self.lock();
        let mut out = Vec::new();
        while !g.aer_cids.is_empty() && !g.events.is_empty() {
            let cid = g.aer_cids.remove(0);
            if let Some(ev) = g.events.pop_front() {
                out.push((cid, ev.encode()));
            }
        }
        out
    }

    /// Drop held AERs (the admin queue is gone).
    pub fn drop_aers(&self) {
        self.lock().aer_cids.clear();
    }

    pub fn supported_aens(&self) -> u32 {
        if self.is_discovery() {
            AEN_DISC_SUPPORTED
        } else {
            AEN_IO_SUPPORTED
        }
    }
}
