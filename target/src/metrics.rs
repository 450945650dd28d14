//! Counters for operators: Prometheus text on an optional HTTP endpoint (`metrics.listen`) and
//! the same numbers on a Unix control socket that `nvmf-target stats` reads.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::core::stats::{
    ControllerMetrics, IoTotals, NsTotals, SubsystemMetrics, LAT_BUCKETS, LAT_FIRST_US, NSID_OTHER,
};
use crate::core::Target;
use crate::transport::conns::{PollerStats, TransportStats};

/// CPU time (user + system) this process has used so far, in nanoseconds.
pub fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Where the numbers come from.
#[derive(Clone)]
pub struct Source {
    pub target: Arc<Target>,
    /// Every poller thread's counters (each serves both transports).
    pub pollers: Vec<Arc<PollerStats>>,
    /// Whether the target serves NVMe/RDMA (its counters are reported then).
    pub rdma: bool,
    /// A gateway's group status (`None`: not a gateway).
    pub gateway: Option<Arc<dyn Fn() -> crate::gateway::Status + Send + Sync>>,
}

/// One transport's connection counters on one poller, at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransportSample {
    pub transport: &'static str,
    pub connections: u64,
    pub commands: u64,
    pub errors: u64,
    pub rx_bytes: u64,
    pub tx_payload: u64,
    pub copied_bytes: u64,
}

impl TransportSample {
    fn of(transport: &'static str, s: &TransportStats) -> TransportSample {
        TransportSample {
            transport,
            connections: s.connections.load(Ordering::Relaxed) as u64,
            commands: s.commands.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
            rx_bytes: s.rx_bytes.load(Ordering::Relaxed),
            tx_payload: s.tx_payload.load(Ordering::Relaxed),
            copied_bytes: s.copied_bytes.load(Ordering::Relaxed),
        }
    }
}

/// One poller's counters at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PollerSample {
    pub poller: usize,
    pub buffers_in_use: u64,
    /// io_uring_enter system calls of the poller's backend ring so far.
    pub ring_enters: u64,
    /// NVMe/TCP sends through the socket ring, and the io_uring_enter calls that made them.
    pub tcp_ring_sends: u64,
    pub tcp_ring_send_enters: u64,
    /// RDMA memory regions registered now (0 without RDMA).
    pub mrs_registered: u64,
    /// Nanoseconds working, spinning and sleeping so far; the measured wake-up latency.
    pub work_ns: u64,
    pub spin_ns: u64,
    pub sleep_ns: u64,
    pub wake_latency_ns: u64,
    /// TCP, then RDMA when the target serves it.
    pub transports: Vec<TransportSample>,
}

/// Name, type, help text and getter of one per-transport, per-poller metric.
type TransportMetric = (
    &'static str,
    &'static str,
    &'static str,
    fn(&TransportSample) -> u64,
);

/// Name, type, help text and getter of one per-poller metric.
type PollerMetric = (
    &'static str,
    &'static str,
    &'static str,
    fn(&PollerSample) -> u64,
);

impl Source {
    pub fn sample(&self) -> (u64, Vec<PollerSample>) {
        let ps = self
            .pollers
            .iter()
            .enumerate()
            .map(|(poller, s)| {
                let mut transports = vec![TransportSample::of("tcp", &s.tcp)];
                if self.rdma {
                    transports.push(TransportSample::of("rdma", &s.rdma));
                }
                PollerSample {
                    poller,
                    buffers_in_use: s.buffers_in_use.load(Ordering::Relaxed) as u64,
                    ring_enters: s.ring_enters.load(Ordering::Relaxed),
                    tcp_ring_sends: s.tcp_ring_sends.load(Ordering::Relaxed),
                    tcp_ring_send_enters: s.tcp_ring_send_enters.load(Ordering::Relaxed),
                    mrs_registered: s.verbs.mrs_registered.load(Ordering::Relaxed) as u64,
                    work_ns: s.work_ns.load(Ordering::Relaxed),
                    spin_ns: s.spin_ns.load(Ordering::Relaxed),
                    sleep_ns: s.sleep_ns.load(Ordering::Relaxed),
                    wake_latency_ns: s.wake_latency_ns.load(Ordering::Relaxed),
                    transports,
                }
            })
            .collect();
        (self.target.controller_count() as u64, ps)
    }

