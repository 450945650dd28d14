//! Backend tests against real files (O_DIRECT on the host's filesystem, and forced buffered
//! mode) and the null device.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::core::{put_trim_range, IoKind, IoOp};

/// splitmix64: a small deterministic generator for test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform-enough integer in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        // Next to the test binary: the build filesystem, which supports O_DIRECT where /tmp
        // (possibly tmpfs) may not. NVMF_TEST_DIR overrides.
        let base = std::env::var_os("NVMF_TEST_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::current_exe()
                    .ok()
                    .and_then(|e| e.parent().map(Path::to_path_buf))
            })
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("backend-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MIB: u64 = 1 << 20;

fn file_spec(path: &Path, size: u64, buffered: bool) -> DeviceSpec {
    DeviceSpec::File(FileSpec {
        path: path.to_owned(),
        size: Some(size),
        block_size: Some(4096),
        read_only: false,
        buffered,
    })
}

fn ring_for(specs: &[DeviceSpec], bufs: u32, buf_size: usize, inflight: u32) -> Ring {
    let devices = Arc::new(Devices::open(specs).unwrap());
    let pool = BufPool::new(bufs, buf_size).unwrap();
    Ring::new(
        RingConfig {
            sq_entries: 32,
            max_inflight: inflight,
            sqpoll: None,
            iopoll: false,
        },
        devices,
        pool,
    )
    .unwrap()
}

fn op(device: u32, kind: IoKind, offset: u64, len: u32) -> IoOp {
    IoOp {
        device,
        kind,
        offset,
        len,
    }
}

/// Runs one op to completion and returns its result.
fn run(ring: &mut Ring, o: &IoOp, buf: Option<(BufId, u32)>) -> Result<u32, i32> {
    const TAG: u64 = 0xfeed;
    ring.submit_op(o, buf, TAG).unwrap();
    ring.submit().unwrap();
    let mut out = None;
    for _ in 0..1000 {
        ring.reap(|ud, r| {
            assert_eq!(ud, TAG);
            out = Some(r);
        });
        if let Some(r) = out {
            return r;
        }
        ring.wait(Some(Duration::from_secs(5))).unwrap();
    }
    panic!("op never completed");
}

/// Runs a Trim of these (offset, len) byte ranges on `dev`, its range list in a pool buffer as
/// the core leaves it.
fn run_trim(ring: &mut Ring, dev: u32, ranges: &[(u64, u64)]) -> Result<u32, i32> {
    let b = ring.pool_mut().alloc().unwrap();
    let buf = ring.pool_mut().buf_mut(b).unwrap();
    for (i, &(off, len)) in ranges.iter().enumerate() {
        put_trim_range(buf, i, off, len);
    }
    let trim = IoKind::Trim {
        ranges: ranges.len() as u16,
    };
    let r = run(ring, &op(dev, trim, 0, 0), Some((b, 0)));
    ring.pool_mut().free(b).unwrap();
    r
}

/// Reads `len` bytes at `offset` into a fresh buffer and returns a copy.
fn read_back(ring: &mut Ring, dev: u32, offset: u64, len: u32) -> Vec<u8> {
    let b = ring.pool_mut().alloc().unwrap();
    ring.pool_mut().buf_mut(b).unwrap().fill(0x5a);
    assert_eq!(
        run(ring, &op(dev, IoKind::Read, offset, len), Some((b, 0))),
        Ok(len)
    );
    let v = ring.pool().buf(b).unwrap()[..len as usize].to_vec();
    ring.pool_mut().free(b).unwrap();
    v
}

fn write_random_and_verify(buffered: bool) {
    let dir = Scratch::new(if buffered { "rw-buffered" } else { "rw-direct" });
    let path = dir.path("disk.img");
    let size = 16 * MIB;
    let mut ring = ring_for(&[file_spec(&path, size, buffered)], 8, 128 * 1024, 32);
    let dev = ring.devices().get(0).unwrap();
    assert_eq!(dev.is_direct(), !buffered);
    assert_eq!(dev.size_bytes(), size);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);

    let mut rng = Rng(7);
    let mut model = vec![0u8; size as usize];
    for _ in 0..64 {
        let blocks = rng.range(1, 32);
        let len = (blocks * 4096) as u32;
        let offset = rng.range(0, (size - u64::from(len)) / 4096) * 4096;
        let boff = (rng.range(0, u64::from(128 * 1024 - len) / 4096) * 4096) as u32;
        let b = ring.pool_mut().alloc().unwrap();
        let data = &mut ring.pool_mut().buf_mut(b).unwrap()[boff as usize..(boff + len) as usize];
        rng.fill(data);
        model[offset as usize..offset as usize + len as usize].copy_from_slice(data);
        assert_eq!(
            run(
                &mut ring,
                &op(0, IoKind::Write, offset, len),
                Some((b, boff))
            ),
            Ok(len)
        );
        ring.pool_mut().free(b).unwrap();
        // Read back a random window covering the write.
        let got = read_back(&mut ring, 0, offset, len);
        assert!(got == model[offset as usize..(offset + u64::from(len)) as usize]);
    }
    assert_eq!(run(&mut ring, &op(0, IoKind::Flush, 0, 0), None), Ok(0));
    // The whole device matches the model, read through the page cache independently.
    let f = std::fs::File::open(&path).unwrap();
    let mut all = vec![0u8; size as usize];
    f.read_exact_at(&mut all, 0).unwrap();
    assert!(all == model, "file contents differ from the model");
    let st = *ring.stats();
    assert_eq!(st.submitted, st.completed);
    assert_eq!(st.errors, 0);
    assert!(st.bytes_written > 0 && st.bytes_read == st.bytes_written);
    assert!(st.enters > 0);
}

