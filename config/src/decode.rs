//! From a YAML node tree to a [`Config`], reporting every unknown key, missing key and value of
//! the wrong type (not just the first) with its position.
//!
//! An item (listener, subsystem, namespace) whose required keys fail to decode is left out of
//! the result, so that later checks (duplicates, overlaps) only see items that were understood;
//! an optional key that fails keeps its default so the rest of its item is still checked.
//! Values are only given a type here; whether they are acceptable is `validate`'s business.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::error::{join, Report};
use std::collections::BTreeMap;

use crate::model::{
    default_dhchap_dhgroups, default_dhchap_hashes, default_serial, AnaState, Backing, C2hSuccess,
    Config, DhGroup, Gateway, HashId, Host, Key, Listener, Metrics, Namespace, Polling, PskKey,
    RbdImage, Subsystem, TargetSettings, TcpReceive, TcpSend, TlsMode, Transport, Uuid,
    DEFAULT_CEPH_CONF, DEFAULT_LEASE_SECS, DEFAULT_MODEL, DEFAULT_PORT, MAX_ANA_GROUP,
};
use crate::size::Size;
use crate::yaml::{Kind, Location, Node};

const CONFIG_KEYS: &[&str] = &["listeners", "subsystems", "target", "metrics", "gateway"];
const LISTENER_KEYS: &[&str] = &["transport", "address", "port", "subsystems", "ana", "tls"];
const SUBSYSTEM_KEYS: &[&str] = &[
    "nqn",
    "allow_any_host",
    "hosts",
    "dhchap_hashes",
    "dhchap_dhgroups",
    "serial",
    "model",
    "namespaces",
];
const HOST_KEYS: &[&str] = &[
    "nqn",
    "dhchap_key",
    "dhchap_key_file",
    "dhchap_ctrl_key",
    "dhchap_ctrl_key_file",
    "tls_psk",
    "tls_psk_file",
];
const NAMESPACE_KEYS: &[&str] = &[
    "nsid",
    "path",
    "size",
    "null",
    "rbd",
    "block_size",
    "read_only",
    "uuid",
    "ana_group",
];
const RBD_KEYS: &[&str] = &["pool", "image", "namespace", "conf", "user"];
const TARGET_KEYS: &[&str] = &[
    "threads",
    "in_capsule_data",
    "max_queue_depth",
    "max_io_size",
    "io_unit_size",
    "keep_alive_ms_min",
    "cntlid_min",
    "cntlid_max",
    "idle_poll_us",
    "polling",
    "sqpoll",
    "sqpoll_idle_ms",
    "iopoll",
    "rdma_srq_depth",
    "c2h_success",
    "tcp_receive",
    "tcp_send",
];
const METRICS_KEYS: &[&str] = &["listen"];
const GATEWAY_KEYS: &[&str] = &[
    "group",
    "name",
    "pool",
    "namespace",
    "conf",
    "user",
    "ana_groups",
    "lease_secs",
    "failback",
];

/// Where each item of a [`Config`] was written: `paths.listeners[i]` is the key path of
/// `config.listeners[i]` (items that failed to decode are left out of the config, so indexes
/// in the text and in the config can differ).
#[derive(Debug, Default)]
pub(crate) struct ItemPaths {
    pub listeners: Vec<String>,
    pub subsystems: Vec<String>,
    /// Per subsystem, per namespace.
    pub namespaces: Vec<Vec<String>>,
}

impl ItemPaths {
    /// Paths for a configuration built in code: indexes as they are.
    pub fn natural(config: &Config) -> ItemPaths {
        ItemPaths {
            listeners: (0..config.listeners.len())
                .map(|i| format!("listeners[{i}]"))
                .collect(),
            subsystems: (0..config.subsystems.len())
                .map(|i| format!("subsystems[{i}]"))
                .collect(),
            namespaces: config
                .subsystems
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    (0..s.namespaces.len())
                        .map(|j| format!("subsystems[{i}].namespaces[{j}]"))
                        .collect()
                })
                .collect(),
        }
    }
}

