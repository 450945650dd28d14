use super::*;

/// A deterministic "random" source for tests (an xorshift stream).
fn rng(seed: u64) -> impl FnMut(&mut [u8]) {
    let mut s = seed.max(1);
    move |buf: &mut [u8]| {
        for b in buf {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *b = s as u8;
        }
    }
}

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5b3d2a1c-0000-4000-8000-000000000001";
const SUB: &str = "nqn.2026-11.io.example:disk1";

fn key(n: usize, t: Option<HashId>, fill: u8) -> Secret {
    Secret::from_key(&vec![fill; n], t).unwrap()
}

/// Runs one whole transaction; the controller's result and the host's.
fn run(
    cp: Policy,
    hp: Policy,
    ctrl_side: (Secret, Option<Secret>),
    host_side: (Secret, Option<Secret>),
) -> (CtrlStep, Result<(), AuthFailure>) {
    let c = ControllerTxn::new(cp, ctrl_side.0, ctrl_side.1, HOST, SUB);
    let h = HostTxn::new(hp, host_side.0, host_side.1, HOST, SUB, 3);
    let (c, h, step, res) = run_txns(c, h, 7);
    drop((c, h));
    (step, res)
}

/// Runs one whole transaction between `c` and `h`; both sides afterwards and their results.
fn run_txns(
    mut c: ControllerTxn,
    mut h: HostTxn,
    seed: u64,
) -> (ControllerTxn, HostTxn, CtrlStep, Result<(), AuthFailure>) {
    let (step, res) = exchange(&mut c, &mut h, seed);
    (c, h, step, res)
}

fn exchange(
    c: &mut ControllerTxn,
    h: &mut HostTxn,
    seed: u64,
) -> (CtrlStep, Result<(), AuthFailure>) {
    let mut r = rng(seed);
    let step = c.on_send(&h.negotiate(), &mut r);
    if step != CtrlStep::Continue {
        return (step, Ok(()));
    }
    let (chal, step) = c.on_receive().unwrap();
    let reply = match h.on_challenge(&chal, &mut r) {
        Ok(m) => m,
        Err(e) => return (step, Err(e)),
    };
    assert_eq!(c.on_send(&reply, &mut r), CtrlStep::Continue);
    let (s1, step) = c.on_receive().unwrap();
    match h.on_success1(&s1) {
        Ok(HostStep::Done) => (step, Ok(())),
        Ok(HostStep::SendAndDone(s2)) => {
            assert_eq!(step, CtrlStep::Continue);
            (c.on_send(&s2, &mut r), Ok(()))
        }
        Ok(HostStep::Send(_)) => unreachable!(),
        Err(e) => {
            let f2 = h.failure2(&e);
            (c.on_send(&f2, &mut r), Err(e))
        }
    }
}

fn only(h: HashId, g: DhGroup) -> Policy {
    Policy {
        hashes: vec![h],
        dhgroups: vec![g],
    }
}

#[test]
fn every_hash_and_group_authenticates_both_ways() {
    for h in HashId::ALL {
        for g in DhGroup::ALL {
            let hk = key(48, Some(HashId::Sha384), 1);
            let ck = key(32, None, 2);
            let (c, hres) = run(
                only(h, g),
                only(h, g),
                (hk.clone(), Some(ck.clone())),
                (hk, Some(ck)),
            );
            assert_eq!(c, CtrlStep::Authenticated, "{h} {g}");
            assert_eq!(hres, Ok(()), "{h} {g}");
        }
    }
}

#[test]
fn unidirectional_is_done_after_success1() {
    let hk = key(32, Some(HashId::Sha256), 9);
    let (c, h) = run(
        Policy::default(),
        Policy::default(),
        (hk.clone(), None),
        (hk, None),
    );
    assert_eq!(c, CtrlStep::Authenticated);
    assert_eq!(h, Ok(()));
}

