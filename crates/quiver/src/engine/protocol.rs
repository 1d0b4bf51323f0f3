//! The protocol hook: how a personality plugs into the engine as a sans-IO state machine.
//!
//! A personality that answers its peers by itself (tagged's Push-Pull; next GAMMA's
//! handlers, RMA's target side, the schedules of collectives) implements [`Protocol`]:
//! the engine hands it every message that arrives for its endpoint, with the time, where
//! progress runs ([`super::station::Station::drive`]); the protocol answers through an
//! [`Outbox`], which queues instead of waiting for a peer's room or credits, and may ask
//! to be called back at a time. It does no I/O, reads no clock and never waits: the
//! simulator runs it as it is. (The one wait left is the engine's, not the protocol's: a
//! first message to a peer connects to it, as any first write does.)
//!
//! The time is the clock of whoever drives the protocol (the station's, zero when it
//! opened; the offload engine's own for a served protocol), not the one of the
//! channels' timers: compare times only with times from the same calls.
//!
//! A message is lent for the call only (it is read in place, in a shared-memory ring or a
//! link's slot, and released when the call returns) unless the protocol says
//! [`Disposition::Deliver`]: then it goes on to the personality's own reader, as a
//! Directed Point message would.
//!
//! Where progress runs, a protocol runs: the station drives one from the application
//! thread, inside the personality's calls (tagged's Push-Pull); and with the offload
//! engine a `Send` protocol can be served on the engine's thread
//! ([`super::station::Station::open_serving`], [`super::offload::Service`]), which is what
//! lets a peer be answered while its application computes (`docs/DESIGN-NOTES.md`, "The
//! protocol hook").

use crate::addr::Source;
use crate::channel::reliable::Time;
use std::collections::VecDeque;
use std::fmt;

/// What becomes of a message a protocol was handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// The protocol is done with it: the engine releases it.
    Consumed,
    /// It goes on to the personality's reader (as the message [`Station::drive`]
    /// returns).
    ///
    /// [`Station::drive`]: super::station::Station::drive
    // Tagged consumes every message; a personality that also delivers (GAMMA's ports:
    // handlers for some messages, a queue for the rest) is next.
    #[cfg_attr(not(test), allow(dead_code))]
    Deliver,
}

/// A personality's protocol, as the engine runs it (module documentation).
pub(crate) trait Protocol {
    /// A message from `from` arrived. `msg` is valid for this call only.
    fn handle_message(
        &mut self,
        now: Time,
        from: Source,
        msg: &[u8],
        out: &mut Outbox,
    ) -> Disposition;

    /// Whether the protocol reads the time [`handle_message`](Self::handle_message) is
    /// handed. A protocol without timers says false: it is handed [`Time::ZERO`] and
    /// the engine reads no clock for it (a clock read per message is a tenth of a small
    /// message's time inside a node).
    fn uses_time(&self) -> bool {
        true
    }

    /// The time [`poll_timeout`](Self::poll_timeout) asked for has come.
    fn handle_timeout(&mut self, _now: Time, _out: &mut Outbox) {}

    /// When the protocol wants [`handle_timeout`](Self::handle_timeout) called; `None`:
    /// never.
    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    /// Whether the engine goes on handing it the messages that wait, in this call of
    /// [`Station::drive`] (false: the call returns, and the rest waits for the next: a
    /// protocol says so when something the application may wait for has happened).
    ///
    /// [`Station::drive`]: super::station::Station::drive
    fn wants_more(&self) -> bool {
        true
    }

    /// The header of the chunk of range `key` ([`Outbox::send_range`]) that starts at
    /// byte `offset` of the range and carries `len` bytes, appended to `head` (which the
    /// engine hands in empty). A protocol that sends no ranges never sees this call.
    fn range_header(&self, _key: u64, _offset: u64, _len: usize, _head: &mut Vec<u8>) {}

