//! Command line: fio's option names and meanings, plus the transport selection and target
//! address. Parsing only; [`crate::bench::job::Workload`] checks the combination.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Parser, ValueEnum};
use initiator::{DhchapOptions, TlsOptions};
use zeroize::Zeroizing;

/// Subsystem NQN of nvmf-target's embedded default configuration.
pub const DEFAULT_SUBNQN: &str = "nqn.2026-11.io.nvmf-rs:default";

/// fio-style benchmark for NVMe over Fabrics: runs one workload over each requested transport
/// against an NVMe-oF target and reports IOPS, bandwidth, latency percentiles, CPU time per
/// I/O and payload copies per I/O, side by side.
///
/// Sizes take fio's suffixes (k, m, g, t; powers of 1024: `--bs=4k` is 4096 bytes); times
/// take s (default), ms, us, m, h. Without --runtime a job makes one pass over its region
/// (fio's default); with --runtime it runs for that long (fio's --time_based), wrapping around
/// the region.
///
/// `--output-format=json` prints one JSON document (schema "nvmf-bench/1", documented in
/// bench/src/bench/report.rs). Exit status: 0 when every transport that was available
/// ran without error or verify mismatch, 1 otherwise (or when no transport could run), 2 for
/// bad options.
///
/// DH-HMAC-CHAP: with --dhchap-secret (or --dhchap-secret-file) and --hostnqn, every queue of
/// every connection (admin and I/O, each transport, each job) authenticates when the target
/// asks for it; --dhchap-ctrl-secret makes it bidirectional.
#[derive(Parser, Debug, Clone)]
#[command(name = "nvmf-bench", version, about, long_about)]
#[command(group(
    ArgGroup::new("dhchap_host")
        .args(["dhchap_secret", "dhchap_secret_file"])
        .requires("hostnqn")
))]
#[command(group(
    ArgGroup::new("tls_key")
        .args(["tls_psk", "tls_psk_file"])
        .requires("hostnqn")
))]
pub struct Args {
    /// I/O pattern.
    #[arg(long, alias = "readwrite", value_enum, default_value = "randread")]
    pub rw: Rw,

    /// Percentage of reads in mixed workloads (rw, randrw).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmixread: u8,

    /// Block size of each I/O (a multiple of the namespace's block size).
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    pub bs: u64,

    /// I/Os in flight per job.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub iodepth: u16,

    /// Jobs: one thread and one NVMe I/O queue each.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub numjobs: u16,

    /// Run each transport for this long (fio's --runtime with --time_based).
    #[arg(long, value_parser = parse_duration)]
    pub runtime: Option<Duration>,

    /// Accepted for fio compatibility: with --runtime the run is always time based.
    #[arg(long = "time_based", alias = "time-based")]
    pub time_based: bool,

    /// Run this long before measuring (I/O runs, statistics start afterwards).
    #[arg(long = "ramp_time", alias = "ramp-time", value_parser = parse_duration, default_value = "0")]
    pub ramp_time: Duration,

    /// Bytes of each job's region (default: the namespace from --offset to its end).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,

    /// Byte offset of the region in the namespace.
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub offset: u64,

    /// Job N's region starts at offset + N * offset_increment (fio's option).
    #[arg(long = "offset_increment", alias = "offset-increment", value_parser = parse_size, default_value = "0")]
    pub offset_increment: u64,

    /// Cap each job at this many I/Os per second (fio's `rate_iops`: submissions evenly
    /// spaced, the job sleeping in between): a load below saturation, to measure the CPU per
    /// I/O of both ends there.
    #[arg(long = "rate_iops", alias = "rate-iops", value_parser = clap::value_parser!(u64).range(1..))]
    pub rate_iops: Option<u64>,

    /// Write blocks carrying a header (offset, seed, generation) and a CRC32C; check every
    /// block read. Write workloads read back what they wrote at the end.
    #[arg(long, value_enum)]
    pub verify: Option<VerifyKind>,

    /// Job name (shown in the report).
    #[arg(long)]
    pub name: Option<String>,

