//! Identify data structures (NVMe Base 2.0, 5.17; NVM Command Set 1.0, 4.1.5) and the
//! Identify command fields.
//!
//! All structures are 4096 bytes. Build them with `new_zeroed()` and field assignment; send
//! them with `as_bytes()` / `encode()`; parse them with `decode()`.

use core::mem::{offset_of, size_of};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::opcode::admin;
use crate::{DecodeError, Sqe};

/// `decode`/`encode` for a fixed-size wire struct.
macro_rules! wire_codec {
    ($t:ty, $size:expr) => {
        impl $t {
            /// Size on the wire in bytes.
            pub const SIZE: usize = $size;
            /// Decode the first `SIZE` bytes of `buf`.
            pub fn decode(buf: &[u8]) -> Result<$t, $crate::DecodeError> {
                <$t as zerocopy::FromBytes>::read_from_prefix(buf)
                    .map(|(v, _)| v)
                    .map_err(|_| $crate::DecodeError::Short {
                        need: Self::SIZE,
                        have: buf.len(),
                    })
            }
            /// The wire bytes.
            pub fn encode(&self) -> [u8; $size] {
                let mut out = [0u8; $size];
                out.copy_from_slice(zerocopy::IntoBytes::as_bytes(self));
                out
            }
        }
    };
}
pub(crate) use wire_codec;

/// A space-padded ASCII field (serial, model, firmware revision: NVMe Base 2.0, 5.17.2.1).
/// Non-ASCII characters become `?`; longer strings are cut.
pub fn ascii_field<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [b' '; N];
    for (o, c) in out.iter_mut().zip(s.chars()) {
        *o = if c.is_ascii() && !c.is_ascii_control() {
            c as u8
        } else {
            b'?'
        };
    }
    out
}

/// A NUL-padded NQN field of 256 bytes; at most 255 bytes are kept so a NUL always ends it.
pub fn nqn_field(s: &str) -> [u8; 256] {
    let mut out = [0u8; 256];
    let n = s.len().min(255);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

/// Controller or Namespace Structure values (CDW10 bits 7:0; NVMe Base 2.0 Figure 274).
pub mod cns {
    /// Identify Namespace (NVM command set).
    pub const NS: u8 = 0x00;
    /// Identify Controller.
    pub const CTRL: u8 = 0x01;
    /// Active Namespace ID list.
    pub const NS_ACTIVE_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_DESC_LIST: u8 = 0x03;
    /// NVM Set list.
    pub const NVMSET_LIST: u8 = 0x04;
    /// I/O Command Set specific Identify Namespace.
    pub const CS_NS: u8 = 0x05;
    /// I/O Command Set specific Identify Controller.
    pub const CS_CTRL: u8 = 0x06;
    /// Active Namespace ID list for a command set.
    pub const NS_ACTIVE_LIST_CS: u8 = 0x07;
    /// I/O Command Set Independent Identify Namespace.
    pub const NS_CS_INDEP: u8 = 0x08;
}

/// Command Set Identifiers (NVMe Base 2.0 Figure 286).
pub mod csi {
    pub const NVM: u8 = 0x00;
    pub const KV: u8 = 0x01;
    pub const ZNS: u8 = 0x02;
}

/// Identify command fields (NVMe Base 2.0 Figures 272-273).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentifyCmd {
    /// CDW10 bits 7:0.
    pub cns: u8,
    /// CDW10 bits 31:16: Controller Identifier.
    pub cntid: u16,
    /// CDW11 bits 15:0: CNS Specific Identifier.
    pub cnssid: u16,
    /// CDW11 bits 31:24: Command Set Identifier.
    pub csi: u8,
    /// Namespace identifier.
    pub nsid: u32,
}

impl IdentifyCmd {
    pub fn from_sqe(sqe: &Sqe) -> IdentifyCmd {
        let cdw10 = sqe.cdw10.get();
        let cdw11 = sqe.cdw11.get();
        IdentifyCmd {
            cns: cdw10 as u8,
            cntid: (cdw10 >> 16) as u16,
            cnssid: cdw11 as u16,
            csi: (cdw11 >> 24) as u8,
            nsid: sqe.nsid.get(),
        }
    }
    /// The SQE (data: 4096 bytes controller to host, described by `dptr`).
    pub fn to_sqe(&self, cid: u16, dptr: [u8; 16]) -> Sqe {
        let mut s = Sqe::new(admin::IDENTIFY, cid);
        s.nsid = self.nsid.into();
        s.dptr = dptr;
        s.cdw10 = (self.cns as u32 | (self.cntid as u32) << 16).into();
        s.cdw11 = (self.cnssid as u32 | (self.csi as u32) << 24).into();
        s
    }
}

/// Identify data size.
pub const IDENTIFY_DATA_SIZE: usize = 4096;

