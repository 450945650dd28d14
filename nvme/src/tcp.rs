//! NVMe/TCP PDUs, digests and a sans-I/O receive deframer (NVMe/TCP Transport Specification
//! 1.0; byte layouts as in Linux `include/linux/nvme-tcp.h`).
//!
//! # Wire format
//! Every PDU starts with an 8-byte common header ([`CommonHeader`]: type, flags, hlen, pdo,
//! plen). `hlen` bytes of header are followed by a header digest (HDGST, CRC32C of the `hlen`
//! header bytes) when negotiated, padding up to `pdo`, the data, and a data digest (DDGST, CRC32C
//! of the data) when negotiated. Digests are little-endian on the wire. ICReq, ICResp and the
//! TermReq PDUs never carry digests.
//!
//! # Receiving: [`Deframer`]
//! The deframer never touches a socket. It owns one small buffer (256 bytes) for everything
//! that is not PDU data — headers, header digest, padding, data digest — and tells the caller
//! what to read next with [`Deframer::need`]:
//!
//! - [`Need::Header`]`(n)`: read at most `n` bytes into [`Deframer::header_buf`], then call
//!   [`Deframer::advance`] with the count. When the header is complete it is validated (known
//!   type for this direction, `hlen` for the type, `pdo`/`plen` consistent, data size within the
//!   configured limits, digest flags as negotiated, header digest) and returned as
//!   [`Event::Header`].
//! - [`Need::Data`]`(n)`: the PDU's data follows; read at most `n` bytes *into your own
//!   buffer* (the request's slot buffer at the PDU's data offset — no intermediate copy), then
//!   call [`Deframer::data_read`] with the bytes just read (they feed the data digest when one is
//!   negotiated; otherwise only their count matters).
//! - [`Need::DataDigest`]`(n)`: read into [`Deframer::header_buf`] and call
//!   [`Deframer::advance`] again.
//!
//! [`Event::DataDone`] ends a PDU that carried data; a data digest mismatch is reported there
//! and is not fatal (the command completes with Transient Transport Error, the stream stays in
//! sync). Any other violation is a [`TcpError`] carrying the Fatal Error Status and Fatal Error
//! Information for a TermReq ([`TermReq::encode`]); the deframer then stays failed.
//!
//! A reader that already holds bytes in a receive buffer uses [`Deframer::feed`], which takes
//! what it needs from a slice and returns data as borrowed sub-slices. [`PduCollector`] turns
//! a byte stream into owned PDUs (tests, admin paths).
//!
//! ```
//! use nvme::tcp::{DataPdu, Deframer, Event, Need, Pdu, RxConfig, TxConfig};
//!
//! // A controller side after the ICReq/ICResp exchange, no digests.
//! let mut rx = Deframer::new(RxConfig { ic_done: true, ..RxConfig::controller() });
//! // The host sends an H2CData PDU with 4 bytes for command 7 at offset 4096.
//! let d = DataPdu { cccid: 7, ttag: 3, datao: 4096, datal: 4, last: true, success: false };
//! let wire = Pdu::H2CData(d).encode(&TxConfig::default(), b"abcd");
//! let mut sock = &wire[..]; // stands for a TcpStream
//!
//! let mut slot = vec![0u8; 8192]; // the request's buffer
//! let mut at = 0usize;
//! loop {
//!     match rx.need() {
//!         Need::Header(n) | Need::DataDigest(n) => {
//!             let buf = rx.header_buf();
//!             buf[..n].copy_from_slice(&sock[..n]); // socket read of up to n bytes
//!             sock = &sock[n..];
//!             match rx.advance(n).expect("valid PDU") {
//!                 Some(Event::Header(Pdu::H2CData(h))) => at = h.datao as usize,
//!                 Some(Event::DataDone(r)) => { r.expect("digest"); break }
//!                 _ => {}
//!             }
//!         }
//!         Need::Data(n) => {
//!             let dst = &mut slot[at..at + n]; // read straight into the slot buffer
//!             dst.copy_from_slice(&sock[..n]);
//!             sock = &sock[n..];
//!             at += n;
//!             if let Some(Event::DataDone(r)) = rx.data_read(dst) { r.expect("digest"); break }
//!         }
//!         Need::Failed => unreachable!(),
//!     }
//! }
//! assert_eq!(&slot[4096..4100], b"abcd");
//! ```
//!
//! # Sending
//! Encoding is infallible. [`TxHeader`] holds the bytes that precede a PDU's data (common
//! header, PDU-specific header, header digest, padding to the peer's PDA); the sender then
//! writes the data and, when [`TxHeader::has_ddgst`], the data digest ([`data_digest`]). This
//! lets a transport gather header, payload and digest into one `sendmsg` with no payload copy.
//! [`Pdu::encode`] builds a whole PDU into a `Vec` for rare paths and tests.

use core::mem::{offset_of, size_of};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::{Cqe, Sqe};

/// Default NVMe/TCP port (IANA 4420).
pub const DEFAULT_PORT: u16 = 4420;
/// NVMe/TCP discovery port (`NVME_TCP_DISC_PORT`).
pub const DISCOVERY_PORT: u16 = 8009;
/// PDU Format Version 1.0 (the only one defined).
pub const PFV_1_0: u16 = 0;
/// Digest length in bytes (HDGST and DDGST).
pub const DIGEST_LEN: usize = 4;
/// Smallest MAXH2CDATA a controller may announce (and the Linux host accepts).
pub const MIN_MAXH2CDATA: u32 = 4096;
/// Largest PDA value (HPDA/CPDA are 0..=31, alignment `(pda + 1) * 4` bytes).
pub const MAX_PDA: u8 = 31;

/// PDU types (NVMe/TCP 1.0 Figure 13).
pub mod pdu_type {
    pub const ICREQ: u8 = 0x00;
    pub const ICRESP: u8 = 0x01;
    pub const H2C_TERM_REQ: u8 = 0x02;
    pub const C2H_TERM_REQ: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common-header flag bits (NVMe/TCP 1.0 Figure 14 and the per-PDU figures).
pub mod flags {
    /// A header digest follows the PDU header.
    pub const HDGSTF: u8 = 0x01;
    /// A data digest follows the PDU data.
    pub const DDGSTF: u8 = 0x02;
    /// H2CData/C2HData: last data PDU of the transfer (of the R2T for H2CData).
    pub const LAST_PDU: u8 = 0x04;
    /// C2HData: the command completed successfully; no CapsuleResp follows. Requires LAST_PDU.
    pub const SUCCESS: u8 = 0x08;
}

/// Digest bits of the ICReq/ICResp `dgst` field.
pub mod dgst {
    /// Header digest enabled.
    pub const HDGST_ENABLE: u8 = 0x01;
    /// Data digest enabled.
    pub const DDGST_ENABLE: u8 = 0x02;
}

/// Header lengths (`hlen`) per PDU type.
pub mod hlen {
    pub const IC: usize = 128;
    pub const TERM: usize = 24;
    pub const CAPSULE_CMD: usize = 72;
    pub const CAPSULE_RESP: usize = 24;
    pub const DATA: usize = 24;
    pub const R2T: usize = 24;
}

/// Largest TermReq PDU: 24-byte header plus up to 128 bytes of the offending header.
pub const TERM_MAX_PLEN: usize = 152;
/// Largest copy of an offending PDU header a TermReq carries.
pub const TERM_MAX_DATA: usize = 128;

/// The 8-byte common header (NVMe/TCP 1.0, 3.6.1, Figure 14).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct CommonHeader {
    /// PDU type ([`pdu_type`]).
    pub pdu_type: u8,
    /// Flags ([`flags`]).
    pub flags: u8,
    /// Header length: common header plus PDU-specific header, without digest.
    pub hlen: u8,
    /// PDU data offset from the start of the PDU (0 if no data).
    pub pdo: u8,
    /// Total PDU length including header, digests, padding and data.
    pub plen: U32,
}
const _: () = assert!(size_of::<CommonHeader>() == 8);
const _: () = assert!(offset_of!(CommonHeader, hlen) == 2);
const _: () = assert!(offset_of!(CommonHeader, pdo) == 3);
const _: () = assert!(offset_of!(CommonHeader, plen) == 4);

/// Byte offsets of common-header fields (used as FEI values).
pub mod fei {
    pub const PDU_TYPE: u32 = 0;
    pub const FLAGS: u32 = 1;
    pub const HLEN: u32 = 2;
    pub const PDO: u32 = 3;
    pub const PLEN: u32 = 4;
}

/// ICReq PDU (NVMe/TCP 1.0 Figure 26; Linux `nvme_tcp_icreq_pdu`).
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IcReqPdu {
    pub ch: CommonHeader,
    /// PDU Format Version.
    pub pfv: U16,
    /// Host PDU Data Alignment (0's based, dwords).
    pub hpda: u8,
    /// Digest enables ([`dgst`]).
    pub dgst: u8,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: U32,
    pub rsvd: [u8; 112],
}
const _: () = assert!(size_of::<IcReqPdu>() == 128);
const _: () = assert!(offset_of!(IcReqPdu, pfv) == 8);
const _: () = assert!(offset_of!(IcReqPdu, hpda) == 10);
const _: () = assert!(offset_of!(IcReqPdu, dgst) == 11);
const _: () = assert!(offset_of!(IcReqPdu, maxr2t) == 12);

/// ICResp PDU (NVMe/TCP 1.0 Figure 27; Linux `nvme_tcp_icresp_pdu`).
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IcRespPdu {
    pub ch: CommonHeader,
    /// PDU Format Version.
    pub pfv: U16,
    /// Controller PDU Data Alignment (0's based, dwords).
    pub cpda: u8,
    /// Digest enables ([`dgst`]).
    pub dgst: u8,
    /// Maximum H2CData data length (MAXH2CDATA), bytes.
    pub maxh2cdata: U32,
    pub rsvd: [u8; 112],
}
const _: () = assert!(size_of::<IcRespPdu>() == 128);
const _: () = assert!(offset_of!(IcRespPdu, cpda) == 10);
const _: () = assert!(offset_of!(IcRespPdu, maxh2cdata) == 12);

/// H2CTermReq / C2HTermReq header (NVMe/TCP 1.0 Figures 22 and 24; Linux `nvme_tcp_term_pdu`,
/// whose `feil`/`feiu` halves are the one 32-bit FEI here).
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct TermReqHdr {
    pub ch: CommonHeader,
    /// Fatal Error Status.
    pub fes: U16,
    /// Fatal Error Information (for header field errors: byte offset of the field).
    pub fei: U32,
    pub rsvd: [u8; 10],
}
const _: () = assert!(size_of::<TermReqHdr>() == 24);
const _: () = assert!(offset_of!(TermReqHdr, fes) == 8);
const _: () = assert!(offset_of!(TermReqHdr, fei) == 10);

/// CapsuleCmd header: common header and the 64-byte SQE (NVMe/TCP 1.0 Figure 15).
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct CapsuleCmdHdr {
    pub ch: CommonHeader,
    pub sqe: Sqe,
}
const _: () = assert!(size_of::<CapsuleCmdHdr>() == hlen::CAPSULE_CMD);
const _: () = assert!(offset_of!(CapsuleCmdHdr, sqe) == 8);

