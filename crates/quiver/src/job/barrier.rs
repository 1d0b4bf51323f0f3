//! The job's barriers, one mechanism behind all three ([`Job::barrier`],
//! [`Job::barrier_progressing`], [`Job::barrier_live`]): a rank arrives by publishing
//! `{name}/{rank}` in the rendezvous store, then waits for what it needs to see, keeping
//! the endpoints it was given making progress meanwhile.
//!
//! - A barrier of every rank (`Fate::Everyone`) gathers through rank 0: rank 0 waits for
//!   every other rank's arrival and publishes `{name}/done`, which the others wait for.
//!   With no endpoints to keep going, the waits are the store's own blocking reads
//!   (O(size) store requests in all); with endpoints, a rank looks at the store between
//!   progress rounds, at most every 20 ms once the barrier has lasted, and asks only
//!   after the first rank still missing (O(size) plus one request per look).
//! - A barrier of the ranks that live (`Fate::Live`) cannot rely on rank 0, which may be
//!   the one that failed: every rank waits for every other rank to arrive or be
//!   declared failed (`failed/{rank}`), declares failed the ranks its endpoints found
//!   failed, and checks the processes of the ranks of its node it still waits for.
//!
//! These are store barriers, for setup, tests and recovery: the collectives of
//! milestone 2 (`coll/`) will have a message barrier of their own over the engine, and
//! keep this one for what happens before endpoints exist or after ranks failed.

use super::rendezvous::Deadline;
use super::{Job, Progress, BARRIER_TIMEOUT};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// First pause between two looks at the store; doubled up to [`MAX_STORE_POLL`].
const FIRST_STORE_POLL: Duration = Duration::from_millis(1);
/// Longest pause between two looks at the store while polling it.
const MAX_STORE_POLL: Duration = Duration::from_millis(20);
/// How often a live barrier checks the processes of same-node ranks it waits for.
const LIVENESS_PERIOD: Duration = Duration::from_millis(100);
/// Pause between progress rounds of the endpoints a barrier keeps going.
const PROGRESS_PAUSE: Duration = Duration::from_micros(200);

/// Which ranks a barrier waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Every rank of the job: one that failed is waited for until the barrier times out.
    Everyone,
    /// The ranks not declared failed (declaring, on the way, the failures this rank
    /// knows of).
    Live,
}

/// One barrier instance: the store keys under `name` are its own.
pub(super) struct Barrier<'a> {
    pub job: &'a Job,
    pub name: String,
    pub fate: Fate,
    pub endpoints: &'a [&'a dyn Progress],
}

