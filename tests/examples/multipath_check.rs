//! ANA multipath check of the initiator's [`Namespace`] against a live target whose
//! paths' ANA states change (and listeners come and go) while it runs: `--threads` workers,
//! each with its own `Namespace` over every `--path` (one host: the same host NQN and
//! host ID everywhere) and its own region of `--region-mib` MiB, do random 4 KiB writes of a
//! per-block pattern (worker, block number, generation) and reads of random earlier-written
//! blocks, compared with what was last written there, for `--seconds`; then every written block
//! is read back once more (unless `--no-final-verify`).
//!
//! ```text
//! multipath_check --path tcp:127.0.0.1:4420 --path tcp:127.0.0.2:4420 --path rdma:192.168.78.1:4420
//!                 --subnqn NQN [--nsid 1] [--seconds 60] [--threads 2] [--region-mib 16]
//!                 [--hostnqn NQN] [--timeout 15] [--no-path-timeout S] [--round-robin]
//!                 [--no-final-verify]
//! ```
//!
//! Every second it prints, per path (in the order given), the calls sent on it so far by all
//! workers together and its ANA state (one value when every worker's namespace sees the same,
//! else the values joined by `/`):
//!
//! ```text
//! multipath_check: t=12 path=tcp:127.0.0.2:4420 state=optimized calls=5321 conn=connected failovers=1 reconnects=0
//! multipath_check: t=12 ios=10233 errors=0 mismatches=0
//! ```
//!
//! and last `multipath_check: done ios=N errors=E mismatches=M failovers=F`. Exits 0 only if
//! no call failed, nothing read back differed from what was last written, and I/O was done.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use initiator::{
    hostnqn_for, ConnectOptions, MultipathOptions, Namespace, PathInfo, PathMonitor, PathPolicy,
    PathState, Transport,
};

#[derive(Parser, Debug)]
#[command(about = "Verified I/O through Namespace while the paths' ANA states change")]
struct Args {
    /// A path: TRANSPORT:ADDR:PORT (tcp or rdma), e.g. tcp:127.0.0.1:4420; repeat per path.
    #[arg(long = "path", required = true, value_parser = parse_path)]
    paths: Vec<(Transport, String, u16)>,
    #[arg(long)]
    subnqn: String,
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// Seconds of random I/O.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Workers, each with its own Namespace and region.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// MiB per worker (worker i owns [i x size, (i + 1) x size) of the namespace).
    #[arg(long, default_value_t = 16)]
    region_mib: u64,
    /// Host NQN (default: the UUID form of a random host ID).
    #[arg(long)]
    hostnqn: Option<String>,
    /// Seconds a command may take before its connection counts as failed.
    #[arg(long, default_value_t = 15)]
    timeout: u64,
    /// Seconds a call waits for a usable path (default: the paths' ANATT).
    #[arg(long)]
    no_path_timeout: Option<u64>,
    /// Spread the calls over the usable paths of the best state instead of the first one.
    #[arg(long)]
    round_robin: bool,
    /// Skip the read-back of every written block at the end.
    #[arg(long)]
    no_final_verify: bool,
}

fn parse_path(s: &str) -> Result<(Transport, String, u16), String> {
    let bad = || format!("bad path {s:?} (TRANSPORT:ADDR:PORT, e.g. tcp:127.0.0.1:4420)");
    let (tr, rest) = s.split_once(':').ok_or_else(bad)?;
    let (addr, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let tr = match tr {
        "tcp" => Transport::Tcp,
        "rdma" => Transport::Rdma,
        _ => return Err(bad()),
    };
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    if addr.is_empty() {
        return Err(bad());
    }
    Ok((tr, addr.to_string(), port.parse().map_err(|_| bad())?))
}

fn tr_name(t: Transport) -> &'static str {
    match t {
        Transport::Tcp => "tcp",
        Transport::Rdma => "rdma",
    }
}

const BLOCK: usize = 4096;
const MAGIC: u64 = 0x4d50_4348_4b00_0000; // "MPCHK"

