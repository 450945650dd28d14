//! Semantic checks on a decoded configuration, and the defaults that depend on the file system.
//!
//! Every check runs and reports; nothing stops at the first problem.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::decode::ItemPaths;
use crate::error::{join, Report};
use crate::model::{
    Backing, Config, Namespace, Subsystem, TargetSettings, Uuid, DEFAULT_BLOCK_SIZE,
};
use crate::nqn::{check_name_text, validate_nqn, DISCOVERY_NQN};
use crate::size::Size;

/// Smallest non-zero `rdma_srq_depth`: one full admin queue (32 commands).
pub const MIN_SRQ_DEPTH: u32 = 32;
/// Largest `rdma_srq_depth`.
pub const MAX_SRQ_DEPTH: u32 = 65_536;
/// Largest `in_capsule_data`.
pub const MAX_IN_CAPSULE_DATA: Size = Size::kib(128);
/// Smallest `max_io_size` (one memory page, CAP.MPSMIN = 4KiB).
pub const MIN_IO_SIZE: Size = Size::kib(4);
/// Largest `max_io_size`.
pub const MAX_IO_SIZE: Size = Size::mib(32);
/// Largest `io_unit_size` (one pool buffer).
pub const MAX_IO_UNIT: Size = Size::mib(4);

/// Checks `config` and fills in the block size of file-backed namespaces that are not block
/// devices (which needs a look at the file system).
pub(crate) fn config(config: &mut Config, paths: &ItemPaths, r: &mut Report) {
    listeners(config, &paths.listeners, r);
    let mut names: HashMap<String, String> = HashMap::new();
    let mut uuids: HashMap<[u8; 16], String> = HashMap::new();
    let mut files: HashMap<PathBuf, String> = HashMap::new();
    for (i, s) in config.subsystems.iter_mut().enumerate() {
        let path = &paths.subsystems[i];
        subsystem(s, path, &paths.namespaces[i], r);
        let nqn_path = join(path, "nqn");
        match names.get(s.nqn.as_str()) {
            Some(first) => r.error(
                &nqn_path,
                format!(
                    "duplicate subsystem NQN `{}` (first used at {first})",
                    s.nqn
                ),
            ),
            None => {
                names.insert(s.nqn.clone(), r.line_of(&nqn_path));
            }
        }
        for (j, ns) in s.namespaces.iter_mut().enumerate() {
            let ns_path = &paths.namespaces[i][j];
            let uuid_path = join(ns_path, "uuid");
            // Derived UUIDs can only collide when the NQN or the nsid is a duplicate, which is
            // reported already.
            let derived = ns.uuid == Uuid::derived(&s.nqn, ns.nsid);
            match uuids.get(&ns.uuid.0) {
                Some(first) if !derived => r.error(
                    &uuid_path,
                    format!(
                        "duplicate namespace UUID {} (first used at {first})",
                        ns.uuid
                    ),
                ),
                Some(_) => {}
                None => {
                    uuids.insert(ns.uuid.0, r.line_of(&uuid_path));
                }
            }
            backing(ns, ns_path, r);
            if let Backing::File { path: file, .. } = &ns.backing {
                let key = fs::canonicalize(file).unwrap_or_else(|_| file.clone());
                let file_path = join(ns_path, "path");
                match files.get(&key) {
                    Some(first) => r.warn(
                        &file_path,
                        format!(
                            "`{}` also backs the namespace at {first}; writes through one \
                             change the other",
                            file.display()
                        ),
                    ),
                    None => {
                        files.insert(key, r.line_of(&file_path));
                    }
                }
            }
        }
    }
    // What each listener serves must exist; ANA groups it names should have namespaces.
    let groups: std::collections::BTreeSet<u32> = config
        .subsystems
        .iter()
        .flat_map(|s| s.namespaces.iter().map(|n| n.ana_group))
        .collect();
    for (i, l) in config.listeners.iter().enumerate() {
        let lp = &paths.listeners[i];
        for (j, nqn) in l.subsystems.iter().flatten().enumerate() {
            if !config.subsystems.iter().any(|s| &s.nqn == nqn) {
                r.error(
                    &format!("{lp}.subsystems[{j}]"),
                    format!("no subsystem `{nqn}` is configured"),
                );
            }
        }
        for g in l.ana.keys().filter(|g| !groups.contains(g)) {
            r.warn(
                &format!("{lp}.ana.{g}"),
                format!("no namespace is in ANA group {g}"),
            );
        }
        if l.tls == Some(crate::TlsMode::Required)
            && l.transport == crate::Transport::Tcp
            && !config
                .subsystems
                .iter()
                .filter(|s| l.serves(&s.nqn))
                .any(|s| s.hosts.iter().any(|h| h.tls_psk.is_some()))
        {
            r.warn(
                &join(lp, "tls"),
                "no host can connect: TLS is required and no host of the subsystems it serves \
                 has a `tls_psk`",
            );
        }
    }
    if !config.listeners.iter().any(|l| l.tls.is_some()) {
        for (i, s) in config.subsystems.iter().enumerate() {
            for (j, h) in s.hosts.iter().enumerate() {
                if h.tls_psk.is_some() {
                    r.warn(
                        &format!("{}.hosts[{j}].tls_psk", paths.subsystems[i]),
                        "no listener has `tls`: the key is not used",
                    );
                }
            }
        }
    }
    target(&config.target, r);
    if let Some(g) = &config.gateway {
        gateway(config, g, paths, r);
    }
    if let Some(m) = &config.metrics {
        if m.listen.port() == 0 {
            r.error("metrics.listen", "port 0 is not allowed");
        }
        for (i, l) in config.listeners.iter().enumerate() {
            let listener = &paths.listeners[i];
            if l.transport == crate::Transport::Tcp
                && l.port == m.listen.port()
                && overlap(l.address, m.listen.ip())
            {
                r.error(
                    "metrics.listen",
                    format!(
                        "{} clashes with the TCP listener {listener} ({}:{}, {})",
                        m.listen,
                        l.address,
                        l.port,
                        r.line_of(listener)
                    ),
                );
            }
        }
    }
}

