//! The message of a port: an 8-byte header before the payload.
//!
//! ```text
//! byte 0   kind: b'G' (a message for a port)
//! byte 1   destination port
//! byte 2   the sender's port (the one it sent through)
//! byte 3   flags: 1 = a broadcast; 2 = sent by its root to every receiver at once (the
//!          link's broadcast and shared memory: nobody forwards it; only with 1); the
//!          other bits are reserved, 0
//! 4..8     a broadcast's root rank (little-endian); 0 otherwise
//! ```
//!
//! The sender's rank comes from the engine (the channel it arrived on), not from the
//! header, so a peer cannot claim another's rank; a broadcast names its root, which the
//! receiver checks against the tree (`tree::parent`), or, sent by the root itself,
//! against the sender. Decoding checks every field: a
//! header with a reserved bit set or another kind is malformed, not guessed at.

/// Bytes of the header.
pub(crate) const HEADER_LEN: usize = 8;

const KIND: u8 = b'G';
const BROADCAST: u8 = 1;
const NATIVE: u8 = 2;

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// The port the message is for.
    pub dest_port: u8,
    /// The port it was sent through.
    pub src_port: u8,
    /// The root of a broadcast; `None` for a message to one process.
    pub root: Option<u32>,
    /// A broadcast its root sent to every receiver itself (not down a tree).
    pub native: bool,
}

impl Header {
    /// The header's bytes.
    pub(crate) fn encode(self) -> [u8; HEADER_LEN] {
        let (flags, root) = match self.root {
            Some(r) if self.native => (BROADCAST | NATIVE, r.to_le_bytes()),
            Some(r) => (BROADCAST, r.to_le_bytes()),
            None => (0, [0; 4]),
        };
        let [r0, r1, r2, r3] = root;
        [KIND, self.dest_port, self.src_port, flags, r0, r1, r2, r3]
    }

    /// Splits `msg` into its header and payload; `None` when it is not a well-formed
    /// port message.
    pub(crate) fn decode(msg: &[u8]) -> Option<(Header, &[u8])> {
        let (head, payload) = msg.split_first_chunk::<HEADER_LEN>()?;
        let word = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let (root, native) = match head[3] {
            0 if word == 0 => (None, false),
            BROADCAST => (Some(word), false),
            f if f == BROADCAST | NATIVE => (Some(word), true),
            _ => return None,
        };
        if head[0] != KIND {
            return None;
        }
        Some((
            Header {
                dest_port: head[1],
                src_port: head[2],
                root,
                native,
            },
            payload,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_decodes_to_what_was_encoded() {
        let cases = [None, Some(0), Some(7), Some(u32::MAX)]
            .into_iter()
            .map(|root| (root, false))
            .chain([(Some(3), true)]);
        for (root, native) in cases {
            let h = Header {
                dest_port: 254,
                src_port: 7,
                root,
                native,
            };
            let mut msg = h.encode().to_vec();
            msg.extend_from_slice(b"payload");
            assert_eq!(Header::decode(&msg), Some((h, &b"payload"[..])));
            assert_eq!(Header::decode(&h.encode()), Some((h, &[][..])));
        }
    }

    #[test]
    fn short_foreign_or_reserved_headers_are_malformed() {
        let good = Header {
            dest_port: 1,
            src_port: 2,
            root: None,
            native: false,
        }
        .encode();
        assert_eq!(Header::decode(&good[..HEADER_LEN - 1]), None);
        assert_eq!(Header::decode(&[]), None);
        // Another kind, a reserved flag, a root word without the broadcast flag.
        for (i, bit) in [(0, 0x40), (3, 0x02), (3, 0x80), (4, 0x01), (7, 0x80)] {
            let mut bad = good;
            bad[i] ^= bit;
            assert_eq!(Header::decode(&bad), None, "byte {i} changed");
        }
    }
}