/// Power State Descriptor (NVMe Base 2.0 Figure 276).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct PowerStateDesc {
    /// Bytes 1:0: Maximum Power (centiwatts unless flags bit 0 says 0.0001 W).
    pub mp: U16,
    _rsvd2: u8,
    /// Byte 3: bit 0 Max Power Scale, bit 1 Non-Operational State.
    pub flags: u8,
    /// Bytes 7:4: Entry Latency, microseconds.
    pub enlat: U32,
    /// Bytes 11:8: Exit Latency, microseconds.
    pub exlat: U32,
    /// Byte 12: Relative Read Throughput.
    pub rrt: u8,
    /// Byte 13: Relative Read Latency.
    pub rrl: u8,
    /// Byte 14: Relative Write Throughput.
    pub rwt: u8,
    /// Byte 15: Relative Write Latency.
    pub rwl: u8,
    /// Bytes 17:16: Idle Power.
    pub idlp: U16,
    /// Byte 18: Idle Power Scale.
    pub ips: u8,
    _rsvd19: u8,
    /// Bytes 21:20: Active Power.
    pub actp: U16,
    /// Byte 22: Active Power Workload and Scale.
    pub apws: u8,
    _rsvd23: [u8; 9],
}

const _: () = assert!(size_of::<PowerStateDesc>() == 32);
const _: () = assert!(offset_of!(PowerStateDesc, enlat) == 4);
const _: () = assert!(offset_of!(PowerStateDesc, idlp) == 16);

