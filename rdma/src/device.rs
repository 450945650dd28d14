//! Devices and device contexts: listing, opening, capability queries, async events.

use std::mem;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rdma_sys::*;

use crate::error::{check_ret, last_errno, Error, Result};
use crate::sys::{c_array_to_string, c_str_to_string, set_nonblocking};

/// How a device moves RDMA traffic. It decides wire-level rules: iWARP (siw) needs
/// `REMOTE_WRITE` on RDMA READ sinks and allows one SGE per READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// InfiniBand or RoCE (rxe).
    Ib,
    /// iWARP (siw).
    Iwarp,
    /// Anything else libibverbs reports (usNIC, unknown).
    Other(i32),
}

impl Transport {
    fn from_raw(t: ibv_transport_type::Type) -> Self {
        match t {
            ibv_transport_type::IBV_TRANSPORT_IB => Transport::Ib,
            ibv_transport_type::IBV_TRANSPORT_IWARP => Transport::Iwarp,
            other => Transport::Other(other),
        }
    }
}

/// One entry of the verbs device list (`ibv_get_device_list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel device name, e.g. `rxe0`, `siw0`, `mlx5_0`.
    pub name: String,
    /// Node GUID in host order.
    pub guid: u64,
    /// Transport (IB/RoCE or iWARP).
    pub transport: Transport,
    /// sysfs path of the device (`/sys/class/infiniband/<name>`).
    pub ibdev_path: String,
}

/// Lists the RDMA devices of this machine.
///
/// A kernel built without RDMA makes libibverbs return NULL with `ENOSYS` instead of an empty
/// list; that case is reported as `Ok(vec![])`: "no devices" is an answer, not a failure.
/// Any other failure is `Error::Verbs`.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let list = DeviceList::get()?;
    Ok(list.iter().map(device_info).collect())
}

/// The device list from `ibv_get_device_list`, freed on Drop.
struct DeviceList {
    raw: *mut *mut ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self> {
        let mut n: libc::c_int = 0;
        // SAFETY: n is a valid out-pointer; the returned array is freed in Drop.
        let raw = unsafe { ibv_get_device_list(&mut n) };
        if raw.is_null() {
            let errno = last_errno();
            if errno == libc::ENOSYS || errno == libc::ENODEV || errno == libc::ENOENT {
                return Ok(DeviceList { raw, len: 0 });
            }
            return Err(Error::Verbs {
                call: "ibv_get_device_list",
                errno,
            });
        }
        Ok(DeviceList {
            raw,
            len: n.max(0) as usize,
        })
    }

    fn iter(&self) -> impl Iterator<Item = *mut ibv_device> + '_ {
        // SAFETY: raw holds len valid device pointers while the list is alive (not freed).
        (0..self.len).map(move |i| unsafe { *self.raw.add(i) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: the array came from ibv_get_device_list and is freed exactly once.
            unsafe { ibv_free_device_list(self.raw) };
        }
    }
}

fn device_info(dev: *mut ibv_device) -> DeviceInfo {
    // SAFETY: dev is a live entry of a device list (or the device of an open context); the
    // struct's name/path arrays are NUL-terminated by libibverbs.
    unsafe {
        DeviceInfo {
            name: c_str_to_string(ibv_get_device_name(dev)),
            guid: u64::from_be(ibv_get_device_guid(dev)),
            transport: Transport::from_raw((*dev).transport_type),
            ibdev_path: c_array_to_string(&(*dev).ibdev_path),
        }
    }
}

/// Who keeps an `ibv_context` open.
enum Keeper {
    /// Opened by us with `ibv_open_device`: closed on Drop.
    Opened,
    /// One of librdmacm's contexts. librdmacm opens each device once per process and may
    /// close it when the device disappears and nothing references it; holding the array from
    /// `rdma_get_devices` counts as a reference, so the context stays open while we hold it.
    Cm {
        /// Held only to keep librdmacm's reference; never read.
        _list: Arc<CmDeviceList>,
    },
}

pub(crate) struct CmDeviceList {
    raw: *mut *mut ibv_context,
}

// SAFETY: the array is only read (pointer values) and freed once, in Drop; librdmacm guards its
// reference counts with its own mutex.
unsafe impl Send for CmDeviceList {}
// SAFETY: as above; shared access only reads the immutable array.
unsafe impl Sync for CmDeviceList {}