    /// Transport to measure (repeatable; default tcp).
    #[arg(long = "transport", value_enum)]
    pub transport: Vec<TransportKind>,

    /// Transports to compare, comma separated (e.g. tcp,rdma).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub compare: Vec<TransportKind>,

    /// Target address.
    #[arg(long, default_value = "127.0.0.1")]
    pub traddr: String,

    /// Target port (transport service id).
    #[arg(long, default_value_t = 4420)]
    pub trsvcid: u16,

    /// Subsystem NQN.
    #[arg(long, default_value = DEFAULT_SUBNQN)]
    pub subnqn: String,

    /// Namespace ID.
    #[arg(long, default_value_t = 1)]
    pub nsid: u32,

    /// Host NQN (default: a UUID-based NQN generated for this run).
    #[arg(long)]
    pub hostnqn: Option<String>,

    /// DH-HMAC-CHAP host secret (nvme-cli's name): `DHHC-1:xx:<base64>:` as `nvme
    /// gen-dhchap-key` prints it, the key the target has for --hostnqn (needed with it). Every
    /// queue the target asks to authenticate does (admin and I/O, both transports, every job).
    /// Other users can see a command line: --dhchap-secret-file keeps it out of it.
    #[arg(long = "dhchap-secret", value_name = "SECRET", value_parser = secret_arg)]
    pub dhchap_secret: Option<SecretArg>,

    /// Read the DH-HMAC-CHAP host secret from this file instead (the DHHC-1 text; readable and
    /// writable by its owner only, mode 0600 or stricter, as the target's key files).
    #[arg(long = "dhchap-secret-file", value_name = "PATH")]
    pub dhchap_secret_file: Option<PathBuf>,

