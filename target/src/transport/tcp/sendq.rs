//! An outgoing byte queue for one stream socket: small inline pieces (PDU headers, CQEs,
//! digests) and borrowed data slices (read data in a slot's registered buffer), sent with one
//! gathering send per flush (`sendmsg` on a socket, see [`super::wire::Wire`]). No copy of
//! payload bytes, no heap allocation per item.

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use arrayvec::ArrayVec;

use super::wire::Wire;

/// Bytes of inline storage per item: any PDU header region (header, header digest, padding to
/// a host PDA of up to 128 bytes) fits.
pub const INLINE_MAX: usize = 136;
const _: () = assert!(nvme::tcp::MAX_TX_HEADER_REGION <= INLINE_MAX);

/// At most this many iovecs per send.
const MAX_IOV: usize = 64;

#[derive(Debug)]
enum Item {
    /// Bytes stored in the item itself.
    Inline {
        buf: [u8; INLINE_MAX],
        len: u8,
        off: u8,
    },
    /// `len` bytes at `ptr`, which the owner keeps valid until the matching `Release` is
    /// reported by [`SendQueue::flush`].
    Data {
        ptr: *const u8,
        len: usize,
        off: usize,
    },
    /// Everything queued before this has left the process: report `tag` to the caller.
    Release(u32),
}

/// A FIFO of bytes to send on one socket.
pub struct SendQueue {
    items: VecDeque<Item>,
    queued_bytes: usize,
}

// SAFETY: the raw pointers in `Item::Data` point into buffers owned by the poller thread that
// owns this queue; the queue is only used on that thread (Send is needed only to move a freshly
// created, empty queue to its poller).
unsafe impl Send for SendQueue {}

