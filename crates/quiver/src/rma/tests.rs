//! The intra-node get, between two endpoints of one job whose ranks are threads of this
//! process: from a shared buffer, from plain memory by cross-memory attach (alone, on
//! the pull thread, as a split copy with the peer's help), ranges at the edges, and bad
//! ranges, which are typed errors.

use super::*;
use crate::config::Config;
use crate::job::rendezvous::KvServerHandle;
use crate::link::cma;
use crate::link::cma::yama::PeerProcesses;
use crate::test_support::{cannot_run, jobs};
use reach::peer_processes;
use split::SPLIT_MIN;

const DPID: u16 = 31;

/// The two endpoints of a two-rank job.
fn pair(config: &Config) -> (SingleCopy, SingleCopy, KvServerHandle) {
    let (jobs, store) = jobs(2, config);
    let a = SingleCopy::open(&jobs[0], DPID).unwrap();
    let b = SingleCopy::open(&jobs[1], DPID).unwrap();
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
fn attach_works(a: &SingleCopy, b_bytes: &[u8]) -> bool {
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
    let fresh = SingleCopy::open(&jobs_of(&a), DPID + 1).unwrap();
    assert_eq!(
        fresh.get(rank1(), freed, &mut two).unwrap(),
        Got::Unreachable
    );
}

/// A job handle of `rma`'s job (for a second endpoint of the same rank).
fn jobs_of(rma: &SingleCopy) -> Job {
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

/// A child forked from this process: a copy of it, rank 1's published nonce included
/// (at the same address, so it passes the nonce check at its own pid), whose copy of a
/// buffer holds other bytes. Killed when dropped.
pub(crate) struct Forked {
    pid: libc::pid_t,
    quit: libc::c_int,
}

impl Forked {
    /// Forks a child that fills its copy of `buf` with `fill`, then waits to be killed.
    pub(crate) fn start(buf: &mut [u8], fill: u8) -> Forked {
        let (addr, len) = (buf.as_mut_ptr(), buf.len());
        let (mut ready, mut quit) = ([-1; 2], [-1; 2]);
        // SAFETY: each array has room for the two descriptors.
        let piped = unsafe {
            libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) == 0
                && libc::pipe2(quit.as_mut_ptr(), libc::O_CLOEXEC) == 0
        };
        assert!(piped, "pipe2: {}", std::io::Error::last_os_error());
        // SAFETY: the child runs only async-signal-safe code (memory stores, read, write,
        // close, _exit) and never returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: in the child: `addr` is its copy of `buf` (same virtual address
            // after fork), `len` bytes; the descriptors are its copies of the pipes.
            unsafe {
                libc::close(ready[0]);
                libc::close(quit[1]);
                std::ptr::write_bytes(addr, fill, len);
                let one = 1u8;
                libc::write(ready[1], (&one as *const u8).cast(), 1);
                // Until the parent closes its end (or dies, or kills this process).
                let mut b = 0u8;
                loop {
                    let n = libc::read(quit[0], (&mut b as *mut u8).cast(), 1);
                    if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                        break;
                    }
                }
                libc::_exit(0);
            }
        }
        let mut b = 0u8;
        // SAFETY: the parent's ends of the pipes: the child's are closed, one byte is
        // read into a local once the child has filled its buffer.
        let started = unsafe {
            libc::close(ready[1]);
            libc::close(quit[0]);
            let n = libc::read(ready[0], (&mut b as *mut u8).cast(), 1);
            libc::close(ready[0]);
            n == 1
        };
        let child = Forked { pid, quit: quit[1] };
        assert!(started, "the child did not start");
        child
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid as u32
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        let mut status = 0;
        // SAFETY: our child, not reaped yet (so the pid is still its), killed and waited
        // for once; our end of its pipe, closed once.
        unsafe {
            libc::close(self.quit);
            libc::kill(self.pid, libc::SIGKILL);
            while libc::waitpid(self.pid, &mut status, 0) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
        }
    }
}