#[test]
fn write_read_random_direct() {
    write_random_and_verify(false);
}

#[test]
fn write_read_random_buffered() {
    write_random_and_verify(true);
}

fn zeroes_and_trim(buffered: bool) {
    let dir = Scratch::new(if buffered {
        "zero-buffered"
    } else {
        "zero-direct"
    });
    let path = dir.path("disk.img");
    let size = 4 * MIB;
    let mut ring = ring_for(&[file_spec(&path, size, buffered)], 4, 128 * 1024, 8);
    let b = ring.pool_mut().alloc().unwrap();
    // Fill the first 1 MiB with 0xab.
    ring.pool_mut().buf_mut(b).unwrap().fill(0xab);
    for i in 0..16 {
        let o = op(0, IoKind::Write, i * 65536, 65536);
        assert_eq!(run(&mut ring, &o, Some((b, 0))), Ok(65536));
    }
    ring.pool_mut().free(b).unwrap();
    // Write Zeroes over [8 KiB, 72 KiB).
    assert_eq!(
        run(&mut ring, &op(0, IoKind::WriteZeroes, 8192, 65536), None),
        Ok(0)
    );
    let got = read_back(&mut ring, 0, 0, 65536 + 16384);
    assert!(got[..8192].iter().all(|&x| x == 0xab));
    assert!(got[8192..73728].iter().all(|&x| x == 0));
    assert!(got[73728..].iter().all(|&x| x == 0xab));
    // Trim two ranges: [256 KiB, 320 KiB) and [512 KiB, 516 KiB).
    let ranges = [(262144, 65536), (524288, 4096), (600000 / 4096 * 4096, 0)];
    assert_eq!(run_trim(&mut ring, 0, &ranges), Ok(0));
    let got = read_back(&mut ring, 0, 262144 - 4096, 65536 + 8192);
    assert!(got[..4096].iter().all(|&x| x == 0xab));
    assert!(got[4096..4096 + 65536].iter().all(|&x| x == 0));
    assert!(got[4096 + 65536..].iter().all(|&x| x == 0xab));
    let got = read_back(&mut ring, 0, 524288, 8192);
    assert!(got[..4096].iter().all(|&x| x == 0));
    assert!(got[4096..].iter().all(|&x| x == 0xab));
    assert_eq!(ring.stats().errors, 0);
}

#[test]
fn write_zeroes_and_trim_direct() {
    zeroes_and_trim(false);
}

#[test]
fn write_zeroes_and_trim_buffered() {
    zeroes_and_trim(true);
}

#[test]
fn null_device() {
    let specs = [DeviceSpec::Null {
        size: 64 * MIB,
        block_size: 512,
    }];
    let mut ring = ring_for(&specs, 2, 8192, 4);
    let enters_before = ring.stats().enters;
    let b = ring.pool_mut().alloc().unwrap();
    ring.pool_mut().buf_mut(b).unwrap().fill(0xcc);
    assert_eq!(
        run(&mut ring, &op(0, IoKind::Write, 512, 4096), Some((b, 0))),
        Ok(4096)
    );
    // Reads zero-fill exactly the requested range of the buffer.
    assert_eq!(
        run(&mut ring, &op(0, IoKind::Read, 0, 1024), Some((b, 512))),
        Ok(1024)
    );
    let v = ring.pool().buf(b).unwrap();
    assert!(v[..512].iter().all(|&x| x == 0xcc));
    assert!(v[512..1536].iter().all(|&x| x == 0));
    assert!(v[1536..].iter().all(|&x| x == 0xcc));
    // From the buffer's start the zeroes are lazy: sent from the pool's zero region, written
    // into the buffer when it is looked at.
    ring.pool_mut().buf_mut(b).unwrap().fill(0xcc);
    assert_eq!(
        run(&mut ring, &op(0, IoKind::Read, 0, 2048), Some((b, 0))),
        Ok(2048)
    );
    assert!(ring
        .pool()
        .payload(b, 2048)
        .unwrap()
        .iter()
        .all(|&x| x == 0));
    let v = ring.pool().buf(b).unwrap();
    assert!(v[..2048].iter().all(|&x| x == 0));
    assert!(v[2048..].iter().all(|&x| x == 0xcc));
    assert_eq!(run(&mut ring, &op(0, IoKind::Flush, 0, 0), None), Ok(0));
    assert_eq!(
        run(&mut ring, &op(0, IoKind::WriteZeroes, 0, 4096), None),
        Ok(0)
    );
    assert_eq!(run_trim(&mut ring, 0, &[(0, 512)]), Ok(0));
    // Out of range is still an error on a null device.
    assert_eq!(
        run(&mut ring, &op(0, IoKind::Read, 64 * MIB, 512), Some((b, 0))),
        Err(libc::EINVAL)
    );
    // No system calls at all.
    assert_eq!(ring.stats().enters, enters_before);
    assert_eq!(ring.devices().get(0).unwrap().kind(), DeviceKind::Null);
}

