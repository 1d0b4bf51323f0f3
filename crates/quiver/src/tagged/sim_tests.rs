//! Tagged's Push-Pull in the simulator: the real protocol (its handler on the station's
//! hook, the outbox's ranges answering `Pull` requests, the receive side's pulls by
//! request) between two whole stations over the simulated network, in virtual time and
//! under seeded loss, duplication, reordering and corruption. Both ranks send to each
//! other at once in random push modes, with receives posted before and after their
//! messages arrive, some too small (truncation). Every receive must end with the bytes
//! and status its message calls for, every send must complete, nothing may be counted
//! dropped and the pushed buffer must end empty, within a bound on virtual time.
//!
//! The simulated network joins two nodes, so every pull is a pull by request (same-node
//! gets are I/O: `rma`'s own tests and the process tests cover them).

use super::pushpull::{Direct, PushPull, State};
use super::wire;
use super::{PushMode, Src, Status, Tag, TaggedStats};
use crate::config::{Config, TransportChoice};
use crate::engine::sim_tests::{advance_stations, station_pair_in, SimStation, StoreDir, DPID};
use crate::engine::stats::EndpointStats;
use crate::error::Error;
use crate::link::fault::{FaultConfig, SimRng};
use crate::link::sim::SimNet;
use crate::rma::SingleCopy;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// One rank's side of a run: what it sends, and how it treats what it receives.
#[derive(Debug, Clone)]
struct Side {
    mode: PushMode,
    btp1: usize,
    btp2: usize,
    /// `Config::pipeline_max` (push mode pull).
    pipeline_max: Option<usize>,
    /// Messages it sends: (length, tag).
    sends: Vec<(usize, u32)>,
    /// Per message of the peer, the receive buffer's capacity as a share of the message
    /// in percent (100, or missing: exactly its length; less: truncated).
    caps: Vec<u8>,
}

/// The bytes of message `i` of `rank`.
fn payload(rank: u32, i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j as u64 * 7 + i as u64 * 131 + rank as u64 * 29) as u8)
        .collect()
}

/// One rank's operations in flight and done.
struct Rank {
    pp: PushPull,
    /// Send buffers, kept until the end (the protocol reads them until completion).
    out_bufs: Vec<Vec<u8>>,
    /// Sends started: operation, and whether it completed.
    sends: Vec<(u64, bool)>,
    /// Receive buffers and their operations, in the order posted; `None` once done.
    recvs: Vec<(Vec<u8>, Option<u64>)>,
}

/// The configuration of the simulated pair: two nodes over udp, messages of 16 KiB.
fn two_nodes() -> Config {
    Config {
        transport: TransportChoice::Udp,
        connect_timeout: Duration::from_secs(2),
        max_message: 16 << 10,
        // Two nodes: neither applies, and the split board is a named object per job.
        cma: false,
        split_copy: false,
        ..Config::default()
    }
}

/// Runs `sides` against each other over a simulated network with `faults`; `rng`
/// decides, step by step, whether each rank starts its next send and posts its next
/// receive.
fn exchange(
    sides: &[Side; 2],
    faults: &FaultConfig,
    schedule_seed: u64,
) -> [(TaggedStats, EndpointStats); 2] {
    exchange_with_credit(sides, faults, schedule_seed, Config::default().push_credit)
}

/// [`exchange`] with `push_credit` bytes of pushed buffer per sender on both ranks.
fn exchange_with_credit(
    sides: &[Side; 2],
    faults: &FaultConfig,
    schedule_seed: u64,
    push_credit: usize,
) -> [(TaggedStats, EndpointStats); 2] {
    let config = Config {
        push_credit,
        ..two_nodes()
    };
    exchange_in(&config, sides, faults, schedule_seed)
}