#[test]
fn a_wrong_host_key_gets_failure1() {
    let (c, h) = run(
        Policy::default(),
        Policy::default(),
        (key(32, None, 1), None),
        (key(32, None, 2), None),
    );
    assert!(
        matches!(c, CtrlStep::Failed(ref f) if f.explanation == failure::FAILED),
        "{c:?}"
    );
    let e = h.unwrap_err();
    assert_eq!(e.step, "reply");
    assert!(e.detail.contains("rejected the host"), "{e}");
}

#[test]
fn a_wrong_controller_key_is_caught_by_the_host() {
    let hk = key(32, None, 1);
    let (c, h) = run(
        Policy::default(),
        Policy::default(),
        (hk.clone(), Some(key(32, None, 5))),
        (hk, Some(key(32, None, 6))),
    );
    assert!(
        matches!(c, CtrlStep::Failed(_)),
        "the Failure2 ends it: {c:?}"
    );
    assert_eq!(h.unwrap_err().step, "success1");
}

/// A host entry with a controller key, and a host that authenticates only itself (nvme-cli's
/// `--dhchap-secret` alone): accepted, as nvmet 6.12 and SPDK accept it; a wrong host key is
/// still refused.
#[test]
fn a_host_that_does_not_challenge_the_controller_is_accepted_one_way() {
    let hk = key(32, None, 1);
    let (c, h) = run(
        Policy::default(),
        Policy::default(),
        (hk.clone(), Some(key(32, None, 5))),
        (hk, None),
    );
    assert!(matches!(c, CtrlStep::Authenticated), "{c:?}");
    assert!(h.is_ok(), "{h:?}");
    let (c, h) = run(
        Policy::default(),
        Policy::default(),
        (key(32, None, 1), Some(key(32, None, 5))),
        (key(32, None, 2), None),
    );
    assert!(matches!(c, CtrlStep::Failed(_)), "{c:?}");
    assert!(h.is_err());
}

#[test]
fn no_common_hash_or_group_is_refused_with_its_reason() {
    let hk = key(32, None, 1);
    let (c, _) = run(
        only(HashId::Sha512, DhGroup::Null),
        only(HashId::Sha256, DhGroup::Null),
        (hk.clone(), None),
        (hk.clone(), None),
    );
    assert!(matches!(c, CtrlStep::Failed(ref f) if f.explanation == failure::HASH_UNUSABLE));
    let (c, _) = run(
        only(HashId::Sha256, DhGroup::Ffdhe2048),
        only(HashId::Sha256, DhGroup::Null),
        (hk.clone(), None),
        (hk, None),
    );
    assert!(matches!(c, CtrlStep::Failed(ref f) if f.explanation == failure::DHGROUP_UNUSABLE));
}

#[test]
fn garbage_and_out_of_order_messages_fail_cleanly() {
    let mut r = rng(1);
    let mut c = ControllerTxn::new(Policy::default(), key(32, None, 1), None, HOST, SUB);
    assert_eq!(
        c.on_receive(),
        None,
        "nothing to receive before a Negotiate"
    );
    assert_eq!(c.on_send(&[1, 2, 3], &mut r), CtrlStep::Continue);
    let (m, step) = c.on_receive().unwrap();
    assert!(matches!(step, CtrlStep::Failed(ref f) if f.explanation == failure::INCORRECT_PAYLOAD));
    assert!(matches!(
        AuthMessage::decode(&m),
        Ok(AuthMessage::Failure1(_))
    ));
    // A Reply before any Negotiate.
    let mut c = ControllerTxn::new(Policy::default(), key(32, None, 1), None, HOST, SUB);
    let reply = Reply {
        t_id: 0,
        response: vec![0; 32],
        challenge: None,
        seqnum: 0,
        dh_value: vec![],
    };
    c.on_send(&reply.encode(), &mut r);
    let (_, step) = c.on_receive().unwrap();
    assert!(matches!(step, CtrlStep::Failed(ref f) if f.explanation == failure::INCORRECT_MESSAGE));
    // Truncated messages of every kind decode to errors, never panic.
    let n = Negotiate::new(1, &HashId::ALL, &DhGroup::ALL).encode();
    for cut in 0..n.len() {
        let _ = AuthMessage::decode(&n[..cut]);
    }
}

