//! One `Namespace` type over a path set: every operation of the block API on each form (one
//! path without reconnection, one path that reconnects, several paths with ANA selection)
//! against the real `nvmf-target` over loopback NVMe/TCP, and what each form does when the
//! target is killed and restarted between two calls.

use std::path::Path;
use std::time::Duration;

use initiator::{
    AnyBuf, AnyQueue, ConnectOptions, Controller, MultipathOptions, Namespace, NsInfo, PathState,
    ReconnectPolicy, ReconnectingQueue, Reconnector,
};
use nvmf_tests::forms::{every_operation, pattern, through_std_io};
use nvmf_tests::{free_port, TargetProc, TEST_NQN};

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

#[test]
fn every_operation_works_on_every_form() {
    let t = TargetProc::start_with(two_listeners);
    for (i, form) in FORMS.into_iter().enumerate() {
        let hostid: [u8; 16] = std::array::from_fn(|k| (k as u8) ^ (0x40 + i as u8));
        let (ctrl, mut ns) = open(&t, form, hostid);
        let base = (i as u64) * (4 << 20);
        every_operation(&mut ns, base, hostid, &format!("{form:?}"));
        let ns = through_std_io(ns, base + (2 << 20), &format!("{form:?}"));
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

/// The asynchronous queue on each form: the plain namespace's own queue
/// (`Namespace::queue`), and `ReconnectingQueue` on one path and on two. QD16 writes of
/// distinct blocks, then reads of them, every buffer checked.
#[test]
fn the_async_queue_works_on_every_form() {
    let t = TargetProc::start_with(two_listeners);
    for (i, form) in FORMS.into_iter().enumerate() {
        let hostid: [u8; 16] = std::array::from_fn(|k| (k as u8) ^ (0x70 + i as u8));
        let o = options(t.addr.port(), hostid);
        let base = 1024 * i as u64;
        match form {
            Form::Plain => {
                let (c, mut ns) = open(&t, form, hostid);
                let info = *ns.info();
                writes_then_reads(form, ns.queue().expect("one path"), &info, base);
                drop(ns);
                c.unwrap().shutdown().unwrap();
            }
            Form::Reconnecting | Form::Multipath => {
                let mut q = if form == Form::Reconnecting {
                    ReconnectingQueue::connect(o, 1, quick_policy()).unwrap()
                } else {
                    let paths = vec![o, options(second_port(&t), hostid)];
                    ReconnectingQueue::multipath(paths, 1, MultipathOptions::default()).unwrap()
                };
                let info = *q.info();
                writes_then_reads(form, &mut q, &info, base);
                assert_eq!(q.paths().len(), if form == Form::Multipath { 2 } else { 1 });
                q.shutdown().unwrap();
            }
        }
    }
}

/// The asynchronous API of a form, as `writes_then_reads` drives it.
trait AsyncForm {
    /// A write of `data` (a read: `None`) of one block at `lba`, value `v`.
    fn put(&mut self, ns: &NsInfo, lba: u64, data: Option<Vec<u8>>, v: u64);
    fn pending(&self) -> usize;
    /// At least one completion into `out` as (value, buffer), each checked for success.
    fn take(&mut self, out: &mut Vec<(u64, Vec<u8>)>);
}

impl AsyncForm for AnyQueue {
    fn put(&mut self, ns: &NsInfo, lba: u64, data: Option<Vec<u8>>, v: u64) {
        let r = match data {
            Some(d) => self.submit_write(ns, lba, AnyBuf::Vec(d), v),
            None => self.submit_read(ns, lba, AnyBuf::Vec(vec![0; ns.block_size as usize]), v),
        };
        r.map_err(|e| e.error).unwrap();
    }
    fn pending(&self) -> usize {
        self.in_flight()
    }
    fn take(&mut self, out: &mut Vec<(u64, Vec<u8>)>) {
        let mut got = Vec::new();
        self.reap(&mut got, 1, None).unwrap();
        for c in got {
            assert!(c.result.is_ok(), "{:?}", c.result);
            let Some(AnyBuf::Vec(v)) = c.buf else {
                panic!("no buffer back")
            };
            out.push((c.user_data, v));
        }
    }
}

impl AsyncForm for ReconnectingQueue {
    fn put(&mut self, ns: &NsInfo, lba: u64, data: Option<Vec<u8>>, v: u64) {
        let r = match data {
            Some(d) => self.submit_write(ns, lba, d, v),
            None => self.submit_read(ns, lba, vec![0; ns.block_size as usize], v),
        };
        r.map_err(|e| e.error).unwrap();
    }
    fn pending(&self) -> usize {
        self.in_flight()
    }
    fn take(&mut self, out: &mut Vec<(u64, Vec<u8>)>) {
        let mut got = Vec::new();
        self.reap(&mut got, 1, None).unwrap();
        for c in got {
            assert!(c.result.is_ok(), "{:?}", c.result);
            out.push((c.user_data, c.buf.unwrap_or_default()));
        }
    }
}

/// 64 one-block writes at QD16 from `base`, all completed, then 64 reads of them: each read
/// (the later completion of its value) holds what was written.
fn writes_then_reads(form: Form, q: &mut impl AsyncForm, ns: &NsInfo, base: u64) {
    let bs = ns.block_size as usize;
    let mut done = Vec::new();
    for write in [true, false] {
        for b in 0..64u64 {
            q.put(ns, base + b, write.then(|| pattern(bs, b as u8)), b);
            while q.pending() >= 16 || (b == 63 && q.pending() > 0) {
                q.take(&mut done);
            }
        }
    }
    assert_eq!(done.len(), 128, "{form:?}");
    for b in 0..64u64 {
        let last = done.iter().rev().find(|(u, _)| *u == b).expect("completed");
        assert_eq!(last.1, pattern(bs, b as u8), "{form:?}: block {b}");
    }
}

/// A controller with two I/O queues behind a `Reconnector` (what nvmf-ublk runs on): the
/// target killed and restarted, both queues fail; two threads ask for queues of a new
/// connection at once, one reconnect serves both, and both queues carry I/O again.
#[test]
fn a_reconnector_brings_every_queue_of_a_controller_back_with_one_reconnect() {
    let mut t = TargetProc::start_with(two_listeners);
    let mut o = options(t.addr.port(), [0x33; 16]);
    o.queues = 2;
    let (rc, qs, _info, ns) = Reconnector::connect(o, 1, quick_policy()).unwrap();
    assert_eq!(qs.len(), 2);
    assert_eq!(rc.generation(), 0);
    let bs = ns.block_size as usize;
    let write_read = |q: &mut initiator::AnyQueue, b: u64| -> Result<(), initiator::Error> {
        let mut done = Vec::new();
        q.submit_write(&ns, b, AnyBuf::Vec(pattern(bs, b as u8)), 1)
            .map_err(|e| e.error)?;
        q.reap(&mut done, 1, None)?;
        done.pop().unwrap().result?;
        q.submit_read(&ns, b, AnyBuf::Vec(vec![0; bs]), 2)
            .map_err(|e| e.error)?;
        q.reap(&mut done, 1, None)?;
        let c = done.pop().unwrap();
        c.result?;
        assert!(matches!(c.buf, Some(AnyBuf::Vec(v)) if v == pattern(bs, b as u8)));
        Ok(())
    };
    let mut qs = qs;
    for (i, q) in qs.iter_mut().enumerate() {
        write_read(q, i as u64).unwrap();
    }
    t.kill_and_restart();
    for (i, q) in qs.iter_mut().enumerate() {
        assert!(
            write_read(q, i as u64).is_err(),
            "queue {i} works across the restart?"
        );
    }
    drop(qs);
    let back: Vec<(u64, initiator::AnyQueue)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2).map(|_| s.spawn(|| rc.queue_again(0))).collect();
        hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    assert!(back.iter().all(|(g, _)| *g == 1), "generations");
    let st = rc.stats();
    assert_eq!(st.reconnects, 1, "{st:?}");
    for (i, (_, mut q)) in back.into_iter().enumerate() {
        write_read(&mut q, 10 + i as u64).unwrap();
    }
    assert_eq!(rc.paths()[0].state, PathState::Connected);
    rc.shutdown().unwrap();
}

/// Two targets exporting the same file as one subsystem (two paths to one namespace, as two
/// controllers of a dual-headed array): a `Reconnector` over both uses the first; the first is
/// killed, and the queue of the next connection is the second target's, with the data written
/// through the first.
#[test]
fn a_reconnector_over_two_paths_moves_to_the_other_when_one_dies() {
    let shared = nvmf_tests::TempDir::new("two-heads");
    let img = shared.0.join("ns.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let yaml = |port: u16, _: &Path| {
        format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
             subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    namespaces:\n      \
             - {{ nsid: 1, path: {} }}\n\
             target: {{ threads: 1, keep_alive_ms_min: 1000 }}\n",
            img.display()
        )
    };
    let mut a = TargetProc::start_with(yaml);
    let b = TargetProc::start_with(yaml);
    let id = [0x44; 16];
    let mut oa = options(a.addr.port(), id);
    oa.queues = 2;
    let paths = vec![oa, options(b.addr.port(), id)];
    let (rc, qs, _info, ns) = Reconnector::connect_paths(paths, 1, quick_policy())
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", a.log_text(), b.log_text()));
    assert_eq!(qs.len(), 2);
    let bs = ns.block_size as usize;
    let mut done = Vec::new();
    let mut q = qs.into_iter().next().unwrap();
    q.submit_write(&ns, 7, AnyBuf::Vec(pattern(bs, 7)), 1)
        .map_err(|e| e.error)
        .unwrap();
    q.reap(&mut done, 1, None).unwrap();
    done.pop().unwrap().result.unwrap();
    let p = rc.paths();
    assert_eq!(
        (p[0].state, p[1].state),
        (PathState::Connected, PathState::Failed)
    );
    a.kill();
    drop(q);
    let (gen, mut q) = rc
        .queue_again(0)
        .unwrap_or_else(|e| panic!("{e}\n{}", b.log_text()));
    assert_eq!(gen, 1);
    let p = rc.paths();
    assert_eq!(p[1].state, PathState::Connected, "{p:?}");
    q.submit_read(&ns, 7, AnyBuf::Vec(vec![0; bs]), 2)
        .map_err(|e| e.error)
        .unwrap();
    q.reap(&mut done, 1, None).unwrap();
    let c = done.pop().unwrap();
    c.result.unwrap();
    assert!(matches!(c.buf, Some(AnyBuf::Vec(v)) if v == pattern(bs, 7)));
    drop(q);
    rc.shutdown().unwrap();
}
