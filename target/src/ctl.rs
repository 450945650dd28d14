//! Live management: `nvmf-target ctl ...` and the JSON requests behind it on the control
//! socket. A request is one line of JSON, `{"version":1,"op":"add-host",...}`; the answer is one
//! line, `{"ok":true,...}` or `{"ok":false,"error":"..."}`. Each change is made to the running
//! configuration ([`apply`], pure), validated like a configuration file (errors name the
//! field), applied by the same machinery as a SIGHUP reload, and with `persist` written back to
//! the `--config` file (write, fsync, rename; the old file kept as `<file>.bak`).

use std::io;
use std::net::IpAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use config::{
    default_serial, AnaState, Backing, Config, Listener, Namespace, Size, Subsystem, Transport,
    Uuid, DEFAULT_BLOCK_SIZE, DEFAULT_MODEL,
};
use serde::{Deserialize, Serialize};

/// The protocol version this daemon speaks.
pub const VERSION: u32 = 1;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub version: u32,
    #[serde(flatten)]
    pub op: Op,
    /// Write the resulting configuration back to the `--config` file.
    #[serde(default)]
    pub persist: bool,
}

/// What to change (or `list`: nothing). The `nvmf-target ctl` subcommands are these, and the
/// JSON requests carry them (`"op"`: the subcommand's name; the fields as named here).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Subcommand)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    /// The running configuration (YAML; with --json the daemon's JSON answer).
    List,
    /// Add a subsystem (no namespaces, no hosts).
    AddSubsystem {
        nqn: String,
        #[serde(default)]
        #[arg(long)]
        allow_any_host: bool,
        #[serde(default)]
        #[arg(long)]
        serial: Option<String>,
    },
    /// Remove a subsystem (its hosts are disconnected).
    RemoveSubsystem { nqn: String },
    /// Add a namespace backed by a file or block device (--path) or a null device (--null).
    AddNamespace {
        nqn: String,
        #[arg(long)]
        nsid: u32,
        #[serde(default)]
        #[arg(long, conflicts_with = "null", required_unless_present = "null")]
        path: Option<PathBuf>,
        /// With --path: the size a missing file is created with (e.g. 1GiB).
        #[serde(default)]
        #[arg(long, requires = "path")]
        size: Option<String>,
        /// A null namespace of this size (e.g. 1GiB).
        #[serde(default)]
        #[arg(long)]
        null: Option<String>,
        #[serde(default)]
        #[arg(long)]
        read_only: bool,
        /// The ANA group (1-128) the namespace belongs to.
        #[serde(default = "one")]
        #[arg(long, default_value_t = 1)]
        ana_group: u32,
    },
    /// Remove a namespace (hosts get the Namespace Attribute Changed event).
    RemoveNamespace {
        nqn: String,
        #[arg(long)]
        nsid: u32,
    },
    /// Grow a namespace (a file is extended; a null namespace gets the new size); connected
    /// hosts get the Namespace Attribute Changed event and see the new size. Shrinking would
    /// drop data and is refused; a block device's size is the device's.
    ResizeNamespace {
        nqn: String,
        #[arg(long)]
        nsid: u32,
        /// The new size (e.g. 2GiB), a multiple of the block size.
        #[arg(long)]
        size: String,
    },
    /// Allow a host NQN on a subsystem.
    AddHost { nqn: String, host: String },
    /// Take a host NQN off a subsystem's list (connected hosts stay).
    RemoveHost { nqn: String, host: String },
    /// Set a subsystem's allow_any_host (true or false).
    AllowAnyHost {
        nqn: String,
        #[arg(action = clap::ArgAction::Set)]
        allow: bool,
    },
    /// Set (or rotate) a host's TLS pre-shared key on a subsystem from a key file (the
    /// `NVMeTLSkey-1:...` text, mode 0600; the file stays the key's home, as `tls_psk_file`),
    /// or remove it with --clear. New connections use the new key; connected hosts keep their
    /// channel.
    SetTlsPsk {
        nqn: String,
        host: String,
        #[serde(default)]
        #[arg(long, required_unless_present = "clear", conflicts_with = "clear")]
        file: Option<PathBuf>,
        #[serde(default)]
        #[arg(long)]
        clear: bool,
    },
    /// Add a listener (--tls required|allowed: NVMe/TCP over TLS).
    AddListener {
        #[arg(value_parser = parse_transport)]
        transport: Transport,
        address: IpAddr,
        port: u16,
        #[serde(default)]
        #[arg(long, value_parser = parse_tls_mode)]
        tls: Option<config::TlsMode>,
    },
    /// Remove a listener (connected hosts stay).
    RemoveListener {
        #[arg(value_parser = parse_transport)]
        transport: Transport,
        address: IpAddr,
        port: u16,
    },
    /// Set a listener's ANA state for an ANA group (optimized, non-optimized, inaccessible,
    /// persistent-loss, change): hosts connected through it get the ANA change event.
    SetAnaState {
        #[arg(value_parser = parse_transport)]
        transport: Transport,
        address: IpAddr,
        port: u16,
        group: u32,
        #[arg(value_parser = parse_ana_state)]
        state: AnaState,
    },
}

