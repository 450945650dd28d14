//! The NVMe/TCP connection's state machine without a socket: a [`MemWire`] for the stream, a
//! [`MemStore`] for the pool and backend, and a clock that only moves when a test moves it.
//! The rig drives the connection as the poller does (read, serve the buffer FIFO, reap the
//! backend, flush, tick) and parses what the target sent with the host-side deframer.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::fabrics::{connect_sqe, ConnectData};
use nvme::identify::feat;
use nvme::opcode::io;
use nvme::sgl::Sgl;
use nvme::tcp::{DataPdu, Fes, IcReq, OwnedPdu, Pdu, PduCollector, RxConfig, TxConfig, PFV_1_0};
use nvme::{Cqe, Sqe, Status};
use proptest::prelude::*;

use super::*;
use crate::core::tests::{
    rw_sqe as rw, tcp_caps, test_target, test_target_with, Host, HOSTID, HOSTNQN, SUBNQN,
};
use crate::core::{Target, TrType};
use crate::transport::mem::{MemStore, MemWire};
use crate::transport::Kind;

/// Buffers of the rig's receive ring: completions one reap hands over at most.
const RIG_RING_BUFFERS: usize = 64;

/// Namespace 1 of the core tests' target: 4 KiB blocks.
const BLK: u32 = 4096;

/// Caps of the rig's connection: small buffers, so transfers above 16 KiB move in pieces.
fn caps() -> TransportCaps {
    TransportCaps {
        trtype: TrType::Tcp,
        in_capsule_data: 8192,
        max_io_size: 16 * 1024,
        max_transfer: 64 * 1024,
        max_queue_depth: 32,
    }
}

struct Rig {
    conn: Conn<MemWire>,
    store: MemStore,
    now: Instant,
    /// The host's view of what the target sent.
    rx: PduCollector,
    /// PDUs received and not yet looked at.
    got: VecDeque<OwnedPdu>,
    /// What the host sends with (digests as negotiated).
    tx: TxConfig,
    /// Slots waiting for a buffer, as the poller's FIFO.
    need_buf: VecDeque<u16>,
    /// The admin queue whose controller the I/O queue joins (kept alive).
    _admin: Host,
    _target: Arc<Target>,
    cntlid: u16,
    /// Receive as the poller's io_uring ring does, in pieces of at most this many bytes
    /// (None: read the stream as after an epoll report).
    ring: Option<usize>,
}

impl Rig {
    /// An I/O queue connection (not yet IC-exchanged) with `bufs` pool buffers.
    fn new(bufs: usize) -> Rig {
        Rig::on(test_target(), bufs)
    }

    /// As [`Rig::new`], on `target`.
    fn on(target: Arc<Target>, bufs: usize) -> Rig {
        let now = Instant::now();
        let mut admin = Host::new(&target, tcp_caps(), now);
        let cntlid = admin.bring_up(SUBNQN, HOSTNQN);
        admin
            .set_features(feat::NUM_QUEUES, 3 | 3 << 16, &[])
            .ok_result();
        let caps = caps();
        let conn = Conn::with_wire(
            MemWire::default(),
            target.clone(),
            caps.clone(),
            Arc::new(|| {}),
        );
        Rig {
            conn,
            store: MemStore::new(bufs, caps.max_io_size as usize),
            now,
            rx: PduCollector::new(RxConfig::host()),
            got: VecDeque::new(),
            tx: TxConfig::default(),
            need_buf: VecDeque::new(),
            _admin: admin,
            _target: target,
            cntlid,
            ring: None,
        }
    }

    /// IC exchange and Connect of I/O queue 1 (SQSIZE 31).
    fn connected(bufs: usize, ddgst: bool) -> Rig {
        Rig::connected_cattr(bufs, ddgst, 0)
    }

    /// Connected with Connect's attributes `cattr` (bit 2: SQ flow control disabled).
    fn connected_cattr(bufs: usize, ddgst: bool, cattr: u8) -> Rig {
        Rig::connected_on(test_target(), bufs, ddgst, cattr)
    }

    /// As [`Rig::connected_cattr`], on `target`.
    fn connected_on(target: Arc<Target>, bufs: usize, ddgst: bool, cattr: u8) -> Rig {
        let mut r = Rig::on(target, bufs);
        r.ic(ddgst);
        let d = ConnectData::new(HOSTID, r.cntlid, SUBNQN, HOSTNQN);
        let sqe = connect_sqe(
            1,
            1,
            31,
            cattr,
            0,
            Sgl::InCapsule {
                offset: 0,
                len: 1024,
            },
        );
        r.capsule(&sqe, &d.encode());
        r.run();
        let c = r.cqe();
        assert!(c.status().is_success(), "connect: {c:?}");
        r
    }

    fn ic(&mut self, ddgst: bool) {
        let req = IcReq {
            pfv: PFV_1_0,
            hpda: 0,
            hdgst: false,
            ddgst,
            maxr2t: 0,
        };
        self.conn.wire_mut().deliver(&req.encode());
        self.run();
        match self.next().pdu {
            Pdu::IcResp(r) => assert_eq!(r.ddgst, ddgst),
            p => panic!("expected ICResp, got {p:?}"),
        }
        self.rx.deframer.set_digests(false, ddgst);
        self.tx.ddgst = ddgst;
    }

    /// The host sends a command capsule with `data` in it.
    fn capsule(&mut self, sqe: &Sqe, data: &[u8]) {
        let pdu = Pdu::CapsuleCmd {
            sqe: *sqe,
            data_len: data.len() as u32,
        };
        let bytes = pdu.encode(&self.tx, data);
        self.conn.wire_mut().deliver(&bytes);
    }

