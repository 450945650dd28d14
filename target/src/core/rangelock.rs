//! LBA range locks: what makes a fused Compare and Write atomic with respect to every other
//! write to the same blocks, from any queue of any controller.
//!
//! A namespace's byte space is hashed onto [`BUCKETS`] buckets of 1 MiB stripes. Every write
//! (Write, Write Zeroes, deallocate) registers while it is executing: a write that touches at
//! most [`NARROW_MAX`] buckets counts itself in each of them, anything larger (a long write,
//! a DSM range list) counts itself as *wide*. A Compare and Write locks the buckets its range
//! touches (the top bit of each), then waits until the writes counted in them, and every wide
//! write, have completed; writes that come while a bucket is locked (any lock, for a wide
//! write) do not register and wait for the lock to go. Both sides use one atomic per bucket,
//! so neither misses the other: a write's increment sees the lock bit or the lock's
//! compare-exchange sees the count; the wide count and the lock count are sequentially
//! consistent (each side changes its own, then reads the other's).
//!
//! Cost per write while nobody locks: one atomic add when it starts and one subtract when it
//! completes, on a bucket shared only with writes to the same stripe. Hashing makes the lock
//! coarse (a lock also waits for writes to other stripes of the same bucket), never wrong.
//!
//! Waiting is by wakers: a queue that must wait registers its waker first and then checks
//! again, and whoever releases a count or a lock while waiters are registered calls them all
//! (they check again; a spurious wake-up costs one look).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError};

use super::Waker;

/// Buckets per namespace (a power of two: the mask is a `u64`).
pub(crate) const BUCKETS: usize = 64;
/// log2 of the bytes one bucket stripe covers (1 MiB).
const STRIPE_SHIFT: u32 = 20;
/// The most buckets a write counts itself in; beyond, it is wide.
pub(crate) const NARROW_MAX: u64 = 4;
/// The lock bit of a bucket; the low bits count the writes registered in it.
const LOCKED: u32 = 1 << 31;

/// The buckets a byte range touches, as a mask; `None` when that is more than `limit` buckets.
fn mask(offset: u64, len: u64, limit: u64) -> Option<u64> {
    let first = offset >> STRIPE_SHIFT;
    let last = offset.saturating_add(len.max(1) - 1) >> STRIPE_SHIFT;
    let n = last - first + 1;
    if n > limit {
        return None;
    }
    if n >= BUCKETS as u64 {
        return Some(u64::MAX);
    }
    let mut m = 0u64;
    for b in first..=last {
        m |= 1 << (b % BUCKETS as u64);
    }
    Some(m)
}

fn bits(m: u64) -> impl Iterator<Item = usize> {
    (0..BUCKETS).filter(move |b| m & (1 << b) != 0)
}

/// What a registered write holds; [`RangeLocks::leave`] gives it back. `Held::NONE` for
/// commands that registered nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Buckets counted in (0 with `wide`).
    mask: u64,
    wide: bool,
}

impl Held {
    pub const NONE: Held = Held {
        mask: 0,
        wide: false,
    };
    pub fn is_none(&self) -> bool {
        *self == Held::NONE
    }
}

/// One namespace's range locks (shared by every queue of the subsystem).
pub(crate) struct RangeLocks {
    buckets: [AtomicU32; BUCKETS],
    /// Wide writes executing.
    wide: AtomicU32,
    /// Locks held or being taken.
    locked: AtomicU32,
    /// Wait tickets out: lock takers that found the lock busy and wait their turn.
    waiting: AtomicU32,
    has_waiters: AtomicBool,
    waiters: Mutex<Vec<Waker>>,
}

impl Default for RangeLocks {
    fn default() -> RangeLocks {
        RangeLocks {
            buckets: std::array::from_fn(|_| AtomicU32::new(0)),
            wide: AtomicU32::new(0),
            locked: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            has_waiters: AtomicBool::new(false),
            waiters: Mutex::new(Vec::new()),
        }
    }
}

