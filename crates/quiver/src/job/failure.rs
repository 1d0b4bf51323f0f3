//! Failed ranks: how the ranks that live on learn which ranks of their job failed, and
//! how they synchronise without them.
//!
//! A rank's endpoints find its peers failed ([`crate::Error::PeerFailed`]: a same-node
//! process that is gone, a network peer silent for `QUIVER_PEER_TIMEOUT`), but only the
//! peers they talk to, and only while they talk to them. The job layer spreads that
//! knowledge through the rendezvous store:
//!
//! - [`Job::declare_failed`] records that a rank failed (`failed/{rank}`, first declarer
//!   wins). On the failed rank's node it also removes the shared-memory segments the dead
//!   process left ([`crate::link::shm::cleanup_dead_rank`]: only those whose owner is
//!   really gone), since no launcher may be there to do it.
//! - [`Job::failed_ranks`] reads the declarations of every rank.
//! - [`Job::barrier_live`] is a barrier among the ranks not declared failed.
//!
//! Every rank also publishes its process (`proc/{rank}` = `PID.START`, when it joins), so
//! that a live barrier can see for itself that a rank of its node died, even one that no
//! endpoint was talking to, and so that `rma` can name a same-node peer's process as the
//! one allowed to attach to this one ([`JobShared::published_process`]).
//!
//! A declaration is a statement, not a vote: any rank may declare any other rank failed,
//! and the others believe it. Declare only what an endpoint reported (or what you know
//! otherwise, such as a rank you killed); a live rank declared failed is merely no longer
//! waited for.

use super::barrier::{Barrier, Fate};
use super::Progress;
use super::{Job, JobShared};
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The value of `proc/{rank}`: this process's pid and start time.
pub(crate) fn process_tag() -> String {
    format!(
        "{}.{}",
        std::process::id(),
        crate::link::shm::own_start_time()
    )
}

