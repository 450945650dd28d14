//! `--raw-tcp-baseline`: what a plain loopback TCP socket pair does with the same bytes, in
//! the same run: the physical limit an NVMe/TCP initiator and target sit on.
//!
//! - **stream**: one sender writes `bs`-sized chunks as fast as it can, one receiver reads;
//!   bandwidth. One pair per job.
//! - **ping-pong**: per job one connection with `iodepth` requests in flight; each request is
//!   answered as soon as it is read. For read-heavy workloads a request is 72 bytes (the size
//!   of an NVMe/TCP command capsule) and the reply is `bs` bytes; for write-heavy ones the
//!   request carries `bs` bytes and the reply is 24 bytes (a response capsule). Latency is
//!   measured from sending a request to receiving its whole reply, in an HDR histogram, and
//!   the reply rate is the IOPS a protocol could reach on this socket if it added nothing.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::job::DirStats;

/// Bytes of an NVMe/TCP CapsuleCmd PDU without data (8-byte header + 64-byte SQE).
const REQ_LEN: usize = 72;
/// Bytes of an NVMe/TCP CapsuleResp PDU (8-byte header + 16-byte CQE).
const RESP_LEN: usize = 24;

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
pub fn run(
    bs: usize,
    depth: usize,
    jobs: usize,
    reads: bool,
    each: Duration,
) -> io::Result<Baseline> {
    Ok(Baseline {
        stream: stream(bs, jobs, each)?,
        pingpong: pingpong(bs, depth, jobs, reads, each)?,
    })
}

fn stream(bs: usize, jobs: usize, dur: Duration) -> io::Result<Stream> {
    let pairs: Vec<(TcpStream, TcpStream)> = (0..jobs).map(|_| pair()).collect::<Result<_, _>>()?;
    let t0 = Instant::now();
    let end = t0 + dur;
    let results: Vec<io::Result<u64>> = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for (mut tx, mut rx) in pairs {
            hs.push(s.spawn(move || -> io::Result<u64> {
                let mut buf = vec![0u8; 1 << 20];
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
                let buf = vec![0x5au8; bs];
                while Instant::now() < end {
                    for _ in 0..16 {
                        tx.write_all(&buf)?;
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

fn pingpong(
    bs: usize,
    depth: usize,
    jobs: usize,
    reads: bool,
    dur: Duration,
) -> io::Result<PingPong> {
    let (req_len, resp_len) = if reads { (REQ_LEN, bs) } else { (bs, RESP_LEN) };
    let pairs: Vec<(TcpStream, TcpStream)> = (0..jobs).map(|_| pair()).collect::<Result<_, _>>()?;
    for (c, s) in &pairs {
        c.set_nodelay(true)?;
        s.set_nodelay(true)?;
    }
    let t0 = Instant::now();
    let end = t0 + dur;
    let results: Vec<io::Result<DirStats>> = std::thread::scope(|s| {
        let mut clients = Vec::new();
        for (mut c, mut srv) in pairs {
            s.spawn(move || -> io::Result<()> {
                let mut req = vec![0u8; req_len];
                let resp = vec![0xa5u8; resp_len];
                loop {
                    match srv.read_exact(&mut req) {
                        Ok(()) => srv.write_all(&resp)?,
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                        Err(e) => return Err(e),
                    }
                }
            });
            clients.push(s.spawn(move || -> io::Result<DirStats> {
                let req = vec![0x3cu8; req_len];
                let mut resp = vec![0u8; resp_len];
                let mut sent = vec![t0; depth];
                let mut stats = DirStats::new();
                let (mut head, mut outstanding) = (0usize, 0usize);
                for s in sent.iter_mut() {
                    *s = Instant::now();
                    c.write_all(&req)?;
                    outstanding += 1;
                }
                while outstanding > 0 {
                    c.read_exact(&mut resp)?;
                    let now = Instant::now();
                    outstanding -= 1;
                    if now <= end {
                        stats.ios += 1;
                        stats.bytes += bs as u64;
                        let ns = now.duration_since(sent[head]).as_nanos() as u64;
                        stats.hist.saturating_record(ns.max(1));
                        // Requests are answered in order: the slot just freed is the oldest.
                        sent[head] = Instant::now();
                        c.write_all(&req)?;
                        outstanding += 1;
                    }
                    head = (head + 1) % depth;
                }
                c.shutdown(Shutdown::Write)?;
                Ok(stats)
            }));
        }
        clients
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut stats = DirStats::new();
    for r in results {
        stats.add(&r?);
    }
    Ok(PingPong {
        connections: jobs,
        depth,
        request_bytes: req_len,
        reply_bytes: resp_len,
        stats,
        elapsed: dur,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_moves_bytes_and_measures_round_trips() {
        let b = run(4096, 4, 1, true, Duration::from_millis(200)).unwrap();
        assert!(b.stream.bytes > 4096, "{:?}", b.stream);
        let p = &b.pingpong;
        assert!(p.stats.ios > 0);
        assert_eq!(p.stats.bytes, p.stats.ios * 4096);
        assert_eq!(p.stats.hist.len(), p.stats.ios);
        assert!(p.stats.hist.min() > 0);
        assert_eq!((p.request_bytes, p.reply_bytes), (72, 4096));
        let w = pingpong(8192, 1, 2, false, Duration::from_millis(100)).unwrap();
        assert_eq!(
            (w.request_bytes, w.reply_bytes, w.connections),
            (8192, 24, 2)
        );
        assert!(w.stats.ios > 0);
    }
}
