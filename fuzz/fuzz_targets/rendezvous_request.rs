//! Fuzzes the rendezvous store's server side: the request stream a client sends, read
//! line by line as the server reads it (`read_line` over a `BufReader`) and parsed
//! (`parse_request`).
//!
//! Input: `[limit, capacity, split, stream...]`. `limit` < 128 reads lines of at most
//! that many bytes (so that the too-long path is reached with short inputs), else of
//! the server's `MAX_LINE`; `capacity` sizes the `BufReader`; `split` seeds how the
//! stream is cut into reads (0: one read), some of which fail with `Interrupted`.
//!
//! Asserts: nothing panics; the reader never holds more than the limit (bounded memory
//! whatever the stream) and, however the stream is cut, reads exactly the lines of a
//! plain split on `\n` (too-long lines reported and skipped, a `\r` before the `\n`
//! dropped, a last line without `\n` dropped); a parsed request's key and value are
//! valid items borrowed from the line, and the request written back in the protocol
//! parses to the same request.
#![no_main]

use std::io::{self, BufReader, ErrorKind, Read};

use libfuzzer_sys::fuzz_target;
use quiver::fuzzing::rendezvous::{
    is_valid_item, parse_request, read_line, LineRead, Request, MAX_LINE,
};

/// A stream that hands out `data` in pieces of pseudo-random sizes (one piece if `seed`
/// is 0), failing with `Interrupted` now and then.
struct Pieces<'a> {
    data: &'a [u8],
    state: u32,
}

impl Read for Pieces<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let want = if self.state == 0 {
            self.data.len()
        } else {
            // xorshift32
            self.state ^= self.state << 13;
            self.state ^= self.state >> 17;
            self.state ^= self.state << 5;
            match self.state % 24 {
                0 => return Err(io::Error::from(ErrorKind::Interrupted)),
                n => n as usize,
            }
        };
        let n = want.min(out.len()).min(self.data.len());
        out[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// What the server must read from `stream`: its `\n`-terminated lines, `None` for one
/// longer than `max` (its `\r` counted).
fn reference(stream: &[u8], max: usize) -> Vec<Option<&[u8]>> {
    let mut lines: Vec<&[u8]> = stream.split(|&b| b == b'\n').collect();
    lines.pop(); // the part after the last `\n` (or the whole stream): never a line
    lines
        .into_iter()
        .map(|l| (l.len() <= max).then(|| l.strip_suffix(b"\r").unwrap_or(l)))
        .collect()
}

fn check_request(line: &[u8]) {
    let Ok(req) = parse_request(line) else {
        return;
    };
    let inside = |s: &str| {
        let (p, start) = (s.as_ptr() as usize, line.as_ptr() as usize);
        p >= start && p + s.len() <= start + line.len()
    };
    let (key, value) = match req {
        Request::Put { key, value } | Request::PutNx { key, value } => (key, Some(value)),
        Request::Get { key, .. } | Request::TryGet { key } => (key, None),
    };
    for item in std::iter::once(key).chain(value) {
        assert!(is_valid_item(item), "{req:?}: invalid item accepted");
        assert!(inside(item), "{req:?}: item not from the line");
    }
    let again = match req {
        Request::Put { key, value } => format!("PUT {key} {value}"),
        Request::PutNx { key, value } => format!("PUTNX {key} {value}"),
        Request::Get { key, timeout } => format!("GET {key} {}", timeout.as_millis()),
        Request::TryGet { key } => format!("TRYGET {key}"),
    };
    assert_eq!(parse_request(again.as_bytes()), Ok(req));
}

fuzz_target!(|data: &[u8]| {
    let [limit, capacity, split, stream @ ..] = data else {
        return;
    };
    let max = if *limit < 128 {
        usize::from(*limit)
    } else {
        MAX_LINE
    };
    let capacity = if *capacity < 128 {
        usize::from(*capacity) + 1
    } else {
        8192
    };
    let mut reader = BufReader::with_capacity(
        capacity,
        Pieces {
            data: stream,
            state: u32::from(*split),
        },
    );
    let mut expected = reference(stream, max).into_iter();
    let mut line = Vec::new();
    loop {
        let got = read_line(&mut reader, &mut line, max).expect("only Interrupted is returned");
        assert!(line.len() <= max, "a line of {} bytes held", line.len());
        assert!(
            line.capacity() <= 2 * max.max(8),
            "{} bytes reserved",
            line.capacity()
        );
        match got {
            LineRead::Line => {
                assert_eq!(expected.next(), Some(Some(&line[..])));
                check_request(&line);
            }
            LineRead::TooLong => assert_eq!(expected.next(), Some(None)),
            LineRead::Eof => break,
        }
    }
    assert_eq!(expected.next(), None, "lines left unread");
});
