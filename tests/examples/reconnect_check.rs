//! Fault check of the initiator's reconnecting handles against a live target, over NVMe/RDMA or
//! NVMe/TCP: two hosts at once, each on its own controller,
//!
//! - `sync`: a [`Namespace`] in a write + read-back-verify loop over 64 regions of
//!   64 KiB at the start of the namespace, a new pattern for every write;
//! - `async`: a [`ReconnectingQueue`] keeping `--iodepth` 4 KiB writes in flight over 4096
//!   blocks after the sync regions, each write with a new pattern, every block read back and
//!   checked against its last acknowledged write at the end.
//!
//! The harness kills the target while both run (it waits for the line `reconnect_check: I/O
//! running`). `--mode restart`: the target comes back; both hosts must reconnect
//! (`--min-reconnects`), go on for `--after` more operations, and end with every acknowledged
//! write read back intact (0 mismatches, 0 stale blocks, every async write completed exactly
//! once). `--mode giveup`: the target stays dead; both hosts' calls must fail with
//! `ReconnectGaveUp` within the policy's bound (`--max-total` plus one I/O timeout to notice the
//! failure and one to bring a connection up, plus 5 s of slack), the async host getting every
//! command back.
//!
//! ```text
//! reconnect_check --transport rdma --traddr 192.168.78.1 --trsvcid 4420 --subnqn NQN
//!                 [--mode restart|giveup] [--min-reconnects 1] [--runtime 0] [--after 50]
//!                 [--timeout 5] [--kato 5] [--max-attempts 1000] [--max-total 30]
//!                 [--initial-ms 100] [--max-ms 1000] [--iodepth 32] [--deadline 240]
//! ```
//!
//! Prints one summary line per host and `reconnect_check OK` last; exits 1 on a failed check.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};

mod common;
use initiator::{ConnectOptions, Error, Namespace, PathStats, ReconnectPolicy, ReconnectingQueue};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// The target comes back: reconnect, resubmit, verify everything.
    Restart,
    /// The target stays dead: every call must give up within the policy's bound.
    Giveup,
}

#[derive(Parser, Debug)]
#[command(about = "Verified I/O through Namespace and ReconnectingQueue across a target fault")]
struct Args {
    #[command(flatten)]
    target: common::Target,
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    #[arg(long, value_enum, default_value = "restart")]
    mode: Mode,
    /// Reconnects each host must have made before it may stop (restart mode).
    #[arg(long, default_value_t = 1)]
    min_reconnects: u64,
    /// Seconds each host runs at least (restart mode).
    #[arg(long, default_value_t = 0)]
    runtime: u64,
    /// Operations each host does after its last required reconnect (sync: verified
    /// iterations; async: 20x as many completed writes).
    #[arg(long, default_value_t = 50)]
    after: u64,
    /// Seconds a command may take before its connection counts as failed
    /// (ConnectOptions::timeout).
    #[arg(long, default_value_t = 5)]
    timeout: u64,
    /// Keep-alive timeout in seconds.
    #[arg(long, default_value_t = 5)]
    kato: u64,
    #[arg(long, default_value_t = 1000)]
    max_attempts: u32,
    /// Seconds after a failure past which no reconnect attempt starts.
    #[arg(long, default_value_t = 30)]
    max_total: u64,
    #[arg(long, default_value_t = 100)]
    initial_ms: u64,
    #[arg(long, default_value_t = 1000)]
    max_ms: u64,
    /// Commands in flight on the async host.
    #[arg(long, default_value_t = 32)]
    iodepth: u16,
    /// Seconds the whole check may take.
    #[arg(long, default_value_t = 240)]
    deadline: u64,
}

type Res<T> = Result<T, String>;

/// A block of test data, different for every seed (splitmix64).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xd1b5_4a32_d192_ed03;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        v.extend_from_slice(&z.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// What both hosts share with the main thread.
struct Shared {
    sync_ops: AtomicU64,
    async_ops: AtomicU64,
    /// A host failed: the other stops too.
    stop: AtomicBool,
    start: Instant,
    deadline: Instant,
}

const SYNC_REGIONS: usize = 64;
const SYNC_LEN: usize = 64 << 10;
const ASYNC_BLOCKS: u64 = 4096;