#[test]
fn invalid_ops_complete_with_errors() {
    let dir = Scratch::new("invalid");
    let path = dir.path("disk.img");
    let size = MIB;
    let ro = dir.path("ro.img");
    std::fs::write(&ro, vec![1u8; 65536]).unwrap();
    let specs = [
        file_spec(&path, size, false),
        DeviceSpec::File(FileSpec {
            read_only: true,
            ..FileSpec::new(&ro, None)
        }),
    ];
    let mut ring = ring_for(&specs, 2, 8192, 4);
    let b = ring.pool_mut().alloc().unwrap();
    type Case = (IoOp, Option<(BufId, u32)>, i32);
    let cases: Vec<Case> = vec![
        // Past the end, straddling the end, offset overflow.
        (op(0, IoKind::Read, size, 4096), Some((b, 0)), libc::EINVAL),
        (
            op(0, IoKind::Write, size - 4096, 8192),
            Some((b, 0)),
            libc::EINVAL,
        ),
        (
            op(0, IoKind::Read, u64::MAX - 4095, 4096),
            Some((b, 0)),
            libc::EINVAL,
        ),
        // Misaligned offset and length.
        (op(0, IoKind::Read, 512, 4096), Some((b, 0)), libc::EINVAL),
        (op(0, IoKind::Read, 0, 100), Some((b, 0)), libc::EINVAL),
        // Beyond the buffer, missing buffer, buffer not allocated.
        (op(0, IoKind::Read, 0, 8192), Some((b, 4096)), libc::EINVAL),
        (op(0, IoKind::Read, 0, 4096), None, libc::EINVAL),
        (
            op(0, IoKind::Read, 0, 4096),
            Some((BufId(1), 0)),
            libc::EINVAL,
        ),
        (
            op(0, IoKind::Read, 0, 4096),
            Some((BufId(77), 0)),
            libc::EINVAL,
        ),
        // Zeroes / trim out of range.
        (op(0, IoKind::WriteZeroes, size, 4096), None, libc::EINVAL),
        // Unknown device, read-only device.
        (op(9, IoKind::Read, 0, 4096), Some((b, 0)), libc::ENODEV),
        (op(1, IoKind::Write, 0, 4096), Some((b, 0)), libc::EROFS),
        (op(1, IoKind::WriteZeroes, 0, 4096), None, libc::EROFS),
    ];
    for (o, buf, errno) in &cases {
        assert_eq!(run(&mut ring, o, *buf), Err(*errno), "{o:?}");
        assert!(!ring.pool().is_in_flight(b));
    }
    // A Trim with a range out of range; one without its range list.
    assert_eq!(
        run_trim(&mut ring, 0, &[(0, 4096), (size, 4096)]),
        Err(libc::EINVAL)
    );
    let trim = IoKind::Trim { ranges: 1 };
    assert_eq!(run(&mut ring, &op(0, trim, 0, 0), None), Err(libc::EINVAL));
    // The read-only device still reads and flushes.
    let got = read_back(&mut ring, 1, 0, 4096);
    assert!(got.iter().all(|&x| x == 1));
    assert_eq!(run(&mut ring, &op(1, IoKind::Flush, 0, 0), None), Ok(0));
    assert_eq!(ring.stats().errors, cases.len() as u64 + 2);
    // The device was never written past its end.
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
}

#[test]
fn busy_buffer_is_refused_and_buffer_access_is_guarded() {
    let dir = Scratch::new("busy");
    let path = dir.path("disk.img");
    let mut ring = ring_for(&[file_spec(&path, MIB, false)], 2, 65536, 4);
    let b = ring.pool_mut().alloc().unwrap();
    ring.submit_op(&op(0, IoKind::Read, 0, 65536), Some((b, 0)), 1)
        .unwrap();
    // While the read is in flight, the buffer cannot be borrowed, freed, or reused.
    assert_eq!(ring.pool().buf(b).unwrap_err(), PoolError::InFlight(b.0));
    assert_eq!(
        ring.pool_mut().free(b).unwrap_err(),
        PoolError::InFlight(b.0)
    );
    ring.submit_op(&op(0, IoKind::Read, 0, 4096), Some((b, 0)), 2)
        .unwrap();
    ring.submit().unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        ring.wait(Some(Duration::from_secs(5))).unwrap();
        ring.reap_with_pool(|ud, r, pool| {
            got.push((ud, r));
            if ud == 1 {
                assert!(pool.buf(b).is_ok());
            }
        });
    }
    got.sort();
    assert_eq!(got, vec![(1, Ok(65536)), (2, Err(libc::EBUSY))]);
    ring.pool_mut().free(b).unwrap();
}

