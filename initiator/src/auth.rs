//! NVMe in-band authentication (DH-HMAC-CHAP, NVMe Base 2.0 8.13) of a queue, the way the
//! Linux host runs it (`drivers/nvme/host/auth.c`).
//!
//! A controller that wants the host to authenticate sets AUTHREQ.ATR in the response of a
//! queue's Fabrics Connect (the admin queue's and every I/O queue's). The host then runs one
//! transaction on that queue before any other command: Authentication Send (Negotiate),
//! Authentication Receive (Challenge), Send (Reply), Receive (Success1) and, when the host
//! also authenticates the controller (a controller secret is configured), Send (Success2).
//! The protocol itself is [`nvme::auth::HostTxn`] (sans-I/O); this module only moves its
//! messages through [`Queue::execute`], so it is the same code for every transport's link.
//!
//! Each transaction takes a transaction identifier (T_ID) from one counter per controller,
//! starting at 0: the admin queue's is 0, then each I/O queue's the next (Linux's
//! `ctrl->transaction++`).
//!
//! Nothing here logs or formats key material: errors carry the step and the reason only. The
//! messages themselves (what crosses the wire in the clear: challenges, responses, DH public
//! values) are logged at trace level, in hex, as the target logs its side: for known-answer
//! vectors and debugging.

use nvme::auth::{self, AuthMessage, HostStep, HostTxn, Policy, Secret};
use nvme::fabrics::{self, AUTHREQ_ASCR, AUTHREQ_ATR};
use nvme::sgl::Sgl;
use rand::RngCore;
use zeroize::Zeroizing;

use crate::cmd::DataRef;
use crate::error::Error;
use crate::queue::{Link, Queue};

/// Authentication Receive allocation length (Linux's `CHAP_BUF_SIZE`). The controller returns
/// the message at the start of the buffer (nvmet and nvmf-target return all of it, zero
/// padded); a message decodes itself by its own length fields.
const RECEIVE_LEN: usize = 4096;

/// DH-HMAC-CHAP secrets and what the host offers, for [`crate::ConnectOptions::dhchap`].
///
/// The host secret is the key the controller has configured for this host NQN (`nvme connect
/// --dhchap-secret`); the controller secret (`--dhchap-ctrl-secret`), when given, makes the
/// authentication bidirectional: the host challenges the controller too and refuses it if
/// its response does not match. Secrets are never printed (their `Debug` is redacted) and are
/// zeroed when dropped.
///
/// ```
/// use nvmf_initiator::{ConnectOptions, DhchapOptions};
///
/// let mut opts = ConnectOptions::tcp("127.0.0.1", 4420, "nqn.2026-11.io.nvmf-rs:default");
/// // As `nvme gen-dhchap-key` prints it (an example key: generate your own).
/// let key = "DHHC-1:01:YGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn8x9qY5:";
/// opts.dhchap = Some(DhchapOptions::new(key, None)?);
/// # Ok::<(), nvmf_initiator::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhchapOptions {
    /// The host's secret.
    pub secret: Secret,
    /// The controller's secret: `Some` asks for bidirectional authentication.
    pub ctrl_secret: Option<Secret>,
    /// Hashes and DH groups offered in the Negotiate (the controller picks). The default
    /// offers all of them, as the Linux host does.
    pub policy: Policy,
}

impl DhchapOptions {
    /// Parses the host secret and the optional controller secret from the representation
    /// `nvme gen-dhchap-key` prints (`DHHC-1:xx:<base64>:`); the default [`Policy`].
    pub fn new(secret_text: &str, ctrl_secret_text: Option<&str>) -> Result<DhchapOptions, Error> {
        let parse = |which: &str, text: &str| {
            Secret::parse(text).map_err(|e| {
                Error::InvalidArgument(format!("the {which} DH-HMAC-CHAP secret: {e}"))
            })
        };
        Ok(DhchapOptions {
            secret: parse("host", secret_text)?,
            ctrl_secret: ctrl_secret_text
                .map(|t| parse("controller", t))
                .transpose()?,
            policy: Policy::default(),
        })
    }
}

