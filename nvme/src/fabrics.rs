//! NVMe over Fabrics commands and controller properties (NVMe-oF 1.1, 3.3 and 6; NVMe Base 2.0,
//! 3.1.4 for the property map).
//!
//! Fabrics commands reuse the 64-byte SQE with opcode 7Fh and the command type (`fctype`) in
//! byte 4. The structs here are byte-for-byte views of that SQE for each command type, plus the
//! 1024-byte Connect data. Decoding from an [`Sqe`] cannot fail (same size); decoding Connect
//! data from a buffer can. Builders at the end produce what an initiator sends.

use core::mem::{offset_of, size_of};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::cmd::PSDT_SGL;
use crate::identify::nqn_field;
use crate::opcode::{fctype, FABRICS};
use crate::sgl::Sgl;
use crate::{DecodeError, Sqe};

/// Property offsets (NVMe Base 2.0 Figure 33; NVMe-oF 1.1, 3.5).
pub mod reg {
    /// Controller Capabilities, 8 bytes.
    pub const CAP: u32 = 0x00;
    /// Version, 4 bytes.
    pub const VS: u32 = 0x08;
    /// Controller Configuration, 4 bytes.
    pub const CC: u32 = 0x14;
    /// Controller Status, 4 bytes.
    pub const CSTS: u32 = 0x1c;
    /// NVM Subsystem Reset, 4 bytes.
    pub const NSSR: u32 = 0x20;
}

/// Controller Capabilities (CAP, NVMe Base 2.0 Figure 36).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cap(pub u64);

impl Cap {
    /// CAP.CSS bit 0: NVM command set.
    pub const CSS_NVM: u8 = 1 << 0;
    /// CAP.CSS bit 6: one or more I/O command sets (CC.CSS = 110b allowed).
    pub const CSS_CSI: u8 = 1 << 6;
    /// CAP.CSS bit 7: no I/O command set (admin only).
    pub const CSS_ADMIN_ONLY: u8 = 1 << 7;

    /// Build CAP from its fields. `mqes` is 0's based; `to` in 500 ms units; page sizes as
    /// log2(size) - 12.
    pub fn new(mqes: u16, cqr: bool, to: u8, css: u8, mpsmin: u8, mpsmax: u8) -> Cap {
        Cap(mqes as u64
            | (cqr as u64) << 16
            | (to as u64) << 24
            | (css as u64) << 37
            | ((mpsmin & 0xf) as u64) << 48
            | ((mpsmax & 0xf) as u64) << 52)
    }
    /// Maximum Queue Entries Supported, 0's based (bits 15:0).
    pub fn mqes(self) -> u16 {
        self.0 as u16
    }
    /// Contiguous Queues Required (bit 16).
    pub fn cqr(self) -> bool {
        self.0 >> 16 & 1 == 1
    }
    /// Timeout for CSTS.RDY transitions, 500 ms units (bits 31:24).
    pub fn to(self) -> u8 {
        (self.0 >> 24) as u8
    }
    /// Doorbell stride (bits 35:32).
    pub fn dstrd(self) -> u8 {
        (self.0 >> 32 & 0xf) as u8
    }
    /// Command Sets Supported (bits 44:37).
    pub fn css(self) -> u8 {
        (self.0 >> 37) as u8
    }
    /// Memory Page Size Minimum, log2(bytes) - 12 (bits 51:48).
    pub fn mpsmin(self) -> u8 {
        (self.0 >> 48 & 0xf) as u8
    }
    /// Memory Page Size Maximum, log2(bytes) - 12 (bits 55:52).
    pub fn mpsmax(self) -> u8 {
        (self.0 >> 52 & 0xf) as u8
    }
    /// Controller Ready Modes Supported (bits 60:59).
    pub fn crms(self) -> u8 {
        (self.0 >> 59 & 0x3) as u8
    }
}

/// Controller Configuration (CC, NVMe Base 2.0 Figure 41).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

