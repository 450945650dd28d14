//! Discovery: what `nvme discover` (libnvme `nvme_discovery_log`) does.

use super::*;
use nvme::fabrics::until_nul;
use nvme::log::{adrfam, lid, subtype, trtype, DiscoveryLogEntry, DiscoveryLogHeader};

const NOBODY: &str = "nqn.2014-08.org.nvmexpress:uuid:nobody";

fn discover(t: &Arc<Target>, host: &str) -> (Host, u64, Vec<DiscoveryLogEntry>) {
    let mut h = Host::new(t, tcp_caps(), Instant::now());
    // The kernel connects to the discovery NQN with KATO 0 (non-persistent discovery).
    let c = h.connect_admin(DISCOVERY_NQN, host, 0).cqe();
    assert!(c.status().is_success(), "{c:?}");
    let cc = Cc::new(true, Cc::CSS_NVM, 0, 0, Cc::SHN_NONE, 6, 4);
    h.prop_set(reg::CC, cc.0 as u64).ok_result();
    assert!(Csts(h.prop_get(reg::CSTS, PropSize::Four).ok_result() as u32).rdy());

    // Header with RAE, then the entries at offset 1024, then the header again with RAE = 0
    // (libnvme retries while genctr changes).
    let r = h.get_log(lid::DISCOVERY, 0, 1024, 0, true);
    let hdr = DiscoveryLogHeader::decode(r.ok_data()).unwrap();
    assert_eq!(hdr.recfmt.get(), 0);
    let n = hdr.numrec.get() as u32;
    let mut entries = Vec::new();
    if n > 0 {
        let r = h.get_log(lid::DISCOVERY, 0, n * 1024, 1024, true);
        let data = r.ok_data();
        assert_eq!(data.len(), n as usize * 1024);
        for chunk in data.chunks_exact(1024) {
            entries.push(DiscoveryLogEntry::decode(chunk).unwrap());
        }
    }
    let r = h.get_log(lid::DISCOVERY, 0, 1024, 0, false);
    let again = DiscoveryLogHeader::decode(r.ok_data()).unwrap();
    assert_eq!(again.genctr.get(), hdr.genctr.get(), "genctr is stable");
    (h, hdr.genctr.get(), entries)
}

fn nqn_of(e: &DiscoveryLogEntry) -> &str {
    std::str::from_utf8(until_nul(&e.subnqn)).unwrap()
}

#[test]
fn discovery_controller_and_log() {
    let t = test_target();
    let (mut h, genctr, entries) = discover(&t, HOSTNQN);
    assert_eq!(genctr, t.genctr());

    // Identify: a discovery controller.
    let r = h.identify(cns::CTRL, 0, csi::NVM);
    let id = IdentifyController::decode(r.ok_data()).unwrap();
    assert_eq!(id.cntrltype, idc::CNTRLTYPE_DISCOVERY);
    assert_eq!(Some(id.cntlid.get()), h.q.cntlid());
    assert_eq!(until_nul(&id.subnqn), DISCOVERY_NQN.as_bytes());
    assert_ne!(id.lpa & idc::LPA_EXTENDED, 0, "LPO is supported");
    assert_eq!(id.oaes.get(), idc::OAES_DISC_CHANGE);
    // Only CNS 01h exists on a discovery controller.
    assert_eq!(
        h.identify(cns::NS, 1, csi::NVM).status(),
        Status::INVALID_FIELD.dnr()
    );

    // One entry per listener for the one subsystem this host may use.
    assert_eq!(entries.len(), 2);
    let tcp = &entries[0];
    assert_eq!(nqn_of(tcp), SUBNQN);
    assert_eq!(
        (tcp.trtype, tcp.adrfam, tcp.subtype, tcp.portid.get()),
        (trtype::TCP, adrfam::IPV4, subtype::NVME, 1)
    );
    assert_eq!((tcp.cntlid.get(), tcp.asqsz.get()), (0xffff, 32));
    assert_eq!(until_nul(&tcp.traddr), b"192.0.2.1");
    assert_eq!(until_nul(&tcp.trsvcid), b"4420");
    assert_eq!(tcp.tsas[0], 0, "no TLS");
    let rdma = &entries[1];
    assert_eq!(nqn_of(rdma), SUBNQN);
    assert_eq!((rdma.trtype, rdma.portid.get()), (trtype::RDMA, 2));
    assert_eq!(
        &rdma.tsas[..3],
        &[1, 1, 1],
        "RC QP, no provider type, RDMA_CM"
    );

    // Partial reads and offsets: one entry from the middle, a tail past the end is zero.
    let r = h.get_log(lid::DISCOVERY, 0, 1024, 2048, true);
    assert_eq!(r.ok_data()[..1024], rdma.encode()[..]);
    let r = h.get_log(lid::DISCOVERY, 0, 2048, 2048, true);
    assert!(r.ok_data()[1024..].iter().all(|&b| b == 0));
    let r = h.get_log(lid::DISCOVERY, 0, 16, 0, true);
    assert_eq!(
        u64::from_le_bytes(r.ok_data()[8..16].try_into().unwrap()),
        2
    );
    // Offset past the page, or not dword aligned: Invalid Field.
    assert_eq!(
        h.get_log(lid::DISCOVERY, 0, 1024, 4096, true).status(),
        Status::INVALID_FIELD.dnr()
    );
    assert_eq!(
        h.get_log(lid::DISCOVERY, 0, 1024, 2, true).status(),
        Status::INVALID_FIELD.dnr()
    );
    // Only LID 70h exists here.
    assert_eq!(
        h.get_log(lid::SMART, 0, 512, 0, false).status(),
        Status::INVALID_FIELD.dnr()
    );

    // KATO 0 on a discovery Connect becomes nvmet's two-minute cleanup timeout.
    assert_eq!(h.get_features(feat::KATO, 0, 0).ok_result(), 120_000);
    assert_eq!(h.q.poll_timeout(), Some(h.now + Duration::from_secs(120)));
    h.simple(admin::KEEP_ALIVE).ok_result();
    // Features the discovery controller does not have.
    assert_eq!(
        h.set_features(feat::NUM_QUEUES, 0, &[]).status(),
        Status::INVALID_FIELD.dnr()
    );
    // Discovery change notices may be enabled; others may not.
    h.set_features(feat::ASYNC_EVENT, idc::OAES_DISC_CHANGE, &[])
        .ok_result();
    assert_eq!(
        h.set_features(feat::ASYNC_EVENT, idc::OAES_NS_ATTR, &[])
            .status(),
        Status::INVALID_FIELD.dnr()
    );
    // No I/O commands and no I/O queues on a discovery controller.
    assert_eq!(
        h.simple(admin::ABORT).status(),
        Status::INVALID_OPCODE.dnr()
    );
    let mut ioq = Host::new(&t, tcp_caps(), h.now);
    let d = ConnectData::new(HOSTID, h.q.cntlid().unwrap(), DISCOVERY_NQN, HOSTNQN);
    let c = ioq.connect(1, 31, 0, &d).cqe();
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAM.dnr());
    assert_eq!(
        ConnectResult::decode(c.result.get(), true),
        ConnectResult::InvalidParam {
            attr: InvalidAttr::Sqe,
            offset: 42
        }
    );
}