/// Same address, or one of them is the wildcard of the other's family.
fn overlap(a: IpAddr, b: IpAddr) -> bool {
    a == b || (a.is_ipv4() == b.is_ipv4() && (a.is_unspecified() || b.is_unspecified()))
}

fn listeners(config: &Config, paths: &[String], r: &mut Report) {
    for (i, l) in config.listeners.iter().enumerate() {
        let path = &paths[i];
        if l.port == 0 {
            r.error(&join(path, "port"), "port 0 is not allowed");
            continue;
        }
        if let IpAddr::V4(v4) = l.address {
            if v4.is_broadcast() || v4.is_multicast() {
                r.error(
                    &join(path, "address"),
                    format!("{v4} is not a unicast address"),
                );
            }
        } else if l.address.is_multicast() {
            r.error(
                &join(path, "address"),
                format!("{} is not a unicast address", l.address),
            );
        }
        if l.tls.is_some() && l.transport != crate::Transport::Tcp {
            r.error(
                &join(path, "tls"),
                "TLS is NVMe/TCP's secure channel: only a tcp listener has `tls`",
            );
        }
        let earlier = config.listeners[..i].iter().position(|e| {
            e.transport == l.transport && e.port == l.port && overlap(e.address, l.address)
        });
        if let Some(e) = earlier {
            let first = &config.listeners[e];
            let why = if first.address == l.address {
                "the same transport, address and port as".to_owned()
            } else {
                format!(
                    "an overlapping address ({} covers {}) on the same transport and port as",
                    if first.address.is_unspecified() {
                        first.address
                    } else {
                        l.address
                    },
                    if first.address.is_unspecified() {
                        l.address
                    } else {
                        first.address
                    },
                )
            };
            r.error(
                &join(path, "port"),
                format!(
                    "{} {}:{} has {why} {} ({})",
                    l.transport,
                    l.address,
                    l.port,
                    paths[e],
                    r.line_of(&paths[e])
                ),
            );
        }
    }
}

