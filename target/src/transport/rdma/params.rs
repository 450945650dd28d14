//! Pure decisions of the RDMA transport: which CM requests are accepted, how a queue pair and
//! its buffers are sized, and how work-request ids are laid out. No verbs here, so every rule
//! is unit-tested.

use nvme::rdma::{CmRequest, CmStatus};

/// Largest admin queue a host may ask for (`NVME_AQ_DEPTH`; the Linux target rejects
/// `hsqsize + 1 > 32` on queue 0 with `INVALID_HSQSIZE`, rdma-binding notes §1, §8 item 9).
pub const ADMIN_MAX_DEPTH: u32 = 32;

/// Size of a command capsule's SQE part in a RECV buffer.
pub const SQE_BYTES: usize = 64;

/// Size of one response (CQE) buffer.
pub const CQE_BYTES: usize = 16;

/// A connect request that passed the CM-level checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The CM request as the host sent it.
    pub req: CmRequest,
    /// Commands the host may have outstanding: `hsqsize + 1` (one RECV each).
    pub depth: u32,
    /// RDMA READs this side may have outstanding (initiator depth, ORD).
    pub ord: u8,
}

/// Validates a CONNECT_REQUEST: its private data (`nvmet_rdma_parse_cm_connect_req`), the queue
/// sizes and the READ depth the host grants.
///
/// - `private_data` shorter than 32 bytes → `INVALID_LEN`; `recfmt != 0` → `INVALID_RECFMT`.
/// - `hsqsize` is 0's based: 0 (a one-entry queue) is invalid (NVMe Base 2.0 §3.3.3.1: the
///   minimum queue size is 2). Queue 0 allows at most [`ADMIN_MAX_DEPTH`] entries, I/O queues
///   `max_queue_depth` (what CAP.MQES and Identify MAXCMD advertise); beyond → `INVALID_HSQSIZE`.
/// - `hrqsize` (1's based) of 0 leaves the host no room for a response → `INVALID_HRQSIZE`.
/// - `peer_ird` is the event's `initiator_depth` after the passive-side swap: the most RDMA
///   READs the host serves at once. Host writes and Connect data move by RDMA READ, so 0 is
///   refused with `INVALID_IRD`; otherwise ORD = `min(peer_ird, device_max_ord)`.
pub fn check_connect(
    private_data: &[u8],
    max_queue_depth: u32,
    peer_ird: u8,
    device_max_ord: u32,
) -> Result<Accepted, CmStatus> {
    let req = CmRequest::decode(private_data)?;
    let depth = req.sq_depth();
    let limit = if req.qid == 0 {
        ADMIN_MAX_DEPTH
    } else {
        max_queue_depth
    };
    if req.hsqsize == 0 || depth > limit {
        return Err(CmStatus::InvalidHsqsize);
    }
    if req.hrqsize == 0 {
        return Err(CmStatus::InvalidHrqsize);
    }
    let ord = u32::from(peer_ird)
        .min(device_max_ord)
        .min(u32::from(u8::MAX)) as u8;
    if ord == 0 {
        return Err(CmStatus::InvalidIrd);
    }
    Ok(Accepted { req, depth, ord })
}

/// Device limits that bound a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// `max_qp_wr`.
    pub max_qp_wr: u32,
    /// `max_cqe`.
    pub max_cqe: u32,
}

/// How one connection's queue pair, completion queue and buffers are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSizing {
    /// RECVs posted (= `hsqsize + 1`, the command capsules the host may have in flight).
    pub recvs: u32,
    /// Request slots: twice the RECVs, as nvmet has twice the response contexts: a RECV is
    /// reposted as soon as its capsule is consumed, so the host may reuse a command id (and
    /// send the next capsule) while the previous response's SEND completion is not yet reaped.
    pub slots: u32,
    /// In-capsule data bytes each RECV takes after the 64-byte SQE (0 on admin queues, as in
    /// nvmet: the Linux host sends in-capsule data only on I/O queues).
    pub in_capsule: u32,
    /// Bytes of one RECV buffer: the SQE plus the in-capsule area, rounded to 64 bytes.
    pub recv_stride: usize,
    /// Send queue depth: up to two WRs per request slot (RDMA_WRITE + SEND, or one RDMA_READ
    /// then later one SEND), plus one, capped by the device.
    pub max_send_wr: u32,
    /// Completion queue entries: every RECV and every send WR may complete (flushes report
    /// unsignaled WRs too).
    pub cq_entries: u32,
}

