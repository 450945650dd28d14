//! RBD namespaces against the single-node test cluster (`scripts/ceph-cluster.sh`; see
//! `nvmf_tests::ceph`): verified writes read back through the target, Deallocate and Write
//! Zeroes read back zeroes, an `rbd resize` reaches a connected host, and a cluster problem
//! at start-up is an error that names the cluster, pool and image.

use std::time::Duration;

use initiator::{ConnectOptions, Controller};
use nvme::identify::ctrl::OAES_NS_ATTR;
use nvme::log::AsyncEvent;
use nvmf_tests::ceph::{self, TestImage};
use nvmf_tests::{target_bin, TargetProc, TempDir, TEST_NQN};

fn connect(t: &TargetProc) -> Controller {
    let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    o.queues = 1;
    Controller::connect(o).expect("connect")
}

#[test]
fn verified_writes_read_back_through_an_rbd_namespace() {
    let Some(conf) = ceph::conf() else { return };
    let img = TestImage::create(&conf, "verify", 64);
    let ns = img.namespace_yaml(1);
    let t = TargetProc::start_with(|port, _| ceph::target_yaml(port, &[ns]));
    // Random 4k writes at depth 16, then 128k sequential writes (pieces of a large command
    // through one buffer each), each followed by the job's own read-back pass; then separate
    // random reads (at each region's block size: a verify header starts every block written)
    // check every block they read.
    for args in [
        &["--rw=randwrite", "--bs=4k", "--iodepth=16", "--size=8m"][..],
        &[
            "--rw=write",
            "--bs=128k",
            "--iodepth=4",
            "--size=8m",
            "--offset=8m",
        ][..],
        &["--rw=randread", "--bs=4k", "--iodepth=8", "--size=8m"][..],
        &[
            "--rw=randread",
            "--bs=128k",
            "--iodepth=2",
            "--size=8m",
            "--offset=8m",
        ][..],
    ] {
        let (out, text) = t.run_bench(&[args, &["--verify=crc32c"]].concat());
        assert!(out.status.success(), "{text}");
        assert!(text.contains(" 0 mismatches"), "{text}");
    }
    // What the target wrote is in the image: read it with the rbd tool, not through us.
    let dump = t.dir.0.join("image.raw");
    ceph::rbd(
        &conf,
        &[
            "export",
            "--no-progress",
            &img.spec(),
            &dump.to_string_lossy(),
        ],
    );
    let raw = std::fs::read(&dump).unwrap();
    assert_eq!(raw.len(), 64 << 20);
    // librbd's cache is off and the OSDs journal a write before they answer: no volatile
    // write cache to report (Identify Controller VWC, byte 525 bit 0), so hosts send no Flush.
    let id = connect(&t).identify(nvme::identify::cns::CTRL, 0).unwrap();
    assert_eq!(id[525] & 1, 0, "VWC of a subsystem of RBD namespaces only");
    // A verify block starts with a header naming its own byte offset (little endian, at 16;
    // magic "NVBV" at 0: bench/src/bench/pattern.rs).
    let at = (8 << 20) + 128 * 1024;
    assert_eq!(&raw[at..at + 4], b"NVBV", "a verify block at {at}");
    assert_eq!(
        u64::from_le_bytes(raw[at + 16..at + 24].try_into().unwrap()),
        at as u64,
        "the block at {at} carries its offset"
    );
    let mut t = t;
    assert!(t.terminate(), "{}", t.log_text());
}

#[test]
fn deallocate_and_write_zeroes_read_back_zeroes() {
    let Some(conf) = ceph::conf() else { return };
    let img = TestImage::create(&conf, "zeroes", 32);
    let ns = img.namespace_yaml(1);
    let mut t = TargetProc::start_with(|port, _| ceph::target_yaml(port, &[ns]));
    let mut c = connect(&t);
    let info = c.namespaces()[0];
    assert_eq!(info.size(), 32 << 20);
    assert_eq!(info.block_size, 4096);
    let mut n = c.open_namespace(1).unwrap();
    // 8 MiB of data across two 4 MiB objects, so ranges below cover whole and partial objects.
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8 | 1).collect();
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        n.write_at(chunk, (i as u64) << 20).unwrap();
    }
    n.flush().unwrap();
    // Partial object, a whole object, and a range spanning both objects' edges.
    n.trim(&[(64 << 10, 64 << 10), (4 << 20, 4 << 20)]).unwrap();
    n.write_zeroes(1 << 20, 12 << 10).unwrap();
    n.write_zeroes((3 << 20) + (1 << 19), 1 << 20).unwrap();
    let mut back = vec![0u8; data.len()];
    for (i, chunk) in back.chunks_mut(1 << 20).enumerate() {
        n.read_at(chunk, (i as u64) << 20).unwrap();
    }
    let zeroed = |off: usize| {
        (64 << 10..128 << 10).contains(&off)
            || (4 << 20..8 << 20).contains(&off)
            || (1 << 20..(1 << 20) + (12 << 10)).contains(&off)
            || ((3 << 20) + (1 << 19)..(4 << 20) + (1 << 19)).contains(&off)
    };
    for off in (0..data.len()).step_by(4096) {
        let want: &[u8] = if zeroed(off) {
            &[0; 4096]
        } else {
            &data[off..off + 4096]
        };
        assert!(
            back[off..off + 4096] == *want,
            "block at {off} (zeroed: {})",
            zeroed(off)
        );
    }
    drop(n);
    c.shutdown().unwrap();
    assert!(t.terminate(), "{}", t.log_text());
}