    /// The host sends one H2CData PDU.
    fn h2c(&mut self, d: DataPdu, data: &[u8]) {
        let bytes = Pdu::H2CData(d).encode(&self.tx, data);
        self.conn.wire_mut().deliver(&bytes);
    }

    /// What one reap of the poller's receive ring hands the connection: the stream in
    /// completions of at most `piece` bytes, as many as [`RIG_RING_BUFFERS`] buffers hold (the
    /// stream's end when it is closed and empty), then what the connection reads straight
    /// into a buffer from what is left. True when anything moved.
    fn receive(&mut self, piece: usize, w: &mut Wants) -> bool {
        let mut moved = false;
        for _ in 0..RIG_RING_BUFFERS {
            if self.conn.is_closing() {
                return moved;
            }
            let wire = self.conn.wire_mut();
            let n = piece.min(wire.inbound.len());
            if n == 0 {
                if wire.peer_closed {
                    self.conn
                        .close(&mut self.store, "host closed the connection");
                    return true;
                }
                break;
            }
            let bytes: Vec<u8> = wire.inbound.drain(..n).collect();
            self.conn.on_received(&bytes, &mut self.store, self.now, w);
            moved = true;
        }
        moved | self.conn.read_direct_now(&mut self.store, self.now, w)
    }

    /// One poller pass: read, serve waiting slots, reap the backend, flush, tick.
    /// True when anything moved.
    fn pass(&mut self) -> bool {
        let mut w = Wants::default();
        let mut moved = match self.ring {
            Some(piece) => self.receive(piece, &mut w),
            None => self.conn.on_readable(&mut self.store, self.now, &mut w),
        };
        self.need_buf.extend(w.need_buffer.drain(..));
        moved |= self.serve_buffers();
        let mut done = Vec::new();
        self.store.reap(&mut done);
        for (ud, res) in done {
            let r = ReqRef::from_user_data(ud);
            assert_eq!((r.kind, r.conn), (Kind::Tcp, self.conn.conn_key));
            self.conn
                .backend_done(r.slot as u16, res, &mut self.store, self.now);
            moved = true;
        }
        moved |= self.serve_buffers();
        let sent_before = self.conn.wire().outbound.len();
        match self.ring {
            Some(_) => self.send_gathered(),
            None => {
                self.conn.flush(&mut self.store, self.now);
            }
        }
        moved |= self.conn.wire().outbound.len() != sent_before;
        self.conn.tick(&mut self.store, self.now);
        self.collect();
        self.check();
        moved
    }

    /// One send as the poller makes it through its io_uring ring: the connection gathers its
    /// queue into iovecs, the stream takes what it takes, the connection hears the result.
    fn send_gathered(&mut self) {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut iov = [empty; 64];
        let n = self.conn.send_gather(&mut iov, &mut self.store, self.now);
        if n == 0 {
            return;
        }
        let slices: Vec<IoSlice<'_>> = iov[..n]
            .iter()
            .map(|v| {
                // SAFETY: the connection keeps what its iovecs point at until `send_done`.
                let bytes = unsafe { std::slice::from_raw_parts(v.iov_base.cast(), v.iov_len) };
                IoSlice::new(bytes)
            })
            .collect();
        let res = self.conn.wire_mut().send(&slices);
        self.conn.send_done(res, &mut self.store, self.now);
    }

    /// The poller's buffer FIFO: oldest waiter first, while the pool has buffers.
    fn serve_buffers(&mut self) -> bool {
        let mut moved = false;
        while !self.need_buf.is_empty() {
            if self.conn.is_closing() {
                self.need_buf.clear();
                break;
            }
            let Some(b) = self.store.alloc_buf() else {
                break;
            };
            let slot = self.need_buf.pop_front().expect("checked");
            self.conn.buffer_granted(slot, b, &mut self.store, self.now);
            moved = true;
        }
        moved
    }

    /// Passes until nothing moves.
    fn run(&mut self) {
        for _ in 0..100_000 {
            if !self.pass() {
                return;
            }
        }
        panic!("the connection never settled");
    }

    fn collect(&mut self) {
        let bytes = self.conn.wire_mut().take_sent();
        let pdus = self
            .rx
            .push(&bytes)
            .expect("the target sends well-formed PDUs");
        self.got.extend(pdus);
    }

    fn next(&mut self) -> OwnedPdu {
        self.got.pop_front().expect("a PDU from the target")
    }

    fn cqe(&mut self) -> Cqe {
        match self.next().pdu {
            Pdu::CapsuleResp(c) => c,
            p => panic!("expected CapsuleResp, got {p:?}"),
        }
    }

    /// The slot and buffer books balance (checked after every pass).
    fn check(&self) {
        let c = &self.conn;
        let counts = c.state_counts();
        assert_eq!(counts.iter().sum::<u32>() as usize, c.slots.len());
        let mut actual = [0u32; SLOT_STATES];
        for s in &c.slots {
            actual[s.state as usize] += 1;
        }
        assert_eq!(counts, actual, "per-state counts");
        let mut free: Vec<u16> = c.free_slots.clone();
        free.sort_unstable();
        let want: Vec<u16> = (0..c.slots.len() as u16)
            .filter(|&i| c.slots[i as usize].state == SlotState::Free)
            .collect();
        assert_eq!(free, want, "the free list is exactly the free slots");
        let held = c.slots.iter().filter(|s| s.buf.is_some()).count();
        assert_eq!(
            held,
            self.store.buffers_in_use(),
            "every pool buffer has one owner"
        );
        for s in &c.slots {
            match s.state {
                SlotState::Free => assert!(s.buf.is_none() && s.cmd.is_none()),
                SlotState::NeedBuffer => assert!(s.buf.is_none()),
                _ => assert!(
                    s.cmd.is_some(),
                    "busy slot without a command: {:?}",
                    s.state
                ),
            }
        }
        assert_eq!(c.inflight as usize, self.store.inflight());
    }

