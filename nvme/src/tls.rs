//! NVMe/TCP's TLS 1.3 pre-shared keys (NVMe TCP Transport Specification 1.1, 3.6.1, from
//! TP 8011 and TP 8018), as sans-I/O helpers: the PSK interchange format, the retained PSK, the
//! two PSK identity formats and the TLS PSK each of them names. The TLS handshake itself is
//! OpenSSL's (in the target and the initiator); this is only what goes into it.
//!
//! With H the key's hash (SHA-256 for `:01:`, SHA-384 for `:02:`), L its length, and
//! HKDF-Expand-Label the TLS 1.3 one (RFC 8446 7.1: the label gets the `tls13 ` prefix):
//!
//! - configured PSK: the bytes of `NVMeTLSkey-1:HH:<base64(key || crc32(key) LE)>:`;
//! - retained PSK = HKDF-Expand-Label(HKDF-Extract(0, configured), "HostNQN", hostnqn, L);
//! - identity v0 `NVMe0RHH <hostnqn> <subnqn>`: TLS PSK = HKDF-Expand-Label(HKDF-Extract(0,
//!   retained), "nvme-tls-psk", identity, L);
//! - identity v1 `NVMe1RHH <hostnqn> <subnqn> <digest>`, digest = base64(HMAC-H(retained,
//!   "<hostnqn> <subnqn> NVMe-over-Fabrics")): TLS PSK = HKDF-Expand-Label(HKDF-Extract(0,
//!   retained), "nvme-tls-psk", "HH <digest>", L).
//!
//! This is what libnvme 1.16 (`nvme gen-tls-key`, `nvme check-tls-key --insert`) and the Linux
//! 6.12 host put into the `.nvme` keyring; the known answers in the tests are theirs.

use std::fmt;

use base64::Engine;
use hkdf::Hkdf;
use zeroize::Zeroizing;

use crate::auth::HashId;

/// The TLS 1.3 cipher suite a PSK's hash goes with (RFC 8446 B.4).
pub fn cipher_suite(hash: HashId) -> &'static str {
    match hash {
        HashId::Sha384 => "TLS_AES_256_GCM_SHA384",
        _ => "TLS_AES_128_GCM_SHA256",
    }
}

/// Why a PSK's text was refused (the text itself is never quoted: it is a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PskError {
    #[error("a TLS PSK starts with `NVMeTLSkey-1:` (as `nvme gen-tls-key` prints it)")]
    Prefix,
    #[error("the PSK's hash `{0}` is not one of 01 (SHA-256) or 02 (SHA-384)")]
    Hash(String),
    #[error("the key is not base64 followed by `:`")]
    Base64,
    #[error("the key is {0} bytes; a PSK with hash {1} has {2} (plus a 4-byte CRC)")]
    Length(usize, &'static str, usize),
    #[error("the key's CRC-32 does not match (a mistyped or truncated PSK)")]
    Crc,
}

/// A configured PSK: the key bytes and its hash (SHA-256 or SHA-384). Zeroed when dropped,
/// never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    key: Zeroizing<Vec<u8>>,
    hash: HashId,
}

impl fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfiguredPsk({}, redacted)", self.hash)
    }
}

/// The two-digit hash code of the interchange format and the identities.
fn hash_code(hash: HashId) -> &'static str {
    match hash {
        HashId::Sha384 => "02",
        _ => "01",
    }
}