    /// DH-HMAC-CHAP controller secret (nvme-cli's name; the DHHC-1 text): bidirectional
    /// authentication, the controller must prove it has this key too. Needs a host secret.
    #[arg(
        long = "dhchap-ctrl-secret",
        value_name = "SECRET",
        value_parser = secret_arg,
        requires = "dhchap_host"
    )]
    pub dhchap_ctrl_secret: Option<SecretArg>,

    /// NVMe/TCP over TLS 1.3 with this pre-shared key (`NVMeTLSkey-1:01:<base64>:` as `nvme
    /// gen-tls-key` prints it; the key the target has for --hostnqn, needed with it): every
    /// queue of every NVMe/TCP connection (not NVMe/RDMA). --tls-psk-file keeps it off the
    /// command line.
    #[arg(long = "tls-psk", value_name = "KEY", value_parser = secret_arg)]
    pub tls_psk: Option<SecretArg>,

    /// Read the TLS PSK from this file instead (mode 0600 or stricter).
    #[arg(long = "tls-psk-file", value_name = "PATH")]
    pub tls_psk_file: Option<PathBuf>,

    /// The TLS PSK identity to offer: 1 (`NVMe1R0x <hostnqn> <subnqn> <digest>`, what the
    /// Linux host prefers) or 0 (`NVMe0R0x <hostnqn> <subnqn>`).
    #[arg(long = "tls-identity", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub tls_identity: u8,

    /// Secure channel concatenation (nvme-cli's `--concat`): the admin queue's DH-HMAC-CHAP
    /// (--dhchap-secret) negotiates a TLS PSK and every NVMe/TCP queue runs over TLS with it,
    /// no configured PSK needed. The target's listener must take plain connections too
    /// (`tls: allowed`).
    #[arg(long = "concat", requires = "dhchap_host", conflicts_with_all = ["tls_psk", "tls_psk_file"])]
    pub concat: bool,

    /// Negotiate NVMe/TCP header digests.
    #[arg(long = "hdr_digest", alias = "hdr-digest")]
    pub hdr_digest: bool,

    /// Negotiate NVMe/TCP data digests.
    #[arg(long = "data_digest", alias = "data-digest")]
    pub data_digest: bool,

    /// Busy-poll for completions without bound (fio's hipri; the same as --polling busy).
    /// Without it the initiator's default applies: spin up to 50 us while I/O is in flight,
    /// then sleep in the kernel (nvmf_initiator::ConnectOptions::poll_spin).
    #[arg(long)]
    pub hipri: bool,

    /// How the initiator's queues wait for completions (nvmf_initiator::Polling): adaptive
    /// (spin up to --poll_spin, then sleep; stop spinning while spins do not pay), busy (never
    /// sleep; --hipri) or interrupt (always sleep).
    #[arg(long, default_value = "adaptive")]
    pub polling: initiator::Polling,

    /// How long a wait spins while I/O is in flight before it sleeps in the kernel (the
    /// initiator's ConnectOptions::poll_spin; default 50us; 0: always sleep).
    #[arg(long = "poll_spin", alias = "poll-spin", value_parser = parse_duration)]
    pub poll_spin: Option<Duration>,

    /// Fail an I/O (and the run) that takes longer than this.
    #[arg(long = "io_timeout", alias = "io-timeout", value_parser = parse_duration, default_value = "30")]
    pub io_timeout: Duration,

    /// Output format.
    #[arg(
        long = "output-format",
        alias = "output_format",
        value_enum,
        default_value = "normal"
    )]
    pub output_format: OutputFormat,

    /// Draw the latency CDF of every transport on one SVG chart.
    #[arg(long = "latency-plot", alias = "latency_plot", value_name = "FILE.svg")]
    pub latency_plot: Option<PathBuf>,

    /// Also measure a plain loopback TCP socket pair: a stream of the same bytes (bandwidth)
    /// and a ping-pong of bs-sized messages at the same depth (round-trip latency).
    #[arg(long = "raw-tcp-baseline", alias = "raw_tcp_baseline")]
    pub raw_tcp_baseline: bool,

    /// Pin the raw TCP baseline's threads: its server (the target's side) to the first CPU,
    /// its client to the second, as a benchmark script pins the target and the bench (e.g.
    /// `0,1`). Implies --raw-tcp-baseline. Without it the scheduler places them.
    #[arg(long = "raw-tcp-cpus", alias = "raw_tcp_cpus", value_name = "SERVER,CLIENT",
          value_parser = parse_cpu_pair)]
    pub raw_tcp_cpus: Option<(usize, usize)>,

    /// nvmf-target's control socket (its --control-socket): read the target's CPU time and
    /// command count before and after each run and report target CPU per I/O.
    #[arg(long = "target-stats", alias = "target_stats", value_name = "SOCKET")]
    pub target_stats: Option<PathBuf>,

    /// Start nvmf-target (next to this executable) on its embedded default, compare every
    /// transport on 4k randread QD1 and QD32 and 128k read QD8 (5 s each, or --runtime), print
    /// the table, stop the target.
    #[arg(long, conflicts_with_all = ["traddr", "trsvcid", "subnqn", "nsid", "size", "offset", "verify"])]
    pub demo: bool,

    /// The performance matrix in one run and one table: nvmf-target (next to this
    /// executable) with 1 and 2 threads; 4k randread/randwrite QD1 and QD32, 128k read/write
    /// QD8 over NVMe/TCP loopback on a null namespace and a tmpfs file; the raw loopback TCP
    /// stream and ping-pong and a local io_uring on the same file as baselines; ratios to the
    /// goals. --runtime per run (default 2s; baselines half), --hipri applies. With
    /// `--transport rdma` over NVMe/RDMA instead, the target listening on --traddr (default:
    /// the first local address of an RDMA device), with raw-verbs baselines (an RDMA WRITE/READ
    /// stream and a SEND/RECV ping-pong).
    #[arg(long, conflicts_with_all = ["demo", "compare", "trsvcid", "subnqn", "nsid", "size", "offset", "verify", "target_stats"])]
    pub suite: bool,

    /// Directory (on tmpfs) for --suite's file namespace.
    #[arg(long = "suite-dir", value_name = "DIR", default_value = "/dev/shm")]
    pub suite_dir: PathBuf,

    /// Bytes of --suite's file namespace (written in full first).
    #[arg(long = "suite-file-size", value_name = "BYTES", value_parser = parse_size, default_value = "256M")]
    pub suite_file_size: u64,
}

