//! Faults over NVMe/TCP against the real `nvmf-target` binary (issue 8, items 3 and 6):
//! target SIGKILL + restart under a reconnecting host (`Namespace`, and
//! `ReconnectingQueue` at QD 32), a target that stays dead (the give-up bounds), NVMe status
//! errors (not retried), a host that stops sending keep-alives, a host killed mid-I/O, and a
//! network drop across a veth pair between two network namespaces. Where the daemon lives
//! on, its counters (`nvmf-target stats --json`: controllers, connections, registered
//! buffers in use) must return to idle.
//!
//! Every wait polls a condition against a deadline. Measured times are printed (run with
//! `--nocapture` to see them).

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use initiator::{ConnectOptions, Controller, Error, Namespace, ReconnectPolicy, ReconnectingQueue};
use nvme::fabrics::{self, reg, Cc, ConnectResult, PropSize};
use nvme::opcode::admin;
use nvme::{Sqe, Status};
use nvmf_tests::raw::RawHost;
use nvmf_tests::{default_yaml, target_bin, TargetProc, TempDir, TEST_NQN};

// ---- helpers -----------------------------------------------------------------------------

/// The counters the tests watch, summed over pollers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counters {
    controllers: u64,
    connections: u64,
    buffers_in_use: u64,
    commands: u64,
}

impl Counters {
    fn idle(&self) -> bool {
        self.controllers == 0 && self.connections == 0 && self.buffers_in_use == 0
    }
}

/// A target with its control socket in a directory of its own.
struct Daemon {
    t: TargetProc,
    ctl: PathBuf,
    _ctl_dir: TempDir,
}

impl Daemon {
    fn start(make: impl FnOnce(u16, &Path) -> String) -> Daemon {
        Self::start_wrapped(IpAddr::from([127, 0, 0, 1]), &[], make)
    }

    fn start_wrapped(
        ip: IpAddr,
        prefix: &[OsString],
        make: impl FnOnce(u16, &Path) -> String,
    ) -> Daemon {
        let d = TempDir::new("ctl");
        let ctl = d.0.join("control.sock");
        let t = TargetProc::start_wrapped(
            ip,
            prefix,
            make,
            &[],
            &["--control-socket".into(), ctl.clone().into()],
        );
        Daemon {
            t,
            ctl,
            _ctl_dir: d,
        }
    }