/// [`exchange`] of ranks configured as `config` (over udp, as [`two_nodes`]).
fn exchange_in(
    config: &Config,
    sides: &[Side; 2],
    faults: &FaultConfig,
    schedule_seed: u64,
) -> [(TaggedStats, EndpointStats); 2] {
    let (net, stations, jobs, _store) = station_pair_in(config, faults);
    let mut ranks: Vec<Rank> = (0..2)
        .map(|r| {
            let side = &sides[r];
            let mine = config
                .clone()
                .with_push(side.mode)
                .with_btp(side.btp1, side.btp2)
                .with_pipeline_max(side.pipeline_max);
            let st = State::new(&mine, 2);
            Rank {
                pp: PushPull::new(st, SingleCopy::open(&jobs[r], DPID).unwrap(), r as u32),
                out_bufs: Vec::new(),
                sends: Vec::new(),
                recvs: Vec::new(),
            }
        })
        .collect();
    let mut rng = SimRng::new(schedule_seed);
    let done = |ranks: &[Rank]| {
        (0..2).all(|r| {
            let peer = &sides[1 - r];
            ranks[r].sends.len() == sides[r].sends.len()
                && ranks[r].sends.iter().all(|s| s.1)
                && ranks[r].recvs.len() == peer.sends.len()
                && ranks[r].recvs.iter().all(|(_, op)| op.is_none())
        })
    };
    let mut checked = [0usize; 2];
    while !done(&ranks) {
        let mut moved = false;
        for r in 0..2 {
            let station: &SimStation = &stations[r];
            // Receives the peer has posted so far (the k-th takes this rank's k-th send).
            let peer_posted = ranks[1 - r].recvs.len();
            let rank = &mut ranks[r];
            let peer = 1 - r as u32;
            // The next send, sometimes; every fourth synchronous.
            let i = rank.sends.len();
            if i < sides[r].sends.len() && rng.below(3) == 0 {
                let (len, tag) = sides[r].sends[i];
                rank.out_bufs.push(payload(r as u32, i, len));
                let data = rank.out_bufs.last().unwrap();
                let id = rank
                    .pp
                    .start_send(station, peer, tag, data, true, i % 4 == 1)
                    .unwrap()
                    .unwrap();
                rank.sends.push((id, false));
                moved = true;
            }
            // The next receive, sometimes (in the order the peer sends: with exact
            // tags, MPI's rule pairs the k-th receive of a tag with the k-th message).
            let k = rank.recvs.len();
            let theirs = &sides[1 - r];
            if k < theirs.sends.len() && rng.below(3) == 0 {
                let (len, tag) = theirs.sends[k];
                let share = sides[r].caps.get(k).copied().unwrap_or(100);
                let cap = len * share as usize / 100;
                let mut buf = vec![0xEEu8; cap];
                let id = rank
                    .pp
                    .start_recv(
                        station,
                        buf.as_mut_ptr(),
                        cap,
                        Src::Rank(peer),
                        Tag::Is(tag),
                    )
                    .unwrap();
                rank.recvs.push((buf, Some(id)));
                moved = true;
            }
            while rank.pp.poll(station).unwrap() {
                moved = true;
            }
            for (i, s) in rank.sends.iter_mut().enumerate().filter(|(_, s)| !s.1) {
                if let Some(result) = rank.pp.take_if_done(s.0) {
                    result.unwrap();
                    assert!(
                        i % 4 != 1 || peer_posted > i,
                        "synchronous send {i} complete before its receive was posted"
                    );
                    s.1 = true;
                }
            }
            for k in 0..rank.recvs.len() {
                let Some(id) = rank.recvs[k].1 else { continue };
                let Some(result) = rank.pp.take_if_done(id) else {
                    continue;
                };
                let (len, tag) = theirs.sends[k];
                check_receive(r, k, (len, tag), &rank.recvs[k].0, result);
                rank.recvs[k].1 = None;
                checked[r] += 1;
            }
        }
        if !moved {
            assert!(
                advance_stations(&net, &stations),
                "stuck: checked {checked:?} receives"
            );
        }
    }
    let stats = [0, 1].map(|r| (ranks[r].pp.st.borrow().stats.clone(), stations[r].stats()));
    // Wind down: what is still unacknowledged drains before the stations close, and the
    // tail of a truncated message's pushed bytes (still on its way when its receive
    // completed) arrives: at least 50 ms, and until nothing is in flight (at most 5 s).
    let now = net.borrow().now();
    let (until, limit) = (
        now + Duration::from_millis(50),
        now + Duration::from_secs(5),
    );
    let quiet = |ranks: &[Rank]| ranks.iter().all(|r| r.pp.st.borrow().is_quiet());
    while net.borrow().now() < until || (!quiet(&ranks) && net.borrow().now() < limit) {
        for (r, rank) in ranks.iter().enumerate() {
            rank.pp.progress(&stations[r]).unwrap();
        }
        advance_stations(&net, &stations);
    }
    for (r, rank) in ranks.iter().enumerate() {
        let st = rank.pp.st.borrow();
        assert_eq!(st.stats.dropped, 0, "rank {r} dropped protocol messages");
        assert!(
            st.matching.probe(Src::Any, Tag::Any).is_none(),
            "rank {r}: a message is left in the pushed buffer"
        );
        assert!(st.is_quiet(), "rank {r}: something is left in flight");
        // Every pushed byte is accounted for: what a sender has not had back is what its
        // receiver has not given back.
        let peer = ranks[1 - r].pp.st.borrow();
        assert_eq!(
            st.push_in_flight(1 - r as u32),
            peer.push_owed(r as u32),
            "rank {r}'s push credit towards rank {}",
            1 - r
        );
    }
    stats
}

