//! Fabrics commands: Connect (admin and I/O), Property Get/Set, Disconnect.

use std::sync::Arc;
use std::time::Instant;

use nvme::fabrics::{
    connect_data_off as doff, connect_sqe_off as soff, property_off, reg, version, Cap, ConnectCmd,
    ConnectData, ConnectResult, DisconnectCmd, InvalidAttr, PropSize, PropertyGetCmd,
    PropertySetCmd, AUTHREQ_ATR, CATTR_DISABLE_SQFLOW, CNTLID_DYNAMIC,
};
use nvme::opcode::fctype;
use nvme::{Sqe, Status, LINUX_AQ_DEPTH};

use super::controller::{Controller, DISCOVERY_DEFAULT_KATO_MS, KAS_100MS};
use super::queue::{loc, Link, Outcome, Parsed, Reject};
use super::subsystem::Subsystem;
use super::{Queue, QueueEvent};

/// VS: NVMe 1.3. Nothing here needs 2.0 (and claiming 2.0 obliges CNS 08h scanning and more).
pub(crate) const NVME_VERSION: u32 = version(1, 3, 0);
/// CAP.TO in 500 ms units (nvmet: 15). Enabling is immediate; this only bounds host patience.
const CAP_TO: u8 = 15;

fn invalid_param(attr: InvalidAttr, offset: u16) -> Reject {
    let loc = match attr {
        InvalidAttr::Sqe => offset,
        // Fields of the data have no SQE location; point at the data pointer, as nvmet does.
        InvalidAttr::Data => loc::DPTR,
    };
    Reject::dnr(Status::CONNECT_INVALID_PARAM, loc)
        .with_result(ConnectResult::InvalidParam { attr, offset }.encode())
}

impl Queue {
    /// CAP as this queue's transport defines it.
    pub(crate) fn cap(&self) -> u64 {
        let mqes = self.caps.max_queue_depth.saturating_sub(1);
        Cap::new(mqes, true, CAP_TO, Cap::CSS_NVM, 0, 0).0
    }