/// CapsuleResp header: common header and the 16-byte CQE (NVMe/TCP 1.0 Figure 16).
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct CapsuleRespHdr {
    pub ch: CommonHeader,
    pub cqe: Cqe,
}
const _: () = assert!(size_of::<CapsuleRespHdr>() == hlen::CAPSULE_RESP);

/// H2CData / C2HData header (NVMe/TCP 1.0 Figures 17 and 18; Linux `nvme_tcp_data_pdu`).
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DataHdr {
    pub ch: CommonHeader,
    /// Command Capsule CID.
    pub cccid: U16,
    /// Transfer tag from the R2T (H2CData); reserved in C2HData.
    pub ttag: U16,
    /// Data offset within the command's data buffer.
    pub datao: U32,
    /// Data length of this PDU.
    pub datal: U32,
    pub rsvd: [u8; 4],
}
const _: () = assert!(size_of::<DataHdr>() == hlen::DATA);
const _: () = assert!(offset_of!(DataHdr, cccid) == 8);
const _: () = assert!(offset_of!(DataHdr, ttag) == 10);
const _: () = assert!(offset_of!(DataHdr, datao) == 12);
const _: () = assert!(offset_of!(DataHdr, datal) == 16);

/// R2T header (NVMe/TCP 1.0 Figure 19; Linux `nvme_tcp_r2t_pdu`).
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct R2tHdr {
    pub ch: CommonHeader,
    /// Command Capsule CID.
    pub cccid: U16,
    /// Transfer tag the host echoes in its H2CData PDUs.
    pub ttag: U16,
    /// R2T offset within the command's data.
    pub r2to: U32,
    /// R2T length.
    pub r2tl: U32,
    pub rsvd: [u8; 4],
}
const _: () = assert!(size_of::<R2tHdr>() == hlen::R2T);
const _: () = assert!(offset_of!(R2tHdr, r2to) == 12);
const _: () = assert!(offset_of!(R2tHdr, r2tl) == 16);

// ---------------------------------------------------------------------------------------------
// Digests
// ---------------------------------------------------------------------------------------------

/// CRC32C (Castagnoli) as NVMe/TCP uses it for HDGST and DDGST.
pub fn crc32c(bytes: &[u8]) -> u32 {
    ::crc32c::crc32c(bytes)
}

/// Header digest over the first `hlen` bytes of a PDU.
pub fn header_digest(header: &[u8]) -> u32 {
    crc32c(header)
}

/// Data digest over a PDU's whole data portion.
pub fn data_digest(data: &[u8]) -> u32 {
    crc32c(data)
}

/// Incremental CRC32C for data that arrives or leaves in pieces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Crc32c(u32);

impl Crc32c {
    pub fn new() -> Crc32c {
        Crc32c(0)
    }
    pub fn update(&mut self, bytes: &[u8]) {
        self.0 = ::crc32c::crc32c_append(self.0, bytes);
    }
    pub fn value(&self) -> u32 {
        self.0
    }
}

/// Check a digest stored little-endian in `wire` against `computed`.
pub fn verify_digest(computed: u32, wire: [u8; 4]) -> Result<(), DigestMismatch> {
    let got = u32::from_le_bytes(wire);
    if got == computed {
        Ok(())
    } else {
        Err(DigestMismatch {
            expected: computed,
            got,
        })
    }
}

/// A data digest did not match. Not fatal to the connection: the command it belongs to
/// completes with an error (NVMe/TCP 1.0, 3.6.2.4: Transient Transport Error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("data digest mismatch: computed {expected:#010x}, received {got:#010x}")]
pub struct DigestMismatch {
    /// The CRC32C computed over the received data.
    pub expected: u32,
    /// The digest the peer sent.
    pub got: u32,
}

// ---------------------------------------------------------------------------------------------
// Fatal errors
// ---------------------------------------------------------------------------------------------

/// Fatal Error Status values of a TermReq (NVMe/TCP 1.0 Figure 23/25).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Fes {
    /// A PDU header field is invalid; FEI is its byte offset.
    InvalidHeaderField = 0x01,
    /// A PDU arrived out of sequence (e.g. before the ICReq/ICResp exchange).
    PduSequenceError = 0x02,
    /// Header digest mismatch.
    HeaderDigestError = 0x03,
    /// Data offset/length outside the command's data buffer.
    DataOutOfRange = 0x04,
    /// 05h: R2T Limit Exceeded (Linux: also "data limit exceeded"); reserved in later
    /// revisions. Decoded, never produced by this crate.
    R2tLimitExceeded = 0x05,
    /// A parameter value is not supported (e.g. an unknown PFV); FEI is its byte offset.
    UnsupportedParameter = 0x06,
}

impl Fes {
    /// The FES for a wire value, if defined.
    pub fn from_u16(v: u16) -> Option<Fes> {
        Some(match v {
            0x01 => Fes::InvalidHeaderField,
            0x02 => Fes::PduSequenceError,
            0x03 => Fes::HeaderDigestError,
            0x04 => Fes::DataOutOfRange,
            0x05 => Fes::R2tLimitExceeded,
            0x06 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// A fatal NVMe/TCP protocol error: the connection must be terminated with a TermReq carrying
/// `fes` and `fei` (and a copy of the offending header, [`Deframer::offending_header`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("NVMe/TCP fatal error {fes:?} (FEI {fei}): {reason}")]
pub struct TcpError {
    /// Fatal Error Status.
    pub fes: Fes,
    /// Fatal Error Information: byte offset of the bad field within the PDU for
    /// [`Fes::InvalidHeaderField`] and [`Fes::UnsupportedParameter`], else 0.
    pub fei: u32,
    /// What was wrong, for logs.
    pub reason: &'static str,
}

impl TcpError {
    pub const fn new(fes: Fes, fei: u32, reason: &'static str) -> TcpError {
        TcpError { fes, fei, reason }
    }
    const fn field(fei: u32, reason: &'static str) -> TcpError {
        TcpError::new(Fes::InvalidHeaderField, fei, reason)
    }
}

// ---------------------------------------------------------------------------------------------
// Decoded PDU headers
// ---------------------------------------------------------------------------------------------

/// ICReq contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IcReq {
    pub pfv: u16,
    /// Host PDU data alignment the controller must honour in C2H PDUs (0..=31).
    pub hpda: u8,
    pub hdgst: bool,
    pub ddgst: bool,
    /// Maximum outstanding R2Ts per command, 0's based (the Linux host sends 0).
    pub maxr2t: u32,
}

impl IcReq {
    /// The 128-byte PDU.
    pub fn encode(&self) -> [u8; 128] {
        let pdu = IcReqPdu {
            ch: fixed_ch(pdu_type::ICREQ, hlen::IC),
            pfv: self.pfv.into(),
            hpda: self.hpda,
            dgst: dgst_bits(self.hdgst, self.ddgst),
            maxr2t: self.maxr2t.into(),
            rsvd: [0; 112],
        };
        let mut out = [0u8; 128];
        out.copy_from_slice(pdu.as_bytes());
        out
    }

    /// Decode and validate the PDU-specific fields of a 128-byte ICReq.
    fn decode(b: &[u8]) -> Result<IcReq, TcpError> {
        let p = IcReqPdu::ref_from_prefix(b)
            .map_err(|_| TcpError::field(fei::PLEN, "short ICReq"))?
            .0;
        if p.pfv.get() != PFV_1_0 {
            return Err(TcpError::new(
                Fes::UnsupportedParameter,
                8,
                "unsupported PFV",
            ));
        }
        if p.hpda > MAX_PDA {
            return Err(TcpError::field(10, "HPDA above 31"));
        }
        Ok(IcReq {
            pfv: p.pfv.get(),
            hpda: p.hpda,
            hdgst: p.dgst & dgst::HDGST_ENABLE != 0,
            ddgst: p.dgst & dgst::DDGST_ENABLE != 0,
            maxr2t: p.maxr2t.get(),
        })
    }
}

/// ICResp contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU data alignment the host must honour in H2C PDUs (0..=31).
    pub cpda: u8,
    pub hdgst: bool,
    pub ddgst: bool,
    /// Largest data length of one H2CData PDU.
    pub maxh2cdata: u32,
}

impl IcResp {
    /// The 128-byte PDU.
    pub fn encode(&self) -> [u8; 128] {
        let pdu = IcRespPdu {
            ch: fixed_ch(pdu_type::ICRESP, hlen::IC),
            pfv: self.pfv.into(),
            cpda: self.cpda,
            dgst: dgst_bits(self.hdgst, self.ddgst),
            maxh2cdata: self.maxh2cdata.into(),
            rsvd: [0; 112],
        };
        let mut out = [0u8; 128];
        out.copy_from_slice(pdu.as_bytes());
        out
    }

    fn decode(b: &[u8]) -> Result<IcResp, TcpError> {
        let p = IcRespPdu::ref_from_prefix(b)
            .map_err(|_| TcpError::field(fei::PLEN, "short ICResp"))?
            .0;
        if p.pfv.get() != PFV_1_0 {
            return Err(TcpError::new(
                Fes::UnsupportedParameter,
                8,
                "unsupported PFV",
            ));
        }
        if p.cpda > MAX_PDA {
            return Err(TcpError::field(10, "CPDA above 31"));
        }
        let maxh2cdata = p.maxh2cdata.get();
        if maxh2cdata < MIN_MAXH2CDATA || maxh2cdata % 4 != 0 {
            return Err(TcpError::field(
                12,
                "MAXH2CDATA below 4096 or not a multiple of 4",
            ));
        }
        Ok(IcResp {
            pfv: p.pfv.get(),
            cpda: p.cpda,
            hdgst: p.dgst & dgst::HDGST_ENABLE != 0,
            ddgst: p.dgst & dgst::DDGST_ENABLE != 0,
            maxh2cdata,
        })
    }

    /// What the Linux host checks of an ICResp against the ICReq it sent
    /// (`nvme_tcp_init_connection`): the digest choices echo the request exactly and CPDA is 0
    /// (the host has no support for padding in H2C PDUs it sends). PFV and MAXH2CDATA were
    /// already checked when the ICResp was received.
    pub fn check_against(&self, req: &IcReq) -> Result<(), TcpError> {
        if self.hdgst != req.hdgst || self.ddgst != req.ddgst {
            return Err(TcpError::new(
                Fes::UnsupportedParameter,
                11,
                "digest choice differs from ICReq",
            ));
        }
        if self.cpda != 0 {
            return Err(TcpError::new(
                Fes::UnsupportedParameter,
                10,
                "CPDA not supported",
            ));
        }
        Ok(())
    }
}

/// A TermReq (either direction): why the sender is closing the connection. The copy of the
/// offending PDU header it carries travels apart: given to [`TermReq::encode`] when sending,
/// and, when receiving, in the deframer ([`Deframer::term_data`], right after the header) and
/// in [`OwnedPdu::data`]. This keeps [`Pdu`], which is moved for every PDU, small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermReq {
    /// Fatal Error Status (raw; see [`Fes::from_u16`]).
    pub fes: u16,
    /// Fatal Error Information.
    pub fei: u32,
}

impl TermReq {
    /// The TermReq that reports `err`.
    pub fn of(err: &TcpError) -> TermReq {
        TermReq {
            fes: err.fes as u16,
            fei: err.fei,
        }
    }

