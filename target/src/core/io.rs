//! NVM I/O commands: Read, Write, Compare, Flush, Write Zeroes, Dataset Management, and the four
//! reservation commands (their rules are in `reservation`); every Read, Write, Flush, Write
//! Zeroes and DSM is checked against the namespace's reservation at parse.
//!
//! A host Write is a backend write of data the host sent (`Xfer::FromHost`); a host Read is a
//! backend read whose data goes to the host (`Xfer::ToHost`). Ranges are checked in `parse` so
//! that no data moves for a command that cannot succeed, and again in `execute` because the
//! namespace table may have been replaced in between.

use nvme::cmd::{FUSE_FIRST, FUSE_MASK, FUSE_SECOND};
use nvme::log::ana_state;
use nvme::opcode::io;
use std::time::Instant;

use nvme::sgl::Sgl;
use nvme::{Sqe, Status};

use nvme::resv::{
    notice, AcquireAction, AcquireCmd, BadField, RegisterCmd, ReleaseCmd, REPORT_EDS,
};

use super::queue::{loc, Fence, Link, Outcome, Parsed, Reject, ResvSave};
use super::reservation::{Access, Change, HostId, ResvError, ResvState};
use super::{put_trim_range, Cmd, IoKind, IoOp, NamespaceSpec, Queue, QueueEvent, Xfer};

/// Read/Write CDW12 bit 30: Force Unit Access.
const RW_FUA: u32 = 1 << 30;
/// DSM attribute bit 2: Deallocate (NVM Command Set 1.0 Figure 41).
const DSM_AD: u32 = 1 << 2;
/// One DSM range: context attributes, length in blocks, starting LBA.
const DSM_RANGE_SIZE: usize = 16;
const _: () = assert!(DSM_RANGE_SIZE == super::TRIM_RANGE_SIZE);
/// The most DSM data a command may carry: 256 ranges (NR is 8 bits, 0's based).
const DSM_MAX_DATA: usize = 256 * DSM_RANGE_SIZE;

/// The number of ranges a DSM command lists (CDW10 NR, 0's based).
fn dsm_ranges(sqe: &Sqe) -> usize {
    (sqe.cdw10.get() & 0xff) as usize + 1
}

/// Byte offset and length of `nlb` blocks at `slba`, range-checked against the namespace
/// without any arithmetic that could overflow.
fn extent(ns: &NamespaceSpec, slba: u64, nlb: u64) -> Result<(u64, u64), Reject> {
    let lba_range = || Reject::dnr(Status::LBA_RANGE, loc::CDW10).with_lba(slba);
    let end = slba.checked_add(nlb).ok_or_else(lba_range)?;
    if end > ns.blocks {
        return Err(lba_range());
    }
    let bs = 1u64
        .checked_shl(ns.lba_shift as u32)
        .filter(|&b| b != 0)
        .ok_or_else(lba_range)?;
    let off = slba.checked_mul(bs).ok_or_else(lba_range)?;
    let len = nlb.checked_mul(bs).ok_or_else(lba_range)?;
    off.checked_add(len).ok_or_else(lba_range)?;
    Ok((off, len))
}

/// Read/Write/Write Zeroes extent from CDW10-12, with the length as a u32.
fn rw_extent(sqe: &Sqe, ns: &NamespaceSpec) -> Result<(u64, u32), Reject> {
    let (off, len) = extent(ns, sqe.slba(), sqe.nlb() as u64)?;
    let len = u32::try_from(len).map_err(|_| Reject::dnr(Status::INVALID_FIELD, loc::CDW12))?;
    Ok((off, len))
}

