//! `nvmf-ublk`: a remote NVMe-oF namespace as a local block device, `/dev/ublkbN`, through the
//! kernel's ublk driver (Linux 6.0 and later, `ublk_drv`), on nvmf-initiator: a block device on
//! machines whose kernel has no nvme-tcp or nvme-rdma.
//!
//! One controller with one NVMe I/O queue per ublk queue. When the connection fails (a target
//! restart, a lost link), requests stall instead of failing: the queues' commands wait, the
//! first queue thread to notice reconnects (`initiator::Reconnector`, backoff up to
//! `--reconnect-delay`, for up to `--ctrl-loss-tmo`, as the Linux host's options), and every
//! queue sends its commands again on a queue of the new connection. Each ublk queue runs on a thread of
//! its own (libublk's), where one executor drives the ublk queue's io_uring and the NVMe
//! queue together: a task per ublk tag takes the block layer's request, turns it into an NVMe
//! command on the tag's own buffer, and commits the result; one reaper task per queue sends
//! the commands and collects their completions, waiting for the NVMe queue's descriptors
//! (the TCP socket, or the RDMA completion channel) in the same reactor as the ublk ring's.
//!
//! Each tag's buffer is the NVMe queue's own (registered memory over RDMA), given to ublk as
//! the tag's I/O buffer: the kernel copies a request's pages into it (writes) or out of it
//! (reads), and the NVMe transport moves it with no further copy. Reads, writes (FUA kept),
//! flushes (when the controller has a volatile write cache), discards (Dataset Management,
//! Deallocate) and write zeroes map onto their NVMe commands.
//!
//! The command line follows nvmf-bench's option names; the device path is printed alone on a
//! line of standard output once the device is ready; SIGTERM or SIGINT removes the device and
//! disconnects.

mod queue;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use initiator::{
    AnyQueue, ConnectOptions, DhchapOptions, NsInfo, ReconnectPolicy, Reconnector, Transport,
};
use libublk::ctrl::UblkCtrlBuilder;
use libublk::io::UblkDev;
use libublk::UblkFlags;
use tracing::{error, info};

#[derive(Parser, Debug)]
#[command(
    name = "nvmf-ublk",
    version,
    about = "Expose a remote NVMe-oF namespace as /dev/ublkbN (the kernel's ublk driver)"
)]
struct Args {
    /// Transport: tcp or rdma (repeat it with `--traddr` for paths of other transports; the
    /// last one given goes for the paths after it).
    #[arg(long, default_values = ["tcp"], value_parser = ["tcp", "rdma"])]
    transport: Vec<String>,
    /// Target address; repeat it for several paths to the subsystem (multipath: one path in
    /// use at a time, the next when it fails or its namespace is not ANA accessible).
    #[arg(long, required = true)]
    traddr: Vec<String>,
    /// Target port (per path, as `--traddr`; the last one given goes for the paths after it).
    #[arg(long, default_values_t = [4420])]
    trsvcid: Vec<u16>,
    /// Subsystem NQN.
    #[arg(long)]
    subnqn: String,
    /// Namespace ID.
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// Host NQN (default: a random uuid NQN).
    #[arg(long)]
    hostnqn: Option<String>,
    /// DH-HMAC-CHAP secret of the host (`DHHC-1:..`), as `nvme gen-dhchap-key` prints it.
    #[arg(long, requires = "hostnqn")]
    dhchap_secret: Option<String>,
    /// DH-HMAC-CHAP secret the controller must prove (bidirectional authentication).
    #[arg(long, requires = "dhchap_secret")]
    dhchap_ctrl_secret: Option<String>,
    /// ublk queues (hardware queues of the block device), one NVMe I/O queue each.
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Requests in flight per queue (at most what the controller allows).
    #[arg(long, default_value_t = 64)]
    queue_depth: u16,
    /// Bound of each NVMe command, in seconds.
    #[arg(long, default_value_t = 30)]
    io_timeout: u64,
    /// The device number N of /dev/ublkbN (default: the first free one).
    #[arg(long)]
    id: Option<u32>,
    /// Seconds to keep reconnecting after the connection fails, requests stalled meanwhile
    /// (then they fail); as nvme-cli's option. 0: fail at once.
    #[arg(long, default_value_t = 600)]
    ctrl_loss_tmo: u64,
    /// Longest wait between two reconnect attempts, in seconds (the first comes after 100 ms,
    /// the wait doubling up to this).
    #[arg(long, default_value_t = 2)]
    reconnect_delay: u64,
}

