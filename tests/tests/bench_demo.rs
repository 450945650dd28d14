//! `nvmf-bench --demo`: starts `nvmf-target` (next to nvmf-bench) on its embedded default or
//! a free port, runs the comparison on every transport, prints the table, stops the target
//! and exits 0.

use std::path::Path;
use std::process::Command;

use nvmf_tests::{bench_bin, target_bin};

#[test]
fn demo_runs_the_comparison_and_stops_the_target() {
    target_bin(); // --demo starts the target next to the bench: both must be built
    let out = Command::new(bench_bin())
        .args(["--demo", "--runtime=1"])
        .output()
        .expect("run nvmf-bench --demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{}:\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    // The intro names the target's pid; it must be gone (stopped and reaped).
    let pid: u32 = stdout
        .split("nvmf-target (pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no target pid in:\n{stdout}"));
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "nvmf-target {pid} still running"
    );
    // The table: a header, each workload with a tcp row, RDMA explained, raw TCP rows.
    let table = stdout
        .split("\nworkload ")
        .nth(1)
        .unwrap_or_else(|| panic!("no table in:\n{stdout}"));
    for w in ["4k randread qd1", "4k randread qd32", "128k read qd8"] {
        let row = table
            .lines()
            .find(|l| l.starts_with(w))
            .unwrap_or_else(|| panic!("no {w} row:\n{stdout}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert!(cells.contains(&"tcp"), "{row}");
        assert!(!row.contains("ERRORS"), "{row}");
    }
    // Table rows (the notes under the table name them with a colon).
    let rows = |what: &str| {
        table
            .lines()
            .filter(|l| l.trim_start().starts_with(what) && !l.contains(':'))
            .count()
    };
    assert_eq!(rows("raw-tcp ping-pong"), 3, "{stdout}");
    assert_eq!(rows("raw-tcp stream"), 3, "{stdout}");
    let rdma = table
        .lines()
        .find(|l| l.trim_start().starts_with("rdma: "))
        .unwrap_or_else(|| panic!("no rdma note:\n{stdout}"));
    let no_device = std::fs::read_dir("/sys/class/infiniband").map_or(true, |d| d.count() == 0);
    if no_device {
        assert!(
            rdma.contains("skipped") && rdma.contains("no RDMA device"),
            "{rdma}"
        );
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}
