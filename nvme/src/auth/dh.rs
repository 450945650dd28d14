//! Finite-field Diffie-Hellman over the RFC 7919 groups (ffdhe2048 ... ffdhe8192, generator 2)
//! that DH-HMAC-CHAP negotiates, with constant-time modular exponentiation from `crypto-bigint`.

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use zeroize::Zeroizing;

use super::primes;

/// DH group identifiers (NVMe Base 2.0, Figure 203; Linux `NVME_AUTH_DHGROUP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DhGroup {
    /// No Diffie-Hellman: the challenge is used as it is.
    Null = 0,
    Ffdhe2048 = 1,
    Ffdhe3072 = 2,
    Ffdhe4096 = 3,
    Ffdhe6144 = 4,
    Ffdhe8192 = 5,
}

impl DhGroup {
    /// Every group, strongest last.
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| *g as u8 == id)
    }

    /// The name nvme-cli and nvmet use (`null`, `ffdhe2048`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }

    pub fn from_name(name: &str) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| g.name() == name)
    }

    /// The prime's big-endian bytes (`None` for the null group).
    pub(crate) fn prime(self) -> Option<&'static [u8]> {
        match self {
            DhGroup::Null => None,
            DhGroup::Ffdhe2048 => Some(&primes::FFDHE2048),
            DhGroup::Ffdhe3072 => Some(&primes::FFDHE3072),
            DhGroup::Ffdhe4096 => Some(&primes::FFDHE4096),
            DhGroup::Ffdhe6144 => Some(&primes::FFDHE6144),
            DhGroup::Ffdhe8192 => Some(&primes::FFDHE8192),
        }
    }

    /// Length of a public value and of the shared secret (the prime's length); 0 for null.
    pub fn value_len(self) -> usize {
        self.prime().map_or(0, <[u8]>::len)
    }

    /// Bytes of randomness a private exponent takes: twice the group's security strength
    /// (RFC 7919 appendix A, NIST SP 800-56A), rounded up to whole bytes.
    pub fn private_len(self) -> usize {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 28,
            DhGroup::Ffdhe3072 => 32,
            DhGroup::Ffdhe4096 => 38,
            DhGroup::Ffdhe6144 => 44,
            DhGroup::Ffdhe8192 => 50,
        }
    }
}

impl std::fmt::Display for DhGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a Diffie-Hellman step failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    #[error("the peer's DH value has {have} bytes; {group} needs {need}")]
    Length {
        group: DhGroup,
        have: usize,
        need: usize,
    },
    #[error("the peer's DH value is outside 2 .. p-2")]
    Range,
    #[error("the private exponent is zero")]
    ZeroPrivate,
}

/// One side's ephemeral key pair for one transaction. The private exponent is zeroed on drop.
pub struct KeyPair {
    group: DhGroup,
    private: Zeroizing<Vec<u8>>,
    public: Vec<u8>,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyPair({}, private redacted)", self.group)
    }
}

fn params(p: &[u8]) -> BoxedMontyParams {
    let bits = (p.len() * 8) as u32;
    let n = BoxedUint::from_be_slice(p, bits).expect("the RFC 7919 primes fit their width");
    BoxedMontyParams::new(Odd::new(n).expect("the RFC 7919 primes are odd"))
}

fn modpow(group: DhGroup, base: &[u8], exp: &[u8]) -> Zeroizing<Vec<u8>> {
    let p = group.prime().expect("not the null group");
    let bits = (p.len() * 8) as u32;
    let params = params(p);
    let b = BoxedUint::from_be_slice(base, bits).expect("base fits the modulus width");
    let ebits = (exp.len() * 8) as u32;
    let e = BoxedUint::from_be_slice(exp, ebits).expect("exponent fits its own width");
    let r = BoxedMontyForm::new(b, params).pow(&e).retrieve();
    // to_be_bytes gives exactly the modulus width: the value is left-padded with zeros, as
    // the public values and shared secrets of DH-HMAC-CHAP are.
    Zeroizing::new(r.to_be_bytes().into_vec())
}

impl KeyPair {
    /// A key pair from `random` bytes (at least `group.private_len()` of them; the first
    /// that many are used). Panics for the null group.
    pub fn generate(group: DhGroup, random: &[u8]) -> Result<KeyPair, DhError> {
        let n = group.private_len();
        assert!(n > 0, "no key pair in the null DH group");
        let private = Zeroizing::new(random[..n].to_vec());
        if private.iter().all(|&b| b == 0) {
            return Err(DhError::ZeroPrivate);
        }
        let public = modpow(group, &[2], &private).to_vec();
        Ok(KeyPair {
            group,
            private,
            public,
        })
    }

    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// g^x mod p, left-padded to the prime's length.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The shared secret peer^x mod p (left-padded to the prime's length), after checking
    /// that the peer's value is in 2 .. p-2 (SP 800-56A partial public-key validation).
    pub fn shared(&self, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, DhError> {
        let p = self.group.prime().expect("not the null group");
        if peer.len() != p.len() {
            return Err(DhError::Length {
                group: self.group,
                have: peer.len(),
                need: p.len(),
            });
        }
        // 2 <= peer <= p - 2, compared as big-endian byte strings of equal length.
        let mut p_minus_2 = p.to_vec();
        // p is odd and large: subtracting 2 only touches the last byte.
        p_minus_2[p.len() - 1] -= 2;
        let too_small = peer[..p.len() - 1].iter().all(|&b| b == 0) && peer[p.len() - 1] < 2;
        if too_small || peer > &p_minus_2[..] {
            return Err(DhError::Range);
        }
        Ok(modpow(self.group, peer, &self.private))
    }
}