impl Cc {
    /// CC.SHN: no notification.
    pub const SHN_NONE: u8 = 0;
    /// CC.SHN: normal shutdown.
    pub const SHN_NORMAL: u8 = 1;
    /// CC.SHN: abrupt shutdown.
    pub const SHN_ABRUPT: u8 = 2;
    /// CC.CSS: NVM command set.
    pub const CSS_NVM: u8 = 0;
    /// CC.CSS: all supported I/O command sets (requires CAP.CSS bit 6).
    pub const CSS_CSI: u8 = 6;
    /// CC.CSS: admin command set only.
    pub const CSS_ADMIN_ONLY: u8 = 7;

    /// Build CC from its fields (the values a Linux host writes: `iosqes` 6, `iocqes` 4).
    pub fn new(en: bool, css: u8, mps: u8, ams: u8, shn: u8, iosqes: u8, iocqes: u8) -> Cc {
        Cc(en as u32
            | ((css & 7) as u32) << 4
            | ((mps & 0xf) as u32) << 7
            | ((ams & 7) as u32) << 11
            | ((shn & 3) as u32) << 14
            | ((iosqes & 0xf) as u32) << 16
            | ((iocqes & 0xf) as u32) << 20)
    }
    /// Enable (bit 0).
    pub fn en(self) -> bool {
        self.0 & 1 == 1
    }
    /// I/O Command Set Selected (bits 6:4).
    pub fn css(self) -> u8 {
        (self.0 >> 4 & 7) as u8
    }
    /// Memory Page Size, log2(bytes) - 12 (bits 10:7).
    pub fn mps(self) -> u8 {
        (self.0 >> 7 & 0xf) as u8
    }
    /// Arbitration Mechanism Selected (bits 13:11).
    pub fn ams(self) -> u8 {
        (self.0 >> 11 & 7) as u8
    }
    /// Shutdown Notification (bits 15:14).
    pub fn shn(self) -> u8 {
        (self.0 >> 14 & 3) as u8
    }
    /// I/O Submission Queue Entry Size, log2 (bits 19:16).
    pub fn iosqes(self) -> u8 {
        (self.0 >> 16 & 0xf) as u8
    }
    /// I/O Completion Queue Entry Size, log2 (bits 23:20).
    pub fn iocqes(self) -> u8 {
        (self.0 >> 20 & 0xf) as u8
    }
}

/// Controller Status (CSTS, NVMe Base 2.0 Figure 42).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Csts(pub u32);

impl Csts {
    /// Ready (bit 0).
    pub const RDY: u32 = 1 << 0;
    /// Controller Fatal Status (bit 1).
    pub const CFS: u32 = 1 << 1;
    /// CSTS.SHST mask (bits 3:2).
    pub const SHST_MASK: u32 = 3 << 2;
    /// Shutdown processing occurring.
    pub const SHST_OCCURRING: u32 = 1 << 2;
    /// Shutdown processing complete.
    pub const SHST_COMPLETE: u32 = 2 << 2;
    /// NVM Subsystem Reset Occurred (bit 4).
    pub const NSSRO: u32 = 1 << 4;
    /// Processing Paused (bit 5).
    pub const PP: u32 = 1 << 5;

    pub fn rdy(self) -> bool {
        self.0 & Self::RDY != 0
    }
    pub fn cfs(self) -> bool {
        self.0 & Self::CFS != 0
    }
    /// Shutdown Status (bits 3:2): 0 normal, 1 occurring, 2 complete.
    pub fn shst(self) -> u8 {
        (self.0 >> 2 & 3) as u8
    }
}

/// Version register value for NVMe `major.minor.tertiary` (NVMe Base 2.0 Figure 37).
pub const fn version(major: u16, minor: u8, tertiary: u8) -> u32 {
    (major as u32) << 16 | (minor as u32) << 8 | tertiary as u32
}

/// Connect command CATTR bit 2: disable SQ flow control (the controller reports SQHD FFFFh).
pub const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;

