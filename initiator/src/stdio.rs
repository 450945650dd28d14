//! [`std::io::Read`], [`Write`](std::io::Write) and [`Seek`](std::io::Seek) over a namespace,
//! so `std::io::copy` and crates that read disk images work on a remote namespace.
//!
//! Any offset and length: the adapter moves whole blocks (at most [`NamespaceIo::CHUNK`] bytes
//! per call) through a buffer of its own, reading the partial first and last blocks of a write
//! before writing them back (read-modify-write: another host writing the same blocks at the
//! same time can lose the bytes it wrote there, as with any block device). Reads stop at the
//! end of the namespace (0: end of file); writes there fail with `WriteZero`. `flush` sends
//! an NVMe Flush.

use std::io::{self, Read, Seek, SeekFrom, Write};

use crate::error::Error;
use crate::namespace::Namespace;

/// A namespace with a position, for `std::io`. Make one with [`Namespace::into_io`].
#[derive(Debug)]
pub struct NamespaceIo {
    ns: Namespace,
    pos: u64,
    buf: Vec<u8>,
}

impl Namespace {
    /// This namespace as a `std::io` byte stream at position 0.
    pub fn into_io(self) -> NamespaceIo {
        NamespaceIo {
            ns: self,
            pos: 0,
            buf: Vec::new(),
        }
    }
}

fn io_err(e: Error) -> io::Error {
    io::Error::other(e)
}

impl NamespaceIo {
    /// The most bytes one `read` or `write` call moves.
    pub const CHUNK: usize = 1 << 20;

    /// The namespace back.
    pub fn into_inner(self) -> Namespace {
        self.ns
    }

    /// The namespace (for its size, block size, or block-aligned I/O).
    pub fn get_mut(&mut self) -> &mut Namespace {
        &mut self.ns
    }

    /// The current position in bytes.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// `len` bytes at the position, clipped to the chunk and the namespace: the block-aligned
    /// range around them, as (aligned start, aligned length, offset of `pos` in it, bytes).
    fn span(&self, len: usize) -> Option<(u64, usize, usize, usize)> {
        let size = self.ns.size();
        if self.pos >= size || len == 0 {
            return None;
        }
        let bs = u64::from(self.ns.block_size());
        let n = (len.min(Self::CHUNK) as u64).min(size - self.pos);
        let start = self.pos - self.pos % bs;
        let end = (self.pos + n).div_ceil(bs) * bs;
        Some((
            start,
            (end - start) as usize,
            (self.pos - start) as usize,
            n as usize,
        ))
    }
}

impl Read for NamespaceIo {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let Some((start, alen, skip, n)) = self.span(out.len()) else {
            return Ok(0);
        };
        self.buf.resize(alen, 0);
        self.ns.read_at(&mut self.buf, start).map_err(io_err)?;
        out[..n].copy_from_slice(&self.buf[skip..skip + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for NamespaceIo {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let Some((start, alen, skip, n)) = self.span(data.len()) else {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "at the end of the namespace",
            ));
        };
        let bs = self.ns.block_size() as usize;
        self.buf.resize(alen, 0);
        // Partial first and last blocks keep the bytes around the new ones.
        if skip != 0 {
            self.ns
                .read_at(&mut self.buf[..bs], start)
                .map_err(io_err)?;
        }
        if (skip + n) % bs != 0 && (alen > bs || skip == 0) {
            let last = alen - bs;
            self.ns
                .read_at(&mut self.buf[last..], start + last as u64)
                .map_err(io_err)?;
        }
        self.buf[skip..skip + n].copy_from_slice(&data[..n]);
        self.ns.write_at(&self.buf, start).map_err(io_err)?;
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.ns.flush().map_err(io_err)
    }
}

impl Seek for NamespaceIo {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let base = match to {
            SeekFrom::Start(p) => {
                self.pos = p;
                return Ok(p);
            }
            SeekFrom::End(d) => (self.ns.size(), d),
            SeekFrom::Current(d) => (self.pos, d),
        };
        match base.0.checked_add_signed(base.1) {
            Some(p) => {
                self.pos = p;
                Ok(p)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek to a negative or overflowing position",
            )),
        }
    }
}