/// Checks what receive `k` of rank `r` got of its peer's message `k` (`len` bytes with
/// `tag`) in `buf`: its status, or the truncation its buffer calls for, and the bytes.
fn check_receive(
    r: usize,
    k: usize,
    (len, tag): (usize, u32),
    buf: &[u8],
    result: Result<Status, Error>,
) {
    let peer = 1 - r as u32;
    let want = payload(peer, k, len);
    let cap = buf.len();
    match result {
        Ok(status) => {
            assert!(cap >= len, "receive {k} of rank {r}: {status:?} in {cap}");
            assert_eq!(
                status,
                Status {
                    peer,
                    tag,
                    len: len as u64
                }
            );
        }
        Err(Error::Truncated {
            len: l,
            capacity,
            rank: from,
            tag: t,
        }) => {
            assert!(cap < len, "receive {k} of rank {r} truncated in {cap}");
            assert_eq!((l, capacity, from, t), (len as u64, cap, peer, tag));
        }
        Err(e) => panic!("receive {k} of rank {r}: {e}"),
    }
    assert!(
        buf[..] == want[..cap.min(len)],
        "receive {k} of rank {r}: the bytes differ"
    );
}

/// A side with `n` messages whose lengths and modes come from `seed`.
fn side(seed: u64, n: usize) -> Side {
    let mut rng = SimRng::new(seed);
    let mode = [PushMode::Pull, PushMode::Zero, PushMode::All][rng.below(3) as usize];
    let sends = (0..n)
        .map(|_| {
            let len = match rng.below(4) {
                0 => rng.below(64) as usize,
                1 => 64 + rng.below(4096) as usize,
                2 => 4096 + rng.below(40_000) as usize,
                _ => 40_000 + rng.below(200_000) as usize,
            };
            (len, rng.below(3) as u32)
        })
        .collect();
    let caps = (0..n)
        .map(|_| if rng.below(6) == 0 { 60 } else { 100 })
        .collect();
    let btp1 = rng.below(2048) as usize;
    let btp2 = rng.below(8192) as usize;
    // The cost function's pipeline, none, or one of any length.
    let pipeline_max = match rng.below(3) {
        0 => None,
        1 => Some(0),
        _ => Some(rng.below(100_000) as usize),
    };
    Side {
        mode,
        btp1,
        btp2,
        pipeline_max,
        sends,
        caps,
    }
}

#[test]
fn push_pull_over_a_clean_simulated_network() {
    for (mode, seed) in [(PushMode::Pull, 1), (PushMode::Zero, 2), (PushMode::All, 3)] {
        let mut a = side(seed, 24);
        let mut b = side(seed + 100, 24);
        a.mode = mode;
        b.mode = mode;
        // No pipeline: in push mode pull, the longer messages are pulled.
        a.pipeline_max = Some(0);
        b.pipeline_max = Some(0);
        let stats = exchange(&[a, b], &FaultConfig::none(), seed);
        // Both paths of the protocol ran: messages that waited for their receive, and
        // (but in Push-All) bytes pulled by request.
        let tagged = |f: fn(&TaggedStats) -> u64| f(&stats[0].0) + f(&stats[1].0);
        assert!(tagged(|s| s.unexpected) > 0, "{mode:?}: {stats:?}");
        if mode != PushMode::All {
            assert!(tagged(|s| s.pulled_by_request) > 0, "{mode:?}: {stats:?}");
        }
    }
}

/// A pulled message's answer comes in `Data` of about 64 KiB that fill whole frames:
/// not one `Data` of the whole message (whose reassembly copy waits for its last
/// frame), not a `Data` per frame, and none longer than `max_message` allows (a longer
/// one would be refused as too large).
#[test]
fn a_pulled_answer_comes_in_data_of_whole_frames() {
    const LEN: usize = 200_000;
    // The simulated link's MTU is 1472 bytes, 1440 of them a frame's payload: 46
    // frames make 64 KiB; 11 are the most a 16 KiB message takes; a 1 KiB message
    // takes less than one frame, so its `Data` are `max_message`'s chunk.
    for (max_message, chunk) in [
        (1 << 20, 46 * 1440 - 4 - 24),
        (16 << 10, 11 * 1440 - 4 - 24),
        (1 << 10, 1024 - 48),
    ] {
        let sender = Side {
            mode: PushMode::Zero,
            btp1: 0,
            btp2: 0,
            pipeline_max: Some(0),
            sends: vec![(LEN, 1)],
            caps: vec![],
        };
        let receiver = Side {
            sends: vec![],
            caps: vec![100],
            ..sender.clone()
        };
        let config = Config {
            max_message,
            ..two_nodes()
        };
        let [_, (tagged, endpoint)] =
            exchange_in(&config, &[sender, receiver], &FaultConfig::none(), 5);
        assert_eq!(tagged.pulled_by_request, LEN as u64, "{tagged:?}");
        let pieces = LEN.div_ceil(chunk);
        assert!(
            endpoint.msgs_received >= pieces as u64,
            "max_message {max_message}: {} messages for {pieces} pieces ({endpoint:?})",
            endpoint.msgs_received
        );
        // Every piece fills its frames: no frame more than the pieces need, but the
        // push's and the acknowledgements (a few, more for many short pieces).
        let control = 3 + pieces / 40;
        let frames: usize = (0..pieces)
            .map(|i| {
                let len = chunk.min(LEN - i * chunk) + wire::DATA_HEADER;
                crate::wire::fragment_count(len, 1472)
            })
            .sum();
        assert!(
            endpoint.frames_received <= (frames + control) as u64,
            "max_message {max_message}: {} frames for {frames} frames of pieces ({endpoint:?})",
            endpoint.frames_received
        );
    }
}

