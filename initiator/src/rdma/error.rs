//! What can go wrong on an NVMe/RDMA queue, beyond what [`crate::Error`] already names.

use nvme::rdma::{CmReject, CmStatus};
use rdma::{CmEventType, WcStatus};

/// An NVMe/RDMA failure: a verbs call, the connection manager, a work completion, or a target
/// breaking the NVMe/RDMA binding. Wrapped in [`crate::Error::Rdma`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    /// A verbs or rdma_cm call failed (this includes "no usable RDMA on this machine").
    #[error(transparent)]
    Verbs(#[from] rdma::Error),
    /// The target rejected the connection request.
    #[error("queue {qid}: connection rejected: {detail}")]
    Rejected {
        qid: u16,
        /// The NVMe/RDMA reason from the reject's private data, when it carried one.
        status: Option<CmStatus>,
        detail: String,
    },
    /// Address/route resolution or the connection failed with an rdma_cm event.
    #[error("queue {qid}: {during} failed: {event} (status {status})")]
    Cm {
        qid: u16,
        during: &'static str,
        event: CmEventType,
        status: i32,
    },
    /// A work request completed with an error status (the QP is in error from then on).
    #[error("queue {qid}: {op} completed with {status} (vendor error {vendor_err:#x})")]
    Completion {
        qid: u16,
        op: &'static str,
        status: WcStatus,
        vendor_err: u32,
    },
    /// rdma_cm reported the end of the connection (the target disconnected or went away).
    #[error("queue {qid}: connection ended ({event})")]
    Disconnected { qid: u16, event: CmEventType },
    /// The target broke the NVMe/RDMA binding (short CQE, unknown command identifier, a remote
    /// invalidation nobody asked for).
    #[error("queue {qid}: {msg}")]
    Protocol { qid: u16, msg: String },
}

/// rdma_cm's reject reason for "consumer defined" on IB/RoCE (`IB_CM_REJ_CONSUMER_DEFINED`).
const IB_REJ_CONSUMER_DEFINED: i32 = 28;
/// rdma_cm's reject reason for "no listener on that service ID" on IB/RoCE
/// (`IB_CM_REJ_INVALID_SERVICE_ID`).
const IB_REJ_INVALID_SERVICE_ID: i32 = 8;

/// Turns a REJECTED event (its status and private data) into an error. The target's
/// NVMe/RDMA reason comes in the private data ([`CmReject`], padded to 148 bytes on IB/RoCE);
/// a reject from the CM itself (nobody listening) carries none.
pub(crate) fn rejected(qid: u16, cm_status: i32, private_data: &[u8]) -> RdmaError {
    let rej = CmReject::decode(private_data).filter(|r| r.recfmt == nvme::rdma::RECFMT_1_0);
    let status = rej.and_then(|r| r.status());
    let detail = match (status, rej) {
        (Some(s), Some(r)) => format!("{s} (NVMe/RDMA CM status {}, CM status {cm_status})", r.sts),
        (None, Some(r)) if r.sts != 0 => format!(
            "unknown NVMe/RDMA CM status {:#x} (CM status {cm_status})",
            r.sts
        ),
        _ if cm_status == IB_REJ_INVALID_SERVICE_ID || cm_status == -libc::ECONNREFUSED => {
            format!("nothing listens on that port (CM status {cm_status})")
        }
        _ if cm_status == IB_REJ_CONSUMER_DEFINED => {
            format!("by the target, without an NVMe/RDMA reason (CM status {cm_status})")
        }
        _ => format!("by the connection manager (CM status {cm_status}), no NVMe/RDMA reason"),
    };
    RdmaError::Rejected {
        qid,
        status,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::queue::connect_error;
    use rdma::active::ConnectError;
    use std::time::Duration;

    #[test]
    fn reject_reasons_are_decoded() {
        // nvmet on RoCE: consumer-defined reject, 4 bytes of NVMe/RDMA data padded to 148.
        let mut pd = [0u8; 148];
        pd[..4].copy_from_slice(&CmReject::new(CmStatus::InvalidHsqsize).encode());
        let e = rejected(0, 28, &pd);
        match &e {
            RdmaError::Rejected { qid: 0, status, .. } => {
                assert_eq!(*status, Some(CmStatus::InvalidHsqsize))
            }
            other => panic!("{other:?}"),
        }
        let s = e.to_string();
        assert!(
            s.contains("invalid host SQ size") && s.contains("status 4"),
            "{s}"
        );

        // siw: the data as sent, a negative errno as the status.
        let e = rejected(
            3,
            -libc::ECONNRESET,
            &CmReject::new(CmStatus::NoRsc).encode(),
        );
        assert!(e.to_string().contains("no resources"), "{e}");

        // Nobody listening: no private data.
        let e = rejected(0, 8, &[]);
        assert!(matches!(e, RdmaError::Rejected { status: None, .. }));
        assert!(e.to_string().contains("nothing listens"), "{e}");
        // Zero padding without a status is not a reason.
        let e = rejected(0, 28, &[0u8; 148]);
        assert!(e.to_string().contains("without an NVMe/RDMA reason"), "{e}");
        // An undefined status is shown raw.
        let e = rejected(0, 28, &[0, 0, 0x42, 0]);
        assert!(e.to_string().contains("0x42"), "{e}");
    }

    #[test]
    fn connect_errors_keep_their_messages() {
        use rdma::active::Step;
        let t = Duration::from_secs(5);
        let e = connect_error(
            2,
            t,
            ConnectError::Timeout {
                step: Step::AddrResolution,
            },
        );
        assert_eq!(
            e.to_string(),
            "timed out after 5s waiting for rdma_cm address resolution"
        );
        let e = connect_error(
            2,
            t,
            ConnectError::Event {
                step: Step::RouteResolution,
                event: CmEventType::RouteError,
                status: -libc::ETIMEDOUT,
            },
        );
        assert_eq!(
            e.to_string(),
            "NVMe/RDMA: queue 2: rdma_cm route resolution failed: \
             RDMA_CM_EVENT_ROUTE_ERROR (status -110)"
        );
        let mut pd = vec![0u8; 148];
        pd[..4].copy_from_slice(&CmReject::new(CmStatus::InvalidHsqsize).encode());
        let e = connect_error(
            3,
            t,
            ConnectError::Rejected {
                status: 28,
                private_data: pd,
            },
        );
        match e {
            crate::Error::Rdma(RdmaError::Rejected {
                qid: 3,
                status: Some(CmStatus::InvalidHsqsize),
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }
}
