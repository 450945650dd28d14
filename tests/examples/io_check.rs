//! End-to-end check of the initiator library against a live target, over NVMe/RDMA or NVMe/TCP:
//! discovery, connect, a zero-copy asynchronous write/read/verify pass over `--size` bytes, the
//! synchronous block API (large and in-capsule writes, read back), Flush, Write Zeroes, Trim
//! (Dataset Management), an out-of-range read that must fail without hurting the queue, and a
//! clean shutdown.
//!
//! ```text
//! io_check --transport rdma --traddr 192.168.78.1 --trsvcid 4420 --subnqn NQN [--size 64M]
//!          [--bs 128k] [--iodepth 16] [--nsid 1] [--busy-poll] [--timeout 30]
//! ```
//!
//! Prints one line per phase and `io_check OK` last; exits 1 on the first failed check.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use initiator::{
    discover_with, AnyLink, AnyQueue, Controller, Error, Link, NsInfo, Queue, Transport,
};

mod common;

#[derive(Parser, Debug)]
#[command(about = "Write/read/verify, flush, write zeroes and trim through the initiator")]
struct Args {
    #[command(flatten)]
    target: common::Target,
    /// Bytes to write and verify asynchronously (suffixes k, M, G).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    size: u64,
    /// I/O size of the asynchronous pass.
    #[arg(long, default_value = "128k", value_parser = parse_size)]
    bs: u64,
    #[arg(long, default_value_t = 16)]
    iodepth: u16,
    /// I/O queues driven at once, one thread each, each over its share of `--size`.
    #[arg(long, default_value_t = 2)]
    numjobs: u16,
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// Spin on the completion queue instead of sleeping.
    #[arg(long)]
    busy_poll: bool,
    /// Seconds every wait may take.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Then run every operation of the block API on each form of `Namespace` (one path, one
    /// that reconnects, and two paths: this transport and this one on the same address and
    /// port), in the last 12 MiB of the namespace.
    #[arg(long, value_parser = ["tcp", "rdma"])]
    forms_with: Option<String>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mul) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("bad size {s:?}"))
}

type Res<T> = Result<T, String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// The pattern of the 8-byte word at byte `off` of the namespace for pass `seed`.
fn word(off: u64, seed: u64) -> u64 {
    (off ^ seed.rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed
}

fn fill(buf: &mut [u8], off: u64, seed: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(off + 8 * i as u64, seed).to_le_bytes());
    }
}

fn check(buf: &[u8], off: u64, seed: u64) -> Res<()> {
    for (i, w) in buf.chunks_exact(8).enumerate() {
        let at = off + 8 * i as u64;
        let got = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        ensure!(
            got == word(at, seed),
            "data mismatch at byte {at}: {got:#018x}, expected {:#018x}",
            word(at, seed)
        );
    }
    Ok(())
}

/// Write (`write`) or read and verify `[base, base + size)` in `bs` pieces, `qd` at a time,
/// with buffers from the queue itself (registered memory over RDMA). Returns bytes per second.
#[allow(clippy::too_many_arguments)]
fn async_pass<L: Link>(
    q: &mut Queue<L>,
    ns: &NsInfo,
    base: u64,
    size: u64,
    bs: usize,
    qd: usize,
    seed: u64,
    write: bool,
) -> Res<f64> {
    let bsz = ns.block_size as u64;
    let mut bufs = Vec::with_capacity(qd);
    for _ in 0..qd {
        bufs.push(
            q.alloc_buf(bs)
                .map_err(|e| format!("alloc_buf({bs}): {e}"))?,
        );
    }
    let mut done = Vec::with_capacity(qd);
    let mut next = base;
    let end = base + size;
    let t = Instant::now();
    while next < end || q.in_flight() > 0 {
        while next < end && !bufs.is_empty() && q.free_slots() > 0 {
            let mut b = bufs.pop().expect("non-empty");
            let r = if write {
                fill(&mut b, next, seed);
                q.submit_write(ns, next / bsz, b, next)
            } else {
                q.submit_read(ns, next / bsz, b, next)
            };
            r.map_err(|e| format!("submit at {next}: {}", e.error))?;
            next += bs as u64;
        }
        q.reap(&mut done, 1, None)
            .map_err(|e| format!("reap: {e}"))?;
        for c in done.drain(..) {
            let off = c.user_data;
            c.result.map_err(|e| {
                format!(
                    "{} at byte {off}: {e}",
                    if write { "write" } else { "read" }
                )
            })?;
            let b = c.buf.ok_or("completion without its buffer")?;
            if !write {
                check(&b, off, seed)?;
            }
            bufs.push(b);
        }
    }
    Ok(size as f64 / t.elapsed().as_secs_f64())
}

