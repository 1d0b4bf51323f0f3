//! The Push-Pull protocol's messages, carried as Directed Point messages between the
//! tagged endpoints of two ranks. Each starts with a fixed little-endian header; pushed
//! and pulled bytes follow it in the same message.
//!
//! ```text
//! Push  (1): kind, flags, slot, tag, msg, total, pushed, pid, seg, addr | first BTP(1) bytes
//! Eager (8): kind, tag, msg                           | the whole message
//! More  (2): kind, msg, offset                        | more pushed bytes (BTP(2), Push-All)
//! Pull  (3): kind, msg, offset, len                   (the acknowledgement: send me these)
//! Data  (4): kind, msg, offset                        | pulled bytes
//! Done  (5): kind, msg                                (your buffer is no longer needed; a synchronous send: taken)
//! Credit (6): kind, bytes                             (this many pushed bytes left my buffer)
//! Abandon (7): kind, msg                              (the sender gave up this message)
//! ```
//!
//! An `Eager` message is the compact form of a `Push` that carries its whole message
//! (it decodes as that `Push`, with nothing to pull): 16 bytes of header instead of 48,
//! so a small message and its header share a cache line.
//!
//! Decoding never panics: a short or unknown message is an error the endpoint counts
//! and drops.

/// Bytes of the largest header (`Push`).
pub const MAX_HEADER: usize = 48;

const PUSH: u8 = 1;
const MORE: u8 = 2;
const PULL: u8 = 3;
const DATA: u8 = 4;
const DONE: u8 = 5;
const CREDIT: u8 = 6;
const ABANDON: u8 = 7;
const EAGER: u8 = 8;
/// Bytes of an `Eager` header.
const EAGER_HEADER: usize = 16;
/// Bytes of a `Data` (and a `More`) header.
pub const DATA_HEADER: usize = 24;

/// What the first push of a message announces: its tag and length, how many bytes the
/// sender pushes in all (the first push and the `More` that follow), and where the rest
/// can be read directly (the sender's pid and buffer address, for a same-node pull; or,
/// when `seg` is not 0, the sender's shared buffer `seg` and the offset in it), and the
/// slot of the sender's split-copy board where the two may share the pull (`slot` - 1;
/// 0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announce {
    /// The split-copy board's slot plus one (0: none).
    pub slot: u16,
    /// The message's tag.
    pub tag: u32,
    /// The sender's number for the message.
    pub msg: u64,
    /// The message's length.
    pub total: u64,
    /// Bytes pushed in all (this push and the `More` that follow).
    pub pushed: u64,
    /// The sender's process id.
    pub pid: u32,
    /// The sender's shared buffer (0: none).
    pub seg: u32,
    /// The buffer's address, or the offset in the shared buffer.
    pub addr: u64,
    /// A synchronous send: its sender waits for word that a receive took it (a `Done`
    /// at the match when nothing is left to pull; after the pull otherwise).
    pub sync: bool,
}

/// `Push` flags: a synchronous send.
const SYNC: u8 = 1;

impl Announce {
    /// The announcement an `Eager` message of `tag`, the sender's number `msg` and `len`
    /// bytes stands for (the whole message, nothing to pull).
    #[inline]
    pub fn eager(tag: u32, msg: u64, len: usize) -> Announce {
        let len = len as u64;
        Announce {
            slot: 0,
            tag,
            msg,
            total: len,
            pushed: len,
            pid: 0,
            seg: 0,
            addr: 0,
            sync: false,
        }
    }

    /// Whether a first push of `first` bytes with this announcement carries the whole
    /// message and nothing more is to be known: it goes as an `Eager` message. (The
    /// sender's pid and address matter only to a pull; a message pushed whole has
    /// nothing to pull.)
    fn is_whole(&self, first: usize) -> bool {
        self.total == first as u64 && self.pushed == self.total && self.slot == 0 && !self.sync
    }
}

