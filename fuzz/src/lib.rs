//! Helpers shared by the fuzz targets: the input framing of the stream targets, a
//! deterministic chunker ("split the stream anywhere"), a small target for the controller core,
//! and an in-memory [`Store`] so the target's NVMe/TCP connection runs without io_uring.
//!
//! Stream inputs (`pdu_stream`, `tcp_conn`) are `[cfg, split_seed, stream...]`:
//! - `cfg` bit 0: receiver role (0 controller, 1 host); bit 1/2: header/data digests expected;
//!   bit 3: start after the IC exchange; bits 4..=6: the PDA we announced; bit 7: small data
//!   limits (`pdu_stream`) or a two-buffer pool (`tcp_conn`).
//! - `split_seed` picks where the stream is cut (0: not at all).

use std::sync::Arc;

use nvmf_target::core::{
    ListenerInfo, NamespaceSpec, SubsystemSpec, Target, TargetParams, TrType, TransportCaps,
};

/// The subsystem of [`fuzz_target_core`].
pub const SUBNQN: &str = "nqn.2026-11.io.nvmf-rs:fuzz";
/// Namespace 1 of [`fuzz_target_core`]: 4096 blocks of 4 KiB.
pub const NS_BLOCKS: u64 = 4096;

/// A stream-target input split into its parts.
#[derive(Debug, Clone, Copy)]
pub struct StreamInput<'a> {
    pub cfg: u8,
    pub split_seed: u8,
    pub stream: &'a [u8],
}

impl<'a> StreamInput<'a> {
    pub fn parse(data: &'a [u8]) -> Option<StreamInput<'a>> {
        match data {
            [cfg, split_seed, stream @ ..] => Some(StreamInput {
                cfg: *cfg,
                split_seed: *split_seed,
                stream,
            }),
            _ => None,
        }
    }
}

/// Chunk lengths for a stream, deterministic in `seed`: 0 gives the whole stream at once,
/// other seeds mix single bytes, small and large pieces.
pub struct Chunker {
    state: u32,
    max: usize,
}

impl Chunker {
    pub fn new(seed: u8) -> Chunker {
        const MAX: [usize; 8] = [usize::MAX, 1, 3, 8, 29, 72, 300, 5000];
        Chunker {
            state: 0x9e37_79b9 ^ (seed as u32).wrapping_mul(0x85eb_ca6b) | 1,
            max: MAX[(seed & 7) as usize],
        }
    }

    /// The next chunk length (at least 1).
    pub fn next_len(&mut self) -> usize {
        if self.max == usize::MAX {
            return usize::MAX;
        }
        // xorshift32
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.state = x;
        1 + (x as usize % self.max)
    }

    /// Split `s` into chunks.
    pub fn split<'a>(&mut self, mut s: &'a [u8]) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        while !s.is_empty() {
            let n = self.next_len().min(s.len());
            out.push(&s[..n]);
            s = &s[n..];
        }
        out
    }
}

/// Transport limits the fuzzed core and connection run with.
pub fn fuzz_caps() -> TransportCaps {
    TransportCaps {
        trtype: TrType::Tcp,
        in_capsule_data: 8192,
        max_io_size: 32 * 1024,
        // Transfers up to four buffers: large Reads and Writes move in pieces.
        max_transfer: 128 * 1024,
        max_queue_depth: 32,
    }
}

/// A target with one subsystem (any host) holding namespace 1 (4096 × 4 KiB) and namespace 2
/// (512-byte blocks, whose store has a compare-and-write of its own), and a TCP and an RDMA listener (for the discovery log).
pub fn fuzz_target_core() -> Arc<Target> {
    let ns = |nsid: u32, blocks: u64, lba_shift: u8| NamespaceSpec {
        nsid,
        blocks,
        lba_shift,
        device: nsid - 1,
        nguid: [nsid as u8; 16],
        uuid: [0xa0 | nsid as u8; 16],
        read_only: false,
        deallocate_zeroes: true,
        ana_group: nsid,
        // Namespace 2 runs one-block Compare and Writes as one store op (as RBD does).
        native_caw: if nsid == 2 { 512 } else { 0 },
        volatile_cache: true,
    };
    Target::new(
        vec![SubsystemSpec {
            nqn: SUBNQN.into(),
            serial: "FUZZ0001".into(),
            model: "nvmf-rs fuzz".into(),
            allow_any_host: true,
            hosts: vec![],
            auth_policy: Default::default(),
            namespaces: vec![ns(1, NS_BLOCKS, 12), ns(2, 1 << 16, 9)],
        }],
        vec![
            ListenerInfo::new(TrType::Tcp, "127.0.0.1".into(), "4420".into(), 1),
            // Namespace 2's group is not served here: the ANA check runs too.
            {
                let mut l = ListenerInfo::new(TrType::Rdma, "0.0.0.0".into(), "4421".into(), 2);
                l.set_ana(2, nvme::log::ana_state::INACCESSIBLE);
                l
            },
        ],
        TargetParams {
            keep_alive_ms_min: 1000,
            resv_store: None,
            auth_timeout: std::time::Duration::from_secs(30),
            data_completes_always: false,
            cntlid_range: nvme::fabrics::CNTLID_MIN..=nvme::fabrics::CNTLID_MAX,
        },
    )
}

