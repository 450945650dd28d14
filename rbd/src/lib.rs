//! Safe owner types over librados and librbd: the project's one Ceph FFI crate.
//!
//! - [`Cluster`]: a connected `rados_t` (configuration file, user, settings), shut down on drop.
//! - [`IoCtx`]: a pool (and RADOS namespace) of a cluster.
//! - [`Image`]: an open RBD image, thread-safe as librbd's handles are: its asynchronous
//!   operations take a [`Completions`] and a token, and the result comes back through it.
//! - [`Completions`]: where librbd's completion callbacks (on librbd's own threads) leave
//!   `(token, result)` pairs, and an eventfd they signal, so the owner learns of them in its
//!   own event loop (an io_uring POLL_ADD on the eventfd, an epoll) and never blocks on librbd.
//!   Submitting allocates nothing of ours: the callback's argument points into a table made
//!   once, one cell per token.
//!
//! Errors are negative errnos from librbd, kept as positive `i32` in [`Error`] and in the
//! results (`Err(errno)`).

use std::ffi::{c_void, CString};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Arc, Mutex, PoisonError};

mod sys;

/// RBD image feature bits (librbd's `RBD_FEATURE_*`).
pub mod features {
    pub const LAYERING: u64 = super::sys::RBD_FEATURE_LAYERING as u64;
    pub const EXCLUSIVE_LOCK: u64 = super::sys::RBD_FEATURE_EXCLUSIVE_LOCK as u64;
    pub const OBJECT_MAP: u64 = super::sys::RBD_FEATURE_OBJECT_MAP as u64;
}

/// A failed librados/librbd call: what was attempted, on what, and the errno.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {}", io::Error::from_raw_os_error(*errno))]
pub struct Error {
    pub context: String,
    /// Positive errno.
    pub errno: i32,
}

impl Error {
    fn new(context: impl Into<String>, ret: i32) -> Error {
        Error {
            context: context.into(),
            errno: ret.unsigned_abs() as i32,
        }
    }
}

fn cstr(what: &str, s: &str) -> Result<CString, Error> {
    CString::new(s)
        .map_err(|_| Error::new(format!("{what} {s:?} contains a NUL byte"), libc::EINVAL))
}

/// A connected cluster handle.
pub struct Cluster {
    h: sys::rados_t,
    conf: PathBuf,
    user: String,
}

// SAFETY: librados cluster handles may be used from any thread (librados is thread-safe; the
// handle is only read after `rados_connect`).
unsafe impl Send for Cluster {}
// SAFETY: as above; every use after connecting goes through librados' own locking.
unsafe impl Sync for Cluster {}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("conf", &self.conf)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Reads `conf`, applies `settings` (librados/librbd option names and values) and connects
    /// as `client.<user>`. Connecting waits at most the `client_mount_timeout` setting (pass it
    /// in `settings` to bound it).
    pub fn connect(
        conf: &Path,
        user: &str,
        settings: &[(&str, &str)],
    ) -> Result<Arc<Cluster>, Error> {
        let who = format!("cluster {} (client.{user})", conf.display());
        let cuser = cstr("user", user)?;
        let mut h: sys::rados_t = ptr::null_mut();
        // SAFETY: `h` is a live out-pointer; the id is a NUL-terminated string.
        let r = unsafe { sys::rados_create(&mut h, cuser.as_ptr()) };
        if r < 0 {
            return Err(Error::new(format!("{who}: rados_create"), r));
        }
        // From here `Drop` shuts the handle down on every error path.
        let c = Cluster {
            h,
            conf: conf.to_owned(),
            user: user.to_owned(),
        };
        let cconf = cstr("configuration path", &conf.to_string_lossy())?;
        // SAFETY: `c.h` is a created, unconnected handle; the path is NUL-terminated.
        let r = unsafe { sys::rados_conf_read_file(c.h, cconf.as_ptr()) };
        if r < 0 {
            return Err(Error::new(
                format!("{who}: cannot read the configuration"),
                r,
            ));
        }
        for (k, v) in settings {
            let (ck, cv) = (cstr("option", k)?, cstr("value", v)?);
            // SAFETY: as above; both strings are NUL-terminated and outlive the call.
            let r = unsafe { sys::rados_conf_set(c.h, ck.as_ptr(), cv.as_ptr()) };
            if r < 0 {
                return Err(Error::new(format!("{who}: cannot set {k}={v}"), r));
            }
        }
        // SAFETY: a configured, unconnected handle.
        let r = unsafe { sys::rados_connect(c.h) };
        if r < 0 {
            return Err(Error::new(format!("{who}: cannot connect"), r));
        }
        Ok(Arc::new(c))
    }

    pub fn conf(&self) -> &Path {
        &self.conf
    }

    pub fn user(&self) -> &str {
        &self.user
    }

    /// This connection's name in the cluster, `client.<global id>`: what lock owner lists and
    /// blocklists call it.
    pub fn client_name(&self) -> String {
        // SAFETY: a connected handle.
        format!("client.{}", unsafe { sys::rados_get_instance_id(self.h) })
    }

    /// This connection's address in the cluster (`127.0.0.1:0/<nonce>`, maybe several as
    /// `[v2:...,v1:...]`): what exclusive lock owner lists name the holder by.
    pub fn addrs(&self) -> Result<String, Error> {
        let mut p: *mut libc::c_char = ptr::null_mut();
        // SAFETY: a connected handle and a live out-pointer; librados allocates the string.
        let r = unsafe { sys::rados_getaddrs(self.h, &mut p) };
        if r < 0 || p.is_null() {
            let errno = if r < 0 { r } else { -libc::EIO };
            return Err(Error::new("rados_getaddrs".to_string(), errno));
        }
        // SAFETY: a NUL-terminated string from librados, freed right after.
        let s = unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: the buffer rados_getaddrs allocated, freed once.
        unsafe { sys::rados_buffer_free(p) };
        Ok(s)
    }
}

