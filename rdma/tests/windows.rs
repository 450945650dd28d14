//! Type 2 memory windows on a real device: what the NVMe/RDMA host relies on to open a buffer
//! to the target for one command only.
//!
//! A host binds a window over a buffer with a fresh key, in the same post as the SEND that
//! names the key; the peer (a stand-in target) RDMA WRITEs through it; then the key dies, by
//! the peer's SEND_WITH_INV or by the host's LOCAL_INV, and the peer's next WRITE with that key
//! must fail (REM_ACCESS_ERR) and change no byte. A device without type 2B windows (siw) must
//! say so in `DeviceAttr` and refuse `Mw::alloc`: the host then registers per command instead.
//!
//! Needs a real RDMA device: run in the test VM (`tests/vm/run.sh rdma-wire-rxe`) with
//! `NVMF_TEST_RDMA_IP` set. Without RDMA the tests print "skipped: no RDMA device" and pass,
//! unless `NVMF_REQUIRE_RDMA=1` (the VM suite).

use std::net::{IpAddr, SocketAddr};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use nvmf_rdma::{
    active, next_rkey, AccessFlags, CmEventType, CmId, ConnParam, Context, Cq, EventChannel, Mr,
    Mw, MwBind, Pd, Qp, QpInitAttr, RemoteBuf, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

const TIMEOUT: Duration = Duration::from_secs(20);
const DATA: usize = 8192; // several rxe packets
const MSG: usize = 64;

/// The address to test on, or None (skip) when this machine has no RDMA.
fn rdma_ip() -> Option<IpAddr> {
    let ip = std::env::var("NVMF_TEST_RDMA_IP")
        .ok()
        .and_then(|s| s.parse().ok());
    if ip.is_none() {
        assert!(
            std::env::var("NVMF_REQUIRE_RDMA").as_deref() != Ok("1"),
            "NVMF_REQUIRE_RDMA=1 but NVMF_TEST_RDMA_IP is not set"
        );
        eprintln!("skipped: no RDMA device (NVMF_TEST_RDMA_IP unset)");
    }
    ip
}

fn poll_one(cq: &Cq, what: &str) -> WorkCompletion {
    let end = Instant::now() + TIMEOUT;
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            let [wc] = wc;
            return wc;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        thread::sleep(Duration::from_micros(100));
    }
}

fn ok(wc: &WorkCompletion, op: WcOpcode, what: &str) {
    assert_eq!(wc.status(), WcStatus::Success, "{what}: {wc:?}");
    assert_eq!(wc.opcode(), op, "{what}: {wc:?}");
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..DATA)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kill {
    /// The peer's response is a SEND_WITH_INV of the key.
    ByPeer,
    /// The peer sends a plain SEND; the host posts LOCAL_INV.
    Locally,
}

