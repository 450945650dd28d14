//! The rdma_cm thread: owns the event channel and the listening ids, routes each
//! CONNECT_REQUEST to a poller and forwards later CM events of a connection to the poller that
//! owns it. It also reads the devices' async events, to forward COMM_EST to rdma_cm
//! (`rdma_notify`, as nvmet does) and fatal QP events to the owning poller.
//!
//! rdma_cm calls are slow-path; the I/O path never waits for this thread.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use ::rdma::{AsyncElement, AsyncEventType, CmEvent, CmEventType, CmId, Context, EventChannel};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nvme::rdma::{CmReject, CmRequest};
use tracing::{debug, info, warn};

use super::conns::RdmaMsg;
use super::CmNote;
use crate::transport::conns::PollerHandle;

/// Tags of listening ids have this bit set; connection tags count up from 1 below it.
pub(super) const LISTENER_TAG: u64 = 1 << 62;
/// How often the thread looks at the stop flag and at the pollers' notes.
const WAIT: Duration = Duration::from_millis(100);

/// A bound, listening rdma_cm id.
pub(super) struct Listener {
    pub id: CmId,
    pub addr: SocketAddr,
}

struct Entry {
    poller: usize,
    /// Shared with the owning poller; the id is destroyed when both have let go.
    id: Arc<CmId>,
    qp_num: Option<u32>,
}

pub(super) struct CmThread {
    pub ch: EventChannel,
    pub listeners: Vec<Listener>,
    pub pollers: Arc<Vec<PollerHandle>>,
    pub notes: mpsc::Receiver<CmNote>,
    pub stop: Arc<AtomicBool>,
    conns: HashMap<u64, Entry>,
    devices: Vec<Arc<Context>>,
    next_tag: u64,
    /// Listener tags continue after the ones bound at start.
    next_listener: u64,
    rr: usize,
}

impl CmThread {
    pub fn new(
        ch: EventChannel,
        listeners: Vec<Listener>,
        pollers: Arc<Vec<PollerHandle>>,
        notes: mpsc::Receiver<CmNote>,
        stop: Arc<AtomicBool>,
    ) -> CmThread {
        CmThread {
            next_listener: listeners.len() as u64,
            ch,
            listeners,
            pollers,
            notes,
            stop,
            conns: HashMap::new(),
            devices: Vec::new(),
            next_tag: 1,
            rr: 0,
        }
    }

