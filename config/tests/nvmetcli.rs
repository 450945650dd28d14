//! `nvmetcli save` files to YAML. The data file is what nvmetcli itself saved from the Linux
//! 6.1 kernel target in the VM (`tests/vm/scenarios/nvmetcli-save-rdma-rxe.sh`).

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::{ok, TempDir};
use nvmf_config::nvmetcli::{import, ImportError};
use nvmf_config::{Backing, Transport, Uuid};

const SAVED: &str = include_str!("data/nvmetcli/linux-6.1-rxe.json");
const A: &str = "nqn.2014-08.org.nvmexpress:nvmf-rs-import-a";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427";

#[test]
fn a_saved_kernel_target_becomes_a_valid_configuration() {
    // The namespaces' storage must exist for the YAML to load: point the saved paths at
    // files here.
    let dir = TempDir::new("nvmetcli");
    let json = SAVED
        .replace("/tmp/vm-scratch/nvmetcli-save-rdma-rxe.CkBtiZ", dir.str())
        .replace(
            "/dev/ram0",
            &dir.file("ram0", 1 << 20).display().to_string(),
        );
    dir.file("file-ns.img", 1 << 20);
    dir.file("file-ns2.img", 1 << 20);
    let imp = import(&json).unwrap();
    let cfg = ok(&imp.yaml).config;

    // Ports with subsystems become listeners; port 3 (none) does not.
    let l: Vec<_> = cfg
        .listeners
        .iter()
        .map(|l| (l.transport, l.address, l.port))
        .collect();
    assert_eq!(
        l,
        [
            (
                Transport::Rdma,
                IpAddr::V4(Ipv4Addr::new(192, 168, 78, 1)),
                4420
            ),
            (Transport::Tcp, IpAddr::V4(Ipv4Addr::LOCALHOST), 4420),
        ]
    );
    let a = cfg.subsystems.iter().find(|s| s.nqn == A).unwrap();
    assert!(!a.allow_any_host);
    assert_eq!(a.hosts, [HOST]);
    assert_eq!(
        (a.serial.as_str(), a.model.as_str()),
        ("IMPORTA0001", "nvmf-rs import test")
    );
    // The disabled namespace 3 is left out; the others keep path and UUID.
    let ns: Vec<_> = a.namespaces.iter().map(|n| (n.nsid, n.uuid)).collect();
    assert_eq!(
        ns,
        [
            (
                2,
                "6dfe5a8d-023d-4df8-8234-d3f6c50b3de0"
                    .parse::<Uuid>()
                    .unwrap()
            ),
            (
                1,
                "6a0d1a1c-5b3e-4c2f-9d8e-7f6a5b4c3d2e"
                    .parse::<Uuid>()
                    .unwrap()
            ),
        ]
    );
    assert!(
        matches!(&a.namespaces[1].backing, Backing::File { path, .. } if path.ends_with("ram0"))
    );
    let t = cfg.subsystems.iter().find(|s| s.nqn == "testnqn").unwrap();
    assert!(t.allow_any_host);
    assert_eq!(t.namespaces.len(), 1);

    // Everything else set there is named, in the notes and atop the YAML.
    let want = [
        "port 3 (tcp 127.0.0.1:4421): serves no subsystem",
        "port 2: serves only nqn.2014-08.org.nvmexpress:nvmf-rs-import-a",
        "port 1: param `inline_data_size` = \"16384\"",
        "port 2: param `inline_data_size` = \"4096\"",
        "namespace 3: disabled; left out",
    ];
    for w in want {
        assert!(
            imp.notes.iter().any(|n| n.contains(w)),
            "no note {w:?} in {:#?}",
            imp.notes
        );
        assert!(imp.yaml.contains(w), "the YAML does not say {w:?}");
    }
    // nvmet's defaults (version, cntlid range, qid_max, zero NGUIDs, group 1) are not news.
    assert_eq!(imp.notes.len(), want.len(), "{:#?}", imp.notes);
}

