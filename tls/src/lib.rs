//! NVMe/TCP's secure channel: TLS 1.3 with pre-shared keys (NVMe TCP Transport 1.1, 3.6),
//! for the target and the initiator.
//!
//! - [`Session`]: one side of a TLS 1.3 session run by OpenSSL over memory (ciphertext in,
//!   ciphertext out), PSK only: the cipher suites TLS_AES_128_GCM_SHA256 and
//!   TLS_AES_256_GCM_SHA384, no certificates, no session tickets or resumption. The server
//!   finds the key for the identity a ClientHello offers through a [`KeyLookup`]; the client
//!   offers one identity ([`ClientConfig`]). The PSKs themselves are `nvme::tls`'s.
//! - [`Handshake`]: drives a session's handshake over a non-blocking socket without taking a
//!   byte past the handshake's last record, so the session can then go to the kernel.
//! - [`ktls`]: hands an established session to kernel TLS; the socket is then used as a plain
//!   one (gathered sends and reads unchanged).
//! - [`TlsStream`]: where the kernel has no TLS, the records in user space over the socket.
//!
//! Kernel TLS is keyed from the traffic secrets OpenSSL reports through its key-log callback
//! (OpenSSL 3.0 has no other way to export them, and Debian's is built without its own kTLS);
//! they never leave the process and are zeroed when dropped.

mod psk;

pub mod ktls;

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, PoisonError};

use nvme::auth::HashId;
pub use nvme::tls::{ConfiguredPsk, IdentityVersion, PskError, PskIdentity};
use openssl::error::ErrorStack;
use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslRef,
    SslSessionCacheMode, SslStream, SslVerifyMode, SslVersion,
};
use zeroize::Zeroizing;

use ktls::{KtlsKeys, TrafficKeys};

/// Where a server finds the TLS PSK of an identity a host offers.
pub trait KeyLookup: Send + Sync {
    /// The TLS PSK the identity names, or why there is none (logged; never a key).
    fn tls_psk(&self, id: &PskIdentity) -> Result<Zeroizing<Vec<u8>>, String>;
}

/// What went wrong on a TLS session.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS handshake failed: {0}")]
    Handshake(String),
    #[error("the peer closed the TLS session")]
    Closed,
    #[error("TLS: {0}")]
    Protocol(String),
    #[error("TLS set-up: {0}")]
    Setup(#[from] ErrorStack),
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<TlsError> for io::Error {
    fn from(e: TlsError) -> io::Error {
        match e {
            TlsError::Io(e) => e,
            TlsError::Closed => io::Error::new(io::ErrorKind::UnexpectedEof, e),
            e => io::Error::new(io::ErrorKind::ConnectionAborted, e),
        }
    }
}

/// The suites offered and accepted.
pub const CIPHER_SUITES: &str = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384";

fn context() -> Result<SslContextBuilder, ErrorStack> {
    let mut b = SslContextBuilder::new(SslMethod::tls())?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ciphersuites(CIPHER_SUITES)?;
    b.set_options(SslOptions::NO_TICKET);
    b.set_num_tickets(0)?;
    b.set_session_cache_mode(SslSessionCacheMode::OFF);
    b.set_verify(SslVerifyMode::NONE);
    b.set_keylog_callback(record_secret);
    Ok(b)
}

/// Keeps the application traffic secrets of the key log (the handshake ones are not needed).
fn record_secret(ssl: &SslRef, line: &str) {
    let mut f = line.split(' ');
    let (Some(label), Some(_random), Some(hex)) = (f.next(), f.next(), f.next()) else {
        return;
    };
    let Some(st) = psk::state(ssl) else { return };
    let Some(secret) = from_hex(hex) else { return };
    let mut s = st.secrets.lock().unwrap_or_else(PoisonError::into_inner);
    match label {
        "CLIENT_TRAFFIC_SECRET_0" => s.client = Some(secret),
        "SERVER_TRAFFIC_SECRET_0" => s.server = Some(secret),
        _ => {}
    }
}

fn from_hex(s: &str) -> Option<Zeroizing<Vec<u8>>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let mut out = Zeroizing::new(Vec::with_capacity(s.len() / 2));
    for i in (0..s.len()).step_by(2) {
        out.push(u8::from_str_radix(s.get(i..i + 2)?, 16).ok()?);
    }
    Some(out)
}

/// The server side's configuration: one per listener (cheap to share).
#[derive(Clone)]
pub struct ServerConfig {
    ctx: SslContext,
    lookup: Arc<dyn KeyLookup>,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerConfig")
    }
}