/// Identify Controller data structure, CNS 01h (NVMe Base 2.0 Figure 275; NVMe-oF 1.1 Figure 31
/// for bytes 1792-2047).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IdentifyController {
    /// Bytes 1:0: PCI Vendor ID.
    pub vid: U16,
    /// Bytes 3:2: PCI Subsystem Vendor ID.
    pub ssvid: U16,
    /// Bytes 23:4: Serial Number (ASCII, space padded).
    pub sn: [u8; 20],
    /// Bytes 63:24: Model Number (ASCII, space padded).
    pub mn: [u8; 40],
    /// Bytes 71:64: Firmware Revision (ASCII, space padded).
    pub fr: [u8; 8],
    /// Byte 72: Recommended Arbitration Burst.
    pub rab: u8,
    /// Bytes 75:73: IEEE OUI Identifier.
    pub ieee: [u8; 3],
    /// Byte 76: Controller Multi-Path I/O and Namespace Sharing Capabilities.
    pub cmic: u8,
    /// Byte 77: Maximum Data Transfer Size, a power of two in units of CAP.MPSMIN (0 = none).
    pub mdts: u8,
    /// Bytes 79:78: Controller ID.
    pub cntlid: U16,
    /// Bytes 83:80: Version (same encoding as the VS property).
    pub ver: U32,
    /// Bytes 87:84: RTD3 Resume Latency, microseconds.
    pub rtd3r: U32,
    /// Bytes 91:88: RTD3 Entry Latency, microseconds.
    pub rtd3e: U32,
    /// Bytes 95:92: Optional Asynchronous Events Supported.
    pub oaes: U32,
    /// Bytes 99:96: Controller Attributes.
    pub ctratt: U32,
    /// Bytes 101:100: Read Recovery Levels Supported.
    pub rrls: U16,
    _rsvd102: [u8; 9],
    /// Byte 111: Controller Type (1 I/O, 2 discovery, 3 administrative).
    pub cntrltype: u8,
    /// Bytes 127:112: FRU Globally Unique Identifier.
    pub fguid: [u8; 16],
    /// Bytes 129:128: Command Retry Delay Time 1, 100 ms units.
    pub crdt1: U16,
    /// Bytes 131:130: Command Retry Delay Time 2.
    pub crdt2: U16,
    /// Bytes 133:132: Command Retry Delay Time 3.
    pub crdt3: U16,
    _rsvd134: [u8; 119],
    /// Byte 253: NVM Subsystem Report (NVMe-MI).
    pub nvmsr: u8,
    /// Byte 254: VPD Write Cycle Information (NVMe-MI).
    pub vwci: u8,
    /// Byte 255: Management Endpoint Capabilities (NVMe-MI).
    pub mec: u8,
    /// Bytes 257:256: Optional Admin Command Support.
    pub oacs: U16,
    /// Byte 258: Abort Command Limit, 0's based.
    pub acl: u8,
    /// Byte 259: Asynchronous Event Request Limit, 0's based.
    pub aerl: u8,
    /// Byte 260: Firmware Updates.
    pub frmw: u8,
    /// Byte 261: Log Page Attributes.
    pub lpa: u8,
    /// Byte 262: Error Log Page Entries, 0's based.
    pub elpe: u8,
    /// Byte 263: Number of Power States Support, 0's based.
    pub npss: u8,
    /// Byte 264: Admin Vendor Specific Command Configuration.
    pub avscc: u8,
    /// Byte 265: Autonomous Power State Transition Attributes.
    pub apsta: u8,
    /// Bytes 267:266: Warning Composite Temperature Threshold, kelvin.
    pub wctemp: U16,
    /// Bytes 269:268: Critical Composite Temperature Threshold, kelvin.
    pub cctemp: U16,
    /// Bytes 271:270: Maximum Time for Firmware Activation, 100 ms units.
    pub mtfa: U16,
    /// Bytes 275:272: Host Memory Buffer Preferred Size.
    pub hmpre: U32,
    /// Bytes 279:276: Host Memory Buffer Minimum Size.
    pub hmmin: U32,
    /// Bytes 295:280: Total NVM Capacity, bytes.
    pub tnvmcap: [u8; 16],
    /// Bytes 311:296: Unallocated NVM Capacity, bytes.
    pub unvmcap: [u8; 16],
    /// Bytes 315:312: Replay Protected Memory Block Support.
    pub rpmbs: U32,
    /// Bytes 317:316: Extended Device Self-test Time.
    pub edstt: U16,
    /// Byte 318: Device Self-test Options.
    pub dsto: u8,
    /// Byte 319: Firmware Update Granularity.
    pub fwug: u8,
    /// Bytes 321:320: Keep Alive Support: timer granularity in 100 ms units (0 = unsupported).
    pub kas: U16,
    /// Bytes 323:322: Host Controlled Thermal Management Attributes.
    pub hctma: U16,
    /// Bytes 325:324: Minimum Thermal Management Temperature.
    pub mntmt: U16,
    /// Bytes 327:326: Maximum Thermal Management Temperature.
    pub mxtmt: U16,
    /// Bytes 331:328: Sanitize Capabilities.
    pub sanicap: U32,
    /// Bytes 335:332: Host Memory Buffer Minimum Descriptor Entry Size.
    pub hmminds: U32,
    /// Bytes 337:336: Host Memory Maximum Descriptors Entries.
    pub hmmaxd: U16,
    /// Bytes 339:338: NVM Set Identifier Maximum.
    pub nsetidmax: U16,
    /// Bytes 341:340: Endurance Group Identifier Maximum.
    pub endgidmax: U16,
    /// Byte 342: ANA Transition Time, seconds.
    pub anatt: u8,
    /// Byte 343: Asymmetric Namespace Access Capabilities.
    pub anacap: u8,
    /// Bytes 347:344: ANA Group Identifier Maximum.
    pub anagrpmax: U32,
    /// Bytes 351:348: Number of ANA Group Identifiers.
    pub nanagrpid: U32,
    /// Bytes 355:352: Persistent Event Log Size, 64 KiB units.
    pub pels: U32,
    /// Bytes 357:356: Domain Identifier.
    pub domainid: U16,
    _rsvd358: [u8; 10],
    /// Bytes 383:368: Max Endurance Group Capacity.
    pub megcap: [u8; 16],
    _rsvd384: [u8; 128],
    /// Byte 512: Submission Queue Entry Size: bits 7:4 max, 3:0 required (log2).
    pub sqes: u8,
    /// Byte 513: Completion Queue Entry Size: bits 7:4 max, 3:0 required (log2).
    pub cqes: u8,
    /// Bytes 515:514: Maximum Outstanding Commands per queue.
    pub maxcmd: U16,
    /// Bytes 519:516: Number of Namespaces (highest valid NSID).
    pub nn: U32,
    /// Bytes 521:520: Optional NVM Command Support.
    pub oncs: U16,
    /// Bytes 523:522: Fused Operation Support.
    pub fuses: U16,
    /// Byte 524: Format NVM Attributes.
    pub fna: u8,
    /// Byte 525: Volatile Write Cache: bit 0 present, bits 2:1 flush broadcast support.
    pub vwc: u8,
    /// Bytes 527:526: Atomic Write Unit Normal, 0's based blocks.
    pub awun: U16,
    /// Bytes 529:528: Atomic Write Unit Power Fail, 0's based blocks.
    pub awupf: U16,
    /// Byte 530: I/O Command Set Vendor Specific Command Configuration.
    pub icsvscc: u8,
    /// Byte 531: Namespace Write Protection Capabilities.
    pub nwpc: u8,
    /// Bytes 533:532: Atomic Compare & Write Unit.
    pub acwu: U16,
    /// Bytes 535:534: Copy Descriptor Formats Supported.
    pub ocfs: U16,
    /// Bytes 539:536: SGL Support.
    pub sgls: U32,
    /// Bytes 543:540: Maximum Number of Allowed Namespaces.
    pub mnan: U32,
    /// Bytes 559:544: Maximum Domain Namespace Attachments.
    pub maxdna: [u8; 16],
    /// Bytes 563:560: Maximum I/O Controller Namespace Attachments.
    pub maxcna: U32,
    _rsvd564: [u8; 204],
    /// Bytes 1023:768: NVM Subsystem NVMe Qualified Name (NUL terminated).
    pub subnqn: [u8; 256],
    _rsvd1024: [u8; 768],
    /// Bytes 1795:1792: I/O Queue Command Capsule Supported Size, 16-byte units (NVMe-oF).
    pub ioccsz: U32,
    /// Bytes 1799:1796: I/O Queue Response Capsule Supported Size, 16-byte units (NVMe-oF).
    pub iorcsz: U32,
    /// Bytes 1801:1800: In Capsule Data Offset, 16-byte units (NVMe-oF).
    pub icdoff: U16,
    /// Byte 1802: Fabrics Controller Attributes: bit 0 static controller model (NVMe-oF).
    pub fcatt: u8,
    /// Byte 1803: Maximum SGL Data Block Descriptors (NVMe-oF).
    pub msdbd: u8,
    /// Bytes 1805:1804: Optional Fabric Commands Support: bit 0 Disconnect (NVMe-oF).
    pub ofcs: U16,
    /// Byte 1806: Discovery Controller Type.
    pub dctype: u8,
    _rsvd1807: [u8; 241],
    /// Bytes 3071:2048: Power State Descriptors 0-31.
    pub psd: [PowerStateDesc; 32],
    /// Bytes 4095:3072: Vendor Specific.
    pub vs: [u8; 1024],
}

