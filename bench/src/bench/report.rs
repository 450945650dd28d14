//! Text and JSON output.
//!
//! # JSON schema "nvmf-bench/1"
//! `--output-format=json` prints one object. Fields are only ever added in a compatible way;
//! a change that removes or retypes a field bumps the schema name. Latencies are integer
//! nanoseconds (means and deviations are floats); a field that does not apply is `null`.
//!
//! ```text
//! {
//!   "schema": "nvmf-bench/1",
//!   "version": "<nvmf-bench version>",
//!   "target": { "traddr": str, "trsvcid": int, "subnqn": str, "nsid": int },
//!   "workloads": [ {
//!     "name": str, "rw": "read|write|randread|randwrite|randrw|rw", "rwmixread": int,
//!     "bs": int, "iodepth": int, "numjobs": int,
//!     "runtime_s": float|null,            // null: one pass over the region
//!     "ramp_time_s": float, "offset": int, "offset_increment": int,
//!     "size": int|null,                    // as given (null: to the namespace's end)
//!     "verify": "crc32c"|null,
//!     "results": [ {
//!       "transport": "tcp|rdma",
//!       "status": "ok|error|failed|skipped", // error: ran, but with I/O errors or verify
//!                                            // mismatches; failed: could not run;
//!                                            // skipped: transport unavailable here
//!       "reason": str|null,                  // why failed/skipped
//!       "errors": [str],                     // I/O errors of a run
//!       "elapsed_s": float|null,             // measured window
//!       "region_bytes": int|null,            // bytes of each job's region
//!       "total"|"read"|"write": null | {
//!         "ios": int, "bytes": int, "iops": float, "mib_s": float,
//!         "lat_ns": null | { "min", "p50", "p90", "p99", "p99_9", "max": int,
//!                            "mean", "stdev": float }
//!       },
//!       "cpu": null | { "user_s": float, "sys_s": float, "usec_per_io": float|null },
//!       "copies": null | { "per_byte": float, "socket_per_byte": float,
//!                          "memcpy_per_byte": float, "bytes_per_io": float },
//!       "syscalls_per_io": float|null,       // the initiator queues' system calls
//!       "target_cpu": null | { "cpu_s": float, "commands": int, "usec_per_io": float|null,
//!                              "error": str|null },  // with --target-stats / --demo
//!       "verify": null | { "blocks_checked": int, "mismatches": int,
//!                          "first": [ { "job": int, "offset": int, "error": str } ] }
//!     } ],
//!     "raw_tcp_baseline": null | {
//!       "error": str|null,
//!       "stream": null | { "connections": int, "bytes": int, "elapsed_s": float, "mib_s": float },
//!       "pingpong": null | { "connections": int, "depth": int, "request_bytes": int,
//!                            "reply_bytes": int, "ios": int, "iops": float, "mib_s": float,
//!                            "lat_ns": <as above> }
//!     }
//!   } ]
//! }
//! ```
//! `cpu` is getrusage(RUSAGE_SELF) user+system time of the whole bench process over the
//! measured window, divided by the I/Os completed in it. `copies` comes from the initiator's
//! queue counters: payload bytes the CPU copied (through the socket, and by memcpy in user
//! space) per payload byte delivered, and per I/O. `target_cpu` is the target daemon's CPU
//! time (its control socket's `cpu_ns`) from before the bench connected to after it
//! disconnected, divided by the commands the target received meanwhile.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::args::TransportKind;
use super::baseline::Baseline;
use super::engine::{Counters, TargetSpec};
use super::job::{human_size, DirStats, Workload};
use super::run::Outcome;

pub const SCHEMA: &str = "nvmf-bench/1";

/// One workload's results.
#[derive(Debug)]
pub struct WorkloadOutcome {
    pub workload: Workload,
    pub results: Vec<(TransportKind, Outcome)>,
    pub baseline: Option<Result<Baseline, String>>,
}

#[derive(Serialize)]
pub struct Report {
    schema: &'static str,
    version: &'static str,
    target: TargetJson,
    workloads: Vec<WorkloadJson>,
}

#[derive(Serialize)]
struct TargetJson {
    traddr: String,
    trsvcid: u16,
    subnqn: String,
    nsid: u32,
}

