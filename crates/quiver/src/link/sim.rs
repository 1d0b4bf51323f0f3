//! Simulated transport: an in-process, deterministic network with a virtual clock.
//!
//! [`Network`]: N nodes joined by one-way links, each with a latency, an MTU, an optional
//! rate limit (serialization delay) with a bounded bottleneck queue (tail-drop), and its
//! own fault injector ([`super::fault`]). [`Network::run`] drives [`SimNode`]s (sans-IO
//! state machines plus whatever application logic a test wants) in virtual time until
//! nothing is left to do, and fails instead of hanging when a bound on virtual time or on
//! steps is passed. Compiled for the crate's tests only.
//!
//! [`SimLink`] is one node's [`Link`] on a shared [`SimNet`] (the network plus a
//! receive queue per node): the engine drives it like udp or eth, while the test moves
//! virtual time with [`SimNet::advance`].
//!
//! Guarantees: everything is a function of the configuration and the seeds: the same
//! inputs give the same run, bit for bit. Nothing reads a clock, and no input panics.
//! Datagrams with equal arrival times are delivered in the order they were sent.

use super::fault::{FaultConfig, FaultCounters, FaultInjector, SimRng};
use super::{Datagram, Link, LinkCaps};
use crate::error::{Error, Result as QResult};
use std::cell::RefCell;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

/// Properties of a one-way simulated link.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Propagation delay.
    pub latency: Duration,
    /// Largest datagram the link carries; larger ones are dropped and counted.
    pub mtu: usize,
    /// Rate limit in bytes per second (serialization delay), or `None` for unlimited.
    pub rate: Option<u64>,
    /// Bytes the bottleneck queue in front of a rate-limited link holds; a datagram that
    /// does not fit is dropped (tail-drop) and counted.
    pub queue_limit: usize,
    /// Faults injected after the bottleneck. Each link mixes its index into the seed, so
    /// the links of one network have independent schedules.
    pub faults: FaultConfig,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            latency: Duration::from_micros(10),
            mtu: 1472,
            rate: None,
            queue_limit: 1 << 20,
            faults: FaultConfig::none(),
        }
    }
}

/// Counters of one simulated link.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Datagrams handed to the link.
    pub sent: u64,
    /// Calls that handed it several datagrams at once (`Link::send_batch`).
    pub batches: u64,
    /// Datagrams delivered (duplicates included).
    pub delivered: u64,
    /// Bytes delivered.
    pub bytes_delivered: u64,
    /// Datagrams dropped for exceeding the MTU.
    pub too_big: u64,
    /// Datagrams dropped because the bottleneck queue was full.
    pub queue_drops: u64,
    /// Faults injected.
    pub faults: FaultCounters,
}

/// Why [`Network::send`] did not carry a datagram (each case is also counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimSendError {
    /// No such node.
    #[error("no link from node {from} to node {to}")]
    NoSuchLink {
        /// Sending node.
        from: usize,
        /// Receiving node.
        to: usize,
    },
    /// Larger than the link's MTU.
    #[error("datagram of {len} bytes exceeds the link MTU of {mtu} bytes")]
    TooBig {
        /// Its length.
        len: usize,
        /// The MTU.
        mtu: usize,
    },
    /// The bottleneck queue is full.
    #[error("the link's bottleneck queue is full")]
    QueueFull,
}

/// A datagram arriving at a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// Sending node.
    pub from: usize,
    /// Receiving node.
    pub to: usize,
    /// The datagram.
    pub datagram: Vec<u8>,
}

/// A participant of a simulation: a sans-IO state machine with its application. Node
/// `i` of the slice given to [`Network::run`] is node `i` of the network.
pub trait SimNode {
    /// A datagram from node `from` arrived at `now`.
    fn handle_datagram(&mut self, now: Duration, from: usize, datagram: Vec<u8>);
    /// The time reached this node's [`poll_timeout`](Self::poll_timeout).
    fn handle_timeout(&mut self, now: Duration);
    /// The next datagram to send, and to which node.
    fn poll_transmit(&mut self, now: Duration) -> Option<(usize, Vec<u8>)>;
    /// When the node next has work without input, if ever.
    fn poll_timeout(&self) -> Option<Duration>;
}