impl ServerConfig {
    pub fn new(lookup: Arc<dyn KeyLookup>) -> Result<ServerConfig, TlsError> {
        let mut b = context()?;
        psk::set_server_callback(&mut b);
        Ok(ServerConfig {
            ctx: b.build(),
            lookup,
        })
    }
}

/// The client side's configuration: the identity it offers and the TLS PSK that names.
#[derive(Clone)]
pub struct ClientConfig {
    ctx: SslContext,
    identity: PskIdentity,
    psk: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientConfig({}, key redacted)", self.identity)
    }
}

impl ClientConfig {
    /// For `key` between `hostnqn` and `subnqn`, offering the identity of `version`.
    pub fn new(
        key: &ConfiguredPsk,
        version: IdentityVersion,
        hostnqn: &str,
        subnqn: &str,
    ) -> Result<ClientConfig, TlsError> {
        let (identity, psk) = key.tls_psk(version, hostnqn, subnqn);
        Self::with_identity(identity, psk)
    }

    /// Offering `identity` with `psk` as they are (tests: an identity of another form).
    pub fn with_identity(
        identity: PskIdentity,
        psk: Zeroizing<Vec<u8>>,
    ) -> Result<ClientConfig, TlsError> {
        let mut b = context()?;
        psk::set_client_callback(&mut b);
        Ok(ClientConfig {
            ctx: b.build(),
            identity,
            psk,
        })
    }

    pub fn identity(&self) -> &PskIdentity {
        &self.identity
    }
}

