//! NVMe/TCP transport: the per-connection receive/send state machine.
//!
//! One connection = one NVMe queue ([`core::Queue`]). A connection lives on one poller thread
//! for its whole life. Each command holds a request slot (slot index = TTAG): the slot takes a
//! buffer from the poller's registered pool, receives host data into it (in-capsule data, or
//! H2CData after an R2T; data that is still on the socket is read straight into the buffer),
//! lets the backend run the I/O on it, and sends read data from it with one gathering
//! `sendmsg` (C2HData header + payload + CapsuleResp), so read payloads are never copied by
//! the CPU in user space.
//!
//! Beside the connection (this file): [`conns`], the NVMe/TCP half of a poller; [`wire`], the
//! byte stream under a connection; [`sendq`], its outgoing queue; [`tls`], the secure channel
//! (handshakes on the acceptor, kernel or user-space records). Its tests and fuzz target run
//! it on the in-memory stand-ins of `transport::mem`.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::sgl::Sgl;
use nvme::tcp::{
    DataPdu, Deframer, Event, Fed, Fes, IcReq, IcResp, Need, Pdu, R2t, RxConfig, TcpError, TermReq,
    TxConfig, TxHeader,
};
use nvme::{Cqe, Sqe, Status};
use tracing::{debug, info, warn};

mod conns;
pub mod sendq;
pub mod tls;
pub mod wire;

pub(crate) use self::conns::{TcpConns, RECV_RING_KEY};
use self::sendq::SendQueue;
use self::tls::{Accepted, NetWire};
use self::wire::Wire;
use super::{ConnStats, ReqRef, Store};
use crate::core::{self, Cmd, Exec, Queue, QueueEvent, QueueLimits, TransportCaps, Xfer};

/// Size of the receive staging buffer: small PDUs (capsules, small in-capsule data) are read
/// in batches through it; larger data is read straight into the slot buffer.
const STAGE: usize = 64 * 1024;
/// Socket reads one connection may do per readiness event before yielding to the others.
const READ_BUDGET: u32 = 16;
/// Data still outstanding at or above this size is read directly into the slot's buffer.
const DIRECT_READ_MIN: usize = 4096;
/// A send-queue marker with this bit says a piece of a slot's read data went out (the slot
/// goes on); without it, that the slot's response did (the slot is released).
const PIECE_SENT: u32 = 1 << 31;

/// What a request slot is doing. Changed only through `Conn::set`, which keeps the per-state
/// counts (`Conn::state_counts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// No command.
    Free,
    /// Waiting for a buffer from the pool.
    NeedBuffer,
    /// In-capsule data is being received into the buffer.
    RecvInCapsule,
    /// The pool had no buffer: in-capsule data is being received into the slot's own spill
    /// memory (then the slot waits in `NeedBuffer` with its data), so that reading never stops
    /// for a buffer: data that would free one may be behind it on the stream.
    RecvSpill,
    /// R2T sent; H2CData PDUs are being received.
    RecvH2C,
    /// A backend operation is in flight.
    Executing,
    /// Parked in the core (an Asynchronous Event Request, a write waiting for a range lock,
    /// a fused command waiting for its partner), with its buffer.
    Deferred,
    /// Response queued on the socket; freed when sent.
    Sending,
    /// One piece of a large read's data queued on the socket; the next piece is read into
    /// the buffer once it is sent.
    SendingPiece,
    /// Command failed before execution; its in-capsule data is being read and dropped.
    Discarding,
}

/// Number of [`SlotState`]s (index = `state as usize`).
pub const SLOT_STATES: usize = 10;

struct Slot {
    state: SlotState,
    cmd: Option<Cmd>,
    buf: Option<u32>,
    /// Host-to-controller bytes received so far.
    received: u32,
    /// Status to answer with once a discarded transfer ends.
    pending_status: Option<Status>,
    /// The CQE of a command the core already refused at parse (completed once, there), sent
    /// after its in-capsule data is discarded.
    pending_cqe: Option<Cqe>,
    /// A data digest error was seen on this command's data.
    digest_error: bool,
    /// In-capsule data received while the pool had no buffer (`RecvSpill`); its capacity is
    /// kept, so only a connection's first spills allocate.
    spill: Vec<u8>,
    /// `spill` holds this command's whole in-capsule data, to copy into the buffer granted.
    spilled: bool,
    /// A fused Compare and Write running as one backend op (`IoKind::CompareAndWrite`): the
    /// slot of its Write, whose buffer the op uses; that slot is `Executing` meanwhile and
    /// goes back to `Deferred` (or is released, when closing) when the op completes.
    caw_partner: Option<u16>,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: SlotState::Free,
            cmd: None,
            buf: None,
            received: 0,
            pending_status: None,
            pending_cqe: None,
            digest_error: false,
            spill: Vec::new(),
            spilled: false,
            caw_partner: None,
        }
    }
}

