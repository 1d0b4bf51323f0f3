//! One test suite for every datagram [`Link`]: udp, eth and the two paired (through
//! [`NetLink`], on loopback), the simulator's [`SimLink`] and [`Faulty`] around it. Each test takes a
//! pair of links and a way to let time pass; a test that needs a capability a link lacks
//! ([`LinkCaps`]) says so and skips that link.
//!
//! eth needs `CAP_NET_RAW`: without it the eth cases print one line and pass, except
//! under `.ci/run` (`QUIVER_CI` set), where they fail.

use super::fault::{FaultConfig, Faulty};
use super::network::{NetLink, Placement};
use super::sim::{LinkConfig, SimLink, SimNet};
use super::{Link, LinkCaps, LinkParams, Transport};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// How long a real link may take to carry what a test sent.
const REAL_WAIT: Duration = Duration::from_secs(5);

/// A pair of links that reach each other, and how time passes for them.
trait Setup {
    type L: Link;
    /// The two links, or `None` (after saying why) when this host cannot make them.
    fn pair(&mut self) -> Option<(Self::L, Self::L)>;
    /// Lets a little time pass, giving each link its due timeouts; false once the time a
    /// test may wait is up.
    fn pass_time(&mut self, a: &mut Self::L, b: &mut Self::L) -> bool;
}

/// Which real link.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Udp,
    Eth,
    /// Raw Ethernet with UDP runs beside it (`pair`).
    Pair,
}

/// Links of the real network on loopback.
struct Real {
    kind: Kind,
    started: Instant,
    /// Raw frames on lo are seen by a link without its filter in another test.
    _lo: Option<std::sync::RwLockReadGuard<'static, ()>>,
}

impl Real {
    fn new(kind: Kind) -> Real {
        Real {
            kind,
            started: Instant::now(),
            _lo: (kind != Kind::Udp).then(|| {
                super::eth::LO_RAW_TRAFFIC
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
            }),
        }
    }
}

/// The DPID that every test datagram names as its destination, where a wire header
/// has it: eth delivers only frames for its own endpoint ([`LinkCaps::demuxes_dpid`]).
const DPID: u16 = 0x4a4b;

fn params(kind: Kind) -> LinkParams {
    LinkParams {
        eth_wanted_by: (kind != Kind::Udp).then_some("the link conformance suite"),
        eth_udp_runs: kind == Kind::Pair,
        eth_ring: Some(256),
        ..LinkParams::for_tests()
    }
}

impl Setup for Real {
    type L = NetLink;

    fn pair(&mut self) -> Option<(NetLink, NetLink)> {
        // Tests run in parallel in one process: every link gets its own eth port and
        // DPID, and the process's own id keeps two test processes apart.
        static NEXT: AtomicU16 = AtomicU16::new(0);
        let ip = std::net::IpAddr::from([127, 0, 0, 1]);
        let base = (std::process::id() as u16).wrapping_mul(64);
        let open = || {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let at = Placement {
                ip,
                port: base.wrapping_add(n),
                remote_ranks: 1,
                alone_on_node: false,
            };
            NetLink::open(&params(self.kind), at, DPID).unwrap()
        };
        let (a, b) = (open(), open());
        let want = match self.kind {
            Kind::Udp => Transport::Udp,
            Kind::Eth | Kind::Pair => Transport::Eth,
        };
        if a.transport() != want || b.transport() != want {
            crate::test_support::cannot_run(
                "raw Ethernet is not available here (needs CAP_NET_RAW)",
            );
            return None;
        }
        self.started = Instant::now();
        Some((a, b))
    }

    fn pass_time(&mut self, a: &mut NetLink, b: &mut NetLink) -> bool {
        std::thread::sleep(Duration::from_micros(200));
        let now = self.started.elapsed();
        a.handle_timeout(now).unwrap();
        b.handle_timeout(now).unwrap();
        now < REAL_WAIT
    }
}

/// Two nodes of a simulated network; `faults` wraps both links in an injector.
struct Sim {
    net: Option<Rc<RefCell<SimNet>>>,
}

/// The simulated setups' bound on virtual time.
const SIM_WAIT: Duration = Duration::from_secs(1);

impl Sim {
    fn network(&mut self) -> Rc<RefCell<SimNet>> {
        let net = SimNet::new(2, LinkConfig::default());
        self.net = Some(net.clone());
        net
    }