/// Decodes the document. `base_dir` is where relative namespace paths start from.
pub(crate) fn config(root: &Node, base_dir: Option<&Path>, r: &mut Report) -> (Config, ItemPaths) {
    let d = Decoder { base_dir };
    let mut paths = ItemPaths::default();
    let mut config = Config {
        listeners: Vec::new(),
        subsystems: Vec::new(),
        target: TargetSettings::default(),
        metrics: None,
        gateway: None,
    };
    r.record("", root.at);
    let Some(m) = map(r, root, "", CONFIG_KEYS) else {
        return (config, paths);
    };
    if let Some(node) = required(r, &m, "listeners") {
        let items = seq(r, node, "listeners").unwrap_or_default();
        if items.is_empty() && matches!(node.kind, Kind::Seq(_)) {
            r.error_at(node.at, "listeners", "at least one listener is required");
        }
        for (i, n) in items.iter().enumerate() {
            let p = format!("listeners[{i}]");
            if let Some(l) = d.listener(r, n, &p) {
                config.listeners.push(l);
                paths.listeners.push(p);
            }
        }
    }
    let subsystems = match m.get("subsystems") {
        None => Some(&[][..]),
        Some(node) => seq(r, node, "subsystems"),
    };
    if subsystems.is_some_and(|s| s.is_empty()) {
        r.warn(
            "subsystems",
            "no subsystems are configured: the target serves discovery only",
        );
    }
    for (i, n) in subsystems.unwrap_or_default().iter().enumerate() {
        let p = format!("subsystems[{i}]");
        if let Some((s, ns_paths)) = d.subsystem(r, n, &p) {
            config.subsystems.push(s);
            paths.subsystems.push(p);
            paths.namespaces.push(ns_paths);
        }
    }
    if let Some(node) = m.get("target") {
        config.target = d.target(r, node, "target");
    }
    config.metrics = m
        .get("metrics")
        .and_then(|node| d.metrics(r, node, "metrics"));
    config.gateway = m
        .get("gateway")
        .and_then(|node| d.gateway(r, node, "gateway"));
    (config, paths)
}

struct Decoder<'a> {
    base_dir: Option<&'a Path>,
}