#[test]
fn batch_of_64_in_flight() {
    let dir = Scratch::new("batch");
    let path = dir.path("disk.img");
    // SQ of 32 entries and 64 ops: submit_op must flush the SQ when it fills, not drop.
    let mut ring = ring_for(&[file_spec(&path, 8 * MIB, false)], 64, 8192, 64);
    let mut bufs = Vec::new();
    for i in 0..64u64 {
        let b = ring.pool_mut().alloc().unwrap();
        let v = ring.pool_mut().buf_mut(b).unwrap();
        for (j, x) in v.iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(31).wrapping_add(j as u8);
        }
        bufs.push(b);
        ring.submit_op(&op(0, IoKind::Write, i * 8192, 8192), Some((b, 0)), i)
            .unwrap();
    }
    assert_eq!(ring.free_slots(), 0);
    assert_eq!(
        ring.submit_op(&op(0, IoKind::Flush, 0, 0), None, 99),
        Err(SubmitError::Busy(64))
    );
    ring.submit().unwrap();
    let mut done = [false; 64];
    let mut n = 0;
    while n < 64 {
        ring.wait(Some(Duration::from_secs(5))).unwrap();
        n += ring.reap(|ud, r| {
            assert_eq!(r, Ok(8192));
            assert!(!std::mem::replace(&mut done[ud as usize], true));
        });
    }
    assert_eq!(ring.in_flight(), 0);
    // Read everything back in one batch too.
    for (i, &b) in bufs.iter().enumerate() {
        ring.pool_mut().buf_mut(b).unwrap().fill(0);
        ring.submit_op(
            &op(0, IoKind::Read, i as u64 * 8192, 8192),
            Some((b, 0)),
            i as u64,
        )
        .unwrap();
    }
    let mut n = 0;
    while n < 64 {
        ring.wait(Some(Duration::from_secs(5))).unwrap();
        n += ring.reap(|_, r| assert_eq!(r, Ok(8192)));
    }
    for (i, &b) in bufs.iter().enumerate() {
        let v = ring.pool().buf(b).unwrap();
        assert!(v
            .iter()
            .enumerate()
            .all(|(j, &x)| x == (i as u8).wrapping_mul(31).wrapping_add(j as u8)));
    }
    let st = ring.stats();
    assert_eq!((st.submitted, st.completed, st.errors), (128, 128, 0));
    // Batching: far fewer enters than ops.
    assert!(st.enters < 64, "{} enters for 128 ops", st.enters);
}

#[test]
fn short_read_at_eof_zero_fills() {
    let dir = Scratch::new("eof");
    let path = dir.path("disk.img");
    let mut ring = ring_for(&[file_spec(&path, MIB, false)], 1, 65536, 2);
    let b = ring.pool_mut().alloc().unwrap();
    ring.pool_mut().buf_mut(b).unwrap().fill(0x77);
    assert_eq!(
        run(
            &mut ring,
            &op(0, IoKind::Write, MIB - 65536, 65536),
            Some((b, 0))
        ),
        Ok(65536)
    );
    // Something shrinks the file under the namespace: the last 32 KiB now read as zeroes.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(MIB - 32768)
        .unwrap();
    ring.pool_mut().buf_mut(b).unwrap().fill(0x11);
    assert_eq!(
        run(
            &mut ring,
            &op(0, IoKind::Read, MIB - 65536, 65536),
            Some((b, 0))
        ),
        Ok(65536)
    );
    let v = ring.pool().buf(b).unwrap();
    assert!(v[..32768].iter().all(|&x| x == 0x77));
    assert!(v[32768..].iter().all(|&x| x == 0));
}

#[test]
fn eventfd_signals_completions() {
    use std::os::fd::AsRawFd;
    let dir = Scratch::new("evfd");
    let path = dir.path("disk.img");
    let mut ring = ring_for(&[file_spec(&path, MIB, false)], 1, 4096, 2);
    let efd = ring.register_eventfd().unwrap().as_raw_fd();
    let b = ring.pool_mut().alloc().unwrap();
    ring.submit_op(&op(0, IoKind::Read, 0, 4096), Some((b, 0)), 5)
        .unwrap();
    ring.submit().unwrap();
    let mut pfd = libc::pollfd {
        fd: efd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
    assert_eq!(n, 1, "eventfd never became readable");
    ring.drain_eventfd();
    let mut got = None;
    for _ in 0..100 {
        ring.reap(|ud, r| got = Some((ud, r)));
        if got.is_some() {
            break;
        }
        ring.wait(Some(Duration::from_millis(50))).unwrap();
    }
    assert_eq!(got, Some((5, Ok(4096))));
    // A wait with nothing in flight returns at once.
    assert!(!ring.wait(None).unwrap());
}

#[test]
fn ring_moves_to_its_poller_thread_before_first_use() {
    let dir = Scratch::new("thread");
    let path = dir.path("disk.img");
    let ring = ring_for(&[file_spec(&path, MIB, false)], 1, 4096, 2);
    // Built here, used (and thereby enabled as single issuer) on another thread.
    let (mode, res) = std::thread::spawn(move || {
        let mut ring = ring;
        let b = ring.pool_mut().alloc().unwrap();
        (
            ring.mode(),
            run(&mut ring, &op(0, IoKind::Read, 0, 4096), Some((b, 0))),
        )
    })
    .join()
    .unwrap();
    assert_eq!(res, Ok(4096));
    // The host kernel (6.18) and the VM kernel (6.1) both accept DEFER_TASKRUN.
    assert_eq!(mode, RingMode::DeferTaskrun);
}

#[test]
fn device_open_rules() {
    let dir = Scratch::new("open");
    // Missing file without size.
    let e = Device::open(&DeviceSpec::File(FileSpec::new(dir.path("nope"), None))).unwrap_err();
    assert!(matches!(e, DeviceError::MissingNoSize { .. }));
    assert!(e.to_string().contains("nope"), "{e}");
    // Created sparse at size, default block size from the filesystem (<= 4096).
    let p = dir.path("new.img");
    let d = Device::open(&DeviceSpec::File(FileSpec::new(&p, Some(8 * MIB)))).unwrap();
    assert_eq!(d.size_bytes(), 8 * MIB);
    assert!(d.block_size() >= 512 && d.block_size() <= 4096);
    assert_eq!(d.kind(), DeviceKind::File);
    use std::os::unix::fs::MetadataExt;
    assert!(
        std::fs::metadata(&p).unwrap().blocks() * 512 < 8 * MIB,
        "not sparse"
    );
    drop(d);
    // An existing file is used at its length (the configured size only creates).
    let d = Device::open(&DeviceSpec::File(FileSpec::new(&p, Some(MIB)))).unwrap();
    assert_eq!(d.size_bytes(), 8 * MIB);
    // Length not a multiple of the block size.
    let odd = dir.path("odd.img");
    std::fs::write(&odd, vec![0u8; 5000]).unwrap();
    let e = Device::open(&DeviceSpec::File(FileSpec {
        block_size: Some(4096),
        ..FileSpec::new(&odd, None)
    }))
    .unwrap_err();
    assert!(matches!(e, DeviceError::BadSize { size: 5000, .. }), "{e}");
    // Bad block sizes.
    for bs in [0, 100, 768, 1 << 17] {
        let e = Device::open(&DeviceSpec::Null {
            size: MIB,
            block_size: bs,
        })
        .unwrap_err();
        assert!(matches!(e, DeviceError::BadBlockSize { .. }), "{e}");
    }
    let e = Device::open(&DeviceSpec::Null {
        size: 1000,
        block_size: 512,
    })
    .unwrap_err();
    assert!(matches!(e, DeviceError::BadSize { .. }));
    // A directory is neither a file nor a block device.
    std::fs::create_dir(dir.path("d")).unwrap();
    let e = Device::open(&DeviceSpec::File(FileSpec::new(dir.path("d"), None))).unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::Open { .. } | DeviceError::NotFileOrBlockDevice { .. }
        ),
        "{e}"
    );
    // Devices keeps spec order.
    let devs = Devices::open(&[
        DeviceSpec::Null {
            size: MIB,
            block_size: 4096,
        },
        DeviceSpec::File(FileSpec::new(&p, None)),
    ])
    .unwrap();
    assert_eq!(devs.len(), 2);
    assert_eq!(devs.get(0).unwrap().kind(), DeviceKind::Null);
    assert_eq!(devs.get(1).unwrap().path(), Some(p.as_path()));
    assert!(devs.get(2).is_none());
}

