//! The backend's raw system calls (mmap, block-device ioctls, statx, rlimits, eventfd), each
//! wrapped once so the rest of the backend stays free of `libc` calls.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// An anonymous, private, pre-faulted read/write mapping, unmapped on drop.
pub(crate) struct MmapRegion {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory exclusively owned by this value (nobody else holds the
// mapping), so moving it to another thread is sound; shared access goes through `&self`
// methods that only hand out the pointer value.
unsafe impl Send for MmapRegion {}

impl MmapRegion {
    /// Maps `len` (> 0) bytes; the errno on failure.
    pub(crate) fn new(len: usize) -> Result<MmapRegion, i32> {
        if len == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: an anonymous mapping at a kernel-chosen address touches no existing memory;
        // the result is checked for MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(errno());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(libc::ENOMEM)?;
        Ok(MmapRegion { ptr, len })
    }

    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl MmapRegion {
    /// Never unmaps the region: for memory that someone outside Rust's reach (a library's
    /// thread) may still write after its owner is gone.
    pub(crate) fn leak(&mut self) {
        self.len = 0;
    }
}

impl Drop for MmapRegion {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: `ptr`/`len` describe exactly the mapping created in `new`, which nothing
        // else unmaps; after this no reference into it can exist because they all borrow `self`.
        // Kernel users (registered io_uring buffers, RDMA MRs) pin the pages themselves, so an
        // unmap while they are registered cannot make the kernel write freed memory.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `_IOR(0x12, 114, size_t)`: BLKGETSIZE64 (not exported by the libc crate).
const BLKGETSIZE64: libc::c_ulong = {
    // Direction bit position: 30 on most architectures; 29 on those with 13 size bits.
    #[cfg(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "sparc",
        target_arch = "sparc64"
    ))]
    const DIR_SHIFT: u32 = 29;
    #[cfg(not(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "sparc",
        target_arch = "sparc64"
    )))]
    const DIR_SHIFT: u32 = 30;
    const IOC_READ: libc::c_ulong = 2;
    (IOC_READ << DIR_SHIFT)
        | ((std::mem::size_of::<usize>() as libc::c_ulong) << 16)
        | (0x12 << 8)
        | 114
};

/// Size in bytes of the block device open on `fd` (BLKGETSIZE64).
pub(crate) fn blkdev_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a live local.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// Logical block size of the block device open on `fd` (BLKSSZGET).
pub(crate) fn blkdev_logical_block_size(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut lbs: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points to a live local.
    let r = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::BLKSSZGET as _,
            &mut lbs as *mut libc::c_int,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(lbs).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Direct-I/O alignment of an open file as statx reports it (Linux 6.1+):
/// `Some((memory alignment, file offset alignment))`, where `(0, 0)` means the file does not
/// support direct I/O; `None` if the kernel or filesystem does not report it.
pub(crate) fn dio_alignment(fd: BorrowedFd<'_>) -> Option<(u32, u32)> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an empty path with AT_EMPTY_PATH refers to `fd` itself; the kernel writes at
    // most one `struct statx` into `stx`, which lives for the call.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if r < 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align))
}

/// Best effort: lift RLIMIT_MEMLOCK to infinity. Registered io_uring buffers (and RDMA memory
/// regions) are charged against it for processes without CAP_IPC_LOCK on older kernels; only a
/// privileged process can raise the hard limit, so failure is ignored.
pub(crate) fn raise_memlock_limit() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads one rlimit struct from a live local.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

/// A non-blocking, close-on-exec eventfd.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Resets an eventfd's counter (non-blocking read); returns the value read, 0 if none.
pub(crate) fn eventfd_drain(fd: BorrowedFd<'_>) -> u64 {
    let mut v: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live local u64.
    let r = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    if r == 8 {
        v
    } else {
        0
    }
}

/// fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) of `len` bytes at `offset`.
pub(crate) fn punch_hole(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: fallocate takes no pointers.
    let r = unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `_IO(0x12, 119)`: BLKDISCARD (no size or direction bits).
const BLKDISCARD: libc::c_ulong = (0x12 << 8) | 119;

/// Discards `len` bytes at `offset` of the block device open (for writing) on `fd`
/// (BLKDISCARD; both multiples of 512). Blocks until the device has done it; the errno on
/// failure (EOPNOTSUPP: the device takes no discards).
pub(crate) fn blkdiscard(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), i32> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: BLKDISCARD reads two u64 (start, length) through the pointer, which points to a
    // live local array.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), BLKDISCARD as _, range.as_ptr()) };
    if r < 0 {
        return Err(errno());
    }
    Ok(())
}

/// Adds 1 to an eventfd's counter (wakes its pollers).
pub(crate) fn eventfd_signal(fd: BorrowedFd<'_>) {
    let v: u64 = 1;
    // SAFETY: writes 8 bytes from a live local u64.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&v as *const u64).cast(), 8) };
}

/// A poller's small private ring (the readiness watch, the receive ring): `SINGLE_ISSUER |
/// DEFER_TASKRUN | TASKRUN_FLAG`, so its work runs only inside the owning thread's enter and
/// shows in the shared `IORING_SQ_TASKRUN` flag. Fails before Linux 6.1.
pub(crate) fn private_ring(entries: u32, cq_entries: u32) -> io::Result<io_uring::IoUring> {
    io_uring::IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        // Linux 6.1 refuses (EINVAL) a completion queue smaller than the submission queue
        // (`tcp_receive: io_uring`'s start-up check failed on it for that alone).
        .setup_cqsize(cq_entries.max(entries))
        .build(entries)
}

/// One `io_uring_enter` on a poller's small private ring: submits what is queued and runs its
/// deferred completion work (GETEVENTS with min_complete 0: never waits), retrying EINTR.
/// `Ok(false)`: the kernel holds a completion backlog (EBUSY/EAGAIN); drain the completion
/// queue before entering again.
pub(crate) fn enter_nowait(ring: &mut io_uring::IoUring) -> io::Result<bool> {
    /// `IORING_ENTER_GETEVENTS`.
    const ENTER_GETEVENTS: u32 = 1;
    loop {
        let to_submit = ring.submission().len() as u32;
        // SAFETY: no argument pointer is passed (null with the size of a sigset, as io-uring's
        // own wrappers do).
        let r = unsafe {
            ring.submitter()
                .enter::<libc::sigset_t>(to_submit, 0, ENTER_GETEVENTS, None)
        };
        match r {
            Ok(_) => return Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) => {
                return Ok(false)
            }
            Err(e) => return Err(e),
        }
    }
}
