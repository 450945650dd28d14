//! Live management: `nvmf-target ctl ...` changes the running target through the control
//! socket, as a connected host sees; errors name the field and change nothing; `--persist`
//! writes the file back (old one kept as .bak) so a restart keeps the change.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use initiator::{ConnectOptions, Controller};
use nvmf_tests::{free_port, target_bin, TargetProc, TempDir, TEST_NQN};

fn ctl(sock: &Path, args: &[&str]) -> Output {
    Command::new(target_bin())
        .arg("ctl")
        .arg("--control-socket")
        .arg(sock)
        .args(args)
        .output()
        .unwrap()
}

/// The tests here pick extra listener ports with `free_port` while another target may be
/// starting on one: they run one at a time (a port picked by one must not be bound by the
/// other's target in between).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The target on the default configuration with a control socket of its own, once the socket
/// is up (it comes right after the listeners).
fn start(tag: &str) -> (TempDir, std::path::PathBuf, TargetProc) {
    let d = TempDir::new(tag);
    let sock = d.0.join("control.sock");
    let t = TargetProc::start_with_env(
        nvmf_tests::default_yaml,
        &[],
        &["--control-socket".into(), sock.clone().into()],
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !sock.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (d, sock, t)
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "ctl failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn nsids(c: &mut Controller) -> Vec<u32> {
    c.rescan_namespaces()
        .unwrap()
        .iter()
        .map(|n| n.nsid)
        .collect()
}

#[test]
fn ctl_changes_the_running_target_and_persists() {
    let _serial = serial();
    let (d, sock, t) = start("ctl");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the control socket is owner-only");
    let mut c = Controller::connect(ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    assert_eq!(nsids(&mut c), [1]);

    // A namespace appears to the connected host; it takes I/O.
    ok(&ctl(
        &sock,
        &["add-namespace", TEST_NQN, "--nsid", "2", "--null", "64MiB"],
    ));
    assert_eq!(nsids(&mut c), [1, 2]);
    let mut ns = c.open_namespace(2).unwrap();
    let mut buf = vec![1u8; 4096];
    ns.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    drop(ns);

    // Refused changes name the field (or the object) and change nothing.
    let dup = ctl(
        &sock,
        &["add-namespace", TEST_NQN, "--nsid", "2", "--null", "1GiB"],
    );
    assert_eq!(dup.status.code(), Some(2));
    let err = String::from_utf8_lossy(&dup.stderr);
    assert!(err.contains("subsystems[0].namespaces[2].nsid"), "{err}");
    let none = ctl(
        &sock,
        &[
            "remove-namespace",
            "nqn.2026-11.io.example:none",
            "--nsid",
            "1",
        ],
    );
    assert!(String::from_utf8_lossy(&none.stderr).contains("no subsystem"));
    assert_eq!(nsids(&mut c), [1, 2]);

    // list: the running configuration (YAML; JSON with --json).
    let yaml = ok(&ctl(&sock, &["list"]));
    assert!(yaml.contains("nsid: 2"), "{yaml}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&ctl(&sock, &["list", "--json"]))).unwrap();
    assert_eq!(json["config"]["subsystems"][0]["nqn"], TEST_NQN);

    // A new listener, persisted: the host connects there; the file is rewritten (old one kept)
    // and loads with the change.
    let port = free_port();
    ok(&ctl(
        &sock,
        &[
            "add-listener",
            "tcp",
            "127.0.0.1",
            &port.to_string(),
            "--persist",
        ],
    ));
    let c2 = Controller::connect(ConnectOptions::tcp("127.0.0.1", port, TEST_NQN))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    drop(c2);
    let cfg = t.dir.0.join("config.yaml");
    let bak = t.dir.0.join("config.yaml.bak");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains(&format!("port: {port}")), "{text}");
    assert!(!std::fs::read_to_string(&bak)
        .unwrap()
        .contains(&port.to_string()));
    let check = Command::new(target_bin())
        .arg("--check-config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    // A file namespace grows: the file is extended and the host sees the new size; shrinking
    // is refused.
    let img = d.0.join("grow.img");
    ok(&ctl(
        &sock,
        &[
            "add-namespace",
            TEST_NQN,
            "--nsid",
            "3",
            "--path",
            img.to_str().unwrap(),
            "--size",
            "16MiB",
        ],
    ));
    let size_of = |c: &mut Controller, nsid| {
        c.rescan_namespaces()
            .unwrap()
            .iter()
            .find(|n| n.nsid == nsid)
            .map(|n| n.blocks * u64::from(n.block_size))
    };
    assert_eq!(size_of(&mut c, 3), Some(16 << 20));
    ok(&ctl(
        &sock,
        &[
            "resize-namespace",
            TEST_NQN,
            "--nsid",
            "3",
            "--size",
            "48MiB",
        ],
    ));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 48 << 20);
    assert_eq!(size_of(&mut c, 3), Some(48 << 20));
    let shrink = ctl(
        &sock,
        &[
            "resize-namespace",
            TEST_NQN,
            "--nsid",
            "3",
            "--size",
            "8MiB",
        ],
    );
    assert!(String::from_utf8_lossy(&shrink.stderr).contains("would drop data"));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 48 << 20);
    ok(&ctl(&sock, &["remove-namespace", TEST_NQN, "--nsid", "3"]));

    // Removing the namespace again.
    ok(&ctl(&sock, &["remove-namespace", TEST_NQN, "--nsid", "2"]));
    assert_eq!(nsids(&mut c), [1]);

    // The protocol is versioned: another version is refused with a reason.
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.write_all(b"{\"version\":2,\"op\":\"list\"}\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let v: serde_json::Value = serde_json::from_str(answer.trim()).unwrap();
    assert_eq!(v["ok"], false);
    assert!(
        v["error"].as_str().unwrap().contains("version 2"),
        "{answer}"
    );
}

/// The management story end to end: while a host does verified I/O on the first subsystem,
/// `ctl --persist` adds a subsystem with a file namespace and an allowed host, and a second
/// listener; a second host (that host NQN) connects to the new subsystem through the new
/// listener; a bad request gets a clear error and changes nothing; the rewritten file gives
/// the same configuration after a restart, and the new subsystem serves again.
#[test]
fn ctl_adds_a_subsystem_under_load_and_persists_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let _serial = serial();
    let (d, sock, mut t) = start("ctl-load");
    // Verified I/O on the first subsystem the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let port = t.addr.port();
    let load = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut c =
                Controller::connect(ConnectOptions::tcp("127.0.0.1", port, TEST_NQN)).unwrap();
            let mut ns = c.open_namespace(1).unwrap();
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) || rounds < 50 {
                let off = (rounds % 256) * 65536;
                let data = vec![(rounds % 251) as u8 + 1; 65536];
                ns.write_at(&data, off).unwrap();
                let mut back = vec![0u8; 65536];
                ns.read_at(&mut back, off).unwrap();
                assert!(back == data, "round {rounds}: read back differs");
                rounds += 1;
            }
            rounds
        })
    };
    let new_nqn = "nqn.2026-11.io.nvmf-rs:ctl-added";
    let o2 = ConnectOptions::tcp("127.0.0.1", 0, new_nqn);
    let (host_nqn, hostid) = (o2.hostnqn.clone(), o2.hostid);
    let img = d.0.join("added.img");
    let port2 = free_port();
    let p2 = port2.to_string();
    for args in [
        vec!["add-subsystem", new_nqn, "--persist"],
        vec![
            "add-namespace",
            new_nqn,
            "--nsid",
            "1",
            "--path",
            img.to_str().unwrap(),
            "--size",
            "32MiB",
            "--persist",
        ],
        vec!["add-host", new_nqn, &host_nqn, "--persist"],
        vec!["add-listener", "tcp", "127.0.0.1", &p2, "--persist"],
    ] {
        ok(&ctl(&sock, &args));
    }
    // A bad request: a clear error, nothing changes.
    let before = ok(&ctl(&sock, &["list", "--json"]));
    let bad = ctl(
        &sock,
        &["add-host", "nqn.2026-11.io.nvmf-rs:nope", &host_nqn],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("no subsystem nqn.2026-11.io.nvmf-rs:nope")
    );
    assert_eq!(ok(&ctl(&sock, &["list", "--json"])), before);
    // The second host, on the new listener, to the new subsystem.
    let connect_new = |port: u16| {
        let mut o = ConnectOptions::tcp("127.0.0.1", port, new_nqn);
        o.hostnqn = host_nqn.clone();
        o.hostid = hostid;
        let mut c = Controller::connect(o).unwrap();
        let mut ns = c.open_namespace(1).unwrap();
        assert_eq!(ns.size(), 32 << 20);
        ns.write_at(&[0x3c; 4096], 4096).unwrap();
        let mut b = [0u8; 4096];
        ns.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [0x3c; 4096]);
    };
    connect_new(port2);
    stop.store(true, Ordering::Relaxed);
    let rounds = load.join().expect("the first host's verified I/O");
    assert!(rounds >= 50);
    // Restart from the rewritten file: the same configuration, and the new subsystem serves.
    t.terminate();
    t.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline && !ctl(&sock, &["list", "--json"]).status.success()
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let after = ok(&ctl(&sock, &["list", "--json"]));
    let cfg =
        |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap()["config"].clone();
    assert_eq!(
        cfg(&after),
        cfg(&before),
        "the restart runs what was persisted"
    );
    connect_new(port2);
}
