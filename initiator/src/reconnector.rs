//! [`Reconnector`]: one path whose controller has several I/O queues, each driven by a thread
//! of its own (a block device's hardware queues), brought back after a failure with the
//! path's reconnect loop.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::any_queue::AnyQueue;
use crate::cmd::NsInfo;
use crate::controller::{ConnectOptions, Controller, ControllerInfo};
use crate::error::Error;
use crate::multipath::read_ana_state;
use crate::path::{
    connect_path, first_path, one_host, reconnect_any, Budget, Connected, Link, PathInfo,
    PathMonitor, PathState, PathStats, PathStatus, ReconnectPolicy, Shared,
};

/// A controller with several I/O queues that comes back when its connection fails.
///
/// [`Reconnector::connect`] connects once (no retry: a first connection that fails is a
/// configuration problem) with `opts.queues` I/O queues and hands them out. A queue's owner
/// whose queue failed calls [`Reconnector::queue_again`] with the generation its queue came
/// from: the first to ask drops the dead controller and reconnects with the backoff of the
/// [`ReconnectPolicy`] (the same loop, identity check and counters as a reconnecting
/// [`crate::Namespace`]), the others wait for that connection; each gets a queue of the new
/// one. Past the policy's bound every caller gets [`Error::ReconnectGaveUp`] (a later call
/// tries again). The owner keeps its commands meanwhile and submits them again on the new
/// queue: a block device built on this stalls through a target restart instead of failing.
pub struct Reconnector {
    /// One per path, in the order given.
    links: Vec<Link>,
    shared: Arc<Shared>,
    state: Mutex<State>,
    cv: Condvar,
}

struct State {
    /// Connection number: a queue handed out belongs to this one.
    gen: u64,
    ctrl: Option<Controller>,
    /// Queues of the current connection not handed out yet.
    queues: Vec<AnyQueue>,
    /// A caller is reconnecting.
    connecting: bool,
    /// The path of the current connection.
    cur: usize,
    /// Finished reconnect attempts (a waiter whose attempt ended without a connection
    /// returns `last`).
    attempts: u64,
    last: Option<Arc<Error>>,
}

impl std::fmt::Debug for Reconnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconnector")
            .field("links", &self.links)
            .field("gen", &self.lock().gen)
            .finish()
    }
}

impl Reconnector {
    /// Connect with `opts` (its `queues` I/O queues) to namespace `nsid`: the reconnector,
    /// the I/O queues (generation 0), the controller's and the namespace's facts.
    pub fn connect(
        opts: ConnectOptions,
        nsid: u32,
        policy: ReconnectPolicy,
    ) -> Result<(Reconnector, Vec<AnyQueue>, ControllerInfo, NsInfo), Error> {
        let (c, link, shared) = first_path(opts, nsid, policy)?;
        let info = c.info().clone();
        let ns = c.identity.info;
        let (ctrl, qs) = split(c);
        Ok((Self::new(vec![link], shared, ctrl, 0), qs, info, ns))
    }

    /// [`Reconnector::connect`] over several paths to one subsystem (the first path's host
    /// NQN, host ID and secrets for all; each with the first's `queues` and `queue_depth`):
    /// the connection is to one path at a time, the first (in the order given) that connects
    /// and reports the namespace ANA optimized or non-optimized; when it fails, or a queue
    /// owner asks for another because its commands met an ANA or path status, the next
    /// reconnect tries the paths in turn from the one after it. Every path must lead to the
    /// same namespace (subsystem NQN, geometry, NGUID).
    pub fn connect_paths(
        paths: Vec<ConnectOptions>,
        nsid: u32,
        policy: ReconnectPolicy,
    ) -> Result<(Reconnector, Vec<AnyQueue>, ControllerInfo, NsInfo), Error> {
        let mut paths = one_host(paths)?;
        let first = paths[0].clone();
        for p in &mut paths {
            p.queues = first.queues;
            p.queue_depth = first.queue_depth;
        }
        if paths.len() == 1 {
            return Self::connect(first, nsid, policy);
        }
        let mut why = Vec::new();
        for (k, o) in paths.iter().enumerate() {
            let c = match connect_path(o, nsid).and_then(|c| usable(c, nsid)) {
                Ok(c) => c,
                Err(e) => {
                    why.push(format!("{}:{}: {e}", o.addr, o.port));
                    continue;
                }
            };
            let mut identity = c.identity.clone();
            // The controllers of several targets may have serial numbers of their own.
            identity.serial = None;
            let mut links = Vec::new();
            let mut statuses = Vec::new();
            for (idx, p) in paths.iter().cloned().enumerate() {
                let mut st = PathStatus::new(&p);
                if idx == k {
                    st.connected(c.info().cntlid);
                }
                statuses.push(st);
                links.push(Link {
                    opts: p,
                    nsid,
                    identity: identity.clone(),
                    idx,
                });
            }
            let info = c.info().clone();
            let ns = identity.info;
            let (ctrl, qs) = split(c);
            let shared = Shared::new(statuses, policy);
            return Ok((Self::new(links, shared, ctrl, k), qs, info, ns));
        }
        Err(Error::NoUsablePath {
            what: "open",
            waited: Duration::ZERO,
            paths: why.join("; "),
        })
    }

