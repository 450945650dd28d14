//! Sessions against each other over memory and over socket pairs: both identity versions,
//! both hashes, a wrong key and an unknown host refused, nothing read past the handshake.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::net::UnixStream;

use super::*;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:9b3c0a52-6f1e-4d0a-9a0e-2f5b7d4c1e01";
const SUB: &str = "nqn.2024-11.io.selftest:tls-subsys";

/// Keys per host NQN, as the target keeps them.
struct Keys(HashMap<String, ConfiguredPsk>);

impl KeyLookup for Keys {
    fn tls_psk(&self, id: &PskIdentity) -> Result<Zeroizing<Vec<u8>>, String> {
        let k = self
            .0
            .get(&id.hostnqn)
            .ok_or_else(|| format!("no key for host {}", id.hostnqn))?;
        if k.hash() != id.hash {
            return Err("the identity's hash is not the key's".into());
        }
        let retained = k.retained(&id.hostnqn);
        if !id.digest_matches(&retained) {
            return Err("the identity's PSK digest is not this key's".into());
        }
        Ok(id.tls_psk(&retained))
    }
}

fn key(seed: u8, len: usize) -> ConfiguredPsk {
    let k: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(7) ^ seed).collect();
    ConfiguredPsk::from_key(&k).unwrap()
}

fn server_for(k: &ConfiguredPsk) -> ServerConfig {
    let keys = Keys(HashMap::from([(HOST.to_owned(), k.clone())]));
    ServerConfig::new(Arc::new(keys)).unwrap()
}

/// Moves ciphertext between the two until both handshakes end (or one fails).
fn shuttle(c: &mut Session, s: &mut Session) -> Result<(), TlsError> {
    for _ in 0..20 {
        let cd = c.handshake()?;
        let out = c.output().to_vec();
        c.consume_output(out.len());
        s.feed(&out);
        let sd = s.handshake()?;
        let out = s.output().to_vec();
        s.consume_output(out.len());
        c.feed(&out);
        if cd && sd && c.output().is_empty() && s.output().is_empty() {
            return Ok(());
        }
    }
    Err(TlsError::Handshake("no end".into()))
}

#[test]
fn both_identities_and_both_hashes_handshake_and_carry_data() {
    for (len, suite) in [
        (32, "TLS_AES_128_GCM_SHA256"),
        (48, "TLS_AES_256_GCM_SHA384"),
    ] {
        for v in [IdentityVersion::V0, IdentityVersion::V1] {
            let k = key(3, len);
            let mut s = Session::server(&server_for(&k)).unwrap();
            let mut c = Session::client(&ClientConfig::new(&k, v, HOST, SUB).unwrap()).unwrap();
            shuttle(&mut c, &mut s).unwrap_or_else(|e| panic!("{len} {v:?}: {e}"));
            assert_eq!(s.cipher(), suite);
            assert_eq!(c.cipher(), suite);
            let id = s.identity().unwrap();
            assert_eq!(
                (id.version, id.hostnqn.as_str(), id.subnqn.as_str()),
                (v, HOST, SUB)
            );
            // Data both ways.
            c.write(b"icreq").unwrap();
            let out = c.output().to_vec();
            c.consume_output(out.len());
            s.feed(&out);
            let mut buf = [0u8; 16];
            assert_eq!(s.read(&mut buf).unwrap(), 5);
            assert_eq!(&buf[..5], b"icreq");
            // The kernel keys agree: one side's sending key is the other's receiving key.
            let (ck, sk) = (c.ktls_keys().unwrap(), s.ktls_keys().unwrap());
            assert_eq!(*ck.tx.key, *sk.rx.key);
            assert_eq!(*ck.rx.iv, *sk.tx.iv);
            assert_eq!(ck.tx.key.len(), if len == 48 { 32 } else { 16 });
        }
    }
}

#[test]
fn a_wrong_key_or_an_unknown_host_is_refused() {
    let k = key(3, 32);
    let mut s = Session::server(&server_for(&k)).unwrap();
    let wrong = key(4, 32);
    let mut c =
        Session::client(&ClientConfig::new(&wrong, IdentityVersion::V0, HOST, SUB).unwrap())
            .unwrap();
    assert!(
        shuttle(&mut c, &mut s).is_err(),
        "a wrong key must not handshake"
    );

    // A v1 identity whose digest is another key's: refused with the reason.
    let mut s = Session::server(&server_for(&k)).unwrap();
    let mut c =
        Session::client(&ClientConfig::new(&wrong, IdentityVersion::V1, HOST, SUB).unwrap())
            .unwrap();
    let e = shuttle(&mut c, &mut s).unwrap_err().to_string();
    assert!(e.contains("digest"), "{e}");

    let mut s = Session::server(&server_for(&k)).unwrap();
    let other = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
    let mut c =
        Session::client(&ClientConfig::new(&k, IdentityVersion::V0, other, SUB).unwrap()).unwrap();
    let e = shuttle(&mut c, &mut s).unwrap_err().to_string();
    assert!(e.contains("no key for host"), "{e}");
}

