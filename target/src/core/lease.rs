//! Until when this target may serve each ANA group, when a gateway group's lease decides it
//! ([`LeaseClock`]). The gateway's member thread moves a group's bound forward with each
//! renewal of the group's lease in RADOS; every command's ANA check reads it. A group whose
//! bound has passed is served as in ANA Change (Asymmetric Access Transition: hosts retry)
//! whatever the listener's state says, until the daemon applies the member's next view. This
//! covers the time the daemon cannot see: a gateway stopped past its lease (SIGSTOP, a long
//! pause) whose peer took the group over and fenced it resumes with its pollers first, and a
//! command queued meanwhile in a socket would otherwise go to the image through the
//! blocklisted client (measured: librbd refuses it at once, which the host sees as Namespace
//! Not Ready and retries on the same path) instead of to the peer that serves the group now.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::ANA_GROUPS;

/// "No lease bounds this group" (a target that is not a gateway, or a group it never held).
const UNBOUNDED: u64 = u64::MAX;

/// Per ANA group, the instant its lease runs out (see the module doc).
#[derive(Debug)]
pub struct LeaseClock {
    epoch: Instant,
    /// Nanoseconds since `epoch`, by ANA group ([`UNBOUNDED`]: no lease).
    until: Box<[AtomicU64]>,
}

impl Default for LeaseClock {
    fn default() -> LeaseClock {
        LeaseClock {
            epoch: Instant::now(),
            until: (0..=ANA_GROUPS)
                .map(|_| AtomicU64::new(UNBOUNDED))
                .collect(),
        }
    }
}

impl LeaseClock {
    /// Group `group` may be served until `until` (a renewal succeeded); `None`: not at all
    /// from now on (the lease was lost or given back).
    pub fn hold_until(&self, group: u32, until: Option<Instant>) {
        let ns = until.map_or(0, |u| {
            u.saturating_duration_since(self.epoch)
                .as_nanos()
                .min(u128::from(UNBOUNDED - 1)) as u64
        });
        if let Some(a) = self.until.get(group as usize) {
            a.store(ns, Ordering::Release);
        }
    }

    /// Whether group `group`'s lease ran out (false for a group no lease bounds). Reads the
    /// clock only for a bounded group.
    pub fn expired(&self, group: u32) -> bool {
        let Some(a) = self.until.get(group as usize) else {
            return false;
        };
        let until = a.load(Ordering::Acquire);
        until != UNBOUNDED && self.epoch.elapsed().as_nanos() >= u128::from(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_group_is_served_until_its_lease_runs_out() {
        let l = LeaseClock::default();
        // No lease: never expired.
        assert!(!l.expired(1));
        l.hold_until(1, Some(Instant::now() + Duration::from_secs(60)));
        assert!(!l.expired(1));
        l.hold_until(1, Some(Instant::now() - Duration::from_millis(1)));
        assert!(l.expired(1));
        l.hold_until(1, None);
        assert!(l.expired(1));
        // Other groups, and groups beyond the table, are untouched.
        assert!(!l.expired(2));
        assert!(!l.expired(ANA_GROUPS + 7));
        l.hold_until(ANA_GROUPS + 7, None);
    }
}
