//! Fuzzes the reliable channel (`channel::reliable::Duplex`, sans-IO): two endpoints
//! joined by a network that the input controls, driven by a sequence of operations
//! decoded from the input: sends (whole, of one frame at once, or a part at a time),
//! transmissions, arrivals of what is on the network (in order, reordered, duplicated,
//! dropped or corrupted), forged frames with arbitrary or nearly right headers (kind,
//! flags, sequence number or selective-acknowledgement bitmap, acknowledgement,
//! credits), deliveries to the application and releases of its buffers, time advances
//! and timeouts.
//!
//! Input: three bytes of configuration (mode, recovery, checksums, liveness, timeouts;
//! window; datagram size), then operations of an opcode byte and its arguments (bytes
//! past the end read as 0). `CHANNEL_FRAMES_TRACE=1` prints each operation (to replay a
//! crash: `CHANNEL_FRAMES_TRACE=1 <binary> <input>`).
//!
//! Asserts, for both endpoints after every operation, besides never panicking:
//!
//! - the receive side keeps at most W buffers, counting those delivered and not yet
//!   released (so out-of-order frames cannot pile up), and gives every buffer back
//!   exactly once (at once, or by `poll_deliver`);
//! - the send side has at most W frames unacknowledged when it retransmits; after its
//!   frames are drained, frames still queued are queued because the window is closed;
//! - a transmit loop ends (at most W resends, the queued frames, a probe, an
//!   acknowledgement and a heartbeat), `wants_transmit` is false only when nothing
//!   would be sent, and every frame sent decodes, with a checksum exactly when the
//!   configuration asks for one, and a resent frame carries the same body;
//! - each input reports at most one event, and the channel fails (`Unreachable` or
//!   `Silent`) at most once, refusing sends from then on;
//! - after `handle_timeout`, no deadline is due any more (no busy loop);
//! - while no frame was forged or corrupted past its checksum, deliveries are the
//!   peer's frames, with the bodies it sent: all of them in order when the mode
//!   retransmits, in increasing order otherwise.
#![no_main]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use quiver::fuzzing::channel::{
    ChannelError, Config, Duplex, Event, Mode, PartialSend, Recovery, SendError, Time, MAX_WINDOW,
};
use quiver::wire::{decode, Flags, FrameKind, Header, HEADER_LEN, MIN_DATAGRAM};

/// A received datagram as the channel holds it: an id to account for it by, and its
/// bytes.
struct Buf {
    id: u64,
    bytes: Vec<u8>,
}

/// The fuzz input, read front to back; past its end every read is 0.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
}

fn template(me: usize) -> Header {
    Header {
        kind: FrameKind::Data,
        flags: Flags::EMPTY,
        src_dpid: me as u16,
        dst_dpid: 1 - me as u16,
        credits: 0,
        src_rank: me as u32,
        job_id: 7,
        token: 0x5eed_f00d,
        seq: 0,
        ack: 0,
        checksum: 0,
    }
}

fn config(sel: u8, window: u8, datagram: u8) -> Config {
    let cfg = Config {
        mode: match sel & 3 {
            0 => Mode::None,
            2 => Mode::Offload,
            _ => Mode::Host,
        },
        recovery: if sel & 4 != 0 {
            Recovery::Selective
        } else {
            Recovery::GoBackN
        },
        window: match window {
            0..=239 => 1 + u16::from(window % 16),
            240..=253 => 32 + u16::from(window % 32),
            254 => 1024,
            255 => MAX_WINDOW,
        },
        max_datagram: MIN_DATAGRAM + usize::from(datagram % 48),
        checksum: sel & 8 != 0,
        max_timeouts: if sel & 0x20 != 0 { 2 } else { 12 },
        ack_delay: if sel & 0x40 != 0 {
            Duration::ZERO
        } else {
            Duration::from_micros(200)
        },
        ..Config::default()
    };
    if sel & 0x10 != 0 {
        cfg.with_peer_timeout(Duration::from_millis(50))
    } else {
        Config {
            heartbeat: None,
            peer_timeout: None,
            ..cfg
        }
    }
}

