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
use std::time::{Duration, Instant};

use initiator::{AnaState, ConnectOptions, MultipathNamespace, MultipathOptions};
use nvmf_tests::ceph::{self, TestImage};
use nvmf_tests::{TargetProc, TEST_NQN};

fn member(
    img: &TestImage,
    group: &str,
    name: &str,
    home: &[u32],
    cntlids: (u16, u16),
    sock: &Path,
) -> TargetProc {
    let (conf, image) = (img.conf.display().to_string(), img.name.clone());
    let home = format!("{home:?}");
    TargetProc::start_with_env(
        |port, _| {
            format!(
                "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
                 subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    serial: NVMFRSGG01\n    namespaces:\n      \
                 - {{ nsid: 1, rbd: {{ pool: rbd, image: {image}, conf: {conf} }} }}\n\
                 target: {{ threads: 1, cntlid_min: {}, cntlid_max: {} }}\n\
                 gateway: {{ group: {group}, name: {name}, pool: rbd, conf: {conf}, ana_groups: {home}, lease_secs: 3 }}\n",
                cntlids.0, cntlids.1
            )
        },
        &[],
        &["--control-socket".into(), sock.into()],
    )
}

fn path(t: &TargetProc) -> ConnectOptions {
    let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    o.timeout = Duration::from_secs(10);
    o
}

fn pattern(i: u64) -> Vec<u8> {
    (0..8192u64)
        .map(|k| (k.wrapping_mul(37) ^ i.wrapping_mul(151)) as u8)
        .collect()
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

fn state_of(ns: &MultipathNamespace, i: usize) -> Option<AnaState> {
    ns.paths()[i].ana_state
}

#[test]
fn a_gateway_group_fails_over_and_back_by_itself() {
    let Some(conf) = ceph::conf() else { return };
    let img = TestImage::create(&conf, "gg", 32);
    let group = format!("t{}", std::process::id());
    let dir = nvmf_tests::TempDir::new("gg");
    let (sock_a, sock_b): (PathBuf, PathBuf) = (dir.0.join("a.sock"), dir.0.join("b.sock"));
    let mut a = member(&img, &group, "gw-a", &[1], (1, 0x7fff), &sock_a);
    let mut b = member(&img, &group, "gw-b", &[], (0x8000, 0xffef), &sock_b);
    a.wait_log("took the ANA group's lease", 1);
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
        reconnect_delay: Duration::from_millis(100),
        reconnect_max_delay: Duration::from_millis(500),
        ana_poll: Some(Duration::from_millis(200)),
        ..MultipathOptions::default()
    };
    let mut ns = MultipathNamespace::open_with(vec![path(&a), path(&b)], 1, opts).unwrap();
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

    // A comes back: it rejoins, B gives the group back (failback), A serves it again.
    a.restart();
    b.wait_log("failback: giving the ANA group back", 1);
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