/// The Connect command SQE (NVMe-oF 1.1 Figure 19).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ConnectCmd {
    /// Byte 0: opcode 7Fh.
    pub opcode: u8,
    /// Byte 1: PSDT/FUSE.
    pub flags: u8,
    /// Bytes 3:2: command identifier.
    pub cid: U16,
    /// Byte 4: fabrics command type 01h.
    pub fctype: u8,
    _rsvd5: [u8; 19],
    /// Bytes 39:24: SGL descriptor for the Connect data.
    pub dptr: [u8; 16],
    /// Bytes 41:40: Record Format, 0 in NVMe-oF 1.1.
    pub recfmt: U16,
    /// Bytes 43:42: Queue ID (0 = admin queue).
    pub qid: U16,
    /// Bytes 45:44: Submission Queue Size, 0's based.
    pub sqsize: U16,
    /// Byte 46: Connect Attributes (bit 2: disable SQ flow control).
    pub cattr: u8,
    _rsvd47: u8,
    /// Bytes 51:48: Keep Alive Timeout in milliseconds (admin queue only).
    pub kato: U32,
    _rsvd52: [u8; 12],
}

const _: () = assert!(size_of::<ConnectCmd>() == 64);
const _: () = assert!(offset_of!(ConnectCmd, fctype) == 4);
const _: () = assert!(offset_of!(ConnectCmd, dptr) == 24);
const _: () = assert!(offset_of!(ConnectCmd, recfmt) == 40);
const _: () = assert!(offset_of!(ConnectCmd, qid) == 42);
const _: () = assert!(offset_of!(ConnectCmd, sqsize) == 44);
const _: () = assert!(offset_of!(ConnectCmd, cattr) == 46);
const _: () = assert!(offset_of!(ConnectCmd, kato) == 48);

/// SQE byte offsets of Connect fields, for Invalid Parameter reporting (IPO with IATTR 0).
pub mod connect_sqe_off {
    pub const RECFMT: u16 = 40;
    pub const QID: u16 = 42;
    pub const SQSIZE: u16 = 44;
    pub const CATTR: u16 = 46;
    pub const KATO: u16 = 48;
}

impl ConnectCmd {
    /// View an SQE as a Connect command (the caller checked opcode and fctype).
    pub fn from_sqe(sqe: &Sqe) -> ConnectCmd {
        ConnectCmd::read_from_bytes(sqe.as_bytes()).expect("Sqe and ConnectCmd are both 64 bytes")
    }
    /// The 64-byte SQE.
    pub fn to_sqe(&self) -> Sqe {
        Sqe::read_from_bytes(self.as_bytes()).expect("Sqe and ConnectCmd are both 64 bytes")
    }
}

/// Connect command data, 1024 bytes (NVMe-oF 1.1 Figure 20).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ConnectData {
    /// Bytes 15:00: Host Identifier (a UUID).
    pub hostid: [u8; 16],
    /// Bytes 17:16: Controller ID: FFFFh on the admin queue (dynamic model), the cntlid from the
    /// admin Connect on I/O queues.
    pub cntlid: U16,
    _rsvd18: [u8; 238],
    /// Bytes 511:256: NVM Subsystem NQN, NUL terminated.
    pub subnqn: [u8; 256],
    /// Bytes 767:512: Host NQN, NUL terminated.
    pub hostnqn: [u8; 256],
    _rsvd768: [u8; 256],
}

const _: () = assert!(size_of::<ConnectData>() == 1024);
const _: () = assert!(offset_of!(ConnectData, cntlid) == 16);
const _: () = assert!(offset_of!(ConnectData, subnqn) == 256);
const _: () = assert!(offset_of!(ConnectData, hostnqn) == 512);

/// Connect data byte offsets, for Invalid Parameter reporting (IPO with IATTR 1).
pub mod connect_data_off {
    pub const HOSTID: u16 = 0;
    pub const CNTLID: u16 = 16;
    pub const SUBNQN: u16 = 256;
    pub const HOSTNQN: u16 = 512;
}

