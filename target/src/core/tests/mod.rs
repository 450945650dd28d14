//! Core tests: no transport, a virtual clock, a host that speaks exactly like Linux.

mod ana;
mod auth;
mod bad_input;
mod bringup;
mod discovery;
mod fused;
mod fuzz;
mod lifecycle;
mod metrics;
mod pieces;
mod reload;
mod reservations;
mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvme::fabrics::{
    connect_sqe, property_get_sqe, property_set_sqe, reg, Cc, ConnectData, ConnectResult, Csts,
    InvalidAttr, PropSize,
};
use nvme::identify::{cns, csi, ctrl as idc, feat, IdentifyCmd, IdentifyController};
use nvme::log::GetLogPageCmd;
use nvme::opcode::{admin, io};
use nvme::sgl::Sgl;
use nvme::{Cqe, Sqe, Status, DISCOVERY_NQN};

use super::*;

pub(crate) const SUBNQN: &str = "nqn.2024-01.io.nvmf-rs:test";
pub(super) const RESTRICTED: &str = "nqn.2024-01.io.nvmf-rs:restricted";
pub(crate) const HOSTNQN: &str =
    "nqn.2014-08.org.nvmexpress:uuid:0c4f6c1e-1111-2222-3333-444455556666";
pub(super) const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:other";
pub(crate) const HOSTID: [u8; 16] = [0x0c, 0x4f, 0x6c, 0x1e, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6];

pub(super) fn ns(nsid: u32, blocks: u64, lba_shift: u8, device: u32) -> NamespaceSpec {
    let mut nguid = [0u8; 16];
    nguid[0] = nsid as u8;
    nguid[15] = 0xee;
    let mut uuid = [0u8; 16];
    uuid[0] = 0xa0 | nsid as u8;
    NamespaceSpec {
        nsid,
        blocks,
        lba_shift,
        device,
        nguid,
        uuid,
        read_only: false,
        deallocate_zeroes: true,
        ana_group: 1,
        native_caw: 0,
        volatile_cache: true,
    }
}

/// The subsystems `test_target` starts with.
pub(crate) fn test_subsystems() -> Vec<SubsystemSpec> {
    vec![
        SubsystemSpec {
            nqn: SUBNQN.into(),
            serial: "NVMFRS0001".into(),
            model: "nvmf-rs test".into(),
            allow_any_host: false,
            hosts: vec![HOSTNQN.into()],
            auth_policy: Default::default(),
            namespaces: vec![ns(1, 2048, 12, 7), ns(3, 1 << 20, 9, 8)],
        },
        SubsystemSpec {
            nqn: RESTRICTED.into(),
            serial: "NVMFRS0002".into(),
            model: "nvmf-rs restricted".into(),
            allow_any_host: false,
            hosts: vec![OTHER_HOST.into()],
            auth_policy: Default::default(),
            namespaces: vec![ns(1, 64, 12, 9)],
        },
    ]
}

/// The listeners `test_target` starts with: TCP and RDMA on 192.0.2.1:4420.
pub(crate) fn test_listeners() -> Vec<ListenerInfo> {
    vec![
        ListenerInfo::new(TrType::Tcp, "192.0.2.1".into(), "4420".into(), 1),
        ListenerInfo::new(TrType::Rdma, "192.0.2.1".into(), "4420".into(), 2),
    ]
}

/// The target parameters the tests start with.
pub(crate) fn test_target_params() -> TargetParams {
    TargetParams {
        keep_alive_ms_min: 1000,
        resv_store: None,
        auth_timeout: crate::core::AUTH_TIMEOUT,
        data_completes_always: false,
        cntlid_range: nvme::fabrics::CNTLID_MIN..=nvme::fabrics::CNTLID_MAX,
    }
}

pub(crate) fn test_target() -> Arc<Target> {
    test_target_with(|_| {})
}

/// The test target with its parameters changed by `f`.
pub(crate) fn test_target_with(f: impl FnOnce(&mut TargetParams)) -> Arc<Target> {
    let mut params = test_target_params();
    f(&mut params);
    Target::new(test_subsystems(), test_listeners(), params)
}

pub(crate) fn tcp_caps() -> TransportCaps {
    TransportCaps {
        trtype: TrType::Tcp,
        in_capsule_data: 8192,
        max_io_size: 128 * 1024,
        max_transfer: 128 * 1024,
        max_queue_depth: 128,
    }
}

