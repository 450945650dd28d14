//! A queue whose NVMe/TCP connection runs over TLS: its Connect must name the host and the
//! subsystem of the PSK identity the channel was made with (NVMe/TCP 1.1 3.6.1.5), and the key
//! lookup finds the host's configured PSK in the subsystem the identity names.

use super::*;
use nvme::tls::{ConfiguredPsk, IdentityVersion, PskIdentity};

fn identity(host: &str, sub: &str) -> PskIdentity {
    let k = ConfiguredPsk::from_key(&[3; 32]).unwrap();
    k.tls_psk(IdentityVersion::V1, host, sub).0
}

fn tls_host(t: &Arc<Target>, host: &str, sub: &str) -> Host {
    let mut h = Host::new(t, tcp_caps(), Instant::now());
    h.q.set_tls_identity(identity(host, sub));
    h
}

#[test]
fn a_connect_must_be_for_the_tls_identitys_host_and_subsystem() {
    let t = test_target();
    let mut h = tls_host(&t, HOSTNQN, SUBNQN);
    h.connect_admin(SUBNQN, HOSTNQN, 5000).ok_result();
    // Another host NQN, or another subsystem, than the identity's: refused.
    let mut h = tls_host(&t, HOSTNQN, SUBNQN);
    let c = h.connect_admin(SUBNQN, OTHER_HOST, 5000).cqe();
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAM.dnr());
    let mut h = tls_host(&t, OTHER_HOST, SUBNQN);
    let c = h.connect_admin(RESTRICTED, OTHER_HOST, 5000).cqe();
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAM.dnr());
    // Discovery over TLS: the identity names the discovery NQN.
    let mut h = tls_host(&t, HOSTNQN, DISCOVERY_NQN);
    h.connect_admin(DISCOVERY_NQN, HOSTNQN, 0).ok_result();
}

#[test]
fn keys_are_found_in_the_subsystem_the_identity_names() {
    let key = ConfiguredPsk::from_key(&[5; 32]).unwrap();
    let other = ConfiguredPsk::from_key(&[6; 32]).unwrap();
    let mut subs = test_subsystems();
    subs[0].hosts = vec![HostSpec {
        nqn: HOSTNQN.into(),
        keys: None,
        tls_psk: Some(key.clone()),
    }];
    subs[1].hosts = vec![HostSpec {
        nqn: HOSTNQN.into(),
        keys: None,
        tls_psk: Some(other.clone()),
    }];
    let t = Target::new(subs, test_listeners(), test_target_params());
    for v in [IdentityVersion::V0, IdentityVersion::V1] {
        let (id, psk) = key.tls_psk(v, HOSTNQN, SUBNQN);
        assert_eq!(t.inner().tls_psk(&id).unwrap(), psk);
        let (id, psk) = other.tls_psk(v, HOSTNQN, RESTRICTED);
        assert_eq!(t.inner().tls_psk(&id).unwrap(), psk);
    }
    // A v1 identity made with another key: its digest tells.
    let (id, _) = other.tls_psk(IdentityVersion::V1, HOSTNQN, SUBNQN);
    let e = t.inner().tls_psk(&id).unwrap_err();
    assert!(e.contains("digest"), "{e}");
    // A host without a key, an unknown subsystem.
    let (id, _) = key.tls_psk(IdentityVersion::V0, OTHER_HOST, SUBNQN);
    assert!(t.inner().tls_psk(&id).unwrap_err().contains("no tls_psk"));
    let (id, _) = key.tls_psk(IdentityVersion::V0, HOSTNQN, "nqn.2024-01.io.nvmf-rs:none");
    assert!(t.inner().tls_psk(&id).unwrap_err().contains("no subsystem"));
    // Discovery: the host's keys differ between its subsystems, so none is taken.
    let (id, _) = key.tls_psk(IdentityVersion::V0, HOSTNQN, DISCOVERY_NQN);
    assert!(t
        .inner()
        .tls_psk(&id)
        .unwrap_err()
        .contains("different TLS PSKs"));
}
