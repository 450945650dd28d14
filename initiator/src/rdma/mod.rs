//! NVMe/RDMA (NVMe-oF 1.1 RDMA transport binding) for the initiator, on the `rdma` crate's
//! verbs and rdma_cm owner types.
//!
//! [`crate::Controller::connect`] with [`crate::Transport::Rdma`] (or
//! [`crate::ConnectOptions::rdma`]) runs the same bring-up as over TCP; only the queues differ.
//! [`crate::discover_with`] works over RDMA the same way (`nvme discover -t rdma`).
//!
//! # Connection (per queue, as `drivers/nvme/host/rdma.c` does)
//! An rdma_cm id on its own event channel resolves the address and route; the QP gets a CQ of
//! its own (with a completion channel) and one 16-byte RECV per response it can receive
//! (depth + 1) *before* `rdma_connect`. The CM request carries the NVMe/RDMA private data
//! (recfmt 0, qid, hrqsize = depth + 1, hsqsize = depth, cntlid on I/O queues) with
//! `responder_resources = max_qp_rd_atom`, `initiator_depth = 0`, retry and RNR retry 7. A
//! REJECTED event's private data becomes [`RdmaError::Rejected`] with the NVMe/RDMA status.
//! The Fabrics Connect capsule then goes by SEND, its 1024 bytes of data named by a keyed SGL
//! (or in the capsule on I/O queues when the controller allows it).
//!
//! # Data path
//! - Every command is one signaled SEND of its 64-byte SQE from a per-tag slot. Data is named
//!   by a Keyed SGL Data Block descriptor: the target RDMA_WRITEs read data into the buffer and
//!   RDMA_READs write data out of it, and answers with a SEND of the CQE. A write that fits the
//!   in-capsule limit (`IOCCSZ * 16 - 64`, only on I/O queues and only when Identify SGLS bit
//!   20 is set, as the Linux host decides) goes in the capsule instead: one SEND of two SGEs,
//!   the SQE and the data.
//! - The key in the descriptor opens that buffer, with the one right the command needs
//!   (`REMOTE_WRITE` for a read, `REMOTE_READ` for a write), for that command only (see
//!   "Keys" below). A response with `IBV_WC_WITH_INV` must name the command's own window key;
//!   anything else is a target bug and fails the queue ("bogus remote invalidation").
//! - A command ends when both its SEND's completion and its response have been seen, in either
//!   order (the command state machine the queue keeps for both transports). A RECV is reposted
//!   before the command it answered completes, so there is always one waiting for every
//!   response the target may send; a send-queue credit per command keeps the SQ from
//!   overflowing.
//! - Waits poll the CQ; a queue that does not busy-poll sleeps on its completion channel and
//!   its rdma_cm channel together, after its spin budget. Every command has a deadline
//!   ([`crate::ConnectOptions::timeout`]): a dead target fails the queue instead of hanging it.
//!   Any rdma_cm event after ESTABLISHED (DISCONNECTED, DEVICE_REMOVAL, ADDR_CHANGE,
//!   TIMEWAIT_EXIT) fails the queue as well. A failing or dropped queue moves its QP to the
//!   error state and reaps the flushed work requests before buffers are handed back.
//! - On iWARP a new queue without a response 1 s after connecting sends one zero-length RDMA
//!   WRITE: Linux's siw can leave a connection's first capsule unread in the target's socket
//!   until more data arrives (DESIGN.md, "A first capsule left unread").
//!
//! # Buffers and copies
//! Each queue has a pool of registered memory ([`RdmaBuf`], from [`crate::Queue::alloc_buf`]):
//! slabs registered once for local access only, cut into power-of-two buffers that return to
//! the pool on drop. The asynchronous API takes and gives back these buffers, so its data path
//! copies nothing ([`crate::Stats::memcpy_bytes`] stays 0). The synchronous
//! [`crate::Namespace`] calls and admin commands copy between the caller's slice and a pool
//! buffer once per byte, and count it.
//!
//! # Keys: a buffer is open to the target only while its command runs
//! No key of a pool slab opens anything to the target. A command opens its own buffer, as the
//! Linux host does with fast registration (FRWR), in one of two ways chosen per queue at
//! connect time ([`crate::RdmaQueue::key_mode`]): memory windows where the device has them and
//! is not rxe (mlx5), else a registration per command (rxe, siw). `NVMF_RDMA_KEYS` overrides
//! the choice: `windows` (wherever the device has them, rxe too), `register` (everywhere) or
//! `auto` (the default). rxe gets registrations by default because Linux 6.1's rxe replays
//! binds: when it retransmits, `req_retry` rewinds to the oldest unacknowledged work request
//! and the requester runs every local operation after it again, and a second bind of a bound
//! window fails with MW_BIND_ERR and fails the queue (seen once in three CI runs of a loaded
//! test VM: a 2 s stall, the retransmission timeout, then the error).
//! - **Memory windows** (devices with type 2B windows: mlx5, rxe). Each tag has a window. The
//!   post that sends the command first binds the tag's window over the buffer with a fresh key
//!   (the low byte rotates), so the SEND that names the key reaches the target only once the
//!   key is valid; the descriptor has subtype `0xF`, asking the target to invalidate the key
//!   with its response (SEND_WITH_INV: nvmet, SPDK and nvmf-target on RoCE do). When the
//!   response comes as a plain SEND, the queue posts a LOCAL_INV and completes the command only
//!   when it has completed. Cost: a bind work request per command (no system call), and a
//!   LOCAL_INV when the target does not invalidate. [`crate::Stats`] counts binds and both
//!   kinds of invalidation. rxe reports the target's invalidation in a bit of its own
//!   ([`rdma::WorkCompletion::rxe_invalidated_rkey`]; read only on rxe, and
//!   believed only when it names the command's key: other providers may use that bit for
//!   checksum offload), and rxe in Linux 6.1 crashes the
//!   kernel on a LOCAL_INV of a window that is already invalid (`rxe_invalidate_mw` puts the
//!   NULL region of an unbound window; seen in the test VM): the queue posts a LOCAL_INV only
//!   for a key no response invalidated, and a response flagged (the standard way) as
//!   invalidating a key its command did not name fails the queue before anything else is
//!   posted. (rxe's own bit cannot tell another key's invalidation from nothing: on rxe a
//!   target that invalidates keys it was not given can still reach that kernel bug.)
//! - **A registration per command** (devices without windows, siw, and rxe). The
//!   buffer is registered
//!   on its own (`ibv_reg_mr`) when the command is posted and deregistered when its response
//!   arrives; the descriptor has subtype 0 (recent rxe refuses to invalidate a user MR
//!   remotely and libsiw reports no invalidation; `shared/notes/rdma-binding.md` section 6).
//!   Cost: two system calls per command with data.
//!
//! Either way the key is dead before the buffer is handed back, or the queue has moved its QP
//! to the error state (a failing or dropped queue), which no key reaches through. So the bytes
//! of an [`RdmaBuf`] the application holds change only when the application writes them, and
//! the buffer hands out plain slices soundly.
//!
//! # Without RDMA
//! On a machine without RDMA devices, connecting fails with [`RdmaError::Verbs`] wrapping
//! `rdma::Error::NoRdma` ("no usable RDMA on this machine ...").

