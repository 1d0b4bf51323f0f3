//! The wire form of remote operations on windows (the deposit seed's put and fetch, and
//! LCI's fetch-and-add): what an origin sends to the rank that exposes the window, and
//! what comes back. Pure encoding; no memory is touched here.
//!
//! Every request names the window by its number and its generation (a window freed and
//! allocated again under the same number has another generation, so a request meant for
//! the old one is refused, never applied to the new one) and a byte offset in it; the
//! target checks both and the bounds before it touches anything. Little-endian fields.
//!
//! | kind | fields after the kind byte | payload |
//! |---|---|---|
//! | `P` put | pad 3, window u32, generation u32, pad 4, offset u64 | the bytes |
//! | `G` get | pad 3, window u32, generation u32, piece u32, offset u64, id u64, len u64, base u64 | - |
//! | `g` get reply | status u8, pad 6, id u64, offset in the get (`base` + offset in the range) u64 | the bytes |
//! | `A` atomic | op u8, pad 2, window u32, generation u32, pad 4, offset u64, id u64, a u64, b u64 | - |
//! | `a` atomic reply | status u8, pad 6, id u64, value u64 | - |
//! | `S` strided put | pad 3, window u32, generation u32, pad 4, offset u64, stride u64, elem u64, count u64 | the elements, packed |
//! | `I` indexed put | pad 3, window u32, generation u32, count u32, elem u64 | count offsets (u64), then the elements, packed |
//! | `T` strided get | as `S`, then id u64, piece u32, pad 4 | - |
//! | `J` indexed get | pad 3, window u32, generation u32, count u32, elem u64, id u64, piece u32, pad 4 | count offsets (u64) |
//! | `N` notify | pad 3, window u32, generation u32, pad 4, offset u64, add u64 | - |
//! | `B` barrier | round u8, pad 6, episode u64 | - |
//! | `R` combine up | pad 7, episode u64, value u64 | - |
//! | `D` combine down | pad 7, episode u64, value u64 | - |
//! | `M` puts combined | pad 7 | parts, each a length u32 then a `P`, `S` or `I` request |
//! | `X` accumulate | op u8 (a [`Reduce`](super::reduce::Reduce), or [`CAS`]), fetch u8, pad 1, window u32, generation u32, element 4 bytes ([`Element::encode`]), offset u64, lock window u32, lock generation u32, lock offset u64, id u64, len u64 | the origin's `len` bytes (none for `NoOp`; compare then new for `CAS`) |
//! | `x` accumulate reply | status u8, pad 6, id u64 | the `len` bytes before, when fetched |
//! | `F` flush | pad 7, id u64 | - |
//! | `f` flush reply | status u8 (of the first refusal), pad 6, id u64, refused u64 | - |

use super::reduce::Element;
#[cfg(test)]
use super::reduce::{Number, Reduce};

/// Bytes of a put's header before its payload.
pub(crate) const PUT_LEN: usize = 24;
/// Bytes of a get reply's header before its payload.
pub(crate) const GOT_LEN: usize = 24;
pub(crate) const GET_LEN: usize = 48;
const ATOMIC_LEN: usize = 48;
const ATOMIC_REPLY_LEN: usize = 24;
const FLUSH_LEN: usize = 16;
/// Bytes of an accumulate's header before its payload, and of its answer's.
pub(crate) const ACCUMULATE_LEN: usize = 56;
pub(crate) const ACCUMULATED_LEN: usize = 16;
/// The operation code of an accumulate that is an element's compare-and-swap.
pub(crate) const CAS: u8 = 0x80;
/// Bytes of a strided put's header before its packed elements.
pub(crate) const STRIDED_LEN: usize = 48;
/// Bytes of an indexed put's header before its offsets and packed elements.
pub(crate) const INDEXED_LEN: usize = 24;
const STRIDED_GET_LEN: usize = 64;
/// Bytes of an indexed get's header before its offsets.
pub(crate) const INDEXED_GET_LEN: usize = 40;
const NOTIFY_LEN: usize = 32;
/// Bytes of a combined message's header, and of each part's length before it.
pub(crate) const COMBINED_LEN: usize = 8;
pub(crate) const PART_LEN: usize = 4;
const BARRIER_LEN: usize = 16;
const COMBINE_LEN: usize = 24;
const FLUSH_REPLY_LEN: usize = 24;

