//! Test harness: a [`Duplex`] with a small application on top, as a simulator node.
//!
//! The application sends scripted messages at scripted times, reassembles what arrives
//! with the existing [`RxChannel`], releases each frame's buffer after a chosen delay,
//! and records everything for the tests to check.
//!
//! Like the endpoint, it takes the fast paths where they apply: a message of one frame
//! goes out at once ([`Duplex::send_lone`]), and a whole message in order is delivered
//! at once ([`Duplex::take_in_order`]). A shadow [`Duplex`] beside it takes the general
//! path for every step (`send`, `handle_frame`, `poll_deliver`, `poll_transmit`), and
//! after each step the two must agree on every frame, delivery, event, deadline and
//! counter: every simulated schedule checks that the fast paths change nothing.

use std::collections::VecDeque;
use std::time::Duration;

use super::time::earliest;
use super::{ChannelError, Config, Duplex, Event, PartialSend, SendStatus, Time};
use crate::channel::{Delivery, RxChannel, SpareBuffers};
use crate::link::fault::SimRng;
use crate::link::sim::{Limits, LinkConfig, Network, SimError, SimNode};
use crate::wire::{decode, Flags, FrameKind, Header};

/// One endpoint of a simulated pair (or of a star: `peer` is fixed per node).
pub(super) struct Peer {
    pub duplex: Duplex<Vec<u8>>,
    /// The same channel driven through the general path only, in lockstep.
    shadow: Duplex<Vec<u8>>,
    /// Frames [`Duplex::send_lone`] handed out, to go before anything the channel has.
    sent_at_once: VecDeque<Vec<u8>>,
    /// Messages that took each fast path (for tests that need them taken).
    pub fast_sends: u32,
    pub fast_deliveries: u32,
    pub peer: usize,
    outbox: VecDeque<(Time, Vec<u8>)>,
    /// Every message handed to `send`, in order.
    pub sent: Vec<Vec<u8>>,
    rx: RxChannel,
    spares: SpareBuffers,
    /// Every message reassembled, in order.
    pub received: Vec<Vec<u8>>,
    /// When the last message was reassembled.
    pub last_received: Option<Time>,
    /// Gaps, duplicates or malformed fragments the message layer saw.
    pub rx_anomalies: u32,
    release_delay: Duration,
    releases: VecDeque<Time>,
    /// Every error event, with its time.
    pub errors: Vec<(Time, ChannelError)>,
    /// Sends that returned `Blocked`.
    pub blocked_sends: u32,
    /// Sends refused (the channel failed).
    pub refused_sends: u32,
    /// `Some(ahead)`: hand each message over a part at a time, `ahead` frames beyond the
    /// window, as a blocking writer does (the next message waits until it is all
    /// queued); `None`: whole messages with `send`.
    pub send_ahead: Option<usize>,
    /// The message being handed over a part at a time (with the shadow's plan).
    current: Option<(Vec<u8>, PartialSend, PartialSend)>,
    max_message: usize,
}

pub(super) fn template(me: usize, peer: usize) -> Header {
    Header {
        kind: FrameKind::Data,
        flags: Flags::EMPTY,
        src_dpid: me as u16,
        dst_dpid: peer as u16,
        credits: 0,
        src_rank: me as u32,
        job_id: 7,
        token: 0x5eed_f00d,
        seq: 0,
        ack: 0,
        checksum: 0,
    }
}

impl Peer {
    pub fn new(cfg: &Config, me: usize, peer: usize) -> Peer {
        Peer {
            duplex: Duplex::new(cfg, template(me, peer)).expect("valid test config"),
            shadow: Duplex::new(cfg, template(me, peer)).expect("valid test config"),
            sent_at_once: VecDeque::new(),
            fast_sends: 0,
            fast_deliveries: 0,
            peer,
            outbox: VecDeque::new(),
            sent: Vec::new(),
            rx: RxChannel::new(),
            spares: SpareBuffers::default(),
            received: Vec::new(),
            last_received: None,
            rx_anomalies: 0,
            release_delay: Duration::ZERO,
            releases: VecDeque::new(),
            errors: Vec::new(),
            blocked_sends: 0,
            refused_sends: 0,
            send_ahead: None,
            current: None,
            max_message: 1 << 24,
        }
    }

