//! Fuzzes the PMI-1 and PMI-2 clients (`job::pmi`): a launcher's PMI server that answers
//! with anything. The client connects (version handshake, PMI-2's `fullinit`, PMI-1's
//! `initack` over a port), puts, fences, gets and finalizes against the replies.
//!
//! Input: `[choice, port, replies...]`: `choice` % 3 picks auto, PMI-1 or PMI-2; odd
//! `port` adds the `initack` exchange of `PMI_PORT`; the replies are at most 16 KiB (they
//! fit the socket's buffer).
//!
//! Asserts: nothing panics or hangs; every failure is a `Launcher` error (the server's
//! fault) or an I/O error, never a configuration error of the caller.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quiver::fuzzing::pmi::converse;
use quiver::Error;

fuzz_target!(|data: &[u8]| {
    let [choice, port, replies @ ..] = data else {
        return;
    };
    if replies.len() > 16 << 10 {
        return;
    }
    let (steps, err) = converse(replies, *choice, port % 2 == 1);
    assert!(steps <= 5);
    match err {
        None => assert_eq!(steps, 5),
        Some(Error::Launcher { .. } | Error::Io { .. }) => {}
        Some(e) => panic!("after {steps} steps: {e:?}"),
    }
});