    /// The defined FES, if the value is one.
    pub fn fes(&self) -> Option<Fes> {
        Fes::from_u16(self.fes)
    }

    /// Encode as an H2CTermReq (`to_controller`) or C2HTermReq carrying (up to 128 bytes of)
    /// `offending_header`. Never carries digests.
    pub fn encode(&self, to_controller: bool, offending_header: &[u8]) -> Vec<u8> {
        let t = if to_controller {
            pdu_type::H2C_TERM_REQ
        } else {
            pdu_type::C2H_TERM_REQ
        };
        let data = &offending_header[..offending_header.len().min(TERM_MAX_DATA)];
        let mut ch = fixed_ch(t, hlen::TERM);
        ch.plen = ((hlen::TERM + data.len()) as u32).into();
        let hdr = TermReqHdr {
            ch,
            fes: self.fes.into(),
            fei: self.fei.into(),
            rsvd: [0; 10],
        };
        let mut out = Vec::with_capacity(hlen::TERM + data.len());
        out.extend_from_slice(hdr.as_bytes());
        out.extend_from_slice(data);
        out
    }

    fn decode(b: &[u8]) -> TermReq {
        let h = TermReqHdr::ref_from_prefix(b)
            .expect("caller passes at least 24 bytes")
            .0;
        TermReq {
            fes: h.fes.get(),
            fei: h.fei.get(),
        }
    }
}

/// H2CData / C2HData header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataPdu {
    pub cccid: u16,
    /// Transfer tag (H2CData: from the R2T; C2HData: reserved, 0).
    pub ttag: u16,
    pub datao: u32,
    pub datal: u32,
    /// LAST_PDU flag.
    pub last: bool,
    /// SUCCESS flag (C2HData only; implies `last`).
    pub success: bool,
}

/// R2T header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct R2t {
    pub cccid: u16,
    pub ttag: u16,
    pub r2to: u32,
    pub r2tl: u32,
}

/// A received (or to be sent) PDU header, decoded. Data travels separately.
#[derive(Debug, Clone, Copy)]
pub enum Pdu {
    IcReq(IcReq),
    IcResp(IcResp),
    H2CTermReq(TermReq),
    C2HTermReq(TermReq),
    /// A command capsule; `data_len` bytes of in-capsule data follow.
    CapsuleCmd {
        sqe: Sqe,
        data_len: u32,
    },
    CapsuleResp(Cqe),
    H2CData(DataPdu),
    C2HData(DataPdu),
    R2T(R2t),
}

// `Sqe` has no `PartialEq` of its own; compare capsules by their bytes.
impl PartialEq for Pdu {
    fn eq(&self, other: &Pdu) -> bool {
        match (self, other) {
            (Pdu::IcReq(a), Pdu::IcReq(b)) => a == b,
            (Pdu::IcResp(a), Pdu::IcResp(b)) => a == b,
            (Pdu::H2CTermReq(a), Pdu::H2CTermReq(b)) | (Pdu::C2HTermReq(a), Pdu::C2HTermReq(b)) => {
                a == b
            }
            (
                Pdu::CapsuleCmd {
                    sqe: a,
                    data_len: x,
                },
                Pdu::CapsuleCmd {
                    sqe: b,
                    data_len: y,
                },
            ) => a.as_bytes() == b.as_bytes() && x == y,
            (Pdu::CapsuleResp(a), Pdu::CapsuleResp(b)) => a == b,
            (Pdu::H2CData(a), Pdu::H2CData(b)) | (Pdu::C2HData(a), Pdu::C2HData(b)) => a == b,
            (Pdu::R2T(a), Pdu::R2T(b)) => a == b,
            _ => false,
        }
    }
}
impl Eq for Pdu {}

impl Pdu {
    /// The PDU type byte.
    pub fn pdu_type(&self) -> u8 {
        match self {
            Pdu::IcReq(_) => pdu_type::ICREQ,
            Pdu::IcResp(_) => pdu_type::ICRESP,
            Pdu::H2CTermReq(_) => pdu_type::H2C_TERM_REQ,
            Pdu::C2HTermReq(_) => pdu_type::C2H_TERM_REQ,
            Pdu::CapsuleCmd { .. } => pdu_type::CAPSULE_CMD,
            Pdu::CapsuleResp(_) => pdu_type::CAPSULE_RESP,
            Pdu::H2CData(_) => pdu_type::H2C_DATA,
            Pdu::C2HData(_) => pdu_type::C2H_DATA,
            Pdu::R2T(_) => pdu_type::R2T,
        }
    }

    /// Bytes of data that follow the header (in-capsule data or H2C/C2H payload).
    pub fn data_len(&self) -> u32 {
        match *self {
            Pdu::CapsuleCmd { data_len, .. } => data_len,
            Pdu::H2CData(d) | Pdu::C2HData(d) => d.datal,
            _ => 0,
        }
    }

    /// The bytes preceding the data for a digest-capable PDU (command, response, data, R2T).
    ///
    /// # Panics
    /// On IC and TermReq PDUs, which have their own encoders ([`IcReq::encode`],
    /// [`IcResp::encode`], [`TermReq::encode`]); that is a caller bug.
    pub fn header(&self, tx: &TxConfig) -> TxHeader {
        match *self {
            Pdu::CapsuleCmd { ref sqe, data_len } => TxHeader::capsule_cmd(tx, sqe, data_len),
            Pdu::CapsuleResp(ref cqe) => TxHeader::capsule_resp(tx, cqe),
            Pdu::H2CData(ref d) => TxHeader::h2c_data(tx, d),
            Pdu::C2HData(ref d) => TxHeader::c2h_data(tx, d),
            Pdu::R2T(ref r) => TxHeader::r2t(tx, r),
            _ => panic!("Pdu::header called on an IC or TermReq PDU"),
        }
    }

    /// The whole PDU: header, digests, padding and `data` (for a TermReq: the copy of the
    /// offending header it carries, at most 128 bytes taken).
    ///
    /// # Panics
    /// If `data.len() != self.data_len()` for a PDU other than a TermReq.
    pub fn encode(&self, tx: &TxConfig, data: &[u8]) -> Vec<u8> {
        match self {
            Pdu::H2CTermReq(t) => return t.encode(true, data),
            Pdu::C2HTermReq(t) => return t.encode(false, data),
            _ => {}
        }
        assert_eq!(
            data.len(),
            self.data_len() as usize,
            "data length differs from the header's"
        );
        match self {
            Pdu::IcReq(r) => r.encode().to_vec(),
            Pdu::IcResp(r) => r.encode().to_vec(),
            _ => {
                let h = self.header(tx);
                let mut out = Vec::with_capacity(h.plen() as usize);
                out.extend_from_slice(h.as_bytes());
                out.extend_from_slice(data);
                if h.has_ddgst() {
                    out.extend_from_slice(&data_digest(data).to_le_bytes());
                }
                out
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Sending
// ---------------------------------------------------------------------------------------------

/// What the sender negotiated: digests, and the PDA the *peer* asked for (CPDA from the
/// ICResp when sending as host, HPDA from the ICReq when sending as controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TxConfig {
    pub hdgst: bool,
    pub ddgst: bool,
    pub pda: u8,
}

/// Largest header region (header, digest, padding): PDO is one byte.
pub const MAX_HEADER_REGION: usize = 256;

/// Largest header region a [`TxHeader`] builds: a PDU header of at most 72 bytes and its
/// HDGST, padded to the peer's PDA (at most 128 bytes).
pub const MAX_TX_HEADER_REGION: usize = 128;
const _: () = assert!(hlen::CAPSULE_CMD + DIGEST_LEN <= MAX_TX_HEADER_REGION);

/// The bytes of a PDU before its data: common header, PDU header, HDGST, padding to PDO.
#[derive(Clone)]
pub struct TxHeader {
    buf: [u8; MAX_TX_HEADER_REGION],
    len: u16,
    data_len: u32,
    ddgst: bool,
}

impl TxHeader {
    /// CapsuleCmd with `data_len` bytes of in-capsule data to follow.
    #[inline]
    pub fn capsule_cmd(tx: &TxConfig, sqe: &Sqe, data_len: u32) -> TxHeader {
        let h = CapsuleCmdHdr {
            ch: CommonHeader::default(),
            sqe: *sqe,
        };
        TxHeader::build(tx, pdu_type::CAPSULE_CMD, 0, h.as_bytes(), data_len)
    }

    /// CapsuleResp.
    #[inline]
    pub fn capsule_resp(tx: &TxConfig, cqe: &Cqe) -> TxHeader {
        let h = CapsuleRespHdr {
            ch: CommonHeader::default(),
            cqe: *cqe,
        };
        TxHeader::build(tx, pdu_type::CAPSULE_RESP, 0, h.as_bytes(), 0)
    }

    /// H2CData carrying `d.datal` bytes. `success` is ignored (not defined for H2C).
    #[inline]
    pub fn h2c_data(tx: &TxConfig, d: &DataPdu) -> TxHeader {
        let f = if d.last { flags::LAST_PDU } else { 0 };
        TxHeader::build(tx, pdu_type::H2C_DATA, f, data_hdr(d).as_bytes(), d.datal)
    }

    /// C2HData carrying `d.datal` bytes. `success` sets both SUCCESS and LAST_PDU.
    #[inline]
    pub fn c2h_data(tx: &TxConfig, d: &DataPdu) -> TxHeader {
        let mut f = if d.last { flags::LAST_PDU } else { 0 };
        if d.success {
            f |= flags::SUCCESS | flags::LAST_PDU;
        }
        TxHeader::build(tx, pdu_type::C2H_DATA, f, data_hdr(d).as_bytes(), d.datal)
    }

    /// R2T.
    #[inline]
    pub fn r2t(tx: &TxConfig, r: &R2t) -> TxHeader {
        let h = R2tHdr {
            ch: CommonHeader::default(),
            cccid: r.cccid.into(),
            ttag: r.ttag.into(),
            r2to: r.r2to.into(),
            r2tl: r.r2tl.into(),
            rsvd: [0; 4],
        };
        TxHeader::build(tx, pdu_type::R2T, 0, h.as_bytes(), 0)
    }

    // Inlined into each constructor: the header's length is then a constant, and copying it
    // takes a few moves instead of a call to memcpy (this runs for every command and response).
    #[inline(always)]
    fn build(tx: &TxConfig, ty: u8, extra_flags: u8, hdr: &[u8], data_len: u32) -> TxHeader {
        let hl = hdr.len();
        let hd = if tx.hdgst { DIGEST_LEN } else { 0 };
        let hend = hl + hd;
        let has_data = data_len > 0;
        let pdo = if has_data {
            align_up(hend, pda_alignment(tx.pda))
        } else {
            0
        };
        let ddgst = has_data && tx.ddgst;
        let plen = if has_data {
            pdo as u64 + data_len as u64 + if ddgst { DIGEST_LEN as u64 } else { 0 }
        } else {
            hend as u64
        };
        let mut buf = [0u8; MAX_TX_HEADER_REGION];
        buf[..hl].copy_from_slice(hdr);
        let mut fl = extra_flags;
        if tx.hdgst {
            fl |= flags::HDGSTF;
        }
        if ddgst {
            fl |= flags::DDGSTF;
        }
        let ch = CommonHeader {
            pdu_type: ty,
            flags: fl,
            hlen: hl as u8,
            pdo: pdo as u8,
            // A PDU cannot describe more than u32 bytes; callers size data below MAXH2CDATA
            // or the in-capsule limit, far below that.
            plen: u32::try_from(plen)
                .expect("PDU length fits in 32 bits")
                .into(),
        };
        buf[..8].copy_from_slice(ch.as_bytes());
        if tx.hdgst {
            let d = header_digest(&buf[..hl]);
            buf[hl..hend].copy_from_slice(&d.to_le_bytes());
        }
        let len = if has_data { pdo } else { hend };
        TxHeader {
            buf,
            len: len as u16,
            data_len,
            ddgst,
        }
    }

    /// The bytes to send before the data.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }

    /// The header region with zeroes after [`TxHeader::as_bytes`]: a fixed-size copy.
    #[inline]
    pub fn padded(&self) -> &[u8; MAX_TX_HEADER_REGION] {
        &self.buf
    }

    /// Whether a data digest must follow the data.
    pub fn has_ddgst(&self) -> bool {
        self.ddgst
    }

    /// Data bytes that follow.
    pub fn data_len(&self) -> u32 {
        self.data_len
    }

    /// Total PDU length.
    pub fn plen(&self) -> u32 {
        u32::from_le_bytes(self.buf[4..8].try_into().expect("4 bytes"))
    }
}

impl core::fmt::Debug for TxHeader {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TxHeader")
            .field("bytes", &format_args!("{:02x?}", self.as_bytes()))
            .field("data_len", &self.data_len)
            .field("ddgst", &self.ddgst)
            .finish()
    }
}

fn data_hdr(d: &DataPdu) -> DataHdr {
    DataHdr {
        ch: CommonHeader::default(),
        cccid: d.cccid.into(),
        ttag: d.ttag.into(),
        datao: d.datao.into(),
        datal: d.datal.into(),
        rsvd: [0; 4],
    }
}

fn fixed_ch(ty: u8, len: usize) -> CommonHeader {
    CommonHeader {
        pdu_type: ty,
        flags: 0,
        hlen: len as u8,
        pdo: 0,
        plen: (len as u32).into(),
    }
}

fn dgst_bits(h: bool, d: bool) -> u8 {
    (if h { dgst::HDGST_ENABLE } else { 0 }) | (if d { dgst::DDGST_ENABLE } else { 0 })
}

/// Alignment in bytes PDO must have for a PDA value; 0 means no requirement.
fn pda_alignment(pda: u8) -> usize {
    if pda == 0 {
        0
    } else {
        (pda as usize + 1) * 4
    }
}

fn align_up(v: usize, a: usize) -> usize {
    if a == 0 {
        v
    } else {
        v.div_ceil(a) * a
    }
}

// ---------------------------------------------------------------------------------------------
// Receiving
// ---------------------------------------------------------------------------------------------

/// Which end of the connection the deframer runs on; it decides which PDU types are valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Receives ICResp, C2HTermReq, CapsuleResp, C2HData, R2T.
    Host,
    /// Receives ICReq, H2CTermReq, CapsuleCmd, H2CData.
    Controller,
}

/// Deframer configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxConfig {
    pub role: Role,
    /// Header digests expected (after the IC exchange; change with [`Deframer::set_digests`]).
    pub hdgst: bool,
    /// Data digests expected.
    pub ddgst: bool,
    /// The PDA *we* announced (HPDA as host, CPDA as controller): PDO of received data PDUs
    /// must be a multiple of `(pda + 1) * 4` when non-zero.
    pub pda: u8,
    /// Largest data portion of one H2CData/C2HData PDU (controller: the MAXH2CDATA announced).
    pub max_data_pdu: u32,
    /// Largest in-capsule data of one CapsuleCmd (controller: IOCCSZ * 16 - 64).
    pub max_incapsule: u32,
    /// Start as if the IC exchange had happened (for a deframer created after it).
    pub ic_done: bool,
}

