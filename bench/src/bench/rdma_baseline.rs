//! The raw-verbs limits of the NVMe/RDMA path, for `--suite --transport rdma`: what the RDMA
//! device does with the same bytes when no protocol sits on it, measured in the same run.
//!
//! Both ends live in this process, connected over rdma_cm to an address of the device (as
//! `rdma/examples/loopback.rs` does), one RC connection per job:
//!
//! - **stream**: the client keeps [`STREAM_DEPTH`] RDMA operations of `max(bs, 128k)` bytes in
//!   flight against a buffer the server registered (address and rkey in the accept's private
//!   data): RDMA WRITEs for read-heavy workloads (the target's WRITE of read data to the host)
//!   and RDMA READs for write-heavy ones (the target's READ of write data from the host). The
//!   server side is passive, as the host side of NVMe/RDMA data transfers is. Bandwidth.
//! - **ping-pong**: per job `iodepth` requests in flight; each side answers SENDs with SENDs.
//!   For read-heavy workloads a request is 64 bytes (an NVMe SQE, the command capsule without
//!   data) and the reply carries `bs` bytes; for write-heavy ones the request carries `bs`
//!   bytes and the reply is 16 bytes (a CQE, the response capsule). Latency from posting a
//!   request to reaping its reply's RECV, in an HDR histogram (replies come in order on one
//!   RC QP); the reply rate is the IOPS a protocol adding nothing could reach.
//!
//! Who waits how, as in the TCP baseline ([`super::baseline`]): the server side busy-polls its
//! CQ (as nvmf-target's RDMA poller does while it has traffic); the client waits the way the
//! initiator's RDMA queue waits: it busy-polls with `spin` (`--hipri`), and otherwise polls an
//! empty CQ [`SPIN_BEFORE_SLEEP`] times before it arms the CQ and sleeps on a completion
//! channel.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma::{
    active, AccessFlags, CmEvent, CmEventType, CmId, CompChannel, ConnParam, Cq, EventChannel, Mr,
    Pd, Qp, QpInitAttr, RemoteBuf, SendWr, Sge, WcOpcode, WorkCompletion,
};

use super::job::DirStats;

/// Bytes of an NVMe/RDMA command capsule without in-capsule data (one SQE).
const REQ_LEN: usize = 64;
/// Bytes of an NVMe/RDMA response capsule (one CQE).
const RESP_LEN: usize = 16;
/// Smallest RDMA operation of the stream.
pub const STREAM_CHUNK: usize = 128 << 10;
/// RDMA operations the stream keeps in flight per connection.
pub const STREAM_DEPTH: usize = 16;
/// Connection setup and "no completion for this long" limit.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Polls of an empty CQ before the (not busy-polling) client sleeps: the initiator's value.
const SPIN_BEFORE_SLEEP: u32 = 64;
/// The CQ tag of the client's completion channel.
const CLIENT_CQ: u64 = 1;

type Res<T> = Result<T, String>;

fn verbs<T>(what: &str, r: rdma::Result<T>) -> Res<T> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// The stream's result.
#[derive(Debug, Clone)]
pub struct Stream {
    /// "write" or "read".
    pub op: &'static str,
    pub connections: usize,
    /// Bytes of one RDMA operation.
    pub chunk: usize,
    pub bytes: u64,
    pub elapsed: Duration,
}

/// The ping-pong's result.
#[derive(Debug, Clone)]
pub struct PingPong {
    pub connections: usize,
    pub depth: usize,
    pub request_bytes: usize,
    pub reply_bytes: usize,
    /// Replies (ios), payload bytes (bs per reply), latency.
    pub stats: DirStats,
    pub elapsed: Duration,
}

#[derive(Debug, Clone)]
pub struct RdmaBaseline {
    /// The RDMA device the address belongs to.
    pub device: String,
    pub stream: Stream,
    pub pingpong: PingPong,
}