fn one() -> u32 {
    1
}

fn parse_ana_state(s: &str) -> Result<AnaState, String> {
    AnaState::from_name(s).ok_or_else(|| {
        format!(
            "unknown ANA state `{s}` (optimized, non-optimized, inaccessible, persistent-loss, \
             change)"
        )
    })
}

fn parse_tls_mode(s: &str) -> Result<config::TlsMode, String> {
    match s {
        "required" => Ok(config::TlsMode::Required),
        "allowed" => Ok(config::TlsMode::Allowed),
        _ => Err(format!("`{s}`: required or allowed")),
    }
}

/// A TLS PSK key file: private to its owner, one `NVMeTLSkey-1:` key (never quoted in errors).
fn read_psk_file(file: &std::path::Path) -> Result<config::PskKey, String> {
    use std::os::unix::fs::PermissionsExt;
    let what = file.display();
    let meta = std::fs::metadata(file).map_err(|e| format!("{what}: {e}"))?;
    let mode = meta.permissions().mode() & 0o777;
    if !meta.is_file() || mode & 0o077 != 0 {
        return Err(format!(
            "{what}: a key file must be a regular file private to its owner (mode {mode:04o}; chmod 600 it)"
        ));
    }
    let text =
        zeroize::Zeroizing::new(std::fs::read_to_string(file).map_err(|e| format!("{what}: {e}"))?);
    let psk = nvme::tls::ConfiguredPsk::parse(&text)
        .map_err(|e| format!("{what}: not a TLS PSK: {e}"))?;
    Ok(config::PskKey {
        file: Some(file.to_owned()),
        psk,
    })
}

fn parse_transport(s: &str) -> Result<Transport, String> {
    match s {
        "tcp" => Ok(Transport::Tcp),
        "rdma" => Ok(Transport::Rdma),
        _ => Err(format!("`{s}`: tcp or rdma")),
    }
}

impl Op {
    /// Whether the request changes the configuration.
    pub fn changes(&self) -> bool {
        !matches!(self, Op::List)
    }
}

fn subsystem<'a>(cfg: &'a mut Config, nqn: &str) -> Result<&'a mut Subsystem, String> {
    cfg.subsystems
        .iter_mut()
        .find(|s| s.nqn == nqn)
        .ok_or_else(|| format!("no subsystem {nqn}"))
}

fn size(field: &str, text: &str) -> Result<Size, String> {
    text.parse::<Size>().map_err(|e| format!("{field}: {e}"))
}