/// Over a socket pair, non-blocking, the client sends data right after its Finished: the
/// server's handshake takes nothing past its last record, so the data is still in the socket
/// (where the kernel, after the hand-over, would read it).
#[test]
fn the_handshake_takes_nothing_past_its_last_record() {
    let k = key(9, 32);
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let mut hc = Handshake::new(
        a,
        Session::client(&ClientConfig::new(&k, IdentityVersion::V1, HOST, SUB).unwrap()).unwrap(),
    );
    let mut hs = Handshake::new(b, Session::server(&server_for(&k)).unwrap());
    let (mut cd, mut sd) = (false, false);
    for _ in 0..50 {
        if !cd {
            cd = hc.step().unwrap();
            if cd {
                // Application data at once, in the same flight as the Finished.
                let (sock, sess) = hc.into_parts();
                let mut t = TlsStream::new(sock, sess);
                t.write_all(b"first application record").unwrap();
                t.flush().unwrap();
                let (sock, sess) = (t.sock, t.sess);
                hc = Handshake::new(sock, sess);
                hc.done = true;
            }
        }
        if !sd {
            sd = hs.step().unwrap();
        }
        if cd && sd {
            break;
        }
    }
    assert!(cd && sd);
    let (sock, sess) = hs.into_parts();
    assert_eq!(
        sess.input_pending(),
        0,
        "nothing past the handshake was taken"
    );
    let mut t = TlsStream::new(sock, sess);
    let mut buf = [0u8; 64];
    let n = loop {
        match t.read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(&buf[..n], b"first application record");
}

/// User-space records over a blocking socket pair: 8 MiB each way, in pieces of odd sizes.
#[test]
fn user_space_records_carry_megabytes_both_ways() {
    let k = key(1, 48);
    let (a, b) = UnixStream::pair().unwrap();
    let cc = ClientConfig::new(&k, IdentityVersion::V0, HOST, SUB).unwrap();
    let server = std::thread::spawn(move || {
        let sc = server_for(&k);
        let mut h = Handshake::new(b, Session::server(&sc).unwrap());
        while !h.step().unwrap() {}
        let (sock, sess) = h.into_parts();
        let mut t = TlsStream::new(sock, sess);
        let mut buf = vec![0u8; 8 << 20];
        t.read_exact(&mut buf).unwrap();
        t.write_all(&buf).unwrap();
        t.flush().unwrap();
        buf
    });
    let mut h = Handshake::new(a, Session::client(&cc).unwrap());
    while !h.step().unwrap() {}
    let (sock, sess) = h.into_parts();
    let mut t = TlsStream::new(sock, sess);
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i * 31 % 251) as u8).collect();
    let writer = {
        let mut off = 0;
        let mut n = 1;
        let mut w = Vec::new();
        while off < data.len() {
            let end = (off + n).min(data.len());
            w.push((off, end));
            off = end;
            n = n * 3 % 70_001 + 1;
        }
        w
    };
    // The server echoes only after reading all: write everything first.
    for (s, e) in writer {
        t.write_all(&data[s..e]).unwrap();
    }
    t.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    t.read_exact(&mut back).unwrap();
    assert!(back == data);
    assert!(server.join().unwrap() == data);
}

/// A plain NVMe/TCP host on a listener that requires TLS: its ICReq is refused at its first
/// bytes, not after waiting for the "record" they would announce.
#[test]
fn a_plain_icreq_is_refused_at_once() {
    let (mut a, b) = UnixStream::pair().unwrap();
    b.set_nonblocking(true).unwrap();
    let k = key(2, 32);
    let mut hs = Handshake::new(b, Session::server(&server_for(&k)).unwrap());
    // ICReq: type 00h, flags 0, HLEN 128, PDO 0, PLEN 128 (then 120 more bytes).
    a.write_all(&[0, 0, 128, 0, 128, 0, 0, 0]).unwrap();
    let e = loop {
        match hs.step() {
            Ok(false) => std::thread::yield_now(),
            Ok(true) => panic!("a plain ICReq completed a handshake"),
            Err(e) => break e,
        }
    };
    assert!(e.to_string().contains("not a TLS record"), "{e}");
}
