//! Local IPv4 addresses that belong to an RDMA device.

use std::net::SocketAddr;

use crate::EventChannel;

/// An IPv4 address of this machine that rdma_cm binds to an RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaAddress {
    pub addr: std::net::Ipv4Addr,
    /// The RDMA device behind it (`rxe0`, `siw0`, ...).
    pub device: String,
}

/// The IPv4 addresses of this machine that belong to an RDMA device (RoCE or iWARP), in
/// interface order: what a default configuration can listen on for NVMe/RDMA. Found by
/// binding an rdma_cm id to each address, which binds it to that address's device, if any.
/// Empty without RDMA.
pub fn local_rdma_ipv4() -> Vec<RdmaAddress> {
    if crate::devices().map_or(true, |d| d.is_empty()) {
        return Vec::new();
    }
    let Ok(ch) = EventChannel::new() else {
        return Vec::new();
    };
    let Ok(ifaddrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out: Vec<RdmaAddress> = Vec::new();
    for ifa in ifaddrs {
        let Some(ip) = ifa
            .address
            .as_ref()
            .and_then(|a| a.as_sockaddr_in())
            .map(|s| s.ip())
        else {
            continue;
        };
        if out.iter().any(|a| a.addr == ip) {
            continue;
        }
        let Ok(id) = ch.create_id(0) else {
            continue;
        };
        if id.bind_addr(SocketAddr::from((ip, 0))).is_err() {
            continue;
        }
        if let Ok(Some(ctx)) = id.context() {
            out.push(RdmaAddress {
                addr: ip,
                device: ctx.name(),
            });
        }
    }
    out
}