    fn idle(&self) -> bool {
        self.conn.state_counts()[SlotState::Free as usize] as usize == self.conn.slots.len()
            && self.store.buffers_in_use() == 0
    }
}

fn read(cid: u16, slba: u64, blocks: u32) -> Sqe {
    let len = blocks * BLK;
    rw(io::READ, cid, slba, blocks, Sgl::Transport { len })
}

fn write_r2t(cid: u16, slba: u64, blocks: u32) -> Sqe {
    let len = blocks * BLK;
    rw(io::WRITE, cid, slba, blocks, Sgl::Transport { len })
}

fn write_in_capsule(cid: u16, slba: u64, blocks: u32) -> Sqe {
    let len = blocks * BLK;
    rw(
        io::WRITE,
        cid,
        slba,
        blocks,
        Sgl::InCapsule { offset: 0, len },
    )
}

/// What `MemStore` puts in a read at byte offset `off` of the namespace.
fn pattern(off: u64) -> u8 {
    (off >> 9) as u8 | 1
}

#[test]
fn write_by_r2t_and_read_in_pieces() {
    let mut r = Rig::connected(4, false);
    // 24 KiB: more than in-capsule data, so by R2T; more than a 16 KiB buffer, so in two
    // pieces, each asked for by its own R2T.
    r.capsule(&write_r2t(7, 10, 6), &[]);
    r.run();
    let mut data_sent = 0u32;
    for (off, len) in [(0u32, 16384u32), (16384, 8192)] {
        let r2t = match r.next().pdu {
            Pdu::R2T(t) => t,
            p => panic!("expected R2T, got {p:?}"),
        };
        assert_eq!((r2t.cccid, r2t.r2to, r2t.r2tl), (7, off, len));
        assert!(r.got.is_empty(), "one R2T at a time");
        // The host answers in two PDUs.
        let half = len / 2;
        for (o, l) in [(off, half), (off + half, len - half)] {
            let d = DataPdu {
                cccid: 7,
                ttag: r2t.ttag,
                datao: o,
                datal: l,
                last: o + l == off + len,
                success: false,
            };
            r.h2c(d, &vec![0xab; l as usize]);
            data_sent += l;
        }
        r.run();
    }
    assert_eq!(data_sent, 24576);
    assert_eq!(r.store.submitted, 2, "one backend write per piece");
    assert!(r.cqe().status().is_success());
    assert!(r.idle());

    // A 40 KiB read: C2HData pieces at 0, 16K, 32K, LAST only on the last, then the response.
    r.capsule(&read(8, 100, 10), &[]);
    r.run();
    let mut off = 0u32;
    for len in [16384u32, 16384, 8192] {
        let p = r.next();
        let Pdu::C2HData(d) = p.pdu else {
            panic!("expected C2HData, got {:?}", p.pdu)
        };
        assert_eq!((d.cccid, d.datao, d.datal), (8, off, len));
        assert_eq!(d.last, off + len == 40960);
        let base = 100 * BLK as u64 + off as u64;
        assert_eq!(
            p.data[0],
            pattern(base),
            "piece at {off} read at its own offset"
        );
        assert_eq!(p.data[len as usize - 1], pattern(base));
        off += len;
    }
    assert!(r.cqe().status().is_success());
    assert!(r.idle());
}

#[test]
fn a_reads_data_completes_it_where_the_host_disabled_sq_flow_control_or_the_target_says_always() {
    // (SQ flow control disabled, target.c2h_success, the C2HData completes the command)
    for (sqfc_off, always, implicit) in [
        (false, false, false),
        (true, false, true),
        (false, true, true),
        (true, true, true),
    ] {
        let target = test_target_with(|p| p.data_completes_always = always);
        let mut r = Rig::connected_on(target, 2, false, if sqfc_off { 0x04 } else { 0 });
        r.capsule(&read(3, 0, 1), &[]);
        r.run();
        let p = r.next();
        let Pdu::C2HData(d) = p.pdu else {
            panic!("expected C2HData, got {:?}", p.pdu)
        };
        assert!(d.last);
        assert_eq!(
            d.success, implicit,
            "sq flow control off {sqfc_off}, always {always}"
        );
        if !implicit {
            assert!(r.cqe().status().is_success());
        }
        assert!(r.got.is_empty(), "nothing more for the read: {:?}", r.got);
        assert!(r.idle());
        // A failed read still gets its response capsule, and no SUCCESS.
        r.capsule(&read(4, u64::MAX / 2, 1), &[]);
        r.run();
        let c = r.cqe();
        assert!(!c.status().is_success(), "{c:?}");
        assert!(r.idle());
    }
}

