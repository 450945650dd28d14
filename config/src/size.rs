//! Byte sizes written with units (`4KiB`, `1GiB`, `1000000`, `10GB`).

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// A size in bytes.
///
/// In YAML a size is either a plain integer (bytes) or a string made of a whole number, optional
/// blanks, and a unit. Units are case-insensitive:
///
/// | unit                         | factor          |
/// |------------------------------|-----------------|
/// | (none), `B`                  | 1               |
/// | `K`, `KiB`                   | 1024            |
/// | `M`, `MiB`                   | 1024²           |
/// | `G`, `GiB`                   | 1024³           |
/// | `T`, `TiB`                   | 1024⁴           |
/// | `KB`, `MB`, `GB`, `TB`       | 1000, 1000², 1000³, 1000⁴ |
///
/// The convention follows dd(1) and IEC 80000-13: a bare letter or an `iB` suffix is a power of
/// two, a `B` suffix after the letter is a power of ten. Fractions (`1.5GiB`) are not accepted.
///
/// A size prints in the largest binary unit that divides it exactly (`4KiB`, `1GiB`), or as
/// plain bytes otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Size(pub u64);

/// Why a size string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SizeError(String);

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

impl Size {
    /// `n` KiB.
    pub const fn kib(n: u64) -> Size {
        Size(n * KIB)
    }
    /// `n` MiB.
    pub const fn mib(n: u64) -> Size {
        Size(n * MIB)
    }
    /// `n` GiB.
    pub const fn gib(n: u64) -> Size {
        Size(n * GIB)
    }
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for Size {
    type Err = SizeError;

    fn from_str(text: &str) -> Result<Size, SizeError> {
        let s = text.trim();
        let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (number, rest) = s.split_at(digits_end);
        if number.is_empty() {
            return Err(SizeError(format!(
                "`{text}` is not a size: expected a whole number of bytes or a number with a unit \
                 (512, 4KiB, 1GiB, 10GB)"
            )));
        }
        let unit = rest.trim_start();
        if unit.starts_with(['.', ',']) {
            return Err(SizeError(format!(
                "`{text}`: fractional sizes are not accepted; use a smaller unit (e.g. 1536MiB)"
            )));
        }
        let factor = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => KIB,
            "m" | "mib" => MIB,
            "g" | "gib" => GIB,
            "t" | "tib" => TIB,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => {
                return Err(SizeError(format!(
                    "`{text}`: unknown size unit `{unit}` (use B, KiB, MiB, GiB, TiB, K, M, G, T, \
                     KB, MB, GB or TB)"
                )))
            }
        };
        let too_large = || SizeError(format!("`{text}` is too large (the limit is 2^64-1 bytes)"));
        let n: u64 = number.parse().map_err(|_| too_large())?;
        n.checked_mul(factor).map(Size).ok_or_else(too_large)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (factor, unit) in [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
            if n != 0 && n % factor == 0 {
                return write!(f, "{}{unit}", n / factor);
            }
        }
        write!(f, "{n}")
    }
}

impl Serialize for Size {
    /// Exact binary units as a string (`"4KiB"`), anything else as an integer number of bytes.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0 != 0 && self.0 % KIB == 0 {
            serializer.collect_str(self)
        } else {
            serializer.serialize_u64(self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("512", 512),
            ("512B", 512),
            ("4KiB", 4096),
            ("4kib", 4096),
            ("4K", 4096),
            ("4 KiB", 4096),
            (" 8KiB ", 8192),
            ("1MiB", 1 << 20),
            ("1M", 1 << 20),
            ("1GiB", 1 << 30),
            ("1g", 1 << 30),
            ("1TiB", 1 << 40),
            ("2T", 2 << 40),
            ("1KB", 1000),
            ("1MB", 1_000_000),
            ("10GB", 10_000_000_000),
            ("1TB", 1_000_000_000_000),
            ("16777215TiB", 16_777_215 << 40),
        ];
        for &(text, bytes) in cases {
            assert_eq!(text.parse::<Size>(), Ok(Size(bytes)), "{text}");
        }
    }

    #[test]
    fn rejects_bad_sizes() {
        let cases: &[(&str, &str)] = &[
            ("", "is not a size"),
            ("KiB", "is not a size"),
            ("-1", "is not a size"),
            ("1.5GiB", "fractional"),
            ("4 KiBs", "unknown size unit `KiBs`"),
            ("4Kb/s", "unknown size unit"),
            ("1 2", "unknown size unit `2`"),
            ("16777216TiB", "too large"),
            ("99999999999999999999", "too large"),
        ];
        for &(text, fragment) in cases {
            let err = text.parse::<Size>().unwrap_err().to_string();
            assert!(err.contains(fragment), "{text}: {err}");
        }
    }

    #[test]
    fn displays_largest_exact_binary_unit() {
        assert_eq!(Size(0).to_string(), "0");
        assert_eq!(Size(512).to_string(), "512");
        assert_eq!(Size(4096).to_string(), "4KiB");
        assert_eq!(Size(1536 * 1024).to_string(), "1536KiB");
        assert_eq!(Size::gib(1).to_string(), "1GiB");
        assert_eq!(Size(3 << 40).to_string(), "3TiB");
        assert_eq!(Size(1_000_000).to_string(), "1000000");
        for n in [0, 1, 512, 4096, 1000, 1 << 20, 5 << 30, 7 << 40, u64::MAX] {
            assert_eq!(Size(n).to_string().parse::<Size>(), Ok(Size(n)));
        }
    }
}