/// The async phase of job `job` on a queue of either type; checks the copy accounting.
fn async_phase<L: Link>(q: &mut Queue<L>, a: &Args, ns: &NsInfo, rdma: bool, job: u64) -> Res<()> {
    let (bs, qd) = (a.bs as usize, a.iodepth as usize);
    let size = a.size / a.numjobs as u64;
    let base = job * size;
    // The queue's Fabrics Connect (1024 bytes of data) is in the counters already.
    let s0 = q.stats();
    let w = async_pass(q, ns, base, size, bs, qd, 1, true)?;
    let r = async_pass(q, ns, base, size, bs, qd, 1, false)?;
    let s1 = q.stats();
    let s = initiator::Stats {
        commands: s1.commands - s0.commands,
        completed: s1.completed - s0.completed,
        payload_bytes: s1.payload_bytes - s0.payload_bytes,
        socket_payload_bytes: s1.socket_payload_bytes - s0.socket_payload_bytes,
        memcpy_bytes: s1.memcpy_bytes - s0.memcpy_bytes,
        syscalls: s1.syscalls - s0.syscalls,
        keys_bound: s1.keys_bound - s0.keys_bound,
        keys_invalidated_by_target: s1.keys_invalidated_by_target - s0.keys_invalidated_by_target,
        keys_invalidated_locally: s1.keys_invalidated_locally - s0.keys_invalidated_locally,
        keys_registered: s1.keys_registered - s0.keys_registered,
    };
    println!(
        "async queue {}: wrote+verified {} MiB at {} MiB in {} KiB I/Os at QD {qd}: write {:.1} MB/s, \
         read {:.1} MB/s; {} commands, payload {} B, memcpy {} B, socket {} B, copies/byte {:.2}",
        q.qid(),
        size >> 20,
        base >> 20,
        bs >> 10,
        w / 1e6,
        r / 1e6,
        s.commands,
        s.payload_bytes,
        s.memcpy_bytes,
        s.socket_payload_bytes,
        s.copies_per_byte()
    );
    ensure!(
        s.payload_bytes == 2 * size,
        "payload accounting: {} bytes for 2 x {size}",
        s.payload_bytes
    );
    if rdma {
        ensure!(
            s.memcpy_bytes == 0 && s.socket_payload_bytes == 0,
            "the RDMA data path copied: {s:?}"
        );
        // Every command whose data the target moved opened its buffer with a key of its own
        // (a memory window, or a registration on a device without windows), and every window
        // key was dead before its command completed.
        let keyed = s.keys_bound + s.keys_registered;
        println!(
            "async queue {}: buffer keys: {} windows bound ({} invalidated by the target, {} \
             locally), {} per-I/O registrations",
            q.qid(),
            s.keys_bound,
            s.keys_invalidated_by_target,
            s.keys_invalidated_locally,
            s.keys_registered
        );
        ensure!(
            keyed > 0 && (s.keys_bound == 0 || s.keys_registered == 0),
            "buffer keys: {s:?}"
        );
        ensure!(
            s.keys_bound == s.keys_invalidated_by_target + s.keys_invalidated_locally,
            "a window key outlived its command: {s:?}"
        );
    }
    // Flush through the async API too.
    q.submit_flush(ns.nsid, 7)
        .map_err(|e| format!("submit_flush: {}", e.error))?;
    let mut done = Vec::new();
    while q.in_flight() > 0 {
        q.reap(&mut done, 1, None).map_err(|e| e.to_string())?;
    }
    ensure!(
        done.len() == 1 && done[0].user_data == 7 && done[0].result.is_ok(),
        "async flush: {done:?}"
    );
    Ok(())
}

