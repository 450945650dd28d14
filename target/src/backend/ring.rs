//! A per-thread io_uring that executes the core's [`IoOp`]s on [`Devices`] with the buffers of
//! a [`BufPool`] it owns.
//!
//! Every operation occupies one slot from a table sized at creation; the slot index is the
//! io_uring `user_data`, and the slot (not the caller) holds the op's state until its last CQE
//! arrives, so buffers and continuation state stay valid by construction. Slots that finish
//! go to a ready queue of the same capacity; [`Ring::reap`] hands them to the caller. No heap
//! allocation happens per operation.
//!
//! Poller loop:
//! ```text
//! ring.submit_op(&op, Some((buf, 0)), tag)?   // any number, up to max_inflight
//! ring.submit()?                             // one io_uring_enter for the batch
//! ring.reap(|tag, result| ...)               // non-blocking
//! ring.wait(Some(timeout))?                  // park until a completion (or epoll the eventfd)
//! ```

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use arrayvec::ArrayVec;
use io_uring::{opcode, types, IoUring};

use super::device::{Deallocate, Device, DeviceKind, Devices, Signal, EBLOCKLISTED};
use super::discard::{Discarder, Job};
use super::pool::{BufId, BufPool};
use super::sys::{self, MmapRegion};
use crate::core::{trim_ranges, IoKind, IoOp, TRIM_RANGE_SIZE};

/// Bytes of the ring's zero buffer, the source of Write Zeroes when the device supports
/// neither FALLOC_FL_ZERO_RANGE nor FALLOC_FL_PUNCH_HOLE. A multiple of every block size.
const ZERO_BUF_LEN: usize = 256 * 1024;

/// user_data of the POLL_ADD on the discard helper's eventfd (slots are u32).
const DISCARD_WAKE: u64 = u64::MAX;

/// user_data of the POLL_ADD on the RBD completions' eventfd.
const RBD_WAKE: u64 = u64::MAX - 1;

/// IORING_ENTER_GETEVENTS.
const ENTER_GETEVENTS: u32 = 1;

/// Ring geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    /// Submission queue entries (the kernel rounds up to a power of two).
    pub sq_entries: u32,
    /// Operations that may be in flight at once (slots). [`Ring::submit_op`] returns
    /// [`SubmitError::Busy`] beyond this.
    pub max_inflight: u32,
    /// `Some(idle)`: IORING_SETUP_SQPOLL, a kernel thread polls the submission queue (and
    /// sleeps after `idle` without work), so submitting needs no system call while it is
    /// awake. Costs that thread's CPU; `None` (the default) submits with io_uring_enter.
    pub sqpoll: Option<Duration>,
    /// IORING_SETUP_IOPOLL for devices that can be polled ([`Device::is_pollable`]: O_DIRECT
    /// block devices with poll queues): their reads and writes go to a second, polled ring
    /// whose completions the caller's reaping collects by polling the device (no interrupt).
    /// Other devices and other operations (flush, zeroes, trim) keep the interrupt ring.
    pub iopoll: bool,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            sq_entries: 256,
            max_inflight: 256,
            sqpoll: None,
            iopoll: false,
        }
    }
}

/// How the kernel accepted the ring (newest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingMode {
    /// SINGLE_ISSUER | DEFER_TASKRUN (6.1+): completions run only inside our io_uring_enter.
    DeferTaskrun,
    /// COOP_TASKRUN (5.19+).
    CoopTaskrun,
    /// No task-run flags.
    Plain,
    /// SQPOLL: a kernel thread submits (see [`RingConfig::sqpoll`]).
    SqPoll,
}

/// Ring set-up failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    #[error("io_uring setup failed: {0}")]
    Setup(io::Error),
    #[error(
        "io_uring: the kernel lacks IORING_FEAT_EXT_ARG (Linux 5.11+), needed for timed waits"
    )]
    NoExtArg,
    #[error("io_uring: registering the device files failed: {0}")]
    RegisterFiles(io::Error),
    #[error("io_uring: registering {count} buffers ({bytes} bytes) failed: {source} (check RLIMIT_MEMLOCK)")]
    RegisterBuffers {
        count: usize,
        bytes: usize,
        source: io::Error,
    },
    #[error("io_uring: zero buffer mmap failed: errno {0}")]
    ZeroBuffer(i32),
    #[error("io_uring: max_inflight must be in 1..=65536, got {0}")]
    BadInflight(u32),
}

/// [`Ring::submit_op`] could not take the operation; nothing was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// All slots are in use: reap completions first (the caller keeps the request waiting).
    #[error("all {0} backend operation slots are in use")]
    Busy(u32),
}

/// Counters of one ring. Plain integers: a ring belongs to one thread.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RingStats {
    /// Operations accepted by [`Ring::submit_op`].
    pub submitted: u64,
    /// Operations completed (successfully or not).
    pub completed: u64,
    /// Operations completed with an error.
    pub errors: u64,
    /// Bytes read by successful Read operations.
    pub bytes_read: u64,
    /// Bytes written by successful Write operations.
    pub bytes_written: u64,
    /// SQEs queued, including continuations of short transfers and one per Trim range.
    pub sqes: u64,
    /// io_uring_enter system calls made.
    pub enters: u64,
    /// SQEs issued to the polled (IOPOLL) ring.
    pub polled_sqes: u64,
}

/// Per-device state the ring keeps (copied from [`Devices`] plus what it learned).
#[derive(Debug, Clone, Copy)]
struct Dev {
    size: u64,
    block_size: u64,
    read_only: bool,
    null: bool,
    /// How Write Zeroes is done; downgraded when the kernel answers EOPNOTSUPP.
    zero: ZeroMethod,
    /// What Trim does; `Ignored` once the kernel answered EOPNOTSUPP (Trim then completes
    /// without action).
    dealloc: Deallocate,
    /// Reads and writes of at most this many bytes go to the polled ring (0: none).
    poll_max: u64,
    /// An RBD image: every operation goes to librbd (`Ring::rbd_images`).
    rbd: bool,
}

/// An RBD namespace's image and where its fence is reported.
type RbdImage = (Arc<rbd::Image>, Arc<Signal>);

fn rbd_image(d: &Device) -> Option<RbdImage> {
    d.rbd().map(|i| (Arc::clone(i), Arc::clone(d.fenced())))
}

/// The ring's view of `d`; `iopoll`: the ring has a polled ring.
fn dev_of(d: &Device, iopoll: bool) -> Dev {
    Dev {
        size: d.size_bytes(),
        block_size: u64::from(d.block_size()),
        read_only: d.is_read_only(),
        null: d.kind() == DeviceKind::Null,
        zero: ZeroMethod::ZeroRange,
        dealloc: d.deallocate(),
        poll_max: if iopoll {
            u64::from(d.poll_max_bytes())
        } else {
            0
        },
        rbd: d.kind() == DeviceKind::Rbd,
    }
}

/// The file the discard helper uses for `d` (a duplicate descriptor), if Trim discards there.
fn discard_file(d: &Device) -> io::Result<Option<Arc<File>>> {
    match (d.deallocate(), d.file()) {
        (Deallocate::Discard, Some(f)) => Ok(Some(Arc::new(f.try_clone()?))),
        _ => Ok(None),
    }
}

/// An emptied device slot: every range check fails, nothing is written.
const ABSENT_DEV: Dev = Dev {
    size: 0,
    block_size: 1,
    read_only: true,
    null: false,
    zero: ZeroMethod::ZeroRange,
    dealloc: Deallocate::Ignored,
    poll_max: 0,
    rbd: false,
};

/// Device slots wanted in a ring's file table: room for devices a reload adds, within the
/// kernel's limit (a file table may not exceed RLIMIT_NOFILE).
const DEVICE_SLOTS: usize = 1024;

