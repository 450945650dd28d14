//! Per-request state of the RDMA transport: an explicit state enum, the slot that carries a
//! command from its capsule to its response, and per-state counters kept by the one setter.
//!
//! ```text
//!  Free ──capsule──► NeedBuffer ──buffer──► ReadPending ──READ posted──► TransferringFromHost
//!   ▲                    │  (in-capsule data copied / no host data)           │ READ done
//!   │                    ▼                                                    ▼
//!   │              ReadyToExecute ◄───────────────────────────────────────────┘
//!   │                    │ Queue::execute
//!   │        ┌───────────┼──────────────┐
//!   │        ▼           ▼              ▼
//!   │    Executing    Deferred    ReadyToComplete ◄── backend done / AER event / parse error
//!   │   (a piece that is not the last: next READ (ReadPending), or its RDMA WRITE
//!   │    (TransferringPiece), then ReadyToExecute for the next)
//!   │   (io_uring)  (AER, lock,         │ SQ room
//!   │               fused; Resume:
//!   │               ReadyToExecute)     │
//!   │        └──────────────────────────┤
//!   │                         ┌─────────┴──────────┐
//!   │                         ▼                    ▼
//!   │               TransferringToHost        Completing
//!   │             (RDMA_WRITE + SEND posted)   (SEND posted)
//!   └─────────────────────────┴── SEND done ──────┘
//! ```
//! A connection error pulls every request out of what it waits on: software waits end at once,
//! posted work requests end with their flush completion, backend operations with their CQE, so
//! every buffer and memory region comes back.

use ::rdma::{Mr, RemoteBuf, Sge};
use nvme::Cqe;

use crate::core::Cmd;

/// Where a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReqState {
    /// The slot is unused.
    Free = 0,
    /// Parsed; waits for a buffer from the poller's pool (FIFO across the poller).
    NeedBuffer,
    /// Has its buffer; the RDMA READ of host data waits for a READ credit (the negotiated
    /// initiator depth) or send-queue room.
    ReadPending,
    /// RDMA READ posted; waits for its completion.
    TransferringFromHost,
    /// Host data (if any) is in the buffer; `Queue::execute` is next.
    ReadyToExecute,
    /// A backend (io_uring) operation runs on the buffer.
    Executing,
    /// Parked in the core with its buffer (an Asynchronous Event Request; a write waiting
    /// for a range lock; a fused command waiting for its partner) until an event completes
    /// it or resumes it (back to `ReadyToExecute`).
    Deferred,
    /// The response is built; waits for send-queue room.
    ReadyToComplete,
    /// RDMA WRITE of the read data chained with the response SEND is posted.
    TransferringToHost,
    /// The response SEND (no data) is posted.
    Completing,
    /// A piece of a read larger than the buffer is being written to the host (a signaled
    /// RDMA WRITE); when it completes the next piece is read into the buffer
    /// (`ReadyToExecute`). The last piece goes out as any read's data, with the response.
    TransferringPiece,
}

/// Number of [`ReqState`] values.
pub const STATE_COUNT: usize = 11;

impl ReqState {
    /// Every state, in declaration order (index = `state as usize`).
    pub const ALL: [ReqState; STATE_COUNT] = [
        ReqState::Free,
        ReqState::NeedBuffer,
        ReqState::ReadPending,
        ReqState::TransferringFromHost,
        ReqState::ReadyToExecute,
        ReqState::Executing,
        ReqState::Deferred,
        ReqState::ReadyToComplete,
        ReqState::TransferringToHost,
        ReqState::Completing,
        ReqState::TransferringPiece,
    ];

    /// Short name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            ReqState::Free => "free",
            ReqState::NeedBuffer => "need_buffer",
            ReqState::ReadPending => "read_pending",
            ReqState::TransferringFromHost => "transferring_from_host",
            ReqState::ReadyToExecute => "ready_to_execute",
            ReqState::Executing => "executing",
            ReqState::Deferred => "deferred",
            ReqState::ReadyToComplete => "ready_to_complete",
            ReqState::TransferringToHost => "transferring_to_host",
            ReqState::Completing => "completing",
            ReqState::TransferringPiece => "transferring_piece",
        }
    }

    /// States in which the device holds a posted work request of the request: it can only
    /// leave them through that request's completion (success or flush).
    pub fn waits_on_device(self) -> bool {
        matches!(
            self,
            ReqState::TransferringFromHost
                | ReqState::TransferringToHost
                | ReqState::Completing
                | ReqState::TransferringPiece
        )
    }
}

