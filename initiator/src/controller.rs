//! Controller bring-up over NVMe/TCP, the way the Linux host does it
//! (`drivers/nvme/host/{core,fabrics,tcp}.c`), and the namespace block API.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nvme::auth::secp;
use nvme::fabrics::{self, reg, Cap, Cc, ConnectData, ConnectResult, Csts, PropSize};
use nvme::identify::{self, cns, IdentifyController, IdentifyNamespace};
use nvme::opcode::{admin, io};
use nvme::resv;
use nvme::sgl::Sgl;
use nvme::{Sqe, Status};

use crate::any_queue::{AnyLink, AnyQueue, IoQueue, RdmaQueue, TypedQueue};
use crate::auth::{self, DhchapOptions, TxnIds};
use crate::cmd::{rw_sqe, DataRef, Dir, NsInfo, Transport};
use crate::error::{CmdError, Error};
use crate::namespace::Namespace;
use crate::path::PathStatus;
use crate::queue::{Queue, QueueParams};
use crate::rdma::RdmaLink;
use crate::spin::{Polling, Spin};
use crate::tcp::TcpLink;

/// The block API (`read_at`, `write_at`, `compare_at`) splits a transfer into commands of at
/// most this many bytes, however large the controller's MDTS (as Linux's block layer does,
/// 1.25 MiB by default): a larger command pins that much registered memory while it runs
/// (NVMe/RDMA stages plain memory in pool buffers) and a target with smaller buffers moves it
/// in pieces one after another, while commands of this size run side by side. The
/// asynchronous API sends what it is given, up to MDTS.
pub const SPLIT_BYTES: u32 = 1 << 20;

/// How to reach and set up a controller.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub transport: Transport,
    /// Host name or IP address of the target.
    pub addr: String,
    /// Port (NVMe/TCP default 4420).
    pub port: u16,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
    /// Host identifier (a UUID).
    pub hostid: [u8; 16],
    /// Number of I/O queues to create (0: admin only).
    pub queues: u16,
    /// Commands in flight per I/O queue (the SQ has one more entry; clamped to CAP.MQES and
    /// MAXCMD; at least 15 over RDMA, as the Linux host).
    pub queue_depth: u16,
    /// Keep-alive timeout, sent in the admin Connect; Keep Alive goes out every `kato / 2`.
    /// `Duration::ZERO` asks for no keep-alive, which targets may refuse for an I/O controller
    /// (nvmf-target answers Connect Invalid Parameters; the Linux host never sends 0 there).
    pub kato: Duration,
    /// Negotiate NVMe/TCP header digests.
    pub hdr_digest: bool,
    /// Negotiate NVMe/TCP data digests.
    pub data_digest: bool,
    /// Bound of every wait: TCP connect, each command, controller enable.
    pub timeout: Duration,
    /// How I/O queues wait for completions: [`Polling::Adaptive`] (the default), `Busy`
    /// (fio's `hipri`) or `Interrupt`.
    pub polling: Polling,
    /// How long an adaptive wait on an I/O queue spins (looks at the socket or completion
    /// queue again without sleeping) before it sleeps in the kernel, while commands are in
    /// flight: see [`DEFAULT_SPIN`](crate::DEFAULT_SPIN) (50 us, the default over both
    /// transports) and the crate docs. `Duration::ZERO`: always sleep, as `Interrupt`.
    pub poll_spin: Duration,
    /// In-band authentication (DH-HMAC-CHAP) secrets: used on every queue whose Connect
    /// response asks for authentication (AUTHREQ.ATR), as the Linux host does; a controller
    /// that does not ask is connected without. `None` (the default): a controller that asks
    /// fails the connect with [`Error::Auth`].
    pub dhchap: Option<DhchapOptions>,
    /// NVMe/TCP over TLS 1.3 with a pre-shared key (every queue; kernel TLS where the kernel
    /// has it, records in user space elsewhere). `None` (the default): plain NVMe/TCP.
    pub tls: Option<TlsOptions>,
    /// Secure channel concatenation (NVMe/TCP; NVMe Base 2.1, 8.3.4.5.9): the admin queue's
    /// DH-HMAC-CHAP transaction (`dhchap` is needed, with a DH group) negotiates a TLS PSK,
    /// and every queue then runs over TLS 1.3 with it, the admin queue again first: a secure
    /// channel with no PSK to distribute. Every connect (and reconnect) negotiates a new key.
    /// The target's listener must take the plain connection it starts with (`tls: allowed`
    /// on nvmf-target). `false` (the default): not asked.
    pub concat: bool,
}

/// The TLS PSK a host connects with (NVMe/TCP 1.1, 3.6): its configured key and the identity
/// form it offers (the target accepts both; the Linux host prefers v1).
#[derive(Debug, Clone)]
pub struct TlsOptions {
    pub psk: tls::ConfiguredPsk,
    pub identity: tls::IdentityVersion,
}

impl TlsOptions {
    /// From the interchange form `nvme gen-tls-key` prints (`NVMeTLSkey-1:01:...:`), offering
    /// a v1 identity.
    pub fn new(psk_text: &str) -> Result<TlsOptions, Error> {
        let psk = tls::ConfiguredPsk::parse(psk_text)
            .map_err(|e| Error::InvalidArgument(format!("TLS PSK: {e}")))?;
        Ok(TlsOptions {
            psk,
            identity: tls::IdentityVersion::V1,
        })
    }
}

impl ConnectOptions {
    /// NVMe/TCP to `addr:port` for `subnqn`, with a random host ID and the matching
    /// `nqn.2014-08.org.nvmexpress:uuid:` host NQN, one I/O queue of depth 128, keep-alive 5 s
    /// (the Linux default), no digests, 30 s timeout.
    pub fn tcp(addr: &str, port: u16, subnqn: &str) -> ConnectOptions {
        let hostid: [u8; 16] = rand::random();
        ConnectOptions {
            transport: Transport::Tcp,
            addr: addr.to_string(),
            port,
            subnqn: subnqn.to_string(),
            hostnqn: hostnqn_for(&hostid),
            hostid,
            queues: 1,
            queue_depth: 128,
            kato: Duration::from_secs(5),
            hdr_digest: false,
            data_digest: false,
            timeout: Duration::from_secs(30),
            polling: Polling::Adaptive,
            poll_spin: crate::spin::DEFAULT_SPIN,
            dhchap: None,
            tls: None,
            concat: false,
        }
    }

    /// The TLS client side of this connection's queues (its identity names the host and
    /// subsystem NQNs).
    pub(crate) fn tls_for_queue(&self) -> Result<Option<tls::ClientConfig>, Error> {
        if self.concat {
            let why = if self.transport != Transport::Tcp {
                Some("it is NVMe/TCP's (not NVMe/RDMA's)")
            } else if self.dhchap.is_none() {
                Some("it needs a DH-HMAC-CHAP secret (`dhchap`)")
            } else if self.tls.is_some() {
                Some("it makes its own TLS PSK (leave `tls` out)")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(Error::InvalidArgument(format!(
                    "secure channel concatenation: {why}"
                )));
            }
        }
        let Some(t) = &self.tls else { return Ok(None) };
        if self.transport != Transport::Tcp {
            return Err(Error::InvalidArgument(
                "TLS is NVMe/TCP's secure channel (not NVMe/RDMA)".into(),
            ));
        }
        tls::ClientConfig::new(&t.psk, t.identity, &self.hostnqn, &self.subnqn)
            .map(Some)
            .map_err(|e| Error::Io(std::io::Error::other(e)))
    }

