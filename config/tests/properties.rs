//! Property tests: generated configurations survive to_yaml and back; arbitrary edits of a
//! valid file never panic the loader, and every diagnostic points inside the text.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use nvmf_config::{
    default_dhchap_dhgroups, default_serial, AnaState, Backing, Config, ConfigError, HashId, Host,
    Key, Listener, Metrics, Namespace, Size, Subsystem, TargetSettings, Transport, Uuid,
};
use proptest::prelude::*;

fn transport() -> impl Strategy<Value = Transport> {
    prop_oneof![Just(Transport::Tcp), Just(Transport::Rdma)]
}

fn address() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        (1u8..=223, any::<u8>(), any::<u8>(), 1u8..=254)
            .prop_map(|(a, b, c, d)| IpAddr::V4(Ipv4Addr::new(a, b, c, d))),
        any::<[u16; 8]>()
            .prop_filter("unicast", |s| s[0] >> 8 != 0xff
                && s.iter().any(|&x| x != 0))
            .prop_map(|s| IpAddr::V6(Ipv6Addr::from(s))),
    ]
}

/// Text that is awkward for YAML: indicators, quotes, blanks, things that look like numbers,
/// booleans or nulls, and non-ASCII.
fn tricky_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9][-a-z0-9:. #'\"!&*@%{}\\[\\],|>?`]{0,30}",
        Just("true".to_owned()),
        Just("null".to_owned()),
        Just("~".to_owned()),
        Just("0x10".to_owned()),
        Just("- a".to_owned()),
        Just("ü: ß".to_owned()),
        Just("a: b".to_owned()),
    ]
}

/// Printable ASCII without leading/trailing blanks, 1..=max characters.
fn ascii_field(max: usize) -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!("[!-~]([ -~]{{0,{}}}[!-~])?", max - 2)).unwrap()
}

fn namespace(nqn: String, nsid: u32) -> impl Strategy<Value = Namespace> {
    (
        prop_oneof![Just(512u32), Just(4096u32)],
        1u64..1 << 20,
        any::<bool>(),
        proptest::option::of(any::<[u8; 16]>().prop_filter("not nil", |b| *b != [0; 16])),
    )
        .prop_map(move |(bs, blocks, read_only, uuid)| Namespace {
            nsid,
            backing: Backing::Null {
                size: Size(blocks * u64::from(bs)),
            },
            block_size: Some(bs),
            read_only,
            ana_group: nsid % 3 + 1,
            uuid: uuid.map(Uuid).unwrap_or_else(|| Uuid::derived(&nqn, nsid)),
        })
}

fn subsystem(index: usize) -> impl Strategy<Value = Subsystem> {
    (
        tricky_text(),
        any::<bool>(),
        proptest::collection::vec(tricky_text(), 0..3),
        proptest::option::of(ascii_field(20)),
        ascii_field(40),
        proptest::collection::btree_set(1u32..0xffff_fffe, 0..4),
    )
        .prop_flat_map(move |(name, allow_any_host, hosts, serial, model, nsids)| {
            let nqn = format!("nqn.2026-11.io.example:{index}{name}");
            let hosts: Vec<Host> = hosts
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    let mut host = Host::plain(format!("nqn.2026-11.io.example.hosts:{i}{h}"));
                    // Every other host has secrets (inline; odd ones bidirectional).
                    if i % 2 == 1 {
                        let key = |fill: u8| Key {
                            file: None,
                            secret: nvme::auth::Secret::from_key(&[fill; 32], None).unwrap(),
                        };
                        host.dhchap_key = Some(key(i as u8));
                        host.dhchap_ctrl_key = (i % 4 == 3).then(|| key(0xa5));
                    }
                    host
                })
                .collect();
            let hosts = if allow_any_host { Vec::new() } else { hosts };
            let namespaces: Vec<_> = nsids
                .into_iter()
                .map(|nsid| namespace(nqn.clone(), nsid))
                .collect();
            let serial = serial.unwrap_or_else(|| default_serial(&nqn));
            (
                namespaces,
                Just((nqn, allow_any_host, hosts, serial, model)),
            )
                .prop_map(
                    |(namespaces, (nqn, allow_any_host, hosts, serial, model))| Subsystem {
                        nqn,
                        allow_any_host,
                        hosts,
                        dhchap_hashes: vec![HashId::Sha256, HashId::Sha512],
                        dhchap_dhgroups: default_dhchap_dhgroups(),
                        serial,
                        model,
                        namespaces,
                    },
                )
        })
}

