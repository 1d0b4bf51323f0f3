//! The port table of one process and the protocol that delivers into it (sans-IO).
//!
//! What it owns: for each of the 256 ports its binding (destination with the header
//! computed once, receive buffer, receiver handler, error handler), its semaphore (the
//! signals not yet waited for) and the length of the last message delivered into its
//! buffer; the port errors no error handler took; the counters.
//!
//! What it guarantees: an arriving message is written into the port's bound buffer and
//! nowhere else, only when it fits; then the receiver handler runs (or, without one, the
//! port is signalled). A message for a port without a buffer, longer than its buffer, or
//! for the reserved port goes to the port's error handler as a [`PortError`], or, without
//! one, waits in [`Table::errors`] for the application's next call: nothing is dropped
//! silently. A malformed message is counted and dropped. [`Handler`] runs on the engine's
//! protocol hook and does no I/O: the simulator runs it as it is.

use super::deposit::MailboxArea;
use super::mailbox::Tag;
use super::tree;
use super::wire::{Deposited, Header, Indirect, Piece, Release, FLUSH_RELEASES, HEADER_LEN};
use super::{Buffer, Delivery, Origin, PortError, PortStats, PORT_COUNT, RESERVED_PORT};
use crate::addr::Source;
use crate::channel::reliable::Time;
use crate::engine::protocol::{Disposition, Outbox, Protocol};
use std::cell::{RefCell, RefMut};
use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

