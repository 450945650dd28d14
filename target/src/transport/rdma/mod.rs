//! NVMe/RDMA transport (NVMe-oF 1.1 RDMA binding): rdma_cm listeners, the RDMA half of the
//! poller threads and the per-request state machine that moves capsules and data between hosts and
//! [`core::Queue`](crate::core::Queue)s.
//!
//! # Threads
//! - One **CM thread** (`cm.rs`) owns the rdma_cm event channel and the listening ids. A
//!   CONNECT_REQUEST is routed to a poller (I/O queue `qid` to poller `(qid - 1) % n`, admin
//!   queues round robin); later CM events of the connection (ESTABLISHED, DISCONNECTED,
//!   TIMEWAIT_EXIT, DEVICE_REMOVAL, ADDR_CHANGE, errors) are forwarded to that poller. It also
//!   forwards COMM_EST to rdma_cm (`rdma_notify`) and fatal QP async events to the poller.
//! - The **pollers** (`transport::poller`, one per core for both transports) own everything of
//!   a connection; their RDMA half (`conns.rs` here, `RdmaConns`) holds its QP and CQ (one CQ
//!   per connection, sized for every RECV and send WR, so a CQ never overruns and a connection
//!   is drained by reaping its own CQ), its RECV and response buffers and a `core::Queue`; the
//!   poller's io_uring ring and buffer pool are the ones its TCP connections use. The pool is
//!   registered once per device as one memory region with `LOCAL_WRITE` only.
//!
//! # Connection set-up (passive side)
//! The poller checks the CM request private data (recfmt, qid, hrqsize, hsqsize; rejects carry
//! the NVMe/RDMA reject private data and status through `rdma_reject`), sizes the queue pair
//! ([`params`]), posts all `hsqsize + 1` RECVs, then accepts with `recfmt 0, crqsize`,
//! `initiator_depth = min(peer responder resources, max_qp_init_rd_atom)`, no responder
//! resources (the host never reads from us) and RNR retry 7.
//!
//! # Shared receive queue (`target.rdma_srq_depth > 0`)
//! Each poller creates, with its other resources of a device, one SRQ of `rdma_srq_depth`
//! RECVs (lowered to `max_srq_wr`) over one `LOCAL_WRITE` region of `64 + in_capsule_data`
//! byte strides, all posted at once (`srq.rs`). Every QP of that poller on that device is
//! created on it and posts no RECVs of its own; `crqsize` is still the host's own queue depth.
//! A capsule's completion arrives on the CQ of the QP that took it and names its stride by
//! wr_id; the connection parses it in place, keeps it while in-capsule data waits for a pool
//! buffer, and reposts it to the SRQ once consumed (also while closing: strides belong to the
//! pool). A host holding more unparsed capsules than its queue depth is disconnected, so one
//! host cannot drain the pool. When more capsules arrive at once than strides are posted, RoCE
//! answers RNR NAK and the host retries (RNR retry 7: unlimited, as SPDK documents for its
//! SRQ); iWARP has no RNR (a SEND without a RECV terminates the connection), so there the
//! depth must cover every command the poller's hosts may have in flight.
//!
//! # iWARP
//! Detected from the device's transport type. RDMA READ sinks need `REMOTE_WRITE` there; the
//! pool region never gets it: each READ registers only its own buffer slice
//! (`LOCAL_WRITE | REMOTE_WRITE`, one SGE) and deregisters it on completion, which bounds the
//! host-writable memory to the I/O in flight. SEND_WITH_INVALIDATE is off by default on iWARP
//! (see [`SendWithInvalidate`]).
//!
//! Known device defect (tests/rdma_access.rs, test VM, Linux 6.1): siw answers a peer's RDMA
//! READ from any region of the connection's protection domain without checking `REMOTE_READ`
//! (its READ-response path checks the source with no access rights) and although the accept
//! granted no READs (IRD 0; other siw versions carry a check that refuses that case). So over
//! siw a connected peer that knows or guesses an STag can read the pool; RoCE (rxe) refuses
//! it. Closing that gap on our side would need a protection domain per connection with per-I/O
//! registration of every data buffer on iWARP.
//!
//! # Teardown
//! On DISCONNECTED, a failed (non-flush) completion, keep-alive expiry or a controller reset the
//! connection tells the core (`Queue::disconnected`), calls `rdma_disconnect`, moves the QP to
//! the error state and reaps flush completions until every posted RECV and signaled send WR
//! has come back and no backend operation is in flight; then the QP, CM id, CQ and regions are
//! destroyed in that order. A QP on a shared receive queue has no RECVs of its own, but may
//! have taken one from the SRQ: it is destroyed only after IBV_EVENT_QP_LAST_WQE_REACHED (read
//! by the CM thread with the other async events and forwarded to the poller), and its CQ is
//! reaped once more just before, so a RECV completion still in it goes back to the SRQ. A
//! device that never raises the event (rxe and siw on Linux 6.1 raise none) gets 1 s after
//! its send queue is flushed (`LAST_WQE_WAIT` in conn.rs). Every buffer and region
//! returns (counted in [`VerbsStats`]).

