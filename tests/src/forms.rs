//! The block API's operations as a table, run on any form of `Namespace` (one path without
//! or with reconnection, several paths): `tests/namespace_forms.rs` over NVMe/TCP, and
//! `examples/io_check.rs --forms-with` (the VM's NVMe/RDMA scenario) against a live target.

use std::io::{Read, Seek, SeekFrom, Write};

use initiator::resv::{
    AcquireAction, ChangePtpl, RegisterAction, RegisterCmd, ReleaseAction, ReleaseCmd, ResvType,
};
use initiator::{Error, Namespace};

use crate::resv;

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Every operation of the block API on `ns`, in the 1 MiB region at `base`.
pub fn every_operation(ns: &mut Namespace, base: u64, hostid: [u8; 16], form: &str) {
    let bs = ns.block_size() as usize;
    let ctx = |what: &str| format!("{form}: {what}");
    let data = pattern(8 * bs, 1);
    let mut back = vec![0u8; 8 * bs];

    // Read and write, with and without FUA; a transfer larger than one command.
    ns.write_at(&data, base)
        .unwrap_or_else(|e| panic!("{form}: write: {e}"));
    ns.read_at(&mut back, base)
        .unwrap_or_else(|e| panic!("{form}: read: {e}"));
    assert_eq!(back, data, "{}", ctx("read back"));
    let fua = pattern(4 * bs, 2);
    ns.write_fua_at(&fua, base + 8 * bs as u64)
        .unwrap_or_else(|e| panic!("{form}: FUA write: {e}"));
    let mut fback = vec![0u8; 4 * bs];
    ns.read_at(&mut fback, base + 8 * bs as u64).unwrap();
    assert_eq!(fback, fua, "{}", ctx("FUA read back"));
    let big = pattern(1 << 20, 3);
    ns.write_at(&big[..(1 << 20) - 64 * bs], base + 64 * bs as u64)
        .unwrap_or_else(|e| panic!("{form}: large write: {e}"));

    // Compare: equal, then one byte off.
    assert!(ns
        .compare_at(&data, base)
        .unwrap_or_else(|e| panic!("{form}: compare: {e}")));
    let mut off = data.clone();
    off[5] ^= 0xff;
    assert!(!ns
        .compare_at(&off, base)
        .unwrap_or_else(|e| panic!("{form}: compare, differing: {e}")));

    // Compare and Write: the pair that matches writes, the one that does not changes nothing.
    let one = &data[..bs];
    let new = pattern(bs, 9);
    assert!(ns
        .compare_and_write(one, &new, base)
        .unwrap_or_else(|e| panic!("{form}: CAW: {e}")));
    assert!(!ns
        .compare_and_write(one, &data[bs..2 * bs], base)
        .unwrap_or_else(|e| panic!("{form}: CAW, differing: {e}")));
    ns.read_at(&mut back[..bs], base).unwrap();
    assert_eq!(&back[..bs], &new[..], "{}", ctx("CAW read back"));

    // Flush, Write Zeroes (reads back zeroes), deallocate.
    ns.flush().unwrap_or_else(|e| panic!("{form}: flush: {e}"));
    ns.write_zeroes(base, 4 * bs as u64)
        .unwrap_or_else(|e| panic!("{form}: write zeroes: {e}"));
    ns.read_at(&mut back, base).unwrap();
    assert!(back[..4 * bs].iter().all(|&b| b == 0), "{}", ctx("zeroes"));
    assert_eq!(&back[4 * bs..], &data[4 * bs..], "{}", ctx("after zeroes"));
    ns.trim(&[(base + 4 * bs as u64, 4 * bs as u64)])
        .unwrap_or_else(|e| panic!("{form}: deallocate: {e}"));

    // Reservations: register, acquire, report (this host holds it), release, unregister.
    let key = 0x1234_5678 + u64::from(hostid[0]);
    resv::register(ns, key).unwrap_or_else(|e| panic!("{form}: register: {e}"));
    resv::acquire(ns, AcquireAction::Acquire, ResvType::WriteExclusive, key, 0)
        .unwrap_or_else(|e| panic!("{form}: acquire: {e}"));
    let r = ns
        .reservation_report()
        .unwrap_or_else(|e| panic!("{form}: report: {e}"));
    assert_eq!(r.rtype, Some(ResvType::WriteExclusive), "{}", ctx("report"));
    assert_eq!(
        r.registrants,
        vec![(hostid, key, true)],
        "{}",
        ctx("report")
    );
    ns.reservation_release(&ReleaseCmd {
        action: ReleaseAction::Release,
        ignore_key: false,
        rtype: ResvType::WriteExclusive as u8,
        crkey: key,
    })
    .unwrap_or_else(|e| panic!("{form}: release: {e}"));
    ns.reservation_register(&RegisterCmd {
        action: RegisterAction::Unregister,
        ignore_key: false,
        ptpl: ChangePtpl::NoChange,
        crkey: key,
        nrkey: 0,
    })
    .unwrap_or_else(|e| panic!("{form}: unregister: {e}"));
    assert_eq!(ns.reservation_report().unwrap().registrants, vec![]);

    // Errors that are answers, not failures: out of range, unaligned.
    let size = ns.size();
    assert!(matches!(
        ns.read_at(&mut back, size),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        ns.write_at(&data[..bs - 1], base),
        Err(Error::InvalidArgument(_))
    ));
}

/// The `std::io` adapter at unaligned offsets, on any form.
pub fn through_std_io(ns: Namespace, base: u64, form: &str) -> Namespace {
    let mut io = ns.into_io();
    let bytes = pattern(10_000, 7);
    io.seek(SeekFrom::Start(base + 333)).unwrap();
    io.write_all(&bytes).unwrap();
    io.flush().unwrap();
    io.seek(SeekFrom::Start(base + 333)).unwrap();
    let mut back = vec![0u8; bytes.len()];
    io.read_exact(&mut back).unwrap();
    assert_eq!(back, bytes, "{form}: std::io");
    io.into_inner()
}
