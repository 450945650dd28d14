//! Bad input: every case gets its exact status (and DNR where nvmet sets it), never a panic.

use super::*;
use nvme::fabrics::{connect_data_off as doff, connect_sqe_off as soff};
use nvme::log::{lid, ErrorLogEntry};

/// An enabled controller with Number of Queues = 2 and I/O queue 1 connected.
pub(super) fn ready(caps: TransportCaps) -> (Arc<Target>, Host, Host) {
    let t = test_target();
    let mut a = Host::new(&t, caps.clone(), Instant::now());
    let cntlid = a.bring_up(SUBNQN, HOSTNQN);
    a.set_features(feat::NUM_QUEUES, 1 | 1 << 16, &[])
        .ok_result();
    let mut q = Host::new(&t, caps, a.now);
    q.connect(1, 31, 0, &ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN))
        .ok_result();
    (t, a, q)
}

#[track_caller]
fn expect(r: Reply, status: Status) -> Cqe {
    let c = r.cqe();
    assert_eq!(c.status(), status, "{c:?}");
    c
}

#[track_caller]
fn expect_param(r: Reply, attr: InvalidAttr, offset: u16) {
    let c = expect(r, Status::CONNECT_INVALID_PARAM.dnr());
    assert_eq!(
        ConnectResult::decode(c.result.get(), true),
        ConnectResult::InvalidParam { attr, offset }
    );
}

#[test]
fn psdt_fuse_and_opcodes() {
    let (_t, mut a, mut q) = ready(tcp_caps());
    // PRP instead of SGL, SGL with an MPTR segment, fused commands.
    for flags in [0x00u8, 0x80, 0xc0, 0x41, 0x42] {
        let mut sqe = a.admin_sqe(admin::KEEP_ALIVE);
        sqe.flags = flags;
        expect(a.submit(sqe, &[]), Status::INVALID_FIELD.dnr());
        let mut sqe = Sqe::new(io::FLUSH, 9);
        sqe.nsid = 1.into();
        sqe.flags = flags;
        expect(q.submit(sqe, &[]), Status::INVALID_FIELD.dnr());
    }
    // Unknown admin and I/O opcodes; Create SQ has no meaning on fabrics.
    for op in [admin::FORMAT_NVM, admin::CREATE_SQ, admin::NS_MGMT, 0xc1] {
        expect(a.simple(op), Status::INVALID_OPCODE.dnr());
    }
    for op in [io::VERIFY, io::WRITE_UNCORRECTABLE, 0x7e, 0xff] {
        let mut sqe = Sqe::new(op, 3);
        sqe.nsid = 1.into();
        expect(q.submit(sqe, &[]), Status::INVALID_OPCODE.dnr());
    }
    // Fabrics command types that do not exist, or not on this queue.
    let mut sqe = a.admin_sqe(0x7f);
    sqe.nsid = 0x07.into();
    expect(a.submit(sqe, &[]), Status::INVALID_OPCODE.dnr());
    let mut sqe = a.admin_sqe(0x7f);
    sqe.nsid = 0x08.into(); // Disconnect on the admin queue
    expect(a.submit(sqe, &[]), Status::INVALID_OPCODE.dnr());
    let mut sqe = q.admin_sqe(0x7f);
    sqe.nsid = 0x04.into(); // Property Get on an I/O queue
    expect(q.submit(sqe, &[]), Status::INVALID_OPCODE.dnr());
    let d = ConnectData::new(HOSTID, 1, SUBNQN, HOSTNQN);
    expect(q.connect(1, 31, 0, &d), Status::CMD_SEQ_ERROR.dnr());
    expect(
        a.connect_admin(SUBNQN, HOSTNQN, 5000),
        Status::CMD_SEQ_ERROR.dnr(),
    );
}