mod cm;
mod conn;
pub(crate) mod conns;
pub mod params;
pub mod request;
mod srq;
mod verbs;

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ::rdma::EventChannel;
use tracing::{info, warn};

pub use conns::{RegionInfo, RegionKind, VerbsStats};
pub use request::ReqState;

use crate::transport::conns::PollerHandle;

/// Environment variable that overrides [`SendWithInvalidate`]: `auto`, `on` or `off`.
pub const SEND_WITH_INV_ENV: &str = "NVMF_RDMA_SEND_WITH_INV";

/// Listen backlog of each rdma_cm listener (nvmet uses 128).
const BACKLOG: i32 = 128;

/// Whether responses to commands whose SGL asked for remote invalidation (keyed SGL subtype
/// 0xF) use SEND_WITH_INVALIDATE, sparing the host its LOCAL_INV.
///
/// A plain SEND is always correct (the host then invalidates its key itself). Over iWARP,
/// the soft-iWARP user library reports no WITH_INV flag to the receiver, and a published
/// userspace target that used SEND_WITH_INV over siw made the Linux host's connect time out,
/// so `Auto` enables it only on InfiniBand/RoCE. Measured with this target in the test VM
/// (Linux 6.1 host, siw): with `On` the host's admin Connect times out (`I/O 0 QID 0
/// timeout`) and siw logs `got TERMINATE. layer 0, type 2, code 9`; over rxe, `Auto` (on)
/// passes the fio write+verify runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SendWithInvalidate {
    /// On for InfiniBand/RoCE devices, off for iWARP.
    #[default]
    Auto,
    /// Always (where the host asked for it).
    On,
    /// Never.
    Off,
}

impl SendWithInvalidate {
    /// Whether it applies to a device of this kind.
    pub fn enabled(self, iwarp: bool) -> bool {
        match self {
            SendWithInvalidate::Auto => !iwarp,
            SendWithInvalidate::On => true,
            SendWithInvalidate::Off => false,
        }
    }

    /// Parses `auto`, `on` or `off` (also `1`/`0`, `true`/`false`, any case).
    pub fn parse(s: &str) -> Result<SendWithInvalidate, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(SendWithInvalidate::Auto),
            "on" | "1" | "true" | "yes" => Ok(SendWithInvalidate::On),
            "off" | "0" | "false" | "no" => Ok(SendWithInvalidate::Off),
            other => Err(format!(
                "{SEND_WITH_INV_ENV}={other:?}: expected auto, on or off"
            )),
        }
    }

    /// The value of [`SEND_WITH_INV_ENV`], `Auto` when unset.
    pub fn from_env() -> Result<SendWithInvalidate, String> {
        match std::env::var(SEND_WITH_INV_ENV) {
            Ok(v) => SendWithInvalidate::parse(&v),
            Err(_) => Ok(SendWithInvalidate::Auto),
        }
    }
}

/// Environment variable that turns inline response SENDs off (`off`; default `on`): for
/// diagnosing the soft-iWARP transmit race they avoid (see `Conn::inline_rsp`), not for use.
pub const INLINE_RSP_ENV: &str = "NVMF_RDMA_INLINE_RSP";

/// Whether response SENDs go inline: [`INLINE_RSP_ENV`], on when unset.
pub fn inline_responses_from_env() -> Result<bool, String> {
    match std::env::var(INLINE_RSP_ENV) {
        Err(_) => Ok(true),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "on" | "1" | "true" | "yes" | "" => Ok(true),
            "off" | "0" | "false" | "no" => Ok(false),
            other => Err(format!("{INLINE_RSP_ENV}={other:?}: expected on or off")),
        },
    }
}