    /// `nvmf-target stats --json`, parsed. `None` while the daemon does not answer (it is
    /// restarting).
    fn try_counters(&self) -> Option<Counters> {
        let out = Command::new(target_bin())
            .args(["stats", "--json", "--control-socket"])
            .arg(&self.ctl)
            .output()
            .expect("run nvmf-target stats");
        if !out.status.success() {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "stats --json: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        let pollers = v["pollers"].as_array().expect("pollers");
        let sum = |k: &str| pollers.iter().map(|p| p[k].as_u64().expect(k)).sum();
        // Connection counters are per transport within each poller.
        let sum_tcp = |k: &str| pollers.iter().map(|p| p["tcp"][k].as_u64().expect(k)).sum();
        Some(Counters {
            controllers: v["controllers"].as_u64().expect("controllers"),
            connections: sum_tcp("connections"),
            buffers_in_use: sum("buffers_in_use"),
            commands: sum_tcp("commands"),
        })
    }

    fn counters(&self) -> Counters {
        self.try_counters().unwrap_or_else(|| {
            panic!(
                "the daemon's control socket does not answer\n{}",
                self.log()
            )
        })
    }

    /// Poll the counters until `ok`; returns them and how long it took.
    fn wait_counters(
        &self,
        limit: Duration,
        what: &str,
        mut ok: impl FnMut(&Counters) -> bool,
    ) -> (Counters, Duration) {
        let t0 = Instant::now();
        let mut last = None;
        while t0.elapsed() < limit {
            if let Some(c) = self.try_counters() {
                if ok(&c) {
                    return (c, t0.elapsed());
                }
                last = Some(c);
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "{what}: not reached within {limit:?}; last counters {last:?}\n{}",
            self.log()
        );
    }

    /// Poll the counters until the daemon is idle ([`Counters::idle`]).
    fn wait_idle(&self, limit: Duration, what: &str) -> (Counters, Duration) {
        self.wait_counters(limit, what, Counters::idle)
    }

    /// The daemon holds exactly `controllers` controllers over `connections` connections.
    fn assert_connected(&self, controllers: u64, connections: u64) {
        let c = self.counters();
        assert_eq!(
            (c.controllers, c.connections),
            (controllers, connections),
            "{c:?}"
        );
    }

    /// Options to connect to the daemon's subsystem at its listening address.
    fn opts(&self) -> ConnectOptions {
        ConnectOptions::tcp(&self.t.addr.ip().to_string(), self.t.addr.port(), TEST_NQN)
    }

    fn log(&self) -> String {
        self.t.log_text()
    }
}

/// A backoff policy doubling from `initial_ms` up to `max_ms` between attempts.
fn policy(
    max_attempts: u32,
    max_total: Option<Duration>,
    initial_ms: u64,
    max_ms: u64,
) -> ReconnectPolicy {
    ReconnectPolicy {
        max_attempts,
        max_total,
        initial_delay: Duration::from_millis(initial_ms),
        max_delay: Duration::from_millis(max_ms),
        multiplier: 2.0,
    }
}

/// A block of test data, different for every seed.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xd1b5_4a32_d192_ed03;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        // splitmix64
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

/// Write + read-back-verify over a set of regions, each write with a new pattern; remembers
/// the last pattern acknowledged in each region for a final full check.
struct Verifier {
    len: usize,
    last: Vec<Option<u64>>,
    iterations: u64,
    mismatches: u64,
}

impl Verifier {
    fn new(regions: usize, len: usize) -> Verifier {
        Verifier {
            len,
            last: vec![None; regions],
            iterations: 0,
            mismatches: 0,
        }
    }

    fn step(&mut self, ns: &mut Namespace) -> Result<(), Error> {
        let i = self.iterations;
        let r = (i % self.last.len() as u64) as usize;
        let off = r as u64 * self.len as u64;
        let data = pattern(i, self.len);
        ns.write_at(&data, off)?;
        self.last[r] = Some(i);
        let mut back = vec![0u8; self.len];
        ns.read_at(&mut back, off)?;
        if back != data {
            self.mismatches += 1;
        }
        self.iterations += 1;
        Ok(())
    }

    /// Read every written region back: each must hold its last acknowledged pattern.
    fn check_all(&self, ns: &mut Namespace) -> u64 {
        let mut bad = 0;
        let mut back = vec![0u8; self.len];
        for (r, seed) in self.last.iter().enumerate() {
            let Some(seed) = *seed else { continue };
            ns.read_at(&mut back, r as u64 * self.len as u64)
                .unwrap_or_else(|e| panic!("final read of region {r}: {e}"));
            if back != pattern(seed, self.len) {
                bad += 1;
            }
        }
        bad
    }
}

/// Poll `cond` until true or `limit`; panics with `what` on timeout.
fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        thread::sleep(Duration::from_millis(10));
    }
    t0.elapsed()
}

// ---- (a) target SIGKILL + restart ----------------------------------------------------------

/// The target is SIGKILLed in the middle of a write + read-back-verify loop and started
/// again on the same port and files: the loop goes on through a reconnect, with no
/// mismatch, and every region holds its last acknowledged data at the end.
#[test]
fn reconnects_across_target_sigkill_and_restart() {
    const DOWNTIME: Duration = Duration::from_secs(2);
    let mut d = Daemon::start(default_yaml);
    let mut opts = d.opts();
    opts.timeout = Duration::from_secs(10);
    let policy = policy(200, Some(Duration::from_secs(30)), 20, 500);
    let mut ns = Namespace::connect(opts, 1, policy).unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let first_cntlid = ns.controller_info().unwrap().cntlid;

    let progress = Arc::new(AtomicU64::new(0));
    let p = progress.clone();
    d.assert_connected(1, 2);
    let killer = thread::spawn(move || {
        wait_until(Duration::from_secs(60), "100 verified iterations", || {
            p.load(Ordering::Relaxed) >= 100
        });
        let at = p.load(Ordering::Relaxed);
        let t0 = Instant::now();
        d.t.kill();
        // Down for a while, as a crashed daemon waiting for its service manager: a fault of
        // chosen length, long enough for the host's first attempts to be refused.
        thread::sleep(DOWNTIME);
        d.t.restart();
        (d, at, t0.elapsed())
    });

    let mut v = Verifier::new(64, 64 << 10);
    let t0 = Instant::now();
    let mut after = 0u64;
    while !(killer.is_finished() && after >= 200) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "loop did not finish"
        );
        v.step(&mut ns)
            .unwrap_or_else(|e| panic!("verify loop: {e}"));
        progress.store(v.iterations, Ordering::Relaxed);
        if ns.stats().reconnects > 0 {
            after += 1;
        }
    }
    let (d, killed_at, restart) = killer.join().unwrap();
    let s = ns.stats();
    let stale = v.check_all(&mut ns);
    println!(
        "target SIGKILLed after {killed_at} iterations, listening again {restart:?} later; \
         loop: {} iterations, {} mismatches; {} stale regions; reconnect stats {s:?}; \
         cntlid {first_cntlid} -> {}",
        v.iterations,
        v.mismatches,
        stale,
        ns.controller_info().unwrap().cntlid
    );
    assert_eq!(v.mismatches, 0);
    assert_eq!(stale, 0, "regions lost their last acknowledged write");
    assert!(s.reconnects >= 1, "{s:?}");
    assert!(s.retries >= 1, "{s:?}");
    assert!(
        s.failed_attempts >= 1,
        "no attempt met the dead target: {s:?}"
    );
    assert!(
        s.last_outage
            .is_some_and(|o| o < DOWNTIME + Duration::from_secs(10)),
        "{s:?}"
    );
    assert_eq!(s.gave_up, 0, "{s:?}");

    // The restarted daemon holds exactly our new controller, and frees it at shutdown.
    d.assert_connected(1, 2);
    ns.shutdown().unwrap();
    let (c, _) = d.wait_idle(Duration::from_secs(10), "idle after shutdown");
    println!("after shutdown: {c:?}");
}