#[test]
fn namespace_and_lba_checks() {
    let (_t, _a, mut q) = ready(tcp_caps());
    for nsid in [0u32, 0xffff_ffff, 2, 4, 0xffff_fffe] {
        expect(q.rw(io::READ, nsid, 0, 1, 12), Status::INVALID_NS.dnr());
    }
    // Broadcast Flush is not supported (VWC bits 2:1 = 10b).
    let mut sqe = Sqe::new(io::FLUSH, 1);
    sqe.nsid = 0xffff_ffff.into();
    expect(q.submit(sqe, &[]), Status::INVALID_NS.dnr());
    // Namespace 1 has 2048 blocks of 4 KiB.
    expect(q.rw(io::READ, 1, 2048 - 4, 8, 12), Status::LBA_RANGE.dnr());
    expect(q.rw(io::WRITE, 1, 2048, 1, 12), Status::LBA_RANGE.dnr());
    expect(
        q.rw(io::READ, 1, u64::MAX - 2, 8, 12),
        Status::LBA_RANGE.dnr(),
    );
    expect(
        q.rw(io::WRITE_ZEROES, 1, u64::MAX, 1, 12),
        Status::LBA_RANGE.dnr(),
    );
    expect(
        q.rw(io::WRITE_ZEROES, 1, 2000, 49, 12),
        Status::LBA_RANGE.dnr(),
    );
    // The last block is fine.
    assert!(matches!(q.rw(io::READ, 1, 2047, 1, 12), Reply::Io(..)));
    // Above MDTS (128 KiB): 64 blocks of 4 KiB.
    expect(q.rw(io::READ, 1, 0, 64, 12), Status::INVALID_FIELD.dnr());
    expect(q.rw(io::WRITE, 1, 0, 33, 12), Status::INVALID_FIELD.dnr());
    assert!(matches!(q.rw(io::READ, 1, 0, 32, 12), Reply::Io(..)));
    // DSM ranges are checked at execute (the data came with the command).
    let mut range = Vec::new();
    range.extend_from_slice(&0u32.to_le_bytes());
    range.extend_from_slice(&16u32.to_le_bytes());
    range.extend_from_slice(&(u64::MAX - 1).to_le_bytes());
    let mut sqe = Sqe::new(io::DSM, 77);
    sqe.nsid = 1.into();
    sqe.cdw11 = (1 << 2).into();
    sqe.dptr = q.sgl(16, true).encode();
    expect(q.submit(sqe, &range), Status::LBA_RANGE.dnr());
}

#[test]
fn sgl_checks_tcp() {
    let (_t, _a, mut q) = ready(tcp_caps());
    let read = |q: &mut Host, sgl: [u8; 16]| {
        let mut sqe = Sqe::new(io::READ, 5);
        sqe.nsid = 1.into();
        sqe.cdw12 = 1.into(); // 2 blocks = 8192 bytes
        sqe.dptr = sgl;
        q.submit(sqe, &[])
    };
    let write = |q: &mut Host, sgl: [u8; 16]| {
        let mut sqe = Sqe::new(io::WRITE, 6);
        sqe.nsid = 1.into();
        sqe.cdw12 = 1.into();
        sqe.dptr = sgl;
        q.submit(sqe, &[0; 8192])
    };
    // Length mismatch.
    expect(
        read(&mut q, Sgl::Transport { len: 4096 }.encode()),
        Status::SGL_INVALID_DATA.dnr(),
    );
    expect(
        write(
            &mut q,
            Sgl::InCapsule {
                offset: 0,
                len: 4096,
            }
            .encode(),
        ),
        Status::SGL_INVALID_DATA.dnr(),
    );
    // Types TCP does not use.
    let keyed = Sgl::Keyed {
        addr: 0,
        len: 8192,
        key: 1,
        invalidate: false,
    }
    .encode();
    expect(read(&mut q, keyed), Status::SGL_INVALID_TYPE.dnr());
    expect(
        read(&mut q, Sgl::DataBlock { addr: 0, len: 8192 }.encode()),
        Status::SGL_INVALID_TYPE.dnr(),
    );
    let mut seg = Sgl::Transport { len: 8192 }.encode();
    seg[15] = 0x20;
    expect(read(&mut q, seg), Status::SGL_INVALID_TYPE.dnr());
    seg[15] = 0x5b;
    expect(read(&mut q, seg), Status::SGL_INVALID_TYPE.dnr());
    // In-capsule data for a read, at an offset, or beyond the in-capsule size (8 KiB here).
    expect(
        read(
            &mut q,
            Sgl::InCapsule {
                offset: 0,
                len: 8192,
            }
            .encode(),
        ),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        write(
            &mut q,
            Sgl::InCapsule {
                offset: 16,
                len: 8192,
            }
            .encode(),
        ),
        Status::SGL_INVALID_OFFSET.dnr(),
    );
    let mut sqe = Sqe::new(io::WRITE, 7);
    sqe.nsid = 1.into();
    sqe.cdw12 = 2.into(); // 12 KiB
    sqe.dptr = Sgl::InCapsule {
        offset: 0,
        len: 12288,
    }
    .encode();
    expect(q.submit(sqe, &[0; 12288]), Status::SGL_INVALID_OFFSET.dnr());
    // A transport SGL for the same write is fine (R2T).
    sqe.dptr = Sgl::Transport { len: 12288 }.encode();
    assert!(matches!(q.submit(sqe, &[0; 12288]), Reply::Io(..)));
    // Data for a command without any.
    let mut sqe = Sqe::new(io::FLUSH, 8);
    sqe.nsid = 1.into();
    sqe.dptr = Sgl::Transport { len: 512 }.encode();
    expect(q.submit(sqe, &[]), Status::SGL_INVALID_DATA.dnr());
}

