//! In-band authentication (DH-HMAC-CHAP) through the queue: a host with a key gets ATR at
//! Connect, nothing but Authentication Send/Receive before it authenticates, and a failed or
//! stalled transaction tears the queue down after the host was told.

use nvme::auth::{failure, secp, AuthMessage, DhGroup, HashId, HostStep, HostTxn, Policy, Secret};
use nvme::fabrics::AUTHREQ_ATR;
use nvme::tls::PskIdentity;

use super::*;

const KEYED: &str = "nqn.2024-01.io.nvmf-rs:keyed";

fn secret(fill: u8) -> Secret {
    Secret::from_key(&[fill; 32], Some(HashId::Sha256)).unwrap()
}

fn keyed_target(ctrl_key: Option<Secret>, policy: Policy) -> Arc<Target> {
    keyed_target_with(ctrl_key, policy, test_listeners())
}

fn keyed_target_with(
    ctrl_key: Option<Secret>,
    policy: Policy,
    listeners: Vec<ListenerInfo>,
) -> Arc<Target> {
    let mut subs = test_subsystems();
    subs.push(SubsystemSpec {
        nqn: KEYED.into(),
        serial: "NVMFRS0003".into(),
        model: "nvmf-rs keyed".into(),
        allow_any_host: false,
        hosts: vec![HostSpec {
            nqn: HOSTNQN.into(),
            keys: Some(HostKeys {
                host: secret(1),
                ctrl: ctrl_key,
            }),
            tls_psk: None,
        }],
        auth_policy: policy,
        namespaces: vec![ns(1, 64, 12, 9)],
    });
    Target::new(
        subs,
        listeners,
        TargetParams {
            auth_timeout: Duration::from_secs(10),
            ..test_target_params()
        },
    )
}

impl Host {
    fn auth_sqe(&mut self, send: bool, len: u32) -> Sqe {
        let cid = self.next_cid();
        let sgl = self.sgl(len, send);
        nvme::fabrics::auth_sqe(cid, send, len, sgl)
    }

    fn auth_send(&mut self, msg: &[u8]) -> Reply {
        let sqe = self.auth_sqe(true, msg.len() as u32);
        self.submit(sqe, msg)
    }

    /// Authentication Receive with the Linux host's 4096-byte allocation.
    fn auth_recv(&mut self) -> Vec<u8> {
        let sqe = self.auth_sqe(false, 4096);
        let r = self.submit(sqe, &[]);
        let data = r.ok_data().to_vec();
        assert_eq!(data.len(), 4096, "the whole allocation comes back");
        data
    }

    /// One whole transaction with `txn`; the host's verdict.
    fn authenticate(&mut self, txn: &mut HostTxn) -> Result<(), nvme::auth::AuthFailure> {
        let mut rng = |b: &mut [u8]| {
            b.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = i as u8 ^ 0x5c)
        };
        assert!(self.auth_send(&txn.negotiate()).status().is_success());
        let reply = txn.on_challenge(&self.auth_recv(), &mut rng)?;
        assert!(self.auth_send(&reply).status().is_success());
        match txn.on_success1(&self.auth_recv())? {
            HostStep::Done => Ok(()),
            HostStep::SendAndDone(s2) => {
                assert!(self.auth_send(&s2).status().is_success());
                Ok(())
            }
            HostStep::Send(_) => unreachable!(),
        }
    }
}

fn txn(key: Secret, ctrl: Option<Secret>, t_id: u16) -> HostTxn {
    HostTxn::new(Policy::default(), key, ctrl, HOSTNQN, KEYED, t_id)
}

