//! Shared by the allocation tests: a global allocator that counts the allocations made by the
//! current thread (the test harness's threads are unaffected), and those made by the daemon's
//! poller threads (`nvmf-poller-N`, serving both transports), wherever the daemon runs in this
//! process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// Whether this thread is a poller (known once its name says so; the name is set when the
    /// thread starts, before its own code runs).
    static POLLER: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread prints a backtrace (which allocates itself).
    static TRACING: Cell<bool> = const { Cell::new(false) };
}

/// While set, each allocation on a poller thread prints its backtrace
/// (see [`trace_poller_allocs`]).
static TRACE: AtomicBool = AtomicBool::new(false);

/// Allocations made on poller threads, all of them together.
static POLLER_ALLOCS: AtomicU64 = AtomicU64::new(0);

/// Whether the calling thread's name is a poller's. Reads the kernel's copy of the name
/// (`prctl(PR_GET_NAME)`), which allocates nothing.
fn named_poller() -> bool {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into the buffer it is given.
    if unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) } != 0 {
        return false;
    }
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let name = &name[..len];
    let numbered = |prefix: &[u8]| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.iter().all(u8::is_ascii_digit))
    };
    numbered(b"nvmf-poller-")
}

fn bump() {
    // `try_with`: allocations during thread teardown must not panic.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    let poller = POLLER
        .try_with(|p| {
            if !p.get() && named_poller() {
                p.set(true);
            }
            p.get()
        })
        .unwrap_or(false);
    if poller {
        POLLER_ALLOCS.fetch_add(1, Ordering::Relaxed);
        if TRACE.load(Ordering::Relaxed) && TRACING.try_with(|t| !t.replace(true)) == Ok(true) {
            eprintln!(
                "heap allocation on a poller thread:\n{}",
                std::backtrace::Backtrace::force_capture()
            );
            let _ = TRACING.try_with(|t| t.set(false));
        }
    }
}

// SAFETY: forwards every call unchanged to the system allocator. The counting (const-initialised
// thread-locals, an atomic, prctl) never allocates; the backtrace printed on request does, and
// `TRACING` keeps that from recursing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: same contract as ours, passed through.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: same contract as ours, passed through.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: same contract as ours, passed through; `ptr` came from this allocator,
        // i.e. from System.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours, passed through.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// How many allocations (alloc, alloc_zeroed, realloc) this thread has made so far.
#[allow(dead_code)]
pub fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

/// How many allocations the daemon's poller threads (NVMe/TCP and NVMe/RDMA) have made so far.
#[allow(dead_code)]
pub fn poller_allocs() -> u64 {
    POLLER_ALLOCS.load(Ordering::Relaxed)
}

/// From now on, print the backtrace of every allocation a poller thread makes (to find one a
/// test reports).
#[allow(dead_code)]
pub fn trace_poller_allocs(on: bool) {
    TRACE.store(on, Ordering::Relaxed);
}
