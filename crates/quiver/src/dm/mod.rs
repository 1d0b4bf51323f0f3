//! Directed Point endpoints: the message API with UNIX I/O semantics and the token
//! buffer pool.
//!
//! An [`Endpoint`] is named (NID, DPID) and opened with [`crate::Job::open`]. `target`
//! chooses where [`Endpoint::write`] sends; `write` copies the message once (straight into
//! the receiver's shared-memory ring, or into the kernel for UDP) and returns when the
//! buffer may be reused. [`Endpoint::read`] returns a [`Message`]: a zero-copy view of the
//! next message in the endpoint's token buffer pool, released when dropped, or kept with
//! [`Message::hold`] and released later in bulk with [`Endpoint::release`] (DP's
//! `dp_fsync`).
//!
//! Guarantees: messages keep their boundaries, may be empty, and arrive in FIFO order per
//! channel (sender endpoint to receiver endpoint). A message longer than the maximum is
//! [`Error::MessageTooLarge`](crate::Error::MessageTooLarge), never truncated. Frames that are malformed, of another job,
//! with a wrong token or for another endpoint are dropped and counted in
//! [`Endpoint::stats`]. Lost UDP frames are detected by sequence numbers and reported
//! as [`Error::Lost`](crate::Error::Lost) by the next read.
//!
//! An endpoint is used from one thread at a time (it is `Send`, not `Sync`).

mod endpoint;
mod message;

pub use endpoint::Endpoint;
pub use message::Message;

pub use crate::addr::Source;
pub use crate::engine::stats::EndpointStats;