/// Map a backend errno (either sign) to a status, as nvmet `errno_to_nvme_status` does for its
/// file backend: ENOSPC -> Capacity Exceeded, EREMOTEIO -> LBA Out of Range, EOPNOTSUPP ->
/// Invalid Opcode, ENODATA -> Access Denied, EROFS -> Namespace is Write Protected, anything
/// else (EIO included) -> Internal Error, all with DNR except Access Denied. Two deliberate
/// differences: resource shortages that may pass (EAGAIN, ENOMEM, EBUSY, EINTR) come back
/// without DNR so the host retries instead of failing the I/O, and so does a store that cannot
/// be reached now (ETIMEDOUT, ESHUTDOWN, ENOTCONN, ...: Namespace Not Ready).
pub(crate) fn errno_to_status(sqe: &Sqe, errno: i32) -> Reject {
    let lba = match sqe.opcode {
        io::READ | io::WRITE | io::WRITE_ZEROES => sqe.slba(),
        _ => 0,
    };
    let e = errno.unsigned_abs() as i32;
    let r = match e {
        libc::ENOSPC => Reject::dnr(Status::CAP_EXCEEDED, loc::CDW12),
        libc::EREMOTEIO => Reject::dnr(Status::LBA_RANGE, loc::CDW10),
        libc::EOPNOTSUPP => Reject::dnr(Status::INVALID_OPCODE, loc::OPCODE),
        libc::ENODATA => Reject::new(Status::ACCESS_DENIED, loc::NSID),
        // A write to a `read_only` namespace (the backend refuses it with EROFS). nvmet
        // (`nvmet_io_cmd_check_access`): a read-only namespace fails writes with
        // NVME_SC_NS_WRITE_PROTECTED.
        libc::EROFS => Reject::dnr(Status::NS_WRITE_PROTECTED, loc::NSID),
        // The backend's Compare found a difference.
        libc::EILSEQ => Reject::dnr(Status::COMPARE_FAILED, loc::NONE),
        libc::EAGAIN | libc::ENOMEM | libc::EBUSY | libc::EINTR => {
            Reject::new(Status::INTERNAL, loc::OPCODE)
        }
        // A store that cannot be reached now (an RBD cluster that timed out, a client that was
        // shut down or blocklisted): Namespace Not Ready without DNR, so the host retries (on
        // another path, with multipath) instead of failing the I/O.
        libc::ETIMEDOUT
        | libc::ESHUTDOWN
        | libc::ENOTCONN
        | libc::ECONNREFUSED
        | libc::ECONNRESET
        | libc::EHOSTUNREACH => Reject::new(Status::NS_NOT_READY, loc::NSID),
        _ => Reject::dnr(Status::INTERNAL, loc::OPCODE),
    };
    r.with_lba(lba)
}

impl Queue {
    fn namespace(&mut self, nsid: u32) -> Result<NamespaceSpec, Reject> {
        self.namespace_spec(nsid)
            .ok_or_else(|| Reject::dnr(Status::INVALID_NS, loc::NSID))
    }

