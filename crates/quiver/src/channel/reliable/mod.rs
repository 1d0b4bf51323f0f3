//! Reliable, flow-controlled channels: the reliability schemes of LCI (RX_no, RX_h,
//! RX_ni) as sans-IO state machines.
//!
//! This module owns the per-peer protocol state of the network path: sequence numbers,
//! credits, acknowledgements, retransmission and the timers that drive them. It does no
//! I/O and reads no clock: frames and the current [`Time`] go in, frames, deadlines,
//! in-order deliveries and [`Event`]s come out. The message layer (fragmentation with
//! [`wire::fragments`](crate::wire::fragments), reassembly with
//! [`RxChannel`](super::RxChannel)) sits on top: the state machines here work on frames,
//! each carrying one Directed Message fragment, and hand received frames back in order.
//!
//! The pieces:
//!
//! - [`Sender`]: the send side of one channel: builds frames (one copy of the caller's
//!   data), queues them while the window is closed (the blocked-sends queue: never
//!   drops), keeps them until acknowledged when the mode retransmits, and resends the very
//!   same buffers (no extra copy) on a timeout or a selective acknowledgement.
//! - [`Receiver`]: the receive side: sequence check, duplicate and out-of-order
//!   detection, credits, and the acknowledgement policy (piggybacked, half-window,
//!   delayed, immediate on out-of-order).
//! - [`Duplex`]: one endpoint's state for one peer: a `Sender` for the outgoing channel
//!   and a `Receiver` for the incoming one, with acknowledgements and credits of the
//!   incoming channel piggybacked on the frames of the outgoing one. This is what the
//!   engine drives.
//! - [`Config`], [`Mode`], [`Recovery`]: the run-time choice of scheme
//!   (`QUIVER_RELIABILITY=none|host|offload`) and its parameters.
//!
//! # The protocol on the wire
//!
//! Every frame uses the 32-byte header of [`wire`](crate::wire):
//!
//! - `Data`: `seq` is the frame's sequence number (consecutive per channel, wrapping);
//!   `ack` and `credits` acknowledge the reverse channel (piggybacked).
//! - `Ack` (explicit acknowledgement): `ack` is cumulative (every frame before it was
//!   received), `credits` is the number of frames from `ack` on that the receiver can
//!   take, so the sender may send frames before `ack + credits`; `seq` is reused as a
//!   selective-acknowledgement bitmap: bit `i` says frame `ack + 1 + 32k + i` arrived
//!   (kept under [`Recovery::Selective`], seen and dropped under go-back-N), where `k`
//!   is the block the flags name ([`Sack`]): the receiver reports the block of the first
//!   frame it holds after the hole, so that a hole is seen at once up to 256 frames (or
//!   the window less one, when smaller).
//! - `Heartbeat` (probe): `seq` is the sender's next sequence number, so a receiver
//!   learns of frames lost at the tail of a burst; the receiver answers with an `Ack`.
//!
//! Liveness uses no frame kind of its own: a side that has sent nothing to its peer for
//! [`Config::heartbeat`] sends an `Ack` with its current acknowledgement and credits and
//! an empty bitmap (a liveness heartbeat: it repeats what the peer already knows, asks
//! for no reply and never triggers a repair). Any valid frame from the peer shows it is
//! alive; after [`Config::peer_timeout`] without one the channel fails with
//! [`ChannelError::Silent`]. (The `Heartbeat` kind is the sender's probe above, which
//! asks for a reply; the liveness heartbeat is not a probe.)
//!
//! The credit limit `ack + credits` equals the receiver's released frames plus W: it
//! never moves backwards, so the sender takes the largest limit it has seen and stale or
//! duplicated acknowledgements are harmless.
//!
//! # Guarantees
//!
//! - [`Mode::Host`] / [`Mode::Offload`]: every frame is delivered exactly once and in
//!   order, or the sender reports [`ChannelError::Unreachable`] after
//!   [`Config::max_timeouts`] consecutive timeouts without progress.
//! - [`Mode::None`]: frames are delivered in order, never twice; a gap (loss or
//!   reordering) is reported as [`ChannelError::Lost`], a checksum failure as
//!   [`ChannelError::Corrupt`], within a bounded time (the sender's probe detects a lost
//!   tail). Nothing is retransmitted.
//! - All modes, with [`Config::peer_timeout`] set: a peer from which no valid frame
//!   arrived for that long is reported once as [`ChannelError::Silent`] and the channel
//!   fails, idle or not; a channel whose peer said goodbye ([`Event::PeerClosed`]) never
//!   does, nor sends heartbeats.
//! - All modes: a sender whose window is closed queues, never drops; no input from the
//!   peer makes a state machine panic; sequence numbers wrap.

