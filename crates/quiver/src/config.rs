//! Configuration of a job's endpoints: every knob has a default, a `QUIVER_*` variable
//! and a builder method.
//!
//! Every variable has a documented range (the constants below, and README.md's table).
//! A value that does not parse or lies outside its range is an [`Error::InvalidEnv`] that
//! names the variable and says what it accepts, never a panic: the ranges are chosen so
//! that nothing computed from them later can overflow or allocate without bound.

use crate::channel::reliable::Mode;
pub use crate::channel::reliable::{Mode as ReliabilityMode, ModeParseError, Recovery};
use crate::error::{Error, Result};
pub use crate::link::fault::{FaultConfig, FaultConfigError, MAX_FAULT_DELAY};
use std::ops::RangeInclusive;
use std::time::Duration;

/// Which transport carries traffic between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportChoice {
    /// Shared memory between ranks of one node, UDP otherwise (the default).
    Auto,
    /// UDP between every pair of ranks, even on one node (for testing).
    Udp,
    /// Raw Ethernet between nodes (needs `CAP_NET_RAW`; UDP where it is missing), shared
    /// memory inside a node.
    Eth,
}

/// How a blocking call waits for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Poll without ever sleeping: lowest latency, one core busy.
    Spin,
    /// Sleep on the endpoint's descriptor at once: no CPU while idle.
    Block,
    /// Poll for the given time, then sleep on the descriptor (GAMMA's `gamma_wait`).
    Hybrid(Duration),
}

/// Default polling time of [`WaitMode::Hybrid`].
pub const DEFAULT_HYBRID_SPIN: Duration = Duration::from_micros(100);

/// Default window of a network channel, in frames, over a link that sends frame by
/// frame (raw Ethernet, UDP without segmentation offload): 94 KB in flight with
/// MTU 1500, more than such a link's sending core moves during an acknowledgement's
/// round trip.
pub const DEFAULT_WINDOW: u16 = 64;
/// Default window over UDP with segmentation offload (`QUIVER_UDP_GSO`, on by default).
/// The sender hands the kernel runs of up to 44 datagrams in one call, so a window of
/// 64 frames holds one and a half runs and the sender stops after each to wait for the
/// acknowledgement; 128 frames keep about three runs in flight (+30 % at 1 MiB on an
/// unshaped link). More buys little there and deepens the queue on slow links, where a
/// channel's first frames can time out before the queue ahead of them drains
/// (PERFORMANCE, "The channel window of udp").
pub const DEFAULT_WINDOW_SEGMENTED: u16 = 128;

/// Default BTP(1) of tagged messages: bytes pushed with the message header
/// (`QUIVER_BTP1`). Chosen by `quiver bench tune-btp` on this machine (shm and udp agreed;
/// `docs/PERFORMANCE.md`).
pub const DEFAULT_BTP1: usize = 4096;
/// Default BTP(2) of tagged messages: bytes pushed while the acknowledgement travels
/// (`QUIVER_BTP2`). Chosen by `quiver bench tune-btp`, like BTP(1).
pub const DEFAULT_BTP2: usize = 12 * 1024;
/// Default of [`Config::push_credit`]: 8 MiB of pushed, unmatched bytes per sender (with
/// the default BTPs, 512 messages waiting for their receives before a sender falls back
/// to pulls; Push-All messages up to a quarter of it are pushed whole).
pub const DEFAULT_PUSH_CREDIT: usize = 8 << 20;

/// Longest polling time of [`WaitMode::Hybrid`] (`QUIVER_WAIT=hybrid:1000000`): one
/// second. Polling longer than that before sleeping is what [`WaitMode::Spin`] is for.
pub const HYBRID_SPIN_MAX: Duration = Duration::from_secs(1);

impl WaitMode {
    /// Parses `spin`, `block`, `hybrid` or `hybrid:MICROSECONDS` (0 to 1000000, see
    /// [`HYBRID_SPIN_MAX`]); `None` for anything else.
    pub fn parse(s: &str) -> Option<WaitMode> {
        match s {
            "spin" => Some(WaitMode::Spin),
            "block" => Some(WaitMode::Block),
            "hybrid" => Some(WaitMode::Hybrid(DEFAULT_HYBRID_SPIN)),
            _ => {
                let us = s.strip_prefix("hybrid:")?.parse::<u64>().ok()?;
                Some(Duration::from_micros(us))
                    .filter(|d| *d <= HYBRID_SPIN_MAX)
                    .map(WaitMode::Hybrid)
            }
        }
    }
}