const _: () = assert!(size_of::<IdentifyController>() == 4096);
const _: () = assert!(offset_of!(IdentifyController, sn) == 4);
const _: () = assert!(offset_of!(IdentifyController, mn) == 24);
const _: () = assert!(offset_of!(IdentifyController, fr) == 64);
const _: () = assert!(offset_of!(IdentifyController, cmic) == 76);
const _: () = assert!(offset_of!(IdentifyController, mdts) == 77);
const _: () = assert!(offset_of!(IdentifyController, cntlid) == 78);
const _: () = assert!(offset_of!(IdentifyController, ver) == 80);
const _: () = assert!(offset_of!(IdentifyController, oaes) == 92);
const _: () = assert!(offset_of!(IdentifyController, ctratt) == 96);
const _: () = assert!(offset_of!(IdentifyController, cntrltype) == 111);
const _: () = assert!(offset_of!(IdentifyController, fguid) == 112);
const _: () = assert!(offset_of!(IdentifyController, crdt1) == 128);
const _: () = assert!(offset_of!(IdentifyController, oacs) == 256);
const _: () = assert!(offset_of!(IdentifyController, lpa) == 261);
const _: () = assert!(offset_of!(IdentifyController, kas) == 320);
const _: () = assert!(offset_of!(IdentifyController, anacap) == 343);
const _: () = assert!(offset_of!(IdentifyController, sqes) == 512);
const _: () = assert!(offset_of!(IdentifyController, maxcmd) == 514);
const _: () = assert!(offset_of!(IdentifyController, nn) == 516);
const _: () = assert!(offset_of!(IdentifyController, oncs) == 520);
const _: () = assert!(offset_of!(IdentifyController, vwc) == 525);
const _: () = assert!(offset_of!(IdentifyController, sgls) == 536);
const _: () = assert!(offset_of!(IdentifyController, mnan) == 540);
const _: () = assert!(offset_of!(IdentifyController, subnqn) == 768);
const _: () = assert!(offset_of!(IdentifyController, ioccsz) == 1792);
const _: () = assert!(offset_of!(IdentifyController, iorcsz) == 1796);
const _: () = assert!(offset_of!(IdentifyController, icdoff) == 1800);
const _: () = assert!(offset_of!(IdentifyController, fcatt) == 1802);
const _: () = assert!(offset_of!(IdentifyController, msdbd) == 1803);
const _: () = assert!(offset_of!(IdentifyController, ofcs) == 1804);
const _: () = assert!(offset_of!(IdentifyController, dctype) == 1806);
const _: () = assert!(offset_of!(IdentifyController, psd) == 2048);
const _: () = assert!(offset_of!(IdentifyController, vs) == 3072);
wire_codec!(IdentifyController, 4096);

impl core::fmt::Debug for IdentifyController {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IdentifyController")
            .field("sn", &String::from_utf8_lossy(&self.sn))
            .field("mn", &String::from_utf8_lossy(&self.mn))
            .field("cntlid", &self.cntlid.get())
            .field("ver", &format_args!("{:#x}", self.ver.get()))
            .field("cntrltype", &self.cntrltype)
            .field("mdts", &self.mdts)
            .field("kas", &self.kas.get())
            .field("nn", &self.nn.get())
            .field("sgls", &format_args!("{:#x}", self.sgls.get()))
            .field("ioccsz", &self.ioccsz.get())
            .field(
                "subnqn",
                &String::from_utf8_lossy(crate::fabrics::until_nul(&self.subnqn)),
            )
            .finish_non_exhaustive()
    }
}

/// Identify Controller bit values.
pub mod ctrl {
    /// CMIC bit 0: may have two or more ports.
    pub const CMIC_MULTI_PORT: u8 = 1 << 0;
    /// CMIC bit 1: the subsystem may have two or more controllers.
    pub const CMIC_MULTI_CTRL: u8 = 1 << 1;
    /// CMIC bit 3: Asymmetric Namespace Access reporting.
    pub const CMIC_ANA: u8 = 1 << 3;

    /// OAES bit 8: Namespace Attribute Notices.
    pub const OAES_NS_ATTR: u32 = 1 << 8;
    /// OAES bit 9: Firmware Activation Notices.
    pub const OAES_FW_ACT: u32 = 1 << 9;
    /// OAES bit 11: ANA Change Notices.
    pub const OAES_ANA_CHANGE: u32 = 1 << 11;
    /// OAES bit 31: Discovery Log Page Change Notices.
    pub const OAES_DISC_CHANGE: u32 = 1 << 31;

    /// CTRATT bit 0: 128-bit Host Identifier.
    pub const CTRATT_HID_128: u32 = 1 << 0;
    /// CTRATT bit 6: Traffic Based Keep Alive support.
    pub const CTRATT_TBKAS: u32 = 1 << 6;

    /// CNTRLTYPE values.
    pub const CNTRLTYPE_IO: u8 = 1;
    pub const CNTRLTYPE_DISCOVERY: u8 = 2;
    pub const CNTRLTYPE_ADMIN: u8 = 3;

    /// LPA bit 0: SMART / Health log per namespace.
    pub const LPA_SMART_PER_NS: u8 = 1 << 0;
    /// LPA bit 1: Commands Supported and Effects log page.
    pub const LPA_CMD_EFFECTS: u8 = 1 << 1;
    /// LPA bit 2: extended data for Get Log Page (NUMDU, LPO).
    pub const LPA_EXTENDED: u8 = 1 << 2;

