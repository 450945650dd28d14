//! From a YAML node tree to a [`Config`], reporting every unknown key, missing key and value of
//! the wrong type (not just the first) with its position.
//!
//! An item (listener, subsystem, namespace) that has any such error is left out of the result,
//! so that later checks (duplicates, overlaps) only see items that were fully understood.
//! Values are only given a type here; whether they are acceptable is `validate`'s business.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::error::{join, Report};
use crate::model::{
    default_serial, Backing, Config, Listener, Metrics, Namespace, Subsystem, TargetSettings,
    Transport, Uuid, DEFAULT_MODEL, DEFAULT_PORT,
};
use crate::size::Size;
use crate::yaml::{Kind, Location, Node};

const CONFIG_KEYS: &[&str] = &["listeners", "subsystems", "target", "metrics"];
const LISTENER_KEYS: &[&str] = &["transport", "address", "port"];
const SUBSYSTEM_KEYS: &[&str] = &[
    "nqn",
    "allow_any_host",
    "hosts",
    "serial",
    "model",
    "namespaces",
];
const NAMESPACE_KEYS: &[&str] = &[
    "nsid",
    "path",
    "size",
    "null",
    "block_size",
    "read_only",
    "uuid",
];
const TARGET_KEYS: &[&str] = &[
    "threads",
    "in_capsule_data",
    "max_queue_depth",
    "max_io_size",
    "keep_alive_ms_min",
    "idle_poll_us",
];
const METRICS_KEYS: &[&str] = &["listen"];

