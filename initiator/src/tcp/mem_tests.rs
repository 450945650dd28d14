//! The host queue and its NVMe/TCP link over an in-memory wire ([`super::mem`]): no socket,
//! no thread. A controller written here answers through the wire; the tests choose every
//! short read and write, the order of the answers and how the data is cut, so an interleaving
//! runs the same way every time; the queue's deadlines run on a virtual clock that a sleep
//! moves at once. The last test runs many random interleavings and checks the
//! queue's bookkeeping: every command completes exactly once with its data, and no tag, buffer
//! or transfer is left behind.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use nvme::opcode::io;
use nvme::sgl::Sgl;
use nvme::tcp::{DataPdu, IcReq, OwnedPdu, Pdu, PduCollector, R2t, RxConfig, TxConfig};
use nvme::{Cqe, Sqe, Status};

use super::mem::MemEnd;
use super::TcpLink;
use crate::cmd::{Completion, Data};
use crate::error::Error;
use crate::queue::{Clock, Queue, QueueParams};
use crate::spin::Spin;
use crate::test_rng::Rng;

type Q = Queue<TcpLink<Vec<u8>>>;

const BS: usize = 512;

/// A queue of `depth` over a fresh wire (MAXH2CDATA `maxh2cdata`), and the wire.
fn queue(depth: u16, maxh2cdata: u32) -> (Q, MemEnd) {
    let end = MemEnd::default();
    let p = QueueParams {
        qid: 1,
        depth,
        hdgst: false,
        ddgst: false,
        timeout: Duration::from_secs(30),
        spin: Spin::NEVER,
    };
    let link = TcpLink::over_mem(end.clone(), &p, maxh2cdata);
    (Queue::new(link, p.timeout, p.spin), end)
}

/// The controller's end of the wire.
struct Ctrl {
    end: MemEnd,
    rx: PduCollector,
    tx: TxConfig,
    got: VecDeque<OwnedPdu>,
}

impl Ctrl {
    fn new(end: &MemEnd) -> Ctrl {
        let mut rx = PduCollector::new(RxConfig {
            max_data_pdu: 1 << 20,
            max_incapsule: 1 << 20,
            ..RxConfig::controller()
        });
        // Past the exchange: the collector has seen the host's ICReq.
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: false,
            ddgst: false,
            maxr2t: 0,
        };
        rx.push(&req.encode()).expect("an ICReq");
        Ctrl {
            end: end.clone(),
            rx,
            tx: TxConfig::default(),
            got: VecDeque::new(),
        }
    }

    /// The PDUs the host sent so far.
    fn take(&mut self) -> Option<OwnedPdu> {
        let bytes = self.end.take_sent();
        if !bytes.is_empty() {
            let pdus = self.rx.push(&bytes).expect("valid PDUs from the host");
            self.got.extend(pdus);
        }
        self.got.pop_front()
    }

    fn send(&self, pdu: Pdu, data: &[u8]) {
        self.end.deliver(&pdu.encode(&self.tx, data));
    }

    fn resp(&self, cid: u16, status: Status) {
        self.send(Pdu::CapsuleResp(Cqe::new(cid, status, 0)), &[]);
    }
}

fn rw(opcode: u8, slba: u64, blocks: u32) -> Sqe {
    crate::cmd::rw_sqe(opcode, 1, slba, blocks)
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed * 7) as u8)
        .collect()
}

/// Poll until `n` completions are in `out` (the wire needs no waiting: the controller's
/// bytes are there or not).
fn poll_for(q: &mut Q, out: &mut Vec<Completion>, n: usize) {
    for _ in 0..100_000 {
        if out.len() >= n {
            return;
        }
        q.poll(out).unwrap();
    }
    panic!("{} of {n} completions", out.len());
}

/// A read whose data comes in 1-byte reads of the link, in C2HData PDUs of 100 bytes, then the
/// response: the data lands whole, and the queue's tag is free again.
#[test]
fn a_read_through_one_byte_reads_and_small_pdus() {
    let (mut q, end) = queue(4, 4096);
    let mut c = Ctrl::new(&end);
    q.submit(rw(io::READ, 0, 4), Data::FromController(vec![0; 4 * BS]), 9)
        .unwrap();
    let mut out = Vec::new();
    q.poll(&mut out).unwrap();
    let cmd = c.take().expect("the command capsule");
    let Pdu::CapsuleCmd { sqe, .. } = cmd.pdu else {
        panic!("{cmd:?}")
    };
    end.lock().recv_max = 1;
    let data = pattern(4 * BS, 1);
    for (i, part) in data.chunks(100).enumerate() {
        let d = DataPdu {
            cccid: sqe.cid(),
            datao: (i * 100) as u32,
            datal: part.len() as u32,
            last: (i + 1) * 100 >= data.len(),
            ..Default::default()
        };
        c.send(Pdu::C2HData(d), part);
    }
    c.resp(sqe.cid(), Status::SUCCESS);
    poll_for(&mut q, &mut out, 1);
    assert_eq!((out[0].user_data, out[0].result), (9, Ok(0)));
    assert_eq!(out[0].buf.as_deref(), Some(&data[..]));
    assert_eq!(q.free_slots(), 4);
    assert!(end.lock().reads > 2000, "one byte at a time");
}