#[test]
fn push_pull_repairs_seeded_faults() {
    for seed in 0..4u64 {
        let faults = FaultConfig::parse(&format!(
            "loss=0.05,dup=0.03,reorder=0.05,reorder_delay=200us,corrupt=0.01,seed={seed}"
        ))
        .unwrap();
        let stats = exchange(&[side(seed, 20), side(seed + 50, 20)], &faults, seed);
        let repaired: u64 = stats
            .iter()
            .map(|(_, e)| e.retransmissions + e.duplicates + e.checksum_failures)
            .sum();
        assert!(
            repaired > 0,
            "seed {seed}: the faults did not show ({stats:?})"
        );
    }
}

/// A pushed buffer of 16 KiB per sender (pushes of at most 4 KiB): senders run out of
/// credit, fall back to pulls of whole messages, and get credit back as receives take
/// what waited; nothing is lost, clean and under faults.
#[test]
fn push_pull_within_a_small_push_credit() {
    for seed in 0..3u64 {
        let faults = if seed == 0 {
            FaultConfig::none()
        } else {
            FaultConfig::parse(&format!("loss=0.03,dup=0.03,reorder=0.03,seed={seed}")).unwrap()
        };
        let (mut a, mut b) = (side(seed + 7, 30), side(seed + 70, 30));
        (a.mode, b.mode) = (PushMode::All, PushMode::Pull);
        let stats = exchange_with_credit(&[a, b], &faults, seed, 16 << 10);
        let tagged = |f: fn(&TaggedStats) -> u64| f(&stats[0].0) + f(&stats[1].0);
        assert!(
            tagged(|s| s.push_credit_exhausted) > 0,
            "seed {seed}: no sender ran out of credit ({stats:?})"
        );
        assert!(tagged(|s| s.pushed_buffer_peak) <= 2 * (16 << 10));
    }
}

/// Two protocol ends over a clean simulated network, pushing 100 bytes of each message
/// (everything else is pulled by request).
fn endpoint_pair() -> (
    Rc<RefCell<SimNet>>,
    [SimStation; 2],
    [PushPull; 2],
    StoreDir,
) {
    endpoint_pair_pushing(0)
}

/// [`endpoint_pair`] pushing BTP(2) = `btp2` bytes more after the first 100.
fn endpoint_pair_pushing(
    btp2: usize,
) -> (
    Rc<RefCell<SimNet>>,
    [SimStation; 2],
    [PushPull; 2],
    StoreDir,
) {
    let config = two_nodes().with_btp(100, btp2).with_pipeline_max(Some(0));
    let (net, stations, jobs, store) = station_pair_in(&config, &FaultConfig::none());
    let pps = [0, 1].map(|r| {
        PushPull::new(
            State::new(&config, 2),
            SingleCopy::open(&jobs[r], DPID).unwrap(),
            r as u32,
        )
    });
    (net, stations, pps, store)
}

/// Makes progress on the ranks `which` selects until `until` holds (false if it does
/// not within the virtual-time bound).
fn drive_until(
    net: &Rc<RefCell<SimNet>>,
    stations: &[SimStation; 2],
    pps: &[PushPull; 2],
    which: [bool; 2],
    until: impl Fn(&[PushPull; 2]) -> bool,
) -> bool {
    while !until(pps) {
        for r in (0..2).filter(|&r| which[r]) {
            pps[r].progress(&stations[r]).unwrap();
        }
        if until(pps) {
            break;
        }
        if !advance_stations(net, stations) {
            return false;
        }
    }
    true
}

