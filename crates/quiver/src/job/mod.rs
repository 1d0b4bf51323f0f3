//! Jobs: a process joins a job, learns its rank, the job size, the job id and token and
//! the node of every rank ([`bootstrap`]), and opens endpoints whose addresses are
//! exchanged through the job's [`rendezvous`] store. Ranks that outlive the failure of
//! others learn of it and synchronise without them through the same store
//! ([`Job::declare_failed`], [`Job::failed_ranks`], [`Job::barrier_live`]). Its three
//! barriers are one mechanism over the store ([`barrier`]).

mod barrier;
pub mod bootstrap;
mod failure;
mod joint;
pub(crate) mod launcher_kv;
#[cfg(test)]
mod launcher_tests;
pub(crate) mod pmi;
mod pmix;
pub mod rendezvous;

use self::bootstrap::{JobInfo, Launcher};
pub use self::joint::{Invitation, JointJob};
use self::rendezvous::{KvServerHandle, Rendezvous};
use crate::config::Config;
use crate::error::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

/// How long [`Job::barrier`] waits for the slowest rank.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(3600);

/// What endpoints share with their job.
pub(crate) struct JobShared {
    pub rank: u32,
    pub size: u32,
    pub job_id: u32,
    pub token: u64,
    /// The key of the job's authenticated frames (`Config::auth`).
    pub frame_key: [u8; 32],
    /// The node name of every rank (a joint job places its ranks by them).
    pub node_names: Vec<String>,
    pub nids: Vec<u32>,
    pub addrs: Vec<IpAddr>,
    pub config: Config,
    pub kv: Arc<Rendezvous>,
    pub launcher: Launcher,
    /// How the ranks met ([`Job::bootstrap`]).
    pub bootstrap: String,
    open_dpids: Mutex<HashSet<u16>>,
    /// How often each DPID was opened by this rank: which opening an endpoint is (the
    /// same on every rank of SPMD code, so protocols name per-opening objects by it).
    dpid_opens: Mutex<HashMap<u16, u32>>,
    barriers: AtomicU64,
    /// Calls of [`Job::barrier_live`] so far (named apart from [`Job::barrier`]'s).
    live_barriers: AtomicU64,
    /// Calls of [`Job::invite`] so far.
    invitations: AtomicU64,
    /// The invitations this rank issued and has not joined yet, by joint job id, with
    /// the joint store rank 0 serves (`joint.rs`).
    invited: Mutex<joint::Issued>,
    _server: Option<KvServerHandle>,
}

impl JobShared {
    pub(crate) fn node_count(&self) -> usize {
        self.nids.iter().max().map_or(1, |m| *m as usize + 1)
    }

    /// The place of `rank` among the ranks of its node (0 for the first): the port that
    /// tells apart the endpoints of one node on a shared Ethernet interface.
    pub(crate) fn node_port(&self, rank: u32) -> u16 {
        let nid = self.nids[rank as usize];
        let before = self.nids[..rank as usize].iter().filter(|&&n| n == nid);
        before.count().min(u16::MAX as usize) as u16
    }

    /// Reserves `dpid` for an endpoint about to open: a DPID can be open once per rank
    /// at a time.
    pub(crate) fn reserve_dpid(&self, dpid: u16) -> Result<()> {
        let mut open = self
            .open_dpids
            .lock()
            .map_err(|_| Error::Config("endpoint registry poisoned by a panic".into()))?;
        if !open.insert(dpid) {
            return Err(Error::DpidInUse { dpid });
        }
        if let Ok(mut opens) = self.dpid_opens.lock() {
            *opens.entry(dpid).or_insert(0) += 1;
        }
        Ok(())
    }

    /// Which opening of `dpid` by this rank the open endpoint on it is (1 for the first).
    pub(crate) fn dpid_opening(&self, dpid: u16) -> u32 {
        self.dpid_opens
            .lock()
            .map_or(0, |o| o.get(&dpid).copied().unwrap_or(0))
    }

    pub(crate) fn close_dpid(&self, dpid: u16) {
        if let Ok(mut open) = self.open_dpids.lock() {
            open.remove(&dpid);
        }
    }
}

/// What a barrier keeps going while it waits: an endpoint's progress, and the ranks it
/// found failed. Implemented by [`crate::Endpoint`]; a barrier takes any mix of them
/// (`job.barrier_live(&[&ep1, &ep2])`, or `&[]` for none).
pub trait Progress {
    /// One round of progress (acknowledgements, retransmissions); never blocks. Errors
    /// surface again on the endpoint's next read or write.
    fn progress(&self) -> Result<()>;
    /// The ranks this endpoint found failed so far.
    fn failed_ranks(&self) -> Vec<u32>;
}

/// A process's membership in a job.
///
/// ```no_run
/// let job = quiver::Job::from_env()?;
/// println!("rank {} of {} on node {}", job.rank(), job.size(), job.nid());
/// # Ok::<(), quiver::Error>(())
/// ```
#[derive(Clone)]
pub struct Job {
    pub(crate) shared: Arc<JobShared>,
}

static CLEANUP: Once = Once::new();

impl Job {
    /// Joins the job described by the environment of `quiver run`, Open MPI's `mpirun`,
    /// MPICH's Hydra or Slurm, with configuration from the `QUIVER_*` variables.
    pub fn from_env() -> Result<Job> {
        Self::from_env_with(Config::from_env()?)
    }