#[test]
fn data_still_on_the_stream_is_read_straight_into_the_buffer() {
    let mut r = Rig::connected(2, false);
    let bytes = Pdu::CapsuleCmd {
        sqe: write_in_capsule(1, 0, 2),
        data_len: 8192,
    }
    .encode(&r.tx, &[0x44; 8192]);
    let copied = r.conn.stats.copied_bytes; // the Connect data came with its header
                                            // The header arrives alone; the data later, as a host's large PDU often does.
    r.conn.wire_mut().deliver(&bytes[..72]);
    r.run();
    r.conn.wire_mut().deliver(&bytes[72..]);
    r.run();
    assert!(r.cqe().status().is_success());
    assert_eq!(r.conn.stats.copied_bytes, copied, "no copy in user space");
    assert!(r.idle());
}

#[test]
fn data_received_through_the_ring_is_read_straight_into_the_buffer_after_it() {
    let mut r = Rig::connected(2, false);
    r.ring = Some(16 * 1024);
    let bytes = Pdu::CapsuleCmd {
        sqe: write_in_capsule(1, 0, 2),
        data_len: 8192,
    }
    .encode(&r.tx, &[0x44; 8192]);
    let copied = r.conn.stats.copied_bytes;
    // A ring buffer holds the header and the first 100 bytes of data: those are copied, the
    // rest is read from the socket into the slot's buffer.
    r.conn.wire_mut().deliver(&bytes[..172]);
    let mut w = Wants::default();
    r.conn
        .on_received(&bytes[..172], &mut r.store, r.now, &mut w);
    r.conn.wire_mut().inbound.clear();
    r.need_buf.extend(w.need_buffer.drain(..));
    r.serve_buffers();
    r.conn.wire_mut().deliver(&bytes[172..]);
    r.conn.read_direct_now(&mut r.store, r.now, &mut w);
    r.run();
    assert!(r.cqe().status().is_success());
    assert_eq!(
        r.conn.stats.copied_bytes,
        copied + 100,
        "only what the ring buffer held"
    );
    assert!(r.idle());
}

#[test]
fn single_byte_reads_and_sends_give_the_same_answers() {
    let mut r = Rig::connected(2, false);
    r.conn.wire_mut().recv_max = 1;
    r.conn.wire_mut().send_max = 1;
    r.capsule(&write_in_capsule(3, 0, 2), &vec![0x11; 8192]);
    r.capsule(&read(4, 0, 1), &[]);
    r.run();
    assert!(r.cqe().status().is_success());
    let p = r.next();
    assert!(matches!(p.pdu, Pdu::C2HData(d) if d.cccid == 4 && d.datal == 4096));
    assert!(r.cqe().status().is_success());
    assert!(r.idle());
    assert!(
        r.conn.wire().recv_calls > 8192,
        "every byte was its own read"
    );
}

#[test]
fn a_slot_is_freed_only_after_its_response_left() {
    let mut r = Rig::connected(2, false);
    r.conn.wire_mut().send_room = 100;
    r.capsule(&read(5, 0, 2), &[]);
    r.run();
    // The read ran; its 8 KiB cannot leave yet: the slot keeps its buffer.
    assert_eq!(r.store.submitted, 1);
    assert_eq!(r.conn.state_counts()[SlotState::Sending as usize], 1);
    assert_eq!(r.store.buffers_in_use(), 1);
    assert!(r.got.is_empty());
    r.conn.wire_mut().send_room = usize::MAX;
    r.run();
    assert!(matches!(r.next().pdu, Pdu::C2HData(d) if d.datal == 8192));
    assert!(r.cqe().status().is_success());
    assert!(r.idle());
}

#[test]
fn a_large_reads_next_piece_waits_for_the_previous_to_leave() {
    let mut r = Rig::connected(1, false);
    r.conn.wire_mut().send_room = 0;
    r.capsule(&read(6, 0, 8), &[]);
    r.run();
    // The first piece is read and waits on the full stream: the second is not read into the
    // buffer under it.
    assert_eq!(r.store.submitted, 1);
    assert_eq!(r.conn.state_counts()[SlotState::SendingPiece as usize], 1);
    r.conn.wire_mut().send_room = usize::MAX;
    r.run();
    assert_eq!(r.store.submitted, 2);
    assert!(matches!(r.next().pdu, Pdu::C2HData(d) if d.datao == 0 && !d.last));
    assert!(matches!(r.next().pdu, Pdu::C2HData(d) if d.datao == 16384 && d.last));
    assert!(r.cqe().status().is_success());
    assert!(r.idle());
}

