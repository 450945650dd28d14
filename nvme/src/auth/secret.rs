//! DH-HMAC-CHAP secrets in the representation `nvme gen-dhchap-key` prints and the Linux host
//! and target take: `DHHC-1:xx:<base64 of key || CRC-32 (little-endian)>:` (NVMe Base 2.0,
//! 8.13.5.8), and the key transformation of 8.13.5.7.

use std::fmt;

use base64::Engine;
use zeroize::{Zeroize, Zeroizing};

use super::HashId;

/// Why a secret's text was refused (the text itself is never quoted: it is a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a DH-HMAC-CHAP secret starts with `DHHC-1:` (as `nvme gen-dhchap-key` prints it)")]
    Prefix,
    #[error(
        "the transformation hash `{0}` is not one of 00 (none), 01 (SHA-256), 02 (SHA-384), \
         03 (SHA-512)"
    )]
    Transform(String),
    #[error("the key is not base64 followed by `:`")]
    Base64,
    #[error("the key is {0} bytes; it must be 32, 48 or 64 (plus a 4-byte CRC)")]
    Length(usize),
    #[error("the key's CRC-32 does not match (a mistyped or truncated secret)")]
    Crc,
}

/// A configured DH-HMAC-CHAP secret: the key bytes and the hash its transformation uses.
/// The key is zeroed when dropped and never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Zeroizing<Vec<u8>>,
    /// `None`: the key is used as it is (`DHHC-1:00:`).
    transform: Option<HashId>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes, redacted)", self.key.len())
    }
}

impl Secret {
    /// Parses `DHHC-1:xx:<base64>:` (the trailing `:` may be left out, as Linux allows).
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let text = text.trim();
        let rest = text.strip_prefix("DHHC-1:").ok_or(SecretError::Prefix)?;
        let (hash, b64) = rest.split_once(':').ok_or(SecretError::Prefix)?;
        let transform = match hash {
            "00" => None,
            "01" => Some(HashId::Sha256),
            "02" => Some(HashId::Sha384),
            "03" => Some(HashId::Sha512),
            other => return Err(SecretError::Transform(other.chars().take(4).collect())),
        };
        let b64 = b64.strip_suffix(':').unwrap_or(b64);
        let mut raw = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| SecretError::Base64)?,
        );
        if raw.len() < 4 || !matches!(raw.len() - 4, 32 | 48 | 64) {
            return Err(SecretError::Length(raw.len().saturating_sub(4)));
        }
        // Linux 6.1 also insisted that the key length match the transformation hash; 6.7 and
        // later take any of the three lengths with any hash, and so does this.
        let n = raw.len() - 4;
        let crc = u32::from_le_bytes([raw[n], raw[n + 1], raw[n + 2], raw[n + 3]]);
        if crc32fast::hash(&raw[..n]) != crc {
            return Err(SecretError::Crc);
        }
        raw.truncate(n);
        Ok(Secret {
            key: raw,
            transform,
        })
    }

    /// A secret from key bytes (32, 48 or 64) and the transformation hash.
    pub fn from_key(key: &[u8], transform: Option<HashId>) -> Result<Secret, SecretError> {
        if !matches!(key.len(), 32 | 48 | 64) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(Secret {
            key: Zeroizing::new(key.to_vec()),
            transform,
        })
    }

    /// The representation `nvme gen-dhchap-key` prints (a secret: for key files and tests).
    pub fn to_text(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(Vec::with_capacity(self.key.len() + 4));
        raw.extend_from_slice(&self.key);
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        let hash = self.transform.map_or(0, |h| h as u8);
        let mut b64 = base64::engine::general_purpose::STANDARD.encode(&*raw);
        let text = format!("DHHC-1:{hash:02}:{b64}:");
        b64.zeroize();
        Zeroizing::new(text)
    }

    /// Key length in bytes.
    pub fn len(&self) -> usize {
        self.key.len()
    }

    /// Never true (a secret has 32, 48 or 64 bytes); for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        self.key.is_empty()
    }

    /// The transformed key of NVMe Base 2.0 8.13.5.7 that keys the response HMAC:
    /// `HMAC-H(key, NQN || "NVMe-over-Fabrics")` with the secret's own hash H, or the key
    /// itself for `DHHC-1:00:`. `nqn` is the host NQN for a host secret and the subsystem NQN
    /// for a controller secret (as Linux's `nvme_auth_transform_key` is called).
    pub fn transform(&self, nqn: &str) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}