impl CmDeviceList {
    /// `rdma_get_devices`; `Ok(None)` when the machine has no RDMA at all.
    pub(crate) fn get() -> Result<Option<Arc<Self>>> {
        let mut n: libc::c_int = 0;
        // SAFETY: n is a valid out-pointer; the array is freed in Drop.
        let raw = unsafe { rdma_get_devices(&mut n) };
        if raw.is_null() {
            let errno = last_errno();
            if matches!(
                errno,
                libc::ENODEV | libc::ENOSYS | libc::ENOENT | libc::EPERM
            ) {
                return Ok(None);
            }
            return Err(Error::Verbs {
                call: "rdma_get_devices",
                errno,
            });
        }
        Ok(Some(Arc::new(CmDeviceList { raw })))
    }

    pub(crate) fn contexts(&self) -> Vec<*mut ibv_context> {
        let mut v = Vec::new();
        let mut i = 0;
        loop {
            // SAFETY: the array is NULL-terminated and alive while self is.
            let c = unsafe { *self.raw.add(i) };
            if c.is_null() {
                return v;
            }
            v.push(c);
            i += 1;
        }
    }
}

impl Drop for CmDeviceList {
    fn drop(&mut self) {
        // SAFETY: the array came from rdma_get_devices and is released exactly once.
        unsafe { rdma_free_devices(self.raw) };
    }
}

/// An open device context (`ibv_context`): the parent of PDs, CQs and completion channels.
///
/// Obtained from [`Context::open`] (a private `ibv_open_device`), from [`cm_contexts`], or from
/// [`crate::CmId::context`]. Queue pairs created through rdma_cm must use objects of the
/// context rdma_cm uses for the connection, so the target and initiator take the latter two.
pub struct Context {
    pub(crate) raw: *mut ibv_context,
    keeper: Keeper,
    async_nonblocking: AtomicBool,
}

// SAFETY: libibverbs is thread-safe for object creation, queries and async-event reads on a
// context; the pointer is never freed while `self` exists.
unsafe impl Send for Context {}
// SAFETY: as above; all methods take &self and libibverbs serializes internally.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name())
            .finish()
    }
}

impl PartialEq for Context {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}
impl Eq for Context {}

impl Context {
    /// Opens the device named `name` with `ibv_open_device` (a context of our own).
    pub fn open(name: &str) -> Result<Arc<Context>> {
        let list = DeviceList::get()?;
        for dev in list.iter() {
            if device_info(dev).name == name {
                // SAFETY: dev is a live entry of the list; the context outlives the list
                // (libibverbs: "open all the devices you intend to use before freeing it").
                let raw = unsafe { ibv_open_device(dev) };
                if raw.is_null() {
                    return Err(crate::error::from_errno("ibv_open_device"));
                }
                return Ok(Arc::new(Context::new(raw, Keeper::Opened)));
            }
        }
        Err(Error::NoSuchDevice(name.to_owned()))
    }

    fn new(raw: *mut ibv_context, keeper: Keeper) -> Self {
        Context {
            raw,
            keeper,
            async_nonblocking: AtomicBool::new(false),
        }
    }

    pub(crate) fn from_cm(raw: *mut ibv_context, list: Arc<CmDeviceList>) -> Self {
        Context::new(raw, Keeper::Cm { _list: list })
    }

    /// Information about the device of this context.
    pub fn info(&self) -> DeviceInfo {
        // SAFETY: an open context always points at its device.
        device_info(unsafe { (*self.raw).device })
    }

    /// Kernel name of the device (`rxe0`, `siw0`, ...).
    pub fn name(&self) -> String {
        self.info().name
    }

    /// The device's transport.
    pub fn transport(&self) -> Transport {
        // SAFETY: an open context always points at its device.
        Transport::from_raw(unsafe { (*(*self.raw).device).transport_type })
    }