fn file_slots(configured: usize) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct into a live local.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
    } else {
        configured
    };
    DEVICE_SLOTS.min(cur).max(configured)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ZeroMethod {
    /// fallocate(FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE)
    ZeroRange,
    /// fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE): also reads back zeroes.
    PunchHole,
    /// WRITE_FIXED from the zero buffer, one chunk at a time.
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotKind {
    /// On the free list.
    Idle,
    Read,
    Write,
    Flush,
    Zero(ZeroMethod),
    /// Hole punches in flight (one SQE per range).
    Trim,
    /// A job with the discard helper (`pending` is 1 until it reports).
    Discard,
    /// Operations with librbd (`pending` of them; more than one only for Trim).
    Rbd(RbdKind),
    /// Finished, on the ready queue.
    Done,
}

/// The threads whose work the ring learns of by polling an eventfd they signal.
#[derive(Debug, Clone, Copy)]
enum Helper {
    /// The discard helper thread (`Discarder`).
    Discard,
    /// librbd's completion callbacks (`rbd::Completions`).
    Rbd,
}

/// What an RBD slot's librbd operations are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RbdKind {
    /// A read into the slot's buffer (or a Compare's scratch buffer).
    Read,
    Write,
    /// Flush, Write Zeroes, discards: no data.
    NoData,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Write with Force Unit Access: issued with RWF_DSYNC.
    fua: bool,
    user_data: u64,
    kind: SlotKind,
    dev: u32,
    /// The buffer this op marked in flight (cleared again when it finishes).
    buf: Option<BufId>,
    /// Address of the op's first byte in the buffer.
    addr: usize,
    /// Device byte offset and length of the whole op.
    offset: u64,
    len: u64,
    /// Bytes done so far (short transfers and zero-buffer chunks continue from here).
    done: u64,
    /// SQEs in flight (more than one only for Trim).
    pending: u32,
    /// First errno seen (Trim).
    err: i32,
    /// Compare: the buffer and offset of the host's data; `buf` is then the pool buffer the
    /// range is read into (freed when the op finishes).
    compare: Option<(BufId, u32)>,
    /// Compare and Write (RBD): the buffer of the Compare's data, marked in flight next to
    /// `buf` (the Write's data) until the op finishes.
    caw_compare: Option<BufId>,
    result: Result<u32, i32>,
}

const IDLE_SLOT: Slot = Slot {
    user_data: 0,
    kind: SlotKind::Idle,
    dev: 0,
    buf: None,
    addr: 0,
    offset: 0,
    len: 0,
    done: 0,
    pending: 0,
    err: 0,
    compare: None,
    caw_compare: None,
    result: Ok(0),
    fua: false,
};

/// A per-thread io_uring with the devices and the buffer pool registered.
///
/// `Ring` is `Send` so it can be built at start-up and moved to its poller thread; it is
/// created disabled and enabled by the first call that enters the kernel, which makes that
/// thread its single issuer. From then on it must be used from that thread only (the kernel
/// answers EEXIST otherwise).
pub struct Ring {
    // Field order is drop order: the rings go first, then the memory they have registered.
    ring: IoUring,
    /// The IOPOLL ring ([`RingConfig::iopoll`]), with the same files and buffers registered.
    poll: Option<IoUring>,
    /// SQEs in the polled ring whose CQE has not been seen.
    poll_pending: u32,
    eventfd: Option<OwnedFd>,
    pool: BufPool,
    zero: MmapRegion,
    zero_index: u16,
    devices: Arc<Devices>,
    dev: Vec<Dev>,
    /// Size of the registered file table (device slots).
    file_slots: usize,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    ready: VecDeque<u32>,
    /// Per device slot, the block device's file for the discard helper (`Deallocate::Discard`).
    discard_files: Vec<Option<Arc<File>>>,
    /// Started on the first discard.
    discarder: Option<Discarder>,
    /// Jobs with the discard helper.
    discards: u32,
    /// A POLL_ADD on the helper's eventfd is in the ring.
    discard_armed: bool,
    /// Reused for the helper's finished jobs.
    discard_done: Vec<(u32, Result<(), i32>)>,
    /// Per device slot, the image of an RBD namespace and where its fence is reported.
    rbd_images: Vec<Option<RbdImage>>,
    /// Where librbd's callbacks leave results (token = slot), made on the first RBD op.
    rbd_done: Option<rbd::Completions>,
    /// librbd operations in flight.
    rbd_inflight: u32,
    /// Slots waiting for librbd (their results wake the ring's eventfd, so a poller may sleep).
    rbd_slots: u32,
    /// A POLL_ADD on `rbd_done`'s eventfd is in the ring.
    rbd_armed: bool,
    /// Reused for librbd's results.
    rbd_results: Vec<(u32, i64)>,
    /// Per slot, where librbd's compare-and-write leaves the offset of the first difference
    /// (never resized: librbd holds pointers into it while operations run).
    rbd_mismatch: Box<[u64]>,
    mode: RingMode,
    /// The kernel sets IORING_SQ_TASKRUN when deferred completions wait for an enter.
    taskrun_flag: bool,
    enabled: bool,
    stats: RingStats,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("fd", &self.ring.as_raw_fd())
            .field("mode", &self.mode)
            .field("in_flight", &self.in_flight())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn build_ring(cfg: &RingConfig) -> Result<(IoUring, RingMode, bool), RingError> {
    let cq = cfg
        .max_inflight
        .max(cfg.sq_entries.saturating_mul(2))
        .next_power_of_two();
    let mut last = None;
    // (mode, taskrun flag) in order of preference; EINVAL means "this kernel does not know a flag".
    // SQPOLL excludes DEFER_TASKRUN (completion work runs on the SQ thread): asked for, it is
    // the only mode tried, so a kernel that refuses it is an error, not a silent fallback.
    let modes: &[(RingMode, bool)] = if cfg.sqpoll.is_some() {
        &[(RingMode::SqPoll, false)]
    } else {
        &[
            (RingMode::DeferTaskrun, true),
            (RingMode::DeferTaskrun, false),
            (RingMode::CoopTaskrun, true),
            (RingMode::Plain, false),
        ]
    };
    for &(mode, flag) in modes {
        let mut b = IoUring::builder();
        b.setup_cqsize(cq).setup_clamp().setup_r_disabled();
        match mode {
            RingMode::SqPoll => {
                let idle = cfg.sqpoll.unwrap_or_default().as_millis();
                b.setup_sqpoll(u32::try_from(idle).unwrap_or(u32::MAX).max(1));
            }
            RingMode::DeferTaskrun => {
                b.setup_single_issuer().setup_defer_taskrun();
            }
            RingMode::CoopTaskrun => {
                b.setup_coop_taskrun();
            }
            RingMode::Plain => {}
        }
        if flag {
            b.setup_taskrun_flag();
        }
        match b.build(cfg.sq_entries) {
            Ok(r) => return Ok((r, mode, flag)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last = Some(e),
            Err(e) => return Err(RingError::Setup(e)),
        }
    }
    Err(RingError::Setup(last.unwrap_or_else(|| {
        io::Error::from_raw_os_error(libc::EINVAL)
    })))
}

impl Ring {
    /// Creates the ring, registers every device (as fixed file = device index; null devices
    /// leave a sparse slot) and every pool buffer (fixed buffer = [`BufId`]), plus a zero
    /// buffer of its own. Takes ownership of the pool so registered memory outlives the ring.
    pub fn new(cfg: RingConfig, devices: Arc<Devices>, pool: BufPool) -> Result<Ring, RingError> {
        if cfg.max_inflight == 0 || cfg.max_inflight > 65536 {
            return Err(RingError::BadInflight(cfg.max_inflight));
        }
        let (ring, mode, taskrun_flag) = build_ring(&cfg)?;
        if !ring.params().is_feature_ext_arg() {
            return Err(RingError::NoExtArg);
        }
        let sub = ring.submitter();

        // The file table has room for devices added later ([`Ring::set_device`], on a
        // configuration reload): empty slots are -1.
        let mut fds: Vec<RawFd> = devices.iter().map(|d| d.raw_fd().unwrap_or(-1)).collect();
        fds.resize(file_slots(fds.len()), -1);
        if !fds.is_empty() {
            sub.register_files(&fds).map_err(RingError::RegisterFiles)?;
        }

        let zero = MmapRegion::new(ZERO_BUF_LEN).map_err(RingError::ZeroBuffer)?;
        let mut iov = pool.iovecs();
        let zero_index = iov.len() as u16; // pool count <= MAX_BUFFERS, so this fits
        iov.push(libc::iovec {
            iov_base: zero.ptr().as_ptr().cast(),
            iov_len: ZERO_BUF_LEN,
        });
        sys::raise_memlock_limit();
        // SAFETY: every iovec describes memory owned by `pool` or `zero`, which the returned
        // Ring owns and drops only after the io_uring itself (field order), so the memory stays
        // valid for as long as the registration.
        unsafe { sub.register_buffers(&iov) }.map_err(|source| RingError::RegisterBuffers {
            count: iov.len(),
            bytes: pool.len() + ZERO_BUF_LEN,
            source,
        })?;

        let poll = if cfg.iopoll {
            let cq = cfg
                .max_inflight
                .max(cfg.sq_entries.saturating_mul(2))
                .next_power_of_two();
            let p = IoUring::builder()
                .setup_iopoll()
                .setup_cqsize(cq)
                .setup_clamp()
                .build(cfg.sq_entries)
                .map_err(RingError::Setup)?;
            if !fds.is_empty() {
                p.submitter()
                    .register_files(&fds)
                    .map_err(RingError::RegisterFiles)?;
            }
            // SAFETY: as for the main ring: `pool` and `zero` outlive both rings (field order).
            unsafe { p.submitter().register_buffers(&iov) }.map_err(|source| {
                RingError::RegisterBuffers {
                    count: iov.len(),
                    bytes: pool.len() + ZERO_BUF_LEN,
                    source,
                }
            })?;
            Some(p)
        } else {
            None
        };
        let dev = devices.iter().map(|d| dev_of(d, cfg.iopoll)).collect();
        let discard_files = devices
            .iter()
            .map(discard_file)
            .collect::<io::Result<_>>()
            .map_err(RingError::Setup)?;
        let rbd_images = devices.iter().map(rbd_image).collect();
        let file_slots = fds.len();
        let n = cfg.max_inflight as usize;
        Ok(Ring {
            ring,
            poll,
            poll_pending: 0,
            eventfd: None,
            pool,
            zero,
            zero_index,
            devices,
            dev,
            file_slots,
            slots: vec![IDLE_SLOT; n],
            free_slots: (0..cfg.max_inflight).rev().collect(),
            ready: VecDeque::with_capacity(n),
            discard_files,
            discarder: None,
            discards: 0,
            discard_armed: false,
            discard_done: Vec::new(),
            rbd_images,
            rbd_done: None,
            rbd_inflight: 0,
            rbd_slots: 0,
            rbd_armed: false,
            rbd_results: Vec::new(),
            rbd_mismatch: vec![0; n].into_boxed_slice(),
            mode,
            taskrun_flag,
            enabled: false,
            stats: RingStats::default(),
        })
    }

    /// Put `device` in device slot `index` (registering its file in the ring's file table),
    /// or with `None` empty the slot: operations on it then fail (ENODEV before an SQE is
    /// built, EBADF for any already queued). Operations in flight keep the file they were
    /// issued on. Must run on the ring's thread; fails with ENOSPC beyond the file table.
    pub fn set_device(&mut self, index: u32, device: Option<&Device>) -> io::Result<()> {
        let i = index as usize;
        if i >= self.file_slots {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let fd = device.and_then(|d| d.raw_fd()).unwrap_or(-1);
        self.ring.submitter().register_files_update(index, &[fd])?;
        if let Some(p) = &self.poll {
            p.submitter().register_files_update(index, &[fd])?;
        }
        if self.dev.len() <= i {
            self.dev.resize(i + 1, ABSENT_DEV);
        }
        let iopoll = self.poll.is_some();
        self.dev[i] = device.map(|d| dev_of(d, iopoll)).unwrap_or(ABSENT_DEV);
        let file = device.map(discard_file).transpose()?.flatten();
        if self.discard_files.len() <= i {
            self.discard_files.resize(i + 1, None);
        }
        self.discard_files[i] = file;
        if self.rbd_images.len() <= i {
            self.rbd_images.resize(i + 1, None);
        }
        self.rbd_images[i] = device.and_then(rbd_image);
        Ok(())
    }

    /// The buffer pool (allocate, fill, read buffers here).
    pub fn pool(&self) -> &BufPool {
        &self.pool
    }

    pub fn pool_mut(&mut self) -> &mut BufPool {
        &mut self.pool
    }

    pub fn devices(&self) -> &Arc<Devices> {
        &self.devices
    }

    pub fn mode(&self) -> RingMode {
        self.mode
    }

    /// Device slots whose reads and writes go to the polled (IOPOLL) ring.
    pub fn polled_devices(&self) -> usize {
        self.dev.iter().filter(|d| d.poll_max > 0).count()
    }

    pub fn stats(&self) -> &RingStats {
        &self.stats
    }

    /// Operations accepted and not yet handed back by `reap`.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    /// Operations in flight that wait for librbd: their results come to the ring through an
    /// eventfd ([`Ring::librbd_eventfd`]), so a poller waiting only for them may sleep in epoll
    /// on that eventfd; once it is readable, [`Ring::reap`] finishes what arrived.
    pub fn waiting_on_librbd(&self) -> usize {
        self.rbd_slots as usize
    }

    /// The eventfd librbd's results signal (made with the ring's first RBD operation).
    /// Level-triggered readable until the ring has taken the results.
    pub fn librbd_eventfd(&self) -> Option<BorrowedFd<'_>> {
        self.rbd_done.as_ref().map(|d| d.eventfd())
    }

    /// Free operation slots.
    pub fn free_slots(&self) -> usize {
        self.free_slots.len()
    }

    /// Creates an eventfd the kernel signals when completions (or, with DEFER_TASKRUN,
    /// completion work that the next [`Ring::reap`] will run) become available; epoll it for
    /// readability, then call [`Ring::drain_eventfd`] and [`Ring::reap`]. Idempotent.
    pub fn register_eventfd(&mut self) -> io::Result<BorrowedFd<'_>> {
        if self.eventfd.is_none() {
            let fd = sys::eventfd()?;
            self.ring.submitter().register_eventfd(fd.as_raw_fd())?;
            self.eventfd = Some(fd);
        }
        Ok(self.eventfd().expect("registered just above"))
    }

    /// The registered eventfd, if any.
    pub fn eventfd(&self) -> Option<BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.eventfd.as_ref().map(|f| f.as_fd())
    }