    pub(super) fn parse_io(&mut self, sqe: &Sqe) -> Result<Parsed, Reject> {
        let access = match sqe.opcode {
            io::READ | io::COMPARE => Some(Access::Read),
            io::WRITE | io::FLUSH | io::WRITE_ZEROES | io::DSM => Some(Access::Write),
            io::RESV_REGISTER | io::RESV_REPORT | io::RESV_ACQUIRE | io::RESV_RELEASE => None,
            _ => return Err(Reject::dnr(Status::INVALID_OPCODE, loc::OPCODE)),
        };
        // NSID 0 and FFFFFFFFh never name a namespace here: a broadcast Flush is not supported
        // (Identify VWC bits 2:1 = 10b).
        let ns = self.namespace(sqe.nsid.get())?;
        // Asymmetric Namespace Access: this path may not serve the namespace's group. The
        // status has no DNR: the host retries on another path (nvmet_check_ana_state).
        match self.ana_state(ns.ana_group) {
            ana_state::OPTIMIZED | ana_state::NON_OPTIMIZED => {}
            ana_state::INACCESSIBLE => {
                return Err(Reject::new(Status::ANA_INACCESSIBLE, loc::NSID))
            }
            ana_state::PERSISTENT_LOSS => {
                return Err(Reject::new(Status::ANA_PERSISTENT_LOSS, loc::NSID))
            }
            _ => return Err(Reject::new(Status::ANA_TRANSITION, loc::NSID)),
        }
        // A write-protected namespace takes reads and flushes only (nvmet's
        // `nvmet_io_cmd_check_access`), refused here before any data moves.
        if ns.read_only && access == Some(Access::Write) && sqe.opcode != io::FLUSH {
            return Err(Reject::dnr(Status::NS_WRITE_PROTECTED, loc::NSID));
        }
        if let Some(a) = access {
            self.check_reservation(ns.nsid, a)?;
        }
        Ok(match sqe.opcode {
            io::READ => Parsed::to_host(rw_extent(sqe, &ns)?.1, loc::CDW12),
            io::WRITE | io::COMPARE => Parsed::from_host(rw_extent(sqe, &ns)?.1, loc::CDW12),
            io::WRITE_ZEROES => {
                rw_extent(sqe, &ns)?;
                Parsed::none()
            }
            io::DSM => {
                // The ranges take NR x 16 bytes, but the Linux host always sends a whole
                // page (nvme_setup_discard allocates and maps the maximum, 256 ranges, for
                // devices that ignore NR), as nvmet accepts (`nvmet_check_data_len_lte`): a
                // data length from NR x 16 up to 4 KiB is taken and the rest ignored.
                let need = dsm_ranges(sqe) * DSM_RANGE_SIZE;
                let len = match Sgl::decode(&sqe.dptr) {
                    Ok(sgl) if (need..=DSM_MAX_DATA).contains(&(sgl.len() as usize)) => sgl.len(),
                    _ => need as u32,
                };
                Parsed::from_host(len, loc::CDW10)
            }
            io::RESV_REGISTER | io::RESV_ACQUIRE => {
                Parsed::from_host(nvme::resv::KEYS_DATA_SIZE as u32, loc::DPTR)
            }
            io::RESV_RELEASE => Parsed::from_host(nvme::resv::RELEASE_DATA_SIZE as u32, loc::DPTR),
            io::RESV_REPORT => {
                // NUMD: dwords, 0's based.
                let len = (u64::from(sqe.cdw10.get()) + 1) * 4;
                Parsed::to_host(u32::try_from(len).unwrap_or(u32::MAX), loc::CDW10)
            }
            _ => Parsed::none(),
        })
    }

    /// The Host Identifier of this queue's controller.
    fn host_id(&self) -> Option<&HostId> {
        match &self.link {
            Link::Admin(c) | Link::Io { ctrl: c, .. } => Some(&c.hostid),
            _ => None,
        }
    }

    /// Reservation Conflict if the namespace's reservation keeps this host from `access`
    /// (one relaxed load while no reservation is held).
    fn check_reservation(&self, nsid: u32, access: Access) -> Result<(), Reject> {
        let (Some(host), Some((_, table))) = (self.host_id(), &self.ns_cache) else {
            return Ok(());
        };
        match table.reservation(nsid) {
            Some(r) => r
                .check(host, access)
                .map_err(|e| Reject::dnr(e.status(), loc::NSID)),
            None => Ok(()),
        }
    }

