//! rdma_cm: event channels, connection identifiers and connection events.
//!
//! # Locking and event acknowledgement
//! librdmacm keeps per-id state (route, QP pointer, negotiated depths) that its calls and its
//! event processing both touch, and `rdma_destroy_id` blocks until every event it delivered for
//! the id has been acknowledged. This module therefore
//! - serializes every rdma_cm call on the ids of one [`EventChannel`] (event retrieval
//!   included) with one mutex per channel. These are slow-path calls, never on the I/O path;
//! - copies each event (type, status, private data, depths) into an owned [`CmEvent`] and
//!   acknowledges it before returning it. No event is ever held unacknowledged, so dropping a
//!   [`CmId`] cannot wait on an event, and a `CmEvent` can be kept as long as needed.

use std::fmt;
use std::mem;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rdma_sys::*;

use crate::device::{CmDeviceList, Context};
use crate::error::{check_minus1, last_errno, Error, Result};
use crate::sys::{deadline, from_sockaddr, set_nonblocking, to_sockaddr, wait_readable};

pub(crate) struct ChannelInner {
    raw: *mut rdma_event_channel,
    lock: Mutex<()>,
}

// SAFETY: the channel is a descriptor plus librdmacm bookkeeping; every call that touches it or
// the ids created on it runs under `lock`.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl ChannelInner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        // The mutex guards no data, only call serialization: a poisoned lock is still usable.
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: created in EventChannel::new; every id on it holds an Arc<ChannelInner>, so
        // all ids are destroyed already.
        unsafe { rdma_destroy_event_channel(self.raw) };
    }
}

/// An rdma_cm event channel (`rdma_event_channel`). Its descriptor is non-blocking: watch
/// [`fd`](Self::fd) with epoll/poll and call [`try_get_event`](Self::try_get_event), or block in
/// [`get_event`](Self::get_event).
pub struct EventChannel {
    inner: Arc<ChannelInner>,
}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// The channel's descriptor, borrowed for as long as the channel lives (to poll or epoll it).
impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to the channel, which stays open while `self` is
        // borrowed; the caller cannot close it through a BorrowedFd.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }
}

impl EventChannel {
    /// `rdma_create_event_channel`.
    ///
    /// On a machine without kernel RDMA support (no `rdma_ucm`, no device) librdmacm returns
    /// NULL with ENODEV (or ENOENT/ENOSYS/EPERM from its ABI probe): that is reported as
    /// [`Error::NoRdma`], with a message saying what to load or configure.
    pub fn new() -> Result<EventChannel> {
        // SAFETY: no preconditions; the result is checked.
        let raw = unsafe { rdma_create_event_channel() };
        if raw.is_null() {
            let errno = last_errno();
            if matches!(
                errno,
                libc::ENODEV | libc::ENOENT | libc::ENOSYS | libc::ENXIO | libc::EPERM
            ) {
                return Err(Error::NoRdma {
                    call: "rdma_create_event_channel",
                    errno,
                });
            }
            return Err(Error::Verbs {
                call: "rdma_create_event_channel",
                errno,
            });
        }
        let inner = Arc::new(ChannelInner {
            raw,
            lock: Mutex::new(()),
        });
        // SAFETY: raw is a live channel.
        set_nonblocking("fcntl(rdma_cm channel)", unsafe { (*raw).fd })?;
        Ok(EventChannel { inner })
    }

    /// The channel's descriptor (readable when an event is pending).
    pub fn fd(&self) -> RawFd {
        // SAFETY: raw is a live channel; fd is immutable.
        unsafe { (*self.inner.raw).fd }
    }

