//! The Discovery Log Page (70h): decoding a page as a host does, and the target's discovery
//! controller serving it for any Get Log Page fields.
//!
//! Input: `[cdw10 x4, cdw11 x4, cdw12 x4, cdw13 x4, cdw14 x4, page bytes...]`.
//!
//! Invariants: header and entries decode/encode byte for byte, `numrec` never makes a reader
//! go past the bytes it has; the target's log is a header plus exactly `numrec` 1024-byte
//! entries, the same for every read, and a Get Log Page either fails (offset not dword
//! aligned, offset type set, offset past the end, length above MDTS) or returns exactly the
//! page bytes at that offset, zero-filled beyond its end.
#![no_main]

use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use nvme::fabrics::{self, reg, Cc, ConnectData, PropSize};
use nvme::log::{lid, trtype, DiscoveryLogEntry, DiscoveryLogHeader, GetLogPageCmd};
use nvme::opcode::admin;
use nvme::sgl::Sgl;
use nvme::{Sqe, DISCOVERY_NQN};
use nvmf_fuzz::{fuzz_caps, fuzz_target_core, run_core_cmd, HOSTID, HOSTNQN};
use nvmf_target::core::Queue;

fuzz_target!(|data: &[u8]| {
    if data.len() < 20 {
        return;
    }
    let (cdw, page) = data.split_at(20);
    let dw = |i: usize| u32::from_le_bytes(cdw[i * 4..i * 4 + 4].try_into().unwrap());

    // A host decoding a page it received.
    if let Ok(h) = DiscoveryLogHeader::decode(page) {
        assert_eq!(&h.encode()[..], &page[..1024]);
        let entries = &page[1024..];
        let numrec = h.numrec.get();
        let have = (entries.len() / 1024) as u64;
        for chunk in entries.chunks_exact(1024).take(numrec.min(have) as usize) {
            let e = DiscoveryLogEntry::decode(chunk).unwrap();
            assert_eq!(&e.encode()[..], chunk);
            let _ = format!("{e:?}");
        }
    } else {
        assert!(page.len() < 1024);
    }

    // The target's discovery controller.
    let now = Instant::now();
    let t = fuzz_target_core();
    let mut q = Queue::new(t, fuzz_caps(), "fuzz".into());
    q.set_local_addr("127.0.0.1:4420".parse().unwrap());
    let sgl = Sgl::InCapsule {
        offset: 0,
        len: 1024,
    };
    let d = ConnectData::new(HOSTID, fabrics::CNTLID_DYNAMIC, DISCOVERY_NQN, HOSTNQN).encode();
    let (c, _) = run_core_cmd(&mut q, &fabrics::connect_sqe(1, 0, 31, 0, 0, sgl), &d, now);
    assert!(c.status().is_success(), "{c:?}");
    let cc = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
    let sqe = fabrics::property_set_sqe(2, reg::CC, cc.0 as u64, PropSize::Four);
    assert!(run_core_cmd(&mut q, &sqe, &[], now).0.status().is_success());

    let read = |q: &mut Queue, g: &GetLogPageCmd| {
        let len = g.len_bytes().min(u32::MAX as u64) as u32;
        let sqe = g.to_sqe(3, Sgl::Transport { len }.encode());
        run_core_cmd(q, &sqe, &[], now)
    };
    let (c, hdr) = read(
        &mut q,
        &GetLogPageCmd::new(lid::DISCOVERY, 0, 1024, 0, true),
    );
    assert!(c.status().is_success(), "{c:?}");
    let h = DiscoveryLogHeader::decode(&hdr).unwrap();
    // Both listeners, one subsystem that allows any host.
    assert_eq!(h.numrec.get(), 2);
    assert_eq!(h.recfmt.get(), 0);
    let full_len = 1024 * (1 + h.numrec.get() as u32);
    let (c, full) = read(
        &mut q,
        &GetLogPageCmd::new(lid::DISCOVERY, 0, full_len, 0, true),
    );
    assert!(c.status().is_success(), "{c:?}");
    assert_eq!(full.len() as u32, full_len);
    assert_eq!(&full[..1024], &hdr[..]);
    for e in full[1024..].chunks_exact(1024) {
        let e = DiscoveryLogEntry::decode(e).unwrap();
        assert!(matches!(e.trtype, trtype::TCP | trtype::RDMA));
        // A wildcard listener reports the address the host reached.
        assert_eq!(nvme::fabrics::until_nul(&e.traddr), b"127.0.0.1");
    }

    // Get Log Page with the fuzzed dwords.
    let mut sqe = Sqe::new(admin::GET_LOG_PAGE, 4);
    sqe.cdw10 = dw(0).into();
    sqe.cdw11 = dw(1).into();
    sqe.cdw12 = dw(2).into();
    sqe.cdw13 = dw(3).into();
    sqe.cdw14 = dw(4).into();
    let g = GetLogPageCmd::from_sqe(&sqe);
    let len = g.len_bytes().min(u32::MAX as u64) as u32;
    sqe.dptr = Sgl::Transport { len }.encode();
    let (c, got) = run_core_cmd(&mut q, &sqe, &[], now);
    assert_eq!(c.cid(), 4);
    let ok_req = g.lid == lid::DISCOVERY
        && !g.ot
        && g.lpo.is_multiple_of(4)
        && g.lpo <= full.len() as u64
        // Within MDTS and, as a command that does not move in pieces, within one buffer.
        && len <= q.max_transfer().min(fuzz_caps().max_io_size);
    if c.status().is_success() {
        assert!(ok_req, "accepted {g:?}");
        assert_eq!(got.len() as u32, len);
        let off = g.lpo as usize;
        let n = (full.len() - off).min(got.len());
        assert_eq!(&got[..n], &full[off..off + n]);
        assert!(got[n..].iter().all(|&b| b == 0));
    } else {
        assert!(!ok_req, "refused {g:?}: {c:?}");
    }
});