#[test]
fn a_dh_value_out_of_range_is_refused() {
    let mut r = rng(3);
    let kp = KeyPair::generate(DhGroup::Ffdhe2048, &[7; 64]).unwrap();
    let n = DhGroup::Ffdhe2048.value_len();
    assert_eq!(kp.shared(&vec![0; n]), Err(DhError::Range));
    let mut one = vec![0; n];
    one[n - 1] = 1;
    assert_eq!(kp.shared(&one), Err(DhError::Range));
    assert_eq!(kp.shared(&vec![0xff; n]), Err(DhError::Range));
    assert!(matches!(kp.shared(&[2; 10]), Err(DhError::Length { .. })));
    let mut other = vec![0u8; 64];
    r(&mut other);
    let kp2 = KeyPair::generate(DhGroup::Ffdhe2048, &other).unwrap();
    assert_eq!(
        *kp.shared(kp2.public()).unwrap(),
        *kp2.shared(kp.public()).unwrap()
    );
}

#[test]
fn primes_are_probable_safe_primes() {
    use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
    use crypto_bigint::{BoxedUint, Odd};
    for g in &DhGroup::ALL[1..] {
        let p = g.prime().unwrap();
        let bits = (p.len() * 8) as u32;
        assert_eq!(p[0], 0xff, "{g}: top bits set");
        let pn = BoxedUint::from_be_slice(p, bits).unwrap();
        // Fermat: 2^(p-1) = 1 mod p, and for q = (p-1)/2: 2^(q-1) = 1 mod q.
        let one = BoxedUint::one_with_precision(bits);
        let fermat = |n: &BoxedUint| {
            let params = BoxedMontyParams::new(Odd::new(n.clone()).unwrap());
            let two = BoxedUint::from_be_slice(&[2], bits).unwrap();
            let e = n.wrapping_sub(&one);
            BoxedMontyForm::new(two, params).pow(&e).retrieve() == one
        };
        assert!(fermat(&pn), "{g}: p");
        let q = pn.wrapping_sub(&one).shr(1);
        assert!(fermat(&q), "{g}: (p-1)/2");
    }
}

#[test]
fn secrets_parse_as_nvme_cli_prints_them() {
    let s = key(32, Some(HashId::Sha256), 0x5a);
    let text = s.to_text();
    assert!(text.starts_with("DHHC-1:01:"), "{}", *text);
    assert_eq!(Secret::parse(&text).unwrap(), s);
    // Without the trailing colon, as Linux accepts.
    assert_eq!(Secret::parse(text.trim_end_matches(':')).unwrap(), s);
    assert_eq!(Secret::parse("DHHC-2:00:abc:"), Err(SecretError::Prefix));
    assert!(matches!(
        Secret::parse("DHHC-1:07:abc:"),
        Err(SecretError::Transform(_))
    ));
    assert_eq!(Secret::parse("DHHC-1:00:!!!!:"), Err(SecretError::Base64));
    // One flipped character: the CRC catches it.
    let mut bad = text.to_string();
    let i = 12;
    let c = if &bad[i..i + 1] == "A" { "B" } else { "A" };
    bad.replace_range(i..i + 1, c);
    assert_eq!(Secret::parse(&bad), Err(SecretError::Crc));
    // A 48-byte key that says SHA-256 (Linux 6.7+ takes it).
    let s48 = key(48, None, 1)
        .to_text()
        .replace("DHHC-1:00:", "DHHC-1:01:");
    assert_eq!(Secret::parse(&s48).unwrap().len(), 48);
    // 36 bytes is no key length.
    assert!(matches!(
        Secret::parse(&format!("DHHC-1:00:{}:", "A".repeat(52))),
        Err(SecretError::Length(35))
    ));
    // Debug never shows the key.
    assert!(!format!("{s:?}").contains("5a"));
}

