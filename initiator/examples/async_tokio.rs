//! The async API on tokio: eight 4 KiB writes in flight at once on one queue, then the reads.
//!
//!     cargo run -p nvmf-initiator --example async_tokio -- 127.0.0.1 4420 nqn.2026-11.io.nvmf-rs:default
//!
//! The library itself has no runtime dependency: its futures run on any executor.

use nvmf_initiator::{AsyncQueue, ConnectOptions, Controller, Error};

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (addr, port, nqn) = match &args[..] {
        [a, p, n] => (a.as_str(), p.parse().expect("a port number"), n.as_str()),
        _ => ("127.0.0.1", 4420, "nqn.2026-11.io.nvmf-rs:default"),
    };
    let mut ctrl = Controller::connect(ConnectOptions::tcp(addr, port, nqn))?;
    let ns = ctrl.namespaces()[0];
    let q = AsyncQueue::new(ctrl.take_io_queue().expect("an I/O queue"))?;
    let blocks = u64::from(4096 / ns.block_size.min(4096));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..8u64 {
            set.spawn(q.write(&ns, i * blocks, vec![i as u8; 4096]));
        }
        while let Some(r) = set.join_next().await {
            r.expect("the task ran")?;
        }
        for i in 0..8u64 {
            let buf = q
                .read(&ns, i * blocks, vec![0u8; 4096])
                .await?
                .expect("the buffer");
            assert!(buf.iter().all(|&b| b == i as u8));
        }
        println!("8 writes in flight at once, read back");
        Ok(())
    })
}