/// Sizes a connection's queue pair for `depth` commands. `in_capsule_data` is the I/O queue
/// setting (`target.in_capsule_data`). Errors are the reject status (`NO_RSC`).
pub fn size_queue(
    depth: u32,
    admin: bool,
    in_capsule_data: u32,
    dev: DeviceLimits,
) -> Result<QueueSizing, CmStatus> {
    let recvs = depth;
    let slots = 2 * depth;
    let in_capsule = if admin { 0 } else { in_capsule_data };
    let recv_stride = (SQE_BYTES + in_capsule as usize).next_multiple_of(64);
    if recvs > dev.max_qp_wr {
        return Err(CmStatus::NoRsc);
    }
    // Each request needs at most 2 send WRs at a time; fewer than that for the whole queue
    // and a read response could never be posted.
    let max_send_wr = (2 * slots + 1).min(dev.max_qp_wr);
    if max_send_wr < 2 {
        return Err(CmStatus::NoRsc);
    }
    let cq_entries = recvs + max_send_wr;
    if cq_entries > dev.max_cqe {
        return Err(CmStatus::NoRsc);
    }
    Ok(QueueSizing {
        recvs,
        slots,
        in_capsule,
        recv_stride,
        max_send_wr,
        cq_entries,
    })
}

/// What a work request was, encoded in the top byte of its `wr_id` (the low 32 bits are the
/// RECV index or the request slot). One CQ per connection, so no connection key is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WrKind {
    /// A command capsule RECV; index = RECV buffer.
    Recv = 1,
    /// The response SEND of a request; index = slot.
    Send = 2,
    /// RDMA READ of host data; index = slot.
    Read = 3,
    /// RDMA WRITE of read data (unsignaled: completes with its SEND, or by a flush).
    Write = 4,
}

/// Builds a `wr_id`.
pub fn wr_id(kind: WrKind, index: u32) -> u64 {
    (kind as u64) << 56 | u64::from(index)
}

