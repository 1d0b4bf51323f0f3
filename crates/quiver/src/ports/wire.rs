//! The message of a port: an 8-byte header before the payload.
//!
//! ```text
//! byte 0   kind: b'G' (a message for a port)
//! byte 1   destination port
//! byte 2   the sender's port (the one it sent through)
//! byte 3   flags: 1 = a broadcast; 2 = sent by its root to every receiver at once (the
//!          link's broadcast and shared memory: nobody forwards it; only with 1); 4 = the
//!          payload is in the root's broadcast ring, a shared buffer of this node, and the
//!          message carries where (`Indirect`, 16 bytes; only with 1 and 2); the other
//!          bits are reserved, 0
//! 4..8     a broadcast's root rank (little-endian); 0 otherwise
//! ```
//!
//! A receiver that has copied an indirect payload gives its place in the ring back to the
//! root with a `Release` message (16 bytes: b'R', three zero bytes, the ring's buffer
//! number, the payload's offset; all little-endian).
//!
//! A sender that deposited a message straight into the port's buffer (`mailbox`) says so
//! with a `Deposited` notice in its place (16 bytes: b'D', the destination port, the
//! sender's port, a zero byte, the generation of the arming it claimed, the length; all
//! little-endian).
//!
//! A message to one rank of another node that would span several frames travels as
//! **pieces** of one frame each, which the receiver writes into the port's buffer as
//! they arrive (no reassembly copy): each is a `Piece` header (16 bytes: b'P', the
//! destination port, the sender's port, a zero byte, the piece's offset in the message
//! and the message's length, both u32, then four zero bytes; all little-endian) before
//! its part of the payload (at least a byte; an empty message is one empty piece). A
//! sender's pieces of one message follow each other in its channel, in order, from
//! offset 0; a new start ends a message left half sent.
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
const INDIRECT: u8 = 4;
const RELEASE: u8 = b'R';
const DEPOSITED: u8 = b'D';
const PIECE: u8 = b'P';

/// Bytes of a [`Piece`] header.
pub(crate) const PIECE_LEN: usize = 16;

/// Bytes of an [`Indirect`] payload and of a [`Release`] message.
pub(crate) const INDIRECT_LEN: usize = 16;
/// The offset of a [`Release`] a root sends to a reader of its ring `id`: "give back
/// now what you copied" (it is closing).
pub(crate) const FLUSH_RELEASES: u64 = u64::MAX;

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
    /// The payload is an [`Indirect`]: where the message lies in the root's ring.
    pub indirect: bool,
}

impl Header {
    /// The header's bytes.
    pub(crate) fn encode(self) -> [u8; HEADER_LEN] {
        let (flags, root) = match self.root {
            Some(r) if self.native && self.indirect => {
                (BROADCAST | NATIVE | INDIRECT, r.to_le_bytes())
            }
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
        let (root, native, indirect) = match head[3] {
            0 if word == 0 => (None, false, false),
            BROADCAST => (Some(word), false, false),
            f if f == BROADCAST | NATIVE => (Some(word), true, false),
            f if f == BROADCAST | NATIVE | INDIRECT => (Some(word), true, true),
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
                indirect,
            },
            payload,
        ))
    }
}

/// Where an indirect broadcast's payload lies: `len` bytes at `offset` of the root's
/// shared buffer number `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Indirect {
    pub id: u32,
    pub offset: u64,
    pub len: u32,
}

impl Indirect {
    pub(crate) fn encode(self) -> [u8; INDIRECT_LEN] {
        let mut b = [0; INDIRECT_LEN];
        b[..4].copy_from_slice(&self.id.to_le_bytes());
        b[4..12].copy_from_slice(&self.offset.to_le_bytes());
        b[12..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// The place a payload names; `None` unless it is exactly 16 bytes.
    pub(crate) fn decode(payload: &[u8]) -> Option<Indirect> {
        let b: &[u8; INDIRECT_LEN] = payload.try_into().ok()?;
        Some(Indirect {
            id: u32::from_le_bytes(b[..4].try_into().ok()?),
            offset: u64::from_le_bytes(b[4..12].try_into().ok()?),
            len: u32::from_le_bytes(b[12..].try_into().ok()?),
        })
    }
}

/// A receiver gives back the place of an indirect payload it copied: the root's buffer
/// `id`, at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Release {
    pub id: u32,
    pub offset: u64,
}

impl Release {
    pub(crate) fn encode(self) -> [u8; INDIRECT_LEN] {
        let mut b = [0; INDIRECT_LEN];
        b[0] = RELEASE;
        b[4..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..].copy_from_slice(&self.offset.to_le_bytes());
        b
    }

