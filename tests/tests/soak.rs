//! Mixed random read/write soak with verification (issue #8, durability): `nvmf-bench
//! --rw=randrw --verify=crc32c` on two queues against `nvmf-target` over NVMe/TCP loopback for
//! `NVMF_SOAK_SECS` seconds (default 20, the CI run; the documented long run is 600). Every
//! block a read returns is checked against the last write acknowledged for it: the run must
//! end with 0 mismatches, the target still healthy and its log free of errors.
//! (The same soak over NVMe/RDMA runs in the VM suite: `soak-randrw-rdma-*`.)

use std::time::Duration;

use nvmf_tests::TargetProc;

#[test]
fn randrw_verify_soak_has_no_mismatches() {
    let secs: u64 = std::env::var("NVMF_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut t = TargetProc::start_default();
    let runtime = format!("--runtime={secs}");
    let out = t
        .bench_command()
        .args([
            "--rw=randrw",
            "--rwmixread=50",
            "--bs=4k",
            "--iodepth=16",
            "--numjobs=2",
            "--size=24m",
            "--offset_increment=24m",
            "--time_based",
            &runtime,
            "--verify=crc32c",
            "--io_timeout=30",
        ])
        .output()
        .expect("run nvmf-bench");
    let text = nvmf_tests::output_text(&out);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    let verify = text
        .lines()
        .find(|l| l.trim_start().starts_with("verify:"))
        .unwrap_or_else(|| panic!("no verify line: {text}"));
    let checked: u64 = verify
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{verify}"));
    assert!(checked > 0, "the soak checked no blocks: {verify}");
    assert!(verify.ends_with(" 0 mismatches"), "{verify}");
    std::thread::sleep(Duration::from_millis(200));
    let log = t.log_text();
    assert!(
        !log.contains(" ERROR ") && !log.contains("panicked"),
        "target log: {log}"
    );
    assert!(t.terminate(), "the target exits cleanly after the soak");
}
