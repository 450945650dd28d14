//! `nvmf-bench --suite`: the performance matrix of issue #6 in one run and one table.
//!
//! For 1 and 2 target threads (one nvmf-target each, started next to this binary with a
//! generated configuration and its own control socket), over NVMe/TCP on loopback (or, with
//! `--transport rdma`, over NVMe/RDMA on an address of an RDMA device):
//! 4k randread and randwrite at QD1 and QD32, 128k read and write at QD8, on a null namespace
//! and on a file on tmpfs (/dev/shm). With N target threads the bench runs N jobs (one I/O
//! queue each; the target hands connections to its pollers round robin). In the same run, for
//! each workload and job count, the limits of the path: a raw loopback TCP stream and
//! ping-pong of the same sizes ([`super::baseline`]) and the same I/O issued to the same file
//! by a local io_uring ([`super::local`]). Over RDMA the path's limits are raw verbs on the
//! same device ([`super::rdma_baseline`]): an RDMA WRITE (READ for writes) stream and a
//! SEND/RECV ping-pong of the same sizes.
//!
//! Ratio columns: `%stream` is the row's bandwidth over the raw stream's (goal 1: 128k read
//! at least 80%), `p50/pp` its median latency over the ping-pong's (goal 2: 4k QD1 read at
//! most 1.5x), `%uring` its IOPS over the local io_uring's (file rows). Goals 1 and 2 are
//! stated for TCP; over RDMA the same ratios are printed without a verdict.

use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::args::{Rw, TransportKind, DEFAULT_SUBNQN};
use super::baseline::{self, Baseline};
use super::demo::TargetProcess;
use super::engine::TargetSpec;
use super::job::{DirStats, Workload};
use super::local::{self, Local};
use super::rdma_baseline::{self, RdmaBaseline};
use super::report::{fmt_ns, latency, si};
use super::run::{self, Measured, Outcome};

/// The null namespace.
const NULL_SIZE: &str = "1GiB";
const NULL_NSID: u32 = 1;
const FILE_NSID: u32 = 2;
/// Target thread counts of the matrix.
const THREADS: [u16; 2] = [1, 2];

/// What `--suite` runs with.
#[derive(Debug, Clone)]
pub struct SuiteOpts {
    /// Per NVMe run; each baseline runs half as long.
    pub runtime: Duration,
    pub ramp: Duration,
    /// How the bench's queues wait (the raw baselines busy-poll when it is `Busy`).
    pub polling: initiator::Polling,
    pub io_timeout: Duration,
    /// Where the file goes (a tmpfs).
    pub file_dir: PathBuf,
    /// Bytes of the file namespace (written in full first so reads hit real pages).
    pub file_size: u64,
    /// NVMe/TCP on 127.0.0.1, or NVMe/RDMA on this address of an RDMA device.
    pub rdma: Option<IpAddr>,
    /// DH-HMAC-CHAP secrets for every connection (the suite's own target takes any host
    /// without authentication, so they are used only if it ever asks).
    pub dhchap: Option<initiator::DhchapOptions>,
}

impl SuiteOpts {
    fn transport(&self) -> TransportKind {
        if self.rdma.is_some() {
            TransportKind::Rdma
        } else {
            TransportKind::Tcp
        }
    }

    fn addr(&self) -> String {
        self.rdma
            .map_or_else(|| "127.0.0.1".into(), |ip| ip.to_string())
    }
}

/// The workloads (name, rw, bs, qd).
fn workloads(o: &SuiteOpts, jobs: u16) -> Vec<Workload> {
    [
        (Rw::Randread, 4096, 1),
        (Rw::Randread, 4096, 32),
        (Rw::Randwrite, 4096, 1),
        (Rw::Randwrite, 4096, 32),
        (Rw::Read, 128 << 10, 8),
        (Rw::Write, 128 << 10, 8),
    ]
    .into_iter()
    .map(|(rw, bs, qd)| {
        let w = Workload {
            name: String::new(),
            rw,
            rwmixread: 50,
            bs,
            iodepth: qd,
            numjobs: jobs,
            runtime: Some(o.runtime),
            ramp: o.ramp,
            size: None,
            offset: 0,
            offset_increment: 0,
            verify: false,
            rate_iops: None,
        };
        Workload {
            // Without the " xN": the threads column says it.
            name: Workload {
                numjobs: 1,
                ..w.clone()
            }
            .label(),
            ..w
        }
    })
    .collect()
}

