//! One-sided access to windows: the deposit seed's put (deposit) and get (fetch), and
//! 64-bit remote atomics (LCI's fetch-and-add), with remote completion by flush.
//!
//! Every process of a job opens [`Rma`] on the same DPID and allocates its windows in
//! the same order ([`Rma::allocate`]): window `n` of every rank is one window of the
//! job, each rank's part of its own length (as `MPI_Win_allocate`). A remote address
//! is (rank, window, offset). A window is memory of the node's shared pool
//! ([`Rma::allocate`]), or memory a process owns and hands over ([`Rma::register`],
//! below), so:
//!
//! - a rank of the **same node** reads, writes and updates an allocated window directly
//!   (a copy into or out of the mapped window, a CPU atomic on its word): the target's
//!   CPU takes no part, as the T3D's deposit engine (registered memory: below);
//! - a rank of **another node** sends requests that the target's side of the protocol
//!   (`serve`) applies where progress runs: on the offload engine's thread when it runs
//!   (`QUIVER_RELIABILITY=offload`: the target application may compute or sleep), else
//!   inside the target's next call of its [`Rma`] (or of a barrier that makes progress
//!   on it). A put is cut into pieces of one frame each, so every piece is copied into
//!   the window from where its frame arrived (no reassembly copy), handed to the link
//!   64 at a time (they leave as runs, not frame by frame); a get is answered in
//!   such pieces too (the station sends an outbox's pieces to a peer together), each copied from its frame into the caller's buffer, and a large
//!   one is asked two chunks at a time (the next when one has arrived), so the target
//!   never has more than two chunks of it to send. Puts smaller than a frame to the same rank are combined into one
//!   message as far as they fit, and leave when the next does not fit or at the next
//!   request that is not such a put (a flush, a get, an atomic, a notify, a barrier,
//!   any wait): a DMSG transpose's column pieces share frames.
//!
//! Registered memory stays where the application had it: same-node ranks put and get
//! contiguous bytes by cross-memory attach (to the process the rank proved to be,
//! `reach`; where the kernel refuses, as messages), and send atomics, counters and
//! strided or indexed layouts to the target's engine as other nodes do.
//!
//! Atomics on a word are atomic with respect to each other whoever issues them: every
//! path ends in the same CPU atomic on the window's word.
//!
//! Completion: a put returns once its source may be reused (the bytes are in the
//! window, or in the rings and channels towards it); [`Rma::flush`] returns once every
//! put to that rank is applied in its window (and reports puts it refused); a get and
//! an atomic return with their result.
//!
//! Order: requests to one rank are applied in the order they were issued, so a get or a
//! flush sees every put issued before it. A get started with [`Rma::get_start`] and not
//! yet complete may or may not see a put, atomic or counted put issued after it to the
//! same bytes (its later chunks are asked later): wait for the get first, as MPI asks
//! between conflicting accesses.
//!
//! Checks: the window's length comes with its key (published in the job's store when
//! it is allocated, fetched once per rank and window), so a range outside it is an
//! [`RmaError::OutOfBounds`] at the origin, before anything is sent; the target checks
//! every request again (number, generation, bounds, alignment) and never touches memory
//! outside its windows. Frames of other jobs never reach the protocol (the engine
//! drops them), and window objects are the job user's (mode 0600).
//!
//! Freeing: [`Rma::free`] is collective (flush, barrier, then every part goes, and
//! registered memory comes back). A [`Window`] dropped is gone at once for requests
//! from other nodes that arrive after (they are refused); a same-node rank that still
//! writes an allocated one writes into pages nobody reads any more (a registered one's
//! buffer is leaked for that reason). Free a window only when no rank accesses it any more
//! (after a barrier), as `MPI_Win_free` does: then every rank frees its part, and each
//! forgets its mappings of the others' parts at its next operation.

use super::memory::WindowMemory;
use super::reach::Reach as Proofs;
use super::serve::{self, Exposure, Landing, LentBytes, OnState, Pending, Served, State};
use super::window::{SharedObject, PUBLISHED_IDS};
use crate::addr::Source;
use crate::config::WaitMode;
use crate::dm::Endpoint;
use crate::engine::protocol::Outbox;
use crate::engine::station::{drive_rearming, Footing};
use crate::error::{Error, Result, RmaError};
use crate::job::Job;
use crate::link::cma::Piece;
use crate::link::Transport;
use crate::FastMap;
use std::borrow::Cow;
use std::cell::{Cell, OnceCell, RefCell};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::barrier::{tree_children, tree_parent, Area, Plan, AREA_IDS};
use super::layout::{self, copy_elements, Layout};
use super::ops::{self, At, AtomicOp, Status};
use super::reduce::{self, Element, Reduce};

/// Shared-object numbers of windows: `WINDOW_IDS | n`, `n` counted per process.
const WINDOW_IDS: u32 = PUBLISHED_IDS | 1 << 29;
/// Looks at a shared line before a barrier's waiter on an oversubscribed node waits as
/// any other wait does.
const SHARED_LOOKS: u32 = 4096;
/// Rounds of the endpoint one [`Rma::progress`] makes at most.
const PROGRESS_ROUNDS: usize = 64;
/// Windows a process may allocate in its life (numbers above are the barrier areas').
const MAX_WINDOWS: u32 = 1 << 28;
/// The piece of a put or get when the route has no frame size (a same-node rank's
/// registered window, an offload route the engine has not set up in time): the engine
/// reassembles larger ones.
const DEFAULT_PIECE: usize = 8 << 10;
/// Pieces of a long put handed to the link at once ([`Rma::send_pieces`]).
const PUT_BATCH: usize = 64;

/// One side of a strided transfer: `count` elements of `elem` bytes, element `i` at byte
/// `offset + i * stride` of the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    /// Where the first element starts.
    pub offset: u64,
    /// Bytes from one element's start to the next's.
    pub stride: u64,
    /// Bytes per element.
    pub elem: u64,
    /// Elements.
    pub count: u64,
}

impl Strided {
    fn layout(self) -> Layout<'static> {
        Layout::Strided {
            offset: self.offset,
            stride: self.stride,
            elem: self.elem,
            count: self.count,
        }
    }
}

/// How [`Rma::combine`] combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// The sum (wrapping).
    Sum,
    /// The largest.
    Max,
    /// The smallest.
    Min,
    /// Bitwise and (all ranks agree: all ones).
    And,
    /// Bitwise or (some rank says so).
    Or,
}

impl Combine {
    fn apply(self, a: u64, b: u64) -> u64 {
        match self {
            Combine::Sum => a.wrapping_add(b),
            Combine::Max => a.max(b),
            Combine::Min => a.min(b),
            Combine::And => a & b,
            Combine::Or => a | b,
        }
    }
}

/// Counters of a process's one-sided operations (both as origin and as target).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RmaStats {
    /// Puts this rank issued.
    pub puts: u64,
    /// Gets this rank issued.
    pub gets: u64,
    /// Atomics this rank issued.
    pub atomics: u64,
    /// Accumulates (and elements' compare-and-swaps) this rank issued.
    pub accumulates: u64,
    /// Of them, the operations done directly on a same-node window (no message).
    pub direct: u64,
    /// Put messages this rank's windows took from other nodes.
    pub puts_applied: u64,
    /// Gets, atomics and accumulates this rank served for other ranks.
    pub served: u64,
    /// Requests this rank refused (no such window, out of bounds, misaligned, an
    /// accumulate it cannot apply).
    pub refused: u64,
    /// Accumulates this rank answered busy: their lock word stayed taken while it
    /// tried (the origin asks again).
    pub busy: u64,
    /// Messages dropped because they were not well-formed requests or answers.
    pub malformed: u64,
}

/// Memory of the node's shared pool that windows are made of ([`Rma::alloc_memory`],
/// [`Rma::expose`]): this process reads and writes it as its own, and same-node ranks
/// reach the windows made of it directly. Its bytes may change at any time by other
/// ranks' puts and atomics once a window exposes them.
pub struct SharedMemory {
    obj: Arc<SharedObject>,
    object: u32,
}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemory")
            .field("len", &self.len())
            .finish()
    }
}

impl SharedMemory {
    /// The first byte (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.obj.ptr()
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.obj.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the memory mapped for the rest of the process's life, its name removed (no
    /// peer maps it again): for memory handed out to an application that may still use
    /// it after the library that gave it is gone (`MPI_Finalize` before `MPI_Free_mem`).
    pub fn leak(self) {
        self.obj.unlink();
        std::mem::forget(self);
    }

    /// Where `len` bytes at `ptr` start in this memory, if they lie inside it.
    pub fn offset_of(&self, ptr: *const u8, len: usize) -> Option<usize> {
        let start = (ptr as usize).checked_sub(self.as_ptr() as usize)?;
        (start.checked_add(len)? <= self.len()).then_some(start)
    }
}

/// A window of this rank: memory of the node's shared pool ([`Rma::allocate`]) or of
/// this process ([`Rma::register`]) that the job's ranks read and write with [`Rma`].
/// Its bytes may change at any time by other ranks' puts and atomics: reach them through [`Window::read`], [`Window::write`] and
/// [`Window::word`], or a raw pointer ([`Window::as_ptr`]).
pub struct Window {
    number: u32,
    generation: u32,
    mem: Arc<WindowMemory>,
    state: Arc<Mutex<State>>,
    /// Windows freed, counted for the `Rma` (which then reads `State::freed`).
    freed: Arc<AtomicU32>,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("number", &self.number)
            .field("len", &self.len())
            .finish()
    }
}

