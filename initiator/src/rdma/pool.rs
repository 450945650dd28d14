//! The registered buffer pool of one RDMA queue, and its buffers ([`RdmaBuf`]).
//!
//! Buffers come in power-of-two size classes from 4 KiB to 8 MiB (a keyed SGL carries a 24-bit
//! length). A class grows by slabs: one [`Mr::alloc`] of at least 256 KiB cut into chunks of the
//! class size. A buffer dropped anywhere goes back to its class's free list; slabs stay
//! registered until the pool and every buffer cut from them are gone, so steady-state I/O
//! registers nothing and allocates nothing.
//!
//! Slabs are registered for local access only (`LOCAL_WRITE`, plus `MW_BIND` where the queue
//! uses memory windows): no slab key opens anything to the target. A command opens its own
//! buffer for the length of the command ([`crate::rdma`] module doc, "Keys").

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use rdma::{AccessFlags, Mr, Pd, Sge};

use crate::error::Error;
use crate::queue::Buf;

/// Smallest chunk (one page).
const MIN_CHUNK_SHIFT: u32 = 12;
/// Largest buffer: 8 MiB, the largest power of two a keyed SGL's 24-bit length can describe.
pub const MAX_BUF: usize = 1 << 23;
const CLASSES: usize = (23 - MIN_CHUNK_SHIFT + 1) as usize;
/// Smallest slab registered at once.
const SLAB_MIN: usize = 256 * 1024;

/// The size class of a `len`-byte buffer, `None` when no class holds it.
pub(crate) fn class_of(len: usize) -> Option<usize> {
    if len == 0 || len > MAX_BUF {
        return None;
    }
    let shift = len
        .next_power_of_two()
        .trailing_zeros()
        .max(MIN_CHUNK_SHIFT);
    Some((shift - MIN_CHUNK_SHIFT) as usize)
}

/// Bytes of one chunk of `class`.
pub(crate) fn chunk_size(class: usize) -> usize {
    1 << (class as u32 + MIN_CHUNK_SHIFT)
}

/// Chunks per slab of `class`.
pub(crate) fn chunks_per_slab(class: usize) -> usize {
    (SLAB_MIN / chunk_size(class)).max(1)
}

struct Chunk {
    mr: Arc<Mr>,
    off: usize,
}

struct PoolInner {
    pd: Arc<Pd>,
    /// Access rights of every slab (local only).
    access: AccessFlags,
    /// Free chunks per class.
    free: Mutex<[Vec<Chunk>; CLASSES]>,
    /// Bytes registered by this pool, and slabs.
    registered: Mutex<(usize, usize)>,
}

impl PoolInner {
    fn lock_free(&self) -> std::sync::MutexGuard<'_, [Vec<Chunk>; CLASSES]> {
        // The lists are consistent at every await-free step: a poisoned lock is still usable.
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A queue's pool of registered buffers (cheap to clone: the clones share it).
#[derive(Clone)]
pub(crate) struct Pool {
    inner: Arc<PoolInner>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (bytes, slabs) = self.registered();
        f.debug_struct("Pool")
            .field("registered_bytes", &bytes)
            .field("slabs", &slabs)
            .finish()
    }
}

impl Pool {
    /// A pool on `pd` whose slabs are registered with `access` (no remote rights).
    pub(crate) fn new(pd: &Arc<Pd>, access: AccessFlags) -> Pool {
        debug_assert!(!access.intersects(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE));
        Pool {
            inner: Arc::new(PoolInner {
                pd: pd.clone(),
                access,
                free: Mutex::new(Default::default()),
                registered: Mutex::new((0, 0)),
            }),
        }
    }

    /// A buffer of exactly `len` bytes (contents unspecified: recycled buffers keep old data).
    pub(crate) fn alloc(&self, len: usize) -> Result<RdmaBuf, Error> {
        let class = class_of(len).ok_or_else(|| {
            Error::InvalidArgument(format!("RDMA buffer of {len} bytes (1..={MAX_BUF} bytes)"))
        })?;
        let mut free = self.inner.lock_free();
        if free[class].is_empty() {
            // Slow path, once per slab: register a new one under the lock (it is per queue).
            let size = chunk_size(class);
            let n = chunks_per_slab(class);
            let mr = Arc::new(Mr::alloc(&self.inner.pd, size * n, self.inner.access)?);
            {
                let mut r = self
                    .inner
                    .registered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                r.0 += size * n;
                r.1 += 1;
            }
            free[class].extend((0..n).rev().map(|i| Chunk {
                mr: mr.clone(),
                off: i * size,
            }));
        }
        let c = free[class].pop().expect("refilled above");
        Ok(RdmaBuf {
            mr: c.mr,
            off: c.off,
            len,
            class: class as u8,
            pool: self.inner.clone(),
        })
    }

    /// Whether `buf` was cut from this pool (so its keys are valid on this queue's PD).
    pub(crate) fn owns(&self, buf: &RdmaBuf) -> bool {
        Arc::ptr_eq(&self.inner, &buf.pool)
    }

