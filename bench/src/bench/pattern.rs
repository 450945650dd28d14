//! Offsets and data: a keyed permutation of a job's blocks (random workloads visit every block
//! once per pass, like fio's random map, without a map), a small PRNG, and the `--verify`
//! block format.
//!
//! # Verify block format
//! Every I/O block (bs bytes) written with `--verify=crc32c` starts with a 40-byte header
//! ([`VerifyHeader`], little endian), followed by pseudo-random bytes derived from
//! (seed, offset, generation). The CRC32C covers the header's first 36 bytes and everything
//! after the header, so a flipped bit anywhere in the block is caught, and the header names
//! the offset it was written for, so a block landing at the wrong LBA is caught too.

use std::fmt;

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// splitmix64 (Steele, Lea, Flood 2014): a good 64-bit mixer and seed expander.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xorshift64* PRNG: tiny, fast, no allocation; never seeded with 0.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(splitmix64(seed) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..100`.
    pub fn percent(&mut self) -> u8 {
        (((self.next_u64() >> 32) * 100) >> 32) as u8
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// A keyed bijection of `0..n` (a 4-round Feistel network on the next even power of two, with
/// cycle walking back into range): `get(i)` for `i` in `0..n` visits every value once.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    pub fn new(n: u64, key: u64) -> Permutation {
        assert!(n > 0, "permutation of an empty range");
        let bits = (64 - (n - 1).leading_zeros()).max(2);
        let half_bits = bits.div_ceil(2);
        let mut k = key;
        let keys = [0; 4].map(|_| {
            k = splitmix64(k);
            k
        });
        Permutation { n, half_bits, keys }
    }

    fn round(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for k in self.keys {
            let f = splitmix64(r ^ k) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half_bits) | r
    }

    /// The `i`-th value (`i < n`).
    pub fn get(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        // The domain is at most 4n, so this takes about 4 rounds at worst on average.
        let mut x = self.round(i);
        while x >= self.n {
            x = self.round(x);
        }
        x
    }
}

/// "NVBV": nvmf-bench verify.
pub const MAGIC: u32 = 0x5642_564e;
const VERSION: u16 = 1;
/// Bytes of [`VerifyHeader`].
pub const HEADER_LEN: usize = 40;
/// Offset of the CRC field (the CRC covers the bytes before it and after the header).
const CRC_AT: usize = 36;

/// Header at the start of every verify block.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct VerifyHeader {
    /// [`MAGIC`].
    pub magic: U32,
    /// Format version (1).
    pub version: U16,
    /// Header length in bytes (40).
    pub hdr_len: U16,
    /// Block length in bytes (the I/O size it was written with).
    pub len: U32,
    /// Reserved, zero.
    pub rsvd: U32,
    /// Namespace byte offset the block was written to.
    pub offset: U64,
    /// Seed of the run that wrote it.
    pub seed: U64,
    /// Write sequence number of the job that wrote it (starts at 1).
    pub generation: U32,
    /// CRC32C of bytes 0..36 and of the bytes after the header.
    pub crc: U32,
}

const _: () = assert!(size_of::<VerifyHeader>() == HEADER_LEN);
const _: () = assert!(std::mem::offset_of!(VerifyHeader, crc) == CRC_AT);

fn block_crc(block: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&block[..CRC_AT]), &block[HEADER_LEN..])
}

fn data_rng(seed: u64, offset: u64, generation: u32) -> Rng {
    Rng::new(seed ^ splitmix64(offset) ^ (u64::from(generation) << 17))
}

/// Fill `block` (at least [`HEADER_LEN`] bytes) as written to `offset` by write number
/// `generation` of a run with `seed`.
pub fn fill_block(block: &mut [u8], offset: u64, seed: u64, generation: u32) {
    let len = block.len();
    let (hdr, data) = block.split_at_mut(HEADER_LEN);
    data_rng(seed, offset, generation).fill(data);
    let h = VerifyHeader {
        magic: MAGIC.into(),
        version: VERSION.into(),
        hdr_len: (HEADER_LEN as u16).into(),
        len: (len as u32).into(),
        rsvd: 0.into(),
        offset: offset.into(),
        seed: seed.into(),
        generation: generation.into(),
        crc: 0.into(),
    };
    hdr.copy_from_slice(h.as_bytes());
    let crc = block_crc(block);
    block[CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
}

/// Why a block failed verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// No verify header (never written with --verify, or the header is destroyed).
    NoHeader { magic: u32 },
    /// A header, but for a different offset (misdirected write or read).
    WrongOffset { found: u64 },
    /// A header for a different block size.
    WrongLength { found: u32 },
    /// Header and data disagree with the CRC: the block changed after it was written.
    /// `first_bad` is the first byte differing from what the header describes.
    Crc {
        stored: u32,
        computed: u32,
        first_bad: Option<usize>,
    },
    /// Intact, but an older write than the one this run completed last (a lost write).
    Stale { expected: u32, found: u32 },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::NoHeader { magic } => write!(
                f,
                "no verify header (magic {magic:#010x}; block never written with --verify?)"
            ),
            Mismatch::WrongOffset { found } => {
                write!(f, "header names offset {found} ({found:#x})")
            }
            Mismatch::WrongLength { found } => write!(f, "header names block length {found}"),
            Mismatch::Crc {
                stored,
                computed,
                first_bad,
            } => {
                write!(
                    f,
                    "crc32c mismatch (stored {stored:#010x}, computed {computed:#010x})"
                )?;
                if let Some(b) = first_bad {
                    write!(f, ", first bad byte at block offset {b}")?;
                }
                Ok(())
            }
            Mismatch::Stale { expected, found } => write!(
                f,
                "stale data: generation {found}, expected {expected} (lost write)"
            ),
        }
    }
}