/// One endpoint, with the application's accounting around it.
struct Side {
    d: Duplex<Buf>,
    /// Ids of the buffers the channel kept (out of order, or not delivered yet).
    kept: HashSet<u64>,
    /// Frames delivered to the application and not released yet.
    unreleased: u32,
    /// `Unreachable` or `Silent` events seen.
    failures: u32,
    /// A message handed over a part at a time: its bytes, where its head ends, its plan.
    partial: Option<(Vec<u8>, usize, PartialSend)>,
    /// Sequence number of the last frame delivered.
    last_delivered: Option<u32>,
    /// Inputs (`handle_*`, `take_in_order`) in the current operation.
    inputs: usize,
    messages: u32,
}

struct World {
    window: usize,
    retransmits: bool,
    checksums: bool,
    sides: [Side; 2],
    /// Datagrams on their way from side `i` to the other.
    net: [VecDeque<Vec<u8>>; 2],
    /// The bodies of the data frames side `i` sent, by sequence number.
    sent: [HashMap<u32, Vec<u8>>; 2],
    now: Time,
    next_id: u64,
    /// A frame was forged, or corrupted past its checksum: deliveries are no longer
    /// compared with what was sent.
    forged: bool,
}

impl World {
    fn new(cfg: &Config) -> World {
        let side = |me| Side {
            d: Duplex::new(cfg, template(me)).expect("the target builds valid configurations"),
            kept: HashSet::new(),
            unreleased: 0,
            failures: 0,
            partial: None,
            last_delivered: None,
            inputs: 0,
            messages: 0,
        };
        World {
            window: usize::from(cfg.window),
            retransmits: cfg.mode.retransmits(),
            checksums: cfg.checksums(),
            sides: [side(0), side(1)],
            net: [VecDeque::new(), VecDeque::new()],
            sent: [HashMap::new(), HashMap::new()],
            now: Time::ZERO,
            next_id: 0,
            forged: false,
        }
    }

    /// A datagram side `s` sent: checked, recorded and put on the network.
    fn sent_frame(&mut self, s: usize, bytes: Vec<u8>) {
        let frame =
            decode(&bytes).unwrap_or_else(|e| panic!("side {s} sent an undecodable frame: {e}"));
        let h = frame.header;
        assert_eq!(h.src_dpid, s as u16, "the template's addressing is kept");
        assert_eq!(
            h.flags.contains(Flags::CHECKSUM),
            self.checksums,
            "{h:?}: checksum flag against the configuration"
        );
        if h.kind == FrameKind::Data {
            match self.sent[s].get(&h.seq) {
                Some(body) => assert_eq!(&body[..], frame.body, "frame {} resent changed", h.seq),
                None => {
                    self.sent[s].insert(h.seq, frame.body.to_vec());
                }
            }
        }
        let net = &mut self.net[s];
        net.push_back(bytes);
        if net.len() > 4 * self.window + 64 {
            net.pop_front(); // the network's queue overflows
        }
    }

    /// Polls up to `max` frames out of side `s` onto the network.
    fn transmit(&mut self, s: usize, max: usize) {
        let now = self.now;
        let bound = self.window + self.sides[s].d.sender().queued_frames() + 3;
        let mut n = 0;
        while n < max {
            let d = &mut self.sides[s].d;
            let wants = d.wants_transmit();
            let Some(frame) = d.poll_transmit_kept(now) else {
                break;
            };
            assert!(wants, "wants_transmit said nothing would be sent");
            let bytes = d.sender().frame_bytes(frame).to_vec();
            n += 1;
            assert!(n <= bound, "the transmit loop does not end ({n} frames)");
            self.sent_frame(s, bytes);
        }
        let d = &self.sides[s].d;
        if n < max && !d.is_failed() && d.sender().queued_frames() > 0 {
            assert!(d.is_blocked(), "frames queued with the window open");
        }
    }

