//! One DH-HMAC-CHAP transaction, as the controller and as the host run it (NVMe Base 2.0,
//! 8.13.5.1): Negotiate -> Challenge -> Reply -> Success1 [-> Success2], or a Failure1 /
//! Failure2. Sans-I/O: message bytes and a source of random bytes in, message bytes out.

use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::msg::{
    failure, id, secp, AuthMessage, Challenge, Failure, Negotiate, Reply, Success1, Success2,
};
use super::{
    augmented_challenge, controller_response, host_response, DhGroup, HashId, KeyPair, Secret,
};

/// The largest challenge (and response) a transaction uses: the SHA-512 length.
pub const CHALLENGE_LEN_MAX: usize = 64;

/// Fills a buffer with cryptographically secure random bytes.
pub type Random<'a> = &'a mut dyn FnMut(&mut [u8]);

/// What a side accepts: hashes and DH groups, in order of preference (first is best).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub hashes: Vec<HashId>,
    pub dhgroups: Vec<DhGroup>,
}

impl Default for Policy {
    /// Every hash and group. The controller picks the first of its own lists that the host
    /// offers: the strongest hash, and ffdhe2048 before the larger groups (each costs a modular
    /// exponentiation per queue) and before null.
    fn default() -> Policy {
        Policy {
            hashes: vec![HashId::Sha512, HashId::Sha384, HashId::Sha256],
            dhgroups: vec![
                DhGroup::Ffdhe2048,
                DhGroup::Ffdhe3072,
                DhGroup::Ffdhe4096,
                DhGroup::Ffdhe6144,
                DhGroup::Ffdhe8192,
                DhGroup::Null,
            ],
        }
    }
}

/// Why a transaction failed: the step, the failure reason code explanation sent (or
/// received) and what went wrong. Never contains key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("DH-HMAC-CHAP {step}: {detail}")]
pub struct AuthFailure {
    pub step: &'static str,
    /// The explanation code of the Failure message (`msg::failure::*`).
    pub explanation: u8,
    pub detail: String,
}

fn fail(step: &'static str, explanation: u8, detail: impl Into<String>) -> AuthFailure {
    AuthFailure {
        step,
        explanation,
        detail: detail.into(),
    }
}

fn random_u32_nonzero(rng: Random<'_>) -> u32 {
    loop {
        let mut b = [0u8; 4];
        rng(&mut b);
        let v = u32::from_le_bytes(b);
        if v != 0 {
            return v;
        }
    }
}

// ---- controller ---------------------------------------------------------------------------

/// Where the controller's side of a transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CtrlState {
    /// Waiting for AUTH_Negotiate (Authentication Send).
    Negotiate,
    /// A Challenge is ready for the host's Authentication Receive.
    SendChallenge,
    /// Waiting for DH-HMAC-CHAP_Reply.
    Reply,
    /// Success1 is ready for the host's Authentication Receive.
    SendSuccess1,
    /// Waiting for DH-HMAC-CHAP_Success2 (bidirectional only).
    Success2,
    /// A Failure1 is ready for the host's Authentication Receive.
    SendFailure1,
    /// The host is authenticated.
    Done,
    /// The transaction failed (Failure1 delivered, or Failure2 received).
    Failed,
}

/// What a controller step led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtrlStep {
    /// More messages to come.
    Continue,
    /// The host is authenticated (and the controller, if the host asked).
    Authenticated,
    /// The transaction failed; the queue must not be used.
    Failed(AuthFailure),
}

