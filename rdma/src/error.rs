//! The crate's error type: every failing verbs or rdma_cm call is reported with its name and errno.

use std::fmt;

/// A failed verbs / rdma_cm operation, or an argument this crate refused before calling one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The kernel or the machine has no usable RDMA: no `ib_uverbs`/`rdma_ucm`, or no device.
    #[error(
        "no usable RDMA on this machine: {call} failed: {} (load rdma_ucm and ib_uverbs and \
         configure a device, e.g. `rdma link add rxe0 type rxe netdev eth0`)",
        Errno(*errno)
    )]
    NoRdma {
        /// The call that found no RDMA.
        call: &'static str,
        /// Its errno (ENODEV, ENOENT, ENOSYS, ...).
        errno: i32,
    },
    /// A verbs or rdma_cm call failed.
    #[error("{call} failed: {}{}", Errno(*errno), hint(call, *errno))]
    Verbs {
        /// The C function that failed, e.g. `"ibv_reg_mr"`.
        call: &'static str,
        /// The errno it reported.
        errno: i32,
    },
    /// `ibv_post_send`/`ibv_post_recv`/`ibv_post_srq_recv` failed part-way through a list:
    /// the first `posted` work requests of the list were posted and will complete.
    #[error("{call} failed after posting {posted} work request(s): {}", Errno(*errno))]
    Post {
        /// The C function that failed.
        call: &'static str,
        /// The errno it returned.
        errno: i32,
        /// How many work requests from the start of the list were posted anyway.
        posted: usize,
    },
    /// A byte range does not lie inside a memory region.
    #[error("range at offset {offset} of {len} bytes is outside the {region_len}-byte region")]
    OutOfBounds {
        /// Requested offset.
        offset: usize,
        /// Requested length.
        len: usize,
        /// Length of the region.
        region_len: usize,
    },
    /// An argument was refused before any verbs call was made.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No RDMA device has this name.
    #[error("no RDMA device named {0:?}")]
    NoSuchDevice(String),
}

impl Error {
    /// The errno behind this error, when it came from a failed call.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::NoRdma { errno, .. }
            | Error::Verbs { errno, .. }
            | Error::Post { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Displays an errno as `strerror (ENAME n)`.
struct Errno(i32);

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let io = std::io::Error::from_raw_os_error(self.0);
        // io::Error's Display is "message (os error N)".
        write!(f, "{io}")
    }
}

fn hint(call: &str, errno: i32) -> &'static str {
    match (call, errno) {
        ("ibv_reg_mr", libc::ENOMEM) => {
            " (registered memory is pinned: is RLIMIT_MEMLOCK, `ulimit -l`, large enough?)"
        }
        ("ibv_reg_mr", libc::EINVAL) => " (REMOTE_WRITE needs LOCAL_WRITE; is the range valid?)",
        ("rdma_bind_addr", libc::EADDRNOTAVAIL) | ("rdma_bind_addr", libc::ENODEV) => {
            " (is the address configured on an RDMA-capable netdev?)"
        }
        _ => "",
    }
}

/// The calling thread's errno.
pub(crate) fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `Err(Verbs)` from the thread's errno, for calls returning -1/NULL and setting errno.
pub(crate) fn from_errno(call: &'static str) -> Error {
    Error::Verbs {
        call,
        errno: last_errno(),
    }
}

/// Checks a call that returns 0 or -1 with errno set (rdma_cm, `ibv_get_*_event`).
pub(crate) fn check_minus1(call: &'static str, ret: libc::c_int) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(from_errno(call))
    }
}

/// Checks a call that returns 0 or a positive errno (most `ibv_*` calls).
///
/// Some providers return -1 with errno set instead; that case is mapped through errno.
pub(crate) fn check_ret(call: &'static str, ret: libc::c_int) -> Result<()> {
    match ret {
        0 => Ok(()),
        r if r > 0 => Err(Error::Verbs { call, errno: r }),
        r => {
            let e = last_errno();
            Err(Error::Verbs {
                call,
                errno: if e != 0 { e } else { -r },
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_call_and_errno() {
        let e = Error::Verbs {
            call: "ibv_reg_mr",
            errno: libc::ENOMEM,
        };
        let s = e.to_string();
        assert!(s.starts_with("ibv_reg_mr failed: "), "{s}");
        assert!(s.contains("os error 12"), "{s}");
        assert!(s.contains("ulimit -l"), "{s}");
        assert_eq!(e.errno(), Some(libc::ENOMEM));
        let e = Error::NoRdma {
            call: "rdma_create_event_channel",
            errno: libc::ENODEV,
        };
        assert!(e.to_string().contains("rdma_create_event_channel failed"));
        assert_eq!(Error::InvalidArgument("x".into()).errno(), None);
    }

    #[test]
    fn check_ret_maps_positive_and_negative() {
        assert!(check_ret("f", 0).is_ok());
        match check_ret("f", libc::EINVAL) {
            Err(Error::Verbs { call: "f", errno }) => assert_eq!(errno, libc::EINVAL),
            other => panic!("{other:?}"),
        }
    }
}
