//! Shared buffers: memory a sender allocates from the job's shared pool
//! ([`Tagged::alloc_shared`](crate::tagged::Tagged::alloc_shared)) so that a same-node
//! receiver reads the pulled part in place, with one copy and without the permission that
//! cross-memory attach needs.
//!
//! A shared buffer is a named shared-memory object (`link::shm::object`)
//! `/quiver-UID-JOB-RANK-bN`, mapped by its owner and, on first use, by each receiver.
//! Buffer numbers are never reused within an endpoint, so a receiver's cached mapping
//! always names the buffer the sender meant.

use crate::link::shm::object;

pub(crate) use object::{unlink, Mapping};

/// The name of shared buffer `id` of `rank` in job `job_id`.
pub(crate) fn name(job_id: u32, rank: u32, id: u32) -> String {
    format!("/quiver-{}-{job_id:08x}-{rank}-b{id}", object::uid())
}