/// The controller's side of one transaction with a host that has `host_key` (and, for
/// bidirectional authentication, `ctrl_key`).
pub struct ControllerTxn {
    policy: Policy,
    host_key: Secret,
    ctrl_key: Option<Secret>,
    hostnqn: String,
    subnqn: String,
    state: CtrlState,
    t_id: u16,
    hash: HashId,
    group: DhGroup,
    seqnum: u32,
    challenge: Zeroizing<Vec<u8>>,
    keys: Option<KeyPair>,
    /// R2 for Success1, when the host challenged the controller.
    ctrl_response: Option<Zeroizing<Vec<u8>>>,
    /// The failure explanation Failure1 will carry, and why.
    failure: Option<AuthFailure>,
    /// The SC_C this queue takes besides NOSC ([`ControllerTxn::with_concat`]).
    concat: u8,
    /// The transaction's SC_C (from the Negotiate).
    sc_c: u8,
    /// The PSK a transaction with secure channel concatenation generated.
    generated: Option<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for ControllerTxn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerTxn")
            .field("state", &self.state)
            .field("t_id", &self.t_id)
            .field("hash", &self.hash)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl ControllerTxn {
    pub fn new(
        policy: Policy,
        host_key: Secret,
        ctrl_key: Option<Secret>,
        hostnqn: &str,
        subnqn: &str,
    ) -> ControllerTxn {
        ControllerTxn {
            policy,
            host_key,
            ctrl_key,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            state: CtrlState::Negotiate,
            t_id: 0,
            hash: HashId::Sha256,
            group: DhGroup::Null,
            seqnum: 0,
            challenge: Zeroizing::new(Vec::new()),
            keys: None,
            ctrl_response: None,
            failure: None,
            concat: secp::NOSC,
            sc_c: secp::NOSC,
            generated: None,
        }
    }

    /// Let the host ask for secure channel concatenation `sc_c` ([`secp::NEWTLSPSK`] on an
    /// NVMe/TCP admin queue without TLS, [`secp::REPLACETLSPSK`] on one over a generated PSK);
    /// any other SC_C fails the transaction with a concatenation mismatch.
    pub fn with_concat(mut self, sc_c: u8) -> ControllerTxn {
        self.concat = sc_c;
        self
    }

    /// After a successful transaction with secure channel concatenation: its SC_C and the
    /// generated PSK, HMAC-H(KS, C1 || C2) with KS the DH shared secret (NVMe Base 2.1,
    /// 8.3.4.5.9).
    pub fn generated_psk(&self) -> Option<(u8, &[u8])> {
        match (&self.state, &self.generated) {
            (CtrlState::Done, Some(p)) => Some((self.sc_c, p.as_slice())),
            _ => None,
        }
    }

    /// The transaction identifier (the host's, from its Negotiate).
    pub fn t_id(&self) -> u16 {
        self.t_id
    }

    /// The negotiated hash and DH group (meaningful once a Negotiate was taken).
    pub fn negotiated(&self) -> (HashId, DhGroup) {
        (self.hash, self.group)
    }

    /// Whether the host challenged the controller (bidirectional authentication); a host may
    /// authenticate only itself even where a controller key is configured.
    pub fn bidirectional(&self) -> bool {
        self.ctrl_response.is_some()
    }

    /// Whether the transaction has ended (either way).
    pub fn finished(&self) -> bool {
        matches!(self.state, CtrlState::Done | CtrlState::Failed)
    }

    /// Whether an Authentication Send is what comes next (else a Receive).
    pub fn expects_send(&self) -> bool {
        matches!(
            self.state,
            CtrlState::Negotiate | CtrlState::Reply | CtrlState::Success2
        )
    }

    fn fail_with(&mut self, f: AuthFailure) -> CtrlStep {
        self.failure = Some(f);
        self.state = CtrlState::SendFailure1;
        CtrlStep::Continue
    }

    /// The payload of an Authentication Send. A protocol error turns the transaction into a
    /// pending Failure1 (the host reads it with Authentication Receive), as nvmet does.
    pub fn on_send(&mut self, payload: &[u8], rng: Random<'_>) -> CtrlStep {
        let msg = match AuthMessage::decode(payload) {
            Ok(m) => m,
            Err(e) => {
                return self.fail_with(fail("message", failure::INCORRECT_PAYLOAD, e.to_string()))
            }
        };
        match (self.state, msg) {
            // The host may start over at any time (re-authentication, or a retry).
            (_, AuthMessage::Negotiate(n)) => self.negotiate(n, rng),
            (CtrlState::Reply, AuthMessage::Reply(r)) => self.reply(r),
            (CtrlState::Success2, AuthMessage::Success2(s)) => {
                if s.t_id != self.t_id {
                    self.state = CtrlState::Failed;
                    return CtrlStep::Failed(fail(
                        "success2",
                        failure::INCORRECT_PAYLOAD,
                        "transaction id differs",
                    ));
                }
                self.state = CtrlState::Done;
                CtrlStep::Authenticated
            }
            (_, AuthMessage::Failure2(f)) => {
                self.state = CtrlState::Failed;
                CtrlStep::Failed(fail(
                    "failure2",
                    f.rescode_exp,
                    format!(
                        "the host rejected the controller (reason {:#04x}, explanation {:#04x})",
                        f.rescode, f.rescode_exp
                    ),
                ))
            }
            (_, m) => self.fail_with(fail(
                "message",
                failure::INCORRECT_MESSAGE,
                format!("unexpected {} message", kind(&m)),
            )),
        }
    }

    fn negotiate(&mut self, n: Negotiate, rng: Random<'_>) -> CtrlStep {
        self.t_id = n.t_id;
        self.keys = None;
        self.ctrl_response = None;
        self.generated = None;
        self.sc_c = secp::NOSC;
        if n.sc_c != secp::NOSC {
            if n.sc_c != self.concat {
                let detail = match self.concat {
                    secp::NOSC => format!(
                        "secure channel concatenation (SC_C {}) is not taken on this queue (only \
                         an NVMe/TCP admin queue, through a listener with `tls`)",
                        n.sc_c
                    ),
                    want => format!("SC_C {} where this queue takes {want}", n.sc_c),
                };
                return self.fail_with(fail("negotiate", failure::CONCAT_MISMATCH, detail));
            }
            self.sc_c = n.sc_c;
        }
        let concat = self.sc_c != secp::NOSC;
        // A generated PSK keys TLS 1.3, whose suites have SHA-256 and SHA-384 only.
        let Some(hash) = self
            .policy
            .hashes
            .iter()
            .copied()
            .filter(|h| !concat || *h != HashId::Sha512)
            .find(|h| n.hashes.contains(&(*h as u8)))
        else {
            return self.fail_with(fail(
                "negotiate",
                failure::HASH_UNUSABLE,
                format!(
                    "no common hash (host offers ids {:?}{})",
                    n.hashes,
                    if concat {
                        "; concatenation takes sha256 or sha384"
                    } else {
                        ""
                    }
                ),
            ));
        };
        // This side's order of preference among the groups the host offers (the Linux host
        // lists null first: its order says nothing). Concatenation needs a DH exchange: its
        // PSK is made from the shared secret.
        let Some(group) = self
            .policy
            .dhgroups
            .iter()
            .copied()
            .filter(|g| !concat || *g != DhGroup::Null)
            .find(|g| n.dhgroups.contains(&(*g as u8)))
        else {
            let (explanation, why) = if concat {
                (
                    failure::CONCAT_MISMATCH,
                    "; concatenation needs a group other than null",
                )
            } else {
                (failure::DHGROUP_UNUSABLE, "")
            };
            return self.fail_with(fail(
                "negotiate",
                explanation,
                format!("no common DH group (host offers ids {:?}{why})", n.dhgroups),
            ));
        };
        self.hash = hash;
        self.group = group;
        let mut c = Zeroizing::new(vec![0u8; hash.len()]);
        rng(&mut c);
        self.challenge = c;
        self.seqnum = random_u32_nonzero(rng);
        if group != DhGroup::Null {
            let mut x = Zeroizing::new(vec![0u8; group.private_len()]);
            rng(&mut x);
            match KeyPair::generate(group, &x) {
                Ok(k) => self.keys = Some(k),
                Err(e) => return self.fail_with(fail("negotiate", failure::FAILED, e.to_string())),
            }
        }
        self.failure = None;
        self.state = CtrlState::SendChallenge;
        CtrlStep::Continue
    }

    fn reply(&mut self, r: Reply) -> CtrlStep {
        let hl = self.hash.len();
        if r.t_id != self.t_id {
            return self.fail_with(fail(
                "reply",
                failure::INCORRECT_PAYLOAD,
                "transaction id differs",
            ));
        }
        if r.response.len() != hl {
            return self.fail_with(fail(
                "reply",
                failure::INCORRECT_PAYLOAD,
                format!(
                    "response of {} bytes; {} needs {hl}",
                    r.response.len(),
                    self.hash
                ),
            ));
        }
        let session = match (&self.keys, self.group) {
            (None, _) => {
                if !r.dh_value.is_empty() {
                    return self.fail_with(fail(
                        "reply",
                        failure::INCORRECT_PAYLOAD,
                        "a DH value without a DH group",
                    ));
                }
                None
            }
            (Some(k), _) => match k.shared(&r.dh_value) {
                Ok(s) => Some(s),
                Err(e) => {
                    return self.fail_with(fail("reply", failure::INCORRECT_PAYLOAD, e.to_string()))
                }
            },
        };
        let ca = augmented_challenge(
            self.hash,
            session.as_ref().map(|s| s.as_slice()),
            &self.challenge,
        );
        let key = self.host_key.transform(&self.hostnqn);
        let expect = host_response(
            self.hash,
            &key,
            &ca,
            self.seqnum,
            self.t_id,
            self.sc_c,
            &self.hostnqn,
            &self.subnqn,
        );
        if !bool::from(expect.ct_eq(&r.response)) {
            return self.fail_with(fail(
                "reply",
                failure::FAILED,
                "the host's response does not match its key",
            ));
        }
        let concat = self.sc_c != secp::NOSC;
        if concat && r.challenge.is_none() {
            return self.fail_with(fail(
                "reply",
                failure::FAILED,
                "secure channel concatenation without the host's challenge C2",
            ));
        }
        if let Some(c2) = r
            .challenge
            .as_ref()
            .filter(|c| c.len() != hl || (!concat && r.seqnum == 0))
        {
            return self.fail_with(fail(
                "reply",
                failure::INCORRECT_PAYLOAD,
                format!(
                    "controller challenge of {} bytes, or sequence number 0",
                    c2.len()
                ),
            ));
        }
        if let (true, Some(c2), Some(s)) = (concat, &r.challenge, &session) {
            // With concatenation C2 is there for the PSK; S2 = 0 asks no controller response.
            self.generated = Some(self.hash.hmac(s, &[&self.challenge, c2]));
        }
        if let Some(c2) = r.challenge.as_ref().filter(|_| r.seqnum != 0) {
            let Some(ctrl_key) = &self.ctrl_key else {
                return self.fail_with(fail(
                    "reply",
                    failure::FAILED,
                    "the host asks the controller to authenticate, and it has no controller key",
                ));
            };
            let ca2 = augmented_challenge(self.hash, session.as_ref().map(|s| s.as_slice()), c2);
            let key = ctrl_key.transform(&self.subnqn);
            self.ctrl_response = Some(controller_response(
                self.hash,
                &key,
                &ca2,
                r.seqnum,
                self.t_id,
                0,
                &self.subnqn,
                &self.hostnqn,
            ));
        }
        // A controller key answers a challenge only when the host makes one: a host that
        // authenticates itself alone is accepted, as Linux nvmet (6.12) and SPDK accept it.
        self.state = CtrlState::SendSuccess1;
        CtrlStep::Continue
    }

    /// The message for an Authentication Receive, and what it leads to. `None` when the
    /// transaction has nothing to send now (a Receive out of order).
    pub fn on_receive(&mut self) -> Option<(Vec<u8>, CtrlStep)> {
        match self.state {
            CtrlState::SendChallenge => {
                let m = Challenge {
                    t_id: self.t_id,
                    hash: self.hash as u8,
                    dhgroup: self.group as u8,
                    seqnum: self.seqnum,
                    challenge: self.challenge.to_vec(),
                    dh_value: self
                        .keys
                        .as_ref()
                        .map(|k| k.public().to_vec())
                        .unwrap_or_default(),
                };
                self.state = CtrlState::Reply;
                Some((m.encode(), CtrlStep::Continue))
            }
            CtrlState::SendSuccess1 => {
                let m = Success1 {
                    t_id: self.t_id,
                    hl: self.hash.len() as u8,
                    response: self.ctrl_response.as_ref().map(|r| r.to_vec()),
                };
                let step = if self.ctrl_response.is_some() {
                    self.state = CtrlState::Success2;
                    CtrlStep::Continue
                } else {
                    self.state = CtrlState::Done;
                    CtrlStep::Authenticated
                };
                Some((m.encode(), step))
            }
            CtrlState::SendFailure1 => {
                let f = self
                    .failure
                    .take()
                    .unwrap_or_else(|| fail("message", failure::FAILED, "authentication failed"));
                let m = Failure::new(self.t_id, f.explanation);
                self.state = CtrlState::Failed;
                Some((m.encode(id::FAILURE1), CtrlStep::Failed(f)))
            }
            _ => None,
        }
    }
}

fn kind(m: &AuthMessage) -> &'static str {
    match m {
        AuthMessage::Negotiate(_) => "Negotiate",
        AuthMessage::Challenge(_) => "Challenge",
        AuthMessage::Reply(_) => "Reply",
        AuthMessage::Success1(_) => "Success1",
        AuthMessage::Success2(_) => "Success2",
        AuthMessage::Failure1(_) => "Failure1",
        AuthMessage::Failure2(_) => "Failure2",
    }
}