impl RxConfig {
    /// A host-side default: no digests, no data size limits beyond 32 bits.
    pub fn host() -> RxConfig {
        RxConfig {
            role: Role::Host,
            hdgst: false,
            ddgst: false,
            pda: 0,
            max_data_pdu: u32::MAX,
            max_incapsule: 0,
            ic_done: false,
        }
    }

    /// A controller-side default: no digests, 128 KiB data PDUs, 8 KiB in-capsule data.
    pub fn controller() -> RxConfig {
        RxConfig {
            role: Role::Controller,
            hdgst: false,
            ddgst: false,
            pda: 0,
            max_data_pdu: 128 * 1024,
            max_incapsule: 8192,
            ic_done: false,
        }
    }
}

/// What the deframer needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Up to `n` header (or padding) bytes into [`Deframer::header_buf`].
    Header(usize),
    /// Up to `n` bytes of the current PDU's data into the caller's buffer.
    Data(usize),
    /// Up to `n` data-digest bytes into [`Deframer::header_buf`].
    DataDigest(usize),
    /// A fatal error happened; the connection must be torn down.
    Failed,
}

/// Something the deframer completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A validated PDU header. If [`Pdu::data_len`] is non-zero, its data comes next.
    Header(Pdu),
    /// The data (and data digest, if negotiated) of the current PDU arrived.
    DataDone(Result<(), DigestMismatch>),
}

/// A piece of the stream handed out by [`Deframer::feed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fed<'a> {
    Header(Pdu),
    /// Data bytes of the current PDU at `offset` from the start of its data portion; `done`
    /// is set when these were the last data bytes and no data digest follows.
    Data {
        offset: u32,
        bytes: &'a [u8],
        done: Option<Result<(), DigestMismatch>>,
    },
    DataDone(Result<(), DigestMismatch>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Header,
    Data,
    DataDigest,
    Failed(TcpError),
}

/// Sans-I/O receive state machine for one NVMe/TCP connection. See the module doc.
pub struct Deframer {
    cfg: RxConfig,
    ic_done: bool,
    state: State,
    /// Header region of the current PDU (header, HDGST, padding).
    buf: [u8; MAX_HEADER_REGION],
    have: usize,
    want: usize,
    /// Length of the current PDU's header region (for [`Deframer::offending_header`]).
    hdr_len: usize,
    /// Header region length of the last complete PDU header.
    last_len: usize,
    /// Data digest bytes (kept apart so the header stays quotable).
    dg: [u8; DIGEST_LEN],
    data_len: u32,
    data_got: u32,
    with_ddgst: bool,
    crc: Crc32c,
}

impl core::fmt::Debug for Deframer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Deframer")
            .field("cfg", &self.cfg)
            .field("state", &self.state)
            .field("have", &self.have)
            .field("want", &self.want)
            .field("data_len", &self.data_len)
            .field("data_got", &self.data_got)
            .finish()
    }
}

impl Deframer {
    pub fn new(cfg: RxConfig) -> Deframer {
        Deframer {
            cfg,
            ic_done: cfg.ic_done,
            state: State::Header,
            buf: [0; MAX_HEADER_REGION],
            have: 0,
            want: size_of::<CommonHeader>(),
            hdr_len: 0,
            last_len: 0,
            dg: [0; DIGEST_LEN],
            data_len: 0,
            data_got: 0,
            with_ddgst: false,
            crc: Crc32c::new(),
        }
    }

    /// Set the negotiated digests (after the ICReq/ICResp exchange, before the next PDU).
    pub fn set_digests(&mut self, hdgst: bool, ddgst: bool) {
        self.cfg.hdgst = hdgst;
        self.cfg.ddgst = ddgst;
    }

    /// Change the data size limits (e.g. after the ICResp announced MAXH2CDATA).
    pub fn set_limits(&mut self, max_data_pdu: u32, max_incapsule: u32) {
        self.cfg.max_data_pdu = max_data_pdu;
        self.cfg.max_incapsule = max_incapsule;
    }

    pub fn config(&self) -> &RxConfig {
        &self.cfg
    }

    /// What to read next.
    pub fn need(&self) -> Need {
        match self.state {
            State::Header => Need::Header(self.want - self.have),
            State::Data => Need::Data((self.data_len - self.data_got) as usize),
            State::DataDigest => Need::DataDigest(DIGEST_LEN - self.have),
            State::Failed(_) => Need::Failed,
        }
    }

    /// Whether the deframer sits between PDUs (no partial PDU buffered).
    pub fn at_boundary(&self) -> bool {
        self.state == State::Header && self.have == 0
    }

    /// Where header, padding and data-digest bytes go; exactly as long as [`Need`] says
    /// (empty while data is expected or after a failure).
    pub fn header_buf(&mut self) -> &mut [u8] {
        match self.state {
            State::Header => &mut self.buf[self.have..self.want],
            State::DataDigest => &mut self.dg[self.have..],
            _ => &mut [],
        }
    }

    /// The header bytes (up to 128) to copy into a TermReq: after a [`TcpError`], those of the
    /// PDU that caused it; otherwise those of the last complete header, so that a caller that
    /// rejects a header it was handed can quote it (valid until the next header or data
    /// digest bytes are written).
    pub fn offending_header(&self) -> &[u8] {
        let n = match self.state {
            State::Header if self.have == 0 => self.last_len,
            State::Header | State::Failed(_) => self.have.max(self.hdr_len),
            State::Data | State::DataDigest => self.hdr_len,
        };
        &self.buf[..n.min(TERM_MAX_DATA)]
    }

    /// Right after a TermReq header was handed out (before anything else is fed): the copy of
    /// the offending PDU header the TermReq carries. Empty otherwise.
    pub fn term_data(&self) -> &[u8] {
        let is_term = matches!(self.buf[0], pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ);
        if self.state == State::Header && self.have == 0 && is_term && self.last_len > hlen::TERM {
            &self.buf[hlen::TERM..self.last_len]
        } else {
            &[]
        }
    }

    /// `n` bytes were written into [`Deframer::header_buf`].
    ///
    /// # Panics
    /// If `n` exceeds the length of `header_buf()` (a caller bug).
    #[inline]
    pub fn advance(&mut self, n: usize) -> Result<Option<Event>, TcpError> {
        match self.state {
            State::Failed(e) => Err(e),
            State::Data => {
                assert!(n == 0, "advance({n}) while data is expected");
                Ok(None)
            }
            State::Header => {
                assert!(self.have + n <= self.want, "advance past header_buf");
                self.have += n;
                if self.have < self.want {
                    return Ok(None);
                }
                let r = if self.want == size_of::<CommonHeader>() && self.hdr_len == 0 {
                    self.common_header_done()
                } else {
                    self.header_done()
                };
                match r {
                    Ok(ev) => Ok(ev),
                    Err(e) => {
                        self.state = State::Failed(e);
                        Err(e)
                    }
                }
            }
            State::DataDigest => {
                assert!(self.have + n <= DIGEST_LEN, "advance past header_buf");
                self.have += n;
                if self.have < DIGEST_LEN {
                    return Ok(None);
                }
                let r = verify_digest(self.crc.value(), self.dg);
                self.reset();
                Ok(Some(Event::DataDone(r)))
            }
        }
    }