/// The configuration `op` makes of `cfg`, before validation. Errors say what does not exist or
/// already does; everything else is left to the configuration's own checks.
pub fn apply(cfg: &Config, op: &Op) -> Result<Config, String> {
    let mut new = cfg.clone();
    match op {
        Op::List => {}
        Op::AddSubsystem {
            nqn,
            allow_any_host,
            serial,
        } => {
            if new.subsystems.iter().any(|s| &s.nqn == nqn) {
                return Err(format!("subsystem {nqn} exists already"));
            }
            new.subsystems.push(Subsystem {
                nqn: nqn.clone(),
                allow_any_host: *allow_any_host,
                hosts: Vec::new(),
                dhchap_hashes: config::default_dhchap_hashes(),
                dhchap_dhgroups: config::default_dhchap_dhgroups(),
                serial: serial.clone().unwrap_or_else(|| default_serial(nqn)),
                model: DEFAULT_MODEL.to_owned(),
                namespaces: Vec::new(),
            });
        }
        Op::RemoveSubsystem { nqn } => {
            let before = new.subsystems.len();
            new.subsystems.retain(|s| &s.nqn != nqn);
            if new.subsystems.len() == before {
                return Err(format!("no subsystem {nqn}"));
            }
        }
        Op::AddNamespace {
            nqn,
            nsid,
            path,
            size: file_size,
            null,
            read_only,
            ana_group,
        } => {
            let (backing, block_size) = match (path, null) {
                (Some(p), None) => {
                    let blkdev = std::fs::metadata(p)
                        .map(|m| m.file_type().is_block_device())
                        .unwrap_or(false);
                    let size = file_size.as_deref().map(|t| size("size", t)).transpose()?;
                    let bs = if blkdev {
                        None
                    } else {
                        Some(DEFAULT_BLOCK_SIZE)
                    };
                    (
                        Backing::File {
                            path: p.clone(),
                            size,
                        },
                        bs,
                    )
                }
                (None, Some(n)) => (
                    Backing::Null {
                        size: size("null", n)?,
                    },
                    Some(DEFAULT_BLOCK_SIZE),
                ),
                _ => return Err("a namespace needs exactly one of `path` and `null`".into()),
            };
            let s = subsystem(&mut new, nqn)?;
            s.namespaces.push(Namespace {
                nsid: *nsid,
                backing,
                block_size,
                read_only: *read_only,
                ana_group: *ana_group,
                uuid: Uuid::derived(nqn, *nsid),
            });
        }
        Op::RemoveNamespace { nqn, nsid } => {
            let s = subsystem(&mut new, nqn)?;
            let before = s.namespaces.len();
            s.namespaces.retain(|n| n.nsid != *nsid);
            if s.namespaces.len() == before {
                return Err(format!("subsystem {nqn} has no namespace {nsid}"));
            }
        }
        Op::ResizeNamespace {
            nqn,
            nsid,
            size: text,
        } => {
            let want = size("size", text)?;
            let s = subsystem(&mut new, nqn)?;
            let ns = s
                .namespaces
                .iter_mut()
                .find(|n| n.nsid == *nsid)
                .ok_or_else(|| format!("subsystem {nqn} has no namespace {nsid}"))?;
            let bs = u64::from(ns.block_size.unwrap_or(DEFAULT_BLOCK_SIZE));
            if want.bytes() == 0 || want.bytes() % bs != 0 {
                return Err(format!(
                    "size: {text} is not a non-zero multiple of the block size {bs}"
                ));
            }
            let now = match &ns.backing {
                Backing::Null { size } => size.bytes(),
                Backing::Rbd(img) => {
                    return Err(format!(
                        "namespace {nsid} is the RBD image {}/{}: it has the image's size \
                         (`rbd resize` it; the target sees the change)",
                        img.pool, img.image
                    ))
                }
                Backing::File { path, .. } => {
                    let m =
                        std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
                    if m.file_type().is_block_device() {
                        return Err(format!(
                            "{}: a block device's size is the device's",
                            path.display()
                        ));
                    }
                    m.len()
                }
            };
            if want.bytes() < now {
                return Err(format!(
                    "shrinking namespace {nsid} from {now} to {} bytes would drop data; not done",
                    want.bytes()
                ));
            }
            match &mut ns.backing {
                Backing::Null { size } => *size = want,
                Backing::File { size, .. } => *size = Some(want),
                Backing::Rbd(_) => unreachable!("refused above"),
            }
        }
        Op::AddHost { nqn, host } => {
            let s = subsystem(&mut new, nqn)?;
            if s.hosts.iter().any(|h| &h.nqn == host) {
                return Err(format!("{host} is allowed on {nqn} already"));
            }
            s.hosts.push(config::Host::plain(host.clone()));
        }
        Op::RemoveHost { nqn, host } => {
            let s = subsystem(&mut new, nqn)?;
            let before = s.hosts.len();
            s.hosts.retain(|h| &h.nqn != host);
            if s.hosts.len() == before {
                return Err(format!("{host} is not on the host list of {nqn}"));
            }
        }
        Op::AllowAnyHost { nqn, allow } => subsystem(&mut new, nqn)?.allow_any_host = *allow,
        Op::SetTlsPsk {
            nqn,
            host,
            file,
            clear,
        } => {
            let key = match (file, clear) {
                (_, true) => None,
                (Some(f), false) => Some(read_psk_file(f)?),
                (None, false) => return Err("give --file KEYFILE or --clear".into()),
            };
            let s = subsystem(&mut new, nqn)?;
            let h = s.hosts.iter_mut().find(|h| &h.nqn == host).ok_or_else(|| {
                format!("{host} is not on the host list of {nqn} (add-host first)")
            })?;
            h.tls_psk = key;
        }
        Op::AddListener {
            transport,
            address,
            port,
            tls,
        } => {
            let mut l = Listener::new(*transport, *address, *port);
            l.tls = *tls;
            if new
                .listeners
                .iter()
                .any(|e| e.transport == l.transport && e.address == l.address && e.port == l.port)
            {
                return Err(format!(
                    "listener {transport} {address} {port} exists already"
                ));
            }
            new.listeners.push(l);
        }
        Op::RemoveListener {
            transport,
            address,
            port,
        } => {
            let before = new.listeners.len();
            new.listeners.retain(|l| {
                !(l.transport == *transport && l.address == *address && l.port == *port)
            });
            if new.listeners.len() == before {
                return Err(format!("no listener {transport} {address} {port}"));
            }
        }
        Op::SetAnaState {
            transport,
            address,
            port,
            group,
            state,
        } => {
            let l = new
                .listeners
                .iter_mut()
                .find(|l| l.transport == *transport && l.address == *address && l.port == *port)
                .ok_or_else(|| format!("no listener {transport} {address} {port}"))?;
            if !(1..=config::MAX_ANA_GROUP).contains(group) {
                return Err(format!(
                    "ANA group {group} is not 1 to {}",
                    config::MAX_ANA_GROUP
                ));
            }
            // Optimized is the default: keep the map to what differs from it.
            if *state == AnaState::Optimized {
                l.ana.remove(group);
            } else {
                l.ana.insert(*group, *state);
            }
        }
    }
    Ok(new)
}

