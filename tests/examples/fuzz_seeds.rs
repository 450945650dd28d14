//! Seed corpora for the fuzz targets (`fuzz/`), recorded from real traffic: the project's
//! initiator connects through a recording proxy to the real `nvmf-target` binary on loopback
//! (admin bring-up, I/O queue, in-capsule and R2T writes, reads, flush, write zeroes, trim,
//! discovery; once without and once with header and data digests), plus the Linux host's
//! ICReq and admin Connect capsule as `/work/shared/notes/linux-host-interop.md` describes them.
//!
//! ```sh
//! cargo build -p nvmf-target && cargo run -p nvmf-tests --example fuzz_seeds -- fuzz/seeds
//! ```
//!
//! The target runs with the limits the fuzz targets use (`nvmf_fuzz::fuzz_caps`: 8 KiB
//! in-capsule data, 32 KiB transfers, queue depth 32) and the subsystem, host NQN and host ID
//! of `nvmf_fuzz`, so recorded streams replay against the fuzzed connection as they ran.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use initiator::{ConnectOptions, Controller};
use nvme::fabrics::{ConnectCmd, ConnectData, CNTLID_DYNAMIC};
use nvme::sgl::Sgl;
use nvme::tcp::{Fed, IcReq, Pdu, PduCollector, RxConfig, TxConfig};
use nvme::{Cqe, Sqe};
use nvmf_tests::TargetProc;
use zerocopy::IntoBytes;

// Must match fuzz/src/lib.rs.
const SUBNQN: &str = "nqn.2026-11.io.nvmf-rs:fuzz";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f0220000-0000-4000-8000-00000000f022";
const HOSTID: [u8; 16] = [
    0xf0, 0x22, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0xf0, 0x22,
];

/// Bytes of one proxied TCP connection, each direction in order.
#[derive(Default, Clone)]
struct Recorded {
    h2c: Vec<u8>,
    c2h: Vec<u8>,
}

type Log = Arc<Mutex<Vec<Arc<Mutex<Recorded>>>>>;

/// A TCP proxy to `target` that records every connection.
fn start_proxy(target: SocketAddr) -> (SocketAddr, Log) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let log: Log = Default::default();
    let log2 = log.clone();
    std::thread::spawn(move || {
        for host in l.incoming() {
            let Ok(host) = host else { return };
            let tgt = TcpStream::connect(target).expect("proxy to target");
            host.set_nodelay(true).unwrap();
            tgt.set_nodelay(true).unwrap();
            let rec = Arc::new(Mutex::new(Recorded::default()));
            log2.lock().unwrap().push(rec.clone());
            pipe(
                host.try_clone().unwrap(),
                tgt.try_clone().unwrap(),
                rec.clone(),
                true,
            );
            pipe(tgt, host, rec, false);
        }
    });
    (addr, log)
}