/// Settings of a job's endpoints.
#[derive(Debug, Clone)]
pub struct Config {
    /// Transport selection (`QUIVER_TRANSPORT=auto|udp|eth`).
    pub transport: TransportChoice,
    /// Waiting strategy of blocking calls (`QUIVER_WAIT=spin|block|hybrid[:US]`).
    pub wait: WaitMode,
    /// Largest message an endpoint sends or accepts, in bytes (`QUIVER_MAX_MESSAGE`).
    pub max_message: usize,
    /// Bytes of token buffer pool per sender on shared memory, and per endpoint on UDP
    /// (`QUIVER_POOL_SIZE`). Must hold at least one maximum-size message.
    pub pool_size: usize,
    /// Sender slots in an endpoint's shared-memory receive area (`QUIVER_SHM_SLOTS`).
    pub shm_slots: u32,
    /// Frames of the raw Ethernet link's receive ring (`QUIVER_ETH_RING`). `None` (the
    /// default): sized by [`Config::eth_ring_frames`], one channel window for every rank
    /// on another node.
    pub eth_ring: Option<usize>,
    /// Largest datagram quiver sends over the network, header included
    /// (`QUIVER_DATAGRAM`, formerly `QUIVER_UDP_DATAGRAM`); longer messages are split into
    /// Directed Messages of this size. `None` (the default): as large as the MTU of the
    /// interface allows.
    pub datagram: Option<usize>,
    /// The emulated cluster this rank runs on (`QUIVER_CLUSTER`, set by
    /// `quiver run --cluster`): with `auto` transport, nodes talk raw Ethernet.
    pub cluster: Option<String>,
    /// How long `target` and `write` wait for a peer endpoint to appear
    /// (`QUIVER_CONNECT_TIMEOUT`, seconds).
    pub connect_timeout: Duration,
    /// Reliability scheme of network channels (`QUIVER_RELIABILITY=none|host|offload`):
    /// `host` retransmits lost frames from inside quiver calls (LCI's RX_h); `offload` runs
    /// the same protocol on a progress thread of its own (RX_ni); `none` only
    /// flow-controls and reports loss (RX_no). Shared memory needs none of them: its rings
    /// are reliable and flow-controlled.
    pub reliability: Mode,
    /// How `host` repairs a loss (`QUIVER_RECOVERY=selective|gobackn`).
    pub recovery: Recovery,
    /// Frames a sender may have outstanding per channel: the receive buffers reserved for
    /// each sender (`QUIVER_WINDOW`). `None`: the network link's own default,
    /// [`DEFAULT_WINDOW`] frames, or [`DEFAULT_WINDOW_SEGMENTED`] over UDP with
    /// segmentation offload.
    pub window: Option<u16>,
    /// Faults injected into the datagrams this process sends (`QUIVER_FAULTS`, e.g.
    /// `loss=0.01,dup=0.001,reorder=0.01,corrupt=0.001,seed=7`), for testing.
    pub faults: Option<FaultConfig>,
    /// How long a network peer may leave our frames unacknowledged before it is declared
    /// failed (`QUIVER_PEER_TIMEOUT`, seconds). In `host` and `none` reliability a peer
    /// answers only from inside quiver calls, so this must exceed its longest stretch of
    /// computation without them (`offload` answers from its own thread). Peers on the
    /// same node are watched through their process instead, which needs no timeout.
    pub peer_timeout: Duration,
    /// CPU the offload engine's thread is pinned to (`QUIVER_OFFLOAD_CPU`); unpinned if
    /// unset.
    pub offload_cpu: Option<usize>,
    /// How much of a tagged message is pushed before the rest is pulled
    /// (`QUIVER_PUSH=zero|all|pull`).
    pub push: PushMode,
    /// Bytes of the first push of a tagged message in Push-Pull mode (`QUIVER_BTP1`).
    pub btp1: usize,
    /// Bytes of the second push, sent while the acknowledgement travels (`QUIVER_BTP2`).
    pub btp2: usize,
    /// Pushed bytes of tagged messages that a receiver keeps for each sender before any
    /// receive has taken them (`QUIVER_PUSH_CREDIT`, default [`DEFAULT_PUSH_CREDIT`]):
    /// the pushed buffer holds at most this much per sender. A sender whose credit is
    /// spent pushes nothing (the receiver pulls the whole message once a receive
    /// matches it) until the receiver gives credit back. Must be the same on every rank:
    /// a receiver counts pushes beyond it as the sender's protocol error.
    pub push_credit: usize,
    /// Tagged messages longer than BTP(1) and at most this long are pushed whole, in a
    /// pipeline of chunks, instead of pushed in part and pulled (`QUIVER_PIPELINE_MAX`,
    /// bytes; `auto` or unset: chosen per transport by the cost function of
    /// `tagged::select`, which `quiver info` prints; 0: never). Applies in push mode
    /// `pull`.
    pub pipeline_max: Option<usize>,
    /// Whether tagged messages inside a node are pulled with one copy across address
    /// spaces (cross-memory attach, `QUIVER_CMA=on|off`); off, or where the kernel
    /// refuses it, they take the two-copy path through shared memory.
    pub cma: bool,
    /// Whether a sender waiting inside quiver helps a same-node receiver pull a large
    /// tagged message: the two split the copy while it runs, the receiver reading from
    /// the front and the sender writing from the back (`QUIVER_SPLIT_COPY=on|off`,
    /// default on; needs cross-memory attach). See `link::shm::split`.
    pub split_copy: bool,
    /// Whether the UDP transport hands the kernel a run of equal-size datagrams in one
    /// `sendmsg` with generic segmentation offload (`UDP_SEGMENT`; `QUIVER_UDP_GSO=on|off`,
    /// default on): one trip through the network stack for up to 64 KiB instead of one per
    /// datagram. Where the kernel refuses it, the transport says so once and sends
    /// datagram by datagram.
    pub udp_gso: bool,
    /// Whether a raw Ethernet endpoint opens a UDP socket beside its packet socket and
    /// sends long batches of frames through it as offloaded runs
    /// (`QUIVER_ETH_UDP_RUNS=on|off`, default on; needs `udp_gso`): raw frames keep
    /// the lowest latency, UDP runs carry bulk several times faster than MTU-sized raw
    /// frames (`link::pair`, docs/DESIGN-NOTES.md "Raw Ethernet with UDP runs beside
    /// it").
    pub eth_udp_runs: bool,
    /// Whether a broadcast through the ports (`Bind::to_all`) goes through the link's
    /// own broadcast where it has one (one multicast frame per fragment on raw Ethernet,
    /// IP multicast on UDP: the engine's group channel) or always down a binomial tree of unicasts
    /// (`QUIVER_NATIVE_BROADCAST=on|off`, default on).
    pub native_broadcast: bool,
    /// Whether a ports message of at least `ports::DEPOSIT_MIN` bytes to a rank of this
    /// node goes straight into the receiver's shared port buffer (`Ports::buffer`) when
    /// its port is armed, rather than through the receive ring with a copy on each side
    /// (`QUIVER_PORTS_DEPOSIT=on|off`, default on; off on either side keeps the copy).
    pub ports_deposit: bool,
    /// Whether the UDP transport asks the kernel to coalesce received runs of datagrams
    /// (`UDP_GRO`; `QUIVER_UDP_GRO=on|off`, default on): one receive per run of up to
    /// 64 KiB, copied from a staging buffer into the pool's slots. It is switched on
    /// while traffic streams and off while it is sparse (it would cost a ping-pong about
    /// half a microsecond per message).
    pub udp_gro: bool,
    /// Whether network frames carry a keyed MAC of the job's (`QUIVER_AUTH=on|off`,
    /// default off): for networks shared with hosts that are not trusted. Costs a BLAKE3
    /// hash per datagram on each side and 16 bytes of each (`docs/PERFORMANCE.md`,
    /// "Authenticated frames"). The same on every rank.
    pub auth: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            transport: TransportChoice::Auto,
            wait: WaitMode::Hybrid(DEFAULT_HYBRID_SPIN),
            max_message: 1 << 20,
            pool_size: 4 << 20,
            shm_slots: 64,
            eth_ring: None,
            datagram: None,
            cluster: None,
            connect_timeout: Duration::from_secs(30),
            reliability: Mode::Host,
            recovery: Recovery::Selective,
            window: None,
            faults: None,
            peer_timeout: Duration::from_secs(10),
            offload_cpu: None,
            push: PushMode::Pull,
            btp1: DEFAULT_BTP1,
            btp2: DEFAULT_BTP2,
            push_credit: DEFAULT_PUSH_CREDIT,
            pipeline_max: None,
            cma: true,
            split_copy: true,
            udp_gso: true,
            eth_udp_runs: true,
            native_broadcast: true,
            ports_deposit: true,
            udp_gro: true,
            auth: false,
        }
    }
}

pub use crate::link::eth::{ETH_RING_MAX_BYTES, ETH_RING_MIN_WINDOWS};
/// Accepted values of `QUIVER_ETH_RING`, in frames.
pub const ETH_RING_FRAMES: RangeInclusive<usize> = 8..=1 << 20;