impl Decoder<'_> {
    fn listener(&self, r: &mut Report, node: &Node, path: &str) -> Option<Listener> {
        let m = map(r, node, path, LISTENER_KEYS)?;
        let transport = required(r, &m, "transport").and_then(|n| {
            let p = join(path, "transport");
            match string(r, n, &p)?.as_str() {
                "tcp" => Some(Transport::Tcp),
                "rdma" => Some(Transport::Rdma),
                other => {
                    r.error_at(
                        n.at,
                        &p,
                        format!("unknown transport `{other}` (expected tcp or rdma)"),
                    );
                    None
                }
            }
        });
        let address = required(r, &m, "address").and_then(|n| {
            let p = join(path, "address");
            let text = string(r, n, &p)?;
            match text.parse::<IpAddr>() {
                Ok(ip) => Some(ip),
                Err(_) => {
                    r.error_at(
                        n.at,
                        &p,
                        format!(
                            "`{text}` is not an IP address (e.g. 0.0.0.0, 192.168.1.10, ::, \
                             fe80::1); host names are not resolved"
                        ),
                    );
                    None
                }
            }
        });
        let port = optional(r, &m, "port", DEFAULT_PORT, |r, n, p| {
            int(r, n, p, u16::MAX.into()).map(|v| v as u16)
        });
        let subsystems = m.get("subsystems").and_then(|n| {
            let p = join(path, "subsystems");
            let items = seq(r, n, &p)?;
            let names: Vec<String> = items
                .iter()
                .enumerate()
                .filter_map(|(i, s)| string(r, s, &format!("{p}[{i}]")))
                .collect();
            (names.len() == items.len()).then_some(names)
        });
        let ana = optional(r, &m, "ana", BTreeMap::new(), |r, n, p| {
            let Kind::Map(entries) = &n.kind else {
                r.error_at(
                    n.at,
                    p,
                    format!(
                        "expected a mapping of ANA group to state (`{{ 1: optimized, 2: \
                         inaccessible }}`), found {}",
                        n.describe()
                    ),
                );
                return None;
            };
            let mut out = BTreeMap::new();
            for (k, v) in entries {
                let kp = format!("{p}.{}", k.text());
                r.record(&kp, k.at);
                let group = match k.text().parse::<u32>() {
                    Ok(g) if (1..=MAX_ANA_GROUP).contains(&g) => g,
                    _ => {
                        r.error_at(
                            k.at,
                            &kp,
                            format!("`{}` is not an ANA group (1 to {MAX_ANA_GROUP})", k.text()),
                        );
                        continue;
                    }
                };
                let Some(text) = string(r, v, &kp) else {
                    continue;
                };
                match AnaState::from_name(&text) {
                    Some(s) => {
                        out.insert(group, s);
                    }
                    None => r.error_at(
                        v.at,
                        &kp,
                        format!(
                            "unknown ANA state `{text}` (expected optimized, non-optimized, \
                             inaccessible, persistent-loss or change)"
                        ),
                    ),
                }
            }
            Some(out)
        });
        let tls = m.get("tls").and_then(|n| {
            let p = join(path, "tls");
            match string(r, n, &p)?.as_str() {
                "required" => Some(TlsMode::Required),
                "allowed" => Some(TlsMode::Allowed),
                other => {
                    r.error_at(
                        n.at,
                        &p,
                        format!("unknown TLS mode `{other}` (expected required or allowed)"),
                    );
                    None
                }
            }
        });
        Some(Listener {
            transport: transport?,
            address: address?,
            port,
            subsystems,
            ana,
            tls,
        })
    }

    /// The subsystem and the paths of the namespaces it kept.
    fn subsystem(
        &self,
        r: &mut Report,
        node: &Node,
        path: &str,
    ) -> Option<(Subsystem, Vec<String>)> {
        let m = map(r, node, path, SUBSYSTEM_KEYS)?;
        let nqn = required(r, &m, "nqn").and_then(|n| string(r, n, &join(path, "nqn")));
        let allow_any_host = optional(r, &m, "allow_any_host", false, boolean);
        let hosts = optional(r, &m, "hosts", Vec::new(), |r, n, p| {
            let items = seq(r, n, p)?;
            Some(
                items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, h)| self.host(r, h, &format!("{p}[{i}]")))
                    .collect(),
            )
        });
        let dhchap_hashes = optional(
            r,
            &m,
            "dhchap_hashes",
            default_dhchap_hashes(),
            |r, n, p| names(r, n, p, HashId::from_name, "sha256, sha384 or sha512"),
        );
        let dhchap_dhgroups = optional(
            r,
            &m,
            "dhchap_dhgroups",
            default_dhchap_dhgroups(),
            |r, n, p| {
                names(
                    r,
                    n,
                    p,
                    DhGroup::from_name,
                    "null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144 or ffdhe8192",
                )
            },
        );
        let serial = m
            .get("serial")
            .and_then(|n| string(r, n, &join(path, "serial")));
        let model = optional(r, &m, "model", DEFAULT_MODEL.to_owned(), string);
        let mut namespaces = Vec::new();
        let mut ns_paths = Vec::new();
        let items = match m.get("namespaces") {
            None => Some(&[][..]),
            Some(n) => seq(r, n, &join(path, "namespaces")),
        };
        if items.is_some_and(|s| s.is_empty()) {
            r.warn(path, "the subsystem has no namespaces");
        }
        for (i, n) in items.unwrap_or_default().iter().enumerate() {
            let p = format!("{path}.namespaces[{i}]");
            if let Some(ns) = self.namespace(r, n, &p, nqn.as_deref()) {
                namespaces.push(ns);
                ns_paths.push(p);
            }
        }
        let nqn = nqn?;
        let subsystem = Subsystem {
            serial: serial.unwrap_or_else(|| default_serial(&nqn)),
            nqn,
            allow_any_host,
            hosts,
            dhchap_hashes,
            dhchap_dhgroups,
            model,
            namespaces,
        };
        Some((subsystem, ns_paths))
    }

    /// A `hosts` entry: a host NQN, or a mapping with the host's secrets.
    fn host(&self, r: &mut Report, node: &Node, path: &str) -> Option<Host> {
        if let Kind::Scalar { .. } = node.kind {
            return string(r, node, path).map(Host::plain);
        }
        let m = map(r, node, path, HOST_KEYS)?;
        let nqn = required(r, &m, "nqn").and_then(|n| string(r, n, &join(path, "nqn")));
        let key = self.key(r, &m, path, "dhchap_key");
        let ctrl_key = self.key(r, &m, path, "dhchap_ctrl_key");
        if ctrl_key.is_some() && key.is_none() && !r.failed(&join(path, "dhchap_key")) {
            r.error_at(
                m.at,
                &join(path, "dhchap_ctrl_key"),
                "a controller key needs a host key (`dhchap_key` or `dhchap_key_file`) too",
            );
        }
        let tls_psk = self
            .secret(r, &m, path, "tls_psk", parse_psk)
            .map(|(file, psk)| PskKey { file, psk });
        Some(Host {
            nqn: nqn?,
            dhchap_key: key,
            dhchap_ctrl_key: ctrl_key,
            tls_psk,
        })
    }

    /// `<name>` (inline) or `<name>_file`: a DH-HMAC-CHAP secret. The secret itself never
    /// appears in a message.
    fn key(&self, r: &mut Report, m: &Map<'_>, path: &str, name: &str) -> Option<Key> {
        self.secret(r, m, path, name, parse_dhchap)
            .map(|(file, secret)| Key { file, secret })
    }

    /// `<name>` (inline) or `<name>_file` (mode 0600), parsed by `parse`; the file's path if
    /// it came from one. The secret itself never appears in a message.
    fn secret<T>(
        &self,
        r: &mut Report,
        m: &Map<'_>,
        path: &str,
        name: &str,
        parse: fn(&str) -> Result<T, String>,
    ) -> Option<(Option<PathBuf>, T)> {
        let file_key = format!("{name}_file");
        let (inline, file) = (m.get(name), m.get(&file_key));
        if let (Some(_), Some(f)) = (inline, file) {
            r.error_at(
                f.at,
                &join(path, &file_key),
                format!("give either `{name}` or `{file_key}`, not both"),
            );
            return None;
        }
        if let Some(n) = inline {
            let p = join(path, name);
            let Kind::Scalar { text, .. } = &n.kind else {
                r.error_at(
                    n.at,
                    &p,
                    format!("expected a string, found {}", n.describe()),
                );
                return None;
            };
            return match parse(text) {
                Ok(secret) => Some((None, secret)),
                Err(e) => {
                    r.error_at(n.at, &p, e);
                    None
                }
            };
        }
        let n = file?;
        let p = join(path, &file_key);
        let text = string(r, n, &p)?;
        let file = match self.base_dir {
            Some(base) => base.join(&text),
            None => PathBuf::from(&text),
        };
        match read_key_file(&file).and_then(|t| parse(&t)) {
            Ok(secret) => Some((Some(file), secret)),
            Err(e) => {
                r.error_at(n.at, &p, format!("{}: {e}", file.display()));
                None
            }
        }
    }

    /// `nqn` is the subsystem's (for the derived UUID); `None` if it failed to decode, and the
    /// namespace is then checked but not returned.
    fn namespace(
        &self,
        r: &mut Report,
        node: &Node,
        path: &str,
        nqn: Option<&str>,
    ) -> Option<Namespace> {
        let m = map(r, node, path, NAMESPACE_KEYS)?;
        let nsid = required(r, &m, "nsid")
            .and_then(|n| int(r, n, &join(path, "nsid"), u32::MAX.into()))
            .map(|v| v as u32);
        let size_value = m.get("size").map(|n| size(r, n, &join(path, "size")));
        let given: Vec<&str> = ["path", "null", "rbd"]
            .into_iter()
            .filter(|k| m.get(k).is_some())
            .collect();
        let backing = match given.as_slice() {
            [] => {
                r.error_at(
                    m.at,
                    path,
                    "a namespace needs `path: FILE` (a file or block device), `null: SIZE` or \
                     `rbd: { pool, image }`",
                );
                None
            }
            [_, second, ..] => {
                let at = m.key_at(second).unwrap_or(m.at);
                r.error_at(
                    at,
                    &join(path, second),
                    format!(
                        "give one of `path`, `null` and `rbd`, not {}",
                        given
                            .iter()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ),
                );
                None
            }
            ["path"] => {
                let p = m.get("path").expect("listed as given");
                let file = string(r, p, &join(path, "path")).and_then(|text| {
                    if text.is_empty() {
                        r.error_at(p.at, &join(path, "path"), "the path is empty");
                        return None;
                    }
                    Some(match self.base_dir {
                        Some(base) => base.join(text),
                        None => PathBuf::from(text),
                    })
                });
                match size_value {
                    None => file.map(|path| Backing::File { path, size: None }),
                    Some(size) => Some(Backing::File {
                        path: file?,
                        size: Some(size?),
                    }),
                }
            }
            [kind] => {
                let n = m.get(kind).expect("listed as given");
                if size_value.is_some() {
                    let hint = if *kind == "null" {
                        "a null namespace's size is the value of `null` (null: 4GiB)"
                    } else {
                        "an RBD namespace has its image's size (`rbd resize` changes it)"
                    };
                    r.error_at(
                        m.key_at("size").unwrap_or(m.at),
                        &join(path, "size"),
                        format!("`size` is for `path` namespaces; {hint}"),
                    );
                }
                if *kind == "null" {
                    size(r, n, &join(path, "null")).map(|size| Backing::Null { size })
                } else {
                    self.rbd(r, n, &join(path, "rbd")).map(Backing::Rbd)
                }
            }
        };
        let block_size = optional(r, &m, "block_size", None, |r, n, p| {
            int(r, n, p, u32::MAX.into()).map(|v| Some(v as u32))
        });
        let read_only = optional(r, &m, "read_only", false, boolean);
        let ana_group = optional(r, &m, "ana_group", 1, |r, n, p| {
            let g = int(r, n, p, u32::MAX.into())? as u32;
            if !(1..=MAX_ANA_GROUP).contains(&g) {
                r.error_at(n.at, p, format!("an ANA group is 1 to {MAX_ANA_GROUP}"));
                return None;
            }
            Some(g)
        });
        let uuid = m.get("uuid").and_then(|n| {
            let p = join(path, "uuid");
            let text = string(r, n, &p)?;
            text.parse::<Uuid>()
                .map_err(|e| r.error_at(n.at, &p, e.to_string()))
                .ok()
        });
        let nsid = nsid?;
        let uuid = match uuid {
            Some(u) => u,
            None => Uuid::derived(nqn?, nsid),
        };
        Some(Namespace {
            nsid,
            backing: backing?,
            block_size,
            read_only,
            ana_group,
            uuid,
        })
    }

    /// `rbd: { pool, image, namespace, conf, user }`.
    fn rbd(&self, r: &mut Report, node: &Node, path: &str) -> Option<RbdImage> {
        let m = map(r, node, path, RBD_KEYS)?;
        let image = required(r, &m, "image").and_then(|_| ceph_name(r, &m, path, "image"));
        let place = self.ceph_place(r, &m, path);
        let (pool, namespace, conf, user) = place?;
        Some(RbdImage {
            pool,
            image: image?,
            namespace,
            conf,
            user,
        })
    }

    /// `gateway: { group, name, pool, namespace, conf, user, ana_groups, lease_secs, failback }`.
    fn gateway(&self, r: &mut Report, node: &Node, path: &str) -> Option<Gateway> {
        let m = map(r, node, path, GATEWAY_KEYS)?;
        let label = |r: &mut Report, key: &str| -> Option<String> {
            let n = m.get(key)?;
            let p = join(path, key);
            let text = string(r, n, &p)?;
            let ok = !text.is_empty()
                && text.len() <= 64
                && text
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                r.error_at(
                    n.at,
                    &p,
                    format!(
                        "`{text}` is not a valid {key} (1 to 64 letters, digits, `.`, `_`, `-`)"
                    ),
                );
                return None;
            }
            Some(text)
        };
        let group = required(r, &m, "group").and_then(|_| label(r, "group"));
        let name = match m.get("name") {
            Some(_) => label(r, "name"),
            None => Some(host_name()),
        };
        let place = self.ceph_place(r, &m, path);
        let ana_groups = match m.get("ana_groups") {
            None => Some(Vec::new()),
            Some(n) => {
                let p = join(path, "ana_groups");
                seq(r, n, &p).map(|items| {
                    items
                        .iter()
                        .enumerate()
                        .filter_map(|(i, n)| {
                            int(r, n, &format!("{p}[{i}]"), u64::from(u32::MAX)).map(|v| v as u32)
                        })
                        .collect()
                })
            }
        };
        let lease_secs = optional(r, &m, "lease_secs", DEFAULT_LEASE_SECS, |r, n, p| {
            int(r, n, p, u64::from(u32::MAX)).map(|v| v as u32)
        });
        let failback = optional(r, &m, "failback", true, boolean);
        let (pool, namespace, conf, user) = place?;
        Some(Gateway {
            group: group?,
            name: name?,
            pool,
            namespace,
            conf,
            user,
            ana_groups: ana_groups?,
            lease_secs,
            failback,
        })
    }

    /// The keys that say where in a Ceph cluster: `pool` (required), `namespace`, `conf`,
    /// `user`, as `(pool, namespace, conf, user)`.
    fn ceph_place(
        &self,
        r: &mut Report,
        m: &Map<'_>,
        path: &str,
    ) -> Option<(String, String, PathBuf, String)> {
        let name = |r: &mut Report, key: &str| ceph_name(r, m, path, key);
        let pool = required(r, m, "pool").and_then(|_| name(r, "pool"));
        let namespace = match m.get("namespace") {
            Some(_) => name(r, "namespace"),
            None => Some(String::new()),
        };
        let user = match m.get("user") {
            Some(_) => {
                name(r, "user").map(|u| u.strip_prefix("client.").map(str::to_owned).unwrap_or(u))
            }
            None => Some("admin".to_owned()),
        };
        let conf = match m.get("conf") {
            Some(n) => {
                let p = join(path, "conf");
                string(r, n, &p).and_then(|text| {
                    if text.is_empty() {
                        r.error_at(n.at, &p, "the path is empty");
                        return None;
                    }
                    Some(match self.base_dir {
                        Some(base) => base.join(text),
                        None => PathBuf::from(text),
                    })
                })
            }
            None => Some(PathBuf::from(DEFAULT_CEPH_CONF)),
        };
        Some((pool?, namespace?, conf?, user?))
    }

    fn target(&self, r: &mut Report, node: &Node, path: &str) -> TargetSettings {
        let d = TargetSettings::default();
        let Some(m) = map(r, node, path, TARGET_KEYS) else {
            return d;
        };
        let u32_max = u64::from(u32::MAX);
        let mut u32_key = |key: &str, default: u32| {
            optional(r, &m, key, default, |r, n, p| {
                int(r, n, p, u32_max).map(|v| v as u32)
            })
        };
        TargetSettings {
            threads: u32_key("threads", d.threads),
            max_queue_depth: u32_key("max_queue_depth", d.max_queue_depth),
            keep_alive_ms_min: u32_key("keep_alive_ms_min", d.keep_alive_ms_min),
            cntlid_min: u32_key("cntlid_min", d.cntlid_min.into())
                .try_into()
                .unwrap_or(u16::MAX),
            cntlid_max: u32_key("cntlid_max", d.cntlid_max.into())
                .try_into()
                .unwrap_or(u16::MAX),
            idle_poll_us: u32_key("idle_poll_us", d.idle_poll_us),
            sqpoll_idle_ms: u32_key("sqpoll_idle_ms", d.sqpoll_idle_ms),
            rdma_srq_depth: u32_key("rdma_srq_depth", d.rdma_srq_depth),
            sqpoll: optional(r, &m, "sqpoll", d.sqpoll, boolean),
            iopoll: optional(r, &m, "iopoll", d.iopoll, boolean),
            in_capsule_data: optional(r, &m, "in_capsule_data", d.in_capsule_data, size),
            max_io_size: optional(r, &m, "max_io_size", d.max_io_size, size),
            io_unit_size: optional(r, &m, "io_unit_size", d.io_unit_size, size),
            polling: optional(r, &m, "polling", d.polling, |r, n, p| {
                match string(r, n, p)?.as_str() {
                    "adaptive" => Some(Polling::Adaptive),
                    "busy" => Some(Polling::Busy),
                    "interrupt" => Some(Polling::Interrupt),
                    other => {
                        r.error_at(
                            n.at,
                            p,
                            format!(
                                "unknown polling mode `{other}` (expected adaptive, busy or \
                                 interrupt)"
                            ),
                        );
                        None
                    }
                }
            }),
            c2h_success: optional(r, &m, "c2h_success", d.c2h_success, |r, n, p| match string(
                r, n, p,
            )?
            .as_str()
            {
                "spec" => Some(C2hSuccess::Spec),
                "always" => Some(C2hSuccess::Always),
                other => {
                    r.error_at(
                        n.at,
                        p,
                        format!("unknown c2h_success mode `{other}` (expected spec or always)"),
                    );
                    None
                }
            }),
            tcp_receive: optional(r, &m, "tcp_receive", d.tcp_receive, |r, n, p| match string(
                r, n, p,
            )?
            .as_str()
            {
                "auto" => Some(TcpReceive::Auto),
                "io_uring" => Some(TcpReceive::IoUring),
                "epoll" => Some(TcpReceive::Epoll),
                other => {
                    r.error_at(
                        n.at,
                        p,
                        format!(
                            "unknown tcp_receive mode `{other}` (expected auto, io_uring or \
                                 epoll)"
                        ),
                    );
                    None
                }
            }),
            tcp_send: optional(r, &m, "tcp_send", d.tcp_send, |r, n, p| {
                match string(r, n, p)?.as_str() {
                    "auto" => Some(TcpSend::Auto),
                    "io_uring" => Some(TcpSend::IoUring),
                    "sendmsg" => Some(TcpSend::Sendmsg),
                    other => {
                        r.error_at(
                            n.at,
                            p,
                            format!(
                                "unknown tcp_send mode `{other}` (expected auto, io_uring or \
                                 sendmsg)"
                            ),
                        );
                        None
                    }
                }
            }),
        }
    }

    fn metrics(&self, r: &mut Report, node: &Node, path: &str) -> Option<Metrics> {
        let m = map(r, node, path, METRICS_KEYS)?;
        let n = required(r, &m, "listen")?;
        let p = join(path, "listen");
        let text = string(r, n, &p)?;
        match text.parse::<SocketAddr>() {
            Ok(listen) => Some(Metrics { listen }),
            Err(_) => {
                r.error_at(
                    n.at,
                    &p,
                    format!("`{text}` is not ADDRESS:PORT (e.g. 127.0.0.1:9940 or [::1]:9940)"),
                );
                None
            }
        }
    }
}

