//! Data integrity over loopback NVMe/TCP: the initiator library against the real
//! `nvmf-target` binary (file namespace, O_DIRECT, io_uring).

use initiator::{ConnectOptions, Controller};
use nvmf_tests::{default_yaml, TargetProc, TEST_NQN};
use rand::{Rng, SeedableRng};

/// 1,000 writes of 4 KiB, 64 KiB and 128 KiB at random block-aligned offsets (later writes
/// overwrite earlier ones), then every byte of the touched region is read back and compared
/// with a model; then Flush; then Deallocate, after which the range reads zeroes.
#[test]
fn random_writes_read_back_flush_and_trim() {
    random_io_check(TargetProc::start_default());
}

/// The same with the backend's rings in SQPOLL mode (`target.sqpoll: true`).
#[test]
fn random_writes_read_back_flush_and_trim_sqpoll() {
    let t = TargetProc::start_with(|port, dir| {
        default_yaml(port, dir).replace("target: {", "target: { sqpoll: true, sqpoll_idle_ms: 5,")
    });
    // The pollers build their rings as they start: wait for both lines.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while t.log_text().matches("mode=SqPoll").count() < 2 {
        let log = t.log_text();
        assert!(
            std::time::Instant::now() < deadline,
            "rings not in SQPOLL mode:\n{log}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    random_io_check(t);
}

fn random_io_check(mut t: TargetProc) {
    let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    o.queues = 2;
    let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let mut ns = ctrl.open_namespace(1).expect("namespace 1");
    let size = ns.size() as usize;
    let bs = ns.block_size() as usize;
    assert_eq!(size, 64 << 20);

    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let mut model = vec![0u8; size];
    let mut written = vec![false; size / bs];
    for i in 0..1000u32 {
        let len = [4096usize, 64 << 10, 128 << 10][i as usize % 3];
        let off = rng.random_range(0..(size - len) / bs) * bs;
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        ns.write_at(&data, off as u64)
            .unwrap_or_else(|e| panic!("write {i} at {off}: {e}"));
        model[off..off + len].copy_from_slice(&data);
        written[off / bs..(off + len) / bs]
            .iter_mut()
            .for_each(|w| *w = true);
    }
    // Read back the whole namespace in 1 MiB pieces: written blocks match the model, the rest
    // of the (new, sparse) file reads zeroes, which the model holds too.
    let mut buf = vec![0u8; 1 << 20];
    for off in (0..size).step_by(buf.len()) {
        ns.read_at(&mut buf, off as u64).unwrap();
        if buf[..] != model[off..off + buf.len()] {
            let at = (0..buf.len()).find(|&j| buf[j] != model[off + j]).unwrap();
            panic!(
                "mismatch at byte {} (block written: {})",
                off + at,
                written[(off + at) / bs]
            );
        }
    }
    assert!(
        written.iter().filter(|&&w| w).count() > 1000,
        "the writes covered many blocks"
    );
    ns.flush().expect("flush");

    // Deallocate two ranges; Identify says deallocated blocks read zeroes (file: punch hole).
    let ranges = [(1u64 << 20, 256u64 << 10), (40u64 << 20, bs as u64)];
    ns.trim(&ranges).expect("trim");
    for (off, len) in ranges {
        let mut back = vec![0xa5u8; len as usize];
        ns.read_at(&mut back, off).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "trimmed range at {off} is not zero"
        );
    }
    // Data next to a trimmed range is intact.
    let edge = (1usize << 20) + (256 << 10);
    let mut back = vec![0u8; bs];
    ns.read_at(&mut back, edge as u64).unwrap();
    assert_eq!(back, model[edge..edge + bs]);

    drop(ns);
    ctrl.shutdown().expect("clean shutdown");
    assert!(
        t.terminate(),
        "target exits 0 on SIGTERM:\n{}",
        t.log_text()
    );
    assert!(
        !t.log_text().contains("ERROR"),
        "target log has errors:\n{}",
        t.log_text()
    );
}

