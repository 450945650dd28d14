//! Submission and completion queue entries (NVMe Base 2.0, 4.2 and 4.6).

use core::mem::{offset_of, size_of};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::{DecodeError, Status};

/// A 64-byte submission queue entry (NVMe Base 2.0 Figure 88, common command format).
///
/// Fabrics commands reuse the same 64 bytes with `fctype` in byte 4 (NVMe-oF 1.1 Figure 10);
/// see [`Sqe::fctype`] and [`crate::fabrics`].
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Sqe {
    /// CDW0 bits 7:0: opcode.
    pub opcode: u8,
    /// CDW0 bits 15:8: FUSE (1:0) and PSDT (7:6). PSDT 01b means SGLs (0x40).
    pub flags: u8,
    /// CDW0 bits 31:16: command identifier.
    pub cid: U16,
    /// Namespace identifier (Fabrics: byte 4 is `fctype`).
    pub nsid: U32,
    pub cdw2: U32,
    pub cdw3: U32,
    /// Metadata pointer.
    pub mptr: U64,
    /// Data pointer: PRP1/PRP2, or one SGL descriptor (16 bytes).
    pub dptr: [u8; 16],
    pub cdw10: U32,
    pub cdw11: U32,
    pub cdw12: U32,
    pub cdw13: U32,
    pub cdw14: U32,
    pub cdw15: U32,
}

const _: () = assert!(size_of::<Sqe>() == 64);
const _: () = assert!(offset_of!(Sqe, cid) == 2);
const _: () = assert!(offset_of!(Sqe, nsid) == 4);
const _: () = assert!(offset_of!(Sqe, mptr) == 16);
const _: () = assert!(offset_of!(Sqe, dptr) == 24);
const _: () = assert!(offset_of!(Sqe, cdw10) == 40);
const _: () = assert!(offset_of!(Sqe, cdw15) == 60);

/// PSDT = 01b: "SGLs are used for this transfer" (SQE byte 1 = 0x40). Required by NVMe-oF.
pub const PSDT_SGL: u8 = 0x40;
/// The PSDT field mask in [`Sqe::flags`].
pub const PSDT_MASK: u8 = 0xc0;
/// The FUSE field mask in [`Sqe::flags`].
pub const FUSE_MASK: u8 = 0x03;
/// FUSE = 01b: the first command of a fused operation (Compare, for Compare and Write).
pub const FUSE_FIRST: u8 = 0x01;
/// FUSE = 10b: the second command of a fused operation (Write, for Compare and Write).
pub const FUSE_SECOND: u8 = 0x02;

impl Sqe {
    pub const SIZE: usize = 64;

    /// Decode the first 64 bytes of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Sqe, DecodeError> {
        Sqe::read_from_prefix(buf)
            .map(|(s, _)| s)
            .map_err(|_| DecodeError::Short {
                need: Self::SIZE,
                have: buf.len(),
            })
    }

    /// Borrow the first 64 bytes of `buf` as an SQE without copying.
    pub fn view(buf: &[u8]) -> Result<&Sqe, DecodeError> {
        Sqe::ref_from_prefix(buf)
            .map(|(s, _)| s)
            .map_err(|_| DecodeError::Short {
                need: Self::SIZE,
                have: buf.len(),
            })
    }

    pub fn encode(&self) -> [u8; 64] {
        let mut out = [0u8; 64];
        out.copy_from_slice(self.as_bytes());
        out
    }

    pub fn cid(&self) -> u16 {
        self.cid.get()
    }

    /// Fabrics command type (byte 4), meaningful when `opcode == 0x7f`.
    pub fn fctype(&self) -> u8 {
        self.nsid.as_bytes()[0]
    }

    pub fn is_fabrics(&self) -> bool {
        self.opcode == crate::opcode::FABRICS
    }

    /// Whether the PSDT field says SGL (NVMe-oF requires it on every command).
    pub fn uses_sgl(&self) -> bool {
        self.flags & PSDT_MASK == PSDT_SGL
    }

    /// Starting LBA of an NVM Read/Write/Write Zeroes/Compare (CDW10-11).
    pub fn slba(&self) -> u64 {
        (self.cdw11.get() as u64) << 32 | self.cdw10.get() as u64
    }

    /// Number of logical blocks, 1's based (CDW12 bits 15:0 are 0's based).
    pub fn nlb(&self) -> u32 {
        (self.cdw12.get() & 0xffff) + 1
    }

    /// A new SQE with opcode and cid set and PSDT = SGL, everything else zero.
    pub fn new(opcode: u8, cid: u16) -> Sqe {
        Sqe {
            opcode,
            flags: PSDT_SGL,
            cid: cid.into(),
            ..Default::default()
        }
    }
}

