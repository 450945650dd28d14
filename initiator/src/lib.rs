//! NVMe-oF initiator library (NVMe/TCP and NVMe/RDMA).
//!
//! [`Controller::connect`] brings a controller up the way the Linux host does: ICReq/ICResp
//! (checked as `nvme_tcp_init_connection` checks it) or the NVMe/RDMA rdma_cm handshake
//! ([`rdma`], with [`ConnectOptions::rdma`]), Fabrics Connect on the admin queue
//! (SQSIZE 31, CNTLID FFFFh) and, when the controller asks for it (AUTHREQ.ATR), in-band
//! authentication with DH-HMAC-CHAP on that queue ([`ConnectOptions::dhchap`],
//! [`DhchapOptions`]), Property Get CAP, Property Set CC (without, then with EN), poll
//! CSTS.RDY, Property Get VS, Identify Controller (checked: CNTLID, KAS, IOCCSZ, ICDOFF,
//! SGLS), Set Features Number of Queues, one Connect per I/O queue (each authenticated the
//! same way when asked), Identify active namespace list and Identify Namespace. Keep Alive
//! then goes out every KATO/2 from a small background thread on the admin queue (behind a
//! mutex: it is not the I/O path).
//!
//! Two ways to do I/O:
//! - [`Namespace`]: synchronous `read_at` / `write_at` / `flush` / `write_zeroes` / `trim`
//!   on byte offsets (block-aligned), with data moving straight between the socket and the
//!   caller's slice; `compare_at`, fused `compare_and_write` (an atomic test-and-set on a
//!   block range, shared by hosts) and the reservation commands too. [`Namespace::into_io`]
//!   gives a [`NamespaceIo`]: `std::io::{Read, Write, Seek}` at any offset and length (whole
//!   blocks move underneath), for `std::io::copy` and crates that read disk images.
//! - [`AsyncQueue`]: commands as futures on any executor (no runtime dependency), many in
//!   flight at once on one queue (`examples/async_tokio.rs` runs it on tokio).
//! - [`IoQueue`]: one queue per thread, no locks, queue depth up to the queue's tags:
//!   [`IoQueue::submit`] (or `submit_read` / `submit_write` / ...) hands over a `Vec<u8>` and
//!   returns a tag; [`IoQueue::reap`] / [`IoQueue::poll`] return [`Completion`]s with the
//!   buffer. Nothing is allocated per I/O once the queue is warm.
//!
//! ```no_run
//! use nvmf_initiator::{ConnectOptions, Controller};
//!
//! let mut ctrl = Controller::connect(ConnectOptions::tcp("127.0.0.1", 4420, "nqn.2026-11.io.nvmf-rs:default"))?;
//! let ns = ctrl.namespaces()[0];
//! let mut q = ctrl.take_io_queue().expect("one I/O queue");
//! let bs = ns.block_size as usize;
//! for i in 0..16u64 {
//!     q.submit_read(&ns, i * 8, vec![0u8; 8 * bs], i).map_err(|e| e.error)?;
//! }
//! let mut done = Vec::new();
//! while q.in_flight() > 0 {
//!     q.reap(&mut done, 1, None)?;
//! }
//! for c in &done {
//!     c.result.map_err(|e| nvmf_initiator::Error::from(e))?;
//! }
//! println!("copies per byte: {:.2}", q.stats().copies_per_byte());
//! # Ok::<(), nvmf_initiator::Error>(())
//! ```
//!
//! There is one queue type, [`Queue`], generic over its transport's [`Link`]: [`IoQueue`]
//! (NVMe/TCP), [`RdmaQueue`] (NVMe/RDMA, registered [`RdmaBuf`] buffers from
//! [`Queue::alloc_buf`]: zero-copy) and [`AnyQueue`] (either, chosen at connect time; what
//! [`Controller::take_queue`] hands out, [`AnyQueue::into_typed`] splits it by transport).
//! Tags, completions, deadlines, waiting, statistics and failure handling are the queue's,
//! written once; a link only moves capsules, data and responses.
//!
//! # Waiting for completions
//! [`ConnectOptions::polling`] chooses how I/O queues wait: [`Polling::Adaptive`] (the
//! default, below), [`Polling::Busy`] (never sleep while commands are in flight) or
//! [`Polling::Interrupt`] (always sleep). An adaptive
//! queue waiting for completions spins (reads the socket, or polls the RDMA completion queue,
//! again without sleeping) for up to [`ConnectOptions::poll_spin`] (default [`DEFAULT_SPIN`],
//! 50 us, over both transports) while commands are in flight, and only then sleeps in `poll(2)`
//! (NVMe/TCP) or on the completion channel (NVMe/RDMA).
//! A loopback or fabric round trip fits in the budget, so at QD1 the completion is picked up
//! without a sleep and a wake-up; at deep queue depths completions keep coming and the queue
//! never sleeps; a slow queue (a slow device, a load far below the queue's pace) stops
//! spinning once most of its spins run out, sleeping at once and spinning through one wait in
//! 16 to notice completions coming fast again, so it costs a wake-up per I/O rather than a
//! budget (NVMe/TCP; RDMA queues keep the budget: a completion-channel wake-up costs more). No flag is needed for low latency at QD1 and throughput at QD32
//! ([`Polling::Busy`] spins without bound; [`Polling::Interrupt`] always sleeps). Commands submitted
//! between two waits leave in one `writev` (NVMe/TCP) and one receive pass parses every PDU
//! the socket had.
//!
//! # What a read costs in copies (NVMe/TCP)
//! The kernel copies every payload byte once between its socket buffers and ours (1 copy per
//! byte, the socket's own; over RDMA the target writes straight into registered memory: 0).
//! Large C2HData PDUs (128 KiB reads) are received with `readv` straight into the caller's
//! buffer: 1.00 copies per byte. Small ones (4 KiB reads) arrive in the 64 KiB receive buffer
//! together with the headers around them and are copied once more from there: 2.00 copies per
//! byte. That is deliberate: one `read` picks up many PDUs, where receiving each 4 KiB payload
//! in place would take a system call per PDU (header, then data) and cost more CPU than
//! copying 4 KiB (~0.1-0.2 us). [`Stats::copies_per_byte`] reports it per queue.
//!
//! Every wait is bounded by [`ConnectOptions::timeout`]: a dead target fails the queue (all its
//! commands complete with an error) instead of hanging. Errors carry the NVMe [`nvme::Status`]
//! when the target answered with one ([`Error::status`]).
//!
//! # One namespace over a set of paths
//! [`Namespace`] is the one synchronous handle, whatever its paths: on a queue of a
//! controller the caller keeps ([`Controller::open_namespace`]: one path, no reconnect), on a
//! connection of its own that reconnects ([`Namespace::connect`] with a [`ReconnectPolicy`]:
//! on a transport failure it drops the controller, reconnects with exponential backoff and
//! runs the failed call again, as the Linux host's error recovery does), or over several
//! paths ([`Namespace::multipath`] with a [`ConnectOptions`] per path, or
//! [`Namespace::discover`] from a discovery controller: each call goes to an ANA optimized
//! path, else a non-optimized one, runs again on another path when its path fails or answers
//! an ANA status, and a failed path reconnects in the background under the same kind of
//! [`ReconnectPolicy`]). Every operation (read, write, FUA write, compare, Compare and Write,
//! flush, write zeroes, deallocate, the reservation commands, the `std::io` adapter of
//! [`Namespace::into_io`]) is written once and works on each form; [`Namespace::paths`] and
//! [`Namespace::stats`] report the paths the same way for each. An NVMe status (LBA out of
//! range, a write-protected namespace) returns at once; past the policy's attempts or total
//! time a call fails with [`Error::ReconnectGaveUp`] (one path) or [`Error::NoUsablePath`]
//! (several, after waiting ANATT for one).
//! [`ReconnectingQueue`] does the same for the asynchronous API (NVMe/TCP and NVMe/RDMA), on
//! one path that reconnects or on several: it keeps every command in flight (SQE, buffer,
//! caller's value) and, after a reconnect or on another path, submits the ones the failure
//! took down again in their original order.
//!
//! ```no_run
//! use std::time::Duration;
//! use nvmf_initiator::{ConnectOptions, MultipathOptions, Namespace, ReconnectPolicy};
//!
//! let nqn = "nqn.2026-11.io.nvmf-rs:default";
//! let policy = ReconnectPolicy {
//!     max_attempts: 20,
//!     max_total: Some(Duration::from_secs(30)),
//!     initial_delay: Duration::from_millis(100),
//!     max_delay: Duration::from_secs(2),
//!     multiplier: 2.0,
//! };
//! let mut one = Namespace::connect(ConnectOptions::tcp("127.0.0.1", 4420, nqn), 1, policy)?;
//! let paths = vec![
//!     ConnectOptions::tcp("10.0.0.1", 4420, nqn),
//!     ConnectOptions::rdma("10.0.1.1", 4420, nqn),
//! ];
//! let mut several = Namespace::multipath(paths, 1, MultipathOptions::default())?;
//! let mut buf = vec![0u8; one.block_size() as usize];
//! for ns in [&mut one, &mut several] {
//!     ns.read_at(&mut buf, 0)?;
//!     for p in ns.paths() {
//!         println!("{}:{} {:?} {:?}", p.addr, p.port, p.state, p.ana_state);
//!     }
//! }
//! # Ok::<(), nvmf_initiator::Error>(())
//! ```

