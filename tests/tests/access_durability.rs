//! Access control and durability against the real `nvmf-target` binary over loopback TCP.

use std::path::Path;

use initiator::discover;
use initiator::{ConnectOptions, Controller};
use nvme::Status;
use nvmf_tests::{TargetProc, TEST_NQN};

const ALLOWED: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const STRANGER: &str = "nqn.2014-08.org.nvmexpress:uuid:99999999-8888-7777-6666-555555555555";
const OPEN_NQN: &str = "nqn.2026-11.io.nvmf-rs:open";

fn acl_yaml(port: u16, dir: &Path) -> String {
    format!(
        "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
         subsystems:\n\
         \x20 - nqn: {TEST_NQN}\n    allow_any_host: false\n    hosts: [ \"{ALLOWED}\" ]\n    namespaces:\n      \
         - {{ nsid: 1, path: {}/ns1.img, size: 16MiB }}\n\
         \x20 - nqn: {OPEN_NQN}\n    allow_any_host: true\n    namespaces:\n      - {{ nsid: 1, null: 16MiB }}\n",
        dir.display()
    )
}

/// A host NQN not in `hosts` is refused at Connect with Connect Invalid Host; the allowed host
/// connects; the discovery log shows each host only the subsystems it may reach.
#[test]
fn hosts_acl_and_discovery_filtering() {
    let t = TargetProc::start_with(acl_yaml);
    let port = t.addr.port();
    let mut o = ConnectOptions::tcp("127.0.0.1", port, TEST_NQN);
    o.hostnqn = STRANGER.into();
    let err = match Controller::connect(o) {
        Ok(_) => panic!("a stranger must be refused"),
        Err(e) => e,
    };
    let st = err
        .status()
        .unwrap_or_else(|| panic!("refusal carries an NVMe status: {err}"));
    assert_eq!(st.code(), Status::CONNECT_INVALID_HOST.code(), "{err}");
    assert!(st.is_dnr(), "{err}");

    let mut o = ConnectOptions::tcp("127.0.0.1", port, TEST_NQN);
    o.hostnqn = ALLOWED.into();
    let ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    ctrl.shutdown().unwrap();

    let subs = |host: &str| -> Vec<String> {
        let mut v: Vec<String> = discover("127.0.0.1", port, host)
            .unwrap_or_else(|e| panic!("discover: {e}"))
            .into_iter()
            .map(|e| e.subnqn)
            .filter(|n| n != nvme::DISCOVERY_NQN)
            .collect();
        v.sort();
        v
    };
    assert_eq!(subs(STRANGER), vec![OPEN_NQN.to_string()]);
    let mut both = vec![OPEN_NQN.to_string(), TEST_NQN.to_string()];
    both.sort();
    assert_eq!(subs(ALLOWED), both);
}

/// Writes acknowledged before a completed Flush survive SIGKILL of the target: a new target
/// process on the same file reads them back.
#[test]
fn flushed_writes_survive_sigkill() {
    let mut t = TargetProc::start_default();
    let img = t.dir.0.join("ns1.img");
    let pattern: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 7 % 251) as u8).collect();
    {
        let o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
        let mut ctrl = Controller::connect(o).unwrap();
        let mut ns = ctrl.open_namespace(1).unwrap();
        for k in 0..8u64 {
            ns.write_at(&pattern, k * (3 << 20)).unwrap();
        }
        ns.flush().unwrap();
        // SIGKILL right after the Flush completed: no shutdown path runs.
        t.child.kill().unwrap();
        t.child.wait().unwrap();
    }
    // Restart on the same file (a second process, a fresh port).
    let t2 = TargetProc::start_with(|port, _dir| {
        format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
             subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    namespaces:\n      \
             - {{ nsid: 1, path: {} }}\n",
            img.display()
        )
    });
    let o = ConnectOptions::tcp("127.0.0.1", t2.addr.port(), TEST_NQN);
    let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t2.log_text()));
    let mut ns = ctrl.open_namespace(1).unwrap();
    let mut back = vec![0u8; pattern.len()];
    for k in 0..8u64 {
        ns.read_at(&mut back, k * (3 << 20)).unwrap();
        assert!(back == pattern, "flushed data lost at {} MiB", k * 3);
    }
}