    /// `ibv_query_device`: the device limits a target or initiator sizes its queues by.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: ibv_device_attr is plain data; zero is a valid initial value.
        let mut a: ibv_device_attr = unsafe { mem::zeroed() };
        // SAFETY: raw is an open context, a is a valid out-pointer.
        check_ret("ibv_query_device", unsafe {
            ibv_query_device(self.raw, &mut a)
        })?;
        let nn = |v: libc::c_int| v.max(0) as u32;
        Ok(DeviceAttr {
            fw_ver: c_array_to_string(&a.fw_ver),
            node_guid: u64::from_be(a.node_guid),
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            max_mr_size: a.max_mr_size,
            max_qp: nn(a.max_qp),
            max_qp_wr: nn(a.max_qp_wr),
            max_sge: nn(a.max_sge),
            max_sge_rd: nn(a.max_sge_rd),
            max_cq: nn(a.max_cq),
            max_cqe: nn(a.max_cqe),
            max_mr: nn(a.max_mr),
            max_pd: nn(a.max_pd),
            max_qp_rd_atom: nn(a.max_qp_rd_atom),
            max_qp_init_rd_atom: nn(a.max_qp_init_rd_atom),
            max_srq: nn(a.max_srq),
            max_srq_wr: nn(a.max_srq_wr),
            max_srq_sge: nn(a.max_srq_sge),
            phys_port_cnt: a.phys_port_cnt,
            max_mw: nn(a.max_mw),
            mw_type_2b: a.device_cap_flags & ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0
                != 0,
        })
    }

    /// `ibv_query_port` for `port` (ports are numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        // SAFETY: ibv_port_attr is plain data; zero is a valid initial value.
        let mut a: ibv_port_attr = unsafe { mem::zeroed() };
        // SAFETY: raw is an open context, a is a valid out-pointer of the size the library
        // expects (the rdma-sys wrapper passes sizeof to the extended query).
        check_ret("ibv_query_port", unsafe {
            ___ibv_query_port(self.raw, port, &mut a)
        })?;
        Ok(PortAttr {
            state: PortState::from_raw(a.state),
            max_mtu: mtu_bytes(a.max_mtu),
            active_mtu: mtu_bytes(a.active_mtu),
            gid_tbl_len: a.gid_tbl_len.max(0) as u32,
            max_msg_sz: a.max_msg_sz,
            lid: a.lid,
            link_layer: LinkLayer::from_raw(a.link_layer),
        })
    }

    /// `ibv_query_gid`: the 16-byte GID at `index` of `port`.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        let idx = libc::c_int::try_from(index)
            .map_err(|_| Error::InvalidArgument(format!("GID index {index} too large")))?;
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: raw is an open context, gid is a valid out-pointer.
        let r = unsafe { ibv_query_gid(self.raw, port, idx, &mut gid) };
        if r != 0 {
            return Err(crate::error::from_errno("ibv_query_gid"));
        }
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(unsafe { gid.raw })
    }

    /// The network device behind GID `index` of `port` (RoCE and iWARP), read from sysfs;
    /// `None` when the kernel does not expose one (native InfiniBand, or an unused GID).
    pub fn netdev(&self, port: u8, index: u32) -> Option<String> {
        let info = self.info();
        let p = format!("{}/ports/{port}/gid_attrs/ndevs/{index}", info.ibdev_path);
        let s = std::fs::read_to_string(p).ok()?;
        let s = s.trim();
        (!s.is_empty()).then(|| s.to_owned())
    }

    /// The descriptor that becomes readable when an async event is pending (for epoll).
    pub fn async_fd(&self) -> std::os::fd::RawFd {
        // SAFETY: raw is an open context.
        unsafe { (*self.raw).async_fd }
    }

    /// Reads one pending async event without blocking (`Ok(None)` when none is pending).
    ///
    /// The event is acknowledged before this returns, so destroying the QP/CQ/SRQ it names
    /// can never wait for it. Userspace must forward [`AsyncEventType::CommEst`] for a QP
    /// to its `CmId` with [`crate::CmId::notify_established`].
    pub fn try_get_async_event(&self) -> Result<Option<AsyncEvent>> {
        if !self.async_nonblocking.load(Ordering::Relaxed) {
            set_nonblocking("fcntl(async_fd)", self.async_fd())?;
            self.async_nonblocking.store(true, Ordering::Relaxed);
        }
        // SAFETY: ibv_async_event is plain data (a union of pointers/ints and an enum whose
        // zero value is IBV_EVENT_CQ_ERR); it is fully written on success.
        let mut ev: ibv_async_event = unsafe { mem::zeroed() };
        // SAFETY: raw is an open context, ev a valid out-pointer.
        let r = unsafe { ibv_get_async_event(self.raw, &mut ev) };
        if r != 0 {
            let errno = last_errno();
            if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                return Ok(None);
            }
            return Err(Error::Verbs {
                call: "ibv_get_async_event",
                errno,
            });
        }
        // Read the enum as its raw integer: a newer library may report a value that the
        // bindings' Rust enum cannot hold.
        // SAFETY: event_type is a C enum, i.e. a 4-byte integer, initialized by the call.
        let raw_type = unsafe { std::ptr::addr_of!(ev.event_type).cast::<u32>().read() };
        let kind = AsyncEventType::from_raw(raw_type);
        // SAFETY: the union member read matches the event type (verbs.h documents which
        // element each event carries); the QP/SRQ cannot be destroyed before the ack below.
        let element = unsafe {
            match kind.element() {
                Element::Qp => AsyncElement::QpNum((*ev.element.qp).qp_num),
                Element::Cq => AsyncElement::Cq,
                Element::Srq => AsyncElement::Srq,
                Element::Port => AsyncElement::Port(ev.element.port_num as u8),
                Element::Device => AsyncElement::Device,
            }
        };
        // SAFETY: ev was returned by ibv_get_async_event and is acknowledged exactly once.
        unsafe { ibv_ack_async_event(&mut ev) };
        Ok(Some(AsyncEvent { kind, element }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Keeper::Opened = self.keeper {
            // SAFETY: we opened this context; children hold Arc<Context>, so none is left.
            let r = unsafe { ibv_close_device(self.raw) };
            if r != 0 {
                tracing::warn!(errno = last_errno(), "ibv_close_device failed");
            }
        }
        // A Keeper::Cm context is librdmacm's; dropping our reference to the device array
        // (after this) lets librdmacm close it if the device is gone.
    }
}

