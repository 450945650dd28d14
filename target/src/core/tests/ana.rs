//! Asymmetric Namespace Access and listeners that serve some subsystems: what a host sees
//! through each listener (Identify, the ANA log, the I/O status), and a state change reaching
//! exactly the hosts on that path.

use nvme::identify::IdentifyNamespace;
use nvme::log::{ana_state, lid, AsyncEvent, GetLogPageCmd, ANA_LSP_RGO};
use zerocopy::FromBytes;

use super::*;

const L2: &str = "4421";

/// Listener 1 (192.0.2.1:4420) as `test_listeners`; listener 3 on port 4421 with group 1
/// non-optimized and group 2 inaccessible; listener 4 on 192.0.2.2:4420 serving RESTRICTED
/// only. SUBNQN's namespace 3 is in ANA group 2.
fn ana_target(group2_on_l2: u8) -> (Vec<SubsystemSpec>, Vec<ListenerInfo>) {
    let mut subs = test_subsystems();
    subs[0].namespaces[1].ana_group = 2;
    let mut ls = test_listeners();
    let mut l = ListenerInfo::new(TrType::Tcp, "192.0.2.1".into(), L2.into(), 3);
    l.set_ana(1, ana_state::NON_OPTIMIZED);
    l.set_ana(2, group2_on_l2);
    ls.push(l);
    let mut r = ListenerInfo::new(TrType::Tcp, "192.0.2.2".into(), "4420".into(), 4);
    r.subsystems = Some(vec![RESTRICTED.into()]);
    ls.push(r);
    (subs, ls)
}

fn host_on(t: &Arc<Target>, local: &str) -> Host {
    let mut h = Host::new(t, tcp_caps(), Instant::now());
    h.q.set_local_addr(local.parse().unwrap());
    h
}

fn ana_log(h: &mut Host, rgo: bool) -> Vec<u8> {
    let cid = h.next_cid();
    let dptr = h.sgl(4096, false).encode();
    let mut g = GetLogPageCmd::new(lid::ANA, 0, 4096, 0, false);
    g.lsp = if rgo { ANA_LSP_RGO } else { 0 };
    h.submit(g.to_sqe(cid, dptr), &[]).ok_data().to_vec()
}

/// (group, state, nsids) of each descriptor.
fn groups(log: &[u8]) -> Vec<(u32, u8, Vec<u32>)> {
    let le32 = |b: &[u8]| u32::from_le_bytes(b[..4].try_into().unwrap());
    let n = u16::from_le_bytes([log[8], log[9]]) as usize;
    let mut at = 16;
    let mut out = Vec::new();
    for _ in 0..n {
        let (grp, nn, state) = (
            le32(&log[at..]),
            le32(&log[at + 4..]) as usize,
            log[at + 16],
        );
        at += 32;
        let nsids = (0..nn).map(|i| le32(&log[at + 4 * i..])).collect();
        at += 4 * nn;
        out.push((grp, state, nsids));
    }
    out
}

#[test]
fn each_path_reports_and_enforces_its_states() {
    let (subs, ls) = ana_target(ana_state::INACCESSIBLE);
    let t = Target::new(subs, ls, test_target_params());
    // Through listener 3: group 1 non-optimized, group 2 inaccessible.
    let mut a = host_on(&t, "192.0.2.1:4421");
    let cntlid = a.bring_up(SUBNQN, HOSTNQN);
    let r = a.identify(cns::NS, 3, 0);
    let id = IdentifyNamespace::read_from_bytes(r.ok_data()).unwrap();
    assert_eq!(id.anagrpid.get(), 2);
    assert_eq!(
        id.nmic & 1,
        1,
        "shared: the Linux host builds one multipath disk"
    );
    assert_eq!(
        groups(&ana_log(&mut a, false)),
        vec![
            (1, ana_state::NON_OPTIMIZED, vec![1]),
            (2, ana_state::INACCESSIBLE, vec![3])
        ]
    );
    assert!(
        groups(&ana_log(&mut a, true))
            .iter()
            .all(|g| g.2.is_empty()),
        "RGO"
    );
    a.set_features(feat::NUM_QUEUES, 0, &[]).ok_result();
    let mut q = host_on(&t, "192.0.2.1:4421");
    q.connect(1, 31, 0, &ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN))
        .ok_result();
    assert!(
        matches!(q.rw(io::READ, 1, 0, 1, 12), Reply::Io(..)),
        "non-optimized serves"
    );
    let c = q.rw(io::READ, 3, 0, 1, 9).cqe();
    assert_eq!(
        c.status(),
        Status::ANA_INACCESSIBLE,
        "no DNR: another path may serve it"
    );
    // Through listener 1 the same namespace is served.
    let mut b = host_on(&t, "192.0.2.1:4420");
    b.bring_up(SUBNQN, HOSTNQN);
    assert_eq!(
        groups(&ana_log(&mut b, false)),
        vec![
            (1, ana_state::OPTIMIZED, vec![1]),
            (2, ana_state::OPTIMIZED, vec![3])
        ]
    );
}

