//! One workload (fio's job options) and the loop one job thread runs on one [`Engine`].
//!
//! The loop keeps every slot busy: it picks the next offset and direction, fills the slot's
//! buffer if it writes with `--verify`, submits, reaps at least one completion, records its
//! latency (from the time of submission) in an HDR histogram, checks read data, and repeats.
//! Nothing in the loop allocates: buffers, histograms and the verify table exist before the
//! clock starts.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::args::{Args, Rw};
use super::engine::{Counters, Done, Engine, Op};
use super::pattern::{self, Mismatch, Permutation, Rng};

/// Largest verify table (one u32 per block of a job's region).
const MAX_VERIFY_BLOCKS: u64 = 64 << 20;
/// Mismatches kept per job for the report (all are counted).
const KEEP_MISMATCHES: usize = 32;
/// Longest a job waits in one reap before it looks at the clock again.
const REAP_SLICE: Duration = Duration::from_millis(50);
/// In the verify table: the block has an I/O in flight.
const BUSY: u32 = 1 << 31;
/// Largest generation number (31 bits; 0 means "not written by this run").
const MAX_GENERATION: u32 = BUSY - 1;

/// A workload: fio's job options, checked.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub rw: Rw,
    pub rwmixread: u8,
    pub bs: u64,
    pub iodepth: u16,
    pub numjobs: u16,
    /// Time based when set (fio's --runtime with --time_based); one pass over the region
    /// otherwise.
    pub runtime: Option<Duration>,
    pub ramp: Duration,
    pub size: Option<u64>,
    pub offset: u64,
    pub offset_increment: u64,
    pub verify: bool,
    /// Each job's I/Os per second at most (fio's `rate_iops`).
    pub rate_iops: Option<u64>,
}

/// A job's part of the namespace, in bytes (a whole number of `bs` blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub len: u64,
}

impl Workload {
    /// The workload the command line describes (checks what does not need the namespace).
    pub fn from_args(a: &Args) -> Result<Workload, String> {
        if a.bs < 512 {
            return Err(format!("--bs={} is smaller than a 512-byte block", a.bs));
        }
        if a.bs > u32::MAX as u64 {
            return Err(format!("--bs={} is too large", a.bs));
        }
        if a.time_based && a.runtime.is_none() {
            return Err("--time_based needs --runtime".into());
        }
        if a.runtime.is_some_and(|r| r.is_zero()) {
            return Err("--runtime must be positive".into());
        }
        let w = Workload {
            name: String::new(),
            rw: a.rw,
            rwmixread: a.rwmixread,
            bs: a.bs,
            iodepth: a.iodepth,
            numjobs: a.numjobs,
            runtime: a.runtime,
            ramp: a.ramp_time,
            size: a.size,
            offset: a.offset,
            offset_increment: a.offset_increment,
            verify: a.verify.is_some(),
            rate_iops: a.rate_iops,
        };
        Ok(Workload {
            name: a.name.clone().unwrap_or_else(|| w.label()),
            ..w
        })
    }

    /// Short description: "4k randread qd32" (plus "x4" jobs, mix and verify when set).
    pub fn label(&self) -> String {
        let mut s = format!(
            "{} {} qd{}",
            human_size(self.bs),
            self.rw.name(),
            self.iodepth
        );
        if matches!(self.rw, Rw::Randrw | Rw::ReadWrite) {
            s += &format!(" {}%r", self.rwmixread);
        }
        if self.numjobs > 1 {
            s += &format!(" x{}", self.numjobs);
        }
        if self.verify {
            s += " verify";
        }
        if let Some(r) = self.rate_iops {
            s += &format!(" @{}", human_rate(r));
        }
        s
    }