    /// Resets the eventfd counter (call after epoll reported it readable).
    pub fn drain_eventfd(&self) {
        if let Some(fd) = self.eventfd() {
            sys::eventfd_drain(fd);
        }
    }

    /// Queues one operation. `buf` is (buffer, byte offset into it) and is required for Read
    /// and Write; the data occupies `buf_offset .. buf_offset + op.len`. The buffer is marked
    /// in flight until the completion is reaped. An invalid op (unknown device, outside the
    /// device, misaligned, missing or busy buffer, write to a read-only device) is not an
    /// `Err`: it completes through [`Ring::reap`] with an errno (ENODEV, EINVAL, EBUSY, EROFS).
    ///
    /// Completion results: Read/Write report `op.len` bytes; Flush, Write Zeroes and Trim 0.
    pub fn submit_op(
        &mut self,
        op: &IoOp,
        buf: Option<(BufId, u32)>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        let Some(s) = self.free_slots.pop() else {
            return Err(SubmitError::Busy(self.slots.len() as u32));
        };
        self.stats.submitted += 1;
        self.slots[s as usize] = Slot {
            user_data,
            dev: op.device,
            offset: op.offset,
            len: u64::from(op.len),
            ..IDLE_SLOT
        };
        if let Err(errno) = self.start(s, op, buf) {
            self.finish(s, Err(errno));
        }
        Ok(())
    }

