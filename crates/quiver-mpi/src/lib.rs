//! MPI on quiver, independent of any MPI ABI.
//!
//! [`Mpi`] is one process's MPI library state: the job it joined (`quiver run`, Hydra,
//! Open MPI's `mpirun`, Slurm: quiver's bootstrap), its communicators, requests and
//! derived datatypes. It speaks in the core's own terms ([`Peer`], [`TagSel`], [`Layout`],
//! [`Op`], ids of communicators and requests); the front-ends (`quiver-mpich`:
//! `libmpi.so.12` with MPICH's ABI) map their handles and constants onto it.
//!
//! How MPI maps onto quiver:
//!
//! - **Point-to-point** is quiver's tagged messaging (Push-Pull), which keeps MPI's
//!   matching rules (source and tag wildcards, non-overtaking order). Each communicator
//!   has its own tagged endpoint, so a wildcard receive never matches another
//!   communicator's message, and a second one for its collectives, so a collective's
//!   messages never match the application's receives (MPI's separate contexts). The
//!   endpoints' DPIDs are [`DPID_BASE`] + 2 × the communicator's context id (+ 1).
//!   The members of a new communicator agree on the smallest id free at all of them;
//!   a freed communicator's endpoints stay open, parked, for the next communicator of
//!   its id (making and freeing one costs microseconds, not the opening and closing of
//!   network endpoints), so a process may make and free communicators one after the
//!   other without end. Up to [`PARKED_MAX`] freed ones are parked; the endpoints of
//!   more are closed and their ids retired (an id is never opened again), which counts
//!   towards [`MAX_CONTEXTS`].
//! - **Collectives** are algorithms over the collective endpoint (`coll`): binomial
//!   trees for broadcast and reduction, dissemination for the barrier, direct exchange
//!   for the all-to-alls; correct and simple, not yet quiver's own collectives.
//! - **Progress**: a blocking call waits inside quiver on its endpoint only while every
//!   other endpoint of the process is idle ([`quiver::tagged::Tagged::idle`]: nothing
//!   under way, nothing owed, no network timer). Otherwise it keeps the others going:
//!   at every turn while one has operations outstanding (a send started on one
//!   communicator completes while the process waits on another: MPI's progress rule),
//!   else every 200 µs (the acknowledgements, retransmissions, heartbeats and last
//!   answers a network endpoint owes: a rank that waited on its collective endpoint
//!   alone left a peer waiting for the `Done` of its last receive until the peer timed
//!   out).
//! - **Datatypes** travel packed (`datatype`): contiguous ones straight from and into
//!   the application's buffer, others through a packed copy.
//!
//! Threads: MPI_THREAD_SERIALIZED. The state is used by one thread at a time (the
//! front-ends keep it behind a lock and report a concurrent call as an error).

pub mod coll;
pub mod datatype;
pub mod error;
pub mod op;
mod p2p;
pub mod rma;

pub use datatype::{Block, Elem, Layout, Num};
pub use error::{Class, MpiError, Result};
pub use op::{Builtin, Op, UserFn};
pub use p2p::{ReqId, Status};
pub use rma::{Flavor, LockType, Win};

use coll::{bytes_of, bytes_of_mut};
use error::check;
use quiver::rma::{Rma, SharedMemory};
use quiver::tagged::{Src, Tag, Tagged};
use quiver::Job;
use std::cell::{Cell, OnceCell};
use std::collections::BTreeMap;

/// The DPID of `MPI_COMM_WORLD`'s point-to-point endpoint; communicator `c` uses
/// `DPID_BASE + 2c` (point-to-point) and `DPID_BASE + 2c + 1` (collectives).
pub const DPID_BASE: u16 = 0x4d00;
/// Context ids a process can have in use at once (communicators alive, or freed with
/// operations still completing, and the retired ids): the DPIDs above `DPID_BASE` end
/// there. A freed communicator's id is taken again once its endpoints are parked
/// ([`PARKED_MAX`]); an id whose endpoints were closed is retired for the process's
/// life.
pub const MAX_CONTEXTS: u16 = (u16::MAX - DPID_BASE) / 2;

