//! The resolved configuration: what the target runs with, every default filled in.
//!
//! Each type documents its YAML keys; `config/REFERENCE.md` has the same in one page.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use crate::size::Size;
pub use nvme::auth::{DhGroup, HashId};

/// The TCP/RDMA port IANA assigned to NVMe over Fabrics (NVMe/TCP spec §3.4.1; also used for
/// RDMA by convention).
pub const DEFAULT_PORT: u16 = 4420;
/// Model number reported in Identify Controller when `model` is not given.
pub const DEFAULT_MODEL: &str = "nvmf-rs";
/// Logical block size of file and null namespaces when `block_size` is not given.
pub const DEFAULT_BLOCK_SIZE: u32 = 4096;

/// A whole configuration file.
///
/// ```yaml
/// listeners: [...]     # required, at least one
/// subsystems: [...]    # optional, default [] (the target then serves discovery only)
/// target: {...}        # optional, every key has a default
/// metrics: {...}       # optional, default: no metrics endpoint
/// gateway: {...}       # optional: this target is one gateway of a group (leases in RADOS)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Config {
    /// `listeners`: the addresses the target accepts connections on. Required, not empty.
    pub listeners: Vec<Listener>,
    /// `subsystems`: the NVM subsystems exported. Default: none (discovery only).
    pub subsystems: Vec<Subsystem>,
    /// `target`: daemon-wide tuning.
    pub target: TargetSettings,
    /// `metrics`: the optional Prometheus-style metrics endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// `gateway`: membership of a gateway group. Default: none (a standalone target).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Gateway>,
}

/// `gateway`: `{ group: g1, pool: rbd, name: gw-a, ana_groups: [1] }`: this target is one of
/// several gateways in front of the same RBD images. Each ANA group is served optimized by one
/// live gateway at a time, the holder of the group's lease (a lock with a duration on a RADOS
/// object in `pool`); the others report it inaccessible, and take the lease over when its
/// holder stops renewing it. Every gateway's discovery log lists the listeners of every live
/// gateway of the group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gateway {
    /// `group`: the group's name (letters, digits, `.`, `_`, `-`). Required.
    pub group: String,
    /// `name`: this gateway's name in the group, unique in it. Default: the host name.
    pub name: String,
    /// `pool`: the RADOS pool that keeps the group's objects. Required.
    pub pool: String,
    /// `namespace`: a RADOS namespace of the pool. Default none.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// `conf`: the cluster's configuration file. Default `/etc/ceph/ceph.conf`.
    pub conf: PathBuf,
    /// `user`: the Ceph client name without `client.`. Default `admin`.
    pub user: String,
    /// `ana_groups`: the ANA groups this gateway is the home of: it takes their leases when
    /// it starts and (with `failback`) gets them back from the gateway that took them over.
    /// Default: none (it serves groups whose home gateway is down).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ana_groups: Vec<u32>,
    /// `lease_secs`: how long a lease lasts without renewal (renewed every third of it):
    /// the longest a dead gateway's groups stay unserved. 3–60, default 6 (within the 10 s
    /// ANA transition time the target reports).
    pub lease_secs: u32,
    /// `failback`: a gateway holding another's home group gives it back when that gateway is
    /// up again. Default true.
    pub failback: bool,
}

/// The default of `gateway.lease_secs`.
pub const DEFAULT_LEASE_SECS: u32 = 6;

/// One entry of `listeners`: `{ transport: tcp, address: 0.0.0.0, port: 4420 }`.
///
/// Every listener also serves the discovery subsystem.
///
/// ```yaml
/// - { transport: tcp, address: 10.0.0.1, subsystems: [ "nqn...:disk1" ], ana: { 1: optimized, 2: non-optimized } }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listener {
    /// `transport`: `tcp` or `rdma`. Required.
    pub transport: Transport,
    /// `address`: an IPv4 or IPv6 address to bind (`0.0.0.0` / `::` for all). Required; host
    /// names are not resolved. For RDMA this is the IP address of an RDMA-capable interface.
    pub address: IpAddr,
    /// `port`: 1–65535. Default 4420.
    pub port: u16,
    /// `subsystems`: the subsystems this listener serves (and its discovery log lists).
    /// Default: all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subsystems: Option<Vec<String>>,
    /// `ana`: this listener's Asymmetric Namespace Access state per ANA group (1–128); groups
    /// not named are `optimized`. Default: every group optimized.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub ana: BTreeMap<u32, AnaState>,
    /// `tls`: NVMe/TCP over TLS 1.3 with pre-shared keys: `required` (plain connections are
    /// refused) or `allowed` (both). Default: none (plain NVMe/TCP only). TCP only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsMode>,
}