#[derive(Serialize)]
struct WorkloadJson {
    name: String,
    rw: &'static str,
    rwmixread: u8,
    bs: u64,
    iodepth: u16,
    numjobs: u16,
    runtime_s: Option<f64>,
    ramp_time_s: f64,
    offset: u64,
    offset_increment: u64,
    size: Option<u64>,
    verify: Option<&'static str>,
    results: Vec<TransportJson>,
    raw_tcp_baseline: Option<BaselineJson>,
}

#[derive(Serialize)]
struct TransportJson {
    transport: &'static str,
    status: &'static str,
    reason: Option<String>,
    errors: Vec<String>,
    elapsed_s: Option<f64>,
    region_bytes: Option<u64>,
    total: Option<DirJson>,
    read: Option<DirJson>,
    write: Option<DirJson>,
    cpu: Option<CpuJson>,
    copies: Option<CopiesJson>,
    syscalls_per_io: Option<f64>,
    target_cpu: Option<TargetCpuJson>,
    verify: Option<VerifyJson>,
}

#[derive(Serialize)]
struct TargetCpuJson {
    cpu_s: f64,
    commands: u64,
    usec_per_io: Option<f64>,
    error: Option<String>,
}

#[derive(Serialize, Clone, Copy)]
pub struct LatJson {
    pub min: u64,
    pub mean: f64,
    pub stdev: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p99_9: u64,
    pub max: u64,
}

#[derive(Serialize)]
struct DirJson {
    ios: u64,
    bytes: u64,
    iops: f64,
    mib_s: f64,
    lat_ns: Option<LatJson>,
}

#[derive(Serialize)]
struct CpuJson {
    user_s: f64,
    sys_s: f64,
    usec_per_io: Option<f64>,
}

#[derive(Serialize)]
struct CopiesJson {
    per_byte: f64,
    socket_per_byte: f64,
    memcpy_per_byte: f64,
    bytes_per_io: f64,
}

#[derive(Serialize)]
struct VerifyJson {
    blocks_checked: u64,
    mismatches: u64,
    first: Vec<MismatchJson>,
}

#[derive(Serialize)]
struct MismatchJson {
    job: usize,
    offset: u64,
    error: String,
}

#[derive(Serialize)]
struct BaselineJson {
    error: Option<String>,
    stream: Option<StreamJson>,
    pingpong: Option<PingPongJson>,
}

#[derive(Serialize)]
struct StreamJson {
    connections: usize,
    bytes: u64,
    elapsed_s: f64,
    mib_s: f64,
}

#[derive(Serialize)]
struct PingPongJson {
    connections: usize,
    depth: usize,
    request_bytes: usize,
    reply_bytes: usize,
    ios: u64,
    iops: f64,
    mib_s: f64,
    lat_ns: Option<LatJson>,
}

const MIB: f64 = (1u64 << 20) as f64;

/// Latency summary of a histogram (None when empty).
pub fn latency(h: &Histogram<u64>) -> Option<LatJson> {
    if h.is_empty() {
        return None;
    }
    Some(LatJson {
        min: h.min(),
        mean: h.mean(),
        stdev: h.stdev(),
        p50: h.value_at_quantile(0.50),
        p90: h.value_at_quantile(0.90),
        p99: h.value_at_quantile(0.99),
        p99_9: h.value_at_quantile(0.999),
        max: h.max(),
    })
}

fn per_sec(n: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        n / secs
    } else {
        0.0
    }
}

fn dir_json(d: &DirStats, secs: f64) -> DirJson {
    DirJson {
        ios: d.ios,
        bytes: d.bytes,
        iops: per_sec(d.ios as f64, secs),
        mib_s: per_sec(d.bytes as f64, secs) / MIB,
        lat_ns: latency(&d.hist),
    }
}

fn copies_json(c: &Counters, bs: u64) -> CopiesJson {
    let p = c.payload_bytes.max(1) as f64;
    let per_byte = (c.socket_bytes + c.memcpy_bytes) as f64 / p;
    CopiesJson {
        per_byte,
        socket_per_byte: c.socket_bytes as f64 / p,
        memcpy_per_byte: c.memcpy_bytes as f64 / p,
        bytes_per_io: per_byte * bs as f64,
    }
}

