//! Send side of a reliable channel: frame building, the window, the blocked-sends queue,
//! the retransmission buffer and timer, and the probe.
//!
//! Guarantees: a message accepted by [`Sender::send`] is never dropped: its frames wait
//! on the blocked-sends queue until the window opens. In the retransmitting modes a frame
//! is kept, as the very datagram that was sent, until it is acknowledged; a
//! retransmission re-sends that buffer with only the acknowledgement fields and the
//! checksum refreshed (no copy of the data). The sender never has a frame in flight at
//! or beyond the receiver's credit limit, nor (when it retransmits) more than W frames
//! unacknowledged.

use std::collections::VecDeque;
use std::time::Duration;

use super::time::earliest;
use super::{
    seq_ahead, seq_lt, AckStamp, ChannelError, Config, ConfigError, Counters, Recovery, Sack,
    SendError, SendStatus, Time,
};
use crate::wire::{
    fragments, Flags, Fragment, Fragments, FrameKind, FrameView, Header, HEADER_LEN, MAX_MESSAGE,
};

/// Appends bytes `offset..offset + len` of the message `head` ++ `body` to `buf`.
fn extend_from_parts(buf: &mut Vec<u8>, head: &[u8], body: &[u8], offset: usize, len: usize) {
    let end = offset + len;
    if offset < head.len() {
        buf.extend_from_slice(&head[offset..end.min(head.len())]);
    }
    if end > head.len() {
        buf.extend_from_slice(&body[offset.max(head.len()) - head.len()..end - head.len()]);
    }
}

/// A message being handed to a [`Sender`] a part at a time ([`Sender::begin_send`]).
pub struct PartialSend {
    /// The fragments not built yet.
    frags: Fragments,
    /// The message's length (every part must come from the same bytes).
    len: usize,
    /// Some of its frames had to wait for the window (counted once as a credit stall).
    pub stalled: bool,
}

/// A frame in flight, kept for retransmission.
struct Outgoing {
    /// The datagram as last sent.
    bytes: Vec<u8>,
    /// The acknowledgement fields `bytes` carries (and is sealed with).
    stamp: AckStamp,
    /// When it was first sent (for round-trip samples).
    first_tx: Time,
    /// When it was last sent.
    last_tx: Time,
    /// Whether it was ever sent again (Karn: no round-trip sample from it).
    retransmitted: bool,
    /// The receiver reported it in a selective acknowledgement.
    sacked: bool,
    /// It is on the retransmission queue.
    queued: bool,
}

/// The shortest wait for a tail probe (the round-trip estimate of a quiet loopback
/// channel can be a few microseconds).
const TAIL_PROBE_MIN: Duration = Duration::from_micros(50);

/// A timeout under selective repeat resent only the oldest unacknowledged frame; the
/// next two acknowledgements tell a late acknowledgement from a loss (F-RTO, RFC 5682,
/// SACK-enhanced): the frames sent before the timeout are resent only if the loss shows.
#[derive(Debug, Clone, Copy)]
struct RtoRecovery {
    /// One past the frame the timeout resent.
    end: u32,
    /// When the timer fired: frames last sent before then are the ones it suspects.
    fired: Time,
    /// The first acknowledgement reached past `end` and new frames may go out; the next
    /// one decides.
    confirming: bool,
}

/// Where a frame handed out to be sent is ([`Sender::poll_transmit_kept`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxFrame {
    /// Kept for retransmission, with this sequence number: readable through
    /// [`Sender::kept_frame`] until the next acknowledgement is handled.
    Kept(u32),
    /// In the sender's scratch buffer ([`Sender::frame_bytes`]): valid until the next
    /// frame is handed out (unreliable frames, acknowledgements, probes).
    Scratch,
}

/// The send side of one channel.
///
/// Call order (each call may be made any time; this order keeps latency lowest):
///
/// 1. [`send`](Self::send) for each message the application writes;
///    [`handle_ack`](Self::handle_ack) for the acknowledgement fields of every valid
///    frame from the peer; [`handle_timeout`](Self::handle_timeout) when the time passes
///    [`poll_timeout`](Self::poll_timeout).
/// 2. Then [`poll_transmit`](Self::poll_transmit) until it returns `None`, sending each
///    datagram before the next call; [`poll_error`](Self::poll_error) until `None`.
/// 3. Then [`poll_timeout`](Self::poll_timeout) to arm the caller's timer.
///
/// [`Duplex`](super::Duplex) does all of this together with the reverse channel's
/// [`Receiver`](super::Receiver).
pub struct Sender {
    retransmit: bool,
    selective: bool,
    checksum: bool,
    window: u32,
    max_datagram: usize,
    rto_min: Duration,
    rto_max: Duration,
    probe_base: Duration,
    max_timeouts: u32,
    template: Header,

    /// Oldest unacknowledged sequence number.
    snd_una: u32,
    /// Sequence number of the next frame sent for the first time.
    next_tx: u32,
    /// Sequence number of the next frame built.
    next_seq: u32,
    /// The receiver's credit limit: frames before it may be in flight.
    limit: u32,
    /// Retransmitting modes: frames `snd_una..next_tx`, in order.
    unacked: VecDeque<Outgoing>,
    /// The blocked-sends queue: built frames `next_tx..next_seq`, not yet sent.
    pending: VecDeque<Vec<u8>>,
    pending_bytes: usize,
    /// Sequence numbers to send again, oldest first.
    retx: VecDeque<u32>,
    /// The last frame handed out that is not kept (mode none, control frames).
    scratch: Vec<u8>,
    spare: Vec<Vec<u8>>,

