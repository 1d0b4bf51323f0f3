//! Receive side of a channel: in-order check and reassembly of Directed Messages.
//!
//! Call [`RxChannel::on_data`] with each data frame of the channel, in arrival order.
//! Guarantees: a message is delivered at most once and only whole; a gap in sequence
//! numbers is reported as lost frames (and any partial message is discarded); a frame
//! from the past is reported as a duplicate and ignored; a message longer than the
//! receiver's maximum is refused, never truncated.

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

    /// Feeds one data frame: its sequence number, flags, the total length announced by a
    /// first fragment, and the message bytes it carries.
    pub fn on_data(
        &mut self,
        seq: u32,
        flags: Flags,
        total_len: Option<u32>,
        data: &[u8],
        max_message: usize,
    ) -> RxOutcome {
        let mut out = RxOutcome::new();
        let ahead = seq.wrapping_sub(self.expected);
        if ahead > u32::MAX / 2 {
            out.duplicate = true;
            return out;
        }
        if ahead > 0 {
            out.lost = ahead;
            self.partial = None;
            self.skipping = false;
        }
        self.expected = seq.wrapping_add(1);

        let first = flags.contains(Flags::FIRST);
        let last = flags.contains(Flags::LAST);
        if first {
            if self.partial.take().is_some() || self.skipping {
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
            let mut buf = Vec::with_capacity(total);
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
            self.partial = None;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fragments;

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
                let o = ch.on_data(*seq, fl, t, &d, 1 << 20);
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
        assert_eq!(ch.on_data(0, *f, *t, d, 1 << 20).delivery, Delivery::None);
        let (f, t, d) = &fr[2];
        let o = ch.on_data(2, *f, *t, d, 1 << 20);
        assert_eq!(o.lost, 1);
        assert_eq!(o.delivery, Delivery::None);
        for (i, (f, t, d)) in fr.iter().enumerate().skip(3) {
            let o = ch.on_data(i as u32, *f, *t, d, 1 << 20);
            assert_eq!(o.delivery, Delivery::None, "partial message delivered");
        }
        // The channel recovers at the next message.
        let o = ch.on_data(
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
            ch.on_data(0, fl, None, b"a", 100).delivery,
            Delivery::InPlace
        );
        let o = ch.on_data(0, fl, None, b"a", 100);
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
            let o = ch.on_data(seq, *f, *t, d, 1000);
            any |= o.oversized;
            assert_eq!(o.delivery, Delivery::None);
            seq += 1;
        }
        assert!(any);
        let o = ch.on_data(seq, Flags::FIRST | Flags::LAST, None, b"next", 1000);
        assert_eq!(o.delivery, Delivery::InPlace);
    }

    #[test]
    fn inconsistent_fragments_are_dropped() {
        let mut ch = RxChannel::new();
        // A middle fragment with no start.
        let o = ch.on_data(0, Flags::EMPTY, None, b"xx", 100);
        assert!(o.malformed);
        // A first fragment announcing 10 bytes followed by a last one carrying 20.
        ch.on_data(1, Flags::FIRST, Some(10), b"abc", 100);
        let o = ch.on_data(2, Flags::LAST, None, &[0; 20], 100);
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
            ch.on_data(u32::MAX, fl, None, b"a", 9).delivery,
            Delivery::InPlace
        );
        let o = ch.on_data(0, fl, None, b"b", 9);
        assert_eq!((o.lost, o.duplicate), (0, false));
    }
}