/// A receiver handler: runs once per message delivered into the port's buffer.
pub(super) type ReceiverFn = Box<dyn FnMut(&mut Delivery<'_>) + Send>;
/// An error handler: runs once per error of the port.
pub(super) type ErrorFn = Box<dyn FnMut(PortError) + Send>;

/// Where a port sends.
#[derive(Debug, Clone, Copy)]
pub(super) enum Bound {
    /// One process.
    One {
        /// The destination endpoint.
        to: Source,
        /// The header of every message sent through the port (computed when bound).
        head: [u8; HEADER_LEN],
        /// The engine's route to `to`.
        route: usize,
        /// `to` is on this node and has mailboxes: a long message may go straight into
        /// its buffer ([`super::app::App::try_deposit`]).
        deposit: bool,
        /// The payload of one frame of `route`, a network channel: a longer message goes
        /// in pieces of it ([`super::app::App::send_one`]); `None` for other routes.
        frame: Option<usize>,
    },
    /// Every other process of the job, port `head`'s destination port of each: down
    /// the binomial tree rooted at this process (`tree`), or, where the link
    /// broadcasts, to all at once ([`Table::native_unicast`]).
    All {
        /// The header of every message sent through the port, naming this process as
        /// the root.
        head: [u8; HEADER_LEN],
    },
}

impl Bound {
    /// Whether sends through the port reach `rank` (directly or down the tree).
    pub(super) fn reaches(&self, rank: u32) -> bool {
        match self {
            Bound::One { to, .. } => to.rank == rank,
            Bound::All { .. } => true,
        }
    }
}

/// One port.
#[derive(Default)]
pub(super) struct Slot {
    pub dest: Option<Bound>,
    pub buffer: Option<Buffer>,
    /// The port's mailbox offers the buffer to this node's senders (`mailbox`): nothing
    /// here reads or writes it until it is taken back ([`Table::hold`]).
    pub armed: bool,
    /// The last message delivered was shorter than [`super::DEPOSIT_MIN`]: the port is
    /// not armed (arming and taking back cost two atomic operations per message, for
    /// messages that are copied anyway) until a long one arrives by copy.
    pub small: bool,
    /// Bytes of the last message delivered into `buffer`.
    pub last_len: usize,
    /// Who sent it.
    pub last_from: Option<Origin>,
    pub handler: Option<ReceiverFn>,
    pub on_error: Option<ErrorFn>,
    /// Signals not yet consumed by a wait.
    pub signals: u64,
}

impl Slot {
    /// The buffer changed: what it held is no longer the last message delivered.
    pub(super) fn forget_last(&mut self) {
        self.last_len = 0;
        self.last_from = None;
    }
}

/// The ports of one process.
pub(super) struct Table {
    /// This process's rank, the job's size and the ports' DPID (every rank's): where
    /// broadcasts are forwarded.
    pub rank: u32,
    pub size: u32,
    pub dpid: u16,
    pub slots: Vec<Slot>,
    /// With the link's own broadcast (the engine's group channel): the ranks a
    /// broadcast reaches by unicast beside the one group message that reaches the
    /// others (this node's, over shared memory, and any whose link joined no group).
    /// `None`: broadcasts go down the tree.
    pub native_unicast: Option<Vec<u32>>,
    /// Of them, this node's ranks: a large broadcast reaches them through the
    /// broadcast ring ([`Ring`]), one copy written for all.
    pub native_local: Vec<u32>,
    /// With [`Table::native_unicast`]: whether the engine's group channel reaches the
    /// other nodes (without it, every other rank is on this node).
    pub native_group: bool,
    /// The places of this rank's broadcast ring its node's ranks have not given back.
    pub ring: Ring,
    /// What this rank copied out of other ranks' rings and has not given back yet.
    pub copied: Vec<Copied>,
    /// Port errors that found no error handler, for the application's next call.
    pub errors: VecDeque<PortError>,
    pub stats: PortStats,
    /// This rank's mailboxes, where this node's senders find the buffers armed for them
    /// (the direct deposit); `None` without (the offload engine, the simulator).
    pub mailboxes: Option<MailboxArea>,
    /// The generation of the last arming.
    generation: u32,
    /// The ports are closing: nothing is armed any more.
    closing: bool,
    /// Messages held aside, in arrival order: one for a port whose buffer a sender of
    /// the node holds, and every later one from the same sender (its order), until
    /// that buffer is delivered or taken back ([`Table::drain_parked`]).
    parked: VecDeque<Parked>,
    /// Messages arriving in pieces, at most one per sender (a sender sends one such
    /// message at a time).
    landings: Vec<Landing>,
    /// Pieces taken in that completed no message (the fuzz target's accounting).
    partial_pieces: u64,
    /// Messages set aside so far (numbers them: `Parked::seq`).
    parked_count: u64,
}

/// A message from another node arriving in pieces of one frame each
/// ([`super::wire::Piece`]).
struct Landing {
    /// The rank whose channel brings the pieces.
    via: u32,
    port: u8,
    from: Origin,
    total: usize,
    /// The offset the next piece must have.
    next: usize,
    into: Into,
    /// Its number among what is set aside ([`Table::parked_count`] when its first
    /// piece came).
    parked_at: u64,
}

/// Where a [`Landing`]'s pieces go.
enum Into {
    /// Straight into the port's buffer, which it holds ([`Table::landing_on`]).
    Buffer,
    /// Aside, to be delivered whole once complete (the buffer was busy when the first
    /// piece came: another message was being written into it, or messages waited).
    Aside(Vec<u8>),
    /// Nowhere: its port could not take it, which was reported at its first piece.
    Nowhere,
}

/// A message held aside ([`Table::parked`]).
struct Parked {
    /// The rank whose channel brought it (whose order it keeps).
    via: u32,
    /// When it was set aside ([`Table::parked_count`] then): tells what a sender sent
    /// before a message of its that came in pieces from what it sent after.
    seq: u64,
    port: u8,
    from: Origin,
    msg: Vec<u8>,
}

impl Table {
    /// The table of rank `rank` of a job of `size` ranks, with the ports on DPID `dpid`.
    pub(super) fn new(rank: u32, size: u32, dpid: u16) -> Table {
        Table {
            rank,
            size,
            dpid,
            slots: (0..PORT_COUNT).map(|_| Slot::default()).collect(),
            native_unicast: None,
            native_local: Vec::new(),
            native_group: false,
            ring: Ring::default(),
            copied: Vec::new(),
            errors: VecDeque::new(),
            stats: PortStats::default(),
            mailboxes: None,
            generation: 0,
            closing: false,
            parked: VecDeque::new(),
            landings: Vec::new(),
            partial_pieces: 0,
            parked_count: 0,
        }
    }

    /// Offers `port`'s buffer to this node's senders, when it is a shared one and
    /// nothing waits to be delivered into it first.
    #[inline]
    pub(super) fn arm(&mut self, port: u8) {
        // Every wait and every long message asks: most are answered here.
        let slot = &self.slots[usize::from(port)];
        if slot.armed || slot.small || self.mailboxes.is_none() {
            return;
        }
        self.arm_now(port);
    }

    /// [`Table::arm`] of a port that is not armed and last had a long message.
    #[inline(never)]
    fn arm_now(&mut self, port: u8) {
        let Some(area) = &self.mailboxes else {
            return;
        };
        if !self.parked.is_empty() || port == RESERVED_PORT || self.closing || self.landing_on(port)
        {
            return;
        }
        let slot = &mut self.slots[usize::from(port)];
        let Some(Buffer::Shared(b)) = &slot.buffer else {
            return;
        };
        self.generation = self.generation.wrapping_add(1);
        slot.armed = area.port(port).arm(self.generation, b.id(), b.len() as u64);
    }

    /// Takes `port`'s buffer back from the node's senders before the table writes or
    /// shows it. False while a sender holds it (its message is in the buffer or on the
    /// way, and its notice comes next in that sender's ring), and while a message from
    /// another node is being written into it piece by piece.
    pub(super) fn hold(&mut self, port: u8) -> bool {
        if self.landing_on(port) {
            // A message from another node is half written into it: its pieces first.
            return false;
        }
        let slot = &mut self.slots[usize::from(port)];
        if !slot.armed {
            return true;
        }
        let Some(area) = &self.mailboxes else {
            slot.armed = false;
            return true;
        };
        match area.port(port).disarm(false).tag {
            Tag::Claimed | Tag::Deposited => false,
            _ => {
                slot.armed = false;
                true
            }
        }
    }

    /// Who holds `port`'s buffer now (`CLAIMED` or `DEPOSITED`), if a sender does.
    pub(super) fn holder(&self, port: u8) -> Option<super::mailbox::State> {
        let area = self.mailboxes.as_ref()?;
        let s = area.port(port).state();
        (self.slots[usize::from(port)].armed && matches!(s.tag, Tag::Claimed | Tag::Deposited))
            .then_some(s)
    }

    /// Takes `port`'s buffer back from the holder of `s` (it stopped, or is no sender):
    /// its message, if its notice comes later, is refused as malformed; what waited
    /// moves on.
    pub(super) fn take_back(&mut self, port: u8, s: super::mailbox::State, out: &mut Outbox) {
        if let Some(area) = &self.mailboxes {
            if area.port(port).revoke(s) {
                self.slots[usize::from(port)].armed = false;
                self.drain_parked(out);
            }
        }
    }

    /// `rank`'s process died: a claim it held on a buffer of this rank is taken back
    /// (its message is lost with it, as one it had not sent), and what waited moves on.
    /// A deposit it finished stays: its notice is in the ring, which is read still.
    pub(super) fn revoke_claims(&mut self, rank: u32, out: &mut Outbox) -> bool {
        for port in 0..RESERVED_PORT {
            let Some(area) = &self.mailboxes else {
                break;
            };
            let m = area.port(port);
            let s = m.state();
            if self.slots[usize::from(port)].armed
                && s.tag == Tag::Claimed
                && s.claimant == rank
                && m.revoke(s)
            {
                self.slots[usize::from(port)].armed = false;
            }
        }
        self.drain_parked(out)
    }

    /// Whether messages are held aside.
    pub(super) fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// Delivers what was held aside and may go now, in order: a message waits while its
    /// port's buffer is held by a sender, and so does every later one of its sender.
    /// Whether a port was signalled or an error reported.
    pub(super) fn drain_parked(&mut self, out: &mut Outbox) -> bool {
        let mut woke = false;
        let mut kept = VecDeque::new();
        let mut blocked: Vec<u32> = Vec::new();
        while let Some(p) = self.parked.pop_front() {
            let landing = self.landings.iter().any(|l| l.via == p.via);
            if landing || blocked.contains(&p.via) || !self.hold(p.port) {
                blocked.push(p.via);
                kept.push_back(p);
                continue;
            }
            let fill = |buf: &mut [u8]| {
                crate::link::copy_into(buf, &p.msg);
                true
            };
            woke |= self.deliver_held(p.port, p.from, p.msg.len(), fill, out);
        }
        self.parked = kept;
        if self.parked.is_empty() {
            if let Some(area) = &self.mailboxes {
                area.set_parking(false);
            }
            for port in 0..RESERVED_PORT {
                self.arm_after_handler(port);
            }
        }
        woke
    }

    /// Closes the mailboxes: no sender claims a buffer any more, and none is armed
    /// again. The ports whose buffers a sender still holds (its notice not yet read).
    pub(super) fn close_mailboxes(&mut self) -> Vec<u8> {
        self.closing = true;
        let Some(area) = &self.mailboxes else {
            return Vec::new();
        };
        let mut busy = Vec::new();
        for port in 0..=RESERVED_PORT {
            match area.port(port).disarm(true).tag {
                Tag::Claimed | Tag::Deposited => busy.push(port),
                _ => self.slots[usize::from(port)].armed = false,
            }
        }
        busy
    }

    /// Where a broadcast of this rank goes: natively, the group (where there is one) and
    /// the ranks it does not reach; else this rank's children in its tree.
    pub(super) fn broadcast_targets(&self) -> Vec<Source> {
        let at = |rank| Source {
            rank,
            dpid: self.dpid,
        };
        match &self.native_unicast {
            Some(unicast) => self
                .native_group
                .then(|| Source::group(self.dpid))
                .into_iter()
                .chain(unicast.iter().map(|&r| at(r)))
                .collect(),
            None => tree::children(self.rank, self.rank, self.size)
                .map(at)
                .collect(),
        }
    }

    /// Hands `e` to its port's error handler, or keeps it for the application's next
    /// call.
    pub(super) fn report(&mut self, e: PortError) {
        if let Err(e) = self.notify(e) {
            self.errors.push_back(e);
        }
    }

    /// Hands `e` to its port's error handler; gives it back when the port has none.
    pub(super) fn notify(&mut self, e: PortError) -> Result<(), PortError> {
        self.stats.errors += 1;
        match self.slots[usize::from(e.port())].on_error.as_mut() {
            Some(f) => {
                f(e);
                Ok(())
            }
            None => Err(e),
        }
    }

    /// This rank is done with `place` of `root`'s ring: the release to send, once enough
    /// is copied ([`RELEASE_BYTES`]), covering every place before it.
    fn note_copied(&mut self, root: u32, place: Indirect) -> Option<Release> {
        let i = match self.copied.iter().position(|c| c.root == root) {
            Some(i) => i,
            None => {
                self.copied.push(Copied {
                    root,
                    id: place.id,
                    offset: 0,
                    bytes: 0,
                    places: 0,
                });
                self.copied.len() - 1
            }
        };
        let c = &mut self.copied[i];
        if c.id != place.id {
            // The root's ring is another one now (it closed its ports and opened new
            // ones): what was copied from the old one is nobody's to free.
            c.bytes = 0;
            c.places = 0;
            c.id = place.id;
        }
        c.offset = place.offset;
        c.bytes += u64::from(place.len);
        c.places += 1;
        if c.bytes < RELEASE_BYTES && c.places < RELEASE_PLACES {
            return None;
        }
        c.bytes = 0;
        c.places = 0;
        Some(Release {
            id: c.id,
            offset: c.offset,
        })
    }

    /// Everything this rank copied from other ranks' rings and has not given back: the
    /// releases that give it back now, by root (this rank is closing).
    pub(super) fn flush_all_copied(&mut self) -> Vec<(u32, Release)> {
        let all: Vec<(u32, u32)> = self
            .copied
            .iter()
            .filter(|c| c.places > 0)
            .map(|c| (c.root, c.id))
            .collect();
        all.into_iter()
            .filter_map(|(root, id)| Some((root, self.flush_copied(root, id)?)))
            .collect()
    }

    /// What this rank copied from ring `id` of `root` and has not given back: the
    /// release that gives it back now (a root closing asks for it).
    fn flush_copied(&mut self, root: u32, id: u32) -> Option<Release> {
        let c = self
            .copied
            .iter_mut()
            .find(|c| c.root == root && c.id == id && c.places > 0)?;
        c.bytes = 0;
        c.places = 0;
        Some(Release {
            id,
            offset: c.offset,
        })
    }

    /// Delivers the payload of a message for `port` from `from`, brought by `via`'s
    /// channel: into the bound buffer, then the handler (or a signal). Returns whether
    /// the port was signalled or an error was reported (something the application may
    /// wait for).
    #[inline]
    fn deliver(
        &mut self,
        via: u32,
        port: u8,
        from: Origin,
        payload: &[u8],
        out: &mut Outbox,
    ) -> bool {
        let fill = |buf: &mut [u8]| {
            crate::link::copy_into(buf, payload);
            true
        };
        self.deliver_with(via, port, from, payload.len(), fill, out)
    }

    /// [`Table::deliver`] of a message of `len` bytes that `fill` writes into the
    /// port's buffer (the first `len` bytes of what it is given), brought by `via`'s
    /// channel; false from `fill` (it could not, and wrote nothing) drops the message,
    /// counted malformed.
    #[inline(always)]
    fn deliver_with(
        &mut self,
        via: u32,
        port: u8,
        from: Origin,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
        out: &mut Outbox,
    ) -> bool {
        if port == RESERVED_PORT {
            self.report(PortError::Reserved { port, from, len });
            return true;
        }
        // Nearly always: nothing armed, set aside or landing in pieces (kept out of line,
        // so that this path stays inlined).
        if self.slots[usize::from(port)].armed
            || !self.parked.is_empty()
            || !self.landings.is_empty()
        {
            return self.deliver_contended(via, port, from, len, fill, out);
        }
        self.deliver_now(port, from, len, fill, out)
    }

    /// [`Table::deliver_with`] into a port that nothing else may be writing.
    #[inline(always)]
    fn deliver_now(
        &mut self,
        port: u8,
        from: Origin,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
        out: &mut Outbox,
    ) -> bool {
        let woke = self.deliver_held(port, from, len, fill, out);
        if len >= super::DEPOSIT_MIN {
            // A long message came by copy: the next may come straight (after a short
            // one the port stays unarmed, `Slot::small`).
            self.arm_after_handler(port);
        }
        woke
    }

    /// [`Table::deliver_with`] when the port is armed, or messages are set aside or
    /// landing in pieces: the message waits if it must.
    #[cold]
    #[inline(never)]
    fn deliver_contended(
        &mut self,
        via: u32,
        port: u8,
        from: Origin,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
        out: &mut Outbox,
    ) -> bool {
        let mut woke = false;
        if !self.parked.is_empty() {
            woke |= self.drain_parked(out);
        }
        // A message of this sender landing in pieces came first: this one waits for it.
        let landing = self.landings.iter().any(|l| l.via == via);
        let behind = landing || self.parked.iter().any(|p| p.via == via);
        let fits = self.slots[usize::from(port)]
            .buffer
            .as_ref()
            .is_some_and(|b| len <= b.len());
        if fits && (behind || !self.hold(port)) {
            // A sender of the node holds the buffer, a message from another node is
            // landing in it, or this sender has a message waiting: this one waits too,
            // in order. Senders see the flag (raised before this message's slot is
            // released) and deposit nothing more until the waiting is over, so no
            // sender's notice waits behind one of its own messages.
            let mut held = vec![0; len];
            if !fill(&mut held) {
                self.stats.malformed += 1;
                return woke;
            }
            if let Some(area) = &self.mailboxes {
                area.set_parking(true);
            }
            self.parked.push_back(Parked {
                via,
                seq: self.parked_count,
                port,
                from,
                msg: held,
            });
            self.parked_count += 1;
            self.stats.parked += 1;
            return woke;
        }
        // (A message that cannot fit is reported now: it needs no buffer.)
        woke | self.deliver_now(port, from, len, fill, out)
    }

    /// Takes one piece of a message from `via` (a rank of another node): at offset 0
    /// it starts the message, straight into the port's buffer when that is free
    /// (nothing waits to be delivered, no other message is being written into it, no
    /// sender of the node holds it), aside otherwise; a port that cannot take the
    /// message (reserved, no buffer, too short) hears of it at once and the rest of the
    /// message is dropped. The piece that completes the message delivers it. A piece
    /// out of order or of a message never started is malformed and ends that message
    /// (no sender does that: it sends one such message at a time, its pieces in order);
    /// a new start while this sender's message is incomplete gives that one up (its
    /// sender's send failed half-way) and starts the new one.
    fn take_piece(&mut self, via: u32, p: Piece, bytes: &[u8], out: &mut Outbox) -> bool {
        let from = Origin {
            rank: via,
            port: p.src_port,
        };
        let (offset, total) = (p.offset as usize, p.total as usize);
        let mut woke = false;
        let i = match self.landings.iter().position(|l| l.via == via) {
            Some(i) if offset == 0 => {
                // A sender that gave its message up half-way (its send failed) starts
                // the next: the half message is no message (its pieces were counted),
                // the new one starts.
                woke |= self.abandon(i, out);
                None
            }
            Some(i) => {
                let l = &self.landings[i];
                if l.port != p.dest_port || l.next != offset || l.total != total {
                    self.stats.malformed += 1;
                    return self.abandon(i, out);
                }
                Some(i)
            }
            None if offset != 0 => {
                self.stats.malformed += 1;
                return false;
            }
            None => None,
        };
        let i = match i {
            Some(i) => i,
            // An empty message: delivered as a whole one (it needs no buffer).
            None if total == 0 => return woke | self.deliver(via, p.dest_port, from, &[], out),
            None => {
                let port = p.dest_port;
                let slot = &self.slots[usize::from(port)];
                let into = if port == RESERVED_PORT {
                    self.report(PortError::Reserved {
                        port,
                        from,
                        len: total,
                    });
                    woke = true;
                    Into::Nowhere
                } else {
                    match slot.buffer.as_ref().map(|b| b.len()) {
                        None => {
                            self.report(PortError::NoBuffer {
                                port,
                                from,
                                len: total,
                            });
                            woke = true;
                            Into::Nowhere
                        }
                        Some(capacity) if capacity < total => {
                            let e = PortError::Overflow {
                                port,
                                from,
                                len: total,
                                capacity,
                            };
                            self.report(e);
                            woke = true;
                            Into::Nowhere
                        }
                        Some(_) if self.landing_on(port) || !self.parked.is_empty() => {
                            Into::Aside(Vec::with_capacity(total))
                        }
                        Some(_) if !self.hold(port) => Into::Aside(Vec::with_capacity(total)),
                        // The buffer is this message's until its last piece
                        // (`landing_on`).
                        Some(_) => Into::Buffer,
                    }
                };
                self.landings.push(Landing {
                    via,
                    port,
                    from,
                    total,
                    next: 0,
                    into,
                    parked_at: self.parked_count,
                });
                // Its own number: what is set aside after its start numbers above it.
                self.parked_count += 1;
                return woke | self.write_piece(self.landings.len() - 1, bytes, true, out);
            }
        };
        woke | self.write_piece(i, bytes, false, out)
    }

    /// Writes the next piece of landing `i` where it goes (`first`: its first), and
    /// delivers the message when that was its last.
    fn write_piece(&mut self, i: usize, bytes: &[u8], first: bool, out: &mut Outbox) -> bool {
        let l = &mut self.landings[i];
        // A first piece its port refused counts as the error reported.
        let counted = first && matches!(l.into, Into::Nowhere);
        let at = l.next;
        l.next += bytes.len();
        match &mut l.into {
            Into::Buffer => {
                // The port keeps its buffer while the message lands (held); were it gone
                // or shorter, the message is given up rather than written elsewhere.
                let place = self.slots[usize::from(l.port)]
                    .buffer
                    .as_mut()
                    .and_then(|b| b.get_mut(at..at + bytes.len()));
                match place {
                    Some(place) => crate::link::copy_into(place, bytes),
                    None => {
                        self.stats.malformed += 1;
                        return self.abandon(i, out);
                    }
                }
            }
            Into::Aside(v) => v.extend_from_slice(bytes),
            Into::Nowhere => {}
        }
        if l.next < l.total {
            self.partial_pieces += u64::from(!counted);
            return false;
        }
        // The last piece: the message is complete.
        let l = self.landings.swap_remove(i);
        let mut woke = false;
        match l.into {
            Into::Buffer => {
                self.stats.landed += 1;
                woke |= self.deliver_held(l.port, l.from, l.total, |_| true, out);
                if l.total >= super::DEPOSIT_MIN {
                    self.arm_after_handler(l.port);
                }
                if !self.parked.is_empty() {
                    woke |= self.drain_parked(out);
                }
            }
            Into::Aside(v) => {
                // In its sender's order: after what it set aside before this message
                // began, before what it sent while the pieces came.
                let after = self
                    .parked
                    .iter()
                    .position(|p| p.via == l.via && p.seq > l.parked_at);
                let before = self.parked.iter().any(|p| p.via == l.via);
                let aside = Parked {
                    via: l.via,
                    seq: l.parked_at,
                    port: l.port,
                    from: l.from,
                    msg: v,
                };
                match (after, before) {
                    (Some(at), _) => self.parked.insert(at, aside),
                    (None, true) => self.parked.push_back(aside),
                    (None, false) => {
                        woke |= self.deliver(l.via, l.port, l.from, &aside.msg, out);
                        return woke;
                    }
                }
                self.stats.parked += 1;
                woke |= self.drain_parked(out);
            }
            Into::Nowhere => {
                self.partial_pieces += u64::from(!counted);
                // What its sender sent meanwhile waited behind it.
                if !self.parked.is_empty() {
                    woke |= self.drain_parked(out);
                }
            }
        }
        woke
    }

    /// Gives up landing `i` (its sender failed, or lied): what it wrote into its
    /// port's buffer is no message (the buffer shows none until the next), and what
    /// waited for that buffer moves on.
    fn abandon(&mut self, i: usize, out: &mut Outbox) -> bool {
        let l = self.landings.swap_remove(i);
        if let Into::Buffer = l.into {
            self.slots[usize::from(l.port)].forget_last();
            self.arm_after_handler(l.port);
        }
        // What waited for the buffer, or behind this sender's message, moves on.
        if !self.parked.is_empty() {
            return self.drain_parked(out);
        }
        false
    }

    /// Which landing writes into `port`'s buffer, if one does.
    fn buffer_landing(&self, port: u8) -> Option<usize> {
        self.landings
            .iter()
            .position(|l| l.port == port && matches!(l.into, Into::Buffer))
    }

    /// Whether a message from another node is being written into `port`'s buffer piece
    /// by piece: nothing else writes or shows the buffer until it is complete.
    #[inline]
    pub(super) fn landing_on(&self, port: u8) -> bool {
        !self.landings.is_empty() && self.buffer_landing(port).is_some()
    }

    /// The sender, number and progress of the message landing in `port`'s buffer, if
    /// one is.
    pub(super) fn landing_in(&self, port: u8) -> Option<(u32, u64, usize)> {
        let l = &self.landings[self.buffer_landing(port)?];
        Some((l.via, l.parked_at, l.next))
    }

    /// Gives up the message landing in `port`'s buffer (its sender went silent): lost,
    /// as one its sender never finished.
    pub(super) fn give_up_landing(&mut self, port: u8, out: &mut Outbox) -> bool {
        match self.buffer_landing(port) {
            Some(i) => self.abandon(i, out),
            None => false,
        }
    }

    /// `rank` failed: the message it was sending in pieces is lost with it.
    pub(super) fn abandon_landings(&mut self, rank: u32, out: &mut Outbox) -> bool {
        match self.landings.iter().position(|l| l.via == rank) {
            Some(i) => self.abandon(i, out),
            None => false,
        }
    }

    /// Re-arms a port with a handler (the handler is done with the message; a port
    /// without one is armed by the next wait).
    fn arm_after_handler(&mut self, port: u8) {
        if self.mailboxes.is_some() && self.slots[usize::from(port)].handler.is_some() {
            self.arm(port);
        }
    }

    /// A sender of the node wrote a message into `d.dest_port`'s buffer: it is
    /// delivered there (the handler runs on it in place), then what waited behind it.
    /// A notice that does not match the mailbox (another claimant, generation or
    /// length, a buffer too short) is malformed and delivers nothing.
    fn deliver_deposit(&mut self, from: Source, d: Deposited, out: &mut Outbox) -> bool {
        let port = d.dest_port;
        let Some(area) = &self.mailboxes else {
            self.stats.malformed += 1;
            return false;
        };
        let m = area.port(port);
        let s = m.state();
        let slot = &self.slots[usize::from(port)];
        let fits = matches!(&slot.buffer, Some(Buffer::Shared(b)) if d.len <= b.len() as u64);
        if port == RESERVED_PORT
            || !slot.armed
            || !fits
            || s.tag != Tag::Deposited
            || s.claimant != from.rank
            || s.generation != d.generation
            || m.length() != d.len
        {
            self.stats.malformed += 1;
            return false;
        }
        self.slots[usize::from(port)].armed = false;
        self.stats.deposited += 1;
        let origin = Origin {
            rank: from.rank,
            port: d.src_port,
        };
        // The bytes are in the buffer already (the claimant wrote them before its
        // release of DEPOSITED, which `state` acquired).
        let mut woke = self.deliver_held(port, origin, d.len as usize, |_| true, out);
        if let Some(area) = &self.mailboxes {
            area.port(port).finish(s);
        }
        if !self.parked.is_empty() {
            woke |= self.drain_parked(out);
        }
        self.arm_after_handler(port);
        woke
    }

    /// [`Table::deliver_with`] into a buffer no sender holds.
    #[inline(always)]
    fn deliver_held(
        &mut self,
        port: u8,
        from: Origin,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
        out: &mut Outbox,
    ) -> bool {
        let slot = &mut self.slots[usize::from(port)];
        slot.small = len < super::DEPOSIT_MIN;
        match slot.buffer.as_mut() {
            _ if len == 0 => {}
            None => {
                self.report(PortError::NoBuffer { port, from, len });
                return true;
            }
            Some(buf) if buf.len() < len => {
                let capacity = buf.len();
                let e = PortError::Overflow {
                    port,
                    from,
                    len,
                    capacity,
                };
                self.report(e);
                return true;
            }
            Some(buf) => {
                if !fill(&mut buf[..len]) {
                    self.stats.malformed += 1;
                    return false;
                }
            }
        }
        slot.last_len = len;
        slot.last_from = Some(from);
        self.stats.delivered += 1;
        self.stats.bytes_delivered += len as u64;
        let Some(mut handler) = slot.handler.take() else {
            slot.signals += 1;
            return true;
        };
        let mut d = Delivery {
            table: self,
            port,
            from,
            len,
            out,
            signalled: false,
            moved: false,
        };
        handler(&mut d);
        let signalled = d.signalled;
        // A handler cannot replace itself (it is not in its slot while it runs), and the
        // table stays borrowed or locked while it runs, so nothing else can bind or
        // unbind the port meanwhile: the slot is empty, and the handler goes back.
        self.slots[usize::from(port)].handler = Some(handler);
        signalled
    }
}

/// A reader gives the places of a root's ring back together, once it has copied this
/// many bytes of them or [`RELEASE_PLACES`] places, so that a root is not woken once
/// per broadcast. Safe from deadlock: a root whose ring is full while every reader has
/// copied everything has less than this held (a reader holds only what it copied last),
/// so with places of at most a quarter of the ring one of the ring's two free runs
/// takes any place.
pub(crate) const RELEASE_BYTES: u64 = (super::app::RING_BYTES / 8) as u64;
/// See [`RELEASE_BYTES`].
pub(crate) const RELEASE_PLACES: u32 = 16;

/// What this rank copied out of one root's ring and has not given back yet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Copied {
    root: u32,
    id: u32,
    /// The last place copied.
    offset: u64,
    bytes: u64,
    places: u32,
}