impl SendQueue {
    pub fn with_capacity(n: usize) -> SendQueue {
        SendQueue {
            items: VecDeque::with_capacity(n),
            queued_bytes: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes not yet handed to the kernel.
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// Queue a PDU header region (a fixed-size copy, no call to memcpy).
    #[inline]
    pub fn push_header(&mut self, h: &nvme::tcp::TxHeader) {
        let mut buf = [0u8; INLINE_MAX];
        buf[..nvme::tcp::MAX_TX_HEADER_REGION].copy_from_slice(h.padded());
        self.push_inline_buf(buf, h.as_bytes().len());
    }

    /// Queue a copy of `bytes` (at most [`INLINE_MAX`]).
    ///
    /// # Panics
    /// If `bytes` is longer than [`INLINE_MAX`] (a caller bug: PDU headers are shorter).
    pub fn push_inline(&mut self, bytes: &[u8]) {
        assert!(
            bytes.len() <= INLINE_MAX,
            "inline item of {} bytes",
            bytes.len()
        );
        let mut buf = [0u8; INLINE_MAX];
        buf[..bytes.len()].copy_from_slice(bytes);
        self.push_inline_buf(buf, bytes.len());
    }

    /// Queue the first `len` bytes of `buf` (nothing for 0).
    #[inline]
    fn push_inline_buf(&mut self, buf: [u8; INLINE_MAX], len: usize) {
        if len == 0 {
            return;
        }
        self.queued_bytes += len;
        self.items.push_back(Item::Inline {
            buf,
            len: len as u8,
            off: 0,
        });
    }

    /// Queue `len` bytes at `ptr` without copying.
    ///
    /// # Safety
    /// The memory must stay valid and unmodified until a later [`SendQueue::push_release`]
    /// marker has been reported by `flush` or `clear`.
    pub unsafe fn push_data(&mut self, ptr: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        self.queued_bytes += len;
        self.items.push_back(Item::Data { ptr, len, off: 0 });
    }

    /// Queue a marker: `flush` reports `tag` once all bytes before it are sent.
    pub fn push_release(&mut self, tag: u32) {
        self.items.push_back(Item::Release(tag));
    }

    /// Drop everything queued; reports the pending release tags (the caller frees their
    /// buffers: the connection is going away).
    pub fn clear(&mut self, mut released: impl FnMut(u32)) {
        for it in self.items.drain(..) {
            if let Item::Release(t) = it {
                released(t);
            }
        }
        self.queued_bytes = 0;
    }

    /// Send as much as the stream takes now. Calls `released` for each marker passed.
    /// Returns Ok(true) when the queue is empty afterwards, Ok(false) when the stream is full.
    pub fn flush(
        &mut self,
        wire: &mut impl Wire,
        mut released: impl FnMut(u32),
    ) -> io::Result<bool> {
        loop {
            self.release_front(&mut released);
            if self.items.is_empty() {
                return Ok(true);
            }
            // The gather list borrows the items; it ends before they are popped.
            let sent = {
                // Not an array of MAX_IOV empty slices: filling one in costs more than gathering.
                let mut iov = ArrayVec::<IoSlice<'_>, MAX_IOV>::new();
                self.pieces(MAX_IOV, |p| iov.push(IoSlice::new(p)));
                wire.send(&iov)?
            };
            let Some(sent) = sent else {
                return Ok(false);
            };
            self.advance(sent, &mut released);
        }
    }

    /// For a send the caller makes itself (through io_uring): fills `iov` with the bytes to
    /// send next and returns how many entries it filled (0: nothing to send). The memory they
    /// point at stays valid until [`SendQueue::advance`] or [`SendQueue::clear`]; nothing may be
    /// queued in between (an item queued may move the inline ones). Release markers at the
    /// front are the caller's to take first ([`SendQueue::release_front`]).
    pub fn gather(&self, iov: &mut [libc::iovec]) -> usize {
        debug_assert!(
            !matches!(self.items.front(), Some(Item::Release(_))),
            "release markers at the front are taken before a gather"
        );
        let mut n = 0;
        self.pieces(iov.len().min(MAX_IOV), |p| {
            iov[n] = libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            };
            n += 1;
        });
        n
    }

    /// Reports the release markers at the front (everything before them has left).
    pub fn release_front(&mut self, released: &mut impl FnMut(u32)) {
        while let Some(Item::Release(t)) = self.items.front() {
            let t = *t;
            self.items.pop_front();
            released(t);
        }
    }

    /// Calls `f` with the unsent bytes of the first `max` byte items, in order.
    fn pieces<'a>(&'a self, max: usize, mut f: impl FnMut(&'a [u8])) {
        let mut n = 0;
        for it in self.items.iter() {
            if n == max {
                break;
            }
            match it {
                Item::Inline { buf, len, off } => f(&buf[*off as usize..*len as usize]),
                Item::Data { ptr, len, off } => {
                    // SAFETY: `off < len` and [ptr, ptr+len) stays valid and unchanged until
                    // its release marker is reported (the push_data contract).
                    f(unsafe { std::slice::from_raw_parts(ptr.add(*off), len - off) })
                }
                Item::Release(_) => continue,
            }
            n += 1;
        }
    }

    /// `sent` bytes from the front have left: drops them, and reports the markers they pass.
    pub fn advance(&mut self, mut sent: usize, mut released: impl FnMut(u32)) {
        self.queued_bytes -= sent.min(self.queued_bytes);
        while sent > 0 {
            match self.items.front_mut() {
                Some(Item::Inline { len, off, .. }) => {
                    let rem = (*len - *off) as usize;
                    if sent >= rem {
                        sent -= rem;
                        self.items.pop_front();
                    } else {
                        *off += sent as u8;
                        sent = 0;
                    }
                }
                Some(Item::Data { len, off, .. }) => {
                    let rem = *len - *off;
                    if sent >= rem {
                        sent -= rem;
                        self.items.pop_front();
                    } else {
                        *off += sent;
                        sent = 0;
                    }
                }
                Some(Item::Release(t)) => {
                    let t = *t;
                    self.items.pop_front();
                    released(t);
                }
                None => break,
            }
        }
        // Markers right behind the last byte sent: their data has left.
        self.release_front(&mut released);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::mem::MemWire;

    #[test]
    fn gathers_inline_and_data_and_reports_releases_in_order() {
        let mut w = MemWire::default();
        let data = vec![7u8; 10_000];
        let mut q = SendQueue::with_capacity(8);
        q.push_inline(b"hdr1");
        // SAFETY: `data` outlives the queue's use of it (flushed below before drop).
        unsafe { q.push_data(data.as_ptr(), data.len()) };
        q.push_release(1);
        q.push_inline(b"cqe");
        q.push_release(2);
        let mut rel = Vec::new();
        assert!(q.flush(&mut w, |t| rel.push(t)).unwrap());
        assert_eq!(rel, vec![1, 2]);
        assert_eq!(q.queued_bytes(), 0);
        assert_eq!(w.send_calls, 1, "one gathering send");
        let got = w.take_sent();
        assert_eq!(got.len(), 4 + 10_000 + 3);
        assert_eq!(&got[..4], b"hdr1");
        assert!(got[4..10_004].iter().all(|&x| x == 7));
        assert_eq!(&got[10_004..], b"cqe");
    }

    #[test]
    fn gather_and_advance_report_each_release_once_its_bytes_left() {
        let data = vec![3u8; 1000];
        let mut q = SendQueue::with_capacity(8);
        q.push_release(1);
        q.push_inline(b"hdr");
        // SAFETY: `data` outlives the queue's use of it.
        unsafe { q.push_data(data.as_ptr(), data.len()) };
        q.push_release(2);
        q.push_inline(b"cqe");
        q.push_release(3);
        let mut rel = Vec::new();
        q.release_front(&mut |t| rel.push(t));
        assert_eq!(rel, vec![1], "nothing before it");
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut iov = [empty; 8];
        assert_eq!(q.gather(&mut iov), 3);
        assert_eq!(
            iov[..3].iter().map(|v| v.iov_len).collect::<Vec<_>>(),
            vec![3, 1000, 3]
        );
        // The socket took the header and part of the data: no release yet.
        q.advance(500, |t| rel.push(t));
        assert_eq!(rel, vec![1]);
        assert_eq!(q.queued_bytes(), 3 + 1000 + 3 - 500);
        assert_eq!(q.gather(&mut iov), 2);
        assert_eq!((iov[0].iov_len, iov[1].iov_len), (503, 3));
        // The rest: both markers behind it are reported, in order.
        q.advance(506, |t| rel.push(t));
        assert_eq!(rel, vec![1, 2, 3]);
        assert!(q.is_empty());
        assert_eq!(q.gather(&mut iov), 0);
    }

    #[test]
    fn partial_sends_resume_where_they_stopped() {
        let mut w = MemWire {
            send_room: 1000,
            send_max: 333,
            ..MemWire::default()
        };
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut q = SendQueue::with_capacity(8);
        q.push_inline(b"H");
        // SAFETY: `data` outlives the queue's use of it.
        unsafe { q.push_data(data.as_ptr(), data.len()) };
        q.push_release(9);
        q.push_inline(b"T");
        let mut rel = Vec::new();
        // The stream takes 1000 bytes, 333 per send: the first flush must stop there.
        assert!(!q.flush(&mut w, |t| rel.push(t)).unwrap());
        assert!(rel.is_empty());
        assert_eq!(w.outbound.len(), 1000);
        assert_eq!(q.queued_bytes(), 1 + 100_000 + 1 - 1000);
        while !q.flush(&mut w, |t| rel.push(t)).unwrap() {
            assert!(rel.is_empty(), "released before its data left");
            w.send_room = 7777;
        }
        assert_eq!(rel, vec![9]);
        let got = w.take_sent();
        assert_eq!(got[0], b'H');
        assert_eq!(&got[1..100_001], &data[..]);
        assert_eq!(got[100_001], b'T');
    }
}