#[test]
fn messages_round_trip() {
    let msgs = [
        AuthMessage::Negotiate(Negotiate::new(5, &HashId::ALL, &DhGroup::ALL)),
        AuthMessage::Challenge(Challenge {
            t_id: 5,
            hash: 1,
            dhgroup: 1,
            seqnum: 77,
            challenge: vec![3; 32],
            dh_value: vec![4; 256],
        }),
        AuthMessage::Reply(Reply {
            t_id: 5,
            response: vec![1; 48],
            challenge: Some(vec![2; 48]),
            seqnum: 9,
            dh_value: vec![],
        }),
        AuthMessage::Success1(Success1 {
            t_id: 5,
            hl: 64,
            response: Some(vec![8; 64]),
        }),
        AuthMessage::Success2(Success2 { t_id: 5 }),
        AuthMessage::Failure1(Failure::new(5, failure::FAILED)),
        AuthMessage::Failure2(Failure::new(5, failure::HASH_UNUSABLE)),
    ];
    for m in msgs {
        assert_eq!(AuthMessage::decode(&m.encode()).unwrap(), m);
    }
    // Sizes the Linux structs have.
    assert_eq!(Negotiate::new(0, &[], &[]).encode().len(), 8 + 64);
    assert_eq!(Success2 { t_id: 0 }.encode().len(), 16);
}

/// Secure channel concatenation: both sides generate the same PSK, HMAC-H(KS, C1 || C2), with
/// and without the controller authenticated, for both hashes a TLS suite has; a new DH
/// exchange gives a new PSK; the generated identity and TLS PSK follow.
#[test]
fn concatenation_generates_one_psk_on_both_sides() {
    for h in [HashId::Sha256, HashId::Sha384] {
        for ctrl_key in [None, Some(key(32, None, 5))] {
            let hk = key(32, None, 1);
            let mut psks = Vec::new();
            for seed_round in 0..2u8 {
                let c =
                    ControllerTxn::new(Policy::default(), hk.clone(), ctrl_key.clone(), HOST, SUB)
                        .with_concat(secp::NEWTLSPSK);
                let hp = Policy {
                    hashes: vec![h, HashId::Sha512],
                    ..Policy::default()
                };
                let host = HostTxn::new(
                    hp,
                    hk.clone(),
                    ctrl_key.clone(),
                    HOST,
                    SUB,
                    seed_round as u16,
                )
                .with_concat(secp::NEWTLSPSK);
                let (c, host, step, res) = run_txns(c, host, 7 + seed_round as u64);
                assert_eq!(step, CtrlStep::Authenticated, "{h}");
                assert_eq!(res, Ok(()));
                let (sc_c, cp) = c.generated_psk().expect("the controller generated a PSK");
                let (hh, hpsk) = host.generated_psk().expect("the host generated a PSK");
                assert_eq!(sc_c, secp::NEWTLSPSK);
                assert_eq!(hh, h, "sha512 is not offered with concatenation");
                assert_eq!(cp, hpsk);
                assert_eq!(cp.len(), h.len());
                assert_eq!(c.bidirectional(), ctrl_key.is_some());
                let id = crate::tls::PskIdentity::generated(hh, HOST, SUB, hpsk);
                assert!(id
                    .to_string()
                    .starts_with(&format!("NVMe1G0{} {HOST} {SUB} ", h as u8)));
                assert_eq!(
                    crate::tls::PskIdentity::parse(id.to_string().as_bytes()),
                    Ok(id.clone())
                );
                assert!(id.digest_matches(cp));
                assert_eq!(id.tls_psk(cp).len(), h.len());
                psks.push(cp.to_vec());
            }
            assert_ne!(
                psks[0], psks[1],
                "each transaction's DH exchange makes its own PSK"
            );
        }
    }
    // Without concatenation nothing is generated.
    let hk = key(32, None, 1);
    let c = ControllerTxn::new(Policy::default(), hk.clone(), None, HOST, SUB)
        .with_concat(secp::NEWTLSPSK);
    let host = HostTxn::new(Policy::default(), hk, None, HOST, SUB, 0);
    let (c, host, step, _) = run_txns(c, host, 7);
    assert_eq!(step, CtrlStep::Authenticated);
    assert!(c.generated_psk().is_none() && host.generated_psk().is_none());
}