fn run(a: &Args) -> Res<()> {
    let rdma = a.target.transport == Transport::Rdma;
    let mut o = a.target.options();
    o.queues = a.numjobs.max(1);
    o.queue_depth = a.iodepth.max(4);
    if a.busy_poll {
        o.polling = initiator::Polling::Busy;
    }
    o.timeout = Duration::from_secs(a.timeout);
    let tr = a.target.transport_name();

    // Discovery over the same transport (`nvme discover -t rdma`).
    let entries = discover_with(&o).map_err(|e| format!("discovery: {e}"))?;
    for e in &entries {
        println!(
            "discovery: trtype {} subtype {} {}:{} {}",
            e.trtype, e.subtype, e.traddr, e.trsvcid, e.subnqn
        );
    }
    ensure!(
        entries.iter().any(|e| e.subnqn == a.target.subnqn),
        "discovery log does not list {}",
        a.target.subnqn
    );

    let t = Instant::now();
    let mut ctrl = Controller::connect(o).map_err(|e| format!("connect: {e}"))?;
    let info = ctrl.info().clone();
    println!(
        "connected over {tr} in {:.2} s: cntlid {} model {:?} fw {:?} max_transfer {} \
         in_capsule {} io_queues {} depth {} oncs {:#x}",
        t.elapsed().as_secs_f64(),
        info.cntlid,
        info.model,
        info.firmware,
        info.max_transfer,
        info.in_capsule,
        info.io_queues,
        info.io_queue_depth,
        info.oncs
    );
    ensure!(
        info.io_queues == a.numjobs.max(1),
        "{} I/O queues granted",
        info.io_queues
    );
    let ns = *ctrl
        .namespaces()
        .iter()
        .find(|n| n.nsid == a.nsid)
        .ok_or_else(|| format!("namespace {} not active", a.nsid))?;
    println!(
        "namespace {}: {} blocks of {} bytes ({} MiB)",
        ns.nsid,
        ns.blocks,
        ns.block_size,
        ns.size() >> 20
    );
    ensure!(
        a.numjobs > 0
            && a.size <= ns.size()
            && a.size % (a.bs * a.numjobs as u64) == 0
            && a.bs % ns.block_size as u64 == 0,
        "--size {} must be a multiple of --bs {} x --numjobs {} within namespace {} of {} bytes",
        a.size,
        a.bs,
        a.numjobs,
        ns.nsid,
        ns.size()
    );
    ensure!(a.bs <= info.max_transfer as u64, "--bs {} above MDTS", a.bs);

    // A second controller (another host NQN) for the synchronous API, at the same time.
    let mut o2 = a.target.options();
    o2.queues = 1;
    o2.queue_depth = 8;
    o2.timeout = Duration::from_secs(a.timeout);
    let mut ctrl2 = Controller::connect(o2).map_err(|e| format!("second connect: {e}"))?;
    let mut nsh = ctrl2.open_namespace(ns.nsid).map_err(|e| e.to_string())?;

    // ---- asynchronous, zero-copy on RDMA: one thread per queue ----
    let mut queues: Vec<AnyQueue> = std::iter::from_fn(|| ctrl.take_queue()).collect();
    ensure!(
        queues.iter().all(|q| q.transport() == a.target.transport),
        "queue transport"
    );
    let t = Instant::now();
    let results: Vec<Res<()>> = std::thread::scope(|sc| {
        let hs: Vec<_> = queues
            .iter_mut()
            .enumerate()
            .map(|(i, q)| {
                sc.spawn(move || {
                    let rdma = q.transport() == Transport::Rdma;
                    async_phase(q, a, &ns, rdma, i as u64)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("job thread panicked".into()))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    println!(
        "async: {} queues, {} MiB written and verified in {:.1} s",
        queues.len(),
        a.size >> 20,
        t.elapsed().as_secs_f64()
    );
    let mut q = queues.swap_remove(0);
    drop(queues);
    let bsz = ns.block_size as usize;
    if let AnyLink::Rdma(l) = q.link() {
        {
            println!(
                "rdma queue {} on {}: {} bytes registered for its pool (local access), buffers \
                 opened per command by {}",
                q.qid(),
                l.device(),
                l.registered_bytes(),
                l.key_mode()
            );
            // A buffer of another queue's pool is refused, and comes back.
            let other = nsh.queue().expect("one path");
            ensure!(
                other.transport() == Transport::Rdma,
                "second queue is not RDMA"
            );
            let b = other.alloc_buf(bsz).map_err(|e| e.to_string())?;
            let e = q.submit_read(&ns, 0, b, 0).unwrap_err();
            ensure!(
                matches!(e.error, Error::InvalidArgument(_)) && e.buf.is_some(),
                "foreign buffer: {e}"
            );
            println!(
                "rdma: a buffer from another queue's pool is refused: {}",
                e.error
            );
        }
    }
    // An out-of-range read fails with an NVMe status; the queue keeps working.
    let bad = one_read(&mut q, &ns, ns.blocks, bsz)?;
    ensure!(bad != "ok", "a read past the end succeeded");
    println!("read past the end: {bad}");
    let again = one_read(&mut q, &ns, 0, bsz)?;
    ensure!(again == "ok", "read after the failed one: {again}");
    drop(q);

    // ---- synchronous block API (copies through the pool on RDMA, counted) ----
    let s_sync0 = nsh.queue().expect("one path").stats();
    let big = (4usize << 20).min(a.size as usize);
    let base = a.size - big as u64;
    let mut data = vec![0u8; big];
    fill(&mut data, base, 2);
    nsh.write_at(&data, base)
        .map_err(|e| format!("write_at: {e}"))?;
    let mut back = vec![0u8; big];
    nsh.read_at(&mut back, base)
        .map_err(|e| format!("read_at: {e}"))?;
    check(&back, base, 2)?;
    // Small writes: in the capsule when the controller allows it.
    for i in 0..8u64 {
        let off = i * 3 * bsz as u64;
        let mut small = vec![0u8; bsz];
        fill(&mut small, off, 3);
        nsh.write_at(&small, off)
            .map_err(|e| format!("small write_at: {e}"))?;
        let mut r = vec![0u8; bsz];
        nsh.read_at(&mut r, off)
            .map_err(|e| format!("small read_at: {e}"))?;
        check(&r, off, 3)?;
    }
    let s1 = nsh.queue().expect("one path").stats();
    let s = initiator::Stats {
        payload_bytes: s1.payload_bytes - s_sync0.payload_bytes,
        memcpy_bytes: s1.memcpy_bytes - s_sync0.memcpy_bytes,
        ..s1
    };
    println!(
        "sync: write_at/read_at {} MiB + 8 x {bsz} B (in-capsule limit {}): memcpy {} B for payload {} B",
        big >> 20,
        nsh.queue().expect("one path").in_capsule_limit(),
        s.memcpy_bytes,
        s.payload_bytes
    );
    if rdma {
        ensure!(
            s.memcpy_bytes == s.payload_bytes,
            "sync path copy accounting: {s:?}"
        );
    }

    nsh.flush().map_err(|e| format!("flush: {e}"))?;
    println!("flush: ok");

    let zlen = 64 * bsz as u64;
    match nsh.write_zeroes(0, zlen) {
        Ok(()) => {
            let mut z = vec![0xffu8; zlen as usize];
            nsh.read_at(&mut z, 0)
                .map_err(|e| format!("read after write zeroes: {e}"))?;
            ensure!(z.iter().all(|&b| b == 0), "write zeroes left data behind");
            println!("write zeroes: {zlen} bytes, read back as zeroes");
        }
        Err(Error::Unsupported(why)) => println!("write zeroes: not supported ({why})"),
        Err(e) => return Err(format!("write zeroes: {e}")),
    }

    let tlen = 256 * bsz as u64;
    nsh.trim(&[(0, tlen), (a.size / 2, tlen)])
        .map_err(|e| format!("trim: {e}"))?;
    println!("trim: 2 ranges of {tlen} bytes deallocated");
    // Data outside the trimmed and zeroed ranges is intact.
    let mut r = vec![0u8; 4 * bsz];
    let off = a.size / 4;
    nsh.read_at(&mut r, off)
        .map_err(|e| format!("read after trim: {e}"))?;
    check(&r, off, 1)?;

    drop(nsh);
    ctrl2.shutdown().map_err(|e| format!("shutdown: {e}"))?;
    ctrl.keep_alive().map_err(|e| format!("keep alive: {e}"))?;
    ctrl.shutdown().map_err(|e| format!("shutdown: {e}"))?;
    println!("shutdown: ok");
    if let Some(other) = &a.forms_with {
        forms(a, other)?;
    }
    Ok(())
}

/// Every operation on the plain, reconnecting and multipath forms (`--forms-with`).
fn forms(a: &Args, other: &str) -> Res<()> {
    use initiator::{MultipathOptions, Namespace, ReconnectPolicy};
    use nvmf_tests::forms::{every_operation, through_std_io};
    let timeout = Duration::from_secs(a.timeout);
    let with_host = |mut o: initiator::ConnectOptions, id: [u8; 16]| {
        o.hostid = id;
        o.hostnqn = initiator::hostnqn_for(&id);
        o.timeout = timeout;
        o
    };
    let second = common::Target {
        transport: if other == "rdma" {
            Transport::Rdma
        } else {
            Transport::Tcp
        },
        ..a.target.clone()
    };
    for (i, form) in ["plain", "reconnecting", "multipath"]
        .into_iter()
        .enumerate()
    {
        let id: [u8; 16] = std::array::from_fn(|k| (k as u8) ^ (0x60 + i as u8));
        let o = with_host(a.target.options(), id);
        let mut ctrl = None;
        let t0 = Instant::now();
        let ns = match form {
            "plain" => {
                let mut c = Controller::connect(o).map_err(|e| format!("{form}: {e}"))?;
                let ns = c.open_namespace(a.nsid);
                ctrl = Some(c);
                ns
            }
            "reconnecting" => Namespace::connect(o, a.nsid, ReconnectPolicy::default()),
            _ => Namespace::multipath(
                vec![o, with_host(second.options(), id)],
                a.nsid,
                MultipathOptions::default(),
            ),
        };
        let mut ns = ns.map_err(|e| format!("{form}: open: {e}"))?;
        ensure!(
            ns.size() >= 12 << 20,
            "{form}: the namespace is under 12 MiB"
        );
        let base = ns.size() - (12 << 20) + i as u64 * (4 << 20);
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            every_operation(&mut ns, base, id, form);
            through_std_io(ns, base + (2 << 20), form)
        }));
        let ns = ran.map_err(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            format!("{form}: {msg}")
        })?;
        let paths: Vec<String> = ns
            .paths()
            .iter()
            .map(|p| format!("{:?} {}:{} {:?}", p.transport, p.addr, p.port, p.state))
            .collect();
        ns.shutdown()
            .map_err(|e| format!("{form}: shutdown: {e}"))?;
        if let Some(c) = ctrl {
            c.shutdown().map_err(|e| format!("{form}: shutdown: {e}"))?;
        }
        println!(
            "forms: {form}: every operation ok in {:.1} s (paths: {})",
            t0.elapsed().as_secs_f64(),
            paths.join(", ")
        );
    }
    Ok(())
}

/// One read of `bs` bytes at `slba`: "ok" or the error text.
fn one_read<L: Link>(q: &mut Queue<L>, ns: &NsInfo, slba: u64, bs: usize) -> Res<String> {
    let b = q.alloc_buf(bs).map_err(|e| e.to_string())?;
    let mut sqe = nvme::Sqe::new(nvme::opcode::io::READ, 0);
    sqe.nsid = ns.nsid.into();
    sqe.cdw10 = (slba as u32).into();
    sqe.cdw11 = ((slba >> 32) as u32).into();
    sqe.cdw12 = ((bs / ns.block_size as usize) as u32 - 1).into();
    q.submit(sqe, initiator::Data::FromController(b), 0)
        .map_err(|e| e.error.to_string())?;
    let mut done = Vec::new();
    q.reap(&mut done, 1, None).map_err(|e| e.to_string())?;
    ensure!(!q.is_failed(), "queue failed: {:?}", q.error());
    Ok(match done.pop().map(|c| c.result) {
        Some(Ok(_)) => "ok".into(),
        Some(Err(e)) => format!("failed as expected: {e}"),
        None => return Err("no completion".into()),
    })
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    match run(&a) {
        Ok(()) => {
            println!("io_check OK ({})", a.target);
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("io_check FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
