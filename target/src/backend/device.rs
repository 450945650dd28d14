//! Namespaces' backing stores, opened once at start-up: regular files, block devices, or a
//! null device that stores nothing.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::sys;

/// Smallest and largest logical block sizes accepted.
pub const MIN_BLOCK_SIZE: u32 = 512;
pub const MAX_BLOCK_SIZE: u32 = 65536;

/// How to open one backing store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A regular file or a block device.
    File(FileSpec),
    /// Discards writes, reads zeroes; no syscalls.
    Null { size: u64, block_size: u32 },
    /// A Ceph RBD image, at its size (rounded down to the block size).
    Rbd(RbdSpec),
}

/// An RBD image backing store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    /// The cluster's configuration file and the client name (without `client.`).
    pub conf: PathBuf,
    pub user: String,
    pub pool: String,
    /// RADOS namespace ("" for none).
    pub namespace: String,
    pub image: String,
    pub block_size: u32,
    pub read_only: bool,
}

impl RbdSpec {
    /// `pool/image` or `pool/namespace/image`, as the `rbd` tool names it.
    pub fn spec(&self) -> String {
        if self.namespace.is_empty() {
            format!("{}/{}", self.pool, self.image)
        } else {
            format!("{}/{}/{}", self.pool, self.namespace, self.image)
        }
    }
}

/// A file or block device backing store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    pub path: PathBuf,
    /// Namespace size in bytes. Files: the size to create a missing file with (sparse); an
    /// existing file is used at its current length. Block devices: at most the device size
    /// (a prefix of it); `None` uses the whole device.
    pub size: Option<u64>,
    /// Logical block size. `None`: the device's logical block size for block devices; for
    /// files, the filesystem block size capped at 4096 (as Linux nvmet does).
    pub block_size: Option<u32>,
    pub read_only: bool,
    /// Never use O_DIRECT (also what happens automatically when the filesystem refuses it).
    pub buffered: bool,
}

impl FileSpec {
    /// A writable, direct-I/O spec for `path` with the given size and default block size.
    pub fn new(path: impl Into<PathBuf>, size: Option<u64>) -> FileSpec {
        FileSpec {
            path: path.into(),
            size,
            block_size: None,
            read_only: false,
            buffered: false,
        }
    }
}

/// What a [`Device`] is backed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    File,
    BlockDevice,
    Null,
    Rbd,
}

/// What Deallocate (Dataset Management, attribute AD) does on a backing store, decided when it
/// is opened. Deallocation is advisory in NVMe: every answer is valid, but Identify Namespace
/// reports which one applies (DLFEAT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deallocate {
    /// The blocks are freed and read back as zeroes: the null device, and regular files whose
    /// file system punches holes (FALLOC_FL_PUNCH_HOLE).
    Zeroes,
    /// The range is discarded on the block device (BLKDISCARD): the device may free it; what
    /// reads return afterwards is the device's business (DLFEAT "not reported").
    Discard,
    /// Nothing is done and the blocks keep their data: read-only stores, block devices without
    /// discard, files on file systems that cannot punch holes.
    Ignored,
}

/// Failure to open or validate a backing store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error("{}: cannot open: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("{}: cannot create or resize: {source}", path.display())]
    Resize { path: PathBuf, source: io::Error },
    #[error("{}: cannot query size or block size: {source}", path.display())]
    Query { path: PathBuf, source: io::Error },
    #[error("{}: does not exist and no size is configured to create it", path.display())]
    MissingNoSize { path: PathBuf },
    #[error("{}: is neither a regular file nor a block device", path.display())]
    NotFileOrBlockDevice { path: PathBuf },
    #[error("{}: block size {block_size} is not a power of two in {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}", path.display())]
    BadBlockSize { path: PathBuf, block_size: u32 },
    #[error("{}: block size {block_size} is smaller than the device's logical block size {device_block_size}", path.display())]
    BlockSizeBelowDevice {
        path: PathBuf,
        block_size: u32,
        device_block_size: u32,
    },
    #[error("{}: size {size} is zero or not a multiple of the block size {block_size}", path.display())]
    BadSize {
        path: PathBuf,
        size: u64,
        block_size: u32,
    },
    #[error("rbd image {image} (cluster {}, client.{user}): {source}", conf.display())]
    Rbd {
        image: String,
        conf: PathBuf,
        user: String,
        source: rbd::Error,
    },
    #[error("{}: configured size {size} exceeds the device size {device_size}", path.display())]
    TooLarge {
        path: PathBuf,
        size: u64,
        device_size: u64,
    },
}