/// Bounds of a simulation run: passing either one fails the run instead of hanging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Virtual time the run may reach.
    pub max_time: Duration,
    /// Steps (datagrams sent or delivered, timer rounds) the run may take.
    pub max_steps: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_time: Duration::from_secs(60),
            max_steps: 10_000_000,
        }
    }
}

/// A simulation that passed its [`Limits`]: a livelock, or a protocol that never settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// The next event lies beyond `max_time`.
    #[error("simulation still busy at virtual time {now:?}: next event beyond the time limit")]
    TimeLimit {
        /// Virtual time reached.
        now: Duration,
    },
    /// More than `max_steps` steps.
    #[error("simulation exceeded {steps} steps at virtual time {now:?}")]
    StepLimit {
        /// Steps taken.
        steps: u64,
        /// Virtual time reached.
        now: Duration,
    },
}

struct OneWay {
    cfg: LinkConfig,
    injector: FaultInjector,
    /// When the link finishes serializing what it was given.
    busy_until: Duration,
    stats: LinkStats,
}

struct InFlight {
    at: Duration,
    order: u64,
    from: usize,
    to: usize,
    datagram: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// A deterministic network of `nodes` nodes with a virtual clock; see the [module
/// documentation](self).
pub struct Network {
    now: Duration,
    nodes: usize,
    /// Link `from -> to` at index `from * nodes + to`.
    links: Vec<OneWay>,
    in_flight: BinaryHeap<Reverse<InFlight>>,
    order: u64,
}

impl Network {
    /// A network of `nodes` nodes where every ordered pair is joined by a link with
    /// `cfg`. The clock starts at zero.
    pub fn new(nodes: usize, cfg: LinkConfig) -> Network {
        let links = (0..nodes * nodes)
            .map(|i| OneWay::new(cfg.clone(), i))
            .collect();
        Network {
            now: Duration::ZERO,
            nodes,
            links,
            in_flight: BinaryHeap::new(),
            order: 0,
        }
    }

    /// Replaces the link `from -> to` (its counters restart). Returns `false` if either
    /// node does not exist.
    pub fn set_link(&mut self, from: usize, to: usize, cfg: LinkConfig) -> bool {
        let Some(i) = self.index(from, to) else {
            return false;
        };
        self.links[i] = OneWay::new(cfg, i);
        true
    }

    /// The virtual time.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The counters of link `from -> to`.
    pub fn stats(&self, from: usize, to: usize) -> Option<&LinkStats> {
        let i = self.index(from, to)?;
        Some(&self.links[i].stats)
    }

    /// Counts a batch of datagrams handed to the link `from -> to` in one call.
    pub fn count_batch(&mut self, from: usize, to: usize) {
        if let Some(i) = self.index(from, to) {
            self.links[i].stats.batches += 1;
        }
    }

    /// Hands a datagram to the link `from -> to` at the current time: it waits for the
    /// link (rate limit), passes the fault injector and arrives after the latency.
    pub fn send(&mut self, from: usize, to: usize, datagram: Vec<u8>) -> Result<(), SimSendError> {
        let Some(i) = self.index(from, to) else {
            return Err(SimSendError::NoSuchLink { from, to });
        };
        let now = self.now;
        let link = &mut self.links[i];
        link.stats.sent += 1;
        let len = datagram.len();
        if len > link.cfg.mtu {
            link.stats.too_big += 1;
            return Err(SimSendError::TooBig {
                len,
                mtu: link.cfg.mtu,
            });
        }
        let start = link.busy_until.max(now);
        let departure = match link.cfg.rate {
            Some(rate) if rate > 0 => {
                let backlog = bytes_in(start - now, rate);
                if backlog.saturating_add(len as u64) > link.cfg.queue_limit as u64 {
                    link.stats.queue_drops += 1;
                    return Err(SimSendError::QueueFull);
                }
                start + serialization(len, rate)
            }
            _ => start,
        };
        link.busy_until = departure;
        let latency = link.cfg.latency;
        let injected = link.injector.inject(departure, datagram);
        link.stats.faults = *link.injector.counters();
        for (at, datagram) in injected {
            self.order += 1;
            self.in_flight.push(Reverse(InFlight {
                at: at + latency,
                order: self.order,
                from,
                to,
                datagram,
            }));
        }
        Ok(())
    }

