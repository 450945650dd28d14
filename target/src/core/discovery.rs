//! The discovery controller (NVMe-oF 1.1, 5): Identify, the discovery log page (70h),
//! Keep Alive, AER and the two features it has. Behaviour follows nvmet `discovery.c`.

use std::net::IpAddr;
use std::time::Instant;

use nvme::fabrics::CNTLID_DYNAMIC;
use nvme::identify::{cns, IDENTIFY_DATA_SIZE};
use nvme::log::{
    adrfam, lid, subtype, treq, trtype, tsas, DiscoveryLogEntry, DiscoveryLogHeader, GetLogPageCmd,
};
use nvme::opcode::admin;
use nvme::{Sqe, Status, LINUX_AQ_DEPTH};
use zerocopy::{FromZeros, IntoBytes};

use super::admin::copy_log;
use super::controller::Controller;
use super::queue::{loc, Outcome, Parsed, Reject};
use super::subsystem::TargetInner;
use super::{Cmd, ListenerInfo, Queue, TrType};
use nvme::identify::{ctrl as idc, feat};

/// A NUL-padded ASCII field (what nvmet and SPDK put in TRSVCID and TRADDR).
fn nul_padded<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let n = s.len().min(N - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

/// Whether a listener address is a wildcard ("any address") that a host cannot connect to.
fn is_wildcard(traddr: &str) -> bool {
    traddr.is_empty() || traddr.parse::<IpAddr>().is_ok_and(|a| a.is_unspecified())
}

fn entry_for(l: &ListenerInfo, subnqn: &str, local: Option<&str>) -> DiscoveryLogEntry {
    // A listener on INADDR_ANY/IN6ADDR_ANY reports the address this host reached us on, as
    // nvmet's `disc_traddr` does; the log must never carry the "any" address.
    let traddr = match local {
        Some(a) if is_wildcard(&l.traddr) => a,
        _ => l.traddr.as_str(),
    };
    let mut e = DiscoveryLogEntry::new_zeroed();
    let (tr, ts) = match (l.trtype, l.tls) {
        (TrType::Tcp, None) => (trtype::TCP, tsas::tcp_no_tls()),
        (TrType::Tcp, Some(_)) => (trtype::TCP, tsas::tcp_tls13()),
        (TrType::Rdma, _) => (trtype::RDMA, tsas::rdma_cm()),
    };
    e.trtype = tr;
    e.adrfam = match traddr.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => adrfam::IPV6,
        _ => adrfam::IPV4,
    };
    e.subtype = subtype::NVME;
    // A TLS listener says whether the secure channel is required (nvmet: `addr_treq`); a
    // plain one offers none, so none is required.
    e.treq = match l.tls {
        Some(config::TlsMode::Required) => treq::REQUIRED,
        Some(config::TlsMode::Allowed) => treq::NOT_REQUIRED,
        None => treq::NOT_SPECIFIED,
    };
    e.portid = l.port_id.into();
    // Dynamic controller model only.
    e.cntlid = CNTLID_DYNAMIC.into();
    e.asqsz = LINUX_AQ_DEPTH.into();
    e.trsvcid = nul_padded(&l.trsvcid);
    e.subnqn = nul_padded(subnqn);
    e.traddr = nul_padded(traddr);
    e.tsas = ts;
    e
}

/// The discovery log page `hostnqn` sees: one entry per listener and subsystem the host may
/// connect to (hosts that are not allowed do not learn the subsystem exists). `local` is the
/// target address of the asking connection, used for wildcard listeners.
pub(crate) fn discovery_log(t: &TargetInner, hostnqn: &str, local: Option<&str>) -> Vec<u8> {
    let mut entries = Vec::new();
    let subsystems = t.subsystem_list();
    let (own, remote) = (t.listeners(), t.remote_listeners());
    for l in own.iter().chain(remote.iter()) {
        for s in subsystems
            .iter()
            .filter(|s| l.serves(&s.nqn) && s.host_allowed(hostnqn))
        {
            entries.push(entry_for(l, &s.nqn, local));
        }
    }
    let mut h = DiscoveryLogHeader::new_zeroed();
    h.genctr = t.genctr.load(std::sync::atomic::Ordering::Acquire).into();
    h.numrec = (entries.len() as u64).into();
    h.recfmt = 0.into();
    let mut page = Vec::with_capacity(DiscoveryLogHeader::SIZE + entries.len() * 1024);
    page.extend_from_slice(h.as_bytes());
    for e in &entries {
        page.extend_from_slice(e.as_bytes());
    }
    page
}

impl Queue {
    pub(super) fn parse_discovery(&mut self, sqe: &Sqe) -> Result<Parsed, Reject> {
        match sqe.opcode {
            admin::IDENTIFY => Ok(Parsed::to_host(IDENTIFY_DATA_SIZE as u32, loc::CDW10)),
            admin::GET_LOG_PAGE => self.parse_get_log_page(sqe),
            admin::SET_FEATURES => self.parse_features(sqe, true, true),
            admin::GET_FEATURES => self.parse_features(sqe, false, true),
            admin::ASYNC_EVENT_REQUEST | admin::KEEP_ALIVE => Ok(Parsed::none()),
            _ => Err(Reject::dnr(Status::INVALID_OPCODE, loc::OPCODE)),
        }
    }

    pub(super) fn exec_discovery(
        &mut self,
        ctrl: &Controller,
        cmd: &Cmd,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<Outcome, Reject> {
        let sqe = &cmd.sqe;
        match sqe.opcode {
            admin::IDENTIFY => {
                super::admin::need_len(buf, IDENTIFY_DATA_SIZE)?;
                if sqe.cdw10.get() as u8 != cns::CTRL {
                    return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10));
                }
                let id = self.identify_controller(ctrl);
                buf.copy_from_slice(id.as_bytes());
                Ok(Outcome::data(IDENTIFY_DATA_SIZE as u32))
            }
            admin::GET_LOG_PAGE => {
                let g = GetLogPageCmd::from_sqe(sqe);
                if g.lid != lid::DISCOVERY {
                    return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10));
                }
                let page = discovery_log(
                    self.target.inner(),
                    &ctrl.hostnqn,
                    self.local_addr.map(|a| a.ip().to_string()).as_deref(),
                );
                let out = copy_log(&page, &g, buf)?;
                if !g.rae {
                    ctrl.unmask_event(idc::OAES_DISC_CHANGE);
                }
                Ok(out)
            }
            admin::SET_FEATURES => {
                let cdw11 = sqe.cdw11.get();
                match sqe.cdw10.get() as u8 {
                    feat::KATO => self.set_kato(ctrl, cdw11, now),
                    feat::ASYNC_EVENT => self.set_async_event_config(ctrl, cdw11),
                    _ => Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10)),
                }
            }
            admin::GET_FEATURES => match sqe.cdw10.get() as u8 {
                feat::KATO => Ok(Outcome::result(ctrl.kato_ms() as u64)),
                feat::ASYNC_EVENT => Ok(Outcome::result(ctrl.lock().aen_enabled as u64)),
                _ => Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10)),
            },
            admin::ASYNC_EVENT_REQUEST => self.async_event_request(ctrl, sqe),
            admin::KEEP_ALIVE => self.keep_alive(ctrl, now),
            _ => Err(Reject::dnr(Status::INVALID_OPCODE, loc::OPCODE)),
        }
    }
}
