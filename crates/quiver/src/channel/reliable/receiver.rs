//! Receive side of a reliable channel: sequence check, duplicate and out-of-order
//! detection, credits, and the acknowledgement policy.
//!
//! Guarantees: [`Receiver::poll_deliver`] hands out frames in sequence order, each at
//! most once; in the retransmitting modes with no frame skipped. The receiver never
//! accepts a frame at or beyond its credit limit (`expected - held + W`), so it never
//! holds more than W buffers for its sender. Frames it does not keep are given back to
//! the caller at once, so the caller can free their buffers.
//!
//! Acknowledgement policy (retransmitting modes): an acknowledgement goes back
//! piggybacked on any frame to the peer; explicitly after W/2 frames arrived since the
//! last one (half-window), when the acknowledgement timer started by the first
//! unacknowledged frame expires (delayed, [`Config::ack_delay`]), at once when a frame
//! arrives out of order (with the bitmap: for the first such frame, and under selective
//! repeat for every one that opens a new hole), and in reply to a probe. In every mode,
//! credits go back explicitly once W/2 buffers were released since the last update.

use std::collections::VecDeque;
use std::time::Duration;

use super::{
    seq_ahead, AckReason, AckSent, AckStamp, ChannelError, Config, ConfigError, Counters, Recovery,
    Sack, Time,
};
use crate::wire::Flags;

/// Frames the go-back-N bitmap covers beyond the cumulative ack.
const SACK_BITS: u32 = Sack::BLOCK;

/// The receive side of one channel. `B` is the caller's handle for a received datagram
/// (a slot of the endpoint's receive pool, or the datagram itself); the receiver never
/// looks inside it.
///
/// Call order:
///
/// 1. For each valid frame from the peer: [`handle_data`](Self::handle_data) for `Data`,
///    [`handle_probe`](Self::handle_probe) for `Heartbeat`; for a frame from the peer that
///    failed its checksum or decoding, [`handle_corrupt`](Self::handle_corrupt);
///    [`handle_release`](Self::handle_release) when the application frees buffers of
///    delivered frames; [`handle_timeout`](Self::handle_timeout) when the time passes
///    [`poll_timeout`](Self::poll_timeout).
/// 2. Then [`poll_deliver`](Self::poll_deliver) and [`poll_error`](Self::poll_error)
///    until `None`.
/// 3. Whenever a frame leaves for the peer, put [`ack_stamp`](Self::ack_stamp) in it
///    and call [`on_ack_sent`](Self::on_ack_sent); if [`ack_due`](Self::ack_due) is
///    still `Some`, send an explicit `Ack` (with [`sack_bitmap`](Self::sack_bitmap)).
/// 4. Then [`poll_timeout`](Self::poll_timeout) to arm the caller's timer.
pub struct Receiver<B> {
    retransmit: bool,
    selective: bool,
    window: u32,
    half: u32,
    ack_delay: Duration,

    /// Next sequence number expected: the cumulative acknowledgement.
    expected: u32,
    /// Frames accepted and not yet released by the application.
    held: u32,
    /// Credit limit last sent to the peer.
    advertised: u32,
    /// Acknowledgement last sent to the peer.
    last_ack: u32,
    /// Frames accepted since the last acknowledgement went out.
    rx_since_ack: u32,
    due: Option<AckReason>,
    ack_deadline: Option<Time>,
    /// `expected` when the last immediate out-of-order acknowledgement was asked for.
    ooo_acked_for: Option<u32>,
    /// Go-back-N: frames seen (and dropped) beyond `expected`, as a bitmap.
    seen: u32,
    /// Selective repeat: out-of-order frames kept, at index `seq % W`.
    ring: Vec<Option<B>>,
    deliver: VecDeque<B>,
    errors: VecDeque<ChannelError>,
    counters: Counters,
}