#[test]
fn tmpfs_falls_back_to_buffered_when_direct_is_refused() {
    // /dev/shm is tmpfs: O_DIRECT works there only from Linux 6.6 on.
    let dir = Path::new("/dev/shm");
    if !dir.is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let p = dir.join(format!("nvmf-backend-test-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    let d = Device::open(&file_spec(&p, MIB, false));
    let _ = std::fs::remove_file(&p);
    let d = d.unwrap();
    // Either way the device works; on kernels without tmpfs O_DIRECT it is buffered.
    let mut ring = Ring::new(
        RingConfig::default(),
        Arc::new(Devices::from_devices(vec![d])),
        BufPool::new(1, 4096).unwrap(),
    )
    .unwrap();
    let b = ring.pool_mut().alloc().unwrap();
    ring.pool_mut().buf_mut(b).unwrap().fill(3);
    assert_eq!(
        run(&mut ring, &op(0, IoKind::Write, 4096, 4096), Some((b, 0))),
        Ok(4096)
    );
    assert_eq!(run(&mut ring, &op(0, IoKind::Flush, 0, 0), None), Ok(0));
    // tmpfs has no ZERO_RANGE: Write Zeroes falls back to PUNCH_HOLE.
    assert_eq!(
        run(&mut ring, &op(0, IoKind::WriteZeroes, 4096, 4096), None),
        Ok(0)
    );
    ring.pool_mut().free(b).unwrap();
    assert!(read_back(&mut ring, 0, 4096, 4096).iter().all(|&x| x == 0));
}

#[test]
fn write_zeroes_by_writing_zero_chunks() {
    let dir = Scratch::new("zero-writes");
    let path = dir.path("disk.img");
    let size = 4 * MIB;
    let mut ring = ring_for(&[file_spec(&path, size, false)], 2, 1 << 20, 4);
    let b = ring.pool_mut().alloc().unwrap();
    ring.pool_mut().buf_mut(b).unwrap().fill(0xee);
    assert_eq!(
        run(&mut ring, &op(0, IoKind::Write, 0, 1 << 20), Some((b, 0))),
        Ok(1 << 20)
    );
    ring.pool_mut().free(b).unwrap();
    ring.force_zero_writes(0);
    let sqes = ring.stats().sqes;
    // 600 KiB: three chunks of the 256 KiB zero buffer, the last one partial.
    assert_eq!(
        run(
            &mut ring,
            &op(0, IoKind::WriteZeroes, 4096, 600 * 1024),
            None
        ),
        Ok(0)
    );
    assert_eq!(ring.stats().sqes - sqes, 3);
    let got = read_back(&mut ring, 0, 0, 1 << 20);
    assert!(got[..4096].iter().all(|&x| x == 0xee));
    assert!(got[4096..4096 + 600 * 1024].iter().all(|&x| x == 0));
    assert!(got[4096 + 600 * 1024..].iter().all(|&x| x == 0xee));
}

/// A loop device over a sparse file, detached on drop.
struct Loop {
    dev: PathBuf,
}

impl Loop {
    fn new(backing: &Path, size: u64) -> Result<Loop, String> {
        std::fs::File::create(backing)
            .and_then(|f| f.set_len(size))
            .map_err(|e| e.to_string())?;
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(Loop { dev })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.dev)
            .status();
    }
}

#[test]
fn block_device_via_loop() {
    let dir = Scratch::new("loop");
    let size = 16 * MIB;
    let lo = match Loop::new(&dir.path("backing.img"), size) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skipped: cannot create a loop device ({e})");
            return;
        }
    };
    let spec = DeviceSpec::File(FileSpec::new(&lo.dev, None));
    let d = Device::open(&spec).unwrap();
    assert_eq!(d.kind(), DeviceKind::BlockDevice);
    assert_eq!(d.size_bytes(), size);
    assert_eq!(
        d.block_size(),
        512,
        "loop devices default to 512-byte sectors"
    );
    assert!(d.is_direct());
    let dealloc = d.deallocate();
    // Writable block devices are opened exclusively: a second opener is refused.
    let e = Device::open(&spec).unwrap_err();
    assert!(
        matches!(&e, DeviceError::Open { source, .. } if source.raw_os_error() == Some(libc::EBUSY)),
        "{e}"
    );
    // Read-only opens are not exclusive. A size larger than the device is refused; a
    // smaller one exports a prefix.
    let ro = |size| {
        Device::open(&DeviceSpec::File(FileSpec {
            read_only: true,
            ..FileSpec::new(&lo.dev, size)
        }))
    };
    let e = ro(Some(size * 2)).unwrap_err();
    assert!(matches!(e, DeviceError::TooLarge { .. }), "{e}");
    assert_eq!(ro(Some(MIB)).unwrap().size_bytes(), MIB);

    let mut ring = Ring::new(
        RingConfig::default(),
        Arc::new(Devices::from_devices(vec![d])),
        BufPool::new(2, 65536).unwrap(),
    )
    .unwrap();
    let b = ring.pool_mut().alloc().unwrap();
    let mut rng = Rng(99);
    rng.fill(ring.pool_mut().buf_mut(b).unwrap());
    let pattern = ring.pool().buf(b).unwrap().to_vec();
    // 512-byte granularity works on a 512-byte device.
    assert_eq!(
        run(
            &mut ring,
            &op(0, IoKind::Write, 512 * 3, 65536),
            Some((b, 0))
        ),
        Ok(65536)
    );
    assert_eq!(run(&mut ring, &op(0, IoKind::Flush, 0, 0), None), Ok(0));
    ring.pool_mut().free(b).unwrap();
    assert!(read_back(&mut ring, 0, 512 * 3, 65536) == pattern);
    // Write Zeroes in the middle.
    assert_eq!(
        run(&mut ring, &op(0, IoKind::WriteZeroes, 512 * 5, 1024), None),
        Ok(0)
    );
    let got = read_back(&mut ring, 0, 512 * 3, 65536);
    assert!(got[..1024] == pattern[..1024]);
    assert!(got[1024..2048].iter().all(|&x| x == 0));
    assert!(got[2048..] == pattern[2048..]);
    // Deallocate is a discard on a block device that takes them (a loop device does when its
    // backing file's file system punches holes, and then reads the range back as zeroes), not
    // a hole punch that the kernel turns into Write Zeroes: the device counts a discard and no
    // write. On a device without discard the (advisory) request leaves the data as it was.
    let stat = LoopStat::new(&lo.dev);
    let before = stat.read();
    assert_eq!(
        run_trim(
            &mut ring,
            0,
            &[(512 * 64, 4096), (512 * 200, 0), (512 * 256, 8192)]
        ),
        Ok(0)
    );
    let after = stat.read();
    let got = read_back(&mut ring, 0, 512 * 64, 4096);
    let old = &pattern[(512 * 61)..(512 * 61 + 4096)];
    if dealloc == Deallocate::Discard {
        assert_eq!(
            after.discards - before.discards,
            2,
            "{before:?} -> {after:?}"
        );
        assert_eq!(after.discard_sectors - before.discard_sectors, 24);
        assert_eq!(after.writes, before.writes, "a discard must not write");
        assert!(got.iter().all(|&x| x == 0));
        // Eight at once (the helper takes them in turn; the ring keeps polling it until the
        // last one has reported), next to a write.
        let before = stat.read();
        let b = ring.pool_mut().alloc().unwrap();
        let buf = ring.pool_mut().buf_mut(b).unwrap();
        for k in 0..8u64 {
            put_trim_range(buf, k as usize, MIB + k * 8192, 4096);
        }
        for k in 0..8u32 {
            let trim = op(0, IoKind::Trim { ranges: 1 }, 0, 0);
            ring.submit_op(&trim, Some((b, k * 16)), u64::from(k))
                .unwrap();
        }
        let w = ring.pool_mut().alloc().unwrap();
        ring.submit_op(&op(0, IoKind::Write, 0, 4096), Some((w, 0)), 100)
            .unwrap();
        ring.submit().unwrap();
        let mut seen = Vec::new();
        for _ in 0..1000 {
            ring.reap(|ud, r| {
                assert_eq!(r, if ud == 100 { Ok(4096) } else { Ok(0) }, "op {ud}");
                seen.push(ud);
            });
            if seen.len() == 9 {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3, 4, 5, 6, 7, 100]);
        assert_eq!(ring.in_flight(), 0);
        assert_eq!(stat.read().discards - before.discards, 8);
        ring.pool_mut().free(b).unwrap();
        ring.pool_mut().free(w).unwrap();
    } else {
        eprintln!("loop device without discard: {dealloc:?}");
        assert_eq!(after, before);
        assert!(got == old);
    }
    assert_eq!(ring.stats().errors, 0);
}

