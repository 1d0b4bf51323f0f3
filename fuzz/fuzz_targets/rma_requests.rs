//! Fuzzes the one-sided operations' target and origin state (`rma::serve`): a rank that
//! exposes one window of 256 bytes between guard bytes, handed arbitrary requests and
//! answers (puts, strided and indexed puts, combined puts, gets, atomics, notifies,
//! flushes, barrier and combining rounds, replies to requests it never made) from
//! arbitrary ranks. It must never panic nor write outside the window (`handle_all`
//! checks the guards), and no answer carries more than the window's bytes and a header
//! per request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quiver::fuzzing::rma::handle_all;

fuzz_target!(|data: &[u8]| {
    let c = handle_all(data);
    assert!(c.puts_applied + c.refused + c.malformed <= c.handled * 4096, "{c:?}");
    // A get answers at most the window, in pieces of at least one byte, each with a
    // header: 64 bytes of header per byte answered at the very worst.
    assert!(c.answered_bytes <= c.handled * 256 * 64 + c.handled * 64, "{c:?}");
});