#[test]
fn a_keyed_host_authenticates_every_queue_before_anything_else() {
    let t = keyed_target(None, Policy::default());
    let now = Instant::now();
    let mut admin = Host::new(&t, tcp_caps(), now);
    let r = admin.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
    let ConnectResult::Success { cntlid, authreq } = ConnectResult::decode(r, false) else {
        unreachable!()
    };
    assert_eq!(authreq, AUTHREQ_ATR, "DW0 bit 17");
    assert_eq!(r >> 17 & 1, 1);
    // Nothing else before authentication: not even a property.
    assert_eq!(
        admin.prop_get(reg::CAP, PropSize::Eight).status(),
        Status::AUTH_REQUIRED.dnr()
    );
    admin.authenticate(&mut txn(secret(1), None, 0)).unwrap();
    let cc = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
    assert!(admin.prop_set(reg::CC, cc.0 as u64).status().is_success());
    assert!(admin.identify(cns::CTRL, 0, 0).status().is_success());

    // An I/O queue: ATR again, and I/O waits for its own transaction.
    let mut io = Host::new(&t, tcp_caps(), now);
    let d = ConnectData::new(HOSTID, cntlid, KEYED, HOSTNQN);
    let r = io.connect(1, 31, 0, &d).ok_result();
    assert_eq!(
        ConnectResult::decode(r, false),
        ConnectResult::Success {
            cntlid,
            authreq: AUTHREQ_ATR
        }
    );
    assert_eq!(
        io.rw(io::READ, 1, 0, 1, 12).status(),
        Status::AUTH_REQUIRED.dnr()
    );
    io.authenticate(&mut txn(secret(1), None, 1)).unwrap();
    assert!(matches!(io.rw(io::READ, 1, 0, 1, 12), Reply::Io(..)));

    // Re-authentication on a live queue keeps it usable throughout.
    assert!(admin
        .auth_send(&txn(secret(1), None, 2).negotiate())
        .status()
        .is_success());
    assert!(admin.identify(cns::CTRL, 0, 0).status().is_success());

    // The same host on a subsystem where it has no key: no ATR, Authentication refused.
    let mut plain = Host::new(&t, tcp_caps(), now);
    let r = plain.connect_admin(SUBNQN, HOSTNQN, 5000).ok_result();
    assert_eq!(r >> 16, 0);
    assert_eq!(
        plain
            .auth_send(&txn(secret(1), None, 0).negotiate())
            .status(),
        Status::INVALID_OPCODE.dnr()
    );
}

#[test]
fn bidirectional_with_every_hash_and_group() {
    for h in HashId::ALL {
        for g in [DhGroup::Null, DhGroup::Ffdhe2048] {
            let policy = Policy {
                hashes: vec![h],
                dhgroups: vec![g],
            };
            let t = keyed_target(Some(secret(9)), policy);
            let mut admin = Host::new(&t, tcp_caps(), Instant::now());
            admin.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
            let mut x = txn(secret(1), Some(secret(9)), 0);
            admin
                .authenticate(&mut x)
                .unwrap_or_else(|e| panic!("{h} {g}: {e}"));
            assert_eq!(x.hash(), h);
            assert!(admin
                .prop_get(reg::CAP, PropSize::Eight)
                .status()
                .is_success());
        }
    }
}

#[test]
fn a_wrong_key_is_told_then_torn_down() {
    let t = keyed_target(None, Policy::default());
    let mut admin = Host::new(&t, tcp_caps(), Instant::now());
    admin.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
    let e = admin
        .authenticate(&mut txn(secret(2), None, 0))
        .unwrap_err();
    assert_eq!(e.step, "reply");
    assert_eq!(e.explanation, failure::FAILED);
    // Still refused, and not gone before the grace ends.
    assert_eq!(
        admin.prop_get(reg::CAP, PropSize::Eight).status(),
        Status::AUTH_REQUIRED.dnr()
    );
    assert!(admin.q.poll_event().is_none());
    let d = admin.q.poll_timeout().expect("a teardown is scheduled");
    admin.q.handle_timeout(d);
    assert!(matches!(
        admin.q.poll_event(),
        Some(QueueEvent::Disconnect(_))
    ));
    assert_eq!(t.controller_count(), 0);
}

