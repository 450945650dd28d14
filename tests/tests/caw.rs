//! Fused Compare and Write against the real `nvmf-target` binary over loopback NVMe/TCP: one
//! host's matching and mismatching pairs and the arguments refused before the wire; hosts
//! racing on one block (one winner per round, no torn block); and atomicity against another
//! host's plain writes of the same blocks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use initiator::{ConnectOptions, Controller, Error, MultipathOptions, Namespace};
use nvme::identify::ctrl::FUSES_COMPARE_AND_WRITE;
use nvmf_tests::caw::{self, RaceOptions};
use nvmf_tests::{TargetProc, TEST_NQN};

fn options(t: &TargetProc) -> ConnectOptions {
    let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    o.timeout = Duration::from_secs(10);
    o.poll_spin = Duration::ZERO;
    o
}

/// A host of its own (random host ID and NQN) with namespace 1.
fn open(t: &TargetProc) -> (Controller, Namespace) {
    let mut c = Controller::connect(options(t)).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let ns = c.open_namespace(1).unwrap();
    (c, ns)
}

fn fill(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[track_caller]
fn invalid(r: Result<bool, Error>) {
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "expected InvalidArgument, got {r:?}"
    );
}

#[test]
fn compare_and_write_one_host() {
    let t = TargetProc::start_default();
    let (c, mut ns) = open(&t);
    assert_ne!(
        c.info().fuses & FUSES_COMPARE_AND_WRITE,
        0,
        "FUSES: {:#x}",
        c.info().fuses
    );
    let bs = ns.block_size() as usize;
    let off = 16 * bs as u64;
    let old = fill(2 * bs, 1);
    let new = fill(2 * bs, 2);
    let other = fill(2 * bs, 3);
    let mut back = vec![0u8; 2 * bs];
    ns.write_at(&old, off).unwrap();

    // Matching: the new data replaces the old.
    let r = ns.compare_and_write(&old, &new, off);
    assert!(r.as_ref().is_ok_and(|&b| b), "{r:?}\n{}", t.log_text());
    ns.read_at(&mut back, off).unwrap();
    assert_eq!(back, new);

    // Not matching (the old data; then one byte off in the last block): nothing changes.
    assert!(!ns.compare_and_write(&old, &other, off).unwrap());
    let mut almost = new.clone();
    *almost.last_mut().unwrap() ^= 1;
    assert!(!ns.compare_and_write(&almost, &other, off).unwrap());
    ns.read_at(&mut back, off).unwrap();
    assert_eq!(back, new);

    // One block, and the queue carries on with plain I/O and more pairs after a failure.
    let one = &new[..bs];
    assert!(ns.compare_and_write(one, &other[..bs], off).unwrap());
    assert!(!ns.compare_and_write(one, &old[..bs], off).unwrap());
    ns.read_at(&mut back, off).unwrap();
    assert_eq!(&back[..bs], &other[..bs]);
    assert_eq!(&back[bs..], &new[bs..]);

    // Refused before the wire: different lengths, not whole blocks, nothing, an unaligned
    // or out-of-range offset, more than one command's transfer.
    let sent = ns.queue().expect("one path").stats().commands;
    invalid(ns.compare_and_write(&new, &other[..bs], off));
    invalid(ns.compare_and_write(&new[..100], &other[..100], off));
    invalid(ns.compare_and_write(&[], &[], off));
    invalid(ns.compare_and_write(one, one, off + 512));
    invalid(ns.compare_and_write(one, one, ns.size()));
    // The largest pair: ACWU blocks (one target buffer), within one command's transfer.
    let max = ((c.info().acwu as usize + 1) * bs).min(c.info().max_transfer as usize);
    let big = max + bs;
    invalid(ns.compare_and_write(&vec![0; big], &vec![0; big], 0));
    assert_eq!(ns.queue().expect("one path").stats().commands, sent);
    assert_eq!(ns.queue().expect("one path").in_flight(), 0);

    ns.read_at(&mut back, off).unwrap();
    assert_eq!(&back[..bs], &other[..bs]);

    // The largest pair (beyond the in-capsule data: both halves go by R2T), straddling a
    // 1 MiB boundary.
    let boff = (1 << 20) - 2 * bs as u64;
    let (bold, bnew) = (fill(max, 6), fill(max, 7));
    ns.write_at(&bold, boff).unwrap();
    let r = ns.compare_and_write(&bnew, &bold, boff);
    assert!(matches!(r, Ok(false)), "{r:?} {}", t.log_text());
    assert!(ns.compare_and_write(&bold, &bnew, boff).unwrap());
    let mut bback = vec![0u8; max];
    ns.read_at(&mut bback, boff).unwrap();
    assert!(bback == bnew, "the large pair's data did not land");
    drop(ns);
    c.shutdown().unwrap();
}

