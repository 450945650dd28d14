//! Zero-copy send against a copying send on a loopback TCP connection, the measurement behind
//! `tcp_send`'s choice of no `SEND_ZC` (issue #40: zero-copy send "where it pays on a real NIC;
//! on loopback it does not: measure and choose per size"). For each size a sender thread sends
//! messages of that size through io_uring for `--secs`, as `SENDMSG` (the kernel copies the
//! bytes) and as `SENDMSG_ZC` (the kernel pins the pages and posts a notification when it lets
//! go of them), the two taking turns over `--rounds`; a receiver thread reads and discards.
//! `--inflight` sends are in flight at once, each from its own buffer, which is reused only
//! after its send completed (and, zero-copy, after its notification).
//!
//! ```text
//! send_zc [--sizes 4k,16k,64k,128k,1m] [--secs 1] [--rounds 3] [--inflight 8] [--send-cpu 0] [--recv-cpu 1]
//! ```
//!
//! Prints a row per size and mode: the median GB/s, the sender thread's CPU time per KiB sent
//! (user + system, RUSAGE_THREAD: on loopback it includes the kernel's delivery to the
//! receiving socket), and for zero-copy how many notifications said the kernel copied the
//! bytes anyway (IORING_SEND_ZC_REPORT_USAGE), then the medians of the rounds' zero-copy/copy
//! ratios.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use io_uring::{cqueue, opcode, types, IoUring};

#[derive(Parser, Debug)]
#[command(about = "SENDMSG_ZC against SENDMSG on loopback TCP")]
struct Args {
    /// Message sizes (k and m suffixes: powers of 1024).
    #[arg(long, value_delimiter = ',', default_value = "4k,16k,64k,128k,1m", value_parser = parse_size)]
    sizes: Vec<usize>,
    /// Seconds per run.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
    /// Runs per size and mode (alternating).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Sends in flight at once.
    #[arg(long, default_value_t = 8)]
    inflight: usize,
    #[arg(long, default_value_t = 0)]
    send_cpu: usize,
    #[arg(long, default_value_t = 1)]
    recv_cpu: usize,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (n, m) = match s.trim().to_ascii_lowercase() {
        t if t.ends_with('k') => (t[..t.len() - 1].to_string(), 1 << 10),
        t if t.ends_with('m') => (t[..t.len() - 1].to_string(), 1 << 20),
        t => (t, 1),
    };
    n.parse::<usize>()
        .map(|n| n * m)
        .map_err(|e| format!("{s}: {e}"))
}

fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// User + system CPU time of the calling thread.
fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// `IORING_RECVSEND_*` flag asking zero-copy notifications to say whether the kernel copied.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// In a notification's result: the kernel copied the bytes.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

struct Run {
    bytes: u64,
    elapsed: Duration,
    cpu: Duration,
    notifs: u64,
    copied: u64,
}

