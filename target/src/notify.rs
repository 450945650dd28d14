//! The sd_notify protocol (systemd.exec(5), sd_notify(3)): datagrams to `$NOTIFY_SOCKET`.
//! Used for READY=1 once every listener is up, STATUS= lines, STOPPING=1 and WATCHDOG=1.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A connection to the service manager, if the daemon runs under one.
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace); None without it.
    pub fn from_env() -> Option<Notifier> {
        let path = std::env::var_os("NOTIFY_SOCKET")?;
        let bytes = path.as_encoded_bytes();
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => SocketAddr::from_abstract_name(name).ok()?,
            None => SocketAddr::from_pathname(std::path::Path::new(&path)).ok()?,
        };
        let sock = UnixDatagram::unbound().ok()?;
        Some(Notifier { sock, addr })
    }

    /// Send one notification (`KEY=VALUE` lines). Failures are logged, never fatal.
    pub fn notify(&self, msg: &str) {
        if let Err(e) = self.sock.send_to_addr(msg.as_bytes(), &self.addr) {
            tracing::warn!(error = %e, "sd_notify failed");
        }
    }

    /// The watchdog interval the manager asked for (`$WATCHDOG_USEC`, for this pid).
    pub fn watchdog_interval() -> Option<Duration> {
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        if let Ok(pid) = std::env::var("WATCHDOG_PID") {
            if pid.parse::<u32>().ok()? != std::process::id() {
                return None;
            }
        }
        (usec > 0).then(|| Duration::from_micros(usec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_socket() {
        let dir = std::env::temp_dir().join(format!("nvmf-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("notify.sock");
        let _ = std::fs::remove_file(&p);
        let rx = UnixDatagram::bind(&p).unwrap();
        let addr = SocketAddr::from_pathname(&p).unwrap();
        let n = Notifier {
            sock: UnixDatagram::unbound().unwrap(),
            addr,
        };
        n.notify("READY=1\nSTATUS=ok");
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=ok");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