/// RDMA-specific settings.
#[derive(Debug, Clone, Copy)]
pub struct RdmaOptions {
    pub send_with_invalidate: SendWithInvalidate,
    /// Response SENDs carry the CQE inline where the device allows it ([`INLINE_RSP_ENV`]).
    pub inline_responses: bool,
    /// `target.rdma_srq_depth`: RECVs of each poller's shared receive queue per device, 0 for
    /// a receive queue per queue pair (see `srq.rs`).
    pub srq_depth: u32,
}

/// What a poller tells the CM thread.
pub(crate) enum CmNote {
    /// The connection is accepted on this QP (for async-event routing).
    Accepted { tag: u64, qp_num: u32 },
    /// The connection is gone (or was rejected): forget its id.
    Released { tag: u64 },
    /// (Configuration reload) listen on `addr` too; the bound address or the error on `reply`.
    Listen {
        addr: SocketAddr,
        reply: mpsc::Sender<Result<SocketAddr, ::rdma::Error>>,
    },
    /// (Configuration reload) stop listening on the bound address `addr`; connected hosts stay.
    Unlisten { addr: SocketAddr },
}

/// A listener that could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("rdma listener {addr}: {source}")]
pub struct ListenError {
    pub addr: SocketAddr,
    #[source]
    pub source: ::rdma::Error,
}

/// How long start-up waits for an RDMA device to serve a listener's address (ENODEV).
const DEVICE_WAIT: Duration = Duration::from_secs(10);

/// The NVMe/RDMA transport before its rdma_cm thread runs: the event channel the thread will
/// own (created by the first [`listen`](Self::listen), so that a machine without RDMA fails
/// there), the ids listening on it, and what the pollers need ([`poller_setup`]
/// (Self::poller_setup)). [`start`](Self::start) hands it all to the thread.
pub struct RdmaStarting {
    ch: Option<EventChannel>,
    listeners: Vec<cm::Listener>,
    prep: RdmaPrepared,
}

impl RdmaStarting {
    pub fn new(options: RdmaOptions) -> RdmaStarting {
        RdmaStarting {
            ch: None,
            listeners: Vec::new(),
            prep: RdmaTransport::prepare(options),
        }
    }

