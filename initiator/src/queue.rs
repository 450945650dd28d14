//! One NVMe/TCP queue: a socket, a deframer and a slot per tag.
//!
//! The same engine runs the admin queue (behind a mutex in [`crate::Controller`]) and every I/O
//! queue ([`IoQueue`], one per thread, no locks). All per-tag state is allocated when the queue
//! is created; steady-state I/O allocates nothing (the transmit ring and completion list grow
//! to their high-water mark once).
//!
//! # Data path
//! - Commands go out as CapsuleCmd PDUs. A write whose length fits in the in-capsule limit
//!   (IOCCSZ * 16 - 64 for I/O queues, 8 KiB for the admin queue) carries its data in the
//!   capsule, as the Linux target requires; larger writes wait for R2Ts and send H2CData PDUs
//!   of at most MAXH2CDATA bytes, honouring each R2T's offset and length.
//! - Everything queued for the socket leaves in one `writev` (header, payload slice of the
//!   caller's buffer, digest), so payload is never copied in user space on the way out.
//! - Received bytes are parsed by [`nvme::tcp::Deframer`]. While the deframer expects PDU data
//!   and the receive buffer is empty, the queue reads with `readv` straight into the caller's
//!   buffer at the PDU's offset (and any bytes after the data into the receive buffer). Data
//!   that arrived in the receive buffer together with headers is copied once from there: for
//!   small PDUs that is the better trade (one 64 KiB read picks up many PDUs); after a large
//!   C2HData PDU (32 KiB or more) header reads shrink to 1 KiB so the next large PDU's data
//!   goes mostly straight into its buffer.
//!
//! # Copy accounting ([`Stats`])
//! Every payload byte that crosses the socket counts as one copy (the kernel copies it between
//! its socket buffers and ours), and every payload byte moved by `memcpy` in user space counts
//! as one more. A read whose data the queue received straight into the caller's buffer costs 1
//! copy per byte; one whose data came in with the headers costs 2. Writes always cost 1.
//!
//! # Failure
//! A closed socket, a protocol violation, a C2HTermReq or a command older than the timeout
//! fails the whole queue: every in-flight command completes with [`CmdError::QueueFailed`] (or
//! [`CmdError::Timeout`]) and its buffer is returned; later submissions fail with
//! [`Error::QueueFailed`].

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nvme::cmd::{PSDT_MASK, PSDT_SGL};
use nvme::sgl::Sgl;
use nvme::tcp::{
    self, DataPdu, Deframer, Event, Fes, IcReq, Need, Pdu, R2t, RxConfig, TcpError, TermReq,
    TxConfig, TxHeader,
};
use nvme::{Cqe, Sqe};

use crate::error::{CmdError, Error};
use crate::spin::{Spin, SpinWindow};

/// Size of the receive buffer for headers (and data that arrives with them).
const RXBUF_LEN: usize = 64 * 1024;
/// After a C2HData PDU with at least this much data, header reads are kept short...
const LARGE_PDU: usize = 32 * 1024;
/// ...this short, so that most of the next large PDU's data is read straight into its buffer
/// instead of through the receive buffer (one memcpy less per byte).
const SHORT_READ: usize = 1024;
/// Most iovecs handed to one `writev`.
const MAX_IOV: usize = 64;

/// Which way a command's data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Dir {
    #[default]
    None,
    /// Host to controller (Write).
    ToCtrl,
    /// Controller to host (Read).
    FromCtrl,
}

/// A command's data buffer, owned by the caller of [`IoQueue::submit`] and returned in its
/// [`Completion`]. `B` is `Vec<u8>` over TCP, [`crate::rdma::RdmaBuf`] over RDMA.
#[derive(Debug)]
pub enum Data<B = Vec<u8>> {
    /// No data.
    None,
    /// Data sent to the controller (the whole vector).
    ToController(B),
    /// Data received from the controller (fills the whole vector).
    FromController(B),
}

/// The end of one command submitted with [`IoQueue::submit`].
#[derive(Debug)]
pub struct Completion<B = Vec<u8>> {
    /// The tag [`IoQueue::submit`] returned (it is also the command identifier).
    pub tag: u16,
    /// The caller's value from the submission.
    pub user_data: u64,
    /// CQE DW0..1 on success.
    pub result: Result<u64, CmdError>,
    /// The buffer given at submission, back to the caller.
    pub buf: Option<B>,
}

/// A submission that did not go out; the buffer comes back.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct SubmitError<B: std::fmt::Debug = Vec<u8>> {
    pub error: Error,
    pub buf: Option<B>,
}

/// Counters of one queue (see the module doc for the copy accounting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Commands submitted.
    pub commands: u64,
    /// Commands completed (successfully or not).
    pub completed: u64,
    /// Payload bytes of completed commands.
    pub payload_bytes: u64,
    /// Payload bytes that crossed the socket (each is one kernel copy).
    pub socket_payload_bytes: u64,
    /// Payload bytes copied in user space.
    pub memcpy_bytes: u64,
    /// `read`/`readv`/`writev`/`poll` calls.
    pub syscalls: u64,
}

impl Stats {
    /// Average number of CPU copies per payload byte (socket crossings plus memcpy).
    pub fn copies_per_byte(&self) -> f64 {
        if self.socket_payload_bytes == 0 && self.memcpy_bytes == 0 {
            return 0.0;
        }
        (self.socket_payload_bytes + self.memcpy_bytes) as f64 / self.payload_bytes.max(1) as f64
    }

    /// Add another queue's counters.
    pub fn merge(&mut self, o: &Stats) {
        self.commands += o.commands;
        self.completed += o.completed;
        self.payload_bytes += o.payload_bytes;
        self.socket_payload_bytes += o.socket_payload_bytes;
        self.memcpy_bytes += o.memcpy_bytes;
        self.syscalls += o.syscalls;
    }
}

/// Where a slot's data lives.
#[derive(Debug, Default)]
enum SlotBuf {
    #[default]
    None,
    /// Owned by the slot until completion ([`IoQueue::submit`]).
    Owned(Vec<u8>),
    /// At this offset of the caller's borrowed buffer ([`IoQueue::run_borrowed`]).
    Ext(usize),
}

/// Per-tag state.
#[derive(Debug, Default)]
struct Slot {
    active: bool,
    /// A borrowed-buffer command: completion is collected by `run_borrowed`, not `reap`.
    ext: bool,
    user_data: u64,
    buf: SlotBuf,
    dir: Dir,
    len: u32,
    /// Reads: bytes received. Writes: bytes queued for sending (in-capsule or per R2T).
    xfer: u32,
    /// Transmit items of this tag still (partly) unsent: the buffer stays until they are out.
    tx_pending: u16,
    digest_error: bool,
    result: Option<Result<u64, CmdError>>,
    deadline: Option<Instant>,
}

/// One PDU waiting to be written: header bytes, then a slice of the tag's data, then DDGST.
#[derive(Debug)]
struct TxItem {
    hdr: TxHeader,
    tag: u16,
    data_off: u32,
    data_len: u32,
    ddgst: Option<[u8; 4]>,
    /// Bytes of this item already written.
    sent: usize,
}

impl TxItem {
    fn total(&self) -> usize {
        self.hdr.as_bytes().len()
            + self.data_len as usize
            + if self.ddgst.is_some() { 4 } else { 0 }
    }
}