/// What the block device is told about the namespace and the controller.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub ns: NsInfo,
    /// Largest transfer of one request, in bytes.
    pub max_io: u32,
    /// Volatile write cache: flushes and FUA writes mean something.
    pub vwc: bool,
    /// Dataset Management (Deallocate): discards.
    pub dsm: bool,
    /// Write Zeroes.
    pub write_zeroes: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            eprintln!("nvmf-ublk: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    // SIGTERM and SIGINT go to one thread that removes the device (every thread started from
    // here on inherits the mask).
    let mut signals = nix::sys::signal::SigSet::empty();
    signals.add(nix::sys::signal::Signal::SIGTERM);
    signals.add(nix::sys::signal::Signal::SIGINT);
    signals
        .thread_block()
        .map_err(|e| format!("cannot block SIGTERM/SIGINT: {e}"))?;

    let nth = |v: &[String], i: usize| v.get(i).or(v.last()).cloned().unwrap_or_default();
    let mut paths = Vec::new();
    for (i, addr) in args.traddr.iter().enumerate() {
        let port = args
            .trsvcid
            .get(i)
            .or(args.trsvcid.last())
            .copied()
            .unwrap_or(4420);
        let mut opts = match nth(&args.transport, i).as_str() {
            "rdma" => ConnectOptions::rdma(addr, port, &args.subnqn),
            _ => ConnectOptions::tcp(addr, port, &args.subnqn),
        };
        if let Some(h) = &args.hostnqn {
            opts.hostnqn = h.clone();
        }
        if let Some(s) = &args.dhchap_secret {
            opts.dhchap = Some(
                DhchapOptions::new(s, args.dhchap_ctrl_secret.as_deref())
                    .map_err(|e| format!("--dhchap-secret: {e}"))?,
            );
        }
        opts.queues = args.queues.max(1);
        opts.queue_depth = args.queue_depth.max(1);
        opts.timeout = Duration::from_secs(args.io_timeout.max(1));
        paths.push(opts);
    }
    let what = paths
        .iter()
        .map(|o| {
            let tr = match o.transport {
                Transport::Rdma => "rdma",
                _ => "tcp",
            };
            format!("{tr} {}:{}", o.addr, o.port)
        })
        .collect::<Vec<_>>()
        .join(", ")
        + " "
        + &args.subnqn;
    let policy = ReconnectPolicy {
        max_attempts: if args.ctrl_loss_tmo == 0 { 0 } else { u32::MAX },
        max_total: Some(Duration::from_secs(args.ctrl_loss_tmo)),
        initial_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(args.reconnect_delay.max(1)),
        multiplier: 2.0,
    };
    let (rc, qs, info, ns) =
        Reconnector::connect_paths(paths, args.nsid, policy).map_err(|e| format!("{what}: {e}"))?;
    let rc = Arc::new(rc);
    let queues: Vec<Option<AnyQueue>> = qs.into_iter().map(Some).collect();
    if queues.is_empty() {
        return Err(format!("{what}: the controller gave no I/O queue"));
    }
    let depth = queues
        .iter()
        .flatten()
        .map(|q| q.depth())
        .min()
        .unwrap_or(1)
        .min(usize::from(u16::MAX)) as u16;
    let caps = Caps {
        ns,
        // ublk's buffers: at most 512 KiB per request, and what the controller takes.
        max_io: info.max_transfer.clamp(4096, 512 << 10) / ns.block_size * ns.block_size,
        vwc: info.vwc & 1 != 0,
        dsm: info.oncs & nvme::identify::ctrl::ONCS_DSM != 0,
        write_zeroes: info.oncs & nvme::identify::ctrl::ONCS_WRITE_ZEROES != 0,
    };
    info!(
        target = %what,
        nsid = ns.nsid,
        bytes = ns.size(),
        block_size = ns.block_size,
        queues = queues.len(),
        depth,
        max_io = caps.max_io,
        flush = caps.vwc,
        discard = caps.dsm,
        write_zeroes = caps.write_zeroes,
        "connected"
    );

    let ublk = Arc::new(
        UblkCtrlBuilder::default()
            .name("nvmf")
            .id(args.id.map_or(-1, |i| i.min(i32::MAX as u32) as i32))
            .nr_queues(queues.len() as u16)
            .depth(depth)
            .io_buf_bytes(caps.max_io)
            .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
            .build()
            .map_err(|e| {
                format!("cannot add a ublk device (is ublk_drv loaded, and is this root?): {e}")
            })?,
    );
    let sig_ublk = Arc::clone(&ublk);
    let sig_rc = Arc::clone(&rc);
    std::thread::Builder::new()
        .name("nvmf-ublk-signals".into())
        .spawn(move || {
            if let Ok(sig) = signals.wait() {
                info!(signal = ?sig, "removing the device");
                // A queue stalled in a reconnect gives up, so that it sees the device stop.
                sig_rc.stop();
                // libublk's control commands go through a ring of the calling thread's own.
                let ring = libublk::ctrl::ublk_init_ctrl_task_ring(|r| {
                    if r.is_none() {
                        *r = Some(
                            io_uring::IoUring::<io_uring::squeue::Entry128>::builder()
                                .build(16)
                                .map_err(libublk::UblkError::IOError)?,
                        );
                    }
                    Ok(())
                });
                if let Err(e) = ring.and_then(|_| sig_ublk.kill_dev()) {
                    error!(error = %e, "cannot stop the ublk device");
                }
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;

    let queues = Arc::new(Mutex::new(queues));
    let q_rc = Arc::clone(&rc);
    let tgt_init = move |dev: &mut UblkDev| {
        set_params(dev, &caps);
        Ok(())
    };
    let q_fn = move |qid: u16, dev: &UblkDev| {
        let q = queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(usize::from(qid))
            .and_then(Option::take);
        match q {
            Some(q) => queue::serve(qid, dev, q, 0, Arc::clone(&q_rc), caps),
            None => error!(qid, "no NVMe queue for this ublk queue"),
        }
    };
    let started = |c: &libublk::ctrl::UblkCtrl| {
        use std::io::Write;
        let id = c.dev_info().dev_id;
        info!(device = %format!("/dev/ublkb{id}"), "ready");
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "/dev/ublkb{id}");
        let _ = out.flush();
    };
    let r = ublk.run_target(tgt_init, q_fn, started);
    if let Err(e) = ublk.del_dev() {
        error!(error = %e, "cannot delete the ublk device");
    }
    let stats = rc.stats();
    if stats.reconnects > 0 || stats.failed_attempts > 0 {
        info!(
            reconnects = stats.reconnects,
            failed_attempts = stats.failed_attempts,
            "reconnect counters"
        );
    }
    let shut = rc.shutdown();
    r.map_err(|e| format!("ublk device: {e}"))?;
    shut.map_err(|e| format!("{what}: shutdown: {e}"))?;
    info!("device removed, controller disconnected");
    Ok(())
}

/// The block device's parameters from the namespace and the controller.
fn set_params(dev: &mut UblkDev, caps: &Caps) {
    use libublk::sys;
    let bs = caps.ns.block_size;
    let shift = bs.trailing_zeros() as u8;
    dev.set_default_params(caps.ns.size());
    let p = &mut dev.tgt.params;
    p.basic.logical_bs_shift = shift;
    p.basic.physical_bs_shift = shift;
    p.basic.io_min_shift = shift;
    p.basic.io_opt_shift = shift;
    p.basic.attrs = if caps.vwc {
        sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA
    } else {
        0
    };
    if caps.dsm || caps.write_zeroes {
        p.types |= sys::UBLK_PARAM_TYPE_DISCARD;
        // One DSM range (its block count is 32 bits) and Write Zeroes of at most 65536 blocks.
        let sectors_per_block = bs >> 9;
        p.discard = sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: if caps.dsm { bs } else { 0 },
            max_discard_sectors: if caps.dsm {
                (1u32 << 22).max(sectors_per_block)
            } else {
                0
            },
            max_write_zeroes_sectors: if caps.write_zeroes {
                (1u32 << 16) * sectors_per_block
            } else {
                0
            },
            max_discard_segments: 1,
            reserved0: 0,
        };
    }
}
