//! Simulated transport: an in-process, deterministic network with a virtual clock, and a
//! seeded fault injector.
//!
//! This module owns two things:
//!
//! - [`FaultInjector`]: decides, per datagram, whether it is lost, duplicated, reordered
//!   (held back by [`FaultConfig::reorder_delay`]), corrupted (one byte flipped) or
//!   delayed (uniform jitter up to [`FaultConfig::jitter`]), and counts each fault. Its
//!   API takes a datagram and the current time and returns the datagrams to deliver and
//!   when, so it can wrap the real UDP transport as well as the simulator
//!   (`QUIVER_FAULTS`, parsed by [`FaultConfig::parse`]).
//! - [`Network`]: N nodes joined by one-way links, each with a latency, an MTU, an
//!   optional rate limit (serialization delay) with a bounded bottleneck queue
//!   (tail-drop), and its own injector. [`Network::run`] drives [`SimNode`]s (sans-IO
//!   state machines plus whatever application logic a test wants) in virtual time until
//!   nothing is left to do, and fails instead of hanging when a bound on virtual time or
//!   on steps is passed.
//!
//! Guarantees: everything is a function of the configuration and the seeds: the same
//! inputs give the same run, bit for bit. Nothing reads a clock, and no input panics.
//! Datagrams with equal arrival times are delivered in the order they were sent.

use core::fmt;
use core::str::FromStr;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::Duration;

/// A small seeded pseudo-random generator (SplitMix64): fast, deterministic, and good
/// enough for fault schedules and test workloads. Not for cryptography.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform number in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform number in `0..n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// `true` with probability `p` (clamped to `[0, 1]`). Draws a number even when `p`
    /// is 0 or 1, so that a schedule does not shift when a probability changes.
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

/// Which faults to inject, and the seed of their schedule.
///
/// The text form (`QUIVER_FAULTS`) is a comma-separated list of `key=value`:
/// `loss`, `dup`, `reorder`, `corrupt` (probabilities per datagram, from 0 to 1, or a
/// percentage such as `1%`), `delay` (maximum jitter) and `reorder_delay` (how long a
/// reordered datagram is held back), both durations with a unit (`ns`, `us`, `ms`, `s`),
/// and `seed` (an integer). Keys left out are 0 (`reorder_delay`: 100 us; `seed`: 0).
/// Example: `loss=0.01,dup=0.001,reorder=0.01,corrupt=0.001,seed=7`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    /// Probability that a datagram is dropped.
    pub loss: f64,
    /// Probability that a datagram is delivered twice.
    pub dup: f64,
    /// Probability that a datagram is held back by `reorder_delay`, so later ones pass it.
    pub reorder: f64,
    /// Probability that one byte of a datagram is flipped.
    pub corrupt: f64,
    /// Maximum extra delay of a datagram, drawn uniformly (0: none).
    pub jitter: Duration,
    /// How long a reordered datagram is held back.
    pub reorder_delay: Duration,
    /// Seed of the schedule.
    pub seed: u64,
}

/// The environment variable that configures fault injection on a real transport.
pub const FAULTS_ENV: &str = "QUIVER_FAULTS";

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            jitter: Duration::ZERO,
            reorder_delay: Duration::from_micros(100),
            seed: 0,
        }
    }
}

impl FaultConfig {
    /// No faults at all.
    pub fn none() -> FaultConfig {
        FaultConfig::default()
    }

    /// Whether no fault can happen.
    pub fn is_none(&self) -> bool {
        self.loss <= 0.0
            && self.dup <= 0.0
            && self.reorder <= 0.0
            && self.corrupt <= 0.0
            && self.jitter.is_zero()
    }