/// The asynchronous queue at QD 32: writes are in flight when the target is SIGKILLed and
/// restarted. `ReconnectingQueue` submits the commands the failure took down again; every
/// write completes exactly once, successfully, and every block reads back its last
/// acknowledged data.
#[test]
fn async_queue_resubmits_in_flight_commands_across_restart() {
    const QD: usize = 32;
    const BLOCKS: u64 = 4096;
    let mut d = Daemon::start(default_yaml);
    let mut opts = d.opts();
    opts.timeout = Duration::from_secs(10);
    opts.queue_depth = QD as u16;
    let policy = policy(200, Some(Duration::from_secs(30)), 20, 500);
    let mut q =
        ReconnectingQueue::connect(opts, 1, policy).unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    assert_eq!(q.depth(), QD);
    let ns = *q.info();
    let bs = ns.block_size as usize;
    assert!(ns.blocks >= BLOCKS);

    let progress = Arc::new(AtomicU64::new(0));
    let p = progress.clone();
    let killer = thread::spawn(move || {
        wait_until(Duration::from_secs(60), "2000 completed writes", || {
            p.load(Ordering::Relaxed) >= 2000
        });
        d.t.kill_and_restart();
        d
    });

    let mut submitted = 0u64;
    let mut completions = vec![0u8; 0];
    let mut last: Vec<Option<u64>> = vec![None; BLOCKS as usize];
    let mut busy = vec![false; BLOCKS as usize];
    let mut done = Vec::new();
    let mut at_reconnect: Option<u64> = None;
    let t0 = Instant::now();
    loop {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "loop did not finish"
        );
        let finishing = killer.is_finished()
            && at_reconnect.is_some_and(|at| progress.load(Ordering::Relaxed) >= at + 2000);
        if finishing && q.in_flight() == 0 {
            break;
        }
        while !finishing && q.in_flight() < QD {
            let blk = submitted % BLOCKS;
            assert!(
                !busy[blk as usize],
                "block {blk} still in flight after {BLOCKS} writes"
            );
            busy[blk as usize] = true;
            q.submit_write(&ns, blk, pattern(submitted, bs), submitted)
                .unwrap_or_else(|e| panic!("submit: {e}"));
            submitted += 1;
            completions.push(0);
        }
        done.clear();
        q.reap(&mut done, 1, None)
            .unwrap_or_else(|e| panic!("reap: {e}"));
        for c in &done {
            c.result
                .unwrap_or_else(|e| panic!("write {} failed: {e}", c.user_data));
            completions[c.user_data as usize] += 1;
            let blk = (c.user_data % BLOCKS) as usize;
            busy[blk] = false;
            last[blk] = Some(c.user_data);
            progress.fetch_add(1, Ordering::Relaxed);
        }
        if at_reconnect.is_none() && q.stats().reconnects > 0 {
            at_reconnect = Some(progress.load(Ordering::Relaxed));
        }
    }
    let d = killer.join().unwrap();
    let s = q.stats();
    let twice = completions.iter().filter(|&&n| n != 1).count();
    assert_eq!(twice, 0, "writes not completed exactly once");

    // Read every written block back at QD 32.
    let mut stale = 0;
    let mut next = 0u64;
    while next < BLOCKS || q.in_flight() > 0 {
        while next < BLOCKS && q.in_flight() < QD {
            q.submit_read(&ns, next, vec![0u8; bs], next)
                .unwrap_or_else(|e| panic!("submit read: {e}"));
            next += 1;
        }
        done.clear();
        q.reap(&mut done, 1, None).unwrap();
        for c in done.drain(..) {
            c.result.unwrap();
            if let Some(seed) = last[c.user_data as usize] {
                if c.buf.as_deref() != Some(&pattern(seed, bs)[..]) {
                    stale += 1;
                }
            }
        }
    }
    println!(
        "QD {QD}: {submitted} writes, each completed once; reconnect stats {s:?}; \
         {stale} stale blocks of {BLOCKS}"
    );
    assert_eq!(stale, 0);
    assert!(s.reconnects >= 1, "{s:?}");
    assert!(
        s.retries >= 1,
        "no in-flight command was submitted again: {s:?}"
    );
    q.shutdown().unwrap();
    d.wait_idle(Duration::from_secs(10), "idle after shutdown");
}

