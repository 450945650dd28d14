//! Transports: they move capsules and data between hosts and `core::Queue`s. No controller
//! logic here.

pub mod adaptive;
pub mod conns;
pub mod listen;
#[cfg(any(test, feature = "testing"))]
pub mod mem;
pub mod poller;
pub mod rdma;
pub mod tcp;
pub mod thread;

use std::sync::{mpsc, Arc};

use crate::backend::Device;
use crate::core::IoOp;

/// What a poller's connections need from the storage side: the buffer pool and the backend
/// ring of that poller thread.
pub trait Store {
    /// A free buffer of at least `max_io_size` bytes, or None when the pool is exhausted.
    fn alloc_buf(&mut self) -> Option<u32>;
    fn free_buf(&mut self, buf: u32);
    /// The whole buffer.
    fn buf(&mut self, buf: u32) -> &mut [u8];
    /// The first `len` bytes of the buffer, to send (read data): may be a shared region of
    /// zeroes for a null device's read, which is never written into the buffer.
    fn payload(&self, buf: u32, len: usize) -> &[u8];
    /// Queue a backend operation on `buf` (None for operations without data).
    fn submit(&mut self, op: &IoOp, buf: Option<u32>, user_data: u64);
    /// Submit what is queued, then collect finished operations: (user_data, bytes or -errno).
    fn reap(&mut self, out: &mut Vec<(u64, Result<u32, i32>)>);
    /// Operations submitted and not yet reaped.
    fn inflight(&self) -> usize;
    /// Buffers currently allocated.
    fn buffers_in_use(&self) -> usize;
    /// io_uring_enter system calls made so far (0 for stores without a ring).
    fn ring_enters(&self) -> u64 {
        0
    }
    /// Put `device` in backend device slot `index` (`None`: empty it), on the poller's own
    /// thread; see [`DeviceUpdate`].
    fn set_device(&mut self, index: u32, device: Option<&Device>) -> std::io::Result<()>;
}

/// A configuration reload telling a poller that device slot `index` now holds `device` (or,
/// with `None`, nothing). The poller applies it between two passes of its loop, so the I/O
/// path takes no lock; it answers on `done` once its ring knows.
pub struct DeviceUpdate {
    pub index: u32,
    pub device: Option<Arc<Device>>,
    pub done: mpsc::Sender<std::io::Result<()>>,
}

impl DeviceUpdate {
    /// Apply the update to `store` and report the result.
    pub fn apply<S: Store>(self, store: &mut S) {
        let r = store.set_device(self.index, self.device.as_deref());
        if let Err(e) = &r {
            tracing::error!(index = self.index, error = %e, "cannot register a device with the backend ring");
        }
        let _ = self.done.send(r);
    }
}

/// The transport of a poller's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tcp,
    Rdma,
}

/// One request of one connection of a poller: what a backend operation's `user_data` names,
/// and what waits in the poller's buffer FIFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqRef {
    pub kind: Kind,
    /// The connection's key in its transport's table on the poller.
    pub conn: u32,
    /// The request slot (TCP transfer tag, RDMA work-request slot).
    pub slot: u32,
}

/// `user_data` bit 63: the operation belongs to an NVMe/RDMA connection.
const RDMA_BIT: u64 = 1 << 63;

impl ReqRef {
    pub fn tcp(conn: u32, slot: u32) -> ReqRef {
        ReqRef {
            kind: Kind::Tcp,
            conn,
            slot,
        }
    }

    pub fn rdma(conn: u32, slot: u32) -> ReqRef {
        ReqRef {
            kind: Kind::Rdma,
            conn,
            slot,
        }
    }

    /// The backend `user_data` naming this request: the kind in bit 63, the connection key in
    /// bits 32..63, the slot in the low half.
    pub fn user_data(self) -> u64 {
        let k = match self.kind {
            Kind::Tcp => 0,
            Kind::Rdma => RDMA_BIT,
        };
        k | u64::from(self.conn & 0x7fff_ffff) << 32 | u64::from(self.slot)
    }

    pub fn from_user_data(ud: u64) -> ReqRef {
        ReqRef {
            kind: if ud & RDMA_BIT != 0 {
                Kind::Rdma
            } else {
                Kind::Tcp
            },
            conn: ((ud & !RDMA_BIT) >> 32) as u32,
            slot: ud as u32,
        }
    }
}

/// Per-connection counters. A connection keeps the byte counts and its transport-level
/// failures (protocol errors, failed work requests) in `errors`; commands and NVMe error
/// completions are the core queue's counts, merged in by [`ConnStats::with_queue`], so each is
/// counted once.
#[derive(Debug, Default, Clone, Copy)]
pub struct ConnStats {
    pub commands: u64,
    pub errors: u64,
    /// Bytes received from / sent to the socket.
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// Read payload bytes sent to the host.
    pub tx_payload: u64,
    /// Payload bytes the CPU copied in user space (in-capsule data from the staging buffer).
    pub copied_bytes: u64,
}

impl ConnStats {
    /// These counters with the core queue's commands and error completions added.
    pub fn with_queue(mut self, q: &crate::core::QueueStats) -> ConnStats {
        self.commands += q.commands;
        self.errors += q.errors;
        self
    }

    /// Add `o`'s counts to these.
    pub fn add(&mut self, o: &ConnStats) {
        self.commands += o.commands;
        self.errors += o.errors;
        self.rx_bytes += o.rx_bytes;
        self.tx_bytes += o.tx_bytes;
        self.tx_payload += o.tx_payload;
        self.copied_bytes += o.copied_bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips_kind_connection_and_slot() {
        for r in [
            ReqRef::tcp(0, 0),
            ReqRef::tcp(7, 65535),
            ReqRef::rdma(0, 0),
            ReqRef::rdma(0x7fff_ffff, u32::MAX),
            ReqRef::tcp(12, 3),
        ] {
            assert_eq!(ReqRef::from_user_data(r.user_data()), r);
        }
        assert_ne!(
            ReqRef::tcp(1, 2).user_data(),
            ReqRef::rdma(1, 2).user_data()
        );
    }
}
