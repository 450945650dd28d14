//! [`SocketRing`]: a poller's stream sockets received through io_uring: one multishot receive per
//! socket into a ring of provided buffers, in a private ring set up with `SINGLE_ISSUER |
//! DEFER_TASKRUN | TASKRUN_FLAG` (Linux 6.1+); and their sends, several sockets' in one
//! `io_uring_enter`.
//!
//! Against readiness (`epoll_wait`, then `recv` per ready socket) this saves both system calls
//! of a receive: the kernel runs the receive as deferred work when data arrives, sets
//! `IORING_SQ_TASKRUN` in the ring's shared flags (a spinning poller sees it with one load), and
//! the poller's one `io_uring_enter` ([`SocketRing::reap`]) runs every receive that is due and
//! returns their completions. A sleeping poller waits for the ring's eventfd in its epoll set;
//! a spinning one turns the eventfd off ([`SocketRing::notify`], a store to the ring's shared
//! flags), so receives while it spins signal nobody.
//!
//! Order: with DEFER_TASKRUN the kernel receives only inside this thread's `io_uring_enter`, so
//! once [`SocketRing::reap`] has returned every completion, a plain `recv` on one of the sockets
//! (reading a large payload straight into its destination) gets the bytes that follow them, and
//! the next receive of the ring gets the bytes after those.
//!
//! Sends ([`SocketRing::send`]) carry `MSG_DONTWAIT`: the kernel sends what the socket takes
//! when it issues the request, inside the submitting `io_uring_enter`, and completes it there
//! (`-EAGAIN` when the socket takes nothing) instead of waiting for room; a send's memory is
//! therefore free again when the enter returns (the caller still waits for every completion,
//! [`SocketRing::wait_sends`], rather than rely on it).

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
/// The tag bit of sends (receives' tags must not have it).
pub const SEND_TAG: u64 = 1 << 63;

/// One completion. Of a receive: `tag` as given to [`SocketRing::recv`]; `res` the bytes received
/// into buffer `buf` (see [`SocketRing::buf`]), 0 when the peer closed, or a negative errno
/// (`-ENOBUFS`: the buffers ran out); `more`: the receive goes on (otherwise it ended and must be
/// started again to receive more). Of a send: `tag` with [`SEND_TAG`] set, `res` the bytes sent
/// or a negative errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub tag: u64,
    pub res: i32,
    pub buf: Option<u16>,
    pub more: bool,
}

/// Multishot receives on stream sockets into provided buffers (see the module docs).
pub struct SocketRing {
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
    /// Sends queued or submitted whose completion was not reaped yet.
    sends: usize,
}

// SAFETY: the mappings are owned by the ring and only used by the thread that owns it (the
// ring is created on its poller thread and never shared).
unsafe impl Send for SocketRing {}

impl std::fmt::Debug for SocketRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketRing")
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