/// Splits a `wr_id`; `None` for ids this transport never posts.
pub fn split_wr_id(id: u64) -> Option<(WrKind, u32)> {
    let kind = match id >> 56 {
        1 => WrKind::Recv,
        2 => WrKind::Send,
        3 => WrKind::Read,
        4 => WrKind::Write,
        _ => return None,
    };
    if id >> 32 & 0x00ff_ffff != 0 {
        return None;
    }
    Some((kind, id as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(qid: u16, hrqsize: u16, hsqsize: u16) -> [u8; 32] {
        CmRequest {
            qid,
            hrqsize,
            hsqsize,
            cntlid: 0,
        }
        .encode()
    }

    #[test]
    fn linux_admin_and_io_requests_are_accepted() {
        // nvme_rdma_route_resolved: admin hrqsize 32 / hsqsize 31; I/O queue_size 128.
        let a = check_connect(&req(0, 32, 31), 128, 128, 128).unwrap();
        assert_eq!((a.depth, a.ord), (32, 128));
        let io = check_connect(&req(3, 128, 127), 128, 16, 128).unwrap();
        assert_eq!((io.req.qid, io.depth, io.ord), (3, 128, 16));
        // ORD is bounded by the device.
        assert_eq!(check_connect(&req(1, 32, 31), 128, 200, 8).unwrap().ord, 8);
        // CM transports pad private data (56 bytes on an IB REQ).
        let mut padded = [0u8; 56];
        padded[..32].copy_from_slice(&req(1, 64, 63));
        assert_eq!(check_connect(&padded, 128, 4, 4).unwrap().depth, 64);
    }

    #[test]
    fn bad_requests_get_the_nvmet_reject_status() {
        assert_eq!(check_connect(&[], 128, 1, 1), Err(CmStatus::InvalidLen));
        assert_eq!(
            check_connect(&req(0, 32, 31)[..31], 128, 1, 1),
            Err(CmStatus::InvalidLen)
        );
        let mut bad_fmt = req(0, 32, 31);
        bad_fmt[0] = 1;
        assert_eq!(
            check_connect(&bad_fmt, 128, 1, 1),
            Err(CmStatus::InvalidRecfmt)
        );
        // Admin queue larger than 32 entries.
        assert_eq!(
            check_connect(&req(0, 64, 63), 1024, 1, 1),
            Err(CmStatus::InvalidHsqsize)
        );
        // I/O queue beyond max_queue_depth, and a one-entry queue.
        assert_eq!(
            check_connect(&req(1, 256, 255), 128, 1, 1),
            Err(CmStatus::InvalidHsqsize)
        );
        assert_eq!(
            check_connect(&req(1, 128, 127), 128, 1, 1).map(|a| a.depth),
            Ok(128)
        );
        assert_eq!(
            check_connect(&req(1, 2, 0), 128, 1, 1),
            Err(CmStatus::InvalidHsqsize)
        );
        assert_eq!(
            check_connect(&req(1, 0, 15), 128, 1, 1),
            Err(CmStatus::InvalidHrqsize)
        );
        // A host that serves no RDMA READ, or a device that issues none.
        assert_eq!(
            check_connect(&req(1, 16, 15), 128, 0, 16),
            Err(CmStatus::InvalidIrd)
        );
        assert_eq!(
            check_connect(&req(1, 16, 15), 128, 16, 0),
            Err(CmStatus::InvalidIrd)
        );
    }

    const BIG: DeviceLimits = DeviceLimits {
        max_qp_wr: 1 << 20,
        max_cqe: 1 << 20,
    };

    #[test]
    fn sizing_follows_the_queue_and_the_device() {
        let s = size_queue(32, true, 8192, BIG).unwrap();
        assert_eq!(s.recvs, 32);
        assert_eq!(s.slots, 64);
        assert_eq!(s.in_capsule, 0, "admin RECVs carry no in-capsule data");
        assert_eq!(s.recv_stride, 64);
        assert_eq!(s.max_send_wr, 129);
        assert_eq!(s.cq_entries, 32 + 129);

        let s = size_queue(128, false, 8192, BIG).unwrap();
        assert_eq!(s.in_capsule, 8192);
        assert_eq!(s.recv_stride, 64 + 8192);
        assert_eq!(s.max_send_wr, 513);
        // A capsule size that is not a multiple of 64 still gets aligned RECV buffers.
        assert_eq!(size_queue(4, false, 48, BIG).unwrap().recv_stride, 128);

        // Capped send queue (credits then queue requests in software).
        let small = DeviceLimits {
            max_qp_wr: 200,
            max_cqe: 4096,
        };
        let s = size_queue(128, false, 0, small).unwrap();
        assert_eq!(s.max_send_wr, 200);
        assert_eq!(s.cq_entries, 328);
        // Not enough RECVs or CQ entries for the queue.
        assert_eq!(size_queue(256, false, 0, small), Err(CmStatus::NoRsc));
        let tiny_cq = DeviceLimits {
            max_qp_wr: 1024,
            max_cqe: 100,
        };
        assert_eq!(size_queue(64, false, 0, tiny_cq), Err(CmStatus::NoRsc));
    }

    #[test]
    fn wr_ids_round_trip_and_reject_foreign_values() {
        for kind in [WrKind::Recv, WrKind::Send, WrKind::Read, WrKind::Write] {
            for idx in [0u32, 1, 255, 2047, u32::MAX] {
                assert_eq!(split_wr_id(wr_id(kind, idx)), Some((kind, idx)));
            }
        }
        assert_eq!(split_wr_id(0), None);
        assert_eq!(split_wr_id(5 << 56), None);
        assert_eq!(split_wr_id(1 << 56 | 1 << 40), None);
    }
}