impl ConfiguredPsk {
    /// Parses `NVMeTLSkey-1:HH:<base64>:` (the trailing `:` may be left out).
    pub fn parse(text: &str) -> Result<ConfiguredPsk, PskError> {
        let rest = text
            .trim()
            .strip_prefix("NVMeTLSkey-1:")
            .ok_or(PskError::Prefix)?;
        let (code, b64) = rest.split_once(':').ok_or(PskError::Prefix)?;
        let hash = match code {
            "01" => HashId::Sha256,
            "02" => HashId::Sha384,
            other => return Err(PskError::Hash(other.chars().take(4).collect())),
        };
        let b64 = b64.strip_suffix(':').unwrap_or(b64);
        let mut raw = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| PskError::Base64)?,
        );
        let n = raw.len().saturating_sub(4);
        if raw.len() < 4 || n != hash.len() {
            return Err(PskError::Length(n, hash.name(), hash.len()));
        }
        let crc = u32::from_le_bytes([raw[n], raw[n + 1], raw[n + 2], raw[n + 3]]);
        if crc32fast::hash(&raw[..n]) != crc {
            return Err(PskError::Crc);
        }
        raw.truncate(n);
        Ok(ConfiguredPsk { key: raw, hash })
    }

    /// A PSK from key bytes: 32 make a SHA-256 one, 48 a SHA-384 one.
    pub fn from_key(key: &[u8]) -> Result<ConfiguredPsk, PskError> {
        let hash = match key.len() {
            32 => HashId::Sha256,
            48 => HashId::Sha384,
            n => return Err(PskError::Length(n, "sha256 or sha384", 32)),
        };
        Ok(ConfiguredPsk {
            key: Zeroizing::new(key.to_vec()),
            hash,
        })
    }

    /// The interchange format (a secret: for key files and tests).
    pub fn to_text(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(Vec::with_capacity(self.key.len() + 4));
        raw.extend_from_slice(&self.key);
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        let b64 = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&*raw));
        Zeroizing::new(format!(
            "NVMeTLSkey-1:{}:{}:",
            hash_code(self.hash),
            b64.as_str()
        ))
    }

    pub fn hash(&self) -> HashId {
        self.hash
    }

    /// The retained PSK for `hostnqn`.
    pub fn retained(&self, hostnqn: &str) -> Zeroizing<Vec<u8>> {
        let prk = extract(self.hash, &self.key);
        expand_label(self.hash, &prk, b"HostNQN", hostnqn.as_bytes())
    }

    /// The identity of `version` for this key between `hostnqn` and `subnqn`, and the TLS PSK
    /// it names.
    pub fn tls_psk(
        &self,
        version: IdentityVersion,
        hostnqn: &str,
        subnqn: &str,
    ) -> (PskIdentity, Zeroizing<Vec<u8>>) {
        let retained = self.retained(hostnqn);
        let id = PskIdentity::new(version, self.hash, hostnqn, subnqn, &retained);
        let psk = id.tls_psk(&retained);
        (id, psk)
    }
}

/// Which identity format a host offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdentityVersion {
    /// `NVMe0RHH <hostnqn> <subnqn>` (TP 8011; what `nvme gen-tls-key` makes by default).
    V0,
    /// `NVMe1RHH <hostnqn> <subnqn> <digest>` (TP 8018; what the Linux host prefers, and
    /// `nvme connect --tls-key=<key>` inserts).
    #[default]
    V1,
}

/// Why a PSK identity from a ClientHello was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("a PSK identity starts with `NVMe0R`, `NVMe1R` (retained) or `NVMe0G`/`NVMe1G`")]
    Prefix,
    #[error("the identity's hash `{0}` is not 01 or 02")]
    Hash(String),
    #[error("the identity is not `<prefix> <hostnqn> <subnqn>[ <digest>]`")]
    Fields,
}

/// A PSK identity (NVMe TCP 1.1, 3.6.1.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PskIdentity {
    pub version: IdentityVersion,
    /// `G`: a PSK generated by secure channel concatenation; `R`: a retained one.
    pub generated: bool,
    pub hash: HashId,
    pub hostnqn: String,
    pub subnqn: String,
    /// v1 only: the base64 PSK digest.
    pub digest: Option<String>,
}