// ---- host ---------------------------------------------------------------------------------

/// What a host step led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostStep {
    /// Send this with Authentication Send, then receive the next message.
    Send(Vec<u8>),
    /// Send this (Success2) with Authentication Send; the queue is then authenticated.
    SendAndDone(Vec<u8>),
    /// Authenticated; nothing more to send.
    Done,
}

/// The host's side of one transaction.
pub struct HostTxn {
    policy: Policy,
    key: Secret,
    ctrl_key: Option<Secret>,
    hostnqn: String,
    subnqn: String,
    t_id: u16,
    hash: HashId,
    /// S2 and C2 when the controller is challenged.
    seqnum2: u32,
    challenge2: Zeroizing<Vec<u8>>,
    session: Option<Zeroizing<Vec<u8>>>,
    /// SC_C of the Negotiate ([`HostTxn::with_concat`]).
    sc_c: u8,
    /// The PSK this transaction generates (with concatenation), once the challenge is in.
    generated: Option<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for HostTxn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTxn")
            .field("t_id", &self.t_id)
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

impl HostTxn {
    pub fn new(
        policy: Policy,
        key: Secret,
        ctrl_key: Option<Secret>,
        hostnqn: &str,
        subnqn: &str,
        t_id: u16,
    ) -> HostTxn {
        HostTxn {
            policy,
            key,
            ctrl_key,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            t_id,
            hash: HashId::Sha256,
            seqnum2: 0,
            challenge2: Zeroizing::new(Vec::new()),
            session: None,
            sc_c: secp::NOSC,
            generated: None,
        }
    }

