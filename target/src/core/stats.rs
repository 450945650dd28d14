//! Per-queue I/O statistics for operators: per namespace (commands, bytes, errors, a latency
//! histogram), errors by status and commands outstanding, summed per controller and
//! subsystem when scraped.
//!
//! Each queue owns its `IoCounters` and is their only writer: relaxed loads and stores, no
//! locks, no read-modify-write, no allocation on the I/O path (the namespace slots and the
//! start-time table are allocated at queue creation and Connect). A scrape reads them from
//! another thread through the controller's queue list.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

/// Latency histogram: bucket `i < LAT_BUCKETS` counts commands that took at most
/// `LAT_FIRST_US << i` µs (16 µs .. 1.048576 s, powers of two); the last bucket the slower
/// ones (Prometheus `+Inf`).
pub const LAT_BUCKETS: usize = 17;
pub const LAT_FIRST_US: u64 = 16;
/// Namespaces one queue keeps apart; I/O to more goes to the last slot ([`NSID_OTHER`]).
const NS_SLOTS: usize = 16;
/// The namespace key of I/O that did not fit in a queue's namespace slots.
pub const NSID_OTHER: u32 = u32::MAX;
/// Error counters: generic (SCT 0) codes 00h..BFh (generic and NVM command set), command
/// specific (SCT 1) codes 00h..7Fh, and one for every other status.
const STATUS_SLOTS: usize = 0xc0 + 0x80 + 1;

fn status_slot(code: u16) -> usize {
    let (sct, sc) = ((code >> 8) & 7, (code & 0xff) as usize);
    match sct {
        0 if sc < 0xc0 => sc,
        1 if sc < 0x80 => 0xc0 + sc,
        _ => STATUS_SLOTS - 1,
    }
}

/// The status code a slot stands for (`None`: the "other" slot).
fn slot_status(i: usize) -> Option<u16> {
    match i {
        0..=0xbf => Some(i as u16),
        0xc0..=0x13f => Some(0x100 | (i - 0xc0) as u16),
        _ => None,
    }
}

/// Index of the histogram bucket for a latency of `ns`.
pub fn lat_bucket(ns: u64) -> usize {
    let us = ns.div_ceil(1000);
    if us <= LAT_FIRST_US {
        return 0;
    }
    let x = (us - 1) / LAT_FIRST_US;
    ((64 - x.leading_zeros()) as usize).min(LAT_BUCKETS)
}

