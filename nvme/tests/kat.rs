//! Known-answer tests of DH-HMAC-CHAP against the Linux kernel, both ways (its host answering
//! our controller, its nvmet answering our host, with and without Diffie-Hellman). Host side:
//! each vector is one
//! transaction between the Linux 6.12 NVMe host and nvmf-target, captured in the VM
//! (tests/vm/scenarios/auth-kernel-host-rdma-rxe.sh, from the target's trace log: wire data),
//! with the key the host was given. The kernel computed the Reply's response from our
//! Challenge (`nvme_auth_transform_key`, then the response HMAC over C1, S1, T_ID, SC_C,
//! "HostHost", the host NQN, a zero byte and the subsystem NQN): this crate must compute the
//! same bytes, and its controller must accept them.

use nvme::auth::{
    host_response, AuthMessage, ControllerTxn, CtrlStep, DhGroup, HashId, Policy, Secret,
};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

struct Vector {
    hostnqn: String,
    subnqn: String,
    key: Secret,
    ctrl_key: Option<Secret>,
    challenge: Vec<u8>,
    reply: Vec<u8>,
}

/// The value of `name=` on a vector line.
fn field(line: &str, name: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        .to_owned()
}

fn vectors() -> Vec<Vector> {
    include_str!("data/linux-6.12-dhchap.kat")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let field = |name: &str| field(l, name);
            let ctrl = field("ctrl_key");
            Vector {
                hostnqn: field("hostnqn"),
                subnqn: field("subnqn"),
                key: Secret::parse(&field("key")).unwrap(),
                ctrl_key: (ctrl != "-").then(|| Secret::parse(&ctrl).unwrap()),
                challenge: unhex(&field("challenge")),
                reply: unhex(&field("reply")),
            }
        })
        .collect()
}

#[test]
fn the_kernels_responses_are_ours() {
    let vs = vectors();
    let mut hashes = std::collections::BTreeSet::new();
    let mut bidirectional = 0;
    for v in &vs {
        let Ok(AuthMessage::Challenge(c)) = AuthMessage::decode(&v.challenge) else {
            panic!("not a Challenge")
        };
        let Ok(AuthMessage::Reply(r)) = AuthMessage::decode(&v.reply) else {
            panic!("not a Reply")
        };
        assert_eq!(c.dhgroup, DhGroup::Null as u8);
        let hash = HashId::from_id(c.hash).unwrap();
        hashes.insert(hash);
        let ours = host_response(
            hash,
            &v.key.transform(&v.hostnqn),
            &c.challenge,
            c.seqnum,
            c.t_id,
            0,
            &v.hostnqn,
            &v.subnqn,
        );
        assert_eq!(*ours, r.response, "{hash}, T_ID {}", c.t_id);
        // The host challenges the controller exactly when it was given a controller key.
        assert_eq!(r.challenge.is_some(), v.ctrl_key.is_some());
        bidirectional += r.challenge.is_some() as usize;
    }
    // SHA-256 (unidirectional) and SHA-512 (bidirectional), on the admin and I/O queues.
    assert!(vs.len() >= 4, "{} vectors", vs.len());
    assert!(hashes.contains(&HashId::Sha256) && hashes.contains(&HashId::Sha512));
    assert!(bidirectional >= 1);
}

/// The same exchanges replayed into this crate's controller with its challenge forced to the
/// captured one: the kernel's Reply is accepted.
#[test]
fn a_replayed_kernel_reply_is_accepted_by_the_controller() {
    for v in vectors() {
        let Ok(AuthMessage::Challenge(c)) = AuthMessage::decode(&v.challenge) else {
            unreachable!()
        };
        let hash = HashId::from_id(c.hash).unwrap();
        let policy = Policy {
            hashes: vec![hash],
            dhgroups: vec![DhGroup::Null],
        };
        let mut txn = ControllerTxn::new(
            policy,
            v.key.clone(),
            v.ctrl_key.clone(),
            &v.hostnqn,
            &v.subnqn,
        );
        // The controller's random numbers: the challenge, then the sequence number.
        let mut stream = c.challenge.clone();
        stream.extend_from_slice(&c.seqnum.to_le_bytes());
        let mut at = 0;
        let mut rng = |b: &mut [u8]| {
            b.copy_from_slice(&stream[at..at + b.len()]);
            at += b.len();
        };
        let negotiate = nvme::auth::Negotiate::new(c.t_id, &HashId::ALL, &DhGroup::ALL).encode();
        assert_eq!(txn.on_send(&negotiate, &mut rng), CtrlStep::Continue);
        let (ours, _) = txn.on_receive().unwrap();
        assert_eq!(ours, v.challenge, "the same Challenge bytes");
        assert_eq!(txn.on_send(&v.reply, &mut rng), CtrlStep::Continue);
        let (s1, step) = txn.on_receive().unwrap();
        assert!(matches!(
            AuthMessage::decode(&s1),
            Ok(AuthMessage::Success1(_))
        ));
        if v.ctrl_key.is_none() {
            assert_eq!(step, CtrlStep::Authenticated);
        }
    }
}

