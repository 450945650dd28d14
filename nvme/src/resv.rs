//! Reservations (NVMe Base 2.0, 8.19; NVM Command Set 1.0, 3.2.4-3.2.7): the four commands'
//! fields, their data, and the Reservation Report data structure.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::cmd::Sqe;
use crate::DecodeError;

/// Reservation types (RTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ResvType {
    WriteExclusive = 1,
    ExclusiveAccess = 2,
    WriteExclusiveRegistrantsOnly = 3,
    ExclusiveAccessRegistrantsOnly = 4,
    WriteExclusiveAllRegistrants = 5,
    ExclusiveAccessAllRegistrants = 6,
}

impl ResvType {
    pub const ALL: [ResvType; 6] = [
        ResvType::WriteExclusive,
        ResvType::ExclusiveAccess,
        ResvType::WriteExclusiveRegistrantsOnly,
        ResvType::ExclusiveAccessRegistrantsOnly,
        ResvType::WriteExclusiveAllRegistrants,
        ResvType::ExclusiveAccessAllRegistrants,
    ];

    pub fn from_u8(v: u8) -> Option<ResvType> {
        ResvType::ALL.get(usize::from(v).checked_sub(1)?).copied()
    }

    /// Every registrant holds the reservation (types 5 and 6).
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            ResvType::WriteExclusiveAllRegistrants | ResvType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants that do not hold it may read and write (types 3 to 6).
    pub fn registrants_have_access(self) -> bool {
        !matches!(self, ResvType::WriteExclusive | ResvType::ExclusiveAccess)
    }

    /// Hosts without access may still read (the Write Exclusive family: 1, 3, 5).
    pub fn others_may_read(self) -> bool {
        matches!(
            self,
            ResvType::WriteExclusive
                | ResvType::WriteExclusiveRegistrantsOnly
                | ResvType::WriteExclusiveAllRegistrants
        )
    }
}

/// Identify Namespace RESCAP bits.
pub mod rescap {
    /// Persist Through Power Loss capable.
    pub const PTPL: u8 = 1 << 0;
    /// Types 1 to 6 supported: bits 1 to 6.
    pub const ALL_TYPES: u8 = 0x7e;
    /// Ignore Existing Key behaves as NVMe 1.3 and later define it.
    pub const IEKEY13: u8 = 1 << 7;
}

/// Reservation Register action (CDW10 RREGA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    Register,
    Unregister,
    Replace,
}

/// Change Persist Through Power Loss State (Register CDW10 CPTPL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangePtpl {
    NoChange,
    Clear,
    Set,
}

/// Reservation Acquire action (CDW10 RACQA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireAction {
    Acquire,
    Preempt,
    PreemptAndAbort,
}

/// Reservation Release action (CDW10 RRELA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAction {
    Release,
    Clear,
}

/// Which field of a reservation command is invalid (for the error's location).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadField {
    Action,
    Type,
    Ptpl,
}

/// Reservation Register (opcode 0Dh), CDW10 and its 16 bytes of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegisterCmd {
    pub action: RegisterAction,
    pub ignore_key: bool,
    pub ptpl: ChangePtpl,
    pub crkey: u64,
    pub nrkey: u64,
}

/// Reservation Acquire (opcode 11h), CDW10 and its 16 bytes of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireCmd {
    pub action: AcquireAction,
    pub ignore_key: bool,
    pub rtype: ResvType,
    pub crkey: u64,
    pub prkey: u64,
}

/// Reservation Release (opcode 15h), CDW10 and its 8 bytes of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseCmd {
    pub action: ReleaseAction,
    pub ignore_key: bool,
    /// Must match the reservation's type for a Release (ignored by Clear).
    pub rtype: u8,
    pub crkey: u64,
}

/// Bytes of Register and Acquire data; Release carries 8.
pub const KEYS_DATA_SIZE: usize = 16;
pub const RELEASE_DATA_SIZE: usize = 8;

const IEKEY: u32 = 1 << 3;

