//! Fabrics Connect: the 1024-byte Connect data (`nvme::fabrics::ConnectData`) and the target
//! core's Connect handling of an SQE + data from the input.
//!
//! Input: `[qid_lo, sqsize_lo, sqsize_hi, cattr, kato x4, connect data...]`.
//!
//! Invariants: decode/encode round-trips; the NQN views stop at the first NUL; rebuilding the
//! data from its decoded parts keeps them; the Connect result round-trips; the core answers a
//! Connect with success (a valid cntlid on the admin queue, the queue then has that qid) or a
//! Connect status whose Invalid Parameter offset points into the SQE or the data.
#![no_main]

use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use nvme::fabrics::{
    connect_sqe, until_nul, ConnectData, ConnectResult, InvalidAttr, CNTLID_MAX, CNTLID_MIN,
};
use nvme::sgl::Sgl;
use nvme::{DecodeError, Status};
use nvmf_fuzz::{admin_controller, fuzz_caps, fuzz_target_core, run_core_cmd};
use nvmf_target::core::Queue;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (head, body) = data.split_at(8);
    match ConnectData::decode(body) {
        Err(e) => {
            assert!(body.len() < 1024);
            assert_eq!(
                e,
                DecodeError::Short {
                    need: 1024,
                    have: body.len()
                }
            );
        }
        Ok(d) => {
            assert_eq!(&d.encode()[..], &body[..1024]);
            assert_eq!(d.subnqn_bytes(), until_nul(&body[256..512]));
            assert_eq!(d.hostnqn_bytes(), until_nul(&body[512..768]));
            assert!(!d.subnqn_bytes().contains(&0));
            assert_eq!(d.cntlid.get(), u16::from_le_bytes([body[16], body[17]]));
            if let (Some(s), Some(h)) = (d.subnqn_str(), d.hostnqn_str()) {
                // `new` cuts an NQN to 255 bytes so a NUL remains (a 256-byte field may have
                // none).
                let again = ConnectData::new(d.hostid, d.cntlid.get(), s, h);
                let cut = |b: &[u8]| b[..b.len().min(255)].to_vec();
                assert_eq!(again.subnqn_bytes(), cut(d.subnqn_bytes()));
                assert_eq!(again.hostnqn_bytes(), cut(d.hostnqn_bytes()));
                assert_eq!(again.hostid, d.hostid);
            }
            let _ = format!("{d:?}");
        }
    }

    let qid = head[0] as u16 % 4;
    let sqsize = u16::from_le_bytes([head[1], head[2]]);
    let cattr = head[3];
    let kato = u32::from_le_bytes(head[4..8].try_into().unwrap());
    let now = Instant::now();
    let t = fuzz_target_core();
    // I/O-queue Connects need a controller to attach to.
    let _admin = (qid != 0).then(|| admin_controller(&t, now));
    let mut q = Queue::new(t.clone(), fuzz_caps(), "fuzz".into());
    let sgl = Sgl::InCapsule {
        offset: 0,
        len: 1024,
    };
    let sqe = connect_sqe(9, qid, sqsize, cattr, kato, sgl);
    let mut cdata = [0u8; 1024];
    let n = body.len().min(1024);
    cdata[..n].copy_from_slice(&body[..n]);
    let (cqe, _) = run_core_cmd(&mut q, &sqe, &cdata, now);
    assert_eq!(cqe.cid(), 9);
    let st = cqe.status();
    if st.is_success() {
        assert_eq!(q.qid(), Some(qid));
        assert_eq!(q.depth() as u32, sqsize as u32 + 1);
        assert!(sqsize >= 1 && q.depth() <= fuzz_caps().max_queue_depth);
        match ConnectResult::decode(cqe.result.get(), false) {
            ConnectResult::Success { cntlid, .. } => {
                assert!((CNTLID_MIN..=CNTLID_MAX).contains(&cntlid));
                assert_eq!(q.cntlid(), Some(cntlid));
            }
            r => panic!("{r:?}"),
        }
    } else {
        assert_eq!(
            q.qid(),
            None,
            "a refused Connect leaves the queue unconnected"
        );
        assert_eq!(
            st.sct(),
            1,
            "Connect fails with a command-specific status: {st:?}"
        );
        if st.code() == Status::CONNECT_INVALID_PARAM.code() {
            let r = ConnectResult::decode(cqe.result.get(), true);
            assert_eq!(ConnectResult::decode(r.encode(), true), r);
            match r {
                ConnectResult::InvalidParam {
                    attr: InvalidAttr::Sqe,
                    offset,
                } => {
                    assert!(offset < 64)
                }
                ConnectResult::InvalidParam {
                    attr: InvalidAttr::Data,
                    offset,
                } => {
                    assert!(offset < 1024)
                }
                r => panic!("{r:?}"),
            }
        }
    }
    if qid == 0 && st.is_success() {
        assert_eq!(t.controller_count(), 1);
    }
});
