//! When a poller spins and when it sleeps (`target.polling`).
//!
//! Spinning through an idle gap costs the gap in CPU and adds no latency; sleeping in the
//! kernel costs a wake-up: the time from an event to the poller running again, which is
//! latency the I/O pays and (most of it) CPU the wake-up path burns. So spinning pays only
//! while the gaps between bursts of work are short against a wake-up. The adaptive policy
//! measures both: the wake-up latency once at start ([`measure_wake_latency`]: loopback TCP
//! round trips to a thread that spins, then sleeps, on its socket), and, gap by gap, whether
//! spinning for three wake-ups (at most `idle_poll_us`) caught the next work. While most
//! recent spins did, it spins; once they stop paying it sleeps as soon as a pass finds
//! nothing, and spins through one gap in 16 to notice when the load comes back, one in 32 after
//! that probe missed too, and so on to one in 256 (a probe costs three wake-ups of spinning: at
//! 10k IOPS, one in 16 was a fifth of the CPU per I/O). (The gaps
//! themselves cannot be averaged: a gap that ends in a sleep is longer by the wake-up, which
//! would keep a poller asleep under the very load that made it spin.) `busy` never sleeps,
//! `interrupt` never spins.

use std::time::{Duration, Instant};

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::unistd::Pid;

/// How a poller waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Spin while spinning catches the next work within a few wake-ups, at most `max_spin`.
    Adaptive { max_spin: Duration },
    /// Never sleep.
    Busy,
    /// Never spin: sleep whenever a pass finds nothing.
    Interrupt,
}

/// An adaptive poller spins up to this many wake-up latencies after its last work.
const WINDOW_WAKEUPS: u32 = 3;
/// While spinning does not pay, every this many idle gaps are spun through anyway (a probe:
/// otherwise a poller that sleeps would never see that the gaps became short again); each probe
/// that misses doubles the interval, up to [`PROBE_MAX`].
const PROBE_EVERY: u32 = 16;
const PROBE_MAX: u32 = 256;

/// The spin decision of one poller: spin after work while recent spins caught the next work
/// within the window (a success score, 1/4 per idle gap), sleep at once while they did not;
/// a probe that catches the work turns spinning back on.
#[derive(Debug, Clone)]
pub struct SpinPolicy {
    mode: PollMode,
    /// The measured wake-up latency.
    wake: Duration,
    /// Recent spins that caught the work, out of 256 (exponentially weighted).
    score: u32,
    /// Idle gaps since the last probe (while not spinning), and the gaps between probes now.
    since_probe: u32,
    probe_every: u32,
    /// The idle gap in progress spins (it was given a window).
    spinning: bool,
    /// ... as a probe (spinning did not pay before it).
    probing: bool,
    /// Idle gaps spun through that the spin caught, and that it did not.
    pub caught: u64,
    pub missed: u64,
}

impl SpinPolicy {
    pub fn new(mode: PollMode, wake: Duration) -> SpinPolicy {
        SpinPolicy {
            mode,
            wake,
            score: 256,
            since_probe: 0,
            probe_every: PROBE_EVERY,
            spinning: false,
            probing: false,
            caught: 0,
            missed: 0,
        }
    }

    /// The wake-up latency the policy works with.
    pub fn wake_latency(&self) -> Duration {
        self.wake
    }

    /// Whether spinning pays now (recent spins mostly caught the work).
    pub fn pays(&self) -> bool {
        self.score >= 128
    }

    /// The poller did work and an idle gap may follow: how long to spin through it before
    /// sleeping. `measured`: its wake-ups are the kind measured at start (sockets); with RDMA
    /// connections it sleeps on completion channels, whose wake-ups were not measured and cost
    /// far more on rxe (Linux 6.12 under emulation: I/O 2.5x slower when the poller slept
    /// between commands), so it spins up to `max_spin` as a fixed window.
    pub fn next_window(&mut self, measured: bool) -> Duration {
        let window = match self.mode {
            PollMode::Busy => return Duration::MAX,
            PollMode::Interrupt => return Duration::ZERO,
            PollMode::Adaptive { max_spin } if !measured => {
                self.spinning = false;
                return max_spin;
            }
            PollMode::Adaptive { max_spin } => (self.wake * WINDOW_WAKEUPS).min(max_spin),
        };
        self.probing = !self.pays() && {
            self.since_probe += 1;
            self.since_probe >= self.probe_every
        };
        self.spinning = self.pays() || self.probing;
        if self.spinning {
            self.since_probe = 0;
            window
        } else {
            Duration::ZERO
        }
    }