    /// `rdma_create_id` for a reliable-connected (RC, `RDMA_PS_TCP`) id on this channel.
    ///
    /// `tag` is reported with every event of the id ([`CmEvent::tag`]); ids born from a
    /// CONNECT_REQUEST inherit the listener's tag until [`CmId::set_tag`].
    pub fn create_id(&self, tag: u64) -> Result<CmId> {
        let _g = self.inner.lock();
        let mut id: *mut rdma_cm_id = ptr::null_mut();
        // SAFETY: the channel is live; id is a valid out-pointer; the context pointer is an
        // integer tag that librdmacm stores and never dereferences.
        let r = unsafe {
            rdma_create_id(
                self.inner.raw,
                &mut id,
                tag as usize as *mut libc::c_void,
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        check_minus1("rdma_create_id", r)?;
        Ok(CmId {
            inner: Arc::new(CmIdInner {
                raw: id,
                channel: self.inner.clone(),
            }),
        })
    }

    /// Takes one pending event without blocking (`Ok(None)` when none is pending).
    pub fn try_get_event(&self) -> Result<Option<CmEvent>> {
        let _g = self.inner.lock();
        let mut ev: *mut rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is live; ev is a valid out-pointer.
        let r = unsafe { rdma_get_cm_event(self.inner.raw, &mut ev) };
        if r != 0 {
            let errno = last_errno();
            if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                return Ok(None);
            }
            return Err(Error::Verbs {
                call: "rdma_get_cm_event",
                errno,
            });
        }
        // SAFETY: ev is a valid event until acknowledged below; we only read it.
        let out = unsafe { self.copy_event(ev) };
        // SAFETY: ev came from rdma_get_cm_event and is acknowledged exactly once; nothing
        // refers to its memory after this.
        let r = unsafe { rdma_ack_cm_event(ev) };
        if r != 0 {
            tracing::warn!(errno = last_errno(), "rdma_ack_cm_event failed");
        }
        Ok(Some(out))
    }

    /// # Safety
    /// `ev` is a live, unacknowledged event of this channel.
    unsafe fn copy_event(&self, ev: *mut rdma_cm_event) -> CmEvent {
        // SAFETY: per the contract, ev and its id are valid; param.conn is the member
        // librdmacm fills for RC ids (zeroed for events without parameters).
        unsafe {
            let e = &*ev;
            let kind = CmEventType::from_raw(e.event);
            let conn = &e.param.conn;
            let mut pdata = [0u8; 255];
            let mut pdata_len = 0u8;
            if !conn.private_data.is_null() && conn.private_data_len > 0 {
                let n = conn.private_data_len as usize;
                ptr::copy_nonoverlapping(conn.private_data.cast::<u8>(), pdata.as_mut_ptr(), n);
                pdata_len = conn.private_data_len;
            }
            let tag = if e.id.is_null() {
                0
            } else {
                (*e.id).context as usize as u64
            };
            let new_id = (kind == CmEventType::ConnectRequest && !e.id.is_null()).then(|| CmId {
                inner: Arc::new(CmIdInner {
                    raw: e.id,
                    channel: self.inner.clone(),
                }),
            });
            CmEvent {
                kind,
                status: e.status,
                tag,
                initiator_depth: conn.initiator_depth,
                responder_resources: conn.responder_resources,
                peer_qp_num: conn.qp_num & 0x00ff_ffff,
                pdata,
                pdata_len,
                new_id,
            }
        }
    }

    /// Waits up to `timeout` (`None`: forever) for an event; `Ok(None)` on timeout.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        let dl = deadline(timeout);
        loop {
            if let Some(ev) = self.try_get_event()? {
                return Ok(Some(ev));
            }
            if !wait_readable(self.fd(), dl)? {
                return Ok(None);
            }
        }
    }
}

pub(crate) struct CmIdInner {
    pub(crate) raw: *mut rdma_cm_id,
    pub(crate) channel: Arc<ChannelInner>,
}

