//! One endpoint's reliable state for one peer: the outgoing channel's [`Sender`], the
//! incoming channel's [`Receiver`], the piggybacking between them, and the liveness of
//! the peer (heartbeats and silence detection).

use std::collections::VecDeque;
use std::time::Duration;

use super::time::earliest;
use super::{
    AckSent, AckStamp, ChannelError, Config, ConfigError, Counters, Event, Mode, PartialSend,
    Receiver, Sack, SendError, SendStatus, Sender, Time, TxFrame,
};
use crate::wire::{Flags, FrameKind, Header};

/// The reliable state an endpoint keeps for one peer endpoint: both directions of the
/// pair, so that acknowledgements and credits of the incoming channel ride on the frames
/// of the outgoing one.
///
/// `B` is the caller's handle for a received datagram (see [`Receiver`]).
///
/// Call order (quinn-style: `handle_*` in, `poll_*` out; any number of inputs may come
/// before the outputs are drained):
///
/// 1. Inputs: [`send`](Self::send) for each application message;
///    [`handle_frame`](Self::handle_frame) for each datagram from the peer that decoded
///    (`wire::decode`) and belongs to this pair; [`handle_invalid`](Self::handle_invalid)
///    for one from the peer that failed decoding or its checksum;
///    [`handle_release`](Self::handle_release) when the application frees buffers of
///    delivered frames; [`handle_timeout`](Self::handle_timeout) once the time reaches
///    [`poll_timeout`](Self::poll_timeout).
/// 2. Outputs: [`poll_transmit`](Self::poll_transmit) until `None` (send each datagram
///    before the next call); [`poll_deliver`](Self::poll_deliver) until `None` (frames
///    in order, for the message layer); [`poll_event`](Self::poll_event) until `None`.
/// 3. Arm the timer at [`poll_timeout`](Self::poll_timeout).
///
/// [`is_blocked`](Self::is_blocked) tells whether sends wait for credits.
///
/// Liveness ([`Config::heartbeat`], [`Config::peer_timeout`]), in every mode: when
/// nothing went to the peer for the heartbeat interval, `poll_transmit` hands out a
/// heartbeat (an `Ack` frame with the current acknowledgement and credits and an empty
/// bitmap; the peer takes it like any acknowledgement); when no valid frame came from the
/// peer for the peer timeout, the channel fails with [`ChannelError::Silent`] (once; the
/// sender then refuses sends, like after [`ChannelError::Unreachable`]). Both clocks start
/// at the first time given to any method. Both timers are part of
/// [`poll_timeout`](Self::poll_timeout), so the caller needs nothing beyond the call
/// order above. A failed channel, or one whose peer said goodbye, has neither timer.
/// Heartbeats leave sequence numbers, credits, the acknowledgement policy and
/// [`is_idle`](Self::is_idle) as they are.
pub struct Duplex<B> {
    mode: Mode,
    checksum: bool,
    sender: Sender,
    receiver: Receiver<B>,
    events: VecDeque<Event>,
    heartbeat: Option<Duration>,
    peer_timeout: Option<Duration>,
    /// When the last valid frame came from the peer (the first time seen, before any).
    last_heard: Option<Time>,
    /// When the last frame left for the peer (the first time seen, before any).
    last_sent: Option<Time>,
    /// The heartbeat timer fired: the next `poll_transmit` sends one.
    heartbeat_due: bool,
    /// The peer said goodbye.
    peer_closed: bool,
    /// What ended the channel, once it failed.
    failure: Option<ChannelError>,
    heartbeats: u64,
}