pub(crate) fn rdma_caps() -> TransportCaps {
    TransportCaps {
        trtype: TrType::Rdma,
        in_capsule_data: 4096,
        max_io_size: 1 << 20,
        max_transfer: 1 << 20,
        max_queue_depth: 256,
    }
}

/// A Read/Write-shaped SQE on namespace 1: `blocks` from `slba`, data described by `sgl`.
pub(crate) fn rw_sqe(opcode: u8, cid: u16, slba: u64, blocks: u32, sgl: Sgl) -> Sqe {
    let mut sqe = Sqe::new(opcode, cid);
    sqe.nsid = 1.into();
    sqe.cdw10 = (slba as u32).into();
    sqe.cdw11 = ((slba >> 32) as u32).into();
    sqe.cdw12 = (blocks - 1).into();
    sqe.dptr = sgl.encode();
    sqe
}

/// What a submitted command turned into.
#[derive(Debug)]
pub(crate) enum Reply {
    /// `parse` refused it.
    Rejected(Cqe),
    /// `execute` finished it; the data that went to the host.
    Done(Cqe, Vec<u8>),
    /// A backend operation to run.
    Io(IoOp, Cmd),
    /// Held (AER).
    Deferred(Cmd),
}

impl Reply {
    /// The CQE of a command that completed without the backend.
    #[track_caller]
    pub fn cqe(&self) -> Cqe {
        match self {
            Reply::Rejected(c) | Reply::Done(c, _) => *c,
            r => panic!("expected a completion, got {r:?}"),
        }
    }
    #[track_caller]
    pub fn status(&self) -> Status {
        self.cqe().status()
    }
    #[track_caller]
    pub fn ok_data(&self) -> &[u8] {
        match self {
            Reply::Done(c, d) if c.status().is_success() => d,
            r => panic!("expected success with data, got {r:?}"),
        }
    }
    #[track_caller]
    pub fn ok_result(&self) -> u64 {
        let c = self.cqe();
        assert!(c.status().is_success(), "expected success, got {c:?}");
        c.result.get()
    }
}

/// A host's end of one queue, with a virtual clock.
pub(crate) struct Host {
    pub q: Queue,
    pub now: Instant,
    /// The command buffer of the last command `execute` handed to the backend, as it left it.
    pub io_buf: Vec<u8>,
    cid: u16,
}

impl Host {
    pub fn new(target: &Arc<Target>, caps: TransportCaps, now: Instant) -> Host {
        Host {
            q: Queue::new(target.clone(), caps, "192.0.2.100:51234".into()),
            now,
            io_buf: Vec::new(),
            cid: 0,
        }
    }

    pub fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// The queue's next event must be the completion of command `cid`: returns its CQE.
    pub fn expect_completion(&mut self, cid: u16) -> Cqe {
        match self.q.poll_event() {
            Some(QueueEvent::Complete(c)) => {
                assert_eq!(c.cid(), cid);
                c
            }
            e => panic!("expected the completion of CID {cid}, got {e:?}"),
        }
    }

    /// The SGL a Linux host would use for `len` bytes in direction `to_ctrl`.
    pub fn sgl(&self, len: u32, to_ctrl: bool) -> Sgl {
        let icd = if self.q.qid().unwrap_or(0) == 0 {
            8192
        } else {
            self.q.caps.in_capsule_data
        };
        match self.q.caps.trtype {
            TrType::Tcp if to_ctrl && len > 0 && len <= icd => Sgl::InCapsule { offset: 0, len },
            TrType::Tcp => Sgl::Transport { len },
            TrType::Rdma if to_ctrl && len > 0 && len <= self.q.caps.in_capsule_data => {
                Sgl::InCapsule { offset: 0, len }
            }
            TrType::Rdma => Sgl::Keyed {
                addr: 0x1000,
                len,
                key: 0x55,
                invalidate: true,
            },
        }
    }

