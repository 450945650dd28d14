//! NVMe status codes (NVMe Base 2.0, 4.6.1.2) from one table.
//!
//! A [`Status`] is data, not a Rust error: it travels to the host in a CQE. The encoding follows
//! the Linux host: bits 7:0 are the Status Code (SC), bits 10:8 the Status Code Type (SCT),
//! bits 12:11 CRD, bit 13 More and bit 14 Do Not Retry. In the CQE the field sits one bit up,
//! above the phase tag.

/// A completion status: SC, SCT, CRD, More and DNR.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub u16);

macro_rules! status_table {
    ($( $name:ident = $code:expr, $desc:expr; )*) => {
        impl Status {
            $( #[doc = $desc] pub const $name: Status = Status($code); )*
        }
        /// Description of a status code (ignoring DNR/More/CRD), for logs and error messages.
        pub fn describe(code: u16) -> &'static str {
            match code & 0x7ff {
                $( $code => $desc, )*
                _ => "Unknown status",
            }
        }
        /// Symbolic name of a status code (ignoring DNR/More/CRD).
        pub fn name(code: u16) -> &'static str {
            match code & 0x7ff {
                $( $code => stringify!($name), )*
                _ => "UNKNOWN",
            }
        }
    };
}

status_table! {
    // Generic command status (SCT 0), NVMe Base 2.0 Figure 100.
    SUCCESS = 0x000, "Successful Completion";
    INVALID_OPCODE = 0x001, "Invalid Command Opcode";
    INVALID_FIELD = 0x002, "Invalid Field in Command";
    CMDID_CONFLICT = 0x003, "Command ID Conflict";
    DATA_XFER_ERROR = 0x004, "Data Transfer Error";
    POWER_LOSS = 0x005, "Commands Aborted due to Power Loss Notification";
    INTERNAL = 0x006, "Internal Error";
    ABORT_REQ = 0x007, "Command Abort Requested";
    ABORT_QUEUE = 0x008, "Command Aborted due to SQ Deletion";
    FUSED_FAIL = 0x009, "Command Aborted due to Failed Fused Command";
    FUSED_MISSING = 0x00a, "Command Aborted due to Missing Fused Command";
    INVALID_NS = 0x00b, "Invalid Namespace or Format";
    CMD_SEQ_ERROR = 0x00c, "Command Sequence Error";
    SGL_INVALID_LAST = 0x00d, "Invalid SGL Segment Descriptor";
    SGL_INVALID_COUNT = 0x00e, "Invalid Number of SGL Descriptors";
    SGL_INVALID_DATA = 0x00f, "Data SGL Length Invalid";
    SGL_INVALID_METADATA = 0x010, "Metadata SGL Length Invalid";
    SGL_INVALID_TYPE = 0x011, "SGL Descriptor Type Invalid";
    CMB_INVALID_USE = 0x012, "Invalid Use of Controller Memory Buffer";
    PRP_INVALID_OFFSET = 0x013, "PRP Offset Invalid";
    ATOMIC_WRITE_UNIT_EXCEEDED = 0x014, "Atomic Write Unit Exceeded";
    OPERATION_DENIED = 0x015, "Operation Denied";
    SGL_INVALID_OFFSET = 0x016, "SGL Offset Invalid";
    SGL_INVALID_SUBTYPE = 0x017, "SGL Sub Type Invalid";
    HOST_ID_INCONSISTENT = 0x018, "Host Identifier Inconsistent Format";
    KEEP_ALIVE_EXPIRED = 0x019, "Keep Alive Timer Expired";
    KEEP_ALIVE_INVALID = 0x01a, "Keep Alive Timeout Invalid";
    PREEMPT_ABORT = 0x01b, "Command Aborted due to Preempt and Abort";
    SANITIZE_FAILED = 0x01c, "Sanitize Failed";
    SANITIZE_IN_PROGRESS = 0x01d, "Sanitize In Progress";
    SGL_INVALID_GRANULARITY = 0x01e, "SGL Data Block Granularity Invalid";
    CMD_NOT_SUP_CMB_QUEUE = 0x01f, "Command Not Supported for Queue in CMB";
    NS_WRITE_PROTECTED = 0x020, "Namespace is Write Protected";
    CMD_INTERRUPTED = 0x021, "Command Interrupted";
    TRANSIENT_TRANSPORT = 0x022, "Transient Transport Error";
    LBA_RANGE = 0x080, "LBA Out of Range";
    CAP_EXCEEDED = 0x081, "Capacity Exceeded";
    NS_NOT_READY = 0x082, "Namespace Not Ready";
    RESERVATION_CONFLICT = 0x083, "Reservation Conflict";
    FORMAT_IN_PROGRESS = 0x084, "Format In Progress";
    // Command specific status (SCT 1), NVMe Base 2.0 Figure 101; Fabrics, NVMe-oF 1.1 Figure 18.
    CQ_INVALID = 0x100, "Completion Queue Invalid";
    QID_INVALID = 0x101, "Invalid Queue Identifier";
    QUEUE_SIZE = 0x102, "Invalid Queue Size";
    ABORT_LIMIT = 0x103, "Abort Command Limit Exceeded";
    ASYNC_LIMIT = 0x105, "Asynchronous Event Request Limit Exceeded";
    FIRMWARE_SLOT = 0x106, "Invalid Firmware Slot";
    FIRMWARE_IMAGE = 0x107, "Invalid Firmware Image";
    INVALID_VECTOR = 0x108, "Invalid Interrupt Vector";
    INVALID_LOG_PAGE = 0x109, "Invalid Log Page";
    INVALID_FORMAT = 0x10a, "Invalid Format";
    FEATURE_NOT_SAVEABLE = 0x10d, "Feature Identifier Not Saveable";
    FEATURE_NOT_CHANGEABLE = 0x10e, "Feature Not Changeable";
    FEATURE_NOT_PER_NS = 0x10f, "Feature Not Namespace Specific";
    NS_ALREADY_ATTACHED = 0x118, "Namespace Already Attached";
    NS_NOT_ATTACHED = 0x11a, "Namespace Not Attached";
    CTRL_LIST_INVALID = 0x11c, "Controller List Invalid";
    CONNECT_FORMAT = 0x180, "Connect: Incompatible Format";
    CONNECT_CTRL_BUSY = 0x181, "Connect: Controller Busy";
    CONNECT_INVALID_PARAM = 0x182, "Connect: Invalid Parameters";
    CONNECT_RESTART_DISC = 0x183, "Connect: Restart Discovery";
    CONNECT_INVALID_HOST = 0x184, "Connect: Invalid Host";
    DISCOVERY_RESTART = 0x190, "Discovery: Restart Discovery";
    AUTH_REQUIRED = 0x191, "Authentication Required";
    // Media and data integrity errors (SCT 2), NVMe Base 2.0 Figure 102.
    WRITE_FAULT = 0x280, "Write Fault";
    READ_ERROR = 0x281, "Unrecovered Read Error";
    GUARD_CHECK = 0x282, "End-to-end Guard Check Error";
    APPTAG_CHECK = 0x283, "End-to-end Application Tag Check Error";
    REFTAG_CHECK = 0x284, "End-to-end Reference Tag Check Error";
    COMPARE_FAILED = 0x285, "Compare Failure";
    ACCESS_DENIED = 0x286, "Access Denied";
    UNWRITTEN_BLOCK = 0x287, "Deallocated or Unwritten Logical Block";
    // Path related status (SCT 3), NVMe Base 2.0 Figure 103.
    INTERNAL_PATH_ERROR = 0x300, "Internal Path Error";
    ANA_PERSISTENT_LOSS = 0x301, "Asymmetric Access Persistent Loss";
    ANA_INACCESSIBLE = 0x302, "Asymmetric Access Inaccessible";
    ANA_TRANSITION = 0x303, "Asymmetric Access Transition";
    CTRL_PATH_ERROR = 0x360, "Controller Pathing Error";
    HOST_PATH_ERROR = 0x370, "Host Pathing Error";
    HOST_ABORTED_CMD = 0x371, "Command Aborted By Host";
}