/// The fuzzed connections' buffer pool and backend, in memory.
pub use nvmf_target::transport::mem::MemStore;

/// The host NQN and host ID the seed recordings use (`nvmf-tests` example `fuzz_seeds`).
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f0220000-0000-4000-8000-00000000f022";
/// Host ID of [`HOSTNQN`].
pub const HOSTID: [u8; 16] = [
    0xf0, 0x22, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0xf0, 0x22,
];

/// Run one command through a core queue as a transport would (data in `data` for host-to-
/// controller commands); returns the CQE and the data that went to the host.
pub fn run_core_cmd(
    q: &mut nvmf_target::core::Queue,
    sqe: &nvme::Sqe,
    data: &[u8],
    now: std::time::Instant,
) -> (nvme::Cqe, Vec<u8>) {
    use nvmf_target::core::{Exec, Xfer};
    let mut cmd = match q.parse(sqe, now) {
        Ok(c) => c,
        Err(cqe) => return (cqe, Vec::new()),
    };
    let len = match cmd.xfer {
        Xfer::None => 0,
        Xfer::FromHost(n) | Xfer::ToHost(n) => n,
    };
    assert!(len <= q.max_transfer(), "parse bounds the transfer");
    let mut buf = vec![0u8; len as usize];
    if let Xfer::FromHost(_) = cmd.xfer {
        let n = buf.len().min(data.len());
        buf[..n].copy_from_slice(&data[..n]);
    }
    match q.execute(&mut cmd, &mut buf, now) {
        Exec::Done { cqe, data_len } => {
            assert!(data_len as usize <= buf.len());
            buf.truncate(data_len as usize);
            let to_host = matches!(cmd.xfer, Xfer::ToHost(_));
            (cqe, if to_host { buf } else { Vec::new() })
        }
        // A transfer larger than the buffer runs piece by piece (the buffer here holds all of
        // it; each piece's op covers its part).
        Exec::Io(_) => loop {
            if cmd.is_last_piece() {
                break (q.complete_io(&mut cmd, Ok(()), now), Vec::new());
            }
            if let Some(cqe) = q.piece_done(&mut cmd, Ok(()), now) {
                break (cqe, Vec::new());
            }
            assert!(cmd.next_piece(), "a piece follows one that is not the last");
            match q.execute(&mut cmd, &mut buf, now) {
                Exec::Io(op) => assert_eq!(op.len, cmd.piece.len, "each piece's op is the piece"),
                Exec::Done { cqe, .. } => break (cqe, Vec::new()),
                Exec::Deferred => panic!("a piece deferred"),
            }
        },
        Exec::Deferred => panic!("setup command deferred"),
    }
}

/// Keep-alive timeout of [`admin_controller`]: I/O controllers need one; nothing here runs
/// long enough (or passes a late enough `now`) for it to expire.
pub const KATO_MS: u32 = 600_000;

/// An enabled controller of `target` (the first, so cntlid 1) for [`HOSTNQN`], with 4 I/O
/// queues granted: I/O-queue Connects in a fuzz input can attach to it. Keep the returned
/// admin queue alive while they run.
pub fn admin_controller(target: &Arc<Target>, now: std::time::Instant) -> nvmf_target::core::Queue {
    use nvme::fabrics::{self, reg, Cc, ConnectData, PropSize};
    use nvme::sgl::Sgl;
    let mut q = nvmf_target::core::Queue::new(target.clone(), fuzz_caps(), "fuzz-admin".into());
    let sgl = Sgl::InCapsule {
        offset: 0,
        len: 1024,
    };
    let data = ConnectData::new(HOSTID, fabrics::CNTLID_DYNAMIC, SUBNQN, HOSTNQN).encode();
    let (c, _) = run_core_cmd(
        &mut q,
        &fabrics::connect_sqe(1, 0, 31, 0, KATO_MS, sgl),
        &data,
        now,
    );
    assert!(c.status().is_success(), "{c:?}");
    for (cid, en) in [(2, false), (3, true)] {
        let cc = Cc::new(en, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
        let sqe = fabrics::property_set_sqe(cid, reg::CC, cc.0 as u64, PropSize::Four);
        let (c, _) = run_core_cmd(&mut q, &sqe, &[], now);
        assert!(c.status().is_success(), "{c:?}");
    }
    let mut sqe = nvme::Sqe::new(nvme::opcode::admin::SET_FEATURES, 4);
    sqe.cdw10 = (nvme::identify::feat::NUM_QUEUES as u32).into();
    sqe.cdw11 = (3u32 | 3 << 16).into();
    let (c, _) = run_core_cmd(&mut q, &sqe, &[], now);
    assert!(c.status().is_success(), "{c:?}");
    q
}
