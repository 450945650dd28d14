//! In-memory stand-ins for what a poller gives its connections: a buffer pool and backend
//! ([`MemStore`]) and a byte stream ([`MemWire`]). With them a transport connection's state
//! machine runs without io_uring, files or sockets, under a clock the caller passes in: its
//! unit tests and the fuzz targets use them. Compiled for tests and with the `testing` feature.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::SocketAddr;

use super::tcp::wire::Wire;
use super::Store;
use crate::core::{IoKind, IoOp};

/// A buffer pool and "backend" in memory: operations complete at the next [`Store::reap`]
/// (reads fill the buffer with a pattern; with `fail` set they fail with that errno). It
/// checks what a real pool would corrupt silently: double frees, use of a free buffer and I/O
/// beyond a buffer.
pub struct MemStore {
    bufs: Vec<Vec<u8>>,
    free: Vec<u32>,
    in_use: Vec<bool>,
    /// Per buffer, operations in flight that use it (freeing it meanwhile is a bug: the real
    /// pool refuses, and the buffer would be lost).
    busy: Vec<u32>,
    /// In flight: (user_data, length, buffers the op uses).
    pending: VecDeque<(u64, u32, [Option<u32>; 2])>,
    pub submitted: u64,
    /// Every Compare and Write submitted: (the Compare's buffer, the Write's buffer, the
    /// first byte of the Write's data).
    pub compare_and_writes: Vec<(Option<u32>, Option<u32>, u8)>,
    /// Complete every operation reaped with this errno instead of success.
    pub fail: Option<i32>,
}

impl MemStore {
    pub fn new(count: usize, size: usize) -> MemStore {
        MemStore {
            bufs: (0..count).map(|_| vec![0u8; size]).collect(),
            free: (0..count as u32).rev().collect(),
            in_use: vec![false; count],
            busy: vec![0; count],
            pending: VecDeque::new(),
            submitted: 0,
            compare_and_writes: Vec::new(),
            fail: None,
        }
    }
}

impl Store for MemStore {
    fn alloc_buf(&mut self) -> Option<u32> {
        let b = self.free.pop()?;
        self.in_use[b as usize] = true;
        Some(b)
    }

    fn free_buf(&mut self, buf: u32) {
        assert!(self.in_use[buf as usize], "buffer {buf} freed twice");
        assert_eq!(self.busy[buf as usize], 0, "buffer {buf} freed under I/O");
        self.in_use[buf as usize] = false;
        self.free.push(buf);
    }

    fn buf(&mut self, buf: u32) -> &mut [u8] {
        assert!(self.in_use[buf as usize], "buffer {buf} used while free");
        &mut self.bufs[buf as usize]
    }

    fn payload(&self, buf: u32, len: usize) -> &[u8] {
        assert!(self.in_use[buf as usize], "buffer {buf} sent while free");
        &self.bufs[buf as usize][..len]
    }

    fn submit(&mut self, op: &IoOp, buf: Option<u32>, user_data: u64) {
        self.submitted += 1;
        match op.kind {
            IoKind::Read | IoKind::Write | IoKind::WriteFua => {
                let b = buf.expect("a data operation has a buffer");
                assert!(self.in_use[b as usize], "I/O on a free buffer");
                let bytes = &mut self.bufs[b as usize];
                assert!(
                    op.len as usize <= bytes.len(),
                    "I/O of {} bytes on a {}-byte buffer",
                    op.len,
                    bytes.len()
                );
                if op.kind == IoKind::Read {
                    bytes[..op.len as usize].fill((op.offset >> 9) as u8 | 1);
                }
            }
            IoKind::CompareAndWrite { write_buf, .. } => {
                for b in [buf, write_buf] {
                    let b = b.expect("a Compare and Write has both buffers");
                    assert!(self.in_use[b as usize], "I/O on a free buffer");
                }
                let first = write_buf.map_or(0, |b| self.bufs[b as usize][0]);
                self.compare_and_writes.push((buf, write_buf, first));
            }
            _ => {}
        }
        let uses = match op.kind {
            IoKind::CompareAndWrite { write_buf, .. } => [buf, write_buf],
            _ => [buf, None],
        };
        for b in uses.iter().flatten() {
            self.busy[*b as usize] += 1;
        }
        self.pending.push_back((user_data, op.len, uses));
    }

