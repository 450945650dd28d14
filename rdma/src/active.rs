//! Active-side (client) connection setup over rdma_cm, shared by every user that connects:
//! the initiator's queues, its raw bad-input host, the bench's raw-verbs baselines, the
//! target's raw test host and the loopback example.
//!
//! The sequence is that of the Linux host (`nvme_rdma_alloc_queue` /
//! `nvme_rdma_route_resolved`):
//! 1. [`resolve`]: create an id, `rdma_resolve_addr` (repeated in short attempts, see
//!    [`ADDR_ATTEMPT`]), `rdma_resolve_route`, and the device [`Context`] the id is now bound
//!    to, on which the caller creates its PD, CQs and QP ([`crate::Qp::create`]) and posts its
//!    RECVs;
//! 2. [`connect`]: `rdma_connect` and wait for ESTABLISHED, or, when the caller must do
//!    something between the two (accept the request on a listener it runs on the same thread),
//!    [`CmId::connect`] followed by [`wait_established`].
//!
//! Everything is bounded by one `deadline` for the whole setup. Failures are a
//! [`ConnectError`] naming the [`Step`] that failed; a REJECTED answer carries its status and
//! private data so that a protocol above (NVMe/RDMA's CM reject record) can decode it.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cm::{CmEvent, CmEventType, CmId, ConnParam, EventChannel};
use crate::device::Context;
use crate::error::Error;

/// Longest kernel timeout of one address resolution attempt.
///
/// Linux (6.1's `ib_addr`) retries a request whose neighbour is not yet resolved only when a
/// neighbour-update event arrives or at the request's timeout. A peer that answers ARP at once
/// (a veth pair: the reply is processed before the request is queued) raises the update too
/// early to be seen, and the resolution then completes only at its timeout, which would be the
/// connect deadline itself: the connect timed out with the neighbour long resolved. Short
/// attempts, repeated until the deadline, bound that stall to one attempt.
pub const ADDR_ATTEMPT: Duration = Duration::from_secs(1);

/// A step of active connection setup, named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `rdma_resolve_addr` until ADDR_RESOLVED.
    AddrResolution,
    /// `rdma_resolve_route` until ROUTE_RESOLVED.
    RouteResolution,
    /// `rdma_connect` until ESTABLISHED.
    Connect,
}

impl Step {
    /// What the step waits for, as error messages name it (`"rdma_cm address resolution"`,
    /// `"rdma_cm route resolution"`, `"rdma_cm connect"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Step::AddrResolution => "rdma_cm address resolution",
            Step::RouteResolution => "rdma_cm route resolution",
            Step::Connect => "rdma_cm connect",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why active connection setup failed.
///
/// Deliberately exhaustive (unlike [`Error`]): callers translate every outcome into their own
/// terms (an NVMe/RDMA reject reason, a timeout naming the step), and a new outcome must make
/// them decide how.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// An rdma_cm or verbs call failed (including "no usable RDMA on this machine").
    #[error(transparent)]
    Verbs(#[from] Error),
    /// The deadline passed while waiting for the step's event.
    #[error("timed out waiting for {step}")]
    Timeout {
        /// The step that was waiting.
        step: Step,
    },
    /// The step ended with another event than the one it waits for (ADDR_ERROR,
    /// ROUTE_ERROR, UNREACHABLE, CONNECT_ERROR, ...).
    #[error("{step} failed: {event} (status {status})")]
    Event {
        /// The step that failed.
        step: Step,
        /// The event that ended it.
        event: CmEventType,
        /// Its status (see [`CmEvent::status`]).
        status: i32,
    },
    /// The peer (or its connection manager) answered the connect with REJECTED.
    #[error(
        "connection rejected (CM status {status}, {} bytes of private data)",
        private_data.len()
    )]
    Rejected {
        /// The event status: on IB/RoCE the CM reject reason (28 = consumer defined, 8 =
        /// nobody listens), on iWARP a negative errno (siw: `-ECONNRESET`).
        status: i32,
        /// The reject's private data as received (IB pads it to 148 bytes).
        private_data: Vec<u8>,
    },
}

