//! What the fuzz targets (`fuzz/fuzz_targets/`) reach inside the crate: re-exports of
//! private decoders and state machines, and thin wrappers around them. Compiled only
//! with the `fuzzing` feature (which `fuzz/Cargo.toml` enables) and in the library's
//! tests; not part of the API.

/// The Push-Pull protocol's messages (`tagged::wire`).
pub mod tagged {
    pub use crate::tagged::wire::{eager, Msg, MAX_HEADER};
}

/// GAMMA's ports: the protocol handler of one process's port table (`ports::table`)
/// fed arbitrary messages.
pub mod ports {
    pub use crate::ports::table::fuzz::{handle_all, Counts};
}

/// The one-sided operations' target and origin state (`rma::serve`) fed arbitrary
/// requests and answers.
pub mod rma {
    pub use crate::rma::serve_fuzz::{handle_all, Counts};
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

/// The PMI-1 and PMI-2 clients (`job::pmi`), against a server whose replies are given.
pub mod pmi {
    use crate::job::pmi::{Pmi, Version, Via};
    use crate::job::rendezvous::Deadline;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    /// Connects as `choice` says (0: auto, 1: PMI-1, 2: PMI-2; over a port when `port`,
    /// which adds the `initack` exchange), then puts, fences, gets and finalizes, while
    /// the server's side of the socket holds `replies` and then closes. Returns how far
    /// it got (0 to 5 steps) and the error that stopped it, if any.
    pub fn converse(replies: &[u8], choice: u8, port: bool) -> (usize, Option<crate::Error>) {
        let (client, mut server) = UnixStream::pair().expect("a socket pair");
        // The replies fit the socket's buffer (the target bounds them); the client's
        // commands are read by nobody and fit it too.
        server.write_all(replies).expect("replies written");
        drop(server.shutdown(std::net::Shutdown::Write));
        let want = match choice % 3 {
            1 => Some(Version::One),
            2 => Some(Version::Two),
            _ => None,
        };
        let via = Via::Fd(client.as_raw_fd());
        let deadline = Deadline::after(Duration::from_secs(2));
        let mut steps = 0;
        let run = || -> crate::Result<()> {
            let mut pmi = if port {
                Pmi::connect_stream(
                    client
                        .try_clone()
                        .map_err(|e| crate::Error::io("clone", e))?,
                    Via::Port {
                        host_port: "fuzz:1".into(),
                        id: 0,
                    },
                    want,
                    None,
                    None,
                    deadline,
                )?
            } else {
                Pmi::connect(via, want, Some("1.0"), Some(0), deadline)?
            };
            steps += 1;
            pmi.put("quiver-store", "tcp://127.0.0.1:1")?;
            steps += 1;
            pmi.fence()?;
            steps += 1;
            let _ = pmi.get(0, "quiver-store")?;
            steps += 1;
            pmi.finalize()?;
            steps += 1;
            Ok(())
        };
        let err = run().err();
        (steps, err)
    }
}