    /// Parse and execute `sqe` with `data` as the host's payload.
    pub fn submit(&mut self, sqe: Sqe, data: &[u8]) -> Reply {
        let mut cmd = match self.q.parse(&sqe, self.now) {
            Err(c) => return Reply::Rejected(c),
            Ok(cmd) => cmd,
        };
        let len = match cmd.xfer {
            Xfer::None => 0,
            Xfer::FromHost(n) | Xfer::ToHost(n) => n as usize,
        };
        let mut buf = vec![0u8; len];
        if let Xfer::FromHost(_) = cmd.xfer {
            buf[..data.len().min(len)].copy_from_slice(&data[..data.len().min(len)]);
        }
        match self.q.execute(&mut cmd, &mut buf, self.now) {
            Exec::Done { cqe, data_len } => {
                assert_eq!(cqe.cid(), sqe.cid(), "cid echoed");
                if let Xfer::ToHost(n) = cmd.xfer {
                    assert!(data_len <= n);
                } else {
                    assert_eq!(data_len, 0);
                }
                Reply::Done(cqe, buf[..data_len as usize].to_vec())
            }
            Exec::Io(op) => {
                self.io_buf = buf;
                Reply::Io(op, cmd)
            }
            Exec::Deferred => Reply::Deferred(cmd),
        }
    }

    /// Run a backend op "successfully" and complete it.
    pub fn finish_io(&mut self, r: Reply) -> Cqe {
        match r {
            Reply::Io(_, mut cmd) => self.q.complete_io(&mut cmd, Ok(()), self.now),
            r => panic!("expected an I/O, got {r:?}"),
        }
    }

    // -- command builders (what Linux sends) --

    pub fn connect(&mut self, qid: u16, sqsize: u16, kato: u32, data: &ConnectData) -> Reply {
        let cid = self.next_cid();
        let sgl = self.sgl(1024, true);
        let sqe = connect_sqe(cid, qid, sqsize, 0, kato, sgl);
        self.submit(sqe, &data.encode())
    }

    pub fn connect_admin(&mut self, subnqn: &str, hostnqn: &str, kato: u32) -> Reply {
        let d = ConnectData::new(HOSTID, 0xffff, subnqn, hostnqn);
        self.connect(0, 31, kato, &d)
    }

    pub fn prop_get(&mut self, off: u32, size: PropSize) -> Reply {
        let cid = self.next_cid();
        let mut sqe = property_get_sqe(cid, off, size);
        sqe.dptr = self.sgl(0, false).encode();
        self.submit(sqe, &[])
    }

    pub fn prop_set(&mut self, off: u32, val: u64) -> Reply {
        let cid = self.next_cid();
        let mut sqe = property_set_sqe(cid, off, val, PropSize::Four);
        sqe.dptr = self.sgl(0, false).encode();
        self.submit(sqe, &[])
    }

    pub fn identify(&mut self, cns: u8, nsid: u32, csi: u8) -> Reply {
        let cid = self.next_cid();
        let dptr = self.sgl(4096, false).encode();
        let sqe = IdentifyCmd {
            cns,
            cntid: 0,
            cnssid: 0,
            csi,
            nsid,
        }
        .to_sqe(cid, dptr);
        self.submit(sqe, &[])
    }

    pub fn get_log(&mut self, lid: u8, nsid: u32, len: u32, off: u64, rae: bool) -> Reply {
        self.get_log_csi(lid, nsid, len, off, rae, 0)
    }

    pub fn get_log_csi(
        &mut self,
        lid: u8,
        nsid: u32,
        len: u32,
        off: u64,
        rae: bool,
        csi: u8,
    ) -> Reply {
        let cid = self.next_cid();
        let dptr = self.sgl(len, false).encode();
        let mut g = GetLogPageCmd::new(lid, nsid, len, off, rae);
        g.csi = csi;
        self.submit(g.to_sqe(cid, dptr), &[])
    }

    pub fn admin_sqe(&mut self, opcode: u8) -> Sqe {
        let cid = self.next_cid();
        let mut sqe = Sqe::new(opcode, cid);
        sqe.dptr = self.sgl(0, false).encode();
        sqe
    }

    pub fn set_features(&mut self, fid: u8, cdw11: u32, data: &[u8]) -> Reply {
        let mut sqe = self.admin_sqe(admin::SET_FEATURES);
        sqe.cdw10 = (fid as u32).into();
        sqe.cdw11 = cdw11.into();
        sqe.dptr = self.sgl(data.len() as u32, true).encode();
        self.submit(sqe, data)
    }

