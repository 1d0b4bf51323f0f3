//! One-sided access to the memory of other processes: the job's windows with put, get,
//! remote atomics and typed accumulates ([`reduce`]: what the target computes) (the
//! deposit seed's personality, [`Rma`], module `access`; the
//! wire form of its requests in `ops`, the target's side in `serve`), and the machinery
//! behind tagged messaging's single-copy pulls inside a node. On [`Rma`] stand the
//! seed's three message-passing libraries, which move data with the same deposit and
//! differ in how they synchronize: [`pvm`] (buffered, implicit synchronization per
//! message), [`rrmsg`] (request, pull, acknowledgement per transfer) and [`dmsg`]
//! (deposit into the final place, global barriers between phases).
//!
//! What the single-copy machinery owns, per endpoint, in one `SingleCopy`:
//!
//! - the **get** (`SingleCopy::get`, `SingleCopy::start_get`): copies bytes of a same-node peer's
//!   memory into a local buffer, from the peer's shared buffer when the bytes lie in one
//!   (`Remote::Shared`), else by cross-memory attach (`Remote::Memory`), as a split
//!   copy when the peer offered one, on the pull thread when it runs and the get is
//!   large. When neither path reaches the peer the get says so (`Got::Unreachable`) and
//!   the caller has the peer send the bytes over its channel instead;
//! - the **windows** a peer reads (`window`): shared buffers allocated here
//!   (`SingleCopy::alloc_shared`), their registry (`SingleCopy::locate` names local bytes as a
//!   `Remote` for a peer), and the peers' shared buffers mapped here;
//! - the **sender's half of a split copy** (`split`): offering a board slot for a
//!   transfer (`SingleCopy::offer_split`) and writing the units the receiver leaves to it
//!   (`SingleCopy::help`);
//! - `puller`: the pull phase on a core of its own, for the offload engine's users;
//! - `reach`: whether cross-memory attach reaches a peer, proved by a published nonce,
//!   and only at the pid it proved; what this process lets its peers do under Yama.
//!
//! What it guarantees: no input from a peer (a window number, an offset, an address, a
//! board slot) makes it panic or touch memory outside the destination it was given; a
//! range outside a peer's window is `GetError::OutOfBounds`, a transfer that the
//! kernel fails is `GetError::Attach`, and a refusal of cross-memory attach (logged
//! once) makes later gets `Got::Unreachable` rather than errors. No process is read or
//! written but the one a peer rank proved to be: a get naming another pid for that rank
//! is `Got::Unreachable` (counted in `SingleCopyStats::pids_refused`), and so is a split
//! copy's write into another. A get that returns has
//! finished writing its destination (a peer helping with a split copy included), except
//! a `Got::Queued` one, whose end `SingleCopy::completed` reports.
//!
//! Who calls it: `tagged` (its pulls, and the sender's side of split copies); `ports`
//! (its broadcast ring, a `window::Published` buffer its node's ranks read). It knows
//! nothing of messages, tags or channels; whether a peer is on this node is the caller's
//! to say (only same-node peers are asked for).

mod access;
mod barrier;
pub mod dmsg;
mod get;
mod layout;
mod memory;
mod node_lines;
mod ops;
pub(crate) mod puller;
pub mod pvm;
pub(crate) mod reach;
pub mod reduce;
pub mod rrmsg;
mod serve;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use serve::fuzz as serve_fuzz;
#[cfg(test)]
mod sim_tests;
pub(crate) mod split;
#[cfg(test)]
pub(crate) mod tests;
pub(crate) mod window;

use crate::config::ReliabilityMode;
use crate::error::Result;
use crate::job::{Job, JobShared};
use crate::link::cma::CmaError;
use reach::Reach;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

use window::SharedBuf;

pub use crate::error::RmaError;
pub use access::{Combine, GetRequest, Rma, RmaStats, SharedMemory, Strided, Window};