mod config;
mod duplex;
mod receiver;
mod sender;
mod time;

use std::time::Duration;

#[cfg(test)]
mod harness;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;

pub use config::{Config, ConfigError, Mode, ModeParseError, Recovery, MAX_WINDOW};
pub use duplex::Duplex;
pub use receiver::Receiver;
pub use sender::{PartialSend, Sender, TxFrame};
pub(crate) use time::earliest;
pub use time::Time;

/// The acknowledgement fields a frame carries for the reverse channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckStamp {
    /// Cumulative acknowledgement: the next sequence number the receiver expects.
    pub ack: u32,
    /// Frames from `ack` on that the receiver has buffers for.
    pub credits: u16,
}

/// A selective acknowledgement: bit `i` of `bits` says frame `ack + 1 + offset + i`
/// arrived (`offset` is 32 times the header's [`Flags::SACK_BLOCK`](crate::wire::Flags)
/// number). Frames from `ack` to the highest one reported that are not reported are
/// missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sack {
    /// Frames between `ack + 1` and the frame of bit 0 (a multiple of [`Sack::BLOCK`]).
    pub offset: u32,
    /// Bit `i`: frame `ack + 1 + offset + i` arrived.
    pub bits: u32,
}

impl Sack {
    /// Frames of one block.
    pub const BLOCK: u32 = 32;

    /// The selective acknowledgement of a frame with these flags and sequence field.
    pub fn of(flags: crate::wire::Flags, seq: u32) -> Sack {
        Sack {
            offset: flags.sack_block() * Self::BLOCK,
            bits: seq,
        }
    }

    /// Whether it reports any frame.
    pub fn is_empty(&self) -> bool {
        self.bits == 0
    }

    /// Whether frame `ack + 1 + i` is reported received.
    pub fn reports(&self, i: u32) -> bool {
        i >= self.offset && i - self.offset < 32 && self.bits & (1 << (i - self.offset)) != 0
    }

    /// How many frames after `ack` lie up to the highest reported one (0 when none is
    /// reported): every one of them not reported is missing, and so is `ack`.
    pub fn reach(&self) -> u32 {
        if self.bits == 0 {
            0
        } else {
            self.offset + 32 - self.bits.leading_zeros()
        }
    }

    /// The frames it says are missing: `ack`, and every frame after it up to the highest
    /// reported that is not reported. None when it reports nothing.
    pub fn missing(self, ack: u32) -> impl Iterator<Item = u32> {
        let reach = self.reach();
        let first = (reach > 0).then_some(ack);
        first.into_iter().chain(
            (0..reach)
                .filter(move |&i| !self.reports(i))
                .map(move |i| ack.wrapping_add(1 + i)),
        )
    }
}

#[cfg(test)]
mod sack_tests {
    use super::Sack;

