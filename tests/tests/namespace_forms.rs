//! One `Namespace` type over a path set: every operation of the block API on each form (one
//! path without reconnection, one path that reconnects, several paths with ANA selection)
//! against the real `nvmf-target` over loopback NVMe/TCP, and what each form does when the
//! target is killed and restarted between two calls.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use initiator::resv::{
    AcquireAction, ChangePtpl, RegisterAction, RegisterCmd, ReleaseAction, ReleaseCmd, ResvType,
};
use initiator::{
    ConnectOptions, Controller, Error, MultipathOptions, Namespace, PathState, ReconnectPolicy,
};
use nvmf_tests::{free_port, resv, TargetProc, TEST_NQN};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    /// `Controller::open_namespace`: one path, no reconnection.
    Plain,
    /// `Namespace::connect`: one path that reconnects.
    Reconnecting,
    /// `Namespace::multipath`: two listeners of the target.
    Multipath,
}

const FORMS: [Form; 3] = [Form::Plain, Form::Reconnecting, Form::Multipath];

/// A target with two NVMe/TCP listeners and a 64 MiB file namespace.
fn two_listeners(port: u16, dir: &Path) -> String {
    let second = free_port();
    format!(
        "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n  \
         - {{ transport: tcp, address: 127.0.0.1, port: {second} }}\n\
         subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    namespaces:\n      \
         - {{ nsid: 1, path: {}/ns1.img, size: 64MiB }}\n\
         target: {{ threads: 2, keep_alive_ms_min: 1000 }}\n",
        dir.display()
    )
}

/// The second listener's port, from the configuration file.
fn second_port(t: &TargetProc) -> u16 {
    let yaml = std::fs::read_to_string(t.dir.0.join("config.yaml")).unwrap();
    let ports: Vec<u16> = yaml
        .lines()
        .filter_map(|l| l.split(", port: ").nth(1))
        .map(|p| {
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().unwrap()
        })
        .collect();
    assert_eq!(ports.len(), 2, "{yaml}");
    ports[1]
}

fn options(port: u16, hostid: [u8; 16]) -> ConnectOptions {
    let mut o = ConnectOptions::tcp("127.0.0.1", port, TEST_NQN);
    o.hostid = hostid;
    o.hostnqn = initiator::hostnqn_for(&hostid);
    o.timeout = Duration::from_secs(5);
    o.kato = Duration::from_secs(5);
    o
}

fn quick_policy() -> ReconnectPolicy {
    ReconnectPolicy {
        max_attempts: 100,
        max_total: Some(Duration::from_secs(30)),
        initial_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(200),
        multiplier: 2.0,
    }
}