// ---- (b) target stays dead -----------------------------------------------------------------

/// Killed and not restarted: the call fails with `ReconnectGaveUp` after the policy's
/// attempts (or its total time), never hanging.
#[test]
fn gives_up_when_the_target_stays_dead() {
    let mut d = Daemon::start(default_yaml);
    let mut opts = d.opts();
    opts.timeout = Duration::from_secs(5);
    let by_count = policy(5, Some(Duration::from_secs(30)), 50, 400);
    // 50 + 100 + 200 + 400 + 400 ms of backoff.
    let backoff: Duration = (1..=5).map(|a| by_count.delay(a)).sum();
    assert_eq!(backoff, Duration::from_millis(1150));
    let mut ns = Namespace::connect(opts, 1, by_count).unwrap();
    let data = pattern(1, 4096);
    ns.write_at(&data, 0).unwrap();
    d.t.kill();

    let t0 = Instant::now();
    let err = ns.write_at(&data, 0).expect_err("the target is dead");
    let took = t0.elapsed();
    println!("gave up (attempt limit) after {took:?}: {err}");
    match &err {
        Error::ReconnectGaveUp {
            attempts, cause, ..
        } => {
            assert_eq!(*attempts, 5);
            // Nothing listens: the last attempt was refused.
            assert!(
                matches!(&**cause, Error::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused),
                "{cause:?}"
            );
        }
        other => panic!("expected ReconnectGaveUp, got {other:?}"),
    }
    assert!(took >= backoff, "{took:?}");
    assert!(took < backoff + Duration::from_secs(3), "{took:?}");
    assert!(!ns.is_connected());

    // Bounded by time instead: as many attempts as fit in 1.5 s.
    let max_total = Duration::from_millis(1500);
    ns.set_policy(policy(u32::MAX, Some(max_total), 50, 200));
    let t0 = Instant::now();
    let mut back = vec![0u8; 4096];
    let err = ns.read_at(&mut back, 0).expect_err("still dead");
    let took = t0.elapsed();
    println!("gave up (time limit {max_total:?}) after {took:?}: {err}");
    let Error::ReconnectGaveUp {
        attempts, elapsed, ..
    } = err
    else {
        panic!("expected ReconnectGaveUp, got {err:?}");
    };
    assert!(attempts > 5, "{attempts} attempts in {elapsed:?}");
    assert!(
        took >= max_total && took < max_total + Duration::from_secs(2),
        "{took:?}"
    );
    let s = ns.stats();
    assert_eq!((s.gave_up, s.reconnects), (2, 0), "{s:?}");
    assert_eq!(s.failed_attempts, 5 + attempts as u64, "{s:?}");
}

/// The asynchronous queue against a target that stays dead: the policy gives up, and every
/// command in flight comes back failed, with its buffer.
#[test]
fn async_queue_gives_up_and_returns_every_command() {
    let mut d = Daemon::start(default_yaml);
    let opts = d.opts();
    let policy = policy(3, None, 50, 100);
    let mut q = ReconnectingQueue::connect(opts, 1, policy).unwrap();
    let ns = *q.info();
    let bs = ns.block_size as usize;
    d.t.kill();
    for i in 0..8u64 {
        q.submit_write(&ns, i, pattern(i, bs), i)
            .unwrap_or_else(|e| panic!("submit: {e}"));
    }
    let t0 = Instant::now();
    let mut done = Vec::new();
    let mut err = None;
    while q.in_flight() > 0 && err.is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no give-up");
        if let Err(e) = q.reap(&mut done, 8, None) {
            err = Some(e);
        }
    }
    let took = t0.elapsed();
    println!("async give-up after {took:?}: {err:?}");
    assert!(
        matches!(err, Some(Error::ReconnectGaveUp { attempts: 3, .. })),
        "{err:?}"
    );
    assert_eq!(q.in_flight(), 0);
    assert_eq!(done.len(), 8);
    assert!(done
        .iter()
        .all(|c| c.result.is_err() && c.buf.as_ref().is_some_and(|b| b.len() == bs)));
    let mut ids: Vec<u64> = done.iter().map(|c| c.user_data).collect();
    ids.sort();
    assert_eq!(ids, (0..8).collect::<Vec<u64>>());
}

