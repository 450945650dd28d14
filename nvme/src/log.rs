//! Log pages (NVMe Base 2.0, 5.16; NVMe-oF 1.1, 5.3 for the discovery log), the Get Log Page
//! command fields and Asynchronous Event completion dwords.

use core::mem::{offset_of, size_of};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::identify::wire_codec;
use crate::opcode::admin;
use crate::Sqe;

/// Log Page Identifiers (NVMe Base 2.0 Figure 202; NVMe-oF 1.1 Figure 36).
pub mod lid {
    pub const SUPPORTED: u8 = 0x00;
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FW_SLOT: u8 = 0x03;
    pub const CHANGED_NS: u8 = 0x04;
    pub const CMD_EFFECTS: u8 = 0x05;
    pub const DEVICE_SELF_TEST: u8 = 0x06;
    pub const ANA: u8 = 0x0c;
    pub const DISCOVERY: u8 = 0x70;
    /// Reservation Notification (NVMe Base 2.0, 5.16.1.25).
    pub const RESV_NOTIFICATION: u8 = 0x80;
}

/// Get Log Page command fields (NVMe Base 2.0 Figures 197-200).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetLogPageCmd {
    /// CDW10 bits 7:0: Log Page Identifier.
    pub lid: u8,
    /// CDW10 bits 14:8: Log Specific Parameter.
    pub lsp: u8,
    /// CDW10 bit 15: Retain Asynchronous Event.
    pub rae: bool,
    /// Number of dwords, 1's based (NUMDU:NUMDL + 1; CDW11 bits 15:0 and CDW10 bits 31:16).
    pub numd: u32,
    /// CDW11 bits 31:16: Log Specific Identifier.
    pub lsi: u16,
    /// CDW13:CDW12: Log Page Offset in bytes (dword aligned unless OT).
    pub lpo: u64,
    /// CDW14 bits 6:0: UUID Index.
    pub uuid_index: u8,
    /// CDW14 bit 23: Offset Type (0 bytes, 1 index).
    pub ot: bool,
    /// CDW14 bits 31:24: Command Set Identifier.
    pub csi: u8,
    /// Namespace identifier.
    pub nsid: u32,
}

impl GetLogPageCmd {
    pub fn from_sqe(sqe: &Sqe) -> GetLogPageCmd {
        let cdw10 = sqe.cdw10.get();
        let cdw11 = sqe.cdw11.get();
        let cdw14 = sqe.cdw14.get();
        let numd0 = (cdw10 >> 16) | (cdw11 & 0xffff) << 16;
        GetLogPageCmd {
            lid: cdw10 as u8,
            lsp: (cdw10 >> 8 & 0x7f) as u8,
            rae: cdw10 >> 15 & 1 == 1,
            // NUMD is 0's based and 32 bits wide, so the count fits a u64 but not always a
            // u32: 0xFFFF_FFFF + 1 saturates (16 GiB is far above any MDTS anyway).
            numd: numd0.saturating_add(1),
            lsi: (cdw11 >> 16) as u16,
            lpo: (sqe.cdw13.get() as u64) << 32 | sqe.cdw12.get() as u64,
            uuid_index: (cdw14 & 0x7f) as u8,
            ot: cdw14 >> 23 & 1 == 1,
            csi: (cdw14 >> 24) as u8,
            nsid: sqe.nsid.get(),
        }
    }

    /// Transfer length in bytes (NUMD × 4), saturating.
    pub fn len_bytes(&self) -> u64 {
        self.numd as u64 * 4
    }

    /// The SQE for reading `len` bytes (`len` is rounded up to whole dwords; 0 is sent as one
    /// dword).
    pub fn to_sqe(&self, cid: u16, dptr: [u8; 16]) -> Sqe {
        let numd0 = self.numd.max(1) - 1;
        let mut s = Sqe::new(admin::GET_LOG_PAGE, cid);
        s.nsid = self.nsid.into();
        s.dptr = dptr;
        s.cdw10 = (self.lid as u32
            | ((self.lsp & 0x7f) as u32) << 8
            | (self.rae as u32) << 15
            | (numd0 & 0xffff) << 16)
            .into();
        s.cdw11 = (numd0 >> 16 | (self.lsi as u32) << 16).into();
        s.cdw12 = (self.lpo as u32).into();
        s.cdw13 = ((self.lpo >> 32) as u32).into();
        s.cdw14 =
            ((self.uuid_index & 0x7f) as u32 | (self.ot as u32) << 23 | (self.csi as u32) << 24)
                .into();
        s
    }