impl<B> Duplex<B> {
    /// The state for a new pair. `template` gives the addressing fields of every frame
    /// sent (see [`Sender::new`]).
    pub fn new(cfg: &Config, template: Header) -> Result<Duplex<B>, ConfigError> {
        Ok(Duplex {
            mode: cfg.mode,
            checksum: cfg.checksums(),
            sender: Sender::new(cfg, template)?,
            receiver: Receiver::new(cfg)?,
            events: VecDeque::new(),
            heartbeat: cfg.heartbeat,
            peer_timeout: cfg.peer_timeout,
            last_heard: None,
            last_sent: None,
            heartbeat_due: false,
            peer_closed: false,
            failure: None,
            heartbeats: 0,
        })
    }

    /// Starts both directions' sequence numbers at `seq` (for tests of wrapping).
    #[cfg(test)]
    pub(crate) fn start_at(&mut self, seq: u32) {
        self.sender.start_at(seq);
        self.receiver.start_at(seq);
    }

    /// Builds and queues the frames of a message; see [`Sender::send`].
    pub fn send(&mut self, now: Time, msg: &[u8]) -> Result<SendStatus, SendError> {
        self.start_clocks(now);
        self.sender.send(now, msg)
    }

    /// Starts a message handed over a part at a time; see [`Sender::begin_send`].
    pub fn begin_send(&self, len: usize) -> Result<PartialSend, SendError> {
        self.sender.begin_send(len)
    }

    /// Queues the next frames of a message begun with [`begin_send`](Self::begin_send);
    /// see [`Sender::send_part`]. True when the message is wholly queued.
    pub fn send_part(
        &mut self,
        now: Time,
        head: &[u8],
        body: &[u8],
        part: &mut PartialSend,
        ahead: usize,
    ) -> bool {
        self.start_clocks(now);
        self.sender.send_part(now, head, body, part, ahead)
    }

    /// A message of one frame, sent at once: the frame that [`send`](Self::send) followed
    /// by [`poll_transmit_kept`](Self::poll_transmit_kept) would hand out, with the same
    /// state after it (see [`Sender::send_lone`]). `None`, changing nothing, unless
    /// [`Sender::takes_lone`]. Afterwards
    /// [`wants_transmit`](Self::wants_transmit) says whether more is to be sent (an
    /// acknowledgement that needs a frame of its own).
    #[inline]
    pub fn send_lone(&mut self, now: Time, head: &[u8], body: &[u8]) -> Option<TxFrame> {
        let stamp = self.receiver.ack_stamp();
        let frame = self.sender.send_lone(now, head, body, stamp)?;
        self.start_clocks(now);
        self.receiver.on_ack_sent(now, AckSent::Piggybacked);
        self.sent_at(now);
        Some(frame)
    }

    /// Takes in a decoded frame from the peer; `buf` is the caller's handle for its
    /// datagram. Returns `Some(buf)` when the frame is not kept (it may be freed at once),
    /// `None` when it will come out of [`poll_deliver`](Self::poll_deliver).
    ///
    /// When checksums are on, a frame without the CHECKSUM flag is treated as corrupt.
    /// Any other frame shows that the peer is alive (see [`Config::peer_timeout`]).
    pub fn handle_frame(&mut self, now: Time, header: &Header, buf: B) -> Option<B> {
        if self.checksum && !header.flags.contains(Flags::CHECKSUM) {
            self.handle_invalid(now);
            return Some(buf);
        }
        let stamp = self.heard(now, header);
        match header.kind {
            FrameKind::Data => {
                self.sender.handle_ack(now, stamp, None);
                let kept = self.receiver.handle_data(now, header.seq, buf);
                self.collect_errors();
                kept
            }
            FrameKind::Ack => {
                self.sender
                    .handle_ack(now, stamp, Some(Sack::of(header.flags, header.seq)));
                Some(buf)
            }
            FrameKind::Heartbeat => {
                self.sender.handle_ack(now, stamp, None);
                self.receiver.handle_probe(now, header.seq);
                self.collect_errors();
                Some(buf)
            }
            FrameKind::Goodbye => {
                self.peer_closed = true;
                self.heartbeat_due = false;
                self.events.push_back(Event::PeerClosed);
                Some(buf)
            }
        }
    }