/// Measure both on `ip` (an address of an RDMA device), each for `each`.
pub fn run(
    ip: IpAddr,
    bs: usize,
    depth: usize,
    jobs: usize,
    reads: bool,
    spin: bool,
    each: Duration,
) -> Res<RdmaBaseline> {
    let stream = stream(ip, bs, jobs, reads, each)?;
    let (pingpong, device) = pingpong(ip, bs, depth, jobs, reads, spin, each)?;
    Ok(RdmaBaseline {
        device,
        stream,
        pingpong,
    })
}

/// What one end of a connection registers before it connects or accepts.
#[derive(Clone, Copy)]
struct Layout {
    /// RECV slots posted at once, and their size.
    nrecv: usize,
    recv_len: usize,
    /// The buffer SENDs and RDMA WRITEs are gathered from / RDMA READs land in.
    data_len: usize,
    data_access: AccessFlags,
    /// Send queue depth.
    nsend: u32,
    /// Sleep on a completion channel (else: busy-poll only).
    channel: bool,
}

/// One end of a connection. Field order is drop order: the QP before its CQ, PD and id.
struct End {
    qp: Qp,
    cq: Arc<Cq>,
    comp: Option<Arc<CompChannel>>,
    recv: Mr,
    data: Mr,
    recv_len: usize,
    _pd: Arc<Pd>,
    id: CmId,
    /// Its event channel (the listener's for the server end).
    ch: Option<EventChannel>,
}

impl End {
    fn new(id: CmId, ch: Option<EventChannel>, l: Layout) -> Res<End> {
        let ctx = verbs("rdma_cm id", id.context())?.ok_or("rdma_cm id bound to no device")?;
        let attr = verbs("ibv_query_device", ctx.query_device())?;
        let nrecv = l.nrecv as u32;
        if nrecv.max(l.nsend) > attr.max_qp_wr {
            return Err(format!(
                "{} work requests per queue needed; the device allows {}",
                nrecv.max(l.nsend),
                attr.max_qp_wr
            ));
        }
        let pd = Arc::new(verbs("ibv_alloc_pd", Pd::new(&ctx))?);
        let comp = if l.channel {
            Some(Arc::new(verbs(
                "ibv_create_comp_channel",
                CompChannel::new(&ctx),
            )?))
        } else {
            None
        };
        let cqe = nrecv + l.nsend + 8;
        let cq = Arc::new(match &comp {
            Some(c) => verbs("ibv_create_cq", Cq::with_channel(&ctx, cqe, c, CLIENT_CQ))?,
            None => verbs("ibv_create_cq", Cq::new(&ctx, cqe))?,
        });
        let qp = verbs(
            "rdma_create_qp",
            Qp::create(&id, &pd, &QpInitAttr::new(&cq, l.nsend, nrecv.max(1))),
        )?;
        let recv = verbs(
            "ibv_reg_mr",
            Mr::alloc(&pd, (l.nrecv * l.recv_len).max(1), AccessFlags::LOCAL_WRITE),
        )?;
        let data = verbs("ibv_reg_mr", Mr::alloc(&pd, l.data_len, l.data_access))?;
        let end = End {
            qp,
            cq,
            comp,
            recv,
            data,
            recv_len: l.recv_len,
            _pd: pd,
            id,
            ch,
        };
        // Every RECV before the connection is up: the peer may SEND once it is.
        verbs(
            "ibv_post_recv",
            end.qp.post_recv_slots(&end.recv, l.recv_len, l.nrecv, 0),
        )?;
        Ok(end)
    }

    fn recv_sge(&self, slot: u64) -> Res<Sge> {
        verbs(
            "RECV slot",
            self.recv.sge(slot as usize * self.recv_len, self.recv_len),
        )
    }

    fn repost(&self, slot: u64) -> Res<()> {
        verbs(
            "ibv_post_recv",
            self.qp.post_recv(slot, &[self.recv_sge(slot)?]),
        )
    }