fn subsystem(s: &Subsystem, path: &str, ns_paths: &[String], r: &mut Report) {
    let nqn_path = join(path, "nqn");
    if s.nqn == DISCOVERY_NQN {
        r.error(
            &nqn_path,
            "this is the discovery subsystem's NQN; choose another name",
        );
    } else if let Err(e) = check_name_text(&s.nqn) {
        r.error(&nqn_path, e.to_string());
    } else if let Err(e) = validate_nqn(&s.nqn) {
        // nvmet takes any subsystem name; hosts connect with exactly this one.
        r.warn(
            &nqn_path,
            format!("`{}` is not an NVMe Qualified Name ({e}); it is served as it is, as nvmet does, and hosts must connect with exactly this name", s.nqn),
        );
    }
    ascii_field(&s.serial, 20, "serial", &join(path, "serial"), r);
    ascii_field(&s.model, 40, "model", &join(path, "model"), r);
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, host) in s.hosts.iter().enumerate() {
        let host = host.nqn.as_str();
        let p = format!("{path}.hosts[{i}]");
        if host == DISCOVERY_NQN {
            r.error(&p, "the discovery NQN cannot be a host NQN");
        } else if let Err(e) = validate_nqn(host) {
            r.error(&p, e.to_string());
        }
        if let Some(first) = seen.insert(host, i) {
            r.warn(
                &p,
                format!("host `{host}` is listed twice (also hosts[{first}])"),
            );
        }
    }
    if s.allow_any_host && !s.hosts.is_empty() {
        let keys = if s.hosts.iter().any(|h| h.dhchap_key.is_some()) {
            " (and its DH-HMAC-CHAP keys: no host authenticates)"
        } else {
            ""
        };
        r.warn(
            &join(path, "hosts"),
            format!("`hosts` is ignored because `allow_any_host` is true{keys}"),
        );
    }
    if !s.allow_any_host && s.hosts.is_empty() && !r.failed(&join(path, "allow_any_host")) {
        r.warn(
            path,
            "no host can connect: `allow_any_host` is false and `hosts` is empty",
        );
    }
    let mut nsids: HashMap<u32, String> = HashMap::new();
    for (j, ns) in s.namespaces.iter().enumerate() {
        let p = join(&ns_paths[j], "nsid");
        if ns.nsid == 0 || ns.nsid == u32::MAX {
            r.error(
                &p,
                format!(
                    "nsid {} is reserved (valid namespace IDs are 1 to 0xfffffffe)",
                    if ns.nsid == 0 { "0" } else { "0xffffffff" }
                ),
            );
        } else if let Some(first) = nsids.get(&ns.nsid) {
            r.error(
                &p,
                format!("duplicate nsid {} (first used at {first})", ns.nsid),
            );
        } else {
            nsids.insert(ns.nsid, r.line_of(&p));
        }
    }
}

/// Identify Controller SN and MN are space-padded ASCII fields (NVMe Base 2.0 §5.17.2.1):
/// printable characters only, and padding would swallow leading or trailing blanks.
fn ascii_field(value: &str, max: usize, what: &str, path: &str, r: &mut Report) {
    if value.is_empty() {
        r.error(path, format!("{what} is empty"));
    } else if let Some(c) = value.chars().find(|c| !(' '..='~').contains(c)) {
        r.error(
            path,
            format!("{what} must be printable ASCII; {c:?} is not"),
        );
    } else if value.len() > max {
        r.error(
            path,
            format!(
                "{what} `{value}` is {} characters; at most {max} fit",
                value.len()
            ),
        );
    } else if value.starts_with(' ') || value.ends_with(' ') {
        r.error(path, format!("{what} must not start or end with a space"));
    }
}

