//! Fuzzes the tagged protocol's message decoder (`tagged::wire`, `Msg::decode`): it must
//! never panic; a decoded message's payload must be the tail of the input (inside it,
//! never copied), no longer than the input less the header; and re-encoding a decoded
//! message (its header, then its payload) must decode to the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quiver::fuzzing::tagged::{Msg, MAX_HEADER};

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = Msg::decode(data) else {
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
