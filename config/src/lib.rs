//! nvmf-target configuration: the YAML schema, its defaults and its validation.
//!
//! ```yaml
//! listeners:
//!   - { transport: tcp,  address: 0.0.0.0, port: 4420 }
//! subsystems:
//!   - nqn: nqn.2026-11.io.example:disk1
//!     allow_any_host: true
//!     namespaces:
//!       - { nsid: 1, path: /var/lib/nvmf/disk1.img, size: 1GiB }
//!       - { nsid: 2, null: 4GiB }
//! target: { threads: 2 }
//! ```
//!
//! [`Config::load`] reads a file, [`Config::from_yaml_str`] a string. Both report *every*
//! problem at once, each as `FILE:LINE:COLUMN: KEY.PATH: message`: unknown keys (with a
//! suggestion), missing keys, values of the wrong type, and the semantic rules of
//! `REFERENCE.md` (NQN syntax, duplicate NQNs and nsids, clashing listeners, sizes and block
//! sizes, files that must exist, limits of the `target` settings). Non-fatal findings come back
//! as warnings next to the configuration.
//!
//! The result is the *resolved* configuration: every default is filled in (serial numbers and
//! namespace UUIDs derived from the NQN, block sizes, ports, target settings), so the daemon
//! never consults defaults of its own, and [`Config::to_yaml`] prints exactly what will run.
//!
//! Loading stats the namespace paths (to tell files from block devices and directories and to
//! check that files exist) but never creates or opens them: creating a missing file at `size`
//! is the target's job.
//!
//! The model derives `serde::Serialize` (for [`Config::to_yaml`]) but deliberately not
//! `Deserialize`: serde stops at the first error and a derived decoder would skip validation.
//! Instead the text is parsed by saphyr-parser into a tree that keeps every node's position,
//! and a schema-driven decoder rejects unknown keys (what `deny_unknown_fields` would do),
//! missing keys and wrong types, all of them in one pass.
//!
//! Every key is documented on the field that holds it, and all of them on one page in
//! [`reference`](mod@reference) (the crate's `REFERENCE.md`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod decode;
mod error;
mod model;
mod nqn;
pub mod nvmetcli;
mod size;
mod validate;
mod yaml;

/// The configuration file reference (`config/REFERENCE.md`).
#[doc = include_str!("../REFERENCE.md")]
pub mod reference {}

use std::fs;
use std::path::{Path, PathBuf};

pub use error::{ConfigError, Diagnostic, Location, Severity};
pub use model::{
    default_dhchap_dhgroups, default_dhchap_hashes, default_serial, AnaState, Backing, C2hSuccess,
    Config, DhGroup, Gateway, HashId, Host, InvalidUuid, Key, Listener, Metrics, Namespace,
    Polling, PskKey, RbdImage, Subsystem, TargetSettings, TcpReceive, TcpSend, TlsMode, Transport,
    Uuid, DEFAULT_BLOCK_SIZE, DEFAULT_CEPH_CONF, DEFAULT_LEASE_SECS, DEFAULT_MODEL, DEFAULT_PORT,
    MAX_ANA_GROUP,
};
pub use nqn::{check_name_text, validate_nqn, InvalidNqn, DISCOVERY_NQN, NQN_MAX_BYTES};
pub use size::{Size, SizeError};
pub use validate::{MAX_IN_CAPSULE_DATA, MAX_IO_SIZE, MAX_SRQ_DEPTH, MIN_IO_SIZE, MIN_SRQ_DEPTH};

use error::Report;

/// NQN of the subsystem in [`Config::embedded_default`].
pub const DEFAULT_SUBSYSTEM_NQN: &str = "nqn.2026-11.io.nvmf-rs:default";

/// Configuration files larger than this are refused unread.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// A configuration that passed validation, and the warnings it drew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// The resolved configuration.
    pub config: Config,
    /// Non-fatal findings, in document order (print them; they do not stop the target).
    pub warnings: Vec<Diagnostic>,
}

impl Config {
    /// Reads and validates the configuration file at `path`.
    ///
    /// Relative namespace paths in the file are taken relative to the file's directory, and
    /// the returned configuration holds them joined to it.
    pub fn load(path: impl AsRef<Path>) -> Result<Loaded, ConfigError> {
        let path = path.as_ref();
        let read_error = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let len = fs::metadata(path).map_err(read_error)?.len();
        if len > MAX_FILE_BYTES {
            return Err(read_error(std::io::Error::other(format!(
                "the file is {len} bytes; configuration files are limited to {MAX_FILE_BYTES}"
            ))));
        }
        let bytes = fs::read(path).map_err(read_error)?;
        let origin = path.display().to_string();
        // The file may hold DH-HMAC-CHAP secrets: zeroed when dropped, as the scalars are.
        let text = match String::from_utf8(bytes) {
            Ok(text) => zeroize::Zeroizing::new(text),
            Err(e) => {
                let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
                let valid = std::str::from_utf8(valid).unwrap_or_default();
                let line = valid.matches('\n').count() + 1;
                let column = valid.rsplit('\n').next().unwrap_or("").chars().count() + 1;
                let mut r = Report::new(&origin);
                r.error_at(Location { line, column }, "", "the file is not valid UTF-8");
                let (errors, warnings) = r.finish();
                return Err(ConfigError::Invalid { errors, warnings });
            }
        };
        let base = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        parse(&text, &origin, Some(base))
    }

