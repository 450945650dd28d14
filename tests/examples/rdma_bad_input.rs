//! Live bad-input table against an NVMe/RDMA target: CM connect requests with bad private
//! data, capsules with reserved opcodes, bad SGLs, transfers above MDTS, LBA ranges past the
//! end, bad namespace IDs, queue overflow, Connect with a wrong cntlid or qid, I/O before CC.EN,
//! Property Set of a read-only register, and keyed SGLs whose rkey the target cannot use.
//! Built on `initiator::rdma::raw` (cargo feature `raw`), which sends exactly the bytes given.
//!
//! ```text
//! rdma_bad_input --traddr 192.168.78.1 [--trsvcid 4420] --subnqn NQN [--timeout 10]
//! ```
//!
//! One row per case, `PASS|FAIL  input -> expected -> got`, then `N rows: N passed, N failed`.
//! Exits 1 if any row fails. Every wait is bounded by `--timeout` (a hang is a FAIL row).

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use initiator::rdma::raw::{Event, Outcome, RawConn};
use nvme::fabrics::{self, reg, Cc, ConnectCmd, ConnectData, Csts, PropSize, CNTLID_DYNAMIC};
use nvme::identify::{IdentifyCmd, IdentifyController, IdentifyNamespace};
use nvme::opcode::{admin, fctype, io, FABRICS};
use nvme::rdma::{CmReject, CmRequest, CmStatus};
use nvme::sgl::{kind, Sgl};
use nvme::{Sqe, Status};

#[derive(Parser, Debug)]
#[command(about = "Bad-input table against a live NVMe/RDMA target")]
struct Args {
    #[arg(long)]
    traddr: IpAddr,
    #[arg(long, default_value_t = 4420)]
    trsvcid: u16,
    #[arg(long)]
    subnqn: String,
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// Seconds any one wait (CM event, response) may take.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
}

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6e0b5a1e-bad1-4bad-8bad-0123456789ab";
const HOSTID: [u8; 16] = *b"rdma-bad-input!!";
const ADMIN_DEPTH: u16 = 32;
const IO_DEPTH: u16 = 8;

struct Row {
    input: String,
    expected: String,
    got: String,
    pass: bool,
}

/// What the namespace and controller look like (from Identify).
#[derive(Clone, Copy)]
struct Geometry {
    cntlid: u16,
    nsze: u64,
    bs: u32,
    max_xfer: u32,
    icd: u32,
    /// First block of the area the write rows aim at: the last 4096 blocks, away from the
    /// region a concurrent good host verifies (it starts at block 0).
    scratch: u64,
}

struct Bench {
    dst: SocketAddr,
    subnqn: String,
    nsid: u32,
    t: Duration,
    rows: Vec<Row>,
    cid: u16,
}

type R<T> = Result<T, String>;

fn st(s: Status) -> String {
    format!(
        "{} ({}){}",
        nvme::status::name(s.code()),
        s.description(),
        if s.is_dnr() { " DNR" } else { "" }
    )
}

fn ev_str(e: &Event) -> String {
    match e {
        Event::Cqe(c) => st(c.status()),
        Event::WcError(op, s) => format!("{op} completed with {s:?} (connection broken)"),
        Event::Cm(t) => format!("rdma_cm {t:?} (target closed the connection)"),
        Event::Timeout => "no answer (timeout)".into(),
    }
}

fn cm_req(qid: u16, hrqsize: u16, hsqsize: u16, cntlid: u16) -> [u8; 32] {
    CmRequest {
        qid,
        hrqsize,
        hsqsize,
        cntlid,
    }
    .encode()
}

fn rw(op: u8, nsid: u32, slba: u64, nlb: u32, dptr: [u8; 16]) -> Sqe {
    let mut s = Sqe::new(op, 0);
    s.nsid = nsid.into();
    s.cdw10 = (slba as u32).into();
    s.cdw11 = ((slba >> 32) as u32).into();
    s.cdw12 = nlb.saturating_sub(1).into();
    s.dptr = dptr;
    s
}

