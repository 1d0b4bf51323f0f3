//! The seeded fault injector: decides, per datagram, whether it is lost, duplicated,
//! reordered (held back by [`FaultConfig::reorder_delay`]), corrupted (one byte flipped)
//! or delayed (uniform jitter up to [`FaultConfig::jitter`]), and counts each fault.
//!
//! It decides a datagram's fate from its length and the current time, so it can wrap the
//! real UDP transport (`QUIVER_FAULTS`, parsed by [`FaultConfig::parse`]) as well as each
//! link of the simulator ([`super::sim`]). The datagrams it leaves alone go down a
//! batch's run through the wrapped link's own batch send, so that segmentation offload
//! stays on and an injector at 0 % costs what the bare link does.
//!
//! [`Faulty`] wraps any [`Link`] in an injector: the engine sees a link like the others,
//! whose [`LinkCaps`] say that it may lose, duplicate and reorder. Injection is composed,
//! not special-cased: the driver has no fault branch of its own.
//!
//! Guarantees: everything is a function of the configuration and the seed: the same
//! inputs give the same faults, bit for bit. Nothing reads a clock, and no input panics.

use super::{Datagram, Link, LinkCaps, LinkCounters};
use core::fmt;
use core::str::FromStr;
use std::cmp::Reverse;
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
/// reordered datagram is held back), both durations with a unit (`ns`, `us`, `ms`, `s`)
/// of at most [`MAX_FAULT_DELAY`], and `seed` (an unsigned 64-bit integer). Keys left out
/// are 0 (`reorder_delay`: 100 us; `seed`: 0).
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

/// Longest `delay` and `reorder_delay` of a fault specification: one day, the longest
/// peer timeout (`QUIVER_PEER_TIMEOUT`). Holding a datagram longer provokes nothing that
/// holding it that long does not.
pub const MAX_FAULT_DELAY: Duration = Duration::from_secs(24 * 3600);

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
    const FORM: &str =
        "expected a duration with a unit: ns, us, ms or s (e.g. 50us), at most 86400s";
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
        .filter(|d| *d <= MAX_FAULT_DELAY)
        .ok_or("duration too large: at most 86400s (one day)")
}