/// Where the current PDU's data bytes go.
#[derive(Debug, Clone, Copy)]
enum DataDst {
    None,
    /// Into slot `slot`'s buffer, starting at byte `base` of it.
    Slot {
        slot: u16,
        base: u32,
    },
    /// Into slot `slot`'s spill memory (no pool buffer was free).
    Spill {
        slot: u16,
    },
    /// Read and dropped (a failed command's in-capsule data).
    Discard {
        slot: u16,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitIcReq,
    Live,
    /// Torn down: waiting for in-flight backend ops before the connection is dropped.
    Closing,
}

/// One NVMe/TCP connection (one NVMe queue), on a byte stream `W`: the state machine of the
/// connection does its I/O through [`Wire`], so it runs over memory in its unit tests.
pub struct Conn<W: Wire = NetWire> {
    wire: W,
    pub peer: String,
    phase: Phase,
    rx: Deframer,
    stage: Box<[u8]>,
    st_start: usize,
    st_end: usize,
    dst: DataDst,
    /// Bytes of the current PDU's data received so far.
    data_progress: u32,
    tx: SendQueue,
    txcfg: TxConfig,
    queue: Queue,
    caps: TransportCaps,
    slots: Vec<Slot>,
    /// Slots per [`SlotState`] (see `Conn::set`).
    counts: [u32; SLOT_STATES],
    free_slots: Vec<u16>,
    /// Backend operations in flight.
    pub inflight: u32,
    pub stats: ConnStats,
    /// This connection's key in its poller's TCP table (see [`ReqRef`]).
    pub conn_key: u32,
    /// Scratch list of the markers one flush passed (kept to avoid allocating per flush).
    released: Vec<u32>,
    /// The last [`Conn::on_readable`] stopped before the socket was empty (its read budget).
    left_ready: bool,
}

/// What a connection asks its poller to do after an event.
#[derive(Debug, Default)]
pub struct Wants {
    /// Slots that need a buffer (the poller serves them FIFO).
    pub need_buffer: Vec<u16>,
}

impl Conn<NetWire> {
    /// A connection an acceptor handed over; `waker` is called (from any thread) when the
    /// core has an event for this queue.
    pub fn new(
        a: Accepted,
        target: Arc<core::Target>,
        caps: TransportCaps,
        waker: core::Waker,
    ) -> io::Result<Conn> {
        a.wire.prepare()?;
        let mut c = Conn::with_wire(a.wire, target, caps, waker);
        if let Some(id) = a.tls {
            c.queue.set_tls_identity(id);
        }
        Ok(c)
    }
}

impl<W: Wire> Conn<W> {
    /// A connection on a non-blocking byte stream.
    pub fn with_wire(
        wire: W,
        target: Arc<core::Target>,
        caps: TransportCaps,
        waker: core::Waker,
    ) -> Conn<W> {
        let peer = wire.peer();
        let rxcfg = RxConfig {
            max_data_pdu: caps.max_io_size,
            // Before Connect says what the queue is, the most any queue takes.
            max_incapsule: QueueLimits::tcp(&caps).max_in_capsule(),
            ..RxConfig::controller()
        };
        // One slot per command the largest queue may hold; a host that exceeds its sqsize is
        // cut off (it broke flow control).
        let n = caps.max_queue_depth as usize;
        let mut slots = Vec::with_capacity(n);
        slots.resize_with(n, Slot::new);
        let free_slots = (0..n as u16).rev().collect();
        let mut queue = Queue::new(target, caps.clone(), peer.clone());
        queue.set_waker(waker);
        // The discovery log reports the address the host actually reached (listeners may be
        // wildcards).
        if let Some(local) = wire.local_addr() {
            queue.set_local_addr(local);
        }
        Conn {
            queue,
            wire,
            peer,
            phase: Phase::AwaitIcReq,
            rx: Deframer::new(rxcfg),
            stage: vec![0u8; STAGE].into_boxed_slice(),
            st_start: 0,
            st_end: 0,
            dst: DataDst::None,
            data_progress: 0,
            tx: SendQueue::with_capacity(4 * n),
            txcfg: TxConfig::default(),
            caps,
            slots,
            counts: {
                let mut c = [0; SLOT_STATES];
                c[SlotState::Free as usize] = n as u32;
                c
            },
            free_slots,
            inflight: 0,
            stats: ConnStats::default(),
            conn_key: 0,
            released: Vec::with_capacity(n),
            left_ready: false,
        }
    }

    /// The byte stream.
    pub fn wire(&self) -> &W {
        &self.wire
    }

    /// The byte stream, mutably.
    pub fn wire_mut(&mut self) -> &mut W {
        &mut self.wire
    }

    pub fn is_closing(&self) -> bool {
        self.phase == Phase::Closing
    }

    /// Whether bytes wait to be sent (in the connection's queue; a TLS wire's own records are
    /// not counted).
    pub fn has_output(&self) -> bool {
        !self.tx.is_empty()
    }

    /// Whether everything is released and the connection can be dropped.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Closing && self.inflight == 0
    }

    pub fn qid(&self) -> Option<u16> {
        self.queue.qid()
    }

    /// This connection's counters, with the core queue's commands and error completions.
    pub fn stats_now(&self) -> ConnStats {
        self.stats.with_queue(&self.queue.stats())
    }

    /// Whether the last [`Conn::on_readable`] left bytes in the socket: it stopped at its read
    /// budget, not at a read that found the socket empty (the poller must ask epoll again;
    /// no new readiness signal comes for bytes already there).
    pub fn left_ready(&self) -> bool {
        self.left_ready
    }