fn key(data: &[u8], at: usize) -> Result<u64, DecodeError> {
    let b = data.get(at..at + 8).ok_or(DecodeError::Short {
        need: at + 8,
        have: data.len(),
    })?;
    Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

impl RegisterCmd {
    pub fn decode(sqe: &Sqe, data: &[u8]) -> Result<Result<RegisterCmd, BadField>, DecodeError> {
        let cdw10 = sqe.cdw10.get();
        let (crkey, nrkey) = (key(data, 0)?, key(data, 8)?);
        let action = match cdw10 & 7 {
            0 => RegisterAction::Register,
            1 => RegisterAction::Unregister,
            2 => RegisterAction::Replace,
            _ => return Ok(Err(BadField::Action)),
        };
        let ptpl = match cdw10 >> 30 {
            0 => ChangePtpl::NoChange,
            2 => ChangePtpl::Clear,
            3 => ChangePtpl::Set,
            _ => return Ok(Err(BadField::Ptpl)),
        };
        Ok(Ok(RegisterCmd {
            action,
            ignore_key: cdw10 & IEKEY != 0,
            ptpl,
            crkey,
            nrkey,
        }))
    }

    /// CDW10 and the data for this command.
    pub fn encode(&self) -> (u32, [u8; KEYS_DATA_SIZE]) {
        let a = match self.action {
            RegisterAction::Register => 0,
            RegisterAction::Unregister => 1,
            RegisterAction::Replace => 2,
        };
        let p = match self.ptpl {
            ChangePtpl::NoChange => 0,
            ChangePtpl::Clear => 2,
            ChangePtpl::Set => 3,
        };
        let cdw10 = a | if self.ignore_key { IEKEY } else { 0 } | p << 30;
        (cdw10, keys(self.crkey, self.nrkey))
    }
}

fn keys(a: u64, b: u64) -> [u8; KEYS_DATA_SIZE] {
    let mut d = [0u8; KEYS_DATA_SIZE];
    d[..8].copy_from_slice(&a.to_le_bytes());
    d[8..].copy_from_slice(&b.to_le_bytes());
    d
}

impl AcquireCmd {
    pub fn decode(sqe: &Sqe, data: &[u8]) -> Result<Result<AcquireCmd, BadField>, DecodeError> {
        let cdw10 = sqe.cdw10.get();
        let (crkey, prkey) = (key(data, 0)?, key(data, 8)?);
        let action = match cdw10 & 7 {
            0 => AcquireAction::Acquire,
            1 => AcquireAction::Preempt,
            2 => AcquireAction::PreemptAndAbort,
            _ => return Ok(Err(BadField::Action)),
        };
        let Some(rtype) = ResvType::from_u8((cdw10 >> 8) as u8) else {
            return Ok(Err(BadField::Type));
        };
        Ok(Ok(AcquireCmd {
            action,
            ignore_key: cdw10 & IEKEY != 0,
            rtype,
            crkey,
            prkey,
        }))
    }

    pub fn encode(&self) -> (u32, [u8; KEYS_DATA_SIZE]) {
        let a = match self.action {
            AcquireAction::Acquire => 0,
            AcquireAction::Preempt => 1,
            AcquireAction::PreemptAndAbort => 2,
        };
        let cdw10 = a | if self.ignore_key { IEKEY } else { 0 } | (self.rtype as u32) << 8;
        (cdw10, keys(self.crkey, self.prkey))
    }
}

impl ReleaseCmd {
    pub fn decode(sqe: &Sqe, data: &[u8]) -> Result<Result<ReleaseCmd, BadField>, DecodeError> {
        let cdw10 = sqe.cdw10.get();
        let crkey = key(data, 0)?;
        let action = match cdw10 & 7 {
            0 => ReleaseAction::Release,
            1 => ReleaseAction::Clear,
            _ => return Ok(Err(BadField::Action)),
        };
        Ok(Ok(ReleaseCmd {
            action,
            ignore_key: cdw10 & IEKEY != 0,
            rtype: (cdw10 >> 8) as u8,
            crkey,
        }))
    }

    pub fn encode(&self) -> (u32, [u8; RELEASE_DATA_SIZE]) {
        let a = match self.action {
            ReleaseAction::Release => 0,
            ReleaseAction::Clear => 1,
        };
        let cdw10 = a | if self.ignore_key { IEKEY } else { 0 } | u32::from(self.rtype) << 8;
        (cdw10, self.crkey.to_le_bytes())
    }
}

/// Reservation Report CDW11 bit 0: Extended Data Structure (128-bit host identifiers).
pub const REPORT_EDS: u32 = 1;

/// The extended Reservation Status data structure's header (64 bytes; NVM Command Set 1.0
/// Figure 63). The standard 24-byte header is its first 24 bytes with the same fields.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct ReportHeader {
    /// Generation: bumped by every successful Register, Preempt and Clear.
    pub gen: U32,
    /// The reservation's type, 0 if none.
    pub rtype: u8,
    /// Number of registrants.
    pub regctl: U16,
    pub rsvd7: [u8; 2],
    /// Persist Through Power Loss state.
    pub ptpls: u8,
    pub rsvd10: [u8; 54],
}

