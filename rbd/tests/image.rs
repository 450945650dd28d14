//! Against the test cluster (`scripts/ceph-cluster.sh start`; `NVMF_CEPH_CONF` names its
//! ceph.conf, as `scripts/test.sh` sets it). Without it these tests say so and pass nothing.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_rbd::{Cluster, Completions, Image, IoCtx};

fn conf() -> Option<PathBuf> {
    match std::env::var_os("NVMF_CEPH_CONF") {
        Some(c) => Some(PathBuf::from(c)),
        None => {
            eprintln!("NVMF_CEPH_CONF is not set: no test cluster, test not run");
            None
        }
    }
}

fn rbd(conf: &PathBuf, args: &[&str]) {
    let st = Command::new("rbd")
        .arg("-c")
        .arg(conf)
        .args(args)
        .status()
        .expect("rbd CLI");
    assert!(st.success(), "rbd {args:?} failed");
}

fn image(conf: &PathBuf, name: &str, mib: u32) -> Image {
    let _ = Command::new("rbd")
        .arg("-c")
        .arg(conf)
        .args(["rm", &format!("rbd/{name}")])
        .output();
    rbd(
        conf,
        &["create", "--size", &mib.to_string(), &format!("rbd/{name}")],
    );
    let c = Cluster::connect(
        conf,
        "admin",
        &[
            ("rbd_cache", "false"),
            ("rbd_disable_zero_copy_writes", "false"),
            ("rbd_skip_partial_discard", "false"),
        ],
    )
    .unwrap();
    let io = IoCtx::open(&c, "rbd", "").unwrap();
    Image::open(&io, name).unwrap()
}

/// Waits for `n` results.
fn wait(done: &Completions, n: usize) -> Vec<(u32, i64)> {
    let mut all = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while all.len() < n {
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&done.eventfd()),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut pfd, 1, 1000) };
        let mut got = Vec::new();
        done.take(&mut got);
        all.extend(got);
        assert!(Instant::now() < deadline, "results: {all:?}");
    }
    all
}

