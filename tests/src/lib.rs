//! Helpers shared by the end-to-end tests: run the real `nvmf-target` binary on a free
//! loopback port with a generated configuration, and talk raw NVMe/TCP to it.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub mod caw;
pub mod ceph;
pub mod crashlog;
pub mod forms;
pub mod raw;
pub mod resv;

/// The `nvmf-target` binary next to the test executable (same profile).
pub fn target_bin() -> PathBuf {
    sibling_bin("nvmf-target", "nvmf-target")
}

/// The `nvmf-bench` binary next to the test executable (same profile).
pub fn bench_bin() -> PathBuf {
    sibling_bin("nvmf-bench", "nvmf-bench")
}

/// The `nvmf-ublk` binary next to the test executable (same profile).
pub fn ublk_bin() -> PathBuf {
    sibling_bin("nvmf-ublk", "nvmf-ublk")
}

/// The fio engine (`libnvmf_fio.so`, the nvmf-fio crate) built in the same profile as this test:
/// the copy in build/<profile>/deps, which building the tests (nvmf-fio is a dev-dependency)
/// keeps current (cargo copies it up to build/<profile> only when the crate itself is built).
pub fn fio_engine() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let lib = exe.with_file_name("libnvmf_fio.so");
    assert!(
        lib.exists(),
        "{} is missing: build it first (cargo build -p nvmf-fio; scripts/test.sh does)",
        lib.display()
    );
    lib
}

/// `fio` against `t`, run in its temporary directory (where fio leaves its verify state files),
/// with `NVMF_FIO_ENGINE` naming the engine for job files.
pub fn fio_command(t: &TargetProc) -> Command {
    let mut c = Command::new("fio");
    c.current_dir(&t.dir.0).env("NVMF_FIO_ENGINE", fio_engine());
    c
}

/// The engine's filename for namespace 1 of `nqn` on 127.0.0.1:`port` (the NQN's colons
/// escaped: fio splits filenames at `:`).
pub fn fio_filename(port: u16, nqn: &str) -> String {
    format!(
        "trtype=tcp traddr=127.0.0.1 trsvcid={port} subnqn={} ns=1",
        nqn.replace(':', "\\:")
    )
}

/// fio with the nvmf engine against namespace 1 of `nqn` on `t`: 1 MiB of random 4 KiB
/// writes at QD4, read back and checked (crc32c). `engine_opts` (`--hostnqn=...`,
/// `--dhchap_secret=...`) follow `--ioengine`. Whether fio succeeded, and its whole output.
pub fn fio_verified(t: &TargetProc, nqn: &str, engine_opts: &[String]) -> (bool, String) {
    let out = fio_command(t)
        .arg(format!("--ioengine=external:{}", fio_engine().display()))
        .args(engine_opts)
        .args(["--name=verified", "--thread=1", "--rw=randwrite", "--bs=4k"])
        .args(["--size=1m", "--iodepth=4", "--verify=crc32c"])
        .arg(format!("--filename={}", fio_filename(t.addr.port(), nqn)))
        .output()
        .expect("fio runs (scripts/setup.sh installs it)");
    (out.status.success(), output_text(&out))
}

