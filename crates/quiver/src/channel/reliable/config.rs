//! Settings of a reliable channel: the LCI reliability scheme and its parameters.

use core::fmt;
use core::str::FromStr;
use std::time::Duration;

use crate::wire::MIN_DATAGRAM;

/// The reliability scheme of a channel (LCI's RX_no, RX_h, RX_ni), chosen at run time
/// (`QUIVER_RELIABILITY=none|host|offload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// RX_no: credit-based flow control only. No retransmission buffer and no
    /// retransmission timer; a gap in sequence numbers or a checksum failure is reported
    /// as a channel error, never repaired.
    None,
    /// RX_h: go-back-N (or selective repeat) retransmission run by the thread that
    /// drives the channel, with CRC32C on every frame and piggybacked, half-window and
    /// delayed acknowledgements.
    Host,
    /// RX_ni: the protocol of [`Mode::Host`], run by the engine's progress thread instead
    /// of the application's. The state machine is the same; only who drives it differs.
    Offload,
}

impl Mode {
    /// Whether this mode retransmits (and so keeps sent frames until acknowledged).
    pub const fn retransmits(self) -> bool {
        matches!(self, Mode::Host | Mode::Offload)
    }

    /// Parses `none`, `host` or `offload`.
    pub fn parse(s: &str) -> Result<Mode, ModeParseError> {
        match s.trim() {
            "none" => Ok(Mode::None),
            "host" => Ok(Mode::Host),
            "offload" => Ok(Mode::Offload),
            other => Err(ModeParseError(other.to_owned())),
        }
    }
}

impl FromStr for Mode {
    type Err = ModeParseError;

    fn from_str(s: &str) -> Result<Mode, ModeParseError> {
        Mode::parse(s)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::None => "none",
            Mode::Host => "host",
            Mode::Offload => "offload",
        })
    }
}

/// A reliability mode name that is not `none`, `host` or `offload`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reliability mode {0:?}: expected none, host or offload")]
pub struct ModeParseError(pub String);

/// How a retransmitting channel repairs a loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Recovery {
    /// Go-back-N (LCI's RX_h): the receiver drops out-of-order frames; the sender resends
    /// every unacknowledged frame from the oldest one.
    GoBackN,
    /// Selective repeat: the receiver keeps out-of-order frames within its window and
    /// reports them in the selective-acknowledgement bitmap of explicit acknowledgements;
    /// the sender resends only the holes.
    Selective,
}

/// Settings of a reliable channel. Both ends of a channel must use the same `mode`,
/// `recovery` and `window`: the sender assumes the receiver's window until the first
/// acknowledgement tells it otherwise, and interprets acknowledgements by `recovery`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The reliability scheme.
    pub mode: Mode,
    /// How losses are repaired in the retransmitting modes (ignored by [`Mode::None`]).
    pub recovery: Recovery,
    /// W: receive buffers (frames) the receiver reserves for this sender; the sender
    /// never has more than W frames beyond the receiver's released ones, nor (when it
    /// retransmits) more than W frames unacknowledged. 1 to 32768.
    pub window: u16,
    /// Largest datagram the sender builds, header included (the link's MTU for quiver
    /// frames). Messages are split into Directed Message fragments of at most this size.
    pub max_datagram: usize,
    /// Whether [`Mode::None`] seals frames with CRC32C (so that corruption is reported
    /// rather than delivered). The retransmitting modes always do.
    pub checksum: bool,
    /// Delayed acknowledgement: how long after the first unacknowledged frame the
    /// receiver sends an explicit acknowledgement if none went back in the meantime.
    pub ack_delay: Duration,
    /// Retransmission timeout before any round-trip sample.
    pub rto_initial: Duration,
    /// Smallest retransmission timeout (must exceed `ack_delay` plus a round trip, or
    /// delayed acknowledgements cause spurious retransmissions).
    pub rto_min: Duration,
    /// Largest retransmission timeout and probe interval (exponential backoff stops here).
    pub rto_max: Duration,
    /// First interval of the sender's probe: a `Heartbeat` frame sent when frames are
    /// unconfirmed ([`Mode::None`]: tail-loss detection) or the window is closed with
    /// nothing in flight (zero-window probe).
    pub probe_interval: Duration,
    /// Consecutive timeouts (retransmission timeouts without progress, or probes without
    /// any reply) after which the peer is reported unreachable.
    pub max_timeouts: u32,
    /// Heartbeat interval: when this side has sent nothing at all to the peer for this
    /// long, it sends a heartbeat (an explicit `Ack` frame with the current
    /// acknowledgement and credits, so the peer needs no new handling), so that an idle
    /// peer can tell it is alive. `None`: no heartbeats. Default
    /// [`DEFAULT_PEER_TIMEOUT`] / [`HEARTBEATS_PER_PEER_TIMEOUT`] (1 s). It must be well
    /// below the peer's `peer_timeout`: the peer fails the channel only after
    /// `peer_timeout / heartbeat` heartbeats in a row are lost.
    pub heartbeat: Option<Duration>,
    /// Silence detection: when nothing at all (no valid frame of any kind) was heard from
    /// the peer for this long, the channel fails with
    /// [`ChannelError::Silent`](super::ChannelError::Silent), whatever the mode and
    /// whether or not frames are unacknowledged. The clock starts with the first time a
    /// [`Duplex`](super::Duplex) is given. `None`: only retransmission timeouts
    /// ([`max_timeouts`](Self::max_timeouts)) fail a channel. Default
    /// [`DEFAULT_PEER_TIMEOUT`] (10 s). Needs `heartbeat` (shorter) on both ends, else an
    /// idle channel fails.
    pub peer_timeout: Option<Duration>,
}