    /// Prometheus text exposition format 0.0.4.
    pub fn prometheus(&self) -> String {
        let (ctrls, ps) = self.sample();
        let mut o = String::new();
        o.push_str("# HELP nvmf_controllers Live NVMe controllers (admin queues connected).\n");
        o.push_str("# TYPE nvmf_controllers gauge\n");
        o.push_str(&format!("nvmf_controllers {ctrls}\n"));
        o.push_str("# HELP process_cpu_seconds_total User and system CPU time of the daemon.\n");
        o.push_str("# TYPE process_cpu_seconds_total counter\n");
        o.push_str(&format!(
            "process_cpu_seconds_total {:.6}\n",
            process_cpu_ns() as f64 / 1e9
        ));
        let tls = crate::transport::tcp::tls::counters();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let tls_families = [
            (
                "nvmf_tls_connections_total",
                "NVMe/TCP connections whose TLS handshake completed, by who runs the records \
                 (kernel TLS or user space).",
                [
                    ("records=\"kernel\"", &tls.kernel),
                    ("records=\"user\"", &tls.user),
                ],
            ),
            (
                "nvmf_tls_handshakes_failed_total",
                "TLS handshakes refused (a wrong or unknown key, not TLS) or not finished in time.",
                [
                    ("reason=\"refused\"", &tls.failed),
                    ("reason=\"timeout\"", &tls.timed_out),
                ],
            ),
        ];
        for (name, help, series) in tls_families {
            o.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
            for (labels, v) in series {
                o.push_str(&format!("{name}{{{labels}}} {}\n", load(v)));
            }
        }
        let per_transport: [TransportMetric; 6] = [
            (
                "nvmf_connections",
                "gauge",
                "Open queue connections.",
                |t| t.connections,
            ),
            (
                "nvmf_commands_total",
                "counter",
                "Commands received.",
                |t| t.commands,
            ),
            (
                "nvmf_errors_total",
                "counter",
                "Commands completed with an error status, and protocol errors.",
                |t| t.errors,
            ),
            (
                "nvmf_rx_bytes_total",
                "counter",
                "Bytes received from hosts.",
                |t| t.rx_bytes,
            ),
            (
                "nvmf_read_payload_bytes_total",
                "counter",
                "Read data bytes sent to hosts.",
                |t| t.tx_payload,
            ),
            (
                "nvmf_copied_bytes_total",
                "counter",
                "Payload bytes copied by the CPU in user space.",
                |t| t.copied_bytes,
            ),
        ];
        for (name, kind, help, get) in per_transport {
            o.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for p in &ps {
                for t in &p.transports {
                    o.push_str(&format!(
                        "{name}{{transport=\"{}\",poller=\"{}\"}} {}\n",
                        t.transport,
                        p.poller,
                        get(t)
                    ));
                }
            }
        }
        let mut per_poller: Vec<PollerMetric> = vec![
            (
                "nvmf_io_uring_enters_total",
                "counter",
                "io_uring_enter system calls of the poller's backend ring.",
                |p| p.ring_enters,
            ),
            (
                "nvmf_tcp_ring_sends_total",
                "counter",
                "NVMe/TCP sends submitted through the poller's socket ring (target.tcp_send).",
                |p| p.tcp_ring_sends,
            ),
            (
                "nvmf_tcp_ring_send_enters_total",
                "counter",
                "io_uring_enter calls that submitted those sends (several connections' each).",
                |p| p.tcp_ring_send_enters,
            ),
            (
                "nvmf_buffers_in_use",
                "gauge",
                "Registered I/O buffers held by commands.",
                |p| p.buffers_in_use,
            ),
        ];
        if self.rdma {
            per_poller.push((
                "nvmf_rdma_mrs_registered",
                "gauge",
                "RDMA memory regions registered now (pool, per-connection rings, per-I/O READ sinks).",
                |p| p.mrs_registered,
            ));
        }
        for (name, kind, help, get) in per_poller {
            o.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for p in &ps {
                o.push_str(&format!("{name}{{poller=\"{}\"}} {}\n", p.poller, get(p)));
            }
        }
        o.push_str(
            "# HELP nvmf_poller_seconds_total Poller thread time: passes that did work, passes \
             that spun without work, blocked waiting for work.\n\
             # TYPE nvmf_poller_seconds_total counter\n",
        );
        for p in &ps {
            for (state, ns) in [
                ("work", p.work_ns),
                ("spin", p.spin_ns),
                ("sleep", p.sleep_ns),
            ] {
                o.push_str(&format!(
                    "nvmf_poller_seconds_total{{poller=\"{}\",state=\"{state}\"}} {:.6}\n",
                    p.poller,
                    ns as f64 / 1e9
                ));
            }
        }
        o.push_str(
            "# HELP nvmf_poller_wake_latency_seconds The wake-up latency measured at start, \
             which the adaptive poller spins through gaps shorter than.\n\
             # TYPE nvmf_poller_wake_latency_seconds gauge\n",
        );
        for p in &ps {
            o.push_str(&format!(
                "nvmf_poller_wake_latency_seconds{{poller=\"{}\"}} {:.9}\n",
                p.poller,
                p.wake_latency_ns as f64 / 1e9
            ));
        }
        io_prometheus(&mut o, &self.target.io_metrics());
        if let Some(g) = &self.gateway {
            let g = g();
            let labels = format!("gateway_group=\"{}\",gateway=\"{}\"", g.group, g.name);
            o.push_str("# HELP nvmf_gateway_serving Whether this gateway holds the ANA group's lease (serves it optimized).\n");
            o.push_str("# TYPE nvmf_gateway_serving gauge\n");
            for a in &g.leased {
                o.push_str(&format!(
                    "nvmf_gateway_serving{{{labels},ana_group=\"{a}\"}} {}\n",
                    u8::from(g.serving.contains(a))
                ));
            }
            o.push_str("# HELP nvmf_gateway_peers Live gateways of the group besides this one.\n");
            o.push_str("# TYPE nvmf_gateway_peers gauge\n");
            o.push_str(&format!(
                "nvmf_gateway_peers{{{labels}}} {}\n",
                g.peers.len()
            ));
            o.push_str("# HELP nvmf_gateway_config_version The version of the group's configuration running here.\n");
            o.push_str("# TYPE nvmf_gateway_config_version gauge\n");
            o.push_str(&format!(
                "nvmf_gateway_config_version{{{labels}}} {}\n",
                g.config_version
            ));
        }
        o
    }