/// The C2HData PDU whose data is being received.
#[derive(Debug, Clone, Copy)]
struct RxData {
    tag: u16,
    /// Next byte offset within the command's buffer.
    pos: usize,
    success: bool,
}

/// A borrowed data buffer for a command run to completion (admin commands, the synchronous
/// [`crate::Namespace`] calls). Its length is the transfer length.
#[derive(Debug)]
pub enum DataRef<'a> {
    /// No data.
    None,
    /// Data from the controller lands here.
    Read(&'a mut [u8]),
    /// Data sent to the controller.
    Write(&'a [u8]),
}

/// Parameters of one queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueParams {
    pub qid: u16,
    /// Tags (commands in flight at most).
    pub depth: u16,
    pub hdgst: bool,
    pub ddgst: bool,
    pub timeout: Duration,
    /// How waits spin before they sleep.
    pub spin: Spin,
}

/// One NVMe/TCP I/O queue (also used for the admin queue). Not shared between threads: give
/// each thread its own.
#[derive(Debug)]
pub struct IoQueue {
    qid: u16,
    sock: TcpStream,
    rx: Deframer,
    tx: TxConfig,
    maxh2cdata: u32,
    icd_max: u32,
    timeout: Duration,
    spin: Spin,
    slots: Box<[Slot]>,
    free: Vec<u16>,
    inflight: usize,
    /// Commands started since a read last found the socket empty. While every command in
    /// flight is one of these, nothing can have arrived for them yet that a read right after
    /// sending would find (a loopback round trip is ~10 us; the read costs a system call
    /// that returns EAGAIN): [`IoQueue::reap`] then goes straight to waiting.
    fresh: usize,
    txq: VecDeque<TxItem>,
    rxbuf: Box<[u8]>,
    rx_pos: usize,
    rx_end: usize,
    rx_data: Option<RxData>,
    /// How much to read into `rxbuf` at a time (see [`LARGE_PDU`]).
    rx_read: usize,
    done: VecDeque<u16>,
    ext_done: Vec<u16>,
    failed: Option<Arc<Error>>,
    spins: u32,
    stats: Stats,
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl IoQueue {
    /// Open the TCP connection and run the ICReq/ICResp exchange. Fabrics Connect is the
    /// caller's next step.
    pub(crate) fn open(addr: &SocketAddr, p: &QueueParams) -> Result<IoQueue, Error> {
        let sock = TcpStream::connect_timeout(addr, p.timeout).map_err(|e| {
            if is_timeout(&e) {
                Error::Timeout(p.timeout, "TCP connect")
            } else {
                Error::Io(e)
            }
        })?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(p.timeout))?;
        sock.set_write_timeout(Some(p.timeout))?;
        let req = IcReq {
            pfv: tcp::PFV_1_0,
            hpda: 0,
            hdgst: p.hdgst,
            ddgst: p.ddgst,
            maxr2t: 0,
        };
        (&sock).write_all(&req.encode()).map_err(|e| {
            if is_timeout(&e) {
                Error::Timeout(p.timeout, "ICReq send")
            } else {
                Error::Io(e)
            }
        })?;
        let mut rx = Deframer::new(RxConfig::host());
        let resp = loop {
            let buf = rx.header_buf();
            let n = match (&sock).read(buf) {
                Ok(0) => return Err(Error::Closed),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_timeout(&e) => return Err(Error::Timeout(p.timeout, "ICResp")),
                Err(e) => return Err(e.into()),
            };
            match rx.advance(n) {
                Ok(None) => {}
                Ok(Some(Event::Header(Pdu::IcResp(r)))) => break r,
                Ok(Some(Event::Header(Pdu::C2HTermReq(t)))) => {
                    return Err(Error::TermReq {
                        fes: t.fes,
                        fei: t.fei,
                    })
                }
                Ok(Some(ev)) => {
                    // The deframer only yields IC or TermReq before the exchange.
                    return Err(Error::Controller(format!(
                        "unexpected {ev:?} before ICResp"
                    )));
                }
                Err(e) => {
                    let _ =
                        (&sock).write_all(&TermReq::new(&e, rx.offending_header()).encode(true));
                    return Err(e.into());
                }
            }
        };
        // The Linux host's checks (nvme_tcp_init_connection): digests echoed, CPDA 0,
        // MAXH2CDATA >= 4096 and a multiple of 4 (checked by the deframer).
        if let Err(e) = resp.check_against(&req) {
            let _ = (&sock).write_all(&TermReq::new(&e, &resp.encode()).encode(true));
            return Err(e.into());
        }
        rx.set_digests(p.hdgst, p.ddgst);
        sock.set_nonblocking(true)?;
        let depth = p.depth.max(1);
        let slots: Vec<Slot> = (0..depth).map(|_| Slot::default()).collect();
        Ok(IoQueue {
            qid: p.qid,
            sock,
            rx,
            tx: TxConfig {
                hdgst: p.hdgst,
                ddgst: p.ddgst,
                pda: resp.cpda,
            },
            maxh2cdata: resp.maxh2cdata,
            icd_max: 0,
            timeout: p.timeout,
            spin: p.spin,
            slots: slots.into_boxed_slice(),
            free: (0..depth).rev().collect(),
            inflight: 0,
            fresh: 0,
            txq: VecDeque::with_capacity(depth as usize * 2),
            rxbuf: vec![0u8; RXBUF_LEN].into_boxed_slice(),
            rx_pos: 0,
            rx_end: 0,
            rx_data: None,
            rx_read: RXBUF_LEN,
            done: VecDeque::with_capacity(depth as usize),
            ext_done: Vec::with_capacity(depth as usize),
            failed: None,
            spins: 0,
            stats: Stats::default(),
        })
    }

    /// Largest write sent in-capsule (bytes); larger writes use R2T.
    pub(crate) fn set_icd_max(&mut self, bytes: u32) {
        self.icd_max = bytes;
    }