/// Counters from a block device's sysfs `stat` file (Documentation/block/stat.rst).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BlockCounts {
    writes: u64,
    discards: u64,
    discard_sectors: u64,
}

struct LoopStat(PathBuf);

impl LoopStat {
    fn new(dev: &Path) -> LoopStat {
        let name = dev.file_name().expect("a device name");
        LoopStat(Path::new("/sys/block").join(name).join("stat"))
    }

    fn read(&self) -> BlockCounts {
        let text = std::fs::read_to_string(&self.0).unwrap();
        let f: Vec<u64> = text
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        // Field 5: write I/Os; 12: discard I/Os; 14: discard sectors.
        BlockCounts {
            writes: f[4],
            discards: f[11],
            discard_sectors: f[13],
        }
    }
}

/// SQPOLL: a kernel thread consumes the submission queue, so a QD1 loop that spins on `reap`
/// submits and completes without io_uring_enter calls (the first one wakes the thread); a batch
/// larger than the SQ waits for SQ space instead of dropping; data round-trips.
#[test]
fn sqpoll_submits_without_system_calls() {
    let dir = Scratch::new("sqpoll");
    let path = dir.path("disk.img");
    let devices = Arc::new(Devices::open(&[file_spec(&path, 8 * MIB, false)]).unwrap());
    let pool = BufPool::new(64, 8192).unwrap();
    let cfg = RingConfig {
        sq_entries: 32,
        max_inflight: 64,
        sqpoll: Some(Duration::from_secs(2)),
        iopoll: false,
    };
    let mut ring = match Ring::new(cfg, devices, pool) {
        Ok(r) => r,
        // Unprivileged SQPOLL needs Linux 5.11; a sandbox may forbid it outright.
        Err(RingError::Setup(e)) if e.raw_os_error() == Some(libc::EPERM) => {
            eprintln!("SKIP: SQPOLL not permitted here: {e}");
            return;
        }
        Err(e) => panic!("SQPOLL ring: {e}"),
    };
    assert_eq!(ring.mode(), RingMode::SqPoll);
    // A batch of 64 writes through an SQ of 32: the second half waits for SQ space.
    let mut bufs = Vec::new();
    for i in 0..64u64 {
        let b = ring.pool_mut().alloc().unwrap();
        ring.pool_mut().buf_mut(b).unwrap().fill(i as u8 ^ 0xa5);
        bufs.push(b);
        ring.submit_op(&op(0, IoKind::Write, i * 8192, 8192), Some((b, 0)), i)
            .unwrap();
    }
    ring.submit().unwrap();
    let mut n = 0;
    while n < 64 {
        ring.wait(Some(Duration::from_secs(5))).unwrap();
        n += ring.reap(|_, r| assert_eq!(r, Ok(8192)));
    }
    // QD1 reads, reaped by spinning: the awake SQ thread submits them.
    let before = ring.stats().enters;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for (i, &b) in bufs.iter().enumerate() {
        ring.pool_mut().buf_mut(b).unwrap().fill(0);
        ring.submit_op(
            &op(0, IoKind::Read, i as u64 * 8192, 8192),
            Some((b, 0)),
            i as u64,
        )
        .unwrap();
        ring.submit().unwrap();
        let mut done = false;
        while !done {
            assert!(
                std::time::Instant::now() < deadline,
                "read {i} never completed"
            );
            ring.reap(|ud, r| {
                assert_eq!((ud, r), (i as u64, Ok(8192)));
                done = true;
            });
        }
        let v = ring.pool().buf(b).unwrap();
        assert!(v.iter().all(|&x| x == i as u8 ^ 0xa5), "read {i} differs");
    }
    let enters = ring.stats().enters - before;
    println!("SQPOLL: {enters} io_uring_enter calls for 64 QD1 reads");
    // Only wake-ups of a sleeping SQ thread enter the kernel (the 2 s idle keeps it awake,
    // but a loaded machine may deschedule it); without SQPOLL this would be 64.
    assert!(
        enters < 16,
        "{enters} enters for 64 reads: the SQ thread did not submit"
    );
    let st = ring.stats();
    assert_eq!((st.submitted, st.completed, st.errors), (128, 128, 0));
}