/// Transaction identifiers of one controller: 0 for the first transaction, then one more for
/// each (wrapping).
#[derive(Debug, Default)]
pub(crate) struct TxnIds(u16);

impl TxnIds {
    fn next(&mut self) -> u16 {
        let t = self.0;
        self.0 = self.0.wrapping_add(1);
        t
    }
}

/// The PSK a secure channel concatenation generated, and its hash.
pub(crate) type Generated = (auth::HashId, Zeroizing<Vec<u8>>);

/// After a successful Fabrics Connect on `q` whose response carried `authreq` (DW0 bits
/// 18:16, shifted down): run the authentication transaction the controller asks for, if it
/// asks for one, with SC_C `sc_c` (secure channel concatenation; `secp::NOSC` for none). A
/// host secret without ATR is not used (the Linux host connects the same way). Returns the
/// PSK a concatenation generated.
pub(crate) fn on_connect<L: Link>(
    q: &mut Queue<L>,
    authreq: u8,
    dhchap: Option<&DhchapOptions>,
    hostnqn: &str,
    subnqn: &str,
    ids: &mut TxnIds,
    sc_c: u8,
) -> Result<Option<Generated>, Error> {
    if authreq & AUTHREQ_ASCR != 0 && sc_c == auth::secp::NOSC {
        return Err(Error::Auth {
            qid: q.qid(),
            step: "connect",
            detail: "the controller requires secure channel concatenation (ASCR): connect \
                     with `concat`"
                .into(),
        });
    }
    if authreq & AUTHREQ_ATR == 0 {
        return Ok(None);
    }
    let Some(dhchap) = dhchap else {
        return Err(Error::Auth {
            qid: q.qid(),
            step: "connect",
            detail: "the controller requires authentication (DH-HMAC-CHAP) and no host secret \
                     was given"
                .into(),
        });
    };
    authenticate(q, dhchap, hostnqn, subnqn, ids.next(), sc_c)
}

/// One DH-HMAC-CHAP transaction with T_ID `t_id` on `q` (`nvme_queue_auth_work`).
///
/// A transport failure or a command status is returned as the queue's own error (a lost
/// connection stays a transport failure, which the reconnecting types retry); a refusal by
/// either side is [`Error::Auth`]. When the host refuses a Challenge or Success1 the
/// controller sent (a controller response that does not match the controller secret, a hash
/// or group not offered), it tells the controller with a Failure2 first (best effort); after
/// the controller's Failure1 it just fails.
pub(crate) fn authenticate<L: Link>(
    q: &mut Queue<L>,
    dhchap: &DhchapOptions,
    hostnqn: &str,
    subnqn: &str,
    t_id: u16,
    sc_c: u8,
) -> Result<Option<Generated>, Error> {
    let qid = q.qid();
    let mut txn = HostTxn::new(
        dhchap.policy.clone(),
        dhchap.secret.clone(),
        dhchap.ctrl_secret.clone(),
        hostnqn,
        subnqn,
        t_id,
    )
    .with_concat(sc_c);
    let mut rng = |b: &mut [u8]| rand::rng().fill_bytes(b);
    let mut buf = vec![0u8; RECEIVE_LEN];

    send(q, "Authentication Send (Negotiate)", &txn.negotiate())?;
    receive(q, "Authentication Receive (Challenge)", &mut buf)?;
    let reply = match txn.on_challenge(&buf, &mut rng) {
        Ok(r) => r,
        Err(f) => return Err(refused(q, &txn, f, &buf, is_challenge)),
    };
    send(q, "Authentication Send (Reply)", &reply)?;
    buf.fill(0);
    if let Err(e) = receive(q, "Authentication Receive (Success1)", &mut buf) {
        return Err(match e {
            // Linux nvmet refuses a host's response by tearing the queue down, which can
            // overtake its Failure1 (over TCP too): a connection closed right after the Reply
            // is that refusal, and said as one.
            Error::Closed | Error::QueueFailed { .. } | Error::Io(_) => {
                tracing::warn!(qid, error = %e,
                    "authentication failed: the controller closed the connection after the Reply");
                Error::Auth {
                    qid,
                    step: "reply",
                    detail: format!(
                        "the controller closed the connection instead of answering the host's \
                         Reply ({e}): it refused the response (Linux nvmet tears the queue down \
                         before its Failure1 arrives)"
                    ),
                }
            }
            e => e,
        });
    }
    match txn.on_success1(&buf) {
        Ok(HostStep::Done) => {}
        Ok(HostStep::SendAndDone(success2)) => {
            send(q, "Authentication Send (Success2)", &success2)?
        }
        Ok(HostStep::Send(_)) => {
            return Err(Error::Auth {
                qid,
                step: "success1",
                detail: "the host transaction asked for another message after Success1".into(),
            })
        }
        Err(f) => return Err(refused(q, &txn, f, &buf, is_success1)),
    }
    tracing::debug!(qid, t_id, hash = %txn.hash(), "authenticated (DH-HMAC-CHAP)");
    Ok(txn
        .generated_psk()
        .map(|(hash, psk)| (hash, Zeroizing::new(psk.to_vec()))))
}

