//! The intra-node get, between two endpoints of one job whose ranks are threads of this
//! process: from a shared buffer, from plain memory by cross-memory attach (alone, on
//! the pull thread, as a split copy with the peer's help), ranges at the edges, and bad
//! ranges, which are typed errors.

use super::*;
use crate::config::Config;
use crate::job::rendezvous::KvServerHandle;
use crate::test_support::{cannot_run, jobs};
use split::SPLIT_MIN;

const DPID: u16 = 31;

/// The two endpoints of a two-rank job.
fn pair(config: &Config) -> (Rma, Rma, KvServerHandle) {
    let (jobs, store) = jobs(2, config);
    let a = Rma::open(&jobs[0], DPID).unwrap();
    let b = Rma::open(&jobs[1], DPID).unwrap();
    (a, b, store)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// Rank 1 of this process, as a peer.
fn rank1() -> Peer {
    Peer {
        rank: 1,
        pid: std::process::id(),
    }
}

fn memory(bytes: &[u8]) -> Remote {
    Remote::Memory {
        addr: bytes.as_ptr() as u64,
        split: None,
    }
}

/// Whether `a` reaches rank 1's memory by attach: skips the test (says why) if not.
fn attach_works(a: &Rma, b_bytes: &[u8]) -> bool {
    let mut one = [0u8; 1];
    match a.get(rank1(), memory(&b_bytes[..1]), &mut one) {
        Ok(Got::Attached) => true,
        other => {
            cannot_run(&format!(
                "cross-memory attach is not permitted here ({other:?}, {:?})",
                a.reach.cma.availability()
            ));
            false
        }
    }
}

#[test]
fn a_shared_buffer_is_read_in_place_to_its_last_byte() {
    let (a, b, _store) = pair(&Config::default());
    let len = 3 * 4096 + 5;
    let mut buf = b.alloc_shared(len).unwrap();
    let want = pattern(len, 3);
    buf.copy_from_slice(&want);
    let Remote::Shared { window, offset } = b.locate(&buf[100..200]) else {
        panic!("a shared buffer is located as one");
    };
    assert_eq!(offset, 100);
    let shared = |offset| Remote::Shared { window, offset };

    let mut dst = vec![0u8; len];
    assert_eq!(a.get(rank1(), shared(0), &mut dst).unwrap(), Got::Shared);
    assert!(dst == want, "the whole buffer");
    let mut one = [0u8; 1];
    assert_eq!(
        a.get(rank1(), shared(len as u64 - 1), &mut one).unwrap(),
        Got::Shared
    );
    assert_eq!(one[0], want[len - 1], "the last byte");
    let mut mid = vec![0u8; 4096];
    assert_eq!(a.get(rank1(), shared(4095), &mut mid).unwrap(), Got::Shared);
    assert!(mid[..] == want[4095..4095 + 4096], "across page boundaries");
    assert_eq!(
        a.get(rank1(), shared(len as u64), &mut []).unwrap(),
        Got::Shared,
        "nothing, just past the end"
    );
    // The owner reads its own buffer the same way (a message to itself).
    assert_eq!(b.get(rank1(), shared(7), &mut one).unwrap(), Got::Shared);
    assert_eq!(one[0], want[7]);
    // Local bytes outside a shared buffer are named by their address.
    let plain = [0u8; 8];
    assert_eq!(b.locate(&plain), memory(&plain));
    assert_eq!(b.locate(&buf[len - 1..]), shared(len as u64 - 1));
}

#[test]
fn ranges_outside_a_shared_buffer_are_typed_errors() {
    let (a, b, _store) = pair(&Config::default());
    let len = 4096;
    let buf = b.alloc_shared(len).unwrap();
    let Remote::Shared { window, .. } = b.locate(&buf) else {
        panic!("a shared buffer is located as one");
    };
    let mut two = [0xeeu8; 2];
    for offset in [
        len as u64 - 1,
        len as u64,
        len as u64 + 1,
        u64::MAX - 1,
        u64::MAX,
    ] {
        match a.get(rank1(), Remote::Shared { window, offset }, &mut two) {
            Err(GetError::OutOfBounds {
                rank: 1,
                window: w,
                offset: o,
                len: 2,
                size,
            }) => assert_eq!((w, o, size), (window, offset, len)),
            other => panic!("offset {offset}: {other:?}"),
        }
        assert_eq!(two, [0xee; 2], "nothing copied");
    }
    let e = a
        .get(
            rank1(),
            Remote::Shared {
                window,
                offset: 4095,
            },
            &mut two,
        )
        .unwrap_err();
    assert!(e.to_string().contains("outside shared buffer"), "{e}");
    // A buffer that does not exist (never allocated, or freed): pulled otherwise.
    let gone = Remote::Shared {
        window: window + 1,
        offset: 0,
    };
    assert_eq!(a.get(rank1(), gone, &mut two).unwrap(), Got::Unreachable);
    drop(buf);
    let freed = Remote::Shared { window, offset: 0 };
    let fresh = Rma::open(&jobs_of(&a), DPID + 1).unwrap();
    assert_eq!(
        fresh.get(rank1(), freed, &mut two).unwrap(),
        Got::Unreachable
    );
}

/// A job handle of `rma`'s job (for a second endpoint of the same rank).
fn jobs_of(rma: &Rma) -> Job {
    Job {
        shared: rma.job.clone(),
    }
}

#[test]
fn plain_memory_is_read_by_attach_to_its_edges() {
    let (a, b, _store) = pair(&Config::default());
    let src = pattern(1 << 20, 9);
    if !attach_works(&a, &src) {
        return;
    }
    let mut dst = vec![0u8; src.len()];
    assert_eq!(
        a.get(rank1(), memory(&src), &mut dst).unwrap(),
        Got::Attached
    );
    assert!(dst == src, "the whole buffer");
    let mut last = [0u8; 1];
    assert_eq!(
        a.get(rank1(), memory(&src[src.len() - 1..]), &mut last)
            .unwrap(),
        Got::Attached
    );
    assert_eq!(last[0], src[src.len() - 1]);
    assert_eq!(
        a.get(rank1(), memory(&src[..0]), &mut []).unwrap(),
        Got::Attached,
        "nothing"
    );
    // An address no process maps, and a range past the end of the address space:
    // typed errors from the kernel's answer or the piece check, never a panic.
    let mut some = [0u8; 16];
    for addr in [8, u64::MAX - 3] {
        match a.get(rank1(), Remote::Memory { addr, split: None }, &mut some) {
            Err(GetError::Attach(e)) => assert!(e.unavailable().is_none(), "{e}"),
            other => panic!("address {addr:#x}: {other:?}"),
        }
    }
    // Reading its own endpoint's memory is not a get by attach (a message to itself is
    // sent), nor is reading with attach turned off.
    let own = Peer {
        rank: 0,
        pid: std::process::id(),
    };
    assert_eq!(
        a.get(own, memory(&src), &mut some).unwrap(),
        Got::Unreachable
    );
    drop(b);
    let (a, _b, _store) = pair(&Config::default().with_cma(false));
    assert_eq!(
        a.get(rank1(), memory(&src), &mut some).unwrap(),
        Got::Unreachable
    );
}

#[test]
fn a_process_that_is_not_the_peer_is_not_read() {
    let (a, _b, _store) = pair(&Config::default());
    let src = pattern(64, 1);
    if !attach_works(&a, &src) {
        return;
    }
    // Rank 1 published this process's pid with its nonce: asked to read another
    // process as rank 1, the get reads nothing (and leaves rank 1 to the two-copy path).
    let (a, _b, _store) = pair(&Config::default());
    let other = Peer { rank: 1, pid: 1 };
    let mut dst = [0u8; 64];
    assert_eq!(
        a.get(other, memory(&src), &mut dst).unwrap(),
        Got::Unreachable
    );
    assert_eq!(dst, [0u8; 64], "nothing read");
    assert_eq!(
        a.get(rank1(), memory(&src), &mut dst).unwrap(),
        Got::Unreachable
    );
}

#[test]
fn large_gets_go_to_the_pull_thread_with_the_offload_engine() {
    let config = Config::default().with_reliability(ReliabilityMode::Offload);
    let (a, _b, _store) = pair(&config);
    let src = pattern(puller::MIN_OFFLOADED as usize + 5, 4);
    if !attach_works(&a, &src) {
        return;
    }
    assert!(!a.busy());
    let mut dst = vec![0u8; src.len()];
    // SAFETY: dst lives, untouched, until the completion is collected below.
    let got = unsafe {
        a.start_get(
            77,
            rank1(),
            memory(&src),
            dst.as_mut_ptr(),
            dst.len() as u64,
        )
    };
    assert_eq!(got.unwrap(), Got::Queued);
    let (op, result) = loop {
        if let Some(c) = a.completed() {
            break c;
        }
        assert!(a.busy());
        std::thread::yield_now();
    };
    assert_eq!((op, result.unwrap()), (77, Got::Attached));
    assert!(!a.busy());
    assert!(dst == src);
    // A short get is made at once.
    let mut short = vec![0u8; 100];
    // SAFETY: short is valid for its length for the call.
    let got = unsafe { a.start_get(78, rank1(), memory(&src), short.as_mut_ptr(), 100) };
    assert_eq!(got.unwrap(), Got::Attached);
    assert!(short[..] == src[..100]);
    assert!(a.completed().is_none());
}

#[test]
fn a_split_copy_with_the_peers_help_moves_every_byte() {
    let (jobs, _store) = jobs(2, &Config::default());
    let mut jobs = jobs.into_iter();
    let (job0, job1) = (jobs.next().unwrap(), jobs.next().unwrap());
    let len = 8 << 20;
    let (offer_tx, offer_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    // Rank 1 offers its bytes and helps until rank 0 is done.
    let helper = std::thread::spawn(move || {
        let b = Rma::open(&job1, DPID).unwrap();
        let src = pattern(len, 5);
        assert!(b.may_split(0, len as u64));
        assert!(!b.may_split(1, len as u64), "not to itself");
        assert!(!b.may_split(0, SPLIT_MIN - 1), "too short");
        // SAFETY: src outlives the transfer, which ends (end_split) below.
        let slot = unsafe { b.offer_split(0, 42, &src) }.unwrap();
        offer_tx.send((slot, src.as_ptr() as u64)).unwrap();
        while done_rx.try_recv().is_err() {
            b.help();
            std::hint::spin_loop();
        }
        b.end_split(0, 42);
        drop(src);
        b.stats().written_for_peers
    });
    let a = Rma::open(&job0, DPID).unwrap();
    let (slot, addr) = offer_rx.recv().unwrap();
    let want = pattern(len, 5);
    let mut one = [0u8; 1];
    match a.get(rank1(), Remote::Memory { addr, split: None }, &mut one) {
        Ok(Got::Attached) => {}
        other => {
            done_tx.send(()).unwrap();
            helper.join().unwrap();
            return cannot_run(&format!(
                "cross-memory attach is not permitted here ({other:?})"
            ));
        }
    }
    let mut dst = vec![0u8; len];
    let remote = Remote::Memory {
        addr,
        split: Some(Offer { slot, msg: 42 }),
    };
    assert_eq!(a.get(rank1(), remote, &mut dst).unwrap(), Got::Attached);
    done_tx.send(()).unwrap();
    let helped = helper.join().unwrap();
    assert!(dst == want, "every byte, whoever wrote it");
    assert_eq!(
        a.stats().written_by_peers,
        helped,
        "the two accounts of the peer's share agree"
    );
    // A slot number past the board, or one serving another transfer: read alone.
    let mut again = vec![0u8; SPLIT_MIN as usize];
    for offer in [
        Offer {
            slot: 9999,
            msg: 42,
        },
        Offer { slot, msg: 43 },
    ] {
        let remote = Remote::Memory {
            addr: want.as_ptr() as u64,
            split: Some(offer),
        };
        assert_eq!(a.get(rank1(), remote, &mut again).unwrap(), Got::Attached);
        assert!(again[..] == want[..again.len()]);
    }
}