    /// Queue identifier (0 = admin).
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Number of tags.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Commands submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.inflight
    }

    /// Free tags.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// MAXH2CDATA from the ICResp.
    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// The in-capsule data limit for writes on this queue.
    pub fn in_capsule_limit(&self) -> u32 {
        self.icd_max
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Why the queue failed, if it did.
    pub fn error(&self) -> Option<&Error> {
        self.failed.as_deref()
    }

    /// Whether the queue can still be used.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Spin on the socket without bound instead of sleeping in `poll(2)` after the spin budget
    /// ([`crate::ConnectOptions::poll_spin`]) while waiting (a busy core while I/O is in flight).
    pub fn set_busy_poll(&mut self, on: bool) {
        self.spin.always = on;
    }

    fn failed_error(&self) -> Option<Error> {
        self.failed.as_ref().map(|c| Error::QueueFailed {
            qid: self.qid,
            cause: c.clone(),
        })
    }

    /// Submit a command. The queue sets the command identifier (the returned tag), PSDT and the
    /// data pointer (an in-capsule or transport SGL for the buffer's length). The buffer comes
    /// back in the [`Completion`].
    pub fn submit(&mut self, sqe: Sqe, data: Data, user_data: u64) -> Result<u16, SubmitError> {
        let (dir, buf) = match data {
            Data::None => (Dir::None, None),
            Data::ToController(v) => (Dir::ToCtrl, Some(v)),
            Data::FromController(v) => (Dir::FromCtrl, Some(v)),
        };
        let len = buf.as_ref().map_or(0, |b| b.len());
        let Ok(len) = u32::try_from(len) else {
            let error = Error::InvalidArgument(format!("buffer of {len} bytes"));
            return Err(SubmitError { error, buf });
        };
        if let Some(error) = self.failed_error() {
            return Err(SubmitError { error, buf });
        }
        if self.free.is_empty() {
            return Err(SubmitError {
                error: Error::QueueFull,
                buf,
            });
        }
        let sb = match buf {
            Some(v) => SlotBuf::Owned(v),
            None => SlotBuf::None,
        };
        Ok(self.start(sqe, dir, len, sb, user_data, &DataRef::None))
    }

    /// Start a command on a free tag (the caller checked there is one).
    fn start(
        &mut self,
        mut sqe: Sqe,
        dir: Dir,
        len: u32,
        buf: SlotBuf,
        user_data: u64,
        ext: &DataRef<'_>,
    ) -> u16 {
        let tag = self.free.pop().expect("caller checked for a free tag");
        sqe.cid = tag.into();
        sqe.flags = (sqe.flags & !PSDT_MASK) | PSDT_SGL;
        let incapsule = dir == Dir::ToCtrl && len > 0 && len <= self.icd_max;
        sqe.dptr = if incapsule {
            Sgl::InCapsule { offset: 0, len }.encode()
        } else {
            Sgl::Transport { len }.encode()
        };
        let ext_slot = matches!(buf, SlotBuf::Ext(_));
        let slot = &mut self.slots[tag as usize];
        *slot = Slot {
            active: true,
            ext: ext_slot,
            user_data,
            buf,
            dir,
            len,
            xfer: if incapsule { len } else { 0 },
            tx_pending: 1,
            digest_error: false,
            result: None,
            deadline: crate::any_queue::deadline_for(&sqe, self.qid, self.timeout),
        };
        let data_len = if incapsule { len } else { 0 };
        let hdr = TxHeader::capsule_cmd(&self.tx, &sqe, data_len);
        let ddgst = if hdr.has_ddgst() {
            Some(tcp::data_digest(src(slot, ext, 0, len)).to_le_bytes())
        } else {
            None
        };
        self.txq.push_back(TxItem {
            hdr,
            tag,
            data_off: 0,
            data_len,
            ddgst,
            sent: 0,
        });
        self.inflight += 1;
        self.fresh += 1;
        self.stats.commands += 1;
        tag
    }

    /// Write out as much of the transmit queue as the socket takes.
    fn flush(&mut self, ext: &DataRef<'_>) -> Result<(), Error> {
        while !self.txq.is_empty() {
            let res = {
                let mut iov = [IoSlice::new(&[]); MAX_IOV];
                let mut n = 0;
                'items: for item in self.txq.iter() {
                    let slot = &self.slots[item.tag as usize];
                    let data = if item.data_len > 0 {
                        src(slot, ext, item.data_off, item.data_len)
                    } else {
                        &[]
                    };
                    let dg: &[u8] = match &item.ddgst {
                        Some(d) => d,
                        None => &[],
                    };
                    let mut skip = item.sent;
                    for seg in [item.hdr.as_bytes(), data, dg] {
                        if skip >= seg.len() {
                            skip -= seg.len();
                            continue;
                        }
                        iov[n] = IoSlice::new(&seg[skip..]);
                        skip = 0;
                        n += 1;
                        if n == MAX_IOV {
                            break 'items;
                        }
                    }
                }
                self.stats.syscalls += 1;
                (&self.sock).write_vectored(&iov[..n])
            };
            match res {
                Ok(0) => return Err(self.fail(Error::Closed)),
                Ok(k) => self.advance_tx(k),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.fail(e.into())),
            }
        }
        Ok(())
    }

    fn advance_tx(&mut self, mut k: usize) {
        while k > 0 {
            let Some(item) = self.txq.front_mut() else {
                break;
            };
            let rem = item.total() - item.sent;
            if k < rem {
                item.sent += k;
                return;
            }
            k -= rem;
            let item = self.txq.pop_front().expect("front exists");
            self.stats.socket_payload_bytes += item.data_len as u64;
            let slot = &mut self.slots[item.tag as usize];
            slot.tx_pending -= 1;
            if slot.tx_pending == 0 && slot.result.is_some() {
                self.finish(item.tag);
            }
        }
    }

    /// Read whatever the socket has and process it. Never blocks.
    fn recv(&mut self, ext: &mut DataRef<'_>) -> Result<(), Error> {
        let mut drained = false;
        loop {
            while self.rx_pos < self.rx_end {
                self.consume_buffered(ext)?;
            }
            self.rx_pos = 0;
            self.rx_end = 0;
            if drained {
                // The last read came back short: the socket is empty for now, and another
                // read would only return EAGAIN.
                return Ok(());
            }
            self.stats.syscalls += 1;
            let rx_read = self.rx_read;
            let mut asked = rx_read;
            let res = match self.rx.need() {
                Need::Data(n) => {
                    let rd = self.rx_data.expect("data follows a C2HData header");
                    let dst = &mut dst(&mut self.slots[rd.tag as usize], ext)[rd.pos..rd.pos + n];
                    asked += n;
                    let mut iov = [
                        IoSliceMut::new(dst),
                        IoSliceMut::new(&mut self.rxbuf[..rx_read]),
                    ];
                    match (&self.sock).read_vectored(&mut iov) {
                        Ok(k) => {
                            let dk = k.min(n);
                            let ev = self.rx.data_read(&dst[..dk]);
                            self.stats.socket_payload_bytes += dk as u64;
                            self.rx_end = k - dk;
                            if let Some(r) = self.rx_data.as_mut() {
                                r.pos += dk;
                            }
                            Ok((k, ev))
                        }
                        Err(e) => Err(e),
                    }
                }
                Need::Header(_) | Need::DataDigest(_) => {
                    (&self.sock).read(&mut self.rxbuf[..rx_read]).map(|k| {
                        self.rx_end = k;
                        (k, None)
                    })
                }
                Need::Failed => unreachable!("the queue fails with the deframer"),
            };
            if let Ok((k, _)) = res {
                drained = k < asked;
                if drained {
                    self.fresh = 0;
                }
            }
            match res {
                Ok((0, _)) => return Err(self.fail(Error::Closed)),
                Ok((_, Some(Event::DataDone(r)))) => self.on_data_done(r),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.fresh = 0;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.fail(e.into())),
            }
        }
    }

    /// Process bytes already in the receive buffer (one step).
    fn consume_buffered(&mut self, ext: &mut DataRef<'_>) -> Result<(), Error> {
        let avail = self.rx_end - self.rx_pos;
        match self.rx.need() {
            Need::Data(n) => {
                let k = n.min(avail);
                let rd = self
                    .rx_data
                    .as_mut()
                    .expect("data follows a C2HData header");
                let dst = &mut dst(&mut self.slots[rd.tag as usize], ext)[rd.pos..rd.pos + k];
                dst.copy_from_slice(&self.rxbuf[self.rx_pos..self.rx_pos + k]);
                rd.pos += k;
                self.rx_pos += k;
                self.stats.socket_payload_bytes += k as u64;
                self.stats.memcpy_bytes += k as u64;
                if let Some(Event::DataDone(r)) = self.rx.data_read(dst) {
                    self.on_data_done(r);
                }
                Ok(())
            }
            Need::Header(_) | Need::DataDigest(_) => {
                let buf = self.rx.header_buf();
                let k = buf.len().min(avail);
                buf[..k].copy_from_slice(&self.rxbuf[self.rx_pos..self.rx_pos + k]);
                self.rx_pos += k;
                match self.rx.advance(k) {
                    Ok(Some(ev)) => self.on_event(ev, ext),
                    Ok(None) => Ok(()),
                    Err(e) => Err(self.protocol_error(e)),
                }
            }
            Need::Failed => unreachable!("the queue fails with the deframer"),
        }
    }

    fn on_event(&mut self, ev: Event, ext: &DataRef<'_>) -> Result<(), Error> {
        match ev {
            Event::Header(Pdu::CapsuleResp(cqe)) => self.on_resp(&cqe),
            Event::Header(Pdu::C2HData(d)) => self.on_c2h(&d),
            Event::Header(Pdu::R2T(r)) => self.on_r2t(&r, ext),
            Event::Header(Pdu::C2HTermReq(t)) => Err(self.fail(Error::TermReq {
                fes: t.fes,
                fei: t.fei,
            })),
            Event::Header(_) => {
                Err(self.protocol_error(TcpError::new(Fes::PduSequenceError, 0, "unexpected PDU")))
            }
            Event::DataDone(r) => {
                self.on_data_done(r);
                Ok(())
            }
        }
    }

    /// The slot a PDU names, if it is waiting for that PDU.
    fn waiting_slot(&self, cid: u16) -> Option<&Slot> {
        self.slots
            .get(cid as usize)
            .filter(|s| s.active && s.result.is_none())
    }

    fn on_resp(&mut self, cqe: &Cqe) -> Result<(), Error> {
        let tag = cqe.cid();
        let Some(slot) = self.waiting_slot(tag) else {
            // CQE CID is at byte 12 of the CQE, byte 20 of the PDU.
            return Err(self.protocol_error(TcpError::new(
                Fes::InvalidHeaderField,
                20,
                "CapsuleResp for an unknown command",
            )));
        };
        let st = cqe.status();
        let res = if !st.is_success() {
            Err(CmdError::Status(st))
        } else if slot.digest_error {
            Err(CmdError::DataDigest)
        } else if slot.dir == Dir::FromCtrl && slot.xfer != slot.len {
            Err(CmdError::ShortTransfer)
        } else {
            Ok(cqe.result.get())
        };
        self.set_result(tag, res);
        Ok(())
    }

    fn on_c2h(&mut self, d: &DataPdu) -> Result<(), Error> {
        let ok = match self.waiting_slot(d.cccid) {
            None => Err(TcpError::new(
                Fes::InvalidHeaderField,
                8,
                "C2HData for an unknown command",
            )),
            Some(s) if s.dir != Dir::FromCtrl => Err(TcpError::new(
                Fes::InvalidHeaderField,
                8,
                "C2HData for a command without read data",
            )),
            Some(s) if d.datao != s.xfer || d.datao as u64 + d.datal as u64 > s.len as u64 => {
                Err(TcpError::new(
                    Fes::DataOutOfRange,
                    0,
                    "C2HData offset/length outside the transfer",
                ))
            }
            Some(_) => Ok(()),
        };
        if let Err(e) = ok {
            return Err(self.protocol_error(e));
        }
        self.rx_read = if d.datal as usize >= LARGE_PDU {
            SHORT_READ
        } else {
            RXBUF_LEN
        };
        self.rx_data = Some(RxData {
            tag: d.cccid,
            pos: d.datao as usize,
            success: d.success,
        });
        Ok(())
    }

    fn on_data_done(&mut self, r: Result<(), tcp::DigestMismatch>) {
        let rd = self
            .rx_data
            .take()
            .expect("data done follows a C2HData header");
        let slot = &mut self.slots[rd.tag as usize];
        slot.xfer = rd.pos as u32;
        if r.is_err() {
            slot.digest_error = true;
        }
        if rd.success {
            let res = if slot.digest_error {
                Err(CmdError::DataDigest)
            } else if slot.xfer != slot.len {
                Err(CmdError::ShortTransfer)
            } else {
                Ok(0)
            };
            self.set_result(rd.tag, res);
        }
    }

    fn on_r2t(&mut self, r: &R2t, ext: &DataRef<'_>) -> Result<(), Error> {
        let ok = match self.waiting_slot(r.cccid) {
            None => Err(TcpError::new(
                Fes::InvalidHeaderField,
                8,
                "R2T for an unknown command",
            )),
            Some(s) if s.dir != Dir::ToCtrl => Err(TcpError::new(
                Fes::InvalidHeaderField,
                8,
                "R2T for a command without write data",
            )),
            Some(s) if r.r2to != s.xfer || r.r2to as u64 + r.r2tl as u64 > s.len as u64 => {
                Err(TcpError::new(
                    Fes::DataOutOfRange,
                    0,
                    "R2T offset/length outside the transfer",
                ))
            }
            Some(_) => Ok(()),
        };
        if let Err(e) = ok {
            return Err(self.protocol_error(e));
        }
        let tag = r.cccid;
        let end = r.r2to + r.r2tl;
        let mut off = r.r2to;
        while off < end {
            let n = (end - off).min(self.maxh2cdata);
            let d = DataPdu {
                cccid: tag,
                ttag: r.ttag,
                datao: off,
                datal: n,
                last: off + n == end,
                success: false,
            };
            let hdr = TxHeader::h2c_data(&self.tx, &d);
            let slot = &mut self.slots[tag as usize];
            let ddgst = if hdr.has_ddgst() {
                Some(tcp::data_digest(src(slot, ext, off, n)).to_le_bytes())
            } else {
                None
            };
            slot.tx_pending += 1;
            self.txq.push_back(TxItem {
                hdr,
                tag,
                data_off: off,
                data_len: n,
                ddgst,
                sent: 0,
            });
            off += n;
        }
        self.slots[tag as usize].xfer = end;
        Ok(())
    }

    /// The target answered `tag`. PDUs of it not yet started are dropped (a target answers a
    /// write early only with an error); a PDU half-written must finish first.
    fn set_result(&mut self, tag: u16, res: Result<u64, CmdError>) {
        let slot = &mut self.slots[tag as usize];
        slot.result = Some(res);
        if slot.tx_pending > 0 {
            self.txq.retain(|it| it.tag != tag || it.sent > 0);
            let left = self.txq.iter().filter(|it| it.tag == tag).count();
            self.slots[tag as usize].tx_pending = left as u16;
        }
        if self.slots[tag as usize].tx_pending == 0 {
            self.finish(tag);
        }
    }

    fn finish(&mut self, tag: u16) {
        let slot = &mut self.slots[tag as usize];
        slot.deadline = None;
        self.stats.completed += 1;
        if matches!(slot.result, Some(Ok(_))) {
            self.stats.payload_bytes += slot.len as u64;
        }
        if slot.ext {
            self.ext_done.push(tag);
        } else {
            self.done.push_back(tag);
        }
    }

    fn release(&mut self, tag: u16) -> (u64, Result<u64, CmdError>, SlotBuf) {
        let slot = std::mem::take(&mut self.slots[tag as usize]);
        self.free.push(tag);
        self.inflight -= 1;
        (
            slot.user_data,
            slot.result.unwrap_or(Err(CmdError::QueueFailed)),
            slot.buf,
        )
    }

    /// We found the target breaking the protocol: tell it (best effort) and fail.
    fn protocol_error(&mut self, e: TcpError) -> Error {
        let term = TermReq::new(&e, self.rx.offending_header()).encode(true);
        // The socket is non-blocking; the TermReq is advisory and may not fit. The connection
        // is closed right after anyway.
        let _ = (&self.sock).write(&term);
        self.fail(Error::Protocol(e))
    }

    /// Fail the queue: complete everything in flight, close the socket.
    fn fail(&mut self, e: Error) -> Error {
        if self.failed.is_none() {
            let timeout = matches!(e, Error::Timeout(..));
            tracing::warn!(qid = self.qid, error = %e, "NVMe/TCP queue failed");
            self.failed = Some(Arc::new(e));
            self.txq.clear();
            self.rx_data = None;
            let _ = self.sock.shutdown(Shutdown::Both);
            let err = if timeout {
                CmdError::Timeout
            } else {
                CmdError::QueueFailed
            };
            for tag in 0..self.slots.len() as u16 {
                let s = &mut self.slots[tag as usize];
                if !s.active || (s.result.is_some() && s.tx_pending == 0) {
                    continue;
                }
                s.tx_pending = 0;
                if s.result.is_none() {
                    s.result = Some(Err(err));
                }
                self.finish(tag);
            }
        }
        self.failed_error().expect("set above")
    }

    /// Wait for the socket: with `spin`, return at once (checking the command deadlines every
    /// 1024th time); else block until the socket is readable (or writable, with data queued), a
    /// command times out, or `until`.
    fn wait(&mut self, until: Option<Instant>, spin: bool) -> Result<(), Error> {
        self.spins = self.spins.wrapping_add(1);
        if spin && self.spins % 1024 != 0 {
            std::hint::spin_loop();
            return Ok(());
        }
        let now = Instant::now();
        let oldest = self
            .slots
            .iter()
            .filter(|s| s.active && s.result.is_none())
            .filter_map(|s| s.deadline)
            .min();
        if let Some(d) = oldest {
            if d <= now {
                return Err(self.fail(Error::Timeout(self.timeout, "a command completion")));
            }
        }
        if spin {
            return Ok(());
        }
        let wake = match (oldest, until) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(now + self.timeout),
        };
        let ms = wake
            .saturating_duration_since(now)
            .as_millis()
            .clamp(1, i32::MAX as u128) as i32;
        let mut ev = PollFlags::POLLIN;
        if !self.txq.is_empty() {
            ev |= PollFlags::POLLOUT;
        }
        self.stats.syscalls += 1;
        let mut fds = [PollFd::new(self.sock.as_fd(), ev)];
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
            Err(e) => Err(self.fail(Error::Io(io::Error::from(e)))),
        }
    }

    /// Send queued PDUs and process what arrived, without blocking.
    fn pump(&mut self, ext: &mut DataRef<'_>) -> Result<(), Error> {
        if let Some(e) = self.failed_error() {
            return Err(e);
        }
        self.flush(ext)?;
        self.recv(ext)?;
        // Received R2Ts queue H2CData PDUs: send them now rather than after the next wait.
        self.flush(ext)
    }

    /// Collect completions into `out` (appended), waiting until at least `min` are available
    /// (at most as many as are in flight) or `timeout` passes (`None`: the queue's I/O timeout
    /// bounds every wait through the command deadlines). Returns how many were added.
    ///
    /// When the queue fails, the completions of every command it held are returned (with
    /// [`CmdError::QueueFailed`]); once none are left, `reap` returns the failure.
    pub fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error> {
        let until = timeout.map(|t| Instant::now() + t);
        let want = min.min(self.inflight);
        let mut got = 0;
        // Skip the first read when it can only return EAGAIN (see `fresh`) and this call
        // will wait in the kernel at once: `wait` polls the socket, and the pass after it
        // reads. At QD1 that makes an I/O three system calls (send, poll, read) instead of
        // four. A queue that spins first reads at once.
        let mut window = SpinWindow::default();
        let mut skip_rx = want > 0
            && self.spin == Spin::NEVER
            && timeout.is_none_or(|t| t >= Duration::from_millis(1))
            && self.fresh >= self.inflight
            && self.rx_pos == self.rx_end
            && self.done.is_empty();
        loop {
            let skipped = std::mem::take(&mut skip_rx);
            let pumped = if skipped {
                match self.failed_error() {
                    Some(e) => Err(e),
                    None => self.flush(&DataRef::None),
                }
            } else {
                self.pump(&mut DataRef::None)
            };
            while let Some(tag) = self.done.pop_front() {
                let (user_data, result, buf) = self.release(tag);
                let buf = match buf {
                    SlotBuf::Owned(v) => Some(v),
                    _ => None,
                };
                out.push(Completion {
                    tag,
                    user_data,
                    result,
                    buf,
                });
                got += 1;
            }
            if let Err(e) = pumped {
                return if got > 0 { Ok(got) } else { Err(e) };
            }
            if got >= want {
                return Ok(got);
            }
            // After a pass without a read, wait (poll) once whatever the time: never return
            // without having looked at the socket.
            if !skipped && until.is_some_and(|u| Instant::now() >= u) {
                return Ok(got);
            }
            // A failure here (a command timed out) completed everything in flight: the next
            // pass hands those completions out, then reports the failure.
            let spin = !skipped && window.spin(self.spin);
            let _ = self.wait(until, spin);
        }
    }

    /// Collect completions that are ready, without waiting.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<usize, Error> {
        self.reap(out, 0, Some(Duration::ZERO))
    }

    /// Run commands whose data are consecutive pieces of one borrowed buffer, as many at a
    /// time as there are free tags, and wait for all of them. `cmds` yields `(sqe, offset,
    /// length)` within `ext`. Returns the CQE result of the last command (for single-command
    /// use) or the first failure.
    pub(crate) fn run_borrowed(
        &mut self,
        what: &'static str,
        dir: Dir,
        ext: &mut DataRef<'_>,
        cmds: &mut dyn Iterator<Item = (Sqe, usize, u32)>,
    ) -> Result<u64, Error> {
        let mut pending = 0usize;
        let mut first_err: Option<CmdError> = None;
        let mut last = 0u64;
        let mut next = cmds.next();
        let mut window = SpinWindow::default();
        loop {
            if let Some(e) = self.failed_error() {
                return Err(e);
            }
            while first_err.is_none() && !self.free.is_empty() {
                let Some((sqe, off, len)) = next.take() else {
                    break;
                };
                self.start(sqe, dir, len, SlotBuf::Ext(off), 0, ext);
                pending += 1;
                next = cmds.next();
            }
            if pending == 0 {
                break;
            }
            let pumped = self.pump(ext);
            while let Some(tag) = self.ext_done.pop() {
                let (_, res, _) = self.release(tag);
                pending -= 1;
                match res {
                    Ok(v) => last = v,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            let all_done = pending == 0 && (first_err.is_some() || next.is_none());
            if let Err(e) = pumped {
                // The connection died. Commands that completed before stay completed; if ours
                // all did, report them, else the queue failure (more telling than "failed").
                return match first_err {
                    None if all_done => Ok(last),
                    Some(s @ CmdError::Status(_)) => Err(Error::from_cmd(what, s)),
                    _ => Err(e),
                };
            }
            if all_done {
                break;
            }
            if pending > 0 {
                // On failure the pump of the next pass reports it, after collecting the slots.
                let spin = window.spin(self.spin);
                let _ = self.wait(None, spin);
            }
        }
        match first_err {
            Some(e) => Err(Error::from_cmd(what, e)),
            None => Ok(last),
        }
    }

    /// Run one command with an optional borrowed buffer and wait for it.
    pub(crate) fn execute(
        &mut self,
        what: &'static str,
        sqe: Sqe,
        mut ext: DataRef<'_>,
    ) -> Result<u64, Error> {
        let (dir, len) = match &ext {
            DataRef::None => (Dir::None, 0),
            DataRef::Read(b) => (Dir::FromCtrl, b.len()),
            DataRef::Write(b) => (Dir::ToCtrl, b.len()),
        };
        let len = u32::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("{what}: {len} bytes")))?;
        let mut one = std::iter::once((sqe, 0usize, len));
        self.run_borrowed(what, dir, &mut ext, &mut one)
    }
}

