//! The TLS 1.3 external-PSK callbacks of OpenSSL that rust-openssl does not wrap
//! (`SSL_CTX_set_psk_find_session_callback`, `SSL_CTX_set_psk_use_session_callback`), and the
//! per-connection state they read (kept in the `SSL`'s extra data).
//!
//! In TLS 1.3 OpenSSL takes an external PSK as an `SSL_SESSION` that holds the key as its
//! master key, the cipher suite whose hash goes with it, and the protocol version. The server's
//! callback gets the identity the ClientHello offers and returns such a session (or none: the
//! handshake then fails); the client's returns the identity it offers and the session.

use std::ffi::{c_int, c_uchar};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use foreign_types::ForeignTypeRef;
use nvme::auth::HashId;
use nvme::tls::PskIdentity;
use openssl::ex_data::Index;
use openssl::ssl::{Ssl, SslRef};
use openssl_sys as ffi;
use zeroize::Zeroizing;

use crate::KeyLookup;

type FindSessionCb =
    unsafe extern "C" fn(*mut ffi::SSL, *const c_uchar, usize, *mut *mut ffi::SSL_SESSION) -> c_int;
type UseSessionCb = unsafe extern "C" fn(
    *mut ffi::SSL,
    *const ffi::EVP_MD,
    *mut *const c_uchar,
    *mut usize,
    *mut *mut ffi::SSL_SESSION,
) -> c_int;

extern "C" {
    fn SSL_CTX_set_psk_find_session_callback(ctx: *mut ffi::SSL_CTX, cb: Option<FindSessionCb>);
    fn SSL_CTX_set_psk_use_session_callback(ctx: *mut ffi::SSL_CTX, cb: Option<UseSessionCb>);
    fn SSL_SESSION_new() -> *mut ffi::SSL_SESSION;
    fn SSL_SESSION_set1_master_key(
        s: *mut ffi::SSL_SESSION,
        key: *const c_uchar,
        len: usize,
    ) -> c_int;
    fn SSL_SESSION_set_cipher(s: *mut ffi::SSL_SESSION, c: *const ffi::SSL_CIPHER) -> c_int;
    fn SSL_SESSION_set_protocol_version(s: *mut ffi::SSL_SESSION, v: c_int) -> c_int;
    fn SSL_CIPHER_find(ssl: *mut ffi::SSL, ptr: *const c_uchar) -> *const ffi::SSL_CIPHER;
}

const TLS1_3_VERSION: c_int = 0x0304;

/// The traffic secrets OpenSSL reports through its key log (what kernel TLS is keyed from).
#[derive(Default)]
pub(crate) struct Secrets {
    pub client: Option<Zeroizing<Vec<u8>>>,
    pub server: Option<Zeroizing<Vec<u8>>>,
}

/// What a client offers: its identity and the TLS PSK it names.
pub(crate) struct Offer {
    pub identity: Vec<u8>,
    pub hash: HashId,
    pub psk: Zeroizing<Vec<u8>>,
}

/// One connection's state, in its `SSL`'s extra data.
pub(crate) struct State {
    /// Server: where identities are looked up.
    pub lookup: Option<Arc<dyn KeyLookup>>,
    /// Client: what it offers.
    pub offer: Option<Offer>,
    /// The identity the handshake went with.
    pub chosen: Mutex<Option<PskIdentity>>,
    /// Why the server had no key for the offered identity.
    pub refused: Mutex<Option<String>>,
    pub secrets: Mutex<Secrets>,
}

impl State {
    pub fn new(lookup: Option<Arc<dyn KeyLookup>>, offer: Option<Offer>) -> State {
        State {
            lookup,
            offer,
            chosen: Mutex::new(None),
            refused: Mutex::new(None),
            secrets: Mutex::new(Secrets::default()),
        }
    }
}

/// The extra-data index of [`State`] (one for the process).
pub(crate) fn index() -> Index<Ssl, State> {
    static INDEX: OnceLock<Index<Ssl, State>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("an SSL extra-data index"))
}

