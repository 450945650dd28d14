//! A fio I/O engine on the nvmf-initiator library: `libnvmf_fio.so`, loaded with
//! `fio --ioengine=external:/path/to/libnvmf_fio.so`.
//!
//! ```text
//! fio --name=j --ioengine=external:build/release/libnvmf_fio.so --thread=1 \
//!     --filename='trtype=tcp traddr=127.0.0.1 trsvcid=4420 subnqn=nqn.2026-11.io.nvmf-rs\:default ns=1' \
//!     --rw=randread --bs=4k --iodepth=32 --time_based --runtime=10
//! ```
//!
//! The filename names a namespace the way SPDK's fio plugin does ([`spec`]). Each fio job
//! connects its own controller per file, with one I/O queue whose depth is the job's
//! `iodepth` (`numjobs` jobs are that many queues); fio's queue/commit/getevents map onto the
//! queue's submit, send and reap, so `iodepth_batch*` batch the way they do with io_uring.
//! The io_u buffers are the queue's own (registered memory over NVMe/RDMA: the target reads
//! and writes them in place, no copy; a job with several files over RDMA uses plain memory,
//! carried through the queues' pools with one copy). Reads, writes, trims (Dataset
//! Management, deallocate) and fio's syncs (Flush) are carried; fio's `verify` works on what
//! comes back. Engine options: `hostnqn`, `dhchap_secret`, `dhchap_ctrl_secret`, `tls_psk`,
//! `hdgst`, `ddgst`, `hipri` (spin without bound), `polling` (`adaptive`, `busy`,
//! `interrupt`: [`initiator::Polling`]), `io_timeout_ms`, `queue_stats` (print each
//! queue's commands, system calls and copies per payload byte at the end of its job).
//!
//! The C half (`src/engine.c`) holds fio's `ioengine_ops` and option table, compiled against
//! fio's headers (build.rs); this half is reached through the `nvmf_fio_*` functions with
//! plain values, and never reads a fio structure.

pub mod spec;

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::time::{Duration, Instant};

use initiator::{
    AnyBuf, AnyQueue, CmdError, Completion, ConnectOptions, Controller, DhchapOptions, Error,
    NsInfo, TlsOptions, Transport,
};
use nvme::opcode::io;
use nvme::Sqe;

pub use spec::Spec;

/// fio's engine options as `engine.c` lays them out (`struct nvmf_fio_options`).
#[repr(C)]
#[derive(Debug)]
pub struct RawOptions {
    pad: *mut c_void,
    hostnqn: *const c_char,
    dhchap_secret: *const c_char,
    dhchap_ctrl_secret: *const c_char,
    tls_psk: *const c_char,
    hdgst: c_uint,
    ddgst: c_uint,
    hipri: c_uint,
    io_timeout_ms: c_uint,
    stats: c_uint,
    polling: *const c_char,
}

/// The engine options, read.
#[derive(Debug, Default, Clone)]
pub struct Options {
    pub hostnqn: Option<String>,
    pub dhchap_secret: Option<String>,
    pub dhchap_ctrl_secret: Option<String>,
    pub tls_psk: Option<String>,
    pub hdgst: bool,
    pub ddgst: bool,
    pub hipri: bool,
    pub io_timeout: Option<Duration>,
    /// Print each job's queue statistics at its end.
    pub stats: bool,
    /// `polling=`: adaptive, busy or interrupt.
    pub polling: Option<String>,
}

impl Options {
    /// # Safety
    /// `o` is null or points to the options fio filled in, whose strings are null or
    /// NUL-terminated.
    unsafe fn read(o: *const RawOptions) -> Options {
        // SAFETY: the caller's promise.
        let Some(o) = (unsafe { o.as_ref() }) else {
            return Options::default();
        };
        // SAFETY: fio's strings are null or NUL-terminated (the caller's promise).
        let s = |p: *const c_char| unsafe { cstr(p) }.filter(|s| !s.is_empty());
        Options {
            hostnqn: s(o.hostnqn),
            dhchap_secret: s(o.dhchap_secret),
            dhchap_ctrl_secret: s(o.dhchap_ctrl_secret),
            tls_psk: s(o.tls_psk),
            hdgst: o.hdgst != 0,
            ddgst: o.ddgst != 0,
            hipri: o.hipri != 0,
            io_timeout: (o.io_timeout_ms > 0)
                .then(|| Duration::from_millis(o.io_timeout_ms.into())),
            stats: o.stats != 0,
            polling: s(o.polling),
        }
    }
}

