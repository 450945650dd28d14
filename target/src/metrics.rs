//! Counters for operators: Prometheus text on an optional HTTP endpoint (`metrics.listen`) and
//! the same numbers on a Unix control socket that `nvmf-target stats` reads.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::core::Target;
use crate::transport::poller::PollerStats;
use crate::transport::rdma::RdmaPollerStats;

/// Name, type, help text and getter of one per-poller metric.
type MetricDef = (
    &'static str,
    &'static str,
    &'static str,
    fn(&PollerSample) -> u64,
);

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

/// One poller thread's live counters.
#[derive(Clone)]
pub enum PollerCounters {
    Tcp(Arc<PollerStats>),
    Rdma(Arc<RdmaPollerStats>),
}

impl PollerCounters {
    fn sample(&self, poller: usize) -> PollerSample {
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        match self {
            PollerCounters::Tcp(s) => PollerSample {
                transport: "tcp".into(),
                poller,
                connections: s.connections.load(Ordering::Relaxed) as u64,
                commands: l(&s.commands),
                errors: l(&s.errors),
                rx_bytes: l(&s.rx_bytes),
                tx_payload: l(&s.tx_payload),
                copied_bytes: l(&s.copied_bytes),
                buffers_in_use: s.buffers_in_use.load(Ordering::Relaxed) as u64,
                mrs_registered: 0,
            },
            PollerCounters::Rdma(s) => PollerSample {
                transport: "rdma".into(),
                poller,
                connections: s.connections.load(Ordering::Relaxed) as u64,
                commands: l(&s.commands),
                errors: l(&s.errors),
                rx_bytes: l(&s.rx_bytes),
                tx_payload: l(&s.tx_payload),
                copied_bytes: l(&s.copied_bytes),
                buffers_in_use: s.buffers_in_use.load(Ordering::Relaxed) as u64,
                mrs_registered: s.mrs_registered.load(Ordering::Relaxed) as u64,
            },
        }
    }
}

/// Where the numbers come from.
#[derive(Clone)]
pub struct Source {
    pub target: Arc<Target>,
    /// Every poller thread, TCP first; numbered per transport.
    pub pollers: Vec<PollerCounters>,
}

/// One poller's counters at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PollerSample {
    pub transport: String,
    pub poller: usize,
    pub connections: u64,
    pub commands: u64,
    pub errors: u64,
    pub rx_bytes: u64,
    pub tx_payload: u64,
    pub copied_bytes: u64,
    pub buffers_in_use: u64,
    /// RDMA memory regions registered now (0 on TCP).
    pub mrs_registered: u64,
}

impl Source {
    pub fn sample(&self) -> (u64, Vec<PollerSample>) {
        let (mut tcp, mut rdma) = (0, 0);
        let ps = self
            .pollers
            .iter()
            .map(|c| {
                let n = match c {
                    PollerCounters::Tcp(_) => &mut tcp,
                    PollerCounters::Rdma(_) => &mut rdma,
                };
                *n += 1;
                c.sample(*n - 1)
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
        let metrics: [MetricDef; 8] = [
            (
                "nvmf_connections",
                "gauge",
                "Open queue connections.",
                |p| p.connections,
            ),
            (
                "nvmf_commands_total",
                "counter",
                "Commands received.",
                |p| p.commands,
            ),
            (
                "nvmf_errors_total",
                "counter",
                "Commands completed with an error status, and protocol errors.",
                |p| p.errors,
            ),
            (
                "nvmf_rx_bytes_total",
                "counter",
                "Bytes received from hosts.",
                |p| p.rx_bytes,
            ),
            (
                "nvmf_read_payload_bytes_total",
                "counter",
                "Read data bytes sent to hosts.",
                |p| p.tx_payload,
            ),
            (
                "nvmf_copied_bytes_total",
                "counter",
                "Payload bytes copied by the CPU in user space.",
                |p| p.copied_bytes,
            ),
            (
                "nvmf_buffers_in_use",
                "gauge",
                "Registered I/O buffers held by commands.",
                |p| p.buffers_in_use,
            ),
            (
                "nvmf_rdma_mrs_registered",
                "gauge",
                "RDMA memory regions registered now (pool, per-connection rings, per-I/O READ sinks).",
                |p| p.mrs_registered,
            ),
        ];
        for (name, kind, help, get) in metrics {
            o.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for p in &ps {
                o.push_str(&format!(
                    "{name}{{transport=\"{}\",poller=\"{}\"}} {}\n",
                    p.transport,
                    p.poller,
                    get(p)
                ));
            }
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
            "{:<9} {:>6} {:>6} {:>12} {:>8} {:>14} {:>14} {:>12} {:>8} {:>5}\n",
            "transport",
            "poller",
            "conns",
            "commands",
            "errors",
            "rx bytes",
            "read bytes",
            "copied",
            "buffers",
            "mrs"
        ));
        for p in &ps {
            o.push_str(&format!(
                "{:<9} {:>6} {:>6} {:>12} {:>8} {:>14} {:>14} {:>12} {:>8} {:>5}\n",
                p.transport,
                p.poller,
                p.connections,
                p.commands,
                p.errors,
                p.rx_bytes,
                p.tx_payload,
                p.copied_bytes,
                p.buffers_in_use,
                p.mrs_registered
            ));
        }
        o
    }

    /// JSON (for `nvmf-target stats --json`):
    /// `{"controllers":N,"cpu_ns":N,"pollers":[{...}]}` (`cpu_ns`: the daemon's user + system
    /// CPU time so far).
    pub fn json(&self) -> String {
        let (ctrls, ps) = self.sample();
        let items: Vec<String> = ps
            .iter()
            .map(|p| {
                format!(
                    "{{\"transport\":\"{}\",\"poller\":{},\"connections\":{},\"commands\":{},\"errors\":{},\"rx_bytes\":{},\"read_payload_bytes\":{},\"copied_bytes\":{},\"buffers_in_use\":{},\"mrs_registered\":{}}}",
                    p.transport, p.poller, p.connections, p.commands, p.errors, p.rx_bytes, p.tx_payload, p.copied_bytes, p.buffers_in_use, p.mrs_registered
                )
            })
            .collect();
        format!(
            "{{\"controllers\":{ctrls},\"cpu_ns\":{},\"pollers\":[{}]}}\n",
            process_cpu_ns(),
            items.join(",")
        )
    }
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
pub fn serve_control(path: PathBuf, src: Source, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
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