    /// A fixed-width table (for `nvmf-target stats`).
    pub fn table(&self) -> String {
        let (ctrls, ps) = self.sample();
        let mut o = format!(
            "controllers: {ctrls}\ncpu: {:.3} s\n",
            process_cpu_ns() as f64 / 1e9
        );
        o.push_str(&format!(
            "{:>6} {:>8} {:>6} {:>5} {:>16} {:<9} {:>6} {:>12} {:>8} {:>14} {:>14} {:>12}\n",
            "poller",
            "buffers",
            "mrs",
            "",
            "io_uring enters",
            "transport",
            "conns",
            "commands",
            "errors",
            "rx bytes",
            "read bytes",
            "copied"
        ));
        for p in &ps {
            for (i, t) in p.transports.iter().enumerate() {
                // The poller's own counters on its first line only.
                let (poller, buffers, mrs, enters) = if i == 0 {
                    (
                        p.poller.to_string(),
                        p.buffers_in_use.to_string(),
                        p.mrs_registered.to_string(),
                        p.ring_enters.to_string(),
                    )
                } else {
                    Default::default()
                };
                o.push_str(&format!(
                    "{:>6} {:>8} {:>6} {:>5} {:>16} {:<9} {:>6} {:>12} {:>8} {:>14} {:>14} {:>12}\n",
                    poller,
                    buffers,
                    mrs,
                    "",
                    enters,
                    t.transport,
                    t.connections,
                    t.commands,
                    t.errors,
                    t.rx_bytes,
                    t.tx_payload,
                    t.copied_bytes
                ));
            }
        }
        io_table(&mut o, &self.target.io_metrics());
        if let Some(g) = &self.gateway {
            let g = g();
            o.push_str(&format!(
                "gateway: {} in group {}: serving ANA groups {:?} of {:?}; live peers {:?}; group configuration version {}\n",
                g.name, g.group, g.serving, g.leased, g.peers, g.config_version
            ));
        }
        o
    }