    pub(super) fn parse_unconnected(&mut self, sqe: &Sqe) -> Result<Parsed, Reject> {
        // Only a Connect may open a queue (NVMe-oF 1.1, 3.3).
        if !sqe.is_fabrics() {
            return Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::OPCODE));
        }
        if sqe.fctype() != fctype::CONNECT {
            return Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::NSID));
        }
        Ok(Parsed::from_host(ConnectData::SIZE as u32, loc::DPTR))
    }

    pub(super) fn parse_fabrics_admin(&mut self, sqe: &Sqe) -> Result<Parsed, Reject> {
        match sqe.fctype() {
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => Ok(Parsed::none()),
            fctype::AUTH_SEND | fctype::AUTH_RECV => self.parse_auth(sqe),
            // The queue is already connected (SPDK answers a second Connect the same way).
            fctype::CONNECT => Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::NSID)),
            // Disconnect is for I/O queues.
            _ => Err(Reject::dnr(Status::INVALID_OPCODE, loc::NSID)),
        }
    }

    pub(super) fn parse_fabrics_io(&mut self, sqe: &Sqe) -> Result<Parsed, Reject> {
        match sqe.fctype() {
            fctype::DISCONNECT => Ok(Parsed::none()),
            fctype::AUTH_SEND | fctype::AUTH_RECV => self.parse_auth(sqe),
            fctype::CONNECT => Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::NSID)),
            // Property Get/Set go to the admin queue only.
            _ => Err(Reject::dnr(Status::INVALID_OPCODE, loc::NSID)),
        }
    }

    pub(super) fn exec_fabrics(
        &mut self,
        sqe: &Sqe,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<Outcome, Reject> {
        match (&self.link, sqe.fctype()) {
            (Link::Admin(_) | Link::Io { .. }, fctype::AUTH_SEND | fctype::AUTH_RECV) => {
                self.exec_auth(sqe, buf, now)
            }
            (Link::Admin(ctrl), fctype::PROPERTY_GET) => {
                let ctrl = ctrl.clone();
                self.property_get(&ctrl, sqe)
            }
            (Link::Admin(ctrl), fctype::PROPERTY_SET) => {
                let ctrl = ctrl.clone();
                self.property_set(&ctrl, sqe, now)
            }
            (Link::Io { ctrl, .. }, fctype::DISCONNECT) => {
                let c = DisconnectCmd::from_sqe(sqe);
                if c.recfmt.get() != 0 {
                    return Err(Reject::dnr(Status::CONNECT_FORMAT, soff::RECFMT));
                }
                // The queue is deleted now so the qid is free for a new Connect; the transport
                // sends this CQE, then sees the Disconnect event and closes.
                ctrl.detach_io(self.qid, self.token);
                self.link = Link::Closed;
                self.teardown_sent = true;
                self.events
                    .push_back(QueueEvent::Disconnect("host disconnected the queue"));
                Ok(Outcome::ok())
            }
            (_, fctype::CONNECT) => Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::NSID)),
            _ => Err(Reject::dnr(Status::INVALID_OPCODE, loc::NSID)),
        }
    }

    // ---- Connect ---------------------------------------------------------------------------

    pub(super) fn exec_connect(
        &mut self,
        sqe: &Sqe,
        buf: &[u8],
        now: Instant,
    ) -> Result<Outcome, Reject> {
        let c = ConnectCmd::from_sqe(sqe);
        if c.recfmt.get() != 0 {
            return Err(Reject::dnr(Status::CONNECT_FORMAT, soff::RECFMT));
        }
        let d = ConnectData::decode(buf)
            .map_err(|_| Reject::dnr(Status::SGL_INVALID_DATA, loc::DPTR))?;
        let subnqn = d.subnqn_str();
        let Some(subsys) = subnqn.and_then(|n| self.target.inner().find_subsystem(n)) else {
            let nqn = subnqn.unwrap_or_default();
            if self.target.inner().recently_removed(nqn, now) {
                // It may come back (a remove and add, a gateway between configurations):
                // refused without DNR, so the host keeps trying.
                tracing::info!(subsys = nqn, peer = %self.peer,
                    "connect refused for now: the subsystem was removed moments ago (no DNR)");
                let mut r = invalid_param(InvalidAttr::Data, doff::SUBNQN);
                r.status = Status::CONNECT_INVALID_PARAM;
                return Err(r);
            }
            return Err(invalid_param(InvalidAttr::Data, doff::SUBNQN));
        };
        let hostnqn = d
            .hostnqn_str()
            .ok_or_else(|| invalid_param(InvalidAttr::Data, doff::HOSTNQN))?;
        // A listener serves the subsystems it is given (nvmet: a port's subsystems).
        if let Some(l) = self.listener().filter(|l| !l.serves(&subsys.nqn)) {
            tracing::info!(subsys = %subsys.nqn, peer = %self.peer,
                listener = %format!("{}:{}", l.traddr, l.trsvcid),
                "connect refused: the listener does not serve the subsystem");
            return Err(invalid_param(InvalidAttr::Data, doff::SUBNQN));
        }
        // Over TLS the channel was keyed for one host and subsystem: a Connect for others is
        // refused (NVMe/TCP 1.1 3.6.1.5; nvmet checks the same).
        if let Some(id) = &self.tls {
            if id.hostnqn != hostnqn {
                tracing::info!(subsys = %subsys.nqn, host = hostnqn, peer = %self.peer,
                    identity = %id, "connect refused: the Host NQN is not the TLS PSK identity's");
                return Err(invalid_param(InvalidAttr::Data, doff::HOSTNQN));
            }
            if id.subnqn != subsys.nqn {
                tracing::info!(subsys = %subsys.nqn, host = hostnqn, peer = %self.peer,
                    identity = %id, "connect refused: the Subsystem NQN is not the TLS PSK identity's");
                return Err(invalid_param(InvalidAttr::Data, doff::SUBNQN));
            }
        }
        // An empty Host NQN (SPDK's perf tool sends one by default) names no host: only a
        // subsystem open to any host takes it, as nvmet and SPDK's target do.
        if hostnqn.is_empty() && !subsys.host_allowed("") {
            tracing::info!(subsys = %subsys.nqn, peer = %self.peer,
                "connect refused: empty Host NQN, and the subsystem allows listed hosts only");
            return Err(invalid_param(InvalidAttr::Data, doff::HOSTNQN));
        }
        // The connection was set up for one queue (NVMe/RDMA: the CM request's qid and its
        // RECVs sized for it): a Connect for another cannot be served on it.
        if self.limits.qid.is_some_and(|q| q != c.qid.get()) {
            return Err(invalid_param(InvalidAttr::Sqe, soff::QID));
        }
        if c.qid.get() == 0 {
            self.admin_connect(&c, &d, subsys, hostnqn, now)
        } else {
            self.io_connect(&c, &d, &subsys, hostnqn, now)
        }
    }

    /// Check SQSIZE against `max_depth` and what the connection was set up for (a larger
    /// SQSIZE than the RECVs an NVMe/RDMA CM request posted would let the host keep more
    /// capsules in flight than there are RECVs: RNR stalls on RoCE, a TERMINATE on iWARP; SPDK's
    /// host sends `hsqsize = sqsize + 1`, Linux `hsqsize = sqsize`); the queue's depth.
    fn check_sqsize(&self, c: &ConnectCmd, max_depth: u16) -> Result<u16, Reject> {
        let max_depth = self
            .limits
            .max_depth
            .map_or(max_depth, |m| m.min(max_depth));
        let sqsize = c.sqsize.get();
        if sqsize == 0 || sqsize as u32 + 1 > max_depth as u32 {
            return Err(invalid_param(InvalidAttr::Sqe, soff::SQSIZE));
        }
        Ok(sqsize + 1)
    }

    fn install(&mut self, link: Link, c: &ConnectCmd, depth: u16) {
        self.link = link;
        self.clock.set(None);
        self.qid = c.qid.get();
        self.depth = depth;
        // The Connect itself was the first entry consumed.
        self.sqhd = 1 % depth;
        self.sqhd_disabled = c.cattr & CATTR_DISABLE_SQFLOW != 0;
        self.ns_cache = None;
    }

    fn admin_connect(
        &mut self,
        c: &ConnectCmd,
        d: &ConnectData,
        subsys: Arc<Subsystem>,
        hostnqn: &str,
        now: Instant,
    ) -> Result<Outcome, Reject> {
        // Dynamic controller model: the host must ask for "any controller".
        if d.cntlid.get() != CNTLID_DYNAMIC {
            return Err(invalid_param(InvalidAttr::Data, doff::CNTLID));
        }
        if !subsys.host_allowed(hostnqn) {
            tracing::info!(host = hostnqn, subsys = %subsys.nqn, peer = %self.peer,
                "connect refused: host not allowed");
            let r = ConnectResult::InvalidParam {
                attr: InvalidAttr::Data,
                offset: doff::HOSTNQN,
            };
            return Err(
                Reject::dnr(Status::CONNECT_INVALID_HOST, loc::DPTR).with_result(r.encode())
            );
        }
        // The admin queue holds at most NVME_AQ_DEPTH entries (the discovery log's ASQSZ).
        let depth = self.check_sqsize(c, LINUX_AQ_DEPTH.min(self.caps.max_queue_depth))?;
        let kato_ms = self.connect_kato(c, &subsys)?;
        let inner = self.target.inner();
        let caps = self.caps.clone();
        let host = hostnqn.to_string();
        let hostid = d.hostid;
        let peer = self.peer.clone();
        let local = self.local_addr;
        let ctrl = inner
            .register(|id| {
                Arc::new(Controller::new(
                    id,
                    subsys.clone(),
                    host,
                    hostid,
                    caps,
                    kato_ms,
                    now,
                    peer,
                    local,
                ))
            })
            .ok_or_else(|| Reject::dnr(Status::CONNECT_CTRL_BUSY, loc::NONE))?;
        // One line per controller connect and (in `TargetInner::unregister`) disconnect.
        tracing::info!(cntlid = ctrl.cntlid, subsys = %subsys.nqn, host = %hostnqn,
            transport = %ctrl.transport(), peer = %self.peer, kato_ms, "controller connected");
        if let Some(w) = &self.waker {
            ctrl.set_admin_waker(Some(w.clone()));
        }
        if self.tls.is_some() {
            ctrl.require_tls_io();
        }
        let cntlid = ctrl.cntlid;
        self.install(Link::Admin(ctrl), c, depth);
        let authreq = if self.auth_on_connect(hostnqn, now) {
            AUTHREQ_ATR
        } else {
            0
        };
        Ok(Outcome::result(
            ConnectResult::Success { cntlid, authreq }.encode(),
        ))
    }

    /// The keep-alive timeout this Connect asks for, in ms, after policy.
    fn connect_kato(&self, c: &ConnectCmd, subsys: &Subsystem) -> Result<u32, Reject> {
        let mut kato = c.kato.get();
        if kato == 0 {
            if subsys.discovery {
                // nvmet gives discovery controllers a long timeout so abandoned discovery
                // sessions are still cleaned up.
                kato = DISCOVERY_DEFAULT_KATO_MS;
            } else {
                // KATO 0 disables the Keep Alive Timer (NVMe base spec, Keep Alive Timer
                // feature), as nvmet allows: the controller then goes away with its admin
                // queue's connection instead of by timeout.
                return Ok(0);
            }
        }
        kato = kato.max(self.target.inner().params.keep_alive_ms_min);
        // Round up to the timer granularity advertised in KAS.
        let gran = KAS_100MS as u32 * 100;
        Ok(kato.div_ceil(gran).saturating_mul(gran))
    }

    fn io_connect(
        &mut self,
        c: &ConnectCmd,
        d: &ConnectData,
        subsys: &Arc<Subsystem>,
        hostnqn: &str,
        now: Instant,
    ) -> Result<Outcome, Reject> {
        let qid = c.qid.get();
        let ctrl = self
            .target
            .inner()
            .lookup(d.cntlid.get())
            .filter(|ctrl| Arc::ptr_eq(&ctrl.subsys, subsys))
            .ok_or_else(|| invalid_param(InvalidAttr::Data, doff::CNTLID))?;
        if ctrl.hostnqn != hostnqn {
            return Err(invalid_param(InvalidAttr::Data, doff::HOSTNQN));
        }
        // The same host identifies itself the same way on every queue of an association.
        if ctrl.hostid != d.hostid {
            return Err(invalid_param(InvalidAttr::Data, doff::HOSTID));
        }
        // A discovery controller has no I/O queues (nvmet: max_qid 0).
        if ctrl.is_discovery() {
            return Err(invalid_param(InvalidAttr::Sqe, soff::QID));
        }
        // SPDK answers an I/O Connect before CC.EN with a sequence error.
        if !ctrl.ready() {
            return Err(Reject::dnr(Status::CMD_SEQ_ERROR, soff::QID));
        }
        if qid > ctrl.lock().io_queues {
            return Err(invalid_param(InvalidAttr::Sqe, soff::QID));
        }
        // No plain I/O queue under a controller whose admin queue is over TLS or negotiated a
        // TLS PSK (secure channel concatenation): its data goes over TLS.
        if self.tls.is_none() && ctrl.tls_io_required() {
            tracing::info!(cntlid = ctrl.cntlid, qid, host = hostnqn, peer = %self.peer,
                "connect refused: the controller's I/O queues must come over TLS");
            return Err(invalid_param(InvalidAttr::Data, doff::CNTLID));
        }
        let depth = self.check_sqsize(c, self.caps.max_queue_depth)?;
        let epoch = ctrl.io_epoch();
        // Not shared yet: the controller gets its reference in `attach_io`.
        if let Some(c) = Arc::get_mut(&mut self.counters) {
            c.io = super::stats::IoCounters::sized(depth);
        }
        if ctrl
            .attach_io(qid, self.token, self.counters.clone(), self.waker.clone())
            .is_err()
        {
            // nvmet: "qid %u has already been created".
            return Err(Reject::dnr(Status::CMD_SEQ_ERROR, soff::QID));
        }
        tracing::debug!(cntlid = ctrl.cntlid, qid, depth, peer = %self.peer, "I/O queue connected");
        let cntlid = ctrl.cntlid;
        self.install(Link::Io { ctrl, epoch }, c, depth);
        let authreq = if self.auth_on_connect(hostnqn, now) {
            AUTHREQ_ATR
        } else {
            0
        };
        Ok(Outcome::result(
            ConnectResult::Success { cntlid, authreq }.encode(),
        ))
    }

    // ---- Properties --------------------------------------------------------------------

    fn property_get(&mut self, ctrl: &Controller, sqe: &Sqe) -> Result<Outcome, Reject> {
        let c = PropertyGetCmd::from_sqe(sqe);
        let size = c
            .size()
            .map_err(|_| Reject::dnr(Status::INVALID_FIELD, property_off::ATTRIB))?;
        let val = match (c.offset.get(), size) {
            (reg::CAP, PropSize::Eight) => self.cap(),
            (reg::VS, PropSize::Four) => NVME_VERSION as u64,
            (reg::CC, PropSize::Four) => ctrl.cc() as u64,
            (reg::CSTS, PropSize::Four) => ctrl.csts() as u64,
            // Known property, wrong width.
            (reg::CAP | reg::VS | reg::CC | reg::CSTS, _) => {
                return Err(Reject::dnr(Status::INVALID_FIELD, property_off::ATTRIB))
            }
            // NSSR is reserved without CAP.NSSRS; nothing else exists on a fabrics controller.
            _ => return Err(Reject::dnr(Status::INVALID_FIELD, property_off::OFFSET)),
        };
        Ok(Outcome::result(val))
    }

    fn property_set(
        &mut self,
        ctrl: &Controller,
        sqe: &Sqe,
        now: Instant,
    ) -> Result<Outcome, Reject> {
        let c = PropertySetCmd::from_sqe(sqe);
        let size = c
            .size()
            .map_err(|_| Reject::dnr(Status::INVALID_FIELD, property_off::ATTRIB))?;
        match (c.offset.get(), size) {
            (reg::CC, PropSize::Four) => {
                for cid in ctrl.update_cc(c.value.get() as u32, now) {
                    // A reset aborts the outstanding AERs.
                    let cqe = self.cqe(cid, Status::ABORT_QUEUE, 0);
                    self.events.push_back(QueueEvent::Complete(cqe));
                }
                Ok(Outcome::ok())
            }
            (reg::CC, _) => Err(Reject::dnr(Status::INVALID_FIELD, property_off::ATTRIB)),
            // CAP, VS and CSTS are read-only; NSSR is not supported (CAP.NSSRS = 0).
            _ => Err(Reject::dnr(Status::INVALID_FIELD, property_off::OFFSET)),
        }
    }
}