    #[test]
    fn missing_frames_run_from_the_ack_to_the_highest_reported() {
        let none = Sack::default();
        assert_eq!(none.missing(7).count(), 0);
        // Block 0: frames 8 and 10 (ack 7 + 1 + 0, + 2) arrived: 7 and 9 are missing.
        let near = Sack {
            offset: 0,
            bits: 0b101,
        };
        assert_eq!(near.missing(7).collect::<Vec<_>>(), vec![7, 9]);
        // Block 1: frame 7 + 1 + 33 arrived: 7 to 40 are missing.
        let far = Sack {
            offset: 32,
            bits: 0b10,
        };
        assert_eq!(
            far.missing(7).collect::<Vec<_>>(),
            (7..=40).collect::<Vec<_>>()
        );
        assert!(far.reports(33) && !far.reports(32) && !far.reports(65));
        // Sequence numbers wrap.
        assert_eq!(
            near.missing(u32::MAX).collect::<Vec<_>>(),
            vec![u32::MAX, 1]
        );
    }
}

/// Why the receiver wants an explicit acknowledgement sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckReason {
    /// W/2 frames arrived since the last acknowledgement (half-window).
    HalfWindow,
    /// The acknowledgement timer expired (delayed acknowledgement).
    Delayed,
    /// A frame arrived out of order: tell the sender at once (with the bitmap).
    OutOfOrder,
    /// W/2 buffers were released since the last credit update.
    Credit,
    /// The sender probed (a `Heartbeat`).
    ProbeReply,
    /// A frame arrived again: the sender resent it after a timeout or as a tail probe,
    /// and waits for an acknowledgement.
    Duplicate,
    /// The application asked for pending acknowledgements to go now (a flush before it
    /// stops making progress).
    Flush,
}

/// How an acknowledgement left: on a frame that went anyway, or as an `Ack` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckSent {
    /// In the header of a `Data` or `Heartbeat` frame.
    Piggybacked,
    /// As an explicit `Ack` frame.
    Explicit,
}

/// An error on a channel. [`Lost`](Self::Lost), [`Corrupt`](Self::Corrupt) and
/// [`Overrun`](Self::Overrun) are reported by the receiving side and the channel goes on
/// with the next frame; [`Unreachable`](Self::Unreachable) is reported by the sending
/// side and [`Silent`](Self::Silent) by the [`Duplex`]; either ends it (the peer failed),
/// and a channel reports at most one of them, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// Frames never arrived ([`Mode::None`]): a gap in sequence numbers.
    #[error("{count} frame(s) lost from sequence number {first}")]
    Lost {
        /// Sequence number of the first missing frame.
        first: u32,
        /// Number of missing frames.
        count: u32,
    },
    /// A frame from the peer failed its checksum or did not decode ([`Mode::None`]).
    #[error("a corrupted frame arrived")]
    Corrupt,
    /// The peer sent beyond the credits it was given: the frame was dropped.
    #[error("frame {seq} arrived beyond the receive window (the peer ignores flow control)")]
    Overrun {
        /// Its sequence number.
        seq: u32,
    },
    /// The peer stopped answering: this many consecutive timeouts without progress.
    #[error("peer unreachable: no progress after {timeouts} consecutive timeouts")]
    Unreachable {
        /// Consecutive timeouts counted.
        timeouts: u32,
    },
    /// Nothing at all was heard from the peer for [`Config::peer_timeout`]: no frame, not
    /// even a heartbeat.
    #[error("peer silent: nothing heard from it for {silence:?}")]
    Silent {
        /// How long it had been silent when this was noticed (at least the peer timeout).
        silence: Duration,
    },
}

/// Something a [`Duplex`] reports besides deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// An error on the channel.
    Error(ChannelError),
    /// The peer sent `Goodbye`: it is closing.
    PeerClosed,
}

/// What [`Sender::send`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStatus {
    /// Every frame of the message fits in the window: it goes out at the next
    /// `poll_transmit`.
    Ready,
    /// The window is closed for some of its frames: they wait on the blocked-sends queue
    /// until credits come back (a credit stall, counted).
    Blocked,
}