/// Freed communicators whose endpoints a process keeps parked for the next
/// communicator of their id: parked endpoints are driven now and then (at every 64th
/// round of the other endpoints) and keep their channels' heartbeats going, so their
/// number is bounded; the endpoints of one more are closed and its id retired.
pub const PARKED_MAX: usize = 16;

/// The id of `MPI_COMM_WORLD`.
pub const WORLD: usize = 0;
/// The id of `MPI_COMM_SELF`.
pub const SELF: usize = 1;

/// A sender or destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A rank of the communicator.
    Rank(u32),
    /// `MPI_ANY_SOURCE` (receives only).
    Any,
    /// `MPI_PROC_NULL`: the operation completes at once and moves nothing.
    Null,
}

/// The tags a receive accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagSel {
    /// This tag.
    Is(u32),
    /// `MPI_ANY_TAG`.
    Any,
}

/// The two tagged endpoints of a communicator.
pub(crate) struct Endpoints {
    /// The application's point-to-point messages.
    pub(crate) p2p: Tagged,
    /// The communicator's collectives.
    pub(crate) coll: Tagged,
}

/// The endpoints of freed communicators, open, by context id, for the next
/// communicator of their id (at most [`PARKED_MAX`] communicators' worth). An endpoint
/// is never closed and opened again while the process lives: a peer's channels to the
/// closed one could meet the new one (the engine has no incarnation number). They owe their peers little (the acknowledgements
/// and last `Done` of operations that completed, answers to heartbeats), so they are
/// driven at every [`PARKED_DRIVE_EVERY`]-th round of the other endpoints only, and
/// count as busy for the waits' choice ([`Mpi::wait_raw`]) only if one of them was not
/// idle when last driven.
#[derive(Default)]
pub(crate) struct Parked {
    eps: Vec<(u16, Endpoints)>,
    /// Rounds of the other endpoints since these were last driven.
    rounds: Cell<u32>,
    /// One of them was not idle when last driven or parked.
    busy: Cell<bool>,
}

/// How many rounds of the process's endpoints drive the parked ones once.
const PARKED_DRIVE_EVERY: u32 = 64;

impl Parked {
    fn len(&self) -> usize {
        self.eps.len()
    }

    fn park(&mut self, context: u16, eps: Endpoints) {
        let busy = !eps.p2p.idle() || !eps.coll.idle();
        self.eps.push((context, eps));
        self.busy.set(self.busy.get() || busy);
    }

    /// The endpoints parked for `context`, taken out.
    fn take(&mut self, context: u16) -> Option<Endpoints> {
        let i = self.eps.iter().position(|(c, _)| *c == context)?;
        Some(self.eps.swap_remove(i).1)
    }

    /// One round of the process's endpoints: every [`PARKED_DRIVE_EVERY`]-th drives
    /// the parked ones and notes whether they are idle.
    pub(crate) fn round(&self) {
        if self.eps.is_empty() {
            return;
        }
        let n = self.rounds.get() + 1;
        if n < PARKED_DRIVE_EVERY {
            self.rounds.set(n);
            return;
        }
        self.rounds.set(0);
        let mut busy = false;
        for (_, eps) in &self.eps {
            let _ = eps.p2p.progress();
            let _ = eps.coll.progress();
            busy |= !eps.p2p.idle() || !eps.coll.idle();
        }
        self.busy.set(busy);
    }

    /// Whether none of them was found busy when last driven.
    pub(crate) fn idle(&self) -> bool {
        !self.busy.get()
    }

    fn clear(&mut self) {
        self.eps.clear();
    }
}

