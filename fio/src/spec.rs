//! What a fio `filename` names: `trtype=tcp traddr=127.0.0.1 trsvcid=4420 subnqn=... ns=1`, the
//! form SPDK's fio plugin takes (keys separated by spaces; fio splits `filename` at `:`, so a
//! colon in an NQN is written `\:`).

use std::fmt;

use initiator::Transport;

/// One namespace on one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub transport: Transport,
    pub traddr: String,
    pub trsvcid: u16,
    pub subnqn: String,
    pub nsid: u32,
    /// The host NQN, when the filename names one (it wins over the `hostnqn` option).
    pub hostnqn: Option<String>,
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = match self.transport {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        };
        write!(
            f,
            "{t} {}:{} {} ns {}",
            self.traddr, self.trsvcid, self.subnqn, self.nsid
        )
    }
}

/// Parses a filename. Keys: `trtype` (`tcp` or `rdma`, any case; required), `traddr`
/// (required), `trsvcid` (default 4420), `subnqn` (required), `ns` (default 1), `hostnqn`,
/// and `adrfam` (`ipv4`/`ipv6`, accepted for SPDK's form; the address says which).
pub fn parse(name: &str) -> Result<Spec, String> {
    let (mut transport, mut traddr, mut trsvcid, mut subnqn, mut nsid, mut hostnqn) =
        (None, None, 4420u16, None, 1u32, None);
    for word in name.split_whitespace() {
        let Some((key, value)) = word.split_once('=') else {
            return Err(format!("'{word}' is not key=value"));
        };
        if value.is_empty() {
            return Err(format!("{key}= has no value"));
        }
        match key.to_ascii_lowercase().as_str() {
            "trtype" => {
                transport = Some(match value.to_ascii_lowercase().as_str() {
                    "tcp" => Transport::Tcp,
                    "rdma" => Transport::Rdma,
                    _ => return Err(format!("trtype={value}: tcp or rdma")),
                })
            }
            "adrfam" => {
                if !matches!(value.to_ascii_lowercase().as_str(), "ipv4" | "ipv6") {
                    return Err(format!("adrfam={value}: ipv4 or ipv6"));
                }
            }
            "traddr" => traddr = Some(value.to_string()),
            "trsvcid" => {
                trsvcid = value
                    .parse()
                    .map_err(|_| format!("trsvcid={value}: a port number"))?
            }
            "subnqn" => subnqn = Some(value.to_string()),
            "ns" => {
                nsid = match value.parse() {
                    Ok(n) if n > 0 && n != u32::MAX => n,
                    _ => return Err(format!("ns={value}: a namespace ID (1..FFFFFFFEh)")),
                }
            }
            "hostnqn" => hostnqn = Some(value.to_string()),
            _ => {
                return Err(format!(
                    "unknown key '{key}' (trtype, adrfam, traddr, trsvcid, subnqn, ns, hostnqn)"
                ))
            }
        }
    }
    let missing = |k: &str| format!("no {k}= (trtype=tcp traddr=A trsvcid=P subnqn=N ns=1)");
    Ok(Spec {
        transport: transport.ok_or_else(|| missing("trtype"))?,
        traddr: traddr.ok_or_else(|| missing("traddr"))?,
        trsvcid,
        subnqn: subnqn.ok_or_else(|| missing("subnqn"))?,
        nsid,
        hostnqn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdk_form_parses() {
        let s = parse(
            "trtype=TCP adrfam=IPv4 traddr=127.0.0.1 trsvcid=4421 subnqn=nqn.2026-11.io.nvmf-rs:default ns=2",
        )
        .unwrap();
        assert_eq!(
            s,
            Spec {
                transport: Transport::Tcp,
                traddr: "127.0.0.1".into(),
                trsvcid: 4421,
                subnqn: "nqn.2026-11.io.nvmf-rs:default".into(),
                nsid: 2,
                hostnqn: None,
            }
        );
        assert_eq!(
            s.to_string(),
            "tcp 127.0.0.1:4421 nqn.2026-11.io.nvmf-rs:default ns 2"
        );
    }

    #[test]
    fn defaults_and_hostnqn() {
        let s = parse("trtype=rdma traddr=10.0.0.1 subnqn=n hostnqn=nqn.h").unwrap();
        assert_eq!((s.transport, s.trsvcid, s.nsid), (Transport::Rdma, 4420, 1));
        assert_eq!(s.hostnqn.as_deref(), Some("nqn.h"));
    }

    #[test]
    fn bad_input_names_the_key() {
        for (name, want) in [
            ("traddr=1 subnqn=n", "no trtype="),
            ("trtype=tcp subnqn=n", "no traddr="),
            ("trtype=tcp traddr=1", "no subnqn="),
            ("trtype=fc traddr=1 subnqn=n", "trtype=fc"),
            ("trtype=tcp traddr=1 subnqn=n trsvcid=x", "trsvcid=x"),
            ("trtype=tcp traddr=1 subnqn=n ns=0", "ns=0"),
            (
                "trtype=tcp traddr=1 subnqn=n ns=4294967295",
                "ns=4294967295",
            ),
            ("trtype=tcp traddr=1 subnqn=n port=1", "unknown key 'port'"),
            ("trtype=tcp traddr=1 subnqn=n adrfam=ib", "adrfam=ib"),
            ("trtype=tcp traddr= subnqn=n", "traddr= has no value"),
            ("/dev/nvme0n1", "not key=value"),
        ] {
            let e = parse(name).unwrap_err();
            assert!(e.contains(want), "{name}: {e}");
        }
    }
}