impl PskIdentity {
    /// The identity for a retained PSK (`retained` keys the v1 digest).
    pub fn new(
        version: IdentityVersion,
        hash: HashId,
        hostnqn: &str,
        subnqn: &str,
        retained: &[u8],
    ) -> PskIdentity {
        let digest =
            (version == IdentityVersion::V1).then(|| psk_digest(hash, retained, hostnqn, subnqn));
        PskIdentity {
            version,
            generated: false,
            hash,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            digest,
        }
    }

    /// The identity of a PSK generated by secure channel concatenation (`NVMe1GHH <hostnqn>
    /// <subnqn> <digest>`, the digest keyed by the generated PSK; Linux's
    /// `nvme_auth_generate_digest`). Its TLS PSK is [`PskIdentity::tls_psk`] of `generated`.
    pub fn generated(hash: HashId, hostnqn: &str, subnqn: &str, generated: &[u8]) -> PskIdentity {
        PskIdentity {
            generated: true,
            ..PskIdentity::new(IdentityVersion::V1, hash, hostnqn, subnqn, generated)
        }
    }

    /// Parses an identity as a ClientHello carries it.
    pub fn parse(text: &[u8]) -> Result<PskIdentity, IdentityError> {
        let text = std::str::from_utf8(text).map_err(|_| IdentityError::Fields)?;
        let mut f = text.split(' ');
        let prefix = f.next().ok_or(IdentityError::Prefix)?;
        let (version, generated, code) = if let Some(c) = prefix.strip_prefix("NVMe0R") {
            (IdentityVersion::V0, false, c)
        } else if let Some(c) = prefix.strip_prefix("NVMe1R") {
            (IdentityVersion::V1, false, c)
        } else if let Some(c) = prefix.strip_prefix("NVMe0G") {
            (IdentityVersion::V0, true, c)
        } else if let Some(c) = prefix.strip_prefix("NVMe1G") {
            (IdentityVersion::V1, true, c)
        } else {
            return Err(IdentityError::Prefix);
        };
        let hash = match code {
            "01" => HashId::Sha256,
            "02" => HashId::Sha384,
            other => return Err(IdentityError::Hash(other.chars().take(4).collect())),
        };
        let hostnqn = f
            .next()
            .filter(|s| !s.is_empty())
            .ok_or(IdentityError::Fields)?;
        let subnqn = f
            .next()
            .filter(|s| !s.is_empty())
            .ok_or(IdentityError::Fields)?;
        let digest = f.next().map(str::to_owned);
        if f.next().is_some()
            || (version == IdentityVersion::V1) != digest.as_deref().is_some_and(|d| !d.is_empty())
        {
            return Err(IdentityError::Fields);
        }
        Ok(PskIdentity {
            version,
            generated,
            hash,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            digest,
        })
    }

    /// The TLS PSK this identity names, from the retained (or generated) PSK.
    pub fn tls_psk(&self, retained: &[u8]) -> Zeroizing<Vec<u8>> {
        let prk = extract(self.hash, retained);
        match &self.digest {
            None => expand_label(
                self.hash,
                &prk,
                b"nvme-tls-psk",
                self.to_string().as_bytes(),
            ),
            Some(d) => {
                let ctx = format!("{} {d}", hash_code(self.hash));
                expand_label(self.hash, &prk, b"nvme-tls-psk", ctx.as_bytes())
            }
        }
    }

    /// Whether a v1 identity's digest is the one `retained` gives (a v0 identity has none
    /// to check).
    pub fn digest_matches(&self, retained: &[u8]) -> bool {
        match &self.digest {
            None => true,
            Some(d) => {
                let want = psk_digest(self.hash, retained, &self.hostnqn, &self.subnqn);
                subtle::ConstantTimeEq::ct_eq(want.as_bytes(), d.as_bytes()).into()
            }
        }
    }
}

impl fmt::Display for PskIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match self.version {
            IdentityVersion::V0 => 0,
            IdentityVersion::V1 => 1,
        };
        let kind = if self.generated { 'G' } else { 'R' };
        write!(
            f,
            "NVMe{v}{kind}{} {} {}",
            hash_code(self.hash),
            self.hostnqn,
            self.subnqn
        )?;
        if let Some(d) = &self.digest {
            write!(f, " {d}")?;
        }
        Ok(())
    }
}