const _: () = assert!(std::mem::size_of::<ReportHeader>() == 64);

/// One registrant in the extended format (64 bytes; Figure 64).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RegistrantExt {
    /// FFFFh: a dynamic controller model subsystem does not name one controller.
    pub cntlid: U16,
    /// Reservation Status: bit 0, this registrant holds the reservation.
    pub rcsts: u8,
    pub rsvd3: [u8; 5],
    pub rkey: U64,
    pub hostid: [u8; 16],
    pub rsvd32: [u8; 32],
}

const _: () = assert!(std::mem::size_of::<RegistrantExt>() == 64);

/// A decoded Reservation Report (extended format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub gen: u32,
    pub rtype: Option<ResvType>,
    pub ptpl: bool,
    /// Registrants the controller has (may exceed `registrants.len()` when the report was cut
    /// short by the host's buffer).
    pub regctl: u16,
    /// (host identifier, key, holds the reservation).
    pub registrants: Vec<([u8; 16], u64, bool)>,
}

impl Report {
    /// Encodes the extended format into `out` (cut at its length, as NUMD asks).
    pub fn encode_ext(&self, out: &mut [u8]) {
        let mut h = ReportHeader::new_zeroed();
        h.gen = self.gen.into();
        h.rtype = self.rtype.map_or(0, |t| t as u8);
        h.regctl = self.regctl.into();
        h.ptpls = u8::from(self.ptpl);
        out.fill(0);
        put(out, 0, h.as_bytes());
        for (i, &(hostid, rkey, holds)) in self.registrants.iter().enumerate() {
            let mut r = RegistrantExt::new_zeroed();
            r.cntlid = 0xffff.into();
            r.rcsts = u8::from(holds);
            r.rkey = rkey.into();
            r.hostid = hostid;
            put(out, 64 + i * 64, r.as_bytes());
        }
    }

    /// Decodes the extended format (as many registrants as `data` holds).
    pub fn decode_ext(data: &[u8]) -> Result<Report, DecodeError> {
        let (h, _) = ReportHeader::read_from_prefix(data).map_err(|_| DecodeError::Short {
            need: 64,
            have: data.len(),
        })?;
        let regctl = h.regctl.get();
        let registrants = data[64..]
            .chunks_exact(64)
            .take(usize::from(regctl))
            .map(|c| {
                let r = RegistrantExt::read_from_bytes(c).expect("64 bytes");
                (r.hostid, r.rkey.get(), r.rcsts & 1 != 0)
            })
            .collect();
        Ok(Report {
            gen: h.gen.get(),
            rtype: ResvType::from_u8(h.rtype),
            ptpl: h.ptpls & 1 != 0,
            regctl,
            registrants,
        })
    }
}

/// Reservation Notification log page types (byte 8 of the entry).
pub mod notice {
    pub const EMPTY: u8 = 0;
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    pub const RESERVATION_RELEASED: u8 = 2;
    pub const RESERVATION_PREEMPTED: u8 = 3;
}

/// Reservation Notification Mask (feature 82h, CDW11): a set bit suppresses that type.
pub mod mask {
    pub const REGISTRATION_PREEMPTED: u32 = 1 << 1;
    pub const RESERVATION_RELEASED: u32 = 1 << 2;
    pub const RESERVATION_PREEMPTED: u32 = 1 << 3;
    pub const ALL: u32 = REGISTRATION_PREEMPTED | RESERVATION_RELEASED | RESERVATION_PREEMPTED;

    /// The mask bit of a notice type.
    pub fn of(kind: u8) -> u32 {
        1 << kind
    }
}

