//! The crash-point checker of the VM's durability scenarios (issue #36; the model and the log
//! format are in `nvmf_tests::crashlog`). Two halves, run in the guest:
//!
//! ```text
//! crashpoint blocks --dev /dev/nvme0n1 --blocks 4096 --secs 20 --mark-dev nvmf-lw --record R
//! crashpoint files --dir /mnt/x --files 64 --secs 20 --mark-dev nvmf-lw --record R
//! crashpoint check --log /dev/ram1 --record R [--file nvmf.img | --files] [--scratch /dev/ram2]
//! ```
//!
//! `blocks` writes stamped 4 KiB blocks to a block device with O_DIRECT from `--jobs` threads
//! (each its own blocks, so one write per block is in flight; one op in `--large-every` covers
//! `--large-blocks` blocks, a command the target may move in pieces), one in `--fua-every` with
//! RWF_DSYNC (a FUA write; only over a block whose last write a flush covered, see `job`), one
//! in `--zero-every` a BLKZEROOUT (Write Zeroes), one in `--discard-every` a BLKDISCARD
//! (Deallocate; for backends whose deallocated blocks read zeroes), while another
//! thread flushes every `--flush-ms` (fsync of the block device: an NVMe Flush) and, once a
//! flush completed, puts a mark named after it in the dm-log-writes log (`dmsetup message DEV
//! 0 mark fN`). The record says what was sent and completed when (one global sequence).
//!
//! `check` replays the log into memory, entry by entry. At every flush and FUA entry (a point
//! where a crash leaves exactly what is logged) each block changed since the last one must be a
//! version of itself; at every mark of the record, each block must hold what the host was
//! promised by then (`crashlog::Expect::at_mark`). With `--file`, the namespace is a file in a
//! file system on the logged device (the target's file backend): at each mark the replayed
//! device is written to `--scratch`, mounted (the file system's log recovery runs, as after a
//! crash), the file read and checked, and unmounted. `files` is the same one level up, with xfs
//! on the host's disk: it replaces whole files the safe way (a temporary written and fsynced,
//! renamed over the file, the directory fsynced) and marks the log after every `--batch`; `check
//! --files` mounts each mark's state, checks that every file replaced before the mark holds
//! that version or a later one (whole: no chunk of another version), and runs `xfs_repair -n`
//! on it. Prints the points and marks checked and
//! the first finding; exits 1 when there is one.

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use nvmf_tests::crashlog::{
    self, Expect, Finding, Flush, Log, Present, Record, Write, FLAG_FLUSH, FLAG_FUA, NEVER,
};

#[derive(Parser, Debug)]
#[command(about = "Crash points from a dm-log-writes log against what the host was told")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Write, flush and mark; save the record.
    Blocks {
        #[arg(long)]
        dev: PathBuf,
        /// Blocks of 4 KiB used, from the start of the device.
        #[arg(long, default_value_t = 4096)]
        blocks: u64,
        #[arg(long, default_value_t = 20)]
        secs: u64,
        #[arg(long, default_value_t = 4)]
        jobs: u64,
        #[arg(long, default_value_t = 200)]
        flush_ms: u64,
        /// One write in this many has FUA (0: none).
        #[arg(long, default_value_t = 8)]
        fua_every: u64,
        /// One operation in this many is a Write Zeroes of the block (0: none).
        #[arg(long, default_value_t = 16)]
        zero_every: u64,
        /// One operation in this many is a discard (BLKDISCARD: Deallocate) of the blocks (0:
        /// none), for backends that read deallocated blocks back as zeroes (DLFEAT).
        #[arg(long, default_value_t = 0)]
        discard_every: u64,
        /// One operation in this many covers `--large-blocks` blocks (0: none; prime, so large
        /// writes are not always the Write Zeroes or FUA ones).
        #[arg(long, default_value_t = 29)]
        large_every: u64,
        #[arg(long, default_value_t = 16)]
        large_blocks: u64,
        /// The dm-log-writes device (its dm name) that takes the marks.
        #[arg(long)]
        mark_dev: String,
        #[arg(long)]
        record: PathBuf,
    },
    /// In a file system on the host's disk: replace files (write a temporary, fsync it, rename
    /// it over the file, fsync the directory), a mark after every `--batch`; save the record.
    Files {
        /// The file system's mount point.
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 64)]
        files: u64,
        #[arg(long, default_value_t = 20)]
        secs: u64,
        /// File replacements between two marks.
        #[arg(long, default_value_t = 8)]
        batch: u64,
        #[arg(long)]
        mark_dev: String,
        #[arg(long)]
        record: PathBuf,
    },
    /// Replay the log and check every crash point.
    Check(CheckOpts),
}

