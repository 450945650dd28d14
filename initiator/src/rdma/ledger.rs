//! The bookkeeping of one NVMe/RDMA connection, without verbs: the send-queue entries the link
//! may still post, the signaled work requests and RECVs the device still owes, and per tag the
//! key its command named. [`super::queue::RdmaLink`] asks it before every post and tells it every
//! work completion and response; it answers what the verbs side must do with the command's key.
//! Everything here is plain logic, unit-tested below with every ordering of a command's work
//! completions and its response (the verbs side runs against real devices in the VM suite).

use super::queue::{BIND_FLAG, INV_FLAG, NUDGE_FLAG, RECV_FLAG};

/// What a work request was, from its `wr_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wr {
    /// A command capsule's SEND (the tag).
    Send(u16),
    /// A RECV (the index of its CQE buffer).
    Recv(u32),
    /// A memory window bind (the tag): unsignaled, reported only when it failed or was flushed.
    Bind(u16),
    /// A LOCAL_INV of the tag's window.
    Inv(u16),
    /// The zero-length RDMA WRITE that nudges an iWARP target's receive stream.
    Nudge,
}

impl Wr {
    pub(super) fn of(id: u64) -> Wr {
        let tag = (id & 0xffff) as u16;
        if id & RECV_FLAG != 0 {
            Wr::Recv((id & 0xffff_ffff) as u32)
        } else if id & NUDGE_FLAG != 0 {
            Wr::Nudge
        } else if id & BIND_FLAG != 0 {
            Wr::Bind(tag)
        } else if id & INV_FLAG != 0 {
            Wr::Inv(tag)
        } else {
            Wr::Send(tag)
        }
    }

    pub(super) fn id(self) -> u64 {
        match self {
            Wr::Send(t) => u64::from(t),
            Wr::Recv(i) => RECV_FLAG | u64::from(i),
            Wr::Bind(t) => BIND_FLAG | u64::from(t),
            Wr::Inv(t) => INV_FLAG | u64::from(t),
            Wr::Nudge => NUDGE_FLAG,
        }
    }

    /// The name error messages give the work request.
    pub(super) fn name(self) -> &'static str {
        match self {
            Wr::Send(_) => "capsule SEND",
            Wr::Recv(_) => "RECV",
            Wr::Bind(_) => "memory window bind",
            Wr::Inv(_) => "LOCAL_INV",
            Wr::Nudge => "zero-length RDMA WRITE",
        }
    }
}

/// What a tag's command in flight holds besides its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TagState {
    /// The key named in its keyed SGL (none for in-capsule or no data).
    rkey: Option<u32>,
    /// Send-queue entries its SEND's completion returns (1, or 2 after a bind).
    send_wrs: u8,
}

impl TagState {
    const IDLE: TagState = TagState {
        rkey: None,
        send_wrs: 1,
    };
}

/// What becomes of a command's key when its response arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyFate {
    /// The command named no key: it completes now.
    NoKey,
    /// The target invalidated the command's window with its response: it completes now.
    InvalidatedByTarget,
    /// A window the target did not invalidate (a plain SEND): post a LOCAL_INV of this key
    /// ([`Ledger::local_inv_posted`]); the command completes at the LOCAL_INV's completion
    /// (nvme_rdma_inv_rkey).
    InvalidateLocally(u32),
    /// A registration for this command only: deregister it; the command completes now.
    Deregister,
}

/// The connection's counts and the tags' keys (see the module doc).
#[derive(Debug)]
pub(super) struct Ledger {
    /// Send-queue entries that may still be posted, so the SQ never overflows: a command takes
    /// one for its SEND, and with a memory window two more (the bind, and the LOCAL_INV it may
    /// need); the SEND's completion returns the SEND's and the bind's, the response or the
    /// LOCAL_INV's completion the last.
    sq_free: u32,
    /// Signaled send work requests (SENDs, LOCAL_INVs, the nudge) posted and not yet
    /// completed: what a drain waits for (an unsignaled bind completes, or is flushed, before
    /// its SEND).
    signaled_out: u32,
    /// RECVs posted and not yet completed.
    recv_posted: u32,
    per_tag: Box<[TagState]>,
    /// Commands open their buffers with memory windows (else a registration per command).
    windows: bool,
    /// The device is rxe: its own remote-invalidation bit counts when it names the command's
    /// window key.
    rxe: bool,
}

