//! Planning how a message is split into `Data` fragments. Pure arithmetic: no buffers.

use core::iter::FusedIterator;

use super::{Flags, HEADER_LEN, LENGTH_PREFIX_LEN};

/// The smallest datagram size that [`fragments`] accepts: a header, the length prefix and
/// one byte of data, so that a first fragment always makes progress.
pub const MIN_DATAGRAM: usize = HEADER_LEN + LENGTH_PREFIX_LEN + 1;

/// The largest message [`fragments`] accepts: the length prefix is a `u32`.
pub const MAX_MESSAGE: usize = u32::MAX as usize;

/// One datagram of a fragmentation plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    /// `FIRST`, `LAST`, both or neither (never CHECKSUM: that is the sender's choice).
    pub flags: Flags,
    /// Offset into the message of the first byte this fragment carries.
    pub offset: usize,
    /// Number of message bytes this fragment carries.
    pub len: usize,
    /// Whether the body starts with the message length as a `u32` (`FIRST`-only fragments).
    pub length_prefix: bool,
}

impl Fragment {
    /// Length of the body: the message bytes plus the length prefix if any.
    pub fn body_len(&self) -> usize {
        self.len
            + if self.length_prefix {
                LENGTH_PREFIX_LEN
            } else {
                0
            }
    }

    /// Length of the whole datagram: header and body.
    pub fn datagram_len(&self) -> usize {
        HEADER_LEN + self.body_len()
    }
}

/// The fragments of a `msg_len`-byte message sent in datagrams of at most `max_datagram`
/// bytes, in order; see [`fragments`].
#[derive(Debug, Clone)]
pub struct Fragments {
    msg_len: usize,
    /// Body capacity of one datagram: `max_datagram - HEADER_LEN`.
    cap: usize,
    /// Offset of the next fragment, or `None` before the first one.
    next: Option<usize>,
    remaining: usize,
}

/// Plans the fragments of a `msg_len`-byte message sent in datagrams of at most
/// `max_datagram` bytes.
///
/// A message that fits in `max_datagram - HEADER_LEN` bytes (the empty message included)
/// is one `FIRST | LAST` fragment. A longer one is a `FIRST` fragment with the length
/// prefix and as much data as fits, then full middle fragments, then a `LAST` fragment
/// with the rest (at least one byte). The fragments cover the message exactly, in order,
/// and each datagram is at most `max_datagram` bytes.
///
/// # Panics
///
/// If `max_datagram < MIN_DATAGRAM` or `msg_len > MAX_MESSAGE`: both are the caller's
/// configuration errors (`Config::validate` rules them out), not peer input.
pub fn fragments(msg_len: usize, max_datagram: usize) -> Fragments {
    assert!(
        max_datagram >= MIN_DATAGRAM,
        "datagram size {max_datagram} is below the minimum of {MIN_DATAGRAM} bytes"
    );
    assert!(
        msg_len <= MAX_MESSAGE,
        "message of {msg_len} bytes exceeds the maximum of {MAX_MESSAGE} bytes"
    );
    Fragments {
        msg_len,
        cap: max_datagram - HEADER_LEN,
        next: None,
        remaining: count(msg_len, max_datagram - HEADER_LEN),
    }
}

/// The number of fragments [`fragments`] plans for these sizes (same panics).
pub fn fragment_count(msg_len: usize, max_datagram: usize) -> usize {
    fragments(msg_len, max_datagram).len()
}

fn count(msg_len: usize, cap: usize) -> usize {
    if msg_len <= cap {
        return 1;
    }
    let rest = msg_len - (cap - LENGTH_PREFIX_LEN);
    1 + rest.div_ceil(cap)
}

impl Iterator for Fragments {
    type Item = Fragment;

    fn next(&mut self) -> Option<Fragment> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let frag = match self.next {
            None if self.msg_len <= self.cap => Fragment {
                flags: Flags::FIRST | Flags::LAST,
                offset: 0,
                len: self.msg_len,
                length_prefix: false,
            },
            None => Fragment {
                flags: Flags::FIRST,
                offset: 0,
                len: self.cap - LENGTH_PREFIX_LEN,
                length_prefix: true,
            },
            Some(offset) => {
                let len = self.cap.min(self.msg_len - offset);
                let last = offset + len == self.msg_len;
                Fragment {
                    flags: if last { Flags::LAST } else { Flags::EMPTY },
                    offset,
                    len,
                    length_prefix: false,
                }
            }
        };
        self.next = Some(frag.offset + frag.len);
        Some(frag)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Fragments {}

impl FusedIterator for Fragments {}