#[test]
fn sgl_checks_rdma() {
    let (_t, _a, mut q) = ready(rdma_caps());
    let mut sqe = Sqe::new(io::READ, 5);
    sqe.nsid = 1.into();
    sqe.dptr = Sgl::Transport { len: 4096 }.encode();
    expect(q.submit(sqe, &[]), Status::SGL_INVALID_TYPE.dnr());
    sqe.dptr = Sgl::Keyed {
        addr: 1,
        len: 4096,
        key: 2,
        invalidate: false,
    }
    .encode();
    assert!(matches!(q.submit(sqe, &[]), Reply::Io(..)));
    sqe.dptr = Sgl::Keyed {
        addr: 1,
        len: 512,
        key: 2,
        invalidate: false,
    }
    .encode();
    expect(q.submit(sqe, &[]), Status::SGL_INVALID_DATA.dnr());
    // In-capsule writes up to the in-capsule size (4 KiB).
    let mut sqe = Sqe::new(io::WRITE, 6);
    sqe.nsid = 1.into();
    sqe.dptr = Sgl::InCapsule {
        offset: 0,
        len: 4096,
    }
    .encode();
    assert!(matches!(q.submit(sqe, &[1; 4096]), Reply::Io(..)));
    sqe.cdw12 = 1.into();
    sqe.dptr = Sgl::InCapsule {
        offset: 0,
        len: 8192,
    }
    .encode();
    expect(q.submit(sqe, &[1; 8192]), Status::SGL_INVALID_OFFSET.dnr());
}

#[test]
fn commands_before_enable() {
    let t = test_target();
    let mut a = Host::new(&t, tcp_caps(), Instant::now());
    let cntlid = a.connect_admin(SUBNQN, HOSTNQN, 5000).ok_result() as u16;
    expect(a.identify(cns::CTRL, 0, 0), Status::CMD_SEQ_ERROR.dnr());
    expect(a.simple(admin::KEEP_ALIVE), Status::CMD_SEQ_ERROR.dnr());
    expect(
        a.set_features(feat::NUM_QUEUES, 0, &[]),
        Status::CMD_SEQ_ERROR.dnr(),
    );
    // No I/O queue before CC.EN.
    let mut q = Host::new(&t, tcp_caps(), a.now);
    let d = ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN);
    expect(q.connect(1, 31, 0, &d), Status::CMD_SEQ_ERROR.dnr());
    // A bad CC (I/O queue entry sizes other than 64/16 bytes) makes the controller fatal.
    a.prop_set(reg::CC, Cc::new(true, 0, 0, 0, 0, 7, 4).0 as u64)
        .ok_result();
    let csts = Csts(a.prop_get(reg::CSTS, PropSize::Four).ok_result() as u32);
    assert!(csts.cfs() && !csts.rdy());
    expect(a.identify(cns::CTRL, 0, 0), Status::CMD_SEQ_ERROR.dnr());
    // Reset and a correct CC recover it.
    a.prop_set(reg::CC, 0).ok_result();
    a.prop_set(reg::CC, Cc::new(true, 0, 0, 0, 0, 6, 4).0 as u64)
        .ok_result();
    assert_eq!(
        a.prop_get(reg::CSTS, PropSize::Four).ok_result(),
        Csts::RDY as u64
    );
    for (mps, ams, css) in [(1, 0, 0), (0, 1, 0), (0, 0, 6)] {
        a.prop_set(reg::CC, 0).ok_result();
        a.prop_set(reg::CC, Cc::new(true, css, mps, ams, 0, 6, 4).0 as u64)
            .ok_result();
        assert_eq!(
            a.prop_get(reg::CSTS, PropSize::Four).ok_result(),
            Csts::CFS as u64
        );
    }
}

