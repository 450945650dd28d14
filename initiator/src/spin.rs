//! When a queue that waits for completions looks again at once (spins) and when it sleeps in
//! the kernel: the one policy both transports' queues follow.
//!
//! A wait spins while commands are in flight for at most [`Spin::budget`] since it began (or
//! since the last sleep), then sleeps (`poll(2)` on the socket, or on the RDMA completion
//! channel). A round trip on loopback NVMe/TCP or an RDMA fabric is 5-30 us: within the budget
//! the completion is picked up without a sleep and a wake-up (two context switches, several
//! microseconds, and at QD1 most of the latency). A wait that outlasts it (a slow device, an
//! idle queue) costs one budget of CPU and then sleeps. While completions keep coming (deep
//! queues) every wait ends within the budget, so a busy queue never sleeps, as SPDK's pollers
//! do. [`Spin::always`] spins without bound ([`Polling::Busy`], fio's `hipri`).
//!
//! The budget is also learnt per queue ([`SpinScore`]): once most recent spins ran out without
//! their completion (a slow device, a load far below the queue's pace), waits sleep at once,
//! spinning through one wait in 16 to notice when completions come fast again. NVMe/TCP queues
//! only: an RDMA queue keeps its budget (a sleep on the completion channel costs far more).

use std::time::{Duration, Instant};

use nix::poll::PollTimeout;

/// Default spin budget of an I/O queue ([`crate::ConnectOptions::poll_spin`]): the Linux
/// default of `net.core.busy_poll`.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// How an I/O queue waits for completions ([`crate::ConnectOptions::polling`]): the same three
/// choices as nvmf-target's `target.polling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Polling {
    /// Spin up to [`crate::ConnectOptions::poll_spin`] while commands are in flight, then
    /// sleep; an NVMe/TCP queue whose spins keep running out (a slow device, a load far below
    /// its pace) stops spinning and sleeps at once, probing one wait in 16 (`SpinScore`).
    /// Low latency at QD1, no spinning core at 10k IOPS on a slow namespace.
    #[default]
    Adaptive,
    /// Never sleep while commands are in flight (fio's `hipri`): the lowest latency, a busy core
    /// while I/O is in flight.
    Busy,
    /// Always sleep in the kernel (`poll(2)`, the RDMA completion channel): the fewest CPU
    /// cycles, a wake-up per completion.
    Interrupt,
}

impl std::str::FromStr for Polling {
    type Err = String;

    /// `adaptive`, `busy` or `interrupt` (the names of nvmf-target's `target.polling`).
    fn from_str(s: &str) -> Result<Polling, String> {
        match s {
            "adaptive" => Ok(Polling::Adaptive),
            "busy" => Ok(Polling::Busy),
            "interrupt" => Ok(Polling::Interrupt),
            _ => Err(format!("polling={s}: adaptive, busy or interrupt")),
        }
    }
}

impl Polling {
    /// The wait policy of an I/O queue with spin budget `budget`.
    pub(crate) fn spin(self, budget: Duration) -> Spin {
        match self {
            Polling::Adaptive => Spin {
                budget,
                always: false,
            },
            Polling::Busy => Spin {
                budget,
                always: true,
            },
            Polling::Interrupt => Spin::NEVER,
        }
    }
}

/// A queue's spin policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spin {
    /// Longest spin before sleeping (zero: always sleep).
    pub budget: Duration,
    /// Never sleep.
    pub always: bool,
}

impl Spin {
    /// Always sleep while waiting (the admin queue).
    pub const NEVER: Spin = Spin {
        budget: Duration::ZERO,
        always: false,
    };
}

/// While spinning does not pay, one wait in this many spins anyway (a probe).
const PROBE_EVERY: u16 = 16;

/// Whether spinning pays on a queue: recent waits whose spin caught the completion, out of 256
/// (1/4 per wait that spun). A wait whose budget ran out counts against it; once most do
/// (a slow device, a rate well below what the queue can do), waits sleep at once and one in
/// [`PROBE_EVERY`] spins to notice completions coming fast again. This is what keeps an
/// application doing a few thousand I/Os a second on a slow namespace from spinning a budget
/// per I/O for nothing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpinScore {
    score: u16,
    since_probe: u16,
    probing: bool,
    /// Whether it learns at all (not on links where sleeping costs more: [`crate::Link`]).
    learns: bool,
}

impl Default for SpinScore {
    fn default() -> SpinScore {
        SpinScore::new(true)
    }
}