/// Whether lock owner `owner` (as `rbd_lock_get_owners` names it) is the client `client`: a
/// `client.<id>` name (`client.412` is not `client.4123`), or an address as
/// [`Cluster::addrs`] gives it (any of its `v1:`/`v2:` forms, the same `ip:port/nonce`).
pub fn is_client(owner: &str, client: &str) -> bool {
    if let Some(rest) = owner.strip_prefix(client) {
        if client.starts_with("client.") {
            return !rest.starts_with(|c: char| c.is_ascii_digit());
        }
    }
    let plain = |a: &str| -> Vec<String> {
        a.trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|x| {
                let x = x.trim();
                x.split_once(':')
                    .filter(|(kind, _)| matches!(*kind, "v1" | "v2" | "any"))
                    .map_or(x, |(_, rest)| rest)
                    .to_owned()
            })
            .filter(|x| x.contains('/'))
            .collect()
    };
    let ours = plain(client);
    plain(owner).iter().any(|o| ours.contains(o))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle was created by rados_create; every IoCtx (and so every Image)
        // holds an Arc of this Cluster, so none is left.
        unsafe { sys::rados_shutdown(self.h) };
    }
}

/// A pool (and RADOS namespace) of a cluster.
pub struct IoCtx {
    h: sys::rados_ioctx_t,
    pool: String,
    namespace: String,
    cluster: Arc<Cluster>,
}

// SAFETY: librados I/O contexts may be shared between threads; the namespace is set once at
// creation, before the context is shared.
unsafe impl Send for IoCtx {}
// SAFETY: as above.
unsafe impl Sync for IoCtx {}

