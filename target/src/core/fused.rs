//! Fused Compare and Write (NVM Command Set 1.0, 3.2.1.1 "Fused Operations"), and the range
//! registration of plain writes that makes it atomic.
//!
//! The host sends a Compare with FUSE = 01b and, next in the same submission queue, a Write
//! with FUSE = 10b over the same blocks. The queue keeps a [`Pair`] from the Compare's parse
//! on: each command, once its data is in the slot buffer, is deferred (the transport keeps
//! the slot and its buffer); when both are, the pair locks its range ([`RangeLocks`]) and
//! waits until no write registered in it is still executing, then resumes the Compare (the
//! backend's Compare op); a matching Compare resumes the Write, and the Write's completion
//! drops the lock. A Compare that finds a difference completes with Compare Failure and the
//! Write with Command Aborted due to Failed Fused Command; a first command not followed by
//! its second gets Missing Fused Command, a second with no first the same.
//!
//! A namespace whose store has a compare-and-write of its own (`native_caw`: RBD, where the
//! image is shared with other gateways and a lock of this target's would not hold them off)
//! runs a pair that the store's operation takes (its size and alignment) as that one
//! operation instead: the resumed Compare becomes
//! [`IoKind::CompareAndWrite`] naming the Write (whose data the transport holds), and the
//! Write, resumed after it succeeded, completes without an operation of its own. The range
//! lock is still taken, for this target's own writes' order.
//!
//! Every other Write, Write Zeroes and deallocation registers its range while it executes
//! (`enter_range` at execute, `leave_range` at completion); one that meets a lock is deferred
//! and resumed when the lock is gone.

use nvme::cmd::{FUSE_FIRST, FUSE_MASK, FUSE_SECOND};
use nvme::opcode::io;
use nvme::{Sqe, Status};

use super::queue::{loc, Link, Outcome, Reject};
use super::rangelock::{Busy, Held, RangeLock, RangeLocks, WaitTicket};
use super::{Cmd, IoKind, IoOp, Queue, QueueEvent};
use std::sync::Arc;
use std::time::Instant;

/// Where one command of a pair is.
#[derive(Debug)]
enum Member {
    /// Parsed (or, for the second, not yet arrived) and not executed yet.
    Waiting,
    /// Executed and deferred: the transport holds its slot and data (a copy of the command
    /// for completing it from here).
    Held(Cmd),
    /// Its backend op is running.
    Running,
    /// Completed, refused or never coming.
    Gone,
}

/// How far a pair got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Waiting for both commands to be executed (their data in their slots).
    Gathering,
    /// Both held; taking the range lock and waiting for the writes in it to finish.
    Locking,
    /// The Compare is running.
    Comparing,
    /// The Compare matched; the Write is running.
    Writing,
}

/// One fused Compare and Write in progress on a queue.
#[derive(Debug)]
struct Pair {
    first_cid: u16,
    second_cid: Option<u16>,
    nsid: u32,
    slba: u64,
    nlb: u16,
    first: Member,
    second: Member,
    stage: Stage,
    lock: Option<RangeLock>,
    /// Its place among the pairs waiting for a lock, while it waits.
    ticket: Option<WaitTicket>,
    /// Why the pair cannot run: a member executed later completes with this.
    abort: Option<Status>,
    /// Byte extent (known once the Compare is executed).
    extent: (u64, u64),
    /// The store runs the pair as one operation (`NamespaceSpec::native_caw`).
    native: bool,
}

/// A queue's fused pairs.
#[derive(Debug, Default)]
pub(crate) struct Fused {
    pairs: Vec<Pair>,
    /// The last pair's first command was parsed and its second not yet.
    expecting: bool,
    /// The last command was a first command that parse refused: a second now gets Failed
    /// Fused rather than Missing Fused.
    first_refused: bool,
}

fn fuse(sqe: &Sqe) -> u8 {
    sqe.flags & FUSE_MASK
}