impl<B> Receiver<B> {
    /// A receiver expecting sequence number 0 with W = `cfg.window` buffers free.
    pub fn new(cfg: &Config) -> Result<Receiver<B>, ConfigError> {
        cfg.validate()?;
        let window = u32::from(cfg.window);
        let selective = cfg.mode.retransmits() && cfg.recovery == Recovery::Selective;
        Ok(Receiver {
            retransmit: cfg.mode.retransmits(),
            selective,
            window,
            half: (window / 2).max(1),
            ack_delay: cfg.ack_delay,
            expected: 0,
            held: 0,
            advertised: window,
            last_ack: 0,
            rx_since_ack: 0,
            due: None,
            ack_deadline: None,
            ooo_acked_for: None,
            seen: 0,
            // A power of two at least the window long, indexed by the sequence number's
            // low bits: its length divides 2^32, so frames a window apart never share a
            // slot, across the wrap of the sequence numbers too (`seq % window` did
            // for a window that is not a power of two).
            ring: if selective {
                (0..window.next_power_of_two()).map(|_| None).collect()
            } else {
                Vec::new()
            },
            deliver: VecDeque::new(),
            errors: VecDeque::new(),
            counters: Counters::default(),
        })
    }

    /// Starts the sequence numbers at `seq` (both ends must agree; for tests of wrapping).
    #[cfg(test)]
    pub(crate) fn start_at(&mut self, seq: u32) {
        self.expected = seq;
        self.last_ack = seq;
        self.advertised = seq.wrapping_add(self.window);
    }

    /// Takes in a `Data` frame with sequence number `seq` whose integrity the caller
    /// checked. Returns `None` if the receiver keeps `buf` (it comes back out of
    /// [`poll_deliver`](Self::poll_deliver), in order), or `Some(buf)` if the frame is
    /// dropped: a duplicate, an out-of-order frame under go-back-N, or a frame beyond the
    /// window.
    ///
    /// In [`Mode::None`](super::Mode::None) a frame ahead of the expected one is kept and
    /// the frames skipped are reported as [`ChannelError::Lost`].
    pub fn handle_data(&mut self, now: Time, seq: u32, buf: B) -> Option<B> {
        let Some(off) = seq_ahead(self.expected, seq) else {
            self.counters.duplicates += 1;
            if self.retransmit {
                // The sender missed the acknowledgement, or probes a silent tail: it is
                // waiting for one, now.
                self.want(AckReason::Duplicate);
            }
            return Some(buf);
        };
        if off >= self.window - self.held.min(self.window) {
            self.counters.overruns += 1;
            if !self.retransmit {
                self.errors.push_back(ChannelError::Overrun { seq });
            }
            return Some(buf);
        }
        if off == 0 {
            self.accept(buf);
            if self.selective {
                self.drain_ring();
            }
            if self.retransmit {
                if self.rx_since_ack >= self.half {
                    self.want(AckReason::HalfWindow);
                } else {
                    self.arm_ack_timer(now);
                }
            }
            return None;
        }
        if !self.retransmit {
            self.report_lost(off);
            self.expected = seq;
            self.accept(buf);
            return None;
        }
        let mut new_hole = false;
        let dropped = if self.selective {
            let slot = self.slot_of(seq);
            // The frame before this one is missing too: a hole the sender may not know of.
            let before = self.slot_of(seq.wrapping_sub(1));
            new_hole = off > 1 && self.ring.get(before).is_some_and(Option::is_none);
            match self.ring.get_mut(slot) {
                Some(s @ None) => {
                    *s = Some(buf);
                    self.counters.out_of_order += 1;
                    None
                }
                _ => {
                    // Held already: a probe of the tail; the acknowledgement (with the
                    // bitmap) goes at once.
                    self.counters.duplicates += 1;
                    self.due = Some(AckReason::OutOfOrder);
                    return Some(buf);
                }
            }
        } else {
            self.counters.out_of_order += 1;
            if off <= SACK_BITS {
                self.seen |= 1 << (off - 1);
            }
            Some(buf)
        };
        if self.ooo_acked_for != Some(self.expected) || new_hole {
            self.ooo_acked_for = Some(self.expected);
            self.due = Some(AckReason::OutOfOrder);
        } else {
            self.arm_ack_timer(now);
        }
        dropped
    }

    /// Whether [`take_in_order`](Self::take_in_order) applies to a `Data` frame with
    /// sequence number `seq`: it is the next one expected, the window has room for it,
    /// nothing waits to be delivered, and no frame held out of order follows it.
    #[inline]
    pub fn takes_in_order(&self, seq: u32) -> bool {
        seq == self.expected
            && self.held < self.window
            && self.deliver.is_empty()
            && !(self.selective
                && self
                    .ring
                    .get(self.slot_of(seq.wrapping_add(1)))
                    .is_some_and(Option::is_some))
    }

