//! `--raw-tcp-baseline`: what a plain loopback TCP socket pair does with the same bytes, in
//! the same run: the physical limit an NVMe/TCP initiator and target sit on.
//!
//! - **stream**: one sender writes as fast as it can, one receiver reads; bandwidth. One pair
//!   per job. Writes are `bs` bytes, at least [`STREAM_CHUNK`], so the number is the socket's
//!   ceiling rather than a system-call rate.
//! - **ping-pong**: per job one connection with `iodepth` requests in flight; each side reads
//!   whatever has arrived and answers all whole messages in it with one write. For read-heavy
//!   workloads a request is 72 bytes (the size of an NVMe/TCP command capsule) and the reply
//!   is `bs` bytes; for write-heavy ones the request carries `bs` bytes and the reply is 24
//!   bytes (a response capsule). Latency is measured from sending a request to receiving its
//!   whole reply, in an HDR histogram, and the reply rate is the IOPS a protocol could reach
//!   on this socket if it added nothing.
//!
//! # Why the ping-pong is set up the way it is
//! It must be the best the NVMe/TCP path could possibly do on this machine, and the same from
//! run to run. Earlier versions blocked in `read` on both sides and measured 22 us in one
//! run and 105 us in another: with two (shared) cores, each round trip then costs two
//! thread wake-ups, and a wake-up costs whatever the scheduler does that moment (the woken
//! thread waits for a busy core, or the idle core leaves a deep C-state). So:
//! - **Server side busy-polls** a non-blocking socket, exactly as nvmf-target's poller does
//!   while it has traffic (it spins on `epoll_wait(0)` + `read` for `idle_poll_us`, 1 ms by
//!   default, after the last command): no wake-up on the server side, as on the target.
//! - **Client side waits the way the initiator waits**: blocked in the kernel (one wake-up
//!   per reply, as the initiator's `poll(2)`), or spinning with `--hipri` (the initiator's
//!   busy-poll mode).
//! - **TCP_NODELAY on both sockets**, as both ends of NVMe/TCP set it: without it Nagle
//!   holds a small write while an earlier one is unacknowledged, and the peer's delayed ACK
//!   (40 ms timer) can make that a 40 ms stall. With NODELAY every reply carries the ACK of
//!   the request it answers (the socket is in "pingpong" mode), so TCP_QUICKACK adds
//!   nothing.
//! - One `write` per batch of replies, one `read` per wake-up: the fewest system calls a
//!   protocol implementation could make.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::job::DirStats;

/// Bytes of an NVMe/TCP CapsuleCmd PDU without data (8-byte header + 64-byte SQE).
const REQ_LEN: usize = 72;
/// Bytes of an NVMe/TCP CapsuleResp PDU (8-byte header + 16-byte CQE).
const RESP_LEN: usize = 24;
/// Smallest write of the stream.
pub const STREAM_CHUNK: usize = 256 << 10;

#[derive(Debug, Clone)]
pub struct Stream {
    pub connections: usize,
    pub bytes: u64,
    pub elapsed: Duration,
}

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
pub struct Baseline {
    pub stream: Stream,
    pub pingpong: PingPong,
}

fn pair() -> io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    let (s, _) = l.accept()?;
    Ok((c, s))
}

/// Measure both, each for `each`.
/// `spin`: the client side busy-polls (the initiator's `--hipri`) instead of blocking.
/// `cpus`: run the server side (the receiver of the stream) on the first CPU and the client
/// side on the second.
pub fn run(
    bs: usize,
    depth: usize,
    jobs: usize,
    reads: bool,
    spin: bool,
    each: Duration,
    cpus: Option<(usize, usize)>,
) -> io::Result<Baseline> {
    Ok(Baseline {
        stream: stream(bs, jobs, each, cpus)?,
        pingpong: pingpong(bs, depth, jobs, reads, spin, each, cpus)?,
    })
}

/// Run the calling thread on `cpu` (no-op for `None`).
fn pin(cpu: Option<usize>) -> io::Result<()> {
    let Some(cpu) = cpu else {
        return Ok(());
    };
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(io::Error::from)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(io::Error::from)
}

fn stream(
    bs: usize,
    jobs: usize,
    dur: Duration,
    cpus: Option<(usize, usize)>,
) -> io::Result<Stream> {
    // The receiver reads in pieces as large as the sender's writes.
    let rx_len = bs.max(STREAM_CHUNK);
    let pairs: Vec<(TcpStream, TcpStream)> = (0..jobs).map(|_| pair()).collect::<Result<_, _>>()?;
    let t0 = Instant::now();
    let end = t0 + dur;
    let results: Vec<io::Result<u64>> = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for (mut tx, mut rx) in pairs {
            hs.push(s.spawn(move || -> io::Result<u64> {
                pin(cpus.map(|(server, _)| server))?;
                let mut buf = vec![0u8; rx_len];
                let mut n = 0u64;
                loop {
                    match rx.read(&mut buf) {
                        Ok(0) => return Ok(n),
                        Ok(k) => n += k as u64,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
            }));
            hs.push(s.spawn(move || -> io::Result<u64> {
                pin(cpus.map(|(_, client)| client))?;
                let buf = vec![0x5au8; bs.max(STREAM_CHUNK)];
                // At least one write, however late this thread gets a core.
                loop {
                    tx.write_all(&buf)?;
                    if Instant::now() >= end {
                        break;
                    }
                }
                tx.shutdown(Shutdown::Write)?;
                Ok(0)
            }));
        }
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let elapsed = t0.elapsed();
    let mut bytes = 0;
    for r in results {
        bytes += r?;
    }
    Ok(Stream {
        connections: jobs,
        bytes,
        elapsed,
    })
}

/// Messages written by one `write` at most (bounds the pre-filled batch buffers).
const BATCH: usize = 32;

/// Read into `buf` once (retrying EINTR, and spinning on EAGAIN for a non-blocking
/// socket); 0 at EOF.
fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match s.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            r => return r,
        }
    }
}

