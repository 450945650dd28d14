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
/// The default configuration with the metrics endpoint on 127.0.0.1:`mport`.
fn with_metrics(port: u16, dir: &std::path::Path, mport: u16) -> String {
    format!(
        "{}metrics: {{ listen: \"127.0.0.1:{mport}\" }}\n",
        default_yaml(port, dir)
    )
}

#[test]
fn metrics_endpoint_and_stats_command() {
    let mport = nvmf_tests::free_port();
    let d = TempDir::new("stats");
    let ctl = d.0.join("control.sock");
    let t = TargetProc::start_with_env(
        |port, dir| with_metrics(port, dir, mport),
        &[],
        &["--control-socket".into(), ctl.clone().into()],
    );
    let get = || nvmf_tests::get_metrics(mport);
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
        // Per namespace, subsystem and controller (read at scrape time, not published).
        let nsl = format!("subsystem=\"{}\",nsid=\"1\"", nvmf_tests::TEST_NQN);
        assert!(
            value(&during, &format!("nvmf_namespace_reads_total{{{nsl}}}")) >= 200.0,
            "{during}"
        );
        assert_eq!(
            value(
                &during,
                &format!("nvmf_namespace_read_bytes_total{{{nsl}}}")
            ),
            value(&during, &format!("nvmf_namespace_reads_total{{{nsl}}}")) * 4096.0
        );
        assert!(
            value(
                &during,
                &format!("nvmf_namespace_latency_seconds_bucket{{{nsl},le=\"+Inf\"}}")
            ) >= 200.0,
            "{during}"
        );
        let ctrl = during
            .lines()
            .find(|l| l.starts_with("nvmf_controller_io_commands_total{"))
            .unwrap_or_else(|| panic!("{during}"));
        assert!(
            ctrl.contains("host=\"nqn.2014-08.org.nvmexpress:uuid:")
                && ctrl.contains("transport=\"tcp\""),
            "{ctrl}"
        );
        // Per queue: the controller's I/O queues, each with its qid.
        let per_queue: f64 = during
            .lines()
            .filter(|l| l.starts_with("nvmf_queue_io_commands_total{") && l.contains(",qid=\""))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        let per_ctrl: f64 = ctrl.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(per_queue >= 200.0, "{during}");
        assert!(per_queue <= per_ctrl, "{during}");
        // The backend's system calls: namespace 1 is a file, so its reads entered io_uring.
        let enters: f64 = during
            .lines()
            .filter(|l| l.starts_with("nvmf_io_uring_enters_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        assert!(enters > 0.0, "no io_uring_enter counted:\n{during}");
        // An I/O error shows up by status.
        // (A Read far beyond the namespace end, sent raw: the library would refuse it.)
        let q = ns.queue().expect("one path");
        let mut sqe = nvme::Sqe::new(nvme::opcode::io::READ, 0);
        sqe.nsid = 1.into();
        sqe.cdw11 = 1.into(); // SLBA 2^32
        q.submit(
            sqe,
            initiator::Data::FromController(vec![0; 4096].into()),
            7,
        )
        .map_err(|e| e.error)
        .unwrap();
        let mut out = Vec::new();
        q.reap(&mut out, 1, Some(Duration::from_secs(5))).unwrap();
        assert!(out[0].result.is_err(), "LBA out of range");
        let after_err = get();
        assert!(
            after_err.lines().any(|l| l.starts_with(&format!(
                "nvmf_subsystem_errors_total{{subsystem=\"{}\",status=",
                nvmf_tests::TEST_NQN
            ))),
            "{after_err}"
        );
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
    let v: serde_json::Value = serde_json::from_str(&json).expect("stats --json is JSON");
    // One entry per poller, each with its TCP counters (no RDMA section: no RDMA listener).
    let p0 = &v["pollers"][0];
    assert_eq!(p0["poller"], 0, "{json}");
    assert!(p0["tcp"]["commands"].as_u64().unwrap() >= 200, "{json}");
    assert!(p0.get("rdma").is_none(), "{json}");
    let s = &v["subsystems"][0];
    assert_eq!(s["nqn"], nvmf_tests::TEST_NQN);
    assert!(
        s["namespaces"][0]["reads"].as_u64().unwrap() >= 200,
        "{json}"
    );
    assert!(
        table.contains("nsid") && table.contains("p99 us"),
        "{table}"
    );
}

/// The value of the series `key` (name and labels, exactly) in Prometheus text (0 if absent).
fn value(text: &str, key: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .map(|v| v.parse().unwrap())
        .unwrap_or(0.0)
}

/// During an nvmf-bench run, the per-namespace counters move between two scrapes.
#[test]
fn metrics_move_during_a_bench_run() {
    let mport = nvmf_tests::free_port();
    let t = TargetProc::start_with(|port, dir| with_metrics(port, dir, mport));
    let get = || nvmf_tests::get_metrics(mport);
    let mut bench = std::process::Command::new(nvmf_tests::bench_bin())
        .args(["--transport", "tcp", "--traddr", "127.0.0.1", "--trsvcid"])
        .arg(t.addr.port().to_string())
        .args([
            "--subnqn",
            nvmf_tests::TEST_NQN,
            "--nsid",
            "1",
            "--rw",
            "randrw",
            "--bs",
            "4k",
        ])
        .args([
            "--iodepth",
            "4",
            "--runtime",
            "4",
            "--output-format",
            "json",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("nvmf-bench");
    let ns = format!("subsystem=\"{}\",nsid=\"1\"", nvmf_tests::TEST_NQN);
    let reads = |m: &str| value(m, &format!("nvmf_namespace_reads_total{{{ns}}}"));
    let writes = |m: &str| value(m, &format!("nvmf_namespace_written_bytes_total{{{ns}}}"));
    // Wait for I/O to start, then two scrapes a second apart.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut first = get();
    while reads(&first) == 0.0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        first = get();
    }
    std::thread::sleep(Duration::from_secs(1));
    let second = get();
    assert!(bench.wait().unwrap().success(), "nvmf-bench failed");
    assert!(
        reads(&second) > reads(&first),
        "reads moved:\n{first}\n---\n{second}"
    );
    assert!(writes(&second) > writes(&first), "written bytes moved");
    let ctrl = |m: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with("nvmf_controller_io_commands_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert!(
        ctrl(&second) > ctrl(&first),
        "per-controller commands moved"
    );
}
