//! `nvmetcli save` JSON (the Linux kernel target's saved configuration) to this target's YAML.
//!
//! What carries over: TCP and RDMA ports with at least one subsystem (as listeners), subsystems
//! (NQN, `allow_any_host`, allowed hosts, serial, model) and their enabled namespaces (path,
//! UUID). Everything else that is set is named in [`Imported::notes`] (and as comments at the
//! top of the YAML), so nothing is dropped silently: other transports, referrals, port
//! parameters, ANA groups, disabled namespaces, NGUIDs that differ from the UUID, buffered I/O,
//! authentication keys, and every subsystem or namespace attribute this target does not have.

use std::fmt::Write as _;

use serde_json::Value;

/// The YAML and what could not be carried over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// A configuration file for `nvmf-target --config` (the notes as comments first).
    pub yaml: String,
    /// One line per nvmetcli attribute or object not carried over, naming where it was.
    pub notes: Vec<String>,
}

/// The JSON is not an nvmetcli save file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The text is not JSON.
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// JSON, but not shaped like what `nvmetcli save` writes.
    #[error("not an nvmetcli save file: {0}")]
    Shape(String),
}

/// Converts an `nvmetcli save` file.
pub fn import(json: &str) -> Result<Imported, ImportError> {
    let root: Value = serde_json::from_str(json)?;
    let root = root
        .as_object()
        .ok_or_else(|| ImportError::Shape("the top level is not an object".into()))?;
    let list = |key: &str| -> Result<Vec<Value>, ImportError> {
        match root.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => Ok(a.clone()),
            Some(_) => Err(ImportError::Shape(format!("`{key}` is not a list"))),
        }
    };
    let (ports, subsystems, hosts) = (list("ports")?, list("subsystems")?, list("hosts")?);
    let mut notes = Vec::new();
    for (key, v) in root {
        if !matches!(key.as_str(), "ports" | "subsystems" | "hosts") && is_set(v) {
            notes.push(format!("top-level `{key}`"));
        }
    }

    // Hosts: only their NQNs matter (as allowed hosts); their own attributes do not carry.
    for h in &hosts {
        let nqn = str_of(h, "nqn").unwrap_or("?");
        for (k, v) in obj_entries(h) {
            if k != "nqn" && is_set(v) {
                notes.push(format!(
                    "host {nqn}: `{k}` (authentication is not supported here)"
                ));
            }
        }
    }

    let all_subsystems: Vec<&str> = subsystems.iter().filter_map(|s| str_of(s, "nqn")).collect();
    let mut listeners = String::new();
    for p in &ports {
        let id = p
            .get("portid")
            .map_or_else(|| "?".into(), |v| v.to_string());
        let addr = p.get("addr").cloned().unwrap_or(Value::Null);
        let trtype = str_of(&addr, "trtype").unwrap_or("");
        let served: Vec<&str> = p
            .get("subsystems")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !matches!(trtype, "tcp" | "rdma") {
            notes.push(format!(
                "port {id}: transport `{trtype}` (only tcp and rdma here); left out"
            ));
            continue;
        }
        if served.is_empty() {
            notes.push(format!(
                "port {id} ({trtype} {}:{}): serves no subsystem, so nvmet does not listen on it; left out",
                str_of(&addr, "traddr").unwrap_or("?"),
                str_of(&addr, "trsvcid").unwrap_or("?")
            ));
            continue;
        }
        if served.len() < all_subsystems.len() {
            notes.push(format!(
                "port {id}: serves only {}; here every listener serves every subsystem",
                served.join(", ")
            ));
        }
        for (k, v) in obj_entries(&addr) {
            match (k, v.as_str()) {
                ("trtype" | "traddr" | "trsvcid", _) => {}
                ("adrfam", Some("ipv4" | "ipv6")) => {}
                ("treq", Some("not specified")) => {}
                ("tsas", Some("none" | "")) => {}
                _ if !is_set(v) => {}
                _ => notes.push(format!("port {id}: addr `{k}` = {v}")),
            }
        }
        for (k, v) in obj_entries(p) {
            match k {
                "addr" | "portid" | "subsystems" => {}
                "referrals" | "param" if !is_set(v) => {}
                "ana_groups" if default_ana(v) => {}
                "param" => {
                    for (pk, pv) in obj_entries(v) {
                        if is_set(pv) {
                            notes.push(format!(
                                "port {id}: param `{pk}` = {pv} (target-wide settings live in `target:`)"
                            ));
                        }
                    }
                }
                _ if !is_set(v) => {}
                _ => notes.push(format!("port {id}: `{k}` = {v}")),
            }
        }
        let traddr = str_of(&addr, "traddr")
            .ok_or_else(|| ImportError::Shape(format!("port {id} has no addr.traddr")))?;
        let port: u16 = str_of(&addr, "trsvcid")
            .unwrap_or("4420")
            .parse()
            .map_err(|_| ImportError::Shape(format!("port {id}: trsvcid is not a port number")))?;
        let _ = writeln!(
            listeners,
            "  - {{ transport: {trtype}, address: {}, port: {port} }}",
            quote(traddr)
        );
    }

    let mut subs = String::new();
    for s in &subsystems {
        let nqn =
            str_of(s, "nqn").ok_or_else(|| ImportError::Shape("a subsystem without nqn".into()))?;
        let attr = s.get("attr").cloned().unwrap_or(Value::Null);
        let _ = writeln!(subs, "  - nqn: {}", quote(nqn));
        let any = attr_str(&attr, "allow_any_host") == Some("1");
        let _ = writeln!(subs, "    allow_any_host: {any}");
        let hosts: Vec<&str> = s
            .get("allowed_hosts")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !hosts.is_empty() {
            let _ = writeln!(subs, "    hosts:");
            for h in &hosts {
                let _ = writeln!(subs, "      - {}", quote(h));
            }
        }
        for (k, v) in obj_entries(&attr) {
            let val = v.as_str().map(str::trim).unwrap_or_default();
            match k {
                "allow_any_host" => {}
                "serial" if !val.is_empty() => {
                    let _ = writeln!(subs, "    serial: {}", quote(val));
                }
                "model" if !val.is_empty() => {
                    let _ = writeln!(subs, "    model: {}", quote(val));
                }
                // nvmet's own defaults (Linux 6.1): nothing was set.
                "version" if val == "1.3" => {}
                "cntlid_min" if val == "1" => {}
                "cntlid_max" if val == "65519" => {}
                "qid_max" if val == "128" => {}
                "ieee_oui" if val == "0x000000" => {}
                _ if !is_set(v) => {}
                _ => notes.push(format!("subsystem {nqn}: attr `{k}` = {v}")),
            }
        }
        for (k, v) in obj_entries(s) {
            if !matches!(k, "nqn" | "attr" | "allowed_hosts" | "namespaces") && is_set(v) {
                notes.push(format!("subsystem {nqn}: `{k}` = {v}"));
            }
        }
        let namespaces = s
            .get("namespaces")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut ns_lines = String::new();
        for n in &namespaces {
            let nsid = n.get("nsid").and_then(Value::as_u64).ok_or_else(|| {
                ImportError::Shape(format!("subsystem {nqn}: a namespace without nsid"))
            })?;
            let dev = n.get("device").cloned().unwrap_or(Value::Null);
            let at = format!("subsystem {nqn} namespace {nsid}");
            if n.get("enable").and_then(Value::as_u64) == Some(0) {
                notes.push(format!("{at}: disabled; left out"));
                continue;
            }
            let Some(path) = str_of(&dev, "path").filter(|p| !p.is_empty()) else {
                notes.push(format!("{at}: no device path; left out"));
                continue;
            };
            let uuid = str_of(&dev, "uuid").filter(|u| !u.is_empty());
            let mut line = format!("      - {{ nsid: {nsid}, path: {}", quote(path));
            if let Some(u) = uuid {
                let _ = write!(line, ", uuid: {}", quote(u));
            }
            line.push_str(" }\n");
            ns_lines.push_str(&line);
            for (k, v) in obj_entries(&dev) {
                match k {
                    "path" | "uuid" => {}
                    "nguid" if !is_set(v) || nguid_matches(v, uuid) => {}
                    "nguid" => notes.push(format!(
                        "{at}: device `nguid` = {v} (here the NGUID is the namespace UUID)"
                    )),
                    _ if !is_set(v) => {}
                    _ => notes.push(format!("{at}: device `{k}` = {v}")),
                }
            }
            for (k, v) in obj_entries(n) {
                match k {
                    "nsid" | "device" | "enable" => {}
                    "ana_grpid" if v.as_u64() == Some(1) => {}
                    "ana" if v.get("grpid").and_then(Value::as_str) == Some("1") => {}
                    "buffered_io" if v.as_u64() == Some(0) || v.as_str() == Some("0") => {}
                    "buffered_io" => notes.push(format!(
                        "{at}: `buffered_io` = {v} (here files use O_DIRECT unless the file system refuses it)"
                    )),
                    _ if !is_set(v) => {}
                    _ => notes.push(format!("{at}: `{k}` = {v}")),
                }
            }
        }
        if !ns_lines.is_empty() {
            let _ = writeln!(subs, "    namespaces:");
            subs.push_str(&ns_lines);
        }
    }

    let mut yaml =
        String::from("# Imported from an nvmetcli save file by `nvmf-target import-nvmetcli`.\n");
    if notes.is_empty() {
        yaml.push_str("# Everything set there is carried over.\n");
    } else {
        yaml.push_str("# Not carried over:\n");
        for n in &notes {
            let _ = writeln!(yaml, "#   {n}");
        }
    }
    if listeners.is_empty() {
        notes.push("no TCP or RDMA port serves a subsystem: add a listener".into());
        yaml.push_str("# No usable port: a listener on 127.0.0.1:4420 stands in.\n");
        listeners.push_str("  - { transport: tcp, address: 127.0.0.1, port: 4420 }\n");
    }
    yaml.push_str("listeners:\n");
    yaml.push_str(&listeners);
    if subs.is_empty() {
        yaml.push_str("subsystems: []\n");
    } else {
        yaml.push_str("subsystems:\n");
        yaml.push_str(&subs);
    }
    Ok(Imported { yaml, notes })
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// An attribute as nvmetcli writes it (a string, sometimes a number).
fn attr_str<'a>(attr: &'a Value, key: &str) -> Option<&'a str> {
    attr.get(key).and_then(Value::as_str).map(str::trim)
}