/// Reads `dst.len()` bytes at `offset` of shared buffer `id` of same-node rank `rank`
/// into `dst` (the application's mapping of its peers' broadcast rings); false, having
/// written nothing, when it cannot (no such buffer, or the range lies outside it).
pub(crate) trait RingReader {
    fn read(&self, rank: u32, id: u32, offset: u64, dst: &mut [u8]) -> bool;
}

/// A rank's broadcast ring, as far as the table keeps it (the memory is the
/// application's): the places handed to this node's ranks and not given back yet, in the
/// order they were taken. A place is reused once every rank it was handed to gave it
/// back (or failed).
#[derive(Debug, Default)]
pub(crate) struct Ring {
    /// The shared buffer's number (0: none yet).
    pub id: u32,
    /// Its size.
    pub capacity: u64,
    places: VecDeque<Place>,
}

#[derive(Debug)]
struct Place {
    offset: u64,
    len: u64,
    /// Ranks that have not given it back.
    holders: Vec<u32>,
}

impl Ring {
    /// A place of `len` bytes for a message to `holders`: after the newest place, or at
    /// the start once the newest reaches the end, never over a place not given back;
    /// `None` when there is no room now.
    pub(crate) fn take(&mut self, len: u64, holders: &[u32]) -> Option<u64> {
        if len == 0 || len > self.capacity || holders.is_empty() {
            return None;
        }
        let free = |at: u64, places: &VecDeque<Place>| {
            at + len <= self.capacity
                && places
                    .iter()
                    .all(|p| at + len <= p.offset || p.offset + p.len <= at)
        };
        let after_newest = self.places.back().map_or(0, |p| p.offset + p.len);
        let at = [after_newest, 0]
            .into_iter()
            .find(|&at| free(at, &self.places))?;
        self.places.push_back(Place {
            offset: at,
            len,
            holders: holders.to_vec(),
        });
        Some(at)
    }

    /// `rank` gave back the place at `offset` and every place it was handed before it
    /// (a rank reads the ring in order); false when it held none at `offset`.
    pub(crate) fn release(&mut self, rank: u32, offset: u64) -> bool {
        let Some(last) = self
            .places
            .iter()
            .position(|p| p.offset == offset && p.holders.contains(&rank))
        else {
            return false;
        };
        for p in self.places.iter_mut().take(last + 1) {
            p.holders.retain(|&h| h != rank);
        }
        self.places.retain(|p| !p.holders.is_empty());
        true
    }

