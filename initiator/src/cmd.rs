//! Commands and facts that every other module builds on: the [`Transport`] choice, a
//! namespace's geometry ([`NsInfo`]), a command's data and completion ([`Data`], [`DataRef`],
//! [`Completion`], [`SubmitError`]), the queue counters ([`Stats`]), and the Read/Write/Flush/
//! Write Zeroes SQEs the queues' `submit_*` methods send. A leaf: it depends on no other module of the crate but the error
//! type.

use nvme::identify::IdentifyNamespace;
use nvme::opcode::io;
use nvme::Sqe;

use std::fmt::Debug;

use crate::error::{CmdError, Error};

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

/// A command's data buffer, owned by the caller of [`crate::Queue::submit`] and returned in its
/// [`Completion`]. `B` is the queue's buffer type ([`crate::Link::Buf`]).
#[derive(Debug)]
pub enum Data<B = Vec<u8>> {
    /// No data.
    None,
    /// Data sent to the controller (the whole buffer).
    ToController(B),
    /// Data received from the controller (fills the whole buffer).
    FromController(B),
}

/// The end of one command submitted with [`crate::Queue::submit`].
#[derive(Debug)]
pub struct Completion<B = Vec<u8>> {
    /// The tag [`crate::Queue::submit`] returned (it is also the command identifier).
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
pub struct SubmitError<B: Debug = Vec<u8>> {
    pub error: Error,
    pub buf: Option<B>,
}

/// Counters of one queue. Copy accounting: every payload byte that crosses a socket counts as
/// one copy (the kernel copies it between its socket buffers and ours), and every payload byte
/// moved by `memcpy` in user space as one more; data the RDMA device places costs none.
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
    /// System calls: `read`/`readv`/`writev`/`poll` over TCP; completion-channel sleeps, event
    /// reads and per-command registrations over RDMA (posting is the provider's doorbell and
    /// not counted).
    pub syscalls: u64,
    /// NVMe/RDMA: memory windows bound over a command's buffer (one per command whose data
    /// the target moves, on devices with windows).
    pub keys_bound: u64,
    /// NVMe/RDMA: window keys the target invalidated with its response (SEND_WITH_INV).
    pub keys_invalidated_by_target: u64,
    /// NVMe/RDMA: window keys this host invalidated (LOCAL_INV) because the response did not.
    pub keys_invalidated_locally: u64,
    /// NVMe/RDMA: buffers registered for one command (devices without windows; two system
    /// calls each, counted in `syscalls`).
    pub keys_registered: u64,
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
        self.keys_bound += o.keys_bound;
        self.keys_invalidated_by_target += o.keys_invalidated_by_target;
        self.keys_invalidated_locally += o.keys_invalidated_locally;
        self.keys_registered += o.keys_registered;
    }
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

/// Transports the initiator can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// NVMe/TCP.
    #[default]
    Tcp,
    /// NVMe/RDMA over rdma_cm (see [`crate::rdma`]).
    Rdma,
}

/// A namespace's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsInfo {
    pub nsid: u32,
    /// Size in logical blocks (NSZE).
    pub blocks: u64,
    /// Logical block size in bytes (from the LBA format FLBAS selects).
    pub block_size: u32,
    /// Metadata bytes per block of that format (0 for none).
    pub metadata_size: u16,
}

impl NsInfo {
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.blocks * self.block_size as u64
    }

    pub(crate) fn from_identify(nsid: u32, id: &IdentifyNamespace) -> Result<NsInfo, Error> {
        // FLBAS bits 3:0 select the format; bits 6:5 are the upper bits when NLBAF > 16.
        let idx = (id.flbas & 0x0f) as usize | (((id.flbas >> 5) & 0x03) as usize) << 4;
        let f = id
            .lbaf
            .get(idx)
            .filter(|_| idx <= id.nlbaf as usize)
            .ok_or_else(|| {
                Error::Controller(format!(
                    "namespace {nsid}: FLBAS selects format {idx} of {}",
                    id.nlbaf as u32 + 1
                ))
            })?;
        if !(9..=31).contains(&f.ds) {
            return Err(Error::Controller(format!(
                "namespace {nsid}: LBA data size 2^{} bytes",
                f.ds
            )));
        }
        Ok(NsInfo {
            nsid,
            blocks: id.nsze.get(),
            block_size: 1 << f.ds,
            metadata_size: f.ms.get(),
        })
    }
}