    /// JSON (for `nvmf-target stats --json`):
    /// `{"controllers":N,"cpu_ns":N,"pollers":[{"poller":0,"buffers_in_use":N,
    /// "io_uring_enters":N,"mrs_registered":N,"tcp":{...},"rdma":{...}}],"subsystems":[...]}`
    /// (`cpu_ns`: the daemon's user + system CPU time so far; `rdma` only on a target that
    /// serves it).
    pub fn json(&self) -> String {
        let (ctrls, ps) = self.sample();
        let items: Vec<String> = ps
            .iter()
            .map(|p| {
                let transports: Vec<String> = p
                    .transports
                    .iter()
                    .map(|t| {
                        format!(
                            "\"{}\":{{\"connections\":{},\"commands\":{},\"errors\":{},\"rx_bytes\":{},\"read_payload_bytes\":{},\"copied_bytes\":{}}}",
                            t.transport, t.connections, t.commands, t.errors, t.rx_bytes, t.tx_payload, t.copied_bytes
                        )
                    })
                    .collect();
                format!(
                    "{{\"poller\":{},\"buffers_in_use\":{},\"io_uring_enters\":{},\"mrs_registered\":{},{}}}",
                    p.poller,
                    p.buffers_in_use,
                    p.ring_enters,
                    p.mrs_registered,
                    transports.join(",")
                )
            })
            .collect();
        let gateway = match &self.gateway {
            None => String::new(),
            Some(g) => {
                let g = g();
                let list = |v: &mut dyn Iterator<Item = String>| v.collect::<Vec<_>>().join(",");
                format!(
                    ",\"gateway\":{{\"group\":{},\"name\":{},\"serving\":[{}],\"leased\":[{}],\"peers\":[{}],\"config_version\":{}}}",
                    serde_json::Value::from(g.group.as_str()),
                    serde_json::Value::from(g.name.as_str()),
                    list(&mut g.serving.iter().map(u32::to_string)),
                    list(&mut g.leased.iter().map(u32::to_string)),
                    list(&mut g.peers.iter().map(|p| serde_json::Value::from(p.as_str()).to_string())),
                    g.config_version
                )
            }
        };
        format!(
            "{{\"controllers\":{ctrls},\"cpu_ns\":{},\"pollers\":[{}],\"subsystems\":[{}]{gateway}}}\n",
            process_cpu_ns(),
            items.join(","),
            self.target
                .io_metrics()
                .iter()
                .map(subsystem_json)
                .collect::<Vec<_>>()
                .join(",")
        )
    }
}

/// A Prometheus label value or JSON string body: backslash, double quote and newline escaped.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o
}

fn nsid_label(nsid: u32) -> String {
    if nsid == NSID_OTHER {
        "other".into()
    } else {
        nsid.to_string()
    }
}

fn status_label(code: Option<u16>) -> &'static str {
    match code {
        Some(c) => nvme::status::name(c),
        None => "OTHER",
    }
}

/// Upper bound of histogram bucket `i`, in µs (`None`: +Inf).
fn bucket_bound_us(i: usize) -> Option<u64> {
    (i < LAT_BUCKETS).then(|| LAT_FIRST_US << i)
}

/// The `q` quantile (0..1) from a histogram, as the upper bound of the bucket it falls in
/// (µs; `None` without samples; the last bound doubled for +Inf).
pub fn quantile_us(n: &NsTotals, q: f64) -> Option<u64> {
    let total: u64 = n.lat.iter().sum();
    if total == 0 {
        return None;
    }
    let want = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, c) in n.lat.iter().enumerate() {
        seen += c;
        if seen >= want {
            return Some(bucket_bound_us(i).unwrap_or(LAT_FIRST_US << LAT_BUCKETS));
        }
    }
    None
}

