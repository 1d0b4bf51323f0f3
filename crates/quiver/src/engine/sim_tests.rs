//! The real driver in the simulator: two endpoints' [`Driver`]s, each over one node's
//! [`SimLink`] and a clock that reads the simulated network's virtual time, exchange
//! messages under seeded loss, duplication, reordering and corruption. Nothing here copies
//! driver logic: sends go through `write_lone`, `begin_send` and `send_part`, reception
//! through `progress` and the release calls, exactly as the endpoint makes them.
//!
//! Then whole endpoints: two [`Station`]s (what a `dm::Endpoint` stands on: routes,
//! receivers, sending on a route, polling, holding and releasing tokens) over the same
//! simulated network, under random fault schedules and reader behaviour (proptest); and a
//! [`Protocol`] on the hook, driven by its station, answering through its outbox.
//!
//! Every run is a function of its seed and bounded in virtual time: a protocol that stops
//! making progress fails the test instead of hanging it.

use super::clock::Clock;
use super::driver::{Driver, Pace, Ready};
use super::protocol::{Disposition, Outbox, Protocol};
use super::station::Station;
use super::stats::EndpointStats;
use crate::addr::Source;
use crate::channel::reliable::Time;
use crate::config::{Config, TransportChoice};
use crate::error::Error;
use crate::job::Job;
use crate::link::fault::Faulty;
use crate::link::fault::{FaultConfig, SimRng};
use crate::link::sim::{LinkConfig, SimLink, SimNet};
use crate::link::Link;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

/// The simulated network's virtual time, as the driver's clock.
pub(crate) struct SimClock(Rc<RefCell<SimNet>>);

impl Clock for SimClock {
    fn now(&self) -> Time {
        Time::from_duration(self.0.borrow().now())
    }
}

/// The DPID of both simulated endpoints.
pub(crate) const DPID: u16 = 7;
/// Virtual time a run may take before it counts as stuck.
const VIRTUAL_LIMIT: Duration = Duration::from_secs(120);

/// One rank: its driver and what the endpoint above it would keep.
struct Rank<L: Link> {
    net: Driver<L, SimClock>,
    ready: VecDeque<Ready>,
    stats: EndpointStats,
    errors: VecDeque<Error>,
}

impl<L: Link> Rank<L> {
    fn progress(&mut self) {
        self.net
            .progress(&mut self.ready, &mut self.stats, &mut self.errors, true)
            .expect("a progress round over the simulated link");
        if let Some(e) = self.errors.pop_front() {
            panic!("the driver reported {e}");
        }
    }
}

/// Joins two ranks of one job (through a store in a fresh directory: both ranks exchange
/// their bootstrap there, so they join from two threads).
fn join_pair(config: &Config) -> (Job, Job, StoreDir) {
    let (jobs, dir) = join_ranks(config, 2);
    let [a, b]: [Job; 2] = jobs.try_into().unwrap_or_else(|_| unreachable!());
    (a, b, dir)
}