    /// Parses and validates YAML `text`; `origin` names it in diagnostics (a file name, or
    /// something like `<stdin>`). Relative namespace paths stay relative (to the working
    /// directory).
    pub fn from_yaml_str(text: &str, origin: &str) -> Result<Loaded, ConfigError> {
        parse(text, origin, None)
    }

    /// The resolved configuration as YAML with the secrets written in it, for writing the
    /// configuration file back: reading it back with [`Config::from_yaml_str`] gives an equal
    /// `Config` (with the same files present). Key files stay references to their files.
    pub fn to_yaml_with_secrets(&self) -> String {
        struct Reveal;
        impl Drop for Reveal {
            fn drop(&mut self) {
                model::REVEAL_SECRETS.with(|r| r.set(false));
            }
        }
        model::REVEAL_SECRETS.with(|r| r.set(true));
        let _reveal = Reveal;
        self.to_yaml()
    }

    /// The resolved configuration as YAML, every default written out, DH-HMAC-CHAP secrets
    /// written inline replaced by `<secret>` (what `--check-config` and `ctl list` show).
    pub fn to_yaml(&self) -> String {
        // Serialization of these types cannot fail: every map key is a string and every
        // value a string, number, bool, list or map. A failure would be a bug in this crate.
        match serde_yaml::to_string(self) {
            Ok(text) => text,
            Err(e) => unreachable!("serializing Config to YAML failed: {e}"),
        }
    }

    /// The configuration used when none is given: one subsystem
    /// [`DEFAULT_SUBSYSTEM_NQN`] that allows any host, with one 1GiB namespace (nsid 1) in
    /// the file `ns_path` (created by the target if missing), a TCP listener on
    /// 127.0.0.1:4420 and default target settings.
    pub fn embedded_default(ns_path: PathBuf) -> Config {
        Config {
            listeners: vec![Listener::new(
                Transport::Tcp,
                std::net::Ipv4Addr::LOCALHOST.into(),
                DEFAULT_PORT,
            )],
            subsystems: vec![Subsystem {
                nqn: DEFAULT_SUBSYSTEM_NQN.to_owned(),
                allow_any_host: true,
                dhchap_hashes: model::default_dhchap_hashes(),
                dhchap_dhgroups: model::default_dhchap_dhgroups(),
                hosts: Vec::new(),
                serial: default_serial(DEFAULT_SUBSYSTEM_NQN),
                model: DEFAULT_MODEL.to_owned(),
                namespaces: vec![Namespace {
                    nsid: 1,
                    backing: Backing::File {
                        path: ns_path,
                        size: Some(Size::gib(1)),
                    },
                    block_size: Some(DEFAULT_BLOCK_SIZE),
                    read_only: false,
                    ana_group: 1,
                    uuid: Uuid::derived(DEFAULT_SUBSYSTEM_NQN, 1),
                }],
            }],
            target: TargetSettings::default(),
            metrics: None,
            gateway: None,
        }
    }

    /// Runs the semantic checks of [`Config::load`] on a configuration built in code (such as
    /// [`Config::embedded_default`]). Diagnostics carry no position; their origin is
    /// `<config>`. Returns the warnings.
    pub fn validate(&self) -> Result<Vec<Diagnostic>, ConfigError> {
        let mut r = Report::new("<config>");
        validate::config(&mut self.clone(), &decode::ItemPaths::natural(self), &mut r);
        let (errors, warnings) = r.finish();
        if errors.is_empty() {
            Ok(warnings)
        } else {
            Err(ConfigError::Invalid { errors, warnings })
        }
    }
}

fn parse(text: &str, origin: &str, base_dir: Option<&Path>) -> Result<Loaded, ConfigError> {
    let mut r = Report::new(origin);
    match yaml::parse(text) {
        Err(e) => r.error_at(e.at, "", e.message),
        Ok(root) => {
            let (mut config, paths) = decode::config(&root, base_dir, &mut r);
            validate::config(&mut config, &paths, &mut r);
            let (errors, warnings) = r.finish();
            return if errors.is_empty() {
                Ok(Loaded { config, warnings })
            } else {
                Err(ConfigError::Invalid { errors, warnings })
            };
        }
    }
    let (errors, warnings) = r.finish();
    Err(ConfigError::Invalid { errors, warnings })
}