    /// Like [`Job::from_env`] with an explicit configuration.
    pub fn from_env_with(config: Config) -> Result<Job> {
        config.validate()?;
        // The first job of a process on a node removes segments that crashed jobs left.
        CLEANUP.call_once(|| {
            let n = crate::link::shm::cleanup_stale();
            if n > 0 {
                tracing::info!("removed {n} shared-memory segment(s) left by dead processes");
            }
        });
        let info = bootstrap::bootstrap_from_env(config.connect_timeout)?;
        Self::from_info(info, config)
    }

    /// Joins a job whose variables are read through `get` instead of the process
    /// environment (several ranks in one process, embedding in another launcher).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>, config: Config) -> Result<Job> {
        config.validate()?;
        let info = bootstrap::bootstrap(get, config.connect_timeout)?;
        Self::from_info(info, config)
    }

    fn from_info(info: JobInfo, config: Config) -> Result<Job> {
        // Ranks of this node watch this process when they wait for it (Job::barrier_live).
        info.rendezvous
            .put(&format!("proc/{}", info.rank), &failure::process_tag())?;
        Ok(Job {
            shared: Arc::new(JobShared {
                rank: info.rank,
                size: info.size,
                job_id: info.job_id,
                token: info.token,
                frame_key: info.frame_key,
                node_names: info.node_names,
                nids: info.nids,
                addrs: info.addrs,
                config,
                kv: info.rendezvous,
                launcher: info.launcher,
                bootstrap: info.bootstrap,
                open_dpids: Mutex::new(HashSet::new()),
                dpid_opens: Mutex::new(HashMap::new()),
                barriers: AtomicU64::new(0),
                live_barriers: AtomicU64::new(0),
                invitations: AtomicU64::new(0),
                invited: Mutex::new(Vec::new()),
                _server: info.server,
            }),
        })
    }

    /// Invites another job into a joint job with this one (`job::joint`): every rank
    /// calls it and gets the same [`Invitation`], to hand to the other job out of band
    /// (its text form carries the key of the joint job's store: whoever holds it can
    /// join). Rank 0 serves the joint job's store from now on.
    pub fn invite(&self) -> Result<Invitation> {
        joint::invite(self)
    }

    /// Joins the joint job of `invitation`, as its host (the job whose [`Job::invite`]
    /// issued it) or as its guest (any other job, with the invitation parsed from the
    /// host's text): every rank of both jobs calls it, and it returns when all have, within
    /// `QUIVER_CONNECT_TIMEOUT`. The host's ranks keep their numbers in the joint job and
    /// the guest's follow ([`JointJob::rank_of`]). Fails with a clear error when the jobs'
    /// settings differ, when another job took the invitation first, or when no job came.
    pub fn join(&self, invitation: &Invitation) -> Result<JointJob> {
        joint::join(self, invitation)
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    /// Number of ranks in the job.
    pub fn size(&self) -> u32 {
        self.shared.size
    }

    /// The job's id.
    pub fn job_id(&self) -> u32 {
        self.shared.job_id
    }

    /// Node id of this rank.
    pub fn nid(&self) -> u32 {
        self.shared.nids[self.shared.rank as usize]
    }

    /// Node id of `rank`.
    pub fn nid_of(&self, rank: u32) -> Result<u32> {
        self.shared
            .nids
            .get(rank as usize)
            .copied()
            .ok_or(Error::NoSuchRank {
                rank,
                size: self.shared.size,
            })
    }

    /// Number of nodes the job spans.
    pub fn node_count(&self) -> usize {
        self.shared.node_count()
    }

    /// Which launcher started the job.
    pub fn launcher(&self) -> Launcher {
        self.shared.launcher
    }

    /// How the ranks met: the store `QUIVER_RENDEZVOUS` names, or the launcher's
    /// key-value service (PMIx, PMI-2, PMI-1) through which they found the store rank 0
    /// serves. For people and logs; the wording may change.
    pub fn bootstrap(&self) -> &str {
        &self.shared.bootstrap
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Like [`Job::barrier`], while keeping `endpoints` making progress: their network
    /// channels go on acknowledging and retransmitting during the wait, so that a rank
    /// that reached the barrier does not leave a peer waiting for its answers. Use it
    /// instead of `barrier` once endpoints carry network traffic (until the offload
    /// engine does this in the background).
    pub fn barrier_progressing(&self, endpoints: &[&dyn Progress]) -> Result<()> {
        self.barrier_of_everyone(endpoints)
    }

    /// Waits until every rank of the job has called `barrier` the same number of times
    /// (through the rendezvous store: for setup and tests, not for speed). A rank that
    /// failed never arrives: ranks that outlive a failure use [`Job::barrier_live`].
    pub fn barrier(&self) -> Result<()> {
        self.barrier_of_everyone(&[])
    }

    /// [`Job::barrier`] and [`Job::barrier_progressing`]: one count of instances, one
    /// mechanism ([`barrier`]).
    fn barrier_of_everyone(&self, endpoints: &[&dyn Progress]) -> Result<()> {
        let n = self.shared.barriers.fetch_add(1, Ordering::Relaxed);
        barrier::Barrier {
            job: self,
            name: format!("barrier/user{n}"),
            fate: barrier::Fate::Everyone,
            endpoints,
        }
        .run()
    }
}