#[test]
fn properties() {
    let (_t, mut a, _q) = ready(tcp_caps());
    // Read-only or unsupported properties.
    for off in [reg::CSTS, reg::CAP, reg::VS, reg::NSSR, 0x0c, 0x28] {
        expect(a.prop_set(off, 0), Status::INVALID_FIELD.dnr());
    }
    let cid = a.next_cid();
    let sqe = property_set_sqe(cid, reg::CAP, 0, PropSize::Eight);
    expect(a.submit(sqe, &[]), Status::INVALID_FIELD.dnr());
    let cid = a.next_cid();
    let sqe = property_set_sqe(cid, reg::CC, 0, PropSize::Eight);
    expect(a.submit(sqe, &[]), Status::INVALID_FIELD.dnr());
    // Wrong width, unknown offset, reserved size encoding.
    expect(
        a.prop_get(reg::CAP, PropSize::Four),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.prop_get(reg::CSTS, PropSize::Eight),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.prop_get(reg::NSSR, PropSize::Four),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.prop_get(0x1000, PropSize::Four),
        Status::INVALID_FIELD.dnr(),
    );
    let cid = a.next_cid();
    let mut sqe = property_get_sqe(cid, reg::VS, PropSize::Four);
    sqe.cdw10 = 3.into();
    expect(a.submit(sqe, &[]), Status::INVALID_FIELD.dnr());
    // Nothing changed.
    assert_eq!(
        a.prop_get(reg::CSTS, PropSize::Four).ok_result(),
        Csts::RDY as u64
    );
}

#[test]
fn connect_rejections() {
    let (t, mut a, _q) = ready(tcp_caps());
    let cntlid = a.q.cntlid().unwrap();
    let fresh = |t: &Arc<Target>| Host::new(t, tcp_caps(), Instant::now());

    // Only Connect opens a queue.
    let mut h = fresh(&t);
    expect(
        h.prop_get(reg::CAP, PropSize::Eight),
        Status::CMD_SEQ_ERROR.dnr(),
    );
    expect(h.simple(admin::IDENTIFY), Status::CMD_SEQ_ERROR.dnr());
    let mut sqe = h.admin_sqe(admin::KEEP_ALIVE);
    sqe.flags = 0;
    expect(h.submit(sqe, &[]), Status::INVALID_FIELD.dnr());
    assert_eq!(h.q.qid(), None);

    // Admin Connect.
    let d = ConnectData::new(HOSTID, 1, SUBNQN, HOSTNQN);
    expect_param(h.connect(0, 31, 5000, &d), InvalidAttr::Data, doff::CNTLID);
    let d = ConnectData::new(HOSTID, 0xffff, "nqn.2024-01.io.nvmf-rs:nope", HOSTNQN);
    expect_param(h.connect(0, 31, 5000, &d), InvalidAttr::Data, doff::SUBNQN);
    let c = expect(
        h.connect_admin(SUBNQN, OTHER_HOST, 5000),
        Status::CONNECT_INVALID_HOST.dnr(),
    );
    assert_eq!(
        ConnectResult::decode(c.result.get(), true),
        ConnectResult::InvalidParam {
            attr: InvalidAttr::Data,
            offset: doff::HOSTNQN
        }
    );
    let d = ConnectData::new(HOSTID, 0xffff, SUBNQN, HOSTNQN);
    expect_param(h.connect(0, 0, 5000, &d), InvalidAttr::Sqe, soff::SQSIZE);
    expect_param(h.connect(0, 32, 5000, &d), InvalidAttr::Sqe, soff::SQSIZE);
    let d = ConnectData::new(HOSTID, 0xffff, SUBNQN, "");
    expect_param(h.connect(0, 31, 5000, &d), InvalidAttr::Data, doff::HOSTNQN);
    let cid = h.next_cid();
    let mut sqe = connect_sqe(
        cid,
        0,
        31,
        0,
        5000,
        Sgl::InCapsule {
            offset: 0,
            len: 1024,
        },
    );
    sqe.cdw10 = 1.into(); // RECFMT 1
    let d = ConnectData::new(HOSTID, 0xffff, SUBNQN, HOSTNQN);
    expect(h.submit(sqe, &d.encode()), Status::CONNECT_FORMAT.dnr());
    // Connect data of the wrong length.
    let cid = h.next_cid();
    let sqe = connect_sqe(
        cid,
        0,
        31,
        0,
        5000,
        Sgl::InCapsule {
            offset: 0,
            len: 512,
        },
    );
    expect(h.submit(sqe, &d.encode()), Status::SGL_INVALID_DATA.dnr());
    assert_eq!(
        h.q.qid(),
        None,
        "failed Connects leave the queue unconnected"
    );
    assert_eq!(t.controller_count(), 1);
    // ... and a correct one still works; the keep-alive minimum (1 s) applies.
    let c = h.connect_admin(SUBNQN, HOSTNQN, 10).cqe();
    assert!(c.status().is_success());
    assert_eq!(
        h.q.poll_timeout(),
        Some(h.now + Duration::from_millis(1000))
    );
    assert_eq!(t.controller_count(), 2);

    // I/O Connect.
    let io = |t: &Arc<Target>, qid: u16, sqsize: u16, d: &ConnectData| {
        let mut h = fresh(t);
        h.connect(qid, sqsize, 0, d)
    };
    let good = ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN);
    expect_param(
        io(
            &t,
            1,
            31,
            &ConnectData::new(HOSTID, 0xffff, SUBNQN, HOSTNQN),
        ),
        InvalidAttr::Data,
        doff::CNTLID,
    );
    expect_param(
        io(
            &t,
            1,
            31,
            &ConnectData::new(HOSTID, 0xbeef, SUBNQN, HOSTNQN),
        ),
        InvalidAttr::Data,
        doff::CNTLID,
    );
    expect_param(
        io(
            &t,
            1,
            31,
            &ConnectData::new(HOSTID, cntlid, RESTRICTED, HOSTNQN),
        ),
        InvalidAttr::Data,
        doff::CNTLID,
    );
    expect_param(
        io(
            &t,
            1,
            31,
            &ConnectData::new(HOSTID, cntlid, SUBNQN, OTHER_HOST),
        ),
        InvalidAttr::Data,
        doff::HOSTNQN,
    );
    // Number of Queues granted 2.
    expect_param(io(&t, 3, 31, &good), InvalidAttr::Sqe, soff::QID);
    expect_param(io(&t, 2, 0, &good), InvalidAttr::Sqe, soff::SQSIZE);
    expect_param(io(&t, 2, 128, &good), InvalidAttr::Sqe, soff::SQSIZE);
    // qid 1 is connected already.
    expect(io(&t, 1, 31, &good), Status::CMD_SEQ_ERROR.dnr());
    let mut q2 = fresh(&t);
    q2.connect(2, 127, 0, &good).ok_result();
    // Number of Queues cannot change once I/O queues exist.
    expect(
        a.set_features(feat::NUM_QUEUES, 7 | 7 << 16, &[]),
        Status::CMD_SEQ_ERROR.dnr(),
    );
}