impl fmt::Debug for IoCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoCtx")
            .field("pool", &self.pool)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl IoCtx {
    /// Opens `pool`, in RADOS namespace `namespace` ("" for the default).
    pub fn open(cluster: &Arc<Cluster>, pool: &str, namespace: &str) -> Result<Arc<IoCtx>, Error> {
        let cpool = cstr("pool", pool)?;
        let mut h: sys::rados_ioctx_t = ptr::null_mut();
        // SAFETY: a connected cluster handle, a live out-pointer, a NUL-terminated name.
        let r = unsafe { sys::rados_ioctx_create(cluster.h, cpool.as_ptr(), &mut h) };
        if r < 0 {
            return Err(Error::new(
                format!(
                    "cluster {}: cannot open pool {pool}",
                    cluster.conf.display()
                ),
                r,
            ));
        }
        let io = IoCtx {
            h,
            pool: pool.to_owned(),
            namespace: namespace.to_owned(),
            cluster: Arc::clone(cluster),
        };
        if !namespace.is_empty() {
            let cns = cstr("namespace", namespace)?;
            // SAFETY: a live context not yet shared; the name is NUL-terminated (copied).
            unsafe { sys::rados_ioctx_set_namespace(io.h, cns.as_ptr()) };
        }
        Ok(Arc::new(io))
    }

    pub fn pool(&self) -> &str {
        &self.pool
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    fn err(&self, what: &str, oid: &str, r: i32) -> Error {
        Error::new(format!("pool {}: object {oid}: {what}", self.pool), r)
    }

    /// Takes (or, held already by this connection and `cookie`, renews) the exclusive
    /// advisory lock `name` on object `oid` (created if missing) for `duration`: the OSD
    /// forgets it when that passes without a renewal, so a holder that dies gives it up by
    /// itself (a lease). `Ok(false)` when another holder has it. With `must_hold` a renewal
    /// fails (`ENOENT`) if the lock was lost meanwhile, instead of taking it afresh.
    pub fn lock_exclusive(
        &self,
        oid: &str,
        name: &str,
        cookie: &str,
        duration: std::time::Duration,
        must_hold: bool,
    ) -> Result<bool, Error> {
        let (coid, cname, ccookie) = (
            cstr("object", oid)?,
            cstr("lock", name)?,
            cstr("cookie", cookie)?,
        );
        let mut tv = libc::timeval {
            tv_sec: duration.as_secs() as libc::time_t,
            tv_usec: duration.subsec_micros() as libc::suseconds_t,
        };
        let flags = if must_hold {
            sys::LIBRADOS_LOCK_FLAG_MUST_RENEW
        } else {
            sys::LIBRADOS_LOCK_FLAG_RENEW
        } as u8;
        // SAFETY: a live context; NUL-terminated strings and a timeval that outlive the call.
        let r = unsafe {
            sys::rados_lock_exclusive(
                self.h,
                coid.as_ptr(),
                cname.as_ptr(),
                ccookie.as_ptr(),
                cname.as_ptr(),
                (&mut tv as *mut libc::timeval).cast(),
                flags,
            )
        };
        match r {
            0 => Ok(true),
            r if r == -libc::EBUSY || (r == -libc::EEXIST && !must_hold) => Ok(false),
            r => Err(self.err(&format!("lock {name}"), oid, r)),
        }
    }

    /// Gives back lock `name` on `oid` held with `cookie` (`Ok` if it was not held).
    pub fn unlock(&self, oid: &str, name: &str, cookie: &str) -> Result<(), Error> {
        let (coid, cname, ccookie) = (
            cstr("object", oid)?,
            cstr("lock", name)?,
            cstr("cookie", cookie)?,
        );
        // SAFETY: a live context and NUL-terminated strings.
        let r =
            unsafe { sys::rados_unlock(self.h, coid.as_ptr(), cname.as_ptr(), ccookie.as_ptr()) };
        if r < 0 && r != -libc::ENOENT {
            return Err(self.err(&format!("unlock {name}"), oid, r));
        }
        Ok(())
    }

    /// The live holders of lock `name` on `oid` as `(client, cookie)` (the OSD drops holders
    /// whose duration passed): empty if nobody holds it or the object does not exist.
    pub fn lockers(&self, oid: &str, name: &str) -> Result<Vec<(String, String)>, Error> {
        let (coid, cname) = (cstr("object", oid)?, cstr("lock", name)?);
        let mut cap = 256usize;
        loop {
            let (mut tag, mut clients, mut cookies, mut addrs) = (
                vec![0u8; cap],
                vec![0u8; cap],
                vec![0u8; cap],
                vec![0u8; cap],
            );
            let (mut tl, mut cl, mut kl, mut al) = (cap, cap, cap, cap);
            let mut exclusive = 0i32;
            // SAFETY: every buffer has the length passed with it; librados writes at most that
            // (or reports -ERANGE with the lengths it needs).
            let r = unsafe {
                sys::rados_list_lockers(
                    self.h,
                    coid.as_ptr(),
                    cname.as_ptr(),
                    &mut exclusive,
                    tag.as_mut_ptr().cast(),
                    &mut tl,
                    clients.as_mut_ptr().cast(),
                    &mut cl,
                    cookies.as_mut_ptr().cast(),
                    &mut kl,
                    addrs.as_mut_ptr().cast(),
                    &mut al,
                )
            } as i32;
            if r == -libc::ERANGE && cap < 1 << 20 {
                cap = cap.max(tl).max(cl).max(kl).max(al).max(cap * 2);
                continue;
            }
            if r == -libc::ENOENT {
                return Ok(Vec::new());
            }
            if r < 0 {
                return Err(self.err(&format!("list lockers of {name}"), oid, r));
            }
            // Each list is `r` NUL-terminated strings back to back.
            let split = |b: &[u8], len: usize| -> Vec<String> {
                b[..len.min(b.len())]
                    .split(|&c| c == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect()
            };
            let (cs, ks) = (split(&clients, cl), split(&cookies, kl));
            return Ok(cs.into_iter().zip(ks).take(r as usize).collect());
        }
    }

    /// Sets extended attribute `name` of object `oid` (created if missing) to `value`.
    pub fn set_xattr(&self, oid: &str, name: &str, value: &[u8]) -> Result<(), Error> {
        let (coid, cname) = (cstr("object", oid)?, cstr("attribute", name)?);
        // SAFETY: a live context, NUL-terminated strings, a buffer of the length given.
        let r = unsafe {
            sys::rados_setxattr(
                self.h,
                coid.as_ptr(),
                cname.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
            )
        };
        if r < 0 {
            return Err(self.err(&format!("set attribute {name}"), oid, r));
        }
        Ok(())
    }

    /// Removes extended attribute `name` of `oid` (`Ok` if there was none).
    pub fn remove_xattr(&self, oid: &str, name: &str) -> Result<(), Error> {
        let (coid, cname) = (cstr("object", oid)?, cstr("attribute", name)?);
        // SAFETY: a live context and NUL-terminated strings.
        let r = unsafe { sys::rados_rmxattr(self.h, coid.as_ptr(), cname.as_ptr()) };
        if r < 0 && r != -libc::ENOENT && r != -libc::ENODATA {
            return Err(self.err(&format!("remove attribute {name}"), oid, r));
        }
        Ok(())
    }

    /// Every extended attribute of `oid` (none if it does not exist).
    pub fn xattrs(&self, oid: &str) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let coid = cstr("object", oid)?;
        let mut it: sys::rados_xattrs_iter_t = ptr::null_mut();
        // SAFETY: a live context, a NUL-terminated name, a live out-pointer.
        let r = unsafe { sys::rados_getxattrs(self.h, coid.as_ptr(), &mut it) };
        if r == -libc::ENOENT {
            return Ok(Vec::new());
        }
        if r < 0 {
            return Err(self.err("get attributes", oid, r));
        }
        let mut out = Vec::new();
        loop {
            let (mut name, mut val, mut len) = (ptr::null(), ptr::null(), 0usize);
            // SAFETY: an iterator rados_getxattrs gave us, not yet ended.
            let r = unsafe { sys::rados_getxattrs_next(it, &mut name, &mut val, &mut len) };
            if r < 0 || name.is_null() {
                break;
            }
            // SAFETY: librados keeps the name (NUL-terminated) and `len` value bytes alive
            // until the next call on the iterator; both are copied here.
            let (n, v) = unsafe {
                (
                    std::ffi::CStr::from_ptr(name)
                        .to_string_lossy()
                        .into_owned(),
                    if val.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(val.cast::<u8>(), len).to_vec()
                    },
                )
            };
            out.push((n, v));
        }
        // SAFETY: ended once.
        unsafe { sys::rados_getxattrs_end(it) };
        Ok(out)
    }

    /// Extended attribute `name` of `oid` (`None` if the object or the attribute is missing).
    pub fn xattr(&self, oid: &str, name: &str) -> Result<Option<Vec<u8>>, Error> {
        let (coid, cname) = (cstr("object", oid)?, cstr("attribute", name)?);
        let mut cap = 256usize;
        loop {
            let mut buf = vec![0u8; cap];
            // SAFETY: a live context, NUL-terminated strings, a buffer of `cap` bytes.
            let r = unsafe {
                sys::rados_getxattr(
                    self.h,
                    coid.as_ptr(),
                    cname.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    cap,
                )
            };
            match r {
                r if r == -libc::ENOENT || r == -libc::ENODATA => return Ok(None),
                r if r == -libc::ERANGE && cap < 1 << 24 => cap *= 16,
                r if r < 0 => return Err(self.err(&format!("get attribute {name}"), oid, r)),
                n => {
                    buf.truncate(n as usize);
                    return Ok(Some(buf));
                }
            }
        }
    }

    /// The whole content of object `oid` (`None` if it does not exist).
    pub fn read_full(&self, oid: &str) -> Result<Option<Vec<u8>>, Error> {
        let coid = cstr("object", oid)?;
        let (mut size, mut mtime) = (0u64, 0 as libc::time_t);
        // SAFETY: a live context, a NUL-terminated name, live out-pointers.
        let r = unsafe {
            sys::rados_stat(
                self.h,
                coid.as_ptr(),
                &mut size,
                (&mut mtime as *mut libc::time_t).cast(),
            )
        };
        if r == -libc::ENOENT {
            return Ok(None);
        }
        if r < 0 {
            return Err(self.err("stat", oid, r));
        }
        let mut data = vec![0u8; size as usize];
        let mut off = 0usize;
        while off < data.len() {
            // SAFETY: the buffer has `len - off` bytes from `off`.
            let r = unsafe {
                sys::rados_read(
                    self.h,
                    coid.as_ptr(),
                    data[off..].as_mut_ptr().cast(),
                    data.len() - off,
                    off as u64,
                )
            };
            if r < 0 {
                return Err(self.err("read", oid, r));
            }
            if r == 0 {
                data.truncate(off);
                break;
            }
            off += r as usize;
        }
        Ok(Some(data))
    }

    /// Replaces object `oid`'s content with `data` and its attribute `attr` with `new_attr`,
    /// in one atomic operation, only if `attr` is `expect` now (`None`: only if the object
    /// does not exist, which creates it). `Ok(false)`, changing nothing, when the guard does
    /// not hold (another writer got there first).
    pub fn write_guarded(
        &self,
        oid: &str,
        attr: &str,
        expect: Option<&[u8]>,
        new_attr: &[u8],
        data: &[u8],
    ) -> Result<bool, Error> {
        /// librados.h's LIBRADOS_CMPXATTR_OP_EQ.
        const CMPXATTR_EQ: u8 = 1;
        let (coid, cattr) = (cstr("object", oid)?, cstr("attribute", attr)?);
        // SAFETY: creates an empty operation, released below on every path.
        let op = unsafe { sys::rados_create_write_op() };
        if op.is_null() {
            return Err(self.err("create a write operation", oid, -libc::ENOMEM));
        }
        // SAFETY: `op` is live; every buffer outlives rados_write_op_operate, which runs the
        // operation synchronously (librados copies what it keeps).
        let r = unsafe {
            match expect {
                None => sys::rados_write_op_create(op, 1, ptr::null()),
                Some(v) => sys::rados_write_op_cmpxattr(
                    op,
                    cattr.as_ptr(),
                    CMPXATTR_EQ,
                    v.as_ptr().cast(),
                    v.len(),
                ),
            }
            sys::rados_write_op_setxattr(
                op,
                cattr.as_ptr(),
                new_attr.as_ptr().cast(),
                new_attr.len(),
            );
            sys::rados_write_op_write_full(op, data.as_ptr().cast(), data.len());
            let r = sys::rados_write_op_operate(op, self.h, coid.as_ptr(), ptr::null_mut(), 0);
            sys::rados_release_write_op(op);
            r
        };
        match r {
            0 => Ok(true),
            r if [libc::ECANCELED, libc::EEXIST, libc::ENODATA, libc::ENOENT].contains(&-r) => {
                Ok(false)
            }
            r => Err(self.err("guarded write", oid, r)),
        }
    }

    /// Removes object `oid` (`Ok` if it did not exist).
    pub fn remove(&self, oid: &str) -> Result<(), Error> {
        let coid = cstr("object", oid)?;
        // SAFETY: a live context and a NUL-terminated name.
        let r = unsafe { sys::rados_remove(self.h, coid.as_ptr()) };
        if r < 0 && r != -libc::ENOENT {
            return Err(self.err("remove", oid, r));
        }
        Ok(())
    }
}

