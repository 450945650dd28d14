//! Bad input over NVMe/TCP against the real `nvmf-target` binary on loopback (issue #8, item
//! 2): one running target, a table of bad inputs sent by raw hosts, and at the same time a
//! well-behaved host (the initiator library) writing and reading back a pattern in a loop.
//!
//! Each row gets the NVMe status nvmet gives (DNR where nvmet sets it) with the connection
//! still usable afterwards, or a clean termination: a C2HTermReq with the right FES/FEI, then
//! the connection closed. The test prints `input -> expected -> got -> PASS/FAIL` and fails if
//! any row fails or the good host saw a single error or mismatch.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use initiator::{ConnectOptions, Controller};
use nvme::fabrics::{
    connect_data_off as doff, connect_sqe_off as soff, property_get_sqe, property_set_sqe, reg, Cc,
    ConnectCmd, ConnectData, ConnectResult, Csts, InvalidAttr, PropSize,
};
use nvme::identify::feat;
use nvme::opcode::{admin, fctype, io};
use nvme::sgl::Sgl;
use nvme::tcp::{fei, DataPdu, Fes, IcReq, Pdu};
use nvme::{Sqe, Status};
use nvmf_tests::raw::{Answer, RawHost, HOSTNQN};
use nvmf_tests::{TargetProc, TEST_NQN};

/// What a row must get.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// This completion status (SCT, SC and DNR), and the connection still works.
    Status(Status),
    /// Connect Invalid Parameters pointing at this field.
    Param(InvalidAttr, u16),
    /// C2HTermReq with this FES and FEI, then the connection closed.
    Term(Fes, u32),
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expect::Status(s) => write!(f, "{s:?}"),
            Expect::Param(a, o) => write!(
                f,
                "{:?} IATTR={} IPO={o}",
                Status::CONNECT_INVALID_PARAM.dnr(),
                *a as u8
            ),
            Expect::Term(fes, fei) => write!(f, "TermReq {fes:?} FEI={fei}, closed"),
        }
    }
}

struct Row {
    input: &'static str,
    expect: Expect,
    got: String,
    pass: bool,
}

fn fes_name(fes: u16) -> String {
    match Fes::from_u16(fes) {
        Some(f) => format!("{f:?}"),
        None => format!("FES {fes:#x}"),
    }
}

/// Judge an answer; `usable` re-checks the connection after a status (None: not checked).
fn judge(input: &'static str, expect: Expect, got: Answer, usable: Option<bool>) -> Row {
    let (got_s, ok) = match (&got, expect) {
        (Answer::Cqe(c, _), Expect::Status(s)) => (format!("{:?}", c.status()), c.status() == s),
        (Answer::Cqe(c, _), Expect::Param(attr, off)) => {
            let r = ConnectResult::decode(c.result.get(), true);
            let st = c.status();
            let ok = st == Status::CONNECT_INVALID_PARAM.dnr()
                && r == ConnectResult::InvalidParam { attr, offset: off };
            match r {
                ConnectResult::InvalidParam { attr, offset } if !st.is_success() => {
                    (format!("{st:?} IATTR={} IPO={offset}", attr as u8), ok)
                }
                _ => (format!("{st:?} result={:#x}", c.result.get()), false),
            }
        }
        (Answer::Term { fes, fei, closed }, Expect::Term(want, want_fei)) => (
            format!(
                "TermReq {} FEI={fei}{}",
                fes_name(*fes),
                if *closed { ", closed" } else { ", still open" }
            ),
            *fes == want as u16 && *fei == want_fei && *closed,
        ),
        (Answer::Term { fes, fei, closed }, _) => (
            format!("TermReq {} FEI={fei} closed={closed}", fes_name(*fes)),
            false,
        ),
        (Answer::Cqe(c, _), _) => (format!("{:?}", c.status()), false),
        (Answer::R2t(r), _) => (format!("R2T ttag {} len {}", r.ttag, r.r2tl), false),
        (Answer::Closed, _) => ("closed without TermReq".into(), false),
    };
    let (got_s, pass) = match usable {
        Some(true) => (format!("{got_s}; connection usable"), ok),
        Some(false) => (format!("{got_s}; connection NOT usable"), false),
        None => (got_s, ok),
    };
    Row {
        input,
        expect,
        got: got_s,
        pass,
    }
}

/// A raw host with an enabled admin queue; returns it and its cntlid.
fn admin(addr: SocketAddr) -> (RawHost, u16) {
    let (mut h, _) = RawHost::connect(addr);
    let c = h.fabrics_connect(TEST_NQN, 0, 31, 0);
    assert!(c.status().is_success(), "{c:?}");
    let cntlid = c.result.get() as u16;
    enable(&mut h);
    (h, cntlid)
}

