//! nvmf-target: the NVMe-over-Fabrics target daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Parser;
use config::Config;
use nix::sys::signal::{SigSet, Signal};
use tracing::{error, info, warn};

use nvmf_target::ctl;
use nvmf_target::daemon::Daemon;
use nvmf_target::metrics;
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
    /// Unix socket where the daemon answers `nvmf-target stats`.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_CONTROL, global = true)]
    control_socket: PathBuf,
    #[command(subcommand)]
    command: Option<Cmd>,
}

const DEFAULT_CONTROL: &str = "/run/nvmf-target.sock";

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Print the running daemon's counters (read from --control-socket).
    Stats {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Prometheus text format.
        #[arg(long, conflicts_with = "json")]
        prometheus: bool,
    },
    /// Change the running target (through --control-socket), as SIGHUP would after an edit of
    /// its file; `--persist` also writes the result to its --config file (old one kept as .bak).
    Ctl {
        /// Write the resulting configuration back to the daemon's --config file.
        #[arg(long, global = true)]
        persist: bool,
        /// Print the daemon's JSON answer (for `list`: the configuration as JSON).
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        op: ctl::Op,
    },
    /// Print the configuration equivalent to an `nvmetcli save` file (the Linux kernel
    /// target's saved JSON), naming on standard error everything it cannot carry over.
    ImportNvmetcli {
        /// The JSON `nvmetcli save` wrote.
        file: PathBuf,
    },
}

/// `nvmf-target ctl ...`: one request, one answer.
fn run_ctl(socket: &std::path::Path, persist: bool, json: bool, op: &ctl::Op) -> ExitCode {
    let req = ctl::Request {
        version: ctl::VERSION,
        op: op.clone(),
        persist,
    };
    let line = serde_json::to_string(&req).expect("requests serialize");
    let answer = match metrics::query_control(socket, &line) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "nvmf-target ctl: cannot reach the daemon at {}: {e}",
                socket.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let v: serde_json::Value = match serde_json::from_str(answer.trim()) {
        Ok(v) => v,
        Err(_) => {
            eprintln!("nvmf-target ctl: unexpected answer: {}", answer.trim());
            return ExitCode::FAILURE;
        }
    };
    if v["ok"] != serde_json::Value::Bool(true) {
        eprintln!(
            "nvmf-target ctl: {}",
            v["error"].as_str().unwrap_or("refused")
        );
        return ExitCode::from(2);
    }
    if *op == ctl::Op::List && !json {
        print!("{}", v["yaml"].as_str().unwrap_or_default());
    } else {
        println!("{}", answer.trim());
    }
    ExitCode::SUCCESS
}