    /// `rank` failed: it gives nothing back any more.
    pub(crate) fn forget(&mut self, rank: u32) {
        for p in &mut self.places {
            p.holders.retain(|&h| h != rank);
        }
        self.places.retain(|p| !p.holders.is_empty());
    }

    /// Places not given back.
    pub(crate) fn taken(&self) -> usize {
        self.places.len()
    }
}

/// Where a process's table lives: in the application's thread only, or shared with the
/// offload engine's thread, which runs the handlers of what arrives over the network
/// (a lock per access then; without the engine, none).
// Not boxed: the local table is on the path of every message, where a pointer chase
// costs more than the space the shared variant wastes.
#[allow(clippy::large_enum_variant)]
pub(super) enum TableCell {
    Local(RefCell<Table>),
    Shared(Arc<Mutex<Table>>),
}

/// The table, borrowed or locked.
pub(super) enum TableRef<'a> {
    Local(RefMut<'a, Table>),
    Shared(MutexGuard<'a, Table>),
}

impl TableCell {
    /// The table, for as long as the guard lives (the engine's thread waits meanwhile).
    #[inline]
    pub(super) fn lock(&self) -> TableRef<'_> {
        match self {
            TableCell::Local(t) => TableRef::Local(t.borrow_mut()),
            // A handler that panicked on the engine's thread poisoned the lock; the table
            // itself is consistent between messages.
            TableCell::Shared(t) => TableRef::Shared(t.lock().unwrap_or_else(|p| p.into_inner())),
        }
    }
}

impl Deref for TableRef<'_> {
    type Target = Table;
    #[inline]
    fn deref(&self) -> &Table {
        match self {
            TableRef::Local(t) => t,
            TableRef::Shared(t) => t,
        }
    }
}

impl DerefMut for TableRef<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Table {
        match self {
            TableRef::Local(t) => t,
            TableRef::Shared(t) => t,
        }
    }
}

/// The ports' protocol on the application's thread: [`Handler`] on the table of `cell`,
/// taken for each message only.
pub(super) struct OnCell<'a> {
    pub cell: &'a TableCell,
    /// As [`Handler::rings`].
    pub rings: Option<&'a dyn RingReader>,
    /// As [`Handler::woke`].
    pub woke: bool,
    /// Messages handled.
    pub handled: u64,
}

impl Protocol for OnCell<'_> {
    fn handle_message(
        &mut self,
        now: Time,
        from: Source,
        msg: &[u8],
        out: &mut Outbox,
    ) -> Disposition {
        let mut table = self.cell.lock();
        let mut handler = Handler {
            table: &mut table,
            rings: self.rings,
            woke: false,
            handled: 0,
        };
        let d = handler.handle_message(now, from, msg, out);
        self.woke |= handler.woke;
        self.handled += 1;
        d
    }

    fn uses_time(&self) -> bool {
        false
    }

    fn wants_more(&self) -> bool {
        !self.woke
    }
}

/// The ports' protocol as the offload engine's thread serves it: each message from
/// another node is delivered there, its handler run there, while the application
/// computes (the engine wakes the application after each message it consumed, so a wait
/// sleeping on the endpoint's descriptor sees the signals).
pub(super) struct Served {
    pub table: Arc<Mutex<Table>>,
}

impl Protocol for Served {
    fn handle_message(
        &mut self,
        now: Time,
        from: Source,
        msg: &[u8],
        out: &mut Outbox,
    ) -> Disposition {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let mut handler = Handler {
            table: &mut table,
            rings: None,
            woke: false,
            handled: 0,
        };
        handler.handle_message(now, from, msg, out)
    }

    fn uses_time(&self) -> bool {
        false
    }
}

/// The protocol of a process's ports on the engine's hook: each message that arrives is
/// delivered and consumed.
pub(super) struct Handler<'a> {
    pub table: &'a mut Table,
    /// Where this node's ranks' broadcast rings are read (the application's thread);
    /// `None` where they cannot be (the offload engine's thread, which handles network
    /// messages only): an indirect broadcast then is malformed.
    pub rings: Option<&'a dyn RingReader>,
    /// A port was signalled or an error reported in this drive: the engine returns to
    /// the application, which may be waiting for it.
    pub woke: bool,
    /// Messages handled in this drive.
    pub handled: u64,
}

impl Handler<'_> {
    /// A message that is not a port message: a piece of one, a deposit's notice, a
    /// release of broadcast ring places, or malformed (out of line: the port message's
    /// path stays small).
    #[inline(never)]
    fn handle_other(&mut self, from: Source, msg: &[u8], out: &mut Outbox) {
        let t = &mut *self.table;
        if let Some((p, bytes)) = Piece::decode(msg) {
            if from.dpid == t.dpid {
                self.woke |= t.take_piece(from.rank, p, bytes, out);
            } else {
                t.stats.malformed += 1;
            }
            return;
        }
        if let Some(d) = Deposited::decode(msg) {
            if from.dpid == t.dpid {
                self.woke |= t.deliver_deposit(from, d, out);
            } else {
                t.stats.malformed += 1;
            }
            return;
        }
        match Release::decode(msg) {
            // A root closing asks for what this rank copied from its ring.
            Some(r) if r.offset == FLUSH_RELEASES && from.dpid == t.dpid => {
                if let Some(back) = t.flush_copied(from.rank, r.id) {
                    out.forward(from, &back.encode(), &[]);
                }
            }
            // A rank of this node copied a broadcast out of this rank's ring.
            Some(r) if r.id == t.ring.id && from.dpid == t.dpid => {
                if !t.ring.release(from.rank, r.offset) {
                    t.stats.malformed += 1;
                }
            }
            _ => t.stats.malformed += 1,
        }
    }
}

impl Protocol for Handler<'_> {
    #[inline]
    fn handle_message(
        &mut self,
        _now: Time,
        from: Source,
        msg: &[u8],
        out: &mut Outbox,
    ) -> Disposition {
        self.handled += 1;
        let Some((head, payload)) = Header::decode(msg) else {
            self.handle_other(from, msg, out);
            return Disposition::Consumed;
        };
        let t = &mut *self.table;
        if from.dpid != t.dpid {
            // Only the ports' own endpoint numbers reach here; counted, not guessed at.
            t.stats.malformed += 1;
            return Disposition::Consumed;
        }
        let mut origin = Origin {
            rank: from.rank,
            port: head.src_port,
        };
        if let Some(root) = head.root.filter(|_| head.native) {
            // A broadcast its root sent to every receiver: from the root itself, and
            // nobody forwards it.
            if root != from.rank {
                t.stats.malformed += 1;
                return Disposition::Consumed;
            }
        } else if let Some(root) = head.root {
            // A broadcast: it must come from this rank's parent in the root's tree (a
            // peer that claims another root, or sends out of turn, is not followed: its
            // message would be forwarded twice or to the wrong ranks).
            if tree::parent(t.rank, root, t.size) != Some(from.rank) {
                t.stats.malformed += 1;
                return Disposition::Consumed;
            }
            for child in tree::children(t.rank, root, t.size) {
                let to = Source {
                    rank: child,
                    dpid: t.dpid,
                };
                // Forwarded even when the outbox is full: the engine handed this message
                // while it had room, and hands no more until it drains.
                out.forward(to, &msg[..HEADER_LEN], payload);
                t.stats.forwarded += 1;
            }
            origin.rank = root;
        }
        if head.indirect {
            // The payload is in the root's ring (a native broadcast, checked above): it
            // is copied straight into the port's buffer, and the place given back
            // whatever becomes of the message, so that the root's ring never fills.
            let (Some(place), Some(rings)) = (Indirect::decode(payload), self.rings) else {
                t.stats.malformed += 1;
                return Disposition::Consumed;
            };
            let root = from.rank;
            let fill = |buf: &mut [u8]| rings.read(root, place.id, place.offset, buf);
            self.woke |=
                t.deliver_with(root, head.dest_port, origin, place.len as usize, fill, out);
            if let Some(back) = t.note_copied(root, place) {
                out.forward(from, &back.encode(), &[]);
            }
            return Disposition::Consumed;
        }
        self.woke |= t.deliver(from.rank, head.dest_port, origin, payload, out);
        Disposition::Consumed
    }

    fn uses_time(&self) -> bool {
        false
    }

    fn wants_more(&self) -> bool {
        !self.woke
    }
}