/// The target comes back on the same address with a different namespace (another size):
/// the reconnect is refused at once instead of retrying writes on the wrong device.
#[test]
fn reconnect_refuses_a_different_device() {
    let mut d = Daemon::start(default_yaml);
    let opts = d.opts();
    let policy = policy(50, Some(Duration::from_secs(30)), 20, 200);
    let mut ns = Namespace::connect(opts, 1, policy).unwrap();
    let data = pattern(3, 4096);
    ns.write_at(&data, 0).unwrap();
    // Same port and subsystem, but namespace 1 is now another, smaller file.
    let cfg = d.t.dir.0.join("config.yaml");
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    let other = yaml.replace("ns1.img, size: 64MiB", "other.img, size: 32MiB");
    assert_ne!(yaml, other);
    std::fs::write(&cfg, other).unwrap();
    d.t.kill_and_restart();
    let t0 = Instant::now();
    let err = ns.write_at(&data, 0).expect_err("a different device");
    println!("after {:?}: {err}", t0.elapsed());
    match &err {
        Error::ReconnectGaveUp { cause, .. } => assert!(
            matches!(&**cause, Error::Controller(m) if m.contains("another device")),
            "{cause:?}"
        ),
        other => panic!("expected ReconnectGaveUp, got {other:?}"),
    }
    let s = ns.stats();
    assert_eq!((s.reconnects, s.gave_up), (0, 1), "{s:?}");
    // The stranger was shut down cleanly: nothing left on the target.
    d.wait_idle(Duration::from_secs(10), "idle");
}