    /// Schedules `msgs`, one every `gap` from `start`.
    pub fn script(&mut self, msgs: Vec<Vec<u8>>, start: Duration, gap: Duration) {
        let mut t = Time::from_duration(start);
        for m in msgs {
            self.outbox.push_back((t, m));
            t += gap;
        }
    }

    /// The application frees each frame's buffer this long after it is delivered.
    pub fn release_after(&mut self, d: Duration) {
        self.release_delay = d;
    }

    /// Hands the application's due messages to the channel: whole, or (with
    /// `send_ahead`) a part at a time, each message wholly queued before the next begins.
    /// A message of one frame that the window lets out goes out at once.
    fn push_sends(&mut self, now: Time) {
        loop {
            if let Some((m, part, shadow_part)) = &mut self.current {
                let ahead = self.send_ahead.expect("parts only with send_ahead");
                // A header and its payload as two slices: split a third of the way in.
                let (head, body) = m.split_at(m.len() / 3);
                let queued = self.duplex.send_part(now, head, body, part, ahead);
                let shadow = self.shadow.send_part(now, head, body, shadow_part, ahead);
                assert_eq!(queued, shadow, "send_part");
                self.check_lockstep("send_part");
                if !queued {
                    return;
                }
                let (m, part, _) = self.current.take().expect("checked above");
                if part.stalled {
                    self.blocked_sends += 1;
                }
                self.sent.push(m);
            }
            if self.outbox.front().is_none_or(|(t, _)| *t > now) {
                return;
            }
            let Some((_, m)) = self.outbox.pop_front() else {
                return;
            };
            if self.send_ahead.is_some() {
                match (
                    self.duplex.begin_send(m.len()),
                    self.shadow.begin_send(m.len()),
                ) {
                    (Ok(part), Ok(shadow)) => self.current = Some((m, part, shadow)),
                    (Err(_), Err(_)) => {
                        self.refused_sends += 1;
                        self.sent.push(m);
                    }
                    _ => panic!("begin_send: the shadow channel disagrees"),
                }
                continue;
            }
            if let Some(frame) = self.duplex.send_lone(now, &[], &m) {
                let bytes = self.duplex.sender().frame_bytes(frame).to_vec();
                // The general path: queue the message, then transmit, as the endpoint's
                // write does.
                assert!(matches!(self.shadow.send(now, &m), Ok(SendStatus::Ready)));
                let general = self.shadow.poll_transmit(now).map(<[u8]>::to_vec);
                assert_eq!(Some(&bytes), general.as_ref(), "send_lone's frame");
                self.sent_at_once.push_back(bytes);
                self.fast_sends += 1;
                self.sent.push(m);
                self.check_lockstep("send_lone");
                continue;
            }
            let status = self.duplex.send(now, &m);
            let shadow = self.shadow.send(now, &m);
            assert_eq!(status, shadow, "send");
            match status {
                Ok(SendStatus::Blocked) => self.blocked_sends += 1,
                Ok(SendStatus::Ready) => {}
                Err(_) => self.refused_sends += 1,
            }
            self.sent.push(m);
            self.check_lockstep("send");
        }
    }

