//! In-band authentication (DH-HMAC-CHAP) end to end over NVMe/TCP loopback: our initiator
//! against the real `nvmf-target`. Every hash and the null, ffdhe2048 and ffdhe3072 groups
//! authenticate the admin queue and both I/O queues, which then carry I/O; a wrong host key, a
//! wrong controller key and no key fail fast naming the step, and the target logs why without
//! a key; `--check-config` redacts inline keys; a SIGHUP rotates a key file without dropping a
//! connected controller; `nvmf-bench --dhchap-secret[-file]` and fio with the nvmf engine
//! (`dhchap_secret`, `dhchap_ctrl_secret`) authenticate every queue. At
//! trace level both sides log the same messages (known-answer vectors), never a key.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use initiator::{ConnectOptions, Controller, DhchapOptions, Error};
use nvme::auth::{HashId, Secret};
use nvmf_tests::{target_bin, TargetProc, TempDir, TEST_NQN};

/// Host with its secret in a key file (mode 0600); host-to-controller authentication only.
const H_FILE: &str = "nqn.2026-11.io.nvmf-rs:auth-file";
/// Host with inline secrets, host and controller: bidirectional authentication.
const H_INLINE: &str = "nqn.2026-11.io.nvmf-rs:auth-inline";
/// Subsystems restricted to one hash and one DH group each; `TEST_NQN` takes SHA-512 with
/// ffdhe3072 (the bench and the reload test use it).
const S_SHA256: &str = "nqn.2026-11.io.nvmf-rs:auth-sha256";
const S_SHA384: &str = "nqn.2026-11.io.nvmf-rs:auth-sha384";

/// A `DHHC-1` secret of `len` key bytes derived from `seed` (deterministic), with the given
/// transformation.
fn key(seed: u8, len: usize, transform: Option<HashId>) -> String {
    let bytes: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(37) ^ seed).collect();
    Secret::from_key(&bytes, transform)
        .unwrap()
        .to_text()
        .to_string()
}

/// The key file's secret, before and after the rotation.
fn file_key() -> String {
    key(0x11, 32, None)
}
fn rotated_key() -> String {
    key(0x22, 32, Some(HashId::Sha256))
}
/// The inline host's secret and the controller's.
fn inline_key() -> String {
    key(0x33, 48, Some(HashId::Sha384))
}
fn ctrl_key() -> String {
    key(0x44, 64, Some(HashId::Sha512))
}
/// A key the target does not have for anyone.
fn wrong_key() -> String {
    key(0x55, 32, None)
}

/// Every key text the tests use: none may appear in a log or an output.
fn all_keys() -> Vec<String> {
    vec![
        file_key(),
        rotated_key(),
        inline_key(),
        ctrl_key(),
        wrong_key(),
    ]
}

#[track_caller]
fn assert_no_key(what: &str, text: &str) {
    for k in all_keys() {
        // The base64 body alone (a key could be quoted without its prefix).
        let body = &k["DHHC-1:00:".len()..k.len() - 1];
        assert!(!text.contains(body), "{what} holds a key:\n{text}");
    }
    assert!(!text.contains("DHHC-1:0"), "{what} holds a key:\n{text}");
}

/// The key file in `dir`, mode 0600, holding `text`.
fn write_key_file(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("host-file.key");
    std::fs::write(&p, format!("{text}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// The configuration: three keyed subsystems (one hash and one DH group each, a 16 MiB file
/// namespace each), both hosts on each; the key file is written into `dir`.
fn yaml(port: u16, dir: &Path) -> String {
    let key_file = write_key_file(dir, &file_key());
    let mut s = format!(
        "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
         target: {{ threads: 2, keep_alive_ms_min: 1000 }}\nsubsystems:\n"
    );
    for (i, (nqn, hash, group)) in [
        (S_SHA256, "sha256", "null"),
        (S_SHA384, "sha384", "ffdhe2048"),
        (TEST_NQN, "sha512", "ffdhe3072"),
    ]
    .into_iter()
    .enumerate()
    {
        s += &format!(
            "  - nqn: {nqn}\n    allow_any_host: false\n    hosts:\n      \
             - {{ nqn: \"{H_FILE}\", dhchap_key_file: {} }}\n      \
             - {{ nqn: \"{H_INLINE}\", dhchap_key: \"{}\", dhchap_ctrl_key: \"{}\" }}\n    \
             dhchap_hashes: [{hash}]\n    dhchap_dhgroups: [{group}]\n    namespaces:\n      \
             - {{ nsid: 1, path: {}/ns{i}.img, size: 16MiB }}\n",
            key_file.display(),
            inline_key(),
            ctrl_key(),
            dir.display()
        );
    }
    s
}

fn opts(
    t: &TargetProc,
    subnqn: &str,
    host: &str,
    keys: Option<(&str, Option<&str>)>,
) -> ConnectOptions {
    let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), subnqn);
    o.hostnqn = host.into();
    o.queues = 2;
    o.timeout = Duration::from_secs(5);
    o.dhchap = keys.map(|(h, c)| DhchapOptions::new(h, c).unwrap());
    o
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed ^ (i >> 9) as u8)
        .collect()
}

