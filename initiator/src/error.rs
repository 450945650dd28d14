//! Errors of the initiator library.
//!
//! [`Error`] is for the caller's operation (connect, an admin command, a queue that died).
//! [`CmdError`] is the outcome of one command in a [`crate::Completion`]: small and `Copy`,
//! so a failed queue can hand one to every command it was holding.

use std::sync::Arc;
use std::time::Duration;

use nvme::tcp::TcpError;
use nvme::Status;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A socket operation failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A wait exceeded the configured timeout.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
    /// The target closed the connection.
    #[error("connection closed by the target")]
    Closed,
    /// The target broke the NVMe/TCP protocol (we sent it an H2CTermReq and closed).
    #[error("NVMe/TCP protocol error: {0}")]
    Protocol(#[from] TcpError),
    /// The target ended the connection with a C2HTermReq.
    #[error("target terminated the connection: FES {fes:#x}, FEI {fei}")]
    TermReq { fes: u16, fei: u32 },
    /// The target completed a command with an error status.
    #[error("{what} failed: {status}")]
    Status { what: &'static str, status: Status },
    /// A command failed without an NVMe status (data digest, short transfer, queue failure).
    #[error("{what} failed: {err}")]
    Command { what: &'static str, err: CmdError },
    /// The controller answered, but with something this host cannot use.
    #[error("controller not usable: {0}")]
    Controller(String),
    /// A caller-supplied argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Every tag of the queue is in use.
    #[error("queue is full")]
    QueueFull,
    /// The queue failed earlier; it must be dropped (and the controller reconnected).
    #[error("queue {qid} failed: {cause}")]
    QueueFailed { qid: u16, cause: Arc<Error> },
    /// In-band authentication (DH-HMAC-CHAP) of queue `qid` failed at `step` (`connect`: the
    /// controller asks for it and no secret was given; `challenge`, `reply` (the controller
    /// refused the host's response: Failure1), `success1` (the controller's own response did
    /// not check out)). `detail` says why; it never holds key material. A transport failure
    /// during the transaction is reported as itself, not as this.
    #[error("authentication failed on queue {qid} at {step}: {detail}")]
    Auth {
        qid: u16,
        step: &'static str,
        detail: String,
    },
    /// The TLS channel of an NVMe/TCP queue could not be set up (the handshake failed: a
    /// wrong key, a target without this host's key, or one without TLS). Never holds a key.
    #[error("TLS: {0}")]
    Tls(String),
    /// Something this build or this controller does not offer (a command the controller does
    /// not report in ONCS/FUSES, secure channel concatenation).
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// An NVMe/RDMA connection or queue failed (verbs, rdma_cm, work completions).
    #[error("NVMe/RDMA: {0}")]
    Rdma(#[from] crate::rdma::RdmaError),
    /// A one-path [`crate::Namespace`] or a [`crate::ReconnectingQueue`] could not get its
    /// connection back within its [`crate::ReconnectPolicy`]; `cause` is the last failure (the
    /// command's, or the last connection attempt's).
    #[error("gave up reconnecting after {attempts} attempts in {elapsed:?}: {cause}")]
    ReconnectGaveUp {
        attempts: u32,
        elapsed: Duration,
        cause: Arc<Error>,
    },
    /// A multipath [`crate::Namespace`] call (or its opening) found no path it could use
    /// within its wait (ANATT, or [`crate::MultipathOptions::no_path_timeout`]); `paths`
    /// names every path, its connection and ANA state and its last error.
    #[error("{what}: no usable path after {waited:?}: {paths}")]
    NoUsablePath {
        what: &'static str,
        waited: Duration,
        paths: String,
    },
}

impl Error {
    /// The NVMe status, when the target answered with one.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Status { status, .. } => Some(*status),
            Error::Command {
                err: CmdError::Status(s),
                ..
            } => Some(*s),
            _ => None,
        }
    }

    pub(crate) fn from_cmd(what: &'static str, err: CmdError) -> Error {
        match err {
            CmdError::Status(status) => Error::Status { what, status },
            err => Error::Command { what, err },
        }
    }
}

/// How one command ended when it did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmdError {
    /// The target's completion status.
    #[error("{0}")]
    Status(Status),
    /// Read data arrived with a bad data digest (the NVMe/TCP spec's Transient Transport Error).
    #[error("data digest mismatch")]
    DataDigest,
    /// The target reported success but sent less read data than asked for.
    #[error("target completed the read without sending all of its data")]
    ShortTransfer,
    /// The queue failed (connection closed, protocol error) while the command was in flight.
    #[error("queue failed while the command was in flight")]
    QueueFailed,
    /// The command exceeded the I/O timeout; the queue was torn down.
    #[error("command timed out")]
    Timeout,
}

impl From<rdma::Error> for Error {
    fn from(e: rdma::Error) -> Error {
        Error::Rdma(crate::rdma::RdmaError::Verbs(e))
    }
}
