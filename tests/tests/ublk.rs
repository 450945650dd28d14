//! nvmf-ublk on this host, whose kernel may have no ublk driver: what it says when it cannot
//! do its job. The device itself (mkfs, mount, fio verify, SIGTERM) is the VM's `ublk-tcp`
//! scenario (Linux 6.12 has ublk_drv).

use std::process::Command;

use nvmf_tests::{free_port, ublk_bin, TargetProc, TEST_NQN};

fn run(args: &[&str]) -> (bool, String) {
    let o = Command::new(ublk_bin())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run nvmf-ublk");
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(!text.contains("panicked"), "{text}");
    (o.status.success(), text)
}

#[test]
fn a_target_that_is_not_there_is_named() {
    let port = free_port().to_string();
    let (ok, text) = run(&[
        "--traddr",
        "127.0.0.1",
        "--trsvcid",
        &port,
        "--subnqn",
        TEST_NQN,
    ]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("nvmf-ublk: tcp 127.0.0.1:{port} {TEST_NQN}:")),
        "{text}"
    );
}

#[test]
fn a_missing_namespace_or_driver_is_a_clear_error() {
    let t = TargetProc::start_default();
    let port = t.addr.port().to_string();
    let (ok, text) = run(&[
        "--traddr",
        "127.0.0.1",
        "--trsvcid",
        &port,
        "--subnqn",
        TEST_NQN,
        "--nsid",
        "9",
    ]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("namespace 9") || text.contains("NSID 9"),
        "{text}"
    );

    if std::path::Path::new("/dev/ublk-control").exists() {
        eprintln!("this kernel has the ublk driver: the missing-driver case is not run here");
        return;
    }
    let (ok, text) = run(&[
        "--traddr",
        "127.0.0.1",
        "--trsvcid",
        &port,
        "--subnqn",
        TEST_NQN,
    ]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("cannot add a ublk device (is ublk_drv loaded, and is this root?)"),
        "{text}"
    );
    drop(t);
}