/// A listener's `tls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Only TLS connections.
    Required,
    /// TLS and plain connections (the first bytes tell which).
    Allowed,
}

impl Listener {
    /// A listener serving every subsystem, every ANA group optimized.
    pub fn new(transport: Transport, address: IpAddr, port: u16) -> Listener {
        Listener {
            transport,
            address,
            port,
            subsystems: None,
            ana: BTreeMap::new(),
            tls: None,
        }
    }

    /// The same socket (transport, address, port), whatever it serves.
    pub fn same_endpoint(&self, o: &Listener) -> bool {
        self.transport == o.transport && self.address == o.address && self.port == o.port
    }

    /// Whether this listener serves subsystem `nqn`.
    pub fn serves(&self, nqn: &str) -> bool {
        self.subsystems
            .as_ref()
            .is_none_or(|s| s.iter().any(|n| n == nqn))
    }

    /// This listener's state for ANA group `group`.
    pub fn ana_state(&self, group: u32) -> AnaState {
        self.ana.get(&group).copied().unwrap_or_default()
    }
}

/// The largest ANA group ID (ANAGRPMAX, as nvmet's).
pub const MAX_ANA_GROUP: u32 = 128;

/// An Asymmetric Namespace Access state (NVMe Base 2.0, 8.1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnaState {
    /// Served at full speed on this path.
    #[default]
    Optimized,
    /// Served, but another path is better.
    NonOptimized,
    /// Not served on this path (I/O gets Asymmetric Access Inaccessible; the host retries
    /// elsewhere).
    Inaccessible,
    /// Not served on this path, and not coming back.
    PersistentLoss,
    /// In transition (I/O gets Asymmetric Access Transition).
    Change,
}

impl AnaState {
    /// Every state, in the order of their codes.
    pub const ALL: [AnaState; 5] = [
        AnaState::Optimized,
        AnaState::NonOptimized,
        AnaState::Inaccessible,
        AnaState::PersistentLoss,
        AnaState::Change,
    ];

    /// The name used in the configuration (`non-optimized`, ...).
    pub fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non-optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent-loss",
            AnaState::Change => "change",
        }
    }

    /// The state a configuration name (`non-optimized`, ...) stands for.
    pub fn from_name(name: &str) -> Option<AnaState> {
        AnaState::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for AnaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `transport` of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// NVMe/TCP.
    Tcp,
    /// NVMe/RDMA (RoCE, iWARP, InfiniBand through rdma_cm).
    Rdma,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        })
    }
}

/// One entry of `subsystems`: an NVM subsystem, its access list and its namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Subsystem {
    /// `nqn`: the subsystem NQN (NVMe Base 2.0 §4.5), unique in the file, not the discovery
    /// NQN. Required.
    pub nqn: String,
    /// `allow_any_host`: accept every host NQN. Default `false`. Hosts then connect without
    /// authentication (as with nvmet).
    pub allow_any_host: bool,
    /// `hosts`: the hosts allowed to connect when `allow_any_host` is false, each a host NQN
    /// or a mapping with its DH-HMAC-CHAP secrets ([`Host`]). Default `[]`.
    pub hosts: Vec<Host>,
    /// `dhchap_hashes`: the hash functions DH-HMAC-CHAP may use with this subsystem's hosts, in
    /// order of preference (`sha256`, `sha384`, `sha512`). Default `[sha512, sha384, sha256]`.
    #[serde(serialize_with = "ser_names")]
    pub dhchap_hashes: Vec<HashId>,
    /// `dhchap_dhgroups`: the Diffie-Hellman groups, in order of preference (`null`,
    /// `ffdhe2048` ... `ffdhe8192`). Default `[ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144,
    /// ffdhe8192, null]`.
    #[serde(serialize_with = "ser_names")]
    pub dhchap_dhgroups: Vec<DhGroup>,
    /// `serial`: Identify Controller serial number, 1–20 printable ASCII characters. Default:
    /// `NVMF` followed by 16 hex digits of a hash of the NQN (stable across restarts).
    pub serial: String,
    /// `model`: Identify Controller model number, 1–40 printable ASCII characters. Default
    /// `nvmf-rs`.
    pub model: String,
    /// `namespaces`: default `[]`.
    pub namespaces: Vec<Namespace>,
}

