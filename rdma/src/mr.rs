//! Protection domains, memory regions that own their memory, and scatter/gather entries.

use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys::*;

use crate::device::Context;
use crate::error::{from_errno, last_errno, Error, Result};

/// A protection domain (`ibv_pd`). Holds its [`Context`] open.
pub struct Pd {
    pub(crate) raw: *mut ibv_pd,
    ctx: Arc<Context>,
}

// SAFETY: a PD is an immutable kernel handle; registering memory and creating objects on it
// from several threads is supported by libibverbs (each is a command to the kernel).
unsafe impl Send for Pd {}
// SAFETY: as above; no method mutates the ibv_pd struct.
unsafe impl Sync for Pd {}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd").field("ctx", &self.ctx).finish()
    }
}

impl Pd {
    /// `ibv_alloc_pd` on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Pd> {
        // SAFETY: ctx.raw is an open context, kept open by the Arc we store.
        let raw = unsafe { ibv_alloc_pd(ctx.raw) };
        if raw.is_null() {
            return Err(from_errno("ibv_alloc_pd"));
        }
        Ok(Pd {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated in new; every child (MR, QP, SRQ) holds an Arc<Pd>, so none is left.
        let r = unsafe { ibv_dealloc_pd(self.raw) };
        if r != 0 {
            tracing::warn!(errno = r, "ibv_dealloc_pd failed");
        }
    }
}

bitflags::bitflags! {
    /// Memory region access rights (`IBV_ACCESS_*`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The local device may write the region: RECV targets and RDMA READ sinks.
        const LOCAL_WRITE = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        /// A peer may RDMA WRITE into the region (requires `LOCAL_WRITE`). On iWARP, RDMA READ
        /// sinks need it too.
        const REMOTE_WRITE = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        /// A peer may RDMA READ from the region.
        const REMOTE_READ = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        /// Memory windows may be bound over the region ([`crate::Mw`]).
        const MW_BIND = ibv_access_flags::IBV_ACCESS_MW_BIND.0;
    }
}

/// What keeps a region's memory alive.
enum Backing {
    /// An anonymous mapping we made; unmapped after deregistration.
    Mapped { len: usize },
    /// Memory owned elsewhere (see [`Mr::register_external`]).
    External,
}

/// A registered memory region (`ibv_mr`) and, normally, the memory itself.
///
/// [`Mr::alloc`] maps page-aligned, zeroed memory and registers it; Drop deregisters, then
/// unmaps, so the device can never be left pointing at freed memory. [`Mr::register_external`]
/// registers memory owned by someone else (an io_uring buffer pool) under an explicit contract.
///
/// # Access to the bytes
/// Registered memory is shared with a device, and with peers when a `REMOTE_*` right is set:
/// it can change at any time a posted work request or a peer writes it. Safe access therefore
/// copies ([`Mr::read_at`], [`Mr::write_at`]) through raw pointers and never forms a Rust
/// reference to the bytes; [`Mr::slice`] / [`Mr::slice_mut`] give zero-copy views under an
/// `unsafe` quiescence contract.
pub struct Mr {
    raw: *mut ibv_mr,
    addr: NonNull<u8>,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    backing: Backing,
    pd: Arc<Pd>,
}

// SAFETY: the MR's keys and bounds are immutable; the memory is only reached through raw-pointer
// copies or the unsafe views whose contracts cover concurrency; dereg happens once, in Drop.
unsafe impl Send for Mr {}
// SAFETY: as above: &Mr methods only copy through raw pointers or read immutable fields.
unsafe impl Sync for Mr {}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .finish()
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

fn check_access(access: AccessFlags) -> Result<()> {
    if access.contains(AccessFlags::REMOTE_WRITE) && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::InvalidArgument(
            "REMOTE_WRITE access requires LOCAL_WRITE (verbs refuses the registration)".into(),
        ));
    }
    Ok(())
}

