//! Proves the target makes no heap allocation per I/O on its data path through a transport:
//! the daemon runs in this process, a host built from the initiator library connects to it
//! over NVMe/TCP (loopback) or NVMe/RDMA (a real rxe/siw device, in the test VM), and after a
//! warm-up, rounds of reads and writes (4 KiB in-capsule and 128 KiB through R2T / RDMA READ,
//! at queue depth 32, 8 and 1), Flush, Write Zeroes, Dataset Management and Keep Alive, on a
//! file-backed and a null namespace, make no allocation on the daemon's poller threads (the
//! counting allocator of `common/`, which attributes allocations to threads by name). The
//! window lasts at least two seconds, so the pollers' periodic work (the 50 ms tick: stats,
//! keep-alive timers, publishing) runs in it dozens of times.
//!
//! The same window checks the host side: the initiator's submit/reap path (the rounds' I/O,
//! buffers taken from and returned to the test's pools, on the test's own thread) makes no
//! allocation either, over both transports.
//!
//! `NVMF_TEST_ALLOC_BACKTRACE=1` prints the backtrace of each allocation it counts on a poller.
//!
//! What it does not see: memory the C libraries allocate with `malloc` themselves (libibverbs,
//! the kernel), which does not go through Rust's global allocator.
//!
//! The RDMA test needs a real RDMA device: it runs in the VM's `rdma-wire-*` scenarios with
//! `NVMF_TEST_RDMA_IP` set (`RXE_IP`, `SIW_IP` otherwise); without one it prints "skipped: no
//! RDMA device" and passes, unless `NVMF_REQUIRE_RDMA=1`.

mod common;
#[path = "common/rdma.rs"]
mod rdma_common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::poller_allocs;
use initiator::{Completion, ConnectOptions, Controller, Data, Link, NsInfo, Queue, TypedQueue};
use nvme::opcode::io;
use nvme::Sqe;
use nvmf_target::daemon::Daemon;

const SUBNQN: &str = "nqn.2026-11.io.nvmf-rs:transport-alloc";
const SMALL: usize = 4096;
const BIG: usize = 128 * 1024;
const TIMEOUT: Duration = Duration::from_secs(20);
/// The shortest measured window (many poller ticks).
const WINDOW: Duration = Duration::from_secs(2);
const MIN_ROUNDS: u64 = 20;

struct Setup {
    daemon: Option<Daemon>,
    dir: std::path::PathBuf,
}