impl SpinScore {
    pub fn new(learns: bool) -> SpinScore {
        SpinScore {
            score: 256,
            since_probe: 0,
            probing: false,
            learns,
        }
    }

    pub fn pays(&self) -> bool {
        self.score >= 128
    }

    /// A wait is about to spin: whether it may.
    fn start(&mut self) -> bool {
        self.probing = !self.pays() && {
            self.since_probe += 1;
            self.since_probe >= PROBE_EVERY
        };
        if self.probing {
            self.since_probe = 0;
        }
        self.pays() || self.probing
    }

    fn record(&mut self, caught: bool) {
        if !self.learns {
            return;
        }
        let hit = if caught { 256 } else { 0 };
        self.score = self.score - self.score / 4 + hit / 4;
        if self.probing && caught {
            self.score = 256;
        }
        self.probing = false;
    }
}

/// One wait's spin window.
#[derive(Debug, Default)]
pub(crate) struct SpinWindow {
    start: Option<Instant>,
    /// Whether this window may spin (asked of the queue's [`SpinScore`] once per window).
    allowed: Option<bool>,
}

impl SpinWindow {
    /// Whether the waiter should look again without sleeping. Once the budget is spent this
    /// says no once (the caller sleeps; `score` learns the spin did not pay) and starts a new
    /// window with the next call.
    pub fn spin(&mut self, p: Spin, score: &mut SpinScore) -> bool {
        if p.always {
            return true;
        }
        if p.budget.is_zero() {
            return false;
        }
        if !*self.allowed.get_or_insert_with(|| score.start()) {
            self.allowed = None;
            return false;
        }
        let now = Instant::now();
        let start = *self.start.get_or_insert(now);
        if now.duration_since(start) < p.budget {
            true
        } else {
            self.start = None;
            self.allowed = None;
            score.record(false);
            false
        }
    }

    /// The wait ended: a spin in progress caught what it waited for.
    pub fn finish(&mut self, score: &mut SpinScore) {
        if self.start.take().is_some() && self.allowed.take() == Some(true) {
            score.record(true);
        }
    }
}

/// The `poll(2)` timeout of a sleep until `wake`: whole milliseconds, at least 1 (a sleep that
/// returned at once would make the caller spin).
pub(crate) fn poll_timeout(wake: Instant) -> PollTimeout {
    let ms = wake
        .saturating_duration_since(Instant::now())
        .as_millis()
        .clamp(1, i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_within_the_budget_then_sleeps_once_then_spins_again() {
        let p = Spin {
            budget: Duration::from_millis(20),
            always: false,
        };
        let mut s = SpinScore::default();
        let mut w = SpinWindow::default();
        assert!(w.spin(p, &mut s));
        assert!(w.spin(p, &mut s));
        std::thread::sleep(Duration::from_millis(25));
        assert!(!w.spin(p, &mut s), "budget spent: sleep");
        assert!(w.spin(p, &mut s), "a new window after the sleep");
    }

    #[test]
    fn never_and_always() {
        let mut s = SpinScore::default();
        let mut w = SpinWindow::default();
        assert!(!w.spin(Spin::NEVER, &mut s));
        let always = Spin {
            budget: Duration::ZERO,
            always: true,
        };
        std::thread::sleep(Duration::from_millis(1));
        assert!(w.spin(always, &mut s));
    }

    /// Waits whose spins keep running out stop spinning (but for a probe in 16); a probe that
    /// catches its completion turns spinning back on.
    #[test]
    fn spinning_stops_where_it_does_not_pay_and_comes_back() {
        let p = Spin {
            budget: Duration::from_micros(200),
            always: false,
        };
        let mut s = SpinScore::default();
        // Slow completions: every spin runs out.
        let mut spun = 0;
        for _ in 0..64 {
            let mut w = SpinWindow::default();
            if w.spin(p, &mut s) {
                spun += 1;
                std::thread::sleep(Duration::from_micros(300));
                assert!(!w.spin(p, &mut s));
            }
            w.finish(&mut s);
        }
        assert!(!s.pays());
        assert!(spun <= 3 + 64 / PROBE_EVERY as usize, "{spun} waits spun");
        // Fast completions again: the next probe catches one.
        let mut n = 0;
        while !s.pays() {
            let mut w = SpinWindow::default();
            let _ = w.spin(p, &mut s);
            w.finish(&mut s);
            n += 1;
            assert!(n <= PROBE_EVERY, "spinning must come back");
        }
    }
}
