//! Whether this process may read and write the memory of a same-node peer directly, by
//! cross-memory attach (`process_vm_readv`/`writev`), the proof it asks for first, and
//! the permission it gives its peers in return.
//!
//! A pid in a message names the peer only if both share a pid namespace, and the kernel
//! may refuse attach altogether (Yama, seccomp). So each endpoint publishes a nonce (its
//! pid, the address of a word and the word's value) in the rendezvous store under
//! `cma/RANK/DPID`; a peer probes that word at that pid once, and from then on reads and
//! writes that rank only at that pid. A refusal by the kernel holds for every peer and is
//! recorded once ([`Reach::cma`]); a wrong process only for that peer.
//!
//! Every pid a peer names (the sender's in each `Push`, the receiver's in a split-copy
//! slot) is checked against the pid that rank proved, a comparison with no system call:
//! a rank is one process, so another pid (a forked child holding a copy of the nonce,
//! a peer lying, a stale message) is refused without touching that process, counted
//! ([`Reach::refused`]) and logged once per rank; the caller takes its copy path.
//!
//! [`permit_peers`] decides, when an endpoint opens, what this process lets its peers do
//! under Yama (`link::cma::yama`): name the job's one other process on this node as its
//! tracer, or any process of the user when there are several, or nothing.

use crate::error::Result;
use crate::job::rendezvous::Rendezvous;
use crate::job::JobShared;
use crate::link::cma::{self, yama};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

/// Longest wait, when an endpoint opens, for a same-node peer to publish its process
/// (it does so right after joining the job, which every rank has done by then).
const PUBLISH_WAIT: Duration = Duration::from_secs(5);

/// What one endpoint knows about one peer rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proof {
    /// The rank proved to be process `pid` (its nonce read there); `warned`: a pid other
    /// than this one was refused and logged.
    Proved { pid: u32, warned: bool },
    /// Its memory cannot be read directly (no nonce, another process, refused).
    Unreachable,
}

/// What one endpoint knows about reaching its same-node peers' memory.
pub(crate) struct Reach {
    dpid: u16,
    /// What is known of cross-memory attach itself (off for good after the first
    /// refusal, which is logged once).
    pub cma: cma::CmaState,
    /// Peers (by rank): the process each proved to be, or that it cannot be read.
    peers: RefCell<HashMap<u32, Proof>>,
    /// Pids refused because they were not the one their rank proved.
    refused: Cell<u64>,
}

impl Reach {
    /// Publishes this endpoint's nonce (endpoint `dpid` of `rank`) in `store`.
    pub(crate) fn publish(store: &Rendezvous, rank: u32, dpid: u16) -> Result<Reach> {
        let nonce = cma::probe_target();
        store.put(
            &format!("cma/{rank}/{dpid}"),
            &format!("{}:{}:{}", std::process::id(), nonce.addr, nonce.value),
        )?;
        Ok(Reach {
            dpid,
            cma: cma::CmaState::new(),
            peers: RefCell::new(HashMap::new()),
            refused: Cell::new(0),
        })
    }

    /// Whether cross-memory attach reads and writes the memory of rank `source` at `pid`:
    /// `pid` must be the process that rank proved to be (the first time, by reading
    /// the nonce it published, at the pid it published with it). A refused `pid` is
    /// counted and logged (once per rank); nothing of that process is touched.
    pub(crate) fn reaches(&self, store: &Rendezvous, source: u32, pid: u32) -> bool {
        let known = self.peers.borrow().get(&source).copied();
        let proof = match known {
            Some(p) => p,
            None => {
                let p = self.prove(store, source);
                self.peers.borrow_mut().insert(source, p);
                p
            }
        };
        match proof {
            Proof::Proved { pid: proved, .. } if proved == pid => true,
            Proof::Proved {
                pid: proved,
                warned,
            } => {
                self.refused.set(self.refused.get() + 1);
                if !warned {
                    self.peers.borrow_mut().insert(
                        source,
                        Proof::Proved {
                            pid: proved,
                            warned: true,
                        },
                    );
                    tracing::warn!(
                        "rank {source} named process {pid}, not process {proved}, which it \
                         proved to be (its published nonce): process {pid} is not read or \
                         written; that transfer takes the two-copy path (a rank is one \
                         process; counted in TaggedStats::foreign_pids_refused)"
                    );
                }
                false
            }
            Proof::Unreachable => false,
        }
    }

    /// Pids refused so far because their rank had proved to be another process.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.get()
    }

    /// Reads the nonce rank `source` published, at the pid it published with it.
    fn prove(&self, store: &Rendezvous, source: u32) -> Proof {
        let key = format!("cma/{source}/{}", self.dpid);
        let published = store.try_get(&key).ok().flatten();
        let claim = published.as_deref().and_then(|v| {
            let mut f = v.split(':').map(|x| x.parse::<u64>().ok());
            let (p, addr, value) = (f.next()??, f.next()??, f.next()??);
            Some((u32::try_from(p).ok()?, cma::ProbeTarget { addr, value }))
        });
        let proof = match claim {
            Some((pid, target)) => match cma::probe(pid, target) {
                Ok(()) => Proof::Proved { pid, warned: false },
                Err(e) => {
                    // Refusals by the kernel hold for every peer; a wrong process only
                    // for this one.
                    if matches!(
                        e.unavailable(),
                        Some(cma::Unavailable::NotPermitted | cma::Unavailable::Unsupported)
                    ) {
                        self.cma.record(pid, &e);
                    }
                    Proof::Unreachable
                }
            },
            None => Proof::Unreachable,
        };
        if proof == Proof::Unreachable {
            tracing::info!(
                "rank {source}: its memory cannot be read directly (cross-memory attach); \
                 tagged messages from it take the two-copy path"
            );
        }
        proof
    }
}

/// Lets the job's same-node peers attach to this process where Yama asks for it, as
/// narrowly as the kernel allows ([`yama::decide`], carried out process-wide by
/// [`yama::apply`], which logs what it changes). Returns whether cross-memory attach may
/// be used at all (false where Yama forbids it: said once in the log).
pub(crate) fn permit_peers(job: &JobShared) -> bool {
    let decision = yama::decide(yama::ptrace_scope(), yama::has_cap_sys_ptrace(), || {
        peer_processes(job, PUBLISH_WAIT)
    });
    yama::apply(decision)
}

/// The job's processes on this node other than this one, as they published themselves
/// when they joined (`proc/RANK`), waiting at most `wait` in all for them. A rank whose
/// published process does not run here (another pid namespace, or gone: no process with
/// that pid and start time) is left out: it could not attach to this one by that pid,
/// and naming it would let whatever process has that pid here attach instead. A rank
/// that has not published in time makes the answer [`yama::PeerProcesses::Several`].
pub(crate) fn peer_processes(job: &JobShared, wait: Duration) -> yama::PeerProcesses {
    let own = std::process::id();
    let node = job.nids[job.rank as usize];
    let deadline = std::time::Instant::now() + wait;
    let mut found = None;
    for rank in 0..job.size {
        if rank == job.rank || job.nids[rank as usize] != node {
            continue;
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Some((pid, start)) = job.published_process(rank, left) else {
            return yama::PeerProcesses::Several;
        };
        if pid == own || !crate::link::shm::process_alive(pid, start) {
            continue;
        }
        match found {
            None => found = Some(pid),
            Some(p) if p == pid => {}
            Some(_) => return yama::PeerProcesses::Several,
        }
    }
    found.map_or(yama::PeerProcesses::None, yama::PeerProcesses::One)
}