fn backing(ns: &mut Namespace, path: &str, r: &mut Report) {
    let bs_path = join(path, "block_size");
    if let Some(bs) = ns.block_size {
        if bs != 512 && bs != 4096 {
            r.error(
                &bs_path,
                format!("block_size {bs} is not supported (use 512 or 4096)"),
            );
            return;
        }
    }
    let bs = u64::from(ns.block_size.unwrap_or(DEFAULT_BLOCK_SIZE));
    let check_size = |size: Size, key: &str, r: &mut Report| {
        let p = join(path, key);
        if size.bytes() == 0 {
            r.error(&p, "the size must not be 0");
        } else if size.bytes() % bs != 0 {
            r.error(
                &p,
                format!(
                    "{} bytes is not a multiple of the block size ({bs})",
                    size.bytes()
                ),
            );
        }
    };
    match &ns.backing {
        Backing::Null { size } => {
            check_size(*size, "null", r);
            ns.block_size.get_or_insert(DEFAULT_BLOCK_SIZE);
        }
        Backing::Rbd(img) => {
            // The cluster is reached when the target opens the image (a clear error there);
            // here only what can be checked without it.
            if !img.conf.is_file() {
                r.error(
                    &join(path, "rbd.conf"),
                    format!("`{}`: no such Ceph configuration file", img.conf.display()),
                );
            }
            ns.block_size.get_or_insert(DEFAULT_BLOCK_SIZE);
        }
        Backing::File { path: file, size } => {
            let p = join(path, "path");
            match file_kind(file) {
                Err(e) => r.error(&p, format!("`{}`: {e}", file.display())),
                Ok(FileKind::Missing) => match size {
                    None => r.error(
                        &p,
                        format!(
                            "`{}` does not exist; give `size` to have it created",
                            file.display()
                        ),
                    ),
                    Some(size) => {
                        check_size(*size, "size", r);
                        let parent = match file.parent() {
                            Some(d) if !d.as_os_str().is_empty() => d,
                            _ => Path::new("."),
                        };
                        if !parent.is_dir() {
                            r.error(
                                &p,
                                format!(
                                    "`{}` cannot be created: directory `{}` does not exist",
                                    file.display(),
                                    parent.display()
                                ),
                            );
                        }
                        ns.block_size.get_or_insert(DEFAULT_BLOCK_SIZE);
                    }
                },
                Ok(FileKind::Directory) => {
                    r.error(&p, format!("`{}` is a directory", file.display()));
                }
                Ok(FileKind::Other) => r.error(
                    &p,
                    format!(
                        "`{}` is neither a regular file nor a block device",
                        file.display()
                    ),
                ),
                Ok(FileKind::BlockDevice) => {
                    if size.is_some() {
                        r.error(
                            &join(path, "size"),
                            "`size` cannot be given for a block device (its size is the \
                             device's)",
                        );
                    }
                }
                Ok(FileKind::File(len)) => {
                    if len == 0 {
                        r.error(&p, format!("`{}` is an empty file", file.display()));
                    } else if len % bs != 0 {
                        r.error(
                            &p,
                            format!(
                                "`{}` is {len} bytes, not a multiple of the block size ({bs})",
                                file.display()
                            ),
                        );
                    }
                    if let Some(size) = size {
                        check_size(*size, "size", r);
                        if size.bytes() != len {
                            r.warn(
                                &join(path, "size"),
                                format!(
                                    "`{}` already exists with {len} bytes; `size` ({size}) only \
                                     applies when the file is created and is ignored",
                                    file.display()
                                ),
                            );
                        }
                    }
                    ns.block_size.get_or_insert(DEFAULT_BLOCK_SIZE);
                }
            }
        }
    }
}

enum FileKind {
    Missing,
    Directory,
    BlockDevice,
    /// A regular file of this length.
    File(u64),
    Other,
}

fn file_kind(path: &Path) -> io::Result<FileKind> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(FileKind::Missing),
        Err(e) => return Err(e),
    };
    let ft = meta.file_type();
    Ok(if ft.is_dir() {
        FileKind::Directory
    } else if ft.is_block_device() {
        FileKind::BlockDevice
    } else if ft.is_file() {
        FileKind::File(meta.len())
    } else {
        FileKind::Other
    })
}