impl Window {
    /// Its number: the same window on every rank.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Its length here.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its first byte (page-aligned for an allocated window, 8-byte aligned for a
    /// registered one, where it was put for a part of shared memory or lent memory),
    /// for code that lays its own data out in it.
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.ptr()
    }

    /// Copies the bytes at `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        // SAFETY: offset + len <= the mapping's length (checked); other ranks' writes
        // to the same bytes meanwhile are the application's race (the bytes read are
        // then unspecified), never a read outside the window.
        unsafe { crate::link::copy_bytes(self.mem.ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `data` to `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: as in `read`, the other way.
        unsafe { crate::link::copy_bytes(data.as_ptr(), self.mem.ptr().add(offset), data.len()) };
        Ok(())
    }

    /// The 64-bit word at `offset` (8-byte aligned), as the remote atomics see it.
    pub fn word(&self, offset: usize) -> Result<&AtomicU64> {
        self.check(offset, 8)?;
        if !aligned(self.mem.ptr(), offset as u64) {
            return Err(Error::Rma(RmaError::Misaligned {
                rank: u32::MAX,
                window: self.number,
                offset: offset as u64,
            }));
        }
        // SAFETY: in bounds and the word's address aligned (both checked), and alive as
        // long as `self`.
        Ok(unsafe { &*(self.mem.ptr().add(offset) as *const AtomicU64) })
    }

    /// The whole window, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.read(0, &mut v).expect("the whole window is in bounds");
        v
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(Error::Rma(RmaError::OutOfBounds {
                rank: u32::MAX,
                window: self.number,
                offset: offset as u64,
                len: len as u64,
                size: self.len() as u64,
            }));
        }
        Ok(())
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // Requests that arrive from now on are refused; the object goes with the last
        // reference (a request being applied holds none: the state's lock is held).
        let mut s = serve::lock(&self.state);
        s.exposed.remove(&self.number);
        s.freed.push(self.number);
        drop(s);
        self.freed.fetch_add(1, Ordering::Release);
    }
}

/// Whether the word at `offset` of memory starting at `base` is 8-byte aligned (a window
/// may start anywhere: a part of shared memory, lent memory).
pub(crate) fn aligned(base: *const u8, offset: u64) -> bool {
    (base as u64).wrapping_add(offset).is_multiple_of(8)
}

/// What an origin knows of another rank's window: its object (0: memory the rank
/// registered, at `addr` in process `pid`; else the window starts at byte `addr` of
/// the object), generation and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    object: u32,
    generation: u32,
    len: u64,
    pid: u32,
    addr: u64,
}

impl Key {
    fn is_registered(&self) -> bool {
        self.pid != 0
    }

    fn encode(&self) -> String {
        if self.is_registered() || self.addr != 0 {
            format!(
                "{}/{}/{}/{}/{}",
                self.object, self.generation, self.len, self.pid, self.addr
            )
        } else {
            format!("{}/{}/{}", self.object, self.generation, self.len)
        }
    }

    fn parse(s: &str) -> Option<Key> {
        let mut it = s.split('/').map(str::parse::<u64>);
        let mut k = Key {
            object: u32::try_from(it.next()?.ok()?).ok()?,
            generation: u32::try_from(it.next()?.ok()?).ok()?,
            len: it.next()?.ok()?,
            pid: 0,
            addr: 0,
        };
        if let Some(pid) = it.next() {
            // A pid: registered memory at `addr` of that process; none (0): the window
            // starts at `addr` of its shared object.
            k.pid = u32::try_from(pid.ok()?).ok()?;
            k.addr = it.next()?.ok()?;
            // The window's bytes must fit the address space (or the object).
            k.addr.checked_add(k.len)?;
        }
        it.next().is_none().then_some(k)
    }
}

/// How one operation reaches its window.
enum Path {
    /// The window's first byte, mapped here (own windows, same-node shared ones).
    Direct(*mut u8),
    /// Messages on `route` that the target applies, at most `piece` bytes each.
    Messages { route: usize, piece: usize },
}

/// How this rank reaches another for one-sided operations.
#[derive(Clone, Copy)]
enum Reach {
    /// Through its endpoint: route index, and the longest piece per message.
    Messages { route: usize, piece: usize },
    /// Directly, in the node's shared memory.
    Direct,
}

/// A get in flight ([`Rma::get_start`]): it owns the buffer until the answer is in.
/// Dropped before it completes, the get is forgotten and its buffer freed (what was
/// asked of its answer arrives all the same, at most two chunks of a large one, and is
/// dropped and counted as malformed, as any answer to a request nobody waits for).
#[must_use = "a get's data comes back from `wait`"]
pub struct GetRequest<'r> {
    rma: &'r Rma,
    buf: Vec<u8>,
    /// The request asked of another node, while its answer is not taken.
    waiting: Option<Asked>,
}

/// What a [`GetRequest`] asked for, to match and explain the answer.
struct Asked {
    id: u64,
    rank: u32,
    at: At,
    len: u64,
    size: u64,
}

impl GetRequest<'_> {
    /// Whether the data is in (making progress once if not).
    pub fn test(&mut self) -> Result<bool> {
        let Some(asked) = &self.waiting else {
            return Ok(true);
        };
        let done = |rma: &Rma| {
            serve::lock(&rma.state)
                .pending
                .get(&asked.id)
                .is_some_and(|(_, p)| p.done())
        };
        if done(self.rma) {
            return Ok(true);
        }
        self.rma.poll()?;
        Ok(done(self.rma))
    }

    /// Waits for the data (making progress meanwhile) and gives the buffer back.
    pub fn wait(mut self) -> Result<Vec<u8>> {
        let Some(asked) = self.waiting.take() else {
            return Ok(std::mem::take(&mut self.buf));
        };
        let answer = self.rma.wait_for(asked.id);
        if answer.is_err() {
            serve::lock(&self.rma.state).pending.remove(&asked.id);
        }
        match answer? {
            Pending::Get {
                buf,
                status: Status::Done,
                ..
            } => Ok(buf.into_vec()),
            Pending::Get { status, .. } => {
                Err(refusal(status, asked.rank, asked.at, asked.len, asked.size))
            }
            _ => Err(Error::Rma(RmaError::BadAnswer { rank: asked.rank })),
        }
    }
}

impl Drop for GetRequest<'_> {
    fn drop(&mut self) {
        if let Some(asked) = self.waiting.take() {
            serve::lock(&self.rma.state).pending.remove(&asked.id);
        }
    }
}

/// Removes pending request `id` when dropped: a blocking get that lent its caller's
/// memory ([`Landing::Lent`]) takes it back so on every way out, an error or a panic
/// included, and an answer that comes later is dropped instead of written.
struct Forget<'r> {
    rma: &'r Rma,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        serve::lock(&self.rma.state).pending.remove(&self.id);
    }
}

impl std::fmt::Debug for GetRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GetRequest")
            .field("done", &self.waiting.is_none())
            .finish()
    }
}

/// One process's one-sided operations on DPID `dpid` (module documentation).
pub struct Rma {
    ep: Endpoint,
    state: Arc<Mutex<State>>,
    out: RefCell<Outbox>,
    // Looked up on every operation: the fast hasher (a SipHash lookup costs as much as
    // a same-node 8-byte put).
    keys: RefCell<FastMap<(u32, u32), Key>>,
    /// Same-node windows mapped here, by (rank, object).
    mapped: RefCell<FastMap<(u32, u32), Arc<SharedObject>>>,
    reach: RefCell<FastMap<u32, Reach>>,
    /// Routes of messages to ranks (other nodes', and same-node ranks' with registered
    /// windows), with the longest piece per message.
    routes: RefCell<FastMap<u32, (usize, usize)>>,
    /// The processes same-node ranks proved to be, for cross-memory attach.
    proofs: Proofs,
    /// Whether cross-memory attach may be used (`QUIVER_CMA`), and whether this process
    /// let its same-node peers attach to it (done at the first registration).
    config_cma: bool,
    permitted: Cell<bool>,
    /// Ranks this rank sent puts to since their last flush.
    unflushed: RefCell<BTreeSet<u32>>,
    /// Small puts to one rank waiting to leave as one message.
    combining: RefCell<Combining>,
    next_window: Cell<u32>,
    next_id: Cell<u64>,
    wait: Cell<WaitMode>,
    stats: RefCell<RmaStats>,
    /// This rank's windows freed so far, and how many of them the keys and mappings
    /// here have forgotten.
    freed: Arc<AtomicU32>,
    freed_seen: Cell<u32>,
    /// The barrier's plan and node area, made at the first barrier.
    barrier: OnceCell<Barrier>,
    /// Combining episodes done.
    combined: Cell<u64>,
}

/// Small puts to `rank` on `route` waiting to leave as one message (`ops::combined`):
/// `buf` holds the header and `parts` parts, or nothing.
#[derive(Default)]
struct Combining {
    rank: u32,
    route: usize,
    buf: Vec<u8>,
    parts: u32,
}

impl Drop for Rma {
    fn drop(&mut self) {
        // Puts waiting to be combined were promised to leave.
        if let Err(e) = self.push_combined() {
            tracing::warn!("one-sided puts not sent when their endpoint closed: {e}");
        }
    }
}

/// This rank's barrier: its plan, the node's area (when the node has other ranks), and
/// the episodes done.
struct Barrier {
    plan: Plan,
    area: Option<Area>,
    /// The route to the node's leader (from its other ranks), connected when the
    /// barrier was made (the leader's published area shows its endpoint is open): the
    /// last arrival rings its doorbell when the leader releases.
    leader_route: Option<usize>,
    /// Routes to the node's other ranks, connected by the first rank to release the
    /// node once every rank was inside the barrier (none had closed its endpoint yet;
    /// once released, a rank may close it and no connection could be made after).
    neighbours: RefCell<Vec<usize>>,
    episode: Cell<u64>,
}

impl Rma {
    /// Opens this process's one-sided endpoint on `dpid` (every rank of the job opens
    /// one on the same DPID). With the offload engine, requests from other nodes are
    /// served on its thread.
    pub fn open(job: &Job, dpid: u16) -> Result<Rma> {
        let size = job.size();
        let mut state = State::default();
        // A barrier has at most ceil(log2 size) rounds.
        state.max_rounds = (32 - size.saturating_sub(1).leading_zeros()) as u8;
        state.max_answer = Some(job.config().max_message);
        let state = Arc::new(Mutex::new(state));
        let ep = if job.can_serve() {
            let served = Box::new(Served {
                state: state.clone(),
            });
            job.open_serving(dpid, served)?
        } else {
            job.open(dpid)?
        };
        // What a same-node rank attaching to registered memory here checks first.
        let proofs = Proofs::publish(&job.shared.kv, job.rank(), dpid)?;
        Ok(Rma {
            ep,
            state,
            proofs,
            config_cma: job.config().cma,
            permitted: Cell::new(false),
            routes: RefCell::new(FastMap::default()),
            out: RefCell::new(Outbox::new(usize::MAX)),
            keys: RefCell::new(FastMap::default()),
            mapped: RefCell::new(FastMap::default()),
            reach: RefCell::new(FastMap::default()),
            unflushed: RefCell::new(BTreeSet::new()),
            combining: RefCell::new(Combining::default()),
            next_window: Cell::new(0),
            next_id: Cell::new(1),
            wait: Cell::new(job.config().wait),
            stats: RefCell::new(RmaStats::default()),
            freed: Arc::new(AtomicU32::new(0)),
            freed_seen: Cell::new(0),
            barrier: OnceCell::new(),
            combined: Cell::new(0),
        })
    }

    /// The endpoint the operations go through.
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// How waits wait (by default as `QUIVER_WAIT` says: the job's configuration).
    pub fn set_wait(&self, mode: WaitMode) {
        self.wait.set(mode);
    }

    /// Allocates this rank's part of the job's next window: `len` zeroed bytes of the
    /// node's shared pool. Every rank allocates its windows in the same order (window
    /// `n` of every rank is one window); a rank's window is reachable by the others as
    /// soon as it returns (an access to a window its target has not allocated yet waits
    /// for it, up to the job's connect timeout, `QUIVER_CONNECT_TIMEOUT`, then fails
    /// with [`RmaError::NoWindow`]).
    pub fn allocate(&self, len: usize) -> Result<Window> {
        let memory = self.alloc_memory(len)?;
        self.expose(&memory, 0, len)
    }

    /// `len` zeroed bytes of the node's shared pool that windows are made of later, in
    /// whole or in parts ([`Rma::expose`]): what `MPI_Alloc_mem` hands out, so that a
    /// window the application makes on it later is reached directly by same-node
    /// ranks. No other rank takes part. The memory stays as long as this value or a
    /// window on it does.
    pub fn alloc_memory(&self, len: usize) -> Result<SharedMemory> {
        static OBJECTS: AtomicU32 = AtomicU32::new(0);
        let n = OBJECTS.fetch_add(1, Ordering::Relaxed);
        if n >= MAX_WINDOWS {
            return Err(Error::Config(format!(
                "this process allocated {MAX_WINDOWS} shared windows or memories"
            )));
        }
        let job = self.ep.station().job();
        let object = WINDOW_IDS | n;
        let obj = SharedObject::create(job.job_id, job.rank, object, len, true)?;
        Ok(SharedMemory {
            obj: Arc::new(obj),
            object,
        })
    }

    /// Makes `len` bytes at `offset` of `memory` this rank's part of the job's next
    /// window (as [`Rma::allocate`], in the same order on every rank). Same-node ranks
    /// reach it directly, as an allocated window. Several windows may share one
    /// memory, overlapping or not. Atomics need their words 8-byte aligned in memory
    /// (an `offset` that is not a multiple of 8 moves them: they are refused as
    /// [`RmaError::Misaligned`]).
    pub fn expose(&self, memory: &SharedMemory, offset: usize, len: usize) -> Result<Window> {
        if offset.checked_add(len).is_none_or(|end| end > memory.len()) {
            return Err(Error::Config(format!(
                "bytes {offset}..+{len} lie outside the shared memory ({} bytes)",
                memory.len()
            )));
        }
        let mem = WindowMemory::Shared {
            obj: memory.obj.clone(),
            offset,
            len,
        };
        self.expose_memory(mem, memory.object, offset as u64)
    }

    /// Makes `memory`, which this process owns, this rank's part of the job's next
    /// window (as [`Rma::allocate`], in the same order on every rank; the others may
    /// allocate theirs). Its bytes stay where they are: ranks of other nodes reach them
    /// through this rank's engine, same-node ranks by cross-memory attach for puts and
    /// gets (or through the engine where the kernel refuses attach) and through the
    /// engine for atomics, counters and strided or indexed layouts, so that every
    /// atomic on a word is one CPU atomic here. The buffer must be 8-byte aligned
    /// (every allocation of 8 bytes or more from the system allocator is). Get it back
    /// with [`Rma::free`]; a registered window dropped otherwise leaks its buffer
    /// (another rank could still be writing it).
    pub fn register(&self, memory: Vec<u8>) -> Result<Window> {
        if !memory.is_empty() && !(memory.as_ptr() as usize).is_multiple_of(8) {
            return Err(Error::Config(
                "a registered window must be 8-byte aligned (its words are atomic)".into(),
            ));
        }
        self.register_memory(WindowMemory::register(memory))
    }

    /// [`Rma::register`] for `len` bytes at `ptr` that the caller only lends (an MPI
    /// library's `MPI_Win_create` on the application's buffer): they are never freed
    /// here. They need not be aligned; atomics need their words 8-byte aligned in memory
    /// (others are refused as [`RmaError::Misaligned`]).
    ///
    /// # Safety
    ///
    /// The bytes stay allocated, in place, and are read and written by nothing but
    /// atomics and raw copies (the job's ranks write them at any time) until the window
    /// is dropped and no rank accesses it any more (after [`Rma::free`], or a barrier
    /// of the ranks that use it once the window is dropped).
    pub unsafe fn register_borrowed(&self, ptr: *mut u8, len: usize) -> Result<Window> {
        // SAFETY: the caller's promise, passed on.
        self.register_memory(unsafe { WindowMemory::borrowed(ptr, len) })
    }

    fn register_memory(&self, mem: WindowMemory) -> Result<Window> {
        // Same-node ranks attach to this process to reach the memory: let them (where
        // Yama asks for it), once, at the first registration.
        if self.config_cma && !self.permitted.get() {
            super::reach::permit_peers(self.ep.station().job());
            self.permitted.set(true);
        }
        let addr = mem.ptr() as usize as u64;
        self.expose_memory(mem, 0, addr)
    }

    /// The number this rank's next window takes.
    pub fn next_window_number(&self) -> u32 {
        self.next_window.get()
    }

    /// Makes this rank's next window take number `number` (at least
    /// [`Rma::next_window_number`]): windows of some of the job's ranks only (an MPI
    /// communicator's), whose ranks agree on a number none of them used yet.
    pub fn skip_window_numbers(&self, number: u32) -> Result<()> {
        if number < self.next_window.get() || number >= MAX_WINDOWS {
            return Err(Error::Config(format!(
                "window number {number} is taken (the next free one is {})",
                self.next_window.get()
            )));
        }
        self.next_window.set(number);
        Ok(())
    }

    /// Frees `window` once every rank is done with it, and gives registered memory
    /// back. Collective, in the same order on every rank (as `MPI_Win_free`): each
    /// flushes its puts, all meet in a barrier, then every part is gone (a request that
    /// still arrives is refused) and the memory is the application's again.
    ///
    /// A flush that reports refused puts does not stop the others: the window is freed
    /// all the same (its memory dropped) and the refusal returned. A failed barrier
    /// (a peer gone) leaves the window exposed no more and its memory leaked: a rank
    /// that did not reach the barrier could still be writing it.
    pub fn free(&self, window: Window) -> Result<Option<Vec<u8>>> {
        let flushed = self.flush_all();
        self.barrier()?;
        let mem = window.mem.clone();
        // Dropping the window takes it out of the served ones under the state's lock:
        // no request is being applied to it after this.
        drop(window);
        let back = mem.take_back();
        flushed.map(|()| back)
    }

    /// Exposes `mem` as this rank's part of the next window and publishes its key:
    /// `object` is the shared object it lies in (0 for registered memory), `addr` where
    /// it starts there (registered memory: its address in this process).
    fn expose_memory(&self, mem: WindowMemory, object: u32, addr: u64) -> Result<Window> {
        let station = self.ep.station();
        let job = station.job();
        let len = mem.len();
        let mem = Arc::new(mem);
        // Never 0, which no window has (a request for window 0 of generation 0 is
        // refused even where nothing was allocated).
        let generation = (crate::job::bootstrap::random_u64()? as u32).max(1);
        let number = self.next_window.get();
        self.next_window.set(number + 1);
        serve::lock(&self.state).exposed.insert(
            number,
            Exposure {
                mem: mem.clone(),
                generation,
            },
        );
        let key = Key {
            object,
            generation,
            len: len as u64,
            pid: if mem.is_registered() {
                std::process::id()
            } else {
                0
            },
            addr,
        };
        if let Err(e) = job
            .kv
            .put(&key_name(station.dpid(), job.rank, number), &key.encode())
        {
            serve::lock(&self.state).exposed.remove(&number);
            return Err(e);
        }
        Ok(Window {
            number,
            generation,
            mem,
            state: self.state.clone(),
            freed: self.freed.clone(),
        })
    }

    /// Copies `data` to `offset` of `window` at `rank`. Returns once `data` may be
    /// reused; [`Rma::flush`] says when it is in the window.
    pub fn put(&self, rank: u32, window: &Window, offset: u64, data: &[u8]) -> Result<()> {
        self.stats.borrow_mut().puts += 1;
        let (key, at) = self.address(rank, window, offset, data.len() as u64)?;
        match self.path(rank, window, key)? {
            Path::Direct(mem) => {
                // SAFETY: offset + len <= key.len <= the mapping's length (`address` and
                // `path` checked both); the mapping outlives this call (`path`).
                unsafe {
                    crate::link::copy_bytes(data.as_ptr(), mem.add(offset as usize), data.len())
                };
                self.stats.borrow_mut().direct += 1;
            }
            Path::Messages { .. } if self.attached_put(rank, key, offset, data) => {}
            Path::Messages {
                route,
                piece: frame,
            } => {
                // Before the first piece: a flush must ask even if a later piece fails.
                self.unflushed.borrow_mut().insert(rank);
                let piece = frame.saturating_sub(ops::PUT_LEN).max(1);
                if data.len() <= piece {
                    self.send_put(rank, route, frame, &ops::put(at), data)?;
                } else {
                    self.send_pieces(rank, route, piece, at, data)?;
                }
            }
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes at `offset` of `window` at `rank` into `dst`. Between
    /// nodes the answer lands in `dst` piece by piece: when the get fails half-way (the
    /// target refused a later chunk, its rank failed), the start of `dst` may hold
    /// bytes already and the rest is unchanged.
    pub fn get(&self, rank: u32, window: &Window, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.stats.borrow_mut().gets += 1;
        let (key, at) = self.address(rank, window, offset, dst.len() as u64)?;
        match self.path(rank, window, key)? {
            Path::Direct(mem) => {
                // SAFETY: offset + len <= key.len <= the mapping's length (`address` and
                // `path` checked both); the mapping outlives this call (`path`).
                unsafe {
                    crate::link::copy_bytes(mem.add(offset as usize), dst.as_mut_ptr(), dst.len())
                };
                self.stats.borrow_mut().direct += 1;
                Ok(())
            }
            Path::Messages { .. } if dst.is_empty() => Ok(()),
            Path::Messages { .. } if self.attached_get(rank, key, offset, dst) => Ok(()),
            Path::Messages { route, piece } => {
                let len = dst.len() as u64;
                // The answer lands in `dst` itself, lent to the pending get until
                // `Forget` has removed it (on every way out of this function).
                // SAFETY: `dst` is borrowed uniquely for the call and not touched here
                // until the pending get is removed.
                let landing = Landing::Lent(unsafe { LentBytes::new(dst) });
                let id = self.id();
                let _forget = Forget { rma: self, id };
                self.ask_get(id, rank, (route, piece), at, landing)?;
                match self.wait_for(id)? {
                    Pending::Get {
                        status: Status::Done,
                        ..
                    } => Ok(()),
                    Pending::Get { status, .. } => Err(refusal(status, rank, at, len, key.len)),
                    _ => Err(Error::Rma(RmaError::BadAnswer { rank })),
                }
            }
        }
    }

    /// Asks `rank` for the bytes at `at` as get `id`, to land in `landing`, over `route`
    /// in pieces of at most its frame (the pending get is in the state when this
    /// returns `Ok`; it is removed again when the request cannot be sent).
    fn ask_get(
        &self,
        id: u64,
        rank: u32,
        (route, piece): (usize, usize),
        at: At,
        landing: Landing,
    ) -> Result<()> {
        let piece = u32::try_from(piece.saturating_sub(ops::GOT_LEN).max(1)).unwrap_or(u32::MAX);
        let (pending, request) = Pending::get(id, landing, at, piece);
        serve::lock(&self.state).pending.insert(id, (rank, pending));
        if let Err(e) = self.send(rank, route, &request, &[]) {
            serve::lock(&self.state).pending.remove(&id);
            return Err(e);
        }
        Ok(())
    }

    /// Starts a get of `buf.len()` bytes at `offset` of `window` at `rank` into `buf`,
    /// and returns at once: the [`GetRequest`] gives `buf` back, filled, when the
    /// answer is complete (from a same-node window that is mapped here or reached by
    /// cross-memory attach it is at once; otherwise each piece of the answer lands in
    /// `buf` from where its frame arrived). Several gets may be in
    /// flight, to one rank or many; `buf` is owned meanwhile, so nothing else can touch
    /// it.
    pub fn get_start(
        &self,
        rank: u32,
        window: &Window,
        offset: u64,
        mut buf: Vec<u8>,
    ) -> Result<GetRequest<'_>> {
        self.stats.borrow_mut().gets += 1;
        let len = buf.len() as u64;
        let (key, at) = self.address(rank, window, offset, len)?;
        let waiting = match self.path(rank, window, key)? {
            Path::Direct(mem) => {
                // SAFETY: offset + len <= key.len <= the mapping's length (`address` and
                // `path` checked both); the mapping outlives this call (`path`).
                unsafe {
                    crate::link::copy_bytes(mem.add(offset as usize), buf.as_mut_ptr(), buf.len())
                };
                self.stats.borrow_mut().direct += 1;
                None
            }
            // Nothing to ask for (the address was checked).
            Path::Messages { .. } if buf.is_empty() => None,
            Path::Messages { .. } if self.attached_get(rank, key, offset, &mut buf) => None,
            Path::Messages { route, piece } => {
                let landing = Landing::Owned(std::mem::take(&mut buf));
                let id = self.id();
                self.ask_get(id, rank, (route, piece), at, landing)?;
                Some(Asked {
                    id,
                    rank,
                    at,
                    len,
                    size: key.len,
                })
            }
        };
        Ok(GetRequest {
            rma: self,
            buf,
            waiting,
        })
    }

    /// Copies the elements of `src` (element `i` at `i * src_stride` in `src`) to the
    /// strided layout `dst` of `window` at `rank`: a 2-D block (`elem` a row), a column
    /// of a matrix (`elem` one value), any one-level stride. Other nodes get the
    /// elements packed, a frame's worth per request, and scatter them on arrival;
    /// completion as [`Rma::put`].
    pub fn put_strided(
        &self,
        rank: u32,
        window: &Window,
        dst: Strided,
        src: &[u8],
        src_stride: u64,
    ) -> Result<()> {
        let local = Layout::Strided {
            offset: 0,
            stride: src_stride,
            elem: dst.elem,
            count: dst.count,
        };
        self.put_layout(rank, window, dst.layout(), src, local)
    }

    /// Copies the elements of the strided layout `src` of `window` at `rank` into `dst`,
    /// element `i` at `i * dst_stride`.
    pub fn get_strided(
        &self,
        rank: u32,
        window: &Window,
        src: Strided,
        dst: &mut [u8],
        dst_stride: u64,
    ) -> Result<()> {
        let local = Layout::Strided {
            offset: 0,
            stride: dst_stride,
            elem: src.elem,
            count: src.count,
        };
        self.get_layout(rank, window, src.layout(), dst, local)
    }

    /// Copies `elem` bytes at each of `src_offsets` in `src` to the same-numbered offset
    /// of `dst_offsets` in `window` at `rank` (the lists have one length).
    pub fn put_indexed(
        &self,
        rank: u32,
        window: &Window,
        dst_offsets: &[u64],
        src: &[u8],
        src_offsets: &[u64],
        elem: u64,
    ) -> Result<()> {
        let remote = Layout::Indexed {
            offsets: dst_offsets,
            elem,
        };
        let local = Layout::Indexed {
            offsets: src_offsets,
            elem,
        };
        self.put_layout(rank, window, remote, src, local)
    }

    /// Copies `elem` bytes at each of `src_offsets` in `window` at `rank` to the
    /// same-numbered offset of `dst_offsets` in `dst`.
    pub fn get_indexed(
        &self,
        rank: u32,
        window: &Window,
        src_offsets: &[u64],
        dst: &mut [u8],
        dst_offsets: &[u64],
        elem: u64,
    ) -> Result<()> {
        let remote = Layout::Indexed {
            offsets: src_offsets,
            elem,
        };
        let local = Layout::Indexed {
            offsets: dst_offsets,
            elem,
        };
        self.get_layout(rank, window, remote, dst, local)
    }

    /// [`Rma::put`], then adds 1 to the 64-bit word at `counter` (8-byte aligned) of the
    /// same window, once the data is in place: the target counts arrivals with
    /// [`Rma::wait_counter`] and needs no other message (the deposit seed's implicit
    /// synchronization; SHMEM's put-with-signal).
    pub fn put_notify(
        &self,
        rank: u32,
        window: &Window,
        offset: u64,
        data: &[u8],
        counter: u64,
    ) -> Result<()> {
        let (key, at) = self.address(rank, window, counter, 8)?;
        if !counter.is_multiple_of(8) {
            return Err(refusal(Status::Misaligned, rank, at, 8, key.len));
        }
        // An empty put is only the count: an acknowledgement.
        if !data.is_empty() {
            self.put(rank, window, offset, data)?;
        }
        match self.path(rank, window, key)? {
            Path::Direct(mem) if !aligned(mem, counter) => {
                return Err(refusal(Status::Misaligned, rank, at, 8, key.len));
            }
            Path::Direct(mem) => {
                // SAFETY: counter + 8 <= the mapping's length, the word's address
                // 8-aligned (both checked); the mapping outlives this call (`path`).
                let word = unsafe { &*(mem.add(counter as usize) as *const AtomicU64) };
                // Release: the target that sees the count sees the data.
                word.fetch_add(1, Ordering::Release);
                // A target asleep in `wait_counter` is woken as a message would wake it.
                if rank != self.ep.station().job().rank {
                    let station = self.ep.station();
                    let route = station
                        .connect(Source {
                            rank,
                            dpid: station.dpid(),
                        })
                        .map_err(|e| self.ep.report(e))?;
                    station.wake(route);
                }
            }
            Path::Messages { route, .. } => {
                self.send(rank, route, &ops::notify(at, 1), &[])?;
            }
        }
        Ok(())
    }

    /// Waits until the word at `counter` of this rank's `window` has counted `n`
    /// arrivals ([`Rma::put_notify`]) and takes them off, making progress meanwhile
    /// (requests that came as messages are applied by it without the offload engine).
    pub fn wait_counter(&self, window: &Window, counter: u64, n: u64) -> Result<()> {
        let word = window.word(counter as usize)?;
        let take = || {
            word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(n))
                .is_ok()
        };
        loop {
            if take() {
                return Ok(());
            }
            if self.poll()? {
                continue;
            }
            let ready = || {
                let busy = self.poll()?;
                Ok((busy || word.load(Ordering::Acquire) >= n).then_some(()))
            };
            self.ep
                .station()
                .wait_for_in(self.wait.get(), ready, None)?;
        }
    }

    /// A put of the elements of `local` (in `src`) to `remote` (in the window).
    fn put_layout(
        &self,
        rank: u32,
        window: &Window,
        remote: Layout,
        src: &[u8],
        local: Layout,
    ) -> Result<()> {
        self.stats.borrow_mut().puts += 1;
        let key = self.check_layouts(rank, window, remote, src.len(), local)?;
        let at = At {
            window: window.number,
            generation: key.generation,
            offset: 0,
        };
        if remote.count() == 0 || remote.elem() == 0 {
            return Ok(());
        }
        match self.path(rank, window, key)? {
            Path::Direct(mem) => {
                // Overlapping `src` with the window needs `Window::as_ptr`: the caller's.
                // SAFETY: `local` ends inside `src`, `remote` inside the window's mapping
                // (`check_layouts`), which outlives this call (`path`).
                unsafe { copy_elements(src.as_ptr(), local, mem, remote) };
                self.stats.borrow_mut().direct += 1;
            }
            Path::Messages { route, piece } => {
                self.unflushed.borrow_mut().insert(rank);
                let elem = remote.elem();
                let (head, per) = match remote {
                    Layout::Strided { .. } => (ops::STRIDED_LEN as u64, elem),
                    Layout::Indexed { .. } => (ops::INDEXED_LEN as u64, elem + 8),
                };
                let k = (piece as u64).saturating_sub(head) / per;
                if k == 0 {
                    // Elements longer than a frame: one contiguous put each.
                    let mut one = vec![0u8; elem as usize];
                    for i in 0..remote.count() {
                        let part = local.part(i, 1);
                        layout::copy_checked(src, part, &mut one, Layout::dense(elem, 1));
                        self.put(rank, window, remote.at(i), &one)?;
                    }
                    return Ok(());
                }
                let mut message = Vec::new();
                let mut from = 0;
                while from < remote.count() {
                    let n = k.min(remote.count() - from);
                    let part = remote.part(from, n);
                    message.clear();
                    match part {
                        Layout::Strided { offset, stride, .. } => message.extend_from_slice(
                            &ops::put_strided(At { offset, ..at }, stride, elem, n),
                        ),
                        Layout::Indexed { offsets, .. } => {
                            ops::put_indexed(at, elem, offsets, &mut message)
                        }
                    }
                    let start = message.len();
                    message.resize(start + (n * elem) as usize, 0);
                    layout::copy_checked(
                        src,
                        local.part(from, n),
                        &mut message[start..],
                        Layout::dense(elem, n),
                    );
                    self.send_put(rank, route, piece, &message, &[])?;
                    from += n;
                }
            }
        }
        Ok(())
    }

    /// A get of the elements of `remote` (in the window) into `local` (in `dst`).
    fn get_layout(
        &self,
        rank: u32,
        window: &Window,
        remote: Layout,
        dst: &mut [u8],
        local: Layout,
    ) -> Result<()> {
        self.stats.borrow_mut().gets += 1;
        let key = self.check_layouts(rank, window, remote, dst.len(), local)?;
        let at = At {
            window: window.number,
            generation: key.generation,
            offset: 0,
        };
        if remote.count() == 0 || remote.elem() == 0 {
            return Ok(());
        }
        match self.path(rank, window, key)? {
            Path::Direct(mem) => {
                // SAFETY: as in `put_layout`, the other way.
                unsafe { copy_elements(mem, remote, dst.as_mut_ptr(), local) };
                self.stats.borrow_mut().direct += 1;
                Ok(())
            }
            Path::Messages { route, piece } => {
                let elem = remote.elem();
                let answer = (piece.saturating_sub(ops::GOT_LEN) as u64).max(1);
                // Elements per request: its answer one piece, its offsets one frame.
                let k = match remote {
                    Layout::Strided { .. } => (answer / elem).max(1),
                    Layout::Indexed { .. } => (answer / elem)
                        .min((piece.saturating_sub(ops::INDEXED_GET_LEN) / 8) as u64)
                        .max(1),
                };
                let piece = u32::try_from(answer).unwrap_or(u32::MAX);
                let mut asked = Vec::new();
                let mut request = Vec::new();
                let mut from = 0;
                let mut first = None;
                while from < remote.count() {
                    let n = k.min(remote.count() - from);
                    let id = self.id();
                    serve::lock(&self.state).pending.insert(
                        id,
                        (
                            rank,
                            Pending::Get {
                                buf: Landing::Owned(vec![0; (n * elem) as usize]),
                                left: n * elem,
                                status: Status::Done,
                                asking: None,
                            },
                        ),
                    );
                    request.clear();
                    match remote.part(from, n) {
                        Layout::Strided { offset, stride, .. } => request.extend_from_slice(
                            &ops::get_strided(At { offset, ..at }, stride, elem, n, id, piece),
                        ),
                        Layout::Indexed { offsets, .. } => {
                            ops::get_indexed(at, elem, offsets, id, piece, &mut request)
                        }
                    }
                    if let Err(e) = self.send(rank, route, &request, &[]) {
                        serve::lock(&self.state).pending.remove(&id);
                        first = Some(e);
                        break;
                    }
                    asked.push((id, from, n));
                    from += n;
                }
                for (id, from, n) in asked {
                    match self.wait_for(id) {
                        Ok(Pending::Get {
                            buf,
                            status: Status::Done,
                            ..
                        }) => {
                            layout::copy_checked(
                                &buf.into_vec(),
                                Layout::dense(elem, n),
                                dst,
                                local.part(from, n),
                            );
                        }
                        Ok(Pending::Get { status, .. }) => {
                            let size = key.len;
                            first.get_or_insert(refusal(status, rank, at, n * elem, size));
                        }
                        Ok(_) => {
                            first.get_or_insert(Error::Rma(RmaError::BadAnswer { rank }));
                        }
                        Err(e) => {
                            serve::lock(&self.state).pending.remove(&id);
                            first.get_or_insert(e);
                        }
                    }
                }
                first.map_or(Ok(()), Err)
            }
        }
    }

    /// Checks a transfer's two layouts: the same elements, `local` inside a buffer of
    /// `len` bytes, `remote` inside the window at `rank` (its key's length).
    fn check_layouts(
        &self,
        rank: u32,
        window: &Window,
        remote: Layout,
        len: usize,
        local: Layout,
    ) -> Result<Key> {
        if (remote.elem(), remote.count()) != (local.elem(), local.count()) {
            return Err(Error::Rma(RmaError::BadLayout {
                reason: format!(
                    "{} elements of {} bytes there, {} of {} here",
                    remote.count(),
                    remote.elem(),
                    local.count(),
                    local.elem()
                ),
            }));
        }
        if local.end().is_none_or(|e| e > len as u64) {
            return Err(Error::Rma(RmaError::BadLayout {
                reason: format!("the local elements lie outside the buffer of {len} bytes"),
            }));
        }
        let key = self.key(rank, window)?;
        match remote.end() {
            Some(end) if end <= key.len => Ok(key),
            end => Err(Error::Rma(RmaError::OutOfBounds {
                rank,
                window: window.number,
                offset: 0,
                len: end.unwrap_or(u64::MAX),
                size: key.len,
            })),
        }
    }

    /// Waits until every rank of the job has called `barrier` as often as this one (the
    /// deposit seed's barrier between phases: module `barrier`): inside a node on two
    /// shared cache lines, across nodes a dissemination among the nodes' leaders with
    /// empty control messages. Makes progress meanwhile. It does not flush: flush the
    /// puts whose data must be in place after the barrier first (`flush_all`).
    pub fn barrier(&self) -> Result<()> {
        let b = match self.barrier.get() {
            Some(b) => b,
            None => {
                let made = self.make_barrier()?;
                self.barrier.get_or_init(|| made)
            }
        };
        let station = self.ep.station();
        let me = station.job().rank;
        let e = b.episode.get() + 1;
        {
            let mut s = serve::lock(&self.state);
            s.episode = e;
            // Rounds of episodes before this one were consumed or are stale.
            s.arrived.retain(|&(_, ep, _)| ep >= e);
        }
        let leader = b.plan.leader();
        let local_n = b.plan.local.len() as u64;
        let route_to = |rank: u32| {
            station
                .connect(Source {
                    rank,
                    dpid: station.dpid(),
                })
                .map_err(|e| self.ep.report(e))
        };
        let rounds = b.plan.rounds();
        let node = b.area.as_ref().map(|a| a.lines(local_n));
        if let Some(node) = &node {
            let last = node.arrive();
            // The node is the whole job: whoever arrives last releases it, at once (it
            // is running; the leader may be waiting for a core, and would cost a
            // context switch on an oversubscribed node). Otherwise the leader does,
            // after the rounds between nodes.
            let releases = if rounds == 0 { last } else { me == leader };
            if !releases {
                if let (true, Some(route)) = (last, b.leader_route) {
                    station.wake(route);
                }
                self.wait_shared(|| node.released(e))?;
                b.episode.set(e);
                return Ok(());
            }
            self.wait_shared(|| node.all_in())?;
            if b.neighbours.borrow().is_empty() {
                let mut routes = Vec::new();
                for &rank in b.plan.local.iter().filter(|&&r| r != me) {
                    routes.push(route_to(rank)?);
                }
                *b.neighbours.borrow_mut() = routes;
            }
        }
        for k in 0..rounds {
            let (to, from) = b.plan.partners(me, k);
            let route = route_to(to)?;
            self.send(to, route, &ops::barrier(k as u8, e), &[])?;
            self.wait_until(|| serve::lock(&self.state).arrived.remove(&(from, e, k as u8)))?;
        }
        if let Some(node) = &node {
            node.release(e);
            for &route in b.neighbours.borrow().iter() {
                station.wake(route);
            }
        }
        b.episode.set(e);
        Ok(())
    }

    /// Combines `value` from every rank with `op` and returns the result on every rank:
    /// up the binomial tree rooted at rank 0 and back down, 2(n-1) empty-sized control
    /// messages in 2 log n steps (the deposit seed's combining tree, D6), which a
    /// library uses instead of per-pair acknowledgements (every rank's "I am done with
    /// your buffer" in one value). Every rank calls it with the same `op`, in the same
    /// order as its other `combine` calls.
    pub fn combine(&self, value: u64, op: Combine) -> Result<u64> {
        let station = self.ep.station();
        let (me, size) = (station.job().rank, station.job().size);
        let e = self.combined.get() + 1;
        {
            let mut s = serve::lock(&self.state);
            s.combining = e;
            s.combined_up.retain(|&(_, ep), _| ep >= e);
            s.combined_down.retain(|&ep, _| ep >= e);
        }
        let route_to = |rank: u32| {
            station
                .connect(Source {
                    rank,
                    dpid: station.dpid(),
                })
                .map_err(|err| self.ep.report(err))
        };
        let mut v = value;
        let children: Vec<u32> = tree_children(me, size).collect();
        for &c in &children {
            let got = Cell::new(None);
            self.wait_until(|| {
                got.set(serve::lock(&self.state).combined_up.remove(&(c, e)));
                got.get().is_some()
            })?;
            v = op.apply(v, got.get().expect("waited for"));
        }
        let result = match tree_parent(me) {
            None => v,
            Some(parent) => {
                self.send(parent, route_to(parent)?, &ops::combine(true, e, v), &[])?;
                let got = Cell::new(None);
                self.wait_until(|| {
                    got.set(serve::lock(&self.state).combined_down.remove(&e));
                    got.get().is_some()
                })?;
                got.get().expect("waited for")
            }
        };
        for &c in &children {
            self.send(c, route_to(c)?, &ops::combine(false, e, result), &[])?;
        }
        self.combined.set(e);
        Ok(result)
    }

    /// The barrier's plan, and the node's area: made by the node's leader under a
    /// random number it publishes in the job's store, mapped by the others.
    fn make_barrier(&self) -> Result<Barrier> {
        let station = self.ep.station();
        let job = station.job();
        let forced_udp = job.config.transport == crate::config::TransportChoice::Udp;
        let plan = Plan::new(job.rank, job.size, |r| {
            (!forced_udp).then(|| job.nids[r as usize])
        });
        // Per opening of the DPID: an area a previous `Rma` on it left is never named.
        let key = format!(
            "rmabar/{}/{}/{}",
            station.dpid(),
            job.dpid_opening(station.dpid()),
            plan.leader()
        );
        let area = if plan.local.len() < 2 {
            None
        } else if plan.leader() == job.rank {
            let id = AREA_IDS | (crate::job::bootstrap::random_u64()? as u32 & ((1 << 28) - 1));
            let area = Area::create(job.job_id, job.rank, id)?;
            job.kv.put(&key, &id.to_string())?;
            Some(area)
        } else {
            // The key names this opening's area; it may not exist yet when the leader
            // is slow (the store's read waits for the key, not for the object).
            let deadline = std::time::Instant::now() + job.config.connect_timeout;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let id: u32 =
                    job.kv.get(&key, left)?.parse().map_err(|_| {
                        Error::Config(format!("{key}: not a barrier area's number"))
                    })?;
                match Area::open(job.job_id, plan.leader(), id) {
                    Ok(a) => break Some(a),
                    Err(e) if left.is_zero() => return Err(e),
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
                }
            }
        };
        let leader_route = if area.is_some() && plan.leader() != job.rank {
            let leader = Source {
                rank: plan.leader(),
                dpid: station.dpid(),
            };
            Some(station.connect(leader).map_err(|e| self.ep.report(e))?)
        } else {
            None
        };
        Ok(Barrier {
            plan,
            area,
            leader_route,
            neighbours: RefCell::new(Vec::new()),
            episode: Cell::new(0),
        })
    }

    /// [`Rma::wait_until`] for a condition on the node's shared lines: with more ranks
    /// than cores, a waiter that drove its endpoint on every look would hold the core
    /// that the rank it waits for needs, so it looks at the line, yields, and drives
    /// its endpoint only every few looks (requests from other ranks are still served);
    /// after a while it waits as `wait_until` does (which may sleep).
    fn wait_shared(&self, done: impl Fn() -> bool) -> Result<()> {
        if self.ep.station().oversubscribed() {
            for look in 0..SHARED_LOOKS {
                if done() {
                    return Ok(());
                }
                if look % 64 == 63 {
                    self.poll()?;
                }
                std::thread::yield_now();
            }
        }
        self.wait_until(done)
    }

    /// Makes progress until `done`, waiting as the wait mode says: woken by messages,
    /// and by the doorbell a same-node rank rings. `done` may consume what it found (a
    /// barrier round's message): once it says true it is not asked again.
    fn wait_until(&self, done: impl Fn() -> bool) -> Result<()> {
        loop {
            if done() {
                return Ok(());
            }
            if self.poll()? {
                continue;
            }
            let ready = || {
                if done() {
                    return Ok(Some(true));
                }
                Ok(self.poll()?.then_some(false))
            };
            if self
                .ep
                .station()
                .wait_for_in(self.wait.get(), ready, None)?
            {
                return Ok(());
            }
        }
    }

    /// Adds `value` to the 64-bit word at `offset` (8-byte aligned) of `window` at
    /// `rank`, atomically; returns the word's value before.
    pub fn fetch_add(&self, rank: u32, window: &Window, offset: u64, value: u64) -> Result<u64> {
        self.atomic(rank, window, offset, AtomicOp::FetchAdd, value, 0)
    }

    /// Writes `new` to the word if it holds `expected`, atomically; returns the value
    /// it held (equal to `expected` when the swap happened).
    pub fn compare_swap(
        &self,
        rank: u32,
        window: &Window,
        offset: u64,
        expected: u64,
        new: u64,
    ) -> Result<u64> {
        self.atomic(rank, window, offset, AtomicOp::CompareSwap, expected, new)
    }

    /// Writes `value` to the word, atomically; returns the value before.
    pub fn swap(&self, rank: u32, window: &Window, offset: u64, value: u64) -> Result<u64> {
        self.atomic(rank, window, offset, AtomicOp::Swap, value, 0)
    }

    /// Combines `data`, packed elements of `elem`, into the elements at `offset` of
    /// `window` at `rank` with `op` (`target[i] = data[i] op target[i]`, MPI's
    /// accumulate; `fetch`, when given, receives the elements as they were before),
    /// atomically per element with respect to every other accumulate that takes the same
    /// lock word: the 8-byte word at `lock.1` of window `lock.0` at `rank`, 0 while free,
    /// which the target holds while it applies the update (or a same-node origin that
    /// updates the window directly). One round trip to another node (for each 64 KiB).
    /// [`Reduce::NoOp`] only fetches: `data` is then empty and `fetch` gives the length.
    /// An operation not defined on `elem`, or lengths that are not whole elements or do
    /// not match, are [`RmaError::BadAccumulate`] before anything is sent.
    #[allow(clippy::too_many_arguments)]
    pub fn accumulate(
        &self,
        rank: u32,
        window: &Window,
        offset: u64,
        elem: Element,
        op: Reduce,
        data: &[u8],
        lock: (&Window, u64),
        fetch: Option<&mut [u8]>,
    ) -> Result<()> {
        reduce::check(op, elem).map_err(|u| bad_accumulate(u.to_string()))?;
        let len = match (op, &fetch) {
            (Reduce::NoOp, Some(f)) if data.is_empty() => f.len(),
            (Reduce::NoOp, None) if data.is_empty() => 0,
            (Reduce::NoOp, _) => {
                return Err(bad_accumulate("a fetch (NoOp) carries no data".into()))
            }
            _ => data.len(),
        };
        self.update(
            rank,
            window,
            offset,
            (Some(op), elem),
            len,
            Cow::Borrowed(data),
            lock,
            fetch,
        )
    }

    /// Compare-and-swap of elements: each element of `elem` at `offset` of `window` at
    /// `rank` that equals its counterpart in `compare` becomes its counterpart in `new`;
    /// `old` receives them all as they were. Atomic per element with respect to the
    /// accumulates that take the lock word `lock` ([`Rma::accumulate`]).
    #[allow(clippy::too_many_arguments)]
    pub fn compare_swap_elements(
        &self,
        rank: u32,
        window: &Window,
        offset: u64,
        elem: Element,
        compare: &[u8],
        new: &[u8],
        lock: (&Window, u64),
        old: &mut [u8],
    ) -> Result<()> {
        if compare.len() != new.len() || old.len() != new.len() {
            return Err(bad_accumulate(format!(
                "compare ({}), new ({}) and old ({}) bytes differ",
                compare.len(),
                new.len(),
                old.len()
            )));
        }
        let data = [compare, new].concat();
        self.update(
            rank,
            window,
            offset,
            (None, elem),
            new.len(),
            Cow::Owned(data),
            lock,
            Some(old),
        )
    }

    /// [`Rma::accumulate`] and [`Rma::compare_swap_elements`]: `op` (the reduction, or
    /// `None`: a compare-and-swap) on `len` bytes with `data` as the
    /// request carries it.
    #[allow(clippy::too_many_arguments)]
    fn update(
        &self,
        rank: u32,
        window: &Window,
        offset: u64,
        (op, elem): (Option<Reduce>, Element),
        len: usize,
        data: Cow<'_, [u8]>,
        (lock_window, lock_offset): (&Window, u64),
        mut fetch: Option<&mut [u8]>,
    ) -> Result<()> {
        self.stats.borrow_mut().accumulates += 1;
        // (An accumulate's reduction was checked with its element; a compare-and-swap's
        // element is checked here.)
        reduce::check(Reduce::Replace, elem).map_err(|u| bad_accumulate(u.to_string()))?;
        let size = elem.size();
        if !len.is_multiple_of(size) || fetch.as_ref().is_some_and(|f| f.len() != len) {
            return Err(bad_accumulate(format!(
                "{len} bytes are not whole {size}-byte elements, or the fetched bytes do not match"
            )));
        }
        let (key, at) = self.address(rank, window, offset, len as u64)?;
        let (lock_key, lock_at) = self.address(rank, lock_window, lock_offset, 8)?;
        if !lock_offset.is_multiple_of(8) {
            return Err(refusal(Status::Misaligned, rank, lock_at, 8, lock_key.len));
        }
        if serve::lock_in_range(at, len as u64, lock_at) {
            return Err(bad_accumulate(format!(
                "the lock word at {lock_offset} lies in the {len} bytes at {offset}"
            )));
        }
        if len == 0 {
            return Ok(());
        }
        let path = self.path(rank, window, key)?;
        let lock_path = self.path(rank, lock_window, lock_key)?;
        if let (Path::Direct(mem), Path::Direct(lock_mem)) = (path, lock_path) {
            if !aligned(lock_mem, lock_offset) {
                return Err(refusal(Status::Misaligned, rank, lock_at, 8, lock_key.len));
            }
            // SAFETY: lock_offset + 8 <= the lock window's mapping, the word aligned
            // (both checked); the mapping outlives this call (`path`).
            let lock = unsafe { &*(lock_mem.add(lock_offset as usize) as *const AtomicU64) };
            let holder = u64::from(self.ep.station().job().rank) + 1;
            // SAFETY: offset + len <= the window's mapping (`address`, `path`).
            let target = unsafe { mem.add(offset as usize) };
            // The caller's buffers may lie in the window (its own, or a same-node
            // rank's it maps): those go through copies of their own.
            let inside = |p: *const u8, n: usize| {
                (p as usize) < target as usize + len && target as usize <= p as usize + n
            };
            let data = if inside(data.as_ptr(), data.len()) {
                Cow::Owned(data.into_owned())
            } else {
                data
            };
            let mut apart = Vec::new();
            let old = match fetch.as_deref_mut() {
                Some(f) if inside(f.as_ptr(), len) => {
                    apart.resize(len, 0);
                    Some(&mut apart[..])
                }
                other => other,
            };
            // SAFETY: `target` is `len` bytes of the mapping, which outlives this call;
            // `data` and the fetch buffer checked above and apart from them.
            unsafe {
                serve::apply_locked((lock, holder, None), target, len, (op, elem), &data, old)
            };
            if let (Some(f), false) = (fetch, apart.is_empty()) {
                f.copy_from_slice(&apart);
            }
            self.stats.borrow_mut().direct += 1;
            return Ok(());
        }
        let (route, _) = self.route_to(rank)?;
        // Pieces of whole elements, all sent before the first answer is awaited; each
        // request and each answer within this rank's `max_message` (a peer that sends
        // shorter ones refuses the piece, and the accumulate fails: it never hangs).
        let max = self.ep.station().job().config.max_message;
        let carried = if op.is_none() { 2 } else { 1 };
        let most = (serve::ACCUMULATE_MAX as usize)
            .min(max.saturating_sub(ops::ACCUMULATE_LEN) / carried)
            .min(max.saturating_sub(ops::ACCUMULATED_LEN));
        let piece = (most / size) * size;
        if piece == 0 {
            return Err(bad_accumulate(format!(
                "a {size}-byte element does not fit a message of {max} bytes"
            )));
        }
        let ask = |start: usize, n: usize| -> Result<u64> {
            let body: Cow<'_, [u8]> = match op {
                None => Cow::Owned(
                    [&data[start..start + n], &data[len + start..len + start + n]].concat(),
                ),
                Some(Reduce::NoOp) => Cow::Borrowed(&[]),
                Some(_) => Cow::Borrowed(&data[start..start + n]),
            };
            let id = self.id();
            let pending = Pending::Accumulate {
                len: n as u64,
                fetch: fetch.is_some(),
                answer: None,
            };
            serve::lock(&self.state).pending.insert(id, (rank, pending));
            let head = ops::accumulate(ops::AccumulateHead {
                at: At {
                    offset: at.offset + start as u64,
                    ..at
                },
                op: op.map_or(ops::CAS, |r| r as u8),
                fetch: fetch.is_some(),
                elem,
                lock: lock_at,
                id,
                len: n as u64,
            });
            self.send(rank, route, &head, &body).inspect_err(|_| {
                serve::lock(&self.state).pending.remove(&id);
            })?;
            Ok(id)
        };
        let mut asked = Vec::new();
        let mut out = Ok(());
        for start in (0..len).step_by(piece) {
            let n = piece.min(len - start);
            match ask(start, n) {
                Ok(id) => asked.push((id, start, n)),
                Err(e) => {
                    out = Err(e);
                    break;
                }
            }
        }
        // Every piece sent is waited for (it may be applied even when another fails);
        // the first error is the caller's.
        let mut answers = Vec::with_capacity(asked.len());
        let mut queue: std::collections::VecDeque<_> = asked.into();
        while let Some((id, start, n)) = queue.pop_front() {
            let answer = self.wait_for(id).inspect_err(|_| {
                serve::lock(&self.state).pending.remove(&id);
            });
            match answer {
                Ok(Pending::Accumulate {
                    answer: Some((Status::Busy, _)),
                    ..
                }) if out.is_ok() => match ask(start, n) {
                    // The lock word was taken at the target: asked again.
                    Ok(id) => queue.push_back((id, start, n)),
                    Err(e) => out = Err(e),
                },
                Ok(Pending::Accumulate {
                    answer: Some((Status::Done, bytes)),
                    ..
                }) => answers.push((start, bytes)),
                Ok(Pending::Accumulate {
                    answer: Some((status, _)),
                    ..
                }) => {
                    if out.is_ok() {
                        out = Err(refusal(status, rank, at, len as u64, key.len));
                    }
                }
                Ok(_) => {
                    if out.is_ok() {
                        out = Err(Error::Rma(RmaError::BadAnswer { rank }));
                    }
                }
                Err(e) => {
                    if out.is_ok() {
                        out = Err(e);
                    }
                }
            }
        }
        if let Some(f) = fetch {
            for (start, bytes) in answers {
                f[start..start + bytes.len()].copy_from_slice(&bytes);
            }
        }
        out
    }

    fn atomic(
        &self,
        rank: u32,
        window: &Window,
        offset: u64,
        op: AtomicOp,
        a: u64,
        b: u64,
    ) -> Result<u64> {
        self.stats.borrow_mut().atomics += 1;
        let (key, at) = self.address(rank, window, offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(refusal(Status::Misaligned, rank, at, 8, key.len));
        }
        match self.path(rank, window, key)? {
            // A window that starts off a word (a part of shared memory, lent memory).
            Path::Direct(mem) if !aligned(mem, offset) => {
                Err(refusal(Status::Misaligned, rank, at, 8, key.len))
            }
            Path::Direct(mem) => {
                // SAFETY: offset + 8 <= the mapping's length, the word's address 8-byte
                // aligned (both checked); the mapping outlives this call.
                let word = unsafe { &*(mem.add(offset as usize) as *const AtomicU64) };
                self.stats.borrow_mut().direct += 1;
                Ok(op.apply(word, a, b))
            }
            Path::Messages { route, .. } => {
                let id = self.id();
                serve::lock(&self.state)
                    .pending
                    .insert(id, (rank, Pending::Atomic(None)));
                match self.ask(rank, route, id, &ops::atomic(at, op, id, a, b))? {
                    Pending::Atomic(Some((Status::Done, v))) => Ok(v),
                    Pending::Atomic(Some((status, _))) => {
                        Err(refusal(status, rank, at, 8, key.len))
                    }
                    _ => Err(Error::Rma(RmaError::BadAnswer { rank })),
                }
            }
        }
    }

    /// Waits until every put to `rank` is in its window. An error when the target
    /// refused some ([`RmaError::PutsRefused`]).
    pub fn flush(&self, rank: u32) -> Result<()> {
        self.flush_ranks(&[rank])
    }

    /// [`Rma::flush`] to every rank (the requests all leave before the first wait).
    pub fn flush_all(&self) -> Result<()> {
        let ranks: Vec<u32> = self.unflushed.borrow().iter().copied().collect();
        self.flush_ranks(&ranks)
    }

    fn flush_ranks(&self, ranks: &[u32]) -> Result<()> {
        // Direct writes are visible to the target once this fence is passed.
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut asked = Vec::new();
        let mut first = None;
        for &rank in ranks {
            if !self.unflushed.borrow().contains(&rank) {
                continue;
            }
            // Only ranks sent messages are unflushed.
            let (route, _) = self.route_to(rank)?;
            let id = self.id();
            serve::lock(&self.state)
                .pending
                .insert(id, (rank, Pending::Flush(None)));
            match self.send(rank, route, &ops::flush(id), &[]) {
                Ok(()) => asked.push((rank, id)),
                Err(e) => {
                    serve::lock(&self.state).pending.remove(&id);
                    first.get_or_insert(e);
                }
            }
        }
        // Every answer is waited for; a rank stays unflushed until its answer came.
        for (rank, id) in asked {
            let r = match self.wait_for(id) {
                Err(e) => {
                    serve::lock(&self.state).pending.remove(&id);
                    Err(e)
                }
                Ok(answer) => {
                    self.unflushed.borrow_mut().remove(&rank);
                    match answer {
                        Pending::Flush(Some((_, 0))) => Ok(()),
                        Pending::Flush(Some((status, count))) => {
                            Err(Error::Rma(RmaError::PutsRefused {
                                rank,
                                count,
                                reason: status.reason().into(),
                            }))
                        }
                        _ => Err(Error::Rma(RmaError::BadAnswer { rank })),
                    }
                }
            };
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Serves what arrived (other ranks' requests, answers to this rank's) without
    /// waiting.
    pub fn progress(&self) -> Result<()> {
        for _ in 0..PROGRESS_ROUNDS {
            if !self.poll()? {
                break;
            }
        }
        Ok(())
    }

    /// The counters.
    pub fn stats(&self) -> RmaStats {
        let c = serve::lock(&self.state).counters;
        RmaStats {
            puts_applied: c.puts_applied,
            served: c.gets_served + c.atomics_served + c.accumulates_served,
            busy: c.busy,
            refused: c.refused,
            malformed: c.malformed,
            ..self.stats.borrow().clone()
        }
    }

    fn id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    /// The key of `window` at `rank` and the address of `len` bytes at `offset` in it,
    /// checked against the window's length there.
    fn address(&self, rank: u32, window: &Window, offset: u64, len: u64) -> Result<(Key, At)> {
        let key = self.key(rank, window)?;
        let at = At {
            window: window.number,
            generation: key.generation,
            offset,
        };
        if offset.checked_add(len).is_none_or(|end| end > key.len) {
            return Err(refusal(Status::OutOfBounds, rank, at, len, key.len));
        }
        Ok((key, at))
    }

    /// The key of window `window.number` at `rank`, from the job's store the first time.
    fn key(&self, rank: u32, window: &Window) -> Result<Key> {
        let freed = self.freed.load(Ordering::Acquire);
        if freed != self.freed_seen.get() {
            self.forget_freed();
            self.freed_seen.set(freed);
        }
        let station = self.ep.station();
        let job = station.job();
        if rank >= job.size {
            return Err(Error::NoSuchRank {
                rank,
                size: job.size,
            });
        }
        if rank == job.rank {
            return Ok(Key {
                object: 0,
                generation: window.generation,
                len: window.len() as u64,
                pid: 0,
                addr: 0,
            });
        }
        if let Some(k) = self.keys.borrow().get(&(rank, window.number)) {
            return Ok(*k);
        }
        let text = job
            .kv
            .get(
                &key_name(station.dpid(), rank, window.number),
                job.config.connect_timeout,
            )
            .map_err(|e| match e {
                Error::Timeout(_) => Error::Rma(RmaError::NoWindow {
                    rank,
                    window: window.number,
                }),
                e => e,
            })?;
        let key = Key::parse(&text).ok_or(Error::Rma(RmaError::BadAnswer { rank }))?;
        self.keys.borrow_mut().insert((rank, window.number), key);
        Ok(key)
    }

    /// Forgets the keys and mappings of the windows freed here (freeing is collective:
    /// the other ranks' parts are gone too), so that their pages go.
    fn forget_freed(&self) {
        let numbers = std::mem::take(&mut serve::lock(&self.state).freed);
        let mut keys = self.keys.borrow_mut();
        let mut mapped = self.mapped.borrow_mut();
        keys.retain(|&(rank, number), key| {
            let keep = !numbers.contains(&number);
            if !keep {
                mapped.remove(&(rank, key.object));
            }
            keep
        });
    }

    /// How this rank reaches `rank`.
    fn reach(&self, rank: u32) -> Result<Reach> {
        if let Some(r) = self.reach.borrow().get(&rank) {
            return Ok(*r);
        }
        let station = self.ep.station();
        let r = if rank == station.job().rank || station.transport_to(rank)? == Transport::Shm {
            Reach::Direct
        } else {
            let (route, piece) = self.route_to(rank)?;
            Reach::Messages { route, piece }
        };
        self.reach.borrow_mut().insert(rank, r);
        Ok(r)
    }

    /// The route of messages to `rank` and the longest piece per message, whatever the
    /// transport (registered windows of same-node ranks take it too).
    fn route_to(&self, rank: u32) -> Result<(usize, usize)> {
        if let Some(r) = self.routes.borrow().get(&rank) {
            return Ok(*r);
        }
        let station = self.ep.station();
        let route = station
            .connect(Source {
                rank,
                dpid: station.dpid(),
            })
            .map_err(|e| self.ep.report(e))?;
        let piece = station.frame_payload(route).unwrap_or(DEFAULT_PIECE);
        self.routes.borrow_mut().insert(rank, (route, piece));
        Ok((route, piece))
    }

    /// How an operation on `window` at `rank` (whose key there is `key`) goes: into
    /// the mapped window, or as messages its target applies (another node's window,
    /// or memory a same-node rank registered: contiguous puts and gets reach that by
    /// cross-memory attach first, [`Rma::attached_put`]).
    fn path(&self, rank: u32, window: &Window, key: Key) -> Result<Path> {
        match self.reach(rank)? {
            Reach::Direct if !key.is_registered() => {
                Ok(Path::Direct(self.direct(rank, window, key)?))
            }
            Reach::Direct => {
                let (route, piece) = self.route_to(rank)?;
                Ok(Path::Messages { route, piece })
            }
            Reach::Messages { route, piece } => Ok(Path::Messages { route, piece }),
        }
    }

    /// Whether cross-memory attach reaches registered memory of same-node `rank` at
    /// the process its key names (proved once by the nonce that rank published).
    fn attaches(&self, rank: u32, key: Key) -> bool {
        key.is_registered()
            && self.config_cma
            && self.proofs.cma.is_usable()
            // Keeps this origin's order: while puts to the rank travel as messages,
            // later ones follow them (until a flush).
            && !self.unflushed.borrow().contains(&rank)
            && matches!(self.reach(rank), Ok(Reach::Direct))
            && self
                .proofs
                .reaches(&self.ep.station().job().kv, rank, key.pid)
    }

    /// Puts `data` at `offset` of registered memory of same-node `rank` by
    /// cross-memory attach; false when that does not reach it (the caller sends
    /// messages instead).
    fn attached_put(&self, rank: u32, key: Key, offset: u64, data: &[u8]) -> bool {
        self.attached(rank, key, offset, data.len(), "put into", |cma, remote| {
            cma.write_to(key.pid, remote, data)
        })
    }

    /// [`Rma::attached_put`], the other way.
    fn attached_get(&self, rank: u32, key: Key, offset: u64, dst: &mut [u8]) -> bool {
        let len = dst.len();
        self.attached(rank, key, offset, len, "get from", |cma, remote| {
            cma.read_from(key.pid, remote, dst)
        })
    }

    /// Moves `len` bytes at `offset` of registered memory of same-node `rank` with
    /// `transfer` (a cross-memory attach read or write of the remote piece); false when
    /// attach does not reach it or fails.
    fn attached(
        &self,
        rank: u32,
        key: Key,
        offset: u64,
        len: usize,
        what: &str,
        transfer: impl FnOnce(
            &crate::link::cma::CmaState,
            &[Piece],
        ) -> std::result::Result<usize, crate::link::cma::CmaError>,
    ) -> bool {
        if !self.attaches(rank, key) {
            return false;
        }
        if len == 0 {
            return true;
        }
        let remote = [Piece {
            addr: key.addr + offset,
            len,
        }];
        match transfer(&self.proofs.cma, &remote) {
            Ok(_) => {
                self.stats.borrow_mut().direct += 1;
                true
            }
            Err(e) => {
                tracing::debug!("{what} rank {rank} by cross-memory attach: {e}");
                false
            }
        }
    }

    /// The first byte of `window` at same-node `rank`, mapped here once, at least
    /// `key.len` bytes long. The mapping lives as long as this `Rma` (mappings are
    /// never dropped before it) or, for this rank's own window, as long as `window`.
    fn direct(&self, rank: u32, window: &Window, key: Key) -> Result<*mut u8> {
        let job = self.ep.station().job();
        if rank == job.rank {
            return Ok(window.mem.ptr());
        }
        let no_window = || {
            Error::Rma(RmaError::NoWindow {
                rank,
                window: window.number,
            })
        };
        // The key's bytes are what origins check against: the mapping must hold them
        // (`parse` checked that their end does not overflow).
        let start = |m: &SharedObject| {
            if (m.len() as u64) < key.addr + key.len {
                return Err(no_window());
            }
            // In bounds: checked just above.
            Ok(m.ptr().wrapping_add(key.addr as usize))
        };
        if let Some(m) = self.mapped.borrow().get(&(rank, key.object)) {
            return start(m);
        }
        if key.object & WINDOW_IDS != WINDOW_IDS {
            return Err(no_window());
        }
        let mem = SharedObject::open_peer(job.job_id, rank, key.object).map_err(|e| {
            tracing::debug!("window {} of rank {rank}: {e}", window.number);
            no_window()
        })?;
        let ptr = start(&mem)?;
        self.mapped
            .borrow_mut()
            .insert((rank, key.object), Arc::new(mem));
        Ok(ptr)
    }

    /// Sends one message to `rank` on `route` after the small puts waiting to be
    /// combined (so that every rank sees this rank's requests in the order it made
    /// them).
    fn send(&self, rank: u32, route: usize, head: &[u8], data: &[u8]) -> Result<()> {
        self.push_combined()?;
        self.send_now(rank, route, head, data)
    }

    /// Sends the put request `head` + `data` to `rank` on `route` (whose messages carry
    /// `piece` bytes at most), combined with the puts before and after it to the same
    /// rank into one message as far as they fit: they leave when the next does not fit
    /// or at the next request that is not such a put (a flush, a notify, a get, an
    /// atomic, a barrier, or any wait).
    fn send_put(
        &self,
        rank: u32,
        route: usize,
        piece: usize,
        head: &[u8],
        data: &[u8],
    ) -> Result<()> {
        let len = ops::PART_LEN + head.len() + data.len();
        if ops::COMBINED_LEN + len > piece {
            return self.send(rank, route, head, data);
        }
        let full = {
            let c = self.combining.borrow();
            !c.buf.is_empty() && (c.rank != rank || c.buf.len() + len > piece)
        };
        if full {
            self.push_combined()?;
        }
        let mut c = self.combining.borrow_mut();
        if c.buf.is_empty() {
            c.rank = rank;
            c.route = route;
            c.buf.extend_from_slice(&ops::combined());
        }
        ops::part(&mut c.buf, head, data);
        c.parts += 1;
        Ok(())
    }

    /// Sends the puts waiting to be combined, if any (one alone as itself).
    fn push_combined(&self) -> Result<()> {
        let (rank, route, mut buf, parts) = {
            let mut c = self.combining.borrow_mut();
            if c.buf.is_empty() {
                return Ok(());
            }
            let parts = std::mem::take(&mut c.parts);
            (c.rank, c.route, std::mem::take(&mut c.buf), parts)
        };
        let r = if parts == 1 {
            self.send_now(rank, route, &buf[ops::COMBINED_LEN + ops::PART_LEN..], &[])
        } else {
            self.send_now(rank, route, &buf, &[])
        };
        // The allocation serves the next message.
        let mut c = self.combining.borrow_mut();
        if c.buf.is_empty() {
            buf.clear();
            c.buf = buf;
        }
        r
    }

    /// Sends a put longer than one piece to `rank` on `route`: a message of `piece`
    /// bytes at most each, handed to the link [`PUT_BATCH`] at a time (so that they leave
    /// as runs, not frame by frame), making progress while about a window waits already
    /// (as [`Rma::send_now`] does).
    fn send_pieces(
        &self,
        rank: u32,
        route: usize,
        piece: usize,
        at: At,
        data: &[u8],
    ) -> Result<()> {
        self.push_combined()?;
        let station = self.ep.station();
        let mut done = 0;
        while done < data.len() {
            while !self.has_room(rank, route) {
                if !self.poll()? {
                    std::thread::yield_now();
                }
            }
            let mut heads = Vec::with_capacity(PUT_BATCH);
            let mut bodies = Vec::with_capacity(PUT_BATCH);
            while heads.len() < PUT_BATCH && done < data.len() {
                let n = (data.len() - done).min(piece);
                heads.push(ops::put(At {
                    offset: at.offset + done as u64,
                    ..at
                }));
                bodies.push(&data[done..done + n]);
                done += n;
            }
            let batch: Vec<(&[u8], &[u8])> = heads
                .iter()
                .zip(&bodies)
                .map(|(h, b)| (&h[..], *b))
                .collect();
            station
                .send_batch(route, &batch)
                .map_err(|e| self.ep.report(e))?;
        }
        Ok(())
    }

    /// Whether a message to `rank` on `route` may be queued now: no answer waits for
    /// `rank` (it would be overtaken), and at most a window waits on the route beyond
    /// the window in flight (memory stays bounded and the frames leave at the pace
    /// acknowledgements come back).
    fn has_room(&self, rank: u32, route: usize) -> bool {
        let station = self.ep.station();
        let queued = {
            let out = self.out.borrow();
            !out.is_empty()
                && out.has_queued_for(Source {
                    rank,
                    dpid: station.dpid(),
                })
        };
        !queued && !station.send_backlogged(route)
    }

    /// Sends one message to `rank` on `route`, making progress while the route has no
    /// room (so two ranks that both send never wait for each other).
    fn send_now(&self, rank: u32, route: usize, head: &[u8], data: &[u8]) -> Result<()> {
        let station = self.ep.station();
        loop {
            if self.has_room(rank, route) {
                if station.try_send_inline(route, head, data) {
                    return Ok(());
                }
                if station
                    .send(route, head, data, false)
                    .map_err(|e| self.ep.report(e))?
                {
                    return Ok(());
                }
            }
            if !self.poll()? {
                std::thread::yield_now();
            }
        }
    }

    /// Makes progress once: sends the answers queued, serves what arrived. Whether
    /// anything happened.
    fn poll(&self) -> Result<bool> {
        // Whoever waits for something lets the combined puts go first.
        self.push_combined()?;
        let mut out = self.out.borrow_mut();
        let sent = out.sent();
        let mut handler = OnState {
            state: &self.state,
            woke: false,
            handled: 0,
        };
        // The handler consumes every message: none comes back for delivery.
        if let Some(m) = drive_rearming(&self.ep, &mut handler, &mut out, |h| h.handled)? {
            self.ep.station().release_token(m.token);
        }
        Ok(handler.handled > 0 || out.sent() != sent)
    }

    /// Sends request `id` (pending already) to `rank` and waits for its answer; on an
    /// error the request is forgotten (a late answer is then dropped and counted).
    fn ask(&self, rank: u32, route: usize, id: u64, request: &[u8]) -> Result<Pending> {
        let r = self
            .send(rank, route, request, &[])
            .and_then(|()| self.wait_for(id));
        if r.is_err() {
            serve::lock(&self.state).pending.remove(&id);
        }
        r
    }

    /// Waits until the answer to request `id` is complete and takes it.
    fn wait_for(&self, id: u64) -> Result<Pending> {
        let done = |s: &State| s.pending.get(&id).is_some_and(|(_, p)| p.done());
        let take = || -> Option<Pending> {
            let mut s = serve::lock(&self.state);
            if done(&s) {
                s.pending.remove(&id).map(|(_, p)| p)
            } else {
                None
            }
        };
        loop {
            if let Some(p) = take() {
                return Ok(p);
            }
            if self.poll()? {
                continue;
            }
            let ready = || {
                let busy = self.poll()?;
                let news = done(&serve::lock(&self.state));
                Ok((busy || news).then_some(()))
            };
            self.ep
                .station()
                .wait_for_in(self.wait.get(), ready, None)?;
        }
    }
}

impl crate::job::Progress for Rma {
    fn progress(&self) -> Result<()> {
        Rma::progress(self)
    }

    fn failed_ranks(&self) -> Vec<u32> {
        self.ep.failed_ranks()
    }
}

/// The store key of window `number` of `rank` on `dpid`.
fn key_name(dpid: u16, rank: u32, number: u32) -> String {
    format!("rma/{dpid}/{rank}/{number}")
}

fn bad_accumulate(reason: String) -> Error {
    Error::Rma(RmaError::BadAccumulate { reason })
}

/// The origin's error for a target's `status` about `len` bytes at `at` of `rank`,
/// whose window is `size` bytes long.
fn refusal(status: Status, rank: u32, at: At, len: u64, size: u64) -> Error {
    Error::Rma(match status {
        Status::NoWindow => RmaError::NoWindow {
            rank,
            window: at.window,
        },
        Status::OutOfBounds => RmaError::OutOfBounds {
            rank,
            window: at.window,
            offset: at.offset,
            len,
            size,
        },
        Status::Misaligned => RmaError::Misaligned {
            rank,
            window: at.window,
            offset: at.offset,
        },
        Status::BadOp | Status::BadLength => RmaError::BadAccumulate {
            reason: format!("rank {rank} refused it: {}", status.reason()),
        },
        Status::Done | Status::Busy | Status::Unknown => RmaError::BadAnswer { rank },
    })
}