    srtt: Option<Duration>,
    rttvar: Duration,
    /// The timeout the round-trip estimate gives (`rto_initial` before any sample).
    rto_base: Duration,
    /// The timeout in force: `rto_base`, doubled by each timeout until progress.
    rto: Duration,
    rto_deadline: Option<Time>,
    rto_timeouts: u32,
    /// Set by a timeout under selective repeat until the next acknowledgement that
    /// advances.
    rto_recovery: Option<RtoRecovery>,
    probe_deadline: Option<Time>,
    probe_interval: Duration,
    probe_timeouts: u32,
    probe_due: bool,
    /// Selective repeat on a channel to one receiver: probe a silent tail.
    tail_probes: bool,
    /// The receiver's acknowledgement delay: a tail shorter than half a window is
    /// acknowledged only that late.
    ack_delay: Duration,
    /// The tail probe's timeouts, from the last round-trip sample (computed there, not
    /// on every send): two round trips (at least [`TAIL_PROBE_MIN`]), and that plus
    /// the acknowledgement delay. `None` before any sample.
    tlp_timeouts: Option<[Duration; 2]>,
    /// When the tail probe fires: frames are unacknowledged, nothing new follows them,
    /// and no acknowledgement came for two round trips.
    tlp_deadline: Option<Time>,
    /// Tail probes since the acknowledgement last advanced.
    tlp_rounds: u32,

    failed: bool,
    errors: VecDeque<ChannelError>,
    counters: Counters,
}

impl Sender {
    /// A sender whose frames carry the addressing fields of `template` (endpoints, rank,
    /// job id and token) and its group flags (`GROUP` or `GROUP_REPLY`: a group channel's
    /// frames); its kind, other flags, sequence, acknowledgement, credits and checksum
    /// are ignored. Sequence numbers start at 0 and the receiver is assumed to
    /// have `cfg.window` buffers free.
    pub fn new(cfg: &Config, template: Header) -> Result<Sender, ConfigError> {
        cfg.validate()?;
        let window = u32::from(cfg.window);
        Ok(Sender {
            retransmit: cfg.mode.retransmits(),
            selective: cfg.recovery == Recovery::Selective,
            checksum: cfg.checksums(),
            window,
            max_datagram: cfg.max_datagram,
            rto_min: cfg.rto_min,
            rto_max: cfg.rto_max,
            probe_base: cfg.probe_interval,
            max_timeouts: cfg.max_timeouts,
            template: Header {
                flags: template
                    .flags
                    .intersection(Flags::GROUP | Flags::GROUP_REPLY),
                ..template
            },
            snd_una: 0,
            next_tx: 0,
            next_seq: 0,
            limit: window,
            unacked: VecDeque::new(),
            pending: VecDeque::new(),
            pending_bytes: 0,
            retx: VecDeque::new(),
            scratch: Vec::new(),
            spare: Vec::new(),
            srtt: None,
            rttvar: Duration::ZERO,
            rto_base: cfg.rto_initial,
            rto: cfg.rto_initial,
            rto_deadline: None,
            rto_timeouts: 0,
            rto_recovery: None,
            probe_deadline: None,
            probe_interval: cfg.probe_interval,
            probe_timeouts: 0,
            probe_due: false,
            tail_probes: cfg.mode.retransmits()
                && cfg.recovery == Recovery::Selective
                && !template.flags.intersects(Flags::GROUP | Flags::GROUP_REPLY),
            ack_delay: cfg.ack_delay,
            tlp_timeouts: None,
            tlp_deadline: None,
            tlp_rounds: 0,
            failed: false,
            errors: VecDeque::new(),
            counters: Counters::default(),
        })
    }

    /// Starts the sequence numbers at `seq` (both ends must agree; for tests of wrapping).
    #[cfg(test)]
    pub(crate) fn start_at(&mut self, seq: u32) {
        self.snd_una = seq;
        self.next_tx = seq;
        self.next_seq = seq;
        self.limit = seq.wrapping_add(self.window);
    }

    /// Splits `msg` into Directed Message fragments, builds their frames (the one copy of
    /// the data) and queues them. The caller's buffer is free again on return.
    ///
    /// Returns [`SendStatus::Blocked`] if the window cannot take every frame now (counted
    /// as a credit stall); the frames go out as credits return, in order, never dropped.
    pub fn send(&mut self, now: Time, msg: &[u8]) -> Result<SendStatus, SendError> {
        let mut part = self.begin_send(msg.len())?;
        self.send_part(now, &[], msg, &mut part, usize::MAX);
        Ok(if part.stalled {
            SendStatus::Blocked
        } else {
            SendStatus::Ready
        })
    }