/// Bytes of each file of `files`: four stamped 4 KiB chunks.
const FILE_BYTES: usize = 4 * BS;

/// File `id`'s generation `gen`.
fn file_content(id: u64, gen: u64) -> Vec<u8> {
    let mut v = vec![0u8; FILE_BYTES];
    for (c, chunk) in v.chunks_exact_mut(BS).enumerate() {
        crashlog::stamp(chunk, id << 16 | c as u64, gen);
    }
    v
}

/// What file `id` holds (`None`: it does not exist).
fn file_present(id: u64, data: Option<&[u8]>) -> Present {
    let Some(d) = data else {
        return Present::Zero;
    };
    if d.len() != FILE_BYTES {
        return Present::Bad(format!("{} bytes, not {FILE_BYTES}", d.len()));
    }
    let mut gen = None;
    for (c, chunk) in d.chunks_exact(BS).enumerate() {
        match crashlog::present(chunk, id << 16 | c as u64) {
            Present::Gen(g) if gen.is_none_or(|x| x == g) => gen = Some(g),
            Present::Gen(g) => {
                return Present::Bad(format!("chunk {c} of generation {g}, chunk 0 of {gen:?}"))
            }
            p => return Present::Bad(format!("chunk {c}: {p}")),
        }
    }
    Present::Gen(gen.expect("four chunks"))
}

fn files(
    dir: PathBuf,
    n: u64,
    secs: u64,
    batch: u64,
    mark_dev: String,
    record: PathBuf,
) -> Result<(), String> {
    let sh = Shared {
        seq: AtomicU64::new(1),
        stop: AtomicBool::new(false),
        errors: AtomicU64::new(0),
        flushed_before: AtomicU64::new(0),
    };
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let d = File::open(&dir).map_err(|e| io(&dir.display().to_string(), e))?;
    let mut gens = vec![0u64; n as usize];
    let (mut writes, mut flushes) = (Vec::new(), Vec::new());
    let t0 = Instant::now();
    let mut k = 0;
    while t0.elapsed() < Duration::from_secs(secs) {
        for _ in 0..batch {
            let id = rand::random::<u64>() % n;
            let gen = gens[id as usize] + 1;
            let (tmp, name) = (dir.join(format!("f{id}.tmp")), dir.join(format!("f{id}")));
            let sub = sh.next();
            let mut f = File::create(&tmp).map_err(|e| io(&tmp.display().to_string(), e))?;
            std::io::Write::write_all(&mut f, &file_content(id, gen))
                .and_then(|()| f.sync_all())
                .map_err(|e| io(&tmp.display().to_string(), e))?;
            drop(f);
            std::fs::rename(&tmp, &name).map_err(|e| io("rename", e))?;
            d.sync_all().map_err(|e| io("fsync of the directory", e))?;
            let done = sh.next();
            gens[id as usize] = gen;
            writes.push(Write {
                block: id,
                gen,
                zero: false,
                fua: false,
                sub,
                done,
            });
        }
        k += 1;
        let mark = format!("f{k}");
        let mark_before = sh.next();
        put_mark(&mark_dev, &mark)?;
        // The fsyncs are the flushes: everything replaced before the mark is durable.
        flushes.push(Flush {
            sub: mark_before,
            done: mark_before,
            mark_before,
            mark_after: sh.next(),
            mark,
        });
    }
    let rec = Record {
        block_size: FILE_BYTES as u32,
        blocks: n,
        writes,
        flushes,
    };
    rec.save(&record)
        .map_err(|e| format!("{}: {e}", record.display()))?;
    println!(
        "crashpoint files: {} file replacements (fsynced) and {} marks in {:.1} s",
        rec.writes.len(),
        rec.flushes.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

const BS: usize = 4096;
/// `_IO(0x12, 127)`: zero a byte range of a block device (Write Zeroes where it has it).
const BLKZEROOUT: libc::c_ulong = 0x127f;
/// `_IO(0x12, 119)`: discard a byte range (Dataset Management, Deallocate).
const BLKDISCARD: libc::c_ulong = 0x1277;

/// A block-aligned buffer for O_DIRECT.
struct Aligned(*mut u8, usize);

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, BS).expect("layout");
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!p.is_null(), "out of memory");
        Aligned(p, len)
    }
    fn get(&mut self) -> &mut [u8] {
        // SAFETY: self.1 bytes allocated in `new`, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.1, BS).expect("layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.0, layout) };
    }
}