impl Ledger {
    /// A connection of `tags` tags with every RECV posted (`tags + 1`) and an SQ sized for
    /// every tag's work requests at once ([`Ledger::sq_entries`]).
    pub(super) fn new(tags: u16, windows: bool, rxe: bool) -> Ledger {
        Ledger {
            sq_free: Self::sq_entries(tags, windows),
            signaled_out: 0,
            recv_posted: Self::recvs(tags),
            per_tag: vec![TagState::IDLE; usize::from(tags)].into_boxed_slice(),
            windows,
            rxe,
        }
    }

    /// The send queue's size: a SEND per command, plus a bind and a LOCAL_INV with windows,
    /// and one for the iWARP nudge.
    pub(super) fn sq_entries(tags: u16, windows: bool) -> u32 {
        let per = if windows { 3 } else { 1 };
        per * u32::from(tags) + 1
    }

    /// RECVs posted: one per response the queue can receive (hrqsize = depth + 1).
    pub(super) fn recvs(tags: u16) -> u32 {
        u32::from(tags) + 1
    }

    /// Whether the SQ has room for a command (`keyed`: it names a key in its SGL).
    pub(super) fn can_post(&self, keyed: bool) -> bool {
        self.sq_free >= self.need(keyed)
    }

    fn need(&self, keyed: bool) -> u32 {
        if keyed && self.windows {
            3
        } else {
            1
        }
    }

    /// Tag `tag`'s command was posted, naming `rkey` in its SGL.
    pub(super) fn posted(&mut self, tag: u16, rkey: Option<u32>) {
        let keyed = rkey.is_some();
        self.sq_free -= self.need(keyed);
        self.signaled_out += 1;
        self.per_tag[usize::from(tag)] = TagState {
            rkey,
            send_wrs: if keyed && self.windows { 2 } else { 1 },
        };
    }

    /// Whether the SQ has room for the iWARP nudge.
    pub(super) fn can_nudge(&self) -> bool {
        self.sq_free > 0
    }

    pub(super) fn nudge_posted(&mut self) {
        self.sq_free -= 1;
        self.signaled_out += 1;
    }

    /// A work completion of `wr` (successful or not): what it returns to the SQ and the
    /// counts.
    pub(super) fn completed(&mut self, wr: Wr) {
        match wr {
            Wr::Recv(_) => self.recv_posted -= 1,
            // Unsignaled: only a failed or flushed bind reports; its entry came back (or comes
            // back) with its SEND's completion.
            Wr::Bind(_) => {}
            Wr::Nudge | Wr::Inv(_) => {
                self.sq_free += 1;
                self.signaled_out -= 1;
            }
            Wr::Send(tag) => {
                let s = self.per_tag.get_mut(usize::from(tag));
                let n = s.as_ref().map_or(1, |s| s.send_wrs);
                self.sq_free += u32::from(n);
                self.signaled_out -= 1;
                if let Some(s) = s {
                    s.send_wrs = 1;
                }
            }
        }
    }

    /// A RECV was posted again (after its response was read).
    pub(super) fn recv_reposted(&mut self) {
        self.recv_posted += 1;
    }

    /// The response to tag `tag`'s command arrived; `invalidated` is the key the work
    /// completion says the target invalidated (IBV_WC_WITH_INV), `rxe_invalidated` the key
    /// rxe's own bit names. What to do with the command's key, or the protocol error.
    pub(super) fn response(
        &mut self,
        tag: u16,
        invalidated: Option<u32>,
        rxe_invalidated: Option<u32>,
    ) -> Result<KeyFate, String> {
        let Some(s) = self.per_tag.get_mut(usize::from(tag)) else {
            return Err(format!(
                "response for command {tag}, beyond the queue's tags"
            ));
        };
        let named = s.rkey.take();
        let windows = self.windows;
        // The key the response invalidated: the standard flag says so (and any key it names
        // must be the command's); rxe's own bit counts only when it names the command's key.
        let inv = invalidated
            .or_else(|| rxe_invalidated.filter(|&k| self.rxe && windows && Some(k) == named));
        match (inv, named) {
            (Some(inv), Some(k)) if windows && inv == k => {
                // Return the entry kept for the LOCAL_INV.
                self.sq_free += 1;
                Ok(KeyFate::InvalidatedByTarget)
            }
            // Only a window's key may be invalidated, and only the one the command named
            // (nvme_rdma_process_nvme_rsp: "Bogus remote invalidation").
            (Some(inv), _) => Err(format!(
                "bogus remote invalidation of rkey {inv:#x} by the response to command {tag} \
                 (its SGL named {named:x?})"
            )),
            (None, Some(k)) if windows => Ok(KeyFate::InvalidateLocally(k)),
            (None, Some(_)) => Ok(KeyFate::Deregister),
            (None, None) => Ok(KeyFate::NoKey),
        }
    }