type NsGet = fn(&NsTotals) -> u64;

/// Per-subsystem, per-namespace and per-controller series.
fn io_prometheus(o: &mut String, subs: &[SubsystemMetrics]) {
    let head = |o: &mut String, name: &str, kind: &str, help: &str| {
        o.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
    };
    // Per subsystem and per controller: the same counters, different labels.
    let groups: Vec<(String, &IoTotals)> = subs
        .iter()
        .map(|s| (format!("subsystem=\"{}\"", esc(&s.nqn)), &s.io))
        .collect();
    let ctrl_label = |s: &SubsystemMetrics, c: &ControllerMetrics| {
        format!(
            "subsystem=\"{}\",cntlid=\"{}\",host=\"{}\",transport=\"{}\",peer=\"{}\"",
            esc(&s.nqn),
            c.cntlid,
            esc(&c.hostnqn),
            c.transport,
            esc(&c.peer)
        )
    };
    let ctrls: Vec<(String, &IoTotals)> = subs
        .iter()
        .flat_map(|s| s.controllers.iter().map(move |c| (ctrl_label(s, c), &c.io)))
        .collect();
    let queues: Vec<(String, &IoTotals)> = subs
        .iter()
        .flat_map(|s| {
            s.controllers.iter().flat_map(move |c| {
                c.queues
                    .iter()
                    .map(move |(qid, io)| (format!("{},qid=\"{qid}\"", ctrl_label(s, c)), io))
            })
        })
        .collect();
    for (prefix, what, set) in [
        (
            "nvmf_subsystem",
            "subsystem (every controller it has had)",
            &groups,
        ),
        ("nvmf_controller", "live controller", &ctrls),
        ("nvmf_queue", "live I/O queue", &queues),
    ] {
        let sums: [(&str, &str, NsGet); 3] = [
            ("io_commands_total", "I/O commands completed", |n| {
                n.commands()
            }),
            ("read_bytes_total", "Bytes read by hosts", |n| n.bytes_read),
            ("written_bytes_total", "Bytes written by hosts", |n| {
                n.bytes_written
            }),
        ];
        for (name, help, get) in sums {
            head(
                o,
                &format!("{prefix}_{name}"),
                "counter",
                &format!("{help}, per {what}."),
            );
            for (l, io) in set.iter() {
                o.push_str(&format!("{prefix}_{name}{{{l}}} {}\n", get(&io.io())));
            }
        }
        head(
            o,
            &format!("{prefix}_errors_total"),
            "counter",
            &format!("Commands completed with an error, by status, per {what}."),
        );
        for (l, io) in set.iter() {
            for (code, n) in &io.errors_by_status {
                o.push_str(&format!(
                    "{prefix}_errors_total{{{l},status=\"{}\"}} {n}\n",
                    status_label(*code)
                ));
            }
        }
        head(
            o,
            &format!("{prefix}_outstanding_commands"),
            "gauge",
            &format!("I/O commands in flight (queue depth in use), per {what}."),
        );
        for (l, io) in set.iter() {
            o.push_str(&format!(
                "{prefix}_outstanding_commands{{{l}}} {}\n",
                io.outstanding
            ));
        }
    }
    // Per namespace.
    let ns: [(&str, &str, NsGet); 6] = [
        ("reads_total", "Successful Read commands", |n| n.reads),
        ("writes_total", "Successful Write commands", |n| n.writes),
        (
            "other_commands_total",
            "Successful Flush, Write Zeroes and DSM commands",
            |n| n.others,
        ),
        ("read_bytes_total", "Bytes read by hosts", |n| n.bytes_read),
        ("written_bytes_total", "Bytes written by hosts", |n| {
            n.bytes_written
        }),
        (
            "errors_total",
            "I/O commands completed with an error",
            |n| n.errors,
        ),
    ];
    for (name, help, get) in ns {
        head(
            o,
            &format!("nvmf_namespace_{name}"),
            "counter",
            &format!("{help}, per namespace."),
        );
        for s in subs {
            for (nsid, n) in &s.io.namespaces {
                o.push_str(&format!(
                    "nvmf_namespace_{name}{{subsystem=\"{}\",nsid=\"{}\"}} {}\n",
                    esc(&s.nqn),
                    nsid_label(*nsid),
                    get(n)
                ));
            }
        }
    }
    head(
        o,
        "nvmf_namespace_latency_seconds",
        "histogram",
        "I/O command latency from capsule parsed to completion built, per namespace.",
    );
    for s in subs {
        for (nsid, n) in &s.io.namespaces {
            let l = format!(
                "subsystem=\"{}\",nsid=\"{}\"",
                esc(&s.nqn),
                nsid_label(*nsid)
            );
            let mut cum = 0;
            for (i, c) in n.lat.iter().enumerate() {
                cum += c;
                let le = match bucket_bound_us(i) {
                    Some(us) => format!("{}", us as f64 / 1e6),
                    None => "+Inf".into(),
                };
                o.push_str(&format!(
                    "nvmf_namespace_latency_seconds_bucket{{{l},le=\"{le}\"}} {cum}\n"
                ));
            }
            o.push_str(&format!(
                "nvmf_namespace_latency_seconds_sum{{{l}}} {:.9}\n",
                n.lat_sum_ns as f64 / 1e9
            ));
            o.push_str(&format!(
                "nvmf_namespace_latency_seconds_count{{{l}}} {cum}\n"
            ));
        }
    }
}