    /// Starts a message of `len` bytes that the caller hands over a part at a time with
    /// [`send_part`](Self::send_part): a writer that can wait builds each frame shortly
    /// before the window lets it go, instead of copying a message many windows long into
    /// frames up front (memory and time in proportion to the message, with the link idle
    /// meanwhile). No other message may be sent on this channel until the last part.
    pub fn begin_send(&self, len: usize) -> Result<PartialSend, SendError> {
        if self.failed {
            return Err(SendError::Failed);
        }
        if len > MAX_MESSAGE {
            return Err(SendError::TooLarge {
                len,
                max: MAX_MESSAGE,
            });
        }
        Ok(PartialSend {
            frags: fragments(len, self.max_datagram),
            len,
            stalled: false,
        })
    }

    /// Builds and queues the next frames of `part`, whose bytes are `head` followed by
    /// `body` (the same slices on every call: a protocol header need not be joined to its
    /// payload first), until `ahead` frames wait beyond what the window takes now; at
    /// least one frame when fewer than `ahead` wait. Returns true when the message is
    /// wholly queued. A message that had to wait for the window is counted once as a
    /// credit stall ([`PartialSend::stalled`]).
    ///
    /// # Panics
    ///
    /// If `head` and `body` together are not as long as the message `part` was begun
    /// for (the caller's error: the bytes must stay the same until the last part).
    pub fn send_part(
        &mut self,
        now: Time,
        head: &[u8],
        body: &[u8],
        part: &mut PartialSend,
        ahead: usize,
    ) -> bool {
        assert_eq!(
            head.len() + body.len(),
            part.len,
            "send_part: not the message begin_send was given"
        );
        let limit = (self.room() as usize).saturating_add(ahead);
        while self.pending.len() < limit {
            let Some(frag) = part.frags.next() else {
                break;
            };
            // Stamped when it is sent (poll_transmit_kept).
            let unstamped = AckStamp { ack: 0, credits: 0 };
            let buf = self.build_data_frame(&frag, head, body, part.len, unstamped);
            self.pending_bytes += buf.len();
            self.pending.push_back(buf);
        }
        if !part.stalled && self.pending.len() as u64 > u64::from(self.room()) {
            self.counters.credit_stalls += 1;
            part.stalled = true;
        }
        self.update_probe(now);
        part.frags.len() == 0
    }

    /// The longest message that travels in one frame of this channel.
    pub fn lone_max(&self) -> usize {
        self.max_datagram - HEADER_LEN
    }

    /// Whether [`send_lone`](Self::send_lone) takes a message of `len` bytes: it fits one
    /// frame, nothing is queued or due for resending, no probe is due, the window has room
    /// and the sender has not failed.
    #[inline]
    pub fn takes_lone(&self, len: usize) -> bool {
        !self.failed
            && len <= self.max_datagram - HEADER_LEN
            && self.pending.is_empty()
            && self.retx.is_empty()
            && !self.probe_due
            && self.room() > 0
    }

    /// A message of one frame sent at once, in one step: exactly what
    /// [`begin_send`](Self::begin_send), [`send_part`](Self::send_part) and
    /// [`poll_transmit_kept`](Self::poll_transmit_kept) with `stamp` do for it (the same
    /// bytes, state and counters), without the fragment plan, the blocked-sends queue and
    /// the transmit loop. This is the send half of TCP's header prediction: the common
    /// case of a request or a reply.
    ///
    /// `None`, changing nothing, unless [`takes_lone`](Self::takes_lone): the general path
    /// handles every other case.
    pub fn send_lone(
        &mut self,
        now: Time,
        head: &[u8],
        body: &[u8],
        stamp: AckStamp,
    ) -> Option<TxFrame> {
        let len = head.len() + body.len();
        if !self.takes_lone(len) {
            return None;
        }
        let whole = Fragment {
            flags: Flags::FIRST | Flags::LAST,
            offset: 0,
            len,
            length_prefix: false,
        };
        // Built with the stamp it is sent with, as poll_transmit_kept's `stamp_frame`
        // would leave it.
        let mut bytes = self.build_data_frame(&whole, head, body, len, stamp);
        if self.checksum {
            seal(&mut bytes);
        }
        // send_part's probe update (it sees the same state: the frame queued or not, the
        // window is open and nothing is in flight beyond it), then poll_transmit_kept's
        // bookkeeping.
        self.update_probe(now);
        Some(self.first_transmission(now, bytes, stamp))
    }

    /// Builds fragment `frag` of the message `head` ++ `body` (`total` bytes) as a `Data`
    /// frame with the next sequence number and the acknowledgement fields `stamp`, in a
    /// spare buffer, unsealed. Inlined into both callers: the lone message's path is the
    /// one that counts every instruction.
    #[inline(always)]
    fn build_data_frame(
        &mut self,
        frag: &Fragment,
        head: &[u8],
        body: &[u8],
        total: usize,
        stamp: AckStamp,
    ) -> Vec<u8> {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.reserve(frag.datagram_len());
        let header = Header {
            kind: FrameKind::Data,
            flags: frag.flags | self.template.flags,
            seq: self.next_seq,
            ack: stamp.ack,
            credits: stamp.credits,
            checksum: 0,
            ..self.template
        };
        let mut emitted = [0; HEADER_LEN];
        header.emit(&mut emitted);
        buf.extend_from_slice(&emitted);
        if frag.length_prefix {
            buf.extend_from_slice(&(total as u32).to_le_bytes());
        }
        extend_from_parts(&mut buf, head, body, frag.offset, frag.len);
        self.next_seq = self.next_seq.wrapping_add(1);
        buf
    }

