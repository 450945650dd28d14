//! Admin commands of an I/O controller: Identify, Get Log Page, Set/Get Features, Asynchronous
//! Event Request, Keep Alive, Abort. Behaviour follows nvmet `admin-cmd.c` unless a comment says
//! otherwise.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use nvme::identify::{
    ascii_field, cns, csi, ctrl as idc, encode_ns_list, feat, nqn_field, IdentifyCmd,
    IdentifyController, IdentifyCtrlNvm, IdentifyNamespace, IdentifyNsCsIndep, IdentifyNsNvm,
    NsIdDesc, IDENTIFY_DATA_SIZE, NMIC_SHARED, NSTAT_READY,
};
use nvme::log::{
    ana_log, effects, lid, u128_field, AnaGroup, CmdEffectsLog, GetLogPageCmd, SmartLog,
    ANA_LSP_RGO,
};
use nvme::opcode::{admin, io};
use nvme::{Sqe, Status};
use zerocopy::{FromZeros, IntoBytes};

use super::controller::{Controller, ERROR_LOG_SLOTS, KAS_100MS, MAX_AERS, MAX_IO_QUEUES};
use super::fabrics_cmd::NVME_VERSION;
use super::queue::{loc, Outcome, Parsed, Reject};
use super::{Cmd, NamespaceSpec, Queue, TrType};

/// NSID meaning "all namespaces".
pub(crate) const NSID_ALL: u32 = 0xffff_ffff;
/// ANA Transition Time (Identify ANATT), seconds: how long a host waits for a group in
/// change state before it gives up on the path (nvmet: 10).
const ANATT_SECS: u8 = 10;
/// ANACAP: optimized, non-optimized, inaccessible, persistent loss and change are all
/// reported (bits 0-4, as nvmet).
const ANACAP_ALL_STATES: u8 = 0x1f;

/// Firmware revision reported in Identify (8 ASCII characters).
pub(crate) fn firmware_revision() -> [u8; 8] {
    ascii_field(env!("CARGO_PKG_VERSION"))
}

/// Copy `page[lpo..]` into `buf` (the whole transfer), zero-filling past the end of the page.
/// An offset beyond the page is Invalid Field (NVMe Base 2.0, 5.16: "LPO ... greater than the
/// size of the log page").
pub(crate) fn copy_log(page: &[u8], g: &GetLogPageCmd, buf: &mut [u8]) -> Result<Outcome, Reject> {
    if g.ot || g.lpo % 4 != 0 {
        return Err(Reject::dnr(
            Status::INVALID_FIELD,
            if g.ot { loc::CDW14 } else { 48 },
        ));
    }
    let off = usize::try_from(g.lpo).ok().filter(|&o| o <= page.len());
    let Some(off) = off else {
        return Err(Reject::dnr(Status::INVALID_FIELD, 48));
    };
    let src = &page[off..];
    let n = src.len().min(buf.len());
    buf[..n].copy_from_slice(&src[..n]);
    buf[n..].fill(0);
    Ok(Outcome::data(buf.len() as u32))
}

/// The transfer must be exactly `n` bytes (it is, for commands `parse` accepted; this guards
/// against a `Cmd` built elsewhere).
pub(crate) fn need_len(buf: &[u8], n: usize) -> Result<(), Reject> {
    if buf.len() == n {
        Ok(())
    } else {
        Err(Reject::dnr(Status::SGL_INVALID_DATA, loc::DPTR))
    }
}

impl Queue {
    pub(super) fn parse_admin(&mut self, sqe: &Sqe) -> Result<Parsed, Reject> {
        match sqe.opcode {
            admin::GET_LOG_PAGE => self.parse_get_log_page(sqe),
            admin::IDENTIFY => Ok(Parsed::to_host(IDENTIFY_DATA_SIZE as u32, loc::CDW10)),
            admin::ABORT | admin::ASYNC_EVENT_REQUEST | admin::KEEP_ALIVE => Ok(Parsed::none()),
            admin::SET_FEATURES => self.parse_features(sqe, true, false),
            admin::GET_FEATURES => self.parse_features(sqe, false, false),
            _ => Err(Reject::dnr(Status::INVALID_OPCODE, loc::OPCODE)),
        }
    }