impl Status {
    /// Do Not Retry bit.
    pub const DNR: u16 = 0x4000;
    /// More bit.
    pub const MORE: u16 = 0x2000;

    /// This status with the Do Not Retry bit set.
    pub const fn dnr(self) -> Status {
        Status(self.0 | Self::DNR)
    }
    /// Status Code Type (bits 10:8).
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }
    /// Status Code (bits 7:0).
    pub const fn sc(self) -> u8 {
        (self.0 & 0xff) as u8
    }
    /// Whether the host was told not to retry.
    pub const fn is_dnr(self) -> bool {
        self.0 & Self::DNR != 0
    }
    /// SCT and SC alone, without CRD/More/DNR: compare statuses with this.
    pub const fn code(self) -> u16 {
        self.0 & 0x7ff
    }
    pub const fn is_success(self) -> bool {
        self.code() == 0
    }
    /// The 15-bit CQE status field (bits 15:1 of CQE DW3 upper half) for this status.
    pub const fn to_cqe_field(self, phase: bool) -> u16 {
        (self.0 << 1) | phase as u16
    }
    /// The status from a CQE's 16-bit status+phase field.
    pub const fn from_cqe_field(field: u16) -> Status {
        Status(field >> 1)
    }
    pub fn description(self) -> &'static str {
        describe(self.0)
    }
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({:#05x}", name(self.0), self.code())?;
        if self.is_dnr() {
            f.write_str("|DNR")?;
        }
        f.write_str(")")
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (sct {:#x} sc {:#04x}",
            self.description(),
            self.sct(),
            self.sc()
        )?;
        if self.is_dnr() {
            f.write_str(", DNR")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_field_round_trip_matches_linux_encoding() {
        // Linux: NVME_SC_INVALID_FIELD 0x2, NVME_SC_DNR 0x4000; the CQE carries status << 1.
        let s = Status::INVALID_FIELD.dnr();
        assert_eq!(s.0, 0x4002);
        assert_eq!(s.to_cqe_field(true), 0x8005);
        assert_eq!(Status::from_cqe_field(0x8005), s);
        assert!(s.is_dnr());
        assert_eq!(s.code(), Status::INVALID_FIELD.code());
    }

    #[test]
    fn table_names_and_types() {
        assert_eq!(Status::LBA_RANGE.sct(), 0);
        assert_eq!(Status::LBA_RANGE.sc(), 0x80);
        assert_eq!(Status::CONNECT_INVALID_HOST.sct(), 1);
        assert_eq!(Status::CONNECT_INVALID_HOST.sc(), 0x84);
        assert_eq!(name(Status::INVALID_OPCODE.dnr().0), "INVALID_OPCODE");
        assert_eq!(Status::READ_ERROR.description(), "Unrecovered Read Error");
        assert_eq!(
            format!("{:?}", Status::INVALID_NS.dnr()),
            "INVALID_NS(0x00b|DNR)"
        );
    }
}