    /// Ask for secure channel concatenation `sc_c` ([`secp::NEWTLSPSK`], or
    /// [`secp::REPLACETLSPSK`] over a generated PSK): the Negotiate carries it and offers only
    /// what a TLS PSK can be made with (SHA-256 or SHA-384, a DH group other than null), the
    /// Reply always carries a challenge C2 (with S2 = 0 when the controller is not
    /// authenticated).
    pub fn with_concat(mut self, sc_c: u8) -> HostTxn {
        self.sc_c = sc_c;
        self
    }

    /// The PSK a transaction with concatenation generated, HMAC-H(KS, C1 || C2), and its hash;
    /// valid once the transaction has succeeded.
    pub fn generated_psk(&self) -> Option<(HashId, &[u8])> {
        self.generated.as_ref().map(|p| (self.hash, p.as_slice()))
    }

    /// The negotiated hash (after the challenge).
    pub fn hash(&self) -> HashId {
        self.hash
    }

    /// AUTH_Negotiate.
    pub fn negotiate(&self) -> Vec<u8> {
        let concat = self.sc_c != secp::NOSC;
        let hashes: Vec<HashId> = (self.policy.hashes.iter().copied())
            .filter(|h| !concat || *h != HashId::Sha512)
            .collect();
        let groups: Vec<DhGroup> = (self.policy.dhgroups.iter().copied())
            .filter(|g| !concat || *g != DhGroup::Null)
            .collect();
        let mut n = Negotiate::new(self.t_id, &hashes, &groups);
        n.sc_c = self.sc_c;
        n.encode()
    }