/// A watch on one RADOS object ([`IoCtx::watch`]): every notify sent to the object
/// ([`IoCtx::notify`]) calls its function, on a librados thread, before it is acknowledged.
/// Unregistered on drop.
pub struct ObjectWatch {
    io: Arc<IoCtx>,
    cookie: u64,
    ctx: *mut ObjectWatchCtx,
}

struct ObjectWatchCtx {
    /// The context's handle, for acknowledging (the watch holds an `Arc` of the context).
    io: sys::rados_ioctx_t,
    oid: CString,
    f: WatchFn,
    /// The watch failed (its connection to the OSD was lost): it notices nothing any more.
    broken: std::sync::atomic::AtomicBool,
}

// SAFETY: the context pointer is only read by librados callbacks (the function is
// Send + Sync, the flag atomic) and freed on drop after they are flushed.
unsafe impl Send for ObjectWatch {}
// SAFETY: as above; `&ObjectWatch` only reads the atomic flag.
unsafe impl Sync for ObjectWatch {}

impl fmt::Debug for ObjectWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectWatch")
            .field("cookie", &self.cookie)
            .field("broken", &self.broken())
            .finish_non_exhaustive()
    }
}

extern "C" fn on_notify(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    _notifier: u64,
    _data: *mut c_void,
    _len: usize,
) {
    // SAFETY: `arg` is the watch's context, freed only after rados_unwatch2 and
    // rados_watch_flush returned (no callback in progress any more).
    let ctx = unsafe { &*(arg as *const ObjectWatchCtx) };
    // Never unwind into librados.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&ctx.f));
    // SAFETY: a live context (see above) and the ids librados gave this callback.
    unsafe { sys::rados_notify_ack(ctx.io, ctx.oid.as_ptr(), notify_id, cookie, ptr::null(), 0) };
}

