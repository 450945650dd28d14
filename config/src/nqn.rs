//! NVMe Qualified Names (NVMe Base Specification 2.0, §4.5).

/// The well-known NQN of a discovery subsystem (NVMe Base 2.0 §4.5, NVMe-oF 1.1 §5).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Longest NQN in bytes, not counting the terminating NUL (the wire field is 256 bytes; §4.5:
/// "The maximum name is 223 bytes in length").
pub const NQN_MAX_BYTES: usize = 223;

const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// Why a string is not a valid NQN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidNqn(String);

/// Checks that `nqn` has one of the two forms of NVMe Base 2.0 §4.5:
///
/// - `nqn.yyyy-mm.<reverse domain>:<string>`, where `yyyy-mm` is a date (month 01–12), the
///   reverse domain is dot-separated labels of letters, digits and inner hyphens (at most 63
///   characters each), and `<string>` is non-empty UTF-8;
/// - `nqn.2014-08.org.nvmexpress:uuid:<uuid>`, with the UUID as 8-4-4-4-12 hex digits.
///
/// The whole name is at most 223 bytes and holds no control characters (it travels as a
/// NUL-terminated string). The discovery NQN itself is accepted ([`DISCOVERY_NQN`]); callers
/// that name a subsystem or a host must reject it themselves.
pub fn validate_nqn(nqn: &str) -> Result<(), InvalidNqn> {
    let bad = |why: String| Err(InvalidNqn(why));
    check_name_text(nqn)?;
    if nqn == DISCOVERY_NQN {
        return Ok(());
    }
    let Some(rest) = nqn.strip_prefix("nqn.") else {
        return bad("NQN must start with `nqn.`".into());
    };
    if let Some(uuid) = nqn.strip_prefix(UUID_NQN_PREFIX) {
        return if is_uuid_text(uuid) {
            Ok(())
        } else {
            bad(format!(
                "`{uuid}` after `{UUID_NQN_PREFIX}` is not a UUID \
                 (expected 8-4-4-4-12 hex digits)"
            ))
        };
    }
    let date_ok = rest.len() >= 8
        && rest.as_bytes()[..4].iter().all(u8::is_ascii_digit)
        && rest.as_bytes()[4] == b'-'
        && matches!(rest.get(5..7), Some(m) if m.bytes().all(|b| b.is_ascii_digit())
            && (1..=12).contains(&m.parse::<u8>().unwrap_or(0)))
        && rest.as_bytes()[7] == b'.';
    if !date_ok {
        return bad(
            "NQN must continue with a date `yyyy-mm.` after `nqn.` (e.g. nqn.2026-11.)".into(),
        );
    }
    let rest = &rest[8..];
    let Some((domain, name)) = rest.split_once(':') else {
        return bad(
            "NQN must have the form nqn.yyyy-mm.<reverse domain>:<name> (no `:` found)".into(),
        );
    };
    if name.is_empty() {
        return bad("NQN has nothing after the `:`".into());
    }
    if domain.is_empty() {
        return bad("NQN has no reverse domain name between the date and the `:`".into());
    }
    for label in domain.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return bad(format!(
                "`{domain}` is not a reverse domain name: label `{label}` must be 1-63 letters, \
                 digits or inner hyphens"
            ));
        }
    }
    Ok(())
}

/// What any name that travels as an NQN must be, well-formed or not: 1 to 223 bytes of UTF-8
/// without control characters (the wire field is a NUL-terminated 256-byte string). nvmet takes
/// any subsystem name that passes this (tutorials and test suites use names like `testnqn`).
pub fn check_name_text(nqn: &str) -> Result<(), InvalidNqn> {
    let bad = |why: String| Err(InvalidNqn(why));
    if nqn.is_empty() {
        return bad("the name is empty".into());
    }
    if nqn.len() > NQN_MAX_BYTES {
        return bad(format!(
            "NQN is {} bytes long; the limit is {NQN_MAX_BYTES} bytes (UTF-8)",
            nqn.len()
        ));
    }
    if let Some(c) = nqn.chars().find(|c| c.is_control()) {
        return bad(format!("NQN contains the control character {c:?}"));
    }
    Ok(())
}

/// `true` if `s` is a UUID in 8-4-4-4-12 hex-digit form.
pub(crate) fn is_uuid_text(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_names() {
        for nqn in [
            "nqn.2026-11.io.example:disk1",
            "nqn.2014-08.org.nvmexpress:uuid:0c7b7e4a-1f2e-4c3d-9a8b-7c6d5e4f3a2b",
            "nqn.2014-08.org.nvmexpress:uuid:0C7B7E4A-1F2E-4C3D-9A8B-7C6D5E4F3A2B",
            "nqn.1988-11.com.dell:powerstore:00:a7b2c3",
            "nqn.2016-06.io.spdk:cnode1",
            "nqn.2026-01.x:ü-name with spaces",
            DISCOVERY_NQN,
        ] {
            assert_eq!(validate_nqn(nqn), Ok(()), "{nqn}");
        }
        let longest = format!("nqn.2026-11.io.example:{}", "a".repeat(223 - 23));
        assert_eq!(longest.len(), 223);
        assert_eq!(validate_nqn(&longest), Ok(()));
    }

    #[test]
    fn rejects_invalid_names() {
        let too_long = format!("nqn.2026-11.io.example:{}", "a".repeat(223 - 22));
        let cases: &[(&str, &str)] = &[
            ("", "the name is empty"),
            ("iqn.2026-11.io.example:x", "must start with `nqn.`"),
            ("nqn.26-11.io.example:x", "date"),
            ("nqn.2026-13.io.example:x", "date"),
            ("nqn.2026-00.io.example:x", "date"),
            ("nqn.2026-1.io.example:x", "date"),
            ("nqn.2026-11io.example:x", "date"),
            ("nqn.2026-11.io.example", "no `:` found"),
            ("nqn.2026-11.io.example:", "nothing after"),
            ("nqn.2026-11.:x", "no reverse domain"),
            ("nqn.2026-11.io..example:x", "label ``"),
            ("nqn.2026-11.io.-example:x", "label `-example`"),
            ("nqn.2026-11.io.ex_ample:x", "label `ex_ample`"),
            ("nqn.2014-08.org.nvmexpress:uuid:1234", "is not a UUID"),
            (
                "nqn.2014-08.org.nvmexpress:uuid:0c7b7e4a-1f2e-4c3d-9a8b-7c6d5e4f3a2g",
                "not a UUID",
            ),
            ("nqn.2026-11.io.example:a\nb", "control character"),
            (&too_long, "224 bytes"),
        ];
        for &(nqn, fragment) in cases {
            let err = validate_nqn(nqn).unwrap_err().to_string();
            assert!(err.contains(fragment), "{nqn:?}: {err}");
        }
    }
}