fn stats_line(s: &PathStats) -> String {
    format!(
        "reconnects={} retries={} failed_attempts={} gave_up={} outage_ms={}",
        s.reconnects,
        s.retries,
        s.failed_attempts,
        s.gave_up,
        s.last_outage
            .map_or("-".into(), |d| d.as_millis().to_string())
    )
}

/// The give-up bound: no attempt starts later than `max_total` after the failure; noticing the
/// failure takes at most one I/O timeout, the last attempt at most one more per wait (address,
/// route, connect, Fabrics Connect, Identify: counted as two timeouts), plus 5 s of slack.
fn giveup_bound(a: &Args) -> Duration {
    Duration::from_secs(a.max_total + 3 * a.timeout + 5)
}

/// A give-up error, checked: `ReconnectGaveUp` within the bound since the last success.
fn check_giveup(a: &Args, who: &str, e: &Error, since_ok: Duration) -> Res<String> {
    let Error::ReconnectGaveUp {
        attempts,
        elapsed,
        cause,
    } = e
    else {
        return Err(format!("{who}: expected ReconnectGaveUp, got: {e}"));
    };
    let bound = giveup_bound(a);
    if since_ok > bound {
        return Err(format!(
            "{who}: gave up {:.1} s after the last success, bound {} s",
            since_ok.as_secs_f64(),
            bound.as_secs()
        ));
    }
    Ok(format!(
        "gave_up_after_s={:.1} bound_s={} attempts={attempts} budget_elapsed_s={:.1} last_cause=\"{cause}\"",
        since_ok.as_secs_f64(),
        bound.as_secs(),
        elapsed.as_secs_f64()
    ))
}

fn sync_host(a: &Args, opts: ConnectOptions, policy: ReconnectPolicy, sh: &Shared) -> Res<String> {
    let mut ns =
        Namespace::connect(opts, a.nsid, policy).map_err(|e| format!("sync: connect: {e}"))?;
    if ns.size() < (SYNC_REGIONS * SYNC_LEN) as u64 {
        return Err(format!(
            "sync: namespace of {} bytes is too small",
            ns.size()
        ));
    }
    let first_cntlid = ns.controller_info().map_or(0, |c| c.cntlid);
    let mut last: Vec<Option<u64>> = vec![None; SYNC_REGIONS];
    let (mut iterations, mut mismatches, mut after) = (0u64, 0u64, 0u64);
    let mut back = vec![0u8; SYNC_LEN];
    let mut last_ok = Instant::now();
    loop {
        if sh.stop.load(Ordering::Relaxed) {
            return Err("sync: stopped (the async host failed)".into());
        }
        if Instant::now() > sh.deadline {
            return Err(format!(
                "sync: deadline passed after {iterations} iterations ({})",
                stats_line(&ns.stats())
            ));
        }
        let s = ns.stats();
        if a.mode == Mode::Restart
            && s.reconnects >= a.min_reconnects
            && after >= a.after
            && sh.start.elapsed() >= Duration::from_secs(a.runtime)
        {
            break;
        }
        let r = (iterations % SYNC_REGIONS as u64) as usize;
        let off = (r * SYNC_LEN) as u64;
        let data = pattern(iterations, SYNC_LEN);
        let res = ns.write_at(&data, off).and_then(|()| {
            last[r] = Some(iterations);
            ns.read_at(&mut back, off)
        });
        if let Err(e) = res {
            if a.mode == Mode::Giveup {
                let g = check_giveup(a, "sync", &e, last_ok.elapsed())?;
                return Ok(format!(
                    "sync: iterations={iterations} mismatches={mismatches} {g} {}",
                    stats_line(&ns.stats())
                ));
            }
            return Err(format!("sync: iteration {iterations}: {e}"));
        }
        last_ok = Instant::now();
        if back != data {
            mismatches += 1;
        }
        iterations += 1;
        if s.reconnects >= a.min_reconnects.max(1) {
            after += 1;
        }
        sh.sync_ops.store(iterations, Ordering::Relaxed);
    }
    // Every region holds its last acknowledged pattern.
    let mut stale = 0;
    for (r, seed) in last.iter().enumerate() {
        let Some(seed) = *seed else { continue };
        ns.read_at(&mut back, (r * SYNC_LEN) as u64)
            .map_err(|e| format!("sync: final read of region {r}: {e}"))?;
        if back != pattern(seed, SYNC_LEN) {
            stale += 1;
        }
    }
    let s = ns.stats();
    let cntlid = ns.controller_info().map_or(0, |c| c.cntlid);
    ns.shutdown().map_err(|e| format!("sync: shutdown: {e}"))?;
    let line = format!(
        "sync: iterations={iterations} mismatches={mismatches} stale_regions={stale} cntlid={first_cntlid}->{cntlid} {}",
        stats_line(&s)
    );
    if mismatches > 0 || stale > 0 || s.reconnects < a.min_reconnects {
        return Err(line);
    }
    Ok(line)
}