    /// ONCS bits.
    pub const ONCS_COMPARE: u16 = 1 << 0;
    pub const ONCS_WRITE_UNCORRECTABLE: u16 = 1 << 1;
    pub const ONCS_DSM: u16 = 1 << 2;
    pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
    pub const ONCS_SAVE_SELECT: u16 = 1 << 4;
    pub const ONCS_RESERVATIONS: u16 = 1 << 5;
    pub const ONCS_TIMESTAMP: u16 = 1 << 6;
    pub const ONCS_VERIFY: u16 = 1 << 7;

    /// FUSES bit 0: the Compare and Write fused operation is supported.
    pub const FUSES_COMPARE_AND_WRITE: u16 = 1 << 0;

    /// VWC bit 0: a volatile write cache is present.
    pub const VWC_PRESENT: u8 = 1 << 0;
    /// VWC bits 2:1 = 10b: Flush with NSID FFFFFFFFh is not supported.
    pub const VWC_FLUSH_BROADCAST_UNSUPPORTED: u8 = 2 << 1;
    /// VWC bits 2:1 = 11b: Flush with NSID FFFFFFFFh is supported.
    pub const VWC_FLUSH_BROADCAST_SUPPORTED: u8 = 3 << 1;

    /// SGLS bits 1:0 = 01b: SGLs supported, no alignment requirement.
    pub const SGLS_SUPPORTED: u32 = 1 << 0;
    /// SGLS bit 2: Keyed SGL Data Block descriptor supported.
    pub const SGLS_KEYED: u32 = 1 << 2;
    /// SGLS bit 20: the Address field of a Data Block descriptor may be an offset (in-capsule).
    pub const SGLS_OFFSET: u32 = 1 << 20;

    /// OFCS bit 0: Disconnect command supported.
    pub const OFCS_DISCONNECT: u16 = 1 << 0;
}

/// LBA Format data structure (NVM Command Set 1.0 Figure 98).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct LbaFormat {
    /// Bytes 1:0: Metadata Size.
    pub ms: U16,
    /// Byte 2: LBA Data Size, log2 bytes.
    pub ds: u8,
    /// Byte 3: Relative Performance (bits 1:0).
    pub rp: u8,
}

const _: () = assert!(size_of::<LbaFormat>() == 4);

/// Identify Namespace data structure for the NVM command set, CNS 00h (NVM Command Set 1.0
/// Figure 97).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IdentifyNamespace {
    /// Bytes 7:0: Namespace Size, logical blocks.
    pub nsze: U64,
    /// Bytes 15:8: Namespace Capacity, logical blocks.
    pub ncap: U64,
    /// Bytes 23:16: Namespace Utilization, logical blocks.
    pub nuse: U64,
    /// Byte 24: Namespace Features.
    pub nsfeat: u8,
    /// Byte 25: Number of LBA Formats, 0's based.
    pub nlbaf: u8,
    /// Byte 26: Formatted LBA Size (index into `lbaf`).
    pub flbas: u8,
    /// Byte 27: Metadata Capabilities.
    pub mc: u8,
    /// Byte 28: End-to-end Data Protection Capabilities.
    pub dpc: u8,
    /// Byte 29: End-to-end Data Protection Type Settings.
    pub dps: u8,
    /// Byte 30: Namespace Multi-path I/O and Namespace Sharing Capabilities (bit 0 shared).
    pub nmic: u8,
    /// Byte 31: Reservation Capabilities.
    pub rescap: u8,
    /// Byte 32: Format Progress Indicator.
    pub fpi: u8,
    /// Byte 33: Deallocate Logical Block Features.
    pub dlfeat: u8,
    /// Bytes 35:34: Namespace Atomic Write Unit Normal.
    pub nawun: U16,
    /// Bytes 37:36: Namespace Atomic Write Unit Power Fail.
    pub nawupf: U16,
    /// Bytes 39:38: Namespace Atomic Compare & Write Unit.
    pub nacwu: U16,
    /// Bytes 41:40: Namespace Atomic Boundary Size Normal.
    pub nabsn: U16,
    /// Bytes 43:42: Namespace Atomic Boundary Offset.
    pub nabo: U16,
    /// Bytes 45:44: Namespace Atomic Boundary Size Power Fail.
    pub nabspf: U16,
    /// Bytes 47:46: Namespace Optimal I/O Boundary.
    pub noiob: U16,
    /// Bytes 63:48: NVM Capacity, bytes.
    pub nvmcap: [u8; 16],
    /// Bytes 65:64: Namespace Preferred Write Granularity, 0's based blocks.
    pub npwg: U16,
    /// Bytes 67:66: Namespace Preferred Write Alignment.
    pub npwa: U16,
    /// Bytes 69:68: Namespace Preferred Deallocate Granularity.
    pub npdg: U16,
    /// Bytes 71:70: Namespace Preferred Deallocate Alignment.
    pub npda: U16,
    /// Bytes 73:72: Namespace Optimal Write Size.
    pub nows: U16,
    /// Bytes 75:74: Maximum Single Source Range Length (Copy).
    pub mssrl: U16,
    /// Bytes 79:76: Maximum Copy Length.
    pub mcl: U32,
    /// Byte 80: Maximum Source Range Count.
    pub msrc: u8,
    _rsvd81: [u8; 11],
    /// Bytes 95:92: ANA Group Identifier.
    pub anagrpid: U32,
    _rsvd96: [u8; 3],
    /// Byte 99: Namespace Attributes (bit 0 write protected).
    pub nsattr: u8,
    /// Bytes 101:100: NVM Set Identifier.
    pub nvmsetid: U16,
    /// Bytes 103:102: Endurance Group Identifier.
    pub endgid: U16,
    /// Bytes 119:104: Namespace Globally Unique Identifier.
    pub nguid: [u8; 16],
    /// Bytes 127:120: IEEE Extended Unique Identifier.
    pub eui64: [u8; 8],
    /// Bytes 383:128: LBA Format 0-63 support.
    pub lbaf: [LbaFormat; 64],
    /// Bytes 4095:384: Vendor Specific.
    pub vs: [u8; 3712],
}