#[test]
fn discovery_hides_subsystems_a_host_may_not_use() {
    let t = test_target();
    let (_h1, g1, entries) = discover(&t, OTHER_HOST);
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|e| nqn_of(e) == RESTRICTED));
    let (_h2, g2, entries) = discover(&t, NOBODY);
    assert!(entries.is_empty(), "a host allowed nowhere sees no entry");
    let (_h3, g3, entries) = discover(&t, HOSTNQN);
    assert!(entries.iter().all(|e| nqn_of(e) != RESTRICTED));
    assert!(g1 == g2 && g2 == g3, "genctr does not depend on who asks");
    // Any host may use the discovery subsystem itself.
    assert_eq!(t.controller_count(), 3);
}

#[test]
fn wildcard_listeners_report_the_local_address() {
    let subsystems = vec![SubsystemSpec {
        nqn: SUBNQN.into(),
        serial: "S".into(),
        model: "M".into(),
        allow_any_host: true,
        hosts: vec![],
        auth_policy: Default::default(),
        namespaces: vec![ns(1, 8, 12, 0)],
    }];
    let listeners = vec![
        ListenerInfo::new(TrType::Tcp, "0.0.0.0".into(), "4420".into(), 1),
        ListenerInfo::new(TrType::Tcp, "::".into(), "4421".into(), 2),
        ListenerInfo::new(TrType::Tcp, "198.51.100.7".into(), "4422".into(), 3),
    ];
    let t = Target::new(
        subsystems,
        listeners,
        TargetParams {
            keep_alive_ms_min: 0,
            resv_store: None,
            auth_timeout: crate::core::AUTH_TIMEOUT,
            data_completes_always: false,
            cntlid_range: nvme::fabrics::CNTLID_MIN..=nvme::fabrics::CNTLID_MAX,
        },
    );
    let mut h = Host::new(&t, tcp_caps(), Instant::now());
    h.q.set_local_addr("[fd00::5]:4421".parse().unwrap());
    h.connect_admin(DISCOVERY_NQN, NOBODY, 0).ok_result();
    h.prop_set(reg::CC, Cc::new(true, 0, 0, 0, 0, 6, 4).0 as u64)
        .ok_result();
    let r = h.get_log(lid::DISCOVERY, 0, 4096, 0, false);
    let data = r.ok_data();
    assert_eq!(u64::from_le_bytes(data[8..16].try_into().unwrap()), 3);
    let e: Vec<_> = data[1024..]
        .chunks_exact(1024)
        .map(|c| DiscoveryLogEntry::decode(c).unwrap())
        .collect();
    assert_eq!(until_nul(&e[0].traddr), b"fd00::5");
    assert_eq!(e[0].adrfam, adrfam::IPV6);
    assert_eq!(until_nul(&e[1].traddr), b"fd00::5");
    assert_eq!(until_nul(&e[2].traddr), b"198.51.100.7");
    assert_eq!(e[2].adrfam, adrfam::IPV4);
}