    /// Asserts that the channel and its shadow, which took the general path at every
    /// step, are in the same state.
    fn check_lockstep(&self, after: &str) {
        let (a, b) = (&self.duplex, &self.shadow);
        assert_eq!(a.counters(), b.counters(), "counters after {after}");
        assert_eq!(a.poll_timeout(), b.poll_timeout(), "deadline after {after}");
        assert_eq!(
            a.wants_transmit(),
            b.wants_transmit(),
            "wants_transmit after {after}"
        );
        assert_eq!(a.is_idle(), b.is_idle(), "is_idle after {after}");
        assert_eq!(a.is_blocked(), b.is_blocked(), "is_blocked after {after}");
        assert_eq!(a.is_failed(), b.is_failed(), "is_failed after {after}");
        assert_eq!(a.last_heard(), b.last_heard(), "last_heard after {after}");
        let (sa, sb) = (a.sender(), b.sender());
        assert_eq!(
            (
                sa.in_flight(),
                sa.queued_frames(),
                sa.queued_bytes(),
                sa.rto(),
                sa.srtt()
            ),
            (
                sb.in_flight(),
                sb.queued_frames(),
                sb.queued_bytes(),
                sb.rto(),
                sb.srtt()
            ),
            "sender after {after}"
        );
        let (ra, rb) = (a.receiver(), b.receiver());
        assert_eq!(
            (
                ra.expected(),
                ra.held(),
                ra.ack_stamp(),
                ra.ack_due(),
                ra.sack_bitmap()
            ),
            (
                rb.expected(),
                rb.held(),
                rb.ack_stamp(),
                rb.ack_due(),
                rb.sack_bitmap()
            ),
            "receiver after {after}"
        );
    }

    /// Takes the frames the channel delivers, in order, and its events.
    fn drain(&mut self, now: Time) {
        while let Some(datagram) = self.duplex.poll_deliver() {
            let shadow = self.shadow.poll_deliver();
            assert_eq!(Some(&datagram), shadow.as_ref(), "poll_deliver");
            self.take_frame(now, &datagram, false);
        }
        assert_eq!(self.shadow.poll_deliver(), None, "poll_deliver");
        while let Some(ev) = self.duplex.poll_event() {
            assert_eq!(Some(ev), self.shadow.poll_event(), "poll_event");
            if let Event::Error(e) = ev {
                self.errors.push((now, e));
            }
        }
        assert_eq!(self.shadow.poll_event(), None, "poll_event");
        self.check_lockstep("delivery");
    }

    /// The message layer's part of a delivered frame: reassembly (unless `whole`, a
    /// message the fast path took), then the release of its buffer.
    fn take_frame(&mut self, now: Time, datagram: &[u8], whole: bool) {
        let Ok(frame) = decode(datagram) else {
            self.rx_anomalies += 1;
            return;
        };
        let msg = if whole {
            Some(frame.data().to_vec())
        } else {
            let h = frame.header;
            let o = self.rx.on_data(
                h.seq,
                h.flags,
                frame.total_len(),
                frame.data(),
                self.max_message,
                &mut self.spares,
            );
            if o.lost > 0 || o.duplicate || o.malformed || o.oversized {
                self.rx_anomalies += 1;
            }
            match o.delivery {
                Delivery::None => None,
                Delivery::InPlace => Some(frame.data().to_vec()),
                Delivery::Assembled(v) => Some(v),
            }
        };
        if let Some(m) = msg {
            self.received.push(m);
            self.last_received = Some(now);
        }
        if self.release_delay.is_zero() {
            self.release(now);
        } else {
            self.releases.push_back(now + self.release_delay);
        }
    }

    fn release(&mut self, now: Time) {
        let n = self.duplex.handle_release(now, 1);
        assert_eq!(n, self.shadow.handle_release(now, 1), "handle_release");
    }

    /// A datagram from the peer, as the endpoint takes it: a whole message in order is
    /// delivered at once ([`Duplex::take_in_order`]); anything else goes through
    /// `handle_frame` and the delivery queue.
    fn take_datagram(&mut self, now: Time, datagram: Vec<u8>) {
        if let Ok(frame) = decode(&datagram) {
            let h = frame.header;
            let whole = h.flags.contains(Flags::FIRST | Flags::LAST)
                && self
                    .rx
                    .takes_whole(h.seq, frame.data().len(), self.max_message);
            if whole && self.duplex.take_in_order(now, &h) {
                self.rx.take_whole();
                self.fast_deliveries += 1;
                let kept = self.shadow.handle_datagram(now, datagram.clone());
                assert_eq!(kept, None, "take_in_order took a frame handle_frame drops");
                assert_eq!(Some(&datagram), self.shadow.poll_deliver().as_ref());
                self.check_lockstep("take_in_order");
                self.take_frame(now, &datagram, true);
                return;
            }
        }
        let kept = self.duplex.handle_datagram(now, datagram.clone());
        let shadow = self.shadow.handle_datagram(now, datagram);
        assert_eq!(kept, shadow, "handle_datagram");
        self.check_lockstep("handle_datagram");
    }
}