/// Accepted values of `QUIVER_MAX_MESSAGE`, in bytes: 1 KiB to 4 GiB - 65 bytes. A
/// message's length travels in 32 bits with room for headers; a tagged message is
/// pulled in pieces of this size less a 48-byte header, which a smaller maximum would
/// leave almost no room beside.
pub const MAX_MESSAGE_RANGE: RangeInclusive<usize> = 1 << 10..=u32::MAX as usize - 64;
/// Largest `QUIVER_POOL_SIZE`, in bytes: 16 GiB, room for two of the largest messages
/// (what `quiver bench` and `quiver check` ask for). The pool is allocated up front per
/// endpoint (UDP), and its next power of two once per sender slot (shared memory).
pub const POOL_SIZE_MAX: usize = 16 << 30;
/// Accepted values of `QUIVER_SHM_SLOTS`: the slot table and the rings are laid out in
/// one shared-memory segment of `slots` rings.
pub const SHM_SLOTS_RANGE: RangeInclusive<u32> = 1..=4096;
/// Accepted values of `QUIVER_DATAGRAM` (and `QUIVER_UDP_DATAGRAM`), in bytes: a quiver
/// header plus 8 bytes of payload, to the largest UDP payload of IPv4 (65507).
pub const DATAGRAM_RANGE: RangeInclusive<usize> = crate::wire::HEADER_LEN + 8..=65507;
/// Accepted values of `QUIVER_WINDOW`, in frames: at least 2, so that a frame can be in
/// flight while the previous one is acknowledged; at most the channel's limit.
pub const WINDOW_RANGE: RangeInclusive<u16> = 2..=crate::channel::reliable::MAX_WINDOW;
/// Accepted values of `QUIVER_CONNECT_TIMEOUT` and `QUIVER_PEER_TIMEOUT`: 1 ms (a
/// shorter wait cannot be told apart from none, and heartbeats go out at a tenth of the
/// peer timeout) to one day (longer is indistinguishable from a hang; a network channel
/// keeps retransmitting to a silent peer for the whole peer timeout).
pub const TIMEOUT_RANGE: RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(24 * 3600);
/// CPUs an affinity mask can name: `QUIVER_OFFLOAD_CPU` is below this (1024).
pub const CPU_SET_SIZE: usize = libc::CPU_SETSIZE as usize;
/// Largest `QUIVER_BTP1`, `QUIVER_BTP2` and `QUIVER_PUSH_CREDIT`, in bytes: 4 GiB.
/// Pushing more than a message holds is the same as pushing all of it
/// (`QUIVER_PUSH=all`).
pub const BTP_MAX: usize = 1 << 32;

/// How much of a tagged message the sender pushes before the receiver pulls the rest
/// (`QUIVER_PUSH`; [`crate::tagged`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushMode {
    /// Push nothing; the receiver pulls the whole message (BTP = 0).
    Zero,
    /// Push the whole message (BTP = its length); it waits in the pushed buffer if no
    /// receive is posted.
    All,
    /// Push BTP(1) + BTP(2) bytes, pull the rest (the default).
    Pull,
}

impl PushMode {
    /// Parses `zero`, `all` or `pull` (`QUIVER_PUSH`).
    pub fn parse(s: &str) -> Option<PushMode> {
        match s {
            "zero" => Some(PushMode::Zero),
            "all" => Some(PushMode::All),
            "pull" => Some(PushMode::Pull),
            _ => None,
        }
    }

    /// The name `parse` accepts.
    pub fn name(self) -> &'static str {
        match self {
            PushMode::Zero => "zero",
            PushMode::All => "all",
            PushMode::Pull => "pull",
        }
    }
}

/// Per-record overhead of the shared-memory ring, in bytes (header plus alignment).
pub(crate) const SHM_RECORD_OVERHEAD: usize = 16;

/// Every variable [`Config::from_lookup`] reads.
pub(crate) const VARIABLES: &[&str] = &[
    "QUIVER_TRANSPORT",
    "QUIVER_WAIT",
    "QUIVER_MAX_MESSAGE",
    "QUIVER_POOL_SIZE",
    "QUIVER_SHM_SLOTS",
    "QUIVER_UDP_DATAGRAM",
    "QUIVER_DATAGRAM",
    "QUIVER_CLUSTER",
    "QUIVER_CONNECT_TIMEOUT",
    "QUIVER_RELIABILITY",
    "QUIVER_PUSH",
    "QUIVER_BTP1",
    "QUIVER_BTP2",
    "QUIVER_PUSH_CREDIT",
    "QUIVER_PIPELINE_MAX",
    "QUIVER_CMA",
    "QUIVER_SPLIT_COPY",
    "QUIVER_UDP_GSO",
    "QUIVER_ETH_UDP_RUNS",
    "QUIVER_UDP_GRO",
    "QUIVER_NATIVE_BROADCAST",
    "QUIVER_PORTS_DEPOSIT",
    "QUIVER_AUTH",
    "QUIVER_OFFLOAD_CPU",
    "QUIVER_RECOVERY",
    "QUIVER_WINDOW",
    "QUIVER_ETH_RING",
    "QUIVER_PEER_TIMEOUT",
    "QUIVER_FAULTS",
];