/// Joins `n` ranks of one job, each from a thread of its own.
fn join_ranks(config: &Config, size: u32) -> (Vec<Job>, StoreDir) {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("quiver-sim-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("file://{}", dir.display());
    let join = |rank: u32| {
        let url = url.clone();
        let config = config.clone();
        std::thread::spawn(move || {
            let env: HashMap<&str, String> = [
                ("QUIVER_RANK", rank.to_string()),
                ("QUIVER_SIZE", size.to_string()),
                ("QUIVER_JOB_ID", "4242".into()),
                ("QUIVER_JOB_TOKEN", "00000000deadbeef".into()),
                ("QUIVER_RENDEZVOUS", url),
            ]
            .into_iter()
            .collect();
            Job::from_lookup(&|k| env.get(k).cloned(), config).expect("join the simulated job")
        })
    };
    let threads: Vec<_> = (0..size).map(join).collect();
    let jobs = threads.into_iter().map(|t| t.join().unwrap()).collect();
    (jobs, StoreDir(dir))
}

/// The store's directory, removed when the run ends.
pub(crate) struct StoreDir(std::path::PathBuf);

impl Drop for StoreDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two ranks on a two-node simulated network whose links inject `faults`, each rank's
/// link made by `wrap` from its node's [`SimLink`].
fn pair<L: Link>(
    faults: FaultConfig,
    wrap: impl Fn(SimLink) -> L,
) -> (Rc<RefCell<SimNet>>, Rank<L>, Rank<L>, StoreDir) {
    let config = Config::default();
    let (j0, j1, dir) = join_pair(&config);
    let net = SimNet::new(
        2,
        LinkConfig {
            faults,
            ..LinkConfig::default()
        },
    );
    let window = config.channel_window(false);
    let rank = |job: &Job, node: usize| Rank {
        net: Driver::with_link(
            job.shared.clone(),
            DPID,
            wrap(SimNet::link(&net, node, 512)),
            SimClock(net.clone()),
            window,
        )
        .unwrap(),
        ready: VecDeque::new(),
        stats: EndpointStats::default(),
        errors: VecDeque::new(),
    };
    let (r0, r1) = (rank(&j0, 0), rank(&j1, 1));
    (net, r0, r1, dir)
}

/// Moves virtual time to the next arrival or deadline of either rank; false once the
/// run has gone on longer than [`VIRTUAL_LIMIT`].
fn advance<L: Link>(net: &Rc<RefCell<SimNet>>, ranks: [&Rank<L>; 2]) -> bool {
    advance_until(
        net,
        [
            ranks[0].net.time_to_deadline(),
            ranks[1].net.time_to_deadline(),
        ],
        None,
    )
}

/// Moves virtual time to the next arrival, the earliest of `waits` from now, or `at`
/// (at least a nanosecond, a millisecond when nothing is due); false once the run has
/// gone on longer than [`VIRTUAL_LIMIT`].
pub(crate) fn advance_until(
    net: &Rc<RefCell<SimNet>>,
    waits: impl IntoIterator<Item = Option<Duration>>,
    at: Option<Duration>,
) -> bool {
    let now = net.borrow().now();
    let next = waits
        .into_iter()
        .map(|w| w.map(|d| now + d))
        .chain([net.borrow().next_arrival(), at.map(|t| t.max(now))])
        .flatten()
        .min()
        .unwrap_or(now + Duration::from_millis(1))
        .max(now + Duration::from_nanos(1));
    net.borrow_mut().advance(next);
    next < VIRTUAL_LIMIT
}

/// The message `i` of a run: its length from the seed, its bytes from its index.
fn message(rng: &mut SimRng, i: usize) -> Vec<u8> {
    let len = match rng.below(4) {
        0 => 0,
        1 => 1 + rng.below(64) as usize,
        2 => 64 + rng.below(1400) as usize,
        _ => 1400 + rng.below(20_000) as usize,
    };
    (0..len).map(|j| (i * 131 + j) as u8).collect()
}

/// Rank 0 writes `count` messages to rank 1 as the endpoint does (the lone fast path,
/// else the general one, waiting for credits by making progress); rank 1 reads and
/// releases them. Returns both ranks' counters.
fn run<L: Link>(
    faults: FaultConfig,
    wrap: impl Fn(SimLink) -> L,
    count: usize,
    seed: u64,
) -> (EndpointStats, EndpointStats) {
    let (net, mut r0, mut r1, _store) = pair(faults, wrap);
    let mut rng = SimRng::new(seed);
    let to1 = r0
        .net
        .peer(
            Source {
                rank: 1,
                dpid: DPID,
            },
            true,
        )
        .unwrap();
    let sent: Vec<Vec<u8>> = (0..count).map(|i| message(&mut rng, i)).collect();
    let mut next_send = 0;
    let mut part = None;
    let mut got = 0;
    while got < count {
        // Rank 0 writes while the window lets it.
        while next_send < count {
            let msg = &sent[next_send];
            if part.is_none() && r0.net.write_lone(to1, &[], msg, &mut r0.stats).unwrap() {
                next_send += 1;
                continue;
            }
            let p = match part.as_mut() {
                Some(p) => p,
                None => part.insert(r0.net.begin_send(to1, msg.len()).unwrap()),
            };
            let step = r0
                .net
                .send_part(to1, (&[], msg), p, Pace::Window, &mut r0.stats)
                .unwrap();
            if step.queued {
                part = None;
                next_send += 1;
            }
            if step.must_wait {
                break;
            }
        }
        r0.progress();
        r1.progress();
        // Rank 1 reads in order and releases, as a reader dropping each message does.
        while let Some(r) = r1.ready.pop_front() {
            let source = match &r {
                Ready::Slot { source, .. } | Ready::Owned { source, .. } => *source,
            };
            assert_eq!(
                source,
                Source {
                    rank: 0,
                    dpid: DPID
                }
            );
            assert!(got < count, "more messages than were sent");
            assert!(
                r1.net.ready_bytes(&r) == sent[got].as_slice(),
                "message {got} (of {} bytes) arrived changed or out of order",
                sent[got].len()
            );
            got += 1;
            r1.net.release(r);
        }
        assert!(
            advance(&net, [&r0, &r1]),
            "stuck: {got} of {count} messages delivered after {VIRTUAL_LIMIT:?} of virtual \
             time ({next_send} written)"
        );
    }
    r0.net.add_counters(&mut r0.stats);
    r1.net.add_counters(&mut r1.stats);
    (r0.stats, r1.stats)
}

#[test]
fn messages_cross_a_clean_simulated_link_in_order() {
    let (s0, s1) = run(FaultConfig::none(), |l| l, 300, 1);
    assert_eq!(s1.lost_frames + s0.retransmissions + s1.duplicates, 0);
    assert!(s0.frames_sent >= 300);
}

#[test]
fn the_real_driver_repairs_seeded_faults() {
    for seed in 0..6u64 {
        let faults = FaultConfig::parse(&format!(
            "loss=0.05,dup=0.02,reorder=0.05,reorder_delay=300us,corrupt=0.01,seed={seed}"
        ))
        .unwrap();
        let (s0, s1) = run(faults, |l| l, 200, seed);
        assert!(
            s0.retransmissions > 0 && s1.checksum_failures + s1.duplicates > 0,
            "seed {seed}: the faults did not show ({s0:?}, {s1:?})"
        );
    }
}

#[test]
fn the_real_driver_repairs_what_a_faulty_link_wrapper_injects() {
    // The injector as QUIVER_FAULTS uses it: a wrapper that holds delayed and reordered
    // datagrams until the driver's round calls it back (`poll_timeout`,
    // `handle_timeout`), lone messages included.
    for seed in 0..4u64 {
        let cfg = FaultConfig::parse(&format!(
            "loss=0.05,dup=0.02,reorder=0.1,reorder_delay=200us,delay=30us,corrupt=0.01,\
             seed={seed}"
        ))
        .unwrap();
        let (s0, s1) = run(
            FaultConfig::none(),
            |l| Faulty::new(l, cfg.clone()),
            200,
            seed,
        );
        assert!(
            s0.faults_reordered > 0 && s0.faults_lost > 0 && s0.retransmissions > 0,
            "seed {seed}: the wrapper's faults did not show ({s0:?})"
        );
        assert!(
            s1.faults_lost + s1.faults_reordered > 0,
            "rank 1's acknowledgements too"
        );
    }
}

/// A station over a simulated link behind a fault injector, in virtual time.
pub(crate) type SimStation = Station<Faulty<SimLink>, SimClock>;

/// Two stations of one job on a two-node simulated network (`transport = udp`, so that
/// every route is the driver's), each over its node's link wrapped by a fault injector
/// with `faults` (seeded).
fn station_pair(faults: &FaultConfig) -> (Rc<RefCell<SimNet>>, [SimStation; 2], StoreDir) {
    let config = Config {
        transport: TransportChoice::Udp,
        connect_timeout: Duration::from_secs(2),
        ..Config::default()
    };
    let (net, stations, _jobs, dir) = station_pair_in(&config, faults);
    (net, stations, dir)
}

/// [`station_pair`] for a job with `config` (whose transport should be UDP: every route
/// then goes through the simulated network), with the two ranks' jobs.
pub(crate) fn station_pair_in(
    config: &Config,
    faults: &FaultConfig,
) -> (Rc<RefCell<SimNet>>, [SimStation; 2], [Job; 2], StoreDir) {
    let (j0, j1, dir) = join_pair(config);
    let net = SimNet::new(2, LinkConfig::default());
    let stations = [
        sim_station(config, &net, &j0, 0, faults),
        sim_station(config, &net, &j1, 1, faults),
    ];
    (net, stations, [j0, j1], dir)
}

/// `job`'s station on node `node` of `net`, its link behind a fault injector with
/// `faults` (seeded).
fn sim_station(
    config: &Config,
    net: &Rc<RefCell<SimNet>>,
    job: &Job,
    node: usize,
    faults: &FaultConfig,
) -> SimStation {
    let link = Faulty::new(SimNet::link(net, node, 512), faults.clone());
    let window = config.channel_window(false);
    let driver = Driver::with_link(
        job.shared.clone(),
        DPID,
        link,
        SimClock(net.clone()),
        window,
    )
    .unwrap();
    Station::with_driver(job.shared.clone(), DPID, driver, SimClock(net.clone())).unwrap()
}

/// Moves virtual time to the next arrival or station deadline; false past
/// [`VIRTUAL_LIMIT`].
pub(crate) fn advance_stations<L: Link>(
    net: &Rc<RefCell<SimNet>>,
    stations: &[Station<L, SimClock>; 2],
) -> bool {
    advance_until(
        net,
        [stations[0].poll_timeout(), stations[1].poll_timeout()],
        None,
    )
}

/// How the reading station treats what it reads.
#[derive(Debug, Clone, Copy)]
enum Reader {
    /// Releases every message as soon as it is read (a `Message` dropped).
    Drops,
    /// Holds up to `n` messages (`Message::hold`) and releases them all at once
    /// (`Endpoint::release`).
    HoldsUpTo(usize),
}

/// Station 0 writes `sizes.len()` messages to station 1 without ever waiting (as
/// `try_write_parts` does, some with a head), while station 1 polls and reads as
/// `reader` says, and the other way round a message every tenth step; everything sent
/// arrives once, in order, intact, and every token comes back.
fn stations_exchange(
    sizes: &[usize],
    faults: &FaultConfig,
    reader: Reader,
) -> (EndpointStats, EndpointStats) {
    let (net, stations, _store) = station_pair(faults);
    let [s0, s1] = &stations;
    let to1 = s0
        .connect(Source {
            rank: 1,
            dpid: DPID,
        })
        .unwrap();
    let to0 = s1
        .connect(Source {
            rank: 0,
            dpid: DPID,
        })
        .unwrap();
    let sent: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| (0..len).map(|j| (i * 31 + j * 7) as u8).collect())
        .collect();
    let replies = sent.len() / 10;
    let (mut next_send, mut got, mut next_reply, mut replies_got) = (0, 0, 0, 0);
    let mut step = 0usize;
    while got < sent.len() || replies_got < replies {
        step += 1;
        if next_send < sent.len() {
            let msg = &sent[next_send];
            // Every third message carries its first bytes as a head (a gather write).
            let cut = if next_send % 3 == 0 {
                msg.len().min(5)
            } else {
                0
            };
            assert!(s0.send(to1, &msg[..cut], &msg[cut..], false).unwrap());
            next_send += 1;
        }
        if step.is_multiple_of(10) && next_reply < replies {
            assert!(s1
                .send(to0, b"re:", &next_reply.to_le_bytes(), false)
                .unwrap());
            next_reply += 1;
        }
        while let Some(r) = s1.poll().unwrap() {
            assert_eq!(
                r.source,
                Source {
                    rank: 0,
                    dpid: DPID
                }
            );
            assert!(got < sent.len(), "more messages than were sent");
            // SAFETY: a received message's bytes stay in place until its token is
            // released, which happens below.
            let bytes = unsafe { std::slice::from_raw_parts(r.ptr, r.len) };
            assert!(
                bytes == sent[got].as_slice(),
                "message {got} ({} bytes) arrived changed or out of order",
                sent[got].len()
            );
            got += 1;
            match reader {
                Reader::Drops => s1.release_token(r.token),
                Reader::HoldsUpTo(n) => {
                    s1.hold_token(r.token);
                    if s1.held() >= n {
                        assert_eq!(s1.release_held(n), n);
                    }
                }
            }
        }
        while let Some(r) = s0.poll().unwrap() {
            // SAFETY: a received message's bytes stay in place until its token is
            // released, at the end of this iteration.
            let bytes = unsafe { std::slice::from_raw_parts(r.ptr, r.len) };
            assert_eq!(bytes[..3], *b"re:");
            assert_eq!(bytes[3..], replies_got.to_le_bytes());
            replies_got += 1;
            s0.release_token(r.token);
        }
        assert!(
            advance_stations(&net, &stations),
            "stuck: {got} of {} messages and {replies_got} of {replies} replies after \
             {VIRTUAL_LIMIT:?} of virtual time",
            sent.len()
        );
    }
    s1.release_held(usize::MAX);
    assert_eq!(s1.held(), 0);
    // Let the last acknowledgements cross, so that closing finds nothing to wait for;
    // nothing more may arrive (a late duplicate would show here).
    let until = net.borrow().now() + Duration::from_millis(50);
    while net.borrow().now() < until {
        assert!(
            s0.poll().unwrap().is_none(),
            "a message after the last reply"
        );
        assert!(s1.poll().unwrap().is_none(), "a message after the last one");
        advance_stations(&net, &stations);
    }
    let (st0, st1) = (s0.stats(), s1.stats());
    assert_eq!(st1.msgs_received, sent.len() as u64);
    assert_eq!(st0.msgs_sent, sent.len() as u64);
    assert_eq!(st0.msgs_received, replies as u64);
    assert_eq!(st1.msgs_sent, replies as u64);
    (st0, st1)
}

