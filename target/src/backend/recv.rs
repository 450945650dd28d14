//! [`RecvRing`]: a poller's stream sockets received through io_uring: one multishot receive per
//! socket into a ring of provided buffers, in a private ring set up with `SINGLE_ISSUER |
//! DEFER_TASKRUN | TASKRUN_FLAG` (Linux 6.1+).
//!
//! Against readiness (`epoll_wait`, then `recv` per ready socket) this saves both system calls
//! of a receive: the kernel runs the receive as deferred work when data arrives, sets
//! `IORING_SQ_TASKRUN` in the ring's shared flags (a spinning poller sees it with one load), and
//! the poller's one `io_uring_enter` ([`RecvRing::reap`]) runs every receive that is due and
//! returns their completions. A sleeping poller waits for the ring's eventfd in its epoll set.
//!
//! Order: with DEFER_TASKRUN the kernel receives only inside this thread's `io_uring_enter`, so
//! once [`RecvRing::reap`] has returned every completion, a plain `recv` on one of the sockets
//! (reading a large payload straight into its destination) gets the bytes that follow them, and
//! the next receive of the ring gets the bytes after those.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::{cqueue, opcode, types, IoUring};

use super::sys;

/// The provided-buffer group of the receive buffers.
const GROUP: u16 = 0;
/// `user_data` of cancel requests (their completions carry nothing).
const CANCEL_UD: u64 = u64::MAX;

/// One receive completion: `tag` as given to [`RecvRing::recv`]; `res` the bytes received into
/// buffer `buf` (see [`RecvRing::buf`]), 0 when the peer closed, or a negative errno (`-ENOBUFS`:
/// the buffers ran out); `more`: the receive goes on (otherwise it ended and must be started
/// again to receive more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub tag: u64,
    pub res: i32,
    pub buf: Option<u16>,
    pub more: bool,
}

/// Multishot receives on stream sockets into provided buffers (see the module docs).
pub struct RecvRing {
    ring: IoUring,
    /// Signalled when receive work becomes due (for a poller that sleeps in epoll).
    efd: OwnedFd,
    /// The buffer ring's entries (a page-aligned anonymous mapping of `count` entries; the tail
    /// lives in the first entry).
    entries: NonNull<types::BufRingEntry>,
    entries_len: usize,
    /// The buffers, `count` of `size` bytes in one anonymous mapping.
    bufs: NonNull<u8>,
    bufs_len: usize,
    count: u16,
    size: u32,
    /// The tail as published to the kernel.
    tail: u16,
    /// Receives started and not yet ended (a completion without `more`).
    active: usize,
}

// SAFETY: the mappings are owned by the ring and only used by the thread that owns it (the
// ring is created on its poller thread and never shared).
unsafe impl Send for RecvRing {}

impl std::fmt::Debug for RecvRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRing")
            .field("count", &self.count)
            .field("size", &self.size)
            .field("active", &self.active)
            .finish_non_exhaustive()
    }
}

