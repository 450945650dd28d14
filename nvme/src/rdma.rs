//! NVMe/RDMA CM private data (NVMe-oF 1.1, 7.3.2 / RDMA binding; Linux
//! `include/linux/nvme-rdma.h`): what the host puts in `rdma_connect`, what the target answers
//! in `rdma_accept` or `rdma_reject`. All fields little-endian.

use core::mem::{offset_of, size_of};
use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Record format 1.0 (`NVME_RDMA_CM_FMT_1_0`), the only one defined.
pub const RECFMT_1_0: u16 = 0;

/// CM request private data (Linux `struct nvme_rdma_cm_req`), 32 bytes.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct CmReqWire {
    /// Record format.
    pub recfmt: U16,
    /// Queue identifier: 0 admin, 1.. I/O.
    pub qid: U16,
    /// Host receive queue size (1's based: the number of responses the host can take).
    pub hrqsize: U16,
    /// Host send queue size (0's based, like SQSIZE in Connect).
    pub hsqsize: U16,
    /// Controller ID from the admin Connect (hosts since Linux 6.12, I/O queues only; older
    /// hosts leave it 0).
    pub cntlid: U16,
    pub rsvd: [u8; 22],
}
const _: () = assert!(size_of::<CmReqWire>() == 32);
const _: () = assert!(offset_of!(CmReqWire, hsqsize) == 6);
const _: () = assert!(offset_of!(CmReqWire, cntlid) == 8);

/// CM reply private data (Linux `struct nvme_rdma_cm_rep`), 32 bytes.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct CmRepWire {
    pub recfmt: U16,
    /// Controller receive queue size: how many commands the target can take.
    pub crqsize: U16,
    pub rsvd: [u8; 28],
}
const _: () = assert!(size_of::<CmRepWire>() == 32);
const _: () = assert!(offset_of!(CmRepWire, crqsize) == 2);

/// CM reject private data (Linux `struct nvme_rdma_cm_rej`), 4 bytes.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct CmRejWire {
    pub recfmt: U16,
    /// Status ([`CmStatus`]).
    pub sts: U16,
}
const _: () = assert!(size_of::<CmRejWire>() == 4);

/// Why a target rejects a CM request (Linux `enum nvme_rdma_cm_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[repr(u16)]
pub enum CmStatus {
    /// Private data missing or too short.
    #[error("invalid private data length")]
    InvalidLen = 0x01,
    #[error("invalid record format")]
    InvalidRecfmt = 0x02,
    #[error("invalid queue ID")]
    InvalidQid = 0x03,
    #[error("invalid host SQ size")]
    InvalidHsqsize = 0x04,
    #[error("invalid host RQ size")]
    InvalidHrqsize = 0x05,
    #[error("no resources")]
    NoRsc = 0x06,
    #[error("invalid IRD")]
    InvalidIrd = 0x07,
    #[error("invalid ORD")]
    InvalidOrd = 0x08,
    /// Seen in newer header renderings only (not in the Linux C header checked).
    #[error("invalid controller ID")]
    InvalidCntlid = 0x09,
}

impl CmStatus {
    pub fn from_u16(v: u16) -> Option<CmStatus> {
        Some(match v {
            0x01 => CmStatus::InvalidLen,
            0x02 => CmStatus::InvalidRecfmt,
            0x03 => CmStatus::InvalidQid,
            0x04 => CmStatus::InvalidHsqsize,
            0x05 => CmStatus::InvalidHrqsize,
            0x06 => CmStatus::NoRsc,
            0x07 => CmStatus::InvalidIrd,
            0x08 => CmStatus::InvalidOrd,
            0x09 => CmStatus::InvalidCntlid,
            _ => return None,
        })
    }
}

/// A decoded CM request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmRequest {
    pub qid: u16,
    /// Host receive queue size (1's based).
    pub hrqsize: u16,
    /// Host send queue size (0's based).
    pub hsqsize: u16,
    /// Controller ID (0 from pre-6.12 hosts and on the admin queue).
    pub cntlid: u16,
}

impl CmRequest {
    /// Decode the private data of a connect request. The CM may deliver more than 32 bytes
    /// (padded with zeros to the transport's private-data size); only the first 32 count.
    /// Errors are the reject status to send back, as the Linux target does
    /// (`nvmet_rdma_parse_cm_connect_req`).
    pub fn decode(private_data: &[u8]) -> Result<CmRequest, CmStatus> {
        let w = CmReqWire::read_from_prefix(private_data)
            .map_err(|_| CmStatus::InvalidLen)?
            .0;
        if w.recfmt.get() != RECFMT_1_0 {
            return Err(CmStatus::InvalidRecfmt);
        }
        Ok(CmRequest {
            qid: w.qid.get(),
            hrqsize: w.hrqsize.get(),
            hsqsize: w.hsqsize.get(),
            cntlid: w.cntlid.get(),
        })
    }

    pub fn encode(&self) -> [u8; 32] {
        let w = CmReqWire {
            recfmt: RECFMT_1_0.into(),
            qid: self.qid.into(),
            hrqsize: self.hrqsize.into(),
            hsqsize: self.hsqsize.into(),
            cntlid: self.cntlid.into(),
            rsvd: [0; 22],
        };
        let mut out = [0u8; 32];
        out.copy_from_slice(w.as_bytes());
        out
    }