/// The value of `key` in `m` as a Ceph name (pool, image, RADOS namespace, user): not empty,
/// no `/`, `@` or NUL.
fn ceph_name(r: &mut Report, m: &Map<'_>, path: &str, key: &str) -> Option<String> {
    let n = m.get(key)?;
    let p = join(path, key);
    let text = string(r, n, &p)?;
    if text.is_empty() || text.contains(['/', '@', '\0']) {
        r.error_at(
            n.at,
            &p,
            format!("`{text}` is not a valid {key} name (empty, or has `/`, `@` or NUL)"),
        );
        return None;
    }
    Some(text)
}

/// This machine's host name (the default gateway name), `localhost` if it has none.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Reads a key file: owned by anyone, but readable and writable by its owner only (mode
/// 0600 or stricter), holding one secret (`DHHC-1:` or `NVMeTLSkey-1:`).
fn read_key_file(file: &Path) -> Result<zeroize::Zeroizing<String>, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "a key file must be private to its owner (mode {mode:04o}; chmod 600 it)"
        ));
    }
    Ok(zeroize::Zeroizing::new(
        std::fs::read_to_string(file).map_err(|e| e.to_string())?,
    ))
}

fn parse_dhchap(text: &str) -> Result<nvme::auth::Secret, String> {
    nvme::auth::Secret::parse(text).map_err(|e| format!("not a DH-HMAC-CHAP secret: {e}"))
}

