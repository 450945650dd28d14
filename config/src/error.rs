//! Diagnostics (errors and warnings) and the error type of this crate.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::PathBuf;

pub use crate::yaml::Location;

/// How bad a [`Diagnostic`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The configuration is rejected.
    Error,
    /// The configuration is accepted, but probably not what was meant.
    Warning,
}

/// One problem found in a configuration, with where it was written.
///
/// Displays as `FILE:LINE:COLUMN: PATH: MESSAGE` (warnings insert `warning: ` before the path),
/// for example `target.yaml:7:15: subsystems[0].namespaces[1].nsid: duplicate nsid 1 (first
/// used at line 5)`. The location is absent only for configurations that were not read from
/// text (see [`crate::Config::validate`]); the display is then `ORIGIN: PATH: MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// The file name (or the name given to [`crate::Config::from_yaml_str`]).
    pub origin: String,
    /// Where in the text; `None` for configurations built in code.
    pub location: Option<Location>,
    /// The key path of the offending value, e.g. `subsystems[0].namespaces[1].nsid`; empty for
    /// the document as a whole.
    pub path: String,
    /// What is wrong, in one sentence.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.origin)?;
        if let Some(at) = self.location {
            write!(f, "{}:{}:", at.line, at.column)?;
        }
        if self.severity == Severity::Warning {
            write!(f, " warning:")?;
        }
        if !self.path.is_empty() {
            write!(f, " {}:", self.path)?;
        }
        write!(f, " {}", self.message)
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read the configuration: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The text was read but is not a valid configuration. `errors` holds every problem found
    /// (never empty), sorted by position; `warnings` those that would not have been fatal.
    #[error("{}", Lines(errors))]
    Invalid {
        /// Every error, in document order.
        errors: Vec<Diagnostic>,
        /// Every warning, in document order.
        warnings: Vec<Diagnostic>,
    },
}

impl ConfigError {
    /// The errors (for [`ConfigError::Read`], none: its message has no position).
    pub fn errors(&self) -> &[Diagnostic] {
        match self {
            ConfigError::Invalid { errors, .. } => errors,
            ConfigError::Read { .. } => &[],
        }
    }
}

/// Displays diagnostics one per line.
struct Lines<'a>(&'a [Diagnostic]);

impl fmt::Display for Lines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// Collects diagnostics while decoding and validating; knows where each key path was written.
pub(crate) struct Report {
    origin: String,
    /// Position of the value at each key path that appeared in the text.
    spans: HashMap<String, Location>,
    pub errors: Vec<Diagnostic>,
    pub warnings: Vec<Diagnostic>,
}

impl Report {
    pub fn new(origin: &str) -> Report {
        Report {
            origin: origin.to_owned(),
            spans: HashMap::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }

    pub fn record(&mut self, path: &str, at: Location) {
        self.spans.insert(path.to_owned(), at);
    }

    /// Where `path` was written; a key that was left out (a default) points at the nearest
    /// enclosing item that was written.
    pub fn locate(&self, path: &str) -> Option<Location> {
        let mut p = path;
        loop {
            if let Some(at) = self.spans.get(p) {
                return Some(*at);
            }
            if p.is_empty() {
                return None;
            }
            p = &p[..p.rfind(['.', '[']).unwrap_or(0)];
        }
    }

    /// Line of `path`, for "first defined at line N" messages (0 when unknown).
    pub fn line_of(&self, path: &str) -> String {
        match self.locate(path) {
            Some(at) => format!("line {}", at.line),
            None => path.to_owned(),
        }
    }

    fn diagnostic(
        &self,
        severity: Severity,
        at: Option<Location>,
        path: &str,
        message: String,
    ) -> Diagnostic {
        Diagnostic {
            severity,
            origin: self.origin.clone(),
            location: at,
            path: path.to_owned(),
            message,
        }
    }

    /// An error at the position of `path`.
    pub fn error(&mut self, path: &str, message: impl Into<String>) {
        let at = self.locate(path);
        self.errors
            .push(self.diagnostic(Severity::Error, at, path, message.into()));
    }

    /// Whether an error was reported for exactly `path` (to avoid warnings that follow from it).
    pub fn failed(&self, path: &str) -> bool {
        self.errors.iter().any(|d| d.path == path)
    }

    /// An error at an explicit position (unknown keys, missing keys, bad types).
    pub fn error_at(&mut self, at: Location, path: &str, message: impl Into<String>) {
        self.errors
            .push(self.diagnostic(Severity::Error, Some(at), path, message.into()));
    }

    /// A warning at the position of `path`.
    pub fn warn(&mut self, path: &str, message: impl Into<String>) {
        let at = self.locate(path);
        self.warnings
            .push(self.diagnostic(Severity::Warning, at, path, message.into()));
    }

    /// Sorts both lists by position (stable: equal positions keep the order found).
    pub fn finish(mut self) -> (Vec<Diagnostic>, Vec<Diagnostic>) {
        self.errors.sort_by_key(|d| d.location);
        self.warnings.sort_by_key(|d| d.location);
        (self.errors, self.warnings)
    }
}

/// `parent.key`, or `key` at the top.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_formats() {
        let mut d = Diagnostic {
            severity: Severity::Error,
            origin: "t.yaml".into(),
            location: Some(Location {
                line: 7,
                column: 15,
            }),
            path: "subsystems[0].namespaces[1].nsid".into(),
            message: "duplicate nsid 1".into(),
        };
        assert_eq!(
            d.to_string(),
            "t.yaml:7:15: subsystems[0].namespaces[1].nsid: duplicate nsid 1"
        );
        d.severity = Severity::Warning;
        d.path.clear();
        assert_eq!(d.to_string(), "t.yaml:7:15: warning: duplicate nsid 1");
        d.location = None;
        assert_eq!(d.to_string(), "t.yaml: warning: duplicate nsid 1");
    }

    #[test]
    fn locate_falls_back_to_enclosing_item() {
        let mut r = Report::new("x");
        r.record("subsystems[0]", Location { line: 3, column: 5 });
        r.record(
            "subsystems[0].nqn",
            Location {
                line: 3,
                column: 10,
            },
        );
        assert_eq!(
            r.locate("subsystems[0].nqn"),
            Some(Location {
                line: 3,
                column: 10
            })
        );
        assert_eq!(
            r.locate("subsystems[0].serial"),
            Some(Location { line: 3, column: 5 })
        );
        assert_eq!(
            r.locate("subsystems[0].namespaces[2].nsid"),
            Some(Location { line: 3, column: 5 })
        );
        assert_eq!(r.locate("listeners[0]"), None);
        r.record("", Location { line: 1, column: 1 });
        assert_eq!(
            r.locate("listeners[0]"),
            Some(Location { line: 1, column: 1 })
        );
    }
}
