//! The transport-agnostic controller core: subsystems, controllers, queues.
//!
//! No sockets, no verbs, no io_uring here. A transport owns one [`Queue`] per connection (TCP
//! socket or RDMA QP) and pumps it:
//!
//! ```text
//! capsule in -> Queue::parse(sqe)          -> Cmd (direction + length + SGL) or an error CQE
//!            -> transport moves host data into the slot buffer (in-capsule / R2T / RDMA_READ)
//!            -> Queue::execute(cmd, buf, now) -> Exec::Done (admin/fabrics, data in buf)
//!                                              | Exec::Io(IoOp) (backend runs it on buf)
//!                                              | Exec::Deferred (AER: completes later)
//!            -> backend completion -> Queue::complete_io(cmd, result) -> Cqe
//!            -> transport sends data (ToHost) then the CQE
//! ```
//! Time is passed in (`now`); timers are data (`poll_timeout`), never tasks.

use std::sync::Arc;
use std::time::Instant;

use nvme::sgl::Sgl;
use nvme::{Cqe, Sqe, Status};

/// The fabric a queue runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrType {
    Tcp,
    Rdma,
}

/// What a transport offers; Identify and the discovery log are derived from it.
#[derive(Debug, Clone)]
pub struct TransportCaps {
    pub trtype: TrType,
    /// In-capsule data bytes accepted on I/O queues (IOCCSZ = (64 + this) / 16).
    pub in_capsule_data: u32,
    /// Largest transfer of one command, bytes (MDTS is derived with a 4 KiB page).
    pub max_io_size: u32,
    /// Largest queue depth (CAP.MQES + 1) accepted at Connect.
    pub max_queue_depth: u16,
}

/// A listener, as the discovery log reports it.
#[derive(Debug, Clone)]
pub struct ListenerInfo {
    pub trtype: TrType,
    pub traddr: String,
    pub trsvcid: String,
    pub port_id: u16,
}

/// A namespace as the core sees it (the bytes live in the backend).
#[derive(Debug, Clone)]
pub struct NamespaceSpec {
    pub nsid: u32,
    /// Capacity in logical blocks.
    pub blocks: u64,
    /// log2 of the logical block size (9 or 12).
    pub lba_shift: u8,
    /// The backend's index for this namespace's device (opaque to the core).
    pub device: u32,
    pub nguid: [u8; 16],
    pub uuid: [u8; 16],
}

/// A subsystem as configured.
#[derive(Debug, Clone)]
pub struct SubsystemSpec {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    pub namespaces: Vec<NamespaceSpec>,
}

/// Target-wide parameters.
#[derive(Debug, Clone)]
pub struct TargetParams {
    /// Smallest KATO a host may set, ms (smaller values are raised to this).
    pub keep_alive_ms_min: u32,
}

/// Shared, thread-safe target state: subsystems, the controller registry, discovery.
pub struct Target {
    _todo: (),
}

impl Target {
    pub fn new(
        _subsystems: Vec<SubsystemSpec>,
        _listeners: Vec<ListenerInfo>,
        _params: TargetParams,
    ) -> Arc<Target> {
        todo!("core")
    }
    /// Number of live controllers (metrics and tests).
    pub fn controller_count(&self) -> usize {
        todo!("core")
    }
}

/// Data movement a parsed command needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xfer {
    None,
    /// Host to controller: this many bytes must be in the slot buffer before `execute`.
    FromHost(u32),
    /// Controller to host: up to this many bytes come back from `execute`/the backend.
    ToHost(u32),
}

/// A parsed command, kept in the transport's request slot until completion.
#[derive(Debug, Clone)]
pub struct Cmd {
    pub sqe: Sqe,
    pub xfer: Xfer,
    /// The data SGL; `None` when the command moves no data.
    pub sgl: Option<Sgl>,
}

/// A backend operation. Offsets and lengths are bytes, already range-checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoOp {
    pub device: u32,
    pub kind: IoKind,
    pub offset: u64,
    pub len: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    Flush,
    WriteZeroes,
    /// Deallocate these (offset, len) byte ranges.
    Trim(Vec<(u64, u64)>),
}

/// What `execute` decided.
#[derive(Debug)]
pub enum Exec {
    /// Finished now. For `Xfer::ToHost`, the first `data_len` bytes of the buffer go to the host
    /// before the CQE.
    Done { cqe: Cqe, data_len: u32 },
    /// Run this on the backend with the slot buffer, then call [`Queue::complete_io`].
    Io(IoOp),
    /// Completes later (Asynchronous Event Request); see [`Queue::poll_event`].
    Deferred,
}

/// Something the queue wants the transport to do outside a command's own flow.
#[derive(Debug)]
pub enum QueueEvent {
    /// Send this CQE (a completed AER).
    Complete(Cqe),
    /// Tear the connection down (keep-alive expiry, controller reset/fatal, shutdown).
    Disconnect(&'static str),
}

/// One submission/completion queue pair's protocol state (one per connection).
pub struct Queue {
    _todo: (),
}

impl Queue {
    /// A new, unconnected queue: the first command must be a Fabrics Connect.
    pub fn new(_target: Arc<Target>, _caps: TransportCaps, _peer: String) -> Queue {
        todo!("core")
    }
    /// Queue id, once connected.
    pub fn qid(&self) -> Option<u16> {
        todo!("core")
    }
    /// Queue depth (sqsize + 1) once connected.
    pub fn depth(&self) -> u16 {
        todo!("core")
    }
    /// Parse a command: validate it, decide its data direction and length.
    pub fn parse(&mut self, _sqe: &Sqe) -> Result<Cmd, Cqe> {
        todo!("core")
    }
    /// Execute a parsed command whose host data (if any) is in `buf`.
    pub fn execute(&mut self, _cmd: &Cmd, _buf: &mut [u8], _now: Instant) -> Exec {
        todo!("core")
    }
    /// Completion of a backend op: `Ok(())` or the errno it failed with.
    pub fn complete_io(&mut self, _cmd: &Cmd, _res: Result<(), i32>) -> Cqe {
        todo!("core")
    }
    /// Completion with a transport-detected status (e.g. a data transfer error).
    pub fn complete_status(&mut self, _cmd: &Cmd, _status: Status) -> Cqe {
        todo!("core")
    }
    /// Next instant `handle_timeout` must be called at.
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!("core")
    }
    pub fn handle_timeout(&mut self, _now: Instant) {
        todo!("core")
    }
    /// Events for the transport (completed AERs, disconnect requests).
    pub fn poll_event(&mut self) -> Option<QueueEvent> {
        todo!("core")
    }
    /// The transport connection is gone; release what the queue holds.
    pub fn disconnected(&mut self) {
        todo!("core")
    }
}
