//! The ports in the simulator: the real table and handler on two whole stations over the
//! simulated network, in virtual time, under seeded loss, duplication, reordering and
//! corruption. Rank 0 sends numbered messages through a port; rank 1's handler keeps
//! each one (re-binding its port's buffer, as GAMMA's handlers do) and answers through
//! another port from inside the handler; rank 0's handler checks the answers. Every
//! message must arrive once, whole and in order, and every answer likewise.

use super::app::App;
use super::{Delivery, PortError};
use crate::config::{Config, TransportChoice};
use crate::engine::sim_tests::{advance_stations, station_pair_in, SimStation, DPID};
use crate::link::fault::{FaultConfig, SimRng};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The bytes of message `i` (its length from the seeded `rng`).
fn message(rng: &mut SimRng, i: usize) -> Vec<u8> {
    let len = match rng.below(4) {
        0 => 0,
        1 => 1 + rng.below(64) as usize,
        _ => 64 + rng.below(6000) as usize,
    };
    (0..len).map(|k| (i * 31 + k) as u8).collect()
}

/// Runs `count` messages and their answers; panics on any difference. Returns the frames
/// the injectors lost, duplicated or corrupted, and the retransmissions, over both ranks.
fn exchange(faults: &FaultConfig, seed: u64, count: usize) -> (u64, u64) {
    let config = Config {
        transport: TransportChoice::Udp,
        connect_timeout: Duration::from_secs(2),
        max_message: 16 << 10,
        ..Config::default()
    };
    let (net, stations, _jobs, _dir) = station_pair_in(&config, faults);
    let stations: &[SimStation; 2] = &stations;
    let apps = [App::new(0, 2, DPID, None), App::new(1, 2, DPID, None)];
    let mut rng = SimRng::new(seed);
    let sent: Vec<Vec<u8>> = (0..count).map(|i| message(&mut rng, i)).collect();

    // Rank 1: port 2 receives; its handler keeps each message and answers through port
    // 3 with the message reversed.
    let kept = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let errors = Arc::new(Mutex::new(Vec::<PortError>::new()));
    {
        let mut t = apps[1].table.lock();
        t.slots[2].buffer = Some(vec![0; 8192].into());
        let k = kept.clone();
        t.slots[2].handler = Some(Box::new(move |d: &mut Delivery<'_>| {
            let len = d.len();
            let mut full = d.rebind(vec![0; 8192]).into_vec();
            full.truncate(len);
            let mut answer = full.clone();
            answer.reverse();
            k.lock().unwrap().push(full);
            d.send(3, &answer)
                .expect("the outbox has room for every answer");
        }));
        let e = errors.clone();
        t.slots[2].on_error = Some(Box::new(move |err| e.lock().unwrap().push(err)));
    }
    apps[1].bind_dest(&stations[1], 3, 0, 4).unwrap();
    // Rank 0: port 1 sends to rank 1's port 2; port 4 receives the answers.
    apps[0].bind_dest(&stations[0], 1, 1, 2).unwrap();
    let answers = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    {
        let mut t = apps[0].table.lock();
        t.slots[4].buffer = Some(vec![0; 8192].into());
        let a = answers.clone();
        t.slots[4].handler = Some(Box::new(move |d: &mut Delivery<'_>| {
            a.lock().unwrap().push(d.data().to_vec());
            d.signal();
        }));
    }

    let mut next = 0;
    while answers.lock().unwrap().len() < count {
        let mut moved = false;
        // Sometimes a send, as far as the window lets it.
        if next < count
            && rng.below(3) != 0
            && apps[0].send(&stations[0], 1, &sent[next], false).unwrap()
        {
            next += 1;
            moved = true;
        }
        for (r, app) in apps.iter().enumerate() {
            moved |= app.poll(&stations[r]).unwrap();
        }
        if !moved {
            assert!(
                advance_stations(&net, stations),
                "stuck after {next} sends, {} kept, {} answers",
                kept.lock().unwrap().len(),
                answers.lock().unwrap().len()
            );
        }
    }
    assert_eq!(*kept.lock().unwrap(), sent, "rank 1 kept other messages");
    let reversed: Vec<Vec<u8>> = sent
        .iter()
        .map(|m| m.iter().rev().copied().collect())
        .collect();
    assert_eq!(
        *answers.lock().unwrap(),
        reversed,
        "rank 0 got other answers"
    );
    assert!(errors.lock().unwrap().is_empty());
    for (r, app) in apps.iter().enumerate() {
        let t = app.table.lock();
        assert_eq!(t.stats.malformed, 0, "rank {r}");
        assert!(t.errors.is_empty(), "rank {r}: {:?}", t.errors);
    }
    assert_eq!(apps[0].table.lock().slots[4].signals, count as u64);
    // Messages longer than a frame went in pieces, written into the buffer in place
    // (the answers, sent from a handler, went whole).
    let route = match apps[0].table.lock().slots[1].dest {
        Some(super::table::Bound::One { route, .. }) => route,
        _ => unreachable!("port 1 is bound to rank 1"),
    };
    let frame = stations[0].frame_payload(route).expect("a network route");
    let long = sent
        .iter()
        .filter(|m| m.len() + super::HEADER_LEN > frame)
        .count();
    assert_eq!(apps[1].table.lock().stats.landed, long as u64);
    assert_eq!(apps[0].table.lock().stats.landed, 0);
    stations
        .iter()
        .map(|s| s.stats())
        .fold((0, 0), |(f, r), s| {
            (
                f + s.faults_lost + s.faults_duplicated + s.faults_corrupted,
                r + s.retransmissions,
            )
        })
}

