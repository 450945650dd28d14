//! Commands larger than the slot buffer: Reads, Writes and Compares move in pieces of the
//! buffer's size (the transport moves each piece's data, the core turns each into its backend
//! op); anything else must fit the buffer.

use super::bad_input::ready;
use super::*;
use nvme::cmd::FUSE_FIRST;

const UNIT: u32 = 128 * 1024;

fn caps() -> TransportCaps {
    TransportCaps {
        max_transfer: 1 << 20,
        ..tcp_caps()
    }
}

/// A Read or Write of `nlb` 4 KiB blocks at `slba` of namespace 1, data by R2T / C2HData.
fn rw(q: &mut Host, opcode: u8, slba: u64, nlb: u32) -> Cmd {
    let mut sqe = Sqe::new(opcode, q.next_cid());
    sqe.nsid = 1.into();
    sqe.cdw10 = (slba as u32).into();
    sqe.cdw12 = (nlb - 1).into();
    sqe.dptr = Sgl::Transport { len: nlb << 12 }.encode();
    q.q.parse(&sqe, q.now).expect("parsed")
}

#[test]
fn identify_states_the_transfer_limit_and_one_buffer_of_acwu() {
    let (_t, mut a, _q) = ready(caps());
    let id = IdentifyController::decode(a.identify(cns::CTRL, 0, csi::NVM).ok_data()).unwrap();
    assert_eq!(4096u32 << id.mdts, 1 << 20);
    assert_eq!(id.acwu.get() as u32, UNIT / 4096 - 1);
}

#[test]
fn a_large_write_and_read_run_piece_by_piece() {
    let (_t, _a, mut q) = ready(caps());
    for opcode in [io::WRITE, io::READ] {
        // 1 MiB at block 8: 8 pieces of 128 KiB, each its own backend op.
        let mut cmd = rw(&mut q, opcode, 8, 256);
        let mut buf = vec![0u8; UNIT as usize];
        let mut offsets = Vec::new();
        loop {
            assert_eq!(cmd.piece.len, UNIT);
            let op = match q.q.execute(&mut cmd, &mut buf, q.now) {
                Exec::Io(op) => op,
                e => panic!("{e:?}"),
            };
            assert_eq!(op.len, UNIT);
            offsets.push(op.offset);
            if cmd.is_last_piece() {
                break;
            }
            assert!(q.q.piece_done(&mut cmd, Ok(()), q.now).is_none());
            assert!(cmd.next_piece());
        }
        assert!(!cmd.next_piece(), "nothing after the last piece");
        let want: Vec<u64> = (0..8).map(|i| (8 << 12) + i * UNIT as u64).collect();
        assert_eq!(offsets, want);
        assert!(q
            .q
            .complete_io(&mut cmd, Ok(()), q.now)
            .status()
            .is_success());
    }
    let s = q.q.stats();
    assert_eq!((s.bytes_written, s.bytes_read), (1 << 20, 1 << 20));
    assert_eq!((s.write_cmds, s.read_cmds), (1, 1));
    // The last piece is shorter when the length is not a multiple of the buffer.
    let cmd = rw(&mut q, io::READ, 0, 33);
    assert_eq!(
        cmd.piece,
        Piece {
            offset: 0,
            len: 32 << 12
        }
    );
    let mut cmd = cmd;
    assert!(cmd.next_piece());
    assert_eq!(
        cmd.piece,
        Piece {
            offset: 32 << 12,
            len: 4096
        }
    );
}

#[test]
fn a_failed_piece_ends_the_command() {
    let (_t, _a, mut q) = ready(caps());
    let mut cmd = rw(&mut q, io::WRITE, 0, 64);
    let mut buf = vec![0u8; UNIT as usize];
    assert!(matches!(
        q.q.execute(&mut cmd, &mut buf, q.now),
        Exec::Io(_)
    ));
    let cqe =
        q.q.piece_done(&mut cmd, Err(-libc::EIO), q.now)
            .expect("the command ends");
    assert_eq!(cqe.status(), Status::INTERNAL.dnr());
    assert_eq!(q.q.stats().errors, 1);
}

#[test]
fn only_reads_writes_and_compares_may_exceed_the_buffer() {
    let (_t, mut a, mut q) = ready(caps());
    // Larger than MDTS: refused as before.
    let mut sqe = Sqe::new(io::READ, q.next_cid());
    sqe.nsid = 1.into();
    sqe.cdw12 = 511.into();
    sqe.dptr = Sgl::Transport { len: 2 << 20 }.encode();
    assert_eq!(q.submit(sqe, &[]).status(), Status::INVALID_FIELD.dnr());
    // A log page larger than the buffer: refused.
    let r = a.get_log(nvme::log::lid::ERROR, 0, 2 * UNIT, 0, false);
    assert_eq!(r.status(), Status::INVALID_FIELD.dnr());
    // A fused Compare larger than the buffer (ACWU): refused.
    let mut sqe = Sqe::new(io::COMPARE, q.next_cid());
    sqe.flags |= FUSE_FIRST;
    sqe.nsid = 1.into();
    sqe.cdw12 = 63.into();
    sqe.dptr = Sgl::Transport { len: 64 << 12 }.encode();
    assert_eq!(q.submit(sqe, &[]).status(), Status::INVALID_FIELD.dnr());
    // A plain Compare of 256 KiB moves in two pieces.
    let mut sqe = Sqe::new(io::COMPARE, q.next_cid());
    sqe.nsid = 1.into();
    sqe.cdw12 = 63.into();
    sqe.dptr = Sgl::Transport { len: 64 << 12 }.encode();
    let cmd = q.q.parse(&sqe, q.now).unwrap();
    assert_eq!(cmd.piece.len, UNIT);
    assert!(!cmd.is_last_piece());
}

#[test]
fn a_fused_pair_of_one_buffer_is_taken() {
    let (_t, _a, mut q) = ready(caps());
    let mut sqe = Sqe::new(io::COMPARE, q.next_cid());
    sqe.flags |= FUSE_FIRST;
    sqe.nsid = 1.into();
    sqe.cdw10 = 254.into();
    sqe.cdw12 = 31.into();
    sqe.dptr = Sgl::Transport { len: 32 << 12 }.encode();
    let r = q.q.parse(&sqe, q.now);
    assert!(r.is_ok(), "{r:?}");
}
