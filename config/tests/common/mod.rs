//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use nvmf_config::{Config, ConfigError, Loaded};

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("nvmf-config-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The directory as a string, for splicing into YAML.
    pub fn str(&self) -> &str {
        self.0.to_str().expect("temp dir path is UTF-8")
    }

    /// Creates `name` in the directory with `len` bytes (sparse) and returns its path.
    pub fn file(&self, name: &str, len: u64) -> PathBuf {
        let p = self.0.join(name);
        let f = std::fs::File::create(&p).expect("create file");
        f.set_len(len).expect("set_len");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Parses `text`, which must be valid; panics with the diagnostics otherwise.
pub fn ok(text: &str) -> Loaded {
    match Config::from_yaml_str(text, "t.yaml") {
        Ok(loaded) => loaded,
        Err(e) => panic!("expected a valid configuration, got:\n{e}\n--- text:\n{text}"),
    }
}

/// Parses `text`, which must be invalid; returns each error as displayed.
pub fn errors(text: &str) -> Vec<String> {
    match Config::from_yaml_str(text, "t.yaml") {
        Ok(_) => panic!("expected errors, the configuration was accepted:\n{text}"),
        Err(ConfigError::Invalid { errors, .. }) => {
            assert!(!errors.is_empty(), "Invalid with no errors");
            errors.iter().map(ToString::to_string).collect()
        }
        Err(e) => panic!("unexpected error kind: {e}"),
    }
}

/// The warnings of a valid `text`, as displayed.
pub fn warnings(text: &str) -> Vec<String> {
    ok(text).warnings.iter().map(ToString::to_string).collect()
}
