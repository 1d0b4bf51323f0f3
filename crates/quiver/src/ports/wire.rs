//! The message of a port: an 8-byte header before the payload.
//!
//! ```text
//! byte 0   kind: b'G' (a message for a port)
//! byte 1   destination port
//! byte 2   the sender's port (the one it sent through)
//! byte 3   flags, 0 (reserved)
//! 4..8     reserved, 0
//! ```
//!
//! The sender's rank comes from the engine (the channel it arrived on), not from the
//! header, so a peer cannot claim another's rank. Decoding checks every field: a header
//! with a reserved bit set or another kind is malformed, not guessed at.

/// Bytes of the header.
pub(crate) const HEADER_LEN: usize = 8;

const KIND: u8 = b'G';

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// The port the message is for.
    pub dest_port: u8,
    /// The port it was sent through.
    pub src_port: u8,
}

impl Header {
    /// The header's bytes.
    pub(crate) fn encode(self) -> [u8; HEADER_LEN] {
        [KIND, self.dest_port, self.src_port, 0, 0, 0, 0, 0]
    }

    /// Splits `msg` into its header and payload; `None` when it is not a well-formed
    /// port message.
    pub(crate) fn decode(msg: &[u8]) -> Option<(Header, &[u8])> {
        let (head, payload) = msg.split_first_chunk::<HEADER_LEN>()?;
        if head[0] != KIND || head[3..] != [0; 5] {
            return None;
        }
        Some((
            Header {
                dest_port: head[1],
                src_port: head[2],
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
        let h = Header {
            dest_port: 254,
            src_port: 7,
        };
        let mut msg = h.encode().to_vec();
        msg.extend_from_slice(b"payload");
        assert_eq!(Header::decode(&msg), Some((h, &b"payload"[..])));
        assert_eq!(Header::decode(&h.encode()), Some((h, &[][..])));
    }

    #[test]
    fn short_foreign_or_reserved_headers_are_malformed() {
        let good = Header {
            dest_port: 1,
            src_port: 2,
        }
        .encode();
        assert_eq!(Header::decode(&good[..HEADER_LEN - 1]), None);
        assert_eq!(Header::decode(&[]), None);
        for i in [0, 3, 4, 7] {
            let mut bad = good;
            bad[i] ^= 0x40;
            assert_eq!(Header::decode(&bad), None, "byte {i} changed");
        }
    }
}
