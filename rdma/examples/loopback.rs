//! Real-verbs loopback over rdma_cm: a server thread and a client thread in one process,
//! both on `IP` (run it in the test VM once for rxe and once for siw).
//!
//! ```text
//! loopback IP [PORT]
//! ```
//!
//! Phase 1 (RQ): connect with 32 bytes of private data each way; the client SENDs an advert of
//! its buffer; the server RDMA WRITEs into it chained with a SEND (one `ibv_post_send`, only the
//! SEND signaled), then RDMA READs the other half (one SGE, sink `LOCAL_WRITE|REMOTE_WRITE` for
//! iWARP) and checks the bytes; the client disconnects; both sides move their QP to ERR and
//! reap a flush completion for every RECV still posted.
//! Phase 2 (SRQ, inline): a second connection whose server QP receives through an SRQ, reusing
//! the server's PD and CQs; the client SENDs inline on an `sq_sig_all` QP and overwrites its
//! buffer right after each post.
//! Phase 3 (bad rkey): the server RDMA WRITEs with a key the client never registered; IB/RoCE
//! must report REM_ACCESS_ERR, and on every transport the client's RECVs are flushed and the
//! connection ends.
//! Phase 4 (reject): the server rejects a request with 4 bytes of private data and the client
//! must see REJECTED carrying them.
//! Exit status 0 and `loopback OK on <dev>` only if every check passed.

use std::collections::BTreeSet;
use std::error::Error as StdError;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nvmf_rdma::active::{self, ConnectError};
use nvmf_rdma::{
    AccessFlags, CmEvent, CmEventType, CmId, CompChannel, ConnParam, Context, Cq, EventChannel, Mr,
    Pd, Qp, QpInitAttr, QpState, Srq, Transport, WcOpcode, WcStatus, WorkCompletion,
};

type Res<T> = Result<T, Box<dyn StdError + Send + Sync>>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

const TIMEOUT: Duration = Duration::from_secs(30);
const MSG: usize = 64;
const NRECV: u64 = 4;
const DATA: usize = 16 * 1024; // > rxe's 1024-byte MTU: multi-packet WRITE and READ.
const CLIENT_PDATA: &[u8; 32] = b"nvmf-rs loopback: client hello!!";
const SERVER_PDATA: &[u8; 32] = b"nvmf-rs loopback: server reply!!";
const REJECT_PDATA: [u8; 4] = [0, 0, 6, 0]; // NVMe/RDMA CM reject: recfmt 0, sts NO_RSC.

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn expect_event(ch: &EventChannel, want: CmEventType) -> Res<CmEvent> {
    let ev = ch
        .get_event(Some(TIMEOUT))?
        .ok_or(format!("timed out waiting for {want}"))?;
    ensure!(
        ev.event_type() == want,
        "expected {want}, got {} (status {})",
        ev.event_type(),
        ev.status()
    );
    Ok(ev)
}

/// Busy-polls `cq` (with short sleeps) until `n` completions arrived.
fn poll_n(cq: &Cq, n: usize, what: &str) -> Res<Vec<WorkCompletion>> {
    let deadline = Instant::now() + TIMEOUT;
    let mut out = Vec::new();
    let mut batch: [WorkCompletion; 8] = Default::default();
    while out.len() < n {
        let got = cq.poll(&mut batch[..(n - out.len()).min(8)])?;
        out.extend(batch[..got].iter().cloned());
        if got == 0 {
            ensure!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {out:?}"
            );
            thread::sleep(Duration::from_micros(200));
        }
    }
    Ok(out)
}

/// Waits for one completion using the completion channel (arm, re-poll, sleep on the fd).
fn wait_one(cq: &Cq, ch: &CompChannel, what: &str) -> Res<WorkCompletion> {
    let deadline = Instant::now() + TIMEOUT;
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc)? == 1 {
            let [wc] = wc;
            return Ok(wc);
        }
        cq.req_notify(false)?;
        // A completion may have arrived before the arm: poll again before sleeping.
        if cq.poll(&mut wc)? == 1 {
            let [wc] = wc;
            return Ok(wc);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        ensure!(!left.is_zero(), "timed out waiting for {what}");
        if let Some(tag) = ch.get_event(Some(left))? {
            ensure!(
                tag == CLIENT_CQ_TAG,
                "completion event for unknown CQ tag {tag}"
            );
        }
    }
}