    /// Validates and issues the op in slot `s`; `Err(errno)` to fail it before any SQE.
    fn start(&mut self, s: u32, op: &IoOp, buf: Option<(BufId, u32)>) -> Result<(), i32> {
        let dev = *self.dev.get(op.device as usize).ok_or(libc::ENODEV)?;
        let si = s as usize;
        let writes = !matches!(op.kind, IoKind::Read | IoKind::Flush | IoKind::Compare);
        if writes && dev.read_only {
            return Err(libc::EROFS);
        }
        if dev.rbd {
            return self.start_rbd(s, op, buf, &dev);
        }
        match &op.kind {
            IoKind::Read | IoKind::Write | IoKind::WriteFua => {
                let (id, boff) = buf.ok_or(libc::EINVAL)?;
                check_range(&dev, op.offset, u64::from(op.len))?;
                let end = (boff as usize)
                    .checked_add(op.len as usize)
                    .ok_or(libc::EINVAL)?;
                if end > self.pool.buf_size() {
                    return Err(libc::EINVAL);
                }
                if self.pool.is_in_flight(id) {
                    return Err(libc::EBUSY);
                }
                if self.pool.payload(id, 0).is_err() {
                    // Not allocated, or not in this pool.
                    return Err(libc::EINVAL);
                }
                if op.len == 0 {
                    self.finish(s, Ok(0));
                    return Ok(());
                }
                let is_read = op.kind == IoKind::Read;
                if dev.null {
                    if is_read {
                        // Null reads return zeroes: lazily, the pool writes them only if the
                        // buffer is looked at other than to send it.
                        self.pool
                            .set_zero(id, boff as usize, end)
                            .map_err(|_| libc::EINVAL)?;
                    }
                    self.finish_rw(s, is_read);
                    return Ok(());
                }
                let base = self.pool.buf_ptr(id).map_err(|_| libc::EINVAL)?;
                let addr = base.as_ptr() as usize + boff as usize;
                self.pool.mark_in_flight(id).map_err(|_| libc::EINVAL)?;
                let slot = &mut self.slots[si];
                slot.buf = Some(id);
                slot.addr = addr;
                slot.fua = op.kind == IoKind::WriteFua;
                slot.kind = if is_read {
                    SlotKind::Read
                } else {
                    SlotKind::Write
                };
                self.issue_rw(s)
            }
            // Only a store with a compare-and-write of its own is given one.
            IoKind::CompareAndWrite { .. } => Err(libc::EINVAL),
            IoKind::Compare => {
                let (id, boff) = buf.ok_or(libc::EINVAL)?;
                check_range(&dev, op.offset, u64::from(op.len))?;
                let end = (boff as usize)
                    .checked_add(op.len as usize)
                    .ok_or(libc::EINVAL)?;
                // The host's data must be there (allocated, in this pool, long enough).
                self.pool.payload(id, end).map_err(|_| libc::EINVAL)?;
                if op.len == 0 {
                    self.finish(s, Ok(0));
                    return Ok(());
                }
                if dev.null {
                    let data =
                        &self.pool.payload(id, end).map_err(|_| libc::EINVAL)?[boff as usize..];
                    let same = data.iter().all(|&b| b == 0);
                    self.finish(s, if same { Ok(op.len) } else { Err(libc::EILSEQ) });
                    return Ok(());
                }
                // The range is read into a buffer of its own, then compared.
                let scratch = self.pool.alloc().ok_or(libc::EBUSY)?;
                let addr = match self.pool.buf_ptr(scratch) {
                    Ok(p) => p.as_ptr() as usize,
                    Err(_) => {
                        let _ = self.pool.free(scratch);
                        return Err(libc::EINVAL);
                    }
                };
                if self.pool.mark_in_flight(scratch).is_err() {
                    let _ = self.pool.free(scratch);
                    return Err(libc::EINVAL);
                }
                let slot = &mut self.slots[si];
                slot.buf = Some(scratch);
                slot.addr = addr;
                slot.compare = Some((id, boff));
                slot.kind = SlotKind::Read;
                self.issue_rw(s)
            }
            IoKind::Flush => {
                // `test-noop-flush`: a broken target for the crash-point checker to catch.
                if dev.null || cfg!(feature = "test-noop-flush") {
                    self.finish(s, Ok(0));
                    return Ok(());
                }
                self.slots[si].kind = SlotKind::Flush;
                let e = opcode::Fsync::new(types::Fixed(op.device))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build();
                self.push_one(s, e)
            }
            IoKind::WriteZeroes => {
                check_range(&dev, op.offset, u64::from(op.len))?;
                if dev.null || op.len == 0 {
                    self.finish(s, Ok(0));
                    return Ok(());
                }
                self.slots[si].kind = SlotKind::Zero(dev.zero);
                self.issue_zero(s)
            }
            IoKind::Trim { ranges } => {
                // The byte ranges are listed in the command's buffer (crate::core::trim_ranges).
                let (id, boff) = buf.ok_or(libc::EINVAL)?;
                let list_len = usize::from(*ranges) * TRIM_RANGE_SIZE;
                let end = (boff as usize).checked_add(list_len).ok_or(libc::EINVAL)?;
                let list = self.pool.payload(id, end).map_err(|_| libc::EINVAL)?;
                let list = &list[boff as usize..];
                for (off, len) in trim_ranges(list, *ranges) {
                    check_range(&dev, off, len)?;
                }
                if dev.null || dev.dealloc == Deallocate::Ignored {
                    self.finish(s, Ok(0));
                    return Ok(());
                }
                if dev.dealloc == Deallocate::Discard {
                    let list =
                        &self.pool.payload(id, end).map_err(|_| libc::EINVAL)?[boff as usize..];
                    let ranges: Vec<(u64, u64)> = trim_ranges(list, *ranges)
                        .filter(|&(_, len)| len > 0)
                        .collect();
                    return self.discard(s, op.device, ranges);
                }
                self.slots[si].kind = SlotKind::Trim;
                for i in 0..usize::from(*ranges) {
                    // Read each range afresh: queueing borrows the ring mutably.
                    let list = self.pool.payload(id, end).map_err(|_| libc::EINVAL)?;
                    let entry = &list[boff as usize + i * TRIM_RANGE_SIZE..];
                    let Some((off, len)) = trim_ranges(entry, 1).next() else {
                        break;
                    };
                    if len == 0 {
                        continue;
                    }
                    let e = opcode::Fallocate::new(types::Fixed(op.device), len)
                        .offset(off)
                        .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                        .build();
                    if let Err(errno) = self.push_one(s, e) {
                        // Ranges already queued still complete; report the failure at the end.
                        self.slots[si].err = errno;
                        break;
                    }
                }
                if self.slots[si].pending == 0 {
                    let err = self.slots[si].err;
                    self.finish(s, if err == 0 { Ok(0) } else { Err(err) });
                }
                Ok(())
            }
        }
    }