/// An NVMe status (here: a write to a read-only namespace) is the controller's answer, not a
/// connection failure: it returns at once, with no reconnect.
#[test]
fn status_errors_are_not_retried() {
    let d = Daemon::start(|port, dir| {
        // A read-only namespace's file must exist (the target does not create it).
        let f = std::fs::File::create(dir.join("ns1.img")).unwrap();
        f.set_len(16 << 20).unwrap();
        format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
             subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    namespaces:\n      \
             - {{ nsid: 1, path: {}/ns1.img, size: 16MiB, read_only: true }}\n",
            dir.display()
        )
    });
    let opts = d.opts();
    let mut ns = Namespace::connect(opts, 1, ReconnectPolicy::default()).unwrap();
    let t0 = Instant::now();
    let err = ns.write_at(&pattern(2, 4096), 0).expect_err("read-only");
    let took = t0.elapsed();
    let st = err
        .status()
        .unwrap_or_else(|| panic!("an NVMe status: {err:?}"));
    assert_eq!(st.code(), Status::NS_WRITE_PROTECTED.code(), "{err}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let s = ns.stats();
    assert_eq!(
        (s.reconnects, s.retries, s.failed_attempts),
        (0, 0, 0),
        "{s:?}"
    );
    // The connection is still the first one and still works.
    assert!(ns.is_connected());
    let mut back = vec![0u8; 4096];
    ns.read_at(&mut back, 0).unwrap();
    // A local error (unaligned) does not touch the connection either.
    assert!(matches!(
        ns.read_at(&mut back[..100], 0),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(ns.stats().retries, 0);
}

// ---- (c) keep-alive timeout ------------------------------------------------------------------

/// A host connects with KATO 2 s (admin and one I/O queue, raw NVMe/TCP), then sends nothing
/// while keeping both connections open: the target tears the controller down after KATO,
/// closes both connections and returns every buffer.
#[test]
fn silent_host_is_torn_down_after_kato() {
    const KATO_MS: u32 = 2000;
    let d = Daemon::start(default_yaml);
    let (mut adm, _) = RawHost::connect(d.t.addr);
    let cqe = adm.fabrics_connect_kato(TEST_NQN, 0, 31, 0xffff, KATO_MS);
    assert!(
        cqe.status().is_success(),
        "admin Connect: {:?}",
        cqe.status()
    );
    let cntlid = match ConnectResult::decode(cqe.result.get(), false) {
        ConnectResult::Success { cntlid, .. } => cntlid,
        other => panic!("{other:?}"),
    };
    let ok = |h: &mut RawHost, sqe: Sqe, what: &str| -> u64 {
        let (cqe, _) = h.command(&sqe, &[]);
        assert!(cqe.status().is_success(), "{what}: {:?}", cqe.status());
        cqe.result.get()
    };
    // CC.EN with 64-byte SQEs and 16-byte CQEs, then CSTS.RDY.
    let cc = Cc::new(true, 0, 0, 0, 0, 6, 4);
    ok(
        &mut adm,
        fabrics::property_set_sqe(1, reg::CC, cc.0 as u64, PropSize::Four),
        "Property Set CC",
    );
    wait_until(Duration::from_secs(5), "CSTS.RDY", || {
        ok(
            &mut adm,
            fabrics::property_get_sqe(2, reg::CSTS, PropSize::Four),
            "Property Get CSTS",
        ) & 1
            == 1
    });
    let mut sf = Sqe::new(admin::SET_FEATURES, 3);
    sf.cdw10 = (nvme::identify::feat::NUM_QUEUES as u32).into();
    sf.cdw11 = 0.into();
    // The last admin command: the keep-alive timer runs from here (give or take the
    // target's KATO/16 stamp granularity).
    let last_admin = Instant::now();
    ok(&mut adm, sf, "Set Features (Number of Queues)");
    let (mut io, _) = RawHost::connect(d.t.addr);
    let cqe = io.fabrics_connect_kato(TEST_NQN, 1, 31, cntlid, 0);
    assert!(cqe.status().is_success(), "I/O Connect: {:?}", cqe.status());

    let (c, _) = d.wait_counters(Duration::from_secs(5), "host connected", |c| {
        c.controllers == 1 && c.connections == 2
    });
    assert!(
        last_admin.elapsed() < Duration::from_millis(KATO_MS as u64),
        "too slow to see the controller alive: {c:?}"
    );
    let (after, _) = d.wait_idle(
        Duration::from_millis(KATO_MS as u64 + 5000),
        "controller torn down after KATO",
    );
    let gone = last_admin.elapsed();
    println!(
        "KATO {KATO_MS} ms: counters {c:?} -> {after:?} {gone:?} after the last admin command"
    );
    assert!(
        gone >= Duration::from_millis(KATO_MS as u64 * 15 / 16 - 50),
        "torn down before KATO: {gone:?}"
    );
    // Both connections were closed by the target.
    assert!(adm.recv().is_none(), "admin connection still open");
    assert!(io.recv().is_none(), "I/O connection still open");
    assert!(d.log().contains("keep-alive timer expired"), "{}", d.log());
}

// ---- (d) host killed mid-I/O -----------------------------------------------------------------

/// `nvmf-bench` (randwrite, QD 32, two jobs) is SIGKILLed while its commands are moving: the
/// target frees the controller, its connections and buffers, and a second host then does
/// verified I/O.
#[test]
fn host_killed_mid_io_frees_everything() {
    let d = Daemon::start(default_yaml);
    let log = d.t.dir.0.join("bench.log");
    let mut bench =
        d.t.bench_command()
            .args([
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=32",
                "--numjobs=2",
                "--size=16m",
                "--time_based",
                "--runtime=120",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn nvmf-bench");
    // Commands moving: the host connected and the count going up between two samples.
    let mut prev: Option<u64> = None;
    let (busy, _) = d.wait_counters(Duration::from_secs(30), "bench I/O moving", |c| {
        let moving = c.controllers >= 1 && prev.is_some_and(|p| c.commands >= p + 1000);
        prev = Some(c.commands);
        moving
    });
    bench.kill().unwrap();
    let st = bench.wait().unwrap();
    let t_kill = Instant::now();
    assert!(
        !st.success(),
        "bench must have been killed, not finished: {st}"
    );
    let (after, took) = d.wait_idle(Duration::from_secs(10), "idle after the host died");
    println!(
        "host SIGKILLed with counters {busy:?}; idle {:?} later: {after:?}",
        t_kill.elapsed().min(took)
    );

    // A second host does verified I/O.
    let o = d.opts();
    let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let mut ns = ctrl.open_namespace(1).unwrap();
    for k in 0..16u64 {
        let data = pattern(100 + k, 128 << 10);
        ns.write_at(&data, k << 20).unwrap();
        let mut back = vec![0u8; data.len()];
        ns.read_at(&mut back, k << 20).unwrap();
        assert!(back == data, "mismatch at {k} MiB");
    }
    drop(ns);
    ctrl.shutdown().unwrap();
    d.wait_idle(Duration::from_secs(10), "idle after the second host");
}

// ---- (e) network drop ------------------------------------------------------------------------

/// A network namespace with a veth pair to the test's namespace: `host_if` (here, `.1`) and
/// the peer inside the namespace (`.2`). Deleted on drop (which deletes the pair too).
struct NetNs {
    name: String,
    host_if: String,
    host_ip: IpAddr,
    ns_ip: IpAddr,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NetNs {
    /// Set up, or say why not (not root, no `ip`, no netns support).
    fn create() -> Result<NetNs, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root to create a network namespace".into());
        }
        let id = std::process::id();
        let sub = (id % 250 + 1) as u8;
        let n = NetNs {
            name: format!("nvmf-faults-{id}"),
            host_if: format!("nvf{id}h"),
            host_ip: IpAddr::from([10, 213, sub, 1]),
            ns_ip: IpAddr::from([10, 213, sub, 2]),
        };
        ip(&["netns", "add", &n.name])?;
        // From here on, Drop cleans up.
        let peer = format!("nvf{id}t");
        let host_cidr = format!("{}/24", n.host_ip);
        let ns_cidr = format!("{}/24", n.ns_ip);
        ip(&[
            "link", "add", &n.host_if, "type", "veth", "peer", "name", &peer,
        ])?;
        ip(&["link", "set", &peer, "netns", &n.name])?;
        ip(&["addr", "add", &host_cidr, "dev", &n.host_if])?;
        ip(&["link", "set", &n.host_if, "up"])?;
        let inside = |args: &[&str]| {
            let mut a = vec!["netns", "exec", &n.name, "ip"];
            a.extend_from_slice(args);
            ip(&a)
        };
        inside(&["addr", "add", &ns_cidr, "dev", &peer])?;
        inside(&["link", "set", &peer, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        Ok(n)
    }

    fn set_link(&self, up: bool) {
        ip(&["link", "set", &self.host_if, if up { "up" } else { "down" }]).unwrap();
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// The target runs in its own network namespace behind a veth pair; the link goes down in the
/// middle of a reconnecting host's write + read-back-verify loop. A plain host's read fails
/// after its I/O timeout (no hang); the reconnecting host's command times out and it keeps
/// trying to reconnect; the target, hearing nothing, tears both controllers down after KATO
/// and frees their connections and buffers. The link comes back after 5 s: the
/// host reconnects, retries the failed command, and the loop ends with no mismatch.
#[test]
fn network_drop_between_namespaces() {
    let net = match NetNs::create() {
        Ok(n) => n,
        Err(why) => {
            println!("SKIP: network_drop_between_namespaces: {why}");
            return;
        }
    };
    let prefix: Vec<OsString> = ["ip", "netns", "exec", &net.name]
        .iter()
        .map(OsString::from)
        .collect();
    let ns_ip = net.ns_ip;
    let d = Daemon::start_wrapped(ns_ip, &prefix, |port, dir| {
        default_yaml(port, dir).replace("address: 127.0.0.1", &format!("address: {ns_ip}"))
    });
    const KATO: Duration = Duration::from_secs(2);
    const OUTAGE: Duration = Duration::from_secs(5);
    let mut opts = d.opts();
    opts.kato = KATO;
    opts.timeout = Duration::from_secs(2);
    let policy = policy(1000, Some(Duration::from_secs(60)), 100, 500);
    let mut ns = Namespace::connect(opts, 1, policy).unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    // A plain (not reconnecting) host across the same link: its I/O must fail, not hang.
    let mut plain_opts = d.opts();
    plain_opts.kato = KATO;
    plain_opts.timeout = Duration::from_secs(2);
    let io_timeout = plain_opts.timeout;
    let mut plain = Controller::connect(plain_opts).unwrap();
    let mut plain_ns = plain.open_namespace(1).unwrap();
    d.assert_connected(2, 4);
    println!("host {} -> target {ns_ip} in {}", net.host_ip, net.name);

    let progress = Arc::new(AtomicU64::new(0));
    let reconnects = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let (progress, reconnects, stop) = (progress.clone(), reconnects.clone(), stop.clone());
        thread::spawn(move || {
            let mut v = Verifier::new(32, 64 << 10);
            while !stop.load(Ordering::Relaxed) {
                v.step(&mut ns)
                    .unwrap_or_else(|e| panic!("verify loop: {e}"));
                progress.store(v.iterations, Ordering::Relaxed);
                reconnects.store(ns.stats().reconnects, Ordering::Relaxed);
            }
            let stale = v.check_all(&mut ns);
            (ns, v.iterations, v.mismatches, stale)
        })
    };
    wait_until(Duration::from_secs(60), "50 verified iterations", || {
        progress.load(Ordering::Relaxed) >= 50
    });
    net.set_link(false);
    let t_down = Instant::now();
    let at_down = progress.load(Ordering::Relaxed);
    // The plain host's read fails once its command times out.
    let mut buf = vec![0u8; 4096];
    let t0 = Instant::now();
    let err = plain_ns
        .read_at(&mut buf, 0)
        .expect_err("a read across a down link");
    let failed_in = t0.elapsed();
    println!("plain host: read failed after {failed_in:?}: {err}");
    assert!(
        failed_in >= io_timeout && failed_in < io_timeout + Duration::from_secs(2),
        "{failed_in:?}"
    );
    assert!(
        matches!(&err, Error::QueueFailed { cause, .. } if matches!(**cause, Error::Timeout(..))),
        "{err:?}"
    );
    drop(plain_ns);
    let t0 = Instant::now();
    drop(plain);
    println!("plain host: controller dropped in {:?}", t0.elapsed());
    // The target hears nothing: its keep-alive timer frees both controllers.
    let (freed, _) = d.wait_idle(
        KATO + Duration::from_secs(8),
        "controllers freed after KATO while the link is down",
    );
    let took = t_down.elapsed();
    let stalled = progress.load(Ordering::Relaxed);
    println!("link down after {at_down} iterations; target idle {took:?} later: {freed:?}");
    assert!(
        took >= KATO / 2,
        "freed before KATO could run out: {took:?}"
    );
    assert!(
        stalled <= at_down + 1,
        "I/O went on through a down link: {at_down} -> {stalled}"
    );
    assert!(d.log().contains("keep-alive timer expired"), "{}", d.log());

    // The outage is a fault of chosen length, not a synchronization: long enough for the
    // host's command to time out (2 s) and for at least one reconnect attempt to fail on the
    // down link before it comes back.
    thread::sleep(OUTAGE.saturating_sub(t_down.elapsed()));
    net.set_link(true);
    let t_up = Instant::now();
    let back = wait_until(Duration::from_secs(60), "reconnect after link up", || {
        reconnects.load(Ordering::Relaxed) >= 1
    });
    let at_up = progress.load(Ordering::Relaxed);
    wait_until(Duration::from_secs(60), "50 more iterations", || {
        progress.load(Ordering::Relaxed) >= at_up + 50
    });
    stop.store(true, Ordering::Relaxed);
    let (ns, iterations, mismatches, stale) = worker.join().unwrap();
    let s = ns.stats();
    println!(
        "link up {:?} after down; reconnected {back:?} after up; {iterations} iterations, \
         {mismatches} mismatches, {stale} stale regions; {s:?}",
        t_up - t_down
    );
    assert_eq!(mismatches, 0);
    assert_eq!(stale, 0);
    assert!(s.reconnects >= 1 && s.retries >= 1, "{s:?}");
    assert!(
        s.failed_attempts >= 1,
        "no attempt failed on the down link: {s:?}"
    );
    d.assert_connected(1, 2);
    ns.shutdown().unwrap();
    d.wait_idle(Duration::from_secs(10), "idle after shutdown");
}

// ---- (g) keep-alive while the I/O queues connect -----------------------------------------------

/// A TCP relay to `to`: the first connection (the admin queue) is relayed at once, every later
/// one (an I/O queue) only after `delay`, as a slow fabric would.
fn slow_relay(to: std::net::SocketAddr, delay: Duration) -> std::net::SocketAddr {
    use std::net::{Shutdown, TcpListener, TcpStream};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for (n, c) in l.incoming().enumerate() {
            let Ok(c) = c else { return };
            thread::spawn(move || {
                if n > 0 {
                    thread::sleep(delay);
                }
                let Ok(up) = TcpStream::connect(to) else {
                    return;
                };
                let pipe = |mut a: TcpStream, mut b: TcpStream| {
                    thread::spawn(move || {
                        let _ = std::io::copy(&mut a, &mut b);
                        let _ = b.shutdown(Shutdown::Write);
                    })
                };
                let t1 = pipe(c.try_clone().unwrap(), up.try_clone().unwrap());
                let t2 = pipe(up, c);
                let _ = (t1.join(), t2.join());
            });
        }
    });
    addr
}

/// Connecting the I/O queues takes longer than KATO (each waits 2.5 x KATO in a relay): the
/// host must already be sending Keep Alive on the admin queue, or the target tears the
/// controller down before the I/O queues' Connect (which then names a dead controller).
#[test]
fn keep_alive_runs_while_io_queues_connect() {
    const KATO: Duration = Duration::from_secs(2);
    let d = Daemon::start(default_yaml);
    let relay = slow_relay(d.t.addr, KATO * 5 / 2);
    let mut opts = ConnectOptions::tcp(&relay.ip().to_string(), relay.port(), TEST_NQN);
    opts.kato = KATO;
    opts.queues = 2;
    opts.timeout = Duration::from_secs(20);
    let t0 = Instant::now();
    let mut ctrl = Controller::connect(opts).unwrap_or_else(|e| {
        panic!(
            "connect through the slow relay failed after {:?}: {e}\n{}",
            t0.elapsed(),
            d.log()
        )
    });
    let took = t0.elapsed();
    println!("2 I/O queues connected in {took:?} with KATO {KATO:?}");
    assert!(
        took > KATO * 2,
        "the relay did not delay the I/O queues: {took:?}"
    );
    let mut ns = ctrl.open_namespace(1).unwrap();
    let data = pattern(7, 64 << 10);
    ns.write_at(&data, 0).unwrap();
    let mut back = vec![0u8; data.len()];
    ns.read_at(&mut back, 0).unwrap();
    assert!(back == data, "read back differs");
    drop(ns);
    ctrl.shutdown().unwrap();
    d.wait_idle(Duration::from_secs(10), "controller gone after shutdown");
}