fn parse_psk(text: &str) -> Result<nvme::tls::ConfiguredPsk, String> {
    nvme::tls::ConfiguredPsk::parse(text).map_err(|e| format!("not a TLS PSK: {e}"))
}

/// A list of names, each decoded by `parse`; an empty list is refused.
fn names<T: PartialEq>(
    r: &mut Report,
    node: &Node,
    path: &str,
    parse: fn(&str) -> Option<T>,
    expected: &str,
) -> Option<Vec<T>> {
    let items = seq(r, node, path)?;
    if items.is_empty() {
        r.error_at(
            node.at,
            path,
            format!("the list is empty (expected {expected})"),
        );
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    for (i, n) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        // `null` (the DH group) is YAML's null unless quoted: take it as the name it spells.
        let text = if n.is_null() {
            Some("null".to_owned())
        } else {
            string(r, n, &p)
        };
        let Some(text) = text else {
            ok = false;
            continue;
        };
        match parse(&text) {
            Some(v) if !out.contains(&v) => out.push(v),
            Some(_) => r.warn(&p, format!("`{text}` is listed twice")),
            None => {
                r.error_at(n.at, &p, format!("unknown `{text}` (expected {expected})"));
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

/// A mapping whose keys were checked against the schema.
struct Map<'n> {
    path: String,
    at: Location,
    entries: &'n [(Node, Node)],
}

impl<'n> Map<'n> {
    /// The value of `key`; an explicit null counts as absent (the default applies).
    fn get(&self, key: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(k, _)| k.text() == key)
            .map(|(_, v)| v)
            .filter(|v| !v.is_null())
    }

    fn key_at(&self, key: &str) -> Option<Location> {
        self.entries
            .iter()
            .find(|(k, _)| k.text() == key)
            .map(|(k, _)| k.at)
    }
}

/// Checks that `node` is a mapping with only `keys`; records where each value is.
fn map<'n>(r: &mut Report, node: &'n Node, path: &str, keys: &[&str]) -> Option<Map<'n>> {
    let Kind::Map(entries) = &node.kind else {
        r.error_at(
            node.at,
            path,
            format!("expected a mapping, found {}", node.describe()),
        );
        return None;
    };
    for (k, v) in entries {
        let key = k.text();
        let p = join(path, key);
        if keys.contains(&key) {
            r.record(&p, v.at);
        } else {
            let hint = match closest(key, keys) {
                Some(near) => format!("did you mean `{near}`?"),
                None => format!("expected one of: {}", keys.join(", ")),
            };
            r.error_at(k.at, &p, format!("unknown key `{key}`; {hint}"));
        }
    }
    Some(Map {
        path: path.to_owned(),
        at: node.at,
        entries,
    })
}