#[test]
fn whole_stations_exchange_over_a_clean_simulated_link() {
    let sizes: Vec<usize> = (0..120)
        .map(|i| [0, 1, 100, 1472, 1473, 9000][i % 6])
        .collect();
    for reader in [Reader::Drops, Reader::HoldsUpTo(7)] {
        let (st0, st1) = stations_exchange(&sizes, &FaultConfig::none(), reader);
        assert_eq!(
            st0.retransmissions + st1.duplicates + st1.dropped_malformed,
            0
        );
    }
}

#[test]
fn whole_stations_repair_seeded_faults() {
    let sizes: Vec<usize> = (0..150).map(|i| [3, 700, 1472, 5000][i % 4]).collect();
    for seed in 0..3u64 {
        let faults = FaultConfig::parse(&format!(
            "loss=0.05,dup=0.02,reorder=0.05,reorder_delay=200us,corrupt=0.01,seed={seed}"
        ))
        .unwrap();
        let (st0, st1) = stations_exchange(&sizes, &faults, Reader::HoldsUpTo(5));
        assert!(
            st0.faults_lost > 0
                && st0.retransmissions > 0
                && st1.duplicates + st1.checksum_failures > 0,
            "seed {seed}: the faults did not show ({st0:?}, {st1:?})"
        );
    }
}

