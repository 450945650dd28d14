//! An in-memory byte stream under the NVMe/TCP link, for its unit tests: no socket and no
//! thread; the test plays the controller on the other end and chooses how much each read and
//! write of the link moves (as a socket's buffers would cut them short), so every interleaving
//! runs the same way each time.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::sync::{Arc, Mutex, MutexGuard};

/// Both directions of the stream.
#[derive(Debug, Default)]
pub(crate) struct MemWire {
    /// What the host sent, for the test's controller.
    pub(crate) to_ctrl: VecDeque<u8>,
    /// What the controller sent, for the host.
    pub(crate) to_host: VecDeque<u8>,
    /// Most bytes one read of the link returns (0: no limit).
    pub(crate) recv_max: usize,
    /// Most bytes one write of the link takes (0: no limit); `full` takes none.
    pub(crate) send_max: usize,
    pub(crate) full: bool,
    /// Either side closed the stream.
    pub(crate) closed: bool,
    pub(crate) reads: u64,
    pub(crate) writes: u64,
}

/// A handle on a [`MemWire`]: the link holds one, the test another.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemEnd(Arc<Mutex<MemWire>>);

impl MemEnd {
    pub(crate) fn lock(&self) -> MutexGuard<'_, MemWire> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The link reads: what the controller sent, at most `recv_max`; would block when empty.
    pub(crate) fn read(&self, iov: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let mut w = self.lock();
        w.reads += 1;
        if w.to_host.is_empty() {
            return if w.closed {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let mut left = if w.recv_max == 0 {
            usize::MAX
        } else {
            w.recv_max
        };
        let mut got = 0;
        for b in iov.iter_mut() {
            let n = b.len().min(left).min(w.to_host.len());
            for (d, s) in b[..n].iter_mut().zip(w.to_host.drain(..n)) {
                *d = s;
            }
            got += n;
            left -= n;
            if left == 0 || w.to_host.is_empty() {
                break;
            }
        }
        Ok(got)
    }

    /// The link writes: at most `send_max` bytes; would block while `full`.
    pub(crate) fn write(&self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut w = self.lock();
        w.writes += 1;
        if w.closed {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        if w.full {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut left = if w.send_max == 0 {
            usize::MAX
        } else {
            w.send_max
        };
        let mut took = 0;
        for b in iov {
            let n = b.len().min(left);
            w.to_ctrl.extend(&b[..n]);
            took += n;
            left -= n;
            if left == 0 {
                break;
            }
        }
        Ok(took)
    }

    pub(crate) fn shut(&self) {
        self.lock().closed = true;
    }

    /// The controller's side: take what the host sent so far.
    pub(crate) fn take_sent(&self) -> Vec<u8> {
        self.lock().to_ctrl.drain(..).collect()
    }

    /// The controller's side: send `bytes` to the host.
    pub(crate) fn deliver(&self, bytes: &[u8]) {
        self.lock().to_host.extend(bytes);
    }
}