fn config_yaml(o: &SuiteOpts, port: u16, threads: u16, file: &Path) -> String {
    let path = serde_json::to_string(&file.to_string_lossy()).expect("a string serializes");
    let (tr, addr, size) = (o.transport().name(), o.addr(), o.file_size);
    format!(
        "# Written by nvmf-bench --suite.\n\
         listeners:\n  - {{ transport: {tr}, address: {addr}, port: {port} }}\n\
         subsystems:\n  - nqn: {DEFAULT_SUBNQN}\n    allow_any_host: true\n    namespaces:\n      \
         - {{ nsid: {NULL_NSID}, null: {NULL_SIZE} }}\n      \
         - {{ nsid: {FILE_NSID}, path: {path}, size: {size} }}\n\
         target: {{ threads: {threads} }}\n"
    )
}

/// Write the whole file (so that it is made of real tmpfs pages, not holes).
fn fill_file(path: &Path, size: u64) -> io::Result<()> {
    let mut f = fs::File::create(path)?;
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..size.div_ceil(chunk.len() as u64) {
        f.write_all(&chunk)?;
    }
    f.sync_all()
}

/// The raw limits of the path, measured next to a cell.
enum Limits {
    Tcp(Baseline),
    Rdma(RdmaBaseline),
}

impl Limits {
    /// Bytes per second of the stream.
    fn stream_bw(&self) -> f64 {
        let (bytes, t) = match self {
            Limits::Tcp(b) => (b.stream.bytes, b.stream.elapsed),
            Limits::Rdma(b) => (b.stream.bytes, b.stream.elapsed),
        };
        bytes as f64 / t.as_secs_f64()
    }

    /// The ping-pong's replies and how long it ran.
    fn pingpong(&self) -> (&DirStats, Duration) {
        match self {
            Limits::Tcp(b) => (&b.pingpong.stats, b.pingpong.elapsed),
            Limits::Rdma(b) => (&b.pingpong.stats, b.pingpong.elapsed),
        }
    }

    fn stream_label(&self) -> String {
        match self {
            Limits::Tcp(_) => "raw-tcp stream".into(),
            Limits::Rdma(b) => format!("raw-rdma {} stream", b.stream.op),
        }
    }

    /// What the raw runs were, for the notes column.
    fn notes(&self) -> (String, String) {
        let pp = |c: usize, d: usize, rq: usize, rp: usize| {
            format!("{c} conn x {d} deep, {rq} B request / {rp} B reply")
        };
        match self {
            Limits::Tcp(b) => {
                let p = &b.pingpong;
                (
                    format!("{} conn", b.stream.connections),
                    pp(p.connections, p.depth, p.request_bytes, p.reply_bytes),
                )
            }
            Limits::Rdma(b) => {
                let (s, p) = (&b.stream, &b.pingpong);
                (
                    format!(
                        "{} conn x {} {} B RDMA {}s in flight",
                        s.connections,
                        rdma_baseline::STREAM_DEPTH,
                        s.chunk,
                        s.op.to_uppercase()
                    ),
                    pp(p.connections, p.depth, p.request_bytes, p.reply_bytes),
                )
            }
        }
    }

    fn pingpong_label(&self) -> &'static str {
        match self {
            Limits::Tcp(_) => "raw-tcp ping-pong",
            Limits::Rdma(_) => "raw-rdma send ping-pong",
        }
    }
}

/// One NVMe run of the matrix.
struct NvmeRow {
    backend: &'static str,
    outcome: Outcome,
}

/// Everything measured for one workload at one thread count.
struct Cell {
    threads: u16,
    workload: Workload,
    rows: Vec<NvmeRow>,
    baseline: Result<Limits, String>,
    local: Result<Local, String>,
}

fn say(s: &str) {
    let mut e = io::stderr().lock();
    let _ = e.write_all(s.as_bytes());
}