/// Sends `size`-byte messages on `sock` for `secs`, copying or zero-copy.
fn run(
    sock: &TcpStream,
    size: usize,
    secs: f64,
    inflight: usize,
    zc: bool,
) -> std::io::Result<Run> {
    let mut ring = IoUring::new(64)?;
    let mut bufs: Vec<Vec<u8>> = (0..inflight).map(|i| vec![i as u8; size]).collect();
    let mut iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    let msgs: Vec<libc::msghdr> = iovs
        .iter_mut()
        .map(|iov| {
            // SAFETY: plain data; all-zero is an empty header.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_iov = iov;
            m.msg_iovlen = 1;
            m
        })
        .collect();
    // Per buffer: its send's result and (zero-copy) its notification are still to come.
    let mut busy = vec![(false, false); inflight];
    let fd = types::Fd(sock.as_raw_fd());
    let (mut bytes, mut notifs, mut copied) = (0u64, 0u64, 0u64);
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(secs);
    let mut stopping = false;
    loop {
        if !stopping && Instant::now() >= end {
            stopping = true;
        }
        if !stopping {
            for (i, m) in msgs.iter().enumerate() {
                if busy[i] != (false, false) {
                    continue;
                }
                let e = if zc {
                    opcode::SendMsgZc::new(fd, m)
                        .ioprio(SEND_ZC_REPORT_USAGE)
                        .flags(libc::MSG_WAITALL as u32)
                        .build()
                } else {
                    opcode::SendMsg::new(fd, m)
                        .flags(libc::MSG_WAITALL as u32)
                        .build()
                };
                // SAFETY: the header, iovec and buffer stay until the send's completion (and,
                // zero-copy, its notification) was seen below; they outlive the ring's use.
                unsafe { ring.submission().push(&e.user_data(i as u64)) }
                    .map_err(|_| std::io::Error::other("submission queue full"))?;
                busy[i] = (true, zc);
            }
        }
        if busy.iter().all(|b| *b == (false, false)) {
            break;
        }
        ring.submit_and_wait(1)?;
        for c in ring.completion() {
            let i = c.user_data() as usize;
            if cqueue::notif(c.flags()) {
                notifs += 1;
                copied += u64::from(c.result() as u32 & NOTIF_USAGE_ZC_COPIED != 0);
                busy[i].1 = false;
                continue;
            }
            if c.result() < 0 {
                return Err(std::io::Error::from_raw_os_error(-c.result()));
            }
            bytes += c.result() as u64;
            busy[i].0 = false;
            if !cqueue::more(c.flags()) {
                // No notification follows (a copying send, or a zero-copy one that failed).
                busy[i].1 = false;
            }
        }
    }
    Ok(Run {
        bytes,
        elapsed: t0.elapsed(),
        cpu: thread_cpu() - cpu0,
        notifs,
        copied,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let recv_cpu = a.recv_cpu;
    let receiver = std::thread::spawn(move || {
        pin(recv_cpu);
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 20];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    });
    pin(a.send_cpu);
    let sock = TcpStream::connect(addr).expect("connect");
    sock.set_nodelay(true).expect("nodelay");
    println!(
        "send_zc: loopback TCP, sender CPU {}, receiver CPU {}, {} in flight, {} s per run, median of {} alternating rounds",
        a.send_cpu, a.recv_cpu, a.inflight, a.secs, a.rounds
    );
    println!(
        "{:>8} {:>5} {:>8} {:>12} {:>16}",
        "size", "mode", "GB/s", "CPU ns/KiB", "copied/notifs"
    );
    for &size in &a.sizes {
        let mut gbs = [Vec::new(), Vec::new()];
        let mut cpu = [Vec::new(), Vec::new()];
        let (mut notifs, mut copied) = (0, 0);
        for r in 0..a.rounds {
            let order = if r % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for zc in order {
                let run = match run(&sock, size, a.secs, a.inflight, zc) {
                    Ok(run) => run,
                    Err(e) => {
                        eprintln!(
                            "send_zc: {} sends of {size} bytes: {e}",
                            if zc { "zero-copy" } else { "copying" }
                        );
                        return ExitCode::FAILURE;
                    }
                };
                let k = usize::from(zc);
                gbs[k].push(run.bytes as f64 / run.elapsed.as_secs_f64() / 1e9);
                cpu[k].push(run.cpu.as_nanos() as f64 / (run.bytes as f64 / 1024.0));
                if zc {
                    notifs += run.notifs;
                    copied += run.copied;
                }
            }
        }
        let g = [median(gbs[0].clone()), median(gbs[1].clone())];
        let c = [median(cpu[0].clone()), median(cpu[1].clone())];
        println!(
            "{size:>8} {:>5} {:>8.2} {:>12.1} {:>16}",
            "copy", g[0], c[0], "-"
        );
        println!(
            "{size:>8} {:>5} {:>8.2} {:>12.1} {:>16}",
            "zc",
            g[1],
            c[1],
            format!("{copied}/{notifs}")
        );
        // Paired: each round's zero-copy run against its copying run.
        let ratio =
            |v: &[Vec<f64>; 2]| median(v[1].iter().zip(&v[0]).map(|(z, c)| z / c).collect());
        println!(
            "{size:>8} zc/copy (median of paired rounds): throughput {:.2}x, CPU per byte {:.2}x",
            ratio(&gbs),
            ratio(&cpu)
        );
    }
    drop(sock);
    let _ = receiver.join();
    ExitCode::SUCCESS
}
