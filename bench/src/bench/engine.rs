//! The transport-agnostic I/O interface of a job, and how each transport provides it.
//!
//! A job sees an [`Engine`]: a fixed number of slots, each with its own data buffer, that it
//! fills (writes) or inspects (reads) between [`Engine::submit`] and the slot's completion.
//! Buffers belong to the engine so a transport can register them once (RDMA memory regions)
//! and the measured loop allocates nothing. [`open`] connects a controller over one transport
//! and hands out one engine per job, or says why the transport cannot run here.

use std::time::Duration;

use initiator::{
    CmdError, Completion, ConnectOptions, Controller, DhchapOptions, Error, Link, NsInfo, Queue,
    TypedQueue,
};

use super::args::TransportKind;

/// Data direction of one I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

/// One finished I/O.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    pub slot: usize,
    pub result: Result<(), CmdError>,
}

/// Queue counters (see [`initiator::Stats`]): payload bytes delivered, payload bytes the CPU
/// copied through the socket (kernel copies) and in user space, system calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub payload_bytes: u64,
    pub socket_bytes: u64,
    pub memcpy_bytes: u64,
    pub syscalls: u64,
}

impl Counters {
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            payload_bytes: self.payload_bytes - earlier.payload_bytes,
            socket_bytes: self.socket_bytes - earlier.socket_bytes,
            memcpy_bytes: self.memcpy_bytes - earlier.memcpy_bytes,
            syscalls: self.syscalls - earlier.syscalls,
        }
    }

    pub fn add(&mut self, o: &Counters) {
        self.payload_bytes += o.payload_bytes;
        self.socket_bytes += o.socket_bytes;
        self.memcpy_bytes += o.memcpy_bytes;
        self.syscalls += o.syscalls;
    }
}

/// One queue of some transport, driven by one job thread.
pub trait Engine: Send {
    /// Number of slots (I/Os in flight at most).
    fn slots(&self) -> usize;
    /// The data buffer of an idle slot (`bs` bytes).
    fn buf(&self, slot: usize) -> &[u8];
    /// The data buffer of an idle slot, to fill before a write.
    fn buf_mut(&mut self, slot: usize) -> &mut [u8];
    /// Start `op` of the slot's whole buffer at byte `offset` of the namespace.
    fn submit(&mut self, slot: usize, op: Op, offset: u64) -> Result<(), Error>;
    /// Wait up to `timeout` for at least `min` completions (fewer if fewer are in flight);
    /// append them to `out`. An `Err` means the queue is dead.
    fn reap(&mut self, out: &mut Vec<Done>, min: usize, timeout: Duration) -> Result<(), Error>;
    /// I/Os in flight.
    fn in_flight(&self) -> usize;
    /// Counters since the queue was created.
    fn counters(&self) -> Counters;
    /// Why the queue failed, if it did.
    fn failure(&self) -> Option<String>;
}

/// An [`Engine`] over an initiator [`Queue`] of either link: NVMe/TCP's `IoQueue` with `Vec`
/// buffers, NVMe/RDMA's `RdmaQueue` with buffers from its registered pool (the target reads and
/// writes them directly). Each slot's buffer is lent to the queue while its I/O runs.
pub struct QueueEngine<L: Link> {
    q: Queue<L>,
    ns: NsInfo,
    bufs: Vec<Option<L::Buf>>,
    done: Vec<Completion<L::Buf>>,
}

impl<L: Link> QueueEngine<L> {
    pub fn new(q: Queue<L>, ns: NsInfo, slots: usize, bs: usize) -> Result<QueueEngine<L>, Error> {
        let bufs = (0..slots)
            .map(|_| q.alloc_buf(bs).map(Some))
            .collect::<Result<_, _>>()?;
        Ok(QueueEngine {
            q,
            ns,
            bufs,
            done: Vec::with_capacity(slots),
        })
    }
}

const IDLE: &str = "slot buffer is only touched while the slot is idle";

impl<L: Link> Engine for QueueEngine<L> {
    fn slots(&self) -> usize {
        self.bufs.len()
    }