/// What the fuzz target `ports_messages` drives (`crate::fuzzing::ports`).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzz {
    use super::{Handler, Table};
    use crate::addr::Source;
    use crate::channel::reliable::Time;
    use crate::engine::protocol::{Outbox, Protocol};
    use crate::ports::wire::{Header, Piece, Release, FLUSH_RELEASES};
    use crate::ports::Delivery;

    /// What a run of [`handle_all`] counted.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Counts {
        /// Messages handed to the handler.
        pub handled: u64,
        /// Of them, delivered into a port.
        pub delivered: u64,
        /// Of them, dropped as malformed.
        pub malformed: u64,
        /// Of them, reported as port errors (no buffer, overflow, reserved port).
        pub errors: u64,
        /// Of them, control messages of the broadcast ring (a root's request for the
        /// places this rank copied), answered or not and counted nowhere else.
        pub control: u64,
        /// Of them, messages still set aside (their port's buffer was being written), and
        /// pieces of messages from other nodes that completed no message (the message's
        /// last piece counts as the message).
        pub waiting: u64,
        /// Broadcast copies queued for children.
        pub forwarded: u64,
        /// The most children a rank has in a tree of this job.
        pub max_children: u64,
    }

    /// Hands the messages of `data` to the port table of one rank: the first byte sets
    /// the job's size (1 to 16), the second this rank; then records of the sender's
    /// rank (one byte), a length (one byte) and that many bytes of message. Ports 0 (16
    /// bytes, a handler that signals), 1 (4 bytes) and 2 (no buffer, an error handler)
    /// are bound. Panics if a delivered message's bytes are not in its port's buffer (a
    /// message sent in pieces: the bytes of its pieces, each at its offset), or a
    /// message was counted twice or not at all.
    pub fn handle_all(data: &[u8]) -> Counts {
        let (size, rank) = match data {
            [s, r, ..] => (
                u32::from(*s % 16) + 1,
                u32::from(*r) % (u32::from(*s % 16) + 1),
            ),
            _ => {
                return Counts {
                    handled: 0,
                    delivered: 0,
                    malformed: 0,
                    errors: 0,
                    control: 0,
                    waiting: 0,
                    forwarded: 0,
                    max_children: 0,
                }
            }
        };
        let mut table = Table::new(rank, size, 1);
        table.slots[0].buffer = Some(vec![0; 16].into());
        table.slots[0].handler = Some(Box::new(|d: &mut Delivery<'_>| d.signal()));
        table.slots[1].buffer = Some(vec![0; 4].into());
        table.slots[2].on_error = Some(Box::new(|_| {}));
        let mut out = Outbox::new(8);
        let mut rest = &data[2..];
        let mut handled = 0;
        // A root's request for what this rank copied from its ring: a control message,
        // answered (or not: nothing copied) and counted nowhere else.
        let mut control = 0;
        // Each sender's message in pieces as far as it came: its port, length and bytes.
        let mut landing: Vec<(u32, u8, u32, Vec<u8>)> = Vec::new();
        while let [from, len, tail @ ..] = rest {
            let n = usize::from(*len).min(tail.len());
            let (msg, next) = tail.split_at(n);
            rest = next;
            let from = Source {
                rank: u32::from(*from) % (size + 1),
                dpid: 1,
            };
            let before = table.stats.delivered;
            let (landed, parked) = (table.stats.landed, table.parked.len());
            let mut h = Handler {
                table: &mut table,
                rings: None,
                woke: false,
                handled: 0,
            };
            h.handle_message(Time::ZERO, from, msg, &mut out);
            handled += 1;
            if Header::decode(msg).is_none()
                && Release::decode(msg).is_some_and(|r| r.offset == FLUSH_RELEASES)
            {
                control += 1;
            }
            if let Some((p, bytes)) = Piece::decode(msg) {
                // The model: a piece at 0 starts its sender's message, the next one at
                // the end of what came continues it.
                match landing.iter().position(|l| l.0 == from.rank) {
                    Some(i)
                        if p.offset != 0
                            && p.offset as usize == landing[i].3.len()
                            && (p.dest_port, p.total) == (landing[i].1, landing[i].2) =>
                    {
                        landing[i].3.extend_from_slice(bytes)
                    }
                    // Out of turn: ended; a new start gives the old one up and starts.
                    Some(i) => {
                        landing.swap_remove(i);
                        if p.offset == 0 {
                            landing.push((from.rank, p.dest_port, p.total, bytes.to_vec()));
                        }
                    }
                    None if p.offset == 0 => {
                        landing.push((from.rank, p.dest_port, p.total, bytes.to_vec()));
                    }
                    None => {}
                }
                let complete = landing
                    .iter()
                    .position(|l| l.0 == from.rank && l.3.len() == l.2 as usize);
                if table.stats.landed > landed {
                    let (_, port, _, whole) = landing.swap_remove(complete.unwrap());
                    // (Messages set aside for the port are delivered after it, over it.)
                    if parked == 0 {
                        let slot = &table.slots[usize::from(port)];
                        assert_eq!(slot.last_len, whole.len());
                        assert_eq!(&slot.buffer.as_ref().unwrap()[..whole.len()], &whole[..]);
                    }
                } else if let Some(i) = complete {
                    // Complete, and delivered some other way (set aside) or refused.
                    landing.swap_remove(i);
                }
            } else if table.stats.delivered > before && table.parked.is_empty() {
                // The payload is the message less the 8-byte header, in its port's buffer.
                let port = usize::from(msg[1]);
                let slot = &table.slots[port];
                let payload = &msg[8..];
                assert_eq!(slot.last_len, payload.len());
                if !payload.is_empty() {
                    assert_eq!(&slot.buffer.as_ref().unwrap()[..payload.len()], payload);
                }
            }
            // Forwards leave as a link would take them.
            out.flush(&mut h_dummy(), |_, _, _| Ok::<_, ()>(true), |_| {});
        }
        let s = &table.stats;
        // Every message is one of these once: delivered, malformed, an error, a control
        // message, set aside still, or a piece that completed no message.
        assert_eq!(
            s.delivered
                + s.malformed
                + s.errors
                + control
                + table.parked.len() as u64
                + table.partial_pieces,
            handled,
            "{s:?}, {} parked, {} partial pieces",
            table.parked.len(),
            table.partial_pieces
        );
        let max_children = (0..size)
            .map(|root| crate::ports::tree::children(rank, root, size).count() as u64)
            .max()
            .unwrap_or(0);
        Counts {
            handled,
            delivered: s.delivered,
            malformed: s.malformed,
            errors: s.errors,
            control,
            waiting: table.parked.len() as u64 + table.partial_pieces,
            forwarded: s.forwarded,
            max_children,
        }
    }

    /// A protocol that sends no ranges, for flushing the outbox.
    fn h_dummy() -> impl Protocol {
        struct Nothing;
        impl Protocol for Nothing {
            fn handle_message(
                &mut self,
                _: Time,
                _: Source,
                _: &[u8],
                _: &mut Outbox,
            ) -> crate::engine::protocol::Disposition {
                crate::engine::protocol::Disposition::Consumed
            }
        }
        Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    pub(super) const DPID: u16 = 9;

    pub(super) fn msg(dest_port: u8, src_port: u8, payload: &[u8]) -> Vec<u8> {
        let mut m = Header {
            dest_port,
            src_port,
            root: None,
            native: false,
            indirect: false,
        }
        .encode()
        .to_vec();
        m.extend_from_slice(payload);
        m
    }

    pub(super) fn handle(t: &mut Table, from_rank: u32, m: &[u8]) -> bool {
        let mut out = Outbox::new(16);
        let mut h = Handler {
            table: t,
            rings: None,
            woke: false,
            handled: 0,
        };
        let from = Source {
            rank: from_rank,
            dpid: DPID,
        };
        assert_eq!(
            h.handle_message(Time::ZERO, from, m, &mut out),
            Disposition::Consumed
        );
        h.woke
    }

    fn piece(dest_port: u8, src_port: u8, offset: u32, total: u32, bytes: &[u8]) -> Vec<u8> {
        let mut m = Piece {
            dest_port,
            src_port,
            offset,
            total,
        }
        .encode()
        .to_vec();
        m.extend_from_slice(bytes);
        m
    }

    /// Every delivery's sender and bytes.
    type Got = Arc<Mutex<Vec<(u32, Vec<u8>)>>>;

    /// A table whose port 3 (16 bytes) keeps every delivery's sender and bytes.
    fn recording_table() -> (Table, Got) {
        let mut t = Table::new(0, 4, DPID);
        t.slots[3].buffer = Some(vec![0; 16].into());
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        t.slots[3].handler = Some(Box::new(move |d: &mut Delivery<'_>| {
            g.lock().unwrap().push((d.origin().rank, d.data().to_vec()));
            d.signal();
        }));
        (t, got)
    }

    #[test]
    fn pieces_are_written_into_the_buffer_as_they_come_and_deliver_once_complete() {
        let (mut t, got) = recording_table();
        assert!(!handle(&mut t, 1, &piece(3, 5, 0, 10, b"abcdef")));
        // Already in place, not yet a message.
        assert_eq!(&t.slots[3].buffer.as_ref().unwrap()[..6], b"abcdef");
        assert!(got.lock().unwrap().is_empty());
        assert!(
            !t.hold(3),
            "nothing else writes or shows the buffer meanwhile"
        );
        assert!(handle(&mut t, 1, &piece(3, 5, 6, 10, b"ghij")));
        assert_eq!(*got.lock().unwrap(), [(1, b"abcdefghij".to_vec())]);
        assert_eq!(t.slots[3].last_from, Some(Origin { rank: 1, port: 5 }));
        assert_eq!(
            (t.stats.landed, t.stats.delivered, t.stats.malformed),
            (1, 1, 0)
        );
        assert!(t.hold(3));
        // A one-piece message is a message too.
        assert!(handle(&mut t, 2, &piece(3, 5, 0, 3, b"xyz")));
        assert_eq!(got.lock().unwrap()[1], (2, b"xyz".to_vec()));
    }

    #[test]
    fn what_comes_for_a_port_being_written_waits_and_keeps_its_order() {
        let (mut t, got) = recording_table();
        handle(&mut t, 1, &piece(3, 5, 0, 8, b"1111"));
        // Rank 2's whole message and rank 3's pieces for the same port wait; rank 2's
        // message for another port does not.
        t.slots[4].buffer = Some(vec![0; 4].into());
        assert!(!handle(&mut t, 2, &msg(3, 5, b"22")));
        handle(&mut t, 3, &piece(3, 5, 0, 6, b"333"));
        handle(&mut t, 3, &piece(3, 5, 3, 6, b"333"));
        assert!(got.lock().unwrap().is_empty());
        assert_eq!(&t.slots[3].buffer.as_ref().unwrap()[..4], b"1111");
        assert!(handle(&mut t, 1, &piece(3, 5, 4, 8, b"1111")));
        assert_eq!(
            *got.lock().unwrap(),
            [
                (1, b"11111111".to_vec()),
                (2, b"22".to_vec()),
                (3, b"333333".to_vec())
            ]
        );
        assert_eq!(
            (t.stats.landed, t.stats.delivered, t.stats.parked),
            (1, 3, 2)
        );
        assert!(t.parked.is_empty() && t.landings.is_empty());
    }

    #[test]
    fn a_message_behind_a_refused_one_in_pieces_moves_on_when_that_ends() {
        let (mut t, got) = recording_table();
        // Port 6 has no buffer: refused at its first piece, the rest dropped; rank 1's
        // next message waits for its last piece, then goes.
        handle(&mut t, 1, &piece(6, 5, 0, 4, b"ab"));
        handle(&mut t, 1, &msg(3, 5, b"next"));
        assert!(got.lock().unwrap().is_empty());
        handle(&mut t, 1, &piece(6, 5, 2, 4, b"cd"));
        assert_eq!(*got.lock().unwrap(), [(1, b"next".to_vec())]);
        assert_eq!(t.errors.len(), 1);
    }

    #[test]
    fn an_empty_message_in_one_piece_ends_a_half_sent_one_and_is_delivered() {
        let (mut t, got) = recording_table();
        handle(&mut t, 1, &piece(3, 5, 0, 8, b"half"));
        handle(&mut t, 1, &piece(3, 5, 0, 0, b""));
        assert_eq!(*got.lock().unwrap(), [(1, Vec::new())]);
        assert!(t.landings.is_empty() && t.hold(3));
        assert_eq!(t.stats.malformed, 0);
    }

    #[test]
    fn messages_set_aside_keep_their_senders_order() {
        // What the two-sender job test found: a sender's messages set aside one after
        // the other (a whole one, then two in pieces) while another sender's message
        // lands in the port's buffer come out in the order they were sent.
        let (mut t, got) = recording_table();
        handle(&mut t, 2, &piece(3, 5, 0, 4, b"ab"));
        handle(&mut t, 1, &msg(3, 5, b"A"));
        handle(&mut t, 1, &piece(3, 5, 0, 2, b"B1"));
        handle(&mut t, 1, &piece(3, 5, 0, 4, b"C1"));
        handle(&mut t, 1, &piece(3, 5, 2, 4, b"C2"));
        handle(&mut t, 1, &piece(3, 5, 0, 2, b"D1"));
        assert!(got.lock().unwrap().is_empty());
        handle(&mut t, 2, &piece(3, 5, 2, 4, b"cd"));
        let order: Vec<Vec<u8>> = got.lock().unwrap().iter().map(|g| g.1.clone()).collect();
        assert_eq!(order, [&b"abcd"[..], b"A", b"B1", b"C1C2", b"D1"]);
    }

    #[test]
    fn pieces_out_of_order_or_out_of_turn_are_malformed_and_end_their_message() {
        let (mut t, got) = recording_table();
        // A continuation of nothing.
        handle(&mut t, 1, &piece(3, 5, 4, 8, b"zzzz"));
        assert_eq!(t.stats.malformed, 1);
        assert!(t.landings.is_empty());
        // A gap, another port, another length: each ends the message, whose bytes in
        // the buffer are no message.
        for bad in [
            piece(3, 5, 5, 8, b"zzz"),
            piece(4, 5, 4, 8, b"zzzz"),
            piece(3, 5, 4, 9, b"zzzz"),
        ] {
            handle(&mut t, 1, &msg(3, 5, b"ok"));
            assert!(t.slots[3].last_from.is_some());
            handle(&mut t, 1, &piece(3, 5, 0, 8, b"aaaa"));
            let before = t.stats.malformed;
            handle(&mut t, 1, &bad);
            assert_eq!(t.stats.malformed, before + 1);
            assert!(t.landings.is_empty() && !t.landing_on(3));
            assert!(
                t.slots[3].last_from.is_none(),
                "the buffer shows no message"
            );
            // What follows of it is malformed too.
            handle(&mut t, 1, &piece(3, 5, 4, 8, b"bbbb"));
            assert_eq!(t.stats.malformed, before + 2);
        }
        assert!(got.lock().unwrap().iter().all(|(_, m)| m == b"ok"));
        assert_eq!(t.stats.landed, 0);
        // A new start gives the half message up and lands the new one.
        handle(&mut t, 1, &piece(3, 5, 0, 8, b"aaaa"));
        handle(&mut t, 1, &piece(3, 5, 0, 6, b"new"));
        handle(&mut t, 1, &piece(3, 5, 3, 6, b"one"));
        assert_eq!(
            got.lock().unwrap().last().unwrap(),
            &(1, b"newone".to_vec())
        );
        assert_eq!(t.stats.landed, 1);
    }

    #[test]
    fn a_whole_message_sent_while_its_senders_pieces_land_comes_after_them() {
        let (mut t, got) = recording_table();
        t.slots[4].buffer = Some(vec![0; 4].into());
        let g = got.clone();
        t.slots[4].handler = Some(Box::new(move |d: &mut Delivery<'_>| {
            g.lock().unwrap().push((d.origin().rank, d.data().to_vec()));
        }));
        // Into the buffer: rank 1's message to port 4 waits for its message to port 3.
        handle(&mut t, 1, &piece(3, 5, 0, 4, b"ab"));
        handle(&mut t, 1, &msg(4, 5, b"M2"));
        assert!(got.lock().unwrap().is_empty());
        handle(&mut t, 1, &piece(3, 5, 2, 4, b"cd"));
        // Aside (rank 2 lands in port 3 meanwhile): the same.
        handle(&mut t, 2, &piece(3, 5, 0, 2, b"x"));
        handle(&mut t, 1, &piece(3, 5, 0, 4, b"ef"));
        handle(&mut t, 1, &msg(4, 5, b"M4"));
        handle(&mut t, 1, &piece(3, 5, 2, 4, b"gh"));
        handle(&mut t, 2, &piece(3, 5, 1, 2, b"y"));
        let order: Vec<Vec<u8>> = got.lock().unwrap().iter().map(|g| g.1.clone()).collect();
        assert_eq!(order, [&b"abcd"[..], b"M2", b"xy", b"efgh", b"M4"]);
    }

    #[test]
    fn a_port_that_cannot_take_a_message_in_pieces_hears_of_it_once() {
        let (mut t, got) = recording_table();
        let errors = Arc::new(Mutex::new(Vec::new()));
        let e = errors.clone();
        t.slots[3].on_error = Some(Box::new(move |err| e.lock().unwrap().push(err)));
        let from = Origin { rank: 1, port: 5 };
        for (k, part) in [b"aaaaaaaaaa", b"bbbbbbbbbb"].iter().enumerate() {
            handle(&mut t, 1, &piece(3, 5, 10 * k as u32, 20, &part[..]));
        }
        t.slots[6].on_error = t.slots[3].on_error.take();
        handle(&mut t, 2, &piece(6, 5, 0, 4, b"cc"));
        handle(&mut t, 2, &piece(6, 5, 2, 4, b"cc"));
        handle(&mut t, 2, &piece(RESERVED_PORT, 5, 0, 2, b"dd"));
        assert_eq!(
            *errors.lock().unwrap(),
            [
                PortError::Overflow {
                    port: 3,
                    from,
                    len: 20,
                    capacity: 16
                },
                PortError::NoBuffer {
                    port: 6,
                    from: Origin { rank: 2, port: 5 },
                    len: 4
                }
            ]
        );
        assert_eq!(
            t.errors.pop_front(),
            Some(PortError::Reserved {
                port: RESERVED_PORT,
                from: Origin { rank: 2, port: 5 },
                len: 2
            })
        );
        assert_eq!((t.stats.errors, t.stats.malformed), (3, 0));
        assert!(got.lock().unwrap().is_empty());
        assert!(t.landings.is_empty());
        assert_eq!(
            t.slots[3].buffer.as_ref().unwrap()[..],
            [0; 16],
            "untouched"
        );
    }

    #[test]
    fn a_failed_senders_half_message_is_given_up_and_what_waited_moves_on() {
        let (mut t, got) = recording_table();
        handle(&mut t, 1, &piece(3, 5, 0, 8, b"1111"));
        handle(&mut t, 2, &msg(3, 5, b"22"));
        let mut out = Outbox::new(4);
        assert!(t.abandon_landings(1, &mut out));
        assert_eq!(*got.lock().unwrap(), [(2, b"22".to_vec())]);
        assert!(t.hold(3) && t.landings.is_empty());
        // Its last piece, if it still came, is no message.
        handle(&mut t, 1, &piece(3, 5, 4, 8, b"1111"));
        assert_eq!((t.stats.malformed, t.stats.landed), (1, 0));
    }

    #[test]
    fn a_message_lands_in_the_bound_buffer_and_signals_without_a_handler() {
        let mut t = Table::new(0, 4, DPID);
        t.slots[3].buffer = Some(vec![0; 16].into());
        assert!(handle(&mut t, 1, &msg(3, 5, b"hello")));
        let s = &t.slots[3];
        assert_eq!(&s.buffer.as_ref().unwrap()[..s.last_len], b"hello");
        assert_eq!(s.last_from, Some(Origin { rank: 1, port: 5 }));
        assert_eq!(s.signals, 1);
        assert_eq!(t.stats.delivered, 1);
        assert!(t.errors.is_empty());
    }

    #[test]
    fn the_handler_sees_the_message_and_may_rebind_the_buffer() {
        let mut t = Table::new(0, 4, DPID);
        t.slots[0].buffer = Some(vec![0; 8].into());
        let kept = Arc::new(Mutex::new(Vec::new()));
        let k = kept.clone();
        t.slots[0].handler = Some(Box::new(move |d: &mut Delivery<'_>| {
            assert_eq!(d.port(), 0);
            assert_eq!(d.origin(), Origin { rank: 2, port: 1 });
            // The next message goes into a fresh buffer; this one is kept whole.
            let full = d.rebind(vec![0; 8]);
            assert!(d.data().is_empty(), "the message moved with its buffer");
            k.lock().unwrap().push(full[..d.len()].to_vec());
            d.signal();
        }));
        assert!(handle(&mut t, 2, &msg(0, 1, b"first")));
        assert!(handle(&mut t, 2, &msg(0, 1, b"second")));
        assert_eq!(
            *kept.lock().unwrap(),
            vec![b"first".to_vec(), b"second".to_vec()]
        );
        assert_eq!(t.slots[0].signals, 2);
        assert!(t.slots[0].handler.is_some(), "the handler stays bound");
        // The fresh buffer holds no message: nothing to read.
        assert_eq!((t.slots[0].last_len, t.slots[0].last_from), (0, None));
    }

    #[test]
    fn a_handler_that_does_not_signal_does_not_wake_the_application() {
        let mut t = Table::new(0, 4, DPID);
        t.slots[0].buffer = Some(vec![0; 8].into());
        t.slots[0].handler = Some(Box::new(|_: &mut Delivery<'_>| {}));
        assert!(!handle(&mut t, 1, &msg(0, 0, b"x")));
        assert_eq!(t.slots[0].signals, 0);
        assert_eq!(t.stats.delivered, 1);
    }

    #[test]
    fn overflow_and_a_missing_buffer_go_to_the_error_handler_and_touch_nothing() {
        let mut t = Table::new(0, 4, DPID);
        t.slots[4].buffer = Some(vec![7; 4].into());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        t.slots[4].on_error = Some(Box::new(move |e| s.lock().unwrap().push(e)));
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        t.slots[4].handler = Some(Box::new(move |_: &mut Delivery<'_>| {
            r.fetch_add(1, Ordering::Relaxed);
        }));
        handle(&mut t, 1, &msg(4, 0, b"too long"));
        assert_eq!(t.slots[4].buffer.as_deref(), Some(&[7u8; 4][..]));
        t.slots[4].buffer = None;
        handle(&mut t, 1, &msg(4, 0, b"ab"));
        let from = Origin { rank: 1, port: 0 };
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                PortError::Overflow {
                    port: 4,
                    from,
                    len: 8,
                    capacity: 4
                },
                PortError::NoBuffer {
                    port: 4,
                    from,
                    len: 2
                }
            ]
        );
        assert_eq!(
            ran.load(Ordering::Relaxed),
            0,
            "no handler for a failed delivery"
        );
        assert!(t.errors.is_empty());
        assert_eq!(t.stats.errors, 2);
    }

    #[test]
    fn without_an_error_handler_errors_wait_for_the_application() {
        let mut t = Table::new(0, 4, DPID);
        assert!(handle(&mut t, 1, &msg(9, 0, b"nobody")));
        assert!(handle(&mut t, 1, &msg(RESERVED_PORT, 0, b"")));
        assert_eq!(t.errors.len(), 2);
        assert!(matches!(t.errors[0], PortError::NoBuffer { port: 9, .. }));
        assert!(matches!(t.errors[1], PortError::Reserved { .. }));
        // An empty message needs no buffer.
        assert!(handle(&mut t, 1, &msg(9, 0, b"")));
        assert_eq!(t.slots[9].signals, 1);
    }

    #[test]
    fn malformed_messages_are_counted_and_dropped() {
        let mut t = Table::new(0, 4, DPID);
        t.slots[0].buffer = Some(vec![0; 8].into());
        let mut bad = msg(0, 0, b"x");
        bad[0] = b'X';
        assert!(!handle(&mut t, 1, &bad));
        assert!(!handle(&mut t, 1, &bad[..3]));
        assert_eq!(t.stats.malformed, 2);
        assert_eq!(t.stats.delivered, 0);
        assert_eq!(t.slots[0].signals, 0);
    }

    #[test]
    fn a_handler_answers_through_the_outbox() {
        let mut t = Table::new(0, 4, DPID);
        t.slots[1].buffer = Some(vec![0; 8].into());
        let to = Source {
            rank: 3,
            dpid: DPID,
        };
        t.slots[2].dest = Some(Bound::One {
            to,
            head: Header {
                dest_port: 6,
                src_port: 2,
                root: None,
                native: false,
                indirect: false,
            }
            .encode(),
            route: 0,
            deposit: false,
            frame: None,
        });
        t.slots[1].handler = Some(Box::new(|d: &mut Delivery<'_>| {
            let mut reply = d.data().to_vec();
            reply.reverse();
            d.send(2, &reply).unwrap();
            assert!(matches!(
                d.send(3, b"x"),
                Err(PortError::NoDestination { port: 3 })
            ));
        }));
        let mut out = Outbox::new(4);
        let mut h = Handler {
            table: &mut t,
            rings: None,
            woke: false,
            handled: 0,
        };
        h.handle_message(
            Time::ZERO,
            Source {
                rank: 1,
                dpid: DPID,
            },
            &msg(1, 0, b"abc"),
            &mut out,
        );
        assert_eq!(out.len(), 1);
        let mut sent = Vec::new();
        out.flush(
            &mut h,
            |dest, head, body| {
                sent.push((dest, [head, body].concat()));
                Ok::<_, ()>(true)
            },
            |_| {},
        );
        assert_eq!(sent, vec![(to, msg(6, 2, b"cba"))]);
    }

    fn bcast(dest_port: u8, root: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Header {
            dest_port,
            src_port: 9,
            root: Some(root),
            native: false,
            indirect: false,
        }
        .encode()
        .to_vec();
        m.extend_from_slice(payload);
        m
    }

    /// Rank 2 of 8 hears root 0's broadcasts from rank 0 and forwards them to rank 6;
    /// the origin its port sees is the root.
    #[test]
    fn a_broadcast_is_forwarded_down_the_tree_and_delivered_as_the_roots() {
        let mut t = Table::new(2, 8, DPID);
        t.slots[5].buffer = Some(vec![0; 8].into());
        let mut out = Outbox::new(4);
        let mut h = Handler {
            table: &mut t,
            rings: None,
            woke: false,
            handled: 0,
        };
        let from = Source {
            rank: 0,
            dpid: DPID,
        };
        let m = bcast(5, 0, b"all");
        h.handle_message(Time::ZERO, from, &m, &mut out);
        let mut sent = Vec::new();
        out.flush(
            &mut h,
            |dest, head, body| {
                sent.push((dest, [head, body].concat()));
                Ok::<_, ()>(true)
            },
            |_| {},
        );
        assert_eq!(
            sent,
            vec![(
                Source {
                    rank: 6,
                    dpid: DPID
                },
                m
            )]
        );
        assert_eq!(t.slots[5].last_from, Some(Origin { rank: 0, port: 9 }));
        assert_eq!(t.slots[5].signals, 1);
        assert_eq!(t.stats.forwarded, 1);
    }

    /// A handler's broadcast is queued for every child of the tree or, when the outbox
    /// cannot take them all, for none: a retry cannot reach some twice.
    #[test]
    fn a_handlers_broadcast_goes_to_all_children_or_none() {
        for (capacity, queued) in [(2, 0), (3, 3)] {
            let mut t = Table::new(0, 8, DPID);
            t.slots[0].buffer = Some(vec![0; 8].into());
            t.slots[1].dest = Some(Bound::All {
                head: Header {
                    dest_port: 1,
                    src_port: 1,
                    root: Some(0),
                    native: false,
                    indirect: false,
                }
                .encode(),
            });
            let result = Arc::new(Mutex::new(None));
            let r = result.clone();
            t.slots[0].handler = Some(Box::new(move |d: &mut Delivery<'_>| {
                *r.lock().unwrap() = Some(d.send(1, b"all"));
            }));
            let mut out = Outbox::new(capacity);
            let mut h = Handler {
                table: &mut t,
                rings: None,
                woke: false,
                handled: 0,
            };
            let from = Source {
                rank: 5,
                dpid: DPID,
            };
            h.handle_message(Time::ZERO, from, &msg(0, 0, b"go"), &mut out);
            let want = if queued == 0 {
                Err(PortError::OutboxFull { port: 1 })
            } else {
                Ok(())
            };
            assert_eq!(result.lock().unwrap().clone(), Some(want));
            assert_eq!(out.len(), queued, "capacity {capacity}");
            assert_eq!(t.stats.sent, u64::from(queued > 0));
        }
    }

    /// A broadcast its root sent to every receiver itself (the group channel) is
    /// delivered as the root's and forwarded to nobody; one that names another root
    /// than its sender is malformed. A root with the link's broadcast sends to the group
    /// and to its own node's ranks.
    #[test]
    fn a_native_broadcast_comes_from_its_root_and_is_not_forwarded() {
        let mut t = Table::new(2, 8, DPID);
        t.slots[5].buffer = Some(vec![0; 8].into());
        let native = |root: u32| {
            let mut m = Header {
                dest_port: 5,
                src_port: 9,
                root: Some(root),
                native: true,
                indirect: false,
            }
            .encode()
            .to_vec();
            m.extend_from_slice(b"all");
            m
        };
        let mut out = Outbox::new(4);
        let mut h = Handler {
            table: &mut t,
            rings: None,
            woke: false,
            handled: 0,
        };
        let from = |rank| Source { rank, dpid: DPID };
        h.handle_message(Time::ZERO, from(0), &native(0), &mut out);
        assert!(out.is_empty(), "nobody forwards a native broadcast");
        h.handle_message(Time::ZERO, from(1), &native(0), &mut out);
        assert_eq!(t.slots[5].last_from, Some(Origin { rank: 0, port: 9 }));
        assert_eq!(t.slots[5].signals, 1);
        assert_eq!((t.stats.malformed, t.stats.forwarded), (1, 0));

        t.native_unicast = Some(vec![3]);
        t.native_group = true;
        assert_eq!(
            t.broadcast_targets(),
            vec![Source::group(DPID), from(3)],
            "the group and this node's other rank"
        );
        t.native_unicast = None;
        let tree: Vec<Source> = tree::children(2, 2, 8).map(from).collect();
        assert_eq!(
            t.broadcast_targets(),
            tree,
            "this rank's children in its tree"
        );
    }

    #[test]
    fn the_ring_hands_out_places_that_overlap_none_still_held() {
        let mut r = Ring {
            id: 9,
            capacity: 100,
            ..Ring::default()
        };
        assert_eq!(r.take(0, &[1]), None, "nothing to place");
        assert_eq!(r.take(10, &[]), None, "nobody to read it");
        assert_eq!(r.take(101, &[1]), None, "larger than the ring");
        assert_eq!(r.take(40, &[1, 2]), Some(0));
        assert_eq!(r.take(40, &[1, 2]), Some(40));
        assert_eq!(
            r.take(40, &[1, 2]),
            None,
            "20 bytes left at the end, 0 at the start"
        );
        assert!(r.release(1, 0));
        assert!(!r.release(1, 0), "rank 1 gave it back already");
        assert!(r.release(1, 40), "rank 1 gives back in order");
        assert!(!r.release(3, 40), "rank 3 never held it");
        assert_eq!(
            r.take(40, &[1, 2]),
            None,
            "rank 2 still holds the first place"
        );
        assert!(r.release(2, 0));
        assert_eq!(r.take(40, &[1, 2]), Some(0), "round to the start");
        assert_eq!(
            r.taken(),
            2,
            "rank 2 holds the place at 40, both the one at 0"
        );
        r.forget(2);
        r.forget(1);
        assert_eq!(
            r.taken(),
            0,
            "failed ranks give nothing back: their places free"
        );
        assert_eq!(r.take(100, &[1]), Some(0));
    }

    /// Reads from a fake ring: rank 0's buffer 7 holds `0, 1, 2, ...`.
    struct FakeRings;

    impl RingReader for FakeRings {
        fn read(&self, rank: u32, id: u32, offset: u64, dst: &mut [u8]) -> bool {
            if (rank, id) != (0, 7) || offset + dst.len() as u64 > 256 {
                return false;
            }
            for (i, b) in dst.iter_mut().enumerate() {
                *b = (offset as usize + i) as u8;
            }
            true
        }
    }

    /// An indirect broadcast is copied from the root's ring into the port's buffer, and
    /// its place given back to the root, even when the message cannot be delivered, in
    /// one release per [`RELEASE_PLACES`] places (or [`RELEASE_BYTES`]); without a ring
    /// reader (the offload engine's thread) it is malformed. A release reaches the root's
    /// ring only from a holder, and gives back every place before it too.
    #[test]
    fn an_indirect_broadcast_is_read_from_the_roots_ring_and_given_back() {
        let mut t = Table::new(2, 4, DPID);
        t.slots[5].buffer = Some(vec![0; 16].into());
        let msg = |len: u32, offset: u64| {
            let mut m = Header {
                dest_port: 5,
                src_port: 9,
                root: Some(0),
                native: true,
                indirect: true,
            }
            .encode()
            .to_vec();
            m.extend_from_slice(&Indirect { id: 7, offset, len }.encode());
            m
        };
        let from = Source {
            rank: 0,
            dpid: DPID,
        };
        let sent = |out: &mut Outbox, h: &mut Handler<'_>| {
            let mut sent = Vec::new();
            out.flush(
                h,
                |dest, head, body| {
                    sent.push((dest, [head, body].concat()));
                    Ok::<_, ()>(true)
                },
                |_| {},
            );
            sent
        };
        let mut out = Outbox::new(4);
        let rings = FakeRings;
        let mut h = Handler {
            table: &mut t,
            rings: Some(&rings),
            woke: false,
            handled: 0,
        };
        h.handle_message(Time::ZERO, from, &msg(10, 100), &mut out);
        // Too long for the port's 16 bytes: an error, and its place counts as copied.
        h.handle_message(Time::ZERO, from, &msg(17, 100), &mut out);
        // Outside the root's buffer: malformed, nothing written, its place copied.
        h.handle_message(Time::ZERO, from, &msg(10, 250), &mut out);
        assert!(
            sent(&mut out, &mut h).is_empty(),
            "not enough copied to give back"
        );
        for i in 3..RELEASE_PLACES {
            h.handle_message(Time::ZERO, from, &msg(4, u64::from(i) * 4), &mut out);
        }
        let last = u64::from(RELEASE_PLACES - 1) * 4;
        let back = Release {
            id: 7,
            offset: last,
        }
        .encode()
        .to_vec();
        assert_eq!(
            sent(&mut out, &mut h),
            vec![(from, back)],
            "one release for all"
        );
        assert_eq!(
            t.slots[5].buffer.as_ref().unwrap()[..4],
            [last as u8, last as u8 + 1, last as u8 + 2, last as u8 + 3]
        );
        assert_eq!(t.slots[5].last_from, Some(Origin { rank: 0, port: 9 }));
        assert_eq!(
            (t.stats.delivered, t.stats.errors, t.stats.malformed),
            (u64::from(RELEASE_PLACES) - 2, 1, 1)
        );

        let mut h = Handler {
            table: &mut t,
            rings: None,
            woke: false,
            handled: 0,
        };
        h.handle_message(Time::ZERO, from, &msg(10, 100), &mut out);
        assert!(out.is_empty());
        assert_eq!(t.stats.malformed, 2, "no ring reader here");

        // The root's side: releases free its places, from holders only, each one every
        // place before it too.
        t.ring.id = 7;
        t.ring.capacity = 64;
        assert_eq!(t.ring.take(8, &[1, 3]), Some(0));
        assert_eq!(t.ring.take(8, &[1, 3]), Some(8));
        let mut h = Handler {
            table: &mut t,
            rings: None,
            woke: false,
            handled: 0,
        };
        let release =
            |rank, id, offset| (Source { rank, dpid: DPID }, Release { id, offset }.encode());
        for (src, r) in [release(2, 7, 8), release(1, 8, 8), release(1, 7, 8)] {
            h.handle_message(Time::ZERO, src, &r, &mut out);
        }
        assert_eq!(t.ring.taken(), 2, "rank 3 holds both still");
        let mut h = Handler {
            table: &mut t,
            rings: None,
            woke: false,
            handled: 0,
        };
        h.handle_message(
            Time::ZERO,
            release(3, 7, 8).0,
            &release(3, 7, 8).1,
            &mut out,
        );
        assert_eq!(t.ring.taken(), 0);
        assert_eq!(
            t.stats.malformed, 4,
            "rank 2 held nothing; buffer 8 is no ring of ours"
        );
    }

    /// A closing root asks for its places: the reader gives back what it copied (and
    /// nothing when it copied nothing); a closing reader gives back everything at once.
    #[test]
    fn places_are_given_back_when_a_root_asks_or_a_reader_closes() {
        let mut t = Table::new(1, 4, DPID);
        t.slots[5].buffer = Some(vec![0; 16].into());
        let ask = |root, id| {
            (
                Source {
                    rank: root,
                    dpid: DPID,
                },
                Release {
                    id,
                    offset: FLUSH_RELEASES,
                }
                .encode(),
            )
        };
        let mut out = Outbox::new(8);
        let rings = FakeRings;
        let mut h = Handler {
            table: &mut t,
            rings: Some(&rings),
            woke: false,
            handled: 0,
        };
        let (from, req) = ask(0, 7);
        h.handle_message(Time::ZERO, from, &req, &mut out);
        assert!(out.is_empty(), "nothing copied yet");
        let mut m = Header {
            dest_port: 5,
            src_port: 9,
            root: Some(0),
            native: true,
            indirect: true,
        }
        .encode()
        .to_vec();
        m.extend_from_slice(
            &Indirect {
                id: 7,
                offset: 32,
                len: 4,
            }
            .encode(),
        );
        h.handle_message(Time::ZERO, from, &m, &mut out);
        assert!(out.is_empty(), "below the batch");
        h.handle_message(Time::ZERO, from, &req, &mut out);
        assert_eq!(out.len(), 1, "given back when asked");
        h.handle_message(Time::ZERO, from, &m, &mut out);
        assert_eq!(
            t.flush_all_copied(),
            vec![(0, Release { id: 7, offset: 32 })],
            "and at close"
        );
        assert!(t.flush_all_copied().is_empty());
        assert_eq!(t.stats.malformed, 0);
    }

    /// A broadcast from a rank that is not this rank's parent for the root it names, or
    /// naming this rank or no rank of the job as root, is malformed: not delivered, not
    /// forwarded.
    #[test]
    fn a_broadcast_out_of_its_tree_is_dropped() {
        let mut t = Table::new(2, 8, DPID);
        t.slots[5].buffer = Some(vec![0; 8].into());
        for (from, root) in [(1, 0), (3, 0), (0, 2), (0, 8), (0, u32::MAX)] {
            let mut out = Outbox::new(4);
            let mut h = Handler {
                table: &mut t,
                rings: None,
                woke: false,
                handled: 0,
            };
            let src = Source {
                rank: from,
                dpid: DPID,
            };
            h.handle_message(Time::ZERO, src, &bcast(5, root, b"x"), &mut out);
            assert!(out.is_empty(), "from {from} root {root}: forwarded");
        }
        assert_eq!(t.stats.malformed, 5);
        assert_eq!(t.slots[5].signals, 0);
        assert_eq!(t.stats.forwarded, 0);
    }

    #[test]
    fn the_fuzz_driver_counts_every_message_once() {
        // size 4, rank 1; a broadcast of root 0 from rank 0 (rank 1's parent), a message
        // for port 1 too long for it, a malformed one, and one for port 2 (no buffer).
        let mut data = vec![3, 1];
        let mut rec = |from: u8, m: Vec<u8>| {
            data.push(from);
            data.push(m.len() as u8);
            data.extend(m);
        };
        rec(0, bcast(0, 0, b"all"));
        rec(2, msg(1, 0, b"too long"));
        rec(2, b"junk".to_vec());
        rec(3, msg(2, 0, b"x"));
        let c = fuzz::handle_all(&data);
        assert_eq!(
            (c.handled, c.delivered, c.malformed, c.errors),
            (4, 1, 1, 2)
        );
        assert_eq!(c.forwarded, 1); // rank 1 of 4 forwards root 0's broadcasts to rank 3
    }

    #[test]
    fn the_fuzz_driver_follows_messages_in_pieces() {
        // The seed: two senders' pieces for one port interleaved with a whole message,
        // a message too long for its port given up by a new start, and a gap.
        let data = include_bytes!("../../../../fuzz/corpus/ports_messages/seed-pieces-interleaved");
        let c = fuzz::handle_all(data);
        assert_eq!(
            (c.handled, c.delivered, c.malformed, c.errors),
            (9, 3, 1, 2)
        );
    }

    #[test]
    fn a_roots_request_for_releases_of_nothing_copied_is_a_control_message() {
        // What the fuzzer found (CI, session 31): a flush-releases request from a root
        // this rank copied nothing from is answered by nothing and counted nowhere; the
        // driver counted it as lost.
        let data = [
            0x07, 0x10, 0x10, 0x10, 0x52, 0x00, 0x00, 0x00, 0xf9, 0x00, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x2e,
            0xff, 0xff,
        ];
        let c = fuzz::handle_all(&data);
        assert_eq!((c.handled, c.control), (2, 1));
    }
}

