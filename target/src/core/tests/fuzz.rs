//! Random SQEs on connected queues: never a panic, and every CQE answers the SQE's cid on the
//! right queue.

use proptest::prelude::*;

use super::bad_input::ready;
use super::*;

/// Feed `sqe` through parse/execute/complete like a transport would; returns every CQE the
/// command produced (none while it is held).
fn drive(h: &mut Host, sqe: Sqe, payload_byte: u8) -> Vec<Cqe> {
    let mut cmd = match h.q.parse(&sqe, h.now) {
        Err(c) => return vec![c],
        Ok(cmd) => cmd,
    };
    let len = match cmd.xfer {
        Xfer::None => 0,
        Xfer::FromHost(n) | Xfer::ToHost(n) => n as usize,
    };
    assert!(
        len as u32 <= h.q.max_transfer(),
        "parse bounds the transfer"
    );
    if let Some(sgl) = cmd.sgl {
        assert_eq!(sgl.len() as usize, len, "parse checked the SGL length");
    } else {
        assert_eq!(len, 0);
    }
    let mut buf = vec![payload_byte; len];
    match h.q.execute(&mut cmd, &mut buf, h.now) {
        Exec::Done { cqe, data_len } => {
            assert!(data_len as usize <= len);
            vec![cqe]
        }
        Exec::Io(op) => {
            if let IoKind::Read | IoKind::Write = op.kind {
                assert_eq!(op.len as usize, len, "I/O length is the transfer length");
            }
            let res = if payload_byte & 1 == 0 {
                Ok(())
            } else {
                Err(-(payload_byte as i32))
            };
            vec![h.q.complete_io(&mut cmd, res, h.now)]
        }
        Exec::Deferred => Vec::new(),
    }
}

fn arb_sqe() -> impl Strategy<Value = [u8; 64]> {
    (
        proptest::collection::vec(any::<u8>(), 64),
        any::<bool>(),
        0u8..8,
        any::<bool>(),
    )
        .prop_map(|(v, fix_flags, op_pick, small)| {
            let mut b = [0u8; 64];
            b.copy_from_slice(&v);
            if fix_flags {
                // Get past the PSDT/FUSE check most of the time.
                b[1] = 0x40;
            }
            // Bias towards opcodes that exist so the deeper paths run.
            const OPS: [u8; 8] = [0x00, 0x01, 0x02, 0x06, 0x08, 0x09, 0x7f, 0x0a];
            if op_pick < 6 {
                b[0] = OPS[op_pick as usize];
            }
            if small {
                // Small NSIDs and NLBs hit valid namespaces and ranges.
                let nsid = (b[4] % 5) as u32;
                b[4..8].copy_from_slice(&nsid.to_le_bytes());
                b[48] %= 16;
                b[49] = 0;
                b[44..48].fill(0);
                let slba = b[40] as u32 * 8;
                b[40..44].copy_from_slice(&slba.to_le_bytes());
            }
            b
        })
}

fn run_queue(caps: TransportCaps, admin_side: bool, sqes: &[[u8; 64]]) {
    let (t, mut a, mut q) = ready(caps);
    let h = if admin_side { &mut a } else { &mut q };
    let qid = h.q.qid().unwrap();
    for (i, raw) in sqes.iter().enumerate() {
        let sqe = Sqe::decode(raw).unwrap();
        for c in drive(h, sqe, i as u8) {
            assert_eq!(c.cid(), sqe.cid(), "{sqe:?}");
            assert_eq!(c.sq_id.get(), qid);
        }
        while let Some(ev) = h.q.poll_event() {
            if let QueueEvent::Complete(c) = ev {
                assert_eq!(c.sq_id.get(), qid);
            }
        }
        h.advance(Duration::from_millis(10));
        h.q.handle_timeout(h.now);
    }
    // Whatever happened, the target's bookkeeping is consistent.
    assert!(t.controller_count() <= 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_sqes_on_io_queue_tcp(sqes in proptest::collection::vec(arb_sqe(), 1..48)) {
        run_queue(tcp_caps(), false, &sqes);
    }

    #[test]
    fn random_sqes_on_io_queue_rdma(sqes in proptest::collection::vec(arb_sqe(), 1..48)) {
        run_queue(rdma_caps(), false, &sqes);
    }

    #[test]
    fn random_sqes_on_admin_queue(sqes in proptest::collection::vec(arb_sqe(), 1..48)) {
        run_queue(tcp_caps(), true, &sqes);
    }

    #[test]
    fn random_sqes_on_unconnected_queue(raw in arb_sqe(), data in proptest::collection::vec(any::<u8>(), 1024)) {
        let t = test_target();
        let mut h = Host::new(&t, tcp_caps(), Instant::now());
        let sqe = Sqe::decode(&raw).unwrap();
        match h.q.parse(&sqe, h.now) {
            Err(c) => prop_assert_eq!(c.cid(), sqe.cid()),
            Ok(mut cmd) => {
                let mut buf = data.clone();
                if let Exec::Done { cqe, .. } = h.q.execute(&mut cmd, &mut buf, h.now) {
                    prop_assert_eq!(cqe.cid(), sqe.cid());
                }
            }
        }
    }

    /// LBA arithmetic: a Read is accepted exactly when it fits the namespace and MDTS.
    #[test]
    fn read_range_check(slba in any::<u64>(), nlb0 in any::<u16>(), small in any::<bool>()) {
        let (_t, _a, mut q) = ready(tcp_caps());
        let slba = if small { slba % 4096 } else { slba };
        let nlb = nlb0 as u64 + 1;
        let fits = slba.checked_add(nlb).is_some_and(|e| e <= 2048);
        let under_mdts = nlb * 4096 <= 128 * 1024;
        let r = q.rw(io::READ, 1, slba, nlb as u32, 12);
        match r {
            Reply::Io(op, _) => {
                prop_assert!(fits && under_mdts);
                prop_assert_eq!(op.offset, slba * 4096);
                prop_assert_eq!(op.len as u64, nlb * 4096);
            }
            r => {
                let s = r.status();
                if !fits {
                    prop_assert_eq!(s, Status::LBA_RANGE.dnr());
                } else {
                    prop_assert!(!under_mdts);
                    prop_assert_eq!(s, Status::INVALID_FIELD.dnr());
                }
            }
        }
    }
}