/// One opened backing store. Immutable after opening; shared by all poller threads.
#[derive(Debug)]
pub struct Device {
    /// `None` for the null device.
    file: Option<File>,
    path: Option<PathBuf>,
    kind: DeviceKind,
    size: u64,
    block_size: u32,
    read_only: bool,
    direct: bool,
    dealloc: Deallocate,
    /// For an O_DIRECT block device whose queue polls for completions (sysfs `queue/io_poll`
    /// is 1: it has poll queues): the largest transfer the device takes as one request
    /// (see [`Device::poll_max_bytes`]). 0: cannot be polled.
    poll_max: u32,
    /// The image of an RBD namespace.
    rbd: Option<Arc<rbd::Image>>,
    /// Raised when the cluster refused an operation on the image because it blocklisted this
    /// client ([`EBLOCKLISTED`]: a peer gateway fenced this one); the daemon reopens it.
    fenced: Arc<Signal>,
    /// A completed write may still be lost until a flush (see [`Device::volatile_cache`]).
    cache: bool,
}

/// A flag raised from any thread, and whom to wake when it is (the daemon's thread: a
/// resized image, a fenced client).
#[derive(Default)]
pub struct Signal {
    raised: std::sync::atomic::AtomicBool,
    wake: std::sync::Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

impl std::fmt::Debug for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signal")
            .field("raised", &self.is_raised())
            .finish()
    }
}

impl Signal {
    /// Raises the flag and wakes whoever [`Signal::on_raise`] named.
    pub fn raise(&self) {
        self.raised.store(true, std::sync::atomic::Ordering::SeqCst);
        let wake = self
            .wake
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(w) = wake {
            w();
        }
    }

