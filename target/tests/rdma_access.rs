//! NVMe/RDMA access control against the daemon in this process, with the raw rdma_cm/verbs
//! host of `common/rdma.rs` as honest host and as attacker (issue #8 item 5):
//! - no memory region the target holds grants a peer any access, except an iWARP RDMA READ
//!   sink while its READ is in flight (`REMOTE_WRITE`); a peer's RDMA WRITE into the pool with
//!   the pool's keys fails and changes nothing, the target grants no RDMA READ credits, and
//!   other hosts keep being served;
//! - on iWARP, a READ sink's key no longer works once its command has completed;
//! - a host NQN not in `hosts` is refused at the RDMA Connect with Connect Invalid Host, and
//!   the discovery log over RDMA lists only the subsystems the host may reach.
//!
//! Needs a real RDMA device, like rdma_raw.rs: run it in the test VM (`tests/vm/run.sh
//! rdma-wire-rxe rdma-wire-siw`) with `NVMF_TEST_RDMA_IP` set. Without RDMA every test prints
//! "skipped: no RDMA device" and passes, unless `NVMF_REQUIRE_RDMA=1` (the VM suite).
//!
//! The target's memory is read back through `/proc/self/mem` (the daemon runs in this
//! process), so "unchanged" is checked on the bytes themselves, not inferred.

#[path = "common/rdma.rs"]
mod rdma_common;

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nvme::fabrics::{self, PropSize};
use nvme::log::{lid, trtype, DiscoveryLogEntry, DiscoveryLogHeader, GetLogPageCmd};
use nvme::rdma::CmRequest;
use nvme::Status;
use nvmf_target::daemon::Daemon;
use nvmf_target::transport::rdma::{RegionInfo, RegionKind};
use rdma::{AccessFlags, CmEventType, RemoteBuf, SendWr, WcStatus, WorkCompletion};
use rdma_common::*;

const ALLOWED: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const STRANGER: &str = "nqn.2014-08.org.nvmexpress:uuid:99999999-8888-7777-6666-555555555555";
const OPEN_NQN: &str = "nqn.2026-11.io.nvmf-rs:rdma-open";
const REMOTE: AccessFlags = AccessFlags::REMOTE_READ.union(AccessFlags::REMOTE_WRITE);
/// wr_ids of the attacker's work requests.
const ATTACK_WRITE: u64 = 0xa77a_c000;
const ATTACK_READ: u64 = 0xa77a_c001;

/// A daemon with one RDMA poller (so every connection shares one protection domain and the
/// pool region is unique) listening on `ip:port`, with `subsystems` (YAML list items).
fn start(ip: IpAddr, port: u16, tag: &str, subsystems: &str) -> (Daemon, std::path::PathBuf) {
    start_with(ip, port, tag, subsystems, &srq_yaml())
}

/// [`start`] with `target_extra` (YAML lines) appended to the `target` section.
fn start_with(
    ip: IpAddr,
    port: u16,
    tag: &str,
    subsystems: &str,
    target_extra: &str,
) -> (Daemon, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("nvmf-rdma-access-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = format!(
        "listeners:\n  - {{ transport: rdma, address: {ip}, port: {port} }}\n\
         subsystems:\n{}\
         target:\n  threads: 1\n  in_capsule_data: {IN_CAPSULE}\n  max_queue_depth: 128\n\
         {target_extra}",
        subsystems.replace("DIR", &dir.display().to_string())
    );
    let cfg = config::Config::from_yaml_str(&yaml, "rdma_access test")
        .unwrap()
        .config;
    let daemon = Daemon::start(&cfg).expect("daemon with an RDMA listener starts");
    (daemon, dir)
}

fn open_subsystem() -> String {
    format!(
        "  - nqn: {NQN}\n    allow_any_host: true\n    namespaces:\n      \
         - {{ nsid: 1, path: DIR/ns1.img, size: 16MiB, block_size: 4096 }}\n"
    )
}

const ADMIN: CmRequest = CmRequest {
    qid: 0,
    hrqsize: 32,
    hsqsize: 31,
    cntlid: 0,
};