    /// Takes in the acknowledgement fields of a valid frame from the peer. `sack` is the
    /// selective acknowledgement of an explicit `Ack` frame ([`Sack::of`] its flags and
    /// `seq` field), `None` for other kinds.
    ///
    /// A stale acknowledgement (before the oldest unacknowledged frame) is ignored; one
    /// that acknowledges frames never sent is ignored and counted in `bad_acks`.
    pub fn handle_ack(&mut self, now: Time, stamp: AckStamp, sack: Option<Sack>) {
        if self.failed {
            return;
        }
        let in_flight = self.next_tx.wrapping_sub(self.snd_una);
        let Some(advance) = seq_ahead(self.snd_una, stamp.ack).filter(|&a| a <= in_flight) else {
            if seq_lt(self.next_tx, stamp.ack) {
                self.counters.bad_acks += 1;
            }
            return;
        };
        // Any current acknowledgement answers a probe: the peer is alive.
        self.probe_timeouts = 0;
        let limit = stamp.ack.wrapping_add(u32::from(stamp.credits));
        if seq_lt(self.limit, limit) {
            self.limit = limit;
            self.probe_interval = self.probe_base;
        }
        if advance > 0 {
            self.snd_una = stamp.ack;
            // Progress shows the path works again: the peer is not failing. The backed-off
            // timeout stays until a round-trip sample of a frame sent once replaces it
            // (Karn): frames acknowledged after a timeout were all resent, and going back
            // to the old, too short timeout would resend the window again and again while
            // a slow link drains its queue.
            self.rto_timeouts = 0;
            if self.retransmit {
                let mut sample = None;
                for _ in 0..advance {
                    if let Some(o) = self.unacked.pop_front() {
                        sample = (!o.retransmitted).then(|| now.saturating_since(o.first_tx));
                        self.recycle(o.bytes);
                    }
                }
                if let Some(rtt) = sample {
                    self.rtt_sample(rtt);
                }
                if let Some(r) = self.rto_recovery.take() {
                    if r.confirming {
                        // A second advance: frames sent before the timeout keep
                        // arriving, so it was late, not lost (the holes that remain are
                        // the selective acknowledgements' to report).
                    } else if stamp.ack == r.end
                        || self.pending.is_empty()
                        || sack.is_some_and(|s| !s.is_empty())
                    {
                        // Only the frame the timeout resent is acknowledged: the ones
                        // behind it were lost too. Or holes are reported: frames were
                        // lost. Or nothing new follows (the end of a transfer) whose
                        // acknowledgement could show the difference.
                        self.queue_sent_before(r.fired);
                    } else {
                        self.rto_recovery = Some(RtoRecovery {
                            confirming: true,
                            ..r
                        });
                    }
                }
                self.rto_deadline = (!self.unacked.is_empty()).then(|| now + self.rto);
            }
        }
        if let (true, Some(sack)) = (self.retransmit, sack) {
            if !sack.is_empty() {
                if let Some(r) = self.rto_recovery.filter(|r| r.confirming && advance == 0) {
                    // The new frames arrive but the cumulative acknowledgement stays:
                    // the timeout was right, resend what it suspected.
                    self.queue_sent_before(r.fired);
                    self.rto_recovery = None;
                }
                self.handle_sack(now, sack);
            }
        }
        if self.tail_probes {
            if advance > 0 {
                self.tlp_rounds = 0;
            }
            self.arm_tail_probe(now);
        }
        self.update_probe(now);
    }

    /// Arms the tail probe when the frames in flight are the last for now (nothing
    /// pending, or the window closed): if no acknowledgement comes within two round
    /// trips (and the receiver's acknowledgement delay, when fewer than half a window
    /// are unacknowledged: it acknowledges those that late), the newest of them not
    /// reported received is sent again (RFC 8985's tail loss probe), before the
    /// retransmission timeout (whose minimum is a safe bound, not a round trip). A lost
    /// tail otherwise has no later frame to reveal its holes; the probe is one: the receiver acknowledges it at once (held out of order, or
    /// a duplicate), and the frames its acknowledgement shows missing were sent before
    /// it, so they are resent at once ([`Sender::handle_sack`]). A probe that was not
    /// needed costs one frame. At most three probes without progress; the
    /// retransmission timeout stays armed.
    fn arm_tail_probe(&mut self, now: Time) {
        self.tlp_deadline = None;
        let Some([prompt, delayed]) = self.tlp_timeouts else {
            return;
        };
        if !self.at_tail() || self.failed || self.tlp_rounds >= 3 {
            return;
        }
        // The receiver acknowledges at once after half a window, else after its delay: a
        // probe before that would resend a frame that arrived.
        let timeout = if self.unacked.len() < (self.window as usize).div_ceil(2) {
            delayed
        } else {
            prompt
        };
        if timeout < self.rto {
            self.tlp_deadline = Some(now + timeout);
        }
    }

    /// Frames are in flight and nothing new follows them for now (nothing pending, or the
    /// window closed): the last of them have no later frame to reveal their loss.
    fn at_tail(&self) -> bool {
        !self.unacked.is_empty() && (self.pending.is_empty() || self.room() == 0)
    }