#[test]
fn what_cannot_carry_over_is_named() {
    let json = r#"{
      "hosts": [{ "nqn": "h1", "dhchap": { "dhchap_key": "DHHC-1:00:abc:" } }],
      "ports": [
        { "portid": 1, "addr": { "trtype": "fc", "traddr": "nn-0x1:pn-0x2", "trsvcid": "none" }, "subsystems": ["s"] },
        { "portid": 2, "addr": { "trtype": "tcp", "adrfam": "ipv4", "traddr": "10.0.0.1", "trsvcid": "4420", "treq": "required" },
          "referrals": [{ "addr": {} }], "subsystems": ["s"],
          "ana_groups": [{ "grpid": 1, "ana": { "state": "inaccessible" } }] }
      ],
      "subsystems": [{ "nqn": "s", "attr": { "allow_any_host": "1", "version": "2.0", "pi_enable": "1" },
        "namespaces": [
          { "nsid": 1, "enable": 1, "ana_grpid": 2,
            "device": { "path": "/dev/x", "uuid": "6a0d1a1c-5b3e-4c2f-9d8e-7f6a5b4c3d2e", "nguid": "11111111-2222-3333-4444-555555555555" } },
          { "nsid": 2, "enable": 1, "device": { "path": "" } }
        ] }]
    }"#;
    let imp = import(json).unwrap();
    for w in [
        "host h1: `dhchap`",
        "port 1: transport `fc`",
        "port 2: addr `treq` = \"required\"",
        "port 2: `referrals`",
        "port 2: `ana_groups`",
        "subsystem s: attr `version` = \"2.0\"",
        "subsystem s: attr `pi_enable` = \"1\"",
        "namespace 1: device `nguid`",
        "namespace 1: `ana_grpid` = 2",
        "namespace 2: no device path",
    ] {
        assert!(
            imp.notes.iter().any(|n| n.contains(w)),
            "no note {w:?} in {:#?}",
            imp.notes
        );
    }
    assert!(imp.yaml.contains("address: \"10.0.0.1\""));
}

#[test]
fn not_an_nvmetcli_file() {
    assert!(matches!(import("{"), Err(ImportError::Json(_))));
    assert!(matches!(import("[1]"), Err(ImportError::Shape(_))));
    assert!(matches!(
        import(r#"{"ports": 3}"#),
        Err(ImportError::Shape(_))
    ));
    // Empty: a placeholder listener, and it says so.
    let imp = import("{}").unwrap();
    assert!(imp.notes.iter().any(|n| n.contains("no TCP or RDMA port")));
    ok(&imp.yaml);
}

/// Every saved file in the data directory imports to a configuration that loads (its storage
/// pointed at files here), with one listener per port that serves a subsystem.
#[test]
fn every_saved_file_imports() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nvmetcli");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let tmp = TempDir::new("nvmetcli-all");
        let mut json = std::fs::read_to_string(&p).unwrap();
        // "/tmp/vm-scratch/<run>/<file>" -> "<tmp>/<file>"; /dev/ram0 -> a file.
        while let Some(i) = json.find("/tmp/vm-scratch/") {
            let rest = &json[i + "/tmp/vm-scratch/".len()..];
            let run_end = rest.find('/').unwrap();
            let file_end = rest[run_end + 1..].find('"').unwrap();
            let file = rest[run_end + 1..run_end + 1 + file_end].to_owned();
            tmp.file(&file, 1 << 20);
            let new = tmp.path().join(&file).display().to_string();
            json.replace_range(
                i..i + "/tmp/vm-scratch/".len() + run_end + 1 + file_end,
                &new,
            );
        }
        json = json.replace(
            "/dev/ram0",
            &tmp.file("ram0", 1 << 20).display().to_string(),
        );
        let imp = import(&json).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let cfg = ok(&imp.yaml).config;
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let serving = v["ports"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["subsystems"].as_array().is_some_and(|s| !s.is_empty()))
            .count();
        assert_eq!(cfg.listeners.len(), serving, "{}", p.display());
        n += 1;
    }
    assert!(n >= 3, "{n} saved files");
}