/// An honest host: an enabled admin queue and a connected I/O queue.
fn honest_host(addr: SocketAddr) -> (Box<Host>, Box<Host>) {
    let mut a = connect(addr, ADMIN);
    let cntlid = a.nvme_connect(0, 31, fabrics::CNTLID_DYNAMIC);
    a.enable();
    let mut q = connect(
        addr,
        CmRequest {
            qid: 1,
            cntlid,
            ..ADMIN
        },
    );
    q.nvme_connect(1, 31, cntlid);
    (a, q)
}

/// Writes `data` at `lba` (the target RDMA READs it from host memory), reads it back (the
/// target RDMA WRITEs it) and compares.
fn write_read(q: &mut Host, lba: u64, data: &[u8]) {
    let blocks = (data.len() / 4096) as u32;
    q.data_mr.write_at(0, data).unwrap();
    let cid = q.cid();
    q.ok(
        &io_sqe(
            nvme::opcode::io::WRITE,
            cid,
            lba,
            blocks,
            q.keyed(0, data.len()),
        ),
        &[],
    );
    q.data_mr.fill(0, data.len(), 0).unwrap();
    let cid = q.cid();
    q.ok(
        &io_sqe(
            nvme::opcode::io::READ,
            cid,
            lba,
            blocks,
            q.keyed(0, data.len()),
        ),
        &[],
    );
    let mut got = vec![0u8; data.len()];
    q.data_mr.read_at(0, &mut got).unwrap();
    assert!(got == data, "data read back differs");
}

/// Bytes of this process's memory (the daemon's), read through /proc/self/mem.
fn target_bytes(addr: u64, len: usize) -> Vec<u8> {
    let f = std::fs::File::open("/proc/self/mem").expect("open /proc/self/mem");
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, addr)
        .unwrap_or_else(|e| panic!("reading {len} bytes of target memory at {addr:#x}: {e}"));
    b
}

/// The regions the poller published, once they include `conns` connections' regions (a
/// response region each, and a RECV region each unless the poller has a shared receive queue).
fn regions_with(d: &Daemon, conns: usize) -> Vec<RegionInfo> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let st = d.poller_stats();
        let regions: Vec<RegionInfo> = st.iter().flat_map(|s| s.verbs.regions()).collect();
        let count = |k: RegionKind| regions.iter().filter(|r| r.kind == k).count();
        let recvs = if count(RegionKind::SrqRecv) > 0 {
            0
        } else {
            conns
        };
        if count(RegionKind::Response) == conns && count(RegionKind::Recv) == recvs {
            return regions;
        }
        assert!(
            Instant::now() < deadline,
            "the poller never published the regions of {conns} connections: {regions:#x?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pool_region(regions: &[RegionInfo]) -> RegionInfo {
    let pools: Vec<_> = regions
        .iter()
        .filter(|r| r.kind == RegionKind::Pool)
        .collect();
    assert_eq!(pools.len(), 1, "one poller on one device: {regions:#x?}");
    *pools[0]
}