/// One entry of `hosts`.
///
/// ```yaml
/// hosts:
///   - nqn.2014-08.org.nvmexpress:uuid:...                       # a host NQN: no authentication
///   - { nqn: "nqn...", dhchap_key: "DHHC-1:01:...:", dhchap_ctrl_key: "DHHC-1:03:...:" }
///   - { nqn: "nqn...", dhchap_key_file: /etc/nvmf-target/keys/host1 }   # mode 0600
/// ```
///
/// A host with a key must authenticate (DH-HMAC-CHAP, NVMe Base 2.0 8.13) on every queue
/// before any other command; with a controller key as well, the controller authenticates
/// itself to a host that challenges it (bidirectional; a host that does not is accepted one
/// way, as nvmet and SPDK accept it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// `nqn`: the host NQN.
    pub nqn: String,
    /// `dhchap_key` or `dhchap_key_file`: the host's secret (`DHHC-1:xx:<base64>:`, as
    /// `nvme gen-dhchap-key` prints it).
    pub dhchap_key: Option<Key>,
    /// `dhchap_ctrl_key` or `dhchap_ctrl_key_file`: the controller's secret, for
    /// bidirectional authentication. Only with `dhchap_key`.
    pub dhchap_ctrl_key: Option<Key>,
    /// `tls_psk` or `tls_psk_file`: the host's configured TLS PSK (`NVMeTLSkey-1:01:...:`, as
    /// `nvme gen-tls-key` prints it), for listeners with `tls`.
    pub tls_psk: Option<PskKey>,
}

/// A configured TLS PSK and where it came from; zeroed when dropped, never printed (as
/// [`Key`]).
#[derive(Clone, PartialEq, Eq)]
pub struct PskKey {
    /// The key file (`tls_psk_file`), read at load and on every reload; `None` inline.
    pub file: Option<PathBuf>,
    /// The key.
    pub psk: nvme::tls::ConfiguredPsk,
}

impl fmt::Debug for PskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(p) => write!(f, "PskKey(file {}, secret redacted)", p.display()),
            None => f.write_str("PskKey(inline, secret redacted)"),
        }
    }
}

impl Host {
    /// A host entry without secrets.
    pub fn plain(nqn: impl Into<String>) -> Host {
        Host {
            nqn: nqn.into(),
            dhchap_key: None,
            dhchap_ctrl_key: None,
            tls_psk: None,
        }
    }

    /// Whether the entry carries no secret (it is written as its NQN alone).
    pub fn is_plain(&self) -> bool {
        self.dhchap_key.is_none() && self.dhchap_ctrl_key.is_none() && self.tls_psk.is_none()
    }
}

impl PartialEq<&str> for Host {
    fn eq(&self, other: &&str) -> bool {
        self.is_plain() && self.nqn == *other
    }
}

/// A DH-HMAC-CHAP secret and where it came from. Its text is zeroed when dropped and is never
/// printed: `Debug` and the YAML this crate writes say `<secret>` unless
/// [`Config::to_yaml_with_secrets`](crate::Config::to_yaml_with_secrets) asks for it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    /// The key file (`*_key_file`), read when the configuration is loaded (and on every
    /// reload, so a SIGHUP rotates keys); `None` for a key written inline.
    pub file: Option<PathBuf>,
    /// The secret.
    pub secret: nvme::auth::Secret,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(p) => write!(f, "Key(file {}, secret redacted)", p.display()),
            None => f.write_str("Key(inline, secret redacted)"),
        }
    }
}