    /// Takes in a decoded `Data` frame from the peer that arrived in order, and delivers
    /// it at once, if [`Receiver::takes_in_order`] allows: true when it did (the state is
    /// then that of [`handle_frame`](Self::handle_frame) followed by the
    /// [`poll_deliver`](Self::poll_deliver) that returns this frame, so the caller hands
    /// the frame on itself); false, changing nothing, when the frame needs
    /// [`handle_frame`](Self::handle_frame).
    #[inline]
    pub fn take_in_order(&mut self, now: Time, header: &Header) -> bool {
        if header.kind != FrameKind::Data
            || (self.checksum && !header.flags.contains(Flags::CHECKSUM))
            || !self.receiver.takes_in_order(header.seq)
        {
            return false;
        }
        let stamp = self.heard(now, header);
        self.sender.handle_ack(now, stamp, None);
        self.receiver.take_in_order(now);
        self.collect_errors();
        true
    }

    /// A valid frame from the peer arrived at `now`: the liveness clocks move, and its
    /// acknowledgement fields are returned.
    #[inline]
    fn heard(&mut self, now: Time, header: &Header) -> AckStamp {
        self.start_clocks(now);
        if self.last_heard.is_some_and(|t| t < now) {
            self.last_heard = Some(now);
        }
        AckStamp {
            ack: header.ack,
            credits: header.credits,
        }
    }

    /// The root of a group channel takes in what its members acknowledged together
    /// (the smallest acknowledgement and credit limit over the live members, which the
    /// engine computes): its sender frees
    /// what every member has and sends no further than the slowest member's buffers.
    pub fn handle_group_ack(&mut self, now: Time, stamp: AckStamp) {
        self.start_clocks(now);
        self.sender.handle_ack(now, stamp, None);
    }

    /// See [`Sender::note_repair`].
    pub fn note_repair(&mut self, seq: u32, now: Time) -> bool {
        self.sender.note_repair(seq, now)
    }

    /// A datagram from the peer that failed decoding or its checksum; see
    /// [`Receiver::handle_corrupt`].
    pub fn handle_invalid(&mut self, now: Time) {
        self.start_clocks(now);
        self.receiver.handle_corrupt(now);
        self.collect_errors();
    }

    /// The application released `n` buffers of delivered frames; see
    /// [`Receiver::handle_release`].
    pub fn handle_release(&mut self, now: Time, n: u32) -> u32 {
        self.start_clocks(now);
        self.receiver.handle_release(now, n)
    }

    /// Fires whichever timers are due: retransmission, probe, delayed acknowledgement,
    /// heartbeat, and silence ([`ChannelError::Silent`], unless the sender failed first).
    pub fn handle_timeout(&mut self, now: Time) {
        self.start_clocks(now);
        self.sender.handle_timeout(now);
        self.receiver.handle_timeout(now);
        self.collect_errors();
        if !self.is_live() {
            return;
        }
        if let (Some(heard), Some(limit)) = (self.last_heard, self.peer_timeout) {
            if heard + limit <= now {
                self.sender.abort();
                self.heartbeat_due = false;
                let e = ChannelError::Silent {
                    silence: now.saturating_since(heard),
                };
                self.failure = Some(e);
                self.events.push_back(Event::Error(e));
                return;
            }
        }
        if self.heartbeat_deadline().is_some_and(|d| d <= now) {
            self.heartbeat_due = true;
        }
    }

    #[cfg(test)]
    /// The next datagram to send to the peer: a retransmission, a new data frame or a
    /// probe, each carrying the current acknowledgement; else an explicit `Ack` if one is
    /// due; else a heartbeat if its timer fired. Send it before the next call.
    pub fn poll_transmit(&mut self, now: Time) -> Option<&[u8]> {
        let frame = self.poll_transmit_kept(now)?;
        Some(self.sender.frame_bytes(frame))
    }