mod any_queue;
mod asyncq;
mod auth;
mod cmd;
mod controller;
mod discovery;
mod error;
mod multipath;
mod namespace;
mod path;
mod queue;
pub mod rdma;
mod reconnect;
mod reconnector;
mod spin;
mod state;
mod stdio;
mod tcp;
#[cfg(test)]
mod test_rng;

pub use any_queue::{AnyBuf, AnyLink, AnyQueue, IoQueue, RdmaQueue, TypedQueue};
pub use auth::DhchapOptions;
pub use cmd::{rw_sqe, Completion, Data, DataRef, NsInfo, Stats, SubmitError, Transport};
pub use controller::{
    hostnqn_for, ConnectOptions, Controller, ControllerInfo, TlsOptions, SPLIT_BYTES,
};
pub use discovery::{discover, discover_with, DiscoveryEntry};
pub use error::{CmdError, Error};
pub use queue::{Buf, Link, Queue, WaitFds};
pub use rdma::{RdmaBuf, RdmaLink};
pub use tcp::TcpLink;
pub use tls::{ConfiguredPsk, IdentityVersion};

pub use asyncq::{AsyncQueue, CmdFuture};
pub use multipath::{is_path_status, AnaState, MultipathOptions, PathPolicy};
pub use namespace::Namespace;
/// Reservation command fields and the Reservation Report, for [`Namespace::reservation_register`] and friends.
pub use nvme::resv;
pub use path::{PathInfo, PathMonitor, PathState, PathStats, ReconnectPolicy};
pub use reconnect::ReconnectingQueue;
pub use reconnector::Reconnector;
pub use spin::{Polling, DEFAULT_SPIN};
pub use stdio::NamespaceIo;

impl From<CmdError> for Error {
    fn from(e: CmdError) -> Error {
        Error::from_cmd("command", e)
    }
}