/// The transport's memory: ciphertext that came in, ciphertext to go out.
#[derive(Default)]
struct Pipe {
    rx: Vec<u8>,
    rx_pos: usize,
    eof: bool,
    tx: Vec<u8>,
    tx_pos: usize,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let avail = &self.rx[self.rx_pos..];
        if avail.is_empty() {
            if self.eof {
                return Ok(0);
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.rx_pos += n;
        if self.rx_pos == self.rx.len() {
            self.rx.clear();
            self.rx_pos = 0;
        }
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.tx_pos > 0 && self.tx_pos * 2 >= self.tx.len() {
            self.tx.drain(..self.tx_pos);
            self.tx_pos = 0;
        }
        self.tx.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One side of a TLS 1.3 PSK session, over memory.
pub struct Session {
    s: SslStream<Pipe>,
    established: bool,
    server: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("server", &self.server)
            .field("established", &self.established)
            .finish_non_exhaustive()
    }
}

impl Session {
    pub fn server(cfg: &ServerConfig) -> Result<Session, TlsError> {
        Self::new(
            &cfg.ctx,
            psk::State::new(Some(cfg.lookup.clone()), None),
            true,
            None,
        )
    }

    pub fn client(cfg: &ClientConfig) -> Result<Session, TlsError> {
        let offer = psk::Offer {
            identity: cfg.identity.to_string().into_bytes(),
            hash: cfg.identity.hash,
            psk: cfg.psk.clone(),
        };
        let st = psk::State::new(None, Some(offer));
        *st.chosen.lock().unwrap_or_else(PoisonError::into_inner) = Some(cfg.identity.clone());
        // Only the suite of the key's hash: a server picks the suite before it looks at the
        // PSK, and takes a PSK only with a suite of its hash.
        let suite = nvme::tls::cipher_suite(cfg.identity.hash);
        Self::new(&cfg.ctx, st, false, Some(suite))
    }

    fn new(
        ctx: &SslContext,
        st: psk::State,
        server: bool,
        suite: Option<&str>,
    ) -> Result<Session, TlsError> {
        let mut ssl = Ssl::new(ctx)?;
        if let Some(suite) = suite {
            ssl.set_ciphersuites(suite)?;
        }
        ssl.set_ex_data(psk::index(), st);
        if server {
            ssl.set_accept_state();
        } else {
            ssl.set_connect_state();
        }
        let s = SslStream::new(ssl, Pipe::default())?;
        Ok(Session {
            s,
            established: false,
            server,
        })
    }

    /// Ciphertext from the peer.
    pub fn feed(&mut self, b: &[u8]) {
        self.s.get_mut().rx.extend_from_slice(b);
    }

    /// The peer closed its side of the connection.
    pub fn feed_eof(&mut self) {
        self.s.get_mut().eof = true;
    }

    /// Ciphertext taken in and not yet consumed by OpenSSL.
    pub fn input_pending(&self) -> usize {
        let p = self.s.get_ref();
        p.rx.len() - p.rx_pos
    }

    /// Ciphertext to send.
    pub fn output(&self) -> &[u8] {
        let p = self.s.get_ref();
        &p.tx[p.tx_pos..]
    }

    /// `n` bytes of [`Session::output`] went out.
    pub fn consume_output(&mut self, n: usize) {
        let p = self.s.get_mut();
        p.tx_pos = (p.tx_pos + n).min(p.tx.len());
        if p.tx_pos == p.tx.len() {
            p.tx.clear();
            p.tx_pos = 0;
        }
    }

    /// Runs the handshake on what came in; true once it is complete (its last output may
    /// still wait in [`Session::output`]).
    pub fn handshake(&mut self) -> Result<bool, TlsError> {
        if self.established {
            return Ok(true);
        }
        match self.s.do_handshake() {
            Ok(()) => {
                self.established = true;
                Ok(true)
            }
            Err(e) if e.code() == ErrorCode::WANT_READ => Ok(false),
            Err(e) => Err(TlsError::Handshake(self.explain(&e))),
        }
    }

    fn explain(&self, e: &openssl::ssl::Error) -> String {
        if let Some(why) = psk::state(self.s.ssl()).and_then(|s| {
            s.refused
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        }) {
            return why;
        }
        if e.code() == ErrorCode::SYSCALL && e.io_error().is_none() {
            return "the peer closed the connection".into();
        }
        match e.ssl_error() {
            Some(stack) => stack
                .errors()
                .iter()
                .map(|x| x.reason().unwrap_or("unknown").to_owned())
                .collect::<Vec<_>>()
                .join("; "),
            None => e.to_string(),
        }
    }

    pub fn is_established(&self) -> bool {
        self.established
    }

    /// Plaintext that arrived: Ok(0) when none is there now; [`TlsError::Closed`] when the
    /// peer ended the session (close_notify, or the connection closed).
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, TlsError> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self.s.ssl_read(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.code() == ErrorCode::WANT_READ => Ok(0),
            Err(e) if e.code() == ErrorCode::ZERO_RETURN => Err(TlsError::Closed),
            Err(e) if e.code() == ErrorCode::SYSCALL && e.io_error().is_none() => {
                Err(TlsError::Closed)
            }
            Err(e) => Err(TlsError::Protocol(self.explain(&e))),
        }
    }

    /// Encrypts `data` into [`Session::output`] (all of it).
    pub fn write(&mut self, data: &[u8]) -> Result<(), TlsError> {
        let mut off = 0;
        while off < data.len() {
            match self.s.ssl_write(&data[off..]) {
                Ok(n) => off += n,
                Err(e) => return Err(TlsError::Protocol(self.explain(&e))),
            }
        }
        Ok(())
    }

    /// The identity the session went with (the server: what the host offered and was found;
    /// the client: what it offered).
    pub fn identity(&self) -> Option<PskIdentity> {
        psk::state(self.s.ssl()).and_then(|s| {
            s.chosen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        })
    }

    /// The negotiated suite's name.
    pub fn cipher(&self) -> &'static str {
        self.s
            .ssl()
            .current_cipher()
            .and_then(|c| c.standard_name())
            .unwrap_or("none")
    }

    /// The hash of the negotiated suite.
    pub fn hash(&self) -> HashId {
        if self.cipher().ends_with("SHA384") {
            HashId::Sha384
        } else {
            HashId::Sha256
        }
    }

    /// The keys for kernel TLS, this side's sending direction first. `None` before the
    /// handshake completed, or once any application data went through OpenSSL (the kernel
    /// starts at record 0).
    pub fn ktls_keys(&self) -> Option<KtlsKeys> {
        if !self.established {
            return None;
        }
        let st = psk::state(self.s.ssl())?;
        let s = st.secrets.lock().unwrap_or_else(PoisonError::into_inner);
        let (client, server) = (s.client.as_ref()?, s.server.as_ref()?);
        let hash = self.hash();
        let (tx, rx) = if self.server {
            (server, client)
        } else {
            (client, server)
        };
        Some(KtlsKeys {
            hash,
            tx: TrafficKeys::from_secret(hash, tx),
            rx: TrafficKeys::from_secret(hash, rx),
        })
    }
}

/// Reads one TLS record at a time from a socket, never more than the record: the 5-byte
/// header (type, version, length), then the length it names.
#[derive(Debug, Default)]
struct RecordReader {
    buf: Vec<u8>,
}