/// What `op` needs done outside the configuration before the reload applies `new`: a resized
/// file namespace's file is extended to its new size (the reload then sees the length change
/// and re-adds the namespace, raising the event).
pub fn prepare(new: &Config, op: &Op) -> io::Result<()> {
    let Op::ResizeNamespace { nqn, nsid, .. } = op else {
        return Ok(());
    };
    let ns = new
        .subsystems
        .iter()
        .find(|s| &s.nqn == nqn)
        .and_then(|s| s.namespaces.iter().find(|n| n.nsid == *nsid));
    if let Some(Namespace {
        backing: Backing::File {
            path,
            size: Some(size),
        },
        ..
    }) = ns
    {
        let f = std::fs::OpenOptions::new().write(true).open(path)?;
        if f.metadata()?.len() < size.bytes() {
            f.set_len(size.bytes())?;
            f.sync_all()?;
        }
    }
    Ok(())
}

/// Writes `cfg` to `path` crash-safely (`resv_store::replace`), keeping the old file as
/// `<path>.bak` (a hard link, or a copy).
pub fn persist(cfg: &Config, path: &Path) -> io::Result<()> {
    let text = format!(
        "# Written by `nvmf-target ctl --persist` (the previous file is {}.bak).\n{}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        cfg.to_yaml_with_secrets()
    );
    if path.exists() {
        let mut bak = path.as_os_str().to_owned();
        bak.push(".bak");
        let bak = PathBuf::from(bak);
        let _ = std::fs::remove_file(&bak);
        std::fs::hard_link(path, &bak).or_else(|_| std::fs::copy(path, &bak).map(drop))?;
    }
    crate::resv_store::replace(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Config {
        Config::from_yaml_str(
            "listeners:\n  - { transport: tcp, address: 127.0.0.1, port: 4420 }\n\
             subsystems:\n  - nqn: nqn.2026-11.io.example:a\n    hosts: [ \"nqn.2026-11.io.example:h1\" ]\n    namespaces:\n\
             \x20     - { nsid: 1, null: 1GiB }\n",
            "t.yaml",
        )
        .unwrap()
        .config
    }

    const A: &str = "nqn.2026-11.io.example:a";

    #[test]
    fn requests_round_trip_as_json() {
        let r = Request {
            version: VERSION,
            op: Op::AddNamespace {
                nqn: A.into(),
                nsid: 2,
                path: None,
                size: None,
                null: Some("64MiB".into()),
                read_only: true,
                ana_group: 2,
            },
            persist: true,
        };
        let j = serde_json::to_string(&r).unwrap();
        assert!(j.contains(r#""op":"add-namespace""#), "{j}");
        assert_eq!(serde_json::from_str::<Request>(&j).unwrap(), r);
        let l: Request = serde_json::from_str(r#"{"version":1,"op":"list"}"#).unwrap();
        assert_eq!(l.op, Op::List);
        assert!(serde_json::from_str::<Request>(r#"{"version":1,"op":"format-disk"}"#).is_err());
    }

    #[test]
    fn each_change_and_its_refusals() {
        let c = base();
        let add_ns = |nsid, null: &str| Op::AddNamespace {
            nqn: A.into(),
            nsid,
            path: None,
            size: None,
            null: Some(null.into()),
            read_only: false,
            ana_group: 1,
        };
        let n = apply(&c, &add_ns(2, "64MiB")).unwrap();
        assert_eq!(n.subsystems[0].namespaces.len(), 2);
        n.validate().unwrap();
        // A duplicate nsid passes `apply` and is caught by the configuration's checks, which
        // name the field.
        let dup = apply(&c, &add_ns(1, "64MiB")).unwrap();
        let e = dup.validate().unwrap_err().to_string();
        assert!(e.contains("subsystems[0].namespaces[1].nsid"), "{e}");
        assert!(apply(&c, &add_ns(3, "lots")).unwrap_err().contains("null"));
        assert!(apply(
            &c,
            &Op::RemoveNamespace {
                nqn: A.into(),
                nsid: 9
            }
        )
        .is_err());
        let h = apply(
            &c,
            &Op::AddHost {
                nqn: A.into(),
                host: "nqn.2026-11.io.example:h2".into(),
            },
        )
        .unwrap();
        assert_eq!(h.subsystems[0].hosts.len(), 2);
        assert!(apply(
            &c,
            &Op::AddHost {
                nqn: A.into(),
                host: "nqn.2026-11.io.example:h1".into()
            }
        )
        .is_err());
        let r = apply(
            &c,
            &Op::RemoveHost {
                nqn: A.into(),
                host: "nqn.2026-11.io.example:h1".into(),
            },
        )
        .unwrap();
        assert!(r.subsystems[0].hosts.is_empty());
        let s = apply(
            &c,
            &Op::AddSubsystem {
                nqn: "nqn.2026-11.io.example:b".into(),
                allow_any_host: true,
                serial: None,
            },
        )
        .unwrap();
        s.validate().unwrap();
        assert!(apply(&s, &Op::RemoveSubsystem { nqn: A.into() })
            .unwrap()
            .subsystems
            .iter()
            .all(|x| x.nqn != A));
        let l = Op::AddListener {
            transport: Transport::Tcp,
            address: "127.0.0.1".parse().unwrap(),
            port: 4421,
            tls: Some(config::TlsMode::Required),
        };
        let two = apply(&c, &l).unwrap();
        assert_eq!(two.listeners.len(), 2);
        assert_eq!(two.listeners[1].tls, Some(config::TlsMode::Required));
        assert!(apply(&two, &l).is_err());
        let resize = |size: &str| {
            apply(
                &c,
                &Op::ResizeNamespace {
                    nqn: A.into(),
                    nsid: 1,
                    size: size.into(),
                },
            )
        };
        let g = resize("2GiB").unwrap();
        assert!(
            matches!(g.subsystems[0].namespaces[0].backing, Backing::Null { size } if size.bytes() == 2 << 30)
        );
        assert!(resize("512MiB").unwrap_err().contains("would drop data"));
        assert!(resize("1000000").unwrap_err().contains("block size"));
        let bad = apply(
            &c,
            &Op::AllowAnyHost {
                nqn: "nqn.2026-11.io.example:zz".into(),
                allow: true,
            },
        );
        assert!(bad.unwrap_err().contains("no subsystem"));
    }
}