// SAFETY: every librdmacm call on the id runs under the channel lock; destroyed once, in Drop.
unsafe impl Send for CmIdInner {}
// SAFETY: as above.
unsafe impl Sync for CmIdInner {}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        let _g = self.channel.lock();
        // SAFETY: a QP on the id holds an Arc<CmIdInner>, so it is destroyed already; events
        // are acknowledged as they are read, so this does not block.
        let r = unsafe { rdma_destroy_id(self.raw) };
        if r != 0 {
            tracing::warn!(errno = last_errno(), "rdma_destroy_id failed");
        }
    }
}

/// An rdma_cm identifier (`rdma_cm_id`), the handle of one listener or one connection.
///
/// All methods take `&self` and are serialized with the other ids of the same channel; the id
/// is destroyed when the `CmId` and any [`crate::Qp`] created on it are gone.
pub struct CmId {
    pub(crate) inner: Arc<CmIdInner>,
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("tag", &self.tag())
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

fn timeout_ms(t: Duration) -> libc::c_int {
    t.as_millis().clamp(1, i32::MAX as u128) as libc::c_int
}

impl CmId {
    fn raw(&self) -> *mut rdma_cm_id {
        self.inner.raw
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.inner.channel.lock()
    }

    /// The tag reported with this id's events.
    pub fn tag(&self) -> u64 {
        let _g = self.lock();
        // SAFETY: raw is a live id; context is written only under this lock.
        unsafe { (*self.raw()).context as usize as u64 }
    }

    /// Changes the tag reported with this id's later events.
    pub fn set_tag(&self, tag: u64) {
        let _g = self.lock();
        // SAFETY: raw is a live id; librdmacm reads context only while processing events,
        // which happens under this lock.
        unsafe { (*self.raw()).context = tag as usize as *mut libc::c_void };
    }

    /// `rdma_bind_addr`: binds to a local address (port 0 picks one). Binding to a specific
    /// address also binds the id to that address's RDMA device.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut ss = to_sockaddr(&addr);
        let _g = self.lock();
        // SAFETY: raw is a live id; ss is a valid sockaddr for the duration of the call.
        let r = unsafe { rdma_bind_addr(self.raw(), &mut ss as *mut _ as *mut libc::sockaddr) };
        check_minus1("rdma_bind_addr", r)
    }

