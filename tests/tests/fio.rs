//! fio with the nvmf engine (`libnvmf_fio.so`) against nvmf-target over NVMe/TCP: the job file
//! the README shows passes crc32c verification on one queue and on two; verification through
//! the engine catches data changed behind its back; bad filenames and unreachable targets are
//! errors that name what is wrong. fio is Debian's (3.33; scripts/setup.sh installs it).

use std::path::Path;
use std::process::{Command, Output};

use initiator::{ConnectOptions, Controller};
use nvmf_tests::{fio_command, fio_engine, fio_filename, output_text, TargetProc, TEST_NQN};

fn run(mut c: Command) -> Output {
    c.output()
        .expect("fio runs (Debian's fio package: scripts/setup.sh installs it)")
}

/// The filename of namespace 1 of `t`'s test subsystem.
fn filename(t: &TargetProc) -> String {
    fio_filename(t.addr.port(), TEST_NQN)
}

/// fio's JSON report (fio may print warnings before it).
fn report(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text
        .find("{\n")
        .unwrap_or_else(|| panic!("no JSON\n{}", output_text(out)));
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("{e}\n{}", output_text(out)))
}

#[test]
fn the_job_file_writes_and_verifies_over_one_queue_and_two() {
    let t = TargetProc::start_default();
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fio/jobs/tcp-verify.fio");
    let mut c = fio_command(&t);
    c.arg(&job)
        .arg("--output-format=json")
        .env("NVMF_TRADDR", "127.0.0.1")
        .env("NVMF_TRSVCID", t.addr.port().to_string())
        .env("NVMF_SUBNQN", TEST_NQN.replace(':', "\\:"));
    let out = run(c);
    assert!(
        out.status.success(),
        "{}\n{}",
        output_text(&out),
        t.log_text()
    );
    let r = report(&out);
    let jobs = r["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 3, "one job, then two: {r}");
    for j in jobs {
        assert_eq!(j["error"], 0, "{j}");
        let (rd, wr) = (&j["read"]["io_bytes"], &j["write"]["io_bytes"]);
        assert!(wr.as_u64().unwrap() > 0 && rd.as_u64().unwrap() > 0, "{j}");
    }
    // The first job wrote 16 MiB at random and read all of it back to verify it.
    assert_eq!(jobs[0]["write"]["io_bytes"], 16 << 20);
    assert_eq!(jobs[0]["read"]["io_bytes"], 16 << 20);
    // queue_stats=1: each job's queue said what it cost. Over NVMe/TCP every payload byte
    // crosses the socket once; a 4 KiB read is copied once more out of the receive buffer, a
    // write leaves from fio's buffer as it is: as many reads as writes make 1.50.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let reports: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("copies per payload byte"))
        .collect();
    assert_eq!(reports.len(), 3, "{stderr}");
    assert!(
        reports[0].contains("1.50 copies per payload byte (socket 1.00, memcpy 0.50)"),
        "{stderr}"
    );
    // The mixed jobs synced (Flush) every 32 writes.
    assert!(
        jobs[1]["sync"]["total_ios"].as_u64().unwrap() > 0,
        "{}",
        jobs[1]
    );
}

#[test]
fn verification_through_the_engine_catches_a_block_changed_behind_it() {
    let t = TargetProc::start_default();
    let name = filename(&t);
    let job = |extra: &[&str]| {
        let mut c = fio_command(&t);
        c.args([
            "--name=v",
            "--thread=1",
            "--rw=write",
            "--bs=4k",
            "--size=1m",
            "--iodepth=8",
            "--verify=crc32c",
        ])
        .arg(format!("--ioengine=external:{}", fio_engine().display()))
        .arg(format!("--filename={name}"))
        .args(extra);
        run(c)
    };
    let out = job(&["--do_verify=0"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let out = job(&["--verify_only=1"]);
    assert!(
        out.status.success(),
        "an untouched namespace verifies\n{}",
        output_text(&out)
    );

    // Another host zeroes block 16 (64 KiB in).
    let mut ctrl = Controller::connect(ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let mut ns = ctrl.open_namespace(1).unwrap();
    ns.write_at(&[0u8; 4096], 64 << 10).unwrap();
    drop(ns);
    ctrl.shutdown().unwrap();

    let out = job(&["--verify_only=1"]);
    let text = output_text(&out);
    assert!(
        !out.status.success(),
        "the zeroed block went unnoticed\n{text}"
    );
    assert!(
        text.contains("verify: bad magic header") || text.contains("verify failed"),
        "{text}"
    );
    assert!(
        text.contains("65536"),
        "fio names the block at 64 KiB\n{text}"
    );
}

#[test]
fn bad_filenames_and_unreachable_targets_are_named() {
    let t = TargetProc::start_default();
    let port = t.addr.port();
    let nqn = TEST_NQN.replace(':', "\\:");
    for (name, want) in [
        (
            format!("trtype=tcp traddr=127.0.0.1 trsvcid={port} ns=1"),
            "no subnqn=".to_string(),
        ),
        (
            format!("trtype=tcp traddr=127.0.0.1 trsvcid={port} subnqn={nqn} ns=7"),
            "namespace 7 is not active (active: 1)".to_string(),
        ),
        (
            format!(
                "trtype=tcp traddr=127.0.0.1 trsvcid={port} subnqn=nqn.2026-11.io.nvmf-rs\\:none"
            ),
            "Connect failed".to_string(),
        ),
        (
            format!(
                "trtype=tcp traddr=127.0.0.1 trsvcid={} subnqn={nqn}",
                nvmf_tests::free_port()
            ),
            "Connection refused".to_string(),
        ),
        (
            format!("trtype=tcp traddr=127.0.0.1 trsvcid={port} subnqn={nqn} lun=1"),
            "unknown key 'lun'".to_string(),
        ),
    ] {
        let mut c = fio_command(&t);
        // Engine options follow --ioengine (fio parses in order).
        c.arg(format!("--ioengine=external:{}", fio_engine().display()))
            .args([
                "--name=bad",
                "--thread=1",
                "--rw=read",
                "--size=64k",
                "--io_timeout_ms=5000",
            ])
            .arg(format!("--filename={name}"));
        let out = run(c);
        let text = output_text(&out);
        assert!(!out.status.success(), "{name}: fio succeeded\n{text}");
        assert!(text.contains(&want), "{name}: no '{want}'\n{text}");
    }
}

/// `polling=interrupt`: the job's queue sleeps through every wait (a write, a poll and a read
/// per command, as `queue_stats` counts them); a bad value is named.
#[test]
fn the_polling_option_reaches_the_queue() {
    let t = TargetProc::start_default();
    let run = |polling: &str| {
        let mut c = fio_command(&t);
        c.arg(format!("--ioengine=external:{}", fio_engine().display()))
            .args([&format!("--polling={polling}"), "--queue_stats=1"])
            .args([
                "--name=p",
                "--thread=1",
                "--rw=randread",
                "--bs=4k",
                "--size=1m",
            ])
            .arg(format!("--filename={}", filename(&t)));
        run(c)
    };
    let out = run("interrupt");
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    let per: f64 = text
        .lines()
        .find_map(|l| {
            let (head, _) = l.split_once(" system calls per command")?;
            head.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no queue_stats line\n{text}"));
    assert!(per <= 3.5, "{per} system calls per command\n{text}");
    let out = run("sometimes");
    let text = output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("polling=sometimes: adaptive, busy or interrupt"),
        "{text}"
    );
}