fn obj_entries(v: &Value) -> Vec<(&str, &Value)> {
    v.as_object()
        .map(|o| o.iter().map(|(k, v)| (k.as_str(), v)).collect())
        .unwrap_or_default()
}

/// Whether a value says anything: not null, empty, zero, "0", "none" or "".
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !matches!(
            s.trim(),
            "" | "0" | "-1" | "none" | "(null)" | "00000000-0000-0000-0000-000000000000"
        ),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => o.values().any(is_set),
    }
}

/// The ANA groups a port has by default: group 1, optimized.
fn default_ana(v: &Value) -> bool {
    match v.as_array() {
        None => !is_set(v),
        Some(groups) => groups.iter().all(|g| {
            g.get("grpid").and_then(Value::as_u64) == Some(1)
                && g.get("ana")
                    .and_then(|a| a.get("state"))
                    .and_then(Value::as_str)
                    .is_none_or(|s| s == "optimized")
        }),
    }
}

fn nguid_matches(nguid: &Value, uuid: Option<&str>) -> bool {
    let hex = |s: &str| {
        s.chars()
            .filter(|c| *c != '-')
            .collect::<String>()
            .to_lowercase()
    };
    match (nguid.as_str(), uuid) {
        (Some(n), Some(u)) => hex(n) == hex(u),
        _ => false,
    }
}

/// A YAML double-quoted scalar.
fn quote(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}