#[test]
fn a_listener_serves_only_its_subsystems() {
    let (subs, ls) = ana_target(ana_state::OPTIMIZED);
    let t = Target::new(subs, ls, test_target_params());
    let mut h = host_on(&t, "192.0.2.2:4420");
    let c = h.connect_admin(SUBNQN, HOSTNQN, 5000).cqe();
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAM.dnr());
    let mut h = host_on(&t, "192.0.2.2:4420");
    h.connect_admin(RESTRICTED, OTHER_HOST, 5000).ok_result();
    // Its discovery log lists what it serves; listener 1's lists everything the host may see.
    let names = |local: &str, host: &str| {
        let mut d = host_on(&t, local);
        d.connect_admin(DISCOVERY_NQN, host, 0).ok_result();
        d.prop_set(reg::CC, Cc::new(true, 0, 0, 0, 0, 6, 4).0 as u64)
            .ok_result();
        let log = d
            .get_log(lid::DISCOVERY, 0, 8192, 0, false)
            .ok_data()
            .to_vec();
        let n = u64::from_le_bytes(log[8..16].try_into().unwrap()) as usize;
        (0..n)
            .map(|i| {
                let e = &log[1024 * (i + 1)..1024 * (i + 2)];
                let nqn = &e[256..512];
                let port = String::from_utf8_lossy(&e[32..64])
                    .trim_end_matches('\0')
                    .to_string();
                let nqn = String::from_utf8_lossy(nqn)
                    .trim_end_matches('\0')
                    .to_string();
                (port, nqn)
            })
            .collect::<Vec<_>>()
    };
    let from_restricted = names("192.0.2.2:4420", OTHER_HOST);
    assert!(
        from_restricted.iter().all(|(_, n)| n != SUBNQN),
        "{from_restricted:?}"
    );
    assert!(from_restricted.iter().any(|(_, n)| n == RESTRICTED));
    let from_l1 = names("192.0.2.1:4420", HOSTNQN);
    assert!(from_l1.iter().any(|(p, n)| p == "4420" && n == SUBNQN));
    // Listener 4 does not serve SUBNQN, so no entry for it names SUBNQN anywhere.
    assert_eq!(
        from_l1.iter().filter(|(_, n)| n == SUBNQN).count(),
        3,
        "{from_l1:?}"
    );
}

