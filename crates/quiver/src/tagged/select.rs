//! Protocol selection for tagged messages of medium size, by a cost function of the
//! message's length and the transport to its receiver (in the manner of UCX's protocol
//! selection; `quiver info` prints the estimates and the choice for each size).
//!
//! In push mode `pull` (the default) a message goes one of three ways:
//!
//! - **eager**: at most BTP(1) bytes, pushed whole with its header (one message);
//! - **pipelined**: pushed whole in chunks of [`Costs::chunk`] bytes, so that the
//!   receiver copies one chunk out while the sender copies the next in (two copies that
//!   overlap); nothing to pull, no acknowledgement to wait for;
//! - **push-pull**: BTP(1) (and BTP(2)) bytes pushed, the rest pulled when a receive
//!   matches (one copy across address spaces inside a node; by request between nodes).
//!
//! Between pipelined and push-pull the cost function decides: the estimated time for
//! the message to land in a posted receive buffer,
//!
//! ```text
//! pipelined(n) = n / push_rate + chunk / copy_out_rate + ceil(n / chunk) * per_message
//! push_pull(n) = btp1 / push_rate + btp1 / copy_out_rate + per_message + pull_setup
//!                + (n - btp1) / pull_rate
//! ```
//!
//! (the receiver's copy out of a chunk overlaps the sender's push of the next, except
//! for the last chunk), and the pipeline is used up to the largest length where it is estimated no slower,
//! but never beyond [`PIPELINE_CAP`] (pushed bytes wait in the receiver's memory when no
//! receive is posted: large messages are pulled, as MPI's rendezvous does) nor beyond a
//! quarter of the push credit. `QUIVER_PIPELINE_MAX` overrides the choice.
//!
//! The rates place the switch, not the speed. Inside a node they are rounded from this
//! machine's measurements (session 25: `process_vm_readv` of 64 KiB at 7.4-8.7 GB/s by
//! `cma_bw`, a pipelined 64 KiB message in 3-5 µs one way, a protocol message about
//! 0.15 µs); between nodes they are round figures for a 1 GB/s link with a 10 µs round
//! trip, not measured: there a pull always costs a round trip more than the pipeline,
//! so only the cap decides.

use crate::config::Config;
use crate::link::Transport;

/// The pipeline of one transport under a configuration: the longest message pushed whole
/// (`Config::pipeline_max`, else the cost function's choice) and its chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pipeline {
    /// The longest message pushed whole, bytes.
    pub max: usize,
    /// Bytes of each chunk.
    pub chunk: usize,
}

impl Pipeline {
    /// The pipeline towards `transport` under `cfg`, with BTP(1) `btp1` in force and
    /// protocol messages of at most `largest` bytes; `single_copy` as for
    /// [`Costs::of`].
    pub fn of(
        cfg: &Config,
        transport: Transport,
        single_copy: bool,
        btp1: usize,
        largest: usize,
    ) -> Pipeline {
        let costs = Costs::of(transport, single_copy);
        Pipeline {
            max: cfg
                .pipeline_max
                .unwrap_or_else(|| costs.pipeline_max(btp1, cfg.push_credit)),
            chunk: costs.chunk.min(largest),
        }
    }
}

/// The longest message pushed whole in a pipeline, whatever the estimates.
pub const PIPELINE_CAP: usize = 256 << 10;

/// What the cost function knows of one transport.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// Time of one protocol message beyond its bytes (µs).
    pub per_message_us: f64,
    /// Bytes per µs of a push: the sender's copy into shared memory, or the link.
    pub push_rate: f64,
    /// Bytes per µs of the receiver's copy out of a push into the receive buffer.
    pub copy_out_rate: f64,
    /// Time to start a pull (µs): a cross-memory attach call inside a node, the request's
    /// round trip between nodes.
    pub pull_setup_us: f64,
    /// Bytes per µs of a pull.
    pub pull_rate: f64,
    /// Bytes of a pipeline's chunk.
    pub chunk: usize,
}

