//! Reservations through the queue: two hosts (two Host Identifiers), the access rules on the
//! I/O path, Report, Preempt, a second controller of the same host sharing its registration,
//! and the state surviving a reconfiguration that keeps the namespace.

use super::*;
use nvme::identify::ctrl as idc;
use nvme::opcode::io;
use nvme::resv::{
    AcquireAction, AcquireCmd, ChangePtpl, RegisterAction, RegisterCmd, ReleaseAction, ReleaseCmd,
    Report, ResvType,
};

fn resv(q: &mut Host, opcode: u8, cdw10: u32, data: &[u8]) -> Reply {
    let cid = q.next_cid();
    let mut sqe = Sqe::new(opcode, cid);
    sqe.nsid = 1.into();
    sqe.cdw10 = cdw10.into();
    sqe.dptr = q.sgl(data.len() as u32, true).encode();
    q.submit(sqe, data)
}

fn register(q: &mut Host, action: RegisterAction, crkey: u64, nrkey: u64) -> Reply {
    let (cdw10, data) = RegisterCmd {
        action,
        ignore_key: false,
        ptpl: ChangePtpl::NoChange,
        crkey,
        nrkey,
    }
    .encode();
    resv(q, io::RESV_REGISTER, cdw10, &data)
}

fn acquire(q: &mut Host, action: AcquireAction, rtype: ResvType, crkey: u64, prkey: u64) -> Reply {
    let (cdw10, data) = AcquireCmd {
        action,
        ignore_key: false,
        rtype,
        crkey,
        prkey,
    }
    .encode();
    resv(q, io::RESV_ACQUIRE, cdw10, &data)
}

fn release(q: &mut Host, action: ReleaseAction, rtype: ResvType, crkey: u64) -> Reply {
    let (cdw10, data) = ReleaseCmd {
        action,
        ignore_key: false,
        rtype: rtype as u8,
        crkey,
    }
    .encode();
    resv(q, io::RESV_RELEASE, cdw10, &data)
}

fn report(q: &mut Host, eds: bool) -> Reply {
    let cid = q.next_cid();
    let mut sqe = Sqe::new(io::RESV_REPORT, cid);
    sqe.nsid = 1.into();
    sqe.cdw10 = (4096 / 4 - 1).into();
    sqe.cdw11 = u32::from(eds).into();
    sqe.dptr = q.sgl(4096, false).encode();
    q.submit(sqe, &[])
}

/// Acquires a reservation of `rtype` with `key` and releases it again.
fn hold_and_release(q: &mut Host, rtype: ResvType, key: u64) {
    acquire(q, AcquireAction::Acquire, rtype, key, 0).ok_result();
    release(q, ReleaseAction::Release, rtype, key).ok_result();
}

#[track_caller]
fn conflict(r: Reply) {
    assert_eq!(r.status(), Status::RESERVATION_CONFLICT.dnr(), "{r:?}");
}

