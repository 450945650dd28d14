//! DH-HMAC-CHAP messages carried by Authentication Send / Receive (NVMe Base 2.0, 8.13.5;
//! Linux `struct nvmf_auth_dhchap_*_data`). Every message starts with AUTH_TYPE, AUTH_ID and
//! the 16-bit transaction identifier T_ID.

use super::{DhGroup, HashId};

/// SECP of Authentication Send/Receive for NVMe in-band authentication.
pub const SECP_DHCHAP: u8 = 0xe9;
/// SPSP0 / SPSP1 for NVMe in-band authentication.
pub const SPSP0: u8 = 0x01;
pub const SPSP1: u8 = 0x01;
/// AUTH_TYPE of the common messages (Negotiate).
pub const AUTH_COMMON_MESSAGES: u8 = 0x00;
/// AUTH_TYPE of the DH-HMAC-CHAP messages.
pub const AUTH_DHCHAP_MESSAGES: u8 = 0x01;
/// AUTHID of the DH-HMAC-CHAP protocol descriptor.
pub const DHCHAP_AUTH_ID: u8 = 0x01;

/// AUTH_ID values (message types).
pub mod id {
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xf0;
    pub const FAILURE1: u8 = 0xf1;
}

/// SC_C values of AUTH_Negotiate: secure channel concatenation (NVMe Base 2.1, 8.3.4.5.2;
/// Linux `NVME_AUTH_SECP_*`). On an admin queue the transaction then generates a TLS PSK
/// (see [`super::ControllerTxn::generated_psk`]) that the host re-establishes its queues with.
pub mod secp {
    /// No secure channel concatenation.
    pub const NOSC: u8 = 0x00;
    /// A new TLS PSK, negotiated on a queue without TLS.
    pub const NEWTLSPSK: u8 = 0x02;
    /// A replacement of the generated TLS PSK the queue runs over.
    pub const REPLACETLSPSK: u8 = 0x03;
}

/// Failure reason code explanations (Figure 210; Linux `NVME_AUTH_DHCHAP_FAILURE_*`); the
/// reason code itself is always 01h, "authentication failure".
pub mod failure {
    pub const REASON_FAILED: u8 = 0x01;
    pub const FAILED: u8 = 0x01;
    pub const NOT_USABLE: u8 = 0x02;
    pub const CONCAT_MISMATCH: u8 = 0x03;
    pub const HASH_UNUSABLE: u8 = 0x04;
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    pub const INCORRECT_MESSAGE: u8 = 0x07;
}

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    #[error("message of {0} bytes is too short")]
    Short(usize),
    #[error("unexpected message type {auth_type:#04x}/{auth_id:#04x}")]
    Type { auth_type: u8, auth_id: u8 },
    #[error("invalid {0}")]
    Field(&'static str),
}

/// A decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMessage {
    Negotiate(Negotiate),
    Challenge(Challenge),
    Reply(Reply),
    Success1(Success1),
    Success2(Success2),
    Failure1(Failure),
    Failure2(Failure),
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn header(out: &mut Vec<u8>, auth_type: u8, auth_id: u8, t_id: u16) {
    out.extend_from_slice(&[auth_type, auth_id, 0, 0]);
    out.extend_from_slice(&t_id.to_le_bytes());
}

impl AuthMessage {
    /// Decodes a message (the whole Authentication Send payload, or a received one).
    pub fn decode(b: &[u8]) -> Result<AuthMessage, MsgError> {
        if b.len() < 8 {
            return Err(MsgError::Short(b.len()));
        }
        let (auth_type, auth_id, t_id) = (b[0], b[1], le16(b, 4));
        match (auth_type, auth_id) {
            (AUTH_COMMON_MESSAGES, id::NEGOTIATE) => Negotiate::decode(b).map(Self::Negotiate),
            (AUTH_DHCHAP_MESSAGES, id::CHALLENGE) => Challenge::decode(b).map(Self::Challenge),
            (AUTH_DHCHAP_MESSAGES, id::REPLY) => Reply::decode(b).map(Self::Reply),
            (AUTH_DHCHAP_MESSAGES, id::SUCCESS1) => Success1::decode(b).map(Self::Success1),
            (AUTH_DHCHAP_MESSAGES, id::SUCCESS2) => {
                if b.len() < 16 {
                    return Err(MsgError::Short(b.len()));
                }
                Ok(Self::Success2(Success2 { t_id }))
            }
            // Failure messages are common messages (Linux sends and expects AUTH_TYPE 00h); a
            // DH-HMAC-CHAP type is taken too.
            (AUTH_COMMON_MESSAGES | AUTH_DHCHAP_MESSAGES, id::FAILURE1 | id::FAILURE2) => {
                let f = Failure {
                    t_id,
                    rescode: b[6],
                    rescode_exp: b[7],
                };
                Ok(if auth_id == id::FAILURE1 {
                    Self::Failure1(f)
                } else {
                    Self::Failure2(f)
                })
            }
            _ => Err(MsgError::Type { auth_type, auth_id }),
        }
    }

