//! The daemon as a service: sd_notify READY=1 once listening, clean exit on SIGTERM.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use nvmf_tests::{default_yaml, TargetProc, TempDir};

#[test]
fn ready_is_sent_after_the_listener_accepts_and_sigterm_exits_zero() {
    let d = TempDir::new("notify");
    let sock_path = d.0.join("notify.sock");
    let rx = UnixDatagram::bind(&sock_path).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut t = TargetProc::start_with_env(
        default_yaml,
        &[("NOTIFY_SOCKET", sock_path.clone().into())],
        &[],
    );
    let mut buf = [0u8; 512];
    let n = rx.recv(&mut buf).expect("a notification");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    assert!(msg.contains("STATUS="), "{msg}");
    // READY came after the listener was up: a connection is accepted now.
    std::net::TcpStream::connect_timeout(&t.addr, Duration::from_secs(2)).expect("listening");
    assert!(
        t.terminate(),
        "exit status 0 after SIGTERM:\n{}",
        t.log_text()
    );
    let n = rx.recv(&mut buf).expect("STOPPING");
    assert_eq!(&buf[..n], b"STOPPING=1");
}

/// The metrics endpoint and `nvmf-target stats` show counters moving during I/O, and the
/// buffers in use return to zero once the host is gone.
#[test]
fn metrics_endpoint_and_stats_command() {
    use std::io::{Read, Write};
    let mport = nvmf_tests::free_port();
    let d = TempDir::new("stats");
    let ctl = d.0.join("control.sock");
    let t = TargetProc::start_with_env(
        |port, dir| {
            format!(
                "{}metrics: {{ listen: \"127.0.0.1:{mport}\" }}\n",
                default_yaml(port, dir)
            )
        },
        &[],
        &["--control-socket".into(), ctl.clone().into()],
    );
    let get = || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", mport)).expect("metrics port");
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    };
    let commands = |text: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with("nvmf_commands_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    let before = get();
    assert!(before.starts_with("HTTP/1.0 200"), "{before}");
    {
        let o = initiator::ConnectOptions::tcp("127.0.0.1", t.addr.port(), nvmf_tests::TEST_NQN);
        let mut c = initiator::Controller::connect(o).unwrap();
        let mut ns = c.open_namespace(1).unwrap();
        let mut buf = vec![0u8; 4096];
        for i in 0..200u64 {
            ns.read_at(&mut buf, i * 4096).unwrap();
        }
        std::thread::sleep(Duration::from_millis(200)); // counters publish every 50 ms
        let during = get();
        assert!(commands(&during) >= commands(&before) + 200, "{during}");
        assert!(during.contains("nvmf_controllers 1"), "{during}");
        c.shutdown().unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = get();
    assert!(after.contains("nvmf_controllers 0"), "{after}");
    for l in after
        .lines()
        .filter(|l| l.starts_with("nvmf_buffers_in_use{"))
    {
        assert!(l.ends_with(" 0"), "buffers not returned: {l}");
    }
    let out = std::process::Command::new(nvmf_tests::target_bin())
        .args(["stats", "--control-socket"])
        .arg(&ctl)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("commands") && table.contains("tcp"),
        "{table}"
    );
    let out = std::process::Command::new(nvmf_tests::target_bin())
        .args(["stats", "--json", "--control-socket"])
        .arg(&ctl)
        .output()
        .unwrap();
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(json.starts_with("{\"controllers\":0,\"cpu_ns\":"), "{json}");
    assert!(
        json.contains("\"pollers\":[{\"transport\":\"tcp\""),
        "{json}"
    );
}