const _: () = assert!(size_of::<IdentifyNamespace>() == 4096);
const _: () = assert!(offset_of!(IdentifyNamespace, nsfeat) == 24);
const _: () = assert!(offset_of!(IdentifyNamespace, nmic) == 30);
const _: () = assert!(offset_of!(IdentifyNamespace, dlfeat) == 33);
const _: () = assert!(offset_of!(IdentifyNamespace, nvmcap) == 48);
const _: () = assert!(offset_of!(IdentifyNamespace, npwg) == 64);
const _: () = assert!(offset_of!(IdentifyNamespace, anagrpid) == 92);
const _: () = assert!(offset_of!(IdentifyNamespace, nsattr) == 99);
const _: () = assert!(offset_of!(IdentifyNamespace, nguid) == 104);
const _: () = assert!(offset_of!(IdentifyNamespace, eui64) == 120);
const _: () = assert!(offset_of!(IdentifyNamespace, lbaf) == 128);
const _: () = assert!(offset_of!(IdentifyNamespace, vs) == 384);
wire_codec!(IdentifyNamespace, 4096);

impl core::fmt::Debug for IdentifyNamespace {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IdentifyNamespace")
            .field("nsze", &self.nsze.get())
            .field("flbas", &self.flbas)
            .field("lbaf0", &self.lbaf[0])
            .field("nmic", &self.nmic)
            .finish_non_exhaustive()
    }
}

/// NMIC bit 0: the namespace may be attached to two or more controllers.
pub const NMIC_SHARED: u8 = 1 << 0;

/// I/O Command Set specific Identify Controller for the NVM command set, CNS 06h CSI 00h
/// (NVM Command Set 1.0 Figure 102).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IdentifyCtrlNvm {
    /// Byte 0: Verify Size Limit (power of two, MPSMIN units; 0 = none).
    pub vsl: u8,
    /// Byte 1: Write Zeroes Size Limit (power of two, MPSMIN units; 0 = none).
    pub wzsl: u8,
    /// Byte 2: Write Uncorrectable Size Limit.
    pub wusl: u8,
    /// Byte 3: Dataset Management Ranges Limit (0 = not reported).
    pub dmrl: u8,
    /// Bytes 7:4: Dataset Management Range Size Limit, logical blocks (0 = not reported).
    pub dmrsl: U32,
    /// Bytes 15:8: Dataset Management Size Limit, logical blocks (0 = not reported).
    pub dmsl: U64,
    _rsvd16: [u8; 4080],
}

const _: () = assert!(size_of::<IdentifyCtrlNvm>() == 4096);
const _: () = assert!(offset_of!(IdentifyCtrlNvm, dmrl) == 3);
const _: () = assert!(offset_of!(IdentifyCtrlNvm, dmrsl) == 4);
const _: () = assert!(offset_of!(IdentifyCtrlNvm, dmsl) == 8);
wire_codec!(IdentifyCtrlNvm, 4096);

/// I/O Command Set specific Identify Namespace for the NVM command set, CNS 05h CSI 00h
/// (NVM Command Set 1.0 Figure 100).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IdentifyNsNvm {
    /// Bytes 7:0: Logical Block Storage Tag Mask.
    pub lbstm: U64,
    /// Byte 8: Protection Information Capabilities.
    pub pic: u8,
    _rsvd9: [u8; 3],
    /// Bytes 267:12: Extended LBA Format 0-63.
    pub elbaf: [U32; 64],
    _rsvd268: [u8; 3828],
}

const _: () = assert!(size_of::<IdentifyNsNvm>() == 4096);
const _: () = assert!(offset_of!(IdentifyNsNvm, elbaf) == 12);
wire_codec!(IdentifyNsNvm, 4096);

/// I/O Command Set Independent Identify Namespace, CNS 08h (NVMe Base 2.0 Figure 280).
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IdentifyNsCsIndep {
    /// Byte 0: Common Namespace Features.
    pub nsfeat: u8,
    /// Byte 1: Namespace Multi-path I/O and Namespace Sharing Capabilities.
    pub nmic: u8,
    /// Byte 2: Reservation Capabilities.
    pub rescap: u8,
    /// Byte 3: Format Progress Indicator.
    pub fpi: u8,
    /// Bytes 7:4: ANA Group Identifier.
    pub anagrpid: U32,
    /// Byte 8: Namespace Attributes.
    pub nsattr: u8,
    _rsvd9: u8,
    /// Bytes 11:10: NVM Set Identifier.
    pub nvmsetid: U16,
    /// Bytes 13:12: Endurance Group Identifier.
    pub endgid: U16,
    /// Byte 14: Namespace Status (bit 0: namespace ready).
    pub nstat: u8,
    _rsvd15: [u8; 4081],
}

