//! One-sided operations in whole jobs (ranks are threads of the test process; over
//! Ethernet each runs on a node of its own of an emulated cluster): puts and gets of
//! every size with every byte checked, concurrent fetch-and-add from every rank summing
//! exactly, typed accumulates from every rank under one lock word summing exactly,
//! compare-and-swap and swap, ranges outside a window and misaligned words
//! refused at the origin, requests for a freed window refused by the target, and a
//! target served by the offload engine while its application does not call quiver.

mod common;

use common::{config, pattern, run_ranks};
use quiver::rma::reduce::{Element, Number, Reduce};
use quiver::rma::{dmsg, pvm, rrmsg, Combine, Rma, RmaError, Strided};
use quiver::{Config, Error, ReliabilityMode, TransportChoice};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const DPID: u16 = 60;
const ADDS: u64 = 300;
const F32: Element = Element::Num(Number::F32);
const I32: Element = Element::Num(Number::I32);
const I16: Element = Element::Num(Number::I16);

fn sizes() -> Vec<usize> {
    // 1 000 000: over the network, a get asked in chunks (`serve::GET_CHUNK_PIECES`).
    vec![
        0, 1, 7, 8, 1000, 1472, 1473, 4096, 9000, 65536, 200_000, 1_000_000,
    ]
}

/// Each rank's part of window 1: room for every size, and a different length per rank.
fn data_len(rank: u32) -> usize {
    sizes().iter().sum::<usize>() + 64 * rank as usize
}

/// Every rank puts every size into the next rank's window 1 (one after the other, at
/// increasing offsets), flushes, and after a barrier checks what the previous rank put
/// into its own window, then gets it back from the next rank and compares; every rank
/// adds 1 to word 0 of rank 0's window 0 `ADDS` times and rank 0 finds the exact sum;
/// compare-and-swap and swap return what they found.
fn every_operation(c: Config, size: u32) {
    every_operation_on(c, size, Memory::Allocated);
}

/// What the windows of [`every_operation_on`] are made of.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Memory {
    /// The node's shared pool, a window each ([`Rma::allocate`]).
    Allocated,
    /// Parts of one piece of the shared pool, at offsets, the window numbers skipped
    /// ahead ([`Rma::alloc_memory`], [`Rma::expose`], [`Rma::skip_window_numbers`]).
    Parts,
    /// Vectors handed over ([`Rma::register`]).
    Registered,
    /// The application's buffers, lent ([`Rma::register_borrowed`]).
    Lent,
}

