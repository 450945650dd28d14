//! Queue and controller life: SQ head, Disconnect, reset, admin loss, namespace changes and
//! their events, wakers.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::bad_input::ready;
use super::*;
use nvme::fabrics::{disconnect_sqe, CATTR_DISABLE_SQFLOW};
use nvme::identify::decode_ns_list;
use nvme::log::{lid, AsyncEvent};

fn counter() -> (Arc<AtomicUsize>, Waker) {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    (
        n,
        Arc::new(move || {
            m.fetch_add(1, Ordering::SeqCst);
        }),
    )
}

#[test]
fn kato_zero_disables_the_keep_alive_timer() {
    // As nvmet: KATO 0 at Connect or in Set Features means no keep-alive timeout; the
    // controller lives as long as its admin queue's connection.
    let t = test_target();
    let mut a = Host::new(&t, tcp_caps(), Instant::now());
    let r = a.connect_admin(SUBNQN, HOSTNQN, 0);
    assert_eq!(r.status(), Status::SUCCESS);
    let cc = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
    assert!(a.prop_set(reg::CC, cc.0 as u64).status().is_success());
    assert_eq!(a.get_features(feat::KATO, 0, 0).ok_result(), 0);
    assert_eq!(a.q.poll_timeout(), None);
    a.now += Duration::from_secs(3600);
    a.q.handle_timeout(a.now);
    assert!(a.q.poll_event().is_none(), "no keep-alive expiry");
    assert_eq!(t.controller_count(), 1);
    a.set_features(feat::KATO, 5000, &[]).ok_result();
    assert_eq!(
        a.q.poll_timeout(),
        Some(a.now + Duration::from_millis(5000))
    );
    a.set_features(feat::KATO, 0, &[]).ok_result();
    assert_eq!(a.q.poll_timeout(), None);
}

#[test]
fn sq_head_wraps_and_can_be_disabled() {
    let t = test_target();
    let mut a = Host::new(&t, tcp_caps(), Instant::now());
    let cntlid = a.bring_up(SUBNQN, HOSTNQN);
    a.set_features(feat::NUM_QUEUES, 1 | 1 << 16, &[])
        .ok_result();
    let d = ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN);
    let mut q = Host::new(&t, tcp_caps(), a.now);
    // sqsize 3: depth 4; the Connect is entry 0.
    assert_eq!(q.connect(1, 3, 0, &d).cqe().sq_head.get(), 1);
    let mut heads = Vec::new();
    for i in 0..6 {
        // Rejected commands consume their entry too.
        let r = if i == 2 {
            q.rw(io::READ, 9, 0, 1, 12)
        } else {
            q.rw(io::READ, 1, 0, 1, 12)
        };
        let c = match r {
            Reply::Io(..) => q.finish_io(r),
            r => r.cqe(),
        };
        heads.push(c.sq_head.get());
    }
    assert_eq!(heads, vec![2, 3, 0, 1, 2, 3]);

    let mut q2 = Host::new(&t, tcp_caps(), a.now);
    let cid = q2.next_cid();
    let sqe = connect_sqe(
        cid,
        2,
        31,
        CATTR_DISABLE_SQFLOW,
        0,
        Sgl::InCapsule {
            offset: 0,
            len: 1024,
        },
    );
    let c = q2.submit(sqe, &d.encode()).cqe();
    assert!(c.status().is_success());
    assert_eq!(c.sq_head.get(), 0xffff);
    let r = q2.rw(io::READ, 1, 0, 1, 12);
    assert_eq!(q2.finish_io(r).sq_head.get(), 0xffff);
}

#[test]
fn disconnect_command_frees_the_qid() {
    let (t, _a, mut q) = ready(tcp_caps());
    let cntlid = q.q.cntlid().unwrap();
    let cid = q.next_cid();
    let mut sqe = disconnect_sqe(cid);
    sqe.dptr = q.sgl(0, false).encode();
    let c = q.submit(sqe, &[]).cqe();
    assert!(c.status().is_success());
    assert_eq!((c.cid(), c.sq_id.get()), (cid, 1));
    match q.q.poll_event() {
        Some(QueueEvent::Disconnect(_)) => {}
        e => panic!("{e:?}"),
    }
    assert!(q.q.poll_event().is_none());
    assert_eq!(q.rw(io::READ, 1, 0, 1, 12).status(), Status::ABORT_QUEUE);
    // The same qid can be connected again at once, and the controller lives on.
    let mut again = Host::new(&t, tcp_caps(), Instant::now());
    again
        .connect(1, 31, 0, &ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN))
        .ok_result();
    assert_eq!(t.controller_count(), 1);
}