    /// Poll completions into `wcs`; with a completion channel and nothing there, arm the CQ,
    /// poll again, then sleep on the channel (up to [`TIMEOUT`]). Err also on a failed
    /// completion.
    fn reap(&self, wcs: &mut [WorkCompletion], sleep: bool) -> Res<usize> {
        let n = verbs("ibv_poll_cq", self.cq.poll(wcs))?;
        let n = match (&self.comp, n, sleep) {
            (Some(comp), 0, true) => {
                verbs("ibv_req_notify_cq", self.cq.req_notify(false))?;
                let n = verbs("ibv_poll_cq", self.cq.poll(wcs))?;
                if n == 0 {
                    verbs("ibv_get_cq_event", comp.get_event(Some(TIMEOUT)))?;
                }
                n
            }
            _ => n,
        };
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Err(format!(
                    "{:?} completion {} failed: {}",
                    wc.opcode(),
                    wc.wr_id(),
                    wc.status()
                ));
            }
        }
        Ok(n)
    }
}

/// A connection: the client end, the server end, the accept's private data the client got.
type Pair = (End, End, Vec<u8>);
/// A ping-pong client's replies and the time of its last counted one.
type ClientResult = Res<(DirStats, Instant)>;

fn expect(ch: &EventChannel, want: CmEventType, what: &str) -> Res<CmEvent> {
    let ev = verbs("rdma_get_cm_event", ch.get_event(Some(TIMEOUT)))?
        .ok_or_else(|| format!("{what}: no {want} within {TIMEOUT:?}"))?;
    if ev.event_type() != want {
        return Err(format!(
            "{what}: {} (status {}), expected {want}",
            ev.event_type(),
            ev.status()
        ));
    }
    Ok(ev)
}

/// A listener on `ip` (any free port) and `n` connections to it, set up one after the other
/// from this thread (rdma_cm calls do not block). `pdata(server_end)` is the accept's private
/// data. Returns (client, server, the accept's private data as the client got it) and the
/// device name.
fn connect_pairs(
    ip: IpAddr,
    n: usize,
    client: Layout,
    server: Layout,
    reads_from_client: bool,
    pdata: impl Fn(&End) -> Vec<u8>,
) -> Res<(Vec<Pair>, String)> {
    let lch = verbs("rdma_create_event_channel", EventChannel::new())?;
    let listener = verbs("rdma_create_id", lch.create_id(0))?;
    verbs("rdma_bind_addr", listener.bind_addr(SocketAddr::new(ip, 0)))
        .map_err(|e| format!("{e} ({ip} is not the address of an RDMA device?)"))?;
    verbs("rdma_listen", listener.listen(n as i32 + 1))?;
    let addr = listener
        .local_addr()
        .ok_or("the RDMA listener has no address")?;
    let mut pairs = Vec::new();
    let mut device = String::new();
    for _ in 0..n {
        let deadline = Instant::now() + TIMEOUT;
        let cch = verbs("rdma_create_event_channel", EventChannel::new())?;
        let (id, ctx) = active::resolve(&cch, 0, addr, deadline).map_err(|e| e.to_string())?;
        let attr = verbs("ibv_query_device", ctx.query_device())?;
        device = ctx.name();
        let c = End::new(id, Some(cch), client)?;
        // RDMA READs from the client need the server to accept them (its IRD) and the client
        // to issue them (its ORD).
        let rd = attr.max_qp_init_rd_atom.clamp(1, 16) as u8;
        verbs(
            "rdma_connect",
            c.id.connect(&ConnParam {
                private_data: &[],
                responder_resources: attr.max_qp_rd_atom.clamp(1, 16) as u8,
                initiator_depth: if reads_from_client { rd } else { 0 },
                flow_control: true,
                retry_count: 7,
                rnr_retry_count: 7,
            }),
        )?;
        let mut ev = expect(&lch, CmEventType::ConnectRequest, "connect request")?;
        let sid = ev.take_new_id().ok_or("CONNECT_REQUEST without an id")?;
        let (ird, ord) = (ev.initiator_depth(), ev.responder_resources());
        drop(ev);
        let s = End::new(sid, None, server)?;
        let pd = pdata(&s);
        verbs(
            "rdma_accept",
            s.id.accept(&ConnParam {
                private_data: &pd,
                responder_resources: ird.min(attr.max_qp_rd_atom.min(255) as u8),
                initiator_depth: ord.min(attr.max_qp_init_rd_atom.min(255) as u8),
                flow_control: true,
                rnr_retry_count: 7,
                ..Default::default()
            }),
        )?;
        let ev =
            active::wait_established(c.ch.as_ref().expect("client end has a channel"), deadline)
                .map_err(|e| e.to_string())?;
        let remote = ev.private_data().to_vec();
        drop(ev);
        expect(&lch, CmEventType::Established, "accept")?;
        pairs.push((c, s, remote));
    }
    // The connections keep their ids (and through them the listener's channel).
    drop(listener);
    Ok((pairs, device))
}