fn async_host(a: &Args, opts: ConnectOptions, policy: ReconnectPolicy, sh: &Shared) -> Res<String> {
    let qd = a.iodepth as usize;
    let mut q = ReconnectingQueue::connect(opts, a.nsid, policy)
        .map_err(|e| format!("async: connect: {e}"))?;
    let ns = *q.info();
    let bs = ns.block_size as usize;
    let base = (SYNC_REGIONS * SYNC_LEN / bs) as u64;
    if ns.blocks < base + ASYNC_BLOCKS {
        return Err(format!(
            "async: namespace of {} blocks is too small",
            ns.blocks
        ));
    }
    if q.depth() < qd {
        return Err(format!("async: queue depth {} < --iodepth {qd}", q.depth()));
    }
    let mut submitted = 0u64;
    let mut completions: Vec<u8> = Vec::new();
    let mut last: Vec<Option<u64>> = vec![None; ASYNC_BLOCKS as usize];
    let mut busy = vec![false; ASYNC_BLOCKS as usize];
    let mut done = Vec::new();
    let mut completed = 0u64;
    let mut at_reconnect: Option<u64> = None;
    let mut last_ok = Instant::now();
    loop {
        if sh.stop.load(Ordering::Relaxed) {
            return Err("async: stopped (the sync host failed)".into());
        }
        if Instant::now() > sh.deadline {
            return Err(format!(
                "async: deadline passed after {completed} writes ({})",
                stats_line(&q.stats())
            ));
        }
        let finishing = a.mode == Mode::Restart
            && at_reconnect.is_some_and(|at| completed >= at + 20 * a.after)
            && sh.start.elapsed() >= Duration::from_secs(a.runtime);
        if finishing && q.in_flight() == 0 {
            break;
        }
        while !finishing && q.in_flight() < qd {
            let blk = submitted % ASYNC_BLOCKS;
            if busy[blk as usize] {
                return Err(format!(
                    "async: block {blk} still in flight after {ASYNC_BLOCKS} writes"
                ));
            }
            busy[blk as usize] = true;
            q.submit_write(&ns, base + blk, pattern(submitted, bs), submitted)
                .map_err(|e| format!("async: submit: {}", e.error))?;
            submitted += 1;
            completions.push(0);
        }
        done.clear();
        let reaped = q.reap(&mut done, 1, None);
        for c in &done {
            let n = c.user_data as usize;
            completions[n] = completions[n].saturating_add(1);
            busy[(c.user_data % ASYNC_BLOCKS) as usize] = false;
            match c.result {
                Ok(_) => {
                    last[(c.user_data % ASYNC_BLOCKS) as usize] = Some(c.user_data);
                    completed += 1;
                    last_ok = Instant::now();
                }
                Err(e) if a.mode == Mode::Giveup => {
                    // Handed back at the give-up: fine, checked below.
                    let _ = e;
                }
                Err(e) => return Err(format!("async: write {} failed: {e}", c.user_data)),
            }
        }
        if let Err(e) = reaped {
            if a.mode == Mode::Giveup {
                let g = check_giveup(a, "async", &e, last_ok.elapsed())?;
                // Every command came back (completed or handed back failed), none twice.
                let missing = completions.iter().filter(|&&n| n == 0).count();
                let twice = completions.iter().filter(|&&n| n > 1).count();
                if q.in_flight() != 0 || missing > 0 || twice > 0 {
                    return Err(format!(
                        "async: after the give-up: {} still in flight, {missing} never returned, {twice} returned twice",
                        q.in_flight()
                    ));
                }
                return Ok(format!(
                    "async: writes_completed={completed} submitted={submitted} all_returned=yes {g} {}",
                    stats_line(&q.stats())
                ));
            }
            return Err(format!("async: reap: {e}"));
        }
        if at_reconnect.is_none() && q.stats().reconnects >= a.min_reconnects.max(1) {
            at_reconnect = Some(completed);
        }
        if a.min_reconnects == 0 && at_reconnect.is_none() {
            at_reconnect = Some(0);
        }
        sh.async_ops.store(completed, Ordering::Relaxed);
    }
    let twice = completions.iter().filter(|&&n| n != 1).count();
    // Read every written block back.
    let mut stale = 0u64;
    let mut next = 0u64;
    while next < ASYNC_BLOCKS || q.in_flight() > 0 {
        while next < ASYNC_BLOCKS && q.in_flight() < qd {
            q.submit_read(&ns, base + next, vec![0u8; bs], next)
                .map_err(|e| format!("async: submit read: {}", e.error))?;
            next += 1;
        }
        done.clear();
        q.reap(&mut done, 1, None)
            .map_err(|e| format!("async: reap reads: {e}"))?;
        for c in done.drain(..) {
            c.result
                .map_err(|e| format!("async: read of block {}: {e}", c.user_data))?;
            if let Some(seed) = last[c.user_data as usize] {
                if c.buf.as_deref() != Some(&pattern(seed, bs)[..]) {
                    stale += 1;
                }
            }
        }
    }
    let s = q.stats();
    q.shutdown().map_err(|e| format!("async: shutdown: {e}"))?;
    let line = format!(
        "async: qd={qd} writes={submitted} not_completed_exactly_once={twice} stale_blocks={stale} resubmits={} {}",
        s.retries,
        stats_line(&s)
    );
    if twice > 0 || stale > 0 || s.reconnects < a.min_reconnects {
        return Err(line);
    }
    Ok(line)
}

