//! What the fuzz targets (`fuzz/fuzz_targets/`) reach inside the crate: re-exports of
//! private decoders and state machines, and thin wrappers around them. Compiled only
//! with the `fuzzing` feature (which `fuzz/Cargo.toml` enables) and in the library's
//! tests; not part of the API.

/// The Push-Pull protocol's messages (`tagged::wire`).
pub mod tagged {
    pub use crate::tagged::wire::{Msg, MAX_HEADER};
}

/// The rendezvous store's line protocol, server side (`job::rendezvous`).
pub mod rendezvous {
    use std::io::{self, BufRead};

    pub use crate::job::rendezvous::{is_valid_item, parse_request, LineRead, Request};

    /// The longest request line the server reads, without its `\n`.
    pub const MAX_LINE: usize = crate::job::rendezvous::MAX_LINE;

    /// Reads one line of at most `max` bytes into `buf`, as the server reads a request
    /// (with `max` = [`MAX_LINE`]).
    pub fn read_line<R: BufRead>(r: &mut R, buf: &mut Vec<u8>, max: usize) -> io::Result<LineRead> {
        crate::job::rendezvous::read_line_limited(r, buf, max)
    }
}

/// The reliable channel's state machines (`channel::reliable`).
pub mod channel {
    pub use crate::channel::reliable::{
        ChannelError, Config, Duplex, Event, Mode, PartialSend, Recovery, SendError, Time,
        MAX_WINDOW,
    };
}