    pub fn t_id(&self) -> u16 {
        match self {
            Self::Negotiate(m) => m.t_id,
            Self::Challenge(m) => m.t_id,
            Self::Reply(m) => m.t_id,
            Self::Success1(m) => m.t_id,
            Self::Success2(m) => m.t_id,
            Self::Failure1(m) | Self::Failure2(m) => m.t_id,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        match self {
            Self::Negotiate(m) => m.encode(),
            Self::Challenge(m) => m.encode(),
            Self::Reply(m) => m.encode(),
            Self::Success1(m) => m.encode(),
            Self::Success2(m) => m.encode(),
            Self::Failure1(m) => m.encode(id::FAILURE1),
            Self::Failure2(m) => m.encode(id::FAILURE2),
        }
    }
}

/// AUTH_Negotiate: the host's offer (one DH-HMAC-CHAP protocol descriptor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    pub t_id: u16,
    /// Secure channel concatenation ([`secp`]).
    pub sc_c: u8,
    /// Hash identifiers the host takes, in its order of preference (unknown ids kept as 0xff).
    pub hashes: Vec<u8>,
    /// DH group identifiers the host takes.
    pub dhgroups: Vec<u8>,
}

impl Negotiate {
    const DESC: usize = 64;

    fn decode(b: &[u8]) -> Result<Negotiate, MsgError> {
        let napd = b[7] as usize;
        if napd == 0 {
            return Err(MsgError::Field("NAPD"));
        }
        if b.len() < 8 + napd * Self::DESC {
            return Err(MsgError::Short(b.len()));
        }
        // The first DH-HMAC-CHAP descriptor; others are for protocols not offered.
        let d = (0..napd)
            .map(|i| &b[8 + i * Self::DESC..8 + (i + 1) * Self::DESC])
            .find(|d| d[0] == DHCHAP_AUTH_ID)
            .ok_or(MsgError::Field("AUTHID"))?;
        let (halen, dhlen) = (d[2] as usize, d[3] as usize);
        if halen > 30 || dhlen > 30 {
            return Err(MsgError::Field("HALEN/DHLEN"));
        }
        Ok(Negotiate {
            t_id: le16(b, 4),
            sc_c: b[6],
            hashes: d[4..4 + halen].to_vec(),
            dhgroups: d[34..34 + dhlen].to_vec(),
        })
    }

    pub fn new(t_id: u16, hashes: &[HashId], dhgroups: &[DhGroup]) -> Negotiate {
        Negotiate {
            t_id,
            sc_c: 0,
            hashes: hashes.iter().map(|h| *h as u8).collect(),
            dhgroups: dhgroups.iter().map(|g| *g as u8).collect(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + Self::DESC);
        header(&mut out, AUTH_COMMON_MESSAGES, id::NEGOTIATE, self.t_id);
        out.extend_from_slice(&[self.sc_c, 1]);
        let mut d = [0u8; Self::DESC];
        d[0] = DHCHAP_AUTH_ID;
        let h = self.hashes.len().min(30);
        let g = self.dhgroups.len().min(30);
        d[2] = h as u8;
        d[3] = g as u8;
        d[4..4 + h].copy_from_slice(&self.hashes[..h]);
        d[34..34 + g].copy_from_slice(&self.dhgroups[..g]);
        out.extend_from_slice(&d);
        out
    }
}

/// DH-HMAC-CHAP_Challenge: the controller's hash, group, challenge C1, sequence number S1 and
/// its DH public value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub t_id: u16,
    pub hash: u8,
    pub dhgroup: u8,
    pub seqnum: u32,
    pub challenge: Vec<u8>,
    pub dh_value: Vec<u8>,
}