    /// `rdma_listen` with the given backlog.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        let _g = self.lock();
        // SAFETY: raw is a live, bound id.
        check_minus1("rdma_listen", unsafe { rdma_listen(self.raw(), backlog) })
    }

    /// `rdma_resolve_addr`: starts resolving `dst` (and binds to `src` if given); completes with
    /// an ADDR_RESOLVED or ADDR_ERROR event.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let mut src_ss = src.as_ref().map(to_sockaddr);
        let mut dst_ss = to_sockaddr(&dst);
        let src_p = src_ss.as_mut().map_or(ptr::null_mut(), |s| {
            s as *mut libc::sockaddr_storage as *mut libc::sockaddr
        });
        let _g = self.lock();
        // SAFETY: raw is a live id; both addresses are valid for the duration of the call.
        let r = unsafe {
            rdma_resolve_addr(
                self.raw(),
                src_p,
                &mut dst_ss as *mut _ as *mut libc::sockaddr,
                timeout_ms(timeout),
            )
        };
        check_minus1("rdma_resolve_addr", r)
    }

    /// `rdma_resolve_route`; completes with ROUTE_RESOLVED or ROUTE_ERROR.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let _g = self.lock();
        // SAFETY: raw is a live id with a resolved address.
        check_minus1("rdma_resolve_route", unsafe {
            rdma_resolve_route(self.raw(), timeout_ms(timeout))
        })
    }

    /// `rdma_connect` with `param`; completes with ESTABLISHED (whose private data is the
    /// peer's reply), REJECTED, UNREACHABLE or CONNECT_ERROR. With a [`crate::Qp`] on the id,
    /// rdma_cm moves it to RTR/RTS.
    pub fn connect(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut raw = param.to_raw()?;
        let _g = self.lock();
        // SAFETY: raw is a live id; the conn param and its private data outlive the call
        // (librdmacm copies the private data).
        check_minus1("rdma_connect", unsafe {
            rdma_connect(self.raw(), &mut raw)
        })
    }

    /// `rdma_accept` for an id from a CONNECT_REQUEST, replying with `param` (private data,
    /// `initiator_depth` (ORD) and `responder_resources` (IRD)). rdma_cm moves the id's QP to
    /// RTR/RTS; ESTABLISHED follows.
    pub fn accept(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut raw = param.to_raw()?;
        let _g = self.lock();
        // SAFETY: as in connect.
        check_minus1("rdma_accept", unsafe { rdma_accept(self.raw(), &mut raw) })
    }

    /// `rdma_reject` with consumer private data (at most 255 bytes; IB carries up to 148).
    ///
    /// The peer sees REJECTED with this data: on IB/RoCE with status 28 (consumer defined) and
    /// the data padded to 148 bytes, on iWARP with a negative errno status (siw: `-ECONNRESET`)
    /// and the data as sent.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len()).map_err(|_| {
            Error::InvalidArgument(format!(
                "reject private data is {} bytes; at most 255",
                private_data.len()
            ))
        })?;
        let p = if len == 0 {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        let _g = self.lock();
        // SAFETY: raw is a live id; p/len describe a valid buffer (librdmacm copies it).
        check_minus1("rdma_reject", unsafe { rdma_reject(self.raw(), p, len) })
    }

    /// `rdma_disconnect`: both sides then get DISCONNECTED. rdma_cm also moves the QP towards
    /// the error state, flushing posted work requests.
    pub fn disconnect(&self) -> Result<()> {
        let _g = self.lock();
        // SAFETY: raw is a live id.
        check_minus1("rdma_disconnect", unsafe { rdma_disconnect(self.raw()) })
    }

    /// `rdma_notify(id, IBV_EVENT_COMM_EST)`: tells rdma_cm that the QP received data before
    /// ESTABLISHED arrived (forward the COMM_EST async event here, as nvmet does).
    pub fn notify_established(&self) -> Result<()> {
        let _g = self.lock();
        // SAFETY: raw is a live id.
        check_minus1("rdma_notify", unsafe {
            rdma_notify(self.raw(), ibv_event_type::IBV_EVENT_COMM_EST)
        })
    }

    fn route_addr(&self, src: bool) -> Option<SocketAddr> {
        let _g = self.lock();
        // SAFETY: raw is a live id; the route is updated by librdmacm only under this lock
        // (its calls and its event processing); sockaddr_storage is plain data.
        let ss = unsafe {
            let a = &(*self.raw()).route.addr;
            if src {
                a.src_addr_union.src_storage
            } else {
                a.dst_addr_union.dst_storage
            }
        };
        from_sockaddr(&ss)
    }

    /// The local address (after bind, resolve or connect request), if IPv4/IPv6.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.route_addr(true)
    }

    /// The peer's address (after resolve or connect request), if IPv4/IPv6.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.route_addr(false)
    }

    fn verbs(&self) -> *mut ibv_context {
        let _g = self.lock();
        // SAFETY: raw is a live id; verbs is set by librdmacm under this lock.
        unsafe { (*self.raw()).verbs }
    }

    /// The device context the id is bound to, `Ok(None)` while it is bound to none (before
    /// address resolution, or a listener on a wildcard address).
    ///
    /// Creating one takes a reference on librdmacm's device list (a sysfs scan); a target
    /// should build its per-device PD/CQ set once and find it with [`CmId::is_on`].
    pub fn context(&self) -> Result<Option<Arc<Context>>> {
        let verbs = self.verbs();
        if verbs.is_null() {
            return Ok(None);
        }
        let Some(list) = CmDeviceList::get()? else {
            return Err(Error::Verbs {
                call: "rdma_get_devices",
                errno: libc::ENODEV,
            });
        };
        if list.contexts().contains(&verbs) {
            Ok(Some(Arc::new(Context::from_cm(verbs, list))))
        } else {
            // The device disappeared between the id's binding and now.
            Err(Error::Verbs {
                call: "rdma_get_devices",
                errno: libc::ENODEV,
            })
        }
    }

    /// Whether the id is bound to the device of `ctx` (cheap: compares handles).
    pub fn is_on(&self, ctx: &Context) -> bool {
        let v = self.verbs();
        !v.is_null() && v == ctx.raw
    }
}