    pub fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            self.wait();
            loop {
                match self.ch.try_get_event() {
                    Ok(Some(ev)) => self.on_event(ev),
                    Ok(None) => break,
                    Err(e) => {
                        warn!(error = %e, "reading an rdma_cm event failed");
                        std::thread::sleep(WAIT);
                        break;
                    }
                }
            }
            self.async_events();
            while let Ok(n) = self.notes.try_recv() {
                match n {
                    CmNote::Accepted { tag, qp_num } => {
                        if let Some(e) = self.conns.get_mut(&tag) {
                            e.qp_num = Some(qp_num);
                        }
                    }
                    CmNote::Released { tag } => {
                        self.conns.remove(&tag);
                    }
                    CmNote::Listen { addr, reply } => {
                        let _ = reply.send(self.listen(addr));
                    }
                    CmNote::Unlisten { addr } => {
                        let before = self.listeners.len();
                        // Dropping the id destroys it: no new connections there.
                        self.listeners.retain(|l| l.addr != addr);
                        if self.listeners.len() < before {
                            info!(address = %addr, "NVMe/RDMA listener closed (connected hosts stay)");
                        }
                    }
                }
            }
        }
        for l in &self.listeners {
            info!(address = %l.addr, "NVMe/RDMA listener closed");
        }
    }

    /// A new listening id on the thread's event channel (configuration reload).
    fn listen(&mut self, addr: SocketAddr) -> Result<SocketAddr, ::rdma::Error> {
        let tag = LISTENER_TAG | self.next_listener;
        self.next_listener += 1;
        let id = self.ch.create_id(tag)?;
        id.bind_addr(addr)?;
        id.listen(super::BACKLOG)?;
        let bound = id.local_addr().unwrap_or(addr);
        info!(address = %bound, "NVMe/RDMA listener up");
        self.listeners.push(Listener { id, addr: bound });
        Ok(bound)
    }

    /// Sleeps until the event channel or a device's async descriptor is readable, or `WAIT`.
    fn wait(&self) {
        let mut raw = vec![self.ch.fd()];
        raw.extend(self.devices.iter().map(|d| d.async_fd()));
        // SAFETY: every descriptor belongs to an object this thread owns (the channel, the
        // contexts), all alive for the duration of the poll call.
        let fds: Vec<BorrowedFd<'_>> = raw
            .iter()
            .map(|&fd| unsafe { BorrowedFd::borrow_raw(fd) })
            .collect();
        let mut pfds: Vec<PollFd<'_>> = fds
            .iter()
            .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
            .collect();
        let _ = nix::poll::poll(&mut pfds, PollTimeout::from(WAIT.as_millis() as u16));
    }

    fn on_event(&mut self, mut ev: CmEvent) {
        let kind = ev.event_type();
        let tag = ev.tag();
        if kind == CmEventType::ConnectRequest {
            if let Some(id) = ev.take_new_id() {
                self.on_connect_request(id, &ev);
            }
            return;
        }
        if tag & LISTENER_TAG != 0 {
            self.listener_event(tag, kind, ev.status());
            return;
        }
        let Some(e) = self.conns.get(&tag) else {
            debug!(tag, event = %kind, "CM event for a connection already released");
            return;
        };
        match kind {
            CmEventType::Established
            | CmEventType::Disconnected
            | CmEventType::TimewaitExit
            | CmEventType::DeviceRemoval
            | CmEventType::AddrChange
            | CmEventType::ConnectError
            | CmEventType::Unreachable
            | CmEventType::Rejected => {
                self.pollers[e.poller].send_rdma(RdmaMsg::Event {
                    tag,
                    kind,
                    status: ev.status(),
                });
            }
            other => debug!(tag, event = %other, "CM event ignored"),
        }
    }

    fn listener_event(&mut self, tag: u64, kind: CmEventType, status: i32) {
        let Some(i) = self.listeners.iter().position(|l| l.id.tag() == tag) else {
            debug!(tag, event = %kind, "event for an unknown listener");
            return;
        };
        match kind {
            CmEventType::DeviceRemoval => {
                // The device under the listener is going away: the id must be destroyed
                // (nvmet lets the CM destroy it by returning 1).
                let l = self.listeners.remove(i);
                warn!(address = %l.addr, "RDMA device removed: NVMe/RDMA listener closed");
            }
            other => {
                warn!(address = %self.listeners[i].addr, event = %other, status, "listener event")
            }
        }
    }

    fn on_connect_request(&mut self, id: CmId, ev: &CmEvent) {
        let pdata = ev.private_data();
        // Decoded here only to route by queue id; the poller checks the request in full.
        let req = match CmRequest::decode(pdata) {
            Ok(r) => r,
            Err(st) => {
                info!(peer = ?id.peer_addr(), status = %st, "rejecting NVMe/RDMA connect request");
                if let Err(e) = id.reject(&CmReject::new(st).encode()) {
                    debug!(error = %e, "rdma_reject failed");
                }
                return;
            }
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        id.set_tag(tag);
        self.note_device(&id);
        let p = self.pick(req.qid);
        let id = Arc::new(id);
        self.conns.insert(
            tag,
            Entry {
                poller: p,
                id: id.clone(),
                qp_num: None,
            },
        );
        debug!(tag, peer = ?id.peer_addr(), qid = req.qid, poller = p, "NVMe/RDMA connect request");
        let sent = self.pollers[p].send_rdma(RdmaMsg::Connect {
            tag,
            id,
            private_data: pdata.to_vec(),
            peer_ird: ev.initiator_depth(),
        });
        if !sent {
            warn!(
                poller = p,
                "RDMA poller is gone: dropping a connect request"
            );
            self.conns.remove(&tag);
        }
    }

    /// I/O queues go to poller `(qid - 1) % n`, so one controller's queues spread over the
    /// pollers; admin queues round robin.
    fn pick(&mut self, qid: u16) -> usize {
        let n = self.pollers.len();
        if qid == 0 {
            self.rr = (self.rr + 1) % n;
            self.rr
        } else {
            (usize::from(qid) - 1) % n
        }
    }

    /// Watches the async events of the connection's device from now on.
    fn note_device(&mut self, id: &CmId) {
        if self.devices.iter().any(|d| id.is_on(d)) {
            return;
        }
        match id.context() {
            Ok(Some(ctx)) => self.devices.push(ctx),
            Ok(None) => {}
            Err(e) => debug!(error = %e, "device of a connect request"),
        }
    }

    fn async_events(&mut self) {
        for d in &self.devices {
            loop {
                let ev = match d.try_get_async_event() {
                    Ok(Some(ev)) => ev,
                    Ok(None) => break,
                    Err(e) => {
                        debug!(device = %d.name(), error = %e, "reading async events failed");
                        break;
                    }
                };
                let AsyncElement::QpNum(qpn) = ev.element else {
                    match ev.kind {
                        AsyncEventType::DeviceFatal => {
                            warn!(device = %d.name(), "RDMA device reported a fatal error")
                        }
                        AsyncEventType::PortErr => {
                            warn!(device = %d.name(), element = ?ev.element, "RDMA port down")
                        }
                        k => debug!(device = %d.name(), kind = ?k, "async event"),
                    }
                    continue;
                };
                let Some((&tag, e)) = self.conns.iter().find(|(_, e)| e.qp_num == Some(qpn)) else {
                    debug!(qpn, kind = ?ev.kind, "async event for an unknown QP");
                    continue;
                };
                match ev.kind {
                    AsyncEventType::CommEst => {
                        // Data arrived before the CM saw the connection established (a lost
                        // RTU): tell rdma_cm, which then reports ESTABLISHED.
                        if let Err(err) = e.id.notify_established() {
                            debug!(tag, error = %err, "rdma_notify failed");
                        }
                    }
                    AsyncEventType::QpFatal
                    | AsyncEventType::QpReqErr
                    | AsyncEventType::QpAccessErr => {
                        let what = match ev.kind {
                            AsyncEventType::QpFatal => "fatal queue pair error",
                            AsyncEventType::QpReqErr => "invalid request on the queue pair",
                            _ => "access error on the queue pair",
                        };
                        self.pollers[e.poller].send_rdma(RdmaMsg::QpFatal { tag, what });
                    }
                    AsyncEventType::QpLastWqeReached => {
                        // A QP on a shared receive queue is in the error state and will take
                        // no more RECVs from it: its poller may destroy it once its CQ is
                        // reaped.
                        self.pollers[e.poller].send_rdma(RdmaMsg::LastWqeReached { tag });
                    }
                    k => debug!(tag, kind = ?k, "QP async event"),
                }
            }
        }
    }
}