#[test]
fn admin_command_errors_and_error_log() {
    let (_t, mut a, _q) = ready(tcp_caps());
    expect(a.identify(0x1f, 0, 0), Status::INVALID_FIELD.dnr());
    expect(a.identify(cns::NS, 0, 0), Status::INVALID_NS.dnr());
    expect(
        a.identify(cns::NS, 0xffff_ffff, 0),
        Status::INVALID_NS.dnr(),
    );
    expect(
        a.identify(cns::NS_DESC_LIST, 2, 0),
        Status::INVALID_NS.dnr(),
    );
    expect(
        a.identify(cns::NS_ACTIVE_LIST, 0xffff_fffe, 0),
        Status::INVALID_NS.dnr(),
    );
    expect(
        a.identify(cns::CS_CTRL, 0, csi::ZNS),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.identify(cns::CS_NS, 1, csi::KV),
        Status::INVALID_FIELD.dnr(),
    );
    expect(a.identify(cns::NS_CS_INDEP, 9, 0), Status::INVALID_NS.dnr());
    // Identify with a data length other than 4096.
    let cid = a.next_cid();
    let sqe = IdentifyCmd {
        cns: cns::CTRL,
        cntid: 0,
        cnssid: 0,
        csi: 0,
        nsid: 0,
    }
    .to_sqe(cid, Sgl::Transport { len: 512 }.encode());
    expect(a.submit(sqe, &[]), Status::SGL_INVALID_DATA.dnr());
    // Log pages.
    expect(
        a.get_log(0x42, 0, 512, 0, false),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.get_log(lid::DISCOVERY, 0, 1024, 0, false),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.get_log(lid::SMART, 1, 512, 0, false),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.get_log_csi(lid::CMD_EFFECTS, 0, 4096, 0, false, csi::ZNS),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.get_log(lid::SMART, 0, 512, 513, false),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.get_log(lid::ERROR, 0, 256 * 1024, 0, false),
        Status::INVALID_FIELD.dnr(),
    );
    // Features.
    expect(
        a.set_features(feat::TEMP_THRESH, 0, &[]),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.get_features(feat::ARBITRATION, 0, 0),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.set_features(feat::VOLATILE_WC, 0, &[]),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.set_features(feat::NUM_QUEUES, 0xffff, &[]),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.set_features(feat::ASYNC_EVENT, 1 << 9, &[]),
        Status::INVALID_FIELD.dnr(),
    );
    expect(
        a.set_features(feat::HOST_ID, 1, &[0; 16]),
        Status::CMD_SEQ_ERROR.dnr(),
    );
    expect(
        a.get_features(feat::HOST_ID, 0, 16),
        Status::INVALID_FIELD.dnr(),
    );
    let mut sqe = a.admin_sqe(admin::SET_FEATURES);
    sqe.cdw10 = (feat::KATO as u32 | feat::SAVE).into();
    sqe.cdw11 = 5000.into();
    expect(a.submit(sqe, &[]), Status::FEATURE_NOT_SAVEABLE.dnr());
    // What does work.
    assert_eq!(a.get_features(feat::HOST_ID, 1, 16).ok_data(), &HOSTID);
    assert_eq!(a.get_features(feat::VOLATILE_WC, 0, 0).ok_result(), 1);
    assert_eq!(
        a.get_features(feat::NUM_QUEUES, 0, 0).ok_result(),
        1 | 1 << 16
    );
    a.set_features(feat::KATO, 2345, &[]).ok_result();
    assert_eq!(
        a.get_features(feat::KATO, 0, 0).ok_result(),
        2400,
        "rounded up to KAS"
    );
    assert_eq!(
        a.simple(admin::ABORT).ok_result(),
        1,
        "Abort: command not aborted"
    );

    // AER limit: AERL + 1 = 4 held, the fifth is refused.
    for _ in 0..4 {
        assert!(matches!(
            a.simple(admin::ASYNC_EVENT_REQUEST),
            Reply::Deferred(_)
        ));
    }
    expect(
        a.simple(admin::ASYNC_EVENT_REQUEST),
        Status::ASYNC_LIMIT.dnr(),
    );

    // The error log has the newest failure first, with its location.
    let cid = a.next_cid();
    let mut sqe = Sqe::new(admin::GET_LOG_PAGE, cid);
    sqe.dptr = Sgl::Transport { len: 4096 }.encode();
    sqe.cdw10 = (lid::ERROR as u32 | 1023 << 16).into();
    let r = a.submit(sqe, &[]);
    let log = r.ok_data();
    let newest = ErrorLogEntry::decode(&log[..64]).unwrap();
    assert_eq!(newest.cmdid.get(), cid - 1);
    assert_eq!(newest.sqid.get(), 0);
    assert_eq!(
        Status::from_cqe_field(newest.status_field.get()),
        Status::ASYNC_LIMIT.dnr()
    );
    let older = ErrorLogEntry::decode(&log[64..128]).unwrap();
    assert_eq!(older.error_count.get() + 1, newest.error_count.get());
    let save = log
        .chunks_exact(64)
        .map(|c| ErrorLogEntry::decode(c).unwrap())
        .find(|e| {
            Status::from_cqe_field(e.status_field.get()) == Status::FEATURE_NOT_SAVEABLE.dnr()
        })
        .expect("the Save failure is logged");
    assert_eq!(save.param_error_location.get(), 40);
}

