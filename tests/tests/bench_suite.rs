//! `nvmf-bench --suite` with a tiny runtime: it starts nvmf-target (1 then 2 threads) itself,
//! runs the whole matrix and prints one table. Checks the table's structure and that every
//! measured number is there and non-zero; no speed is asserted (benchmarks are not timed
//! tests).

use std::process::Command;

use nvmf_tests::{bench_bin, target_bin};

const WORKLOADS: [&str; 6] = [
    "4k randread qd1",
    "4k randread qd32",
    "4k randwrite qd1",
    "4k randwrite qd32",
    "128k read qd8",
    "128k write qd8",
];

/// The number in a cell such as "12.3k", "40.1us", "1.04ms", "154%", "2.16x".
fn value(cell: &str) -> f64 {
    let (num, mult) = [
        ("us", 1e3),
        ("ms", 1e6),
        ("ns", 1.0),
        ("s", 1e9),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("%", 1.0),
        ("x", 1.0),
    ]
    .iter()
    .find_map(|(suf, m)| cell.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((cell, 1.0));
    num.parse::<f64>()
        .unwrap_or_else(|_| panic!("{cell:?} is not a number"))
        * mult
}

#[test]
fn suite_prints_the_whole_matrix_with_baselines_and_goals() {
    target_bin(); // --suite starts the target next to the bench: both must be built
    let dir = nvmf_tests::TempDir::new("suite");
    let out = Command::new(bench_bin())
        .args(["--suite", "--runtime=300ms", "--suite-dir"])
        .arg(&dir.0)
        .output()
        .expect("run nvmf-bench --suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{}:\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let h = lines
        .iter()
        .position(|l| l.starts_with("workload "))
        .unwrap_or_else(|| panic!("no table header in:\n{stdout}"));
    let header: Vec<&str> = lines[h].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "workload", "thr", "path", "IOPS", "MiB/s", "p50", "p99", "CPU/IO", "tgt", "CPU/IO",
            "tgt", "cmds", "%stream", "p50/pp", "%uring"
        ],
        "{stdout}"
    );
    // The first three columns are left-aligned: they start where their header starts. The
    // others are right-aligned: a cell ends where its header ends and starts after the
    // previous column's end.
    let col = |name: &str| lines[h].find(name).unwrap();
    let (thr_at, path_at) = (col("thr"), col("path"));
    let cell = |line: &str, from: usize, to: usize| -> String {
        line.get(from.min(line.len())..to.min(line.len()))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let numeric = [
        "IOPS",
        "MiB/s",
        "p50",
        "p99",
        "CPU/IO",
        "tgt CPU/IO",
        "tgt cmds",
        "%stream",
        "p50/pp",
        "%uring",
    ];
    let mut ends = Vec::new();
    for n in numeric {
        let from = ends.last().copied().unwrap_or(0);
        ends.push(from + lines[h][from..].find(n).unwrap() + n.len());
    }
    let right = |line: &str, name: &str| -> String {
        let i = numeric.iter().position(|n| *n == name).unwrap();
        if i == 0 {
            let end = ends[0].min(line.len());
            line[..end]
                .split_whitespace()
                .last()
                .unwrap_or("")
                .to_string()
        } else {
            cell(line, ends[i - 1], ends[i])
        }
    };
    let rows: Vec<&str> = lines[h + 1..]
        .iter()
        .take_while(|l| !l.trim().is_empty())
        .copied()
        .collect();
    // Per thread count and workload: tcp null, tcp tmpfs file, raw-tcp stream, raw-tcp
    // ping-pong, io_uring local.
    assert_eq!(rows.len(), 2 * WORKLOADS.len() * 5, "{stdout}");
    let mut workload = "";
    for (i, r) in rows.iter().enumerate() {
        let name = cell(r, 0, thr_at);
        if !name.is_empty() {
            workload = WORKLOADS
                .iter()
                .find(|w| **w == name)
                .unwrap_or_else(|| panic!("unknown workload {name:?}:\n{stdout}"));
        }
        assert_eq!(WORKLOADS[(i / 5) % WORKLOADS.len()], workload, "{r}");
        let threads = if i < rows.len() / 2 { "1" } else { "2" };
        assert_eq!(cell(r, thr_at, path_at), threads, "{r}");
        // The path column is as wide as its longest entry; the IOPS cell follows it after
        // two blanks at least (path names have single blanks).
        let path_iops = cell(r, path_at, ends[0]);
        let path = path_iops
            .rsplit_once("  ")
            .map_or(path_iops.as_str(), |(p, _)| p)
            .trim();
        let expect = [
            "tcp null",
            "tcp tmpfs file",
            "raw-tcp stream",
            "raw-tcp ping-pong",
            if workload.contains("write") {
                "io_uring local wr"
            } else {
                "io_uring local"
            },
        ][i % 5];
        assert_eq!(path, expect, "{r}");
        assert!(!r.contains("ERRORS") && !r.contains("FAILED"), "{r}");
        // Every row has a throughput; latency rows all but the stream.
        let mut need = vec!["IOPS", "MiB/s"];
        if path != "raw-tcp stream" {
            need.extend(["p50", "p99"]);
        }
        if path.starts_with("tcp ") {
            // NVMe rows: both CPU figures, the command count, the ratios to the limits.
            need.extend(["CPU/IO", "tgt CPU/IO", "tgt cmds", "%stream", "p50/pp"]);
            if path == "tcp tmpfs file" {
                need.push("%uring");
            }
        }
        for n in need {
            let c = right(r, n);
            assert!(!c.is_empty(), "{n} missing in row {r:?}:\n{stdout}");
            assert!(value(&c) > 0.0, "{n} = {c:?} in row {r:?}");
        }
    }
    // The goals, each with its ratio.
    let goals = stdout
        .split("goals (issue #6):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no goals in:\n{stdout}"));
    for g in [
        "1. 128k read qd8 null",
        "2. 4k randread qd1 null",
        "3. 4k randread qd32 null",
    ] {
        assert!(
            goals.lines().any(|l| l.trim_start().starts_with(g)),
            "no goal line {g:?}:\n{stdout}"
        );
    }
    // The tmpfs file is gone.
    let left: Vec<_> = std::fs::read_dir(&dir.0).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}