fn transport_json(kind: TransportKind, o: &Outcome, bs: u64) -> TransportJson {
    let mut t = TransportJson {
        transport: kind.name(),
        status: "ok",
        reason: None,
        errors: Vec::new(),
        elapsed_s: None,
        region_bytes: None,
        total: None,
        read: None,
        write: None,
        cpu: None,
        copies: None,
        syscalls_per_io: None,
        target_cpu: None,
        verify: None,
    };
    match o {
        Outcome::Skipped(why) => {
            t.status = "skipped";
            t.reason = Some(why.clone());
        }
        Outcome::Failed(why) => {
            t.status = "failed";
            t.reason = Some(why.clone());
        }
        Outcome::Ran(m) => {
            let secs = m.elapsed.as_secs_f64();
            let total = m.total();
            t.status = if m.ok() { "ok" } else { "error" };
            t.errors = m.errors.clone();
            t.elapsed_s = Some(secs);
            t.region_bytes = Some(m.region_len);
            t.total = Some(dir_json(&total, secs));
            t.read = Some(dir_json(&m.read, secs));
            t.write = Some(dir_json(&m.write, secs));
            t.cpu = Some(CpuJson {
                user_s: m.cpu.user.as_secs_f64(),
                sys_s: m.cpu.sys.as_secs_f64(),
                usec_per_io: (total.ios > 0)
                    .then(|| (m.cpu.user + m.cpu.sys).as_secs_f64() * 1e6 / total.ios as f64),
            });
            t.copies = (m.counters.payload_bytes > 0).then(|| copies_json(&m.counters, bs));
            t.syscalls_per_io =
                (total.ios > 0).then(|| m.counters.syscalls as f64 / total.ios as f64);
            t.target_cpu = m.target_cpu.as_ref().map(|r| match r {
                Ok(c) => TargetCpuJson {
                    cpu_s: c.cpu.as_secs_f64(),
                    commands: c.commands,
                    usec_per_io: c.usec_per_io(),
                    error: None,
                },
                Err(e) => TargetCpuJson {
                    cpu_s: 0.0,
                    commands: 0,
                    usec_per_io: None,
                    error: Some(e.clone()),
                },
            });
            t.verify = m.verify.as_ref().map(|v| VerifyJson {
                blocks_checked: v.checked,
                mismatches: v.mismatches,
                first: v
                    .first
                    .iter()
                    .map(|(job, offset, e)| MismatchJson {
                        job: *job,
                        offset: *offset,
                        error: e.to_string(),
                    })
                    .collect(),
            });
        }
    }
    t
}

fn baseline_json(b: &Result<Baseline, String>) -> BaselineJson {
    match b {
        Err(e) => BaselineJson {
            error: Some(e.clone()),
            stream: None,
            pingpong: None,
        },
        Ok(b) => {
            let s = &b.stream;
            let p = &b.pingpong;
            let psecs = p.elapsed.as_secs_f64();
            BaselineJson {
                error: None,
                stream: Some(StreamJson {
                    connections: s.connections,
                    bytes: s.bytes,
                    elapsed_s: s.elapsed.as_secs_f64(),
                    mib_s: per_sec(s.bytes as f64, s.elapsed.as_secs_f64()) / MIB,
                }),
                pingpong: Some(PingPongJson {
                    connections: p.connections,
                    depth: p.depth,
                    request_bytes: p.request_bytes,
                    reply_bytes: p.reply_bytes,
                    ios: p.stats.ios,
                    iops: per_sec(p.stats.ios as f64, psecs),
                    mib_s: per_sec(p.stats.bytes as f64, psecs) / MIB,
                    lat_ns: latency(&p.stats.hist),
                }),
            }
        }
    }
}

pub fn json(target: &TargetSpec, outcomes: &[WorkloadOutcome]) -> Report {
    Report {
        schema: SCHEMA,
        version: env!("CARGO_PKG_VERSION"),
        target: TargetJson {
            traddr: target.traddr.clone(),
            trsvcid: target.trsvcid,
            subnqn: target.subnqn.clone(),
            nsid: target.nsid,
        },
        workloads: outcomes
            .iter()
            .map(|o| {
                let w = &o.workload;
                WorkloadJson {
                    name: w.name.clone(),
                    rw: w.rw.name(),
                    rwmixread: w.rwmixread,
                    bs: w.bs,
                    iodepth: w.iodepth,
                    numjobs: w.numjobs,
                    runtime_s: w.runtime.map(|r| r.as_secs_f64()),
                    ramp_time_s: w.ramp.as_secs_f64(),
                    offset: w.offset,
                    offset_increment: w.offset_increment,
                    size: w.size,
                    verify: w.verify.then_some("crc32c"),
                    results: o
                        .results
                        .iter()
                        .map(|(k, r)| transport_json(*k, r, w.bs))
                        .collect(),
                    raw_tcp_baseline: o.baseline.as_ref().map(baseline_json),
                }
            })
            .collect(),
    }
}