    /// Issues the op in slot `s` to librbd (an RBD namespace): the same checks as for files,
    /// then one asynchronous librbd call (one per range for Trim) whose results come back
    /// through `rbd_done` and the POLL_ADD on its eventfd.
    fn start_rbd(
        &mut self,
        s: u32,
        op: &IoOp,
        buf: Option<(BufId, u32)>,
        dev: &Dev,
    ) -> Result<(), i32> {
        let img = self
            .rbd_images
            .get(op.device as usize)
            .and_then(|i| i.as_ref())
            .map(|(img, _)| Arc::clone(img))
            .ok_or(libc::ENODEV)?;
        if self.rbd_done.is_none() {
            let c = rbd::Completions::new(self.slots.len() as u32)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
            self.rbd_done = Some(c);
        }
        let si = s as usize;
        let mut issued = 0u32;
        let result = match &op.kind {
            IoKind::Read | IoKind::Write | IoKind::WriteFua | IoKind::Compare => {
                let (id, boff) = buf.ok_or(libc::EINVAL)?;
                check_range(dev, op.offset, u64::from(op.len))?;
                let end = (boff as usize)
                    .checked_add(op.len as usize)
                    .ok_or(libc::EINVAL)?;
                if end > self.pool.buf_size() {
                    return Err(libc::EINVAL);
                }
                let compare = op.kind == IoKind::Compare;
                if compare {
                    // The host's data must be there (allocated, in this pool, long enough).
                    self.pool.payload(id, end).map_err(|_| libc::EINVAL)?;
                } else {
                    if self.pool.is_in_flight(id) {
                        return Err(libc::EBUSY);
                    }
                    self.pool.payload(id, 0).map_err(|_| libc::EINVAL)?;
                }
                if op.len == 0 {
                    self.finish(s, Ok(0));
                    return Ok(());
                }
                // A Compare reads the range into a buffer of its own.
                let target = if compare {
                    self.pool.alloc().ok_or(libc::EBUSY)?
                } else {
                    id
                };
                let addr = match self.pool.buf_ptr(target) {
                    Ok(p) => p.as_ptr() as usize + if compare { 0 } else { boff as usize },
                    Err(_) => {
                        if compare {
                            let _ = self.pool.free(target);
                        }
                        return Err(libc::EINVAL);
                    }
                };
                if self.pool.mark_in_flight(target).is_err() {
                    if compare {
                        let _ = self.pool.free(target);
                    }
                    return Err(libc::EINVAL);
                }
                let is_read = matches!(op.kind, IoKind::Read | IoKind::Compare);
                let slot = &mut self.slots[si];
                slot.buf = Some(target);
                slot.addr = addr;
                slot.compare = compare.then_some((id, boff));
                slot.fua = op.kind == IoKind::WriteFua;
                slot.kind = SlotKind::Rbd(if is_read {
                    RbdKind::Read
                } else {
                    RbdKind::Write
                });
                let done = self.rbd_done.as_ref().expect("made above");
                let len = op.len as usize;
                // SAFETY: [addr, addr + len) lies in a pool buffer (checked above) that is
                // marked in flight until this slot finishes, which happens only after librbd
                // reported the result (`on_rbd_wake`), or at once if the call is refused; the
                // pool outlives every operation in flight (`Drop for Ring` waits for them).
                let r = unsafe {
                    if is_read {
                        img.aio_read(done, s, op.offset, addr as *mut u8, len)
                    } else {
                        img.aio_write(
                            done,
                            s,
                            op.offset,
                            addr as *const u8,
                            len,
                            op.kind == IoKind::WriteFua,
                        )
                    }
                };
                r.map(|()| issued = 1)
            }
            IoKind::CompareAndWrite { write_buf, .. } => {
                let (cmp, cmp_off) = buf.ok_or(libc::EINVAL)?;
                let wbuf =
                    BufId(u16::try_from(write_buf.ok_or(libc::EINVAL)?).map_err(|_| libc::EINVAL)?);
                check_range(dev, op.offset, u64::from(op.len))?;
                let end = (cmp_off as usize)
                    .checked_add(op.len as usize)
                    .ok_or(libc::EINVAL)?;
                if cmp == wbuf
                    || end > self.pool.buf_size()
                    || op.len as usize > self.pool.buf_size()
                {
                    return Err(libc::EINVAL);
                }
                // Both the host's data: allocated, in this pool, long enough, not in flight.
                if self.pool.is_in_flight(cmp) || self.pool.is_in_flight(wbuf) {
                    return Err(libc::EBUSY);
                }
                self.pool.payload(cmp, end).map_err(|_| libc::EINVAL)?;
                self.pool
                    .payload(wbuf, op.len as usize)
                    .map_err(|_| libc::EINVAL)?;
                if op.len == 0 {
                    self.finish(s, Ok(0));
                    return Ok(());
                }
                let cmp_addr = self.pool.buf_ptr(cmp).map_err(|_| libc::EINVAL)?.as_ptr() as usize
                    + cmp_off as usize;
                let w_addr = self.pool.buf_ptr(wbuf).map_err(|_| libc::EINVAL)?.as_ptr() as usize;
                self.pool.mark_in_flight(wbuf).map_err(|_| libc::EINVAL)?;
                if self.pool.mark_in_flight(cmp).is_err() {
                    let _ = self.pool.clear_in_flight(wbuf);
                    return Err(libc::EINVAL);
                }
                let slot = &mut self.slots[si];
                slot.buf = Some(wbuf);
                slot.caw_compare = Some(cmp);
                slot.addr = w_addr;
                slot.kind = SlotKind::Rbd(RbdKind::Write);
                let done = self.rbd_done.as_ref().expect("made above");
                let mismatch = &mut self.rbd_mismatch[si] as *mut u64;
                // SAFETY: both ranges lie in pool buffers (checked above) marked in flight
                // until this slot finishes, which happens only after librbd reported the
                // result (`on_rbd_wake`), or at once if the call is refused; `mismatch` is this
                // slot's cell of a slice never resized while the ring lives, and the pool and
                // the cells outlive every operation in flight (`Drop for Ring` waits for them).
                let r = unsafe {
                    img.aio_compare_and_write(
                        done,
                        s,
                        op.offset,
                        cmp_addr as *const u8,
                        w_addr as *const u8,
                        op.len as usize,
                        mismatch,
                    )
                };
                r.map(|()| issued = 1)
            }
            IoKind::Flush => {
                self.slots[si].kind = SlotKind::Rbd(RbdKind::NoData);
                let done = self.rbd_done.as_ref().expect("made above");
                img.aio_flush(done, s).map(|()| issued = 1)
            }
            IoKind::WriteZeroes => {
                check_range(dev, op.offset, u64::from(op.len))?;
                if op.len == 0 {
                    self.finish(s, Ok(0));
                    return Ok(());
                }
                self.slots[si].kind = SlotKind::Rbd(RbdKind::NoData);
                let done = self.rbd_done.as_ref().expect("made above");
                img.aio_write_zeroes(done, s, op.offset, u64::from(op.len))
                    .map(|()| issued = 1)
            }
            IoKind::Trim { ranges } => {
                let (id, boff) = buf.ok_or(libc::EINVAL)?;
                let list_len = usize::from(*ranges) * TRIM_RANGE_SIZE;
                let end = (boff as usize).checked_add(list_len).ok_or(libc::EINVAL)?;
                let list = &self.pool.payload(id, end).map_err(|_| libc::EINVAL)?[boff as usize..];
                let list: ArrayVec<(u64, u64), 256> = trim_ranges(list, *ranges)
                    .filter(|&(_, len)| len > 0)
                    .collect();
                for &(off, len) in &list {
                    check_range(dev, off, len)?;
                }
                if dev.dealloc == Deallocate::Ignored || list.is_empty() {
                    self.finish(s, Ok(0));
                    return Ok(());
                }
                self.slots[si].kind = SlotKind::Rbd(RbdKind::NoData);
                let done = self.rbd_done.as_ref().expect("made above");
                let mut r = Ok(());
                for &(off, len) in &list {
                    match img.aio_discard(done, s, off, len) {
                        Ok(()) => issued += 1,
                        Err(e) => {
                            r = Err(e);
                            break;
                        }
                    }
                }
                if issued > 0 {
                    // Ranges already issued still complete; the failure is reported at the end.
                    if let Err(e) = r {
                        self.slots[si].err = e;
                    }
                    Ok(())
                } else {
                    r
                }
            }
        };
        result?;
        self.slots[si].pending += issued;
        self.rbd_inflight += issued;
        self.rbd_slots += 1;
        self.stats.sqes += u64::from(issued);
        // The operation is librbd's now: it finishes through `on_rbd_wake` only (failing the
        // slot here would free its buffer while librbd still reads or fills it). Without the
        // poll, `reap` takes the results itself.
        self.arm_or_reap(Helper::Rbd);
        Ok(())
    }

    /// librbd reported results: finish the slots whose last operation came back, and poll
    /// again while operations remain.
    fn on_rbd_wake(&mut self) {
        self.rbd_armed = false;
        let mut results = std::mem::take(&mut self.rbd_results);
        if let Some(d) = &self.rbd_done {
            d.take(&mut results);
        }
        for (s, ret) in results.drain(..) {
            let Some(slot) = self.slots.get_mut(s as usize) else {
                continue;
            };
            let SlotKind::Rbd(kind) = slot.kind else {
                debug_assert!(false, "rbd result for slot {s} in state {:?}", slot.kind);
                continue;
            };
            if slot.pending == 0 {
                debug_assert!(false, "unexpected rbd result for slot {s}");
                continue;
            }
            slot.pending -= 1;
            self.rbd_inflight = self.rbd_inflight.saturating_sub(1);
            if ret < 0 && slot.err == 0 {
                slot.err = i32::try_from(-ret).unwrap_or(libc::EIO);
                if slot.err == EBLOCKLISTED {
                    if let Some(Some((_, fenced))) = self.rbd_images.get(slot.dev as usize) {
                        fenced.raise();
                    }
                }
            }
            if kind == RbdKind::Read && ret >= 0 {
                slot.done = (ret as u64).min(slot.len);
            }
            if slot.pending > 0 {
                continue;
            }
            let slot = *slot;
            self.rbd_slots = self.rbd_slots.saturating_sub(1);
            if slot.err != 0 {
                if slot.caw_compare.is_some() && slot.err != libc::EILSEQ {
                    tracing::warn!(
                        offset = slot.offset,
                        len = slot.len,
                        errno = slot.err,
                        "librbd's compare-and-write failed"
                    );
                }
                self.finish(s, Err(slot.err));
                continue;
            }
            match kind {
                RbdKind::Read => {
                    if slot.done < slot.len {
                        // Past the image's end (it shrank underneath us): zeroes, as for files.
                        let start = slot.addr + slot.done as usize;
                        let n = (slot.len - slot.done) as usize;
                        // SAFETY: [start, start + n) lies inside the op's buffer range, checked
                        // at submit; librbd is done with it and the buffer is in flight, so no
                        // Rust reference to it exists.
                        unsafe { std::ptr::write_bytes(start as *mut u8, 0, n) };
                    }
                    self.finish_rw(s, true);
                }
                RbdKind::Write => self.finish_rw(s, false),
                RbdKind::NoData => self.finish(s, Ok(0)),
            }
        }
        self.rbd_results = results;
        if self.rbd_inflight > 0 {
            self.rearm_now(Helper::Rbd);
        }
    }