#[test]
fn a_state_change_reaches_the_hosts_on_that_path() {
    let (subs, ls) = ana_target(ana_state::INACCESSIBLE);
    let t = Target::new(subs.clone(), ls, test_target_params());
    let mut a = host_on(&t, "192.0.2.1:4421");
    let cntlid = a.bring_up(SUBNQN, HOSTNQN);
    a.set_features(feat::NUM_QUEUES, 0, &[]).ok_result();
    let mut q = host_on(&t, "192.0.2.1:4421");
    q.connect(1, 31, 0, &ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN))
        .ok_result();
    let mut b = host_on(&t, "192.0.2.1:4420");
    b.bring_up(SUBNQN, HOSTNQN);
    let aer = |h: &mut Host| match h.simple(admin::ASYNC_EVENT_REQUEST) {
        Reply::Deferred(cmd) => cmd.sqe.cid(),
        r => panic!("{r:?}"),
    };
    let (aer_a, _aer_b) = (aer(&mut a), aer(&mut b));
    assert_eq!(
        q.rw(io::READ, 3, 0, 1, 9).cqe().status(),
        Status::ANA_INACCESSIBLE
    );
    let before = u64::from_le_bytes(ana_log(&mut a, false)[..8].try_into().unwrap());
    // Group 2 becomes optimized on listener 3 (a reload or `ctl set-ana-state`).
    let (_, ls) = ana_target(ana_state::OPTIMIZED);
    let r = t.reconfigure(subs, ls);
    assert_eq!(r.ana_changed.len(), 1);
    assert!(!r.discovery_changed(), "{r:?}");
    let c = a.expect_completion(aer_a);
    assert_eq!(
        AsyncEvent::decode(c.result.get() as u32),
        AsyncEvent::ANA_CHANGE
    );
    assert!(b.q.poll_event().is_none(), "the other path did not change");
    let log = ana_log(&mut a, false);
    assert!(
        u64::from_le_bytes(log[..8].try_into().unwrap()) > before,
        "change count"
    );
    assert_eq!(groups(&log)[1], (2, ana_state::OPTIMIZED, vec![3]));
    assert!(
        matches!(q.rw(io::READ, 3, 0, 1, 9), Reply::Io(..)),
        "the I/O queue sees it"
    );
    // The log was read without RAE: the next change raises the event again.
    let aer_a = aer(&mut a);
    let (_, ls) = ana_target(ana_state::CHANGE);
    t.reconfigure(test_subsystems_ana(), ls);
    let c = a.expect_completion(aer_a);
    assert_eq!(
        AsyncEvent::decode(c.result.get() as u32),
        AsyncEvent::ANA_CHANGE
    );
    assert_eq!(
        q.rw(io::READ, 3, 0, 1, 9).cqe().status(),
        Status::ANA_TRANSITION
    );
}

fn test_subsystems_ana() -> Vec<SubsystemSpec> {
    ana_target(0).0
}

#[test]
fn a_removed_listener_keeps_its_hosts_states_until_it_comes_back() {
    let (subs, ls) = ana_target(ana_state::INACCESSIBLE);
    let t = Target::new(subs.clone(), ls.clone(), test_target_params());
    let mut a = host_on(&t, "192.0.2.1:4421");
    let cntlid = a.bring_up(SUBNQN, HOSTNQN);
    a.set_features(feat::NUM_QUEUES, 0, &[]).ok_result();
    let mut q = host_on(&t, "192.0.2.1:4421");
    q.connect(1, 31, 0, &ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN))
        .ok_result();
    assert_eq!(
        q.rw(io::READ, 3, 0, 1, 9).cqe().status(),
        Status::ANA_INACCESSIBLE
    );
    // Listener 3 removed: the connected host stays, with the states it was told.
    let without: Vec<ListenerInfo> = ls.iter().filter(|l| l.trsvcid != L2).cloned().collect();
    t.reconfigure(subs.clone(), without);
    assert_eq!(
        q.rw(io::READ, 3, 0, 1, 9).cqe().status(),
        Status::ANA_INACCESSIBLE
    );
    // Added back with every group optimized: its hosts are told, and served.
    let aer = match a.simple(admin::ASYNC_EVENT_REQUEST) {
        Reply::Deferred(cmd) => cmd.sqe.cid(),
        r => panic!("{r:?}"),
    };
    let mut back = test_listeners();
    back.push(ListenerInfo::new(
        TrType::Tcp,
        "192.0.2.1".into(),
        L2.into(),
        3,
    ));
    let r = t.reconfigure(subs, back);
    assert!(r.ana_changed.iter().any(|l| l.trsvcid == L2), "{r:?}");
    let c = a.expect_completion(aer);
    assert_eq!(
        AsyncEvent::decode(c.result.get() as u32),
        AsyncEvent::ANA_CHANGE
    );
    assert!(matches!(q.rw(io::READ, 3, 0, 1, 9), Reply::Io(..)));
}