/// The v1 identity's PSK digest: base64(HMAC-H(retained, "<hostnqn> <subnqn>
/// NVMe-over-Fabrics")).
pub fn psk_digest(hash: HashId, retained: &[u8], hostnqn: &str, subnqn: &str) -> String {
    let mac = hash.hmac(
        retained,
        &[
            hostnqn.as_bytes(),
            b" ",
            subnqn.as_bytes(),
            b" NVMe-over-Fabrics",
        ],
    );
    base64::engine::general_purpose::STANDARD.encode(&*mac)
}

/// HKDF-Extract with an all-zero salt.
fn extract(hash: HashId, ikm: &[u8]) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(match hash {
        HashId::Sha256 => Hkdf::<sha2::Sha256>::extract(None, ikm).0.to_vec(),
        HashId::Sha384 => Hkdf::<sha2::Sha384>::extract(None, ikm).0.to_vec(),
        HashId::Sha512 => Hkdf::<sha2::Sha512>::extract(None, ikm).0.to_vec(),
    })
}

/// TLS 1.3's HKDF-Expand-Label(prk, label, context, L) with L the hash length.
pub fn expand_label(hash: HashId, prk: &[u8], label: &[u8], context: &[u8]) -> Zeroizing<Vec<u8>> {
    expand_label_len(hash, prk, label, context, hash.len())
}