impl Barrier<'_> {
    /// Arrives and waits (module documentation); [`Error::Timeout`] after
    /// [`BARRIER_TIMEOUT`].
    pub(super) fn run(self) -> Result<()> {
        let s = &self.job.shared;
        let (me, size) = (s.rank, s.size);
        let live = self.fate == Fate::Live;
        let mut declared: Vec<u32> = Vec::new();
        if live {
            self.declare_endpoint_failures(&mut declared)?;
        }
        if size == 1 {
            return Ok(());
        }
        s.kv.put(&self.arrived_key(me), "1")?;
        // What this rank waits for: ranks (their arrival, or their failure when live), or
        // for ranks other than 0 of a barrier of everyone, rank 0's "done".
        let through_rank0 = !live && me != 0;
        let mut pending: Vec<u32> = if through_rank0 {
            vec![0]
        } else {
            (0..size).filter(|&r| r != me).collect()
        };
        let key = |r: u32| {
            if through_rank0 {
                self.done_key()
            } else {
                self.arrived_key(r)
            }
        };
        let deadline = Deadline::after(BARRIER_TIMEOUT);
        let timeout = |pending: &[u32]| {
            tracing::debug!("barrier {}: waited in vain for {pending:?}", self.name);
            Error::Timeout(BARRIER_TIMEOUT)
        };
        let mut procs: HashMap<u32, Option<(u32, u64)>> = HashMap::new();
        let mut poll_every = FIRST_STORE_POLL;
        let mut last_look: Option<Instant> = None;
        let mut last_liveness = Instant::now();
        while !pending.is_empty() {
            if self.endpoints.is_empty() && !live {
                // Nothing to do meanwhile: the store's blocking read.
                match s.kv.get(&key(pending[0]), deadline.remaining()) {
                    Ok(_) => {
                        pending.remove(0);
                        continue;
                    }
                    Err(Error::Timeout(_)) => return Err(timeout(&pending)),
                    Err(e) => return Err(e),
                }
            }
            for ep in self.endpoints {
                // Errors surface again on the endpoint's next read or write.
                let _ = ep.progress();
            }
            if last_look.is_none_or(|t| t.elapsed() >= poll_every) {
                last_look = Some(Instant::now());
                poll_every = (poll_every * 2).min(MAX_STORE_POLL);
                if live {
                    self.declare_endpoint_failures(&mut declared)?;
                }
                if live {
                    let mut still = Vec::with_capacity(pending.len());
                    for &r in &pending {
                        let here = s.kv.try_get(&key(r))?.is_some()
                            || s.kv.try_get(&format!("failed/{r}"))?.is_some();
                        if !here {
                            still.push(r);
                        }
                    }
                    pending = still;
                } else {
                    // Every rank must arrive: asking after the first one still missing
                    // until it is there keeps the store's load O(size) in all.
                    while let Some(&r) = pending.first() {
                        if s.kv.try_get(&key(r))?.is_none() {
                            break;
                        }
                        pending.remove(0);
                    }
                }
                if live && !pending.is_empty() && last_liveness.elapsed() >= LIVENESS_PERIOD {
                    last_liveness = Instant::now();
                    let mut still = Vec::with_capacity(pending.len());
                    for &r in &pending {
                        if self.process_gone(r, &mut procs)? {
                            tracing::debug!(
                                "barrier {}: the process of rank {r} is gone",
                                self.name
                            );
                            self.job.declare_failed(r)?;
                        } else {
                            still.push(r);
                        }
                    }
                    pending = still;
                }
                if !pending.is_empty() && deadline.remaining().is_zero() {
                    return Err(timeout(&pending));
                }
            }
            if !pending.is_empty() {
                let pause = if self.endpoints.is_empty() {
                    poll_every
                } else {
                    PROGRESS_PAUSE
                };
                std::thread::sleep(pause);
            }
        }
        if !live && me == 0 {
            s.kv.put(&self.done_key(), "1")?;
        }
        Ok(())
    }

    fn arrived_key(&self, rank: u32) -> String {
        format!("{}/{rank}", self.name)
    }

    fn done_key(&self) -> String {
        format!("{}/done", self.name)
    }

    /// Declares failed every rank one of the endpoints found failed and this barrier
    /// has not declared yet.
    fn declare_endpoint_failures(&self, declared: &mut Vec<u32>) -> Result<()> {
        for ep in self.endpoints {
            for r in ep.failed_ranks() {
                if !declared.contains(&r) {
                    self.job.declare_failed(r)?;
                    declared.push(r);
                }
            }
        }
        Ok(())
    }

    /// Whether `rank` runs on this node, has not arrived, and its process (as it
    /// published it, read on first need into `procs`) is gone.
    fn process_gone(
        &self,
        rank: u32,
        procs: &mut HashMap<u32, Option<(u32, u64)>>,
    ) -> Result<bool> {
        let s = &self.job.shared;
        if s.nids[rank as usize] != s.nids[s.rank as usize] {
            return Ok(false);
        }
        let proc = match procs.get(&rank) {
            Some(p) => *p,
            None => {
                let p =
                    s.kv.try_get(&format!("proc/{rank}"))?
                        .as_deref()
                        .and_then(super::failure::parse_process_tag);
                procs.insert(rank, p);
                p
            }
        };
        let dead = proc.is_some_and(|(pid, start)| !crate::link::shm::process_alive(pid, start));
        // A rank may have arrived, and then ended, since the look at the store.
        Ok(dead && s.kv.try_get(&self.arrived_key(rank))?.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::failure::tests::jobs;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::thread;

    /// An endpoint stand-in that counts its progress rounds.
    #[derive(Default)]
    struct Counting(AtomicU32);

    impl Progress for Counting {
        fn progress(&self) -> Result<()> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }

        fn failed_ranks(&self) -> Vec<u32> {
            Vec::new()
        }
    }

    /// Four ranks, three rounds of `barrier` (blocking reads) alternating with
    /// `barrier_progressing` (polling while endpoints progress): nobody leaves a round
    /// before everyone arrived at it, and a rank that waits keeps its endpoint going.
    #[test]
    fn nobody_leaves_before_everyone_arrived_with_or_without_endpoints() {
        let (jobs, _store) = jobs(4);
        let arrived = Arc::new(AtomicU32::new(0));
        let ranks: Vec<_> = jobs
            .into_iter()
            .map(|job| {
                let arrived = Arc::clone(&arrived);
                thread::spawn(move || {
                    let ep = Counting::default();
                    for round in 0..6 {
                        thread::sleep(Duration::from_millis(u64::from(job.rank()) * 10));
                        arrived.fetch_add(1, Ordering::SeqCst);
                        if round % 2 == 0 {
                            job.barrier().unwrap();
                        } else {
                            job.barrier_progressing(&[&ep]).unwrap();
                        }
                        assert!(arrived.load(Ordering::SeqCst) >= 4 * (round + 1));
                    }
                    (job.rank(), ep.0.load(Ordering::Relaxed))
                })
            })
            .collect();
        for r in ranks {
            let (rank, rounds) = r.join().unwrap();
            // Rank 0 arrives 30 ms before rank 3 in every round: it waits, progressing.
            if rank == 0 {
                assert!(rounds > 0, "rank 0 waited without progress");
            }
        }
    }

    #[test]
    fn a_job_of_one_rank_passes_every_barrier_at_once() {
        let (jobs, _store) = jobs(1);
        let job = &jobs[0];
        job.barrier().unwrap();
        job.barrier_progressing(&[&Counting::default()]).unwrap();
        assert!(job.barrier_live(&[]).unwrap().is_empty());
    }
}