fn enable(h: &mut RawHost) {
    let cc = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
    let (c, _) = h.command(
        &property_set_sqe(2, reg::CC, cc.0 as u64, PropSize::Four),
        &[],
    );
    assert!(c.status().is_success(), "{c:?}");
    for _ in 0..100 {
        let (c, _) = h.command(&property_get_sqe(3, reg::CSTS, PropSize::Four), &[]);
        if Csts(c.result.get() as u32).rdy() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("CSTS.RDY never set");
}

/// An admin queue (enabled, one I/O queue granted) and I/O queue 1 of depth `sqsize + 1`.
fn io_queue(addr: SocketAddr, sqsize: u16) -> (RawHost, RawHost, u16) {
    let (mut a, cntlid) = admin(addr);
    let mut sqe = Sqe::new(admin::SET_FEATURES, 4);
    sqe.cdw10 = (feat::NUM_QUEUES as u32).into();
    let (c, _) = a.command(&sqe, &[]);
    assert!(c.status().is_success(), "{c:?}");
    let (mut q, _) = RawHost::connect(addr);
    let c = q.fabrics_connect(TEST_NQN, 1, sqsize, cntlid);
    assert!(c.status().is_success(), "{c:?}");
    (a, q, cntlid)
}

/// The connection still answers: Keep Alive on an admin queue, Flush on an I/O queue.
fn usable(h: &mut RawHost, io_q: bool) -> bool {
    let sqe = if io_q {
        let mut s = Sqe::new(io::FLUSH, 0x77);
        s.nsid = 1.into();
        s
    } else {
        Sqe::new(admin::KEEP_ALIVE, 0x77)
    };
    matches!(h.try_command(&sqe, &[]), Answer::Cqe(c, _) if c.status().is_success() && c.cid() == 0x77)
}

fn rw(op: u8, cid: u16, nsid: u32, slba: u64, nlb: u32, sgl: Sgl) -> Sqe {
    let mut s = Sqe::new(op, cid);
    s.nsid = nsid.into();
    s.cdw10 = (slba as u32).into();
    s.cdw11 = ((slba >> 32) as u32).into();
    s.cdw12 = (nlb - 1).into();
    s.dptr = sgl.encode();
    s
}

fn read_sqe(cid: u16, nsid: u32, slba: u64, nlb: u32, bs: u32) -> Sqe {
    rw(
        io::READ,
        cid,
        nsid,
        slba,
        nlb,
        Sgl::Transport { len: nlb * bs },
    )
}

/// Send raw bytes on a fresh connection (after the IC exchange if `ic`) and read the answer.
fn raw_bytes(addr: SocketAddr, ic: bool, bytes: &[u8]) -> Answer {
    let mut h = if ic {
        RawHost::connect(addr).0
    } else {
        RawHost::connect_tcp(addr)
    };
    h.send(bytes);
    h.answer()
}

fn capsule(sqe: Sqe, data: &[u8]) -> Vec<u8> {
    Pdu::CapsuleCmd {
        sqe,
        data_len: data.len() as u32,
    }
    .encode(&Default::default(), data)
}

/// The table. `bs`/`blocks`: namespace 1's block size and capacity.
fn rows(addr: SocketAddr, bs: u32, blocks: u64, mdts_bytes: u32) -> Vec<Row> {
    let mut rows = Vec::new();
    let keep_alive = Sqe::new(admin::KEEP_ALIVE, 1);

    // --- PDU framing ---
    let mut w = capsule(keep_alive, &[]);
    w[2] = 64; // HLEN 64 instead of 72
    rows.push(judge(
        "CapsuleCmd with HLEN 64 (wrong PDU length)",
        Expect::Term(Fes::InvalidHeaderField, fei::HLEN),
        raw_bytes(addr, true, &w),
        None,
    ));
    let mut w = capsule(keep_alive, &[]);
    w[4] = 40; // PLEN shorter than the 72-byte header
    rows.push(judge(
        "CapsuleCmd with PLEN 40 < HLEN",
        Expect::Term(Fes::InvalidHeaderField, fei::PLEN),
        raw_bytes(addr, true, &w[..40]),
        None,
    ));
    let mut w = capsule(keep_alive, &[0; 16]);
    w[4..8].copy_from_slice(&(72u32 + 9000).to_le_bytes());
    rows.push(judge(
        "CapsuleCmd with PLEN claiming 9000 B in-capsule (> 8 KiB)",
        Expect::Term(Fes::InvalidHeaderField, fei::PLEN),
        raw_bytes(addr, true, &w),
        None,
    ));
    let d = DataPdu {
        cccid: 1,
        ttag: 0,
        datao: 0,
        datal: 16,
        last: true,
        success: false,
    };
    let mut w = Pdu::H2CData(d).encode(&Default::default(), &[0; 16]);
    w[16] = 15; // DATAL 15, PLEN says 16 bytes of data
    rows.push(judge(
        "H2CData with DATAL != PLEN - PDO",
        Expect::Term(Fes::InvalidHeaderField, 16),
        raw_bytes(addr, true, &w),
        None,
    ));
    let w = Pdu::H2CData(DataPdu { ttag: 500, ..d }).encode(&Default::default(), &[0; 16]);
    rows.push(judge(
        "H2CData for an unknown TTAG (no R2T)",
        Expect::Term(Fes::InvalidHeaderField, 10),
        raw_bytes(addr, true, &w),
        None,
    ));
    let mut w = capsule(keep_alive, &[]);
    w[0] = 0x08;
    rows.push(judge(
        "unknown PDU type 0x08",
        Expect::Term(Fes::InvalidHeaderField, fei::PDU_TYPE),
        raw_bytes(addr, true, &w),
        None,
    ));
    let mut w = capsule(keep_alive, &[]);
    w[0] = 0xff;
    rows.push(judge(
        "unknown PDU type 0xff",
        Expect::Term(Fes::InvalidHeaderField, fei::PDU_TYPE),
        raw_bytes(addr, true, &w),
        None,
    ));
    let w =
        Pdu::CapsuleResp(nvme::Cqe::new(1, Status::SUCCESS, 0)).encode(&Default::default(), &[]);
    rows.push(judge(
        "CapsuleResp (a controller-to-host type) sent to the target",
        Expect::Term(Fes::InvalidHeaderField, fei::PDU_TYPE),
        raw_bytes(addr, true, &w),
        None,
    ));
    rows.push(judge(
        "CapsuleCmd before ICReq",
        Expect::Term(Fes::PduSequenceError, 0),
        raw_bytes(addr, false, &capsule(keep_alive, &[])),
        None,
    ));
    let ic = IcReq::default().encode();
    rows.push(judge(
        "second ICReq",
        Expect::Term(Fes::PduSequenceError, 0),
        raw_bytes(addr, true, &ic),
        None,
    ));
    let mut ic = IcReq::default().encode();
    ic[8] = 1;
    rows.push(judge(
        "ICReq with PFV 1",
        Expect::Term(Fes::UnsupportedParameter, 8),
        raw_bytes(addr, false, &ic),
        None,
    ));

    // --- Digests ---
    {
        let (mut h, r) = RawHost::connect_digests(addr, true, true);
        assert!(r.hdgst && r.ddgst, "target grants digests");
        let mut w = Pdu::CapsuleCmd {
            sqe: keep_alive,
            data_len: 0,
        }
        .encode(&h.tx, &[]);
        w[72] ^= 0xff; // the HDGST after the 72-byte header
        h.send(&w);
        rows.push(judge(
            "header digest mismatch",
            Expect::Term(Fes::HeaderDigestError, 0),
            h.answer(),
            None,
        ));
    }
    {
        let (mut a, cntlid) = admin(addr);
        let mut sqe = Sqe::new(admin::SET_FEATURES, 4);
        sqe.cdw10 = (feat::NUM_QUEUES as u32).into();
        assert!(a.command(&sqe, &[]).0.status().is_success());
        let (mut q, _) = RawHost::connect_digests(addr, true, true);
        assert!(q
            .fabrics_connect(TEST_NQN, 1, 31, cntlid)
            .status()
            .is_success());
        let data = vec![0x5a; bs as usize];
        let sqe = rw(io::WRITE, 5, 1, 0, 1, Sgl::InCapsule { offset: 0, len: bs });
        let mut w = Pdu::CapsuleCmd { sqe, data_len: bs }.encode(&q.tx, &data);
        let n = w.len();
        w[n - 1] ^= 0xff; // the DDGST
        q.send(&w);
        let got = q.answer();
        let ok = usable(&mut q, true);
        rows.push(judge(
            "data digest mismatch on in-capsule Write data",
            Expect::Status(Status::TRANSIENT_TRANSPORT),
            got,
            Some(ok),
        ));
        drop(a);
    }

    // --- Admin queue ---
    {
        let (mut h, _) = RawHost::connect(addr);
        let got = h.try_command(&Sqe::new(admin::IDENTIFY, 9), &[]);
        rows.push(judge(
            "Identify before Connect",
            Expect::Status(Status::CMD_SEQ_ERROR.dnr()),
            got,
            None,
        ));
        let c = h.fabrics_connect("nqn.2026-11.io.nvmf-rs:nope", 0, 31, 0);
        rows.push(judge(
            "Connect to an unknown subsystem",
            Expect::Param(InvalidAttr::Data, doff::SUBNQN),
            Answer::Cqe(c, vec![]),
            None,
        ));
        let c = h.fabrics_connect(TEST_NQN, 0, 0, 0);
        rows.push(judge(
            "admin Connect with SQSIZE 0",
            Expect::Param(InvalidAttr::Sqe, soff::SQSIZE),
            Answer::Cqe(c, vec![]),
            None,
        ));
        // Connected, CC.EN still 0.
        let c = h.fabrics_connect(TEST_NQN, 0, 31, 0);
        assert!(c.status().is_success(), "{c:?}");
        let cntlid = c.result.get() as u16;
        let mut s = Sqe::new(admin::IDENTIFY, 10);
        s.cdw10 = 1.into();
        s.dptr = Sgl::Transport { len: 4096 }.encode();
        let got = h.try_command(&s, &[]);
        rows.push(judge(
            "Identify before CC.EN",
            Expect::Status(Status::CMD_SEQ_ERROR.dnr()),
            got,
            None,
        ));
        let (mut q, _) = RawHost::connect(addr);
        let c = q.fabrics_connect(TEST_NQN, 1, 31, cntlid);
        rows.push(judge(
            "I/O queue Connect before CC.EN",
            Expect::Status(Status::CMD_SEQ_ERROR.dnr()),
            Answer::Cqe(c, vec![]),
            None,
        ));
        enable(&mut h);
        for (name, off, size) in [
            ("Property Set CAP (read-only)", reg::CAP, PropSize::Eight),
            ("Property Set VS (read-only)", reg::VS, PropSize::Four),
            ("Property Set CSTS (read-only)", reg::CSTS, PropSize::Four),
        ] {
            let got = h.try_command(&property_set_sqe(11, off, 0xffff_ffff, size), &[]);
            let ok = usable(&mut h, false);
            rows.push(judge(
                name,
                Expect::Status(Status::INVALID_FIELD.dnr()),
                got,
                Some(ok),
            ));
        }
        for (name, op) in [
            ("reserved admin opcode 0x03", 0x03u8),
            (
                "admin opcode Create I/O SQ (not on fabrics)",
                admin::CREATE_SQ,
            ),
            ("reserved admin opcode 0x7e", 0x7e),
        ] {
            let got = h.try_command(&Sqe::new(op, 12), &[]);
            let ok = usable(&mut h, false);
            rows.push(judge(
                name,
                Expect::Status(Status::INVALID_OPCODE.dnr()),
                got,
                Some(ok),
            ));
        }
        let mut s = Sqe::new(nvme::opcode::FABRICS, 13);
        s.nsid = 0x07.into(); // reserved fctype
        let got = h.try_command(&s, &[]);
        let ok = usable(&mut h, false);
        rows.push(judge(
            "reserved Fabrics command type 0x07",
            Expect::Status(Status::INVALID_OPCODE.dnr()),
            got,
            Some(ok),
        ));

        // I/O queue Connects with bad fields, once Number of Queues granted one I/O queue.
        let mut sqe = Sqe::new(admin::SET_FEATURES, 4);
        sqe.cdw10 = (feat::NUM_QUEUES as u32).into();
        assert!(h.command(&sqe, &[]).0.status().is_success());
        let (mut q, _) = RawHost::connect(addr);
        let c = q.fabrics_connect(TEST_NQN, 1, 31, cntlid ^ 0x5a5);
        rows.push(judge(
            "I/O Connect with a wrong cntlid",
            Expect::Param(InvalidAttr::Data, doff::CNTLID),
            Answer::Cqe(c, vec![]),
            None,
        ));
        let c = q.fabrics_connect(TEST_NQN, 9, 31, cntlid);
        rows.push(judge(
            "I/O Connect with qid 9 (1 queue granted)",
            Expect::Param(InvalidAttr::Sqe, soff::QID),
            Answer::Cqe(c, vec![]),
            None,
        ));
        let c = q.fabrics_connect(TEST_NQN, 1, 0, cntlid);
        rows.push(judge(
            "I/O Connect with SQSIZE 0",
            Expect::Param(InvalidAttr::Sqe, soff::SQSIZE),
            Answer::Cqe(c, vec![]),
            None,
        ));
        let mut cmd = ConnectCmd::from_sqe(&Sqe::new(nvme::opcode::FABRICS, 14));
        cmd.fctype = fctype::CONNECT;
        cmd.qid = 1.into();
        cmd.sqsize = 31.into();
        cmd.dptr = Sgl::InCapsule {
            offset: 0,
            len: 1024,
        }
        .encode();
        let mut data = ConnectData::new([7; 16], cntlid, TEST_NQN, HOSTNQN).encode();
        data[512..].fill(0);
        data[512..520].copy_from_slice(b"nqn.evil");
        let got = q.try_command(&cmd.to_sqe(), &data);
        rows.push(judge(
            "I/O Connect from another host NQN",
            Expect::Param(InvalidAttr::Data, doff::HOSTNQN),
            got,
            None,
        ));
    }

    // --- I/O queue ---
    {
        let (_a, mut q, _) = io_queue(addr, 31);
        let mut check =
            |rows: &mut Vec<Row>, input: &'static str, want: Status, sqe: Sqe, data: &[u8]| {
                let got = q.try_command(&sqe, data);
                let ok = usable(&mut q, true);
                rows.push(judge(input, Expect::Status(want), got, Some(ok)));
            };
        check(
            &mut rows,
            "reserved I/O opcode 0x7e",
            Status::INVALID_OPCODE.dnr(),
            {
                let mut s = Sqe::new(0x7e, 20);
                s.nsid = 1.into();
                s
            },
            &[],
        );
        check(
            &mut rows,
            "I/O opcode 0xff (vendor, unsupported)",
            Status::INVALID_OPCODE.dnr(),
            {
                let mut s = Sqe::new(0xff, 20);
                s.nsid = 1.into();
                s
            },
            &[],
        );
        let sgl = Sgl::InCapsule {
            offset: 0,
            len: 2 * bs,
        };
        check(
            &mut rows,
            "Write: in-capsule SGL of 2 blocks, 1 block in the capsule",
            Status::SGL_INVALID_DATA.dnr(),
            rw(io::WRITE, 21, 1, 0, 2, sgl),
            &vec![1; bs as usize],
        );
        let sgl = Sgl::InCapsule {
            offset: bs as u64,
            len: bs,
        };
        check(
            &mut rows,
            "Write: in-capsule SGL at offset 1 block (past the data start)",
            Status::SGL_INVALID_OFFSET.dnr(),
            rw(io::WRITE, 22, 1, 0, 1, sgl),
            &vec![1; 2 * bs as usize],
        );
        let sgl = Sgl::InCapsule {
            offset: u64::MAX - 10,
            len: bs,
        };
        check(
            &mut rows,
            "Write: in-capsule SGL offset near u64::MAX",
            Status::SGL_INVALID_OFFSET.dnr(),
            rw(io::WRITE, 23, 1, 0, 1, sgl),
            &vec![1; bs as usize],
        );
        let nlb = mdts_bytes / bs + 1;
        check(
            &mut rows,
            "Read above MDTS",
            Status::INVALID_FIELD.dnr(),
            read_sqe(24, 1, 0, nlb, bs),
            &[],
        );
        check(
            &mut rows,
            "Read of 2 blocks at the last LBA",
            Status::LBA_RANGE.dnr(),
            read_sqe(25, 1, blocks - 1, 2, bs),
            &[],
        );
        check(
            &mut rows,
            "Read at SLBA u64::MAX (SLBA + NLB overflows)",
            Status::LBA_RANGE.dnr(),
            read_sqe(26, 1, u64::MAX, 2, bs),
            &[],
        );
        check(
            &mut rows,
            "Write at SLBA 2^64 - 1, in-capsule",
            Status::LBA_RANGE.dnr(),
            rw(
                io::WRITE,
                27,
                1,
                u64::MAX,
                1,
                Sgl::InCapsule { offset: 0, len: bs },
            ),
            &vec![3; bs as usize],
        );
        let mut wz = Sqe::new(io::WRITE_ZEROES, 28);
        wz.nsid = 1.into();
        wz.cdw10 = (blocks as u32).into();
        wz.cdw11 = ((blocks >> 32) as u32).into();
        check(
            &mut rows,
            "Write Zeroes at SLBA = capacity",
            Status::LBA_RANGE.dnr(),
            wz,
            &[],
        );
        for (name, nsid) in [
            ("Read with NSID 0", 0u32),
            ("Read with NSID 0xffffffff", 0xffff_ffff),
            ("Read with unknown NSID 7", 7),
        ] {
            check(
                &mut rows,
                name,
                Status::INVALID_NS.dnr(),
                read_sqe(29, nsid, 0, 1, bs),
                &[],
            );
        }
    }

    // --- Flow control: more outstanding commands than the queue holds ---
    {
        // Queue size 4 (SQSIZE 3). SQ entries free up when the target consumes them, so a
        // host that follows SQHD may have more than 4 commands in flight; nvmet allows twice
        // the queue size and terminates the connection beyond that. Writes above the
        // in-capsule size wait for their data after an R2T, so they stay outstanding.
        let (_a, mut q, _) = io_queue(addr, 3);
        let len = 4 * bs.max(4096);
        let mut r2ts = 0;
        let mut answer = Answer::Closed;
        for cid in 0..9u16 {
            let sqe = rw(
                io::WRITE,
                100 + cid,
                1,
                cid as u64 * 64,
                len / bs,
                Sgl::Transport { len },
            );
            q.send(&capsule(sqe, &[]));
            answer = q.answer();
            match answer {
                Answer::R2t(_) => r2ts += 1,
                _ => break,
            }
        }
        let mut row = judge(
            "9 outstanding Writes on a queue of size 4 (SQSIZE 3)",
            Expect::Term(Fes::PduSequenceError, 0),
            answer,
            None,
        );
        row.got = format!("{r2ts} R2Ts, then {}", row.got);
        row.pass &= r2ts == 8;
        rows.push(row);
    }
    rows
}