fn encode_remote(r: &RemoteBuf) -> Vec<u8> {
    let mut v = Vec::with_capacity(20);
    v.extend_from_slice(&r.addr.to_le_bytes());
    v.extend_from_slice(&r.len.to_le_bytes());
    v.extend_from_slice(&r.rkey.to_le_bytes());
    v
}

fn decode_remote(b: &[u8]) -> Res<RemoteBuf> {
    if b.len() < 20 {
        return Err(format!("accept private data of {} bytes", b.len()));
    }
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    Ok(RemoteBuf {
        addr: u64_at(0),
        len: u64_at(8),
        rkey: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
    })
}

fn stream(ip: IpAddr, bs: usize, jobs: usize, reads: bool, dur: Duration) -> Res<Stream> {
    let chunk = bs.max(STREAM_CHUNK);
    let (op, local_access) = if reads {
        ("write", AccessFlags::empty())
    } else {
        ("read", AccessFlags::LOCAL_WRITE)
    };
    let client = Layout {
        nrecv: 0,
        recv_len: 0,
        data_len: chunk,
        data_access: local_access,
        nsend: STREAM_DEPTH as u32 + 1,
        channel: false,
    };
    let server = Layout {
        nrecv: 0,
        recv_len: 0,
        data_len: chunk,
        data_access: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ,
        nsend: 1,
        channel: false,
    };
    let (pairs, _) = connect_pairs(ip, jobs, client, server, !reads, |s| {
        s.data
            .remote(0, chunk)
            .map_or_else(|_| Vec::new(), |r| encode_remote(&r))
    })?;
    let remotes = pairs
        .iter()
        .map(|(_, _, pd)| decode_remote(pd))
        .collect::<Res<Vec<RemoteBuf>>>()?;
    let t0 = Instant::now();
    let end = t0 + dur;
    // A QP is posted to by one thread: each client end moves into its thread and back.
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for (c, s, _) in pairs {
        clients.push(c);
        servers.push(s);
    }
    let results: Vec<(End, Res<u64>)> = std::thread::scope(|s| {
        let hs: Vec<_> = clients
            .into_iter()
            .zip(remotes)
            .map(|(c, remote)| {
                s.spawn(move || {
                    let r = stream_one(&c, reads, remote, chunk, end);
                    (c, r)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let elapsed = t0.elapsed();
    let mut bytes = 0;
    let mut err = None;
    let mut clients = Vec::new();
    for (c, r) in results {
        clients.push(c);
        match r {
            Ok(b) => bytes += b,
            Err(e) => err = Some(e),
        }
    }
    close(clients, servers);
    if let Some(e) = err {
        return Err(e);
    }
    Ok(Stream {
        op,
        connections: jobs,
        chunk,
        bytes,
        elapsed,
    })
}

/// One connection's stream: `STREAM_DEPTH` operations in flight until `end`; the bytes moved.
fn stream_one(c: &End, reads: bool, remote: RemoteBuf, chunk: usize, end: Instant) -> Res<u64> {
    let op = if reads { "WRITE" } else { "READ" };
    let sge = verbs("data", c.data.sge_all())?;
    let sges = [sge];
    let wr = |i: u64| {
        if reads {
            SendWr::write(i, &sges, remote).signaled()
        } else {
            SendWr::read(i, &sges, remote).signaled()
        }
    };
    let mut wcs = vec![WorkCompletion::default(); STREAM_DEPTH];
    let wrs: Vec<SendWr<'_>> = (0..STREAM_DEPTH as u64).map(wr).collect();
    verbs("ibv_post_send", c.qp.post_send(&wrs))?;
    let (mut out, mut bytes) = (STREAM_DEPTH, 0u64);
    let mut last = Instant::now();
    while out > 0 {
        let n = c.reap(&mut wcs, false)?;
        let now = Instant::now();
        if n == 0 {
            if now.duration_since(last) > TIMEOUT {
                return Err(format!("no RDMA {op} completed within {TIMEOUT:?}"));
            }
            std::hint::spin_loop();
            continue;
        }
        last = now;
        out -= n;
        bytes += (n * chunk) as u64;
        if now < end {
            verbs("ibv_post_send", c.qp.post_send(&wrs[..n]))?;
            out += n;
        }
    }
    Ok(bytes)
}

/// Disconnect every connection (the DREQ/DREP exchange completes in the kernel; the ids are
/// destroyed on drop).
fn close(clients: Vec<End>, servers: Vec<End>) {
    for c in &clients {
        let _ = c.id.disconnect();
    }
    drop(clients);
    drop(servers);
}

/// wr_id of the SENDs (RECVs use their slot number).
const SEND_ID: u64 = u64::MAX;

fn pingpong(
    ip: IpAddr,
    bs: usize,
    depth: usize,
    jobs: usize,
    reads: bool,
    spin: bool,
    dur: Duration,
) -> Res<(PingPong, String)> {
    let (req_len, resp_len) = if reads { (REQ_LEN, bs) } else { (bs, RESP_LEN) };
    // Each side's SENDs complete on the peer's ACK, which may come after the peer's reply:
    // room for twice the depth.
    let nsend = 2 * depth as u32 + 2;
    let client = Layout {
        nrecv: depth,
        recv_len: resp_len,
        data_len: req_len,
        data_access: AccessFlags::empty(),
        nsend,
        channel: !spin,
    };
    let server = Layout {
        nrecv: depth,
        recv_len: req_len,
        data_len: resp_len,
        data_access: AccessFlags::empty(),
        nsend,
        channel: false,
    };
    let (pairs, device) = connect_pairs(ip, jobs, client, server, false, |_| Vec::new())?;
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let end = t0 + dur;
    // Each end moves into its thread (one poster per QP) and back.
    let (results, servers): (Vec<(End, ClientResult)>, Vec<End>) = std::thread::scope(|s| {
        let stop = &stop;
        let mut srv_threads = Vec::new();
        let mut cli_threads = Vec::new();
        for (c, srv, _) in pairs {
            srv_threads.push(s.spawn(move || {
                serve(&srv, depth, stop);
                srv
            }));
            cli_threads.push(s.spawn(move || {
                let r = client_loop(&c, bs, depth, t0, end);
                (c, r)
            }));
        }
        let join = |h: std::thread::ScopedJoinHandle<'_, _>| {
            h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        };
        let r: Vec<_> = cli_threads.into_iter().map(join).collect();
        stop.store(true, Ordering::Release);
        let srvs: Vec<End> = srv_threads
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        (r, srvs)
    });
    let mut stats = DirStats::new();
    let mut last = end;
    let mut err = None;
    let mut clients = Vec::new();
    for (c, r) in results {
        clients.push(c);
        match r {
            Ok((st, l)) => {
                stats.add(&st);
                last = last.max(l);
            }
            Err(e) => err = Some(e),
        }
    }
    close(clients, servers);
    if let Some(e) = err {
        return Err(e);
    }
    Ok((
        PingPong {
            connections: jobs,
            depth,
            request_bytes: req_len,
            reply_bytes: resp_len,
            stats,
            elapsed: last.duration_since(t0),
        },
        device,
    ))
}

/// The server end: busy-poll, answer every request RECV with a reply SEND (reposting its
/// RECV first), batched per poll. Ends when `stop` is set; a failure also ends it (the client
/// then times out and says so).
fn serve(srv: &End, depth: usize, stop: &AtomicBool) {
    let Ok(sge) = srv.data.sge_all() else { return };
    let sges = [sge];
    let mut wcs = vec![WorkCompletion::default(); 2 * depth + 2];
    let reply: Vec<SendWr<'_>> = (0..depth)
        .map(|_| SendWr::send(SEND_ID, &sges).signaled())
        .collect();
    while !stop.load(Ordering::Acquire) {
        let Ok(n) = srv.reap(&mut wcs, false) else {
            return;
        };
        let mut answer = 0;
        for wc in &wcs[..n] {
            if wc.opcode() == WcOpcode::Recv {
                if srv.repost(wc.wr_id()).is_err() {
                    return;
                }
                answer += 1;
            }
        }
        if answer > 0 && srv.qp.post_send(&reply[..answer]).is_err() {
            return;
        }
        if n == 0 {
            std::hint::spin_loop();
        }
    }
}

/// The client end: `depth` requests in flight until `end`, the latency of each from its post
/// to its reply's RECV completion. Returns the stats and the time of the last counted reply.
fn client_loop(
    c: &End,
    bs: usize,
    depth: usize,
    t0: Instant,
    end: Instant,
) -> Res<(DirStats, Instant)> {
    let sges = [verbs("request", c.data.sge_all())?];
    let req: Vec<SendWr<'_>> = (0..depth)
        .map(|_| SendWr::send(SEND_ID, &sges).signaled())
        .collect();
    let mut wcs = vec![WorkCompletion::default(); 2 * depth + 2];
    let mut sent = vec![t0; depth];
    let mut stats = DirStats::new();
    let (mut head, mut outstanding) = (0usize, depth);
    let mut last = end;
    let mut last_wc = Instant::now();
    let mut empty = 0u32;
    sent.fill(last_wc);
    verbs("ibv_post_send", c.qp.post_send(&req))?;
    while outstanding > 0 {
        let n = c.reap(&mut wcs, empty >= SPIN_BEFORE_SLEEP)?;
        empty = if n == 0 { empty + 1 } else { 0 };
        let now = Instant::now();
        if n == 0 {
            if now.duration_since(last_wc) > TIMEOUT {
                return Err(format!(
                    "ping-pong: no completion within {TIMEOUT:?} ({outstanding} requests out)"
                ));
            }
            std::hint::spin_loop();
            continue;
        }
        last_wc = now;
        let mut again = 0;
        for wc in &wcs[..n] {
            if wc.opcode() != WcOpcode::Recv {
                continue;
            }
            c.repost(wc.wr_id())?;
            outstanding -= 1;
            // The window is `end`, stretched on a starved machine until the first reply.
            if now <= end || stats.ios == 0 {
                last = now;
                stats.ios += 1;
                stats.bytes += bs as u64;
                let ns = now.duration_since(sent[head]).as_nanos() as u64;
                stats.hist.saturating_record(ns.max(1));
                again += 1;
            }
            head = (head + 1) % depth;
        }
        if again > 0 {
            let now = Instant::now();
            let tail = (head + outstanding) % depth;
            for i in 0..again {
                sent[(tail + i) % depth] = now;
            }
            verbs("ibv_post_send", c.qp.post_send(&req[..again]))?;
            outstanding += again;
        }
    }
    Ok((stats, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertised_buffer_round_trips() {
        let r = RemoteBuf {
            addr: 0x7f00_1234_5000,
            len: 128 << 10,
            rkey: 0xdead_beef,
        };
        let b = encode_remote(&r);
        assert_eq!(b.len(), 20);
        assert_eq!(decode_remote(&b).unwrap(), r);
        // rdma_cm may pad private data: longer is fine, shorter is an error.
        let mut padded = b.clone();
        padded.resize(196, 0);
        assert_eq!(decode_remote(&padded).unwrap(), r);
        assert!(decode_remote(&b[..19]).is_err());
    }

    #[test]
    fn an_address_without_rdma_is_an_error_not_a_panic() {
        // 192.0.2.1 (TEST-NET-1) is on no interface: without RDMA the event channel fails,
        // with an RDMA device rdma_bind_addr does.
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let e = run(ip, 4096, 1, 1, true, false, Duration::from_millis(10)).unwrap_err();
        assert!(!e.is_empty());
    }
}
