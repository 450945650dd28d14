//! The Linux host's bring-up and I/O sequence (notes/linux-host-interop.md §3.2-3.3), then
//! keep-alive expiry on a virtual clock and a shutdown through CC.SHN.

use super::*;
use nvme::fabrics::Cap;
use nvme::identify::{
    decode_ns_list, IdentifyCtrlNvm, IdentifyNamespace, IdentifyNsCsIndep, IdentifyNsNvm, NsIdDesc,
};
use nvme::log::{effects, lid, AsyncEvent, CmdEffectsLog, SmartLog};
use zerocopy::IntoBytes;

/// Every check Linux `nvme_init_identify` and the transports make on Identify Controller,
/// plus what it reads.
fn assert_linux_accepts(id: &IdentifyController, cntlid: u16, caps: &TransportCaps) {
    assert_eq!(id.cntlid.get(), cntlid, "cntlid must match Connect's");
    assert_ne!(
        id.kas.get(),
        0,
        "keep-alive support is mandatory for fabrics"
    );
    assert!(id.ioccsz.get() >= 4, "IOCCSZ");
    assert!(id.iorcsz.get() >= 1, "IORCSZ");
    assert_eq!(
        id.icdoff.get(),
        0,
        "ICDOFF must be 0 for rdma and tcp hosts"
    );
    assert_ne!(
        id.sgls.get() & 0x3,
        0,
        "SGL support (nvme_ctrl_sgl_supported)"
    );
    if caps.trtype == TrType::Rdma {
        assert_ne!(id.sgls.get() & idc::SGLS_KEYED, 0, "RDMA needs keyed SGLs");
    }
    assert_ne!(
        id.sgls.get() & idc::SGLS_OFFSET,
        0,
        "in-capsule data offsets"
    );
    assert_eq!(id.ioccsz.get(), (64 + caps.in_capsule_data) / 16);
    assert_eq!(id.iorcsz.get(), 1);
    assert_eq!(id.msdbd, 1);
    assert_eq!(id.cntrltype, idc::CNTRLTYPE_IO);
    assert_eq!(4096u64 << id.mdts, caps.max_io_size as u64);
    assert_eq!(id.maxcmd.get(), caps.max_queue_depth);
    assert_eq!(id.nn.get(), 3, "highest NSID");
    let oncs = id.oncs.get();
    assert_ne!(oncs & idc::ONCS_WRITE_ZEROES, 0);
    assert_ne!(oncs & idc::ONCS_DSM, 0);
    assert_ne!(oncs & idc::ONCS_TIMESTAMP, 0);
    assert_ne!(id.vwc & idc::VWC_PRESENT, 0);
    assert_eq!(id.vwc >> 1 & 3, 2, "broadcast flush not supported");
    assert_ne!(id.lpa & idc::LPA_CMD_EFFECTS, 0);
    assert_ne!(id.oaes.get() & idc::OAES_NS_ATTR, 0);
    assert_eq!(id.ctratt.get(), idc::CTRATT_HID_128 | idc::CTRATT_TBKAS);
    assert_eq!(id.ver.get(), 0x0001_0300);
    assert_eq!((id.sqes, id.cqes), (0x66, 0x44));
    assert_eq!(id.aerl, 3);
    // ANA reporting, as nvmet: the Linux host then reads log 0Ch at connect.
    assert_ne!(id.cmic & idc::CMIC_ANA, 0);
    assert_ne!(id.oaes.get() & idc::OAES_ANA_CHANGE, 0);
    assert_eq!((id.anatt, id.anacap), (10, 0x1f));
    assert_eq!((id.anagrpmax.get(), id.nanagrpid.get()), (128, 128));
    assert_eq!(&id.subnqn[..SUBNQN.len()], SUBNQN.as_bytes());
    assert_eq!(id.subnqn[SUBNQN.len()], 0);
    assert_eq!(&id.sn, b"NVMFRS0001          ");
    assert_eq!(&id.mn[..12], b"nvmf-rs test");
    assert!(id.mn[12..].iter().all(|&b| b == b' '));
    assert_ne!(id.fr[0], b' ');
    assert_eq!(id.psd[0].mp.get(), 0x9c4);
}