/// Rank 0 posts a receive into `buf` (for tag 5 from rank 1), rank 1 starts sending
/// `msg`, and rank 0 alone makes progress until the push has arrived and its pull
/// request has left (unanswered: rank 1 has not run). The pair, the receive and the send.
#[allow(clippy::type_complexity)]
fn pull_requested(
    msg: &[u8],
    buf: &mut [u8],
) -> (
    Rc<RefCell<SimNet>>,
    [SimStation; 2],
    [PushPull; 2],
    StoreDir,
    u64,
    u64,
) {
    let (net, stations, pps, store) = endpoint_pair();
    let recv = pps[0]
        .start_recv(
            &stations[0],
            buf.as_mut_ptr(),
            buf.len(),
            Src::Rank(1),
            Tag::Is(5),
        )
        .unwrap();
    let send = pps[1]
        .start_send(&stations[1], 0, 5, msg, true, false)
        .unwrap()
        .unwrap();
    assert!(drive_until(&net, &stations, &pps, [true, false], |pps| {
        pps[0].st.borrow().landed_after_pull(recv).is_some() && pps[0].out.borrow().is_empty()
    }));
    (net, stations, pps, store, recv, send)
}

/// A synchronous send stays open while no receive has taken its message, whatever its
/// length (pushed whole in one message or with a second push, pushed in part and pulled,
/// empty, truncated at the receiver), and completes once one has: one `Done`, nothing
/// dropped, nothing left under way.
#[test]
fn a_synchronous_send_completes_only_once_a_receive_takes_it() {
    let cases = [
        (0, 0, 1),
        (0, 8, 8),
        (0, 8, 4),
        (0, 3000, 3000),
        (0, 200_000, 200_000),
        (0, 200_000, 100),
        (4096, 3000, 3000),
        (4096, 3000, 50),
    ];
    for (btp2, len, cap) in cases {
        let (net, stations, pps, _store) = endpoint_pair_pushing(btp2);
        let msg = payload(1, 0, len);
        let send = pps[1]
            .start_send(&stations[1], 0, 5, &msg, false, true)
            .unwrap()
            .expect("a synchronous send keeps its record");
        // Both ranks run for a while of virtual time; no receive is posted.
        let later = net.borrow().now() + Duration::from_millis(50);
        drive_until(&net, &stations, &pps, [true, true], |_| {
            net.borrow().now() >= later
        });
        let case = format!("{len} bytes into {cap}, BTP(2) {btp2}");
        assert!(
            pps[1].take_if_done(send).is_none(),
            "{case}: complete before a receive took it"
        );
        let mut buf = vec![0u8; cap];
        let recv = pps[0]
            .start_recv(
                &stations[0],
                buf.as_mut_ptr(),
                cap,
                Src::Rank(1),
                Tag::Is(5),
            )
            .unwrap();
        let (sent, received) = (RefCell::new(None), RefCell::new(None));
        assert!(drive_until(&net, &stations, &pps, [true, true], |pps| {
            if let Some(r) = pps[1].take_if_done(send) {
                *sent.borrow_mut() = Some(r);
            }
            if let Some(r) = pps[0].take_if_done(recv) {
                *received.borrow_mut() = Some(r);
            }
            sent.borrow().is_some() && received.borrow().is_some()
        }));
        assert!(sent.into_inner().unwrap().is_ok(), "{case}");
        let received = received.into_inner().unwrap();
        if len <= cap {
            assert_eq!(received.unwrap().len, len as u64, "{case}");
            assert!(buf[..len] == msg[..], "{case}: landed");
        } else {
            assert!(
                matches!(received, Err(Error::Truncated { .. })),
                "{case}: {received:?}"
            );
            assert!(buf[..] == msg[..cap], "{case}: truncated");
        }
        // Whatever is still on its way arrives: nothing more is owed or dropped.
        let later = net.borrow().now() + Duration::from_millis(50);
        drive_until(&net, &stations, &pps, [true, true], |_| {
            net.borrow().now() >= later
        });
        for pp in &pps {
            let st = pp.st.borrow();
            assert!(st.is_quiet(), "{case}: something left under way");
            assert_eq!(
                st.stats.dropped, 0,
                "{case}: a message dropped (a second Done?)"
            );
        }
    }
}