/// A write taken by R2T while the wire takes 7 bytes per write and is sometimes full: the
/// H2CData PDUs are cut at MAXH2CDATA and carry every byte in order.
#[test]
fn a_write_by_r2t_through_short_and_blocked_writes() {
    let (mut q, end) = queue(4, 4096);
    let mut c = Ctrl::new(&end);
    let data = pattern(10_240, 2);
    q.submit(rw(io::WRITE, 8, 20), Data::ToController(data.clone()), 3)
        .unwrap();
    end.lock().send_max = 7;
    let mut out = Vec::new();
    let mut got = vec![0u8; data.len()];
    let mut sqe = None;
    let mut r2t_sent = false;
    let mut received = 0usize;
    for step in 0..200_000 {
        end.lock().full = step % 3 == 0;
        q.poll(&mut out).unwrap();
        while let Some(p) = c.take() {
            match p.pdu {
                Pdu::CapsuleCmd { sqe: s, .. } => {
                    assert!(p.data.is_empty(), "10 KiB is not in-capsule");
                    assert_eq!(
                        Sgl::decode(&s.dptr).unwrap(),
                        Sgl::Transport { len: 10_240 }
                    );
                    sqe = Some(s);
                }
                Pdu::H2CData(d) => {
                    assert!(d.datal <= 4096);
                    assert_eq!(d.datao as usize, received, "in order");
                    got[received..][..p.data.len()].copy_from_slice(&p.data);
                    received += p.data.len();
                }
                other => panic!("{other:?}"),
            }
        }
        if let Some(s) = sqe {
            if !r2t_sent {
                let r = R2t {
                    cccid: s.cid(),
                    ttag: 1,
                    r2to: 0,
                    r2tl: 10_240,
                };
                c.send(Pdu::R2T(r), &[]);
                r2t_sent = true;
            } else if received == data.len() {
                c.resp(s.cid(), Status::SUCCESS);
                sqe = None;
            }
        }
        if !out.is_empty() {
            break;
        }
    }
    assert_eq!(got, data);
    assert_eq!((out.len(), out[0].result), (1, Ok(0)));
    assert_eq!(q.free_slots(), 4);
}

/// The controller closes the stream with commands in flight: each completes exactly once
/// (with an error and its buffer back), the queue is failed, and every tag is free.
#[test]
fn a_closed_stream_fails_every_command_once() {
    let (mut q, end) = queue(8, 4096);
    for i in 0..6u64 {
        let data = if i % 2 == 0 {
            Data::FromController(vec![0; BS])
        } else {
            Data::ToController(pattern(BS, i))
        };
        let op = if i % 2 == 0 { io::READ } else { io::WRITE };
        q.submit(rw(op, i, 1), data, i).unwrap();
    }
    let mut out = Vec::new();
    q.poll(&mut out).unwrap();
    end.shut();
    let _ = q.poll(&mut out);
    assert!(q.is_failed());
    let mut ids: Vec<u64> = out.iter().map(|c| c.user_data).collect();
    ids.sort();
    assert_eq!(ids, (0..6).collect::<Vec<_>>());
    assert!(out.iter().all(|c| c.result.is_err() && c.buf.is_some()));
    assert_eq!(q.in_flight(), 0);
    assert_eq!(q.free_slots(), 8);
}

/// A command the controller never answers: `reap` without a timeout sleeps until the
/// command's deadline, which on the virtual clock passes at once: the queue fails with a
/// timeout after exactly its 30 s of (virtual) time, the command completes once with an
/// error, and no real time went by.
#[test]
fn an_unanswered_command_times_out_on_the_virtual_clock() {
    let (mut q, end) = queue(4, 4096);
    let clock = Clock::virtual_now();
    q.set_clock(clock.clone());
    let t0 = clock.now();
    let real = std::time::Instant::now();
    q.submit(rw(io::READ, 0, 1), Data::FromController(vec![0; BS]), 1)
        .unwrap();
    let mut out = Vec::new();
    let n = q.reap(&mut out, 1, None).unwrap();
    assert_eq!(n, 1);
    assert!(out[0].result.is_err(), "{:?}", out[0].result);
    assert!(matches!(q.error(), Some(Error::Timeout(t, _)) if *t == Duration::from_secs(30)));
    assert_eq!(clock.now() - t0, Duration::from_secs(30), "virtual time");
    assert!(real.elapsed() < Duration::from_secs(5), "no real wait");
    assert_eq!((q.in_flight(), q.free_slots()), (0, 4));
    assert!(end.lock().closed, "the failed queue shut its stream");
}