fn is_challenge(m: &AuthMessage) -> bool {
    matches!(m, AuthMessage::Challenge(_))
}

fn is_success1(m: &AuthMessage) -> bool {
    matches!(m, AuthMessage::Success1(_))
}

/// The error for a transaction the host cannot go on with after receiving `msg`. If `msg` is
/// the message the host expected (`expected`) and the host refused what it says, the
/// controller is sent a Failure2 first, as the Linux host does; after a Failure1 (the
/// controller refused the host) or a message that does not parse, nothing is sent.
fn refused<L: Link>(
    q: &mut Queue<L>,
    txn: &HostTxn,
    f: auth::AuthFailure,
    msg: &[u8],
    expected: fn(&AuthMessage) -> bool,
) -> Error {
    let qid = q.qid();
    if AuthMessage::decode(msg).is_ok_and(|m| expected(&m)) {
        if let Err(e) = send(q, "Authentication Send (Failure2)", &txn.failure2(&f)) {
            tracing::debug!(qid, error = %e, "Failure2 not delivered");
        }
    }
    tracing::warn!(qid, step = f.step, reason = %f.detail, "authentication failed");
    Error::Auth {
        qid,
        step: f.step,
        detail: f.detail,
    }
}

fn auth_cmd(send: bool, len: usize) -> nvme::Sqe {
    // The queue sets the CID and the data pointer; the SGL here is a placeholder.
    fabrics::auth_sqe(
        0,
        send,
        len as u32,
        Sgl::InCapsule {
            offset: 0,
            len: len as u32,
        },
    )
}

/// Bytes as lower-case hex, for trace lines.
struct Hex<'a>(&'a [u8]);

impl std::fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// The bytes of the message at the start of a received buffer: its own length when it
/// decodes (the controller pads the rest of the allocation with zeroes), else all of it.
/// Only for the trace line (it encodes the message again to learn its length).
fn received_len(buf: &[u8]) -> usize {
    AuthMessage::decode(buf)
        .ok()
        .map(|m| m.encode().len())
        .filter(|&n| n <= buf.len())
        .unwrap_or(buf.len())
}

/// Authentication Send of `msg` (TL = its length).
fn send<L: Link>(q: &mut Queue<L>, what: &'static str, msg: &[u8]) -> Result<(), Error> {
    // Wire data only (never a secret or a transformed key).
    tracing::trace!(qid = q.qid(), msg = %Hex(msg), "authentication message to the controller");
    q.execute(what, auth_cmd(true, msg.len()), DataRef::Write(msg))
        .map(|_| ())
}