/// The direct deposit through the table, on real shared memory: a sender of the node
/// (played here through its own mapping of the mailboxes) claims an armed buffer, a
/// message by copy that arrives meanwhile waits for its deposit, bogus notices deliver
/// nothing, and a failed claimant's claim is taken back.
#[cfg(all(test, not(loom)))]
mod deposit_tests {
    use super::tests::{handle, msg, DPID};
    use super::*;
    use crate::ports::deposit::{PeerDeposits, PortBuffer};
    use std::sync::{Arc, Mutex};

    fn job_id() -> u32 {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        0x5d00_0000 ^ std::process::id() << 8 ^ N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Rank 0's table with a shared buffer of 4 KiB on port 1 whose handler records
    /// (sender, bytes); the job id; the records.
    type Records = Arc<Mutex<Vec<(u32, Vec<u8>)>>>;
    fn table_with_a_shared_buffer() -> (Table, u32, Records) {
        let job = job_id();
        let mut t = Table::new(0, 8, DPID);
        t.mailboxes = Some(MailboxArea::create(job, 0, DPID).unwrap());
        t.slots[1].buffer = Some(PortBuffer::create(job, 0, 4096).unwrap().into());
        let got: Records = Arc::default();
        let g = got.clone();
        t.slots[1].handler = Some(Box::new(move |d: &mut Delivery<'_>| {
            g.lock().unwrap().push((d.origin().rank, d.data().to_vec()));
            d.signal();
        }));
        t.arm(1);
        assert!(t.slots[1].armed);
        (t, job, got)
    }