/// Issue 28, item 7: the pid a peer names (the sender's, in every `Push`) is checked
/// against the process that rank proved to be, not once per rank. A child forked after
/// rank 1 published its nonce holds that very nonce at the same address, so the probe
/// alone would take it for rank 1; named as rank 1 it is still not read.
#[test]
fn a_process_that_is_not_the_peer_is_not_read() {
    let (a, _b, _store) = pair(&Config::default());
    let len = SPLIT_MIN as usize;
    let mut held = pattern(len, 1);
    let want = held.clone();
    let child = Forked::start(&mut held, 0xc4);
    // This process may read the child (its parent), and the child holds rank 1's nonce.
    let mut direct = vec![0u8; len];
    match cma::read_from(child.pid(), &[cma::Piece::of(&held)], &mut direct) {
        Ok(_) => assert!(direct.iter().all(|&b| b == 0xc4), "the child's bytes"),
        Err(e) => return cannot_run(&format!("cross-memory attach to a child: {e}")),
    }
    let published = a.job.kv.try_get(&format!("cma/1/{DPID}")).unwrap().unwrap();
    let nonce: Vec<u64> = published.split(':').map(|f| f.parse().unwrap()).collect();
    let target = cma::ProbeTarget {
        addr: nonce[1],
        value: nonce[2],
    };
    assert_eq!(nonce[0], u64::from(std::process::id()));
    assert!(
        cma::probe(child.pid(), target).is_ok(),
        "a forked child passes the probe"
    );

    // Rank 1 proved to be this process: the common case reads it.
    if !attach_works(&a, &held) {
        return;
    }
    let forged = Peer {
        rank: 1,
        pid: child.pid(),
    };
    let mut dst = vec![0u8; len];
    for _ in 0..2 {
        assert_eq!(
            a.get(forged, memory(&held), &mut dst).unwrap(),
            Got::Unreachable,
            "a pid rank 1 did not prove: pulled by request"
        );
        assert!(dst.iter().all(|&b| b == 0), "nothing read from the child");
    }
    assert_eq!(a.stats().pids_refused, 2, "every refusal counted");
    // The rank is not spoilt: its own pid is read as before.
    assert_eq!(
        a.get(rank1(), memory(&held), &mut dst).unwrap(),
        Got::Attached
    );
    assert!(dst == want, "rank 1's bytes");

    // The forged pid first, before rank 1 was ever proved; and a pid of another user's
    // or no process: refused alike, without reading, and the rank's own pid still works.
    let (a, _b, _store) = pair(&Config::default());
    for pid in [child.pid(), 1, 0, u32::MAX] {
        dst.fill(0);
        let peer = Peer { rank: 1, pid };
        assert_eq!(
            a.get(peer, memory(&held), &mut dst).unwrap(),
            Got::Unreachable,
            "pid {pid}"
        );
        assert!(dst.iter().all(|&b| b == 0), "pid {pid}: nothing read");
    }
    assert_eq!(a.stats().pids_refused, 4);
    assert_eq!(
        a.get(rank1(), memory(&held), &mut dst).unwrap(),
        Got::Attached
    );
    assert!(dst == want);

    // With the pull thread, a large get naming the child is not handed over either.
    let config = Config::default().with_reliability(ReliabilityMode::Offload);
    let (a, _b, _store) = pair(&config);
    assert!(attach_works(&a, &held));
    dst.fill(0);
    // SAFETY: dst is valid for its length and untouched until the get is over (it is
    // not queued: a queued one would be collected below).
    let got = unsafe { a.start_get(5, forged, memory(&held), dst.as_mut_ptr(), len as u64) };
    assert_eq!(got.unwrap(), Got::Unreachable);
    assert!(a.completed().is_none() && !a.busy());
    assert!(dst.iter().all(|&b| b == 0), "nothing read from the child");
    assert_eq!(a.stats().pids_refused, 1);
}

