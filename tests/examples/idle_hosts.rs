//! Holds `--hosts` idle controllers on a target (each its own host NQN, one I/O queue, the
//! default 5 s keep-alive: keep-alives are all that flows) for `--secs` seconds, then shuts
//! them down: the load of `scripts/bench-idle.sh`, which measures the target's CPU meanwhile.
//!
//! ```text
//! idle_hosts --transport tcp --traddr 127.0.0.1 --trsvcid 4420 --subnqn NQN [--hosts 64] [--secs 20]
//! ```
//!
//! Prints `idle_hosts: N connected` once every controller is up, and exits 1 if one fails.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use initiator::{hostnqn_for, Controller};

mod common;

#[derive(Parser, Debug)]
#[command(about = "Hold idle controllers on a target")]
struct Args {
    #[command(flatten)]
    target: common::Target,
    /// Controllers to hold, each with its own host NQN.
    #[arg(long, default_value_t = 64)]
    hosts: u16,
    /// How long to hold them.
    #[arg(long, default_value_t = 20)]
    secs: u64,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let mut ctrls = Vec::with_capacity(a.hosts as usize);
    for i in 0..a.hosts {
        let mut o = a.target.options();
        let mut id = [0u8; 16];
        id[..2].copy_from_slice(&i.to_be_bytes());
        id[15] = 0x1d;
        o.hostid = id;
        o.hostnqn = hostnqn_for(&id);
        o.queues = 1;
        o.queue_depth = 16;
        match Controller::connect(o) {
            Ok(c) => ctrls.push(c),
            Err(e) => {
                eprintln!("idle_hosts: controller {i} of {}: {e}", a.target);
                return ExitCode::FAILURE;
            }
        }
    }
    println!("idle_hosts: {} connected", ctrls.len());
    std::thread::sleep(Duration::from_secs(a.secs));
    for c in ctrls {
        let _ = c.shutdown();
    }
    ExitCode::SUCCESS
}