    /// A plain request for `len` bytes of `lid` at `offset`.
    pub fn new(lid: u8, nsid: u32, len: u32, offset: u64, rae: bool) -> GetLogPageCmd {
        GetLogPageCmd {
            lid,
            lsp: 0,
            rae,
            numd: len.div_ceil(4).max(1),
            lsi: 0,
            lpo: offset,
            uuid_index: 0,
            ot: false,
            csi: 0,
            nsid,
        }
    }
}

/// Error Information log entry, 64 bytes (NVMe Base 2.0 Figure 205).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ErrorLogEntry {
    /// Bytes 7:0: Error Count, a unique increasing number (0 = invalid entry).
    pub error_count: U64,
    /// Bytes 9:8: Submission Queue ID.
    pub sqid: U16,
    /// Bytes 11:10: Command ID.
    pub cmdid: U16,
    /// Bytes 13:12: Status Field (bits 15:1) and phase tag (bit 0) of the completion.
    pub status_field: U16,
    /// Bytes 15:14: Parameter Error Location: byte (7:0) and bit (10:8) in the command;
    /// FFFFh if not specific to a parameter.
    pub param_error_location: U16,
    /// Bytes 23:16: first LBA that had the error.
    pub lba: U64,
    /// Bytes 27:24: Namespace.
    pub nsid: U32,
    /// Byte 28: Vendor Specific Information Available.
    pub vs: u8,
    /// Byte 29: Transport Type.
    pub trtype: u8,
    _rsvd30: [u8; 2],
    /// Bytes 39:32: Command Specific Information.
    pub cs: U64,
    /// Bytes 41:40: Transport Type Specific Information.
    pub trtype_spec_info: U16,
    _rsvd42: [u8; 21],
    /// Byte 63: Log Page Version.
    pub log_page_version: u8,
}

const _: () = assert!(size_of::<ErrorLogEntry>() == 64);
const _: () = assert!(offset_of!(ErrorLogEntry, param_error_location) == 14);
const _: () = assert!(offset_of!(ErrorLogEntry, lba) == 16);
const _: () = assert!(offset_of!(ErrorLogEntry, nsid) == 24);
const _: () = assert!(offset_of!(ErrorLogEntry, cs) == 32);
const _: () = assert!(offset_of!(ErrorLogEntry, log_page_version) == 63);
wire_codec!(ErrorLogEntry, 64);

/// SMART / Health Information log, 512 bytes (NVMe Base 2.0 Figure 207). The 16-byte counters
/// are little-endian 128-bit integers.
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SmartLog {
    /// Byte 0: Critical Warning.
    pub critical_warning: u8,
    /// Bytes 2:1: Composite Temperature, kelvin.
    pub temperature: U16,
    /// Byte 3: Available Spare, percent.
    pub avail_spare: u8,
    /// Byte 4: Available Spare Threshold, percent.
    pub spare_thresh: u8,
    /// Byte 5: Percentage Used.
    pub percent_used: u8,
    /// Byte 6: Endurance Group Critical Warning Summary.
    pub endu_grp_crit_warn_sumry: u8,
    _rsvd7: [u8; 25],
    /// Bytes 47:32: Data Units Read, thousands of 512-byte units, rounded up.
    pub data_units_read: [u8; 16],
    /// Bytes 63:48: Data Units Written, thousands of 512-byte units, rounded up.
    pub data_units_written: [u8; 16],
    /// Bytes 79:64: Host Read Commands.
    pub host_reads: [u8; 16],
    /// Bytes 95:80: Host Write Commands.
    pub host_writes: [u8; 16],
    /// Bytes 111:96: Controller Busy Time, minutes.
    pub ctrl_busy_time: [u8; 16],
    /// Bytes 127:112: Power Cycles.
    pub power_cycles: [u8; 16],
    /// Bytes 143:128: Power On Hours.
    pub power_on_hours: [u8; 16],
    /// Bytes 159:144: Unsafe Shutdowns.
    pub unsafe_shutdowns: [u8; 16],
    /// Bytes 175:160: Media and Data Integrity Errors.
    pub media_errors: [u8; 16],
    /// Bytes 191:176: Number of Error Information Log Entries over the controller's life.
    pub num_err_log_entries: [u8; 16],
    /// Bytes 195:192: Warning Composite Temperature Time, minutes.
    pub warning_temp_time: U32,
    /// Bytes 199:196: Critical Composite Temperature Time, minutes.
    pub critical_comp_time: U32,
    /// Bytes 215:200: Temperature Sensors 1-8, kelvin.
    pub temp_sensor: [U16; 8],
    /// Bytes 219:216: Thermal Management Temperature 1 Transition Count.
    pub thm_temp1_trans_count: U32,
    /// Bytes 223:220: Thermal Management Temperature 2 Transition Count.
    pub thm_temp2_trans_count: U32,
    /// Bytes 227:224: Total Time For Thermal Management Temperature 1, seconds.
    pub thm_temp1_total_time: U32,
    /// Bytes 231:228: Total Time For Thermal Management Temperature 2, seconds.
    pub thm_temp2_total_time: U32,
    _rsvd232: [u8; 280],
}

