//! A gateway group (`gateway:` in the configuration) over NVMe/TCP loopback and the test
//! cluster: two targets in front of one RBD image, gateway A the home of ANA group 1 and B
//! serving nothing of its own. Nobody sets an ANA state by hand: A takes the group's lease
//! and serves it optimized, B reports it inaccessible; B's discovery log lists A's listener.
//! A is killed (SIGKILL) under the initiator's multipath namespace: B takes the lapsed lease
//! within the ANA transition time, fences A (breaks its lock on the image) and the same writer
//! goes on through B. A restarted rejoins, B gives the group back (failback) without being
//! fenced itself, and every block written through either reads back. An `rbd resize` then
//! reaches both gateways within 10 s.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use initiator::{AnaState, MultipathOptions, Namespace, ReconnectPolicy};
use nvmf_tests::ceph::{self, pattern, tcp_path as path, TestImage};
use nvmf_tests::{target_bin, TargetProc, TEST_NQN};

/// The subsystems section every gateway of these tests serves (`serial` varies to make a file
/// that disagrees with the group).
fn subsystems_yaml(img: &TestImage, serial: &str) -> String {
    format!(
        "subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    serial: {serial}\n    namespaces:\n      \
         - {{ nsid: 1, rbd: {{ pool: rbd, image: {}, conf: {} }} }}\n",
        img.name,
        img.conf.display()
    )
}

/// A gateway's file: its listener on `port`, `subsystems` (YAML, may be empty), its group.
fn gateway_yaml(
    img: &TestImage,
    port: u16,
    subsystems: &str,
    group: &str,
    name: &str,
    home: &[u32],
    cntlids: (u16, u16),
) -> String {
    gateway_yaml_lease(img, port, subsystems, group, name, home, cntlids, 4)
}

/// [`gateway_yaml`] with a lease of `lease` seconds.
#[allow(clippy::too_many_arguments)]
fn gateway_yaml_lease(
    img: &TestImage,
    port: u16,
    subsystems: &str,
    group: &str,
    name: &str,
    home: &[u32],
    cntlids: (u16, u16),
    lease: u32,
) -> String {
    let conf = img.conf.display();
    format!(
        "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n{subsystems}\
         target: {{ threads: 1, cntlid_min: {}, cntlid_max: {} }}\n\
         gateway: {{ group: {group}, name: {name}, pool: rbd, conf: {conf}, ana_groups: {home:?}, lease_secs: {lease} }}\n",
        cntlids.0, cntlids.1
    )
}

fn member(
    img: &TestImage,
    group: &str,
    name: &str,
    home: &[u32],
    cntlids: (u16, u16),
    sock: &Path,
) -> TargetProc {
    member_lease(img, group, name, home, cntlids, sock, 4)
}

/// [`member`] with a lease of `lease` seconds.
fn member_lease(
    img: &TestImage,
    group: &str,
    name: &str,
    home: &[u32],
    cntlids: (u16, u16),
    sock: &Path,
    lease: u32,
) -> TargetProc {
    let subs = subsystems_yaml(img, "NVMFRSGG01");
    TargetProc::start_with_env(
        |port, _| gateway_yaml_lease(img, port, &subs, group, name, home, cntlids, lease),
        &[],
        &["--control-socket".into(), sock.into()],
    )
}

/// Two gateways of one group on a new image: A (controller IDs from 1) home of ANA group 1,
/// B (from 0x8000) of none, each with its control socket; A holds the group's lease.
struct Pair {
    img: TestImage,
    group: String,
    /// Holds the control sockets (and goes with the test).
    _dir: nvmf_tests::TempDir,
    sock_b: PathBuf,
}

/// [`Pair`] on image `tag` in group `<prefix><pid>`, and its gateways A and B (keep the `Pair`
/// bound to the end: the image and the sockets' directory go with it).
fn pair(conf: &PathBuf, tag: &str, prefix: &str) -> (Pair, TargetProc, TargetProc) {
    let img = TestImage::create(conf, tag, 32);
    let group = format!("{prefix}{}", std::process::id());
    let dir = nvmf_tests::TempDir::new(tag);
    let (sock_a, sock_b) = (dir.0.join("a.sock"), dir.0.join("b.sock"));
    let a = member(&img, &group, "gw-a", &[1], (1, 0x7fff), &sock_a);
    let b = member(&img, &group, "gw-b", &[], (0x8000, 0xffef), &sock_b);
    a.wait_log("took the ANA group's lease", 1);
    let p = Pair {
        img,
        group,
        _dir: dir,
        sock_b,
    };
    (p, a, b)
}