impl std::fmt::Debug for RangeLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeLocks")
            .field("wide", &self.wide.load(SeqCst))
            .field("locked", &self.locked.load(SeqCst))
            .finish_non_exhaustive()
    }
}

impl RangeLocks {
    /// Registers a write of `len` bytes at `offset` (`offset, len` = `0, u64::MAX` for one
    /// whose extent is a list, like a deallocation). `None`: a lock is in the way; the write
    /// must wait (see [`RangeLocks::wait`]) and try again.
    pub fn enter(&self, offset: u64, len: u64) -> Option<Held> {
        match mask(offset, len, NARROW_MAX) {
            Some(m) => {
                for (i, b) in bits(m).enumerate() {
                    if self.buckets[b].fetch_add(1, SeqCst) & LOCKED != 0 {
                        // Undo this one and those before it.
                        for b in bits(m).take(i + 1) {
                            self.buckets[b].fetch_sub(1, SeqCst);
                        }
                        self.notify();
                        return None;
                    }
                }
                Some(Held {
                    mask: m,
                    wide: false,
                })
            }
            None => {
                self.wide.fetch_add(1, SeqCst);
                if self.locked.load(SeqCst) != 0 {
                    self.wide.fetch_sub(1, SeqCst);
                    self.notify();
                    return None;
                }
                Some(Held {
                    mask: 0,
                    wide: true,
                })
            }
        }
    }

    /// Whether a write of this extent would be refused now (a look, for deciding when to try
    /// again).
    pub fn would_block(&self, offset: u64, len: u64) -> bool {
        match mask(offset, len, NARROW_MAX) {
            Some(m) => bits(m).any(|b| self.buckets[b].load(SeqCst) & LOCKED != 0),
            None => self.locked.load(SeqCst) != 0,
        }
    }

    /// A registered write completed.
    pub fn leave(&self, h: Held) {
        if h.wide {
            self.wide.fetch_sub(1, SeqCst);
        }
        for b in bits(h.mask) {
            self.buckets[b].fetch_sub(1, SeqCst);
        }
        if !h.is_none() {
            self.notify();
        }
    }

    /// Tries to lock the buckets of `len` bytes at `offset` for a Compare and Write. The lock
    /// is held until the returned guard is dropped; the locked range is safe to use once
    /// [`RangeLock::drained`] says so. [`Busy::Held`]: another lock holds one of the buckets;
    /// [`Busy::Waiters`]: others wait for a lock and `ticket` is `None` (a newcomer does not
    /// pass them: it takes a [`WaitTicket`] and waits to be woken). Either way, wait and try
    /// again.
    pub fn try_lock(
        self: &Arc<Self>,
        offset: u64,
        len: u64,
        ticket: Option<&WaitTicket>,
    ) -> Result<RangeLock, Busy> {
        if ticket.is_none() && self.waiting.load(SeqCst) != 0 {
            return Err(Busy::Waiters);
        }
        let m = mask(offset, len, BUCKETS as u64).unwrap_or(u64::MAX);
        self.locked.fetch_add(1, SeqCst);
        for (i, b) in bits(m).enumerate() {
            let prev = self.buckets[b].fetch_or(LOCKED, SeqCst);
            if prev & LOCKED != 0 {
                for b in bits(m).take(i) {
                    self.buckets[b].fetch_and(!LOCKED, SeqCst);
                }
                self.locked.fetch_sub(1, SeqCst);
                self.notify();
                return Err(Busy::Held);
            }
        }
        Ok(RangeLock {
            locks: self.clone(),
            mask: m,
        })
    }

    /// Calls `waker` once the next time a count or a lock is released. Register before the
    /// last check, so a release in between is not missed.
    pub fn wait(&self, waker: &Waker) {
        let mut w = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if !w.iter().any(|x| Arc::ptr_eq(x, waker)) {
            w.push(waker.clone());
        }
        self.has_waiters.store(true, SeqCst);
    }