/// Write, read back and compare 8 blocks through every I/O queue of `c`.
#[track_caller]
fn io_on_every_queue(c: &mut Controller, seed: u8) {
    let queues = c.io_queues_left();
    assert_eq!(queues, 2, "two I/O queues");
    for q in 0..queues {
        let mut ns = c.open_namespace(1).expect("a namespace per I/O queue");
        let data = pattern(seed ^ q as u8, 8 * 4096);
        let at = (q as u64) << 20;
        ns.write_at(&data, at).unwrap();
        let mut back = vec![0u8; data.len()];
        ns.read_at(&mut back, at).unwrap();
        assert!(back == data, "I/O queue {q}: read back what was written");
    }
}

/// A connect that must fail: its authentication error's queue and step, within 5 s.
#[track_caller]
fn refused(o: ConnectOptions) -> (u16, &'static str, String) {
    let started = Instant::now();
    let e = match Controller::connect(o) {
        Ok(_) => panic!("the connect must be refused"),
        Err(e) => e,
    };
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "refused after {took:?}: {e}");
    match e {
        Error::Auth { qid, step, detail } => (qid, step, detail),
        e => panic!("not an authentication error: {e}"),
    }
}

/// Each hash and each of the null, ffdhe2048 and ffdhe3072 groups: the admin queue and two I/O
/// queues authenticate (bidirectionally for the inline host) and carry I/O.
#[test]
fn every_hash_and_group_authenticates_every_queue() {
    let t = TargetProc::start_with(yaml);
    let (fk, ik, ck) = (file_key(), inline_key(), ctrl_key());
    let cases = [
        (
            S_SHA256,
            H_FILE,
            (fk.as_str(), None),
            "hash=sha256 dhgroup=null",
        ),
        (
            S_SHA384,
            H_INLINE,
            (ik.as_str(), Some(ck.as_str())),
            "hash=sha384 dhgroup=ffdhe2048",
        ),
        (
            TEST_NQN,
            H_INLINE,
            (ik.as_str(), Some(ck.as_str())),
            "hash=sha512 dhgroup=ffdhe3072",
        ),
    ];
    for (i, (subnqn, host, keys, negotiated)) in cases.into_iter().enumerate() {
        let mut c = Controller::connect(opts(&t, subnqn, host, Some(keys)))
            .unwrap_or_else(|e| panic!("{subnqn} {host}: {e}\n{}", t.log_text()));
        io_on_every_queue(&mut c, i as u8);
        c.shutdown().unwrap();
        // Admin queue and both I/O queues.
        let log = t.log_text();
        let n = log
            .lines()
            .filter(|l| l.contains("host authenticated") && l.contains(negotiated))
            .count();
        assert_eq!(n, 3, "{negotiated}: three queues authenticated:\n{log}");
    }
    assert_no_key("the target's log", &t.log_text());
}

/// A host entry with a controller key, and a host that authenticates only itself (nvme-cli's
/// `--dhchap-secret` without `--dhchap-ctrl-secret`): every queue authenticates one way and
/// carries I/O, as with nvmet 6.12; with a wrong host key it is still refused.
#[test]
fn a_host_may_authenticate_one_way_to_an_entry_with_a_controller_key() {
    let t = TargetProc::start_with(yaml);
    let (ik, wk) = (inline_key(), wrong_key());
    let mut c = Controller::connect(opts(&t, S_SHA384, H_INLINE, Some((&ik, None))))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    io_on_every_queue(&mut c, 7);
    c.shutdown().unwrap();
    let log = t.log_text();
    let n = log
        .lines()
        .filter(|l| l.contains("host authenticated") && l.contains("bidirectional=false"))
        .count();
    assert_eq!(n, 3, "three queues authenticated one way:\n{log}");
    let (qid, step, detail) = refused(opts(&t, S_SHA384, H_INLINE, Some((&wk, None))));
    assert_eq!((qid, step), (0, "reply"), "{detail}");
}