/// The other direction: Linux 6.12's nvmet answering our initiator's challenge (bidirectional,
/// null group). The kernel transformed the controller key with the subsystem NQN and computed
/// R2 over C2, S2, T_ID, SC_C, "Controller", the subsystem NQN, a zero byte and the host NQN.
#[test]
fn the_kernel_controllers_responses_are_ours() {
    let mut n = 0;
    for l in include_str!("data/linux-6.12-nvmet-dhchap.kat")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let field = |name: &str| field(l, name);
        let (hostnqn, subnqn) = (field("hostnqn"), field("subnqn"));
        let ctrl_key = Secret::parse(&field("ctrl_key")).unwrap();
        let Ok(AuthMessage::Reply(r)) = AuthMessage::decode(&unhex(&field("reply"))) else {
            panic!("not a Reply")
        };
        let Ok(AuthMessage::Success1(s)) = AuthMessage::decode(&unhex(&field("success1"))) else {
            panic!("not a Success1")
        };
        let hash = HashId::ALL
            .into_iter()
            .find(|h| h.len() == s.hl as usize)
            .unwrap();
        let ours = nvme::auth::controller_response(
            hash,
            &ctrl_key.transform(&subnqn),
            r.challenge.as_deref().expect("bidirectional"),
            r.seqnum,
            r.t_id,
            0,
            &subnqn,
            &hostnqn,
        );
        assert_eq!(Some(ours.to_vec()), s.response, "T_ID {}", r.t_id);
        n += 1;
    }
    assert!(n >= 2, "{n} vectors");
}

/// The PRNG tests/examples/auth_kat.rs seeds its host with (xorshift64).
fn prng(seed: u64) -> impl FnMut(&mut [u8]) {
    let mut s = seed.max(1);
    move |buf: &mut [u8]| {
        for b in buf {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *b = (s >> 24) as u8;
        }
    }
}

/// With a Diffie-Hellman group: Linux 6.12's nvmet (sha256, ffdhe2048, bidirectional) against
/// a host whose random numbers come from a seed (tests/examples/auth_kat.rs). Replaying the
/// seed rebuilds the host's private exponent, C2 and S2, so the kernel's part is a known answer:
/// its DH public value gives the same shared secret, the host's Reply comes out byte for byte
/// as the kernel accepted it (R1 over the augmented challenge), and the kernel's R2 (over the
/// augmented C2, keyed by the transformed controller key) is the one this crate expects.
#[test]
fn the_kernels_dh_exchange_is_ours() {
    let mut n = 0;
    for l in include_str!("data/linux-6.12-nvmet-dhchap-ffdhe2048.kat")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let field = |name: &str| field(l, name);
        let chal = unhex(&field("challenge"));
        let Ok(AuthMessage::Challenge(c)) = AuthMessage::decode(&chal) else {
            panic!("not a Challenge")
        };
        assert_eq!(
            (c.hash, c.dhgroup),
            (HashId::Sha256 as u8, DhGroup::Ffdhe2048 as u8)
        );
        assert_eq!(c.dh_value.len(), 256);
        let mut txn = nvme::auth::HostTxn::new(
            Policy::default(),
            Secret::parse(&field("key")).unwrap(),
            Some(Secret::parse(&field("ctrl_key")).unwrap()),
            &field("hostnqn"),
            &field("subnqn"),
            0,
        );
        let mut rng = prng(field("seed").parse().unwrap());
        let reply = txn.on_challenge(&chal, &mut rng).unwrap();
        assert_eq!(hex(&reply), field("reply"), "the Reply the kernel accepted");
        let s1 = unhex(&field("success1"));
        assert!(
            matches!(
                txn.on_success1(&s1),
                Ok(nvme::auth::HostStep::SendAndDone(_))
            ),
            "the kernel's R2 checks out"
        );
        n += 1;
    }
    assert!(n >= 2, "{n} vectors");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