fn target(t: &TargetSettings, r: &mut Report) {
    let range = |v: u32, min: u32, max: u32, key: &str, r: &mut Report| {
        if !(min..=max).contains(&v) {
            r.error(
                &join("target", key),
                format!("{key} {v} is out of range ({min} to {max})"),
            );
        }
    };
    range(t.threads, 1, 1024, "threads", r);
    range(t.max_queue_depth, 2, 1024, "max_queue_depth", r);
    range(t.keep_alive_ms_min, 100, 3_600_000, "keep_alive_ms_min", r);
    range(t.cntlid_min.into(), 1, 0xffef, "cntlid_min", r);
    range(t.cntlid_max.into(), 1, 0xffef, "cntlid_max", r);
    if t.cntlid_min > t.cntlid_max {
        r.error(
            "target.cntlid_max",
            format!(
                "cntlid_max {:#x} is below cntlid_min {:#x}",
                t.cntlid_max, t.cntlid_min
            ),
        );
    }
    range(t.idle_poll_us, 0, 1_000_000, "idle_poll_us", r);
    range(t.sqpoll_idle_ms, 1, 60_000, "sqpoll_idle_ms", r);
    let srq = t.rdma_srq_depth;
    if srq != 0 && !(MIN_SRQ_DEPTH..=MAX_SRQ_DEPTH).contains(&srq) {
        r.error(
            "target.rdma_srq_depth",
            format!(
                "rdma_srq_depth {srq} is out of range (0 for a receive queue per queue pair, \
                 or {MIN_SRQ_DEPTH} to {MAX_SRQ_DEPTH} RECV buffers per shared receive queue)"
            ),
        );
    }

    let icd = t.in_capsule_data;
    let mut icd_ok = false;
    if icd > MAX_IN_CAPSULE_DATA {
        r.error(
            "target.in_capsule_data",
            format!("{icd} is larger than {MAX_IN_CAPSULE_DATA}"),
        );
    } else if icd.bytes() % 16 != 0 {
        // IOCCSZ, the I/O queue command capsule size, is given in 16-byte units.
        r.error(
            "target.in_capsule_data",
            format!("{} bytes is not a multiple of 16", icd.bytes()),
        );
    } else {
        icd_ok = true;
    }
    let mio = t.max_io_size;
    if mio < MIN_IO_SIZE || mio > MAX_IO_SIZE {
        r.error(
            "target.max_io_size",
            format!("{mio} is out of range ({MIN_IO_SIZE} to {MAX_IO_SIZE})"),
        );
    } else if mio.bytes() % MIN_IO_SIZE.bytes() != 0 {
        r.error(
            "target.max_io_size",
            format!("{} bytes is not a multiple of 4KiB", mio.bytes()),
        );
    } else {
        let pages = mio.bytes() / MIN_IO_SIZE.bytes();
        if !pages.is_power_of_two() {
            let advertised = Size(MIN_IO_SIZE.bytes() << pages.ilog2());
            r.warn(
                "target.max_io_size",
                format!(
                    "MDTS is a power of two of 4KiB pages: hosts will be told {advertised}, \
                     not {mio}"
                ),
            );
        }
        if icd_ok && icd > mio {
            r.error(
                "target.in_capsule_data",
                format!("in_capsule_data ({icd}) is larger than max_io_size ({mio})"),
            );
        }
    }
    let unit = t.io_unit_size;
    if unit < MIN_IO_SIZE || unit > MAX_IO_UNIT {
        r.error(
            "target.io_unit_size",
            format!("{unit} is out of range ({MIN_IO_SIZE} to {MAX_IO_UNIT})"),
        );
    } else if unit.bytes() % MIN_IO_SIZE.bytes() != 0 {
        r.error(
            "target.io_unit_size",
            format!("{} bytes is not a multiple of 4KiB", unit.bytes()),
        );
    } else if icd_ok && icd <= mio && icd > t.io_unit() {
        r.error(
            "target.in_capsule_data",
            format!(
                "in_capsule_data ({icd}) is larger than io_unit_size ({}): in-capsule data \
                 lands in one pool buffer",
                t.io_unit()
            ),
        );
    }
}

/// `gateway`: what can be checked without the cluster.
fn gateway(config: &Config, g: &crate::Gateway, paths: &ItemPaths, r: &mut Report) {
    if !g.conf.is_file() {
        r.error(
            "gateway.conf",
            format!("`{}`: no such Ceph configuration file", g.conf.display()),
        );
    }
    if !(3..=60).contains(&g.lease_secs) {
        r.error(
            "gateway.lease_secs",
            format!("lease_secs {} is out of range (3 to 60)", g.lease_secs),
        );
    }
    for (i, &a) in g.ana_groups.iter().enumerate() {
        if !(1..=crate::MAX_ANA_GROUP).contains(&a) {
            r.error(
                &format!("gateway.ana_groups[{i}]"),
                format!(
                    "ANA group {a} is out of range (1 to {})",
                    crate::MAX_ANA_GROUP
                ),
            );
        }
    }
    for (i, l) in config.listeners.iter().enumerate() {
        let lp = &paths.listeners[i];
        if !l.ana.is_empty() {
            r.error(
                &format!("{lp}.ana"),
                "a gateway's ANA states come from the group's leases (`gateway.ana_groups` \
                 names this gateway's own groups): remove `ana`",
            );
        }
        if l.address.is_unspecified() {
            r.warn(
                &format!("{lp}.address"),
                format!(
                    "the other gateways' discovery logs cannot list the wildcard address {}: \
                     give this gateway's address",
                    l.address
                ),
            );
        }
    }
}
