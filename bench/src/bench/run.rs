//! Run one workload on one transport: connect, start one thread per job at the same instant,
//! sample the process's CPU time at the edges of the measured window, show progress, collect.

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};

use super::args::TransportKind;
use super::engine::{self, Counters, Opened, TargetSpec};
use super::job::{self, Clock, DirStats, JobPlan, Shared, VerifyStats, Workload};
use super::target_stats::{self, TargetCpu};

/// CPU time of this process (all threads), user and system.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTime {
    pub user: Duration,
    pub sys: Duration,
}

impl CpuTime {
    pub fn now() -> CpuTime {
        match getrusage(UsageWho::RUSAGE_SELF) {
            Ok(u) => {
                let tv = |t: nix::sys::time::TimeVal| {
                    Duration::new(t.tv_sec().max(0) as u64, (t.tv_usec().max(0) as u32) * 1000)
                };
                CpuTime {
                    user: tv(u.user_time()),
                    sys: tv(u.system_time()),
                }
            }
            // getrusage(RUSAGE_SELF) cannot fail with a valid pointer; report zero if it does.
            Err(_) => CpuTime::default(),
        }
    }

    pub fn since(&self, e: &CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(e.user),
            sys: self.sys.saturating_sub(e.sys),
        }
    }
}

/// Everything measured for one workload on one transport.
#[derive(Debug, Clone)]
pub struct Measured {
    pub read: DirStats,
    pub write: DirStats,
    /// Length of the measured window (longest job).
    pub elapsed: Duration,
    pub cpu: CpuTime,
    pub counters: Counters,
    pub verify: Option<VerifyStats>,
    /// Bytes of each job's region.
    pub region_len: u64,
    /// Failures (empty when the run was clean).
    pub errors: Vec<String>,
    /// The target's CPU time and commands over the run (from its control socket), or why
    /// they could not be read; None without a control socket.
    pub target_cpu: Option<Result<TargetCpu, String>>,
}

impl Measured {
    pub fn total(&self) -> DirStats {
        let mut t = self.read.clone();
        t.add(&self.write);
        t
    }

    pub fn ok(&self) -> bool {
        self.errors.is_empty() && self.verify.as_ref().is_none_or(|v| v.mismatches == 0)
    }
}

/// How one transport fared.
#[derive(Debug, Clone)]
pub enum Outcome {
    Ran(Box<Measured>),
    /// The transport cannot run here; why.
    Skipped(String),
    /// It should have run but could not (connect failed, bad options for this namespace).
    Failed(String),
}

/// Progress line on stderr, when stderr is a terminal.
struct ProgressLine {
    on: bool,
    label: String,
    last: Instant,
    last_ios: u64,
    last_bytes: u64,
}

impl ProgressLine {
    fn new(label: String) -> ProgressLine {
        ProgressLine {
            on: std::io::stderr().is_terminal(),
            label,
            last: Instant::now(),
            last_ios: 0,
            last_bytes: 0,
        }
    }

    fn tick(&mut self, shared: &Shared, now: Instant, phase: &str, pos: String) {
        if !self.on || now.duration_since(self.last) < Duration::from_millis(500) {
            return;
        }
        let ios = shared.ios.load(Ordering::Relaxed);
        let bytes = shared.bytes.load(Ordering::Relaxed);
        let dt = now.duration_since(self.last).as_secs_f64();
        let iops = (ios - self.last_ios) as f64 / dt;
        let mibs = (bytes - self.last_bytes) as f64 / dt / (1 << 20) as f64;
        (self.last, self.last_ios, self.last_bytes) = (now, ios, bytes);
        let mut e = std::io::stderr().lock();
        let _ = write!(
            e,
            "\r\x1b[2K{}: {phase} {pos}  {} IOPS  {mibs:.1} MiB/s",
            self.label,
            super::report::si(iops)
        );
        let _ = e.flush();
    }