pub(crate) mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Cases per property: 16, or `PROPTEST_CASES` for a longer soak.
    pub(crate) fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16)
    }

    fn arb_sizes() -> impl Strategy<Value = Vec<usize>> {
        let size = prop_oneof![
            3 => 0usize..64,
            3 => 64usize..1500,
            2 => 1500usize..12_000,
        ];
        prop::collection::vec(size, 1..80)
    }

    pub(crate) fn arb_faults() -> impl Strategy<Value = FaultConfig> {
        (
            0.0..0.15f64,
            0.0..0.05f64,
            0.0..0.1f64,
            0.0..0.03f64,
            any::<u64>(),
        )
            .prop_map(|(loss, dup, reorder, corrupt, seed)| {
                FaultConfig::parse(&format!(
                    "loss={loss},dup={dup},reorder={reorder},reorder_delay=200us,\
                     corrupt={corrupt},seed={seed}"
                ))
                .unwrap()
            })
    }

    fn arb_reader() -> impl Strategy<Value = Reader> {
        prop_oneof![
            Just(Reader::Drops),
            (1usize..12).prop_map(Reader::HoldsUpTo)
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// Whole stations, random messages, random seeded faults, random readers: every
        /// message arrives exactly once, in order, intact, within the virtual-time bound.
        #[test]
        fn stations_deliver_exactly_once_in_order_under_random_faults(
            sizes in arb_sizes(),
            faults in arb_faults(),
            reader in arb_reader(),
        ) {
            stations_exchange(&sizes, &faults, reader);
        }
    }
}