/// A communicator: a group of the job's ranks with its own endpoints.
pub struct Comm {
    /// The job rank of each of its ranks.
    ranks: Vec<u32>,
    /// Its rank of each job rank (`u32::MAX`: not a member).
    of_job: Vec<u32>,
    /// This process's rank in it.
    rank: u32,
    /// Its context id (its endpoints' DPIDs).
    context: u16,
    /// Its endpoints, opened when it is created (`MPI_COMM_SELF`'s on first use: no
    /// other process waits for them).
    eps: OnceCell<Endpoints>,
    /// Operations started and not yet complete on each endpoint (point-to-point,
    /// collectives): the endpoints a blocking call must keep driving.
    outstanding: [Cell<u32>; 2],
    /// The next collective's sequence number (its messages' tag).
    coll_seq: Cell<u32>,
    /// `MPI_Comm_set_name`'s.
    pub name: String,
    /// Freed by the application (`MPI_Comm_free`) while operations on it were still
    /// under way: they complete, nothing new starts, and it goes once they are done.
    freed: Cell<bool>,
}

impl Comm {
    /// Its size.
    pub fn size(&self) -> u32 {
        self.ranks.len() as u32
    }

    /// This process's rank in it.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The job rank of its rank `r`.
    pub fn job_rank(&self, r: u32) -> u32 {
        self.ranks[r as usize]
    }

    /// Its ranks' job ranks, in rank order (its group).
    pub fn group(&self) -> &[u32] {
        &self.ranks
    }

    /// Its rank of job rank `j`, if `j` is a member.
    pub fn rank_of_job(&self, j: u32) -> Option<u32> {
        self.of_job
            .get(j as usize)
            .copied()
            .filter(|&r| r != u32::MAX)
    }

    /// Its context id.
    pub fn context(&self) -> u16 {
        self.context
    }
}

/// One process's MPI state. See the [crate documentation](crate).
pub struct Mpi {
    job: Job,
    /// Communicators by id (`None`: freed).
    comms: Vec<Option<Comm>>,
    /// The requests.
    reqs: p2p::Requests,
    /// Requests freed before they completed (`MPI_Request_free`).
    detached: Vec<p2p::Entry>,
    /// The context ids this process cannot take for a new communicator: its
    /// communicators' (alive, or freed and not yet reaped) and the retired ones.
    contexts: std::collections::BTreeSet<u16>,
    /// The endpoints of freed communicators whose operations completed.
    parked: Parked,
    /// The one-sided endpoint, opened on first use.
    rma: OnceCell<Rma>,
    /// Windows by id (`None`: freed).
    wins: Vec<Option<Win>>,
    /// `MPI_Alloc_mem`'s memory not freed yet, by address.
    memories: BTreeMap<usize, SharedMemory>,
    /// A buffer accumulates reuse (the target's bytes).
    scratch: Cell<Vec<u8>>,
}

impl Mpi {
    /// Joins the job the environment describes (quiver's bootstrap: `quiver run`,
    /// Hydra's PMI, `mpirun`, `srun`) and opens `MPI_COMM_WORLD`.
    pub fn init() -> Result<Mpi> {
        let job = Job::from_env()?;
        Mpi::with_job(job)
    }

    /// MPI on a job already joined.
    pub fn with_job(job: Job) -> Result<Mpi> {
        let size = job.size();
        let me = job.rank();
        let mut mpi = Mpi {
            job,
            comms: Vec::new(),
            reqs: p2p::Requests::default(),
            detached: Vec::new(),
            contexts: [0, 1].into(),
            parked: Parked::default(),
            rma: OnceCell::new(),
            wins: Vec::new(),
            memories: BTreeMap::new(),
            scratch: Cell::new(Vec::new()),
        };
        let world = mpi.new_comm((0..size).collect(), 0)?;
        mpi.open(&world)?;
        mpi.comms.push(Some(world));
        let selfc = mpi.new_comm(vec![me], 1)?;
        mpi.comms.push(Some(selfc));
        Ok(mpi)
    }

    /// The job underneath.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// Communicator `c`.
    pub fn comm(&self, c: usize) -> Result<&Comm> {
        self.comm_any(c)
            .ok()
            .filter(|comm| !comm.freed.get())
            .ok_or_else(|| {
                MpiError::new(
                    Class::Comm,
                    format!("communicator {c} does not exist or was freed"),
                )
            })
    }

