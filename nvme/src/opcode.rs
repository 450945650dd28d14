//! Opcodes: admin (NVMe Base 2.0, 5), NVM I/O (NVM Command Set 1.0, 3) and Fabrics (NVMe-oF 1.1, 6).

/// Admin command opcodes (NVMe Base 2.0 Figure 28).
pub mod admin {
    pub const DELETE_SQ: u8 = 0x00;
    pub const CREATE_SQ: u8 = 0x01;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const DELETE_CQ: u8 = 0x04;
    pub const CREATE_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    pub const NS_MGMT: u8 = 0x0d;
    pub const FW_COMMIT: u8 = 0x10;
    pub const FW_DOWNLOAD: u8 = 0x11;
    pub const DEVICE_SELF_TEST: u8 = 0x14;
    pub const NS_ATTACH: u8 = 0x15;
    pub const KEEP_ALIVE: u8 = 0x18;
    pub const DIRECTIVE_SEND: u8 = 0x19;
    pub const DIRECTIVE_RECV: u8 = 0x1a;
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
    pub const FORMAT_NVM: u8 = 0x80;
    pub const SECURITY_SEND: u8 = 0x81;
    pub const SECURITY_RECV: u8 = 0x82;
    pub const SANITIZE: u8 = 0x84;
}

/// NVM command set I/O opcodes (NVM Command Set 1.0 Figure 17).
pub mod io {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_UNCORRECTABLE: u8 = 0x04;
    pub const COMPARE: u8 = 0x05;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
    pub const VERIFY: u8 = 0x0c;
    pub const RESV_REGISTER: u8 = 0x0d;
    pub const RESV_REPORT: u8 = 0x0e;
    pub const RESV_ACQUIRE: u8 = 0x11;
    pub const RESV_RELEASE: u8 = 0x15;
    pub const COPY: u8 = 0x19;
}

/// The Fabrics command opcode (NVMe-oF 1.1, 6.1): the command type is in `fctype`.
pub const FABRICS: u8 = 0x7f;

/// Fabrics command types (`fctype`, SQE byte 4; NVMe-oF 1.1 Figure 11).
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTH_SEND: u8 = 0x05;
    pub const AUTH_RECV: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// The data direction an opcode implies: bits 1:0 of the opcode (NVMe Base 2.0 Figure 27).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    None,
    /// Host to controller (a Write from the host's point of view).
    HostToCtrl,
    /// Controller to host.
    CtrlToHost,
    Bidirectional,
}

impl Direction {
    /// Direction encoded in the low two opcode bits.
    pub fn of_opcode(opcode: u8) -> Direction {
        match opcode & 3 {
            0 => Direction::None,
            1 => Direction::HostToCtrl,
            2 => Direction::CtrlToHost,
            _ => Direction::Bidirectional,
        }
    }
}

/// Human-readable names for logs.
pub fn admin_name(op: u8) -> &'static str {
    use admin::*;
    match op {
        DELETE_SQ => "Delete SQ",
        CREATE_SQ => "Create SQ",
        GET_LOG_PAGE => "Get Log Page",
        DELETE_CQ => "Delete CQ",
        CREATE_CQ => "Create CQ",
        IDENTIFY => "Identify",
        ABORT => "Abort",
        SET_FEATURES => "Set Features",
        GET_FEATURES => "Get Features",
        ASYNC_EVENT_REQUEST => "Async Event Request",
        KEEP_ALIVE => "Keep Alive",
        FABRICS => "Fabrics",
        _ => "Unknown admin command",
    }
}

/// Human-readable names for logs.
pub fn io_name(op: u8) -> &'static str {
    use io::*;
    match op {
        FLUSH => "Flush",
        WRITE => "Write",
        READ => "Read",
        WRITE_ZEROES => "Write Zeroes",
        DSM => "Dataset Management",
        FABRICS => "Fabrics",
        _ => "Unknown I/O command",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directions_follow_opcode_bits() {
        assert_eq!(Direction::of_opcode(io::READ), Direction::CtrlToHost);
        assert_eq!(Direction::of_opcode(io::WRITE), Direction::HostToCtrl);
        assert_eq!(Direction::of_opcode(io::FLUSH), Direction::None);
        assert_eq!(Direction::of_opcode(admin::IDENTIFY), Direction::CtrlToHost);
        assert_eq!(Direction::of_opcode(FABRICS), Direction::Bidirectional);
    }
}
