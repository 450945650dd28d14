//! Safe owner types over libibverbs and librdmacm (rdma-sys 0.3): the only crate of nvmf-rs
//! with verbs FFI. It knows nothing about NVMe.
//!
//! # Ownership
//! One owner type per verbs object, released in `Drop`. Children hold an `Arc` of their parent,
//! so destruction order is forced: a [`Qp`] keeps its [`CmId`], [`Pd`], [`Cq`]s and [`Srq`]
//! alive; an [`Mr`] keeps its `Pd`; a `Pd`, `Cq` or [`CompChannel`] keeps its [`Context`]; a
//! `CmId` keeps its [`EventChannel`]'s channel. A registered buffer owns its memory
//! ([`Mr::alloc`]); registering foreign memory is `unsafe` ([`Mr::register_external`]).
//!
//! # Threads
//! The I/O path is lock-free in this crate: a poller thread owns its [`Cq`]s and [`Qp`]s
//! (`Qp` is `Send`, not `Sync`), polls batches into a reused `[WorkCompletion]` and posts
//! without allocating ([`Qp::post_send`] links up to [`MAX_CHAIN`] work requests on the stack).
//! rdma_cm calls are slow-path and serialized per event channel (see [`cm`]); events are copied
//! and acknowledged on retrieval so destroying an id never waits on one.
//!
//! # Connecting
//! The active side's setup (resolve address with retries and route, then connect and wait for
//! ESTABLISHED or a typed REJECTED) is written once, in [`active`]; every client uses it.
//!
//! # Without RDMA
//! [`devices`] returns an empty list on a kernel without RDMA (libibverbs reports ENOSYS) and
//! [`EventChannel::new`] returns [`Error::NoRdma`].
//!
//! # Provider notes (rxe, siw)
//! See `shared/notes/rdma-binding.md`: on iWARP (siw, [`Transport::Iwarp`]) RDMA READ sinks
//! need `LOCAL_WRITE | REMOTE_WRITE` and one SGE per READ; siw enforces `RLIMIT_MEMLOCK` on
//! every registration, even for root.

pub mod active;
mod addr;
pub mod cm;
mod cq;
mod device;
mod error;
mod mr;
mod mw;
mod qp;
mod srq;
mod sys;

pub use addr::{local_rdma_ipv4, RdmaAddress};
pub use cm::{CmEvent, CmEventType, CmId, ConnParam, EventChannel};
pub use cq::{CompChannel, Cq, WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use device::{
    cm_contexts, devices, AsyncElement, AsyncEvent, AsyncEventType, Context, DeviceAttr,
    DeviceInfo, LinkLayer, PortAttr, PortState, Transport,
};
pub use error::{Error, Result};
pub use mr::{AccessFlags, Mr, Pd, RemoteBuf, Sge};
pub use mw::{next_rkey, Mw, MwBind};
pub use qp::{Qp, QpCaps, QpInitAttr, QpState, RecvWr, SendFlags, SendOp, SendWr, MAX_CHAIN};
pub use srq::Srq;

#[cfg(test)]
mod thread_safety {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn owner_types_cross_threads_as_designed() {
        send_sync::<super::Context>();
        send_sync::<super::Pd>();
        send_sync::<super::Mr>();
        // Mw is Send but not Sync (see the compile_fail doctest on Mw).
        send::<super::Mw>();
        send_sync::<super::CompChannel>();
        send_sync::<super::Cq>();
        send_sync::<super::Srq>();
        send_sync::<super::EventChannel>();
        send_sync::<super::CmId>();
        send::<super::CmEvent>();
        // Qp is Send but deliberately not Sync (see the compile_fail doctest on Qp).
        send::<super::Qp>();
    }
}
