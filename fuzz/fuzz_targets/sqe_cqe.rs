//! SQE and CQE decoding, and the command views over an SQE (Connect, Property Get/Set, Get Log
//! Page).
//!
//! Invariants: decode/encode round-trips byte for byte; every accessor reads the bytes the
//! spec names; short buffers are `DecodeError::Short` with the right counts; the command
//! views are lossless; Get Log Page fields re-encode to the same dwords.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvme::fabrics::{ConnectCmd, PropSize, PropertyGetCmd, PropertySetCmd};
use nvme::log::GetLogPageCmd;
use nvme::{Cqe, DecodeError, Sqe, Status};
use zerocopy::IntoBytes;

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fuzz_target!(|data: &[u8]| {
    // SQE.
    match Sqe::decode(data) {
        Err(e) => {
            assert!(data.len() < 64);
            assert_eq!(
                e,
                DecodeError::Short {
                    need: 64,
                    have: data.len()
                }
            );
            assert!(Sqe::view(data).is_err());
        }
        Ok(s) => {
            let b = &data[..64];
            assert_eq!(&s.encode()[..], b);
            assert_eq!(Sqe::view(data).unwrap().as_bytes(), b);
            assert_eq!(s.opcode, b[0]);
            assert_eq!(s.cid(), le16(b, 2));
            assert_eq!(s.nsid.get(), le32(b, 4));
            assert_eq!(s.fctype(), b[4]);
            assert_eq!(s.is_fabrics(), b[0] == 0x7f);
            assert_eq!(s.uses_sgl(), b[1] & 0xc0 == 0x40);
            assert_eq!(s.slba(), le64(b, 40));
            let nlb = s.nlb();
            assert_eq!(nlb, le16(b, 48) as u32 + 1);
            assert!((1..=65536).contains(&nlb));
            assert_eq!(&s.dptr, &b[24..40]);

            let c = ConnectCmd::from_sqe(&s);
            assert_eq!(c.to_sqe().as_bytes(), b);
            assert_eq!(c.qid.get(), le16(b, 42));
            assert_eq!(c.sqsize.get(), le16(b, 44));
            assert_eq!(c.cattr, b[46]);
            assert_eq!(c.kato.get(), le32(b, 48));

            let g = PropertyGetCmd::from_sqe(&s);
            let p = PropertySetCmd::from_sqe(&s);
            assert_eq!(g.offset.get(), le32(b, 44));
            assert_eq!(p.offset.get(), le32(b, 44));
            let size = PropSize::from_attrib(b[40]);
            assert_eq!(g.size(), size);
            assert_eq!(p.size(), size);
            assert_eq!(size.is_ok(), b[40] & 7 <= 1);

            let l = GetLogPageCmd::from_sqe(&s);
            let numd0 = (le32(b, 40) >> 16) as u64 | (le32(b, 44) as u64 & 0xffff) << 16;
            assert_eq!(l.len_bytes(), (numd0 + 1).min(u32::MAX as u64) * 4);
            assert_eq!(l.lpo, le64(b, 48));
            if numd0 < u32::MAX as u64 {
                // Lossless except for the reserved bits of CDW14.
                let back = l.to_sqe(s.cid(), s.dptr);
                assert_eq!(GetLogPageCmd::from_sqe(&back), l);
                assert_eq!(back.cdw10.get(), s.cdw10.get());
                assert_eq!(back.cdw11.get(), s.cdw11.get());
                assert_eq!(back.cdw12.get(), s.cdw12.get());
                assert_eq!(back.cdw13.get(), s.cdw13.get());
                assert_eq!(back.cdw14.get(), s.cdw14.get() & 0xff80_007f);
            }
        }
    }

    // CQE (the 16 bytes after an SQE when there are enough, else the start).
    let cq = if data.len() >= 80 { &data[64..] } else { data };
    match Cqe::decode(cq) {
        Err(e) => assert_eq!(
            e,
            DecodeError::Short {
                need: 16,
                have: cq.len()
            }
        ),
        Ok(c) => {
            let b = &cq[..16];
            assert_eq!(&c.encode()[..], b);
            assert_eq!(c.result.get(), le64(b, 0));
            assert_eq!(c.cid(), le16(b, 12));
            let field = le16(b, 14);
            assert_eq!(c.status(), Status(field >> 1));
            assert_eq!(c.status().to_cqe_field(field & 1 == 1), field);
            // A CQE built from its parts encodes the same status field (phase 0).
            let again = Cqe::new(c.cid(), c.status(), c.result.get());
            assert_eq!(Cqe::decode(&again.encode()).unwrap().status(), c.status());
            let _ = c.status().description();
        }
    }
});
