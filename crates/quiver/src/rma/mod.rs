//! One-sided access to the memory of another process of the node: the machinery behind
//! tagged messaging's single-copy pulls, which deposit/fetch RMA (milestone 2) builds on.
//!
//! - [`window`]: shared buffers, memory a sender allocates in named shared-memory objects
//!   so that a same-node receiver reads it in place, without the permission that
//!   cross-memory attach needs.
//! - [`split`]: the split-copy board, where the two processes of one large transfer
//!   divide its copy (`link::shm::split` is the protocol of one slot).
//! - [`puller`]: the pull phase on a core of its own, for the offload engine's users.
//! - [`reach`]: whether cross-memory attach reaches a peer, proved by a published nonce.
//!
//! Still in `tagged` (stage C3 of the engine redesign moves them here): piecewise reads
//! and the two halves of a split copy.

pub(crate) mod puller;
pub(crate) mod reach;
pub(crate) mod split;
pub(crate) mod window;