    fn notify(&self) {
        if !self.has_waiters.load(SeqCst) {
            return;
        }
        let woken = {
            let mut w = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
            self.has_waiters.store(false, SeqCst);
            std::mem::take(&mut *w)
        };
        for w in woken {
            w();
        }
    }
}

/// Why [`RangeLocks::try_lock`] did not lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Busy {
    /// Another lock holds a bucket of the range.
    Held,
    /// Others wait for a lock, and the caller has no ticket.
    Waiters,
}

/// A lock taker's place among those waiting (so one that keeps coming back first does not
/// starve the others); given back when dropped.
#[derive(Debug)]
pub(crate) struct WaitTicket(Arc<RangeLocks>);

impl WaitTicket {
    pub fn new(locks: &Arc<RangeLocks>) -> WaitTicket {
        locks.waiting.fetch_add(1, SeqCst);
        WaitTicket(locks.clone())
    }
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, SeqCst);
        self.0.notify();
    }
}

/// A held range lock (released when dropped).
#[derive(Debug)]
pub(crate) struct RangeLock {
    locks: Arc<RangeLocks>,
    mask: u64,
}

impl RangeLock {
    /// No write that registered before the lock is still executing in its buckets, and no
    /// wide write is.
    pub fn drained(&self) -> bool {
        self.locks.wide.load(SeqCst) == 0
            && bits(self.mask).all(|b| self.locks.buckets[b].load(SeqCst) & !LOCKED == 0)
    }
    /// Calls `waker` when something is released (see [`RangeLocks::wait`]).
    pub fn wait(&self, waker: &Waker) {
        self.locks.wait(waker)
    }
}

