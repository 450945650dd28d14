//! Proves the backend's data path makes no heap allocation per operation: after warm-up,
//! write and read operations on an O_DIRECT file device, batched and one at a time, through
//! `submit_op` / `submit` / `wait` / `reap`, allocate nothing on this thread.

use std::sync::Arc;
use std::time::Duration;

use nvmf_target::backend::{BufPool, DeviceSpec, Devices, FileSpec, Ring, RingConfig};
use nvmf_target::core::{IoKind, IoOp};

mod common;
use common::allocs;

const DEPTH: u64 = 16;
const IO: u32 = 16384;

/// One round: DEPTH writes then DEPTH reads of the same blocks, all in flight together.
fn round(ring: &mut Ring, ops: &[IoOp], bufs: &[nvmf_target::backend::BufId], base: u64) {
    for (i, o) in ops.iter().enumerate() {
        ring.submit_op(o, Some((bufs[i], 0)), base + i as u64)
            .expect("slot");
    }
    ring.submit().expect("submit");
    let mut done = 0;
    let mut failed = 0;
    while done < ops.len() {
        ring.wait(Some(Duration::from_secs(5))).expect("wait");
        done += ring.reap(|_, r| {
            if r != Ok(IO) {
                failed += 1;
            }
        });
    }
    assert_eq!(failed, 0);
}

#[test]
fn no_heap_allocation_per_op_in_steady_state() {
    alloc_check(None, "plain");
}

/// The same with an SQPOLL ring (`target.sqpoll: true`).
#[test]
fn no_heap_allocation_per_op_with_sqpoll() {
    alloc_check(Some(Duration::from_millis(50)), "sqpoll");
}

fn alloc_check(sqpoll: Option<Duration>, tag: &str) {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("backend-alloc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("disk.img");
    let devices = Devices::open(&[DeviceSpec::File(FileSpec {
        block_size: Some(4096),
        ..FileSpec::new(&path, Some(64 << 20))
    })])
    .unwrap();
    assert!(devices.get(0).unwrap().is_direct(), "test needs O_DIRECT");
    let pool = BufPool::new(DEPTH as u32 * 2, IO as usize).unwrap();
    let mut ring = Ring::new(
        RingConfig {
            sq_entries: 8, // smaller than a batch: the SQ-full path runs too
            max_inflight: 64,
            sqpoll,
            iopoll: false,
        },
        Arc::new(devices),
        pool,
    )
    .unwrap();
    let mut bufs = Vec::new();
    for i in 0..DEPTH * 2 {
        let b = ring.pool_mut().alloc().unwrap();
        ring.pool_mut().buf_mut(b).unwrap().fill(i as u8);
        bufs.push(b);
    }
    let writes: Vec<IoOp> = (0..DEPTH)
        .map(|i| IoOp {
            device: 0,
            kind: IoKind::Write,
            offset: i * 1048576,
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

    // Warm-up: first-use paths (ring enable, lazy statics) may allocate once.
    round(&mut ring, &writes, wbufs, 0);
    round(&mut ring, &reads, rbufs, 0);

    let before = allocs();
    let ops_before = ring.stats().completed;
    for r in 0..50 {
        round(&mut ring, &writes, wbufs, r * 100);
        round(&mut ring, &reads, rbufs, r * 100);
    }
    // Also one op at a time (QD1).
    for r in 0..100 {
        round(&mut ring, &reads[..1], &rbufs[..1], r);
    }
    let after = allocs();
    let ops = ring.stats().completed - ops_before;
    assert_eq!(ops, 50 * 2 * DEPTH + 100);
    assert_eq!(
        after - before,
        0,
        "{} heap allocations for {ops} ops",
        after - before
    );

    // And the data is right.
    for (i, &b) in rbufs.iter().enumerate() {
        assert!(ring.pool().buf(b).unwrap().iter().all(|&x| x == i as u8));
    }
    let st = ring.stats();
    eprintln!(
        "{} ops, {} io_uring_enter calls ({:.3} per op)",
        st.completed,
        st.enters,
        st.enters as f64 / st.completed as f64
    );
    drop(ring);
    let _ = std::fs::remove_dir_all(&dir);
}