#[test]
fn misused_h2c_data_terminates_the_connection_and_frees_everything() {
    // (what is wrong, FES, FEI)
    type Case = (&'static str, fn(DataPdu) -> DataPdu, Fes, u32);
    let cases: [Case; 5] = [
        (
            "unknown TTAG",
            |d| DataPdu { ttag: 999, ..d },
            Fes::InvalidHeaderField,
            10,
        ),
        (
            "CCCID not the TTAG's",
            |d| DataPdu { cccid: 77, ..d },
            Fes::InvalidHeaderField,
            8,
        ),
        (
            "offset out of order",
            |d| DataPdu { datao: 4096, ..d },
            Fes::DataOutOfRange,
            12,
        ),
        (
            "beyond the R2T",
            |d| DataPdu { datal: 12288, ..d },
            Fes::DataOutOfRange,
            16,
        ),
        (
            "TTAG of a slot not receiving",
            |d| DataPdu {
                ttag: d.ttag ^ 1,
                ..d
            },
            Fes::InvalidHeaderField,
            10,
        ),
    ];
    for (what, bend, fes, fei) in cases {
        let mut r = Rig::connected(4, false);
        // Something else in flight on the backend when the error comes: its buffer must come
        // back too. (Its slot is the other TTAG the last case uses.)
        r.capsule(&read(1, 0, 1), &[]);
        let mut w = Wants::default();
        r.conn.on_readable(&mut r.store, r.now, &mut w);
        assert_eq!(r.store.inflight(), 1);
        r.capsule(&write_r2t(2, 0, 2), &[]);
        r.conn.on_readable(&mut r.store, r.now, &mut w);
        r.conn.flush(&mut r.store, r.now);
        r.collect();
        let t = match r.next().pdu {
            Pdu::R2T(t) => t,
            p => panic!("{what}: expected R2T, got {p:?}"),
        };
        let good = DataPdu {
            cccid: 2,
            ttag: t.ttag,
            datao: 0,
            datal: 8192,
            last: true,
            success: false,
        };
        let bad = bend(good);
        r.h2c(bad, &vec![0; bad.datal as usize]);
        r.run();
        let term = r
            .got
            .iter()
            .find_map(|p| match p.pdu {
                Pdu::C2HTermReq(t) => Some(t),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{what}: no C2HTermReq"));
        assert_eq!((term.fes(), term.fei), (Some(fes), fei), "{what}");
        assert!(r.conn.wire().shut, "{what}: stream shut down");
        assert!(
            r.conn.is_finished(),
            "{what}: backend drained, connection done"
        );
        assert!(r.idle(), "{what}: every slot and buffer released");
        assert_eq!(r.conn.stats.errors, 1, "{what}");
    }
}

#[test]
fn data_digest_error_fails_the_command_not_the_connection() {
    let mut r = Rig::connected(2, true);
    let sqe = write_in_capsule(9, 0, 1);
    let mut bytes = Pdu::CapsuleCmd {
        sqe,
        data_len: 4096,
    }
    .encode(&r.tx, &[0x22; 4096]);
    let n = bytes.len();
    bytes[n - 1] ^= 0xff; // the data digest
    r.conn.wire_mut().deliver(&bytes);
    r.run();
    let c = r.cqe();
    assert_eq!(c.cid(), 9);
    assert_eq!(c.status(), Status::TRANSIENT_TRANSPORT);
    assert_eq!(
        r.store.submitted, 0,
        "corrupt data never reaches the backend"
    );
    // The same write with a good digest goes through on the same connection.
    r.capsule(&write_in_capsule(10, 0, 1), &[0x22; 4096]);
    r.run();
    assert!(r.cqe().status().is_success());
    assert_eq!(r.store.submitted, 1);
    assert!(r.idle());
}

#[test]
fn without_a_buffer_in_capsule_data_is_received_aside_and_runs_in_order() {
    let mut r = Rig::connected(1, false);
    let copied = r.conn.stats.copied_bytes;
    // Two in-capsule writes and a read on a one-buffer pool: the second write's data is
    // received into its slot's spill memory while the first holds the buffer.
    r.capsule(&write_in_capsule(1, 0, 1), &[1; 4096]);
    r.capsule(&write_in_capsule(2, 1, 1), &[2; 4096]);
    r.capsule(&read(3, 2, 1), &[]);
    let mut w = Wants::default();
    r.conn.on_readable(&mut r.store, r.now, &mut w);
    assert!(r.conn.wire().inbound.is_empty(), "reading did not stop");
    assert_eq!(
        w.need_buffer.len(),
        2,
        "the spilled write and the read wait"
    );
    assert_eq!(r.conn.state_counts()[SlotState::NeedBuffer as usize], 2);
    assert_eq!(r.store.inflight(), 1);
    r.need_buf.extend(w.need_buffer.drain(..));
    r.run();
    assert_eq!(r.cqe().cid(), 1);
    assert_eq!(r.cqe().cid(), 2);
    assert!(matches!(r.next().pdu, Pdu::C2HData(d) if d.cccid == 3));
    assert_eq!(r.cqe().cid(), 3);
    assert!(r.idle());
    // Both writes' data came with their headers (copied from the stage), the spilled one's
    // once more from its spill memory into the buffer.
    assert_eq!(r.conn.stats.copied_bytes - copied, 3 * 4096);
}

#[test]
fn an_r2t_write_holding_the_last_buffer_is_not_blocked_by_in_capsule_data_behind_it() {
    // Found by the interleaving property test: a write waiting for its H2CData holds the
    // only buffer; an in-capsule write arrives; the H2CData that would free the buffer comes
    // after the in-capsule data on the stream. A connection that stopped reading until a
    // buffer freed up waited forever.
    let mut r = Rig::connected(1, false);
    r.capsule(&write_r2t(1, 0, 3), &[]);
    r.run();
    let t = match r.next().pdu {
        Pdu::R2T(t) => t,
        p => panic!("expected R2T, got {p:?}"),
    };
    r.capsule(&write_in_capsule(2, 8, 2), &[7; 8192]);
    let d = DataPdu {
        cccid: 1,
        ttag: t.ttag,
        datao: 0,
        datal: t.r2tl,
        last: true,
        success: false,
    };
    r.h2c(d, &vec![9; t.r2tl as usize]);
    r.run();
    assert_eq!(r.cqe().cid(), 1);
    assert_eq!(r.cqe().cid(), 2);
    assert_eq!(r.store.submitted, 2);
    assert!(r.idle());
}

#[test]
fn a_data_digest_error_on_spilled_data_needs_no_buffer() {
    let mut r = Rig::connected(1, true);
    r.capsule(&read(1, 0, 1), &[]);
    let mut w = Wants::default();
    r.conn.on_readable(&mut r.store, r.now, &mut w);
    assert_eq!(r.store.buffers_in_use(), 1);
    let mut bytes = Pdu::CapsuleCmd {
        sqe: write_in_capsule(2, 0, 1),
        data_len: 4096,
    }
    .encode(&r.tx, &[0x22; 4096]);
    let n = bytes.len();
    bytes[n - 2] ^= 1;
    r.conn.wire_mut().deliver(&bytes);
    r.conn.on_readable(&mut r.store, r.now, &mut w);
    assert!(
        w.need_buffer.is_empty(),
        "failed without waiting for a buffer"
    );
    r.run();
    let mut by_cid = BTreeMap::new();
    while let Some(p) = r.got.pop_front() {
        if let Pdu::CapsuleResp(c) = p.pdu {
            by_cid.insert(c.cid(), c.status());
        }
    }
    assert!(by_cid[&1].is_success());
    assert_eq!(by_cid[&2], Status::TRANSIENT_TRANSPORT);
    assert!(r.idle());
}

#[test]
fn a_closed_stream_waits_for_the_backend_before_it_is_finished() {
    let mut r = Rig::connected(2, false);
    r.capsule(&read(1, 0, 2), &[]);
    let mut w = Wants::default();
    r.conn.on_readable(&mut r.store, r.now, &mut w);
    assert_eq!(r.store.inflight(), 1);
    r.conn.wire_mut().peer_closed = true;
    r.conn.on_readable(&mut r.store, r.now, &mut w);
    assert!(r.conn.is_closing());
    assert!(!r.conn.is_finished(), "the read still owns its buffer");
    assert_eq!(r.store.buffers_in_use(), 1);
    r.run();
    assert!(r.conn.is_finished());
    assert!(r.idle());
    assert!(r.got.is_empty(), "nothing is sent after the close");
}

#[test]
fn closing_with_responses_queued_drops_them_and_frees_their_buffers() {
    let mut r = Rig::connected(2, false);
    r.conn.wire_mut().send_room = 0;
    r.capsule(&read(1, 0, 2), &[]);
    r.capsule(&read(2, 2, 2), &[]);
    r.run();
    assert_eq!(r.conn.state_counts()[SlotState::Sending as usize], 2);
    r.conn.wire_mut().peer_closed = true;
    r.conn.wire_mut().send_room = usize::MAX;
    r.run();
    assert!(r.conn.is_finished());
    assert!(r.idle());
}

/// A target whose namespace 1 has a store with its own compare-and-write of one block.
fn native_caw_target() -> Arc<Target> {
    let t = test_target();
    let mut subs = crate::core::tests::test_subsystems();
    subs[0].namespaces[0].native_caw = BLK;
    t.reconfigure(subs, crate::core::tests::test_listeners());
    t
}

/// A fused Compare (`FUSE_FIRST`) and Write (`FUSE_SECOND`) of one block, data in capsule.
fn send_caw(r: &mut Rig, cids: (u16, u16), slba: u64) {
    let sgl = Sgl::InCapsule {
        offset: 0,
        len: BLK,
    };
    let mut c = rw(io::COMPARE, cids.0, slba, 1, sgl);
    c.flags |= nvme::cmd::FUSE_FIRST;
    let mut w = rw(io::WRITE, cids.1, slba, 1, sgl);
    w.flags |= nvme::cmd::FUSE_SECOND;
    r.capsule(&c, &vec![0x11; BLK as usize]);
    r.capsule(&w, &vec![0x22; BLK as usize]);
}

#[test]
fn a_compare_and_write_the_store_runs_as_one_op_uses_both_buffers() {
    let mut r = Rig::connected_on(native_caw_target(), 4, false, 0);
    send_caw(&mut r, (5, 6), 3);
    r.run();
    assert_eq!(r.store.submitted, 1, "one op for the pair");
    let (cmp, write, first) = r.store.compare_and_writes[0];
    assert!(cmp.is_some() && write.is_some() && cmp != write);
    assert_eq!(first, 0x22, "the Write's data");
    let mut cids: Vec<(u16, bool)> = (0..2)
        .map(|_| {
            let c = r.cqe();
            (c.cid(), c.status().is_success())
        })
        .collect();
    cids.sort_unstable();
    assert_eq!(cids, vec![(5, true), (6, true)]);
    assert!(r.idle());
}

#[test]
fn a_compare_and_write_the_store_refuses_fails_both_commands() {
    let mut r = Rig::connected_on(native_caw_target(), 4, false, 0);
    r.store.fail = Some(libc::EILSEQ);
    send_caw(&mut r, (5, 6), 3);
    r.run();
    let mut st: Vec<(u16, Status)> = (0..2)
        .map(|_| {
            let c = r.cqe();
            (c.cid(), c.status())
        })
        .collect();
    st.sort_unstable_by_key(|s| s.0);
    assert_eq!(
        st,
        vec![(5, Status::COMPARE_FAILED.dnr()), (6, Status::FUSED_FAIL)]
    );
    assert!(r.idle());
}

#[test]
fn closing_while_a_compare_and_write_runs_frees_both_buffers_after_it() {
    let mut r = Rig::connected_on(native_caw_target(), 4, false, 0);
    send_caw(&mut r, (5, 6), 3);
    // Read both capsules and let the core resume the Compare, without reaping the backend.
    let mut w = Wants::default();
    for _ in 0..4 {
        r.conn.on_readable(&mut r.store, r.now, &mut w);
        r.conn.tick(&mut r.store, r.now);
    }
    assert_eq!(r.store.inflight(), 1, "the pair's op runs");
    assert_eq!(r.store.buffers_in_use(), 2);
    r.conn.wire_mut().peer_closed = true;
    r.conn.on_readable(&mut r.store, r.now, &mut w);
    assert!(r.conn.is_closing());
    assert_eq!(r.store.buffers_in_use(), 2, "both buffers stay with the op");
    r.run();
    assert!(r.conn.is_finished());
    assert!(r.idle());
}

#[test]
fn a_failed_backend_op_is_an_error_completion() {
    let mut r = Rig::connected(2, false);
    r.store.fail = Some(libc::EIO);
    r.capsule(&read(4, 0, 1), &[]);
    r.run();
    let c = r.cqe();
    assert_eq!(c.cid(), 4);
    assert!(!c.status().is_success());
    assert!(r.got.is_empty(), "no data for a failed read");
    assert!(r.idle());
}

#[test]
fn a_capsule_before_icreq_is_a_sequence_error() {
    let mut r = Rig::new(1);
    r.capsule(&read(1, 0, 1), &[]);
    r.run();
    match r.next().pdu {
        Pdu::C2HTermReq(t) => assert_eq!(t.fes(), Some(Fes::PduSequenceError)),
        p => panic!("expected C2HTermReq, got {p:?}"),
    }
    assert!(r.conn.is_finished());
}

// ---------------------------------------------------------------------------------------------
// Random interleavings
// ---------------------------------------------------------------------------------------------

/// A command the random host sends.
#[derive(Debug, Clone, Copy)]
enum Op {
    Read(u32),
    WriteR2t(u32),
    WriteInCapsule(u32),
    Flush,
}

/// What happens next.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// The host's next `n` bytes reach the socket.
    Deliver(usize),
    /// The poller reads.
    Read,
    /// The backend completes what it has.
    Reap,
    /// The poller serves its buffer FIFO.
    Grant,
    /// The socket takes `n` more bytes, and the poller flushes.
    Flush(usize),
    /// Time passes and the poller ticks.
    Tick(u64),
    /// The backend starts failing, or stops.
    FailBackend(bool),
    /// The host flips a byte of its stream not yet delivered.
    Corrupt(usize),
    /// The host closes the connection.
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u32..=12).prop_map(Op::Read),
        (1u32..=12).prop_map(Op::WriteR2t),
        (1u32..=2).prop_map(Op::WriteInCapsule),
        Just(Op::Flush),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (1usize..20_000).prop_map(Step::Deliver),
        4 => Just(Step::Read),
        4 => Just(Step::Reap),
        2 => Just(Step::Grant),
        4 => (0usize..40_000).prop_map(Step::Flush),
        1 => (0u64..3_000).prop_map(Step::Tick),
        1 => any::<bool>().prop_map(Step::FailBackend),
        1 => (0usize..100_000).prop_map(Step::Corrupt),
        1 => Just(Step::Close),
    ]
}