    /// Data bytes of the current PDU were read into the caller's buffer; `bytes` is what was
    /// read (used for the data digest). Returns [`Event::DataDone`] when the data is complete
    /// and no digest follows.
    ///
    /// # Panics
    /// If more bytes are passed than [`Need::Data`] asked for (a caller bug).
    pub fn data_read(&mut self, bytes: &[u8]) -> Option<Event> {
        if bytes.is_empty() {
            return None;
        }
        assert!(
            self.state == State::Data,
            "data_read while {:?}",
            self.state
        );
        let left = (self.data_len - self.data_got) as usize;
        assert!(
            bytes.len() <= left,
            "data_read of {} bytes, {left} expected",
            bytes.len()
        );
        if self.with_ddgst {
            self.crc.update(bytes);
        }
        self.data_got += bytes.len() as u32;
        if self.data_got < self.data_len {
            return None;
        }
        if self.with_ddgst {
            self.state = State::DataDigest;
            self.have = 0;
            None
        } else {
            self.reset();
            Some(Event::DataDone(Ok(())))
        }
    }

    /// Take what the deframer needs from `input` (bytes already received). Returns how many
    /// bytes were consumed and what, if anything, completed. Call again with the rest.
    pub fn feed<'a>(&mut self, input: &'a [u8]) -> Result<(usize, Option<Fed<'a>>), TcpError> {
        if let Some((n, pdu)) = self.whole_header(input) {
            return Ok((n, Some(Fed::Header(pdu))));
        }
        match self.need() {
            Need::Failed => Err(match self.state {
                State::Failed(e) => e,
                _ => unreachable!("need() is Failed only in State::Failed"),
            }),
            Need::Data(left) => {
                let n = left.min(input.len());
                if n == 0 {
                    return Ok((0, None));
                }
                let offset = self.data_got;
                let bytes = &input[..n];
                let done = match self.data_read(bytes) {
                    Some(Event::DataDone(r)) => Some(r),
                    _ => None,
                };
                Ok((
                    n,
                    Some(Fed::Data {
                        offset,
                        bytes,
                        done,
                    }),
                ))
            }
            Need::Header(_) | Need::DataDigest(_) => {
                // Header steps (the common header, then the rest) follow one another within
                // one call while the input lasts: one call per PDU header, not one per step.
                let mut used = 0;
                loop {
                    let buf = self.header_buf();
                    let n = buf.len().min(input.len() - used);
                    buf[..n].copy_from_slice(&input[used..used + n]);
                    used += n;
                    if let Some(e) = self.advance(n)? {
                        let fed = match e {
                            Event::Header(p) => Fed::Header(p),
                            Event::DataDone(r) => Fed::DataDone(r),
                        };
                        return Ok((used, Some(fed)));
                    }
                    if n == 0 || used == input.len() || !matches!(self.need(), Need::Header(_)) {
                        return Ok((used, None));
                    }
                }
            }
        }
    }

    /// A header taken whole: at a PDU boundary, when `input` starts with a complete header
    /// region (header, header digest, padding), it is checked and decoded in one step by the
    /// same rules the step-by-step path applies ([`Deframer::layout`], [`Deframer::decode`]),
    /// and leaves the same state behind (the header kept for [`Deframer::offending_header`],
    /// the PDU's data expected next). A header that is not whole, or that breaks a rule, gives
    /// `None`: the step path then takes it and reports the error. Returns the header region's
    /// length and the PDU.
    #[inline(always)]
    fn whole_header(&mut self, input: &[u8]) -> Option<(usize, Pdu)> {
        if self.state != State::Header || self.have != 0 {
            return None;
        }
        let (ch, _) = CommonHeader::ref_from_prefix(input).ok()?;
        let l = self.layout(ch).ok()?;
        let region = input.get(..l.region)?;
        let pdu = self.decode(ch, region, l.data_len).ok()?;
        self.buf[..l.region].copy_from_slice(region);
        self.set_layout(l);
        self.header_in(&pdu);
        Some((l.region, pdu))
    }

    fn reset(&mut self) {
        self.state = State::Header;
        self.have = 0;
        self.want = size_of::<CommonHeader>();
        self.hdr_len = 0;
        self.data_len = 0;
        self.data_got = 0;
        self.with_ddgst = false;
        self.crc = Crc32c::new();
    }

    /// The 8-byte common header is in: validate it and size the rest of the header region.
    #[inline]
    fn common_header_done(&mut self) -> Result<Option<Event>, TcpError> {
        let ch = *CommonHeader::ref_from_prefix(&self.buf[..])
            .expect("8 bytes")
            .0;
        let l = self.layout(&ch)?;
        self.set_layout(l);
        if self.want == self.have {
            return self.header_done();
        }
        Ok(None)
    }

    #[inline(always)]
    fn set_layout(&mut self, l: Layout) {
        self.want = l.region;
        self.hdr_len = l.region;
        self.data_len = l.data_len;
        self.with_ddgst = l.ddgst;
    }

    /// The rules for a common header (the PDU type in this direction and at this point of the
    /// connection, HLEN, PLEN, PDO, the digest flags against the negotiated digests, the data
    /// limits), and where the PDU's parts lie.
    #[inline(always)]
    fn layout(&self, ch: &CommonHeader) -> Result<Layout, TcpError> {
        let ty = ch.pdu_type;
        let plen = ch.plen.get() as usize;
        let role = self.cfg.role;
        let (expected_hlen, valid) = match ty {
            pdu_type::ICREQ => (hlen::IC, role == Role::Controller),
            pdu_type::ICRESP => (hlen::IC, role == Role::Host),
            pdu_type::H2C_TERM_REQ => (hlen::TERM, role == Role::Controller),
            pdu_type::C2H_TERM_REQ => (hlen::TERM, role == Role::Host),
            pdu_type::CAPSULE_CMD => (hlen::CAPSULE_CMD, role == Role::Controller),
            pdu_type::CAPSULE_RESP => (hlen::CAPSULE_RESP, role == Role::Host),
            pdu_type::H2C_DATA => (hlen::DATA, role == Role::Controller),
            pdu_type::C2H_DATA => (hlen::DATA, role == Role::Host),
            pdu_type::R2T => (hlen::R2T, role == Role::Host),
            _ => return Err(TcpError::field(fei::PDU_TYPE, "unknown PDU type")),
        };
        if !valid {
            return Err(TcpError::field(
                fei::PDU_TYPE,
                "PDU type not valid in this direction",
            ));
        }
        let is_ic = matches!(ty, pdu_type::ICREQ | pdu_type::ICRESP);
        let is_term = matches!(ty, pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ);
        if is_ic && self.ic_done {
            return Err(TcpError::new(Fes::PduSequenceError, 0, "second IC PDU"));
        }
        if !is_ic && !is_term && !self.ic_done {
            return Err(TcpError::new(
                Fes::PduSequenceError,
                0,
                "PDU before the IC exchange",
            ));
        }
        if ch.hlen as usize != expected_hlen {
            return Err(TcpError::field(fei::HLEN, "HLEN wrong for the PDU type"));
        }
        // IC and TermReq PDUs carry no digests and no separate data: the whole PDU is header.
        if is_ic {
            if plen != hlen::IC {
                return Err(TcpError::field(fei::PLEN, "IC PDU PLEN is not 128"));
            }
            return Ok(Layout::header_only(hlen::IC));
        }
        if is_term {
            if !(hlen::TERM..=TERM_MAX_PLEN).contains(&plen) {
                return Err(TcpError::field(fei::PLEN, "TermReq PLEN outside 24..=152"));
            }
            return Ok(Layout::header_only(plen));
        }
        let hd = if self.cfg.hdgst { DIGEST_LEN } else { 0 };
        if (ch.flags & flags::HDGSTF != 0) != self.cfg.hdgst {
            return Err(TcpError::field(
                fei::FLAGS,
                "HDGSTF differs from the negotiated header digest",
            ));
        }
        let hend = expected_hlen + hd;
        if plen < hend {
            return Err(TcpError::field(fei::PLEN, "PLEN shorter than the header"));
        }
        let is_data_pdu = matches!(ty, pdu_type::H2C_DATA | pdu_type::C2H_DATA);
        if plen == hend {
            if is_data_pdu {
                return Err(TcpError::field(fei::PLEN, "data PDU without data"));
            }
            return Ok(Layout::header_only(hend));
        }
        // The PDU carries data.
        if matches!(ty, pdu_type::CAPSULE_RESP | pdu_type::R2T) {
            return Err(TcpError::field(
                fei::PLEN,
                "PLEN longer than the header for a PDU without data",
            ));
        }
        let pdo = ch.pdo as usize;
        if pdo < hend {
            return Err(TcpError::field(fei::PDO, "PDO inside the header"));
        }
        if pdo > plen {
            return Err(TcpError::field(fei::PDO, "PDO beyond PLEN"));
        }
        let align = pda_alignment(self.cfg.pda);
        if align != 0 && pdo % align != 0 {
            return Err(TcpError::field(
                fei::PDO,
                "PDO not aligned to the announced PDA",
            ));
        }
        if (ch.flags & flags::DDGSTF != 0) != self.cfg.ddgst {
            return Err(TcpError::field(
                fei::FLAGS,
                "DDGSTF differs from the negotiated data digest",
            ));
        }
        let dd = if self.cfg.ddgst { DIGEST_LEN } else { 0 };
        if plen < pdo + dd + 1 {
            return Err(TcpError::field(fei::PLEN, "PLEN leaves no room for data"));
        }
        let data_len = (plen - pdo - dd) as u64;
        let limit = if ty == pdu_type::CAPSULE_CMD {
            self.cfg.max_incapsule
        } else {
            self.cfg.max_data_pdu
        };
        if data_len > limit as u64 {
            return Err(TcpError::field(
                fei::PLEN,
                "PDU data larger than the negotiated limit",
            ));
        }
        Ok(Layout {
            region: pdo,
            data_len: data_len as u32,
            ddgst: dd != 0,
        })
    }

    /// The whole header region is in: check the header digest and decode.
    #[inline]
    fn header_done(&mut self) -> Result<Option<Event>, TcpError> {
        let ch = *CommonHeader::ref_from_prefix(&self.buf[..])
            .expect("8 bytes")
            .0;
        let pdu = self.decode(&ch, &self.buf[..self.want], self.data_len)?;
        self.header_in(&pdu);
        Ok(Some(Event::Header(pdu)))
    }

    /// The rules for a whole header region `b` whose common header `ch` passed
    /// [`Deframer::layout`] (the header digest, the fields of each PDU type), and the PDU.
    #[inline(always)]
    fn decode(&self, ch: &CommonHeader, b: &[u8], data_len: u32) -> Result<Pdu, TcpError> {
        let hl = ch.hlen as usize;
        let digestable = !matches!(
            ch.pdu_type,
            pdu_type::ICREQ | pdu_type::ICRESP | pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ
        );
        if digestable && self.cfg.hdgst {
            let wire: [u8; 4] = b[hl..hl + DIGEST_LEN].try_into().expect("4 bytes");
            if verify_digest(header_digest(&b[..hl]), wire).is_err() {
                return Err(TcpError::new(
                    Fes::HeaderDigestError,
                    0,
                    "header digest mismatch",
                ));
            }
        }
        let pdu = match ch.pdu_type {
            pdu_type::ICREQ => Pdu::IcReq(IcReq::decode(b)?),
            pdu_type::ICRESP => Pdu::IcResp(IcResp::decode(b)?),
            pdu_type::H2C_TERM_REQ => Pdu::H2CTermReq(TermReq::decode(b)),
            pdu_type::C2H_TERM_REQ => Pdu::C2HTermReq(TermReq::decode(b)),
            pdu_type::CAPSULE_CMD => {
                let h = CapsuleCmdHdr::ref_from_prefix(b).expect("72 bytes").0;
                Pdu::CapsuleCmd {
                    sqe: h.sqe,
                    data_len,
                }
            }
            pdu_type::CAPSULE_RESP => {
                Pdu::CapsuleResp(CapsuleRespHdr::ref_from_prefix(b).expect("24 bytes").0.cqe)
            }
            pdu_type::H2C_DATA | pdu_type::C2H_DATA => {
                let h = DataHdr::ref_from_prefix(b).expect("24 bytes").0;
                let d = DataPdu {
                    cccid: h.cccid.get(),
                    ttag: h.ttag.get(),
                    datao: h.datao.get(),
                    datal: h.datal.get(),
                    last: ch.flags & flags::LAST_PDU != 0,
                    success: ch.flags & flags::SUCCESS != 0,
                };
                if d.datal != data_len {
                    return Err(TcpError::field(
                        16,
                        "DATAL differs from the data the PDU carries",
                    ));
                }
                if d.datao.checked_add(d.datal).is_none() {
                    return Err(TcpError::new(
                        Fes::DataOutOfRange,
                        0,
                        "DATAO + DATAL overflows",
                    ));
                }
                if ch.pdu_type == pdu_type::C2H_DATA {
                    if d.success && !d.last {
                        return Err(TcpError::field(fei::FLAGS, "SUCCESS without LAST_PDU"));
                    }
                    Pdu::C2HData(d)
                } else {
                    Pdu::H2CData(DataPdu {
                        success: false,
                        ..d
                    })
                }
            }
            pdu_type::R2T => {
                let h = R2tHdr::ref_from_prefix(b).expect("24 bytes").0;
                let r = R2t {
                    cccid: h.cccid.get(),
                    ttag: h.ttag.get(),
                    r2to: h.r2to.get(),
                    r2tl: h.r2tl.get(),
                };
                if r.r2tl == 0 {
                    return Err(TcpError::field(16, "R2TL is zero"));
                }
                if r.r2to.checked_add(r.r2tl).is_none() {
                    return Err(TcpError::new(
                        Fes::DataOutOfRange,
                        0,
                        "R2TO + R2TL overflows",
                    ));
                }
                Pdu::R2T(r)
            }
            _ => unreachable!("type checked in layout"),
        };
        Ok(pdu)
    }

    /// A header was taken (its region is in `buf`, its layout set): the PDU's data comes next,
    /// or the next PDU.
    #[inline(always)]
    fn header_in(&mut self, pdu: &Pdu) {
        if matches!(pdu, Pdu::IcReq(_) | Pdu::IcResp(_)) {
            self.ic_done = true;
        }
        self.last_len = self.hdr_len;
        if self.data_len > 0 {
            self.state = State::Data;
            self.data_got = 0;
            self.have = 0;
            self.crc = Crc32c::new();
        } else {
            self.reset();
        }
    }
}