const _: () = assert!(size_of::<SmartLog>() == 512);
const _: () = assert!(offset_of!(SmartLog, data_units_read) == 32);
const _: () = assert!(offset_of!(SmartLog, host_reads) == 64);
const _: () = assert!(offset_of!(SmartLog, num_err_log_entries) == 176);
const _: () = assert!(offset_of!(SmartLog, warning_temp_time) == 192);
const _: () = assert!(offset_of!(SmartLog, temp_sensor) == 200);
wire_codec!(SmartLog, 512);

/// A 128-bit little-endian counter field.
pub fn u128_field(v: u128) -> [u8; 16] {
    v.to_le_bytes()
}

/// Commands Supported and Effects log, 4096 bytes (NVMe Base 2.0 Figure 210).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct CmdEffectsLog {
    /// Bytes 1023:0: Admin Command Supported, one dword per opcode.
    pub acs: [U32; 256],
    /// Bytes 2047:1024: I/O Command Supported, one dword per opcode.
    pub iocs: [U32; 256],
    _rsvd2048: [u8; 2048],
}

const _: () = assert!(size_of::<CmdEffectsLog>() == 4096);
const _: () = assert!(offset_of!(CmdEffectsLog, iocs) == 1024);
wire_codec!(CmdEffectsLog, 4096);

/// Commands Supported and Effects data structure bits (NVMe Base 2.0 Figure 211).
pub mod effects {
    /// Command Supported.
    pub const CSUPP: u32 = 1 << 0;
    /// Logical Block Content Change.
    pub const LBCC: u32 = 1 << 1;
    /// Namespace Capability Change.
    pub const NCC: u32 = 1 << 2;
    /// Namespace Inventory Change.
    pub const NIC: u32 = 1 << 3;
    /// Controller Capability Change.
    pub const CCC: u32 = 1 << 4;
}

/// Changed Namespace List log, 4096 bytes (NVMe Base 2.0 Figure 209): up to 1024 NSIDs;
/// entry 0 = FFFFFFFFh means more than 1024 changed.
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ChangedNsList {
    /// Namespace identifiers, zero-terminated.
    pub nsids: [U32; 1024],
}

const _: () = assert!(size_of::<ChangedNsList>() == 4096);
wire_codec!(ChangedNsList, 4096);

/// Maximum entries in the Changed Namespace List.
pub const MAX_CHANGED_NS: usize = 1024;

/// Discovery Log Page header, 1024 bytes (NVMe-oF 1.1 Figure 37).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DiscoveryLogHeader {
    /// Bytes 7:0: Generation Counter; changes whenever the log content changes.
    pub genctr: U64,
    /// Bytes 15:8: Number of Records.
    pub numrec: U64,
    /// Bytes 17:16: Record Format, 0.
    pub recfmt: U16,
    _rsvd18: [u8; 1006],
}

const _: () = assert!(size_of::<DiscoveryLogHeader>() == 1024);
const _: () = assert!(offset_of!(DiscoveryLogHeader, numrec) == 8);
const _: () = assert!(offset_of!(DiscoveryLogHeader, recfmt) == 16);
wire_codec!(DiscoveryLogHeader, 1024);