/// splitmix64: the workers' choices and the data pattern.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Block `blk` (namespace-wide 4 KiB index) of worker `w` at generation `gen`: a header
/// (magic | worker, block, generation) and words derived from all three.
fn fill(buf: &mut [u8], w: u32, blk: u64, gen: u64) {
    let words = [MAGIC | w as u64, blk, gen];
    let mut x = mix(blk ^ gen.rotate_left(32) ^ ((w as u64) << 56));
    for (i, c) in buf.chunks_exact_mut(8).enumerate() {
        let v = if i < words.len() {
            words[i]
        } else {
            x = mix(x);
            x
        };
        c.copy_from_slice(&v.to_le_bytes());
    }
}

/// What a mismatching block holds: its header, read as (worker, block, generation).
fn header_of(buf: &[u8]) -> String {
    let le = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    if le(0) & !0xff_ffff == MAGIC {
        format!(
            "worker {} block {} generation {}",
            le(0) & 0xff_ffff,
            le(1),
            le(2)
        )
    } else {
        format!("no header ({:#018x} {:#018x})", le(0), le(1))
    }
}

/// Counters of all workers together.
#[derive(Default)]
struct Totals {
    ios: AtomicU64,
    errors: AtomicU64,
    mismatches: AtomicU64,
}

/// At most this many error and mismatch lines are printed per worker.
const MAX_REPORTS: u64 = 20;

struct Worker {
    id: u32,
    ns: Namespace,
    /// First 4 KiB block of the region (namespace-wide index) and the number of blocks.
    first: u64,
    blocks: u64,
    totals: Arc<Totals>,
    reports: u64,
}

impl Worker {
    fn report(&mut self, line: String) {
        self.reports += 1;
        if self.reports <= MAX_REPORTS {
            println!("multipath_check: worker {}: {line}", self.id);
        }
    }

    /// Read block `k` of the region and compare it with generation `gen`.
    fn verify(&mut self, k: u64, gen: u64, back: &mut [u8], want: &mut [u8], what: &str) {
        let blk = self.first + k;
        let r = self.ns.read_at(back, blk * BLOCK as u64);
        self.totals.ios.fetch_add(1, Ordering::Relaxed);
        match r {
            Err(e) => {
                self.totals.errors.fetch_add(1, Ordering::Relaxed);
                self.report(format!("{what} read of block {blk} failed: {e}"));
            }
            Ok(()) => {
                fill(want, self.id, blk, gen);
                if back != want {
                    self.totals.mismatches.fetch_add(1, Ordering::Relaxed);
                    let at = back.iter().zip(want.iter()).position(|(a, b)| a != b);
                    let found = header_of(back);
                    self.report(format!(
                        "{what} read of block {blk}: MISMATCH (expected generation {gen}, \
                         found {found}; first differing byte {at:?})"
                    ));
                }
            }
        }
    }

    /// Random writes and verifying reads until `until`; then the final pass.
    fn run(mut self, until: Instant, final_verify: bool) -> Namespace {
        // Generation last written per block (0: never written, or unknown after a failed
        // write); the written blocks in a list for picking one at random.
        let mut gens = vec![0u64; self.blocks as usize];
        let mut written: Vec<u64> = Vec::new();
        let mut next_gen = 1u64;
        let mut rng = rand::random::<u64>() | 1;
        let mut buf = vec![0u8; BLOCK];
        let mut back = vec![0u8; BLOCK];
        while Instant::now() < until {
            rng = mix(rng);
            let write = written.is_empty() || rng & 1 == 0;
            if write {
                let k = (rng >> 8) % self.blocks;
                let blk = self.first + k;
                let gen = next_gen;
                next_gen += 1;
                fill(&mut buf, self.id, blk, gen);
                let r = self.ns.write_at(&buf, blk * BLOCK as u64);
                self.totals.ios.fetch_add(1, Ordering::Relaxed);
                match r {
                    Ok(()) => {
                        if gens[k as usize] == 0 {
                            written.push(k);
                        }
                        gens[k as usize] = gen;
                    }
                    Err(e) => {
                        self.totals.errors.fetch_add(1, Ordering::Relaxed);
                        self.report(format!("write of block {blk} failed: {e}"));
                        // What the block holds now is not known: never compare it again
                        // (it stays in `written` with generation 0, skipped below).
                        gens[k as usize] = 0;
                    }
                }
            } else {
                let k = written[((rng >> 8) % written.len() as u64) as usize];
                let gen = gens[k as usize];
                if gen == 0 {
                    continue;
                }
                let mut want = std::mem::take(&mut buf);
                self.verify(k, gen, &mut back, &mut want, "verify");
                buf = want;
            }
        }
        if final_verify {
            written.sort_unstable();
            written.dedup();
            let n = written.len();
            let t = Instant::now();
            for &k in &written {
                let gen = gens[k as usize];
                if gen != 0 {
                    let mut want = std::mem::take(&mut buf);
                    self.verify(k, gen, &mut back, &mut want, "final");
                    buf = want;
                }
            }
            println!(
                "multipath_check: worker {}: final read-back of {n} written blocks in {:.1} s",
                self.id,
                t.elapsed().as_secs_f64()
            );
        }
        self.ns
    }
}