#[test]
fn messages_and_answers_arrive_once_whole_and_in_order_without_faults() {
    assert_eq!(exchange(&FaultConfig::none(), 1, 200), (0, 0));
}

#[test]
fn messages_and_answers_arrive_once_whole_and_in_order_under_faults() {
    for seed in 0..4 {
        let faults = FaultConfig::parse(&format!(
            "loss=0.05,dup=0.02,reorder=0.05,reorder_delay=200us,corrupt=0.01,seed={seed}"
        ))
        .unwrap();
        let (faults, retransmissions) = exchange(&faults, seed, 150);
        assert!(
            faults > 0 && retransmissions > 0,
            "seed {seed}: the faults did not show ({faults} faults, {retransmissions} retransmissions)"
        );
    }
}

mod properties {
    use super::*;
    use crate::engine::sim_tests::properties::{arb_faults, cases};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn every_message_and_answer_arrives_once_under_any_faults(
            faults in arb_faults(),
            seed in any::<u64>(),
        ) {
            exchange(&faults, seed, 30);
        }
    }
}

/// A message from another node whose sender goes silent half-way (the first of three
/// pieces arrived, then nothing: a peer that stopped, not one whose channel failed)
/// holds its port's buffer for the peer timeout only: the application's call that
/// takes the buffer back waits that long for the rest, then gives the message up
/// (nothing of it is delivered), and the port takes the sender's next message whole.
#[test]
fn a_message_left_half_sent_is_given_up_after_the_peer_timeout() {
    let timeout = Duration::from_millis(100);
    let config = Config {
        transport: TransportChoice::Udp,
        connect_timeout: Duration::from_secs(2),
        max_message: 16 << 10,
        peer_timeout: timeout,
        ..Config::default()
    };
    let (net, stations, _jobs, _dir) = station_pair_in(&config, &FaultConfig::none());
    let stations: &[SimStation; 2] = &stations;
    let apps = [App::new(0, 2, DPID, None), App::new(1, 2, DPID, None)];
    let delivered = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    {
        let mut t = apps[1].table.lock();
        t.slots[2].buffer = Some(vec![0; 64 << 10].into());
        let d = delivered.clone();
        t.slots[2].handler = Some(Box::new(move |m: &mut Delivery<'_>| {
            d.lock().unwrap().push(m.data().to_vec());
        }));
    }
    let to = crate::addr::Source {
        rank: 1,
        dpid: DPID,
    };
    let route = stations[0].connect(to).unwrap();
    let frame = stations[0].frame_payload(route).expect("a network route");
    let chunk = frame - super::wire::PIECE_LEN;
    let first = super::wire::Piece {
        dest_port: 2,
        src_port: 1,
        offset: 0,
        total: (3 * chunk) as u32,
    }
    .encode();
    let body = vec![7u8; chunk];
    stations[0]
        .send_batch(route, &[(&first[..], &body[..])])
        .unwrap();
    // Both ranks make progress, in virtual time, until `done` holds.
    let run_until = |done: &dyn Fn() -> bool, what: &str| {
        while !done() {
            let moved = apps[1].poll(&stations[1]).unwrap() | apps[0].poll(&stations[0]).unwrap();
            if !moved {
                assert!(advance_stations(&net, stations), "{what}");
            }
        }
    };
    run_until(
        &|| apps[1].table.lock().landing_in(2).is_some(),
        "the first piece never landed",
    );
    let start = std::time::Instant::now();
    let ((), held) = apps[1].hold_then(&stations[1], 2, |_| ());
    held.unwrap();
    assert!(
        start.elapsed() >= timeout,
        "given up after {:?}, before the peer timeout",
        start.elapsed()
    );
    assert!(apps[1].table.lock().landing_in(2).is_none());
    assert!(
        delivered.lock().unwrap().is_empty(),
        "a half message was delivered"
    );
    // The sender's next message, whole, is delivered.
    apps[0].bind_dest(&stations[0], 1, 1, 2).unwrap();
    assert!(apps[0].send(&stations[0], 1, b"after", true).unwrap());
    run_until(
        &|| !delivered.lock().unwrap().is_empty(),
        "the next message never came",
    );
    assert_eq!(*delivered.lock().unwrap(), vec![b"after".to_vec()]);
}
