//! NVMe in-band authentication with DH-HMAC-CHAP (NVMe Base 2.0, 8.13): secrets, the
//! Authentication Send/Receive messages, and the host's and the controller's side of one
//! transaction as sans-I/O machines (bytes and random numbers in, bytes out).
//!
//! The primitives come from RustCrypto (`hmac`, `sha2`, `subtle`) and `crypto-bigint`; nothing
//! here is a hand-written primitive. What is computed, with the byte order the Linux host and
//! target use (`drivers/nvme/common/auth.c`, `host/auth.c`, `target/auth.c`):
//!
//! - transformed key `Kt = HMAC-Hk(K, NQN || "NVMe-over-Fabrics")` (or `K` for `DHHC-1:00:`);
//! - with a DH group, the augmented challenge `Ca = HMAC-H(H(g^xy mod p), C)`, else `Ca = C`;
//! - host response `R1 = HMAC-H(Kt_host, Ca1 || le32(S1) || le16(T_ID) || SC_C || "HostHost"
//!   || NQNh || 00h || NQNc)`;
//! - controller response `R2 = HMAC-H(Kt_ctrl, Ca2 || le32(S2) || le16(T_ID) || SC_C ||
//!   "Controller" || NQNc || 00h || NQNh)`.

mod chap;
mod dh;
mod msg;
mod primes;
mod secret;

pub use chap::{
    explain, AuthFailure, ControllerTxn, CtrlStep, HostStep, HostTxn, Policy, Random,
    CHALLENGE_LEN_MAX,
};
pub use dh::{DhError, DhGroup, KeyPair};
pub use msg::{
    failure, id, secp, AuthMessage, Challenge, Failure, MsgError, Negotiate, Reply, Success1,
    Success2, AUTH_COMMON_MESSAGES, AUTH_DHCHAP_MESSAGES, DHCHAP_AUTH_ID, SECP_DHCHAP, SPSP0,
    SPSP1,
};
pub use secret::{Secret, SecretError};

use hmac::{Hmac, Mac};
use zeroize::Zeroizing;

/// Hash identifiers (NVMe Base 2.0, Figure 202; Linux `NVME_AUTH_HASH_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum HashId {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl HashId {
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    pub fn from_id(id: u8) -> Option<HashId> {
        HashId::ALL.into_iter().find(|h| *h as u8 == id)
    }

    /// Digest length in bytes.
    pub fn len(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }

    /// Never true; for clippy's `len` convention.
    pub fn is_empty(self) -> bool {
        false
    }

    /// The name nvme-cli and the configuration use (`sha256`, ...).
    pub fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "sha256",
            HashId::Sha384 => "sha384",
            HashId::Sha512 => "sha512",
        }
    }

    pub fn from_name(name: &str) -> Option<HashId> {
        let name = name
            .strip_prefix("hmac(")
            .and_then(|n| n.strip_suffix(')'))
            .unwrap_or(name);
        HashId::ALL.into_iter().find(|h| h.name() == name)
    }

    /// HMAC over the concatenation of `parts`.
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            let mut m = <M as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        Zeroizing::new(match self {
            HashId::Sha256 => run::<Hmac<sha2::Sha256>>(key, parts),
            HashId::Sha384 => run::<Hmac<sha2::Sha384>>(key, parts),
            HashId::Sha512 => run::<Hmac<sha2::Sha512>>(key, parts),
        })
    }

    /// The plain hash of `data`.
    pub fn digest(self, data: &[u8]) -> Zeroizing<Vec<u8>> {
        use sha2::Digest;
        Zeroizing::new(match self {
            HashId::Sha256 => sha2::Sha256::digest(data).to_vec(),
            HashId::Sha384 => sha2::Sha384::digest(data).to_vec(),
            HashId::Sha512 => sha2::Sha512::digest(data).to_vec(),
        })
    }
}

impl std::fmt::Display for HashId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The challenge as the response HMAC takes it: `HMAC-H(H(session key), C)` with a DH
/// group (Linux `nvme_auth_augmented_challenge`), the challenge itself without.
pub fn augmented_challenge(
    hash: HashId,
    session_key: Option<&[u8]>,
    challenge: &[u8],
) -> Zeroizing<Vec<u8>> {
    match session_key {
        None => Zeroizing::new(challenge.to_vec()),
        Some(k) => {
            let hashed = hash.digest(k);
            hash.hmac(&hashed, &[challenge])
        }
    }
}

/// One response HMAC of DH-HMAC-CHAP: the challenge, S, T_ID, SC_C, then who answers
/// ("HostHost" or "Controller") and the two NQNs, answerer first, with a zero byte between.
#[allow(clippy::too_many_arguments)]
fn response(
    hash: HashId,
    transformed_key: &[u8],
    challenge: &[u8],
    seqnum: u32,
    t_id: u16,
    sc_c: u8,
    who: &[u8],
    own_nqn: &str,
    peer_nqn: &str,
) -> Zeroizing<Vec<u8>> {
    hash.hmac(
        transformed_key,
        &[
            challenge,
            &seqnum.to_le_bytes(),
            &t_id.to_le_bytes(),
            &[sc_c],
            who,
            own_nqn.as_bytes(),
            &[0],
            peer_nqn.as_bytes(),
        ],
    )
}

/// The host's response R1 (see the module documentation).
#[allow(clippy::too_many_arguments)]
pub fn host_response(
    hash: HashId,
    transformed_key: &[u8],
    challenge: &[u8],
    seqnum: u32,
    t_id: u16,
    sc_c: u8,
    hostnqn: &str,
    subnqn: &str,
) -> Zeroizing<Vec<u8>> {
    let k = transformed_key;
    response(
        hash,
        k,
        challenge,
        seqnum,
        t_id,
        sc_c,
        b"HostHost",
        hostnqn,
        subnqn,
    )
}

/// The controller's response R2 (see the module documentation).
#[allow(clippy::too_many_arguments)]
pub fn controller_response(
    hash: HashId,
    transformed_key: &[u8],
    challenge: &[u8],
    seqnum: u32,
    t_id: u16,
    sc_c: u8,
    subnqn: &str,
    hostnqn: &str,
) -> Zeroizing<Vec<u8>> {
    let k = transformed_key;
    response(
        hash,
        k,
        challenge,
        seqnum,
        t_id,
        sc_c,
        b"Controller",
        subnqn,
        hostnqn,
    )
}

#[cfg(test)]
mod tests;
