//! The life of one command on a host queue, over either transport.
//!
//! A command is over only when both of its events have been seen: the transport is done with
//! what it sends for the command, and the target's response arrived. Over NVMe/RDMA the first
//! is the completion of the capsule SEND (until then the SQE slot, the in-capsule data and the
//! send-queue entry are the device's); the two arrive in either order, since the SEND's
//! completion waits for the transport ack, which can be reported after the response (the Linux
//! host keeps a reference count of 2 for the same reason). Over NVMe/TCP it is the last byte of
//! the command's PDUs (capsule, H2CData) written to the socket: the caller's buffer stays
//! the queue's until then. A queue failure ends every command at once.

/// Where one command stands. Every change goes through [`next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum CmdState {
    /// The tag is free.
    #[default]
    Free,
    /// The capsule SEND is posted; neither its completion nor the response seen yet.
    Sent,
    /// The SEND completed; waiting for the response.
    AwaitResponse,
    /// The response arrived first; waiting for the SEND's completion.
    AwaitSendCompletion,
    /// Finished (or failed with the queue); waiting to be reaped.
    Done,
}

/// What can happen to a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmdEvent {
    /// Its capsule SEND was posted.
    Posted,
    /// Its SEND completed successfully.
    SendCompleted,
    /// Its response arrived.
    Response,
    /// The queue failed.
    QueueFailed,
    /// The caller took the completion.
    Reaped,
}

impl CmdState {
    /// Whether the command holds a tag and has not finished.
    pub(crate) fn in_flight(self) -> bool {
        matches!(
            self,
            CmdState::Sent | CmdState::AwaitResponse | CmdState::AwaitSendCompletion
        )
    }

    /// Whether a response for this command is acceptable now.
    pub(crate) fn awaits_response(self) -> bool {
        matches!(self, CmdState::Sent | CmdState::AwaitResponse)
    }
}

/// The transition function: the next state, or `None` when `ev` cannot happen in `s` (for a
/// response that is a target naming a command that is not waiting for one).
pub(crate) fn next(s: CmdState, ev: CmdEvent) -> Option<CmdState> {
    use CmdEvent as E;
    use CmdState as S;
    Some(match (s, ev) {
        (S::Free, E::Posted) => S::Sent,
        (S::Sent, E::SendCompleted) => S::AwaitResponse,
        (S::Sent, E::Response) => S::AwaitSendCompletion,
        (S::AwaitResponse, E::Response) => S::Done,
        (S::AwaitSendCompletion, E::SendCompleted) => S::Done,
        (S::Sent | S::AwaitResponse | S::AwaitSendCompletion, E::QueueFailed) => S::Done,
        (S::Done, E::Reaped) => S::Free,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use CmdEvent as E;
    use CmdState as S;

    fn run(evs: &[CmdEvent]) -> Option<CmdState> {
        evs.iter().try_fold(S::Free, |s, &e| next(s, e))
    }

    #[test]
    fn both_orders_finish() {
        assert_eq!(
            run(&[E::Posted, E::SendCompleted, E::Response]),
            Some(S::Done)
        );
        assert_eq!(
            run(&[E::Posted, E::Response, E::SendCompleted]),
            Some(S::Done)
        );
        assert_eq!(
            run(&[E::Posted, E::Response, E::SendCompleted, E::Reaped]),
            Some(S::Free)
        );
    }

    #[test]
    fn failure_ends_any_live_command() {
        for prefix in [
            &[E::Posted][..],
            &[E::Posted, E::SendCompleted],
            &[E::Posted, E::Response],
        ] {
            let s = run(prefix).unwrap();
            assert!(s.in_flight());
            assert_eq!(next(s, E::QueueFailed), Some(S::Done));
        }
        assert_eq!(next(S::Done, E::QueueFailed), None);
        assert_eq!(next(S::Free, E::QueueFailed), None);
    }

    #[test]
    fn impossible_events_are_refused() {
        // A second response, a response for a free tag, reaping a live command.
        assert_eq!(run(&[E::Posted, E::Response, E::Response]), None);
        assert_eq!(next(S::Free, E::Response), None);
        assert_eq!(next(S::Done, E::Response), None);
        assert_eq!(next(S::Sent, E::Reaped), None);
        assert_eq!(next(S::Sent, E::Posted), None);
        assert!(!S::AwaitSendCompletion.awaits_response());
        assert!(S::AwaitResponse.awaits_response());
    }
}