#[test]
fn compare_and_write_through_a_multipath_namespace() {
    let t = TargetProc::start_default();
    let mut ns = Namespace::multipath(vec![options(&t)], 1, MultipathOptions::default()).unwrap();
    let bs = ns.block_size() as usize;
    let (old, new) = (fill(bs, 4), fill(bs, 5));
    ns.write_at(&old, 0).unwrap();
    assert!(ns.compare_and_write(&old, &new, 0).unwrap());
    assert!(!ns.compare_and_write(&old, &new, 0).unwrap());
    let mut back = vec![0u8; bs];
    ns.read_at(&mut back, 0).unwrap();
    assert_eq!(back, new);
    ns.shutdown().unwrap();
}

#[test]
fn two_hosts_race_one_winner_per_round() {
    let t = TargetProc::start_default();
    let o = RaceOptions {
        hosts: 2,
        rounds: 10_000,
        nsid: 1,
        lba: 0,
    };
    let rep = caw::race(&options(&t), &o).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    rep.assert_clean(&o, &t.log_text());
}

/// Writer tags of the stamps (top byte), so every stamp is unique.
const A_TAG: u64 = 0xa << 56;
const B_TAG: u64 = 0xb << 56;

/// Stamp every block of `buf` with `stamp` (its block index in `b`).
fn stamp_range(buf: &mut [u8], bs: usize, stamp: u64) {
    for (i, blk) in buf.chunks_exact_mut(bs).enumerate() {
        caw::stamp(blk, stamp, i as u64);
    }
}

/// Each block's stamp, checking every block is whole and in its place.
#[track_caller]
fn stamps(buf: &[u8], bs: usize) -> Vec<u64> {
    buf.chunks_exact(bs)
        .enumerate()
        .map(|(i, blk)| match caw::parse(blk) {
            Ok((s, j)) if j == i as u64 => s,
            Ok((s, j)) => panic!("block {i} holds block {j} of stamp {s:#x}"),
            Err(e) => panic!("block {i} torn: {e}"),
        })
        .collect()
}

/// Host A loops Compare and Write over two blocks while host B loops plain writes of the same
/// two blocks. What the target guarantees: the pair executes atomically with respect to B's
/// writes, so the two blocks at rest always carry one stamp (B's writes and A's pairs never
/// interleave, and B's writes follow one another). A's plain reads are not atomic with respect
/// to B's two-block writes (beyond AWUN), so a read may mix two stamps while a write is under
/// way; but then A's pair, comparing against that mix, must fail: the range at rest never
/// holds it. Every single block read is whole (a one-block write is atomic, AWUN 0).
#[test]
fn compare_and_write_is_atomic_against_plain_writes() {
    let t = TargetProc::start_default();
    let (_ca, mut a) = open(&t);
    let (_cb, mut b) = open(&t);
    let bs = a.block_size() as usize;
    let len = 2 * bs;
    let off = 256 * bs as u64;
    let mut buf = vec![0u8; len];
    stamp_range(&mut buf, bs, B_TAG);
    b.write_at(&buf, off).unwrap();

    let stop = AtomicBool::new(false);
    let (writes, a_res) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut w = vec![0u8; len];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                stamp_range(&mut w, bs, B_TAG | n);
                b.write_at(&w, off).unwrap();
            }
            n
        });
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (mut wins, mut conflicts, mut mixed) = (0u64, 0u64, 0u64);
            let mut cur = vec![0u8; len];
            let mut next = vec![0u8; len];
            let t0 = Instant::now();
            let mut i = 0u64;
            while i < 2000 && t0.elapsed() < Duration::from_secs(2) {
                i += 1;
                a.read_at(&mut cur, off).unwrap();
                let st = stamps(&cur, bs);
                let whole = st[0] == st[1];
                stamp_range(&mut next, bs, A_TAG | i);
                let won = a.compare_and_write(&cur, &next, off).unwrap();
                assert!(
                    whole || !won,
                    "a Compare and Write matched a range holding stamps {:#x} and {:#x}: \
                     the range was torn at rest",
                    st[0],
                    st[1]
                );
                match (whole, won) {
                    (_, true) => wins += 1,
                    (true, false) => conflicts += 1,
                    (false, false) => mixed += 1,
                }
            }
            (i, wins, conflicts, mixed)
        }));
        stop.store(true, Ordering::Relaxed);
        (writer.join().unwrap(), res)
    });
    let (iters, wins, conflicts, mixed) = a_res.unwrap_or_else(|p| std::panic::resume_unwind(p));
    println!(
        "caw vs writes: {iters} pairs ({wins} won, {conflicts} lost, {mixed} over a mixed read), \
         {writes} plain writes"
    );
    assert!(writes > 0);
    // The writer is done: the range is whole and a pair over it succeeds.
    a.read_at(&mut buf, off).unwrap();
    let st = stamps(&buf, bs);
    assert_eq!(st[0], st[1], "the range at rest holds two stamps");
    let mut next = vec![0u8; len];
    stamp_range(&mut next, bs, A_TAG);
    assert!(a.compare_and_write(&buf, &next, off).unwrap());
    a.read_at(&mut buf, off).unwrap();
    assert_eq!(buf, next);
    assert!(
        wins > 0,
        "no Compare and Write won in {iters} tries against the writer"
    );
}