impl Queue {
    /// Parse-time rules of the FUSE field, before the command's own checks.
    pub(super) fn check_fuse(&self, sqe: &Sqe) -> Result<(), Reject> {
        let io_queue = matches!(self.link, Link::Io { .. });
        match fuse(sqe) {
            0 => Ok(()),
            FUSE_FIRST if io_queue && !sqe.is_fabrics() && sqe.opcode == io::COMPARE => Ok(()),
            FUSE_SECOND if io_queue && !sqe.is_fabrics() && sqe.opcode == io::WRITE => {
                let first = self.fused.pairs.last().filter(|_| self.fused.expecting);
                match first {
                    Some(p)
                        if sqe.nsid.get() == p.nsid
                            && sqe.slba() == p.slba
                            && (sqe.cdw12.get() & 0xffff) as u16 == p.nlb =>
                    {
                        Ok(())
                    }
                    // Not the Write over the same blocks.
                    Some(_) => Err(Reject::dnr(Status::INVALID_FIELD, loc::FLAGS)),
                    None if self.fused.first_refused => {
                        Err(Reject::new(Status::FUSED_FAIL, loc::FLAGS))
                    }
                    None => Err(Reject::dnr(Status::FUSED_MISSING, loc::FLAGS)),
                }
            }
            _ => Err(Reject::dnr(Status::INVALID_FIELD, loc::FLAGS)),
        }
    }

    /// Pairing after every parse (`ok`: the command was accepted): a first command starts a
    /// pair, its second joins it, anything else leaves a waiting first without its partner.
    pub(super) fn fused_parsed(&mut self, sqe: &Sqe, ok: bool, now: Instant) {
        let f = fuse(sqe);
        self.fused.first_refused = false;
        if self.fused.expecting {
            self.fused.expecting = false;
            let i = self.fused.pairs.len() - 1;
            if f == FUSE_SECOND {
                if ok {
                    self.fused.pairs[i].second_cid = Some(sqe.cid());
                } else {
                    self.fused.pairs[i].second = Member::Gone;
                    self.abort_pair(i, Status::FUSED_FAIL, now);
                }
                return;
            }
            self.fused.pairs[i].second = Member::Gone;
            self.abort_pair(i, Status::FUSED_MISSING.dnr(), now);
        }
        if f == FUSE_FIRST {
            if ok {
                self.fused.pairs.push(Pair {
                    first_cid: sqe.cid(),
                    second_cid: None,
                    nsid: sqe.nsid.get(),
                    slba: sqe.slba(),
                    nlb: (sqe.cdw12.get() & 0xffff) as u16,
                    first: Member::Waiting,
                    second: Member::Waiting,
                    stage: Stage::Gathering,
                    lock: None,
                    ticket: None,
                    abort: None,
                    extent: (0, 0),
                    native: false,
                });
                self.fused.expecting = true;
            } else {
                self.fused.first_refused = true;
            }
        }
    }

    /// The pair and member a fused command belongs to.
    fn member(&self, cid: u16, first: bool) -> Option<usize> {
        self.fused.pairs.iter().position(|p| {
            if first {
                p.first_cid == cid && !matches!(p.first, Member::Gone)
            } else {
                p.second_cid == Some(cid) && !matches!(p.second, Member::Gone)
            }
        })
    }

    fn member_mut(&mut self, i: usize, first: bool) -> &mut Member {
        let p = &mut self.fused.pairs[i];
        if first {
            &mut p.first
        } else {
            &mut p.second
        }
    }

    /// Execute of a fused command (its data is in the slot): the Compare's or the Write's op
    /// when the pair is there, else deferred.
    /// `native`: the largest pair the namespace's store runs as one operation
    /// (`NamespaceSpec::native_caw`).
    pub(super) fn fused_execute(
        &mut self,
        cmd: &Cmd,
        op: IoOp,
        native: u32,
    ) -> Result<Outcome, Reject> {
        let first = fuse(&cmd.sqe) == FUSE_FIRST;
        let Some(i) = self.member(cmd.sqe.cid(), first) else {
            return Err(Reject::dnr(Status::FUSED_MISSING, loc::FLAGS));
        };
        if let Some(st) = self.fused.pairs[i].abort {
            *self.member_mut(i, first) = Member::Gone;
            self.drop_if_done(i);
            return Err(Reject::new(st, loc::FLAGS));
        }
        let p = &self.fused.pairs[i];
        match (p.stage, first, p.native) {
            (Stage::Comparing, true, true) => {
                let Some(write_cid) = p.second_cid else {
                    // Comparing needs both members held.
                    return Err(Reject::dnr(Status::FUSED_MISSING, loc::FLAGS));
                };
                *self.member_mut(i, first) = Member::Running;
                let kind = IoKind::CompareAndWrite {
                    write_cid,
                    write_buf: None,
                };
                return Ok(Outcome::Io(IoOp { kind, ..op }));
            }
            (Stage::Writing, false, true) => {
                // The pair's one operation wrote it.
                *self.member_mut(i, first) = Member::Gone;
                self.fused.pairs[i].lock = None;
                self.drop_if_done(i);
                super::queue::bump(&self.counters.bytes_written, u64::from(op.len));
                super::queue::bump(&self.counters.write_cmds, 1);
                return Ok(Outcome::ok());
            }
            (Stage::Comparing, true, false) | (Stage::Writing, false, false) => {
                *self.member_mut(i, first) = Member::Running;
                return Ok(Outcome::Io(op));
            }
            _ => {}
        }
        if first {
            let p = &mut self.fused.pairs[i];
            p.extent = (op.offset, op.len as u64);
            let unit = u64::from(native);
            p.native = native > 0
                && op.len > 0
                && op.len <= native
                && op.offset / unit == (op.offset + u64::from(op.len) - 1) / unit;
        }
        *self.member_mut(i, first) = Member::Held(cmd.clone());
        let p = &mut self.fused.pairs[i];
        if p.stage == Stage::Gathering
            && matches!(p.first, Member::Held(_))
            && matches!(p.second, Member::Held(_))
        {
            p.stage = Stage::Locking;
            self.pair_progress(i, true);
        }
        Ok(Outcome::Deferred)
    }