/// One value when every worker's view agrees, else all of them joined by `/`.
fn joined(v: Vec<String>) -> String {
    let mut seen = Vec::new();
    for s in v {
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
    seen.join("/")
}

fn conn_name(s: PathState) -> &'static str {
    match s {
        PathState::Connected => "connected",
        PathState::Failed => "failed",
        PathState::Refused => "refused",
    }
}

/// The per-path lines for time `t`: each path's calls, failovers and reconnects summed over
/// the workers, its state and connection as each worker sees it.
fn path_lines(t: u64, monitors: &[PathMonitor]) -> Vec<String> {
    let views: Vec<Vec<PathInfo>> = monitors.iter().map(PathMonitor::paths).collect();
    let n = views.first().map_or(0, Vec::len);
    (0..n)
        .map(|i| {
            let p0 = &views[0][i];
            let calls: u64 = views.iter().map(|v| v[i].commands).sum();
            let failovers: u64 = views.iter().map(|v| v[i].failovers).sum();
            let reconnects: u64 = views.iter().map(|v| v[i].reconnects).sum();
            let state = joined(
                views
                    .iter()
                    .map(|v| v[i].ana_state.map_or("unknown".into(), |s| s.to_string()))
                    .collect(),
            );
            let conn = joined(
                views
                    .iter()
                    .map(|v| conn_name(v[i].state).to_string())
                    .collect(),
            );
            format!(
                "multipath_check: t={t} path={}:{}:{} state={state} calls={calls} conn={conn} \
                 failovers={failovers} reconnects={reconnects}",
                tr_name(p0.transport),
                p0.addr,
                p0.port
            )
        })
        .collect()
}

/// What the run came to.
struct Summary {
    ios: u64,
    errors: u64,
    mismatches: u64,
    /// A worker panicked.
    broken: bool,
}