#[test]
fn a_resize_reaches_the_connected_host() {
    let Some(conf) = ceph::conf() else { return };
    let img = TestImage::create(&conf, "resize", 32);
    let ns = img.namespace_yaml(1);
    let mut t = TargetProc::start_with(|port, _| ceph::target_yaml(port, &[ns]));
    let mut c = connect(&t);
    assert_eq!(c.namespaces()[0].size(), 32 << 20);
    c.enable_async_events(OAES_NS_ATTR).unwrap();
    c.submit_async_event_request().unwrap();
    img.resize(48);
    let ev = c
        .wait_async_event(Duration::from_secs(10))
        .unwrap()
        .unwrap_or_else(|| panic!("no AEN within 10 s of the resize:\n{}", t.log_text()));
    assert_eq!(AsyncEvent::decode(ev), AsyncEvent::NS_CHANGED);
    assert_eq!(c.changed_namespaces().unwrap(), vec![1]);
    let ns = c.rescan_namespaces().unwrap();
    assert_eq!(ns[0].size(), 48 << 20);
    let mut n = c.open_namespace(1).unwrap();
    let data = vec![0xa5u8; 8192];
    n.write_at(&data, (48 << 20) - 8192).unwrap();
    let mut back = vec![0u8; 8192];
    n.read_at(&mut back, (48 << 20) - 8192).unwrap();
    assert!(back == data, "the new end of the namespace is usable");
    drop(n);
    c.shutdown().unwrap();
    assert!(t.terminate(), "{}", t.log_text());
}

/// Starts the target on a configuration serving `pool/image` of the cluster `conf` and expects
/// it to fail at start-up: its standard error.
fn refused_start(dir: &TempDir, conf: &std::path::Path, pool: &str, image: &str) -> String {
    let cfg = dir.0.join("config.yaml");
    let ns = format!(
        "{{ nsid: 1, rbd: {{ pool: {pool}, image: {image}, conf: {} }} }}",
        conf.display()
    );
    std::fs::write(&cfg, ceph::target_yaml(nvmf_tests::free_port(), &[ns])).unwrap();
    let out = std::process::Command::new(target_bin())
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the target started: {err}");
    err
}

#[test]
fn a_missing_image_or_pool_is_a_clear_start_up_error() {
    let Some(conf) = ceph::conf() else { return };
    let dir = TempDir::new("rbd-missing");
    for (pool, image, want) in [
        ("rbd", "no-such-image", "rbd/no-such-image"),
        ("no-such-pool", "img", "pool no-such-pool"),
    ] {
        let err = refused_start(&dir, &conf, pool, image);
        assert!(
            err.contains(want) && err.contains(&*conf.to_string_lossy()),
            "names the image and the cluster: {err}"
        );
    }
}

#[test]
fn an_unreachable_cluster_is_a_clear_start_up_error() {
    // No cluster needed: a configuration whose monitor nobody serves.
    let dir = TempDir::new("rbd-unreachable");
    let conf = dir.0.join("ceph.conf");
    std::fs::write(
        &conf,
        "[global]\nmon host = 127.0.0.1:1\nauth client required = none\n",
    )
    .unwrap();
    let started = std::time::Instant::now();
    let err = refused_start(&dir, &conf, "rbd", "img1");
    assert!(
        err.contains("rbd/img1")
            && err.contains(&*conf.to_string_lossy())
            && err.contains("cannot connect"),
        "names the cluster and the image: {err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "bounded wait for the monitors"
    );
}