std::thread_local! {
    /// Set while [`Config::to_yaml_with_secrets`] serializes.
    pub(crate) static REVEAL_SECRETS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Serialize for Host {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.is_plain() {
            return serializer.serialize_str(&self.nqn);
        }
        let reveal = REVEAL_SECRETS.with(|r| r.get());
        let mut st = serializer.serialize_struct("Host", 4)?;
        st.serialize_field("nqn", &self.nqn)?;
        for (name, key) in [
            ("dhchap_key", &self.dhchap_key),
            ("dhchap_ctrl_key", &self.dhchap_ctrl_key),
        ] {
            match key {
                None => st.skip_field(name)?,
                Some(Key { file: Some(p), .. }) => {
                    let field = if name == "dhchap_key" {
                        "dhchap_key_file"
                    } else {
                        "dhchap_ctrl_key_file"
                    };
                    st.serialize_field(field, &p.display().to_string())?
                }
                Some(Key { secret, .. }) if reveal => {
                    st.serialize_field(name, secret.to_text().as_str())?
                }
                Some(_) => st.serialize_field(name, "<secret>")?,
            }
        }
        match &self.tls_psk {
            None => st.skip_field("tls_psk")?,
            Some(PskKey { file: Some(p), .. }) => {
                st.serialize_field("tls_psk_file", &p.display().to_string())?
            }
            Some(PskKey { psk, .. }) if reveal => {
                st.serialize_field("tls_psk", psk.to_text().as_str())?
            }
            Some(_) => st.serialize_field("tls_psk", "<secret>")?,
        }
        st.end()
    }
}

trait Named {
    fn name_of(&self) -> &'static str;
}
impl Named for HashId {
    fn name_of(&self) -> &'static str {
        self.name()
    }
}
impl Named for DhGroup {
    fn name_of(&self) -> &'static str {
        self.name()
    }
}

fn ser_names<T: Named, S: Serializer>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(Named::name_of))
}

/// The default `dhchap_hashes`.
pub fn default_dhchap_hashes() -> Vec<HashId> {
    nvme::auth::Policy::default().hashes
}

/// The default `dhchap_dhgroups`.
pub fn default_dhchap_dhgroups() -> Vec<DhGroup> {
    nvme::auth::Policy::default().dhgroups
}

/// One entry of `namespaces`.
///
/// ```yaml
/// - { nsid: 1, path: /var/lib/nvmf/disk1.img, size: 1GiB }   # file, created if missing
/// - { nsid: 2, path: /dev/nvme0n1 }                          # block device
/// - { nsid: 3, null: 4GiB }                                  # null device
/// - { nsid: 4, rbd: { pool: rbd, image: img1 } }              # Ceph RBD image
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// `nsid`: 1 to 0xFFFFFFFE, unique within the subsystem. Required.
    pub nsid: u32,
    /// `path` (+ `size`), `null` or `rbd`: where the blocks live. Exactly one of them.
    pub backing: Backing,
    /// `block_size`: logical block size, 512 or 4096. Default 4096 for files and null
    /// namespaces; `None` only for a block device given without `block_size`, which then
    /// uses the device's logical block size.
    pub block_size: Option<u32>,
    /// `read_only`: reject writes with a write-protect error. Default `false`.
    pub read_only: bool,
    /// `ana_group`: the ANA group (1–128) the namespace belongs to; each listener has a state
    /// per group. Default 1.
    pub ana_group: u32,
    /// `uuid`: the namespace UUID reported in the Namespace Identification Descriptor list.
    /// Default: derived from the subsystem NQN and the nsid (stable across restarts).
    pub uuid: Uuid,
}