    #[test]
    fn a_deposit_is_delivered_in_place_and_a_copy_that_came_meanwhile_after_it() {
        let (mut t, job, got) = table_with_a_shared_buffer();
        // Rank 2 claims the buffer and writes it; rank 3's message by copy arrives first.
        let peer = PeerDeposits::new(job, DPID);
        assert!(peer.reaches(0));
        let claim = peer
            .with_mailbox(0, 1, |m| m.claim(2, 40))
            .unwrap()
            .unwrap();
        assert!(
            !handle(&mut t, 3, &msg(1, 0, b"by copy")),
            "parked, nobody woken"
        );
        assert_eq!(t.stats.parked, 1);
        assert!(got.lock().unwrap().is_empty());
        assert!(peer.write(0, claim.buffer, &[7; 40]));
        assert!(peer
            .with_mailbox(0, 1, |m| m.deposited(2, claim, 40))
            .unwrap());
        let notice = |generation, len| {
            Deposited {
                dest_port: 1,
                src_port: 4,
                generation,
                len,
            }
            .encode()
        };
        // Notices that do not match the mailbox deliver nothing.
        for (rank, n) in [
            (2, notice(claim.generation + 1, 40)),
            (2, notice(claim.generation, 41)),
            (5, notice(claim.generation, 40)),
        ] {
            handle(&mut t, rank, &n);
        }
        assert_eq!(t.stats.malformed, 3);
        assert!(got.lock().unwrap().is_empty());
        assert!(handle(&mut t, 2, &notice(claim.generation, 40)));
        assert_eq!(
            *got.lock().unwrap(),
            vec![(2, vec![7; 40]), (3, b"by copy".to_vec())],
            "the deposit, then what waited for it"
        );
        assert_eq!(t.stats.deposited, 1);
        assert!(
            !t.slots[1].armed,
            "the last message was short: copied, not armed"
        );
        assert!(handle(&mut t, 3, &msg(1, 0, &[5; 2048])));
        assert!(
            t.slots[1].armed,
            "a long one arrived: armed again after its handler"
        );
        // The same notice again is stale.
        handle(&mut t, 2, &notice(claim.generation, 40));
        assert_eq!(t.stats.malformed, 4);
    }