/// `iopoll: true` with a device that cannot be polled (a file): the polled ring exists, the
/// device is not routed to it, and I/O completes through the interrupt ring. (The polled path
/// itself needs a block device with poll queues: the VM scenario `iopoll-null-blk`.)
#[test]
fn iopoll_ring_leaves_unpollable_devices_on_the_interrupt_ring() {
    let dir = Scratch::new("iopoll-file");
    let path = dir.path("disk.img");
    let devices = Arc::new(Devices::open(&[file_spec(&path, 8 * MIB, false)]).unwrap());
    assert!(!devices.get(0).unwrap().is_pollable());
    let cfg = RingConfig {
        sq_entries: 32,
        max_inflight: 64,
        sqpoll: None,
        iopoll: true,
    };
    let mut ring = Ring::new(cfg, devices, BufPool::new(8, 8192).unwrap()).unwrap();
    assert_eq!(ring.polled_devices(), 0);
    let b = ring.pool_mut().alloc().unwrap();
    ring.pool_mut().buf_mut(b).unwrap().fill(0x3c);
    assert_eq!(
        run(&mut ring, &op(0, IoKind::Write, 8192, 8192), Some((b, 0))),
        Ok(8192)
    );
    ring.pool_mut().free(b).unwrap();
    assert!(read_back(&mut ring, 0, 8192, 8192)
        .iter()
        .all(|&x| x == 0x3c));
    assert_eq!(run(&mut ring, &op(0, IoKind::Flush, 0, 0), None), Ok(0));
    assert_eq!(ring.stats().polled_sqes, 0);
}

