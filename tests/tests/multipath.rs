//! Initiator multipath (issue #19 item 2): one namespace over several NVMe/TCP listeners of
//! the real `nvmf-target`, with ANA states per listener. `Namespace` sends I/O on
//! optimized paths, moves it when `nvmf-target ctl set-ana-state` changes the states (no call
//! fails), finds the paths through discovery, fails over when a path's connection is cut (a
//! TCP proxy in the test, which it cuts and restores) and reconnects the path, and fails with
//! the paths' states when none is usable.
//!
//! Every wait polls a condition against a deadline. Times are printed (`--nocapture`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use initiator::{
    AnaState, ConnectOptions, Error, MultipathOptions, Namespace, PathInfo, PathMonitor,
    PathPolicy, PathState, ReconnectPolicy, ReconnectingQueue,
};
use nvmf_tests::{free_port, target_bin, TargetProc, TempDir, TEST_NQN};

/// The tests pick extra listener ports with `free_port`: one at a time, so that a port one
/// picked is not bound by another's target in between.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A target with one listener per ANA state given (group 1; the file namespace is in it)
/// and a control socket.
struct Rig {
    _t: TargetProc,
    sock: PathBuf,
    ports: Vec<u16>,
    _dir: TempDir,
}

impl Rig {
    fn start(tag: &str, states: &[&str]) -> Rig {
        let dir = TempDir::new(tag);
        let sock = dir.0.join("control.sock");
        let extra: Vec<u16> = states[1..].iter().map(|_| free_port()).collect();
        let mut ports = Vec::new();
        let t = TargetProc::start_with_env(
            |port, d: &Path| {
                ports.push(port);
                ports.extend(&extra);
                let mut y = String::from("listeners:\n");
                for (p, s) in ports.iter().zip(states) {
                    y.push_str(&format!(
                        "  - {{ transport: tcp, address: 127.0.0.1, port: {p}, ana: {{ 1: {s} }} }}\n"
                    ));
                }
                y.push_str(&format!(
                    "subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    namespaces:\n      \
                     - {{ nsid: 1, path: {}/ns1.img, size: 16MiB }}\n\
                     target: {{ threads: 2, keep_alive_ms_min: 1000 }}\n",
                    d.display()
                ));
                y
            },
            &[],
            &["--control-socket".into(), sock.clone().into()],
        );
        // The control socket comes up after every listener.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            assert!(
                Instant::now() < deadline,
                "no control socket:\n{}",
                t.log_text()
            );
            thread::sleep(Duration::from_millis(20));
        }
        Rig {
            _t: t,
            sock,
            ports,
            _dir: dir,
        }
    }

    /// `nvmf-target ctl set-ana-state tcp 127.0.0.1 PORT 1 STATE`.
    fn set_ana(&self, port: u16, state: &str) {
        let o = Command::new(target_bin())
            .arg("ctl")
            .arg("--control-socket")
            .arg(&self.sock)
            .args(["set-ana-state", "tcp", "127.0.0.1"])
            .arg(port.to_string())
            .args(["1", state])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "ctl set-ana-state failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }

    fn path(&self, i: usize) -> ConnectOptions {
        tcp(self.ports[i])
    }
}

fn tcp(port: u16) -> ConnectOptions {
    let mut o = ConnectOptions::tcp("127.0.0.1", port, TEST_NQN);
    o.timeout = Duration::from_secs(5);
    o
}

/// Options for the tests: quick reconnects.
fn quick() -> MultipathOptions {
    MultipathOptions {
        reconnect: ReconnectPolicy {
            initial_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(200),
            ..ReconnectPolicy::forever()
        },
        ..MultipathOptions::default()
    }
}

fn states(paths: &[PathInfo]) -> Vec<Option<AnaState>> {
    paths.iter().map(|p| p.ana_state).collect()
}

fn commands(paths: &[PathInfo]) -> Vec<u64> {
    paths.iter().map(|p| p.commands).collect()
}

