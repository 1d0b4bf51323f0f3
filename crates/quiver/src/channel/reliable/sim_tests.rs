//! Property tests in the simulator: random fault schedules, windows and message sizes,
//! every run bounded in virtual time and steps. Plus an `#[ignore]`d goodput comparison
//! of go-back-N and selective repeat.

use std::time::Duration;

use proptest::prelude::*;

use super::harness::{is_subsequence, messages, Multi, PairSetup, Peer, Stopping};
use super::{ChannelError, Config, Mode, Recovery, Time};
use crate::link::fault::FaultConfig;
use crate::link::sim::{Limits, LinkConfig, Network};

/// Cases per property: 64, or `PROPTEST_CASES` for a longer soak.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

fn arb_sizes(max_count: usize) -> impl Strategy<Value = Vec<usize>> {
    let size = prop_oneof![
        3 => 0usize..64,
        3 => 64usize..1500,
        2 => 1500usize..6000,
    ];
    prop::collection::vec(size, 1..max_count)
}

fn arb_window() -> impl Strategy<Value = u16> {
    prop_oneof![Just(1u16), Just(2), Just(3), Just(8), Just(64), 1u16..200]
}

fn arb_faults(max_loss: f64, other: f64) -> impl Strategy<Value = FaultConfig> {
    (
        0.0..max_loss,
        0.0..other,
        0.0..other,
        0.0..other,
        0u64..30,
        any::<u64>(),
    )
        .prop_map(
            |(loss, dup, reorder, corrupt, jitter_us, seed)| FaultConfig {
                loss,
                dup,
                reorder,
                corrupt,
                jitter: Duration::from_micros(jitter_us),
                reorder_delay: Duration::from_micros(40),
                seed,
            },
        )
}

fn arb_link(faults: impl Strategy<Value = FaultConfig>) -> impl Strategy<Value = LinkConfig> {
    (
        1u64..100,
        prop::option::of(prop_oneof![Just(125_000_000u64), Just(1_250_000_000)]),
        faults,
    )
        .prop_map(|(latency_us, rate, faults)| LinkConfig {
            latency: Duration::from_micros(latency_us),
            mtu: 1472,
            rate,
            // Deep enough that the bottleneck never drops: loss comes from `faults` only.
            queue_limit: 64 << 20,
            faults,
        })
}

fn host_config(window: u16, selective: bool, offload: bool) -> Config {
    Config {
        mode: if offload { Mode::Offload } else { Mode::Host },
        recovery: if selective {
            Recovery::Selective
        } else {
            Recovery::GoBackN
        },
        window,
        // High enough that a run of bad luck at 30 % loss never gives up.
        max_timeouts: 40,
        // Runs settle only when no timer is left: no heartbeats (see the liveness tests).
        ..Config::default().without_liveness()
    }
}