fn pipe(mut from: TcpStream, mut to: TcpStream, rec: Arc<Mutex<Recorded>>, h2c: bool) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            {
                let mut r = rec.lock().unwrap();
                let v = if h2c { &mut r.h2c } else { &mut r.c2h };
                v.extend_from_slice(&buf[..n]);
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

fn session(addr: SocketAddr, digests: bool) {
    let mut o = ConnectOptions::tcp("127.0.0.1", addr.port(), SUBNQN);
    o.hostnqn = HOSTNQN.into();
    o.hostid = HOSTID;
    o.queues = 1;
    o.queue_depth = 16;
    o.hdr_digest = digests;
    o.data_digest = digests;
    o.timeout = Duration::from_secs(10);
    let mut ctrl = Controller::connect(o.clone()).expect("connect through the proxy");
    let mut ns = ctrl.open_namespace(1).expect("namespace 1");
    let small: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let large: Vec<u8> = (0..12288u32).map(|i| (i * 13 + 1) as u8).collect();
    ns.write_at(&small, 0).expect("in-capsule write");
    ns.write_at(&large, 65536)
        .expect("R2T write (above the 8 KiB in-capsule size)");
    let mut back = vec![0u8; small.len()];
    ns.read_at(&mut back, 0).expect("read");
    assert_eq!(back, small);
    let mut back = vec![0u8; large.len()];
    ns.read_at(&mut back, 65536).expect("read");
    assert_eq!(back, large);
    ns.flush().expect("flush");
    ns.write_zeroes(8192, 8192).expect("write zeroes");
    ns.trim(&[(1 << 20, 1 << 16)]).expect("trim");
    drop(ns);
    ctrl.shutdown().expect("shutdown");

    let mut d = o;
    d.kato = Duration::ZERO;
    let entries = initiator::discover_with(&d).expect("discovery");
    assert!(!entries.is_empty());
}

/// The Linux host's ICReq (HDGST and DDGST asked for, `nvme_tcp_init_connection`) and admin
/// Connect capsule (`nvmf_connect_cmd_prep`/`nvmf_connect_data_prep`: qid 0, sqsize 31, KATO
/// 5000 ms, cntlid FFFFh, the data in-capsule behind a Data Block Offset SGL).
fn linux_connect() -> (Vec<u8>, Sqe, [u8; 1024]) {
    let icreq = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: true,
        ddgst: true,
        maxr2t: 0,
    };
    let mut cmd = ConnectCmd::from_sqe(&Sqe::new(nvme::opcode::FABRICS, 0));
    cmd.fctype = nvme::opcode::fctype::CONNECT;
    cmd.qid = 0.into();
    cmd.sqsize = 31.into();
    cmd.kato = 5000.into();
    cmd.dptr = Sgl::InCapsule {
        offset: 0,
        len: 1024,
    }
    .encode();
    let sqe = cmd.to_sqe();
    let data = ConnectData::new(HOSTID, CNTLID_DYNAMIC, SUBNQN, HOSTNQN).encode();
    let tx = TxConfig {
        hdgst: true,
        ddgst: true,
        pda: 0,
    };
    let mut wire = icreq.encode().to_vec();
    wire.extend_from_slice(
        &Pdu::CapsuleCmd {
            sqe,
            data_len: 1024,
        }
        .encode(&tx, &data),
    );
    (wire, sqe, data)
}

struct Seeds {
    dir: PathBuf,
    n: HashMap<&'static str, usize>,
}

impl Seeds {
    fn put(&mut self, target: &'static str, name: &str, bytes: &[u8]) {
        let d = self.dir.join(target);
        std::fs::create_dir_all(&d).unwrap();
        let i = self.n.entry(target).or_default();
        *i += 1;
        std::fs::write(d.join(format!("{name}-{i:02}")), bytes).unwrap();
    }
}

fn with_prefix(prefix: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut v = prefix.to_vec();
    v.extend_from_slice(rest);
    v
}

/// Decode one direction of a recorded connection (digests as the IC exchange set them).
fn pdus(bytes: &[u8], cfg: RxConfig) -> Vec<(Pdu, Vec<u8>)> {
    let mut c = PduCollector::new(cfg);
    let mut out: Vec<(Pdu, Vec<u8>)> = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (n, fed) = c.deframer.feed(rest).expect("recorded stream decodes");
        rest = &rest[n..];
        match fed {
            Some(Fed::Header(p)) => {
                match p {
                    Pdu::IcReq(r) => c.deframer.set_digests(r.hdgst, r.ddgst),
                    Pdu::IcResp(r) => c.deframer.set_digests(r.hdgst, r.ddgst),
                    _ => {}
                }
                out.push((p, Vec::new()));
            }
            Some(Fed::Data { bytes, .. }) => out.last_mut().unwrap().1.extend_from_slice(bytes),
            _ => {}
        }
    }
    out
}