    /// Moves virtual time to the next event: an arrival or a link's timeout.
    fn step(&self, timeouts: [Option<Duration>; 2]) -> bool {
        let net = self.net.as_ref().expect("pair() first");
        let mut net = net.borrow_mut();
        let next = [net.next_arrival(), timeouts[0], timeouts[1]]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(net.now() + Duration::from_micros(100));
        net.advance(next);
        net.now() < SIM_WAIT
    }
}

impl Setup for Sim {
    type L = SimLink;

    fn pair(&mut self) -> Option<(SimLink, SimLink)> {
        let net = self.network();
        Some((SimNet::link(&net, 0, 64), SimNet::link(&net, 1, 64)))
    }

    fn pass_time(&mut self, a: &mut SimLink, b: &mut SimLink) -> bool {
        self.step([a.poll_timeout(), b.poll_timeout()])
    }
}

/// The simulator behind an injector that reorders and delays (and loses nothing).
struct FaultySim(Sim);

fn reordering() -> FaultConfig {
    FaultConfig::parse("reorder=0.3,reorder_delay=50us,delay=20us,seed=9").unwrap()
}

impl Setup for FaultySim {
    type L = Faulty<SimLink>;

    fn pair(&mut self) -> Option<(Faulty<SimLink>, Faulty<SimLink>)> {
        let (a, b) = self.0.pair()?;
        Some((Faulty::new(a, reordering()), Faulty::new(b, reordering())))
    }

    fn pass_time(&mut self, a: &mut Faulty<SimLink>, b: &mut Faulty<SimLink>) -> bool {
        let alive = self.0.step([a.poll_timeout(), b.poll_timeout()]);
        let now = self.0.net.as_ref().unwrap().borrow().now();
        a.handle_timeout(now).unwrap();
        b.handle_timeout(now).unwrap();
        alive
    }
}

/// A payload that says which datagram it is, `len` bytes long, with [`DPID`] where a
/// wire header has its destination.
fn payload(i: usize, len: usize) -> Vec<u8> {
    let mut p: Vec<u8> = (0..len)
        .map(|j| (i * 31 + j * 7) as u8 ^ (i >> 8) as u8)
        .collect();
    if let Some(dst) = p.get_mut(4..6) {
        dst.copy_from_slice(&DPID.to_le_bytes());
    }
    p
}

/// Receives on `b` until `n` datagrams have come or time is up; frees every slot.
fn receive<S: Setup>(setup: &mut S, a: &mut S::L, b: &mut S::L, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut batch = Vec::new();
    loop {
        batch.clear();
        b.recv_batch(&mut batch).unwrap();
        for d in &batch {
            got.push(b.slot(d.slot)[..d.len].to_vec());
            b.free_slot(d.slot);
        }
        if got.len() >= n || !setup.pass_time(a, b) {
            return got;
        }
    }
}

/// Checks what arrived against what was sent, as far as `caps` promise.
fn check_delivery(caps: LinkCaps, sent: &[Vec<u8>], got: &[Vec<u8>]) {
    assert_eq!(
        got.len(),
        sent.len(),
        "a lossless link delivers everything once"
    );
    if caps.ordered {
        assert!(got == sent, "an ordered link keeps the order of sending");
    } else {
        let mut count: HashMap<&[u8], i64> = HashMap::new();
        for d in sent {
            *count.entry(d).or_default() += 1;
        }
        for d in got {
            *count.entry(d).or_default() -= 1;
        }
        assert!(
            count.values().all(|&c| c == 0),
            "the same datagrams, intact"
        );
    }
}

fn resolves_only_what_it_advertised<S: Setup>(mut setup: S) {
    let Some((a, b)) = setup.pair() else { return };
    assert!(b.resolve(&a.advertise()).is_ok());
    assert!(a.resolve(&b.advertise()).is_ok());
    let long = "x,".repeat(10_000);
    for bad in [
        "",
        ",",
        ",,,",
        "udp",
        "udp,",
        "udp,1.2.3.4:5,",
        "udp,nonsense,1472",
        "eth,zz:zz,1,1472",
        "eth,02:00:00:00:00:01,70000,1472",
        "eth,02:00:00:00:00:01,1,7",
        "eth+udp",
        "eth+udp,02:00:00:00:00:01,1,1472",
        "eth+udp,02:00:00:00:00:01,1,1472,1.2.3.4:5",
        "eth+udp,02:00:00:00:00:01,1,1472,nonsense,1472",
        "eth+udp,zz:zz,1,1472,1.2.3.4:5,1472",
        "eth+udp,02:00:00:00:00:01,70000,1472,1.2.3.4:5,1472",
        "eth+udp,02:00:00:00:00:01,1,1472,1.2.3.4:5,7",
        "eth+udp,02:00:00:00:00:01,1,1472,1.2.3.4:5,1472,",
        "sim,",
        "sim,-1",
        "sim,99999999999999999999",
        "\u{0}\u{ff}",
        long.as_str(),
    ] {
        assert!(a.resolve(bad).is_err(), "{bad:?} resolved");
    }
}

