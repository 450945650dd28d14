//! A per-thread pool of fixed-size, page-aligned I/O buffers carved out of one anonymous mapping.
//!
//! The whole pool is one contiguous region so it can be registered once: as io_uring fixed
//! buffers (one iovec per buffer, see [`BufPool::iovecs`]) and as a single RDMA memory region
//! (see [`BufPool::base_ptr`] / [`BufPool::len`]). Allocation is an O(1) pop from a free list
//! preallocated at creation; nothing on the data path touches the heap.
//!
//! # Aliasing contract
//!
//! Each buffer is in one of three states: free, owned (allocated by the caller), or in flight
//! (an io_uring operation, or anything else that called [`BufPool::mark_in_flight`], may be
//! reading or writing it). Safe accessors ([`BufPool::buf`], [`BufPool::buf_mut`]) hand out
//! slices only for owned buffers and borrow the pool for the slice's lifetime, so Rust code
//! never holds a reference to memory the kernel (or a NIC) may be writing. Raw pointers from
//! [`BufPool::buf_ptr`] are for registering the memory with DMA engines; dereferencing them is
//! the caller's responsibility.
//!
//! # Lazy zeroes
//!
//! A null device's read returns zeroes. Writing them into the buffer cost more than half of the
//! target's user-space instructions per 4 KiB null read (callgrind, 4k randread QD32). Instead,
//! [`BufPool::set_zero`] records that the first bytes of an owned buffer are zero *logically*;
//! the memory is written only if someone looks at it: every accessor that exposes the bytes
//! ([`BufPool::buf`], [`BufPool::buf_mut`], [`BufPool::buf_ptr`],
//! [`BufPool::mark_in_flight`]) writes the zeroes first, and [`BufPool::payload`] (what a
//! transport sends) returns a slice of a shared all-zero region instead. Freeing the buffer
//! forgets the mark. [`BufPool::base_ptr`] (registering the whole pool for DMA, where the
//! NIC reads buffers without asking) writes every pending zero and turns lazy zeroes off for
//! good.

use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;

use super::sys::MmapRegion;

/// Largest number of buffers a pool may hold. io_uring accepts at most 16384 registered
/// buffers per ring (`IORING_MAX_REG_BUFFERS`); one is kept for the ring's zero buffer.
pub const MAX_BUFFERS: u32 = (1 << 14) - 1;

/// Largest size of one buffer: io_uring rejects registered buffers over 1 GiB.
pub const MAX_BUFFER_SIZE: usize = 1 << 30;

/// Alignment and granularity of every buffer (and of the region).
pub const BUF_ALIGN: usize = 4096;

/// Index of a buffer in a [`BufPool`] (also its io_uring fixed-buffer index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u16);

impl BufId {
    /// The index as a `usize`.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// Misuse of a buffer or an invalid pool geometry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    #[error("buffer pool: count {0} out of range 1..={MAX_BUFFERS}")]
    BadCount(u32),
    #[error("buffer pool: buffer size {0} is not a non-zero multiple of {BUF_ALIGN} up to {MAX_BUFFER_SIZE}")]
    BadSize(usize),
    #[error("buffer pool: mmap of {len} bytes failed: errno {errno}")]
    Mmap { len: usize, errno: i32 },
    #[error("buffer {0} is not in this pool")]
    NoSuchBuffer(u16),
    #[error("buffer {0} is not allocated")]
    NotAllocated(u16),
    #[error("buffer {0} has an operation in flight")]
    InFlight(u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Owned,
    InFlight,
}

/// A pool of `count` buffers of `buf_size` bytes each, backed by one page-aligned anonymous
/// mapping that is unmapped on drop.
pub struct BufPool {
    region: MmapRegion,
    buf_size: usize,
    count: u32,
    /// Free buffer indices (a stack: recently freed buffers are warm in cache).
    free: Vec<u16>,
    state: Vec<State>,
    /// Per buffer: its first `n` bytes are zero though the memory may not be (see "Lazy
    /// zeroes"). A `Cell` so that the shared accessors can write the zeroes out.
    lazy_zero: Vec<Cell<u32>>,
    /// The pool was exposed for DMA as a whole: no lazy zeroes any more.
    exposed: Cell<bool>,
    /// `buf_size` bytes that are always zero (never handed out mutably).
    zeroes: MmapRegion,
}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("base", &self.region.ptr())
            .field("buf_size", &self.buf_size)
            .field("count", &self.count)
            .field("free", &self.free.len())
            .finish()
    }
}

impl BufPool {
    /// Never unmaps the pool's memory (see `MmapRegion::leak`).
    pub(crate) fn leak(&mut self) {
        self.region.leak();
    }

