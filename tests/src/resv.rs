//! Reservation commands through the initiator, for the tests of reservations on one target
//! and across a gateway group.

use initiator::resv::{
    AcquireAction, AcquireCmd, ChangePtpl, RegisterAction, RegisterCmd, ResvType,
};
use initiator::{ConnectOptions, Controller, Error, Namespace};
use nvme::Status;

use crate::{TargetProc, TEST_NQN};

/// A new host (its own Host Identifier) connected to `t`, namespace 1, and its identifier.
pub fn open(t: &TargetProc) -> (Controller, Namespace, [u8; 16]) {
    let o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    let hostid = o.hostid;
    connect(t, o, hostid)
}

/// Host `id` (and its NQN) connected to `t`, namespace 1.
pub fn open_as(t: &TargetProc, id: [u8; 16]) -> (Controller, Namespace) {
    let mut o = ConnectOptions::tcp("127.0.0.1", t.addr.port(), TEST_NQN);
    o.hostid = id;
    o.hostnqn = initiator::hostnqn_for(&id);
    let (c, ns, _) = connect(t, o, id);
    (c, ns)
}

fn connect(t: &TargetProc, o: ConnectOptions, id: [u8; 16]) -> (Controller, Namespace, [u8; 16]) {
    let mut c = Controller::connect(o).unwrap_or_else(|e| panic!("{e}\n{}", t.log_text()));
    let ns = c.open_namespace(1).unwrap();
    (c, ns, id)
}

/// Register with key `key`.
pub fn register(ns: &mut Namespace, key: u64) -> Result<(), Error> {
    ns.reservation_register(&RegisterCmd {
        action: RegisterAction::Register,
        ignore_key: false,
        ptpl: ChangePtpl::NoChange,
        crkey: 0,
        nrkey: key,
    })
}

pub fn acquire(
    ns: &mut Namespace,
    action: AcquireAction,
    rtype: ResvType,
    crkey: u64,
    prkey: u64,
) -> Result<(), Error> {
    ns.reservation_acquire(&AcquireCmd {
        action,
        ignore_key: false,
        rtype,
        crkey,
        prkey,
    })
}

/// `r` is a Reservation Conflict.
#[track_caller]
pub fn conflict(r: Result<(), Error>) {
    match r {
        Err(Error::Status { status, .. })
            if status.code() == Status::RESERVATION_CONFLICT.code() => {}
        r => panic!("expected Reservation Conflict, got {r:?}"),
    }
}
