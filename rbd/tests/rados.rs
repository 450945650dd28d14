//! RADOS objects, attributes and leases against the test cluster (`NVMF_CEPH_CONF`, as
//! `scripts/test.sh` sets it). Without it these tests say so and pass nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use nvmf_rbd::{Cluster, IoCtx};

fn pool() -> Option<Arc<IoCtx>> {
    let Some(conf) = std::env::var_os("NVMF_CEPH_CONF").map(PathBuf::from) else {
        eprintln!("NVMF_CEPH_CONF is not set: no test cluster, test not run");
        return None;
    };
    let c = Cluster::connect(&conf, "admin", &[("client_mount_timeout", "15")]).unwrap();
    Some(IoCtx::open(&c, "rbd", "").unwrap())
}

fn unique(what: &str) -> String {
    format!(
        "nvmf-test.{what}.{}.{:?}",
        std::process::id(),
        Instant::now()
    )
}

/// Two connections (two gateways): the lease is exclusive, renewable by its holder only, and
/// passes to the other once its holder stops renewing, without anyone breaking it.
#[test]
fn a_lease_is_exclusive_and_expires_when_not_renewed() {
    let (Some(a), Some(b)) = (pool(), pool()) else {
        return;
    };
    assert_ne!(a.cluster().client_name(), b.cluster().client_name());
    let oid = unique("lease");
    let d = Duration::from_secs(3);
    assert!(a.lock_exclusive(&oid, "lease", "gw-a", d, false).unwrap());
    assert!(!b.lock_exclusive(&oid, "lease", "gw-b", d, false).unwrap());
    // The holder renews; the other still cannot take it.
    assert!(a.lock_exclusive(&oid, "lease", "gw-a", d, true).unwrap());
    let holders = b.lockers(&oid, "lease").unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0], (a.cluster().client_name(), "gw-a".to_owned()));
    // A stops renewing: after the duration the OSD forgets it and B gets it.
    let t = Instant::now();
    loop {
        if b.lock_exclusive(&oid, "lease", "gw-b", d, false).unwrap() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the lease never expired"
        );
        sleep(Duration::from_millis(250));
    }
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "taken after {:?}",
        t.elapsed()
    );
    // A's renewal that must find it held now fails, and A sees B as the holder.
    assert!(
        a.lock_exclusive(&oid, "lease", "gw-a", d, true).is_err()
            || !a.lock_exclusive(&oid, "lease", "gw-a", d, false).unwrap()
    );
    assert_eq!(a.lockers(&oid, "lease").unwrap()[0].1, "gw-b");
    // Given back, it is free at once.
    b.unlock(&oid, "lease", "gw-b").unwrap();
    assert!(a.lockers(&oid, "lease").unwrap().is_empty());
    assert!(a.lock_exclusive(&oid, "lease", "gw-a", d, false).unwrap());
    a.remove(&oid).unwrap();
}

#[test]
fn attributes_are_set_listed_and_removed() {
    let Some(a) = pool() else { return };
    let oid = unique("attrs");
    assert!(a.xattrs(&oid).unwrap().is_empty());
    assert!(a.lockers(&oid, "x").unwrap().is_empty());
    a.set_xattr(&oid, "gw.a", b"one").unwrap();
    a.set_xattr(&oid, "gw.b", b"two").unwrap();
    a.set_xattr(&oid, "gw.a", b"three").unwrap();
    let mut got = a.xattrs(&oid).unwrap();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("gw.a".to_owned(), b"three".to_vec()),
            ("gw.b".to_owned(), b"two".to_vec())
        ]
    );
    a.remove_xattr(&oid, "gw.b").unwrap();
    a.remove_xattr(&oid, "gw.b").unwrap();
    assert_eq!(a.xattrs(&oid).unwrap().len(), 1);
    a.remove(&oid).unwrap();
    a.remove(&oid).unwrap();
}

/// The group configuration's compare-and-swap: created once, replaced only by a writer that
/// saw the current version.
#[test]
fn guarded_writes_replace_only_the_version_they_saw() {
    let Some(a) = pool() else { return };
    let oid = unique("cas");
    assert_eq!(a.read_full(&oid).unwrap(), None);
    assert_eq!(a.xattr(&oid, "version").unwrap(), None);
    assert!(a
        .write_guarded(&oid, "version", None, b"1", b"first")
        .unwrap());
    // A second creator loses.
    assert!(!a
        .write_guarded(&oid, "version", None, b"1", b"other")
        .unwrap());
    assert_eq!(a.read_full(&oid).unwrap().unwrap(), b"first");
    // A writer that saw an old version loses; one that saw the current one wins.
    assert!(!a
        .write_guarded(&oid, "version", Some(b"0"), b"2", b"stale")
        .unwrap());
    assert!(a
        .write_guarded(&oid, "version", Some(b"1"), b"2", b"second, longer")
        .unwrap());
    assert_eq!(a.read_full(&oid).unwrap().unwrap(), b"second, longer");
    assert_eq!(a.xattr(&oid, "version").unwrap().unwrap(), b"2");
    assert!(a
        .write_guarded(&oid, "version", Some(b"2"), b"3", b"3rd")
        .unwrap());
    assert_eq!(a.read_full(&oid).unwrap().unwrap(), b"3rd");
    a.remove(&oid).unwrap();
}

/// Watch and notify between two connections (two gateways): a notify reaches the other's
/// watch (acknowledged, so the notifier learns every watcher saw it) and its own; a watch
/// dropped gets nothing more; a missing object cannot be watched.
#[test]
fn a_notify_reaches_every_watch_of_the_object() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(a) = pool() else { return };
    let conf = PathBuf::from(std::env::var_os("NVMF_CEPH_CONF").unwrap());
    let c = Cluster::connect(&conf, "admin", &[("client_mount_timeout", "15")]).unwrap();
    let b = IoCtx::open(&c, "rbd", "").unwrap();
    let oid = unique("watch");
    let err = a.watch(&oid, Duration::from_secs(5), || {}).unwrap_err();
    assert_eq!(err.errno, libc::ENOENT, "{err}");
    assert!(a.write_guarded(&oid, "version", None, b"1", b"x").unwrap());

    let (seen_a, seen_b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let s = Arc::clone(&seen_a);
    let wa = a
        .watch(&oid, Duration::from_secs(5), move || {
            s.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let s = Arc::clone(&seen_b);
    let wb = b
        .watch(&oid, Duration::from_secs(5), move || {
            s.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    // Every watcher acknowledges before notify returns, after its function ran.
    assert!(a.notify(&oid, Duration::from_secs(5)).unwrap());
    assert_eq!(seen_a.load(Ordering::SeqCst), 1);
    assert_eq!(seen_b.load(Ordering::SeqCst), 1);
    assert!(b.notify(&oid, Duration::from_secs(5)).unwrap());
    assert_eq!(seen_a.load(Ordering::SeqCst), 2);
    assert_eq!(seen_b.load(Ordering::SeqCst), 2);
    assert!(!wa.broken() && !wb.broken());

    drop(wb);
    assert!(a.notify(&oid, Duration::from_secs(5)).unwrap());
    assert_eq!(seen_a.load(Ordering::SeqCst), 3);
    assert_eq!(seen_b.load(Ordering::SeqCst), 2);
    drop(wa);
    a.remove(&oid).unwrap();
}