const _: () = assert!(size_of::<IdentifyNsCsIndep>() == 4096);
const _: () = assert!(offset_of!(IdentifyNsCsIndep, anagrpid) == 4);
const _: () = assert!(offset_of!(IdentifyNsCsIndep, nsattr) == 8);
const _: () = assert!(offset_of!(IdentifyNsCsIndep, endgid) == 12);
const _: () = assert!(offset_of!(IdentifyNsCsIndep, nstat) == 14);
wire_codec!(IdentifyNsCsIndep, 4096);

/// NSTAT bit 0: the namespace is ready.
pub const NSTAT_READY: u8 = 1 << 0;

/// Namespace Identification Descriptor header (NVMe Base 2.0 Figure 279).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct NsIdDescHeader {
    /// Byte 0: Namespace Identifier Type.
    pub nidt: u8,
    /// Byte 1: Namespace Identifier Length.
    pub nidl: u8,
    _rsvd2: [u8; 2],
}

const _: () = assert!(size_of::<NsIdDescHeader>() == 4);

/// Namespace Identifier Types (NVMe Base 2.0 Figure 279).
pub mod nidt {
    /// IEEE EUI-64, 8 bytes.
    pub const EUI64: u8 = 1;
    /// NGUID, 16 bytes.
    pub const NGUID: u8 = 2;
    /// UUID, 16 bytes.
    pub const UUID: u8 = 3;
    /// Command Set Identifier, 1 byte.
    pub const CSI: u8 = 4;
}

/// One Namespace Identification Descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsIdDesc {
    Eui64([u8; 8]),
    Nguid([u8; 16]),
    Uuid([u8; 16]),
    Csi(u8),
}

impl NsIdDesc {
    fn parts(&self) -> (u8, &[u8]) {
        match self {
            NsIdDesc::Eui64(v) => (nidt::EUI64, v),
            NsIdDesc::Nguid(v) => (nidt::NGUID, v),
            NsIdDesc::Uuid(v) => (nidt::UUID, v),
            NsIdDesc::Csi(v) => (nidt::CSI, core::slice::from_ref(v)),
        }
    }

    /// Encode a descriptor list (CNS 03h) into a zeroed 4096-byte buffer.
    pub fn encode_list(descs: &[NsIdDesc]) -> [u8; IDENTIFY_DATA_SIZE] {
        let mut out = [0u8; IDENTIFY_DATA_SIZE];
        let mut off = 0;
        for d in descs {
            let (t, v) = d.parts();
            if off + 4 + v.len() > out.len() {
                break;
            }
            out[off] = t;
            out[off + 1] = v.len() as u8;
            out[off + 4..off + 4 + v.len()].copy_from_slice(v);
            off += 4 + v.len();
        }
        out
    }

    /// Decode a descriptor list; it ends at the first descriptor with NIDL 0.
    pub fn decode_list(buf: &[u8]) -> Result<Vec<NsIdDesc>, DecodeError> {
        let mut out = Vec::new();
        let mut off = 0;
        while off + 4 <= buf.len() {
            let (t, l) = (buf[off], buf[off + 1] as usize);
            if l == 0 {
                break;
            }
            let v = buf.get(off + 4..off + 4 + l).ok_or(DecodeError::Short {
                need: off + 4 + l,
                have: buf.len(),
            })?;
            let bad_len = || DecodeError::Invalid {
                field: "NIDL",
                value: l as u64,
            };
            out.push(match t {
                nidt::EUI64 => NsIdDesc::Eui64(v.try_into().map_err(|_| bad_len())?),
                nidt::NGUID => NsIdDesc::Nguid(v.try_into().map_err(|_| bad_len())?),
                nidt::UUID => NsIdDesc::Uuid(v.try_into().map_err(|_| bad_len())?),
                nidt::CSI if l == 1 => NsIdDesc::Csi(v[0]),
                nidt::CSI => return Err(bad_len()),
                t => {
                    return Err(DecodeError::Invalid {
                        field: "NIDT",
                        value: t as u64,
                    })
                }
            });
            off += 4 + l;
        }
        Ok(out)
    }
}

/// Active Namespace ID list (CNS 02h): up to 1024 NSIDs in increasing order, zero-terminated.
pub fn encode_ns_list(nsids: impl IntoIterator<Item = u32>) -> [u8; IDENTIFY_DATA_SIZE] {
    let mut out = [0u8; IDENTIFY_DATA_SIZE];
    for (chunk, nsid) in out.chunks_exact_mut(4).zip(nsids) {
        chunk.copy_from_slice(&nsid.to_le_bytes());
    }
    out
}

/// Decode an Active Namespace ID list up to the first zero entry.
pub fn decode_ns_list(buf: &[u8]) -> Vec<u32> {
    buf.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&n| n != 0)
        .collect()
}