/// Run the matrix and print the table. Err: the suite could not run (no target, no file).
pub fn run(o: &SuiteOpts) -> Result<(String, bool), String> {
    let dir = o
        .file_dir
        .join(format!("nvmf-bench-suite-{}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let file = dir.join("ns.img");
    let r = run_in(o, &file);
    let _ = fs::remove_dir_all(&dir);
    r
}

fn run_in(o: &SuiteOpts, file: &Path) -> Result<(String, bool), String> {
    fill_file(file, o.file_size).map_err(|e| format!("{}: {e}", file.display()))?;
    let (kind, addr) = (o.transport(), o.addr());
    let each = (o.runtime / 2).max(Duration::from_millis(20));
    let mut cells = Vec::new();
    let mut ok = true;
    for threads in THREADS {
        let t =
            TargetProcess::start_with_config("suite", |port| config_yaml(o, port, threads, file))?;
        say(&format!(
            "nvmf-bench --suite: nvmf-target (pid {}) with {threads} thread(s) on {} {addr}:{}\n",
            t.pid(),
            kind.name(),
            t.port
        ));
        let spec = |nsid| TargetSpec {
            traddr: addr.clone(),
            rdma_traddr: o.rdma.map(|ip| ip.to_string()),
            trsvcid: t.port,
            subnqn: DEFAULT_SUBNQN.into(),
            hostnqn: None,
            dhchap: o.dhchap.clone(),
            tls: None,
            concat: false,
            nsid,
            hdr_digest: false,
            data_digest: false,
            polling: o.polling,
            poll_spin: None,
            io_timeout: o.io_timeout,
            stats_socket: Some(t.control.clone()),
        };
        for w in workloads(o, threads) {
            let mut rows = Vec::new();
            for (backend, nsid) in [("null", NULL_NSID), ("tmpfs file", FILE_NSID)] {
                say(&format!("  {} x{threads} {backend}\n", w.name));
                let outcome = run::run(kind, &spec(nsid), &w);
                match &outcome {
                    // A run that moved nothing is broken, however clean it looks.
                    Outcome::Ran(m) if m.ok() && m.total().ios == 0 => {
                        ok = false;
                        say(&format!(
                            "nvmf-bench --suite: {} {backend}: no I/O completed\n",
                            w.name
                        ));
                    }
                    Outcome::Ran(m) if m.ok() => {}
                    Outcome::Ran(m) => {
                        ok = false;
                        for e in &m.errors {
                            say(&format!("nvmf-bench --suite: {} {backend}: {e}\n", w.name));
                        }
                    }
                    Outcome::Failed(e) | Outcome::Skipped(e) => {
                        ok = false;
                        say(&format!("nvmf-bench --suite: {} {backend}: {e}\n", w.name));
                    }
                }
                rows.push(NvmeRow { backend, outcome });
            }
            let reads = w.rw.read_percent(w.rwmixread) >= 50;
            let (bs, qd, jobs) = (w.bs as usize, w.iodepth as usize, threads as usize);
            let busy = o.polling == initiator::Polling::Busy;
            let baseline = match o.rdma {
                None => baseline::run(bs, qd, jobs, reads, busy, each, None)
                    .map(Limits::Tcp)
                    .map_err(|e| format!("raw TCP baseline: {e}")),
                Some(ip) => rdma_baseline::run(ip, bs, qd, jobs, reads, busy, each)
                    .map(Limits::Rdma)
                    .map_err(|e| format!("raw RDMA baseline: {e}")),
            };
            let local = local::run(file, bs, qd, jobs, !reads, w.rw.is_random(), each)
                .map_err(|e| format!("local io_uring: {e}"));
            let baseline = baseline.and_then(|b| {
                if b.stream_bw() > 0.0 && b.pingpong().0.ios > 0 {
                    Ok(b)
                } else {
                    Err(format!("{} moved nothing", b.pingpong_label()))
                }
            });
            for e in [baseline.as_ref().err(), local.as_ref().err()]
                .into_iter()
                .flatten()
            {
                ok = false;
                say(&format!("nvmf-bench --suite: {}: {e}\n", w.name));
            }
            cells.push(Cell {
                threads,
                workload: w,
                rows,
                baseline,
                local,
            });
        }
        if let Err(e) = t.stop() {
            ok = false;
            say(&format!("nvmf-bench --suite: {e}\n"));
        }
    }
    Ok((table(&cells, o), ok))
}

fn ratio_pct(a: f64, b: f64) -> String {
    let pct = 100.0 * a / b;
    if a > 0.0 && b > 0.0 {
        // Small ratios (4k QD1 bandwidth against a stream) keep their first digits.
        match pct {
            p if p >= 10.0 => format!("{p:.0}%"),
            p if p >= 0.1 => format!("{p:.1}%"),
            p => format!("{p:.3}%"),
        }
    } else {
        String::new()
    }
}

/// Bytes per second as MiB/s; small values (4k QD1 on a loaded machine) keep their first digits.
fn mib(bw: f64) -> String {
    match bw / MIB {
        m if m >= 0.1 => format!("{m:.1}"),
        m => format!("{m:.3}"),
    }
}

fn ratio_x(a: f64, b: f64) -> String {
    if a > 0.0 && b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        String::new()
    }
}

fn p50(h: &DirStats) -> f64 {
    latency(&h.hist).map_or(0.0, |l| l.p50 as f64)
}

const HEADER: [&str; 14] = [
    "workload",
    "thr",
    "path",
    "IOPS",
    "MiB/s",
    "p50",
    "p99",
    "CPU/IO",
    "tgt CPU/IO",
    "tgt cmds",
    "%stream",
    "p50/pp",
    "%uring",
    "",
];

/// The suite's table, then the goals.
fn table(cells: &[Cell], o: &SuiteOpts) -> String {
    let mut rows: Vec<[String; 14]> = vec![HEADER.map(String::from)];
    let mut goals = Vec::new();
    for c in cells {
        let w = &c.workload;
        let (stream_bw, pp_p50) = match &c.baseline {
            Ok(b) => (b.stream_bw(), p50(b.pingpong().0)),
            Err(_) => (0.0, 0.0),
        };
        let uring_iops = match &c.local {
            Ok(l) => l.stats.ios as f64 / l.elapsed.as_secs_f64(),
            Err(_) => 0.0,
        };
        let mut first = true;
        let mut push = |rows: &mut Vec<[String; 14]>, mut r: [String; 14]| {
            r[0] = if first { w.name.clone() } else { String::new() };
            r[1] = c.threads.to_string();
            first = false;
            rows.push(r);
        };
        for nr in &c.rows {
            let mut r: [String; 14] = Default::default();
            r[2] = format!("{} {}", o.transport().name(), nr.backend);
            match &nr.outcome {
                Outcome::Ran(m) => {
                    let (iops, bw, lat) = nvme_cells(m, &mut r);
                    r[10] = ratio_pct(bw, stream_bw);
                    r[11] = ratio_x(lat, pp_p50);
                    if nr.backend != "null" {
                        r[12] = ratio_pct(iops, uring_iops);
                    }
                    if !m.ok() {
                        r[13] = "ERRORS".into();
                    }
                    goals.extend(goal_lines(
                        c,
                        o.transport(),
                        nr.backend,
                        m,
                        (bw, stream_bw),
                        (lat, pp_p50),
                    ));
                }
                Outcome::Failed(e) | Outcome::Skipped(e) => {
                    r[3] = "FAILED".into();
                    r[13] = e.clone();
                }
            }
            push(&mut rows, r);
        }
        match &c.baseline {
            Ok(b) => {
                let mut r: [String; 14] = Default::default();
                r[2] = b.stream_label();
                r[3] = si(stream_bw / w.bs as f64);
                r[4] = mib(stream_bw);
                let (stream_note, pp_note) = b.notes();
                r[13] = stream_note;
                push(&mut rows, r);
                let mut r: [String; 14] = Default::default();
                r[2] = b.pingpong_label().into();
                let (stats, elapsed) = b.pingpong();
                fill_dir(stats, elapsed.as_secs_f64(), &mut r);
                r[13] = pp_note;
                push(&mut rows, r);
            }
            Err(e) => {
                let mut r: [String; 14] = Default::default();
                r[2] = if o.rdma.is_some() {
                    "raw-rdma"
                } else {
                    "raw-tcp"
                }
                .into();
                r[3] = "FAILED".into();
                r[13] = e.clone();
                push(&mut rows, r);
            }
        }
        let mut r: [String; 14] = Default::default();
        r[2] = format!(
            "io_uring local{}",
            if w.rw.read_percent(50) >= 50 {
                ""
            } else {
                " wr"
            }
        );
        match &c.local {
            Ok(l) => {
                fill_dir(&l.stats, l.elapsed.as_secs_f64(), &mut r);
                if l.stats.ios > 0 {
                    r[7] = format!(
                        "{:.2}us",
                        (l.cpu.user + l.cpu.sys).as_secs_f64() * 1e6 / l.stats.ios as f64
                    );
                }
                if !l.direct {
                    r[13] = "buffered".into();
                }
            }
            Err(e) => {
                r[3] = "FAILED".into();
                r[13] = e.clone();
            }
        }
        push(&mut rows, r);
    }
    let path = match (o.rdma, cells.iter().find_map(|c| c.baseline.as_ref().ok())) {
        (None, _) => "NVMe/TCP over loopback".to_string(),
        (Some(ip), Some(Limits::Rdma(b))) => format!("NVMe/RDMA on {ip} ({})", b.device),
        (Some(ip), _) => format!("NVMe/RDMA on {ip}"),
    };
    let (raw, stream, pp) = if o.rdma.is_some() {
        (
            "raw-rdma",
            "RDMA WRITE (READ for writes)",
            "SEND/RECV ping-pong",
        )
    } else {
        ("raw-tcp", "stream", "ping-pong")
    };
    let mut out = format!(
        "nvmf-bench --suite: {path}, {:.1?} per run ({:.1?} per baseline), \
         bench {}\n\n",
        o.runtime,
        (o.runtime / 2).max(Duration::from_millis(20)),
        if o.polling == initiator::Polling::Busy {
            "busy-polling (--hipri)"
        } else {
            "sleeping in poll(2)"
        }
    );
    out += &render(&rows);
    let _ = writeln!(
        out,
        "\n  thr: target threads (= bench jobs, one I/O queue each); CPU/IO: the bench \
         process; tgt CPU/IO: the target process per command received (tgt cmds)\n  \
         %stream: bandwidth / {raw} {stream}; p50/pp: p50 / {raw} {pp} p50; \
         %uring: IOPS / local io_uring on the same file"
    );
    if !goals.is_empty() {
        out += "\ngoals (issue #6):\n";
        for g in goals {
            let _ = writeln!(out, "  {g}");
        }
    }
    out
}

const MIB: f64 = (1u64 << 20) as f64;

/// IOPS, MiB/s, p50 into r[3..=6]; returns (iops, bytes/s, p50 ns).
fn fill_dir(d: &DirStats, secs: f64, r: &mut [String; 14]) -> (f64, f64, f64) {
    let iops = if secs > 0.0 { d.ios as f64 / secs } else { 0.0 };
    let bw = if secs > 0.0 {
        d.bytes as f64 / secs
    } else {
        0.0
    };
    r[3] = si(iops);
    r[4] = mib(bw);
    let l = latency(&d.hist);
    if let Some(l) = l {
        r[5] = fmt_ns(l.p50 as f64);
        r[6] = fmt_ns(l.p99 as f64);
    }
    (iops, bw, l.map_or(0.0, |l| l.p50 as f64))
}

fn nvme_cells(m: &Measured, r: &mut [String; 14]) -> (f64, f64, f64) {
    let t = m.total();
    let v = fill_dir(&t, m.elapsed.as_secs_f64(), r);
    if t.ios > 0 {
        r[7] = format!(
            "{:.2}us",
            (m.cpu.user + m.cpu.sys).as_secs_f64() * 1e6 / t.ios as f64
        );
    }
    match &m.target_cpu {
        Some(Ok(c)) => {
            r[8] = c
                .usec_per_io()
                .map_or(String::new(), |u| format!("{u:.2}us"));
            r[9] = c.commands.to_string();
        }
        Some(Err(e)) => {
            r[8] = "?".into();
            r[13] = e.clone();
        }
        None => {}
    }
    v
}

/// The goal lines a run contributes (1 thread only: the goals are stated for one; goals 1
/// and 2 for TCP only). `bw`: (the row's, the stream's) bytes/s; `lat`: (the row's, the
/// ping-pong's) p50.
fn goal_lines(
    c: &Cell,
    kind: TransportKind,
    backend: &str,
    m: &Measured,
    (bw, stream_bw): (f64, f64),
    (lat, pp_p50): (f64, f64),
) -> Vec<String> {
    let w = &c.workload;
    let mut g = Vec::new();
    if c.threads != 1 {
        return g;
    }
    let tcp = kind == TransportKind::Tcp;
    let met = |b: bool| if b { "met" } else { "NOT met" };
    if tcp && w.rw == Rw::Read && w.bs == 128 << 10 && stream_bw > 0.0 {
        let r = bw / stream_bw;
        g.push(format!(
            "1. {} {backend}: {:.0} MiB/s = {:.0}% of the raw-tcp stream ({:.0} MiB/s); goal >= 80%: {}",
            w.name,
            bw / MIB,
            100.0 * r,
            stream_bw / MIB,
            met(r >= 0.8)
        ));
    }
    if tcp && w.rw == Rw::Randread && w.bs == 4096 && w.iodepth == 1 && pp_p50 > 0.0 {
        let r = lat / pp_p50;
        g.push(format!(
            "2. {} {backend}: p50 {} = {:.2}x the raw-tcp ping-pong p50 ({}); goal <= 1.5x: {}",
            w.name,
            fmt_ns(lat),
            r,
            fmt_ns(pp_p50),
            met(r <= 1.5)
        ));
    }
    if w.rw == Rw::Randread && w.bs == 4096 && w.iodepth == 32 && backend == "null" {
        let t = m.total();
        let iops = t.ios as f64 / m.elapsed.as_secs_f64();
        let tgt = match &m.target_cpu {
            Some(Ok(c)) => c.usec_per_io().map_or("?".into(), |u| format!("{u:.2}us")),
            _ => "?".into(),
        };
        g.push(format!(
            "3. {} {backend}{}, 1 target thread: {} IOPS, target CPU {tgt} per I/O, bench CPU {:.2}us per I/O",
            w.name,
            if tcp { "" } else { " over rdma" },
            si(iops),
            if t.ios > 0 {
                (m.cpu.user + m.cpu.sys).as_secs_f64() * 1e6 / t.ios as f64
            } else {
                0.0
            }
        ));
    }
    g
}

/// Columns left-aligned for the first three, right-aligned after; the last (notes) free.
fn render(rows: &[[String; 14]]) -> String {
    let mut widths = [0usize; 14];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let pad = widths[i] - c.chars().count();
            if i < 3 || i == 13 {
                line += c;
                if i < 13 {
                    line += &" ".repeat(pad + 2);
                }
            } else {
                line += &" ".repeat(pad);
                line += c;
                line += "  ";
            }
        }
        out += line.trim_end();
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_both_namespaces_and_the_thread_count() {
        let mut o = opts();
        let y = config_yaml(&o, 5000, 2, Path::new("/dev/shm/x/ns.img"));
        assert!(y.contains("{ transport: tcp, address: 127.0.0.1, port: 5000 }"));
        assert!(y.contains("{ nsid: 1, null: 1GiB }"));
        assert!(y.contains(r#"{ nsid: 2, path: "/dev/shm/x/ns.img", size: 268435456 }"#));
        assert!(y.contains("target: { threads: 2 }"));
        o.rdma = Some("192.168.78.1".parse().unwrap());
        o.file_size = 64 << 20;
        let y = config_yaml(&o, 5000, 1, Path::new("/dev/shm/x/ns.img"));
        assert!(y.contains("{ transport: rdma, address: 192.168.78.1, port: 5000 }"));
        assert!(y.contains("size: 67108864 }"));
        assert!(!y.contains("transport: tcp"));
    }

    fn opts() -> SuiteOpts {
        SuiteOpts {
            runtime: Duration::from_secs(1),
            ramp: Duration::ZERO,
            polling: initiator::Polling::Adaptive,
            io_timeout: Duration::from_secs(30),
            file_dir: PathBuf::from("/dev/shm"),
            file_size: 256 << 20,
            rdma: None,
            dhchap: None,
        }
    }

    #[test]
    fn the_matrix() {
        let o = opts();
        let names: Vec<String> = workloads(&o, 2).into_iter().map(|w| w.name).collect();
        assert_eq!(
            names,
            [
                "4k randread qd1",
                "4k randread qd32",
                "4k randwrite qd1",
                "4k randwrite qd32",
                "128k read qd8",
                "128k write qd8"
            ]
        );
        assert!(workloads(&o, 2).iter().all(|w| w.numjobs == 2));
    }
}