    /// Bind and listen on `addr` (port 0 picks a port).
    ///
    /// Without kernel RDMA support this fails with [`::rdma::Error::NoRdma`] ("no usable RDMA
    /// on this machine: rdma_create_event_channel failed: No such device ..."); an address
    /// that is not on an RDMA-capable interface fails in `rdma_bind_addr`. The listener goes
    /// with this value: dropping the returned [`Listening`] alone does not close it (start-up
    /// starts every listener it bound or drops the whole transport).
    pub fn listen(&mut self, addr: SocketAddr) -> Result<Listening, ListenError> {
        let err = |source| ListenError { addr, source };
        let ch = match &mut self.ch {
            Some(ch) => ch,
            None => self.ch.insert(EventChannel::new().map_err(err)?),
        };
        let tag = cm::LISTENER_TAG | self.listeners.len() as u64;
        // ENODEV: the address is on a netdev, but no RDMA device serves it (yet). At boot the
        // service can start before the RDMA link exists (a NIC driver still probing, `rdma
        // link add` of rxe/siw not run yet; seen in the VM right after siw came up), so wait a
        // little for it; any other error, or the same after the wait, fails.
        let deadline = Instant::now() + DEVICE_WAIT;
        let mut waited = false;
        let id = loop {
            let id = ch.create_id(tag).map_err(err)?;
            match id.bind_addr(addr) {
                Ok(()) => break id,
                Err(e) if e.errno() == Some(libc::ENODEV) && Instant::now() < deadline => {
                    if !waited {
                        warn!(%addr, wait_s = DEVICE_WAIT.as_secs(),
                            "no RDMA device serves this address yet: waiting for one");
                        waited = true;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(err(e)),
            }
        };
        if waited {
            info!(%addr, "RDMA device for the listener appeared");
        }
        id.listen(BACKLOG).map_err(err)?;
        let bound = id.local_addr().unwrap_or(addr);
        self.listeners.push(cm::Listener { id, addr: bound });
        Ok(Listening {
            addr: bound,
            notes: None,
        })
    }

    /// For every poller's [`PollerConfig`](crate::transport::poller::PollerConfig).
    pub(crate) fn poller_setup(&self) -> conns::RdmaSetup {
        self.prep.setup.clone()
    }

    /// Starts the rdma_cm thread serving the listeners bound so far, routing connections to
    /// `pollers` (each set up with [`poller_setup`](Self::poller_setup)), until `stop`.
    pub fn start(
        self,
        pollers: Arc<Vec<PollerHandle>>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<RdmaTransport> {
        let ch = match self.ch {
            Some(ch) => ch,
            None => EventChannel::new().map_err(std::io::Error::other)?,
        };
        for l in &self.listeners {
            info!(address = %l.addr, "NVMe/RDMA listener up");
        }
        let notes = self.prep.setup.notes.clone();
        let t = cm::CmThread::new(ch, self.listeners, pollers, self.prep.notes, stop);
        let cm = std::thread::Builder::new()
            .name("nvmf-rdma-cm".into())
            .spawn(move || t.run())?;
        Ok(RdmaTransport {
            cm: Some(cm),
            notes,
        })
    }
}

// Which local addresses an NVMe/RDMA listener can use: shared with the initiator's bench.
pub use ::rdma::{local_rdma_ipv4, RdmaAddress};

/// The running RDMA transport: the rdma_cm thread (listeners, connection requests routed to
/// the pollers, which serve the connections).
pub struct RdmaTransport {
    cm: Option<JoinHandle<()>>,
    /// To the CM thread (listeners added and removed by a reload).
    notes: mpsc::Sender<CmNote>,
}

/// A listener [`RdmaTransport::listen`] added: the CM thread stops listening on it when this
/// is dropped, unless it was [`kept`](Listening::keep) (a reload that fails after binding
/// gives its new listeners back by dropping them).
pub struct Listening {
    addr: SocketAddr,
    notes: Option<mpsc::Sender<CmNote>>,
}

impl Listening {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Keep listening (until [`RdmaTransport::unlisten`]); the bound address.
    pub fn keep(mut self) -> SocketAddr {
        self.notes = None;
        self.addr
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        if let Some(notes) = self.notes.take() {
            let _ = notes.send(CmNote::Unlisten { addr: self.addr });
        }
    }
}

/// What the pollers need before the rdma_cm thread starts ([`RdmaTransport::prepare`]).
struct RdmaPrepared {
    setup: conns::RdmaSetup,
    notes: mpsc::Receiver<CmNote>,
}

impl RdmaTransport {
    /// The channel the pollers' RDMA halves report on: `setup` goes to every poller, the
    /// receiver to the rdma_cm thread.
    fn prepare(options: RdmaOptions) -> RdmaPrepared {
        let (tx, rx) = mpsc::channel();
        RdmaPrepared {
            setup: conns::RdmaSetup { options, notes: tx },
            notes: rx,
        }
    }

    /// Listen on `addr` too (on the CM thread's event channel).
    pub fn listen(&mut self, addr: SocketAddr) -> Result<Listening, ListenError> {
        let (reply, rx) = mpsc::channel();
        let gone = || ListenError {
            addr,
            source: ::rdma::Error::Verbs {
                call: "rdma_listen (the rdma_cm thread is gone)",
                errno: libc::ESHUTDOWN,
            },
        };
        self.notes
            .send(CmNote::Listen { addr, reply })
            .map_err(|_| gone())?;
        let bound = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .map_err(|_| gone())?
            .map_err(|source| ListenError { addr, source })?;
        Ok(Listening {
            addr: bound,
            notes: Some(self.notes.clone()),
        })
    }

    /// Stop listening on the bound address `bound`; connected hosts stay.
    pub fn unlisten(&mut self, bound: SocketAddr) {
        let _ = self.notes.send(CmNote::Unlisten { addr: bound });
    }

    /// After the stop flag is set: joins the CM thread (closing the listeners). The pollers
    /// close the connections when they are joined.
    pub fn join(mut self) {
        if let Some(t) = self.cm.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_with_invalidate_policy() {
        use SendWithInvalidate::*;
        assert!(Auto.enabled(false));
        assert!(!Auto.enabled(true), "off by default on iWARP");
        assert!(On.enabled(true) && On.enabled(false));
        assert!(!Off.enabled(true) && !Off.enabled(false));
        assert_eq!(SendWithInvalidate::parse("ON"), Ok(On));
        assert_eq!(SendWithInvalidate::parse(" off "), Ok(Off));
        assert_eq!(SendWithInvalidate::parse("0"), Ok(Off));
        assert_eq!(SendWithInvalidate::parse("auto"), Ok(Auto));
        let e = SendWithInvalidate::parse("sometimes").unwrap_err();
        assert!(
            e.contains(SEND_WITH_INV_ENV) && e.contains("sometimes"),
            "{e}"
        );
    }
}