/// Waits for the next event on `ch` until `deadline`.
fn next_event(ch: &EventChannel, deadline: Instant, step: Step) -> Result<CmEvent, ConnectError> {
    let left = deadline.saturating_duration_since(Instant::now());
    ch.get_event(Some(left))?
        .ok_or(ConnectError::Timeout { step })
}

/// Creates an id with `tag` on `ch` and resolves `dst`'s address and route by `deadline`.
/// Returns the id and the device context it is bound to (create the QP's PD and CQs there).
///
/// `rdma_resolve_addr` runs in attempts of at most [`ADDR_ATTEMPT`]: an attempt that times out
/// in the kernel (ADDR_ERROR with `-ETIMEDOUT`) is repeated on the same id until the deadline;
/// any other ADDR_ERROR ends the setup at once. Events on `ch` for other ids must not be
/// pending (the channel belongs to this setup while it runs).
pub fn resolve(
    ch: &EventChannel,
    tag: u64,
    dst: SocketAddr,
    deadline: Instant,
) -> Result<(CmId, Arc<Context>), ConnectError> {
    let id = ch.create_id(tag)?;
    let step = Step::AddrResolution;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ConnectError::Timeout { step });
        }
        id.resolve_addr(None, dst, left.min(ADDR_ATTEMPT))?;
        let ev = next_event(ch, deadline, step)?;
        match ev.event_type() {
            CmEventType::AddrResolved => break,
            CmEventType::AddrError if ev.status() == -libc::ETIMEDOUT => {
                tracing::debug!(tag, %dst, "address resolution attempt timed out; again");
            }
            event => {
                return Err(ConnectError::Event {
                    step,
                    event,
                    status: ev.status(),
                })
            }
        }
    }
    let step = Step::RouteResolution;
    id.resolve_route(deadline.saturating_duration_since(Instant::now()))?;
    let ev = next_event(ch, deadline, step)?;
    if ev.event_type() != CmEventType::RouteResolved {
        return Err(ConnectError::Event {
            step,
            event: ev.event_type(),
            status: ev.status(),
        });
    }
    // A resolved id is bound to a device; none means it went away in between.
    let ctx = id.context()?.ok_or(Error::Verbs {
        call: "rdma_resolve_route",
        errno: libc::ENODEV,
    })?;
    Ok((id, ctx))
}

/// Waits for the answer to an `rdma_connect` on `ch` until `deadline`: the ESTABLISHED event
/// (its private data is the peer's accept data; with a QP on the id, the QP is now in RTS),
/// or [`ConnectError::Rejected`] with the reject's status and private data, or
/// [`ConnectError::Event`] for UNREACHABLE, CONNECT_ERROR and the like.
pub fn wait_established(ch: &EventChannel, deadline: Instant) -> Result<CmEvent, ConnectError> {
    let step = Step::Connect;
    let ev = next_event(ch, deadline, step)?;
    match ev.event_type() {
        CmEventType::Established => Ok(ev),
        CmEventType::Rejected => Err(ConnectError::Rejected {
            status: ev.status(),
            private_data: ev.private_data().to_vec(),
        }),
        event => Err(ConnectError::Event {
            step,
            event,
            status: ev.status(),
        }),
    }
}

/// `rdma_connect` on `id` (an id from [`resolve`] on `ch`, usually with a QP and its RECVs
/// posted) with `param`, then [`wait_established`].
pub fn connect(
    ch: &EventChannel,
    id: &CmId,
    param: &ConnParam<'_>,
    deadline: Instant,
) -> Result<CmEvent, ConnectError> {
    id.connect(param)?;
    wait_established(ch, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_step() {
        let e = ConnectError::Timeout {
            step: Step::AddrResolution,
        };
        assert_eq!(
            e.to_string(),
            "timed out waiting for rdma_cm address resolution"
        );
        let e = ConnectError::Event {
            step: Step::RouteResolution,
            event: CmEventType::RouteError,
            status: -libc::ETIMEDOUT,
        };
        assert_eq!(
            e.to_string(),
            "rdma_cm route resolution failed: RDMA_CM_EVENT_ROUTE_ERROR (status -110)"
        );
        let e = ConnectError::Rejected {
            status: 28,
            private_data: vec![0; 148],
        };
        assert!(e.to_string().contains("CM status 28, 148 bytes"), "{e}");
        assert_eq!(Step::Connect.to_string(), "rdma_cm connect");
    }
}