mod error;
mod ledger;
mod pool;
mod queue;
#[cfg(feature = "raw")]
pub mod raw;

pub use error::RdmaError;
pub use pool::{RdmaBuf, RegisteredBuf, MAX_BUF};
pub use queue::RdmaLink;

/// Fail early and clearly when the machine has no RDMA device (librdmacm would otherwise
/// report the same thing less directly, as an address-resolution failure).
pub(crate) fn check_devices() -> Result<(), crate::Error> {
    if rdma::devices()?.is_empty() {
        return Err(rdma::Error::NoRdma {
            call: "ibv_get_device_list",
            errno: libc::ENODEV,
        }
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::RdmaError;
    use crate::{discover_with, ConnectOptions, Controller, Error};

    fn has_rdma() -> bool {
        rdma::devices().is_ok_and(|d| !d.is_empty())
    }

    /// On a machine without RDMA (this project's build hosts) connecting says so; on one with
    /// RDMA (the VM), connecting where nothing listens fails within the timeout. Either way it
    /// is an error naming the cause, never a hang or a panic.
    #[test]
    fn connect_without_a_peer_fails_clearly() {
        let mut o = ConnectOptions::rdma("127.0.0.1", 4, "nqn.2026-11.io.nvmf-rs:nobody");
        o.timeout = Duration::from_secs(5);
        let t = Instant::now();
        let e = Controller::connect(o.clone()).unwrap_err();
        let d = discover_with(&o).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
        if has_rdma() {
            for e in [&e, &d] {
                assert!(
                    matches!(
                        e,
                        Error::Rdma(RdmaError::Rejected { .. } | RdmaError::Cm { .. })
                            | Error::Timeout(..)
                    ),
                    "{e}"
                );
            }
        } else {
            for e in [&e, &d] {
                assert!(
                    matches!(e, Error::Rdma(RdmaError::Verbs(rdma::Error::NoRdma { .. }))),
                    "{e:?}"
                );
                let s = e.to_string();
                assert!(
                    s.starts_with("NVMe/RDMA: no usable RDMA on this machine"),
                    "{s}"
                );
            }
        }
    }
}
