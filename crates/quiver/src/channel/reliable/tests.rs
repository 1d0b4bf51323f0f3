//! Unit tests of the state machines, driven by hand: every frame moved explicitly, the
//! time given explicitly.

use std::time::Duration;

use super::config::DEFAULT_PEER_TIMEOUT;
use super::harness::template;
use super::*;
use crate::wire::{decode, Flags, FrameKind, FrameView, Header};

fn t(us: u64) -> Time {
    Time::from_micros(us)
}

/// A configuration without liveness timers, so that the deadlines these tests expect are
/// the protocol's only (the liveness tests turn them on).
fn config(mode: Mode, window: u16) -> Config {
    Config {
        window,
        ..Config::with_mode(mode).without_liveness()
    }
}

fn pair(cfg: &Config) -> (Duplex<Vec<u8>>, Duplex<Vec<u8>>) {
    (
        Duplex::new(cfg, template(0, 1)).unwrap(),
        Duplex::new(cfg, template(1, 0)).unwrap(),
    )
}

/// Everything `d` has to send at `now`.
fn out(d: &mut Duplex<Vec<u8>>, now: Time) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    while let Some(f) = d.poll_transmit(now) {
        v.push(f.to_vec());
        assert!(v.len() < 100_000, "poll_transmit never ends");
    }
    v
}

/// Feeds `frames` to `d` at `now`; returns the frames delivered in order.
fn feed(d: &mut Duplex<Vec<u8>>, now: Time, frames: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    for f in frames {
        d.handle_datagram(now, f);
    }
    std::iter::from_fn(|| d.poll_deliver()).collect()
}

fn header(f: &[u8]) -> Header {
    decode(f).expect("a valid frame").header
}

fn data_of(f: &[u8]) -> Vec<u8> {
    decode(f).unwrap().data().to_vec()
}

fn events(d: &mut Duplex<Vec<u8>>) -> Vec<Event> {
    std::iter::from_fn(|| d.poll_event()).collect()
}

/// Moves frames both ways at `now` (a perfect, instant link) until both are quiet;
/// releases every delivered frame at once. Returns the payloads B received.
fn exchange(a: &mut Duplex<Vec<u8>>, b: &mut Duplex<Vec<u8>>, now: Time) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    loop {
        let fa = out(a, now);
        let fb = out(b, now);
        if fa.is_empty() && fb.is_empty() {
            return got;
        }
        for f in feed(b, now, fa) {
            got.push(data_of(&f));
            b.handle_release(now, 1);
        }
        for _ in feed(a, now, fb) {
            a.handle_release(now, 1);
        }
    }
}