impl SocketRing {
    /// A ring with `count` receive buffers (a power of two, at most 32768) of `size` bytes.
    /// Must be called on the thread that uses it (the ring's single issuer). Fails where the
    /// kernel lacks DEFER_TASKRUN, TASKRUN_FLAG or buffer rings (before 6.1): the caller then
    /// reads its sockets itself.
    pub fn new(count: u16, size: u32) -> io::Result<SocketRing> {
        if !count.is_power_of_two() || count > 32768 || size == 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let mut ring = sys::private_ring(64, u32::from(count) * 2)?;
        let efd = sys::eventfd()?;
        ring.submitter().register_eventfd(efd.as_raw_fd())?;
        ring.completion().disable_eventfd();
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
        let mut r = SocketRing {
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
            sends: 0,
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
    /// in epoll ([`SocketRing::reap`] consumes the work, not a read of the counter).
    pub fn eventfd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.efd.as_fd()
    }

    /// Whether the kernel signals the eventfd when receive work becomes due (off at first):
    /// a store to the ring's shared flags, no system call. A sleeper turns it on and then looks
    /// at [`SocketRing::pending`] once more (work queued before it was on signalled nothing).
    pub fn notify(&mut self, on: bool) {
        if on {
            self.ring.completion().enable_eventfd();
            // The kernel sets the TASKRUN flag and then reads the eventfd flag; this stores the
            // eventfd flag and then (in `pending`) reads the TASKRUN flag: one of the two sees
            // the other's store.
            std::sync::atomic::fence(Ordering::SeqCst);
        } else {
            self.ring.completion().disable_eventfd();
        }
    }

    /// Whether receive work or completions wait for [`SocketRing::reap`]: one load, no system
    /// call.
    pub fn pending(&mut self) -> bool {
        self.ring.submission().taskrun()
            || !self.ring.completion().is_empty()
            || !self.ring.submission().is_empty()
    }

    /// Starts a multishot receive on `fd` under `tag` (submitted by the next
    /// [`SocketRing::reap`] or [`SocketRing::submit`]). The receive holds its own reference to the
    /// socket: it ends when the peer closes, on an error, when the buffers run out, or at
    /// [`SocketRing::cancel`].
    pub fn recv(&mut self, fd: RawFd, tag: u64) -> io::Result<()> {
        if tag & SEND_TAG != 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let e = opcode::RecvMulti::new(types::Fd(fd), GROUP)
            .build()
            .user_data(tag);
        self.push(e)?;
        self.active += 1;
        Ok(())
    }

    /// Queues a gathering send of `msg` on `fd` (flags `MSG_DONTWAIT | MSG_NOSIGNAL`), submitted by
    /// the next [`SocketRing::reap`] or [`SocketRing::submit`]; its completion carries
    /// `tag | SEND_TAG`.
    ///
    /// # Safety
    /// `msg`, its iovecs and the bytes they point at stay valid and unchanged until the send's
    /// completion has been reaped.
    pub unsafe fn send(&mut self, fd: RawFd, msg: *const libc::msghdr, tag: u64) -> io::Result<()> {
        let flags = (libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32;
        let e = opcode::SendMsg::new(types::Fd(fd), msg)
            .flags(flags)
            .build()
            .user_data(tag | SEND_TAG);
        self.push(e)?;
        self.sends += 1;
        Ok(())
    }

    /// Sends whose completion was not reaped yet.
    pub fn sends(&self) -> usize {
        self.sends
    }

    /// Submits what is queued and reaps until no send is left without its completion (with
    /// `MSG_DONTWAIT` they complete inside the first enter; this waits should a kernel do
    /// otherwise). Receive completions reaped on the way are appended to `out` too.
    pub fn wait_sends(&mut self, out: &mut Vec<Received>) -> io::Result<()> {
        self.reap(out)?;
        while self.sends > 0 {
            // EBUSY/EAGAIN: a completion backlog, drained by the take below.
            self.ring
                .submit_and_wait(1)
                .or_else(|e| match e.raw_os_error() {
                    Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => Ok(0),
                    _ => Err(e),
                })?;
            self.take(out);
        }
        Ok(())
    }

    /// Ends the receive under `tag` (its last completion, `-ECANCELED` or data received before,
    /// still comes through [`SocketRing::reap`]).
    pub fn cancel(&mut self, tag: u64) -> io::Result<()> {
        let e = opcode::AsyncCancel::new(tag).build().user_data(CANCEL_UD);
        self.push(e)
    }

    fn push(&mut self, e: io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: receive and cancel requests point at no memory of ours but the buffer
            // ring, registered for the ring's life; a send's memory is its caller's to keep
            // (`send`'s contract); the socket is the kernel's reference.
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
    /// caller's until it gives them back with [`SocketRing::recycle`].
    pub fn reap(&mut self, out: &mut Vec<Received>) -> io::Result<()> {
        let r = self.enter();
        self.take(out);
        r
    }

    /// Appends the completions there are to `out` (no system call).
    fn take(&mut self, out: &mut Vec<Received>) {
        for c in self.ring.completion() {
            if c.user_data() == CANCEL_UD {
                continue;
            }
            let more = cqueue::more(c.flags());
            if c.user_data() & SEND_TAG != 0 {
                self.sends = self.sends.saturating_sub(1);
            } else if !more {
                self.active = self.active.saturating_sub(1);
            }
            out.push(Received {
                tag: c.user_data(),
                res: c.result(),
                buf: cqueue::buffer_select(c.flags()),
                more,
            });
        }
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

impl Drop for SocketRing {
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
            let ud = c.user_data();
            if ud != CANCEL_UD && ud & SEND_TAG == 0 && !cqueue::more(c.flags()) {
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

    fn ring(count: u16, size: u32) -> Option<SocketRing> {
        match SocketRing::new(count, size) {
            Ok(r) => Some(r),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
                eprintln!("skipped: kernel without DEFER_TASKRUN or buffer rings ({e})");
                None
            }
            Err(e) => panic!("SocketRing::new: {e}"),
        }
    }

    /// Everything received for `tag` until nothing more is due, recycling the buffers.
    fn drain(r: &mut SocketRing, tag: u64) -> (Vec<u8>, Vec<Received>) {
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
        // Notifications off (the start): flagged, not signalled.
        c.write_all(b"quiet").unwrap();
        assert!(r.pending());
        assert_eq!(
            sys::eventfd_drain(r.eventfd()),
            0,
            "not signalled while off"
        );
        assert_eq!(drain(&mut r, 7).0, b"quiet");
        r.notify(true);
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

    /// A send of `bytes` through the ring: the header and iovec it needs, kept by the caller.
    fn msg(bytes: &[u8], iov: &mut libc::iovec) -> libc::msghdr {
        *iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        // SAFETY: plain data, all-zero is an empty header.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = iov;
        m.msg_iovlen = 1;
        m
    }

    #[test]
    fn sends_of_several_sockets_complete_in_one_enter_and_a_full_one_says_so() {
        let Some(mut r) = ring(4, 64) else { return };
        let (mut c1, s1) = pair();
        let (mut c2, s2) = pair();
        // Both sockets' receives run in the ring too: their completions come with the sends'.
        r.recv(s1.as_raw_fd(), 1).unwrap();
        r.submit().unwrap();
        c1.write_all(b"in").unwrap();
        let (a, b) = (b"to the first".to_vec(), b"to the second".to_vec());
        let (mut i1, mut i2) = (
            libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
            libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            },
        );
        let (m1, m2) = (msg(&a, &mut i1), msg(&b, &mut i2));
        // SAFETY: the headers, iovecs and bytes live until `wait_sends` below returns.
        unsafe {
            r.send(s1.as_raw_fd(), &m1, 1).unwrap();
            r.send(s2.as_raw_fd(), &m2, 2).unwrap();
        }
        assert_eq!(r.sends(), 2);
        let mut out = Vec::new();
        r.wait_sends(&mut out).unwrap();
        assert_eq!(r.sends(), 0);
        let mut sends: Vec<_> = out
            .iter()
            .filter(|c| c.tag & SEND_TAG != 0)
            .map(|c| (c.tag & !SEND_TAG, c.res))
            .collect();
        sends.sort();
        assert_eq!(
            sends,
            vec![(1, a.len() as i32), (2, b.len() as i32)],
            "{out:?}"
        );
        let recv: Vec<_> = out.iter().filter(|c| c.tag & SEND_TAG == 0).collect();
        assert_eq!(recv.len(), 1, "the receive that was due: {out:?}");
        r.recycle(recv[0].buf.unwrap());
        let mut got = vec![0u8; a.len()];
        c1.read_exact(&mut got).unwrap();
        assert_eq!(got, a);
        let mut got = vec![0u8; b.len()];
        c2.read_exact(&mut got).unwrap();
        assert_eq!(got, b);

        // A socket that takes nothing more: the send completes at once with -EAGAIN instead
        // of waiting for room (nobody reads c2 in this test).
        let big = vec![7u8; 1 << 20];
        let mut i3 = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let m3 = msg(&big, &mut i3);
        let mut sent = 0usize;
        let mut again = false;
        for _ in 0..64 {
            // SAFETY: as above.
            unsafe { r.send(s2.as_raw_fd(), &m3, 3).unwrap() };
            let mut out = Vec::new();
            r.wait_sends(&mut out).unwrap();
            let res = out.iter().find(|c| c.tag & SEND_TAG != 0).unwrap().res;
            if res == -libc::EAGAIN {
                again = true;
                break;
            }
            assert!(res > 0, "{res}");
            sent += res as usize;
        }
        assert!(again, "the socket filled up after {sent} bytes");
        assert_eq!(r.sends(), 0);
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