#[test]
fn two_hosts_reserve_one_namespace() {
    let (t, mut admin, mut qa, mut qb, _admin_b) = two_hosts();
    // Identify advertises reservations: ONCS bit 5, all six types and IEKEY (RESCAP).
    let id = admin.identify(cns::CTRL, 0, csi::NVM);
    let id = nvme::identify::IdentifyController::decode(id.ok_data()).unwrap();
    assert_ne!(id.oncs.get() & idc::ONCS_RESERVATIONS, 0);
    let ns = admin.identify(cns::NS, 1, csi::NVM);
    let ns = nvme::identify::IdentifyNamespace::decode(ns.ok_data()).unwrap();
    assert_eq!(ns.rescap, 0xfe);

    // Registrations alone restrict nothing.
    register(&mut qa, RegisterAction::Register, 0, 0xa).ok_result();
    register(&mut qb, RegisterAction::Register, 0, 0xb).ok_result();
    assert!(matches!(qb.rw(io::WRITE, 1, 0, 1, 12), Reply::Io(..)));
    // A holds Write Exclusive: B (a registrant) reads but cannot write.
    acquire(
        &mut qa,
        AcquireAction::Acquire,
        ResvType::WriteExclusive,
        0xa,
        0,
    )
    .ok_result();
    assert!(matches!(qb.rw(io::READ, 1, 0, 1, 12), Reply::Io(..)));
    for op in [io::WRITE, io::WRITE_ZEROES, io::FLUSH] {
        conflict(qb.rw(op, 1, 0, 1, 12));
    }
    assert!(matches!(qa.rw(io::WRITE, 1, 0, 1, 12), Reply::Io(..)));
    // B cannot take it, nor release it with a wrong key.
    conflict(acquire(
        &mut qb,
        AcquireAction::Acquire,
        ResvType::WriteExclusive,
        0xb,
        0,
    ));
    conflict(release(
        &mut qb,
        ReleaseAction::Release,
        ResvType::WriteExclusive,
        0xbad,
    ));

    // Report: only the extended format (fabrics host identifiers are 128 bits).
    assert_eq!(
        report(&mut qb, false).status(),
        Status::HOST_ID_INCONSISTENT.dnr()
    );
    let r = Report::decode_ext(report(&mut qb, true).ok_data()).unwrap();
    assert_eq!(r.rtype, Some(ResvType::WriteExclusive));
    assert_eq!(r.gen, 2);
    assert_eq!(r.registrants, [(HOSTID, 0xa, true), (HOSTID_B, 0xb, false)]);

    // A second controller of host B shares B's registration.
    let mut admin_b2 = Host::new(&t, tcp_caps(), qa.now);
    let cntlid = admin_b2.bring_up_as(SUBNQN, OTHER_HOST, HOSTID_B);
    admin_b2.set_features(feat::NUM_QUEUES, 0, &[]).ok_result();
    let mut qb2 = Host::new(&t, tcp_caps(), qa.now);
    qb2.connect(
        1,
        31,
        0,
        &ConnectData::new(HOSTID_B, cntlid, SUBNQN, OTHER_HOST),
    )
    .ok_result();
    conflict(register(&mut qb2, RegisterAction::Register, 0, 0xc));
    register(&mut qb2, RegisterAction::Register, 0, 0xb).ok_result();

    // B preempts A into Exclusive Access: A is unregistered and locked out, reads included.
    acquire(
        &mut qb2,
        AcquireAction::Preempt,
        ResvType::ExclusiveAccess,
        0xb,
        0xa,
    )
    .ok_result();
    conflict(qa.rw(io::READ, 1, 0, 1, 12));
    conflict(qa.rw(io::WRITE, 1, 0, 1, 12));
    assert!(matches!(qb.rw(io::WRITE, 1, 0, 1, 12), Reply::Io(..)));
    conflict(register(&mut qa, RegisterAction::Unregister, 0xa, 0));

    // A reconfiguration that keeps namespace 1 keeps its reservation.
    let mut open = test_subsystems();
    open[0].allow_any_host = true;
    t.reconfigure(open, test_listeners());
    conflict(qa.rw(io::READ, 1, 0, 1, 12));
    // Clear: everything goes.
    release(
        &mut qb,
        ReleaseAction::Clear,
        ResvType::ExclusiveAccess,
        0xb,
    )
    .ok_result();
    assert!(matches!(qa.rw(io::WRITE, 1, 0, 1, 12), Reply::Io(..)));
    let r = Report::decode_ext(report(&mut qa, true).ok_data()).unwrap();
    assert_eq!((r.rtype, r.regctl), (None, 0));
}