/// `reap` with a 5 s timeout and no answer returns nothing after 5 s of virtual time, the
/// command still in flight; the answer then completes it.
#[test]
fn a_reap_timeout_passes_on_the_virtual_clock() {
    let (mut q, end) = queue(4, 4096);
    let mut c = Ctrl::new(&end);
    let clock = Clock::virtual_now();
    q.set_clock(clock.clone());
    let t0 = clock.now();
    q.submit(rw(io::READ, 0, 1), Data::FromController(vec![0; BS]), 1)
        .unwrap();
    let mut out = Vec::new();
    assert_eq!(
        q.reap(&mut out, 1, Some(Duration::from_secs(5))).unwrap(),
        0
    );
    assert_eq!(clock.now() - t0, Duration::from_secs(5));
    assert_eq!(q.in_flight(), 1);
    let p = c.take().expect("the command");
    let Pdu::CapsuleCmd { sqe, .. } = p.pdu else {
        panic!("{p:?}")
    };
    let d = DataPdu {
        cccid: sqe.cid(),
        datal: BS as u32,
        last: true,
        success: true,
        ..Default::default()
    };
    c.send(Pdu::C2HData(d), &pattern(BS, 4));
    assert_eq!(
        q.reap(&mut out, 1, Some(Duration::from_secs(5))).unwrap(),
        1
    );
    assert_eq!(out[0].buf.as_deref(), Some(&pattern(BS, 4)[..]));
    assert!(clock.now() - t0 < Duration::from_secs(10));
}

/// Where `a` and `b` first differ (a length difference counts at the shorter's end).
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))
}

/// One command as the controller sees it.
struct Pending {
    sqe: Sqe,
    /// Bytes of data (read: to send; write: to take).
    len: usize,
    /// Read: bytes sent so far. Write: bytes received so far.
    done: usize,
    write: bool,
    /// Write: bytes asked for by R2T so far.
    asked: usize,
}