/// # Safety
/// `p` is null or NUL-terminated.
unsafe fn cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// How the engine connects to `spec` with `opts`, `depth` commands in flight on one I/O queue
/// (`0`: the admin queue only).
pub fn connect_options(spec: &Spec, opts: &Options, depth: u16) -> Result<ConnectOptions, String> {
    let mut o = match spec.transport {
        Transport::Tcp => ConnectOptions::tcp(&spec.traddr, spec.trsvcid, &spec.subnqn),
        Transport::Rdma => ConnectOptions::rdma(&spec.traddr, spec.trsvcid, &spec.subnqn),
    };
    if let Some(h) = spec.hostnqn.as_ref().or(opts.hostnqn.as_ref()) {
        o.hostnqn = h.clone();
    }
    let bad = |what: &str, e: Error| match e {
        Error::InvalidArgument(m) => format!("{what}: {m}"),
        e => format!("{what}: {e}"),
    };
    o.dhchap = match (&opts.dhchap_secret, &opts.dhchap_ctrl_secret) {
        (None, None) => None,
        (None, Some(_)) => return Err("dhchap_ctrl_secret needs dhchap_secret".into()),
        (Some(h), c) => {
            Some(DhchapOptions::new(h, c.as_deref()).map_err(|e| bad("dhchap_secret", e))?)
        }
    };
    if let Some(p) = &opts.tls_psk {
        if spec.transport != Transport::Tcp {
            return Err("tls_psk: TLS is NVMe/TCP's (trtype=tcp)".into());
        }
        o.tls = Some(TlsOptions::new(p).map_err(|e| bad("tls_psk", e))?);
    }
    o.hdr_digest = opts.hdgst;
    o.data_digest = opts.ddgst;
    if let Some(p) = &opts.polling {
        o.polling = p.parse()?;
    }
    if opts.hipri {
        o.polling = initiator::Polling::Busy;
    }
    if let Some(t) = opts.io_timeout {
        o.timeout = t;
    }
    o.queues = u16::from(depth > 0);
    o.queue_depth = depth.max(1);
    Ok(o)
}

/// What a command is, for its completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Trim,
    Flush,
}

impl Op {
    fn from_c(op: c_int) -> Option<Op> {
        Some(match op {
            0 => Op::Read,
            1 => Op::Write,
            2 => Op::Trim,
            3 => Op::Flush,
            _ => return None,
        })
    }
}

/// One file of a job: its controller and I/O queue.
struct FileQ {
    spec: Spec,
    // The queue goes before its controller (fields drop in order).
    q: AnyQueue,
    ns: NsInfo,
    /// Commands submitted since the queue last sent.
    unsent: usize,
    _ctrl: Controller,
}

/// One fio job (thread_data): its files' queues, the io_u buffers, completions not yet handed
/// to fio.
pub struct Job {
    name: String,
    files: Vec<Option<FileQ>>,
    /// By io_u index: the buffer while the io_u is not in flight (its memory is what fio sees
    /// as `io_u->buf` for the whole job).
    bufs: Vec<Option<AnyBuf>>,
    /// By io_u index: the bytes its buffer holds (a vector's length never goes past them).
    caps: Vec<usize>,
    /// By io_u index: a Dataset Management range buffer (made at the io_u's first trim).
    ranges: Vec<Option<AnyBuf>>,
    /// By io_u index: the io_u (fio's pointer, handed back by `event`) and its command.
    inflight: Vec<(usize, Op)>,
    /// Completed: (io_u, errno), in completion order.
    ready: VecDeque<(usize, c_int)>,
    /// What the last `getevents` handed out, for `event`.
    events: Vec<(usize, c_int)>,
    scratch: Vec<Completion<AnyBuf>>,
    /// Errors printed so far (the first few are, with their NVMe status).
    errors_shown: u32,
    /// Print the queues' statistics when the job ends.
    stats: bool,
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.stats {
            return;
        }
        for f in self.files.iter().flatten() {
            let s = f.q.stats();
            let per = |n: u64| n as f64 / s.completed.max(1) as f64;
            let line = format!(
                "{}: {} commands, {:.2} system calls per command, {:.2} copies per payload byte \
                 (socket {:.2}, memcpy {:.2})",
                f.spec,
                s.completed,
                per(s.syscalls),
                s.copies_per_byte(),
                s.socket_payload_bytes as f64 / s.payload_bytes.max(1) as f64,
                s.memcpy_bytes as f64 / s.payload_bytes.max(1) as f64,
            );
            eprintln!("nvmf: job {}: {line}", self.name);
        }
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

const EINVAL: c_int = libc::EINVAL;
const EIO: c_int = libc::EIO;
const ERRORS_SHOWN: u32 = 8;

impl Job {
    fn new(name: String, depth: usize, files: usize, stats: bool) -> Job {
        Job {
            name,
            files: (0..files).map(|_| None).collect(),
            bufs: (0..depth).map(|_| None).collect(),
            caps: vec![0; depth],
            ranges: (0..depth).map(|_| None).collect(),
            inflight: vec![(0, Op::Read); depth],
            ready: VecDeque::with_capacity(depth),
            events: Vec::with_capacity(depth),
            scratch: Vec::with_capacity(depth),
            errors_shown: 0,
            stats,
        }
    }

