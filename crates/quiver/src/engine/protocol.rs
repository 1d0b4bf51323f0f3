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
//! The time is the station's clock (its zero when the station opened), not the one of
//! the channels' timers.
//!
//! A message is lent for the call only (it is read in place, in a shared-memory ring or a
//! link's slot, and released when the call returns) unless the protocol says
//! [`Disposition::Deliver`]: then it goes on to the personality's own reader, as a
//! Directed Point message would.
//!
//! Today the station drives a protocol from the application thread, inside the
//! personality's calls. With the offload engine, a protocol that is `Send` is to move to
//! the engine's thread, which is what lets a peer be served while its application
//! computes (`docs/DESIGN-NOTES.md`, "The protocol hook").

// The hook has no production user yet: tagged's Push-Pull moves onto it next (issue 27,
// stage C1); until then only the simulator's tests drive a protocol.
#![cfg_attr(not(test), allow(dead_code))]

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

    /// The time [`poll_timeout`](Self::poll_timeout) asked for has come.
    fn handle_timeout(&mut self, _now: Time, _out: &mut Outbox) {}

    /// When the protocol wants [`handle_timeout`](Self::handle_timeout) called; `None`:
    /// never.
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

/// Messages a protocol sends, queued until a route takes them: a handler never waits for
/// a peer (a full ring or a closed window keeps the message here, and the engine tries
/// again on its next round). Bounded: a protocol that queues more than `capacity`
/// messages gets [`OutboxFull`] and must hold back (or fail the operation).
pub(crate) struct Outbox {
    queue: VecDeque<(Source, Vec<u8>)>,
    capacity: usize,
    /// Buffers of messages sent, for the next ones.
    spare: Vec<Vec<u8>>,
}

/// The outbox already holds its capacity of messages.
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
    /// An empty outbox that holds at most `capacity` messages.
    pub(crate) fn new(capacity: usize) -> Outbox {
        Outbox {
            queue: VecDeque::new(),
            capacity: capacity.max(1),
            spare: Vec::new(),
        }
    }

    /// Queues the message `head` followed by `body` to endpoint `to`.
    pub(crate) fn send(&mut self, to: Source, head: &[u8], body: &[u8]) -> Result<(), OutboxFull> {
        if self.queue.len() >= self.capacity {
            return Err(OutboxFull {
                capacity: self.capacity,
            });
        }
        let mut bytes = self.spare.pop().unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(head);
        bytes.extend_from_slice(body);
        self.queue.push_back((to, bytes));
        Ok(())
    }

    /// Messages waiting for a route.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether the outbox holds its capacity (the engine hands the protocol no more
    /// messages until some leave).
    pub(crate) fn is_full(&self) -> bool {
        self.queue.len() >= self.capacity
    }

    /// The oldest message, which the engine tries to send first (messages to one peer
    /// leave in the order they were queued).
    pub(crate) fn front(&self) -> Option<(Source, &[u8])> {
        self.queue.front().map(|(to, b)| (*to, b.as_slice()))
    }

    /// The oldest message left: its buffer is kept for a later one.
    pub(crate) fn pop_sent(&mut self) {
        if let Some((_, b)) = self.queue.pop_front() {
            if self.spare.len() < 16 {
                self.spare.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: u32) -> Source {
        Source { rank, dpid: 1 }
    }

    #[test]
    fn the_outbox_keeps_order_and_its_bound() {
        let mut out = Outbox::new(2);
        out.send(peer(1), b"a", b"1").unwrap();
        out.send(peer(2), b"", b"b2").unwrap();
        assert_eq!(
            out.send(peer(3), b"c", b""),
            Err(OutboxFull { capacity: 2 })
        );
        assert_eq!(out.len(), 2);
        assert!(out.is_full());
        assert_eq!(out.front(), Some((peer(1), &b"a1"[..])));
        out.pop_sent();
        assert_eq!(out.front(), Some((peer(2), &b"b2"[..])));
        out.send(peer(3), b"c", b"3").unwrap();
        out.pop_sent();
        assert_eq!(out.front(), Some((peer(3), &b"c3"[..])));
        out.pop_sent();
        assert!(out.is_empty() && out.front().is_none());
        out.pop_sent();
        assert!(out.is_empty());
    }
}