/// A null namespace reads zeroes, also from pool buffers that writes of data just filled
/// (the target sends null reads from a shared zero region and writes zeroes into a buffer
/// only when something else looks at it): writes and reads of every size, interleaved, on
/// one queue so that the same few buffers are reused.
#[test]
fn null_namespace_reads_zeroes_after_writes_dirtied_the_buffers() {
    let t = TargetProc::start_with(|port, _| {
        format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
             subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    namespaces:\n      \
             - {{ nsid: 1, null: 64MiB }}\n\
             target: {{ threads: 1 }}\n"
        )
    });
    let o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let mut ns = ctrl.open_namespace(1).expect("namespace 1");
    for (i, len) in [4096usize, 12288, 64 << 10, 128 << 10, 8192, 4096]
        .into_iter()
        .cycle()
        .take(60)
        .enumerate()
    {
        let off = (i as u64 % 16) << 20;
        ns.write_at(&vec![0xa5u8; len], off).unwrap();
        let mut back = vec![0x5au8; len];
        ns.read_at(&mut back, off).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "read {i} ({len} bytes) returned non-zero data"
        );
    }
}

/// Compare against the target binary: equal data compares equal, one changed byte gives
/// Compare Failure, across a multi-command span too.
#[test]
fn compare_equal_and_different() {
    let t = TargetProc::start_default();
    let mut c = Controller::connect(ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let mut ns = c.open_namespace(1).unwrap();
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i * 7 + 3) as u8).collect();
    ns.write_at(&data, 1 << 20).unwrap();
    assert!(ns.compare_at(&data, 1 << 20).unwrap());
    let mut other = data.clone();
    other[200_000] ^= 0x40;
    assert!(!ns.compare_at(&other, 1 << 20).unwrap());
    assert!(
        !ns.compare_at(&data, 2 << 20).unwrap(),
        "unwritten blocks are zeroes"
    );
}

/// `std::io` over a namespace: `std::io::copy` of an unaligned span (offset 777, 100 MiB + 123
/// bytes) into `NamespaceIo` and back out with `std::io::copy`, compared; the bytes around it keep what was
/// there; reads stop at the end (0), writes there fail with WriteZero.
#[test]
fn std_io_read_write_seek_at_any_offset() {
    use std::io::{Read, Seek, SeekFrom, Write};
    // A 128 MiB file namespace; 100 MiB + 123 bytes go in at offset 777.
    let t = TargetProc::start_with(|port, dir| {
        nvmf_tests::default_yaml(port, dir).replace("size: 64MiB", "size: 128MiB")
    });
    let mut c = Controller::connect(ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let mut ns = c.open_namespace(1).unwrap();
    let size = ns.size();
    assert_eq!(size, 128 << 20);
    // Known bytes around the span.
    ns.write_at(&vec![0xa5u8; 8 << 20], 0).unwrap();
    ns.write_at(&vec![0xa5u8; 8 << 20], 96 << 20).unwrap();
    let mut io = ns.into_io();
    let data: Vec<u8> = (0..(100 << 20) + 123u32).map(|i| (i % 251) as u8).collect();
    io.seek(SeekFrom::Start(777)).unwrap();
    let n = std::io::copy(&mut &data[..], &mut io).unwrap();
    assert_eq!(n, data.len() as u64);
    io.flush().unwrap();
    assert_eq!(io.position(), 777 + data.len() as u64);
    io.seek(SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    let n = std::io::copy(
        &mut (&mut io).take(777 + data.len() as u64 + 4096),
        &mut back,
    )
    .unwrap();
    assert_eq!(n as usize, back.len());
    assert!(
        back[..777].iter().all(|&b| b == 0xa5),
        "bytes before the span"
    );
    assert!(back[777..777 + data.len()] == data[..], "the span");
    assert!(
        back[777 + data.len()..].iter().all(|&b| b == 0xa5),
        "bytes after the span"
    );
    // Inside one block: in its middle, and at its start.
    for (at, fill) in [(5000u64, 0x11u8), (8192 * 2, 0x22)] {
        io.seek(SeekFrom::Start(at)).unwrap();
        io.write_all(&[fill; 10]).unwrap();
        io.seek(SeekFrom::Start(at - 2)).unwrap();
        let mut b = [0u8; 14];
        io.read_exact(&mut b).unwrap();
        let want_edge = |o: u64| {
            if (777..777 + data.len() as u64).contains(&o) {
                data[(o - 777) as usize]
            } else {
                0xa5
            }
        };
        assert_eq!(&b[2..12], &[fill; 10]);
        assert_eq!(
            (b[0], b[1], b[12], b[13]),
            (
                want_edge(at - 2),
                want_edge(at - 1),
                want_edge(at + 10),
                want_edge(at + 11)
            )
        );
    }
    // The end of the namespace.
    io.seek(SeekFrom::End(-10)).unwrap();
    let mut tail = [0u8; 64];
    assert_eq!(io.read(&mut tail).unwrap(), 10);
    assert_eq!(io.read(&mut tail).unwrap(), 0);
    assert_eq!(io.position(), size);
    let e = io.write(b"x").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WriteZero);
    assert!(io.seek(SeekFrom::Current(-(size as i64) - 1)).is_err());
}

/// The async API on a tokio runtime (the library has no runtime dependency): 64 writes on a
/// 16-deep queue (the rest wait for a tag), then 64 reads in flight at once on a 128-deep
/// queue and a flush, data checked.
#[test]
fn async_queue_on_tokio() {
    use initiator::AsyncQueue;
    let t = TargetProc::start_default();
    let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    o.queue_depth = 16;
    let mut c = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let ns = c.namespaces()[0];
    let q = AsyncQueue::new(c.take_io_queue().unwrap()).unwrap();
    // A second, 128-deep queue for 64 reads in flight at once.
    let mut c2 =
        Controller::connect(ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN)).unwrap();
    let q2 = AsyncQueue::new(c2.take_io_queue().unwrap()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let block = |i: u64| vec![(i * 3 + 1) as u8; 4096];
        let lba = |i: u64| i * 8 + 5;
        let mut set = tokio::task::JoinSet::new();
        for i in 0..64u64 {
            set.spawn(q.write(&ns, lba(i), block(i)));
        }
        while let Some(r) = set.join_next().await {
            r.unwrap().unwrap();
        }
        // 64 reads in flight at once on the deeper queue (each task submits on its first
        // poll, all before any completion is reaped).
        let mut set = tokio::task::JoinSet::new();
        for i in 0..64u64 {
            let f = q2.read(&ns, lba(i), vec![0u8; 4096]);
            set.spawn(async move { (i, f.await) });
        }
        let mut seen = 0;
        while let Some(r) = set.join_next().await {
            let (i, res) = r.unwrap();
            assert_eq!(res.unwrap().unwrap(), block(i), "block {i}");
            seen += 1;
        }
        assert_eq!(seen, 64);
        assert!(q.flush(&ns).await.unwrap().is_none());
        // An unaligned length fails at once.
        assert!(q.read(&ns, 0, vec![0u8; 100]).await.is_err());
    });
}