    /// Like [`poll_transmit`](Self::poll_transmit), but says where the datagram is
    /// ([`TxFrame`]): a data frame kept for retransmission stays readable through
    /// `self.sender().kept_frame(seq)` until the next frame from the peer is handled, so
    /// that a batch of them goes out without a copy each; the bytes of a
    /// [`TxFrame::Scratch`] must be taken (`self.sender().frame_bytes`) before the next
    /// call.
    pub fn poll_transmit_kept(&mut self, now: Time) -> Option<TxFrame> {
        self.start_clocks(now);
        let stamp = self.receiver.ack_stamp();
        if self.sender.has_transmit() {
            self.receiver.on_ack_sent(now, AckSent::Piggybacked);
            let frame = self.sender.poll_transmit_kept(now, stamp);
            if frame.is_some() {
                self.last_sent = Some(now);
                self.heartbeat_due = false;
            }
            return frame;
        }
        if self.receiver.ack_due().is_some() {
            let sack = self.receiver.sack_bitmap();
            self.receiver.on_ack_sent(now, AckSent::Explicit);
            self.sent_at(now);
            return Some(self.sender.build_ack(stamp, sack));
        }
        if self.heartbeat_due && self.is_live() {
            // Not an acknowledgement as far as the receiver's policy goes (no
            // `on_ack_sent`): it only repeats the current stamp, with no bitmap.
            self.sent_at(now);
            self.heartbeats += 1;
            return Some(self.sender.build_ack(stamp, Sack::default()));
        }
        None
    }

    /// Whether [`poll_transmit_kept`](Self::poll_transmit_kept) (or
    /// [`poll_transmit`](Self::poll_transmit)) might hand out a frame now: false only when
    /// it would return `None` and change nothing that matters. Asking first spares a
    /// transmit loop its last, empty call (two per ping-pong message, about 45
    /// instructions between them).
    #[inline(always)]
    pub fn wants_transmit(&self) -> bool {
        self.last_heard.is_none()
            || self.last_sent.is_none()
            || self.sender.wants_transmit()
            || self.receiver.ack_due().is_some()
            || (self.heartbeat_due && self.is_live())
    }

    /// The next received frame in order.
    pub fn poll_deliver(&mut self) -> Option<B> {
        self.receiver.poll_deliver()
    }