/// Why [`Sender::send`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The message is longer than a Directed Message can be.
    #[error("message of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The channel failed ([`ChannelError::Unreachable`] or [`ChannelError::Silent`] was
    /// reported).
    #[error("the channel failed: the peer is unreachable")]
    Failed,
}

/// Counters of a channel's protocol work, for statistics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// Data frames sent for the first time.
    pub data_sent: u64,
    /// Data frames sent again.
    pub retransmissions: u64,
    /// Retransmission timeouts that fired.
    pub timeouts: u64,
    /// Go-back or hole repairs triggered by a selective acknowledgement, before a timeout.
    pub fast_retransmits: u64,
    /// Probes (`Heartbeat` frames) sent.
    pub probes: u64,
    /// Tail-loss probes: the newest unacknowledged frame sent again after two round
    /// trips of silence with nothing new after it (counted in `retransmissions` too,
    /// not in `probes`).
    pub tail_probes: u64,
    /// Sends that found the window closed and queued (credit stalls).
    pub credit_stalls: u64,
    /// Acknowledgements from the peer that acknowledged frames never sent (ignored).
    pub bad_acks: u64,
    /// Data frames accepted in order.
    pub delivered: u64,
    /// Data frames that arrived again (dropped).
    pub duplicates: u64,
    /// Data frames that arrived ahead of a missing one.
    pub out_of_order: u64,
    /// Frames dropped for a bad or missing checksum, or undecodable.
    pub checksum_failures: u64,
    /// Data frames beyond the receive window (dropped).
    pub overruns: u64,
    /// Frames reported lost ([`Mode::None`]).
    pub lost: u64,
    /// Acknowledgements that rode on a frame sent anyway (piggybacked).
    pub acks_piggybacked: u64,
    /// Explicit `Ack` frames sent, whatever the reason.
    pub acks_explicit: u64,
    /// Explicit acknowledgements sent because the acknowledgement timer expired.
    pub acks_delayed: u64,
    /// Explicit acknowledgements sent because half a window arrived or was released.
    pub acks_half_window: u64,
    /// Liveness heartbeats sent (`Ack` frames sent because nothing else went to the peer
    /// for [`Config::heartbeat`]; not counted in `acks_explicit`).
    pub heartbeats: u64,
}

impl Counters {
    /// Adds every counter of `other` to `self`.
    pub fn add(&mut self, other: &Counters) {
        let Counters {
            data_sent,
            retransmissions,
            timeouts,
            fast_retransmits,
            probes,
            tail_probes,
            credit_stalls,
            bad_acks,
            delivered,
            duplicates,
            out_of_order,
            checksum_failures,
            overruns,
            lost,
            acks_piggybacked,
            acks_explicit,
            acks_delayed,
            acks_half_window,
            heartbeats,
        } = other;
        self.data_sent += data_sent;
        self.retransmissions += retransmissions;
        self.timeouts += timeouts;
        self.fast_retransmits += fast_retransmits;
        self.probes += probes;
        self.tail_probes += tail_probes;
        self.credit_stalls += credit_stalls;
        self.bad_acks += bad_acks;
        self.delivered += delivered;
        self.duplicates += duplicates;
        self.out_of_order += out_of_order;
        self.checksum_failures += checksum_failures;
        self.overruns += overruns;
        self.lost += lost;
        self.acks_piggybacked += acks_piggybacked;
        self.acks_explicit += acks_explicit;
        self.acks_delayed += acks_delayed;
        self.acks_half_window += acks_half_window;
        self.heartbeats += heartbeats;
    }
}

/// Distance from `from` to `to` in sequence space, if `to` is not before `from`.
pub(crate) fn seq_ahead(from: u32, to: u32) -> Option<u32> {
    let d = to.wrapping_sub(from);
    (d < 1 << 31).then_some(d)
}

/// Whether `a` comes strictly before `b` in sequence space.
pub(crate) fn seq_lt(a: u32, b: u32) -> bool {
    a != b && seq_ahead(a, b).is_some()
}