fn run(a: &Args) -> Result<Summary, String> {
    if a.threads == 0 || a.region_mib == 0 || a.seconds == 0 {
        return Err("--threads, --region-mib and --seconds must be above 0".into());
    }
    // One host on every path and in every worker.
    let hostid: [u8; 16] = rand::random();
    let hostnqn = a.hostnqn.clone().unwrap_or_else(|| hostnqn_for(&hostid));
    println!("multipath_check: host {hostnqn}");
    let paths: Vec<ConnectOptions> = a
        .paths
        .iter()
        .map(|(tr, addr, port)| {
            let mut o = match tr {
                Transport::Tcp => ConnectOptions::tcp(addr, *port, &a.subnqn),
                Transport::Rdma => ConnectOptions::rdma(addr, *port, &a.subnqn),
            };
            o.hostnqn.clone_from(&hostnqn);
            o.hostid = hostid;
            o.timeout = Duration::from_secs(a.timeout);
            o.queue_depth = 32;
            o
        })
        .collect();
    let opts = MultipathOptions {
        policy: if a.round_robin {
            PathPolicy::RoundRobin
        } else {
            PathPolicy::First
        },
        no_path_timeout: a.no_path_timeout.map(Duration::from_secs),
        ..MultipathOptions::default()
    };
    let region_blocks = (a.region_mib << 20) / BLOCK as u64;
    let totals = Arc::new(Totals::default());
    let mut workers = Vec::new();
    for id in 0..a.threads {
        let t = Instant::now();
        let ns = Namespace::multipath(paths.clone(), a.nsid, opts.clone())
            .map_err(|e| format!("worker {id}: open: {e}"))?;
        let need = (id as u64 + 1) * (a.region_mib << 20);
        if ns.size() < need {
            return Err(format!(
                "namespace {} has {} bytes; {} workers of {} MiB need {}",
                a.nsid,
                ns.size(),
                a.threads,
                a.region_mib,
                a.threads as u64 * (a.region_mib << 20)
            ));
        }
        if BLOCK as u32 % ns.block_size() != 0 {
            return Err(format!(
                "block size {} does not divide 4 KiB",
                ns.block_size()
            ));
        }
        println!(
            "multipath_check: worker {id}: opened namespace {} ({} MiB, {} B blocks) over {} paths \
             in {:.2} s: {}",
            a.nsid,
            ns.size() >> 20,
            ns.block_size(),
            paths.len(),
            t.elapsed().as_secs_f64(),
            ns.paths()
                .iter()
                .map(|p| format!(
                    "{}:{}:{} {} {} cntlid {:?}",
                    tr_name(p.transport),
                    p.addr,
                    p.port,
                    conn_name(p.state),
                    p.ana_state.map_or("unknown".into(), |s| s.to_string()),
                    p.cntlid
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        workers.push(Worker {
            id,
            ns,
            first: id as u64 * region_blocks,
            blocks: region_blocks,
            totals: totals.clone(),
            reports: 0,
        });
    }
    let monitors: Vec<PathMonitor> = workers.iter().map(|w| w.ns.monitor()).collect();
    let start = Instant::now();
    let until = start + Duration::from_secs(a.seconds);
    println!(
        "multipath_check: I/O running: {} workers x {} MiB, {} s",
        a.threads, a.region_mib, a.seconds
    );
    for l in path_lines(0, &monitors) {
        println!("{l}");
    }
    let final_verify = !a.no_final_verify;
    let handles: Vec<_> = workers
        .into_iter()
        .map(|w| {
            let id = w.id;
            std::thread::Builder::new()
                .name(format!("mpcheck-{id}"))
                .spawn(move || w.run(until, final_verify))
                .map_err(|e| format!("worker {id}: spawn: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut tick = 1u64;
    while handles.iter().any(|h| !h.is_finished()) {
        let next = start + Duration::from_secs(tick);
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(100)));
            continue;
        }
        for l in path_lines(tick, &monitors) {
            println!("{l}");
        }
        println!(
            "multipath_check: t={tick} ios={} errors={} mismatches={}",
            totals.ios.load(Ordering::Relaxed),
            totals.errors.load(Ordering::Relaxed),
            totals.mismatches.load(Ordering::Relaxed)
        );
        tick += 1;
    }
    for l in path_lines(start.elapsed().as_secs().max(tick), &monitors) {
        println!("{l}");
    }
    let mut broken = false;
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(ns) => {
                let s = ns.stats();
                println!(
                    "multipath_check: worker {i}: ana_retries={} path_failovers={} ana_events={} \
                     ana_changes={} reconnects={} waits={} gave_up={}",
                    s.ana_retries,
                    s.path_failovers,
                    s.ana_events,
                    s.ana_changes,
                    s.reconnects,
                    s.waits,
                    s.gave_up
                );
                if let Err(e) = ns.shutdown() {
                    println!("multipath_check: worker {i}: shutdown: {e}");
                }
            }
            Err(_) => {
                println!("multipath_check: worker {i} panicked");
                broken = true;
            }
        }
    }
    let failovers: u64 = monitors
        .iter()
        .flat_map(|m| m.paths())
        .map(|p| p.failovers)
        .sum();
    let s = Summary {
        ios: totals.ios.load(Ordering::Relaxed),
        errors: totals.errors.load(Ordering::Relaxed),
        mismatches: totals.mismatches.load(Ordering::Relaxed),
        broken,
    };
    println!(
        "multipath_check: done ios={} errors={} mismatches={} failovers={failovers}",
        s.ios, s.errors, s.mismatches
    );
    Ok(s)
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
        Ok(s) if s.errors == 0 && s.mismatches == 0 && s.ios > 0 && !s.broken => {
            println!("multipath_check OK");
            ExitCode::SUCCESS
        }
        Ok(s) => {
            println!(
                "multipath_check FAILED: {} errors, {} mismatches, {} I/Os{}",
                s.errors,
                s.mismatches,
                s.ios,
                if s.broken { ", a worker panicked" } else { "" }
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("multipath_check FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