/// Discovery Log Page Entry, 1024 bytes (NVMe-oF 1.1 Figure 38).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DiscoveryLogEntry {
    /// Byte 0: Transport Type ([`trtype`]).
    pub trtype: u8,
    /// Byte 1: Address Family ([`adrfam`]).
    pub adrfam: u8,
    /// Byte 2: Subsystem Type ([`subtype`]).
    pub subtype: u8,
    /// Byte 3: Transport Requirements ([`treq`]).
    pub treq: u8,
    /// Bytes 5:4: Port ID.
    pub portid: U16,
    /// Bytes 7:6: Controller ID (FFFFh: dynamic controller model).
    pub cntlid: U16,
    /// Bytes 9:8: Admin Max SQ Size.
    pub asqsz: U16,
    /// Bytes 11:10: Entry Flags ([`eflags`]).
    pub eflags: U16,
    _rsvd12: [u8; 20],
    /// Bytes 63:32: Transport Service Identifier (ASCII, e.g. the TCP port), space padded.
    pub trsvcid: [u8; 32],
    _rsvd64: [u8; 192],
    /// Bytes 511:256: Subsystem NQN, NUL terminated.
    pub subnqn: [u8; 256],
    /// Bytes 767:512: Transport Address (ASCII), space padded.
    pub traddr: [u8; 256],
    /// Bytes 1023:768: Transport Specific Address Subtype ([`tsas`]).
    pub tsas: [u8; 256],
}

const _: () = assert!(size_of::<DiscoveryLogEntry>() == 1024);
const _: () = assert!(offset_of!(DiscoveryLogEntry, portid) == 4);
const _: () = assert!(offset_of!(DiscoveryLogEntry, cntlid) == 6);
const _: () = assert!(offset_of!(DiscoveryLogEntry, asqsz) == 8);
const _: () = assert!(offset_of!(DiscoveryLogEntry, eflags) == 10);
const _: () = assert!(offset_of!(DiscoveryLogEntry, trsvcid) == 32);
const _: () = assert!(offset_of!(DiscoveryLogEntry, subnqn) == 256);
const _: () = assert!(offset_of!(DiscoveryLogEntry, traddr) == 512);
const _: () = assert!(offset_of!(DiscoveryLogEntry, tsas) == 768);
wire_codec!(DiscoveryLogEntry, 1024);

impl core::fmt::Debug for DiscoveryLogEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use crate::fabrics::until_nul;
        let text = |b: &[u8]| String::from_utf8_lossy(until_nul(b)).trim_end().to_string();
        f.debug_struct("DiscoveryLogEntry")
            .field("trtype", &self.trtype)
            .field("adrfam", &self.adrfam)
            .field("subtype", &self.subtype)
            .field("treq", &self.treq)
            .field("portid", &self.portid.get())
            .field("cntlid", &format_args!("{:#x}", self.cntlid.get()))
            .field("asqsz", &self.asqsz.get())
            .field("trsvcid", &text(&self.trsvcid))
            .field("subnqn", &text(&self.subnqn))
            .field("traddr", &text(&self.traddr))
            .finish_non_exhaustive()
    }
}

/// Transport types (NVMe-oF 1.1 Figure 38, TRTYPE).
pub mod trtype {
    pub const RDMA: u8 = 1;
    pub const FC: u8 = 2;
    pub const TCP: u8 = 3;
    pub const LOOP: u8 = 254;
}

/// Address families (ADRFAM).
pub mod adrfam {
    pub const IPV4: u8 = 1;
    pub const IPV6: u8 = 2;
    pub const IB: u8 = 3;
    pub const FC: u8 = 4;
    pub const LOOP: u8 = 254;
}

/// Subsystem types (SUBTYPE).
pub mod subtype {
    /// A referral to another discovery service.
    pub const DISCOVERY_REFERRAL: u8 = 1;
    /// An NVM subsystem.
    pub const NVME: u8 = 2;
    /// The current discovery subsystem.
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// Transport requirements (TREQ).
pub mod treq {
    /// Bits 1:0 = 00b: secure channel requirement not specified.
    pub const NOT_SPECIFIED: u8 = 0;
    /// Bits 1:0 = 01b: secure channel required.
    pub const REQUIRED: u8 = 1;
    /// Bits 1:0 = 10b: secure channel not required.
    pub const NOT_REQUIRED: u8 = 2;
    /// Bit 2: SQ flow control may be disabled.
    pub const DISABLE_SQFLOW: u8 = 1 << 2;
}

/// Entry flags (EFLAGS).
pub mod eflags {
    /// Duplicate Returned Information.
    pub const DUPRETINFO: u16 = 1 << 0;
    /// Explicit Persistent Connection Support for Discovery.
    pub const EPCSD: u16 = 1 << 1;
    /// No CDC Connectivity.
    pub const NCC: u16 = 1 << 2;
}

/// Transport Specific Address Subtype encodings.
pub mod tsas {
    /// RDMA QP service type: reliable connected (byte 0).
    pub const RDMA_QPTYPE_CONNECTED: u8 = 1;
    /// RDMA provider type: none specified (byte 1).
    pub const RDMA_PRTYPE_NOT_SPECIFIED: u8 = 1;
    /// RDMA connection management service: RDMA_CM (byte 2).
    pub const RDMA_CMS_RDMA_CM: u8 = 1;
    /// NVMe/TCP security type: none (byte 0).
    pub const TCP_SECTYPE_NONE: u8 = 0;

