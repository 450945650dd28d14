//! SGL descriptors (NVMe Base 2.0, 4.3.2) as NVMe-oF transports use them.
//!
//! The 16-byte descriptor sits in SQE bytes 24..40 (`dptr`). The last byte is
//! `type << 4 | subtype`. What each transport sends:
//! - NVMe/TCP: `0x01` (Data Block, Offset: in-capsule data at `addr` = offset) or `0x5A`
//!   (Transport Data Block, subtype 0xA: data moves by R2T/H2CData or C2HData).
//! - NVMe/RDMA: `0x40` (Keyed Data Block, Address), `0x4F` (Keyed, Invalidate Key: the host
//!   asks for SEND_WITH_INVALIDATE), or `0x01` for in-capsule data.

use crate::DecodeError;

/// SGL descriptor type byte values (`type << 4 | subtype`).
pub mod kind {
    /// Data Block, Address subtype.
    pub const DATA_BLOCK: u8 = 0x00;
    /// Data Block, Offset subtype: in-capsule data (NVMe-oF 1.1, 2.3.1).
    pub const DATA_BLOCK_OFFSET: u8 = 0x01;
    /// Segment / Last Segment (not supported by fabrics targets here).
    pub const SEGMENT: u8 = 0x20;
    pub const LAST_SEGMENT: u8 = 0x30;
    /// Keyed Data Block, Address.
    pub const KEYED_DATA_BLOCK: u8 = 0x40;
    /// Keyed Data Block, Invalidate Key.
    pub const KEYED_DATA_BLOCK_INVALIDATE: u8 = 0x4f;
    /// Transport SGL Data Block, transport-specific subtype 0xA (NVMe/TCP 1.0, 3.3).
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5a;
}

/// A decoded data SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sgl {
    /// Data Block with an address (not meaningful across a fabric: rejected by targets).
    DataBlock { addr: u64, len: u32 },
    /// In-capsule data starting `offset` bytes into the capsule's data area.
    InCapsule { offset: u64, len: u32 },
    /// Keyed remote memory (RDMA): `addr`, 24-bit `len`, `key`; `invalidate` when the host asks
    /// for the key to be invalidated with the response.
    Keyed {
        addr: u64,
        len: u32,
        key: u32,
        invalidate: bool,
    },
    /// Transport data block (NVMe/TCP): data moves by the transport's own PDUs.
    Transport { len: u32 },
}

impl Sgl {
    /// Decode a descriptor. Unknown or unsupported types are errors naming the type byte.
    pub fn decode(d: &[u8; 16]) -> Result<Sgl, DecodeError> {
        let addr = u64::from_le_bytes(d[0..8].try_into().expect("8 bytes"));
        let len32 = u32::from_le_bytes(d[8..12].try_into().expect("4 bytes"));
        match d[15] {
            kind::DATA_BLOCK => Ok(Sgl::DataBlock { addr, len: len32 }),
            kind::DATA_BLOCK_OFFSET => Ok(Sgl::InCapsule {
                offset: addr,
                len: len32,
            }),
            t @ (kind::KEYED_DATA_BLOCK | kind::KEYED_DATA_BLOCK_INVALIDATE) => Ok(Sgl::Keyed {
                addr,
                len: u32::from_le_bytes([d[8], d[9], d[10], 0]),
                key: u32::from_le_bytes(d[11..15].try_into().expect("4 bytes")),
                invalidate: t == kind::KEYED_DATA_BLOCK_INVALIDATE,
            }),
            kind::TRANSPORT_DATA_BLOCK => Ok(Sgl::Transport { len: len32 }),
            t => Err(DecodeError::Invalid {
                field: "SGL descriptor type",
                value: t as u64,
            }),
        }
    }

    /// Encode a descriptor into the 16 `dptr` bytes.
    ///
    /// # Panics
    /// A keyed length above 24 bits is a caller bug (the caller sizes transfers below MDTS).
    pub fn encode(&self) -> [u8; 16] {
        let mut d = [0u8; 16];
        match *self {
            Sgl::DataBlock { addr, len } => {
                d[0..8].copy_from_slice(&addr.to_le_bytes());
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[15] = kind::DATA_BLOCK;
            }
            Sgl::InCapsule { offset, len } => {
                d[0..8].copy_from_slice(&offset.to_le_bytes());
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[15] = kind::DATA_BLOCK_OFFSET;
            }
            Sgl::Keyed {
                addr,
                len,
                key,
                invalidate,
            } => {
                assert!(len < 1 << 24, "keyed SGL length {len} exceeds 24 bits");
                d[0..8].copy_from_slice(&addr.to_le_bytes());
                d[8..11].copy_from_slice(&len.to_le_bytes()[0..3]);
                d[11..15].copy_from_slice(&key.to_le_bytes());
                d[15] = if invalidate {
                    kind::KEYED_DATA_BLOCK_INVALIDATE
                } else {
                    kind::KEYED_DATA_BLOCK
                };
            }
            Sgl::Transport { len } => {
                d[8..12].copy_from_slice(&len.to_le_bytes());
                d[15] = kind::TRANSPORT_DATA_BLOCK;
            }
        }
        d
    }

    /// Length in bytes the descriptor describes.
    pub fn len(&self) -> u32 {
        match *self {
            Sgl::DataBlock { len, .. }
            | Sgl::InCapsule { len, .. }
            | Sgl::Keyed { len, .. }
            | Sgl::Transport { len } => len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn linux_rdma_keyed_invalidate_bytes() {
        // nvme_rdma_map_sg_fr: addr, put_unaligned_le24(length), put_unaligned_le32(key),
        // type = (NVME_KEY_SGL_FMT_DATA_DESC << 4) | NVME_SGL_FMT_INVALIDATE = 0x4f.
        let d: [u8; 16] = [
            0x00, 0x10, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // addr 0x1_0000_1000
            0x00, 0x20, 0x00, // len 0x2000
            0x78, 0x56, 0x34, 0x12, // key
            0x4f,
        ];
        let s = Sgl::decode(&d).unwrap();
        assert_eq!(
            s,
            Sgl::Keyed {
                addr: 0x1_0000_1000,
                len: 0x2000,
                key: 0x1234_5678,
                invalidate: true
            }
        );
        assert_eq!(s.encode(), d);
    }

    #[test]
    fn tcp_descriptors() {
        let mut d = [0u8; 16];
        d[8..12].copy_from_slice(&4096u32.to_le_bytes());
        d[15] = 0x5a;
        assert_eq!(Sgl::decode(&d).unwrap(), Sgl::Transport { len: 4096 });
        d[15] = 0x01;
        assert_eq!(
            Sgl::decode(&d).unwrap(),
            Sgl::InCapsule {
                offset: 0,
                len: 4096
            }
        );
        d[15] = 0x20;
        assert!(Sgl::decode(&d).is_err());
    }

    proptest! {
        #[test]
        fn round_trip(addr: u64, len in 0u32..(1 << 24), key: u32, inv: bool, which in 0u8..4) {
            let s = match which {
                0 => Sgl::DataBlock { addr, len },
                1 => Sgl::InCapsule { offset: addr, len },
                2 => Sgl::Keyed { addr, len, key, invalidate: inv },
                _ => Sgl::Transport { len },
            };
            prop_assert_eq!(Sgl::decode(&s.encode()).unwrap(), s);
        }
    }
}
