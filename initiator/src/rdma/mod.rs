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
//!   by a Keyed SGL Data Block descriptor with subtype 0 (type byte `0x40`): the target
//!   RDMA_WRITEs read data into the buffer and RDMA_READs write data out of it, and answers
//!   with a SEND of the CQE. A write that fits the in-capsule limit (`IOCCSZ * 16 - 64`, only
//!   on I/O queues and only when Identify SGLS bit 20 is set, as the Linux host decides) goes
//!   in the capsule instead: one SEND of two SGEs, the SQE and the data.
//! - Subtype `0xF` (remote invalidation) is never used: the keys here come from `ibv_reg_mr`,
//!   which recent rxe refuses to invalidate remotely and siw invalidates silently (see
//!   `shared/notes/rdma-binding.md` section 6). A response that arrives with
//!   `IBV_WC_WITH_INV` anyway is a target bug and fails the queue ("bogus remote
//!   invalidation"); a plain SEND is the normal case.
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
//!
//! # Buffers, copies and the rkey trade-off
//! Each queue has a pool of registered memory ([`RdmaBuf`], from [`crate::Queue::alloc_buf`]):
//! slabs registered once with `LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE`, cut into
//! power-of-two buffers that return to the pool on drop. The asynchronous API takes and gives
//! back these buffers, so its data path copies nothing ([`crate::Stats::memcpy_bytes`] stays 0).
//! The synchronous [`crate::Namespace`] calls and admin commands copy between the caller's
//! slice and a pool buffer once per byte, and count it.
//!
//! **Choice: long-lived registration.** A userspace initiator has no fast registration work
//! requests (FRWR), so this host registers its pool once and names slices of it by the slab's
//! rkey. The price: every slab is open to the target for the queue's life. A target that
//! misbehaves can read or write any pool buffer (including ones the application holds between
//! I/Os) until the queue is dropped, though never memory outside the pool. The alternative,
//! `ibv_reg_mr`/`ibv_dereg_mr` around each I/O, bounds the exposure to one I/O (what the Linux
//! host gets from FRWR) but costs two system calls and a page pin per I/O. Use this initiator
//! with targets you trust with the pool's contents.
//!
//! # Without RDMA
//! On a machine without RDMA devices, connecting fails with [`RdmaError::Verbs`] wrapping
//! `rdma::Error::NoRdma` ("no usable RDMA on this machine ...").

mod error;
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