    pub(super) fn parse_get_log_page(&mut self, sqe: &Sqe) -> Result<Parsed, Reject> {
        let g = GetLogPageCmd::from_sqe(sqe);
        // Above any MDTS when it does not fit 32 bits; check_sgl reports it.
        let len = u32::try_from(g.len_bytes()).unwrap_or(u32::MAX);
        Ok(Parsed::to_host(len, loc::CDW10))
    }

    /// Set/Get Features: which FIDs exist here and how much data they move.
    pub(super) fn parse_features(
        &mut self,
        sqe: &Sqe,
        set: bool,
        discovery: bool,
    ) -> Result<Parsed, Reject> {
        let cdw10 = sqe.cdw10.get();
        let fid = cdw10 as u8;
        if set && cdw10 & feat::SAVE != 0 {
            return Err(Reject::dnr(Status::FEATURE_NOT_SAVEABLE, loc::CDW10));
        }
        let supported = if discovery {
            matches!(fid, feat::KATO | feat::ASYNC_EVENT)
        } else {
            matches!(
                fid,
                feat::NUM_QUEUES
                    | feat::ASYNC_EVENT
                    | feat::KATO
                    | feat::TIMESTAMP
                    | feat::HOST_ID
                    | feat::RESV_PERSIST
                    | feat::RESV_MASK
            ) || (!set && fid == feat::VOLATILE_WC)
        };
        if !supported {
            return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10));
        }
        if fid == feat::HOST_ID {
            // On fabrics the Host Identifier comes with Connect and cannot be set (nvmet);
            // reading it needs the 128-bit flag (EXHID, CDW11 bit 0).
            if set {
                return Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::CDW10));
            }
            if sqe.cdw11.get() & 1 == 0 {
                return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW11));
            }
            return Ok(Parsed::to_host(16, loc::CDW10));
        }
        Ok(match (fid, set) {
            (feat::TIMESTAMP, true) => Parsed::from_host(feat::TIMESTAMP_DATA_SIZE, loc::CDW10),
            (feat::TIMESTAMP, false) => Parsed::to_host(feat::TIMESTAMP_DATA_SIZE, loc::CDW10),
            _ => Parsed::none(),
        })
    }

    pub(super) fn exec_admin(
        &mut self,
        ctrl: &Controller,
        cmd: &Cmd,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<Outcome, Reject> {
        let sqe = &cmd.sqe;
        match sqe.opcode {
            admin::IDENTIFY => self.identify(ctrl, sqe, buf),
            admin::GET_LOG_PAGE => self.get_log_page(ctrl, sqe, buf),
            admin::SET_FEATURES => self.set_features(ctrl, cmd, buf, now),
            admin::GET_FEATURES => self.get_features(ctrl, sqe, buf, now),
            admin::ASYNC_EVENT_REQUEST => self.async_event_request(ctrl, sqe),
            admin::KEEP_ALIVE => self.keep_alive(ctrl, now),
            // A "minimum viable" Abort (nvmet): nothing is ever aborted, result bit 0 = 1.
            admin::ABORT => Ok(Outcome::result(1)),
            _ => Err(Reject::dnr(Status::INVALID_OPCODE, loc::OPCODE)),
        }
    }

    // ---- Identify ------------------------------------------------------------------------

    /// Identify Controller for this queue's controller (I/O or discovery).
    pub(crate) fn identify_controller(&mut self, ctrl: &Controller) -> IdentifyController {
        let caps = &ctrl.caps;
        let mut id = IdentifyController::new_zeroed();
        id.sn = ascii_field(&ctrl.subsys.serial);
        id.mn = ascii_field(&ctrl.subsys.model);
        id.fr = firmware_revision();
        id.rab = 6;
        id.mdts = self.mdts;
        id.cntlid = ctrl.cntlid.into();
        id.ver = NVME_VERSION.into();
        id.ctratt = (idc::CTRATT_HID_128 | idc::CTRATT_TBKAS).into();
        id.kas = KAS_100MS.into();
        id.aerl = (MAX_AERS - 1) as u8;
        id.lpa = idc::LPA_EXTENDED;
        id.elpe = (ERROR_LOG_SLOTS - 1) as u8;
        id.maxcmd = caps.max_queue_depth.into();
        id.sgls = idc::SGLS_SUPPORTED.into();
        if caps.trtype == TrType::Rdma {
            id.sgls = (id.sgls.get() | idc::SGLS_KEYED).into();
        }
        if caps.in_capsule_data > 0 || caps.trtype == TrType::Tcp {
            // TCP admin queues always take in-capsule data (8 KiB).
            id.sgls = (id.sgls.get() | idc::SGLS_OFFSET).into();
        }
        id.subnqn = nqn_field(&ctrl.subsys.nqn);
        id.iorcsz = 1.into();
        id.icdoff = 0.into();
        id.msdbd = 1;
        id.ofcs = idc::OFCS_DISCONNECT.into();
        if ctrl.is_discovery() {
            id.cntrltype = idc::CNTRLTYPE_DISCOVERY;
            id.oaes = idc::OAES_DISC_CHANGE.into();
            return id;
        }
        id.cntrltype = idc::CNTRLTYPE_IO;
        // Asymmetric Namespace Access: every state reportable, a state per listener and ANA
        // group, at most ANA_GROUPS groups (as nvmet).
        id.cmic = idc::CMIC_MULTI_PORT | idc::CMIC_MULTI_CTRL | idc::CMIC_ANA;
        id.oaes = (idc::OAES_NS_ATTR | idc::OAES_ANA_CHANGE).into();
        id.anatt = ANATT_SECS;
        id.anacap = ANACAP_ALL_STATES;
        id.anagrpmax = super::ANA_GROUPS.into();
        id.nanagrpid = super::ANA_GROUPS.into();
        id.acl = 3;
        // One read-only firmware slot.
        id.frmw = 0x03;
        id.lpa |= idc::LPA_CMD_EFFECTS;
        id.sqes = 0x66;
        id.cqes = 0x44;
        let nn = self.namespaces().map(|t| t.max_nsid()).unwrap_or(0);
        id.nn = nn.into();
        id.mnan = nn.into();
        id.oncs = (idc::ONCS_COMPARE
            | idc::ONCS_DSM
            | idc::ONCS_WRITE_ZEROES
            | idc::ONCS_TIMESTAMP
            | idc::ONCS_RESERVATIONS)
            .into();
        // Fused Compare and Write, atomic against every other write, up to one slot buffer
        // per command (a larger fused command is refused). ACWU holds for every namespace
        // format, so it counts blocks of the largest one (4 KiB); 0's based.
        id.fuses = idc::FUSES_COMPARE_AND_WRITE.into();
        id.acwu = u16::try_from((self.max_xfer.min(caps.max_io_size) / 4096).max(1) - 1)
            .unwrap_or(u16::MAX)
            .into();
        // A volatile write cache when a namespace's store has one (a file, a block device
        // whose queue writes back); not for null, RBD or write-through devices alone, whose
        // completed writes are durable (the host then sends neither Flush nor FUA). Flush is
        // honoured per namespace; a broadcast Flush (NSID FFFFFFFFh) is not.
        let cached = self
            .namespaces()
            .is_some_and(|t| t.by_nsid.values().any(|n| n.volatile_cache));
        id.vwc = idc::VWC_FLUSH_BROADCAST_UNSUPPORTED | if cached { idc::VWC_PRESENT } else { 0 };
        // Atomic write units (0's based, in blocks): one block, in normal operation and on
        // power failure; no namespace says otherwise (NSFEAT bit 1 clear). A write of more
        // blocks may be seen or left partly written.
        id.awun = 0.into();
        id.awupf = 0.into();
        id.ioccsz = ((64 + caps.in_capsule_data) / 16).into();
        // No power management; the same placeholder state nvmet (and QEMU) report.
        id.psd[0].mp = 0x9c4.into();
        id.psd[0].enlat = 0x10.into();
        id.psd[0].exlat = 0x4.into();
        id
    }

    fn identify(
        &mut self,
        ctrl: &Controller,
        sqe: &Sqe,
        buf: &mut [u8],
    ) -> Result<Outcome, Reject> {
        need_len(buf, IDENTIFY_DATA_SIZE)?;
        let c = IdentifyCmd::from_sqe(sqe);
        let table = self.namespaces().unwrap_or_default();
        let bad_ns = || Reject::dnr(Status::INVALID_NS, loc::NSID);
        // CNS 00h tolerates an inactive NSID (zeroes); the others need an active one.
        let active = || table.get(c.nsid).ok_or_else(bad_ns);
        match c.cns {
            cns::CTRL => {
                let id = self.identify_controller(ctrl);
                buf.copy_from_slice(id.as_bytes());
            }
            cns::NS => {
                if c.nsid == 0 || c.nsid == NSID_ALL {
                    return Err(bad_ns());
                }
                let mut id = IdentifyNamespace::new_zeroed();
                if let Some(ns) = table.get(c.nsid) {
                    id.nsze = ns.blocks.into();
                    id.ncap = ns.blocks.into();
                    id.nuse = ns.blocks.into();
                    id.nlbaf = 0;
                    id.flbas = 0;
                    id.nmic = NMIC_SHARED;
                    id.nguid = ns.nguid;
                    id.lbaf[0].ds = ns.lba_shift;
                    id.nsattr = nsattr(ns);
                    id.dlfeat = dlfeat(ns);
                    id.rescap = rescap(&table, c.nsid);
                    id.anagrpid = ns.ana_group.into();
                }
                buf.copy_from_slice(id.as_bytes());
            }
            cns::NS_ACTIVE_LIST => {
                // NSIDs FFFFFFFEh and FFFFFFFFh are invalid here (NVMe Base 2.0, CNS 02h).
                if c.nsid >= 0xffff_fffe {
                    return Err(bad_ns());
                }
                let list = encode_ns_list(
                    table
                        .by_nsid
                        .range(c.nsid.saturating_add(1)..)
                        .map(|(k, _)| *k),
                );
                buf.copy_from_slice(&list);
            }
            cns::NS_DESC_LIST => {
                let ns = active()?;
                let mut descs = Vec::with_capacity(3);
                if ns.uuid != [0; 16] {
                    descs.push(NsIdDesc::Uuid(ns.uuid));
                }
                if ns.nguid != [0; 16] {
                    descs.push(NsIdDesc::Nguid(ns.nguid));
                }
                descs.push(NsIdDesc::Csi(csi::NVM));
                buf.copy_from_slice(&NsIdDesc::encode_list(&descs));
            }
            cns::CS_NS => {
                active()?;
                if c.csi != csi::NVM {
                    return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW11));
                }
                // No protection information or storage tags: all zero.
                buf.copy_from_slice(IdentifyNsNvm::new_zeroed().as_bytes());
            }
            cns::CS_CTRL => {
                if c.csi != csi::NVM {
                    return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW11));
                }
                // No Verify/Write Zeroes/DSM size limits beyond the command fields themselves.
                buf.copy_from_slice(IdentifyCtrlNvm::new_zeroed().as_bytes());
            }
            cns::NS_CS_INDEP => {
                let ns = active()?;
                let mut id = IdentifyNsCsIndep::new_zeroed();
                id.nsattr = nsattr(ns);
                id.nmic = NMIC_SHARED;
                id.nstat = NSTAT_READY;
                id.rescap = rescap(&table, c.nsid);
                id.anagrpid = ns.ana_group.into();
                buf.copy_from_slice(id.as_bytes());
            }
            _ => return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10)),
        }
        Ok(Outcome::data(IDENTIFY_DATA_SIZE as u32))
    }

    // ---- Get Log Page --------------------------------------------------------------------

    fn get_log_page(
        &mut self,
        ctrl: &Controller,
        sqe: &Sqe,
        buf: &mut [u8],
    ) -> Result<Outcome, Reject> {
        let g = GetLogPageCmd::from_sqe(sqe);
        match g.lid {
            lid::ERROR => {
                let (entries, _) = ctrl.error_log();
                let mut page = vec![0u8; ERROR_LOG_SLOTS * 64];
                for (slot, e) in page.chunks_exact_mut(64).zip(entries) {
                    slot.copy_from_slice(e.as_bytes());
                }
                copy_log(&page, &g, buf)
            }
            lid::SMART => {
                // Controller-wide only (LPA bit 0 clear): NSID 0 or FFFFFFFFh.
                if g.nsid != 0 && g.nsid != NSID_ALL {
                    return Err(Reject::dnr(Status::INVALID_FIELD, loc::NSID));
                }
                let t = ctrl.io_totals();
                let (_, err_count) = ctrl.error_log();
                // Data units are thousands of 512-byte units, rounded up.
                let units = |bytes: u64| (bytes / 512).div_ceil(1000) as u128;
                let mut s = SmartLog::new_zeroed();
                s.data_units_read = u128_field(units(t.bytes_read));
                s.data_units_written = u128_field(units(t.bytes_written));
                s.host_reads = u128_field(t.read_cmds as u128);
                s.host_writes = u128_field(t.write_cmds as u128);
                s.num_err_log_entries = u128_field(err_count as u128);
                copy_log(s.as_bytes(), &g, buf)
            }
            lid::FW_SLOT => {
                // One slot, active and read-only: AFI = 1, FRS1 = our firmware revision.
                let mut page = [0u8; 512];
                page[0] = 1;
                page[8..16].copy_from_slice(&firmware_revision());
                copy_log(&page, &g, buf)
            }
            lid::RESV_NOTIFICATION => {
                let e = ctrl.take_resv_notice(g.rae);
                copy_log(&e.encode(), &g, buf)
            }
            lid::CHANGED_NS => {
                let mut page = [0u8; 4096];
                match ctrl.take_changed_ns(g.rae) {
                    Some(list) => {
                        for (slot, nsid) in page.chunks_exact_mut(4).zip(list) {
                            slot.copy_from_slice(&nsid.to_le_bytes());
                        }
                    }
                    None => page[..4].copy_from_slice(&NSID_ALL.to_le_bytes()),
                }
                copy_log(&page, &g, buf)
            }
            lid::ANA => {
                // This controller's path: the listener the admin queue came through. Group 1
                // always (as nvmet), and every group a namespace of the subsystem is in.
                let table = self.namespaces().unwrap_or_default();
                let mut groups: BTreeMap<u32, Vec<u32>> = BTreeMap::from([(1, Vec::new())]);
                for (nsid, ns) in &table.by_nsid {
                    groups.entry(ns.ana_group).or_default().push(*nsid);
                }
                let change = self.target.inner().ana_change_count.load(Ordering::Acquire);
                let groups: Vec<AnaGroup> = groups
                    .into_iter()
                    .map(|(grpid, nsids)| AnaGroup {
                        grpid,
                        change_count: change,
                        state: self.ana_state(grpid),
                        nsids,
                    })
                    .collect();
                let rgo = g.lsp & ANA_LSP_RGO != 0;
                if !g.rae {
                    ctrl.unmask_event(idc::OAES_ANA_CHANGE);
                }
                copy_log(&ana_log(change, &groups, rgo), &g, buf)
            }
            lid::CMD_EFFECTS => {
                if g.csi != csi::NVM {
                    return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW14));
                }
                let mut log = CmdEffectsLog::new_zeroed();
                for op in [
                    admin::GET_LOG_PAGE,
                    admin::IDENTIFY,
                    admin::ABORT,
                    admin::SET_FEATURES,
                    admin::GET_FEATURES,
                    admin::ASYNC_EVENT_REQUEST,
                    admin::KEEP_ALIVE,
                ] {
                    log.acs[op as usize] = effects::CSUPP.into();
                }
                log.iocs[io::READ as usize] = effects::CSUPP.into();
                log.iocs[io::FLUSH as usize] = effects::CSUPP.into();
                // Deallocation changes what reads return, like a write.
                for op in [io::WRITE, io::WRITE_ZEROES, io::DSM] {
                    log.iocs[op as usize] = (effects::CSUPP | effects::LBCC).into();
                }
                copy_log(log.as_bytes(), &g, buf)
            }
            // Unknown or unsupported LID. The spec has a command specific "Invalid Log Page"
            // status, but nvmet and SPDK both answer Invalid Field in Command; we do the same
            // so hosts see what they see from those targets.
            _ => Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10)),
        }
    }

    // ---- Features ------------------------------------------------------------------------

    fn set_features(
        &mut self,
        ctrl: &Controller,
        cmd: &Cmd,
        buf: &[u8],
        now: Instant,
    ) -> Result<Outcome, Reject> {
        let sqe = &cmd.sqe;
        let fid = sqe.cdw10.get() as u8;
        let cdw11 = sqe.cdw11.get();
        match fid {
            feat::NUM_QUEUES => {
                let nsqr = cdw11 as u16;
                let ncqr = (cdw11 >> 16) as u16;
                if nsqr == 0xffff || ncqr == 0xffff {
                    return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW11));
                }
                // "This feature shall only be issued during initialization prior to creation
                // of any I/O Submission and/or Completion Queues."
                if ctrl.has_io_queues() {
                    return Err(Reject::dnr(Status::CMD_SEQ_ERROR, loc::CDW10));
                }
                let nsqa = (nsqr + 1).min(MAX_IO_QUEUES);
                let ncqa = (ncqr + 1).min(MAX_IO_QUEUES);
                let mut g = ctrl.lock();
                // Fabrics queues are SQ/CQ pairs: the usable count is the smaller one.
                g.io_queues = nsqa.min(ncqa);
                g.io_queues_set = true;
                Ok(Outcome::result(
                    ((ncqa - 1) as u64) << 16 | (nsqa - 1) as u64,
                ))
            }
            feat::ASYNC_EVENT => self.set_async_event_config(ctrl, cdw11),
            feat::KATO => self.set_kato(ctrl, cdw11, now),
            feat::RESV_MASK => {
                let nsid = sqe.nsid.get();
                if cdw11 & !nvme::resv::mask::ALL != 0 {
                    return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW11));
                }
                let table = self
                    .namespaces()
                    .ok_or_else(|| Reject::dnr(Status::INVALID_NS, loc::NSID))?;
                if nsid != NSID_ALL && table.get(nsid).is_none() {
                    return Err(Reject::dnr(Status::INVALID_NS, loc::NSID));
                }
                ctrl.set_resv_mask(nsid, cdw11);
                Ok(Outcome::ok())
            }
            feat::RESV_PERSIST => {
                let on = cdw11 & 1 != 0;
                let at = (sqe.nsid.get(), loc::CDW11);
                self.reservation_cmd(cmd, at, false, now, |s, _, capable| s.set_ptpl(on, capable))
            }
            feat::TIMESTAMP => {
                need_len(buf, feat::TIMESTAMP_DATA_SIZE as usize)?;
                let mut ts = [0u8; 8];
                ts[..6].copy_from_slice(&buf[..6]);
                ctrl.lock().timestamp = Some((u64::from_le_bytes(ts), now));
                Ok(Outcome::ok())
            }
            _ => Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10)),
        }
    }

    pub(super) fn set_async_event_config(
        &mut self,
        ctrl: &Controller,
        cdw11: u32,
    ) -> Result<Outcome, Reject> {
        if cdw11 & !ctrl.supported_aens() != 0 {
            return Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW11));
        }
        ctrl.lock().aen_enabled = cdw11;
        Ok(Outcome::result(cdw11 as u64))
    }

    /// Set Features Keep Alive Timer: same policy as Connect's KATO (0 disables the timer).
    pub(super) fn set_kato(
        &mut self,
        ctrl: &Controller,
        ms: u32,
        now: Instant,
    ) -> Result<Outcome, Reject> {
        let gran = KAS_100MS as u32 * 100;
        let ms = if ms == 0 {
            0
        } else {
            ms.max(self.target.inner().params.keep_alive_ms_min)
        };
        let ms = ms.div_ceil(gran).saturating_mul(gran);
        ctrl.set_kato_ms(ms, now);
        Ok(Outcome::ok())
    }

    fn get_features(
        &mut self,
        ctrl: &Controller,
        sqe: &Sqe,
        buf: &mut [u8],
        now: Instant,
    ) -> Result<Outcome, Reject> {
        // SEL (CDW10 bits 10:8) is not supported (ONCS bit 4 clear): current values only.
        match sqe.cdw10.get() as u8 {
            feat::NUM_QUEUES => {
                let n = ctrl.lock().io_queues as u64 - 1;
                Ok(Outcome::result(n << 16 | n))
            }
            feat::ASYNC_EVENT => Ok(Outcome::result(ctrl.lock().aen_enabled as u64)),
            feat::KATO => Ok(Outcome::result(ctrl.kato_ms() as u64)),
            feat::RESV_MASK => Ok(Outcome::result(u64::from(ctrl.resv_mask(sqe.nsid.get())))),
            // Reservation Persistence: CDW0 bit 0, PTPL of the namespace named by NSID.
            feat::RESV_PERSIST => {
                let bad_ns = || Reject::dnr(Status::INVALID_NS, loc::NSID);
                let table = self.namespaces().ok_or_else(bad_ns)?;
                let r = table.reservation(sqe.nsid.get()).ok_or_else(bad_ns)?;
                Ok(Outcome::result(u64::from(r.report().ptpl)))
            }
            // The backend may cache writes; Flush makes them durable.
            feat::VOLATILE_WC => Ok(Outcome::result(1)),
            feat::HOST_ID => {
                need_len(buf, 16)?;
                buf.copy_from_slice(&ctrl.hostid);
                Ok(Outcome::data(16))
            }
            feat::TIMESTAMP => {
                need_len(buf, feat::TIMESTAMP_DATA_SIZE as usize)?;
                let ts = ctrl.lock().timestamp;
                // Bytes 5:0 ms since the epoch; byte 6: Synch 0, Timestamp Origin 001b when set
                // by the host, 000b (time since reset) otherwise.
                let (ms, attr) = match ts {
                    Some((v, at)) => (
                        v + now.saturating_duration_since(at).as_millis() as u64,
                        0x02,
                    ),
                    None => (
                        now.saturating_duration_since(ctrl.base).as_millis() as u64,
                        0x00,
                    ),
                };
                let mut out = (ms & 0xffff_ffff_ffff).to_le_bytes();
                out[6] = attr;
                out[7] = 0;
                buf.copy_from_slice(&out);
                Ok(Outcome::data(8))
            }
            _ => Err(Reject::dnr(Status::INVALID_FIELD, loc::CDW10)),
        }
    }

    // ---- AER, Keep Alive ---------------------------------------------------------------------

    pub(super) fn async_event_request(
        &mut self,
        ctrl: &Controller,
        sqe: &Sqe,
    ) -> Result<Outcome, Reject> {
        match ctrl.submit_aer(sqe.cid()) {
            Ok(Some(result)) => Ok(Outcome::result(result as u64)),
            Ok(None) => Ok(Outcome::Deferred),
            Err(()) => Err(Reject::dnr(Status::ASYNC_LIMIT, loc::OPCODE)),
        }
    }

    pub(super) fn keep_alive(
        &mut self,
        ctrl: &Controller,
        now: Instant,
    ) -> Result<Outcome, Reject> {
        if ctrl.kato_ms() == 0 {
            // nvmet: Keep Alive with the timer disabled.
            return Err(Reject::new(Status::KEEP_ALIVE_INVALID, loc::OPCODE));
        }
        ctrl.touch(now, true);
        Ok(Outcome::ok())
    }
}

/// Namespace Attributes (Identify Namespace byte 99, CNS 08h byte 8): bit 0, Write Protected.
/// DLFEAT (Identify Namespace byte 33) bits 2:0: 001b "deallocated blocks read as all
/// zeroes", 000b "not reported". Bit 3 (Write Zeroes with Deallocate) stays clear: Write
/// Zeroes never deallocates here.
fn dlfeat(ns: &NamespaceSpec) -> u8 {
    u8::from(ns.deallocate_zeroes && !ns.read_only)
}

/// Reservation capabilities: all six types, IEKEY as NVMe 1.3 defines it, and Persist Through
/// Power Loss where the namespace's state can be stored.
fn rescap(table: &super::subsystem::NsTable, nsid: u32) -> u8 {
    use nvme::resv::rescap;
    let ptpl = table.reservation(nsid).is_some_and(|r| r.ptpl_capable());
    rescap::ALL_TYPES | rescap::IEKEY13 | if ptpl { rescap::PTPL } else { 0 }
}

fn nsattr(ns: &NamespaceSpec) -> u8 {
    u8::from(ns.read_only)
}