/// The random host: its stream (commands, and H2CData answering the R2Ts it saw) and the
/// commands it is owed answers for.
struct RandomHost {
    stream: VecDeque<u8>,
    owed: BTreeMap<u16, Op>,
    answered: BTreeMap<u16, u32>,
    corrupted: bool,
}

impl RandomHost {
    /// Look at what the target sent: answer R2Ts, note completions.
    fn absorb(&mut self, r: &mut Rig) {
        while let Some(p) = r.got.pop_front() {
            match p.pdu {
                Pdu::R2T(t) => {
                    // Answer in PDUs of at most 5 KiB.
                    let mut o = t.r2to;
                    let end = t.r2to + t.r2tl;
                    while o < end {
                        let l = (end - o).min(5 * 1024);
                        let d = DataPdu {
                            cccid: t.cccid,
                            ttag: t.ttag,
                            datao: o,
                            datal: l,
                            last: o + l == end,
                            success: false,
                        };
                        let bytes = Pdu::H2CData(d).encode(&r.tx, &vec![0x5c; l as usize]);
                        self.stream.extend(bytes);
                        o += l;
                    }
                }
                Pdu::CapsuleResp(c) => *self.answered.entry(c.cid()).or_default() += 1,
                Pdu::C2HData(d) if d.success => *self.answered.entry(d.cccid).or_default() += 1,
                Pdu::C2HData(_) | Pdu::C2HTermReq(_) => {}
                p => panic!("unexpected PDU from the target: {p:?}"),
            }
        }
    }
}

