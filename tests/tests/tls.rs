//! NVMe/TCP over TLS 1.3 with pre-shared keys, end to end over loopback: our initiator against
//! the real `nvmf-target`. This host's kernel has no `tls` module, so both sides run the
//! records in user space here (kernel TLS is tested in the VM). Both identity forms connect
//! and carry verified I/O on every queue; a wrong key, a host without a key and a plain
//! connection to a `tls: required` listener are refused; a listener with `tls: allowed` takes
//! both; the discovery log says which listener wants TLS; handshakes that never finish tie up
//! nothing but their own sockets; secure channel concatenation keys every queue with a PSK
//! the admin queue's DH-HMAC-CHAP negotiated.

use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use initiator::{
    ConfiguredPsk, ConnectOptions, Controller, DhchapOptions, IdentityVersion, TlsOptions,
};
use nvmf_tests::{TargetProc, TEST_NQN};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6a1f3c2e-1b4d-4e5f-8a9b-0c1d2e3f4a5b";
const HOST_384: &str = "nqn.2014-08.org.nvmexpress:uuid:6a1f3c2e-1b4d-4e5f-8a9b-0c1d2e3f4a5c";
const NO_KEY_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6a1f3c2e-1b4d-4e5f-8a9b-0c1d2e3f4a5d";

fn psk(seed: u8, len: usize) -> ConfiguredPsk {
    let k: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(13) ^ seed).collect();
    ConfiguredPsk::from_key(&k).unwrap()
}

/// One subsystem, a 16 MiB file namespace; HOST's key in a 0600 file, HOST_384's inline
/// (SHA-384), NO_KEY_HOST allowed without a key.
fn yaml(tls: &str) -> impl FnOnce(u16, &Path) -> String + '_ {
    move |port, dir| {
        let file = dir.join("host.psk");
        std::fs::write(&file, psk(1, 32).to_text().as_str()).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port}, tls: {tls} }}\n\
             subsystems:\n  - nqn: {TEST_NQN}\n    hosts:\n      \
             - {{ nqn: \"{HOST}\", tls_psk_file: {} }}\n      \
             - {{ nqn: \"{HOST_384}\", tls_psk: \"{}\" }}\n      \
             - \"{NO_KEY_HOST}\"\n    \
             namespaces:\n      - {{ nsid: 1, path: {}/ns.img, size: 16MiB }}\n",
            file.display(),
            psk(2, 48).to_text().as_str(),
            dir.display()
        )
    }
}

fn opts(
    t: &TargetProc,
    host: &str,
    key: Option<(ConfiguredPsk, IdentityVersion)>,
) -> ConnectOptions {
    let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    o.hostnqn = host.into();
    o.queues = 2;
    o.timeout = Duration::from_secs(5);
    o.tls = key.map(|(psk, identity)| TlsOptions { psk, identity });
    o
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 11) as u8)
        .collect()
}

/// Writes, reads back and compares 4 KiB and 128 KiB through every I/O queue.
#[track_caller]
fn verified_io(c: &mut Controller, seed: u8) {
    for q in 0..c.io_queues_left() {
        let mut ns = c.open_namespace(1).expect("a namespace per I/O queue");
        for (i, len) in [4096usize, 128 * 1024].into_iter().enumerate() {
            let data = pattern(seed ^ q as u8 ^ i as u8, len);
            let at = ((q as u64) << 22) + ((i as u64) << 20);
            ns.write_at(&data, at).unwrap();
            let mut back = vec![0u8; len];
            ns.read_at(&mut back, at).unwrap();
            assert!(
                back == data,
                "queue {q}, {len} bytes: read back what was written"
            );
        }
    }
}

/// A connect that must fail: its error.
#[track_caller]
fn refused(o: ConnectOptions, what: &str) -> initiator::Error {
    match Controller::connect(o) {
        Ok(_) => panic!("{what}"),
        Err(e) => e,
    }
}

