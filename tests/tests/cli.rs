//! The `nvmf-target` command line: configuration errors carry file:line:column and stop the
//! daemon before it starts; `--check-config` prints the resolved configuration.

use std::process::Command;

use nvmf_tests::{target_bin, TempDir};

#[test]
fn bad_config_names_file_line_column_and_does_not_start() {
    let d = TempDir::new("cli");
    let cfg = d.0.join("bad.yaml");
    std::fs::write(
        &cfg,
        "listeners:\n  - { transport: tcp, address: 127.0.0.1, port: 4420 }\n\
         subsystems:\n  - nqn: nqn.2026-11.io.example:a\n    allow_any_host: true\n    namespaces:\n\
         \x20     - { nsid: 1, null: 1GiB }\n      - { nsid: 1, null: 1GiB }\n",
    )
    .unwrap();
    for flag in ["--config", "--check-config"] {
        let out = Command::new(target_bin())
            .arg(flag)
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        let want = format!("{}:8:", cfg.display());
        assert!(err.contains(&want), "{flag}: expected '{want}…' in:\n{err}");
        assert!(err.contains("nsid"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn check_config_prints_the_resolved_configuration() {
    let d = TempDir::new("cli");
    let cfg = d.0.join("ok.yaml");
    std::fs::write(
        &cfg,
        "listeners:\n  - { transport: tcp, address: 127.0.0.1 }\n\
         subsystems:\n  - nqn: nqn.2026-11.io.example:a\n    allow_any_host: true\n    namespaces:\n\
         \x20     - { nsid: 1, null: 1GiB }\n",
    )
    .unwrap();
    let out = Command::new(target_bin())
        .arg("--check-config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // Defaults are filled in.
    for key in [
        "port: 4420",
        "max_queue_depth",
        "in_capsule_data",
        "keep_alive_ms_min",
        "serial",
    ] {
        assert!(text.contains(key), "{key} missing from:\n{text}");
    }
}

/// `nvmf-target import-nvmetcli FILE`: the YAML on standard output (loadable by
/// `--check-config` once the storage exists), every attribute it cannot carry over on standard
/// error; a file that is not an nvmetcli save fails with exit status 2 and says why.
#[test]
fn import_nvmetcli_prints_yaml_and_names_what_it_drops() {
    let d = TempDir::new("cli");
    let saved = include_str!("../../config/tests/data/nvmetcli/linux-6.1-rxe.json");
    for f in ["file-ns.img", "file-ns2.img", "ram0"] {
        std::fs::File::create(d.0.join(f))
            .and_then(|f| f.set_len(1 << 20))
            .unwrap();
    }
    let json = saved
        .replace(
            "/tmp/vm-scratch/nvmetcli-save-rdma-rxe.CkBtiZ",
            d.0.to_str().unwrap(),
        )
        .replace("/dev/ram0", d.0.join("ram0").to_str().unwrap());
    let file = d.0.join("saved.json");
    std::fs::write(&file, json).unwrap();
    let out = Command::new(target_bin())
        .arg("import-nvmetcli")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not carried over: port 3"), "{err}");
    let yaml = d.0.join("imported.yaml");
    std::fs::write(&yaml, &out.stdout).unwrap();
    let check = Command::new(target_bin())
        .arg("--check-config")
        .arg(&yaml)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&check.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    std::fs::write(&file, "not json").unwrap();
    let bad = Command::new(target_bin())
        .arg("import-nvmetcli")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not JSON"));
}
