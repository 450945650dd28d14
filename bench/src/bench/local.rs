//! The backend's own limit: the same I/O (block size, depth, jobs, pattern) as a workload,
//! issued straight to a local file with io_uring by this process, as nvmf-target's backend
//! issues it. O_DIRECT when the file system takes it (tmpfs does not: then buffered, as the
//! target falls back too). One ring and one thread per job; each job keeps `depth` operations
//! in flight, submits every free slot with one `io_uring_enter` and waits for at least one
//! completion. Latency is submission to completion.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};

use super::job::DirStats;
use super::run::CpuTime;

/// What one local run measured.
#[derive(Debug, Clone)]
pub struct Local {
    pub stats: DirStats,
    pub elapsed: Duration,
    pub cpu: CpuTime,
    /// Whether the file was opened with O_DIRECT.
    pub direct: bool,
}

/// A zeroed buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

fn open(path: &Path, write: bool) -> io::Result<(File, bool)> {
    let mut o = OpenOptions::new();
    o.read(true).write(write);
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((o.open(path)?, false)),
        Err(e) => Err(e),
    }
}

/// xorshift64*: offsets for random patterns.
fn next_rand(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Run `jobs` jobs of `bs`-byte reads (or writes) at `depth` on `path` for `dur`, random or
/// sequential.
pub fn run(
    path: &Path,
    bs: usize,
    depth: usize,
    jobs: usize,
    write: bool,
    random: bool,
    dur: Duration,
) -> io::Result<Local> {
    let size = std::fs::metadata(path)?.len();
    let blocks = size / bs as u64;
    if blocks == 0 {
        return Err(io::Error::other(format!(
            "{} is smaller than one {bs}-byte block",
            path.display()
        )));
    }
    let mut direct = true;
    let mut files = Vec::with_capacity(jobs);
    for _ in 0..jobs {
        let (f, d) = open(path, write)?;
        direct &= d;
        files.push(f);
    }
    let cpu0 = CpuTime::now();
    let t0 = Instant::now();
    let end = t0 + dur;
    let results: Vec<io::Result<(DirStats, Instant)>> = std::thread::scope(|s| {
        let hs: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(j, f)| {
                s.spawn(move || {
                    let mut last = end;
                    let r = job(
                        f,
                        bs,
                        depth,
                        write,
                        random,
                        blocks,
                        j as u64 * blocks / jobs as u64,
                        end,
                        &mut last,
                    );
                    r.map(|st| (st, last))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let cpu = CpuTime::now().since(&cpu0);
    let mut stats = DirStats::new();
    let mut last = end;
    for r in results {
        let (st, l) = r?;
        stats.add(&st);
        last = last.max(l);
    }
    let elapsed = last.duration_since(t0);
    Ok(Local {
        stats,
        elapsed,
        cpu,
        direct,
    })
}

#[allow(clippy::too_many_arguments)]
fn job(
    f: &File,
    bs: usize,
    depth: usize,
    write: bool,
    random: bool,
    blocks: u64,
    first: u64,
    end: Instant,
    last: &mut Instant,
) -> io::Result<DirStats> {
    let mut ring = IoUring::new(depth.next_power_of_two().max(2) as u32)?;
    let bufs: Vec<AlignedBuf> = (0..depth).map(|_| AlignedBuf::new(bs)).collect();
    let mut started = vec![Instant::now(); depth];
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut stats = DirStats::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (first + 1);
    let mut seq = first;
    let fd = types::Fd(f.as_raw_fd());
    let mut inflight = 0usize;
    let mut done = false;
    loop {
        let now = Instant::now();
        // The window is `dur`, stretched on a starved machine until the first completion.
        if now >= end && stats.ios > 0 {
            done = true;
        }
        if !done {
            while let Some(slot) = free.pop() {
                let block = if random {
                    next_rand(&mut seed) % blocks
                } else {
                    let b = seq;
                    seq = (seq + 1) % blocks;
                    b
                };
                let off = block * bs as u64;
                let p = bufs[slot].ptr.as_ptr();
                let e = if write {
                    opcode::Write::new(fd, p, bs as u32).offset(off).build()
                } else {
                    opcode::Read::new(fd, p, bs as u32).offset(off).build()
                };
                started[slot] = now;
                // SAFETY: the buffer (owned by `bufs`, which outlives the ring's use: this
                // function reaps every operation before returning) and the file stay valid
                // until the operation's CQE; each slot has one operation at a time.
                unsafe { ring.submission().push(&e.user_data(slot as u64)) }
                    .map_err(|_| io::Error::other("submission queue full"))?;
                inflight += 1;
            }
        }
        if inflight == 0 {
            return Ok(stats);
        }
        ring.submit_and_wait(1)?;
        let now = Instant::now();
        let mut failed = None;
        for cqe in ring.completion() {
            let slot = cqe.user_data() as usize;
            inflight -= 1;
            free.push(slot);
            if cqe.result() < 0 {
                failed = Some(io::Error::from_raw_os_error(-cqe.result()));
            } else if cqe.result() as usize != bs {
                failed = Some(io::Error::other(format!(
                    "short {}: {} of {bs} bytes",
                    if write { "write" } else { "read" },
                    cqe.result()
                )));
            } else if now <= end || stats.ios == 0 {
                *last = now;
                stats.ios += 1;
                stats.bytes += bs as u64;
                let ns = now.duration_since(started[slot]).as_nanos() as u64;
                stats.hist.saturating_record(ns.max(1));
            }
        }
        if let Some(e) = failed {
            // Reap what is still in flight before the buffers go away.
            while inflight > 0 {
                ring.submit_and_wait(1)?;
                inflight -= ring.completion().count();
            }
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_a_file() {
        let dir = std::env::temp_dir().join(format!("nvmf-bench-local-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.img");
        std::fs::write(&path, vec![0x5au8; 1 << 20]).unwrap();
        for (write, random) in [(false, true), (true, false)] {
            let l = run(&path, 4096, 4, 2, write, random, Duration::from_millis(50)).unwrap();
            assert!(l.stats.ios > 0);
            assert_eq!(l.stats.bytes, l.stats.ios * 4096);
            assert_eq!(l.stats.hist.len(), l.stats.ios);
        }
        assert!(run(&path, 2 << 20, 1, 1, false, true, Duration::from_millis(10)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