/// The contexts librdmacm uses for connections, one per RDMA device (empty without RDMA).
///
/// A PD or CQ for a QP that rdma_cm connects must be created on one of these (the one whose
/// [`Context`] equals the `CmId`'s, see [`crate::CmId::context`]).
pub fn cm_contexts() -> Result<Vec<Arc<Context>>> {
    let Some(list) = CmDeviceList::get()? else {
        return Ok(Vec::new());
    };
    Ok(list
        .contexts()
        .into_iter()
        .map(|raw| Arc::new(Context::from_cm(raw, list.clone())))
        .collect())
}

/// The vendor id Soft-RoCE (rxe) reports: it has no PCI vendor (`RXE_VENDOR_ID` in Linux's
/// `drivers/infiniband/sw/rxe/rxe_param.h`).
pub const RXE_VENDOR_ID: u32 = 0x00FF_FFFF;

/// Device limits from `ibv_query_device` (negative values reported by a provider read as 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID, host order.
    pub node_guid: u64,
    /// PCI vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Largest registrable memory region, bytes.
    pub max_mr_size: u64,
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum work requests per send or receive queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per send or receive WR.
    pub max_sge: u32,
    /// Maximum SGEs per RDMA READ WR (1 on siw).
    pub max_sge_rd: u32,
    /// Maximum number of CQs.
    pub max_cq: u32,
    /// Maximum entries per CQ.
    pub max_cqe: u32,
    /// Maximum number of MRs.
    pub max_mr: u32,
    /// Maximum number of PDs.
    pub max_pd: u32,
    /// Maximum outstanding incoming RDMA READs per QP (responder resources, IRD).
    pub max_qp_rd_atom: u32,
    /// Maximum outstanding outgoing RDMA READs per QP (initiator depth, ORD).
    pub max_qp_init_rd_atom: u32,
    /// Maximum number of SRQs.
    pub max_srq: u32,
    /// Maximum work requests per SRQ.
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ WR.
    pub max_srq_sge: u32,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Maximum number of memory windows (0: none, as on siw).
    pub max_mw: u32,
    /// Type 2B memory windows (bound by a work request, invalidated by the peer or locally).
    pub mw_type_2b: bool,
}