/// TLS 1.3's HKDF-Expand-Label(prk, label, context, len): the label gets the `tls13 ` prefix,
/// and the info is `u16 len || u8 |label| || label || u8 |context| || context`.
pub fn expand_label_len(
    hash: HashId,
    prk: &[u8],
    label: &[u8],
    context: &[u8],
    len: usize,
) -> Zeroizing<Vec<u8>> {
    let full = [b"tls13 ".as_slice(), label].concat();
    let mut info = Vec::with_capacity(4 + full.len() + context.len());
    info.extend_from_slice(&(len as u16).to_be_bytes());
    info.push(full.len() as u8);
    info.extend_from_slice(&full);
    info.push(context.len() as u8);
    info.extend_from_slice(context);
    let mut out = Zeroizing::new(vec![0u8; len]);
    let ok = match hash {
        HashId::Sha256 => Hkdf::<sha2::Sha256>::from_prk(prk).map(|h| h.expand(&info, &mut out)),
        HashId::Sha384 => Hkdf::<sha2::Sha384>::from_prk(prk).map(|h| h.expand(&info, &mut out)),
        HashId::Sha512 => Hkdf::<sha2::Sha512>::from_prk(prk).map(|h| h.expand(&info, &mut out)),
    };
    assert!(
        matches!(ok, Ok(Ok(()))),
        "HKDF-Expand of {len} bytes from a {}-byte PRK",
        prk.len()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:9b3c0a52-6f1e-4d0a-9a0e-2f5b7d4c1e01";
    const SUB: &str = "nqn.2024-11.io.selftest:tls-subsys";
    /// Bytes 00..1f as `nvme gen-tls-key --secret=000102...1f` prints them.
    const KEY01: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Known answers: the keys libnvme 1.16.2 put into the 6.12 kernel's `.nvme` keyring for
    /// this key and these NQNs (../shared/notes/tls.md, checked there against the keyring).
    #[test]
    fn derivations_match_libnvme_and_the_linux_keyring() {
        let k = ConfiguredPsk::parse(KEY01).unwrap();
        assert_eq!(k.hash(), HashId::Sha256);
        assert_eq!(k.to_text().as_str(), KEY01);
        let retained = k.retained(HOST);
        assert_eq!(
            hex(&retained),
            "e17d292c5a73859ba0c8f5ed4923e624f98e08053848e4a33208bc2bb3087392"
        );
        let (id0, psk0) = k.tls_psk(IdentityVersion::V0, HOST, SUB);
        assert_eq!(id0.to_string(), format!("NVMe0R01 {HOST} {SUB}"));
        assert_eq!(
            hex(&psk0),
            "210dc8aeaff9e9eb4e1a2c786861330c088c909bfd6c6c674d593b08ec153c40"
        );
        let (id1, psk1) = k.tls_psk(IdentityVersion::V1, HOST, SUB);
        assert_eq!(
            id1.to_string(),
            format!("NVMe1R01 {HOST} {SUB} 4qOV18m9nEv0V2l2SOUbiddMjk1EtkeUmO8i4DieTWI=")
        );
        assert_eq!(
            hex(&psk1),
            "dbb08d8b0b1fb0f01f3f5d284aa5c28f12a930cbd5c2c8817ebbe77199fb18ca"
        );
        // What the target gets in a ClientHello parses back to the same identity and key.
        for (id, psk) in [(id0, psk0), (id1, psk1)] {
            let back = PskIdentity::parse(id.to_string().as_bytes()).unwrap();
            assert_eq!(back, id);
            assert!(back.digest_matches(&retained));
            assert_eq!(back.tls_psk(&retained), psk);
        }
    }

    #[test]
    fn sha384_keys_round_trip_and_derive_48_bytes() {
        let key: Vec<u8> = (0..48).collect();
        let k = ConfiguredPsk::from_key(&key).unwrap();
        assert_eq!(k.hash(), HashId::Sha384);
        let text = k.to_text();
        assert!(text.starts_with("NVMeTLSkey-1:02:"));
        assert_eq!(ConfiguredPsk::parse(&text).unwrap(), k);
        let (id, psk) = k.tls_psk(IdentityVersion::V1, HOST, SUB);
        assert!(id.to_string().starts_with("NVMe1R02 "));
        assert_eq!(psk.len(), 48);
        assert_eq!(cipher_suite(id.hash), "TLS_AES_256_GCM_SHA384");
    }

    #[test]
    fn bad_keys_and_identities_are_refused_with_reasons() {
        assert_eq!(ConfiguredPsk::parse("DHHC-1:01:xx:"), Err(PskError::Prefix));
        assert!(matches!(
            ConfiguredPsk::parse("NVMeTLSkey-1:03:AAAA:"),
            Err(PskError::Hash(_))
        ));
        assert_eq!(
            ConfiguredPsk::parse("NVMeTLSkey-1:01:!!!:"),
            Err(PskError::Base64)
        );
        // A SHA-384 code on a 32-byte key.
        let wrong = KEY01.replace(":01:", ":02:");
        assert!(matches!(
            ConfiguredPsk::parse(&wrong),
            Err(PskError::Length(32, _, 48))
        ));
        // One changed character: the CRC catches it.
        let typo = KEY01.replace("AAEC", "AAED");
        assert_eq!(ConfiguredPsk::parse(&typo), Err(PskError::Crc));
        assert_eq!(
            PskIdentity::parse(b"NVMe2R01 a b"),
            Err(IdentityError::Prefix)
        );
        assert_eq!(
            PskIdentity::parse(b"NVMe1R01 a b"),
            Err(IdentityError::Fields),
            "v1 needs a digest"
        );
        assert_eq!(
            PskIdentity::parse(b"NVMe0R01 a b c"),
            Err(IdentityError::Fields),
            "v0 has none"
        );
        assert!(matches!(
            PskIdentity::parse(b"NVMe0R05 a b"),
            Err(IdentityError::Hash(_))
        ));
        let k = ConfiguredPsk::parse(KEY01).unwrap();
        let (id, _) = k.tls_psk(IdentityVersion::V1, HOST, SUB);
        let other = ConfiguredPsk::from_key(&[7u8; 32]).unwrap();
        assert!(!id.digest_matches(&other.retained(HOST)));
    }
}