    fn new(links: Vec<Link>, shared: Arc<Shared>, ctrl: Controller, cur: usize) -> Reconnector {
        Reconnector {
            links,
            shared,
            state: Mutex::new(State {
                gen: 0,
                ctrl: Some(ctrl),
                queues: Vec::new(),
                connecting: false,
                cur,
                attempts: 0,
                last: None,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current connection's generation.
    pub fn generation(&self) -> u64 {
        self.lock().gen
    }

    /// A queue of a connection newer than generation `failed` (the one the caller's queue
    /// came from, which failed), and its generation: the first caller reconnects, blocking
    /// for as long as the policy allows; the others wait for it.
    pub fn queue_again(&self, failed: u64) -> Result<(u64, AnyQueue), Error> {
        let mut st = self.lock();
        let seen = st.attempts;
        loop {
            if st.gen > failed {
                let gen = st.gen;
                return match st.queues.pop() {
                    Some(q) => Ok((gen, q)),
                    None => Err(Error::InvalidArgument(
                        "every queue of the new connection is taken".into(),
                    )),
                };
            }
            if st.attempts != seen {
                let cause = st.last.clone().unwrap_or_else(|| Arc::new(Error::Closed));
                return Err(Error::ReconnectGaveUp {
                    attempts: 0,
                    elapsed: Duration::ZERO,
                    cause,
                });
            }
            if self.shared.lock().stop {
                return Err(Error::Closed);
            }
            if st.connecting {
                st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            st.connecting = true;
            let old = st.ctrl.take();
            let cur = st.cur;
            st.queues.clear();
            drop(st);
            if let Some(c) = old {
                c.abandon();
            }
            {
                let mut g = self.shared.lock();
                g.paths[cur].state = PathState::Failed;
                g.paths[cur].cntlid = None;
            }
            tracing::warn!(path = %self.links[cur].label(), "connection lost or left; reconnecting");
            let mut b = Budget::start(Error::Closed);
            // One path: that one again. Several: the others first, in turn, then this one.
            let several = self.links.len() > 1;
            let nsid = self.links[cur].nsid;
            let accept = |c: &Connected| {
                if several {
                    ana_usable(c, nsid)
                } else {
                    Ok(())
                }
            };
            let r = reconnect_any(
                &self.links,
                cur + usize::from(several),
                &self.shared,
                &mut b,
                &mut |d| self.shared.sleep(d),
                &accept,
            );
            st = self.lock();
            st.connecting = false;
            st.attempts += 1;
            match r {
                Ok((idx, c)) => {
                    let cntlid = c.info().cntlid;
                    let (ctrl, qs) = split(c);
                    st.gen += 1;
                    st.ctrl = Some(ctrl);
                    st.queues = qs;
                    st.cur = idx;
                    st.last = None;
                    let mut g = self.shared.lock();
                    g.paths[idx].state = PathState::Connected;
                    g.paths[idx].cntlid = Some(cntlid);
                }
                Err(e) => st.last = Some(Arc::new(e)),
            }
            self.cv.notify_all();
            // Loop: take a queue of the new connection, or return the failure.
        }
    }

    /// The path, as [`crate::Namespace::paths`] reports it.
    pub fn paths(&self) -> Vec<PathInfo> {
        PathMonitor {
            shared: self.shared.clone(),
        }
        .paths()
    }

    /// Counters: reconnects, failed attempts, give-ups.
    pub fn stats(&self) -> PathStats {
        self.shared.lock().stats
    }

    /// Stop reconnecting: a caller waiting in [`Reconnector::queue_again`] returns (its
    /// backoff is cut short; an attempt under way finishes first).
    pub fn stop(&self) {
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
        self.cv.notify_all();
    }

    /// Shut the current controller down (CC.SHN); the queues handed out must be gone.
    pub fn shutdown(&self) -> Result<(), Error> {
        let mut st = self.lock();
        st.queues.clear();
        match st.ctrl.take() {
            Some(c) => c.shutdown(),
            None => Ok(()),
        }
    }
}

/// `c` if the namespace is ANA optimized or non-optimized through it (a controller without
/// ANA counts as optimized).
fn usable(c: Connected, nsid: u32) -> Result<Connected, Error> {
    match ana_usable(&c, nsid) {
        Ok(()) => Ok(c),
        Err(e) => {
            let _ = c.shutdown();
            Err(e)
        }
    }
}

fn ana_usable(c: &Connected, nsid: u32) -> Result<(), Error> {
    if !c.ana {
        return Ok(());
    }
    let state = read_ana_state(&c.ctrl, c.log_len, nsid, c.grpid)?;
    if state.is_usable() {
        Ok(())
    } else {
        Err(Error::Controller(format!(
            "the namespace is ANA {state} through this path"
        )))
    }
}

/// A connection's controller and every I/O queue it has.
fn split(c: Connected) -> (Controller, Vec<AnyQueue>) {
    let Connected { mut ctrl, ns, .. } = c;
    let mut qs = vec![ns.into_queue()];
    while let Some(q) = ctrl.take_queue() {
        qs.push(q);
    }
    (ctrl, qs)
}