    /// Parses the text form (see the type's documentation). The empty string means no
    /// faults. Errors name the offending key.
    pub fn parse(s: &str) -> Result<FaultConfig, FaultConfigError> {
        let mut cfg = FaultConfig::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(FaultConfigError::NotKeyValue {
                    item: item.to_owned(),
                });
            };
            let (key, value) = (key.trim(), value.trim());
            let bad = |reason| FaultConfigError::BadValue {
                key: key.to_owned(),
                value: value.to_owned(),
                reason,
            };
            match key {
                "loss" => cfg.loss = parse_probability(value).map_err(bad)?,
                "dup" => cfg.dup = parse_probability(value).map_err(bad)?,
                "reorder" => cfg.reorder = parse_probability(value).map_err(bad)?,
                "corrupt" => cfg.corrupt = parse_probability(value).map_err(bad)?,
                "delay" => cfg.jitter = parse_duration(value).map_err(bad)?,
                "reorder_delay" => cfg.reorder_delay = parse_duration(value).map_err(bad)?,
                "seed" => {
                    cfg.seed = value
                        .parse()
                        .map_err(|_| bad("expected an unsigned 64-bit integer"))?;
                }
                _ => {
                    return Err(FaultConfigError::UnknownKey {
                        key: key.to_owned(),
                    })
                }
            }
            if seen.contains(&key) {
                return Err(FaultConfigError::Duplicate {
                    key: key.to_owned(),
                });
            }
            seen.push(key);
        }
        Ok(cfg)
    }

    /// The configuration in `QUIVER_FAULTS`, or `None` if it is unset or empty.
    pub fn from_env() -> Result<Option<FaultConfig>, FaultConfigError> {
        match std::env::var(FAULTS_ENV) {
            Ok(v) if !v.trim().is_empty() => FaultConfig::parse(&v).map(Some),
            _ => Ok(None),
        }
    }
}

impl FromStr for FaultConfig {
    type Err = FaultConfigError;

    fn from_str(s: &str) -> Result<FaultConfig, FaultConfigError> {
        FaultConfig::parse(s)
    }
}

impl fmt::Display for FaultConfig {
    /// The text form, which [`FaultConfig::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loss={},dup={},reorder={},corrupt={},delay={}ns,reorder_delay={}ns,seed={}",
            self.loss,
            self.dup,
            self.reorder,
            self.corrupt,
            self.jitter.as_nanos(),
            self.reorder_delay.as_nanos(),
            self.seed
        )
    }
}

/// Why a fault specification was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FaultConfigError {
    /// An item has no `=`.
    #[error("fault specification item {item:?} is not KEY=VALUE")]
    NotKeyValue {
        /// The item.
        item: String,
    },
    /// A key that names no fault.
    #[error(
        "unknown fault key {key:?}: expected loss, dup, reorder, corrupt, delay, \
         reorder_delay or seed"
    )]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A value that does not parse or is out of range.
    #[error("fault {key}={value:?} is invalid: {reason}")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What is accepted.
        reason: &'static str,
    },
    /// A key given twice.
    #[error("fault key {key} is given twice")]
    Duplicate {
        /// The key.
        key: String,
    },
}

fn parse_probability(v: &str) -> Result<f64, &'static str> {
    const RANGE: &str = "expected a probability from 0 to 1, or a percentage from 0% to 100%";
    let (num, scale) = match v.strip_suffix('%') {
        Some(n) => (n.trim(), 100.0),
        None => (v, 1.0),
    };
    let p = num.parse::<f64>().map_err(|_| RANGE)? / scale;
    if p.is_finite() && (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(RANGE)
    }
}

fn parse_duration(v: &str) -> Result<Duration, &'static str> {
    const FORM: &str = "expected a duration with a unit: ns, us, ms or s (e.g. 50us)";
    if v == "0" {
        return Ok(Duration::ZERO);
    }
    let split = v.find(|c: char| !c.is_ascii_digit()).ok_or(FORM)?;
    let (num, unit) = v.split_at(split);
    let n: u64 = num.parse().map_err(|_| FORM)?;
    let nanos_per = match unit.trim() {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return Err(FORM),
    };
    n.checked_mul(nanos_per)
        .map(Duration::from_nanos)
        .ok_or("duration too large")
}

/// How many faults of each kind were injected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// Datagrams seen.
    pub datagrams: u64,
    /// Datagrams dropped.
    pub lost: u64,
    /// Datagrams delivered twice.
    pub duplicated: u64,
    /// Datagrams held back so that later ones pass them.
    pub reordered: u64,
    /// Datagrams with a byte flipped.
    pub corrupted: u64,
    /// Datagrams given a nonzero jitter.
    pub delayed: u64,
}

/// Applies a [`FaultConfig`] to a stream of datagrams; see the [module documentation].
///
/// [module documentation]: self
#[derive(Debug, Clone)]
pub struct FaultInjector {
    cfg: FaultConfig,
    rng: SimRng,
    counters: FaultCounters,
}

/// The datagrams a [`FaultInjector`] lets through for one input: none (lost), one, or two
/// (duplicated), each with the time to deliver it.
#[derive(Debug, Default)]
pub struct Injected {
    items: [Option<(Duration, Vec<u8>)>; 2],
}

