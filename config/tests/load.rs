//! Valid configurations: parsing, defaults, examples, round trips, the embedded default.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use common::{ok, TempDir};
use nvmf_config::{
    default_serial, Backing, Config, ConfigError, Listener, Severity, Size, TargetSettings,
    Transport, Uuid, DEFAULT_SUBSYSTEM_NQN,
};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0c7b7e4a-1f2e-4c3d-9a8b-7c6d5e4f3a2b";

/// The example of the configuration brief, with its file in `dir`.
fn brief_example(dir: &str) -> String {
    format!(
        "\
listeners:
  - {{ transport: tcp,  address: 0.0.0.0,      port: 4420 }}
  - {{ transport: rdma, address: 192.168.78.1, port: 4420 }}
subsystems:
  - nqn: nqn.2026-11.io.example:disk1
    allow_any_host: false
    hosts: [ \"{HOST}\" ]
    serial: \"NVMFRS0001\"          # optional (default derived from the NQN)
    model: \"nvmf-rs\"              # optional
    namespaces:
      - {{ nsid: 1, path: {dir}/disk1.img, size: 1GiB }}
      - {{ nsid: 2, null: 4GiB }}
target: {{ threads: 1, in_capsule_data: 8KiB, max_queue_depth: 128, max_io_size: 128KiB, keep_alive_ms_min: 1000, idle_poll_us: 1000 }}
metrics: {{ listen: 127.0.0.1:9940 }}
"
    )
}

#[test]
fn brief_example_parses() {
    let dir = TempDir::new("brief");
    let loaded = ok(&brief_example(dir.str()));
    assert_eq!(loaded.warnings, []);
    let c = loaded.config;
    assert_eq!(
        c.listeners,
        [
            Listener::new(Transport::Tcp, Ipv4Addr::UNSPECIFIED.into(), 4420),
            Listener::new(Transport::Rdma, Ipv4Addr::new(192, 168, 78, 1).into(), 4420),
        ]
    );
    let s = &c.subsystems[0];
    assert_eq!(s.nqn, "nqn.2026-11.io.example:disk1");
    assert!(!s.allow_any_host);
    assert_eq!(s.hosts, [HOST]);
    assert_eq!(
        (s.serial.as_str(), s.model.as_str()),
        ("NVMFRS0001", "nvmf-rs")
    );
    assert_eq!(s.namespaces.len(), 2);
    let ns1 = &s.namespaces[0];
    assert_eq!(ns1.nsid, 1);
    assert_eq!(
        ns1.backing,
        Backing::File {
            path: dir.path().join("disk1.img"),
            size: Some(Size::gib(1))
        }
    );
    assert_eq!(ns1.block_size, Some(4096));
    assert!(!ns1.read_only);
    assert_eq!(ns1.uuid, Uuid::derived("nqn.2026-11.io.example:disk1", 1));
    let ns2 = &s.namespaces[1];
    assert_eq!(ns2.backing, Backing::Null { size: Size::gib(4) });
    assert_eq!(ns2.block_size, Some(4096));
    // The example states max_io_size: 128KiB (the default is 8MiB, in 128KiB pieces).
    assert_eq!(
        c.target,
        TargetSettings {
            max_io_size: Size::kib(128),
            ..TargetSettings::default()
        }
    );
    assert_eq!(
        c.metrics.unwrap().listen,
        SocketAddr::from(([127, 0, 0, 1], 9940))
    );
}

#[test]
fn defaults_are_filled_in() {
    let c = ok("\
listeners:
  - { transport: tcp, address: '::' }
subsystems:
  - nqn: nqn.2026-11.io.example:d
    hosts: [ nqn.2026-11.io.example:h ]
    namespaces:
      - { nsid: 7, null: 1GiB }
")
    .config;
    assert_eq!(c.listeners[0].port, 4420);
    assert_eq!(c.listeners[0].address, "::".parse::<IpAddr>().unwrap());
    let s = &c.subsystems[0];
    assert!(!s.allow_any_host);
    assert_eq!(s.serial, default_serial("nqn.2026-11.io.example:d"));
    assert_eq!(s.model, "nvmf-rs");
    let ns = &s.namespaces[0];
    assert_eq!((ns.block_size, ns.read_only), (Some(4096), false));
    assert_eq!(ns.uuid, Uuid::derived("nqn.2026-11.io.example:d", 7));
    assert_eq!(c.target.threads, 1);
    assert_eq!(c.target.in_capsule_data, Size::kib(8));
    assert_eq!(c.target.max_queue_depth, 128);
    assert_eq!(c.target.max_io_size, Size::mib(8));
    assert_eq!(c.target.io_unit_size, Size::kib(128));
    assert_eq!(c.target.keep_alive_ms_min, 1000);
    assert_eq!(c.target.idle_poll_us, 1000);
    assert_eq!(c.target.polling, nvmf_config::Polling::Adaptive);
    assert_eq!(c.target.c2h_success, nvmf_config::C2hSuccess::Spec);
    assert_eq!(c.metrics, None);
}

#[test]
fn explicit_nulls_mean_defaults() {
    let c = ok("\
listeners:
  - { transport: tcp, address: 127.0.0.1, port: ~ }
subsystems:
  - nqn: nqn.2026-11.io.example:d
    allow_any_host: true
    serial:
    namespaces:
      - { nsid: 1, null: 1GiB, block_size: null, uuid: ~ }
target:
metrics: null
")
    .config;
    assert_eq!(c.listeners[0].port, 4420);
    assert_eq!(
        c.subsystems[0].serial,
        default_serial("nqn.2026-11.io.example:d")
    );
    assert_eq!(c.subsystems[0].namespaces[0].block_size, Some(4096));
    assert_eq!(c.target, TargetSettings::default());
    assert_eq!(c.metrics, None);
}

#[test]
fn scalar_spellings() {
    let c = ok("\
listeners:
  - { transport: tcp, address: 127.0.0.1, port: 0x1144 }
subsystems:
  - nqn: 'nqn.2026-11.io.example:s'
    allow_any_host: True
    serial: 0042
    namespaces:
      - { nsid: 0o10, null: 1073741824 }
      - { nsid: 2, null: \"1G\" }
      - { nsid: 3, null: 8GB }
      - { nsid: 4, null: 2 MiB, block_size: 512 }
target: { in_capsule_data: 0, max_io_size: 1M }
")
    .config;
    assert_eq!(c.listeners[0].port, 4420);
    let s = &c.subsystems[0];
    assert!(s.allow_any_host);
    assert_eq!(
        s.serial, "0042",
        "a plain scalar keeps its text for string keys"
    );
    let sizes: Vec<_> = s
        .namespaces
        .iter()
        .map(|ns| match ns.backing {
            Backing::Null { size } => (ns.nsid, size.bytes()),
            Backing::File { .. } | Backing::Rbd(_) => unreachable!(),
        })
        .collect();
    assert_eq!(
        sizes,
        [(8, 1 << 30), (2, 1 << 30), (3, 8_000_000_000), (4, 2 << 20)]
    );
    assert_eq!(c.target.in_capsule_data, Size(0));
    assert_eq!(c.target.max_io_size, Size::mib(1));
}

#[test]
fn examples_load() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let minimal = Config::load(examples.join("minimal.yaml")).expect("minimal.yaml");
    assert_eq!(minimal.warnings, []);
    assert_eq!(
        minimal.config.subsystems[0].namespaces[0].backing,
        Backing::Null { size: Size::gib(1) }
    );

    // full.yaml names files under /var/lib/nvmf; run it against a scratch directory.
    let dir = TempDir::new("full");
    let text = std::fs::read_to_string(examples.join("full.yaml")).unwrap();
    assert!(text.contains("/var/lib/nvmf/"));
    let file = dir.path().join("full.yaml");
    std::fs::write(
        &file,
        text.replace("/var/lib/nvmf/", &format!("{}/", dir.str())),
    )
    .unwrap();
    let full = Config::load(&file).unwrap_or_else(|e| panic!("full.yaml:\n{e}"));
    assert_eq!(full.warnings, []);
    let c = &full.config;
    assert_eq!(c.listeners.len(), 2);
    assert_eq!(c.subsystems.len(), 2);
    assert_eq!(c.subsystems[0].hosts.len(), 2);
    let ns3 = &c.subsystems[0].namespaces[2];
    assert_eq!(
        ns3.backing,
        Backing::File {
            path: dir.path().join("disk3.img"),
            size: Some(Size(8_000_000_000))
        }
    );
    assert!(ns3.read_only);
    assert_eq!(ns3.uuid.to_string(), "6f1d2c3b-4a59-4e8d-9c7b-1a2b3c4d5e6f");
    assert_eq!(c.subsystems[0].namespaces[1].block_size, Some(512));
    assert!(c.metrics.is_some());
}

/// to_yaml, then parse: the same configuration, and the same text again.
fn assert_round_trip(c: &Config) {
    let text = c.to_yaml();
    let again = Config::from_yaml_str(&text, "resolved.yaml")
        .unwrap_or_else(|e| panic!("to_yaml output does not load:\n{e}\n--- text:\n{text}"));
    assert_eq!(&again.config, c, "--- text:\n{text}");
    assert_eq!(again.config.to_yaml(), text);
}

#[test]
fn round_trip() {
    let dir = TempDir::new("rt");
    assert_round_trip(&ok(&brief_example(dir.str())).config);
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    assert_round_trip(&Config::load(examples.join("minimal.yaml")).unwrap().config);
}

/// Odd sizes (printed as plain bytes), IPv6, an existing file without `size`, strings that
/// look like numbers or booleans, every limit at its edge.
#[test]
fn round_trip_of_unusual_values() {
    let dir = TempDir::new("rt2");
    dir.file("existing.img", 3 * 512);
    let c = ok(&format!(
        "\
listeners:
  - {{ transport: rdma, address: 'fe80::1', port: 1 }}
subsystems:
  - nqn: 'nqn.2026-11.io.example:odd: name with spaces'
    hosts: [ {HOST} ]
    serial: '0042'
    model: 'true'
    namespaces:
      - {{ nsid: 4294967294, null: 1536, block_size: 512, read_only: true }}
      - {{ nsid: 9, path: {}/existing.img, block_size: 512 }}
target: {{ threads: 1024, in_capsule_data: 16, max_queue_depth: 2, max_io_size: 4MiB, keep_alive_ms_min: 100, idle_poll_us: 0, polling: busy, c2h_success: always, tcp_receive: io_uring, tcp_send: sendmsg }}
metrics: {{ listen: '[::1]:9940' }}
",
        dir.str()
    ))
    .config;
    assert_eq!(c.subsystems[0].model, "true");
    assert_eq!(c.target.polling, nvmf_config::Polling::Busy);
    assert_eq!(c.target.c2h_success, nvmf_config::C2hSuccess::Always);
    assert_eq!(c.target.tcp_receive, nvmf_config::TcpReceive::IoUring);
    assert_eq!(c.target.tcp_send, nvmf_config::TcpSend::Sendmsg);
    assert_round_trip(&c);
}

#[test]
fn embedded_default() {
    let dir = TempDir::new("default");
    let c = Config::embedded_default(dir.path().join("default.img"));
    assert_eq!(c.validate().expect("valid"), []);
    assert_eq!(
        c.listeners,
        [Listener::new(
            Transport::Tcp,
            Ipv4Addr::LOCALHOST.into(),
            4420
        )]
    );
    let s = &c.subsystems[0];
    assert_eq!(s.nqn, DEFAULT_SUBSYSTEM_NQN);
    assert!(s.allow_any_host);
    assert_eq!(
        s.namespaces[0].backing,
        Backing::File {
            path: dir.path().join("default.img"),
            size: Some(Size::gib(1))
        }
    );
    assert_eq!(c.target.threads, 1);
    assert_round_trip(&c);

    // Programmatic validation reports without positions.
    let bad = Config::embedded_default("/nonexistent-dir/default.img".into());
    let err = bad.validate().unwrap_err();
    assert_eq!(
        err.to_string(),
        "<config>: subsystems[0].namespaces[0].path: `/nonexistent-dir/default.img` cannot be \
         created: directory `/nonexistent-dir` does not exist"
    );
}

#[test]
fn load_errors_and_relative_paths() {
    let dir = TempDir::new("load");
    let missing = dir.path().join("nope.yaml");
    let err = Config::load(&missing).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(err.to_string().starts_with(&format!(
        "{}: cannot read the configuration: ",
        missing.display()
    )));
    assert!(matches!(
        Config::load(dir.path()).unwrap_err(),
        ConfigError::Read { .. }
    ));

    // Relative namespace paths start at the configuration file's directory.
    std::fs::create_dir(dir.path().join("img")).unwrap();
    let file = dir.path().join("t.yaml");
    std::fs::write(
        &file,
        "listeners: [ { transport: tcp, address: 127.0.0.1 } ]\nsubsystems:\n  - nqn: \
         nqn.2026-11.io.example:r\n    allow_any_host: true\n    namespaces: [ { nsid: 1, path: \
         img/r.img, size: 1MiB } ]\n",
    )
    .unwrap();
    let c = Config::load(&file).unwrap().config;
    assert_eq!(
        c.subsystems[0].namespaces[0].path(),
        Some(dir.path().join("img/r.img").as_path())
    );

    // Diagnostics name the file as given, one per line.
    std::fs::write(&file, "listeners: []\ntarget: { threads: 0 }\n").unwrap();
    let err = Config::load(&file).unwrap_err();
    let f = file.display();
    assert_eq!(
        err.to_string(),
        format!(
            "{f}:1:12: listeners: at least one listener is required\n{f}:2:20: target.threads: \
             threads 0 is out of range (1 to 1024)"
        )
    );
    assert_eq!(err.errors().len(), 2);
    assert!(err.errors().iter().all(|d| d.severity == Severity::Error));

    // Bytes that are not UTF-8 are located.
    std::fs::write(
        &file,
        b"listeners:\n  - { transport: tcp, address: 127.0.0.\xff }\n",
    )
    .unwrap();
    let err = Config::load(&file).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{f}:2:40: the file is not valid UTF-8")
    );
}

#[test]
fn block_devices() {
    // Any block device the test can see will do: config only stats it.
    let device = std::fs::read_dir("/dev").ok().and_then(|entries| {
        entries.flatten().map(|e| e.path()).find(|p| {
            use std::os::unix::fs::FileTypeExt;
            std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
        })
    });
    let Some(device) = device else {
        eprintln!("skipped: no block device under /dev");
        return;
    };
    let d = device.display();
    let text = |extra: &str| {
        format!(
            "listeners: [ {{ transport: tcp, address: 127.0.0.1 }} ]\nsubsystems:\n  - nqn: \
             nqn.2026-11.io.example:b\n    allow_any_host: true\n    namespaces:\n      - {{ \
             nsid: 1, path: {d}{extra} }}\n"
        )
    };
    let c = ok(&text("")).config;
    assert_eq!(
        c.subsystems[0].namespaces[0].block_size, None,
        "the device's own block size"
    );
    assert_round_trip(&c);
    assert_eq!(
        ok(&text(", block_size: 512")).config.subsystems[0].namespaces[0].block_size,
        Some(512)
    );
    let errs = common::errors(&text(", size: 1GiB"));
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].contains("namespaces[0].size: `size` cannot be given for a block device"),
        "{errs:?}"
    );
}

#[test]
fn shared_backing_file_is_a_warning() {
    let dir = TempDir::new("shared");
    dir.file("a.img", 1 << 20);
    let d = dir.str();
    let w = common::warnings(&format!(
        "listeners: [ {{ transport: tcp, address: 127.0.0.1 }} ]\nsubsystems:\n  - nqn: \
         nqn.2026-11.io.example:a\n    allow_any_host: true\n    namespaces:\n      - {{ nsid: 1, \
         path: {d}/a.img }}\n      - {{ nsid: 2, path: {d}/./a.img }}\n"
    ));
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("t.yaml:7:26: warning: subsystems[0].namespaces[1].path:"),
        "{w:?}"
    );
    assert!(w[0].contains("also backs the namespace at line 6"), "{w:?}");
}