    /// Hands slot `s`'s ranges on `device` to the discard helper (starting it if needed) and
    /// makes sure the ring polls the helper's eventfd.
    fn discard(&mut self, s: u32, device: u32, ranges: Vec<(u64, u64)>) -> Result<(), i32> {
        if ranges.is_empty() {
            self.finish(s, Ok(0));
            return Ok(());
        }
        let file = self
            .discard_files
            .get(device as usize)
            .cloned()
            .flatten()
            .ok_or(libc::ENODEV)?;
        if self.discarder.is_none() {
            let d = Discarder::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
            self.discarder = Some(d);
        }
        let d = self.discarder.as_ref().expect("started just above");
        if !d.send(Job {
            slot: s,
            file,
            ranges,
        }) {
            return Err(libc::EIO);
        }
        let slot = &mut self.slots[s as usize];
        slot.kind = SlotKind::Discard;
        slot.pending = 1;
        self.discards += 1;
        // The helper has the job: it finishes through `on_discard_wake` only (see above).
        self.arm_or_reap(Helper::Discard);
        Ok(())
    }

    /// [`Ring::arm`] after a helper took an operation: a failure (no room in the submission
    /// queue and the kernel refusing the enter that would make some) is logged, and `reap`
    /// then takes the helper's results without the poll.
    fn arm_or_reap(&mut self, helper: Helper) {
        if let Err(errno) = self.arm(helper) {
            tracing::warn!(
                errno,
                ?helper,
                "cannot poll the helper's eventfd; reaping its results without it"
            );
        }
    }

    /// Puts a POLL_ADD on `helper`'s eventfd into the ring, unless one is there (or the helper
    /// does not exist yet).
    fn arm(&mut self, helper: Helper) -> Result<(), i32> {
        let (fd, armed, user_data) = match helper {
            Helper::Discard => (
                self.discarder.as_ref().map(|d| d.eventfd().as_raw_fd()),
                self.discard_armed,
                DISCARD_WAKE,
            ),
            Helper::Rbd => (
                self.rbd_done.as_ref().map(|d| d.eventfd().as_raw_fd()),
                self.rbd_armed,
                RBD_WAKE,
            ),
        };
        let Some(fd) = fd.filter(|_| !armed) else {
            return Ok(());
        };
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(user_data);
        self.push_entry(e)?;
        match helper {
            Helper::Discard => self.discard_armed = true,
            Helper::Rbd => self.rbd_armed = true,
        }
        Ok(())
    }

    /// Polls `helper`'s eventfd again and submits at once: this runs while reaping, and a
    /// caller that reaps and then sleeps would otherwise leave the poll unsubmitted and never
    /// hear of the rest.
    fn rearm_now(&mut self, helper: Helper) {
        let r = self.arm(helper).and_then(|()| {
            self.enter(0, None, false)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
        });
        if let Err(errno) = r {
            tracing::error!(errno, ?helper, "cannot poll the helper's eventfd");
        }
    }

    /// The discard helper's eventfd fired: finish the slots it reports, and poll again while
    /// jobs remain.
    fn on_discard_wake(&mut self) {
        self.discard_armed = false;
        let mut done = std::mem::take(&mut self.discard_done);
        if let Some(d) = &self.discarder {
            d.take_done(&mut done);
        }
        for (s, result) in done.drain(..) {
            let Some(slot) = self.slots.get_mut(s as usize) else {
                continue;
            };
            if slot.kind != SlotKind::Discard {
                debug_assert!(
                    false,
                    "discard result for slot {s} in state {:?}",
                    slot.kind
                );
                continue;
            }
            slot.pending = 0;
            self.discards -= 1;
            let dev = slot.dev;
            let result = match result {
                Err(libc::EOPNOTSUPP) => {
                    // Advisory, as for hole punching (see on_cqe's Trim).
                    if let Some(d) = self.dev.get_mut(dev as usize) {
                        d.dealloc = Deallocate::Ignored;
                        tracing::warn!(
                            device = dev,
                            "discard not supported; Deallocate becomes a no-op"
                        );
                    }
                    Ok(0)
                }
                Err(errno) => Err(errno),
                Ok(()) => Ok(0),
            };
            self.finish(s, result);
        }
        self.discard_done = done;
        if self.discards > 0 {
            self.rearm_now(Helper::Discard);
        }
    }

    /// Issues (or re-issues, after a short transfer) the remaining part of a Read/Write.
    fn issue_rw(&mut self, s: u32) -> Result<(), i32> {
        let slot = self.slots[s as usize];
        let buf = slot.buf.ok_or(libc::EINVAL)?;
        let addr = (slot.addr + slot.done as usize) as *mut u8;
        // At most u32::MAX: `len` came from a u32.
        let len = (slot.len - slot.done) as u32;
        let offset = slot.offset + slot.done;
        let fd = types::Fixed(slot.dev);
        let e = if slot.kind == SlotKind::Read {
            opcode::ReadFixed::new(fd, addr, len, buf.0)
                .offset(offset)
                .build()
        } else {
            let fua = slot.fua && !cfg!(feature = "test-noop-flush");
            let flags = if fua { libc::RWF_DSYNC } else { 0 };
            opcode::WriteFixed::new(fd, addr, len, buf.0)
                .offset(offset)
                .rw_flags(flags)
                .build()
        };
        if u64::from(len) <= self.dev[slot.dev as usize].poll_max {
            return self.push_polled(s, e);
        }
        self.push_one(s, e)
    }

    /// Pushes one read/write SQE for slot `s` to the polled ring (submitting first if its SQ
    /// is full).
    fn push_polled(&mut self, s: u32, e: io_uring::squeue::Entry) -> Result<(), i32> {
        let e = e.user_data(u64::from(s));
        let Some(p) = self.poll.as_mut() else {
            return Err(libc::EINVAL);
        };
        loop {
            // SAFETY: as in `push_one`: registered buffers and files of this ring only, and the
            // slot stays allocated until the CQE is processed.
            if unsafe { p.submission().push(&e) }.is_ok() {
                break;
            }
            self.stats.enters += 1;
            p.submit()
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        }
        self.poll_pending += 1;
        self.slots[s as usize].pending += 1;
        self.stats.sqes += 1;
        self.stats.polled_sqes += 1;
        Ok(())
    }