/// `write_all` that also works on a non-blocking socket (spins while it is full).
fn write_all(s: &mut TcpStream, mut b: &[u8]) -> io::Result<()> {
    while !b.is_empty() {
        match s.write(b) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => b = &b[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Write `n` copies of a message from `batch` (which holds [`BATCH`] of them).
fn write_n(s: &mut TcpStream, batch: &[u8], msg_len: usize, mut n: usize) -> io::Result<()> {
    while n > 0 {
        let k = n.min(BATCH);
        write_all(s, &batch[..k * msg_len])?;
        n -= k;
    }
    Ok(())
}

/// Both sides read whatever has arrived and answer every whole message in it with one write,
/// as a protocol implementation that batches would: the fewest system calls per message. The
/// server side busy-polls (as the target's poller does under load); the client blocks, or
/// spins with `spin` (see the module comment).
fn pingpong(
    bs: usize,
    depth: usize,
    jobs: usize,
    reads: bool,
    spin: bool,
    dur: Duration,
    cpus: Option<(usize, usize)>,
) -> io::Result<PingPong> {
    let (req_len, resp_len) = if reads { (REQ_LEN, bs) } else { (bs, RESP_LEN) };
    let pairs: Vec<(TcpStream, TcpStream)> = (0..jobs).map(|_| pair()).collect::<Result<_, _>>()?;
    for (c, s) in &pairs {
        c.set_nodelay(true)?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        c.set_nonblocking(spin)?;
    }
    let t0 = Instant::now();
    let end = t0 + dur;
    let results: Vec<io::Result<(DirStats, Instant)>> = std::thread::scope(|s| {
        let mut clients = Vec::new();
        for (mut c, mut srv) in pairs {
            s.spawn(move || -> io::Result<()> {
                pin(cpus.map(|(server, _)| server))?;
                let mut rx = vec![0u8; (BATCH * req_len).max(64 << 10)];
                let replies = vec![0xa5u8; BATCH * resp_len];
                let mut partial = 0usize;
                loop {
                    let n = read_some(&mut srv, &mut rx)?;
                    if n == 0 {
                        return Ok(());
                    }
                    partial += n;
                    let whole = partial / req_len;
                    partial %= req_len;
                    write_n(&mut srv, &replies, resp_len, whole)?;
                }
            });
            clients.push(s.spawn(move || -> io::Result<(DirStats, Instant)> {
                pin(cpus.map(|(_, client)| client))?;
                let requests = vec![0x3cu8; BATCH * req_len];
                let mut rx = vec![0u8; (BATCH * resp_len).max(64 << 10)];
                // Send times of the requests in flight, oldest at `head` (replies come in
                // order).
                let mut sent = vec![t0; depth];
                let mut stats = DirStats::new();
                let (mut head, mut outstanding, mut partial) = (0usize, 0usize, 0usize);
                let mut last = end;
                let now = Instant::now();
                sent.fill(now);
                write_n(&mut c, &requests, req_len, depth)?;
                outstanding += depth;
                while outstanding > 0 {
                    let n = read_some(&mut c, &mut rx)?;
                    if n == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    let now = Instant::now();
                    partial += n;
                    let whole = partial / resp_len;
                    partial %= resp_len;
                    let mut again = 0;
                    for _ in 0..whole {
                        outstanding -= 1;
                        // The window is `dur`, stretched on a starved machine until
                        // the first reply is in (the rate uses the real length).
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
                        // The freed entries are the `again` oldest ones, which the new
                        // requests take over at the tail.
                        let now = Instant::now();
                        let tail = (head + outstanding) % depth;
                        for i in 0..again {
                            sent[(tail + i) % depth] = now;
                        }
                        write_n(&mut c, &requests, req_len, again)?;
                        outstanding += again;
                    }
                }
                c.shutdown(Shutdown::Write)?;
                Ok((stats, last))
            }));
        }
        clients
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut stats = DirStats::new();
    let mut last = end;
    for r in results {
        let (st, l) = r?;
        stats.add(&st);
        last = last.max(l);
    }
    Ok(PingPong {
        connections: jobs,
        depth,
        request_bytes: req_len,
        reply_bytes: resp_len,
        stats,
        elapsed: last.duration_since(t0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_moves_bytes_and_measures_round_trips() {
        // Both sides pinned to CPU 0 (which every machine has): the pinning path runs too.
        let b = run(
            4096,
            4,
            1,
            true,
            false,
            Duration::from_millis(200),
            Some((0, 0)),
        )
        .unwrap();
        assert!(b.stream.bytes > 4096, "{:?}", b.stream);
        let p = &b.pingpong;
        assert!(p.stats.ios > 0);
        assert_eq!(p.stats.bytes, p.stats.ios * 4096);
        assert_eq!(p.stats.hist.len(), p.stats.ios);
        assert!(p.stats.hist.min() > 0);
        assert_eq!((p.request_bytes, p.reply_bytes), (72, 4096));
        let w = pingpong(8192, 1, 2, false, true, Duration::from_millis(100), None).unwrap();
        assert_eq!(
            (w.request_bytes, w.reply_bytes, w.connections),
            (8192, 24, 2)
        );
        assert!(w.stats.ios > 0);
    }
}