    /// NVMe/RDMA to `addr:port` (an IP address of an RDMA device's netdev, or of a peer
    /// reachable through one) for `subnqn`; otherwise the same defaults as
    /// [`ConnectOptions::tcp`] (digests do not apply): a wait polls the completion queue for
    /// up to `poll_spin` before it sleeps on the completion channel.
    pub fn rdma(addr: &str, port: u16, subnqn: &str) -> ConnectOptions {
        ConnectOptions {
            transport: Transport::Rdma,
            ..ConnectOptions::tcp(addr, port, subnqn)
        }
    }
}

/// The host NQN format NVMe Base 2.0 (4.5) gives for a UUID-based host.
pub fn hostnqn_for(hostid: &[u8; 16]) -> String {
    let h = |r: core::ops::Range<usize>| {
        hostid[r]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    format!(
        "nqn.2014-08.org.nvmexpress:uuid:{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

/// Admin queue: 32 entries (sqsize 31) as NVME_AQ_DEPTH; at most 31 commands in flight.
const ADMIN_SQSIZE: u16 = 31;
/// The Linux host's in-capsule limit on the admin queue (NVME_TCP_ADMIN_CCSZ).
const ADMIN_ICD: u32 = 8192;
/// Smallest NVMe/RDMA I/O queue (SQSIZE 15: 16 entries, the Linux host's NVMF_MIN_QUEUE_SIZE).
const RDMA_MIN_SQSIZE: u16 = 15;
/// Cap on one command's transfer when the controller reports no MDTS.
const DEFAULT_MAX_XFER: u32 = 1 << 20;
/// Shutdown wait when none is configured (Linux shutdown_timeout default).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// What the host learnt about the controller during bring-up.
#[derive(Debug, Clone)]
pub struct ControllerInfo {
    /// Controller ID from Connect (and Identify).
    pub cntlid: u16,
    /// Controller Capabilities.
    pub cap: u64,
    /// Version (VS register).
    pub vs: u32,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// Subsystem NQN reported by Identify.
    pub subnqn: String,
    /// Largest transfer of one command in bytes (from MDTS; 1 MiB if none reported).
    pub max_transfer: u32,
    /// In-capsule data limit of I/O queues in bytes (IOCCSZ * 16 - 64).
    pub in_capsule: u32,
    /// Keep Alive Support granularity (100 ms units).
    pub kas: u16,
    /// Optional NVM Command Support.
    pub oncs: u16,
    /// Fused Operation Support (bit 0: Compare and Write).
    pub fuses: u16,
    /// Atomic Compare & Write Unit, blocks, 0's based (the largest fused Compare and Write).
    pub acwu: u16,
    /// Volatile Write Cache.
    pub vwc: u8,
    /// Number of namespaces (NN).
    pub nn: u32,
    /// Controller type (1 I/O, 2 discovery, 3 admin; 0 not reported).
    pub cntrltype: u8,
    /// MAXH2CDATA from the admin queue's ICResp.
    pub maxh2cdata: u32,
    /// I/O queues created and their depth (commands in flight).
    pub io_queues: u16,
    pub io_queue_depth: u16,
}

/// The keep-alive thread; dropping this stops it (and waits for a command it has in flight).
struct KeepAlive {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A connected NVMe-oF controller: the admin queue (shared with the keep-alive thread), the
/// I/O queues not yet handed out, and the namespaces found.
///
/// ```no_run
/// use nvmf_initiator::{ConnectOptions, Controller};
///
/// let mut opts = ConnectOptions::tcp("127.0.0.1", 4420, "nqn.2026-11.io.nvmf-rs:default");
/// opts.queues = 2;
/// let mut ctrl = Controller::connect(opts)?;
/// let nsid = ctrl.namespaces()[0].nsid;
/// let mut ns = ctrl.open_namespace(nsid)?;
/// let mut buf = vec![0u8; ns.block_size() as usize * 8];
/// ns.read_at(&mut buf, 0)?;
/// ns.write_at(&buf, 0)?;
/// ns.flush()?;
/// ctrl.shutdown()?;
/// # Ok::<(), nvmf_initiator::Error>(())
/// ```
pub struct Controller {
    admin: Arc<Mutex<AnyQueue>>,
    keep_alive: Option<KeepAlive>,
    io: Vec<AnyQueue>,
    info: ControllerInfo,
    namespaces: Vec<NsInfo>,
    timeout: Duration,
    shut_down: bool,
    /// Where it was reached (a namespace's path status names it).
    transport: Transport,
    addr: String,
    port: u16,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("info", &self.info)
            .field("namespaces", &self.namespaces)
            .field("io_queues_left", &self.io.len())
            .finish_non_exhaustive()
    }
}

pub(crate) fn resolve(addr: &str, port: u16) -> Result<SocketAddr, Error> {
    (addr, port)
        .to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("cannot resolve {addr}:{port}: {e}")))?
        .next()
        .ok_or_else(|| Error::InvalidArgument(format!("{addr}:{port} resolves to no address")))
}

/// Open one queue of `opts.transport`: TCP connection and ICReq/ICResp, or the NVMe/RDMA
/// rdma_cm handshake (which carries `cntlid` for I/O queues).
fn open_queue(
    sa: &SocketAddr,
    opts: &ConnectOptions,
    channel: Option<&tls::ClientConfig>,
    p: &QueueParams,
    cntlid: u16,
) -> Result<AnyQueue, Error> {
    let link = match opts.transport {
        Transport::Tcp => AnyLink::Tcp(TcpLink::open_with(sa, p, channel.cloned())?),
        Transport::Rdma => AnyLink::Rdma(RdmaLink::connect(sa, p, cntlid)?),
    };
    Ok(Queue::new(link, p.timeout, p.spin))
}

/// The TLS channel of a controller's queues: `None` for plain NVMe/TCP and NVMe/RDMA.
pub(crate) type Channel = Option<tls::ClientConfig>;

/// A bare admin queue: TCP connection, ICReq/ICResp (or rdma_cm connect), Fabrics Connect,
/// and the authentication transaction if the controller asks for one (its T_ID from `ids`).
/// With secure channel concatenation that is done twice: plain, negotiating a TLS PSK, then
/// over TLS with it (the plain queue closed, as the Linux host does). Returns the queue, the
/// controller ID and the channel the I/O queues use.
pub(crate) fn connect_admin(
    sa: &SocketAddr,
    opts: &ConnectOptions,
    ids: &mut TxnIds,
) -> Result<(AnyQueue, u16, Channel), Error> {
    let channel = opts.tls_for_queue()?;
    if !opts.concat {
        let (q, cntlid, _) = admin_queue(sa, opts, channel.as_ref(), secp::NOSC, ids)?;
        return Ok((q, cntlid, channel));
    }
    let (plain, _, generated) = admin_queue(sa, opts, None, secp::NEWTLSPSK, ids)?;
    drop(plain);
    let Some((hash, psk)) = generated else {
        return Err(Error::Auth {
            qid: 0,
            step: "connect",
            detail: "the controller did not ask for authentication: no TLS PSK was negotiated \
                     (secure channel concatenation needs a host key on the target)"
                .into(),
        });
    };
    let id = tls::PskIdentity::generated(hash, &opts.hostnqn, &opts.subnqn, &psk);
    tracing::debug!(identity = %id, "secure channel concatenation: TLS PSK generated");
    let tls_psk = id.tls_psk(&psk);
    let cfg = tls::ClientConfig::with_identity(id, tls_psk)
        .map_err(|e| Error::Tls(format!("TLS set-up with the generated PSK: {e}")))?;
    let (q, cntlid, _) = admin_queue(sa, opts, Some(&cfg), secp::NOSC, ids)?;
    Ok((q, cntlid, Some(cfg)))
}

/// One admin queue over `channel`, its Connect and authentication (with SC_C `sc_c`); the
/// PSK a concatenation generated.
fn admin_queue(
    sa: &SocketAddr,
    opts: &ConnectOptions,
    channel: Option<&tls::ClientConfig>,
    sc_c: u8,
    ids: &mut TxnIds,
) -> Result<(AnyQueue, u16, Option<auth::Generated>), Error> {
    let params = QueueParams {
        qid: 0,
        depth: ADMIN_SQSIZE,
        hdgst: opts.hdr_digest,
        ddgst: opts.data_digest,
        timeout: opts.timeout,
        spin: Spin::NEVER,
    };
    if opts.transport == Transport::Rdma {
        crate::rdma::check_devices()?;
    }
    let mut q = open_queue(sa, opts, channel, &params, 0)?;
    // The Linux RDMA host puts no data in admin capsules (nvmet-rdma admin RECVs have no room).
    if opts.transport == Transport::Tcp {
        q.set_icd_max(ADMIN_ICD);
    }
    let kato_ms = u32::try_from(opts.kato.as_millis())
        .map_err(|_| Error::InvalidArgument("kato too large".into()))?;
    let (cntlid, generated) = fabrics_connect(
        &mut q,
        opts,
        0,
        ADMIN_SQSIZE,
        kato_ms,
        fabrics::CNTLID_DYNAMIC,
        ids,
        sc_c,
    )?;
    Ok((q, cntlid, generated))
}

/// Fabrics Connect on `q` (`nvmf_connect_admin_queue` / `nvmf_connect_io_queue`), then the
/// DH-HMAC-CHAP transaction on it when the response asks for one ([`auth::on_connect`], its
/// T_ID the next of `ids`, SC_C `sc_c`). Every queue of every transport, and every queue a
/// reconnect creates, comes through here. Returns the controller ID and the PSK a secure
/// channel concatenation generated.
#[allow(clippy::too_many_arguments)]
fn fabrics_connect(
    q: &mut AnyQueue,
    opts: &ConnectOptions,
    qid: u16,
    sqsize: u16,
    kato_ms: u32,
    cntlid: u16,
    ids: &mut TxnIds,
    sc_c: u8,
) -> Result<(u16, Option<auth::Generated>), Error> {
    let data = ConnectData::new(opts.hostid, cntlid, &opts.subnqn, &opts.hostnqn).encode();
    // NVMe/TCP I/O queues disable SQ flow control (CATTR bit 2, as Linux's `disable_sqflow`):
    // this initiator never reads SQHD (a tag is free once its command completed), and it lets
    // the controller complete a read with the last C2HData PDU's SUCCESS flag instead of a
    // separate CapsuleResp (NVMe/TCP 1.0, 3.6.2.7): one PDU fewer per read on both sides.
    let cattr = if qid > 0 && opts.transport == Transport::Tcp {
        fabrics::CATTR_DISABLE_SQFLOW
    } else {
        0
    };
    let sqe = fabrics::connect_sqe(
        0,
        qid,
        sqsize,
        cattr,
        kato_ms,
        Sgl::InCapsule {
            offset: 0,
            len: 1024,
        },
    );
    match q.execute("Connect", sqe, DataRef::Write(&data)) {
        Ok(result) => match ConnectResult::decode(result, false) {
            ConnectResult::Success { cntlid, authreq } => {
                let generated = auth::on_connect(
                    q,
                    authreq,
                    opts.dhchap.as_ref(),
                    &opts.hostnqn,
                    &opts.subnqn,
                    ids,
                    sc_c,
                )?;
                Ok((cntlid, generated))
            }
            ConnectResult::InvalidParam { .. } => unreachable!("decoded as success"),
        },
        Err(e) => {
            if e.status().map(|s| s.code()) == Some(Status::CONNECT_INVALID_PARAM.code()) {
                tracing::warn!(
                    qid,
                    "Connect: Invalid Parameters (see the target log for IATTR/IPO)"
                );
            }
            Err(e)
        }
    }
}

fn property_get(q: &mut AnyQueue, offset: u32, size: PropSize) -> Result<u64, Error> {
    q.execute(
        "Property Get",
        fabrics::property_get_sqe(0, offset, size),
        DataRef::None,
    )
}

fn property_set(q: &mut AnyQueue, offset: u32, value: u64, size: PropSize) -> Result<(), Error> {
    q.execute(
        "Property Set",
        fabrics::property_set_sqe(0, offset, value, size),
        DataRef::None,
    )
    .map(|_| ())
}

fn identify(q: &mut AnyQueue, cns: u8, nsid: u32, buf: &mut [u8; 4096]) -> Result<(), Error> {
    let cmd = identify::IdentifyCmd {
        cns,
        cntid: 0,
        cnssid: 0,
        csi: 0,
        nsid,
    };
    q.execute("Identify", cmd.to_sqe(0, [0; 16]), DataRef::Read(buf))
        .map(|_| ())
}

/// Enable the controller as `nvme_enable_ctrl` does: CC without EN, CAP again, CC with EN,
/// then poll CSTS.RDY for CAP.TO * 500 ms. Returns CAP.
pub(crate) fn enable(q: &mut AnyQueue) -> Result<Cap, Error> {
    let cap = Cap(property_get(q, reg::CAP, PropSize::Eight)?);
    if cap.mpsmin() != 0 {
        return Err(Error::Controller(format!(
            "CAP.MPSMIN {} (pages above 4 KiB)",
            cap.mpsmin()
        )));
    }
    let css = if cap.css() & Cap::CSS_CSI != 0 {
        Cc::CSS_CSI
    } else {
        Cc::CSS_NVM
    };
    let cc = Cc::new(false, css, 0, 0, Cc::SHN_NONE, 6, 4);
    property_set(q, reg::CC, cc.0 as u64, PropSize::Four)?;
    let cap = Cap(property_get(q, reg::CAP, PropSize::Eight)?);
    let cc = Cc::new(true, css, 0, 0, Cc::SHN_NONE, 6, 4);
    property_set(q, reg::CC, cc.0 as u64, PropSize::Four)?;
    let wait = Duration::from_millis(500) * (cap.to() as u32).max(1);
    let deadline = Instant::now() + wait;
    loop {
        let csts = Csts(property_get(q, reg::CSTS, PropSize::Four)? as u32);
        if csts.cfs() {
            return Err(Error::Controller("CSTS.CFS set while enabling".into()));
        }
        if csts.rdy() {
            return Ok(cap);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout(wait, "CSTS.RDY"));
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Normal shutdown: CC.SHN = 01b, then poll CSTS.SHST for completion.
pub(crate) fn shutdown_ctrl(q: &mut AnyQueue, wait: Duration) -> Result<(), Error> {
    let cc = Cc(property_get(q, reg::CC, PropSize::Four)? as u32);
    let cc = Cc::new(
        cc.en(),
        cc.css(),
        cc.mps(),
        cc.ams(),
        Cc::SHN_NORMAL,
        cc.iosqes(),
        cc.iocqes(),
    );
    property_set(q, reg::CC, cc.0 as u64, PropSize::Four)?;
    let deadline = Instant::now() + wait;
    loop {
        let csts = Csts(property_get(q, reg::CSTS, PropSize::Four)? as u32);
        if csts.0 & Csts::SHST_MASK == Csts::SHST_COMPLETE {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout(wait, "CSTS.SHST"));
        }
        thread::sleep(Duration::from_millis(2));
    }
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(fabrics::until_nul(b))
        .trim()
        .to_string()
}

impl Controller {
    /// Connect, enable and identify the controller, create the I/O queues and scan the
    /// namespaces (the sequence of `drivers/nvme/host`; see the crate doc).
    pub fn connect(opts: ConnectOptions) -> Result<Controller, Error> {
        if opts.queues > 0 && opts.queue_depth == 0 {
            return Err(Error::InvalidArgument("queue_depth 0".into()));
        }
        let sa = resolve(&opts.addr, opts.port)?;
        // One T_ID counter per controller: the admin queue's transaction, then the I/O queues'.
        let mut txn_ids = TxnIds::default();
        let (mut admin, cntlid, channel) = connect_admin(&sa, &opts, &mut txn_ids)?;
        let cap = enable(&mut admin)?;
        let vs = property_get(&mut admin, reg::VS, PropSize::Four)? as u32;

        let mut buf = [0u8; 4096];
        identify(&mut admin, cns::CTRL, 0, &mut buf)?;
        let id = IdentifyController::decode(&buf).expect("4096 bytes");
        if id.cntlid.get() != cntlid {
            return Err(Error::Controller(format!(
                "Identify cntlid {:#x} differs from Connect's {cntlid:#x}",
                id.cntlid.get()
            )));
        }
        if id.cntrltype == identify::ctrl::CNTRLTYPE_DISCOVERY {
            return Err(Error::Controller(format!(
                "{} is a discovery controller",
                opts.subnqn
            )));
        }
        // nvme_init_identify: "keep-alive support is mandatory for fabrics".
        if id.kas.get() == 0 {
            return Err(Error::Controller("KAS is 0".into()));
        }
        let ioccsz = id.ioccsz.get();
        if ioccsz < 4 || id.iorcsz.get() < 1 {
            return Err(Error::Controller(format!(
                "IOCCSZ {ioccsz} / IORCSZ {} too small",
                id.iorcsz.get()
            )));
        }
        if id.icdoff.get() != 0 {
            return Err(Error::Controller(format!(
                "ICDOFF {} (must be 0)",
                id.icdoff.get()
            )));
        }
        if id.sgls.get() & 3 == 0 {
            return Err(Error::Controller("no SGL support".into()));
        }
        let rdma = opts.transport == Transport::Rdma;
        // nvme_rdma_setup_ctrl: "Mandatory keyed sgls are not supported!"
        if rdma && id.sgls.get() & identify::ctrl::SGLS_KEYED == 0 {
            return Err(Error::Controller(
                "no keyed SGL support (SGLS bit 2), which NVMe/RDMA needs".into(),
            ));
        }
        let page = 4096u64;
        // MDTS is a power of two in units of the minimum page (4 KiB, checked in `enable`);
        // above 2^19 pages (2 GiB) the NLB limit of one command bites first anyway.
        let max_transfer = match id.mdts {
            0 => DEFAULT_MAX_XFER,
            m => (page << m.min(19)) as u32,
        };
        let mut in_capsule = ioccsz.saturating_mul(16).saturating_sub(64);
        // Over RDMA, in-capsule data needs SGL offsets (SGLS bit 20), as the Linux host checks.
        if rdma && id.sgls.get() & identify::ctrl::SGLS_OFFSET == 0 {
            in_capsule = 0;
        }

        // Keep-alive runs from here on: connecting many I/O queues (or a slow fabric) can take
        // longer than KATO, and the target would tear the controller down meanwhile.
        let admin = Arc::new(Mutex::new(admin));
        let keep_alive = if opts.kato.is_zero() {
            None
        } else {
            Some(start_keep_alive(&admin, opts.kato / 2)?)
        };
        let lock = || admin.lock().unwrap_or_else(|p| p.into_inner());

        // Number of Queues (Set Features 07h), then one Connect per I/O queue.
        let mut io = Vec::new();
        let mut depth = 0u16;
        if opts.queues > 0 {
            let want = opts.queues as u32 - 1;
            let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
            sqe.cdw10 = (identify::feat::NUM_QUEUES as u32).into();
            sqe.cdw11 = (want | want << 16).into();
            let r = lock().execute("Set Features (Number of Queues)", sqe, DataRef::None)?;
            let granted = ((r & 0xffff) as u16)
                .min((r >> 16) as u16)
                .saturating_add(1);
            let nq = opts.queues.min(granted);
            if nq < opts.queues {
                tracing::warn!(
                    asked = opts.queues,
                    granted = nq,
                    "controller granted fewer I/O queues"
                );
            }
            depth = opts.queue_depth;
            if rdma {
                // NVMF_MIN_QUEUE_SIZE: the Linux host never makes an RDMA I/O queue smaller
                // than 16 entries, and nvmet-rdma sizes its send queue from hrqsize (about
                // 4 x hrqsize WRs over siw). A 1 MiB read over siw needs 44 (6 SGEs per
                // RDMA WRITE): on a queue of 8 it never completed (Linux 6.1 in the VM).
                depth = depth.max(RDMA_MIN_SQSIZE);
            }
            depth = depth.min(cap.mqes());
            let maxcmd = id.maxcmd.get();
            if maxcmd != 0 {
                depth = depth.min(maxcmd);
            }
            let params = QueueParams {
                qid: 0,
                depth,
                hdgst: opts.hdr_digest,
                ddgst: opts.data_digest,
                timeout: opts.timeout,
                spin: opts.polling.spin(opts.poll_spin),
            };
            for qid in 1..=nq {
                let p = QueueParams { qid, ..params };
                let mut q = open_queue(&sa, &opts, channel.as_ref(), &p, cntlid)?;
                q.set_icd_max(in_capsule);
                let nosc = secp::NOSC;
                fabrics_connect(&mut q, &opts, qid, depth, 0, cntlid, &mut txn_ids, nosc)?;
                io.push(q);
            }
        }

        let namespaces = scan_namespaces(&mut lock(), vs, id.nn.get())?;
        let info = ControllerInfo {
            cntlid,
            cap: cap.0,
            vs,
            serial: text(&id.sn),
            model: text(&id.mn),
            firmware: text(&id.fr),
            subnqn: text(&id.subnqn),
            max_transfer,
            in_capsule,
            kas: id.kas.get(),
            oncs: id.oncs.get(),
            fuses: id.fuses.get(),
            acwu: id.acwu.get(),
            vwc: id.vwc,
            nn: id.nn.get(),
            cntrltype: id.cntrltype,
            maxh2cdata: lock().maxh2cdata(),
            io_queues: io.len() as u16,
            io_queue_depth: depth,
        };
        Ok(Controller {
            admin,
            keep_alive,
            io,
            info,
            namespaces,
            timeout: opts.timeout,
            shut_down: false,
            transport: opts.transport,
            addr: opts.addr.clone(),
            port: opts.port,
        })
    }

    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// Active namespaces found at connect time.
    pub fn namespaces(&self) -> &[NsInfo] {
        &self.namespaces
    }

    /// Take one of the NVMe/TCP I/O queues (for a thread of its own). `None` when all are
    /// taken or the controller is connected over another transport ([`Controller::take_queue`]
    /// serves both).
    pub fn take_io_queue(&mut self) -> Option<IoQueue> {
        match self.take_typed(Transport::Tcp)? {
            TypedQueue::Tcp(q) => Some(q),
            TypedQueue::Rdma(_) => None,
        }
    }

    /// Take one of the NVMe/RDMA I/O queues. `None` when all are taken or the controller is
    /// connected over another transport.
    pub fn take_rdma_queue(&mut self) -> Option<RdmaQueue> {
        match self.take_typed(Transport::Rdma)? {
            TypedQueue::Rdma(q) => Some(q),
            TypedQueue::Tcp(_) => None,
        }
    }

    /// One of the I/O queues (all of one transport) as its transport's queue type, if they
    /// are of transport `t`. A queue not yet handed out has nothing in flight.
    fn take_typed(&mut self, t: Transport) -> Option<TypedQueue> {
        if self.io.last()?.transport() != t {
            return None;
        }
        self.io.pop()?.into_typed().ok()
    }

    /// Take one of the I/O queues, of whichever transport. `None` when all are taken.
    pub fn take_queue(&mut self) -> Option<AnyQueue> {
        self.io.pop()
    }

    /// I/O queues not yet taken.
    pub fn io_queues_left(&self) -> usize {
        self.io.len()
    }

    /// The geometry of active namespace `nsid`; the error names the active ones.
    pub fn namespace(&self, nsid: u32) -> Result<NsInfo, Error> {
        self.namespaces
            .iter()
            .find(|n| n.nsid == nsid)
            .copied()
            .ok_or_else(|| {
                let active: Vec<String> =
                    self.namespaces.iter().map(|n| n.nsid.to_string()).collect();
                let active = if active.is_empty() {
                    "none".to_string()
                } else {
                    active.join(", ")
                };
                Error::InvalidArgument(format!("namespace {nsid} is not active (active: {active})"))
            })
    }

    /// A namespace handle with the synchronous block API, on one of the I/O queues: a
    /// [`Namespace`] of one path that does not reconnect (the controller stays the
    /// caller's; [`Namespace::connect`] opens one that owns its connection and reconnects).
    pub fn open_namespace(&mut self, nsid: u32) -> Result<Namespace, Error> {
        let q = self.open_queue(nsid)?;
        let status = PathStatus::direct(self.transport, &self.addr, self.port, self.info.cntlid);
        Ok(Namespace::direct(q, status))
    }

    /// Namespace `nsid` on one of the I/O queues.
    pub(crate) fn open_queue(&mut self, nsid: u32) -> Result<NsQueue, Error> {
        let info = self.namespace(nsid)?;
        let queue = self
            .io
            .pop()
            .ok_or_else(|| Error::InvalidArgument("no I/O queue left".into()))?;
        Ok(NsQueue::new(info, queue, &self.info))
    }

    fn lock_admin(&self) -> MutexGuard<'_, AnyQueue> {
        // A panic while holding the lock leaves the queue usable (or failed): keep going.
        self.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run an admin command with an optional data buffer; returns CQE DW0..1. The queue sets
    /// CID, PSDT and the SGL.
    pub fn admin_command(
        &self,
        what: &'static str,
        sqe: Sqe,
        data: DataRef<'_>,
    ) -> Result<u64, Error> {
        self.lock_admin().execute(what, sqe, data)
    }

    /// Identify with CNS `cns` for `nsid` (4096 bytes).
    pub fn identify(&self, cns: u8, nsid: u32) -> Result<Box<[u8; 4096]>, Error> {
        let mut buf = Box::new([0u8; 4096]);
        identify(&mut self.lock_admin(), cns, nsid, &mut buf)?;
        Ok(buf)
    }

    /// Get Log Page `lid` into `buf` from byte `offset`.
    pub fn get_log_page(
        &self,
        lid: u8,
        nsid: u32,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), Error> {
        get_log(
            &mut self.lock_admin(),
            lid,
            nsid,
            offset,
            buf,
            self.info.max_transfer,
            false,
        )
    }

    /// Enable asynchronous event notices (Set Features 0Bh Asynchronous Event Configuration,
    /// CDW11 = `mask`, e.g. `identify::ctrl::OAES_NS_ATTR`), as the Linux host does before it
    /// posts an AER.
    pub fn enable_async_events(&self, mask: u32) -> Result<(), Error> {
        let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
        sqe.cdw10 = (identify::feat::ASYNC_EVENT as u32).into();
        sqe.cdw11 = mask.into();
        self.admin_command("Set Features (Async Event Config)", sqe, DataRef::None)
            .map(|_| ())
    }

    /// Post an Asynchronous Event Request. It completes when the controller has an event;
    /// collect it with [`Controller::wait_async_event`]. It has no completion deadline.
    pub fn submit_async_event_request(&self) -> Result<(), Error> {
        self.lock_admin().submit_aer().map(|_| ())
    }

    /// Wait up to `timeout` for a posted AER to complete: `Some(event)` (CQE DW0, decode with
    /// `nvme::log::AsyncEvent::decode`), `None` on timeout. The admin queue stays usable
    /// (keep-alive, other commands) while this waits.
    pub fn wait_async_event(&self, timeout: Duration) -> Result<Option<u32>, Error> {
        let until = Instant::now() + timeout;
        loop {
            // Short slices: the keep-alive thread shares the admin queue.
            let slice = until
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(20));
            let done = self.lock_admin().reap_aers(slice)?;
            if let Some(r) = done.into_iter().next() {
                return match r {
                    Ok(dw) => Ok(Some(dw as u32)),
                    Err(e) => Err(Error::from_cmd("Async Event Request", e)),
                };
            }
            if Instant::now() >= until {
                return Ok(None);
            }
        }
    }

    /// Read (and so clear, RAE = 0) the Changed Namespace List (log 04h): the NSIDs that
    /// changed since it was last read, increasing (FFFFFFFFh alone: more than 1024).
    pub fn changed_namespaces(&self) -> Result<Vec<u32>, Error> {
        let mut buf = vec![0u8; 4096];
        get_log(
            &mut self.lock_admin(),
            nvme::log::lid::CHANGED_NS,
            0xffff_ffff,
            0,
            &mut buf,
            self.info.max_transfer,
            false,
        )?;
        Ok(identify::decode_ns_list(&buf))
    }

    /// Identify the active namespaces again (after a Namespace Attribute Changed event).
    pub fn rescan_namespaces(&mut self) -> Result<&[NsInfo], Error> {
        let nn = self.info.nn.max(1024);
        let vs = self.info.vs;
        let found = scan_namespaces(&mut self.lock_admin(), vs, nn)?;
        self.namespaces = found;
        Ok(&self.namespaces)
    }

    /// Send one Keep Alive now.
    pub fn keep_alive(&self) -> Result<(), Error> {
        self.admin_command("Keep Alive", Sqe::new(admin::KEEP_ALIVE, 0), DataRef::None)
            .map(|_| ())
    }

    fn stop_keep_alive(&mut self) {
        drop(self.keep_alive.take());
    }

    /// Stop keep-alive and drop the controller without the shutdown handshake (its connection
    /// is known to be broken; the target frees its side when its keep-alive timer fires).
    pub(crate) fn abandon(mut self) {
        self.shut_down = true;
    }

    /// Stop keep-alive and shut the controller down (CC.SHN, wait for CSTS.SHST).
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.stop_keep_alive();
        self.shut_down = true;
        let wait = self.timeout.min(SHUTDOWN_WAIT);
        shutdown_ctrl(&mut self.lock_admin(), wait)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop_keep_alive();
        if !self.shut_down {
            let mut q = self.lock_admin();
            if !q.is_failed() {
                if let Err(e) = shutdown_ctrl(&mut q, self.timeout.min(Duration::from_secs(2))) {
                    tracing::debug!(error = %e, "shutdown on drop failed");
                }
            }
        }
    }
}

