//! Where reservations persist through power loss: a file next to each writable file namespace
//! (`<image>.nvmf-resv`), replaced crash-safely (written and fsynced under a temporary name,
//! renamed over the old one, the directory fsynced). Block devices and null namespaces cannot
//! persist (RESCAP.PTPLC clear there).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};

use crate::backend::{Device, DeviceKind};
use crate::core::ResvStore;

/// The state files of the namespaces that can persist, by (subsystem NQN, NSID).
#[derive(Debug, Default)]
pub struct FileResvStore {
    files: RwLock<HashMap<(String, u32), PathBuf>>,
}

/// The state file of a namespace backed by `d`, if it can have one.
pub fn state_file(d: &Device) -> Option<PathBuf> {
    if d.kind() != DeviceKind::File || d.is_read_only() {
        return None;
    }
    let mut p = OsString::from(d.path()?.as_os_str());
    p.push(".nvmf-resv");
    Some(PathBuf::from(p))
}

impl FileResvStore {
    /// Replaces the namespace -> state file table (at start and before a reload reaches the
    /// core, so namespaces the reload creates find their files).
    pub fn set(&self, files: HashMap<(String, u32), PathBuf>) {
        *self.files.write().unwrap_or_else(PoisonError::into_inner) = files;
    }

    fn file(&self, subnqn: &str, nsid: u32) -> Option<PathBuf> {
        self.files
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(subnqn.to_owned(), nsid))
            .cloned()
    }
}

impl ResvStore for FileResvStore {
    fn capable(&self, subnqn: &str, nsid: u32) -> bool {
        self.file(subnqn, nsid).is_some()
    }

    fn load(&self, subnqn: &str, nsid: u32) -> Option<Vec<u8>> {
        let p = self.file(subnqn, nsid)?;
        match fs::read(&p) {
            Ok(b) => {
                tracing::info!(path = %p.display(), subnqn, nsid, "reservation state restored (PTPL)");
                Some(b)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::error!(path = %p.display(), error = %e, "cannot read the reservation state");
                None
            }
        }
    }

    fn save(&self, subnqn: &str, nsid: u32, state: Option<&[u8]>) -> io::Result<()> {
        let p = self
            .file(subnqn, nsid)
            .ok_or_else(|| io::Error::from(io::ErrorKind::Unsupported))?;
        match state {
            Some(b) => replace(&p, b),
            None => match fs::remove_file(&p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => sync_dir(&p),
            },
        }
    }
}

/// Writes `bytes` to `path` so that a crash leaves the old or the new contents, never a mix:
/// written and fsynced under `<path>.tmp`, renamed over `path`, the directory fsynced.
pub(crate) fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = OsString::from(path.as_os_str());
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)?;
    sync_dir(path)
}

fn sync_dir(path: &Path) -> io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => File::open(d)?.sync_all(),
        None => File::open(".")?.sync_all(),
    }
}