fn map_anon(len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

impl RecvRing {
    /// A ring with `count` receive buffers (a power of two, at most 32768) of `size` bytes.
    /// Must be called on the thread that uses it (the ring's single issuer). Fails where the
    /// kernel lacks DEFER_TASKRUN, TASKRUN_FLAG or buffer rings (before 6.1): the caller then
    /// reads its sockets itself.
    pub fn new(count: u16, size: u32) -> io::Result<RecvRing> {
        if !count.is_power_of_two() || count > 32768 || size == 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let ring = sys::private_ring(64, u32::from(count) * 2)?;
        let efd = sys::eventfd()?;
        ring.submitter().register_eventfd(efd.as_raw_fd())?;
        let entries_len =
            (usize::from(count) * std::mem::size_of::<types::BufRingEntry>()).max(4096);
        let entries = map_anon(entries_len)?.cast::<types::BufRingEntry>();
        let bufs_len = usize::from(count) * size as usize;
        let bufs = match map_anon(bufs_len) {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: the mapping made just above, used by nothing.
                unsafe { libc::munmap(entries.as_ptr().cast(), entries_len) };
                return Err(e);
            }
        };
        let mut r = RecvRing {
            ring,
            efd,
            entries,
            entries_len,
            bufs,
            bufs_len,
            count,
            size,
            tail: 0,
            active: 0,
        };
        for bid in 0..count {
            r.put(bid);
        }
        r.publish();
        // SAFETY: the entries mapping is page-aligned, holds `count` entries and lives until
        // `Drop`, which unregisters the group first.
        unsafe {
            r.ring.submitter().register_buf_ring_with_flags(
                r.entries.as_ptr() as u64,
                count,
                GROUP,
                0,
            )?;
        }
        Ok(r)
    }

    /// The eventfd the kernel signals when receive work becomes due, for a poller that sleeps
    /// in epoll ([`RecvRing::reap`] consumes the work, not a read of the counter).
    pub fn eventfd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.efd.as_fd()
    }

    /// Resets the eventfd's counter (before a sleeper arms its epoll entry again).
    pub fn drain_eventfd(&self) {
        sys::eventfd_drain(self.eventfd());
    }

    /// Whether receive work or completions wait for [`RecvRing::reap`]: one load, no system
    /// call.
    pub fn pending(&mut self) -> bool {
        self.ring.submission().taskrun()
            || !self.ring.completion().is_empty()
            || !self.ring.submission().is_empty()
    }

    /// Starts a multishot receive on `fd` under `tag` (submitted by the next
    /// [`RecvRing::reap`] or [`RecvRing::submit`]). The receive holds its own reference to the
    /// socket: it ends when the peer closes, on an error, when the buffers run out, or at
    /// [`RecvRing::cancel`].
    pub fn recv(&mut self, fd: RawFd, tag: u64) -> io::Result<()> {
        if tag == CANCEL_UD {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let e = opcode::RecvMulti::new(types::Fd(fd), GROUP)
            .build()
            .user_data(tag);
        self.push(e)?;
        self.active += 1;
        Ok(())
    }

    /// Ends the receive under `tag` (its last completion, `-ECANCELED` or data received before,
    /// still comes through [`RecvRing::reap`]).
    pub fn cancel(&mut self, tag: u64) -> io::Result<()> {
        let e = opcode::AsyncCancel::new(tag).build().user_data(CANCEL_UD);
        self.push(e)
    }

    fn push(&mut self, e: io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: receive and cancel requests point at no memory of ours but the buffer
            // ring, registered for the ring's life; the socket is the kernel's reference.
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                return Ok(());
            }
            self.enter()?;
        }
    }

    /// Submits what is queued and runs the receive work that is due, without waiting.
    pub fn submit(&mut self) -> io::Result<()> {
        self.enter()
    }

    fn enter(&mut self) -> io::Result<()> {
        // A completion backlog (`Ok(false)`) is drained by the caller's reap.
        sys::enter_nowait(&mut self.ring).map(drop)
    }

    /// Runs the receive work that is due (one `io_uring_enter`, which also submits what is
    /// queued) and appends every completion to `out`. The buffers named in `out` are the
    /// caller's until it gives them back with [`RecvRing::recycle`].
    pub fn reap(&mut self, out: &mut Vec<Received>) -> io::Result<()> {
        let r = self.enter();
        for c in self.ring.completion() {
            if c.user_data() == CANCEL_UD {
                continue;
            }
            let more = cqueue::more(c.flags());
            if !more {
                self.active = self.active.saturating_sub(1);
            }
            out.push(Received {
                tag: c.user_data(),
                res: c.result(),
                buf: cqueue::buffer_select(c.flags()),
                more,
            });
        }
        r
    }

    /// The first `len` bytes received into buffer `bid` (a buffer a completion named and not
    /// yet recycled); None for a buffer or length the ring does not have.
    pub fn buf(&self, bid: u16, len: usize) -> Option<&[u8]> {
        if bid >= self.count || len > self.size as usize {
            return None;
        }
        let at = usize::from(bid) * self.size as usize;
        // SAFETY: inside the buffers mapping (checked above); the kernel wrote it before posting
        // the completion and writes it again only after `recycle`, which takes `&mut self`.
        Some(unsafe { std::slice::from_raw_parts(self.bufs.as_ptr().add(at), len) })
    }

    /// Gives buffer `bid` back to the kernel.
    pub fn recycle(&mut self, bid: u16) {
        if bid >= self.count {
            return;
        }
        self.put(bid);
        self.publish();
    }

    fn put(&mut self, bid: u16) {
        let i = usize::from(self.tail & (self.count - 1));
        let addr = self.bufs.as_ptr() as u64 + u64::from(bid) * u64::from(self.size);
        // SAFETY: `i < count`, inside the entries mapping; the kernel reads entries only up to
        // the published tail, and this one is past it until `publish`.
        let e = unsafe { &mut *self.entries.as_ptr().add(i) };
        e.set_addr(addr);
        e.set_len(self.size);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&mut self) {
        // SAFETY: the tail field of the first entry, a u16 the kernel reads with acquire
        // semantics; published with release after the entries it covers were written.
        unsafe {
            let tail = types::BufRingEntry::tail(self.entries.as_ptr()) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    /// Receives started and not ended.
    pub fn active(&self) -> usize {
        self.active
    }
}

impl Drop for RecvRing {
    fn drop(&mut self) {
        // Cancel every receive and run the cancellations (receives happen only inside this
        // thread's enter, so none writes a buffer after this), then take the buffer group back
        // before unmapping it.
        let e = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL_UD);
        // SAFETY: a cancel request points at no memory.
        if unsafe { self.ring.submission().push(&e) }.is_ok() {
            let _ = self.enter();
        }
        for c in self.ring.completion() {
            if c.user_data() != CANCEL_UD && !cqueue::more(c.flags()) {
                self.active = self.active.saturating_sub(1);
            }
        }
        let unregistered = self.ring.submitter().unregister_buf_ring(GROUP).is_ok();
        if unregistered && self.active == 0 {
            // SAFETY: mappings made in `new`, no longer referenced by the kernel.
            unsafe {
                libc::munmap(self.entries.as_ptr().cast(), self.entries_len);
                libc::munmap(self.bufs.as_ptr().cast(), self.bufs_len);
            }
        } else if unregistered {
            // A receive not seen to end may still hold a buffer: leave the buffers mapped.
            // SAFETY: as above, for the entries only.
            unsafe { libc::munmap(self.entries.as_ptr().cast(), self.entries_len) };
        }
        // Not unregistered: both stay mapped (the ring's teardown may still use them).
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tcp_pair as pair;
    use std::io::{Read, Write};

    fn ring(count: u16, size: u32) -> Option<RecvRing> {
        match RecvRing::new(count, size) {
            Ok(r) => Some(r),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
                eprintln!("skipped: kernel without DEFER_TASKRUN or buffer rings ({e})");
                None
            }
            Err(e) => panic!("RecvRing::new: {e}"),
        }
    }

    /// Everything received for `tag` until nothing more is due, recycling the buffers.
    fn drain(r: &mut RecvRing, tag: u64) -> (Vec<u8>, Vec<Received>) {
        let mut got = Vec::new();
        let mut all = Vec::new();
        let mut out = Vec::new();
        r.reap(&mut out).unwrap();
        for c in out {
            assert_eq!(c.tag, tag);
            if c.res > 0 {
                let b = c.buf.expect("data comes in a buffer");
                got.extend_from_slice(r.buf(b, c.res as usize).unwrap());
                r.recycle(b);
            }
            all.push(c);
        }
        (got, all)
    }

    #[test]
    fn receives_in_order_flags_the_work_and_signals_the_eventfd() {
        let Some(mut r) = ring(8, 64) else { return };
        let (mut c, s) = pair();
        r.recv(s.as_raw_fd(), 7).unwrap();
        r.submit().unwrap();
        assert!(!r.pending(), "nothing arrived yet");
        for round in 0..20u8 {
            // More than one buffer's worth, more than all buffers' worth over the rounds.
            let msg: Vec<u8> = (0..100)
                .map(|i| round.wrapping_mul(31).wrapping_add(i))
                .collect();
            c.write_all(&msg).unwrap();
            // Loopback delivers in the writer's context: the work is flagged when write returns.
            assert!(r.pending(), "round {round}: data arrived");
            assert!(
                sys::eventfd_drain(r.eventfd()) > 0,
                "round {round}: signalled"
            );
            let (got, cs) = drain(&mut r, 7);
            assert_eq!(got, msg, "round {round}");
            assert!(cs.iter().all(|c| c.more), "round {round}: still receiving");
            assert!(!r.pending(), "round {round}: consumed");
        }
        drop(c);
        let (got, cs) = drain(&mut r, 7);
        assert!(got.is_empty());
        assert_eq!(
            cs.last().map(|c| (c.res, c.more)),
            Some((0, false)),
            "EOF ends it"
        );
        assert_eq!(r.active(), 0);
    }

    #[test]
    fn a_plain_read_between_reaps_keeps_the_stream_in_order() {
        let Some(mut r) = ring(4, 16) else { return };
        let (mut c, mut s) = pair();
        r.recv(s.as_raw_fd(), 1).unwrap();
        r.submit().unwrap();
        c.write_all(b"0123456789abcdef").unwrap();
        let (got, _) = drain(&mut r, 1);
        assert_eq!(got, b"0123456789abcdef");
        // Bytes the poller reads itself (a large payload straight into its buffer) ...
        c.write_all(b"PAYLOAD").unwrap();
        let mut p = [0u8; 7];
        assert_eq!(s.read(&mut p).unwrap(), 7);
        assert_eq!(&p, b"PAYLOAD");
        // ... and the ring goes on with what follows.
        c.write_all(b"next").unwrap();
        let (got, _) = drain(&mut r, 1);
        assert_eq!(got, b"next");
    }

    #[test]
    fn running_out_of_buffers_ends_the_receive_and_a_new_one_resumes() {
        let Some(mut r) = ring(2, 8) else { return };
        let (mut c, s) = pair();
        r.recv(s.as_raw_fd(), 3).unwrap();
        r.submit().unwrap();
        c.write_all(&[5u8; 40]).unwrap();
        let mut out = Vec::new();
        r.reap(&mut out).unwrap();
        let data: usize = out
            .iter()
            .filter(|c| c.res > 0)
            .map(|c| c.res as usize)
            .sum();
        assert_eq!(data, 16, "two buffers of 8: {out:?}");
        let last = *out.last().unwrap();
        assert_eq!((last.res, last.more), (-libc::ENOBUFS, false), "{out:?}");
        for c in &out {
            if let Some(b) = c.buf {
                r.recycle(b);
            }
        }
        let mut got = 16;
        while got < 40 {
            r.recv(s.as_raw_fd(), 3).unwrap();
            let mut out = Vec::new();
            r.reap(&mut out).unwrap();
            for c in out {
                if c.res > 0 {
                    got += c.res as usize;
                    r.recycle(c.buf.unwrap());
                }
            }
        }
        assert_eq!(got, 40);
    }

    #[test]
    fn a_cancelled_receive_ends_and_releases_the_socket() {
        let Some(mut r) = ring(4, 64) else { return };
        let (mut c, s) = pair();
        r.recv(s.as_raw_fd(), 9).unwrap();
        r.submit().unwrap();
        r.cancel(9).unwrap();
        let mut out = Vec::new();
        r.reap(&mut out).unwrap();
        assert_eq!(out.last().map(|c| c.more), Some(false), "{out:?}");
        assert_eq!(r.active(), 0);
        // Our descriptor was the last reference: the peer sees the close.
        drop(s);
        c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 1];
        assert_eq!(c.read(&mut b).unwrap(), 0);
    }
}