    pub fn is_raised(&self) -> bool {
        self.raised.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether it was raised since the last call (lowers it).
    pub fn take(&self) -> bool {
        self.raised.swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// `wake` is called (on the raising thread) at every raise.
    pub fn on_raise(&self, wake: Arc<dyn Fn() + Send + Sync>) {
        *self
            .wake
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(wake);
    }
}

/// The errno librbd gives a client the cluster blocklisted (Ceph's `EBLOCKLISTED`): another
/// gateway broke its lock on the image after it stalled past its lease, and every operation
/// on that connection fails from then on, so the namespace must be opened again on a new one.
pub const EBLOCKLISTED: i32 = libc::ESHUTDOWN;

impl Device {
    /// Opens (and if needed creates) the backing store described by `spec`.
    pub fn open(spec: &DeviceSpec) -> Result<Device, DeviceError> {
        match spec {
            DeviceSpec::Null { size, block_size } => {
                let path = Path::new("null");
                check_block_size(path, *block_size)?;
                check_size(path, *size, *block_size)?;
                Ok(Device {
                    file: None,
                    path: None,
                    kind: DeviceKind::Null,
                    size: *size,
                    block_size: *block_size,
                    read_only: false,
                    direct: false,
                    dealloc: Deallocate::Zeroes,
                    poll_max: 0,
                    rbd: None,
                    fenced: Arc::default(),
                    cache: false,
                })
            }
            DeviceSpec::File(f) => open_file(f),
            DeviceSpec::Rbd(r) => open_rbd(r),
        }
    }

    /// Namespace size in bytes (a multiple of the block size).
    pub fn size_bytes(&self) -> u64 {
        self.size
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// True if I/O bypasses the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// True for an O_DIRECT block device with poll queues (completions can be polled).
    pub fn is_pollable(&self) -> bool {
        self.poll_max > 0
    }

    /// Bytes of the largest read or write that may be polled: what the device takes as one
    /// request without splitting (`queue/max_sectors_kb`, `max_segment_size`, `max_segments`
    /// x 4 KiB). A polled bio may not be split (the block layer fails a split
    /// REQ_NOWAIT bio with EAGAIN: 128 KiB writes to a null_blk of 127 KiB requests never
    /// completed on Linux 6.1), so larger transfers take the interrupt ring. 0 if not pollable.
    pub fn poll_max_bytes(&self) -> u32 {
        self.poll_max
    }

    /// What Deallocate does here (see [`Deallocate`]).
    pub fn deallocate(&self) -> Deallocate {
        self.dealloc
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub fn kind(&self) -> DeviceKind {
        self.kind
    }

    /// Whether a completed write may still be lost (power failure, crash of the machine)
    /// until a flush: a file (page cache, file system metadata, the disk's cache), a block
    /// device through the page cache or whose queue says `write back` (sysfs
    /// `queue/write_cache`). Not: the null device, a block device opened O_DIRECT whose queue
    /// writes through, RBD (librbd's cache off, the OSDs journal every write before they
    /// answer). The controller reports a volatile write cache (VWC) when one of its
    /// subsystem's namespaces has one.
    pub fn volatile_cache(&self) -> bool {
        self.cache
    }

    /// The largest fused Compare and Write (bytes, within one aligned unit of that size) the
    /// store runs as one operation of its own (`core::NamespaceSpec::native_caw`): for RBD one
    /// 512-byte sector, the most librbd 16's compare-and-write takes (`rbd/tests/image.rs`
    /// checks it on the cluster); 0 for the others, whose pairs the core serializes itself.
    pub fn native_caw(&self) -> u32 {
        match self.kind {
            DeviceKind::Rbd => 512,
            _ => 0,
        }
    }

    /// The path opened; `None` for the null device.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The open file (`None` for the null device).
    pub(crate) fn file(&self) -> Option<&File> {
        self.file.as_ref()
    }

    /// The image of an RBD namespace.
    pub fn rbd(&self) -> Option<&Arc<rbd::Image>> {
        self.rbd.as_ref()
    }

    /// Raised when an RBD namespace's client is found blocklisted ([`EBLOCKLISTED`]).
    pub fn fenced(&self) -> &Arc<Signal> {
        &self.fenced
    }

    /// For an RBD namespace, whether the image's size (as librbd knows it now) differs from
    /// the size the namespace was opened with: the namespace is then opened again.
    pub fn rbd_resized(&self) -> bool {
        let Some(img) = &self.rbd else {
            return false;
        };
        match img.size() {
            Ok(now) => now - now % u64::from(self.block_size) != self.size,
            Err(_) => false,
        }
    }

    /// The open descriptor (`None` for the null device), for io_uring file registration.
    pub(crate) fn raw_fd(&self) -> Option<RawFd> {
        self.file.as_ref().map(|f| f.as_raw_fd())
    }
}

/// All namespaces' backing stores, indexed by the `device` number the core puts in an `IoOp`
/// (the position in the spec list).
#[derive(Debug, Default)]
pub struct Devices {
    devices: Vec<Device>,
}

impl Devices {
    /// Opens every spec in order; the first failure aborts (already opened ones are closed).
    pub fn open(specs: &[DeviceSpec]) -> Result<Devices, DeviceError> {
        let devices = specs.iter().map(Device::open).collect::<Result<_, _>>()?;
        Ok(Devices { devices })
    }

    /// Wraps already opened devices.
    pub fn from_devices(devices: Vec<Device>) -> Devices {
        Devices { devices }
    }

    pub fn get(&self, index: u32) -> Option<&Device> {
        self.devices.get(index as usize)
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Device> {
        self.devices.iter()
    }
}

fn check_block_size(path: &Path, block_size: u32) -> Result<(), DeviceError> {
    if !block_size.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
        return Err(DeviceError::BadBlockSize {
            path: path.to_owned(),
            block_size,
        });
    }
    Ok(())
}

fn check_size(path: &Path, size: u64, block_size: u32) -> Result<(), DeviceError> {
    if size == 0 || size % u64::from(block_size) != 0 {
        return Err(DeviceError::BadSize {
            path: path.to_owned(),
            size,
            block_size,
        });
    }
    Ok(())
}

fn open_with(spec: &FileSpec, direct: bool, create: bool, blkdev: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(!spec.read_only).create(create);
    // std always adds O_CLOEXEC.
    let mut flags = 0;
    if direct {
        flags |= libc::O_DIRECT;
    }
    if blkdev && !spec.read_only {
        // O_EXCL on a block device (without O_CREAT) fails with EBUSY if it is in use, e.g.
        // mounted: never export a device the host itself is writing.
        flags |= libc::O_EXCL;
    }
    o.custom_flags(flags);
    o.open(&spec.path)
}

fn open_file(spec: &FileSpec) -> Result<Device, DeviceError> {
    let path = spec.path.as_path();
    let err_open = |source| DeviceError::Open {
        path: path.to_owned(),
        source,
    };
    if let Some(bs) = spec.block_size {
        check_block_size(path, bs)?;
    }
    let (exists, blkdev) = match std::fs::metadata(path) {
        Ok(m) => (true, m.file_type().is_block_device()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => (false, false),
        Err(e) => return Err(err_open(e)),
    };
    if !exists && spec.size.is_none() {
        return Err(DeviceError::MissingNoSize {
            path: path.to_owned(),
        });
    }
    let create = !exists && !spec.read_only;
    let mut direct = !spec.buffered;
    let file = match open_with(spec, direct, create, blkdev) {
        // O_DIRECT is refused at open by filesystems without direct I/O (tmpfs before 6.6).
        Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
            direct = false;
            tracing::warn!(path = %path.display(), "O_DIRECT refused by the filesystem; using buffered I/O (flush = fdatasync)");
            open_with(spec, false, create, blkdev).map_err(err_open)?
        }
        r => r.map_err(err_open)?,
    };
    let meta = file.metadata().map_err(err_open)?;
    let ft = meta.file_type();
    let query_err = |source| DeviceError::Query {
        path: path.to_owned(),
        source,
    };

    if ft.is_block_device() {
        let dev_size = sys::blkdev_size(file.as_fd()).map_err(query_err)?;
        let dev_bs = sys::blkdev_logical_block_size(file.as_fd()).map_err(query_err)?;
        let block_size = spec.block_size.unwrap_or(dev_bs);
        check_block_size(path, block_size)?;
        if block_size < dev_bs {
            return Err(DeviceError::BlockSizeBelowDevice {
                path: path.to_owned(),
                block_size,
                device_block_size: dev_bs,
            });
        }
        let size = match spec.size {
            Some(s) if s > dev_size => {
                return Err(DeviceError::TooLarge {
                    path: path.to_owned(),
                    size: s,
                    device_size: dev_size,
                })
            }
            Some(s) => s,
            None => dev_size - dev_size % u64::from(block_size),
        };
        check_size(path, size, block_size)?;
        let poll_max = if direct {
            block_queue_poll_max(&meta)
        } else {
            0
        };
        let dealloc = if !spec.read_only && block_queue_discards(&meta) {
            Deallocate::Discard
        } else {
            Deallocate::Ignored
        };
        // Through the page cache, or a device whose queue caches writes: a flush is needed.
        let cache =
            !direct || block_queue_attr(&meta, "write_cache").as_deref() != Some("write through");
        return Ok(Device {
            file: Some(file),
            path: Some(path.to_owned()),
            kind: DeviceKind::BlockDevice,
            size,
            block_size,
            read_only: spec.read_only,
            direct,
            dealloc,
            poll_max,
            rbd: None,
            fenced: Arc::default(),
            cache,
        });
    }
    if !ft.is_file() {
        return Err(DeviceError::NotFileOrBlockDevice {
            path: path.to_owned(),
        });
    }

    // Linux nvmet (io-cmd-file.c) uses the inode's block size, capped at 4096.
    let fs_bs = u32::try_from(std::os::unix::fs::MetadataExt::blksize(&meta))
        .unwrap_or(4096)
        .clamp(MIN_BLOCK_SIZE, 4096);
    let block_size = spec.block_size.unwrap_or(fs_bs);
    check_block_size(path, block_size)?;
    let file_len = meta.len();
    let size = if create {
        // Just created (empty): size it. Sparse: no blocks are allocated and unwritten ranges
        // read as zeroes.
        let s = spec.size.unwrap_or(0);
        check_size(path, s, block_size)?;
        file.set_len(s).map_err(|source| DeviceError::Resize {
            path: path.to_owned(),
            source,
        })?;
        s
    } else {
        // An existing file is used at its current length (the configuration's rule).
        if let Some(s) = spec.size.filter(|&s| s != file_len) {
            tracing::info!(path = %path.display(), configured = s, actual = file_len,
                "existing backing file used at its current length");
        }
        file_len
    };
    check_size(path, size, block_size)?;

    let file = if direct {
        match sys::dio_alignment(file.as_fd()) {
            Some((mem, off))
                if off == 0 || block_size % off != 0 || mem as usize > super::pool::BUF_ALIGN =>
            {
                tracing::warn!(path = %path.display(), mem_align = mem, offset_align = off, block_size,
                    "direct I/O alignment incompatible with the block size; using buffered I/O (flush = fdatasync)");
                direct = false;
                drop(file);
                open_with(spec, false, false, false).map_err(err_open)?
            }
            _ => file,
        }
    } else {
        file
    };

    // Punching a hole past the end of the file (KEEP_SIZE) touches no data and tells whether the
    // file system can deallocate at all.
    let dealloc =
        if !spec.read_only && sys::punch_hole(file.as_fd(), size, u64::from(block_size)).is_ok() {
            Deallocate::Zeroes
        } else {
            Deallocate::Ignored
        };

    Ok(Device {
        file: Some(file),
        path: Some(path.to_owned()),
        kind: DeviceKind::File,
        size,
        block_size,
        read_only: spec.read_only,
        direct,
        dealloc,
        // Files are not polled: whether their file system's direct I/O path polls depends on
        // the file system and the disk under it.
        poll_max: 0,
        rbd: None,
        fenced: Arc::default(),
        // The page cache, the file system's metadata and the device's cache: fdatasync.
        cache: true,
    })
}

/// What every RBD namespace's cluster handle is set to: no client-side write-back cache (a
/// write is on the OSDs when it completes, so Flush and FUA have nothing left to do, and a
/// gateway that dies loses nothing a host was told is written), zero-copy writes from the
/// pool's buffers (they stay untouched until the write completes), partial discards that
/// zero what they cannot free (Deallocate reads back zeroes), and a bounded wait for the
/// monitors at start-up.
const RBD_SETTINGS: &[(&str, &str)] = &[
    ("rbd_cache", "false"),
    ("rbd_disable_zero_copy_writes", "false"),
    ("rbd_skip_partial_discard", "false"),
    ("client_mount_timeout", "15"),
];

type ClusterMap = std::collections::HashMap<(PathBuf, String), std::sync::Weak<rbd::Cluster>>;

/// The connected clusters, one per (configuration file, user), shared by its namespaces while
/// any is open.
static CLUSTERS: std::sync::Mutex<Option<ClusterMap>> = std::sync::Mutex::new(None);

fn rbd_cluster(conf: &Path, user: &str) -> Result<Arc<rbd::Cluster>, rbd::Error> {
    use std::sync::{PoisonError, Weak};
    let mut map = CLUSTERS.lock().unwrap_or_else(PoisonError::into_inner);
    let map = map.get_or_insert_with(ClusterMap::new);
    let key = (conf.to_owned(), user.to_owned());
    if let Some(c) = map.get(&key).and_then(Weak::upgrade) {
        return Ok(c);
    }
    let c = rbd::Cluster::connect(conf, user, RBD_SETTINGS)?;
    map.retain(|_, w| w.strong_count() > 0);
    map.insert(key, Arc::downgrade(&c));
    Ok(c)
}

/// Forgets `cluster` (its client was blocklisted): namespaces opened from now on connect anew;
/// those open on it keep it until they are closed.
pub fn rbd_forget_cluster(cluster: &Arc<rbd::Cluster>) {
    let mut map = CLUSTERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(m) = map.as_mut() {
        m.retain(|_, w| !std::ptr::eq(w.as_ptr(), Arc::as_ptr(cluster)));
    }
}

/// The cluster names (`client.<id>`) and addresses of the connections RBD namespaces use now:
/// what the other gateways of a group must not fence when they take an image's lock from this
/// one (lock owner lists name a holder by its address).
pub fn rbd_client_names() -> Vec<String> {
    let map = CLUSTERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    map.iter()
        .flat_map(|m| m.values())
        .filter_map(std::sync::Weak::upgrade)
        .flat_map(|c| [Some(c.client_name()), c.addrs().ok()])
        .flatten()
        .collect()
}

fn open_rbd(spec: &RbdSpec) -> Result<Device, DeviceError> {
    let path = PathBuf::from(format!("rbd:{}", spec.spec()));
    check_block_size(&path, spec.block_size)?;
    let err = |source| DeviceError::Rbd {
        image: spec.spec(),
        conf: spec.conf.clone(),
        user: spec.user.clone(),
        source,
    };
    let cluster = rbd_cluster(&spec.conf, &spec.user).map_err(err)?;
    let io = rbd::IoCtx::open(&cluster, &spec.pool, &spec.namespace).map_err(err)?;
    let image = rbd::Image::open(&io, &spec.image).map_err(err)?;
    let image_size = image.size().map_err(err)?;
    let size = image_size - image_size % u64::from(spec.block_size);
    check_size(&path, size, spec.block_size)?;
    Ok(Device {
        file: None,
        path: Some(path),
        kind: DeviceKind::Rbd,
        size,
        block_size: spec.block_size,
        read_only: spec.read_only,
        direct: true,
        dealloc: if spec.read_only {
            Deallocate::Ignored
        } else {
            Deallocate::Zeroes
        },
        poll_max: 0,
        rbd: Some(Arc::new(image)),
        fenced: Arc::default(),
        // librbd without its client cache (`rbd_cache=false`): a write is on the OSDs, which
        // journal it, when librbd completes it.
        cache: false,
    })
}

/// The sysfs queue directory's attribute `attr` of the block device `meta` describes (a
/// partition looks at its disk's queue), trimmed.
fn block_queue_attr(meta: &std::fs::Metadata, attr: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let rdev = meta.rdev();
    let base = format!("/sys/dev/block/{}:{}", libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string(format!("{base}/queue/{attr}"))
        .or_else(|_| std::fs::read_to_string(format!("{base}/../queue/{attr}")))
        .ok()
        .map(|v| v.trim().to_owned())
}

/// True if the block device takes discards (sysfs `queue/discard_max_bytes` is not 0).
fn block_queue_discards(meta: &std::fs::Metadata) -> bool {
    block_queue_attr(meta, "discard_max_bytes")
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

/// For a block device that polls for completions (sysfs `/sys/dev/block/MAJ:MIN/queue/io_poll`
/// reads 1: it has poll queues, e.g. nvme with `poll_queues`, null_blk with `poll_queues`), the
/// largest transfer it takes without splitting, in bytes; 0 otherwise. Partitions look at
/// their disk's queue.
fn block_queue_poll_max(meta: &std::fs::Metadata) -> u32 {
    let queue = |attr: &str| block_queue_attr(meta, attr);
    if queue("io_poll").as_deref() != Some("1") {
        return 0;
    }
    let num = |attr: &str| queue(attr).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
    // A transfer that fits all three limits is never split, however its buffer's pages fall
    // into segments (one per 4 KiB page, or one for a contiguous huge page).
    num("max_sectors_kb")
        .saturating_mul(1024)
        .min(num("max_segment_size"))
        .min(num("max_segments").saturating_mul(4096))
}