struct Shared {
    seq: AtomicU64,
    stop: AtomicBool,
    errors: AtomicU64,
    /// The submission number of the last flush that completed: a write completed before it
    /// is durable.
    flushed_before: AtomicU64,
}

impl Shared {
    fn next(&self) -> u64 {
        self.seq.fetch_add(1, SeqCst)
    }
}

struct JobOpts {
    blocks: u64,
    jobs: u64,
    fua_every: u64,
    zero_every: u64,
    discard_every: u64,
    large_every: u64,
    large_blocks: u64,
}

/// One writer: its own contiguous blocks (so a block has one write in flight at a time, and a
/// large write stays in them), single blocks and, one op in `large_every`, `large_blocks` at
/// once (one command the target may move in pieces; each block is a version of its own, and a
/// crash may leave some of them).
fn job(j: u64, dev: &Path, o: &JobOpts, sh: &Shared) -> Result<Vec<Write>, String> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .map_err(|e| format!("{}: {e}", dev.display()))?;
    let fd = f.as_raw_fd();
    let per = o.blocks.div_ceil(o.jobs);
    let first = j * per;
    let mine = per.min(o.blocks.saturating_sub(first));
    if mine == 0 {
        return Ok(Vec::new());
    }
    let large = o.large_blocks.clamp(1, mine);
    let mut gens = vec![0u64; mine as usize];
    let mut last_done = vec![0u64; mine as usize];
    let mut buf = Aligned::new(large as usize * BS);
    let mut out = Vec::new();
    let mut n = 0u64;
    while !sh.stop.load(SeqCst) {
        n += 1;
        let len = if o.large_every > 0 && n % o.large_every == 0 {
            large
        } else {
            1
        };
        let i = rand::random::<u64>() % (mine - len + 1);
        let blocks = i..i + len;
        let discard = o.discard_every > 0 && n % o.discard_every == 0;
        let zero = discard || (o.zero_every > 0 && n % o.zero_every == 0);
        // FUA only over blocks with no write still in the device's cache: dm-log-writes logs a
        // FUA write when it completes but an earlier plain write of the same block at the
        // next flush, so the replay would put the older data last.
        let flushed = sh.flushed_before.load(SeqCst);
        let clean = blocks.clone().all(|b| last_done[b as usize] < flushed);
        let fua = !zero && clean && o.fua_every > 0 && n % o.fua_every == 0;
        let off = (first + i) * BS as u64;
        let bytes = len as usize * BS;
        if !zero {
            for (k, chunk) in buf.get()[..bytes].chunks_exact_mut(BS).enumerate() {
                let b = i as usize + k;
                crashlog::stamp(chunk, first + b as u64, gens[b] + 1);
            }
        }
        let sub = sh.next();
        let r = if zero {
            let range = [off, bytes as u64];
            let req = if discard { BLKDISCARD } else { BLKZEROOUT };
            // SAFETY: BLKZEROOUT and BLKDISCARD read two u64s from the pointer.
            let r = unsafe { libc::ioctl(fd, req, range.as_ptr()) };
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        } else {
            let iov = libc::iovec {
                iov_base: buf.0.cast(),
                iov_len: bytes,
            };
            let flags = if fua { libc::RWF_DSYNC } else { 0 };
            // SAFETY: one iovec over `bytes` of the buffer, alive for the call.
            let r = unsafe { libc::pwritev2(fd, &iov, 1, off as libc::off_t, flags) };
            if r == bytes as isize {
                Ok(())
            } else if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Err(std::io::Error::other(format!("short write of {r} bytes")))
            }
        };
        let done = match r {
            Ok(()) => sh.next(),
            Err(e) => {
                sh.errors.fetch_add(1, SeqCst);
                eprintln!("crashpoint: blocks {}..{}: {e}", first + i, first + i + len);
                NEVER
            }
        };
        for b in blocks {
            gens[b as usize] += 1;
            last_done[b as usize] = done;
            out.push(Write {
                block: first + b,
                gen: gens[b as usize],
                zero,
                fua,
                sub,
                done,
            });
        }
    }
    Ok(out)
}