impl Iterator for Injected {
    type Item = (Duration, Vec<u8>);

    fn next(&mut self) -> Option<(Duration, Vec<u8>)> {
        self.items.iter_mut().find_map(Option::take)
    }
}

impl FaultInjector {
    /// An injector following `cfg`, its schedule seeded by `cfg.seed`.
    pub fn new(cfg: FaultConfig) -> FaultInjector {
        FaultInjector {
            rng: SimRng::new(cfg.seed),
            cfg,
            counters: FaultCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FaultConfig {
        &self.cfg
    }

    /// The faults injected so far.
    pub fn counters(&self) -> &FaultCounters {
        &self.counters
    }

    /// Passes one datagram, sent at `now`, through the faults: returns what to deliver,
    /// and when (never before `now`).
    pub fn inject(&mut self, now: Duration, mut datagram: Vec<u8>) -> Injected {
        self.counters.datagrams += 1;
        let mut out = Injected::default();
        if self.rng.chance(self.cfg.loss) {
            self.counters.lost += 1;
            return out;
        }
        if self.rng.chance(self.cfg.corrupt) && !datagram.is_empty() {
            let at = self.rng.below(datagram.len() as u64) as usize;
            let flip = 1 + self.rng.below(255) as u8;
            datagram[at] ^= flip;
            self.counters.corrupted += 1;
        }
        let mut at = now + self.jitter();
        if self.rng.chance(self.cfg.reorder) {
            at += self.cfg.reorder_delay;
            self.counters.reordered += 1;
        }
        if self.rng.chance(self.cfg.dup) {
            self.counters.duplicated += 1;
            let again = now + self.jitter();
            out.items[1] = Some((again, datagram.clone()));
        }
        out.items[0] = Some((at, datagram));
        out
    }

    fn jitter(&mut self) -> Duration {
        let max = u64::try_from(self.cfg.jitter.as_nanos()).unwrap_or(u64::MAX);
        if max == 0 {
            return Duration::ZERO;
        }
        let d = self.rng.below(max.saturating_add(1));
        if d > 0 {
            self.counters.delayed += 1;
        }
        Duration::from_nanos(d)
    }
}

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

struct SimLink {
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
    links: Vec<SimLink>,
    in_flight: BinaryHeap<Reverse<InFlight>>,
    order: u64,
}

impl Network {
    /// A network of `nodes` nodes where every ordered pair is joined by a link with
    /// `cfg`. The clock starts at zero.
    pub fn new(nodes: usize, cfg: LinkConfig) -> Network {
        let links = (0..nodes * nodes)
            .map(|i| SimLink::new(cfg.clone(), i))
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
        self.links[i] = SimLink::new(cfg, i);
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
        link.stats.faults = link.injector.counters().clone();
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

impl SimLink {
    fn new(cfg: LinkConfig, index: usize) -> SimLink {
        let mut faults = cfg.faults.clone();
        faults.seed = SimRng::new(faults.seed ^ (index as u64).wrapping_mul(0xa076_1d64_78bd_642f))
            .next_u64();
        SimLink {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_issue_example() {
        let c =
            FaultConfig::parse("loss=0.01,dup=0.001,reorder=0.01,corrupt=0.001,seed=7").unwrap();
        assert_eq!(c.loss, 0.01);
        assert_eq!(c.dup, 0.001);
        assert_eq!(c.reorder, 0.01);
        assert_eq!(c.corrupt, 0.001);
        assert_eq!(c.seed, 7);
        assert_eq!(c.jitter, Duration::ZERO);
        assert!(!c.is_none());
        assert!(FaultConfig::parse("").unwrap().is_none());
        assert!(FaultConfig::parse(" , ").unwrap().is_none());
    }

    #[test]
    fn parses_durations_and_percentages_and_round_trips() {
        let c = FaultConfig::parse(
            " loss = 5% , delay=50us, reorder_delay=2ms ,seed=18446744073709551615",
        )
        .unwrap();
        assert!((c.loss - 0.05).abs() < 1e-12);
        assert_eq!(c.jitter, Duration::from_micros(50));
        assert_eq!(c.reorder_delay, Duration::from_millis(2));
        assert_eq!(c.seed, u64::MAX);
        assert_eq!(FaultConfig::parse(&c.to_string()).unwrap(), c);
    }

    #[test]
    fn errors_name_the_key() {
        let e = FaultConfig::parse("loss=0.1,drop=0.2").unwrap_err();
        assert_eq!(e, FaultConfigError::UnknownKey { key: "drop".into() });
        assert!(e.to_string().contains("\"drop\""), "{e}");
        let e = FaultConfig::parse("loss=1.5").unwrap_err();
        assert!(
            matches!(&e, FaultConfigError::BadValue { key, .. } if key == "loss"),
            "{e:?}"
        );
        assert!(e.to_string().contains("loss"), "{e}");
        let e = FaultConfig::parse("corrupt=abc").unwrap_err();
        assert!(matches!(&e, FaultConfigError::BadValue { key, .. } if key == "corrupt"));
        let e = FaultConfig::parse("delay=50").unwrap_err();
        assert!(matches!(&e, FaultConfigError::BadValue { key, .. } if key == "delay"));
        assert!(e.to_string().contains("unit"), "{e}");
        let e = FaultConfig::parse("delay=5parsecs").unwrap_err();
        assert!(matches!(&e, FaultConfigError::BadValue { key, .. } if key == "delay"));
        let e = FaultConfig::parse("seed=-1").unwrap_err();
        assert!(matches!(&e, FaultConfigError::BadValue { key, .. } if key == "seed"));
        let e = FaultConfig::parse("loss").unwrap_err();
        assert_eq!(
            e,
            FaultConfigError::NotKeyValue {
                item: "loss".into()
            }
        );
        let e = FaultConfig::parse("dup=0.1,dup=0.2").unwrap_err();
        assert_eq!(e, FaultConfigError::Duplicate { key: "dup".into() });
        let e = FaultConfig::parse("loss=NaN").unwrap_err();
        assert!(matches!(&e, FaultConfigError::BadValue { key, .. } if key == "loss"));
        let e = FaultConfig::parse("delay=99999999999999999s").unwrap_err();
        assert!(matches!(&e, FaultConfigError::BadValue { key, .. } if key == "delay"));
    }

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let mut a = SimRng::new(42);
        let mut b = SimRng::new(42);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let f = a.next_f64();
            b.next_f64();
            assert!((0.0..1.0).contains(&f));
            assert!(a.below(10) < 10);
            b.below(10);
        }
        assert_eq!(a.below(0), 0);
    }

    fn run_injector(cfg: FaultConfig, n: usize) -> (FaultCounters, Vec<(Duration, Vec<u8>)>) {
        let mut inj = FaultInjector::new(cfg);
        let mut out = Vec::new();
        for i in 0..n {
            let now = Duration::from_micros(i as u64);
            for (at, d) in inj.inject(now, vec![i as u8; 64]) {
                assert!(at >= now);
                out.push((at, d));
            }
        }
        (inj.counters().clone(), out)
    }

    #[test]
    fn injector_counts_each_fault_and_is_deterministic() {
        let cfg = FaultConfig::parse("loss=0.1,dup=0.1,reorder=0.1,corrupt=0.1,delay=5us,seed=3")
            .unwrap();
        let (c, out) = run_injector(cfg.clone(), 10_000);
        assert_eq!(run_injector(cfg, 10_000), (c.clone(), out.clone()));
        assert_eq!(c.datagrams, 10_000);
        for n in [c.lost, c.duplicated, c.reordered, c.corrupted] {
            assert!((800..1200).contains(&n), "{c:?}");
        }
        assert_eq!(out.len() as u64, 10_000 - c.lost + c.duplicated);
    }

    #[test]
    fn injector_extremes() {
        let (c, out) = run_injector(FaultConfig::parse("loss=1").unwrap(), 100);
        assert_eq!((c.lost, out.len()), (100, 0));
        let (c, out) = run_injector(FaultConfig::parse("dup=1").unwrap(), 100);
        assert_eq!((c.duplicated, out.len()), (100, 200));
        let (c, out) = run_injector(FaultConfig::parse("corrupt=1").unwrap(), 100);
        assert_eq!(c.corrupted, 100);
        for (i, (_, d)) in out.iter().enumerate() {
            let flipped = d.iter().filter(|&&b| b != i as u8).count();
            assert_eq!(flipped, 1, "exactly one byte flips");
        }
        let (c, out) = run_injector(FaultConfig::none(), 100);
        assert_eq!(
            c,
            FaultCounters {
                datagrams: 100,
                ..Default::default()
            }
        );
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, (at, _))| *at == Duration::from_micros(i as u64)));
    }

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
}