/// The cntlid a host puts in admin-queue Connect data to ask for any controller (dynamic model).
pub const CNTLID_DYNAMIC: u16 = 0xffff;
/// Highest cntlid a controller may have (NVMe Base 2.0: FFF0h..FFFFh are reserved).
pub const CNTLID_MAX: u16 = 0xffef;
/// Lowest cntlid (0 is valid on PCIe but nvmet and SPDK start fabrics controllers at 1).
pub const CNTLID_MIN: u16 = 1;

impl ConnectData {
    pub const SIZE: usize = 1024;

    /// Connect data for `subnqn`/`hostnqn`. NQNs longer than 255 bytes are cut so a NUL remains
    /// (the NVMe limit is 223 bytes, so a valid NQN is never cut).
    pub fn new(hostid: [u8; 16], cntlid: u16, subnqn: &str, hostnqn: &str) -> ConnectData {
        let mut d = ConnectData::new_zeroed();
        d.hostid = hostid;
        d.cntlid = cntlid.into();
        d.subnqn = nqn_field(subnqn);
        d.hostnqn = nqn_field(hostnqn);
        d
    }
    pub fn decode(buf: &[u8]) -> Result<ConnectData, DecodeError> {
        ConnectData::read_from_prefix(buf)
            .map(|(d, _)| d)
            .map_err(|_| DecodeError::Short {
                need: Self::SIZE,
                have: buf.len(),
            })
    }
    pub fn encode(&self) -> [u8; 1024] {
        let mut out = [0u8; 1024];
        out.copy_from_slice(self.as_bytes());
        out
    }
    /// The subsystem NQN bytes before the first NUL.
    pub fn subnqn_bytes(&self) -> &[u8] {
        until_nul(&self.subnqn)
    }
    /// The host NQN bytes before the first NUL.
    pub fn hostnqn_bytes(&self) -> &[u8] {
        until_nul(&self.hostnqn)
    }
    /// The subsystem NQN if it is UTF-8.
    pub fn subnqn_str(&self) -> Option<&str> {
        core::str::from_utf8(self.subnqn_bytes()).ok()
    }
    /// The host NQN if it is UTF-8.
    pub fn hostnqn_str(&self) -> Option<&str> {
        core::str::from_utf8(self.hostnqn_bytes()).ok()
    }
}

impl core::fmt::Debug for ConnectData {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ConnectData")
            .field("hostid", &format_args!("{:02x?}", self.hostid))
            .field("cntlid", &format_args!("{:#06x}", self.cntlid.get()))
            .field("subnqn", &String::from_utf8_lossy(self.subnqn_bytes()))
            .field("hostnqn", &String::from_utf8_lossy(self.hostnqn_bytes()))
            .finish()
    }
}

/// Bytes of a fixed-size string field up to its first NUL.
pub fn until_nul(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// Where an Invalid Parameters error points (NVMe-oF 1.1 Figure 21, IATTR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidAttr {
    /// The offending field is in the Connect SQE.
    Sqe,
    /// The offending field is in the Connect data.
    Data,
}

/// The Connect completion's result dword, decoded (NVMe-oF 1.1 Figure 21).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectResult {
    /// Success: the controller ID (bits 15:0) and the authentication requirements, bits 18:16
    /// shifted down ([`AUTHREQ_ATR`], [`AUTHREQ_ASCR`]).
    Success { cntlid: u16, authreq: u8 },
    /// Connect Invalid Parameters: IPO (bits 15:0) is the byte offset of the field, IATTR (bit
    /// 16) says whether it is in the SQE or the data.
    InvalidParam { attr: InvalidAttr, offset: u16 },
}