/// The bytes `[off, off + len)` of a slot's data, for sending.
fn src<'a>(slot: &'a Slot, ext: &'a DataRef<'_>, off: u32, len: u32) -> &'a [u8] {
    let (off, len) = (off as usize, len as usize);
    match (&slot.buf, ext) {
        (SlotBuf::Owned(v), _) => &v[off..off + len],
        (SlotBuf::Ext(base), DataRef::Write(b)) => &b[base + off..base + off + len],
        // Only write slots have transmit data, and borrowed-buffer slots exist only inside
        // `run_borrowed`, which passes its buffer to every pump.
        _ => unreachable!("write data of a slot without a write buffer"),
    }
}

/// A slot's whole receive buffer.
fn dst<'a>(slot: &'a mut Slot, ext: &'a mut DataRef<'_>) -> &'a mut [u8] {
    let len = slot.len as usize;
    match (&mut slot.buf, ext) {
        (SlotBuf::Owned(v), _) => &mut v[..len],
        (SlotBuf::Ext(base), DataRef::Read(b)) => &mut b[*base..*base + len],
        // C2HData is accepted only for read slots (`on_c2h`), and borrowed-buffer slots exist
        // only inside `run_borrowed`, which passes its buffer to every pump.
        _ => unreachable!("read data for a slot without a read buffer"),
    }
}