impl Mr {
    /// Maps `len` bytes of zeroed, page-aligned anonymous memory and registers it on `pd`.
    ///
    /// The mapping is rounded up to whole pages; the region covers exactly `len` bytes.
    pub fn alloc(pd: &Arc<Pd>, len: usize, access: AccessFlags) -> Result<Mr> {
        check_access(access)?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register a 0-byte region".into(),
            ));
        }
        let ps = page_size();
        let map_len = len
            .checked_next_multiple_of(ps)
            .ok_or_else(|| Error::InvalidArgument(format!("region of {len} bytes is too large")))?;
        // SAFETY: anonymous private mapping, no address hint; the result is checked below.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(from_errno("mmap"));
        }
        // Keep registered pages out of fork children (what ibv_fork_init does for verbs
        // memory): a child never needs them, and on kernels without copy-on-fork for pinned
        // pages a parent write after fork would otherwise move the page away from the device.
        // SAFETY: advising our own fresh mapping.
        if unsafe { libc::madvise(p, map_len, libc::MADV_DONTFORK) } != 0 {
            tracing::debug!(errno = last_errno(), "madvise(MADV_DONTFORK) failed");
        }
        let addr = NonNull::new(p.cast::<u8>()).expect("mmap returned NULL without MAP_FIXED");
        // SAFETY: [addr, addr+len) is our fresh mapping; on success the Mr owns it and unmaps
        // it after deregistration.
        match unsafe { Self::register_raw(pd, addr, len, access) } {
            Ok((raw, lkey, rkey)) => Ok(Mr {
                raw,
                addr,
                len,
                lkey,
                rkey,
                access,
                backing: Backing::Mapped { len: map_len },
                pd: pd.clone(),
            }),
            Err(e) => {
                // SAFETY: unmapping the mapping made above, which nothing else references.
                unsafe { libc::munmap(p, map_len) };
                Err(e)
            }
        }
    }

    /// Registers memory this `Mr` does not own (e.g. the target's io_uring buffer pool, which
    /// registers one region for both io_uring and the RDMA device).
    ///
    /// # Safety
    /// - `[ptr, ptr + len)` must be valid, readable and writable memory for as long as the
    ///   returned `Mr` exists (until its Drop has deregistered it), and must not be unmapped or
    ///   remapped before then.
    /// - Anything else that accesses that memory must tolerate the device (and, with `REMOTE_*`
    ///   access, the peer) reading and writing it concurrently; in particular no Rust reference
    ///   to bytes that a posted work request or a peer may write may be alive meanwhile.
    pub unsafe fn register_external(
        pd: &Arc<Pd>,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr> {
        check_access(access)?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register a 0-byte region".into(),
            ));
        }
        let addr = NonNull::new(ptr)
            .ok_or_else(|| Error::InvalidArgument("cannot register a NULL address".into()))?;
        // SAFETY: forwarded from the caller's contract.
        let (raw, lkey, rkey) = unsafe { Self::register_raw(pd, addr, len, access)? };
        Ok(Mr {
            raw,
            addr,
            len,
            lkey,
            rkey,
            access,
            backing: Backing::External,
            pd: pd.clone(),
        })
    }

    /// # Safety
    /// `[addr, addr+len)` is valid memory for the lifetime of the registration.
    unsafe fn register_raw(
        pd: &Arc<Pd>,
        addr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<(*mut ibv_mr, u32, u32)> {
        // SAFETY: pd.raw is a live PD; the memory contract comes from the caller.
        let raw = unsafe {
            ibv_reg_mr(
                pd.raw,
                addr.as_ptr().cast(),
                len,
                access.bits() as libc::c_int,
            )
        };
        if raw.is_null() {
            return Err(from_errno("ibv_reg_mr"));
        }
        // SAFETY: raw is the MR just returned; its keys are immutable.
        let (lkey, rkey) = unsafe { ((*raw).lkey, (*raw).rkey) };
        Ok((raw, lkey, rkey))
    }

    /// The verbs handle (for work requests that name the region, such as a window bind).
    pub(crate) fn raw_mr(&self) -> *mut ibv_mr {
        self.raw
    }

    /// Start address of the region (what an SGE or a remote peer names).
    pub fn addr(&self) -> u64 {
        self.addr.as_ptr() as u64
    }

    /// Raw pointer to the first byte. Dereferencing it is subject to the same rules as
    /// [`Mr::slice`].
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr.as_ptr()
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key, for a peer's RDMA READ/WRITE (meaningful with a `REMOTE_*` right).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The access rights the region was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// Whether this `Mr` owns its memory ([`Mr::alloc`]) rather than registering external memory.
    pub fn owns_memory(&self) -> bool {
        matches!(self.backing, Backing::Mapped { .. })
    }

    /// The PD the region is registered on.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// A scatter/gather entry for `len` bytes at `offset`, checked to lie inside the region.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge> {
        check_range(offset, len, self.len)?;
        let len32 = u32::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("SGE length {len} exceeds 4 GiB")))?;
        Ok(Sge(ibv_sge {
            addr: self.addr() + offset as u64,
            length: len32,
            lkey: self.lkey,
        }))
    }

    /// An SGE covering the whole region.
    pub fn sge_all(&self) -> Result<Sge> {
        self.sge(0, self.len)
    }

    /// What a peer needs to RDMA READ/WRITE `len` bytes at `offset` (address + rkey).
    pub fn remote(&self, offset: usize, len: usize) -> Result<RemoteBuf> {
        check_range(offset, len, self.len)?;
        Ok(RemoteBuf {
            addr: self.addr() + offset as u64,
            len: len as u64,
            rkey: self.rkey,
        })
    }

    /// Copies `dst.len()` bytes at `offset` out of the region.
    ///
    /// If a posted work request or a peer writes the range meanwhile, the bytes copied are
    /// unspecified (a mix of old and new); nothing else can go wrong.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len)?;
        // SAFETY: the range is inside the live region (checked); dst is a distinct Rust buffer,
        // so the two cannot overlap; no reference to region memory is formed.
        unsafe {
            ptr::copy_nonoverlapping(self.addr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    /// Copies `src` into the region at `offset`.
    ///
    /// Writing a range that a posted work request is reading or writing gives that request
    /// unspecified data; it cannot corrupt anything outside the range.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len)?;
        // SAFETY: as in read_at, with the roles swapped.
        unsafe {
            ptr::copy_nonoverlapping(src.as_ptr(), self.addr.as_ptr().add(offset), src.len())
        };
        Ok(())
    }

    /// Fills `len` bytes at `offset` with `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        check_range(offset, len, self.len)?;
        // SAFETY: the range is inside the live region (checked).
        unsafe { ptr::write_bytes(self.addr.as_ptr().add(offset), byte, len) };
        Ok(())
    }

    /// A zero-copy view of `len` bytes at `offset` (e.g. a capsule in a completed RECV buffer).
    ///
    /// # Safety
    /// While the slice is alive, nothing may write the range: no posted work request that
    /// writes it (RECV, RDMA READ sink), no peer (`REMOTE_WRITE`), no `write_at`/`fill`/
    /// `slice_mut` on it, and no other owner of external memory.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> Result<&[u8]> {
        check_range(offset, len, self.len)?;
        // SAFETY: in bounds (checked); immutability for the lifetime is the caller's contract.
        Ok(unsafe { std::slice::from_raw_parts(self.addr.as_ptr().add(offset), len) })
    }

    /// A zero-copy mutable view of `len` bytes at `offset`.
    ///
    /// # Safety
    /// While the slice is alive, nothing else may read or write the range: no posted work
    /// request (of any kind) naming it, no peer, and no other view or copy call on it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> Result<&mut [u8]> {
        check_range(offset, len, self.len)?;
        // SAFETY: in bounds (checked); exclusivity for the lifetime is the caller's contract.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.addr.as_ptr().add(offset), len) })
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered in alloc/register_external; deregistered exactly once, before the
        // memory is unmapped below.
        let r = unsafe { ibv_dereg_mr(self.raw) };
        if r != 0 {
            // The device may still reference the memory: leaking it is the only safe choice.
            tracing::error!(
                errno = r,
                "ibv_dereg_mr failed; leaking the region's memory"
            );
            return;
        }
        if let Backing::Mapped { len } = self.backing {
            // SAFETY: our own mapping, no longer registered and not referenced by anyone.
            if unsafe { libc::munmap(self.addr.as_ptr().cast(), len) } != 0 {
                tracing::warn!(errno = last_errno(), "munmap of a registered buffer failed");
            }
        }
    }
}

