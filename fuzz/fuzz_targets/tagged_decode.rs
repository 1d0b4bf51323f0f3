//! Fuzzes the tagged protocol's message decoder (`tagged::wire`, `Msg::decode`): it must
//! never panic; a decoded message's payload must be the tail of the input (inside it,
//! never copied), no longer than the input less the header; and re-encoding a decoded
//! message (its header, then its payload) must decode to the same message. The blocking
//! receive's short cut (`wire::eager`) must read an `Eager` message as the decoder does
//! and nothing else.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quiver::fuzzing::tagged::{eager, Msg, MAX_HEADER};

fuzz_target!(|data: &[u8]| {
    let decoded = Msg::decode(data);
    if let Some((tag, number, payload)) = eager(data) {
        match decoded {
            Ok(Msg::Push { head, data: d }) => assert!(
                head.tag == tag
                    && head.msg == number
                    && head.total == payload.len() as u64
                    && head.pushed == head.total
                    && d == payload,
                "{head:?}: the short cut read ({tag}, {number}, {} bytes)",
                payload.len()
            ),
            other => panic!("the short cut read an Eager message the decoder reads as {other:?}"),
        }
    } else {
        assert!(
            data.first() != Some(&8) || decoded.is_err(),
            "an Eager message the short cut missed: {decoded:?}"
        );
    }
    let Ok(msg) = decoded else {
        return;
    };
    let header = msg.header();
    let header = header.as_bytes();
    assert!(header.len() <= MAX_HEADER);
    assert!(
        header.len() <= data.len(),
        "{msg:?}: header longer than the input"
    );
    // The payload is the input's tail after the header, borrowed from it.
    let payload = msg.data();
    assert!(payload.len() <= data.len() - header.len(), "{msg:?}");
    if !payload.is_empty() {
        let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
        let p = payload.as_ptr() as usize;
        assert!(
            p >= start && p + payload.len() <= end,
            "{msg:?}: payload outside the input"
        );
        assert_eq!(
            p + payload.len(),
            end,
            "{msg:?}: payload is not the input's tail"
        );
    }
    // The kind byte is kept, but for a `Push` (1) that carries its whole message, which
    // re-encodes in its compact `Eager` form (8); re-encoding gives a message that
    // decodes to the same one.
    assert!(
        header[0] == data[0] || (data[0] == 1 && header[0] == 8),
        "{msg:?}: kind {} re-encoded as {}",
        data[0],
        header[0]
    );
    let mut again = header.to_vec();
    again.extend_from_slice(payload);
    assert_eq!(Msg::decode(&again), Ok(msg));
    // Kinds without a payload ignore trailing bytes: the encoding is the header alone.
    if payload.is_empty() {
        assert_eq!(Msg::decode(header), Ok(msg));
    }
});