/// Puts mark `name` in the log of the dm-log-writes device `dev`.
fn put_mark(dev: &str, name: &str) -> Result<(), String> {
    let o = Command::new("dmsetup")
        .args(["message", dev, "0", "mark", name])
        .output()
        .map_err(|e| format!("dmsetup: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "dmsetup message {dev} 0 mark {name}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// fsync of the device (an NVMe Flush), then a mark in the log.
fn flush_and_mark(f: &File, k: u64, mark_dev: &str, sh: &Shared) -> Result<Flush, String> {
    let sub = sh.next();
    f.sync_all().map_err(|e| format!("flush {k}: {e}"))?;
    let done = sh.next();
    sh.flushed_before.fetch_max(sub, SeqCst);
    let mark = format!("f{k}");
    let mark_before = sh.next();
    put_mark(mark_dev, &mark)?;
    let mark_after = sh.next();
    Ok(Flush {
        sub,
        done,
        mark_before,
        mark_after,
        mark,
    })
}

#[allow(clippy::too_many_arguments)]
fn blocks(
    dev: PathBuf,
    o: JobOpts,
    secs: u64,
    flush_ms: u64,
    mark_dev: String,
    record: PathBuf,
) -> Result<(), String> {
    let sh = Arc::new(Shared {
        seq: AtomicU64::new(1),
        stop: AtomicBool::new(false),
        errors: AtomicU64::new(0),
        flushed_before: AtomicU64::new(0),
    });
    let flusher = File::open(&dev).map_err(|e| format!("{}: {e}", dev.display()))?;
    let o = Arc::new(o);
    let dev = Arc::new(dev);
    let t0 = Instant::now();
    let handles: Vec<_> = (0..o.jobs)
        .map(|j| {
            let (sh, o, dev) = (sh.clone(), o.clone(), dev.clone());
            std::thread::spawn(move || job(j, &dev, &o, &sh))
        })
        .collect();
    let flushes = Mutex::new(Vec::new());
    let mut k = 0;
    let mut failed = None;
    while t0.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(flush_ms));
        k += 1;
        match flush_and_mark(&flusher, k, &mark_dev, &sh) {
            Ok(f) => flushes.lock().unwrap().push(f),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    sh.stop.store(true, SeqCst);
    let mut writes = Vec::new();
    for h in handles {
        writes.extend(h.join().map_err(|_| "a writer panicked".to_string())??);
    }
    if let Some(e) = failed {
        return Err(e);
    }
    // Everything sent is done: one last flush covers it all.
    let last = flush_and_mark(&flusher, k + 1, &mark_dev, &sh)?;
    let mut flushes = flushes.into_inner().unwrap();
    flushes.push(last);
    let took = t0.elapsed().as_secs_f64();
    let rec = Record {
        block_size: BS as u32,
        blocks: o.blocks,
        writes,
        flushes,
    };
    rec.save(&record)
        .map_err(|e| format!("{}: {e}", record.display()))?;
    let count = |p: fn(&Write) -> bool| rec.writes.iter().filter(|w| p(w)).count();
    println!(
        "crashpoint blocks: {} block writes ({} FUA, {} zeroed by Write Zeroes or Deallocate) and {} flushes in {took:.1} s ({:.0} block writes/s), {} errors",
        rec.writes.len(),
        count(|w| w.fua),
        count(|w| w.zero),
        rec.flushes.len(),
        rec.writes.len() as f64 / took,
        sh.errors.load(SeqCst)
    );
    if sh.errors.load(SeqCst) > 0 {
        return Err("writes failed".into());
    }
    Ok(())
}

/// Mounts `dev` at `mnt` (the file system's log recovery runs), reads `file`'s first `len`
/// bytes, unmounts.
fn read_from_fs(dev: &Path, mnt: &Path, file: &Path, len: usize) -> Result<Vec<u8>, String> {
    std::fs::create_dir_all(mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
    run(&["mount".as_ref(), dev.as_os_str(), mnt.as_os_str()])?;
    let path = mnt.join(file);
    let r = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()));
    let u = run(&["umount".as_ref(), mnt.as_os_str()]);
    let mut data = r?;
    u?;
    data.resize(len, 0);
    Ok(data)
}

#[derive(clap::Args, Debug)]
struct CheckOpts {
    #[arg(long)]
    log: PathBuf,
    #[arg(long)]
    record: PathBuf,
    /// Bytes of the logged device (default: as far as the log wrote).
    #[arg(long)]
    device_bytes: Option<u64>,
    /// The namespace is this file (path inside the file system on the logged device).
    #[arg(long)]
    file: Option<PathBuf>,
    /// A device as large as the logged one, to mount replayed states from (`--file`,
    /// `--files`).
    #[arg(long)]
    scratch: Option<PathBuf>,
    /// Where to mount it.
    #[arg(long, default_value = "/mnt/crashpoint")]
    mnt: PathBuf,
    /// The record is of `files` (a file system on the logged device): at each mark the
    /// replayed device is mounted, every file checked, and `xfs_repair -n` must pass.
    #[arg(long)]
    files: bool,
}

fn run(args: &[&std::ffi::OsStr]) -> Result<String, String> {
    let o = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{:?}: {e}", args[0]))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}{}",
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            String::from_utf8_lossy(&o.stdout).trim(),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// Writes `image` to `scratch` (the state to look at).
fn to_scratch(image: &[u8], scratch: &Path) -> Result<(), String> {
    let dev = OpenOptions::new()
        .write(true)
        .open(scratch)
        .map_err(|e| format!("{}: {e}", scratch.display()))?;
    dev.write_all_at(image, 0)
        .and_then(|()| dev.sync_all())
        .map_err(|e| format!("{}: {e}", scratch.display()))
}

/// At a mark of `files`: mount the replayed state (log recovery), read every file, unmount,
/// then `xfs_repair -n`. Returns what each file holds, or why the file system is broken.
fn files_at(scratch: &Path, mnt: &Path, n: u64) -> Result<Vec<Present>, String> {
    std::fs::create_dir_all(mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
    run(&["mount".as_ref(), scratch.as_os_str(), mnt.as_os_str()])?;
    let got: Vec<Present> = (0..n)
        .map(|id| {
            let data = std::fs::read(mnt.join(format!("f{id}"))).ok();
            file_present(id, data.as_deref())
        })
        .collect();
    run(&["umount".as_ref(), mnt.as_os_str()])?;
    run(&["xfs_repair".as_ref(), "-n".as_ref(), scratch.as_os_str()])
        .map_err(|e| format!("the replayed file system is damaged: {e}"))?;
    Ok(got)
}

fn check(o: CheckOpts) -> Result<bool, String> {
    let log = Log::open(&o.log)?;
    let rec = Record::load(&o.record)?;
    let exp = Expect::new(&rec)?;
    let bs = rec.block_size as u64;
    let ns_bytes = rec.blocks * bs;
    let logged_end = log
        .entries
        .iter()
        .map(|e| {
            let (off, len) = log.extent(e);
            off + len
        })
        .max()
        .unwrap_or(0);
    let dev_bytes = o.device_bytes.unwrap_or(logged_end.max(ns_bytes));
    let mut image = vec![0u8; dev_bytes as usize];
    let marks: HashMap<&str, &Flush> = rec.flushes.iter().map(|f| (f.mark.as_str(), f)).collect();
    let direct = o.file.is_none() && !o.files;
    let mut present = vec![Present::Zero; rec.blocks as usize];
    let mut dirty = BTreeSet::new();
    let (mut points, mut marks_checked) = (0u64, 0u64);
    let mut first: Option<(String, Finding)> = None;
    let mut findings = 0u64;
    let mut seen = BTreeSet::new();
    let t0 = Instant::now();
    for e in &log.entries {
        if let Some((off, len)) = log.apply(e, &mut image)? {
            if direct && off < ns_bytes {
                let last = ((off + len - 1) / bs).min(rec.blocks - 1);
                dirty.extend(off / bs..=last);
            }
        }
        let is_point = e.is(FLAG_FLUSH) || e.is(FLAG_FUA);
        let mark = e.mark.as_deref().and_then(|m| marks.get(m).copied());
        if !is_point && mark.is_none() {
            continue;
        }
        let mut report = |at: String, f: Finding| {
            findings += 1;
            if first.is_none() {
                first = Some((at, f));
            }
        };
        if direct {
            for b in std::mem::take(&mut dirty) {
                let at = (b * bs) as usize;
                present[b as usize] = crashlog::present(&image[at..at + bs as usize], b);
                if let Some(f) = exp.anywhere(b, &present[b as usize]) {
                    report(format!("log entry {}", e.index), f);
                }
            }
            if is_point {
                points += 1;
            }
        }
        let Some(f) = mark else { continue };
        seen.insert(f.mark.clone());
        marks_checked += 1;
        let found = if direct {
            exp.at_mark(f, |b| present[b as usize].clone())
        } else if o.files {
            let scratch = o.scratch.as_ref().ok_or("--files needs --scratch")?;
            to_scratch(&image, scratch)?;
            match files_at(scratch, &o.mnt, rec.blocks) {
                Ok(got) => exp.at_mark(f, |b| got[b as usize].clone()),
                Err(why) => vec![Finding {
                    block: 0,
                    what: why,
                }],
            }
        } else {
            let scratch = o.scratch.as_ref().ok_or("--file needs --scratch")?;
            let file = o.file.as_ref().expect("not direct");
            to_scratch(&image, scratch)?;
            let data = read_from_fs(scratch, &o.mnt, file, ns_bytes as usize)
                .map_err(|why| format!("mark {} (log entry {}): {why}", f.mark, e.index))?;
            exp.at_mark(f, |b| {
                let at = (b * bs) as usize;
                crashlog::present(&data[at..at + bs as usize], b)
            })
        };
        for fd in found {
            report(format!("mark {} (log entry {})", f.mark, e.index), fd);
        }
    }
    let missing: Vec<&str> = rec
        .flushes
        .iter()
        .map(|f| f.mark.as_str())
        .filter(|m| !seen.contains(*m))
        .collect();
    println!(
        "crashpoint check: {} log entries, {points} flush/FUA points and {marks_checked} marks checked ({} blocks, {} writes, {} host flushes) in {:.1} s: {findings} findings",
        log.entries.len(),
        rec.blocks,
        rec.writes.len(),
        rec.flushes.len(),
        t0.elapsed().as_secs_f64()
    );
    if let Some((at, f)) = &first {
        println!("first finding: at {at}: block {}: {}", f.block, f.what);
        // Where the block went in the log, for whoever reads the finding.
        let (lo, hi) = (f.block * bs, (f.block + 1) * bs);
        let mut trail = Vec::new();
        for e in &log.entries {
            let (off, len) = log.extent(e);
            if len == 0 || e.is(crashlog::FLAG_MARK) || off + len <= lo || off >= hi {
                continue;
            }
            let what = if e.is(crashlog::FLAG_DISCARD) {
                "discard".to_string()
            } else if direct && off <= lo && off + len >= hi {
                let d = log.data(e)?;
                crashlog::present(&d[(lo - off) as usize..(hi - off) as usize], f.block).to_string()
            } else {
                format!("{len} bytes")
            };
            let flags = if e.is(FLAG_FUA) { " FUA" } else { "" };
            trail.push(format!("#{}{flags}: {what}", e.index));
        }
        println!("block {} in the log: {}", f.block, trail.join(", "));
    }
    if !missing.is_empty() {
        println!(
            "marks of the record not in the log: {} (first {})",
            missing.len(),
            missing[0]
        );
    }
    Ok(findings == 0 && missing.is_empty() && marks_checked > 0)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let r = match args.cmd {
        Cmd::Blocks {
            dev,
            blocks: n,
            secs,
            jobs,
            flush_ms,
            fua_every,
            zero_every,
            discard_every,
            large_every,
            large_blocks,
            mark_dev,
            record,
        } => blocks(
            dev,
            JobOpts {
                blocks: n,
                jobs: jobs.max(1),
                fua_every,
                zero_every,
                discard_every,
                large_every,
                large_blocks,
            },
            secs,
            flush_ms,
            mark_dev,
            record,
        )
        .map(|()| true),
        Cmd::Files {
            dir,
            files: n,
            secs,
            batch,
            mark_dev,
            record,
        } => files(dir, n.max(1), secs, batch.max(1), mark_dev, record).map(|()| true),
        Cmd::Check(o) => check(o),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("crashpoint: {e}");
            ExitCode::from(2)
        }
    }
}