/// [`every_operation`] on windows of `memory`; at the end the ranks free their windows
/// (registered memory comes back holding what was put into it; lent memory holds it).
fn every_operation_on(c: Config, size: u32, memory: Memory) {
    let (same_node, cma) = (c.transport == TransportChoice::Auto, c.cma);
    let offload = c.reliability == ReliabilityMode::Offload;
    let registered = matches!(memory, Memory::Registered | Memory::Lent);
    run_ranks(size, c, move |job| {
        let rma = Rma::open(&job, DPID).unwrap();
        let (me, n) = (job.rank(), job.size());
        // Lent buffers outlive their windows; 8-byte aligned (u64s) for the atomics.
        let mut lent: Vec<Vec<u64>> = Vec::new();
        let shared = rma.alloc_memory(8192 + data_len(me)).unwrap();
        if memory == Memory::Parts {
            rma.skip_window_numbers(5).unwrap();
            assert!(rma.skip_window_numbers(4).is_err(), "numbers only go up");
        }
        let mut window = |len: usize| match memory {
            Memory::Allocated => rma.allocate(len).unwrap(),
            Memory::Registered => rma.register(vec![0u8; len]).unwrap(),
            Memory::Parts => {
                let offset = if len == 64 { 24 } else { 4096 };
                rma.expose(&shared, offset, len).unwrap()
            }
            Memory::Lent => {
                lent.push(vec![0u64; len.div_ceil(8)]);
                let buf = lent.last_mut().unwrap();
                // SAFETY: `lent` keeps the buffer, untouched, until after the window
                // is freed (collectively: no rank accesses it after).
                unsafe { rma.register_borrowed(buf.as_mut_ptr().cast(), len) }.unwrap()
            }
        };
        let counters = window(64);
        let data = window(data_len(me));
        let first = if memory == Memory::Parts { 5 } else { 0 };
        assert_eq!((counters.number(), data.number()), (first, first + 1));
        if memory == Memory::Parts {
            // The parts lie where they were asked for in the memory.
            assert_eq!(data.as_ptr(), shared.as_ptr().wrapping_add(4096));
            assert_eq!(shared.offset_of(data.as_ptr(), data.len()), Some(4096));
            assert!(rma.expose(&shared, 8192, data_len(me) + 1).is_err());
        }
        let next = (me + 1) % n;
        let prev = (me + n - 1) % n;
        let mut offset = 0u64;
        for (i, &len) in sizes().iter().enumerate() {
            rma.put(next, &data, offset, &pattern(me, i as u32, len))
                .unwrap();
            offset += len as u64;
        }
        for _ in 0..ADDS {
            rma.fetch_add(0, &counters, 0, 1).unwrap();
        }
        // Typed accumulates into rank 0's window under its lock word 56, from every rank
        // at once: four floats summed, an int fetched and added (its tickets rise), and a
        // short counted up by fetch and compare-and-swap.
        let lock = (&counters, 56);
        let floats: Vec<u8> = [1.0f32, 2.0, 0.5, -1.0]
            .iter()
            .flat_map(|f| f.to_ne_bytes())
            .collect();
        let mut last = -1i32;
        for _ in 0..ADDS {
            rma.accumulate(0, &counters, 16, F32, Reduce::Sum, &floats, lock, None)
                .unwrap();
            let mut was = [0u8; 4];
            rma.accumulate(
                0,
                &counters,
                32,
                I32,
                Reduce::Sum,
                &1i32.to_ne_bytes(),
                lock,
                Some(&mut was),
            )
            .unwrap();
            let ticket = i32::from_ne_bytes(was);
            assert!(ticket > last, "tickets rise: {ticket} after {last}");
            last = ticket;
        }
        for _ in 0..ADDS / 10 {
            loop {
                let mut cur = [0u8; 2];
                rma.accumulate(
                    0,
                    &counters,
                    40,
                    I16,
                    Reduce::NoOp,
                    &[],
                    lock,
                    Some(&mut cur),
                )
                .unwrap();
                let new = (i16::from_ne_bytes(cur) + 1).to_ne_bytes();
                let mut old = [0u8; 2];
                rma.compare_swap_elements(0, &counters, 40, I16, &cur, &new, lock, &mut old)
                    .unwrap();
                if old == cur {
                    break;
                }
            }
        }
        // While rank 0 holds its lock word (as an origin updating it directly does),
        // no accumulate lands: same-node origins wait for the word, other nodes'
        // requests for rank 0's engine, which runs again after it lets go.
        job.barrier_progressing(&[&rma]).unwrap();
        if me == 0 {
            counters.word(56).unwrap().store(1, Ordering::Release);
        }
        job.barrier_progressing(&[&rma]).unwrap();
        if me == 0 {
            std::thread::sleep(Duration::from_millis(50));
            if offload {
                // The offload engine's thread serves the other nodes' requests
                // meanwhile: it answers busy, and they ask again.
                let until = std::time::Instant::now() + Duration::from_secs(20);
                while rma.stats().busy == 0 {
                    assert!(std::time::Instant::now() < until, "never answered busy");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let mut held = [0u8; 4];
            counters.read(48, &mut held).unwrap();
            assert_eq!(held, [0; 4], "nothing lands while the lock is held");
            counters.word(56).unwrap().store(0, Ordering::Release);
        } else {
            rma.accumulate(
                0,
                &counters,
                48,
                I32,
                Reduce::Sum,
                &1i32.to_ne_bytes(),
                lock,
                None,
            )
            .unwrap();
        }
        // What is not an accumulate is refused before anything is sent.
        for bad in [
            rma.accumulate(0, &counters, 16, F32, Reduce::Band, &floats, lock, None),
            rma.accumulate(0, &counters, 16, F32, Reduce::Sum, &floats[..6], lock, None),
            rma.accumulate(
                0,
                &counters,
                16,
                F32,
                Reduce::Sum,
                &floats,
                (&counters, 52),
                None,
            ),
            rma.accumulate(0, &counters, 56, F32, Reduce::Sum, &floats, lock, None),
            rma.compare_swap_elements(
                0,
                &counters,
                16,
                Element::Bytes { size: 0 },
                &[],
                &[],
                lock,
                &mut [],
            ),
        ] {
            assert!(
                matches!(
                    bad,
                    Err(Error::Rma(
                        RmaError::BadAccumulate { .. }
                            | RmaError::Misaligned { .. }
                            | RmaError::OutOfBounds { .. }
                    ))
                ),
                "{bad:?}"
            );
        }
        rma.flush_all().unwrap();
        job.barrier_progressing(&[&rma]).unwrap();

        // What the previous rank put is here, byte for byte; nothing after it was touched.
        let mine = data.to_vec();
        let mut at = 0;
        for (i, &len) in sizes().iter().enumerate() {
            assert_eq!(
                mine[at..at + len],
                pattern(prev, i as u32, len),
                "size {len}"
            );
            at += len;
        }
        assert!(mine[at..].iter().all(|&b| b == 0));
        // And the next rank's window, read back, holds what this rank put there.
        let mut offset = 0u64;
        for (i, &len) in sizes().iter().enumerate() {
            let mut back = vec![0xee; len];
            rma.get(next, &data, offset, &mut back).unwrap();
            assert_eq!(back, pattern(me, i as u32, len), "get of {len} bytes");
            offset += len as u64;
        }
        // The same gets all in flight at once, each into a buffer of its own.
        let mut offset = 0u64;
        let mut requests = Vec::new();
        for &len in &sizes() {
            requests.push(rma.get_start(next, &data, offset, vec![0xee; len]).unwrap());
            offset += len as u64;
        }
        for (i, mut r) in requests.into_iter().enumerate() {
            if i % 2 == 0 {
                while !r.test().unwrap() {}
            }
            let len = sizes()[i];
            assert_eq!(
                r.wait().unwrap(),
                pattern(me, i as u32, len),
                "get_start of {len}"
            );
        }
        if me == 0 {
            assert_eq!(
                counters.word(0).unwrap().load(Ordering::Acquire),
                ADDS * u64::from(n)
            );
            let mut c = [0u8; 64];
            counters.read(0, &mut c).unwrap();
            let f = |i: usize| f32::from_ne_bytes(c[16 + 4 * i..20 + 4 * i].try_into().unwrap());
            let total = (ADDS * u64::from(n)) as f32;
            assert_eq!(
                [f(0), f(1), f(2), f(3)],
                [total, 2.0 * total, 0.5 * total, -total]
            );
            assert_eq!(
                i32::from_ne_bytes(c[32..36].try_into().unwrap()),
                total as i32
            );
            assert_eq!(
                i16::from_ne_bytes(c[40..42].try_into().unwrap()) as u64,
                ADDS / 10 * u64::from(n)
            );
            assert_eq!(
                u64::from_ne_bytes(c[56..64].try_into().unwrap()),
                0,
                "the lock is free"
            );
        }
        job.barrier_progressing(&[&rma]).unwrap();

        // Compare-and-swap on the next rank's word 8: one rank at a time would be a
        // race between ranks; each rank uses its own word of the next rank's window.
        let w = 8;
        assert_eq!(rma.compare_swap(next, &counters, w, 1, 5).unwrap(), 0);
        assert_eq!(rma.compare_swap(next, &counters, w, 0, 5).unwrap(), 0);
        assert_eq!(rma.swap(next, &counters, w, 9).unwrap(), 5);
        assert_eq!(rma.fetch_add(next, &counters, w, 1).unwrap(), 9);
        job.barrier_progressing(&[&rma]).unwrap();
        assert_eq!(counters.word(8).unwrap().load(Ordering::Acquire), 10);

        let stats = rma.stats();
        assert_eq!(stats.puts, sizes().len() as u64);
        assert_eq!(stats.gets, 2 * sizes().len() as u64);
        assert_eq!(stats.refused, 0);
        assert_eq!(stats.malformed, 0);
        if registered && same_node {
            // Same-node puts into registered memory go by cross-memory attach where it
            // is on, else as messages this rank's engine applied.
            assert_eq!(stats.puts_applied == 0, cma, "{stats:?}");
        }
        job.barrier_progressing(&[&rma]).unwrap();
        // A strided put (messages to the target's engine) then a get of the same bytes
        // without a flush: the get sees the put, whatever path each takes.
        let at = Strided {
            offset: 0,
            stride: 16,
            elem: 8,
            count: 4,
        };
        let src = pattern(me, 99, 32);
        rma.put_strided(next, &data, at, &src, 8).unwrap();
        let mut back = vec![0u8; 56];
        rma.get(next, &data, 0, &mut back).unwrap();
        for i in 0..4 {
            assert_eq!(
                back[i * 16..i * 16 + 8],
                src[i * 8..i * 8 + 8],
                "element {i}"
            );
        }
        rma.flush_all().unwrap();
        job.barrier_progressing(&[&rma]).unwrap();
        let expected = data.to_vec();
        let back = rma.free(data).unwrap();
        assert_eq!(back.is_some(), memory == Memory::Registered);
        if let Some(back) = back {
            assert!(
                back == expected,
                "the registered memory came back as it was"
            );
        }
        rma.free(counters).unwrap();
        if memory == Memory::Lent {
            let bytes: Vec<u8> = lent[1].iter().flat_map(|w| w.to_ne_bytes()).collect();
            assert!(
                bytes[..expected.len()] == expected,
                "the lent buffer holds the puts"
            );
        }
        if memory == Memory::Parts {
            // SAFETY: the windows are freed: nobody else writes the memory.
            let part =
                unsafe { std::slice::from_raw_parts(shared.as_ptr().add(4096), expected.len()) };
            assert!(part == expected, "the memory holds the puts");
        }
    });
}

#[test]
fn every_operation_on_registered_memory_over_shm() {
    every_operation_on(config(TransportChoice::Auto), 3, Memory::Registered);
}

#[test]
fn every_operation_on_lent_memory_over_shm() {
    every_operation_on(config(TransportChoice::Auto), 3, Memory::Lent);
}

#[test]
fn every_operation_on_parts_of_shared_memory_over_shm() {
    every_operation_on(config(TransportChoice::Auto), 3, Memory::Parts);
}

#[test]
fn every_operation_on_parts_of_shared_memory_over_udp() {
    every_operation_on(config(TransportChoice::Udp), 3, Memory::Parts);
}

#[test]
fn every_operation_on_registered_memory_over_shm_without_cross_memory_attach() {
    every_operation_on(
        config(TransportChoice::Auto).with_cma(false),
        3,
        Memory::Registered,
    );
}

#[test]
fn every_operation_on_registered_memory_over_udp() {
    every_operation_on(config(TransportChoice::Udp), 3, Memory::Registered);
}

#[test]
fn every_operation_over_shm() {
    every_operation(config(TransportChoice::Auto), 3);
}

#[test]
fn every_operation_over_udp() {
    every_operation(config(TransportChoice::Udp), 3);
}

#[test]
fn every_operation_over_udp_with_the_offload_engine() {
    every_operation(
        config(TransportChoice::Udp).with_reliability(ReliabilityMode::Offload),
        2,
    );
}

#[test]
fn every_operation_over_eth() {
    every_operation(config(TransportChoice::Eth), 2);
}

/// Windows that start off a word (a part of shared memory at an odd offset, lent memory
/// at an odd address): puts and gets work, atomics are refused as misaligned wherever
/// they are applied (in the mapping here, by the target's side over the network), and
/// the window's own words are too.
fn windows_off_a_word(c: Config) {
    run_ranks(2, c, move |job| {
        let rma = Rma::open(&job, DPID).unwrap();
        let other = 1 - job.rank();
        let shared = rma.alloc_memory(4096).unwrap();
        let part = rma.expose(&shared, 3, 64).unwrap();
        let mut lent = vec![0u64; 9];
        // SAFETY: `lent` outlives the window and is touched by nobody else.
        let odd =
            unsafe { rma.register_borrowed(lent.as_mut_ptr().cast::<u8>().add(1), 64) }.unwrap();
        for w in [&part, &odd] {
            assert!(matches!(
                rma_error(rma.fetch_add(other, w, 8, 1)),
                RmaError::Misaligned { .. }
            ));
            assert!(matches!(
                rma_error(rma.compare_swap(other, w, 0, 0, 1)),
                RmaError::Misaligned { .. }
            ));
            assert!(w.word(8).is_err(), "a word of its own off 8 bytes");
            rma.put(other, w, 5, b"hello").unwrap();
            rma.flush(other).unwrap();
            let mut back = [0u8; 5];
            rma.get(other, w, 5, &mut back).unwrap();
            assert_eq!(&back, b"hello");
        }
        job.barrier_progressing(&[&rma]).unwrap();
        rma.free(odd).unwrap();
        rma.free(part).unwrap();
        drop(lent);
    });
}

#[test]
fn atomics_on_windows_off_a_word_are_refused_over_shm() {
    windows_off_a_word(config(TransportChoice::Auto));
}

#[test]
fn atomics_on_windows_off_a_word_are_refused_over_udp() {
    windows_off_a_word(config(TransportChoice::Udp));
}

fn rma_error(r: quiver::Result<impl std::fmt::Debug>) -> RmaError {
    match r {
        Err(Error::Rma(e)) => e,
        other => panic!("expected an RMA error, got {other:?}"),
    }
}

/// Ranges outside the target's window and misaligned words fail at the origin with
/// the window's real length; a window the target never allocated fails after the key
/// wait; a window the target freed refuses puts (reported by the flush), gets and
/// atomics (over the network, where the target checks).
fn bad_requests(mut c: Config, target_checks: bool) {
    c.connect_timeout = Duration::from_millis(500);
    run_ranks(2, c, move |job| {
        let rma = Rma::open(&job, DPID).unwrap();
        let me = job.rank();
        let w = rma.allocate(100 + 100 * me as usize).unwrap();
        job.barrier_progressing(&[&rma]).unwrap();
        if me == 0 {
            // Rank 1's window is 200 bytes long, this rank's 100.
            rma.put(1, &w, 150, &[1; 50]).unwrap();
            assert_eq!(
                rma_error(rma.put(1, &w, 150, &[1; 51])),
                RmaError::OutOfBounds {
                    rank: 1,
                    window: 0,
                    offset: 150,
                    len: 51,
                    size: 200
                }
            );
            assert!(matches!(
                rma_error(rma.get(1, &w, u64::MAX - 1, &mut [0; 4])),
                RmaError::OutOfBounds { .. }
            ));
            assert!(matches!(
                rma_error(rma.fetch_add(1, &w, 4, 1)),
                RmaError::Misaligned { offset: 4, .. }
            ));
            assert!(matches!(
                rma_error(rma.fetch_add(1, &w, 200, 1)),
                RmaError::OutOfBounds { .. }
            ));
            assert!(matches!(
                rma.put(7, &w, 0, &[1]),
                Err(Error::NoSuchRank { .. })
            ));
            rma.flush(1).unwrap();
        }
        job.barrier_progressing(&[&rma]).unwrap();
        if me == 1 {
            let v = w.to_vec();
            assert!(v[150..].iter().all(|&b| b == 1) && v[..150].iter().all(|&b| b == 0));
        }
        // Window 1 exists on rank 0 only.
        let only_here = (me == 0).then(|| rma.allocate(64).unwrap());
        if let Some(only) = &only_here {
            assert_eq!(
                rma_error(rma.get(1, only, 0, &mut [0; 8])),
                RmaError::NoWindow { rank: 1, window: 1 }
            );
        }
        job.barrier_progressing(&[&rma]).unwrap();
        // Rank 1 frees window 0 after rank 0 knows its key.
        if me == 1 {
            drop(w);
            job.barrier_progressing(&[&rma]).unwrap();
            job.barrier_progressing(&[&rma]).unwrap();
        } else {
            job.barrier_progressing(&[&rma]).unwrap();
            if target_checks {
                rma.put(1, &w, 0, &[2; 10]).unwrap();
                rma.put(1, &w, 10, &[2; 10]).unwrap();
                match rma_error(rma.flush(1)) {
                    RmaError::PutsRefused {
                        rank: 1, count: 2, ..
                    } => {}
                    other => panic!("{other:?}"),
                }
                assert_eq!(
                    rma_error(rma.get(1, &w, 0, &mut [0; 8])),
                    RmaError::NoWindow { rank: 1, window: 0 }
                );
                assert_eq!(
                    rma_error(rma.swap(1, &w, 0, 3)),
                    RmaError::NoWindow { rank: 1, window: 0 }
                );
            }
            job.barrier_progressing(&[&rma]).unwrap();
        }
        if me == 1 && target_checks {
            assert_eq!(rma.stats().refused, 4);
        }
        job.barrier_progressing(&[&rma]).unwrap();
    });
}

#[test]
fn bad_requests_fail_cleanly_over_shm() {
    bad_requests(config(TransportChoice::Auto), false);
}

#[test]
fn bad_requests_fail_cleanly_over_udp() {
    bad_requests(config(TransportChoice::Udp), true);
}

/// With the offload engine, rank 1's window takes puts, answers gets and serves
/// fetch-and-add while rank 1's application sleeps without calling quiver.
#[test]
fn a_target_is_served_while_its_application_sleeps() {
    let c = config(TransportChoice::Udp).with_reliability(ReliabilityMode::Offload);
    let done = Arc::new(AtomicBool::new(false));
    run_ranks(2, c, move |job| {
        let rma = Rma::open(&job, DPID).unwrap();
        let w = rma.allocate(1 << 20).unwrap();
        job.barrier().unwrap();
        if job.rank() == 0 {
            let data = pattern(0, 1, 1 << 20);
            rma.put(1, &w, 0, &data).unwrap();
            rma.flush(1).unwrap();
            let mut back = vec![0; 1 << 20];
            rma.get(1, &w, 0, &mut back).unwrap();
            assert!(back == data);
            for i in 0..50 {
                assert_eq!(rma.fetch_add(1, &w, 8, 2).unwrap(), w8(&data) + 2 * i);
            }
            done.store(true, Ordering::Release);
        } else {
            // Not one call into quiver until rank 0 is done.
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(5));
            }
            let data = pattern(0, 1, 1 << 20);
            let mine = w.to_vec();
            assert_eq!(w.word(8).unwrap().load(Ordering::Acquire), w8(&data) + 100);
            assert!(mine[..8] == data[..8] && mine[16..] == data[16..]);
            assert!(rma.stats().puts_applied > 0);
        }
        job.barrier().unwrap();
    });
}