impl ConnectResult {
    /// The CQE result (DW0; DW1 is zero).
    pub fn encode(self) -> u64 {
        match self {
            ConnectResult::Success { cntlid, authreq } => {
                cntlid as u64 | ((authreq & 7) as u64) << 16
            }
            ConnectResult::InvalidParam { attr, offset } => {
                offset as u64 | ((attr == InvalidAttr::Data) as u64) << 16
            }
        }
    }
    /// Interpret a Connect CQE result; `invalid_param` tells which layout applies (the status
    /// was Connect Invalid Parameters).
    pub fn decode(result: u64, invalid_param: bool) -> ConnectResult {
        if invalid_param {
            ConnectResult::InvalidParam {
                attr: if result >> 16 & 1 == 1 {
                    InvalidAttr::Data
                } else {
                    InvalidAttr::Sqe
                },
                offset: result as u16,
            }
        } else {
            ConnectResult::Success {
                cntlid: result as u16,
                authreq: (result >> 16 & 7) as u8,
            }
        }
    }
}

/// Connect response AUTHREQ: an authentication transaction is required on this queue before
/// any other command (DW0 bit 17, where Linux's `NVME_CONNECT_AUTHREQ_ATR` and nvmet put it).
pub const AUTHREQ_ATR: u8 = 1 << 1;
/// Connect response AUTHREQ: secure channel concatenation required (DW0 bit 18; never set
/// here: Linux 6.1-6.12 hosts refuse it).
pub const AUTHREQ_ASCR: u8 = 1 << 2;

/// Authentication Send / Receive (fabrics command types 05h / 06h): the security protocol
/// fields and the transfer (Send: TL) or allocation (Receive: AL) length. CDW10 holds
/// SPSP0 (byte 41), SPSP1 (42) and SECP (43); CDW11 the length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthCmd {
    pub secp: u8,
    pub spsp0: u8,
    pub spsp1: u8,
    pub len: u32,
}

impl AuthCmd {
    pub fn from_sqe(sqe: &Sqe) -> AuthCmd {
        let cdw10 = sqe.cdw10.get();
        AuthCmd {
            spsp0: (cdw10 >> 8) as u8,
            spsp1: (cdw10 >> 16) as u8,
            secp: (cdw10 >> 24) as u8,
            len: sqe.cdw11.get(),
        }
    }

    /// CDW10 and CDW11 for an SQE.
    pub fn dwords(&self) -> (u32, u32) {
        (
            (self.secp as u32) << 24 | (self.spsp1 as u32) << 16 | (self.spsp0 as u32) << 8,
            self.len,
        )
    }
}

/// Property Get command SQE (NVMe-oF 1.1 Figure 25).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct PropertyGetCmd {
    /// Byte 0: opcode 7Fh.
    pub opcode: u8,
    /// Byte 1: PSDT/FUSE.
    pub flags: u8,
    /// Bytes 3:2: command identifier.
    pub cid: U16,
    /// Byte 4: fabrics command type 04h.
    pub fctype: u8,
    _rsvd5: [u8; 35],
    /// Byte 40: Attributes; bit 2:0 size (000b 4 bytes, 001b 8 bytes).
    pub attrib: u8,
    _rsvd41: [u8; 3],
    /// Bytes 47:44: property offset.
    pub offset: U32,
    _rsvd48: [u8; 16],
}

const _: () = assert!(size_of::<PropertyGetCmd>() == 64);
const _: () = assert!(offset_of!(PropertyGetCmd, attrib) == 40);
const _: () = assert!(offset_of!(PropertyGetCmd, offset) == 44);

/// Property Set command SQE (NVMe-oF 1.1 Figure 27).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct PropertySetCmd {
    /// Byte 0: opcode 7Fh.
    pub opcode: u8,
    /// Byte 1: PSDT/FUSE.
    pub flags: u8,
    /// Bytes 3:2: command identifier.
    pub cid: U16,
    /// Byte 4: fabrics command type 00h.
    pub fctype: u8,
    _rsvd5: [u8; 35],
    /// Byte 40: Attributes; bit 2:0 size (000b 4 bytes, 001b 8 bytes).
    pub attrib: u8,
    _rsvd41: [u8; 3],
    /// Bytes 47:44: property offset.
    pub offset: U32,
    /// Bytes 55:48: value (upper 4 bytes ignored for a 4-byte property).
    pub value: U64,
    _rsvd56: [u8; 8],
}