    /// Takes in the frame [`takes_in_order`](Self::takes_in_order) accepted, and delivers
    /// it at once: the state after it is that of [`handle_data`](Self::handle_data)
    /// followed by the [`poll_deliver`](Self::poll_deliver) that returns its buffer, so
    /// the caller hands the frame on itself without queueing it. (Header prediction on
    /// the receive side: the common case of a frame in order.)
    #[inline]
    pub fn take_in_order(&mut self, now: Time) {
        debug_assert!(self.deliver.is_empty() && self.held < self.window);
        self.expected = self.expected.wrapping_add(1);
        self.held += 1;
        self.rx_since_ack += 1;
        self.seen = 0;
        self.counters.delivered += 1;
        if self.retransmit {
            if self.rx_since_ack >= self.half {
                self.want(AckReason::HalfWindow);
            } else {
                self.arm_ack_timer(now);
            }
        }
    }

    /// Takes in a probe (`Heartbeat`) whose `seq` field is the sender's next sequence
    /// number, and asks for an acknowledgement in reply. In
    /// [`Mode::None`](super::Mode::None) frames before `next_seq` that never arrived are
    /// reported as [`ChannelError::Lost`] (a lost tail).
    pub fn handle_probe(&mut self, _now: Time, next_seq: u32) {
        if !self.retransmit {
            if let Some(gap) = seq_ahead(self.expected, next_seq).filter(|&g| g > 0) {
                if gap <= self.window - self.held.min(self.window) {
                    self.report_lost(gap);
                    self.expected = next_seq;
                } else {
                    self.counters.overruns += 1;
                    self.errors
                        .push_back(ChannelError::Overrun { seq: next_seq });
                }
            }
        }
        self.want(AckReason::ProbeReply);
    }

    /// A datagram from the peer failed its checksum or did not decode: counted and, in
    /// [`Mode::None`](super::Mode::None), reported as [`ChannelError::Corrupt`]. (The
    /// retransmitting modes repair it like a loss.)
    pub fn handle_corrupt(&mut self, _now: Time) {
        self.counters.checksum_failures += 1;
        if !self.retransmit {
            self.errors.push_back(ChannelError::Corrupt);
        }
    }

    /// The application released `n` buffers of delivered frames (its tokens). Returns
    /// how many were held (a larger `n` is clamped). Credits go back explicitly once W/2
    /// were released since the last update.
    pub fn handle_release(&mut self, _now: Time, n: u32) -> u32 {
        let n = n.min(self.held);
        self.held -= n;
        if n > 0 && self.limit().wrapping_sub(self.advertised) >= self.half {
            self.want(AckReason::Credit);
        }
        n
    }