/// Where a namespace's blocks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// `path: FILE` (and `size`): a regular file or a block device.
    ///
    /// A missing file is created (sparse) at `size` by the target; `size` is then required.
    /// An existing file is used at its current length, which must be a multiple of the block
    /// size; a `size` that differs draws a warning. `size` is not allowed for block devices.
    /// A relative path is relative to the directory of the configuration file.
    File {
        /// The file or device.
        path: PathBuf,
        /// Size to create the file with if it does not exist.
        size: Option<Size>,
    },
    /// `null: SIZE`: a namespace of that size that discards writes and reads zeroes.
    Null {
        /// Capacity.
        size: Size,
    },
    /// `rbd: { pool, image }`: a Ceph RBD image, used at its size (a resize of the image is
    /// seen by the target and announced to the hosts).
    Rbd(RbdImage),
}

/// `rbd`: `{ pool: rbd, image: img1, conf: /etc/ceph/ceph.conf, user: admin, namespace: ns1 }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdImage {
    /// `pool`: the RADOS pool. Required.
    pub pool: String,
    /// `image`: the image name in the pool. Required; the image must exist.
    pub image: String,
    /// `namespace`: a RADOS namespace of the pool. Default none ("").
    pub namespace: String,
    /// `conf`: the cluster's configuration file (monitors, keyring). Default
    /// `/etc/ceph/ceph.conf`; a relative path is relative to the configuration file.
    pub conf: PathBuf,
    /// `user`: the Ceph client name without `client.`. Default `admin`.
    pub user: String,
}

/// The default of `rbd.conf`.
pub const DEFAULT_CEPH_CONF: &str = "/etc/ceph/ceph.conf";

/// A UUID (RFC 9562), written `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Uuid(pub [u8; 16]);

/// `target`: daemon-wide settings. Every key is optional.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TargetSettings {
    /// `threads`: poller threads, 1–1024. Default 1.
    pub threads: u32,
    /// `in_capsule_data`: bytes of write data a host may send inside the command capsule,
    /// 0–128KiB, a multiple of 16, at most `io_unit_size` (and `max_io_size`). Default 8KiB.
    pub in_capsule_data: Size,
    /// `max_queue_depth`: entries per I/O queue (MQES + 1), 2–1024. Default 128.
    pub max_queue_depth: u32,
    /// `max_io_size`: largest data transfer of one command, 4KiB–32MiB, a multiple of 4KiB.
    /// Advertised as MDTS, which is a power of two of 4KiB pages: other values draw a
    /// warning and are rounded down when advertised. Default 8MiB.
    pub max_io_size: Size,
    /// `io_unit_size`: size of each pool buffer, the most data one command moves through the
    /// backend at once (larger commands move in pieces of this size, one after another),
    /// 4KiB–4MiB, a multiple of 4KiB; lowered to `max_io_size` if larger. Default 128KiB.
    pub io_unit_size: Size,
    /// `cntlid_min`, `cntlid_max`: the controller IDs this target hands out, within 1–0xffef.
    /// Targets (gateways) that serve one subsystem to the same hosts take disjoint ranges, so
    /// a host's paths through them are distinct controllers of one subsystem. Default the whole
    /// range.
    pub cntlid_min: u16,
    /// See `cntlid_min`.
    pub cntlid_max: u16,
    /// `keep_alive_ms_min`: smallest keep-alive timeout a host may set, ms (smaller KATO
    /// values are raised to it), 100–3600000. Default 1000.
    pub keep_alive_ms_min: u32,
    /// `idle_poll_us`: the longest an adaptive poller spins after its last work before it
    /// sleeps until the next event, µs, 0–1000000 (0: sleep at once). Default 1000.
    pub idle_poll_us: u32,
    /// `polling`: `adaptive` (spin while the gaps between I/Os are shorter than a wake-up,
    /// measured, for at most `idle_poll_us`; sleep otherwise), `busy` (never sleep: one core
    /// per poller thread at 100%, the lowest latency) or `interrupt` (never spin).
    pub polling: Polling,
    /// `sqpoll`: give each poller's io_uring a kernel submission-polling thread
    /// (IORING_SETUP_SQPOLL): block I/O is submitted without a system call, at the cost of
    /// that kernel thread's CPU while I/O flows. Default false.
    pub sqpoll: bool,
    /// `sqpoll_idle_ms`: how long an SQPOLL thread spins without work before it sleeps,
    /// ms, 1–60000. Default 10. Only with `sqpoll: true`.
    pub sqpoll_idle_ms: u32,
    /// `iopoll`: poll block devices that have poll queues for completions (a second
    /// io_uring with IORING_SETUP_IOPOLL for their reads and writes) instead of taking an
    /// interrupt. Devices without poll queues, and files, are served as before. Default false.
    pub iopoll: bool,
    /// `rdma_srq_depth`: NVMe/RDMA only. 0 (the default): every queue pair posts its own
    /// RECVs (`hsqsize + 1` each). Otherwise each poller thread gives every RDMA device it
    /// serves one shared receive queue of this many RECV buffers, used by all of its queue
    /// pairs on that device: 32–65536, lowered to the device's `max_srq_wr`.
    pub rdma_srq_depth: u32,
    /// `c2h_success`: NVMe/TCP only. When the C2HData PDU that ends a read's data also
    /// completes the command (its SUCCESS flag; no response capsule follows): `spec` (only
    /// when the host disabled SQ flow control at Connect, as the NVMe/TCP specification and
    /// the Linux target have it) or `always` (whenever the command succeeded, as SPDK's target
    /// does by default: one PDU fewer per read for hosts that keep SQ flow control on; the
    /// Linux and SPDK hosts accept it).
    pub c2h_success: C2hSuccess,
    /// `tcp_receive`: how pollers receive from NVMe/TCP sockets: `auto` (the default:
    /// `io_uring` where the kernel has it, else `epoll`), `io_uring` (a multishot receive per
    /// socket into provided buffers: no `epoll_wait` and no `recv` per receive; Linux 6.1+) or
    /// `epoll` (readiness, then a `recv` per ready socket). TLS connections are read through
    /// epoll either way.
    pub tcp_receive: TcpReceive,
    /// `tcp_send`: how pollers send on plain NVMe/TCP sockets received through io_uring:
    /// `auto` (the default: through the receive ring when two or more connections of a poller
    /// have output in the same pass, one `io_uring_enter` for all of them; else `sendmsg`),
    /// `io_uring` (through the ring always) or `sendmsg` (a `sendmsg` per connection).
    pub tcp_send: TcpSend,
}