/// Where a PDU's parts lie, from its common header.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// The header region: header, header digest, padding; the data starts here.
    region: usize,
    data_len: u32,
    /// A data digest follows the data.
    ddgst: bool,
}

impl Layout {
    fn header_only(region: usize) -> Layout {
        Layout {
            region,
            data_len: 0,
            ddgst: false,
        }
    }
}

/// A PDU with its data, as collected by [`PduCollector`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedPdu {
    pub pdu: Pdu,
    /// The PDU's data; for a TermReq, the copy of the offending header it carries.
    pub data: Vec<u8>,
    /// The data digest verdict (always `Ok` without data or without data digests).
    pub data_digest: Result<(), DigestMismatch>,
}

/// Convenience wrapper: push arbitrary chunks of a byte stream, get whole PDUs with their data.
/// Copies data into `Vec`s; the transport data path uses [`Deframer`] directly.
#[derive(Debug)]
pub struct PduCollector {
    pub deframer: Deframer,
    partial: Option<(Pdu, Vec<u8>)>,
}

impl PduCollector {
    pub fn new(cfg: RxConfig) -> PduCollector {
        PduCollector {
            deframer: Deframer::new(cfg),
            partial: None,
        }
    }

    /// Consume all of `input`; return the PDUs it completed.
    pub fn push(&mut self, mut input: &[u8]) -> Result<Vec<OwnedPdu>, TcpError> {
        let mut out = Vec::new();
        while !input.is_empty() {
            let (n, fed) = self.deframer.feed(input)?;
            input = &input[n..];
            match fed {
                None => {}
                Some(Fed::Header(p)) => {
                    if p.data_len() == 0 {
                        out.push(OwnedPdu {
                            pdu: p,
                            data: self.deframer.term_data().to_vec(),
                            data_digest: Ok(()),
                        });
                    } else {
                        self.partial = Some((p, Vec::with_capacity(p.data_len() as usize)));
                    }
                }
                Some(Fed::Data { bytes, done, .. }) => {
                    let (_, data) = self.partial.as_mut().expect("data follows a header");
                    data.extend_from_slice(bytes);
                    if let Some(r) = done {
                        let (pdu, data) = self.partial.take().expect("checked above");
                        out.push(OwnedPdu {
                            pdu,
                            data,
                            data_digest: r,
                        });
                    }
                }
                Some(Fed::DataDone(r)) => {
                    let (pdu, data) = self.partial.take().expect("data digest follows data");
                    out.push(OwnedPdu {
                        pdu,
                        data,
                        data_digest: r,
                    });
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sgl::Sgl;
    use crate::Status;
    use proptest::prelude::*;

    fn ctrl(hdgst: bool, ddgst: bool) -> RxConfig {
        RxConfig {
            hdgst,
            ddgst,
            ic_done: true,
            ..RxConfig::controller()
        }
    }
    fn host(hdgst: bool, ddgst: bool) -> RxConfig {
        RxConfig {
            hdgst,
            ddgst,
            ic_done: true,
            ..RxConfig::host()
        }
    }
    fn err_of(cfg: RxConfig, bytes: &[u8]) -> TcpError {
        PduCollector::new(cfg)
            .push(bytes)
            .expect_err("must be rejected")
    }

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        let mut c = Crc32c::new();
        c.update(b"1234");
        c.update(b"56789");
        assert_eq!(c.value(), 0xE306_9283);
        assert!(verify_digest(0xE306_9283, [0x83, 0x92, 0x06, 0xE3]).is_ok());
        assert_eq!(
            verify_digest(0xE306_9283, [0, 0, 0, 0]),
            Err(DigestMismatch {
                expected: 0xE306_9283,
                got: 0
            })
        );
    }

    #[test]
    fn linux_host_icreq_bytes() {
        // nvme_tcp_init_connection: type 0, hlen 128, pdo 0, plen 128, pfv 0, hpda 0,
        // digest = HDGST | DDGST, maxr2t 0.
        let mut want = [0u8; 128];
        want[2] = 128;
        want[4] = 128;
        want[11] = 0x03;
        let r = IcReq {
            pfv: 0,
            hpda: 0,
            hdgst: true,
            ddgst: true,
            maxr2t: 0,
        };
        assert_eq!(r.encode(), want);
        let mut c = PduCollector::new(RxConfig::controller());
        let got = c.push(&want).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].pdu, Pdu::IcReq(r));
    }

    #[test]
    fn linux_target_icresp_bytes() {
        // nvmet_tcp_handle_icreq: pfv 0, maxdata 4 MiB (0x400000), cpda 0, digest echoed.
        let mut b = [0u8; 128];
        b[0] = 1;
        b[2] = 128;
        b[4] = 128;
        b[11] = 0x01;
        b[12..16].copy_from_slice(&0x0040_0000u32.to_le_bytes());
        let r = IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: true,
            ddgst: false,
            maxh2cdata: 4 << 20,
        };
        assert_eq!(r.encode(), b);
        let got = PduCollector::new(RxConfig::host()).push(&b).unwrap();
        assert_eq!(got[0].pdu, Pdu::IcResp(r));
        let req = IcReq {
            hdgst: true,
            ..Default::default()
        };
        assert!(r.check_against(&req).is_ok());
        let e = r
            .check_against(&IcReq {
                hdgst: true,
                ddgst: true,
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!((e.fes, e.fei), (Fes::UnsupportedParameter, 11));
        let e = IcResp { cpda: 1, ..r }.check_against(&req).unwrap_err();
        assert_eq!(e.fei, 10);
    }

    #[test]
    fn icresp_small_maxh2cdata_rejected() {
        let b = IcResp {
            maxh2cdata: 2048,
            ..Default::default()
        }
        .encode();
        let e = err_of(RxConfig::host(), &b);
        assert_eq!((e.fes, e.fei), (Fes::InvalidHeaderField, 12));
        let b = IcResp {
            maxh2cdata: 4098,
            ..Default::default()
        }
        .encode();
        assert_eq!(err_of(RxConfig::host(), &b).fei, 12);
    }

    #[test]
    fn icreq_bad_pfv_and_hpda() {
        let b = IcReq {
            pfv: 1,
            ..Default::default()
        }
        .encode();
        let e = err_of(RxConfig::controller(), &b);
        assert_eq!((e.fes, e.fei), (Fes::UnsupportedParameter, 8));
        let b = IcReq {
            hpda: 32,
            ..Default::default()
        }
        .encode();
        let e = err_of(RxConfig::controller(), &b);
        assert_eq!((e.fes, e.fei), (Fes::InvalidHeaderField, 10));
    }

    #[test]
    fn linux_host_write_capsule_with_digests() {
        // A 4 KiB in-capsule write as the Linux host sends it with both digests: flags
        // HDGST|DDGST, hlen 72, pdo 76 (72 + hdgst), plen 76 + 4096 + 4.
        let mut sqe = Sqe::new(crate::opcode::io::WRITE, 9);
        sqe.nsid = 1.into();
        sqe.dptr = Sgl::InCapsule {
            offset: 0,
            len: 4096,
        }
        .encode();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let tx = TxConfig {
            hdgst: true,
            ddgst: true,
            pda: 0,
        };
        let wire = Pdu::CapsuleCmd {
            sqe,
            data_len: 4096,
        }
        .encode(&tx, &data);
        assert_eq!(&wire[..4], &[0x04, 0x03, 72, 76]);
        assert_eq!(
            u32::from_le_bytes(wire[4..8].try_into().unwrap()),
            76 + 4096 + 4
        );
        assert_eq!(&wire[8..72], sqe.as_bytes());
        assert_eq!(&wire[72..76], &crc32c(&wire[..72]).to_le_bytes());
        assert_eq!(&wire[76 + 4096..], &crc32c(&data).to_le_bytes());
        let got = PduCollector::new(ctrl(true, true)).push(&wire).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].pdu,
            Pdu::CapsuleCmd {
                sqe,
                data_len: 4096
            }
        );
        assert_eq!(got[0].data, data);
        assert_eq!(got[0].data_digest, Ok(()));
    }