/// A protocol on the hook, as ports and RMA's target side will be: rank 1 serves a
/// counter. `add` + a number adds it and answers `sum` + the running total through the
/// outbox (consumed); anything else is delivered to the reader. Its timeout sends rank 0
/// a `tick` every millisecond, `ticks` times.
struct Counter {
    sum: u64,
    client: Source,
    ticks_left: u32,
    next_tick: Option<Time>,
}

impl Protocol for Counter {
    fn handle_message(
        &mut self,
        _now: Time,
        from: Source,
        msg: &[u8],
        out: &mut Outbox,
    ) -> Disposition {
        let Some(n) = msg.strip_prefix(b"add") else {
            return Disposition::Deliver;
        };
        self.sum += u64::from_le_bytes(n.try_into().expect("8 bytes"));
        out.send(from, b"sum", &self.sum.to_le_bytes())
            .expect("the simulated routes take every message");
        Disposition::Consumed
    }

    fn handle_timeout(&mut self, now: Time, out: &mut Outbox) {
        out.send(self.client, b"tick", &[]).expect("room");
        self.ticks_left -= 1;
        self.next_tick = (self.ticks_left > 0).then(|| now + Duration::from_millis(1));
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.next_tick
    }
}

/// A protocol's outbox of many messages to one network peer reaches the link in one
/// batch (a get's answer pieces leave as runs on the pair link, not frame by frame), and
/// every message arrives, in order.
#[test]
fn an_outbox_reaches_the_link_in_one_batch_per_peer() {
    let (net, stations, _store) = station_pair(&FaultConfig::default());
    let [s0, s1] = &stations;
    let to = Source {
        rank: 1,
        dpid: DPID,
    };
    s0.connect(to).unwrap();
    let mut protocol = Counter {
        sum: 0,
        client: to,
        ticks_left: 0,
        next_tick: None,
    };
    let mut out = Outbox::new(64);
    for i in 0..10u8 {
        out.send(to, b"dm:", &[i; 100]).unwrap();
    }
    s0.send_outbox(&mut protocol, &mut out).unwrap();
    assert!(out.is_empty());
    let stats = net.borrow().stats(0, 1).unwrap().clone();
    assert_eq!((stats.batches, stats.sent), (1, 10));
    let mut got = Vec::new();
    while got.len() < 10 {
        while let Some(r) = s1.poll().unwrap() {
            // SAFETY: valid until the token is released, below.
            let bytes = unsafe { std::slice::from_raw_parts(r.ptr, r.len) };
            got.push(bytes[3]);
            s1.release_token(r.token);
        }
        assert!(advance_until(
            &net,
            [s0.poll_timeout(), s1.poll_timeout()],
            None
        ));
    }
    assert_eq!(got, (0..10).collect::<Vec<u8>>());
}