    /// The idle gap ended with new work; `slept`: the poller blocked in it (its spin, if it
    /// had one, did not catch the work).
    pub fn gap_ended(&mut self, slept: bool) {
        if self.spinning {
            if slept {
                self.missed += 1;
            } else {
                self.caught += 1;
            }
            let hit = if slept { 0 } else { 256 };
            self.score = self.score - self.score / 4 + hit / 4;
            if self.probing && !slept {
                // A probe that caught the work: spinning pays again.
                self.score = 256;
            }
            self.probe_every = if self.pays() {
                PROBE_EVERY
            } else if self.probing {
                (self.probe_every * 2).min(PROBE_MAX)
            } else {
                self.probe_every
            };
        }
    }
}

/// What a sleeping poller pays per wake-up on this machine, measured the way a host's command
/// wakes it: a byte over a loopback TCP connection to a thread that either spins on its socket
/// or sleeps in `epoll_wait` on it, echoed back; the difference of the median round trips
/// (softirq, wake-up and scheduling included). `rounds` round trips each way. A result below
/// [`PLAUSIBLE_WAKE`] is a failed measurement (the spinning phase was slowed, e.g. both threads
/// on one CPU for a while: seen on this shared machine, 1 of 3 starts, and the poller then
/// never spun and lost 40% of its QD1 IOPS) and is measured again, up to 3 times. Falls back to
/// [`DEFAULT_WAKE`] if no measurement holds.
pub fn measure_wake_latency(rounds: usize) -> Duration {
    for attempt in 1..=3 {
        match try_measure(rounds) {
            Ok(d) if d >= PLAUSIBLE_WAKE => return d,
            Ok(d) => {
                tracing::debug!(attempt, measured = ?d, "implausible wake-up latency; measuring again")
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot measure the wake-up latency; assuming 20 us");
                return DEFAULT_WAKE;
            }
        }
    }
    tracing::warn!("no plausible wake-up latency in 3 measurements; assuming 20 us");
    DEFAULT_WAKE
}

/// The least a sleeping thread's wake-up costs on any machine (an epoll wake-up and a context
/// switch): below it the measurement went wrong.
pub const PLAUSIBLE_WAKE: Duration = Duration::from_micros(2);

/// The wake-up latency assumed when it cannot be measured.
pub const DEFAULT_WAKE: Duration = Duration::from_micros(20);