fn main() {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "fuzz/seeds".into()),
    );
    let t = TargetProc::start_with(|port, d: &Path| {
        format!(
            "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
             subsystems:\n  - nqn: {SUBNQN}\n    allow_any_host: true\n    namespaces:\n      \
             - {{ nsid: 1, path: {}/ns1.img, size: 16MiB }}\n\
             target: {{ threads: 1, in_capsule_data: 8KiB, max_io_size: 32KiB, \
             max_queue_depth: 32 }}\n",
            d.display()
        )
    });
    let (proxy, log) = start_proxy(t.addr);
    session(proxy, false);
    session(proxy, true);
    std::thread::sleep(Duration::from_millis(300));
    let conns: Vec<Recorded> = log
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.lock().unwrap().clone())
        .collect();

    let mut s = Seeds {
        dir: dir.clone(),
        n: HashMap::new(),
    };
    let ctrl_cfg = RxConfig {
        max_data_pdu: 32768,
        max_incapsule: 8192,
        ..RxConfig::controller()
    };
    for rec in &conns {
        let h2c = pdus(&rec.h2c, ctrl_cfg);
        let c2h = pdus(&rec.c2h, RxConfig::host());
        let digests = match h2c.first() {
            Some((Pdu::IcReq(r), _)) => (r.hdgst as u8) << 1 | (r.ddgst as u8) << 2,
            _ => 0,
        };
        let mut cqes: HashMap<u16, Cqe> = HashMap::new();
        let mut log_data: Vec<u8> = Vec::new();
        let mut io_queue = false;
        for (p, data) in &c2h {
            match p {
                Pdu::CapsuleResp(c) => {
                    cqes.insert(c.cid(), *c);
                }
                Pdu::C2HData(_) if data.len() >= 1024 => log_data = data.clone(),
                _ => {}
            }
        }
        for (p, data) in &h2c {
            let Pdu::CapsuleCmd { sqe, .. } = p else {
                continue;
            };
            let mut sc = sqe.as_bytes().to_vec();
            if let Some(c) = cqes.get(&sqe.cid()) {
                sc.extend_from_slice(c.as_bytes());
            }
            s.put("sqe_cqe", "rec", &sc);
            let mut sg = sqe.dptr.to_vec();
            sg.extend_from_slice(&[sqe.opcode, sqe.cdw12.get() as u8, (data.len() / 64) as u8]);
            s.put("sgl", "rec", &sg);
            if sqe.is_fabrics() && sqe.fctype() == nvme::opcode::fctype::CONNECT {
                let c = ConnectCmd::from_sqe(sqe);
                io_queue = c.qid.get() != 0;
                let mut v = vec![c.qid.get() as u8];
                v.extend_from_slice(&c.sqsize.get().to_le_bytes());
                v.push(c.cattr);
                v.extend_from_slice(&c.kato.get().to_le_bytes());
                v.extend_from_slice(data);
                s.put("connect_data", "rec", &v);
            }
            if sqe.opcode == nvme::opcode::admin::GET_LOG_PAGE
                && sqe.cdw10.get() as u8 == nvme::log::lid::DISCOVERY
                && !log_data.is_empty()
            {
                let mut v = Vec::new();
                for d in [sqe.cdw10, sqe.cdw11, sqe.cdw12, sqe.cdw13, sqe.cdw14] {
                    v.extend_from_slice(&d.get().to_le_bytes());
                }
                v.extend_from_slice(&log_data);
                s.put("discovery_log", "rec", &v);
            }
        }
        // Streams: the target side (controller role) and the host side of each connection.
        s.put("pdu_stream", "h2c", &with_prefix(&[digests, 0], &rec.h2c));
        s.put(
            "pdu_stream",
            "h2c-split",
            &with_prefix(&[digests, 0x6d], &rec.h2c),
        );
        let host_cfg = 1 | digests;
        s.put(
            "pdu_stream",
            "c2h",
            &with_prefix(&[host_cfg, 0x13], &rec.c2h),
        );
        // For the connection: I/O-queue streams need the pre-made controller (cfg bit 3).
        let conn_cfg = if io_queue { 0x08 } else { 0 };
        s.put("tcp_conn", "h2c", &with_prefix(&[conn_cfg, 0], &rec.h2c));
        s.put(
            "tcp_conn",
            "h2c-split",
            &with_prefix(&[conn_cfg | 0x80, 0x2a], &rec.h2c),
        );
    }

    let (wire, sqe, data) = linux_connect();
    s.put(
        "pdu_stream",
        "linux-connect",
        &with_prefix(&[0x06, 0], &wire),
    );
    s.put("tcp_conn", "linux-connect", &with_prefix(&[0, 0x03], &wire));
    let mut v = vec![0u8, 31, 0, 0];
    v.extend_from_slice(&5000u32.to_le_bytes());
    v.extend_from_slice(&data);
    s.put("connect_data", "linux", &v);
    let mut sc = sqe.as_bytes().to_vec();
    sc.extend_from_slice(Cqe::new(0, nvme::Status::SUCCESS, 1).as_bytes());
    s.put("sqe_cqe", "linux-connect", &sc);

    for (name, yaml) in [
        ("systemd", include_str!("../../systemd/config.yaml")),
        (
            "seed-target",
            &nvmf_tests::default_yaml(4420, Path::new("/tmp"))[..],
        ),
    ] {
        s.put("config_yaml", name, yaml.as_bytes());
    }
    eprintln!(
        "recorded {} connections; seeds in {}: {:?}",
        conns.len(),
        dir.display(),
        s.n
    );
}
