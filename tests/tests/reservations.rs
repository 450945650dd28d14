//! Persistent reservations between two hosts (two initiators with different Host Identifiers)
//! against the real `nvmf-target` binary over loopback NVMe/TCP: the holder writes, the other
//! registrant reads but gets Reservation Conflict on writes, Report names both, a preempt
//! fences the first host out, and a Clear opens the namespace again.

use initiator::resv::{
    AcquireAction, ChangePtpl, RegisterAction, RegisterCmd, ReleaseAction, ReleaseCmd, ResvType,
};
use initiator::{ConnectOptions, Controller, Namespace};
use nvmf_tests::resv::{acquire, conflict, open, register};
use nvmf_tests::{TargetProc, TEST_NQN};

#[test]
fn two_initiators_share_a_namespace_under_a_reservation() {
    let t = TargetProc::start_default();
    let (_ca, mut a, id_a) = open(&t);
    let (_cb, mut b, id_b) = open(&t);
    assert_ne!(id_a, id_b);
    let block = vec![0x5au8; 4096];
    let mut back = vec![0u8; 4096];

    register(&mut a, 0xaaaa).unwrap();
    register(&mut b, 0xbbbb).unwrap();
    acquire(
        &mut a,
        AcquireAction::Acquire,
        ResvType::WriteExclusive,
        0xaaaa,
        0,
    )
    .unwrap();
    a.write_at(&block, 0).unwrap();
    // B: reads pass, writes of every kind conflict.
    b.read_at(&mut back, 0).unwrap();
    assert_eq!(back, block);
    conflict(b.write_at(&block, 4096));
    conflict(b.write_zeroes(0, 4096));
    conflict(b.flush());
    conflict(b.trim(&[(0, 4096)]));
    conflict(acquire(
        &mut b,
        AcquireAction::Acquire,
        ResvType::WriteExclusive,
        0xbbbb,
        0,
    ));

    let r = b.reservation_report().unwrap();
    assert_eq!(r.rtype, Some(ResvType::WriteExclusive));
    assert_eq!(r.registrants, [(id_a, 0xaaaa, true), (id_b, 0xbbbb, false)]);

    // B preempts A into Exclusive Access: A loses its registration and even reads conflict.
    acquire(
        &mut b,
        AcquireAction::Preempt,
        ResvType::ExclusiveAccess,
        0xbbbb,
        0xaaaa,
    )
    .unwrap();
    conflict(a.read_at(&mut back, 0));
    conflict(a.write_at(&block, 0));
    b.write_at(&block, 4096).unwrap();
    let r = a.reservation_report().unwrap();
    assert_eq!(r.registrants, [(id_b, 0xbbbb, true)]);

    // Clear: A writes again.
    b.reservation_release(&ReleaseCmd {
        action: ReleaseAction::Clear,
        ignore_key: false,
        rtype: 0,
        crkey: 0xbbbb,
    })
    .unwrap();
    a.write_at(&block, 8192).unwrap();
    assert_eq!(a.reservation_report().unwrap().regctl, 0);

    // Preempt and Abort (nothing of B's in flight: it completes at once) fences B out.
    register(&mut a, 0xaaaa).unwrap();
    register(&mut b, 0xbbbb).unwrap();
    acquire(
        &mut b,
        AcquireAction::Acquire,
        ResvType::WriteExclusive,
        0xbbbb,
        0,
    )
    .unwrap();
    acquire(
        &mut a,
        AcquireAction::PreemptAndAbort,
        ResvType::WriteExclusive,
        0xaaaa,
        0xbbbb,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    conflict(b.write_at(&block, 0));
    a.write_at(&block, 0).unwrap();
    // Compare is in the read group: B may compare under Write Exclusive.
    assert!(b.compare_at(&block, 0).unwrap());
}

/// With Persist Through Power Loss on (Register with CPTPL = 11b), the registrations and the
/// reservation survive the target being killed (SIGKILL: no shutdown path runs) and restarted;
/// once a host turns PTPL off, a restart starts from nothing. The namespace is a file, so
/// Identify says it can persist (RESCAP bit 0).
#[test]
fn reservations_survive_a_restart_with_ptpl() {
    let mut t = TargetProc::start_default();
    let oa = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    let ob = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    let connect = |o: &ConnectOptions| {
        let mut c = Controller::connect(o.clone()).unwrap();
        let ns = c.open_namespace(1).unwrap();
        (c, ns)
    };
    let mut back = vec![0u8; 4096];
    let ptpl = |ns: &mut Namespace, key: u64, ptpl| {
        ns.reservation_register(&RegisterCmd {
            action: RegisterAction::Register,
            ignore_key: false,
            ptpl,
            crkey: 0,
            nrkey: key,
        })
    };
    {
        let (ca, mut a) = connect(&oa);
        let id = ca.identify(nvme::identify::cns::NS, 1).unwrap();
        assert_eq!(id[31] & 1, 1, "RESCAP: PTPL capable");
        let (_cb, mut b) = connect(&ob);
        ptpl(&mut a, 0xa, ChangePtpl::Set).unwrap();
        register(&mut b, 0xb).unwrap();
        acquire(
            &mut a,
            AcquireAction::Acquire,
            ResvType::ExclusiveAccess,
            0xa,
            0,
        )
        .unwrap();
        conflict(b.read_at(&mut back, 0));
    }
    let before = {
        let (_c, mut a) = connect(&oa);
        a.reservation_report().unwrap()
    };
    assert!(before.ptpl);
    t.kill_and_restart();
    {
        let (_ca, mut a) = connect(&oa);
        let (_cb, mut b) = connect(&ob);
        assert_eq!(a.reservation_report().unwrap(), before, "{}", t.log_text());
        conflict(b.read_at(&mut back, 0));
        a.read_at(&mut back, 0).unwrap();
        // PTPL off: the same key registered again with CPTPL = 10b.
        ptpl(&mut a, 0xa, ChangePtpl::Clear).unwrap();
    }
    t.kill_and_restart();
    let (_cb, mut b) = connect(&ob);
    let r = b.reservation_report().unwrap();
    assert_eq!((r.rtype, r.regctl, r.ptpl), (None, 0, false));
    b.read_at(&mut back, 0).unwrap();
}