    /// Runs a reservation command on the namespace's state: delivers the notifications it
    /// raised and completes it (a Preempt and Abort once fenced), or defers it while its
    /// change is being saved ([`Queue::resv_poll`] finishes it) or while another change of
    /// the namespace is.
    /// `field`: where a refusal by the rules points (the command's dword).
    pub(super) fn reservation_cmd(
        &mut self,
        cmd: &Cmd,
        (nsid, field): (u32, u16),
        preempt_abort: bool,
        now: Instant,
        f: impl FnOnce(&mut ResvState, &HostId, bool) -> Result<(), ResvError>,
    ) -> Result<Outcome, Reject> {
        self.refresh_ns_cache();
        let (Some(host), Some((_, table))) = (self.host_id().copied(), &self.ns_cache) else {
            return Err(Reject::dnr(Status::INVALID_NS, loc::NSID));
        };
        let r = table
            .reservation(nsid)
            .ok_or_else(|| Reject::dnr(Status::INVALID_NS, loc::NSID))?;
        let cid = cmd.sqe.cid();
        if self.resv_save.is_some() {
            // One save at a time per queue: after this queue's.
            self.resv_waiting.push((cid, nsid));
            return Ok(Outcome::Deferred);
        }
        let change = r
            .command(
                |s, ptpl_capable| f(s, &host, ptpl_capable),
                self.waker.as_ref(),
            )
            .map_err(|st| resv_reject(st, field))?;
        match change {
            Change::Done(notices) => Ok(self.resv_done(cmd, nsid, &notices, preempt_abort, now)),
            Change::Saving(slot) => {
                self.resv_save = Some(ResvSave {
                    cmd: cmd.clone(),
                    nsid,
                    slot,
                    preempt_abort,
                    started: now,
                });
                Ok(Outcome::Deferred)
            }
            Change::Busy => {
                self.resv_waiting.push((cid, nsid));
                Ok(Outcome::Deferred)
            }
        }
    }

    /// A reservation command's change counts: the hosts named are told, and a Preempt and
    /// Abort waits for the preempted hosts' writes.
    fn resv_done(
        &mut self,
        cmd: &Cmd,
        nsid: u32,
        notices: &[(HostId, u8)],
        preempt_abort: bool,
        now: Instant,
    ) -> Outcome {
        if !notices.is_empty() {
            self.deliver_notices(nsid, notices);
        }
        if preempt_abort {
            return self.fence(cmd, notices, now);
        }
        Outcome::ok()
    }

    /// Progress of reservation commands (from the event poll): the one whose change was being
    /// saved completes (or goes on to its fence), and a waiting one runs again once no save
    /// of its namespace is in progress.
    pub(super) fn resv_poll(&mut self) {
        if let Some(p) = &self.resv_save {
            let Some(r) = p.slot.take() else { return };
            let p = self.resv_save.take().expect("checked just above");
            let cid = p.cmd.sqe.cid();
            match r {
                Ok(notices) => {
                    if let Outcome::Deferred =
                        self.resv_done(&p.cmd, p.nsid, &notices, p.preempt_abort, p.started)
                    {
                        // Fenced: completed by the fence's poll.
                    } else {
                        self.io_done(&p.cmd, Status::SUCCESS, p.started);
                        let c = self.cqe(cid, Status::SUCCESS, 0);
                        self.events.push_back(QueueEvent::Complete(c));
                    }
                }
                Err(st) => {
                    self.io_done(&p.cmd, st, p.started);
                    let c = self.reject_cqe(&p.cmd.sqe, resv_reject(st, loc::NONE));
                    self.events.push_back(QueueEvent::Complete(c));
                }
            }
        }
        if self.resv_save.is_some() || self.resv_waiting.is_empty() {
            return;
        }
        let (_, nsid) = self.resv_waiting[0];
        let busy = self
            .ns_cache
            .as_ref()
            .and_then(|(_, t)| t.reservation(nsid))
            .is_some_and(|r| r.saving());
        if !busy {
            let (cid, _) = self.resv_waiting.remove(0);
            self.events.push_back(QueueEvent::Resume(cid));
        }
    }