fn try_measure(rounds: usize) -> std::io::Result<Duration> {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    // The two threads on two CPUs (as a host's command reaches a poller: from the softirq of
    // another CPU). Left to the scheduler they sometimes shared one, the spinning side then
    // waited for a context switch per round trip too, and the difference came out at 3 us
    // instead of 19-40 (seen in 3 of 8 starts here): the poller then never spun and lost 40%
    // of its QD1 IOPS.
    let cpus = ProbeCpus::pin();
    let echo_cpu = cpus.as_ref().map(|c| c.echo);
    let l = TcpListener::bind("127.0.0.1:0")?;
    let mut a = TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    b.set_nonblocking(true)?;
    // The echo side: round trips with it spinning on its socket, then with it sleeping in
    // epoll (byte 0 ends a phase).
    let echo = std::thread::Builder::new()
        .name("nvmf-wake-probe".into())
        .spawn(move || -> std::io::Result<()> {
            if let Some(cpu) = echo_cpu {
                let mut set = CpuSet::new();
                if set.set(cpu).is_ok() {
                    // Best effort: an unpinned probe is measured as before.
                    let _ = sched_setaffinity(Pid::from_raw(0), &set);
                }
            }
            let mut b = b;
            let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
            epoll.add(&b, EpollEvent::new(EpollFlags::EPOLLIN, 1))?;
            let mut events = [EpollEvent::empty(); 1];
            for sleeping in [false, true] {
                loop {
                    let mut x = [0u8; 1];
                    match b.read(&mut x) {
                        Ok(0) => return Ok(()),
                        Ok(_) => {
                            b.write_all(&x)?;
                            if x[0] == 0 {
                                break;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if sleeping {
                                match epoll.wait(&mut events, EpollTimeout::from(1000u16)) {
                                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                                    Err(e) => return Err(e.into()),
                                }
                            } else {
                                std::hint::spin_loop();
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok(())
        })?;
    a.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut medians = [Duration::ZERO; 2];
    for (phase, m) in medians.iter_mut().enumerate() {
        let mut rtts = Vec::with_capacity(rounds);
        for i in 0..=rounds {
            if phase == 1 {
                // Let the echo side fall asleep.
                std::thread::sleep(Duration::from_micros(100));
            }
            let t = Instant::now();
            a.write_all(&[if i == rounds { 0 } else { 1 }])?;
            let mut x = [0u8; 1];
            a.read_exact(&mut x)?;
            if i > 0 && i < rounds {
                rtts.push(t.elapsed());
            }
        }
        rtts.sort();
        *m = rtts.get(rtts.len() / 2).copied().unwrap_or_default();
    }
    drop(a);
    echo.join()
        .map_err(|_| std::io::Error::other("the probe thread panicked"))??;
    drop(cpus);
    Ok(medians[1].saturating_sub(medians[0]))
}

/// The calling thread pinned to the first CPU of its set while the wake-up probe runs (the
/// echo thread goes to the second), its own set given back on drop. None with one CPU.
struct ProbeCpus {
    saved: CpuSet,
    echo: usize,
}

impl ProbeCpus {
    fn pin() -> Option<ProbeCpus> {
        let saved = sched_getaffinity(Pid::from_raw(0)).ok()?;
        let mut cpus = (0..CpuSet::count()).filter(|&c| saved.is_set(c).unwrap_or(false));
        let (main, echo) = (cpus.next()?, cpus.next()?);
        let mut set = CpuSet::new();
        set.set(main).ok()?;
        sched_setaffinity(Pid::from_raw(0), &set).ok()?;
        Some(ProbeCpus { saved, echo })
    }
}

impl Drop for ProbeCpus {
    fn drop(&mut self) {
        if let Err(e) = sched_setaffinity(Pid::from_raw(0), &self.saved) {
            tracing::warn!(error = %e, "cannot restore the thread's CPU set after the wake-up probe");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAKE: Duration = Duration::from_micros(10);

    fn adaptive() -> SpinPolicy {
        SpinPolicy::new(
            PollMode::Adaptive {
                max_spin: Duration::from_millis(1),
            },
            WAKE,
        )
    }

    /// One idle gap of `gap` under the policy: whether the poller spun through it, and it
    /// tells the policy how it ended.
    fn gap(p: &mut SpinPolicy, gap: Duration) -> bool {
        let w = p.next_window(true);
        let caught = gap < w;
        p.gap_ended(!caught);
        w > Duration::ZERO
    }

    #[test]
    fn short_gaps_spin_long_gaps_sleep_and_it_follows_the_load() {
        let mut p = adaptive();
        // Saturation at QD1: the next command 13 us after the answer, inside 3 wake-ups.
        for _ in 0..100 {
            assert!(gap(&mut p, Duration::from_micros(13)));
        }
        // 10k IOPS: 100 us gaps. After a few misses it sleeps at once, spinning through only
        // one gap in PROBE_EVERY, then in twice as many after each probe that missed.
        let spun = (0..1000)
            .filter(|_| gap(&mut p, Duration::from_micros(100)))
            .count();
        // 3 misses, then probes after 16, 32, 64, 128, 256 and 256 gaps.
        assert!((6..=3 + 6).contains(&spun), "{spun}");
        assert!(!p.pays());
        // Short gaps again: the next probe finds it, and it spins again.
        let mut n = 0;
        while !p.pays() {
            gap(&mut p, Duration::from_micros(5));
            n += 1;
            assert!(n <= PROBE_MAX, "the policy must follow the load back");
        }
        // A probe that caught resets the interval: long gaps again are probed every 16.
        let spun = (0..3 + PROBE_EVERY as usize)
            .filter(|_| gap(&mut p, Duration::from_micros(100)))
            .count();
        assert_eq!(spun, 4, "3 misses and one probe");
        for _ in 0..30 {
            gap(&mut p, Duration::from_micros(5));
        }
        // One long pause does not undo a run of short gaps.
        for _ in 0..20 {
            gap(&mut p, Duration::from_micros(5));
        }
        gap(&mut p, Duration::from_secs(5));
        assert!(p.pays());
    }

    #[test]
    fn busy_and_interrupt_ignore_the_gaps_and_the_cap_holds() {
        let mut b = SpinPolicy::new(PollMode::Busy, WAKE);
        let mut i = SpinPolicy::new(PollMode::Interrupt, WAKE);
        for g in [1, 1000, 1_000_000] {
            assert!(gap(&mut b, Duration::from_micros(g)));
            assert!(!gap(&mut i, Duration::from_micros(g)));
        }
        let mut p = SpinPolicy::new(
            PollMode::Adaptive {
                max_spin: Duration::from_micros(5),
            },
            WAKE,
        );
        assert_eq!(p.next_window(true), Duration::from_micros(5));
        // Unmeasured wake-ups (RDMA): the whole window, whatever the score.
        let mut p = SpinPolicy::new(
            PollMode::Adaptive {
                max_spin: Duration::from_micros(500),
            },
            WAKE,
        );
        for _ in 0..20 {
            gap(&mut p, Duration::from_millis(1));
        }
        assert!(!p.pays());
        assert_eq!(p.next_window(false), Duration::from_micros(500));
    }

    #[test]
    fn the_wake_latency_is_measured() {
        let d = measure_wake_latency(20);
        assert!(
            d >= PLAUSIBLE_WAKE && d < Duration::from_millis(50),
            "{d:?}"
        );
    }
}