/// What concatenation refuses, with the Failure1 explanation the spec gives.
#[test]
fn concatenation_mismatches_are_refused_with_their_reason() {
    let hk = key(32, None, 1);
    let txn = |allow: u8, cp: Policy| {
        ControllerTxn::new(cp, hk.clone(), None, HOST, SUB).with_concat(allow)
    };
    let host =
        |ask: u8, hp: Policy| HostTxn::new(hp, hk.clone(), None, HOST, SUB, 1).with_concat(ask);
    let explanation = |step: CtrlStep| match step {
        CtrlStep::Failed(f) => f.explanation,
        other => panic!("not refused: {other:?}"),
    };
    // Not taken on this queue (an I/O queue, RDMA, no TLS listener), or another SC_C.
    for (allow, ask) in [
        (secp::NOSC, secp::NEWTLSPSK),
        (secp::NEWTLSPSK, secp::REPLACETLSPSK),
        (secp::REPLACETLSPSK, secp::NEWTLSPSK),
        (secp::NEWTLSPSK, 1),
    ] {
        let (_, _, step, _) = run_txns(
            txn(allow, Policy::default()),
            host(ask, Policy::default()),
            7,
        );
        assert_eq!(
            explanation(step),
            failure::CONCAT_MISMATCH,
            "allow {allow} ask {ask}"
        );
    }
    // A controller that takes only the null group, or only SHA-512.
    let (_, _, step, _) = run_txns(
        txn(secp::NEWTLSPSK, only(HashId::Sha256, DhGroup::Null)),
        host(secp::NEWTLSPSK, Policy::default()),
        7,
    );
    assert_eq!(explanation(step), failure::CONCAT_MISMATCH);
    let (_, _, step, _) = run_txns(
        txn(secp::NEWTLSPSK, only(HashId::Sha512, DhGroup::Ffdhe2048)),
        host(secp::NEWTLSPSK, Policy::default()),
        7,
    );
    assert_eq!(explanation(step), failure::HASH_UNUSABLE);
    // A wrong host key: refused, nothing generated.
    let c = ControllerTxn::new(Policy::default(), key(32, None, 2), None, HOST, SUB)
        .with_concat(secp::NEWTLSPSK);
    let (c, _, step, res) = run_txns(c, host(secp::NEWTLSPSK, Policy::default()), 7);
    assert_eq!(explanation(step), failure::FAILED);
    assert!(res.is_err() && c.generated_psk().is_none());
    // The SC_C is in the host's response: a Negotiate without it and a response made with it
    // do not match (and the other way round).
    let mut r = rng(3);
    let mut c = txn(secp::NEWTLSPSK, Policy::default());
    let mut h = host(secp::NEWTLSPSK, Policy::default());
    let plain = HostTxn::new(Policy::default(), hk.clone(), None, HOST, SUB, 1).negotiate();
    assert_eq!(c.on_send(&plain, &mut r), CtrlStep::Continue);
    let (chal, _) = c.on_receive().unwrap();
    let reply = h.on_challenge(&chal, &mut r).unwrap();
    assert_eq!(c.on_send(&reply, &mut r), CtrlStep::Continue);
    assert_eq!(explanation(c.on_receive().unwrap().1), failure::FAILED);
    // A Reply without C2 under concatenation.
    let mut c = txn(secp::NEWTLSPSK, Policy::default());
    let mut h = host(secp::NEWTLSPSK, Policy::default());
    assert_eq!(c.on_send(&h.negotiate(), &mut r), CtrlStep::Continue);
    let (chal, _) = c.on_receive().unwrap();
    let Ok(AuthMessage::Reply(mut reply)) =
        AuthMessage::decode(&h.on_challenge(&chal, &mut r).unwrap())
    else {
        panic!("not a Reply")
    };
    reply.challenge = None;
    assert_eq!(c.on_send(&reply.encode(), &mut r), CtrlStep::Continue);
    let (_, step) = c.on_receive().unwrap();
    assert!(
        matches!(&step, CtrlStep::Failed(f) if f.detail.contains("C2")),
        "{step:?}"
    );
}