fn datagrams_arrive_whole<S: Setup>(mut setup: S) {
    let Some((mut a, mut b)) = setup.pair() else {
        return;
    };
    let (min, max) = (b.caps().min_datagram.max(1), b.caps().max_datagram);
    let to_b = a.resolve(&b.advertise()).unwrap();
    let sizes = [min, min + 1, 31, 32, 100, 1000, max - 1, max];
    let sent: Vec<Vec<u8>> = sizes
        .iter()
        .cycle()
        .take(40)
        .enumerate()
        .map(|(i, &len)| payload(i, len))
        .collect();
    for (i, d) in sent.iter().enumerate() {
        a.send(Duration::from_micros(i as u64), &to_b, d).unwrap();
    }
    let got = receive(&mut setup, &mut a, &mut b, sent.len());
    let caps = a.caps();
    if !caps.lossless {
        // A missing capability is not a missing tool: skip, even under CI.
        eprintln!("skipping the delivery check: the link may lose datagrams");
        return;
    }
    check_delivery(caps, &sent, &got);
}

fn batches_arrive_whole<S: Setup>(mut setup: S) {
    let Some((mut a, mut b)) = setup.pair() else {
        return;
    };
    let to_b = a.resolve(&b.advertise()).unwrap();
    // Runs of equal sizes (what segmentation offload takes) and a shorter tail.
    let mut sent: Vec<Vec<u8>> = (0..24).map(|i| payload(i, 600)).collect();
    sent.push(payload(99, 17));
    let parts: Vec<&[u8]> = sent.iter().map(Vec::as_slice).collect();
    a.send_batch(Duration::ZERO, &to_b, &parts, 8).unwrap();
    let got = receive(&mut setup, &mut a, &mut b, sent.len());
    check_delivery(a.caps(), &sent, &got);
}

fn held_slots_are_never_reused<S: Setup>(mut setup: S) {
    let Some((mut a, mut b)) = setup.pair() else {
        return;
    };
    let to_b = a.resolve(&b.advertise()).unwrap();
    // Hold the first eight datagrams; stream more through the remaining slots.
    let held_payloads: Vec<Vec<u8>> = (0..8).map(|i| payload(1000 + i, 200)).collect();
    for d in &held_payloads {
        a.send(Duration::ZERO, &to_b, d).unwrap();
    }
    let mut held = Vec::new();
    let mut batch = Vec::new();
    while held.len() < held_payloads.len() {
        batch.clear();
        b.recv_batch(&mut batch).unwrap();
        held.extend(batch.iter().copied());
        if held.len() < held_payloads.len() {
            assert!(
                setup.pass_time(&mut a, &mut b),
                "the held datagrams never came"
            );
        }
    }
    for round in 0..20 {
        let sent: Vec<Vec<u8>> = (0..8).map(|i| payload(round * 8 + i, 300)).collect();
        for d in &sent {
            a.send(Duration::ZERO, &to_b, d).unwrap();
        }
        let got = receive(&mut setup, &mut a, &mut b, sent.len());
        check_delivery(a.caps(), &sent, &got);
    }
    let mut still: Vec<Vec<u8>> = held
        .iter()
        .map(|d| b.slot(d.slot)[..d.len].to_vec())
        .collect();
    let mut want = held_payloads.clone();
    still.sort();
    want.sort();
    assert_eq!(still, want, "a held slot was written again");
    for d in held {
        b.free_slot(d.slot);
    }
}

