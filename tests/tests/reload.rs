//! SIGHUP reload against the real daemon: a connected host sees an added namespace (AEN and
//! the Changed Namespace List) and can use it; a broken file is rejected with file:line and
//! the service goes on unchanged; a removed namespace answers Invalid Namespace.

use std::path::Path;
use std::time::Duration;

use initiator::{ConnectOptions, Controller};
use nvme::identify::ctrl::OAES_NS_ATTR;
use nvme::log::AsyncEvent;
use nvme::Status;
use nvmf_tests::{TargetProc, TEST_NQN};

/// The configuration with the given namespaces (`nsid`s: 64 MiB files in `dir`).
fn yaml(port: u16, dir: &Path, nsids: &[u32]) -> String {
    let mut s = format!(
        "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
         subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    namespaces:\n"
    );
    for n in nsids {
        s += &format!(
            "      - {{ nsid: {n}, path: {}/ns{n}.img, size: 64MiB }}\n",
            dir.display()
        );
    }
    s + "target: { threads: 2, keep_alive_ms_min: 1000 }\n"
}

fn rewrite(t: &TargetProc, text: &str) {
    std::fs::write(t.dir.0.join("config.yaml"), text).unwrap();
}

fn connect(t: &TargetProc) -> Controller {
    let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    o.queues = 2;
    Controller::connect(o).expect("connect")
}

/// Rescan the controller's namespaces; returns their NSIDs.
fn rescan_nsids(c: &mut Controller) -> Vec<u32> {
    c.rescan_namespaces()
        .unwrap()
        .iter()
        .map(|n| n.nsid)
        .collect()
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..8192u32)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn an_added_namespace_reaches_a_connected_host() {
    let mut t = TargetProc::start_with(|port, dir| yaml(port, dir, &[1]));
    let port = t.addr.port();
    // A short command timeout: an AER must outlive it (it has no deadline).
    let mut o = ConnectOptions::tcp("127.0.0.1", port, TEST_NQN);
    o.queues = 2;
    o.timeout = Duration::from_secs(1);
    let mut c = Controller::connect(o).expect("connect");
    assert_eq!(c.namespaces().len(), 1);
    // As Linux: enable the notice, post an AER.
    c.enable_async_events(OAES_NS_ATTR).unwrap();
    c.submit_async_event_request().unwrap();
    assert_eq!(
        c.wait_async_event(Duration::from_millis(1500)).unwrap(),
        None
    );
    c.keep_alive()
        .expect("the admin queue is fine with an AER outstanding");

    rewrite(&t, &yaml(port, &t.dir.0, &[1, 2]));
    t.sighup();
    let ev = c
        .wait_async_event(Duration::from_secs(10))
        .unwrap()
        .unwrap_or_else(|| panic!("no AEN after the reload:\n{}", t.log_text()));
    assert_eq!(AsyncEvent::decode(ev), AsyncEvent::NS_CHANGED);
    assert_eq!(c.changed_namespaces().unwrap(), vec![2]);
    assert_eq!(
        c.changed_namespaces().unwrap(),
        Vec::<u32>::new(),
        "cleared on read"
    );
    let nsids = rescan_nsids(&mut c);
    assert_eq!(nsids, vec![1, 2]);

    // I/O to the new namespace, and to the old one, works.
    let mut ns2 = c.open_namespace(2).unwrap();
    let data = pattern(2);
    ns2.write_at(&data, 1 << 20).unwrap();
    let mut back = vec![0u8; data.len()];
    ns2.read_at(&mut back, 1 << 20).unwrap();
    assert!(
        back == data,
        "read back what was written to the new namespace"
    );
    let mut ns1 = c.open_namespace(1).unwrap();
    ns1.write_at(&data, 0).unwrap();
    ns1.read_at(&mut back, 0).unwrap();
    assert!(back == data);
    let log = t.wait_log("reload applied", 1);
    assert!(
        !log.contains('\x1b'),
        "no ANSI escapes when stderr is a file"
    );
    drop((ns1, ns2));
    c.shutdown().unwrap();
    // One log line per controller connect and disconnect, with host NQN, transport and address.
    let log = t.wait_log("controller disconnected", 1);
    for what in ["controller connected", "controller disconnected"] {
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(what)).collect();
        assert_eq!(lines.len(), 1, "{what}:\n{log}");
        let l = lines[0];
        assert!(
            l.contains("host=nqn.2014-08.org.nvmexpress:uuid:")
                && l.contains("transport=tcp ")
                && l.contains("peer=127.0.0.1:"),
            "{l}"
        );
    }
    assert!(t.terminate(), "{}", t.log_text());
}