    #[test]
    fn capsule_resp_bytes() {
        let cqe = Cqe::new(0x21, Status::SUCCESS, 0x1234);
        let wire = Pdu::CapsuleResp(cqe).encode(&TxConfig::default(), &[]);
        assert_eq!(wire.len(), 24);
        assert_eq!(&wire[..8], &[0x05, 0, 24, 0, 24, 0, 0, 0]);
        assert_eq!(&wire[8..24], &cqe.encode());
        let got = PduCollector::new(host(false, false)).push(&wire).unwrap();
        assert_eq!(got[0].pdu, Pdu::CapsuleResp(cqe));
    }

    #[test]
    fn r2t_and_data_bytes() {
        let r = R2t {
            cccid: 5,
            ttag: 2,
            r2to: 8192,
            r2tl: 65536,
        };
        let wire = Pdu::R2T(r).encode(&TxConfig::default(), &[]);
        let mut want = vec![0x09, 0, 24, 0, 24, 0, 0, 0, 5, 0, 2, 0];
        want.extend_from_slice(&8192u32.to_le_bytes());
        want.extend_from_slice(&65536u32.to_le_bytes());
        want.extend_from_slice(&[0; 4]);
        assert_eq!(wire, want);

        let d = DataPdu {
            cccid: 5,
            ttag: 0,
            datao: 0,
            datal: 4,
            last: true,
            success: true,
        };
        let wire = Pdu::C2HData(d).encode(&TxConfig::default(), b"wxyz");
        assert_eq!(&wire[..8], &[0x07, 0x0c, 24, 24, 28, 0, 0, 0]);
        assert_eq!(&wire[24..], b"wxyz");
    }

    #[test]
    fn pdo_respects_peer_pda() {
        // Peer asked for 32-byte alignment (pda 7): 24 + 4 hdgst rounds up to 32.
        let tx = TxConfig {
            hdgst: true,
            ddgst: false,
            pda: 7,
        };
        let d = DataPdu {
            cccid: 1,
            datal: 8,
            last: true,
            ..Default::default()
        };
        let h = TxHeader::h2c_data(&tx, &d);
        assert_eq!(h.as_bytes().len(), 32);
        assert_eq!(h.as_bytes()[3], 32);
        assert_eq!(h.plen(), 40);
        let mut cfg = ctrl(true, false);
        cfg.pda = 7;
        let got = PduCollector::new(cfg)
            .push(&Pdu::H2CData(d).encode(&tx, &[9; 8]))
            .unwrap();
        assert_eq!(got[0].data, vec![9; 8]);
        // Unaligned PDO against that PDA is rejected.
        let wire = Pdu::H2CData(d).encode(&TxConfig { pda: 0, ..tx }, &[9; 8]);
        let e = err_of(cfg, &wire);
        assert_eq!((e.fes, e.fei), (Fes::InvalidHeaderField, fei::PDO));
    }

    fn resp_wire(hdgst: bool) -> Vec<u8> {
        Pdu::CapsuleResp(Cqe::new(1, Status::SUCCESS, 0)).encode(
            &TxConfig {
                hdgst,
                ..Default::default()
            },
            &[],
        )
    }

    #[test]
    fn bad_headers_give_fes_and_fei() {
        // Unknown type.
        let mut w = resp_wire(false);
        w[0] = 0x08;
        let e = err_of(host(false, false), &w);
        assert_eq!((e.fes, e.fei), (Fes::InvalidHeaderField, 0));
        // Wrong direction: a CapsuleResp sent to a controller.
        let e = err_of(ctrl(false, false), &resp_wire(false));
        assert_eq!((e.fes, e.fei), (Fes::InvalidHeaderField, 0));
        // Wrong hlen.
        let mut w = resp_wire(false);
        w[2] = 28;
        let e = err_of(host(false, false), &w);
        assert_eq!((e.fes, e.fei), (Fes::InvalidHeaderField, 2));
        // plen < hlen.
        let mut w = resp_wire(false);
        w[4] = 16;
        let e = err_of(host(false, false), &w);
        assert_eq!((e.fes, e.fei), (Fes::InvalidHeaderField, 4));
        // Header digest flag missing while negotiated.
        let e = err_of(host(true, false), &resp_wire(false));
        assert_eq!((e.fes, e.fei), (Fes::InvalidHeaderField, 1));
        // Header digest mismatch.
        let mut w = resp_wire(true);
        w[10] ^= 1;
        let e = err_of(host(true, false), &w);
        assert_eq!((e.fes, e.fei), (Fes::HeaderDigestError, 0));
        // PDU before the IC exchange.
        let e = err_of(RxConfig::host(), &resp_wire(false));
        assert_eq!((e.fes, e.fei), (Fes::PduSequenceError, 0));
        // Second ICResp.
        let ic = IcResp {
            maxh2cdata: 4096,
            ..Default::default()
        }
        .encode();
        let e = err_of(host(false, false), &ic);
        assert_eq!(e.fes, Fes::PduSequenceError);
    }

    #[test]
    fn pdo_inside_header_and_data_limits() {
        let d = DataPdu {
            cccid: 1,
            datal: 16,
            last: true,
            ..Default::default()
        };
        let mut w = Pdu::H2CData(d).encode(&TxConfig::default(), &[1; 16]);
        w[3] = 20;
        let e = err_of(ctrl(false, false), &w);
        assert_eq!((e.fes, e.fei), (Fes::InvalidHeaderField, 3));
        // PDO beyond PLEN.
        w[3] = 252;
        assert_eq!(err_of(ctrl(false, false), &w).fei, 3);
        // More data than MAXH2CDATA.
        let mut cfg = ctrl(false, false);
        cfg.max_data_pdu = 8;
        let w = Pdu::H2CData(d).encode(&TxConfig::default(), &[1; 16]);
        assert_eq!(err_of(cfg, &w).fei, 4);
        // DATAL disagrees with PLEN.
        let mut w = Pdu::H2CData(d).encode(&TxConfig::default(), &[1; 16]);
        w[16] = 15;
        assert_eq!(err_of(ctrl(false, false), &w).fei, 16);
        // In-capsule data above the limit.
        let mut cfg = ctrl(false, false);
        cfg.max_incapsule = 8;
        let w = Pdu::CapsuleCmd {
            sqe: Sqe::new(1, 1),
            data_len: 16,
        }
        .encode(&TxConfig::default(), &[0; 16]);
        assert_eq!(err_of(cfg, &w).fei, 4);
        // C2H SUCCESS without LAST_PDU.
        let mut w = Pdu::C2HData(DataPdu {
            datal: 4,
            ..Default::default()
        })
        .encode(&TxConfig::default(), &[0; 4]);
        w[1] = flags::SUCCESS;
        assert_eq!(err_of(host(false, false), &w).fei, 1);
        // A CapsuleResp claiming data.
        let mut w = resp_wire(false);
        w[4] = 28;
        w.extend_from_slice(&[0; 4]);
        assert_eq!(err_of(host(false, false), &w).fei, 4);
        // R2T with zero length.
        let w = Pdu::R2T(R2t {
            r2tl: 0,
            ..Default::default()
        })
        .encode(&TxConfig::default(), &[]);
        assert_eq!(err_of(host(false, false), &w).fei, 16);
    }

    #[test]
    fn data_digest_mismatch_is_not_fatal() {
        let tx = TxConfig {
            hdgst: false,
            ddgst: true,
            pda: 0,
        };
        let d = DataPdu {
            cccid: 3,
            datal: 8,
            last: true,
            ..Default::default()
        };
        let mut w = Pdu::H2CData(d).encode(&tx, &[7; 8]);
        let n = w.len();
        w[n - 1] ^= 0xff;
        w.extend_from_slice(&Pdu::H2CData(d).encode(&tx, &[7; 8]));
        let got = PduCollector::new(ctrl(false, true)).push(&w).unwrap();
        assert_eq!(got.len(), 2);
        assert!(matches!(got[0].data_digest, Err(DigestMismatch { .. })));
        assert_eq!(got[1].data_digest, Ok(()));
        // DDGSTF must match the negotiation.
        let w = Pdu::H2CData(d).encode(&TxConfig::default(), &[7; 8]);
        assert_eq!(err_of(ctrl(false, true), &w).fei, 1);
    }

    #[test]
    fn term_req_round_trip() {
        let e = TcpError::new(Fes::InvalidHeaderField, 2, "x");
        let hdr = resp_wire(false);
        let t = TermReq::of(&e);
        let w = t.encode(false, &hdr);
        assert_eq!(&w[..8], &[0x03, 0, 24, 0, 48, 0, 0, 0]);
        assert_eq!(&w[8..10], &1u16.to_le_bytes());
        assert_eq!(&w[10..14], &2u32.to_le_bytes());
        // Accepted even before the IC exchange.
        let got = PduCollector::new(RxConfig::host()).push(&w).unwrap();
        match got[0].pdu {
            Pdu::C2HTermReq(t) => {
                assert_eq!(t.fes(), Some(Fes::InvalidHeaderField));
                assert_eq!(t.fei, 2);
            }
            ref p => panic!("{p:?}"),
        }
        assert_eq!(got[0].data, hdr);
        // Fed whole and a byte at a time, the deframer hands out the same copy.
        for step in [w.len(), 1] {
            let mut rx = Deframer::new(RxConfig::host());
            let mut at = 0;
            loop {
                let (n, fed) = rx.feed(&w[at..(at + step).min(w.len())]).unwrap();
                at += n;
                if let Some(Fed::Header(Pdu::C2HTermReq(_))) = fed {
                    break;
                }
                assert!(rx.term_data().is_empty());
            }
            assert_eq!(rx.term_data(), &hdr[..]);
        }
        // Longer than 128 bytes: the first 128 are sent.
        let long = [0xab; 200];
        let w2 = t.encode(true, &long);
        assert_eq!(w2.len(), TERM_MAX_PLEN);
        let got = PduCollector::new(RxConfig::controller()).push(&w2).unwrap();
        assert_eq!(got[0].data, &long[..TERM_MAX_DATA]);
        // PLEN above 152 is rejected.
        let mut w = w;
        w[4] = 153;
        assert_eq!(err_of(RxConfig::host(), &w).fei, 4);
    }

    #[test]
    fn failed_deframer_stays_failed_and_reports_header() {
        let mut rx = Deframer::new(host(false, false));
        let mut w = resp_wire(false);
        w[2] = 30;
        let e = rx.feed(&w).unwrap_err();
        assert_eq!(rx.need(), Need::Failed);
        assert_eq!(rx.feed(&w[8..]).unwrap_err(), e);
        assert_eq!(rx.offending_header(), &w[..8]);
    }