    /// Range `key` to `to` is over: every chunk left (`complete`), or it was dropped
    /// because its destination cannot be reached (the error went to the caller of
    /// [`Station::drive`]). Either way the engine no longer reads its memory.
    ///
    /// [`Station::drive`]: super::station::Station::drive
    fn range_done(&mut self, _to: Source, _key: u64, _complete: bool, _out: &mut Outbox) {}
}

/// Messages a protocol sends, queued until a route takes them: a handler never waits for
/// a peer (a full ring or a closed window keeps the message here, and the engine tries
/// again on its next round). Order is kept per destination; a destination without room
/// holds back only its own messages. Bounded: a protocol that queues more than
/// `capacity` items gets [`OutboxFull`] and must hold back (or fail the operation).
///
/// Besides whole messages, an item may be a **range**: memory of the caller's sent in
/// chunks straight from where it lies, each chunk behind a header the protocol writes
/// ([`Protocol::range_header`]), with a completion when the last chunk left
/// ([`Protocol::range_done`]). That is how a protocol answers a request for a large
/// buffer without copying it into the outbox first.
pub(crate) struct Outbox {
    /// Per destination, its items in the order they were queued.
    queues: Vec<(Source, VecDeque<Item>)>,
    /// Items queued, over every destination.
    len: usize,
    capacity: usize,
    /// Buffers of messages sent, for the next ones.
    spare: Vec<Vec<u8>>,
    /// Messages and range chunks that left so far.
    sent: u64,
}

/// One item of an [`Outbox`].
enum Item {
    /// A whole message, header and body joined.
    Whole(Vec<u8>),
    /// Bytes `next..end` of the memory at `ptr`, in chunks of at most `chunk` bytes.
    Range {
        key: u64,
        ptr: *const u8,
        next: u64,
        end: u64,
        chunk: usize,
    },
}

/// What leaves next towards one destination ([`Outbox::next`]).
pub(crate) enum Next<'a> {
    /// A whole message.
    Whole(&'a [u8]),
    /// The next chunk of range `key`: `bytes`, which start at byte `offset` of it.
    Chunk {
        key: u64,
        offset: u64,
        bytes: &'a [u8],
    },
}

/// The outbox already holds its capacity of items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutboxFull {
    pub capacity: usize,
}

impl fmt::Display for OutboxFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the protocol's outbox holds {} messages already",
            self.capacity
        )
    }
}

impl std::error::Error for OutboxFull {}

impl Outbox {
    /// An empty outbox that holds at most `capacity` items.
    pub(crate) fn new(capacity: usize) -> Outbox {
        Outbox {
            queues: Vec::new(),
            len: 0,
            capacity: capacity.max(1),
            spare: Vec::new(),
            sent: 0,
        }
    }

    /// Queues the message `head` followed by `body` to endpoint `to`.
    pub(crate) fn send(&mut self, to: Source, head: &[u8], body: &[u8]) -> Result<(), OutboxFull> {
        self.check_room()?;
        self.forward(to, head, body);
        Ok(())
    }

    /// Queues the message `head` followed by `body` to endpoint `to` even when the outbox
    /// holds its capacity: for a protocol that forwards what it was handed (a broadcast
    /// down a tree), whose forwards must not be lost. The engine hands a protocol a
    /// message only while its outbox has room, and none while it is full, so a forward
    /// overshoots the capacity by the forwards of one message at most.
    pub(crate) fn forward(&mut self, to: Source, head: &[u8], body: &[u8]) {
        let mut bytes = self.spare.pop().unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(head);
        bytes.extend_from_slice(body);
        self.push(to, Item::Whole(bytes));
    }