impl Config {
    /// Defaults overridden by the `QUIVER_*` variables of the environment.
    ///
    /// # Errors
    ///
    /// Those of [`Config::from_lookup`], and [`Error::InvalidEnv`] for a variable whose
    /// value is not valid UTF-8 (which would otherwise look unset).
    pub fn from_env() -> Result<Config> {
        check_unicode(VARIABLES)?;
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`Config::from_env`], reading variables through `get` (for tests). A variable
    /// set to nothing (or only blanks) counts as unset, as `VAR= command` means in a shell.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidEnv`] naming the variable when a value does not parse or lies
    /// outside its range (the constants of this module); [`Error::Config`] naming the
    /// variables when values that parse do not fit together ([`Config::validate`]).
    /// Never panics, whatever the values.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let mut c = Config::default();
        if let Some(v) = get("QUIVER_TRANSPORT") {
            c.transport = match v.as_str() {
                "auto" => TransportChoice::Auto,
                "udp" => TransportChoice::Udp,
                "eth" => TransportChoice::Eth,
                _ => return Err(invalid("QUIVER_TRANSPORT", &v, "expected auto, udp or eth")),
            };
        }
        if let Some(v) = get("QUIVER_WAIT") {
            c.wait = WaitMode::parse(&v).ok_or_else(|| {
                invalid(
                    "QUIVER_WAIT",
                    &v,
                    "expected spin, block, hybrid or hybrid:MICROSECONDS (0 to 1000000)",
                )
            })?;
        }
        if let Some(v) = get("QUIVER_MAX_MESSAGE") {
            c.max_message = size_in("QUIVER_MAX_MESSAGE", &v, MAX_MESSAGE_RANGE)?;
        }
        if let Some(v) = get("QUIVER_POOL_SIZE") {
            // The lower bound is the maximum message's, checked by `validate` below.
            c.pool_size = size_in("QUIVER_POOL_SIZE", &v, 1..=POOL_SIZE_MAX)?;
        }
        if let Some(v) = get("QUIVER_SHM_SLOTS") {
            c.shm_slots = number_in("QUIVER_SHM_SLOTS", &v, SHM_SLOTS_RANGE, "sender slots")?;
        }
        for var in ["QUIVER_UDP_DATAGRAM", "QUIVER_DATAGRAM"] {
            if let Some(v) = get(var) {
                c.datagram = Some(number_in(var, &v, DATAGRAM_RANGE, "bytes")?);
            }
        }
        c.cluster = get("QUIVER_CLUSTER");
        if let Some(v) = get("QUIVER_CONNECT_TIMEOUT") {
            c.connect_timeout = seconds_in("QUIVER_CONNECT_TIMEOUT", &v)?;
        }
        if let Some(v) = get("QUIVER_RELIABILITY") {
            c.reliability = Mode::parse(&v)
                .map_err(|_| invalid("QUIVER_RELIABILITY", &v, "expected none, host or offload"))?;
        }
        if let Some(v) = get("QUIVER_PUSH") {
            c.push = PushMode::parse(&v)
                .ok_or_else(|| invalid("QUIVER_PUSH", &v, "expected zero, all or pull"))?;
        }
        if let Some(v) = get("QUIVER_PIPELINE_MAX") {
            c.pipeline_max = match v.as_str() {
                "auto" => None,
                _ => Some(size_in("QUIVER_PIPELINE_MAX", &v, 0..=BTP_MAX)?),
            };
        }
        for (var, field) in [
            ("QUIVER_BTP1", &mut c.btp1),
            ("QUIVER_BTP2", &mut c.btp2),
            ("QUIVER_PUSH_CREDIT", &mut c.push_credit),
        ] {
            if let Some(v) = get(var) {
                *field = size_in(var, &v, 0..=BTP_MAX)?;
            }
        }
        for (var, field) in [
            ("QUIVER_CMA", &mut c.cma),
            ("QUIVER_SPLIT_COPY", &mut c.split_copy),
            ("QUIVER_UDP_GSO", &mut c.udp_gso),
            ("QUIVER_ETH_UDP_RUNS", &mut c.eth_udp_runs),
            ("QUIVER_UDP_GRO", &mut c.udp_gro),
            ("QUIVER_NATIVE_BROADCAST", &mut c.native_broadcast),
            ("QUIVER_PORTS_DEPOSIT", &mut c.ports_deposit),
            ("QUIVER_AUTH", &mut c.auth),
        ] {
            if let Some(v) = get(var) {
                *field = match v.as_str() {
                    "on" | "1" | "yes" => true,
                    "off" | "0" | "no" => false,
                    _ => return Err(invalid(var, &v, "expected on or off")),
                };
            }
        }
        if let Some(v) = get("QUIVER_OFFLOAD_CPU") {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            c.offload_cpu = Some(
                v.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n < CPU_SET_SIZE)
                    .ok_or_else(|| {
                        invalid(
                            "QUIVER_OFFLOAD_CPU",
                            &v,
                            &format!(
                                "expected a CPU number from 0 to {} (this machine has {cpus})",
                                CPU_SET_SIZE - 1
                            ),
                        )
                    })?,
            );
        }
        if let Some(v) = get("QUIVER_RECOVERY") {
            c.recovery = match v.as_str() {
                "selective" => Recovery::Selective,
                "gobackn" | "go-back-n" => Recovery::GoBackN,
                _ => {
                    return Err(invalid(
                        "QUIVER_RECOVERY",
                        &v,
                        "expected selective or gobackn",
                    ))
                }
            };
        }
        if let Some(v) = get("QUIVER_WINDOW") {
            c.window = Some(number_in("QUIVER_WINDOW", &v, WINDOW_RANGE, "frames")?);
        }
        if let Some(v) = get("QUIVER_ETH_RING") {
            c.eth_ring = Some(number_in("QUIVER_ETH_RING", &v, ETH_RING_FRAMES, "frames")?);
        }
        if let Some(v) = get("QUIVER_PEER_TIMEOUT") {
            c.peer_timeout = seconds_in("QUIVER_PEER_TIMEOUT", &v)?;
        }
        if let Some(v) = get("QUIVER_FAULTS") {
            c.faults = Some(
                FaultConfig::parse(&v).map_err(|e| invalid("QUIVER_FAULTS", &v, &e.to_string()))?,
            );
        }
        c.validate()?;
        Ok(c)
    }

    /// The window of network channels: `QUIVER_WINDOW` if set, else the default of a
    /// link that sends `segmented` runs (UDP with segmentation offload) or frame by frame.
    pub fn channel_window(&self, segmented: bool) -> u16 {
        self.window.unwrap_or(if segmented {
            DEFAULT_WINDOW_SEGMENTED
        } else {
            DEFAULT_WINDOW
        })
    }

    /// Frames of the raw Ethernet receive ring of an endpoint whose rank has
    /// `remote_ranks` ranks on other nodes (its possible senders: ranks of its own node
    /// talk over shared memory): `QUIVER_ETH_RING` if set, else one channel window per
    /// sender, at least [`ETH_RING_MIN_WINDOWS`] windows and, above that, at most
    /// [`ETH_RING_MAX_BYTES`] of frames of `frame_bytes`.
    ///
    /// Every sender's window fits, so that senders that all fill their windows at once
    /// lose nothing (up to the cap; beyond it the ring drops and retransmission repairs).
    /// A larger ring buys nothing else: the kernel writes each frame into the next slot
    /// in ring order, so a large ring is walked through memory that has left the cache
    /// and costs each small message a miss that a ring of a few hundred frames does not
    /// (docs/DESIGN-NOTES.md, "Reliable network channels"). The link applies this rule
    /// itself, to the parameters the engine gives it.
    pub fn eth_ring_frames(&self, remote_ranks: usize, frame_bytes: usize) -> usize {
        self.link_params()
            .eth_ring_frames(remote_ranks, frame_bytes)
    }

    /// What an endpoint's network link needs of this configuration: the link takes
    /// these parameters and nothing else, so that `link` does not depend on `config`.
    pub(crate) fn link_params(&self) -> crate::link::LinkParams {
        crate::link::LinkParams {
            eth_wanted_by: match self.transport {
                TransportChoice::Eth => Some("QUIVER_TRANSPORT=eth"),
                TransportChoice::Auto if self.cluster.is_some() => Some("the emulated cluster"),
                _ => None,
            },
            udp_gso: self.udp_gso,
            eth_udp_runs: self.eth_udp_runs,
            udp_gro: self.udp_gro,
            datagram: self.datagram,
            pool_size: self.pool_size,
            window: self.channel_window(false),
            window_segmented: self.channel_window(true),
            eth_ring: self.eth_ring,
            faults: self.faults.clone(),
            // The job's key is the job's: the endpoint fills it in when `auth` is on.
            auth_key: None,
            group: None,
        }
    }

    /// The parameters of the reliable channels of this configuration, with the window
    /// of a link that sends frame by frame ([`Config::channel_window`]).
    pub(crate) fn reliable(&self) -> crate::channel::reliable::Config {
        let base = crate::channel::reliable::Config::default();
        // The sender gives up after `max_timeouts` consecutive timeouts that double from
        // the initial timeout up to the maximum: count how many cover the peer timeout. A
        // few double (seven from 10 ms to 1 s), then one per maximum timeout: at most
        // about 86 400 for the longest peer timeout, a day.
        let (mut waited, mut rto, mut timeouts) = (Duration::ZERO, base.rto_initial, 0u32);
        while waited < self.peer_timeout && rto < base.rto_max {
            waited += rto;
            rto = (rto * 2).min(base.rto_max);
            timeouts += 1;
        }
        if waited < self.peer_timeout {
            let rest = (self.peer_timeout - waited)
                .as_nanos()
                .div_ceil(base.rto_max.as_nanos().max(1));
            timeouts = timeouts.saturating_add(u32::try_from(rest).unwrap_or(u32::MAX));
        }
        // Idle channels heartbeat; a peer silent for the peer timeout has failed.
        crate::channel::reliable::Config {
            mode: self.reliability,
            recovery: self.recovery,
            window: self.channel_window(false),
            max_datagram: self.datagram.unwrap_or(1472),
            max_timeouts: timeouts.max(1),
            ..base
        }
        .with_peer_timeout(self.peer_timeout)
    }

    /// Checks that every setting lies in its variable's range (for settings made through
    /// the API; [`Config::from_lookup`] checks the variables as it reads them) and that
    /// the settings fit together. The error names the variable to change.
    pub fn validate(&self) -> Result<()> {
        let out_of_range = |var: &str, value: String, range: String| {
            Err(Error::Config(format!(
                "{var} (or the matching Config field) is {value}, outside its range: {range}"
            )))
        };
        // First, so that the sums below cannot overflow.
        if !MAX_MESSAGE_RANGE.contains(&self.max_message) {
            return out_of_range(
                "QUIVER_MAX_MESSAGE",
                format!("{} bytes", self.max_message),
                size_range(&MAX_MESSAGE_RANGE),
            );
        }
        if self.pool_size > POOL_SIZE_MAX {
            return out_of_range(
                "QUIVER_POOL_SIZE",
                format!("{} bytes", self.pool_size),
                size_range(&(1..=POOL_SIZE_MAX)),
            );
        }
        if self.pool_size < self.max_message + 2 * SHM_RECORD_OVERHEAD {
            return Err(Error::Config(format!(
                "token buffer pool of {} bytes cannot hold a maximum-size message of {} bytes; \
                 set QUIVER_POOL_SIZE to at least {} bytes or lower QUIVER_MAX_MESSAGE",
                self.pool_size,
                self.max_message,
                self.max_message + 2 * SHM_RECORD_OVERHEAD
            )));
        }
        if !SHM_SLOTS_RANGE.contains(&self.shm_slots) {
            return out_of_range(
                "QUIVER_SHM_SLOTS",
                self.shm_slots.to_string(),
                number_range(&SHM_SLOTS_RANGE, "sender slots"),
            );
        }
        if let Some(d) = self.datagram.filter(|d| !DATAGRAM_RANGE.contains(d)) {
            return out_of_range(
                "QUIVER_DATAGRAM",
                format!("{d} bytes"),
                number_range(&DATAGRAM_RANGE, "bytes"),
            );
        }
        if let Some(w) = self.window.filter(|w| !WINDOW_RANGE.contains(w)) {
            return out_of_range(
                "QUIVER_WINDOW",
                format!("{w} frames"),
                number_range(&WINDOW_RANGE, "frames"),
            );
        }
        if let Some(n) = self.eth_ring.filter(|n| !ETH_RING_FRAMES.contains(n)) {
            return out_of_range(
                "QUIVER_ETH_RING",
                format!("{n} frames"),
                number_range(&ETH_RING_FRAMES, "frames"),
            );
        }
        for (var, t) in [
            ("QUIVER_CONNECT_TIMEOUT", self.connect_timeout),
            ("QUIVER_PEER_TIMEOUT", self.peer_timeout),
        ] {
            if !TIMEOUT_RANGE.contains(&t) {
                return out_of_range(var, format!("{t:?}"), SECONDS_RANGE.into());
            }
        }
        for (var, n) in [
            ("QUIVER_BTP1", self.btp1),
            ("QUIVER_BTP2", self.btp2),
            ("QUIVER_PUSH_CREDIT", self.push_credit),
        ] {
            if n > BTP_MAX {
                return out_of_range(var, format!("{n} bytes"), size_range(&(0..=BTP_MAX)));
            }
        }
        if let WaitMode::Hybrid(d) = self.wait {
            if d > HYBRID_SPIN_MAX {
                return out_of_range(
                    "QUIVER_WAIT",
                    format!("hybrid:{}", d.as_micros()),
                    "hybrid:0 to hybrid:1000000 microseconds".into(),
                );
            }
        }
        if let Some(cpu) = self.offload_cpu.filter(|&n| n >= CPU_SET_SIZE) {
            return out_of_range(
                "QUIVER_OFFLOAD_CPU",
                cpu.to_string(),
                format!("0 to {}", CPU_SET_SIZE - 1),
            );
        }
        if let Err(e) = self.reliable().validate() {
            return Err(Error::Config(format!("reliable channels: {e}")));
        }
        Ok(())
    }

    /// Sets the push mode of tagged messages.
    pub fn with_push(mut self, mode: PushMode) -> Self {
        self.push = mode;
        self
    }
    /// Sets the longest tagged message pushed whole in a pipeline
    /// ([`Config::pipeline_max`]; `None`: the cost function's choice).
    pub fn with_pipeline_max(mut self, bytes: Option<usize>) -> Self {
        self.pipeline_max = bytes;
        self
    }
    /// Sets BTP(1) and BTP(2) of tagged messages.
    pub fn with_btp(mut self, btp1: usize, btp2: usize) -> Self {
        self.btp1 = btp1;
        self.btp2 = btp2;
        self
    }
    /// Sets the pushed bytes a tagged receiver keeps for each sender
    /// ([`Config::push_credit`]).
    pub fn with_push_credit(mut self, bytes: usize) -> Self {
        self.push_credit = bytes;
        self
    }
    /// Turns authenticated network frames on or off ([`Config::auth`]).
    pub fn with_auth(mut self, on: bool) -> Self {
        self.auth = on;
        self
    }
    /// Turns single-copy pulls across address spaces (cross-memory attach) on or off.
    pub fn with_cma(mut self, on: bool) -> Self {
        self.cma = on;
        self
    }
    /// Turns the split copy of large same-node tagged messages on or off.
    pub fn with_split_copy(mut self, on: bool) -> Self {
        self.split_copy = on;
        self
    }
    /// Sets the reliability scheme of network channels.
    pub fn with_reliability(mut self, mode: Mode) -> Self {
        self.reliability = mode;
        self
    }
    /// Sets whether broadcasts go through the link's own broadcast where it has one.
    pub fn with_native_broadcast(mut self, on: bool) -> Self {
        self.native_broadcast = on;
        self
    }
    /// Sets the faults injected into sent datagrams.
    pub fn with_faults(mut self, faults: Option<FaultConfig>) -> Self {
        self.faults = faults;
        self
    }
    /// Sets the waiting strategy.
    pub fn with_wait(mut self, wait: WaitMode) -> Self {
        self.wait = wait;
        self
    }
    /// Sets the transport selection.
    pub fn with_transport(mut self, t: TransportChoice) -> Self {
        self.transport = t;
        self
    }
    /// Sets the maximum message size.
    pub fn with_max_message(mut self, n: usize) -> Self {
        self.max_message = n;
        self
    }
    /// Sets the token buffer pool size.
    pub fn with_pool_size(mut self, n: usize) -> Self {
        self.pool_size = n;
        self
    }
}

