//! Fused Compare and Write through the queue: the pair's steps (deferred, resumed, the
//! Compare's outcome deciding the Write's), the FUSE field's rules, and the range lock
//! against writes from another host's queue (they wait for it, it waits for them).

use super::*;
use nvme::cmd::{FUSE_FIRST, FUSE_SECOND};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Blocks of namespace 1 (4 KiB) per range-lock stripe (1 MiB).
const STRIPE_BLOCKS: u64 = 256;

/// Two hosts' I/O queues on the open test subsystem (their admin queues kept alive).
fn two_queues() -> (Arc<Target>, Vec<Host>, Host, Host) {
    let (t, admin_a, a, b, admin_b) = two_hosts();
    (t, vec![admin_a, admin_b], a, b)
}

fn sqe(q: &mut Host, opcode: u8, fuse: u8, slba: u64, nlb: u32) -> Sqe {
    let cid = q.next_cid();
    let mut sqe = Sqe::new(opcode, cid);
    sqe.flags |= fuse;
    sqe.nsid = 1.into();
    sqe.cdw10 = (slba as u32).into();
    sqe.cdw11 = ((slba >> 32) as u32).into();
    sqe.cdw12 = (nlb - 1).into();
    sqe.dptr = q.sgl(nlb << 12, true).encode();
    sqe
}

fn compare(q: &mut Host, slba: u64, nlb: u32) -> Reply {
    let s = sqe(q, io::COMPARE, FUSE_FIRST, slba, nlb);
    q.submit(s, &vec![1; (nlb << 12) as usize])
}

fn write(q: &mut Host, fuse: u8, slba: u64, nlb: u32) -> Reply {
    let s = sqe(q, io::WRITE, fuse, slba, nlb);
    q.submit(s, &vec![2; (nlb << 12) as usize])
}

#[track_caller]
fn deferred(r: Reply) -> Cmd {
    match r {
        Reply::Deferred(c) => c,
        r => panic!("expected a deferred command, got {r:?}"),
    }
}

#[track_caller]
fn io_op(r: Reply) -> (IoOp, Cmd) {
    match r {
        Reply::Io(op, c) => (op, c),
        r => panic!("expected an I/O, got {r:?}"),
    }
}

/// The next event must resume `cmd`: execute it again, as the transport does.
#[track_caller]
fn resume(q: &mut Host, cmd: &mut Cmd) -> Exec {
    match q.q.poll_event() {
        Some(QueueEvent::Resume(cid)) => assert_eq!(cid, cmd.sqe.cid()),
        e => panic!(
            "expected the resumption of CID {}, got {e:?}",
            cmd.sqe.cid()
        ),
    }
    let mut buf = vec![0u8; 1 << 16];
    q.q.execute(cmd, &mut buf, q.now)
}

#[track_caller]
fn resumed_io(q: &mut Host, cmd: &mut Cmd) -> IoOp {
    match resume(q, cmd) {
        Exec::Io(op) => op,
        e => panic!("expected an I/O, got {e:?}"),
    }
}

fn complete(q: &mut Host, cmd: &mut Cmd, res: Result<(), i32>) -> Status {
    q.q.complete_io(cmd, res, q.now).status()
}

#[test]
fn identify_reports_compare_and_write() {
    let (_t, mut admins, _a, _b) = two_queues();
    let id = admins[0].identify(cns::CTRL, 0, csi::NVM);
    let id = IdentifyController::decode(id.ok_data()).unwrap();
    assert_eq!(id.fuses.get() & idc::FUSES_COMPARE_AND_WRITE, 1);
    // 128 KiB (the TCP test caps' buffer) in 4 KiB blocks, 0's based.
    assert_eq!(id.acwu.get(), 31);
}

#[test]
fn a_matching_compare_runs_the_write_under_the_lock() {
    let (_t, _admins, mut a, _b) = two_queues();
    let mut c = deferred(compare(&mut a, 8, 2));
    assert!(a.q.poll_event().is_none(), "the Write is not there yet");
    let mut w = deferred(write(&mut a, FUSE_SECOND, 8, 2));
    let op = resumed_io(&mut a, &mut c);
    assert_eq!(
        (op.kind, op.offset, op.len),
        (IoKind::Compare, 8 << 12, 2 << 12)
    );
    assert!(a.q.poll_event().is_none());
    assert_eq!(complete(&mut a, &mut c, Ok(())), Status::SUCCESS);
    let op = resumed_io(&mut a, &mut w);
    assert_eq!(
        (op.kind, op.offset, op.len),
        (IoKind::Write, 8 << 12, 2 << 12)
    );
    assert_eq!(complete(&mut a, &mut w, Ok(())), Status::SUCCESS);
    assert!(a.q.poll_event().is_none());
    // The lock is gone: a plain write to the blocks runs at once.
    io_op(write(&mut a, 0, 8, 1));
}