/// Where a request points: a window of the target, by number and generation, and an
/// offset in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct At {
    pub window: u32,
    pub generation: u32,
    pub offset: u64,
}

/// What the target made of a request ([`crate::rma::RmaError`] at the origin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Status {
    Done = 0,
    /// No window of that number and generation (never allocated, or freed since).
    NoWindow = 1,
    /// The range does not lie inside the window.
    OutOfBounds = 2,
    /// An atomic on a word that is not 8-byte aligned.
    Misaligned = 3,
    /// An atomic whose operation the target does not know; an accumulate whose
    /// operation or element it does not know, or whose operation is not defined on its
    /// element.
    BadOp = 4,
    /// An accumulate whose length is not a whole number of its elements, whose data does
    /// not match its length, whose answer would be longer than the target sends, or
    /// whose range holds its own lock word.
    BadLength = 5,
    /// An accumulate whose lock word stayed taken while the target tried: the origin
    /// asks again.
    Busy = 6,
    /// A status this side does not know (a newer or lying peer): the request fails.
    Unknown = 255,
}

impl Status {
    /// Why, in words.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Status::Done => "done",
            Status::NoWindow => "no such window (never allocated, or freed)",
            Status::OutOfBounds => "the range lies outside the window",
            Status::Misaligned => "the word is not 8-byte aligned",
            Status::BadOp => "an unknown operation, or one not defined on its element",
            Status::BadLength => {
                "a length that is not a whole number of elements, too long, or over its lock word"
            }
            Status::Busy => "the lock word was taken",
            Status::Unknown => "an answer this version does not know",
        }
    }

    fn from_u8(b: u8) -> Status {
        match b {
            0 => Status::Done,
            1 => Status::NoWindow,
            2 => Status::OutOfBounds,
            3 => Status::Misaligned,
            4 => Status::BadOp,
            5 => Status::BadLength,
            6 => Status::Busy,
            _ => Status::Unknown,
        }
    }
}

/// The 64-bit atomic operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum AtomicOp {
    /// Adds `a`; the old value back.
    FetchAdd = 1,
    /// Writes `b` if the word is `a`; the old value back.
    CompareSwap = 2,
    /// Writes `a`; the old value back.
    Swap = 3,
}

impl AtomicOp {
    pub(crate) fn from_u8(b: u8) -> Option<AtomicOp> {
        Some(match b {
            1 => AtomicOp::FetchAdd,
            2 => AtomicOp::CompareSwap,
            3 => AtomicOp::Swap,
            _ => return None,
        })
    }

    /// Applies the operation to `word`, atomically; the value before.
    pub(crate) fn apply(self, word: &std::sync::atomic::AtomicU64, a: u64, b: u64) -> u64 {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        match self {
            AtomicOp::FetchAdd => word.fetch_add(a, AcqRel),
            AtomicOp::CompareSwap => match word.compare_exchange(a, b, AcqRel, Acquire) {
                Ok(v) | Err(v) => v,
            },
            AtomicOp::Swap => word.swap(a, AcqRel),
        }
    }
}