fn required<'n>(r: &mut Report, m: &Map<'n>, key: &str) -> Option<&'n Node> {
    let v = m.get(key);
    if v.is_none() {
        r.error_at(
            m.at,
            &join(&m.path, key),
            format!("missing required key `{key}`"),
        );
    }
    v
}

/// The decoded value of `key`, or `default` when it is absent or null. A value that fails to
/// decode is reported and replaced by the default, so that the rest of the item is still
/// checked (the configuration is rejected anyway).
fn optional<T>(
    r: &mut Report,
    m: &Map<'_>,
    key: &str,
    default: T,
    decode: impl FnOnce(&mut Report, &Node, &str) -> Option<T>,
) -> T {
    match m.get(key) {
        None => default,
        Some(n) => decode(r, n, &join(&m.path, key)).unwrap_or(default),
    }
}

fn seq<'n>(r: &mut Report, node: &'n Node, path: &str) -> Option<&'n [Node]> {
    let Kind::Seq(items) = &node.kind else {
        r.error_at(
            node.at,
            path,
            format!("expected a list, found {}", node.describe()),
        );
        return None;
    };
    for (i, item) in items.iter().enumerate() {
        r.record(&format!("{path}[{i}]"), item.at);
    }
    Some(items)
}

/// Any non-null scalar, as written (so `serial: 0042` keeps its zeros).
fn string(r: &mut Report, node: &Node, path: &str) -> Option<String> {
    match &node.kind {
        Kind::Scalar { text, .. } if !node.is_null() => Some(text.clone()),
        _ => {
            r.error_at(
                node.at,
                path,
                format!("expected a string, found {}", node.describe()),
            );
            None
        }
    }
}

