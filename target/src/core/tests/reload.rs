//! Reconfiguration (SIGHUP reload): the diff between the running and the new configuration
//! and what connected hosts see of it.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::bad_input::ready;
use super::*;
use nvme::identify::decode_ns_list;
use nvme::log::{lid, AsyncEvent};

use crate::core::subsystem::GONE_GRACE;

const ADDED: &str = "nqn.2024-01.io.nvmf-rs:added";

/// `test_listeners` and a TCP listener on each port after the first.
fn t_listeners(ports: &[&str]) -> Vec<ListenerInfo> {
    let mut v = test_listeners();
    for (i, p) in ports.iter().enumerate().skip(1) {
        v.push(ListenerInfo::new(
            TrType::Tcp,
            "192.0.2.1".into(),
            (*p).into(),
            2 + i as u16,
        ));
    }
    v
}

#[test]
fn the_same_configuration_changes_nothing() {
    let (t, mut a, _q) = ready(tcp_caps());
    let gen = t.genctr();
    let r = t.reconfigure(test_subsystems(), test_listeners());
    assert!(r.is_empty(), "{r:?}");
    assert_eq!(t.genctr(), gen);
    assert!(matches!(
        a.simple(admin::ASYNC_EVENT_REQUEST),
        Reply::Deferred(_)
    ));
    assert!(a.q.poll_event().is_none(), "no event without a change");
}

#[test]
fn added_changed_and_removed_namespaces_reach_the_host() {
    let (t, mut a, mut q) = ready(tcp_caps());
    let (woken, w) = counter();
    a.q.set_waker(w);
    // Linux enables the notice, then posts an AER.
    a.set_features(feat::ASYNC_EVENT, idc::OAES_NS_ATTR, &[])
        .ok_result();
    let aer = match a.simple(admin::ASYNC_EVENT_REQUEST) {
        Reply::Deferred(cmd) => cmd.sqe.cid(),
        r => panic!("{r:?}"),
    };
    // NSID 1 unchanged, 3 resized (remove + add: a new device), 4 new.
    let mut s = test_subsystems();
    s[0].namespaces = vec![
        ns(1, 2048, 12, 7),
        ns(3, 1 << 21, 9, 20),
        ns(4, 4096, 12, 21),
    ];
    let gen = t.genctr();
    let r = t.reconfigure(s.clone(), test_listeners());
    assert_eq!(r.namespaces_changed, vec![(SUBNQN.to_string(), vec![3, 4])]);
    assert!(!r.discovery_changed(), "{r:?}");
    assert_eq!(t.genctr(), gen, "namespaces are not in the discovery log");
    assert!(
        woken.load(Ordering::SeqCst) >= 1,
        "the admin queue is woken"
    );
    let c = a.expect_completion(aer);
    assert_eq!(
        AsyncEvent::decode(c.result.get() as u32),
        AsyncEvent::NS_CHANGED
    );
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, false);
    assert_eq!(decode_ns_list(r.ok_data()), vec![3, 4]);
    // Cleared on read (RAE = 0).
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, false);
    assert_eq!(decode_ns_list(r.ok_data()), Vec::<u32>::new());
    // The I/O path sees the new table: NSID 4 on its device, NSID 3 on the new one.
    match q.rw(io::READ, 4, 1, 1, 12) {
        Reply::Io(op, _) => assert_eq!((op.device, op.offset), (21, 4096)),
        r => panic!("{r:?}"),
    }
    match q.rw(io::READ, 3, (1 << 21) - 1, 1, 9) {
        Reply::Io(op, _) => assert_eq!(op.device, 20),
        r => panic!("{r:?}"),
    }
    // Removing NSID 4 again: I/O to it gets Invalid Namespace; the event fires again since
    // the log was read.
    let aer = match a.simple(admin::ASYNC_EVENT_REQUEST) {
        Reply::Deferred(cmd) => cmd.sqe.cid(),
        r => panic!("{r:?}"),
    };
    s[0].namespaces.pop();
    let r = t.reconfigure(s, test_listeners());
    assert_eq!(r.namespaces_changed, vec![(SUBNQN.to_string(), vec![4])]);
    assert_eq!(
        q.rw(io::READ, 4, 0, 1, 12).status(),
        Status::INVALID_NS.dnr()
    );
    a.expect_completion(aer);
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, false);
    assert_eq!(decode_ns_list(r.ok_data()), vec![4]);
}

#[test]
fn a_host_that_disabled_the_notice_gets_no_event_but_the_list() {
    let (t, mut a, _q) = ready(tcp_caps());
    a.set_features(feat::ASYNC_EVENT, 0, &[]).ok_result();
    assert!(matches!(
        a.simple(admin::ASYNC_EVENT_REQUEST),
        Reply::Deferred(_)
    ));
    let mut s = test_subsystems();
    s[0].namespaces.push(ns(9, 64, 12, 30));
    t.reconfigure(s, test_listeners());
    assert!(a.q.poll_event().is_none());
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, false);
    assert_eq!(decode_ns_list(r.ok_data()), vec![9]);
}