/// Checks that `[offset, offset + len)` lies within a region of `region_len` bytes.
pub(crate) fn check_range(offset: usize, len: usize, region_len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(Error::OutOfBounds {
            offset,
            len,
            region_len,
        }),
    }
}

/// A scatter/gather entry: `len` bytes at `addr` under local key `lkey`.
///
/// Only [`Mr::sge`] builds one, so every SGE lies inside a registered region. The device checks
/// the lkey on each access; keeping the [`Mr`] registered until every work request naming the
/// SGE has completed is the caller's job (a request that outlives its region completes with
/// `LOC_PROT_ERR`). Layout-compatible with `struct ibv_sge`, so a `&[Sge]` is handed to the
/// provider without copying.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Sge(pub(crate) ibv_sge);

impl Sge {
    /// An entry of `len` bytes at `addr` under local key `lkey`, as given. [`Mr::sge`] builds
    /// checked ones; this one is for code that stands in for a device (a posted entry is
    /// checked against its region by the device itself).
    pub fn new(addr: u64, len: u32, lkey: u32) -> Sge {
        Sge(ibv_sge {
            addr,
            length: len,
            lkey,
        })
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.0.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.0.length
    }
    /// True for a zero-length entry.
    pub fn is_empty(&self) -> bool {
        self.0.length == 0
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.0.lkey
    }
}