/// A protocol that answers with ranges: each chunk behind `rg:` and its offset; it
/// records the ranges that ended.
struct Ranges {
    done: Vec<(u64, bool)>,
}

impl Protocol for Ranges {
    fn handle_message(&mut self, _: Time, _: Source, _: &[u8], _: &mut Outbox) -> Disposition {
        Disposition::Deliver
    }

    fn range_header(&self, _key: u64, offset: u64, _len: usize, head: &mut Vec<u8>) {
        head.extend_from_slice(b"rg:");
        head.extend_from_slice(&offset.to_le_bytes());
    }

    fn range_done(&mut self, _to: Source, key: u64, complete: bool, _out: &mut Outbox) {
        self.done.push((key, complete));
    }
}

/// A range many windows long to a network peer (a pulled message) is built about a
/// window ahead of what the window lets out: the first flush leaves most of it in the
/// outbox, where all of it once went into the channel's queue before the first frame
/// left (4 MiB copied, 1.2 ms, before a pull's answer began). Every byte still
/// arrives, in order, and the range ends once, complete.
#[test]
fn a_long_range_is_queued_a_window_ahead_and_arrives_whole() {
    let (net, stations, _store) = station_pair(&FaultConfig::default());
    let [s0, s1] = &stations;
    let to = Source {
        rank: 1,
        dpid: DPID,
    };
    let route = s0.connect(to).unwrap();
    let memory: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut protocol = Ranges { done: Vec::new() };
    let mut out = Outbox::new(4);
    // SAFETY: `memory` outlives the outbox's use of it: the range is over (checked
    // below) before the end of the test.
    unsafe { out.send_range(to, 9, memory.as_ptr(), 0, memory.len() as u64, 4096) }.unwrap();
    s0.send_outbox(&mut protocol, &mut out).unwrap();
    assert!(!out.is_empty(), "the whole range was queued at once");
    assert!(
        s0.send_backlogged(route),
        "not even a window was queued ahead"
    );
    let mut got = Vec::new();
    while protocol.done.is_empty() || got.len() < memory.len() {
        s0.send_outbox(&mut protocol, &mut out).unwrap();
        assert!(s0.poll().unwrap().is_none());
        while let Some(r) = s1.poll().unwrap() {
            // SAFETY: valid until the token is released, below.
            let bytes = unsafe { std::slice::from_raw_parts(r.ptr, r.len) };
            let (head, data) = bytes.split_at(11);
            assert_eq!(&head[..3], b"rg:");
            let offset = u64::from_le_bytes(head[3..].try_into().unwrap());
            assert_eq!(offset, got.len() as u64, "a chunk out of order");
            got.extend_from_slice(data);
            s1.release_token(r.token);
        }
        assert!(advance_until(
            &net,
            [s0.poll_timeout(), s1.poll_timeout()],
            None
        ));
    }
    assert!(got == memory, "the bytes differ");
    assert_eq!(protocol.done, vec![(9, true)]);
}