/// Framing unit tests: the queue against a scripted in-process socket peer that speaks just
/// enough NVMe/TCP (through `nvme::tcp`) to drive one path each. This is not interoperability
/// testing; that runs against the real target in `tests/`.
#[cfg(test)]
mod tests {
    use super::*;
    use nvme::tcp::{IcResp, OwnedPdu, PduCollector, TxConfig};
    use nvme::Status;
    use std::net::TcpListener;
    use std::thread;

    struct Peer {
        sock: TcpStream,
        rx: PduCollector,
        pending: VecDeque<OwnedPdu>,
        tx: TxConfig,
    }

    impl Peer {
        fn recv(&mut self) -> OwnedPdu {
            let mut buf = [0u8; 65536];
            loop {
                if let Some(p) = self.pending.pop_front() {
                    return p;
                }
                let n = self.sock.read(&mut buf).expect("peer read");
                assert!(n > 0, "initiator closed the connection");
                self.pending.extend(
                    self.rx
                        .push(&buf[..n])
                        .expect("valid PDUs from the initiator"),
                );
            }
        }
        fn send(&mut self, pdu: Pdu, data: &[u8]) {
            self.sock
                .write_all(&pdu.encode(&self.tx, data))
                .expect("peer write");
        }
        fn cmd(&mut self) -> (Sqe, Vec<u8>) {
            match self.recv() {
                OwnedPdu {
                    pdu: Pdu::CapsuleCmd { sqe, .. },
                    data,
                    ..
                } => (sqe, data),
                p => panic!("expected a command, got {p:?}"),
            }
        }
        /// Keep the connection open until the initiator closes it.
        fn hold(mut self) {
            let mut buf = [0u8; 4096];
            while matches!(self.sock.read(&mut buf), Ok(n) if n > 0) {}
        }
        fn resp(&mut self, cid: u16, status: Status, result: u64) {
            self.send(Pdu::CapsuleResp(Cqe::new(cid, status, result)), &[]);
        }
    }