    /// Submits the polled ring's queued SQEs and polls the devices once for completions
    /// (io_uring_enter with GETEVENTS and no minimum: one pass, no waiting).
    fn poll_once(&mut self) -> io::Result<()> {
        let Some(p) = self.poll.as_mut() else {
            return Ok(());
        };
        let queued = p.submission().len() as u32;
        if queued == 0 && self.poll_pending == 0 {
            return Ok(());
        }
        self.stats.enters += 1;
        // SAFETY: no argument pointer (null with a sigset's size, as io-uring's wrappers do).
        let r = unsafe {
            p.submitter()
                .enter::<libc::sigset_t>(queued, 0, ENTER_GETEVENTS, None)
        };
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Issues (or continues) a Write Zeroes with the slot's current method.
    fn issue_zero(&mut self, s: u32) -> Result<(), i32> {
        let slot = self.slots[s as usize];
        let fd = types::Fixed(slot.dev);
        let SlotKind::Zero(method) = slot.kind else {
            return Err(libc::EINVAL);
        };
        let e = match method {
            ZeroMethod::ZeroRange | ZeroMethod::PunchHole => {
                let mode = if method == ZeroMethod::ZeroRange {
                    libc::FALLOC_FL_ZERO_RANGE
                } else {
                    libc::FALLOC_FL_PUNCH_HOLE
                };
                opcode::Fallocate::new(fd, slot.len)
                    .offset(slot.offset)
                    .mode(mode | libc::FALLOC_FL_KEEP_SIZE)
                    .build()
            }
            ZeroMethod::Write => {
                let chunk = (slot.len - slot.done).min(ZERO_BUF_LEN as u64) as u32;
                opcode::WriteFixed::new(fd, self.zero.ptr().as_ptr(), chunk, self.zero_index)
                    .offset(slot.offset + slot.done)
                    .build()
            }
        };
        self.push_one(s, e)
    }

    /// Pushes one SQE for slot `s`, submitting first if the SQ is full (never drops).
    fn push_one(&mut self, s: u32, e: io_uring::squeue::Entry) -> Result<(), i32> {
        self.push_entry(e.user_data(u64::from(s)))?;
        self.slots[s as usize].pending += 1;
        Ok(())
    }

    /// Pushes one SQE (its user_data set), submitting first if the SQ is full (never drops).
    fn push_entry(&mut self, e: io_uring::squeue::Entry) -> Result<(), i32> {
        loop {
            // SAFETY: the entry references only memory the ring owns for its whole life (the
            // registered pool buffers and the zero buffer), registered files and the discard
            // helper's eventfd (a field dropped after the ring); the slot that owns the op stays
            // allocated until this SQE's completion is processed.
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                break;
            }
            let r = if self.mode == RingMode::SqPoll {
                // The SQ thread empties the queue on its own: wake it if it sleeps, then
                // wait until it has consumed an entry.
                self.enter(0, None, false).and_then(|_| {
                    self.stats.enters += 1;
                    self.ring.submitter().squeue_wait().map(drop)
                })
            } else {
                self.enter(0, None, false).map(drop)
            };
            r.map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        }
        self.stats.sqes += 1;
        Ok(())
    }

    /// Marks slot `s` finished and queues it for `reap`.
    fn finish(&mut self, s: u32, result: Result<u32, i32>) {
        let slot = &mut self.slots[s as usize];
        slot.kind = SlotKind::Done;
        slot.result = result;
        let scratch = slot.compare.take().is_some();
        if let Some(id) = slot.caw_compare.take() {
            let _ = self.pool.clear_in_flight(id);
        }
        if let Some(id) = slot.buf.take() {
            // The op marked it; nothing else can have changed its state meanwhile.
            let _ = self.pool.clear_in_flight(id);
            if scratch {
                // A Compare's own read buffer.
                let _ = self.pool.free(id);
            }
        }
        self.stats.completed += 1;
        if result.is_err() {
            self.stats.errors += 1;
        }
        // Capacity is max_inflight and each slot is queued once: never reallocates.
        self.ready.push_back(s);
    }

    /// Handles one CQE.
    fn on_cqe(&mut self, user_data: u64, res: i32) {
        if user_data == DISCARD_WAKE {
            return self.on_discard_wake();
        }
        if user_data == RBD_WAKE {
            return self.on_rbd_wake();
        }
        let Some(slot) = usize::try_from(user_data)
            .ok()
            .and_then(|i| self.slots.get_mut(i))
        else {
            debug_assert!(false, "CQE for unknown slot {user_data}");
            return;
        };
        if slot.pending == 0 {
            debug_assert!(false, "unexpected CQE for slot {user_data}");
            return;
        }
        slot.pending -= 1;
        let s = user_data as u32;
        let slot = *slot;
        match slot.kind {
            SlotKind::Read | SlotKind::Write => {
                let is_read = slot.kind == SlotKind::Read;
                if res < 0 {
                    return self.finish(s, Err(-res));
                }
                if res == 0 {
                    if !is_read {
                        // A write that makes no progress would loop forever.
                        return self.finish(s, Err(libc::EIO));
                    }
                    // End of file inside the namespace (the file shrank underneath us):
                    // the remainder reads as zeroes.
                    let start = slot.addr + slot.done as usize;
                    let n = (slot.len - slot.done) as usize;
                    // SAFETY: [start, start + n) lies inside the op's buffer range, validated at
                    // submit (buf_offset + len <= buf_size); the kernel is done with it (this
                    // was the op's only SQE) and no Rust reference to the buffer exists while it
                    // is marked in flight.
                    unsafe { std::ptr::write_bytes(start as *mut u8, 0, n) };
                    return self.finish_rw(s, is_read);
                }
                let done = slot.done + res as u64;
                self.slots[s as usize].done = done;
                if done >= slot.len {
                    return self.finish_rw(s, is_read);
                }
                if let Err(errno) = self.issue_rw(s) {
                    self.finish(s, Err(errno));
                }
            }
            SlotKind::Flush => self.finish(s, if res < 0 { Err(-res) } else { Ok(0) }),
            SlotKind::Zero(method) => {
                if res == -libc::EOPNOTSUPP && method != ZeroMethod::Write {
                    let next = if method == ZeroMethod::ZeroRange {
                        ZeroMethod::PunchHole
                    } else {
                        ZeroMethod::Write
                    };
                    tracing::debug!(
                        device = slot.dev,
                        ?method,
                        ?next,
                        "write zeroes method unsupported; falling back"
                    );
                    if let Some(d) = self.dev.get_mut(slot.dev as usize) {
                        d.zero = next;
                    }
                    self.slots[s as usize].kind = SlotKind::Zero(next);
                    if let Err(errno) = self.issue_zero(s) {
                        self.finish(s, Err(errno));
                    }
                    return;
                }
                if res < 0 {
                    return self.finish(s, Err(-res));
                }
                if method != ZeroMethod::Write {
                    return self.finish(s, Ok(0));
                }
                if res == 0 {
                    return self.finish(s, Err(libc::EIO));
                }
                let done = slot.done + res as u64;
                self.slots[s as usize].done = done;
                if done >= slot.len {
                    return self.finish(s, Ok(0));
                }
                if let Err(errno) = self.issue_zero(s) {
                    self.finish(s, Err(errno));
                }
            }
            SlotKind::Trim => {
                if res == -libc::EOPNOTSUPP {
                    // Deallocation is advisory (NVMe DSM: the host "no longer needs the data";
                    // the controller may deallocate): not deallocating is a valid outcome, and
                    // the blocks keep reading their old data.
                    if let Some(d) = self.dev.get_mut(slot.dev as usize) {
                        if d.dealloc != Deallocate::Ignored {
                            d.dealloc = Deallocate::Ignored;
                            tracing::warn!(
                                device = slot.dev,
                                "PUNCH_HOLE not supported; Deallocate becomes a no-op"
                            );
                        }
                    }
                } else if res < 0 && slot.err == 0 {
                    self.slots[s as usize].err = -res;
                }
                let slot = self.slots[s as usize];
                if slot.pending == 0 {
                    self.finish(s, if slot.err == 0 { Ok(0) } else { Err(slot.err) });
                }
            }
            SlotKind::Idle | SlotKind::Done | SlotKind::Discard | SlotKind::Rbd(_) => {
                debug_assert!(false, "CQE for slot {s} in state {:?}", slot.kind);
            }
        }
    }

    fn finish_rw(&mut self, s: u32, is_read: bool) {
        let slot = self.slots[s as usize];
        if let (Some((id, boff)), Some(scratch)) = (slot.compare, slot.buf) {
            // A Compare's read is done: the range against the host's data.
            let len = slot.len as usize;
            let _ = self.pool.clear_in_flight(scratch);
            let read = self.pool.payload(scratch, len).ok();
            let host = self.pool.payload(id, boff as usize + len).ok();
            let same = match (read, host) {
                (Some(r), Some(h)) => r[..len] == h[boff as usize..],
                _ => false,
            };
            self.stats.bytes_read += slot.len;
            return self.finish(
                s,
                if same {
                    Ok(slot.len as u32)
                } else {
                    Err(libc::EILSEQ)
                },
            );
        }
        let len = self.slots[s as usize].len;
        if is_read {
            self.stats.bytes_read += len;
        } else {
            self.stats.bytes_written += len;
        }
        self.finish(s, Ok(len as u32));
    }

    /// Moves every available CQE into slot state (finished slots go to the ready queue).
    /// One CQE at a time, so that handling one (which may submit, and on EBUSY drain again)
    /// can re-enter safely.
    fn drain_cq(&mut self) {
        loop {
            let next = self.ring.completion().next();
            let Some(cqe) = next else { break };
            self.on_cqe(cqe.user_data(), cqe.result());
        }
        while let Some(cqe) = self.poll.as_mut().and_then(|p| p.completion().next()) {
            self.poll_pending = self.poll_pending.saturating_sub(1);
            self.on_cqe(cqe.user_data(), cqe.result());
        }
    }