/// The TCP ports `via`'s discovery log lists for the test subsystem.
fn listed_ports(via: &TargetProc) -> Vec<u16> {
    let mut ports: Vec<u16> = initiator::discover(
        "127.0.0.1",
        via.addr.port(),
        "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-0000-0000-00000000cc01",
    )
    .unwrap()
    .into_iter()
    .filter(|e| e.subnqn == TEST_NQN)
    .filter_map(|e| e.trsvcid.parse().ok())
    .collect();
    ports.sort();
    ports
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn state_of(ns: &Namespace, i: usize) -> Option<AnaState> {
    ns.paths()[i].ana_state
}

#[test]
fn a_gateway_group_fails_over_and_back_by_itself() {
    let Some(conf) = ceph::conf() else { return };
    let (p, mut a, mut b) = pair(&conf, "gg", "t");
    let (img, group, sock_b) = (&p.img, &p.group, &p.sock_b);
    let (pa, pb) = (a.addr.port(), b.addr.port());
    let mut both = vec![pa, pb];
    both.sort();
    // Each gateway's discovery log lists both gateways' listeners.
    wait_for("B's discovery log lists A", Duration::from_secs(10), || {
        listed_ports(&b) == both
    });
    wait_for("A's discovery log lists B", Duration::from_secs(10), || {
        listed_ports(&a) == both
    });

    let opts = MultipathOptions {
        reconnect: ReconnectPolicy {
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
            ..ReconnectPolicy::forever()
        },
        ana_poll: Some(Duration::from_millis(200)),
        ..MultipathOptions::default()
    };
    let mut ns = Namespace::multipath(vec![path(&a), path(&b)], 1, opts).unwrap();
    wait_for(
        "A optimized, B inaccessible",
        Duration::from_secs(10),
        || {
            (state_of(&ns, 0), state_of(&ns, 1))
                == (Some(AnaState::Optimized), Some(AnaState::Inaccessible))
        },
    );
    for i in 0..32u64 {
        ns.write_at(&pattern(i), i * 8192).unwrap();
    }
    assert!(ns.paths()[1].commands == 0, "{:#?}", ns.paths());

    // A dies: B takes the lapsed lease by itself, within the ANA transition time (10 s).
    a.kill();
    let t = Instant::now();
    ns.write_at(&pattern(32), 32 * 8192).unwrap();
    let failover = t.elapsed();
    eprintln!("first write after A was killed completed through B in {failover:?}");
    assert!(failover < Duration::from_secs(10), "{failover:?}");
    for i in 33..64u64 {
        ns.write_at(&pattern(i), i * 8192).unwrap();
    }
    assert!(ns.paths()[1].commands >= 32, "{:#?}", ns.paths());
    b.wait_log("took the ANA group's lease", 1);
    // B fenced A: A's lock on the image was broken.
    let log = b.wait_log("took over the image", 1);
    assert!(log.contains(&img.name), "{log}");
    // A's listener leaves B's discovery log once A's liveness lapses.
    wait_for("B's discovery log drops A", Duration::from_secs(10), || {
        listed_ports(&b) == vec![pb]
    });
    // `nvmf-target stats` on B says what it serves.
    let o = Command::new(target_bin())
        .args(["stats", "--json", "--control-socket"])
        .arg(sock_b)
        .output()
        .unwrap();
    let stats = String::from_utf8_lossy(&o.stdout);
    assert!(
        stats.contains(&format!(
            "\"gateway\":{{\"group\":\"{group}\",\"name\":\"gw-b\",\"serving\":[1],\"leased\":[1],\"peers\":[],"
        )),
        "{stats}"
    );

    // A comes back: it rejoins, B gives the group back (failback), A serves it again.
    a.restart();
    let log = b.wait_log("failback: giving the ANA group back", 1);
    // B handed the group over once its daemon had made it inaccessible and drained it.
    assert!(!log.contains("did not confirm"), "{log}");
    wait_for("A optimized again", Duration::from_secs(15), || {
        (state_of(&ns, 0), state_of(&ns, 1))
            == (Some(AnaState::Optimized), Some(AnaState::Inaccessible))
    });
    let before = ns.paths()[0].commands;
    for i in 64..96u64 {
        ns.write_at(&pattern(i), i * 8192).unwrap();
    }
    assert!(ns.paths()[0].commands >= before + 32, "{:#?}", ns.paths());
    // A took the image's lock from B, which is alive, without fencing it.
    assert!(
        !a.log_text().contains("took over the image"),
        "{}",
        a.log_text()
    );
    let mut back = vec![0u8; 8192];
    for i in 0..96u64 {
        ns.read_at(&mut back, i * 8192).unwrap();
        assert!(back == pattern(i), "block {i} reads back what was written");
    }
    wait_for("both listed again", Duration::from_secs(10), || {
        listed_ports(&b) == both
    });
    // `rbd resize` reaches every gateway (each watches the image) within 10 s.
    let t = Instant::now();
    img.resize(48);
    for g in [&a, &b] {
        g.wait_log(
            "storage changed: namespaces opened again at their new size",
            1,
        );
    }
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    drop(ns);
    assert!(a.terminate(), "{}", a.log_text());
    assert!(b.terminate(), "{}", b.log_text());
}

/// `f` until it does not fail with Namespace Not Ready (a namespace being opened again, which
/// hosts retry: the status has no DNR), for at most 15 s.
fn retrying<T>(what: &str, mut f: impl FnMut() -> Result<T, initiator::Error>) -> T {
    let t = Instant::now();
    loop {
        match f() {
            Err(e) if e.status().map(|s| s.code()) == Some(nvme::Status::NS_NOT_READY.code()) => {
                assert!(t.elapsed() < Duration::from_secs(15), "{what}: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r.unwrap_or_else(|e| panic!("{what}: {e}")),
        }
    }
}

/// A gateway that stalls (SIGSTOP) past its lease is fenced: B takes the group over and breaks
/// A's lock on the image, so the cluster blocklists A's client. When A runs again it rejoins
/// and gets its group back (failback); its old connection can do nothing any more, so A finds
/// itself fenced, opens the image again on a new connection and serves: the writes through A
/// land, and every block reads back.
#[test]
fn a_fenced_gateway_serves_again_on_a_new_connection() {
    let Some(conf) = ceph::conf() else { return };
    let (p, mut a, mut b) = pair(&conf, "gf", "f");
    let img = &p.img;
    {
        let mut c = initiator::Controller::connect(path(&a)).unwrap();
        let mut ns = c.open_namespace(1).unwrap();
        for i in 0..16u64 {
            ns.write_at(&pattern(i), i * 8192).unwrap();
        }
        c.shutdown().unwrap();
    }
    // A stalls past its lease: B takes the group and fences A.
    // SAFETY: kill(2) on our own child with plain signal numbers.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGSTOP) };
    let log = b.wait_log("took over the image", 1);
    assert!(log.contains(&img.name), "{log}");
    // B writes.
    {
        let mut c = initiator::Controller::connect(path(&b)).unwrap();
        let mut ns = c.open_namespace(1).unwrap();
        for i in 16..32u64 {
            retrying("write through B", || ns.write_at(&pattern(i), i * 8192));
        }
        c.shutdown().unwrap();
    }
    // SAFETY: as above.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGCONT) };
    // A rejoins, B gives the group back, A finds its client blocklisted and reopens. A host
    // writes through A all along, every 5 ms while A refuses (inaccessible, then in change
    // until A's takeover check, which finds A fenced, and the reopen are done): no write may
    // reach the blocklisted client, where librbd would hold it past the host's 5 s timeout.
    b.wait_log("failback: giving the ANA group back", 1);
    let mut opts = path(&a);
    opts.timeout = Duration::from_secs(5);
    let mut c = initiator::Controller::connect(opts).unwrap();
    let mut ns = c.open_namespace(1).unwrap();
    let t = Instant::now();
    let mut refused = std::collections::BTreeMap::<String, u32>::new();
    for i in 32..48u64 {
        loop {
            match ns.write_at(&pattern(i), i * 8192) {
                Ok(()) => break,
                Err(e)
                    if e.status().is_some_and(|s| {
                        initiator::is_path_status(s)
                            || s.code() == nvme::Status::NS_NOT_READY.code()
                    }) =>
                {
                    *refused.entry(e.to_string()).or_default() += 1;
                    assert!(
                        t.elapsed() < Duration::from_secs(20),
                        "write through A: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!(
                    "write {i} through A after {:?} ({refused:?}): {e}",
                    t.elapsed()
                ),
            }
        }
    }
    a.wait_log("opening the image again on a new connection", 1);
    assert!(
        a.log_text()
            .contains("taking the groups' RBD images over: ANA change until done"),
        "{}",
        a.log_text()
    );
    eprintln!("writes through A refused before they could land: {refused:?}");
    let mut back = vec![0u8; 8192];
    for i in 0..48u64 {
        retrying("read through A", || ns.read_at(&mut back, i * 8192));
        assert!(back == pattern(i), "block {i} reads back what was written");
    }
    c.shutdown().unwrap();
    assert!(a.terminate(), "{}", a.log_text());
    assert!(b.terminate(), "{}", b.log_text());
}

/// A gateway stopped past its lease while a host's write waits for it in its socket: the peer
/// takes the group over and fences it. When it runs again its pollers see the command before
/// its member thread learns the lease is gone; the lease's bound in the core makes it refuse
/// the write with a path status (a multipath host moves to B at once) instead of handing it
/// to the blocklisted client (without the bound: librbd refuses it, and the host is told
/// Namespace Not Ready, which it retries on the same path).
#[test]
fn a_stalled_gateway_refuses_what_waited_for_it_once_its_lease_ran_out() {
    let Some(conf) = ceph::conf() else { return };
    let (_p, mut a, mut b) = pair(&conf, "gs", "s");
    let mut opts = path(&a);
    opts.timeout = Duration::from_secs(30);
    let mut c = initiator::Controller::connect(opts).unwrap();
    let mut ns = c.open_namespace(1).unwrap();
    ns.write_at(&pattern(0), 0).unwrap();
    // SAFETY: kill(2) on our own child with plain signal numbers.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGSTOP) };
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = std::thread::spawn(move || {
        let r = ns.write_at(&pattern(1), 8192);
        tx.send(Instant::now()).unwrap();
        (r, ns, c)
    });
    b.wait_log("took over the image", 1);
    let resumed = Instant::now();
    // SAFETY: as above.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGCONT) };
    let answered = rx
        .recv_timeout(Duration::from_secs(40))
        .expect("the write waiting in A's socket is answered");
    let (r, _ns, c) = writer.join().unwrap();
    let took = answered.saturating_duration_since(resumed);
    match r {
        Err(e) if e.status().is_some_and(initiator::is_path_status) => {
            assert!(
                took < Duration::from_secs(5),
                "answered {took:?} after A resumed: {e}"
            );
            eprintln!("the waiting write was refused {took:?} after A resumed: {e}");
        }
        other => panic!("the waiting write, {took:?} after A resumed: {other:?}"),
    }
    drop(c);
    assert!(a.terminate(), "{}", a.log_text());
    assert!(b.terminate(), "{}", b.log_text());
}

fn ctl(sock: &Path, args: &[&str]) -> String {
    let o = Command::new(target_bin())
        .arg("ctl")
        .arg("--control-socket")
        .arg(sock)
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "ctl {args:?}: {text}");
    text
}

/// The group's configuration lives in RADOS: the first gateway's file seeds it, a gateway
/// whose file has no subsystems takes it, a file that disagrees with it is refused (naming
/// the difference), and `ctl` on one gateway changes every gateway at once (a RADOS notify:
/// the leases of 60 s put the rounds that read the version 20 s apart), also one started
/// later.
#[test]
fn the_group_configuration_is_kept_in_rados_and_shared() {
    let Some(conf) = ceph::conf() else { return };
    let img = TestImage::create(&conf, "gc", 32);
    let group = format!("c{}", std::process::id());
    let dir = nvmf_tests::TempDir::new("gc");
    let (sock_a, sock_b) = (dir.0.join("a.sock"), dir.0.join("b.sock"));
    let a = member_lease(&img, &group, "gw-a", &[1], (1, 0x7fff), &sock_a, 60);
    a.wait_log("seeded the group's configuration", 1);
    // B's file has no subsystems: it serves the group's.
    let mut b = TargetProc::start_with_env(
        |port, _| gateway_yaml_lease(&img, port, "", &group, "gw-b", &[], (0x8000, 0xffef), 60),
        &[],
        &["--control-socket".into(), sock_b.clone().into()],
    );
    b.wait_log("took the group's configuration", 1);
    let listed = ctl(&sock_b, &["list"]);
    assert!(
        listed.contains(TEST_NQN) && listed.contains(&img.name),
        "{listed}"
    );
    let c = initiator::Controller::connect(path(&b)).unwrap();
    assert_eq!(c.namespaces().len(), 1);
    c.shutdown().unwrap();

    // A file that disagrees with the group: refused at start, naming the difference.
    let bad = dir.0.join("c.yaml");
    let port = nvmf_tests::free_port();
    std::fs::write(
        &bad,
        gateway_yaml(
            &img,
            port,
            &subsystems_yaml(&img, "NVMFRSOTHER"),
            &group,
            "gw-c",
            &[],
            (0x8000, 0xffef),
        ),
    )
    .unwrap();
    let mut child = Command::new(target_bin())
        .arg("--config")
        .arg(&bad)
        .arg("--control-socket")
        .arg(dir.0.join("c.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("a gateway whose file disagrees with the group started");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(
        err.contains("differ from the group's configuration")
            && err.contains(
                "subsystems[0].serial: \"NVMFRSOTHER\" here, \"NVMFRSGG01\" in the group's"
            ),
        "{err}"
    );

    // ctl on B adds a namespace: stored in the group, A applies it too.
    ctl(
        &sock_b,
        &["add-namespace", TEST_NQN, "--nsid", "2", "--null", "16MiB"],
    );
    let t = Instant::now();
    let log = a.wait_log("the group's configuration applied", 1);
    let took = t.elapsed();
    assert!(
        log.lines()
            .any(|l| l.contains("the group's configuration changed") && l.contains("via=notify")),
        "{log}"
    );
    assert!(took < Duration::from_secs(5), "applied after {took:?}");
    let on_a = ctl(&sock_a, &["list"]);
    assert!(on_a.contains("nsid: 2"), "{on_a}");
    let c = initiator::Controller::connect(path(&a)).unwrap();
    assert_eq!(c.namespaces().len(), 2);
    c.shutdown().unwrap();

    // B restarted (its file still has no subsystems) starts with the group's, namespace 2
    // included.
    assert!(b.terminate(), "{}", b.log_text());
    b.restart();
    b.wait_log("took the group's configuration", 2);
    let on_b = ctl(&sock_b, &["list"]);
    assert!(on_b.contains("nsid: 2"), "{on_b}");
    // A resize reaches B too, which runs the group's configuration (its file has none).
    img.resize(48);
    for g in [&a, &b] {
        g.wait_log(
            "storage changed: namespaces opened again at their new size",
            1,
        );
    }
    drop(a);
}

/// Reservations are the group's: taken through gateway A, still enforced by B when B takes
/// the group over after A dies; a preempt through B holds when A comes back; and the state
/// survives every gateway restarting.
#[test]
fn reservations_are_kept_by_the_group() {
    use initiator::resv::{AcquireAction, ResvType};
    use nvmf_tests::resv::{acquire, conflict, open_as as open, register};
    let Some(conf) = ceph::conf() else { return };
    let (_p, mut a, mut b) = pair(&conf, "gr", "r");
    let (h1, h2) = ([0x11u8; 16], [0x22u8; 16]);
    let block = vec![0x5au8; 4096];

    // Through A: host 1 holds Write Exclusive, host 2 is registered and refused.
    let (_c1, mut n1) = open(&a, h1);
    let (_c2, mut n2) = open(&a, h2);
    register(&mut n1, 0x1111).unwrap();
    register(&mut n2, 0x2222).unwrap();
    acquire(
        &mut n1,
        AcquireAction::Acquire,
        ResvType::WriteExclusive,
        0x1111,
        0,
    )
    .unwrap();
    n1.write_at(&block, 0).unwrap();
    conflict(n2.write_at(&block, 0));

    // A dies; B takes the group over with the reservation.
    a.kill();
    drop((n1, n2, _c1, _c2));
    b.wait_log("reservations read from the gateway group", 1);
    let (_c1, mut n1) = open(&b, h1);
    let (_c2, mut n2) = open(&b, h2);
    wait_for("B serves the group", Duration::from_secs(10), || {
        n1.reservation_report().is_ok()
    });
    conflict(n2.write_at(&block, 0));
    n1.write_at(&block, 4096).unwrap();
    let r = n2.reservation_report().unwrap();
    assert_eq!(r.rtype, Some(ResvType::WriteExclusive));
    assert_eq!(r.registrants, [(h1, 0x1111, true), (h2, 0x2222, false)]);
    // Host 2 preempts through B: host 1 is out.
    acquire(
        &mut n2,
        AcquireAction::Preempt,
        ResvType::WriteExclusive,
        0x2222,
        0x1111,
    )
    .unwrap();
    conflict(n1.write_at(&block, 0));
    n2.write_at(&block, 0).unwrap();
    drop((n1, n2, _c1, _c2));

    // Every gateway restarted: A gets the group back (failback) with the same state.
    b.kill();
    a.restart();
    b.restart();
    let (_c1, mut n1) = open(&a, h1);
    let (_c2, mut n2) = open(&a, h2);
    wait_for("A serves the group again", Duration::from_secs(20), || {
        n1.reservation_report().is_ok()
    });
    let r = n1.reservation_report().unwrap();
    assert_eq!(r.rtype, Some(ResvType::WriteExclusive));
    assert_eq!(r.registrants, [(h2, 0x2222, true)]);
    conflict(n1.write_at(&block, 0));
    n2.write_at(&block, 8192).unwrap();
}