/// Where the seed's three libraries ([`pvm`], [`rrmsg`], [`dmsg`]) spent their time, the
/// split of the seed's Figures 11-14: moving data, synchronizing, copying.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// Depositing or pulling data (puts, gets, the flush that completes them).
    pub transfer: std::time::Duration,
    /// Synchronizing: barriers, control messages, waiting for a peer's data, request,
    /// acknowledgement or credit.
    pub control: std::time::Duration,
    /// The library's own copies: into a send buffer, out of a system buffer.
    pub copy: std::time::Duration,
}

impl std::ops::AddAssign for Phases {
    fn add_assign(&mut self, o: Phases) {
        self.transfer += o.transfer;
        self.control += o.control;
        self.copy += o.copy;
    }
}

/// Adds the time `f` takes to `slot`.
fn timed<T>(slot: &std::cell::Cell<std::time::Duration>, f: impl FnOnce() -> T) -> T {
    let t = std::time::Instant::now();
    let r = f();
    slot.set(slot.get() + t.elapsed());
    r
}

/// A same-node peer endpoint whose memory a get reads: its rank, and its process as the
/// peer itself reported it (checked before it is trusted, see [`reach`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    pub rank: u32,
    pub pid: u32,
}

/// Where the bytes of a get lie in the peer's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Remote {
    /// At `offset` in the peer's shared buffer number `window` (one it allocated with
    /// [`SingleCopy::alloc_shared`]), read in place.
    Shared { window: u32, offset: u64 },
    /// At address `addr` of the peer's process, read by cross-memory attach; `split`: the
    /// peer offered to write part of the transfer itself ([`SingleCopy::offer_split`]).
    Memory { addr: u64, split: Option<Offer> },
}

/// A split copy a peer offered for one transfer: the slot of its board
/// ([`SingleCopy::offer_split`] returned it) and the number it gave the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    pub slot: u16,
    pub msg: u64,
}

/// How a get went (its errors are [`GetError`]s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Got {
    /// Every byte is in place, read from the peer's shared buffer.
    Shared,
    /// Every byte is in place, by cross-memory attach (some perhaps written by the peer:
    /// a split copy).
    Attached,
    /// Handed to the pull thread: [`SingleCopy::completed`] reports its end.
    Queued,
    /// Nothing was copied: neither path reaches the peer (no such shared buffer, attach
    /// refused or turned off, the peer is this very endpoint). The caller asks the peer
    /// to send the bytes.
    Unreachable,
}

/// Why a get failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GetError {
    /// The bytes asked for do not lie inside the peer's shared buffer.
    #[error(
        "bytes {offset}..+{len} lie outside shared buffer {window} of rank {rank} ({size} bytes)"
    )]
    OutOfBounds {
        rank: u32,
        window: u32,
        offset: u64,
        len: u64,
        size: usize,
    },
    /// Cross-memory attach failed for this transfer (a bad address, the peer gone...);
    /// a refusal for good is [`Got::Unreachable`] instead.
    #[error(transparent)]
    Attach(CmaError),
    /// The pull thread could not take the get.
    #[error(transparent)]
    Thread(crate::error::Error),
}

/// Bytes one endpoint moved in split copies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SingleCopyStats {
    /// Of this endpoint's gets, bytes that the peer wrote (split copies).
    pub written_by_peers: u64,
    /// Bytes this endpoint wrote into its peers' destinations (split copies).
    pub written_for_peers: u64,
    /// Pulls and split-copy writes refused because the peer named a process other than
    /// the one it proved to be ([`reach`]): nothing of that process was read or written.
    pub pids_refused: u64,
}

/// One endpoint's one-sided access to its same-node peers, and theirs to it.
pub(crate) struct SingleCopy {
    job: Arc<JobShared>,
    rank: u32,
    dpid: u16,
    /// Whether gets may use cross-memory attach (`QUIVER_CMA`).
    cma_on: bool,
    /// What is known of cross-memory attach and of which same-node peers it reaches
    /// (a probe of the nonce each endpoint publishes).
    reach: Reach,
    /// The pull thread, when the offload engine runs.
    puller: RefCell<Option<puller::Puller>>,
    /// Shared buffers: this endpoint's, and the peers' mapped here.
    windows: window::Windows,
    /// Whether large gets by attach are split copies (`QUIVER_SPLIT_COPY` and
    /// `QUIVER_CMA`); this endpoint's board (none if it could not be created).
    split_on: bool,
    board: RefCell<Option<split::Board>>,
    /// Peers' boards mapped here (`None`: could not be mapped; not tried again).
    peer_boards: RefCell<HashMap<u32, Option<split::Board>>>,
    /// This endpoint's offered split copies, until their transfers end.
    helping: RefCell<Vec<split::Helping>>,
    /// Off for good after a write into a peer failed (logged once).
    help_ok: Cell<bool>,
    stats: Cell<SingleCopyStats>,
}