fn invalid(var: &str, value: &str, reason: &str) -> Error {
    Error::InvalidEnv {
        var: var.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// What [`TIMEOUT_RANGE`] accepts, as a user writes it.
const SECONDS_RANGE: &str = "seconds from 0.001 to 86400 (one day), such as 30 or 2.5";

/// `var`'s value `v` in seconds (a decimal number, exponents allowed) within
/// [`TIMEOUT_RANGE`]: never panics, unlike `Duration::from_secs_f64`.
fn seconds_in(var: &str, v: &str) -> Result<Duration> {
    v.trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| TIMEOUT_RANGE.contains(d))
        .ok_or_else(|| invalid(var, v, &format!("expected {SECONDS_RANGE}")))
}

/// `var`'s value `v`, a size in bytes ([`parse_size`]) within `range`.
fn size_in(var: &str, v: &str, range: RangeInclusive<usize>) -> Result<usize> {
    parse_size(v).filter(|n| range.contains(n)).ok_or_else(|| {
        invalid(
            var,
            v,
            &format!(
                "expected a size in bytes (suffix K, M or G allowed) {}",
                size_range(&range)
            ),
        )
    })
}

/// `var`'s value `v`, a decimal number of `unit` within `range`.
fn number_in<T>(var: &str, v: &str, range: RangeInclusive<T>, unit: &str) -> Result<T>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    v.trim()
        .parse::<T>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| invalid(var, v, &format!("expected {}", number_range(&range, unit))))
}

