//! The YAML configuration (`config::Config::from_yaml_str`).
//!
//! Invariants: any text gives a configuration or diagnostics, never a panic; every
//! diagnostic names the origin and a line/column inside the text; an accepted configuration
//! printed with `to_yaml` reads back equal (the resolved configuration is a fixed point).
#![no_main]

use config::{Config, ConfigError};
use libfuzzer_sys::fuzz_target;

/// (line, column) just after the last character; YAML line breaks are LF, CRLF and CR.
fn end_of(text: &str) -> (usize, usize) {
    let t = text.replace("\r\n", "\n").replace('\r', "\n");
    let last = t.rsplit('\n').next().unwrap_or("");
    (t.matches('\n').count() + 1, last.chars().count() + 1)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_yaml_str(text, "fuzz.yaml") {
        Ok(loaded) => {
            let yaml = loaded.config.to_yaml();
            match Config::from_yaml_str(&yaml, "resolved.yaml") {
                Ok(again) => assert_eq!(again.config, loaded.config, "resolved YAML:\n{yaml}"),
                Err(e) => panic!("resolved configuration rejected: {e}\n{yaml}"),
            }
        }
        Err(ConfigError::Invalid { errors, warnings }) => {
            assert!(!errors.is_empty());
            let end = end_of(text);
            for d in errors.iter().chain(&warnings) {
                let shown = d.to_string();
                assert!(shown.starts_with("fuzz.yaml"), "{shown}");
                if let Some(at) = d.location {
                    assert!(at.line >= 1 && at.column >= 1, "{shown}");
                    assert!(
                        (at.line, at.column) <= end,
                        "{shown} (text ends at {end:?})"
                    );
                }
            }
        }
        Err(e) => panic!("from_yaml_str gave {e}"),
    }
});