#[test]
fn a_wrong_controller_key_fails_on_the_hosts_side() {
    let t = keyed_target(Some(secret(9)), Policy::default());
    let mut admin = Host::new(&t, tcp_caps(), Instant::now());
    admin.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
    let mut x = txn(secret(1), Some(secret(8)), 0);
    let e = admin.authenticate(&mut x).unwrap_err();
    assert_eq!(e.step, "success1");
    // The host says so with Failure2: the queue is finished.
    assert!(admin.auth_send(&x.failure2(&e)).status().is_success());
    assert_eq!(
        admin.prop_get(reg::CAP, PropSize::Eight).status(),
        Status::AUTH_REQUIRED.dnr()
    );
}

#[test]
fn a_host_that_stalls_loses_its_controller() {
    let t = keyed_target(None, Policy::default());
    let now = Instant::now();
    let mut admin = Host::new(&t, tcp_caps(), now);
    admin.connect_admin(KEYED, HOSTNQN, 0).ok_result();
    assert!(admin
        .auth_send(&txn(secret(1), None, 0).negotiate())
        .status()
        .is_success());
    let d = admin.q.poll_timeout().unwrap();
    assert_eq!(d, now + Duration::from_secs(10));
    admin.q.handle_timeout(d - Duration::from_millis(1));
    assert!(admin.q.poll_event().is_none());
    admin.q.handle_timeout(d);
    assert!(matches!(
        admin.q.poll_event(),
        Some(QueueEvent::Disconnect(_))
    ));
    assert_eq!(t.controller_count(), 0);
}

#[test]
fn out_of_order_and_malformed_messages_get_failure1() {
    let t = keyed_target(None, Policy::default());
    let mut admin = Host::new(&t, tcp_caps(), Instant::now());
    admin.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
    // A Receive before any Negotiate: Failure1 at once.
    let m = admin.auth_recv();
    assert!(
        matches!(AuthMessage::decode(&m), Ok(AuthMessage::Failure1(f)) if f.rescode_exp == failure::INCORRECT_MESSAGE)
    );
    // Bad SECP / zero length: Invalid Field.
    let mut admin = Host::new(&t, tcp_caps(), Instant::now());
    admin.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
    let mut sqe = admin.auth_sqe(true, 72);
    sqe.cdw10.set(0x0101_0100);
    assert_eq!(
        admin.submit(sqe, &[0; 72]).status(),
        Status::INVALID_FIELD.dnr()
    );
    let sqe = admin.auth_sqe(false, 0);
    assert_eq!(admin.submit(sqe, &[]).status(), Status::INVALID_FIELD.dnr());
    // Garbage as a Send: the Receive gets Failure1.
    assert!(admin
        .auth_send(&[0, 0, 0, 0, 1, 0, 0, 0])
        .status()
        .is_success());
    let m = admin.auth_recv();
    assert!(
        matches!(AuthMessage::decode(&m), Ok(AuthMessage::Failure1(_))),
        "{:?}",
        &m[..8]
    );
}

#[test]
fn rotated_keys_apply_to_the_next_transaction_and_removed_ones_fail_it() {
    let t = keyed_target(None, Policy::default());
    let mut admin = Host::new(&t, tcp_caps(), Instant::now());
    admin.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
    admin.authenticate(&mut txn(secret(1), None, 0)).unwrap();
    // A reload gives the host a new key: the controller stays, re-authentication takes it.
    let with = |key: Option<Secret>| {
        let mut subs = test_subsystems();
        subs.push(SubsystemSpec {
            nqn: KEYED.into(),
            serial: "NVMFRS0003".into(),
            model: "nvmf-rs keyed".into(),
            allow_any_host: false,
            hosts: vec![HostSpec {
                nqn: HOSTNQN.into(),
                keys: key.map(|host| HostKeys { host, ctrl: None }),
                tls_psk: None,
            }],
            auth_policy: Policy::default(),
            namespaces: vec![ns(1, 64, 12, 9)],
        });
        subs
    };
    let r = t.reconfigure(with(Some(secret(5))), test_listeners());
    assert_eq!(r.hosts_changed, vec![KEYED.to_string()]);
    assert!(admin
        .prop_get(reg::CAP, PropSize::Eight)
        .status()
        .is_success());
    let e = admin
        .authenticate(&mut txn(secret(1), None, 1))
        .unwrap_err();
    assert_eq!(e.step, "reply", "the old key no longer answers");
    let mut admin = Host::new(&t, tcp_caps(), Instant::now());
    admin.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
    admin.authenticate(&mut txn(secret(5), None, 0)).unwrap();
    // The key taken away: the host's next transaction fails, told by Failure1.
    t.reconfigure(with(None), test_listeners());
    let e = admin
        .authenticate(&mut txn(secret(5), None, 1))
        .unwrap_err();
    assert!(e.detail.contains("rejected the host"), "{e}");
}

