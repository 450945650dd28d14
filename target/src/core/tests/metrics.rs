//! I/O statistics per subsystem, namespace and controller, as a scrape sees them.

use super::bad_input::ready;
use super::*;

#[test]
fn io_statistics_per_namespace_and_controller() {
    let (t, a, mut q) = ready(tcp_caps());
    for i in 0..3 {
        let r = q.rw(io::READ, 1, i, 2, 12);
        assert!(q.finish_io(r).status().is_success());
    }
    let r = q.rw(io::WRITE, 3, 0, 8, 9);
    assert!(q.finish_io(r).status().is_success());
    // Rejected at parse: counted by status, not per namespace.
    assert_eq!(
        q.rw(io::READ, 1, 1 << 40, 1, 12).status(),
        Status::LBA_RANGE.dnr()
    );
    let m = t.io_metrics();
    let s = m.iter().find(|s| s.nqn == SUBNQN).unwrap();
    let n1 = &s.io.namespaces[&1];
    assert_eq!((n1.reads, n1.bytes_read), (3, 3 * 8192));
    assert_eq!(n1.lat.iter().sum::<u64>(), 3, "every read timed");
    let n3 = &s.io.namespaces[&3];
    assert_eq!((n3.writes, n3.bytes_written), (1, 8 * 512));
    assert_eq!(s.io.errors_by_status[&Some(Status::LBA_RANGE.code())], 1);
    assert_eq!(s.io.outstanding, 0);
    assert_eq!(s.controllers.len(), 1);
    let c = &s.controllers[0];
    assert_eq!(c.hostnqn, HOSTNQN);
    assert_eq!(c.transport, "tcp");
    assert_eq!(c.io.io().reads, 3);
    // A command in flight is outstanding.
    let pending = q.rw(io::READ, 1, 0, 1, 12);
    let m = t.io_metrics();
    assert_eq!(
        m.iter().find(|s| s.nqn == SUBNQN).unwrap().io.outstanding,
        1
    );
    assert!(q.finish_io(pending).status().is_success());
    // The other subsystem lists its namespace with zeros.
    let r = m.iter().find(|s| s.nqn == RESTRICTED).unwrap();
    assert_eq!(r.io.namespaces[&1], stats::NsTotals::default());
    // Totals survive the controller: the I/O queue and the admin queue go away.
    drop((q, a));
    let m = t.io_metrics();
    let s = m.iter().find(|s| s.nqn == SUBNQN).unwrap();
    assert!(s.controllers.is_empty());
    assert_eq!(s.io.namespaces[&1].reads, 4);
    assert_eq!(s.io.outstanding, 0);
}