/// fio's `--rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Rw {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Random mixed reads and writes (--rwmixread).
    Randrw,
    /// Sequential mixed reads and writes (--rwmixread).
    #[value(name = "rw", alias = "readwrite")]
    ReadWrite,
}

impl Rw {
    pub fn name(self) -> &'static str {
        match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::Randread => "randread",
            Rw::Randwrite => "randwrite",
            Rw::Randrw => "randrw",
            Rw::ReadWrite => "rw",
        }
    }

    pub fn is_random(self) -> bool {
        matches!(self, Rw::Randread | Rw::Randwrite | Rw::Randrw)
    }

    /// Percentage of reads.
    pub fn read_percent(self, rwmixread: u8) -> u8 {
        match self {
            Rw::Read | Rw::Randread => 100,
            Rw::Write | Rw::Randwrite => 0,
            Rw::Randrw | Rw::ReadWrite => rwmixread,
        }
    }
}

/// `--verify` methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VerifyKind {
    /// Per-block header and CRC32C (Castagnoli) over the block.
    Crc32c,
}

/// Transports the bench knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum TransportKind {
    Tcp,
    Rdma,
}

impl TransportKind {
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Rdma => "rdma",
        }
    }
}

/// `--output-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// fio-like text.
    Normal,
    /// One JSON document (schema nvmf-bench/1).
    Json,
}

/// A secret given on the command line: its `Debug` does not show it, it is zeroed when
/// dropped, and clap never quotes it (it takes any text; [`Args::dhchap`] parses it).
#[derive(Clone)]
pub struct SecretArg(Zeroizing<String>);

impl std::fmt::Debug for SecretArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

fn secret_arg(s: &str) -> Result<SecretArg, std::convert::Infallible> {
    Ok(SecretArg(Zeroizing::new(s.to_owned())))
}

/// Reads a secret file: a regular file only its owner may read or write (mode 0600 or
/// stricter, as nvmf-target's key files).
fn read_secret_file(file: &std::path::Path) -> Result<Zeroizing<String>, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "a secret file must be private to its owner (mode {mode:04o}; chmod 600 it)"
        ));
    }
    std::fs::read_to_string(file)
        .map(Zeroizing::new)
        .map_err(|e| e.to_string())
}

impl Args {
    /// The DH-HMAC-CHAP options of every connection, from --dhchap-secret[-file] and
    /// --dhchap-ctrl-secret (`None` without a host secret). The error names the option and
    /// says what is wrong, never quoting the secret.
    pub fn dhchap(&self) -> Result<Option<DhchapOptions>, String> {
        let reason = |e: initiator::Error| match e {
            initiator::Error::InvalidArgument(m) => m,
            e => e.to_string(),
        };
        let (option, host) = match (&self.dhchap_secret, &self.dhchap_secret_file) {
            (Some(s), _) => ("--dhchap-secret".to_string(), s.0.clone()),
            (None, Some(p)) => {
                let option = format!("--dhchap-secret-file {}", p.display());
                let text = read_secret_file(p).map_err(|e| format!("{option}: {e}"))?;
                (option, text)
            }
            (None, None) if self.dhchap_ctrl_secret.is_some() => {
                return Err(
                    "--dhchap-ctrl-secret needs --dhchap-secret or --dhchap-secret-file".into(),
                )
            }
            (None, None) => return Ok(None),
        };
        let opts =
            DhchapOptions::new(&host, None).map_err(|e| format!("{option}: {}", reason(e)))?;
        match &self.dhchap_ctrl_secret {
            None => Ok(Some(opts)),
            Some(c) => DhchapOptions::new(&host, Some(&c.0))
                .map(Some)
                .map_err(|e| format!("--dhchap-ctrl-secret: {}", reason(e))),
        }
    }

