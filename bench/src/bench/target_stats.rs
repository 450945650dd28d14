//! The target's own CPU cost, read from nvmf-target's control socket (`--target-stats PATH`,
//! automatic in `--demo` and `--suite`): the daemon answers `stats json` with `"cpu_ns"` (its
//! process's user + system CPU time) and per-poller `"commands"` (commands received).
//!
//! A run samples both before it connects and after it has disconnected, so the target's CPU
//! time is divided by the commands it received over the same interval: both include the
//! connect sequence and any ramp, neither depends on when exactly the samples were taken. The
//! pollers publish their counters every 50 ms ([`PUBLISH_WAIT`] is waited before the last
//! sample), and a poller keeps busy-polling for `idle_poll_us` (1 ms by default) after its last
//! command: that CPU time is part of the cost of serving the commands and is counted.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Longer than the pollers' counter publication period (50 ms).
pub const PUBLISH_WAIT: Duration = Duration::from_millis(70);

/// One reading of the target's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub cpu_ns: u64,
    /// Commands received, summed over every poller (all transports).
    pub commands: u64,
}

/// The target's CPU time and commands between two samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetCpu {
    pub cpu: Duration,
    pub commands: u64,
}

impl TargetCpu {
    pub fn between(a: &Sample, b: &Sample) -> TargetCpu {
        TargetCpu {
            cpu: Duration::from_nanos(b.cpu_ns.saturating_sub(a.cpu_ns)),
            commands: b.commands.saturating_sub(a.commands),
        }
    }

    /// Target CPU time per command, microseconds.
    pub fn usec_per_io(&self) -> Option<f64> {
        (self.commands > 0).then(|| self.cpu.as_secs_f64() * 1e6 / self.commands as f64)
    }
}

/// Parse the answer to `stats json`.
pub fn parse(json: &str) -> Result<Sample, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("target stats: not JSON: {e}"))?;
    let cpu_ns = v
        .get("cpu_ns")
        .and_then(|c| c.as_u64())
        .ok_or("target stats: no \"cpu_ns\" (an nvmf-target too old for --target-stats?)")?;
    let pollers = v
        .get("pollers")
        .and_then(|p| p.as_array())
        .ok_or("target stats: no \"pollers\" list")?;
    // Each poller counts the commands of each transport it serves.
    let mut commands = 0u64;
    for p in pollers {
        let mut any = false;
        for t in ["tcp", "rdma"] {
            if let Some(c) = p.get(t).and_then(|t| t.get("commands")) {
                commands += c
                    .as_u64()
                    .ok_or("target stats: \"commands\" is not a count")?;
                any = true;
            }
        }
        if !any {
            return Err(
                "target stats: a poller without \"commands\" (an older nvmf-target?)".into(),
            );
        }
    }
    Ok(Sample { cpu_ns, commands })
}

/// Ask the daemon listening on the control socket `path`.
pub fn sample(path: &Path) -> Result<Sample, String> {
    let err = |e: std::io::Error| format!("target stats from {}: {e}", path.display());
    let mut s = UnixStream::connect(path).map_err(err)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(err)?;
    s.write_all(b"stats json\n").map_err(err)?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(err)?;
    parse(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_daemons_answer() {
        // Two pollers, each serving both transports (the daemon's `stats --json` shape).
        let j = r#"{"controllers":1,"cpu_ns":123456789,"pollers":[{"poller":0,"buffers_in_use":0,"io_uring_enters":7,"mrs_registered":1,"tcp":{"connections":2,"commands":10,"errors":0,"rx_bytes":1,"read_payload_bytes":2,"copied_bytes":0},"rdma":{"connections":1,"commands":3,"errors":0,"rx_bytes":1,"read_payload_bytes":2,"copied_bytes":0}},{"poller":1,"buffers_in_use":0,"io_uring_enters":0,"mrs_registered":0,"tcp":{"connections":0,"commands":2,"errors":0,"rx_bytes":0,"read_payload_bytes":0,"copied_bytes":0}}],"subsystems":[]}"#;
        let s = parse(j).unwrap();
        assert_eq!(
            s,
            Sample {
                cpu_ns: 123456789,
                commands: 15
            }
        );
        let t = TargetCpu::between(
            &Sample {
                cpu_ns: 1_000,
                commands: 5,
            },
            &Sample {
                cpu_ns: 2_001_000,
                commands: 105,
            },
        );
        assert_eq!(t.commands, 100);
        assert!((t.usec_per_io().unwrap() - 20.0).abs() < 1e-9);
        assert!(parse(r#"{"controllers":0,"pollers":[]}"#).is_err());
        // The flat per-transport entries of nvmf-target before one poller served both.
        assert!(
            parse(r#"{"cpu_ns":1,"pollers":[{"transport":"tcp","poller":0,"commands":1}]}"#)
                .is_err()
        );
        assert!(parse("controllers: 1").is_err());
    }
}