    fn say(&mut self, what: std::fmt::Arguments<'_>) {
        eprintln!("nvmf: job {}: {what}", self.name);
    }

    fn connect(&mut self, fileno: usize, filename: &str, opts: &Options) -> Result<(), String> {
        let spec = spec::parse(filename).map_err(|e| format!("filename '{filename}': {e}"))?;
        let depth = u16::try_from(self.bufs.len()).unwrap_or(u16::MAX);
        let o = connect_options(&spec, opts, depth)?;
        let mut ctrl = Controller::connect(o).map_err(|e| format!("connect to {spec}: {e}"))?;
        let ns = namespace(&ctrl, &spec)?;
        let q = ctrl
            .take_queue()
            .ok_or_else(|| format!("{spec}: the controller gave no I/O queue"))?;
        let slot = self
            .files
            .get_mut(fileno)
            .ok_or_else(|| format!("file {fileno} of {}", self.bufs.len()))?;
        *slot = Some(FileQ {
            spec,
            q,
            ns,
            unsent: 0,
            _ctrl: ctrl,
        });
        Ok(())
    }

    /// The buffer of io_u `index`, `len` bytes: the queue's own when the job has one file (so
    /// registered memory over NVMe/RDMA), plain memory otherwise.
    fn buffer(&mut self, index: usize, len: usize) -> Result<*mut u8, String> {
        if index >= self.bufs.len() {
            return Err(format!("io_u {index} of {}", self.bufs.len()));
        }
        let buf = match &self.files[..] {
            [Some(f)] => {
                f.q.alloc_buf(len)
                    .map_err(|e| format!("a {len}-byte buffer from {}: {e}", f.spec))?
            }
            _ => AnyBuf::Vec(vec![0u8; len]),
        };
        let p = self.bufs[index].insert(buf).as_mut_ptr();
        self.caps[index] = len;
        Ok(p)
    }