fn check_ok(wc: &WorkCompletion, op: WcOpcode, what: &str) -> Res<()> {
    ensure!(
        wc.status() == WcStatus::Success,
        "{what} failed: {} ({wc:?})",
        wc.status()
    );
    ensure!(
        wc.opcode() == op,
        "{what}: opcode {:?}, expected {op:?}",
        wc.opcode()
    );
    Ok(())
}

/// Moves `qp` to ERR and reaps one flush completion for each wr_id in `posted`.
fn drain(qp: &Qp, cq: &Cq, ctx: &Context, mut posted: BTreeSet<u64>, who: &str) -> Res<()> {
    qp.set_error()?;
    // siw does not report QP states (None); IB/RoCE providers must say ERR.
    let state = qp.state()?;
    let ok = match ctx.transport() {
        Transport::Iwarp => matches!(state, None | Some(QpState::Err)),
        _ => state == Some(QpState::Err),
    };
    ensure!(ok, "{who}: QP in {state:?} after set_error");
    let n = posted.len();
    for wc in poll_n(cq, n, &format!("{who}: {n} flush completions"))? {
        ensure!(
            wc.status() == WcStatus::WrFlushErr,
            "{who}: drain completion {} has status {}",
            wc.wr_id(),
            wc.status()
        );
        ensure!(
            wc.qp_num() == qp.qp_num(),
            "{who}: flush completion of another QP"
        );
        ensure!(
            posted.remove(&wc.wr_id()),
            "{who}: unexpected flushed wr_id {}",
            wc.wr_id()
        );
    }
    let mut extra = [WorkCompletion::default()];
    ensure!(
        cq.poll(&mut extra)? == 0,
        "{who}: completion after the drain: {:?}",
        extra[0]
    );
    Ok(())
}

/// The advert the client SENDs: where the server may WRITE and READ.
struct Advert {
    write: nvmf_rdma::RemoteBuf,
    read: nvmf_rdma::RemoteBuf,
}

impl Advert {
    fn encode(&self) -> [u8; MSG] {
        let mut m = [0u8; MSG];
        m[0..8].copy_from_slice(b"ADVERT01");
        m[8..16].copy_from_slice(&self.write.addr.to_le_bytes());
        m[16..24].copy_from_slice(&self.write.len.to_le_bytes());
        m[24..32].copy_from_slice(&self.read.addr.to_le_bytes());
        m[32..40].copy_from_slice(&self.read.len.to_le_bytes());
        m[40..44].copy_from_slice(&self.write.rkey.to_le_bytes());
        m
    }

    fn decode(m: &[u8]) -> Res<Advert> {
        ensure!(
            m.len() == MSG && &m[0..8] == b"ADVERT01",
            "bad advert {m:?}"
        );
        let u64_at = |o: usize| u64::from_le_bytes(m[o..o + 8].try_into().unwrap());
        let rkey = u32::from_le_bytes(m[40..44].try_into().unwrap());
        Ok(Advert {
            write: nvmf_rdma::RemoteBuf {
                addr: u64_at(8),
                len: u64_at(16),
                rkey,
            },
            read: nvmf_rdma::RemoteBuf {
                addr: u64_at(24),
                len: u64_at(32),
                rkey,
            },
        })
    }
}

fn message(tag: &[u8]) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[..tag.len()].copy_from_slice(tag);
    m
}

// ----------------------------------------------------------------------------------------
// Server

const SEND_ID: u64 = 1;
const WRITE_ID: u64 = 2;
const READ_ID: u64 = 3;
const RECV_BASE: u64 = 100;

/// Per-device objects the server keeps across connections, as a target would.
struct Device {
    ctx: Arc<Context>,
    pd: Arc<Pd>,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
}