/// The split copy's side of the same rule: the receiver names, in the board slot, the
/// process to write into; a pid other than the one that rank proved is not written.
#[test]
fn a_split_copy_does_not_write_into_a_process_that_is_not_the_receiver() {
    let (jobs, _store) = jobs(2, &Config::default());
    let _a = SingleCopy::open(&jobs[0], DPID).unwrap();
    let b = SingleCopy::open(&jobs[1], DPID).unwrap();
    let len = SPLIT_MIN as usize;
    let src = pattern(len, 7);
    let mut held = vec![0u8; len];
    let child = Forked::start(&mut held, 0xc4);
    // Rank 1 (b) has proved rank 0 to be this process.
    let rank0 = Peer {
        rank: 0,
        pid: std::process::id(),
    };
    let mut one = [0u8; 1];
    match b.get(rank0, memory(&src[..1]), &mut one) {
        Ok(Got::Attached) => {}
        other => return cannot_run(&format!("cross-memory attach: {other:?}")),
    }
    // SAFETY: src outlives the transfer, ended below.
    let slot = unsafe { b.offer_split(0, 9, &src) }.unwrap();
    // Rank 0 opens the slot naming the child as the process to write into.
    let board = split::Board::open_peer(jobs[1].shared.job_id, 1, DPID).unwrap();
    let units = crate::link::shm::split::units_for(len as u64).unwrap();
    let dest = crate::link::shm::split::Destination {
        dst: held.as_ptr() as u64,
        len: len as u64,
        pid: child.pid(),
    };
    assert!(board.slot(slot).unwrap().open(9, units, dest).is_some());
    assert!(b.help(), "the helper claimed units");
    let stats = b.stats();
    assert_eq!((stats.pids_refused, stats.written_for_peers), (1, 0));
    let mut now = vec![0u8; len];
    cma::read_from(child.pid(), &[cma::Piece::of(&held)], &mut now).unwrap();
    assert!(
        now.iter().all(|&b| b == 0xc4),
        "nothing written into the child"
    );
    // The receiver reads the refused units itself: they are recorded as failed.
    let s = board.slot(slot).unwrap();
    while s.claim_front(units).is_some() {}
    let failed = s.sender_finished(s.sender_share(units));
    assert!(failed.as_ref().is_some_and(|f| !f.is_empty()), "{failed:?}");
    b.end_split(0, 9);
}

/// What an endpoint lets its peers do under Yama depends on the processes the job's
/// same-node ranks published: none but this one (ranks as threads), one, or several.
#[test]
fn the_peer_processes_are_the_ones_the_ranks_published() {
    let (jobs, _store) = jobs(3, &Config::default());
    let s = &jobs[0].shared;
    let wait = std::time::Duration::from_secs(5);
    assert_eq!(
        peer_processes(s, wait),
        PeerProcesses::None,
        "all threads here"
    );
    let mut buf = [0u8; 8];
    let (c1, c2) = (Forked::start(&mut buf, 1), Forked::start(&mut buf, 2));
    let tag = |pid: u32, start: &str| format!("{pid}.{start}");
    s.kv.put("proc/2", &tag(c1.pid(), "0")).unwrap();
    assert_eq!(peer_processes(s, wait), PeerProcesses::One(c1.pid()));
    s.kv.put("proc/1", &tag(c1.pid(), "0")).unwrap();
    assert_eq!(
        peer_processes(s, wait),
        PeerProcesses::One(c1.pid()),
        "two ranks, one process"
    );
    // Not the process that started then (another pid namespace, or a reused pid): left
    // out rather than named.
    s.kv.put("proc/1", &tag(c2.pid(), "1")).unwrap();
    assert_eq!(peer_processes(s, wait), PeerProcesses::One(c1.pid()));
    s.kv.put("proc/1", &tag(c2.pid(), "0")).unwrap();
    assert_eq!(peer_processes(s, wait), PeerProcesses::Several);
    // A rank whose process is unknown may be anyone.
    s.kv.put("proc/1", "garbage").unwrap();
    assert_eq!(peer_processes(s, wait), PeerProcesses::Several);
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
        let b = SingleCopy::open(&job1, DPID).unwrap();
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
    let a = SingleCopy::open(&job0, DPID).unwrap();
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
