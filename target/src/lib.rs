//! nvmf-target: a userspace NVMe-over-Fabrics target.
//!
//! Layering (see DESIGN.md): `core` (controller state machines, no I/O) ← `transport` (TCP,
//! RDMA: move capsules and data) and `backend` (io_uring: run reads/writes); `daemon` wires
//! them together on poller threads.

pub mod backend;
pub mod core;
pub mod ctl;
pub mod daemon;
pub mod gateway;
pub mod metrics;
pub mod notify;
pub mod resv_store;
pub mod store;
pub mod transport;