fn server(addr: SocketAddr, ready: mpsc::Sender<()>) -> Res<String> {
    let ch = EventChannel::new()?;
    let listener = ch.create_id(1)?;
    listener.bind_addr(addr)?;
    listener.listen(8)?;
    ensure!(
        listener.local_addr() == Some(addr),
        "listener bound to {:?}",
        listener.local_addr()
    );
    ready.send(())?;

    // ---- phase 1: RQ, WRITE+SEND chain, READ, drain ----
    let mut ev = expect_event(&ch, CmEventType::ConnectRequest)?;
    ensure!(ev.tag() == 1, "connect request tag {}", ev.tag());
    ensure!(
        ev.private_data().starts_with(CLIENT_PDATA),
        "server got private data {:?}",
        ev.private_data()
    );
    let id = ev.take_new_id().ok_or("CONNECT_REQUEST without a new id")?;
    id.set_tag(10);
    let ctx = id.context()?.ok_or("connection id not bound to a device")?;
    let attr = ctx.query_device()?;
    let port = ctx.query_port(1)?;
    println!(
        "server: {} ({:?}) max_qp_wr {} max_sge {} max_sge_rd {} max_qp_rd_atom {} \
         max_qp_init_rd_atom {} max_cqe {} max_srq_wr {} port {:?} mtu {} netdev {:?}",
        ctx.name(),
        ctx.transport(),
        attr.max_qp_wr,
        attr.max_sge,
        attr.max_sge_rd,
        attr.max_qp_rd_atom,
        attr.max_qp_init_rd_atom,
        attr.max_cqe,
        attr.max_srq_wr,
        port.state,
        port.active_mtu,
        ctx.netdev(1, 0),
    );
    ensure!(
        attr.max_qp_init_rd_atom >= 1,
        "device cannot issue RDMA READs"
    );
    let pd = Arc::new(Pd::new(&ctx)?);
    let dev = Device {
        send_cq: Arc::new(Cq::new(&ctx, 64)?),
        recv_cq: Arc::new(Cq::new(&ctx, 64)?),
        pd,
        ctx,
    };
    let ord = ev
        .initiator_depth()
        .min(attr.max_qp_init_rd_atom.min(255) as u8);
    let ird = ev
        .responder_resources()
        .min(attr.max_qp_rd_atom.min(255) as u8);
    ensure!(
        ord >= 1,
        "peer allows no RDMA READs (initiator_depth {})",
        ev.initiator_depth()
    );
    server_rq_phase(&dev, &ch, &id, ord, ird)?;
    drop(id);

    // ---- phase 2: SRQ ----
    let mut ev = expect_event(&ch, CmEventType::ConnectRequest)?;
    let id = ev.take_new_id().ok_or("CONNECT_REQUEST without a new id")?;
    ensure!(id.is_on(&dev.ctx), "second connection on another device");
    server_srq_phase(&dev, &ch, &id)?;
    drop(id);

    // ---- phase 3: RDMA WRITE with a bad rkey ----
    let mut ev = expect_event(&ch, CmEventType::ConnectRequest)?;
    let id = ev.take_new_id().ok_or("CONNECT_REQUEST without a new id")?;
    server_bad_rkey_phase(&dev, &ch, &id)?;
    drop(id);

    // ---- phase 4: reject with private data ----
    let mut ev = expect_event(&ch, CmEventType::ConnectRequest)?;
    ensure!(
        ev.private_data().starts_with(CLIENT_PDATA),
        "third request's private data"
    );
    let id = ev.take_new_id().ok_or("CONNECT_REQUEST without a new id")?;
    id.reject(&REJECT_PDATA)?;
    drop(id);
    Ok(dev.ctx.name())
}