/// A receive whose wait gave up (an error elsewhere) after its pull request left:
/// its buffer goes back to the application, and the bytes its sender answers with
/// later are dropped, never written into it; the sender completes.
#[test]
fn an_abandoned_receive_writes_nothing_more_into_its_buffer() {
    let msg = payload(1, 0, 200_000);
    let mut buf = vec![0u8; msg.len()];
    let (net, stations, pps, _store, recv, send) = pull_requested(&msg, &mut buf);
    pps[0].abandon(&stations[0], recv);
    buf.fill(0xEE);
    assert!(drive_until(&net, &stations, &pps, [true, true], |pps| {
        pps[1].take_if_done(send).is_some_and(|r| r.is_ok())
    }));
    // Whatever is still on its way arrives.
    let later = net.borrow().now() + Duration::from_millis(100);
    drive_until(&net, &stations, &pps, [true, true], |_| {
        net.borrow().now() >= later
    });
    assert!(
        buf.iter().all(|&b| b == 0xEE),
        "a byte landed after the receive was abandoned"
    );
    assert!(pps[0].st.borrow().is_quiet() && pps[1].st.borrow().is_quiet());
    assert!(
        pps[0].st.borrow().stats.dropped > 0,
        "the answer's bytes were dropped"
    );
}

/// A send whose wait gave up (an error elsewhere) while its receiver's pull request
/// was on its way: the request finds nothing to answer (the buffer is never read
/// again: what the application writes into it afterwards never reaches the receiver),
/// and the receive fails with the sender's word instead of waiting for ever. (Over the
/// network an answer is handed to the channel whole at once; a range the outbox still
/// reads is dropped by `Outbox::drop_ranges`, tested with the outbox.)
#[test]
fn an_abandoned_send_reads_nothing_more_and_fails_its_receive() {
    let mut msg = payload(1, 0, 200_000);
    msg.iter_mut().for_each(|b| *b &= 0x7f);
    let mut buf = vec![0u8; msg.len()];
    let (net, stations, pps, _store, recv, send) = pull_requested(&msg, &mut buf);
    pps[1].abandon(&stations[1], send);
    msg.fill(0xFF);
    let result = RefCell::new(None);
    assert!(drive_until(&net, &stations, &pps, [true, true], |pps| {
        if let Some(r) = pps[0].take_if_done(recv) {
            *result.borrow_mut() = Some(r);
        }
        result.borrow().is_some()
    }));
    let result = result.into_inner().unwrap();
    assert!(
        matches!(&result, Err(Error::Protocol { rank: 1, reason }) if reason.contains("abandoned")),
        "{result:?}"
    );
    assert!(
        !buf.contains(&0xFF),
        "a byte was read from the send buffer after it was abandoned"
    );
    assert!(pps[0].st.borrow().is_quiet() && pps[1].st.borrow().is_quiet());
}

/// One step of a rank's program in [`blocking_calls_land_unposted_or_fall_back`].
#[derive(Clone, Copy)]
enum Step {
    /// A blocking send of the rank's message `i`.
    Send(usize),
    /// A non-blocking send of the rank's message `i`, waited for at the end.
    Isend(usize),
    /// A blocking receive of the peer's message `k` into `cap` bytes.
    Recv(usize, usize),
}

/// Where a rank's blocking call is (the polls of its wait, one at a time).
enum Blocked {
    /// A send with a record, waiting for its receiver.
    Send(u64),
    /// A receive not posted (`PushPull::recv` while nothing else is under way).
    Unposted(usize, Vec<u8>),
    /// A posted receive.
    Posted(usize, Vec<u8>, u64),
}