impl DeviceAttr {
    /// Whether the device is Soft-RoCE (rxe), whose quirks some callers must know: it reports
    /// a remote invalidation in a bit of its own
    /// ([`WorkCompletion::rxe_invalidated_rkey`](crate::WorkCompletion::rxe_invalidated_rkey)),
    /// and in Linux 6.1 it replays memory window binds when it retransmits (`rxe_req.c`:
    /// `req_retry` rewinds to the oldest unacknowledged work request and the requester runs
    /// every local operation after it again, so a bind of a window that is already bound fails
    /// with `MW_BIND_ERR`).
    pub fn is_rxe(&self) -> bool {
        self.vendor_id == RXE_VENDOR_ID
    }
}

/// Logical port state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// Reserved value 0.
    Nop,
    /// Link down.
    Down,
    /// Initializing.
    Init,
    /// Armed.
    Armed,
    /// Active: usable.
    Active,
    /// Active, deferring.
    ActiveDefer,
    /// A value this crate does not know.
    Other(u32),
}

impl PortState {
    fn from_raw(s: ibv_port_state::Type) -> Self {
        use ibv_port_state::*;
        match s {
            IBV_PORT_NOP => PortState::Nop,
            IBV_PORT_DOWN => PortState::Down,
            IBV_PORT_INIT => PortState::Init,
            IBV_PORT_ARMED => PortState::Armed,
            IBV_PORT_ACTIVE => PortState::Active,
            IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            o => PortState::Other(o),
        }
    }
}

/// The port's link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// Not reported (iWARP devices report this).
    Unspecified,
    /// Native InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE, and iWARP on some providers).
    Ethernet,
    /// A value this crate does not know.
    Other(u8),
}

impl LinkLayer {
    fn from_raw(l: u8) -> Self {
        match l {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            o => LinkLayer::Other(o),
        }
    }
}

fn mtu_bytes(m: ibv_mtu::Type) -> u32 {
    match m {
        1..=5 => 128 << m,
        _ => 0,
    }
}

/// Port attributes from `ibv_query_port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports, bytes (0 if unknown).
    pub max_mtu: u32,
    /// Active MTU, bytes (rxe: 1024 by default).
    pub active_mtu: u32,
    /// Length of the GID table.
    pub gid_tbl_len: u32,
    /// Largest message size.
    pub max_msg_sz: u32,
    /// Base LID (InfiniBand only).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
}

/// An asynchronous event (`ibv_get_async_event`), copied out and acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventType,
    /// The object it happened to.
    pub element: AsyncElement,
}

/// The object an async event names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncElement {
    /// A QP, by number ([`crate::Qp::qp_num`]).
    QpNum(u32),
    /// A CQ.
    Cq,
    /// An SRQ.
    Srq,
    /// A port number.
    Port(u8),
    /// The whole device.
    Device,
}

enum Element {
    Qp,
    Cq,
    Srq,
    Port,
    Device,
}

/// Async event types (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEventType {
    /// CQ overrun.
    CqErr,
    /// QP fatal error.
    QpFatal,
    /// Invalid request on a QP.
    QpReqErr,
    /// Access violation on a QP.
    QpAccessErr,
    /// First packet received on a QP before rdma_cm saw the connection established.
    CommEst,
    /// Send queue drained.
    SqDrained,
    /// Path migrated.
    PathMig,
    /// Path migration failed.
    PathMigErr,
    /// Device fatal error.
    DeviceFatal,
    /// Port became active.
    PortActive,
    /// Port went down.
    PortErr,
    /// LID changed.
    LidChange,
    /// P_Key table changed.
    PkeyChange,
    /// Subnet manager changed.
    SmChange,
    /// SRQ error.
    SrqErr,
    /// SRQ limit reached.
    SrqLimitReached,
    /// Last WQE reached on a QP attached to an SRQ.
    QpLastWqeReached,
    /// Client re-register request.
    ClientReregister,
    /// GID table changed.
    GidChange,
    /// WQ fatal error.
    WqFatal,
    /// A value this crate does not know.
    Other(u32),
}