    /// Each job's region in a namespace of `ns_size` bytes with `block`-byte blocks.
    pub fn regions(&self, ns_size: u64, block: u64) -> Result<Vec<Region>, String> {
        for (what, v) in [
            ("--offset", self.offset),
            ("--offset_increment", self.offset_increment),
        ] {
            if v % block != 0 {
                return Err(format!(
                    "{what}={v} is not a multiple of the {block}-byte block"
                ));
            }
        }
        if let Some(s) = self.size {
            if s < self.bs {
                return Err(format!("--size={s} is smaller than --bs={}", self.bs));
            }
        }
        let mut out = Vec::with_capacity(self.numjobs as usize);
        for i in 0..self.numjobs as u64 {
            let start = i
                .checked_mul(self.offset_increment)
                .and_then(|d| d.checked_add(self.offset))
                .filter(|&s| s < ns_size)
                .ok_or_else(|| {
                    format!(
                        "job {i} would start beyond the namespace ({ns_size} bytes): \
                         --offset={} --offset_increment={}",
                        self.offset, self.offset_increment
                    )
                })?;
            let len = self.size.unwrap_or(ns_size - start);
            if start.checked_add(len).is_none_or(|e| e > ns_size) {
                return Err(format!(
                    "job {i}'s region {start}+{len} goes beyond the namespace ({ns_size} bytes)"
                ));
            }
            let len = len / self.bs * self.bs;
            if len == 0 {
                return Err(format!(
                    "job {i}'s region at {start} holds no whole --bs={} block",
                    self.bs
                ));
            }
            if self.verify && len / self.bs > MAX_VERIFY_BLOCKS {
                return Err(format!(
                    "--verify keeps one entry per block: {} blocks is too many; use a smaller --size",
                    len / self.bs
                ));
            }
            out.push(Region { start, len });
        }
        if self.verify {
            for w in out.windows(2) {
                if w[1].start < w[0].start + w[0].len {
                    return Err(format!(
                        "with --verify the jobs' regions must not overlap (job regions \
                         {}+{} and {}+{}): set --offset_increment >= --size",
                        w[0].start, w[0].len, w[1].start, w[1].len
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// `4k`, `128k`, `1m`, or bytes.
/// A rate of I/Os per second, short: "10k/s", "1.5M/s", "500/s".
pub fn human_rate(r: u64) -> String {
    let (v, unit) = match r {
        r if r >= 1_000_000 => (r as f64 / 1e6, "M"),
        r if r >= 1_000 => (r as f64 / 1e3, "k"),
        r => (r as f64, ""),
    };
    let v = format!("{v:.1}");
    format!("{}{unit}/s", v.trim_end_matches(".0"))
}

pub fn human_size(b: u64) -> String {
    for (shift, s) in [(40, "t"), (30, "g"), (20, "m"), (10, "k")] {
        if b >= 1 << shift && b % (1 << shift) == 0 {
            return format!("{}{s}", b >> shift);
        }
    }
    b.to_string()
}

/// Counters shared by the jobs and the thread that reports progress.
#[derive(Debug, Default)]
pub struct Shared {
    /// I/Os and bytes completed (all phases).
    pub ios: AtomicU64,
    pub bytes: AtomicU64,
    /// Jobs whose measured phase is over.
    pub finished: AtomicUsize,
    /// A job failed: the others stop too.
    pub abort: AtomicBool,
}

/// The clock of one run.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub ramp_end: Instant,
    /// End of a time-based run.
    pub end: Option<Instant>,
}

/// What one job does.
#[derive(Debug, Clone)]
pub struct JobPlan {
    pub index: usize,
    pub rw: Rw,
    pub read_pct: u8,
    pub bs: u64,
    pub region: Region,
    /// The run's seed (offsets, read/write mix, verify data).
    pub seed: u64,
    pub verify: bool,
    /// Time between two submissions at most (from `rate_iops`); `None`: as fast as it goes.
    pub interval: Option<Duration>,
}

/// Completed I/Os of one direction.
#[derive(Debug, Clone)]
pub struct DirStats {
    pub ios: u64,
    pub bytes: u64,
    /// Latency, nanoseconds, submission to completion.
    pub hist: Histogram<u64>,
}

impl DirStats {
    pub fn new() -> DirStats {
        DirStats {
            ios: 0,
            bytes: 0,
            hist: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                .expect("valid histogram bounds"),
        }
    }

    pub fn add(&mut self, o: &DirStats) {
        self.ios += o.ios;
        self.bytes += o.bytes;
        self.hist.add(&o.hist).expect("same histogram bounds");
    }
}

/// Verify outcome of a job (or of all jobs).
#[derive(Debug, Clone, Default)]
pub struct VerifyStats {
    pub checked: u64,
    pub mismatches: u64,
    /// The first few: (job, namespace byte offset, what).
    pub first: Vec<(usize, u64, Mismatch)>,
}

impl VerifyStats {
    fn record(&mut self, job: usize, offset: u64, m: Mismatch) {
        self.mismatches += 1;
        if self.first.len() < KEEP_MISMATCHES {
            self.first.push((job, offset, m));
        }
    }

    pub fn add(&mut self, o: &VerifyStats) {
        self.checked += o.checked;
        self.mismatches += o.mismatches;
        self.first.extend(o.first.iter().cloned());
    }
}

/// The result of one job.
#[derive(Debug, Clone)]
pub struct JobResult {
    pub read: DirStats,
    pub write: DirStats,
    /// Queue counters over the measured window.
    pub counters: Counters,
    /// Length of the measured window.
    pub measured: Duration,
    pub verify: VerifyStats,
    pub error: Option<String>,
}

/// Next block index of a job's region.
struct Offsets {
    random: bool,
    blocks: u64,
    /// Time based: wrap around forever; otherwise one pass.
    wrap: bool,
    issued: u64,
    perm: Permutation,
    seed: u64,
}

impl Offsets {
    fn new(random: bool, blocks: u64, wrap: bool, seed: u64) -> Offsets {
        Offsets {
            random,
            blocks,
            wrap,
            issued: 0,
            perm: Permutation::new(blocks, seed),
            seed,
        }
    }

    fn next(&mut self) -> Option<u64> {
        if !self.wrap && self.issued == self.blocks {
            return None;
        }
        let i = self.issued % self.blocks;
        if i == 0 && self.issued > 0 && self.random {
            // A new pass visits the blocks in a new order.
            let pass = self.issued / self.blocks;
            self.perm = Permutation::new(self.blocks, pattern::splitmix64(self.seed ^ pass));
        }
        self.issued += 1;
        Some(if self.random { self.perm.get(i) } else { i })
    }
}

#[derive(Debug, Clone, Copy)]
struct SlotInfo {
    op: Op,
    block: u64,
    generation: u32,
    start: Instant,
}

/// Per-block state for --verify: the generation this job last completed there (0: none) and
/// the BUSY bit.
struct VerifyTable {
    blocks: Vec<u32>,
    seed: u64,
    next_generation: u32,
    /// Check every read block (pure read workloads); otherwise only blocks this run wrote.
    check_unwritten: bool,
    scratch: Vec<u8>,
}

impl VerifyTable {
    fn next_generation(&mut self) -> u32 {
        let g = self.next_generation;
        self.next_generation = if g == MAX_GENERATION { 1 } else { g + 1 };
        g
    }
}

fn stop_reason(op: Op, offset: u64, e: impl std::fmt::Display, engine: &dyn Engine) -> String {
    let what = match op {
        Op::Read => "read",
        Op::Write => "write",
    };
    let mut msg = format!("{what} of offset {offset} ({offset:#x}) failed: {e}");
    // A command failed with its queue: say why the queue failed.
    if let Some(cause) = engine.failure().filter(|c| !msg.contains(c.as_str())) {
        msg += &format!(" ({cause})");
    }
    msg
}

/// Run one job to its end on `engine`. `shared.finished` is bumped when the measured phase
/// is over (a verify pass may follow).
pub fn run_job(
    engine: &mut dyn Engine,
    plan: &JobPlan,
    clock: Clock,
    shared: &Shared,
) -> JobResult {
    let bs = plan.bs;
    let blocks = plan.region.len / bs;
    let depth = engine.slots();
    if plan.interval.is_some() {
        // Paced submissions sleep tens of microseconds at a time: without this the kernel
        // lets each sleep run 50 us long (the default timer slack) and the rate falls short.
        let _ = nix::sys::prctl::set_timerslack(1000);
    }
    let mut offsets = Offsets::new(
        plan.rw.is_random(),
        blocks,
        clock.end.is_some(),
        pattern::splitmix64(plan.seed ^ plan.index as u64),
    );
    let mut rng = Rng::new(plan.seed.wrapping_add(plan.index as u64));
    let mut table = plan.verify.then(|| VerifyTable {
        blocks: vec![0u32; blocks as usize],
        seed: plan.seed,
        next_generation: 1,
        check_unwritten: plan.read_pct == 100,
        scratch: vec![0u8; bs as usize],
    });
    if !plan.verify && plan.read_pct < 100 {
        for s in 0..depth {
            rng.fill(engine.buf_mut(s));
        }
    }
    let mut res = JobResult {
        read: DirStats::new(),
        write: DirStats::new(),
        counters: Counters::default(),
        measured: Duration::ZERO,
        verify: VerifyStats::default(),
        error: None,
    };
    let now0 = Instant::now();
    let mut slots = vec![
        SlotInfo {
            op: Op::Read,
            block: 0,
            generation: 0,
            start: now0,
        };
        depth
    ];
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut done: Vec<Done> = Vec::with_capacity(depth);
    let mut pending: Option<(Op, u64)> = None;
    let mut stopping = false;
    let mut counters_start: Option<Counters> = None;
    let mut last_completion = now0;
    let mut window_end: Option<Instant> = None;
    // With a rate: when the next submission is due (evenly spaced from the start; a job that
    // fell behind catches up by at most one interval, not in a burst).
    let mut due = now0;
    // One clock reading per pass, taken after the reap: it times the completions just reaped,
    // the checks at the top of the next pass and the commands that pass submits (they leave
    // together, in the next reap's flush, so one submission time serves them all). A verifying
    // job reads it again after checking the reaped blocks, which takes a while.
    let mut now = now0;

    loop {
        if table.is_some() {
            now = Instant::now();
        }
        if counters_start.is_none() && now >= clock.ramp_end {
            counters_start = Some(engine.counters());
        }
        if !stopping {
            if shared.abort.load(Ordering::Relaxed) {
                stopping = true;
                window_end = Some(now);
            } else if let Some(end) = clock.end.filter(|&e| now >= e) {
                stopping = true;
                window_end = Some(end);
            }
            if stopping {
                res.counters = engine.counters().since(&counters_start.unwrap_or_default());
            }
        }
        while !stopping {
            let Some(&slot) = free.last() else { break };
            if let Some(iv) = plan.interval {
                if now < due {
                    break;
                }
                due = due.max(now.checked_sub(iv).unwrap_or(now)) + iv;
            }
            let (op, block) = match pending.take() {
                Some(p) => p,
                None => match offsets.next() {
                    Some(b) => {
                        let op = match plan.read_pct {
                            100 => Op::Read,
                            0 => Op::Write,
                            p => {
                                if rng.percent() < p {
                                    Op::Read
                                } else {
                                    Op::Write
                                }
                            }
                        };
                        (op, b)
                    }
                    None => {
                        // One pass done: stop submitting; the window ends with the last
                        // completion.
                        stopping = true;
                        break;
                    }
                },
            };
            let offset = plan.region.start + block * bs;
            let mut generation = 0;
            if let Some(t) = table.as_mut() {
                let e = &mut t.blocks[block as usize];
                if *e & BUSY != 0 {
                    // Only one I/O per block at a time, or reads could not be checked.
                    pending = Some((op, block));
                    break;
                }
                *e |= BUSY;
                if op == Op::Write {
                    generation = t.next_generation();
                    pattern::fill_block(engine.buf_mut(slot), offset, t.seed, generation);
                }
            }
            if let Err(e) = engine.submit(slot, op, offset) {
                res.error = Some(stop_reason(op, offset, e, &*engine));
                stopping = true;
                break;
            }
            free.pop();
            slots[slot] = SlotInfo {
                op,
                block,
                generation,
                start: now,
            };
        }
        let paced = plan.interval.is_some() && !stopping && now < due;
        if engine.in_flight() == 0 && (stopping || pending.is_none()) && !paced {
            break;
        }
        // With a rate, wait no longer than until the next submission is due.
        let slice = if paced {
            due.saturating_duration_since(now).min(REAP_SLICE)
        } else {
            REAP_SLICE
        };
        if paced && engine.in_flight() == 0 {
            std::thread::sleep(slice);
        } else if let Err(e) = engine.reap(&mut done, 1, slice) {
            res.error
                .get_or_insert_with(|| format!("queue failed: {e}"));
            stopping = true;
        }
        now = Instant::now();
        let counted = now >= clock.ramp_end && clock.end.is_none_or(|e| now <= e);
        let (mut n, mut bytes) = (0u64, 0u64);
        for d in done.drain(..) {
            let s = slots[d.slot];
            free.push(d.slot);
            let offset = plan.region.start + s.block * bs;
            if let Some(t) = table.as_mut() {
                t.blocks[s.block as usize] &= !BUSY;
            }
            if let Err(e) = d.result {
                res.error
                    .get_or_insert_with(|| stop_reason(s.op, offset, e, &*engine));
                stopping = true;
                continue;
            }
            n += 1;
            bytes += bs;
            if let Some(t) = table.as_mut() {
                let e = &mut t.blocks[s.block as usize];
                match s.op {
                    Op::Write => *e = s.generation,
                    Op::Read if *e != 0 || t.check_unwritten => {
                        let expected = (*e != 0).then_some(*e);
                        res.verify.checked += 1;
                        if let Err(m) = pattern::check_block(
                            engine.buf(d.slot),
                            offset,
                            expected,
                            &mut t.scratch,
                        ) {
                            res.verify.record(plan.index, offset, m);
                        }
                    }
                    Op::Read => {}
                }
            }
            if counted {
                let dir = match s.op {
                    Op::Read => &mut res.read,
                    Op::Write => &mut res.write,
                };
                dir.ios += 1;
                dir.bytes += bs;
                let ns = now.saturating_duration_since(s.start).as_nanos() as u64;
                dir.hist.saturating_record(ns.max(1));
            }
        }
        if n > 0 {
            last_completion = now;
            shared.ios.fetch_add(n, Ordering::Relaxed);
            shared.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        if res.error.is_some() {
            shared.abort.store(true, Ordering::Relaxed);
        }
    }
    let end = window_end.unwrap_or(last_completion);
    if clock.end.is_none() || res.counters == Counters::default() {
        res.counters = engine.counters().since(&counters_start.unwrap_or_default());
    }
    res.measured = end.saturating_duration_since(clock.ramp_end);
    shared.finished.fetch_add(1, Ordering::Release);

    if let (Some(t), None) = (table.as_mut(), &res.error) {
        if plan.read_pct < 100 {
            verify_pass(engine, plan, t, &mut res);
        }
    }
    res
}

/// Read back every block this job wrote and check it (after the measured phase).
fn verify_pass(engine: &mut dyn Engine, plan: &JobPlan, t: &mut VerifyTable, res: &mut JobResult) {
    let bs = plan.bs;
    let depth = engine.slots();
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut slot_block = vec![0u64; depth];
    let mut done: Vec<Done> = Vec::with_capacity(depth);
    let mut next = 0usize;
    loop {
        while let Some(&slot) = free.last() {
            let Some(b) = (next..t.blocks.len()).find(|&b| t.blocks[b] != 0) else {
                next = t.blocks.len();
                break;
            };
            next = b + 1;
            let offset = plan.region.start + b as u64 * bs;
            if let Err(e) = engine.submit(slot, Op::Read, offset) {
                res.error = Some(stop_reason(Op::Read, offset, e, &*engine));
                return;
            }
            free.pop();
            slot_block[slot] = b as u64;
        }
        if engine.in_flight() == 0 {
            return;
        }
        if let Err(e) = engine.reap(&mut done, 1, REAP_SLICE) {
            res.error
                .get_or_insert_with(|| format!("queue failed in the verify pass: {e}"));
        }
        for d in done.drain(..) {
            free.push(d.slot);
            let b = slot_block[d.slot];
            let offset = plan.region.start + b * bs;
            match d.result {
                Err(e) => {
                    res.error
                        .get_or_insert_with(|| stop_reason(Op::Read, offset, e, &*engine));
                }
                Ok(()) => {
                    res.verify.checked += 1;
                    let expected = t.blocks[b as usize];
                    if let Err(m) = pattern::check_block(
                        engine.buf(d.slot),
                        offset,
                        Some(expected),
                        &mut t.scratch,
                    ) {
                        res.verify.record(plan.index, offset, m);
                    }
                }
            }
        }
        if res.error.is_some() && engine.in_flight() == 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::engine::Counters;
    use clap::Parser;
    use initiator::{CmdError, Error};

    /// An in-memory namespace: every I/O completes at the next reap, against `disk`.
    struct MemEngine {
        disk: Vec<u8>,
        bufs: Vec<Vec<u8>>,
        busy: Vec<bool>,
        ready: Vec<Done>,
        /// Writes to this offset after the first are dropped (a lost write).
        lose_rewrites_at: Option<u64>,
        written_at_lost: bool,
        /// I/O to this offset fails with Unrecovered Read Error.
        fail_at: Option<u64>,
        ios: u64,
    }

    impl MemEngine {
        fn new(disk_len: usize, slots: usize, bs: usize) -> MemEngine {
            MemEngine {
                disk: vec![0; disk_len],
                bufs: vec![vec![0; bs]; slots],
                busy: vec![false; slots],
                ready: Vec::new(),
                lose_rewrites_at: None,
                written_at_lost: false,
                fail_at: None,
                ios: 0,
            }
        }
    }

    impl Engine for MemEngine {
        fn slots(&self) -> usize {
            self.bufs.len()
        }
        fn buf(&self, slot: usize) -> &[u8] {
            assert!(!self.busy[slot], "buffer of a busy slot read");
            &self.bufs[slot]
        }
        fn buf_mut(&mut self, slot: usize) -> &mut [u8] {
            assert!(!self.busy[slot], "buffer of a busy slot written");
            &mut self.bufs[slot]
        }
        fn submit(&mut self, slot: usize, op: Op, offset: u64) -> Result<(), Error> {
            assert!(!self.busy[slot], "slot {slot} submitted twice");
            self.busy[slot] = true;
            self.ios += 1;
            let (o, n) = (offset as usize, self.bufs[slot].len());
            let result = if Some(offset) == self.fail_at {
                Err(CmdError::Status(nvme::Status::READ_ERROR))
            } else {
                match op {
                    Op::Read => self.bufs[slot].copy_from_slice(&self.disk[o..o + n]),
                    Op::Write => {
                        let lost = Some(offset) == self.lose_rewrites_at
                            && std::mem::replace(&mut self.written_at_lost, true);
                        if !lost {
                            self.disk[o..o + n].copy_from_slice(&self.bufs[slot]);
                        }
                    }
                }
                Ok(())
            };
            self.ready.push(Done { slot, result });
            Ok(())
        }
        fn reap(&mut self, out: &mut Vec<Done>, _min: usize, _t: Duration) -> Result<(), Error> {
            for d in self.ready.drain(..) {
                self.busy[d.slot] = false;
                out.push(d);
            }
            Ok(())
        }
        fn in_flight(&self) -> usize {
            self.ready.len()
        }
        fn counters(&self) -> Counters {
            Counters {
                payload_bytes: self.ios * self.bufs[0].len() as u64,
                ..Counters::default()
            }
        }
        fn failure(&self) -> Option<String> {
            None
        }
    }

    fn plan(rw: Rw, blocks: u64, verify: bool) -> JobPlan {
        JobPlan {
            index: 0,
            rw,
            read_pct: rw.read_percent(50),
            bs: 4096,
            region: Region {
                start: 8192,
                len: blocks * 4096,
            },
            seed: 77,
            verify,
            interval: None,
        }
    }

    fn one_pass() -> Clock {
        Clock {
            ramp_end: Instant::now(),
            end: None,
        }
    }

    fn timed(ms: u64) -> Clock {
        let now = Instant::now();
        Clock {
            ramp_end: now,
            end: Some(now + Duration::from_millis(ms)),
        }
    }

    #[test]
    fn one_pass_writes_every_block_once_then_verifies_them() {
        let mut e = MemEngine::new(8192 + 64 * 4096, 8, 4096);
        let shared = Shared::default();
        let r = run_job(&mut e, &plan(Rw::Randwrite, 64, true), one_pass(), &shared);
        assert_eq!(r.error, None);
        assert_eq!((r.write.ios, r.read.ios), (64, 0));
        assert_eq!(r.write.bytes, 64 * 4096);
        assert_eq!(r.write.hist.len(), 64);
        assert_eq!((r.verify.checked, r.verify.mismatches), (64, 0));
        // 64 writes and the 64 reads of the verify pass.
        assert_eq!(e.ios, 128);
        assert_eq!(shared.ios.load(Ordering::Relaxed), 64);
        assert_eq!(shared.finished.load(Ordering::Relaxed), 1);
        assert_eq!(r.counters.payload_bytes, 64 * 4096);
        // Nothing outside the region was touched; every block carries its own offset.
        assert!(e.disk[..8192].iter().all(|&b| b == 0));
        let mut scratch = vec![0u8; 4096];
        for b in 0..64u64 {
            let off = 8192 + b * 4096;
            let blk = &e.disk[off as usize..][..4096];
            assert_eq!(pattern::check_block(blk, off, None, &mut scratch), Ok(()));
        }

        // A separate read run checks every block; then one flipped byte is found.
        let r = run_job(&mut e, &plan(Rw::Read, 64, true), one_pass(), &shared);
        assert_eq!(
            (r.read.ios, r.verify.checked, r.verify.mismatches),
            (64, 64, 0)
        );
        e.disk[8192 + 5 * 4096 + 999] ^= 1;
        let r = run_job(&mut e, &plan(Rw::Randread, 64, true), one_pass(), &shared);
        assert_eq!(r.verify.mismatches, 1);
        let (job, off, m) = &r.verify.first[0];
        assert_eq!((*job, *off), (0, 8192 + 5 * 4096));
        assert!(
            matches!(
                m,
                Mismatch::Crc {
                    first_bad: Some(999),
                    ..
                }
            ),
            "{m:?}"
        );
    }

    #[test]
    fn time_based_rewrites_detect_a_lost_write() {
        let mut e = MemEngine::new(8192 + 8 * 4096, 4, 4096);
        e.lose_rewrites_at = Some(8192 + 3 * 4096);
        let shared = Shared::default();
        let r = run_job(&mut e, &plan(Rw::Write, 8, true), timed(30), &shared);
        assert_eq!(r.error, None);
        assert!(
            r.write.ios > 8,
            "wrapped around the region: {}",
            r.write.ios
        );
        assert_eq!(r.verify.checked, 8);
        assert_eq!(r.verify.mismatches, 1, "{:?}", r.verify.first);
        let (_, off, m) = &r.verify.first[0];
        assert_eq!(*off, 8192 + 3 * 4096);
        assert!(
            // Sequential: the first write of block 3 was the job's 4th.
            matches!(m, Mismatch::Stale { expected, found: 4 } if *expected > 4),
            "{m:?}"
        );
    }

    #[test]
    fn mixed_verify_checks_only_blocks_this_run_wrote() {
        // The disk starts as zeroes: reads of unwritten blocks are not errors in a mixed run,
        // reads of written ones are checked against the latest generation.
        let mut e = MemEngine::new(8192 + 32 * 4096, 8, 4096);
        let shared = Shared::default();
        let r = run_job(&mut e, &plan(Rw::Randrw, 32, true), timed(30), &shared);
        assert_eq!(r.error, None);
        assert!(r.read.ios > 0 && r.write.ios > 0);
        assert_eq!(r.verify.mismatches, 0, "{:?}", r.verify.first);
        assert!(r.verify.checked > 0);
        let ratio = r.read.ios as f64 / (r.read.ios + r.write.ios) as f64;
        assert!((0.35..0.65).contains(&ratio), "rwmixread 50: {ratio}");
    }

    /// `rate_iops`: evenly spaced submissions, at any depth, the job sleeping in between.
    #[test]
    fn a_rate_caps_a_job_at_any_depth() {
        for depth in [1, 8] {
            let mut e = MemEngine::new(8192 + 64 * 4096, depth, 4096);
            let shared = Shared::default();
            let p = JobPlan {
                interval: Some(Duration::from_millis(2)),
                ..plan(Rw::Randread, 64, false)
            };
            let t0 = std::time::Instant::now();
            let r = run_job(&mut e, &p, timed(200), &shared);
            assert_eq!(r.error, None);
            // 200 ms at one I/O per 2 ms: about 100 (a loaded machine may run late).
            assert!(
                (60..=101).contains(&r.read.ios),
                "depth {depth}: {} I/Os",
                r.read.ios
            );
            assert!(t0.elapsed() < Duration::from_millis(400));
        }
        assert_eq!(human_rate(10_000), "10k/s");
        assert_eq!(human_rate(1_500_000), "1.5M/s");
        assert_eq!(human_rate(500), "500/s");
    }

    #[test]
    fn an_io_error_stops_the_job_and_names_the_offset() {
        let mut e = MemEngine::new(8192 + 16 * 4096, 4, 4096);
        e.fail_at = Some(8192 + 9 * 4096);
        let shared = Shared::default();
        let r = run_job(&mut e, &plan(Rw::Read, 16, false), one_pass(), &shared);
        let err = r.error.expect("an error");
        assert!(
            err.starts_with("read of offset 45056 (0xb000) failed:"),
            "{err}"
        );
        assert!(err.contains("Unrecovered Read Error"), "{err}");
        assert!(
            shared.abort.load(Ordering::Relaxed),
            "the other jobs are told to stop"
        );
        assert!(r.read.ios < 16);
        assert_eq!(e.in_flight(), 0, "drained before returning");
    }

    fn wl(args: &[&str]) -> Workload {
        let mut v = vec!["nvmf-bench"];
        v.extend_from_slice(args);
        Workload::from_args(&Args::try_parse_from(v).unwrap()).unwrap()
    }

    #[test]
    fn regions_follow_fio() {
        let mib = 1 << 20;
        let w = wl(&["--bs=4k"]);
        assert_eq!(
            w.regions(64 * mib, 512).unwrap(),
            vec![Region {
                start: 0,
                len: 64 * mib
            }]
        );
        let w = wl(&["--bs=4k", "--offset=1m"]);
        assert_eq!(w.regions(64 * mib, 512).unwrap()[0].len, 63 * mib);
        let w = wl(&[
            "--bs=4k",
            "--size=1m",
            "--numjobs=3",
            "--offset_increment=1m",
        ]);
        let r = w.regions(64 * mib, 512).unwrap();
        assert_eq!(
            r.iter().map(|r| r.start).collect::<Vec<_>>(),
            [0, mib, 2 * mib]
        );
        // Rounded down to whole bs blocks.
        let w = wl(&["--bs=4k", "--size=6k"]);
        assert_eq!(w.regions(64 * mib, 512).unwrap()[0].len, 4096);
        assert!(wl(&["--offset=1000"]).regions(64 * mib, 512).is_err());
        assert!(wl(&["--size=65m"]).regions(64 * mib, 512).is_err());
        assert!(wl(&["--offset=64m"]).regions(64 * mib, 512).is_err());
        assert!(wl(&["--bs=8k", "--size=4k"])
            .regions(64 * mib, 512)
            .is_err());
        // Verify refuses overlapping job regions.
        assert!(wl(&["--numjobs=2", "--verify=crc32c"])
            .regions(64 * mib, 512)
            .is_err());
        assert!(wl(&[
            "--numjobs=2",
            "--verify=crc32c",
            "--size=1m",
            "--offset_increment=1m"
        ])
        .regions(64 * mib, 512)
        .is_ok());
    }

    #[test]
    fn labels() {
        assert_eq!(wl(&["--bs=4k", "--iodepth=32"]).label(), "4k randread qd32");
        assert_eq!(
            wl(&["--bs=128k", "--rw=randrw", "--rwmixread=70", "--numjobs=2"]).label(),
            "128k randrw qd1 70%r x2"
        );
        assert_eq!(wl(&["--name=x"]).name, "x");
    }

    #[test]
    fn one_pass_offsets_cover_the_region_once() {
        for random in [false, true] {
            let mut o = Offsets::new(random, 100, false, 9);
            let mut seen: Vec<u64> = std::iter::from_fn(|| o.next()).collect();
            assert_eq!(seen.len(), 100);
            seen.sort();
            assert_eq!(seen, (0..100).collect::<Vec<_>>());
        }
        // Time based wraps, in a new order each pass.
        let mut o = Offsets::new(true, 50, true, 9);
        let a: Vec<u64> = (0..50).map(|_| o.next().unwrap()).collect();
        let b: Vec<u64> = (0..50).map(|_| o.next().unwrap()).collect();
        assert_ne!(a, b);
    }
}