#[test]
fn a_broken_file_is_rejected_and_the_old_configuration_keeps_serving() {
    let t = TargetProc::start_with(|port, dir| yaml(port, dir, &[1]));
    let port = t.addr.port();
    let mut c = connect(&t);
    let mut ns = c.open_namespace(1).unwrap();
    let data = pattern(7);
    ns.write_at(&data, 4096).unwrap();

    // Line 7 carries an invalid size.
    let good = yaml(port, &t.dir.0, &[1, 2]);
    let broken = good.replace("size: 64MiB }\n", "size: sixty }\n");
    assert_ne!(good, broken);
    rewrite(&t, &broken);
    t.sighup();
    let log = t.wait_log("the running configuration is unchanged", 1);
    assert!(
        log.lines()
            .any(|l| l.contains("reload rejected") && l.contains("config.yaml:7:")),
        "the error names file:line:\n{log}"
    );
    // Still serving the old configuration: I/O on NSID 1 works, there is no NSID 2.
    let mut back = vec![0u8; data.len()];
    ns.read_at(&mut back, 4096).unwrap();
    assert!(back == data);
    let nsids = rescan_nsids(&mut c);
    assert_eq!(nsids, vec![1]);
    let mut tp = t;
    assert!(
        matches!(tp.child.try_wait(), Ok(None)),
        "daemon still running"
    );

    // A reload that cannot be applied (a namespace file in a missing directory) also keeps
    // the running configuration.
    let missing = yaml(port, Path::new("/nonexistent/nvmf-rs"), &[1]);
    rewrite(&tp, &missing);
    tp.sighup();
    tp.wait_log("the running configuration is unchanged", 2);
    ns.read_at(&mut back, 4096).unwrap();
    assert!(back == data);
    drop(ns);
    c.shutdown().unwrap();
    assert!(tp.terminate(), "{}", tp.log_text());
}

#[test]
fn a_removed_namespace_answers_invalid_namespace() {
    let mut t = TargetProc::start_with(|port, dir| yaml(port, dir, &[1, 2]));
    let port = t.addr.port();
    let mut c = connect(&t);
    let mut ns2 = c.open_namespace(2).unwrap();
    let mut ns1 = c.open_namespace(1).unwrap();
    let data = pattern(9);
    ns2.write_at(&data, 0).unwrap();

    rewrite(&t, &yaml(port, &t.dir.0, &[1]));
    t.sighup();
    t.wait_log("reload applied", 1);
    let mut back = vec![0u8; data.len()];
    let e = ns2.read_at(&mut back, 0).expect_err("NSID 2 is gone");
    assert_eq!(
        e.status().map(|s| s.code()),
        Some(Status::INVALID_NS.code()),
        "{e}"
    );
    // The other namespace and the controller are fine.
    ns1.write_at(&data, 0).unwrap();
    ns1.read_at(&mut back, 0).unwrap();
    assert!(back == data);
    assert_eq!(c.changed_namespaces().unwrap(), vec![2]);
    drop((ns1, ns2));
    c.shutdown().unwrap();
    assert!(t.terminate(), "{}", t.log_text());
}