pub(crate) fn state(ssl: &SslRef) -> Option<&State> {
    ssl.ex_data(index())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Installs the server's callback on `ctx`.
pub(crate) fn set_server_callback(ctx: &mut openssl::ssl::SslContextBuilder) {
    // SAFETY: a live context under construction; the callback is a plain function.
    unsafe { SSL_CTX_set_psk_find_session_callback(ctx.as_ptr(), Some(find_session)) }
}

/// Installs the client's callback on `ctx`.
pub(crate) fn set_client_callback(ctx: &mut openssl::ssl::SslContextBuilder) {
    // SAFETY: as above.
    unsafe { SSL_CTX_set_psk_use_session_callback(ctx.as_ptr(), Some(use_session)) }
}

/// A TLS 1.3 session holding `key` as an external PSK, with the suite of `hash`; null if
/// OpenSSL refuses any part of it.
///
/// # Safety
/// `ssl` must be a live `SSL` (the one in whose callback this runs).
unsafe fn psk_session(ssl: *mut ffi::SSL, key: &[u8], hash: HashId) -> *mut ffi::SSL_SESSION {
    let id: [u8; 2] = match hash {
        HashId::Sha384 => [0x13, 0x02],
        _ => [0x13, 0x01],
    };
    // SAFETY: `ssl` is live (the caller's promise); `id` is 2 readable bytes.
    let cipher = unsafe { SSL_CIPHER_find(ssl, id.as_ptr()) };
    if cipher.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a fresh session, filled below and freed on any failure.
    unsafe {
        let s = SSL_SESSION_new();
        if s.is_null() {
            return s;
        }
        if SSL_SESSION_set1_master_key(s, key.as_ptr(), key.len()) != 1
            || SSL_SESSION_set_cipher(s, cipher) != 1
            || SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1
        {
            ffi::SSL_SESSION_free(s);
            return std::ptr::null_mut();
        }
        s
    }
}

/// The server's callback: the identity a ClientHello offers, looked up; a session with its
/// TLS PSK, or failure (0: the handshake ends with an alert) when there is none.
unsafe extern "C" fn find_session(
    ssl: *mut ffi::SSL,
    identity: *const c_uchar,
    len: usize,
    sess: *mut *mut ffi::SSL_SESSION,
) -> c_int {
    // SAFETY: OpenSSL passes the live SSL of this handshake, `len` readable bytes of identity
    // and a live out-pointer.
    let (ssl_ref, id, out) = unsafe {
        (
            SslRef::from_ptr(ssl),
            std::slice::from_raw_parts(identity, len),
            &mut *sess,
        )
    };
    *out = std::ptr::null_mut();
    let Some(st) = state(ssl_ref) else { return 0 };
    let Some(lookup) = &st.lookup else { return 0 };
    let parsed = match PskIdentity::parse(id) {
        Ok(p) => p,
        Err(e) => {
            *lock(&st.refused) = Some(format!(
                "PSK identity `{}`: {e}",
                String::from_utf8_lossy(&id[..id.len().min(300)])
            ));
            return 0;
        }
    };
    match lookup.tls_psk(&parsed) {
        Ok(key) => {
            // SAFETY: `ssl` is this handshake's.
            let s = unsafe { psk_session(ssl, &key, parsed.hash) };
            if s.is_null() {
                *lock(&st.refused) = Some("OpenSSL refused the PSK session".into());
                return 0;
            }
            *lock(&st.chosen) = Some(parsed);
            *out = s;
            1
        }
        Err(why) => {
            *lock(&st.refused) = Some(format!("PSK identity `{parsed}`: {why}"));
            0
        }
    }
}

/// The client's callback: its identity and a session with the TLS PSK. `md`, when set, is
/// the hash an earlier round fixed (a HelloRetryRequest): a PSK of another hash is not offered.
unsafe extern "C" fn use_session(
    ssl: *mut ffi::SSL,
    md: *const ffi::EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut ffi::SSL_SESSION,
) -> c_int {
    // SAFETY: OpenSSL passes the live SSL of this handshake and live out-pointers.
    let (ssl_ref, id, idlen, out) =
        unsafe { (SslRef::from_ptr(ssl), &mut *id, &mut *idlen, &mut *sess) };
    *out = std::ptr::null_mut();
    let Some(offer) = state(ssl_ref).and_then(|s| s.offer.as_ref()) else {
        return 1;
    };
    if !md.is_null() {
        let want = match offer.hash {
            HashId::Sha384 => openssl::hash::MessageDigest::sha384(),
            _ => openssl::hash::MessageDigest::sha256(),
        };
        // SAFETY: both are OpenSSL digest descriptions.
        if unsafe { ffi::EVP_MD_get_type(md) } != unsafe { ffi::EVP_MD_get_type(want.as_ptr()) } {
            return 1;
        }
    }
    // SAFETY: `ssl` is this handshake's.
    let s = unsafe { psk_session(ssl, &offer.psk, offer.hash) };
    if s.is_null() {
        return 0;
    }
    // The identity lives in the SSL's extra data, as long as the SSL.
    *id = offer.identity.as_ptr();
    *idlen = offer.identity.len();
    *out = s;
    1
}