    /// Fires the retransmission timer (double the timeout and resend every
    /// unacknowledged frame not reported received; under selective repeat with no hole
    /// reported, only the oldest and any earlier resend still missing a round trip later,
    /// and the others once the next acknowledgements show them lost) and the probe timer,
    /// if their deadlines have passed.
    /// After [`Config::max_timeouts`] consecutive timeouts the sender fails with
    /// [`ChannelError::Unreachable`].
    pub fn handle_timeout(&mut self, now: Time) {
        if self.failed {
            return;
        }
        if self.rto_deadline.is_some_and(|d| d <= now) {
            self.counters.timeouts += 1;
            self.rto_timeouts += 1;
            if self.rto_timeouts > self.max_timeouts {
                return self.fail(self.rto_timeouts);
            }
            self.rto = self.rto.saturating_mul(2).min(self.rto_max);
            if self.selective && !self.unacked.iter().any(|o| o.sacked) {
                // No hole reported: perhaps nothing was lost and the acknowledgement is
                // late (a busy peer, a deep queue); resending the whole window then put a
                // window of duplicates on the link ahead of new data. With holes
                // reported, frames were lost: resend everything not reported at once, or
                // the holes beyond the report's reach wait for timeouts of their own
                // (a lossy all-to-all took 98 s instead of 2).
                let guard = self.srtt.unwrap_or(self.rto_min / 2);
                // The oldest frame, and resends that had a round trip and are still
                // missing (lost again).
                self.queue_resends(|i, o| i == 0 || (o.retransmitted && repairable(o, now, guard)));
                if !self.unacked.is_empty() {
                    self.rto_recovery = Some(RtoRecovery {
                        end: self.snd_una.wrapping_add(1),
                        fired: now,
                        confirming: false,
                    });
                }
            } else {
                self.queue_all();
            }
            self.rto_deadline = (!self.unacked.is_empty()).then(|| now + self.rto);
        }
        if self.tlp_deadline.is_some_and(|d| d <= now) {
            self.tlp_deadline = None;
            let newest = self.unacked.iter().rposition(|o| !o.sacked);
            if let (true, Some(newest)) = (self.at_tail() && self.retx.is_empty(), newest) {
                self.counters.tail_probes += 1;
                self.tlp_rounds += 1;
                self.queue_resends(|i, _| i == newest);
            }
        }
        if self.probe_deadline.is_some_and(|d| d <= now) {
            self.probe_timeouts += 1;
            if self.probe_timeouts > self.max_timeouts {
                return self.fail(self.probe_timeouts);
            }
            self.probe_due = true;
            self.probe_interval = self.probe_interval.saturating_mul(2).min(self.rto_max);
            self.probe_deadline = Some(now + self.probe_interval);
        }
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) has a frame to hand out.
    pub fn has_transmit(&mut self) -> bool {
        if self.failed {
            return false;
        }
        while let Some(&seq) = self.retx.front() {
            match self.index_of(seq) {
                Some(i) if !self.unacked[i].sacked => return true,
                Some(i) => self.unacked[i].queued = false,
                None => {}
            }
            self.retx.pop_front();
        }
        // `retx` is empty here.
        self.wants_transmit()
    }

    /// Whether [`poll_transmit_kept`](Self::poll_transmit_kept) might hand out a frame:
    /// false only when it would certainly return `None`. Unlike
    /// [`has_transmit`](Self::has_transmit) it changes nothing, so a caller can ask it
    /// before every call instead of making the last call that comes back empty.
    #[inline]
    pub fn wants_transmit(&self) -> bool {
        !self.failed
            && (!self.retx.is_empty()
                || (!self.pending.is_empty() && self.room() > 0)
                || self.probe_due)
    }

    /// The next datagram to send, with `stamp` (the reverse channel's acknowledgement)
    /// written into it: a retransmission, else a new frame if the window allows, else a
    /// probe. It says where the datagram is instead of lending it: a frame kept for
    /// retransmission stays readable through
    /// [`kept_frame`](Self::kept_frame) until the next acknowledgement is handled, so a
    /// batch of them can be sent without copying each first.
    pub fn poll_transmit_kept(&mut self, now: Time, stamp: AckStamp) -> Option<TxFrame> {
        if self.failed {
            return None;
        }
        while let Some(seq) = self.retx.pop_front() {
            let Some(i) = self.index_of(seq) else {
                continue;
            };
            let checksum = self.checksum;
            let o = &mut self.unacked[i];
            o.queued = false;
            if o.sacked {
                continue;
            }
            o.last_tx = now;
            o.retransmitted = true;
            if o.stamp != stamp {
                stamp_frame(&mut o.bytes, stamp, checksum);
                o.stamp = stamp;
            }
            self.counters.retransmissions += 1;
            if self.rto_deadline.is_none() {
                self.rto_deadline = Some(now + self.rto);
            }
            return Some(TxFrame::Kept(seq));
        }
        if self.room() > 0 {
            if let Some(mut bytes) = self.pending.pop_front() {
                self.pending_bytes -= bytes.len();
                stamp_frame(&mut bytes, stamp, self.checksum);
                return Some(self.first_transmission(now, bytes, stamp));
            }
        }
        if self.probe_due {
            self.probe_due = false;
            self.counters.probes += 1;
            self.build_control(FrameKind::Heartbeat, self.next_tx, stamp, 0);
            return Some(TxFrame::Scratch);
        }
        None
    }