    /// A Failure2 for the controller, after `f` (what the host sends when the controller's
    /// own response does not check out).
    pub fn failure2(&self, f: &AuthFailure) -> Vec<u8> {
        Failure::new(self.t_id, f.explanation).encode(id::FAILURE2)
    }

    /// The controller's Challenge (or Failure1): the Reply to send.
    pub fn on_challenge(&mut self, msg: &[u8], rng: Random<'_>) -> Result<Vec<u8>, AuthFailure> {
        let c = match AuthMessage::decode(msg) {
            Ok(AuthMessage::Challenge(c)) => c,
            Ok(AuthMessage::Failure1(f)) => return Err(rejected("challenge", &f)),
            Ok(m) => {
                return Err(fail(
                    "challenge",
                    failure::INCORRECT_MESSAGE,
                    format!("the controller sent {} instead of a Challenge", kind(&m)),
                ))
            }
            Err(e) => return Err(fail("challenge", failure::INCORRECT_PAYLOAD, e.to_string())),
        };
        if c.t_id != self.t_id {
            return Err(fail(
                "challenge",
                failure::INCORRECT_PAYLOAD,
                "transaction id differs",
            ));
        }
        let hash = HashId::from_id(c.hash)
            .filter(|h| self.policy.hashes.contains(h))
            .ok_or_else(|| {
                fail(
                    "challenge",
                    failure::HASH_UNUSABLE,
                    format!("hash id {} was not offered", c.hash),
                )
            })?;
        let group = DhGroup::from_id(c.dhgroup)
            .filter(|g| self.policy.dhgroups.contains(g))
            .ok_or_else(|| {
                fail(
                    "challenge",
                    failure::DHGROUP_UNUSABLE,
                    format!("DH group id {} was not offered", c.dhgroup),
                )
            })?;
        if c.challenge.len() != hash.len() {
            return Err(fail(
                "challenge",
                failure::INCORRECT_PAYLOAD,
                format!("challenge of {} bytes for {hash}", c.challenge.len()),
            ));
        }
        self.hash = hash;
        let mut dh_value = Vec::new();
        self.session = None;
        if group != DhGroup::Null {
            let mut x = Zeroizing::new(vec![0u8; group.private_len()]);
            rng(&mut x);
            let keys = KeyPair::generate(group, &x)
                .map_err(|e| fail("challenge", failure::FAILED, e.to_string()))?;
            let s = keys
                .shared(&c.dh_value)
                .map_err(|e| fail("challenge", failure::INCORRECT_PAYLOAD, e.to_string()))?;
            dh_value = keys.public().to_vec();
            self.session = Some(s);
        } else if !c.dh_value.is_empty() {
            return Err(fail(
                "challenge",
                failure::INCORRECT_PAYLOAD,
                "a DH value with the null group",
            ));
        }
        let ca = augmented_challenge(
            hash,
            self.session.as_ref().map(|s| s.as_slice()),
            &c.challenge,
        );
        let key = self.key.transform(&self.hostnqn);
        let response = host_response(
            hash,
            &key,
            &ca,
            c.seqnum,
            self.t_id,
            self.sc_c,
            &self.hostnqn,
            &self.subnqn,
        );
        let concat = self.sc_c != secp::NOSC;
        self.generated = None;
        let challenge = if self.ctrl_key.is_some() || concat {
            let mut c2 = Zeroizing::new(vec![0u8; hash.len()]);
            rng(&mut c2);
            // S2 = 0: C2 is there for the generated PSK only, no controller response asked.
            self.seqnum2 = if self.ctrl_key.is_some() {
                random_u32_nonzero(rng)
            } else {
                0
            };
            self.challenge2 = c2;
            Some(self.challenge2.to_vec())
        } else {
            None
        };
        if concat {
            let Some(s) = &self.session else {
                return Err(fail(
                    "challenge",
                    failure::CONCAT_MISMATCH,
                    "secure channel concatenation with the null DH group",
                ));
            };
            self.generated = Some(hash.hmac(s, &[&c.challenge, &self.challenge2]));
        }
        Ok(Reply {
            t_id: self.t_id,
            response: response.to_vec(),
            challenge,
            seqnum: self.seqnum2,
            dh_value,
        }
        .encode())
    }