#[test]
fn a_compare_failure_fails_the_write_as_failed_fused() {
    let (_t, _admins, mut a, _b) = two_queues();
    let mut c = deferred(compare(&mut a, 0, 1));
    let w = deferred(write(&mut a, FUSE_SECOND, 0, 1));
    resumed_io(&mut a, &mut c);
    assert_eq!(
        complete(&mut a, &mut c, Err(-libc::EILSEQ)),
        Status::COMPARE_FAILED.dnr()
    );
    let cqe = a.expect_completion(w.sqe.cid());
    assert_eq!(cqe.status(), Status::FUSED_FAIL);
    assert!(a.q.poll_event().is_none());
    io_op(write(&mut a, 0, 0, 1));
}

/// A namespace whose store has a compare-and-write of its own (RBD, shared with other
/// gateways): a pair that fits it is one op naming the Write, and the Write then completes
/// without an op of its own; a difference fails the Write as failed fused; a pair larger than
/// the store's unit is a Compare then a Write, as for any other store.
#[test]
fn a_store_with_its_own_compare_and_write_runs_a_pair_that_fits_as_one_op() {
    let (t, _admins, mut a, _b) = two_queues();
    let mut subs = test_subsystems();
    subs[0].allow_any_host = true;
    subs[0].namespaces[0].native_caw = 4096;
    t.reconfigure(subs, test_listeners());

    let mut c = deferred(compare(&mut a, 8, 1));
    let mut w = deferred(write(&mut a, FUSE_SECOND, 8, 1));
    let op = resumed_io(&mut a, &mut c);
    let one_op = IoKind::CompareAndWrite {
        write_cid: w.sqe.cid(),
        write_buf: None,
    };
    assert_eq!((op.kind, op.offset, op.len), (one_op, 8 << 12, 1 << 12));
    assert!(a.q.poll_event().is_none(), "the Write waits for the op");
    assert_eq!(complete(&mut a, &mut c, Ok(())), Status::SUCCESS);
    match resume(&mut a, &mut w) {
        Exec::Done { cqe, data_len: 0 } => assert_eq!(cqe.status(), Status::SUCCESS),
        e => panic!("the Write completes without an op: {e:?}"),
    }
    assert!(a.q.poll_event().is_none());
    // The lock is gone: a plain write to the block runs at once.
    let (_, mut pw) = io_op(write(&mut a, 0, 8, 1));
    assert_eq!(complete(&mut a, &mut pw, Ok(())), Status::SUCCESS);

    // The store finds a difference.
    let mut c = deferred(compare(&mut a, 9, 1));
    let w = deferred(write(&mut a, FUSE_SECOND, 9, 1));
    assert!(matches!(
        resumed_io(&mut a, &mut c).kind,
        IoKind::CompareAndWrite { .. }
    ));
    assert_eq!(
        complete(&mut a, &mut c, Err(-libc::EILSEQ)),
        Status::COMPARE_FAILED.dnr()
    );
    assert_eq!(
        a.expect_completion(w.sqe.cid()).status(),
        Status::FUSED_FAIL
    );

    // Two blocks are more than the store's unit: Compare, then Write.
    let mut c = deferred(compare(&mut a, 16, 2));
    let mut w = deferred(write(&mut a, FUSE_SECOND, 16, 2));
    assert_eq!(resumed_io(&mut a, &mut c).kind, IoKind::Compare);
    assert_eq!(complete(&mut a, &mut c, Ok(())), Status::SUCCESS);
    assert_eq!(resumed_io(&mut a, &mut w).kind, IoKind::Write);
    assert_eq!(complete(&mut a, &mut w, Ok(())), Status::SUCCESS);
    assert!(a.q.poll_event().is_none());
}