/// The largest TLS 1.3 record body (2^14 + 256).
const MAX_RECORD: usize = 16384 + 256;

impl RecordReader {
    /// Bytes still missing from the current record.
    fn missing(&self) -> usize {
        if self.buf.len() < 5 {
            return 5 - self.buf.len();
        }
        let len = u16::from_be_bytes([self.buf[3], self.buf[4]]) as usize;
        5 + len - self.buf.len()
    }

    /// Reads what the socket has of the current record: `Some(record)` once it is whole,
    /// `None` when the socket would block.
    fn read_from(&mut self, sock: &mut impl Read) -> Result<Option<Vec<u8>>, TlsError> {
        loop {
            let want = self.missing();
            if want == 0 {
                return Ok(Some(std::mem::take(&mut self.buf)));
            }
            let at = self.buf.len();
            self.buf.resize(at + want, 0);
            match sock.read(&mut self.buf[at..]) {
                Ok(0) => {
                    self.buf.truncate(at);
                    return Err(TlsError::Handshake(
                        "the peer closed the connection during the handshake".into(),
                    ));
                }
                Ok(n) => {
                    self.buf.truncate(at + n);
                    // A record starts with its content type (change_cipher_spec, alert,
                    // handshake, application_data) and the legacy version 3.x: anything else
                    // (a plain NVMe/TCP ICReq starts with 00h) is refused at once.
                    if !self.buf.is_empty() && !(20..=23).contains(&self.buf[0])
                        || self.buf.len() >= 2 && self.buf[1] != 3
                    {
                        return Err(TlsError::Handshake(format!(
                            "not a TLS record (first bytes {:02x?}): a plain NVMe/TCP host?",
                            &self.buf[..self.buf.len().min(2)]
                        )));
                    }
                    if self.buf.len() == 5 {
                        let len = u16::from_be_bytes([self.buf[3], self.buf[4]]) as usize;
                        if len > MAX_RECORD {
                            return Err(TlsError::Handshake(format!(
                                "not a TLS record (type {}, length {len})",
                                self.buf[0]
                            )));
                        }
                    }
                }
                Err(e) => {
                    self.buf.truncate(at);
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return Ok(None),
                        io::ErrorKind::Interrupted => continue,
                        _ => return Err(e.into()),
                    }
                }
            }
        }
    }
}

/// Drives a session's handshake over a socket (blocking or not), one record at a time, so
/// that nothing past the handshake is taken from the socket.
#[derive(Debug)]
pub struct Handshake<S> {
    sock: S,
    sess: Session,
    rec: RecordReader,
    done: bool,
}

impl<S: Read + Write> Handshake<S> {
    pub fn new(sock: S, sess: Session) -> Handshake<S> {
        Handshake {
            sock,
            sess,
            rec: RecordReader::default(),
            done: false,
        }
    }