    /// Queue io_u `index` (fio's `io_u`): `Ok(true)` queued, `Ok(false)` no room (fio
    /// commits and reaps, then asks again), `Err(errno)` refused.
    #[allow(clippy::too_many_arguments)]
    fn queue(
        &mut self,
        io_u: usize,
        index: usize,
        fileno: usize,
        op: Op,
        offset: u64,
        xfer: *const u8,
        len: u64,
    ) -> Result<bool, c_int> {
        let Some(Some(f)) = self.files.get_mut(fileno) else {
            return Err(EINVAL);
        };
        if index >= self.bufs.len() {
            return Err(EINVAL);
        }
        let bs = u64::from(f.ns.block_size);
        let blocks = |n: u64| n % bs == 0;
        if op != Op::Flush && (!blocks(offset) || !blocks(len) || len == 0) {
            let (spec, nbs) = (f.spec.to_string(), f.ns.block_size);
            self.say(format_args!(
                "{spec}: {op:?} of {len} bytes at {offset}: not whole {nbs}-byte blocks"
            ));
            return Err(EINVAL);
        }
        let slba = offset / bs;
        let user = index as u64;
        let submitted = match op {
            Op::Read | Op::Write => {
                let Some(mut b) = self.bufs[index].take() else {
                    return Err(EINVAL);
                };
                let cap = self.caps[index];
                if b.as_ptr() != xfer || b.set_len(cap, len as usize).is_err() {
                    self.bufs[index] = Some(b);
                    let spec = f.spec.to_string();
                    self.say(format_args!(
                        "{spec}: io_u {index}: a transfer of {len} bytes outside the engine's \
                         buffer"
                    ));
                    return Err(EINVAL);
                }
                let r = if op == Op::Read {
                    f.q.submit_read(&f.ns, slba, b, user)
                } else {
                    f.q.submit_write(&f.ns, slba, b, user)
                };
                let bufs = &mut self.bufs;
                r.map_err(|e| {
                    bufs[index] = e.buf;
                    e.error
                })
            }
            Op::Trim => {
                let range = match self.ranges[index].take() {
                    Some(r) => r,
                    None => f.q.alloc_buf(16).map_err(|_| EIO)?,
                };
                let mut range = range;
                let nlb = match u32::try_from(len / bs) {
                    Ok(n) => n,
                    Err(_) => {
                        self.ranges[index] = Some(range);
                        return Err(EINVAL);
                    }
                };
                range[..16].fill(0);
                range[4..8].copy_from_slice(&nlb.to_le_bytes());
                range[8..16].copy_from_slice(&slba.to_le_bytes());
                let mut sqe = Sqe::new(io::DSM, 0);
                sqe.nsid = f.ns.nsid.into();
                // One range (NR is 0's based); CDW11 bit 2: Attribute - Deallocate.
                sqe.cdw10 = 0.into();
                sqe.cdw11 = 4.into();
                let ranges = &mut self.ranges;
                f.q.submit(sqe, initiator::Data::ToController(range), user)
                    .map_err(|e| {
                        ranges[index] = e.buf;
                        e.error
                    })
            }
            Op::Flush => f.q.submit_flush(f.ns.nsid, user).map_err(|e| e.error),
        };
        match submitted {
            Ok(_) => {
                f.unsent += 1;
                self.inflight[index] = (io_u, op);
                Ok(true)
            }
            Err(Error::QueueFull) => Ok(false),
            Err(e) => {
                self.report(&e.to_string());
                Err(EIO)
            }
        }
    }

    fn report(&mut self, what: &str) {
        if self.errors_shown < ERRORS_SHOWN {
            self.errors_shown += 1;
            self.say(format_args!("{what}"));
        }
    }

    /// Moves the completions in `scratch` to `ready`, buffers back to their io_us.
    fn take_completions(&mut self) {
        let mut done = std::mem::take(&mut self.scratch);
        for c in done.drain(..) {
            let index = c.user_data as usize;
            let (io_u, op) = self.inflight[index];
            match (op, c.buf) {
                (Op::Read | Op::Write, buf) => self.bufs[index] = buf,
                (Op::Trim, buf) => self.ranges[index] = buf,
                (Op::Flush, _) => {}
            }
            let errno = match c.result {
                Ok(_) => 0,
                Err(e) => {
                    self.report(&format!("{op:?} failed: {e}"));
                    match e {
                        CmdError::Timeout => libc::ETIMEDOUT,
                        _ => EIO,
                    }
                }
            };
            self.ready.push_back((io_u, errno));
        }
        self.scratch = done;
    }

    /// Sends what is queued on a queue that had nothing else in flight (the command goes out
    /// at once, as from an idle disk). On a busy queue fio reaps before it waits on anything
    /// (a full queue, a rate or think time, the end of the job), and that reap sends what
    /// commits queued since: one `writev` per burst instead of one per command, what
    /// `iodepth_batch_submit` would do, as nvmf-bench's loop does.
    fn commit(&mut self) -> Result<(), c_int> {
        let mut failed = None;
        for f in self.files.iter_mut().flatten() {
            if f.unsent == 0 || f.q.in_flight() > f.unsent {
                continue;
            }
            f.unsent = 0;
            if let Err(e) = f.q.send() {
                failed = Some(format!("{}: {e}", f.spec));
            }
        }
        // A failed queue's commands complete with errors in getevents.
        if let Some(e) = failed {
            self.report(&e);
        }
        Ok(())
    }