/// Blocking calls as `Tagged::send` and `Tagged::recv` make them, step by step, in a
/// ping-pong of messages of every size between two nodes, clean and under seeded
/// faults: a message sent whole lands in the receive that waits for it unposted; a
/// message of another tag (rank 0 now and then sends one that rank 1 takes only at the
/// end), a longer one or one too long for its receive's buffer posts the receive first
/// and is handled as any other; every receive gets its bytes and status, in order.
#[test]
fn blocking_calls_land_unposted_or_fall_back() {
    for seed in 0..4u64 {
        let faults = if seed == 0 {
            FaultConfig::none()
        } else {
            FaultConfig::parse(&format!("loss=0.03,dup=0.02,reorder=0.03,seed={seed}")).unwrap()
        };
        // The last seed with a small pushed buffer: senders run out of credit.
        let push_credit = if seed == 3 {
            16 << 10
        } else {
            Config::default().push_credit
        };
        let config = Config {
            push_credit,
            ..two_nodes()
        };
        let (net, stations, jobs, _store) = station_pair_in(&config, &faults);
        let pps = [0, 1].map(|r| {
            PushPull::new(
                State::new(&config, 2),
                SingleCopy::open(&jobs[r], DPID).unwrap(),
                r as u32,
            )
        });
        let mut rng = SimRng::new(seed);
        let mut len = || match rng.below(3) {
            0 => rng.below(64) as usize,
            1 => 64 + rng.below(4000) as usize,
            _ => 4096 + rng.below(30_000) as usize,
        };
        let mut sends: [Vec<(usize, u32)>; 2] = Default::default();
        let mut programs: [Vec<Step>; 2] = Default::default();
        let mut asides = Vec::new();
        let mut rng = SimRng::new(seed + 1000);
        let mut cap = |len: usize| if rng.below(6) == 0 { len * 6 / 10 } else { len };
        for round in 0..60 {
            // (Short: a write that waits for room in the simulator would wait for ever,
            // its peer not running meanwhile.)
            if round % 10 == 2 {
                sends[0].push((len() % 1500, 9));
                programs[0].push(Step::Isend(sends[0].len() - 1));
                asides.push(sends[0].len() - 1);
            }
            let tag = round % 3;
            if round % 7 == 3 {
                // Two messages of one tag back to back: the receives take them in order.
                let l = len();
                sends[0].push((l, tag));
                let i = sends[0].len() - 1;
                programs[0].push(Step::Send(i));
                programs[1].push(Step::Recv(i, cap(l)));
            }
            for r in 0..2 {
                let l = len();
                sends[r].push((l, tag));
                let i = sends[r].len() - 1;
                programs[r].push(Step::Send(i));
                programs[1 - r].push(Step::Recv(i, cap(l)));
            }
            // So rank 0 sends the ping and then receives the pong, rank 1 the other way.
        }
        for k in asides {
            programs[1].push(Step::Recv(k, cap(sends[0][k].0)));
        }
        let data: [Vec<Vec<u8>>; 2] = [0, 1].map(|r| {
            sends[r]
                .iter()
                .enumerate()
                .map(|(i, &(l, _))| payload(r as u32, i, l))
                .collect()
        });
        let (mut next, mut blocked) = ([0usize; 2], [None, None]);
        let mut isends = Vec::new();
        let mut idle = 0;
        // Sends that left without a record, receives landed unposted, receives posted
        // by a message that came first.
        let (mut eager, mut landed, mut fell_back) = (0, 0, 0);
        while (0..2).any(|r| next[r] < programs[r].len() || blocked[r].is_some()) {
            let mut moved = false;
            for r in 0..2 {
                let (pp, station) = (&pps[r], &stations[r]);
                let peer = 1 - r as u32;
                blocked[r] = match blocked[r].take() {
                    None if next[r] < programs[r].len() => {
                        moved = true;
                        next[r] += 1;
                        match programs[r][next[r] - 1] {
                            Step::Send(i) => {
                                let (d, tag) = (&data[r][i], sends[r][i].1);
                                if pp.send_eager(station, peer, tag, d).unwrap() {
                                    eager += 1;
                                    None
                                } else {
                                    let id =
                                        pp.start_send(station, peer, tag, d, true, false).unwrap();
                                    Some(Blocked::Send(id.unwrap()))
                                }
                            }
                            Step::Isend(i) => {
                                let (d, tag) = (&data[r][i], sends[r][i].1);
                                let id = pp.start_send(station, peer, tag, d, true, false).unwrap();
                                isends.push(id.unwrap());
                                None
                            }
                            Step::Recv(k, cap) => {
                                let mut buf = vec![0xEE; cap];
                                let (src, tag) = (Src::Rank(peer), Tag::Is(sends[1 - r][k].1));
                                if pp.nothing_under_way(src, tag) {
                                    Some(Blocked::Unposted(k, buf))
                                } else {
                                    let id = pp
                                        .start_recv(station, buf.as_mut_ptr(), cap, src, tag)
                                        .unwrap();
                                    Some(Blocked::Posted(k, buf, id))
                                }
                            }
                        }
                    }
                    None => {
                        // Done with its program: it still answers and retransmits, as a
                        // rank in its next call (or closing its endpoint) does.
                        pp.progress(station).unwrap();
                        None
                    }
                    Some(Blocked::Send(id)) => {
                        moved |= pp.poll(station).unwrap();
                        match pp.take_if_done(id) {
                            Some(result) => {
                                result.unwrap();
                                moved = true;
                                None
                            }
                            None => Some(Blocked::Send(id)),
                        }
                    }
                    Some(Blocked::Unposted(k, mut buf)) => {
                        let tag = Tag::Is(sends[1 - r][k].1);
                        let (ptr, cap) = (buf.as_mut_ptr(), buf.len());
                        match pp.direct_step(station, ptr, cap, Src::Rank(peer), tag, None) {
                            Ok(None) => Some(Blocked::Unposted(k, buf)),
                            Ok(Some(Direct::Landed(result))) => {
                                let result = result.map_err(|e| *e);
                                check_receive(r, k, sends[1 - r][k], &buf, result);
                                (landed, moved) = (landed + 1, true);
                                None
                            }
                            Ok(Some(Direct::Posted(id))) => {
                                (fell_back, moved) = (fell_back + 1, true);
                                Some(Blocked::Posted(k, buf, id))
                            }
                            Err(e) => panic!("rank {r}, receive {k}: {e}"),
                        }
                    }
                    Some(Blocked::Posted(k, buf, id)) => {
                        moved |= pp.poll(station).unwrap();
                        match pp.take_if_done(id) {
                            Some(result) => {
                                check_receive(r, k, sends[1 - r][k], &buf, result);
                                moved = true;
                                None
                            }
                            None => Some(Blocked::Posted(k, buf, id)),
                        }
                    }
                };
            }
            if !moved {
                // (A bound on rounds, not on virtual time: timers keep the time moving
                // in small steps.)
                idle += 1;
                let state = |b: &Option<Blocked>| match b {
                    Some(Blocked::Send(_)) => "sending",
                    Some(Blocked::Unposted(..)) => "receiving unposted",
                    Some(Blocked::Posted(..)) => "receiving posted",
                    None => "-",
                };
                assert!(
                    idle < 200_000,
                    "seed {seed}: stuck at steps {next:?}, {} and {}",
                    state(&blocked[0]),
                    state(&blocked[1])
                );
                assert!(
                    advance_stations(&net, &stations),
                    "seed {seed}: nothing left to happen at steps {next:?}"
                );
            }
        }
        assert!(
            eager > 0 && landed > 0 && fell_back > 0,
            "seed {seed}: eager {eager}, landed {landed}, fell back {fell_back}"
        );
        for id in isends {
            assert!(drive_until(&net, &stations, &pps, [true, true], |pps| {
                pps[0].take_if_done(id).is_some_and(|r| r.is_ok())
            }));
        }
        // What is still on its way (credits, acknowledgements) arrives; then nothing is
        // left in flight and every pushed byte is accounted for.
        let until = net.borrow().now() + Duration::from_millis(100);
        drive_until(&net, &stations, &pps, [true, true], |_| {
            net.borrow().now() >= until
        });
        for r in 0..2 {
            let st = pps[r].st.borrow();
            assert_eq!(
                st.stats.dropped, 0,
                "seed {seed}: rank {r} dropped messages"
            );
            assert!(
                st.is_quiet(),
                "seed {seed}: rank {r} has something in flight"
            );
            assert_eq!(
                st.push_in_flight(1 - r as u32),
                pps[1 - r].st.borrow().push_owed(r as u32),
                "seed {seed}: rank {r}'s push credit"
            );
            // Every byte received was given back but for less than the quarter of the
            // credit that goes back in one `Credit` (a landing that forgot to give its
            // bytes back would leave more with the small credit of the last seed).
            assert!(
                st.push_owed(1 - r as u32) < push_credit as u64 / 4,
                "seed {seed}: rank {r} keeps {} pushed bytes",
                st.push_owed(1 - r as u32)
            );
        }
    }
}