/// One request slot (the slot index is the `wr_id` of its SEND/READ/WRITE); `S` is the
/// device's per-I/O READ sink registration.
pub struct Req<S = Mr> {
    state: ReqState,
    /// The parsed command (kept until the response is sent: SEND_WITH_INV needs its SGL).
    pub cmd: Option<Cmd>,
    /// Pool buffer holding the command's data.
    pub buf: Option<u32>,
    /// The RECV whose in-capsule data is not yet copied out (it is reposted after the copy).
    pub recv: Option<u32>,
    /// The response, once built.
    pub cqe: Option<Cqe>,
    /// Bytes of read data to RDMA WRITE before the response.
    pub data_len: u32,
    /// Send-queue entries the pending completion returns (1 for a READ or a lone SEND, 2 for
    /// WRITE + SEND).
    pub wrs: u32,
    /// Whether the slot sits in the connection's READ or SEND wait list.
    pub queued: bool,
    /// iWARP: the per-I/O memory region of this request's RDMA READ sink, deregistered when
    /// the READ completes.
    pub read_mr: Option<S>,
    /// The response's work requests, built and accounted for, waiting for the connection's
    /// next flush (one `ibv_post_send` for all responses of a poller pass).
    pub send: Option<StagedSend>,
    /// A fused Compare and Write running as one backend op (`IoKind::CompareAndWrite`): the
    /// slot of its Write, whose buffer the op uses; that slot is `Executing` meanwhile and
    /// goes back to `Deferred` (or is released, when closing) when the op completes.
    pub caw_partner: Option<u32>,
}

/// A response staged for posting: the SEND of its CQE, after an RDMA WRITE of its read data.
#[derive(Debug, Clone, Copy)]
pub struct StagedSend {
    /// The CQE in the connection's response region.
    pub rsp: Sge,
    /// The read data in the pool and where it goes in the host's memory.
    pub data: Option<(Sge, RemoteBuf)>,
    /// SEND_WITH_INVALIDATE of this rkey.
    pub inv: Option<u32>,
}

impl<S> Default for Req<S> {
    fn default() -> Req<S> {
        Req::new()
    }
}

impl<S> Req<S> {
    pub fn new() -> Req<S> {
        Req {
            state: ReqState::Free,
            cmd: None,
            buf: None,
            recv: None,
            cqe: None,
            data_len: 0,
            wrs: 0,
            queued: false,
            read_mr: None,
            send: None,
            caw_partner: None,
        }
    }

    pub fn state(&self) -> ReqState {
        self.state
    }
}

/// How many requests are in each state (for metrics and the teardown check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateCounts(pub [u32; STATE_COUNT]);

impl StateCounts {
    /// All `slots` requests free.
    pub fn new(slots: u32) -> StateCounts {
        let mut c = [0; STATE_COUNT];
        c[ReqState::Free as usize] = slots;
        StateCounts(c)
    }

    /// The one setter of a request's state: keeps the counters and traces the change.
    pub fn set<S>(&mut self, slot: u32, req: &mut Req<S>, to: ReqState) {
        let from = req.state;
        if from == to {
            return;
        }
        debug_assert!(self.0[from as usize] > 0, "state counter underflow");
        self.0[from as usize] = self.0[from as usize].saturating_sub(1);
        self.0[to as usize] += 1;
        req.state = to;
        tracing::trace!(slot, from = from.name(), to = to.name(), "rdma request");
    }

    pub fn get(&self, s: ReqState) -> u32 {
        self.0[s as usize]
    }

    /// Requests not free.
    pub fn busy(&self) -> u32 {
        self.0.iter().sum::<u32>() - self.get(ReqState::Free)
    }

    /// Requests whose work request is posted on the device.
    pub fn on_device(&self) -> u32 {
        ReqState::ALL
            .iter()
            .filter(|s| s.waits_on_device())
            .map(|&s| self.get(s))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_state_in_index_order() {
        for (i, s) in ReqState::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
        }
        let mut names: Vec<_> = ReqState::ALL.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), STATE_COUNT);
    }

    #[test]
    fn setter_keeps_counts_consistent() {
        let mut c = StateCounts::new(3);
        let mut reqs: [Req; 3] = [Req::new(), Req::new(), Req::new()];
        assert_eq!(c.busy(), 0);
        let path = [
            ReqState::NeedBuffer,
            ReqState::ReadPending,
            ReqState::TransferringFromHost,
            ReqState::ReadyToExecute,
            ReqState::Executing,
            ReqState::ReadyToComplete,
            ReqState::Completing,
        ];
        for (i, &s) in path.iter().enumerate() {
            c.set(0, &mut reqs[0], s);
            assert_eq!(reqs[0].state(), s);
            assert_eq!(c.get(s), 1);
            assert_eq!(c.busy(), 1, "step {i}");
        }
        c.set(1, &mut reqs[1], ReqState::TransferringToHost);
        c.set(2, &mut reqs[2], ReqState::Deferred);
        assert_eq!(c.on_device(), 2, "Completing + TransferringToHost");
        assert_eq!(c.busy(), 3);
        // Setting the same state again changes nothing.
        c.set(2, &mut reqs[2], ReqState::Deferred);
        assert_eq!(c.get(ReqState::Deferred), 1);
        for (i, r) in reqs.iter_mut().enumerate() {
            c.set(i as u32, r, ReqState::Free);
        }
        assert_eq!(c, StateCounts::new(3));
    }
}
