//! Fuzzes the ports' protocol handler (`ports::table`): a port table of one rank, in a
//! job of 1 to 16 ranks, handed arbitrary messages from arbitrary ranks. It must never
//! panic; every message is delivered, counted malformed, reported as a port error,
//! taken as a control message, or still waiting (set aside, or a piece of a message from
//! another node that completed no message), exactly one of them; a delivered message's
//! bytes are in its port's buffer (checked by `handle_all`, pieces at their offsets);
//! and no message is forwarded to more ranks than this rank has children in the tree of
//! any root.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quiver::fuzzing::ports::handle_all;

fuzz_target!(|data: &[u8]| {
    let c = handle_all(data);
    let counted = c.delivered + c.malformed + c.errors + c.control + c.waiting;
    assert!(counted == c.handled, "{c:?}");
    assert!(c.forwarded <= c.handled * c.max_children, "{c:?}");
});