#[test]
fn config_is_validated_and_modes_parse() {
    assert!(Config::default().validate().is_ok());
    let e = Config {
        window: 0,
        ..Config::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.field, "window");
    assert!(e.to_string().contains("window"));
    let e = Config {
        max_datagram: 10,
        ..Config::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(e.field, "max_datagram");
    assert!(Duplex::<Vec<u8>>::new(
        &Config {
            rto_min: Duration::from_secs(5),
            ..Config::default()
        },
        template(0, 1)
    )
    .is_err());
    assert_eq!("none".parse::<Mode>(), Ok(Mode::None));
    assert_eq!(Mode::parse(" host "), Ok(Mode::Host));
    assert_eq!(Mode::parse("offload"), Ok(Mode::Offload));
    let e = Mode::parse("nic").unwrap_err();
    assert!(e.to_string().contains("none, host or offload"), "{e}");
    for m in [Mode::None, Mode::Host, Mode::Offload] {
        assert_eq!(Mode::parse(&m.to_string()), Ok(m));
    }
    assert!(!Mode::None.retransmits() && Mode::Offload.retransmits());
}

#[test]
fn kept_frames_are_readable_in_place_until_acknowledged() {
    // A batch handed out with poll_transmit_kept, read afterwards, equals what
    // poll_transmit hands out one by one.
    let cfg = config(Mode::Host, 8);
    let (mut a, mut b) = pair(&cfg);
    let (mut a2, _) = pair(&cfg);
    for d in [&mut a, &mut a2] {
        d.send(t(0), b"hello").unwrap();
        d.send(t(0), &[9; 3000]).unwrap();
    }
    let mut batch = Vec::new();
    while let Some(frame) = a.poll_transmit_kept(t(0)) {
        batch.push(frame);
    }
    assert_eq!(
        batch,
        (0..4).map(TxFrame::Kept).collect::<Vec<_>>(),
        "data frames are kept, by sequence number"
    );
    let read: Vec<Vec<u8>> = batch
        .iter()
        .map(|&f| a.sender().frame_bytes(f).to_vec())
        .collect();
    assert_eq!(read, out(&mut a2, t(0)));
    // A retransmission is the same frame, handed out again.
    assert_eq!(a.sender().kept_frame(2), Some(read[2].as_slice()));
    // Acknowledged frames are gone; the acknowledgement itself is a scratch frame.
    let delivered = feed(&mut b, t(10), read);
    assert_eq!(delivered.len(), 4, "the four frames, in order");
    b.flush_ack();
    let ack = b.poll_transmit_kept(t(10));
    assert_eq!(ack, Some(TxFrame::Scratch));
    let ack = b.sender().frame_bytes(TxFrame::Scratch).to_vec();
    assert_eq!(header(&ack).kind, FrameKind::Ack);
    feed(&mut a, t(20), vec![ack]);
    assert_eq!(a.sender().kept_frame(0), None);
    assert_eq!(a.sender().kept_frame(3), None);
    // Mode none keeps nothing: every frame is a scratch frame.
    let (mut n, _) = pair(&config(Mode::None, 8));
    n.send(t(0), b"x").unwrap();
    assert_eq!(n.poll_transmit_kept(t(0)), Some(TxFrame::Scratch));
    assert_eq!(data_of(n.sender().frame_bytes(TxFrame::Scratch)), b"x");
}

#[test]
fn frames_carry_the_template_sequence_numbers_and_checksums() {
    let (mut a, _) = pair(&config(Mode::Host, 8));
    a.send(t(0), b"hello").unwrap();
    a.send(t(0), &[9; 3000]).unwrap();
    let f = out(&mut a, t(0));
    assert_eq!(f.len(), 4, "one frame, then three fragments");
    for (i, frame) in f.iter().enumerate() {
        let h = header(frame);
        assert_eq!(h.kind, FrameKind::Data);
        assert_eq!(h.seq, i as u32);
        assert!(h.flags.contains(Flags::CHECKSUM));
        assert_eq!((h.src_dpid, h.dst_dpid, h.job_id), (0, 1, 7));
        assert_eq!((h.ack, h.credits), (0, 8));
        assert!(frame.len() <= 1472);
    }
    assert_eq!(data_of(&f[0]), b"hello");
    // Mode none without checksums leaves the checksum out.
    let (mut a, _) = pair(&Config {
        checksum: false,
        ..config(Mode::None, 8)
    });
    a.send(t(0), b"x").unwrap();
    let f = out(&mut a, t(0));
    assert!(!header(&f[0]).flags.contains(Flags::CHECKSUM));
}

#[test]
fn delayed_ack_fires_at_its_deadline() {
    let (mut a, mut b) = pair(&config(Mode::Host, 64));
    a.send(t(0), b"one").unwrap();
    let f = out(&mut a, t(0));
    assert_eq!(feed(&mut b, t(10), f).len(), 1);
    assert!(out(&mut b, t(10)).is_empty(), "no ack before the timer");
    assert_eq!(b.poll_timeout(), Some(t(210)));
    b.handle_timeout(t(209));
    assert!(out(&mut b, t(209)).is_empty());
    b.handle_timeout(t(210));
    let acks = out(&mut b, t(210));
    assert_eq!(acks.len(), 1);
    let h = header(&acks[0]);
    assert_eq!((h.kind, h.ack, h.credits), (FrameKind::Ack, 1, 63));
    assert_eq!(b.poll_timeout(), None);
    let c = b.counters();
    assert_eq!(
        (c.acks_explicit, c.acks_delayed, c.acks_piggybacked),
        (1, 1, 0)
    );
    // The ack frees the sender's retransmission buffer and stops its timer.
    assert!(a.poll_timeout().is_some());
    feed(&mut a, t(220), acks);
    assert!(a.is_idle());
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(a.sender().srtt(), Some(Duration::from_micros(220)));
}

#[test]
fn half_window_ack_goes_at_once() {
    let (mut a, mut b) = pair(&config(Mode::Host, 8));
    for i in 0..4u8 {
        a.send(t(0), &[i]).unwrap();
    }
    let f = out(&mut a, t(0));
    assert_eq!(f.len(), 4);
    let mut f = f.into_iter();
    feed(&mut b, t(5), f.by_ref().take(3).collect());
    assert!(out(&mut b, t(5)).is_empty(), "three of eight: wait");
    feed(&mut b, t(6), f.collect());
    let acks = out(&mut b, t(6));
    assert_eq!(acks.len(), 1);
    assert_eq!(header(&acks[0]).ack, 4);
    assert_eq!(b.counters().acks_half_window, 1);
    assert_eq!(b.poll_timeout(), None, "the ack timer is cancelled");
}

#[test]
fn piggybacked_ack_suppresses_the_explicit_one() {
    let (mut a, mut b) = pair(&config(Mode::Host, 64));
    a.send(t(0), b"ping").unwrap();
    feed(&mut b, t(10), out(&mut a, t(0)));
    b.handle_release(t(10), 1);
    b.send(t(50), b"pong").unwrap();
    let f = out(&mut b, t(50));
    assert_eq!(f.len(), 1, "the data frame only, no separate ack");
    let h = header(&f[0]);
    assert_eq!((h.kind, h.ack, h.credits), (FrameKind::Data, 1, 64));
    // The delayed-ack deadline (210 us) is gone; only B's retransmission timer is left.
    assert_eq!(
        b.poll_timeout(),
        Some(t(50) + Config::default().rto_initial)
    );
    b.handle_timeout(t(210));
    assert!(out(&mut b, t(210)).is_empty());
    let c = b.counters();
    assert_eq!((c.acks_piggybacked, c.acks_explicit), (1, 0));
    // A learns from the piggybacked ack.
    feed(&mut a, t(60), f);
    assert!(a.is_idle());
}

#[test]
fn retransmission_timer_backs_off_then_gives_up() {
    let cfg = Config {
        rto_initial: Duration::from_millis(1),
        rto_min: Duration::from_millis(1),
        rto_max: Duration::from_millis(8),
        max_timeouts: 5,
        ..config(Mode::Host, 8)
    };
    let (mut a, _) = pair(&cfg);
    a.send(t(0), b"lost forever").unwrap();
    let first = out(&mut a, t(0));
    let mut deadline = t(1000);
    for (i, rto_ms) in [2u64, 4, 8, 8, 8].into_iter().enumerate() {
        assert_eq!(a.poll_timeout(), Some(deadline), "timeout {i}");
        a.handle_timeout(deadline);
        let again = out(&mut a, deadline);
        assert_eq!(again, first, "the same bytes go again");
        assert_eq!(a.sender().rto(), Duration::from_millis(rto_ms));
        deadline += Duration::from_millis(rto_ms);
    }
    a.handle_timeout(deadline);
    assert!(out(&mut a, deadline).is_empty());
    assert_eq!(
        events(&mut a),
        vec![Event::Error(ChannelError::Unreachable { timeouts: 6 })]
    );
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(a.send(deadline, b"more"), Err(SendError::Failed));
    let c = a.counters();
    assert_eq!((c.retransmissions, c.timeouts), (5, 6));
}

#[test]
fn backed_off_timeout_stays_until_a_clean_sample() {
    // Karn: frames acknowledged after a timeout were resent, so they give no round-trip
    // sample, and the backed-off timeout stays; going back to the old, shorter one would
    // resend the rest of the window again while a slow link drains its queue.
    let cfg = Config {
        rto_initial: Duration::from_millis(1),
        rto_min: Duration::from_micros(100),
        ..config(Mode::Host, 2)
    };
    let (mut a, mut b) = pair(&cfg);
    a.send(t(0), b"one").unwrap();
    a.send(t(0), b"two").unwrap();
    assert_eq!(out(&mut a, t(0)).len(), 2);
    a.handle_timeout(t(1000));
    let resent = out(&mut a, t(1000));
    assert_eq!(resent.len(), 2);
    assert_eq!(a.sender().rto(), Duration::from_millis(2));
    // Only the first frame gets through; B acknowledges it at once (W = 2).
    feed(&mut b, t(1500), resent[..1].to_vec());
    b.handle_release(t(1500), 1);
    feed(&mut a, t(1600), out(&mut b, t(1500)));
    assert_eq!(a.sender().srtt(), None, "a resent frame gives no sample");
    assert_eq!(
        a.sender().rto(),
        Duration::from_millis(2),
        "the backoff stays"
    );
    assert_eq!(a.poll_timeout(), Some(t(1600) + Duration::from_millis(2)));
    // The second frame arrives too; then a frame sent once gives a sample, which sets
    // the timeout anew.
    feed(&mut b, t(1700), resent[1..].to_vec());
    b.handle_release(t(1700), 1);
    feed(&mut a, t(1800), out(&mut b, t(1700)));
    a.send(t(2000), b"three").unwrap();
    feed(&mut b, t(2050), out(&mut a, t(2000)));
    b.handle_release(t(2050), 1);
    feed(&mut a, t(2100), out(&mut b, t(2050)));
    assert_eq!(a.sender().srtt(), Some(Duration::from_micros(100)));
    assert_eq!(a.sender().rto(), Duration::from_micros(300));
}

#[test]
fn round_trip_samples_set_the_timeout() {
    let cfg = Config {
        rto_min: Duration::from_micros(100),
        ..config(Mode::Host, 2)
    };
    let (mut a, mut b) = pair(&cfg);
    a.send(t(0), b"x").unwrap();
    feed(&mut b, t(50), out(&mut a, t(0)));
    b.handle_release(t(50), 1);
    // W = 2: half-window is one frame, so B acks at once.
    let ack = out(&mut b, t(50));
    assert_eq!(ack.len(), 1);
    feed(&mut a, t(100), ack);
    assert_eq!(a.sender().srtt(), Some(Duration::from_micros(100)));
    // rto = srtt + 4 * rttvar = 100 + 4 * 50 us.
    assert_eq!(a.sender().rto(), Duration::from_micros(300));
}

#[test]
fn closed_window_queues_and_credits_reopen_it() {
    let (mut a, mut b) = pair(&config(Mode::None, 4));
    let status: Vec<_> = (0..10u8).map(|i| a.send(t(0), &[i]).unwrap()).collect();
    assert_eq!(&status[..4], &[SendStatus::Ready; 4]);
    assert_eq!(&status[4..], &[SendStatus::Blocked; 6]);
    assert_eq!(a.counters().credit_stalls, 6);
    let f = out(&mut a, t(0));
    assert_eq!(f.len(), 4);
    assert!(a.is_blocked());
    assert_eq!(feed(&mut b, t(1), f).len(), 4);
    // Nothing released: no credit to return.
    assert!(out(&mut b, t(1)).is_empty());
    b.handle_release(t(2), 1);
    assert!(out(&mut b, t(2)).is_empty(), "one of W/2 = 2");
    b.handle_release(t(3), 1);
    let ack = out(&mut b, t(3));
    assert_eq!(ack.len(), 1);
    let h = header(&ack[0]);
    assert_eq!((h.kind, h.ack, h.credits), (FrameKind::Ack, 4, 2));
    feed(&mut a, t(4), ack);
    let f = out(&mut a, t(4));
    assert_eq!(f.len(), 2, "two credits, two frames");
    assert!(a.is_blocked());
    // Everything arrives in the end, in order, nothing dropped.
    b.handle_release(t(5), 2);
    let mut got: Vec<Vec<u8>> = feed(&mut b, t(5), f).iter().map(|f| data_of(f)).collect();
    for _ in 0..2 {
        b.handle_release(t(5), 1);
    }
    got.extend(exchange(&mut a, &mut b, t(6)));
    assert_eq!(got, (4..10u8).map(|i| vec![i]).collect::<Vec<_>>());
    assert!(!a.is_blocked());
    assert!(events(&mut b).is_empty());
}

#[test]
fn zero_window_probe_recovers_a_lost_credit_update() {
    let (mut a, mut b) = pair(&config(Mode::Host, 2));
    for i in 0..3u8 {
        a.send(t(0), &[i]).unwrap();
    }
    let f = out(&mut a, t(0));
    assert_eq!(f.len(), 2);
    feed(&mut b, t(1), f);
    // B acks both frames (half-window = 1) with no credit left, as the app holds them.
    let acks = out(&mut b, t(1));
    assert!(!acks.is_empty());
    feed(&mut a, t(2), acks);
    assert!(a.is_blocked());
    assert_eq!(a.sender().in_flight(), 0);
    // The release's credit update is lost on the way.
    b.handle_release(t(3), 2);
    assert_eq!(out(&mut b, t(3)).len(), 1);
    // The sender probes after the probe interval and gets the credits in reply.
    let probe_at = a.poll_timeout().unwrap();
    assert_eq!(probe_at, t(2) + Config::default().probe_interval);
    a.handle_timeout(probe_at);
    let probe = out(&mut a, probe_at);
    assert_eq!(probe.len(), 1);
    let h = header(&probe[0]);
    assert_eq!((h.kind, h.seq), (FrameKind::Heartbeat, 2));
    feed(&mut b, probe_at, probe);
    let reply = out(&mut b, probe_at);
    assert_eq!(header(&reply[0]).kind, FrameKind::Ack);
    feed(&mut a, probe_at, reply);
    let f = out(&mut a, probe_at);
    assert_eq!(f.len(), 1);
    assert_eq!(data_of(&f[0]), [2]);
    assert_eq!(a.counters().probes, 1);
}

#[test]
fn none_mode_reports_a_gap() {
    let (mut a, mut b) = pair(&config(Mode::None, 8));
    for i in 0..3u8 {
        a.send(t(0), &[i]).unwrap();
    }
    let mut f = out(&mut a, t(0));
    f.remove(1);
    let got = feed(&mut b, t(1), f);
    assert_eq!(got.len(), 2, "what arrived is delivered");
    assert_eq!(
        events(&mut b),
        vec![Event::Error(ChannelError::Lost { first: 1, count: 1 })]
    );
    assert_eq!(b.counters().lost, 1);
}

#[test]
fn none_mode_detects_a_lost_tail_with_its_probe() {
    let cfg = config(Mode::None, 8);
    let (mut a, mut b) = pair(&cfg);
    a.send(t(0), b"first").unwrap();
    a.send(t(0), b"last").unwrap();
    let f = out(&mut a, t(0));
    feed(&mut b, t(10), f[..1].to_vec());
    b.handle_release(t(10), 1);
    assert!(events(&mut b).is_empty());
    let probe_at = a.poll_timeout().unwrap();
    assert_eq!(probe_at, t(0) + cfg.probe_interval);
    a.handle_timeout(probe_at);
    let probe = out(&mut a, probe_at);
    assert_eq!(header(&probe[0]).kind, FrameKind::Heartbeat);
    feed(&mut b, probe_at + Duration::from_micros(10), probe);
    assert_eq!(
        events(&mut b),
        vec![Event::Error(ChannelError::Lost { first: 1, count: 1 })]
    );
    // The reply settles the sender: nothing more to probe.
    let reply = out(&mut b, probe_at);
    feed(&mut a, probe_at + Duration::from_micros(20), reply);
    assert!(a.is_idle());
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn none_mode_reports_corruption() {
    let (mut a, mut b) = pair(&config(Mode::None, 8));
    a.send(t(0), b"payload").unwrap();
    let mut f = out(&mut a, t(0));
    let last = f[0].len() - 1;
    f[0][last] ^= 0x20;
    assert!(feed(&mut b, t(1), f).is_empty());
    assert_eq!(events(&mut b), vec![Event::Error(ChannelError::Corrupt)]);
    assert_eq!(b.counters().checksum_failures, 1);
}

#[test]
fn host_mode_repairs_corruption_and_requires_checksums() {
    let (mut a, mut b) = pair(&config(Mode::Host, 8));
    a.send(t(0), b"payload").unwrap();
    let good = out(&mut a, t(0));
    let mut bad = good.clone();
    bad[0][36] ^= 1;
    assert!(feed(&mut b, t(1), bad).is_empty());
    // A frame without the CHECKSUM flag is not trusted either.
    let mut bare = good.clone();
    {
        let mut v = FrameView::new_checked(&mut bare[0][..]).unwrap();
        v.set_flags(Flags::FIRST | Flags::LAST);
        v.set_checksum(0);
    }
    assert!(feed(&mut b, t(1), bare).is_empty());
    assert!(events(&mut b).is_empty(), "repaired, not reported");
    assert_eq!(b.counters().checksum_failures, 2);
    let at = a.poll_timeout().unwrap();
    a.handle_timeout(at);
    let again = out(&mut a, at);
    let got = feed(&mut b, at, again);
    assert_eq!(got.len(), 1);
    assert_eq!(data_of(&got[0]), b"payload");
}

#[test]
fn duplicates_are_dropped_and_acknowledged_again() {
    let (mut a, mut b) = pair(&config(Mode::Host, 8));
    a.send(t(0), b"x").unwrap();
    let f = out(&mut a, t(0));
    assert_eq!(feed(&mut b, t(1), f.clone()).len(), 1);
    let _ = out(&mut b, t(1));
    b.handle_timeout(t(201));
    assert_eq!(out(&mut b, t(201)).len(), 1, "delayed ack");
    assert!(feed(&mut b, t(300), f).is_empty());
    assert_eq!(b.counters().duplicates, 1);
    // The sender resent it because it waits for an acknowledgement: one goes at once.
    assert_eq!(out(&mut b, t(300)).len(), 1, "acknowledged again at once");
}

#[test]
fn go_back_n_drops_out_of_order_and_resends_everything() {
    let (mut a, mut b) = pair(&config(Mode::Host, 8));
    for i in 0..4u8 {
        a.send(t(0), &[i]).unwrap();
    }
    let f = out(&mut a, t(0));
    assert!(feed(&mut b, t(1), f[1..].to_vec()).is_empty());
    assert_eq!(b.counters().out_of_order, 3);
    let acks = out(&mut b, t(1));
    assert_eq!(acks.len(), 1, "one immediate ack for the gap");
    let h = header(&acks[0]);
    assert_eq!((h.kind, h.ack, h.seq), (FrameKind::Ack, 0, 0b111));
    // Past the guard (no round-trip sample yet: rto_min / 2), A goes back.
    feed(&mut a, t(300), acks);
    let again = out(&mut a, t(300));
    assert_eq!(again.len(), 4);
    assert_eq!(a.counters().fast_retransmits, 1);
    let got = feed(&mut b, t(301), again);
    let got: Vec<_> = got.iter().map(|f| data_of(f)).collect();
    assert_eq!(got, (0..4u8).map(|i| vec![i]).collect::<Vec<_>>());
}

/// Two ends of a channel of whole frames (the frames as `Vec`s), and some frames.
type PairAndFrames = (Duplex<Vec<u8>>, Duplex<Vec<u8>>, Vec<Vec<u8>>);

/// Selective repeat, W = 8: A has sent five one-byte messages (0 to 4) at t(0); their
/// frames, for the test to deliver or lose.
fn selective_pair_with_five_sent() -> PairAndFrames {
    let cfg = Config {
        recovery: Recovery::Selective,
        ..config(Mode::Host, 8)
    };
    let (mut a, b) = pair(&cfg);
    for i in 0..5u8 {
        a.send(t(0), &[i]).unwrap();
    }
    let f = out(&mut a, t(0));
    (a, b, f)
}

#[test]
fn selective_repeat_keeps_out_of_order_and_resends_holes() {
    let (mut a, mut b, f) = selective_pair_with_five_sent();
    // Frames 0 and 2 are lost.
    assert!(feed(&mut b, t(1), vec![f[1].clone(), f[3].clone(), f[4].clone()]).is_empty());
    let acks = out(&mut b, t(1));
    assert_eq!(acks.len(), 1);
    assert_eq!(header(&acks[0]).seq, 0b1101, "frames 1, 3 and 4 are kept");
    feed(&mut a, t(300), acks);
    let again = out(&mut a, t(300));
    let seqs: Vec<_> = again.iter().map(|f| header(f).seq).collect();
    assert_eq!(seqs, vec![0, 2], "only the holes");
    let got = feed(&mut b, t(301), again);
    let got: Vec<_> = got.iter().map(|f| data_of(f)).collect();
    assert_eq!(got, (0..5u8).map(|i| vec![i]).collect::<Vec<_>>());
}

/// A burst longer than one block of the bitmap (a segmentation-offload run lost whole):
/// the receiver reports the block of the first frame it holds after the hole, and the
/// sender resends the whole hole at the first acknowledgement, with no timeout.
#[test]
fn a_hole_longer_than_a_bitmap_block_is_reported_and_resent_at_once() {
    let cfg = Config {
        recovery: Recovery::Selective,
        ..config(Mode::Host, 128)
    };
    let (mut a, mut b) = pair(&cfg);
    for i in 0..60u8 {
        a.send(t(0), &[i]).unwrap();
    }
    let f = out(&mut a, t(0));
    assert_eq!(f.len(), 60);
    // Frames 0 to 43 are lost; 44 to 59 arrive (44 is frame ack + 1 + 43: block 1).
    assert!(feed(&mut b, t(1), f[44..].to_vec()).is_empty());
    let acks = out(&mut b, t(1));
    let h = header(acks.last().unwrap());
    assert_eq!(
        (h.kind, h.ack, h.flags.sack_block()),
        (FrameKind::Ack, 0, 1)
    );
    assert_eq!(
        h.seq,
        0xffff << 11,
        "frames 44 to 59 are bits 11 to 26 of block 1"
    );
    feed(&mut a, t(2), acks);
    let again = out(&mut a, t(2));
    let seqs: Vec<_> = again.iter().map(|f| header(f).seq).collect();
    assert_eq!(
        seqs,
        (0..44).collect::<Vec<u32>>(),
        "the whole hole, nothing else"
    );
    assert_eq!(
        (a.counters().fast_retransmits, a.counters().timeouts),
        (1, 0)
    );
    let got = feed(&mut b, t(3), again);
    let got: Vec<_> = got.iter().map(|f| data_of(f)).collect();
    assert_eq!(got, (0..60u8).map(|i| vec![i]).collect::<Vec<_>>());
}

/// `kept_mut` reaches every buffer the receiver keeps, out of order or waiting for
/// delivery, and a buffer moved through it is the one delivered (a packet ring's frame
/// copied out before the ring comes round to it).
#[test]
fn kept_buffers_can_be_moved_before_delivery() {
    let (_a, mut b, f) = selective_pair_with_five_sent();
    // Frames 0 and 2 are lost: 1, 3 and 4 are kept out of order.
    for i in [1, 3, 4] {
        b.handle_datagram(t(1), f[i].clone());
    }
    let mut moved = Vec::new();
    for buf in b.kept_mut() {
        *buf = buf.clone();
        moved.push(buf.as_ptr() as usize);
    }
    assert_eq!(moved.len(), 3);
    // Frame 0 arrives: 0 and 1 wait for delivery, 3 and 4 stay out of order.
    b.handle_datagram(t(2), f[0].clone());
    assert_eq!(b.kept_mut().count(), 4);
    b.handle_datagram(t(3), f[2].clone());
    let got: Vec<_> = std::iter::from_fn(|| b.poll_deliver()).collect();
    assert_eq!(
        got.iter().map(|g| data_of(g)).collect::<Vec<_>>(),
        (0..5u8).map(|i| vec![i]).collect::<Vec<_>>()
    );
    let delivered: Vec<_> = [1, 3, 4]
        .iter()
        .map(|&i| got[i].as_ptr() as usize)
        .collect();
    assert_eq!(delivered, moved);
    assert_eq!(b.kept_mut().count(), 0);
}

/// Selective repeat, W = 8, a 1 ms first timeout: the setting of the timeout tests below.
fn frto_config() -> Config {
    Config {
        recovery: Recovery::Selective,
        rto_initial: Duration::from_millis(1),
        rto_min: Duration::from_micros(100),
        ..config(Mode::Host, 8)
    }
}

/// What B sends at `now`, its delayed acknowledgement fired if nothing else goes out.
fn ack_from(b: &mut Duplex<Vec<u8>>, now: Time) -> Vec<Vec<u8>> {
    let f = out(b, now);
    if !f.is_empty() {
        return f;
    }
    let later = now + Duration::from_millis(1);
    b.handle_timeout(later);
    out(b, later)
}

/// B takes `frames` at `at` µs (asserting it delivers `delivered` of them) and releases
/// them; A takes B's acknowledgement 100 µs later. Returns what A sends then.
fn deliver_and_acknowledge(
    a: &mut Duplex<Vec<u8>>,
    b: &mut Duplex<Vec<u8>>,
    frames: Vec<Vec<u8>>,
    delivered: usize,
    at: u64,
) -> Vec<Vec<u8>> {
    assert_eq!(feed(b, t(at), frames).len(), delivered);
    b.handle_release(t(at), delivered as u32);
    feed(a, t(at + 100), ack_from(b, t(at)));
    out(a, t(at + 100))
}

fn seqs(frames: &[Vec<u8>]) -> Vec<u32> {
    frames.iter().map(|f| header(f).seq).collect()
}

/// A pair of [`frto_config`] after A sent `messages` one-byte messages at 0 and its timer
/// fired at 1 ms: A, B, the frames first sent, and what the timeout sent.
type AfterTimeout = (Duplex<Vec<u8>>, Duplex<Vec<u8>>, Vec<Vec<u8>>, Vec<Vec<u8>>);
fn after_timeout(messages: u8) -> AfterTimeout {
    let (mut a, b) = pair(&frto_config());
    for i in 0..messages {
        a.send(t(0), &[i]).unwrap();
    }
    let first = out(&mut a, t(0));
    a.handle_timeout(t(1000));
    let resent = out(&mut a, t(1000));
    (a, b, first, resent)
}

#[test]
fn a_timeout_whose_acknowledgement_was_late_resends_one_frame() {
    let (mut a, mut b, first, resent) = after_timeout(12);
    assert_eq!(first.len(), 8);
    assert_eq!(seqs(&resent), vec![0], "only the oldest frame");
    // The window arrives after all, and its acknowledgement reaches past the resent frame.
    let next = deliver_and_acknowledge(&mut a, &mut b, first, 8, 1100);
    assert_eq!(
        seqs(&next),
        vec![8, 9, 10, 11],
        "new frames, nothing resent"
    );
    // The new frames' acknowledgement confirms it: nothing is resent later either.
    assert!(feed(&mut b, t(1300), resent).is_empty());
    assert!(deliver_and_acknowledge(&mut a, &mut b, next, 4, 1300).is_empty());
    assert!(a.is_idle());
    assert_eq!(
        (a.counters().timeouts, a.counters().retransmissions),
        (1, 1)
    );
    assert_eq!(b.counters().duplicates, 1);
}

#[test]
fn a_timeout_whose_resend_alone_is_acknowledged_resends_the_rest() {
    let (mut a, mut b, first, resent) = after_timeout(12);
    assert_eq!(first.len(), 8, "all lost");
    assert_eq!(seqs(&resent), vec![0]);
    let again = deliver_and_acknowledge(&mut a, &mut b, resent, 1, 1100);
    assert_eq!(
        seqs(&again),
        (1..=8).collect::<Vec<_>>(),
        "the rest, then a new frame"
    );
    let got = feed(&mut b, t(1300), again);
    assert_eq!(
        got.iter().map(|f| data_of(f)).collect::<Vec<_>>(),
        (1..=8u8).map(|i| vec![i]).collect::<Vec<_>>()
    );
    assert_eq!(a.counters().retransmissions, 8);
}

#[test]
fn a_timeout_at_the_end_of_a_transfer_resends_the_rest_on_the_next_acknowledgement() {
    // Nothing new follows whose acknowledgement could tell late from lost.
    let (mut a, mut b, first, resent) = after_timeout(4);
    assert_eq!(seqs(&resent), vec![0]);
    // Frames 0 and 1 arrive; 2 and 3 are lost.
    let again = deliver_and_acknowledge(&mut a, &mut b, first[..2].to_vec(), 2, 1100);
    assert_eq!(seqs(&again), vec![2, 3]);
    assert_eq!(feed(&mut b, t(1300), again).len(), 2);
}

#[test]
fn a_timeout_with_holes_reported_resends_every_frame_not_reported() {
    // Frames were lost for sure: waiting a round trip to find out would only leave the
    // holes beyond the report's reach to later timeouts.
    let (mut a, mut b) = pair(&frto_config());
    for i in 0..8u8 {
        a.send(t(0), &[i]).unwrap();
    }
    let first = out(&mut a, t(0));
    // Only frame 1 arrives; its report makes A resend frame 0, which is lost again.
    assert!(feed(&mut b, t(10), vec![first[1].clone()]).is_empty());
    feed(&mut a, t(20), out(&mut b, t(10)));
    assert_eq!(seqs(&out(&mut a, t(20))), vec![0]);
    a.handle_timeout(t(1000));
    assert_eq!(seqs(&out(&mut a, t(1000))), vec![0, 2, 3, 4, 5, 6, 7]);
}

/// A pair of `cfg` whose A has exchanged one message with B (sent at 0, delivered at
/// 10 µs, acknowledged at 20 µs): a round-trip sample of 20 µs, nothing in flight.
fn pair_after_a_round_trip(cfg: &Config) -> (Duplex<Vec<u8>>, Duplex<Vec<u8>>) {
    let (mut a, mut b) = pair(cfg);
    a.send(t(0), &[0]).unwrap();
    assert_eq!(feed(&mut b, t(10), out(&mut a, t(0))).len(), 1);
    b.handle_release(t(10), 1);
    b.flush_ack();
    feed(&mut a, t(20), out(&mut b, t(10)));
    assert!(a.is_idle());
    (a, b)
}

/// A lost tail has no later frame to reveal it: two round trips after the last frame
/// (half a window: the receiver acknowledges those without delay) the newest is sent
/// again, the receiver answers it at once, and the frames its
/// report shows missing are resent, all before the retransmission timeout.
#[test]
fn a_lost_tail_is_probed_and_repaired_before_the_timeout() {
    // The timeout is its minimum, 100 µs.
    let (mut a, mut b) = pair_after_a_round_trip(&frto_config());
    for i in 1..=4u8 {
        a.send(t(100), &[i]).unwrap();
    }
    let first = out(&mut a, t(100));
    assert_eq!(seqs(&first), vec![1, 2, 3, 4]);
    // Frames 1 and 2 arrive (acknowledged later, delayed); 3 and 4 are lost.
    assert_eq!(feed(&mut b, t(110), first[..2].to_vec()).len(), 2);
    b.handle_release(t(110), 2);
    assert!(
        out(&mut b, t(110)).is_empty(),
        "the acknowledgement is delayed"
    );
    let probe_at = a.poll_timeout().expect("a timer is armed");
    assert_eq!(
        probe_at,
        t(150),
        "the probe: two round trips, at least 50 µs"
    );
    a.handle_timeout(probe_at);
    let probe = out(&mut a, probe_at);
    assert_eq!(seqs(&probe), vec![4], "the newest frame again");
    assert_eq!(a.counters().tail_probes, 1);
    assert_eq!(a.counters().timeouts, 0);
    // It arrives out of order: the receiver reports the hole at once.
    assert!(feed(&mut b, t(160), probe).is_empty());
    let report = out(&mut b, t(160));
    assert_eq!(report.len(), 1);
    feed(&mut a, t(170), report);
    let repair = out(&mut a, t(170));
    assert_eq!(
        seqs(&repair),
        vec![3],
        "the lost frame, before the timeout at 200 µs"
    );
    let got = feed(&mut b, t(180), repair);
    assert_eq!(
        got.iter().map(|f| data_of(f)).collect::<Vec<_>>(),
        vec![vec![3], vec![4]]
    );
    assert_eq!(a.counters().timeouts, 0);
}

/// A tail probe whose frame had arrived is a duplicate: acknowledged at once, and the
/// report shows the holes before it.
#[test]
fn a_tail_probe_that_arrived_before_is_acknowledged_at_once() {
    let (mut a, mut b) = pair_after_a_round_trip(&frto_config());
    for i in 1..=4u8 {
        a.send(t(100), &[i]).unwrap();
    }
    let first = out(&mut a, t(100));
    // Frame 1 is lost; 2 to 4 arrive, and the receiver's report of the hole is lost.
    assert!(feed(&mut b, t(110), first[1..].to_vec()).is_empty());
    assert_eq!(out(&mut b, t(110)).len(), 1, "the report, lost");
    // Half a window unacknowledged: the receiver would not delay its acknowledgement.
    assert_eq!(a.poll_timeout(), Some(t(150)));
    a.handle_timeout(t(150));
    let probe = out(&mut a, t(150));
    assert_eq!(seqs(&probe), vec![4]);
    assert!(feed(&mut b, t(160), probe).is_empty());
    assert_eq!(b.counters().duplicates, 1);
    let report = out(&mut b, t(160));
    assert_eq!(report.len(), 1, "a duplicate is acknowledged at once");
    feed(&mut a, t(170), report);
    assert_eq!(seqs(&out(&mut a, t(170))), vec![1]);
}

/// A tail shorter than half a window is acknowledged only after the receiver's delay:
/// the probe waits for that too, and a clean exchange sends no probe at all.
#[test]
fn a_short_tail_waits_for_the_delayed_acknowledgement_before_probing() {
    let (mut a, mut b) = pair_after_a_round_trip(&Config {
        rto_min: Duration::from_millis(1),
        ..frto_config()
    });
    a.send(t(100), &[1]).unwrap();
    let f = out(&mut a, t(100));
    assert_eq!(
        a.poll_timeout(),
        Some(t(100 + 50 + 200)),
        "two round trips (at least 50 µs) and the delay"
    );
    assert_eq!(feed(&mut b, t(110), f).len(), 1);
    b.handle_release(t(110), 1);
    b.handle_timeout(t(310));
    feed(&mut a, t(320), out(&mut b, t(310)));
    assert!(a.is_idle());
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(a.counters().tail_probes, 0);
}

/// A resend lost again is resent as soon as a report shows a frame sent after it,
/// without waiting a round trip (nor the timeout): quiver's links keep order.
#[test]
fn a_resend_lost_again_is_resent_when_a_later_frame_is_reported() {
    let (mut a, mut b) = pair(&Config {
        recovery: Recovery::Selective,
        rto_initial: Duration::from_millis(5),
        rto_min: Duration::from_millis(1),
        ..config(Mode::Host, 16)
    });
    for i in 0..8u8 {
        a.send(t(0), &[i]).unwrap();
    }
    let first = out(&mut a, t(0));
    // Frame 0 is lost; the report of 1..7 makes A resend it, and the resend is lost.
    assert!(feed(&mut b, t(10), first[1..].to_vec()).is_empty());
    feed(&mut a, t(20), out(&mut b, t(10)));
    assert_eq!(seqs(&out(&mut a, t(20))), vec![0]);
    // A new frame leaves after the resend and arrives; its report (delayed) shows it.
    a.send(t(30), &[8]).unwrap();
    assert!(feed(&mut b, t(40), out(&mut a, t(30))).is_empty());
    feed(&mut a, t(250), ack_from(&mut b, t(240)));
    assert_eq!(
        seqs(&out(&mut a, t(250))),
        vec![0],
        "resent 230 µs after the first resend, though the guard is 500 µs"
    );
    assert_eq!(a.counters().timeouts, 0);
}

#[test]
fn go_back_n_resends_the_window_at_a_timeout() {
    let (mut a, _b) = pair(&Config {
        recovery: Recovery::GoBackN,
        ..frto_config()
    });
    for i in 0..4u8 {
        a.send(t(0), &[i]).unwrap();
    }
    assert_eq!(out(&mut a, t(0)).len(), 4);
    a.handle_timeout(t(1000));
    assert_eq!(seqs(&out(&mut a, t(1000))), vec![0, 1, 2, 3]);
}

#[test]
fn sequence_numbers_wrap() {
    for mode in [Mode::None, Mode::Host] {
        let (mut a, mut b) = pair(&config(mode, 4));
        a.start_at(u32::MAX - 5);
        b.start_at(u32::MAX - 5);
        for i in 0..20u8 {
            a.send(t(0), &[i]).unwrap();
        }
        let got = exchange(&mut a, &mut b, t(1));
        assert_eq!(
            got,
            (0..20u8).map(|i| vec![i]).collect::<Vec<_>>(),
            "{mode}"
        );
        assert!(events(&mut b).is_empty());
        assert!(a.is_idle());
    }
}

/// Selective repeat with a window that does not divide 2^32 (100 frames), frames held
/// out of order across the wrap of the sequence numbers: each keeps its own place (with
/// `seq % window`, frames 96 apart across the wrap shared one, the later taken for a
/// duplicate and reported received).
#[test]
fn out_of_order_frames_across_the_wrap_keep_their_places() {
    let cfg = Config {
        recovery: Recovery::Selective,
        ..config(Mode::Host, 100)
    };
    let (mut a, mut b) = pair(&cfg);
    a.start_at(u32::MAX - 3);
    b.start_at(u32::MAX - 3);
    for i in 0..99u8 {
        a.send(t(0), &[i]).unwrap();
    }
    let f = out(&mut a, t(0));
    assert_eq!(f.len(), 99);
    // The first frame is lost; frames 1 and 97 (96 apart, across the wrap) arrive.
    assert!(feed(&mut b, t(1), f[1..].to_vec()).is_empty());
    assert_eq!(b.counters().duplicates, 0);
    let got = feed(&mut b, t(2), vec![f[0].clone()]);
    let got: Vec<_> = got.iter().map(|f| data_of(f)).collect();
    assert_eq!(got, (0..99u8).map(|i| vec![i]).collect::<Vec<_>>());
}

#[test]
fn frames_beyond_the_window_are_overruns() {
    for mode in [Mode::None, Mode::Host] {
        let (mut a, mut b) = pair(&config(mode, 4));
        for i in 0..6u8 {
            a.send(t(0), &[i]).unwrap();
        }
        let mut f = out(&mut a, t(0));
        assert_eq!(f.len(), 4);
        // Forge frame 5 as if the sender ignored its credits.
        let mut forged = f[3].clone();
        {
            let mut v = FrameView::new_checked(&mut forged[..]).unwrap();
            v.set_seq(5);
            v.fill_checksum();
        }
        f.push(forged);
        feed(&mut b, t(1), f);
        assert_eq!(b.counters().overruns, 1);
        let errs = events(&mut b);
        if mode == Mode::None {
            assert_eq!(errs, vec![Event::Error(ChannelError::Overrun { seq: 5 })]);
        } else {
            assert!(errs.is_empty());
        }
    }
}

#[test]
fn bogus_acks_and_releases_are_harmless() {
    let (mut a, mut b) = pair(&config(Mode::Host, 4));
    a.send(t(0), b"x").unwrap();
    let _ = out(&mut a, t(0));
    // An ack for frames never sent.
    let mut h = [0u8; crate::wire::HEADER_LEN];
    Header {
        kind: FrameKind::Ack,
        ack: 1000,
        credits: 60_000,
        ..template(1, 0)
    }
    .emit_sealed(&mut h, &[]);
    feed(&mut a, t(1), vec![h.to_vec()]);
    assert_eq!(a.counters().bad_acks, 1);
    assert_eq!(a.sender().in_flight(), 1);
    assert_eq!(b.handle_release(t(1), 50), 0, "nothing held: clamped");
    // Garbage is a checksum failure, not a panic.
    feed(&mut b, t(1), vec![vec![], vec![0xff; 7], vec![0x12; 64]]);
    assert_eq!(b.counters().checksum_failures, 3);
}

#[test]
fn goodbye_is_reported() {
    let (_, mut b) = pair(&config(Mode::Host, 4));
    let mut h = [0u8; crate::wire::HEADER_LEN];
    Header {
        kind: FrameKind::Goodbye,
        ..template(0, 1)
    }
    .emit_sealed(&mut h, &[]);
    feed(&mut b, t(0), vec![h.to_vec()]);
    assert_eq!(events(&mut b), vec![Event::PeerClosed]);
}

#[test]
fn time_saturates() {
    let end = Time::from_nanos(u64::MAX);
    assert_eq!(end + Duration::from_secs(1), end);
    assert_eq!(t(5).saturating_since(t(10)), Duration::ZERO);
    assert_eq!(Time::from_duration(Duration::MAX), end);
    assert_eq!(t(3).as_duration(), Duration::from_micros(3));
}

#[test]
fn a_message_sent_in_parts_is_built_a_window_ahead() {
    let cfg = config(Mode::Host, 4);
    let (mut a, mut b) = pair(&cfg);
    let msg: Vec<u8> = (0..20 * cfg.max_datagram).map(|i| i as u8).collect();
    let frames = crate::wire::fragment_count(msg.len(), cfg.max_datagram);
    let mut part = a.begin_send(msg.len()).unwrap();
    // The window takes 4 now; 2 more wait built; the rest is not copied yet.
    assert!(!a.send_part(t(0), &msg[..5], &msg[5..], &mut part, 2));
    assert_eq!(a.sender().queued_frames(), 6);
    assert!(part.stalled);
    let mut got = Vec::new();
    let mut now = 0;
    loop {
        got.extend(exchange(&mut a, &mut b, t(now)));
        now += 1;
        let queued = a.send_part(t(now), &msg[..5], &msg[5..], &mut part, 2);
        assert!(
            a.sender().queued_frames() <= 6,
            "never more than room + ahead"
        );
        if queued {
            break;
        }
        assert!(now < 1000, "the message never got queued");
    }
    got.extend(exchange(&mut a, &mut b, t(now)));
    assert_eq!(got.len(), frames, "every fragment once");
    assert!(got.concat() == msg, "the bytes, in order");
    assert_eq!(a.counters().credit_stalls, 1, "one stall per message");
    assert!(a.is_idle());
    // Refused before any part: too long.
    assert!(matches!(
        a.begin_send(crate::wire::MAX_MESSAGE + 1),
        Err(SendError::TooLarge { .. })
    ));
}

// ---- Liveness: heartbeats and silence detection ----

fn ms(n: u64) -> Time {
    Time::from_micros(n * 1000)
}

/// Heartbeats every 100 ms, silence detection after 1 s.
fn live(mode: Mode, window: u16) -> Config {
    Config {
        window,
        heartbeat: Some(Duration::from_millis(100)),
        peer_timeout: Some(Duration::from_secs(1)),
        ..Config::with_mode(mode)
    }
}

/// Drives `a` and `b` over a perfect, instant link from `now` to `until`: A sends each of
/// `msgs` at its time, every timer of either side fires at its deadline. Returns the
/// payloads B received.
fn drive(
    a: &mut Duplex<Vec<u8>>,
    b: &mut Duplex<Vec<u8>>,
    mut now: Time,
    until: Time,
    msgs: &[(Time, Vec<u8>)],
) -> Vec<Vec<u8>> {
    let mut msgs = msgs.iter().peekable();
    let mut got = Vec::new();
    for _ in 0..1_000_000 {
        while let Some((_, m)) = msgs.next_if(|(at, _)| *at <= now) {
            a.send(now, m).unwrap();
        }
        got.extend(exchange(a, b, now));
        let next = [
            a.poll_timeout(),
            b.poll_timeout(),
            msgs.peek().map(|(at, _)| *at),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            Some(next) if next <= until => {
                now = now.max(next);
                a.handle_timeout(now);
                b.handle_timeout(now);
            }
            _ => return got,
        }
    }
    panic!("the timers never settle");
}

/// Drives `d` alone (whatever it sends is lost) until `until`; returns its events with
/// their times.
fn drive_alone(d: &mut Duplex<Vec<u8>>, mut now: Time, until: Time) -> Vec<(Time, Event)> {
    let mut evs = Vec::new();
    for _ in 0..1_000_000 {
        out(d, now);
        evs.extend(events(d).into_iter().map(|e| (now, e)));
        match d.poll_timeout() {
            Some(next) if next <= until => {
                now = now.max(next);
                d.handle_timeout(now);
            }
            _ => return evs,
        }
    }
    panic!("the timers never settle");
}

#[test]
fn liveness_settings_are_validated() {
    let d = Config::default();
    assert_eq!(d.peer_timeout, Some(DEFAULT_PEER_TIMEOUT));
    assert_eq!(d.heartbeat, Some(Duration::from_secs(1)));
    let c = Config::default().with_peer_timeout(Duration::from_secs(3));
    assert_eq!(
        (c.heartbeat, c.peer_timeout),
        (
            Some(Duration::from_millis(300)),
            Some(Duration::from_secs(3))
        )
    );
    assert!(c.validate().is_ok());
    assert!(Config::default().without_liveness().validate().is_ok());
    let keepalive_only = Config {
        peer_timeout: None,
        ..Config::default()
    };
    assert!(keepalive_only.validate().is_ok());
    for (heartbeat, peer_timeout, field) in [
        (Some(0), Some(1000), "heartbeat"),
        (Some(0), None, "heartbeat"),
        (Some(10), Some(0), "peer_timeout"),
        (Some(1000), Some(1000), "heartbeat"),
        (Some(2000), Some(1000), "heartbeat"),
        (None, Some(1000), "peer_timeout"),
    ] {
        let cfg = Config {
            heartbeat: heartbeat.map(Duration::from_millis),
            peer_timeout: peer_timeout.map(Duration::from_millis),
            ..Config::default()
        };
        let e = cfg.validate().unwrap_err();
        assert_eq!(e.field, field, "{heartbeat:?} {peer_timeout:?}: {e}");
    }
}

#[test]
fn heartbeats_go_on_an_idle_channel_and_not_while_data_flows() {
    for mode in [Mode::None, Mode::Host, Mode::Offload] {
        let (mut a, mut b) = pair(&live(mode, 8));
        assert_eq!(a.poll_timeout(), None, "no clock before the first time");
        assert!(out(&mut a, ms(0)).is_empty());
        assert!(out(&mut b, ms(0)).is_empty());
        assert_eq!(a.poll_timeout(), Some(ms(100)), "{mode}");
        a.handle_timeout(ms(99));
        assert!(
            out(&mut a, ms(99)).is_empty(),
            "{mode}: not before the interval"
        );
        a.handle_timeout(ms(100));
        let hb = out(&mut a, ms(100));
        assert_eq!(hb.len(), 1, "{mode}: one heartbeat");
        let h = header(&hb[0]);
        // An acknowledgement of nothing new, with the credits the peer already has.
        assert_eq!(
            (h.kind, h.seq, h.ack, h.credits),
            (FrameKind::Ack, 0, 0, 8),
            "{mode}"
        );
        assert!(h.flags.contains(Flags::CHECKSUM));
        let c = a.counters();
        assert_eq!((c.heartbeats, c.acks_explicit), (1, 0), "{mode}");
        assert_eq!(a.poll_timeout(), Some(ms(200)), "{mode}");
        // The peer takes it without a reply and without any protocol change.
        let before = b.counters();
        assert!(feed(&mut b, ms(100), hb).is_empty());
        assert_eq!(b.counters(), before, "{mode}");
        assert!(events(&mut b).is_empty());
        assert!(out(&mut b, ms(100)).is_empty(), "{mode}: no reply");
        assert_eq!(b.last_heard(), Some(ms(100)));

        // A sends every 50 ms for a second: it never needs a heartbeat; B acknowledges
        // (in the retransmitting modes), so neither does it.
        let msgs: Vec<(Time, Vec<u8>)> = (0..20u64)
            .map(|i| (ms(150 + 50 * i), vec![i as u8; 10]))
            .collect();
        let got = drive(&mut a, &mut b, ms(100), ms(150), &msgs);
        let (a0, b0) = (a.counters().heartbeats, b.counters().heartbeats);
        let got = [got, drive(&mut a, &mut b, ms(150), ms(1100), &msgs[1..])].concat();
        assert_eq!(got, msgs.iter().map(|m| m.1.clone()).collect::<Vec<_>>());
        assert_eq!(a.counters().heartbeats, a0, "{mode}: A sent data all along");
        if mode.retransmits() {
            assert_eq!(
                b.counters().heartbeats,
                b0,
                "{mode}: B acknowledged all along"
            );
        }
        // Heartbeats disturbed nothing: sequence numbers went on from 0, all is
        // acknowledged, nothing lost or retransmitted.
        assert_eq!(b.receiver().expected(), 20);
        let c = a.counters();
        assert_eq!((c.data_sent, c.retransmissions, c.bad_acks), (20, 0, 0));
        assert_eq!(b.counters().lost + b.counters().duplicates, 0);
        // Idle again: A heartbeats every 100 ms, and stays idle.
        let a1 = a.counters().heartbeats;
        drive(&mut a, &mut b, ms(1100), ms(3100), &[]);
        let beats = a.counters().heartbeats - a1;
        assert!(
            (19..=21).contains(&beats),
            "{mode}: {beats} heartbeats in 2 s"
        );
        assert!(a.is_idle() && b.is_idle(), "{mode}");
        assert!(
            events(&mut a).is_empty() && events(&mut b).is_empty(),
            "{mode}"
        );
        assert!(!a.is_failed() && !b.is_failed());
    }
}

#[test]
fn a_silent_peer_is_reported_once_at_the_timeout() {
    for mode in [Mode::None, Mode::Host, Mode::Offload] {
        let (mut a, _) = pair(&live(mode, 8));
        let evs = drive_alone(&mut a, ms(0), ms(60_000));
        assert_eq!(
            evs,
            vec![(
                ms(1000),
                Event::Error(ChannelError::Silent {
                    silence: Duration::from_secs(1)
                })
            )],
            "{mode}"
        );
        // Heartbeats at 100, 200, ..., 900 ms; then none.
        assert_eq!(a.counters().heartbeats, 9, "{mode}");
        assert_eq!(a.poll_timeout(), None, "{mode}");
        assert!(a.is_failed() && a.sender().is_failed());
        assert!(matches!(a.failure(), Some(ChannelError::Silent { .. })));
        assert_eq!(a.send(ms(61_000), b"late"), Err(SendError::Failed));
        assert!(out(&mut a, ms(61_000)).is_empty());
    }
}

#[test]
fn silence_and_retransmission_timeouts_report_one_failure() {
    // Data unacknowledged: the retransmissions keep the heartbeat quiet, and whichever
    // detector fires first is the only one reported.
    for (max_timeouts, silent) in [(40, true), (3, false)] {
        let cfg = Config {
            max_timeouts,
            ..live(Mode::Host, 8)
        };
        let (mut a, _) = pair(&cfg);
        a.send(ms(0), b"into the void").unwrap();
        let evs = drive_alone(&mut a, ms(0), ms(120_000));
        assert_eq!(evs.len(), 1, "{evs:?}");
        match evs[0] {
            (at, Event::Error(ChannelError::Silent { .. })) => {
                assert!(silent);
                assert_eq!(at, ms(1000));
            }
            (at, Event::Error(ChannelError::Unreachable { timeouts })) => {
                assert!(!silent);
                assert_eq!(timeouts, 4);
                assert!(at < ms(1000));
            }
            ref other => panic!("{other:?}"),
        }
        // Heartbeats fill only the gaps of the retransmission backoff longer than the
        // interval (at most 9 before the 1 s timeout), and none after the failure.
        let beats = a.counters().heartbeats;
        assert!(if silent { beats <= 9 } else { beats == 0 }, "{beats}");
        assert_eq!(a.poll_timeout(), None);
        assert!(a.is_failed());
    }
}

#[test]
fn the_silence_clock_starts_at_the_first_time_and_any_frame_resets_it() {
    let (mut a, mut b) = pair(&live(Mode::Host, 8));
    // Created long ago, first used at 5 s: silent since 5 s, not since the epoch.
    assert!(out(&mut a, ms(5000)).is_empty());
    assert_eq!(a.last_heard(), Some(ms(5000)));
    assert_eq!(a.poll_timeout(), Some(ms(5100)));
    // A frame from B counts as hearing from it.
    b.send(ms(5500), b"x").unwrap();
    let f = out(&mut b, ms(5500));
    assert_eq!(f.len(), 1);
    feed(&mut a, ms(5500), f);
    assert_eq!(a.last_heard(), Some(ms(5500)));
    // An invalid one does not.
    feed(&mut a, ms(5600), vec![vec![0xff; 40]]);
    assert_eq!(a.last_heard(), Some(ms(5500)));
    let evs = drive_alone(&mut a, ms(5600), ms(10_000));
    assert_eq!(
        evs,
        vec![(
            ms(6500),
            Event::Error(ChannelError::Silent {
                silence: Duration::from_secs(1)
            })
        )]
    );
}

#[test]
fn a_peer_that_said_goodbye_is_never_reported_silent() {
    for mode in [Mode::None, Mode::Host, Mode::Offload] {
        let (_, mut b) = pair(&live(mode, 4));
        assert!(out(&mut b, ms(0)).is_empty());
        let mut h = [0u8; crate::wire::HEADER_LEN];
        Header {
            kind: FrameKind::Goodbye,
            ..template(0, 1)
        }
        .emit_sealed(&mut h, &[]);
        feed(&mut b, ms(10), vec![h.to_vec()]);
        assert!(b.is_peer_closed());
        let evs = drive_alone(&mut b, ms(10), ms(600_000));
        assert_eq!(evs, vec![(ms(10), Event::PeerClosed)], "{mode}");
        assert_eq!(
            b.counters().heartbeats,
            0,
            "{mode}: no heartbeats to a closed peer"
        );
        assert_eq!(b.poll_timeout(), None);
        assert!(!b.is_failed());
    }
}

/// The receive fast path refuses every frame it must not overtake or take: one behind a
/// frame still waiting in the delivery queue, one followed by a frame held out of order
/// (which `handle_data` would deliver with it), one beyond the window, one not next.
#[test]
fn take_in_order_refuses_what_needs_the_general_path() {
    let cfg = Config {
        recovery: Recovery::Selective,
        ..config(Mode::Host, 4)
    };
    let mut r: Receiver<u32> = Receiver::new(&cfg).unwrap();
    assert!(r.takes_in_order(0) && !r.takes_in_order(1));
    // Frame 0 waits in the delivery queue: frame 1 may not overtake it.
    assert_eq!(r.handle_data(t(1), 0, 0), None);
    assert!(!r.takes_in_order(1));
    assert_eq!(r.poll_deliver(), Some(0));
    assert!(r.takes_in_order(1));
    // Frame 2 arrives first and is held out of order: taking 1 alone would strand it.
    assert_eq!(r.handle_data(t(2), 2, 2), None);
    assert!(!r.takes_in_order(1));
    assert_eq!(r.handle_data(t(3), 1, 1), None);
    assert_eq!((r.poll_deliver(), r.poll_deliver()), (Some(1), Some(2)));
    // Frame 3 in order, then the window is full (four held, none released).
    assert!(r.takes_in_order(3));
    r.take_in_order(t(4));
    assert_eq!((r.expected(), r.held()), (4, 4));
    assert!(!r.takes_in_order(4), "beyond the window");
    assert_eq!(r.handle_release(t(5), 1), 1);
    assert!(r.takes_in_order(4));
}

/// The send fast path refuses what needs the general path: a message longer than one
/// frame, one behind frames still queued, one the window has no room for.
#[test]
fn send_lone_refuses_what_needs_the_general_path() {
    let cfg = config(Mode::Host, 1);
    let (mut a, _) = pair(&cfg);
    let max = cfg.max_datagram - crate::wire::HEADER_LEN;
    assert!(
        a.send_lone(t(0), &[], &vec![0; max + 1]).is_none(),
        "two frames"
    );
    assert!(
        a.send_lone(t(0), &[1; 10], &vec![0; max - 9]).is_none(),
        "two frames"
    );
    assert!(
        a.send_lone(t(0), &[1; 10], &vec![0; max - 10]).is_some(),
        "one frame"
    );
    // The window of one frame is in use: the next message waits in the general path.
    assert!(a.send_lone(t(1), &[], b"next").is_none());
    assert!(matches!(a.send(t(1), b"next"), Ok(SendStatus::Blocked)));
    assert!(
        a.send_lone(t(2), &[], b"after").is_none(),
        "behind a queued frame"
    );
}