    /// Preempt and Abort: the command completes once no write admitted before it is still in
    /// flight on an I/O queue of a host whose registration it preempted (those hosts' later
    /// writes are refused at parse), so none of their writes lands after the host is told the
    /// preempt is done. Nothing is aborted: the writes finish, and the wait is for them.
    fn fence(&mut self, cmd: &Cmd, notices: &[(HostId, u8)], now: Instant) -> Outcome {
        let (Link::Admin(c) | Link::Io { ctrl: c, .. }) = &self.link else {
            return Outcome::ok();
        };
        let queues: Vec<_> = notices
            .iter()
            .filter(|(_, k)| *k == notice::REGISTRATION_PREEMPTED)
            .flat_map(|(host, _)| self.target.inner().host_controllers(&c.subsys, host))
            .flat_map(|ctrl| ctrl.io_counters())
            .collect();
        let f = Fence {
            cmd: cmd.clone(),
            queues,
            started: now,
        };
        if f.done() {
            return Outcome::ok();
        }
        tracing::info!(
            qid = self.qid,
            cid = cmd.sqe.cid(),
            waits = ?f.queues.iter().map(|c| c.writes_in_flight()).collect::<Vec<_>>(),
            "Preempt and Abort waits for the preempted hosts' writes in flight"
        );
        self.fence = Some(f);
        Outcome::Deferred
    }

    /// Hands reservation notifications to every controller of each host named.
    fn deliver_notices(&self, nsid: u32, notices: &[(HostId, u8)]) {
        let (Link::Admin(c) | Link::Io { ctrl: c, .. }) = &self.link else {
            return;
        };
        for (host, kind) in notices {
            for ctrl in self.target.inner().host_controllers(&c.subsys, host) {
                ctrl.reservation_notice(nsid, *kind);
            }
        }
    }