/// Parses a [`process_tag`].
pub(super) fn parse_process_tag(tag: &str) -> Option<(u32, u64)> {
    let (pid, start) = tag.split_once('.')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

impl JobShared {
    /// The process `rank` published when it joined (`proc/{rank}`: its pid and start
    /// time), waiting at most `timeout` for it; `None` if it did not publish in time or
    /// published something else.
    pub(crate) fn published_process(&self, rank: u32, timeout: Duration) -> Option<(u32, u64)> {
        let tag = self.kv.get(&format!("proc/{rank}"), timeout).ok()?;
        parse_process_tag(&tag)
    }
}

impl Job {
    /// Records in the job's rendezvous store that `rank` failed, so that every rank's
    /// [`Job::failed_ranks`] lists it and no [`Job::barrier_live`] waits for it. Call it
    /// when an endpoint reports [`Error::PeerFailed`] for `rank`. Declaring a rank twice,
    /// or one that another rank declared already, does nothing more.
    ///
    /// If `rank` runs on this node, the shared-memory segments its dead process left are
    /// removed too (those of a process that still runs are kept): a job started without
    /// `quiver run` has no launcher to clean up after it.
    pub fn declare_failed(&self, rank: u32) -> Result<()> {
        let s = &self.shared;
        if rank >= s.size {
            return Err(Error::NoSuchRank { rank, size: s.size });
        }
        s.kv.put_if_absent(&format!("failed/{rank}"), &s.rank.to_string())?;
        if s.nids[rank as usize] == s.nids[s.rank as usize] {
            let n = crate::link::shm::cleanup_dead_rank(s.job_id, rank);
            if n > 0 {
                tracing::debug!("removed {n} shared-memory segment(s) of failed rank {rank}");
            }
        }
        Ok(())
    }

    /// The ranks that some rank of the job has declared failed ([`Job::declare_failed`],
    /// or a [`Job::barrier_live`] that found a rank's process gone), ascending. Asks the
    /// rendezvous store about every rank (O(size) requests): for recovery, not for a fast
    /// path.
    pub fn failed_ranks(&self) -> Result<Vec<u32>> {
        let s = &self.shared;
        let mut failed = Vec::new();
        for r in 0..s.size {
            if s.kv.try_get(&format!("failed/{r}"))?.is_some() {
                failed.push(r);
            }
        }
        Ok(failed)
    }

    /// A barrier among the ranks that have not failed: waits until every rank of the job
    /// has either called `barrier_live` as many times as this rank or been declared
    /// failed, and returns [`Job::failed_ranks`] as it stands then.
    ///
    /// While it waits it keeps `endpoints` making progress (as
    /// [`Job::barrier_progressing`] does; pass `&[]` for none), and
    ///
    /// - declares failed every rank that one of `endpoints` found failed
    ///   ([`Progress::failed_ranks`]), before arriving and while it waits;
    /// - stops waiting for a rank as soon as any rank declares it failed;
    /// - checks, every 100 ms, the process of each rank of this node it waits for, and
    ///   declares failed one that is gone. A rank on another node is only known failed
    ///   through a declaration or an endpoint's verdict: a network peer that dies after
    ///   the last traffic with it, found by no endpoint (a failure that
    ///   [`Progress::progress`] meets is reported by the next read or write, not in
    ///   `failed_ranks`), is waited for until the barrier times out (after an hour,
    ///   [`Error::Timeout`]).
    ///
    /// Every rank that lives must call it (it replaces [`Job::barrier`], which waits for
    /// every rank of the job, for jobs that outlive a failure); the live barriers are
    /// counted apart from the others. A rank wrongly declared failed can still take part.
    ///
    /// The returned sets of two ranks agree when no rank was declared failed while they
    /// were leaving: every declaration a rank made before it arrived is seen by every rank
    /// that leaves. A second `barrier_live` makes them agree if that matters (as long as
    /// no further rank fails).
    pub fn barrier_live(&self, endpoints: &[&dyn Progress]) -> Result<Vec<u32>> {
        let n = self.shared.live_barriers.fetch_add(1, Ordering::Relaxed);
        Barrier {
            job: self,
            name: format!("live/{n}"),
            fate: Fate::Live,
            endpoints,
        }
        .run()?;
        self.failed_ranks()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::Config;
    use crate::job::rendezvous::{KvServerHandle, Rendezvous};
    use std::sync::atomic::AtomicU32;
    use std::sync::{Arc, Barrier};
    use std::thread;
    use std::time::{Duration, Instant};

    const T: Duration = Duration::from_secs(20);

    /// Joins `size` ranks of one job with the default configuration, each on a thread
    /// of this process (one node), with a store served here.
    pub(in crate::job) fn jobs(size: u32) -> (Vec<Job>, KvServerHandle) {
        crate::test_support::jobs(size, &Config::default())
    }

    #[test]
    fn live_barrier_waits_for_every_live_rank() {
        let (jobs, _store) = jobs(4);
        let arrived = Arc::new(AtomicU32::new(0));
        let ranks: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                let arrived = Arc::clone(&arrived);
                thread::spawn(move || {
                    for round in 0..3 {
                        thread::sleep(Duration::from_millis(u64::from(job.rank()) * 15));
                        arrived.fetch_add(1, Ordering::SeqCst);
                        assert!(job.barrier_live(&[]).unwrap().is_empty());
                        assert!(arrived.load(Ordering::SeqCst) >= 4 * (round + 1));
                    }
                })
            })
            .collect();
        for r in ranks {
            r.join().unwrap();
        }
    }

    #[test]
    fn live_barrier_stops_waiting_for_a_declared_rank() {
        let (mut jobs, _store) = jobs(4);
        // Rank 2 never takes part; rank 3 declares it failed a moment later.
        let absent = jobs.remove(2);
        let start = Arc::new(Barrier::new(3));
        let ranks: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                let start = Arc::clone(&start);
                thread::spawn(move || {
                    start.wait();
                    if job.rank() == 3 {
                        thread::sleep(Duration::from_millis(200));
                        job.declare_failed(2).unwrap();
                        job.declare_failed(2).unwrap();
                    }
                    let t = Instant::now();
                    let failed = job.barrier_live(&[]).unwrap();
                    (job.rank(), failed, t.elapsed())
                })
            })
            .collect();
        for r in ranks {
            let (rank, failed, took) = r.join().unwrap();
            assert_eq!(failed, [2], "rank {rank}");
            assert!(took < T, "rank {rank} waited {took:?}");
        }
        assert_eq!(absent.failed_ranks().unwrap(), [2]);
        assert!(matches!(
            absent.declare_failed(4),
            Err(Error::NoSuchRank { rank: 4, size: 4 })
        ));
    }

    #[test]
    fn live_barrier_finds_a_dead_process_on_its_node() {
        let (mut jobs, store) = jobs(3);
        // Rank 1's process "died": its published process is one that does not exist.
        let absent = jobs.remove(1);
        let url = format!("tcp://{}", store.local_addr());
        let rv = Rendezvous::connect(&url, &crate::test_support::store_key(), T).unwrap();
        assert_eq!(
            rv.try_get("proc/1")
                .unwrap()
                .and_then(|t| parse_process_tag(&t)),
            Some((std::process::id(), crate::link::shm::own_start_time()))
        );
        rv.put("proc/1", "2147483632.0").unwrap();
        let ranks: Vec<_> = jobs
            .into_iter()
            .map(|job| thread::spawn(move || (job.rank(), job.barrier_live(&[]).unwrap())))
            .collect();
        for r in ranks {
            let (rank, failed) = r.join().unwrap();
            assert_eq!(failed, [1], "rank {rank}");
        }
        drop(absent);
    }
}