/// One management request on the daemon's thread: the answer line (JSON).
fn handle_ctl(
    daemon: &mut Daemon,
    gateway: Option<&nvmf_target::gateway::Gateway>,
    config_path: Option<&std::path::Path>,
    line: &str,
) -> String {
    use serde_json::json;
    let fail = |e: String| json!({ "ok": false, "error": e }).to_string();
    let req: ctl::Request = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => return fail(format!("bad request: {e}")),
    };
    if req.version != ctl::VERSION {
        return fail(format!(
            "protocol version {} is not spoken here (this daemon speaks {})",
            req.version,
            ctl::VERSION
        ));
    }
    if !req.op.changes() {
        let cfg = daemon.config();
        return json!({ "ok": true, "config": cfg, "yaml": cfg.to_yaml() }).to_string();
    }
    if req.persist && config_path.is_none() {
        return fail(
            "--persist: the daemon runs the embedded default, it has no --config file".into(),
        );
    }
    let new = match ctl::apply(daemon.config(), &req.op) {
        Ok(n) => n,
        Err(e) => return fail(e),
    };
    match new.validate() {
        Ok(warnings) => {
            for w in warnings {
                warn!("ctl: {w}");
            }
        }
        Err(e) => return fail(e.to_string().trim().to_owned()),
    }
    info!(op = ?req.op, "ctl: applying a change");
    if let Err(e) = ctl::prepare(&new, &req.op) {
        return fail(format!("{e}; the running configuration is unchanged"));
    }
    // A gateway's subsystems are the group's: the change goes to RADOS first (every gateway
    // applies it), refused if another gateway changed them meanwhile.
    if let Some(gw) = gateway {
        if new.subsystems != daemon.config().subsystems {
            if let Err(e) = gw.store_subsystems(&new.subsystems) {
                return fail(format!(
                    "the gateway group's configuration: {e}; the running configuration is unchanged"
                ));
            }
        }
    }
    let report = match daemon.reload(&new) {
        Ok(r) => r,
        Err(e) => return fail(format!("{e}; the running configuration is unchanged")),
    };
    let mut persisted = None;
    if req.persist {
        let path = config_path.expect("checked above");
        if let Err(e) = ctl::persist(daemon.config(), path) {
            return fail(format!(
                "applied, but writing {} failed: {e}",
                path.display()
            ));
        }
        persisted = Some(path.display().to_string());
    }
    let c = &report.core;
    json!({
        "ok": true,
        "persisted": persisted,
        "subsystems_added": c.subsystems_added,
        "subsystems_removed": c.subsystems_removed,
        "namespaces_changed": c.namespaces_changed,
        "hosts_changed": c.hosts_changed,
        "listeners_added": report.listeners_added.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "listeners_removed": report.listeners_removed.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "ana_changed": c.ana_changed.iter().map(|l| format!("{}:{}", l.traddr, l.trsvcid)).collect::<Vec<_>>(),
    })
    .to_string()
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging();

    if let Some(Cmd::Stats { json, prometheus }) = args.command {
        let req = if json {
            "stats json"
        } else if prometheus {
            "metrics"
        } else {
            "stats"
        };
        return match nvmf_target::metrics::query_control(&args.control_socket, req) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "nvmf-target stats: cannot reach the daemon at {}: {e}",
                    args.control_socket.display()
                );
                ExitCode::FAILURE
            }
        };
    }

    if let Some(Cmd::Ctl { persist, json, op }) = &args.command {
        return run_ctl(&args.control_socket, *persist, *json, op);
    }

    if let Some(Cmd::ImportNvmetcli { file }) = &args.command {
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("nvmf-target import-nvmetcli: {}: {e}", file.display());
                return ExitCode::from(2);
            }
        };
        return match config::nvmetcli::import(&text) {
            Ok(imp) => {
                for n in &imp.notes {
                    eprintln!("not carried over: {n}");
                }
                print!("{}", imp.yaml);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nvmf-target import-nvmetcli: {}: {e}", file.display());
                ExitCode::from(2)
            }
        };
    }

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
    let mut cfg = match &args.config {
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
            let mut cfg = Config::embedded_default(path);
            // NVMe/RDMA on every RDMA device that has an IPv4 address (none on machines
            // without RDMA: the default then serves NVMe/TCP only).
            for a in nvmf_target::transport::rdma::local_rdma_ipv4() {
                info!(address = %a.addr, device = %a.device, "embedded default: NVMe/RDMA listener");
                cfg.listeners.push(config::Listener::new(
                    config::Transport::Rdma,
                    a.addr.into(),
                    4420,
                ));
            }
            cfg
        }
    };

    // Signals are taken synchronously by this thread: block them before any thread starts so
    // every thread inherits the mask.
    let mut sigs = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGUSR1,
    ] {
        sigs.add(s);
    }
    if let Err(e) = sigs.thread_block() {
        error!(error = %e, "cannot block signals");
        return ExitCode::FAILURE;
    }

    // Bind the metrics port before the NVMe listeners, so "listening" means both are up.
    let metrics_listener = match &cfg.metrics {
        Some(m) => match std::net::TcpListener::bind(m.listen) {
            Ok(l) => Some((l, m.listen)),
            Err(e) => {
                eprintln!("nvmf-target: metrics endpoint {}: {e}", m.listen);
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    // A gateway joins its group first: the group's configuration may hold its subsystems.
    let mut gateway = None;
    if cfg.gateway.is_some() {
        let joined =
            nvmf_target::gateway::Gateway::join(&cfg).and_then(|(gw, run)| match run.validate() {
                Ok(warnings) => {
                    for w in warnings {
                        warn!("{w}");
                    }
                    Ok((gw, run))
                }
                Err(e) => {
                    gw.stop();
                    Err(format!(
                        "the group's configuration with this gateway's file: {}",
                        e.to_string().trim()
                    ))
                }
            });
        match joined {
            Ok((gw, run)) => {
                cfg = run;
                gateway = Some(gw);
            }
            Err(e) => {
                error!("{e}");
                eprintln!("nvmf-target: {e}");
                if let Some(p) = &temp_file {
                    let _ = std::fs::remove_file(p);
                }
                return ExitCode::FAILURE;
            }
        }
    }
    let resv = gateway
        .as_ref()
        .map(|g| g.resv_store() as Arc<dyn nvmf_target::core::ResvStore>);
    let mut daemon = match Daemon::start_with(&cfg, resv) {
        Ok(d) => d,
        Err(e) => {
            if let Some(gw) = gateway.take() {
                gw.stop();
            }
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
        polling = %cfg.target.polling,
        "nvmf-target ready"
    );
    let stop_aux = Arc::new(AtomicBool::new(false));
    let src = metrics::Source {
        target: daemon.target().clone(),
        pollers: daemon.poller_stats(),
        rdma: daemon.has_rdma(),
        gateway: gateway.as_ref().map(|g| g.status_reader()),
    };
    // Management requests come from the control thread; SIGUSR1 makes this thread look.
    let (ctl_tx, ctl_rx) = std::sync::mpsc::channel::<(String, std::sync::mpsc::Sender<String>)>();
    let ctl_sender = metrics::CtlSender {
        tx: ctl_tx,
        wake: Arc::new(|| {
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGUSR1);
        }),
    };
    if let Err(e) = metrics::serve_control(
        args.control_socket.clone(),
        src.clone(),
        stop_aux.clone(),
        Some(ctl_sender),
    ) {
        warn!(path = %args.control_socket.display(), error = %e, "no control socket: `nvmf-target stats` will not reach this daemon");
    }
    if let Some((l, addr)) = metrics_listener {
        info!(address = %addr, "metrics endpoint up (GET /metrics)");
        let (src, stop) = (src.clone(), stop_aux.clone());
        let _ = std::thread::Builder::new()
            .name("nvmf-metrics".into())
            .spawn(move || metrics::serve_http(l, src, stop));
    }
    // Storage that changes by itself (an RBD image resized elsewhere) wakes this thread too.
    daemon.on_storage_change(|| {
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGUSR1);
    });
    // The gateway's member thread: leases decide which ANA groups it serves; a new view or
    // group configuration wakes this thread.
    if let (Some(gw), Some(g)) = (gateway.as_mut(), cfg.gateway.as_ref()) {
        let ran = gw.run(
            nvmf_target::daemon::leased_groups(daemon.config()),
            daemon.peer_listeners(),
            daemon.target().leases(),
            || {
                let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGUSR1);
            },
        );
        if let Err(e) = ran {
            error!("{e}");
            eprintln!("nvmf-target: {e}");
            stop_aux.store(true, Ordering::Relaxed);
            daemon.shutdown();
            if let Some(gw) = gateway.take() {
                gw.stop();
            }
            if let Some(p) = &temp_file {
                let _ = std::fs::remove_file(p);
            }
            return ExitCode::FAILURE;
        }
        info!(group = %g.group, name = %g.name, home = ?g.ana_groups, "joined the gateway group");
    }
    let gateway_update = |daemon: &Daemon| {
        if let Some(gw) = &gateway {
            gw.update(
                nvmf_target::daemon::leased_groups(daemon.config()),
                daemon.peer_listeners(),
            );
        }
    };
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
                let Some(path) = &args.config else {
                    warn!("SIGHUP: running the embedded default (no --config): nothing to reload");
                    continue;
                };
                if let Some(n) = &notifier {
                    n.notify(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
                }
                reload(&mut daemon, path);
                gateway_update(&daemon);
                if let Some(n) = &notifier {
                    n.notify(&format!(
                        "READY=1\nSTATUS=serving {} subsystem(s) on {} listener(s)",
                        daemon.target().subsystem_nqns().len(),
                        daemon.listener_count()
                    ));
                }
            }
            Ok(Signal::SIGUSR1) => {
                while let Ok((line, reply)) = ctl_rx.try_recv() {
                    let answer =
                        handle_ctl(&mut daemon, gateway.as_ref(), args.config.as_deref(), &line);
                    let _ = reply.send(answer);
                    gateway_update(&daemon);
                }
                if let Some(subs) = gateway.as_ref().and_then(|g| g.take_subsystems()) {
                    let mut new = daemon.config().clone();
                    new.subsystems = subs;
                    let checked = new.validate().map_err(|e| e.to_string().trim().to_owned());
                    match checked.and_then(|_| daemon.reload(&new).map_err(|e| e.to_string())) {
                        Ok(r) => info!(
                            subsystems_added = ?r.core.subsystems_added,
                            subsystems_removed = ?r.core.subsystems_removed,
                            hosts_changed = ?r.core.hosts_changed,
                            namespaces_changed = ?r.core.namespaces_changed,
                            "gateway group: the group's configuration applied"
                        ),
                        Err(e) => error!("gateway group: the group's configuration cannot be applied here: {e}; running the previous one"),
                    }
                    gateway_update(&daemon);
                }
                if let Some(gw) = &gateway {
                    if let Some(view) = gw.take_view() {
                        let owned = view.owned.clone();
                        let before = daemon.owned_groups();
                        let peers: Vec<String> =
                            view.peers.iter().map(|p| p.name.clone()).collect();
                        match daemon.apply_gateway_view(view) {
                            Ok(_) => {
                                info!(optimized = ?owned, ?peers, "gateway group: ANA states applied")
                            }
                            Err(e) => error!("gateway group: cannot apply the ANA states: {e}"),
                        }
                        // What this gateway gave up drains before the member hands it over.
                        let released: std::collections::BTreeSet<u32> =
                            before.difference(&owned).copied().collect();
                        if !released.is_empty() {
                            daemon.drain_groups(&released, std::time::Duration::from_secs(2));
                        }
                        gw.applied(daemon.owned_groups());
                    }
                }
                match daemon.refresh_storage() {
                    None => {}
                    Some(Ok(r)) => {
                        for (nqn, nsids) in &r.core.namespaces_changed {
                            info!(subsystem = %nqn, ?nsids, "storage changed: namespaces opened again at their new size (hosts notified)");
                        }
                    }
                    Some(Err(e)) => {
                        error!("storage changed, but the namespaces could not be opened again: {e}; they keep their old size");
                    }
                }
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
    stop_aux.store(true, Ordering::Relaxed);
    // Closing the storage may need it to answer (an RBD image gives back its exclusive lock,
    // librbd finishes what is in flight): bounded, so a cluster that is gone does not keep the
    // process from exiting. The pollers themselves stop at once.
    let (closed_tx, closed_rx) = std::sync::mpsc::channel();
    let closer = std::thread::Builder::new()
        .name("nvmf-close".into())
        .spawn(move || {
            daemon.shutdown();
            // Leases go after the storage is closed: the peers that take the groups over find
            // the images' locks given back.
            if let Some(gw) = gateway {
                gw.stop();
            }
            let _ = closed_tx.send(());
        });
    match closer {
        Ok(_) => {
            if closed_rx
                .recv_timeout(std::time::Duration::from_secs(15))
                .is_err()
            {
                warn!("storage not closed after 15 s (an RBD cluster that does not answer?); exiting without it");
            }
        }
        Err(e) => error!(error = %e, "cannot start the closing thread"),
    }
    if let Some(p) = &temp_file {
        let _ = std::fs::remove_file(p);
    }
    info!("stopped");
    ExitCode::SUCCESS
}

/// SIGHUP: re-read `path` and apply it; on any error log it and keep running as before.
fn reload(daemon: &mut Daemon, path: &std::path::Path) {
    info!(config = %path.display(), "SIGHUP: reloading the configuration");
    let loaded = match Config::load(path) {
        Ok(l) => l,
        Err(e) => {
            // One line per diagnostic, each with file:line:col.
            for line in e.to_string().lines() {
                error!("reload rejected: {line}");
            }
            error!("reload rejected: the running configuration is unchanged");
            return;
        }
    };
    for w in &loaded.warnings {
        warn!("{w}");
    }
    match daemon.reload(&loaded.config) {
        Ok(r) => {
            for what in &r.not_applied {
                warn!("reload: not applied, needs a restart: {what}");
            }
            let c = &r.core;
            for (nqn, nsids) in &c.namespaces_changed {
                info!(subsystem = %nqn, ?nsids, "reload: namespaces added, removed or changed (hosts notified)");
            }
            if r.is_empty() {
                info!("reload: no changes");
            } else {
                info!(
                    subsystems_added = ?c.subsystems_added,
                    subsystems_removed = ?c.subsystems_removed,
                    subsystems_replaced = ?c.subsystems_replaced,
                    hosts_changed = ?c.hosts_changed,
                    controllers_disconnected = c.controllers_disconnected,
                    listeners_added = ?r.listeners_added,
                    listeners_removed = ?r.listeners_removed,
                    ana_changed = ?c
                        .ana_changed
                        .iter()
                        .map(|l| format!("{}:{}", l.traddr, l.trsvcid))
                        .collect::<Vec<_>>(),
                    devices_opened = r.devices_opened,
                    devices_released = r.devices_released,
                    "reload applied"
                );
            }
        }
        Err(e) => {
            error!("reload rejected: {e}; the running configuration is unchanged");
        }
    }
}

/// CLOCK_MONOTONIC in µs (sd_notify MONOTONIC_USEC, sent with RELOADING=1).
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
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
