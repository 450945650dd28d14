//! nvmf-bench: a fio-style benchmark for NVMe over Fabrics. Run `nvmf-bench --help`; the code
//! is in `bench/` (see `bench/mod.rs`).

mod bench;

fn main() -> std::process::ExitCode {
    bench::main()
}