    #[test]
    fn header_first_then_data_into_slot() {
        // The transport path: exact header reads, data straight into the destination.
        let tx = TxConfig {
            hdgst: true,
            ddgst: true,
            pda: 0,
        };
        let d = DataPdu {
            cccid: 4,
            ttag: 1,
            datao: 100,
            datal: 50,
            last: false,
            success: false,
        };
        let payload: Vec<u8> = (0..50).collect();
        let wire = Pdu::C2HData(d).encode(&tx, &payload);
        let mut rx = Deframer::new(host(true, true));
        let mut pos = 0;
        let mut dst = [0u8; 200];
        let mut at = 0;
        let mut done = false;
        while !done {
            match rx.need() {
                Need::Header(n) | Need::DataDigest(n) => {
                    let k = n.min(3); // short reads
                    rx.header_buf()[..k].copy_from_slice(&wire[pos..pos + k]);
                    pos += k;
                    match rx.advance(k).unwrap() {
                        Some(Event::Header(Pdu::C2HData(h))) => at = h.datao as usize,
                        Some(Event::DataDone(r)) => {
                            r.unwrap();
                            done = true;
                        }
                        Some(e) => panic!("{e:?}"),
                        None => {}
                    }
                }
                Need::Data(n) => {
                    let k = n.min(7);
                    dst[at..at + k].copy_from_slice(&wire[pos..pos + k]);
                    pos += k;
                    assert_eq!(rx.data_read(&dst[at..at + k]), None);
                    at += k;
                }
                Need::Failed => panic!(),
            }
        }
        assert_eq!(pos, wire.len());
        assert_eq!(&dst[100..150], &payload[..]);
        assert!(rx.at_boundary());
    }

    fn arb_sqe() -> impl Strategy<Value = Sqe> {
        (
            any::<u8>(),
            any::<u16>(),
            any::<u32>(),
            any::<[u8; 16]>(),
            any::<u32>(),
        )
            .prop_map(|(op, cid, nsid, dptr, cdw10)| {
                let mut s = Sqe::new(op, cid);
                s.nsid = nsid.into();
                s.dptr = dptr;
                s.cdw10 = cdw10.into();
                s
            })
    }

    fn arb_h2c() -> impl Strategy<Value = (Pdu, Vec<u8>)> {
        prop_oneof![
            (arb_sqe(), proptest::collection::vec(any::<u8>(), 0..600)).prop_map(|(sqe, d)| (
                Pdu::CapsuleCmd {
                    sqe,
                    data_len: d.len() as u32
                },
                d
            )),
            (
                any::<u16>(),
                any::<u16>(),
                0u32..1 << 20,
                any::<bool>(),
                proptest::collection::vec(any::<u8>(), 1..700)
            )
                .prop_map(|(cccid, ttag, datao, last, d)| {
                    let p = DataPdu {
                        cccid,
                        ttag,
                        datao,
                        datal: d.len() as u32,
                        last,
                        success: false,
                    };
                    (Pdu::H2CData(p), d)
                }),
        ]
    }

    fn arb_c2h() -> impl Strategy<Value = (Pdu, Vec<u8>)> {
        prop_oneof![
            (any::<u16>(), any::<u64>(), any::<u16>()).prop_map(|(cid, res, st)| (
                Pdu::CapsuleResp(Cqe::new(cid, Status(st & 0x7fff), res)),
                vec![]
            )),
            (any::<u16>(), any::<u16>(), 0u32..1 << 20, 1u32..1 << 20).prop_map(
                |(cccid, ttag, r2to, r2tl)| (
                    Pdu::R2T(R2t {
                        cccid,
                        ttag,
                        r2to,
                        r2tl
                    }),
                    vec![]
                )
            ),
            (
                any::<u16>(),
                0u32..1 << 20,
                any::<bool>(),
                any::<bool>(),
                proptest::collection::vec(any::<u8>(), 1..700)
            )
                .prop_map(|(cccid, datao, last, success, d)| {
                    let p = DataPdu {
                        cccid,
                        ttag: 0,
                        datao,
                        datal: d.len() as u32,
                        last: last || success,
                        success,
                    };
                    (Pdu::C2HData(p), d)
                }),
        ]
    }

    fn split_and_collect(cfg: RxConfig, wire: &[u8], cuts: &[usize]) -> Vec<OwnedPdu> {
        let mut c = PduCollector::new(cfg);
        let mut cuts: Vec<usize> = cuts.iter().map(|&x| x % (wire.len() + 1)).collect();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut prev = 0;
        for cut in cuts.into_iter().chain(core::iter::once(wire.len())) {
            out.extend(c.push(&wire[prev..cut]).unwrap());
            prev = cut;
        }
        assert!(c.deframer.at_boundary());
        out
    }

    proptest! {
        #[test]
        fn lossless_split_controller_side(
            pdus in proptest::collection::vec(arb_h2c(), 1..12),
            hdgst: bool, ddgst: bool, pda in 0u8..8,
            cuts in proptest::collection::vec(any::<usize>(), 0..40),
        ) {
            let tx = TxConfig { hdgst, ddgst, pda };
            let icreq = IcReq { hpda: 0, hdgst, ddgst, ..Default::default() };
            let mut wire = icreq.encode().to_vec();
            for (p, d) in &pdus {
                wire.extend_from_slice(&p.encode(&tx, d));
            }
            let cfg = RxConfig { hdgst, ddgst, pda, max_incapsule: 4096, ..RxConfig::controller() };
            let got = split_and_collect(cfg, &wire, &cuts);
            prop_assert_eq!(got.len(), pdus.len() + 1);
            prop_assert_eq!(got[0].pdu, Pdu::IcReq(icreq));
            for (g, (p, d)) in got[1..].iter().zip(&pdus) {
                prop_assert_eq!(g.pdu, *p);
                prop_assert_eq!(&g.data, d);
                prop_assert_eq!(g.data_digest, Ok(()));
            }
        }

        #[test]
        fn lossless_split_host_side(
            pdus in proptest::collection::vec(arb_c2h(), 1..12),
            hdgst: bool, ddgst: bool,
            cuts in proptest::collection::vec(any::<usize>(), 0..40),
        ) {
            let tx = TxConfig { hdgst, ddgst, pda: 0 };
            let mut wire = Vec::new();
            for (p, d) in &pdus {
                wire.extend_from_slice(&p.encode(&tx, d));
            }
            let got = split_and_collect(host(hdgst, ddgst), &wire, &cuts);
            prop_assert_eq!(got.len(), pdus.len());
            for (g, (p, d)) in got.iter().zip(&pdus) {
                prop_assert_eq!(g.pdu, *p);
                prop_assert_eq!(&g.data, d);
            }
        }

        /// A header taken whole (`Deframer::whole_header`) gets the same verdict, the same
        /// state and the same quotable header as when it arrives in pieces (the step-by-step
        /// path), for every PDU type, valid and corrupted, either role, any negotiated options,
        /// and a sender whose digests and alignment match them or not.
        #[test]
        fn whole_header_path_matches_the_steps(
            pdu in prop_oneof![
                arb_sqe().prop_map(|sqe| (Pdu::CapsuleCmd { sqe, data_len: 0 }, vec![])),
                arb_h2c(),
                arb_c2h(),
                (0u8..32, any::<bool>(), any::<bool>(), any::<u32>()).prop_map(|(pda, h, d, n)| (
                    if n % 2 == 0 {
                        Pdu::IcReq(IcReq { pfv: PFV_1_0, hpda: pda, hdgst: h, ddgst: d, maxr2t: n })
                    } else {
                        Pdu::IcResp(IcResp { pfv: PFV_1_0, cpda: pda, hdgst: h, ddgst: d, maxh2cdata: n })
                    },
                    vec![]
                )),
                (any::<bool>(), any::<u16>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..200))
                    .prop_map(|(h2c, fes, fei, hdr)| {
                        let t = TermReq { fes, fei };
                        (if h2c { Pdu::H2CTermReq(t) } else { Pdu::C2HTermReq(t) }, hdr)
                    }),
            ],
            // The sender's digests and PDA: mostly those the receiver expects.
            tx_matches in proptest::bool::weighted(0.8),
            tx_other in (any::<bool>(), any::<bool>(), 0u8..8),
            pokes in prop_oneof![Just(vec![]), proptest::collection::vec((0usize..80, any::<u8>()), 1..3)],
            plen_delta in prop_oneof![Just(0i64), -80i64..200],
            tail in proptest::collection::vec(any::<u8>(), 0..100),
            // Mostly what the whole-header path takes, so both of its outcomes are common.
            role: bool,
            hdgst in proptest::bool::weighted(0.2),
            ddgst in proptest::bool::weighted(0.2),
            ic_done in proptest::bool::weighted(0.8),
            pda in prop_oneof![3 => Just(0u8), 1 => 1u8..8],
            max_data_pdu in prop_oneof![3 => Just(u32::MAX), 1 => 0u32..1000],
            // A data offset near the top of the range (DATAO + DATAL may overflow).
            datao in proptest::option::weighted(0.2, (u32::MAX - 2000)..=u32::MAX),
            flag_bits in proptest::option::of(
                proptest::sample::select(vec![0, flags::LAST_PDU, flags::SUCCESS, flags::LAST_PDU | flags::SUCCESS])
            ),
        ) {
            let (p, data) = pdu;
            let tx = if tx_matches {
                TxConfig { hdgst, ddgst, pda }
            } else {
                TxConfig { hdgst: tx_other.0, ddgst: tx_other.1, pda: tx_other.2 }
            };
            let mut wire = p.encode(&tx, &data);
            let plen = (wire.len() as i64 + plen_delta).max(0) as u32;
            wire[4..8].copy_from_slice(&plen.to_le_bytes());
            for (at, v) in pokes {
                if at < wire.len() {
                    wire[at] = v;
                }
            }
            if let Some(o) = datao {
                wire[12..16].copy_from_slice(&o.to_le_bytes());
            }
            if let Some(f) = flag_bits {
                // LAST_PDU and SUCCESS in any combination, the digest flags left as they were.
                wire[1] = (wire[1] & !(flags::LAST_PDU | flags::SUCCESS)) | f;
            }
            wire.extend_from_slice(&tail);
            let cfg = RxConfig {
                ic_done,
                pda,
                max_data_pdu,
                ..if role { host(hdgst, ddgst) } else { ctrl(hdgst, ddgst) }
            };
            // Through the first PDU (its header, then its data if any) or to an error: whole
            // (one call per step, as a transport feeds), then a byte at a time (never a whole
            // header in one call). Records the header, the data's end, and the state after
            // each.
            let run = |step: usize| {
                let mut d = Deframer::new(cfg);
                let mut at = 0;
                let mut seen = Vec::new();
                let verdict = loop {
                    if at == wire.len() {
                        break Ok(());
                    }
                    let end = (at + step).min(wire.len());
                    match d.feed(&wire[at..end]) {
                        Ok((n, fed)) => {
                            at += n;
                            let state = (d.need(), d.at_boundary(), d.offending_header().to_vec(), d.term_data().to_vec());
                            match fed {
                                Some(Fed::Header(p)) => {
                                    seen.push((format!("{p:?}"), at, state));
                                    if p.data_len() == 0 {
                                        break Ok(());
                                    }
                                }
                                Some(Fed::Data { done: Some(r), .. }) | Some(Fed::DataDone(r)) => {
                                    seen.push((format!("data done {r:?}"), at, state));
                                    break Ok(());
                                }
                                Some(Fed::Data { done: None, .. }) => {}
                                None if n == 0 => break Ok(()),
                                None => {}
                            }
                        }
                        Err(e) => break Err(e),
                    }
                };
                (verdict, seen, d.need(), d.at_boundary(), d.offending_header().to_vec())
            };
            prop_assert_eq!(run(wire.len()), run(1));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), role: bool, hdgst: bool, ddgst: bool) {
            let cfg = if role { host(hdgst, ddgst) } else { ctrl(hdgst, ddgst) };
            let _ = PduCollector::new(cfg).push(&bytes);
        }
    }
}
