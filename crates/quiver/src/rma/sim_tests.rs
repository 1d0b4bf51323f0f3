//! The remote-operation protocol in the simulator: the real target and origin state
//! (`serve::State`) on two whole stations over the simulated network, in virtual time,
//! under seeded loss, duplication, reordering and corruption. Rank 0 issues puts (in
//! pieces of one frame, as `Rma::put` cuts them), fetch-and-adds, accumulates, gets and flushes to
//! rank 1's window; rank 1 only drives its station. No operation may be applied twice
//! or lost: every fetch-and-add and every accumulate answers a distinct old value and the word ends at their
//! sum, every flush is answered only after every put before it is in the window, and
//! every get returns what the puts left.

use super::memory::WindowMemory;
use super::ops::{self, At, AtomicOp, Status};
use super::reduce::{Element, Number, Reduce};
use super::serve::{Exposure, Landing, OnState, Pending, State};
use super::window::{SharedObject, PUBLISHED_IDS};
use crate::addr::Source;
use crate::config::{Config, TransportChoice};
use crate::engine::protocol::Outbox;
use crate::engine::sim_tests::{advance_stations, station_pair_in, SimStation, DPID};
use crate::link::fault::{FaultConfig, SimRng};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WINDOW: usize = 1 << 20;
const GENERATION: u32 = 0x1234_5678;

/// Drives both stations until `done` says so (bounded in virtual time).
fn drive_until(
    net: &std::rc::Rc<std::cell::RefCell<crate::link::sim::SimNet>>,
    stations: &[SimStation; 2],
    states: &[Mutex<State>; 2],
    outs: &mut [Outbox; 2],
    mut done: impl FnMut() -> bool,
    what: &str,
) {
    let until = net.borrow().now() + Duration::from_secs(30);
    while !done() {
        for r in 0..2 {
            let mut h = OnState {
                state: &states[r],
                woke: false,
                handled: 0,
            };
            while let Some(m) = stations[r].drive(&mut h, &mut outs[r], |e| e).unwrap() {
                stations[r].release_token(m.token);
            }
        }
        if done() {
            break;
        }
        assert!(
            net.borrow().now() < until && advance_stations(net, stations),
            "stuck waiting for {what}"
        );
    }
}

