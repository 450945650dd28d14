//! Small OS helpers shared by the owner types: socket addresses and file descriptors.

use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A `sockaddr_storage` holding an IPv4 or IPv6 address, as rdma_cm wants it.
pub(crate) fn to_sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid (AF_UNSPEC) value.
    let mut ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
        }
    }
    ss
}

/// Decodes an AF_INET/AF_INET6 `sockaddr_storage`; anything else (AF_UNSPEC, AF_IB) is `None`.
pub(crate) fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in; storage is aligned for it.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6; storage is aligned for it.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Puts `fd` into non-blocking mode.
pub(crate) fn set_nonblocking(call: &'static str, fd: RawFd) -> Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we were handed by the library that owns it; an
    // invalid fd only makes fcntl fail with EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(crate::error::from_errno(call));
    }
    if flags & libc::O_NONBLOCK != 0 {
        return Ok(());
    }
    // SAFETY: as above.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if r < 0 {
        return Err(crate::error::from_errno(call));
    }
    Ok(())
}

/// Waits until `fd` is readable or `deadline` passes (`None`: forever).
///
/// Returns `Ok(true)` when readable, `Ok(false)` on timeout. EINTR is retried.
pub(crate) fn wait_readable(fd: RawFd, deadline: Option<Instant>) -> Result<bool> {
    loop {
        let timeout_ms: libc::c_int = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so a sub-millisecond remainder still waits instead of spinning.
                let ms = left.as_nanos().div_ceil(1_000_000);
                ms.min(i32::MAX as u128) as libc::c_int
            }
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack, nfds = 1.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if r > 0 {
            return Ok(true);
        }
        if r == 0 {
            if deadline.is_none_or(|d| Instant::now() >= d) {
                return Ok(false);
            }
            continue;
        }
        let e = crate::error::last_errno();
        if e != libc::EINTR {
            return Err(Error::Verbs {
                call: "poll",
                errno: e,
            });
        }
    }
}

/// The deadline `timeout` from now (`None` stays `None`: no deadline).
pub(crate) fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(|t| Instant::now().checked_add(t).unwrap_or_else(far_future))
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

/// Reads a NUL-terminated C string from a fixed array.
pub(crate) fn c_array_to_string(arr: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = arr
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Copies a C string pointer (may be NULL) into a `String`.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for the duration of the call.
pub(crate) unsafe fn c_str_to_string(p: *const libc::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller guarantees p is a valid NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trip_v4_v6() {
        for s in [
            "192.168.78.1:4420",
            "[fe80::1%3]:4421",
            "0.0.0.0:0",
            "[::1]:65535",
        ] {
            let a: SocketAddr = s.parse().unwrap();
            let ss = to_sockaddr(&a);
            assert_eq!(from_sockaddr(&ss), Some(a), "{s}");
        }
        let v4 = to_sockaddr(&"10.1.2.3:4420".parse().unwrap());
        // SAFETY: AF_INET storage, as built above.
        let sin = unsafe { &*(&v4 as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_port.to_ne_bytes(), [0x11, 0x44]);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 1, 2, 3]);
    }

    #[test]
    fn unspec_family_is_none() {
        // SAFETY: all-zero sockaddr_storage is AF_UNSPEC.
        let ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
        assert_eq!(from_sockaddr(&ss), None);
    }

    #[test]
    fn wait_readable_times_out_and_sees_data() {
        let mut fds = [0; 2];
        // SAFETY: valid 2-element array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let t0 = Instant::now();
        let d = deadline(Some(Duration::from_millis(30)));
        assert!(!wait_readable(fds[0], d).unwrap());
        assert!(t0.elapsed() >= Duration::from_millis(30));
        // SAFETY: writing one byte from a valid buffer to our pipe.
        assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
        assert!(wait_readable(fds[0], deadline(Some(Duration::from_secs(5)))).unwrap());
        // SAFETY: closing the fds we created.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