    /// Hands out a new data frame, built and stamped with `stamp`, for its first
    /// transmission: kept for retransmission in the retransmitting modes, else held in the
    /// scratch buffer until the next frame (with the tail probe armed). Inlined into both
    /// callers, as the code was before it was shared.
    #[inline(always)]
    fn first_transmission(&mut self, now: Time, bytes: Vec<u8>, stamp: AckStamp) -> TxFrame {
        self.next_tx = self.next_tx.wrapping_add(1);
        self.counters.data_sent += 1;
        if self.retransmit {
            self.unacked.push_back(Outgoing {
                bytes,
                stamp,
                first_tx: now,
                last_tx: now,
                retransmitted: false,
                sacked: false,
                queued: false,
            });
            if self.rto_deadline.is_none() && !self.failed {
                self.rto_deadline = Some(now + self.rto);
            }
            if self.tail_probes {
                // The last frame for now (`at_tail`): the tail starts here.
                self.arm_tail_probe(now);
            }
            self.update_probe(now);
            return TxFrame::Kept(self.next_tx.wrapping_sub(1));
        }
        let old = std::mem::replace(&mut self.scratch, bytes);
        self.recycle(old);
        // A tail probe follows a quiet period after the last frame.
        if self.probe_timeouts == 0 && !self.failed {
            self.probe_deadline = Some(now + self.probe_interval);
        }
        self.update_probe(now);
        TxFrame::Scratch
    }

    /// The bytes of the unacknowledged frame with sequence number `seq`, as last handed
    /// out; `None` once it is acknowledged (or if it was never sent).
    pub fn kept_frame(&self, seq: u32) -> Option<&[u8]> {
        let i = self.index_of(seq)?;
        Some(self.unacked[i].bytes.as_slice())
    }

    /// The bytes of a frame [`poll_transmit_kept`](Self::poll_transmit_kept) or
    /// [`build_ack`](Self::build_ack) just handed out.
    pub fn frame_bytes(&self, frame: TxFrame) -> &[u8] {
        match frame {
            // Handed out by this sender and not acknowledged since, so it is there; were
            // it not, an empty datagram would go out, which the receiver drops and counts.
            TxFrame::Kept(seq) => {
                let bytes = self.kept_frame(seq);
                debug_assert!(bytes.is_some(), "kept frame {seq} is gone");
                bytes.unwrap_or_default()
            }
            TxFrame::Scratch => &self.scratch,
        }
    }

    /// Builds an explicit acknowledgement frame (kind `Ack`) for the reverse channel:
    /// `stamp` in its acknowledgement fields, the selective-acknowledgement bitmap of
    /// `sack` in its sequence field and its block in the flags. It is a [`TxFrame::Scratch`]
    /// ([`frame_bytes`](Self::frame_bytes)), valid until the next frame is handed out.
    pub fn build_ack(&mut self, stamp: AckStamp, sack: Sack) -> TxFrame {
        let block = sack.offset / Sack::BLOCK;
        self.build_control(FrameKind::Ack, sack.bits, stamp, block);
        TxFrame::Scratch
    }

    /// Frame `seq`, still kept, is sent again outside this sender (a group channel's
    /// repair, sent to every member): it counts as retransmitted (Karn: no round-trip
    /// sample from it) and as sent now (no timeout resends it at once). False, changing
    /// nothing, when the frame is no longer kept.
    pub fn note_repair(&mut self, seq: u32, now: Time) -> bool {
        let Some(i) = self.index_of(seq) else {
            return false;
        };
        let o = &mut self.unacked[i];
        o.retransmitted = true;
        o.last_tx = now;
        self.counters.retransmissions += 1;
        true
    }

    /// The oldest frame not acknowledged (or the next to send, when all are).
    pub fn oldest_unacked(&self) -> u32 {
        self.snd_una
    }

    /// The first frame not sent yet: an acknowledgement beyond it is a lie.
    pub fn sent_end(&self) -> u32 {
        self.next_tx
    }

    /// The earliest deadline at which [`handle_timeout`](Self::handle_timeout) has work.
    pub fn poll_timeout(&self) -> Option<Time> {
        earliest(
            earliest(self.rto_deadline, self.probe_deadline),
            self.tlp_deadline,
        )
    }

    /// The next error to report ([`ChannelError::Unreachable`]).
    pub fn poll_error(&mut self) -> Option<ChannelError> {
        self.errors.pop_front()
    }

    /// Whether frames wait on the blocked-sends queue because the window is closed.
    pub fn is_blocked(&self) -> bool {
        !self.pending.is_empty() && self.room() == 0
    }

