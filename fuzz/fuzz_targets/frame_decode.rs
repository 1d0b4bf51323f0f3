//! Fuzzes the frame decoder: `quiver::wire::decode` must never panic, and every header it
//! accepts must survive `emit` then `parse` unchanged and be emitted as the bytes it was
//! decoded from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quiver::wire::{decode, Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = decode(data) else {
        return;
    };
    let mut emitted = [0u8; HEADER_LEN];
    frame.header.emit(&mut emitted);
    assert_eq!(Header::parse(&emitted), Ok(frame.header));
    assert_eq!(&emitted[..], &data[..HEADER_LEN]);
    assert_eq!(frame.body, &data[HEADER_LEN..]);
    // The accessors must not panic either.
    let _ = (frame.total_len(), frame.data());
});