    /// Communicator `c`, also one freed whose operations are still completing.
    pub(crate) fn comm_any(&self, c: usize) -> Result<&Comm> {
        self.comms.get(c).and_then(Option::as_ref).ok_or_else(|| {
            MpiError::new(
                Class::Comm,
                format!("communicator {c} does not exist or was freed"),
            )
        })
    }

    /// Communicator `c`, mutably.
    pub fn comm_mut(&mut self, c: usize) -> Result<&mut Comm> {
        self.comms
            .get_mut(c)
            .and_then(Option::as_mut)
            .filter(|comm| !comm.freed.get())
            .ok_or_else(|| {
                MpiError::new(
                    Class::Comm,
                    format!("communicator {c} does not exist or was freed"),
                )
            })
    }

    fn new_comm(&self, ranks: Vec<u32>, context: u16) -> Result<Comm> {
        check(context < MAX_CONTEXTS, Class::Intern, || {
            format!("out of communicator contexts ({MAX_CONTEXTS} per process)")
        })?;
        let me = self.job.rank();
        let mut of_job = vec![u32::MAX; self.job.size() as usize];
        for (r, &j) in ranks.iter().enumerate() {
            of_job[j as usize] = r as u32;
        }
        let rank = of_job[me as usize];
        check(rank != u32::MAX, Class::Intern, || {
            "a communicator without this process".into()
        })?;
        Ok(Comm {
            ranks,
            of_job,
            rank,
            context,
            eps: OnceCell::new(),
            outstanding: [Cell::new(0), Cell::new(0)],
            coll_seq: Cell::new(0),
            name: String::new(),
            freed: Cell::new(false),
        })
    }