#[test]
fn errno_mapping() {
    let (_t, _a, mut q) = ready(tcp_caps());
    let cases = [
        (-libc::ENOSPC, Status::CAP_EXCEEDED.dnr()),
        (-libc::EREMOTEIO, Status::LBA_RANGE.dnr()),
        (-libc::EOPNOTSUPP, Status::INVALID_OPCODE.dnr()),
        (-libc::ENODATA, Status::ACCESS_DENIED),
        (-libc::EIO, Status::INTERNAL.dnr()),
        (libc::EIO, Status::INTERNAL.dnr()),
        (-libc::EAGAIN, Status::INTERNAL),
        (-libc::ENOMEM, Status::INTERNAL),
        (-libc::ETIMEDOUT, Status::NS_NOT_READY),
        (-libc::ESHUTDOWN, Status::NS_NOT_READY),
        (i32::MIN, Status::INTERNAL.dnr()),
    ];
    for (errno, status) in cases {
        match q.rw(io::READ, 1, 3, 1, 12) {
            Reply::Io(_, mut cmd) => {
                let c = q.q.complete_io(&mut cmd, Err(errno), q.now);
                assert_eq!(c.status(), status, "errno {errno}");
                assert_eq!(c.cid(), cmd.sqe.cid());
            }
            r => panic!("{r:?}"),
        }
    }
    match q.rw(io::WRITE, 1, 3, 1, 12) {
        Reply::Io(_, cmd) => {
            let c = q.q.complete_status(&cmd, Status::DATA_XFER_ERROR, q.now);
            assert_eq!(c.status(), Status::DATA_XFER_ERROR);
        }
        r => panic!("{r:?}"),
    }
    let st = q.q.stats();
    assert_eq!((st.errors, st.read_cmds, st.bytes_written), (12, 0, 0));
}