    fn buf(&self, slot: usize) -> &[u8] {
        self.bufs[slot].as_deref().expect(IDLE)
    }

    fn buf_mut(&mut self, slot: usize) -> &mut [u8] {
        self.bufs[slot].as_deref_mut().expect(IDLE)
    }

    fn submit(&mut self, slot: usize, op: Op, offset: u64) -> Result<(), Error> {
        let buf = self.bufs[slot].take().expect(IDLE);
        let slba = offset / self.ns.block_size as u64;
        let r = match op {
            Op::Read => self.q.submit_read(&self.ns, slba, buf, slot as u64),
            Op::Write => self.q.submit_write(&self.ns, slba, buf, slot as u64),
        };
        r.map(|_tag| ()).map_err(|e| {
            self.bufs[slot] = e.buf;
            e.error
        })
    }

    fn reap(&mut self, out: &mut Vec<Done>, min: usize, timeout: Duration) -> Result<(), Error> {
        let r = self.q.reap(&mut self.done, min, Some(timeout));
        for c in self.done.drain(..) {
            let slot = c.user_data as usize;
            self.bufs[slot] = c.buf;
            out.push(Done {
                slot,
                result: c.result.map(|_| ()),
            });
        }
        r.map(|_| ())
    }

    fn in_flight(&self) -> usize {
        self.q.in_flight()
    }

    fn counters(&self) -> Counters {
        let s = self.q.stats();
        Counters {
            payload_bytes: s.payload_bytes,
            socket_bytes: s.socket_payload_bytes,
            memcpy_bytes: s.memcpy_bytes,
            syscalls: s.syscalls,
        }
    }

    fn failure(&self) -> Option<String> {
        self.q.error().map(|e| e.to_string())
    }
}

/// Where the target is and how to talk to it.
#[derive(Debug, Clone)]
pub struct TargetSpec {
    pub traddr: String,
    /// Address for NVMe/RDMA when it differs from `traddr` (the demo's target listens for
    /// TCP on loopback and for RDMA on an RDMA device's address).
    pub rdma_traddr: Option<String>,
    pub trsvcid: u16,
    pub subnqn: String,
    pub hostnqn: Option<String>,
    /// DH-HMAC-CHAP secrets for every queue the target asks to authenticate (`Debug` redacts
    /// them).
    pub dhchap: Option<DhchapOptions>,
    /// TLS for the NVMe/TCP connections (`Debug` redacts the key).
    pub tls: Option<initiator::TlsOptions>,
    /// Secure channel concatenation on the NVMe/TCP connections.
    pub concat: bool,
    pub nsid: u32,
    pub hdr_digest: bool,
    pub data_digest: bool,
    /// How the initiator's queues wait (--polling, --hipri).
    pub polling: initiator::Polling,
    /// The initiator's spin budget before a wait sleeps (`None`: its default).
    pub poll_spin: Option<Duration>,
    pub io_timeout: Duration,
    /// The target's control socket, to read its CPU time and command count around each run.
    pub stats_socket: Option<std::path::PathBuf>,
}

/// A connected controller and one engine per job.
pub struct Session {
    /// Kept alive for keep-alive and shut down when dropped.
    pub ctrl: Controller,
    pub ns: NsInfo,
    pub engines: Vec<Box<dyn Engine>>,
}

/// The outcome of [`open`].
pub enum Opened {
    Ready(Box<Session>),
    /// The transport cannot run on this machine or with this build; the reason.
    Unavailable(String),
}

/// Why RDMA cannot run on this machine, if it cannot: no device.
fn rdma_device_missing() -> Option<String> {
    match rdma::devices() {
        Ok(d) if d.is_empty() => Some(
            "no RDMA device on this machine — run tests/vm/run.sh for soft-RDMA (rxe/siw)".into(),
        ),
        Ok(_) => None,
        Err(e) => Some(format!("cannot list RDMA devices: {e}")),
    }
}