/// One run of `rounds` rounds of puts, adds, a get and a flush; panics on any
/// difference. Returns the retransmissions of both ranks.
fn operations(faults: &FaultConfig, seed: u64, rounds: usize) -> u64 {
    let config = Config {
        transport: TransportChoice::Udp,
        connect_timeout: Duration::from_secs(2),
        ..Config::default()
    };
    let (net, stations, jobs, _dir) = station_pair_in(&config, faults);
    let mem = Arc::new(WindowMemory::shared(
        SharedObject::create(
            jobs[1].job_id(),
            1,
            PUBLISHED_IDS | 1 << 29 | (seed as u32 & 0xffff),
            WINDOW,
            true,
        )
        .unwrap(),
    ));
    let states = [Mutex::new(State::default()), Mutex::new(State::default())];
    states[1].lock().unwrap().exposed.insert(
        0,
        Exposure {
            mem: mem.clone(),
            generation: GENERATION,
        },
    );
    let mut outs = [Outbox::new(usize::MAX), Outbox::new(usize::MAX)];
    let to1 = stations[0]
        .connect(Source {
            rank: 1,
            dpid: DPID,
        })
        .unwrap();
    let piece = stations[0].frame_payload(to1).expect("a network route") - ops::PUT_LEN;
    let mut rng = SimRng::new(seed);
    let mut model = vec![0u8; WINDOW];
    let mut olds = Vec::new();
    let mut acc_olds = Vec::new();
    let mut id = 0u64;
    let at = |offset: u64| At {
        window: 0,
        generation: GENERATION,
        offset,
    };
    for round in 0..rounds {
        // A few puts of random ranges (the first 24 bytes are the counter's, the
        // accumulate lock's and the accumulated pair's).
        for _ in 0..1 + rng.below(3) {
            let len = 1 + rng.below(6000) as usize;
            let offset = 24 + rng.below((WINDOW - 24 - len) as u64) as usize;
            let data: Vec<u8> = (0..len).map(|k| (round * 7 + k) as u8).collect();
            model[offset..offset + len].copy_from_slice(&data);
            for (i, chunk) in data.chunks(piece).enumerate() {
                let head = ops::put(at((offset + i * piece) as u64));
                assert!(stations[0].send(to1, &head, chunk, false).unwrap());
            }
        }
        // Fetch-and-adds, issued back to back.
        let adds: Vec<u64> = (0..1 + rng.below(4))
            .map(|_| {
                id += 1;
                states[0]
                    .lock()
                    .unwrap()
                    .pending
                    .insert(id, (1, Pending::Atomic(None)));
                let m = ops::atomic(at(0), AtomicOp::FetchAdd, id, 3, 0);
                assert!(stations[0].send(to1, &m, &[], false).unwrap());
                id
            })
            .collect();
        // Accumulates of (1, 2) into the pair of u32s at 16, fetching it, under the
        // lock word at 8.
        let accs: Vec<u64> = (0..1 + rng.below(3))
            .map(|_| {
                id += 1;
                states[0].lock().unwrap().pending.insert(
                    id,
                    (
                        1,
                        Pending::Accumulate {
                            len: 8,
                            fetch: true,
                            answer: None,
                        },
                    ),
                );
                let head = ops::accumulate(ops::AccumulateHead {
                    at: at(16),
                    op: Reduce::Sum as u8,
                    fetch: true,
                    elem: Element::Num(Number::U32),
                    lock: at(8),
                    id,
                    len: 8,
                });
                let data = [1u32.to_ne_bytes(), 2u32.to_ne_bytes()].concat();
                assert!(stations[0].send(to1, &head, &data, false).unwrap());
                id
            })
            .collect();
        // A flush, then a get of a random range.
        id += 1;
        let flush = id;
        states[0]
            .lock()
            .unwrap()
            .pending
            .insert(flush, (1, Pending::Flush(None)));
        assert!(stations[0]
            .send(to1, &ops::flush(flush), &[], false)
            .unwrap());
        let model_at_flush = model.clone();
        let mem_at_flush = mem.clone();
        let mut flushed_ok = false;
        drive_until(
            &net,
            &stations,
            &states,
            &mut outs,
            || {
                let s = states[0].lock().unwrap();
                let answered = s.pending.get(&flush).is_some_and(|(_, p)| p.done());
                if answered && !flushed_ok {
                    // Every put before the flush is in the window when it is answered.
                    // SAFETY: the window is WINDOW bytes; only this thread touches it.
                    let bytes = unsafe { std::slice::from_raw_parts(mem_at_flush.ptr(), WINDOW) };
                    assert!(
                        bytes[24..] == model_at_flush[24..],
                        "round {round}: flush before its puts"
                    );
                    flushed_ok = true;
                }
                answered
                    && adds
                        .iter()
                        .chain(&accs)
                        .all(|i| s.pending.get(i).is_some_and(|(_, p)| p.done()))
            },
            "the flush and the adds",
        );
        {
            let mut s = states[0].lock().unwrap();
            assert!(matches!(
                s.pending.remove(&flush),
                Some((1, Pending::Flush(Some((Status::Done, 0)))))
            ));
            for i in adds {
                match s.pending.remove(&i) {
                    Some((1, Pending::Atomic(Some((Status::Done, v))))) => olds.push(v),
                    other => panic!("add {i}: {other:?}"),
                }
            }
            for i in accs {
                match s.pending.remove(&i) {
                    Some((
                        1,
                        Pending::Accumulate {
                            answer: Some((Status::Done, was)),
                            ..
                        },
                    )) => acc_olds.push(was),
                    other => panic!("accumulate {i}: {other:?}"),
                }
            }
        }
        // Up to three chunks of pieces (the window has room for them): a large get
        // asks for its chunks as its answer arrives, through the lossy channel too.
        let answer_piece = (piece + ops::PUT_LEN - ops::GOT_LEN) as u32;
        let most = 3 * answer_piece as u64 * crate::rma::serve::GET_CHUNK_PIECES;
        let len = 1 + rng.below(most.min(WINDOW as u64 - 1)) as usize;
        let offset = rng.below((WINDOW - len) as u64) as usize;
        id += 1;
        let get = id;
        let (pending, m) = Pending::get(
            get,
            Landing::Owned(vec![0; len]),
            at(offset as u64),
            answer_piece,
        );
        states[0].lock().unwrap().pending.insert(get, (1, pending));
        assert!(stations[0].send(to1, &m, &[], false).unwrap());
        drive_until(
            &net,
            &stations,
            &states,
            &mut outs,
            || {
                states[0]
                    .lock()
                    .unwrap()
                    .pending
                    .get(&get)
                    .is_some_and(|(_, p)| p.done())
            },
            "the get",
        );
        let counter = crate::rma::serve::word(&states[1].lock().unwrap().exposed, at(0))
            .unwrap()
            .load(Ordering::Acquire);
        model[..8].copy_from_slice(&counter.to_le_bytes());
        // SAFETY: the window is WINDOW bytes; only this thread touches it.
        let pair = unsafe { std::slice::from_raw_parts(mem.ptr().add(16), 8) };
        model[16..24].copy_from_slice(pair);
        match states[0].lock().unwrap().pending.remove(&get) {
            Some((
                1,
                Pending::Get {
                    buf,
                    status: Status::Done,
                    ..
                },
            )) => assert!(
                buf.into_vec() == model[offset..offset + len],
                "round {round}: get"
            ),
            other => panic!("get: {other:?}"),
        }
    }
    // No add applied twice or lost: the old values are 0, 3, 6, ... in order.
    let expected: Vec<u64> = (0..olds.len() as u64).map(|k| 3 * k).collect();
    assert_eq!(olds, expected);
    // Nor an accumulate: the pairs before are (0, 0), (1, 2), (2, 4), ... in order.
    let expected: Vec<Vec<u8>> = (0..acc_olds.len() as u32)
        .map(|k| [k.to_ne_bytes(), (2 * k).to_ne_bytes()].concat())
        .collect();
    assert_eq!(acc_olds, expected);
    for s in &states {
        let c = s.lock().unwrap().counters;
        assert_eq!((c.refused, c.malformed), (0, 0), "{c:?}");
    }
    let (a, b) = (stations[0].stats(), stations[1].stats());
    a.retransmissions + a.fast_retransmits + b.retransmissions + b.fast_retransmits
}

#[test]
fn remote_operations_are_applied_once_and_flushes_are_honest_under_faults() {
    operations(&FaultConfig::none(), 0, 30);
    let mut repaired = 0;
    for seed in 1..=3u64 {
        let faults = FaultConfig::parse(&format!(
            "loss=0.05,dup=0.03,reorder=0.05,reorder_delay=200us,corrupt=0.01,seed={seed}"
        ))
        .unwrap();
        repaired += operations(&faults, seed, 30);
    }
    assert!(
        repaired > 0,
        "the faults never made the channels repair anything"
    );
}
