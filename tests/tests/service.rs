//! The daemon as a service: sd_notify READY=1 once listening, clean exit on SIGTERM.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use nvmf_tests::{default_yaml, TargetProc, TempDir};

#[test]
fn ready_is_sent_after_the_listener_accepts_and_sigterm_exits_zero() {
    let d = TempDir::new("notify");
    let sock_path = d.0.join("notify.sock");
    let rx = UnixDatagram::bind(&sock_path).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut t =
        TargetProc::start_with_env(default_yaml, &[("NOTIFY_SOCKET", sock_path.clone().into())]);
    let mut buf = [0u8; 512];
    let n = rx.recv(&mut buf).expect("a notification");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    assert!(msg.contains("STATUS="), "{msg}");
    // READY came after the listener was up: a connection is accepted now.
    std::net::TcpStream::connect_timeout(&t.addr, Duration::from_secs(2)).expect("listening");
    assert!(
        t.terminate(),
        "exit status 0 after SIGTERM:\n{}",
        t.log_text()
    );
    let n = rx.recv(&mut buf).expect("STOPPING");
    assert_eq!(&buf[..n], b"STOPPING=1");
}