impl Bench {
    fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1).max(1);
        self.cid
    }

    fn row(&mut self, input: &str, expected: &str, got: R<(String, bool)>) {
        let (got, pass) = got.unwrap_or_else(|e| (format!("error: {e}"), false));
        println!(
            "{}  {input} -> {expected} -> {got}",
            if pass { "PASS" } else { "FAIL" }
        );
        self.rows.push(Row {
            input: input.into(),
            expected: expected.into(),
            got,
            pass,
        });
    }

    fn connect(&self, pd: &[u8], nrecv: u32) -> R<Outcome> {
        RawConn::connect(self.dst, pd, nrecv, self.t).map_err(|e| e.to_string())
    }

    fn established(&self, pd: &[u8], nrecv: u32) -> R<Box<RawConn>> {
        match self.connect(pd, nrecv)? {
            Outcome::Connected(c, _) => Ok(c),
            Outcome::Rejected { detail, .. } => Err(format!("CM connect rejected: {detail}")),
            Outcome::Other(t, s) => Err(format!("CM connect: {t:?} (status {s})")),
        }
    }

    /// Send and wait for the response; the queue's cid counter names the command.
    fn cmd(&mut self, c: &mut RawConn, mut sqe: Sqe, data: &[u8]) -> R<Event> {
        sqe.cid = self.next_cid().into();
        c.command(&sqe, data, self.t).map_err(|e| e.to_string())
    }

    fn ok(&mut self, c: &mut RawConn, sqe: Sqe, what: &str) -> R<u64> {
        match self.cmd(c, sqe, &[])? {
            Event::Cqe(q) if q.status().is_success() => Ok(q.result.get()),
            e => Err(format!("{what}: {}", ev_str(&e))),
        }
    }

    /// Fabrics Connect with its data read by the target from the host buffer (keyed SGL).
    fn fabrics_connect(&mut self, c: &mut RawConn, qid: u16, sqsize: u16, cntlid: u16) -> R<Event> {
        let data = ConnectData::new(HOSTID, cntlid, &self.subnqn, HOSTNQN).encode();
        c.host_buf().write_at(0, &data).map_err(|e| e.to_string())?;
        let mut cmd = ConnectCmd::from_sqe(&Sqe::new(FABRICS, 0));
        cmd.fctype = fctype::CONNECT;
        cmd.qid = qid.into();
        cmd.sqsize = sqsize.into();
        cmd.kato = if qid == 0 { 60_000u32 } else { 0 }.into();
        cmd.dptr = c.keyed(0, data.len() as u32);
        self.cmd(c, cmd.to_sqe(), &[])
    }

    /// An admin queue with a controller (not enabled): the connection and its cntlid.
    fn admin(&mut self) -> R<(Box<RawConn>, u16)> {
        let pd = cm_req(0, ADMIN_DEPTH, ADMIN_DEPTH - 1, 0);
        let mut a = self.established(&pd, ADMIN_DEPTH as u32)?;
        match self.fabrics_connect(&mut a, 0, ADMIN_DEPTH - 1, CNTLID_DYNAMIC)? {
            Event::Cqe(q) if q.status().is_success() => Ok((a, q.result.get() as u16)),
            e => Err(format!("admin Connect: {}", ev_str(&e))),
        }
    }

    /// CC.EN = 1, wait for CSTS.RDY, ask for 4 I/O queues.
    fn enable(&mut self, a: &mut RawConn) -> R<()> {
        let cc = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4).0 as u64;
        self.ok(
            a,
            fabrics::property_set_sqe(0, reg::CC, cc, PropSize::Four),
            "Property Set CC",
        )?;
        let end = Instant::now() + self.t;
        loop {
            let csts = self.ok(
                a,
                fabrics::property_get_sqe(0, reg::CSTS, PropSize::Four),
                "CSTS",
            )?;
            if Csts(csts as u32).rdy() {
                break;
            }
            if Instant::now() >= end {
                return Err("CSTS.RDY never set".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut sf = Sqe::new(admin::SET_FEATURES, 0);
        sf.cdw10 = (nvme::identify::feat::NUM_QUEUES as u32).into();
        sf.cdw11 = (3 | 3 << 16).into();
        self.ok(a, sf, "Set Features Number of Queues")?;
        Ok(())
    }

    /// An I/O queue `qid` of controller `cntlid`, `IO_DEPTH` deep.
    fn io(&mut self, qid: u16, cntlid: u16) -> R<Box<RawConn>> {
        let pd = cm_req(qid, IO_DEPTH, IO_DEPTH - 1, cntlid);
        let mut q = self.established(&pd, IO_DEPTH as u32 + 1)?;
        match self.fabrics_connect(&mut q, qid, IO_DEPTH - 1, cntlid)? {
            Event::Cqe(c) if c.status().is_success() => Ok(q),
            e => Err(format!("I/O queue {qid} Connect: {}", ev_str(&e))),
        }
    }

    fn identify(&mut self, a: &mut RawConn, cns: u8, nsid: u32) -> R<Vec<u8>> {
        let dptr = a.keyed(0, 4096);
        let sqe = IdentifyCmd {
            cns,
            cntid: 0,
            cnssid: 0,
            csi: 0,
            nsid,
        }
        .to_sqe(0, dptr);
        self.ok(a, sqe, "Identify")?;
        let mut buf = vec![0u8; 4096];
        a.host_buf()
            .read_at(0, &mut buf)
            .map_err(|e| e.to_string())?;
        Ok(buf)
    }

    /// A ready controller with I/O queue 1, and what Identify says.
    fn controller(&mut self) -> R<(Box<RawConn>, Box<RawConn>, Geometry)> {
        let (mut a, cntlid) = self.admin()?;
        self.enable(&mut a)?;
        let ctrl = self.identify(&mut a, 1, 0)?;
        let ctrl = IdentifyController::decode(&ctrl).map_err(|e| e.to_string())?;
        let ns = self.identify(&mut a, 0, self.nsid)?;
        let ns = IdentifyNamespace::decode(&ns).map_err(|e| e.to_string())?;
        let bs = 1u32 << ns.lbaf[(ns.flbas & 0xf) as usize].ds;
        let mdts = ctrl.mdts;
        // MDTS 0 states no limit: assume 1 MiB (the row above it then expects a refusal the
        // target need not give). Our target states 8 MiB by default.
        let max_xfer = if mdts == 0 || mdts > 19 {
            1 << 20
        } else {
            4096u32 << mdts
        };
        let icd = (ctrl.ioccsz.get() * 16).saturating_sub(64);
        let q = self.io(1, cntlid)?;
        Ok((
            a,
            q,
            Geometry {
                cntlid,
                nsze: ns.nsze.get(),
                bs,
                max_xfer,
                icd,
                scratch: ns.nsze.get().saturating_sub(4096),
            },
        ))
    }

    /// A row whose answer must be the NVMe status `want` (DNR not compared).
    fn status_row(&mut self, input: &str, want: Status, got: R<Event>) {
        let got = got.map(|e| {
            let pass = matches!(&e, Event::Cqe(c) if c.status().code() == want.code());
            (ev_str(&e), pass)
        });
        self.row(input, &st(want), got);
    }

    // ---- the rows ----------------------------------------------------------------------

    fn cm_rows(&mut self) {
        let cases: [(&str, Vec<u8>, CmStatus); 5] = [
            (
                "CM connect recfmt 1",
                {
                    let mut p = cm_req(0, 32, 31, 0).to_vec();
                    p[0] = 1;
                    p
                },
                CmStatus::InvalidRecfmt,
            ),
            (
                "CM connect admin hsqsize 0",
                cm_req(0, 32, 0, 0).to_vec(),
                CmStatus::InvalidHsqsize,
            ),
            (
                "CM connect admin hsqsize 32 (33 entries > 32)",
                cm_req(0, 33, 32, 0).to_vec(),
                CmStatus::InvalidHsqsize,
            ),
            (
                "CM connect I/O hsqsize 65535 (above MQES)",
                cm_req(1, 0xffff, 0xffff, 1).to_vec(),
                CmStatus::InvalidHsqsize,
            ),
            (
                "CM connect hrqsize 0",
                cm_req(0, 0, 31, 0).to_vec(),
                CmStatus::InvalidHrqsize,
            ),
        ];
        for (input, pd, want) in cases {
            let expected = format!("REJECT, private data recfmt 0 sts {} ({want})", want as u16);
            let got = self.connect(&pd, 4).map(|o| match o {
                Outcome::Rejected {
                    cm_status,
                    private_data,
                    ..
                } => {
                    let rej = CmReject::decode(&private_data);
                    let pass = rej.is_some_and(|r| r.recfmt == 0 && r.sts == want as u16);
                    let what = match rej {
                        Some(r) => format!(
                            "REJECT (CM status {cm_status}), recfmt {} sts {} ({})",
                            r.recfmt,
                            r.sts,
                            r.status().map_or("unknown".into(), |s| s.to_string())
                        ),
                        None => format!("REJECT (CM status {cm_status}) without NVMe/RDMA data"),
                    };
                    (what, pass)
                }
                Outcome::Connected(..) => ("ESTABLISHED".into(), false),
                Outcome::Other(t, s) => (format!("{t:?} (status {s})"), false),
            });
            self.row(input, &expected, got);
        }
        // nvmet checks hrqsize only for 0: it bounds the host's own RECVs, not the target.
        let got = self.connect(&cm_req(0, 1, 31, 0), 4).map(|o| match o {
            Outcome::Connected(..) => ("ESTABLISHED".into(), true),
            Outcome::Rejected { detail, .. } => (format!("REJECT: {detail}"), false),
            Outcome::Other(t, s) => (format!("{t:?} (status {s})"), false),
        });
        self.row(
            "CM connect admin hrqsize 1 < hsqsize+1 = 32",
            "ESTABLISHED (as nvmet: hrqsize sizes the host's RECVs only)",
            got,
        );
    }

    /// Connect rows that need the CM to accept and Fabrics Connect to refuse.
    fn connect_rows(&mut self, cntlid: u16) {
        let want = Status::CONNECT_INVALID_PARAM;
        let cases = [
            (
                "I/O qid 1 Connect before any admin queue (cntlid 0x1234)",
                1u16,
                0x1234u16,
                IO_DEPTH - 1,
            ),
            (
                "I/O qid 9 beyond the 4 granted queues",
                9,
                cntlid,
                IO_DEPTH - 1,
            ),
            (
                "I/O Connect with a wrong cntlid (ours + 1)",
                2,
                cntlid.wrapping_add(1),
                IO_DEPTH - 1,
            ),
            ("I/O Connect with sqsize 0", 3, cntlid, 0),
            (
                "I/O Connect sqsize 31 on a CM queue of hsqsize 7 (8 RECVs)",
                3,
                cntlid,
                31,
            ),
        ];
        for (input, qid, c, sqsize) in cases {
            let got = self
                .established(&cm_req(qid, IO_DEPTH, IO_DEPTH - 1, c), IO_DEPTH as u32)
                .and_then(|mut q| self.fabrics_connect(&mut q, qid, sqsize, c));
            self.status_row(input, want, got);
        }
    }

    /// A Fabrics Connect for another queue than the one the CM request set up (its RECVs were
    /// sized for that queue): the target closes the connection.
    fn qid_mismatch_row(&mut self, cntlid: u16) {
        let got = (|| -> R<(String, bool)> {
            let pd = cm_req(3, IO_DEPTH, IO_DEPTH - 1, cntlid);
            let mut q = self.established(&pd, IO_DEPTH as u32)?;
            let first = self.fabrics_connect(&mut q, 4, IO_DEPTH - 1, cntlid)?;
            Ok(match first {
                Event::Cqe(c) if c.status().is_success() => {
                    let e = q.next(self.t).map_err(|e| e.to_string())?;
                    let closed = matches!(e, Event::Cm(_) | Event::WcError(..));
                    (format!("Connect succeeded, then {}", ev_str(&e)), closed)
                }
                e @ (Event::Cqe(_) | Event::Cm(_) | Event::WcError(..)) => (ev_str(&e), true),
                e @ Event::Timeout => (ev_str(&e), false),
            })
        })();
        self.row(
            "Fabrics Connect for qid 4 on the CM connection of qid 3",
            "the connection closes (or a Connect error status)",
            got,
        );
    }

    fn admin_rows(&mut self, a: &mut RawConn) {
        for (input, op) in [
            ("admin opcode 0xc1 (reserved)", 0xc1u8),
            ("admin Format NVM 0x80 (not supported)", admin::FORMAT_NVM),
            (
                "admin Create I/O SQ 0x01 (not on fabrics)",
                admin::CREATE_SQ,
            ),
        ] {
            let got = self.cmd(a, Sqe::new(op, 0), &[]);
            self.status_row(input, Status::INVALID_OPCODE, got);
        }
        let got = self.cmd(
            a,
            fabrics::property_set_sqe(0, reg::CAP, 0, PropSize::Eight),
            &[],
        );
        self.status_row("Property Set CAP (read-only)", Status::INVALID_FIELD, got);
        let got = self.cmd(
            a,
            fabrics::property_set_sqe(0, reg::CSTS, 1, PropSize::Four),
            &[],
        );
        self.status_row("Property Set CSTS (read-only)", Status::INVALID_FIELD, got);
    }

    fn io_rows(&mut self, q: &mut RawConn, g: Geometry) {
        let ns = self.nsid;
        let bs = g.bs;
        let k = |q: &RawConn, n: u32| q.keyed(0, n * bs);
        for (input, op) in [
            ("I/O opcode 0x7e (reserved)", 0x7eu8),
            ("I/O opcode 0xff (reserved)", 0xff),
            ("I/O Verify 0x0c (not supported)", io::VERIFY),
        ] {
            let mut s = Sqe::new(op, 0);
            s.nsid = ns.into();
            let got = self.cmd(q, s, &[]);
            self.status_row(input, Status::INVALID_OPCODE, got);
        }
        // Namespaces.
        for (input, nsid) in [
            ("Read NSID 0", 0u32),
            ("Read NSID 0xffffffff", u32::MAX),
            ("Read unknown NSID 2", 2),
        ] {
            let got = self.cmd(q, rw(io::READ, nsid, 0, 1, k(q, 1)), &[]);
            self.status_row(input, Status::INVALID_NS, got);
        }
        // LBA ranges.
        let cases = [
            (
                format!("Read SLBA {} = NSZE (past the end)", g.nsze),
                g.nsze,
                1u32,
            ),
            (
                "Read SLBA NSZE-1, 2 blocks (straddles the end)".to_string(),
                g.nsze - 1,
                2,
            ),
            (
                "Read SLBA 2^64-1, 2 blocks (u64 overflow)".to_string(),
                u64::MAX,
                2,
            ),
        ];
        for (input, slba, nlb) in cases {
            let got = self.cmd(q, rw(io::READ, ns, slba, nlb, k(q, nlb)), &[]);
            self.status_row(&input, Status::LBA_RANGE, got);
        }
        // SGL types the RDMA transport does not take.
        for (input, ty) in [
            ("Read with a Last Segment SGL (0x30)", kind::LAST_SEGMENT),
            ("Read with a Segment SGL (0x20)", kind::SEGMENT),
            (
                "Read with a Transport SGL, subtype 0xA (0x5a, NVMe/TCP's)",
                kind::TRANSPORT_DATA_BLOCK,
            ),
            (
                "Read with a Data Block SGL with an address (0x00)",
                kind::DATA_BLOCK,
            ),
        ] {
            let mut d = k(q, 1);
            d[8..12].copy_from_slice(&bs.to_le_bytes());
            d[15] = ty;
            let got = self.cmd(q, rw(io::READ, ns, 0, 1, d), &[]);
            self.status_row(input, Status::SGL_INVALID_TYPE, got);
        }
        let mut s = rw(io::READ, ns, 0, 1, k(q, 1));
        s.flags = 0; // PSDT 00b: PRPs
        let got = self.cmd(q, s, &[]);
        self.status_row("Read with PSDT 00b (PRP)", Status::INVALID_FIELD, got);
        // Lengths.
        // At LBA 0, so the range fits the namespace and only the length is wrong (refused
        // before any data moves: nothing is written).
        let over = g.max_xfer / bs + 1;
        let got = self.cmd(q, rw(io::WRITE, ns, 0, over, k(q, over)), &[]);
        self.status_row(
            &format!(
                "Write {} bytes by keyed SGL (MDTS {} bytes)",
                over * bs,
                g.max_xfer
            ),
            Status::INVALID_FIELD,
            got,
        );
        let got = self.cmd(q, rw(io::WRITE, ns, g.scratch, 2, k(q, 1)), &[]);
        self.status_row(
            "Write 2 blocks, keyed SGL length 1 block",
            Status::SGL_INVALID_DATA,
            got,
        );
        // In-capsule data.
        let block = vec![0xa5u8; bs as usize];
        let ic = |offset: u64, len: u32| Sgl::InCapsule { offset, len }.encode();
        let got = self.cmd(q, rw(io::WRITE, ns, g.scratch, 1, ic(4096, bs)), &block);
        self.status_row(
            "Write, in-capsule SGL offset 4096 (past the data)",
            Status::SGL_INVALID_OFFSET,
            got,
        );
        let got = self.cmd(q, rw(io::WRITE, ns, g.scratch, 2, ic(0, 2 * bs)), &block);
        self.status_row(
            "Write 2 blocks in-capsule, capsule carries 1 block",
            Status::SGL_INVALID_DATA,
            got,
        );
        let n = g.icd / bs + 1;
        let got = self.cmd(q, rw(io::WRITE, ns, g.scratch, n, ic(0, n * bs)), &block);
        self.status_row(
            &format!("Write {} bytes in-capsule (limit {} bytes)", n * bs, g.icd),
            Status::SGL_INVALID_OFFSET,
            got,
        );
        let got = self.cmd(q, rw(io::READ, ns, 0, 1, ic(0, bs)), &[]);
        self.status_row("Read with an in-capsule SGL", Status::INVALID_FIELD, got);
    }

    /// hrqsize + 1 capsules sent back to back on a queue whose target posted hsqsize + 1 RECVs.
    fn overflow_row(&mut self, cntlid: u16) {
        let depth = IO_DEPTH as u32;
        let input = format!(
            "{} Reads sent at once on a queue of hsqsize+1 = hrqsize = {depth}",
            depth + 1
        );
        let got = (|| -> R<(String, bool)> {
            let mut q = self.io(2, cntlid)?;
            for i in 0..=depth {
                let mut s = rw(io::READ, self.nsid, 0, 1, q.keyed(i as usize * 4096, 512));
                s.cid = (0x100 + i as u16).into();
                q.send(&s, &[]).map_err(|e| e.to_string())?;
            }
            let (mut ok, mut bad, mut closed) = (0u32, 0u32, None);
            while ok + bad <= depth && closed.is_none() {
                match q.next(self.t).map_err(|e| e.to_string())? {
                    Event::Cqe(c) if c.status().is_success() => ok += 1,
                    Event::Cqe(_) => bad += 1,
                    Event::Timeout => {
                        return Ok((format!("{ok} completed, then no answer (timeout)"), false))
                    }
                    e => closed = Some(ev_str(&e)),
                }
            }
            Ok(match closed {
                None => (
                    format!(
                        "all {} completed ({ok} success, {bad} error status)",
                        ok + bad
                    ),
                    true,
                ),
                Some(e) => (format!("{ok} completed, then {e}"), true),
            })
        })();
        self.row(
            &input,
            "no crash: every command completes (RNR retry) or the connection closes",
            got,
        );
    }

    /// A host that serves one RDMA READ at a time (responder_resources 1 in its CM request)
    /// with a queue's worth of Writes in flight: the target may have one READ of write data
    /// outstanding, the others wait their turn (until session 14 two waiters swapped places
    /// forever and hung the target's poller).
    fn small_ird_row(&mut self, cntlid: u16, g: Geometry) {
        let depth = IO_DEPTH as u32;
        let input = format!(
            "{depth} Writes of 4 KiB sent at once on a queue whose host serves 1 RDMA READ at a \
             time (responder_resources 1)"
        );
        let got = (|| -> R<(String, bool)> {
            let pd = cm_req(3, IO_DEPTH, IO_DEPTH - 1, cntlid);
            let mut q = match RawConn::connect_with_ird(self.dst, &pd, depth + 1, self.t, Some(1))
                .map_err(|e| e.to_string())?
            {
                Outcome::Connected(c, _) => c,
                Outcome::Rejected { detail, .. } => return Err(format!("rejected: {detail}")),
                Outcome::Other(t, s) => return Err(format!("CM connect: {t:?} (status {s})")),
            };
            match self.fabrics_connect(&mut q, 3, IO_DEPTH - 1, cntlid)? {
                Event::Cqe(c) if c.status().is_success() => {}
                e => return Err(format!("I/O queue 3 Connect: {}", ev_str(&e))),
            }
            let blocks = 4096 / g.bs.min(4096);
            for i in 0..depth {
                let off = 8192 + i as usize * 4096;
                let slba = g.scratch + u64::from(i * blocks);
                let mut s = rw(io::WRITE, self.nsid, slba, blocks, q.keyed(off, 4096));
                s.cid = (0x200 + i as u16).into();
                q.send(&s, &[]).map_err(|e| e.to_string())?;
            }
            let mut ok = 0;
            while ok < depth {
                match q.next(self.t).map_err(|e| e.to_string())? {
                    Event::Cqe(c) if c.status().is_success() => ok += 1,
                    e => return Ok((format!("{ok} completed, then {}", ev_str(&e)), false)),
                }
            }
            Ok((format!("all {ok} completed with success"), true))
        })();
        self.row(&input, "every Write completes with success", got);
    }

    /// Keyed SGLs with an rkey the host never registered, on a controller of their own: the
    /// target's RDMA WRITE (read data) or READ (write data) fails at the host's responder.
    fn bogus_rkey_rows(&mut self) {
        for (input, op) in [
            (
                "Read, keyed SGL with a bogus rkey (target's RDMA WRITE fails)",
                io::READ,
            ),
            (
                "Write, keyed SGL with a bogus rkey (target's RDMA READ fails)",
                io::WRITE,
            ),
        ] {
            let got = (|| -> R<(String, bool)> {
                let (_a, mut q, g) = self.controller()?;
                let d = Sgl::Keyed {
                    addr: q.host_buf().addr(),
                    len: g.bs,
                    key: q.host_buf().rkey() ^ 0x5a5a_5a00,
                    invalidate: false,
                }
                .encode();
                let e = self.cmd(&mut q, rw(op, self.nsid, g.scratch, 1, d), &[])?;
                let pass = match &e {
                    Event::Cqe(c) => !c.status().is_success(),
                    Event::WcError(..) | Event::Cm(_) => true,
                    Event::Timeout => false,
                };
                Ok((ev_str(&e), pass))
            })();
            self.row(input, "error status or the connection closes", got);
        }
    }

    fn before_enable_rows(&mut self) {
        let got = (|| -> R<Event> {
            let (mut a, _) = self.admin()?;
            let sqe = IdentifyCmd {
                cns: 1,
                cntid: 0,
                cnssid: 0,
                csi: 0,
                nsid: 0,
            }
            .to_sqe(0, a.keyed(0, 4096));
            self.cmd(&mut a, sqe, &[])
        })();
        self.status_row("admin Identify before CC.EN", Status::CMD_SEQ_ERROR, got);
        let got = (|| -> R<(String, bool)> {
            let (_a, cntlid) = self.admin()?;
            let mut q =
                self.established(&cm_req(1, IO_DEPTH, IO_DEPTH - 1, cntlid), IO_DEPTH as u32)?;
            match self.fabrics_connect(&mut q, 1, IO_DEPTH - 1, cntlid)? {
                Event::Cqe(c) if c.status().is_success() => {}
                e => {
                    return Ok((
                        format!("I/O Connect refused: {}", ev_str(&e)),
                        !matches!(e, Event::Timeout),
                    ))
                }
            }
            let d = q.keyed(0, 512);
            let e = self.cmd(&mut q, rw(io::READ, self.nsid, 0, 1, d), &[])?;
            let pass =
                matches!(&e, Event::Cqe(c) if c.status().code() == Status::CMD_SEQ_ERROR.code());
            Ok((format!("I/O Connect ok, Read: {}", ev_str(&e)), pass))
        })();
        self.row(
            "Read on an I/O queue before CC.EN",
            &st(Status::CMD_SEQ_ERROR),
            got,
        );
    }

    /// The target still serves a new host: write a pattern and read it back.
    fn still_serving_row(&mut self) {
        let got = (|| -> R<(String, bool)> {
            let (_a, mut q, g) = self.controller()?;
            let pat: Vec<u8> = (0..g.bs).map(|i| (i * 7 + 3) as u8).collect();
            q.host_buf().write_at(0, &pat).map_err(|e| e.to_string())?;
            let d = q.keyed(0, g.bs);
            let slba = g.nsze - 1;
            match self.cmd(&mut q, rw(io::WRITE, self.nsid, slba, 1, d), &[])? {
                Event::Cqe(c) if c.status().is_success() => {}
                e => return Ok((format!("Write: {}", ev_str(&e)), false)),
            }
            q.host_buf()
                .fill(0, g.bs as usize, 0)
                .map_err(|e| e.to_string())?;
            let d = q.keyed(0, g.bs);
            match self.cmd(&mut q, rw(io::READ, self.nsid, slba, 1, d), &[])? {
                Event::Cqe(c) if c.status().is_success() => {}
                e => return Ok((format!("Read: {}", ev_str(&e)), false)),
            }
            let mut back = vec![0u8; g.bs as usize];
            q.host_buf()
                .read_at(0, &mut back)
                .map_err(|e| e.to_string())?;
            Ok(if back == pat {
                ("write + read back match".into(), true)
            } else {
                ("read back differs from what was written".into(), false)
            })
        })();
        self.row(
            "after all of the above: a new host writes and reads back one block",
            "success, data matches",
            got,
        );
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut b = Bench {
        dst: SocketAddr::new(args.traddr, args.trsvcid),
        subnqn: args.subnqn.clone(),
        nsid: args.nsid,
        t: Duration::from_secs(args.timeout),
        rows: Vec::new(),
        cid: 0,
    };
    let start = Instant::now();
    b.cm_rows();
    match b.controller() {
        Ok((mut a, mut q, g)) => {
            println!(
                "# controller {}: namespace {} has {} blocks of {} bytes, max transfer {} bytes, \
                 in-capsule data {} bytes",
                g.cntlid, b.nsid, g.nsze, g.bs, g.max_xfer, g.icd
            );
            b.connect_rows(g.cntlid);
            b.qid_mismatch_row(g.cntlid);
            b.admin_rows(&mut a);
            b.io_rows(&mut q, g);
            b.overflow_row(g.cntlid);
            b.small_ird_row(g.cntlid, g);
        }
        Err(e) => b.row(
            "bring up a controller (admin, CC.EN, I/O queue 1)",
            "success",
            Err(e),
        ),
    }
    b.before_enable_rows();
    b.bogus_rkey_rows();
    b.still_serving_row();
    let failed = b.rows.iter().filter(|r| !r.pass).count();
    println!();
    println!("| input | expected | got | verdict |");
    println!("|---|---|---|---|");
    for r in &b.rows {
        println!(
            "| {} | {} | {} | {} |",
            r.input,
            r.expected,
            r.got,
            if r.pass { "PASS" } else { "FAIL" }
        );
    }
    println!(
        "\n{} rows: {} passed, {} failed ({:.1} s)",
        b.rows.len(),
        b.rows.len() - failed,
        failed,
        start.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