    /// TSAS for NVMe/RDMA over rdma_cm with a reliable connected QP (what nvmet reports).
    pub fn rdma_cm() -> [u8; 256] {
        let mut t = [0u8; 256];
        t[0] = RDMA_QPTYPE_CONNECTED;
        t[1] = RDMA_PRTYPE_NOT_SPECIFIED;
        t[2] = RDMA_CMS_RDMA_CM;
        t
    }
    /// NVMe/TCP security type: TLS 1.3 (byte 0; Linux `NVMF_TCP_SECTYPE_TLS13`).
    pub const TCP_SECTYPE_TLS13: u8 = 2;

    /// TSAS for NVMe/TCP without TLS.
    pub fn tcp_no_tls() -> [u8; 256] {
        let mut t = [0u8; 256];
        t[0] = TCP_SECTYPE_NONE;
        t
    }

    /// TSAS for NVMe/TCP with TLS 1.3.
    pub fn tcp_tls13() -> [u8; 256] {
        let mut t = [0u8; 256];
        t[0] = TCP_SECTYPE_TLS13;
        t
    }
}

/// Asynchronous event types (NVMe Base 2.0 Figure 147).
pub mod aer_type {
    pub const ERROR: u8 = 0;
    pub const SMART: u8 = 1;
    pub const NOTICE: u8 = 2;
    pub const IMMEDIATE: u8 = 3;
    pub const IO_CMD_SET: u8 = 6;
    pub const VENDOR: u8 = 7;
}

/// Notice event information (NVMe Base 2.0 Figure 150).
pub mod aer_notice {
    pub const NS_CHANGED: u8 = 0x00;
    pub const FW_ACTIVATION: u8 = 0x01;
    pub const TELEMETRY: u8 = 0x02;
    pub const ANA_CHANGE: u8 = 0x03;
    pub const DISCOVERY_CHANGE: u8 = 0xf0;
}

/// An Asynchronous Event Request completion's result dword 0 (NVMe Base 2.0 Figure 146).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// Bits 2:0: Asynchronous Event Type.
    pub kind: u8,
    /// Bits 15:8: Asynchronous Event Information.
    pub info: u8,
    /// Bits 23:16: Log Page Identifier to read to clear the event.
    pub lid: u8,
}

impl AsyncEvent {
    /// Namespace Attribute Changed: read the Changed Namespace List.
    pub const NS_CHANGED: AsyncEvent = AsyncEvent {
        kind: aer_type::NOTICE,
        info: aer_notice::NS_CHANGED,
        lid: lid::CHANGED_NS,
    };
    /// Discovery Log Page Change: read the discovery log.
    pub const DISCOVERY_CHANGED: AsyncEvent = AsyncEvent {
        kind: aer_type::NOTICE,
        info: aer_notice::DISCOVERY_CHANGE,
        lid: lid::DISCOVERY,
    };

    /// Asymmetric Namespace Access Change: read the ANA log.
    pub const ANA_CHANGE: AsyncEvent = AsyncEvent {
        kind: aer_type::NOTICE,
        info: aer_notice::ANA_CHANGE,
        lid: lid::ANA,
    };

    /// Reservation Log Page Available: read the Reservation Notification log.
    pub const RESV_LOG_AVAILABLE: AsyncEvent = AsyncEvent {
        kind: aer_type::IO_CMD_SET,
        info: 0,
        lid: lid::RESV_NOTIFICATION,
    };