#[test]
fn subsystems_come_and_go_and_host_lists_apply_to_new_connects() {
    let (t, mut a, mut q) = ready(tcp_caps());
    let mut r_host = Host::new(&t, tcp_caps(), Instant::now());
    r_host.bring_up(RESTRICTED, OTHER_HOST);
    assert_eq!(t.controller_count(), 2);
    let gen = t.genctr();

    // RESTRICTED removed, ADDED new (any host), SUBNQN now only allows OTHER_HOST.
    let mut s = test_subsystems();
    s.remove(1);
    s[0].hosts = vec![OTHER_HOST.into()];
    s.push(SubsystemSpec {
        nqn: ADDED.into(),
        serial: "NVMFRS0003".into(),
        model: "nvmf-rs added".into(),
        allow_any_host: true,
        hosts: vec![],
        auth_policy: Default::default(),
        namespaces: vec![ns(1, 128, 12, 40)],
    });
    let r = t.reconfigure(s.clone(), test_listeners());
    assert_eq!(r.subsystems_added, vec![ADDED.to_string()]);
    assert_eq!(r.subsystems_removed, vec![RESTRICTED.to_string()]);
    assert_eq!(r.hosts_changed, vec![SUBNQN.to_string()]);
    assert_eq!(r.controllers_disconnected, 1);
    assert!(t.genctr() > gen, "the discovery log changed");

    // The removed subsystem's controller is torn down through its queue.
    match r_host.q.poll_event() {
        Some(QueueEvent::Disconnect(why)) => assert!(why.contains("removed"), "{why}"),
        e => panic!("{e:?}"),
    }
    assert_eq!(t.controller_count(), 1);
    // The connected host of SUBNQN keeps working although it is no longer allowed...
    assert!(a.simple(admin::KEEP_ALIVE).status().is_success());
    assert!(matches!(q.rw(io::READ, 1, 0, 1, 12), Reply::Io(..)));
    // ...but it cannot connect again, while OTHER_HOST now can; ADDED takes anyone.
    let mut h = Host::new(&t, tcp_caps(), Instant::now());
    assert!(!h.connect_admin(SUBNQN, HOSTNQN, 5000).status().is_success());
    let mut h = Host::new(&t, tcp_caps(), Instant::now());
    h.bring_up(SUBNQN, OTHER_HOST);
    let mut h = Host::new(&t, tcp_caps(), Instant::now());
    h.bring_up(ADDED, HOSTNQN);
    let mut h = Host::new(&t, tcp_caps(), Instant::now());
    assert!(!h
        .connect_admin(RESTRICTED, OTHER_HOST, 5000)
        .status()
        .is_success());

    // A listener added: the discovery log changes again.
    let gen = t.genctr();
    let r = t.reconfigure(s, t_listeners(&["4420", "4421"]));
    assert!(r.listeners_changed && r.discovery_changed());
    assert!(t.genctr() > gen);
}

#[test]
fn a_new_serial_replaces_the_subsystem() {
    let (t, mut a, _q) = ready(tcp_caps());
    let mut s = test_subsystems();
    s[0].serial = "NVMFRS9999".into();
    let r = t.reconfigure(s, test_listeners());
    assert_eq!(r.subsystems_replaced, vec![SUBNQN.to_string()]);
    assert_eq!(r.controllers_disconnected, 1);
    assert!(matches!(a.q.poll_event(), Some(QueueEvent::Disconnect(_))));
    let mut h = Host::new(&t, tcp_caps(), Instant::now());
    h.bring_up(SUBNQN, HOSTNQN);
}

#[test]
fn discovery_controllers_hear_of_discovery_log_changes() {
    let t = test_target();
    let mut d = Host::new(&t, tcp_caps(), Instant::now());
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    d.bring_up(DISCOVERY_NQN, HOSTNQN);
    d.q.set_waker(Arc::new(move || {
        m.fetch_add(1, Ordering::SeqCst);
    }));
    let aer = match d.simple(admin::ASYNC_EVENT_REQUEST) {
        Reply::Deferred(cmd) => cmd.sqe.cid(),
        r => panic!("{r:?}"),
    };
    let mut s = test_subsystems();
    s.remove(1);
    t.reconfigure(s, test_listeners());
    assert!(n.load(Ordering::SeqCst) >= 1);
    let c = d.expect_completion(aer);
    assert_eq!(
        AsyncEvent::decode(c.result.get() as u32),
        AsyncEvent::DISCOVERY_CHANGED
    );
}

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

/// A subsystem removed moments ago may come back (a remove and add by `ctl`, a gateway between
/// configurations): a Connect for it is refused without DNR, so the host retries (the Linux
/// 6.12 host deletes its controller after a DNR refusal). A name never configured, or removed
/// long ago, is refused with DNR; added back, it connects.
#[test]
fn a_connect_to_a_subsystem_removed_moments_ago_may_be_retried() {
    let (t, _a, _q) = ready(tcp_caps());
    let mut without = test_subsystems();
    without.retain(|s| s.nqn != SUBNQN);
    let r = t.reconfigure(without, test_listeners());
    assert_eq!(r.subsystems_removed, vec![SUBNQN.to_string()]);
    let now = Instant::now();
    let mut h = Host::new(&t, tcp_caps(), now);
    assert_eq!(
        h.connect_admin(SUBNQN, HOSTNQN, 0).status(),
        Status::CONNECT_INVALID_PARAM
    );
    let mut h = Host::new(&t, tcp_caps(), now);
    assert_eq!(
        h.connect_admin("nqn.2024-01.io.nvmf-rs:never", HOSTNQN, 0)
            .status(),
        Status::CONNECT_INVALID_PARAM.dnr()
    );
    // Long after the removal: no such subsystem.
    let mut h = Host::new(&t, tcp_caps(), now + GONE_GRACE + Duration::from_secs(1));
    assert_eq!(
        h.connect_admin(SUBNQN, HOSTNQN, 0).status(),
        Status::CONNECT_INVALID_PARAM.dnr()
    );
    // Back: it connects.
    t.reconfigure(test_subsystems(), test_listeners());
    let mut h = Host::new(&t, tcp_caps(), Instant::now());
    h.bring_up(SUBNQN, HOSTNQN);
}