fn server_rq_phase(dev: &Device, ch: &EventChannel, id: &CmId, ord: u8, ird: u8) -> Res<()> {
    let qp = Qp::create(
        id,
        &dev.pd,
        &QpInitAttr {
            recv_cq: &dev.recv_cq,
            ..QpInitAttr::new(&dev.send_cq, 16, NRECV as u32)
        },
    )?;
    let caps = qp.caps();
    ensure!(
        caps.max_recv_wr >= NRECV as u32 && caps.max_send_wr >= 16,
        "caps {caps:?}"
    );

    // RECV buffers first: the peer may SEND as soon as it sees ESTABLISHED.
    let recv_mr = Mr::alloc(&dev.pd, NRECV as usize * MSG, AccessFlags::LOCAL_WRITE)?;
    qp.post_recv_slots(&recv_mr, MSG, NRECV as usize, RECV_BASE)?;
    let mut posted: BTreeSet<u64> = (RECV_BASE..RECV_BASE + NRECV).collect();

    // RDMA READ sink: iWARP places READ responses like tagged writes (rdma-binding §5).
    let sink_access = match dev.ctx.transport() {
        Transport::Iwarp => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        _ => AccessFlags::LOCAL_WRITE,
    };
    let sink = Mr::alloc(&dev.pd, DATA, sink_access)?;
    let src = Mr::alloc(&dev.pd, DATA, AccessFlags::empty())?;
    src.write_at(0, &pattern(0xA5, DATA))?;
    let msg = Mr::alloc(&dev.pd, MSG, AccessFlags::empty())?;

    id.accept(&ConnParam {
        private_data: SERVER_PDATA,
        initiator_depth: ord,
        responder_resources: ird,
        rnr_retry_count: 7,
        flow_control: true,
        ..Default::default()
    })?;
    let ev = expect_event(ch, CmEventType::Established)?;
    ensure!(ev.tag() == 10, "ESTABLISHED for tag {}", ev.tag());

    // The client's advert.
    let wc = poll_recv(dev, &qp, id)?;
    check_ok(&wc, WcOpcode::Recv, "advert RECV")?;
    ensure!(
        wc.byte_len() as usize == MSG,
        "advert RECV of {} bytes",
        wc.byte_len()
    );
    ensure!(
        posted.remove(&wc.wr_id()),
        "unknown RECV wr_id {}",
        wc.wr_id()
    );
    let slot = (wc.wr_id() - RECV_BASE) as usize;
    let mut m = [0u8; MSG];
    recv_mr.read_at(slot * MSG, &mut m)?;
    let advert = Advert::decode(&m)?;
    ensure!(
        advert.write.len == DATA as u64 && advert.read.len == DATA as u64,
        "advert sizes"
    );

    // RDMA WRITE (unsignaled) chained with a signaled SEND: one ibv_post_send.
    msg.write_at(0, &message(b"WRITE-DONE"))?;
    let data_sge = [src.sge_all()?];
    let msg_sge = [msg.sge_all()?];
    qp.post_send(&[
        nvmf_rdma::SendWr::write(WRITE_ID, &data_sge, advert.write),
        nvmf_rdma::SendWr::send(SEND_ID, &msg_sge).signaled(),
    ])?;
    let wcs = poll_n(&dev.send_cq, 1, "WRITE+SEND completion")?;
    check_ok(&wcs[0], WcOpcode::Send, "chained SEND")?;
    ensure!(
        wcs[0].wr_id() == SEND_ID,
        "only the SEND is signaled, got wr_id {}",
        wcs[0].wr_id()
    );

    // RDMA READ of the client's other half, one SGE.
    let sink_sge = [sink.sge_all()?];
    qp.post_send(&[nvmf_rdma::SendWr::read(READ_ID, &sink_sge, advert.read).signaled()])?;
    let wcs = poll_n(&dev.send_cq, 1, "READ completion")?;
    check_ok(&wcs[0], WcOpcode::RdmaRead, "RDMA READ")?;
    ensure!(
        wcs[0].wr_id() == READ_ID && wcs[0].byte_len() as usize == DATA,
        "{:?}",
        wcs[0]
    );
    let mut got = vec![0u8; DATA];
    sink.read_at(0, &mut got)?;
    ensure!(got == pattern(0x5A, DATA), "RDMA READ returned wrong bytes");

    msg.write_at(0, &message(b"READ-OK"))?;
    qp.post_send(&[nvmf_rdma::SendWr::send(SEND_ID, &msg_sge).signaled()])?;
    check_ok(
        &poll_n(&dev.send_cq, 1, "READ-OK SEND")?[0],
        WcOpcode::Send,
        "READ-OK SEND",
    )?;

    // The client disconnects; then drain every RECV still posted.
    expect_event(ch, CmEventType::Disconnected)?;
    drain(&qp, &dev.recv_cq, &dev.ctx, posted, "server")?;
    let mut e = [WorkCompletion::default()];
    ensure!(
        dev.send_cq.poll(&mut e)? == 0,
        "stray send completion {:?}",
        e[0]
    );
    println!("server: phase 1 (RQ, WRITE+SEND, READ, drain) ok");
    Ok(())
}

