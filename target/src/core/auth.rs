//! In-band authentication (DH-HMAC-CHAP, NVMe Base 2.0 8.13) of a queue: Authentication
//! Send / Receive drive an [`nvme::auth::ControllerTxn`]; until a transaction succeeds, the
//! queue of a host that has a key carries nothing else.
//!
//! A host with a key gets AUTHREQ.ATR in the Connect response of its admin queue and of every
//! I/O queue. Before it has authenticated there, every other command fails with Authentication
//! Required (DNR). A failure is told to the host first (Failure1, on the Receive that follows)
//! and the queue is torn down [`FAILURE_GRACE`] later, or as soon as the host disconnects: a
//! refused host learns it at once over both transports, where tearing down first would leave
//! it waiting for a timeout. A transaction that does not finish within the target's
//! `auth_timeout` tears the queue down too (the admin queue's controller with it). A Negotiate
//! on an authenticated queue starts re-authentication with the keys configured now (a reload
//! rotates keys without dropping authenticated controllers).

use std::time::{Duration, Instant};

use nvme::auth::{failure, ControllerTxn, CtrlStep, SECP_DHCHAP, SPSP0, SPSP1};
use nvme::fabrics::AuthCmd;
use nvme::opcode::fctype;
use nvme::{Sqe, Status};
use rand::RngCore;

use super::controller::Gone;
use super::queue::{loc, Link, Outcome, Parsed, Reject};
use super::{Queue, QueueEvent};

/// How long after a failed transaction the queue is torn down if the host does not disconnect
/// first: time for the Failure1 to reach it (its RDMA SEND to complete).
pub(crate) const FAILURE_GRACE: Duration = Duration::from_millis(500);

/// The largest Authentication Send payload taken (a Reply with SHA-512 and ffdhe8192 is
/// 16 + 2 x 64 + 1024 bytes) and the largest Receive allocation served.
const MAX_SEND: u32 = 4096;
const MAX_RECEIVE: u32 = 8192;

/// Where a queue is with authentication.
#[derive(Debug, Default)]
pub(crate) enum QueueAuth {
    /// The host has no key here: nothing to do (Authentication Send/Receive are refused).
    #[default]
    NotRequired,
    /// The host must authenticate (or is re-authenticating).
    Required {
        /// The transaction in progress; `None` before the first Negotiate.
        txn: Option<Box<ControllerTxn>>,
        /// A transaction succeeded on this queue: it carries commands.
        authenticated: bool,
        /// When the transaction in progress must have ended.
        deadline: Option<Instant>,
    },
    /// A transaction failed: the host may still read its Failure1 (if not sent yet); the
    /// queue is torn down at `at`.
    Failed {
        at: Instant,
        failure1: Option<Vec<u8>>,
    },
    /// Torn down for authentication: nothing more to do.
    TornDown,
}

impl QueueAuth {
    /// A queue of a host that must authenticate, connected at `now`.
    pub(crate) fn required(now: Instant, timeout: Duration) -> QueueAuth {
        QueueAuth::Required {
            txn: None,
            authenticated: false,
            deadline: Some(now + timeout),
        }
    }

    /// Whether commands other than authentication may run.
    pub(crate) fn open(&self) -> bool {
        match self {
            QueueAuth::NotRequired => true,
            QueueAuth::Required { authenticated, .. } => *authenticated,
            QueueAuth::Failed { .. } | QueueAuth::TornDown => false,
        }
    }

    /// The next instant the queue must look at its authentication.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self {
            QueueAuth::NotRequired | QueueAuth::TornDown => None,
            QueueAuth::Required { deadline, .. } => *deadline,
            QueueAuth::Failed { at, .. } => Some(*at),
        }
    }
}

/// Bytes as lower-case hex, for trace lines.
struct Hex<'a>(&'a [u8]);

impl std::fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

fn random(buf: &mut [u8]) {
    rand::rng().fill_bytes(buf)
}

fn failure1(t_id: u16, explanation: u8) -> Vec<u8> {
    nvme::auth::Failure::new(t_id, explanation).encode(nvme::auth::id::FAILURE1)
}

/// Copies `msg` to the start of the host's buffer and zeroes the rest (the whole allocation
/// goes back, as nvmet sends it).
fn deliver(buf: &mut [u8], msg: &[u8]) -> Result<Outcome, Reject> {
    if msg.len() > buf.len() {
        // The host's buffer cannot hold the message (nvmet: Internal Error).
        return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW11));
    }
    buf[..msg.len()].copy_from_slice(msg);
    buf[msg.len()..].fill(0);
    Ok(Outcome::data(buf.len() as u32))
}