// ---- secure channel concatenation --------------------------------------------------------

/// The test listeners, the NVMe/TCP one with `tls: allowed`.
fn tls_listeners() -> Vec<ListenerInfo> {
    let mut l = test_listeners();
    l[0].tls = Some(config::TlsMode::Allowed);
    l
}

/// A host's queue through the NVMe/TCP listener, over TLS keyed for `tls` or plain.
fn tcp_host(t: &Arc<Target>, tls: Option<&PskIdentity>) -> Host {
    let mut h = Host::new(t, tcp_caps(), Instant::now());
    h.q.set_local_addr("192.0.2.1:4420".parse().unwrap());
    if let Some(id) = tls {
        h.q.set_tls_identity(id.clone());
    }
    h
}

fn connect_result(r: u64) -> (u16, u8) {
    match ConnectResult::decode(r, false) {
        ConnectResult::Success { cntlid, authreq } => (cntlid, authreq),
        other => panic!("{other:?}"),
    }
}

fn enable(h: &mut Host) {
    let cc = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
    assert!(h.prop_set(reg::CC, cc.0 as u64).status().is_success());
}

fn concat_txn(sc_c: u8, t_id: u16) -> HostTxn {
    txn(secret(1), None, t_id).with_concat(sc_c)
}

/// NEWTLSPSK on a plain admin queue generates the key the host's TLS queues are keyed with:
/// the target finds it by its identity, its queues need no authentication, and the
/// controller's I/O queues must come over TLS; REPLACETLSPSK over it retires it for a new one.
#[test]
fn concatenation_generates_the_psk_the_hosts_tls_queues_are_keyed_with() {
    let t = keyed_target_with(None, Policy::default(), tls_listeners());
    let mut plain = tcp_host(&t, None);
    let (cntlid, authreq) = connect_result(plain.connect_admin(KEYED, HOSTNQN, 5000).ok_result());
    assert_eq!(authreq, AUTHREQ_ATR);
    let mut h = concat_txn(secp::NEWTLSPSK, 0);
    plain.authenticate(&mut h).unwrap();
    let (hash, psk) = h.generated_psk().expect("the host generated a PSK");
    let id = PskIdentity::generated(hash, HOSTNQN, KEYED, psk);
    assert_eq!(t.inner().tls_psk(&id).unwrap(), id.tls_psk(psk));
    // The concatenating controller takes no plain I/O queue.
    enable(&mut plain);
    let d = ConnectData::new(HOSTID, cntlid, KEYED, HOSTNQN);
    let mut io = tcp_host(&t, None);
    assert_eq!(
        io.connect(1, 31, 0, &d).status(),
        Status::CONNECT_INVALID_PARAM.dnr()
    );

    // Over TLS with the generated key: no ATR, commands at once, on the I/O queues too.
    let mut admin = tcp_host(&t, Some(&id));
    let (cntlid, authreq) = connect_result(admin.connect_admin(KEYED, HOSTNQN, 5000).ok_result());
    assert_eq!(authreq, 0);
    enable(&mut admin);
    assert!(admin.identify(cns::CTRL, 0, 0).status().is_success());
    let d = ConnectData::new(HOSTID, cntlid, KEYED, HOSTNQN);
    let mut io = tcp_host(&t, Some(&id));
    let (_, authreq) = connect_result(io.connect(1, 31, 0, &d).ok_result());
    assert_eq!(authreq, 0);
    assert!(matches!(io.rw(io::READ, 1, 0, 1, 12), Reply::Io(..)));
    let mut plain_io = tcp_host(&t, None);
    assert_eq!(
        plain_io.connect(2, 31, 0, &d).status(),
        Status::CONNECT_INVALID_PARAM.dnr(),
        "a controller over TLS takes no plain I/O queue"
    );

    // REPLACETLSPSK in a re-authentication over the generated key: a successor, the old key
    // retired, the queue still carrying commands.
    let mut h = concat_txn(secp::REPLACETLSPSK, 1);
    admin.authenticate(&mut h).unwrap();
    let (hash, psk) = h.generated_psk().unwrap();
    let id2 = PskIdentity::generated(hash, HOSTNQN, KEYED, psk);
    assert_ne!(id2, id);
    assert!(
        t.inner().tls_psk(&id).is_err(),
        "the replaced key is retired"
    );
    assert_eq!(t.inner().tls_psk(&id2).unwrap(), id2.tls_psk(psk));
    assert!(admin.identify(cns::CTRL, 0, 0).status().is_success());

    // A new key over TLS is a mismatch (it is a replacement there).
    let mut again = tcp_host(&t, Some(&id2));
    again.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
    let f = again
        .authenticate(&mut concat_txn(secp::NEWTLSPSK, 2))
        .unwrap_err();
    assert_eq!(f.explanation, failure::CONCAT_MISMATCH, "{f}");
}