/// Reservation notifications: a preempted registration, a released registrants-only
/// reservation and a Clear reach every controller of the affected host as Reservation
/// Notification log pages (80h, one per read) with the Reservation Log Page Available event;
/// the mask (feature 82h) suppresses a type; Write Exclusive releases notify nobody.
#[test]
fn reservation_notifications_reach_the_other_host() {
    use nvme::log::{lid, AsyncEvent};
    use nvme::resv::{notice, NotificationLog};
    let (_t, _admin_a, mut qa, mut qb, mut admin_b) = two_hosts();
    let next_log = |a: &mut Host| {
        NotificationLog::decode(a.get_log(lid::RESV_NOTIFICATION, 0, 64, 0, false).ok_data())
            .unwrap()
    };
    let aer = match admin_b.simple(admin::ASYNC_EVENT_REQUEST) {
        Reply::Deferred(cmd) => cmd.sqe.cid(),
        r => panic!("{r:?}"),
    };
    register(&mut qa, RegisterAction::Register, 0, 0xa).ok_result();
    register(&mut qb, RegisterAction::Register, 0, 0xb).ok_result();
    acquire(
        &mut qb,
        AcquireAction::Acquire,
        ResvType::WriteExclusiveRegistrantsOnly,
        0xb,
        0,
    )
    .ok_result();
    // A preempts B: B's registration is preempted (one notice; the event fires once).
    acquire(
        &mut qa,
        AcquireAction::Preempt,
        ResvType::WriteExclusive,
        0xa,
        0xb,
    )
    .ok_result();
    let c = admin_b.expect_completion(aer);
    assert_eq!(
        AsyncEvent::decode(c.result.get() as u32),
        AsyncEvent::RESV_LOG_AVAILABLE
    );
    let e = next_log(&mut admin_b);
    assert_eq!(
        (e.count, e.kind, e.available, e.nsid),
        (1, notice::REGISTRATION_PREEMPTED, 0, 1)
    );
    assert_eq!(
        next_log(&mut admin_b).kind,
        notice::EMPTY,
        "consumed by the read"
    );
    // A releases Write Exclusive: nobody hears of it. A registrants-only release: B does.
    register(&mut qb, RegisterAction::Register, 0, 0xb).ok_result();
    release(
        &mut qa,
        ReleaseAction::Release,
        ResvType::WriteExclusive,
        0xa,
    )
    .ok_result();
    assert_eq!(next_log(&mut admin_b).kind, notice::EMPTY);
    hold_and_release(&mut qa, ResvType::ExclusiveAccessRegistrantsOnly, 0xa);
    let e = next_log(&mut admin_b);
    assert_eq!((e.count, e.kind), (2, notice::RESERVATION_RELEASED));
    // Masked for namespace 1: the same release is not logged. A Clear is (another type).
    let released = nvme::resv::mask::RESERVATION_RELEASED;
    assert_eq!(
        admin_b.set_features_ns(feat::RESV_MASK, 1, 1).status(),
        Status::INVALID_FIELD.dnr(),
        "bit 0 is reserved"
    );
    admin_b
        .set_features_ns(feat::RESV_MASK, 1, released)
        .ok_result();
    hold_and_release(&mut qa, ResvType::ExclusiveAccessRegistrantsOnly, 0xa);
    release(&mut qa, ReleaseAction::Clear, ResvType::WriteExclusive, 0xa).ok_result();
    let e = next_log(&mut admin_b);
    assert_eq!((e.count, e.kind), (3, notice::RESERVATION_PREEMPTED));
    assert_eq!(next_log(&mut admin_b).kind, notice::EMPTY);
}

/// Preempt and Abort fences the preempted host: it completes only once the writes that host
/// had in flight (admitted before the preempt) have completed, and its later writes are
/// refused. Without writes in flight it completes at once.
#[test]
fn preempt_and_abort_waits_for_the_preempted_hosts_writes() {
    let (_t, _admin_a, mut qa, mut qb, _admin_b) = two_hosts();
    register(&mut qa, RegisterAction::Register, 0, 0xa).ok_result();
    register(&mut qb, RegisterAction::Register, 0, 0xb).ok_result();
    acquire(
        &mut qb,
        AcquireAction::Acquire,
        ResvType::ExclusiveAccess,
        0xb,
        0,
    )
    .ok_result();
    // B, the holder, has a write and a flush in the backend (and a read, not waited for).
    let w = qb.rw(io::WRITE, 1, 0, 1, 12);
    let f = qb.rw(io::FLUSH, 1, 0, 1, 12);
    let r = qb.rw(io::READ, 1, 8, 1, 12);
    assert!(matches!(
        (&w, &f, &r),
        (Reply::Io(..), Reply::Io(..), Reply::Io(..))
    ));
    let pa = acquire(
        &mut qa,
        AcquireAction::PreemptAndAbort,
        ResvType::ExclusiveAccess,
        0xa,
        0xb,
    );
    let Reply::Deferred(pa) = pa else {
        panic!("Preempt and Abort completed with B's writes in flight: {pa:?}");
    };
    // The preempt already took effect: B's new writes are refused.
    conflict(qb.rw(io::WRITE, 1, 4, 1, 12));
    assert!(qa.q.poll_event().is_none());
    qb.finish_io(w);
    qb.finish_io(r);
    assert!(qa.q.poll_event().is_none(), "the flush is still in flight");
    qb.finish_io(f);
    match qa.q.poll_event() {
        Some(QueueEvent::Complete(c)) => {
            assert_eq!(c.cid(), pa.sqe.cid());
            assert!(c.status().is_success(), "{c:?}");
        }
        e => panic!("{e:?}"),
    }
    // Nothing in flight: at once.
    register(&mut qb, RegisterAction::Register, 0, 0xb).ok_result();
    acquire(
        &mut qa,
        AcquireAction::PreemptAndAbort,
        ResvType::WriteExclusive,
        0xa,
        0xb,
    )
    .ok_result();
}

