//! nvmf-target: the NVMe-over-Fabrics target daemon.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use config::Config;
use nix::sys::signal::{SigSet, Signal};
use tracing::{error, info, warn};

use nvmf_target::daemon::Daemon;
use nvmf_target::notify::Notifier;

/// Userspace NVMe-over-Fabrics target (NVMe/TCP, NVMe/RDMA) with an io_uring backend.
///
/// Without --config it serves an embedded default: subsystem nqn.2026-11.io.nvmf-rs:default,
/// any host allowed, one 1 GiB namespace in a temporary file, NVMe/TCP on 127.0.0.1:4420.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// YAML configuration file (see config/REFERENCE.md).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Validate FILE, print the resolved configuration, and exit (non-zero on errors).
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    /// Directory for the embedded default's namespace file (default: $TMPDIR or /tmp).
    #[arg(long, value_name = "DIR")]
    default_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging();

    if let Some(path) = args.check_config {
        return match Config::load(&path) {
            Ok(loaded) => {
                for w in &loaded.warnings {
                    eprintln!("{w}");
                }
                print!("{}", loaded.config.to_yaml());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        };
    }

    let mut temp_file = None;
    let cfg = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(loaded) => {
                for w in &loaded.warnings {
                    warn!("{w}");
                }
                loaded.config
            }
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        },
        None => {
            let dir = args.default_dir.unwrap_or_else(std::env::temp_dir);
            let path = dir.join(format!("nvmf-rs-default-{}.img", std::process::id()));
            info!(namespace = %path.display(), "no --config: serving the embedded default");
            temp_file = Some(path.clone());
            Config::embedded_default(path)
        }
    };

    // Signals are taken synchronously by this thread: block them before any thread starts so
    // every thread inherits the mask.
    let mut sigs = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        sigs.add(s);
    }
    if let Err(e) = sigs.thread_block() {
        error!(error = %e, "cannot block signals");
        return ExitCode::FAILURE;
    }

    let daemon = match Daemon::start(&cfg) {
        Ok(d) => d,
        Err(e) => {
            error!("{e}");
            eprintln!("nvmf-target: {e}");
            if let Some(p) = &temp_file {
                let _ = std::fs::remove_file(p);
            }
            return ExitCode::FAILURE;
        }
    };
    info!(
        subsystems = cfg.subsystems.len(),
        threads = cfg.target.threads,
        "nvmf-target ready"
    );
    let notifier = Notifier::from_env();
    if let Some(n) = &notifier {
        n.notify(&format!(
            "READY=1\nSTATUS=serving {} subsystem(s) on {} listener(s)",
            cfg.subsystems.len(),
            cfg.listeners.len()
        ));
        if let Some(every) = Notifier::watchdog_interval() {
            spawn_watchdog(every / 2);
        }
    }

    loop {
        match sigs.wait() {
            Ok(Signal::SIGHUP) => {
                warn!("SIGHUP: configuration reload is not supported yet; keeping the running configuration");
            }
            Ok(sig) => {
                info!(signal = %sig, "shutting down");
                break;
            }
            Err(e) => {
                error!(error = %e, "sigwait failed");
                break;
            }
        }
    }
    if let Some(n) = &notifier {
        n.notify("STOPPING=1");
    }
    daemon.shutdown();
    if let Some(p) = &temp_file {
        let _ = std::fs::remove_file(p);
    }
    info!("stopped");
    ExitCode::SUCCESS
}

fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// WATCHDOG=1 every `period` from a thread of its own (the daemon is healthy while its threads
/// run; a wedged poller is caught by the keep-alive timers of its hosts).
fn spawn_watchdog(period: std::time::Duration) {
    let _ = std::thread::Builder::new()
        .name("nvmf-watchdog".into())
        .spawn(move || {
            if let Some(n) = Notifier::from_env() {
                loop {
                    n.notify("WATCHDOG=1");
                    std::thread::sleep(period);
                }
            }
        });
}