/// Wait (up to 20 s) until `cond` holds for the paths; returns them.
#[track_caller]
fn wait_paths(m: &PathMonitor, what: &str, cond: impl Fn(&[PathInfo]) -> bool) -> Vec<PathInfo> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let p = m.paths();
        if cond(&p) {
            return p;
        }
        assert!(Instant::now() < deadline, "{what}: paths stay {p:#?}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Wait until the writer has done `n` more verified rounds.
#[track_caller]
fn wait_rounds(w: &mut Writer, n: u64, m: &PathMonitor) {
    let start = w.rounds.load(Ordering::Relaxed);
    // Far above the tens of milliseconds this takes: a loaded machine is slow, not wrong.
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.rounds.load(Ordering::Relaxed) < start + n {
        if w.thread.as_ref().unwrap().is_finished() {
            match w.thread.take().unwrap().join().unwrap() {
                Err(e) => panic!("the writer failed: {e}"),
                Ok(_) => panic!("the writer stopped"),
            }
        }
        assert!(
            Instant::now() < deadline,
            "the writer made no progress: {} of {n} rounds, {:?}, {:#?}",
            w.rounds.load(Ordering::Relaxed) - start,
            m.stats(),
            m.paths()
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// A thread writing and reading back distinct 8 KiB blocks in a loop; any error or mismatch
/// ends it with the error.
struct Writer {
    rounds: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<Result<Namespace, String>>>,
}

impl Writer {
    fn start(mut ns: Namespace) -> Writer {
        let rounds = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (rounds.clone(), stop.clone());
        let thread = thread::spawn(move || {
            let mut back = vec![0u8; 8192];
            let mut i = 0u64;
            while !s.load(Ordering::Relaxed) {
                let data: Vec<u8> = (0..8192u64)
                    .map(|k| (k.wrapping_mul(31) ^ i.wrapping_mul(131)) as u8)
                    .collect();
                let off = (i % 512) * 8192;
                ns.write_at(&data, off)
                    .map_err(|e| format!("write {i}: {e}"))?;
                ns.read_at(&mut back, off)
                    .map_err(|e| format!("read {i}: {e}"))?;
                if back != data {
                    return Err(format!("round {i}: read back other data"));
                }
                i += 1;
                r.store(i, Ordering::Relaxed);
            }
            Ok(ns)
        });
        Writer {
            rounds,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Namespace {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().unwrap().join().unwrap() {
            Ok(ns) => ns,
            Err(e) => panic!("the writer failed: {e}"),
        }
    }
}

/// After the states settle, the next calls go only to path `to` (checked over `n` rounds).
#[track_caller]
fn io_goes_to(m: &PathMonitor, w: &mut Writer, to: usize, n: u64) {
    let before = commands(&m.paths());
    wait_rounds(w, n, m);
    let after = commands(&m.paths());
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if i == to {
            // Two calls a round (the snapshots may fall inside one).
            assert!(
                a - b >= 2 * n - 2,
                "path {i} took {} calls in {n} rounds",
                a - b
            );
        } else {
            // At most the call running while the states changed.
            assert!(
                a - b <= 1,
                "path {i} took {} calls, expected none: {after:?}",
                a - b
            );
        }
    }
}

#[test]
fn io_goes_to_the_optimized_path() {
    let _s = serial();
    let t0 = Instant::now();
    let rig = Rig::start("mp-select", &["optimized", "non-optimized", "optimized"]);
    let mut ns =
        Namespace::multipath(vec![rig.path(1), rig.path(0), rig.path(2)], 1, quick()).unwrap();
    let p = ns.paths();
    assert_eq!(
        states(&p),
        [
            Some(AnaState::NonOptimized),
            Some(AnaState::Optimized),
            Some(AnaState::Optimized)
        ]
    );
    assert!(p
        .iter()
        .all(|p| p.state == PathState::Connected && p.ana_group == 1));
    assert_eq!(
        p.iter().map(|p| p.port).collect::<Vec<_>>(),
        [rig.ports[1], rig.ports[0], rig.ports[2]]
    );
    let bs = ns.block_size() as usize;
    assert_eq!(ns.size(), 16 << 20);
    let data = vec![0x5au8; 4 * bs];
    let mut back = vec![0u8; 4 * bs];
    for i in 0..10u64 {
        ns.write_at(&data, i * 4 * bs as u64).unwrap();
        ns.read_at(&mut back, i * 4 * bs as u64).unwrap();
        assert_eq!(back, data);
    }
    ns.flush().unwrap();
    ns.write_zeroes(0, 4 * bs as u64).unwrap();
    ns.trim(&[(4 * bs as u64, 4 * bs as u64)]).unwrap();
    assert!(ns.compare_at(&data, 8 * bs as u64).unwrap());
    // First policy: the first optimized path in the order given takes everything.
    assert_eq!(commands(&ns.paths()), [0, 24, 0]);
    // Round robin: the optimized paths in turn, never the non-optimized one.
    let mut rr = Namespace::multipath(
        vec![rig.path(0), rig.path(1), rig.path(2)],
        1,
        MultipathOptions {
            policy: PathPolicy::RoundRobin,
            ..quick()
        },
    )
    .unwrap();
    for i in 0..10u64 {
        rr.read_at(&mut back, i * 4 * bs as u64).unwrap();
    }
    assert_eq!(commands(&rr.paths()), [5, 0, 5]);
    assert_eq!(rr.stats(), Default::default());
    rr.shutdown().unwrap();
    ns.shutdown().unwrap();
    println!("io_goes_to_the_optimized_path: {:?}", t0.elapsed());
}

#[test]
fn ana_changes_move_the_io_without_failing_it() {
    let _s = serial();
    let t0 = Instant::now();
    let rig = Rig::start("mp-ana", &["optimized", "non-optimized"]);
    let (a, b) = (rig.ports[0], rig.ports[1]);
    let ns = Namespace::multipath(vec![rig.path(0), rig.path(1)], 1, quick()).unwrap();
    let m = ns.monitor();
    let mut w = Writer::start(ns);
    io_goes_to(&m, &mut w, 0, 30);

    // A inaccessible, B optimized: the I/O moves to B.
    let t = Instant::now();
    rig.set_ana(a, "inaccessible");
    rig.set_ana(b, "optimized");
    let p = wait_paths(&m, "A inaccessible, B optimized", |p| {
        states(p) == [Some(AnaState::Inaccessible), Some(AnaState::Optimized)]
    });
    println!("  states seen after {:?}: {p:?}", t.elapsed());
    io_goes_to(&m, &mut w, 1, 30);

    // A optimized again: it is first in the order given, so the I/O moves back.
    rig.set_ana(a, "optimized");
    wait_paths(&m, "A optimized", |p| {
        states(p) == [Some(AnaState::Optimized), Some(AnaState::Optimized)]
    });
    io_goes_to(&m, &mut w, 0, 30);

    // Both in transition and back: the writer waits (within ANATT) and goes on.
    rig.set_ana(a, "change");
    rig.set_ana(b, "inaccessible");
    wait_paths(&m, "no usable path", |p| {
        states(p) == [Some(AnaState::Change), Some(AnaState::Inaccessible)]
    });
    thread::sleep(Duration::from_millis(200));
    rig.set_ana(b, "non-optimized");
    wait_paths(&m, "B non-optimized", |p| {
        p[1].ana_state == Some(AnaState::NonOptimized)
    });
    io_goes_to(&m, &mut w, 1, 20);
    rig.set_ana(a, "optimized");
    wait_paths(&m, "A optimized", |p| {
        p[0].ana_state == Some(AnaState::Optimized)
    });
    io_goes_to(&m, &mut w, 0, 20);

    let ns = w.finish();
    let st = ns.stats();
    println!("  stats {st:?}\n  paths {:#?}", ns.paths());
    assert!(st.ana_events >= 4, "{st:?}");
    assert!(st.ana_changes >= 4, "{st:?}");
    assert_eq!((st.path_failovers, st.gave_up, st.reconnects), (0, 0, 0));
    assert!(ns.paths().iter().all(|p| p.state == PathState::Connected));
    ns.shutdown().unwrap();
    println!(
        "ana_changes_move_the_io_without_failing_it: {:?}",
        t0.elapsed()
    );
}

#[test]
fn discovery_finds_every_path() {
    let _s = serial();
    let t0 = Instant::now();
    let rig = Rig::start("mp-disc", &["non-optimized", "optimized"]);
    let mut ns =
        Namespace::discover(rig.path(0), TEST_NQN, 1, MultipathOptions::default()).unwrap();
    let p = ns.paths();
    let mut found: Vec<(u16, Option<AnaState>)> = p.iter().map(|p| (p.port, p.ana_state)).collect();
    found.sort_by_key(|f| f.0);
    let mut want = vec![
        (rig.ports[0], Some(AnaState::NonOptimized)),
        (rig.ports[1], Some(AnaState::Optimized)),
    ];
    want.sort_by_key(|f| f.0);
    assert_eq!(found, want);
    assert!(p
        .iter()
        .all(|p| p.addr == "127.0.0.1" && p.state == PathState::Connected));
    let mut back = vec![0u8; 4096];
    ns.write_at(&[7u8; 4096], 0).unwrap();
    ns.read_at(&mut back, 0).unwrap();
    assert_eq!(back, [7u8; 4096]);
    let p = ns.paths();
    let opt = p.iter().find(|p| p.port == rig.ports[1]).unwrap();
    assert_eq!(opt.commands, 2, "{p:?}");
    // A subsystem nobody serves: a clear error.
    let e = Namespace::discover(
        rig.path(0),
        "nqn.2026-11.io.nvmf-rs:nobody",
        1,
        MultipathOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("lists no path"), "{e}");
    ns.shutdown().unwrap();
    println!("discovery_finds_every_path: {:?}", t0.elapsed());
}

/// A TCP proxy in front of one listener: `cut` closes every connection through it and turns
/// new ones away (accepted and closed) until `restore`.
struct Proxy {
    port: u16,
    state: Arc<Mutex<(bool, Vec<TcpStream>)>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Proxy {
    fn start(to: SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new((true, Vec::new())));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let thread = thread::spawn(move || {
            while !sp.load(Ordering::Relaxed) {
                let c = match l.accept() {
                    Ok((c, _)) => c,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    Err(e) => panic!("proxy accept: {e}"),
                };
                let mut g = st.lock().unwrap();
                if !g.0 {
                    drop(c);
                    continue;
                }
                let Ok(s) = TcpStream::connect(to) else {
                    continue;
                };
                c.set_nonblocking(false).unwrap();
                for x in [&c, &s] {
                    x.set_nodelay(true).unwrap();
                    g.1.push(x.try_clone().unwrap());
                }
                let (c2, s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
                thread::spawn(move || pump(c, s));
                thread::spawn(move || pump(s2, c2));
            }
        });
        Proxy {
            port,
            state,
            stop,
            thread: Some(thread),
        }
    }

    fn cut(&self) {
        let mut g = self.state.lock().unwrap();
        g.0 = false;
        for s in g.1.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.state.lock().unwrap().0 = true;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[test]
fn a_cut_path_fails_over_and_comes_back() {
    let _s = serial();
    let t0 = Instant::now();
    let rig = Rig::start("mp-cut", &["optimized", "non-optimized"]);
    let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], rig.ports[0])));
    let ns = Namespace::multipath(vec![tcp(proxy.port), rig.path(1)], 1, quick()).unwrap();
    let m = ns.monitor();
    println!("  [{:?}] open", t0.elapsed());
    assert_eq!(
        states(&m.paths()),
        [Some(AnaState::Optimized), Some(AnaState::NonOptimized)]
    );
    let mut w = Writer::start(ns);
    io_goes_to(&m, &mut w, 0, 30);
    println!("  [{:?}] I/O on A", t0.elapsed());

    // Cut the optimized path under load: the writer goes on over the other one.
    let t = Instant::now();
    proxy.cut();
    let p = wait_paths(&m, "path A failed", |p| p[0].state == PathState::Failed);
    println!("  failed after {:?}: {:?}", t.elapsed(), p[0]);
    io_goes_to(&m, &mut w, 1, 30);
    println!("  [{:?}] I/O on B", t0.elapsed());
    // It stays down while the proxy turns connections away.
    thread::sleep(Duration::from_millis(300));
    let p = m.paths();
    assert_eq!(p[0].state, PathState::Failed, "{p:?}");
    assert!(p[0].last_error.is_some());

    // Back: the path reconnects and, optimized, takes the I/O again.
    let t = Instant::now();
    proxy.restore();
    let p = wait_paths(&m, "path A back", |p| {
        p[0].state == PathState::Connected && p[0].ana_state == Some(AnaState::Optimized)
    });
    println!("  reconnected after {:?}: {:?}", t.elapsed(), p[0]);
    io_goes_to(&m, &mut w, 0, 30);
    println!("  [{:?}] I/O on A again", t0.elapsed());

    let ns = w.finish();
    let st = ns.stats();
    println!("  stats {st:?}");
    assert!(st.path_failovers <= 1 && st.reconnects == 1, "{st:?}");
    assert_eq!(ns.paths()[0].reconnects, 1);
    assert_eq!(st.gave_up, 0);
    ns.shutdown().unwrap();
    println!("  [{:?}] shut down", t0.elapsed());
    drop(proxy);
    println!("a_cut_path_fails_over_and_comes_back: {:?}", t0.elapsed());
}

#[test]
fn no_usable_path_waits_then_names_every_path() {
    let _s = serial();
    let t0 = Instant::now();
    let rig = Rig::start("mp-none", &["inaccessible", "persistent-loss"]);
    let wait = Duration::from_millis(1500);
    let mut ns = Namespace::multipath(
        vec![rig.path(0), rig.path(1)],
        1,
        MultipathOptions {
            no_path_timeout: Some(wait),
            ..quick()
        },
    )
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    let e = ns.read_at(&mut buf, 0).unwrap_err();
    let took = t.elapsed();
    println!("  {e}");
    assert!(matches!(e, Error::NoUsablePath { .. }), "{e:?}");
    assert!(
        took >= wait && took < wait + Duration::from_secs(2),
        "{took:?}"
    );
    let msg = e.to_string();
    for want in [
        format!(
            "127.0.0.1:{} connected, inaccessible (group 1)",
            rig.ports[0]
        ),
        format!(
            "127.0.0.1:{} connected, persistent-loss (group 1)",
            rig.ports[1]
        ),
    ] {
        assert!(msg.contains(&want), "{msg} lacks {want}");
    }
    assert_eq!(commands(&ns.paths()), [0, 0]);

    let st = ns.stats();
    assert_eq!((st.waits, st.gave_up), (1, 1), "{st:?}");
    ns.shutdown().unwrap();

    // A path that becomes usable during the wait takes the waiting call (a handle with the
    // default wait: ANATT, 10 s from nvmf-target).
    let mut ns = Namespace::multipath(vec![rig.path(0), rig.path(1)], 1, quick()).unwrap();
    let t = Instant::now();
    let r = thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(300));
            rig.set_ana(rig.ports[1], "non-optimized");
        });
        ns.read_at(&mut buf, 0)
    });
    r.unwrap();
    let took = t.elapsed();
    println!("  the waiting call completed after {took:?}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert_eq!(commands(&ns.paths()), [0, 1]);
    let st = ns.stats();
    assert_eq!((st.waits, st.gave_up), (1, 0), "{st:?}");
    ns.shutdown().unwrap();
    println!(
        "no_usable_path_waits_then_names_every_path: {:?}",
        t0.elapsed()
    );
}