fn bump(c: &AtomicU64, by: u64) {
    // Single writer: a load and a store avoid a locked read-modify-write.
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

#[derive(Debug, Default)]
struct NsCounters {
    /// 0: slot unused.
    nsid: AtomicU32,
    reads: AtomicU64,
    writes: AtomicU64,
    others: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
    lat: [AtomicU64; LAT_BUCKETS + 1],
    lat_sum_ns: AtomicU64,
}

/// One queue's I/O statistics (see the module doc).
#[derive(Debug)]
pub(crate) struct IoCounters {
    ns: Box<[NsCounters]>,
    status: Box<[AtomicU64]>,
    outstanding: AtomicU64,
    /// Start times of outstanding commands, direct-mapped by CID (sized at Connect). A CID
    /// that finds its entry taken is not timed (it is still counted).
    starts: Box<[(AtomicU16, AtomicU64)]>,
}

impl Default for IoCounters {
    fn default() -> IoCounters {
        IoCounters {
            ns: (0..NS_SLOTS).map(|_| NsCounters::default()).collect(),
            status: (0..STATUS_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            outstanding: AtomicU64::new(0),
            starts: Box::new([]),
        }
    }
}

/// What kind of I/O command finished, for [`IoCounters::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IoClass {
    Read,
    Write,
    Other,
}

const FREE: u64 = u64::MAX;

impl IoCounters {
    /// Size the start-time table for a queue of `depth` entries (at Connect).
    pub fn sized(depth: u16) -> IoCounters {
        let n = (depth as usize * 4).next_power_of_two();
        IoCounters {
            starts: (0..n)
                .map(|_| (AtomicU16::new(0), AtomicU64::new(FREE)))
                .collect(),
            ..IoCounters::default()
        }
    }

    /// A parsed I/O command starts (`t_ns`: a monotonic timestamp).
    pub fn start(&self, cid: u16, t_ns: u64) {
        bump(&self.outstanding, 1);
        if self.starts.is_empty() {
            return;
        }
        let e = &self.starts[cid as usize & (self.starts.len() - 1)];
        if e.1.load(Ordering::Relaxed) == FREE {
            e.0.store(cid, Ordering::Relaxed);
            e.1.store(t_ns, Ordering::Relaxed);
        }
    }

    fn ns_slot(&self, nsid: u32) -> &NsCounters {
        for s in self.ns.iter() {
            let n = s.nsid.load(Ordering::Relaxed);
            if n == nsid {
                return s;
            }
            if n == 0 {
                s.nsid.store(nsid, Ordering::Relaxed);
                return s;
            }
        }
        let last = &self.ns[NS_SLOTS - 1];
        last.nsid.store(NSID_OTHER, Ordering::Relaxed);
        last
    }

    /// A command [`IoCounters::start`] saw completed with `status` (a code, 0: success),
    /// moving `bytes` of data, at `t_ns`.
    pub fn finish(&self, cid: u16, nsid: u32, class: IoClass, status: u16, bytes: u64, t_ns: u64) {
        let o = self.outstanding.load(Ordering::Relaxed);
        self.outstanding
            .store(o.saturating_sub(1), Ordering::Relaxed);
        let ns = self.ns_slot(nsid);
        if status != 0 {
            bump(&ns.errors, 1);
        } else {
            match class {
                IoClass::Read => {
                    bump(&ns.reads, 1);
                    bump(&ns.bytes_read, bytes);
                }
                IoClass::Write => {
                    bump(&ns.writes, 1);
                    bump(&ns.bytes_written, bytes);
                }
                IoClass::Other => bump(&ns.others, 1),
            }
        }
        if !self.starts.is_empty() {
            let e = &self.starts[cid as usize & (self.starts.len() - 1)];
            let t0 = e.1.load(Ordering::Relaxed);
            if t0 != FREE && e.0.load(Ordering::Relaxed) == cid {
                e.1.store(FREE, Ordering::Relaxed);
                let d = t_ns.saturating_sub(t0);
                bump(&ns.lat[lat_bucket(d)], 1);
                bump(&ns.lat_sum_ns, d);
            }
        }
    }

    /// A failed completion (any command on this queue), by status code.
    pub fn error(&self, status: u16) {
        bump(&self.status[status_slot(status & 0x7ff)], 1);
    }

    /// Add these counters to `t`; `live` also counts the commands outstanding.
    pub fn add_to(&self, t: &mut IoTotals, live: bool) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        if live {
            t.outstanding += l(&self.outstanding);
        }
        for (i, c) in self.status.iter().enumerate() {
            let n = l(c);
            if n > 0 {
                *t.errors_by_status.entry(slot_status(i)).or_default() += n;
            }
        }
        for s in self.ns.iter() {
            let nsid = s.nsid.load(Ordering::Relaxed);
            if nsid == 0 {
                continue;
            }
            let e = t.namespaces.entry(nsid).or_default();
            e.reads += l(&s.reads);
            e.writes += l(&s.writes);
            e.others += l(&s.others);
            e.bytes_read += l(&s.bytes_read);
            e.bytes_written += l(&s.bytes_written);
            e.errors += l(&s.errors);
            for (b, c) in e.lat.iter_mut().zip(s.lat.iter()) {
                *b += l(c);
            }
            e.lat_sum_ns += l(&s.lat_sum_ns);
        }
    }
}

/// One namespace's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NsTotals {
    /// Successful Reads, Writes and other I/O commands (Flush, Write Zeroes, DSM).
    pub reads: u64,
    pub writes: u64,
    pub others: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// I/O commands completed with an error status.
    pub errors: u64,
    /// Latency histogram (not cumulative; see [`LAT_BUCKETS`]).
    pub lat: [u64; LAT_BUCKETS + 1],
    pub lat_sum_ns: u64,
}

impl NsTotals {
    pub fn commands(&self) -> u64 {
        self.reads + self.writes + self.others + self.errors
    }
    pub fn add(&mut self, o: &NsTotals) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.others += o.others;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.errors += o.errors;
        for (a, b) in self.lat.iter_mut().zip(o.lat.iter()) {
            *a += b;
        }
        self.lat_sum_ns += o.lat_sum_ns;
    }
}

