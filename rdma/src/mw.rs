//! Type 2 memory windows: a remote key for one range of a region, bound by a work request on
//! the send queue and invalidated by the peer (SEND_WITH_INV) or locally (LOCAL_INV).
//!
//! This is how a userspace host can bound a target's access to one I/O, as the kernel host does
//! with fast registration: the region is registered for local access and `MW_BIND` only, and
//! each I/O binds a window over its buffer with a fresh key (the low 8 bits rotate), which the
//! target invalidates with its response. Once invalidated, the key no longer opens anything.

use std::sync::Arc;

use rdma_sys::*;

use crate::error::{from_errno, Error, Result};
use crate::mr::{AccessFlags, Mr, Pd};

/// A type 2 memory window (`ibv_alloc_mw(IBV_MW_TYPE_2)`), bound with [`crate::Qp::post_bind_send`].
///
/// Send but not Sync: a successful bind post records the window's new key in the `ibv_mw`
/// struct (rxe looks the window up by the key the struct holds and refuses a stale one), so
/// one thread owns it, like the QP it is bound on.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<nvmf_rdma::Mw>(); // a window is owned by the queue that binds it
/// ```
pub struct Mw {
    pub(crate) raw: *mut ibv_mw,
    pd: Arc<Pd>,
}

// SAFETY: the window handle is a kernel object and its struct is only touched by the owning
// thread (binding through a QP's post, the key update after it); deallocation happens once, in
// Drop.
unsafe impl Send for Mw {}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

impl Mw {
    /// Allocates a type 2 window on `pd` (unbound: its key opens nothing yet). Fails with
    /// `EOPNOTSUPP` where the provider has no windows (siw).
    pub fn alloc(pd: &Arc<Pd>) -> Result<Mw> {
        // SAFETY: pd.raw is a live PD kept alive by the Arc stored in the window.
        let raw = unsafe { ibv_alloc_mw(pd.raw, ibv_mw_type::IBV_MW_TYPE_2) };
        let raw = match raw {
            Some(p) if !p.is_null() => p,
            _ => return Err(from_errno("ibv_alloc_mw")),
        };
        Ok(Mw {
            raw,
            pd: pd.clone(),
        })
    }

    /// The window's current key: the one it was allocated with, then the key of its last bind
    /// posted. Each bind names a key with the same upper 24 bits and new low 8 bits
    /// ([`next_rkey`]).
    pub fn rkey(&self) -> u32 {
        // SAFETY: raw is the live window; only this thread touches its struct (not Sync).
        unsafe { (*self.raw).rkey }
    }

    /// After a bind to `rkey` was posted: the provider names the window by the key in its
    /// struct in the next bind.
    pub(crate) fn set_rkey(&self, rkey: u32) {
        // SAFETY: as in `rkey`; a plain store into the provider's struct, which the provider
        // reads only while this thread posts.
        unsafe { (*self.raw).rkey = rkey }
    }

    /// The PD the window belongs to.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc`; the PD outlives it (our Arc).
        let r = unsafe { ibv_dealloc_mw(self.raw) };
        if r != 0 {
            tracing::warn!(errno = r, "ibv_dealloc_mw failed");
        }
    }
}

/// The key after `rkey` for the same window or region: the low 8 bits (the consumer-owned key
/// byte) advance by one, wrapping, and the index bits stay (`ibv_inc_rkey`).
pub fn next_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// A bind work request: window `mw` over `[offset, offset + len)` of `mr`, opened to the peer
/// with `access` under key `rkey` ([`next_rkey`] of the window's previous key).
#[derive(Debug, Clone, Copy)]
pub struct MwBind<'a> {
    /// Reported back in the completion (if signaled, or if it fails).
    pub wr_id: u64,
    /// The window.
    pub mw: &'a Mw,
    /// The region it opens a range of (registered with `MW_BIND`).
    pub mr: &'a Mr,
    /// Start of the range in the region.
    pub offset: usize,
    /// Bytes of the range.
    pub len: usize,
    /// What the peer may do: `REMOTE_READ` and/or `REMOTE_WRITE`.
    pub access: AccessFlags,
    /// The key the window is bound with.
    pub rkey: u32,
    /// Generate a completion for the bind.
    pub signaled: bool,
}

impl MwBind<'_> {
    pub(crate) fn validate(&self, pd: &Arc<Pd>) -> Result<()> {
        if !Arc::ptr_eq(self.mw.pd(), pd) || !Arc::ptr_eq(self.mr.pd(), pd) {
            return Err(Error::InvalidArgument(
                "the window, the region and the queue pair must share one PD".into(),
            ));
        }
        if !self.mr.access().contains(AccessFlags::MW_BIND) {
            return Err(Error::InvalidArgument(
                "binding a window needs a region registered with MW_BIND".into(),
            ));
        }
        if self.access.contains(AccessFlags::REMOTE_WRITE)
            && !self.mr.access().contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::InvalidArgument(
                "a REMOTE_WRITE window needs a region with LOCAL_WRITE".into(),
            ));
        }
        if !(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE).contains(self.access)
            || self.access.is_empty()
        {
            return Err(Error::InvalidArgument(format!(
                "window access {:?}: REMOTE_READ and/or REMOTE_WRITE only",
                self.access
            )));
        }
        if self.len == 0
            || self
                .offset
                .checked_add(self.len)
                .is_none_or(|e| e > self.mr.len())
        {
            return Err(Error::InvalidArgument(format!(
                "window [{}, +{}) outside the {}-byte region",
                self.offset,
                self.len,
                self.mr.len()
            )));
        }
        if self.rkey & !0xff != self.mw.rkey() & !0xff {
            return Err(Error::InvalidArgument(format!(
                "key {:#x} is not one of window {:#x}'s keys",
                self.rkey,
                self.mw.rkey()
            )));
        }
        Ok(())
    }

    pub(crate) fn to_raw(self, next: *mut ibv_send_wr) -> ibv_send_wr {
        // SAFETY: ibv_send_wr is integers, pointers and unions of those; zero is valid.
        let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = self.wr_id;
        w.next = next;
        w.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        w.send_flags = if self.signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        w.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw: self.mw.raw,
            rkey: self.rkey,
            bind_info: ibv_mw_bind_info {
                mr: self.mr.raw_mr(),
                addr: self.mr.addr() + self.offset as u64,
                length: self.len as u64,
                mw_access_flags: self.access.bits(),
            },
        };
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_rotate_their_low_byte_only() {
        assert_eq!(next_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(next_rkey(0x1234_56fe), 0x1234_56ff);
        assert_eq!(next_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(next_rkey(0xffff_ffff), 0xffff_ff00);
        let mut k = 0x0abc_de17;
        for _ in 0..256 {
            k = next_rkey(k);
            assert_eq!(k & !0xff, 0x0abc_de00);
        }
        assert_eq!(k, 0x0abc_de17, "256 binds bring the key byte round");
    }
}