const _: () = assert!(size_of::<PropertySetCmd>() == 64);
const _: () = assert!(offset_of!(PropertySetCmd, attrib) == 40);
const _: () = assert!(offset_of!(PropertySetCmd, offset) == 44);
const _: () = assert!(offset_of!(PropertySetCmd, value) == 48);

/// SQE byte offsets of Property Get/Set fields, for error locations.
pub mod property_off {
    pub const ATTRIB: u16 = 40;
    pub const OFFSET: u16 = 44;
    pub const VALUE: u16 = 48;
}

/// Property size from the ATTRIB field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropSize {
    Four,
    Eight,
}

impl PropSize {
    /// Decode ATTRIB bits 2:0; values other than 0 and 1 are reserved.
    pub fn from_attrib(attrib: u8) -> Result<PropSize, DecodeError> {
        match attrib & 7 {
            0 => Ok(PropSize::Four),
            1 => Ok(PropSize::Eight),
            v => Err(DecodeError::Invalid {
                field: "property size",
                value: v as u64,
            }),
        }
    }
    fn attrib(self) -> u8 {
        match self {
            PropSize::Four => 0,
            PropSize::Eight => 1,
        }
    }
}

impl PropertyGetCmd {
    pub fn from_sqe(sqe: &Sqe) -> PropertyGetCmd {
        PropertyGetCmd::read_from_bytes(sqe.as_bytes()).expect("both 64 bytes")
    }
    pub fn size(&self) -> Result<PropSize, DecodeError> {
        PropSize::from_attrib(self.attrib)
    }
}

impl PropertySetCmd {
    pub fn from_sqe(sqe: &Sqe) -> PropertySetCmd {
        PropertySetCmd::read_from_bytes(sqe.as_bytes()).expect("both 64 bytes")
    }
    pub fn size(&self) -> Result<PropSize, DecodeError> {
        PropSize::from_attrib(self.attrib)
    }
}

/// Disconnect command SQE (NVMe-oF 1.1 Figure 29).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DisconnectCmd {
    /// Byte 0: opcode 7Fh.
    pub opcode: u8,
    /// Byte 1: PSDT/FUSE.
    pub flags: u8,
    /// Bytes 3:2: command identifier.
    pub cid: U16,
    /// Byte 4: fabrics command type 08h.
    pub fctype: u8,
    _rsvd5: [u8; 35],
    /// Bytes 41:40: Record Format, 0.
    pub recfmt: U16,
    _rsvd42: [u8; 22],
}

const _: () = assert!(size_of::<DisconnectCmd>() == 64);
const _: () = assert!(offset_of!(DisconnectCmd, recfmt) == 40);

impl DisconnectCmd {
    pub fn from_sqe(sqe: &Sqe) -> DisconnectCmd {
        DisconnectCmd::read_from_bytes(sqe.as_bytes()).expect("both 64 bytes")
    }
}

fn fabrics_sqe(cid: u16, fctype: u8) -> Sqe {
    let mut sqe = Sqe {
        opcode: FABRICS,
        flags: PSDT_SGL,
        cid: cid.into(),
        ..Default::default()
    };
    sqe.nsid = (fctype as u32).into();
    sqe
}

/// A Connect SQE (what `nvmf_connect_cmd_prep` builds). `sgl` describes the 1024-byte data
/// (in-capsule, transport or keyed). `kato_ms` is only meaningful for `qid` 0.
pub fn connect_sqe(cid: u16, qid: u16, sqsize: u16, cattr: u8, kato_ms: u32, sgl: Sgl) -> Sqe {
    let mut c = ConnectCmd::from_sqe(&fabrics_sqe(cid, fctype::CONNECT));
    c.dptr = sgl.encode();
    c.qid = qid.into();
    c.sqsize = sqsize.into();
    c.cattr = cattr;
    c.kato = kato_ms.into();
    c.to_sqe()
}