impl Challenge {
    fn decode(b: &[u8]) -> Result<Challenge, MsgError> {
        if b.len() < 16 {
            return Err(MsgError::Short(b.len()));
        }
        let hl = b[6] as usize;
        let dhvlen = le16(b, 10) as usize;
        if b.len() < 16 + hl + dhvlen {
            return Err(MsgError::Short(b.len()));
        }
        Ok(Challenge {
            t_id: le16(b, 4),
            hash: b[8],
            dhgroup: b[9],
            seqnum: le32(b, 12),
            challenge: b[16..16 + hl].to_vec(),
            dh_value: b[16 + hl..16 + hl + dhvlen].to_vec(),
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.challenge.len() + self.dh_value.len());
        header(&mut out, AUTH_DHCHAP_MESSAGES, id::CHALLENGE, self.t_id);
        out.extend_from_slice(&[self.challenge.len() as u8, 0, self.hash, self.dhgroup]);
        out.extend_from_slice(&(self.dh_value.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.seqnum.to_le_bytes());
        out.extend_from_slice(&self.challenge);
        out.extend_from_slice(&self.dh_value);
        out
    }
}

/// DH-HMAC-CHAP_Reply: the host's response R1, and for bidirectional authentication its own
/// challenge C2 with sequence number S2; the host's DH public value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub t_id: u16,
    pub response: Vec<u8>,
    /// C2 when the host asks the controller to authenticate itself (CVALID).
    pub challenge: Option<Vec<u8>>,
    /// S2 (0 when the controller is not challenged).
    pub seqnum: u32,
    pub dh_value: Vec<u8>,
}

impl Reply {
    fn decode(b: &[u8]) -> Result<Reply, MsgError> {
        if b.len() < 16 {
            return Err(MsgError::Short(b.len()));
        }
        let hl = b[6] as usize;
        let cvalid = b[8] != 0;
        let dhvlen = le16(b, 10) as usize;
        // The challenge field is there (HL bytes) whether or not it is valid.
        if b.len() < 16 + 2 * hl + dhvlen {
            return Err(MsgError::Short(b.len()));
        }
        Ok(Reply {
            t_id: le16(b, 4),
            response: b[16..16 + hl].to_vec(),
            challenge: cvalid.then(|| b[16 + hl..16 + 2 * hl].to_vec()),
            seqnum: le32(b, 12),
            dh_value: b[16 + 2 * hl..16 + 2 * hl + dhvlen].to_vec(),
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let hl = self.response.len();
        let mut out = Vec::with_capacity(16 + 2 * hl + self.dh_value.len());
        header(&mut out, AUTH_DHCHAP_MESSAGES, id::REPLY, self.t_id);
        out.extend_from_slice(&[hl as u8, 0, self.challenge.is_some() as u8, 0]);
        out.extend_from_slice(&(self.dh_value.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.seqnum.to_le_bytes());
        out.extend_from_slice(&self.response);
        match &self.challenge {
            Some(c) => out.extend_from_slice(c),
            None => out.resize(out.len() + hl, 0),
        }
        out.extend_from_slice(&self.dh_value);
        out
    }
}

/// DH-HMAC-CHAP_Success1: the controller accepted R1; with bidirectional authentication it
/// carries the controller's response R2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success1 {
    pub t_id: u16,
    /// HL: the negotiated hash length (sent even without a response).
    pub hl: u8,
    pub response: Option<Vec<u8>>,
}

impl Success1 {
    fn decode(b: &[u8]) -> Result<Success1, MsgError> {
        if b.len() < 16 {
            return Err(MsgError::Short(b.len()));
        }
        let hl = b[6];
        let rvalid = b[8] != 0;
        if rvalid && b.len() < 16 + hl as usize {
            return Err(MsgError::Short(b.len()));
        }
        Ok(Success1 {
            t_id: le16(b, 4),
            hl,
            response: rvalid.then(|| b[16..16 + hl as usize].to_vec()),
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.hl as usize);
        header(&mut out, AUTH_DHCHAP_MESSAGES, id::SUCCESS1, self.t_id);
        out.extend_from_slice(&[self.hl, 0, self.response.is_some() as u8]);
        out.extend_from_slice(&[0; 7]);
        if let Some(r) = &self.response {
            out.extend_from_slice(r);
        }
        out
    }
}

/// DH-HMAC-CHAP_Success2: the host accepted R2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success2 {
    pub t_id: u16,
}

impl Success2 {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        header(&mut out, AUTH_DHCHAP_MESSAGES, id::SUCCESS2, self.t_id);
        out.resize(16, 0);
        out
    }
}

/// AUTH_Failure1 (controller to host) / AUTH_Failure2 (host to controller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub t_id: u16,
    pub rescode: u8,
    pub rescode_exp: u8,
}

impl Failure {
    pub fn new(t_id: u16, explanation: u8) -> Failure {
        Failure {
            t_id,
            rescode: failure::REASON_FAILED,
            rescode_exp: explanation,
        }
    }

    pub fn encode(&self, auth_id: u8) -> Vec<u8> {
        let mut out = Vec::with_capacity(8);
        header(&mut out, AUTH_COMMON_MESSAGES, auth_id, self.t_id);
        out.extend_from_slice(&[self.rescode, self.rescode_exp]);
        out
    }
}