impl SingleCopy {
    /// Sets up one-sided access for endpoint `dpid` of this rank: lets same-node peers
    /// attach to this process (where Yama asks for it: [`reach::permit_peers`]; with
    /// cross-memory attach on), publishes the nonce they probe,
    /// creates the split-copy board and, with the offload engine, starts the pull thread.
    pub(crate) fn open(job: &Job, dpid: u16) -> Result<SingleCopy> {
        let cfg = job.config();
        // Where Yama restricts ptrace to descendants, let the job's same-node peers read
        // and write our buffers: the one peer process by name, any process of this user
        // only when there are several; where Yama forbids attach, turn it off. Nothing
        // is changed with `QUIVER_CMA=off`.
        let cma_on = cfg.cma && reach::permit_peers(&job.shared);
        // What a peer reading from us checks first.
        let reach = Reach::publish(&job.shared.kv, job.rank(), dpid)?;
        let split_on = cfg.split_copy && cma_on;
        let board = if split_on {
            split::Board::create(job.shared.job_id, job.rank(), dpid)
                .map_err(|e| tracing::debug!("split-copy board: {e}; pulls are not split"))
                .ok()
        } else {
            None
        };
        let puller = if cfg.reliability == ReliabilityMode::Offload {
            Some(puller::Puller::start(cfg.offload_cpu)?)
        } else {
            None
        };
        Ok(SingleCopy {
            rank: job.rank(),
            dpid,
            cma_on,
            reach,
            puller: RefCell::new(puller),
            windows: window::Windows::new(job.shared.job_id, job.rank()),
            split_on,
            board: RefCell::new(board),
            peer_boards: RefCell::new(HashMap::new()),
            helping: RefCell::new(Vec::new()),
            help_ok: Cell::new(true),
            stats: Cell::new(SingleCopyStats::default()),
            job: job.shared.clone(),
        })
    }

    /// Allocates a shared buffer of `len` bytes, zero-filled, that same-node peers read
    /// in place ([`Remote::Shared`]); freed when dropped.
    pub(crate) fn alloc_shared(&self, len: usize) -> Result<SharedBuf<'_>> {
        self.windows.alloc(len)
    }

    /// How a peer names `data`, bytes of this process: inside one of this endpoint's
    /// shared buffers, or at their address (the peer reads them by attach).
    pub(crate) fn locate(&self, data: &[u8]) -> Remote {
        match self.windows.locate(data) {
            Some((window, offset)) => Remote::Shared { window, offset },
            None => Remote::Memory {
                addr: data.as_ptr() as u64,
                split: None,
            },
        }
    }

    /// Whether gets are under way on the pull thread (their completions come from a
    /// thread: poll [`SingleCopy::completed`], do not block on the endpoint).
    #[inline]
    pub(crate) fn busy(&self) -> bool {
        self.puller.borrow().as_ref().is_some_and(|p| p.pending > 0)
    }

    /// What this endpoint moved in split copies so far.
    pub(crate) fn stats(&self) -> SingleCopyStats {
        SingleCopyStats {
            pids_refused: self.reach.refused(),
            ..self.stats.get()
        }
    }

    fn count(&self, f: impl FnOnce(&mut SingleCopyStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Whether cross-memory attach reads and writes the memory of `rank` at `pid`: `pid`
    /// must be the process that rank proved to be by the nonce it published (read once
    /// per rank; later a comparison). Another pid is refused and counted.
    fn reaches(&self, rank: u32, pid: u32) -> bool {
        self.reach.reaches(&self.job.kv, rank, pid)
    }
}