/// One protocol message; `data` borrows the payload that follows the header.
// The fields are the header's, as the module's table names them.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg<'a> {
    /// The first push of a message: what it announces, and its first BTP(1) bytes.
    Push { head: Announce, data: &'a [u8] },
    /// Pushed bytes of `msg` from `offset`.
    More {
        msg: u64,
        offset: u64,
        data: &'a [u8],
    },
    /// The receiver's acknowledgement and pull request: bytes `offset..offset + len`.
    Pull { msg: u64, offset: u64, len: u64 },
    /// Pulled bytes of `msg` from `offset`.
    Data {
        msg: u64,
        offset: u64,
        data: &'a [u8],
    },
    /// The receiver needs nothing more of `msg` (it pulled the rest itself, or the
    /// message was truncated): the send is complete.
    Done { msg: u64 },
    /// The receiver's pushed buffer let go of `bytes` pushed bytes of this sender's (they
    /// were received or dropped): the sender may push that many more.
    Credit { bytes: u64 },
    /// The sender gave up `msg` before its receiver was done with it (its wait returned
    /// early with an error): its buffer is gone, the receive fails.
    Abandon { msg: u64 },
}

/// The header of an `Eager` message (the whole message of `tag`, the sender's number
/// `msg`, follows it).
#[inline]
pub fn eager_header(tag: u32, msg: u64) -> [u8; EAGER_HEADER] {
    let mut h = [0; EAGER_HEADER];
    h[0] = EAGER;
    h[4..8].copy_from_slice(&tag.to_le_bytes());
    h[8..16].copy_from_slice(&msg.to_le_bytes());
    h
}

/// An `Eager` message's tag, number and payload; `None` for every other message (and a
/// short one).
#[inline]
pub fn eager(b: &[u8]) -> Option<(u32, u64, &[u8])> {
    let (head, data) = b.split_first_chunk::<EAGER_HEADER>()?;
    if head[0] != EAGER {
        return None;
    }
    let tag = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let msg = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
    Some((tag, msg, data))
}

/// A header, built on the stack.
pub struct Header {
    bytes: [u8; MAX_HEADER],
    len: usize,
}

impl Header {
    /// The header's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

fn put(h: &mut Header, v: &[u8]) {
    h.bytes[h.len..h.len + v.len()].copy_from_slice(v);
    h.len += v.len();
}

impl Msg<'_> {
    /// The header of this message (its payload is sent after it, unchanged).
    pub fn header(&self) -> Header {
        let mut h = Header {
            bytes: [0; MAX_HEADER],
            len: 0,
        };
        match *self {
            Msg::Push { head: a, data } if a.is_whole(data.len()) => {
                put(&mut h, &eager_header(a.tag, a.msg));
            }
            Msg::Push { head: a, .. } => {
                put(&mut h, &[PUSH, if a.sync { SYNC } else { 0 }]);
                put(&mut h, &a.slot.to_le_bytes());
                put(&mut h, &a.tag.to_le_bytes());
                put(&mut h, &a.msg.to_le_bytes());
                put(&mut h, &a.total.to_le_bytes());
                put(&mut h, &a.pushed.to_le_bytes());
                put(&mut h, &a.pid.to_le_bytes());
                put(&mut h, &a.seg.to_le_bytes());
                put(&mut h, &a.addr.to_le_bytes());
            }
            Msg::More { msg, offset, .. } | Msg::Data { msg, offset, .. } => {
                let kind = if matches!(self, Msg::More { .. }) {
                    MORE
                } else {
                    DATA
                };
                put(&mut h, &[kind, 0, 0, 0, 0, 0, 0, 0]);
                put(&mut h, &msg.to_le_bytes());
                put(&mut h, &offset.to_le_bytes());
            }
            Msg::Pull { msg, offset, len } => {
                put(&mut h, &[PULL, 0, 0, 0, 0, 0, 0, 0]);
                put(&mut h, &msg.to_le_bytes());
                put(&mut h, &offset.to_le_bytes());
                put(&mut h, &len.to_le_bytes());
            }
            Msg::Done { msg: v } | Msg::Credit { bytes: v } | Msg::Abandon { msg: v } => {
                let kind = match self {
                    Msg::Done { .. } => DONE,
                    Msg::Credit { .. } => CREDIT,
                    _ => ABANDON,
                };
                put(&mut h, &[kind, 0, 0, 0, 0, 0, 0, 0]);
                put(&mut h, &v.to_le_bytes());
            }
        }
        h
    }

    /// The payload that follows the header.
    pub fn data(&self) -> &[u8] {
        match self {
            Msg::Push { data, .. } | Msg::More { data, .. } | Msg::Data { data, .. } => data,
            _ => &[],
        }
    }