extern "C" fn on_watch_error(arg: *mut c_void, _cookie: u64, _err: i32) {
    // SAFETY: as in `on_notify`.
    let ctx = unsafe { &*(arg as *const ObjectWatchCtx) };
    ctx.broken.store(true, std::sync::atomic::Ordering::Release);
}

impl ObjectWatch {
    /// The watch was lost (a connection to the OSD failed, or its timeout passed without
    /// one): it will not notice notifies any more; make a new one.
    pub fn broken(&self) -> bool {
        // SAFETY: the context lives as long as `self`.
        unsafe { &*self.ctx }
            .broken
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for ObjectWatch {
    fn drop(&mut self) {
        // SAFETY: a watch made by rados_watch3 on this context, unregistered once; the flush
        // waits for callbacks in progress, after which nothing points to the context.
        unsafe {
            sys::rados_unwatch2(self.io.h, self.cookie);
            sys::rados_watch_flush(self.io.cluster.h);
            drop(Box::from_raw(self.ctx));
        }
    }
}

impl IoCtx {
    /// Watches object `oid` (which must exist): `f` runs for each notify sent to it. The OSD
    /// drops a watch whose client stops answering for `timeout` (whole seconds, at least 1).
    pub fn watch(
        self: &Arc<Self>,
        oid: &str,
        timeout: std::time::Duration,
        f: impl Fn() + Send + Sync + 'static,
    ) -> Result<ObjectWatch, Error> {
        let ctx = Box::into_raw(Box::new(ObjectWatchCtx {
            io: self.h,
            oid: cstr("object", oid)?,
            f: Box::new(f),
            broken: std::sync::atomic::AtomicBool::new(false),
        }));
        let mut cookie = 0u64;
        // SAFETY: a live context; `ctx` (and the name in it) stays allocated until the watch
        // is unregistered and flushed (ObjectWatch's drop).
        let r = unsafe {
            sys::rados_watch3(
                self.h,
                (*ctx).oid.as_ptr(),
                &mut cookie,
                Some(on_notify),
                Some(on_watch_error),
                timeout.as_secs().max(1) as u32,
                ctx.cast(),
            )
        };
        if r < 0 {
            // SAFETY: not registered, so nothing else points to it.
            drop(unsafe { Box::from_raw(ctx) });
            return Err(self.err("watch", oid, r));
        }
        Ok(ObjectWatch {
            io: Arc::clone(self),
            cookie,
            ctx,
        })
    }

    /// Sends a notify to every watch of object `oid` and waits (up to `timeout`) until each
    /// has acknowledged it. `Ok(false)` when some did not in time (a watcher that died
    /// stays registered until its watch times out).
    pub fn notify(&self, oid: &str, timeout: std::time::Duration) -> Result<bool, Error> {
        let coid = cstr("object", oid)?;
        // SAFETY: a live context and a NUL-terminated name; no payload and no reply buffer
        // (both optional).
        let r = unsafe {
            sys::rados_notify2(
                self.h,
                coid.as_ptr(),
                ptr::null(),
                0,
                timeout.as_millis() as u64,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        match r {
            0 => Ok(true),
            r if r == -libc::ETIMEDOUT => Ok(false),
            r => Err(self.err("notify", oid, r)),
        }
    }
}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create; every Image on it holds an Arc of it.
        unsafe { sys::rados_ioctx_destroy(self.h) };
    }
}

type WatchFn = Box<dyn Fn() + Send + Sync>;

/// An open RBD image.
pub struct Image {
    h: sys::rbd_image_t,
    name: String,
    io: Arc<IoCtx>,
    /// Update watches: librbd's handle and the callback box its argument points to, freed after
    /// `rbd_update_unwatch` (which waits for a callback in progress).
    watches: Mutex<Vec<(u64, *mut WatchFn)>>,
}

// SAFETY: librbd image handles are thread-safe (librbd serialises internally; QEMU and SPDK
// issue aio from several threads on one handle); the watch list is behind a mutex and the boxed
// callbacks are Send + Sync.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl fmt::Debug for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Image")
            .field("pool", &self.io.pool)
            .field("namespace", &self.io.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

extern "C" fn on_update(arg: *mut c_void) {
    // SAFETY: `arg` is the `*mut WatchFn` registered in `Image::watch`, freed only after
    // `rbd_update_unwatch` returned, which waits for callbacks in progress.
    let f = unsafe { &*(arg as *const WatchFn) };
    // Never unwind into librbd.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

impl Image {
    /// Opens image `name` in `io`'s pool.
    pub fn open(io: &Arc<IoCtx>, name: &str) -> Result<Image, Error> {
        let cname = cstr("image", name)?;
        let mut h: sys::rbd_image_t = ptr::null_mut();
        // SAFETY: a live I/O context, a NUL-terminated name, a live out-pointer, no snapshot.
        let r = unsafe { sys::rbd_open(io.h, cname.as_ptr(), &mut h, ptr::null()) };
        if r < 0 {
            let ns = if io.namespace.is_empty() {
                String::new()
            } else {
                format!(" (namespace {})", io.namespace)
            };
            return Err(Error::new(
                format!(
                    "cluster {}: cannot open image {}/{name}{ns}",
                    io.cluster.conf.display(),
                    io.pool
                ),
                r,
            ));
        }
        Ok(Image {
            h,
            name: name.to_owned(),
            io: Arc::clone(io),
            watches: Mutex::new(Vec::new()),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ioctx(&self) -> &Arc<IoCtx> {
        &self.io
    }

    /// The image's size in bytes, as librbd knows it now (a resize elsewhere is seen after
    /// librbd refreshes the header, which an update watch announces).
    pub fn size(&self) -> Result<u64, Error> {
        let mut size = 0u64;
        // SAFETY: an open image and a live out-pointer.
        let r = unsafe { sys::rbd_get_size(self.h, &mut size) };
        if r < 0 {
            return Err(Error::new(format!("image {}: rbd_get_size", self.name), r));
        }
        Ok(size)
    }

    /// The image's feature bits ([`features`]).
    pub fn features(&self) -> Result<u64, Error> {
        let mut f = 0u64;
        // SAFETY: an open image and a live out-pointer.
        let r = unsafe { sys::rbd_get_features(self.h, &mut f) };
        if r < 0 {
            return Err(Error::new(
                format!("image {}: rbd_get_features", self.name),
                r,
            ));
        }
        Ok(f)
    }

    /// Makes sure no other client holds the image's exclusive lock: unless this handle owns it,
    /// every owner's lock is broken, which blocklists that client in the cluster (its writes in
    /// flight are refused from then on: it is fenced). What a gateway that takes over a
    /// namespace does, so its first write need not wait for a dead owner's watch to time out
    /// (30 s). Blocks while it talks to the cluster. Returns the owners whose locks were
    /// broken (none for an image without the exclusive-lock feature).
    pub fn break_foreign_lock(&self) -> Result<Vec<String>, Error> {
        self.break_foreign_lock_except(&[])
    }

    /// [`Image::break_foreign_lock`], sparing owners named in `spare` (`client.<id>` names or
    /// addresses, see [`is_client`]: live peers, which give the lock up when asked).
    pub fn break_foreign_lock_except(&self, spare: &[String]) -> Result<Vec<String>, Error> {
        let ctx = |what: &str| format!("image {}: {what}", self.name);
        let mut owner = 0i32;
        // SAFETY: an open image and a live out-pointer.
        let r = unsafe { sys::rbd_is_exclusive_lock_owner(self.h, &mut owner) };
        if r < 0 {
            return Err(Error::new(ctx("rbd_is_exclusive_lock_owner"), r));
        }
        if owner != 0 {
            return Ok(Vec::new());
        }
        let (mode, owners) = self.owners()?;
        let mut broken = Vec::new();
        let mut first_err = None;
        for name in owners {
            if spare.iter().any(|s| is_client(&name, s)) {
                continue;
            }
            let Ok(c) = std::ffi::CString::new(name.as_str()) else {
                continue;
            };
            // SAFETY: an open image and a NUL-terminated owner string.
            let r = unsafe { sys::rbd_lock_break(self.h, mode, c.as_ptr()) };
            if r < 0 && r != -libc::ENOENT {
                first_err.get_or_insert(Error::new(ctx(&format!("rbd_lock_break {name}")), r));
            } else {
                broken.push(name);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(broken),
        }
    }

    /// Who holds the image's exclusive lock (as librbd names them: their addresses); none for
    /// an image without the exclusive-lock feature or with no holder.
    pub fn lock_owners(&self) -> Result<Vec<String>, Error> {
        self.owners().map(|(_, o)| o)
    }

    /// [`Image::lock_owners`] and the lock's mode.
    fn owners(&self) -> Result<(sys::rbd_lock_mode_t, Vec<String>), Error> {
        let mut mode: sys::rbd_lock_mode_t = 0;
        let mut owners: [*mut libc::c_char; 16] = [ptr::null_mut(); 16];
        let mut count = owners.len();
        // SAFETY: `owners` has room for `count` pointers, which librbd fills (and which
        // rbd_lock_get_owners_cleanup frees below).
        let r =
            unsafe { sys::rbd_lock_get_owners(self.h, &mut mode, owners.as_mut_ptr(), &mut count) };
        if r == -libc::ENOENT {
            return Ok((mode, Vec::new()));
        }
        if r < 0 {
            return Err(Error::new(
                format!("image {}: rbd_lock_get_owners", self.name),
                r,
            ));
        }
        let names = owners[..count.min(owners.len())]
            .iter()
            .filter(|o| !o.is_null())
            .map(|&o| {
                // SAFETY: librbd filled NUL-terminated strings, alive until the cleanup below.
                unsafe { std::ffi::CStr::from_ptr(o) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        // SAFETY: the array and count rbd_lock_get_owners returned, freed once.
        unsafe { sys::rbd_lock_get_owners_cleanup(owners.as_mut_ptr(), count.min(owners.len())) };
        Ok((mode, names))
    }

    /// Calls `f` (on a librbd thread) whenever the image's header changes: a resize, a
    /// snapshot, a feature change, made by any client. Unregistered when the image closes.
    pub fn watch(&self, f: impl Fn() + Send + Sync + 'static) -> Result<(), Error> {
        let boxed: *mut WatchFn = Box::into_raw(Box::new(Box::new(f) as WatchFn));
        let mut handle = 0u64;
        // SAFETY: an open image; `boxed` stays allocated until after rbd_update_unwatch (Drop).
        let r =
            unsafe { sys::rbd_update_watch(self.h, &mut handle, Some(on_update), boxed.cast()) };
        if r < 0 {
            // SAFETY: not registered, so nothing else points to it.
            drop(unsafe { Box::from_raw(boxed) });
            return Err(Error::new(
                format!("image {}: rbd_update_watch", self.name),
                r,
            ));
        }
        self.watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((handle, boxed));
        Ok(())
    }

    /// Reads `len` bytes at `off` into `buf`; the result (bytes read, or an errno) arrives in
    /// `done` under `token`.
    ///
    /// # Safety
    /// `buf..buf + len` must stay valid for writes, and not be read or written by anyone else,
    /// until `done` hands back the result for this operation.
    pub unsafe fn aio_read(
        &self,
        done: &Completions,
        token: u32,
        off: u64,
        buf: *mut u8,
        len: usize,
    ) -> Result<(), i32> {
        let c = done.begin(token)?;
        // SAFETY: an open image, a fresh completion, and the caller's buffer promise.
        let r = unsafe { sys::rbd_aio_read(self.h, off, len, buf.cast(), c) };
        done.submitted(c, r)
    }

    /// Writes `len` bytes from `buf` at `off`; with `fua` the write is durable when it
    /// completes even if the image has a write-back cache (LIBRADOS_OP_FLAG_FADVISE_FUA).
    ///
    /// # Safety
    /// `buf..buf + len` must stay valid and unchanged until `done` hands back the result (the
    /// cluster handle is set up for zero-copy writes: librbd sends from this memory).
    pub unsafe fn aio_write(
        &self,
        done: &Completions,
        token: u32,
        off: u64,
        buf: *const u8,
        len: usize,
        fua: bool,
    ) -> Result<(), i32> {
        let c = done.begin(token)?;
        let flags = if fua {
            sys::LIBRADOS_OP_FLAG_FADVISE_FUA as i32
        } else {
            0
        };
        // SAFETY: an open image, a fresh completion, and the caller's buffer promise.
        let r = unsafe { sys::rbd_aio_write2(self.h, off, len, buf.cast(), c, flags) };
        done.submitted(c, r)
    }

    /// Makes every write completed before it durable (a no-op without a write-back cache).
    pub fn aio_flush(&self, done: &Completions, token: u32) -> Result<(), i32> {
        let c = done.begin(token)?;
        // SAFETY: an open image and a fresh completion.
        let r = unsafe { sys::rbd_aio_flush(self.h, c) };
        done.submitted(c, r)
    }

    /// Discards `len` bytes at `off` (reads back zeroes where `rbd_skip_partial_discard` is
    /// off: whole objects are removed, partial ones zeroed).
    pub fn aio_discard(
        &self,
        done: &Completions,
        token: u32,
        off: u64,
        len: u64,
    ) -> Result<(), i32> {
        let c = done.begin(token)?;
        // SAFETY: an open image and a fresh completion.
        let r = unsafe { sys::rbd_aio_discard(self.h, off, len, c) };
        done.submitted(c, r)
    }

    /// Atomically compares `len` bytes at `off` with `cmp` and, if they are equal, writes
    /// `buf` there (one OSD operation: atomic against every client of the image). The result
    /// is `len` on success and `-EILSEQ` on a difference, whose byte offset librbd stores in
    /// `*mismatch`.
    ///
    /// # Safety
    /// `cmp..cmp + len` and `buf..buf + len` must stay valid and unchanged, and `mismatch`
    /// valid for writes, until `done` hands back the result.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn aio_compare_and_write(
        &self,
        done: &Completions,
        token: u32,
        off: u64,
        cmp: *const u8,
        buf: *const u8,
        len: usize,
        mismatch: *mut u64,
    ) -> Result<(), i32> {
        let c = done.begin(token)?;
        // SAFETY: an open image, a fresh completion, and the caller's buffer promises.
        let r = unsafe {
            sys::rbd_aio_compare_and_write(self.h, off, len, cmp.cast(), buf.cast(), c, mismatch, 0)
        };
        done.submitted(c, i32::try_from(r).unwrap_or(-libc::EINVAL))
    }

    /// Zeroes `len` bytes at `off`.
    pub fn aio_write_zeroes(
        &self,
        done: &Completions,
        token: u32,
        off: u64,
        len: u64,
    ) -> Result<(), i32> {
        let len = usize::try_from(len).map_err(|_| libc::EINVAL)?;
        let c = done.begin(token)?;
        // SAFETY: an open image and a fresh completion.
        let r = unsafe { sys::rbd_aio_write_zeroes(self.h, off, len, c, 0, 0) };
        done.submitted(c, r)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let watches = std::mem::take(
            self.watches
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (handle, boxed) in watches {
            // SAFETY: a registered watch of this open image; unwatch waits for its callbacks.
            let r = unsafe { sys::rbd_update_unwatch(self.h, handle) };
            if r < 0 {
                // The callback may still be called: leak its box rather than free it.
                tracing::warn!(image = %self.name, errno = -r, "rbd_update_unwatch failed");
                continue;
            }
            // SAFETY: unregistered above; nothing else points to it.
            drop(unsafe { Box::from_raw(boxed) });
        }
        // SAFETY: an open image; rbd_close waits for the image's operations in flight (their
        // completions still hold their own references to their `Completions`).
        let r = unsafe { sys::rbd_close(self.h) };
        if r < 0 {
            tracing::warn!(image = %self.name, errno = -r, "rbd_close failed");
        }
    }
}

/// One token's cell: the callback argument of every operation submitted under the token.
struct Cell {
    token: u32,
    owner: *const Inner,
}

struct Inner {
    cells: Box<[Cell]>,
    done: Mutex<Vec<(u32, i64)>>,
    efd: OwnedFd,
}

// SAFETY: `Cell::owner` points to the `Inner` that holds the cell (set once at creation, only
// dereferenced while a strong count is held); everything mutable is behind the mutex or is the
// kernel's (the eventfd).
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Inner {
    fn push(&self, token: u32, result: i64) {
        let first = {
            let mut d = self.done.lock().unwrap_or_else(PoisonError::into_inner);
            d.push((token, result));
            d.len() == 1
        };
        if first {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to an eventfd we own. A full counter
            // (EAGAIN) still leaves it readable, which is all the reader needs.
            unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }
}

extern "C" fn on_complete(c: sys::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is a `Cell` of an `Inner` kept alive by the strong count `begin` took for
    // this operation, released below after the last use.
    let cell = unsafe { &*(arg as *const Cell) };
    // SAFETY: `c` is this operation's completion, finished (we are its callback); released
    // once here and never used again (QEMU's block/rbd.c does the same in its callback).
    let ret = unsafe {
        let r = sys::rbd_aio_get_return_value(c);
        sys::rbd_aio_release(c);
        r
    };
    let owner = cell.owner;
    // SAFETY: the strong count taken in `begin` keeps `owner` alive up to the decrement.
    unsafe {
        (*owner).push(cell.token, ret as i64);
        Arc::decrement_strong_count(owner);
    }
}

/// Where the results of asynchronous image operations arrive (see the crate docs). Tokens are
/// `0..capacity`; several operations may be in flight under one token.
pub struct Completions {
    inner: Arc<Inner>,
}

impl fmt::Debug for Completions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completions")
            .field("capacity", &self.inner.cells.len())
            .finish_non_exhaustive()
    }
}

impl Completions {
    /// A table for tokens `0..capacity` and a non-blocking eventfd.
    pub fn new(capacity: u32) -> io::Result<Completions> {
        // SAFETY: plain eventfd creation; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let efd = unsafe { OwnedFd::from_raw_fd(fd) };
        let inner = Arc::new_cyclic(|weak| Inner {
            cells: (0..capacity)
                .map(|token| Cell {
                    token,
                    owner: weak.as_ptr(),
                })
                .collect(),
            done: Mutex::new(Vec::with_capacity(capacity as usize)),
            efd,
        });
        Ok(Completions { inner })
    }

    /// Readable while results wait in [`Completions::take`].
    pub fn eventfd(&self) -> BorrowedFd<'_> {
        self.inner.efd.as_fd()
    }

    /// Resets the eventfd, then moves the results that arrived into `out` (swapped: pass an
    /// empty vector and keep it for reuse). A result that arrives after the reset signals again.
    pub fn take(&self, out: &mut Vec<(u32, i64)>) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe { libc::read(self.inner.efd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        let mut d = self
            .inner
            .done
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *d, out);
    }

    /// A completion for `token`, holding a strong count of the table for its callback.
    fn begin(&self, token: u32) -> Result<sys::rbd_completion_t, i32> {
        let cell = self.inner.cells.get(token as usize).ok_or(libc::EINVAL)?;
        let mut c: sys::rbd_completion_t = ptr::null_mut();
        // SAFETY: the cell lives as long as `inner`, which the count taken below keeps alive
        // until the callback has run; `c` is a live out-pointer.
        let r = unsafe {
            sys::rbd_aio_create_completion(
                (cell as *const Cell).cast_mut().cast(),
                Some(on_complete),
                &mut c,
            )
        };
        if r < 0 {
            return Err(-r);
        }
        // SAFETY: `inner` is a live Arc; the count is given back by the callback or `submitted`.
        unsafe { Arc::increment_strong_count(Arc::as_ptr(&self.inner)) };
        Ok(c)
    }

    /// After the aio call: on failure (the operation was not started, so the callback never
    /// runs) release the completion and its count.
    fn submitted(&self, c: sys::rbd_completion_t, r: i32) -> Result<(), i32> {
        if r >= 0 {
            return Ok(());
        }
        // SAFETY: the operation was refused, so librbd holds no reference to `c`, and the count
        // `begin` took is ours to give back.
        unsafe {
            sys::rbd_aio_release(c);
            Arc::decrement_strong_count(Arc::as_ptr(&self.inner));
        }
        Err(-r)
    }
}

/// librados' version, "major.minor.extra".
pub fn rados_version() -> String {
    let (mut a, mut b, mut c) = (0, 0, 0);
    // SAFETY: three live out-pointers.
    unsafe { sys::rados_version(&mut a, &mut b, &mut c) };
    format!("{a}.{b}.{c}")
}

#[cfg(test)]
mod tests {
    use super::is_client;

    #[test]
    fn lock_owners_are_matched_by_name_or_address() {
        assert!(is_client("client.4123", "client.4123"));
        assert!(!is_client("client.41234", "client.4123"), "another id");
        assert!(is_client("127.0.0.1:0/908333599", "127.0.0.1:0/908333599"));
        assert!(is_client(
            "127.0.0.1:0/908333599",
            "v1:127.0.0.1:0/908333599"
        ));
        assert!(is_client(
            "127.0.0.1:0/908333599",
            "[v2:127.0.0.1:0/908333599,v1:127.0.0.1:0/908333599]"
        ));
        assert!(!is_client("127.0.0.1:0/908333599", "127.0.0.1:0/9083335"));
        assert!(!is_client("127.0.0.1:0/908333599", "client.4123"));
        assert!(!is_client("127.0.0.1:0/1", ""));
    }
}