/// Each of the initiator's polling modes carries verified I/O at QD1, and an interrupt-mode
/// queue sleeps through every wait instead of spinning: a write, a poll and a read per command
/// (a spinning wait reads the socket over and over).
#[test]
fn every_polling_mode_carries_io_and_interrupt_sleeps_every_wait() {
    use initiator::Polling;
    let t = TargetProc::start_default();
    for polling in [Polling::Adaptive, Polling::Busy, Polling::Interrupt] {
        let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
        o.polling = polling;
        let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
        let ns = ctrl.namespaces()[0];
        let mut q = ctrl.take_io_queue().expect("an I/O queue");
        let bs = ns.block_size as usize;
        let mut done = Vec::new();
        for i in 0..200u64 {
            let data: Vec<u8> = (0..bs)
                .map(|b| (b as u64 ^ i ^ polling as u64) as u8)
                .collect();
            q.submit_write(&ns, i, data.clone(), i).unwrap();
            q.reap(&mut done, 1, None).unwrap();
            q.submit_read(&ns, i, vec![0u8; bs], i).unwrap();
            q.reap(&mut done, 1, None).unwrap();
            let c = done.pop().unwrap();
            c.result.unwrap();
            assert_eq!(c.buf.unwrap(), data, "{polling:?} block {i}");
            done.clear();
        }
        let s = q.stats();
        let per = s.syscalls as f64 / s.completed as f64;
        eprintln!("{polling:?}: {per:.2} system calls per command");
        if polling == Polling::Interrupt {
            assert!(per <= 3.5, "{polling:?}: {per:.2} system calls per command");
        }
    }
}