    /// Queues bytes `offset..end` of the memory at `ptr` to endpoint `to`, in chunks of
    /// at most `chunk` bytes (at least 1), each behind the header the protocol writes
    /// for range `key` (an empty range leaves as one chunk without bytes).
    ///
    /// # Safety
    ///
    /// `ptr.add(offset)..ptr.add(end)` must stay valid for reads until the protocol is
    /// told the range is done ([`Protocol::range_done`]) or this outbox is dropped.
    pub(crate) unsafe fn send_range(
        &mut self,
        to: Source,
        key: u64,
        ptr: *const u8,
        offset: u64,
        end: u64,
        chunk: usize,
    ) -> Result<(), OutboxFull> {
        self.check_room()?;
        self.push(
            to,
            Item::Range {
                key,
                ptr,
                next: offset,
                end: end.max(offset),
                chunk: chunk.max(1),
            },
        );
        Ok(())
    }

    fn check_room(&self) -> Result<(), OutboxFull> {
        if self.len >= self.capacity {
            return Err(OutboxFull {
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    fn push(&mut self, to: Source, item: Item) {
        self.len += 1;
        match self.queues.iter_mut().find(|(d, _)| *d == to) {
            Some((_, q)) => q.push_back(item),
            None => self.queues.push((to, VecDeque::from([item]))),
        }
    }

    /// Items that may still be queued before the outbox holds its capacity.
    pub(crate) fn room(&self) -> usize {
        self.capacity.saturating_sub(self.len)
    }

    /// Items waiting for a route.
    #[cfg_attr(not(test), allow(dead_code))] // tests and the next personalities
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the outbox holds its capacity (the engine hands the protocol no more
    /// messages until some leave).
    pub(crate) fn is_full(&self) -> bool {
        self.len >= self.capacity
    }

    /// Whether something waits for `to` (a message sent to it directly now would
    /// overtake it).
    pub(crate) fn has_queued_for(&self, to: Source) -> bool {
        self.queues.iter().any(|(d, q)| *d == to && !q.is_empty())
    }

    /// Messages and range chunks that left so far (a caller compares two readings to
    /// see whether a send made progress).
    pub(crate) fn sent(&self) -> u64 {
        self.sent
    }

    /// How many destinations have a queue (some may be empty until
    /// [`Outbox::forget_empty`]); [`Outbox::next`] takes an index below this.
    pub(crate) fn destinations(&self) -> usize {
        self.queues.len()
    }

    /// What leaves next towards the `i`th destination, if anything waits for it.
    pub(crate) fn next(&self, i: usize) -> Option<(Source, Next<'_>)> {
        let (to, q) = self.queues.get(i)?;
        let next = match q.front()? {
            Item::Whole(b) => Next::Whole(b),
            &Item::Range {
                key,
                ptr,
                next,
                end,
                chunk,
            } => {
                let len = (end - next).min(chunk as u64) as usize;
                let bytes = if len == 0 {
                    &[][..]
                } else {
                    // SAFETY: `next..next + len` lies inside `offset..end` of the range,
                    // which `send_range`'s caller keeps valid until the range is done;
                    // it is, at the earliest, once this chunk has left (`advance`).
                    unsafe { std::slice::from_raw_parts(ptr.add(next as usize), len) }
                };
                Next::Chunk {
                    key,
                    offset: next,
                    bytes,
                }
            }
        };
        Some((*to, next))
    }

    /// What [`Outbox::next`] returned for the `i`th destination left (`sent`) or is
    /// dropped: a whole message goes, a range moves on by one chunk (or goes whole when
    /// dropped). Returns the key of a range that is now over.
    pub(crate) fn advance(&mut self, i: usize, sent: bool) -> Option<u64> {
        let (_, q) = self.queues.get_mut(i)?;
        let over = match q.front_mut()? {
            Item::Whole(_) => None,
            Item::Range {
                key,
                next,
                end,
                chunk,
                ..
            } => {
                *next = (*next + *chunk as u64).min(*end);
                if sent && *next < *end {
                    self.sent += 1;
                    return None;
                }
                Some(*key)
            }
        };
        if sent {
            self.sent += 1;
        }
        self.len -= 1;
        if let Some(Item::Whole(b)) = q.pop_front() {
            if self.spare.len() < 16 {
                self.spare.push(b);
            }
        }
        over
    }

    /// Drops every range not yet sent whole whose key `which` selects; returns
    /// (destination, key) of each (their memory is no longer read, and the protocol
    /// hears of none of them through `range_done`).
    pub(crate) fn drop_ranges(&mut self, which: impl Fn(u64) -> bool) -> Vec<(Source, u64)> {
        let mut dropped = Vec::new();
        for (to, q) in &mut self.queues {
            q.retain(|item| match item {
                Item::Whole(_) => true,
                Item::Range { key, .. } if which(*key) => {
                    dropped.push((*to, *key));
                    false
                }
                Item::Range { .. } => true,
            });
        }
        self.len -= dropped.len();
        self.forget_empty();
        dropped
    }

    /// Sends what waits, in order per destination, through `send(to, head, body)`:
    /// `Ok(true)` it left, `Ok(false)` the destination has no room now (it waits, the
    /// others go on), `Err` it cannot be sent at all (dropped, a range then ends as not
    /// complete, and the error goes to `failed`). A range's chunks go behind the header
    /// the protocol writes; the protocol hears of every range that ended. The one
    /// sending loop of every driver of a protocol (the station, the offload engine).
    pub(crate) fn flush<E>(
        &mut self,
        protocol: &mut (impl Protocol + ?Sized),
        mut send: impl FnMut(Source, &[u8], &[u8]) -> Result<bool, E>,
        mut failed: impl FnMut(E),
    ) {
        if self.is_empty() {
            return;
        }
        let mut head = Vec::new();
        let mut over = Vec::new();
        for i in 0..self.destinations() {
            while let Some((to, next)) = self.next(i) {
                let sent = match next {
                    Next::Whole(bytes) => send(to, &[], bytes),
                    Next::Chunk { key, offset, bytes } => {
                        head.clear();
                        protocol.range_header(key, offset, bytes.len(), &mut head);
                        send(to, &head, bytes)
                    }
                };
                let ended = match sent {
                    Ok(true) => self.advance(i, true).map(|key| (to, key, true)),
                    Ok(false) => break,
                    Err(e) => {
                        failed(e);
                        self.advance(i, false).map(|key| (to, key, false))
                    }
                };
                over.extend(ended);
            }
        }
        self.forget_empty();
        for (to, key, complete) in over {
            protocol.range_done(to, key, complete, self);
        }
    }

    /// Forgets the queues of destinations nothing waits for.
    pub(crate) fn forget_empty(&mut self) {
        self.queues.retain(|(_, q)| !q.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: u32) -> Source {
        Source { rank, dpid: 1 }
    }

    /// Sends everything the outbox holds as [`Station::send_outbox`] does, except that
    /// destinations in `full` take nothing; returns (destination, bytes) in the order
    /// they left and the ranges that ended.
    ///
    /// [`Station::send_outbox`]: super::super::station::Station
    fn flush(out: &mut Outbox, full: &[u32]) -> (Vec<(u32, Vec<u8>)>, Vec<u64>) {
        let (mut left, mut over) = (Vec::new(), Vec::new());
        for i in 0..out.destinations() {
            while let Some((to, next)) = out.next(i) {
                if full.contains(&to.rank) {
                    break;
                }
                let bytes = match next {
                    Next::Whole(b) => b.to_vec(),
                    Next::Chunk { key, offset, bytes } => {
                        let mut v = vec![key as u8, offset as u8];
                        v.extend_from_slice(bytes);
                        v
                    }
                };
                left.push((to.rank, bytes));
                over.extend(out.advance(i, true));
            }
        }
        out.forget_empty();
        (left, over)
    }

    #[test]
    fn the_outbox_keeps_order_per_destination_and_its_bound() {
        let mut out = Outbox::new(3);
        out.send(peer(1), b"a", b"1").unwrap();
        out.send(peer(2), b"", b"b2").unwrap();
        out.send(peer(1), b"c", b"3").unwrap();
        assert_eq!(
            out.send(peer(3), b"d", b""),
            Err(OutboxFull { capacity: 3 })
        );
        assert!(out.is_full() && out.has_queued_for(peer(1)) && !out.has_queued_for(peer(3)));
        // Peer 1 has no room: peer 2's message still leaves, peer 1's wait in order.
        let (left, over) = flush(&mut out, &[1]);
        assert_eq!(left, vec![(2, b"b2".to_vec())]);
        assert!(over.is_empty());
        assert_eq!((out.len(), out.sent()), (2, 1));
        assert!(!out.has_queued_for(peer(2)));
        out.send(peer(3), b"d", b"4").unwrap();
        let (left, _) = flush(&mut out, &[]);
        assert_eq!(
            left,
            vec![
                (1, b"a1".to_vec()),
                (1, b"c3".to_vec()),
                (3, b"d4".to_vec())
            ]
        );
        assert!(out.is_empty() && out.destinations() == 0 && out.sent() == 4);
    }

    #[test]
    fn a_range_leaves_in_chunks_from_its_memory_and_ends_once() {
        let memory: Vec<u8> = (0..10).collect();
        let mut out = Outbox::new(4);
        // SAFETY: `memory` outlives the outbox's use of it (flushed below).
        unsafe {
            out.send_range(peer(1), 7, memory.as_ptr(), 2, 9, 3)
                .unwrap();
            out.send_range(peer(1), 8, memory.as_ptr(), 5, 5, 3)
                .unwrap();
        }
        out.send(peer(1), b"after", b"").unwrap();
        let (left, over) = flush(&mut out, &[]);
        assert_eq!(
            left,
            vec![
                (1, vec![7, 2, 2, 3, 4]),
                (1, vec![7, 5, 5, 6, 7]),
                (1, vec![7, 8, 8]),
                (1, vec![8, 5]),
                (1, b"after".to_vec()),
            ]
        );
        assert_eq!(over, vec![7, 8]);
        assert!(out.is_empty());
        // A range dropped half-way ends at once, whole.
        // SAFETY: as above.
        unsafe {
            out.send_range(peer(2), 9, memory.as_ptr(), 0, 10, 4)
                .unwrap()
        };
        assert!(matches!(
            out.next(0),
            Some((_, Next::Chunk { offset: 0, .. }))
        ));
        assert_eq!(out.advance(0, true), None);
        assert_eq!(out.advance(0, false), Some(9));
        assert!(out.is_empty() && out.next(0).is_none());
    }

    /// Ranges dropped by key (an operation abandoned half-way) leave nothing more of
    /// their memory; the other ranges and whole messages stay in order.
    #[test]
    fn dropped_ranges_read_nothing_more() {
        let memory: Vec<u8> = (0..10).collect();
        let mut out = Outbox::new(8);
        // SAFETY: `memory` outlives the outbox's use of it (flushed or dropped below).
        unsafe {
            out.send_range(peer(1), 7, memory.as_ptr(), 0, 10, 4)
                .unwrap();
            out.send_range(peer(2), 8, memory.as_ptr(), 0, 2, 4)
                .unwrap();
        }
        out.send(peer(1), b"after", b"").unwrap();
        // The first chunk of range 7 has left.
        assert!(matches!(out.next(0), Some((_, Next::Chunk { key: 7, .. }))));
        assert_eq!(out.advance(0, true), None);
        assert_eq!(out.drop_ranges(|key| key == 7), vec![(peer(1), 7)]);
        let (left, over) = flush(&mut out, &[]);
        assert_eq!(left, vec![(1, b"after".to_vec()), (2, vec![8, 0, 0, 1])]);
        assert_eq!(
            over,
            vec![8],
            "a dropped range does not end through range_done"
        );
        assert!(out.is_empty());
    }
}