fn boolean(r: &mut Report, node: &Node, path: &str) -> Option<bool> {
    if let Kind::Scalar { text, plain: true } = &node.kind {
        match text.as_str() {
            "true" | "True" | "TRUE" => return Some(true),
            "false" | "False" | "FALSE" => return Some(false),
            _ => {}
        }
    }
    let hint = match node.text().to_ascii_lowercase().as_str() {
        "yes" | "no" | "on" | "off" | "y" | "n" => " (YAML 1.2 has only true and false)",
        _ => "",
    };
    r.error_at(
        node.at,
        path,
        format!("expected true or false, found {}{hint}", node.describe()),
    );
    None
}

/// A plain YAML 1.2 integer (decimal, `0x` hex or `0o` octal) from 0 to `max`.
fn int(r: &mut Report, node: &Node, path: &str, max: u64) -> Option<u64> {
    let parsed = match &node.kind {
        Kind::Scalar { text, plain: true } => parse_int(text),
        _ => None,
    };
    match parsed {
        Some(Ok(v)) if v <= max => Some(v),
        Some(Ok(v)) => {
            r.error_at(node.at, path, format!("{v} is too large (at most {max})"));
            None
        }
        Some(Err(())) => {
            r.error_at(
                node.at,
                path,
                format!("`{}` must not be negative", node.text()),
            );
            None
        }
        None => {
            r.error_at(
                node.at,
                path,
                format!("expected an integer, found {}", node.describe()),
            );
            None
        }
    }
}