/// Many random interleavings of one queue and the controller: commands of random direction
/// and size submitted while tags are free (half the runs send small writes in the capsule); the controller answers them in random order,
/// cuts read data into random C2HData PDUs (sometimes ending with SUCCESS instead of a
/// response), asks for write data by R2Ts of random size; the wire's reads and writes are cut
/// short at random and it is sometimes full. Every command completes exactly once, with
/// success; a read brings the controller's data, a write delivers its own; at the end no tag
/// is in use and the statistics count every command.
#[test]
fn random_interleavings_complete_every_command_once_and_leak_nothing() {
    for seed in 1..=200u64 {
        let mut r = Rng::new(seed);
        let depth = 1 + r.below(8) as u16;
        let (mut q, end) = queue(depth, 4096);
        // Half the runs send writes of up to 4 KiB in the capsule.
        let in_capsule = r.chance(50);
        if in_capsule {
            q.set_icd_max(4096);
        }
        let mut c = Ctrl::new(&end);
        let total = 40 + r.below(40);
        let mut submitted = 0u64;
        // What each command must end with: a read's data, a write's data (by value).
        let mut expect: HashMap<u64, (bool, Vec<u8>)> = HashMap::new();
        let mut written: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut pending: Vec<Pending> = Vec::new();
        let mut done: HashMap<u64, u32> = HashMap::new();
        let mut out = Vec::new();
        let mut steps = 0u64;
        while done.len() < total as usize {
            steps += 1;
            assert!(
                steps < 2_000_000,
                "seed {seed}: stuck at {} of {total}",
                done.len()
            );
            {
                let mut w = end.lock();
                w.recv_max = [0, 1, 3, 64, 700, 5000][r.below(6) as usize];
                w.send_max = [0, 1, 5, 100, 3000][r.below(5) as usize];
                w.full = r.chance(20);
            }
            // The host: submit while there are tags, and poll.
            if submitted < total && q.free_slots() > 0 && r.chance(50) {
                let v = submitted;
                let blocks = 1 + r.below(24) as u32;
                let len = blocks as usize * BS;
                // Each command its own blocks: answers in any order cannot mix them up.
                let slba = v * 32;
                let write = r.chance(50);
                let data = pattern(len, seed * 1000 + v);
                let (sqe, d) = if write {
                    (
                        rw(io::WRITE, slba, blocks),
                        Data::ToController(data.clone()),
                    )
                } else {
                    (
                        rw(io::READ, slba, blocks),
                        Data::FromController(vec![0; len]),
                    )
                };
                q.submit(sqe, d, v).unwrap();
                expect.insert(v, (write, data));
                submitted += 1;
            }
            out.clear();
            if let Err(e) = q.poll(&mut out) {
                panic!("seed {seed}: the queue failed: {e}");
            }
            for cpl in out.drain(..) {
                let v = cpl.user_data;
                *done.entry(v).or_default() += 1;
                assert_eq!(done[&v], 1, "seed {seed}: command {v} completed twice");
                assert_eq!(
                    cpl.result,
                    Ok(0),
                    "seed {seed}: command {v}: {:?}",
                    q.error()
                );
                let (write, data) = &expect[&v];
                let got = if *write {
                    written.get(&v).map(|w| &w[..])
                } else {
                    cpl.buf.as_deref()
                };
                let at = got.map(|g| first_difference(g, data));
                assert_eq!(
                    at,
                    Some(None),
                    "seed {seed}: command {v} (write {write}): first difference"
                );
            }
            // The controller: take what arrived, then move one command on.
            while let Some(p) = c.take() {
                match p.pdu {
                    Pdu::CapsuleCmd { sqe, .. } => {
                        let write = sqe.opcode == io::WRITE;
                        let len = sqe.nlb() as usize * BS;
                        let inline = write && in_capsule && len <= 4096;
                        assert_eq!(p.data.len(), if inline { len } else { 0 }, "seed {seed}");
                        let v = sqe.slba() / 32;
                        if write && !p.data.is_empty() {
                            written.insert(v, p.data.clone());
                        }
                        pending.push(Pending {
                            sqe,
                            len,
                            done: if write { p.data.len() } else { 0 },
                            write,
                            asked: if write { p.data.len() } else { 0 },
                        });
                    }
                    Pdu::H2CData(d) => {
                        let cmd = pending
                            .iter_mut()
                            .find(|x| x.sqe.cid() == d.cccid)
                            .expect("H2CData for a command in flight");
                        assert_eq!(d.datao as usize, cmd.done, "seed {seed}: in order");
                        let v = cmd.sqe.slba() / 32;
                        written.entry(v).or_default().extend_from_slice(&p.data);
                        cmd.done += p.data.len();
                    }
                    other => panic!("seed {seed}: {other:?}"),
                }
            }
            if pending.is_empty() || !r.chance(60) {
                continue;
            }
            let i = r.below(pending.len() as u64) as usize;
            let cmd = &mut pending[i];
            let cid = cmd.sqe.cid();
            if cmd.write {
                if cmd.done == cmd.len {
                    c.resp(cid, Status::SUCCESS);
                    pending.swap_remove(i);
                } else if cmd.asked == cmd.done {
                    let n = (1 + r.below(cmd.len as u64 - cmd.asked as u64)) as usize;
                    let n = n.div_ceil(4).saturating_mul(4).min(cmd.len - cmd.asked);
                    let r2 = R2t {
                        cccid: cid,
                        ttag: 1 + r.below(100) as u16,
                        r2to: cmd.asked as u32,
                        r2tl: n as u32,
                    };
                    c.send(Pdu::R2T(r2), &[]);
                    cmd.asked += n;
                }
            } else if cmd.done == cmd.len {
                c.resp(cid, Status::SUCCESS);
                pending.swap_remove(i);
            } else {
                let v = cmd.sqe.slba() / 32;
                let data = &expect[&v].1;
                let n = (1 + r.below(cmd.len as u64 - cmd.done as u64)) as usize;
                let last = cmd.done + n == cmd.len;
                let success = last && r.chance(30);
                let d = DataPdu {
                    cccid: cid,
                    datao: cmd.done as u32,
                    datal: n as u32,
                    last,
                    success,
                    ..Default::default()
                };
                c.send(Pdu::C2HData(d), &data[cmd.done..cmd.done + n]);
                cmd.done += n;
                if success {
                    // Answered: the host may give its tag (and CID) to a new command at once.
                    pending.swap_remove(i);
                }
            }
        }
        assert_eq!(q.in_flight(), 0, "seed {seed}");
        assert_eq!(
            q.free_slots(),
            depth as usize,
            "seed {seed}: tags left in use"
        );
        assert!(
            pending.is_empty(),
            "seed {seed}: the controller still has commands"
        );
        let s = q.stats();
        assert_eq!(
            (s.commands, s.completed),
            (total, total),
            "seed {seed}: {s:?}"
        );
        assert!(!q.is_failed(), "seed {seed}");
    }
}