#[test]
fn both_identities_and_both_hashes_carry_verified_io_on_every_queue() {
    let t = TargetProc::start_with(yaml("required"));
    for (i, (host, key, v)) in [
        (HOST, psk(1, 32), IdentityVersion::V0),
        (HOST, psk(1, 32), IdentityVersion::V1),
        (HOST_384, psk(2, 48), IdentityVersion::V1),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = Controller::connect(opts(&t, host, Some((key, v))))
            .unwrap_or_else(|e| panic!("{host} {v:?}: {e}\n{}", t.log_text()));
        verified_io(&mut c, i as u8);
        c.shutdown().unwrap();
    }
    let log = t.log_text();
    // Admin and two I/O queues each time; user-space records on this kernel.
    let up: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("TLS channel up"))
        .collect();
    assert_eq!(up.len(), 9, "{log}");
    assert!(up.iter().any(|l| l.contains("NVMe0R01")), "{log}");
    assert!(up.iter().any(|l| l.contains("NVMe1R01")), "{log}");
    assert!(
        up.iter()
            .any(|l| l.contains("NVMe1R02") && l.contains("TLS_AES_256_GCM_SHA384")),
        "{log}"
    );
    assert!(!log.contains("NVMeTLSkey"), "no key in the log");
}

#[test]
fn wrong_keys_missing_keys_and_plain_connections_are_refused() {
    let mport = nvmf_tests::free_port();
    let t = TargetProc::start_with(|port, dir| {
        format!(
            "{}metrics: {{ listen: \"127.0.0.1:{mport}\" }}\n",
            yaml("required")(port, dir)
        )
    });
    let started = Instant::now();
    let e = refused(
        opts(&t, HOST, Some((psk(9, 32), IdentityVersion::V1))),
        "a wrong key must be refused",
    );
    assert!(e.to_string().contains("TLS"), "{e}");
    t.wait_log("PSK digest is not the configured key's", 1);
    // A v0 identity carries no digest: the wrong key fails the handshake's binder check.
    let e = refused(
        opts(&t, HOST, Some((psk(9, 32), IdentityVersion::V0))),
        "a wrong key must be refused",
    );
    assert!(e.to_string().contains("TLS"), "{e}");
    // A host the subsystem knows, but without a key.
    let e = refused(
        opts(&t, NO_KEY_HOST, Some((psk(1, 32), IdentityVersion::V0))),
        "a host without a key must be refused",
    );
    assert!(e.to_string().contains("TLS"), "{e}");
    t.wait_log("has no tls_psk", 1);
    // Plain NVMe/TCP to a listener that requires TLS.
    let e = refused(
        opts(&t, NO_KEY_HOST, None),
        "a plain connection must be refused",
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refusals are quick: {e}"
    );
    t.wait_log("TLS handshake failed", 4);
    assert!(!t.log_text().contains("NVMeTLSkey"));
    // One good connection: its three queues count as user-space records on this kernel.
    let c = Controller::connect(opts(&t, HOST, Some((psk(1, 32), IdentityVersion::V1))))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    c.shutdown().unwrap();
    let m = nvmf_tests::get_metrics(mport);
    assert!(
        m.contains("nvmf_tls_connections_total{records=\"user\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("nvmf_tls_connections_total{records=\"kernel\"} 0"),
        "{m}"
    );
    // The four refusals (and the harness's probe of the port, which closes at once).
    let refused: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("nvmf_tls_handshakes_failed_total{reason=\"refused\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(refused >= 4, "{m}");
}

#[test]
fn an_allowed_listener_takes_tls_and_plain_and_discovery_says_so() {
    let t = TargetProc::start_with(yaml("allowed"));
    let mut c = Controller::connect(opts(&t, HOST, Some((psk(1, 32), IdentityVersion::V1))))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    verified_io(&mut c, 7);
    let mut p = Controller::connect(opts(&t, NO_KEY_HOST, None))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    verified_io(&mut p, 8);
    c.shutdown().unwrap();
    p.shutdown().unwrap();
    let log = t.log_text();
    assert_eq!(log.matches("TLS channel up").count(), 3, "{log}");
    // Discovery (plain, on the allowed listener): TREQ not required, TSAS TLS 1.3.
    let entries = initiator::discover("127.0.0.1", t.addr.port(), NO_KEY_HOST).unwrap();
    let e = entries.iter().find(|e| e.subnqn == TEST_NQN).unwrap();
    assert_eq!(e.treq & 3, nvme::log::treq::NOT_REQUIRED);
    assert_eq!(e.tsas[0], nvme::log::tsas::TCP_SECTYPE_TLS13);
    // Over TLS on a required listener: TREQ required.
    let r = TargetProc::start_with(yaml("required"));
    let mut o = opts(&r, HOST, Some((psk(1, 32), IdentityVersion::V0)));
    o.subnqn = "nqn.2014-08.org.nvmexpress.discovery".into();
    o.queues = 0;
    let entries = initiator::discover_with(&o).unwrap_or_else(|e| panic!("{e}\n{}", r.log_text()));
    let e = entries.iter().find(|e| e.subnqn == TEST_NQN).unwrap();
    assert_eq!(e.treq & 3, nvme::log::treq::REQUIRED);
    assert_eq!(e.tsas[0], nvme::log::tsas::TCP_SECTYPE_TLS13);
}

/// 200 connections that send nothing, or half a ClientHello, and stay: a host with a key
/// still connects at once and runs verified I/O (the handshakes wait on the acceptor, not on
/// a poller); the stalled ones are dropped after the handshake timeout (10 s).
#[test]
fn a_handshake_flood_ties_up_nothing_but_its_sockets() {
    let t = TargetProc::start_with(yaml("required"));
    let mut flood = Vec::new();
    for i in 0..200 {
        let mut s = TcpStream::connect(t.addr).unwrap();
        if i % 2 == 1 {
            // A TLS record header that promises 512 bytes, and 10 of them.
            s.write_all(&[0x16, 3, 1, 2, 0, 1, 0, 1, 252, 3, 3, 0, 0, 0, 0])
                .unwrap();
        }
        flood.push(s);
    }
    let started = Instant::now();
    let mut c = Controller::connect(opts(&t, HOST, Some((psk(1, 32), IdentityVersion::V1))))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    verified_io(&mut c, 3);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "connect and I/O took {took:?} during the flood"
    );
    c.shutdown().unwrap();
    t.wait_log("TLS handshake not finished in time", 200);
    drop(flood);
}

/// `nvmf-bench --tls-psk-file` (and `--tls-psk` with the v0 identity): every queue of the run
/// (admin and one per job) goes over TLS and the verify passes; a wrong key fails the run
/// without showing the key.
#[test]
fn bench_runs_every_queue_over_tls() {
    let t = TargetProc::start_with(yaml("required"));
    let run = |extra: &[&str]| {
        let host = format!("--hostnqn={HOST}");
        let (out, text) = t.bench_verified(&[&[host.as_str()], extra].concat());
        (out.status.success(), text)
    };
    let file = t.dir.0.join("host.psk");
    let (ok, text) = run(&["--tls-psk-file", file.to_str().unwrap()]);
    assert!(ok, "{text}\n{}", t.log_text());
    assert_eq!(t.log_text().matches("NVMe1R01").count(), 3, "{text}");
    let key = psk(1, 32).to_text();
    let (ok, text) = run(&["--tls-psk", key.as_str(), "--tls-identity", "0"]);
    assert!(ok, "{text}");
    assert_eq!(t.log_text().matches("TLS channel up").count(), 6, "{text}");
    let wrong = psk(7, 32).to_text();
    let (ok, text) = run(&["--tls-psk", wrong.as_str()]);
    assert!(!ok, "a wrong key must fail the run: {text}");
    assert!(
        !text.contains(wrong.as_str()) && !text.contains(key.as_str()),
        "{text}"
    );
}

/// fio with the nvmf engine's `tls_psk` option: the size probe and the job's admin and I/O
/// queues run over TLS (3 channels) and the job verifies what it wrote; a wrong key ends fio
/// without showing a key.
#[test]
fn the_fio_engine_runs_every_queue_over_tls() {
    let t = TargetProc::start_with(yaml("required"));
    let fio = |key: &str| {
        let opts = [format!("--hostnqn={HOST}"), format!("--tls_psk={key}")];
        nvmf_tests::fio_verified(&t, TEST_NQN, &opts)
    };
    let key = psk(1, 32).to_text();
    let (ok, text) = fio(key.as_str());
    assert!(ok, "{text}\n{}", t.log_text());
    assert_eq!(t.log_text().matches("TLS channel up").count(), 3, "{text}");
    let wrong = psk(7, 32).to_text();
    let (ok, text) = fio(wrong.as_str());
    assert!(!ok, "a wrong key must fail the job: {text}");
    assert!(
        !text.contains(wrong.as_str()) && !text.contains(key.as_str()),
        "{text}"
    );
}

/// `nvmf-target ctl set-tls-psk` rotates a host's key on the running target: the controller
/// connected with the old key keeps doing I/O, a new connection with the old key is refused,
/// the new key connects; `ctl list` shows the key as `<secret>`.
#[test]
fn ctl_rotates_a_key_and_live_connections_keep_theirs() {
    let dir = nvmf_tests::TempDir::new("tls-ctl");
    let sock = dir.0.join("ctl.sock");
    let t = TargetProc::start_with_env(
        yaml("required"),
        &[],
        &["--control-socket".into(), sock.clone().into()],
    );
    let ctl = |args: &[&str]| {
        std::process::Command::new(nvmf_tests::target_bin())
            .arg("ctl")
            .arg("--control-socket")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap()
    };
    let mut old = Controller::connect(opts(&t, HOST, Some((psk(1, 32), IdentityVersion::V1))))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let newkey = dir.0.join("new.psk");
    std::fs::write(&newkey, psk(4, 32).to_text().as_str()).unwrap();
    std::fs::set_permissions(&newkey, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = ctl(&[
        "set-tls-psk",
        TEST_NQN,
        HOST,
        "--file",
        newkey.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success() && err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&newkey, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = ctl(&[
        "set-tls-psk",
        TEST_NQN,
        HOST,
        "--file",
        newkey.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    verified_io(&mut old, 5);
    refused(
        opts(&t, HOST, Some((psk(1, 32), IdentityVersion::V1))),
        "the old key must be refused after the rotation",
    );
    let mut new = Controller::connect(opts(&t, HOST, Some((psk(4, 32), IdentityVersion::V0))))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    verified_io(&mut new, 6);
    let listed = String::from_utf8_lossy(&ctl(&["list"]).stdout).to_string();
    assert!(
        listed.contains("tls_psk_file") && !listed.contains("NVMeTLSkey"),
        "{listed}"
    );
    old.shutdown().unwrap();
    new.shutdown().unwrap();
}

/// A `DHHC-1` secret from `seed`.
fn dhchap_key(seed: u8) -> String {
    let bytes: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ seed).collect();
    nvme::auth::Secret::from_key(&bytes, None)
        .unwrap()
        .to_text()
        .to_string()
}

/// Secure channel concatenation (issue #38, item 5), ours against ours: the admin queue's
/// DH-HMAC-CHAP (one way and both ways) negotiates a TLS PSK, and the admin queue again and
/// every I/O queue run over TLS with it, with no configured PSK anywhere. A wrong host key, a
/// listener without `tls` and a made-up generated identity are refused.
#[test]
fn secure_channel_concatenation_keys_every_queue_from_the_authentication() {
    let plain_port = nvmf_tests::free_port();
    let mport = nvmf_tests::free_port();
    let (host_key, ctrl_key) = (dhchap_key(0x21), dhchap_key(0x22));
    let t = TargetProc::start_with(|port, dir| {
        format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port}, tls: allowed }}\n  \
             - {{ transport: tcp, address: 127.0.0.1, port: {plain_port} }}\n\
             metrics: {{ listen: \"127.0.0.1:{mport}\" }}\n\
             subsystems:\n  - nqn: {TEST_NQN}\n    hosts:\n      \
             - {{ nqn: \"{HOST}\", dhchap_key: \"{host_key}\", dhchap_ctrl_key: \"{ctrl_key}\" }}\n    \
             namespaces:\n      - {{ nsid: 1, path: {}/ns.img, size: 16MiB }}\n",
            dir.display()
        )
    });
    let concat = |port: u16, key: &str, ctrl: Option<&str>| {
        let mut o = ConnectOptions::tcp("127.0.0.1", port, TEST_NQN);
        o.hostnqn = HOST.into();
        o.queues = 2;
        o.timeout = Duration::from_secs(5);
        o.dhchap = Some(DhchapOptions::new(key, ctrl).unwrap());
        o.concat = true;
        o
    };
    for (i, ctrl) in [None, Some(ctrl_key.as_str())].into_iter().enumerate() {
        let mut c = Controller::connect(concat(t.addr.port(), &host_key, ctrl))
            .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
        verified_io(&mut c, 20 + i as u8);
        c.shutdown().unwrap();
    }
    let log = t.log_text();
    let generated = log
        .lines()
        .filter(|l| l.contains("TLS PSK generated"))
        .count();
    assert_eq!(generated, 2, "a key per connect:\n{log}");
    // Each connect: the admin queue and two I/O queues over TLS keyed by the generated PSK.
    let up: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("TLS channel up"))
        .collect();
    assert_eq!(up.len(), 6, "{log}");
    assert!(
        up.iter().all(|l| l.contains("NVMe1G02")),
        "SHA-384, the strongest a TLS suite has:\n{log}"
    );
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("host authenticated"))
            .count(),
        2,
        "only the plain admin queues authenticate:\n{log}"
    );

    // A wrong host key; a listener that takes no TLS (nothing could follow there).
    let e = refused(
        concat(t.addr.port(), &dhchap_key(0x99), None),
        "a wrong host key must be refused",
    );
    assert!(matches!(e, initiator::Error::Auth { .. }), "{e}");
    let e = refused(
        concat(plain_port, &host_key, None),
        "concatenation through a listener without tls must be refused",
    );
    assert!(e.to_string().contains("concatenation mismatch"), "{e}");
    // A generated identity this target never made: the handshake finds no key.
    let psk = [7u8; 32];
    let forged = tls::PskIdentity::generated(nvme::auth::HashId::Sha256, HOST, TEST_NQN, &psk);
    let cfg = tls::ClientConfig::with_identity(forged.clone(), forged.tls_psk(&psk)).unwrap();
    let sock = TcpStream::connect(t.addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut h = tls::Handshake::new(sock, tls::Session::client(&cfg).unwrap());
    let until = Instant::now() + Duration::from_secs(5);
    let done = loop {
        match h.step() {
            Ok(true) => break true,
            Ok(false) if Instant::now() < until => {}
            Ok(false) | Err(_) => break false,
        }
    };
    assert!(!done, "a made-up generated identity must be refused");
    t.wait_log("no such generated PSK", 1);

    let m = nvmf_tests::get_metrics(mport);
    assert!(
        m.contains("nvmf_tls_connections_total{records=\"user\"} 6"),
        "{m}"
    );
    // nvmf-bench --concat: the run's admin queue and its two jobs' queues over a new key.
    let (out, text) =
        t.bench_verified(&["--hostnqn", HOST, "--dhchap-secret", &host_key, "--concat"]);
    assert!(out.status.success(), "{text}\n{}", t.log_text());
    let log = t.log_text();
    assert_eq!(log.matches("TLS PSK generated").count(), 3, "{text}");
    assert_eq!(log.matches("TLS channel up").count(), 9, "{text}");
    for k in [&host_key, &ctrl_key] {
        let body = &k["DHHC-1:00:".len()..k.len() - 1];
        assert!(
            !log.contains(body) && !text.contains(body),
            "a key in the output"
        );
    }
}