/// Polls the recv CQ for one completion, forwarding COMM_EST (data before ESTABLISHED).
fn poll_recv(dev: &Device, qp: &Qp, id: &CmId) -> Res<WorkCompletion> {
    let deadline = Instant::now() + TIMEOUT;
    let mut wc = [WorkCompletion::default()];
    loop {
        if dev.recv_cq.poll(&mut wc)? == 1 {
            let [wc] = wc;
            return Ok(wc);
        }
        while let Some(ae) = dev.ctx.try_get_async_event()? {
            if ae.kind == nvmf_rdma::AsyncEventType::CommEst
                && ae.element == nvmf_rdma::AsyncElement::QpNum(qp.qp_num())
            {
                id.notify_established()?;
            }
        }
        ensure!(Instant::now() < deadline, "timed out waiting for a RECV");
        thread::sleep(Duration::from_micros(200));
    }
}

/// A WRITE naming a key the peer never registered must fail visibly: on IB/RoCE the requester
/// gets REM_ACCESS_ERR; on iWARP the WRITE completes locally (there is no WRITE ack) and the
/// peer TERMINATEs the stream. Either way the peer's RECVs are flushed and the connection ends.
fn server_bad_rkey_phase(dev: &Device, ch: &EventChannel, id: &CmId) -> Res<()> {
    let qp = Qp::create(
        id,
        &dev.pd,
        &QpInitAttr {
            recv_cq: &dev.recv_cq,
            ..QpInitAttr::new(&dev.send_cq, 4, 1)
        },
    )?;
    let recv_mr = Mr::alloc(&dev.pd, MSG, AccessFlags::LOCAL_WRITE)?;
    qp.post_recv(RECV_BASE, &[recv_mr.sge_all()?])?;
    let src = Mr::alloc(&dev.pd, MSG, AccessFlags::empty())?;
    id.accept(&ConnParam {
        private_data: SERVER_PDATA,
        rnr_retry_count: 7,
        ..Default::default()
    })?;
    expect_event(ch, CmEventType::Established)?;
    // The client speaks first (iWARP: the initiator sends the first message).
    let wc = poll_recv(dev, &qp, id)?;
    check_ok(&wc, WcOpcode::Recv, "BADKEY hello")?;
    let bogus = nvmf_rdma::RemoteBuf {
        addr: 0x1000,
        len: MSG as u64,
        rkey: 0x00de_ad01,
    };
    qp.post_send(&[nvmf_rdma::SendWr::write(WRITE_ID, &[src.sge_all()?], bogus).signaled()])?;
    let wc = poll_n(&dev.send_cq, 1, "bad-rkey WRITE completion")?.remove(0);
    ensure!(wc.wr_id() == WRITE_ID, "completion {wc:?}");
    match dev.ctx.transport() {
        Transport::Iwarp => {}
        _ => ensure!(
            wc.status() == WcStatus::RemAccessErr,
            "bad-rkey WRITE completed with {} ({wc:?})",
            wc.status()
        ),
    }
    println!(
        "server: bad-rkey WRITE completed with status {:?} ({})",
        wc.status(),
        wc.status()
    );
    expect_event(ch, CmEventType::Disconnected)?;
    drain(
        &qp,
        &dev.recv_cq,
        &dev.ctx,
        BTreeSet::new(),
        "server bad-rkey",
    )?;
    let mut e = [WorkCompletion::default()];
    ensure!(
        dev.send_cq.poll(&mut e)? == 0,
        "stray send completion {:?}",
        e[0]
    );
    println!("server: phase 3 (bad rkey) ok");
    Ok(())
}