    /// Waits for at least `min` completions (or `timeout`), hands out at most `max`.
    fn getevents(
        &mut self,
        min: usize,
        max: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, c_int> {
        let until = timeout.map(|t| Instant::now() + t);
        self.events.clear();
        // A call that needs no wait sends what commits left queued and takes what is there
        // already; one that waits goes straight to the reaps below, whose first pass does
        // the same (a read less per call at QD1). A call that completions already taken
        // satisfy (fio's default `iodepth_batch_complete_max` is 1: one event per call) reads
        // nothing, and sends only a batch (a quarter of the queue) once fewer than half the
        // queue's commands are left on the wire: the target stays fed, and a burst of
        // completions costs one read and a few sends instead of one each per event.
        if self.ready.len() >= min {
            let satisfied = self.ready.len() >= max.max(1);
            let mut failed = None;
            for f in self.files.iter_mut().flatten() {
                if f.q.in_flight() == 0 {
                    continue;
                }
                let r = if !satisfied {
                    f.unsent = 0;
                    f.q.poll(&mut self.scratch).map(|_| ())
                } else if f.unsent * 4 >= f.q.depth().max(4)
                    && (f.q.in_flight() - f.unsent) * 2 < f.q.depth()
                {
                    f.unsent = 0;
                    f.q.send()
                } else {
                    Ok(())
                };
                if let Err(e) = r {
                    failed = Some(format!("{}: {e}", f.spec));
                }
            }
            self.take_completions();
            if let Some(e) = failed {
                if self.ready.is_empty() {
                    self.report(&e);
                    return Err(EIO);
                }
            }
        }
        let live = self
            .files
            .iter()
            .flatten()
            .filter(|f| f.q.in_flight() > 0)
            .count();
        while self.ready.len() < min {
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            let want = min - self.ready.len();
            let mut progress = false;
            let mut failed = None;
            for f in self.files.iter_mut().flatten() {
                if f.q.in_flight() == 0 {
                    continue;
                }
                f.unsent = 0;
                // One queue in flight: wait on it; several: take turns in short waits.
                let wait = if live <= 1 {
                    left
                } else {
                    Some(left.map_or(SHARED_WAIT, |l| l.min(SHARED_WAIT)))
                };
                match f.q.reap(&mut self.scratch, want.min(f.q.in_flight()), wait) {
                    Ok(n) => progress |= n > 0,
                    Err(e) => failed = Some(format!("{}: {e}", f.spec)),
                }
            }
            self.take_completions();
            if let Some(e) = failed {
                if self.ready.is_empty() {
                    self.report(&e);
                    return Err(EIO);
                }
                break;
            }
            if left == Some(Duration::ZERO)
                || !progress && self.files.iter().flatten().all(|f| f.q.in_flight() == 0)
            {
                break;
            }
        }
        let n = self.ready.len().min(max);
        self.events.extend(self.ready.drain(..n));
        Ok(n)
    }
}

/// How long a wait on one queue lasts while a job has commands in flight on several.
const SHARED_WAIT: Duration = Duration::from_micros(20);

fn namespace(ctrl: &Controller, spec: &Spec) -> Result<NsInfo, String> {
    ctrl.namespace(spec.nsid).map_err(|e| match e {
        Error::InvalidArgument(m) => format!("{spec}: {m}"),
        e => format!("{spec}: {e}"),
    })
}

/// The size in bytes of the namespace `filename` names (an admin-only connection).
pub fn probe(filename: &str, opts: &Options) -> Result<u64, String> {
    let spec = spec::parse(filename).map_err(|e| format!("filename '{filename}': {e}"))?;
    let o = connect_options(&spec, opts, 0)?;
    let ctrl = Controller::connect(o).map_err(|e| format!("connect to {spec}: {e}"))?;
    let ns = namespace(&ctrl, &spec)?;
    if let Err(e) = ctrl.shutdown() {
        eprintln!("nvmf: {spec}: shutting down the probe's controller: {e}");
    }
    Ok(ns.size())
}

// ---- The C half's entry points (engine.c). Errors are printed here, fio sees an errno. ----

/// # Safety
/// `filename` is NUL-terminated, `o` null or fio's engine options, `size` writable.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_probe(
    filename: *const c_char,
    o: *const RawOptions,
    size: *mut u64,
) -> c_int {
    // SAFETY: the caller's promises.
    let (name, opts) = (unsafe { cstr(filename) }.unwrap_or_default(), unsafe {
        Options::read(o)
    });
    match probe(&name, &opts) {
        Ok(s) => {
            // SAFETY: the caller's promise.
            unsafe { *size = s };
            0
        }
        Err(e) => {
            eprintln!("nvmf: {e}");
            -EINVAL
        }
    }
}

/// # Safety
/// `name` is null or NUL-terminated, `o` as for `nvmf_fio_probe`.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_job_new(
    name: *const c_char,
    iodepth: c_uint,
    nr_files: c_uint,
    o: *const RawOptions,
) -> *mut c_void {
    // SAFETY: the caller's promises.
    let (name, opts) = unsafe { (cstr(name).unwrap_or_default(), Options::read(o)) };
    let depth = iodepth.clamp(1, u32::from(u16::MAX)) as usize;
    Box::into_raw(Box::new(Job::new(
        name,
        depth,
        nr_files as usize,
        opts.stats,
    )))
    .cast()
}

