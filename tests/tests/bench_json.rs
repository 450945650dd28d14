//! `nvmf-bench` against a running `nvmf-target`: the JSON report of a 4k random read run at
//! depth 32 parses, carries the documented schema, and its numbers are consistent.
//!
//! Needs `nvmf-bench` and `nvmf-target` built in the same profile (`cargo build --workspace`).

use serde_json::Value;
use std::process::Output;

use nvmf_tests::{TargetProc, TEST_NQN};

fn bench(t: &TargetProc, args: &[&str]) -> Output {
    t.bench_command()
        .args(args)
        .output()
        .expect("run nvmf-bench")
}

fn assert_latency_ordered(l: &Value) {
    let k = ["min", "p50", "p90", "p99", "p99_9", "max"].map(|k| l[k].as_f64().unwrap());
    assert!(k[0] > 0.0, "{l:?}");
    assert!(
        k.windows(2).all(|w| w[0] <= w[1]),
        "percentiles out of order: {l:?}"
    );
    let mean = l["mean"].as_f64().unwrap();
    assert!(k[0] <= mean && mean <= k[5], "{l:?}");
}

#[test]
fn randread_qd32_json_report() {
    let t = TargetProc::start_default();
    let out = bench(
        &t,
        &[
            "--rw=randread",
            "--bs=4k",
            "--iodepth=32",
            "--runtime=2",
            "--output-format=json",
            "--compare",
            "tcp,rdma",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "nvmf-bench failed ({}):\n{stdout}\n{stderr}\ntarget log:\n{}",
        out.status,
        t.log_text()
    );
    let v = serde_json::from_str::<Value>(&stdout).unwrap_or_else(|e| panic!("{e}:\n{stdout}"));
    assert_eq!(v["schema"].as_str().unwrap(), "nvmf-bench/1");
    assert_eq!(v["target"]["subnqn"].as_str().unwrap(), TEST_NQN);
    let w = &v["workloads"][0];
    assert_eq!(w["rw"].as_str().unwrap(), "randread");
    assert_eq!(w["bs"].as_f64().unwrap(), 4096.0);
    assert_eq!(w["iodepth"].as_f64().unwrap(), 32.0);
    assert_eq!(w["runtime_s"].as_f64().unwrap(), 2.0);
    let results = &w["results"];
    assert_eq!(results.as_array().unwrap().len(), 2);

    let tcp = &results[0];
    assert_eq!(tcp["transport"].as_str().unwrap(), "tcp");
    assert_eq!(tcp["status"].as_str().unwrap(), "ok", "{tcp:?}");
    let elapsed = tcp["elapsed_s"].as_f64().unwrap();
    assert!((1.9..2.5).contains(&elapsed), "measured window {elapsed}");
    assert_eq!(tcp["region_bytes"].as_f64().unwrap(), (64u64 << 20) as f64);
    let total = &tcp["total"];
    let read = &tcp["read"];
    let ios = total["ios"].as_f64().unwrap();
    assert!(
        ios > 0.0 && total["iops"].as_f64().unwrap() > 0.0,
        "{total:?}"
    );
    assert_eq!(
        read["ios"].as_f64().unwrap(),
        ios,
        "a pure read run: every I/O is a read"
    );
    assert_eq!(tcp["write"]["ios"].as_f64().unwrap(), 0.0);
    assert_eq!(tcp["write"]["lat_ns"], Value::Null);
    assert_eq!(total["bytes"].as_f64().unwrap(), ios * 4096.0);
    let iops = total["iops"].as_f64().unwrap();
    assert!(
        (iops - ios / elapsed).abs() < 1.0,
        "{iops} vs {ios}/{elapsed}"
    );
    assert!((total["mib_s"].as_f64().unwrap() - iops * 4096.0 / 1048576.0).abs() < 0.01);
    assert_latency_ordered(&total["lat_ns"]);
    // Little's law: with 32 in flight the mean latency is about 32 / IOPS.
    let mean_s = total["lat_ns"]["mean"].as_f64().unwrap() / 1e9;
    let little = 32.0 / iops;
    assert!(
        mean_s > little * 0.5 && mean_s < little * 1.5,
        "mean latency {mean_s}s vs 32/IOPS {little}s"
    );
    let cpu = &tcp["cpu"];
    assert!(cpu["usec_per_io"].as_f64().unwrap() > 0.0, "{cpu:?}");
    // Over TCP every payload byte crosses the socket at least once.
    let copies = &tcp["copies"];
    assert!(
        copies["socket_per_byte"].as_f64().unwrap() >= 0.999,
        "{copies:?}"
    );
    assert!(copies["per_byte"].as_f64().unwrap() >= copies["socket_per_byte"].as_f64().unwrap());
    // The queue makes system calls (sends, receives, waits), but batches them at depth 32.
    let sys = tcp["syscalls_per_io"].as_f64().unwrap();
    assert!(sys > 0.0 && sys < 8.0, "syscalls per I/O {sys}");
    assert_eq!(tcp["verify"], Value::Null);

    // This target listens on TCP only: RDMA never produces numbers here; it says why.
    let rdma = &results[1];
    assert_eq!(rdma["transport"].as_str().unwrap(), "rdma");
    let status = rdma["status"].as_str().unwrap();
    assert!(status == "skipped" || status == "failed", "{rdma:?}");
    assert!(!rdma["reason"].as_str().unwrap().is_empty());
    assert_eq!(rdma["total"], Value::Null);
    let no_device = std::fs::read_dir("/sys/class/infiniband").map_or(true, |d| d.count() == 0);
    if no_device {
        assert_eq!(status, "skipped");
        assert!(
            rdma["reason"].as_str().unwrap().contains("no RDMA device"),
            "{rdma:?}"
        );
    }
}

#[test]
fn text_report_table_baseline_and_plot() {
    let t = TargetProc::start_default();
    let plot = t.dir.0.join("cdf.svg");
    let plot_arg = format!("--latency-plot={}", plot.display());
    let out = bench(
        &t,
        &[
            "--rw=randrw",
            "--rwmixread=70",
            "--bs=8k",
            "--iodepth=4",
            "--numjobs=2",
            "--runtime=1",
            "--ramp_time=0.2",
            "--raw-tcp-baseline",
            &plot_arg,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}:\n{stdout}\n{stderr}", out.status);
    for want in [
        "8k randrw qd4 70%r x2 [tcp]",
        "  read: IOPS=",
        "  write: IOPS=",
        "lat percentiles: p50=",
        "cpu: usr=",
        "copies: ",
        "raw-tcp stream: 2 connection(s)",
        "raw-tcp ping-pong: 2 connection(s) x depth 4, 72-byte request, 8192-byte reply",
        "workload",
        "p99.9",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
    let svg = std::fs::read_to_string(&plot).expect("plot written");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(
        svg.matches("<path").count(),
        2,
        "tcp and raw-tcp curves:\n{svg}"
    );
    assert!(svg.contains("log scale"));
}

#[test]
fn bad_options_are_usage_errors() {
    let t = TargetProc::start_default();
    for (args, want) in [
        (&["--bs=3000"][..], "multiple"),
        (&["--size=65m"][..], "beyond the namespace"),
        (&["--iodepth=4096"][..], "queue depth"),
        (&["--nsid=7"][..], "namespace 7 is not active"),
    ] {
        let out = bench(&t, &[&["--runtime=1"][..], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(want),
            "{args:?}: expected {want:?} in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = bench(&t, &["--time_based"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--runtime"));
}