/// Check a block read from `offset`. `expected_generation` is the last write this run
/// completed there, if any. `scratch` (same length as `block`) is used to locate the first bad
/// byte after a CRC mismatch.
pub fn check_block(
    block: &[u8],
    offset: u64,
    expected_generation: Option<u32>,
    scratch: &mut [u8],
) -> Result<(), Mismatch> {
    let (h, _) = VerifyHeader::read_from_prefix(block).expect("block holds a header");
    if h.magic.get() != MAGIC || h.hdr_len.get() as usize != HEADER_LEN {
        return Err(Mismatch::NoHeader {
            magic: h.magic.get(),
        });
    }
    let computed = block_crc(block);
    if computed != h.crc.get() {
        // Regenerate what the header describes to point at the damage.
        let scratch = &mut scratch[..block.len()];
        fill_block(scratch, h.offset.get(), h.seed.get(), h.generation.get());
        scratch[CRC_AT..HEADER_LEN].copy_from_slice(&h.crc.get().to_le_bytes());
        let first_bad = block.iter().zip(scratch.iter()).position(|(a, b)| a != b);
        return Err(Mismatch::Crc {
            stored: h.crc.get(),
            computed,
            first_bad,
        });
    }
    if h.offset.get() != offset {
        return Err(Mismatch::WrongOffset {
            found: h.offset.get(),
        });
    }
    if h.len.get() as usize != block.len() {
        return Err(Mismatch::WrongLength { found: h.len.get() });
    }
    match expected_generation {
        Some(g) if g != h.generation.get() => Err(Mismatch::Stale {
            expected: g,
            found: h.generation.get(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_visits_every_value_once() {
        for n in [1u64, 2, 3, 7, 64, 1000, 4097] {
            for key in [0u64, 1, 0xdead_beef] {
                let p = Permutation::new(n, key);
                let mut seen = vec![false; n as usize];
                for i in 0..n {
                    let v = p.get(i);
                    assert!(v < n);
                    assert!(!seen[v as usize], "n={n} key={key}: {v} twice");
                    seen[v as usize] = true;
                }
            }
        }
        // Not the identity.
        let p = Permutation::new(1 << 16, 7);
        assert!((0..100).filter(|&i| p.get(i) == i).count() < 5);
    }

    #[test]
    fn verify_round_trip_and_every_corruption_is_named() {
        let mut scratch = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        fill_block(&mut b, 8192, 42, 3);
        assert_eq!(check_block(&b, 8192, None, &mut scratch), Ok(()));
        assert_eq!(check_block(&b, 8192, Some(3), &mut scratch), Ok(()));
        assert_eq!(
            check_block(&b, 8192, Some(4), &mut scratch),
            Err(Mismatch::Stale {
                expected: 4,
                found: 3
            })
        );
        assert_eq!(
            check_block(&b, 4096, None, &mut scratch),
            Err(Mismatch::WrongOffset { found: 8192 })
        );
        // A flipped data byte: CRC mismatch, located.
        let mut c = b.clone();
        c[1000] ^= 0x10;
        match check_block(&c, 8192, None, &mut scratch) {
            Err(Mismatch::Crc { first_bad, .. }) => assert_eq!(first_bad, Some(1000)),
            other => panic!("{other:?}"),
        }
        // A flipped header byte (the generation) is caught by the CRC too.
        let mut c = b.clone();
        c[32] ^= 1;
        assert!(matches!(
            check_block(&c, 8192, None, &mut scratch),
            Err(Mismatch::Crc { .. })
        ));
        // Zeroes: no header.
        assert_eq!(
            check_block(&[0u8; 4096], 0, None, &mut scratch),
            Err(Mismatch::NoHeader { magic: 0 })
        );
        // Different generations and offsets give different data.
        let mut d = vec![0u8; 4096];
        fill_block(&mut d, 8192, 42, 4);
        assert_ne!(b[HEADER_LEN..], d[HEADER_LEN..]);
    }

    #[test]
    fn rng_percent_is_in_range_and_roughly_uniform() {
        let mut r = Rng::new(1);
        let mut below = 0;
        for _ in 0..10_000 {
            let p = r.percent();
            assert!(p < 100);
            if p < 30 {
                below += 1;
            }
        }
        assert!((2700..3300).contains(&below), "{below}");
    }
}