impl Queue {
    /// Parse Authentication Send / Receive (fabrics types 05h / 06h) on a connected queue.
    pub(super) fn parse_auth(&mut self, sqe: &Sqe) -> Result<Parsed, Reject> {
        if matches!(self.auth, QueueAuth::NotRequired | QueueAuth::TornDown) {
            // Authentication is not configured for this host: not offered (as before).
            return Err(Reject::dnr(Status::INVALID_OPCODE, loc::NSID));
        }
        let c = AuthCmd::from_sqe(sqe);
        if c.secp != SECP_DHCHAP || c.spsp0 != SPSP0 || c.spsp1 != SPSP1 {
            return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10));
        }
        match sqe.fctype() {
            fctype::AUTH_SEND if (1..=MAX_SEND).contains(&c.len) => {
                Ok(Parsed::from_host(c.len, loc::CDW11))
            }
            fctype::AUTH_RECV if (1..=MAX_RECEIVE).contains(&c.len) => {
                Ok(Parsed::to_host(c.len, loc::CDW11))
            }
            _ => Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW11)),
        }
    }

    /// Whether a command may run on this queue as far as authentication goes: fabrics
    /// Authentication Send / Receive always, anything else once authenticated.
    pub(super) fn auth_gate(&self, sqe: &Sqe) -> Result<(), Reject> {
        if self.auth.open()
            || (sqe.is_fabrics() && matches!(sqe.fctype(), fctype::AUTH_SEND | fctype::AUTH_RECV))
        {
            Ok(())
        } else {
            Err(Reject::dnr(Status::AUTH_REQUIRED, loc::OPCODE))
        }
    }

    /// A Connect succeeded for `hostnqn`: whether this queue must authenticate (the Connect
    /// response's AUTHREQ.ATR).
    pub(super) fn auth_on_connect(&mut self, hostnqn: &str, now: Instant) -> bool {
        let required = self
            .ctrl()
            .is_some_and(|c| c.subsys.host_auth(hostnqn).is_some());
        if required && self.over_generated_psk() {
            // The channel's key came from this host's authentication (secure channel
            // concatenation): not asked again; the host may re-authenticate (a replacement key).
            self.auth = QueueAuth::Required {
                txn: None,
                authenticated: true,
                deadline: None,
            };
            return false;
        }
        self.auth = if required {
            QueueAuth::required(now, self.target.inner().params.auth_timeout)
        } else {
            QueueAuth::NotRequired
        };
        required
    }

    /// Log a failed transaction and fail the queue; `failure1` still to be read by the host.
    fn auth_failed(
        &mut self,
        f: &nvme::auth::AuthFailure,
        failure1: Option<Vec<u8>>,
        now: Instant,
    ) {
        if let Some(ctrl) = self.ctrl() {
            // The reason, never the key.
            tracing::warn!(cntlid = ctrl.cntlid, qid = self.qid, host = %ctrl.hostnqn,
                subsys = %ctrl.subsys.nqn, peer = %self.peer, step = f.step,
                explanation = nvme::auth::explain(f.explanation), reason = %f.detail,
                "authentication failed: the queue is torn down");
        }
        self.auth = QueueAuth::Failed {
            at: now + FAILURE_GRACE,
            failure1,
        };
    }

    pub(super) fn exec_auth(
        &mut self,
        sqe: &Sqe,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<Outcome, Reject> {
        let timeout = self.target.inner().params.auth_timeout;
        let Some(ctrl) = self.ctrl().cloned() else {
            return Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::OPCODE));
        };
        let send = sqe.fctype() == fctype::AUTH_SEND;
        // A Negotiate starts a transaction (with the keys configured now, and the secure
        // channel concatenation this queue takes).
        let negotiate =
            send && buf.len() >= 8 && buf[0] == nvme::auth::AUTH_COMMON_MESSAGES && buf[1] == 0;
        let concat = if negotiate {
            self.concat_allowed()
        } else {
            nvme::auth::secp::NOSC
        };
        let (txn, authenticated, deadline) = match &mut self.auth {
            QueueAuth::Required {
                txn,
                authenticated,
                deadline,
            } => (txn, authenticated, deadline),
            QueueAuth::Failed { failure1, .. } if !send => {
                return match failure1.take() {
                    Some(m) => deliver(buf, &m),
                    None => Err(Reject::dnr(Status::AUTH_REQUIRED, loc::OPCODE)),
                };
            }
            _ => return Err(Reject::dnr(Status::AUTH_REQUIRED, loc::OPCODE)),
        };
        if negotiate {
            // A Negotiate starts a transaction, with the keys configured now.
            match ctrl.subsys.host_auth(&ctrl.hostnqn) {
                Some((keys, policy)) => {
                    *txn = Some(Box::new(
                        ControllerTxn::new(
                            policy,
                            keys.host,
                            keys.ctrl,
                            &ctrl.hostnqn,
                            &ctrl.subsys.nqn,
                        )
                        .with_concat(concat),
                    ))
                }
                // A reload took the host's keys (or the host) away: the transaction fails, and
                // the Receive that follows gets the Failure1.
                None => {
                    let t_id = u16::from_le_bytes([buf[4], buf[5]]);
                    let f = nvme::auth::AuthFailure {
                        step: "negotiate",
                        explanation: failure::FAILED,
                        detail: "the host has no key here any more".into(),
                    };
                    self.auth_failed(&f, Some(failure1(t_id, f.explanation)), now);
                    return Ok(Outcome::ok());
                }
            }
        }
        let Some(t) = txn.as_mut() else {
            // Anything but a Negotiate first: the transaction fails; a Send's Failure1 answers
            // the Receive that follows.
            let t_id = if buf.len() >= 6 {
                u16::from_le_bytes([buf[4], buf[5]])
            } else {
                0
            };
            let f = nvme::auth::AuthFailure {
                step: "negotiate",
                explanation: failure::INCORRECT_MESSAGE,
                detail: "the transaction did not start with a Negotiate".into(),
            };
            let m = failure1(t_id, f.explanation);
            return if send {
                self.auth_failed(&f, Some(m), now);
                Ok(Outcome::ok())
            } else {
                let out = deliver(buf, &m)?;
                self.auth_failed(&f, None, now);
                Ok(out)
            };
        };
        let qid = self.qid;
        let (step, out) = if send {
            // Messages are what crosses the wire in the clear (challenges, responses, public
            // DH values; never a key): at trace level, for known-answer vectors and debugging.
            tracing::trace!(qid, subsys = %ctrl.subsys.nqn, msg = %Hex(buf),
                "authentication message from the host");
            (t.on_send(buf, &mut random), Outcome::ok())
        } else {
            match t.on_receive() {
                Some((msg, step)) => {
                    tracing::trace!(qid, subsys = %ctrl.subsys.nqn, msg = %Hex(&msg),
                        "authentication message to the host");
                    (step, deliver(buf, &msg)?)
                }
                None => {
                    let f = nvme::auth::AuthFailure {
                        step: "receive",
                        explanation: failure::INCORRECT_MESSAGE,
                        detail: "Authentication Receive with no message due".into(),
                    };
                    let out = deliver(buf, &failure1(t.t_id(), f.explanation))?;
                    (CtrlStep::Failed(f), out)
                }
            }
        };
        let mut generated = None;
        match step {
            CtrlStep::Continue => *deadline = Some(now + timeout),
            CtrlStep::Authenticated => {
                let (hash, group) = t.negotiated();
                let again = if *authenticated { "re-" } else { "" };
                tracing::info!(cntlid = ctrl.cntlid, qid = self.qid, host = %ctrl.hostnqn,
                    peer = %self.peer, hash = %hash, dhgroup = %group,
                    bidirectional = t.bidirectional(), "host {again}authenticated");
                *authenticated = true;
                *deadline = None;
                generated = (t.generated_psk())
                    .map(|(sc_c, psk)| (sc_c, hash, zeroize::Zeroizing::new(psk.to_vec())));
            }
            CtrlStep::Failed(f) => self.auth_failed(&f, None, now),
        }
        if let Some((sc_c, hash, psk)) = generated {
            self.concat_done(&ctrl, sc_c, hash, &psk, now);
        }
        Ok(out)
    }

    /// The authentication deadline passed (or a failed queue's grace ended): tear down.
    pub(super) fn auth_timeout(&mut self, now: Instant) {
        if self.auth.deadline().is_none_or(|d| now < d) {
            return;
        }
        let failed = matches!(self.auth, QueueAuth::Failed { .. });
        if !failed {
            if let Some(ctrl) = self.ctrl() {
                tracing::warn!(cntlid = ctrl.cntlid, qid = self.qid, host = %ctrl.hostnqn,
                    peer = %self.peer,
                    "authentication did not finish in time: the queue is torn down");
            }
        }
        self.auth = QueueAuth::TornDown;
        let why = if failed {
            "authentication failed"
        } else {
            "authentication did not finish in time"
        };
        match &self.link {
            // The controller goes with its admin queue (its I/O queues see it gone).
            Link::Admin(ctrl) => {
                ctrl.fail(Gone::AuthFailed);
            }
            Link::Io { .. } if !self.teardown_sent => {
                self.teardown_sent = true;
                self.events.push_back(QueueEvent::Disconnect(why));
            }
            _ => {}
        }
    }
}
