//! The NVMe/TCP receive state machine (`nvme::tcp::Deframer`, `PduCollector`) on an arbitrary
//! byte stream, as controller or host.
//!
//! Invariants:
//! - split anywhere = whole: the stream fed at once, fed in arbitrary chunks through
//!   `Deframer::feed`, and read the way the target's transport reads a socket (exact header
//!   reads, data straight into the caller's buffer, in pieces) give the same PDUs, data, digest
//!   verdicts, the same fatal error and the same offending header for the TermReq;
//!   `PduCollector::push` agrees;
//! - without an error the whole stream is consumed;
//! - re-encoding the decoded PDUs and decoding that again gives the same PDUs (encode and
//!   decode agree), with good digests.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvme::tcp::{
    Deframer, Event, Fed, Need, OwnedPdu, Pdu, PduCollector, Role, RxConfig, TcpError, TxConfig,
};
use nvmf_fuzz::{Chunker, StreamInput};

fuzz_target!(|data: &[u8]| {
    let Some(input) = StreamInput::parse(data) else {
        return;
    };
    let cfg = rx_config(input.cfg);

    let whole = run_feed(cfg, &[input.stream]);
    let chunks = Chunker::new(input.split_seed).split(input.stream);
    let chunked = run_feed(cfg, &chunks);
    assert_eq!(whole, chunked, "chunked feed differs from the whole stream");
    let transport = run_transport(cfg, input.stream, &mut Chunker::new(input.split_seed));
    assert_eq!(whole, transport, "transport-style reads differ from feed");

    match PduCollector::new(cfg).push(input.stream) {
        Ok(pdus) => {
            assert!(whole.error.is_none());
            assert_eq!(pdus, whole.pdus);
        }
        Err(e) => assert_eq!(Some(e), whole.error),
    }
    if whole.error.is_none() {
        assert_eq!(whole.consumed, input.stream.len());
    }

    // Encode what was decoded; decoding that gives the same PDUs back.
    if whole.pdus.is_empty() {
        return;
    }
    let tx = TxConfig {
        hdgst: cfg.hdgst,
        ddgst: cfg.ddgst,
        pda: cfg.pda,
    };
    let mut wire = Vec::new();
    for p in &whole.pdus {
        wire.extend_from_slice(&p.pdu.encode(&tx, &p.data));
    }
    let again = run_feed(cfg, &[&wire]);
    assert_eq!(again.error, None, "re-encoded stream rejected");
    assert_eq!(again.consumed, wire.len());
    assert_eq!(again.pdus.len(), whole.pdus.len());
    for (a, b) in again.pdus.iter().zip(&whole.pdus) {
        assert_eq!(a.pdu, b.pdu);
        assert_eq!(a.data, b.data);
        assert_eq!(a.data_digest, Ok(()));
    }
});

fn rx_config(cfg: u8) -> RxConfig {
    let base = if cfg & 1 == 0 {
        RxConfig::controller()
    } else {
        RxConfig::host()
    };
    let mut c = RxConfig {
        hdgst: cfg & 2 != 0,
        ddgst: cfg & 4 != 0,
        ic_done: cfg & 8 != 0,
        pda: (cfg >> 4) & 7,
        ..base
    };
    if cfg & 0x80 != 0 {
        c.max_data_pdu = 512;
        c.max_incapsule = if c.role == Role::Controller { 256 } else { 0 };
    }
    c
}

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    pdus: Vec<OwnedPdu>,
    error: Option<TcpError>,
    offending: Vec<u8>,
    consumed: usize,
    at_boundary: bool,
}

impl Outcome {
    fn new(rx: &Deframer, pdus: Vec<OwnedPdu>, error: Option<TcpError>, consumed: usize) -> Self {
        match error {
            // Where the failing header ends is not the same across read patterns: compare
            // the error and the quoted header instead.
            Some(_) => Outcome {
                pdus,
                error,
                offending: rx.offending_header().to_vec(),
                consumed: usize::MAX,
                at_boundary: false,
            },
            None => Outcome {
                pdus,
                error,
                offending: Vec::new(),
                consumed,
                at_boundary: rx.at_boundary(),
            },
        }
    }
}