fn target() -> impl Strategy<Value = TargetSettings> {
    (
        1u32..=1024,
        0u64..=8192,
        2u32..=1024,
        0u32..=10,
        100u32..=3_600_000,
        0u32..=1_000_000,
        any::<bool>(),
        (any::<bool>(), 1u32..=60_000, any::<bool>()),
        prop_oneof![Just(0u32), 32u32..=65_536],
        any::<bool>(),
    )
        .prop_map(
            |(
                threads,
                icd16,
                max_queue_depth,
                shift,
                keep_alive_ms_min,
                idle_poll_us,
                busy,
                (sqpoll, sqpoll_idle_ms, iopoll),
                rdma_srq_depth,
                success_always,
            )| {
                let max_io_size = Size(4096 << shift);
                // The buffer: half the largest command, 4KiB at least.
                let io_unit_size = Size((max_io_size.bytes() / 2).max(4096));
                TargetSettings {
                    threads,
                    in_capsule_data: Size((icd16 * 16).min(io_unit_size.bytes())),
                    max_queue_depth,
                    max_io_size,
                    io_unit_size,
                    keep_alive_ms_min,
                    cntlid_min: 1 + (keep_alive_ms_min % 0x100) as u16,
                    cntlid_max: 0xffef - (idle_poll_us % 0x100) as u16,
                    idle_poll_us,
                    polling: if busy {
                        nvmf_config::Polling::Busy
                    } else {
                        nvmf_config::Polling::Adaptive
                    },
                    sqpoll,
                    sqpoll_idle_ms,
                    iopoll,
                    rdma_srq_depth,
                    c2h_success: if success_always {
                        nvmf_config::C2hSuccess::Always
                    } else {
                        nvmf_config::C2hSuccess::Spec
                    },
                    tcp_receive: match rdma_srq_depth % 3 {
                        0 => nvmf_config::TcpReceive::Auto,
                        1 => nvmf_config::TcpReceive::IoUring,
                        _ => nvmf_config::TcpReceive::Epoll,
                    },
                    tcp_send: match rdma_srq_depth % 5 {
                        0 => nvmf_config::TcpSend::Auto,
                        1 | 2 => nvmf_config::TcpSend::IoUring,
                        _ => nvmf_config::TcpSend::Sendmsg,
                    },
                }
            },
        )
}

fn config() -> impl Strategy<Value = Config> {
    (
        proptest::collection::vec((transport(), address(), 1u16..), 1..4),
        (0usize..4).prop_flat_map(|n| (0..n).map(subsystem).collect::<Vec<_>>()),
        target(),
        proptest::option::of((address(), 1u16..)),
    )
        .prop_map(|(listeners, subsystems, target, metrics)| {
            // Distinct ports keep listeners (and the metrics port) from clashing.
            let listeners = listeners
                .into_iter()
                .enumerate()
                .map(|(i, (transport, address, port))| {
                    // A multiple of 4 (never 0) plus the index: ports 1-3 used to come out 0.
                    let port = (port.saturating_sub(i as u16 * 4) / 4 * 4).max(4) + i as u16;
                    let mut l = Listener::new(transport, address, port);
                    // Odd listeners serve the first subsystem only; every other one has ANA
                    // states for the groups the generated namespaces use (1-3).
                    if i % 2 == 1 {
                        l.subsystems = subsystems.first().map(|s: &Subsystem| vec![s.nqn.clone()]);
                    }
                    if i % 2 == 0 {
                        l.ana.insert(1, AnaState::NonOptimized);
                        l.ana.insert(2 + (i as u32 % 2), AnaState::Inaccessible);
                    }
                    l
                })
                .collect::<Vec<_>>();
            let metrics = metrics.map(|(ip, port)| Metrics {
                listen: SocketAddr::new(ip, port / 4 * 4 + 3),
            });
            Config {
                listeners,
                subsystems,
                target,
                metrics,
                gateway: None,
            }
        })
}

/// examples/full.yaml with its files replaced by null namespaces, so that it is valid
/// without touching the file system.
static EDIT_BASE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let text = include_str!("../examples/full.yaml")
        .replace("path: /var/lib/nvmf/disk1.img, size: 1GiB", "null: 1GiB")
        .replace("path: /var/lib/nvmf/disk3.img", "null: 8GB")
        .replace("size: 8GB ", "# size");
    assert!(!text.contains("/var/lib"));
    if let Err(e) = Config::from_yaml_str(&text, "base.yaml") {
        panic!("the edit base must be valid:\n{e}\n{text}");
    }
    text
});

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn generated_configs_round_trip(c in config()) {
        // Every generated config is valid by construction...
        if let Err(e) = c.validate() {
            panic!("generator produced an invalid config:\n{e}\n{c:#?}");
        }
        // ...and reads back equal from its YAML.
        let text = c.to_yaml_with_secrets();
        let back = Config::from_yaml_str(&text, "gen.yaml")
            .unwrap_or_else(|e| panic!("{e}\n--- text:\n{text}"));
        prop_assert_eq!(&back.config, &c, "--- text:\n{}", text);
        // What --check-config and `ctl list` print has no secret in it.
        let shown = c.to_yaml();
        prop_assert!(!shown.contains("DHHC-1"), "{}", shown);
    }

    #[test]
    fn edits_never_panic_and_diagnostics_point_into_the_text(
        cut in 0usize..2000,
        insert in "[ -~\\t\\n]{0,6}",
        keep_prefix in any::<bool>(),
    ) {
        let base = &*EDIT_BASE;
        let cut = cut.min(base.len());
        let cut = (0..=cut).rev().find(|&i| base.is_char_boundary(i)).unwrap_or(0);
        let text = if keep_prefix {
            format!("{}{insert}{}", &base[..cut], &base[cut..])
        } else {
            format!("{}{insert}", &base[..cut])
        };
        let lines = text.lines().count() + 1;
        match Config::from_yaml_str(&text, "edit.yaml") {
            Ok(loaded) => {
                let again = Config::from_yaml_str(&loaded.config.to_yaml(), "again.yaml");
                prop_assert!(again.is_ok());
            }
            Err(ConfigError::Invalid { errors, .. }) => {
                prop_assert!(!errors.is_empty());
                for d in &errors {
                    let at = d.location.expect("text diagnostics have a location");
                    prop_assert!(at.line >= 1 && at.line <= lines, "{} ({} lines)", d, lines);
                    prop_assert!(at.column >= 1, "{}", d);
                }
            }
            Err(e) => panic!("unexpected error kind: {e}"),
        }
    }
}