    /// Opens the endpoints of `comm` if they are not open.
    fn open<'c>(&self, comm: &'c Comm) -> Result<&'c Endpoints> {
        if let Some(eps) = comm.eps.get() {
            return Ok(eps);
        }
        let dpid = DPID_BASE + 2 * comm.context;
        let eps = Endpoints {
            p2p: Tagged::open(&self.job, dpid)?,
            coll: Tagged::open(&self.job, dpid + 1)?,
        };
        Ok(comm.eps.get_or_init(|| eps))
    }

    /// Communicator `c`, not freed, and its endpoints: where new operations start.
    pub(crate) fn live_eps(&self, c: usize) -> Result<(&Comm, &Endpoints)> {
        let comm = self.comm(c)?;
        Ok((comm, self.open(comm)?))
    }

    /// The endpoints of communicator `c` (opened on first use), also of one freed
    /// whose operations are still completing.
    pub(crate) fn eps(&self, c: usize) -> Result<(&Comm, &Endpoints)> {
        let comm = self.comm_any(c)?;
        Ok((comm, self.open(comm)?))
    }

    /// Registers a communicator of `ranks` (job ranks) made collectively over `parent`
    /// (every member calls it with the same ranks; the ranks of `parent` that are not
    /// members call [`Mpi::agree_context`] alone). Returns its id.
    fn add_comm(&mut self, ranks: Vec<u32>, context: u16) -> Result<usize> {
        let comm = self.new_comm(ranks, context)?;
        if let Some(eps) = self.parked.take(context) {
            let _ = comm.eps.set(eps);
        }
        // Taken even if the endpoints fail to open: one of them may have opened and
        // closed again, and the id is then retired.
        self.contexts.insert(context);
        self.open(&comm)?;
        // Ids 0 and 1 (the world, self) are never freed: others never take them.
        let id = store(&mut self.comms, comm);
        Ok(id)
    }

    /// Agrees on a context id for a communicator made over `parent`: the smallest id
    /// free at every rank of `parent` from the largest of their smallest free ids on.
    /// Each round is one allreduce of every rank's first free id from the candidate on
    /// (its largest and its smallest): when they are equal every rank has it free;
    /// otherwise the largest is the next candidate. The ids in use are mostly the same
    /// at every rank (communicators are made and freed collectively), so one round
    /// usually does. The id is not taken here: [`Mpi::add_comm`] takes it for a rank
    /// that gets the communicator.
    fn agree_context(&mut self, parent: usize) -> Result<u16> {
        // Freed communicators whose last operations completed give their ids back.
        self.reap();
        let mut candidate = 0u16;
        loop {
            let mine = first_free(&self.contexts, candidate);
            let (largest, smallest) = self.allreduce_max_min(parent, mine)?;
            check(largest < u32::from(MAX_CONTEXTS), Class::Intern, || {
                format!(
                    "out of communicator contexts: {MAX_CONTEXTS} in use at a rank (free \
                     communicators that are no longer needed)"
                )
            })?;
            if largest == smallest {
                return Ok(largest as u16);
            }
            candidate = largest as u16;
        }
    }

    /// `MPI_Comm_dup`.
    pub fn comm_dup(&mut self, parent: usize) -> Result<usize> {
        let ranks = self.comm(parent)?.ranks.clone();
        let context = self.agree_context(parent)?;
        let id = self.add_comm(ranks, context)?;
        self.barrier(parent)?;
        Ok(id)
    }

    /// `MPI_Comm_split`: `None` for `color` is `MPI_UNDEFINED` (no new communicator).
    pub fn comm_split(
        &mut self,
        parent: usize,
        color: Option<u32>,
        key: i32,
    ) -> Result<Option<usize>> {
        let n = self.comm(parent)?.size() as usize;
        // Each rank's (color + 1, or 0 for none; key).
        let mine = [color.map_or(0, |c| i64::from(c) + 1), i64::from(key)];
        let mut all = vec![[0i64; 2]; n];
        self.allgather_bytes(parent, bytes_of(&mine), bytes_of_mut(&mut all))?;
        let context = self.agree_context(parent)?;
        let result = match color {
            None => None,
            Some(c) => {
                let comm = self.comm(parent)?;
                let mut members: Vec<(i64, u32)> = all
                    .iter()
                    .enumerate()
                    .filter(|(_, ck)| ck[0] == i64::from(c) + 1)
                    .map(|(r, ck)| (ck[1], r as u32))
                    .collect();
                // By key, ties by rank in the parent.
                members.sort();
                let ranks = members.iter().map(|&(_, r)| comm.job_rank(r)).collect();
                Some(self.add_comm(ranks, context)?)
            }
        };
        // Nobody sends on the new endpoints before every member opened them... nor
        // needs to: a sender waits for its peer's endpoint. The barrier keeps one
        // split's traffic from racing the next split's context agreement.
        self.barrier(parent)?;
        Ok(result)
    }

    /// `MPI_Comm_create` / `MPI_Comm_create_group` with the members' job ranks (in
    /// their new rank order); a process not in `ranks` gets `None`.
    pub fn comm_create(&mut self, parent: usize, ranks: Vec<u32>) -> Result<Option<usize>> {
        let context = self.agree_context(parent)?;
        let me = self.job.rank();
        let id = if ranks.contains(&me) {
            Some(self.add_comm(ranks, context)?)
        } else {
            None
        };
        self.barrier(parent)?;
        Ok(id)
    }

    /// `MPI_Comm_free`: once its operations completed, its endpoints are parked for the
    /// next communicator of its id (up to [`PARKED_MAX`] communicators: the others close).
    pub fn comm_free(&mut self, c: usize) -> Result<()> {
        check(c > SELF, Class::Comm, || {
            "MPI_COMM_WORLD and MPI_COMM_SELF cannot be freed".into()
        })?;
        let comm = self.comm(c)?;
        // MPI lets operations started on it complete: it goes when they have.
        comm.freed.set(true);
        self.reap();
        Ok(())
    }

    /// Takes out of the table the freed communicators whose operations have all
    /// completed: their endpoints are parked for the next communicator of their context
    /// id, which is free again (what they still owe their peers, acknowledgements or a
    /// last `Done`, goes out while they are parked: they are driven with the others).
    /// One whose endpoints hold messages nobody received (a program that sent more than
    /// it received on it), or that would park more than [`PARKED_MAX`], is closed
    /// instead and its id retired. (A message of an erroneous program still on its way
    /// when the communicator was freed reaches the parked endpoint, and the next
    /// communicator of its id, as it would in MPICH.)
    pub(crate) fn reap(&mut self) {
        for slot in &mut self.comms {
            let done = slot
                .as_ref()
                .is_some_and(|c| c.freed.get() && c.outstanding.iter().all(|o| o.get() == 0));
            if !done {
                continue;
            }
            let Some(c) = slot.take() else { continue };
            let context = c.context;
            let Some(eps) = c.eps.into_inner() else {
                self.contexts.remove(&context);
                continue;
            };
            let unreceived = |t: &Tagged| !matches!(t.iprobe(Src::Any, Tag::Any), Ok(None));
            if self.parked.len() >= PARKED_MAX || unreceived(&eps.p2p) || unreceived(&eps.coll) {
                drop(eps);
            } else {
                self.contexts.remove(&context);
                self.parked.park(context, eps);
            }
        }
    }

    /// `MPI_Finalize`: a barrier, then every communicator closes (its endpoints first
    /// send the answers their peers wait for).
    pub fn finalize(mut self) -> Result<()> {
        self.finish_detached();
        let synced = self.barrier(WORLD);
        // Windows not freed go with their endpoint; memory `MPI_Alloc_mem` gave that the
        // application did not give back stays mapped (it may still read it).
        self.wins.clear();
        for (_, mem) in std::mem::take(&mut self.memories) {
            mem.leak();
        }
        drop(self.rma.take());
        // The endpoints first: closing one abandons its operations still pending (the
        // pull thread and split copies let go of their buffers), and only then may the
        // requests' own buffers (packed copies) go. In reverse order of creation.
        while let Some(c) = self.comms.pop() {
            drop(c);
        }
        self.parked.clear();
        self.reqs.clear();
        self.detached.clear();
        synced
    }
}