impl core::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &format_args!("{:#04x}", self.opcode))
            .field("flags", &format_args!("{:#04x}", self.flags))
            .field("cid", &self.cid.get())
            .field("nsid", &self.nsid.get())
            .field("dptr", &format_args!("{:02x?}", self.dptr))
            .field("cdw10", &format_args!("{:#x}", self.cdw10.get()))
            .field("cdw11", &format_args!("{:#x}", self.cdw11.get()))
            .field("cdw12", &format_args!("{:#x}", self.cdw12.get()))
            .finish()
    }
}

/// A 16-byte completion queue entry (NVMe Base 2.0 Figure 89).
#[derive(
    Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct Cqe {
    /// DW0-DW1: command specific result (Fabrics Connect: cntlid in bits 15:0; Property Get:
    /// the value).
    pub result: U64,
    /// SQ head pointer.
    pub sq_head: U16,
    /// SQ identifier.
    pub sq_id: U16,
    /// Command identifier.
    pub cid: U16,
    /// Phase tag (bit 0) and status field (bits 15:1).
    pub status: U16,
}

const _: () = assert!(size_of::<Cqe>() == 16);
const _: () = assert!(offset_of!(Cqe, sq_head) == 8);
const _: () = assert!(offset_of!(Cqe, cid) == 12);
const _: () = assert!(offset_of!(Cqe, status) == 14);

impl Cqe {
    pub const SIZE: usize = 16;

    pub fn new(cid: u16, status: Status, result: u64) -> Cqe {
        Cqe {
            result: result.into(),
            sq_head: 0.into(),
            sq_id: 0.into(),
            cid: cid.into(),
            status: status.to_cqe_field(false).into(),
        }
    }

    pub fn decode(buf: &[u8]) -> Result<Cqe, DecodeError> {
        Cqe::read_from_prefix(buf)
            .map(|(c, _)| c)
            .map_err(|_| DecodeError::Short {
                need: Self::SIZE,
                have: buf.len(),
            })
    }

    pub fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out.copy_from_slice(self.as_bytes());
        out
    }

    pub fn status(&self) -> Status {
        Status::from_cqe_field(self.status.get())
    }

    pub fn cid(&self) -> u16 {
        self.cid.get()
    }
}

impl core::fmt::Debug for Cqe {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cqe")
            .field("cid", &self.cid.get())
            .field("status", &self.status())
            .field("result", &format_args!("{:#x}", self.result.get()))
            .field("sq_head", &self.sq_head.get())
            .field("sq_id", &self.sq_id.get())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_read_fields_from_bytes() {
        // A Linux host Read: opcode 0x02, PSDT SGL, cid 0x1234, nsid 1, SLBA 0x1_0000_0010,
        // NLB 8 (0's based 7).
        let mut b = [0u8; 64];
        b[0] = 0x02;
        b[1] = 0x40;
        b[2..4].copy_from_slice(&0x1234u16.to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[40..44].copy_from_slice(&0x10u32.to_le_bytes());
        b[44..48].copy_from_slice(&1u32.to_le_bytes());
        b[48..52].copy_from_slice(&7u32.to_le_bytes());
        let s = Sqe::decode(&b).unwrap();
        assert_eq!(s.opcode, 2);
        assert!(s.uses_sgl());
        assert_eq!(s.cid(), 0x1234);
        assert_eq!(s.nsid.get(), 1);
        assert_eq!(s.slba(), 0x1_0000_0010);
        assert_eq!(s.nlb(), 8);
        assert_eq!(s.encode(), b);
        assert!(matches!(
            Sqe::decode(&b[..63]),
            Err(DecodeError::Short { need: 64, have: 63 })
        ));
    }

    #[test]
    fn fabrics_fctype_is_byte_4() {
        let mut b = [0u8; 64];
        b[0] = 0x7f;
        b[4] = 0x01;
        let s = Sqe::decode(&b).unwrap();
        assert!(s.is_fabrics());
        assert_eq!(s.fctype(), 0x01);
    }

    #[test]
    fn cqe_layout() {
        let mut c = Cqe::new(7, Status::LBA_RANGE.dnr(), 0xabcd);
        c.sq_head = 5.into();
        c.sq_id = 1.into();
        let b = c.encode();
        assert_eq!(&b[0..8], &0xabcdu64.to_le_bytes());
        assert_eq!(&b[8..10], &5u16.to_le_bytes());
        assert_eq!(&b[10..12], &1u16.to_le_bytes());
        assert_eq!(&b[12..14], &7u16.to_le_bytes());
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), (0x4080 << 1));
        assert_eq!(Cqe::decode(&b).unwrap(), c);
        assert_eq!(c.status(), Status::LBA_RANGE.dnr());
    }
}