#[test]
fn fuse_field_rules() {
    let (_t, mut admins, mut a, _b) = two_queues();
    // A second with no first.
    assert_eq!(
        write(&mut a, FUSE_SECOND, 0, 1).status(),
        Status::FUSED_MISSING.dnr()
    );
    // Only Compare may be first; FUSE 11b is reserved; nothing fuses on the admin queue.
    let s = sqe(&mut a, io::READ, FUSE_FIRST, 0, 1);
    assert_eq!(a.submit(s, &[]).status(), Status::INVALID_FIELD.dnr());
    let s = sqe(&mut a, io::WRITE, 3, 0, 1);
    assert_eq!(
        a.submit(s, &[0; 4096]).status(),
        Status::INVALID_FIELD.dnr()
    );
    let mut s = admins[0].admin_sqe(admin::KEEP_ALIVE);
    s.flags |= FUSE_FIRST;
    assert_eq!(
        admins[0].submit(s, &[]).status(),
        Status::INVALID_FIELD.dnr()
    );
    // A first whose second does not follow: Missing Fused, and the other command runs.
    let c = deferred(compare(&mut a, 0, 1));
    io_op(write(&mut a, 0, 0, 1));
    assert_eq!(
        a.expect_completion(c.sqe.cid()).status(),
        Status::FUSED_MISSING.dnr()
    );
    // A second over other blocks: refused, and its first fails.
    let c = deferred(compare(&mut a, 0, 1));
    assert_eq!(
        write(&mut a, FUSE_SECOND, 1, 1).status(),
        Status::INVALID_FIELD.dnr()
    );
    assert_eq!(
        a.expect_completion(c.sqe.cid()).status(),
        Status::FUSED_FAIL
    );
    // A first refused at parse: its second is a Failed Fused.
    let s = sqe(&mut a, io::COMPARE, FUSE_FIRST, 1 << 40, 1);
    assert_eq!(a.submit(s, &[0; 4096]).status(), Status::LBA_RANGE.dnr());
    assert_eq!(
        write(&mut a, FUSE_SECOND, 1 << 40, 1).status(),
        Status::FUSED_FAIL
    );
    assert!(a.q.poll_event().is_none());
}

#[test]
fn a_first_executed_after_its_partner_was_missed_fails_then() {
    let (_t, _admins, mut a, _b) = two_queues();
    // The transport parses in order but the Compare's data comes later (an R2T, an RDMA
    // READ): the next command's parse already decided the pair's fate.
    let s = sqe(&mut a, io::COMPARE, FUSE_FIRST, 0, 1);
    let mut c = a.q.parse(&s, a.now).unwrap();
    io_op(a.rw(io::READ, 1, 0, 1, 12));
    match a.q.execute(&mut c, &mut [0; 4096], a.now) {
        Exec::Done { cqe, .. } => assert_eq!(cqe.status(), Status::FUSED_MISSING.dnr()),
        e => panic!("{e:?}"),
    }
    // Both parsed before either executes (in-capsule data of the Write arrives first).
    let s1 = sqe(&mut a, io::COMPARE, FUSE_FIRST, 4, 1);
    let s2 = sqe(&mut a, io::WRITE, FUSE_SECOND, 4, 1);
    let mut c = a.q.parse(&s1, a.now).unwrap();
    let mut w = a.q.parse(&s2, a.now).unwrap();
    assert!(matches!(
        a.q.execute(&mut w, &mut [2; 4096], a.now),
        Exec::Deferred
    ));
    assert!(matches!(
        a.q.execute(&mut c, &mut [1; 4096], a.now),
        Exec::Deferred
    ));
    resumed_io(&mut a, &mut c);
    assert_eq!(complete(&mut a, &mut c, Ok(())), Status::SUCCESS);
    resumed_io(&mut a, &mut w);
    assert_eq!(complete(&mut a, &mut w, Ok(())), Status::SUCCESS);
    // A transport error on the Compare's data: the Write is a Failed Fused.
    let s1 = sqe(&mut a, io::COMPARE, FUSE_FIRST, 4, 1);
    let s2 = sqe(&mut a, io::WRITE, FUSE_SECOND, 4, 1);
    let c = a.q.parse(&s1, a.now).unwrap();
    let mut w = a.q.parse(&s2, a.now).unwrap();
    assert!(matches!(
        a.q.execute(&mut w, &mut [2; 4096], a.now),
        Exec::Deferred
    ));
    let now = a.now;
    a.q.complete_status(&c, Status::TRANSIENT_TRANSPORT, now);
    assert_eq!(
        a.expect_completion(w.sqe.cid()).status(),
        Status::FUSED_FAIL
    );
    io_op(write(&mut a, 0, 4, 1));
}

