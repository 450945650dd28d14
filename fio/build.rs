//! Compiles the C half of the engine (`src/engine.c`: fio's `ioengine_ops` and option table)
//! against the source tree of the fio it is loaded into: fio has no -dev package, so, as for
//! SPDK's fio plugin, its configured source is the header set. `scripts/fio-source.sh` (run by
//! `scripts/setup.sh`) puts Debian 12's fio 3.33 there; `NVMF_FIO_SRC` names another tree.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/engine.c");
    println!("cargo:rerun-if-env-changed=NVMF_FIO_SRC");
    let src = std::env::var_os("NVMF_FIO_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/src/fio-3.33"));
    let config = src.join("config-host.h");
    if !config.exists() || !src.join("fio.h").exists() {
        panic!(
            "\n\nnvmf-fio: no configured fio source tree at {} (fio.h and config-host.h): run \
             scripts/setup.sh (or scripts/fio-source.sh), or set NVMF_FIO_SRC to one\n\n",
            src.display()
        );
    }
    println!("cargo:rerun-if-changed={}", config.display());
    cc::Build::new()
        .file("src/engine.c")
        .include(&src)
        // fio's own flags for its objects (Makefile: CPPFLAGS, FIO_CFLAGS).
        .define("_GNU_SOURCE", None)
        .define("_LARGEFILE_SOURCE", None)
        .define("_FILE_OFFSET_BITS", "64")
        .define("FIO_INTERNAL", None)
        .define("FIO_INC_DEBUG", None)
        .flag("-std=gnu99")
        .flag("-include")
        .flag(config.to_str().expect("a UTF-8 path"))
        .warnings(false)
        .compile("nvmf_fio_engine");
}