    /// Listen, then in a thread accept one connection, answer the ICReq with `ic` and run `f`.
    fn peer(
        ic: IcResp,
        f: impl FnOnce(Peer) + Send + 'static,
    ) -> (SocketAddr, thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = thread::spawn(move || {
            let (sock, _) = l.accept().unwrap();
            let mut p = Peer {
                sock,
                rx: PduCollector::new(RxConfig {
                    max_data_pdu: 1 << 20,
                    max_incapsule: 1 << 20,
                    ..RxConfig::controller()
                }),
                pending: VecDeque::new(),
                tx: TxConfig::default(),
            };
            let req = match p.recv().pdu {
                Pdu::IcReq(r) => r,
                other => panic!("expected ICReq, got {other:?}"),
            };
            assert_eq!((req.pfv, req.hpda, req.maxr2t), (0, 0, 0));
            p.sock.write_all(&ic.encode()).unwrap();
            p.rx.deframer.set_digests(ic.hdgst, ic.ddgst);
            p.tx = TxConfig {
                hdgst: ic.hdgst,
                ddgst: ic.ddgst,
                pda: 0,
            };
            f(p)
        });
        (addr, h)
    }

    fn ic(maxh2cdata: u32) -> IcResp {
        IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: false,
            ddgst: false,
            maxh2cdata,
        }
    }

    fn params(timeout_ms: u64) -> QueueParams {
        QueueParams {
            qid: 1,
            depth: 8,
            hdgst: false,
            ddgst: false,
            timeout: Duration::from_millis(timeout_ms),
            spin: Spin::NEVER,
        }
    }

    fn read_sqe(nlb: u32) -> Sqe {
        let mut s = Sqe::new(nvme::opcode::io::READ, 0);
        s.nsid = 1.into();
        s.cdw12 = (nlb - 1).into();
        s
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn reap_all(q: &mut IoQueue) -> Vec<Completion> {
        let mut out = Vec::new();
        while q.in_flight() > 0 {
            q.reap(&mut out, 1, None).unwrap();
        }
        out
    }

    #[test]
    fn read_split_in_c2h_pdus_then_response() {
        let (addr, h) = peer(ic(4096), |mut p| {
            let (sqe, _) = p.cmd();
            assert_eq!(
                Sgl::decode(&sqe.dptr).unwrap(),
                Sgl::Transport { len: 8192 }
            );
            assert!(sqe.uses_sgl());
            let data = pattern(8192, 1);
            for (i, part) in data.chunks(4096).enumerate() {
                let d = DataPdu {
                    cccid: sqe.cid(),
                    datao: i as u32 * 4096,
                    datal: 4096,
                    last: i == 1,
                    ..Default::default()
                };
                p.send(Pdu::C2HData(d), part);
            }
            p.resp(sqe.cid(), Status::SUCCESS, 0x55);
        });
        let mut q = IoQueue::open(&addr, &params(5000)).unwrap();
        let tag = q
            .submit(read_sqe(2), Data::FromController(vec![0; 8192]), 77)
            .unwrap();
        let done = reap_all(&mut q);
        h.join().unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].tag, done[0].user_data, done[0].result),
            (tag, 77, Ok(0x55))
        );
        assert_eq!(done[0].buf.as_deref(), Some(&pattern(8192, 1)[..]));
        let s = q.stats();
        assert_eq!(
            (
                s.commands,
                s.completed,
                s.payload_bytes,
                s.socket_payload_bytes
            ),
            (1, 1, 8192, 8192)
        );
        assert_eq!(q.free_slots(), 8);
    }

    #[test]
    fn read_data_goes_straight_into_the_buffer_when_it_arrives_later() {
        let (addr, h) = peer(ic(65536), |mut p| {
            let (sqe, _) = p.cmd();
            let data = pattern(32768, 2);
            let d = DataPdu {
                cccid: sqe.cid(),
                datao: 0,
                datal: 32768,
                last: true,
                success: true,
                ..Default::default()
            };
            let wire = Pdu::C2HData(d).encode(&p.tx, &data);
            // Header and a little data now, the rest once the initiator waits in poll(2).
            p.sock.write_all(&wire[..24 + 100]).unwrap();
            thread::sleep(Duration::from_millis(100));
            p.sock.write_all(&wire[24 + 100..]).unwrap();
        });
        let mut q = IoQueue::open(&addr, &params(5000)).unwrap();
        q.submit(read_sqe(8), Data::FromController(vec![0; 32768]), 0)
            .unwrap();
        let done = reap_all(&mut q);
        h.join().unwrap();
        // C2HData with SUCCESS: no CapsuleResp, result 0.
        assert_eq!(done[0].result, Ok(0));
        assert_eq!(done[0].buf.as_deref(), Some(&pattern(32768, 2)[..]));
        let s = q.stats();
        assert_eq!(s.socket_payload_bytes, 32768);
        assert!(
            s.memcpy_bytes <= 100,
            "only the bytes that came with the header are copied: {s:?}"
        );
        assert!(s.copies_per_byte() < 1.01);
    }

    #[test]
    fn small_write_in_capsule_large_write_by_r2t() {
        let big = pattern(10000, 3);
        let small = pattern(512, 4);
        let (b2, s2) = (big.clone(), small.clone());
        let (addr, h) = peer(ic(4096), move |mut p| {
            // In-capsule write.
            let (sqe, data) = p.cmd();
            assert_eq!(
                Sgl::decode(&sqe.dptr).unwrap(),
                Sgl::InCapsule {
                    offset: 0,
                    len: 512
                }
            );
            assert_eq!(data, s2);
            p.resp(sqe.cid(), Status::SUCCESS, 0);
            // Large write: two R2Ts, H2CData cut at MAXH2CDATA.
            let (sqe, data) = p.cmd();
            assert!(data.is_empty());
            assert_eq!(
                Sgl::decode(&sqe.dptr).unwrap(),
                Sgl::Transport { len: 10000 }
            );
            let mut got = vec![0u8; 10000];
            for (r2to, r2tl, ttag) in [(0u32, 6000u32, 5u16), (6000, 4000, 6)] {
                p.send(
                    Pdu::R2T(R2t {
                        cccid: sqe.cid(),
                        ttag,
                        r2to,
                        r2tl,
                    }),
                    &[],
                );
                let mut off = r2to;
                while off < r2to + r2tl {
                    match p.recv() {
                        OwnedPdu {
                            pdu: Pdu::H2CData(d),
                            data,
                            ..
                        } => {
                            assert_eq!((d.cccid, d.ttag, d.datao), (sqe.cid(), ttag, off));
                            assert!(d.datal <= 4096);
                            assert_eq!(d.last, off + d.datal == r2to + r2tl);
                            got[off as usize..][..data.len()].copy_from_slice(&data);
                            off += d.datal;
                        }
                        other => panic!("expected H2CData, got {other:?}"),
                    }
                }
            }
            assert_eq!(got, b2);
            p.resp(sqe.cid(), Status::SUCCESS, 0);
        });
        let mut q = IoQueue::open(&addr, &params(5000)).unwrap();
        q.set_icd_max(1024);
        let mut w = read_sqe(1);
        w.opcode = nvme::opcode::io::WRITE;
        q.submit(w, Data::ToController(small), 1).unwrap();
        let first = reap_all(&mut q);
        q.submit(w, Data::ToController(big.clone()), 2).unwrap();
        let second = reap_all(&mut q);
        h.join().unwrap();
        assert_eq!(first[0].result, Ok(0));
        assert_eq!((second[0].user_data, second[0].result), (2, Ok(0)));
        assert_eq!(second[0].buf.as_deref(), Some(&big[..]));
        assert_eq!(q.stats().socket_payload_bytes, 10512);
        assert_eq!(q.stats().memcpy_bytes, 0);
    }

    #[test]
    fn borrowed_buffer_pieces_complete_out_of_order() {
        let (addr, h) = peer(ic(4096), |mut p| {
            let cmds: Vec<Sqe> = (0..3).map(|_| p.cmd().0).collect();
            for (i, sqe) in cmds.iter().enumerate().rev() {
                let d = DataPdu {
                    cccid: sqe.cid(),
                    datao: 0,
                    datal: 4096,
                    last: true,
                    ..Default::default()
                };
                p.send(Pdu::C2HData(d), &pattern(4096, i as u8));
                p.resp(sqe.cid(), Status::SUCCESS, 0);
            }
            p.hold();
        });
        let mut q = IoQueue::open(&addr, &params(5000)).unwrap();
        let mut buf = vec![0u8; 3 * 4096];
        let mut cmds = (0..3usize).map(|i| (read_sqe(1), i * 4096, 4096u32));
        q.run_borrowed(
            "Read",
            Dir::FromCtrl,
            &mut DataRef::Read(&mut buf),
            &mut cmds,
        )
        .unwrap();
        assert!(!q.is_failed(), "{:?}", q.error());
        assert_eq!(q.in_flight(), 0);
        drop(q);
        h.join().unwrap();
        for i in 0..3 {
            assert_eq!(&buf[i * 4096..(i + 1) * 4096], &pattern(4096, i as u8)[..]);
        }
    }

    #[test]
    fn error_status_comes_back_with_the_buffer() {
        let (addr, h) = peer(ic(4096), |mut p| {
            let (sqe, _) = p.cmd();
            p.resp(sqe.cid(), Status::LBA_RANGE.dnr(), 0);
        });
        let mut q = IoQueue::open(&addr, &params(5000)).unwrap();
        q.submit(read_sqe(1), Data::FromController(vec![0; 4096]), 0)
            .unwrap();
        let done = reap_all(&mut q);
        h.join().unwrap();
        assert_eq!(
            done[0].result,
            Err(CmdError::Status(Status::LBA_RANGE.dnr()))
        );
        assert_eq!(done[0].buf.as_ref().map(Vec::len), Some(4096));
        // The synchronous path turns it into an error carrying the status.
        let e = Error::from_cmd("Read", done[0].result.unwrap_err());
        assert_eq!(e.status(), Some(Status::LBA_RANGE.dnr()));
    }

    #[test]
    fn digests_and_a_bad_data_digest() {
        let ic = IcResp {
            hdgst: true,
            ddgst: true,
            ..ic(4096)
        };
        let (addr, h) = peer(ic, |mut p| {
            let good = p.cmd().0;
            let bad = p.cmd().0;
            let d = DataPdu {
                cccid: good.cid(),
                datao: 0,
                datal: 4096,
                last: true,
                ..Default::default()
            };
            p.send(Pdu::C2HData(d), &pattern(4096, 9));
            p.resp(good.cid(), Status::SUCCESS, 0);
            let d = DataPdu {
                cccid: bad.cid(),
                ..d
            };
            let mut wire = Pdu::C2HData(d).encode(&p.tx, &pattern(4096, 9));
            let n = wire.len();
            wire[n - 1] ^= 0x5a;
            p.sock.write_all(&wire).unwrap();
            p.resp(bad.cid(), Status::SUCCESS, 0);
            p.hold();
        });
        let mut q = IoQueue::open(
            &addr,
            &QueueParams {
                hdgst: true,
                ddgst: true,
                ..params(5000)
            },
        )
        .unwrap();
        q.submit(read_sqe(1), Data::FromController(vec![0; 4096]), 1)
            .unwrap();
        q.submit(read_sqe(1), Data::FromController(vec![0; 4096]), 2)
            .unwrap();
        let mut done = reap_all(&mut q);
        done.sort_by_key(|c| c.user_data);
        assert_eq!(done[0].result, Ok(0));
        assert_eq!(done[0].buf.as_deref(), Some(&pattern(4096, 9)[..]));
        assert_eq!(done[1].result, Err(CmdError::DataDigest));
        assert!(
            !q.is_failed(),
            "a data digest error is not fatal: {:?}",
            q.error()
        );
        drop(q);
        h.join().unwrap();
    }

    #[test]
    fn icresp_must_echo_the_digests() {
        let bad = IcResp {
            ddgst: true,
            ..ic(4096)
        };
        let (addr, h) = peer(bad, |mut p| {
            // The initiator answers with an H2CTermReq and closes.
            let mut buf = [0u8; 256];
            let n = p.sock.read(&mut buf).unwrap();
            assert_eq!(buf[0], tcp::pdu_type::H2C_TERM_REQ);
            assert!(n >= 24);
        });
        match IoQueue::open(&addr, &params(5000)) {
            Err(Error::Protocol(e)) => assert_eq!(e.fes, Fes::UnsupportedParameter),
            other => panic!("{other:?}"),
        }
        h.join().unwrap();
    }

    #[test]
    fn target_closing_fails_the_queue_without_hanging() {
        let (addr, h) = peer(ic(4096), |mut p| {
            p.cmd();
            p.cmd();
            // Drop: the socket closes with two commands outstanding.
        });
        let mut q = IoQueue::open(&addr, &params(30_000)).unwrap();
        q.submit(read_sqe(1), Data::FromController(vec![0; 4096]), 1)
            .unwrap();
        q.submit(read_sqe(1), Data::FromController(vec![0; 4096]), 2)
            .unwrap();
        let t = Instant::now();
        let done = reap_all(&mut q);
        h.join().unwrap();
        assert!(t.elapsed() < Duration::from_secs(10));
        assert_eq!(done.len(), 2);
        assert!(done
            .iter()
            .all(|c| c.result == Err(CmdError::QueueFailed) && c.buf.is_some()));
        assert!(matches!(q.error(), Some(Error::Closed)));
        let e = q
            .submit(read_sqe(1), Data::FromController(vec![0; 16]), 3)
            .unwrap_err();
        assert!(matches!(e.error, Error::QueueFailed { qid: 1, .. }));
        assert_eq!(e.buf.map(|b| b.len()), Some(16));
        assert!(matches!(
            q.reap(&mut Vec::new(), 1, None),
            Err(Error::QueueFailed { .. })
        ));
    }

    #[test]
    fn silent_target_times_out() {
        let (addr, h) = peer(ic(4096), |mut p| {
            p.cmd();
            thread::sleep(Duration::from_millis(1500));
        });
        let mut q = IoQueue::open(&addr, &params(300)).unwrap();
        q.submit(read_sqe(1), Data::FromController(vec![0; 4096]), 1)
            .unwrap();
        let t = Instant::now();
        let done = reap_all(&mut q);
        assert!(
            t.elapsed() < Duration::from_millis(1200),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(done[0].result, Err(CmdError::Timeout));
        assert!(matches!(q.error(), Some(Error::Timeout(..))));
        // The synchronous path reports the failure instead of waiting.
        assert!(q.execute("Flush", read_sqe(1), DataRef::None).is_err());
        h.join().unwrap();
    }

    #[test]
    fn response_for_an_unknown_command_is_a_protocol_error() {
        let (addr, h) = peer(ic(4096), |mut p| {
            let (sqe, _) = p.cmd();
            p.resp(sqe.cid() + 3, Status::SUCCESS, 0);
            match p.recv().pdu {
                Pdu::H2CTermReq(t) => {
                    assert_eq!((t.fes(), t.fei), (Some(Fes::InvalidHeaderField), 20));
                    assert_eq!(t.offending_header()[0], tcp::pdu_type::CAPSULE_RESP);
                }
                other => panic!("expected H2CTermReq, got {other:?}"),
            }
        });
        let mut q = IoQueue::open(&addr, &params(5000)).unwrap();
        q.submit(read_sqe(1), Data::FromController(vec![0; 4096]), 1)
            .unwrap();
        let done = reap_all(&mut q);
        h.join().unwrap();
        assert_eq!(done[0].result, Err(CmdError::QueueFailed));
        assert!(matches!(q.error(), Some(Error::Protocol(_))));
    }

    #[test]
    fn queue_full_returns_the_buffer() {
        let (addr, h) = peer(ic(4096), |mut p| {
            let cmds: Vec<Sqe> = (0..2).map(|_| p.cmd().0).collect();
            for s in cmds {
                p.resp(s.cid(), Status::SUCCESS, 0);
            }
        });
        let mut q = IoQueue::open(
            &addr,
            &QueueParams {
                depth: 2,
                ..params(5000)
            },
        )
        .unwrap();
        q.submit(read_sqe(1), Data::None, 1).unwrap();
        q.submit(read_sqe(1), Data::None, 2).unwrap();
        let e = q
            .submit(read_sqe(1), Data::ToController(vec![1, 2, 3]), 3)
            .unwrap_err();
        assert!(matches!(e.error, Error::QueueFull));
        assert_eq!(e.buf, Some(vec![1, 2, 3]));
        assert_eq!(reap_all(&mut q).len(), 2);
        h.join().unwrap();
    }
}