    /// When the next datagram arrives, if any is in flight.
    pub fn next_arrival(&self) -> Option<Duration> {
        self.in_flight.peek().map(|Reverse(f)| f.at)
    }

    /// Moves the clock to `to` (never backwards).
    pub fn advance(&mut self, to: Duration) {
        self.now = self.now.max(to);
    }

    /// The next datagram that has arrived by now.
    pub fn poll_arrival(&mut self) -> Option<Arrival> {
        if self.next_arrival()? > self.now {
            return None;
        }
        let Reverse(f) = self.in_flight.pop()?;
        if let Some(i) = self.index(f.from, f.to) {
            let stats = &mut self.links[i].stats;
            stats.delivered += 1;
            stats.bytes_delivered += f.datagram.len() as u64;
        }
        Some(Arrival {
            from: f.from,
            to: f.to,
            datagram: f.datagram,
        })
    }

    /// Runs `nodes` until nothing is left to do: no datagram in flight, none to send and
    /// no timer. Returns the virtual time then, or an error if `limits` are passed first.
    ///
    /// Each round: every node's `poll_transmit` is drained into the links; every datagram
    /// due is delivered; if none was, the clock jumps to the earliest arrival or node
    /// deadline and the nodes whose deadline has come get `handle_timeout`.
    pub fn run<N: SimNode>(
        &mut self,
        nodes: &mut [N],
        limits: Limits,
    ) -> Result<Duration, SimError> {
        let mut steps = 0u64;
        let mut step = |now| {
            steps += 1;
            if steps > limits.max_steps {
                Err(SimError::StepLimit { steps, now })
            } else {
                Ok(())
            }
        };
        loop {
            step(self.now)?;
            let now = self.now;
            for (i, node) in nodes.iter_mut().enumerate() {
                while let Some((to, datagram)) = node.poll_transmit(now) {
                    // Drops are counted in the link's statistics.
                    let _ = self.send(i, to, datagram);
                    step(now)?;
                }
            }
            let mut delivered = false;
            while let Some(a) = self.poll_arrival() {
                if let Some(node) = nodes.get_mut(a.to) {
                    node.handle_datagram(now, a.from, a.datagram);
                }
                delivered = true;
                step(now)?;
            }
            if delivered {
                continue;
            }
            let next = nodes
                .iter()
                .filter_map(SimNode::poll_timeout)
                .chain(self.next_arrival())
                .min();
            let Some(next) = next else {
                return Ok(now);
            };
            let next = next.max(now);
            if next > limits.max_time {
                return Err(SimError::TimeLimit { now });
            }
            self.advance(next);
            for node in nodes.iter_mut() {
                if node.poll_timeout().is_some_and(|t| t <= next) {
                    node.handle_timeout(next);
                }
            }
        }
    }

