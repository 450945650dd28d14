//! The backend's IOPOLL ring on a real block device with poll queues. Needs
//! `NVMF_IOPOLL_DEV=/dev/...` naming such a device (its contents are overwritten); the VM
//! scenario `iopoll-null-blk` creates a memory-backed null_blk with poll queues and runs this.
//! Without the variable the test says SKIP and passes (no such device on an ordinary host).

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_target::backend::{BufPool, DeviceSpec, Devices, FileSpec, Ring, RingConfig};
use nvmf_target::core::{IoKind, IoOp};

const IO: u32 = 16384;
/// Pool buffer size: room for a transfer above a typical poll limit.
const BUF: usize = 1 << 20;
const DEPTH: u64 = 8;

/// Submits `ops` (one buffer each) and reaps them all, polling, within 10 s.
fn batch(ring: &mut Ring, ops: &[IoOp], bufs: &[nvmf_target::backend::BufId]) {
    for (i, o) in ops.iter().enumerate() {
        ring.submit_op(o, Some((bufs[i], 0)), i as u64)
            .expect("slot");
    }
    ring.submit().expect("submit");
    let start = Instant::now();
    let mut done = 0;
    while done < ops.len() {
        done += ring.reap(|ud, r| assert_eq!(r, Ok(IO), "op {ud}"));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{done} of {} ops completed in 10 s; stats {:?}",
            ops.len(),
            ring.stats()
        );
    }
}

/// One op of `len` bytes at offset 1 MiB with buffer `b`, completed within 10 s.
fn batch_len(ring: &mut Ring, kind: IoKind, len: u32, b: nvmf_target::backend::BufId) {
    let o = IoOp {
        device: 0,
        kind: kind.clone(),
        offset: 1 << 20,
        len,
    };
    ring.submit_op(&o, Some((b, 0)), 7).expect("slot");
    ring.submit().expect("submit");
    let start = Instant::now();
    let mut done = false;
    while !done {
        ring.reap(|_, r| {
            assert_eq!(r, Ok(len), "{kind:?} of {len} bytes");
            done = true;
        });
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{kind:?} of {len} bytes did not complete in 10 s; stats {:?}",
            ring.stats()
        );
    }
}

#[test]
fn polled_ring_writes_and_reads_a_block_device_with_poll_queues() {
    let Ok(path) = std::env::var("NVMF_IOPOLL_DEV") else {
        eprintln!("SKIP: NVMF_IOPOLL_DEV is not set (no block device with poll queues)");
        return;
    };
    let devices = Devices::open(&[DeviceSpec::File(FileSpec {
        block_size: Some(4096),
        ..FileSpec::new(&path, None)
    })])
    .unwrap();
    let d = devices.get(0).unwrap();
    assert!(d.is_direct(), "{path} not opened O_DIRECT");
    assert!(d.is_pollable(), "{path}: queue/io_poll is not 1");
    let poll_max = d.poll_max_bytes();
    println!("{path}: reads and writes up to {poll_max} bytes are polled");
    assert!(
        poll_max >= IO,
        "poll limit {poll_max} below the test's {IO}-byte I/O"
    );
    let pool = BufPool::new(DEPTH as u32 * 2, BUF).unwrap();
    let cfg = RingConfig {
        sq_entries: 4, // smaller than a batch: the polled SQ-full path runs too
        max_inflight: 64,
        sqpoll: None,
        iopoll: true,
    };
    let mut ring = Ring::new(cfg, Arc::new(devices), pool).unwrap();
    assert_eq!(ring.polled_devices(), 1);
    let mut bufs = Vec::new();
    for i in 0..DEPTH * 2 {
        let b = ring.pool_mut().alloc().unwrap();
        ring.pool_mut().buf_mut(b).unwrap().fill(0x40 + i as u8);
        bufs.push(b);
    }
    let writes: Vec<IoOp> = (0..DEPTH)
        .map(|i| IoOp {
            device: 0,
            kind: IoKind::Write,
            offset: i * 65536,
            len: IO,
        })
        .collect();
    let reads: Vec<IoOp> = writes
        .iter()
        .map(|o| IoOp {
            kind: IoKind::Read,
            ..o.clone()
        })
        .collect();
    let (wbufs, rbufs) = bufs.split_at(DEPTH as usize);
    batch(&mut ring, &writes, wbufs);
    for &b in rbufs {
        ring.pool_mut().buf_mut(b).unwrap().fill(0);
    }
    batch(&mut ring, &reads, rbufs);
    for (i, &b) in rbufs.iter().enumerate() {
        let want = 0x40 + i as u8;
        assert!(
            ring.pool().buf(b).unwrap()[..IO as usize]
                .iter()
                .all(|&x| x == want),
            "block {i} read back wrong"
        );
    }
    // A flush is not a polled operation: it goes to the interrupt ring.
    ring.submit_op(
        &IoOp {
            device: 0,
            kind: IoKind::Flush,
            offset: 0,
            len: 0,
        },
        None,
        99,
    )
    .unwrap();
    ring.submit().unwrap();
    let start = Instant::now();
    let mut flushed = false;
    while !flushed {
        ring.reap(|ud, r| {
            assert_eq!((ud, r), (99, Ok(0)));
            flushed = true;
        });
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "flush never completed"
        );
        if !flushed {
            ring.wait(Some(Duration::from_millis(100))).unwrap();
        }
    }
    // A transfer above the poll limit (a polled bio must not be split) takes the interrupt
    // ring and completes too.
    let big = (poll_max as usize * 2).next_multiple_of(4096);
    if big <= BUF {
        let b = rbufs[0];
        ring.pool_mut().buf_mut(b).unwrap()[..big].fill(0x77);
        batch_len(&mut ring, IoKind::Write, big as u32, b);
        ring.pool_mut().buf_mut(b).unwrap()[..big].fill(0);
        batch_len(&mut ring, IoKind::Read, big as u32, b);
        assert!(ring.pool().buf(b).unwrap()[..big]
            .iter()
            .all(|&x| x == 0x77));
    } else {
        println!("(no {big}-byte buffer: the above-the-limit case is not run)");
    }
    let st = ring.stats();
    println!("iopoll: {st:?}");
    assert_eq!(
        st.polled_sqes,
        2 * DEPTH,
        "reads and writes not on the polled ring"
    );
    assert_eq!(st.errors, 0);
}