/// Rank 0 sends `adds` requests interleaved with plain messages; rank 1's counter,
/// driven by its station, answers each request, delivers the plain messages in order and
/// ticks. Rank 0 sees every running total in order and every tick.
fn counter_service(faults: &FaultConfig, adds: u64, ticks: u32) {
    let (net, stations, _store) = station_pair(faults);
    let [s0, s1] = &stations;
    let client = Source {
        rank: 0,
        dpid: DPID,
    };
    let to1 = s0
        .connect(Source {
            rank: 1,
            dpid: DPID,
        })
        .unwrap();
    let mut counter = Counter {
        sum: 0,
        client,
        ticks_left: ticks,
        next_tick: Some(Time::from_duration(Duration::from_millis(1))),
    };
    let mut out = Outbox::new(64);
    let (mut sent, mut sums, mut plain, mut ticks_got, mut expected_sum) = (0u64, 0u64, 0u64, 0, 0);
    while sums < adds || plain < adds || ticks_got < ticks {
        if sent < adds {
            sent += 1;
            assert!(s0.send(to1, b"add", &sent.to_le_bytes(), false).unwrap());
            assert!(s0.send(to1, b"dm:", &sent.to_le_bytes(), false).unwrap());
        }
        while let Some(r) = s1.drive(&mut counter, &mut out, |e| e).unwrap() {
            // SAFETY: valid until the token is released, below.
            let bytes = unsafe { std::slice::from_raw_parts(r.ptr, r.len) };
            plain += 1;
            assert_eq!(bytes[..3], *b"dm:");
            assert_eq!(bytes[3..], plain.to_le_bytes(), "plain messages in order");
            s1.release_token(r.token);
        }
        while let Some(r) = s0.poll().unwrap() {
            // SAFETY: a received message's bytes stay in place until its token is
            // released, at the end of this iteration.
            let bytes = unsafe { std::slice::from_raw_parts(r.ptr, r.len) };
            if bytes == b"tick" {
                ticks_got += 1;
            } else {
                sums += 1;
                expected_sum += sums;
                assert_eq!(bytes[..3], *b"sum");
                assert_eq!(bytes[3..], expected_sum.to_le_bytes(), "answer {sums}");
            }
            s0.release_token(r.token);
        }
        let tick = counter.next_tick.map(|t| t.as_duration());
        assert!(
            advance_until(&net, [s0.poll_timeout(), s1.poll_timeout()], tick),
            "stuck: {sums} of {adds} answers, {plain} plain messages, {ticks_got} ticks"
        );
    }
    assert!(out.is_empty());
    assert_eq!(counter.sum, adds * (adds + 1) / 2);
    assert_eq!(ticks_got, ticks);
    let until = net.borrow().now() + Duration::from_millis(50);
    while net.borrow().now() < until {
        s0.progress().unwrap();
        s1.progress().unwrap();
        advance_stations(&net, &stations);
    }
}

#[test]
fn a_protocol_on_the_hook_answers_through_its_outbox_and_ticks_on_its_timeout() {
    counter_service(&FaultConfig::none(), 200, 5);
    for seed in 0..3u64 {
        let faults = FaultConfig::parse(&format!(
            "loss=0.05,dup=0.02,reorder=0.05,reorder_delay=200us,corrupt=0.01,seed={seed}"
        ))
        .unwrap();
        counter_service(&faults, 150, 8);
    }
}

