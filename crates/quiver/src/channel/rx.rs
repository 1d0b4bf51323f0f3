//! Receive side of a channel: in-order check and reassembly of Directed Messages.
//!
//! Call [`RxChannel::on_data`] with each data frame of the channel, in arrival order.
//! Guarantees: a message is delivered at most once and only whole; a gap in sequence
//! numbers is reported as lost frames (and any partial message is discarded); a frame
//! from the past is reported as a duplicate and ignored; a message longer than the
//! receiver's maximum is refused, never truncated.
//!
//! Multi-fragment messages are assembled in buffers taken from [`SpareBuffers`], where
//! the owner gives them back once the message is released: a stream of long messages
//! then fills memory that is already mapped instead of faulting in fresh pages for every
//! message (filling a fresh 16 MiB buffer took 6.1-7.2 ms here, a mapped one 1.1-1.4 ms:
//! bench/progs/fresh_pages.c).

use crate::wire::Flags;

/// What to do with a data frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Nothing to deliver yet (a fragment was stored, or the frame was dropped).
    None,
    /// The frame holds a whole message: deliver its data where it lies.
    InPlace,
    /// The frame completed a multi-fragment message, reassembled here.
    Assembled(Vec<u8>),
}

/// Result of feeding one frame.
#[derive(Debug, PartialEq, Eq)]
pub struct RxOutcome {
    /// Frames missing before this one (0 normally).
    pub lost: u32,
    /// The frame was a duplicate (ignored).
    pub duplicate: bool,
    /// The frame announced a message larger than the maximum (dropped with its fragments).
    pub oversized: bool,
    /// The frame did not fit the reassembly state (a fragment without its start, a length
    /// that disagrees); dropped.
    pub malformed: bool,
    /// What to deliver.
    pub delivery: Delivery,
}

impl RxOutcome {
    fn new() -> Self {
        RxOutcome {
            lost: 0,
            duplicate: false,
            oversized: false,
            malformed: false,
            delivery: Delivery::None,
        }
    }
}

struct Partial {
    buf: Vec<u8>,
    total: usize,
}

/// Reassembly buffers given back after their messages were released, kept for the next
/// long messages (of any channel of the owner). At most [`SpareBuffers::KEEP`] are kept,
/// each of at least [`SpareBuffers::MIN`] and at most [`SpareBuffers::MAX`] bytes of
/// capacity: smaller ones come cheaply from the allocator's own free lists, and larger
/// ones are not worth holding on to.
#[derive(Default)]
pub struct SpareBuffers {
    spares: Vec<Vec<u8>>,
}

impl SpareBuffers {
    /// Buffers kept at most: one being filled while the application holds the last.
    pub const KEEP: usize = 2;
    /// Smallest capacity kept.
    pub const MIN: usize = 64 << 10;
    /// Largest capacity kept.
    pub const MAX: usize = 64 << 20;

    /// An empty buffer with room for `len` bytes: the smallest spare that has it, else a
    /// new one.
    pub fn take(&mut self, len: usize) -> Vec<u8> {
        let fit = (0..self.spares.len())
            .filter(|&i| self.spares[i].capacity() >= len)
            .min_by_key(|&i| self.spares[i].capacity());
        match fit {
            Some(i) => self.spares.swap_remove(i),
            None => Vec::with_capacity(len),
        }
    }

    /// Keeps `buf` (emptied) for a later message, in place of the smallest spare when
    /// [`KEEP`](Self::KEEP) are kept already; drops it if it is out of bounds or smaller
    /// than every spare kept.
    pub fn give(&mut self, mut buf: Vec<u8>) {
        let cap = buf.capacity();
        if !(Self::MIN..=Self::MAX).contains(&cap) {
            return;
        }
        buf.clear();
        if self.spares.len() < Self::KEEP {
            self.spares.push(buf);
            return;
        }
        if let Some(smallest) = self.spares.iter_mut().min_by_key(|b| b.capacity()) {
            if smallest.capacity() < cap {
                *smallest = buf;
            }
        }
    }

    #[cfg(test)]
    /// Bytes of capacity kept.
    pub fn kept_bytes(&self) -> usize {
        self.spares.iter().map(Vec::capacity).sum()
    }
}