impl SimNode for Peer {
    fn handle_datagram(&mut self, now: Duration, _from: usize, datagram: Vec<u8>) {
        let now = Time::from_duration(now);
        self.take_datagram(now, datagram);
        // An acknowledgement may have opened the window for a message sent in parts.
        self.push_sends(now);
        self.drain(now);
    }

    fn handle_timeout(&mut self, now: Duration) {
        let now = Time::from_duration(now);
        self.duplex.handle_timeout(now);
        self.shadow.handle_timeout(now);
        self.check_lockstep("handle_timeout");
        while self.releases.front().is_some_and(|&t| t <= now) {
            self.releases.pop_front();
            self.release(now);
        }
        self.push_sends(now);
        self.drain(now);
    }

    fn poll_transmit(&mut self, now: Duration) -> Option<(usize, Vec<u8>)> {
        let now = Time::from_duration(now);
        let peer = self.peer;
        if let Some(bytes) = self.sent_at_once.pop_front() {
            return Some((peer, bytes));
        }
        // Every simulated schedule checks the promise the endpoint's transmit loop relies
        // on: a channel that does not want to transmit has nothing to hand out.
        let wants = self.duplex.wants_transmit();
        let out = self.duplex.poll_transmit(now).map(|d| (peer, d.to_vec()));
        assert!(
            wants || out.is_none(),
            "wants_transmit said no, poll_transmit gave a frame"
        );
        let shadow = self.shadow.poll_transmit(now).map(<[u8]>::to_vec);
        assert_eq!(
            out.as_ref().map(|(_, d)| d),
            shadow.as_ref(),
            "poll_transmit"
        );
        self.check_lockstep("poll_transmit");
        out
    }

    fn poll_timeout(&self) -> Option<Duration> {
        let t = earliest(
            self.duplex.poll_timeout(),
            earliest(
                // A message sent in parts holds the next back until it is queued, which
                // only an acknowledgement (a datagram) can bring about.
                self.outbox
                    .front()
                    .filter(|_| self.current.is_none())
                    .map(|(t, _)| *t),
                self.releases.front().copied(),
            ),
        );
        t.map(Time::as_duration)
    }
}

/// A node with one [`Peer`] per other node it talks to: a datagram goes to the `Peer` of
/// its sender; transmissions take turns.
pub(super) struct Multi {
    pub peers: Vec<Peer>,
    turn: usize,
}

impl Multi {
    pub fn new(peers: Vec<Peer>) -> Multi {
        Multi { peers, turn: 0 }
    }
}

impl SimNode for Multi {
    fn handle_datagram(&mut self, now: Duration, from: usize, datagram: Vec<u8>) {
        if let Some(p) = self.peers.iter_mut().find(|p| p.peer == from) {
            p.handle_datagram(now, from, datagram);
        }
    }

    fn handle_timeout(&mut self, now: Duration) {
        for p in &mut self.peers {
            if p.poll_timeout().is_some_and(|t| t <= now) {
                p.handle_timeout(now);
            }
        }
    }

    fn poll_transmit(&mut self, now: Duration) -> Option<(usize, Vec<u8>)> {
        let n = self.peers.len();
        for k in 0..n {
            let i = (self.turn + k) % n;
            if let Some(out) = self.peers[i].poll_transmit(now) {
                self.turn = i + 1;
                return Some(out);
            }
        }
        None
    }

    fn poll_timeout(&self) -> Option<Duration> {
        self.peers.iter().filter_map(SimNode::poll_timeout).min()
    }
}

/// A [`Peer`] whose process stops at `at` (`Duration::MAX`: never): from then on it sends nothing, hears nothing
/// and has no timer, as if it crashed. With `goodbye` it first sends a `Goodbye` frame,
/// as an endpoint that closes does.
pub(super) struct Stopping {
    pub peer: Peer,
    me: usize,
    pub at: Duration,
    pub goodbye: bool,
    stopped: bool,
}

