//! Kernel TLS: after the handshake, the socket takes the records itself (`TCP_ULP` "tls",
//! then `TLS_TX` / `TLS_RX` keyed with the application traffic keys), and the connection goes
//! on with plain reads and gathered sends, as without TLS (Linux `Documentation/networking/tls.rst`).
//!
//! The keys are the TLS 1.3 ones (RFC 8446 7.3): key = HKDF-Expand-Label(secret, "key", "",
//! key length), iv = HKDF-Expand-Label(secret, "iv", "", 12); the kernel takes the iv as a
//! 4-byte salt and an 8-byte rest. Both directions start at record sequence 0: nothing has
//! been sent or received under the application keys when the session is handed over (no
//! session tickets are sent, and the handshake took no byte past its last record).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use nvme::auth::HashId;
use zeroize::Zeroizing;

/// One direction's keys.
pub struct TrafficKeys {
    pub key: Zeroizing<Vec<u8>>,
    pub iv: Zeroizing<[u8; 12]>,
}

impl std::fmt::Debug for TrafficKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrafficKeys({}-byte key, redacted)", self.key.len())
    }
}

impl TrafficKeys {
    /// From a traffic secret, for the suite of `hash` (AES-128-GCM with SHA-256, AES-256-GCM
    /// with SHA-384).
    pub fn from_secret(hash: HashId, secret: &[u8]) -> TrafficKeys {
        let key_len = if hash == HashId::Sha384 { 32 } else { 16 };
        let key = nvme::tls::expand_label_len(hash, secret, b"key", b"", key_len);
        let iv_v = nvme::tls::expand_label_len(hash, secret, b"iv", b"", 12);
        let mut iv = Zeroizing::new([0u8; 12]);
        iv.copy_from_slice(&iv_v);
        TrafficKeys { key, iv }
    }
}

/// Both directions of a session, for the side that sends with `tx`.
#[derive(Debug)]
pub struct KtlsKeys {
    pub hash: HashId,
    pub tx: TrafficKeys,
    pub rx: TrafficKeys,
}

fn setsockopt<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    v: &T,
) -> io::Result<()> {
    // SAFETY: `v` is a live value of the size passed; the kernel copies it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn crypto_info(hash: HashId, k: &TrafficKeys) -> CryptoInfo {
    let mut salt = [0u8; 4];
    salt.copy_from_slice(&k.iv[..4]);
    let mut iv = [0u8; 8];
    iv.copy_from_slice(&k.iv[4..]);
    if hash == HashId::Sha384 {
        let mut key = [0u8; 32];
        key.copy_from_slice(&k.key);
        CryptoInfo::Gcm256(libc::tls12_crypto_info_aes_gcm_256 {
            info: libc::tls_crypto_info {
                version: libc::TLS_1_3_VERSION,
                cipher_type: libc::TLS_CIPHER_AES_GCM_256,
            },
            iv,
            key,
            salt,
            rec_seq: [0; 8],
        })
    } else {
        let mut key = [0u8; 16];
        key.copy_from_slice(&k.key);
        CryptoInfo::Gcm128(libc::tls12_crypto_info_aes_gcm_128 {
            info: libc::tls_crypto_info {
                version: libc::TLS_1_3_VERSION,
                cipher_type: libc::TLS_CIPHER_AES_GCM_128,
            },
            iv,
            key,
            salt,
            rec_seq: [0; 8],
        })
    }
}

enum CryptoInfo {
    Gcm128(libc::tls12_crypto_info_aes_gcm_128),
    Gcm256(libc::tls12_crypto_info_aes_gcm_256),
}

impl Drop for CryptoInfo {
    fn drop(&mut self) {
        // The keys are secrets: zero them (volatile, so the writes stay).
        let (p, n) = match self {
            CryptoInfo::Gcm128(c) => ((c as *mut _ as *mut u8), std::mem::size_of_val(c)),
            CryptoInfo::Gcm256(c) => ((c as *mut _ as *mut u8), std::mem::size_of_val(c)),
        };
        for i in 0..n {
            // SAFETY: `p..p + n` is this value's own memory.
            unsafe { std::ptr::write_volatile(p.add(i), 0) };
        }
    }
}

/// Hands the session to the kernel: `TCP_ULP` "tls", then both directions' keys. An error
/// with `ENOENT` (or `ENOPROTOOPT`) means the kernel has no tls module; the socket is then
/// unchanged and the records stay in user space. After success, plain reads and writes carry
/// application data, and a record of another type (an alert) fails a read with `EIO`.
pub fn enable(fd: BorrowedFd<'_>, keys: &KtlsKeys) -> io::Result<()> {
    // SAFETY: the name is a live NUL-free byte string of the length passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_TCP,
            libc::TCP_ULP,
            b"tls".as_ptr().cast(),
            3,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    for (name, k) in [(libc::TLS_TX, &keys.tx), (libc::TLS_RX, &keys.rx)] {
        match crypto_info(keys.hash, k) {
            CryptoInfo::Gcm128(ref c) => setsockopt(fd, libc::SOL_TLS, name, c)?,
            CryptoInfo::Gcm256(ref c) => setsockopt(fd, libc::SOL_TLS, name, c)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8448 3 (a simple 1-RTT handshake): the server's application traffic secret gives
    /// this key and iv.
    #[test]
    fn traffic_keys_match_rfc8448() {
        let secret = hex("a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643");
        let k = TrafficKeys::from_secret(HashId::Sha256, &secret);
        assert_eq!(to_hex(&k.key), "9f02283b6c9c07efc26bb9f2ac92e356");
        assert_eq!(to_hex(&k.iv[..]), "cf782b88dd83549aadf1e984");
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn to_hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
