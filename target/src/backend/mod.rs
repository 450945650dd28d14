//! The storage backend: executes the core's [`IoOp`](crate::core::IoOp)s on namespaces'
//! backing stores through a per-thread io_uring. No protocol knowledge lives here.
//!
//! - [`Devices`]: every namespace's backing store (file, block device or null), opened once
//!   at start-up with O_DIRECT (buffered I/O if the filesystem refuses it) and shared by all
//!   threads.
//! - [`BufPool`]: one page-aligned anonymous mapping split into fixed-size buffers, owned by a
//!   poller thread; registered with io_uring (and, by the RDMA transport, as one memory region).
//! - [`Ring`]: one io_uring per poller thread (SINGLE_ISSUER | DEFER_TASKRUN where the kernel
//!   has it) with the devices as fixed files and the pool as fixed buffers. No locks and no
//!   heap allocation per operation.
//! - [`SocketRing`]: a poller's stream sockets received through io_uring (multishot receives
//!   into provided buffers), so receiving costs no `epoll_wait` and no `recv` per socket; the
//!   sends of several sockets go out in one `io_uring_enter`.
//! - [`ReadyWatch`]: a multishot poll on a poller's epoll descriptor in a small private ring, so
//!   a busy-polling poller checks for socket activity with a memory load, not `epoll_wait`.

mod device;
mod discard;
mod pool;
mod ring;
mod sockring;
mod sys;
mod watch;

pub use device::{
    rbd_client_names, rbd_forget_cluster, Deallocate, Device, DeviceError, DeviceKind, DeviceSpec,
    Devices, FileSpec, RbdSpec, Signal, EBLOCKLISTED, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE,
};
pub use pool::{BufId, BufPool, PoolError, BUF_ALIGN, MAX_BUFFERS, MAX_BUFFER_SIZE};
pub use ring::{Ring, RingConfig, RingError, RingMode, RingStats, SubmitError};
pub use sockring::{Received, SocketRing, SEND_TAG};
pub use watch::ReadyWatch;

#[cfg(test)]
mod tests;

/// A connected loopback TCP pair (client, server) for the socket rings' tests.
#[cfg(test)]
pub(crate) fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}