#[test]
fn reset_tears_down_io_queues_and_aborts_aers() {
    let (t, mut a, mut q) = ready(tcp_caps());
    let cntlid = a.q.cntlid().unwrap();
    let (woken, w) = counter();
    q.q.set_waker(w);
    let aer = match a.simple(admin::ASYNC_EVENT_REQUEST) {
        Reply::Deferred(cmd) => cmd.sqe.cid(),
        r => panic!("{r:?}"),
    };
    // Host writes CC.EN = 0.
    a.prop_set(reg::CC, Cc::new(false, 0, 0, 0, 0, 6, 4).0 as u64)
        .ok_result();
    assert_eq!(a.prop_get(reg::CSTS, PropSize::Four).ok_result(), 0);
    match a.q.poll_event() {
        Some(QueueEvent::Complete(c)) => {
            assert_eq!(c.cid(), aer);
            assert_eq!(c.status(), Status::ABORT_QUEUE);
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(
        woken.load(Ordering::SeqCst),
        1,
        "the I/O queue's thread was woken"
    );
    match q.q.poll_event() {
        Some(QueueEvent::Disconnect(why)) => assert_eq!(why, "controller reset"),
        e => panic!("{e:?}"),
    }
    assert_eq!(q.rw(io::READ, 1, 0, 1, 12).status(), Status::ABORT_QUEUE);
    // Features are back to their defaults; enabling again allows the same qid.
    a.prop_set(reg::CC, Cc::new(true, 0, 0, 0, 0, 6, 4).0 as u64)
        .ok_result();
    assert_eq!(
        a.get_features(feat::NUM_QUEUES, 0, 0).ok_result(),
        63 | 63 << 16
    );
    assert_eq!(a.get_features(feat::KATO, 0, 0).ok_result(), 5000);
    let mut q1 = Host::new(&t, tcp_caps(), a.now);
    q1.connect(1, 31, 0, &ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN))
        .ok_result();
    // The old queue going away later does not detach the new one.
    q.q.disconnected();
    assert!(matches!(q1.rw(io::READ, 1, 0, 1, 12), Reply::Io(..)));
    let mut dup = Host::new(&t, tcp_caps(), a.now);
    let d = ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN);
    assert_eq!(
        dup.connect(1, 31, 0, &d).status(),
        Status::CMD_SEQ_ERROR.dnr()
    );
}

#[test]
fn losing_the_admin_queue_removes_the_controller() {
    let (t, mut a, mut q) = ready(rdma_caps());
    let cntlid = a.q.cntlid().unwrap();
    assert_eq!(t.controller_count(), 1);
    a.q.disconnected();
    a.q.disconnected(); // idempotent
    assert_eq!(t.controller_count(), 0);
    match q.q.poll_event() {
        Some(QueueEvent::Disconnect(why)) => assert_eq!(why, "admin queue disconnected"),
        e => panic!("{e:?}"),
    }
    let mut late = Host::new(&t, rdma_caps(), Instant::now());
    let d = ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN);
    assert_eq!(
        late.connect(2, 31, 0, &d).status(),
        Status::CONNECT_INVALID_PARAM.dnr()
    );
    // Dropping a connected queue releases it too.
    let mut b = Host::new(&t, tcp_caps(), Instant::now());
    b.bring_up(SUBNQN, HOSTNQN);
    assert_eq!(t.controller_count(), 1);
    drop(b);
    assert_eq!(t.controller_count(), 0);
}

#[test]
fn cntlids_are_unique_and_round_robin() {
    let t = test_target();
    let mut hosts = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..5 {
        let mut h = Host::new(&t, tcp_caps(), Instant::now());
        ids.push(h.connect_admin(SUBNQN, HOSTNQN, 5000).ok_result() as u16);
        hosts.push(h);
    }
    assert_eq!(ids, vec![1, 2, 3, 4, 5]);
    hosts.remove(1); // frees cntlid 2
    let mut h = Host::new(&t, tcp_caps(), Instant::now());
    assert_eq!(h.connect_admin(SUBNQN, HOSTNQN, 5000).ok_result(), 6);
    assert_eq!(t.controller_count(), 5);
}