/// `n` stations of one job on an `n`-node simulated network with a broadcast address,
/// every link (one per direction of each pair of nodes) injecting `faults` with its own
/// schedule: a broadcast frame may reach some members and not others.
fn broadcast_stations(
    config: &Config,
    faults: FaultConfig,
    n: u32,
) -> (Rc<RefCell<SimNet>>, Vec<SimStation>, Vec<Job>, StoreDir) {
    let (jobs, dir) = join_ranks(config, n);
    let net = SimNet::new(
        n as usize,
        LinkConfig {
            faults,
            ..LinkConfig::default()
        },
    );
    net.borrow_mut().enable_broadcast();
    let stations = jobs
        .iter()
        .enumerate()
        .map(|(node, job)| sim_station(config, &net, job, node, &FaultConfig::none()))
        .collect();
    (net, stations, jobs, dir)
}

/// Rank 0 broadcasts `count` messages (0 to 6000 bytes: one frame or several) through
/// its group channel, never waiting, while ranks 1..n read them, rank n-1 holding up to
/// 20 at a time (its credits hold the root back); every member gets every message once,
/// whole and in order. Returns the root's stats.
fn group_broadcasts(faults: FaultConfig, seed: u64, n: u32, count: usize) -> EndpointStats {
    let config = Config {
        transport: TransportChoice::Udp,
        connect_timeout: Duration::from_secs(2),
        ..Config::default()
    };
    let (net, stations, _jobs, _dir) = broadcast_stations(&config, faults, n);
    let root = &stations[0];
    let group = root
        .connect_group()
        .unwrap()
        .expect("a link with a broadcast address");
    // The group is no rank: a caller's rank never reaches it, even the group's number.
    assert!(matches!(
        root.connect(Source::group(DPID)),
        Err(Error::NoSuchRank { .. })
    ));
    let mut rng = SimRng::new(seed);
    let sent: Vec<Vec<u8>> = (0..count).map(|i| message(&mut rng, i)).collect();
    let mut got = vec![0usize; n as usize];
    let mut next = 0;
    let holder = n as usize - 1;
    while got[1..].iter().any(|&g| g < count) {
        if next < count {
            assert!(root.send(group, &[], &sent[next], false).unwrap());
            next += 1;
        }
        for (r, s) in stations.iter().enumerate().skip(1) {
            while let Some(m) = s.poll().unwrap() {
                assert_eq!(
                    m.source,
                    Source {
                        rank: 0,
                        dpid: DPID
                    }
                );
                let i = got[r];
                assert!(i < count, "rank {r}: more broadcasts than were sent");
                // SAFETY: a received message's bytes stay in place until its token is
                // released, below.
                let bytes = unsafe { std::slice::from_raw_parts(m.ptr, m.len) };
                assert!(
                    bytes == sent[i].as_slice(),
                    "rank {r}: broadcast {i} ({} bytes) arrived changed or out of order",
                    sent[i].len()
                );
                got[r] += 1;
                if r == holder {
                    s.hold_token(m.token);
                    if s.held() >= 20 {
                        s.release_held(20);
                    }
                } else {
                    s.release_token(m.token);
                }
            }
        }
        let _ = root.poll().unwrap();
        if got[holder] == count {
            stations[holder].release_held(usize::MAX);
        }
        assert!(
            advance_until(&net, stations.iter().map(|s| s.poll_timeout()), None),
            "stuck: {got:?} of {count} broadcasts after {VIRTUAL_LIMIT:?} of virtual time"
        );
    }
    // Nothing more arrives (a duplicate would show here), and the root's channel drains.
    let until = net.borrow().now() + Duration::from_millis(200);
    while net.borrow().now() < until {
        for s in &stations {
            assert!(s.poll().unwrap().is_none(), "a message after the last one");
        }
        advance_until(&net, stations.iter().map(|s| s.poll_timeout()), Some(until));
    }
    let st = root.stats();
    assert_eq!(st.msgs_sent, count as u64);
    st
}

#[test]
fn a_group_channel_delivers_each_broadcast_once_in_order_to_every_member() {
    let st = group_broadcasts(FaultConfig::none(), 1, 4, 300);
    assert_eq!(st.retransmissions + st.fast_retransmits, 0, "{st:?}");
}

#[test]
fn a_group_channel_repairs_what_each_member_loses_on_its_own() {
    for seed in 1..=4 {
        let faults = FaultConfig {
            loss: 0.03,
            dup: 0.02,
            reorder: 0.05,
            corrupt: 0.01,
            seed,
            ..FaultConfig::none()
        };
        let st = group_broadcasts(faults, seed, 5, 300);
        assert!(
            st.fast_retransmits + st.retransmissions > 0,
            "seed {seed}: losses were never repaired? {st:?}"
        );
    }
}