/// The SQE and data of a Read into `buf` (`io::READ`) or a Write of `buf` (`io::WRITE`) at block
/// `slba` of `ns`; an invalid length or range gives the buffer back in the error.
pub(crate) fn rw_cmd<B: std::ops::Deref<Target = [u8]> + std::fmt::Debug>(
    opcode: u8,
    ns: &NsInfo,
    slba: u64,
    buf: B,
) -> Result<(Sqe, Data<B>), SubmitError<B>> {
    match blocks_of(ns, slba, buf.len()) {
        Ok(nlb) => {
            let sqe = rw_sqe(opcode, ns.nsid, slba, nlb);
            let data = if opcode == io::READ {
                Data::FromController(buf)
            } else {
                Data::ToController(buf)
            };
            Ok((sqe, data))
        }
        Err(error) => Err(SubmitError {
            error,
            buf: Some(buf),
        }),
    }
}

/// A Write Zeroes SQE for `nlb` blocks (1..=65536) at `slba` of `ns`.
pub(crate) fn write_zeroes_sqe(ns: &NsInfo, slba: u64, nlb: u32) -> Result<Sqe, Error> {
    if nlb == 0 || nlb > 1 << 16 || slba.checked_add(nlb as u64).is_none_or(|e| e > ns.blocks) {
        return Err(Error::InvalidArgument(format!(
            "Write Zeroes of {nlb} blocks at {slba}"
        )));
    }
    Ok(rw_sqe(io::WRITE_ZEROES, ns.nsid, slba, nlb))
}

/// A Flush SQE for `nsid`.
pub(crate) fn flush_sqe(nsid: u32) -> Sqe {
    let mut sqe = Sqe::new(io::FLUSH, 0);
    sqe.nsid = nsid.into();
    sqe
}

/// `submit_read`, `submit_write` and `submit_flush` over a queue's `submit(sqe, data,
/// user_data)`, which returns `Result<$id, SubmitError<$buf>>`: the `Queue`
/// trait's provided methods and the inherent ones of `IoQueue` and `ReconnectingQueue`.
macro_rules! rw_submit_methods {
    ($vis:vis, $buf:ty, $id:ty) => {
        $crate::cmd::rw_submit_methods!(@rw $vis, $buf, $id, submit_read, READ,
            "Submit a Read of `buf.len()` bytes at block `slba` of `ns` (the length must be a \
             whole number of blocks, at most the controller's MDTS).");
        $crate::cmd::rw_submit_methods!(@rw $vis, $buf, $id, submit_write, WRITE,
            "Submit a Write of `buf` at block `slba` of `ns`.");

        /// Submit a Flush of `nsid`.
        $vis fn submit_flush(
            &mut self,
            nsid: u32,
            user_data: u64,
        ) -> Result<$id, $crate::cmd::SubmitError<$buf>> {
            self.submit(
                $crate::cmd::flush_sqe(nsid),
                $crate::cmd::Data::None,
                user_data,
            )
        }
    };
    (@rw $vis:vis, $buf:ty, $id:ty, $name:ident, $opcode:ident, $doc:literal) => {
        #[doc = $doc]
        $vis fn $name(
            &mut self,
            ns: &$crate::cmd::NsInfo,
            slba: u64,
            buf: $buf,
            user_data: u64,
        ) -> Result<$id, $crate::cmd::SubmitError<$buf>> {
            let (sqe, data) =
                $crate::cmd::rw_cmd(::nvme::opcode::io::$opcode, ns, slba, buf)?;
            self.submit(sqe, data, user_data)
        }
    };
}
pub(crate) use rw_submit_methods;

/// A Read/Write/Write Zeroes SQE of `nlb` (1..=65536) blocks at `slba` (CID and data pointer
/// are the queue's business): for [`crate::Queue::submit`] where the `submit_*` helpers do not
/// fit (a FUA write: set CDW12 bit 30).
pub fn rw_sqe(opcode: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
    let mut sqe = Sqe::new(opcode, 0);
    sqe.nsid = nsid.into();
    sqe.cdw10 = (slba as u32).into();
    sqe.cdw11 = ((slba >> 32) as u32).into();
    sqe.cdw12 = (nlb - 1).into();
    sqe
}

pub(crate) fn blocks_of(ns: &NsInfo, slba: u64, len: usize) -> Result<u32, Error> {
    let bs = ns.block_size as usize;
    if len == 0 || len % bs != 0 || len / bs > 1 << 16 {
        return Err(Error::InvalidArgument(format!(
            "{len} bytes is not 1..=65536 blocks of {bs}"
        )));
    }
    let nlb = (len / bs) as u32;
    if slba.checked_add(nlb as u64).is_none_or(|e| e > ns.blocks) {
        return Err(Error::InvalidArgument(format!(
            "blocks {slba}+{nlb} beyond the namespace ({} blocks)",
            ns.blocks
        )));
    }
    Ok(nlb)
}