impl Costs {
    /// The costs of `transport`; `single_copy` tells whether same-node pulls are one
    /// copy (cross-memory attach works and is on).
    pub fn of(transport: Transport, single_copy: bool) -> Costs {
        match transport {
            Transport::Shm if single_copy => Costs {
                per_message_us: 0.15,
                push_rate: 20_000.0,
                copy_out_rate: 20_000.0,
                pull_setup_us: 1.0,
                pull_rate: 8_000.0,
                chunk: 16 << 10,
            },
            // Pulled by request: a round trip, then the sender pushes the bytes.
            Transport::Shm => Costs {
                per_message_us: 0.15,
                push_rate: 20_000.0,
                copy_out_rate: 20_000.0,
                pull_setup_us: 0.3,
                pull_rate: 20_000.0,
                chunk: 16 << 10,
            },
            // A network's pull is by request too: the bytes cross the same link either
            // way, after a round trip.
            Transport::Udp | Transport::Eth => Costs {
                per_message_us: 1.0,
                push_rate: 1_000.0,
                copy_out_rate: 20_000.0,
                pull_setup_us: 10.0,
                pull_rate: 1_000.0,
                chunk: 64 << 10,
            },
        }
    }

    /// Estimated µs for `n` bytes pushed whole in a pipeline.
    pub fn pipelined_us(&self, n: usize) -> f64 {
        let chunks = n.div_ceil(self.chunk).max(1);
        n as f64 / self.push_rate
            + self.chunk.min(n) as f64 / self.copy_out_rate
            + chunks as f64 * self.per_message_us
    }

    /// Estimated µs for `n` bytes with `btp1` pushed and the rest pulled.
    pub fn push_pull_us(&self, n: usize, btp1: usize) -> f64 {
        let pushed = btp1.min(n);
        pushed as f64 / self.push_rate
            + pushed as f64 / self.copy_out_rate
            + self.per_message_us
            + self.pull_setup_us
            + (n - pushed) as f64 / self.pull_rate
    }

    /// The longest message to push whole in a pipeline: the largest power of two (or
    /// the cap) up to which the pipeline is estimated no slower than push-pull.
    pub fn pipeline_max(&self, btp1: usize, push_credit: usize) -> usize {
        let cap = PIPELINE_CAP.min(push_credit / 4);
        let mut n = btp1.max(1).next_power_of_two();
        let mut best = btp1.min(cap);
        while n <= cap {
            if self.pipelined_us(n) <= self.push_pull_us(n, btp1) {
                best = n;
            } else {
                break;
            }
            n *= 2;
        }
        best
    }
}

/// How a message goes (in push mode `pull`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Pushed whole with its header.
    Eager,
    /// Pushed whole in chunks of this many bytes.
    Pipelined(usize),
    /// Pushed in part, the rest pulled.
    PushPull,
}

impl Way {
    /// The name `quiver info` prints.
    pub fn name(self) -> &'static str {
        match self {
            Way::Eager => "eager",
            Way::Pipelined(_) => "pipelined",
            Way::PushPull => "push-pull",
        }
    }
}

/// The way of an `n`-byte message with BTP(1) `btp1`, given the longest pipelined
/// message `pipeline_max` and the pipeline's chunk.
pub fn way(n: usize, btp1: usize, pipeline_max: usize, chunk: usize) -> Way {
    if n <= btp1 {
        Way::Eager
    } else if n <= pipeline_max {
        Way::Pipelined(chunk)
    } else {
        Way::PushPull
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pipeline_ends_where_pulling_becomes_cheaper_or_at_the_cap() {
        let shm = Costs::of(Transport::Shm, true);
        let max = shm.pipeline_max(4096, 8 << 20);
        assert!((4096..=PIPELINE_CAP).contains(&max));
        assert!(shm.pipelined_us(max) <= shm.push_pull_us(max, 4096));
        // A pull as fast as the pipeline, started at once: pulling wins early.
        let fast_pull = Costs {
            pull_rate: 1e9,
            pull_setup_us: 0.0,
            ..shm
        };
        assert_eq!(fast_pull.pipeline_max(4096, 8 << 20), 4096);
        // The push credit bounds what may wait in the receiver's memory.
        assert_eq!(shm.pipeline_max(4096, 64 << 10), 16 << 10);
        // Between nodes, a pull costs a round trip more for the same bytes.
        let net = Costs::of(Transport::Udp, false);
        assert_eq!(net.pipeline_max(4096, 8 << 20), PIPELINE_CAP);
    }

    #[test]
    fn every_size_has_one_way() {
        assert_eq!(way(0, 4096, 65536, 16384), Way::Eager);
        assert_eq!(way(4096, 4096, 65536, 16384), Way::Eager);
        assert_eq!(way(4097, 4096, 65536, 16384), Way::Pipelined(16384));
        assert_eq!(way(65536, 4096, 65536, 16384), Way::Pipelined(16384));
        assert_eq!(way(65537, 4096, 65536, 16384), Way::PushPull);
        assert_eq!(
            way(100, 4096, 0, 16384),
            Way::Eager,
            "eager whatever the pipeline"
        );
    }
}