    /// Maps `count * buf_size` bytes (pre-faulted) and splits them into `count` buffers.
    /// `buf_size` must be a multiple of 4096 so that every buffer is page-aligned, which
    /// O_DIRECT and DMA registration need.
    pub fn new(count: u32, buf_size: usize) -> Result<BufPool, PoolError> {
        if count == 0 || count > MAX_BUFFERS {
            return Err(PoolError::BadCount(count));
        }
        if buf_size == 0 || buf_size % BUF_ALIGN != 0 || buf_size > MAX_BUFFER_SIZE {
            return Err(PoolError::BadSize(buf_size));
        }
        let len = buf_size
            .checked_mul(count as usize)
            .ok_or(PoolError::BadSize(buf_size))?;
        let region = MmapRegion::new(len).map_err(|errno| PoolError::Mmap { len, errno })?;
        let zeroes = MmapRegion::new(buf_size).map_err(|errno| PoolError::Mmap {
            len: buf_size,
            errno,
        })?;
        // Pop order: buffer 0 first.
        let free = (0..count as u16).rev().collect();
        Ok(BufPool {
            region,
            buf_size,
            count,
            free,
            state: vec![State::Free; count as usize],
            lazy_zero: (0..count).map(|_| Cell::new(0)).collect(),
            exposed: Cell::new(false),
            zeroes,
        })
    }

    /// Size of each buffer, bytes.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Number of buffers.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Number of buffers currently free.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Start of the region (for registering the whole pool as one RDMA memory region). Writes
    /// out pending zeroes and turns lazy zeroes off: DMA reads the memory itself.
    pub fn base_ptr(&self) -> NonNull<u8> {
        self.exposed.set(true);
        for i in 0..self.count as u16 {
            self.materialize(BufId(i));
        }
        self.region.ptr()
    }

    /// Length of the region, bytes (`count * buf_size`).
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Always false: a pool has at least one buffer.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Takes a free buffer, O(1); `None` when all are in use.
    pub fn alloc(&mut self) -> Option<BufId> {
        let i = self.free.pop()?;
        self.state[usize::from(i)] = State::Owned;
        Some(BufId(i))
    }

    /// Returns an owned buffer to the pool. Fails (and changes nothing) if the buffer is free
    /// already or has an operation in flight.
    pub fn free(&mut self, id: BufId) -> Result<(), PoolError> {
        match self.state_of(id)? {
            State::Owned => {
                self.state[id.index()] = State::Free;
                // Whatever the next owner gets, it is not promised zeroes.
                self.lazy_zero[id.index()].set(0);
                // Cannot grow beyond `count`: every index is pushed at most once while free.
                self.free.push(id.0);
                Ok(())
            }
            State::Free => Err(PoolError::NotAllocated(id.0)),
            State::InFlight => Err(PoolError::InFlight(id.0)),
        }
    }

    /// The buffer's bytes, if it is owned (allocated and not in flight).
    pub fn buf(&self, id: BufId) -> Result<&[u8], PoolError> {
        self.check_owned(id)?;
        self.materialize(id);
        // SAFETY: the range lies inside the live mapping (index checked by `check_owned`),
        // the buffer is owned by the caller and not in flight, so no DMA writes it, and the
        // shared borrow of `self` prevents a `buf_mut` or `mark_in_flight` while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr_of(id), self.buf_size) })
    }

    /// The buffer's bytes, mutably, if it is owned (allocated and not in flight).
    pub fn buf_mut(&mut self, id: BufId) -> Result<&mut [u8], PoolError> {
        self.check_owned(id)?;
        self.materialize(id);
        // SAFETY: as in `buf`; the exclusive borrow of `self` makes this the only reference
        // into the pool for the slice's lifetime, and buffers never overlap.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr_of(id), self.buf_size) })
    }

    /// Raw address of a buffer, in any state. Obtaining it is safe; dereferencing it is not:
    /// the caller must not create references that overlap an in-flight operation.
    pub fn buf_ptr(&self, id: BufId) -> Result<NonNull<u8>, PoolError> {
        self.state_of(id)?;
        self.materialize(id);
        // `ptr_of` stays inside the mapping for a valid index, so the pointer is non-null.
        NonNull::new(self.ptr_of(id)).ok_or(PoolError::NoSuchBuffer(id.0))
    }