/// What an NVMe/RDMA connection was set up for (its CM request's qid and RECVs, and what its
/// RECVs hold) bounds the Connect on it and its in-capsule data; the core answers, with the
/// parameter's place, before anything is created.
#[test]
fn connect_and_in_capsule_data_within_the_connections_limits() {
    let t = test_target();
    let mut a = Host::new(&t, rdma_caps(), Instant::now());
    let cntlid = a.bring_up(SUBNQN, HOSTNQN);
    a.set_features(feat::NUM_QUEUES, 1 | 1 << 16, &[])
        .ok_result();
    let good = ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN);
    // An I/O connection set up for qid 1 with 32 RECVs of 4 KiB in-capsule data.
    let limited = |t: &Arc<Target>| {
        let mut h = Host::new(t, rdma_caps(), Instant::now());
        h.q = Queue::with_limits(
            t.clone(),
            rdma_caps(),
            QueueLimits {
                in_capsule_admin: 0,
                in_capsule_io: 4096,
                max_depth: Some(32),
                qid: Some(1),
            },
            "192.0.2.100:51234".into(),
        );
        h
    };
    // Connect for another queue than the connection's: Invalid Parameters at QID.
    let mut h = limited(&t);
    let keyed = Sgl::Keyed {
        addr: 0x1000,
        len: 1024,
        key: 0x55,
        invalidate: false,
    };
    let cid = h.next_cid();
    let r = h.submit(connect_sqe(cid, 2, 31, 0, 0, keyed), &good.encode());
    expect_param(r, InvalidAttr::Sqe, soff::QID);
    assert_eq!(h.q.qid(), None);
    // More entries than the connection has RECVs: Invalid Parameters at SQSIZE.
    let cid = h.next_cid();
    let r = h.submit(connect_sqe(cid, 1, 32, 0, 0, keyed), &good.encode());
    expect_param(r, InvalidAttr::Sqe, soff::SQSIZE);
    // In-capsule Connect data on a connection whose admin-stage RECVs hold none.
    let cid = h.next_cid();
    let r = h.submit(
        connect_sqe(
            cid,
            1,
            31,
            0,
            0,
            Sgl::InCapsule {
                offset: 0,
                len: 1024,
            },
        ),
        &good.encode(),
    );
    expect(r, Status::SGL_INVALID_OFFSET.dnr());
    // The Connect that fits: 32 entries, qid 1.
    let cid = h.next_cid();
    h.submit(connect_sqe(cid, 1, 31, 0, 0, keyed), &good.encode())
        .ok_result();
    assert_eq!((h.q.qid(), h.q.in_capsule_limit()), (Some(1), 4096));
    // A write with 4 KiB in the capsule passes, 8 KiB (more than the RECVs hold) does not.
    let cid = h.next_cid();
    let mut w = nvme::Sqe::new(io::WRITE, cid);
    w.nsid = 1.into();
    w.cdw12 = 0.into(); // 1 block of 4 KiB
    w.dptr = Sgl::InCapsule {
        offset: 0,
        len: 4096,
    }
    .encode();
    assert!(matches!(h.submit(w, &[0; 4096]), Reply::Io(..)));
    let cid = h.next_cid();
    let mut w = nvme::Sqe::new(io::WRITE, cid);
    w.nsid = 1.into();
    w.cdw12 = 1.into();
    w.dptr = Sgl::InCapsule {
        offset: 0,
        len: 8192,
    }
    .encode();
    expect(h.submit(w, &[0; 8192]), Status::SGL_INVALID_OFFSET.dnr());
    // Without limits (NVMe/TCP) the same Connects pass the transport checks.
    assert_eq!(QueueLimits::tcp(&tcp_caps()).max_in_capsule(), 8192);
}