fn server_srq_phase(dev: &Device, ch: &EventChannel, id: &CmId) -> Res<()> {
    let srq = Arc::new(Srq::new(&dev.pd, 8, 1)?);
    let recv_mr = Mr::alloc(&dev.pd, NRECV as usize * MSG, AccessFlags::LOCAL_WRITE)?;
    for i in 0..NRECV as usize {
        srq.post_recv(RECV_BASE + i as u64, &[recv_mr.sge(i * MSG, MSG)?])?;
    }
    let qp = Qp::create(
        id,
        &dev.pd,
        &QpInitAttr {
            recv_cq: &dev.recv_cq,
            srq: Some(&srq),
            max_recv_sge: 0,
            ..QpInitAttr::new(&dev.send_cq, 4, 0)
        },
    )?;
    ensure!(
        qp.post_recv(0, &[]).is_err(),
        "posting a RECV on an SRQ-attached QP must fail"
    );
    id.accept(&ConnParam {
        private_data: SERVER_PDATA,
        rnr_retry_count: 7,
        ..Default::default()
    })?;
    expect_event(ch, CmEventType::Established)?;
    let mut seen = BTreeSet::new();
    for n in 0..2u8 {
        let wc = poll_recv(dev, &qp, id)?;
        check_ok(&wc, WcOpcode::Recv, "SRQ RECV")?;
        ensure!(
            wc.qp_num() == qp.qp_num(),
            "SRQ completion names QP {}",
            wc.qp_num()
        );
        ensure!(
            seen.insert(wc.wr_id()),
            "SRQ wr_id {} completed twice",
            wc.wr_id()
        );
        let mut m = [0u8; MSG];
        recv_mr.read_at((wc.wr_id() - RECV_BASE) as usize * MSG, &mut m)?;
        ensure!(
            m == message(&[b'S', b'R', b'Q', b'0' + n]),
            "SRQ message {n}: {m:?}"
        );
    }
    expect_event(ch, CmEventType::Disconnected)?;
    qp.set_error()?;
    drop(qp); // the SRQ keeps its remaining RECVs; it goes after the QP.
    drop(srq);
    println!("server: phase 2 (SRQ) ok");
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Client

const CLIENT_CQ_TAG: u64 = 77;

fn client_connect(ch: &EventChannel, server: SocketAddr, tag: u64) -> Res<(CmId, Arc<Context>)> {
    let (id, ctx) = active::resolve(ch, tag, server, Instant::now() + Duration::from_secs(5))?;
    ensure!(
        id.peer_addr() == Some(server),
        "peer address {:?}",
        id.peer_addr()
    );
    Ok((id, ctx))
}

fn client(server: SocketAddr, ready: mpsc::Receiver<()>) -> Res<()> {
    ready.recv_timeout(TIMEOUT)?;
    let ch = EventChannel::new()?;

    // ---- phase 1 ----
    let (id, ctx) = client_connect(&ch, server, 2)?;
    let attr = ctx.query_device()?;
    let pd = Arc::new(Pd::new(&ctx)?);
    let comp = Arc::new(CompChannel::new(&ctx)?);
    let cq = Arc::new(Cq::with_channel(&ctx, 32, &comp, CLIENT_CQ_TAG)?);
    let qp = Qp::create(&id, &pd, &QpInitAttr::new(&cq, 8, NRECV as u32))?;
    let recv_mr = Mr::alloc(&pd, NRECV as usize * MSG, AccessFlags::LOCAL_WRITE)?;
    qp.post_recv_slots(&recv_mr, MSG, NRECV as usize, 200)?;
    let mut posted: BTreeSet<u64> = (200..200 + NRECV).collect();
    let data = Mr::alloc(
        &pd,
        2 * DATA,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )?;
    ensure!(
        data.owns_memory() && data.len() == 2 * DATA,
        "data MR {data:?}"
    );
    data.write_at(DATA, &pattern(0x5A, DATA))?;
    let msg = Mr::alloc(&pd, MSG, AccessFlags::empty())?;

    let ev = active::connect(
        &ch,
        &id,
        &ConnParam {
            private_data: CLIENT_PDATA,
            responder_resources: attr.max_qp_rd_atom.clamp(1, 16) as u8,
            initiator_depth: 0,
            flow_control: true,
            retry_count: 7,
            rnr_retry_count: 7,
        },
        Instant::now() + TIMEOUT,
    )?;
    ensure!(
        ev.private_data().starts_with(SERVER_PDATA),
        "client got reply private data {:?}",
        ev.private_data()
    );
    ensure!(id.local_addr().is_some(), "no local address after connect");

    // Advert: write half at offset 0, read half at DATA.
    let advert = Advert {
        write: data.remote(0, DATA)?,
        read: data.remote(DATA, DATA)?,
    };
    msg.write_at(0, &advert.encode())?;
    qp.post_send(&[nvmf_rdma::SendWr::send(9, &[msg.sge_all()?]).signaled()])?;
    // The SEND's completion (on the ACK) and the RECV of the server's WRITE-DONE may be
    // reported in either order: take two completions and classify them.
    let mut m = [0u8; MSG];
    let (mut sent, mut write_done) = (false, false);
    for _ in 0..2 {
        let wc = wait_one(&cq, &comp, "advert SEND / WRITE-DONE")?;
        ensure!(
            wc.status() == WcStatus::Success,
            "completion failed: {} ({wc:?})",
            wc.status()
        );
        match wc.opcode() {
            WcOpcode::Send if wc.wr_id() == 9 && !sent => sent = true,
            WcOpcode::Recv if !write_done => {
                ensure!(
                    posted.remove(&wc.wr_id()),
                    "unknown RECV wr_id {}",
                    wc.wr_id()
                );
                recv_mr.read_at((wc.wr_id() - 200) as usize * MSG, &mut m)?;
                ensure!(
                    m == message(b"WRITE-DONE"),
                    "expected WRITE-DONE, got {m:?}"
                );
                ensure!(
                    wc.invalidated_rkey().is_none(),
                    "plain SEND reported an invalidation"
                );
                write_done = true;
            }
            _ => return Err(format!("unexpected completion {wc:?}").into()),
        }
    }
    // WRITE-DONE arrived: the RDMA WRITE before it on the same QP has been placed.
    let mut got = vec![0u8; DATA];
    data.read_at(0, &mut got)?;
    ensure!(got == pattern(0xA5, DATA), "RDMA WRITE placed wrong bytes");

    let wc = wait_one(&cq, &comp, "READ-OK")?;
    check_ok(&wc, WcOpcode::Recv, "READ-OK RECV")?;
    ensure!(
        posted.remove(&wc.wr_id()),
        "unknown RECV wr_id {}",
        wc.wr_id()
    );
    recv_mr.read_at((wc.wr_id() - 200) as usize * MSG, &mut m)?;
    ensure!(m == message(b"READ-OK"), "expected READ-OK, got {m:?}");

    id.disconnect()?;
    expect_event(&ch, CmEventType::Disconnected)?;
    drain(&qp, &cq, &ctx, posted, "client")?;
    drop(qp);
    drop(id);
    println!("client: phase 1 ok");

    // ---- phase 2: the server receives through an SRQ ----
    let (id, ctx2) = client_connect(&ch, server, 3)?;
    ensure!(
        *ctx2 == *ctx,
        "second connection resolved to another device context"
    );
    let qp = Qp::create(
        &id,
        &pd,
        &QpInitAttr {
            max_inline_data: MSG as u32,
            sq_sig_all: true,
            ..QpInitAttr::new(&cq, 4, 1)
        },
    )?;
    active::connect(
        &ch,
        &id,
        &ConnParam {
            private_data: CLIENT_PDATA,
            rnr_retry_count: 7,
            ..Default::default()
        },
        Instant::now() + TIMEOUT,
    )?;
    ensure!(
        qp.caps().max_inline_data >= MSG as u32,
        "inline caps {:?}",
        qp.caps()
    );
    for n in 0..2u8 {
        // INLINE copies the bytes at post time: overwriting the buffer right after the post
        // must not change what the server receives. sq_sig_all signals without the flag.
        msg.write_at(0, &message(&[b'S', b'R', b'Q', b'0' + n]))?;
        qp.post_send(&[nvmf_rdma::SendWr::send(10 + n as u64, &[msg.sge_all()?]).inline()])?;
        msg.fill(0, MSG, 0xEE)?;
        check_ok(
            &wait_one(&cq, &comp, "SRQ SEND")?,
            WcOpcode::Send,
            "SRQ SEND",
        )?;
    }
    id.disconnect()?;
    expect_event(&ch, CmEventType::Disconnected)?;
    drain(&qp, &cq, &ctx, BTreeSet::new(), "client phase 2")?;
    drop(qp);
    drop(id);
    println!("client: phase 2 ok");

    // ---- phase 3: the server WRITEs with a bad rkey: our RECVs are flushed ----
    let (id, _) = client_connect(&ch, server, 4)?;
    let qp = Qp::create(&id, &pd, &QpInitAttr::new(&cq, 2, 2))?;
    qp.post_recv_slots(&recv_mr, MSG, 2, 300)?;
    active::connect(
        &ch,
        &id,
        &ConnParam {
            private_data: CLIENT_PDATA,
            responder_resources: 1,
            rnr_retry_count: 7,
            ..Default::default()
        },
        Instant::now() + TIMEOUT,
    )?;
    msg.write_at(0, &message(b"BADKEY"))?;
    qp.post_send(&[nvmf_rdma::SendWr::send(20, &[msg.sge_all()?]).signaled()])?;
    let mut flushed = BTreeSet::new();
    let mut hello_sent = false;
    while !(hello_sent && flushed.len() == 2) {
        let wc = wait_one(&cq, &comp, "hello SEND / flushed RECVs")?;
        match wc.wr_id() {
            20 => {
                ensure!(
                    wc.status() == WcStatus::Success,
                    "hello SEND: {}",
                    wc.status()
                );
                hello_sent = true;
            }
            300 | 301 => {
                ensure!(
                    wc.status() == WcStatus::WrFlushErr,
                    "RECV {}: {}",
                    wc.wr_id(),
                    wc.status()
                );
                ensure!(
                    flushed.insert(wc.wr_id()),
                    "RECV {} flushed twice",
                    wc.wr_id()
                );
            }
            _ => return Err(format!("unexpected completion {wc:?}").into()),
        }
    }
    // The QP is in error; the connection may already be closing (iWARP TERMINATE).
    if let Err(e) = id.disconnect() {
        println!("client: disconnect after the access error: {e}");
    }
    expect_event(&ch, CmEventType::Disconnected)?;
    drain(&qp, &cq, &ctx, BTreeSet::new(), "client bad-rkey")?;
    drop(qp);
    drop(id);
    println!("client: phase 3 ok: both RECVs flushed after the peer's access error");

    // ---- phase 4: rejected with private data ----
    let (id, _) = client_connect(&ch, server, 5)?;
    let qp = Qp::create(&id, &pd, &QpInitAttr::new(&cq, 1, 1))?;
    let param = ConnParam {
        private_data: CLIENT_PDATA,
        rnr_retry_count: 7,
        ..Default::default()
    };
    let (status, pdata) = match active::connect(&ch, &id, &param, Instant::now() + TIMEOUT) {
        Err(ConnectError::Rejected {
            status,
            private_data,
        }) => (status, private_data),
        Ok(_) => return Err("connect established, expected REJECTED".into()),
        Err(e) => return Err(format!("expected REJECTED: {e}").into()),
    };
    ensure!(
        pdata.len() >= 4 && pdata[..4] == REJECT_PDATA,
        "reject private data {pdata:?} (status {status})"
    );
    println!(
        "client: phase 4 ok: REJECTED status {status} with {} bytes of private data",
        pdata.len()
    );
    drop(qp);
    drop(id);
    Ok(())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(ip) = args.next().and_then(|s| s.parse::<IpAddr>().ok()) else {
        eprintln!("usage: loopback IP [PORT]");
        std::process::exit(2);
    };
    let port = match args.next().map(|p| p.parse::<u16>()) {
        None => 18515,
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            eprintln!("loopback: bad port: {e}");
            std::process::exit(2);
        }
    };
    let addr = SocketAddr::new(ip, port);
    let (tx, rx) = mpsc::channel();
    let srv = thread::spawn(move || server(addr, tx).map_err(|e| e.to_string()));
    let cli = thread::spawn(move || client(addr, rx).map_err(|e| e.to_string()));
    let c = cli
        .join()
        .unwrap_or_else(|_| Err("client thread panicked".into()));
    let s = srv
        .join()
        .unwrap_or_else(|_| Err("server thread panicked".into()));
    match (s, c) {
        (Ok(dev), Ok(())) => println!("loopback OK on {dev}"),
        (s, c) => {
            if let Err(e) = &s {
                eprintln!("loopback FAILED: server: {e}");
            }
            if let Err(e) = &c {
                eprintln!("loopback FAILED: client: {e}");
            }
            std::process::exit(1);
        }
    }
}