    /// One iovec per buffer, in index order, for `io_uring_register_buffers`.
    pub fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.count as u16)
            .map(|i| libc::iovec {
                iov_base: self.ptr_of(BufId(i)).cast(),
                iov_len: self.buf_size,
            })
            .collect()
    }

    /// Marks an owned buffer as in flight: safe accessors refuse it until
    /// [`BufPool::clear_in_flight`]. The backend ring does this around its own operations;
    /// transports may use it around DMA they start themselves (e.g. an RDMA READ into the buffer).
    pub fn mark_in_flight(&mut self, id: BufId) -> Result<(), PoolError> {
        self.check_owned(id)?;
        self.materialize(id);
        self.state[id.index()] = State::InFlight;
        Ok(())
    }

    /// Ends the in-flight state set by [`BufPool::mark_in_flight`].
    pub fn clear_in_flight(&mut self, id: BufId) -> Result<(), PoolError> {
        match self.state_of(id)? {
            State::InFlight => {
                self.state[id.index()] = State::Owned;
                Ok(())
            }
            State::Free => Err(PoolError::NotAllocated(id.0)),
            State::Owned => Ok(()),
        }
    }

    /// Makes bytes `start..end` of an owned buffer zero, lazily when they start at 0 (see
    /// "Lazy zeroes"): a null device's read.
    pub fn set_zero(&mut self, id: BufId, start: usize, end: usize) -> Result<(), PoolError> {
        self.check_owned(id)?;
        if start > end || end > self.buf_size {
            return Err(PoolError::BadSize(end));
        }
        let lazy = &self.lazy_zero[id.index()];
        if start == 0 && !self.exposed.get() {
            lazy.set(lazy.get().max(end as u32));
        } else {
            self.buf_mut(id)?[start..end].fill(0);
        }
        Ok(())
    }

    /// The first `len` bytes of an owned buffer, to send: zeroes set by
    /// [`BufPool::set_zero`] come from the shared zero region and are never written into
    /// the buffer.
    pub fn payload(&self, id: BufId, len: usize) -> Result<&[u8], PoolError> {
        self.check_owned(id)?;
        if len > self.buf_size {
            return Err(PoolError::BadSize(len));
        }
        if len <= self.lazy_zero[id.index()].get() as usize {
            // SAFETY: `zeroes` is a live mapping of `buf_size` >= `len` bytes that nothing
            // ever writes (no accessor hands it out mutably); it lives as long as the pool.
            return Ok(unsafe { std::slice::from_raw_parts(self.zeroes.ptr().as_ptr(), len) });
        }
        Ok(&self.buf(id)?[..len])
    }

    #[cfg(test)]
    fn buf_ptr_unmaterialized(&self, id: BufId) -> *const u8 {
        self.ptr_of(id)
    }

    /// Write out the zeroes [`BufPool::set_zero`] promised for buffer `id`, if any.
    fn materialize(&self, id: BufId) {
        let Some(lazy) = self.lazy_zero.get(id.index()) else {
            return;
        };
        let n = lazy.replace(0) as usize;
        if n > 0 {
            // SAFETY: bytes 0..n (n <= buf_size) of a buffer inside the live mapping. A buffer
            // only becomes lazy through `set_zero` (an exclusive borrow of the pool, so no
            // slice of it outlives that call), and every accessor that hands out its bytes or
            // address comes through here first: while the mark is set, no reference or
            // pointer to these bytes is in use, and no operation is in flight on them.
            unsafe { std::ptr::write_bytes(self.ptr_of(id), 0, n) };
        }
    }

    /// True if the buffer has an operation in flight.
    pub fn is_in_flight(&self, id: BufId) -> bool {
        matches!(self.state_of(id), Ok(State::InFlight))
    }

    fn state_of(&self, id: BufId) -> Result<State, PoolError> {
        self.state
            .get(id.index())
            .copied()
            .ok_or(PoolError::NoSuchBuffer(id.0))
    }

    fn check_owned(&self, id: BufId) -> Result<(), PoolError> {
        match self.state_of(id)? {
            State::Owned => Ok(()),
            State::Free => Err(PoolError::NotAllocated(id.0)),
            State::InFlight => Err(PoolError::InFlight(id.0)),
        }
    }

    /// Address of buffer `id`; `id` must be < `count` (not checked here).
    fn ptr_of(&self, id: BufId) -> *mut u8 {
        // wrapping_add keeps this free of unsafe; for a valid index the result is in bounds.
        self.region
            .ptr()
            .as_ptr()
            .wrapping_add(id.index() * self.buf_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_is_validated() {
        assert_eq!(BufPool::new(0, 4096).unwrap_err(), PoolError::BadCount(0));
        assert_eq!(
            BufPool::new(MAX_BUFFERS + 1, 4096).unwrap_err(),
            PoolError::BadCount(MAX_BUFFERS + 1)
        );
        assert_eq!(BufPool::new(1, 100).unwrap_err(), PoolError::BadSize(100));
        assert_eq!(BufPool::new(1, 0).unwrap_err(), PoolError::BadSize(0));
    }

    #[test]
    fn alloc_free_and_states() {
        let mut p = BufPool::new(3, 8192).unwrap();
        assert_eq!(p.len(), 3 * 8192);
        assert_eq!(p.base_ptr().as_ptr() as usize % BUF_ALIGN, 0);
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        let c = p.alloc().unwrap();
        assert_eq!((a, b, c), (BufId(0), BufId(1), BufId(2)));
        assert!(p.alloc().is_none());
        p.buf_mut(a).unwrap().fill(0xaa);
        p.buf_mut(b).unwrap().fill(0xbb);
        assert!(p.buf(a).unwrap().iter().all(|&x| x == 0xaa));
        assert!(p.buf(b).unwrap().iter().all(|&x| x == 0xbb));
        p.mark_in_flight(c).unwrap();
        assert_eq!(p.buf(c).unwrap_err(), PoolError::InFlight(2));
        assert_eq!(p.free(c).unwrap_err(), PoolError::InFlight(2));
        p.clear_in_flight(c).unwrap();
        p.free(c).unwrap();
        assert_eq!(p.free(c).unwrap_err(), PoolError::NotAllocated(2));
        assert_eq!(p.buf(c).unwrap_err(), PoolError::NotAllocated(2));
        assert_eq!(p.buf(BufId(9)).unwrap_err(), PoolError::NoSuchBuffer(9));
        assert_eq!(p.alloc(), Some(c));
        let iov = p.iovecs();
        assert_eq!(iov.len(), 3);
        assert_eq!(
            iov[1].iov_base as usize,
            p.base_ptr().as_ptr() as usize + 8192
        );
        assert!(iov.iter().all(|v| v.iov_len == 8192));
    }

    #[test]
    fn lazy_zeroes_are_sent_from_the_zero_region_and_written_when_looked_at() {
        let mut p = BufPool::new(2, 8192).unwrap();
        let a = p.alloc().unwrap();
        p.buf_mut(a).unwrap().fill(0xaa);
        p.set_zero(a, 0, 4096).unwrap();
        // Sent: zeroes, from elsewhere; the buffer itself is untouched so far.
        let sent = p.payload(a, 4096).unwrap();
        assert!(sent.iter().all(|&x| x == 0));
        assert_ne!(sent.as_ptr(), p.buf_ptr_unmaterialized(a));
        // Beyond the zeroed prefix, the buffer's own bytes.
        assert_eq!(p.payload(a, 4097).unwrap()[4096], 0xaa);
        // Looking at the buffer writes the zeroes first (the payload call above did).
        let b = p.buf(a).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 0) && b[4096..].iter().all(|&x| x == 0xaa));
        // Every accessor materializes: buf_mut, buf_ptr, mark_in_flight.
        p.buf_mut(a).unwrap().fill(0xbb);
        p.set_zero(a, 0, 100).unwrap();
        let ptr = p.buf_ptr(a).unwrap();
        // SAFETY: the buffer is owned and nothing else references it.
        assert_eq!(unsafe { *ptr.as_ptr().add(99) }, 0);
        assert_eq!(p.buf(a).unwrap()[100], 0xbb);
        p.buf_mut(a).unwrap().fill(0xcc);
        p.set_zero(a, 0, 8192).unwrap();
        p.mark_in_flight(a).unwrap();
        p.clear_in_flight(a).unwrap();
        assert!(p.buf(a).unwrap().iter().all(|&x| x == 0));
        // Freeing forgets the promise; a range not at the start is written at once.
        p.buf_mut(a).unwrap().fill(0xdd);
        p.set_zero(a, 0, 8192).unwrap();
        p.free(a).unwrap();
        let a = p.alloc().unwrap();
        assert_eq!(p.payload(a, 1).unwrap()[0], 0xdd);
        p.set_zero(a, 10, 20).unwrap();
        assert!(p.buf(a).unwrap()[10..20].iter().all(|&x| x == 0));
        assert!(p.set_zero(a, 0, 8193).is_err());
        // Exposing the pool for DMA writes pending zeroes and ends laziness.
        p.buf_mut(a).unwrap().fill(0xee);
        p.set_zero(a, 0, 4096).unwrap();
        let base = p.base_ptr();
        // SAFETY: inside buffer `a`, owned, unreferenced.
        assert_eq!(unsafe { *base.as_ptr().add(a.index() * 8192) }, 0);
        p.buf_mut(a).unwrap().fill(0xee);
        p.set_zero(a, 0, 4096).unwrap();
        assert_eq!(
            p.payload(a, 4096).unwrap().as_ptr(),
            p.buf_ptr_unmaterialized(a)
        );
    }
}