fn linux_sequence(caps: TransportCaps) {
    let t = test_target();
    let t0 = Instant::now();
    let mut a = Host::new(&t, caps.clone(), t0);

    // 1. Connect on the admin queue: sqsize 31, kato 5 s, cntlid FFFFh.
    let c = a.connect_admin(SUBNQN, HOSTNQN, 5000).cqe();
    assert!(c.status().is_success(), "{c:?}");
    let cntlid = c.result.get() as u16;
    assert!((1..=0xffef).contains(&cntlid));
    assert_eq!((c.sq_id.get(), c.sq_head.get()), (0, 1));
    assert_eq!(a.q.depth(), 32);

    // 2. Property Get CAP: 4 KiB pages, MQES from the transport, NVM command set.
    let cap = Cap(a.prop_get(reg::CAP, PropSize::Eight).ok_result());
    assert_eq!(cap.mqes(), caps.max_queue_depth - 1);
    assert!(cap.cqr());
    assert_eq!(cap.mpsmin(), 0, "MPSMIN + 12 <= PAGE_SHIFT");
    assert_eq!(cap.css() & Cap::CSS_NVM, Cap::CSS_NVM);
    assert_eq!(cap.css() & Cap::CSS_CSI, 0);
    assert_eq!(cap.crms(), 0);
    assert!(cap.to() > 0);

    // 3. CC without EN, CAP again, CC with EN, poll CSTS until RDY.
    let cc_off = Cc::new(false, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
    a.prop_set(reg::CC, cc_off.0 as u64).ok_result();
    assert_eq!(a.prop_get(reg::CSTS, PropSize::Four).ok_result(), 0);
    a.prop_get(reg::CAP, PropSize::Eight).ok_result();
    let cc_on = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
    a.prop_set(reg::CC, cc_on.0 as u64).ok_result();
    let mut polls = 0;
    while !Csts(a.prop_get(reg::CSTS, PropSize::Four).ok_result() as u32).rdy() {
        polls += 1;
        assert!(polls < (cap.to() as u32 + 1), "CSTS.RDY within CAP.TO");
        a.advance(Duration::from_millis(100));
    }
    assert_eq!(
        a.prop_get(reg::CC, PropSize::Four).ok_result(),
        cc_on.0 as u64
    );

    // 4. VS.
    assert_eq!(a.prop_get(reg::VS, PropSize::Four).ok_result(), 0x0001_0300);

    // 5. Identify Controller with every Linux reject check.
    let r = a.identify(cns::CTRL, 0, csi::NVM);
    let id = IdentifyController::decode(r.ok_data()).unwrap();
    assert_linux_accepts(&id, cntlid, &caps);

    // 6. Commands Supported and Effects (CSI NVM).
    let r = a.get_log_csi(lid::CMD_EFFECTS, 0, 4096, 0, false, csi::NVM);
    let fx = CmdEffectsLog::decode(r.ok_data()).unwrap();
    for op in [io::READ, io::WRITE, io::FLUSH, io::DSM, io::WRITE_ZEROES] {
        assert_ne!(
            fx.iocs[op as usize].get() & effects::CSUPP,
            0,
            "I/O opcode {op:#x}"
        );
    }
    assert_ne!(fx.iocs[io::WRITE as usize].get() & effects::LBCC, 0);
    for op in [
        admin::IDENTIFY,
        admin::GET_LOG_PAGE,
        admin::KEEP_ALIVE,
        admin::ASYNC_EVENT_REQUEST,
    ] {
        assert_ne!(
            fx.acs[op as usize].get() & effects::CSUPP,
            0,
            "admin opcode {op:#x}"
        );
    }
    assert_eq!(fx.iocs[io::COMPARE as usize].get(), 0);

    // 7. Set Features Timestamp (ONCS.Timestamp): 8 bytes, ms since the epoch.
    let ts: u64 = 1_700_000_000_000;
    a.set_features(feat::TIMESTAMP, 0, &ts.to_le_bytes())
        .ok_result();

    // 8. SMART log for hwmon.
    let r = a.get_log(lid::SMART, 0xffff_ffff, 512, 0, false);
    SmartLog::decode(r.ok_data()).unwrap();

    // 10. Keep Alive.
    a.advance(Duration::from_millis(2500));
    a.simple(admin::KEEP_ALIVE).ok_result();

    // 11. Number of Queues: ask for 4, get 4 (0's based in both halves).
    let want = 4u32;
    let res = a
        .set_features(feat::NUM_QUEUES, (want - 1) | (want - 1) << 16, &[])
        .ok_result();
    assert_eq!(res, 3 | 3 << 16);
    let nr_io = (res as u32 & 0xffff).min(res as u32 >> 16) + 1;
    assert_eq!(nr_io, 4);

    // I/O queue Connects with the cntlid from the admin Connect.
    let mut ioq: Vec<Host> = Vec::new();
    for qid in 1..=nr_io as u16 {
        let mut h = Host::new(&t, caps.clone(), a.now);
        let d = ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN);
        let c = h.connect(qid, 127, 0, &d).cqe();
        assert!(c.status().is_success(), "qid {qid}: {c:?}");
        assert_eq!(c.result.get() as u16, cntlid);
        assert_eq!((c.sq_id.get(), c.sq_head.get()), (qid, 1));
        assert_eq!((h.q.qid(), h.q.depth()), (Some(qid), 128));
        ioq.push(h);
    }
    assert_eq!(t.controller_count(), 1);

    // 12. Async Event Configuration = OAES ∩ {NS_ATTR, FW_ACT, ANA, DISC}, then an AER.
    let aec = id.oaes.get()
        & (idc::OAES_NS_ATTR | idc::OAES_FW_ACT | idc::OAES_ANA_CHANGE | idc::OAES_DISC_CHANGE);
    a.set_features(feat::ASYNC_EVENT, aec, &[]).ok_result();
    assert_eq!(
        a.get_features(feat::ASYNC_EVENT, 0, 0).ok_result(),
        aec as u64
    );
    let aer_cid = match a.simple(admin::ASYNC_EVENT_REQUEST) {
        Reply::Deferred(cmd) => cmd.sqe.cid(),
        r => panic!("AER must be held, got {r:?}"),
    };
    assert!(a.q.poll_event().is_none());

    // 13. Scan: CNS 06h, 02h, then per namespace 03h, 00h, 08h and 05h.
    let r = a.identify(cns::CS_CTRL, 0, csi::NVM);
    let nvm = IdentifyCtrlNvm::decode(r.ok_data()).unwrap();
    assert_eq!((nvm.dmrl, nvm.dmrsl.get(), nvm.wzsl), (0, 0, 0));
    let r = a.identify(cns::NS_ACTIVE_LIST, 0, csi::NVM);
    assert_eq!(decode_ns_list(r.ok_data()), vec![1, 3]);
    for (nsid, blocks, shift) in [(1u32, 2048u64, 12u8), (3, 1 << 20, 9)] {
        let r = a.identify(cns::NS_DESC_LIST, nsid, csi::NVM);
        let descs = NsIdDesc::decode_list(r.ok_data()).unwrap();
        let spec = ns(nsid, blocks, shift, 0);
        assert_eq!(
            descs,
            vec![
                NsIdDesc::Uuid(spec.uuid),
                NsIdDesc::Nguid(spec.nguid),
                NsIdDesc::Csi(csi::NVM)
            ]
        );
        let r = a.identify(cns::NS, nsid, csi::NVM);
        let idns = IdentifyNamespace::decode(r.ok_data()).unwrap();
        assert_eq!(
            (idns.nsze.get(), idns.ncap.get(), idns.nuse.get()),
            (blocks, blocks, blocks)
        );
        assert_eq!((idns.nlbaf, idns.flbas, idns.lbaf[0].ds), (0, 0, shift));
        assert_eq!(idns.lbaf[0].ms.get(), 0);
        assert_eq!(idns.nguid, spec.nguid);
        assert_eq!(idns.nmic & 1, 1);
        let r = a.identify(cns::NS_CS_INDEP, nsid, csi::NVM);
        let ind = IdentifyNsCsIndep::decode(r.ok_data()).unwrap();
        assert_eq!(ind.nstat & 1, 1, "namespace ready");
        let r = a.identify(cns::CS_NS, nsid, csi::NVM);
        assert!(IdentifyNsNvm::decode(r.ok_data())
            .unwrap()
            .as_bytes()
            .iter()
            .all(|&b| b == 0));
    }
    // An inactive NSID reads as zeroes on CNS 00h.
    let r = a.identify(cns::NS, 2, csi::NVM);
    assert!(r.ok_data().iter().all(|&b| b == 0));

    // I/O: Write then Read on namespace 1 (4 KiB blocks, device 7), on queue 1.
    let q1 = &mut ioq[0];
    q1.now = a.now;
    let r = q1.rw(io::WRITE, 1, 10, 8, 12);
    match &r {
        Reply::Io(op, cmd) => {
            assert_eq!(
                op,
                &IoOp {
                    device: 7,
                    kind: IoKind::Write,
                    offset: 10 * 4096,
                    len: 8 * 4096
                }
            );
            assert_eq!(cmd.xfer, Xfer::FromHost(32768));
            let expect = if caps.trtype == TrType::Tcp {
                Sgl::Transport { len: 32768 }
            } else {
                Sgl::Keyed {
                    addr: 0x1000,
                    len: 32768,
                    key: 0x55,
                    invalidate: true,
                }
            };
            assert_eq!(cmd.sgl, Some(expect));
        }
        r => panic!("{r:?}"),
    }
    let c = q1.finish_io(r);
    assert!(c.status().is_success());
    assert_eq!((c.sq_id.get(), c.sq_head.get()), (1, 2));
    let r = q1.rw(io::READ, 1, 2047, 1, 12);
    match &r {
        Reply::Io(op, cmd) => {
            assert_eq!(
                op,
                &IoOp {
                    device: 7,
                    kind: IoKind::Read,
                    offset: 2047 * 4096,
                    len: 4096
                }
            );
            assert_eq!(cmd.xfer, Xfer::ToHost(4096));
        }
        r => panic!("{r:?}"),
    }
    q1.finish_io(r);
    // Small writes come in-capsule.
    let r = q1.rw(io::WRITE, 3, 0, 1, 9);
    match &r {
        Reply::Io(op, cmd) => {
            assert_eq!(
                op,
                &IoOp {
                    device: 8,
                    kind: IoKind::Write,
                    offset: 0,
                    len: 512
                }
            );
            assert_eq!(
                cmd.sgl,
                Some(Sgl::InCapsule {
                    offset: 0,
                    len: 512
                })
            );
        }
        r => panic!("{r:?}"),
    }
    q1.finish_io(r);

    // DSM with Deallocate: two ranges (one empty, skipped).
    let mut ranges = Vec::new();
    for (nlb, slba) in [(8u32, 100u64), (0, 5), (16, 1000)] {
        ranges.extend_from_slice(&0u32.to_le_bytes());
        ranges.extend_from_slice(&nlb.to_le_bytes());
        ranges.extend_from_slice(&slba.to_le_bytes());
    }
    let cid = q1.next_cid();
    let mut sqe = Sqe::new(io::DSM, cid);
    sqe.nsid = 1.into();
    sqe.cdw10 = 2.into();
    sqe.cdw11 = (1 << 2).into();
    sqe.dptr = q1.sgl(48, true).encode();
    let r = q1.submit(sqe, &ranges);
    match &r {
        Reply::Io(op, _) => {
            assert_eq!(op.device, 7);
            assert_eq!(op.kind, IoKind::Trim { ranges: 2 });
            // The byte ranges, written over the DSM list in the command's buffer.
            assert_eq!(
                trim_ranges(&q1.io_buf, 2).collect::<Vec<_>>(),
                [(100 * 4096, 8 * 4096), (1000 * 4096, 16 * 4096)]
            );
        }
        r => panic!("{r:?}"),
    }
    q1.finish_io(r);
    // Without Deallocate it is a no-op success.
    let cid = q1.next_cid();
    sqe.cid = cid.into();
    sqe.cdw11 = 0.into();
    q1.submit(sqe, &ranges).ok_result();
    // The Linux host sends one range in a whole page (nvme_setup_discard maps room for 256):
    // taken, and what follows the NR ranges is ignored (here: stale ranges).
    let mut page = vec![0u8; 4096];
    page[..48].copy_from_slice(&ranges);
    page[48..96].copy_from_slice(&ranges);
    let cid = q1.next_cid();
    sqe.cid = cid.into();
    sqe.cdw10 = 0.into();
    sqe.cdw11 = (1 << 2).into();
    sqe.dptr = q1.sgl(4096, true).encode();
    let r = q1.submit(sqe, &page);
    match &r {
        Reply::Io(op, _) => {
            assert_eq!(op.kind, IoKind::Trim { ranges: 1 });
            assert_eq!(
                trim_ranges(&q1.io_buf, 1).collect::<Vec<_>>(),
                [(100 * 4096, 8 * 4096)]
            );
        }
        r => panic!("{r:?}"),
    }
    q1.finish_io(r);
    // Less data than NR ranges, or more than a page, is still refused.
    for (nr, len) in [(2u32, 32u32), (0, 4112)] {
        let cid = q1.next_cid();
        sqe.cid = cid.into();
        sqe.cdw10 = nr.into();
        sqe.dptr = q1.sgl(len, true).encode();
        let data = vec![0u8; len as usize];
        assert_eq!(
            q1.submit(sqe, &data).status(),
            Status::SGL_INVALID_DATA.dnr(),
            "NR {nr}, {len} bytes"
        );
    }

    // Write Zeroes (no data) and Flush.
    let r = q1.rw(io::WRITE_ZEROES, 3, 8, 16, 9);
    match &r {
        Reply::Io(op, cmd) => {
            assert_eq!(
                op,
                &IoOp {
                    device: 8,
                    kind: IoKind::WriteZeroes,
                    offset: 8 * 512,
                    len: 16 * 512
                }
            );
            assert_eq!((cmd.xfer, cmd.sgl), (Xfer::None, None));
        }
        r => panic!("{r:?}"),
    }
    q1.finish_io(r);
    let cid = q1.next_cid();
    let mut sqe = Sqe::new(io::FLUSH, cid);
    sqe.nsid = 1.into();
    sqe.dptr = q1.sgl(0, false).encode();
    let r = q1.submit(sqe, &[]);
    match &r {
        Reply::Io(op, _) => assert_eq!(
            op,
            &IoOp {
                device: 7,
                kind: IoKind::Flush,
                offset: 0,
                len: 0
            }
        ),
        r => panic!("{r:?}"),
    }
    q1.finish_io(r);
    let st = q1.q.stats();
    assert_eq!(
        (st.bytes_written, st.bytes_read, st.errors),
        (32768 + 512, 4096, 2)
    );
    assert_eq!((st.write_cmds, st.read_cmds), (2, 1));
    assert_eq!(st.commands, 11, "Connect + 10 commands (2 refused)");

    // SMART now counts the I/O: 33280 bytes written = 65 units of 512 -> 1 data unit.
    let r = a.get_log(lid::SMART, 0xffff_ffff, 512, 0, false);
    let s = SmartLog::decode(r.ok_data()).unwrap();
    assert_eq!(s.data_units_written[0], 1);
    assert_eq!(s.host_writes[0], 2);
    assert_eq!(s.host_reads[0], 1);

    // The timestamp advanced with the clock since it was set.
    let r = a.get_features(feat::TIMESTAMP, 0, 8);
    let d = r.ok_data();
    let mut v = [0u8; 8];
    v[..6].copy_from_slice(&d[..6]);
    assert_eq!(u64::from_le_bytes(v), ts + 2500);
    assert_eq!(d[6], 0x02, "origin: set by the host");

    // A namespace change completes the held AER and lands in the Changed Namespace List.
    assert!(t.notify_namespace_changed(SUBNQN, 3));
    match a.q.poll_event() {
        Some(QueueEvent::Complete(c)) => {
            assert_eq!(c.cid(), aer_cid);
            assert!(c.status().is_success());
            assert_eq!(
                AsyncEvent::decode(c.result.get() as u32),
                AsyncEvent::NS_CHANGED
            );
            assert_eq!(c.sq_id.get(), 0);
        }
        e => panic!("expected the AER completion, got {e:?}"),
    }
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, false);
    assert_eq!(decode_ns_list(r.ok_data()), vec![3]);
    let r = a.get_log(lid::CHANGED_NS, 0xffff_ffff, 4096, 0, false);
    assert!(
        decode_ns_list(r.ok_data()).is_empty(),
        "cleared on read without RAE"
    );

    // Keep-alive: traffic on an I/O queue counts (TBKAS) ...
    let last_ka = a.now;
    let kato = Duration::from_millis(5000);
    assert_eq!(a.q.poll_timeout(), Some(last_ka + kato));
    q1.now = last_ka + Duration::from_millis(4000);
    let r = q1.rw(io::READ, 1, 0, 1, 12);
    q1.finish_io(r);
    a.now = last_ka + Duration::from_millis(5500);
    a.q.handle_timeout(a.now);
    assert!(
        a.q.poll_event().is_none(),
        "I/O traffic kept the controller alive"
    );
    assert_eq!(a.q.poll_timeout(), Some(q1.now + kato));

    // ... and silence past KATO fails the controller and every queue.
    let deadline = a.q.poll_timeout().unwrap();
    a.q.handle_timeout(deadline - Duration::from_millis(1));
    assert!(a.q.poll_event().is_none());
    a.q.handle_timeout(deadline);
    match a.q.poll_event() {
        Some(QueueEvent::Disconnect(why)) => assert_eq!(why, "keep-alive expired"),
        e => panic!("{e:?}"),
    }
    assert!(a.q.poll_event().is_none(), "reported once");
    assert_eq!(a.q.poll_timeout(), None);
    assert_eq!(t.controller_count(), 0);
    for h in &mut ioq {
        match h.q.poll_event() {
            Some(QueueEvent::Disconnect(why)) => assert_eq!(why, "keep-alive expired"),
            e => panic!("{e:?}"),
        }
        let r = h.rw(io::READ, 1, 0, 1, 12);
        assert_eq!(r.status(), Status::ABORT_QUEUE);
    }
    assert_eq!(
        a.prop_get(reg::CSTS, PropSize::Four).status(),
        Status::ABORT_QUEUE
    );
    // A late I/O Connect for the dead controller is refused.
    let mut late = Host::new(&t, caps.clone(), a.now);
    let d = ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN);
    assert_eq!(
        late.connect(5, 127, 0, &d).status(),
        Status::CONNECT_INVALID_PARAM.dnr()
    );

    // CC.SHN on a fresh controller: shutdown completes at once, I/O queues are torn down.
    let mut b = Host::new(&t, caps.clone(), a.now);
    let cntlid2 = b.bring_up(SUBNQN, HOSTNQN);
    assert_ne!(cntlid2, cntlid, "cntlids are not reused at once");
    b.set_features(feat::NUM_QUEUES, 0, &[]).ok_result();
    let mut io1 = Host::new(&t, caps.clone(), b.now);
    io1.connect(
        1,
        31,
        0,
        &ConnectData::new(HOSTID, cntlid2, SUBNQN, HOSTNQN),
    )
    .ok_result();
    let shn = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NORMAL, 6, 4);
    b.prop_set(reg::CC, shn.0 as u64).ok_result();
    let csts = Csts(b.prop_get(reg::CSTS, PropSize::Four).ok_result() as u32);
    assert_eq!(csts.shst(), 2, "shutdown complete");
    assert!(!csts.rdy());
    match io1.q.poll_event() {
        Some(QueueEvent::Disconnect(why)) => assert_eq!(why, "controller shutdown"),
        e => panic!("{e:?}"),
    }
    assert_eq!(
        b.identify(cns::CTRL, 0, 0).status(),
        Status::CMD_SEQ_ERROR.dnr()
    );
    // The host then closes the admin connection: the controller goes away.
    assert_eq!(t.controller_count(), 1);
    b.q.disconnected();
    assert_eq!(t.controller_count(), 0);
    assert_eq!(
        b.prop_get(reg::CSTS, PropSize::Four).status(),
        Status::ABORT_QUEUE
    );
}

