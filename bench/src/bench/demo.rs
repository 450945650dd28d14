//! `nvmf-bench --demo`: start `nvmf-target` (the binary next to this one) on its embedded
//! default — or on a generated configuration that is the embedded default plus what the
//! machine needs: a free port when 4420 is taken, an NVMe/RDMA listener on the address of an
//! RDMA device when there is one — wait until it reports READY=1 over the sd_notify
//! protocol, and stop it with SIGTERM afterwards.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::args::DEFAULT_SUBNQN;

/// Makes the directories of targets started by one bench process distinct.
static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// nvmf-target's embedded default port (NVMe/TCP's IANA port).
const DEFAULT_PORT: u16 = 4420;
/// How long the target may take to report READY=1.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long it may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A running nvmf-target child; killed on drop if not stopped.
pub struct TargetProcess {
    child: Option<Child>,
    dir: PathBuf,
    pub port: u16,
    /// The NVMe/RDMA listener's address (same port), when the machine has an RDMA device.
    pub rdma_addr: Option<Ipv4Addr>,
    pub log: PathBuf,
    /// Its control socket (`--control-socket`), for `stats json`.
    pub control: PathBuf,
    /// How it was configured ("embedded default" or the generated file).
    pub how: String,
}

/// `nvmf-target` next to the running executable.
pub fn target_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate nvmf-bench: {e}"))?;
    let p = exe
        .parent()
        .map(|d| d.join("nvmf-target"))
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} not found: build it next to nvmf-bench (cargo build --release -p nvmf-target -p nvmf-bench)",
            p.display()
        ))
    }
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// An IPv4 address of this machine that rdma_cm binds to an RDMA device (RoCE, iWARP or
/// InfiniBand), for the demo's NVMe/RDMA listener: the first one. None without RDMA.
pub fn rdma_local_addr() -> Option<Ipv4Addr> {
    rdma::local_rdma_ipv4().first().map(|a| a.addr)
}

/// The demo's configuration file: the embedded default on `port`, plus an NVMe/RDMA listener
/// on `rdma` (same port) when given.
fn config_yaml(port: u16, rdma: Option<Ipv4Addr>, image: &Path) -> String {
    let path = serde_json::to_string(&image.to_string_lossy()).expect("a string serializes");
    let rdma = rdma
        .map(|ip| format!("  - {{ transport: rdma, address: {ip}, port: {port} }}\n"))
        .unwrap_or_default();
    format!(
        "# Written by nvmf-bench --demo: nvmf-target's embedded default on port {port}.\n\
         listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n{rdma}\
         subsystems:\n  - nqn: {DEFAULT_SUBNQN}\n    allow_any_host: true\n    namespaces:\n      \
         - {{ nsid: 1, path: {path}, size: 1GiB }}\n"
    )
}