fn check_host(
    cfg: Config,
    link: LinkConfig,
    a_sizes: &[usize],
    b_sizes: &[usize],
    seed: u64,
    setup: impl FnOnce(&mut PairSetup),
) -> Result<(), TestCaseError> {
    let mut s = PairSetup::new(cfg, link);
    s.a_to_b = messages(a_sizes, seed);
    s.b_to_a = messages(b_sizes, seed ^ 1);
    setup(&mut s);
    let run = s.run();
    prop_assert!(
        run.result.is_ok(),
        "simulation did not settle: {:?}",
        run.result
    );
    let [a, b] = &run.peers[..] else {
        unreachable!()
    };
    for (from, to) in [(a, b), (b, a)] {
        prop_assert!(to.errors.is_empty(), "errors: {:?}", to.errors);
        prop_assert_eq!(to.rx_anomalies, 0);
        prop_assert_eq!(to.received.len(), from.sent.len());
        prop_assert!(to.received == from.sent, "messages differ");
        prop_assert!(from.duplex.is_idle());
        prop_assert_eq!(to.duplex.counters().overruns, 0);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Host mode under loss, duplication, reordering, corruption and jitter: every
    /// message arrives exactly once, in order, byte-identical, in both directions, and
    /// the run settles (nothing in flight, no timer) within the bounds.
    #[test]
    fn host_mode_delivers_exactly_once_in_order(
        window in arb_window(),
        selective in any::<bool>(),
        offload in any::<bool>(),
        link in arb_link(arb_faults(0.1, 0.05)),
        a_sizes in arb_sizes(30),
        b_sizes in arb_sizes(10),
        seed in any::<u64>(),
        gap_us in 0u64..20,
        release_us in prop_oneof![Just(0u64), 1u64..300],
    ) {
        let cfg = host_config(window, selective, offload);
        check_host(cfg, link, &a_sizes, &b_sizes, seed, |s| {
            s.gap = Duration::from_micros(gap_us);
            s.release_delay = Duration::from_micros(release_us);
        })?;
    }

    /// Messages many windows long handed over a part at a time (as a blocking writer
    /// does), under the same faults: the same exactly-once, in-order delivery, and the
    /// next message begins only when the last is queued.
    #[test]
    fn host_mode_delivers_messages_sent_in_parts(
        window in prop_oneof![Just(1u16), Just(2), Just(4), 1u16..16],
        selective in any::<bool>(),
        link in arb_link(arb_faults(0.1, 0.05)),
        a_sizes in prop::collection::vec(prop_oneof![0usize..1500, 1500usize..40_000], 1..8),
        b_sizes in arb_sizes(5),
        seed in any::<u64>(),
        release_us in prop_oneof![Just(0u64), 1u64..300],
        ahead in 1usize..8,
    ) {
        let cfg = host_config(window, selective, false);
        check_host(cfg, link, &a_sizes, &b_sizes, seed, |s| {
            s.release_delay = Duration::from_micros(release_us);
            s.send_ahead = Some(ahead);
        })?;
    }

    /// The same under heavy faults: up to 30 % loss and 20 % duplication, reordering
    /// and corruption.
    #[test]
    fn host_mode_survives_heavy_faults(
        window in arb_window(),
        selective in any::<bool>(),
        link in arb_link(arb_faults(0.3, 0.2)),
        a_sizes in arb_sizes(20),
        b_sizes in arb_sizes(5),
        seed in any::<u64>(),
    ) {
        let cfg = host_config(window, selective, false);
        check_host(cfg, link, &a_sizes, &b_sizes, seed, |_| {})?;
    }

    /// Mode none on a perfect link (FIFO, no loss), with slow receivers and small
    /// windows: every message exactly once, in order, no error; a closed window queues.
    #[test]
    fn none_mode_on_a_perfect_link_delivers_everything(
        window in arb_window(),
        link in arb_link(Just(FaultConfig::none())),
        a_sizes in arb_sizes(30),
        b_sizes in arb_sizes(10),
        seed in any::<u64>(),
        release_us in prop_oneof![Just(0u64), 1u64..500],
        checksum in any::<bool>(),
    ) {
        let cfg = Config { window, checksum, ..Config::with_mode(Mode::None).without_liveness() };
        let mut s = PairSetup::new(cfg, link);
        s.a_to_b = messages(&a_sizes, seed);
        s.b_to_a = messages(&b_sizes, seed ^ 1);
        s.release_delay = Duration::from_micros(release_us);
        let run = s.run();
        prop_assert!(run.result.is_ok(), "simulation did not settle: {:?}", run.result);
        let [a, b] = &run.peers[..] else { unreachable!() };
        for (from, to) in [(a, b), (b, a)] {
            prop_assert!(to.errors.is_empty(), "errors: {:?}", to.errors);
            prop_assert_eq!(to.rx_anomalies, 0);
            prop_assert!(to.received == from.sent, "messages differ");
            prop_assert!(from.duplex.is_idle());
            prop_assert_eq!(from.duplex.counters().retransmissions, 0);
        }
        // Frames that cannot fit the window stall rather than drop.
        let frames: u64 = a.duplex.counters().data_sent;
        if frames > u64::from(window) && release_us > 0 {
            prop_assert!(a.duplex.counters().credit_stalls > 0 || a.blocked_sends == 0);
        }
    }

    /// Mode none on a lossy link: the run never hangs; what arrives is a byte-identical,
    /// in-order subsequence of what was sent; and if anything is missing, the receiver
    /// reported an error, within a bounded virtual time.
    #[test]
    fn none_mode_on_a_lossy_link_reports_an_error(
        window in arb_window(),
        link in arb_link(arb_faults(0.2, 0.05)),
        a_sizes in arb_sizes(30),
        seed in any::<u64>(),
        release_us in prop_oneof![Just(0u64), 1u64..300],
    ) {
        let cfg = Config { window, ..Config::with_mode(Mode::None).without_liveness() };
        let mut s = PairSetup::new(cfg, link);
        s.a_to_b = messages(&a_sizes, seed);
        s.release_delay = Duration::from_micros(release_us);
        s.limits.max_time = Duration::from_secs(10);
        let run = s.run();
        prop_assert!(run.result.is_ok(), "simulation did not settle: {:?}", run.result);
        let end = run.result.unwrap_or_default();
        let [a, b] = &run.peers[..] else { unreachable!() };
        prop_assert!(is_subsequence(&b.received, &a.sent), "delivered data is not a subsequence");
        if b.received != a.sent {
            prop_assert!(!b.errors.is_empty(), "messages missing but no error reported");
            // Reported before the run settled, which it did within `limits.max_time`.
            let first = b.errors[0].0.as_duration();
            prop_assert!(first <= end, "error at {first:?} after the end {end:?}");
        }
    }
}

/// The fast paths are taken where they apply, in every mode: small messages going both
/// ways on a clean link go out at once and are delivered at once (and the shadow channel
/// of the harness, which takes the general path, agrees at every step, as in every
/// schedule); messages of several frames take the general path.
#[test]
fn small_messages_take_the_fast_paths() {
    let clean = LinkConfig {
        latency: Duration::from_micros(20),
        mtu: 1472,
        rate: None,
        queue_limit: 64 << 20,
        faults: FaultConfig::none(),
    };
    for cfg in [
        host_config(8, true, false),
        host_config(8, false, true),
        Config::with_mode(Mode::None).without_liveness(),
    ] {
        let mode = cfg.mode;
        let mut s = PairSetup::new(cfg.clone(), clean.clone());
        s.a_to_b = messages(&[16; 40], 1);
        s.b_to_a = messages(&[16; 40], 2);
        s.gap = Duration::from_micros(50);
        let run = s.run();
        assert!(run.result.is_ok(), "{:?}", run.result);
        for (i, p) in run.peers.iter().enumerate() {
            let other = &run.peers[1 - i];
            assert_eq!(p.received, other.sent, "{mode:?}");
            assert_eq!(p.fast_sends, 40, "{mode:?}");
            assert_eq!(p.fast_deliveries, 40, "{mode:?}");
        }
        // Messages longer than a frame never take them.
        let mut s = PairSetup::new(cfg, clean.clone());
        s.a_to_b = messages(&[3000; 10], 3);
        s.gap = Duration::from_micros(500);
        let run = s.run();
        assert!(run.result.is_ok(), "{:?}", run.result);
        assert_eq!(run.peers[1].received, run.peers[0].sent);
        assert_eq!(
            (run.peers[0].fast_sends, run.peers[1].fast_deliveries),
            (0, 0)
        );
    }
}

/// A peer that never answers: the host-mode sender reports it unreachable after its
/// timeouts, and the run settles instead of retransmitting forever.
#[test]
fn host_mode_reports_an_unreachable_peer() {
    let cfg = Config::with_mode(Mode::Host).without_liveness();
    let dead = LinkConfig {
        faults: FaultConfig::parse("loss=1,seed=3").unwrap(),
        ..LinkConfig::default()
    };
    let mut s = PairSetup::new(cfg.clone(), dead);
    s.a_to_b = messages(&[10, 3000, 10], 1);
    let run = s.run();
    let end = run.result.expect("settles");
    let a = &run.peers[0];
    assert_eq!(
        a.errors.iter().map(|e| e.1).collect::<Vec<_>>(),
        vec![ChannelError::Unreachable {
            timeouts: cfg.max_timeouts + 1
        }]
    );
    // 10, 20, 40, ... ms, capped at 1 s, 13 timeouts: about 7.3 s of virtual time.
    assert!(end < Duration::from_secs(9), "{end:?}");
    assert!(run.peers[1].received.is_empty());
}

fn incast(cfg: &Config, senders: usize, per_sender: usize) -> (Vec<Multi>, Network) {
    // Per-sender links of 1 Gbit/s with room for 16 KiB (11 full frames) in the queue.
    let link = LinkConfig {
        latency: Duration::from_micros(5),
        rate: Some(125_000_000),
        queue_limit: 16 << 10,
        ..LinkConfig::default()
    };
    let mut net = Network::new(senders + 1, link);
    let hub = Multi::new((1..=senders).map(|i| Peer::new(cfg, 0, i)).collect());
    let mut nodes = vec![hub];
    for i in 1..=senders {
        let mut p = Peer::new(cfg, i, 0);
        p.script(
            messages(&vec![1400; per_sender], i as u64),
            Duration::ZERO,
            Duration::ZERO,
        );
        nodes.push(Multi::new(vec![p]));
    }
    let limits = Limits {
        max_time: Duration::from_secs(30),
        max_steps: 10_000_000,
    };
    net.run(&mut nodes, limits).expect("settles");
    (nodes, net)
}

/// Four senders into one receiver through small bottleneck queues. Host mode recovers
/// the tail drops; mode none with a window that fits the queue loses nothing, and with
/// one that does not, reports the loss.
#[test]
fn incast_through_small_queues() {
    let (nodes, net) = incast(&Config::with_mode(Mode::Host).without_liveness(), 4, 200);
    let drops: u64 = (1..=4).map(|i| net.stats(i, 0).unwrap().queue_drops).sum();
    assert!(drops > 0, "the queues overflow with W = 64");
    for (i, p) in nodes[0].peers.iter().enumerate() {
        assert_eq!(p.received, nodes[i + 1].peers[0].sent);
        assert!(p.errors.is_empty());
    }

    let fits = Config {
        window: 8,
        ..Config::with_mode(Mode::None).without_liveness()
    };
    let (nodes, net) = incast(&fits, 4, 200);
    let drops: u64 = (1..=4).map(|i| net.stats(i, 0).unwrap().queue_drops).sum();
    assert_eq!(drops, 0, "credits keep the queues from overflowing");
    for (i, p) in nodes[0].peers.iter().enumerate() {
        assert_eq!(p.received, nodes[i + 1].peers[0].sent);
        assert!(p.errors.is_empty());
        assert!(nodes[i + 1].peers[0].blocked_sends > 0);
    }

    let (nodes, _) = incast(&Config::with_mode(Mode::None).without_liveness(), 4, 200);
    for p in &nodes[0].peers {
        assert!(p.received.len() < 200);
        assert!(matches!(
            p.errors.first(),
            Some((_, ChannelError::Lost { .. }))
        ));
    }
}

/// Goodput (message bytes per second of virtual time) of one bulk transfer.
fn goodput(recovery: Recovery, loss: f64, seed: u64) -> (f64, u64, u64) {
    const MESSAGES: usize = 4000;
    let cfg = Config {
        recovery,
        max_timeouts: 50,
        ..Config::with_mode(Mode::Host).without_liveness()
    };
    let link = LinkConfig {
        latency: Duration::from_micros(20),
        mtu: 1472,
        rate: Some(1_250_000_000), // 10 Gbit/s
        queue_limit: 64 << 20,
        faults: FaultConfig {
            loss,
            seed,
            ..FaultConfig::none()
        },
    };
    let mut s = PairSetup::new(cfg, link);
    s.a_to_b = messages(&vec![1400; MESSAGES], seed);
    let run = s.run();
    let b = &run.peers[1];
    assert!(run.result.is_ok(), "{:?}", run.result);
    assert_eq!(b.received, run.peers[0].sent);
    let t = b
        .last_received
        .map_or(1.0, |t| t.as_duration().as_secs_f64());
    let bytes = (MESSAGES * 1400) as f64;
    let c = run.peers[0].duplex.counters();
    (bytes / t, c.retransmissions, c.timeouts)
}

/// Prints goodput of go-back-N and selective repeat at 0, 1 and 5 % loss, with the frames
/// resent and the timeouts: the mean of 40 seeds (W = 64, 1400-byte messages, 10 Gbit/s,
/// 20 us one way).
/// `cargo test -p quiver --release --lib goodput_comparison -- --ignored --nocapture`
#[test]
#[ignore = "prints a comparison; run by hand"]
fn goodput_comparison() {
    println!("loss   go-back-N MB/s (resent, timeouts)   selective MB/s (resent, timeouts)");
    for loss in [0.0, 0.01, 0.05] {
        let mut row = format!("{:>4.0} %", loss * 100.0);
        for recovery in [Recovery::GoBackN, Recovery::Selective] {
            let runs: Vec<_> = (1..=40).map(|seed| goodput(recovery, loss, seed)).collect();
            let mbps = runs.iter().map(|r| r.0).sum::<f64>() / runs.len() as f64 / 1e6;
            let retx = runs.iter().map(|r| r.1).sum::<u64>() / runs.len() as u64;
            let timeouts = runs.iter().map(|r| r.2 as f64).sum::<f64>() / runs.len() as f64;
            row += &format!("   {mbps:>10.1} ({retx:>6}, {timeouts:>4.1})     ");
        }
        println!("{row}");
    }
}

// ---- Liveness: heartbeats and silence detection in the simulator ----

/// Settings with heartbeats every `heartbeat` and silence detection after `timeout`.
fn live(mode: Mode, heartbeat: Duration, timeout: Duration) -> Config {
    Config {
        heartbeat: Some(heartbeat),
        peer_timeout: Some(timeout),
        // Retransmissions must not give up first: silence is under test.
        max_timeouts: 1000,
        ..Config::with_mode(mode)
    }
}

fn lossy(loss: f64, seed: u64) -> LinkConfig {
    LinkConfig {
        latency: Duration::from_micros(50),
        faults: FaultConfig {
            loss,
            jitter: Duration::from_micros(20),
            seed,
            ..FaultConfig::none()
        },
        ..LinkConfig::default()
    }
}

/// Node 0 and node 1 over `link`, each sending its messages every `gap` from `start`;
/// node 1 stops at `stop` (with a goodbye if `goodbye`). Runs until `until` (or until no
/// timer is left). Returns the nodes and whether the run settled before `until`.
#[allow(clippy::too_many_arguments)]
fn liveness_run(
    cfg: &Config,
    link: LinkConfig,
    msgs: [Vec<Vec<u8>>; 2],
    start: Duration,
    gap: Duration,
    stop: Option<Duration>,
    goodbye: bool,
    until: Duration,
) -> (Vec<Stopping>, bool) {
    let mut net = Network::new(2, link);
    let mut nodes: Vec<Stopping> = msgs
        .into_iter()
        .enumerate()
        .map(|(me, m)| {
            let mut p = Peer::new(cfg, me, 1 - me);
            p.script(m, start, gap);
            let at = if me == 1 { stop } else { None };
            Stopping::new(p, me, at.unwrap_or(Duration::MAX), goodbye)
        })
        .collect();
    let limits = Limits {
        max_time: until,
        max_steps: 50_000_000,
    };
    let settled = match net.run(&mut nodes, limits) {
        Ok(_) => true,
        Err(crate::link::sim::SimError::TimeLimit { .. }) => false,
        Err(e) => panic!("{e}"),
    };
    (nodes, settled)
}

/// Two idle peers with only heartbeats between them stay alive for 1000 s of virtual
/// time, in every mode, on a perfect link and at 20 % loss (heartbeat interval a tenth of
/// the timeout: a false failure needs 10 losses in a row).
#[test]
fn idle_peers_stay_alive_on_heartbeats() {
    let (hb, timeout) = (Duration::from_millis(100), Duration::from_secs(1));
    for mode in [Mode::None, Mode::Host, Mode::Offload] {
        for (loss, seed) in [(0.0, 1), (0.2, 2), (0.2, 3)] {
            let cfg = live(mode, hb, timeout);
            let (nodes, settled) = liveness_run(
                &cfg,
                lossy(loss, seed),
                [vec![], vec![]],
                Duration::ZERO,
                Duration::ZERO,
                None,
                false,
                Duration::from_secs(1000),
            );
            assert!(!settled, "heartbeats keep the timers running");
            for n in &nodes {
                let d = &n.peer.duplex;
                assert!(
                    n.peer.errors.is_empty(),
                    "{mode} loss {loss}: {:?}",
                    n.peer.errors
                );
                assert!(!d.is_failed() && d.is_idle());
                // One heartbeat per interval (the peer's heartbeats do not reset it).
                let beats = d.counters().heartbeats;
                assert!((9_990..=10_000).contains(&beats), "{mode}: {beats}");
                let c = d.counters();
                assert_eq!(c.data_sent + c.acks_explicit + c.probes, 0, "{mode}");
            }
        }
    }
}

/// The control of the test above: heartbeats only twice per timeout at 50 % loss do
/// miss the timeout sometimes, and the (false) failure is reported.
#[test]
fn heartbeats_too_sparse_for_the_loss_miss_the_timeout() {
    let cfg = live(
        Mode::Host,
        Duration::from_millis(500),
        Duration::from_secs(1),
    );
    let (nodes, _) = liveness_run(
        &cfg,
        lossy(0.5, 4),
        [vec![], vec![]],
        Duration::ZERO,
        Duration::ZERO,
        None,
        false,
        Duration::from_secs(1000),
    );
    let failures = nodes.iter().filter(|n| n.peer.duplex.is_failed()).count();
    assert!(failures > 0, "two losses in a row in 1000 s at 50 % loss");
}

/// Data and heartbeats share a lossy channel: heartbeats go in the pauses, every
/// message arrives exactly once and in order, and nothing fails.
#[test]
fn data_flows_between_heartbeats() {
    let (hb, timeout) = (Duration::from_millis(5), Duration::from_millis(100));
    let sizes: Vec<usize> = (0..60).map(|i| [10, 1400, 4000][i % 3]).collect();
    for (recovery, seed) in [(Recovery::GoBackN, 5), (Recovery::Selective, 6)] {
        let cfg = Config {
            recovery,
            ..live(Mode::Host, hb, timeout)
        };
        let msgs = [messages(&sizes, seed), messages(&sizes, seed ^ 1)];
        let (nodes, _) = liveness_run(
            &cfg,
            lossy(0.1, seed),
            msgs,
            Duration::ZERO,
            Duration::from_millis(12),
            None,
            false,
            Duration::from_secs(5),
        );
        for (from, to) in [
            (&nodes[0].peer, &nodes[1].peer),
            (&nodes[1].peer, &nodes[0].peer),
        ] {
            assert!(to.errors.is_empty(), "{:?}", to.errors);
            assert_eq!(to.rx_anomalies, 0);
            assert!(to.received == from.sent, "messages differ");
            assert!(from.duplex.is_idle());
            assert!(from.duplex.counters().heartbeats > 0);
        }
    }
    // Mode none on a perfect link (no jitter: it would reorder): a heartbeat is never
    // taken for a probe or a gap.
    let cfg = live(Mode::None, hb, timeout);
    let msgs = [messages(&sizes, 7), messages(&sizes, 8)];
    let (nodes, _) = liveness_run(
        &cfg,
        LinkConfig::default(),
        msgs,
        Duration::ZERO,
        Duration::from_millis(12),
        None,
        false,
        Duration::from_secs(5),
    );
    for (from, to) in [
        (&nodes[0].peer, &nodes[1].peer),
        (&nodes[1].peer, &nodes[0].peer),
    ] {
        assert!(to.errors.is_empty(), "{:?}", to.errors);
        assert!(to.received == from.sent, "messages differ");
        assert_eq!(to.duplex.counters().lost, 0);
        assert!(from.duplex.counters().heartbeats > 0);
    }
}

/// A peer that crashes (stops without a word) is reported exactly once, within the
/// timeout of its last frame: no later than `stop + timeout`, no earlier than
/// `stop + timeout - heartbeat - latency`. Then the survivor goes quiet (the run
/// settles) and refuses sends. In every mode, with data flowing before the crash and
/// sends after it (the retransmitting modes may not give up first).
#[test]
fn a_crashed_peer_is_reported_once_within_the_timeout() {
    let (hb, timeout) = (Duration::from_millis(100), Duration::from_secs(2));
    let stop = Duration::from_millis(3_050);
    for mode in [Mode::None, Mode::Host, Mode::Offload] {
        for seed in [11, 12] {
            let cfg = live(mode, hb, timeout);
            // Node 0 sends every 500 ms, on after the crash; node 1 every 500 ms too.
            let msgs = [messages(&[100; 12], seed), messages(&[100; 12], seed ^ 1)];
            let loss = if mode == Mode::None { 0.0 } else { 0.05 };
            let (nodes, settled) = liveness_run(
                &cfg,
                lossy(loss, seed),
                msgs,
                Duration::from_millis(10),
                Duration::from_millis(500),
                Some(stop),
                false,
                Duration::from_secs(600),
            );
            assert!(
                settled,
                "{mode}: the survivor stops its timers after the failure"
            );
            let a = &nodes[0].peer;
            assert_eq!(a.errors.len(), 1, "{mode}: {:?}", a.errors);
            let (at, e) = a.errors[0];
            let ChannelError::Silent { silence } = e else {
                panic!("{mode}: {e:?}");
            };
            let earliest = Time::from_duration(stop + timeout - hb - Duration::from_millis(1));
            let latest = Time::from_duration(stop + timeout);
            assert!(
                earliest <= at && at <= latest,
                "{mode}: reported at {at:?}, crash at {stop:?}"
            );
            assert!(silence >= timeout);
            assert!(a.duplex.is_failed() && a.duplex.poll_timeout().is_none());
            assert!(
                a.refused_sends > 0,
                "{mode}: sends after the failure are refused"
            );
            assert!(nodes[1].peer.errors.is_empty());
        }
    }
}

/// A peer that says goodbye and goes away is not reported: no error, no heartbeat, and
/// the survivor's timers stop.
#[test]
fn a_peer_that_closed_is_not_reported() {
    let (hb, timeout) = (Duration::from_millis(100), Duration::from_secs(1));
    for mode in [Mode::None, Mode::Host, Mode::Offload] {
        let cfg = live(mode, hb, timeout);
        let msgs = [messages(&[100; 4], 1), messages(&[100; 4], 2)];
        let (nodes, settled) = liveness_run(
            &cfg,
            lossy(0.0, 1),
            msgs,
            Duration::from_millis(10),
            Duration::from_millis(300),
            Some(Duration::from_millis(2_000)),
            true,
            Duration::from_secs(600),
        );
        let a = &nodes[0].peer;
        assert!(settled, "{mode}: no timer left once the peer closed");
        assert!(a.errors.is_empty(), "{mode}: {:?}", a.errors);
        assert!(a.duplex.is_peer_closed() && !a.duplex.is_failed());
        assert_eq!(a.received, nodes[1].peer.sent);
        // About 20 heartbeats in the 2 s before the goodbye, none after.
        assert!(a.duplex.counters().heartbeats <= 20, "{mode}");
    }
}