/// "from A to B UNIT".
fn number_range<T: std::fmt::Display>(range: &RangeInclusive<T>, unit: &str) -> String {
    format!("from {} to {} {unit}", range.start(), range.end())
}

/// "from A to B", each in the shortest form [`parse_size`] reads back exactly.
fn size_range(range: &RangeInclusive<usize>) -> String {
    fn show(n: usize) -> String {
        match n {
            0 => "0".into(),
            n if n % (1 << 30) == 0 => format!("{}G", n >> 30),
            n if n % (1 << 20) == 0 => format!("{}M", n >> 20),
            n if n % (1 << 10) == 0 => format!("{}K", n >> 10),
            n => n.to_string(),
        }
    }
    format!("from {} to {}", show(*range.start()), show(*range.end()))
}

/// An [`Error::InvalidEnv`] for the first of `vars` set to something that is not UTF-8:
/// `std::env::var` would call it unset, and the user's setting would be ignored silently.
pub(crate) fn check_unicode(vars: &[&str]) -> Result<()> {
    check_unicode_in(vars, |k| std::env::var_os(k))
}

/// [`check_unicode`] over the variables `get` finds.
fn check_unicode_in(vars: &[&str], get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<()> {
    for var in vars {
        if let Some(v) = get(var) {
            if v.to_str().is_none() {
                return Err(invalid(
                    var,
                    &v.to_string_lossy(),
                    "the value is not valid UTF-8; set it to plain text",
                ));
            }
        }
    }
    Ok(())
}

/// Parses `4096`, `64K`, `1M`, `2G` (binary multiples).
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1usize << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn an_empty_variable_counts_as_unset() {
        let defaults = cfg(&[]).unwrap();
        for var in [
            "QUIVER_WINDOW",
            "QUIVER_TRANSPORT",
            "QUIVER_WAIT",
            "QUIVER_UDP_GSO",
            "QUIVER_FAULTS",
            "QUIVER_CLUSTER",
        ] {
            for empty in ["", "  "] {
                let c = cfg(&[(var, empty)]).unwrap_or_else(|e| panic!("{var}={empty:?}: {e}"));
                assert_eq!(c.window, defaults.window, "{var}");
                assert_eq!(c.transport, defaults.transport, "{var}");
                assert_eq!(c.wait, defaults.wait, "{var}");
                assert_eq!(c.udp_gso, defaults.udp_gso, "{var}");
                assert!(c.faults.is_none() && c.cluster.is_none(), "{var}");
            }
        }
        // A value that is set is still checked.
        assert!(cfg(&[("QUIVER_WINDOW", "x")]).is_err());
    }

    #[test]
    fn defaults_are_valid() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.wait, WaitMode::Hybrid(DEFAULT_HYBRID_SPIN));
        assert!(c.max_message >= 1 << 20);
    }

    #[test]
    fn wait_modes_parse() {
        assert_eq!(
            cfg(&[("QUIVER_WAIT", "spin")]).unwrap().wait,
            WaitMode::Spin
        );
        assert_eq!(
            cfg(&[("QUIVER_WAIT", "block")]).unwrap().wait,
            WaitMode::Block
        );
        assert_eq!(
            cfg(&[("QUIVER_WAIT", "hybrid:250")]).unwrap().wait,
            WaitMode::Hybrid(Duration::from_micros(250))
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = cfg(&[("QUIVER_WAIT", "sometimes")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("QUIVER_WAIT"), "{e}");
        let e = cfg(&[("QUIVER_TRANSPORT", "carrier-pigeon")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("QUIVER_TRANSPORT"), "{e}");
    }

    #[test]
    fn reliability_knobs_parse_and_name_the_variable() {
        let c = cfg(&[
            ("QUIVER_RELIABILITY", "none"),
            ("QUIVER_RECOVERY", "gobackn"),
            ("QUIVER_WINDOW", "16"),
            ("QUIVER_FAULTS", "loss=0.05,seed=3"),
        ])
        .unwrap();
        assert_eq!(c.reliability, Mode::None);
        let off = cfg(&[
            ("QUIVER_RELIABILITY", "offload"),
            ("QUIVER_OFFLOAD_CPU", "1"),
        ])
        .unwrap();
        assert_eq!((off.reliability, off.offload_cpu), (Mode::Offload, Some(1)));
        assert_eq!(c.recovery, Recovery::GoBackN);
        assert_eq!(c.window, Some(16));
        assert_eq!((c.channel_window(false), c.channel_window(true)), (16, 16));
        let d = cfg(&[]).unwrap();
        assert_eq!(
            (d.window, d.channel_window(false), d.channel_window(true)),
            (None, DEFAULT_WINDOW, DEFAULT_WINDOW_SEGMENTED)
        );
        assert_eq!(c.faults.unwrap().loss, 0.05);
        for (var, val) in [
            ("QUIVER_RELIABILITY", "sometimes"),
            ("QUIVER_RECOVERY", "pray"),
            ("QUIVER_OFFLOAD_CPU", "first"),
            ("QUIVER_WINDOW", "1"),
            ("QUIVER_FAULTS", "loss=lots"),
        ] {
            let e = cfg(&[(var, val)]).unwrap_err().to_string();
            assert!(e.contains(var), "{e}");
        }
    }

    #[test]
    fn switches_parse_from_the_environment_and_name_the_variable() {
        let d = Config::default();
        let flipped = |v: bool| if v { "off" } else { "on" };
        let c = cfg(&[
            ("QUIVER_CMA", flipped(d.cma)),
            ("QUIVER_SPLIT_COPY", flipped(d.split_copy)),
            ("QUIVER_UDP_GSO", flipped(d.udp_gso)),
            ("QUIVER_ETH_UDP_RUNS", flipped(d.eth_udp_runs)),
            ("QUIVER_UDP_GRO", flipped(d.udp_gro)),
            ("QUIVER_NATIVE_BROADCAST", flipped(d.native_broadcast)),
            ("QUIVER_PORTS_DEPOSIT", flipped(d.ports_deposit)),
        ])
        .unwrap();
        assert_eq!(c.native_broadcast, !d.native_broadcast);
        assert_eq!(c.ports_deposit, !d.ports_deposit);
        assert_eq!(c.eth_udp_runs, !d.eth_udp_runs);
        assert_eq!(
            (c.cma, c.split_copy, c.udp_gso, c.udp_gro),
            (!d.cma, !d.split_copy, !d.udp_gso, !d.udp_gro)
        );
        for var in [
            "QUIVER_CMA",
            "QUIVER_SPLIT_COPY",
            "QUIVER_UDP_GSO",
            "QUIVER_ETH_UDP_RUNS",
            "QUIVER_UDP_GRO",
        ] {
            let e = cfg(&[(var, "maybe")]).unwrap_err().to_string();
            assert!(e.contains(var), "{e}");
        }
    }

    #[test]
    fn peer_timeout_sets_how_long_retransmissions_go_on() {
        let short = cfg(&[("QUIVER_PEER_TIMEOUT", "0.01")]).unwrap().reliable();
        let long = cfg(&[("QUIVER_PEER_TIMEOUT", "60")]).unwrap().reliable();
        assert!(short.max_timeouts >= 1 && short.max_timeouts < long.max_timeouts);
        // 10 ms doubling to 1 s: 7 timeouts make 1.27 s, then one per second.
        assert_eq!(long.max_timeouts, 7 + 59);
        let e = cfg(&[("QUIVER_PEER_TIMEOUT", "-1")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("QUIVER_PEER_TIMEOUT"), "{e}");
    }

    /// Issue 28: `QUIVER_PEER_TIMEOUT=1e30 quiver bench pingpong` exited 101 with a
    /// backtrace (`Duration::from_secs_f64` panics on values it cannot represent).
    #[test]
    fn huge_timeouts_are_errors_naming_the_variable() {
        for var in ["QUIVER_PEER_TIMEOUT", "QUIVER_CONNECT_TIMEOUT"] {
            let e = cfg(&[(var, "1e30")]).unwrap_err().to_string();
            assert!(e.contains(var), "{e}");
        }
    }

    #[test]
    fn the_link_gets_the_larger_window_for_segmented_udp_unless_one_is_set() {
        let d = cfg(&[("QUIVER_TRANSPORT", "udp")]).unwrap().link_params();
        assert_eq!(d.window, DEFAULT_WINDOW);
        assert_eq!(d.window_segmented, DEFAULT_WINDOW_SEGMENTED);
        assert_eq!(d.eth_wanted_by, None);
        // An explicit window wins over either default.
        let set = cfg(&[("QUIVER_WINDOW", "32")]).unwrap().link_params();
        assert_eq!((set.window, set.window_segmented), (32, 32));
        let eth = cfg(&[("QUIVER_TRANSPORT", "eth")]).unwrap().link_params();
        assert_eq!(eth.eth_wanted_by, Some("QUIVER_TRANSPORT=eth"));
    }

    #[test]
    fn the_eth_ring_holds_every_remote_senders_window() {
        let d = cfg(&[]).unwrap();
        let w = usize::from(DEFAULT_WINDOW);
        let frame = 1584; // MTU 1500
                          // Few senders: the floor of four windows.
        for remote in [0, 1, ETH_RING_MIN_WINDOWS] {
            assert_eq!(d.eth_ring_frames(remote, frame), ETH_RING_MIN_WINDOWS * w);
        }
        // More: one window each.
        assert_eq!(d.eth_ring_frames(6, frame), 6 * w);
        assert_eq!(d.eth_ring_frames(40, frame), 40 * w);
        // Many: no more than ETH_RING_MAX_BYTES, but never under the floor.
        assert_eq!(d.eth_ring_frames(1000, frame), ETH_RING_MAX_BYTES / frame);
        let jumbo = 65536 + 80;
        assert_eq!(d.eth_ring_frames(1000, jumbo), ETH_RING_MIN_WINDOWS * w);
        // The window scales it; QUIVER_ETH_RING overrides it.
        let small = cfg(&[("QUIVER_WINDOW", "16")]).unwrap();
        assert_eq!(small.eth_ring_frames(6, frame), 6 * 16);
        assert_eq!(small.eth_ring_frames(1, frame), ETH_RING_MIN_WINDOWS * 16);
        let set = cfg(&[("QUIVER_ETH_RING", "5000")]).unwrap();
        assert_eq!(set.eth_ring, Some(5000));
        assert_eq!(set.eth_ring_frames(1, frame), 5000);
        for bad in ["7", "lots", "-1", "2000000"] {
            let e = cfg(&[("QUIVER_ETH_RING", bad)]).unwrap_err().to_string();
            assert!(e.contains("QUIVER_ETH_RING"), "{bad}: {e}");
        }
    }

    #[test]
    fn pool_too_small_is_an_error() {
        let e = cfg(&[("QUIVER_MAX_MESSAGE", "4M"), ("QUIVER_POOL_SIZE", "1M")]).unwrap_err();
        assert!(e.to_string().contains("QUIVER_POOL_SIZE"), "{e}");
    }

    /// Every bound of every numeric variable: the value at the bound is taken, the one
    /// past it is an error naming the variable.
    #[test]
    fn every_numeric_variable_has_a_range() {
        let big_pool = ("QUIVER_POOL_SIZE", "16G");
        let cases: &[(&str, &[&str], &[&str])] = &[
            (
                "QUIVER_MAX_MESSAGE",
                &["1K", "4294967231"],
                &["1023", "4294967232", "0"],
            ),
            (
                "QUIVER_POOL_SIZE",
                &["16G", "17179869184"],
                &["17179869185", "17G", "0"],
            ),
            ("QUIVER_SHM_SLOTS", &["1", "4096"], &["0", "4097", "-1"]),
            ("QUIVER_DATAGRAM", &["40", "65507"], &["39", "65508", "1e3"]),
            ("QUIVER_UDP_DATAGRAM", &["40", "65507"], &["39", "65508"]),
            ("QUIVER_WINDOW", &["2", "32768"], &["1", "32769", "65536"]),
            ("QUIVER_ETH_RING", &["8", "1048576"], &["7", "1048577"]),
            ("QUIVER_BTP1", &["0", "4G"], &["4294967297", "5G", "-1"]),
            ("QUIVER_BTP2", &["0", "4294967296"], &["4194305K"]),
            ("QUIVER_OFFLOAD_CPU", &["0", "1023"], &["1024", "-1"]),
            (
                "QUIVER_WAIT",
                &["hybrid:0", "hybrid:1000000"],
                &["hybrid:1000001", "hybrid:-1"],
            ),
            (
                "QUIVER_FAULTS",
                &["delay=86400s", "reorder_delay=1ms"],
                &["delay=86401s", "loss=1.5"],
            ),
        ];
        for (var, good, bad) in cases {
            // A pool large enough for the largest message, unless the pool is tested.
            let with = |v: &str| {
                let pool = Some(big_pool).filter(|_| *var != big_pool.0);
                cfg(&[(*var, v)].into_iter().chain(pool).collect::<Vec<_>>())
            };
            for v in *good {
                let c = with(v);
                assert!(c.is_ok(), "{var}={v}: {:?}", c.err());
            }
            for v in *bad {
                let e = with(v).unwrap_err().to_string();
                assert!(e.contains(var), "{var}={v}: {e}");
            }
        }
        for var in ["QUIVER_CONNECT_TIMEOUT", "QUIVER_PEER_TIMEOUT"] {
            for v in ["0.001", "1e-3", "86400", "8.64e4", " 30 "] {
                assert!(cfg(&[(var, v)]).is_ok(), "{var}={v}");
            }
            for v in [
                "0.0009",
                "86400.001",
                "1e30",
                "0",
                "-0",
                "-1",
                "NaN",
                "inf",
                "-inf",
                "1e309",
                "30s",
            ] {
                let e = cfg(&[(var, v)]).unwrap_err().to_string();
                assert!(e.contains(var) && e.contains("86400"), "{var}={v}: {e}");
            }
        }
    }

    /// Settings made through the API are held to the same ranges, and checking them
    /// cannot overflow.
    #[test]
    fn validate_holds_api_settings_to_the_ranges() {
        let d = Config::default;
        let cases = [
            ("QUIVER_MAX_MESSAGE", d().with_max_message(usize::MAX)),
            ("QUIVER_MAX_MESSAGE", d().with_max_message(10)),
            ("QUIVER_POOL_SIZE", d().with_pool_size(usize::MAX)),
            (
                "QUIVER_WAIT",
                d().with_wait(WaitMode::Hybrid(Duration::MAX)),
            ),
            ("QUIVER_BTP2", d().with_btp(0, usize::MAX)),
            (
                "QUIVER_PEER_TIMEOUT",
                Config {
                    peer_timeout: Duration::MAX,
                    ..d()
                },
            ),
            (
                "QUIVER_CONNECT_TIMEOUT",
                Config {
                    connect_timeout: Duration::ZERO,
                    ..d()
                },
            ),
            (
                "QUIVER_DATAGRAM",
                Config {
                    datagram: Some(10),
                    ..d()
                },
            ),
            (
                "QUIVER_SHM_SLOTS",
                Config {
                    shm_slots: 0,
                    ..d()
                },
            ),
            (
                "QUIVER_OFFLOAD_CPU",
                Config {
                    offload_cpu: Some(usize::MAX),
                    ..d()
                },
            ),
        ];
        for (var, c) in cases {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(var), "{var}: {e}");
        }
        assert!(WaitMode::parse("hybrid:1000001").is_none());
    }

    #[test]
    fn a_value_that_is_not_utf8_is_an_error_naming_the_variable() {
        use std::os::unix::ffi::OsStringExt;
        let get = |k: &str| {
            (k == "QUIVER_WINDOW").then(|| std::ffi::OsString::from_vec(vec![b'6', 0xff]))
        };
        let e = check_unicode_in(VARIABLES, get).unwrap_err().to_string();
        assert!(e.contains("QUIVER_WINDOW") && e.contains("UTF-8"), "{e}");
        assert!(check_unicode_in(VARIABLES, |_| Some("64".into())).is_ok());
    }

    #[test]
    fn the_longest_peer_timeout_keeps_retransmitting_for_a_day() {
        let c = cfg(&[("QUIVER_PEER_TIMEOUT", "86400")]).unwrap().reliable();
        // 10 ms doubling to 1 s: 7 timeouts make 1.27 s, then one per second.
        assert_eq!(c.max_timeouts, 7 + 86399);
        assert!(c.validate().is_ok());
    }

    /// The property of issue 28: whatever string a variable holds, reading the
    /// configuration gives a configuration or an error that names the variable; it never
    /// panics.
    mod any_value {
        use super::*;
        use crate::test_support::{arb_env_value, env_cases};
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(env_cases()))]

            #[test]
            fn one_variable_set(value in arb_env_value()) {
                for var in VARIABLES {
                    match cfg(&[(var, &value)]) {
                        Ok(c) => prop_assert!(c.validate().is_ok(), "{var}={value:?}"),
                        Err(e) => {
                            let e = e.to_string();
                            prop_assert!(e.contains(var), "{var}={value:?}: {e}");
                        }
                    }
                }
            }

            #[test]
            fn many_variables_set(
                values in prop::collection::vec(prop::option::of(arb_env_value()), VARIABLES.len())
            ) {
                let set: Vec<(&str, &str)> = VARIABLES
                    .iter()
                    .zip(&values)
                    .filter_map(|(var, v)| Some((*var, v.as_deref()?)))
                    .collect();
                if let Err(e) = cfg(&set) {
                    let e = e.to_string();
                    prop_assert!(set.iter().any(|(var, _)| e.contains(var)), "{set:?}: {e}");
                }
            }
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("17"), Some(17));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("99999999999999999999G"), None);
    }
}