fn io_table(o: &mut String, subs: &[SubsystemMetrics]) {
    for s in subs {
        let t = s.io.io();
        o.push_str(&format!(
            "\nsubsystem {}: {} I/O commands, {} bytes read, {} written, {} errors, {} outstanding\n",
            s.nqn,
            t.commands(),
            t.bytes_read,
            t.bytes_written,
            s.io.errors(),
            s.io.outstanding
        ));
        for (code, n) in &s.io.errors_by_status {
            o.push_str(&format!("  errors {}: {n}\n", status_label(*code)));
        }
        o.push_str(&format!(
            "  {:>6} {:>10} {:>10} {:>8} {:>14} {:>14} {:>7} {:>9} {:>9}\n",
            "nsid",
            "reads",
            "writes",
            "other",
            "read bytes",
            "written bytes",
            "errors",
            "p50 us",
            "p99 us"
        ));
        for (nsid, n) in &s.io.namespaces {
            let q = |p| quantile_us(n, p).map_or("-".to_string(), |v| format!("<={v}"));
            o.push_str(&format!(
                "  {:>6} {:>10} {:>10} {:>8} {:>14} {:>14} {:>7} {:>9} {:>9}\n",
                nsid_label(*nsid),
                n.reads,
                n.writes,
                n.others,
                n.bytes_read,
                n.bytes_written,
                n.errors,
                q(0.5),
                q(0.99)
            ));
        }
        for c in &s.controllers {
            let t = c.io.io();
            o.push_str(&format!(
                "  controller {} {} {} {}: {} I/O commands, {} bytes read, {} written, {} errors, {} outstanding\n",
                c.cntlid,
                c.hostnqn,
                c.transport,
                c.peer,
                t.commands(),
                t.bytes_read,
                t.bytes_written,
                c.io.errors(),
                c.io.outstanding
            ));
        }
    }
}

fn errors_json(io: &IoTotals) -> String {
    let items: Vec<String> = io
        .errors_by_status
        .iter()
        .map(|(c, n)| format!("\"{}\":{n}", status_label(*c)))
        .collect();
    format!("{{{}}}", items.join(","))
}