/// 85300 -> "85.3k".
pub fn si(x: f64) -> String {
    if x >= 1e9 {
        format!("{:.2}G", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e4 {
        format!("{:.1}k", x / 1e3)
    } else if x >= 1e3 {
        format!("{:.2}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// A latency in nanoseconds with a readable unit.
pub fn fmt_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0}ns")
    } else if ns < 1e4 {
        format!("{:.2}us", ns / 1e3)
    } else if ns < 1e5 {
        format!("{:.1}us", ns / 1e3)
    } else if ns < 1e6 {
        format!("{:.0}us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
    }
}

fn bytes_h(b: f64) -> String {
    if b >= (1u64 << 30) as f64 {
        format!("{:.2}GiB", b / (1u64 << 30) as f64)
    } else if b >= MIB {
        format!("{:.1}MiB", b / MIB)
    } else if b >= 1024.0 {
        format!("{:.1}KiB", b / 1024.0)
    } else {
        format!("{b:.0}B")
    }
}

fn dir_text(out: &mut String, name: &str, d: &DirStats, secs: f64) {
    if d.ios == 0 {
        return;
    }
    let iops = per_sec(d.ios as f64, secs);
    let bw = per_sec(d.bytes as f64, secs);
    let _ = writeln!(
        out,
        "  {name}: IOPS={}, BW={}/s ({:.1}MB/s)({}/{:.0}msec)",
        si(iops),
        bytes_h(bw),
        bw / 1e6,
        bytes_h(d.bytes as f64),
        secs * 1e3
    );
    if let Some(l) = latency(&d.hist) {
        let _ = writeln!(
            out,
            "    lat: min={}, avg={}, stdev={}, max={}",
            fmt_ns(l.min as f64),
            fmt_ns(l.mean),
            fmt_ns(l.stdev),
            fmt_ns(l.max as f64)
        );
        let _ = writeln!(
            out,
            "    lat percentiles: p50={}, p90={}, p99={}, p99.9={}",
            fmt_ns(l.p50 as f64),
            fmt_ns(l.p90 as f64),
            fmt_ns(l.p99 as f64),
            fmt_ns(l.p99_9 as f64)
        );
    }
}

/// The fio-like summary of one transport's run.
pub fn transport_text(w: &Workload, kind: TransportKind, o: &Outcome) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{} [{}]: rw={}, bs={}, iodepth={}, numjobs={}",
        w.name,
        kind.name(),
        w.rw.name(),
        human_size(w.bs),
        w.iodepth,
        w.numjobs
    );
    if matches!(w.rw, super::args::Rw::Randrw | super::args::Rw::ReadWrite) {
        let _ = write!(out, ", rwmixread={}", w.rwmixread);
    }
    match o {
        Outcome::Skipped(why) => {
            let _ = writeln!(out, "\n  skipped: {why}");
        }
        Outcome::Failed(why) => {
            let _ = writeln!(out, "\n  FAILED: {why}");
        }
        Outcome::Ran(m) => {
            let _ = writeln!(
                out,
                ", size={}/job, {}",
                bytes_h(m.region_len as f64),
                match w.runtime {
                    Some(r) => format!("runtime={:.1}s", r.as_secs_f64()),
                    None => "one pass".into(),
                }
            );
            let secs = m.elapsed.as_secs_f64();
            dir_text(&mut out, "read", &m.read, secs);
            dir_text(&mut out, "write", &m.write, secs);
            let total = m.total();
            if total.ios > 0 {
                let cpu = m.cpu.user + m.cpu.sys;
                let _ = writeln!(
                    out,
                    "  cpu: usr={:.2}s, sys={:.2}s, {:.2}us per I/O; {:.2} syscalls per I/O",
                    m.cpu.user.as_secs_f64(),
                    m.cpu.sys.as_secs_f64(),
                    cpu.as_secs_f64() * 1e6 / total.ios as f64,
                    m.counters.syscalls as f64 / total.ios as f64
                );
            }
            match &m.target_cpu {
                Some(Ok(c)) => {
                    let _ = writeln!(
                        out,
                        "  target cpu: {:.2}s for {} commands, {} per I/O",
                        c.cpu.as_secs_f64(),
                        c.commands,
                        c.usec_per_io().map_or("-".into(), |u| format!("{u:.2}us"))
                    );
                }
                Some(Err(e)) => {
                    let _ = writeln!(out, "  target cpu: unknown ({e})");
                }
                None => {}
            }
            if m.counters.payload_bytes > 0 {
                let c = copies_json(&m.counters, w.bs);
                let _ = writeln!(
                    out,
                    "  copies: {:.2} per payload byte (socket {:.2}, memcpy {:.2}), {} copied per {} I/O",
                    c.per_byte,
                    c.socket_per_byte,
                    c.memcpy_per_byte,
                    bytes_h(c.bytes_per_io),
                    human_size(w.bs)
                );
            }
            if let Some(v) = &m.verify {
                let _ = writeln!(
                    out,
                    "  verify: {} blocks checked, {} mismatches",
                    v.checked, v.mismatches
                );
                for (job, off, e) in &v.first {
                    let _ = writeln!(out, "    job {job}: offset {off} ({off:#x}): {e}");
                }
            }
            for e in &m.errors {
                let _ = writeln!(out, "  ERROR: {e}");
            }
        }
    }
    out
}

/// The baseline rows of one workload.
pub fn baseline_text(b: &Result<Baseline, String>) -> String {
    let mut out = String::new();
    match b {
        Err(e) => {
            let _ = writeln!(out, "raw-tcp baseline: FAILED: {e}");
        }
        Ok(b) => {
            let s = &b.stream;
            let _ = writeln!(
                out,
                "raw-tcp stream: {} connection(s), BW={}/s ({}/{:.0}msec)",
                s.connections,
                bytes_h(per_sec(s.bytes as f64, s.elapsed.as_secs_f64())),
                bytes_h(s.bytes as f64),
                s.elapsed.as_secs_f64() * 1e3
            );
            let p = &b.pingpong;
            let _ = writeln!(
                out,
                "raw-tcp ping-pong: {} connection(s) x depth {}, {}-byte request, {}-byte reply",
                p.connections, p.depth, p.request_bytes, p.reply_bytes
            );
            dir_text(&mut out, "replies", &p.stats, p.elapsed.as_secs_f64());
        }
    }
    out
}

/// `v` padded with empty cells.
fn cells<const N: usize>(v: Vec<String>) -> [String; N] {
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for (o, c) in out.iter_mut().zip(v) {
        *o = c;
    }
    out
}

/// The side-by-side table of every workload, transport and baseline row.
pub fn table(outcomes: &[WorkloadOutcome]) -> String {
    let mut rows: Vec<[String; 13]> = vec![[
        "workload",
        "transport",
        "IOPS",
        "MiB/s",
        "min",
        "avg",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "max",
        "CPU/IO",
        "tgt CPU/IO",
    ]
    .map(String::from)];
    let mut notes: Vec<String> = Vec::new();
    let mut copies_col: Vec<String> = vec!["copies/B".into()];
    for o in outcomes {
        let wname = o.workload.name.clone();
        let mut first = true;
        let mut push = |rows: &mut Vec<[String; 13]>, cells: [String; 12]| {
            let mut r: [String; 13] = Default::default();
            r[0] = if first { wname.clone() } else { String::new() };
            first = false;
            for (i, c) in cells.into_iter().enumerate() {
                r[i + 1] = c;
            }
            rows.push(r);
        };
        let lat_cells = |h: &Histogram<u64>| -> [String; 7] {
            match latency(h) {
                None => Default::default(),
                Some(l) => [
                    fmt_ns(l.min as f64),
                    fmt_ns(l.mean),
                    fmt_ns(l.p50 as f64),
                    fmt_ns(l.p90 as f64),
                    fmt_ns(l.p99 as f64),
                    fmt_ns(l.p99_9 as f64),
                    fmt_ns(l.max as f64),
                ],
            }
        };
        for (kind, r) in &o.results {
            match r {
                Outcome::Ran(m) => {
                    let t = m.total();
                    let secs = m.elapsed.as_secs_f64();
                    let [a, b, c, d, e, f, g] = lat_cells(&t.hist);
                    let cpu = if t.ios > 0 {
                        format!(
                            "{:.2}us",
                            (m.cpu.user + m.cpu.sys).as_secs_f64() * 1e6 / t.ios as f64
                        )
                    } else {
                        String::new()
                    };
                    let tgt = match &m.target_cpu {
                        Some(Ok(c)) => c
                            .usec_per_io()
                            .map_or(String::new(), |u| format!("{u:.2}us")),
                        Some(Err(_)) => "?".into(),
                        None => String::new(),
                    };
                    let name = if m.ok() {
                        kind.name().to_string()
                    } else {
                        format!("{} (ERRORS)", kind.name())
                    };
                    push(
                        &mut rows,
                        [
                            name,
                            si(per_sec(t.ios as f64, secs)),
                            format!("{:.1}", per_sec(t.bytes as f64, secs) / MIB),
                            a,
                            b,
                            c,
                            d,
                            e,
                            f,
                            g,
                            cpu,
                            tgt,
                        ],
                    );
                    copies_col.push(if m.counters.payload_bytes > 0 {
                        format!("{:.2}", copies_json(&m.counters, o.workload.bs).per_byte)
                    } else {
                        String::new()
                    });
                }
                Outcome::Skipped(why) | Outcome::Failed(why) => {
                    let verb = if matches!(r, Outcome::Skipped(_)) {
                        "skipped"
                    } else {
                        "FAILED"
                    };
                    push(&mut rows, cells(vec![kind.name().to_string(), verb.into()]));
                    copies_col.push(String::new());
                    notes.push(format!("{}: {verb}: {why}", kind.name()));
                }
            }
        }
        if let Some(b) = &o.baseline {
            match b {
                Ok(b) => {
                    let s = &b.stream;
                    let ssecs = s.elapsed.as_secs_f64();
                    push(
                        &mut rows,
                        cells(vec![
                            "raw-tcp stream".into(),
                            si(per_sec(s.bytes as f64, ssecs) / o.workload.bs as f64),
                            format!("{:.1}", per_sec(s.bytes as f64, ssecs) / MIB),
                        ]),
                    );
                    copies_col.push(String::new());
                    let p = &b.pingpong;
                    let psecs = p.elapsed.as_secs_f64();
                    let [a, bb, c, d, e, f, g] = lat_cells(&p.stats.hist);
                    push(
                        &mut rows,
                        [
                            "raw-tcp ping-pong".into(),
                            si(per_sec(p.stats.ios as f64, psecs)),
                            format!("{:.1}", per_sec(p.stats.bytes as f64, psecs) / MIB),
                            a,
                            bb,
                            c,
                            d,
                            e,
                            f,
                            g,
                            String::new(),
                            String::new(),
                        ],
                    );
                    copies_col.push(String::new());
                }
                Err(e) => {
                    push(&mut rows, cells(vec!["raw-tcp".into(), "FAILED".into()]));
                    copies_col.push(String::new());
                    notes.push(format!("raw-tcp baseline: {e}"));
                }
            }
        }
    }
    let mut widths = [0usize; 14];
    for (r, c) in rows.iter().zip(&copies_col) {
        for (i, cell) in r.iter().chain(std::iter::once(c)).enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for (r, c) in rows.iter().zip(&copies_col) {
        let mut line = String::new();
        for (i, cell) in r.iter().chain(std::iter::once(c)).enumerate() {
            let pad = widths[i] - cell.chars().count();
            if i < 2 {
                line += cell;
                line += &" ".repeat(pad + 2);
            } else {
                line += &" ".repeat(pad);
                line += cell;
                line += "  ";
            }
        }
        out += line.trim_end();
        out.push('\n');
    }
    if outcomes.iter().any(|o| matches!(o.baseline, Some(Ok(_)))) {
        notes.push(
            "raw-tcp stream IOPS: its bandwidth in bs-sized units; raw-tcp ping-pong: \
             bs-sized messages at the same depth over a plain loopback socket"
                .into(),
        );
    }
    notes.dedup();
    for n in notes {
        let _ = writeln!(out, "  {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(si(85_300.0), "85.3k");
        assert_eq!(si(1_234.0), "1.23k");
        assert_eq!(si(2_500_000.0), "2.50M");
        assert_eq!(si(12.0), "12");
        assert_eq!(fmt_ns(850.0), "850ns");
        assert_eq!(fmt_ns(12_345.0), "12.3us");
        assert_eq!(fmt_ns(2_500_000.0), "2.50ms");
    }

    #[test]
    fn latency_summary_is_ordered() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        assert!(latency(&h).is_none());
        for v in 1..=10_000u64 {
            h.record(v * 1000).unwrap();
        }
        let l = latency(&h).unwrap();
        assert!(l.min <= l.p50 && l.p50 <= l.p90 && l.p90 <= l.p99);
        assert!(l.p99 <= l.p99_9 && l.p99_9 <= l.max);
        assert!((l.p50 as f64 - 5e6).abs() < 5e6 * 0.01);
    }
}