    /// Set Features for one namespace (no data).
    pub fn set_features_ns(&mut self, fid: u8, nsid: u32, cdw11: u32) -> Reply {
        let mut sqe = self.admin_sqe(admin::SET_FEATURES);
        sqe.nsid = nsid.into();
        sqe.cdw10 = (fid as u32).into();
        sqe.cdw11 = cdw11.into();
        sqe.dptr = self.sgl(0, true).encode();
        self.submit(sqe, &[])
    }

    pub fn get_features(&mut self, fid: u8, cdw11: u32, len: u32) -> Reply {
        let mut sqe = self.admin_sqe(admin::GET_FEATURES);
        sqe.cdw10 = (fid as u32).into();
        sqe.cdw11 = cdw11.into();
        sqe.dptr = self.sgl(len, false).encode();
        self.submit(sqe, &[])
    }

    pub fn simple(&mut self, opcode: u8) -> Reply {
        let sqe = self.admin_sqe(opcode);
        self.submit(sqe, &[])
    }

    pub fn rw(&mut self, opcode: u8, nsid: u32, slba: u64, nlb: u32, lba_shift: u8) -> Reply {
        let cid = self.next_cid();
        let mut sqe = Sqe::new(opcode, cid);
        sqe.nsid = nsid.into();
        sqe.cdw10 = (slba as u32).into();
        sqe.cdw11 = ((slba >> 32) as u32).into();
        sqe.cdw12 = (nlb - 1).into();
        let len = (nlb as u64) << lba_shift;
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        let data_len = if opcode == io::WRITE || opcode == io::READ {
            len
        } else {
            0
        };
        sqe.dptr = self.sgl(data_len, opcode == io::WRITE).encode();
        let payload = vec![
            0x5a;
            if opcode == io::WRITE {
                data_len as usize
            } else {
                0
            }
        ];
        self.submit(sqe, &payload)
    }

    /// Bring up an admin queue the way Linux does up to CSTS.RDY; returns the cntlid.
    pub fn bring_up(&mut self, subnqn: &str, hostnqn: &str) -> u16 {
        self.bring_up_as(subnqn, hostnqn, HOSTID)
    }

    /// [`Host::bring_up`] with another Host Identifier.
    pub fn bring_up_as(&mut self, subnqn: &str, hostnqn: &str, hostid: [u8; 16]) -> u16 {
        let d = ConnectData::new(hostid, 0xffff, subnqn, hostnqn);
        let cntlid = self.connect(0, 31, 5000, &d).ok_result() as u16;
        let cc = Cc::new(false, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
        assert!(self.prop_set(reg::CC, cc.0 as u64).status().is_success());
        let cc = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
        assert!(self.prop_set(reg::CC, cc.0 as u64).status().is_success());
        assert!(Csts(self.prop_get(reg::CSTS, PropSize::Four).ok_result() as u32).rdy());
        cntlid
    }
}

pub(super) const HOSTID_B: [u8; 16] = [0xbb; 16];

/// A target open to any host, host A's admin queue, and I/O queues for host A (HOSTID) and
/// host B (HOSTID_B, whose admin queue is the last value: dropping it ends B's controller).
pub(super) fn two_hosts() -> (Arc<Target>, Host, Host, Host, Host) {
    two_hosts_with(|_| {})
}

/// [`two_hosts`] on a target whose parameters `f` changed.
pub(super) fn two_hosts_with(
    f: impl FnOnce(&mut TargetParams),
) -> (Arc<Target>, Host, Host, Host, Host) {
    let t = test_target_with(f);
    let mut open = test_subsystems();
    open[0].allow_any_host = true;
    t.reconfigure(open, test_listeners());
    let io = |t: &Arc<Target>, hostid, hostnqn: &str| {
        let mut a = Host::new(t, tcp_caps(), Instant::now());
        let cntlid = a.bring_up_as(SUBNQN, hostnqn, hostid);
        a.set_features(feat::NUM_QUEUES, 1 | 1 << 16, &[])
            .ok_result();
        let mut q = Host::new(t, tcp_caps(), a.now);
        q.connect(1, 31, 0, &ConnectData::new(hostid, cntlid, SUBNQN, hostnqn))
            .ok_result();
        (a, q)
    };
    let (admin_a, qa) = io(&t, HOSTID, HOSTNQN);
    let (admin_b, qb) = io(&t, HOSTID_B, OTHER_HOST);
    (t, admin_a, qa, qb, admin_b)
}