/// A store that saves when the test says (as a gateway group's saves on its own thread):
/// each save waits in `jobs` until [`SlowStore::finish`].
#[derive(Default)]
struct SlowStore {
    jobs: std::sync::Mutex<Vec<(Option<Vec<u8>>, crate::core::SaveDone)>>,
    saved: std::sync::Mutex<Option<Vec<u8>>>,
}

impl std::fmt::Debug for SlowStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SlowStore({} pending)", self.pending())
    }
}

impl SlowStore {
    fn pending(&self) -> usize {
        self.jobs.lock().unwrap().len()
    }

    /// Ends the oldest save: kept (`ok`) or failed.
    fn finish(&self, ok: bool) {
        let (state, done) = self.jobs.lock().unwrap().remove(0);
        if ok {
            *self.saved.lock().unwrap() = state;
            done(Ok(()));
        } else {
            done(Err(std::io::Error::other("the cluster is away")));
        }
    }
}

impl crate::core::ResvStore for SlowStore {
    fn capable(&self, _: &str, _: u32) -> bool {
        true
    }
    fn load(&self, _: &str, _: u32) -> Option<Vec<u8>> {
        self.saved.lock().unwrap().clone()
    }
    fn save(&self, _: &str, _: u32, _: Option<&[u8]>) -> std::io::Result<()> {
        unreachable!("saves go through save_then")
    }
    fn save_then(&self, _: &str, _: u32, state: Option<Vec<u8>>, done: crate::core::SaveDone) {
        self.jobs.lock().unwrap().push((state, done));
    }
    fn shared(&self) -> bool {
        true
    }
}

/// Runs deferred command `cmd` again (after its queue's Resume) with its payload `data`.
fn run_again(q: &mut Host, cmd: &mut Cmd, data: &[u8]) -> Exec {
    match q.q.poll_event() {
        Some(QueueEvent::Resume(cid)) => assert_eq!(cid, cmd.sqe.cid()),
        e => panic!(
            "expected the resumption of CID {}, got {e:?}",
            cmd.sqe.cid()
        ),
    }
    let mut buf = data.to_vec();
    buf.resize(4096, 0);
    q.q.execute(cmd, &mut buf, q.now)
}