/// A Property Get SQE.
pub fn property_get_sqe(cid: u16, offset: u32, size: PropSize) -> Sqe {
    let mut c = PropertyGetCmd::from_sqe(&fabrics_sqe(cid, fctype::PROPERTY_GET));
    c.attrib = size.attrib();
    c.offset = offset.into();
    Sqe::read_from_bytes(c.as_bytes()).expect("both 64 bytes")
}

/// An Authentication Send (`send`: TL = `len`) or Receive (AL = `len`) SQE for NVMe in-band
/// authentication (SECP E9h, SPSP 01h/01h), its data described by `sgl`.
pub fn auth_sqe(cid: u16, send: bool, len: u32, sgl: Sgl) -> Sqe {
    let ft = if send {
        fctype::AUTH_SEND
    } else {
        fctype::AUTH_RECV
    };
    let mut sqe = fabrics_sqe(cid, ft);
    let (cdw10, cdw11) = AuthCmd {
        secp: crate::auth::SECP_DHCHAP,
        spsp0: crate::auth::SPSP0,
        spsp1: crate::auth::SPSP1,
        len,
    }
    .dwords();
    sqe.cdw10 = cdw10.into();
    sqe.cdw11 = cdw11.into();
    sqe.dptr = sgl.encode();
    sqe
}

/// A Property Set SQE.
pub fn property_set_sqe(cid: u16, offset: u32, value: u64, size: PropSize) -> Sqe {
    let mut c = PropertySetCmd::from_sqe(&fabrics_sqe(cid, fctype::PROPERTY_SET));
    c.attrib = size.attrib();
    c.offset = offset.into();
    c.value = value.into();
    Sqe::read_from_bytes(c.as_bytes()).expect("both 64 bytes")
}

