//! The cluster stops answering in the middle of verified I/O through an RBD namespace: the
//! OSD is stopped (SIGSTOP) for 10 s and continued. The I/O waits, resumes, and every write
//! the host was told is done reads back (0 mismatches). A test binary of its own: stopping the
//! OSD stalls every client of the cluster, so nothing else may run meanwhile.
//!
//! The test cluster's PGs have a 60 s read lease (scripts/ceph-cluster.sh): Ceph 16 leaves a
//! PG of a replica-less OSD that outlived its 16 s default lease waiting "for readable" for
//! good, and a 10 s stop on a busy machine did that (a write parked in the OSD, never
//! answered: the OSD's own bug, shown by the ops dump this test prints when it fails).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nvmf_tests::ceph::{self, TestImage};
use nvmf_tests::TargetProc;

/// `scripts/ceph-cluster.sh CMD DIR` for the cluster of `conf`.
fn script(cmd: &str, conf: &std::path::Path) -> Command {
    let dir = conf
        .parent()
        .expect("ceph.conf lives in the cluster's directory");
    let mut c = Command::new("bash");
    c.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/ceph-cluster.sh"
    ))
    .arg(cmd)
    .arg(dir);
    c
}

fn cluster(cmd: &str, conf: &std::path::Path) {
    let st = script(cmd, conf).status().expect("scripts/ceph-cluster.sh");
    assert!(st.success(), "ceph-cluster.sh {cmd}");
}

/// What the OSD's operations in flight wait for (each op's description and flag point): where
/// a write that never completed is, if the cluster holds it.
fn osd_ops(conf: &std::path::Path) -> String {
    match script("ops", conf).output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains("\"description\"") || l.contains("\"flag_point\""))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("scripts/ceph-cluster.sh ops: {e}"),
    }
}

/// Continues the OSD if the test ends early, so the cluster is usable afterwards.
struct Continue<'a>(&'a std::path::Path);

impl Drop for Continue<'_> {
    fn drop(&mut self) {
        cluster("osd-cont", self.0);
    }
}

#[test]
fn an_osd_stopped_for_10_s_mid_io_loses_no_acknowledged_write() {
    let Some(conf) = ceph::conf() else { return };
    let img = TestImage::create(&conf, "outage", 64);
    let ns = img.namespace_yaml(1);
    let mut t = TargetProc::start_with(|port, _| ceph::target_yaml(port, &[ns]));
    // 30 s of random verified writes over 16 MiB (each block written many times: a lost or
    // reordered acknowledged write reads back an older generation), then the job's read-back.
    // A write issued as the OSD stops waits for the 10 s stop and then for the OSD to catch
    // up on a machine the test keeps busy: each command may take 90 s (a lost completion
    // still fails the test, at 90 s instead of 30).
    let bench = t
        .bench_command()
        .args([
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--size=16m",
            "--runtime=30",
            "--verify=crc32c",
            "--io_timeout=90",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nvmf-bench");
    std::thread::sleep(Duration::from_secs(8));
    let stopped = Instant::now();
    let guard = Continue(&conf);
    cluster("osd-stop", &conf);
    std::thread::sleep(Duration::from_secs(10));
    drop(guard);
    let stalled = stopped.elapsed();
    let out = bench.wait_with_output().unwrap();
    let text = nvmf_tests::describe(&out, &t.log_text());
    assert!(stalled >= Duration::from_secs(10));
    if !out.status.success() {
        panic!(
            "{text}\n--- the OSD's operations in flight\n{}",
            osd_ops(&conf)
        );
    }
    assert!(text.contains(" 0 mismatches"), "{text}");
    // The stall shows in the latencies: some write waited for the OSD for seconds.
    let max_ms = text
        .lines()
        .find(|l| l.trim_start().starts_with("lat: min="))
        .and_then(|l| l.split("max=").nth(1))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    assert!(
        max_ms.ends_with('s') && !max_ms.ends_with("ms") && !max_ms.ends_with("us"),
        "max latency {max_ms} shows the stall:\n{text}"
    );
    assert!(t.terminate(), "{}", t.log_text());
}