/// Decodes the document. `base_dir` is where relative namespace paths start from.
pub(crate) fn config(root: &Node, base_dir: Option<&Path>, r: &mut Report) -> Config {
    let d = Decoder { base_dir };
    r.record("", root.at);
    let Some(m) = map(r, root, "", CONFIG_KEYS) else {
        return Config {
            listeners: Vec::new(),
            subsystems: Vec::new(),
            target: TargetSettings::default(),
            metrics: None,
        };
    };
    let listeners = match required(r, &m, "listeners") {
        None => Vec::new(),
        Some(node) => {
            let items = seq(r, node, "listeners").unwrap_or_default();
            if items.is_empty() && matches!(node.kind, Kind::Seq(_)) {
                r.error_at(node.at, "listeners", "at least one listener is required");
            }
            items
                .iter()
                .enumerate()
                .filter_map(|(i, n)| d.listener(r, n, &format!("listeners[{i}]")))
                .collect()
        }
    };
    let subsystems = match m.get("subsystems") {
        None => Vec::new(),
        Some(node) => seq(r, node, "subsystems")
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter_map(|(i, n)| d.subsystem(r, n, &format!("subsystems[{i}]")))
            .collect(),
    };
    let target = match m.get("target") {
        None => TargetSettings::default(),
        Some(node) => d.target(r, node, "target"),
    };
    let metrics = m
        .get("metrics")
        .and_then(|node| d.metrics(r, node, "metrics"));
    Config {
        listeners,
        subsystems,
        target,
        metrics,
    }
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
        Some(Listener {
            transport: transport?,
            address: address?,
            port: port?,
        })
    }

    fn subsystem(&self, r: &mut Report, node: &Node, path: &str) -> Option<Subsystem> {
        let m = map(r, node, path, SUBSYSTEM_KEYS)?;
        let nqn = required(r, &m, "nqn").and_then(|n| string(r, n, &join(path, "nqn")));
        let allow_any_host = optional(r, &m, "allow_any_host", false, boolean);
        let hosts = optional(r, &m, "hosts", Vec::new(), |r, n, p| {
            let items = seq(r, n, p)?;
            let hosts: Vec<Option<String>> = items
                .iter()
                .enumerate()
                .map(|(i, h)| string(r, h, &format!("{p}[{i}]")))
                .collect();
            hosts.into_iter().collect()
        });
        let serial = m.get("serial").map(|n| string(r, n, &join(path, "serial")));
        let model = optional(r, &m, "model", DEFAULT_MODEL.to_owned(), string);
        let namespaces = match (m.get("namespaces"), &nqn) {
            (None, _) => Some(Vec::new()),
            (Some(n), nqn) => {
                let p = join(path, "namespaces");
                let items = seq(r, n, &p);
                let decoded: Vec<Option<Namespace>> = items
                    .unwrap_or_default()
                    .iter()
                    .enumerate()
                    .map(|(i, ns)| self.namespace(r, ns, &format!("{p}[{i}]"), nqn.as_deref()))
                    .collect();
                items.map(|_| decoded.into_iter().flatten().collect())
            }
        };
        let nqn = nqn?;
        let serial = match serial {
            None => default_serial(&nqn),
            Some(s) => s?,
        };
        Some(Subsystem {
            serial,
            nqn,
            allow_any_host: allow_any_host?,
            hosts: hosts?,
            model: model?,
            namespaces: namespaces?,
        })
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
        let backing = match (m.get("path"), m.get("null")) {
            (Some(_), Some(_)) => {
                let at = m.key_at("null").unwrap_or(m.at);
                r.error_at(
                    at,
                    &join(path, "null"),
                    "give either `path` or `null`, not both",
                );
                None
            }
            (None, None) => {
                r.error_at(
                    m.at,
                    path,
                    "a namespace needs `path: FILE` (a file or block device) or `null: SIZE`",
                );
                None
            }
            (Some(p), None) => {
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
            (None, Some(n)) => {
                if size_value.is_some() {
                    r.error_at(
                        m.key_at("size").unwrap_or(m.at),
                        &join(path, "size"),
                        "`size` is for `path` namespaces; a null namespace's size is the value \
                         of `null` (null: 4GiB)",
                    );
                }
                size(r, n, &join(path, "null")).map(|size| Backing::Null { size })
            }
        };
        let block_size = match m.get("block_size") {
            None => Some(None),
            Some(n) => {
                int(r, n, &join(path, "block_size"), u32::MAX.into()).map(|v| Some(v as u32))
            }
        };
        let read_only = optional(r, &m, "read_only", false, boolean);
        let uuid = m.get("uuid").map(|n| {
            let p = join(path, "uuid");
            let text = string(r, n, &p)?;
            text.parse::<Uuid>()
                .map_err(|e| r.error_at(n.at, &p, e.to_string()))
                .ok()
        });
        let nsid = nsid?;
        let uuid = match uuid {
            Some(u) => u?,
            None => Uuid::derived(nqn?, nsid),
        };
        Some(Namespace {
            nsid,
            backing: backing?,
            block_size: block_size?,
            read_only: read_only?,
            uuid,
        })
    }

    /// Every key has a default; a key that fails to decode keeps its default (the error is
    /// reported, so the configuration is rejected anyway).
    fn target(&self, r: &mut Report, node: &Node, path: &str) -> TargetSettings {
        let mut t = TargetSettings::default();
        let Some(m) = map(r, node, path, TARGET_KEYS) else {
            return t;
        };
        let u32_max = u64::from(u32::MAX);
        let u32_key = |r: &mut Report, key: &str, slot: &mut u32| {
            if let Some(v) = optional(r, &m, key, *slot, |r, n, p| {
                int(r, n, p, u32_max).map(|v| v as u32)
            }) {
                *slot = v;
            }
        };
        u32_key(r, "threads", &mut t.threads);
        u32_key(r, "max_queue_depth", &mut t.max_queue_depth);
        u32_key(r, "keep_alive_ms_min", &mut t.keep_alive_ms_min);
        u32_key(r, "idle_poll_us", &mut t.idle_poll_us);
        if let Some(v) = optional(r, &m, "in_capsule_data", t.in_capsule_data, size) {
            t.in_capsule_data = v;
        }
        if let Some(v) = optional(r, &m, "max_io_size", t.max_io_size, size) {
            t.max_io_size = v;
        }
        t
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

/// The decoded value of `key`, or `default` when it is absent or null.
fn optional<T>(
    r: &mut Report,
    m: &Map<'_>,
    key: &str,
    default: T,
    decode: impl FnOnce(&mut Report, &Node, &str) -> Option<T>,
) -> Option<T> {
    match m.get(key) {
        None => Some(default),
        Some(n) => decode(r, n, &join(&m.path, key)),
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
