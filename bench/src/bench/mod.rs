//! nvmf-bench: the pieces of the binary.
//!
//! - [`args`]: the command line (fio's option names).
//! - [`engine`]: the transport-agnostic queue interface a job drives, and [`engine::open`]
//!   which connects one transport (or says why it cannot run here).
//! - [`job`]: a workload and the per-thread I/O loop; [`run`]: one workload on one transport.
//! - [`pattern`]: offsets, data and the `--verify` block format.
//! - [`baseline`]: `--raw-tcp-baseline`; [`report`]: text and JSON; [`plot`]: the SVG CDF;
//!   [`demo`](mod@demo): `--demo`'s target process; [`target_stats`]: the target's CPU per I/O from
//!   its control socket; [`suite`]: `--suite`, with [`local`] (io_uring on a local file).

pub mod args;
pub mod baseline;
pub mod demo;
pub mod engine;
pub mod job;
pub mod local;
pub mod pattern;
pub mod plot;
pub mod rdma_baseline;
pub mod report;
pub mod run;
pub mod suite;
pub mod target_stats;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use args::{Args, OutputFormat, Rw, TransportKind};
use engine::TargetSpec;
use job::Workload;
use report::WorkloadOutcome;
use run::Outcome;

/// Exit status for bad options (clap's own).
const EXIT_USAGE: u8 = 2;

/// Write to stdout; a closed stdout (`| head`) is not an error worth a panic.
fn emit(s: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(s.as_bytes()).and_then(|()| o.flush());
}

/// What to run.
struct Plan {
    target: TargetSpec,
    workloads: Vec<Workload>,
    transports: Vec<TransportKind>,
    baseline: bool,
    /// Where the baseline's server and client threads run (`--raw-tcp-cpus`).
    baseline_cpus: Option<(usize, usize)>,
    format: OutputFormat,
}

fn target_spec(a: &Args, dhchap: &Option<initiator::DhchapOptions>) -> TargetSpec {
    TargetSpec {
        traddr: a.traddr.clone(),
        rdma_traddr: None,
        trsvcid: a.trsvcid,
        subnqn: a.subnqn.clone(),
        hostnqn: a.hostnqn.clone(),
        dhchap: dhchap.clone(),
        tls: None,
        concat: a.concat,
        nsid: a.nsid,
        hdr_digest: a.hdr_digest,
        data_digest: a.data_digest,
        polling: a.polling(),
        poll_spin: a.poll_spin,
        io_timeout: a.io_timeout,
        stats_socket: a.target_stats.clone(),
    }
}

/// Run every workload on every transport (plus the baseline), printing text summaries as
/// they finish.
fn execute(plan: &Plan) -> Vec<WorkloadOutcome> {
    let text = plan.format == OutputFormat::Normal;
    let mut out = Vec::with_capacity(plan.workloads.len());
    for w in &plan.workloads {
        let mut results = Vec::new();
        for &kind in &plan.transports {
            let r = run::run(kind, &plan.target, w);
            if let Outcome::Ran(m) = &r {
                if let Some(v) = &m.verify {
                    for (job, off, e) in &v.first {
                        eprintln!(
                            "nvmf-bench: verify: {} [{}] job {job}: offset {off} ({off:#x}): {e}",
                            w.name,
                            kind.name()
                        );
                    }
                    if v.mismatches > v.first.len() as u64 {
                        eprintln!(
                            "nvmf-bench: verify: {} more mismatches not shown",
                            v.mismatches - v.first.len() as u64
                        );
                    }
                }
                for e in &m.errors {
                    eprintln!("nvmf-bench: {} [{}]: {e}", w.name, kind.name());
                }
            }
            match &r {
                Outcome::Failed(e) => eprintln!("nvmf-bench: {} [{}]: {e}", w.name, kind.name()),
                Outcome::Skipped(why) => {
                    eprintln!("nvmf-bench: {} [{}]: skipped: {why}", w.name, kind.name())
                }
                Outcome::Ran(_) => {}
            }
            if text {
                emit(&report::transport_text(w, kind, &r));
            }
            results.push((kind, r));
        }
        let baseline = plan.baseline.then(|| {
            let each = w.runtime.unwrap_or(Duration::from_secs(2)) / 2;
            let reads = w.rw.read_percent(w.rwmixread) >= 50;
            let b = baseline::run(
                w.bs as usize,
                w.iodepth as usize,
                w.numjobs as usize,
                reads,
                plan.target.polling == initiator::Polling::Busy,
                each.max(Duration::from_millis(200)),
                plan.baseline_cpus,
            )
            .map_err(|e| e.to_string());
            if text {
                emit(&report::baseline_text(&b));
            }
            b
        });
        if text {
            emit("\n");
        }
        out.push(WorkloadOutcome {
            workload: w.clone(),
            results,
            baseline,
        });
    }
    out
}