    /// A frame delivered to side `to`'s application.
    fn delivered(&mut self, to: usize, bytes: &[u8]) {
        self.sides[to].unreleased += 1;
        if self.forged {
            return;
        }
        let frame = decode(bytes).expect("an unforged delivery decodes");
        let seq = frame.header.seq;
        let side = &mut self.sides[to];
        match side.last_delivered {
            Some(last) if self.retransmits => assert_eq!(seq, last.wrapping_add(1), "a gap"),
            None if self.retransmits => assert_eq!(seq, 0, "the first frame missed"),
            Some(last) => assert!(seq > last, "frame {seq} delivered after {last}"),
            None => {}
        }
        side.last_delivered = Some(seq);
        let body = self.sent[1 - to]
            .remove(&seq)
            .unwrap_or_else(|| panic!("frame {seq} delivered but never sent"));
        assert_eq!(&body[..], frame.body, "frame {seq} delivered changed");
    }

    /// A datagram arrives at side `to`; `fast` tries the in-order path first.
    fn arrive(&mut self, to: usize, bytes: Vec<u8>, fast: bool) {
        let now = self.now;
        let side = &mut self.sides[to];
        side.inputs += 1;
        let header = match decode(&bytes) {
            Ok(frame) => frame.header,
            Err(_) => return side.d.handle_invalid(now),
        };
        if fast && side.d.take_in_order(now, &header) {
            return self.delivered(to, &bytes);
        }
        self.hand_in(to, &header, bytes);
    }

    fn hand_in(&mut self, to: usize, header: &Header, bytes: Vec<u8>) {
        let id = self.next_id;
        self.next_id += 1;
        let side = &mut self.sides[to];
        match side.d.handle_frame(self.now, header, Buf { id, bytes }) {
            Some(back) => assert_eq!(back.id, id, "another buffer given back"),
            None => {
                side.kept.insert(id);
            }
        }
    }

    /// Delivers everything side `s` has to its application.
    fn deliver(&mut self, s: usize) {
        while let Some(buf) = self.sides[s].d.poll_deliver() {
            assert!(
                self.sides[s].kept.remove(&buf.id),
                "buffer {} delivered twice",
                buf.id
            );
            self.delivered(s, &buf.bytes);
        }
    }

    fn release(&mut self, s: usize, n: u32) {
        let side = &mut self.sides[s];
        let n = n.min(side.unreleased);
        assert_eq!(
            side.d.handle_release(self.now, n),
            n,
            "releases of delivered frames"
        );
        side.unreleased -= n;
    }

    fn timeout(&mut self, s: usize) {
        let now = self.now;
        let d = &mut self.sides[s].d;
        self.sides[s].inputs += 1;
        d.handle_timeout(now);
        let next = d.poll_timeout();
        assert!(
            next.is_none_or(|t| t > now),
            "still due after handle_timeout: {next:?}"
        );
    }

    fn message(&mut self, s: usize, len: usize) -> Vec<u8> {
        let side = &mut self.sides[s];
        side.messages += 1;
        let m = side.messages as usize;
        (0..len).map(|i| (m * 31 + i) as u8).collect()
    }

    fn send(&mut self, s: usize, len: usize) {
        let side = &self.sides[s];
        if side.partial.is_some() || side.d.sender().queued_frames() > 4 * self.window + 64 {
            return;
        }
        let failed = side.d.is_failed();
        let msg = self.message(s, len);
        let r = self.sides[s].d.send(self.now, &msg);
        assert_eq!(r.is_err(), failed, "{r:?}");
        if let Err(e) = r {
            assert_eq!(e, SendError::Failed);
        }
    }

    fn send_lone(&mut self, s: usize, len: usize, cut: usize) {
        if self.sides[s].partial.is_some() {
            return;
        }
        let failed = self.sides[s].d.is_failed();
        let msg = self.message(s, len);
        let (head, body) = msg.split_at(cut.min(len));
        let d = &mut self.sides[s].d;
        if let Some(frame) = d.send_lone(self.now, head, body) {
            assert!(!failed, "a failed channel sent");
            let bytes = d.sender().frame_bytes(frame).to_vec();
            self.sent_frame(s, bytes);
        }
    }