/// Connection parameters for [`CmId::connect`] and [`CmId::accept`] (`rdma_conn_param`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnParam<'a> {
    /// Consumer private data (at most 255 bytes; IB REQ carries 56 through rdma_cm, REP 196).
    pub private_data: &'a [u8],
    /// Incoming RDMA READs this side accepts at once (IRD).
    pub responder_resources: u8,
    /// Outgoing RDMA READs this side issues at once (ORD); must not exceed the peer's IRD.
    pub initiator_depth: u8,
    /// Hardware flow control (IB); NVMe/RDMA hosts set it.
    pub flow_control: bool,
    /// Transport retries, 0..=7 (connect only).
    pub retry_count: u8,
    /// RNR retries, 0..=7 (7 = retry forever on IB).
    pub rnr_retry_count: u8,
}

impl ConnParam<'_> {
    fn to_raw(self) -> Result<rdma_conn_param> {
        let len = u8::try_from(self.private_data.len()).map_err(|_| {
            Error::InvalidArgument(format!(
                "private data is {} bytes; at most 255",
                self.private_data.len()
            ))
        })?;
        if self.retry_count > 7 || self.rnr_retry_count > 7 {
            return Err(Error::InvalidArgument(format!(
                "retry_count {} / rnr_retry_count {} must be at most 7",
                self.retry_count, self.rnr_retry_count
            )));
        }
        // SAFETY: rdma_conn_param is plain data; zero is valid.
        let mut p: rdma_conn_param = unsafe { mem::zeroed() };
        p.private_data = if len == 0 {
            ptr::null()
        } else {
            self.private_data.as_ptr().cast()
        };
        p.private_data_len = len;
        p.responder_resources = self.responder_resources;
        p.initiator_depth = self.initiator_depth;
        p.flow_control = self.flow_control as u8;
        p.retry_count = self.retry_count;
        p.rnr_retry_count = self.rnr_retry_count;
        Ok(p)
    }
}

/// rdma_cm event types (`enum rdma_cm_event_type`). `Display` is librdmacm's `rdma_event_str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmEventType {
    /// Address resolved.
    AddrResolved,
    /// Address resolution failed.
    AddrError,
    /// Route resolved.
    RouteResolved,
    /// Route resolution failed.
    RouteError,
    /// A peer asks to connect (listener); the event carries the new id.
    ConnectRequest,
    /// Reply received (only for ids without a QP).
    ConnectResponse,
    /// Connection failed.
    ConnectError,
    /// Peer unreachable.
    Unreachable,
    /// Peer rejected; the event carries its private data.
    Rejected,
    /// Connection established; on the active side it carries the reply private data.
    Established,
    /// Connection closed.
    Disconnected,
    /// The device went away.
    DeviceRemoval,
    /// Multicast join done.
    MulticastJoin,
    /// Multicast error.
    MulticastError,
    /// The address moved to another device.
    AddrChange,
    /// Time-wait done; the QP may be reused.
    TimewaitExit,
    /// A value this crate does not know.
    Other(u32),
}