#[test]
fn bad_input_table_with_a_good_host_running() {
    let mut t = TargetProc::start_default();
    let port = t.addr.port();
    // What a Linux host checks of the ICResp (linux-host-interop.md).
    let (_h, icresp) = RawHost::connect(t.addr);
    assert_eq!((icresp.pfv, icresp.cpda), (0, 0));
    assert!(icresp.maxh2cdata >= 4096 && icresp.maxh2cdata % 4 == 0);
    assert!(!icresp.hdgst && !icresp.ddgst, "no digests unless asked");

    // The well-behaved host: write a pattern, read it back, in a loop, in the second half of
    // the namespace (no row writes there).
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let failure: Arc<Mutex<Option<String>>> = Arc::default();
    let mut o = ConnectOptions::tcp("127.0.0.1", port, TEST_NQN);
    o.queues = 1;
    o.timeout = Duration::from_secs(10);
    let mut ctrl = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let mut ns = ctrl.open_namespace(1).expect("namespace 1");
    let (bs, size) = (ns.block_size(), ns.size());
    let blocks = size / bs as u64;
    // target.max_io_size (8 MiB by default: larger than the 128 KiB buffer, in pieces).
    let mdts = ctrl.info().max_transfer;
    assert_eq!(mdts, 8 << 20);
    let good = {
        let (stop, rounds, failure) = (stop.clone(), rounds.clone(), failure.clone());
        std::thread::spawn(move || {
            let half = size / 2;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let len = [4096usize, 16384, 65536][i as usize % 3];
                let off = half + (i * 65536) % (half - 65536);
                let data: Vec<u8> = (0..len)
                    .map(|j| (j as u64 ^ i.wrapping_mul(31)) as u8)
                    .collect();
                let r = ns.write_at(&data, off).and_then(|_| {
                    let mut back = vec![0u8; len];
                    ns.read_at(&mut back, off).map(|_| back)
                });
                match r {
                    Ok(back) if back == data => {}
                    Ok(_) => {
                        *failure.lock().unwrap() =
                            Some(format!("round {i}: read-back mismatch at {off}"));
                        return ns;
                    }
                    Err(e) => {
                        *failure.lock().unwrap() = Some(format!("round {i}: {e}"));
                        return ns;
                    }
                }
                i += 1;
                rounds.store(i, Ordering::Relaxed);
            }
            ns
        })
    };

    let rows = rows(t.addr, bs, blocks, mdts);
    // Keep the good host running a little after the last row.
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let ns = good.join().expect("good host thread");
    drop(ns);
    let good_err = failure.lock().unwrap().clone();
    let done = rounds.load(Ordering::Relaxed);

    let w = rows.iter().map(|r| r.input.len()).max().unwrap_or(5);
    let we = rows
        .iter()
        .map(|r| r.expect.to_string().len())
        .max()
        .unwrap_or(8);
    println!("\nbad input over NVMe/TCP (target {}):", t.addr);
    println!("{:w$} -> {:we$} -> got -> result", "input", "expected");
    for r in &rows {
        println!(
            "{:w$} -> {:we$} -> {} -> {}",
            r.input,
            r.expect.to_string(),
            r.got,
            if r.pass { "PASS" } else { "FAIL" }
        );
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    println!(
        "{} rows, {} passed, {failed} failed; good host: {done} write+read-back rounds, {}",
        rows.len(),
        rows.len() - failed,
        good_err.as_deref().unwrap_or("no error")
    );

    assert_eq!(
        failed,
        0,
        "bad-input rows failed (table above)\n{}",
        t.log_text()
    );
    assert!(
        good_err.is_none(),
        "the good host saw an error: {good_err:?}"
    );
    assert!(done > 0, "the good host completed no round");
    ctrl.shutdown().expect("good host shuts down cleanly");
    assert!(
        t.terminate(),
        "target exits 0 on SIGTERM:\n{}",
        t.log_text()
    );
}