    /// Submission queue depth the host will use (`hsqsize + 1`).
    pub fn sq_depth(&self) -> u32 {
        self.hsqsize as u32 + 1
    }
}

/// A decoded CM reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmReply {
    pub crqsize: u16,
}

impl CmReply {
    /// Decode a reply's private data (the Linux host ignores it; ours checks it).
    pub fn decode(private_data: &[u8]) -> Result<CmReply, CmStatus> {
        let w = CmRepWire::read_from_prefix(private_data)
            .map_err(|_| CmStatus::InvalidLen)?
            .0;
        if w.recfmt.get() != RECFMT_1_0 {
            return Err(CmStatus::InvalidRecfmt);
        }
        Ok(CmReply {
            crqsize: w.crqsize.get(),
        })
    }

    pub fn encode(&self) -> [u8; 32] {
        let w = CmRepWire {
            recfmt: RECFMT_1_0.into(),
            crqsize: self.crqsize.into(),
            rsvd: [0; 28],
        };
        let mut out = [0u8; 32];
        out.copy_from_slice(w.as_bytes());
        out
    }
}

/// A decoded CM reject: the raw status (unknown values are kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmReject {
    pub recfmt: u16,
    pub sts: u16,
}

impl CmReject {
    pub fn new(status: CmStatus) -> CmReject {
        CmReject {
            recfmt: RECFMT_1_0,
            sts: status as u16,
        }
    }

    /// Decode a reject's private data; `None` if shorter than 4 bytes (a reject from a CM
    /// timeout or a non-NVMe peer carries none).
    pub fn decode(private_data: &[u8]) -> Option<CmReject> {
        let w = CmRejWire::read_from_prefix(private_data).ok()?.0;
        Some(CmReject {
            recfmt: w.recfmt.get(),
            sts: w.sts.get(),
        })
    }

    pub fn encode(&self) -> [u8; 4] {
        let w = CmRejWire {
            recfmt: self.recfmt.into(),
            sts: self.sts.into(),
        };
        let mut out = [0u8; 4];
        out.copy_from_slice(w.as_bytes());
        out
    }

    /// The status, if it is a defined one.
    pub fn status(&self) -> Option<CmStatus> {
        CmStatus::from_u16(self.sts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_host_io_queue_request_bytes() {
        // nvme_rdma_route_resolved for I/O queue 3, queue_size 128, sqsize 127, cntlid 0x11.
        let mut b = [0u8; 32];
        b[2] = 3;
        b[4] = 128;
        b[6] = 127;
        b[8] = 0x11;
        let r = CmRequest::decode(&b).unwrap();
        assert_eq!(
            r,
            CmRequest {
                qid: 3,
                hrqsize: 128,
                hsqsize: 127,
                cntlid: 0x11
            }
        );
        assert_eq!(r.sq_depth(), 128);
        assert_eq!(r.encode(), b);
        // The CM pads private data (56 bytes on IB REQ): still accepted.
        let mut padded = [0u8; 56];
        padded[..32].copy_from_slice(&b);
        assert_eq!(CmRequest::decode(&padded).unwrap(), r);
    }

    #[test]
    fn admin_request_and_bad_inputs() {
        let adm = CmRequest {
            qid: 0,
            hrqsize: 32,
            hsqsize: 31,
            cntlid: 0,
        };
        let b = adm.encode();
        assert_eq!(&b[..8], &[0, 0, 0, 0, 32, 0, 31, 0]);
        assert_eq!(CmRequest::decode(&b[..31]), Err(CmStatus::InvalidLen));
        assert_eq!(CmRequest::decode(&[]), Err(CmStatus::InvalidLen));
        let mut bad = b;
        bad[0] = 1;
        assert_eq!(CmRequest::decode(&bad), Err(CmStatus::InvalidRecfmt));
    }

    #[test]
    fn reply_and_reject() {
        let rep = CmReply { crqsize: 128 };
        let b = rep.encode();
        assert_eq!(&b[..4], &[0, 0, 128, 0]);
        assert!(b[4..].iter().all(|&x| x == 0));
        assert_eq!(CmReply::decode(&b).unwrap(), rep);
        assert_eq!(CmReply::decode(&b[..4]), Err(CmStatus::InvalidLen));

        let rej = CmReject::new(CmStatus::InvalidHsqsize);
        assert_eq!(rej.encode(), [0, 0, 4, 0]);
        let d = CmReject::decode(&rej.encode()).unwrap();
        assert_eq!(d.status(), Some(CmStatus::InvalidHsqsize));
        assert_eq!(CmReject::decode(&[0, 0, 0x42, 0]).unwrap().status(), None);
        assert_eq!(CmReject::decode(&[0, 0]), None);
        for v in 1..=9u16 {
            assert_eq!(CmStatus::from_u16(v).map(|s| s as u16), Some(v));
        }
        assert_eq!(CmStatus::from_u16(0), None);
    }
}