/// The stand-in target: accepts one connection, reads the advert (addr, rkey), WRITEs pattern
/// 1 through the key, answers (SEND_WITH_INV or SEND), waits for the host's "dead" message,
/// then WRITEs pattern 2 with the same key. Returns the status of that last WRITE.
fn peer(addr: SocketAddr, kill: Kill, ready: mpsc::Sender<()>) -> WcStatus {
    let ch = EventChannel::new().unwrap();
    let listener = ch.create_id(1).unwrap();
    listener.bind_addr(addr).unwrap();
    listener.listen(4).unwrap();
    ready.send(()).unwrap();
    let mut ev = ch
        .get_event(Some(TIMEOUT))
        .unwrap()
        .expect("connect request");
    assert_eq!(ev.event_type(), CmEventType::ConnectRequest);
    let id: CmId = ev.take_new_id().unwrap();
    let ctx = id.context().unwrap().unwrap();
    let pd = Arc::new(Pd::new(&ctx).unwrap());
    let cq = Arc::new(Cq::new(&ctx, 32).unwrap());
    let qp = Qp::create(&id, &pd, &QpInitAttr::new(&cq, 8, 4)).unwrap();
    let rx = Mr::alloc(&pd, 2 * MSG, AccessFlags::LOCAL_WRITE).unwrap();
    qp.post_recv(100, &[rx.sge(0, MSG).unwrap()]).unwrap();
    qp.post_recv(101, &[rx.sge(MSG, MSG).unwrap()]).unwrap();
    let src = Mr::alloc(&pd, 2 * DATA, AccessFlags::empty()).unwrap();
    src.write_at(0, &pattern(1)).unwrap();
    src.write_at(DATA, &pattern(2)).unwrap();
    let msg = Mr::alloc(&pd, MSG, AccessFlags::empty()).unwrap();
    id.accept(&ConnParam {
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    let ev = ch.get_event(Some(TIMEOUT)).unwrap().expect("established");
    assert_eq!(ev.event_type(), CmEventType::Established);

    let wc = poll_one(&cq, "the advert");
    ok(&wc, WcOpcode::Recv, "advert");
    let mut a = [0u8; MSG];
    rx.read_at(0, &mut a).unwrap();
    let remote = RemoteBuf {
        addr: u64::from_le_bytes(a[0..8].try_into().unwrap()),
        len: DATA as u64,
        rkey: u32::from_le_bytes(a[8..12].try_into().unwrap()),
    };
    // The key opens the buffer while the "command" runs.
    qp.post_send(&[SendWr::write(1, &[src.sge(0, DATA).unwrap()], remote).signaled()])
        .unwrap();
    ok(
        &poll_one(&cq, "WRITE 1"),
        WcOpcode::RdmaWrite,
        "WRITE through the window",
    );
    let answer = [msg.sge(0, MSG).unwrap()];
    let send = match kill {
        Kill::ByPeer => SendWr::send_with_inv(2, &answer, remote.rkey),
        Kill::Locally => SendWr::send(2, &answer),
    };
    qp.post_send(&[send.signaled()]).unwrap();
    ok(&poll_one(&cq, "the answer"), WcOpcode::Send, "answer");
    ok(&poll_one(&cq, "DEAD"), WcOpcode::Recv, "DEAD");
    // The same key once more: a stale key must open nothing.
    qp.post_send(&[SendWr::write(3, &[src.sge(DATA, DATA).unwrap()], remote).signaled()])
        .unwrap();
    let wc = poll_one(&cq, "WRITE 2");
    assert_eq!(wc.wr_id(), 3, "{wc:?}");
    wc.status()
}

/// The host side; returns after the peer's stale WRITE was refused and the buffer checked.
fn host_kills_key(kill: Kill, port: u16) {
    let Some(ip) = rdma_ip() else { return };
    let addr = SocketAddr::new(ip, port);
    let ch = EventChannel::new().unwrap();
    let deadline = Instant::now() + TIMEOUT;
    // Address resolution needs no listener: learn the device first.
    let (id, ctx): (CmId, Arc<Context>) = active::resolve(&ch, 7, addr, deadline).unwrap();
    let attr = ctx.query_device().unwrap();
    let pd = Arc::new(Pd::new(&ctx).unwrap());
    if !attr.mw_type_2b && attr.max_mw == 0 {
        // siw: no windows. The host falls back to a registration per command.
        assert!(
            Mw::alloc(&pd).is_err(),
            "{} allocated a window it does not announce",
            ctx.name()
        );
        println!(
            "{}: no type 2B memory windows (max_mw {}): Mw::alloc refused",
            ctx.name(),
            attr.max_mw
        );
        return;
    }
    let (tx, rx) = mpsc::channel();
    let peer = thread::spawn(move || peer(addr, kill, tx));
    rx.recv_timeout(TIMEOUT).expect("peer listening");
    let cq = Arc::new(Cq::new(&ctx, 32).unwrap());
    let qp = Qp::create(&id, &pd, &QpInitAttr::new(&cq, 8, 4)).unwrap();
    let rxm = Mr::alloc(&pd, 2 * MSG, AccessFlags::LOCAL_WRITE).unwrap();
    qp.post_recv(200, &[rxm.sge(0, MSG).unwrap()]).unwrap();
    qp.post_recv(201, &[rxm.sge(MSG, MSG).unwrap()]).unwrap();
    // The buffer: local access and window binding only; no key of the region opens it.
    let buf = Mr::alloc(&pd, DATA, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND).unwrap();
    buf.fill(0, DATA, 0x5a).unwrap();
    let mw = Mw::alloc(&pd).unwrap_or_else(|e| {
        panic!(
            "{} announces windows (type 2B {}, max_mw {}) but Mw::alloc failed: {e}",
            ctx.name(),
            attr.mw_type_2b,
            attr.max_mw
        )
    });
    let msg = Mr::alloc(&pd, MSG, AccessFlags::empty()).unwrap();
    active::connect(
        &ch,
        &id,
        &ConnParam {
            responder_resources: 1,
            rnr_retry_count: 7,
            ..Default::default()
        },
        deadline,
    )
    .unwrap();

    // Bind with a fresh key and name it in the SEND of the same post.
    let key = next_rkey(mw.rkey());
    let mut advert = [0u8; MSG];
    advert[0..8].copy_from_slice(&buf.addr().to_le_bytes());
    advert[8..12].copy_from_slice(&key.to_le_bytes());
    msg.write_at(0, &advert).unwrap();
    let bind = MwBind {
        wr_id: 10,
        mw: &mw,
        mr: &buf,
        offset: 0,
        len: DATA,
        access: AccessFlags::REMOTE_WRITE,
        rkey: key,
        signaled: true,
    };
    qp.post_bind_send(
        &bind,
        &[SendWr::send(11, &[msg.sge(0, MSG).unwrap()]).signaled()],
    )
    .unwrap();
    ok(&poll_one(&cq, "the bind"), WcOpcode::BindMw, "bind");
    ok(&poll_one(&cq, "the advert SEND"), WcOpcode::Send, "advert");

    let wc = poll_one(&cq, "the answer");
    ok(&wc, WcOpcode::Recv, "answer");
    match kill {
        Kill::ByPeer => assert_eq!(
            wc.invalidated_rkey().or(wc.rxe_invalidated_rkey()),
            Some(key),
            "the peer's SEND_WITH_INV reported with its key: {wc:?}"
        ),
        Kill::Locally => {
            assert_eq!(
                wc.invalidated_rkey().or(wc.rxe_invalidated_rkey()),
                None,
                "{wc:?}"
            );
            qp.post_send(&[SendWr::local_inv(12, key).signaled()])
                .unwrap();
            ok(&poll_one(&cq, "LOCAL_INV"), WcOpcode::LocalInv, "LOCAL_INV");
        }
    }
    let mut got = vec![0u8; DATA];
    buf.read_at(0, &mut got).unwrap();
    assert!(got == pattern(1), "the WRITE through the window landed");
    // Tell the peer the key is dead; it tries it once more.
    msg.write_at(0, b"DEAD").unwrap();
    qp.post_send(&[SendWr::send(13, &[msg.sge(0, MSG).unwrap()]).signaled()])
        .unwrap();
    ok(&poll_one(&cq, "the DEAD SEND"), WcOpcode::Send, "DEAD");
    let stale = peer.join().expect("peer thread");
    assert_eq!(
        stale,
        WcStatus::RemAccessErr,
        "a WRITE with the dead key ({kill:?}) must be refused"
    );
    buf.read_at(0, &mut got).unwrap();
    assert!(got == pattern(1), "the refused WRITE changed the buffer");
    println!(
        "{}: window key {key:#x} opened {DATA} bytes for one WRITE; killed {kill:?}, the next \
         WRITE with it: {stale:?}, buffer unchanged",
        ctx.name()
    );
}

#[test]
fn a_window_key_invalidated_by_the_peer_opens_nothing_after() {
    host_kills_key(Kill::ByPeer, 4801);
}

#[test]
fn a_window_key_invalidated_locally_opens_nothing_after() {
    host_kills_key(Kill::Locally, 4802);
}
