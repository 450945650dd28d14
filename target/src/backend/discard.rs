//! Deallocate on block devices. BLKDISCARD is a blocking ioctl and io_uring has no discard
//! before Linux 6.12 (its block `uring_cmd`), so a ring hands discards to a helper thread of
//! its own, started on the first one, and learns of their completion from an eventfd that it
//! polls in the ring itself (one POLL_ADD while discards are outstanding): the poller thread
//! never blocks and never sleeps past a finished discard.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

use super::sys;

/// One Deallocate command for the helper: its byte ranges on one block device.
pub(crate) struct Job {
    /// The ring's operation slot, handed back with the result.
    pub slot: u32,
    /// The device, open for writing (a reference of its own, so a reload that closes the
    /// namespace cannot turn the descriptor into another file's while the job waits).
    pub file: Arc<File>,
    /// (offset, length) in bytes, none empty.
    pub ranges: Vec<(u64, u64)>,
}

/// Finished jobs: (slot, result), the errno of the first range that failed.
type Done = Vec<(u32, Result<(), i32>)>;

/// A ring's discard helper thread. Dropping it lets the thread finish the job at hand and exit.
pub(crate) struct Discarder {
    tx: mpsc::Sender<Job>,
    done: Arc<Mutex<Done>>,
    efd: Arc<OwnedFd>,
}

impl Discarder {
    pub(crate) fn new() -> io::Result<Discarder> {
        let efd = Arc::new(sys::eventfd()?);
        let done: Arc<Mutex<Done>> = Arc::default();
        let (tx, rx) = mpsc::channel::<Job>();
        let (efd2, done2) = (Arc::clone(&efd), Arc::clone(&done));
        std::thread::Builder::new()
            .name("nvmf-discard".into())
            .spawn(move || {
                for job in rx {
                    let mut result = Ok(());
                    for &(offset, len) in &job.ranges {
                        if let Err(errno) = sys::blkdiscard(job.file.as_fd(), offset, len) {
                            result = Err(errno);
                            break;
                        }
                    }
                    done2
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((job.slot, result));
                    sys::eventfd_signal(efd2.as_fd());
                }
            })?;
        Ok(Discarder { tx, done, efd })
    }

    /// Queues a job; `false` if the helper thread is gone (it never exits while `self` lives,
    /// short of a panic).
    pub(crate) fn send(&self, job: Job) -> bool {
        self.tx.send(job).is_ok()
    }

    /// The eventfd the helper signals after each finished job.
    pub(crate) fn eventfd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }

    /// Resets the eventfd, then moves the finished jobs into `out` (in that order, so a job
    /// finished after the reset signals the eventfd again).
    pub(crate) fn take_done(&self, out: &mut Done) {
        sys::eventfd_drain(self.efd.as_fd());
        let mut d = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *d, out);
    }
}