    pub fn encode(self) -> u32 {
        (self.kind & 7) as u32 | (self.info as u32) << 8 | (self.lid as u32) << 16
    }
    pub fn decode(dw0: u32) -> AsyncEvent {
        AsyncEvent {
            kind: (dw0 & 7) as u8,
            info: (dw0 >> 8) as u8,
            lid: (dw0 >> 16) as u8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identify::nqn_field;
    use zerocopy::FromZeros;

    #[test]
    fn get_log_page_fields_from_libnvme_discovery_request() {
        // libnvme nvme_discovery_log: header read with RAE, 1024 bytes at offset 0:
        // cdw10 = lid 0x70 | rae << 15 | (numd0 = 255) << 16.
        let mut s = Sqe::new(admin::GET_LOG_PAGE, 1);
        s.cdw10 = (0x70 | 1 << 15 | 255 << 16).into();
        let g = GetLogPageCmd::from_sqe(&s);
        assert_eq!((g.lid, g.rae, g.numd, g.lpo), (0x70, true, 256, 0));
        assert_eq!(g.len_bytes(), 1024);
        // Entries at offset 1024, 2 entries = 2048 bytes.
        let e = GetLogPageCmd::new(lid::DISCOVERY, 0, 2048, 1024, false);
        let s = e.to_sqe(2, [0; 16]);
        assert_eq!(s.cdw10.get(), 0x70 | 511 << 16);
        assert_eq!(s.cdw12.get(), 1024);
        assert_eq!(GetLogPageCmd::from_sqe(&s), e);
    }

    #[test]
    fn get_log_page_numdu_and_csi() {
        let mut s = Sqe::new(admin::GET_LOG_PAGE, 1);
        s.cdw10 = (0x05 | 0x7f << 8 | 0xffff << 16).into();
        s.cdw11 = (0x0001 | 0xabcd << 16).into();
        s.cdw12 = 8.into();
        s.cdw13 = 1.into();
        s.cdw14 = (0x05 | 1 << 23 | 2 << 24).into();
        let g = GetLogPageCmd::from_sqe(&s);
        assert_eq!(g.lsp, 0x7f);
        assert!(!g.rae);
        assert_eq!(g.numd, 0x1_ffff + 1);
        assert_eq!(g.lsi, 0xabcd);
        assert_eq!(g.lpo, 1 << 32 | 8);
        assert_eq!((g.uuid_index, g.ot, g.csi), (5, true, 2));
        assert_eq!(GetLogPageCmd::from_sqe(&g.to_sqe(1, [0; 16])), g);
        // NUMD all ones saturates instead of wrapping to 0.
        s.cdw11 = 0xffff.into();
        assert_eq!(GetLogPageCmd::from_sqe(&s).numd, u32::MAX);
    }

    #[test]
    fn discovery_entry_layout_matches_linux() {
        // struct nvmf_disc_rsp_page_entry (1024 bytes, BUILD_BUG_ON in nvmet).
        let mut e = DiscoveryLogEntry::new_zeroed();
        e.trtype = trtype::TCP;
        e.adrfam = adrfam::IPV4;
        e.subtype = subtype::NVME;
        e.treq = treq::NOT_SPECIFIED;
        e.portid = 1.into();
        e.cntlid = 0xffff.into();
        e.asqsz = 32.into();
        e.trsvcid = crate::identify::ascii_field("4420");
        e.subnqn = nqn_field("nqn.2024-01.io.example:disk");
        e.traddr = crate::identify::ascii_field("10.0.0.1");
        e.tsas = tsas::tcp_no_tls();
        let b = e.encode();
        assert_eq!(&b[0..12], &[3, 1, 2, 0, 1, 0, 0xff, 0xff, 32, 0, 0, 0]);
        assert_eq!(&b[32..37], b"4420 ");
        assert_eq!(&b[256..260], b"nqn.");
        assert_eq!(&b[512..521], b"10.0.0.1 ");
        let d = DiscoveryLogEntry::decode(&b).unwrap();
        assert_eq!(d.asqsz.get(), 32);
        let mut h = DiscoveryLogHeader::new_zeroed();
        h.genctr = 7.into();
        h.numrec = 2.into();
        let hb = h.encode();
        assert_eq!(
            &hb[0..16],
            &[7, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(tsas::rdma_cm()[..3], [1, 1, 1]);
    }

    #[test]
    fn error_entry_and_smart_layout() {
        let e = ErrorLogEntry {
            error_count: 3.into(),
            sqid: 1.into(),
            cmdid: 0x22.into(),
            status_field: ((0x4080u16) << 1).into(),
            param_error_location: 40.into(),
            lba: 0x1000.into(),
            nsid: 1.into(),
            ..Default::default()
        };
        let b = e.encode();
        assert_eq!(
            &b[0..16],
            &[3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0x22, 0, 0x00, 0x81, 40, 0]
        );
        assert_eq!(&b[16..28], &[0, 0x10, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
        let mut s = SmartLog::new_zeroed();
        s.data_units_read = u128_field(5);
        s.num_err_log_entries = u128_field(3);
        let b = s.encode();
        assert_eq!(b[32], 5);
        assert_eq!(b[176], 3);
    }

    #[test]
    fn async_event_dword() {
        // nvmet_async_event_result: type | info << 8 | log_page << 16.
        assert_eq!(AsyncEvent::NS_CHANGED.encode(), 0x0004_0002);
        assert_eq!(AsyncEvent::DISCOVERY_CHANGED.encode(), 0x0070_f002);
        assert_eq!(AsyncEvent::decode(0x0004_0002), AsyncEvent::NS_CHANGED);
    }
}

/// ANA states as the ANA log and Identify report them (NVMe Base 2.0, Figure 215).
pub mod ana_state {
    pub const OPTIMIZED: u8 = 0x01;
    pub const NON_OPTIMIZED: u8 = 0x02;
    pub const INACCESSIBLE: u8 = 0x03;
    pub const PERSISTENT_LOSS: u8 = 0x04;
    pub const CHANGE: u8 = 0x0f;
}

/// Get Log Page LSP bit 0 for the ANA log: Return Groups Only (no NSID lists).
pub const ANA_LSP_RGO: u8 = 1 << 0;

/// One ANA Group Descriptor of the ANA log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnaGroup {
    pub grpid: u32,
    /// The group's change count (bumped when its state on this controller's path changes).
    pub change_count: u64,
    /// `ana_state::*`.
    pub state: u8,
    /// The group's namespaces, ascending (left out of the log with RGO).
    pub nsids: Vec<u32>,
}

/// The Asymmetric Namespace Access log page (0Ch; NVMe Base 2.0, Figures 213-214): a 16-byte
/// header (change count, number of descriptors) and per group a 32-byte descriptor followed by
/// its NSIDs (none with Return Groups Only).
pub fn ana_log(change_count: u64, groups: &[AnaGroup], rgo: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + groups.len() * 32);
    out.extend_from_slice(&change_count.to_le_bytes());
    out.extend_from_slice(&(groups.len() as u16).to_le_bytes());
    out.extend_from_slice(&[0; 6]);
    for g in groups {
        let nsids: &[u32] = if rgo { &[] } else { &g.nsids };
        out.extend_from_slice(&g.grpid.to_le_bytes());
        out.extend_from_slice(&(nsids.len() as u32).to_le_bytes());
        out.extend_from_slice(&g.change_count.to_le_bytes());
        out.push(g.state & 0x0f);
        out.extend_from_slice(&[0; 15]);
        for n in nsids {
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod ana_tests {
    use super::*;

    #[test]
    fn ana_log_layout() {
        let g = |grpid, state, nsids: &[u32]| AnaGroup {
            grpid,
            change_count: 7,
            state,
            nsids: nsids.to_vec(),
        };
        let groups = [
            g(1, ana_state::OPTIMIZED, &[1, 3]),
            g(2, ana_state::INACCESSIBLE, &[2]),
        ];
        let b = ana_log(9, &groups, false);
        assert_eq!(b.len(), 16 + 32 + 8 + 32 + 4);
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 9);
        assert_eq!(u16::from_le_bytes([b[8], b[9]]), 2);
        assert_eq!(u32::from_le_bytes(b[16..20].try_into().unwrap()), 1);
        assert_eq!(
            u32::from_le_bytes(b[20..24].try_into().unwrap()),
            2,
            "NNSID"
        );
        assert_eq!(b[32], ana_state::OPTIMIZED);
        assert_eq!(u32::from_le_bytes(b[52..56].try_into().unwrap()), 3);
        assert_eq!(
            u32::from_le_bytes(b[56..60].try_into().unwrap()),
            2,
            "group 2"
        );
        assert_eq!(b[56 + 16], ana_state::INACCESSIBLE);
        let rgo = ana_log(9, &groups, true);
        assert_eq!(rgo.len(), 16 + 2 * 32);
        assert_eq!(
            u32::from_le_bytes(rgo[20..24].try_into().unwrap()),
            0,
            "no NSIDs with RGO"
        );
    }
}