    /// The release `msg` is; `None` unless it is exactly one.
    pub(crate) fn decode(msg: &[u8]) -> Option<Release> {
        let b: &[u8; INDIRECT_LEN] = msg.try_into().ok()?;
        if b[..4] != [RELEASE, 0, 0, 0] {
            return None;
        }
        Some(Release {
            id: u32::from_le_bytes(b[4..8].try_into().ok()?),
            offset: u64::from_le_bytes(b[8..].try_into().ok()?),
        })
    }
}

/// A message that was written straight into port `dest_port`'s buffer (`mailbox`): the
/// notice travels in its place, in order with the sender's other messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deposited {
    pub dest_port: u8,
    pub src_port: u8,
    /// The generation of the arming the sender claimed.
    pub generation: u32,
    /// Bytes it wrote.
    pub len: u64,
}

impl Deposited {
    pub(crate) fn encode(self) -> [u8; INDIRECT_LEN] {
        let mut b = [0; INDIRECT_LEN];
        b[..4].copy_from_slice(&[DEPOSITED, self.dest_port, self.src_port, 0]);
        b[4..8].copy_from_slice(&self.generation.to_le_bytes());
        b[8..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// The notice `msg` is; `None` unless it is exactly one.
    pub(crate) fn decode(msg: &[u8]) -> Option<Deposited> {
        let b: &[u8; INDIRECT_LEN] = msg.try_into().ok()?;
        if b[0] != DEPOSITED || b[3] != 0 {
            return None;
        }
        Some(Deposited {
            dest_port: b[1],
            src_port: b[2],
            generation: u32::from_le_bytes(b[4..8].try_into().ok()?),
            len: u64::from_le_bytes(b[8..].try_into().ok()?),
        })
    }
}

/// One frame's worth of a message to port `dest_port` ([module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub dest_port: u8,
    pub src_port: u8,
    /// Where the piece's bytes go in the message.
    pub offset: u32,
    /// The whole message's length.
    pub total: u32,
}

impl Piece {
    pub(crate) fn encode(self) -> [u8; PIECE_LEN] {
        let mut b = [0; PIECE_LEN];
        b[..4].copy_from_slice(&[PIECE, self.dest_port, self.src_port, 0]);
        b[4..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.total.to_le_bytes());
        b
    }