    /// Whether everything sent is acknowledged and nothing waits.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.snd_una == self.next_tx
    }

    /// Whether the sender gave up ([`ChannelError::Unreachable`] was reported, or the
    /// [`Duplex`](super::Duplex) found the peer silent).
    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// Frames built but not yet sent (the blocked-sends queue).
    pub fn queued_frames(&self) -> usize {
        self.pending.len()
    }

    #[cfg(test)]
    /// Bytes of the frames built but not yet sent.
    pub fn queued_bytes(&self) -> usize {
        self.pending_bytes
    }

    /// Frames sent and not yet acknowledged.
    pub fn in_flight(&self) -> u32 {
        self.next_tx.wrapping_sub(self.snd_una)
    }

    #[cfg(test)]
    /// The current retransmission timeout.
    pub fn rto(&self) -> Duration {
        self.rto
    }

    /// The smoothed round-trip time, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// The counters of the send side.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// New frames the window lets out now.
    fn room(&self) -> u32 {
        let credit = seq_ahead(self.next_tx, self.limit).unwrap_or(0);
        if self.retransmit {
            let buffered = u32::try_from(self.unacked.len()).unwrap_or(u32::MAX);
            credit.min(self.window.saturating_sub(buffered))
        } else {
            credit
        }
    }

    /// Index in `unacked` of frame `seq`, if it is unacknowledged.
    fn index_of(&self, seq: u32) -> Option<usize> {
        let d = seq_ahead(self.snd_una, seq)? as usize;
        (d < self.unacked.len()).then_some(d)
    }

    /// Queues every unacknowledged frame that the receiver has not reported for
    /// retransmission (go-back-N; under selective repeat, the holes).
    fn queue_all(&mut self) {
        self.queue_resends(|_, _| true);
    }

    /// Queues for retransmission each unacknowledged frame, not reported received and
    /// not queued yet, that `pick` chooses (given its index from `snd_una`); true if
    /// any was.
    fn queue_resends(&mut self, mut pick: impl FnMut(usize, &Outgoing) -> bool) -> bool {
        let base = self.snd_una;
        let mut any = false;
        for (i, o) in self.unacked.iter_mut().enumerate() {
            if !o.sacked && !o.queued && pick(i, o) {
                o.queued = true;
                self.retx.push_back(base.wrapping_add(i as u32));
                any = true;
            }
        }
        any
    }

    /// Queues the unacknowledged frames not reported received that were last sent at or
    /// before `t`.
    fn queue_sent_before(&mut self, t: Time) {
        self.queue_resends(|_, o| o.last_tx <= t);
    }

    /// A selective acknowledgement with at least one bit: frames beyond `snd_una`
    /// arrived, so `snd_una` (and, under selective repeat, every unreported frame below
    /// the highest reported one) is missing. Resend them at once, except those already
    /// resent within the last round trip (that resend may still be on the way).
    fn handle_sack(&mut self, now: Time, sack: Sack) {
        let guard = self.srtt.unwrap_or(self.rto_min / 2);
        if !self.selective {
            let fresh = self
                .unacked
                .front()
                .is_some_and(|o| !o.queued && repairable(o, now, guard));
            if fresh {
                self.counters.fast_retransmits += 1;
                self.queue_all();
            }
            return;
        }
        let mut highest = None;
        // The last transmission of the reported frames: a resend that left before it
        // and is still missing was lost again (it would have arrived first; RFC 8985's
        // time-based detection with no reordering window, as quiver's links keep
        // order), with no need to wait a round trip.
        let mut newest_tx = None;
        for i in (0..32u32).filter(|&i| sack.bits & (1 << i) != 0) {
            if let Some(idx) = self.index_of(self.snd_una.wrapping_add(1 + sack.offset + i)) {
                let o = &mut self.unacked[idx];
                o.sacked = true;
                newest_tx = newest_tx.max(Some(o.last_tx));
                highest = Some(idx);
            }
        }
        let Some(highest) = highest else {
            return;
        };
        let overtaken = |o: &Outgoing| newest_tx.is_some_and(|t| o.last_tx <= t);
        if self.queue_resends(|i, o| i < highest && (overtaken(o) || repairable(o, now, guard))) {
            self.counters.fast_retransmits += 1;
        }
    }

    /// RFC 6298 smoothing; the timeout is `srtt + 4 rttvar`, clamped. Computed in whole
    /// nanoseconds: `Duration`'s division works on seconds and nanoseconds apart, and
    /// this runs for nearly every acknowledgement. The values are `Duration`'s (2, 4 and 8
    /// divide a second's nanoseconds), except that sums saturate at 584 years.
    fn rtt_sample(&mut self, rtt: Duration) {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let rtt = nanos(rtt);
        let (srtt, rttvar) = match self.srtt {
            None => (rtt, rtt / 2),
            Some(s) => {
                let s = nanos(s);
                let var = nanos(self.rttvar);
                (
                    s.saturating_mul(7).saturating_add(rtt) / 8,
                    var.saturating_mul(3).saturating_add(s.abs_diff(rtt)) / 4,
                )
            }
        };
        self.srtt = Some(Duration::from_nanos(srtt));
        self.rttvar = Duration::from_nanos(rttvar);
        let timeout = srtt.saturating_add(rttvar.saturating_mul(4).max(1_000));
        self.rto_base = Duration::from_nanos(timeout).clamp(self.rto_min, self.rto_max);
        self.rto = self.rto_base;
        let prompt = Duration::from_nanos(srtt.saturating_mul(2)).max(TAIL_PROBE_MIN);
        self.tlp_timeouts = Some([prompt, prompt + self.ack_delay]);
    }

    /// Arms or disarms the probe: in mode none while frames are unconfirmed or the
    /// window is closed; in the retransmitting modes while the window is closed with
    /// nothing in flight (the retransmission timer covers the rest).
    fn update_probe(&mut self, now: Time) {
        if self.failed {
            // A failed sender ignores timeouts: a deadline armed now would stay in the
            // past for ever, and a driver waiting on it would spin (found by the
            // `channel_frames` fuzz target: `send_part` continuing a message after the
            // failure).
            return;
        }
        let needed = if self.retransmit {
            self.unacked.is_empty() && self.is_blocked()
        } else {
            self.snd_una != self.next_tx || self.is_blocked()
        };
        if !needed {
            self.probe_deadline = None;
            self.probe_due = false;
            self.probe_timeouts = 0;
            self.probe_interval = self.probe_base;
        } else if self.probe_deadline.is_none() {
            self.probe_deadline = Some(now + self.probe_interval);
        }
    }

    fn fail(&mut self, timeouts: u32) {
        self.abort();
        self.errors
            .push_back(ChannelError::Unreachable { timeouts });
    }

    /// Gives up on the peer without reporting anything (whoever calls this reports why):
    /// the sender fails as after [`ChannelError::Unreachable`], refusing sends and
    /// sending nothing more.
    pub(super) fn abort(&mut self) {
        self.failed = true;
        self.rto_deadline = None;
        self.probe_deadline = None;
        self.probe_due = false;
        self.tlp_deadline = None;
        self.retx.clear();
    }

    /// Builds a frame without data (`kind`, sequence field `seq`) in the scratch buffer.
    fn build_control(&mut self, kind: FrameKind, seq: u32, stamp: AckStamp, sack_block: u32) {
        let header = Header {
            kind,
            flags: self.template.flags.with_sack_block(sack_block),
            seq,
            ack: stamp.ack,
            credits: stamp.credits,
            checksum: 0,
            ..self.template
        };
        let mut head = [0; HEADER_LEN];
        if self.checksum {
            header.emit_sealed(&mut head, &[]);
        } else {
            header.emit(&mut head);
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&head);
    }

    fn recycle(&mut self, mut buf: Vec<u8>) {
        // Up to a window of buffers is kept, so that a window's frames are built in the
        // buffers the previous window's acknowledgements freed, not reallocated.
        if self.spare.len() < self.window as usize && buf.capacity() > 0 {
            buf.clear();
            self.spare.push(buf);
        }
    }
}