    /// Bytes registered and slabs.
    pub(crate) fn registered(&self) -> (usize, usize) {
        *self
            .inner
            .registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// A buffer in registered memory, from [`crate::Queue::alloc_buf`] of an NVMe/RDMA queue; it dereferences
/// to `[u8]` and goes back to its queue's pool when dropped (from any thread).
///
/// Submitted with [`crate::Data`] on the queue it came from, its memory is what the target
/// reads and writes: no copy on the host. Contents of a fresh buffer are unspecified.
pub struct RdmaBuf {
    mr: Arc<Mr>,
    off: usize,
    len: usize,
    class: u8,
    pool: Arc<PoolInner>,
}

impl fmt::Debug for RdmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaBuf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl RdmaBuf {
    /// Bytes the buffer can hold ([`RdmaBuf::set_len`] may grow it up to this).
    pub fn capacity(&self) -> usize {
        chunk_size(self.class as usize)
    }

    /// Change the length (the transfer length when submitted) within the capacity.
    pub fn set_len(&mut self, len: usize) -> Result<(), Error> {
        if len == 0 || len > self.capacity() {
            return Err(Error::InvalidArgument(format!(
                "length {len} outside 1..={} of this RDMA buffer",
                self.capacity()
            )));
        }
        self.len = len;
        Ok(())
    }

    /// Virtual address (what a keyed SGL names).
    pub(crate) fn addr(&self) -> u64 {
        self.mr.addr() + self.off as u64
    }

    /// Local gather/scatter entry of the whole buffer.
    pub(crate) fn sge(&self) -> Sge {
        self.mr
            .sge(self.off, self.len)
            .expect("a chunk lies inside its slab and len <= 8 MiB")
    }

    /// The slab the buffer lies in, and the buffer's offset there (what a window bind names).
    pub(crate) fn slab(&self) -> (&Mr, usize) {
        (&self.mr, self.off)
    }

    /// Registers the buffer on its own with `access` for one command (devices without memory
    /// windows): the registration's rkey opens exactly this buffer until it is dropped.
    pub(crate) fn register_io(&self, access: AccessFlags) -> Result<IoMr, Error> {
        // SAFETY: [off, off + len) lies inside the slab's mapping, which the returned IoMr keeps
        // alive (its Arc) for as long as the registration exists. The queue drops the IoMr when
        // the command's response arrives, or moves the QP to the error state (so the peer can
        // no longer reach it) before it hands the buffer back; until then the queue holds the
        // buffer and no reference to its bytes exists.
        let mr = unsafe {
            Mr::register_external(
                self.mr.pd(),
                self.mr.as_ptr().add(self.off),
                self.len,
                // Verbs refuse REMOTE_WRITE without LOCAL_WRITE.
                access | AccessFlags::LOCAL_WRITE,
            )?
        };
        Ok(IoMr {
            mr,
            _slab: self.mr.clone(),
        })
    }
}

/// A buffer's registration for one command ([`RdmaBuf::register_io`]); deregistered on drop.
pub(crate) struct IoMr {
    mr: Mr,
    _slab: Arc<Mr>,
}

impl IoMr {
    /// The key the command's keyed SGL names.
    pub(crate) fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
}

impl Deref for RdmaBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: [off, off+len) lies inside the slab's mapping (off + capacity <= slab length,
        // len <= capacity), which lives as long as the Arc<Mr> held here. The pool hands each
        // chunk to one RdmaBuf at a time, so no other buffer aliases it. Neither the device nor
        // the target can write it while the caller holds it: the slab has no remote rights,
        // and the key a command opened it with (a memory window, or a registration of its
        // own) was invalidated or deregistered before the queue handed the buffer back, or
        // the QP was moved to the error state first.
        unsafe { std::slice::from_raw_parts(self.mr.as_ptr().add(self.off), self.len) }
    }
}

impl DerefMut for RdmaBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; `&mut self` makes this the only live reference to the chunk.
        unsafe { std::slice::from_raw_parts_mut(self.mr.as_ptr().add(self.off), self.len) }
    }
}

impl Drop for RdmaBuf {
    fn drop(&mut self) {
        let chunk = Chunk {
            mr: self.mr.clone(),
            off: self.off,
        };
        self.pool.lock_free()[self.class as usize].push(chunk);
    }
}

impl Buf for RdmaBuf {
    fn from_vec(_: Vec<u8>) -> Option<Self> {
        None
    }
}

/// A queue buffer type that can hold registered memory ([`RdmaBuf`], [`crate::AnyBuf`]): what an
/// NVMe/RDMA link carries.
pub trait RegisteredBuf: Buf {
    /// The registered buffer inside, if this is one.
    #[doc(hidden)]
    fn as_rdma(&self) -> Option<&RdmaBuf>;
    /// This buffer type made from a registered buffer.
    #[doc(hidden)]
    fn from_rdma(b: RdmaBuf) -> Option<Self>;
}

impl RegisteredBuf for RdmaBuf {
    fn as_rdma(&self) -> Option<&RdmaBuf> {
        Some(self)
    }
    fn from_rdma(b: RdmaBuf) -> Option<Self> {
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes() {
        assert_eq!(class_of(0), None);
        assert_eq!(class_of(1), Some(0));
        assert_eq!(class_of(4096), Some(0));
        assert_eq!(class_of(4097), Some(1));
        assert_eq!(class_of(128 * 1024), Some(5));
        assert_eq!(class_of(MAX_BUF), Some(CLASSES - 1));
        assert_eq!(class_of(MAX_BUF + 1), None);
        for len in [1usize, 512, 4096, 5000, 65536, 1 << 20, MAX_BUF] {
            let c = class_of(len).unwrap();
            assert!(chunk_size(c) >= len && (c == 0 || chunk_size(c - 1) < len));
            // The keyed SGL length field is 24 bits.
            assert!(chunk_size(c) < 1 << 24);
            assert!(chunk_size(c) * chunks_per_slab(c) >= SLAB_MIN.min(chunk_size(c)));
        }
        assert_eq!(chunks_per_slab(0), 64);
        assert_eq!(chunks_per_slab(CLASSES - 1), 1);
    }
}