/// Connect over `kind` with `jobs` I/O queues of `depth`, checking the namespace and the
/// block size against what the controller reports.
pub fn open(
    kind: TransportKind,
    t: &TargetSpec,
    jobs: u16,
    depth: u16,
    bs: u64,
) -> Result<Opened, String> {
    let traddr = match kind {
        TransportKind::Rdma => t.rdma_traddr.as_deref().unwrap_or(&t.traddr),
        TransportKind::Tcp => &t.traddr,
    };
    // Each transport's own defaults (the spin budget differs).
    let mut o = match kind {
        TransportKind::Tcp => ConnectOptions::tcp(traddr, t.trsvcid, &t.subnqn),
        TransportKind::Rdma => ConnectOptions::rdma(traddr, t.trsvcid, &t.subnqn),
    };
    if let Some(h) = &t.hostnqn {
        o.hostnqn = h.clone();
    }
    o.dhchap = t.dhchap.clone();
    if kind == TransportKind::Tcp {
        o.tls = t.tls.clone();
        o.concat = t.concat;
    }
    o.queues = jobs;
    o.queue_depth = depth;
    o.hdr_digest = t.hdr_digest;
    o.data_digest = t.data_digest;
    o.polling = t.polling;
    if let Some(s) = t.poll_spin {
        o.poll_spin = s;
    }
    o.timeout = t.io_timeout;
    let no_device = match kind {
        TransportKind::Rdma => rdma_device_missing(),
        TransportKind::Tcp => None,
    };
    let where_ = format!("{traddr}:{} {}", t.trsvcid, t.subnqn);
    let mut ctrl = match Controller::connect(o) {
        Ok(c) => c,
        Err(e @ Error::Unsupported(_)) => {
            let mut why = Vec::from_iter(no_device);
            why.push(format!("the initiator library cannot do it yet ({e})"));
            return Ok(Opened::Unavailable(why.join("; ")));
        }
        Err(e) => {
            return match no_device {
                // Whatever the initiator tripped over, without a device RDMA cannot run.
                Some(why) => {
                    tracing::debug!(error = %e, "NVMe/RDMA connect without an RDMA device");
                    Ok(Opened::Unavailable(why))
                }
                None => Err(format!("connect to {where_}: {e}")),
            };
        }
    };
    let ns = ctrl.namespace(t.nsid).map_err(|e| match e {
        Error::InvalidArgument(m) => format!("{where_}: {m}"),
        e => format!("{where_}: {e}"),
    })?;
    let info = ctrl.info().clone();
    let block = ns.block_size as u64;
    if bs % block != 0 {
        return Err(format!(
            "--bs={bs} is not a multiple of namespace {}'s {block}-byte block",
            ns.nsid
        ));
    }
    if bs > info.max_transfer as u64 || bs / block > 1 << 16 {
        return Err(format!(
            "--bs={bs} exceeds the controller's largest transfer ({} bytes, MDTS)",
            info.max_transfer
        ));
    }
    if info.io_queues < jobs {
        return Err(format!(
            "the controller granted {} I/O queues; --numjobs={jobs} needs one each",
            info.io_queues
        ));
    }
    if info.io_queue_depth < depth {
        return Err(format!(
            "--iodepth={depth} exceeds the controller's queue depth {} (CAP.MQES / MAXCMD)",
            info.io_queue_depth
        ));
    }
    let mut engines: Vec<Box<dyn Engine>> = Vec::with_capacity(jobs as usize);
    let (slots, bs) = (depth as usize, bs as usize);
    let buffers = |e: Error| format!("I/O buffers: {e}");
    for _ in 0..jobs {
        let q = ctrl
            .take_queue()
            .ok_or_else(|| "the controller has fewer I/O queues than it reported".to_string())?;
        // Each transport's own queue type: no run-time choice per I/O.
        let typed = q
            .into_typed()
            .map_err(|_| "a fresh I/O queue has commands in flight".to_string())?;
        engines.push(match typed {
            TypedQueue::Tcp(q) => Box::new(QueueEngine::new(q, ns, slots, bs).map_err(buffers)?),
            TypedQueue::Rdma(q) => Box::new(QueueEngine::new(q, ns, slots, bs).map_err(buffers)?),
        });
    }
    Ok(Opened::Ready(Box::new(Session { ctrl, ns, engines })))
}