/// The little-endian word at byte 8 of `data`.
fn w8(data: &[u8]) -> u64 {
    u64::from_le_bytes(data[8..16].try_into().unwrap())
}

/// A distributed matrix transpose by strided puts (the deposit seed's FFT step): an
/// M x M matrix of u64, rows in blocks of `b` per rank; each rank deposits, for each of
/// its rows, the part of the row that belongs to each rank as a column there (8-byte
/// elements at a stride of one row). Then each rank reads a column block back with a
/// strided get, puts a permutation of its row with an indexed put into the next rank's
/// scratch window and reads it back with an indexed get, and counts arrivals with
/// put_notify / wait_counter.
fn transpose_and_scatter(c: Config, size: u32) {
    run_ranks(size, c, move |job| {
        let rma = Rma::open(&job, DPID + 1).unwrap();
        let (me, n) = (job.rank(), job.size());
        let b = 24u64;
        let m = b * u64::from(n);
        let value = |i: u64, j: u64| i * 1_000_003 + j;
        let a = rma.allocate((b * m * 8) as usize).unwrap();
        let t = rma.allocate((b * m * 8) as usize).unwrap();
        let scratch = rma.allocate((m * 8 + 64) as usize).unwrap();
        for li in 0..b {
            let i = u64::from(me) * b + li;
            let row: Vec<u8> = (0..m).flat_map(|j| value(i, j).to_le_bytes()).collect();
            a.write((li * m * 8) as usize, &row).unwrap();
        }
        job.barrier_progressing(&[&rma]).unwrap();
        let mine = a.to_vec();
        for q in 0..n {
            for li in 0..b {
                let i = u64::from(me) * b + li;
                // Row i's elements j in q's block go to t[j - q*b][i] at rank q.
                let from = (li * m + u64::from(q) * b) as usize * 8;
                let dst = Strided {
                    offset: i * 8,
                    stride: m * 8,
                    elem: 8,
                    count: b,
                };
                rma.put_strided(q, &t, dst, &mine[from..from + (b * 8) as usize], 8)
                    .unwrap();
            }
        }
        rma.flush_all().unwrap();
        job.barrier_progressing(&[&rma]).unwrap();
        let tv = t.to_vec();
        for lj in 0..b {
            let j = u64::from(me) * b + lj;
            for i in 0..m {
                let at = ((lj * m + i) * 8) as usize;
                let got = u64::from_le_bytes(tv[at..at + 8].try_into().unwrap());
                assert_eq!(got, value(i, j), "t[{j}][{i}] at rank {me}");
            }
        }
        // Column 3 of the next rank's block of `a`, read back with a strided get: one
        // element per row, into every other 8 bytes here.
        let next = (me + 1) % n;
        let mut col = vec![0u8; (b * 16) as usize];
        let src = Strided {
            offset: 3 * 8,
            stride: m * 8,
            elem: 8,
            count: b,
        };
        rma.get_strided(next, &a, src, &mut col, 16).unwrap();
        for li in 0..b {
            let at = (li * 16) as usize;
            let got = u64::from_le_bytes(col[at..at + 8].try_into().unwrap());
            assert_eq!(got, value(u64::from(next) * b + li, 3));
            assert!(col[at + 8..at + 16].iter().all(|&x| x == 0));
        }
        // An indexed put of this rank's first row, reversed, into the next rank's
        // scratch, then an indexed get of it in the original order.
        let row = &mine[..(m * 8) as usize];
        let src_offsets: Vec<u64> = (0..m).map(|j| j * 8).collect();
        let dst_offsets: Vec<u64> = (0..m).map(|j| (m - 1 - j) * 8).collect();
        rma.put_indexed(next, &scratch, &dst_offsets, row, &src_offsets, 8)
            .unwrap();
        rma.flush(next).unwrap();
        let mut back = vec![0u8; row.len()];
        rma.get_indexed(next, &scratch, &dst_offsets, &mut back, &src_offsets, 8)
            .unwrap();
        assert!(back == row, "indexed put and get");
        // Every rank tells rank 0 it is done through the counter at the end of rank 0's
        // scratch (after a put of its rank number next to it).
        let counter = m * 8 + 56;
        rma.put_notify(
            0,
            &scratch,
            m * 8 + u64::from(me % 6) * 8,
            &me.to_le_bytes(),
            counter,
        )
        .unwrap();
        if me == 0 {
            rma.wait_counter(&scratch, counter, u64::from(n)).unwrap();
            assert_eq!(
                scratch
                    .word(counter as usize)
                    .unwrap()
                    .load(Ordering::Acquire),
                0
            );
        }
        // Mismatched layouts and layouts past the buffer are refused before anything
        // is sent.
        let bad = Strided {
            offset: 0,
            stride: 8,
            elem: 8,
            count: 4,
        };
        assert!(matches!(
            rma_error(rma.put_strided(next, &t, bad, &[0; 31], 8)),
            RmaError::BadLayout { .. }
        ));
        assert!(matches!(
            rma_error(rma.put_strided(
                next,
                &t,
                Strided {
                    offset: b * m * 8 - 8,
                    ..bad
                },
                &[0; 32],
                8
            )),
            RmaError::OutOfBounds { .. }
        ));
        assert!(matches!(
            rma_error(rma.put_indexed(next, &t, &[0, 8], &[0; 16], &[0], 8)),
            RmaError::BadLayout { .. }
        ));
        job.barrier_progressing(&[&rma]).unwrap();
        let s = rma.stats();
        assert_eq!((s.refused, s.malformed), (0, 0), "{s:?}");
        job.barrier_progressing(&[&rma]).unwrap();
    });
}