    /// The TLS options of every NVMe/TCP connection, from --tls-psk[-file] and
    /// --tls-identity (`None` without a key). The error names the option, never the key.
    pub fn tls(&self) -> Result<Option<TlsOptions>, String> {
        let (option, text) = match (&self.tls_psk, &self.tls_psk_file) {
            (Some(s), _) => ("--tls-psk".to_string(), s.0.clone()),
            (None, Some(p)) => {
                let option = format!("--tls-psk-file {}", p.display());
                let text = read_secret_file(p).map_err(|e| format!("{option}: {e}"))?;
                (option, text)
            }
            (None, None) => return Ok(None),
        };
        let mut t = TlsOptions::new(&text).map_err(|e| match e {
            initiator::Error::InvalidArgument(m) => format!("{option}: {m}"),
            e => format!("{option}: {e}"),
        })?;
        t.identity = if self.tls_identity == 0 {
            initiator::IdentityVersion::V0
        } else {
            initiator::IdentityVersion::V1
        };
        Ok(Some(t))
    }

    /// The transports asked for, in order, without repeats (default: tcp).
    pub fn transports(&self) -> Vec<TransportKind> {
        let mut out = Vec::new();
        for t in self.transport.iter().chain(&self.compare) {
            if !out.contains(t) {
                out.push(*t);
            }
        }
        if out.is_empty() {
            out.push(TransportKind::Tcp);
        }
        out
    }
}