/// A wrong host key, a wrong controller key and no key: each fails quickly naming the queue and
/// the step; the target logs the failure (or the host that left without authenticating), never
/// a key.
#[test]
fn wrong_or_missing_keys_are_refused_quickly() {
    let t = TargetProc::start_with(yaml);
    let (wk, ik) = (wrong_key(), inline_key());

    // The controller refuses the host's response (its Failure1).
    let (qid, step, detail) = refused(opts(&t, S_SHA384, H_FILE, Some((&wk, None))));
    assert_eq!((qid, step), (0, "reply"), "{detail}");
    t.wait_log("authentication failed", 1);

    // The host refuses the controller's response: the controller has another key.
    let (qid, step, detail) = refused(opts(&t, S_SHA384, H_INLINE, Some((&ik, Some(&wk)))));
    assert_eq!((qid, step), (0, "success1"), "{detail}");
    t.wait_log("authentication failed", 2);

    // No key at all: the Connect response asks for authentication.
    let (qid, step, detail) = refused(opts(&t, S_SHA256, H_FILE, None));
    assert_eq!((qid, step), (0, "connect"), "{detail}");
    let log = t.wait_log("closed the queue without authenticating", 1);

    for (what, text) in [("an error", detail), ("the target's log", log)] {
        assert_no_key(what, &text);
    }
}

/// `nvmf-target --check-config` shows inline keys (and the key file's) as `<secret>`.
#[test]
fn check_config_redacts_the_keys() {
    let d = TempDir::new("auth-check");
    let cfg = d.0.join("config.yaml");
    std::fs::write(&cfg, yaml(4420, &d.0)).unwrap();
    let out = Command::new(target_bin())
        .arg("--check-config")
        .arg(&cfg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("<secret>"), "{stdout}");
    assert!(!stdout.contains("DHHC-1"), "{stdout}");
    assert_no_key("--check-config", &format!("{stdout}{stderr}"));
}

/// A new key in the key file and a SIGHUP: the connected controller keeps doing I/O; a new
/// connection with the old key is refused, with the new key it authenticates.
#[test]
fn a_reload_rotates_a_key_file() {
    let t = TargetProc::start_with(yaml);
    let (old, new) = (file_key(), rotated_key());
    let mut c = Controller::connect(opts(&t, S_SHA384, H_FILE, Some((&old, None))))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let mut ns = c.open_namespace(1).unwrap();
    let data = pattern(7, 4 * 4096);
    ns.write_at(&data, 0).unwrap();

    write_key_file(&t.dir.0, &new);
    t.sighup();
    t.wait_log("reload applied", 1);

    let mut back = vec![0u8; data.len()];
    ns.read_at(&mut back, 0)
        .expect("the authenticated controller keeps its queues");
    assert!(back == data);
    ns.write_at(&pattern(8, 4096), 1 << 20).unwrap();
    c.keep_alive().unwrap();

    let (qid, step, detail) = refused(opts(&t, S_SHA384, H_FILE, Some((&old, None))));
    assert_eq!((qid, step), (0, "reply"), "{detail}");
    let mut c2 = Controller::connect(opts(&t, S_SHA384, H_FILE, Some((&new, None))))
        .unwrap_or_else(|e| panic!("the new key: {e}\n{}", t.log_text()));
    io_on_every_queue(&mut c2, 9);
    assert_no_key("the target's log", &t.log_text());
}

/// What a tracing subscriber writes, kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The `msg=` hex of the lines of `log` that contain `what`, sorted.
fn messages(log: &str, what: &str) -> Vec<String> {
    let mut v: Vec<String> = log
        .lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("msg=")))
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