/// The first context id from `from` on that is not in `used` (`MAX_CONTEXTS` if none
/// below it is left).
fn first_free(used: &std::collections::BTreeSet<u16>, from: u16) -> u32 {
    let mut id = u32::from(from);
    for &u in used.range(from..) {
        if u32::from(u) != id {
            break;
        }
        id += 1;
    }
    id.min(u32::from(MAX_CONTEXTS))
}

/// Puts `item` in the first free slot of `table` (a new one when none is free) and
/// returns its index: the tables behind the handles of communicators, datatypes,
/// operations, groups and attribute keys.
pub fn store<T>(table: &mut Vec<Option<T>>, item: T) -> usize {
    match table.iter().position(Option::is_none) {
        Some(i) => {
            table[i] = Some(item);
            i
        }
        None => {
            table.push(Some(item));
            table.len() - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{first_free, store, MAX_CONTEXTS};

    #[test]
    fn the_first_free_context_skips_the_ids_in_use() {
        let used = [0u16, 1, 2, 3, 5, 9].into();
        assert_eq!(first_free(&used, 0), 4);
        assert_eq!(first_free(&used, 4), 4);
        assert_eq!(first_free(&used, 5), 6);
        assert_eq!(first_free(&used, 9), 10);
        let full = (0..MAX_CONTEXTS).collect();
        assert_eq!(first_free(&full, 0), u32::from(MAX_CONTEXTS), "none left");
        assert_eq!(
            first_free(&Default::default(), MAX_CONTEXTS),
            u32::from(MAX_CONTEXTS)
        );
    }

    #[test]
    fn a_freed_slot_is_taken_again_before_the_table_grows() {
        let mut t: Vec<Option<&str>> = Vec::new();
        assert_eq!(store(&mut t, "a"), 0);
        assert_eq!(store(&mut t, "b"), 1);
        t[0] = None;
        assert_eq!(store(&mut t, "c"), 0);
        assert_eq!(store(&mut t, "d"), 2);
        assert_eq!(t, [Some("c"), Some("b"), Some("d")]);
    }
}