    /// Splits `msg` into a piece's header and its bytes; `None` unless it is a
    /// well-formed piece: reserved bytes zero, at least one byte (but for the one piece
    /// of an empty message, offset and length 0), and every byte inside the message.
    pub(crate) fn decode(msg: &[u8]) -> Option<(Piece, &[u8])> {
        let (b, bytes) = msg.split_first_chunk::<PIECE_LEN>()?;
        if b[0] != PIECE || b[3] != 0 || b[12..] != [0; 4] {
            return None;
        }
        if bytes.is_empty() && b[4..12] != [0; 8] {
            return None;
        }
        let p = Piece {
            dest_port: b[1],
            src_port: b[2],
            offset: u32::from_le_bytes(b[4..8].try_into().ok()?),
            total: u32::from_le_bytes(b[8..12].try_into().ok()?),
        };
        let end = u64::from(p.offset) + bytes.len() as u64;
        (end <= u64::from(p.total)).then_some((p, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_decodes_to_what_was_encoded() {
        let cases = [None, Some(0), Some(7), Some(u32::MAX)]
            .into_iter()
            .map(|root| (root, false, false))
            .chain([(Some(3), true, false), (Some(3), true, true)]);
        for (root, native, indirect) in cases {
            let h = Header {
                dest_port: 254,
                src_port: 7,
                root,
                native,
                indirect,
            };
            let mut msg = h.encode().to_vec();
            msg.extend_from_slice(b"payload");
            assert_eq!(Header::decode(&msg), Some((h, &b"payload"[..])));
            assert_eq!(Header::decode(&h.encode()), Some((h, &[][..])));
        }
    }

    #[test]
    fn places_and_releases_round_trip_and_nothing_else_decodes_as_them() {
        let i = Indirect {
            id: 1 << 31 | 7,
            offset: 123_456,
            len: 99,
        };
        assert_eq!(Indirect::decode(&i.encode()), Some(i));
        assert_eq!(Indirect::decode(&i.encode()[..15]), None);
        let r = Release {
            id: 5,
            offset: u64::MAX,
        };
        assert_eq!(Release::decode(&r.encode()), Some(r));
        let mut bad = r.encode();
        bad[1] = 1;
        assert_eq!(Release::decode(&bad), None);
        assert_eq!(Release::decode(&[b'R'; 17]), None);
        // A port message is never a release, nor the other way round.
        let h = Header {
            dest_port: 1,
            src_port: 2,
            root: None,
            native: false,
            indirect: false,
        }
        .encode();
        let mut m = h.to_vec();
        m.extend_from_slice(&[0; 8]);
        assert_eq!(Release::decode(&m), None);
        assert_eq!(Header::decode(&r.encode()), None);
        let d = Deposited {
            dest_port: 3,
            src_port: 4,
            generation: 9,
            len: 1 << 20,
        };
        assert_eq!(Deposited::decode(&d.encode()), Some(d));
        assert_eq!(Header::decode(&d.encode()), None);
        assert_eq!(Release::decode(&d.encode()), None);
        assert_eq!(Deposited::decode(&r.encode()), None);
        assert_eq!(Deposited::decode(&m), None, "a port message of 16 bytes");
        let mut odd = d.encode();
        odd[3] = 1;
        assert_eq!(Deposited::decode(&odd), None);
        // INDIRECT without NATIVE is malformed.
        let mut only = h;
        only[3] = 1 | 4;
        assert_eq!(Header::decode(&only), None);
    }

    #[test]
    fn pieces_round_trip_and_reach_no_further_than_their_message() {
        let p = Piece {
            dest_port: 9,
            src_port: 4,
            offset: 1000,
            total: 1010,
        };
        let mut m = p.encode().to_vec();
        m.extend_from_slice(&[7; 10]);
        assert_eq!(Piece::decode(&m), Some((p, &[7; 10][..])));
        // One byte past the message's end, no byte at all, a reserved byte set.
        m.push(7);
        assert_eq!(Piece::decode(&m), None);
        assert_eq!(Piece::decode(&p.encode()), None);
        for i in [3, 12, 15] {
            let mut bad = p.encode().to_vec();
            bad[i] = 1;
            bad.push(0);
            assert_eq!(Piece::decode(&bad), None, "byte {i}");
        }
        // The one piece of an empty message (sent after a half-sent one).
        let empty = Piece {
            offset: 0,
            total: 0,
            ..p
        };
        assert_eq!(Piece::decode(&empty.encode()), Some((empty, &[][..])));
        // A piece is no other message, and no other message a piece.
        assert_eq!(Header::decode(&m), None);
        assert_eq!(Deposited::decode(&p.encode()), None);
        let h = Header {
            dest_port: 1,
            src_port: 2,
            root: None,
            native: false,
            indirect: false,
        };
        let mut whole = h.encode().to_vec();
        whole.extend_from_slice(&[0; 16]);
        assert_eq!(Piece::decode(&whole), None);
    }

    #[test]
    fn short_foreign_or_reserved_headers_are_malformed() {
        let good = Header {
            dest_port: 1,
            src_port: 2,
            root: None,
            native: false,
            indirect: false,
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
