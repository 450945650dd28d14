//! The glue between a poller and its io_uring backend: the [`Store`] a transport uses.

use std::collections::VecDeque;

use crate::backend::{BufId, Device, Ring, SubmitError};
use crate::core::IoOp;
use crate::transport::Store;

/// A poller's ring and buffer pool (the ring owns the pool).
pub struct RingStore {
    ring: Ring,
    /// Operations the ring had no slot for, submitted as slots free up.
    backlog: VecDeque<(IoOp, Option<u32>, u64)>,
}

impl RingStore {
    pub fn new(ring: Ring) -> RingStore {
        RingStore {
            ring,
            backlog: VecDeque::with_capacity(64),
        }
    }

    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Operations a poller should keep polling for: all in flight but those that wait for
    /// librbd, whose results wake the ring's eventfd.
    pub fn inflight_polled(&self) -> usize {
        self.inflight() - self.ring.waiting_on_librbd()
    }

    fn push(&mut self, op: &IoOp, buf: Option<u32>, user_data: u64) -> bool {
        let b = buf.map(|b| (BufId(b as u16), 0));
        match self.ring.submit_op(op, b, user_data) {
            Ok(()) => true,
            Err(SubmitError::Busy(_)) => false,
        }
    }
}

impl Store for RingStore {
    fn alloc_buf(&mut self) -> Option<u32> {
        self.ring.pool_mut().alloc().map(|b| b.0 as u32)
    }

    fn free_buf(&mut self, buf: u32) {
        if let Err(e) = self.ring.pool_mut().free(BufId(buf as u16)) {
            tracing::error!(error = %e, "buffer pool misuse");
        }
    }

    fn buf(&mut self, buf: u32) -> &mut [u8] {
        self.ring
            .pool_mut()
            .buf_mut(BufId(buf as u16))
            .expect("buffer ids come from this pool")
    }

    fn payload(&self, buf: u32, len: usize) -> &[u8] {
        self.ring
            .pool()
            .payload(BufId(buf as u16), len)
            .expect("buffer ids come from this pool")
    }

    fn submit(&mut self, op: &IoOp, buf: Option<u32>, user_data: u64) {
        if !self.backlog.is_empty() || !self.push(op, buf, user_data) {
            self.backlog.push_back((op.clone(), buf, user_data));
        }
    }

    fn reap(&mut self, out: &mut Vec<(u64, Result<u32, i32>)>) {
        if let Err(e) = self.ring.submit() {
            tracing::error!(error = %e, "io_uring submit failed");
        }
        self.ring.reap(|ud, r| out.push((ud, r)));
        while let Some((op, buf, ud)) = self.backlog.pop_front() {
            if !self.push(&op, buf, ud) {
                self.backlog.push_front((op, buf, ud));
                break;
            }
        }
    }

    fn inflight(&self) -> usize {
        self.ring.in_flight() + self.backlog.len()
    }

    fn buffers_in_use(&self) -> usize {
        let p = self.ring.pool();
        p.count() as usize - p.free_count()
    }

    fn ring_enters(&self) -> u64 {
        self.ring.stats().enters
    }

    fn set_device(&mut self, index: u32, device: Option<&Device>) -> std::io::Result<()> {
        self.ring.set_device(index, device)
    }
}