#[test]
fn transpose_and_scatter_over_shm() {
    transpose_and_scatter(config(TransportChoice::Auto), 3);
}

#[test]
fn transpose_and_scatter_over_udp() {
    transpose_and_scatter(config(TransportChoice::Udp), 3);
}

#[test]
fn transpose_and_scatter_over_udp_with_the_offload_engine() {
    transpose_and_scatter(
        config(TransportChoice::Udp).with_reliability(ReliabilityMode::Offload),
        2,
    );
}

#[test]
fn transpose_and_scatter_over_eth() {
    transpose_and_scatter(config(TransportChoice::Eth), 2);
}

/// `ROUNDS` barriers: before barrier k every rank adds 1 to word 0 of rank 0's window,
/// after it every rank reads the word (a fetch-and-add of 0): it holds at least n*k
/// (everyone's add before barrier k is in) and at most n*(k+1) (no one can be two
/// barriers ahead). Then the combining tree with every operation.
fn barriers(size: u32, c: Config, on_cluster: Option<u32>) {
    const ROUNDS: u64 = 60;
    let body = |job: quiver::Job| {
        let rma = Rma::open(&job, DPID + 2).unwrap();
        let w = rma.allocate(64).unwrap();
        let n = u64::from(job.size());
        rma.barrier().unwrap();
        for k in 1..=ROUNDS {
            rma.fetch_add(0, &w, 0, 1).unwrap();
            rma.barrier().unwrap();
            let seen = rma.fetch_add(0, &w, 0, 0).unwrap();
            assert!(
                (n * k..=n * (k + 1)).contains(&seen),
                "after barrier {k}: {seen} adds (n = {n})"
            );
            // The combining tree, every op, with values that differ per rank and round.
            let v = u64::from(job.rank()) + k;
            let sum: u64 = (0..n).map(|r| r + k).sum();
            assert_eq!(rma.combine(v, Combine::Sum).unwrap(), sum);
            assert_eq!(rma.combine(v, Combine::Max).unwrap(), n - 1 + k);
            assert_eq!(rma.combine(v, Combine::Min).unwrap(), k);
            assert_eq!(
                rma.combine(1 << job.rank(), Combine::Or).unwrap(),
                (1 << n) - 1
            );
            assert_eq!(
                rma.combine(!(1 << job.rank()), Combine::And).unwrap(),
                !((1 << n) - 1)
            );
            // Per-pair acknowledgements: an empty put_notify to every other rank.
            for q in (0..job.size()).filter(|&q| q != job.rank()) {
                rma.put_notify(q, &w, 16, &[], 8).unwrap();
            }
            rma.wait_counter(&w, 8, n - 1).unwrap();
        }
        rma.barrier().unwrap();
        assert_eq!(rma.stats().malformed, 0);
    };
    match on_cluster {
        None => run_ranks(size, c, body),
        Some(nodes) => common::run_ranks_on_cluster(size, nodes, 0.0, c, body),
    }
}