/// At trace level the initiator logs every message it sends and receives, the target every
/// message it receives and sends: the same bytes on both sides (bidirectional, SHA-512 with
/// ffdhe3072, on the admin queue and two I/O queues), and no key on either.
#[test]
fn both_sides_trace_the_same_messages() {
    let t = TargetProc::start_with_env(
        yaml,
        &[("RUST_LOG", "info,nvmf_target::core::auth=trace".into())],
        &[],
    );
    let host_log = Captured::default();
    let writer = host_log.clone();
    let c = {
        use tracing_subscriber::util::SubscriberInitExt;
        let _guard = tracing_subscriber::fmt()
            .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish()
            .set_default();
        let (ik, ck) = (inline_key(), ctrl_key());
        Controller::connect(opts(&t, TEST_NQN, H_INLINE, Some((&ik, Some(&ck)))))
            .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()))
    };
    c.shutdown().unwrap();
    let (host, target) = (host_log.text(), t.log_text());
    let sent = messages(&host, "authentication message to the controller");
    let received = messages(&host, "authentication message from the controller");
    // Negotiate, Reply, Success2 and Challenge, Success1 on each of the three queues.
    assert_eq!((sent.len(), received.len()), (9, 6), "{host}");
    assert_eq!(
        sent,
        messages(&target, "authentication message from the host"),
        "{host}\n{target}"
    );
    assert_eq!(
        received,
        messages(&target, "authentication message to the host"),
        "{host}\n{target}"
    );
    assert_no_key("the initiator's trace", &host);
    assert_no_key("the target's trace", &target);
}

fn bench(t: &TargetProc, args: &[&str]) -> (Output, String) {
    t.bench_verified(args)
}

/// `nvmf-bench` with the inline host's secrets (bidirectional) and with the key file: every
/// queue authenticates (admin and one per job); a wrong secret fails the run without showing it.
#[test]
fn bench_authenticates_every_queue() {
    let t = TargetProc::start_with(yaml);
    let (ik, ck, wk) = (inline_key(), ctrl_key(), wrong_key());
    let host = |h: &str| format!("--hostnqn={h}");

    let (out, text) = bench(
        &t,
        &[
            &host(H_INLINE),
            "--dhchap-secret",
            &ik,
            "--dhchap-ctrl-secret",
            &ck,
        ],
    );
    assert!(out.status.success(), "{text}");
    let inline_ok = format!("host={H_INLINE}");
    let authenticated = |log: &str, host: &str| {
        log.lines()
            .filter(|l| l.contains("host authenticated") && l.contains(host))
            .count()
    };
    assert_eq!(authenticated(&t.log_text(), &inline_ok), 3, "{text}");

    let key_file = t.dir.0.join("host-file.key");
    let (out, text) = bench(
        &t,
        &[
            &host(H_FILE),
            "--dhchap-secret-file",
            key_file.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{text}");
    assert_eq!(
        authenticated(&t.log_text(), &format!("host={H_FILE}")),
        3,
        "{text}"
    );

    let (out, text) = bench(&t, &[&host(H_FILE), "--dhchap-secret", &wk]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("authentication failed on queue 0 at reply"),
        "{text}"
    );
    assert_no_key("nvmf-bench's output", &text);
    assert_no_key("the target's log", &t.log_text());
}

/// fio with the nvmf engine and its `dhchap_secret`/`dhchap_ctrl_secret` options: the size probe
/// (admin queue) and the job's controller (admin and I/O queue) authenticate both ways and the
/// job verifies what it wrote; a wrong secret ends fio with the failure named and no key shown.
#[test]
fn the_fio_engine_authenticates_every_queue() {
    let t = TargetProc::start_with(yaml);
    let (ik, ck, wk) = (inline_key(), ctrl_key(), wrong_key());
    let fio = |secret: &str| {
        let opts = [
            format!("--hostnqn={H_INLINE}"),
            format!("--dhchap_secret={secret}"),
            format!("--dhchap_ctrl_secret={ck}"),
        ];
        nvmf_tests::fio_verified(&t, TEST_NQN, &opts)
    };
    let (ok, text) = fio(&ik);
    assert!(ok, "{text}\n{}", t.log_text());
    let authenticated = t
        .log_text()
        .lines()
        .filter(|l| l.contains("host authenticated") && l.contains(&format!("host={H_INLINE}")))
        .count();
    assert_eq!(
        authenticated, 3,
        "probe admin, job admin and I/O queue\n{text}"
    );

    let (ok, text) = fio(&wk);
    assert!(!ok, "{text}");
    assert!(text.contains("authentication failed on queue 0"), "{text}");
    assert_no_key("fio's output", &text);
    assert_no_key("the target's log", &t.log_text());
}