/// `None`: not an integer; `Some(Err)`: a negative integer; `Some(Ok(u64::MAX))` for values
/// beyond u64 (reported as too large by the caller).
fn parse_int(text: &str) -> Option<Result<u64, ()>> {
    let (negative, body) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (digits, radix) = if let Some(h) = body.strip_prefix("0x") {
        (h, 16)
    } else if let Some(o) = body.strip_prefix("0o") {
        (o, 8)
    } else {
        (body, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    if negative {
        return Some(if digits.bytes().all(|b| b == b'0') {
            Ok(0)
        } else {
            Err(())
        });
    }
    Some(Ok(u64::from_str_radix(digits, radix).unwrap_or(u64::MAX)))
}

/// An integer number of bytes, or a string with a unit.
fn size(r: &mut Report, node: &Node, path: &str) -> Option<Size> {
    let result = match &node.kind {
        Kind::Scalar { text, plain: true } if matches!(parse_int(text), Some(Ok(_))) => {
            return int(r, node, path, u64::MAX - 1).map(Size);
        }
        Kind::Scalar { text, .. } if !node.is_null() => text.parse::<Size>(),
        _ => {
            r.error_at(
                node.at,
                path,
                format!(
                    "expected a size (4096, 4KiB, 1GiB), found {}",
                    node.describe()
                ),
            );
            return None;
        }
    };
    result
        .map_err(|e| r.error_at(node.at, path, e.to_string()))
        .ok()
}

/// The allowed key nearest to a misspelt one, if it is near enough to be a typo.
fn closest<'k>(key: &str, keys: &[&'k str]) -> Option<&'k str> {
    keys.iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|&(d, k)| d <= 2.max(k.len() / 4) && d < k.len())
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_follow_yaml_core_schema() {
        assert_eq!(parse_int("4420"), Some(Ok(4420)));
        assert_eq!(parse_int("+7"), Some(Ok(7)));
        assert_eq!(parse_int("0x1F"), Some(Ok(31)));
        assert_eq!(parse_int("0o17"), Some(Ok(15)));
        assert_eq!(parse_int("-0"), Some(Ok(0)));
        assert_eq!(parse_int("-3"), Some(Err(())));
        assert_eq!(parse_int("99999999999999999999"), Some(Ok(u64::MAX)));
        for not_int in ["", "-", "0x", "1.0", "1e3", "12a", "4KiB", "0b101", "1_000"] {
            assert_eq!(parse_int(not_int), None, "{not_int}");
        }
    }

    #[test]
    fn suggests_near_keys_only() {
        assert_eq!(closest("prot", LISTENER_KEYS), Some("port"));
        assert_eq!(closest("adress", LISTENER_KEYS), Some("address"));
        assert_eq!(
            closest("allow_any_hosts", SUBSYSTEM_KEYS),
            Some("allow_any_host")
        );
        assert_eq!(closest("blocksize", NAMESPACE_KEYS), Some("block_size"));
        assert_eq!(closest("colour", LISTENER_KEYS), None);
        assert_eq!(closest("x", NAMESPACE_KEYS), None);
    }
}
