//! Proves the controller core's I/O path, statistics included (per-namespace counters,
//! latency histogram, outstanding commands), makes no heap allocation per command: after
//! warm-up, Read and Write commands through `parse` / `execute` / `complete_io` on a connected
//! I/O queue allocate nothing on this thread.

use std::time::Instant;

use nvme::fabrics::{connect_sqe, property_set_sqe, reg, Cc, ConnectData, PropSize};
use nvme::opcode::io;
use nvme::sgl::Sgl;
use nvme::Sqe;
use nvmf_target::core::{
    Exec, NamespaceSpec, Queue, SubsystemSpec, Target, TargetParams, TrType, TransportCaps,
};

mod common;
use common::allocs;

const SUBNQN: &str = "nqn.2026-11.io.nvmf-rs:alloc";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";

fn caps() -> TransportCaps {
    TransportCaps {
        trtype: TrType::Tcp,
        in_capsule_data: 8192,
        max_io_size: 128 * 1024,
        max_transfer: 128 * 1024,
        max_queue_depth: 128,
    }
}

/// Run one command that completes at once; returns the CQE result.
fn run(q: &mut Queue, sqe: Sqe, data: &[u8]) -> u64 {
    let mut cmd = q.parse(&sqe, Instant::now()).expect("parsed");
    let mut buf = vec![0u8; 4096];
    buf[..data.len()].copy_from_slice(data);
    match q.execute(&mut cmd, &mut buf, Instant::now()) {
        Exec::Done { cqe, .. } => {
            assert!(cqe.status().is_success(), "{cqe:?}");
            cqe.result.get()
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn no_heap_allocation_per_io_command_in_the_core() {
    let t = Target::new(
        vec![SubsystemSpec {
            nqn: SUBNQN.into(),
            serial: "ALLOC".into(),
            model: "alloc".into(),
            allow_any_host: true,
            hosts: vec![],
            auth_policy: Default::default(),
            namespaces: vec![NamespaceSpec {
                nsid: 1,
                blocks: 1 << 20,
                lba_shift: 12,
                device: 0,
                nguid: [1; 16],
                uuid: [1; 16],
                read_only: false,
                deallocate_zeroes: true,
                ana_group: 1,
                native_caw: 0,
                volatile_cache: true,
            }],
        }],
        vec![],
        TargetParams {
            keep_alive_ms_min: 1000,
            resv_store: None,
            auth_timeout: nvmf_target::core::AUTH_TIMEOUT,
            data_completes_always: false,
            cntlid_range: nvme::fabrics::CNTLID_MIN..=nvme::fabrics::CNTLID_MAX,
        },
    );
    // Admin queue: Connect, CC.EN.
    let mut admin = Queue::new(t.clone(), caps(), "test".into());
    let d = ConnectData::new([1; 16], 0xffff, SUBNQN, HOSTNQN).encode();
    let sgl = Sgl::InCapsule {
        offset: 0,
        len: 1024,
    };
    let cntlid = run(&mut admin, connect_sqe(1, 0, 31, 0, 5000, sgl), &d) as u16;
    let cc = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
    let mut sqe = property_set_sqe(2, reg::CC, cc.0 as u64, PropSize::Four);
    sqe.dptr = Sgl::Transport { len: 0 }.encode();
    run(&mut admin, sqe, &[]);
    // I/O queue.
    let mut q = Queue::new(t.clone(), caps(), "test".into());
    let d = ConnectData::new([1; 16], cntlid, SUBNQN, HOSTNQN).encode();
    run(&mut q, connect_sqe(1, 1, 127, 0, 0, sgl), &d);

    let mut buf = vec![0x5au8; 8192];
    let mut one = |q: &mut Queue, cid: u16, opcode: u8| {
        let mut sqe = Sqe::new(opcode, cid);
        sqe.nsid = 1.into();
        sqe.cdw10 = (cid as u32 * 2).into();
        sqe.cdw12 = 1.into(); // 2 blocks
        sqe.dptr = if opcode == io::WRITE {
            Sgl::InCapsule {
                offset: 0,
                len: 8192,
            }
        } else {
            Sgl::Transport { len: 8192 }
        }
        .encode();
        let mut cmd = q.parse(&sqe, Instant::now()).expect("parsed");
        match q.execute(&mut cmd, &mut buf, Instant::now()) {
            Exec::Io(_) => {}
            e => panic!("{e:?}"),
        }
        let cqe = q.complete_io(&mut cmd, Ok(()), Instant::now());
        assert!(cqe.status().is_success());
    };
    // Warm-up: every namespace slot and start-time entry this pattern uses is claimed.
    for i in 0..256u16 {
        one(
            &mut q,
            i % 64,
            if i % 2 == 0 { io::READ } else { io::WRITE },
        );
    }
    let before = allocs();
    for i in 0..10_000u16 {
        one(
            &mut q,
            i % 64,
            if i % 2 == 0 { io::READ } else { io::WRITE },
        );
    }
    assert_eq!(allocs() - before, 0, "heap allocations on the I/O path");
    // The counter does count this thread's allocations.
    let v = std::hint::black_box(vec![0u8; 64]);
    assert_eq!(allocs() - before, 1);
    drop(v);
    // The statistics saw them.
    let m = t.io_metrics();
    let ns = &m[0].io.namespaces[&1];
    assert_eq!(ns.reads + ns.writes, 10_256);
    assert_eq!(ns.lat.iter().sum::<u64>(), 10_256);
}