/// A workspace binary built in the same profile as this test (build/<profile>/<name>).
fn sibling_bin(name: &str, package: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // build/<profile>/deps/<test> → build/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in build/<profile>/deps");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build -p {package}; scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for tests).
/// `GET /metrics` from the target's metrics endpoint at 127.0.0.1:`mport`: the whole HTTP
/// response.
pub fn get_metrics(mport: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", mport)).expect("metrics port");
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// A finished command's status, stdout and stderr, for assertion messages.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "nvmf-rs-{tag}-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos() ^ rand::random::<u64>() as u128
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `nvmf-target` process; killed on drop. Its stderr goes to `log`.
pub struct TargetProc {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
    pub dir: TempDir,
    /// The command line, to start the same target again ([`TargetProc::kill_and_restart`]).
    launch: Launch,
}

/// How a target was started: a wrapper (e.g. `ip netns exec NS`), its arguments, its
/// environment.
struct Launch {
    prefix: Vec<OsString>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

pub const TEST_NQN: &str = "nqn.2026-11.io.nvmf-rs:test";

impl TargetProc {
    /// Start the target with one subsystem (`TEST_NQN`, any host) and a 64 MiB file namespace.
    pub fn start_default() -> TargetProc {
        Self::start_with(default_yaml)
    }
}

/// The configuration `start_default` uses: `TEST_NQN`, any host, a 64 MiB file namespace.
pub fn default_yaml(port: u16, dir: &Path) -> String {
    {
        {
            format!(
                "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, port: {port} }}\n\
                 subsystems:\n  - nqn: {TEST_NQN}\n    allow_any_host: true\n    namespaces:\n      \
                 - {{ nsid: 1, path: {}/ns1.img, size: 64MiB }}\n\
                 target: {{ threads: 2, keep_alive_ms_min: 1000 }}\n",
                dir.display()
            )
        }
    }
}

impl TargetProc {
    /// Start the target with the YAML `make(port, dir)` returns.
    pub fn start_with(make: impl FnOnce(u16, &Path) -> String) -> TargetProc {
        Self::start_with_env(make, &[], &[])
    }

    /// As [`TargetProc::start_with`], with extra environment variables.
    pub fn start_with_env(
        make: impl FnOnce(u16, &Path) -> String,
        env: &[(&str, std::ffi::OsString)],
        args: &[std::ffi::OsString],
    ) -> TargetProc {
        Self::start_wrapped(IpAddr::from([127, 0, 0, 1]), &[], make, env, args)
    }

    /// Start the target through `prefix` (e.g. `ip netns exec NS`: the wrapper must exec the
    /// target, so that its pid is the target's), expecting it to listen on `ip` at the port
    /// `make` is given.
    pub fn start_wrapped(
        ip: IpAddr,
        prefix: &[OsString],
        make: impl FnOnce(u16, &Path) -> String,
        env: &[(&str, std::ffi::OsString)],
        args: &[std::ffi::OsString],
    ) -> TargetProc {
        let dir = TempDir::new("target");
        let port = free_port();
        let yaml = make(port, &dir.0);
        let cfg = dir.0.join("config.yaml");
        std::fs::write(&cfg, yaml).unwrap();
        let log = dir.0.join("target.log");
        let mut all_args: Vec<OsString> = vec!["--config".into(), cfg.into()];
        all_args.extend(args.iter().cloned());
        let launch = Launch {
            prefix: prefix.to_vec(),
            args: all_args,
            env: env.iter().map(|(k, v)| (k.into(), v.clone())).collect(),
        };
        let child = launch.spawn(&log, false);
        let mut t = TargetProc {
            child,
            addr: SocketAddr::new(ip, port),
            log,
            dir,
            launch,
        };
        t.wait_listening(Duration::from_secs(20));
        t
    }

    /// SIGKILL the target (no shutdown path runs) and start it again with the same command
    /// line: same configuration, port and namespace files. Its log is appended to.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.restart();
    }

    /// Start the (killed) target again with the same command line; its log is appended to.
    pub fn restart(&mut self) {
        assert!(
            matches!(self.child.try_wait(), Ok(Some(_))),
            "restart: the target is still running"
        );
        self.child = self.launch.spawn(&self.log, true);
        self.wait_listening(Duration::from_secs(20));
    }

    /// SIGKILL the target and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The `--control-socket` this target was started with, if any.
    fn control_socket(&self) -> Option<PathBuf> {
        let args = &self.launch.args;
        args.iter()
            .position(|a| a == "--control-socket")
            .and_then(|i| args.get(i + 1))
            .map(PathBuf::from)
    }

    fn wait_listening(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("nvmf-target exited early ({st}):\n{}", self.log_text());
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                // One probe connection only (tests count them per poller); then the control
                // socket, bound after the listeners (a killed target's stale one refuses).
                let Some(sock) = self.control_socket() else {
                    return;
                };
                while Instant::now() < deadline {
                    if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                panic!("no control socket {} within {limit:?}", sock.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "nvmf-target did not listen on {} within {limit:?}:\n{}",
            self.addr,
            self.log_text()
        );
    }

    /// An `nvmf-bench` command aimed at `TEST_NQN` on this target (127.0.0.1); the caller adds
    /// the job's arguments.
    pub fn bench_command(&self) -> Command {
        let mut c = Command::new(bench_bin());
        c.args(["--traddr=127.0.0.1", "--subnqn", TEST_NQN, "--trsvcid"])
            .arg(self.addr.port().to_string());
        c
    }

    /// The short verified job the authentication and TLS tests run with nvmf-bench (4k randrw,
    /// two jobs of 1 MiB at QD4 for 200 ms, crc32c) plus `extra`: its output and its text
    /// ([`output_text`]).
    pub fn bench_verified(&self, extra: &[&str]) -> (Output, String) {
        let out = self
            .bench_command()
            .args([
                "--rw=randrw",
                "--bs=4k",
                "--size=1m",
                "--offset_increment=1m",
            ])
            .args([
                "--iodepth=4",
                "--numjobs=2",
                "--runtime=200ms",
                "--verify=crc32c",
            ])
            .args(extra)
            .output()
            .expect("run nvmf-bench");
        let text = output_text(&out);
        (out, text)
    }

    /// Runs nvmf-bench ([`TargetProc::bench_command`] with `args`) to its end: its output, and
    /// for assertion messages its status, output and this target's log ([`describe`]).
    pub fn run_bench(&self, args: &[&str]) -> (Output, String) {
        let out = self
            .bench_command()
            .args(args)
            .output()
            .expect("run nvmf-bench");
        let text = describe(&out, &self.log_text());
        (out, text)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait (up to 15 s) until the log has `n` lines containing `what`; returns the log.
    #[track_caller]
    pub fn wait_log(&self, what: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let log = self.log_text();
            if log.matches(what).count() >= n {
                return log;
            }
            assert!(Instant::now() < deadline, "no `{what}` in the log:\n{log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ask the target to reload its configuration (SIGHUP).
    pub fn sighup(&self) {
        // SAFETY: kill(2) with our own child's pid and a plain signal number.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGHUP) };
    }

    /// Send SIGTERM and wait (bounded) for a clean exit; returns the exit status success.
    pub fn terminate(&mut self) -> bool {
        // SAFETY: kill(2) with a valid pid of our own child and a plain signal number.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Launch {
    fn spawn(&self, log: &Path, append: bool) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(log)
            .unwrap();
        let mut cmd = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(target_bin());
                c
            }
            None => Command::new(target_bin()),
        };
        cmd.args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("NVMF_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nvmf-target")
    }
}

impl Drop for TargetProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Write all of `buf` to a blocking stream (test helper).
pub fn send_all(s: &mut TcpStream, buf: &[u8]) {
    s.write_all(buf).expect("send");
}

/// Read exactly `n` bytes (test helper).
pub fn recv_exact(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v).expect("recv");
    v
}

/// A finished command's status, standard output and error, then `log` (a target's): the
/// message of an assertion about it.
pub fn describe(out: &Output, log: &str) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}--- target log\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
