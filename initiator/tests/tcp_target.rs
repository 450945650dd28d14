//! The initiator against the real `nvmf-target` binary over loopback NVMe/TCP.
//!
//! Each test starts its own target process on a free port with a generated configuration. The
//! binary must be built in the same target directory and profile (`cargo build -p nvmf-target`
//! before `cargo test -p nvmf-initiator`; `cargo test --workspace` builds it).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nvmf_initiator::{discover, CmdError, ConnectOptions, Controller, Error};

const NQN: &str = "nqn.2026-11.io.nvmf-rs:initiator-test";

struct Target {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Target {
    fn start() -> Target {
        let exe = std::env::current_exe().unwrap();
        let bin = exe
            .parent()
            .and_then(Path::parent)
            .unwrap()
            .join("nvmf-target");
        assert!(
            bin.exists(),
            "{} is missing: run `cargo build -p nvmf-target` first",
            bin.display()
        );
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir =
            std::env::temp_dir().join(format!("nvmf-initiator-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
             subsystems:\n  - nqn: {NQN}\n    allow_any_host: true\n    namespaces:\n      \
             - {{ nsid: 1, path: {}/ns1.img, size: 64MiB }}\n\
             target: {{ threads: 2, keep_alive_ms_min: 1000 }}\n",
            dir.display()
        );
        let cfg = dir.join("config.yaml");
        std::fs::write(&cfg, yaml).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(&cfg)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("target.log")).unwrap())
            .spawn()
            .expect("spawn nvmf-target");
        let mut t = Target { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = t.child.try_wait() {
                panic!("nvmf-target exited ({st}): {}", t.log());
            }
            if TcpStream::connect_timeout(
                &([127, 0, 0, 1], port).into(),
                Duration::from_millis(200),
            )
            .is_ok()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "nvmf-target not listening: {}",
                t.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        t
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("target.log")).unwrap_or_default()
    }

    fn opts(&self) -> ConnectOptions {
        let mut o = ConnectOptions::tcp("127.0.0.1", self.port, NQN);
        o.timeout = Duration::from_secs(10);
        o
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn bring_up_and_synchronous_block_io() {
    let t = Target::start();
    let mut o = t.opts();
    o.queues = 2;
    o.queue_depth = 32;
    let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log()));
    let info = ctrl.info().clone();
    assert_ne!(info.cntlid, 0xffff);
    assert_eq!(info.subnqn, NQN);
    assert_eq!(info.io_queues, 2);
    assert!(info.io_queue_depth >= 1 && info.io_queue_depth <= 32);
    assert!(info.maxh2cdata >= 4096);
    let ns = ctrl.namespaces().to_vec();
    assert_eq!(ns.len(), 1);
    assert_eq!(ns[0].nsid, 1);
    assert_eq!(ns[0].size(), 64 << 20);

    let mut n = ctrl.open_namespace(1).unwrap();
    let bs = n.block_size() as usize;
    // In-capsule (one block), R2T-sized (128 KiB) and multi-command (2 MiB) transfers.
    for (i, len) in [bs, 128 << 10, 2 << 20].into_iter().enumerate() {
        let off = (i as u64 + 1) * (4 << 20);
        let data = pattern(len, i as u64);
        n.write_at(&data, off).unwrap();
        let mut back = vec![0u8; len];
        n.read_at(&mut back, off).unwrap();
        assert!(back == data, "read back differs for {len} bytes at {off}");
    }
    n.flush().unwrap();

    // Bad ranges never reach the wire.
    let mut one = vec![0u8; bs];
    assert!(matches!(
        n.read_at(&mut one, n.size()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        n.read_at(&mut one[..bs - 1], 0),
        Err(Error::InvalidArgument(_))
    ));

    if info.oncs & 0x8 != 0 {
        let off = 4 << 20;
        n.write_zeroes(off, 64 << 10).unwrap();
        let mut back = vec![0xffu8; 64 << 10];
        n.read_at(&mut back, off).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "write zeroes left data behind"
        );
    }
    if info.oncs & 0x4 != 0 {
        n.trim(&[(8 << 20, 1 << 20), (20 << 20, bs as u64)])
            .unwrap();
    }
    drop(n);
    ctrl.shutdown().unwrap();
}