/// One Reservation Notification log page (64 bytes; NVMe Base 2.0 Figure 278).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NotificationLog {
    /// Log Page Count: bumped for every notice created (0 only for "none yet").
    pub count: u64,
    /// [`notice`] type; `EMPTY` when nothing is queued.
    pub kind: u8,
    /// Notices still queued after this one (at most 255).
    pub available: u8,
    pub nsid: u32,
}

impl NotificationLog {
    pub const SIZE: usize = 64;

    pub fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(&self.count.to_le_bytes());
        b[8] = self.kind;
        b[9] = self.available;
        b[12..16].copy_from_slice(&self.nsid.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<NotificationLog, DecodeError> {
        if b.len() < 16 {
            return Err(DecodeError::Short {
                need: 16,
                have: b.len(),
            });
        }
        Ok(NotificationLog {
            count: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            kind: b[8],
            available: b[9],
            nsid: u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
        })
    }
}

/// Copies as much of `bytes` to `out[at..]` as fits.
fn put(out: &mut [u8], at: usize, bytes: &[u8]) {
    if at >= out.len() {
        return;
    }
    let n = bytes.len().min(out.len() - at);
    out[at..at + n].copy_from_slice(&bytes[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip() {
        let r = RegisterCmd {
            action: RegisterAction::Replace,
            ignore_key: true,
            ptpl: ChangePtpl::Set,
            crkey: 0x1122,
            nrkey: 0x3344,
        };
        let (cdw10, data) = r.encode();
        assert_eq!(cdw10, 2 | 8 | 3 << 30);
        let mut sqe = Sqe::new(crate::opcode::io::RESV_REGISTER, 1);
        sqe.cdw10 = cdw10.into();
        assert_eq!(RegisterCmd::decode(&sqe, &data), Ok(Ok(r)));
        sqe.cdw10 = 3.into();
        assert_eq!(RegisterCmd::decode(&sqe, &data), Ok(Err(BadField::Action)));
        sqe.cdw10 = (1 << 30).into();
        assert_eq!(RegisterCmd::decode(&sqe, &data), Ok(Err(BadField::Ptpl)));
        assert!(RegisterCmd::decode(&sqe, &data[..8]).is_err());

        let a = AcquireCmd {
            action: AcquireAction::Preempt,
            ignore_key: false,
            rtype: ResvType::ExclusiveAccessAllRegistrants,
            crkey: 7,
            prkey: 9,
        };
        let (cdw10, data) = a.encode();
        assert_eq!(cdw10, 1 | 6 << 8);
        sqe.cdw10 = cdw10.into();
        assert_eq!(AcquireCmd::decode(&sqe, &data), Ok(Ok(a)));
        sqe.cdw10 = (7 << 8).into();
        assert_eq!(AcquireCmd::decode(&sqe, &data), Ok(Err(BadField::Type)));

        let rel = ReleaseCmd {
            action: ReleaseAction::Clear,
            ignore_key: false,
            rtype: 0,
            crkey: 5,
        };
        let (cdw10, data) = rel.encode();
        sqe.cdw10 = cdw10.into();
        assert_eq!(ReleaseCmd::decode(&sqe, &data), Ok(Ok(rel)));
    }

    #[test]
    fn report_round_trip_and_truncation() {
        let r = Report {
            gen: 3,
            rtype: Some(ResvType::WriteExclusive),
            ptpl: true,
            regctl: 2,
            registrants: vec![([1; 16], 0xaa, true), ([2; 16], 0xbb, false)],
        };
        let mut buf = vec![0xffu8; 64 * 3];
        r.encode_ext(&mut buf);
        assert_eq!(&buf[..4], &[3, 0, 0, 0]);
        assert_eq!((buf[4], buf[5], buf[9]), (1, 2, 1));
        assert_eq!(&buf[64..66], &[0xff, 0xff], "CNTLID FFFFh");
        assert_eq!(&buf[64 + 16..64 + 32], &[1; 16]);
        assert_eq!(Report::decode_ext(&buf).unwrap(), r);
        // A buffer for the header and one registrant.
        let mut short = vec![0u8; 128];
        r.encode_ext(&mut short);
        let d = Report::decode_ext(&short).unwrap();
        assert_eq!((d.regctl, d.registrants.len()), (2, 1));
    }
}