/// A decoded message of the RMA protocol (`payload` borrowed from the message).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Op<'a> {
    Put {
        at: At,
        data: &'a [u8],
    },
    Get {
        at: At,
        id: u64,
        len: u64,
        /// The longest piece of the answer the origin wants (its frame payload).
        piece: u32,
        /// Where the range starts in the whole get it is a chunk of: the answer's
        /// pieces say their offset from the whole get's start.
        base: u64,
    },
    Got {
        status: Status,
        id: u64,
        offset: u64,
        data: &'a [u8],
    },
    Atomic {
        at: At,
        /// The operation's code ([`AtomicOp`]; one the target does not know is
        /// answered [`Status::BadOp`]).
        op: u8,
        id: u64,
        a: u64,
        b: u64,
    },
    AtomicDone {
        status: Status,
        id: u64,
        value: u64,
    },
    /// Elements packed in `data` to the strided layout at `at.offset`.
    PutStrided {
        at: At,
        stride: u64,
        elem: u64,
        count: u64,
        data: &'a [u8],
    },
    /// Elements packed in `data` to `offsets` (little-endian u64s, as sent).
    PutIndexed {
        at: At,
        elem: u64,
        offsets: &'a [u8],
        data: &'a [u8],
    },
    GetStrided {
        at: At,
        stride: u64,
        elem: u64,
        count: u64,
        id: u64,
        piece: u32,
    },
    GetIndexed {
        at: At,
        elem: u64,
        offsets: &'a [u8],
        id: u64,
        piece: u32,
    },
    /// Adds `add` to the word at `at` after everything before it (no answer).
    Notify {
        at: At,
        add: u64,
    },
    /// A rank reached `round` of barrier `episode` (an empty control message).
    Barrier {
        round: u8,
        episode: u64,
    },
    /// A child's combined value of combining episode `episode` (reduce up).
    CombineUp {
        episode: u64,
        value: u64,
    },
    /// The result of combining episode `episode` (broadcast down).
    CombineDown {
        episode: u64,
        value: u64,
    },
    /// Puts combined into one message: `parts` are their length-prefixed requests
    /// ([`parts`] splits them).
    Combined {
        parts: &'a [u8],
    },
    /// An accumulate (or an element's compare-and-swap, `op` [`CAS`]) of `len` bytes at
    /// `at`, applied holding the lock word at `lock`; answered under `id`, with the bytes
    /// before when `fetch`.
    Accumulate {
        at: At,
        /// The operation's code (a [`Reduce`](super::reduce::Reduce) or [`CAS`]; one the target does not know
        /// is answered [`Status::BadOp`]).
        op: u8,
        fetch: bool,
        /// The element's wire form ([`Element::decode`]).
        elem: [u8; 4],
        lock: At,
        id: u64,
        len: u64,
        data: &'a [u8],
    },
    /// The answer to accumulate `id`: the bytes before, when it fetched.
    Accumulated {
        status: Status,
        id: u64,
        data: &'a [u8],
    },
    Flush {
        id: u64,
    },
    Flushed {
        status: Status,
        id: u64,
        refused: u64,
    },
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

fn put_at(buf: &mut [u8], at: At) {
    buf[4..8].copy_from_slice(&at.window.to_le_bytes());
    buf[8..12].copy_from_slice(&at.generation.to_le_bytes());
    buf[16..24].copy_from_slice(&at.offset.to_le_bytes());
}

fn read_at(b: &[u8]) -> At {
    At {
        window: u32_at(b, 4),
        generation: u32_at(b, 8),
        offset: u64_at(b, 16),
    }
}

/// The header of a put to `at` (its payload follows).
pub(crate) fn put(at: At) -> [u8; PUT_LEN] {
    let mut b = [0; PUT_LEN];
    b[0] = b'P';
    put_at(&mut b, at);
    b
}

/// The header of a message of combined puts (its parts follow, [`part`] each).
pub(crate) fn combined() -> [u8; COMBINED_LEN] {
    let mut b = [0; COMBINED_LEN];
    b[0] = b'M';
    b
}

/// Appends to `message` one part: a put request `head` followed by its `data`.
pub(crate) fn part(message: &mut Vec<u8>, head: &[u8], data: &[u8]) {
    let len = u32::try_from(head.len() + data.len()).expect("a part fits one frame");
    message.extend_from_slice(&len.to_le_bytes());
    message.extend_from_slice(head);
    message.extend_from_slice(data);
}

/// The requests of a combined message's `parts`, in order: each a put (`P`, `S` or
/// `I`), else `None` where the parts stop making sense (a length past the end, another
/// kind: the rest is dropped).
pub(crate) fn parts(mut parts: &[u8]) -> impl Iterator<Item = Option<&[u8]>> {
    std::iter::from_fn(move || {
        if parts.is_empty() {
            return None;
        }
        let part = (parts.len() >= PART_LEN)
            .then(|| u32_at(parts, 0) as usize)
            .and_then(|len| parts.get(PART_LEN..PART_LEN.checked_add(len)?))
            .filter(|p| matches!(p.first(), Some(b'P' | b'S' | b'I')));
        match part {
            Some(p) => {
                parts = &parts[PART_LEN + p.len()..];
                Some(Some(p))
            }
            None => {
                parts = &[];
                Some(None)
            }
        }
    })
}