    /// Sends what is queued, reads what has come, runs the handshake: true once it is
    /// complete and its output sent; false when the socket would block (wait for it to be
    /// readable, or writable when [`Handshake::wants_write`]).
    pub fn step(&mut self) -> Result<bool, TlsError> {
        loop {
            while !self.sess.output().is_empty() {
                match self.sock.write(self.sess.output()) {
                    Ok(0) => return Err(TlsError::Closed),
                    Ok(n) => self.sess.consume_output(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if self.done {
                return Ok(true);
            }
            if self.sess.handshake()? {
                self.done = true;
                continue;
            }
            if !self.sess.output().is_empty() {
                continue;
            }
            match self.rec.read_from(&mut self.sock)? {
                Some(record) => self.sess.feed(&record),
                None => return Ok(false),
            }
        }
    }

    /// Output waits for the socket to take it.
    pub fn wants_write(&self) -> bool {
        !self.sess.output().is_empty()
    }

    pub fn socket(&self) -> &S {
        &self.sock
    }

    pub fn session(&self) -> &Session {
        &self.sess
    }

    /// The socket and the session, once [`Handshake::step`] said true.
    pub fn into_parts(self) -> (S, Session) {
        (self.sock, self.sess)
    }
}

/// How much ciphertext may wait for the socket before sends stop taking plaintext.
const BACKLOG_MAX: usize = 256 * 1024;

/// A session's records in user space over a socket: plaintext in and out, the socket's
/// blocking mode kept (a non-blocking socket gives `WouldBlock`).
#[derive(Debug)]
pub struct TlsStream<S> {
    sock: S,
    sess: Session,
    scratch: Box<[u8]>,
    /// Plaintext gathered into one record before it is encrypted.
    gather: Vec<u8>,
}

/// The most plaintext a TLS record carries (2^14).
const RECORD_PLAINTEXT: usize = 16384;

impl<S: Read + Write> TlsStream<S> {
    /// After a completed handshake.
    pub fn new(sock: S, sess: Session) -> TlsStream<S> {
        TlsStream {
            sock,
            sess,
            scratch: vec![0u8; 64 * 1024].into_boxed_slice(),
            gather: Vec::with_capacity(RECORD_PLAINTEXT),
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.sock
    }

    pub fn get_mut(&mut self) -> &mut S {
        &mut self.sock
    }

    pub fn session(&self) -> &Session {
        &self.sess
    }

    /// Sends waiting ciphertext: true when none is left.
    pub fn drain(&mut self) -> io::Result<bool> {
        while !self.sess.output().is_empty() {
            match self.sock.write(self.sess.output()) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sess.consume_output(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Ciphertext waiting for the socket.
    pub fn backlog(&self) -> usize {
        self.sess.output().len()
    }

    /// Encrypts as much of `iov` as the backlog allows and sends what the socket takes:
    /// `Ok(None)` when nothing was taken (the backlog is full), else the plaintext bytes
    /// taken (their ciphertext is sent, or waits for [`TlsStream::drain`]).
    pub fn send_gather(&mut self, iov: &[IoSlice<'_>]) -> io::Result<Option<usize>> {
        self.drain()?;
        // The pieces (a PDU header, its data, a digest, the next PDU...) are gathered into
        // full records: a record per piece would cost a record's overhead and a cipher call
        // for every 8-byte header.
        let mut taken = 0;
        let mut rec = std::mem::take(&mut self.gather);
        rec.clear();
        'pieces: for s in iov {
            let mut off = 0;
            while off < s.len() {
                if rec.is_empty() && self.backlog() >= BACKLOG_MAX {
                    break 'pieces;
                }
                let n = (s.len() - off).min(RECORD_PLAINTEXT - rec.len());
                rec.extend_from_slice(&s[off..off + n]);
                off += n;
                if rec.len() == RECORD_PLAINTEXT {
                    self.sess.write(&rec).map_err(io::Error::from)?;
                    taken += rec.len();
                    rec.clear();
                }
            }
        }
        if !rec.is_empty() {
            self.sess.write(&rec).map_err(io::Error::from)?;
            taken += rec.len();
            rec.clear();
        }
        self.gather = rec;
        self.drain()?;
        Ok((taken > 0 || iov.iter().all(|s| s.is_empty())).then_some(taken))
    }
}

impl<S: Read + Write + AsRawFd> Read for TlsStream<S> {
    /// Plaintext, as much as `buf` takes of what has arrived: a short read means the socket
    /// had nothing more (the records OpenSSL holds are always handed out first), so a caller
    /// that waits for the socket after a short read never strands data here. With nothing at
    /// all, a blocking socket blocks and a non-blocking one gives `WouldBlock`.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        loop {
            while got < buf.len() {
                match self.sess.read(&mut buf[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(TlsError::Closed) => return Ok(got),
                    Err(e) if got > 0 => {
                        tracing::debug!(error = %e, "TLS read error after data");
                        return Ok(got);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if got == buf.len() {
                return Ok(got);
            }
            let r = if got == 0 {
                self.sock.read(&mut self.scratch)
            } else {
                // Only what is there now: a blocking socket must not wait with data in hand.
                // SAFETY: `scratch` is ours, of the length passed.
                let r = unsafe {
                    libc::recv(
                        self.sock.as_raw_fd(),
                        self.scratch.as_mut_ptr().cast(),
                        self.scratch.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if r < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(r as usize)
                }
            };
            match r {
                Ok(0) => self.sess.feed_eof(),
                Ok(n) => self.sess.feed(&self.scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) if got > 0 => return Ok(got),
                Err(e) => return Err(e),
            }
        }
    }
}

impl<S: Read + Write + AsRawFd> Write for TlsStream<S> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self.send_gather(&[IoSlice::new(b)])? {
            Some(n) => Ok(n),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self.send_gather(bufs)? {
            Some(n) => Ok(n),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.drain()? {
            return self.sock.flush();
        }
        // A non-blocking socket that is full: the caller waits for it.
        Err(io::ErrorKind::WouldBlock.into())
    }
}

#[cfg(test)]
mod tests;