    /// Read and process everything the socket has, up to a budget of reads (see
    /// [`Conn::left_ready`]). Returns true if anything was read.
    pub fn on_readable(&mut self, store: &mut dyn Store, now: Instant, w: &mut Wants) -> bool {
        let mut progress = false;
        let mut reads = 0;
        let mut drained = false;
        let mut budget_spent = false;
        while self.phase != Phase::Closing {
            // 1. Bytes already staged.
            if self.st_start < self.st_end {
                if let Err(e) = self.process_staged(store, now, w) {
                    self.fatal(store, e, now);
                    break;
                }
                progress = true;
                continue;
            }
            self.st_start = 0;
            self.st_end = 0;
            // Fairness: after a few socket reads let the other connections of this poller run
            // (nothing is staged now; the poller asks the level-triggered epoll again).
            if reads == READ_BUDGET || drained {
                // The budget ran out before a read found the socket empty: bytes may wait.
                budget_spent = !drained;
                break;
            }
            reads += 1;
            // 2. Large data outstanding: read it straight into the slot buffer.
            if let Some(n) = self.direct_need() {
                match self.read_direct(store, n, now, w) {
                    Ok(Some(got)) => {
                        progress = true;
                        // Short: the socket is empty for now (as above).
                        drained = got < n;
                        continue;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.io_error(store, e);
                        break;
                    }
                }
            }
            // 3. Fill the staging buffer.
            match self.wire.recv(&mut self.stage[..]) {
                Ok(0) => {
                    self.close(store, "host closed the connection");
                    break;
                }
                Ok(n) => {
                    self.st_end = n;
                    self.stats.rx_bytes += n as u64;
                    progress = true;
                    if n < STAGE {
                        // A short read emptied the socket: process what came and stop here
                        // rather than pay for a read that returns EAGAIN (one system call per
                        // command at QD1). Bytes arriving after that read signal the socket
                        // anew (the poller's readiness watch sees it).
                        drained = true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.io_error(store, e);
                    break;
                }
            }
        }
        self.left_ready = budget_spent && self.phase != Phase::Closing;
        progress
    }

    /// Read PDU data directly into the slot's buffer (or spill memory): the bytes read, None
    /// when the socket has nothing.
    fn read_direct(
        &mut self,
        store: &mut dyn Store,
        n: usize,
        now: Instant,
        w: &mut Wants,
    ) -> io::Result<Option<usize>> {
        let at = self.data_progress as usize;
        let dst: &mut [u8] = match self.dst {
            DataDst::Slot { slot, base } => {
                let buf = self.slots[slot as usize]
                    .buf
                    .expect("receiving slot has a buffer");
                let at = base as usize + at;
                &mut store.buf(buf)[at..at + n]
            }
            DataDst::Spill { slot } => &mut self.slots[slot as usize].spill[at..at + n],
            DataDst::None | DataDst::Discard { .. } => unreachable!("checked by the caller"),
        };
        let r = loop {
            match self.wire.recv(dst) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "EOF in PDU data",
                    ))
                }
                Ok(r) => break r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        self.stats.rx_bytes += r as u64;
        self.data_progress += r as u32;
        if let Some(Event::DataDone(res)) = self.rx.data_read(&dst[..r]) {
            self.data_done(store, res.is_ok(), now, w);
        }
        Ok(Some(r))
    }

    /// Hand staged bytes to the deframer and act on what completes.
    fn process_staged(
        &mut self,
        store: &mut dyn Store,
        now: Instant,
        w: &mut Wants,
    ) -> Result<(), TcpError> {
        // The stage is lent out for the call (an empty box in its place: no allocation).
        let stage = std::mem::take(&mut self.stage);
        let r = self.process_bytes(&stage[self.st_start..self.st_end], store, now, w);
        self.stage = stage;
        self.st_start += r?;
        Ok(())
    }

    /// Bytes a receive ring delivered (see [`super::conns::TcpConns`]): processed as a read
    /// into the stage would be. Returns true if anything was processed.
    pub fn on_received(
        &mut self,
        bytes: &[u8],
        store: &mut dyn Store,
        now: Instant,
        w: &mut Wants,
    ) -> bool {
        self.stats.rx_bytes += bytes.len() as u64;
        let mut at = 0;
        while at < bytes.len() && self.phase != Phase::Closing {
            match self.process_bytes(&bytes[at..], store, now, w) {
                Ok(used) => at += used,
                Err(e) => {
                    self.fatal(store, e, now);
                    break;
                }
            }
        }
        at > 0
    }

    /// After [`Conn::on_received`]: the rest of a large payload read from the socket straight
    /// into its destination, as long as the socket has it (the caller has taken every receive
    /// completion of this socket, so these are the bytes that follow them). True if any.
    pub fn read_direct_now(&mut self, store: &mut dyn Store, now: Instant, w: &mut Wants) -> bool {
        let mut progress = false;
        while self.phase != Phase::Closing {
            let Some(n) = self.direct_need() else { break };
            match self.read_direct(store, n, now, w) {
                Ok(Some(got)) => {
                    progress = true;
                    if got < n {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    self.io_error(store, e);
                    break;
                }
            }
        }
        progress
    }

    /// The bytes of PDU data still outstanding when they are enough to read straight into
    /// their destination (a slot's buffer or spill memory), rather than through the stage.
    fn direct_need(&self) -> Option<usize> {
        let Need::Data(n) = self.rx.need() else {
            return None;
        };
        let direct = matches!(self.dst, DataDst::Slot { .. } | DataDst::Spill { .. });
        (direct && n >= DIRECT_READ_MIN).then_some(n)
    }

    /// Feeds `src` to the deframer once and acts on what completes: the bytes used.
    fn process_bytes(
        &mut self,
        src: &[u8],
        store: &mut dyn Store,
        now: Instant,
        w: &mut Wants,
    ) -> Result<usize, TcpError> {
        let (used, fed) = self.rx.feed(src)?;
        match fed {
            None => {}
            Some(Fed::Header(pdu)) => {
                self.data_progress = 0;
                self.on_header(pdu, store, now, w)?;
            }
            Some(Fed::Data {
                offset,
                bytes,
                done,
            }) => {
                let len = bytes.len();
                let src = &src[..len];
                match self.dst {
                    DataDst::Slot { slot, base } => {
                        let b = self.slots[slot as usize]
                            .buf
                            .expect("receiving slot has a buffer");
                        let at = (base + offset) as usize;
                        store.buf(b)[at..at + len].copy_from_slice(src);
                        self.stats.copied_bytes += len as u64;
                    }
                    DataDst::Spill { slot } => {
                        let at = offset as usize;
                        self.slots[slot as usize].spill[at..at + len].copy_from_slice(src);
                        self.stats.copied_bytes += len as u64;
                    }
                    DataDst::None | DataDst::Discard { .. } => {}
                }
                self.data_progress = offset + len as u32;
                if let Some(res) = done {
                    self.data_done(store, res.is_ok(), now, w);
                }
            }
            Some(Fed::DataDone(res)) => {
                self.data_done(store, res.is_ok(), now, w);
            }
        }
        Ok(used)
    }

    fn on_header(
        &mut self,
        pdu: Pdu,
        store: &mut dyn Store,
        now: Instant,
        w: &mut Wants,
    ) -> Result<(), TcpError> {
        match pdu {
            Pdu::IcReq(req) => self.on_icreq(req),
            Pdu::CapsuleCmd { sqe, data_len } => {
                if self.phase != Phase::Live {
                    return Err(TcpError::new(
                        Fes::PduSequenceError,
                        0,
                        "capsule before ICReq",
                    ));
                }
                self.on_capsule(sqe, data_len, store, now, w)
            }
            Pdu::H2CData(d) => self.on_h2c_data(d),
            Pdu::H2CTermReq(t) => {
                warn!(peer = %self.peer, fes = ?t.fes(), fei = t.fei, "host terminated the connection");
                self.close(store, "H2CTermReq from host");
                Ok(())
            }
            _ => Err(TcpError::new(
                Fes::InvalidHeaderField,
                0,
                "PDU type not valid from a host",
            )),
        }
    }

    fn on_icreq(&mut self, req: IcReq) -> Result<(), TcpError> {
        if self.phase != Phase::AwaitIcReq {
            return Err(TcpError::new(Fes::PduSequenceError, 0, "second ICReq"));
        }
        if req.pfv != nvme::tcp::PFV_1_0 {
            // FEI: byte offset of PFV in the ICReq (NVMe/TCP 1.0 Figure 26).
            return Err(TcpError::new(
                Fes::UnsupportedParameter,
                8,
                "unsupported PDU format version",
            ));
        }
        let resp = IcResp {
            pfv: nvme::tcp::PFV_1_0,
            cpda: 0,
            hdgst: req.hdgst,
            ddgst: req.ddgst,
            maxh2cdata: self.caps.max_io_size,
        };
        self.tx.push_inline(&resp.encode());
        self.txcfg = TxConfig {
            hdgst: req.hdgst,
            ddgst: req.ddgst,
            pda: req.hpda,
        };
        self.rx.set_digests(req.hdgst, req.ddgst);
        self.phase = Phase::Live;
        debug!(peer = %self.peer, hdgst = req.hdgst, ddgst = req.ddgst, hpda = req.hpda, "ICReq accepted");
        Ok(())
    }

    fn on_capsule(
        &mut self,
        sqe: Sqe,
        data_len: u32,
        store: &mut dyn Store,
        now: Instant,
        w: &mut Wants,
    ) -> Result<(), TcpError> {
        // A queue's commands in flight are bounded by its size (SQSIZE + 1), not by the slots
        // the largest queue would need. SQ entries free up when consumed, so a host that
        // follows SQHD may briefly exceed the size; like nvmet (which allocates twice the
        // queue size and fails the connection when they run out) allow twice as many.
        let depth = self.queue.depth() as usize;
        if depth > 0 && self.slots.len() - self.free_slots.len() >= 2 * depth {
            return Err(TcpError::new(
                Fes::PduSequenceError,
                0,
                "more outstanding commands than twice the queue size",
            ));
        }
        let Some(slot) = self.free_slots.pop() else {
            // More commands outstanding than the queue holds: the host broke flow control.
            return Err(TcpError::new(
                Fes::PduSequenceError,
                0,
                "more outstanding commands than the queue depth",
            ));
        };
        let s = slot as usize;
        self.slots[s].received = 0;
        self.slots[s].digest_error = false;
        self.slots[s].pending_status = None;
        self.slots[s].pending_cqe = None;
        self.slots[s].spilled = false;
        let cmd = match self.queue.parse(&sqe, now) {
            Ok(cmd) => cmd,
            Err(cqe) => {
                self.slots[s].cmd = Some(Cmd::refused(sqe));
                self.fail_early(slot, cqe.status(), data_len, Some(cqe), now);
                return Ok(());
            }
        };
        // The core checked the in-capsule SGL against the queue's limit; the capsule must carry
        // exactly the data it describes, and no data without one.
        let bad = match (cmd.xfer, cmd.sgl) {
            (Xfer::FromHost(len), Some(Sgl::InCapsule { .. })) => {
                (data_len != len).then_some(Status::SGL_INVALID_DATA.dnr())
            }
            _ if data_len > 0 => Some(Status::SGL_INVALID_DATA.dnr()),
            _ => None,
        };
        self.slots[s].cmd = Some(cmd);
        if let Some(st) = bad {
            self.fail_early(slot, st, data_len, None, now);
            return Ok(());
        }
        let xfer = self.slots[s].cmd.as_ref().map(|c| c.xfer);
        if !matches!(xfer, Some(Xfer::None)) {
            match store.alloc_buf() {
                Some(b) => self.slots[s].buf = Some(b),
                None if data_len > 0 => {
                    // The data follows on the stream: receive it into the slot's own memory and
                    // ask for a buffer once it is in. Reading must go on: the host's data for a
                    // command that holds a buffer (and will free it) may be behind it.
                    let spill = &mut self.slots[s].spill;
                    spill.clear();
                    spill.resize(data_len as usize, 0);
                    self.set(slot, SlotState::RecvSpill);
                    self.dst = DataDst::Spill { slot };
                    return Ok(());
                }
                None => {
                    self.set(slot, SlotState::NeedBuffer);
                    w.need_buffer.push(slot);
                    return Ok(());
                }
            }
        }
        self.start(slot, data_len, store, now);
        Ok(())
    }

    /// Complete a command that failed before execution; drop its in-capsule data first.
    fn fail_early(&mut self, slot: u16, st: Status, data_len: u32, cqe: Option<Cqe>, now: Instant) {
        let s = slot as usize;
        if data_len > 0 {
            self.set(s as u16, SlotState::Discarding);
            self.slots[s].pending_status = Some(st);
            self.slots[s].pending_cqe = cqe;
            self.dst = DataDst::Discard { slot };
        } else {
            let cqe = cqe.unwrap_or_else(|| {
                self.queue.complete_status(
                    self.slots[s].cmd.as_ref().expect("slot has a command"),
                    st,
                    now,
                )
            });
            self.send_cqe_only(slot, cqe);
        }
    }

    /// A slot has its buffer: receive its data or execute it.
    fn start(&mut self, slot: u16, data_len: u32, store: &mut dyn Store, now: Instant) {
        let s = slot as usize;
        let cmd = self.slots[s].cmd.as_ref().expect("slot has a command");
        match cmd.xfer {
            Xfer::FromHost(_) if data_len > 0 => {
                self.set(s as u16, SlotState::RecvInCapsule);
                self.dst = DataDst::Slot { slot, base: 0 };
            }
            Xfer::FromHost(len) if len > 0 => self.send_r2t(slot),
            _ => self.execute(slot, store, now),
        }
    }

    /// Asks for the current piece of a slot's host data (all of it, unless it is larger than
    /// the buffer).
    fn send_r2t(&mut self, slot: u16) {
        let cmd = self.slots[slot as usize]
            .cmd
            .as_ref()
            .expect("slot has a command");
        let r = R2t {
            cccid: cmd.sqe.cid(),
            ttag: slot,
            r2to: cmd.piece.offset,
            r2tl: cmd.piece.len,
        };
        self.set(slot, SlotState::RecvH2C);
        let h = TxHeader::r2t(&self.txcfg, &r);
        self.tx.push_header(&h);
    }

    /// A slot that waited for a buffer got one.
    pub fn buffer_granted(&mut self, slot: u16, buf: u32, store: &mut dyn Store, now: Instant) {
        let s = slot as usize;
        if self.phase == Phase::Closing || self.slots[s].state != SlotState::NeedBuffer {
            store.free_buf(buf);
            return;
        }
        self.slots[s].buf = Some(buf);
        if std::mem::take(&mut self.slots[s].spilled) {
            // The in-capsule data came while the pool was empty: the one copy of this path.
            let n = self.slots[s].spill.len();
            store.buf(buf)[..n].copy_from_slice(&self.slots[s].spill);
            self.stats.copied_bytes += n as u64;
            self.execute(slot, store, now);
            return;
        }
        self.start(slot, 0, store, now);
    }

    fn on_h2c_data(&mut self, d: DataPdu) -> Result<(), TcpError> {
        // FEI offsets: CCCID at byte 8, TTAG at 10, DATAO at 12, DATAL at 16 (NVMe/TCP 1.0
        // Figure 32).
        let slot = d.ttag;
        let Some(sl) = self.slots.get(slot as usize) else {
            return Err(TcpError::new(
                Fes::InvalidHeaderField,
                10,
                "H2CData with an unknown TTAG",
            ));
        };
        if sl.state != SlotState::RecvH2C {
            return Err(TcpError::new(
                Fes::InvalidHeaderField,
                10,
                "H2CData for a command not expecting data",
            ));
        }
        let cmd = sl.cmd.as_ref().expect("receiving slot has a command");
        if cmd.sqe.cid() != d.cccid {
            return Err(TcpError::new(
                Fes::InvalidHeaderField,
                8,
                "H2CData CCCID does not match the TTAG",
            ));
        }
        let Xfer::FromHost(_) = cmd.xfer else {
            return Err(TcpError::new(
                Fes::InvalidHeaderField,
                10,
                "H2CData for a command without host data",
            ));
        };
        if d.datao != sl.received {
            return Err(TcpError::new(
                Fes::DataOutOfRange,
                12,
                "H2CData offset out of order",
            ));
        }
        // The R2T asked for the current piece; the buffer holds it from byte 0.
        let piece = cmd.piece;
        if d.datao as u64 + d.datal as u64 > piece.offset as u64 + piece.len as u64 {
            return Err(TcpError::new(
                Fes::DataOutOfRange,
                16,
                "H2CData beyond the R2T",
            ));
        }
        self.dst = DataDst::Slot {
            slot,
            base: d.datao - piece.offset,
        };
        Ok(())
    }

    /// The current PDU's data (and digest) arrived.
    fn data_done(&mut self, store: &mut dyn Store, digest_ok: bool, now: Instant, w: &mut Wants) {
        let dst = std::mem::replace(&mut self.dst, DataDst::None);
        let got = std::mem::take(&mut self.data_progress);
        match dst {
            DataDst::None => {}
            DataDst::Discard { slot } => {
                let s = slot as usize;
                let st = self.slots[s]
                    .pending_status
                    .take()
                    .unwrap_or(Status::INTERNAL);
                // A command refused at parse was completed (and counted) there already.
                let cqe = match self.slots[s].pending_cqe.take() {
                    Some(c) => c,
                    None => self.queue.complete_status(
                        self.slots[s].cmd.as_ref().expect("slot has a command"),
                        st,
                        now,
                    ),
                };
                self.send_cqe_only(slot, cqe);
            }
            DataDst::Spill { slot } => {
                let s = slot as usize;
                if !digest_ok {
                    // No buffer is needed to fail it.
                    self.digest_failed(slot, store, now);
                    return;
                }
                self.slots[s].spilled = true;
                self.set(slot, SlotState::NeedBuffer);
                w.need_buffer.push(slot);
            }
            DataDst::Slot { slot, .. } => {
                let s = slot as usize;
                self.slots[s].received += got;
                if !digest_ok {
                    self.slots[s].digest_error = true;
                }
                let Some(cmd) = self.slots[s].cmd.as_ref() else {
                    return;
                };
                let Xfer::FromHost(_) = cmd.xfer else {
                    return;
                };
                if self.slots[s].received < cmd.piece.offset + cmd.piece.len {
                    return; // more H2CData PDUs follow
                }
                if self.slots[s].digest_error {
                    self.digest_failed(slot, store, now);
                    return;
                }
                self.execute(slot, store, now);
            }
        }
    }

    /// NVMe/TCP 1.0, 3.6.2.8: a data digest error on host data completes the command with
    /// Transient Transport Error.
    fn digest_failed(&mut self, slot: u16, store: &mut dyn Store, now: Instant) {
        let cqe = self.queue.complete_status(
            self.slots[slot as usize]
                .cmd
                .as_ref()
                .expect("slot has a command"),
            Status::TRANSIENT_TRANSPORT,
            now,
        );
        self.respond(slot, cqe, 0, store);
    }

    fn execute(&mut self, slot: u16, store: &mut dyn Store, now: Instant) {
        let s = slot as usize;
        let mut cmd = self.slots[s].cmd.take().expect("slot has a command");
        let ex = match self.slots[s].buf {
            Some(b) => self.queue.execute(&mut cmd, store.buf(b), now),
            None => self.queue.execute(&mut cmd, &mut [], now),
        };
        self.slots[s].cmd = Some(cmd);
        match ex {
            Exec::Done { cqe, data_len } => self.respond(slot, cqe, data_len, store),
            Exec::Io(mut op) => {
                // A Compare and Write's Write lends its buffer (without it the backend
                // refuses the op: EINVAL).
                if let Some(p) = op.caw_write_cid().and_then(|c| self.deferred_slot(c)) {
                    op.lend_write_buf(self.slots[p as usize].buf);
                    self.slots[s].caw_partner = Some(p);
                    self.set(p, SlotState::Executing);
                }
                self.set(s as u16, SlotState::Executing);
                self.inflight += 1;
                let ud = ReqRef::tcp(self.conn_key, u32::from(slot)).user_data();
                store.submit(&op, self.slots[s].buf, ud);
            }
            // The slot keeps its buffer: the command may be resumed with its data.
            Exec::Deferred => self.set(s as u16, SlotState::Deferred),
        }
    }

    /// A backend op of this connection completed.
    pub fn backend_done(
        &mut self,
        slot: u16,
        res: Result<u32, i32>,
        store: &mut dyn Store,
        now: Instant,
    ) {
        self.inflight -= 1;
        let partner = self.slots[slot as usize].caw_partner.take();
        if self.phase == Phase::Closing {
            for s in std::iter::once(slot).chain(partner) {
                if let Some(cmd) = self.slots[s as usize].cmd.as_mut() {
                    self.queue.abandon(cmd);
                }
                self.release_slot(s, store);
            }
            return;
        }
        if let Some(p) = partner {
            // The Write of a Compare and Write: the core resumes it (done) or fails it.
            self.set(p, SlotState::Deferred);
        }
        let cmd = self.slots[slot as usize]
            .cmd
            .as_mut()
            .expect("executing slot has a command");
        if !cmd.is_last_piece() {
            match self.queue.piece_done(cmd, res.map(|_| ()), now) {
                Some(cqe) => self.respond(slot, cqe, 0, store),
                None if matches!(cmd.xfer, Xfer::ToHost(_)) => {
                    // This piece goes out; the next is read into the buffer once it has.
                    let len = cmd.piece.len;
                    self.set(slot, SlotState::SendingPiece);
                    self.push_data(slot, len, false, store);
                    self.tx.push_release(u32::from(slot) | PIECE_SENT);
                }
                None => {
                    cmd.next_piece();
                    self.send_r2t(slot);
                }
            }
            return;
        }
        let cqe = self.queue.complete_io(cmd, res.map(|_| ()), now);
        let data_len = match cmd.xfer {
            Xfer::ToHost(_) if cqe.status().is_success() => cmd.piece.len,
            _ => 0,
        };
        self.respond(slot, cqe, data_len, store);
    }

    /// A piece of a large read's data went out: read the next one into the buffer.
    fn piece_sent(&mut self, slot: u16, store: &mut dyn Store, now: Instant) {
        let s = &mut self.slots[slot as usize];
        if self.phase != Phase::Live || s.state != SlotState::SendingPiece {
            return;
        }
        s.cmd
            .as_mut()
            .expect("sending slot has a command")
            .next_piece();
        self.execute(slot, store, now);
    }

    /// Queue the response of a command: C2HData (if any) then the CQE (unless the SUCCESS flag
    /// makes it implicit), then release the slot once sent.
    fn respond(&mut self, slot: u16, cqe: Cqe, data_len: u32, store: &mut dyn Store) {
        self.set(slot, SlotState::Sending);
        if data_len > 0 {
            // The core says when C2HData may carry SUCCESS (`target.c2h_success`).
            let success = cqe.status().is_success() && self.queue.data_completes_success();
            self.push_data(slot, data_len, success, store);
            if !success {
                self.push_cqe(&cqe);
            }
        } else {
            self.push_cqe(&cqe);
        }
        self.tx.push_release(slot as u32);
    }

    /// Queues a C2HData PDU with the first `data_len` bytes of the slot's buffer: the current
    /// piece of the command's data (LAST when it ends the data; SUCCESS as given).
    fn push_data(&mut self, slot: u16, data_len: u32, success: bool, store: &mut dyn Store) {
        let s = &self.slots[slot as usize];
        let b = s.buf.expect("data to host comes from the slot buffer");
        let cmd = s.cmd.as_ref().expect("slot has a command");
        let data = store.payload(b, data_len as usize);
        let d = DataPdu {
            cccid: cmd.sqe.cid(),
            ttag: 0,
            datao: cmd.piece.offset,
            datal: data_len,
            last: cmd.is_last_piece(),
            success,
        };
        let h = TxHeader::c2h_data(&self.txcfg, &d);
        self.tx.push_header(&h);
        // SAFETY: the slot keeps its buffer until the marker queued after this data is
        // reported by the send queue (flush or clear), and the pool outlives every
        // connection of its poller.
        unsafe { self.tx.push_data(data.as_ptr(), data.len()) };
        if h.has_ddgst() {
            self.tx
                .push_inline(&nvme::tcp::data_digest(data).to_le_bytes());
        }
        self.stats.tx_payload += data_len as u64;
    }

    fn push_cqe(&mut self, cqe: &Cqe) {
        let h = TxHeader::capsule_resp(&self.txcfg, cqe);
        self.tx.push_header(&h);
    }

    fn send_cqe_only(&mut self, slot: u16, cqe: Cqe) {
        self.set(slot, SlotState::Sending);
        self.push_cqe(&cqe);
        self.tx.push_release(slot as u32);
    }

    fn release_slot(&mut self, slot: u16, store: &mut dyn Store) {
        let s = &mut self.slots[slot as usize];
        if s.state == SlotState::Free {
            return;
        }
        if let Some(b) = s.buf.take() {
            store.free_buf(b);
        }
        s.cmd = None;
        s.spilled = false;
        s.caw_partner = None;
        self.set(slot, SlotState::Free);
        self.free_slots.push(slot);
    }

    /// The one setter of a slot's state: keeps the per-state counts.
    fn set(&mut self, slot: u16, to: SlotState) {
        let s = &mut self.slots[slot as usize];
        let from = s.state;
        if from == to {
            return;
        }
        debug_assert!(self.counts[from as usize] > 0, "slot state count underflow");
        self.counts[from as usize] = self.counts[from as usize].saturating_sub(1);
        self.counts[to as usize] += 1;
        s.state = to;
    }

    /// How many slots are in each [`SlotState`] (index = `state as usize`); they sum to the
    /// slot count, and a connection with nothing in flight has them all `Free` (or `Deferred`:
    /// AERs parked in the core).
    pub fn state_counts(&self) -> [u32; SLOT_STATES] {
        self.counts
    }

    /// Send what is queued. Returns true when everything went out.
    pub fn flush(&mut self, store: &mut dyn Store, now: Instant) -> bool {
        if self.tx.is_empty() {
            return match self.wire.drain() {
                Ok(done) => done,
                Err(e) => {
                    self.io_error(store, e);
                    true
                }
            };
        }
        let before = self.tx.queued_bytes();
        let mut rel = std::mem::take(&mut self.released);
        let r = self.tx.flush(&mut self.wire, |t| rel.push(t));
        self.sent(before, rel, store, now);
        match r {
            Ok(done) => done,
            Err(e) => {
                self.io_error(store, e);
                true
            }
        }
    }

    /// Bytes left the queue (`before` was queued) and `rel` are the markers they passed: count
    /// them and finish what the markers stand for.
    fn sent(&mut self, before: usize, mut rel: Vec<u32>, store: &mut dyn Store, now: Instant) {
        self.stats.tx_bytes += (before - self.tx.queued_bytes()) as u64;
        for &t in &rel {
            if t & PIECE_SENT != 0 {
                self.piece_sent(t as u16, store, now);
            } else {
                self.release_slot(t as u16, store);
            }
        }
        rel.clear();
        self.released = rel;
    }

    /// For a send the caller makes through io_uring (a plain socket only): fills `iov` with
    /// the bytes to send next and returns how many entries (0: nothing to send). Exactly one
    /// [`Conn::send_done`] follows before anything else touches the connection.
    pub fn send_gather(
        &mut self,
        iov: &mut [libc::iovec],
        store: &mut dyn Store,
        now: Instant,
    ) -> usize {
        // Markers at the front first: what they finish may queue more (the next piece of a
        // large read), which must happen before the iovecs point into the queue.
        loop {
            let mut rel = std::mem::take(&mut self.released);
            self.tx.release_front(&mut |t| rel.push(t));
            let any = !rel.is_empty();
            let before = self.tx.queued_bytes();
            self.sent(before, rel, store, now);
            if !any {
                break;
            }
        }
        self.tx.gather(iov)
    }

    /// The result of the send [`Conn::send_gather`] prepared: bytes sent, Ok(None) when the
    /// socket took nothing (EAGAIN). True when the queue is empty afterwards (as `flush`).
    pub fn send_done(
        &mut self,
        res: io::Result<Option<usize>>,
        store: &mut dyn Store,
        now: Instant,
    ) -> bool {
        match res {
            Ok(Some(n)) => {
                let before = self.tx.queued_bytes();
                let mut rel = std::mem::take(&mut self.released);
                self.tx.advance(n, |t| rel.push(t));
                self.sent(before, rel, store, now);
                self.tx.is_empty()
            }
            Ok(None) => false,
            Err(e) => {
                self.io_error(store, e);
                true
            }
        }
    }

    /// Timers and core events: keep-alive expiry, AER completions, disconnect requests.
    pub fn tick(&mut self, store: &mut dyn Store, now: Instant) {
        if self.phase != Phase::Live {
            return;
        }
        if self.queue.poll_timeout().is_some_and(|t| t <= now) {
            self.queue.handle_timeout(now);
        }
        while let Some(ev) = self.queue.poll_event() {
            match ev {
                QueueEvent::Complete(cqe) => match self.deferred_slot(cqe.cid()) {
                    Some(slot) => self.send_cqe_only(slot, cqe),
                    None => {
                        warn!(peer = %self.peer, cid = cqe.cid(), "event for an unknown deferred command")
                    }
                },
                QueueEvent::Resume(cid) => match self.deferred_slot(cid) {
                    Some(slot) => self.execute(slot, store, now),
                    None => {
                        warn!(peer = %self.peer, cid, "resume of an unknown deferred command")
                    }
                },
                QueueEvent::Disconnect(reason) => {
                    info!(peer = %self.peer, qid = ?self.queue.qid(), reason, "disconnecting queue");
                    self.flush(store, now);
                    self.close(store, reason);
                    return;
                }
            }
        }
    }

    /// The deferred command with this CID.
    fn deferred_slot(&self, cid: u16) -> Option<u16> {
        let slot = self.slots.iter().position(|s| {
            s.state == SlotState::Deferred && s.cmd.as_ref().is_some_and(|c| c.sqe.cid() == cid)
        });
        slot.map(|s| s as u16)
    }

    /// A fatal protocol error: C2HTermReq (NVMe/TCP 1.0, 3.6.2.9), then close.
    fn fatal(&mut self, store: &mut dyn Store, e: TcpError, now: Instant) {
        warn!(peer = %self.peer, fes = ?e.fes, fei = e.fei, reason = e.reason,
            "NVMe/TCP protocol error: terminating the connection");
        let bytes = TermReq::of(&e).encode(false, self.rx.offending_header());
        // Best effort, after the whole PDUs already queued; the connection closes either way.
        if self.flush(store, now) {
            write_bounded(&mut self.wire, &bytes, Duration::from_millis(100));
        }
        self.stats.errors += 1;
        self.close(store, e.reason);
    }

    /// The socket's receive failed (the poller's receive ring reported `e`).
    pub fn receive_failed(&mut self, store: &mut dyn Store, e: io::Error) {
        self.io_error(store, e);
    }

    fn io_error(&mut self, store: &mut dyn Store, e: io::Error) {
        debug!(peer = %self.peer, error = %e, "socket error");
        self.close(store, "socket error");
    }

    /// Tear the connection down: free every buffer not held by the backend (those are freed
    /// when their operations complete).
    pub fn close(&mut self, store: &mut dyn Store, reason: &str) {
        if self.phase == Phase::Closing {
            return;
        }
        debug!(peer = %self.peer, qid = ?self.queue.qid(), reason, "closing connection");
        self.phase = Phase::Closing;
        self.queue.disconnected();
        self.wire.shutdown();
        self.tx.clear(|_| {});
        for s in 0..self.slots.len() {
            if self.slots[s].state != SlotState::Executing {
                self.release_slot(s as u16, store);
            }
        }
        self.dst = DataDst::None;
    }
}

/// Write `bytes` to a non-blocking stream, giving up after `limit`.
fn write_bounded(wire: &mut impl Wire, bytes: &[u8], limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut off = 0;
    while off < bytes.len() && Instant::now() < deadline {
        match wire.send(&[IoSlice::new(&bytes[off..])]) {
            Ok(Some(n)) => off += n,
            Ok(None) => std::thread::yield_now(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests;