/// A get of `len` bytes at `at`, answered under `id` in pieces of at most `piece`
/// bytes, the range being bytes `base..base + len` of the whole get (0 for a get asked
/// in one request; a large get is asked a chunk at a time).
pub(crate) fn get(at: At, id: u64, len: u64, piece: u32, base: u64) -> [u8; GET_LEN] {
    let mut b = [0; GET_LEN];
    b[0] = b'G';
    put_at(&mut b, at);
    b[12..16].copy_from_slice(&piece.to_le_bytes());
    b[24..32].copy_from_slice(&id.to_le_bytes());
    b[32..40].copy_from_slice(&len.to_le_bytes());
    b[40..48].copy_from_slice(&base.to_le_bytes());
    b
}

/// The header of a piece of the reply to get `id`, its bytes at `offset` of the range
/// asked for (they follow), or of its refusal (`status`, no bytes).
pub(crate) fn got(status: Status, id: u64, offset: u64) -> [u8; GOT_LEN] {
    let mut b = [0; GOT_LEN];
    b[0] = b'g';
    b[1] = status as u8;
    b[8..16].copy_from_slice(&id.to_le_bytes());
    b[16..24].copy_from_slice(&offset.to_le_bytes());
    b
}

/// An atomic `op` on the word at `at`, answered under `id`.
pub(crate) fn atomic(at: At, op: AtomicOp, id: u64, a: u64, b: u64) -> [u8; ATOMIC_LEN] {
    let mut m = [0; ATOMIC_LEN];
    m[0] = b'A';
    m[1] = op as u8;
    put_at(&mut m, at);
    m[24..32].copy_from_slice(&id.to_le_bytes());
    m[32..40].copy_from_slice(&a.to_le_bytes());
    m[40..48].copy_from_slice(&b.to_le_bytes());
    m
}

/// The answer to atomic `id`: the word's value before, or its refusal.
pub(crate) fn atomic_done(status: Status, id: u64, value: u64) -> [u8; ATOMIC_REPLY_LEN] {
    let mut b = [0; ATOMIC_REPLY_LEN];
    b[0] = b'a';
    b[1] = status as u8;
    b[8..16].copy_from_slice(&id.to_le_bytes());
    b[16..24].copy_from_slice(&value.to_le_bytes());
    b
}

fn strided_head(kind: u8, at: At, stride: u64, elem: u64, count: u64, b: &mut [u8]) {
    b[0] = kind;
    put_at(b, at);
    b[24..32].copy_from_slice(&stride.to_le_bytes());
    b[32..40].copy_from_slice(&elem.to_le_bytes());
    b[40..48].copy_from_slice(&count.to_le_bytes());
}

/// The header of a strided put of `count` elements of `elem` bytes, element `i` at
/// `at.offset + i * stride` (the packed elements follow).
pub(crate) fn put_strided(at: At, stride: u64, elem: u64, count: u64) -> [u8; STRIDED_LEN] {
    let mut b = [0; STRIDED_LEN];
    strided_head(b'S', at, stride, elem, count, &mut b);
    b
}

/// The header of an indexed put of `offsets.len()` elements of `elem` bytes, element
/// `i` at `offsets[i]` of the window: the offsets are appended to `out` after it (the
/// packed elements follow them).
pub(crate) fn put_indexed(at: At, elem: u64, offsets: &[u64], out: &mut Vec<u8>) {
    let mut b = [0; INDEXED_LEN];
    b[0] = b'I';
    put_at(&mut b, at);
    b[12..16].copy_from_slice(&(offsets.len() as u32).to_le_bytes());
    b[16..24].copy_from_slice(&elem.to_le_bytes());
    out.extend_from_slice(&b);
    for o in offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
}

/// A strided get, answered under `id` with the elements packed, in pieces of at most
/// `piece` bytes.
pub(crate) fn get_strided(
    at: At,
    stride: u64,
    elem: u64,
    count: u64,
    id: u64,
    piece: u32,
) -> [u8; STRIDED_GET_LEN] {
    let mut b = [0; STRIDED_GET_LEN];
    strided_head(b'T', at, stride, elem, count, &mut b);
    b[48..56].copy_from_slice(&id.to_le_bytes());
    b[56..60].copy_from_slice(&piece.to_le_bytes());
    b
}