#[test]
fn queue_depth_api_with_verification() {
    let t = Target::start();
    let mut o = t.opts();
    o.queue_depth = 32;
    let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log()));
    let ns = ctrl.namespaces()[0];
    let mut q = ctrl.take_io_queue().unwrap();
    let bs = ns.block_size as usize;
    let io = 16 * bs.max(512) / bs * bs; // 8 KiB with 512-byte blocks, 64 KiB with 4 KiB
    let blocks = (io / bs) as u64;
    let count = 200u64;
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    let mut done = Vec::new();
    // Writes at queue depth, each I/O its own pattern.
    let mut next = 0u64;
    while next < count || q.in_flight() > 0 {
        while next < count && q.free_slots() > 0 {
            q.submit_write(&ns, next * blocks, pattern(io, next), next)
                .map_err(|e| e.error)
                .unwrap();
            next += 1;
        }
        done.clear();
        q.reap(&mut done, 1, None).unwrap();
        for c in done.drain(..) {
            assert_eq!(c.result, Ok(0), "write {}", c.user_data);
            bufs.push(c.buf.unwrap());
        }
    }
    // Reads back, reusing the returned buffers (no allocation per I/O).
    let mut next = 0u64;
    let mut checked = 0;
    while next < count || q.in_flight() > 0 {
        while next < count && q.free_slots() > 0 {
            let buf = bufs.pop().unwrap();
            q.submit_read(&ns, next * blocks, buf, next)
                .map_err(|e| e.error)
                .unwrap();
            next += 1;
        }
        done.clear();
        q.reap(&mut done, 1, None).unwrap();
        for c in done.drain(..) {
            assert_eq!(c.result, Ok(0), "read {}", c.user_data);
            let buf = c.buf.unwrap();
            assert!(
                buf == pattern(io, c.user_data),
                "read {} differs",
                c.user_data
            );
            checked += 1;
            bufs.push(buf);
        }
    }
    assert_eq!(checked, count);
    let s = q.stats();
    // The queue's own Fabrics Connect (1024 bytes of data) counts too.
    assert_eq!(s.completed, 2 * count + 1);
    assert_eq!(s.payload_bytes, 2 * count * io as u64 + 1024);
    let c = s.copies_per_byte();
    assert!((1.0..=2.0).contains(&c), "copies per byte {c}");
}

#[test]
fn header_and_data_digests() {
    let t = Target::start();
    let mut o = t.opts();
    o.hdr_digest = true;
    o.data_digest = true;
    let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log()));
    let mut n = ctrl.open_namespace(1).unwrap();
    let data = pattern(256 << 10, 7);
    n.write_at(&data, 0).unwrap();
    let mut back = vec![0u8; data.len()];
    n.read_at(&mut back, 0).unwrap();
    assert!(back == data);
}

#[test]
fn discovery_lists_the_subsystem() {
    let t = Target::start();
    let entries = discover("127.0.0.1", t.port, &t.opts().hostnqn)
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log()));
    let e = entries
        .iter()
        .find(|e| e.subnqn == NQN)
        .unwrap_or_else(|| panic!("{entries:?}"));
    assert_eq!(e.trtype, nvme::log::trtype::TCP);
    assert_eq!(e.trsvcid, t.port.to_string());
    assert_eq!(e.traddr, "127.0.0.1");
}

#[test]
fn keep_alive_keeps_an_idle_controller() {
    let t = Target::start();
    let mut o = t.opts();
    o.kato = Duration::from_secs(2);
    let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log()));
    let mut n = ctrl.open_namespace(1).unwrap();
    // Idle for more than twice the KATO: the target would delete the controller without the
    // background Keep Alive commands.
    std::thread::sleep(Duration::from_secs(5));
    let mut buf = vec![0u8; n.block_size() as usize];
    n.read_at(&mut buf, 0)
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log()));
    ctrl.keep_alive().unwrap();
}

#[test]
fn dead_target_fails_fast() {
    let mut t = Target::start();
    let mut o = t.opts();
    o.timeout = Duration::from_secs(3);
    let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log()));
    let ns = ctrl.namespaces()[0];
    let mut q = ctrl.take_io_queue().unwrap();
    t.child.kill().unwrap();
    t.child.wait().unwrap();
    let start = Instant::now();
    let mut done = Vec::new();
    let r = q.submit_read(&ns, 0, vec![0u8; ns.block_size as usize], 1);
    if r.is_ok() {
        let _ = q.reap(&mut done, 1, None);
        assert_eq!(done.len(), 1);
        assert!(matches!(
            done[0].result,
            Err(CmdError::QueueFailed | CmdError::Timeout)
        ));
    }
    assert!(q.is_failed());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    drop(ctrl);
}