impl Drop for RangeLock {
    fn drop(&mut self) {
        for b in bits(self.mask) {
            self.locks.buckets[b].fetch_and(!LOCKED, SeqCst);
        }
        self.locks.locked.fetch_sub(1, SeqCst);
        self.locks.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    const MIB: u64 = 1 << 20;

    #[test]
    fn masks() {
        assert_eq!(mask(0, 4096, 4), Some(1));
        assert_eq!(mask(MIB - 512, 1024, 4), Some(0b11));
        assert_eq!(mask(3 * MIB, 2 * MIB, 4), Some(0b11000));
        // Wraps around the bucket count.
        assert_eq!(mask(63 * MIB, 2 * MIB, 4), Some(1 << 63 | 1));
        assert_eq!(mask(0, 5 * MIB, 4), None);
        assert_eq!(mask(0, u64::MAX, 4), None);
        assert_eq!(mask(0, 64 * MIB, 64), Some(u64::MAX));
        assert_eq!(mask(0, u64::MAX, 64), None);
        assert_eq!(mask(u64::MAX - 10, 100, 4), Some(1 << 63));
    }

    #[test]
    fn writes_and_locks_exclude_each_other() {
        let l = Arc::new(RangeLocks::default());
        let w = l.enter(0, 4096).expect("nothing locked");
        let lock = l.try_lock(512, 512, None).expect("no other lock");
        assert!(!lock.drained(), "a write in the bucket is executing");
        // A second lock on the bucket waits; one elsewhere does not.
        assert_eq!(l.try_lock(0, 1, None).err(), Some(Busy::Held));
        let other = l.try_lock(5 * MIB, 4096, None).expect("another bucket");
        // New writes to the locked bucket wait; wide writes wait for any lock.
        assert!(l.enter(100, 10).is_none());
        assert!(l.would_block(100, 10));
        assert!(l.enter(0, u64::MAX).is_none());
        // A write elsewhere goes on.
        let w2 = l.enter(2 * MIB, 4096).expect("not locked");
        l.leave(w);
        assert!(lock.drained());
        drop(lock);
        drop(other);
        let w3 = l.enter(100, 10).expect("unlocked");
        let wide = l.enter(0, u64::MAX).expect("unlocked");
        let lock = l.try_lock(10 * MIB, 1, None).expect("free bucket");
        assert!(!lock.drained(), "a wide write is executing");
        l.leave(wide);
        assert!(lock.drained());
        l.leave(w2);
        l.leave(w3);
        drop(lock);
        for b in &l.buckets {
            assert_eq!(b.load(SeqCst), 0);
        }
        assert_eq!(l.wide.load(SeqCst), 0);
        assert_eq!(l.locked.load(SeqCst), 0);
    }

    #[test]
    fn releases_wake_waiters_once() {
        let l = Arc::new(RangeLocks::default());
        let n = Arc::new(AtomicUsize::new(0));
        let c = n.clone();
        let waker: Waker = Arc::new(move || {
            c.fetch_add(1, SeqCst);
        });
        let lock = l.try_lock(0, 1, None).unwrap();
        assert!(l.enter(0, 1).is_none());
        l.wait(&waker);
        l.wait(&waker);
        drop(lock);
        assert_eq!(n.load(SeqCst), 1, "registered once, woken once");
        let w = l.enter(0, 1).unwrap();
        l.leave(w);
        assert_eq!(n.load(SeqCst), 1, "nobody waits any more");
    }

    #[test]
    fn a_newcomer_does_not_pass_a_waiter() {
        let l = Arc::new(RangeLocks::default());
        let held = l.try_lock(0, 1, None).unwrap();
        // A waits: it found the lock held and took a ticket.
        assert_eq!(l.try_lock(0, 1, None).err(), Some(Busy::Held));
        let ticket = WaitTicket::new(&l);
        drop(held);
        // B comes while A waits: it must queue too, even for another stripe.
        assert_eq!(l.try_lock(0, 1, None).err(), Some(Busy::Waiters));
        assert_eq!(l.try_lock(9 * MIB, 1, None).err(), Some(Busy::Waiters));
        let b_ticket = WaitTicket::new(&l);
        // A with its ticket gets it, then gives its ticket back; B's turn after A's lock.
        let a = l.try_lock(0, 1, Some(&ticket)).unwrap();
        drop(ticket);
        assert_eq!(l.try_lock(0, 1, Some(&b_ticket)).err(), Some(Busy::Held));
        drop(a);
        l.try_lock(0, 1, Some(&b_ticket)).unwrap();
        drop(b_ticket);
        assert_eq!(l.waiting.load(SeqCst), 0);
    }

    /// Threads hammer one stripe with registered "writes" that each set a shared word to
    /// their value and check it stays theirs while registered, while a locker repeatedly
    /// locks and checks nobody writes under it: no overlap is ever seen.
    #[test]
    fn concurrent_writers_never_run_under_a_lock() {
        let l = Arc::new(RangeLocks::default());
        let inside = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..3u64)
            .map(|i| {
                let (l, inside, stop) = (l.clone(), inside.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut done = 0u64;
                    while !stop.load(SeqCst) {
                        let (off, len) = if i == 2 {
                            (0, u64::MAX)
                        } else {
                            (i * 4096, 4096)
                        };
                        if let Some(h) = l.enter(off, len) {
                            inside.fetch_add(1, SeqCst);
                            std::hint::spin_loop();
                            inside.fetch_sub(1, SeqCst);
                            l.leave(h);
                            done += 1;
                        }
                    }
                    done
                })
            })
            .collect();
        let mut locks = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while std::time::Instant::now() < deadline {
            if let Ok(g) = l.try_lock(0, 8192, None) {
                while !g.drained() {
                    std::hint::spin_loop();
                }
                for _ in 0..100 {
                    assert_eq!(inside.load(SeqCst), 0, "a write ran under the lock");
                }
                locks += 1;
            }
        }
        stop.store(true, SeqCst);
        let done: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(locks > 0 && done > 0, "locks {locks} writes {done}");
    }
}
