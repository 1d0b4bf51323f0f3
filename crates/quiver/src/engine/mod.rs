//! The engine: what moves messages between an endpoint and its links, whoever drives it.
//!
//! - [`core`]: the sans-IO core of an endpoint's network side: frame checks, the peer
//!   table with one reliable channel per peer, reassembly and delivery, timers' deadline,
//!   what to send. No socket, no clock, no rendezvous.
//! - [`driver`]: the I/O around the core: the link, the clock, and the rendezvous
//!   lookups of new peers; one progress round never blocks. Driven by the application
//!   thread inside quiver calls, or by the offload engine.
//! - [`group`]: the root's side of a group channel (one reliable stream broadcast to
//!   every member at once): what the members acknowledged together, and repairs.
//! - [`offload`]: the offload engine, a thread that owns a driver and talks to the
//!   application through lock-free rings (`QUIVER_RELIABILITY=offload`).
//! - [`route`]: an endpoint's routes to its destinations and its receive side (shared
//!   memory, the driver, the offload engine), with the one release path of every
//!   received message.
//! - [`station`]: one endpoint's station on the engine, under a personality's API:
//!   its routes and receivers, sending on a route (waiting for room or credits),
//!   polling, releasing, flushing, the liveness watch, waiting and lingering on close.
//! - [`protocol`]: the protocol hook: a personality's sans-IO state machine, handed its
//!   messages where progress runs, answering through an outbox that never blocks.
//! - [`clock`]: the protocol clock of the channels' timers.
//! - [`stats`]: the counters of an endpoint, which the station keeps and the core, the
//!   driver and the link add to.
//! - [`wait`]: how blocking calls wait (spin, block, hybrid), the epoll poller and the
//!   eventfd notifier.
//!
//! The personalities (Directed Point endpoints in `dm`, tagged messaging) sit above and
//! reach links only through the engine: each stands on a [`station::Station`], whose
//! shared-memory fast paths are inlined into their calls.

pub(crate) mod clock;
pub(crate) mod core;
pub(crate) mod driver;
pub(crate) mod group;
pub(crate) mod offload;
pub(crate) mod protocol;
pub(crate) mod route;
#[cfg(test)]
pub(crate) mod sim_tests;
pub(crate) mod station;
pub(crate) mod stats;
pub(crate) mod wait;

pub(crate) use wait::{backoff_until, pin_current_thread, Poller, Waitable, Waiter};