    /// The controller's Success1 (or Failure1): done, or the Success2 to send.
    pub fn on_success1(&mut self, msg: &[u8]) -> Result<HostStep, AuthFailure> {
        let s = match AuthMessage::decode(msg) {
            Ok(AuthMessage::Success1(s)) => s,
            Ok(AuthMessage::Failure1(f)) => return Err(rejected("reply", &f)),
            Ok(m) => {
                return Err(fail(
                    "success1",
                    failure::INCORRECT_MESSAGE,
                    format!("the controller sent {} instead of Success1", kind(&m)),
                ))
            }
            Err(e) => return Err(fail("success1", failure::INCORRECT_PAYLOAD, e.to_string())),
        };
        if s.t_id != self.t_id {
            return Err(fail(
                "success1",
                failure::INCORRECT_PAYLOAD,
                "transaction id differs",
            ));
        }
        let Some(ctrl_key) = &self.ctrl_key else {
            return Ok(HostStep::Done);
        };
        let Some(r2) = s.response else {
            return Err(fail(
                "success1",
                failure::FAILED,
                "the controller did not answer the host's challenge",
            ));
        };
        let ca2 = augmented_challenge(
            self.hash,
            self.session.as_ref().map(|s| s.as_slice()),
            &self.challenge2,
        );
        let key = ctrl_key.transform(&self.subnqn);
        let expect = controller_response(
            self.hash,
            &key,
            &ca2,
            self.seqnum2,
            self.t_id,
            0,
            &self.subnqn,
            &self.hostnqn,
        );
        if !bool::from(expect.ct_eq(&r2)) {
            return Err(fail(
                "success1",
                failure::FAILED,
                "the controller's response does not match the controller key",
            ));
        }
        Ok(HostStep::SendAndDone(Success2 { t_id: self.t_id }.encode()))
    }
}

fn rejected(step: &'static str, f: &Failure) -> AuthFailure {
    fail(
        step,
        f.rescode_exp,
        format!(
            "the controller rejected the host (Failure1 reason {:#04x}, explanation {:#04x}: {})",
            f.rescode,
            f.rescode_exp,
            explain(f.rescode_exp)
        ),
    )
}

/// A failure explanation in words.
pub fn explain(code: u8) -> &'static str {
    match code {
        failure::FAILED => "authentication failed",
        failure::NOT_USABLE => "authentication protocol not usable",
        failure::CONCAT_MISMATCH => "secure channel concatenation mismatch",
        failure::HASH_UNUSABLE => "hash function not usable",
        failure::DHGROUP_UNUSABLE => "DH group not usable",
        failure::INCORRECT_PAYLOAD => "incorrect payload",
        failure::INCORRECT_MESSAGE => "incorrect protocol message",
        _ => "unknown reason",
    }
}