/// A command larger than the target's 128 KiB buffers (MDTS is 8 MiB) moves in pieces: a
/// Write is asked for by one R2T per piece, in order, each for the next 128 KiB; a Read comes
/// back as C2HData PDUs at increasing offsets, LAST on the final one only; the data survives.
#[test]
fn large_commands_move_in_buffer_sized_pieces() {
    const UNIT: u32 = 128 * 1024;
    let t = TargetProc::start_default();
    let (_a, mut q, _) = io_queue(t.addr, 31);
    let bs = 4096u32;
    let len = 5 * UNIT + 3 * bs; // 6 pieces, the last one short
    let data: Vec<u8> = (0..len).map(|i| (i ^ (i >> 11)) as u8).collect();
    // Write: capsule without data, then an R2T per piece.
    let sqe = rw(io::WRITE, 40, 1, 16, len / bs, Sgl::Transport { len });
    q.send(&Pdu::CapsuleCmd { sqe, data_len: 0 }.encode(&Default::default(), &[]));
    let mut r2ts = Vec::new();
    let cqe = loop {
        let p = q.recv().expect("the target answers");
        match p.pdu {
            Pdu::R2T(r) => {
                r2ts.push((r.r2to, r.r2tl));
                let piece = &data[r.r2to as usize..(r.r2to + r.r2tl) as usize];
                // Two H2CData PDUs per R2T (the host may split as it likes up to MAXH2CDATA).
                let half = r.r2tl / 2;
                for (o, l, last) in [(0, half, false), (half, r.r2tl - half, true)] {
                    let d = DataPdu {
                        cccid: 40,
                        ttag: r.ttag,
                        datao: r.r2to + o,
                        datal: l,
                        last,
                        success: false,
                    };
                    let bytes = &piece[o as usize..(o + l) as usize];
                    q.send(&Pdu::H2CData(d).encode(&Default::default(), bytes));
                }
            }
            Pdu::CapsuleResp(c) => break c,
            other => panic!("unexpected PDU {other:?}"),
        }
    };
    assert!(cqe.status().is_success(), "{cqe:?}");
    let want: Vec<(u32, u32)> = (0..6)
        .map(|i| (i * UNIT, if i < 5 { UNIT } else { 3 * bs }))
        .collect();
    assert_eq!(r2ts, want, "one R2T per buffer-sized piece, in order");
    // Read it back: C2HData per piece.
    let sqe = read_sqe(41, 1, 16, len / bs, bs);
    q.send(&Pdu::CapsuleCmd { sqe, data_len: 0 }.encode(&Default::default(), &[]));
    let mut got = Vec::new();
    let mut pdus = Vec::new();
    let cqe = loop {
        let p = q.recv().expect("the target answers");
        match p.pdu {
            Pdu::C2HData(d) => {
                assert_eq!(d.datao as usize, got.len(), "data in order");
                pdus.push((d.datao, d.datal, d.last));
                got.extend_from_slice(&p.data);
            }
            Pdu::CapsuleResp(c) => break c,
            other => panic!("unexpected PDU {other:?}"),
        }
    };
    assert!(cqe.status().is_success(), "{cqe:?}");
    let want: Vec<(u32, u32, bool)> = (0..6)
        .map(|i| (i * UNIT, if i < 5 { UNIT } else { 3 * bs }, i == 5))
        .collect();
    assert_eq!(pdus, want);
    assert!(got == data, "read back what was written");
    // A piece that fails ends the command: a read past the namespace end is refused at
    // parse, before any piece moves.
    let blocks = (64u64 << 20) / bs as u64;
    let sqe = read_sqe(42, 1, blocks - 8, 64, bs);
    let (c, d) = q.command(&sqe, &[]);
    assert_eq!(c.status(), Status::LBA_RANGE.dnr());
    assert!(d.is_empty());
}