    /// Drops every pair (their locks) and blocked write: the queue is going away.
    pub(super) fn fused_release(&mut self) {
        self.fused = Fused::default();
        self.blocked.clear();
    }

    /// A pair in `Locking` takes its lock and, once the writes in its range are done, resumes
    /// its Compare. `wake`: ask the transport to look at the events now (called from its own
    /// command flow, not from its event loop).
    fn pair_progress(&mut self, i: usize, wake: bool) {
        let p = &self.fused.pairs[i];
        if p.stage != Stage::Locking {
            return;
        }
        // Every table of the subsystem has the locks of every NSID it ever had.
        let Some(locks) = self.range_locks(p.nsid) else {
            return;
        };
        let (off, len) = p.extent;
        for _ in 0..2 {
            let p = &mut self.fused.pairs[i];
            if p.lock.is_none() {
                match locks.try_lock(off, len, p.ticket.as_ref()) {
                    Ok(l) => {
                        p.lock = Some(l);
                        p.ticket = None;
                    }
                    Err(busy) => {
                        let first_wait = p.ticket.is_none();
                        p.ticket.get_or_insert_with(|| WaitTicket::new(&locks));
                        self.waker.iter().for_each(|w| locks.wait(w));
                        if busy == Busy::Waiters || !first_wait {
                            // Others were first: woken when one of them is done.
                            return;
                        }
                        // Registered before this second look: a release in between wakes us.
                        continue;
                    }
                }
            }
            let p = &mut self.fused.pairs[i];
            match &p.lock {
                Some(l) if l.drained() => {
                    p.stage = Stage::Comparing;
                    let cid = p.first_cid;
                    self.push_event(QueueEvent::Resume(cid), wake);
                    return;
                }
                // Registered before the second look: a release in between wakes us.
                Some(l) => self.waker.iter().for_each(|w| l.wait(w)),
                None => {}
            }
        }
    }

    /// The pair cannot run: members the transport holds complete with `st` now, the others
    /// when they are executed.
    fn abort_pair(&mut self, i: usize, st: Status, now: Instant) {
        let p = &mut self.fused.pairs[i];
        p.abort = Some(st);
        p.lock = None;
        p.ticket = None;
        let held: Vec<Cmd> = [&mut p.first, &mut p.second]
            .into_iter()
            .filter_map(|m| match std::mem::replace(m, Member::Gone) {
                Member::Held(c) => Some(c),
                other => {
                    *m = other;
                    None
                }
            })
            .collect();
        for c in held {
            self.io_done(&c, st, now);
            let cqe = self.reject_cqe(&c.sqe, Reject::new(st, loc::FLAGS));
            self.push_event(QueueEvent::Complete(cqe), true);
        }
        self.drop_if_done(i);
    }

    fn drop_if_done(&mut self, i: usize) {
        let p = &self.fused.pairs[i];
        let gone = |m: &Member| matches!(m, Member::Gone);
        let last_expecting = self.fused.expecting && i + 1 == self.fused.pairs.len();
        if gone(&p.first) && gone(&p.second) && !last_expecting {
            self.fused.pairs.remove(i);
        }
    }