#[test]
fn the_lock_waits_for_writes_in_flight_and_holds_back_new_ones() {
    let (_t, _admins, mut a, mut b) = two_queues();
    let woken = Arc::new(AtomicUsize::new(0));
    let (wa, wb) = (woken.clone(), woken.clone());
    a.q.set_waker(Arc::new(move || {
        wa.fetch_add(1, Ordering::SeqCst);
    }));
    b.q.set_waker(Arc::new(move || {
        wb.fetch_add(1 << 16, Ordering::SeqCst);
    }));
    // Host B's write to block 2 is executing.
    let (_, mut early) = io_op(write(&mut b, 0, 2, 1));
    // Host A's pair over blocks 0-3 takes the lock and waits for it.
    let mut c = deferred(compare(&mut a, 0, 4));
    let mut w = deferred(write(&mut a, FUSE_SECOND, 0, 4));
    assert!(
        a.q.poll_event().is_none(),
        "a write in the range is executing"
    );
    // B's next write into the locked stripe waits; one to another stripe and a read do not.
    let mut late = deferred(write(&mut b, 0, 3, 1));
    let (_, mut elsewhere) = io_op(write(&mut b, 0, STRIPE_BLOCKS, 1));
    io_op(b.rw(io::READ, 1, 0, 4, 12));
    // A deallocation names a list of ranges: it waits for any lock.
    let mut dsm = Sqe::new(io::DSM, b.next_cid());
    dsm.nsid = 1.into();
    dsm.cdw11 = (1 << 2).into();
    dsm.dptr = b.sgl(16, true).encode();
    let mut range = [0u8; 16];
    range[4..8].copy_from_slice(&1u32.to_le_bytes());
    range[8..16].copy_from_slice(&(STRIPE_BLOCKS * 3).to_le_bytes());
    let mut dsm = deferred(b.submit(dsm, &range));
    assert_eq!(complete(&mut b, &mut elsewhere, Ok(())), Status::SUCCESS);
    assert!(a.q.poll_event().is_none(), "still one write in the stripe");
    let before = woken.load(Ordering::SeqCst);
    assert_eq!(complete(&mut b, &mut early, Ok(())), Status::SUCCESS);
    assert!(
        woken.load(Ordering::SeqCst) & 0xffff > before & 0xffff,
        "A was woken"
    );
    resumed_io(&mut a, &mut c);
    assert!(b.q.poll_event().is_none(), "B's writes wait for the lock");
    assert_eq!(complete(&mut a, &mut c, Ok(())), Status::SUCCESS);
    resumed_io(&mut a, &mut w);
    let before = woken.load(Ordering::SeqCst);
    assert_eq!(complete(&mut a, &mut w, Ok(())), Status::SUCCESS);
    assert!(
        woken.load(Ordering::SeqCst) >> 16 > before >> 16,
        "B was woken"
    );
    // Both of B's waiting writes go now, the deallocation with its range list as sent.
    let mut resumed = Vec::new();
    for _ in 0..2 {
        match b.q.poll_event() {
            Some(QueueEvent::Resume(cid)) => resumed.push(cid),
            e => panic!("{e:?}"),
        }
    }
    resumed.sort();
    assert_eq!(resumed, vec![late.sqe.cid(), dsm.sqe.cid()]);
    let mut buf = vec![0u8; 4096];
    assert!(matches!(
        b.q.execute(&mut late, &mut buf, b.now),
        Exec::Io(_)
    ));
    let mut buf = range.to_vec();
    match b.q.execute(&mut dsm, &mut buf, b.now) {
        Exec::Io(op) => assert_eq!(op.kind, IoKind::Trim { ranges: 1 }),
        e => panic!("{e:?}"),
    }
    let trimmed: Vec<_> = trim_ranges(&buf, 1).collect();
    assert_eq!(trimmed, vec![(STRIPE_BLOCKS * 3 * 4096, 4096)]);
    complete(&mut b, &mut late, Ok(()));
    complete(&mut b, &mut dsm, Ok(()));
    // Every registration was given back: a new pair runs at once.
    let mut c = deferred(compare(&mut a, 0, 4));
    deferred(write(&mut a, FUSE_SECOND, 0, 4));
    resumed_io(&mut a, &mut c);
}

#[test]
fn a_queue_that_goes_away_drops_its_lock_and_registrations() {
    let (_t, _admins, mut a, mut b) = two_queues();
    let mut c = deferred(compare(&mut a, 0, 1));
    deferred(write(&mut a, FUSE_SECOND, 0, 1));
    resumed_io(&mut a, &mut c);
    let mut late = deferred(write(&mut b, 0, 0, 1));
    // A's connection closes with its Compare on the backend.
    a.q.disconnected();
    a.q.abandon(&mut c);
    match b.q.poll_event() {
        Some(QueueEvent::Resume(cid)) => assert_eq!(cid, late.sqe.cid()),
        e => panic!("{e:?}"),
    }
    assert!(matches!(
        b.q.execute(&mut late, &mut [0; 4096], b.now),
        Exec::Io(_)
    ));
    // B's write is executing when B goes away: the abandoned command gives its
    // registration back, so a later lock on the stripe is not held up.
    b.q.disconnected();
    b.q.abandon(&mut late);
    let table = b.q.namespaces().expect("the queue's table stays");
    let lock = table.locks(1).unwrap().try_lock(0, 4096, None).unwrap();
    assert!(lock.drained());
}