#[test]
fn write_read_discard_zeroes_and_watch() {
    let Some(conf) = conf() else { return };
    let img = image(&conf, "nvmf-rbd-test", 16);
    assert_eq!(img.size().unwrap(), 16 << 20);
    let done = Completions::new(8).unwrap();
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
    // SAFETY: `data` outlives the wait below and is not touched meanwhile.
    unsafe { img.aio_write(&done, 3, 8192, data.as_ptr(), data.len(), true) }.unwrap();
    img.aio_flush(&done, 4).unwrap();
    let r = wait(&done, 2);
    assert!(r.iter().all(|&(_, v)| v >= 0), "{r:?}");
    let mut back = vec![0u8; data.len()];
    // SAFETY: `back` outlives the wait and is only read after it.
    unsafe { img.aio_read(&done, 5, 8192, back.as_mut_ptr(), back.len()) }.unwrap();
    assert_eq!(wait(&done, 1), vec![(5, data.len() as i64)]);
    assert!(back == data);

    // A partial discard and a write zeroes both read back zeroes.
    img.aio_discard(&done, 0, 8192, 4096).unwrap();
    img.aio_write_zeroes(&done, 1, 8192 + 8192, 8192).unwrap();
    let r = wait(&done, 2);
    assert!(r.iter().all(|&(_, v)| v >= 0), "{r:?}");
    // SAFETY: as above.
    unsafe { img.aio_read(&done, 5, 8192, back.as_mut_ptr(), back.len()) }.unwrap();
    wait(&done, 1);
    assert!(back[..4096].iter().all(|&b| b == 0));
    assert_eq!(back[4096..8192], data[4096..8192]);
    assert!(back[8192..16384].iter().all(|&b| b == 0));
    assert_eq!(back[16384..], data[16384..]);

    // Out of range: an error result, not a crash.
    let mut one = vec![0u8; 4096];
    // SAFETY: as above.
    let r = unsafe { img.aio_read(&done, 2, 64 << 20, one.as_mut_ptr(), one.len()) };
    match r {
        Err(_) => {}
        Ok(()) => assert!(wait(&done, 1)[0].1 < 0),
    }
    // A token outside the table is refused before librbd sees it.
    assert_eq!(img.aio_flush(&done, 8), Err(libc::EINVAL));

    // A resize by another client is announced.
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = Arc::clone(&seen);
    img.watch(move || {
        s2.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    rbd(&conf, &["resize", "--size", "32", "rbd/nvmf-rbd-test"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "no update callback after a resize"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(img.size().unwrap(), 32 << 20);
}

/// librbd's compare-and-write (Ceph 16, Debian 12's): atomic, and it says where data differs;
/// but it takes one 512-byte sector only (anything longer or unaligned is EINVAL), so it cannot
/// carry a fused Compare and Write of a 4 KiB-block namespace.
#[test]
fn compare_and_write_takes_one_sector() {
    let Some(conf) = conf() else { return };
    let img = image(&conf, "nvmf-rbd-caw", 16);
    let done = Completions::new(4).unwrap();
    let caw = |off: u64, cmp: &[u8], data: &[u8]| -> (i64, u64) {
        let mut mismatch = 0u64;
        // SAFETY: the buffers and `mismatch` outlive the wait below.
        unsafe {
            img.aio_compare_and_write(
                &done,
                0,
                off,
                cmp.as_ptr(),
                data.as_ptr(),
                cmp.len(),
                &mut mismatch,
            )
        }
        .unwrap();
        (wait(&done, 1)[0].1, mismatch)
    };
    let (zero, five) = (vec![0u8; 512], vec![0x5au8; 512]);
    assert_eq!(
        caw(4096, &zero, &five).0,
        0,
        "zeroes compared equal: written"
    );
    let (r, at) = caw(4096, &zero, &five);
    assert_eq!(r, -i64::from(libc::EILSEQ), "now it differs");
    assert_eq!(
        at, 0,
        "the first differing byte, counted from the compared range's start"
    );
    let mut back = vec![0u8; 512];
    // SAFETY: `back` outlives the wait.
    unsafe { img.aio_read(&done, 1, 4096, back.as_mut_ptr(), 512) }.unwrap();
    wait(&done, 1);
    assert_eq!(back, five);
    for (off, len) in [(0u64, 4096usize), (8192, 1024), (100, 512)] {
        let (z, d) = (vec![0u8; len], vec![1u8; len]);
        assert_eq!(
            caw(off, &z, &d).0,
            -i64::from(libc::EINVAL),
            "off {off} len {len}"
        );
    }
}

#[test]
fn unreachable_names_what() {
    let Some(conf) = conf() else { return };
    let c = Cluster::connect(&conf, "admin", &[]).unwrap();
    let e = IoCtx::open(&c, "no-such-pool", "").unwrap_err();
    assert!(e.to_string().contains("no-such-pool"), "{e}");
    let io = IoCtx::open(&c, "rbd", "").unwrap();
    let e = Image::open(&io, "no-such-image").unwrap_err();
    assert!(e.to_string().contains("rbd/no-such-image"), "{e}");
    assert_eq!(e.errno, libc::ENOENT);
    let e =
        Cluster::connect(std::path::Path::new("/nonexistent/ceph.conf"), "admin", &[]).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/ceph.conf"), "{e}");
}

/// A lock holder is named by its address in the owner list: another client that knows the
/// holder's address (`Cluster::addrs`, what a gateway publishes in its group record) spares it
/// and breaks nothing, and the holder keeps writing (a live peer is not fenced).
#[test]
fn a_lock_holder_is_known_by_its_address_and_spared() {
    let Some(conf) = conf() else { return };
    let holder = image(&conf, "nvmf-rbd-lock-test", 16);
    let done = Completions::new(4).unwrap();
    let data = vec![0x5au8; 4096];
    // SAFETY: `data` outlives the wait below.
    unsafe { holder.aio_write(&done, 0, 0, data.as_ptr(), data.len(), false) }.unwrap();
    assert!(wait(&done, 1).iter().all(|&(_, v)| v >= 0));
    let addrs = holder.ioctx().cluster().addrs().unwrap();
    let name = holder.ioctx().cluster().client_name();
    // Another connection, as another gateway.
    let c = Cluster::connect(&conf, "admin", &[]).unwrap();
    let io = IoCtx::open(&c, "rbd", "").unwrap();
    let other = Image::open(&io, "nvmf-rbd-lock-test").unwrap();
    let owners = other.lock_owners().unwrap();
    println!("holder {name} at {addrs}; lock owners {owners:?}");
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert!(
        nvmf_rbd::is_client(&owners[0], &addrs),
        "{owners:?} vs {addrs}"
    );
    assert!(!nvmf_rbd::is_client(&owners[0], &c.addrs().unwrap()));
    assert_eq!(
        other.break_foreign_lock_except(&[name, addrs]).unwrap(),
        Vec::<String>::new()
    );
    // The holder was not fenced: it still writes.
    // SAFETY: as above.
    unsafe { holder.aio_write(&done, 1, 4096, data.as_ptr(), data.len(), false) }.unwrap();
    assert!(wait(&done, 1).iter().all(|&(_, v)| v >= 0));
}
