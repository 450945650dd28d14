//! Compare and Write checks shared by `tests/caw.rs` and the `caw_race` example: a block
//! format that shows a torn block, and the race of several hosts (each its own controller,
//! host NQN and host ID) doing compare-and-write on one block, round after round.
//!
//! A block is a header (magic, two values `a` and `b`, a checksum) and, in the rest, a byte
//! pattern derived from `(a, b)`: a block made of pieces of two writes fails the checksum or
//! the pattern. The race stores the round in `a` and its winner in `b`.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use initiator::{hostnqn_for, ConnectOptions, Controller, Namespace};

/// "CAWBLK01".
pub const MAGIC: u64 = u64::from_le_bytes(*b"CAWBLK01");
/// `b` of round 0, which no host won.
pub const NO_WINNER: u64 = u64::MAX;
/// Bytes of the header: magic, a, b, checksum.
const HEADER: usize = 32;

fn mix(mut x: u64) -> u64 {
    // splitmix64's finalizer.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The pattern word at word index `i` (from the block start) for `(a, b)`.
fn word(a: u64, b: u64, i: u64) -> u64 {
    mix(a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.rotate_left(32) ^ mix(i))
}

/// FNV-1a (64) over the block without its checksum field.
fn checksum(block: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &x in block[..24].iter().chain(&block[HEADER..]) {
        h = (h ^ x as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Fill `block` (a multiple of 8 bytes, at least 32) with the header and pattern of `(a, b)`.
pub fn stamp(block: &mut [u8], a: u64, b: u64) {
    assert!(block.len() >= HEADER && block.len() % 8 == 0);
    block[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    block[8..16].copy_from_slice(&a.to_le_bytes());
    block[16..24].copy_from_slice(&b.to_le_bytes());
    for (i, w) in block[HEADER..].chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(a, b, (HEADER / 8 + i) as u64).to_le_bytes());
    }
    let c = checksum(block);
    block[24..32].copy_from_slice(&c.to_le_bytes());
}

fn le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// `(a, b)` of a whole block written by [`stamp`]; `Err` says how it is torn (or foreign).
pub fn parse(block: &[u8]) -> Result<(u64, u64), String> {
    if block.len() < HEADER || block.len() % 8 != 0 {
        return Err(format!("a block of {} bytes", block.len()));
    }
    if le(&block[0..8]) != MAGIC {
        return Err(format!("bad magic {:#018x}", le(&block[0..8])));
    }
    let (a, b) = (le(&block[8..16]), le(&block[16..24]));
    let sum = checksum(block);
    if le(&block[24..32]) != sum {
        return Err(format!(
            "(a={a}, b={b:#x}): checksum {:#018x}, computed {sum:#018x}",
            le(&block[24..32])
        ));
    }
    for (i, w) in block[HEADER..].chunks_exact(8).enumerate() {
        let i = (HEADER / 8 + i) as u64;
        if le(w) != word(a, b, i) {
            return Err(format!(
                "(a={a}, b={b:#x}): pattern differs at byte {}",
                8 * i
            ));
        }
    }
    Ok((a, b))
}

/// What the race does.
#[derive(Debug, Clone)]
pub struct RaceOptions {
    /// Hosts, each with its own connection, host NQN and host ID.
    pub hosts: usize,
    /// Rounds to play: the race ends when the block holds round `rounds`.
    pub rounds: u64,
    pub nsid: u32,
    /// The block raced for.
    pub lba: u64,
}

impl Default for RaceOptions {
    fn default() -> RaceOptions {
        RaceOptions {
            hosts: 2,
            rounds: 10_000,
            nsid: 1,
            lba: 0,
        }
    }
}

/// How the race went.
#[derive(Debug, Clone, Default)]
pub struct RaceReport {
    pub hosts: usize,
    pub rounds: u64,
    /// Rounds won, per host.
    pub wins: Vec<u64>,
    /// Compare and Writes that found the block changed (Compare Failure).
    pub conflicts: u64,
    /// Compare and Writes sent (wins and conflicts).
    pub caws: u64,
    /// Reads sent.
    pub reads: u64,
    /// Time the hosts spent waiting for Compare and Writes, and for reads (all hosts).
    pub caw_time: Duration,
    pub read_time: Duration,
    /// Reads that found a torn block.
    pub torn: u64,
    pub elapsed: Duration,
    /// Everything that went wrong (empty: the race checks out).
    pub failures: Vec<String>,
}

impl RaceReport {
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }

    /// Prints the timing and summary lines, then asserts the race checks out: no failure,
    /// every round won exactly once, no torn read, a Compare and Write per win or conflict.
    /// `logs`: what to show when it does not (the targets' logs).
    #[track_caller]
    pub fn assert_clean(&self, o: &RaceOptions, logs: &str) {
        println!("{}", self.timing());
        println!("{}", self.summary());
        assert!(
            self.ok(),
            "{}\n{}\n{logs}",
            self.failures.join("\n"),
            self.summary()
        );
        assert_eq!(self.wins.iter().sum::<u64>(), o.rounds);
        assert_eq!(self.torn, 0);
        assert_eq!(self.caws, o.rounds + self.conflicts);
    }

    /// Compare and Writes per second.
    pub fn caw_per_sec(&self) -> f64 {
        self.caws as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// `caw rounds=N hosts=H wins=[a,b] conflicts=C torn=T ok` (`FAILED` when not ok).
    pub fn summary(&self) -> String {
        let wins: Vec<String> = self.wins.iter().map(u64::to_string).collect();
        format!(
            "caw rounds={} hosts={} wins=[{}] conflicts={} torn={} {}",
            self.rounds,
            self.hosts,
            wins.join(","),
            self.conflicts,
            self.torn,
            if self.ok() { "ok" } else { "FAILED" }
        )
    }

    /// `caw elapsed=1.234s caws=N caw/s=R caw_lat=U us reads=N read_lat=U us`.
    pub fn timing(&self) -> String {
        let avg = |t: Duration, n: u64| t.as_secs_f64() * 1e6 / n.max(1) as f64;
        format!(
            "caw elapsed={:.3}s caws={} caw/s={:.0} caw_lat={:.0}us reads={} read_lat={:.0}us",
            self.elapsed.as_secs_f64(),
            self.caws,
            self.caw_per_sec(),
            avg(self.caw_time, self.caws),
            self.reads,
            avg(self.read_time, self.reads)
        )
    }
}

/// One host's side of the race.
#[derive(Debug, Default)]
struct HostRun {
    /// Rounds won, in order.
    won: Vec<u64>,
    conflicts: u64,
    caws: u64,
    reads: u64,
    caw_time: Duration,
    read_time: Duration,
    torn: u64,
    /// Every (round, winner) read, once per change.
    seen: Vec<(u64, u64)>,
    failures: Vec<String>,
}

/// Torn reads after which a host gives up.
const TORN_LIMIT: u64 = 100;

/// What a host's last Compare and Write says about the block it reads next.
#[derive(Debug, Clone, Copy)]
enum Last {
    /// Won round `r`: the block holds round `r` with this host as winner, or a later round.
    Won(u64),
    /// Compare Failure against round `r`: the block had moved on, so it holds a later round.
    Lost(u64),
}

fn host_loop(me: usize, ns: &mut Namespace, o: &RaceOptions, start: &Barrier) -> HostRun {
    let bs = ns.block_size() as usize;
    let off = o.lba * bs as u64;
    let me_b = me as u64;
    let mut cur = vec![0u8; bs];
    let mut next = vec![0u8; bs];
    let mut run = HostRun::default();
    let mut last: Option<Last> = None;
    start.wait();
    loop {
        let t = Instant::now();
        let read = ns.read_at(&mut cur, off);
        run.read_time += t.elapsed();
        run.reads += 1;
        if let Err(e) = read {
            run.failures.push(format!("host {me}: read: {e}"));
            return run;
        }
        let (r, w) = match parse(&cur) {
            Ok(v) => v,
            Err(e) => {
                run.torn += 1;
                if run.torn <= 3 {
                    run.failures.push(format!("host {me}: torn read: {e}"));
                }
                if run.torn >= TORN_LIMIT {
                    run.failures
                        .push(format!("host {me}: gave up after {TORN_LIMIT} torn reads"));
                    return run;
                }
                continue;
            }
        };
        if run.seen.last() != Some(&(r, w)) {
            run.seen.push((r, w));
        }
        match last.take() {
            Some(Last::Won(x)) if r < x || (r == x && w != me_b) => {
                run.failures.push(format!(
                    "host {me}: won round {x}, then read round {r} won by {w:#x}"
                ));
                return run;
            }
            Some(Last::Lost(x)) if r <= x => {
                run.failures.push(format!(
                    "host {me}: Compare Failure against round {x}, then read round {r} won \
                     by {w:#x} (the block had not changed)"
                ));
                return run;
            }
            _ => {}
        }
        if r >= o.rounds {
            return run;
        }
        stamp(&mut next, r + 1, me_b);
        run.caws += 1;
        let t = Instant::now();
        let caw = ns.compare_and_write(&cur, &next, off);
        run.caw_time += t.elapsed();
        match caw {
            Ok(true) => {
                run.won.push(r + 1);
                last = Some(Last::Won(r + 1));
            }
            Ok(false) => {
                run.conflicts += 1;
                last = Some(Last::Lost(r));
            }
            Err(e) => {
                run.failures
                    .push(format!("host {me}: Compare and Write on round {r}: {e}"));
                return run;
            }
        }
    }
}

/// Run the race: connect `o.hosts` hosts to the target of `base` (each with a host ID and
/// host NQN of its own and one I/O queue), write round 0 (no winner) with a plain write,
/// then let every host, each on a thread of its own, loop: read the block, check it is
/// whole, stop at round `o.rounds`, else Compare and Write round r + 1 with itself as the
/// winner over the round r it read. At the end the block must hold round `o.rounds`, every
/// round 1..=rounds must have been won by exactly one host (and every read of a round must
/// name that host), no read may have been torn, and every host's view must follow from its
/// own results (after a win, that round or a later one; after a Compare Failure, a later
/// round). `Err` when the hosts could not connect or set up; the race's own problems are in
/// [`RaceReport::failures`].
pub fn race(base: &ConnectOptions, o: &RaceOptions) -> Result<RaceReport, String> {
    race_through(std::slice::from_ref(base), o)
}

/// [`race`] with host `i` connected through `targets[i % targets.len()]`: several targets
/// (gateways) in front of one shared store, each host racing through its own.
pub fn race_through(targets: &[ConnectOptions], o: &RaceOptions) -> Result<RaceReport, String> {
    if o.hosts == 0 || o.rounds == 0 || targets.is_empty() {
        return Err("no hosts, no rounds or no targets".into());
    }
    let mut hosts: Vec<(Controller, Namespace)> = Vec::with_capacity(o.hosts);
    for i in 0..o.hosts {
        let mut opts = targets[i % targets.len()].clone();
        opts.hostid = rand::random();
        opts.hostnqn = hostnqn_for(&opts.hostid);
        opts.queues = 1;
        let mut c = Controller::connect(opts).map_err(|e| format!("host {i}: connect: {e}"))?;
        let ns = c
            .open_namespace(o.nsid)
            .map_err(|e| format!("host {i}: namespace {}: {e}", o.nsid))?;
        hosts.push((c, ns));
    }
    let bs = hosts[0].1.block_size() as usize;
    let off = o
        .lba
        .checked_mul(bs as u64)
        .filter(|off| off + bs as u64 <= hosts[0].1.size())
        .ok_or_else(|| format!("LBA {} is beyond namespace {}", o.lba, o.nsid))?;
    let mut block = vec![0u8; bs];
    stamp(&mut block, 0, NO_WINNER);
    hosts[0]
        .1
        .write_at(&block, off)
        .map_err(|e| format!("host 0: writing round 0: {e}"))?;

    let start = Barrier::new(o.hosts + 1);
    let (runs, elapsed) = std::thread::scope(|s| {
        let handles: Vec<_> = hosts
            .iter_mut()
            .enumerate()
            .map(|(i, (_, ns))| {
                let start = &start;
                s.spawn(move || host_loop(i, ns, o, start))
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        let runs: Vec<HostRun> = handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.join().unwrap_or_else(|_| HostRun {
                    failures: vec![format!("host {i}: thread panicked")],
                    ..HostRun::default()
                })
            })
            .collect();
        (runs, t0.elapsed())
    });

    let mut rep = RaceReport {
        hosts: o.hosts,
        rounds: o.rounds,
        elapsed,
        ..RaceReport::default()
    };
    // owner[r]: the host that won round r.
    let mut owner: Vec<Option<usize>> = vec![None; o.rounds as usize + 1];
    for (i, run) in runs.iter().enumerate() {
        rep.wins.push(run.won.len() as u64);
        rep.conflicts += run.conflicts;
        rep.caws += run.caws;
        rep.reads += run.reads;
        rep.caw_time += run.caw_time;
        rep.read_time += run.read_time;
        rep.torn += run.torn;
        rep.failures.extend(run.failures.iter().cloned());
        for &r in &run.won {
            match owner.get_mut(r as usize) {
                None => rep
                    .failures
                    .push(format!("host {i} won round {r}, beyond {}", o.rounds)),
                Some(Some(j)) if r > 0 => rep
                    .failures
                    .push(format!("round {r} won by hosts {j} and {i}")),
                Some(slot) if r > 0 => *slot = Some(i),
                Some(_) => rep.failures.push(format!("host {i} won round 0")),
            }
        }
    }
    let missing: Vec<u64> = (1..=o.rounds)
        .filter(|&r| owner[r as usize].is_none())
        .collect();
    if !missing.is_empty() {
        rep.failures.push(format!(
            "{} rounds won by nobody (first {:?})",
            missing.len(),
            &missing[..missing.len().min(5)]
        ));
    }
    let mut wrong = 0u64;
    for (i, run) in runs.iter().enumerate() {
        for &(r, w) in &run.seen {
            let want = match r {
                0 => Some(NO_WINNER),
                r => owner.get(r as usize).copied().flatten().map(|h| h as u64),
            };
            if want != Some(w) {
                wrong += 1;
                if wrong <= 3 {
                    rep.failures.push(format!(
                        "host {i} read round {r} won by {w:#x}; the winner was {want:?}"
                    ));
                }
            }
        }
    }
    if wrong > 3 {
        rep.failures.push(format!(
            "{wrong} reads named another winner than the round's"
        ));
    }
    match hosts[0].1.read_at(&mut block, off) {
        Err(e) => rep.failures.push(format!("final read: {e}")),
        Ok(()) => match parse(&block) {
            Err(e) => rep.failures.push(format!("final block torn: {e}")),
            Ok((r, _)) if r != o.rounds => rep
                .failures
                .push(format!("final block holds round {r}, not {}", o.rounds)),
            Ok((r, w)) if owner[r as usize].map(|h| h as u64) != Some(w) => {
                rep.failures.push(format!(
                    "final block names winner {w:#x}, not {:?}",
                    owner[r as usize]
                ))
            }
            Ok(_) => {}
        },
    }
    for (i, (c, ns)) in hosts.into_iter().enumerate() {
        drop(ns);
        if let Err(e) = c.shutdown() {
            rep.failures.push(format!("host {i}: shutdown: {e}"));
        }
    }
    Ok(rep)
}
