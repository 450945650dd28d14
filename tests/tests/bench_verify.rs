//! `nvmf-bench --verify=crc32c` against a running `nvmf-target`: a region written with verify
//! headers reads back clean; a byte flipped in the namespace's backing file behind the
//! target's back (the target reads with O_DIRECT, so no stale cache hides it) is reported at
//! its block's offset and fails the run.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use nvmf_tests::TargetProc;

/// Flip one byte of the namespace's backing file.
fn corrupt(t: &TargetProc, at: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.dir.0.join("ns1.img"))
        .expect("namespace file");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, at).unwrap();
    f.sync_all().unwrap();
}

const REGION: &[&str] = &["--bs=4k", "--size=1m", "--offset=1m", "--iodepth=8"];

#[test]
fn verify_passes_clean_data_and_catches_a_flipped_byte() {
    let t = TargetProc::start_default();
    fn args(rw: &str) -> Vec<&str> {
        [&[rw, "--verify=crc32c"][..], REGION].concat()
    }

    // One pass of writes, then the write job's own read-back pass.
    let (out, text) = t.run_bench(&args("--rw=write"));
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("verify: 256 blocks checked, 0 mismatches"),
        "{text}"
    );

    // Separate read runs, sequential and random, check every block they read.
    for rw in ["--rw=read", "--rw=randread"] {
        let (out, text) = t.run_bench(&args(rw));
        assert!(out.status.success(), "{rw}: {text}");
        assert!(
            text.contains("verify: 256 blocks checked, 0 mismatches"),
            "{rw}: {text}"
        );
    }

    // Block 37 of the region: namespace offset 1 MiB + 37 * 4 KiB; flip byte 100 of it.
    let block = (1 << 20) + 37 * 4096u64;
    corrupt(&t, block + 100);
    let (out, text) = t.run_bench(&args("--rw=read"));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("verify: 256 blocks checked, 1 mismatches"),
        "{text}"
    );
    let want = format!("offset {block} ({block:#x}): crc32c mismatch");
    assert!(text.contains(&want), "expected {want:?}:\n{text}");
    assert!(
        text.contains("first bad byte at block offset 100"),
        "{text}"
    );
    // Reported on stderr too (where it lands with --output-format=json).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&want), "{stderr}");

    // Blocks outside the region were never written with verify: reading them says so.
    let (out, text) = t.run_bench(&[
        "--rw=read",
        "--verify=crc32c",
        "--bs=4k",
        "--size=8k",
        "--offset=8m",
    ]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("no verify header"), "{text}");
}

#[test]
fn verify_with_mixed_time_based_writes_and_several_jobs() {
    let t = TargetProc::start_default();
    // Two jobs on disjoint 1 MiB regions, random reads and writes for a second: every read of
    // a block this run wrote must carry its latest generation, and the final read-back pass
    // checks every written block.
    let (out, text) = t.run_bench(&[
        "--rw=randrw",
        "--rwmixread=50",
        "--bs=4k",
        "--size=1m",
        "--numjobs=2",
        "--offset_increment=1m",
        "--iodepth=16",
        "--runtime=1",
        "--verify=crc32c",
    ]);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" 0 mismatches"), "{text}");
    let checked: u64 = text
        .split("verify: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no verify line:\n{text}"));
    assert!(checked > 0, "{text}");

    // Overlapping job regions cannot be verified: refused before any I/O.
    let (out, text) = t.run_bench(&["--rw=randwrite", "--numjobs=2", "--verify=crc32c"]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("must not overlap"), "{text}");
}

/// Every send through the poller's io_uring ring (`tcp_send: io_uring`, one poller for four
/// connections, so passes send for several of them in one enter; 128 KiB reads leave partial
/// sends): written data reads back intact, and the metrics count the ring's sends.
#[test]
fn sends_through_io_uring_keep_every_block() {
    let mport = nvmf_tests::free_port();
    let t = TargetProc::start_with(|port, dir| {
        format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
             subsystems:\n  - nqn: {}\n    allow_any_host: true\n    namespaces:\n      \
             - {{ nsid: 1, path: {}/ns1.img, size: 64MiB }}\n\
             target: {{ threads: 1, tcp_send: io_uring }}\n\
             metrics: {{ listen: \"127.0.0.1:{mport}\" }}\n",
            nvmf_tests::TEST_NQN,
            dir.display()
        )
    });
    for bs in ["--bs=4k", "--bs=128k"] {
        let args = [
            "--rw=randrw",
            bs,
            "--verify=crc32c",
            "--numjobs=4",
            "--size=4m",
            "--offset_increment=4m",
            "--iodepth=16",
            "--runtime=2",
        ];
        let (out, text) = t.run_bench(&args);
        assert!(out.status.success(), "{bs}: {text}");
        assert!(text.contains(" 0 mismatches"), "{bs}: {text}");
    }
    std::thread::sleep(std::time::Duration::from_millis(200)); // counters publish every 50 ms
    let m = nvmf_tests::get_metrics(mport);
    let sum = |name: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with(name))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    let (sends, enters) = (
        sum("nvmf_tcp_ring_sends_total{"),
        sum("nvmf_tcp_ring_send_enters_total{"),
    );
    // Every response went out through the ring: thousands in 4 s of I/O.
    assert!(sends > 1_000.0, "{m}");
    assert!(enters > 0.0 && enters <= sends, "{m}");
}