impl std::fmt::Debug for Sge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Sge({:#x}+{} lkey {:#x})",
            self.0.addr, self.0.length, self.0.lkey
        )
    }
}

impl PartialEq for Sge {
    fn eq(&self, o: &Self) -> bool {
        (self.0.addr, self.0.length, self.0.lkey) == (o.0.addr, o.0.length, o.0.lkey)
    }
}
impl Eq for Sge {}

/// A peer's (or our advertised) buffer for RDMA READ/WRITE: address, length and rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuf {
    /// Remote virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteBuf {
    /// The sub-range `[offset, offset + len)`, checked to lie inside this buffer.
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteBuf> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteBuf {
                addr: self.addr + offset,
                len,
                rkey: self.rkey,
            }),
            _ => Err(Error::OutOfBounds {
                offset: offset as usize,
                len: len as usize,
                region_len: self.len as usize,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_checks() {
        assert!(check_range(0, 0, 0).is_ok());
        assert!(check_range(0, 4096, 4096).is_ok());
        assert!(check_range(4095, 1, 4096).is_ok());
        assert!(matches!(
            check_range(4095, 2, 4096),
            Err(Error::OutOfBounds {
                offset: 4095,
                len: 2,
                region_len: 4096
            })
        ));
        assert!(check_range(usize::MAX, 2, 4096).is_err());
        assert!(check_range(4097, 0, 4096).is_err());
    }

    #[test]
    fn remote_slice() {
        let r = RemoteBuf {
            addr: 0x1000,
            len: 100,
            rkey: 7,
        };
        assert_eq!(
            r.slice(10, 90).unwrap(),
            RemoteBuf {
                addr: 0x100a,
                len: 90,
                rkey: 7
            }
        );
        assert!(r.slice(10, 91).is_err());
        assert!(r.slice(u64::MAX, 2).is_err());
    }

    #[test]
    fn access_rules() {
        assert!(check_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).is_ok());
        assert!(check_access(AccessFlags::REMOTE_READ).is_ok());
        assert!(check_access(AccessFlags::empty()).is_ok());
        assert!(check_access(AccessFlags::REMOTE_WRITE).is_err());
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
    }

    #[test]
    fn sge_is_ibv_sge() {
        assert_eq!(std::mem::size_of::<Sge>(), std::mem::size_of::<ibv_sge>());
        assert_eq!(std::mem::align_of::<Sge>(), std::mem::align_of::<ibv_sge>());
    }
}