    fn index(&self, from: usize, to: usize) -> Option<usize> {
        (from < self.nodes && to < self.nodes).then(|| from * self.nodes + to)
    }
}

impl OneWay {
    fn new(cfg: LinkConfig, index: usize) -> OneWay {
        let mut faults = cfg.faults.clone();
        faults.seed = SimRng::new(faults.seed ^ (index as u64).wrapping_mul(0xa076_1d64_78bd_642f))
            .next_u64();
        OneWay {
            injector: FaultInjector::new(faults),
            cfg,
            busy_until: Duration::ZERO,
            stats: LinkStats::default(),
        }
    }
}

/// Time to put `len` bytes on a link of `rate` bytes per second.
fn serialization(len: usize, rate: u64) -> Duration {
    let nanos = (len as u128 * 1_000_000_000).div_ceil(u128::from(rate));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Bytes a link of `rate` bytes per second sends in `d`.
fn bytes_in(d: Duration, rate: u64) -> u64 {
    u64::try_from(d.as_nanos() * u128::from(rate) / 1_000_000_000).unwrap_or(u64::MAX)
}

/// A [`Network`] whose arrivals wait in one queue per node, for the nodes' [`SimLink`]s.
pub struct SimNet {
    net: Network,
    inboxes: Vec<VecDeque<Vec<u8>>>,
    uniform: LinkConfig,
    /// Whether the links broadcast ([`SimNet::enable_broadcast`]).
    broadcast: bool,
}

impl SimNet {
    /// A network of `nodes` nodes, every link configured as `cfg`.
    pub fn new(nodes: usize, cfg: LinkConfig) -> Rc<RefCell<SimNet>> {
        Rc::new(RefCell::new(SimNet {
            net: Network::new(nodes, cfg.clone()),
            inboxes: vec![VecDeque::new(); nodes],
            uniform: cfg,
            broadcast: false,
        }))
    }

    /// The counters of link `from -> to`.
    pub fn stats(&self, from: usize, to: usize) -> Option<&LinkStats> {
        self.net.stats(from, to)
    }

    /// Gives the links a broadcast address ([`BROADCAST`]): a datagram sent there goes
    /// to every other node, over each one's link with its own faults (a loss is one
    /// receiver's, as behind a switch).
    pub fn enable_broadcast(&mut self) {
        self.broadcast = true;
    }

    /// Node `node`'s link, with `slots` receive slots of the links' MTU.
    pub fn link(net: &Rc<RefCell<SimNet>>, node: usize, slots: usize) -> SimLink {
        let mtu = net.borrow().uniform.mtu;
        SimLink {
            net: net.clone(),
            node,
            slots: vec![vec![0; mtu]; slots],
            free: (0..slots as u32).rev().collect(),
        }
    }

    /// The virtual time.
    pub fn now(&self) -> Duration {
        self.net.now()
    }

    /// When the next datagram arrives, if any is in flight.
    pub fn next_arrival(&self) -> Option<Duration> {
        self.net.next_arrival()
    }

    /// Moves virtual time to `to` and queues what has arrived by then at its node.
    pub fn advance(&mut self, to: Duration) {
        self.net.advance(to);
        while let Some(a) = self.net.poll_arrival() {
            self.inboxes[a.to].push_back(a.datagram);
        }
    }
}

/// The destination of a simulated broadcast ([`SimNet::enable_broadcast`]).
pub const BROADCAST: usize = usize::MAX;

/// One node of a [`SimNet`] as a [`Link`]: destinations are node indices, advertised as
/// `sim,NODE`; received datagrams are copied into a fixed set of slots, and wait in the
/// node's queue while every slot is held.
pub struct SimLink {
    net: Rc<RefCell<SimNet>>,
    node: usize,
    slots: Vec<Vec<u8>>,
    free: Vec<u32>,
}

impl Link for SimLink {
    type Dest = usize;

    fn caps(&self) -> LinkCaps {
        let cfg = &self.net.borrow().uniform;
        LinkCaps {
            max_datagram: cfg.mtu,
            min_datagram: 0,
            demuxes_dpid: false,
            polls_in_memory: true,
            ordered_slots: false,
            edge_triggered: false,
            lossless: cfg.faults.loss == 0.0
                && cfg.faults.dup == 0.0
                && cfg.faults.corrupt == 0.0
                && cfg.rate.is_none(),
            ordered: cfg.faults.reorder == 0.0 && cfg.faults.jitter.is_zero(),
            // The network delays inside itself; the link sends at once.
            holds_back: false,
            segments: false,
            broadcast: self.net.borrow().broadcast,
        }
    }

    fn advertise(&self) -> String {
        format!("sim,{}", self.node)
    }

    fn broadcast_dest(&self) -> Option<usize> {
        self.net.borrow().broadcast.then_some(BROADCAST)
    }

    fn resolve(&self, advertised: &str) -> Result<usize, String> {
        let nodes = self.net.borrow().net.nodes();
        match advertised.split_once(',') {
            Some(("sim", n)) => n
                .parse::<usize>()
                .ok()
                .filter(|&n| n < nodes)
                .ok_or_else(|| format!("no simulated node {n:?}")),
            _ => Err(format!("bad simulated address {advertised:?}")),
        }
    }

    fn max_datagram_to(&self, _to: &usize) -> usize {
        self.net.borrow().uniform.mtu
    }

    fn recv_batch(&mut self, out: &mut Vec<Datagram>) -> QResult<()> {
        let mut net = self.net.borrow_mut();
        let inbox = &mut net.inboxes[self.node];
        while !inbox.is_empty() {
            let Some(slot) = self.free.pop() else { break };
            let Some(d) = inbox.pop_front() else { break };
            let buf = &mut self.slots[slot as usize];
            // The network drops what exceeds the MTU, and slots are MTU-sized.
            let len = d.len().min(buf.len());
            buf[..len].copy_from_slice(&d[..len]);
            out.push(Datagram { slot, len });
        }
        Ok(())
    }

    fn slot(&self, slot: u32) -> &[u8] {
        &self.slots[slot as usize]
    }

    fn free_slot(&mut self, slot: u32) {
        debug_assert!(!self.free.contains(&slot));
        self.free.push(slot);
    }

    fn send(&mut self, _now: Duration, to: &usize, datagram: &[u8]) -> QResult<()> {
        if *to == BROADCAST {
            let nodes = self.net.borrow().net.nodes();
            let me = self.node;
            for n in (0..nodes).filter(|&n| n != me) {
                self.send_to_node(n, datagram)?;
            }
            return Ok(());
        }
        self.send_to_node(*to, datagram)
    }

    /// Counted as one batch (for tests of who batches), then sent one by one.
    fn send_batch(
        &mut self,
        now: Duration,
        to: &usize,
        datagrams: &[&[u8]],
        _max_run: usize,
    ) -> QResult<()> {
        if *to != BROADCAST {
            self.net.borrow_mut().net.count_batch(self.node, *to);
        }
        for d in datagrams {
            self.send(now, to, d)?;
        }
        Ok(())
    }
}

impl SimLink {
    /// Sends one datagram to node `to` (every link's send; full queues drop silently, as
    /// a switch does).
    fn send_to_node(&mut self, to: usize, datagram: &[u8]) -> QResult<()> {
        match self
            .net
            .borrow_mut()
            .net
            .send(self.node, to, datagram.to_vec())
        {
            Ok(()) | Err(SimSendError::QueueFull) => Ok(()),
            Err(SimSendError::TooBig { len, mtu }) => Err(Error::io(
                format!("sending a {len}-byte datagram over a simulated link of MTU {mtu}"),
                std::io::Error::from_raw_os_error(libc::EMSGSIZE),
            )),
            Err(e) => Err(Error::Config(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo {
        peer: usize,
        outbox: Vec<Vec<u8>>,
        got: Vec<(Duration, Vec<u8>)>,
        wake: Option<Duration>,
    }

    impl SimNode for Echo {
        fn handle_datagram(&mut self, now: Duration, _from: usize, d: Vec<u8>) {
            self.got.push((now, d));
        }
        fn handle_timeout(&mut self, _now: Duration) {
            self.wake = None;
            self.outbox.push(vec![1; 1000]);
            self.outbox.push(vec![2; 1000]);
        }
        fn poll_transmit(&mut self, _now: Duration) -> Option<(usize, Vec<u8>)> {
            if self.outbox.is_empty() {
                return None;
            }
            Some((self.peer, self.outbox.remove(0)))
        }
        fn poll_timeout(&self) -> Option<Duration> {
            self.wake
        }
    }

    fn echo(peer: usize, wake: Option<Duration>) -> Echo {
        Echo {
            peer,
            outbox: Vec::new(),
            got: Vec::new(),
            wake,
        }
    }

    #[test]
    fn latency_rate_and_queue() {
        let cfg = LinkConfig {
            latency: Duration::from_micros(10),
            rate: Some(1_000_000_000), // 1 GB/s: 1 ns per byte
            queue_limit: 2000,
            ..LinkConfig::default()
        };
        let mut net = Network::new(2, cfg);
        let mut nodes = [echo(1, Some(Duration::from_micros(5))), echo(0, None)];
        let end = net.run(&mut nodes, Limits::default()).unwrap();
        let got = &nodes[1].got;
        assert_eq!(got.len(), 2);
        // 5 us start, 1 us serialization each, 10 us latency.
        assert_eq!(got[0].0, Duration::from_micros(16));
        assert_eq!(got[1].0, Duration::from_micros(17));
        assert_eq!(end, Duration::from_micros(17));
        // A third datagram at once would not fit behind the queued ones.
        let mut net = Network::new(
            2,
            LinkConfig {
                queue_limit: 1500,
                rate: Some(1_000_000),
                ..LinkConfig::default()
            },
        );
        assert!(net.send(0, 1, vec![0; 1000]).is_ok());
        assert_eq!(net.send(0, 1, vec![0; 1000]), Err(SimSendError::QueueFull));
        assert_eq!(
            net.send(0, 1, vec![0; 2000]),
            Err(SimSendError::TooBig {
                len: 2000,
                mtu: 1472
            })
        );
        assert_eq!(
            net.send(0, 5, vec![]),
            Err(SimSendError::NoSuchLink { from: 0, to: 5 })
        );
        let s = net.stats(0, 1).unwrap();
        assert_eq!((s.sent, s.queue_drops, s.too_big), (3, 1, 1));
    }

    struct Spinner;

    impl SimNode for Spinner {
        fn handle_datagram(&mut self, _: Duration, _: usize, _: Vec<u8>) {}
        fn handle_timeout(&mut self, _: Duration) {}
        fn poll_transmit(&mut self, _: Duration) -> Option<(usize, Vec<u8>)> {
            None
        }
        fn poll_timeout(&self) -> Option<Duration> {
            Some(Duration::from_micros(1))
        }
    }

    #[test]
    fn livelocks_fail_instead_of_hanging() {
        let mut net = Network::new(1, LinkConfig::default());
        let limits = Limits {
            max_time: Duration::from_secs(1),
            max_steps: 1000,
        };
        assert!(matches!(
            net.run(&mut [Spinner], limits),
            Err(SimError::StepLimit { .. })
        ));

        struct Ticker(Duration);
        impl SimNode for Ticker {
            fn handle_datagram(&mut self, _: Duration, _: usize, _: Vec<u8>) {}
            fn handle_timeout(&mut self, now: Duration) {
                self.0 = now + Duration::from_millis(1);
            }
            fn poll_transmit(&mut self, _: Duration) -> Option<(usize, Vec<u8>)> {
                None
            }
            fn poll_timeout(&self) -> Option<Duration> {
                Some(self.0)
            }
        }
        let mut net = Network::new(1, LinkConfig::default());
        let r = net.run(
            &mut [Ticker(Duration::ZERO)],
            Limits {
                max_time: Duration::from_secs(1),
                max_steps: u64::MAX,
            },
        );
        assert!(matches!(r, Err(SimError::TimeLimit { .. })), "{r:?}");
    }

    #[test]
    fn links_have_independent_schedules() {
        let faults = FaultConfig::parse("loss=0.5,seed=1").unwrap();
        let mut net = Network::new(
            2,
            LinkConfig {
                faults,
                ..LinkConfig::default()
            },
        );
        for i in 0..64u8 {
            net.send(0, 1, vec![i]).unwrap();
            net.send(1, 0, vec![i]).unwrap();
        }
        net.advance(Duration::from_secs(1));
        let mut through = [Vec::new(), Vec::new()];
        while let Some(a) = net.poll_arrival() {
            through[a.to].push(a.datagram[0]);
        }
        assert!(!through[0].is_empty() && !through[1].is_empty());
        assert_ne!(through[0], through[1]);
    }

    #[test]
    fn one_direction_can_be_reconfigured() {
        let mut net = Network::new(3, LinkConfig::default());
        assert_eq!(net.nodes(), 3);
        assert!(!net.set_link(0, 3, LinkConfig::default()));
        let slow = LinkConfig {
            latency: Duration::from_millis(5),
            ..LinkConfig::default()
        };
        assert!(net.set_link(0, 1, slow));
        net.send(0, 1, vec![1]).unwrap();
        net.send(1, 0, vec![2]).unwrap();
        let first = net.next_arrival().unwrap();
        net.advance(first);
        assert_eq!(net.now(), first);
        let a = net.poll_arrival().unwrap();
        assert_eq!(
            (a.to, a.datagram[0]),
            (0, 2),
            "the unchanged direction is faster"
        );
        let second = net.next_arrival().unwrap();
        assert!(second >= Duration::from_millis(5));
        net.advance(second);
        assert_eq!(net.poll_arrival().unwrap().to, 1);
    }
}