#[test]
fn barriers_inside_a_node() {
    barriers(4, config(TransportChoice::Auto), None);
}

#[test]
fn barriers_between_ranks_over_udp() {
    barriers(3, config(TransportChoice::Udp), None);
}

#[test]
fn barriers_over_udp_with_the_offload_engine() {
    barriers(
        2,
        config(TransportChoice::Udp).with_reliability(ReliabilityMode::Offload),
        None,
    );
}

#[test]
fn barriers_across_nodes_of_two_ranks_over_eth() {
    barriers(6, config(TransportChoice::Eth), Some(3));
}

/// DMSG's all-to-all step (`quiver::rma::dmsg`): every block lands in its place on
/// every rank, with a barrier every round and with none, several steps in a row; and a
/// transpose by `alltoall_strided` (each rank's rows deposited as columns).
fn dmsg_steps(c: Config, size: u32) {
    run_ranks(size, c, |job| {
        let rma = Rma::open(&job, DPID + 3).unwrap();
        let (me, n) = (job.rank(), job.size());
        let block = 3000;
        let dst = rma.allocate(block * n as usize).unwrap();
        for (step, r) in [(0u32, 1), (1, n - 1), (2, 2)] {
            let src: Vec<u8> = (0..n)
                .flat_map(|j| pattern(me * 100 + j, step, block))
                .collect();
            dmsg::alltoall(&rma, &src, &dst, block, r).unwrap();
            let got = dst.to_vec();
            for i in 0..n {
                let at = i as usize * block;
                assert!(
                    got[at..at + block] == pattern(i * 100 + me, step, block),
                    "step {step}: block from rank {i}"
                );
            }
        }
        // A transpose of an (n*b) x (n*b) matrix of u64 held in row blocks.
        let b = 8u64;
        let m = b * u64::from(n);
        let value = |i: u64, j: u64| (i << 32) | j;
        let rows: Vec<u8> = (0..b)
            .flat_map(|li| (0..m).flat_map(move |j| value(u64::from(me) * b + li, j).to_le_bytes()))
            .collect();
        let t = rma.allocate((b * m * 8) as usize).unwrap();
        // Block j of this rank's rows is a b x b block; row li of it goes to column
        // (me*b + li) of rank j's rows: one strided put per row.
        for li in 0..b {
            let at = Strided {
                offset: (u64::from(me) * b + li) * 8,
                stride: m * 8,
                elem: 8,
                count: b,
            };
            dmsg::alltoall_strided(
                &rma,
                &rows,
                |j| (li * m + u64::from(j) * b) * 8,
                8,
                &t,
                at,
                1,
            )
            .unwrap();
        }
        let tv = t.to_vec();
        for lj in 0..b {
            for i in 0..m {
                let at = ((lj * m + i) * 8) as usize;
                let v = u64::from_le_bytes(tv[at..at + 8].try_into().unwrap());
                assert_eq!(v, value(i, u64::from(me) * b + lj));
            }
        }
    });
}