/// A size with fio's suffixes: k/m/g/t/p (optionally followed by `b` or `ib`), all powers of
/// 1024 (fio's default kb_base).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let split = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (num, suffix) = lower.split_at(split);
    if num.is_empty() {
        return Err(format!("{s:?} is not a size (e.g. 4096, 4k, 1m, 2g)"));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: number out of range"))?;
    let shift = match suffix {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => {
            return Err(format!(
                "{s:?}: unknown size suffix {suffix:?} (use k, m, g, t)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?}: size out of range"))
}

/// A time with fio's suffixes: s (default), ms, us/usec, m/min, h, d; decimals allowed.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a time (e.g. 10, 10s, 500ms, 2m)"))?;
    let secs = match suffix {
        "" | "s" | "sec" => v,
        "ms" | "msec" => v / 1e3,
        "us" | "usec" => v / 1e6,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        "d" => v * 86400.0,
        _ => {
            return Err(format!(
                "{s:?}: unknown time suffix {suffix:?} (use s, ms, us, m, h)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?}: time out of range"))
}

/// `--raw-tcp-cpus`: two CPU numbers, `SERVER,CLIENT`.
fn parse_cpu_pair(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?}: expected two CPU numbers, SERVER,CLIENT (e.g. 0,1)");
    let (a, b) = s.split_once(',').ok_or_else(bad)?;
    Ok((
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    ))
}

impl Args {
    /// The initiator's polling from --polling and --hipri (which means busy).
    pub fn polling(&self) -> initiator::Polling {
        if self.hipri {
            initiator::Polling::Busy
        } else {
            self.polling
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_fio_suffixes() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("128KiB"), Ok(128 << 10));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("k").is_err());
        assert!(parse_size("4x").is_err());
        assert!(parse_size("-4k").is_err());
        assert!(parse_size("99999999999999p").is_err());
    }

    #[test]
    fn durations_use_fio_suffixes() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3y").is_err());
    }

    #[test]
    fn fio_style_command_line() {
        let a = Args::try_parse_from([
            "nvmf-bench",
            "--rw=randread",
            "--bs=4k",
            "--iodepth=32",
            "--runtime=10",
            "--time_based",
            "--ramp_time=2",
            "--compare",
            "tcp,rdma",
            "--transport=tcp",
            "--output-format=json",
        ])
        .unwrap();
        assert_eq!((a.rw, a.bs, a.iodepth), (Rw::Randread, 4096, 32));
        assert_eq!(a.runtime, Some(Duration::from_secs(10)));
        assert_eq!(a.ramp_time, Duration::from_secs(2));
        assert_eq!(
            a.transports(),
            vec![TransportKind::Tcp, TransportKind::Rdma]
        );
        assert_eq!(a.output_format, OutputFormat::Json);
        assert!(Args::try_parse_from(["nvmf-bench", "--rwmixread=101"]).is_err());
        assert!(Args::try_parse_from(["nvmf-bench", "--iodepth=0"]).is_err());
        assert!(Args::try_parse_from(["nvmf-bench", "--rw=sideways"]).is_err());
        assert!(Args::try_parse_from(["nvmf-bench", "--demo", "--traddr=1.2.3.4"]).is_err());
    }

    /// An example key (`nvme gen-dhchap-key` format, SHA-256 transformation).
    const KEY: &str = "DHHC-1:01:YGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn8x9qY5:";
    const HOST: &str = "--hostnqn=nqn.2026-11.io.example:host";

    #[test]
    fn dhchap_secrets_from_the_command_line() {
        let none = Args::try_parse_from(["nvmf-bench"]).unwrap();
        assert!(none.dhchap().unwrap().is_none());

        let a = Args::try_parse_from(["nvmf-bench", HOST, "--dhchap-secret", KEY]).unwrap();
        let d = a.dhchap().unwrap().unwrap();
        assert_eq!(d.secret, nvme::auth::Secret::parse(KEY).unwrap());
        assert!(d.ctrl_secret.is_none());
        assert!(
            !format!("{a:?}").contains(&KEY[10..]),
            "Debug shows the key"
        );

        let a = Args::try_parse_from([
            "nvmf-bench",
            HOST,
            "--dhchap-secret",
            KEY,
            "--dhchap-ctrl-secret",
            KEY,
        ])
        .unwrap();
        assert!(a.dhchap().unwrap().unwrap().ctrl_secret.is_some());

        // The host NQN the target knows the key by is needed; a controller secret needs a
        // host secret; one host secret only.
        assert!(Args::try_parse_from(["nvmf-bench", "--dhchap-secret", KEY]).is_err());
        assert!(Args::try_parse_from(["nvmf-bench", HOST, "--dhchap-ctrl-secret", KEY]).is_err());
        assert!(Args::try_parse_from([
            "nvmf-bench",
            HOST,
            "--dhchap-secret",
            KEY,
            "--dhchap-secret-file",
            "/dev/null"
        ])
        .is_err());
    }

    #[test]
    fn bad_dhchap_secrets_are_named_not_quoted() {
        // One base64 character changed: the CRC no longer matches.
        let typo = KEY.replace("YGFi", "YGFj");
        for (args, want) in [
            (vec!["--dhchap-secret", typo.as_str()], "--dhchap-secret: "),
            (
                vec!["--dhchap-secret", KEY, "--dhchap-ctrl-secret", &typo],
                "--dhchap-ctrl-secret: ",
            ),
        ] {
            let a = Args::try_parse_from(["nvmf-bench", HOST].into_iter().chain(args)).unwrap();
            let e = a.dhchap().unwrap_err();
            assert!(e.starts_with(want) && e.contains("CRC-32"), "{e}");
            assert!(
                !e.contains(&KEY[10..20]) && !e.contains(&typo[10..20]),
                "{e}"
            );
        }
    }

    #[test]
    fn a_dhchap_secret_file_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nvmf-bench-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("key");
        std::fs::write(&file, format!("{KEY}\n")).unwrap();
        let args = |f: &std::path::Path| {
            Args::try_parse_from([
                "nvmf-bench".as_ref(),
                HOST.as_ref(),
                "--dhchap-secret-file".as_ref(),
                f.as_os_str(),
            ])
            .unwrap()
        };
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = args(&file).dhchap().unwrap_err();
        assert!(e.contains("mode 0640; chmod 600"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let d = args(&file).dhchap().unwrap().unwrap();
        assert_eq!(d.secret, nvme::auth::Secret::parse(KEY).unwrap());
        std::fs::write(&file, "not a key\n").unwrap();
        let e = args(&file).dhchap().unwrap_err();
        assert!(
            e.contains("--dhchap-secret-file") && e.contains("DHHC-1:"),
            "{e}"
        );
        let e = args(&dir.join("missing")).dhchap().unwrap_err();
        assert!(e.contains("No such file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