/// Default [`Config::rto_initial`]: 10 ms. Before acknowledgements have measured the
/// round trip, a timeout cannot tell a slow link's queue from a loss, and it resends
/// into that queue (the whole window under go-back-N, and under selective repeat too
/// until it learned to wait for the next acknowledgement first): a window of 64
/// full-size frames waits up to 7.8 ms on a 100 Mbit/s link. With 1 ms, a fresh
/// channel's start there put 4.5 % more bytes on the wire than its payload needed, and
/// a window of 128 frames overflowed a queue of 256; with 10 ms, neither (PERFORMANCE,
/// "The channel window of udp"). A channel whose
/// first frames are lost waits this long once.
pub const RTO_INITIAL: Duration = Duration::from_millis(10);

/// Default [`Config::peer_timeout`]: 10 s (as `QUIVER_PEER_TIMEOUT`).
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// Heartbeats per peer timeout in the defaults: the heartbeat interval is the peer
/// timeout divided by this, so a channel fails falsely only when this many heartbeats in
/// a row are lost (at 20 % loss: about 1 in 10 million).
pub const HEARTBEATS_PER_PEER_TIMEOUT: u32 = 10;

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Host,
            recovery: Recovery::GoBackN,
            window: 64,
            max_datagram: 1472,
            checksum: true,
            ack_delay: Duration::from_micros(200),
            rto_initial: RTO_INITIAL,
            rto_min: Duration::from_micros(500),
            rto_max: Duration::from_secs(1),
            probe_interval: Duration::from_millis(1),
            max_timeouts: 12,
            heartbeat: Some(DEFAULT_PEER_TIMEOUT / HEARTBEATS_PER_PEER_TIMEOUT),
            peer_timeout: Some(DEFAULT_PEER_TIMEOUT),
        }
    }
}

/// The largest window: credits travel in a `u16`, and sequence-number comparisons need
/// the window far below half the sequence space.
pub const MAX_WINDOW: u16 = 32768;

impl Config {
    #[cfg(test)]
    /// The defaults with `mode` set.
    pub fn with_mode(mode: Mode) -> Config {
        Config {
            mode,
            ..Config::default()
        }
    }

    /// These settings with silence detection after `peer_timeout` and heartbeats at
    /// `peer_timeout` / [`HEARTBEATS_PER_PEER_TIMEOUT`] (at least 1 ns).
    pub fn with_peer_timeout(self, peer_timeout: Duration) -> Config {
        Config {
            heartbeat: Some(
                (peer_timeout / HEARTBEATS_PER_PEER_TIMEOUT).max(Duration::from_nanos(1)),
            ),
            peer_timeout: Some(peer_timeout),
            ..self
        }
    }

    #[cfg(test)]
    /// These settings without heartbeats or silence detection: a channel fails only by
    /// retransmission timeouts, and an idle one has no timer at all.
    pub fn without_liveness(self) -> Config {
        Config {
            heartbeat: None,
            peer_timeout: None,
            ..self
        }
    }

    /// Checks every field; the error names the field and the accepted range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, reason| Err(ConfigError { field, reason });
        if self.window == 0 || self.window > MAX_WINDOW {
            return bad("window", "must be from 1 to 32768 frames");
        }
        if self.max_datagram < MIN_DATAGRAM {
            return bad(
                "max_datagram",
                "must hold a header, a length prefix and one byte",
            );
        }
        if self.rto_min.is_zero() || self.rto_initial.is_zero() || self.probe_interval.is_zero() {
            return bad("rto_min", "timeouts and probe interval must be positive");
        }
        if self.rto_min > self.rto_max || self.rto_initial > self.rto_max {
            return bad("rto_max", "must be at least rto_min and rto_initial");
        }
        if self.max_timeouts == 0 {
            return bad("max_timeouts", "must be at least 1");
        }
        if self.heartbeat.is_some_and(|h| h.is_zero()) {
            return bad("heartbeat", "must be positive");
        }
        match (self.heartbeat, self.peer_timeout) {
            (_, Some(t)) if t.is_zero() => return bad("peer_timeout", "must be positive"),
            (None, Some(_)) => {
                return bad(
                    "peer_timeout",
                    "needs heartbeats (an idle peer would be declared failed)",
                )
            }
            (Some(h), Some(t)) if h >= t => {
                return bad("heartbeat", "must be shorter than peer_timeout")
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether frames are sealed with (and checked against) CRC32C.
    pub fn checksums(&self) -> bool {
        self.checksum || self.mode.retransmits()
    }
}

/// A [`Config`] field with a value the channel cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("reliable channel setting {field} {reason}")]
pub struct ConfigError {
    /// The field's name.
    pub field: &'static str,
    /// What is accepted.
    pub reason: &'static str,
}