/// Concatenation only where a TLS channel can follow: an NVMe/TCP admin queue through a
/// listener with `tls`. Keys never negotiated here, or for a host without a DH-HMAC-CHAP key,
/// name nothing.
#[test]
fn concatenation_is_refused_where_no_tls_channel_can_follow() {
    let refused = |h: &mut Host, t_id| {
        let f = h
            .authenticate(&mut concat_txn(secp::NEWTLSPSK, t_id))
            .unwrap_err();
        assert_eq!(f.explanation, failure::CONCAT_MISMATCH, "{f}");
    };
    // A listener without `tls`.
    let t = keyed_target(None, Policy::default());
    let mut h = tcp_host(&t, None);
    h.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
    refused(&mut h, 0);
    // NVMe/RDMA.
    let t = keyed_target_with(None, Policy::default(), tls_listeners());
    let mut h = Host::new(&t, rdma_caps(), Instant::now());
    h.connect_admin(KEYED, HOSTNQN, 5000).ok_result();
    refused(&mut h, 0);
    // An I/O queue.
    let mut admin = tcp_host(&t, None);
    let (cntlid, _) = connect_result(admin.connect_admin(KEYED, HOSTNQN, 5000).ok_result());
    admin.authenticate(&mut txn(secret(1), None, 0)).unwrap();
    enable(&mut admin);
    let mut io = tcp_host(&t, None);
    let d = ConnectData::new(HOSTID, cntlid, KEYED, HOSTNQN);
    io.connect(1, 31, 0, &d).ok_result();
    refused(&mut io, 1);
    // Forged and keyless identities.
    let forged = PskIdentity::generated(HashId::Sha256, HOSTNQN, KEYED, &[7; 32]);
    let e = t.inner().tls_psk(&forged).unwrap_err();
    assert!(e.contains("no such generated PSK"), "{e}");
    let keyless = PskIdentity::generated(HashId::Sha256, OTHER_HOST, KEYED, &[7; 32]);
    let e = t.inner().tls_psk(&keyless).unwrap_err();
    assert!(e.contains("no DH-HMAC-CHAP key"), "{e}");
}
