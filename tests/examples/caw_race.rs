//! Compare and Write race against a live target: `--hosts` hosts (threads), each with its own
//! controller connection, host NQN and host ID, race fused Compare and Write on one block
//! (`--lba` of `--nsid`) for `--rounds` rounds. Each host reads the block, checks it is whole
//! (checksum and pattern), and tries to replace round r with round r + 1 naming itself the
//! winner; at the end every round must have exactly one winner, the block must hold the last
//! round, and no read may have been torn (see `nvmf_tests::caw::race`).
//!
//! ```text
//! caw_race --transport tcp --traddr 127.0.0.1 --trsvcid 4420 --subnqn NQN
//!          [--hosts 2] [--rounds 10000] [--nsid 1] [--lba 0] [--timeout 30]
//! ```
//!
//! Prints `caw elapsed=S caws=N caw/s=R`, then `caw rounds=N hosts=H wins=[a,b]
//! conflicts=C torn=0 ok` and exits 0; on a failure prints what failed and the summary
//! (ending in `FAILED`) and exits 1.
//!
//! The block is overwritten: point it at a namespace whose data does not matter.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use nvmf_tests::caw::{race, RaceOptions};

mod common;

#[derive(Parser, Debug)]
#[command(about = "Hosts racing fused Compare and Write on one block")]
struct Args {
    #[command(flatten)]
    target: common::Target,
    /// Hosts, each with its own connection, host NQN and host ID.
    #[arg(long, default_value_t = 2)]
    hosts: usize,
    /// Rounds: the race ends when the block holds this round.
    #[arg(long, default_value_t = 10_000)]
    rounds: u64,
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// The block raced for.
    #[arg(long, default_value_t = 0)]
    lba: u64,
    /// Seconds every wait may take.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.hosts == 0 || args.rounds == 0 {
        eprintln!("caw_race: --hosts and --rounds must be at least 1");
        return ExitCode::FAILURE;
    }
    let mut base = args.target.options();
    base.timeout = Duration::from_secs(args.timeout);
    let opts = RaceOptions {
        hosts: args.hosts,
        rounds: args.rounds,
        nsid: args.nsid,
        lba: args.lba,
    };
    let rep = match race(&base, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("caw_race: {}: {e}", args.target);
            return ExitCode::FAILURE;
        }
    };
    for f in &rep.failures {
        println!("caw_race: {f}");
    }
    println!("{}", rep.timing());
    println!("{}", rep.summary());
    if rep.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