    fn send_part(&mut self, s: usize, len: usize, cut: usize, ahead: usize) {
        if self.sides[s].partial.is_none() {
            if self.sides[s].d.sender().queued_frames() > 4 * self.window + 64 {
                return;
            }
            let msg = self.message(s, len);
            let Ok(part) = self.sides[s].d.begin_send(len) else {
                assert!(self.sides[s].d.is_failed());
                return;
            };
            self.sides[s].partial = Some((msg, cut.min(len), part));
        }
        let now = self.now;
        let side = &mut self.sides[s];
        // Continued even on a failed channel: that once re-armed the sender's probe, a
        // deadline a failed sender never clears (found by this target, fixed; the input
        // is `fuzz/corpus/channel_frames/regression-failed-probe`).
        let Some((msg, cut, part)) = side.partial.as_mut() else {
            return;
        };
        let (head, body) = msg.split_at(*cut);
        if side.d.send_part(now, head, body, part, ahead) {
            side.partial = None;
        }
    }

    /// What a driver does: timers, transmissions, arrivals in order, deliveries and
    /// releases, on both sides.
    fn pump(&mut self) {
        for s in 0..2 {
            if self.sides[s]
                .d
                .poll_timeout()
                .is_some_and(|t| t <= self.now)
            {
                self.timeout(s);
            }
            self.transmit(s, usize::MAX);
        }
        for s in 0..2 {
            while let Some(bytes) = self.net[s].pop_front() {
                self.arrive(1 - s, bytes, true);
            }
        }
        for s in 0..2 {
            self.deliver(s);
            self.release(s, u32::MAX);
        }
    }

    /// Acts on the datagram at `i` of what side `s` sent.
    fn network(&mut self, s: usize, action: u8, i: usize, at: usize, flip: u8) {
        let net = &mut self.net[s];
        if net.is_empty() {
            return;
        }
        let i = i % net.len();
        let bytes = match action % 4 {
            0 => net.remove(i),
            1 => net.get(i).cloned(),
            2 => {
                net.remove(i);
                return;
            }
            _ => net.remove(i).map(|mut b| {
                let at = at % b.len();
                b[at] ^= flip | 1;
                if decode(&b).is_ok() {
                    self.forged = true;
                }
                b
            }),
        };
        if let Some(bytes) = bytes {
            self.arrive(1 - s, bytes, action & 4 != 0);
        }
    }

    /// A frame made up from the input arrives at side `s`.
    fn forge(&mut self, s: usize, inp: &mut Input) {
        self.forged = true;
        let kind = FrameKind::ALL[usize::from(inp.u8() % 4)];
        let flags = Flags::from_bits(inp.u8() & Flags::ALL.bits()).unwrap_or(Flags::EMPTY);
        let near = inp.u8();
        let (seq, ack) = (inp.u32(), inp.u32());
        // Nearly right values reach more states than arbitrary ones.
        let seq = if near & 1 != 0 {
            let expected = self.sides[s].d.receiver().expected();
            expected.wrapping_add(i32::from(seq as i8) as u32)
        } else {
            seq
        };
        let ack = if near & 2 != 0 {
            let peer_expects = self.sides[1 - s].d.receiver().expected();
            peer_expects.wrapping_add(i32::from(ack as i8) as u32)
        } else {
            ack
        };
        let credits = if near & 4 != 0 {
            inp.u16() % (2 * self.window).min(usize::from(u16::MAX)) as u16
        } else {
            inp.u16()
        };
        let header = Header {
            kind,
            flags,
            seq,
            ack,
            credits,
            ..template(1 - s)
        };
        let mut head = [0; HEADER_LEN];
        header.emit(&mut head);
        let bytes = head.to_vec();
        self.sides[s].inputs += 1;
        if near & 8 != 0 && self.sides[s].d.take_in_order(self.now, &header) {
            return self.delivered(s, &bytes);
        }
        self.hand_in(s, &header, bytes);
    }