/// # Safety
/// `job` from `nvmf_fio_job_new`, not freed, used by one thread at a time (fio's job); the
/// others as for `nvmf_fio_probe`.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_job_connect(
    job: *mut c_void,
    fileno: c_uint,
    filename: *const c_char,
    o: *const RawOptions,
) -> c_int {
    // SAFETY: the caller's promises.
    let (job, name, opts) = unsafe {
        (
            job_mut(job),
            cstr(filename).unwrap_or_default(),
            Options::read(o),
        )
    };
    match job.connect(fileno as usize, &name, &opts) {
        Ok(()) => 0,
        Err(e) => {
            job.say(format_args!("{e}"));
            -EIO
        }
    }
}

/// # Safety
/// As for `nvmf_fio_job_connect`.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_job_buffer(
    job: *mut c_void,
    index: c_uint,
    len: u64,
) -> *mut c_void {
    // SAFETY: the caller's promise.
    let job = unsafe { job_mut(job) };
    match job.buffer(index as usize, len as usize) {
        Ok(p) => p.cast(),
        Err(e) => {
            job.say(format_args!("{e}"));
            std::ptr::null_mut()
        }
    }
}

/// 1: queued, 0: busy, negative: an errno.
///
/// # Safety
/// As for `nvmf_fio_job_connect`; `buf` is the io_u's transfer buffer (`nvmf_fio_job_buffer`'s
/// memory), not read or written by fio until the io_u comes back from `nvmf_fio_event`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvmf_fio_queue(
    job: *mut c_void,
    io_u: *mut c_void,
    index: c_uint,
    fileno: c_uint,
    op: c_int,
    offset: u64,
    buf: *mut c_void,
    len: u64,
) -> c_int {
    // SAFETY: the caller's promise.
    let job = unsafe { job_mut(job) };
    let Some(op) = Op::from_c(op) else {
        return -EINVAL;
    };
    match job.queue(
        io_u as usize,
        index as usize,
        fileno as usize,
        op,
        offset,
        buf.cast_const().cast(),
        len,
    ) {
        Ok(q) => c_int::from(q),
        Err(e) => -e,
    }
}

/// # Safety
/// As for `nvmf_fio_job_connect`.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_commit(job: *mut c_void) -> c_int {
    // SAFETY: the caller's promise.
    match unsafe { job_mut(job) }.commit() {
        Ok(()) => 0,
        Err(e) => -e,
    }
}

/// How many completions `nvmf_fio_event` hands out (negative: an errno). `timeout_ns < 0`:
/// none (the queue's command timeout bounds the wait).
///
/// # Safety
/// As for `nvmf_fio_job_connect`.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_getevents(
    job: *mut c_void,
    min: c_uint,
    max: c_uint,
    timeout_ns: i64,
) -> c_int {
    // SAFETY: the caller's promise.
    let job = unsafe { job_mut(job) };
    let timeout = u64::try_from(timeout_ns).ok().map(Duration::from_nanos);
    match job.getevents(min as usize, max as usize, timeout) {
        Ok(n) => c_int::try_from(n).unwrap_or(c_int::MAX),
        Err(e) => -e,
    }
}