/// How pollers send on NVMe/TCP sockets (`target.tcp_send`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpSend {
    /// Through the receive ring when several connections have output in a pass.
    #[default]
    Auto,
    /// Through the receive ring whenever a connection has output.
    IoUring,
    /// A `sendmsg` per connection with output.
    Sendmsg,
}

impl fmt::Display for TcpSend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TcpSend::Auto => "auto",
            TcpSend::IoUring => "io_uring",
            TcpSend::Sendmsg => "sendmsg",
        })
    }
}

/// How pollers receive from NVMe/TCP sockets (`target.tcp_receive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpReceive {
    /// io_uring where the kernel has it, else epoll.
    #[default]
    Auto,
    /// io_uring multishot receives (start-up fails without kernel support).
    IoUring,
    /// Readiness through epoll, then a `recv` per socket.
    Epoll,
}

impl fmt::Display for TcpReceive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TcpReceive::Auto => "auto",
            TcpReceive::IoUring => "io_uring",
            TcpReceive::Epoll => "epoll",
        })
    }
}

/// When a C2HData PDU may complete its command (`target.c2h_success`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum C2hSuccess {
    /// Only on queues whose host disabled SQ flow control.
    #[default]
    Spec,
    /// Whenever the command succeeded.
    Always,
}

impl fmt::Display for C2hSuccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            C2hSuccess::Spec => "spec",
            C2hSuccess::Always => "always",
        })
    }
}

/// How poller threads wait for work (`target.polling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Polling {
    /// Spin while the gaps between I/Os are shorter than a wake-up (measured), for at most
    /// `idle_poll_us`; sleep otherwise.
    #[default]
    Adaptive,
    /// Never sleep.
    Busy,
    /// Never spin: sleep whenever there is nothing to do.
    Interrupt,
}

