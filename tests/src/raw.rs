//! A raw NVMe/TCP host for tests that need to send exactly the bytes they want (bad input,
//! protocol corner cases). Built on the `nvme` crate's PDU codec.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use nvme::fabrics::{ConnectCmd, ConnectData, CNTLID_DYNAMIC};
use nvme::sgl::Sgl;
use nvme::tcp::{IcReq, IcResp, OwnedPdu, Pdu, PduCollector, R2t, RxConfig, TxConfig};
use nvme::{Cqe, Sqe};
use std::io::{Read, Write};

pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6c0a1f3e-4b8d-4c52-9a2e-1f0c3d5e7a90";

/// How the target answered a request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A completion (and the data that came before it).
    Cqe(Cqe, Vec<u8>),
    /// An R2T: the target wants the command's data.
    R2t(R2t),
    /// A C2HTermReq; `closed`: the connection was closed after it.
    Term { fes: u16, fei: u32, closed: bool },
    /// The connection closed without a TermReq.
    Closed,
}

/// A raw connection: bytes out, PDUs in.
pub struct RawHost {
    pub sock: TcpStream,
    rx: PduCollector,
    pending: std::collections::VecDeque<OwnedPdu>,
    pub tx: TxConfig,
}

impl RawHost {
    /// TCP connect only (no ICReq yet).
    pub fn connect_tcp(addr: SocketAddr) -> RawHost {
        let sock = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        sock.set_nodelay(true).unwrap();
        RawHost {
            sock,
            rx: PduCollector::new(RxConfig::host()),
            pending: Default::default(),
            tx: TxConfig::default(),
        }
    }

    /// TCP connect + ICReq/ICResp.
    pub fn connect(addr: SocketAddr) -> (RawHost, IcResp) {
        RawHost::connect_digests(addr, false, false)
    }

    /// TCP connect + ICReq/ICResp asking for header and/or data digests; later PDUs in both
    /// directions carry what the ICResp granted.
    pub fn connect_digests(addr: SocketAddr, hdgst: bool, ddgst: bool) -> (RawHost, IcResp) {
        let mut h = RawHost::connect_tcp(addr);
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst,
            ddgst,
            maxr2t: 0,
        };
        h.send(&req.encode());
        let resp = match h.recv().expect("ICResp").pdu {
            Pdu::IcResp(r) => r,
            other => panic!("expected ICResp, got {other:?}"),
        };
        h.rx.deframer.set_digests(resp.hdgst, resp.ddgst);
        h.tx.hdgst = resp.hdgst;
        h.tx.ddgst = resp.ddgst;
        (h, resp)
    }

    /// Read until the target answers: a CapsuleResp (with any C2HData before it), a
    /// C2HTermReq (then whether the connection closed after it), or a closed connection.
    pub fn answer(&mut self) -> Answer {
        let mut data = Vec::new();
        loop {
            let Some(p) = self.recv() else {
                return Answer::Closed;
            };
            match p.pdu {
                Pdu::C2HData(d) => {
                    data.extend_from_slice(&p.data);
                    if d.success {
                        return Answer::Cqe(Cqe::new(d.cccid, nvme::Status::SUCCESS, 0), data);
                    }
                }
                Pdu::CapsuleResp(cqe) => return Answer::Cqe(cqe, data),
                Pdu::C2HTermReq(t) => {
                    let closed = self.recv().is_none();
                    return Answer::Term {
                        fes: t.fes,
                        fei: t.fei,
                        closed,
                    };
                }
                Pdu::R2T(r) => return Answer::R2t(r),
                other => panic!("unexpected PDU {other:?}"),
            }
        }
    }

    /// Send a capsule with `data` in-capsule and wait for the [`Answer`].
    pub fn try_command(&mut self, sqe: &Sqe, data: &[u8]) -> Answer {
        let pdu = Pdu::CapsuleCmd {
            sqe: *sqe,
            data_len: data.len() as u32,
        };
        let bytes = pdu.encode(&self.tx, data);
        if self.sock.write_all(&bytes).is_err() {
            return Answer::Closed;
        }
        self.answer()
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("send");
    }

    /// Next PDU, or None when the target closed the connection (or the read timed out).
    pub fn recv(&mut self) -> Option<OwnedPdu> {
        let mut buf = [0u8; 65536];
        loop {
            if let Some(p) = self.pending.pop_front() {
                return Some(p);
            }
            let n = match self.sock.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => n,
            };
            let pdus = self
                .rx
                .push(&buf[..n])
                .expect("target sent a malformed PDU stream");
            self.pending.extend(pdus);
        }
    }

    /// Send a capsule (with in-capsule data if any) and return the PDUs up to its CapsuleResp.
    pub fn command(&mut self, sqe: &Sqe, data: &[u8]) -> (Cqe, Vec<u8>) {
        let pdu = Pdu::CapsuleCmd {
            sqe: *sqe,
            data_len: data.len() as u32,
        };
        let bytes = pdu.encode(&self.tx, data);
        self.send(&bytes);
        let mut got = Vec::new();
        loop {
            let p = self
                .recv()
                .expect("connection closed while waiting for a response");
            match p.pdu {
                Pdu::C2HData(d) => {
                    got.extend_from_slice(&p.data);
                    if d.success {
                        return (Cqe::new(sqe.cid(), nvme::Status::SUCCESS, 0), got);
                    }
                }
                Pdu::CapsuleResp(cqe) => return (cqe, got),
                other => panic!("unexpected PDU {other:?}"),
            }
        }
    }

    /// Fabrics Connect on `qid` (admin: cntlid 0xFFFF, KATO 5 s).
    pub fn fabrics_connect(&mut self, subnqn: &str, qid: u16, sqsize: u16, cntlid: u16) -> Cqe {
        let kato = if qid == 0 { 5000 } else { 0 };
        self.fabrics_connect_kato(subnqn, qid, sqsize, cntlid, kato)
    }

    /// Fabrics Connect on `qid` with keep-alive timeout `kato_ms` (admin: cntlid 0xFFFF).
    pub fn fabrics_connect_kato(
        &mut self,
        subnqn: &str,
        qid: u16,
        sqsize: u16,
        cntlid: u16,
        kato_ms: u32,
    ) -> Cqe {
        let mut cmd = ConnectCmd::from_sqe(&Sqe::new(nvme::opcode::FABRICS, 1));
        cmd.fctype = nvme::opcode::fctype::CONNECT;
        cmd.qid = qid.into();
        cmd.sqsize = sqsize.into();
        cmd.kato = kato_ms.into();
        cmd.dptr = Sgl::InCapsule {
            offset: 0,
            len: 1024,
        }
        .encode();
        let cntlid = if qid == 0 { CNTLID_DYNAMIC } else { cntlid };
        let data = ConnectData::new([7u8; 16], cntlid, subnqn, HOSTNQN).encode();
        self.command(&cmd.to_sqe(), &data).0
    }
}
