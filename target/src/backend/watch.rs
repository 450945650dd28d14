//! [`ReadyWatch`]: "did anything happen on this descriptor?" answered by one load from shared
//! memory instead of a system call.
//!
//! A busy-polling poller that finds nothing to do would otherwise call `epoll_wait(0)` on every
//! pass, and that empty system call is the largest cost of its spin. A `ReadyWatch` keeps one
//! multishot `IORING_OP_POLL_ADD` on the poller's epoll descriptor in a small private io_uring
//! set up with `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG` (Linux 6.1+). When any watched
//! socket (or the wake eventfd) signals the epoll descriptor, the kernel queues the poll's
//! completion as deferred work and sets `IORING_SQ_TASKRUN` in the ring's shared flags, in the
//! context of whoever made the socket ready: no interrupt to the spinning thread, no system call
//! by it until something happened.
//!
//! The notification is an edge: it fires when the epoll descriptor is signalled, not while it
//! stays ready. The caller must therefore [`ReadyWatch::rearm`] first and then confirm with one
//! more `epoll_wait(0)` that nothing is ready (readiness that came in between is caught by that
//! `epoll_wait`, readiness after `rearm` by the watch); only then may it trust
//! [`ReadyWatch::fired`].

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use io_uring::{cqueue, opcode, types, IoUring};

use super::sys;

/// `user_data` of the poll request.
const POLL_UD: u64 = 1;

/// A multishot poll for readability on one descriptor, checked without a system call.
pub struct ReadyWatch {
    ring: IoUring,
    fd: RawFd,
    /// The multishot poll is armed (its last completion carried `IORING_CQE_F_MORE`).
    armed: bool,
}

impl std::fmt::Debug for ReadyWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadyWatch")
            .field("fd", &self.fd)
            .field("armed", &self.armed)
            .finish()
    }
}

impl ReadyWatch {
    /// Watch `fd` (which must stay open for the life of the watch) for readability. Must be
    /// called on the thread that uses the watch (the ring's single issuer). Fails where the
    /// kernel lacks DEFER_TASKRUN or TASKRUN_FLAG (before 6.1): the caller then polls with
    /// system calls as before.
    pub fn new(fd: BorrowedFd<'_>) -> io::Result<ReadyWatch> {
        let ring = sys::private_ring(4, 16)?;
        let mut w = ReadyWatch {
            ring,
            fd: fd.as_raw_fd(),
            armed: false,
        };
        w.rearm()?;
        Ok(w)
    }

    /// Whether the descriptor was signalled since the last [`ReadyWatch::rearm`] (or the watch
    /// needs one). One atomic load, no system call.
    pub fn fired(&mut self) -> bool {
        !self.armed || self.ring.submission().taskrun() || !self.ring.completion().is_empty()
    }

    /// Consume the notifications so far (one `io_uring_enter` that runs the deferred poll
    /// completion) and re-arm the poll if the kernel ended it. Afterwards [`ReadyWatch::fired`]
    /// reports only later signals.
    pub fn rearm(&mut self) -> io::Result<()> {
        if !self.armed {
            let e = opcode::PollAdd::new(types::Fd(self.fd), libc::POLLIN as u32)
                .multi(true)
                .build()
                .user_data(POLL_UD);
            // SAFETY: a poll request refers to no memory of ours; `fd` outlives the watch (the
            // caller's contract), and the request is cancelled when the ring is dropped.
            unsafe { self.ring.submission().push(&e) }
                .map_err(|_| io::Error::other("watch ring submission queue full"))?;
            self.armed = true;
        }
        loop {
            match sys::enter_nowait(&mut self.ring) {
                Ok(true) => break,
                Ok(false) => self.drain(),
                Err(e) => {
                    self.armed = false;
                    return Err(e);
                }
            }
        }
        self.drain();
        Ok(())
    }

    /// Drop the posted completions; a completion without `IORING_CQE_F_MORE` (an error, or CQ
    /// overflow) ended the multishot poll.
    fn drain(&mut self) {
        for c in self.ring.completion() {
            if c.user_data() == POLL_UD && !cqueue::more(c.flags()) {
                self.armed = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tcp_pair as pair;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

    #[test]
    fn fires_when_a_watched_socket_becomes_readable_and_only_then() {
        let (mut c, mut s) = pair();
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).unwrap();
        ep.add(&s, EpollEvent::new(EpollFlags::EPOLLIN, 7)).unwrap();
        let mut w = match ReadyWatch::new(ep.0.as_fd()) {
            Ok(w) => w,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("skipped: kernel without DEFER_TASKRUN/TASKRUN_FLAG ({e})");
                return;
            }
            Err(e) => panic!("ReadyWatch::new: {e}"),
        };
        assert!(!w.fired(), "nothing happened yet");
        for round in 0..3u8 {
            c.write_all(&[round; 5]).unwrap();
            // Loopback delivers in the writer's context: the flag is set when write returns.
            assert!(w.fired(), "round {round}: data arrived");
            assert!(w.fired(), "round {round}: stays set until rearm");
            w.rearm().unwrap();
            // An edge: the socket is still readable, but nothing new happened.
            assert!(!w.fired(), "round {round}: consumed by rearm");
            let mut ev = [EpollEvent::empty(); 4];
            assert_eq!(ep.wait(&mut ev, EpollTimeout::ZERO).unwrap(), 1);
            let mut b = [0u8; 16];
            assert_eq!(s.read(&mut b).unwrap(), 5);
            assert_eq!(ep.wait(&mut ev, EpollTimeout::ZERO).unwrap(), 0);
            assert!(!w.fired(), "round {round}: reading signals nothing");
        }
        drop(c);
        assert!(w.fired(), "the peer's close is readiness too");
    }
}
