//! What tools around quiver need beyond the message API: a launcher's rendezvous store,
//! the clean-up of a job's shared memory, and the probe of cross-memory attach.
//!
//! `quiver run`, `quiver info` and the tests use these; a program that only sends and
//! receives does not. Everything else inside quiver (links, channels, the engine, the
//! bootstrap) is private to the crate, so that its layers can change without breaking
//! programs.

/// How a process started here would join its job (the launcher found, and the store or
/// the launcher's key-value service it would use), in words: for `quiver info`.
pub fn bootstrap_plan() -> String {
    crate::job::launcher_kv::describe(&|name| std::env::var(name).ok())
}

/// The protocol selection of tagged messages (`tagged::select`): the cost function's
/// estimates and choices, for `quiver info`.
pub mod select {
    pub use crate::tagged::select::{way, Costs, Pipeline, Way, PIPELINE_CAP};
}

pub use crate::job::rendezvous::{KvServer, KvServerHandle, Rendezvous, StoreKey, KEY_VAR};
pub use crate::link::shm::{cleanup_job, cleanup_stale, job_segments};

/// Cross-memory attach (`process_vm_readv`/`writev`), which tagged messages use for their
/// single copies inside a node: whether this process may reach a peer, and how to allow it.
pub mod cma {
    pub use crate::link::cma::{
        allow_peers, probe, probe_target, CmaError, ProbeTarget, Unavailable,
    };
}