/// An indexed get (its offsets appended to `out` after the header), answered as
/// [`get_strided`].
pub(crate) fn get_indexed(
    at: At,
    elem: u64,
    offsets: &[u64],
    id: u64,
    piece: u32,
    out: &mut Vec<u8>,
) {
    let mut b = [0; INDEXED_GET_LEN];
    b[0] = b'J';
    put_at(&mut b, at);
    b[12..16].copy_from_slice(&(offsets.len() as u32).to_le_bytes());
    b[16..24].copy_from_slice(&elem.to_le_bytes());
    b[24..32].copy_from_slice(&id.to_le_bytes());
    b[32..36].copy_from_slice(&piece.to_le_bytes());
    out.extend_from_slice(&b);
    for o in offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
}

/// Adds `add` to the word at `at`, after every request before it (no answer; a refusal
/// is reported by the next flush, as a put's).
pub(crate) fn notify(at: At, add: u64) -> [u8; NOTIFY_LEN] {
    let mut b = [0; NOTIFY_LEN];
    b[0] = b'N';
    put_at(&mut b, at);
    b[24..32].copy_from_slice(&add.to_le_bytes());
    b
}

/// The offsets of an indexed request, as sent.
pub(crate) fn offsets(raw: &[u8]) -> impl Iterator<Item = u64> + '_ {
    raw.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
}

/// Round `round` of barrier `episode` reached (no answer).
pub(crate) fn barrier(round: u8, episode: u64) -> [u8; BARRIER_LEN] {
    let mut b = [0; BARRIER_LEN];
    b[0] = b'B';
    b[1] = round;
    b[8..16].copy_from_slice(&episode.to_le_bytes());
    b
}

/// A combining tree's value of `episode`, up (`up`) or down.
pub(crate) fn combine(up: bool, episode: u64, value: u64) -> [u8; COMBINE_LEN] {
    let mut b = [0; COMBINE_LEN];
    b[0] = if up { b'R' } else { b'D' };
    b[8..16].copy_from_slice(&episode.to_le_bytes());
    b[16..24].copy_from_slice(&value.to_le_bytes());
    b
}

/// What an accumulate request says besides its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AccumulateHead {
    pub at: At,
    /// A [`Reduce`](super::reduce::Reduce) as `u8`, or [`CAS`].
    pub op: u8,
    pub fetch: bool,
    pub elem: Element,
    pub lock: At,
    pub id: u64,
    pub len: u64,
}

/// The header of an accumulate (its payload follows).
pub(crate) fn accumulate(h: AccumulateHead) -> [u8; ACCUMULATE_LEN] {
    let mut b = [0; ACCUMULATE_LEN];
    b[0] = b'X';
    b[1] = h.op;
    b[2] = u8::from(h.fetch);
    put_at(&mut b, h.at);
    b[12..16].copy_from_slice(&h.elem.encode());
    b[24..28].copy_from_slice(&h.lock.window.to_le_bytes());
    b[28..32].copy_from_slice(&h.lock.generation.to_le_bytes());
    b[32..40].copy_from_slice(&h.lock.offset.to_le_bytes());
    b[40..48].copy_from_slice(&h.id.to_le_bytes());
    b[48..56].copy_from_slice(&h.len.to_le_bytes());
    b
}

/// The header of the answer to accumulate `id` (the fetched bytes follow).
pub(crate) fn accumulated(status: Status, id: u64) -> [u8; ACCUMULATED_LEN] {
    let mut b = [0; ACCUMULATED_LEN];
    b[0] = b'x';
    b[1] = status as u8;
    b[8..16].copy_from_slice(&id.to_le_bytes());
    b
}

/// A flush: answered once everything the origin sent before it was applied.
pub(crate) fn flush(id: u64) -> [u8; FLUSH_LEN] {
    let mut b = [0; FLUSH_LEN];
    b[0] = b'F';
    b[8..16].copy_from_slice(&id.to_le_bytes());
    b
}

/// The answer to flush `id`: how many puts of this origin were refused since its last
/// flush, and why the first was.
pub(crate) fn flushed(status: Status, id: u64, refused: u64) -> [u8; FLUSH_REPLY_LEN] {
    let mut b = [0; FLUSH_REPLY_LEN];
    b[0] = b'f';
    b[1] = status as u8;
    b[8..16].copy_from_slice(&id.to_le_bytes());
    b[16..24].copy_from_slice(&refused.to_le_bytes());
    b
}