/// Receive state of one channel.
#[derive(Default)]
pub struct RxChannel {
    expected: u32,
    partial: Option<Partial>,
    /// Skipping the remaining fragments of a message that cannot be delivered.
    skipping: bool,
}

impl RxChannel {
    /// A channel expecting sequence number 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a whole message of one frame (`FIRST | LAST`, `len` bytes) with sequence
    /// number `seq` needs nothing of [`on_data`](Self::on_data) but to be delivered in
    /// place: it is the next frame, no message is half assembled or being skipped, and it
    /// is at most `max_message` bytes. Then [`take_whole`](Self::take_whole) takes it.
    #[inline]
    pub fn takes_whole(&self, seq: u32, len: usize, max_message: usize) -> bool {
        seq == self.expected && self.partial.is_none() && !self.skipping && len <= max_message
    }

    /// Takes the message [`takes_whole`](Self::takes_whole) accepted: the state is then
    /// that of `on_data` returning [`Delivery::InPlace`] with no fault counted.
    #[inline]
    pub fn take_whole(&mut self) {
        self.expected = self.expected.wrapping_add(1);
    }

    /// Feeds one data frame: its sequence number, flags, the total length announced by a
    /// first fragment, and the message bytes it carries. A message of several fragments
    /// is assembled in a buffer from `spares` (and a discarded partial one goes back
    /// there).
    pub fn on_data(
        &mut self,
        seq: u32,
        flags: Flags,
        total_len: Option<u32>,
        data: &[u8],
        max_message: usize,
        spares: &mut SpareBuffers,
    ) -> RxOutcome {
        let mut out = RxOutcome::new();
        let ahead = seq.wrapping_sub(self.expected);
        if ahead > u32::MAX / 2 {
            out.duplicate = true;
            return out;
        }
        if ahead > 0 {
            out.lost = ahead;
            self.discard(spares);
            self.skipping = false;
        }
        self.expected = seq.wrapping_add(1);

        let first = flags.contains(Flags::FIRST);
        let last = flags.contains(Flags::LAST);
        if first {
            if self.discard(spares) || self.skipping {
                // A new message began before the previous one ended.
                out.malformed = true;
                self.skipping = false;
            }
            let total = total_len.map_or(data.len(), |t| t as usize);
            if total > max_message {
                out.oversized = true;
                self.skipping = !last;
                return out;
            }
            if last {
                out.delivery = Delivery::InPlace;
                return out;
            }
            if data.len() >= total {
                out.malformed = true;
                return out;
            }
            let mut buf = spares.take(total);
            buf.extend_from_slice(data);
            self.partial = Some(Partial { buf, total });
            return out;
        }
        if self.skipping {
            self.skipping = !last;
            return out;
        }
        let Some(p) = self.partial.as_mut() else {
            // A middle or last fragment whose start was lost or never sent.
            out.malformed = out.lost == 0;
            return out;
        };
        if p.buf.len() + data.len() > p.total || (last && p.buf.len() + data.len() != p.total) {
            out.malformed = true;
            self.discard(spares);
            self.skipping = !last;
            return out;
        }
        p.buf.extend_from_slice(data);
        if last {
            let p = self.partial.take().expect("checked above");
            out.delivery = Delivery::Assembled(p.buf);
        }
        out
    }