impl CmEventType {
    fn from_raw(t: rdma_cm_event_type::Type) -> Self {
        use rdma_cm_event_type::*;
        match t {
            RDMA_CM_EVENT_ADDR_RESOLVED => Self::AddrResolved,
            RDMA_CM_EVENT_ADDR_ERROR => Self::AddrError,
            RDMA_CM_EVENT_ROUTE_RESOLVED => Self::RouteResolved,
            RDMA_CM_EVENT_ROUTE_ERROR => Self::RouteError,
            RDMA_CM_EVENT_CONNECT_REQUEST => Self::ConnectRequest,
            RDMA_CM_EVENT_CONNECT_RESPONSE => Self::ConnectResponse,
            RDMA_CM_EVENT_CONNECT_ERROR => Self::ConnectError,
            RDMA_CM_EVENT_UNREACHABLE => Self::Unreachable,
            RDMA_CM_EVENT_REJECTED => Self::Rejected,
            RDMA_CM_EVENT_ESTABLISHED => Self::Established,
            RDMA_CM_EVENT_DISCONNECTED => Self::Disconnected,
            RDMA_CM_EVENT_DEVICE_REMOVAL => Self::DeviceRemoval,
            RDMA_CM_EVENT_MULTICAST_JOIN => Self::MulticastJoin,
            RDMA_CM_EVENT_MULTICAST_ERROR => Self::MulticastError,
            RDMA_CM_EVENT_ADDR_CHANGE => Self::AddrChange,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => Self::TimewaitExit,
            o => Self::Other(o),
        }
    }

    fn to_raw(self) -> u32 {
        use rdma_cm_event_type::*;
        match self {
            Self::AddrResolved => RDMA_CM_EVENT_ADDR_RESOLVED,
            Self::AddrError => RDMA_CM_EVENT_ADDR_ERROR,
            Self::RouteResolved => RDMA_CM_EVENT_ROUTE_RESOLVED,
            Self::RouteError => RDMA_CM_EVENT_ROUTE_ERROR,
            Self::ConnectRequest => RDMA_CM_EVENT_CONNECT_REQUEST,
            Self::ConnectResponse => RDMA_CM_EVENT_CONNECT_RESPONSE,
            Self::ConnectError => RDMA_CM_EVENT_CONNECT_ERROR,
            Self::Unreachable => RDMA_CM_EVENT_UNREACHABLE,
            Self::Rejected => RDMA_CM_EVENT_REJECTED,
            Self::Established => RDMA_CM_EVENT_ESTABLISHED,
            Self::Disconnected => RDMA_CM_EVENT_DISCONNECTED,
            Self::DeviceRemoval => RDMA_CM_EVENT_DEVICE_REMOVAL,
            Self::MulticastJoin => RDMA_CM_EVENT_MULTICAST_JOIN,
            Self::MulticastError => RDMA_CM_EVENT_MULTICAST_ERROR,
            Self::AddrChange => RDMA_CM_EVENT_ADDR_CHANGE,
            Self::TimewaitExit => RDMA_CM_EVENT_TIMEWAIT_EXIT,
            Self::Other(o) => o,
        }
    }
}

impl fmt::Display for CmEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: rdma_event_str accepts any value and returns a static string.
        let s = unsafe { crate::sys::c_str_to_string(rdma_event_str(self.to_raw())) };
        f.write_str(&s)
    }
}

/// One rdma_cm event, copied out of librdmacm and already acknowledged.
pub struct CmEvent {
    kind: CmEventType,
    status: i32,
    tag: u64,
    initiator_depth: u8,
    responder_resources: u8,
    peer_qp_num: u32,
    pdata: [u8; 255],
    pdata_len: u8,
    new_id: Option<CmId>,
}

impl fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("status", &self.status)
            .field("tag", &self.tag)
            .field("initiator_depth", &self.initiator_depth)
            .field("responder_resources", &self.responder_resources)
            .field("private_data_len", &self.pdata_len)
            .field("new_id", &self.new_id.is_some())
            .finish()
    }
}

impl CmEvent {
    /// The event type.
    pub fn event_type(&self) -> CmEventType {
        self.kind
    }