/// Feed `chunks` through `Deframer::feed`, collecting PDUs as they complete.
fn run_feed(cfg: RxConfig, chunks: &[&[u8]]) -> Outcome {
    let mut rx = Deframer::new(cfg);
    let mut pdus = Vec::new();
    let mut partial: Option<(Pdu, Vec<u8>)> = None;
    let mut consumed = 0;
    let mut error = None;
    'outer: for chunk in chunks {
        let mut rest = *chunk;
        while !rest.is_empty() {
            match rx.feed(rest) {
                Err(e) => {
                    error = Some(e);
                    break 'outer;
                }
                Ok((n, fed)) => {
                    assert!(n <= rest.len());
                    assert!(n > 0, "feed made no progress");
                    rest = &rest[n..];
                    consumed += n;
                    match fed {
                        None => {}
                        Some(Fed::Header(p)) => {
                            assert!(partial.is_none(), "header while data was pending");
                            if p.data_len() == 0 {
                                pdus.push(OwnedPdu {
                                    pdu: p,
                                    // A TermReq's copy of the offending header.
                                    data: rx.term_data().to_vec(),
                                    data_digest: Ok(()),
                                });
                            } else {
                                partial = Some((p, Vec::new()));
                            }
                        }
                        Some(Fed::Data {
                            offset,
                            bytes,
                            done,
                        }) => {
                            let (_, d) = partial.as_mut().expect("data after a header");
                            assert_eq!(offset as usize, d.len(), "data offset");
                            d.extend_from_slice(bytes);
                            if let Some(r) = done {
                                let (pdu, data) = partial.take().expect("checked");
                                assert_eq!(data.len(), pdu.data_len() as usize);
                                pdus.push(OwnedPdu {
                                    pdu,
                                    data,
                                    data_digest: r,
                                });
                            }
                        }
                        Some(Fed::DataDone(r)) => {
                            let (pdu, data) = partial.take().expect("digest after data");
                            assert_eq!(data.len(), pdu.data_len() as usize);
                            pdus.push(OwnedPdu {
                                pdu,
                                data,
                                data_digest: r,
                            });
                        }
                    }
                }
            }
        }
    }
    if error.is_some() {
        assert_eq!(rx.need(), Need::Failed);
    }
    Outcome::new(&rx, pdus, error, consumed)
}

/// Read the stream as the target's transport reads a socket: header bytes into
/// `header_buf`, data into our own buffer, each read at most `chunker`'s next length.
fn run_transport(cfg: RxConfig, stream: &[u8], chunker: &mut Chunker) -> Outcome {
    let mut rx = Deframer::new(cfg);
    let mut pdus = Vec::new();
    let mut partial: Option<(Pdu, Vec<u8>)> = None;
    let mut pos = 0;
    let mut error = None;
    while pos < stream.len() {
        let avail = (stream.len() - pos).min(chunker.next_len());
        match rx.need() {
            Need::Failed => unreachable!("loop stops at the first error"),
            Need::Header(n) | Need::DataDigest(n) => {
                assert!(n > 0);
                let k = n.min(avail);
                let buf = rx.header_buf();
                assert_eq!(buf.len(), n, "header_buf is as long as need() says");
                buf[..k].copy_from_slice(&stream[pos..pos + k]);
                pos += k;
                match rx.advance(k) {
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                    Ok(None) => {}
                    Ok(Some(Event::Header(p))) => {
                        assert!(partial.is_none());
                        if p.data_len() == 0 {
                            pdus.push(OwnedPdu {
                                pdu: p,
                                data: rx.term_data().to_vec(),
                                data_digest: Ok(()),
                            });
                        } else {
                            partial = Some((p, Vec::new()));
                        }
                    }
                    Ok(Some(Event::DataDone(r))) => {
                        let (pdu, data) = partial.take().expect("digest after data");
                        pdus.push(OwnedPdu {
                            pdu,
                            data,
                            data_digest: r,
                        });
                    }
                }
            }
            Need::Data(n) => {
                assert!(n > 0);
                let k = n.min(avail);
                let (pdu, d) = partial.as_mut().expect("data after a header");
                let left = pdu.data_len() as usize - d.len();
                assert_eq!(left, n, "need(Data) is what the PDU has left");
                d.extend_from_slice(&stream[pos..pos + k]);
                let got = d.len();
                let ev = rx.data_read(&stream[pos..pos + k]);
                pos += k;
                if let Some(Event::DataDone(r)) = ev {
                    let (pdu, data) = partial.take().expect("checked");
                    assert_eq!(got, pdu.data_len() as usize);
                    pdus.push(OwnedPdu {
                        pdu,
                        data,
                        data_digest: r,
                    });
                }
            }
        }
    }
    Outcome::new(&rx, pdus, error, pos)
}