    /// Fires the acknowledgement timer if its deadline has passed.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.ack_deadline.is_some_and(|d| d <= now) {
            self.ack_deadline = None;
            self.want(AckReason::Delayed);
        }
    }

    /// The next frame in order, to hand to the message layer.
    pub fn poll_deliver(&mut self) -> Option<B> {
        self.deliver.pop_front()
    }

    /// Every buffer the receiver keeps: frames held out of order and frames waiting for
    /// [`poll_deliver`](Self::poll_deliver). For a caller that must move a buffer to
    /// other memory (a packet ring that came round to it); the receiver never looks
    /// inside them.
    pub fn kept_mut(&mut self) -> impl Iterator<Item = &mut B> {
        self.ring
            .iter_mut()
            .flatten()
            .chain(self.deliver.iter_mut())
    }

    /// The next error to report.
    pub fn poll_error(&mut self) -> Option<ChannelError> {
        self.errors.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) has work (the acknowledgement timer).
    pub fn poll_timeout(&self) -> Option<Time> {
        self.ack_deadline
    }

    /// The acknowledgement fields for the next frame to the peer.
    pub fn ack_stamp(&self) -> AckStamp {
        AckStamp {
            ack: self.expected,
            // At most W <= MAX_WINDOW, so it fits.
            credits: u16::try_from(self.limit().wrapping_sub(self.expected)).unwrap_or(0),
        }
    }

    /// The selective acknowledgement: under selective repeat, the block of 32 frames
    /// that holds the first frame kept after the hole at `ack` (so that a hole longer
    /// than a block is reported too), bit `i` saying frame `ack + 1 + offset + i`
    /// arrived; under go-back-N the frames seen (and dropped) in the first block.
    pub fn sack_bitmap(&self) -> Sack {
        if !self.selective {
            return Sack {
                offset: 0,
                bits: self.seen,
            };
        }
        let reach = (Sack::BLOCK * Flags::SACK_BLOCKS).min(self.window.saturating_sub(1));
        let held = |i: u32| {
            let slot = self.slot_of(self.expected.wrapping_add(1 + i));
            self.ring.get(slot).is_some_and(Option::is_some)
        };
        let Some(first) = (0..reach).find(|&i| held(i)) else {
            return Sack::default();
        };
        let offset = first / Sack::BLOCK * Sack::BLOCK;
        let bits = (0..Sack::BLOCK.min(reach - offset))
            .filter(|&i| held(offset + i))
            .fold(0, |b, i| b | 1 << i);
        Sack { offset, bits }
    }

    /// Whether (and why) an explicit acknowledgement should be sent now.
    pub fn ack_due(&self) -> Option<AckReason> {
        self.due
    }

    /// Makes a pending acknowledgement due now instead of at its timer (the application
    /// is about to stop making progress).
    pub fn flush_ack(&mut self) {
        if self.due.is_none() && self.ack_pending() {
            self.due = Some(AckReason::Flush);
        }
    }

    /// An acknowledgement ([`ack_stamp`](Self::ack_stamp)) left for the peer. A
    /// piggybacked one satisfies every reason but [`AckReason::OutOfOrder`], whose bitmap
    /// needs an explicit frame.
    pub fn on_ack_sent(&mut self, _now: Time, how: AckSent) {
        match how {
            AckSent::Piggybacked => {
                if self.ack_pending() {
                    self.counters.acks_piggybacked += 1;
                }
                if self.due != Some(AckReason::OutOfOrder) {
                    self.due = None;
                }
            }
            AckSent::Explicit => {
                self.counters.acks_explicit += 1;
                match self.due {
                    Some(AckReason::Delayed) => self.counters.acks_delayed += 1,
                    Some(AckReason::HalfWindow | AckReason::Credit) => {
                        self.counters.acks_half_window += 1;
                    }
                    _ => {}
                }
                self.due = None;
            }
        }
        self.last_ack = self.expected;
        self.advertised = self.limit();
        self.rx_since_ack = 0;
        self.ack_deadline = None;
    }

    /// The next sequence number expected.
    pub fn expected(&self) -> u32 {
        self.expected
    }

    /// Buffers of accepted frames not yet released.
    pub fn held(&self) -> u32 {
        self.held
    }

    /// The counters of the receive side.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The credit limit: released frames plus W.
    fn limit(&self) -> u32 {
        self.expected
            .wrapping_sub(self.held)
            .wrapping_add(self.window)
    }

    fn ack_pending(&self) -> bool {
        self.expected != self.last_ack
            || self.limit() != self.advertised
            || self.due.is_some()
            || self.ack_deadline.is_some()
    }

    fn accept(&mut self, buf: B) {
        self.expected = self.expected.wrapping_add(1);
        self.held += 1;
        self.rx_since_ack += 1;
        self.seen = 0;
        self.counters.delivered += 1;
        self.deliver.push_back(buf);
    }

    /// The ring slot of frame `seq` (selective repeat).
    #[inline]
    fn slot_of(&self, seq: u32) -> usize {
        seq as usize & self.ring.len().wrapping_sub(1)
    }

    fn drain_ring(&mut self) {
        loop {
            let slot = self.slot_of(self.expected);
            match self.ring.get_mut(slot).and_then(Option::take) {
                Some(buf) => self.accept(buf),
                None => break,
            }
        }
    }

    fn report_lost(&mut self, count: u32) {
        self.counters.lost += u64::from(count);
        self.errors.push_back(ChannelError::Lost {
            first: self.expected,
            count,
        });
    }

    fn want(&mut self, reason: AckReason) {
        if self.due.is_none() {
            self.due = Some(reason);
        }
    }

    fn arm_ack_timer(&mut self, now: Time) {
        if self.ack_deadline.is_none() {
            self.ack_deadline = Some(now + self.ack_delay);
        }
    }
}
