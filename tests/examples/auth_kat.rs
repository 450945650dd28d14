//! auth_kat: capture one bidirectional DH-HMAC-CHAP transaction with a controller, as a
//! known-answer vector (the VM suite runs it against Linux nvmet: `auth-initiator-vs-kernel-
//! target-rdma-rxe`).
//!
//! The host side is `nvme::auth::HostTxn` over a raw NVMe/TCP admin queue, fed by a PRNG seeded
//! with `--seed`: replaying the same seed in `nvme/tests/kat.rs` rebuilds the same private DH
//! exponent, C2 and S2, so the controller's Challenge (its DH public value) and Success1 (its
//! response R2 over the augmented challenge, from the shared secret) are known answers for the
//! DH exchange, the augmented challenge and the controller response. Prints one line:
//! `hostnqn=.. subnqn=.. key=.. ctrl_key=.. seed=.. challenge=<hex> reply=<hex> success1=<hex>`.
//! The keys are test keys generated for the run; the seed makes the host's side reproducible,
//! which no real host may do.

use std::net::SocketAddr;

use clap::Parser;
use nvme::auth::{HostStep, HostTxn, Policy, Secret};
use nvme::fabrics::{auth_sqe, ConnectResult, AUTHREQ_ATR};
use nvme::sgl::Sgl;
use nvmf_tests::raw::{RawHost, HOSTNQN};

#[derive(Parser)]
struct Args {
    /// The controller's NVMe/TCP address (ip:port).
    #[arg(long)]
    addr: SocketAddr,
    #[arg(long)]
    subnqn: String,
    /// The host secret (DHHC-1), as configured for this host NQN on the controller.
    #[arg(long)]
    key: String,
    /// The controller secret (DHHC-1).
    #[arg(long)]
    ctrl_key: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the host NQN this tool connects with and exit.
    #[arg(long)]
    print_hostnqn: bool,
}

/// The PRNG the vector is replayed with (xorshift64; deterministic on purpose).
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

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn main() {
    let a = Args::parse();
    if a.print_hostnqn {
        println!("{HOSTNQN}");
        return;
    }
    let key = Secret::parse(&a.key).expect("--key");
    let ctrl_key = Secret::parse(&a.ctrl_key).expect("--ctrl-key");
    let (mut h, _) = RawHost::connect(a.addr);
    let c = h.fabrics_connect(&a.subnqn, 0, 31, 0);
    assert!(c.status().is_success(), "Connect: {c:?}");
    let ConnectResult::Success { authreq, .. } = ConnectResult::decode(c.result.get(), false)
    else {
        unreachable!()
    };
    assert_ne!(
        authreq & AUTHREQ_ATR,
        0,
        "the controller asks for no authentication"
    );
    let mut txn = HostTxn::new(
        Policy::default(),
        key,
        Some(ctrl_key),
        HOSTNQN,
        &a.subnqn,
        0,
    );
    let mut rng = prng(a.seed);
    let mut cid = 10u16;
    let mut send = |h: &mut RawHost, msg: &[u8]| {
        cid += 1;
        let len = msg.len() as u32;
        let sqe = auth_sqe(cid, true, len, Sgl::InCapsule { offset: 0, len });
        let (c, _) = h.command(&sqe, msg);
        assert!(c.status().is_success(), "Authentication Send: {c:?}");
    };
    let mut cid2 = 100u16;
    let mut receive = |h: &mut RawHost| {
        cid2 += 1;
        let sqe = auth_sqe(cid2, false, 4096, Sgl::Transport { len: 4096 });
        let (c, data) = h.command(&sqe, &[]);
        assert!(c.status().is_success(), "Authentication Receive: {c:?}");
        data
    };
    send(&mut h, &txn.negotiate());
    let chal = receive(&mut h);
    // The message's own length: 16 bytes, HL bytes of challenge, DHVLEN bytes of DH value.
    let n = 16 + chal[6] as usize + u16::from_le_bytes([chal[10], chal[11]]) as usize;
    let chal = chal[..n].to_vec();
    let reply = txn
        .on_challenge(&chal, &mut rng)
        .expect("the controller's Challenge");
    send(&mut h, &reply);
    let s1 = receive(&mut h);
    let s1 = s1[..16 + s1[6] as usize].to_vec();
    match txn.on_success1(&s1).expect("the controller's Success1") {
        HostStep::SendAndDone(s2) => send(&mut h, &s2),
        other => panic!("bidirectional authentication ended with {other:?}"),
    }
    println!(
        "hostnqn={HOSTNQN} subnqn={} key={} ctrl_key={} seed={} challenge={} reply={} success1={}",
        a.subnqn,
        a.key,
        a.ctrl_key,
        a.seed,
        hex(&chal),
        hex(&reply),
        hex(&s1)
    );
}
