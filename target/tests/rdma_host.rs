//! The daemon with an RDMA listener on this machine (the build host): without kernel RDMA it
//! must exit with a clear error naming the listener and the missing RDMA, never panic. With
//! RDMA present (e.g. inside the test VM) binding fails instead: the listener's address,
//! 192.0.2.1 (TEST-NET-1), is on no interface of this machine. (127.0.0.1 would not do: with
//! an rxe device present, rdma_cm binds the loopback address.)

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether the kernel exposes any RDMA device.
fn machine_has_rdma() -> bool {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

fn run_target(config: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("nvmf-rdma-host-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("target.yaml");
    std::fs::File::create(&cfg)
        .unwrap()
        .write_all(config.as_bytes())
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvmf-target"))
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nvmf-target starts");
    // A target that keeps running would be a failure too; do not wait forever for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "nvmf-target with an unusable rdma listener is still running after 30 s; \
                 stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    (status.code(), text)
}

#[test]
fn rdma_listener_without_rdma_fails_cleanly() {
    let (code, text) = run_target(
        "listeners:\n  - { transport: rdma, address: 192.0.2.1, port: 4420 }\n\
         subsystems:\n  - nqn: nqn.2026-11.io.nvmf-rs:rdma-host-test\n    allow_any_host: true\n\
         \x20   namespaces:\n      - { nsid: 1, null: 64MiB }\n",
        &[],
    );
    assert_eq!(
        code,
        Some(1),
        "expected a start-up failure (exit 1), output:\n{text}"
    );
    assert!(!text.contains("panicked"), "panic:\n{text}");
    assert!(
        text.contains("nvmf-target: rdma listener 192.0.2.1:4420: "),
        "the error must name the listener:\n{text}"
    );
    if machine_has_rdma() {
        assert!(
            text.contains("rdma_bind_addr failed"),
            "RDMA is present: binding 192.0.2.1 must be what fails:\n{text}"
        );
    } else {
        // librdmacm reports ENODEV from rdma_create_event_channel on a kernel without RDMA.
        assert!(
            text.contains("no usable RDMA on this machine")
                && text.contains("rdma_create_event_channel"),
            "the error must say that there is no RDMA:\n{text}"
        );
    }
}

#[test]
fn rdma_listener_failure_does_not_leave_tcp_running() {
    // A TCP listener next to the failing RDMA one: the daemon must still exit (no half-started
    // target serving TCP only).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let (code, text) = run_target(
        &format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n  \
             - {{ transport: rdma, address: 192.0.2.1, port: 4420 }}\n\
             subsystems:\n  - nqn: nqn.2026-11.io.nvmf-rs:rdma-host-test\n    \
             allow_any_host: true\n    namespaces:\n      - {{ nsid: 1, null: 64MiB }}\n"
        ),
        &[],
    );
    assert_eq!(code, Some(1), "output:\n{text}");
    assert!(!text.contains("panicked"), "panic:\n{text}");
    assert!(text.contains("rdma listener 192.0.2.1:4420"), "{text}");
    assert!(
        !text.contains("nvmf-target ready"),
        "the target must not report ready:\n{text}"
    );
}

#[test]
fn bad_send_with_invalidate_setting_is_refused() {
    // The option is checked before any RDMA call, so the answer is the same with or without
    // RDMA on the machine.
    let (code, text) = run_target(
        "listeners:\n  - { transport: rdma, address: 192.0.2.1, port: 4420 }\n\
         subsystems:\n  - nqn: nqn.2026-11.io.nvmf-rs:rdma-host-test\n    allow_any_host: true\n\
         \x20   namespaces:\n      - { nsid: 1, null: 64MiB }\n",
        &[("NVMF_RDMA_SEND_WITH_INV", "maybe")],
    );
    assert_eq!(code, Some(1), "output:\n{text}");
    assert!(!text.contains("panicked"), "panic:\n{text}");
    assert!(
        text.contains(
            "rdma transport: NVMF_RDMA_SEND_WITH_INV=\"maybe\": expected auto, on or off"
        ),
        "{text}"
    );
}

#[test]
fn rdma_addresses_match_the_machine() {
    let found = nvmf_target::transport::rdma::local_rdma_ipv4();
    if !machine_has_rdma() {
        assert!(found.is_empty(), "no RDMA device, yet {found:?}");
    }
    for a in &found {
        assert!(!a.device.is_empty() && !a.addr.is_unspecified(), "{a:?}");
    }
}
