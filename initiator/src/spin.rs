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
//! do. [`Spin::always`] spins without bound (the `busy_poll` option, fio's `hipri`).

use std::time::{Duration, Instant};

use nix::poll::PollTimeout;

/// Default spin budget of an I/O queue ([`crate::ConnectOptions::poll_spin`]): the Linux
/// default of `net.core.busy_poll`.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

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

/// One wait's spin window.
#[derive(Debug, Default)]
pub(crate) struct SpinWindow(Option<Instant>);

impl SpinWindow {
    /// Whether the waiter should look again without sleeping. Once the budget is spent this
    /// says no once (the caller sleeps) and starts a new window with the next call.
    pub fn spin(&mut self, p: Spin) -> bool {
        if p.always {
            return true;
        }
        if p.budget.is_zero() {
            return false;
        }
        let now = Instant::now();
        let start = *self.0.get_or_insert(now);
        if now.duration_since(start) < p.budget {
            true
        } else {
            self.0 = None;
            false
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
        let mut w = SpinWindow::default();
        assert!(w.spin(p));
        assert!(w.spin(p));
        std::thread::sleep(Duration::from_millis(25));
        assert!(!w.spin(p), "budget spent: sleep");
        assert!(w.spin(p), "a new window after the sleep");
    }

    #[test]
    fn never_and_always() {
        let mut w = SpinWindow::default();
        assert!(!w.spin(Spin::NEVER));
        let always = Spin {
            budget: Duration::ZERO,
            always: true,
        };
        std::thread::sleep(Duration::from_millis(1));
        assert!(w.spin(always));
    }
}