/// With a store that saves on another thread, a reservation command completes once its change
/// is saved (the poller is woken then) and not before: meanwhile the I/O path checks the
/// state before it, and another command on the namespace waits behind it and runs after. A
/// save that fails fails its command (Internal Error, retryable) and the change does not
/// count. Preempt and Abort saves first, then fences.
#[test]
fn reservation_changes_count_once_saved() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let store = Arc::new(SlowStore::default());
    let s = Arc::clone(&store) as Arc<dyn crate::core::ResvStore>;
    let (_t, _admin_a, mut qa, mut qb, _admin_b) = two_hosts_with(move |p| p.resv_store = Some(s));
    let wakes = Arc::new(AtomicUsize::new(0));
    let w = Arc::clone(&wakes);
    qa.q.set_waker(Arc::new(move || {
        w.fetch_add(1, Ordering::SeqCst);
    }));

    // A registers: deferred until saved, and woken then.
    let Reply::Deferred(reg_a) = register(&mut qa, RegisterAction::Register, 0, 0xa) else {
        panic!("a register completed before its change was saved");
    };
    assert!(qa.q.poll_event().is_none());
    assert_eq!(store.pending(), 1);
    store.finish(true);
    assert_eq!(wakes.load(Ordering::SeqCst), 1);
    assert!(qa.expect_completion(reg_a.sqe.cid()).status().is_success());

    // A acquires Write Exclusive; while that is being saved B still writes (the state before
    // counts) and B's register waits behind it.
    let Reply::Deferred(acq_a) = acquire(
        &mut qa,
        AcquireAction::Acquire,
        ResvType::WriteExclusive,
        0xa,
        0,
    ) else {
        panic!("an acquire completed before its change was saved");
    };
    let w = qb.rw(io::WRITE, 1, 0, 1, 12);
    assert!(matches!(w, Reply::Io(..)), "{w:?}");
    qb.finish_io(w);
    let (cdw10, reg_b_data) = RegisterCmd {
        action: RegisterAction::Register,
        ignore_key: false,
        ptpl: ChangePtpl::NoChange,
        crkey: 0,
        nrkey: 0xb,
    }
    .encode();
    let Reply::Deferred(mut reg_b) = resv(&mut qb, io::RESV_REGISTER, cdw10, &reg_b_data) else {
        panic!("B's register ran while A's change was being saved");
    };
    assert!(
        qb.q.poll_event().is_none(),
        "B's register waits for the save"
    );
    assert_eq!(store.pending(), 1);
    store.finish(true);
    assert!(qa.expect_completion(acq_a.sqe.cid()).status().is_success());
    conflict(qb.rw(io::WRITE, 1, 0, 1, 12));
    // B's register runs again now, and is saved in its turn.
    assert!(matches!(
        run_again(&mut qb, &mut reg_b, &reg_b_data),
        Exec::Deferred
    ));
    store.finish(true);
    assert!(qb.expect_completion(reg_b.sqe.cid()).status().is_success());

    // A release whose save fails: Internal Error without DNR, and A still holds it.
    let Reply::Deferred(rel_a) = release(
        &mut qa,
        ReleaseAction::Release,
        ResvType::WriteExclusive,
        0xa,
    ) else {
        panic!("a release completed before its change was saved");
    };
    store.finish(false);
    let c = qa.expect_completion(rel_a.sqe.cid());
    assert_eq!(c.status(), Status::INTERNAL, "{c:?}");
    conflict(qb.rw(io::WRITE, 1, 0, 1, 12));
    let rep = Report::decode_ext(report(&mut qa, true).ok_data()).unwrap();
    assert_eq!(rep.rtype, Some(ResvType::WriteExclusive));

    // B preempts and aborts A: saved, then fenced (nothing of A's in flight), then complete.
    let Reply::Deferred(pa) = acquire(
        &mut qb,
        AcquireAction::PreemptAndAbort,
        ResvType::WriteExclusive,
        0xb,
        0xa,
    ) else {
        panic!("a preempt completed before its change was saved");
    };
    assert!(qb.q.poll_event().is_none());
    store.finish(true);
    assert!(qb.expect_completion(pa.sqe.cid()).status().is_success());
    conflict(qa.rw(io::WRITE, 1, 0, 1, 12));
    assert_eq!(store.pending(), 0);
    // What the store kept is what the namespace holds now.
    let kept = store.load("", 1).unwrap();
    let rep = Report::decode_ext(report(&mut qa, true).ok_data()).unwrap();
    let holder: Vec<_> = rep
        .registrants
        .iter()
        .filter(|r| r.2)
        .map(|r| r.0)
        .collect();
    assert_eq!(holder, vec![HOSTID_B]);
    let kept = crate::core::reservation::ResvState::decode(&kept)
        .unwrap()
        .report();
    assert_eq!(rep, kept);
}