fn start_keep_alive(admin: &Arc<Mutex<AnyQueue>>, period: Duration) -> Result<KeepAlive, Error> {
    let (stop, rx) = mpsc::channel::<()>();
    let q = admin.clone();
    let thread = thread::Builder::new()
        .name("nvmf-keepalive".into())
        .spawn(move || loop {
            match rx.recv_timeout(period) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let mut q = q.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = q.execute("Keep Alive", Sqe::new(admin::KEEP_ALIVE, 0), DataRef::None) {
                tracing::warn!(error = %e, "keep-alive failed");
                if q.is_failed() {
                    return;
                }
            }
        })?;
    Ok(KeepAlive {
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// Get Log Page into `buf`, in pieces of at most `max_xfer` bytes.
pub(crate) fn get_log(
    q: &mut AnyQueue,
    lid: u8,
    nsid: u32,
    offset: u64,
    buf: &mut [u8],
    max_xfer: u32,
    rae: bool,
) -> Result<(), Error> {
    if buf.len() % 4 != 0 || offset % 4 != 0 {
        return Err(Error::InvalidArgument(
            "log page offset and length must be dword multiples".into(),
        ));
    }
    let max = (max_xfer as usize).max(4096);
    let mut done = 0usize;
    while done < buf.len() {
        let n = (buf.len() - done).min(max);
        let cmd = nvme::log::GetLogPageCmd::new(lid, nsid, n as u32, offset + done as u64, rae);
        q.execute(
            "Get Log Page",
            cmd.to_sqe(0, [0; 16]),
            DataRef::Read(&mut buf[done..done + n]),
        )?;
        done += n;
    }
    Ok(())
}

/// Identify CNS 02h, or (old controllers failing it with DNR) every NSID up to NN; then
/// Identify Namespace for each.
fn scan_namespaces(q: &mut AnyQueue, vs: u32, nn: u32) -> Result<Vec<NsInfo>, Error> {
    let mut buf = [0u8; 4096];
    let nsids = if vs >= fabrics::version(1, 1, 0) {
        match identify(q, cns::NS_ACTIVE_LIST, 0, &mut buf) {
            Ok(()) => identify::decode_ns_list(&buf),
            Err(e) if e.status().is_some_and(|s| s.is_dnr()) => (1..=nn.min(1024)).collect(),
            Err(e) => return Err(e),
        }
    } else {
        (1..=nn.min(1024)).collect()
    };
    let mut out = Vec::with_capacity(nsids.len());
    for nsid in nsids {
        match identify(q, cns::NS, nsid, &mut buf) {
            Ok(()) => {}
            // An inactive NSID in a sequential scan.
            Err(e)
                if e.status()
                    .is_some_and(|s| s.code() == Status::INVALID_NS.code()) =>
            {
                continue
            }
            Err(e) => return Err(e),
        }
        let id = IdentifyNamespace::decode(&buf).expect("4096 bytes");
        if id.nsze.get() == 0 {
            continue;
        }
        out.push(NsInfo::from_identify(nsid, &id)?);
    }
    Ok(out)
}

/// Limits an I/O command obeys.
#[derive(Debug, Clone, Copy)]
struct IoLimits {
    max_transfer: u32,
    oncs: u16,
    fuses: u16,
    acwu: u16,
}

/// A namespace on one I/O queue: the block operations encoded once, run on one connection
/// ([`Namespace`] runs them on its path set).
#[derive(Debug)]
pub(crate) struct NsQueue {
    info: NsInfo,
    queue: AnyQueue,
    limits: IoLimits,
}

impl NsQueue {
    fn new(info: NsInfo, queue: AnyQueue, c: &ControllerInfo) -> NsQueue {
        NsQueue {
            info,
            queue,
            limits: IoLimits {
                max_transfer: c.max_transfer,
                oncs: c.oncs,
                fuses: c.fuses,
                acwu: c.acwu,
            },
        }
    }

    pub(crate) fn info(&self) -> &NsInfo {
        &self.info
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.info.size()
    }

    pub(crate) fn into_queue(self) -> AnyQueue {
        self.queue
    }

    pub(crate) fn queue_ref(&self) -> &AnyQueue {
        &self.queue
    }

    /// The I/O queue, for the asynchronous API (it stays bound to this handle).
    pub(crate) fn queue(&mut self) -> &mut AnyQueue {
        &mut self.queue
    }

    /// Check a byte range and return (first LBA, blocks).
    fn lba_range(&self, offset: u64, len: u64) -> Result<(u64, u64), Error> {
        let bs = self.info.block_size as u64;
        if offset % bs != 0 || len % bs != 0 {
            return Err(Error::InvalidArgument(format!(
                "offset {offset} / length {len} not multiples of the {bs}-byte block"
            )));
        }
        if offset.checked_add(len).is_none_or(|end| end > self.size()) {
            return Err(Error::InvalidArgument(format!(
                "range {offset}+{len} beyond the namespace ({} bytes)",
                self.size()
            )));
        }
        Ok((offset / bs, len / bs))
    }

    /// Largest piece of one Read/Write, in blocks: the controller's transfer limit, at most
    /// [`SPLIT_BYTES`].
    fn chunk_blocks(&self) -> u64 {
        let bytes = self.limits.max_transfer.min(SPLIT_BYTES);
        let by_xfer = (bytes / self.info.block_size).max(1) as u64;
        by_xfer.min(1 << 16)
    }

    fn rw_cmds(&self, opcode: u8, slba: u64, nlb: u64) -> impl Iterator<Item = (Sqe, usize, u32)> {
        let step = self.chunk_blocks();
        let bs = self.info.block_size as u64;
        let nsid = self.info.nsid;
        (0..nlb.div_ceil(step)).map(move |i| {
            let first = i * step;
            let n = step.min(nlb - first);
            let sqe = rw_sqe(opcode, nsid, slba + first, n as u32);
            (sqe, (first * bs) as usize, (n * bs) as u32)
        })
    }

    /// Read `buf.len()` bytes at byte `offset` (pieces up to MDTS run in parallel on the
    /// queue; data lands directly in `buf`).
    pub(crate) fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        let (slba, nlb) = self.lba_range(offset, buf.len() as u64)?;
        let mut cmds = self.rw_cmds(io::READ, slba, nlb);
        self.queue
            .run_borrowed("Read", Dir::FromCtrl, &mut DataRef::Read(buf), &mut cmds)
            .map(|_| ())
    }

    /// Write `buf` at byte `offset`.
    pub(crate) fn write_at(&mut self, buf: &[u8], offset: u64) -> Result<(), Error> {
        let (slba, nlb) = self.lba_range(offset, buf.len() as u64)?;
        let mut cmds = self.rw_cmds(io::WRITE, slba, nlb);
        self.queue
            .run_borrowed("Write", Dir::ToCtrl, &mut DataRef::Write(buf), &mut cmds)
            .map(|_| ())
    }

    /// Write `buf` at byte `offset` with Force Unit Access (CDW12 bit 30): when this returns,
    /// the data is on non-volatile media, whatever the controller's write cache (a Flush of
    /// just these blocks).
    pub(crate) fn write_fua_at(&mut self, buf: &[u8], offset: u64) -> Result<(), Error> {
        let (slba, nlb) = self.lba_range(offset, buf.len() as u64)?;
        let mut cmds = self
            .rw_cmds(io::WRITE, slba, nlb)
            .map(|(mut sqe, at, len)| {
                sqe.cdw12 = (sqe.cdw12.get() | 1 << 30).into();
                (sqe, at, len)
            });
        self.queue
            .run_borrowed("Write", Dir::ToCtrl, &mut DataRef::Write(buf), &mut cmds)
            .map(|_| ())
    }

    /// Compare `buf` with the namespace's contents at byte `offset` (Compare, split like a
    /// write): `Ok(true)` if they are equal, `Ok(false)` if the controller answered Compare
    /// Failure.
    pub(crate) fn compare_at(&mut self, buf: &[u8], offset: u64) -> Result<bool, Error> {
        if self.limits.oncs & identify::ctrl::ONCS_COMPARE == 0 {
            return Err(Error::Unsupported("Compare (ONCS bit 0 clear)"));
        }
        let (slba, nlb) = self.lba_range(offset, buf.len() as u64)?;
        let mut cmds = self.rw_cmds(io::COMPARE, slba, nlb);
        match self
            .queue
            .run_borrowed("Compare", Dir::ToCtrl, &mut DataRef::Write(buf), &mut cmds)
        {
            Ok(_) => Ok(true),
            Err(Error::Status { status, .. }) if status.code() == Status::COMPARE_FAILED.code() => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Compare and Write (a fused operation): if the blocks at byte `offset` hold exactly
    /// `compare`, replace them with `write` and return `Ok(true)`; if they differ, change
    /// nothing and return `Ok(false)`.
    ///
    /// The controller executes the pair atomically with respect to every other write to
    /// those blocks, from this or any other host and controller: no write lands between the
    /// comparison and the write, and no read or compare sees `write` partly applied. That
    /// makes it a test-and-set on a block range (a lock word, a generation counter) shared by
    /// hosts with nothing else in common.
    ///
    /// `compare` and `write` must have the same length, a whole number of blocks, at most
    /// one command's transfer (MDTS, [`ControllerInfo::max_transfer`]), else
    /// [`Error::InvalidArgument`] (nothing is sent). The controller must report Compare and
    /// Write in FUSES, else [`Error::Unsupported`]. It is two commands posted back to back on
    /// this queue (Compare with FUSE first, Write with FUSE second), so two of its tags must
    /// be free ([`Error::QueueFull`] otherwise: commands of the asynchronous API in flight).
    ///
    /// `Ok(false)` means the Compare completed with Compare Failure (the Write is then
    /// aborted with Command Aborted due to Failed Fused Command). Any other failure of either
    /// command is `Err`; after a transport failure the write may or may not have happened.
    pub(crate) fn compare_and_write(
        &mut self,
        compare: &[u8],
        write: &[u8],
        offset: u64,
    ) -> Result<bool, Error> {
        if compare.len() != write.len() || compare.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "Compare and Write of {} bytes to compare and {} to write",
                compare.len(),
                write.len()
            )));
        }
        let (slba, nlb) = self.lba_range(offset, write.len() as u64)?;
        // At most ACWU (the controller's atomic unit for the pair) and one command's transfer.
        let max = (u64::from(self.limits.acwu) + 1).min(self.chunk_blocks());
        if nlb > max {
            return Err(Error::InvalidArgument(format!(
                "Compare and Write of {} bytes: more than the controller's atomic compare and \
                 write unit ({} bytes)",
                write.len(),
                max * self.info.block_size as u64
            )));
        }
        if self.limits.fuses & identify::ctrl::FUSES_COMPARE_AND_WRITE == 0 {
            return Err(Error::Unsupported("Compare and Write (FUSES bit 0 clear)"));
        }
        let len = write.len() as u32;
        let mut cmp = rw_sqe(io::COMPARE, self.info.nsid, slba, nlb as u32);
        cmp.flags |= nvme::cmd::FUSE_FIRST;
        let mut wr = rw_sqe(io::WRITE, self.info.nsid, slba, nlb as u32);
        wr.flags |= nvme::cmd::FUSE_SECOND;
        // One buffer for both commands' data (the queue carries pieces of one borrowed
        // buffer); the copy is cheap next to the round trip of this rare command.
        let mut data = Vec::with_capacity(2 * write.len());
        data.extend_from_slice(compare);
        data.extend_from_slice(write);
        let [c, w] = self.queue.run_fused(
            Dir::ToCtrl,
            &mut DataRef::Write(&data),
            [(cmp, 0, len), (wr, write.len(), len)],
        )?;
        let is = |r: &Result<u64, CmdError>, st: Status| matches!(r, Err(CmdError::Status(s)) if s.code() == st.code());
        // The queue's failure says more than "the queue failed while it was in flight".
        let err = |what, e: CmdError| match e {
            CmdError::Status(_) => Error::from_cmd(what, e),
            _ => self
                .queue
                .failed_error()
                .unwrap_or_else(|| Error::from_cmd(what, e)),
        };
        match (c, w) {
            (Ok(_), Ok(_)) => Ok(true),
            // Decided by the Compare's own status, whichever completion came first: the
            // Write's Failed Fused Command alone does not say why the Compare failed.
            (c, _) if is(&c, Status::COMPARE_FAILED) => Ok(false),
            (Err(e), _) => Err(err("Compare and Write (Compare)", e)),
            (Ok(_), Err(e)) => Err(err("Compare and Write (Write)", e)),
        }
    }

    /// Flush the volatile write cache.
    pub(crate) fn flush(&mut self) -> Result<(), Error> {
        let mut sqe = Sqe::new(io::FLUSH, 0);
        sqe.nsid = self.info.nsid.into();
        self.queue.execute("Flush", sqe, DataRef::None).map(|_| ())
    }

    /// Write zeroes over `len` bytes at `offset` (Write Zeroes, up to 65536 blocks each).
    pub(crate) fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<(), Error> {
        if self.limits.oncs & identify::ctrl::ONCS_WRITE_ZEROES == 0 {
            return Err(Error::Unsupported("Write Zeroes (ONCS bit 3 clear)"));
        }
        let (slba, nlb) = self.lba_range(offset, len)?;
        let nsid = self.info.nsid;
        let step = 1u64 << 16;
        let mut cmds = (0..nlb.div_ceil(step)).map(|i| {
            let first = i * step;
            (
                rw_sqe(
                    io::WRITE_ZEROES,
                    nsid,
                    slba + first,
                    step.min(nlb - first) as u32,
                ),
                0usize,
                0u32,
            )
        });
        self.queue
            .run_borrowed("Write Zeroes", Dir::None, &mut DataRef::None, &mut cmds)
            .map(|_| ())
    }

    /// Deallocate byte ranges `(offset, len)` (Dataset Management with AD, up to 256 ranges
    /// per command).
    pub(crate) fn trim(&mut self, ranges: &[(u64, u64)]) -> Result<(), Error> {
        if self.limits.oncs & identify::ctrl::ONCS_DSM == 0 {
            return Err(Error::Unsupported("Dataset Management (ONCS bit 2 clear)"));
        }
        // Each DSM range: context attributes (4), length in blocks (4), starting LBA (8).
        let mut lba_ranges = Vec::with_capacity(ranges.len());
        for &(off, len) in ranges {
            let (slba, mut nlb) = self.lba_range(off, len)?;
            let mut s = slba;
            while nlb > 0 {
                let n = nlb.min(u32::MAX as u64);
                lba_ranges.push((s, n as u32));
                s += n;
                nlb -= n;
            }
        }
        for group in lba_ranges.chunks(256) {
            let mut data = vec![0u8; group.len() * 16];
            for (d, &(slba, nlb)) in data.chunks_exact_mut(16).zip(group) {
                d[4..8].copy_from_slice(&nlb.to_le_bytes());
                d[8..16].copy_from_slice(&slba.to_le_bytes());
            }
            let mut sqe = Sqe::new(io::DSM, 0);
            sqe.nsid = self.info.nsid.into();
            sqe.cdw10 = (group.len() as u32 - 1).into();
            // CDW11 bit 2: Attribute - Deallocate.
            sqe.cdw11 = 4.into();
            self.queue
                .execute("Dataset Management", sqe, DataRef::Write(&data))?;
        }
        Ok(())
    }

    /// Whether the controller supports reservations (ONCS bit 5).
    fn check_reservations(&self) -> Result<(), Error> {
        if self.limits.oncs & identify::ctrl::ONCS_RESERVATIONS == 0 {
            return Err(Error::Unsupported("Reservations (ONCS bit 5 clear)"));
        }
        Ok(())
    }

    /// Reservation Register: register, unregister or replace this host's key (the host is
    /// the Host Identifier of [`ConnectOptions::hostid`]; every controller of the host shares
    /// the registration). A refusal is [`Error::Status`] with Reservation Conflict.
    pub(crate) fn reservation_register(&mut self, c: &resv::RegisterCmd) -> Result<(), Error> {
        self.check_reservations()?;
        let (cdw10, data) = c.encode();
        self.resv_command("Reservation Register", io::RESV_REGISTER, cdw10, &data)
    }

    /// Reservation Acquire: acquire, preempt, or preempt and abort.
    pub(crate) fn reservation_acquire(&mut self, c: &resv::AcquireCmd) -> Result<(), Error> {
        self.check_reservations()?;
        let (cdw10, data) = c.encode();
        self.resv_command("Reservation Acquire", io::RESV_ACQUIRE, cdw10, &data)
    }

    /// Reservation Release: release or clear.
    pub(crate) fn reservation_release(&mut self, c: &resv::ReleaseCmd) -> Result<(), Error> {
        self.check_reservations()?;
        let (cdw10, data) = c.encode();
        self.resv_command("Reservation Release", io::RESV_RELEASE, cdw10, &data)
    }

    /// Reservation Report (extended format: fabrics Host Identifiers are 128 bits), with
    /// room for 63 registrants.
    pub(crate) fn reservation_report(&mut self) -> Result<resv::Report, Error> {
        self.check_reservations()?;
        let mut buf = vec![0u8; 4096];
        let mut sqe = Sqe::new(io::RESV_REPORT, 0);
        sqe.nsid = self.info.nsid.into();
        sqe.cdw10 = (buf.len() as u32 / 4 - 1).into();
        sqe.cdw11 = resv::REPORT_EDS.into();
        self.queue
            .execute("Reservation Report", sqe, DataRef::Read(&mut buf))?;
        resv::Report::decode_ext(&buf)
            .map_err(|e| Error::Controller(format!("Reservation Report: {e}")))
    }

    fn resv_command(
        &mut self,
        what: &'static str,
        opcode: u8,
        cdw10: u32,
        data: &[u8],
    ) -> Result<(), Error> {
        let mut sqe = Sqe::new(opcode, 0);
        sqe.nsid = self.info.nsid.into();
        sqe.cdw10 = cdw10.into();
        self.queue
            .execute(what, sqe, DataRef::Write(data))
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::blocks_of;
    use zerocopy::FromZeros;

    #[test]
    fn hostnqn_is_uuid_form() {
        let id: [u8; 16] = core::array::from_fn(|i| i as u8 * 0x11);
        assert_eq!(
            hostnqn_for(&id),
            "nqn.2014-08.org.nvmexpress:uuid:00112233-4455-6677-8899-aabbccddeeff"
        );
        let o = ConnectOptions::tcp("127.0.0.1", 4420, "nqn.x");
        assert_eq!(o.hostnqn, hostnqn_for(&o.hostid));
    }

    fn ns_with(flbas: u8, nlbaf: u8, formats: &[(u16, u8)]) -> IdentifyNamespace {
        let mut id = IdentifyNamespace::new_zeroed();
        id.nsze = 1000.into();
        id.flbas = flbas;
        id.nlbaf = nlbaf;
        for (i, &(ms, ds)) in formats.iter().enumerate() {
            id.lbaf[i].ms = ms.into();
            id.lbaf[i].ds = ds;
        }
        id
    }

    #[test]
    fn block_size_comes_from_the_selected_lba_format() {
        // A brd-backed Linux target: one 512-byte format.
        let i = NsInfo::from_identify(1, &ns_with(0, 0, &[(0, 9)])).unwrap();
        assert_eq!((i.block_size, i.blocks, i.size()), (512, 1000, 512_000));
        // Format 1 of two (4 KiB, 8 bytes metadata).
        let i = NsInfo::from_identify(2, &ns_with(1, 1, &[(0, 9), (8, 12)])).unwrap();
        assert_eq!((i.block_size, i.metadata_size), (4096, 8));
        // FLBAS bits 6:5 extend the index past 16 formats.
        let mut f = vec![(0u16, 9u8); 18];
        f[17] = (0, 13);
        let i = NsInfo::from_identify(3, &ns_with(0x21, 17, &f)).unwrap();
        assert_eq!(i.block_size, 8192);
        // An index beyond NLBAF, or a nonsense size, is refused.
        assert!(NsInfo::from_identify(4, &ns_with(2, 1, &[(0, 9), (0, 12)])).is_err());
        assert!(NsInfo::from_identify(5, &ns_with(0, 0, &[(0, 3)])).is_err());
    }

    #[test]
    fn read_write_sqe_fields() {
        let s = rw_sqe(io::WRITE, 7, 0x1_2345_6789, 16);
        assert_eq!(s.opcode, io::WRITE);
        assert_eq!(s.nsid.get(), 7);
        assert_eq!(s.slba(), 0x1_2345_6789);
        assert_eq!(s.nlb(), 16);
    }

    #[test]
    fn async_submission_bounds() {
        let ns = NsInfo {
            nsid: 1,
            blocks: 100,
            block_size: 512,
            metadata_size: 0,
        };
        assert_eq!(blocks_of(&ns, 0, 4096).unwrap(), 8);
        assert_eq!(blocks_of(&ns, 92, 4096).unwrap(), 8);
        assert!(blocks_of(&ns, 93, 4096).is_err(), "past the end");
        assert!(blocks_of(&ns, 0, 4000).is_err(), "not whole blocks");
        assert!(blocks_of(&ns, 0, 0).is_err());
        assert!(blocks_of(&ns, u64::MAX, 512).is_err(), "overflow");
    }
}