/// `ring`: the connection is received as through the poller's io_uring ring, in pieces of at
/// most this many bytes (a buffer of the ring), from the first step on.
fn run_interleaving(bufs: usize, ops: &[Op], steps: &[Step], ring: Option<usize>) {
    let mut r = Rig::connected(bufs, false);
    r.ring = ring;
    let mut h = RandomHost {
        stream: VecDeque::new(),
        owed: BTreeMap::new(),
        answered: BTreeMap::new(),
        corrupted: false,
    };
    for (i, &o) in ops.iter().enumerate() {
        let cid = 100 + i as u16;
        let slba = (i as u64 * 16) % 2000;
        let (sqe, data) = match o {
            Op::Read(n) => (read(cid, slba, n), vec![]),
            Op::WriteR2t(n) => (write_r2t(cid, slba, n), vec![]),
            Op::WriteInCapsule(n) => (
                write_in_capsule(cid, slba, n),
                vec![0x3a; (n * BLK) as usize],
            ),
            Op::Flush => {
                let mut s = Sqe::new(io::FLUSH, cid);
                s.nsid = 1.into();
                (s, vec![])
            }
        };
        let bytes = Pdu::CapsuleCmd {
            sqe,
            data_len: data.len() as u32,
        }
        .encode(&r.tx, &data);
        h.stream.extend(bytes);
        h.owed.insert(cid, o);
    }
    // The socket starts with little room: flushes must happen for progress.
    r.conn.wire_mut().send_room = 4096;
    let mut w = Wants::default();
    for &s in steps {
        match s {
            Step::Deliver(n) => {
                let n = n.min(h.stream.len());
                let bytes: Vec<u8> = h.stream.drain(..n).collect();
                r.conn.wire_mut().deliver(&bytes);
            }
            Step::Read => {
                match ring {
                    Some(piece) => {
                        r.receive(piece, &mut w);
                    }
                    None => {
                        r.conn.on_readable(&mut r.store, r.now, &mut w);
                    }
                }
                r.need_buf.extend(w.need_buffer.drain(..));
            }
            Step::Reap => {
                let mut done = Vec::new();
                r.store.reap(&mut done);
                for (ud, res) in done {
                    let q = ReqRef::from_user_data(ud);
                    r.conn.backend_done(q.slot as u16, res, &mut r.store, r.now);
                }
            }
            Step::Grant => {
                r.serve_buffers();
            }
            Step::Flush(n) => {
                let room = &mut r.conn.wire_mut().send_room;
                *room = room.saturating_add(n);
                r.conn.flush(&mut r.store, r.now);
            }
            Step::Tick(ms) => {
                r.now += Duration::from_millis(ms);
                r.conn.tick(&mut r.store, r.now);
            }
            Step::FailBackend(f) => r.store.fail = f.then_some(libc::EIO),
            Step::Corrupt(at) => {
                if !h.stream.is_empty() {
                    let i = at % h.stream.len();
                    h.stream[i] ^= 0x80;
                    h.corrupted = true;
                }
            }
            Step::Close => r.conn.wire_mut().peer_closed = true,
        }
        r.collect();
        r.check();
        h.absorb(&mut r);
    }
    // Then everything the host has goes through, the socket has room, the backend heals.
    r.store.fail = None;
    r.conn.wire_mut().send_room = usize::MAX;
    for _ in 0..100_000 {
        let bytes: Vec<u8> = h.stream.drain(..).collect();
        r.conn.wire_mut().deliver(&bytes);
        let moved = r.pass();
        h.absorb(&mut r);
        if !moved && h.stream.is_empty() {
            break;
        }
    }
    if r.conn.is_closing() {
        assert!(
            r.conn.is_finished(),
            "a closed connection drains its backend"
        );
    } else {
        if !r.conn.wire().peer_closed {
            // Every command answered exactly once.
            let owed: Vec<u16> = h.owed.keys().copied().collect();
            let answered: Vec<u16> = h.answered.keys().copied().collect();
            if !h.corrupted {
                assert_eq!(answered, owed, "every command is answered");
            }
            assert!(
                h.answered.values().all(|&n| n == 1),
                "answered twice: {:?}",
                h.answered
            );
        }
        // Then the host goes away.
        r.conn.wire_mut().peer_closed = true;
        r.run();
        assert!(r.conn.is_finished());
    }
    assert!(r.idle(), "no slot or buffer leaked");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any order of socket readiness, buffer grants, backend completions, send room, time,
    /// backend failures, host corruption and closes: the books balance after every step, a
    /// clean stream gets every command answered exactly once, and in the end every slot and
    /// every buffer is free.
    #[test]
    fn random_interleavings_never_leak_a_slot_or_a_buffer(
        bufs in 1usize..5,
        ops in proptest::collection::vec(op(), 1..40),
        steps in proptest::collection::vec(step(), 0..120),
    ) {
        run_interleaving(bufs, &ops, &steps, None);
    }

    /// The same, received as the poller's io_uring ring delivers a socket: in pieces of any
    /// size (PDU headers and data split anywhere), a large payload's rest read straight into
    /// its buffer after them.
    #[test]
    fn random_interleavings_received_in_pieces_never_leak_a_slot_or_a_buffer(
        bufs in 1usize..5,
        ops in proptest::collection::vec(op(), 1..40),
        steps in proptest::collection::vec(step(), 0..120),
        piece in prop_oneof![1usize..16, 16usize..200, 200usize..20_000],
    ) {
        run_interleaving(bufs, &ops, &steps, Some(piece));
    }
}

#[test]
fn an_interleaving_with_every_kind_of_step() {
    use Step::*;
    let ops = [
        Op::WriteR2t(12),
        Op::Read(9),
        Op::WriteInCapsule(2),
        Op::Flush,
        Op::Read(1),
    ];
    let steps = [
        Deliver(100),
        Read,
        Deliver(20_000),
        Read,
        Grant,
        Reap,
        Flush(10),
        Read,
        Reap,
        Tick(500),
        Flush(40_000),
        Read,
        Grant,
        FailBackend(true),
        Reap,
        FailBackend(false),
        Read,
        Reap,
        Flush(40_000),
    ];
    run_interleaving(1, &ops, &steps, None);
    for piece in [1, 7, 72, 4096, 16 * 1024] {
        run_interleaving(1, &ops, &steps, Some(piece));
    }
}