/// Whether a selective acknowledgement that reports a later frame may resend `o`: a
/// frame sent once is missing; a frame already resent is given a round trip.
fn repairable(o: &Outgoing, now: Time, guard: Duration) -> bool {
    !o.retransmitted || now.saturating_since(o.last_tx) >= guard
}

/// Writes the acknowledgement fields into a built frame and seals it if checksums are on.
fn stamp_frame(bytes: &mut [u8], stamp: AckStamp, checksum: bool) {
    // Every frame here was built with a whole header, so the view always exists.
    if let Ok(mut view) = FrameView::new_checked(&mut *bytes) {
        view.set_ack(stamp.ack);
        view.set_credits(stamp.credits);
    }
    if checksum {
        seal(bytes);
    }
}

/// Sets a built frame's CHECKSUM flag and fills in its checksum.
#[inline]
fn seal(bytes: &mut [u8]) {
    if let Ok(mut view) = FrameView::new_checked(bytes) {
        view.fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::{Config, Sender};
    use proptest::prelude::*;
    use std::time::Duration;

    /// The smoothing as it was written with `Duration` arithmetic before it moved to
    /// whole nanoseconds: (srtt, rttvar, rto) after each sample.
    fn reference(samples: &[u64], cfg: &Config) -> Vec<(Duration, Duration, Duration)> {
        let (mut srtt, mut rttvar) = (None::<Duration>, Duration::ZERO);
        let mut out = Vec::new();
        for &rtt in samples {
            let rtt = Duration::from_nanos(rtt);
            let s = match srtt {
                None => {
                    rttvar = rtt / 2;
                    rtt
                }
                Some(s) => {
                    rttvar = (rttvar.saturating_mul(3) + s.abs_diff(rtt)) / 4;
                    (s.saturating_mul(7) + rtt) / 8
                }
            };
            srtt = Some(s);
            let var = rttvar.saturating_mul(4).max(Duration::from_micros(1));
            out.push((s, rttvar, (s + var).clamp(cfg.rto_min, cfg.rto_max)));
        }
        out
    }

    proptest! {
        /// Round-trip samples from nothing to hours give the values the `Duration`
        /// version gave.
        #[test]
        fn rtt_smoothing_in_nanoseconds_matches_duration_arithmetic(
            samples in prop::collection::vec(0u64..10_000_000_000_000, 1..40),
        ) {
            let cfg = Config { rto_max: Duration::from_secs(100_000), ..Config::default() };
            let mut s = Sender::new(&cfg, super::super::harness::template(0, 1)).unwrap();
            for (&rtt, want) in samples.iter().zip(reference(&samples, &cfg)) {
                s.rtt_sample(Duration::from_nanos(rtt));
                prop_assert_eq!((s.srtt.unwrap(), s.rttvar, s.rto), want);
            }
        }
    }
}