#[test]
fn tcp_listeners_come_and_go_and_systemd_hears_of_the_reload() {
    use std::os::unix::net::UnixDatagram;
    let d = nvmf_tests::TempDir::new("reload-notify");
    let sock_path = d.0.join("notify.sock");
    let rx = UnixDatagram::bind(&sock_path).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let extra = nvmf_tests::free_port();
    let t = TargetProc::start_with_env(
        |port, dir| yaml(port, dir, &[1]),
        &[("NOTIFY_SOCKET", sock_path.clone().into())],
        &[],
    );
    let mut t = t;
    let mut buf = [0u8; 512];
    let mut next = || {
        let n = rx.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).to_string()
    };
    assert!(next().contains("READY=1"));
    let port = t.addr.port();
    let with_extra = yaml(port, &t.dir.0, &[1]).replace(
        "subsystems:",
        &format!("  - {{ transport: tcp, address: 127.0.0.1, port: {extra} }}\nsubsystems:"),
    );
    rewrite(&t, &with_extra);
    t.sighup();
    let m = next();
    assert!(
        m.lines().any(|l| l == "RELOADING=1") && m.contains("MONOTONIC_USEC="),
        "{m}"
    );
    let m = next();
    assert!(m.lines().any(|l| l == "READY=1"), "{m}");
    assert!(m.contains("on 2 listener(s)"), "{m}");
    // A controller on the new port.
    let mut o = ConnectOptions::tcp("127.0.0.1", extra, TEST_NQN);
    o.queues = 1;
    let c = Controller::connect(o).expect("connect on the added listener");
    // The original listener goes away; the connection made through it stays.
    let mut first = connect(&t);
    rewrite(&t, &yaml(extra, &t.dir.0, &[1]));
    t.sighup();
    assert!(next().contains("RELOADING=1"));
    assert!(next().contains("READY=1"));
    assert!(
        std::net::TcpStream::connect(t.addr).is_err(),
        "the removed listener refuses connections:\n{}",
        t.log_text()
    );
    first
        .keep_alive()
        .expect("a controller of the removed listener stays");
    let mut ns = first.open_namespace(1).unwrap();
    let mut b = vec![0u8; 4096];
    ns.read_at(&mut b, 0).unwrap();
    drop(ns);
    first.shutdown().unwrap();
    c.shutdown().unwrap();
    assert!(t.terminate(), "{}", t.log_text());
}

#[test]
fn a_grown_backing_file_is_reported_as_changed() {
    let mut t = TargetProc::start_with(|port, dir| yaml(port, dir, &[1]));
    let mut c = connect(&t);
    assert_eq!(c.namespaces()[0].size(), 64 << 20);
    c.enable_async_events(OAES_NS_ATTR).unwrap();
    c.submit_async_event_request().unwrap();
    // Same configuration, but the file is now twice as large.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(t.dir.0.join("ns1.img"))
        .unwrap();
    f.set_len(128 << 20).unwrap();
    t.sighup();
    let ev = c.wait_async_event(Duration::from_secs(10)).unwrap();
    assert_eq!(ev.map(AsyncEvent::decode), Some(AsyncEvent::NS_CHANGED));
    assert_eq!(c.changed_namespaces().unwrap(), vec![1]);
    let ns = c.rescan_namespaces().unwrap();
    assert_eq!(ns[0].size(), 128 << 20);
    let mut n = c.open_namespace(1).unwrap();
    let data = pattern(3);
    n.write_at(&data, (128 << 20) - 8192).unwrap();
    let mut back = vec![0u8; data.len()];
    n.read_at(&mut back, (128 << 20) - 8192).unwrap();
    assert!(back == data, "the new end of the namespace is usable");
    drop(n);
    c.shutdown().unwrap();
    assert!(t.terminate(), "{}", t.log_text());
}

#[test]
fn a_reload_that_cannot_bind_its_second_new_listener_gives_the_first_back() {
    let t = TargetProc::start_with(|port, dir| yaml(port, dir, &[1]));
    let port = t.addr.port();
    let free = nvmf_tests::free_port();
    // Held by someone else: the reload's second new listener cannot bind.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().port();
    let two_more = yaml(port, &t.dir.0, &[1]).replace(
        "subsystems:",
        &format!(
            "  - {{ transport: tcp, address: 127.0.0.1, port: {free} }}\n  \
             - {{ transport: tcp, address: 127.0.0.1, port: {busy} }}\nsubsystems:"
        ),
    );
    rewrite(&t, &two_more);
    t.sighup();
    let log = t.wait_log("the running configuration is unchanged", 1);
    assert!(
        log.lines()
            .any(|l| l.contains("reload rejected") && l.contains(&format!(":{busy}"))),
        "the error names the listener that could not bind:\n{log}"
    );
    // The first new listener was bound, then given back with the failed reload.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", free)).is_err(),
        "port {free} of the rejected reload does not listen:\n{log}"
    );
    drop(taken);
    // The original listener still serves, and the same reload succeeds once the port is free.
    let c = connect(&t);
    t.sighup();
    t.wait_log("reload applied", 1);
    let mut o = ConnectOptions::tcp("127.0.0.1", free, TEST_NQN);
    o.queues = 1;
    let d = Controller::connect(o).expect("connect on the listener added by the second reload");
    c.shutdown().unwrap();
    d.shutdown().unwrap();
    let mut t = t;
    assert!(t.terminate(), "{}", t.log_text());
}