#[test]
fn linux_sequence_tcp() {
    linux_sequence(tcp_caps());
}

#[test]
fn linux_sequence_rdma() {
    linux_sequence(rdma_caps());
}

/// Identify's cache and atomicity fields per backend mix: VWC is present when a namespace of
/// the subsystem may lose completed writes until a flush (a file, a write-back block device),
/// not for null, RBD or write-through devices alone; AWUN and AWUPF promise one block (0's
/// based), and no namespace claims its own (NSFEAT bit 1).
#[test]
fn identify_reports_a_volatile_cache_only_where_a_namespace_has_one() {
    let t = test_target();
    for (what, caches, vwc) in [
        ("every store caches (files)", [true, true], true),
        (
            "one file next to a write-through device",
            [false, true],
            true,
        ),
        (
            "null, RBD or write-through devices only",
            [false, false],
            false,
        ),
    ] {
        let mut subs = test_subsystems();
        for (n, c) in subs[0].namespaces.iter_mut().zip(caches) {
            n.volatile_cache = c;
        }
        t.reconfigure(subs, test_listeners());
        let mut a = Host::new(&t, tcp_caps(), Instant::now());
        a.bring_up(SUBNQN, HOSTNQN);
        let id = IdentifyController::decode(a.identify(cns::CTRL, 0, csi::NVM).ok_data()).unwrap();
        assert_eq!(id.vwc & idc::VWC_PRESENT != 0, vwc, "{what}");
        assert_eq!(
            id.vwc & !idc::VWC_PRESENT,
            idc::VWC_FLUSH_BROADCAST_UNSUPPORTED,
            "{what}"
        );
        assert_eq!((id.awun.get(), id.awupf.get()), (0, 0), "{what}: one block");
        let ns = IdentifyNamespace::decode(a.identify(cns::NS, 1, csi::NVM).ok_data()).unwrap();
        assert_eq!(
            ns.nsfeat & 0x02,
            0,
            "{what}: no namespace atomicity of its own"
        );
    }
}