/// A `read_only` namespace: Identify says so (NSATTR bit 0, which makes the Linux host mark the
/// disk read-only), and everything but Read and Flush fails with Namespace Is Write Protected
/// before it reaches the backend (nvmet's rule).
#[test]
fn read_only_namespace_is_write_protected() {
    let (t, mut a, mut q) = ready(tcp_caps());
    let mut ro = ns(1, 2048, 12, 7);
    ro.read_only = true;
    assert!(t.set_namespaces(SUBNQN, vec![ro, ns(3, 1 << 20, 9, 8)]));
    let r = a.identify(cns::NS, 1, csi::NVM);
    let id = nvme::identify::IdentifyNamespace::decode(r.ok_data()).unwrap();
    assert_eq!(id.nsattr & 1, 1, "NSATTR write protected");
    let r = a.identify(cns::NS_CS_INDEP, 1, csi::NVM);
    let ind = nvme::identify::IdentifyNsCsIndep::decode(r.ok_data()).unwrap();
    assert_eq!(ind.nsattr & 1, 1, "CS-independent NSATTR write protected");
    // The writable namespace next to it is not.
    let r = a.identify(cns::NS, 3, csi::NVM);
    let id = nvme::identify::IdentifyNamespace::decode(r.ok_data()).unwrap();
    assert_eq!(id.nsattr, 0);
    for op in [io::WRITE, io::WRITE_ZEROES, io::DSM] {
        expect(q.rw(op, 1, 0, 1, 12), Status::NS_WRITE_PROTECTED.dnr());
    }
    assert!(matches!(q.rw(io::READ, 1, 0, 1, 12), Reply::Io(..)));
    assert!(matches!(q.rw(io::FLUSH, 1, 0, 1, 12), Reply::Io(..)));
    // Writes to namespace 3 still reach the backend.
    assert!(matches!(q.rw(io::WRITE, 3, 0, 8, 9), Reply::Io(..)));
}

/// An empty Host NQN (what SPDK's perf sends by default) is a host only a subsystem open to
/// any host takes; a subsystem with a host list refuses it (Invalid Parameters at HOSTNQN).
#[test]
fn empty_host_nqn_only_where_any_host_is_allowed() {
    let t = test_target();
    let mut h = Host::new(&t, tcp_caps(), Instant::now());
    expect_param(
        h.connect_admin(SUBNQN, "", 5000),
        InvalidAttr::Data,
        doff::HOSTNQN,
    );
    assert_eq!(t.controller_count(), 0);
    let mut open = test_subsystems();
    open[0].allow_any_host = true;
    t.reconfigure(open, test_listeners());
    let mut a = Host::new(&t, tcp_caps(), Instant::now());
    let cntlid = a.bring_up(SUBNQN, "");
    a.set_features(feat::NUM_QUEUES, 0, &[]).ok_result();
    let mut q = Host::new(&t, tcp_caps(), a.now);
    q.connect(1, 31, 0, &ConnectData::new(HOSTID, cntlid, SUBNQN, ""))
        .ok_result();
    assert!(matches!(q.rw(io::READ, 1, 0, 1, 12), Reply::Io(..)));
    // The same controller cannot be joined under a name.
    let mut other = Host::new(&t, tcp_caps(), a.now);
    expect_param(
        other.connect(1, 31, 0, &ConnectData::new(HOSTID, cntlid, SUBNQN, HOSTNQN)),
        InvalidAttr::Data,
        doff::HOSTNQN,
    );
}

/// DLFEAT tells the host what a deallocated block reads: all zeroes (001b) only where the
/// backend frees blocks to zeroes, "not reported" (000b) for a block device that discards and
/// for a write-protected namespace; Write Zeroes never deallocates (bit 3 clear).
#[test]
fn dlfeat_follows_the_backend() {
    let (t, mut a, _q) = ready(tcp_caps());
    let zeroes = ns(1, 2048, 12, 7);
    let mut discard = ns(2, 2048, 12, 8);
    discard.deallocate_zeroes = false;
    let mut ro = ns(3, 2048, 12, 9);
    ro.read_only = true;
    assert!(t.set_namespaces(SUBNQN, vec![zeroes, discard, ro]));
    let dlfeat = |a: &mut Host, nsid| {
        let r = a.identify(cns::NS, nsid, csi::NVM);
        nvme::identify::IdentifyNamespace::decode(r.ok_data())
            .unwrap()
            .dlfeat
    };
    assert_eq!(dlfeat(&mut a, 1), 0b001);
    assert_eq!(dlfeat(&mut a, 2), 0);
    assert_eq!(dlfeat(&mut a, 3), 0);
}