/// Authentication Receive into `buf` (AL = its length).
fn receive<L: Link>(q: &mut Queue<L>, what: &'static str, buf: &mut [u8]) -> Result<(), Error> {
    q.execute(what, auth_cmd(false, buf.len()), DataRef::Read(buf))?;
    if tracing::enabled!(tracing::Level::TRACE) {
        let msg = &buf[..received_len(buf)];
        tracing::trace!(qid = q.qid(), msg = %Hex(msg), "authentication message from the controller");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 32 key bytes 0..32 with their CRC, untransformed (`DHHC-1:00:`).
    fn key_text() -> String {
        let key: Vec<u8> = (0u8..32).collect();
        Secret::from_key(&key, None).unwrap().to_text().to_string()
    }

    #[test]
    fn options_parse_both_secrets() {
        let k = key_text();
        let o = DhchapOptions::new(&k, None).unwrap();
        assert_eq!(o.secret, Secret::parse(&k).unwrap());
        assert!(o.ctrl_secret.is_none());
        assert_eq!(o.policy, Policy::default());
        let o = DhchapOptions::new(&k, Some(&k)).unwrap();
        assert_eq!(o.ctrl_secret, Some(Secret::parse(&k).unwrap()));
    }

    #[test]
    fn options_refuse_bad_secrets_without_quoting_them() {
        let k = key_text();
        // A mistyped key: one base64 character changed, so the CRC no longer matches.
        let mut typo = k.clone().into_bytes();
        typo[12] = if typo[12] == b'A' { b'B' } else { b'A' };
        let typo = String::from_utf8(typo).unwrap();
        let cases: [(&str, Option<&str>, &str); 4] = [
            (
                "secret",
                None,
                "host DH-HMAC-CHAP secret: a DH-HMAC-CHAP secret starts with",
            ),
            (
                &typo,
                None,
                "host DH-HMAC-CHAP secret: the key's CRC-32 does not match",
            ),
            (
                &k,
                Some("DHHC-1:07:AAAA:"),
                "controller DH-HMAC-CHAP secret: the transformation",
            ),
            (
                &k,
                Some("DHHC-1:00:AAAA:"),
                "controller DH-HMAC-CHAP secret: the key is 0 bytes",
            ),
        ];
        for (host, ctrl, want) in cases {
            let e = DhchapOptions::new(host, ctrl).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, Error::InvalidArgument(_)), "{msg}");
            assert!(msg.contains(want), "{msg}");
            assert!(
                !msg.contains(&k[10..]) && !msg.contains(&typo[10..]),
                "{msg}"
            );
        }
    }

    #[test]
    fn options_debug_redacts_the_keys() {
        let k = key_text();
        let o = DhchapOptions::new(&k, Some(&k)).unwrap();
        let dbg = format!("{o:?}");
        assert!(dbg.contains("redacted"), "{dbg}");
        assert!(!dbg.contains(&k[10..20]), "{dbg}");
    }

    #[test]
    fn trace_lines_show_a_received_message_without_its_padding() {
        let m = auth::Failure::new(7, auth::failure::FAILED).encode(auth::id::FAILURE1);
        let mut buf = vec![0u8; RECEIVE_LEN];
        buf[..m.len()].copy_from_slice(&m);
        assert_eq!(received_len(&buf), m.len());
        assert_eq!(
            Hex(&buf[..received_len(&buf)]).to_string(),
            Hex(&m).to_string()
        );
        // What does not decode is shown whole.
        assert_eq!(received_len(&[0xff; 12]), 12);
        assert_eq!(Hex(&[0x00, 0xab, 0x10]).to_string(), "00ab10");
    }

    #[test]
    fn transaction_ids_count_from_zero() {
        let mut ids = TxnIds::default();
        assert_eq!([ids.next(), ids.next(), ids.next()], [0, 1, 2]);
        let mut ids = TxnIds(u16::MAX);
        assert_eq!([ids.next(), ids.next()], [u16::MAX, 0]);
    }

    #[test]
    fn auth_commands_carry_the_dhchap_protocol_and_length() {
        let s = auth_cmd(true, 44);
        assert_eq!(s.opcode, nvme::opcode::FABRICS);
        assert_eq!(s.nsid.get() as u8, nvme::opcode::fctype::AUTH_SEND);
        let c = fabrics::AuthCmd::from_sqe(&s);
        assert_eq!(
            (c.secp, c.spsp0, c.spsp1, c.len),
            (auth::SECP_DHCHAP, auth::SPSP0, auth::SPSP1, 44)
        );
        let r = auth_cmd(false, RECEIVE_LEN);
        assert_eq!(r.nsid.get() as u8, nvme::opcode::fctype::AUTH_RECV);
        assert_eq!(fabrics::AuthCmd::from_sqe(&r).len, 4096);
    }
}
