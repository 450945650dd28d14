//! The target killed (SIGKILL) in the middle of verified I/O and started again, 20 times
//! (issue #36): every write it acknowledged, flushed or not, reads back after the restart (the
//! process dies, the kernel under it does not: an acknowledged write was handed to the file
//! before its completion was sent), no block is torn (each holds one whole generation of
//! itself, never one the host did not send), and the reservation, kept with Persist Through
//! Power Loss, is the same after every restart.
//!
//! Three writer threads (each its own controller and blocks, as the reservation holder) write
//! stamped 4 KiB blocks, one in eight with FUA, and flush every 16 writes, until the target dies
//! under them 150-400 ms into the round.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use initiator::resv::{AcquireAction, ChangePtpl, RegisterAction, RegisterCmd, ResvType};
use initiator::{ConnectOptions, Controller, Namespace};
use nvmf_tests::crashlog::{self, Present};
use nvmf_tests::resv::{acquire, conflict, register};
use nvmf_tests::{TargetProc, TEST_NQN};

const BS: usize = 4096;
const BLOCKS: u64 = 1024;
const WRITERS: u64 = 3;
const ROUNDS: usize = 20;

/// What one writer did in one round: per write (block, generation, acknowledged, FUA), and the
/// flushes acknowledged.
#[derive(Default)]
struct Run {
    writes: Vec<(u64, u64, bool, bool)>,
    flushes: u64,
}

fn open(t: &TargetProc, id: [u8; 16]) -> (Controller, Namespace) {
    let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    o.hostid = id;
    o.hostnqn = initiator::hostnqn_for(&id);
    let mut c = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let ns = c.open_namespace(1).unwrap();
    (c, ns)
}

fn writer(mut ns: Namespace, j: u64, mut sent: Vec<u64>, start: &Barrier) -> (Run, Vec<u64>) {
    let mut run = Run::default();
    let mut buf = vec![0u8; BS];
    let mine = BLOCKS / WRITERS;
    start.wait();
    for n in 1u64.. {
        let block = j + WRITERS * (rand::random::<u64>() % mine);
        let gen = sent[block as usize] + 1;
        sent[block as usize] = gen;
        crashlog::stamp(&mut buf, block, gen);
        let fua = n % 8 == 0;
        let off = block * BS as u64;
        let r = if fua {
            ns.write_fua_at(&buf, off)
        } else {
            ns.write_at(&buf, off)
        };
        run.writes.push((block, gen, r.is_ok(), fua));
        if r.is_err() {
            break;
        }
        if n % 16 == 0 {
            if ns.flush().is_err() {
                break;
            }
            run.flushes += 1;
        }
    }
    (run, sent)
}

#[test]
fn twenty_sigkills_under_io_lose_no_acknowledged_write_and_tear_no_block() {
    let mut t = TargetProc::start_default();
    let (holder, other) = ([0xa1; 16], [0xb2; 16]);
    // The reservation: the holder registered with PTPL on, Write Exclusive; another host
    // registered.
    let report = {
        let (_ca, mut a) = open(&t, holder);
        let (_cb, mut b) = open(&t, other);
        a.reservation_register(&RegisterCmd {
            action: RegisterAction::Register,
            ignore_key: false,
            ptpl: ChangePtpl::Set,
            crkey: 0,
            nrkey: 0xa1,
        })
        .unwrap();
        register(&mut b, 0xb2).unwrap();
        acquire(
            &mut a,
            AcquireAction::Acquire,
            ResvType::WriteExclusive,
            0xa1,
            0,
        )
        .unwrap();
        a.reservation_report().unwrap()
    };
    // Per block: the newest generation acknowledged, the newest sent.
    let mut acked = vec![0u64; BLOCKS as usize];
    let mut sent = vec![0u64; BLOCKS as usize];
    let (mut writes, mut fua, mut flushes, mut unacked) = (0u64, 0u64, 0u64, 0u64);
    let mut back = vec![0u8; 128 * 1024];
    let t0 = Instant::now();
    for round in 0..=ROUNDS {
        // After each restart: every block against what the host was told.
        let (_c, mut a) = open(&t, holder);
        let mut bad = Vec::new();
        let step = back.len() as u64;
        for chunk in 0..BLOCKS * BS as u64 / step {
            a.read_at(&mut back, chunk * step).unwrap();
            for (i, blk) in back.chunks_exact(BS).enumerate() {
                let b = chunk * step / BS as u64 + i as u64;
                let (lo, hi) = (acked[b as usize], sent[b as usize]);
                let ok = match crashlog::present(blk, b) {
                    Present::Zero => lo == 0,
                    Present::Gen(g) => (lo..=hi).contains(&g) && g > 0,
                    Present::Bad(_) => false,
                };
                if !ok {
                    bad.push(format!(
                        "block {b}: {} (acknowledged generation {lo}, sent up to {hi})",
                        crashlog::present(blk, b)
                    ));
                }
            }
        }
        assert!(
            bad.is_empty(),
            "after {round} SIGKILLs, {} blocks are not what the host was told: {}\n{}",
            bad.len(),
            bad[..bad.len().min(5)].join("; "),
            t.log_text()
        );
        assert_eq!(
            a.reservation_report().unwrap(),
            report,
            "the reservation after {round} SIGKILLs"
        );
        let (_cb, mut b) = open(&t, other);
        conflict(b.write_at(&back[..BS], 0));
        if round == ROUNDS {
            break;
        }

        // A round: writers until the target dies under them.
        let start = Arc::new(Barrier::new(WRITERS as usize + 1));
        let handles: Vec<_> = (0..WRITERS)
            .map(|j| {
                let (_c, ns) = open(&t, holder);
                let (start, sent) = (start.clone(), sent.clone());
                std::thread::spawn(move || {
                    let _c = _c;
                    writer(ns, j, sent, &start)
                })
            })
            .collect();
        start.wait();
        std::thread::sleep(Duration::from_millis(150 + rand::random::<u64>() % 250));
        t.kill();
        for (j, h) in handles.into_iter().enumerate() {
            let (run, s) = h.join().expect("writer");
            for b in (j as u64..BLOCKS).step_by(WRITERS as usize) {
                sent[b as usize] = s[b as usize];
            }
            for &(b, g, ok, f) in &run.writes {
                if ok {
                    acked[b as usize] = g;
                    writes += 1;
                    fua += u64::from(f);
                } else {
                    unacked += 1;
                }
            }
            flushes += run.flushes;
        }
        t.restart();
    }
    println!(
        "{ROUNDS} SIGKILLs in {:.1} s: {writes} acknowledged writes ({fua} FUA) and {flushes} flushes, {unacked} writes cut off by the kill; after every restart all {BLOCKS} blocks held what the host was told and the reservation was unchanged",
        t0.elapsed().as_secs_f64()
    );
    assert!(writes > 0 && flushes > 0, "the rounds wrote nothing");
}
