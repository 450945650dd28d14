//! Two targets ("gateways") in front of one RBD image, as one multipath subsystem: the same
//! subsystem NQN and namespace (its UUID is derived from both, so it is the same on both),
//! disjoint controller ID ranges (`target.cntlid_min/max`) so a host's two paths are two
//! controllers of one subsystem, gateway A's listener optimized and B's inaccessible. The
//! initiator's `Namespace` writes and verifies through A; A is killed (SIGKILL), B's
//! listener made optimized (`ctl set-ana-state`, what the group's lease will do by itself), and
//! the same writer goes on through B: every block it wrote before and after reads back.
//! A test binary of its own (it shares nothing, but kills a target while librbd holds the
//! image's exclusive lock: B takes the lock over once A's is broken).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use initiator::{AnaState, MultipathOptions, Namespace, ReconnectPolicy};
use nvmf_tests::caw::{self, RaceOptions};
use nvmf_tests::ceph::{self, pattern, tcp_path as path, TestImage};
use nvmf_tests::{target_bin, TargetProc, TEST_NQN};

fn gateway(img: &TestImage, cntlids: (u16, u16), ana: &str, sock: &Path) -> TargetProc {
    gateway_bs(img, cntlids, ana, sock, 4096)
}

fn gateway_bs(
    img: &TestImage,
    cntlids: (u16, u16),
    ana: &str,
    sock: &Path,
    block_size: u32,
) -> TargetProc {
    let (conf, name) = (img.conf.display().to_string(), img.name.clone());
    TargetProc::start_with_env(
        |port, _| {
            format!(
                "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port}, ana: {{ 1: {ana} }} }}\n\
                 subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    serial: NVMFRSGW01\n    namespaces:\n      \
                 - {{ nsid: 1, block_size: {block_size}, rbd: {{ pool: rbd, image: {name}, conf: {conf} }} }}\n\
                 target: {{ threads: 1, cntlid_min: {}, cntlid_max: {} }}\n",
                cntlids.0, cntlids.1
            )
        },
        &[],
        &["--control-socket".into(), sock.into()],
    )
}

#[test]
fn a_second_gateway_takes_over_an_rbd_namespace() {
    let Some(conf) = ceph::conf() else { return };
    let img = TestImage::create(&conf, "gw", 32);
    let dir = nvmf_tests::TempDir::new("gw");
    let (sock_a, sock_b) = (dir.0.join("a.sock"), dir.0.join("b.sock"));
    let mut a = gateway(&img, (1, 0x7fff), "optimized", &sock_a);
    let mut b = gateway(&img, (0x8000, 0xffef), "inaccessible", &sock_b);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock_b.exists() {
        assert!(
            Instant::now() < deadline,
            "no control socket:\n{}",
            b.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let opts = MultipathOptions {
        reconnect: ReconnectPolicy {
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
            ..ReconnectPolicy::forever()
        },
        ..MultipathOptions::default()
    };
    let mut ns = Namespace::multipath(vec![path(&a), path(&b)], 1, opts).unwrap();
    let paths = ns.paths();
    let ids: Vec<u16> = paths.iter().map(|p| p.cntlid.unwrap()).collect();
    assert!(
        ids[0] < 0x8000 && ids[1] >= 0x8000,
        "disjoint controller IDs: {ids:?}"
    );
    assert_eq!(
        paths.iter().map(|p| p.ana_state).collect::<Vec<_>>(),
        vec![Some(AnaState::Optimized), Some(AnaState::Inaccessible)]
    );
    let mut back = vec![0u8; 8192];
    for i in 0..64u64 {
        ns.write_at(&pattern(i), i * 8192).unwrap();
    }
    assert!(
        ns.paths()[0].commands >= 64 && ns.paths()[1].commands == 0,
        "{:#?}",
        ns.paths()
    );

    // Gateway A dies; B is made optimized.
    a.kill();
    let o = Command::new(target_bin())
        .arg("ctl")
        .arg("--control-socket")
        .arg(&sock_b)
        .args(["set-ana-state", "tcp", "127.0.0.1"])
        .arg(b.addr.port().to_string())
        .args(["1", "optimized"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let took = Instant::now();
    for i in 64..128u64 {
        ns.write_at(&pattern(i), i * 8192).unwrap();
    }
    eprintln!(
        "64 writes through gateway B after the failover: {:?}",
        took.elapsed()
    );
    for i in 0..128u64 {
        ns.read_at(&mut back, i * 8192).unwrap();
        assert!(back == pattern(i), "block {i} reads back what was written");
    }
    assert!(ns.paths()[1].commands >= 64 + 128, "{:#?}", ns.paths());
    // B broke A's lock, which fenced A: the cluster blocklists the client that held it.
    let log = b.wait_log("took over the image", 1);
    assert!(log.contains(&img.name), "{log}");
    let bl = Command::new("ceph")
        .arg("-c")
        .arg(&conf)
        .args(["osd", "blocklist", "ls"])
        .output()
        .unwrap();
    let listed =
        String::from_utf8_lossy(&bl.stdout).to_string() + &String::from_utf8_lossy(&bl.stderr);
    assert!(
        listed.contains("127.0.0.1:"),
        "A's client is blocklisted: {listed}"
    );
    drop(ns);
    assert!(b.terminate(), "{}", b.log_text());
}

/// Two hosts race Compare and Write on one block, host 1 through gateway A and host 2 through
/// gateway B, both serving the image optimized at once: the fused pair is librbd's
/// compare-and-write, one operation on the OSD, so every round has exactly one winner and no
/// read sees a torn block. A 512-byte block namespace: one sector is what librbd 16's
/// compare-and-write takes (a larger pair is serialized by the gateway that runs it, which is
/// atomic only while one gateway serves the image, as in a gateway group).
///
/// The image has no exclusive-lock feature, so both gateways write at once. With it, librbd
/// hands the lock over on every change of writer, and a request that reaches the owner while
/// it is still taking the lock is acknowledged but not served: the requester retries only
/// after `client_notify_timeout` (10 s), past the host's command timeout (seen in CI).
#[test]
fn compare_and_write_races_through_two_gateways_have_one_winner_per_round() {
    let Some(conf) = ceph::conf() else { return };
    let img = TestImage::create_with(&conf, "gwcaw", 8, &["--image-feature", "layering"]);
    let dir = nvmf_tests::TempDir::new("gwcaw");
    let a = gateway_bs(&img, (1, 0x7fff), "optimized", &dir.0.join("a.sock"), 512);
    let b = gateway_bs(
        &img,
        (0x8000, 0xffef),
        "optimized",
        &dir.0.join("b.sock"),
        512,
    );
    let o = RaceOptions {
        hosts: 2,
        rounds: 1000,
        nsid: 1,
        lba: 3,
    };
    let rep = caw::race_through(&[path(&a), path(&b)], &o)
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", a.log_text(), b.log_text()));
    rep.assert_clean(&o, &format!("A:\n{}\nB:\n{}", a.log_text(), b.log_text()));
    assert!(rep.wins.iter().all(|&w| w > 0), "{}", rep.summary());
}