/// The last lines of the target's log, for error messages.
fn log_tail(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl TargetProcess {
    /// Start the target; with `rdma`, also listening for NVMe/RDMA on that address.
    pub fn start(rdma: Option<Ipv4Addr>) -> Result<TargetProcess, String> {
        let bin = target_binary()?;
        let dir = std::env::temp_dir().join(format!("nvmf-bench-demo-{}", std::process::id()));
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut t = TargetProcess {
            child: None,
            log: dir.join("nvmf-target.log"),
            control: dir.join("control.sock"),
            dir,
            port: DEFAULT_PORT,
            rdma_addr: rdma,
            how: String::new(),
        };
        let mut cmd = Command::new(&bin);
        cmd.arg("--control-socket").arg(&t.control);
        // Probing with a bind is racy but only decides which configuration to use: a target
        // that then fails to listen reports it and exits, and the error below says so.
        let port_free = TcpListener::bind(("127.0.0.1", DEFAULT_PORT)).is_ok();
        if port_free && rdma.is_none() {
            cmd.arg("--default-dir").arg(&t.dir);
            t.how = "embedded default".into();
        } else {
            let mut why = Vec::new();
            if !port_free {
                t.port = free_port().map_err(|e| format!("no free TCP port: {e}"))?;
                why.push(format!("port {DEFAULT_PORT} is taken"));
            }
            if let Some(ip) = rdma {
                why.push(format!("NVMe/RDMA on {ip}:{}", t.port));
            }
            let cfg = t.dir.join("nvmf-target.yaml");
            fs::write(&cfg, config_yaml(t.port, rdma, &t.dir.join("demo.img")))
                .map_err(|e| format!("{}: {e}", cfg.display()))?;
            cmd.arg("--config").arg(&cfg);
            t.how = format!("embedded default + {}", why.join(", "));
        }
        t.launch(cmd, &bin)
    }

    /// Start the target on a configuration of the caller's (`config(port)`, given a free
    /// port), in its own temporary directory named after `what`.
    pub fn start_with_config(
        what: &str,
        config: impl FnOnce(u16) -> String,
    ) -> Result<TargetProcess, String> {
        let bin = target_binary()?;
        let dir = std::env::temp_dir().join(format!(
            "nvmf-bench-{what}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = free_port().map_err(|e| format!("no free TCP port: {e}"))?;
        let cfg = dir.join("nvmf-target.yaml");
        let t = TargetProcess {
            child: None,
            log: dir.join("nvmf-target.log"),
            control: dir.join("control.sock"),
            dir,
            port,
            rdma_addr: None,
            how: cfg.display().to_string(),
        };
        fs::write(&cfg, config(port)).map_err(|e| format!("{}: {e}", cfg.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.arg("--control-socket")
            .arg(&t.control)
            .arg("--config")
            .arg(&cfg);
        t.launch(cmd, &bin)
    }

    /// Spawn `cmd` (the target with its arguments) and wait for READY=1.
    fn launch(mut self, mut cmd: Command, bin: &Path) -> Result<TargetProcess, String> {
        let notify_path = self.dir.join("notify.sock");
        let _ = fs::remove_file(&notify_path);
        let notify = UnixDatagram::bind(&notify_path)
            .map_err(|e| format!("{}: {e}", notify_path.display()))?;
        notify
            .set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        let log =
            fs::File::create(&self.log).map_err(|e| format!("{}: {e}", self.log.display()))?;
        cmd.env("NOTIFY_SOCKET", &notify_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        self.child = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        let mut buf = [0u8; 4096];
        loop {
            match notify.recv(&mut buf) {
                Ok(n) => {
                    if String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .any(|l| l == "READY=1")
                    {
                        return Ok(self);
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(format!("waiting for nvmf-target: {e}")),
            }
            let child = self.child.as_mut().expect("spawned");
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "nvmf-target exited ({status}) before it was ready; its log ({}):\n{}",
                    self.log.display(),
                    log_tail(&self.log)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "nvmf-target did not report READY=1 within {READY_TIMEOUT:?}; its log ({}):\n{}",
                    self.log.display(),
                    log_tail(&self.log)
                ));
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = Pid::from_raw(child.id() as i32);
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "nvmf-target had already exited ({status}); its log ({}):\n{}",
                self.log.display(),
                log_tail(&self.log)
            ));
        }
        kill(pid, Signal::SIGTERM).map_err(|e| format!("SIGTERM to nvmf-target: {e}"))?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(format!(
                        "nvmf-target exited with {status} after SIGTERM; its log ({}):\n{}",
                        self.log.display(),
                        log_tail(&self.log)
                    ))
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "nvmf-target did not stop within {STOP_TIMEOUT:?} of SIGTERM (killed)"
                    ));
                }
                Err(e) => return Err(format!("waiting for nvmf-target: {e}")),
            }
        }
    }
}

impl Drop for TargetProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let keep_log = std::env::var_os("NVMF_BENCH_KEEP_DEMO_DIR").is_some();
            if !keep_log {
                let _ = fs::remove_dir_all(&self.dir);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_config_is_the_embedded_default_on_another_port() {
        let y = config_yaml(4999, None, Path::new("/tmp/a b/demo.img"));
        assert!(y.contains("port: 4999"));
        assert!(!y.contains("rdma"));
        assert!(y.contains(r#"path: "/tmp/a b/demo.img""#));
        assert!(y.contains(DEFAULT_SUBNQN));
        assert!(y.contains("size: 1GiB"));
        let y = config_yaml(
            4420,
            Some(Ipv4Addr::new(192, 168, 78, 1)),
            Path::new("/x.img"),
        );
        assert!(y.contains("{ transport: rdma, address: 192.168.78.1, port: 4420 }"));
        assert!(y.contains("{ transport: tcp, address: 127.0.0.1, port: 4420 }"));
    }
}