    pub(super) fn exec_io(
        &mut self,
        cmd: &mut Cmd,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<Outcome, Reject> {
        let sqe = cmd.sqe;
        let sqe = &sqe;
        let ns = self.namespace(sqe.nsid.get())?;
        let device = ns.device;
        match sqe.opcode {
            io::READ | io::WRITE => {
                let (offset, len) = rw_extent(sqe, &ns)?;
                let expect = if sqe.opcode == io::READ {
                    Xfer::ToHost(len)
                } else {
                    Xfer::FromHost(len)
                };
                if cmd.xfer != expect {
                    // The namespace's block size changed since parse.
                    return Err(Reject::dnr(Status::SGL_INVALID_DATA, loc::DPTR));
                }
                let kind = if sqe.opcode == io::READ {
                    IoKind::Read
                } else if sqe.cdw12.get() & RW_FUA != 0 {
                    // NVM Command Set 1.0 Figure 39: FUA, CDW12 bit 30. We advertise a volatile
                    // write cache, so such a write must reach stable media before completing.
                    IoKind::WriteFua
                } else {
                    IoKind::Write
                };
                // The piece the slot buffer holds.
                let (offset, len) = (offset + u64::from(cmd.piece.offset), cmd.piece.len);
                let op = IoOp {
                    device,
                    kind,
                    offset,
                    len,
                };
                if sqe.opcode == io::WRITE {
                    if sqe.flags & FUSE_MASK == FUSE_SECOND {
                        return self.fused_execute(cmd, op, ns.native_caw);
                    }
                    if !self.enter_range(cmd, ns.nsid, offset, len as u64) {
                        return Ok(Outcome::Deferred);
                    }
                }
                Ok(Outcome::Io(op))
            }
            io::COMPARE => {
                let (offset, len) = rw_extent(sqe, &ns)?;
                if cmd.xfer != Xfer::FromHost(len) {
                    return Err(Reject::dnr(Status::SGL_INVALID_DATA, loc::DPTR));
                }
                let op = IoOp {
                    device,
                    kind: IoKind::Compare,
                    offset: offset + u64::from(cmd.piece.offset),
                    len: cmd.piece.len,
                };
                if sqe.flags & FUSE_MASK == FUSE_FIRST {
                    return self.fused_execute(cmd, op, ns.native_caw);
                }
                Ok(Outcome::Io(op))
            }
            io::FLUSH => Ok(Outcome::Io(IoOp {
                device,
                kind: IoKind::Flush,
                offset: 0,
                len: 0,
            })),
            io::WRITE_ZEROES => {
                let (offset, len) = rw_extent(sqe, &ns)?;
                if !self.enter_range(cmd, ns.nsid, offset, len as u64) {
                    return Ok(Outcome::Deferred);
                }
                Ok(Outcome::Io(IoOp {
                    device,
                    kind: IoKind::WriteZeroes,
                    offset,
                    len,
                }))
            }
            io::DSM => {
                if sqe.cdw11.get() & DSM_AD == 0 {
                    // Integral Read/Write hints only: nothing to do.
                    return Ok(Outcome::ok());
                }
                // Registered as wide (a list of ranges) before the list is rewritten, so a
                // command deferred by a lock is executed again from the host's list.
                if !self.enter_range(cmd, ns.nsid, 0, u64::MAX) {
                    return Ok(Outcome::Deferred);
                }
                // The byte ranges replace the DSM ranges in the buffer, entry by entry (entry
                // `n` is written only after DSM range `i >= n` was read), so nothing is
                // allocated.
                let mut n = 0;
                for i in 0..dsm_ranges(sqe).min(buf.len() / DSM_RANGE_SIZE) {
                    let r = &buf[i * DSM_RANGE_SIZE..(i + 1) * DSM_RANGE_SIZE];
                    let nlb = u32::from_le_bytes([r[4], r[5], r[6], r[7]]) as u64;
                    let slba = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
                    if nlb == 0 {
                        continue;
                    }
                    let (off, len) = extent(&ns, slba, nlb)?;
                    put_trim_range(buf, n, off, len);
                    n += 1;
                }
                if n == 0 {
                    return Ok(Outcome::ok());
                }
                // At most 256 (NR is 8 bits).
                Ok(Outcome::Io(Queue::trim_op(device, n as u16)))
            }
            io::RESV_REGISTER => {
                let c = decoded(RegisterCmd::decode(sqe, buf))?;
                self.reservation_cmd(cmd, (ns.nsid, loc::CDW10), false, now, |s, h, ptpl| {
                    s.register(h, &c, ptpl)
                })
            }
            io::RESV_ACQUIRE => {
                let c = decoded(AcquireCmd::decode(sqe, buf))?;
                let pa = c.action == AcquireAction::PreemptAndAbort;
                self.reservation_cmd(cmd, (ns.nsid, loc::CDW10), pa, now, |s, h, _| {
                    s.acquire(h, &c)
                })
            }
            io::RESV_RELEASE => {
                let c = decoded(ReleaseCmd::decode(sqe, buf))?;
                self.reservation_cmd(cmd, (ns.nsid, loc::CDW10), false, now, |s, h, _| {
                    s.release(h, &c)
                })
            }
            io::RESV_REPORT => {
                // Fabrics hosts have 128-bit identifiers: only the extended format can carry
                // them (nvmet answers the same).
                if sqe.cdw11.get() & REPORT_EDS == 0 {
                    return Err(Reject::dnr(Status::HOST_ID_INCONSISTENT, loc::CDW11));
                }
                let Some((_, table)) = &self.ns_cache else {
                    return Err(Reject::dnr(Status::INVALID_NS, loc::NSID));
                };
                let r = table
                    .reservation(ns.nsid)
                    .ok_or_else(|| Reject::dnr(Status::INVALID_NS, loc::NSID))?;
                r.report().encode_ext(buf);
                Ok(Outcome::data(buf.len() as u32))
            }
            _ => Err(Reject::dnr(Status::INVALID_OPCODE, loc::OPCODE)),
        }
    }
}

/// A decoded reservation command, or Invalid Field at its CDW10 (or data too short).
fn decoded<T>(r: Result<Result<T, BadField>, nvme::DecodeError>) -> Result<T, Reject> {
    match r {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(_)) => Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10)),
        Err(_) => Err(Reject::dnr(Status::SGL_INVALID_DATA, loc::DPTR)),
    }
}

/// How a reservation command that failed in the state (or its save) is answered: Internal
/// Error (a save that failed) may be retried, a rule's refusal not.
fn resv_reject(st: Status, field: u16) -> Reject {
    if st == Status::INTERNAL {
        Reject::new(st, loc::NONE)
    } else {
        Reject::dnr(st, field)
    }
}
