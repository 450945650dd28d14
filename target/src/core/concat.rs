//! Secure channel concatenation (NVMe Base 2.1, 8.3.4.5.9; NVMe/TCP 1.1, 3.6.1.4): the
//! DH-HMAC-CHAP transaction on a plain NVMe/TCP admin queue negotiates a TLS PSK (SC_C
//! NEWTLSPSK in the Negotiate), the host then connects again over TLS with it (identity
//! `NVMe1GHH <hostnqn> <subnqn> <digest>`, `nvme::tls::PskIdentity::generated`), the admin
//! queue and every I/O queue. Queues over a generated PSK are not authenticated again (the key
//! came from an authentication; nvmet does the same); REPLACETLSPSK in a re-authentication on
//! such an admin queue generates a successor and retires the key it replaces.
//!
//! The keys are the target's, not a controller's: the plain admin queue that made one goes
//! away before the host comes back over TLS. A key is found for [`KEY_LIFETIME`] (the Linux
//! keyring's timeout for them) and only while the host still has DH-HMAC-CHAP keys in the
//! subsystem; a restart forgets them all (the host then concatenates again, as it does on any
//! reconnect).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nvme::auth::{secp, HashId};
use nvme::tls::PskIdentity;
use zeroize::Zeroizing;

use super::controller::Controller;
use super::{Queue, TrType};

/// How long a generated PSK takes new connections.
pub(crate) const KEY_LIFETIME: Duration = Duration::from_secs(3600);

/// At most this many generated keys are kept (the oldest goes first).
const MAX_KEYS: usize = 4096;

/// The generated TLS PSKs by identity.
#[derive(Default)]
pub(crate) struct GeneratedPsks {
    keys: HashMap<String, (Zeroizing<Vec<u8>>, Instant)>,
}

impl GeneratedPsks {
    fn insert(&mut self, id: &PskIdentity, tls_psk: Zeroizing<Vec<u8>>, now: Instant) {
        self.keys
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < KEY_LIFETIME);
        if self.keys.len() >= MAX_KEYS {
            if let Some(oldest) = (self.keys.iter())
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone())
            {
                self.keys.remove(&oldest);
            }
        }
        self.keys.insert(id.to_string(), (tls_psk, now));
    }

    fn remove(&mut self, id: &PskIdentity) -> bool {
        self.keys.remove(&id.to_string()).is_some()
    }

    /// The TLS PSK of a generated identity, while it lives.
    pub(crate) fn get(&self, id: &PskIdentity, now: Instant) -> Option<Zeroizing<Vec<u8>>> {
        self.keys
            .get(&id.to_string())
            .filter(|(_, at)| now.saturating_duration_since(*at) < KEY_LIFETIME)
            .map(|(k, _)| k.clone())
    }
}

impl Queue {
    /// The SC_C a Negotiate on this queue may carry besides none: a new PSK on a plain NVMe/TCP
    /// admin queue that came through a listener with `tls` (where the host comes back over
    /// TLS), a replacement on an admin queue over a generated PSK.
    pub(super) fn concat_allowed(&self) -> u8 {
        if self.qid != 0
            || self.caps.trtype != TrType::Tcp
            || self.listener().is_none_or(|l| l.tls.is_none())
        {
            return secp::NOSC;
        }
        match &self.tls {
            None => secp::NEWTLSPSK,
            Some(id) if id.generated => secp::REPLACETLSPSK,
            Some(_) => secp::NOSC,
        }
    }

    /// Whether this queue's channel is keyed by a generated PSK.
    pub(super) fn over_generated_psk(&self) -> bool {
        self.tls.as_ref().is_some_and(|id| id.generated)
    }

    /// A transaction with concatenation succeeded: keep its key for the host's TLS
    /// connections (retiring the one it replaces), and the controller's I/O queues must come
    /// over TLS.
    pub(super) fn concat_done(
        &mut self,
        ctrl: &Controller,
        sc_c: u8,
        hash: HashId,
        psk: &[u8],
        now: Instant,
    ) {
        let id = PskIdentity::generated(hash, &ctrl.hostnqn, &ctrl.subsys.nqn, psk);
        let tls_psk = id.tls_psk(psk);
        let inner = self.target.inner();
        let mut keys = inner.generated_psks();
        let replaced = match (&self.tls, sc_c) {
            (Some(old), secp::REPLACETLSPSK) => keys.remove(old),
            _ => false,
        };
        keys.insert(&id, tls_psk, now);
        drop(keys);
        ctrl.require_tls_io();
        // The identity names the key (its digest is a MAC of it), it is not the key.
        tracing::info!(cntlid = ctrl.cntlid, qid = self.qid, host = %ctrl.hostnqn,
            subsys = %ctrl.subsys.nqn, peer = %self.peer, identity = %id, replaced,
            "secure channel concatenation: TLS PSK generated");
    }
}