#[test]
fn anchors_comments_and_flow_style_are_accepted() {
    let c = ok("\
# comment
listeners: &l   # an anchor without an alias is harmless
  - {transport: tcp, address: 127.0.0.1}  # flow mapping in a block list
subsystems: [ { nqn: 'nqn.2026-11.io.example:f', allow_any_host: true,
                namespaces: [ { nsid: 1, null: 1GiB } ] } ]
")
    .config;
    assert_eq!(c.listeners.len(), 1);
    assert_eq!(c.subsystems[0].namespaces[0].nsid, 1);
}

#[test]
fn dhchap_hosts_policies_and_key_files() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("nvmf-config-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = nvme::auth::Secret::from_key(&[7; 32], Some(nvmf_config::HashId::Sha256)).unwrap();
    let key = dir.join("host1.key");
    std::fs::write(&key, format!("{}\n", secret.to_text().as_str())).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let inline = nvme::auth::Secret::from_key(&[9; 48], None).unwrap();
    let text = format!(
        "listeners: [ {{ transport: tcp, address: 127.0.0.1 }} ]\n\
         subsystems:\n  - nqn: nqn.2026-11.io.example:a\n    \
         hosts:\n      - nqn.2026-11.io.example:plain\n      \
         - {{ nqn: nqn.2026-11.io.example:h1, dhchap_key_file: host1.key }}\n      \
         - {{ nqn: nqn.2026-11.io.example:h2, dhchap_key: \"{k}\", dhchap_ctrl_key: \"{k}\" }}\n    \
         dhchap_hashes: [ sha256 ]\n    dhchap_dhgroups: [ null, ffdhe2048 ]\n    \
         namespaces: [ {{ nsid: 1, null: 1GiB }} ]\n",
        k = inline.to_text().as_str()
    );
    let cfg_path = dir.join("t.yaml");
    std::fs::write(&cfg_path, &text).unwrap();
    let c = Config::load(&cfg_path).unwrap().config;
    let s = &c.subsystems[0];
    assert_eq!(s.hosts[0], "nqn.2026-11.io.example:plain");
    assert_eq!(s.hosts[1].dhchap_key.as_ref().unwrap().secret, secret);
    assert_eq!(
        s.hosts[1].dhchap_key.as_ref().unwrap().file.as_deref(),
        Some(&*key)
    );
    assert_eq!(s.hosts[2].dhchap_ctrl_key.as_ref().unwrap().secret, inline);
    assert_eq!(s.dhchap_hashes, [nvmf_config::HashId::Sha256]);
    assert_eq!(
        s.dhchap_dhgroups,
        [nvmf_config::DhGroup::Null, nvmf_config::DhGroup::Ffdhe2048]
    );
    // Shown without secrets; written back with them (the file stays a file).
    let shown = c.to_yaml();
    assert!(!shown.contains("DHHC-1"), "{shown}");
    assert!(
        shown.contains("<secret>") && shown.contains("host1.key"),
        "{shown}"
    );
    let again = Config::from_yaml_str(&c.to_yaml_with_secrets(), "again.yaml").unwrap();
    assert_eq!(again.config, c);
    assert!(!format!("{c:?}").contains("DHHC-1"));

    // A key file others can read is refused, naming the file and the line, not the key.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = Config::load(&cfg_path).unwrap_err().to_string();
    assert!(e.contains("t.yaml:6:60:") && e.contains("chmod 600"), "{e}");
    // A mistyped inline key: the CRC says so, and the key is not quoted.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let bad = text.replacen("DHHC-1:00:CQk", "DHHC-1:00:CQl", 1);
    assert_ne!(bad, text);
    let e = Config::from_yaml_str(&bad, "t.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("CRC-32") && !e.contains("DHHC-1:00:"), "{e}");
    // A controller key alone, and an unknown hash.
    let e = Config::from_yaml_str(
        &text
            .replace(
                "dhchap_key_file: host1.key",
                &format!("dhchap_ctrl_key: \"{}\"", inline.to_text().as_str()),
            )
            .replace("[ sha256 ]", "[ md5 ]"),
        "t.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("needs a host key") && e.contains("unknown `md5`"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tls_listeners_and_host_psks() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("nvmf-config-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let psk = nvme::tls::ConfiguredPsk::from_key(&[5; 32]).unwrap();
    let file = dir.join("h1.psk");
    std::fs::write(&file, format!("{}\n", psk.to_text().as_str())).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let inline = nvme::tls::ConfiguredPsk::from_key(&[6; 48]).unwrap();
    let text = format!(
        "listeners:\n  - {{ transport: tcp, address: 127.0.0.1, tls: required }}\n  \
         - {{ transport: tcp, address: 127.0.0.1, port: 4421, tls: allowed }}\n\
         subsystems:\n  - nqn: nqn.2026-11.io.example:a\n    \
         hosts:\n      - {{ nqn: nqn.2026-11.io.example:h1, tls_psk_file: h1.psk }}\n      \
         - {{ nqn: nqn.2026-11.io.example:h2, tls_psk: \"{k}\" }}\n    \
         namespaces: [ {{ nsid: 1, null: 1GiB }} ]\n",
        k = inline.to_text().as_str()
    );
    let cfg_path = dir.join("t.yaml");
    std::fs::write(&cfg_path, &text).unwrap();
    let c = Config::load(&cfg_path).unwrap().config;
    assert_eq!(c.listeners[0].tls, Some(nvmf_config::TlsMode::Required));
    assert_eq!(c.listeners[1].tls, Some(nvmf_config::TlsMode::Allowed));
    let hosts = &c.subsystems[0].hosts;
    assert_eq!(hosts[0].tls_psk.as_ref().unwrap().psk, psk);
    assert_eq!(
        hosts[0].tls_psk.as_ref().unwrap().file.as_deref(),
        Some(&*file)
    );
    assert_eq!(hosts[1].tls_psk.as_ref().unwrap().psk, inline);
    // Shown without the key, written back with it.
    let shown = c.to_yaml();
    assert!(!shown.contains("NVMeTLSkey"), "{shown}");
    assert!(
        shown.contains("<secret>") && shown.contains("h1.psk") && shown.contains("tls: required"),
        "{shown}"
    );
    let again = Config::from_yaml_str(&c.to_yaml_with_secrets(), "again.yaml").unwrap();
    assert_eq!(again.config, c);
    assert!(!format!("{c:?}").contains("NVMeTLSkey"));
    // A key file others can read, a mistyped key, an unknown mode, TLS on RDMA.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let e = Config::load(&cfg_path).unwrap_err().to_string();
    assert!(e.contains("t.yaml:7:") && e.contains("chmod 600"), "{e}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let k = inline.to_text();
    let typo = format!("{}{}", &k[..20], if &k[20..21] == "A" { "B" } else { "A" }) + &k[21..];
    let bad = text
        .replace(k.as_str(), &typo)
        .replace("tls: allowed", "tls: maybe");
    let e = Config::from_yaml_str(&bad, "t.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not a TLS PSK") && !e.contains("NVMeTLSkey-1:02:"),
        "{e}"
    );
    assert!(e.contains("unknown TLS mode `maybe`"), "{e}");
    let e = Config::from_yaml_str(
        &text.replace(
            "{ transport: tcp, address: 127.0.0.1, port: 4421,",
            "{ transport: rdma, address: 127.0.0.1, port: 4421,",
        ),
        "t.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("only a tcp listener has `tls`"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn listeners_serve_subsystems_with_ana_states() {
    // The form issue #19 gives (with null namespaces instead of a disk).
    let text = r#"
listeners:
  - { transport: tcp, address: 10.0.0.1, port: 4420, subsystems: [ "nqn.2026-11.io.example:disk1" ], ana: { 1: optimized, 2: non-optimized } }
  - { transport: tcp, address: 10.0.0.2, port: 4420, ana: { 1: inaccessible, 2: optimized } }
subsystems:
  - nqn: nqn.2026-11.io.example:disk1
    allow_any_host: true
    namespaces: [ { nsid: 1, null: 1GiB, ana_group: 1 }, { nsid: 2, null: 1GiB, ana_group: 2 } ]
  - nqn: nqn.2026-11.io.example:disk2
    allow_any_host: true
    namespaces: [ { nsid: 1, null: 1GiB } ]
"#;
    let c = Config::from_yaml_str(text, "t.yaml").unwrap().config;
    let (a, b) = (&c.listeners[0], &c.listeners[1]);
    assert!(a.serves("nqn.2026-11.io.example:disk1") && !a.serves("nqn.2026-11.io.example:disk2"));
    assert!(b.serves("nqn.2026-11.io.example:disk2"));
    assert_eq!(a.ana_state(2), nvmf_config::AnaState::NonOptimized);
    assert_eq!(b.ana_state(1), nvmf_config::AnaState::Inaccessible);
    assert_eq!(b.ana_state(7), nvmf_config::AnaState::Optimized);
    assert_eq!(c.subsystems[0].namespaces[1].ana_group, 2);
    assert_eq!(c.subsystems[1].namespaces[0].ana_group, 1);
    let again = Config::from_yaml_str(&c.to_yaml(), "again.yaml").unwrap();
    assert_eq!(again.config, c);
    // Errors, with their places.
    let bad = text
        .replace(
            "subsystems: [ \"nqn.2026-11.io.example:disk1\" ]",
            "subsystems: [ \"nqn.2026-11.io.example:nope\" ]",
        )
        .replace("2: non-optimized", "200: optimized")
        .replace("2: optimized }", "2: standby }")
        .replace("ana_group: 2", "ana_group: 0");
    let e = Config::from_yaml_str(&bad, "t.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no subsystem `nqn.2026-11.io.example:nope`"),
        "{e}"
    );
    assert!(
        e.contains("`200` is not an ANA group") && e.contains("unknown ANA state `standby`"),
        "{e}"
    );
    assert!(
        e.contains("t.yaml:8:92:") && e.contains("an ANA group is 1 to 128"),
        "{e}"
    );
}