/// Totals over queues (a controller's, a subsystem's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoTotals {
    /// Commands outstanding now (queue depth in use).
    pub outstanding: u64,
    /// Failed completions by status code (`None`: codes outside generic/command specific
    /// 00h..3Fh).
    pub errors_by_status: BTreeMap<Option<u16>, u64>,
    /// Per namespace ([`NSID_OTHER`]: beyond a queue's namespace slots).
    pub namespaces: BTreeMap<u32, NsTotals>,
}

impl IoTotals {
    pub fn add(&mut self, o: &IoTotals) {
        self.outstanding += o.outstanding;
        for (k, v) in &o.errors_by_status {
            *self.errors_by_status.entry(*k).or_default() += v;
        }
        for (k, v) in &o.namespaces {
            self.namespaces.entry(*k).or_default().add(v);
        }
    }
    pub fn errors(&self) -> u64 {
        self.errors_by_status.values().sum()
    }
    /// Sum over namespaces.
    pub fn io(&self) -> NsTotals {
        let mut t = NsTotals::default();
        for n in self.namespaces.values() {
            t.add(n);
        }
        t
    }
}

/// One controller at scrape time.
#[derive(Debug, Clone)]
pub struct ControllerMetrics {
    pub cntlid: u16,
    pub hostnqn: String,
    pub transport: &'static str,
    pub peer: String,
    pub io: IoTotals,
    /// Live I/O queues: (qid, counters).
    pub queues: Vec<(u16, IoTotals)>,
}

/// One subsystem at scrape time: totals over every controller it has had, and the live ones.
#[derive(Debug, Clone)]
pub struct SubsystemMetrics {
    pub nqn: String,
    pub io: IoTotals,
    pub controllers: Vec<ControllerMetrics>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_powers_of_two_from_16us() {
        assert_eq!(lat_bucket(0), 0);
        assert_eq!(lat_bucket(16_000), 0);
        assert_eq!(lat_bucket(16_001), 1);
        assert_eq!(lat_bucket(32_000), 1);
        assert_eq!(lat_bucket(32_001), 2);
        assert_eq!(lat_bucket(1_048_576_000), 16);
        assert_eq!(lat_bucket(1_048_577_000), LAT_BUCKETS);
        assert_eq!(lat_bucket(u64::MAX), LAT_BUCKETS);
    }

    #[test]
    fn counters_sum_per_namespace_and_status() {
        let c = IoCounters::sized(4);
        c.start(1, 1000);
        c.start(2, 1000);
        assert_eq!(
            {
                let mut t = IoTotals::default();
                c.add_to(&mut t, true);
                t.outstanding
            },
            2
        );
        c.finish(1, 5, IoClass::Read, 0, 4096, 21_000);
        c.finish(2, 6, IoClass::Write, 0x0b, 0, 1_000_000);
        c.error(0x0b);
        c.error(0x4080); // DNR is not part of the code
        c.error(0x280);
        let mut t = IoTotals::default();
        c.add_to(&mut t, true);
        assert_eq!(t.outstanding, 0);
        let n5 = &t.namespaces[&5];
        assert_eq!((n5.reads, n5.bytes_read, n5.errors), (1, 4096, 0));
        assert_eq!(n5.lat[1], 1, "20 us is in the 32 us bucket");
        assert_eq!(n5.lat_sum_ns, 20_000);
        assert_eq!(t.namespaces[&6].errors, 1);
        assert_eq!(t.errors_by_status[&Some(0x0b)], 1);
        assert_eq!(t.errors_by_status[&Some(0x080)], 1, "LBA Out of Range");
        assert_eq!(t.errors_by_status[&None], 1);
        // More namespaces than slots share the last one.
        for nsid in 100..140 {
            c.start(3, 0);
            c.finish(3, nsid, IoClass::Other, 0, 0, 10);
        }
        let mut t = IoTotals::default();
        c.add_to(&mut t, false);
        assert!(t.namespaces.len() <= NS_SLOTS);
        assert!(t.namespaces.contains_key(&NSID_OTHER));
        assert_eq!(
            t.namespaces.values().map(|n| n.others).sum::<u64>(),
            40,
            "nothing is lost"
        );
    }
}