/// The `i`th io_u of the last `nvmf_fio_getevents`, its errno in `error`.
///
/// # Safety
/// As for `nvmf_fio_job_connect`; `error` writable.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_event(
    job: *mut c_void,
    i: c_uint,
    error: *mut c_int,
) -> *mut c_void {
    // SAFETY: the caller's promise.
    let job = unsafe { job_mut(job) };
    match job.events.get(i as usize) {
        Some(&(io_u, e)) => {
            // SAFETY: the caller's promise.
            unsafe { *error = e };
            io_u as *mut c_void
        }
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// `job` from `nvmf_fio_job_new`, not used again.
#[no_mangle]
pub unsafe extern "C" fn nvmf_fio_job_free(job: *mut c_void) {
    if !job.is_null() {
        // SAFETY: the caller's promise: made by `Box::into_raw` in `nvmf_fio_job_new`.
        drop(unsafe { Box::from_raw(job.cast::<Job>()) });
    }
}

/// # Safety
/// `job` from `nvmf_fio_job_new`, not freed, not used elsewhere meanwhile.
unsafe fn job_mut<'a>(job: *mut c_void) -> &'a mut Job {
    // SAFETY: the caller's promise.
    unsafe { &mut *job.cast::<Job>() }
}

extern "C" {
    fn nvmf_fio_ops() -> *mut c_void;
}

/// fio's entry point for an external engine that has no `ioengine` symbol of its own (a cdylib
/// exports only the Rust half's symbols): the C half's `ioengine_ops`.
///
/// # Safety
/// `ops` writable (fio's call).
#[no_mangle]
pub unsafe extern "C" fn get_ioengine(ops: *mut *mut c_void) {
    // SAFETY: the caller's promise; `nvmf_fio_ops` returns a static.
    unsafe { *ops = nvmf_fio_ops() };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_layout_matches_engine_c() {
        // engine.c's struct nvmf_fio_options on LP64.
        assert_eq!(std::mem::size_of::<RawOptions>(), 72);
        assert_eq!(std::mem::offset_of!(RawOptions, polling), 64);
        assert_eq!(std::mem::offset_of!(RawOptions, stats), 56);
        assert_eq!(std::mem::offset_of!(RawOptions, tls_psk), 32);
        assert_eq!(std::mem::offset_of!(RawOptions, hdgst), 40);
        assert_eq!(std::mem::offset_of!(RawOptions, io_timeout_ms), 52);
    }

    #[test]
    fn connect_options_from_spec_and_options() {
        let spec = spec::parse("trtype=tcp traddr=127.0.0.1 subnqn=n hostnqn=nqn.file").unwrap();
        let opts = Options {
            hostnqn: Some("nqn.option".into()),
            hdgst: true,
            hipri: true,
            io_timeout: Some(Duration::from_secs(3)),
            ..Options::default()
        };
        let o = connect_options(&spec, &opts, 32).unwrap();
        assert_eq!(o.hostnqn, "nqn.file");
        assert!(o.hdr_digest && !o.data_digest);
        assert_eq!(o.polling, initiator::Polling::Busy);
        assert_eq!(
            (o.queues, o.queue_depth, o.timeout),
            (1, 32, Duration::from_secs(3))
        );
        let probe = connect_options(&spec, &Options::default(), 0).unwrap();
        assert_eq!(probe.queues, 0);
        assert_ne!(probe.hostnqn, "nqn.option");
    }

    #[test]
    fn bad_secrets_name_the_option() {
        let spec = spec::parse("trtype=rdma traddr=10.0.0.1 subnqn=n").unwrap();
        let some = |v: &str| Some(v.to_string());
        let d = Options::default;
        // (options, what the error says, whether it starts with that)
        for (o, want, prefix) in [
            (
                Options {
                    dhchap_ctrl_secret: some("x"),
                    ..d()
                },
                "needs dhchap_secret",
                false,
            ),
            (
                Options {
                    dhchap_secret: some("DHHC-1:00:bad"),
                    ..d()
                },
                "dhchap_secret:",
                true,
            ),
            (
                Options {
                    polling: some("sometimes"),
                    ..d()
                },
                "polling=sometimes",
                false,
            ),
            (
                Options {
                    tls_psk: some("NVMeTLSkey-1:01:x:"),
                    ..d()
                },
                "trtype=tcp",
                false,
            ),
        ] {
            let e = connect_options(&spec, &o, 1).unwrap_err();
            let ok = if prefix {
                e.starts_with(want)
            } else {
                e.contains(want)
            };
            assert!(ok, "{o:?}: {e}");
        }
    }
}
