//! NVMe/TCP protocol handling of the real `nvmf-target` binary over loopback: malformed PDUs
//! end in a C2HTermReq and a closed connection, while other connections keep working.

use nvme::tcp::{Fes, IcReq, Pdu};
use nvme::{Sqe, Status};
use nvmf_tests::raw::RawHost;
use nvmf_tests::{TargetProc, TEST_NQN};

/// A CapsuleCmd common header with a wrong HLEN: the target answers C2HTermReq with FES
/// "Invalid Header Field" and FEI = 2 (HLEN's offset), closes, and a second host that
/// connects at the same time is unaffected.
#[test]
fn wrong_header_length_terminates_only_that_connection() {
    let mut t = TargetProc::start_default();
    let (mut good, icresp) = RawHost::connect(t.addr);
    assert_eq!(icresp.pfv, 0);
    assert!(icresp.maxh2cdata >= 4096 && icresp.maxh2cdata % 4 == 0);
    assert_eq!(icresp.cpda, 0);

    let (mut bad, _) = RawHost::connect(t.addr);
    let mut pdu = Pdu::CapsuleCmd {
        sqe: Sqe::new(0x06, 1),
        data_len: 0,
    }
    .encode(&bad.tx, &[]);
    pdu[2] = 0x40; // HLEN 64 instead of 72
    bad.send(&pdu);
    let term = bad.recv().expect("a C2HTermReq before the close");
    match term.pdu {
        Pdu::C2HTermReq(t) => {
            assert_eq!(t.fes(), Some(Fes::InvalidHeaderField));
            assert_eq!(t.fei, 2, "FEI names the HLEN byte");
        }
        other => panic!("expected C2HTermReq, got {other:?}"),
    }
    assert!(
        bad.recv().is_none(),
        "connection must be closed after the TermReq"
    );

    // The other connection still works: Fabrics Connect succeeds and yields a cntlid.
    let cqe = good.fabrics_connect(TEST_NQN, 0, 31, 0);
    assert_eq!(cqe.status(), Status::SUCCESS, "{cqe:?}");
    assert_ne!(cqe.result.get() & 0xffff, 0xffff);
    drop(good);
    assert!(
        t.terminate(),
        "target exits 0 on SIGTERM:\n{}",
        t.log_text()
    );
}

/// A capsule before the ICReq is a PDU sequence error.
#[test]
fn capsule_before_icreq_is_a_sequence_error() {
    let t = TargetProc::start_default();
    let mut h = RawHost::connect_tcp(t.addr);
    let pdu = Pdu::CapsuleCmd {
        sqe: Sqe::new(0x06, 1),
        data_len: 0,
    }
    .encode(&h.tx, &[]);
    h.send(&pdu);
    match h.recv().map(|p| p.pdu) {
        Some(Pdu::C2HTermReq(t)) => assert_eq!(t.fes(), Some(Fes::PduSequenceError)),
        other => panic!("expected C2HTermReq, got {other:?}"),
    }
    assert!(h.recv().is_none());
}

/// An ICReq with an unsupported PFV gets "Unsupported Parameter" with FEI at PFV (byte 8).
#[test]
fn unsupported_pfv_is_refused() {
    let t = TargetProc::start_default();
    let mut h = RawHost::connect_tcp(t.addr);
    let mut req = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: false,
        ddgst: false,
        maxr2t: 0,
    }
    .encode();
    req[8] = 1;
    h.send(&req);
    match h.recv().map(|p| p.pdu) {
        Some(Pdu::C2HTermReq(t)) => {
            assert_eq!(t.fes(), Some(Fes::UnsupportedParameter));
            assert_eq!(t.fei, 8);
        }
        other => panic!("expected C2HTermReq, got {other:?}"),
    }
}

/// Commands before Connect get Command Sequence Error; Connect to an unknown subsystem fails
/// with a Connect status, never a dropped connection.
#[test]
fn commands_before_connect_and_unknown_subsystem() {
    let t = TargetProc::start_default();
    let (mut h, _) = RawHost::connect(t.addr);
    let (cqe, _) = h.command(&Sqe::new(0x06, 9), &[]);
    assert_eq!(cqe.cid(), 9);
    assert_eq!(cqe.status().code(), Status::CMD_SEQ_ERROR.code(), "{cqe:?}");
    let cqe = h.fabrics_connect("nqn.2026-11.io.nvmf-rs:nope", 0, 31, 0);
    assert!(!cqe.status().is_success());
    assert_eq!(
        cqe.status().sct(),
        1,
        "a command-specific Connect status: {cqe:?}"
    );
}