impl Stopping {
    /// `peer` is node `me`'s.
    pub fn new(peer: Peer, me: usize, at: Duration, goodbye: bool) -> Stopping {
        Stopping {
            peer,
            me,
            at,
            goodbye,
            stopped: false,
        }
    }

    fn goodbye_frame(&self) -> Vec<u8> {
        let mut h = [0u8; crate::wire::HEADER_LEN];
        Header {
            kind: FrameKind::Goodbye,
            ..template(self.me, self.peer.peer)
        }
        .emit_sealed(&mut h, &[]);
        h.to_vec()
    }
}

impl SimNode for Stopping {
    fn handle_datagram(&mut self, now: Duration, from: usize, datagram: Vec<u8>) {
        if now < self.at {
            self.peer.handle_datagram(now, from, datagram);
        }
    }

    fn handle_timeout(&mut self, now: Duration) {
        if now < self.at {
            self.peer.handle_timeout(now);
        }
    }

    fn poll_transmit(&mut self, now: Duration) -> Option<(usize, Vec<u8>)> {
        if now < self.at {
            return self.peer.poll_transmit(now);
        }
        if self.stopped {
            return None;
        }
        self.stopped = true;
        self.goodbye.then(|| (self.peer.peer, self.goodbye_frame()))
    }

    fn poll_timeout(&self) -> Option<Duration> {
        if self.stopped {
            return None;
        }
        // Wake at `at` to stop (and say goodbye); `Duration::MAX`: never.
        let stop = (self.at < Duration::MAX).then_some(self.at);
        [self.peer.poll_timeout(), stop].into_iter().flatten().min()
    }
}

/// Messages of the given sizes, filled from `seed`, each starting with its index (when
/// it has room) so that no two are equal.
pub(super) fn messages(sizes: &[usize], seed: u64) -> Vec<Vec<u8>> {
    let mut rng = SimRng::new(seed);
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut m: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            let tag = (i as u32).to_le_bytes();
            let k = n.min(4);
            m[..k].copy_from_slice(&tag[..k]);
            m
        })
        .collect()
}

/// A two-node run: node 0 sends `a_to_b`, node 1 sends `b_to_a`, over links `link`.
pub(super) struct PairRun {
    pub peers: Vec<Peer>,
    pub result: Result<Duration, SimError>,
}

pub(super) struct PairSetup {
    pub cfg: Config,
    pub link: LinkConfig,
    pub a_to_b: Vec<Vec<u8>>,
    pub b_to_a: Vec<Vec<u8>>,
    /// Time between two sends of one node.
    pub gap: Duration,
    pub release_delay: Duration,
    /// Both nodes send in parts, this many frames ahead of the window (see
    /// [`Peer::send_ahead`]).
    pub send_ahead: Option<usize>,
    pub limits: Limits,
}

impl PairSetup {
    pub fn new(cfg: Config, link: LinkConfig) -> PairSetup {
        PairSetup {
            cfg,
            link,
            a_to_b: Vec::new(),
            b_to_a: Vec::new(),
            gap: Duration::ZERO,
            release_delay: Duration::ZERO,
            send_ahead: None,
            limits: Limits {
                max_time: Duration::from_secs(120),
                max_steps: 5_000_000,
            },
        }
    }

    pub fn run(self) -> PairRun {
        let mut net = Network::new(2, self.link);
        let mut a = Peer::new(&self.cfg, 0, 1);
        let mut b = Peer::new(&self.cfg, 1, 0);
        a.script(self.a_to_b, Duration::ZERO, self.gap);
        b.script(self.b_to_a, Duration::from_micros(3), self.gap);
        a.release_after(self.release_delay);
        b.release_after(self.release_delay);
        a.send_ahead = self.send_ahead;
        b.send_ahead = self.send_ahead;
        let mut peers = vec![a, b];
        let result = net.run(&mut peers, self.limits);
        PairRun { peers, result }
    }
}

/// Whether `got` is `sent` with some messages left out, in order.
pub(super) fn is_subsequence(got: &[Vec<u8>], sent: &[Vec<u8>]) -> bool {
    let mut it = sent.iter();
    got.iter().all(|g| it.any(|s| s == g))
}