#[test]
fn dmsg_alltoall_and_transpose_over_shm() {
    dmsg_steps(config(TransportChoice::Auto), 4);
}

#[test]
fn dmsg_alltoall_and_transpose_over_udp() {
    dmsg_steps(config(TransportChoice::Udp), 3);
}

/// RRMSG (`quiver::rma::rrmsg`): an all-to-all in rounds of pairs (the lower rank of
/// each pair sends first), every size byte-checked, and a message longer than the
/// receive buffer truncated with the sender released.
fn rrmsg_exchange(c: Config, size: u32) {
    run_ranks(size, c, |job| {
        let rma = Rma::open(&job, DPID + 4).unwrap();
        let r = rrmsg::Rrmsg::open(&rma, 200_000).unwrap();
        let (me, n) = (job.rank(), job.size());
        for (i, &len) in [0usize, 1, 1500, 65536, 200_000].iter().enumerate() {
            for k in 1..n {
                let (to, from) = ((me + k) % n, (me + n - k) % n);
                let mut buf = vec![0u8; len];
                // Both directions, the lower rank of each pair first.
                let send = || r.send(to, &pattern(me, i as u32, len)).unwrap();
                let recv = |buf: &mut Vec<u8>| {
                    assert_eq!(r.recv(from, buf).unwrap(), len);
                    assert!(
                        *buf == pattern(from, i as u32, len),
                        "{len} bytes from {from}"
                    );
                };
                if me < to {
                    send();
                }
                if from < me {
                    recv(&mut buf);
                }
                if me > to {
                    send();
                }
                if from > me {
                    recv(&mut buf);
                }
            }
        }
        job.barrier_progressing(&[&rma]).unwrap();
        if me == 0 {
            r.send(1, &[7; 100]).unwrap();
        } else if me == 1 {
            let mut small = [0u8; 10];
            assert!(matches!(
                r.recv(0, &mut small),
                Err(Error::Truncated { len: 100, .. })
            ));
            assert_eq!(small, [7; 10]);
        }
        job.barrier_progressing(&[&rma]).unwrap();
    });
}