mod properties {
    use super::*;
    use crate::engine::sim_tests::properties::{arb_faults, cases};
    use proptest::prelude::*;

    fn arb_mode() -> impl Strategy<Value = PushMode> {
        prop_oneof![
            Just(PushMode::Pull),
            Just(PushMode::Zero),
            Just(PushMode::All)
        ]
    }

    fn arb_side() -> impl Strategy<Value = Side> {
        let len = prop_oneof![
            3 => 0usize..64,
            3 => 64usize..20_000,
            1 => 20_000usize..300_000,
        ];
        (
            arb_mode(),
            0usize..20_000,
            0usize..20_000,
            prop_oneof![Just(None), Just(Some(0)), (0usize..300_000).prop_map(Some)],
            prop::collection::vec(
                (len, 0u32..3, prop_oneof![5 => Just(100u8), 1 => 0u8..100]),
                1..24,
            ),
        )
            .prop_map(|(mode, btp1, btp2, pipeline_max, msgs)| Side {
                mode,
                btp1,
                btp2,
                pipeline_max,
                sends: msgs.iter().map(|&(len, tag, _)| (len, tag)).collect(),
                caps: msgs.iter().map(|&(_, _, cap)| cap).collect(),
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// Random messages, modes, BTPs, capacities, schedules and seeded faults: every
        /// operation ends as its message calls for, within the virtual-time bound.
        #[test]
        fn push_pull_completes_every_operation_under_random_faults(
            a in arb_side(),
            b in arb_side(),
            faults in arb_faults(),
            schedule in any::<u64>(),
            credit in prop_oneof![Just(8usize << 20), 1usize..(64 << 10)],
        ) {
            exchange_with_credit(&[a, b], &faults, schedule, credit);
        }
    }
}