/// Runs `test` over every link.
macro_rules! over_every_link {
    ($($test:ident),* $(,)?) => {
        mod udp {
            use super::*;
            $(#[test] fn $test() { super::$test(Real::new(Kind::Udp)) })*
        }
        mod eth {
            use super::*;
            $(#[test] fn $test() { super::$test(Real::new(Kind::Eth)) })*
        }
        mod pair {
            use super::*;
            $(#[test] fn $test() { super::$test(Real::new(Kind::Pair)) })*
        }
        mod sim {
            use super::*;
            $(#[test] fn $test() { super::$test(Sim { net: None }) })*
        }
        mod faulty_sim {
            use super::*;
            $(#[test] fn $test() { super::$test(FaultySim(Sim { net: None })) })*
        }
    };
}

over_every_link!(
    resolves_only_what_it_advertised,
    datagrams_arrive_whole,
    batches_arrive_whole,
    held_slots_are_never_reused,
);

#[test]
fn capabilities_say_how_each_link_differs() {
    let net = SimNet::new(2, LinkConfig::default());
    let sim = SimNet::link(&net, 0, 4);
    let caps = sim.caps();
    assert!(caps.lossless && caps.ordered && caps.polls_in_memory && !caps.ordered_slots);
    assert!(!caps.demuxes_dpid && !caps.holds_back);
    let reorders = Faulty::new(SimNet::link(&net, 1, 4), reordering()).caps();
    assert!(reorders.lossless && !reorders.ordered && reorders.holds_back);
    let loses = Faulty::new(
        SimNet::link(&net, 1, 4),
        FaultConfig::parse("loss=0.1").unwrap(),
    )
    .caps();
    assert!(!loses.lossless && loses.ordered && !loses.holds_back);
    let mut real = Real::new(Kind::Udp);
    let (udp, _) = real.pair().unwrap();
    let caps = udp.caps();
    assert!(!caps.polls_in_memory && !caps.ordered_slots && !caps.edge_triggered);
    let mut real = Real::new(Kind::Eth);
    if let Some((eth, _)) = real.pair() {
        let caps = eth.caps();
        assert!(caps.polls_in_memory && caps.ordered_slots && caps.edge_triggered);
        assert!(!caps.segments && caps.demuxes_dpid && caps.min_datagram == 6);
        assert!(caps.ordered && eth.second_fd().is_none());
    }
    drop(real);
    let mut real = Real::new(Kind::Pair);
    if let Some((pair, _)) = real.pair() {
        // The ring's capabilities, with UDP's runs and no promise of order or of a
        // demultiplexed DPID (the UDP socket takes what comes); its socket is watched
        // beside the ring.
        let caps = pair.caps();
        assert!(matches!(pair, NetLink::Pair(_)));
        assert!(caps.polls_in_memory && caps.ordered_slots && caps.edge_triggered);
        assert!(caps.segments && !caps.demuxes_dpid && caps.min_datagram == 6);
        assert!(caps.lossless && !caps.ordered && pair.second_fd().is_some());
    }
}

#[test]
fn a_faulty_link_counts_what_it_did_and_sends_what_it_delayed() {
    let mut setup = Sim { net: None };
    let (a, mut b) = setup.pair().unwrap();
    let cfg = FaultConfig::parse("loss=0.2,dup=0.1,reorder=0.2,reorder_delay=1ms,seed=3").unwrap();
    let mut a = Faulty::new(a, cfg);
    let to_b = a.resolve(&b.advertise()).unwrap();
    for i in 0..200 {
        a.send(Duration::ZERO, &to_b, &payload(i, 64)).unwrap();
    }
    let held = a.poll_timeout().expect("reordered datagrams are held");
    assert_eq!(held, Duration::from_millis(1));
    let c = a.counters().faults;
    assert_eq!(c.datagrams, 200);
    assert!(c.lost > 0 && c.duplicated > 0 && c.reordered > 0, "{c:?}");
    let expected = (200 - c.lost + c.duplicated) as usize;
    // Nothing held is sent before its time; all of it once handle_timeout finds it due.
    let mut got = 0;
    let mut batch = Vec::new();
    for step in [Duration::from_micros(500), Duration::from_millis(2)] {
        setup.net.as_ref().unwrap().borrow_mut().advance(step);
        a.handle_timeout(step).unwrap();
        setup
            .net
            .as_ref()
            .unwrap()
            .borrow_mut()
            .advance(step + Duration::from_millis(1));
        loop {
            batch.clear();
            b.recv_batch(&mut batch).unwrap();
            if batch.is_empty() {
                break;
            }
            for d in &batch {
                b.free_slot(d.slot);
            }
            got += batch.len();
        }
        if step < held {
            assert_eq!(got, expected - c.reordered as usize, "held ones came early");
        }
    }
    assert_eq!(got, expected);
    assert_eq!(a.poll_timeout(), None);
}