#[test]
fn rrmsg_exchange_over_shm() {
    rrmsg_exchange(config(TransportChoice::Auto), 3);
}

#[test]
fn rrmsg_exchange_over_udp() {
    rrmsg_exchange(config(TransportChoice::Udp), 3);
}

/// Every rank sends every size (empty, inside one chunk, many chunks) to every other
/// rank before receiving anything, then receives them in order and unpacks them in
/// uneven pieces; a message unpacked only in part is skipped cleanly, and asking for
/// more than remains is a typed error.
fn pvm_exchange(c: Config, size: u32) {
    run_ranks(size, c, |job| {
        let rma = Rma::open(&job, DPID + 5).unwrap();
        let p = pvm::Pvm::open(&rma, 4000).unwrap();
        let (me, n) = (job.rank(), job.size());
        let lens = [0usize, 1, 3999, 4000, 4001, 65536, 100_003];
        for (i, &len) in lens.iter().enumerate() {
            for to in (0..n).filter(|&r| r != me) {
                let data = pattern(me, i as u32, len);
                let mut m = pvm::SendBuffer::new();
                // Packed in two parts: the message is their concatenation.
                m.pack(&data[..len / 3]).pack(&data[len / 3..]);
                p.send(to, m).unwrap();
            }
        }
        for (i, &len) in lens.iter().enumerate() {
            for from in (0..n).filter(|&r| r != me) {
                let mut m = p.recv(from).unwrap();
                assert_eq!(m.len(), len);
                let mut got = vec![0u8; len];
                let (a, b) = got.split_at_mut(len / 7);
                m.unpack(a).unwrap();
                m.unpack(b).unwrap();
                assert!(
                    got == pattern(from, i as u32, len),
                    "{len} bytes from {from}"
                );
                assert!(matches!(m.unpack(&mut [0]), Err(Error::Truncated { .. })));
            }
        }
        // A message read in part, then the next one whole.
        let next = (me + 1) % n;
        let prev = (me + n - 1) % n;
        let mut m = pvm::SendBuffer::new();
        m.pack(&pattern(me, 50, 20_000));
        p.send(next, m).unwrap();
        let mut m = pvm::SendBuffer::new();
        m.pack(&pattern(me, 51, 10));
        p.send(next, m).unwrap();
        {
            let mut first = p.recv(prev).unwrap();
            // One message of a sender open at a time.
            assert!(matches!(p.recv(prev), Err(Error::Config(_))));
            let mut part = [0u8; 5000];
            first.unpack(&mut part).unwrap();
            assert_eq!(part[..], pattern(prev, 50, 20_000)[..5000]);
        }
        let mut second = p.recv(prev).unwrap();
        let mut got = [0u8; 10];
        second.unpack(&mut got).unwrap();
        drop(second);
        assert_eq!(got[..], pattern(prev, 51, 10)[..]);
        assert!(p.send(me, pvm::SendBuffer::new()).is_err());
        p.wait_sent().unwrap();
        // Every phase took time: chunks went, waits happened, bytes were copied.
        let phases = p.phases();
        assert!(
            !phases.transfer.is_zero() && !phases.control.is_zero(),
            "{phases:?}"
        );
        assert!(!phases.copy.is_zero(), "{phases:?}");
        job.barrier_progressing(&[&rma]).unwrap();
    });
}

