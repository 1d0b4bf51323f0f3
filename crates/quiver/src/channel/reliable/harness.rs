//! Test harness: a [`Duplex`] with a small application on top, as a simulator node.
//!
//! The application sends scripted messages at scripted times, reassembles what arrives
//! with the existing [`RxChannel`], releases each frame's buffer after a chosen delay,
//! and records everything for the tests to check.

use std::collections::VecDeque;
use std::time::Duration;

use super::time::earliest;
use super::{ChannelError, Config, Duplex, Event, PartialSend, SendStatus, Time};
use crate::channel::{Delivery, RxChannel, SpareBuffers};
use crate::link::sim::{Limits, LinkConfig, Network, SimError, SimNode, SimRng};
use crate::wire::{decode, Flags, FrameKind, Header};

/// One endpoint of a simulated pair (or of a star: `peer` is fixed per node).
pub(super) struct Peer {
    pub duplex: Duplex<Vec<u8>>,
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
    /// The message being handed over a part at a time.
    current: Option<(Vec<u8>, PartialSend)>,
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
    fn push_sends(&mut self, now: Time) {
        loop {
            if let Some((m, part)) = &mut self.current {
                let ahead = self.send_ahead.expect("parts only with send_ahead");
                // A header and its payload as two slices: split a third of the way in.
                let (head, body) = m.split_at(m.len() / 3);
                if !self.duplex.send_part(now, head, body, part, ahead) {
                    return;
                }
                let (m, part) = self.current.take().expect("checked above");
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
                match self.duplex.begin_send(m.len()) {
                    Ok(part) => self.current = Some((m, part)),
                    Err(_) => {
                        self.refused_sends += 1;
                        self.sent.push(m);
                    }
                }
                continue;
            }
            match self.duplex.send(now, &m) {
                Ok(SendStatus::Blocked) => self.blocked_sends += 1,
                Ok(SendStatus::Ready) => {}
                Err(_) => self.refused_sends += 1,
            }
            self.sent.push(m);
        }
    }

    fn drain(&mut self, now: Time) {
        while let Some(datagram) = self.duplex.poll_deliver() {
            let Ok(frame) = decode(&datagram) else {
                self.rx_anomalies += 1;
                continue;
            };
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
            let msg = match o.delivery {
                Delivery::None => None,
                Delivery::InPlace => Some(frame.data().to_vec()),
                Delivery::Assembled(v) => Some(v),
            };
            if let Some(m) = msg {
                self.received.push(m);
                self.last_received = Some(now);
            }
            if self.release_delay.is_zero() {
                self.duplex.handle_release(now, 1);
            } else {
                self.releases.push_back(now + self.release_delay);
            }
        }
        while let Some(ev) = self.duplex.poll_event() {
            if let Event::Error(e) = ev {
                self.errors.push((now, e));
            }
        }
    }
}

impl SimNode for Peer {
    fn handle_datagram(&mut self, now: Duration, _from: usize, datagram: Vec<u8>) {
        let now = Time::from_duration(now);
        self.duplex.handle_datagram(now, datagram);
        // An acknowledgement may have opened the window for a message sent in parts.
        self.push_sends(now);
        self.drain(now);
    }

    fn handle_timeout(&mut self, now: Duration) {
        let now = Time::from_duration(now);
        self.duplex.handle_timeout(now);
        while self.releases.front().is_some_and(|&t| t <= now) {
            self.releases.pop_front();
            self.duplex.handle_release(now, 1);
        }
        self.push_sends(now);
        self.drain(now);
    }

    fn poll_transmit(&mut self, now: Duration) -> Option<(usize, Vec<u8>)> {
        let now = Time::from_duration(now);
        let peer = self.peer;
        // Every simulated schedule checks the promise the endpoint's transmit loop relies
        // on: a channel that does not want to transmit has nothing to hand out.
        let wants = self.duplex.wants_transmit();
        let out = self.duplex.poll_transmit(now).map(|d| (peer, d.to_vec()));
        assert!(
            wants || out.is_none(),
            "wants_transmit said no, poll_transmit gave a frame"
        );
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