/// The asynchronous queue over the same path set: QD16 verified writes go on while the
/// optimized path turns inaccessible (the commands answered with the ANA status go again on
/// the other path), the paths flip back, and the path in use is cut (its commands in flight
/// are sent again on the other): every write completes without an error and reads back.
#[test]
fn the_async_queue_follows_ana_changes_and_cut_paths() {
    let _s = serial();
    let t0 = Instant::now();
    let rig = Rig::start("mp-async", &["optimized", "non-optimized"]);
    let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], rig.ports[0])));
    let mut o = tcp(proxy.port);
    o.queue_depth = 16;
    let mut q = ReconnectingQueue::multipath(vec![o, rig.path(1)], 1, quick()).unwrap();
    let ns = *q.info();
    let bs = ns.block_size as usize;
    let blocks = 256u64;
    // Block b holds generation g: the word (b, g) repeated.
    let fill = |b: u64, g: u64| -> Vec<u8> {
        let w = (b << 32 | g).to_le_bytes();
        w.iter().copied().cycle().take(bs).collect()
    };
    let mut gen = vec![0u64; blocks as usize];
    let mut next = 0u64;
    let mut done = Vec::new();
    let mut completed = 0u64;
    let mut round = |q: &mut ReconnectingQueue, gen: &mut Vec<u64>, n: u64| {
        for _ in 0..n {
            while q.in_flight() < 16 {
                // Blocks in flight together are distinct (next walks them in turn).
                let b = next % blocks;
                next += 1;
                gen[b as usize] += 1;
                q.submit_write(&ns, b, fill(b, gen[b as usize]), b)
                    .map_err(|e| e.error)
                    .unwrap();
            }
            done.clear();
            q.reap(&mut done, 1, Some(Duration::from_secs(30))).unwrap();
            for c in &done {
                assert!(c.result.is_ok(), "block {}: {:?}", c.user_data, c.result);
            }
            completed += done.len() as u64;
        }
    };
    let paths_of = |q: &ReconnectingQueue| commands(&q.paths());
    round(&mut q, &mut gen, 50);
    println!("  [{:?}] on A: {:?}", t0.elapsed(), paths_of(&q));
    // A inaccessible, B optimized: the queue moves.
    rig.set_ana(rig.ports[0], "inaccessible");
    rig.set_ana(rig.ports[1], "optimized");
    round(&mut q, &mut gen, 100);
    let st = q.stats();
    println!(
        "  [{:?}] after the flip: {:?} {st:?}",
        t0.elapsed(),
        paths_of(&q)
    );
    // Back to A, then cut it under load.
    rig.set_ana(rig.ports[1], "non-optimized");
    rig.set_ana(rig.ports[0], "optimized");
    round(&mut q, &mut gen, 100);
    proxy.cut();
    round(&mut q, &mut gen, 100);
    let st = q.stats();
    println!(
        "  [{:?}] after the cut: {:?} {st:?}",
        t0.elapsed(),
        q.paths()
    );
    assert!(st.path_failovers >= 1, "{st:?}");
    assert_eq!(st.gave_up, 0, "{st:?}");
    // Drain, then read every block back through the queue.
    while q.in_flight() > 0 {
        done.clear();
        q.reap(&mut done, 1, Some(Duration::from_secs(30))).unwrap();
        assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
        completed += done.len() as u64;
    }
    assert_eq!(completed, next, "every write completed once");
    for b in 0..blocks {
        q.submit_read(&ns, b, vec![0u8; bs], b)
            .map_err(|e| e.error)
            .unwrap();
        done.clear();
        q.reap(&mut done, 1, Some(Duration::from_secs(30))).unwrap();
        let c = &done[0];
        assert!(c.result.is_ok(), "read {b}: {:?}", c.result);
        assert_eq!(
            c.buf.as_deref(),
            Some(&fill(b, gen[b as usize])[..]),
            "block {b} reads back its last write"
        );
    }
    q.shutdown().unwrap();
    drop(proxy);
    println!(
        "the_async_queue_follows_ana_changes_and_cut_paths: {:?}",
        t0.elapsed()
    );
}
