//! The target's NVMe/TCP connection (`nvmf_target::transport::tcp::Conn`: receive state
//! machine, request slots, R2T/H2CData, in-capsule data, buffer waits, the controller core
//! behind it) on an arbitrary host byte stream, delivered in arbitrary pieces over an in-memory
//! stream (`MemWire`). The "backend" is in memory too (`MemStore`), so a run needs no socket,
//! io_uring or files.
//!
//! Invariants:
//! - what the target sends is a well-formed controller-to-host PDU stream (ICResp first);
//! - every CapsuleResp/C2HData answers a command id the host sent, no more responses than
//!   capsules; an R2T's transfer tag is a slot of this connection;
//! - the connection reads everything it is given (it never stops reading for a buffer);
//! - after the connection closes and the backend drains, every buffer is back in the pool
//!   (`MemStore` also asserts no double free and no I/O beyond a buffer).
#![no_main]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use nvme::tcp::{Pdu, PduCollector, RxConfig};
use nvmf_fuzz::{admin_controller, fuzz_caps, fuzz_target_core, Chunker, MemStore, StreamInput};
use nvmf_target::core::{QueueLimits, Target, Waker};
use nvmf_target::transport::mem::MemWire;
use nvmf_target::transport::tcp::{Conn, SlotState, Wants};
use nvmf_target::transport::{Kind, ReqRef, Store};

fuzz_target!(|data: &[u8]| {
    let Some(input) = StreamInput::parse(data) else {
        return;
    };
    let caps = fuzz_caps();
    // A fresh target per input; with cfg bit 3 an enabled controller (cntlid 1) exists
    // already, so the input can be an I/O queue's stream.
    let target: Arc<Target> = fuzz_target_core();
    let _admin = (input.cfg & 8 != 0).then(|| admin_controller(&target, Instant::now()));
    let waker: Waker = Arc::new(|| {});
    let mut conn = Conn::with_wire(MemWire::default(), target.clone(), caps.clone(), waker);
    conn.conn_key = 1;
    let nbufs = if input.cfg & 0x80 != 0 { 2 } else { 8 };
    let mut store = MemStore::new(nbufs, caps.max_io_size as usize);
    let mut pump = Pump::default();
    let mut out = Vec::new();

    // Each piece costs a few poller passes: at most 256 of them.
    let mut chunks: Vec<&[u8]> = Chunker::new(input.split_seed).split(input.stream);
    if chunks.len() > 256 {
        let piece = input.stream.len().div_ceil(256);
        chunks = input.stream.chunks(piece).collect();
    }
    for chunk in chunks {
        conn.wire_mut().deliver(chunk);
        // Run until nothing moves; the connection must then have read everything it was
        // given (it never stops reading: a host whose data would free a buffer may be behind
        // it), unless it closed.
        for _ in 0..10_000 {
            let moved = pump.run(&mut conn, &mut store);
            out.append(&mut conn.wire_mut().take_sent());
            if !moved {
                break;
            }
        }
        if conn.is_closing() {
            break;
        }
        assert!(
            conn.wire().inbound.is_empty(),
            "the connection stopped reading with {} bytes waiting",
            conn.wire().inbound.len()
        );
    }

    // Tear down as the poller does, then everything must be back in the pool.
    conn.close(&mut store, "fuzz input ended");
    while store.inflight() > 0 {
        pump.run(&mut conn, &mut store);
    }
    assert!(conn.is_finished());
    // Closed and drained: no slot holds a command any more.
    let counts = conn.state_counts();
    assert_eq!(
        counts[SlotState::Free as usize],
        fuzz_caps().max_queue_depth as u32,
        "slots not released at close: {counts:?}"
    );
    assert_eq!(
        store.buffers_in_use(),
        0,
        "buffers leaked by the connection"
    );
    out.append(&mut conn.wire_mut().take_sent());
    drop(conn);

    check_output(input.stream, &out, &caps);
});

#[derive(Default)]
struct Pump {
    need_buf: std::collections::VecDeque<u16>,
    done: Vec<(u64, Result<u32, i32>)>,
}

