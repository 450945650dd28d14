//! SGL descriptor decoding (`nvme::sgl::Sgl`), and the target core's SGL checks on an I/O
//! command carrying the descriptor.
//!
//! Invariants: decode fails exactly for the unsupported type bytes; encode(decode(d)) keeps
//! every field the type defines (reserved bytes become zero) and decodes to the same value;
//! keyed lengths stay within 24 bits; a command the core accepts describes exactly its
//! transfer length and stays within MDTS.
#![no_main]

use std::cell::RefCell;
use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use nvme::fabrics::{connect_sqe, ConnectData};
use nvme::sgl::{kind, Sgl};
use nvme::Sqe;
use nvmf_fuzz::{
    admin_controller, fuzz_caps, fuzz_target_core, run_core_cmd, HOSTID, HOSTNQN, SUBNQN,
};
use nvmf_target::core::Queue;

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let d: [u8; 16] = data[..16].try_into().unwrap();
    let supported = matches!(
        d[15],
        kind::DATA_BLOCK
            | kind::DATA_BLOCK_OFFSET
            | kind::KEYED_DATA_BLOCK
            | kind::KEYED_DATA_BLOCK_INVALIDATE
            | kind::TRANSPORT_DATA_BLOCK
    );
    match Sgl::decode(&d) {
        Err(_) => assert!(!supported),
        Ok(s) => {
            assert!(supported);
            let e = s.encode();
            assert_eq!(Sgl::decode(&e).unwrap(), s);
            assert_eq!(e[15], d[15]);
            match s {
                Sgl::Keyed { .. } => {
                    assert!(s.len() < 1 << 24);
                    assert_eq!(e[..15], d[..15]);
                }
                Sgl::Transport { .. } => assert_eq!(e[8..12], d[8..12]),
                _ => assert_eq!(e[..12], d[..12]),
            }
        }
    }

    // The descriptor on a Read or Write (opcode, NLB and the in-capsule length from the input).
    let Some(&op) = data.get(16) else { return };
    let nlb0 = data.get(17).copied().unwrap_or(0) as u32;
    let incapsule = data.get(18).copied().unwrap_or(0) as usize * 64;
    with_io_queue(|q, now| {
        let mut sqe = Sqe::new(if op & 1 == 0 { 0x01 } else { 0x02 }, 7);
        sqe.nsid = 1.into();
        sqe.cdw12 = nlb0.into();
        sqe.dptr = d;
        let want = (nlb0 + 1) * 4096;
        match q.parse(&sqe, now) {
            Err(cqe) => assert!(!cqe.status().is_success()),
            Ok(cmd) => {
                let sgl = cmd.sgl.expect("a Read/Write has an SGL");
                assert_eq!(sgl.len(), want, "SGL length equals NLB x block size");
                assert!(want <= q.max_transfer());
                // Run it to completion so the queue holds no state across inputs.
                let (cqe, _) = run_core_cmd(q, &sqe, &vec![0u8; incapsule], now);
                assert_eq!(cqe.cid(), 7);
            }
        }
    });
});

/// One connected I/O queue (and its admin queue) for the whole run: the core keeps no
/// per-command state after a completion.
fn with_io_queue(f: impl FnOnce(&mut Queue, Instant)) {
    thread_local! {
        static Q: RefCell<Option<(Queue, Queue, Instant)>> = const { RefCell::new(None) };
    }
    Q.with(|cell| {
        let mut g = cell.borrow_mut();
        let (_admin, q, now) = g.get_or_insert_with(|| {
            let now = Instant::now();
            let t = fuzz_target_core();
            let admin = admin_controller(&t, now);
            let mut q = Queue::new(t, fuzz_caps(), "fuzz-io".into());
            let data = ConnectData::new(HOSTID, 1, SUBNQN, HOSTNQN).encode();
            let sgl = Sgl::InCapsule {
                offset: 0,
                len: 1024,
            };
            let (c, _) = run_core_cmd(&mut q, &connect_sqe(1, 1, 31, 0, 0, sgl), &data, now);
            assert!(c.status().is_success(), "{c:?}");
            (admin, q, now)
        });
        f(q, *now)
    })
}