/// A Disconnect SQE (sent on the I/O queue being torn down).
pub fn disconnect_sqe(cid: u16) -> Sqe {
    fabrics_sqe(cid, fctype::DISCONNECT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_sqe_bytes_match_linux_layout() {
        // struct nvmf_connect_command: fctype at 4, recfmt 40, qid 42, sqsize 44, cattr 46,
        // kato 48. A Linux admin connect: qid 0, sqsize 31, kato 5000 ms, in-capsule data.
        let sqe = connect_sqe(
            0x11,
            0,
            31,
            0,
            5000,
            Sgl::InCapsule {
                offset: 0,
                len: 1024,
            },
        );
        let b = sqe.encode();
        assert_eq!(b[0], 0x7f);
        assert_eq!(b[1], 0x40);
        assert_eq!(&b[2..4], &[0x11, 0]);
        assert_eq!(b[4], 0x01);
        assert_eq!(&b[32..36], &1024u32.to_le_bytes());
        assert_eq!(b[39], 0x01);
        assert_eq!(&b[40..42], &[0, 0]);
        assert_eq!(&b[42..44], &[0, 0]);
        assert_eq!(&b[44..46], &[31, 0]);
        assert_eq!(b[46], 0);
        assert_eq!(&b[48..52], &5000u32.to_le_bytes());
        let c = ConnectCmd::from_sqe(&Sqe::decode(&b).unwrap());
        assert_eq!(c.sqsize.get(), 31);
        assert_eq!(c.kato.get(), 5000);
        assert_eq!(
            Sgl::decode(&c.dptr).unwrap(),
            Sgl::InCapsule {
                offset: 0,
                len: 1024
            }
        );
    }

    #[test]
    fn connect_data_round_trip_and_offsets() {
        let d = ConnectData::new([7; 16], 0xffff, "nqn.sub", "nqn.host");
        let b = d.encode();
        assert_eq!(&b[0..16], &[7; 16]);
        assert_eq!(&b[16..18], &[0xff, 0xff]);
        assert_eq!(&b[256..263], b"nqn.sub");
        assert_eq!(b[263], 0);
        assert_eq!(&b[512..520], b"nqn.host");
        let back = ConnectData::decode(&b).unwrap();
        assert_eq!(back.subnqn_str(), Some("nqn.sub"));
        assert_eq!(back.hostnqn_str(), Some("nqn.host"));
        assert!(matches!(
            ConnectData::decode(&b[..1000]),
            Err(DecodeError::Short {
                need: 1024,
                have: 1000
            })
        ));
        // A 300-byte NQN is cut to 255 bytes and stays NUL terminated.
        let long = "n".repeat(300);
        let d = ConnectData::new([0; 16], 1, &long, "h");
        assert_eq!(d.subnqn_bytes().len(), 255);
    }

    #[test]
    fn connect_result_iattr_ipo() {
        // Linux IPO_IATTR_CONNECT_DATA(cntlid) = (1 << 16) | 16;
        // IPO_IATTR_CONNECT_SQE(sqsize) = 44.
        let r = ConnectResult::InvalidParam {
            attr: InvalidAttr::Data,
            offset: 16,
        };
        assert_eq!(r.encode(), 0x1_0010);
        assert_eq!(ConnectResult::decode(0x1_0010, true), r);
        let r = ConnectResult::InvalidParam {
            attr: InvalidAttr::Sqe,
            offset: 44,
        };
        assert_eq!(r.encode(), 44);
        assert_eq!(ConnectResult::decode(44, true), r);
        assert_eq!(
            ConnectResult::decode(0x0003, false),
            ConnectResult::Success {
                cntlid: 3,
                authreq: 0
            }
        );
    }

    #[test]
    fn property_sqes() {
        let s = property_get_sqe(9, reg::CAP, PropSize::Eight);
        let b = s.encode();
        assert_eq!((b[0], b[4], b[40]), (0x7f, 0x04, 1));
        assert_eq!(&b[44..48], &0u32.to_le_bytes());
        let g = PropertyGetCmd::from_sqe(&s);
        assert_eq!(g.size().unwrap(), PropSize::Eight);

        let s = property_set_sqe(10, reg::CC, 0x0046_0001, PropSize::Four);
        let b = s.encode();
        assert_eq!((b[4], b[40]), (0x00, 0));
        assert_eq!(&b[44..48], &0x14u32.to_le_bytes());
        assert_eq!(&b[48..56], &0x0046_0001u64.to_le_bytes());
        assert!(PropSize::from_attrib(2).is_err());
        assert_eq!(disconnect_sqe(3).fctype(), fctype::DISCONNECT);
    }

    #[test]
    fn register_bits() {
        // What nvmet reports: MQES 1023, TO 15, CSS NVM.
        let cap = Cap::new(1023, true, 15, Cap::CSS_NVM, 0, 0);
        assert_eq!(cap.0, 1023 | 1 << 16 | 15 << 24 | 1 << 37);
        assert_eq!(
            (cap.mqes(), cap.cqr(), cap.to(), cap.css()),
            (1023, true, 15, 1)
        );
        assert_eq!(
            (cap.mpsmin(), cap.mpsmax(), cap.dstrd(), cap.crms()),
            (0, 0, 0, 0)
        );
        // Linux host CC: EN | IOSQES 6 | IOCQES 4 = 0x0046_0001.
        let cc = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
        assert_eq!(cc.0, 0x0046_0001);
        assert!(cc.en());
        assert_eq!((cc.iosqes(), cc.iocqes(), cc.shn(), cc.mps()), (6, 4, 0, 0));
        let cc = Cc(0x0046_4001);
        assert_eq!(cc.shn(), Cc::SHN_NORMAL);
        assert_eq!(Csts(Csts::RDY | Csts::SHST_COMPLETE).shst(), 2);
        assert_eq!(version(1, 3, 0), 0x0001_0300);
    }
}