/// What Deallocate does is decided per backing store when it is opened: the null device and a
/// file whose file system punches holes free blocks to zeroes; a read-only store ignores it.
#[test]
fn deallocate_per_backend() {
    let dir = Scratch::new("dealloc");
    let path = dir.path("disk.img");
    let d = Device::open(&file_spec(&path, MIB, false)).unwrap();
    assert_eq!(d.kind(), DeviceKind::File);
    assert_eq!(
        d.deallocate(),
        Deallocate::Zeroes,
        "the build file system punches holes"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        MIB,
        "the probe keeps the size"
    );
    drop(d);
    let ro = Device::open(&DeviceSpec::File(FileSpec {
        read_only: true,
        ..FileSpec::new(&path, None)
    }))
    .unwrap();
    assert_eq!(ro.deallocate(), Deallocate::Ignored);
    let null = Device::open(&DeviceSpec::Null {
        size: MIB,
        block_size: 4096,
    })
    .unwrap();
    assert_eq!(null.deallocate(), Deallocate::Zeroes);
}

/// Compare reads the range into a pool buffer of its own and checks it against the host's
/// data: equal completes with the length, a difference fails with EILSEQ (Compare Failure);
/// the read buffer goes back to the pool either way. A null device compares with zeroes.
#[test]
fn compare_equal_and_different() {
    let dir = Scratch::new("compare");
    let path = dir.path("disk.img");
    let mut ring = ring_for(
        &[
            file_spec(&path, MIB, false),
            DeviceSpec::Null {
                size: MIB,
                block_size: 4096,
            },
        ],
        4,
        65536,
        8,
    );
    let b = ring.pool_mut().alloc().unwrap();
    let mut rng = Rng(7);
    rng.fill(ring.pool_mut().buf_mut(b).unwrap());
    assert_eq!(
        run(&mut ring, &op(0, IoKind::Write, 8192, 16384), Some((b, 0))),
        Ok(16384)
    );
    let free = ring.pool().free_count();
    // The same bytes at another offset of the buffer.
    let data = ring.pool().buf(b).unwrap()[..16384].to_vec();
    ring.pool_mut().buf_mut(b).unwrap()[4096..4096 + 16384].copy_from_slice(&data);
    assert_eq!(
        run(
            &mut ring,
            &op(0, IoKind::Compare, 8192, 16384),
            Some((b, 4096))
        ),
        Ok(16384)
    );
    ring.pool_mut().buf_mut(b).unwrap()[4096 + 9999] ^= 1;
    assert_eq!(
        run(
            &mut ring,
            &op(0, IoKind::Compare, 8192, 16384),
            Some((b, 4096))
        ),
        Err(libc::EILSEQ)
    );
    assert_eq!(
        ring.pool().free_count(),
        free,
        "the read buffer is returned"
    );
    // Null: zeroes.
    ring.pool_mut().buf_mut(b).unwrap()[..4096].fill(0);
    assert_eq!(
        run(&mut ring, &op(1, IoKind::Compare, 0, 4096), Some((b, 0))),
        Ok(4096)
    );
    ring.pool_mut().buf_mut(b).unwrap()[100] = 1;
    assert_eq!(
        run(&mut ring, &op(1, IoKind::Compare, 0, 4096), Some((b, 0))),
        Err(libc::EILSEQ)
    );
    // Outside the device: refused before any buffer is taken.
    assert_eq!(
        run(&mut ring, &op(0, IoKind::Compare, MIB, 4096), Some((b, 0))),
        Err(libc::EINVAL)
    );
    assert_eq!(ring.pool().free_count(), free);
}

/// What each backend says about its cache, Compare and Write and deallocation: the inputs of
/// Identify's VWC (`Device::volatile_cache`), of the fused pair's form (`native_caw`) and of
/// DLFEAT. Block devices and RBD are covered where they exist: the VM's brd (write through)
/// and dm-log-writes (write back) disks, and the Ceph tests.
#[test]
fn each_backend_reports_its_cache_and_compare_and_write() {
    let dir = Scratch::new("cache");
    let mut table = vec![
        (
            "null",
            DeviceSpec::Null {
                size: MIB,
                block_size: 4096,
            },
            (false, 0, Deallocate::Zeroes),
        ),
        (
            "file, O_DIRECT",
            file_spec(&dir.0.join("direct.img"), MIB, false),
            (true, 0, Deallocate::Zeroes),
        ),
        (
            "file, buffered",
            file_spec(&dir.0.join("buffered.img"), MIB, true),
            (true, 0, Deallocate::Zeroes),
        ),
    ];
    if Path::new("/dev/shm").is_dir() {
        let p = Path::new("/dev/shm").join(format!("nvmf-backend-cache-{}", std::process::id()));
        table.push((
            "file on tmpfs",
            file_spec(&p, MIB, false),
            (true, 0, Deallocate::Zeroes),
        ));
    }
    for (what, spec, want) in table {
        let d = Device::open(&spec).unwrap();
        assert_eq!(
            (d.volatile_cache(), d.native_caw(), d.deallocate()),
            want,
            "{what}"
        );
        if let DeviceSpec::File(f) = &spec {
            if f.path.starts_with("/dev/shm") {
                let _ = std::fs::remove_file(&f.path);
            }
        }
    }
}