    #[test]
    fn a_sender_whose_message_waits_keeps_its_order_on_every_port_and_senders_see_the_flag() {
        let (mut t, job, got) = table_with_a_shared_buffer();
        // Port 2: a private buffer whose handler records into the same list.
        t.slots[2].buffer = Some(vec![0; 64].into());
        let g = got.clone();
        t.slots[2].handler = Some(Box::new(move |d: &mut Delivery<'_>| {
            g.lock()
                .unwrap()
                .push((100 + d.origin().rank, d.data().to_vec()));
            d.signal();
        }));
        let peer = PeerDeposits::new(job, DPID);
        assert!(peer.reaches(0));
        assert!(!peer.receiver_parks(0));
        let claim = peer
            .with_mailbox(0, 1, |m| m.claim(2, 16))
            .unwrap()
            .unwrap();
        // Rank 3's first message waits for rank 2's; its second, for another port, waits
        // behind its first; rank 4's message for port 2 goes at once.
        handle(&mut t, 3, &msg(1, 0, b"first"));
        handle(&mut t, 3, &msg(2, 0, b"second"));
        handle(&mut t, 4, &msg(2, 0, b"other"));
        assert_eq!(*got.lock().unwrap(), vec![(104, b"other".to_vec())]);
        assert!(peer.receiver_parks(0), "senders deposit nothing meanwhile");
        // Rank 2 gives its claim back unused: what waited moves on at the next drain.
        assert!(peer.with_mailbox(0, 1, |m| m.abandon(2, claim)).unwrap());
        let mut out = Outbox::new(4);
        assert!(t.drain_parked(&mut out));
        assert_eq!(
            *got.lock().unwrap(),
            vec![
                (104, b"other".to_vec()),
                (3, b"first".to_vec()),
                (103, b"second".to_vec())
            ]
        );
        assert!(!peer.receiver_parks(0));
        assert_eq!(t.stats.parked, 2);
    }

    #[test]
    fn a_failed_claimant_is_taken_back_and_what_waited_is_delivered() {
        let (mut t, job, got) = table_with_a_shared_buffer();
        let peer = PeerDeposits::new(job, DPID);
        assert!(peer.reaches(0));
        let claim = peer.with_mailbox(0, 1, |m| m.claim(6, 8)).unwrap().unwrap();
        handle(&mut t, 3, &msg(1, 0, b"waits"));
        let mut out = Outbox::new(4);
        assert!(t.revoke_claims(6, &mut out));
        assert_eq!(*got.lock().unwrap(), vec![(3, b"waits".to_vec())]);
        assert!(
            !peer
                .with_mailbox(0, 1, |m| m.deposited(6, claim, 8))
                .unwrap(),
            "too late"
        );
        // Closing: nothing is armed any more, and no sender claims.
        assert!(t.close_mailboxes().is_empty());
        t.arm(1);
        assert!(!t.slots[1].armed);
        assert_eq!(
            peer.with_mailbox(0, 1, |m| m.state().tag),
            Some(Tag::Closed)
        );
        assert_eq!(peer.with_mailbox(0, 1, |m| m.claim(2, 8)), Some(None));
    }

    #[test]
    fn a_private_buffer_is_never_armed_and_a_peer_without_mailboxes_is_not_reached() {
        let job = job_id();
        let mut t = Table::new(0, 2, DPID);
        t.mailboxes = Some(MailboxArea::create(job, 0, DPID).unwrap());
        t.slots[1].buffer = Some(vec![0; 64].into());
        t.arm(1);
        assert!(!t.slots[1].armed);
        assert!(!PeerDeposits::new(job, DPID).reaches(1));
        assert!(
            !PeerDeposits::new(job, DPID).write(0, 12345, b"x"),
            "not a buffer number"
        );
    }
}