    /// The event status: 0, or a negative errno (e.g. `-ETIMEDOUT`; an iWARP REJECTED carries
    /// one too, `-ECONNRESET` on siw), or for IB/RoCE REJECTED the CM reject reason
    /// (28 = consumer defined).
    pub fn status(&self) -> i32 {
        self.status
    }

    /// The tag of the id the event is about (for CONNECT_REQUEST: the listener's tag, which
    /// the new id inherits).
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The peer's private data (CONNECT_REQUEST, ESTABLISHED on the active side, REJECTED).
    /// Transports may pad it: IB delivers fixed-size fields (e.g. 148 bytes on a reject), so
    /// compare prefixes.
    pub fn private_data(&self) -> &[u8] {
        &self.pdata[..self.pdata_len as usize]
    }

    /// Connection parameter `initiator_depth`. On a CONNECT_REQUEST the CM has already turned
    /// the pair to this side's point of view (the IB CM swaps the fields, rdma-binding notes
    /// §1): this is the peer's responder resources, i.e. the most RDMA READs this side may have
    /// outstanding. Accept with `initiator_depth = min(this, max_qp_init_rd_atom)`.
    pub fn initiator_depth(&self) -> u8 {
        self.initiator_depth
    }

    /// Connection parameter `responder_resources`. On a CONNECT_REQUEST: the peer's initiator
    /// depth, i.e. how many RDMA READs the peer will issue; accept with
    /// `responder_resources = min(this, max_qp_rd_atom)`.
    pub fn responder_resources(&self) -> u8 {
        self.responder_resources
    }

    /// The peer's QP number, when the event carries one (CONNECT_REQUEST, ESTABLISHED).
    pub fn peer_qp_num(&self) -> u32 {
        self.peer_qp_num
    }

    /// For CONNECT_REQUEST: takes the new connection's id (owned; dropping it without
    /// accepting rejects and destroys the request). `None` for other events or once taken.
    pub fn take_new_id(&mut self) -> Option<CmId> {
        self.new_id.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_param_validation() {
        let big = [0u8; 256];
        let p = ConnParam {
            private_data: &big,
            ..Default::default()
        };
        assert!(matches!(p.to_raw(), Err(Error::InvalidArgument(_))));
        let p = ConnParam {
            retry_count: 8,
            ..Default::default()
        };
        assert!(p.to_raw().is_err());
        let data = [7u8; 32];
        let p = ConnParam {
            private_data: &data,
            responder_resources: 16,
            initiator_depth: 4,
            flow_control: true,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        let r = p.to_raw().unwrap();
        assert_eq!(r.private_data_len, 32);
        assert_eq!(r.private_data, data.as_ptr().cast());
        assert_eq!((r.responder_resources, r.initiator_depth), (16, 4));
        assert_eq!(
            (r.flow_control, r.retry_count, r.rnr_retry_count),
            (1, 7, 7)
        );
        let r = ConnParam::default().to_raw().unwrap();
        assert!(r.private_data.is_null());
        assert_eq!(r.private_data_len, 0);
    }

    #[test]
    fn event_type_round_trip_and_display() {
        for raw in 0..=16u32 {
            assert_eq!(CmEventType::from_raw(raw).to_raw(), raw);
        }
        assert_eq!(
            CmEventType::ConnectRequest.to_string(),
            "RDMA_CM_EVENT_CONNECT_REQUEST"
        );
        assert_eq!(CmEventType::Rejected.to_string(), "RDMA_CM_EVENT_REJECTED");
        assert_eq!(CmEventType::from_raw(99), CmEventType::Other(99));
    }

    #[test]
    fn timeouts_clamp() {
        assert_eq!(timeout_ms(Duration::ZERO), 1);
        assert_eq!(timeout_ms(Duration::from_millis(2000)), 2000);
        assert_eq!(timeout_ms(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