/// How many faults of each kind were injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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

    /// The faults injected so far.
    #[cfg(test)]
    pub fn counters(&self) -> &FaultCounters {
        &self.counters
    }

    /// Passes one datagram, sent at `now`, through the faults: returns what to deliver,
    /// and when (never before `now`).
    #[cfg(test)]
    pub fn inject(&mut self, now: Duration, datagram: Vec<u8>) -> Injected {
        self.decide(now, datagram.len()).deliveries(datagram)
    }

    /// What happens to one datagram of `len` bytes sent at `now`: the draws of the
    /// schedule, in a fixed order, whatever the caller does with the bytes (so that
    /// [`FaultInjector::inject`] and a link's batch see the same faults).
    fn decide(&mut self, now: Duration, len: usize) -> Fate {
        self.counters.datagrams += 1;
        if self.rng.chance(self.cfg.loss) {
            self.counters.lost += 1;
            return Fate::Lost;
        }
        let corrupt = if self.rng.chance(self.cfg.corrupt) && len > 0 {
            let at = self.rng.below(len as u64) as usize;
            let flip = 1 + self.rng.below(255) as u8;
            self.counters.corrupted += 1;
            Some((at, flip))
        } else {
            None
        };
        let mut at = now + self.jitter();
        if self.rng.chance(self.cfg.reorder) {
            at += self.cfg.reorder_delay;
            self.counters.reordered += 1;
        }
        let dup_at = if self.rng.chance(self.cfg.dup) {
            self.counters.duplicated += 1;
            Some(now + self.jitter())
        } else {
            None
        };
        Fate::Deliver {
            at,
            corrupt,
            dup_at,
        }
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

/// What the injector does to one datagram.
enum Fate {
    Lost,
    /// Delivered at `at`, with byte `corrupt.0` flipped by `corrupt.1`, and once more at
    /// `dup_at`.
    Deliver {
        at: Duration,
        corrupt: Option<(usize, u8)>,
        dup_at: Option<Duration>,
    },
}

impl Fate {
    /// What becomes of `datagram`: the datagram (corrupted if so decided) and its copy,
    /// with their times, in that order.
    fn deliveries(self, mut datagram: Vec<u8>) -> Injected {
        let mut out = Injected::default();
        let Fate::Deliver {
            at,
            corrupt,
            dup_at,
        } = self
        else {
            return out;
        };
        if let Some((i, flip)) = corrupt {
            datagram[i] ^= flip;
        }
        if let Some(again) = dup_at {
            out.items[1] = Some((again, datagram.clone()));
        }
        out.items[0] = Some((at, datagram));
        out
    }

    /// Delivered now, as it is, once: the datagram may go down with its neighbours.
    fn untouched(&self, now: Duration) -> bool {
        matches!(self, Fate::Deliver { at, corrupt: None, dup_at: None } if *at <= now)
    }
}

/// A datagram a [`Faulty`] link holds back until its time, ordered by that time and then
/// by the order of injection.
struct Held<D> {
    at: Duration,
    order: u64,
    to: D,
    bytes: Vec<u8>,
}

impl<D> PartialEq for Held<D> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl<D> Eq for Held<D> {}

impl<D> PartialOrd for Held<D> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<D> Ord for Held<D> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// A link whose outgoing datagrams pass through a [`FaultInjector`] first: lost ones are
/// not sent, duplicated ones are sent twice, corrupted ones with a byte flipped, and
/// delayed or reordered ones are held until [`Link::handle_timeout`] finds them due.
/// Receiving is the inner link's.
pub(crate) struct Faulty<L: Link> {
    inner: L,
    injector: FaultInjector,
    held: BinaryHeap<Reverse<Held<L::Dest>>>,
    order: u64,
}

impl<L: Link> Faulty<L> {
    /// Wraps `inner` in an injector following `cfg`.
    pub(crate) fn new(inner: L, cfg: FaultConfig) -> Faulty<L> {
        Faulty {
            inner,
            injector: FaultInjector::new(cfg),
            held: BinaryHeap::new(),
            order: 0,
        }
    }

    /// The wrapped link.
    pub(crate) fn inner(&self) -> &L {
        &self.inner
    }

    /// Sends a run of datagrams the faults left alone (after what was held and is due,
    /// so that only injected delays reorder).
    fn send_run(
        &mut self,
        now: Duration,
        to: &L::Dest,
        run: &[&[u8]],
        max_run: usize,
    ) -> crate::error::Result<()> {
        if run.is_empty() {
            return Ok(());
        }
        self.send_due(now)?;
        self.inner.send_batch(now, to, run, max_run)
    }

    /// Does to `datagram` what its `fate` says.
    fn apply(
        &mut self,
        now: Duration,
        to: &L::Dest,
        datagram: &[u8],
        fate: Fate,
    ) -> crate::error::Result<()> {
        if let Fate::Lost = fate {
            return Ok(());
        }
        for (at, bytes) in fate.deliveries(datagram.to_vec()) {
            self.deliver_at(now, to, at, bytes)?;
        }
        Ok(())
    }

    /// Sends `bytes` now if `at` has come (after what was held and is due, so that only
    /// injected delays reorder), else holds them until then.
    fn deliver_at(
        &mut self,
        now: Duration,
        to: &L::Dest,
        at: Duration,
        bytes: Vec<u8>,
    ) -> crate::error::Result<()> {
        if at <= now {
            self.send_due(now)?;
            self.inner.send(now, to, &bytes)
        } else {
            self.order += 1;
            self.held.push(Reverse(Held {
                at,
                order: self.order,
                to: to.clone(),
                bytes,
            }));
            Ok(())
        }
    }

    /// Sends the held datagrams whose time has come, earliest first.
    fn send_due(&mut self, now: Duration) -> crate::error::Result<()> {
        while self.held.peek().is_some_and(|Reverse(h)| h.at <= now) {
            let Some(Reverse(h)) = self.held.pop() else {
                break;
            };
            self.inner.send(now, &h.to, &h.bytes)?;
        }
        Ok(())
    }
}

impl<L: Link> Link for Faulty<L> {
    type Dest = L::Dest;

    fn caps(&self) -> LinkCaps {
        let c = &self.injector.cfg;
        let mut caps = self.inner.caps();
        caps.lossless &= c.loss == 0.0 && c.dup == 0.0 && c.corrupt == 0.0;
        caps.ordered &= c.reorder == 0.0 && c.jitter.is_zero();
        caps.holds_back |= c.reorder > 0.0 || !c.jitter.is_zero();
        caps
    }

    fn advertise(&self) -> String {
        self.inner.advertise()
    }

    fn resolve(&self, advertised: &str) -> Result<L::Dest, String> {
        self.inner.resolve(advertised)
    }

    fn max_datagram_to(&self, to: &L::Dest) -> usize {
        self.inner.max_datagram_to(to)
    }

    fn broadcast_dest(&self) -> Option<L::Dest> {
        self.inner.broadcast_dest()
    }

    fn broadcast_medium(&self) -> &'static str {
        self.inner.broadcast_medium()
    }

    fn sent_from(&self, slot: u32, to: &L::Dest) -> bool {
        self.inner.sent_from(slot, to)
    }

    #[inline]
    fn recv_batch(&mut self, out: &mut Vec<Datagram>) -> crate::error::Result<()> {
        self.inner.recv_batch(out)
    }

    #[inline]
    fn slot(&self, slot: u32) -> &[u8] {
        self.inner.slot(slot)
    }

    #[inline]
    fn free_slot(&mut self, slot: u32) {
        self.inner.free_slot(slot)
    }

    fn send(&mut self, now: Duration, to: &L::Dest, datagram: &[u8]) -> crate::error::Result<()> {
        let fate = self.injector.decide(now, datagram.len());
        self.apply(now, to, datagram, fate)
    }

    /// The datagrams that the faults leave alone go down in runs, through the inner
    /// link's own batch (segmentation offload stays on: an injector at 0 % costs no
    /// more than the link), and the others one by one, in order.
    fn send_batch(
        &mut self,
        now: Duration,
        to: &L::Dest,
        datagrams: &[&[u8]],
        max_run: usize,
    ) -> crate::error::Result<()> {
        let mut run = 0;
        for (i, d) in datagrams.iter().enumerate() {
            let fate = self.injector.decide(now, d.len());
            if fate.untouched(now) {
                continue;
            }
            self.send_run(now, to, &datagrams[run..i], max_run)?;
            run = i + 1;
            self.apply(now, to, d, fate)?;
        }
        self.send_run(now, to, &datagrams[run..], max_run)
    }

    fn send_unfaulted(
        &mut self,
        now: Duration,
        to: &L::Dest,
        datagram: &[u8],
    ) -> crate::error::Result<()> {
        self.inner.send_unfaulted(now, to, datagram)
    }

    fn blocked_slot(&self) -> Option<u32> {
        self.inner.blocked_slot()
    }

    fn next_approaching(&mut self) -> Option<u32> {
        self.inner.next_approaching()
    }

    fn poll_timeout(&self) -> Option<Duration> {
        let held = self.held.peek().map(|Reverse(h)| h.at);
        match (held, self.inner.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn handle_timeout(&mut self, now: Duration) -> crate::error::Result<()> {
        self.send_due(now)?;
        self.inner.handle_timeout(now)
    }

    fn counters(&self) -> LinkCounters {
        LinkCounters {
            faults: self.injector.counters,
            ..self.inner.counters()
        }
    }
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
        // At most a day.
        let c = FaultConfig::parse("delay=86400s,reorder_delay=86400000ms").unwrap();
        assert_eq!(
            (c.jitter, c.reorder_delay),
            (MAX_FAULT_DELAY, MAX_FAULT_DELAY)
        );
        let e = FaultConfig::parse("reorder_delay=86401s").unwrap_err();
        assert!(matches!(&e, FaultConfigError::BadValue { key, .. } if key == "reorder_delay"));
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
        (*inj.counters(), out)
    }

    #[test]
    fn injector_counts_each_fault_and_is_deterministic() {
        let cfg = FaultConfig::parse("loss=0.1,dup=0.1,reorder=0.1,corrupt=0.1,delay=5us,seed=3")
            .unwrap();
        let (c, out) = run_injector(cfg.clone(), 10_000);
        assert_eq!(run_injector(cfg, 10_000), (c, out.clone()));
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
}

/// [`Faulty`] around a link that records what reaches it.
#[cfg(test)]
mod wrapper_tests {
    use super::*;

    /// Records each call: a batch as its datagrams, a single send as a batch of one.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<Vec<Vec<u8>>>,
    }

    impl Link for Recorder {
        type Dest = ();

        fn caps(&self) -> LinkCaps {
            LinkCaps {
                max_datagram: 1500,
                min_datagram: 0,
                demuxes_dpid: false,
                polls_in_memory: true,
                ordered_slots: false,
                edge_triggered: false,
                lossless: true,
                ordered: true,
                holds_back: false,
                segments: true,
                broadcast: false,
            }
        }
        fn advertise(&self) -> String {
            String::new()
        }
        fn resolve(&self, _: &str) -> Result<(), String> {
            Ok(())
        }
        fn max_datagram_to(&self, _: &()) -> usize {
            1500
        }
        fn recv_batch(&mut self, _: &mut Vec<Datagram>) -> crate::error::Result<()> {
            Ok(())
        }
        fn slot(&self, _: u32) -> &[u8] {
            &[]
        }
        fn free_slot(&mut self, _: u32) {}
        fn send(&mut self, _: Duration, _: &(), d: &[u8]) -> crate::error::Result<()> {
            self.calls.push(vec![d.to_vec()]);
            Ok(())
        }
        fn send_batch(
            &mut self,
            _: Duration,
            _: &(),
            ds: &[&[u8]],
            _: usize,
        ) -> crate::error::Result<()> {
            self.calls.push(ds.iter().map(|d| d.to_vec()).collect());
            Ok(())
        }
    }

    fn datagrams() -> Vec<Vec<u8>> {
        (0..200u8)
            .map(|i| vec![i; 1 + usize::from(i % 7)])
            .collect()
    }

    fn batched(cfg: FaultConfig) -> Vec<Vec<Vec<u8>>> {
        let mut f = Faulty::new(Recorder::default(), cfg);
        let ds = datagrams();
        let refs: Vec<&[u8]> = ds.iter().map(Vec::as_slice).collect();
        f.send_batch(Duration::ZERO, &(), &refs, 44).unwrap();
        f.inner.calls
    }

    #[test]
    fn with_no_fault_a_batch_goes_down_whole() {
        let calls = batched(FaultConfig::none());
        assert_eq!(calls, vec![datagrams()]);
    }

    /// A batch sees the faults one-by-one sends would see (the same schedule), and what
    /// the faults leave alone still goes down in runs.
    #[test]
    fn a_batch_gets_the_faults_of_single_sends() {
        let cfg = FaultConfig::parse("loss=0.05,dup=0.03,corrupt=0.03,seed=11").unwrap();
        let calls = batched(cfg.clone());
        let mut single = Faulty::new(Recorder::default(), cfg);
        for d in datagrams() {
            single.send(Duration::ZERO, &(), &d).unwrap();
        }
        let flat = |c: &[Vec<Vec<u8>>]| c.concat();
        assert_eq!(flat(&calls), flat(&single.inner.calls));
        assert!(calls.len() < single.inner.calls.len(), "runs were batched");
        assert!(calls.iter().any(|c| c.len() > 1));
        let faults = single.counters().faults;
        assert!(faults.lost > 0 && faults.duplicated > 0 && faults.corrupted > 0);
    }
}