    /// A fused command's backend op completed (`ok`: it succeeded). After the Compare: a
    /// match resumes the Write; a difference (or error) fails the Write with Failed Fused.
    /// After the Write: the pair is done and its lock dropped.
    pub(super) fn fused_completed(&mut self, cmd: &Cmd, ok: bool, now: Instant) {
        let first = fuse(&cmd.sqe) == FUSE_FIRST;
        let Some(i) = self.member(cmd.sqe.cid(), first) else {
            return;
        };
        *self.member_mut(i, first) = Member::Gone;
        if first && ok {
            let p = &mut self.fused.pairs[i];
            p.stage = Stage::Writing;
            if let Some(cid) = p.second_cid {
                self.push_event(QueueEvent::Resume(cid), true);
            }
            return;
        }
        if first {
            self.abort_pair(i, Status::FUSED_FAIL, now);
        } else {
            self.fused.pairs[i].lock = None;
            self.drop_if_done(i);
        }
    }

    /// A fused command completed without reaching the backend (a transport error on its
    /// data): its partner cannot run.
    pub(super) fn fused_failed(&mut self, cmd: &Cmd, now: Instant) {
        let f = fuse(&cmd.sqe);
        if f != FUSE_FIRST && f != FUSE_SECOND {
            return;
        }
        if let Some(i) = self.member(cmd.sqe.cid(), f == FUSE_FIRST) {
            *self.member_mut(i, f == FUSE_FIRST) = Member::Gone;
            self.abort_pair(i, Status::FUSED_FAIL, now);
        }
    }

    /// Progress that waits on other queues (called from the event poll): pairs waiting for
    /// their lock, writes waiting for a lock to go.
    pub(super) fn fused_poll(&mut self) {
        if self.fused.pairs.is_empty() && self.blocked.is_empty() {
            return;
        }
        for i in 0..self.fused.pairs.len() {
            self.pair_progress(i, false);
        }
        let mut i = 0;
        while i < self.blocked.len() {
            let (cid, nsid, off, len) = self.blocked[i];
            let blocked = self.range_locks(nsid).is_some_and(|l| {
                self.waker.iter().for_each(|w| l.wait(w));
                l.would_block(off, len)
            });
            if blocked {
                i += 1;
            } else {
                self.blocked.swap_remove(i);
                self.events.push_back(QueueEvent::Resume(cid));
            }
        }
    }

    fn range_locks(&self, nsid: u32) -> Option<Arc<RangeLocks>> {
        self.ns_cache
            .as_ref()
            .and_then(|(_, t)| t.locks(nsid))
            .cloned()
    }

    /// Registers an executing write of `len` bytes at `off` (see `rangelock`): `false` when a
    /// lock is in the way (the command is deferred and resumed when it goes).
    pub(super) fn enter_range(&mut self, cmd: &mut Cmd, nsid: u32, off: u64, len: u64) -> bool {
        if !cmd.hold.is_none() {
            return true;
        }
        let Some(locks) = self.ns_cache.as_ref().and_then(|(_, t)| t.locks(nsid)) else {
            return true;
        };
        if let Some(h) = locks.enter(off, len) {
            cmd.hold = h;
            return true;
        }
        let locks = locks.clone();
        if let Some(w) = &self.waker {
            locks.wait(w);
        }
        // Registered before this second try: a release in between wakes the queue.
        if let Some(h) = locks.enter(off, len) {
            cmd.hold = h;
            return true;
        }
        self.blocked.push((cmd.sqe.cid(), nsid, off, len));
        false
    }

    /// Gives back a write's range registration (idempotent).
    pub(super) fn leave_range(&mut self, cmd: &mut Cmd) {
        let h = std::mem::replace(&mut cmd.hold, Held::NONE);
        if h.is_none() {
            return;
        }
        match self
            .ns_cache
            .as_ref()
            .and_then(|(_, t)| t.locks(cmd.sqe.nsid.get()))
        {
            Some(l) => l.leave(h),
            None => tracing::error!(
                nsid = cmd.sqe.nsid.get(),
                "range registration without its namespace's locks"
            ),
        }
    }

    fn push_event(&mut self, ev: QueueEvent, wake: bool) {
        self.events.push_back(ev);
        if wake {
            if let Some(w) = &self.waker {
                w();
            }
        }
    }
}
