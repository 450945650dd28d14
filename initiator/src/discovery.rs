//! Discovery (`nvme discover`): connect to the discovery controller and read the Discovery Log
//! Page as libnvme's `nvme_discovery_log` does.

use std::time::Duration;

use nvme::fabrics::{self, reg, PropSize};
use nvme::log::{lid, DiscoveryLogEntry, DiscoveryLogHeader};

use crate::auth::TxnIds;
use crate::cmd::DataRef;
use crate::controller::{
    connect_admin, enable, get_log, resolve, shutdown_ctrl, text, ConnectOptions,
};
use crate::error::Error;

/// Attempts at reading a stable log (the generation counter changed in between).
const MAX_RETRIES: usize = 10;
/// Log reads go in 4 KiB pieces, within any MDTS (the smallest MDTS is one 4 KiB page), so the
/// discovery controller's Identify need not be read.
const LOG_CHUNK: u32 = 4096;

/// One Discovery Log Page entry, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type (`nvme::log::trtype`: 1 RDMA, 3 TCP).
    pub trtype: u8,
    /// Address family (`nvme::log::adrfam`: 1 IPv4, 2 IPv6).
    pub adrfam: u8,
    /// Subsystem type (`nvme::log::subtype`: 2 NVM, 3 current discovery, 1 referral).
    pub subtype: u8,
    /// Transport requirements (`nvme::log::treq`).
    pub treq: u8,
    pub portid: u16,
    /// FFFFh: dynamic controller model.
    pub cntlid: u16,
    /// Admin max SQ size.
    pub asqsz: u16,
    pub eflags: u16,
    /// Transport service ID (the TCP port as text).
    pub trsvcid: String,
    /// Transport address.
    pub traddr: String,
    pub subnqn: String,
    /// Transport specific address subtype, raw.
    pub tsas: Vec<u8>,
}

impl DiscoveryEntry {
    fn from_wire(e: &DiscoveryLogEntry) -> DiscoveryEntry {
        DiscoveryEntry {
            trtype: e.trtype,
            adrfam: e.adrfam,
            subtype: e.subtype,
            treq: e.treq,
            portid: e.portid.get(),
            cntlid: e.cntlid.get(),
            asqsz: e.asqsz.get(),
            eflags: e.eflags.get(),
            trsvcid: text(&e.trsvcid),
            traddr: text(&e.traddr),
            subnqn: text(&e.subnqn),
            tsas: e.tsas.to_vec(),
        }
    }
}

/// Read the discovery log of the target at `addr:port` (NVMe/TCP), with a 10 s timeout.
///
/// ```no_run
/// for e in nvmf_initiator::discover("127.0.0.1", 4420, "nqn.2014-08.org.nvmexpress:uuid:x")? {
///     println!("{} at {}:{}", e.subnqn, e.traddr, e.trsvcid);
/// }
/// # Ok::<(), nvmf_initiator::Error>(())
/// ```
pub fn discover(addr: &str, port: u16, hostnqn: &str) -> Result<Vec<DiscoveryEntry>, Error> {
    let mut opts = ConnectOptions::tcp(addr, port, nvme::DISCOVERY_NQN);
    opts.hostnqn = hostnqn.to_string();
    opts.timeout = Duration::from_secs(10);
    discover_with(&opts)
}

/// [`discover`] with full options (`subnqn` is replaced by the discovery NQN; no I/O queues
/// and no keep-alive are used).
pub fn discover_with(opts: &ConnectOptions) -> Result<Vec<DiscoveryEntry>, Error> {
    let mut opts = opts.clone();
    opts.subnqn = nvme::DISCOVERY_NQN.to_string();
    opts.queues = 0;
    opts.kato = Duration::ZERO;
    // A discovery controller has no data to protect (nvme-cli concatenates I/O controllers).
    opts.concat = false;
    let sa = resolve(&opts.addr, opts.port)?;
    // A discovery controller may ask for authentication too (Linux's persistent discovery
    // controllers with a key): the same path as an I/O controller's admin queue.
    let (mut q, _cntlid, _) = connect_admin(&sa, &opts, &mut TxnIds::default())?;
    enable(&mut q)?;
    let _vs = q.execute(
        "Property Get",
        fabrics::property_get_sqe(0, reg::VS, PropSize::Four),
        DataRef::None,
    )?;

    let mut hdr = [0u8; 1024];
    let mut entries = Vec::new();
    let mut stable = false;
    for _ in 0..MAX_RETRIES {
        get_log(&mut q, lid::DISCOVERY, 0, 0, &mut hdr, LOG_CHUNK, true)?;
        let h = DiscoveryLogHeader::decode(&hdr).expect("1024 bytes");
        let genctr = h.genctr.get();
        let numrec = h.numrec.get();
        // A target that claims more than a few thousand records is broken; refuse to allocate
        // gigabytes on its word.
        if numrec > 4096 {
            return Err(Error::Controller(format!(
                "discovery log claims {numrec} records"
            )));
        }
        let mut raw = vec![0u8; numrec as usize * 1024];
        get_log(&mut q, lid::DISCOVERY, 0, 1024, &mut raw, LOG_CHUNK, true)?;
        // Header again with RAE cleared: the log is consistent if the counter did not move.
        get_log(&mut q, lid::DISCOVERY, 0, 0, &mut hdr, LOG_CHUNK, false)?;
        let h2 = DiscoveryLogHeader::decode(&hdr).expect("1024 bytes");
        if h2.genctr.get() == genctr {
            entries = raw
                .chunks_exact(1024)
                .map(|c| {
                    DiscoveryEntry::from_wire(&DiscoveryLogEntry::decode(c).expect("1024 bytes"))
                })
                .collect();
            stable = true;
            break;
        }
    }
    let _ = shutdown_ctrl(&mut q, Duration::from_secs(2));
    if !stable {
        return Err(Error::Controller(
            "discovery log generation counter kept changing".into(),
        ));
    }
    Ok(entries)
}