fn run(a: &Args) -> Res<()> {
    let mut opts = a.target.options();
    opts.timeout = Duration::from_secs(a.timeout);
    opts.kato = Duration::from_secs(a.kato);
    opts.queue_depth = a.iodepth.max(1);
    let policy = ReconnectPolicy {
        max_attempts: a.max_attempts,
        max_total: Some(Duration::from_secs(a.max_total)),
        initial_delay: Duration::from_millis(a.initial_ms),
        max_delay: Duration::from_millis(a.max_ms),
        multiplier: 2.0,
    };
    let start = Instant::now();
    let sh = Shared {
        sync_ops: AtomicU64::new(0),
        async_ops: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        start,
        deadline: start + Duration::from_secs(a.deadline),
    };
    println!(
        "reconnect_check: {} {}:{} mode {:?}, io timeout {} s, kato {} s, policy {:?}",
        a.target.transport_name(),
        a.target.traddr,
        a.target.trsvcid,
        a.mode,
        a.timeout,
        a.kato,
        policy
    );
    let guard = |r: Res<String>| {
        if r.is_err() {
            sh.stop.store(true, Ordering::Relaxed);
        }
        r
    };
    let (rs, ra) = std::thread::scope(|s| {
        let ts = s.spawn(|| guard(sync_host(a, opts.clone(), policy.clone(), &sh)));
        let ta = s.spawn(|| guard(async_host(a, opts.clone(), policy.clone(), &sh)));
        // Tell the harness once both hosts have verified I/O behind them.
        while !(sh.stop.load(Ordering::Relaxed) || ts.is_finished() || ta.is_finished()) {
            if sh.sync_ops.load(Ordering::Relaxed) >= 20
                && sh.async_ops.load(Ordering::Relaxed) >= 500
            {
                println!(
                    "reconnect_check: I/O running ({:.1} s after start)",
                    start.elapsed().as_secs_f64()
                );
                let _ = std::io::stdout().flush();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let rs = ts
            .join()
            .unwrap_or_else(|_| Err("sync host panicked".into()));
        let ra = ta
            .join()
            .unwrap_or_else(|_| Err("async host panicked".into()));
        (rs, ra)
    });
    let mut ok = true;
    for r in [&rs, &ra] {
        match r {
            Ok(l) => println!("reconnect_check: {l}"),
            Err(l) => {
                println!("reconnect_check: FAILED {l}");
                ok = false;
            }
        }
    }
    println!(
        "reconnect_check: total {:.1} s",
        start.elapsed().as_secs_f64()
    );
    if ok {
        Ok(())
    } else {
        Err("a host failed its checks".into())
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    match run(&a) {
        Ok(()) => {
            println!("reconnect_check OK");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("reconnect_check FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