fn subsystem_json(s: &SubsystemMetrics) -> String {
    let t = s.io.io();
    let ns: Vec<String> = s
        .io
        .namespaces
        .iter()
        .map(|(nsid, n)| {
            let q = |p| quantile_us(n, p).map_or("null".to_string(), |v| v.to_string());
            let buckets: Vec<String> = n.lat.iter().map(|c| c.to_string()).collect();
            format!(
                "{{\"nsid\":\"{}\",\"reads\":{},\"writes\":{},\"others\":{},\"bytes_read\":{},\"bytes_written\":{},\"errors\":{},\"latency\":{{\"first_bucket_us\":{LAT_FIRST_US},\"buckets\":[{}],\"sum_ns\":{},\"p50_us_at_most\":{},\"p99_us_at_most\":{}}}}}",
                nsid_label(*nsid), n.reads, n.writes, n.others, n.bytes_read, n.bytes_written, n.errors,
                buckets.join(","), n.lat_sum_ns, q(0.5), q(0.99)
            )
        })
        .collect();
    let ctrls: Vec<String> = s
        .controllers
        .iter()
        .map(|c| {
            let t = c.io.io();
            format!(
                "{{\"cntlid\":{},\"host\":\"{}\",\"transport\":\"{}\",\"peer\":\"{}\",\"commands\":{},\"bytes_read\":{},\"bytes_written\":{},\"errors\":{},\"outstanding\":{}}}",
                c.cntlid, esc(&c.hostnqn), c.transport, esc(&c.peer), t.commands(), t.bytes_read,
                t.bytes_written, errors_json(&c.io), c.io.outstanding
            )
        })
        .collect();
    format!(
        "{{\"nqn\":\"{}\",\"commands\":{},\"bytes_read\":{},\"bytes_written\":{},\"errors\":{},\"outstanding\":{},\"namespaces\":[{}],\"controllers\":[{}]}}",
        esc(&s.nqn),
        t.commands(),
        t.bytes_read,
        t.bytes_written,
        errors_json(&s.io),
        s.io.outstanding,
        ns.join(","),
        ctrls.join(",")
    )
}

/// Serve `GET /metrics` on `listener` until `stop`.
pub fn serve_http(listener: TcpListener, src: Source, stop: Arc<AtomicBool>) {
    let _ = listener.set_nonblocking(true);
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut line = String::new();
                let _ = BufReader::new(&s).read_line(&mut line);
                let (code, body) = if line.starts_with("GET /metrics") {
                    ("200 OK", src.prometheus())
                } else {
                    ("404 Not Found", "only GET /metrics is served\n".to_string())
                };
                let _ = write!(
                    s,
                    "HTTP/1.0 {code}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The control socket: a client writes one line (`stats`, `stats json` or `metrics`) and
/// reads the answer until EOF.
pub fn serve_control(
    path: PathBuf,
    src: Source,
    stop: Arc<AtomicBool>,
    ctl: Option<CtlSender>,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    // Live management changes the target: only its owner (root) may connect.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("nvmf-control".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut line = String::new();
                        let _ = BufReader::new(&s).read_line(&mut line);
                        let body = match line.trim() {
                            "stats json" => src.json(),
                            "metrics" => src.prometheus(),
                            req if req.starts_with('{') => ctl_request(ctl.as_ref(), req),
                            _ => src.table(),
                        };
                        let _ = s.write_all(body.as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
            let _ = std::fs::remove_file(&path);
        })?;
    Ok(())
}

/// Hands a live-management request (one JSON line) to the thread that owns the daemon and
/// returns its answer line; `wake` makes that thread look.
#[derive(Clone)]
pub struct CtlSender {
    pub tx: std::sync::mpsc::Sender<(String, std::sync::mpsc::Sender<String>)>,
    pub wake: Arc<dyn Fn() + Send + Sync>,
}

fn ctl_request(ctl: Option<&CtlSender>, req: &str) -> String {
    let fail = |e: &str| format!("{}\n", serde_json::json!({ "ok": false, "error": e }));
    let Some(c) = ctl else {
        return fail("this daemon takes no management requests");
    };
    let (tx, rx) = std::sync::mpsc::channel();
    if c.tx.send((req.to_owned(), tx)).is_err() {
        return fail("the daemon is shutting down");
    }
    (c.wake)();
    // A change may open storage and bind listeners: give it time.
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(mut answer) => {
            answer.push('\n');
            answer
        }
        Err(_) => fail("no answer from the daemon within 60 s"),
    }
}

/// Client side of the control socket.
pub fn query_control(path: &Path, request: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("{request}\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}