/// Print the table / JSON, write the plot; the exit status.
fn finish(plan: &Plan, outcomes: &[WorkloadOutcome], plot: Option<&std::path::Path>) -> ExitCode {
    match plan.format {
        OutputFormat::Normal => {
            let rows: usize = outcomes
                .iter()
                .map(|o| o.results.len() + 2 * o.baseline.is_some() as usize)
                .sum();
            if rows > 1 {
                emit(&report::table(outcomes));
            }
        }
        OutputFormat::Json => {
            let r = report::json(&plan.target, outcomes);
            match serde_json::to_string_pretty(&r) {
                Ok(s) => emit(&(s + "\n")),
                Err(e) => {
                    eprintln!("nvmf-bench: JSON output: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    let mut status = ExitCode::SUCCESS;
    if let Some(path) = plot {
        // One colour per workload when there are several (the transport is told by the
        // dash), one per transport otherwise; raw-TCP baselines are dashed in their
        // workload's colour.
        let by_workload = outcomes.len() > 1;
        let mut curves = Vec::new();
        for (wi, o) in outcomes.iter().enumerate() {
            let mut ran = 0;
            for (k, r) in &o.results {
                if let Outcome::Ran(m) = r {
                    let (color, dash) = if by_workload {
                        (wi, (ran > 0).then_some(plot::DASH_ALT))
                    } else {
                        (ran, None)
                    };
                    curves.push((
                        format!("{} {}", o.workload.name, k.name()),
                        m.total().hist,
                        color,
                        dash,
                    ));
                    ran += 1;
                }
            }
            if let Some(Ok(b)) = &o.baseline {
                curves.push((
                    format!("{} raw-tcp ping-pong", o.workload.name),
                    b.pingpong.stats.hist.clone(),
                    if by_workload { wi } else { 0 },
                    Some(plot::DASH_BASELINE),
                ));
            }
        }
        let series: Vec<plot::Series<'_>> = curves
            .iter()
            .map(|(label, hist, color, dash)| plot::Series {
                label: label.clone(),
                hist,
                color: *color,
                dash: *dash,
            })
            .collect();
        let title = "nvmf-bench latency CDF";
        if let Err(e) = std::fs::write(path, plot::svg(title, &series)) {
            eprintln!("nvmf-bench: {}: {e}", path.display());
            status = ExitCode::FAILURE;
        }
    }
    let mut ran = 0;
    for o in outcomes {
        for (_, r) in &o.results {
            match r {
                Outcome::Ran(m) if m.ok() => ran += 1,
                Outcome::Ran(_) | Outcome::Failed(_) => status = ExitCode::FAILURE,
                Outcome::Skipped(_) => {}
            }
        }
        if let Some(Err(_)) = &o.baseline {
            status = ExitCode::FAILURE;
        }
    }
    if ran == 0 && status == ExitCode::SUCCESS {
        eprintln!("nvmf-bench: no transport could run");
        status = ExitCode::FAILURE;
    }
    status
}

/// `--demo`.
fn demo(a: &Args, dhchap: &Option<initiator::DhchapOptions>) -> ExitCode {
    let transports = if a.transport.is_empty() && a.compare.is_empty() {
        vec![TransportKind::Tcp, TransportKind::Rdma]
    } else {
        a.transports()
    };
    let rdma = if transports.contains(&TransportKind::Rdma) {
        demo::rdma_local_addr()
    } else {
        None
    };
    let target = match demo::TargetProcess::start(rdma) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("nvmf-bench --demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = a.runtime.unwrap_or(Duration::from_secs(5));
    let mk = |rw: Rw, bs: u64, qd: u16| {
        let w = Workload {
            name: String::new(),
            rw,
            rwmixread: 50,
            bs,
            iodepth: qd,
            numjobs: a.numjobs,
            runtime: Some(runtime),
            ramp: a.ramp_time,
            size: None,
            offset: 0,
            offset_increment: 0,
            verify: false,
            rate_iops: None,
        };
        Workload {
            name: w.label(),
            ..w
        }
    };
    let plan = Plan {
        target: TargetSpec {
            traddr: "127.0.0.1".into(),
            trsvcid: target.port,
            rdma_traddr: target.rdma_addr.map(|ip| ip.to_string()),
            subnqn: args::DEFAULT_SUBNQN.into(),
            nsid: 1,
            stats_socket: Some(target.control.clone()),
            ..target_spec(a, dhchap)
        },
        workloads: vec![
            mk(Rw::Randread, 4096, 1),
            mk(Rw::Randread, 4096, 32),
            mk(Rw::Read, 128 << 10, 8),
        ],
        transports,
        baseline: true,
        baseline_cpus: None,
        format: a.output_format,
    };
    let intro = format!(
        "nvmf-bench --demo: nvmf-target (pid {}) on 127.0.0.1:{} ({}), subsystem {}, {:.0?} per run",
        target.pid(),
        target.port,
        target.how,
        plan.target.subnqn,
        runtime
    );
    if plan.format == OutputFormat::Normal {
        emit(&format!("{intro}\n\n"));
    } else {
        eprintln!("{intro}");
    }
    let outcomes = execute(&plan);
    let status = finish(&plan, &outcomes, a.latency_plot.as_deref());
    match target.stop() {
        Ok(()) => status,
        Err(e) => {
            eprintln!("nvmf-bench --demo: {e}");
            ExitCode::FAILURE
        }
    }
}

pub fn main() -> ExitCode {
    let a = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    // The secrets are parsed (or read) once, before anything connects; a bad one is a usage
    // error that says what is wrong without quoting it.
    let dhchap = match a.dhchap() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("nvmf-bench: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let tls = match a.tls() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("nvmf-bench: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if a.demo {
        return demo(&a, &dhchap);
    }
    if a.suite {
        let rdma = match a.transports().as_slice() {
            [TransportKind::Tcp] => None,
            [TransportKind::Rdma] => match suite_rdma_addr(&a.traddr) {
                Ok(ip) => Some(ip),
                Err(e) => {
                    eprintln!("nvmf-bench --suite: {e}");
                    return ExitCode::FAILURE;
                }
            },
            _ => {
                eprintln!("nvmf-bench --suite: one --transport at a time (tcp or rdma)");
                return ExitCode::from(EXIT_USAGE);
            }
        };
        if rdma.is_none() && a.traddr != "127.0.0.1" {
            eprintln!("nvmf-bench --suite: over tcp the suite runs on 127.0.0.1 (--traddr is for --transport rdma)");
            return ExitCode::from(EXIT_USAGE);
        }
        let o = suite::SuiteOpts {
            runtime: a.runtime.unwrap_or(Duration::from_secs(2)),
            ramp: a.ramp_time,
            polling: a.polling(),
            io_timeout: a.io_timeout,
            file_dir: a.suite_dir.clone(),
            file_size: a.suite_file_size,
            rdma,
            dhchap,
        };
        return match suite::run(&o) {
            Ok((table, ok)) => {
                emit(&table);
                if ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("nvmf-bench --suite: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let w = match Workload::from_args(&a) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("nvmf-bench: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let plan = Plan {
        target: TargetSpec {
            tls,
            ..target_spec(&a, &dhchap)
        },
        workloads: vec![w],
        transports: a.transports(),
        baseline: a.raw_tcp_baseline || a.raw_tcp_cpus.is_some(),
        baseline_cpus: a.raw_tcp_cpus,
        format: a.output_format,
    };
    let outcomes = execute(&plan);
    finish(&plan, &outcomes, a.latency_plot.as_deref())
}

/// `--suite --transport rdma`'s address: --traddr when given (anything but the default
/// 127.0.0.1), else the first local address of an RDMA device.
fn suite_rdma_addr(traddr: &str) -> Result<std::net::IpAddr, String> {
    if traddr != "127.0.0.1" {
        return traddr
            .parse()
            .map_err(|e| format!("--traddr {traddr}: {e} (an IP address of an RDMA device)"));
    }
    demo::rdma_local_addr()
        .map(std::net::IpAddr::V4)
        .ok_or_else(|| "no RDMA device with an IPv4 address here (give --traddr)".to_string())
}