    /// The next event (errors of either direction, the peer closing).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.collect_errors();
        self.events.pop_front()
    }

    /// The earliest deadline at which [`handle_timeout`](Self::handle_timeout) has work
    /// (the liveness timers included).
    pub fn poll_timeout(&self) -> Option<Time> {
        let protocol = earliest(self.sender.poll_timeout(), self.receiver.poll_timeout());
        if !self.is_live() {
            return protocol;
        }
        let silence = self.last_heard.zip(self.peer_timeout).map(|(t, d)| t + d);
        let heartbeat = (!self.heartbeat_due)
            .then(|| self.heartbeat_deadline())
            .flatten();
        earliest(protocol, earliest(silence, heartbeat))
    }

    /// Sends a pending acknowledgement with the next [`poll_transmit`](Self::poll_transmit)
    /// instead of waiting for the acknowledgement timer.
    pub fn flush_ack(&mut self) {
        self.receiver.flush_ack();
    }

    /// Whether sends wait on the blocked-sends queue for credits.
    pub fn is_blocked(&self) -> bool {
        self.sender.is_blocked()
    }

    /// Whether everything sent is acknowledged and nothing waits to be sent (heartbeats
    /// do not count: an idle channel that heartbeats is idle).
    pub fn is_idle(&self) -> bool {
        self.sender.is_idle()
    }

    /// Whether the channel failed: [`ChannelError::Unreachable`] or
    /// [`ChannelError::Silent`] was reported (or is about to be, by
    /// [`poll_event`](Self::poll_event)). Sends are refused from then on.
    pub fn is_failed(&self) -> bool {
        self.failure.is_some() || self.sender.is_failed()
    }

    /// What ended the channel, once it failed (see [`is_failed`](Self::is_failed)).
    pub fn failure(&self) -> Option<ChannelError> {
        self.failure
    }

    #[cfg(test)]
    /// Whether the peer said goodbye (`Goodbye` arrived; [`Event::PeerClosed`]).
    pub fn is_peer_closed(&self) -> bool {
        self.peer_closed
    }

    #[cfg(test)]
    /// When the last valid frame came from the peer; before any, the first time this
    /// state was given (where the silence clock starts). `None` before any time was
    /// given.
    pub fn last_heard(&self) -> Option<Time> {
        self.last_heard
    }

    /// The outgoing channel's state.
    pub fn sender(&self) -> &Sender {
        &self.sender
    }

    #[cfg(any(test, feature = "fuzzing"))]
    /// The incoming channel's state.
    pub fn receiver(&self) -> &Receiver<B> {
        &self.receiver
    }

    /// The buffers the incoming channel keeps ([`Receiver::kept_mut`]).
    pub fn kept_mut(&mut self) -> impl Iterator<Item = &mut B> {
        self.receiver.kept_mut()
    }

    /// The counters of both directions, summed.
    pub fn counters(&self) -> Counters {
        let mut c = self.sender.counters().clone();
        c.add(self.receiver.counters());
        c.heartbeats += self.heartbeats;
        c
    }

    #[inline(always)]
    fn collect_errors(&mut self) {
        while let Some(e) = self.receiver.poll_error() {
            self.events.push_back(Event::Error(e));
        }
        while let Some(e) = self.sender.poll_error() {
            if matches!(e, ChannelError::Unreachable { .. }) && self.failure.is_none() {
                self.failure = Some(e);
            }
            self.events.push_back(Event::Error(e));
        }
    }

    /// Starts the liveness clocks at the first time given: a peer never heard from has
    /// been silent since then.
    fn start_clocks(&mut self, now: Time) {
        if self.last_heard.is_none() {
            self.last_heard = Some(now);
        }
        if self.last_sent.is_none() {
            self.last_sent = Some(now);
        }
    }

    /// A frame left for the peer at `now`: no heartbeat is needed before `now + heartbeat`.
    fn sent_at(&mut self, now: Time) {
        self.last_sent = Some(now);
        self.heartbeat_due = false;
    }

    /// When the next heartbeat is due if nothing else goes to the peer first.
    fn heartbeat_deadline(&self) -> Option<Time> {
        self.last_sent.zip(self.heartbeat).map(|(t, d)| t + d)
    }

    /// Whether the liveness timers run: the channel has not failed and the peer has not
    /// said goodbye.
    fn is_live(&self) -> bool {
        !self.peer_closed && !self.is_failed()
    }
}

impl<B> std::fmt::Debug for Duplex<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Duplex")
            .field("mode", &self.mode)
            .field("in_flight", &self.sender.in_flight())
            .field("queued", &self.sender.queued_frames())
            .field("expected", &self.receiver.expected())
            .field("held", &self.receiver.held())
            .finish_non_exhaustive()
    }
}

/// Convenience for callers whose datagram handle is the datagram itself.
impl Duplex<Vec<u8>> {
    #[cfg(test)]
    /// Decodes `datagram` and feeds it as [`handle_frame`](Self::handle_frame) or
    /// [`handle_invalid`](Self::handle_invalid) would. Returns the datagram if it is not
    /// kept.
    pub fn handle_datagram(&mut self, now: Time, datagram: Vec<u8>) -> Option<Vec<u8>> {
        match crate::wire::decode(&datagram) {
            Ok(frame) => {
                let header = frame.header;
                self.handle_frame(now, &header, datagram)
            }
            Err(_) => {
                self.handle_invalid(now);
                Some(datagram)
            }
        }
    }
}