/// Our initiator moves 8 MiB each way (its block API in 1 MiB commands, each moved by the target
/// through a 128 KiB buffer in 8 pieces; MDTS is 8 MiB), compares it in place, and the data
/// survives.
#[test]
fn large_transfers_through_the_initiator() {
    let t = TargetProc::start_default();
    let mut c = Controller::connect(ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN))
        .unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    assert_eq!(c.info().max_transfer, 8 << 20);
    let mut ns = c.open_namespace(1).unwrap();
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    ns.write_at(&data, 1 << 20).unwrap();
    let mut back = vec![0u8; data.len()];
    ns.read_at(&mut back, 1 << 20).unwrap();
    assert!(back == data, "8 MiB read back");
    assert!(
        ns.compare_at(&data, 1 << 20).unwrap(),
        "Compare in pieces matches"
    );
    let mut other = data.clone();
    other[(7 << 20) + 5] ^= 1;
    assert!(
        !ns.compare_at(&other, 1 << 20).unwrap(),
        "a difference in the last MiB"
    );
}

/// Every buffer of the poller's pool (64: `max_queue_depth` 32, one poller) held by Writes
/// waiting for their H2CData (31 on queue 1, 31 on queue 2, 2 on queue 3 with 29 more waiting
/// for a buffer), then an in-capsule Write on each queue with the H2CData that frees the
/// buffers behind it on the stream. A target that stopped reading a connection until a buffer
/// freed up hung all three queues for good (found by the connection's property test,
/// `transport::tcp::tests`); one that reads on answers all 96 commands.
#[test]
fn in_capsule_data_behind_writes_holding_every_buffer() {
    let t = TargetProc::start_with(|port, dir| {
        format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
             subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    namespaces:\n      \
             - {{ nsid: 1, path: {}/ns1.img, size: 64MiB }}\n\
             target: {{ threads: 1, max_queue_depth: 32, keep_alive_ms_min: 1000 }}\n",
            dir.display()
        )
    });
    let (mut a, cntlid) = admin(t.addr);
    let mut sqe = Sqe::new(admin::SET_FEATURES, 4);
    sqe.cdw10 = (feat::NUM_QUEUES as u32).into();
    sqe.cdw11 = (2u32 | 2 << 16).into();
    let (c, _) = a.command(&sqe, &[]);
    assert!(c.status().is_success(), "{c:?}");
    let mut qs: Vec<RawHost> = (1..=3u16)
        .map(|qid| {
            let (mut q, _) = RawHost::connect(t.addr);
            let c = q.fabrics_connect(TEST_NQN, qid, 31, cntlid);
            assert!(c.status().is_success(), "{c:?}");
            q
        })
        .collect();
    let bs = 4096u32;
    let len = 4 * bs; // above the 8 KiB in-capsule limit: by R2T
    let h2c = |q: &mut RawHost, r: &nvme::tcp::R2t| {
        let d = DataPdu {
            cccid: r.cccid,
            ttag: r.ttag,
            datao: r.r2to,
            datal: r.r2tl,
            last: true,
            success: false,
        };
        q.send(&Pdu::H2CData(d).encode(&Default::default(), &vec![0x3a; r.r2tl as usize]));
    };
    // 31 Writes per queue, one queue after the other: 31 + 31 + 2 R2Ts take the whole pool.
    let mut r2ts = [Vec::new(), Vec::new(), Vec::new()];
    for (i, q) in qs.iter_mut().enumerate() {
        for k in 0..31u16 {
            let slba = (i as u64 * 32 + k as u64) * 4;
            let sqe = rw(io::WRITE, 100 + k, 1, slba, 4, Sgl::Transport { len });
            q.send(&capsule(sqe, &[]));
        }
        let want = if i < 2 { 31 } else { 2 };
        while r2ts[i].len() < want {
            match q.recv().map(|p| p.pdu) {
                Some(Pdu::R2T(r)) => r2ts[i].push(r),
                other => panic!("queue {}: expected an R2T, got {other:?}", i + 1),
            }
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    // An in-capsule Write on each queue, then the data its R2Ts asked for.
    for (i, q) in qs.iter_mut().enumerate() {
        let sgl = Sgl::InCapsule { offset: 0, len: bs };
        let sqe = rw(io::WRITE, 200, 1, 1000 + i as u64, 1, sgl);
        q.send(&capsule(sqe, &vec![0xc5; bs as usize]));
        for r in &r2ts[i] {
            h2c(q, r);
        }
    }
    for (i, q) in qs.iter_mut().enumerate() {
        let mut n = 0;
        while n < 32 {
            match q.recv().map(|p| p.pdu) {
                Some(Pdu::R2T(r)) => h2c(q, &r),
                Some(Pdu::CapsuleResp(c)) => {
                    assert!(c.status().is_success(), "queue {}: {c:?}", i + 1);
                    n += 1;
                }
                other => panic!("queue {}: {n} of 32 answered, then {other:?}", i + 1),
            }
        }
    }
}