    fn clear(&self) {
        if self.on {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

/// Run `w` over `kind` against `t`.
pub fn run(kind: TransportKind, t: &TargetSpec, w: &Workload) -> Outcome {
    // Before connecting and after disconnecting (see target_stats).
    let target0 = t.stats_socket.as_deref().map(target_stats::sample);
    let session = match engine::open(kind, t, w.numjobs, w.iodepth, w.bs) {
        Ok(Opened::Ready(s)) => s,
        Ok(Opened::Unavailable(why)) => return Outcome::Skipped(why),
        Err(e) => return Outcome::Failed(e),
    };
    let regions = match w.regions(session.ns.size(), session.ns.block_size as u64) {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(e),
    };
    let region_len = regions[0].len;
    let seed: u64 = rand::random();
    let plans: Vec<JobPlan> = regions
        .iter()
        .enumerate()
        .map(|(index, &region)| JobPlan {
            index,
            rw: w.rw,
            read_pct: w.rw.read_percent(w.rwmixread),
            bs: w.bs,
            region,
            seed,
            verify: w.verify,
            interval: w
                .rate_iops
                .map(|r| Duration::from_secs(1) / r.min(u32::MAX as u64) as u32),
        })
        .collect();
    let engine::Session {
        ctrl, mut engines, ..
    } = *session;
    let shared = Shared::default();
    let start = Barrier::new(plans.len() + 1);
    let clock_cell = std::sync::OnceLock::<Clock>::new();
    let total_bytes: u64 = regions.iter().map(|r| r.len).sum();
    let mut progress = ProgressLine::new(format!("{} [{}]", w.name, kind.name()));

    let (results, cpu) = std::thread::scope(|s| {
        let handles: Vec<_> = engines
            .iter_mut()
            .zip(&plans)
            .map(|(eng, plan)| {
                let (shared, start, clock_cell) = (&shared, &start, &clock_cell);
                s.spawn(move || {
                    start.wait();
                    let clock = *clock_cell.get().expect("clock set before the start");
                    job::run_job(eng.as_mut(), plan, clock, shared)
                })
            })
            .collect();
        let t0 = Instant::now();
        let clock = Clock {
            ramp_end: t0 + w.ramp,
            end: w.runtime.map(|r| t0 + w.ramp + r),
        };
        clock_cell.set(clock).expect("set once");
        start.wait();
        let mut cpu0: Option<CpuTime> = None;
        let cpu1 = loop {
            let now = Instant::now();
            if cpu0.is_none() && now >= clock.ramp_end {
                cpu0 = Some(CpuTime::now());
            }
            let all_done = shared.finished.load(Ordering::Acquire) == plans.len();
            if all_done || clock.end.is_some_and(|e| now >= e) {
                break CpuTime::now();
            }
            let (phase, pos) = if now < clock.ramp_end {
                (
                    "ramp",
                    format!("{:.0}s", now.duration_since(t0).as_secs_f64()),
                )
            } else if let Some(r) = w.runtime {
                (
                    "run",
                    format!(
                        "{:.1}/{:.0}s",
                        now.duration_since(clock.ramp_end).as_secs_f64(),
                        r.as_secs_f64()
                    ),
                )
            } else {
                let done = shared.bytes.load(Ordering::Relaxed) as f64;
                ("run", format!("{:.0}%", 100.0 * done / total_bytes as f64))
            };
            progress.tick(&shared, now, phase, pos);
            let mut nap = Duration::from_millis(if clock.end.is_some() { 100 } else { 2 });
            for edge in [Some(clock.ramp_end), clock.end].into_iter().flatten() {
                if edge > now {
                    nap = nap.min(edge - now);
                }
            }
            std::thread::sleep(nap);
        };
        let cpu = cpu1.since(&cpu0.unwrap_or(cpu1));
        let results: Vec<job::JobResult> = handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect();
        (results, cpu)
    });
    progress.clear();
    drop(engines);
    let clean = results.iter().all(|r| r.error.is_none());
    if let Err(e) = ctrl.shutdown() {
        // After a failed run (a dead target, say) this failing too is no news.
        if clean {
            tracing::warn!(error = %e, "controller shutdown");
        }
    }

    let target_cpu = target0.map(|s0| {
        let s0 = s0?;
        std::thread::sleep(target_stats::PUBLISH_WAIT);
        let s1 = target_stats::sample(t.stats_socket.as_deref().expect("sampled before"))?;
        Ok(TargetCpu::between(&s0, &s1))
    });
    let mut m = Measured {
        read: DirStats::new(),
        write: DirStats::new(),
        elapsed: Duration::ZERO,
        cpu,
        counters: Counters::default(),
        verify: w.verify.then(VerifyStats::default),
        region_len,
        errors: Vec::new(),
        target_cpu,
    };
    for (i, r) in results.iter().enumerate() {
        m.read.add(&r.read);
        m.write.add(&r.write);
        m.counters.add(&r.counters);
        m.elapsed = m.elapsed.max(r.measured);
        if let Some(v) = m.verify.as_mut() {
            v.add(&r.verify);
        }
        if let Some(e) = &r.error {
            m.errors.push(if results.len() > 1 {
                format!("job {i}: {e}")
            } else {
                e.clone()
            });
        }
    }
    Outcome::Ran(Box::new(m))
}