    /// The LOCAL_INV [`KeyFate::InvalidateLocally`] asked for was posted (its entry was kept
    /// since the command's post).
    pub(super) fn local_inv_posted(&mut self) {
        self.signaled_out += 1;
    }

    /// Whether the device still owes work completions (a drain waits for them).
    pub(super) fn owed(&self) -> (u32, u32) {
        (self.recv_posted, self.signaled_out)
    }

    /// A work request flushed while draining a dead connection.
    pub(super) fn flushed(&mut self, wr: Wr) {
        match wr {
            Wr::Recv(_) => self.recv_posted = self.recv_posted.saturating_sub(1),
            Wr::Bind(_) => {}
            _ => self.signaled_out = self.signaled_out.saturating_sub(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    #[test]
    fn wr_ids_round_trip_and_keep_kinds_apart() {
        for wr in [
            Wr::Send(0),
            Wr::Send(u16::MAX),
            Wr::Recv(0),
            Wr::Recv(4095),
            Wr::Bind(7),
            Wr::Inv(7),
            Wr::Nudge,
        ] {
            assert_eq!(Wr::of(wr.id()), wr, "{wr:?}");
        }
    }

    /// Every command of the windows mode, in every order of its SEND's completion and its
    /// response, with and without the target's invalidation: the SQ gets back every entry.
    #[test]
    fn a_window_commands_entries_come_back_in_every_order() {
        for send_first in [true, false] {
            for by_target in [true, false] {
                let mut l = Ledger::new(4, true, false);
                let full = l.sq_free;
                assert!(l.can_post(true));
                l.posted(2, Some(0x1234_5601));
                assert_eq!(l.sq_free, full - 3);
                if send_first {
                    l.completed(Wr::Send(2));
                    assert_eq!(l.sq_free, full - 1, "the SEND and the bind are back");
                }
                l.completed(Wr::Recv(0));
                l.recv_reposted();
                let inv = by_target.then_some(0x1234_5601);
                let fate = l.response(2, inv, None).unwrap();
                if by_target {
                    assert_eq!(fate, KeyFate::InvalidatedByTarget);
                } else {
                    assert_eq!(fate, KeyFate::InvalidateLocally(0x1234_5601));
                    l.local_inv_posted();
                    l.completed(Wr::Inv(2));
                }
                if !send_first {
                    l.completed(Wr::Send(2));
                }
                assert_eq!(
                    l.sq_free, full,
                    "send_first {send_first} by_target {by_target}"
                );
                assert_eq!(l.owed(), (Ledger::recvs(4), 0));
                assert_eq!(l.per_tag[2], TagState::IDLE);
            }
        }
    }

    #[test]
    fn invalidation_of_another_key_or_of_no_window_is_a_protocol_error() {
        // A window's command, the target invalidates another key.
        let mut l = Ledger::new(2, true, false);
        l.posted(0, Some(0x100));
        let e = l.response(0, Some(0x200), None).unwrap_err();
        assert!(e.contains("bogus remote invalidation of rkey 0x200"), "{e}");
        // A command without a key.
        let mut l = Ledger::new(2, true, false);
        l.posted(1, None);
        assert!(l.response(1, Some(0x100), None).is_err());
        // A per-command registration is never the target's to invalidate.
        let mut l = Ledger::new(2, false, false);
        l.posted(0, Some(0x300));
        assert!(l.response(0, Some(0x300), None).is_err());
        // A response for a tag the queue does not have.
        assert!(Ledger::new(2, true, false)
            .response(9, None, None)
            .unwrap_err()
            .contains("beyond"));
    }

    #[test]
    fn rxes_own_bit_counts_only_on_rxe_with_windows_and_the_commands_key() {
        let fate = |windows, rxe, bit| {
            let mut l = Ledger::new(1, windows, rxe);
            l.posted(0, Some(0x42));
            l.response(0, None, Some(bit)).unwrap()
        };
        assert_eq!(fate(true, true, 0x42), KeyFate::InvalidatedByTarget);
        // Another key in rxe's bit, or a device that is not rxe: the bit means nothing.
        assert_eq!(fate(true, true, 0x43), KeyFate::InvalidateLocally(0x42));
        assert_eq!(fate(true, false, 0x42), KeyFate::InvalidateLocally(0x42));
        assert_eq!(fate(false, true, 0x42), KeyFate::Deregister);
    }

    #[test]
    fn per_command_registrations_take_one_entry_and_are_dropped_at_the_response() {
        let mut l = Ledger::new(2, false, false);
        let full = l.sq_free;
        l.posted(0, Some(7));
        l.posted(1, None);
        assert_eq!(l.sq_free, full - 2);
        assert_eq!(l.response(0, None, None).unwrap(), KeyFate::Deregister);
        assert_eq!(l.response(1, None, None).unwrap(), KeyFate::NoKey);
        l.completed(Wr::Send(1));
        l.completed(Wr::Send(0));
        assert_eq!(l.sq_free, full);
    }

    /// What the device and the target still owe one tag's command.
    #[derive(Clone, Copy, Default)]
    struct Owed {
        send: bool,
        response: bool,
        inv: bool,
        busy: bool,
    }

    /// Many random interleavings on both key modes: commands of random kind (no data, a
    /// window or registration key, in-capsule) posted on free tags while their tags are
    /// free, their SEND completions, responses (invalidating or not, also through rxe's bit)
    /// and LOCAL_INVs arriving in random order, an iWARP nudge now and then. Every idle tag
    /// can always be posted (the SQ has room for every tag's work requests), no count ever
    /// goes below zero (checked arithmetic in debug builds), and once every command is done
    /// the SQ, the signaled count and the RECVs are back where they started.
    #[test]
    fn random_interleavings_never_overflow_the_sq_and_leak_no_entry() {
        for seed in 1..=300u64 {
            let mut r = Rng::new(seed);
            let tags = 1 + r.below(8) as u16;
            let windows = r.below(2) == 0;
            let rxe = r.below(2) == 0;
            let mut l = Ledger::new(tags, windows, rxe);
            let full = l.sq_free;
            let mut owed = vec![Owed::default(); usize::from(tags)];
            let mut key = 0x1000u32;
            let mut nudges = 0u32;
            let mut posted = 0u32;
            for step in 0..400 {
                let t = r.below(u64::from(tags)) as usize;
                let o = &mut owed[t];
                match r.below(5) {
                    0 | 1 if !o.busy && step < 300 => {
                        let keyed = r.below(3) != 0;
                        assert!(l.can_post(keyed), "seed {seed}: idle tag {t} refused");
                        key += 1;
                        l.posted(t as u16, keyed.then_some(key));
                        *o = Owed {
                            send: true,
                            response: true,
                            inv: false,
                            busy: true,
                        };
                        posted += 1;
                    }
                    2 if o.send => {
                        l.completed(Wr::Send(t as u16));
                        o.send = false;
                    }
                    3 if o.response => {
                        l.completed(Wr::Recv(0));
                        l.recv_reposted();
                        let named = l.per_tag[t].rkey;
                        // A target that invalidates uses the standard flag, or rxe's bit.
                        let (inv, bit) = match (named, windows, r.below(3)) {
                            (Some(k), true, 0) => (Some(k), None),
                            (Some(k), true, 1) => (None, Some(k)),
                            _ => (None, None),
                        };
                        match l.response(t as u16, inv, bit).unwrap() {
                            KeyFate::InvalidateLocally(k) => {
                                assert_eq!(Some(k), named);
                                l.local_inv_posted();
                                o.inv = true;
                            }
                            KeyFate::InvalidatedByTarget => assert!(windows),
                            KeyFate::Deregister => assert!(!windows && named.is_some()),
                            KeyFate::NoKey => assert!(named.is_none()),
                        }
                        o.response = false;
                    }
                    4 if o.inv => {
                        l.completed(Wr::Inv(t as u16));
                        o.inv = false;
                    }
                    4 if nudges == 0 && l.can_nudge() && r.below(8) == 0 => {
                        l.nudge_posted();
                        nudges += 1;
                    }
                    _ => {}
                }
                let o = &mut owed[t];
                if o.busy && !o.send && !o.response && !o.inv {
                    o.busy = false;
                }
            }
            // Let everything owed arrive.
            for (t, o) in owed.iter_mut().enumerate() {
                if o.send {
                    l.completed(Wr::Send(t as u16));
                }
                if o.response {
                    l.completed(Wr::Recv(0));
                    l.recv_reposted();
                    if let KeyFate::InvalidateLocally(_) = l.response(t as u16, None, None).unwrap()
                    {
                        l.local_inv_posted();
                        o.inv = true;
                    }
                }
                if o.inv {
                    l.completed(Wr::Inv(t as u16));
                }
            }
            for _ in 0..nudges {
                l.completed(Wr::Nudge);
            }
            assert!(posted > 0, "seed {seed}");
            assert_eq!(l.sq_free, full, "seed {seed}: send-queue entries leaked");
            assert_eq!(l.owed(), (Ledger::recvs(tags), 0), "seed {seed}");
            assert!(
                l.per_tag.iter().all(|s| *s == TagState::IDLE),
                "seed {seed}"
            );
        }
    }
}