/// Decodes a message of the protocol; `None` for anything else (too short or too long,
/// an unknown kind). An unknown status decodes as [`Status::Unknown`] and an unknown
/// operation as its code: both are answered, not dropped, so no request waits forever.
pub(crate) fn decode(m: &[u8]) -> Option<Op<'_>> {
    let kind = *m.first()?;
    let need = match kind {
        b'P' => PUT_LEN,
        b'G' => GET_LEN,
        b'g' => GOT_LEN,
        b'A' => ATOMIC_LEN,
        b'a' => ATOMIC_REPLY_LEN,
        b'F' => FLUSH_LEN,
        b'f' => FLUSH_REPLY_LEN,
        b'S' => STRIDED_LEN,
        b'I' => INDEXED_LEN,
        b'T' => STRIDED_GET_LEN,
        b'J' => INDEXED_GET_LEN,
        b'N' => NOTIFY_LEN,
        b'B' => BARRIER_LEN,
        b'R' | b'D' => COMBINE_LEN,
        b'M' => COMBINED_LEN,
        b'X' => ACCUMULATE_LEN,
        b'x' => ACCUMULATED_LEN,
        _ => return None,
    };
    if m.len() < need
        || (!matches!(kind, b'P' | b'g' | b'S' | b'I' | b'J' | b'M' | b'X' | b'x')
            && m.len() != need)
    {
        return None;
    }
    // An indexed request's offsets follow its header: their count must fit.
    let indexed = |head: usize| -> Option<(&[u8], &[u8])> {
        let count = u32_at(m, 12) as usize;
        let end = count.checked_mul(8)?.checked_add(head)?;
        (end <= m.len()).then(|| (&m[head..end], &m[end..]))
    };
    Some(match kind {
        b'P' => Op::Put {
            at: read_at(m),
            data: &m[PUT_LEN..],
        },
        b'G' => Op::Get {
            at: read_at(m),
            id: u64_at(m, 24),
            len: u64_at(m, 32),
            piece: u32_at(m, 12),
            base: u64_at(m, 40),
        },
        b'g' => Op::Got {
            status: Status::from_u8(m[1]),
            id: u64_at(m, 8),
            offset: u64_at(m, 16),
            data: &m[GOT_LEN..],
        },
        b'A' => Op::Atomic {
            at: read_at(m),
            op: m[1],
            id: u64_at(m, 24),
            a: u64_at(m, 32),
            b: u64_at(m, 40),
        },
        b'a' => Op::AtomicDone {
            status: Status::from_u8(m[1]),
            id: u64_at(m, 8),
            value: u64_at(m, 16),
        },
        b'F' => Op::Flush { id: u64_at(m, 8) },
        b'X' => Op::Accumulate {
            at: read_at(m),
            op: m[1],
            fetch: m[2] != 0,
            elem: m[12..16].try_into().expect("4 bytes"),
            lock: At {
                window: u32_at(m, 24),
                generation: u32_at(m, 28),
                offset: u64_at(m, 32),
            },
            id: u64_at(m, 40),
            len: u64_at(m, 48),
            data: &m[ACCUMULATE_LEN..],
        },
        b'x' => Op::Accumulated {
            status: Status::from_u8(m[1]),
            id: u64_at(m, 8),
            data: &m[ACCUMULATED_LEN..],
        },
        b'M' => Op::Combined {
            parts: &m[COMBINED_LEN..],
        },
        b'S' => Op::PutStrided {
            at: read_at(m),
            stride: u64_at(m, 24),
            elem: u64_at(m, 32),
            count: u64_at(m, 40),
            data: &m[STRIDED_LEN..],
        },
        b'I' => {
            let (offsets, data) = indexed(INDEXED_LEN)?;
            Op::PutIndexed {
                at: At {
                    offset: 0,
                    ..read_at(m)
                },
                elem: u64_at(m, 16),
                offsets,
                data,
            }
        }
        b'T' => Op::GetStrided {
            at: read_at(m),
            stride: u64_at(m, 24),
            elem: u64_at(m, 32),
            count: u64_at(m, 40),
            id: u64_at(m, 48),
            piece: u32_at(m, 56),
        },
        b'J' => {
            let (offsets, rest) = indexed(INDEXED_GET_LEN)?;
            if !rest.is_empty() {
                return None;
            }
            Op::GetIndexed {
                at: At {
                    offset: 0,
                    ..read_at(m)
                },
                elem: u64_at(m, 16),
                offsets,
                id: u64_at(m, 24),
                piece: u32_at(m, 32),
            }
        }
        b'R' => Op::CombineUp {
            episode: u64_at(m, 8),
            value: u64_at(m, 16),
        },
        b'D' => Op::CombineDown {
            episode: u64_at(m, 8),
            value: u64_at(m, 16),
        },
        b'B' => Op::Barrier {
            round: m[1],
            episode: u64_at(m, 8),
        },
        b'N' => Op::Notify {
            at: read_at(m),
            add: u64_at(m, 24),
        },
        _ => Op::Flushed {
            status: Status::from_u8(m[1]),
            id: u64_at(m, 8),
            refused: u64_at(m, 16),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_decodes_to_what_was_encoded() {
        let at = At {
            window: 7,
            generation: 0xdead_beef,
            offset: 1 << 40,
        };
        let mut p = put(at).to_vec();
        p.extend_from_slice(b"abc");
        assert_eq!(decode(&p), Some(Op::Put { at, data: b"abc" }));
        assert_eq!(
            decode(&get(at, 9, 100, 1400, 4096)),
            Some(Op::Get {
                at,
                id: 9,
                len: 100,
                piece: 1400,
                base: 4096
            })
        );
        let mut g = got(Status::Done, 9, 64).to_vec();
        g.extend_from_slice(b"xy");
        assert_eq!(
            decode(&g),
            Some(Op::Got {
                status: Status::Done,
                id: 9,
                offset: 64,
                data: b"xy"
            })
        );
        assert_eq!(
            decode(&atomic(at, AtomicOp::CompareSwap, 3, 1, 2)),
            Some(Op::Atomic {
                at,
                op: AtomicOp::CompareSwap as u8,
                id: 3,
                a: 1,
                b: 2
            })
        );
        assert_eq!(
            decode(&atomic_done(Status::Misaligned, 3, 0)),
            Some(Op::AtomicDone {
                status: Status::Misaligned,
                id: 3,
                value: 0
            })
        );
        assert_eq!(decode(&flush(5)), Some(Op::Flush { id: 5 }));
        let lock = At {
            window: 2,
            generation: 3,
            offset: 8,
        };
        let mut x = accumulate(AccumulateHead {
            at,
            op: Reduce::Sum as u8,
            fetch: true,
            elem: Element::Num(Number::F32),
            lock,
            id: 11,
            len: 8,
        })
        .to_vec();
        x.extend_from_slice(&[1; 8]);
        assert_eq!(
            decode(&x),
            Some(Op::Accumulate {
                at,
                op: Reduce::Sum as u8,
                fetch: true,
                elem: Element::Num(Number::F32).encode(),
                lock,
                id: 11,
                len: 8,
                data: &[1; 8]
            })
        );
        assert_eq!(
            decode(&accumulated(Status::BadLength, 11)),
            Some(Op::Accumulated {
                status: Status::BadLength,
                id: 11,
                data: &[]
            })
        );
        assert_eq!(
            decode(&flushed(Status::OutOfBounds, 5, 2)),
            Some(Op::Flushed {
                status: Status::OutOfBounds,
                id: 5,
                refused: 2
            })
        );
    }

    #[test]
    fn short_long_and_unknown_messages_are_refused() {
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(b"Zxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), None);
        let g = get(
            At {
                window: 1,
                generation: 1,
                offset: 0,
            },
            1,
            1,
            1,
            0,
        );
        assert_eq!(decode(&g[..GET_LEN - 1]), None);
        let mut long = g.to_vec();
        long.push(0);
        assert_eq!(decode(&long), None, "a get carries no payload");
        let mut bad_op = atomic(
            At {
                window: 1,
                generation: 1,
                offset: 0,
            },
            AtomicOp::Swap,
            1,
            0,
            0,
        );
        bad_op[1] = 99;
        assert!(matches!(decode(&bad_op), Some(Op::Atomic { op: 99, .. })));
        let mut bad_status = flushed(Status::Done, 1, 0);
        bad_status[1] = 200;
        assert!(matches!(
            decode(&bad_status),
            Some(Op::Flushed {
                status: Status::Unknown,
                ..
            })
        ));
    }
}