    fn enable(&mut self) -> io::Result<()> {
        if !self.enabled {
            self.ring.submitter().register_enable_rings()?;
            self.enabled = true;
        }
        Ok(())
    }

    /// One io_uring_enter: submit queued SQEs, and wait for `want` completions (with an
    /// optional timeout) or, with `getevents`, just run deferred completion work. Retries
    /// EINTR when not waiting; on EBUSY/EAGAIN (CQ overflow backlog, transient allocation
    /// failure) drains the CQ and retries. `Ok(false)` if a wait timed out or was interrupted.
    fn enter(
        &mut self,
        want: usize,
        timeout: Option<Duration>,
        getevents: bool,
    ) -> io::Result<bool> {
        self.enable()?;
        loop {
            // With SQPOLL a plain submit enters the kernel only to wake a sleeping SQ thread
            // (or to flush overflowed completions).
            let syscall = self.mode != RingMode::SqPoll
                || want > 0
                || getevents
                || self.ring.submission().need_wakeup()
                || self.ring.submission().cq_overflow();
            if syscall {
                self.stats.enters += 1;
            }
            let sub = self.ring.submitter();
            let r = if want > 0 {
                match timeout {
                    Some(d) => {
                        let ts = types::Timespec::from(d);
                        sub.submit_with_args(want, &types::SubmitArgs::new().timespec(&ts))
                    }
                    None => sub.submit_and_wait(want),
                }
            } else if getevents {
                let to_submit = self.ring.submission().len() as u32;
                // SAFETY: no argument pointer is passed (null with the size of a sigset, as
                // io-uring's own wrappers do); the flag asks only to run completion work.
                unsafe {
                    self.ring.submitter().enter::<libc::sigset_t>(
                        to_submit,
                        0,
                        ENTER_GETEVENTS,
                        None,
                    )
                }
            } else {
                sub.submit()
            };
            match r {
                Ok(_) => return Ok(true),
                Err(e) => match e.raw_os_error() {
                    Some(libc::ETIME) => return Ok(false),
                    Some(libc::EINTR) => {
                        if want > 0 {
                            return Ok(false);
                        }
                    }
                    Some(libc::EBUSY) | Some(libc::EAGAIN) => {
                        self.drain_cq();
                        if want > 0 && !self.ready.is_empty() {
                            return Ok(true);
                        }
                    }
                    _ => return Err(e),
                },
            }
        }
    }

    fn kernel_has_work(&mut self) -> bool {
        let sq = self.ring.submission();
        sq.taskrun() || sq.cq_overflow()
    }

    /// Submits every queued SQE with one io_uring_enter (none if nothing is queued and the
    /// kernel has no deferred completion work). Returns the number of SQEs submitted.
    ///
    /// With DEFER_TASKRUN the same enter also asks for events (GETEVENTS, no minimum): the
    /// kernel then runs the completion work that is already queued, or that the submission
    /// itself queued (a block device that ends the bio inline: brd, null_blk), so a following
    /// [`Ring::reap`] finds those completions without a second system call.
    pub fn submit(&mut self) -> io::Result<usize> {
        let polled = match self.poll.as_mut() {
            Some(p) => p.submission().len(),
            None => 0,
        };
        if polled > 0 {
            self.poll_once()?;
        }
        let queued = self.ring.submission().len();
        if queued == 0 && !self.kernel_has_work() {
            return Ok(polled);
        }
        self.enter(0, None, self.mode == RingMode::DeferTaskrun)?;
        Ok(queued + polled)
    }

    /// Hands every finished operation to `f(user_data, result)` without blocking; `result` is
    /// `Ok(bytes)` or `Err(errno)`. Returns how many were handed out.
    pub fn reap(&mut self, mut f: impl FnMut(u64, Result<u32, i32>)) -> usize {
        self.reap_with_pool(|ud, r, _| f(ud, r))
    }

    /// As [`Ring::reap`], also lending the pool (e.g. to send read data or free the buffer).
    /// Buffers of reaped operations are no longer in flight.
    pub fn reap_with_pool(
        &mut self,
        mut f: impl FnMut(u64, Result<u32, i32>, &mut BufPool),
    ) -> usize {
        // Deferred completion work runs only inside an enter from this thread.
        let in_kernel = self.in_flight() - self.ready.len();
        let need_enter = if self.mode == RingMode::DeferTaskrun && !self.taskrun_flag {
            in_kernel > 0
        } else {
            self.kernel_has_work()
        };
        if need_enter {
            // An error here (e.g. called from the wrong thread) leaves the ops in flight;
            // the next submit/wait reports it.
            let _ = self.enter(0, None, true);
        }
        if self.poll_pending > 0 {
            // Polled completions appear only when someone polls: this is that poll.
            let _ = self.poll_once();
        }
        self.drain_cq();
        // A helper whose poll could not be armed: take its results here.
        if self.rbd_inflight > 0 && !self.rbd_armed {
            self.on_rbd_wake();
        }
        if self.discards > 0 && !self.discard_armed {
            self.on_discard_wake();
        }
        let mut n = 0;
        while let Some(s) = self.ready.pop_front() {
            let slot = &mut self.slots[s as usize];
            let (ud, res) = (slot.user_data, slot.result);
            *slot = IDLE_SLOT;
            // Capacity is max_inflight and each slot is pushed once: never reallocates.
            self.free_slots.push(s);
            f(ud, res, &mut self.pool);
            n += 1;
        }
        n
    }

    /// Submits queued SQEs and blocks until at least one operation has finished or `timeout`
    /// passes (`None`: no limit). Returns at once if something is ready to reap or nothing is
    /// in flight. `Ok(true)` if completions may be ready.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        if !self.ready.is_empty() || !self.ring.completion().is_empty() {
            self.submit()?;
            return Ok(true);
        }
        let in_kernel = self.in_flight() - self.ready.len();
        if in_kernel == 0 {
            self.submit()?;
            return Ok(false);
        }
        if self.poll_pending > 0 {
            // Polled operations complete only when polled: spin (the interrupt ring's
            // completions are drained on the way) until one finishes or the time is up.
            self.submit()?;
            let end = timeout.map(|t| std::time::Instant::now() + t);
            loop {
                self.poll_once()?;
                self.drain_cq();
                if !self.ready.is_empty() {
                    return Ok(true);
                }
                if self.poll_pending == 0 {
                    break;
                }
                if end.is_some_and(|e| std::time::Instant::now() >= e) {
                    return Ok(false);
                }
            }
            if self.in_flight() == self.ready.len() {
                return Ok(!self.ready.is_empty());
            }
        }
        self.enter(1, timeout, true)
    }
}

#[cfg(test)]
impl Ring {
    /// Test hook: start Write Zeroes on `device` at the last fallback (zero-buffer writes).
    pub(crate) fn force_zero_writes(&mut self, device: u32) {
        self.dev[device as usize].zero = ZeroMethod::Write;
    }
}

impl AsRawFd for Ring {
    /// The io_uring file descriptor.
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

/// `Err(EINVAL)` unless [offset, offset + len) is block-aligned and inside the device.
impl Drop for Ring {
    fn drop(&mut self) {
        // librbd reads into and sends from pool buffers until it reports each operation: the
        // pool may not go before it has. A cluster that never answers leaves the pool mapped.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut results = Vec::new();
        while self.rbd_inflight > 0 {
            let Some(d) = &self.rbd_done else { break };
            if std::time::Instant::now() > deadline {
                tracing::error!(
                    in_flight = self.rbd_inflight,
                    "librbd operations still in flight after 60 s; their buffers stay mapped"
                );
                self.pool.leak();
                break;
            }
            let mut pfd = libc::pollfd {
                fd: d.eventfd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut pfd, 1, 1000) };
            d.take(&mut results);
            self.rbd_inflight = self.rbd_inflight.saturating_sub(results.len() as u32);
            results.clear();
        }
    }
}

fn check_range(dev: &Dev, offset: u64, len: u64) -> Result<(), i32> {
    let end = offset.checked_add(len).ok_or(libc::EINVAL)?;
    if end > dev.size || offset % dev.block_size != 0 || len % dev.block_size != 0 {
        return Err(libc::EINVAL);
    }
    Ok(())
}