impl Setup {
    fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("running")
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // Stop the pollers: the next test counts this process's poller threads.
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The daemon with one listener (`listener` is its YAML flow mapping), a 16 MiB file namespace
/// (nsid 1) and a 1 GiB null namespace (nsid 2), two poller threads.
fn start(listener: &str, extra: &str) -> Setup {
    let dir = std::env::temp_dir().join(format!("nvmf-transport-alloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = format!(
        "listeners:\n  - {listener}\n\
         subsystems:\n  - nqn: {SUBNQN}\n    allow_any_host: true\n    namespaces:\n      \
         - {{ nsid: 1, path: {}, size: 16MiB, block_size: 4096 }}\n      \
         - {{ nsid: 2, null: 1GiB }}\n\
         target:\n  threads: 2\n  in_capsule_data: 8192\n  max_queue_depth: 128\n{extra}",
        dir.join("ns1.img").display(),
    );
    let cfg = config::Config::from_yaml_str(&yaml, "transport_alloc test")
        .unwrap()
        .config;
    let daemon = Daemon::start(&cfg).expect("daemon starts");
    Setup {
        daemon: Some(daemon),
        dir,
    }
}

/// Submit `n` commands made by `cmd(i, buf)` at once (queue depth `n`), wait for them all,
/// check every one succeeded and hand each completion to `check`; the buffers go back to
/// `pool`.
fn batch<L: Link>(
    q: &mut Queue<L>,
    pool: &mut Vec<L::Buf>,
    done: &mut Vec<Completion<L::Buf>>,
    n: usize,
    mut cmd: impl FnMut(&mut Queue<L>, usize, L::Buf),
    mut check: impl FnMut(&Completion<L::Buf>),
) -> u64 {
    for i in 0..n {
        let buf = pool.pop().expect("enough buffers");
        cmd(q, i, buf);
    }
    done.clear();
    while done.len() < n {
        q.reap(done, n - done.len(), Some(TIMEOUT)).expect("reap");
    }
    for c in done.drain(..) {
        if let Err(e) = &c.result {
            panic!("command {} failed: {e}", c.user_data);
        }
        check(&c);
        pool.extend(c.buf);
    }
    n as u64
}

/// The names of this process's poller threads (`nvmf-poller-N`, and any `nvmf-rdma-N` a
/// per-transport poller would have), sorted.
fn poller_threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| {
            ["nvmf-poller-", "nvmf-rdma-"].iter().any(|p| {
                n.strip_prefix(p)
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .collect();
    names.sort();
    names
}

/// A byte pattern that differs per block and per round.
fn pattern(round: u64, lba: u64) -> u8 {
    (round.wrapping_mul(31) ^ lba.wrapping_mul(7)) as u8 | 1
}

/// `n` writes of round `r`'s pattern at blocks `lba(i)` of `ns`, then `n` reads of them that
/// check the data (`what` names the size in a failure).
#[allow(clippy::too_many_arguments)]
fn write_read<L: Link>(
    q: &mut Queue<L>,
    pool: &mut Vec<L::Buf>,
    done: &mut Vec<Completion<L::Buf>>,
    ns: &NsInfo,
    n: usize,
    lba: impl Fn(usize) -> u64,
    r: u64,
    what: &str,
) -> u64 {
    let w = batch(
        q,
        pool,
        done,
        n,
        |q, i, mut b| {
            b.fill(pattern(r, lba(i)));
            q.submit_write(ns, lba(i), b, i as u64).expect("submit");
        },
        |_| {},
    );
    w + batch(
        q,
        pool,
        done,
        n,
        |q, i, b| {
            q.submit_read(ns, lba(i), b, i as u64).expect("submit");
        },
        |c| {
            let want = pattern(r, lba(c.user_data as usize));
            let data = c.buf.as_ref().unwrap();
            assert!(data.iter().all(|&x| x == want), "{what} read data");
        },
    )
}

struct Pools<B> {
    small: Vec<B>,
    big: Vec<B>,
    /// One Dataset Management range (16 bytes).
    range: Vec<B>,
    done: Vec<Completion<B>>,
}

/// One round of mixed I/O on the file namespace `file` and the null namespace `null`; the
/// number of commands it completed. Reads check the data the round's writes put there.
fn round<L: Link>(
    q: &mut Queue<L>,
    p: &mut Pools<L::Buf>,
    file: &NsInfo,
    null: &NsInfo,
    r: u64,
) -> u64 {
    let bs = file.block_size as u64;
    let small_lbas = (file.blocks / 2).min(1024);
    let lba = |i: usize| (r * 32 + i as u64) % small_lbas;
    let big_blocks = BIG as u64 / bs;
    let big_lba = |i: usize| small_lbas + ((r * 8 + i as u64) * big_blocks) % (file.blocks / 2);
    let mut n = 0;
    let Pools {
        small,
        big,
        range,
        done,
    } = p;

    // 4 KiB writes then reads at QD32 (in-capsule data).
    n += write_read(q, small, done, file, 32, lba, r, "4k");
    // 128 KiB writes then reads at QD8 (R2T + H2C data over TCP, RDMA READ over RDMA).
    n += write_read(q, big, done, file, 8, big_lba, r, "128k");
    // The null namespace at QD32, both ways.
    n += batch(
        q,
        small,
        done,
        32,
        |q, i, b| {
            q.submit_write(null, r * 32 + i as u64, b, i as u64)
                .expect("submit");
        },
        |_| {},
    );
    n += batch(
        q,
        big,
        done,
        8,
        |q, i, b| {
            q.submit_read(null, (r * 8 + i as u64) * big_blocks, b, i as u64)
                .expect("submit");
        },
        |c| {
            assert!(
                c.buf.as_ref().unwrap().iter().all(|&x| x == 0),
                "null reads zeroes"
            )
        },
    );
    // QD1.
    for i in 0..16 {
        n += batch(
            q,
            small,
            done,
            1,
            |q, _, b| {
                q.submit_read(file, lba(i), b, i as u64).expect("submit");
            },
            |c| {
                let want = pattern(r, lba(i));
                assert!(
                    c.buf.as_ref().unwrap().iter().all(|&x| x == want),
                    "QD1 read data"
                );
            },
        );
    }
    // Flush, Write Zeroes and Dataset Management (deallocate) on blocks past the ones read.
    let spare = file.blocks - 16;
    // (Flush and Write Zeroes carry no data: their buffers are dropped, `measure` tops up.)
    n += batch(
        q,
        small,
        done,
        2,
        |q, i, b| {
            drop(b);
            if i == 0 {
                q.submit_flush(file.nsid, 0).expect("submit");
            } else {
                q.submit_write_zeroes(file, spare, 8, 1).expect("submit");
            }
        },
        |_| {},
    );
    n += batch(
        q,
        range,
        done,
        1,
        |q, _, mut b| {
            // One range: context attributes, length in blocks, starting LBA.
            b.fill(0);
            b[4..8].copy_from_slice(&8u32.to_le_bytes());
            b[8..16].copy_from_slice(&(spare + 8).to_le_bytes());
            let mut sqe = Sqe::new(io::DSM, 0);
            sqe.nsid = file.nsid.into();
            sqe.cdw10 = 0.into(); // one range
            sqe.cdw11 = 4.into(); // Attribute - Deallocate
            q.submit(sqe, Data::ToController(b), 2).expect("submit");
        },
        |_| {},
    );
    n
}

/// Connect, warm up, then measure: rounds of I/O (and a Keep Alive every few rounds) for at
/// least `WINDOW`; the daemon's pollers must allocate nothing in that time.
fn no_allocation_per_io(opts: ConnectOptions) {
    let mut ctrl = Controller::connect(opts).expect("connect");
    let nss = ctrl.namespaces().to_vec();
    let file = *nss.iter().find(|n| n.nsid == 1).expect("namespace 1");
    let null = *nss.iter().find(|n| n.nsid == 2).expect("namespace 2");
    assert!(ctrl.info().max_transfer as usize >= BIG, "MDTS >= 128 KiB");
    let queue = ctrl
        .take_queue()
        .expect("an I/O queue")
        .into_typed()
        .unwrap_or_else(|_| panic!("nothing in flight"));
    match queue {
        TypedQueue::Tcp(mut q) => measure(&mut ctrl, &mut q, &file, &null),
        TypedQueue::Rdma(mut q) => measure(&mut ctrl, &mut q, &file, &null),
    }
    ctrl.shutdown().expect("shutdown");
}

fn measure<L: Link>(ctrl: &mut Controller, q: &mut Queue<L>, file: &NsInfo, null: &NsInfo) {
    let mut p = Pools {
        small: (0..40).map(|_| q.alloc_buf(SMALL).unwrap()).collect(),
        big: (0..8).map(|_| q.alloc_buf(BIG).unwrap()).collect(),
        range: vec![q.alloc_buf(16).unwrap()],
        done: Vec::with_capacity(64),
    };
    // Warm-up: first-use paths (connection buffers growing to their steady size, lazy
    // statics) may allocate once.
    for r in 0..5 {
        round(q, &mut p, file, null, r);
        // The buffers of commands without data were dropped: top up.
        p.small.resize_with(40, || q.alloc_buf(SMALL).unwrap());
    }
    ctrl.keep_alive().expect("keep alive");

    let before = poller_allocs();
    // NVMF_TEST_ALLOC_BACKTRACE=1: print where each counted allocation comes from.
    common::trace_poller_allocs(std::env::var_os("NVMF_TEST_ALLOC_BACKTRACE").is_some());
    let t0 = Instant::now();
    let (mut rounds, mut cmds, mut host_allocs) = (0u64, 0u64, 0u64);
    while rounds < MIN_ROUNDS || t0.elapsed() < WINDOW {
        // The host's data path: this thread's allocations while the round's I/O runs (not the
        // top-up of dropped buffers or the admin queue's Keep Alive below).
        let a0 = common::allocs();
        cmds += round(q, &mut p, file, null, 5 + rounds);
        host_allocs += common::allocs() - a0;
        p.small.resize_with(40, || q.alloc_buf(SMALL).unwrap());
        rounds += 1;
        if rounds % 5 == 0 {
            ctrl.keep_alive().expect("keep alive");
            cmds += 1;
        }
    }
    let allocs = poller_allocs() - before;
    common::trace_poller_allocs(false);
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{cmds} commands in {rounds} rounds, {secs:.2} s: {allocs} heap allocations on the poller \
         threads, {host_allocs} on the host's I/O path"
    );
    assert_eq!(
        allocs, 0,
        "{allocs} heap allocations on the daemon's poller threads for {cmds} commands"
    );
    assert_eq!(
        host_allocs, 0,
        "{host_allocs} heap allocations on the initiator's I/O path for {cmds} commands"
    );
}

#[test]
fn no_heap_allocation_per_io_over_tcp() {
    // A free port (the configuration takes no port 0).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let s = start(
        &format!("{{ transport: tcp, address: 127.0.0.1, port: {port} }}"),
        "",
    );
    // `threads: 2` is two poller threads in all (each would serve RDMA too).
    assert_eq!(
        poller_threads(),
        vec!["nvmf-poller-0".to_string(), "nvmf-poller-1".to_string()]
    );
    assert_eq!(s.daemon().poller_stats().len(), 2);
    let addr = s.daemon().tcp_addrs[0];
    no_allocation_per_io(ConnectOptions::tcp(
        &addr.ip().to_string(),
        addr.port(),
        SUBNQN,
    ));
    drop(s);
}

#[test]
fn no_heap_allocation_per_io_over_rdma() {
    let Some(ip) = rdma_common::rdma_ip_or_skip() else {
        return;
    };
    let s = start(
        &format!("{{ transport: rdma, address: {ip}, port: 4435 }}"),
        &rdma_common::srq_yaml(),
    );
    assert_eq!(s.daemon().rdma_addrs, vec![SocketAddr::new(ip, 4435)]);
    assert_eq!(
        poller_threads(),
        vec!["nvmf-poller-0".to_string(), "nvmf-poller-1".to_string()],
        "RDMA runs on the same pollers, no threads of its own besides the rdma_cm thread"
    );
    no_allocation_per_io(ConnectOptions::rdma(&ip.to_string(), 4435, SUBNQN));
    rdma_common::wait_released(s.daemon());
    drop(s);
}