    fn reap(&mut self, out: &mut Vec<(u64, Result<u32, i32>)>) {
        let fail = self.fail;
        for (ud, len, uses) in self.pending.drain(..) {
            for b in uses.iter().flatten() {
                self.busy[*b as usize] -= 1;
            }
            out.push(match fail {
                Some(e) => (ud, Err(e)),
                None => (ud, Ok(len)),
            });
        }
    }

    fn inflight(&self) -> usize {
        self.pending.len()
    }

    fn buffers_in_use(&self) -> usize {
        self.in_use.iter().filter(|&&u| u).count()
    }

    fn set_device(
        &mut self,
        _index: u32,
        _device: Option<&crate::backend::Device>,
    ) -> std::io::Result<()> {
        // Memory only: there are no devices to register.
        Ok(())
    }
}

/// A byte stream in memory: what the peer sent waits in `inbound`, what the connection sent
/// collects in `outbound`. Reads and sends can be cut short (`recv_max`, `send_max`) and the
/// stream can be made full (`send_room`), as a socket's buffers would.
pub struct MemWire {
    /// Bytes the peer sent and the connection has not read yet.
    pub inbound: VecDeque<u8>,
    /// The peer closed its side: a read of an empty `inbound` returns 0.
    pub peer_closed: bool,
    /// Most bytes one read returns.
    pub recv_max: usize,
    /// Bytes the connection sent.
    pub outbound: Vec<u8>,
    /// Bytes the stream takes before it is full (sends return "would block"); a test adds
    /// room as its peer "reads".
    pub send_room: usize,
    /// Most bytes one send takes.
    pub send_max: usize,
    /// The connection shut the stream down.
    pub shut: bool,
    /// Read and send calls made.
    pub recv_calls: u64,
    pub send_calls: u64,
}

impl Default for MemWire {
    fn default() -> MemWire {
        MemWire {
            inbound: VecDeque::new(),
            peer_closed: false,
            recv_max: usize::MAX,
            outbound: Vec::new(),
            send_room: usize::MAX,
            send_max: usize::MAX,
            shut: false,
            recv_calls: 0,
            send_calls: 0,
        }
    }
}

impl MemWire {
    /// The peer sends `bytes`.
    pub fn deliver(&mut self, bytes: &[u8]) {
        self.inbound.extend(bytes);
    }

    /// Take what the connection sent so far.
    pub fn take_sent(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.outbound)
    }
}

impl Wire for MemWire {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_calls += 1;
        if self.shut {
            return Ok(0);
        }
        if self.inbound.is_empty() {
            return if self.peer_closed {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(self.inbound.len()).min(self.recv_max);
        for (d, s) in buf[..n].iter_mut().zip(self.inbound.drain(..n)) {
            *d = s;
        }
        Ok(n)
    }

    fn send(&mut self, iov: &[IoSlice<'_>]) -> io::Result<Option<usize>> {
        self.send_calls += 1;
        if self.shut {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let mut take = self.send_room.min(self.send_max);
        if take == 0 {
            return Ok(None);
        }
        let mut sent = 0;
        for s in iov {
            let n = s.len().min(take);
            self.outbound.extend_from_slice(&s[..n]);
            sent += n;
            take -= n;
            if take == 0 {
                break;
            }
        }
        self.send_room -= sent;
        Ok(Some(sent))
    }

    fn shutdown(&mut self) {
        self.shut = true;
    }

    fn peer(&self) -> String {
        "mem".into()
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        None
    }
}
