//! quiver: a communication subsystem for clusters of multicore machines.
//!
//! A tour of the layers, from the wire up (`docs/ARCHITECTURE.md` has the graph of what
//! may depend on what). The lower layers are private to the crate, so that they can
//! change without breaking programs:
//!
//! - `link`: transports that move frames between endpoints: `shm` (shared-memory receive
//!   rings written directly by senders), `udp` (`sendmmsg`/`recvmmsg` batching), `eth`
//!   (raw Ethernet through `AF_PACKET` rings), `cma` (cross-memory attach).
//! - [`wire`]: the frame format of the network transports, as checked views plus
//!   validated representations. Decoding never trusts its input.
//! - `channel`: per-channel state for a directed edge (sequence numbers, loss detection,
//!   retransmission, reassembly of Directed Messages), written sans-IO.
//! - `engine`: waiting and progress: busy polling, blocking on the endpoint's
//!   descriptor, and bounded polling followed by blocking.
//! - `job`: bootstrap (rank, size, job id, token, node of every rank) from the
//!   environment of `quiver run`, Open MPI, MPICH/Hydra or Slurm, and the rendezvous
//!   store that exchanges endpoint addresses; reached through [`Job`].
//!
//! What programs use:
//!
//! - [`Job`]: the process's place in its job, and where endpoints are opened.
//! - [`dm`]: Directed Point endpoints and their token buffer pool: the message API
//!   ([`Endpoint`], [`Message`]).
//! - [`tagged`]: tagged send/receive with the Push-Pull protocol (pushed buffer,
//!   single-copy pulls across address spaces inside a node).
//! - [`ports`]: GAMMA's active-message ports (a destination, a receive buffer, a
//!   receiver handler and an error handler per port; wait and signal).
//! - [`config`]: every `QUIVER_*` setting, with its default ([`Config`]).
//! - [`admin`]: what launchers and tools need (the rendezvous store, clean-up of a job's
//!   shared memory, the cross-memory-attach probe).
//!
//! ```no_run
//! let job = quiver::Job::from_env()?;          // rank, size, nodes
//! let ep = job.open(1)?;                        // endpoint (NID, DPID 1)
//! if job.rank() == 0 {
//!     ep.target_rank(1)?;
//!     ep.write(b"hello")?;                      // one copy; buffer reusable on return
//! } else {
//!     let msg = ep.read()?;                     // zero-copy view into the token buffer pool
//!     assert_eq!(&*msg, b"hello");
//! }                                             // the view releases its token when dropped
//! # Ok::<(), quiver::Error>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

// Under `--cfg loom` only the lock-free structures are compiled, for their models
// (`RUSTFLAGS="--cfg loom" cargo test -p quiver --lib --release loom`).
#[cfg(not(loom))]
mod addr;
#[cfg(not(loom))]
pub mod admin;
#[cfg(not(loom))]
pub(crate) mod channel;
#[cfg(not(loom))]
pub mod config;
#[cfg(not(loom))]
pub mod dm;
#[cfg(not(loom))]
pub(crate) mod engine;
#[cfg(not(loom))]
mod error;
#[cfg(all(any(test, feature = "fuzzing"), not(loom)))]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(not(loom))]
pub(crate) mod job;
pub(crate) mod link;
#[cfg(not(loom))]
pub mod ports;
// The ports' mailboxes are lock-free shared memory: their model runs alone.
#[cfg(loom)]
#[allow(dead_code)]
#[path = "ports/mailbox.rs"]
mod ports_mailbox;
#[cfg(not(loom))]
pub mod rma;
// So is the node barrier's pair of lines.
#[cfg(loom)]
#[path = "rma/node_lines.rs"]
mod rma_node_lines;
pub(crate) mod sync;
#[cfg(not(loom))]
pub mod tagged;
#[cfg(all(test, not(loom)))]
mod test_support;
#[cfg(not(loom))]
pub mod wire;

#[cfg(not(loom))]
pub use config::{
    Config, FaultConfig, PushMode, Recovery, ReliabilityMode, TransportChoice, WaitMode,
};
#[cfg(not(loom))]
pub use dm::{Endpoint, EndpointStats, Message, Source};
#[cfg(not(loom))]
pub use error::{Error, Result};
#[cfg(not(loom))]
pub use job::bootstrap::Launcher;
#[cfg(not(loom))]
pub use job::{Invitation, Job, JointJob, Progress};
#[cfg(not(loom))]
pub use link::Transport;

/// The hash map of the data path (operations, messages in flight, routes): foldhash's
/// fast hasher, several times cheaper than std's SipHash on the small integer keys used
/// there, and seeded per map, so peers that choose keys (message numbers) cannot aim at
/// collisions.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