/// Feature Identifiers for Set/Get Features (NVMe Base 2.0 Figure 317).
pub mod feat {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MGMT: u8 = 0x02;
    pub const LBA_RANGE: u8 = 0x03;
    pub const TEMP_THRESH: u8 = 0x04;
    pub const ERR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WC: u8 = 0x06;
    pub const NUM_QUEUES: u8 = 0x07;
    pub const IRQ_COALESCE: u8 = 0x08;
    pub const IRQ_CONFIG: u8 = 0x09;
    pub const WRITE_ATOMIC: u8 = 0x0a;
    pub const ASYNC_EVENT: u8 = 0x0b;
    pub const AUTO_PST: u8 = 0x0c;
    pub const HOST_MEM_BUF: u8 = 0x0d;
    pub const TIMESTAMP: u8 = 0x0e;
    pub const KATO: u8 = 0x0f;
    pub const HCTM: u8 = 0x10;
    pub const NOPSC: u8 = 0x11;
    pub const RRL: u8 = 0x12;
    pub const HOST_BEHAVIOR: u8 = 0x16;
    pub const HOST_ID: u8 = 0x81;
    pub const RESV_MASK: u8 = 0x82;
    pub const RESV_PERSIST: u8 = 0x83;
    pub const WRITE_PROTECT: u8 = 0x84;

    /// Set Features CDW10 bit 31: Save.
    pub const SAVE: u32 = 1 << 31;
    /// Timestamp feature data size (NVMe Base 2.0 Figure 353).
    pub const TIMESTAMP_DATA_SIZE: u32 = 8;
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    #[test]
    fn identify_controller_fields_land_at_spec_offsets() {
        let mut id = IdentifyController::new_zeroed();
        id.sn = ascii_field("SN1");
        id.cntlid = 0x1234.into();
        id.kas = 10.into();
        id.sgls = (ctrl::SGLS_SUPPORTED | ctrl::SGLS_KEYED | ctrl::SGLS_OFFSET).into();
        id.subnqn = nqn_field("nqn.x");
        id.ioccsz = 260.into();
        id.iorcsz = 1.into();
        id.msdbd = 1;
        id.cntrltype = ctrl::CNTRLTYPE_IO;
        id.psd[0].mp = 0x9c4.into();
        let b = id.encode();
        assert_eq!(&b[4..8], b"SN1 ");
        assert_eq!(b[23], b' ');
        assert_eq!(&b[78..80], &[0x34, 0x12]);
        assert_eq!(b[111], 1);
        assert_eq!(&b[320..322], &[10, 0]);
        assert_eq!(&b[536..540], &0x0010_0005u32.to_le_bytes());
        assert_eq!(&b[768..773], b"nqn.x");
        assert_eq!(&b[1792..1796], &260u32.to_le_bytes());
        assert_eq!(&b[1796..1800], &1u32.to_le_bytes());
        assert_eq!(b[1803], 1);
        assert_eq!(&b[2048..2050], &[0xc4, 0x09]);
        let back = IdentifyController::decode(&b).unwrap();
        assert_eq!(back.cntlid.get(), 0x1234);
        assert!(IdentifyController::decode(&b[..4095]).is_err());
    }

    #[test]
    fn identify_namespace_layout() {
        let mut ns = IdentifyNamespace::new_zeroed();
        ns.nsze = 0x1000.into();
        ns.lbaf[0].ds = 12;
        ns.nguid = [0xab; 16];
        let b = ns.encode();
        assert_eq!(&b[0..8], &0x1000u64.to_le_bytes());
        assert_eq!(b[130], 12);
        assert_eq!(b[104], 0xab);
        assert_eq!(IdentifyNamespace::decode(&b).unwrap().lbaf[0].ds, 12);
    }

    #[test]
    fn ns_desc_list_round_trip() {
        let l = [
            NsIdDesc::Uuid([1; 16]),
            NsIdDesc::Nguid([2; 16]),
            NsIdDesc::Csi(0),
        ];
        let b = NsIdDesc::encode_list(&l);
        // Linux nvme_ns_id_desc: nidt, nidl, rsvd[2], then the identifier.
        assert_eq!(&b[0..4], &[3, 16, 0, 0]);
        assert_eq!(&b[20..24], &[2, 16, 0, 0]);
        assert_eq!(&b[40..45], &[4, 1, 0, 0, 0]);
        assert_eq!(NsIdDesc::decode_list(&b).unwrap(), l);
        let mut bad = b;
        bad[1] = 5;
        assert!(NsIdDesc::decode_list(&bad).is_err());
    }

    #[test]
    fn ns_list_and_identify_cmd() {
        let b = encode_ns_list([1, 2, 7]);
        assert_eq!(&b[0..12], &[1, 0, 0, 0, 2, 0, 0, 0, 7, 0, 0, 0]);
        assert_eq!(decode_ns_list(&b), vec![1, 2, 7]);
        let cmd = IdentifyCmd {
            cns: cns::CS_CTRL,
            cntid: 0,
            cnssid: 0,
            csi: csi::ZNS,
            nsid: 0,
        };
        let s = cmd.to_sqe(4, [0; 16]);
        assert_eq!(s.cdw10.get(), 6);
        assert_eq!(s.cdw11.get(), 2 << 24);
        assert_eq!(IdentifyCmd::from_sqe(&s), cmd);
    }

    #[test]
    fn ascii_fields_pad_and_cut() {
        let f: [u8; 8] = ascii_field("0.1.0");
        assert_eq!(&f, b"0.1.0   ");
        let f: [u8; 4] = ascii_field("abcdef");
        assert_eq!(&f, b"abcd");
        let f: [u8; 4] = ascii_field("é\n");
        assert_eq!(&f, b"??  ");
    }
}