/// Namespace 1 in `form`, as host `hostid` (the controller of the plain form is kept with it).
fn open(t: &TargetProc, form: Form, hostid: [u8; 16]) -> (Option<Controller>, Namespace) {
    let o = options(t.addr.port(), hostid);
    match form {
        Form::Plain => {
            let mut c = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
            let ns = c.open_namespace(1).unwrap();
            (Some(c), ns)
        }
        Form::Reconnecting => (None, Namespace::connect(o, 1, quick_policy()).unwrap()),
        Form::Multipath => {
            let paths = vec![o, options(second_port(t), hostid)];
            let opts = MultipathOptions {
                reconnect: ReconnectPolicy {
                    initial_delay: Duration::from_millis(50),
                    max_delay: Duration::from_millis(200),
                    ..ReconnectPolicy::forever()
                },
                ..MultipathOptions::default()
            };
            (None, Namespace::multipath(paths, 1, opts).unwrap())
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Every operation of the block API on `ns`, in the 1 MiB region at `base`.
fn every_operation(ns: &mut Namespace, base: u64, hostid: [u8; 16], form: Form) {
    let bs = ns.block_size() as usize;
    let ctx = |what: &str| format!("{form:?}: {what}");
    let data = pattern(8 * bs, 1);
    let mut back = vec![0u8; 8 * bs];

    // Read and write, with and without FUA; a transfer larger than one command.
    ns.write_at(&data, base)
        .unwrap_or_else(|e| panic!("{form:?}: write: {e}"));
    ns.read_at(&mut back, base)
        .unwrap_or_else(|e| panic!("{form:?}: read: {e}"));
    assert_eq!(back, data, "{}", ctx("read back"));
    let fua = pattern(4 * bs, 2);
    ns.write_fua_at(&fua, base + 8 * bs as u64)
        .unwrap_or_else(|e| panic!("{form:?}: FUA write: {e}"));
    let mut fback = vec![0u8; 4 * bs];
    ns.read_at(&mut fback, base + 8 * bs as u64).unwrap();
    assert_eq!(fback, fua, "{}", ctx("FUA read back"));
    let big = pattern(1 << 20, 3);
    ns.write_at(&big[..(1 << 20) - 64 * bs], base + 64 * bs as u64)
        .unwrap_or_else(|e| panic!("{form:?}: large write: {e}"));

    // Compare: equal, then one byte off.
    assert!(ns
        .compare_at(&data, base)
        .unwrap_or_else(|e| panic!("{form:?}: compare: {e}")));
    let mut off = data.clone();
    off[5] ^= 0xff;
    assert!(!ns
        .compare_at(&off, base)
        .unwrap_or_else(|e| panic!("{form:?}: compare, differing: {e}")));

    // Compare and Write: the pair that matches writes, the one that does not changes nothing.
    let one = &data[..bs];
    let new = pattern(bs, 9);
    assert!(ns
        .compare_and_write(one, &new, base)
        .unwrap_or_else(|e| panic!("{form:?}: CAW: {e}")));
    assert!(!ns
        .compare_and_write(one, &data[bs..2 * bs], base)
        .unwrap_or_else(|e| panic!("{form:?}: CAW, differing: {e}")));
    ns.read_at(&mut back[..bs], base).unwrap();
    assert_eq!(&back[..bs], &new[..], "{}", ctx("CAW read back"));

    // Flush, Write Zeroes (reads back zeroes), deallocate.
    ns.flush()
        .unwrap_or_else(|e| panic!("{form:?}: flush: {e}"));
    ns.write_zeroes(base, 4 * bs as u64)
        .unwrap_or_else(|e| panic!("{form:?}: write zeroes: {e}"));
    ns.read_at(&mut back, base).unwrap();
    assert!(back[..4 * bs].iter().all(|&b| b == 0), "{}", ctx("zeroes"));
    assert_eq!(&back[4 * bs..], &data[4 * bs..], "{}", ctx("after zeroes"));
    ns.trim(&[(base + 4 * bs as u64, 4 * bs as u64)])
        .unwrap_or_else(|e| panic!("{form:?}: deallocate: {e}"));

    // Reservations: register, acquire, report (this host holds it), release, unregister.
    let key = 0x1234_5678 + form as u64;
    resv::register(ns, key).unwrap_or_else(|e| panic!("{form:?}: register: {e}"));
    resv::acquire(ns, AcquireAction::Acquire, ResvType::WriteExclusive, key, 0)
        .unwrap_or_else(|e| panic!("{form:?}: acquire: {e}"));
    let r = ns
        .reservation_report()
        .unwrap_or_else(|e| panic!("{form:?}: report: {e}"));
    assert_eq!(r.rtype, Some(ResvType::WriteExclusive), "{}", ctx("report"));
    assert_eq!(
        r.registrants,
        vec![(hostid, key, true)],
        "{}",
        ctx("report")
    );
    ns.reservation_release(&ReleaseCmd {
        action: ReleaseAction::Release,
        ignore_key: false,
        rtype: ResvType::WriteExclusive as u8,
        crkey: key,
    })
    .unwrap_or_else(|e| panic!("{form:?}: release: {e}"));
    ns.reservation_register(&RegisterCmd {
        action: RegisterAction::Unregister,
        ignore_key: false,
        ptpl: ChangePtpl::NoChange,
        crkey: key,
        nrkey: 0,
    })
    .unwrap_or_else(|e| panic!("{form:?}: unregister: {e}"));
    assert_eq!(ns.reservation_report().unwrap().registrants, vec![]);

    // Errors that are answers, not failures: out of range, unaligned.
    let size = ns.size();
    assert!(matches!(
        ns.read_at(&mut back, size),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        ns.write_at(&data[..bs - 1], base),
        Err(Error::InvalidArgument(_))
    ));
}

/// The `std::io` adapter at unaligned offsets, on any form.
fn through_std_io(ns: Namespace, base: u64, form: Form) -> Namespace {
    let mut io = ns.into_io();
    let bytes = pattern(10_000, 7);
    io.seek(SeekFrom::Start(base + 333)).unwrap();
    io.write_all(&bytes).unwrap();
    io.flush().unwrap();
    io.seek(SeekFrom::Start(base + 333)).unwrap();
    let mut back = vec![0u8; bytes.len()];
    io.read_exact(&mut back).unwrap();
    assert_eq!(back, bytes, "{form:?}: std::io");
    io.into_inner()
}

#[test]
fn every_operation_works_on_every_form() {
    let t = TargetProc::start_with(two_listeners);
    for (i, form) in FORMS.into_iter().enumerate() {
        let hostid: [u8; 16] = std::array::from_fn(|k| (k as u8) ^ (0x40 + i as u8));
        let (ctrl, mut ns) = open(&t, form, hostid);
        let base = (i as u64) * (4 << 20);
        every_operation(&mut ns, base, hostid, form);
        let ns = through_std_io(ns, base + (2 << 20), form);
        // Each form reports its paths the same way.
        let paths = ns.paths();
        let want = if form == Form::Multipath { 2 } else { 1 };
        assert_eq!(paths.len(), want, "{form:?}: {paths:?}");
        assert!(
            paths.iter().all(|p| p.state == PathState::Connected),
            "{form:?}: {paths:?}"
        );
        assert!(ns.is_connected());
        assert_eq!(ns.stats().reconnects, 0, "{form:?}");
        ns.shutdown().unwrap();
        if let Some(c) = ctrl {
            c.shutdown().unwrap();
        }
    }
}

/// The target killed and restarted between two calls: the plain form's call fails (and so do
/// the ones after it), the reconnecting and multipath forms' calls succeed on a new
/// connection and the data written before is there.
#[test]
fn a_target_restart_is_handled_as_each_form_says() {
    let mut t = TargetProc::start_with(two_listeners);
    let mut open_ns: Vec<(Form, Option<Controller>, Namespace)> = FORMS
        .into_iter()
        .enumerate()
        .map(|(i, form)| {
            let hostid: [u8; 16] = std::array::from_fn(|k| (k as u8) ^ (0x50 + i as u8));
            let (c, ns) = open(&t, form, hostid);
            (form, c, ns)
        })
        .collect();
    let bs = open_ns[0].2.block_size() as usize;
    for (i, (_, _, ns)) in open_ns.iter_mut().enumerate() {
        ns.write_at(&pattern(4 * bs, i as u8), (i * 4 * bs) as u64)
            .unwrap();
        ns.flush().unwrap();
    }
    t.kill_and_restart();
    for (i, (form, _, ns)) in open_ns.iter_mut().enumerate() {
        let mut back = vec![0u8; 4 * bs];
        let r = ns.read_at(&mut back, (i * 4 * bs) as u64);
        match form {
            Form::Plain => {
                assert!(r.is_err(), "plain: {r:?}");
                assert!(ns.read_at(&mut back, 0).is_err(), "plain stays failed");
                assert_eq!(ns.paths()[0].state, PathState::Failed);
            }
            _ => {
                r.unwrap_or_else(|e| panic!("{form:?}: {e}\n{}", t.log_text()));
                assert_eq!(back, pattern(4 * bs, i as u8), "{form:?}");
                assert!(ns.stats().reconnects >= 1, "{form:?}: {:?}", ns.stats());
                ns.write_at(&back, (i * 4 * bs) as u64).unwrap();
            }
        }
    }
    for (_, c, ns) in open_ns {
        drop(ns);
        // The plain form's controller lost its connection: its shutdown fails, quickly.
        if let Some(c) = c {
            assert!(c.shutdown().is_err());
        }
    }
}