impl Pump {
    /// One poller iteration for this connection; true if anything moved.
    fn run(&mut self, conn: &mut Conn<MemWire>, store: &mut MemStore) -> bool {
        let now = Instant::now();
        let mut w = Wants::default();
        let mut moved = conn.on_readable(store, now, &mut w);
        self.need_buf.extend(w.need_buffer.drain(..));
        self.done.clear();
        store.reap(&mut self.done);
        moved |= !self.done.is_empty();
        for &(ud, res) in &self.done {
            let r = ReqRef::from_user_data(ud);
            assert_eq!(
                (r.kind, r.conn),
                (Kind::Tcp, 1),
                "user_data carries the transport and the connection key"
            );
            conn.backend_done(r.slot as u16, res, store, now);
        }
        while let Some(&slot) = self.need_buf.front() {
            if conn.is_closing() {
                self.need_buf.clear();
                break;
            }
            let Some(b) = store.alloc_buf() else { break };
            self.need_buf.pop_front();
            conn.buffer_granted(slot, b, store, now);
            moved = true;
        }
        conn.tick(store, now);
        conn.flush(store, now);
        // Every slot is in exactly one state, whatever the input did.
        let counts = conn.state_counts();
        assert_eq!(
            counts.iter().sum::<u32>(),
            fuzz_caps().max_queue_depth as u32,
            "slot state counts {counts:?}"
        );
        moved
    }
}

fn check_output(host_stream: &[u8], out: &[u8], caps: &nvmf_target::core::TransportCaps) {
    // The commands the host sent, as the target's deframer saw them.
    let mut sent = PduCollector::new(RxConfig {
        max_data_pdu: caps.max_io_size,
        max_incapsule: QueueLimits::tcp(&caps).max_in_capsule(),
        ..RxConfig::controller()
    });
    let mut cids = HashSet::new();
    let mut capsules = 0usize;
    let mut digests = None;
    let mut rest = host_stream;
    // Feed PDU by PDU so the ICReq's digest choice applies to what follows, as in the target.
    while !rest.is_empty() {
        let Ok((n, fed)) = sent.deframer.feed(rest) else {
            break;
        };
        rest = &rest[n..];
        match fed {
            Some(nvme::tcp::Fed::Header(Pdu::IcReq(r))) => {
                sent.deframer.set_digests(r.hdgst, r.ddgst);
                digests = Some((r.hdgst, r.ddgst));
            }
            Some(nvme::tcp::Fed::Header(Pdu::CapsuleCmd { sqe, .. })) => {
                capsules += 1;
                cids.insert(sqe.cid());
            }
            _ => {}
        }
    }

    let mut rx = PduCollector::new(RxConfig::host());
    let mut got = Vec::new();
    let mut rest = out;
    let mut first = true;
    while !rest.is_empty() {
        // One PDU header at a time so the ICResp's digests apply from the next PDU on.
        let before = rest.len();
        let (n, fed) = rx
            .deframer
            .feed(rest)
            .unwrap_or_else(|e| panic!("target sent a malformed PDU stream: {e}"));
        rest = &rest[n..];
        if let Some(nvme::tcp::Fed::Header(p)) = fed {
            if first {
                first = false;
                match p {
                    Pdu::IcResp(r) => {
                        assert_eq!(
                            Some((r.hdgst, r.ddgst)),
                            digests,
                            "ICResp echoes the digests"
                        );
                        assert_eq!(r.maxh2cdata, caps.max_io_size);
                        rx.deframer.set_digests(r.hdgst, r.ddgst);
                    }
                    // Refused before the IC exchange: a TermReq.
                    Pdu::C2HTermReq(_) => {}
                    p => panic!("first PDU {p:?}"),
                }
            }
            got.push(p);
        }
        assert!(rest.len() < before);
    }
    assert!(rx.deframer.at_boundary(), "target output ends mid-PDU");

    let mut resps = 0usize;
    for p in &got {
        match *p {
            Pdu::CapsuleResp(cqe) => {
                resps += 1;
                assert!(
                    cids.contains(&cqe.cid()),
                    "CQE for cid {} never sent",
                    cqe.cid()
                );
            }
            Pdu::C2HData(d) => {
                assert!(cids.contains(&d.cccid), "C2HData for cid {}", d.cccid);
                if d.success {
                    resps += 1;
                }
            }
            Pdu::R2T(r) => {
                assert!(cids.contains(&r.cccid), "R2T for cid {}", r.cccid);
                assert!(r.ttag < caps.max_queue_depth, "R2T tag {}", r.ttag);
                assert!(r.r2tl <= caps.max_io_size);
            }
            Pdu::IcResp(_) | Pdu::C2HTermReq(_) => {}
            ref other => panic!("target sent {other:?}"),
        }
    }
    assert!(
        resps <= capsules,
        "{resps} responses for {capsules} capsules"
    );
}
