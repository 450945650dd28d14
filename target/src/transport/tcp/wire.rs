//! The byte stream under an NVMe/TCP connection ([`super::tcp::Conn`]): a non-blocking TCP
//! socket in the daemon, memory in the connection's unit tests ([`super::mem::MemWire`]). The
//! connection's state machine does all its I/O through this trait, so everything above the
//! socket runs without one.

use std::io::{self, IoSlice, Read};
use std::net::{Shutdown, SocketAddr, TcpStream};

/// A non-blocking byte stream.
pub trait Wire {
    /// Read what is there into `buf`: Ok(0) when the peer closed its side, an error of kind
    /// `WouldBlock` when nothing is there now.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// One gathering send of as much of `iov` as the stream takes now: Ok(None) when it takes
    /// nothing (full).
    fn send(&mut self, iov: &[IoSlice<'_>]) -> io::Result<Option<usize>>;
    /// Send what the stream itself holds back (TLS records in user space): true when nothing
    /// is left. Called when the connection has nothing else queued.
    fn drain(&mut self) -> io::Result<bool> {
        Ok(true)
    }
    /// Close both directions (the peer sees EOF; pending sends are dropped).
    fn shutdown(&mut self);
    /// The peer's address, for logs.
    fn peer(&self) -> String;
    /// The local address the peer reached (the discovery log reports it).
    fn local_addr(&self) -> Option<SocketAddr>;
}

impl Wire for TcpStream {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read(buf)
    }

    fn send(&mut self, iov: &[IoSlice<'_>]) -> io::Result<Option<usize>> {
        use std::os::fd::AsRawFd;
        // SAFETY: msghdr is plain data; all-zero is a valid "no name, no control data" header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI compatible with iovec on Unix (std's documented guarantee).
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len() as _;
        loop {
            // SAFETY: `msg` points at `iov`, whose slices are valid for the duration of the call.
            let r = unsafe {
                libc::sendmsg(
                    self.as_raw_fd(),
                    &msg,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if r >= 0 {
                return Ok(Some(r as usize));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    fn shutdown(&mut self) {
        let _ = TcpStream::shutdown(self, Shutdown::Both);
    }

    fn peer(&self) -> String {
        self.peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into())
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        TcpStream::local_addr(self).ok()
    }
}