    fn check(&mut self, s: usize, last: bool) {
        let w = self.window;
        let side = &mut self.sides[s];
        let mut events = 0;
        while let Some(e) = side.d.poll_event() {
            events += 1;
            if let Event::Error(ChannelError::Unreachable { .. } | ChannelError::Silent { .. }) = e
            {
                side.failures += 1;
                assert_eq!(side.failures, 1, "the channel failed twice: {e:?}");
                assert!(side.d.is_failed());
            }
        }
        assert!(
            events <= side.inputs,
            "{events} events from {} inputs",
            side.inputs
        );
        side.inputs = 0;
        // The channel's own count walks its whole ring (W slots under selective repeat):
        // after every operation for small windows, at the end for large ones.
        if w <= 256 || last {
            assert_eq!(side.d.kept_mut().count(), side.kept.len(), "buffers kept");
        }
        let kept = side.kept.len();
        assert!(
            kept + side.unreleased as usize <= w,
            "{kept} buffers kept and {} delivered unreleased, window {w}",
            side.unreleased
        );
        let held = side.d.receiver().held();
        assert!(held as usize <= w && held >= side.unreleased, "held {held}");
        if self.retransmits {
            let in_flight = side.d.sender().in_flight() as usize;
            assert!(
                in_flight <= w,
                "{in_flight} frames unacknowledged, window {w}"
            );
        }
    }
}

/// Whether to print each operation (`CHANNEL_FRAMES_TRACE=1`, to replay a crash).
fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("CHANNEL_FRAMES_TRACE").is_some())
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let cfg = config(inp.u8(), inp.u8(), inp.u8());
    if trace() {
        eprintln!("{cfg:?}");
    }
    let payload = cfg.max_datagram - HEADER_LEN;
    let mut world = World::new(&cfg);
    while !inp.0.is_empty() {
        let op = inp.u8();
        let s = usize::from(op >> 7);
        if trace() {
            let d = &world.sides[s].d;
            eprintln!(
                "{:?} side {s} op {}: {d:?}, timeout {:?}",
                world.now,
                op & 0x7f,
                d.poll_timeout()
            );
        }
        match op & 0x7f {
            0..=9 => world.pump(),
            10..=19 => world.send(s, usize::from(inp.u16()) % (4 * payload + 8)),
            20..=24 => world.send_lone(s, usize::from(inp.u8()) % (payload + 1), inp.u8().into()),
            25..=29 => {
                let len = usize::from(inp.u16()) % (6 * payload + 8);
                world.send_part(s, len, inp.u8().into(), usize::from(inp.u8() % 4));
            }
            30..=44 => world.transmit(s, usize::from(inp.u8() % 8)),
            45..=69 => {
                let (action, i, at, flip) = (inp.u8(), inp.u8(), inp.u8(), inp.u8());
                world.network(s, action, i.into(), at.into(), flip);
            }
            70..=79 => world.forge(s, &mut inp),
            80..=84 => {
                world.sides[s].inputs += 1;
                world.sides[s].d.handle_invalid(world.now);
            }
            85..=94 => world.deliver(s),
            95..=104 => world.release(s, inp.u8().into()),
            105..=109 => world.sides[s].d.flush_ack(),
            110..=114 => world.timeout(s),
            _ => {
                let v = u64::from(inp.u16());
                world.now += match inp.u8() % 4 {
                    0 => Duration::from_nanos(v),
                    1 => Duration::from_micros(v),
                    2 => Duration::from_millis(v % 1000),
                    _ => {
                        // To the next deadline of either side.
                        let next = [0, 1]
                            .iter()
                            .filter_map(|&s| world.sides[s].d.poll_timeout())
                            .min();
                        next.map_or(Duration::ZERO, |t| t.saturating_since(world.now))
                    }
                };
            }
        }
        world.check(0, false);
        world.check(1, false);
    }
    world.check(0, true);
    world.check(1, true);
});