    /// Drops the message being assembled, if any (its buffer goes back to `spares`);
    /// true if there was one.
    fn discard(&mut self, spares: &mut SpareBuffers) -> bool {
        match self.partial.take() {
            Some(p) => {
                spares.give(p.buf);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fragments;

    /// `on_data` with no spare buffers to reuse.
    fn on(
        ch: &mut RxChannel,
        seq: u32,
        flags: Flags,
        total: Option<u32>,
        data: &[u8],
        max: usize,
    ) -> RxOutcome {
        ch.on_data(seq, flags, total, data, max, &mut SpareBuffers::default())
    }

    /// Splits `msg` as the sender does and feeds the fragments, returning the deliveries.
    fn frames(msg: &[u8], max_datagram: usize) -> Vec<(Flags, Option<u32>, Vec<u8>)> {
        fragments(msg.len(), max_datagram)
            .map(|f| {
                let total = f.length_prefix.then_some(msg.len() as u32);
                (f.flags, total, msg[f.offset..f.offset + f.len].to_vec())
            })
            .collect()
    }

    fn deliver(ch: &mut RxChannel, seq: &mut u32, msg: &[u8], max_dgram: usize) -> Vec<RxOutcome> {
        frames(msg, max_dgram)
            .into_iter()
            .map(|(fl, t, d)| {
                let o = on(ch, *seq, fl, t, &d, 1 << 20);
                *seq += 1;
                o
            })
            .collect()
    }

    #[test]
    fn single_and_multi_fragment_messages_arrive_whole() {
        let mut ch = RxChannel::new();
        let mut seq = 0;
        let out = deliver(&mut ch, &mut seq, b"hello", 1472);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].delivery, Delivery::InPlace);
        let big: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let out = deliver(&mut ch, &mut seq, &big, 1472);
        assert!(out.len() > 1);
        assert!(out[..out.len() - 1]
            .iter()
            .all(|o| o.delivery == Delivery::None));
        assert_eq!(out.last().unwrap().delivery, Delivery::Assembled(big));
        assert!(out.iter().all(|o| o.lost == 0 && !o.malformed));
    }

    #[test]
    fn gap_is_reported_and_partial_message_dropped() {
        let mut ch = RxChannel::new();
        let big = vec![7u8; 5000];
        let fr = frames(&big, 1472);
        assert!(fr.len() >= 4);
        // Deliver fragment 0, lose fragment 1, deliver the rest.
        let (f, t, d) = &fr[0];
        assert_eq!(on(&mut ch, 0, *f, *t, d, 1 << 20).delivery, Delivery::None);
        let (f, t, d) = &fr[2];
        let o = on(&mut ch, 2, *f, *t, d, 1 << 20);
        assert_eq!(o.lost, 1);
        assert_eq!(o.delivery, Delivery::None);
        for (i, (f, t, d)) in fr.iter().enumerate().skip(3) {
            let o = on(&mut ch, i as u32, *f, *t, d, 1 << 20);
            assert_eq!(o.delivery, Delivery::None, "partial message delivered");
        }
        // The channel recovers at the next message.
        let o = on(
            &mut ch,
            fr.len() as u32,
            Flags::FIRST | Flags::LAST,
            None,
            b"ok",
            1 << 20,
        );
        assert_eq!(o.delivery, Delivery::InPlace);
        assert_eq!(o.lost, 0);
    }

    #[test]
    fn duplicates_are_ignored() {
        let mut ch = RxChannel::new();
        let fl = Flags::FIRST | Flags::LAST;
        assert_eq!(
            on(&mut ch, 0, fl, None, b"a", 100).delivery,
            Delivery::InPlace
        );
        let o = on(&mut ch, 0, fl, None, b"a", 100);
        assert!(o.duplicate);
        assert_eq!(o.delivery, Delivery::None);
    }

    #[test]
    fn oversized_message_is_refused_not_truncated() {
        let mut ch = RxChannel::new();
        let big = vec![1u8; 4000];
        let fr = frames(&big, 1472);
        let mut seq = 0;
        let mut any = false;
        for (f, t, d) in &fr {
            let o = on(&mut ch, seq, *f, *t, d, 1000);
            any |= o.oversized;
            assert_eq!(o.delivery, Delivery::None);
            seq += 1;
        }
        assert!(any);
        let o = on(
            &mut ch,
            seq,
            Flags::FIRST | Flags::LAST,
            None,
            b"next",
            1000,
        );
        assert_eq!(o.delivery, Delivery::InPlace);
    }

    #[test]
    fn inconsistent_fragments_are_dropped() {
        let mut ch = RxChannel::new();
        // A middle fragment with no start.
        let o = on(&mut ch, 0, Flags::EMPTY, None, b"xx", 100);
        assert!(o.malformed);
        // A first fragment announcing 10 bytes followed by a last one carrying 20.
        on(&mut ch, 1, Flags::FIRST, Some(10), b"abc", 100);
        let o = on(&mut ch, 2, Flags::LAST, None, &[0; 20], 100);
        assert!(o.malformed);
        assert_eq!(o.delivery, Delivery::None);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut ch = RxChannel {
            expected: u32::MAX,
            ..Default::default()
        };
        let fl = Flags::FIRST | Flags::LAST;
        assert_eq!(
            on(&mut ch, u32::MAX, fl, None, b"a", 9).delivery,
            Delivery::InPlace
        );
        let o = on(&mut ch, 0, fl, None, b"b", 9);
        assert_eq!((o.lost, o.duplicate), (0, false));
    }

    /// Feeds `msg` split as the sender does, with `spares`; returns the last outcome.
    fn deliver_with(
        ch: &mut RxChannel,
        seq: &mut u32,
        msg: &[u8],
        spares: &mut SpareBuffers,
    ) -> RxOutcome {
        let mut last = None;
        for (fl, t, d) in frames(msg, 1472) {
            last = Some(ch.on_data(*seq, fl, t, &d, 1 << 24, spares));
            *seq += 1;
        }
        last.expect("at least one fragment")
    }

    #[test]
    fn a_released_buffer_assembles_the_next_long_message() {
        let mut ch = RxChannel::new();
        let mut spares = SpareBuffers::default();
        let mut seq = 0;
        let first: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let Delivery::Assembled(buf) =
            deliver_with(&mut ch, &mut seq, &first, &mut spares).delivery
        else {
            panic!("not assembled");
        };
        assert_eq!(buf, first);
        let at = buf.as_ptr();
        spares.give(buf);
        assert!(spares.kept_bytes() >= first.len());
        // A shorter message fits in the same memory, and arrives whole.
        let second = vec![9u8; 150_000];
        let Delivery::Assembled(buf) =
            deliver_with(&mut ch, &mut seq, &second, &mut spares).delivery
        else {
            panic!("not assembled");
        };
        assert_eq!(buf.as_ptr(), at, "the spare was not reused");
        assert_eq!(buf, second);
        assert_eq!(spares.kept_bytes(), 0);
    }

    #[test]
    fn a_discarded_partial_message_gives_its_buffer_back() {
        let mut ch = RxChannel::new();
        let mut spares = SpareBuffers::default();
        let big = vec![3u8; 100_000];
        let fr = frames(&big, 1472);
        let (f, t, d) = &fr[0];
        ch.on_data(0, *f, *t, d, 1 << 20, &mut spares);
        assert_eq!(spares.kept_bytes(), 0);
        // Fragment 1 is lost: the partial message is dropped, its buffer kept.
        let (f, t, d) = &fr[2];
        let o = ch.on_data(2, *f, *t, d, 1 << 20, &mut spares);
        assert_eq!(o.lost, 1);
        assert!(spares.kept_bytes() >= big.len());
    }

    #[test]
    fn spares_keep_the_largest_few_within_bounds() {
        let mut spares = SpareBuffers::default();
        spares.give(Vec::with_capacity(SpareBuffers::MIN - 1));
        spares.give(Vec::with_capacity(SpareBuffers::MAX + 1));
        assert_eq!(spares.kept_bytes(), 0, "out of bounds kept");
        let sizes = [1 << 17, 1 << 20, 1 << 18];
        for n in sizes {
            let mut b = Vec::with_capacity(n);
            b.extend_from_slice(&[1, 2, 3]);
            spares.give(b);
        }
        assert_eq!(spares.spares.len(), SpareBuffers::KEEP);
        assert!(spares.spares.iter().all(|b| b.is_empty()));
        let caps: Vec<usize> = spares.spares.iter().map(Vec::capacity).collect();
        assert!(
            caps.iter().all(|&c| c >= 1 << 18),
            "the smallest was kept: {caps:?}"
        );
        // take: the smallest that fits, else a fresh buffer.
        assert!(spares.take(1 << 18).capacity() < 1 << 20);
        assert!(spares.take(1 << 21).capacity() >= 1 << 21);
        assert_eq!(spares.spares.len(), 1);
    }
}