#[test]
fn pvm_exchange_over_shm() {
    pvm_exchange(config(TransportChoice::Auto), 3);
}

#[test]
fn pvm_exchange_over_udp() {
    pvm_exchange(config(TransportChoice::Udp), 3);
}

/// The deposit seed's application kernels (`examples/deposit_study.rs`) on every library:
/// the 2D-FFT and SOR results match the serial computation (rank 0 checks them).
#[path = "../examples/deposit_study.rs"]
#[allow(dead_code)]
mod deposit_study;

fn kernels(c: Config, size: u32) {
    use deposit_study::{study, Args, Kernel, Lib};
    run_ranks(size, c, |job| {
        for kernel in [Kernel::Fft, Kernel::Sor] {
            for lib in [Lib::Pvm, Lib::Rrmsg, Lib::Dmsg] {
                let args = Args::new(kernel, 48, lib, 1);
                assert!(study(&job, &args, false).unwrap(), "rank {}", job.rank());
            }
        }
        // A size the ranks do not divide is a typed error, not an exit.
        let odd = Args::new(Kernel::Fft, 49, Lib::Dmsg, 1);
        assert!(matches!(study(&job, &odd, false), Err(Error::Config(_))));
    });
}

#[test]
fn fft_and_sor_match_the_serial_computation_over_shm() {
    kernels(config(TransportChoice::Auto), 3);
}

#[test]
fn fft_and_sor_match_the_serial_computation_over_udp() {
    kernels(config(TransportChoice::Udp), 2);
}

/// Small puts to one rank of another node share messages: 64 strided puts of 8
/// elements each leave in far fewer messages than 64, and land all the same.
#[test]
fn small_puts_to_one_rank_share_messages() {
    run_ranks(2, config(TransportChoice::Udp), |job| {
        let rma = Rma::open(&job, DPID + 6).unwrap();
        let w = rma.allocate(64 * 64).unwrap();
        job.barrier_progressing(&[&rma]).unwrap();
        if job.rank() == 0 {
            let src = pattern(0, 7, 64 * 64);
            let before = rma.endpoint().stats().msgs_sent;
            for c in 0..64u64 {
                let at = Strided {
                    offset: c * 8,
                    stride: 512,
                    elem: 8,
                    count: 8,
                };
                rma.put_strided(1, &w, at, &src[(c * 64) as usize..][..64], 8)
                    .unwrap();
            }
            let sent = rma.endpoint().stats().msgs_sent - before;
            assert!(sent <= 16, "64 small puts went as {sent} messages");
            rma.flush(1).unwrap();
        }
        job.barrier_progressing(&[&rma]).unwrap();
        if job.rank() == 1 {
            let got = w.to_vec();
            let src = pattern(0, 7, 64 * 64);
            for c in 0..64usize {
                for i in 0..8usize {
                    assert_eq!(
                        got[i * 512 + c * 8..][..8],
                        src[c * 64 + i * 8..][..8],
                        "put {c}, element {i}"
                    );
                }
            }
        }
        job.barrier_progressing(&[&rma]).unwrap();
    });
}
