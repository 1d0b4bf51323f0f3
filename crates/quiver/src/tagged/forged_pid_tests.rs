//! A rank that names, in its `Push`, a process other than the one it proved to be (issue
//! 28, item 7): the receiver reads nothing of that process, pulls the message by
//! request instead, and counts the refusal. The forging rank is a plain Directed Point
//! endpoint on the tagged DPID that speaks the protocol by hand (`wire`), after
//! publishing a genuine nonce (this process's) like any tagged endpoint.

use super::wire::{Announce, Msg};
use super::Tagged;
use crate::config::Config;
use crate::dm::Endpoint;
use crate::rma::tests::Forked;
use crate::rma::SingleCopy;
use crate::test_support::{cannot_run, jobs};
use std::time::Duration;

const DPID: u16 = 47;
const TAG: u32 = 5;
const LEN: usize = 300_000;
const CHUNK: usize = 32 << 10;

/// Sends a Push-Zero of message `msg` announcing `LEN` bytes at `addr` in process
/// `pid`, and answers the receiver: with `src` when it asks for the bytes (then true),
/// nothing when it read them itself (`Done`: false).
fn push_and_answer(ep: &Endpoint, msg: u64, pid: u32, addr: u64, src: &[u8]) -> bool {
    let push = Msg::Push {
        head: Announce {
            slot: 0,
            tag: TAG,
            msg,
            total: LEN as u64,
            pushed: 0,
            pid,
            seg: 0,
            addr,
            sync: false,
        },
        data: &[],
    };
    ep.write_parts(push.header().as_bytes(), push.data())
        .unwrap();
    let pull = loop {
        let m = match ep.read_timeout(Duration::from_secs(20)) {
            Ok(m) => m,
            Err(e) => {
                // Do not leave the receiver waiting.
                let give_up = Msg::Abandon { msg };
                let _ = ep.write_parts(give_up.header().as_bytes(), &[]);
                panic!("no answer to push {msg}: {e}");
            }
        };
        match Msg::decode(&m) {
            Ok(Msg::Pull {
                msg: m,
                offset,
                len,
            }) if m == msg => break Some((offset, len)),
            Ok(Msg::Done { msg: m }) if m == msg => break None,
            _ => {}
        }
    };
    let Some((offset, len)) = pull else {
        return false;
    };
    assert_eq!((offset, len), (0, LEN as u64), "the whole message");
    for (i, chunk) in src.chunks(CHUNK).enumerate() {
        let data = Msg::Data {
            msg,
            offset: (i * CHUNK) as u64,
            data: chunk,
        };
        ep.write_parts(data.header().as_bytes(), data.data())
            .unwrap();
    }
    true
}

#[test]
fn a_push_naming_another_process_is_pulled_by_request_and_counted() {
    let (jobs, _store) = jobs(2, &Config::default());
    let mut jobs = jobs.into_iter();
    let (job0, job1) = (jobs.next().unwrap(), jobs.next().unwrap());
    // The sender's bytes, here; a child forked from this process has other bytes at the
    // same address, and rank 0's nonce too (published before the fork).
    let real: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let mut held = real.clone();
    let addr = held.as_ptr() as u64;
    let ep = job0.open(DPID).unwrap();
    let _rma0 = SingleCopy::open(&job0, DPID).unwrap();
    let child = Forked::start(&mut held, 0xc4);
    let mut probe = vec![0u8; LEN];
    let piece = crate::link::cma::Piece { addr, len: LEN };
    if let Err(e) = crate::link::cma::read_from(child.pid(), &[piece], &mut probe) {
        return cannot_run(&format!("cross-memory attach to a child: {e}"));
    }
    assert!(probe.iter().all(|&b| b == 0xc4));

    let receiver = std::thread::spawn(move || {
        let t = Tagged::open(&job1, DPID).unwrap();
        let mut bufs = [vec![0u8; LEN], vec![0u8; LEN]];
        let mut lens = Vec::new();
        for buf in &mut bufs {
            lens.push(t.recv(buf, 0, TAG).map(|s| s.len));
        }
        (lens, bufs, t.stats())
    });
    // Rank 0, by hand: first an honest push (its own pid), which proves rank 0 to the
    // receiver and is read directly; then one naming the child at the same address.
    ep.target_endpoint(1, DPID).unwrap();
    let own = std::process::id();
    if push_and_answer(&ep, 1, own, addr, &real) {
        push_and_answer(&ep, 2, own, addr, &real);
        receiver.join().unwrap();
        return cannot_run("cross-memory attach between ranks is not permitted here");
    }
    let by_request = push_and_answer(&ep, 2, child.pid(), addr, &real);
    let (lens, bufs, stats) = receiver.join().unwrap();
    for len in lens {
        assert_eq!(len.unwrap(), LEN as u64);
    }
    assert!(bufs[0] == real, "the honest push, read directly");
    assert!(
        !bufs[1].iter().all(|&b| b == 0xc4),
        "the receiver read the forged process's bytes"
    );
    assert!(
        by_request && bufs[1] == real,
        "the sender's bytes, by request"
    );
    assert_eq!(stats.foreign_pids_refused, 1, "{stats:?}");
    assert_eq!(
        (stats.pulled_direct, stats.pulled_by_request),
        (LEN as u64, LEN as u64)
    );
}