    /// The `Push` an `Eager` message of `tag`, the sender's number `msg` and payload
    /// `data` stands for (the whole message, nothing to pull).
    #[inline]
    pub fn eager(tag: u32, msg: u64, data: &[u8]) -> Msg<'_> {
        Msg::Push {
            head: Announce::eager(tag, msg, data.len()),
            data,
        }
    }

    /// Decodes one message.
    pub fn decode(b: &[u8]) -> Result<Msg<'_>, &'static str> {
        let u32_at = |o: usize| {
            b.get(o..o + 4)
                .map(|s| u32::from_le_bytes(s.try_into().unwrap_or_default()))
        };
        let u64_at = |o: usize| {
            b.get(o..o + 8)
                .map(|s| u64::from_le_bytes(s.try_into().unwrap_or_default()))
        };
        let short = "message shorter than its header";
        let kind = *b.first().ok_or("empty message")?;
        Ok(match kind {
            PUSH => {
                let mut head = Announce {
                    slot: b
                        .get(2..4)
                        .map(|s| u16::from_le_bytes([s[0], s[1]]))
                        .ok_or(short)?,
                    tag: u32_at(4).ok_or(short)?,
                    msg: u64_at(8).ok_or(short)?,
                    total: u64_at(16).ok_or(short)?,
                    pushed: u64_at(24).ok_or(short)?,
                    pid: u32_at(32).ok_or(short)?,
                    seg: u32_at(36).ok_or(short)?,
                    addr: u64_at(40).ok_or(short)?,
                    // Other flags are a newer sender's: ignored.
                    sync: b.get(1).is_some_and(|f| f & SYNC != 0),
                };
                let data = &b[48..];
                if head.pushed > head.total || (data.len() as u64) > head.pushed {
                    return Err("push longer than its message");
                }
                if head.is_whole(data.len()) {
                    // Nothing to pull: where the sender's buffer is means nothing, and
                    // the message is the `Eager` one it re-encodes as.
                    (head.pid, head.seg, head.addr) = (0, 0, 0);
                }
                Msg::Push { head, data }
            }
            EAGER => {
                let (tag, msg, data) = eager(b).ok_or(short)?;
                Msg::eager(tag, msg, data)
            }
            MORE | DATA => {
                let (msg, offset) = (u64_at(8).ok_or(short)?, u64_at(16).ok_or(short)?);
                let data = &b[24..];
                if offset.checked_add(data.len() as u64).is_none() {
                    return Err("offset overflows");
                }
                if kind == MORE {
                    Msg::More { msg, offset, data }
                } else {
                    Msg::Data { msg, offset, data }
                }
            }
            PULL => Msg::Pull {
                msg: u64_at(8).ok_or(short)?,
                offset: u64_at(16).ok_or(short)?,
                len: u64_at(24).ok_or(short)?,
            },
            DONE => Msg::Done {
                msg: u64_at(8).ok_or(short)?,
            },
            CREDIT => Msg::Credit {
                bytes: u64_at(8).ok_or(short)?,
            },
            ABANDON => Msg::Abandon {
                msg: u64_at(8).ok_or(short)?,
            },
            _ => return Err("unknown message kind"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(m: Msg<'_>) {
        let mut bytes = m.header().as_bytes().to_vec();
        bytes.extend_from_slice(m.data());
        assert_eq!(Msg::decode(&bytes).unwrap(), m);
        // Every truncation of the header is an error, never a panic.
        for cut in 0..m.header().as_bytes().len() {
            assert!(Msg::decode(&bytes[..cut]).is_err(), "{m:?} cut at {cut}");
        }
    }

    #[test]
    fn every_kind_round_trips_and_truncations_are_errors() {
        round_trip(Msg::Push {
            head: Announce {
                slot: 65,
                tag: 7,
                msg: 1 << 40,
                total: 5000,
                pushed: 100,
                pid: 4242,
                seg: 3,
                addr: 0xdead_beef_0000,
                sync: true,
            },
            data: &[9; 80],
        });
        round_trip(Msg::Push {
            head: Announce {
                slot: 0,
                tag: 8,
                msg: 3,
                total: 5000,
                pushed: 5000,
                pid: 1,
                seg: 0,
                addr: 64,
                sync: false,
            },
            data: &[7; 100],
        });
        round_trip(Msg::More {
            msg: 3,
            offset: 80,
            data: &[1, 2, 3],
        });
        round_trip(Msg::Pull {
            msg: 3,
            offset: 100,
            len: 4900,
        });
        round_trip(Msg::Data {
            msg: 3,
            offset: 100,
            data: &[],
        });
        round_trip(Msg::Done { msg: u64::MAX });
        round_trip(Msg::Credit { bytes: 1 << 33 });
        round_trip(Msg::Abandon { msg: 17 });
    }

    #[test]
    fn a_push_of_the_whole_message_goes_compact() {
        let head = Announce {
            slot: 0,
            tag: 9,
            msg: 77,
            total: 8,
            pushed: 8,
            pid: 4242,
            seg: 3,
            addr: 0xdead_beef,
            sync: false,
        };
        let m = Msg::Push {
            head,
            data: &[1; 8],
        };
        assert_eq!(m.header().as_bytes().len(), EAGER_HEADER);
        let data = Msg::Data {
            msg: 1,
            offset: 2,
            data: &[],
        };
        assert_eq!(data.header().as_bytes().len(), DATA_HEADER);
        let mut bytes = m.header().as_bytes().to_vec();
        bytes.extend_from_slice(m.data());
        let Ok(Msg::Push { head: got, data }) = Msg::decode(&bytes) else {
            panic!("an eager message decodes as a push");
        };
        assert_eq!((got.tag, got.msg, got.total, got.pushed), (9, 77, 8, 8));
        assert_eq!(
            (got.pid, got.seg, got.addr, got.slot),
            (0, 0, 0, 0),
            "nothing to pull"
        );
        assert_eq!(data, &[1; 8]);
        for cut in 0..EAGER_HEADER {
            assert!(Msg::decode(&bytes[..cut]).is_err());
        }
        // A message with bytes still to come, or a split-copy slot, keeps the full header.
        for head in [
            Announce {
                pushed: 16,
                total: 16,
                ..head
            },
            Announce { slot: 1, ..head },
        ] {
            let m = Msg::Push {
                head,
                data: &[1; 8],
            };
            assert_eq!(m.header().as_bytes().len(), MAX_HEADER);
        }
        round_trip(Msg::Push {
            head: Announce {
                pid: 0,
                seg: 0,
                addr: 0,
                ..head
            },
            data: &[1; 8],
        });
        // The same message in the full form (a peer may send it so) decodes to the same
        // push: where the sender's buffer is means nothing when nothing is to be pulled.
        let mut full = vec![1u8, 0, 0, 0];
        full.extend_from_slice(&9u32.to_le_bytes());
        for v in [77u64, 8, 8] {
            full.extend_from_slice(&v.to_le_bytes());
        }
        full.extend_from_slice(&4242u32.to_le_bytes());
        full.extend_from_slice(&3u32.to_le_bytes());
        full.extend_from_slice(&0xdead_beefu64.to_le_bytes());
        full.extend_from_slice(&[1; 8]);
        assert_eq!(Msg::decode(&full), Msg::decode(&bytes));
    }

    #[test]
    fn inconsistent_pushes_and_unknown_kinds_are_rejected() {
        let m = Msg::Push {
            head: Announce {
                slot: 0,
                tag: 1,
                msg: 1,
                total: 10,
                pushed: 20,
                pid: 1,
                seg: 0,
                addr: 0,
                sync: false,
            },
            data: &[],
        };
        assert!(Msg::decode(m.header().as_bytes()).is_err());
        assert!(Msg::decode(&[0; 64]).is_err());
        assert!(Msg::decode(&[]).is_err());
    }

    proptest::proptest! {
        /// Arbitrary bytes decode to a message or an error, never a panic, and a
        /// decoded message's payload lies inside the input.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..128)) {
            if let Ok(m) = Msg::decode(&bytes) {
                proptest::prop_assert!(m.data().len() <= bytes.len());
                // Re-encoding gives a message that decodes to the same one (a whole
                // push in its full form comes back compact).
                let mut again = m.header().as_bytes().to_vec();
                again.extend_from_slice(m.data());
                proptest::prop_assert_eq!(Msg::decode(&again), Ok(m));
            }
        }
    }
}