impl AsyncEventType {
    fn from_raw(t: u32) -> Self {
        use ibv_event_type::*;
        const fn v(e: ibv_event_type) -> u32 {
            e as u32
        }
        const CQ_ERR: u32 = v(IBV_EVENT_CQ_ERR);
        const QP_FATAL: u32 = v(IBV_EVENT_QP_FATAL);
        const QP_REQ_ERR: u32 = v(IBV_EVENT_QP_REQ_ERR);
        const QP_ACCESS_ERR: u32 = v(IBV_EVENT_QP_ACCESS_ERR);
        const COMM_EST: u32 = v(IBV_EVENT_COMM_EST);
        const SQ_DRAINED: u32 = v(IBV_EVENT_SQ_DRAINED);
        const PATH_MIG: u32 = v(IBV_EVENT_PATH_MIG);
        const PATH_MIG_ERR: u32 = v(IBV_EVENT_PATH_MIG_ERR);
        const DEVICE_FATAL: u32 = v(IBV_EVENT_DEVICE_FATAL);
        const PORT_ACTIVE: u32 = v(IBV_EVENT_PORT_ACTIVE);
        const PORT_ERR: u32 = v(IBV_EVENT_PORT_ERR);
        const LID_CHANGE: u32 = v(IBV_EVENT_LID_CHANGE);
        const PKEY_CHANGE: u32 = v(IBV_EVENT_PKEY_CHANGE);
        const SM_CHANGE: u32 = v(IBV_EVENT_SM_CHANGE);
        const SRQ_ERR: u32 = v(IBV_EVENT_SRQ_ERR);
        const SRQ_LIMIT_REACHED: u32 = v(IBV_EVENT_SRQ_LIMIT_REACHED);
        const QP_LAST_WQE_REACHED: u32 = v(IBV_EVENT_QP_LAST_WQE_REACHED);
        const CLIENT_REREGISTER: u32 = v(IBV_EVENT_CLIENT_REREGISTER);
        const GID_CHANGE: u32 = v(IBV_EVENT_GID_CHANGE);
        const WQ_FATAL: u32 = v(IBV_EVENT_WQ_FATAL);
        match t {
            CQ_ERR => Self::CqErr,
            QP_FATAL => Self::QpFatal,
            QP_REQ_ERR => Self::QpReqErr,
            QP_ACCESS_ERR => Self::QpAccessErr,
            COMM_EST => Self::CommEst,
            SQ_DRAINED => Self::SqDrained,
            PATH_MIG => Self::PathMig,
            PATH_MIG_ERR => Self::PathMigErr,
            DEVICE_FATAL => Self::DeviceFatal,
            PORT_ACTIVE => Self::PortActive,
            PORT_ERR => Self::PortErr,
            LID_CHANGE => Self::LidChange,
            PKEY_CHANGE => Self::PkeyChange,
            SM_CHANGE => Self::SmChange,
            SRQ_ERR => Self::SrqErr,
            SRQ_LIMIT_REACHED => Self::SrqLimitReached,
            QP_LAST_WQE_REACHED => Self::QpLastWqeReached,
            CLIENT_REREGISTER => Self::ClientReregister,
            GID_CHANGE => Self::GidChange,
            WQ_FATAL => Self::WqFatal,
            o => Self::Other(o),
        }
    }

    fn element(self) -> Element {
        match self {
            Self::CqErr => Element::Cq,
            Self::QpFatal
            | Self::QpReqErr
            | Self::QpAccessErr
            | Self::CommEst
            | Self::SqDrained
            | Self::PathMig
            | Self::PathMigErr
            | Self::QpLastWqeReached => Element::Qp,
            Self::SrqErr | Self::SrqLimitReached => Element::Srq,
            Self::PortActive
            | Self::PortErr
            | Self::LidChange
            | Self::PkeyChange
            | Self::SmChange
            | Self::ClientReregister
            | Self::GidChange => Element::Port,
            // WQ events carry a WQ this crate never creates; report the device.
            Self::DeviceFatal | Self::WqFatal | Self::Other(_) => Element::Device,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_enum_to_bytes() {
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_256), 256);
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_1024), 1024);
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_4096), 4096);
        assert_eq!(mtu_bytes(0), 0);
        assert_eq!(mtu_bytes(9), 0);
    }

    #[test]
    fn transport_mapping() {
        assert_eq!(
            Transport::from_raw(ibv_transport_type::IBV_TRANSPORT_IB),
            Transport::Ib
        );
        assert_eq!(
            Transport::from_raw(ibv_transport_type::IBV_TRANSPORT_IWARP),
            Transport::Iwarp
        );
        assert_eq!(Transport::from_raw(-1), Transport::Other(-1));
    }
}