/// Waits for the completion of the attacker's work request `wr_id`, up to `limit`.
fn wait_wc(h: &Host, wr_id: u64, limit: Duration) -> Option<WorkCompletion> {
    let deadline = Instant::now() + limit;
    let mut wc = [WorkCompletion::default()];
    while Instant::now() < deadline {
        if h.cq.poll(&mut wc).unwrap() == 1 && wc[0].wr_id() == wr_id {
            let [w] = wc;
            return Some(w);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// Whether the target ends the connection within `limit` (a CM event other than ESTABLISHED).
fn connection_ended(h: &Host, limit: Duration) -> Option<CmEventType> {
    let ev = h.ch.get_event(Some(limit)).unwrap()?;
    Some(ev.event_type())
}

/// An RDMA WRITE from the attacker `h` into target memory at `remote`: it must fail. Over
/// InfiniBand/RoCE the responder NAKs it and the attacker's completion is a remote access
/// error. Over iWARP an RDMA WRITE is not acknowledged, so the attacker's completion may be a
/// success (the bytes left the wire); the target's RNIC then finds the key invalid (or not
/// writable), terminates the connection (RDMAP/DDP TERMINATE), and nothing is placed; the
/// callers compare target memory. Returns how the write was refused.
fn write_refused(h: &Host, remote: RemoteBuf, iwarp: bool, what: &str) -> String {
    let len = remote.len as usize;
    h.data_mr
        .write_at(0, &pattern(0xa5, len))
        .expect("attack pattern fits the host buffer");
    let sge = h.data_mr.sge(0, len).unwrap();
    let wr = SendWr::write(ATTACK_WRITE, std::slice::from_ref(&sge), remote).signaled();
    if let Err(e) = h.qp.post_send(&[wr]) {
        panic!("{what}: posting the RDMA WRITE failed locally ({e}), nothing was tried");
    }
    let wc = wait_wc(h, ATTACK_WRITE, TIMEOUT)
        .unwrap_or_else(|| panic!("{what}: no completion for the RDMA WRITE"));
    if !iwarp {
        assert_eq!(
            wc.status(),
            WcStatus::RemAccessErr,
            "{what}: RDMA WRITE into target memory, key {:#x}: {wc:?}",
            remote.rkey
        );
        return format!("{}", wc.status());
    }
    if !wc.is_ok() {
        return format!("{}", wc.status());
    }
    // The WRITE is the attacker's first message: siw may have left it unread in the target's
    // socket (the accept race `Host::exec` works around), so a connection still up after
    // NUDGE_AFTER gets a zero-length WRITE behind it, which makes siw read both.
    let ended = connection_ended(h, NUDGE_AFTER).or_else(|| {
        h.nudge(&format!("{what}: connection still up"));
        connection_ended(h, Duration::from_secs(10))
    });
    match ended {
        Some(ev @ (CmEventType::Disconnected | CmEventType::ConnectError)) => {
            format!("unacknowledged WRITE, then the target terminated the connection ({ev})")
        }
        // Rarely (2 in 105 runs of the test VM under heavy host load, none idle) siw does not
        // terminate the connection in that time, nudge or not; why is open. The WRITE is
        // one-sided: the kernel's siw alone judges it, and what the target controls is checked
        // by the callers (target memory unchanged, no region granting remote access).
        None => {
            "unacknowledged WRITE, no TERMINATE within 11 s (target memory is compared next)".into()
        }
        Some(other) => panic!(
            "{what}: after an RDMA WRITE with key {:#x} at {:#x}, CM event {other:?}",
            remote.rkey, remote.addr
        ),
    }
}

/// The attacker: a CM connection to the target's queue (no NVMe Connect: RDMA WRITE/READ
/// need none), asking for RDMA READ credits.
fn attacker(addr: SocketAddr) -> Box<Host> {
    match open_with(addr, &ADMIN.encode(), 16, 16) {
        Outcome::Connected(h) => h,
        Outcome::Rejected { status, data } => {
            panic!("attacker connection rejected: status {status}, data {data:?}")
        }
    }
}

fn end(h: Box<Host>) {
    let _ = h.id.disconnect();
    drop(h);
}

/// No region the target holds grants a peer access (pool, RECV and response buffers); a peer
/// WRITE into the pool with its keys fails, changes nothing, and the target keeps serving; no
/// RDMA READ credits are granted, and a READ attempt returns no target memory.
#[test]
fn target_memory_is_not_remotely_accessible() {
    let Some(ip) = rdma_ip_or_skip() else { return };
    let (daemon, dir) = start(ip, 4440, "mem", &open_subsystem());
    let addr = SocketAddr::new(ip, 4440);
    let iwarp = device_is_iwarp(addr);

    // The honest host moves data both ways: the pool is in use.
    let (mut a, mut q) = honest_host(addr);
    let w = pattern(1, 32 * 1024);
    write_read(&mut q, 8, &w);
    // On InfiniBand/RoCE the host sees the target grant no RDMA READ credits.
    if !iwarp {
        assert_eq!(a.granted_reads, 0, "the target's accept grants RDMA READs");
    }

    // ---- access rights of every region the poller holds ----
    let regions = regions_with(&daemon, 2);
    for r in &regions {
        match r.kind {
            // iWARP: a sink whose READ happened to be in flight at the snapshot.
            RegionKind::ReadSink if iwarp => assert_eq!(
                r.access,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                "{r:#x?}"
            ),
            _ => assert!(
                !r.access.intersects(REMOTE),
                "target region with remote access: {r:#x?}"
            ),
        }
    }
    if !iwarp {
        assert!(
            regions.iter().all(|r| r.kind != RegionKind::ReadSink),
            "per-I/O READ sinks on RoCE: {regions:#x?}"
        );
    }
    let pool = pool_region(&regions);
    eprintln!("pool region: {pool:#x?} (iwarp: {iwarp})");

    // ---- a peer RDMA WRITE into the pool, with the pool's rkey, then with its lkey ----
    let span = DATA.min(pool.len);
    let before = target_bytes(pool.addr, span);
    let mut keys = vec![("rkey", pool.rkey)];
    if pool.lkey != pool.rkey {
        keys.push(("lkey", pool.lkey));
    }
    for (name, key) in keys {
        let x = attacker(addr);
        let how = write_refused(
            &x,
            RemoteBuf {
                addr: pool.addr,
                len: span as u64,
                rkey: key,
            },
            iwarp,
            &format!("pool {name}"),
        );
        eprintln!("RDMA WRITE into the pool with its {name} {key:#x}: refused ({how})");
        end(x);
        assert!(
            target_bytes(pool.addr, span) == before,
            "an RDMA WRITE with the pool's {name} changed target memory"
        );
    }

    // ---- an RDMA READ of the pool: the target grants no READ credits (IRD 0) ----
    let x = attacker(addr);
    x.data_mr.fill(0, span, 0).unwrap();
    let sge = x.data_mr.sge(0, span).unwrap();
    let remote = RemoteBuf {
        addr: pool.addr,
        len: span as u64,
        rkey: pool.rkey,
    };
    let wr = SendWr::read(ATTACK_READ, std::slice::from_ref(&sge), remote).signaled();
    let served = match x.qp.post_send(&[wr]) {
        Err(e) => {
            eprintln!("RDMA READ of the pool: refused at post ({e})");
            false
        }
        Ok(()) => match wait_wc(&x, ATTACK_READ, Duration::from_secs(3)) {
            Some(wc) if wc.is_ok() => true,
            Some(wc) => {
                eprintln!("RDMA READ of the pool: refused ({})", wc.status());
                false
            }
            None => {
                eprintln!("RDMA READ of the pool: never issued (no READ credits: ORD 0)");
                false
            }
        },
    };
    let mut got = vec![0u8; span];
    x.data_mr.read_at(0, &mut got).unwrap();
    if iwarp && served {
        // A defect of siw, not of the target: siw sends a READ response from any region of
        // the QP's protection domain without checking REMOTE_READ (siw_qp_tx.c checks the
        // source with no access rights), and before its IRD check (kernels newer than the
        // test VM's 6.1 terminate a READ request when the accept granted IRD 0) it serves
        // READs the accept never granted. The target does its part: no REMOTE_READ anywhere
        // (checked above) and IRD 0. See the report in issue #8.
        let same = got == target_bytes(pool.addr, span);
        eprintln!(
            "KNOWN DEVICE DEFECT: siw served an RDMA READ of {span} bytes of target memory \
             (no REMOTE_READ, IRD 0); the bytes equal the target's: {same}"
        );
    } else {
        assert!(!served, "an RDMA READ of target memory succeeded");
        assert!(
            got.iter().all(|&b| b == 0),
            "target memory reached the attacker's buffer"
        );
    }
    end(x);

    // ---- the honest host is still served ----
    write_read(&mut q, 64, &pattern(3, 16 * 1024));
    let cid = a.cid();
    a.ok(&fabrics::property_get_sqe(cid, 0x1c, PropSize::Four), &[]);
    for h in [q, a] {
        h.id.disconnect().unwrap();
        h.wait_event(CmEventType::Disconnected);
    }
    wait_released(&daemon);
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// iWARP: each RDMA READ sink is its own region with `REMOTE_WRITE`, deregistered when the
/// READ completes; a peer RDMA WRITE with the stale key fails and changes nothing. On
/// InfiniBand/RoCE: no per-I/O region is ever registered.
#[test]
fn iwarp_read_sink_key_is_valid_only_while_in_flight() {
    let Some(ip) = rdma_ip_or_skip() else { return };
    let (daemon, dir) = start(ip, 4441, "sink", &open_subsystem());
    let addr = SocketAddr::new(ip, 4441);
    let iwarp = device_is_iwarp(addr);
    let stats = daemon.poller_stats();
    assert_eq!(stats.len(), 1);
    let st = &stats[0];

    let (mut a, mut q) = honest_host(addr);
    if iwarp {
        // The Connects' data (admin and I/O queue) came by RDMA READ too (1 KiB sinks, published
        // by the poller every 50 ms and when connections come and go): take those first, until
        // none has come for 200 ms, so neither is taken for the write's below.
        let deadline = Instant::now() + TIMEOUT;
        while st.verbs.take_last_read_sink().is_none() {
            assert!(
                Instant::now() < deadline,
                "the admin Connect's RDMA READ sink was never published"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < Duration::from_millis(200) {
            if st.verbs.take_last_read_sink().is_some() {
                quiet_since = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The write's data moves by the target's RDMA READ into a pool buffer.
    let w = pattern(7, 32 * 1024);
    write_read(&mut q, 16, &w);
    // Published every 50 ms.
    let deadline = Instant::now() + TIMEOUT;
    let sink = loop {
        let s = st.verbs.take_last_read_sink();
        if s.is_some() || !iwarp || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !iwarp {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(sink, None, "RoCE registered a per-I/O READ sink");
        assert_eq!(st.verbs.io_mrs_total.load(Ordering::Relaxed), 0);
        eprintln!("RoCE: READ sinks use the pool region (LOCAL_WRITE): no per-I/O key exists");
    } else {
        let sink = sink.expect("the write registered an RDMA READ sink");
        eprintln!("READ sink: {sink:#x?}");
        assert_eq!(sink.kind, RegionKind::ReadSink);
        assert_eq!(
            sink.access,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            "a READ sink on iWARP: exactly the rights the READ needs"
        );
        assert_eq!(sink.len, w.len(), "the sink covers this I/O only");
        let pool = pool_region(&regions_with(&daemon, 2));
        assert!(
            sink.addr >= pool.addr && sink.addr + sink.len as u64 <= pool.addr + pool.len as u64,
            "sink inside the pool"
        );
        // Completed: deregistered (pool region + RECV and response regions of 2 queues; with
        // a shared receive queue its area instead of the queues' RECV regions).
        let srq = st
            .verbs
            .regions()
            .iter()
            .any(|r| r.kind == RegionKind::SrqRecv);
        let idle_mrs = if srq { 2 + 2 } else { 1 + 2 * 2 };
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let mrs = st.verbs.mrs_registered.load(Ordering::Relaxed);
            let sinks = st
                .verbs
                .regions()
                .iter()
                .filter(|r| r.kind == RegionKind::ReadSink)
                .count();
            if mrs == idle_mrs && sinks == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "READ sink still registered after its command completed: {mrs} regions, \
                 {sinks} sinks"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(st.verbs.io_mrs_total.load(Ordering::Relaxed) >= 1);

        // The stale key, from another connection on the same protection domain.
        let before = target_bytes(sink.addr, sink.len);
        let x = attacker(addr);
        let how = write_refused(
            &x,
            RemoteBuf {
                addr: sink.addr,
                len: sink.len as u64,
                rkey: sink.rkey,
            },
            true,
            "stale READ-sink key",
        );
        eprintln!(
            "RDMA WRITE with the stale sink key {:#x}: refused ({how})",
            sink.rkey
        );
        end(x);
        assert!(
            target_bytes(sink.addr, sink.len) == before,
            "an RDMA WRITE with a stale READ-sink key changed target memory"
        );
    }

    // The honest host is still served.
    write_read(&mut q, 128, &pattern(9, 8192));
    let cid = a.cid();
    a.ok(&fabrics::property_get_sqe(cid, 0x1c, PropSize::Four), &[]);
    for h in [q, a] {
        h.id.disconnect().unwrap();
        h.wait_event(CmEventType::Disconnected);
    }
    wait_released(&daemon);
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The subsystem NQNs (other than discovery) in the RDMA discovery log `hostnqn` gets.
fn discovered(addr: SocketAddr, hostnqn: &str) -> Vec<String> {
    let mut d = connect(addr, ADMIN);
    d.subnqn = nvme::DISCOVERY_NQN.into();
    d.hostnqn = hostnqn.into();
    d.nvme_connect(0, 31, fabrics::CNTLID_DYNAMIC);
    d.enable();
    let len = 4096usize;
    d.data_mr.fill(0, len, 0).unwrap();
    let cid = d.cid();
    let sqe = GetLogPageCmd::new(lid::DISCOVERY, 0, len as u32, 0, false)
        .to_sqe(cid, d.keyed(0, len).encode());
    d.ok(&sqe, &[]);
    let mut buf = vec![0u8; len];
    d.data_mr.read_at(0, &mut buf).unwrap();
    let hdr = DiscoveryLogHeader::decode(&buf).unwrap();
    let n = hdr.numrec.get() as usize;
    assert!(n <= 3, "{n} records do not fit the 4 KiB read");
    let mut subs = Vec::new();
    for i in 0..n {
        let e = DiscoveryLogEntry::decode(&buf[1024 * (i + 1)..]).unwrap();
        let nqn = String::from_utf8_lossy(&e.subnqn)
            .trim_end_matches('\0')
            .to_string();
        assert_eq!(e.trtype, trtype::RDMA, "{e:?}");
        let traddr = String::from_utf8_lossy(&e.traddr).trim_end().to_string();
        assert_eq!(
            traddr.trim_end_matches('\0'),
            addr.ip().to_string(),
            "{e:?}"
        );
        if nqn != nvme::DISCOVERY_NQN {
            subs.push(nqn);
        }
    }
    subs.sort();
    d.id.disconnect().unwrap();
    d.wait_event(CmEventType::Disconnected);
    subs
}

/// A host NQN not in `hosts` is refused at the RDMA Connect (Connect Invalid Host, SCT 1 SC
/// 84h, DNR, the host NQN named as the invalid field); the allowed host connects; the RDMA
/// discovery log shows each host only the subsystems it may reach.
#[test]
fn host_nqn_refused_and_discovery_filtered_over_rdma() {
    let Some(ip) = rdma_ip_or_skip() else { return };
    let subsystems = format!(
        "  - nqn: {NQN}\n    allow_any_host: false\n    hosts: [ \"{ALLOWED}\" ]\n    \
         namespaces:\n      - {{ nsid: 1, path: DIR/ns1.img, size: 16MiB }}\n\
         \x20 - nqn: {OPEN_NQN}\n    allow_any_host: true\n    namespaces:\n      \
         - {{ nsid: 1, null: 16MiB }}\n"
    );
    let (daemon, dir) = start(ip, 4442, "acl", &subsystems);
    let addr = SocketAddr::new(ip, 4442);

    let mut s = connect(addr, ADMIN);
    s.hostnqn = STRANGER.into();
    let c = s.try_nvme_connect(0, 31, fabrics::CNTLID_DYNAMIC);
    let st = c.status();
    assert_eq!(
        (st.sct(), st.sc()),
        (1, 0x84),
        "Connect Invalid Host: {st:?}"
    );
    assert_eq!(st, Status::CONNECT_INVALID_HOST.dnr());
    assert_eq!(
        fabrics::ConnectResult::decode(c.result.get(), true),
        fabrics::ConnectResult::InvalidParam {
            attr: fabrics::InvalidAttr::Data,
            offset: fabrics::connect_data_off::HOSTNQN,
        },
        "IATTR/IPO name the host NQN in the Connect data"
    );
    s.id.disconnect().unwrap();
    s.wait_event(CmEventType::Disconnected);

    let mut ok = connect(addr, ADMIN);
    ok.hostnqn = ALLOWED.into();
    ok.nvme_connect(0, 31, fabrics::CNTLID_DYNAMIC);
    ok.enable();
    ok.id.disconnect().unwrap();
    ok.wait_event(CmEventType::Disconnected);

    assert_eq!(discovered(addr, STRANGER), vec![OPEN_NQN.to_string()]);
    let mut both = vec![OPEN_NQN.to_string(), NQN.to_string()];
    both.sort();
    assert_eq!(discovered(addr, ALLOWED), both);

    wait_released(&daemon);
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Registered receive memory of the connections in `regions`: the connections' own RECV
/// regions plus the shared receive areas.
fn recv_bytes(regions: &[RegionInfo]) -> usize {
    regions
        .iter()
        .filter(|r| matches!(r.kind, RegionKind::Recv | RegionKind::SrqRecv))
        .map(|r| r.len)
        .sum()
}

/// `target.rdma_srq_depth`: one shared receive queue per poller and device serves every queue
/// pair (two hosts, admin and I/O queues each): its area is the only receive region, grants no
/// remote access, is refilled as capsules are consumed (far more capsules, in-capsule data
/// included, than it has RECVs), and every RECV is posted again once the hosts are gone (a
/// buffer lost in teardown would show here). Prints the registered receive memory per
/// connection with and without it.
#[test]
fn shared_receive_queue_serves_all_queues_and_refills() {
    const DEPTH: usize = 32;
    let Some(ip) = rdma_ip_or_skip() else { return };

    // Without a shared receive queue, for the memory comparison.
    let (daemon, dir) = start_with(ip, 4443, "no-srq", &open_subsystem(), "");
    let addr = SocketAddr::new(ip, 4443);
    let hosts = [honest_host(addr), honest_host(addr)];
    let own = recv_bytes(&regions_with(&daemon, 4));
    for (a, q) in hosts {
        end(q);
        end(a);
    }
    wait_released(&daemon);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);

    let (daemon, dir) = start_with(
        ip,
        4444,
        "srq",
        &open_subsystem(),
        &format!("  rdma_srq_depth: {DEPTH}\n"),
    );
    let addr = SocketAddr::new(ip, 4444);
    let st = daemon.poller_stats();
    let posted = || {
        sum(&st, |s| {
            s.verbs.srq_recvs_posted.load(Ordering::Relaxed) as u64
        })
    };
    let mut hosts = [honest_host(addr), honest_host(addr)];
    let regions = regions_with(&daemon, 4);
    let shared: Vec<_> = regions
        .iter()
        .filter(|r| r.kind == RegionKind::SrqRecv)
        .collect();
    assert_eq!(shared.len(), 1, "one shared receive area: {regions:#x?}");
    let stride = (64 + IN_CAPSULE).next_multiple_of(64);
    assert_eq!(
        shared[0].len,
        DEPTH * stride,
        "{DEPTH} RECVs of {stride} bytes"
    );
    assert!(
        !shared[0].access.intersects(REMOTE),
        "shared receive area with remote access: {:#x?}",
        shared[0]
    );
    assert!(
        regions.iter().all(|r| r.kind != RegionKind::Recv),
        "per-connection RECV regions next to the shared receive queue: {regions:#x?}"
    );
    let srq_total = recv_bytes(&regions);
    eprintln!(
        "registered receive memory, 2 hosts x (admin + 1 I/O queue of 32): per-QP receive \
         queues {own} bytes ({} per connection), shared receive queue of {DEPTH}: {srq_total} \
         bytes ({} per connection, 0 of its own)",
        own / 4,
        srq_total / 4
    );
    assert!(
        srq_total < own,
        "the shared receive queue does not save memory"
    );

    // 3 x DEPTH capsules per I/O queue, alternating between the hosts, a third of them with
    // in-capsule data: the SRQ must be refilled as they are consumed, or a host stalls (RNR).
    for i in 0..3 * DEPTH {
        for (h, (_, q)) in hosts.iter_mut().enumerate() {
            let lba = (h * 512 + i % 64) as u64;
            let data = pattern((i + h) as u8, 4096);
            if i % 3 == 0 {
                let cid = q.cid();
                let sgl = nvme::sgl::Sgl::InCapsule {
                    offset: 0,
                    len: 4096,
                };
                q.ok(&io_sqe(nvme::opcode::io::WRITE, cid, lba, 1, sgl), &data);
                let cid = q.cid();
                q.ok(
                    &io_sqe(nvme::opcode::io::READ, cid, lba, 1, q.keyed(0, 4096)),
                    &[],
                );
                let mut got = vec![0u8; 4096];
                q.data_mr.read_at(0, &mut got).unwrap();
                assert!(
                    got == data,
                    "in-capsule write read back differs (capsule {i})"
                );
            } else {
                write_read(q, lba, &data);
            }
        }
    }
    // Every RECV is posted again (the poller publishes every 50 ms).
    let deadline = Instant::now() + TIMEOUT;
    while posted() != DEPTH as u64 {
        assert!(
            Instant::now() < deadline,
            "{} of {DEPTH} shared RECVs posted after the I/O",
            posted()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Teardown: every RECV back, both hosts' regions gone, only pool + shared area left.
    let t0 = Instant::now();
    for (a, q) in hosts {
        end(q);
        end(a);
    }
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let conns = sum(&st, |s| s.rdma.connections.load(Ordering::Relaxed) as u64);
        let mrs = sum(&st, |s| {
            s.verbs.mrs_registered.load(Ordering::Relaxed) as u64
        });
        if conns == 0 && mrs == 2 && posted() == DEPTH as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not released: {conns} connections, {mrs} regions, {} of {DEPTH} shared RECVs posted",
            posted()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "4 queues on the shared receive queue released in {:?}",
        t0.elapsed()
    );
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
