//! Jobs: bootstrap from the launcher's environment and the rendezvous store.
pub mod bootstrap;
pub mod rendezvous;

use crate::dm::Endpoint;
use crate::{Config, Result};

/// A process's membership in a job: its rank, the job size, the node of every rank.
pub struct Job {}

impl Job {
    /// Joins the job described by the environment (see [`bootstrap`]).
    pub fn from_env() -> Result<Job> {
        todo!()
    }
    /// Joins with an explicit configuration instead of the `QUIVER_*` knobs.
    pub fn from_env_with(_config: Config) -> Result<Job> {
        todo!()
    }
    /// This process's rank.
    pub fn rank(&self) -> u32 {
        todo!()
    }
    /// Number of ranks.
    pub fn size(&self) -> u32 {
        todo!()
    }
    /// The job's id.
    pub fn job_id(&self) -> u32 {
        todo!()
    }
    /// Node id of this rank.
    pub fn nid(&self) -> u32 {
        todo!()
    }
    /// Node id of `rank`.
    pub fn nid_of(&self, _rank: u32) -> Result<u32> {
        todo!()
    }
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        todo!()
    }
    /// Opens endpoint `dpid` on this rank.
    pub fn open(&self, _dpid: u16) -> Result<Endpoint> {
        todo!()
    }
    /// Waits until every rank has called `barrier` (through the rendezvous store).
    pub fn barrier(&self) -> Result<()> {
        todo!()
    }
}
