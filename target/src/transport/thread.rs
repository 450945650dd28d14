//! The owner's side of a poller thread, TCP or RDMA: the channel it takes messages on, the
//! eventfd that wakes it, the counters it publishes and its join handle.

use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use nix::sys::eventfd::{EfdFlags, EventFd};

/// A running poller thread taking messages `M` and publishing counters `St`.
pub struct PollerThread<M, St> {
    tx: mpsc::Sender<M>,
    wake: Arc<EventFd>,
    pub stats: Arc<St>,
    thread: Option<JoinHandle<()>>,
}

impl<M: Send + 'static, St: Default + Send + Sync + 'static> PollerThread<M, St> {
    /// Start the thread `name`. `setup` runs on it with the receiving end of the message
    /// channel, the wake eventfd and the counters, and returns the loop to run there. Returns
    /// once `setup` has succeeded, or with its error (`what` names the thread in the error when
    /// it dies before answering).
    pub fn spawn<F, R>(name: String, what: &str, setup: F) -> std::io::Result<Self>
    where
        F: FnOnce(mpsc::Receiver<M>, Arc<EventFd>, Arc<St>) -> std::io::Result<R> + Send + 'static,
        R: FnOnce(),
    {
        let (tx, rx) = mpsc::channel();
        let wake = Arc::new(EventFd::from_flags(
            EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC,
        )?);
        let stats = Arc::new(St::default());
        let (w2, s2) = (wake.clone(), stats.clone());
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread =
            std::thread::Builder::new()
                .name(name)
                .spawn(move || match setup(rx, w2, s2) {
                    Ok(run) => {
                        let _ = ready_tx.send(Ok(()));
                        run();
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                })?;
        ready_rx
            .recv()
            .map_err(|_| std::io::Error::other(format!("{what} thread died during start-up")))??;
        Ok(PollerThread {
            tx,
            wake,
            stats,
            thread: Some(thread),
        })
    }
}

impl<M, St> PollerThread<M, St> {
    /// Send the thread a message and wake it; false if it is gone.
    pub fn send(&self, m: M) -> bool {
        let ok = self.tx.send(m).is_ok();
        self.wake();
        ok
    }

    /// Wake the thread (to see a stop flag, or a message sent another way).
    pub fn wake(&self) {
        let _ = self.wake.write(1);
    }

    pub fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