impl fmt::Display for Polling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Polling::Adaptive => "adaptive",
            Polling::Busy => "busy",
            Polling::Interrupt => "interrupt",
        })
    }
}

impl TargetSettings {
    /// The pool buffer size in effect: `io_unit_size`, at most `max_io_size`.
    pub fn io_unit(&self) -> Size {
        Size(self.io_unit_size.bytes().min(self.max_io_size.bytes()))
    }
}

impl Default for TargetSettings {
    fn default() -> TargetSettings {
        TargetSettings {
            threads: 1,
            in_capsule_data: Size::kib(8),
            max_queue_depth: 128,
            max_io_size: Size::mib(8),
            io_unit_size: Size::kib(128),
            keep_alive_ms_min: 1000,
            cntlid_min: 1,
            cntlid_max: 0xffef,
            idle_poll_us: 1000,
            polling: Polling::Adaptive,
            sqpoll: false,
            sqpoll_idle_ms: 10,
            iopoll: false,
            rdma_srq_depth: 0,
            c2h_success: C2hSuccess::Spec,
            tcp_receive: TcpReceive::Auto,
            tcp_send: TcpSend::Auto,
        }
    }
}

/// `metrics`: `{ listen: 127.0.0.1:9940 }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Metrics {
    /// `listen`: TCP address and port of the HTTP metrics endpoint. Required in `metrics`.
    pub listen: SocketAddr,
}

impl Namespace {
    /// The file or device path, for file-backed namespaces.
    pub fn path(&self) -> Option<&std::path::Path> {
        match &self.backing {
            Backing::File { path, .. } => Some(path),
            Backing::Null { .. } | Backing::Rbd(_) => None,
        }
    }
}

impl Serialize for Namespace {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Namespace", 6)?;
        s.serialize_field("nsid", &self.nsid)?;
        match &self.backing {
            Backing::File { path, size } => {
                s.serialize_field("path", &path.to_string_lossy())?;
                match size {
                    Some(size) => s.serialize_field("size", size)?,
                    None => s.skip_field("size")?,
                }
            }
            Backing::Null { size } => s.serialize_field("null", size)?,
            Backing::Rbd(img) => s.serialize_field("rbd", img)?,
        }
        match self.block_size {
            Some(bs) => s.serialize_field("block_size", &bs)?,
            None => s.skip_field("block_size")?,
        }
        s.serialize_field("read_only", &self.read_only)?;
        s.serialize_field("ana_group", &self.ana_group)?;
        s.serialize_field("uuid", &self.uuid)?;
        s.end()
    }
}

/// The nil UUID is "no UUID" on the wire, so it cannot name a namespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a UUID (expected 8-4-4-4-12 hex digits, not all zero)")]
pub struct InvalidUuid(String);

impl FromStr for Uuid {
    type Err = InvalidUuid;

