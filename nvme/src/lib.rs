//! NVMe and NVMe over Fabrics wire formats and protocol helpers.
//!
//! This crate is sans-I/O: it holds no sockets, no threads, no clock and no libc. Bytes go in,
//! typed values come out. Decoding is fallible (`decode(&[u8]) -> Result<T, DecodeError>`),
//! encoding is infallible. Every wire struct is a `zerocopy` type whose size (and the offsets
//! that matter) are asserted at compile time against the NVMe Base / NVMe-oF / NVMe-TCP specs.
#![forbid(unsafe_code)]

pub mod auth;
pub mod cmd;
pub mod fabrics;
pub mod identify;
pub mod log;
pub mod opcode;
pub mod rdma;
pub mod resv;
pub mod sgl;
pub mod status;
pub mod tcp;
pub mod tls;

pub use cmd::{Cqe, Sqe};
pub use status::Status;

/// Why bytes could not be decoded into a wire value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the structure needs.
    #[error("short buffer: need {need} bytes, have {have}")]
    Short { need: usize, have: usize },
    /// A field holds a value the spec does not allow here.
    #[error("invalid {field}: {value:#x}")]
    Invalid { field: &'static str, value: u64 },
    /// A digest (CRC32C) did not match.
    #[error("{which} digest mismatch: expected {expected:#010x}, got {got:#010x}")]
    Digest {
        which: &'static str,
        expected: u32,
        got: u32,
    },
}

/// The well-known NQN of a discovery controller (NVMe-oF 1.1, 7.1).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Admin queue depth the Linux host uses (NVME_AQ_DEPTH).
pub const LINUX_AQ_DEPTH: u16 = 32;