#[test]
fn namespace_changes_raise_events_once_until_the_log_is_read() {
    let (t, mut a, mut q) = ready(tcp_caps());
    let (woken, w) = counter();
    a.q.set_waker(w);
    a.set_features(feat::ASYNC_EVENT, idc::OAES_NS_ATTR, &[])
        .ok_result();
    // An event that arrives before any AER waits for one.
    assert!(t.set_namespaces(
        SUBNQN,
        vec![ns(1, 2048, 12, 7), ns(3, 1 << 20, 9, 8), ns(5, 100, 9, 11)]
    ));
    assert_eq!(woken.load(Ordering::SeqCst), 1);
    let r = a.simple(admin::ASYNC_EVENT_REQUEST);
    assert_eq!(
        AsyncEvent::decode(r.ok_result() as u32),
        AsyncEvent::NS_CHANGED
    );
    // Further changes are recorded but not signalled until the log is read (RAE = 0).
    let aer = match a.simple(admin::ASYNC_EVENT_REQUEST) {
        Reply::Deferred(cmd) => cmd.sqe.cid(),
        r => panic!("{r:?}"),
    };
    t.notify_namespace_changed(SUBNQN, 1);
    assert!(a.q.poll_event().is_none());
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, true);
    assert_eq!(
        decode_ns_list(r.ok_data()),
        vec![1, 5],
        "RAE keeps the list"
    );
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, false);
    assert_eq!(decode_ns_list(r.ok_data()), vec![1, 5]);
    t.notify_namespace_changed(SUBNQN, 3);
    match a.q.poll_event() {
        Some(QueueEvent::Complete(c)) => assert_eq!(c.cid(), aer),
        e => panic!("{e:?}"),
    }
    // The new namespace is visible on the I/O path; a removed one is gone.
    assert_eq!(
        decode_ns_list(a.identify(cns::NS_ACTIVE_LIST, 0, 0).ok_data()),
        vec![1, 3, 5]
    );
    match q.rw(io::READ, 5, 99, 1, 9) {
        Reply::Io(op, _) => assert_eq!((op.device, op.offset), (11, 99 * 512)),
        r => panic!("{r:?}"),
    }
    assert!(t.set_namespaces(SUBNQN, vec![ns(1, 2048, 12, 7)]));
    assert_eq!(
        q.rw(io::READ, 5, 0, 1, 9).status(),
        Status::INVALID_NS.dnr()
    );
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, false);
    assert_eq!(decode_ns_list(r.ok_data()), vec![3, 5]);
    // Unknown subsystems are reported as such.
    assert!(!t.notify_namespace_changed("nqn.nope", 1));
    assert!(!t.set_namespaces("nqn.nope", vec![]));
    // More than 1024 changes collapse to FFFFFFFFh.
    for nsid in 1..=1100 {
        t.notify_namespace_changed(SUBNQN, nsid);
    }
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, false);
    assert_eq!(decode_ns_list(r.ok_data()), vec![0xffff_ffff]);
}

#[test]
fn events_are_not_raised_when_disabled() {
    let (t, mut a, _q) = ready(tcp_caps());
    a.set_features(feat::ASYNC_EVENT, 0, &[]).ok_result();
    assert!(matches!(
        a.simple(admin::ASYNC_EVENT_REQUEST),
        Reply::Deferred(_)
    ));
    t.notify_namespace_changed(SUBNQN, 1);
    assert!(a.q.poll_event().is_none());
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, false);
    assert_eq!(
        decode_ns_list(r.ok_data()),
        vec![1],
        "the list records it anyway"
    );
}

#[test]
fn set_features_kato_moves_the_deadline() {
    let (_t, mut a, _q) = ready(tcp_caps());
    a.advance(Duration::from_secs(1));
    a.set_features(feat::KATO, 30_000, &[]).ok_result();
    assert_eq!(a.q.poll_timeout(), Some(a.now + Duration::from_secs(30)));
    // Values below the target minimum (1 s) are raised.
    a.set_features(feat::KATO, 10, &[]).ok_result();
    assert_eq!(a.get_features(feat::KATO, 0, 0).ok_result(), 1000);
}