    fn from_str(s: &str) -> Result<Uuid, InvalidUuid> {
        if !crate::nqn::is_uuid_text(s) {
            return Err(InvalidUuid(s.to_owned()));
        }
        let hex: Vec<u8> = s
            .bytes()
            .filter(|&b| b != b'-')
            .map(|b| match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                _ => b - b'A' + 10,
            })
            .collect();
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = hex[2 * i] << 4 | hex[2 * i + 1];
        }
        if out == [0; 16] {
            return Err(InvalidUuid(s.to_owned()));
        }
        Ok(Uuid(out))
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl Serialize for Uuid {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl Uuid {
    /// The UUID a namespace gets when none is configured: an RFC 9562 version 8 UUID built from
    /// a hash of the subsystem NQN and the nsid (128-bit FNV-1a, then two rounds of the
    /// MurmurHash3 64-bit finalizer so that neighbouring nsids give unrelated-looking UUIDs).
    /// It is stable across restarts and distinct for every (subsystem, nsid).
    pub fn derived(subsystem_nqn: &str, nsid: u32) -> Uuid {
        let mut h = fnv1a128(subsystem_nqn.as_bytes(), FNV128_OFFSET);
        h = fnv1a128(&[0], h);
        h = fnv1a128(&nsid.to_be_bytes(), h);
        let (hi, lo) = ((h >> 64) as u64, h as u64);
        let lo = fmix64(lo ^ hi.rotate_left(32));
        let hi = fmix64(hi ^ lo);
        let mut b = (u128::from(hi) << 64 | u128::from(lo)).to_be_bytes();
        b[6] = (b[6] & 0x0f) | 0x80; // version 8
        b[8] = (b[8] & 0x3f) | 0x80; // variant 10xx
        Uuid(b)
    }
}

/// MurmurHash3's 64-bit finalizer (a bijection with full avalanche).
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// The serial number a subsystem gets when none is configured: `NVMF` and 16 upper-case hex
/// digits of a 64-bit FNV-1a hash of the NQN (20 characters, the size of the SN field).
pub fn default_serial(nqn: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in nqn.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("NVMF{h:016X}")
}

const FNV128_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;

fn fnv1a128(bytes: &[u8], mut h: u128) -> u128 {
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    for &b in bytes {
        h ^= u128::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

impl Serialize for RbdImage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("RbdImage", 5)?;
        s.serialize_field("pool", &self.pool)?;
        s.serialize_field("image", &self.image)?;
        if self.namespace.is_empty() {
            s.skip_field("namespace")?;
        } else {
            s.serialize_field("namespace", &self.namespace)?;
        }
        s.serialize_field("conf", &self.conf.to_string_lossy())?;
        s.serialize_field("user", &self.user)?;
        s.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text_round_trip() {
        let text = "0c7b7e4a-1f2e-4c3d-9a8b-7c6d5e4f3a2b";
        let u: Uuid = text.parse().unwrap();
        assert_eq!(u.0[0], 0x0c);
        assert_eq!(u.0[15], 0x2b);
        assert_eq!(u.to_string(), text);
        assert_eq!(
            "0C7B7E4A-1F2E-4C3D-9A8B-7C6D5E4F3A2B".parse::<Uuid>(),
            Ok(u)
        );
        assert!("00000000-0000-0000-0000-000000000000"
            .parse::<Uuid>()
            .is_err());
        assert!("0c7b7e4a1f2e4c3d9a8b7c6d5e4f3a2b".parse::<Uuid>().is_err());
    }

    #[test]
    fn fnv1a128_matches_reference_vectors() {
        assert_eq!(fnv1a128(b"", FNV128_OFFSET), FNV128_OFFSET);
        assert_eq!(
            fnv1a128(b"a", FNV128_OFFSET),
            0xd228_cb69_6f1a_8caf_7891_2b70_4e4a_8964
        );
    }

    #[test]
    fn derived_uuid_is_stable_v8_and_distinct() {
        let a = Uuid::derived("nqn.2026-11.io.example:a", 1);
        assert_eq!(a, Uuid::derived("nqn.2026-11.io.example:a", 1));
        assert_ne!(a, Uuid::derived("nqn.2026-11.io.example:a", 2));
        assert_ne!(a, Uuid::derived("nqn.2026-11.io.example:b", 1));
        assert_eq!(a.0[6] >> 4, 8);
        assert_eq!(a.0[8] >> 6, 0b10);
        // Pinned: a change here would change every namespace's UUID after an upgrade.
        assert_eq!(
            Uuid::derived("nqn.2026-11.io.nvmf-rs:default", 1).to_string(),
            "3f21d58d-836b-8214-b5d1-fa61de7f5859"
        );
    }

    #[test]
    fn default_serial_is_20_ascii_chars() {
        let s = default_serial("nqn.2026-11.io.example:disk1");
        assert_eq!(s.len(), 20);
        assert!(s.starts_with("NVMF") && s[4..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(s, default_serial("nqn.2026-11.io.example:disk2"));
        // FNV-1a 64 of the empty string is its offset basis.
        assert_eq!(default_serial(""), "NVMFCBF29CE484222325");
    }
}
