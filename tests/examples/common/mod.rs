//! What the initiator's check examples (`io_check`, `reconnect_check`) share: the flags naming
//! the target and the connect options they lead to. Included with `mod common;`.

use std::fmt;

use initiator::{ConnectOptions, Transport};

/// The target to connect to: `--transport tcp|rdma --traddr --trsvcid --subnqn`.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// tcp or rdma.
    #[arg(long, default_value = "rdma", value_parser = parse_transport)]
    pub transport: Transport,
    #[arg(long)]
    pub traddr: String,
    #[arg(long, default_value_t = 4420)]
    pub trsvcid: u16,
    #[arg(long)]
    pub subnqn: String,
}

fn parse_transport(s: &str) -> Result<Transport, String> {
    match s {
        "rdma" => Ok(Transport::Rdma),
        "tcp" => Ok(Transport::Tcp),
        t => Err(format!("unknown transport {t:?} (tcp or rdma)")),
    }
}

impl Target {
    /// `"rdma"` or `"tcp"`.
    pub fn transport_name(&self) -> &'static str {
        match self.transport {
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
        }
    }

    /// The library's default connect options for this target.
    pub fn options(&self) -> ConnectOptions {
        match self.transport {
            Transport::Rdma => ConnectOptions::rdma(&self.traddr, self.trsvcid, &self.subnqn),
            Transport::Tcp => ConnectOptions::tcp(&self.traddr, self.trsvcid, &self.subnqn),
        }
    }
}

/// `rdma 192.168.78.1:4420 nqn...`, as the examples' summary lines print it.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.transport_name();
        write!(f, "{t} {}:{} {}", self.traddr, self.trsvcid, self.subnqn)
    }
}
