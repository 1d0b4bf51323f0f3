//! One-sided communication: MPI's windows, their synchronization and their accesses,
//! on quiver's [`Rma`] (the deposit seed's personality).
//!
//! How it maps:
//!
//! - **Memory.** `MPI_Alloc_mem` hands out memory of the node's shared pool
//!   ([`Rma::alloc_memory`]); a window made on it (`MPI_Win_create` on memory from
//!   `MPI_Alloc_mem`, as IMB's are, or `MPI_Win_allocate`) is exposed as a part of that
//!   memory ([`Rma::expose`]), so that same-node ranks put, get and update it directly
//!   (a copy, a CPU atomic): the target takes no part, MPI's "truly passive" mode. A
//!   window on other memory (the stack, `malloc`) is lent to quiver
//!   ([`Rma::register_borrowed`]): same-node ranks reach it by cross-memory attach,
//!   atomics and other nodes through the target's side of the protocol, which the
//!   target's MPI calls drive (or the offload engine's thread).
//! - **Windows.** Each window has its own communicator (a duplicate: the application
//!   may free its own), a control part of 16 bytes per rank (the lock word and the
//!   accumulate mutex) and the data part. The ranks of the communicator agree on the
//!   windows' numbers (the largest of their next free ones, [`Rma::skip_window_numbers`]):
//!   windows of disjoint communicators are made concurrently.
//! - **Synchronization.** `MPI_Win_fence` is a flush of every put and a barrier of the
//!   window's communicator. Passive target: `MPI_Win_lock` takes a readers-writer lock
//!   in the target's control word (shared holders count, an exclusive holder sets
//!   [`EXCLUSIVE`]) with quiver's atomics; `MPI_Win_unlock` flushes, then lets go.
//!   `MPI_Win_flush` is quiver's flush; gets complete before they return, puts once their
//!   source may be reused, so the `_local` flushes have nothing left to wait for.
//! - **Accumulates.** Concurrent accumulates to one location are atomic per element, as
//!   MPI asks. Every accumulate and compare-and-swap on an aligned 8-byte integer is
//!   quiver's 64-bit atomics (`SUM` a fetch-and-add, `REPLACE` a swap, `NO_OP` a
//!   fetch-and-add of 0, the others a compare-and-swap loop). Everything else (other
//!   types, words off 8 bytes) is quiver's typed accumulate ([`Rma::accumulate`],
//!   [`Rma::compare_swap_elements`]) under the target's accumulate mutex: an origin that
//!   maps the window (same node, shared memory) takes the mutex and combines in place;
//!   for any other the target applies the whole accumulate, holding the same mutex, and
//!   answers in one round trip. The way
//!   depends on the element's type and address only, so all operations on one location
//!   meet in the same atomics or the same mutex, and no mutex is held across a message.
//!
//! What is not here: post/start/complete/wait epochs, request-based operations
//! (`MPI_Rput`...), dynamic and shared-memory windows (their calls say they are not
//! supported). Epochs are not checked: an access outside one works as inside.

use crate::error::check;
use crate::op::{Builtin, Op};
use crate::{Class, Elem, Layout, Mpi, MpiError, Num, Peer, Result, DPID_BASE};
use quiver::rma::reduce::Element;
use quiver::rma::{Rma, SharedMemory, Window};
use std::borrow::Cow;
use std::collections::HashMap;

/// The DPID of the process's one-sided endpoint (below the communicators').
pub const RMA_DPID: u16 = DPID_BASE - 1;

/// The lock word in a rank's control part.
const LOCK: u64 = 0;
/// The accumulate mutex: 0 when free, else its holder's job rank + 1.
const MUTEX: u64 = 8;
const CONTROL_LEN: usize = 16;
/// The lock word's bit of an exclusive holder; below it, the shared holders count.
pub const EXCLUSIVE: u64 = 1 << 62;
/// Failed tries of a lock before each next one yields the core (the
/// holder may be waiting for it on an oversubscribed node).
const SPINS: u32 = 64;

/// How `MPI_Win_lock` locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockType {
    /// `MPI_LOCK_SHARED`: with other shared holders.
    Shared,
    /// `MPI_LOCK_EXCLUSIVE`: alone.
    Exclusive,
}

/// What a lock this process holds took at the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Shared,
    Exclusive,
    /// `MPI_MODE_NOCHECK`: nothing (the application promises no conflicting lock).
    Nothing,
}

/// How a window was made (`MPI_WIN_CREATE_FLAVOR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `MPI_Win_create`: the application's memory.
    Create,
    /// `MPI_Win_allocate`: memory the window allocated.
    Allocate,
}

/// One MPI window: this rank's part and what it knows of the others'.
pub struct Win {
    /// Its own communicator (a duplicate of the one it was made on).
    comm: usize,
    data: Window,
    control: Window,
    /// Each rank's displacement unit.
    units: Vec<u64>,
    /// Each rank's part, in bytes.
    sizes: Vec<u64>,
    /// Whether every rank's part starts 8-byte aligned (accumulates may then update
    /// elements with quiver's 64-bit atomics: [`word_elem`]).
    aligned: bool,
    base: *mut u8,
    size: usize,
    unit: u64,
    flavor: Flavor,
    /// The memory `MPI_Win_allocate` allocated for it.
    _memory: Option<Owned>,
    /// The locks this process holds, by rank of the window.
    locks: HashMap<u32, Held>,
    /// `MPI_Win_set_name`'s.
    pub name: String,
}

impl Win {
    /// This rank's part: its first byte, length and displacement unit.
    pub fn local(&self) -> (*mut u8, usize, u64) {
        (self.base, self.size, self.unit)
    }

    /// How it was made.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// The communicator of its ranks (its own).
    pub fn comm(&self) -> usize {
        self.comm
    }
}

/// The memory `MPI_Win_allocate` allocated: of the node's shared pool, or (where that is
/// full) the process's own, lent to quiver.
enum Owned {
    Shared(SharedMemory),
    Private(#[allow(dead_code)] Vec<u64>),
}

/// Bytes at `buf` of `count` elements of `layout`, packed (the application's bytes
/// themselves when the type is contiguous).
///
/// # Safety
///
/// The elements at `buf` are readable, and stay unchanged while the result lives.
pub unsafe fn packed<'a>(buf: *const u8, count: usize, layout: &Layout) -> Result<Cow<'a, [u8]>> {
    let len = layout.bytes(count)?;
    if len == 0 {
        return Ok(Cow::Borrowed(&[]));
    }
    if layout.is_contiguous() {
        // SAFETY: the caller's promise: `count` contiguous elements at `buf`.
        return Ok(Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(buf, len)
        }));
    }
    let mut out = Vec::new();
    // SAFETY: the caller's promise.
    unsafe { layout.pack(buf, count, &mut out) };
    Ok(Cow::Owned(out))
}

/// The runs of the target's bytes of `count` elements of `layout` whose first element
/// starts at byte `at` of the window: (offset in the window, range of the packed data),
/// in packing order.
fn target_runs(
    at: u64,
    count: usize,
    layout: &Layout,
) -> Result<Vec<(u64, std::ops::Range<usize>)>> {
    let total = layout.bytes(count)?;
    if layout.is_contiguous() {
        return Ok(vec![(at, 0..total)]);
    }
    let bad = || MpiError::new(Class::Disp, "the target datatype reaches before the window");
    let mut runs: Vec<(u64, std::ops::Range<usize>)> = Vec::new();
    let mut packed = 0usize;
    for i in 0..count as i128 {
        for b in &layout.blocks {
            let off = i128::from(at) + i * layout.extent as i128 + b.disp as i128;
            let off = u64::try_from(off).map_err(|_| bad())?;
            let range = packed..packed + b.len;
            packed += b.len;
            match runs.last_mut() {
                // Continues the previous run in the window and in the data.
                Some((o, r)) if *o + r.len() as u64 == off => r.end = range.end,
                _ => runs.push((off, range)),
            }
        }
    }
    Ok(runs)
}

/// The element of `layout` if accumulates update it with quiver's 64-bit atomics: an
/// 8-byte integer. Each such element on an aligned word of the target's part
/// ([`Win::on_word`]) is updated by an atomic of that word (a fetch-and-add, a swap, or
/// a compare-and-swap loop for the operations with no atomic of their own), so that
/// concurrent accumulates on it all meet in the same CPU atomics; every other element
/// is quiver's typed accumulate under the accumulate mutex. Which way an element goes
/// depends on its type and address only.
///
/// Smaller elements could be updated by a compare-and-swap loop on the word that holds
/// them (658f2af did): tried, and kept out because an origin on another node then paid
/// two round trips per element (IMB-RMA's Accumulate of 64 KiB of floats: 230 ms); the
/// target now applies a whole accumulate instead (DESIGN-NOTES).
fn word_elem(layout: &Layout) -> Option<Elem> {
    layout
        .elem
        .filter(|e| matches!(e, Elem::Num(Num::I64 | Num::U64)))
}

impl Win {
    /// Whether the 8 bytes at `at` of window rank `r`'s part are an aligned word of it:
    /// every part starts aligned, `at` is a multiple of 8 and the word ends inside the
    /// part (otherwise the accumulate mutex).
    fn on_word(&self, r: u32, at: u64) -> bool {
        let part = self.sizes.get(r as usize).copied().unwrap_or(0);
        self.aligned && at.is_multiple_of(8) && at.checked_add(8).is_some_and(|e| e <= part)
    }
}

fn word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[..8]);
    u64::from_ne_bytes(w)
}

/// One-sided communication.
impl Mpi {
    /// The process's one-sided endpoint, opened on first use (every rank opens it on the
    /// same DPID; opening it waits for nobody).
    fn rma(&self) -> Result<&Rma> {
        if let Some(r) = self.rma.get() {
            return Ok(r);
        }
        let r = Rma::open(&self.job, RMA_DPID)?;
        Ok(self.rma.get_or_init(|| r))
    }

    /// Whether the one-sided endpoint needs the process's progress (windows exist:
    /// other ranks' requests may arrive for them).
    pub(crate) fn rma_active(&self) -> bool {
        self.rma.get().is_some() && self.wins.iter().any(Option::is_some)
    }

    /// One round of the one-sided endpoint's protocol (requests for this rank's
    /// windows, answers to its own).
    pub(crate) fn drive_rma(&self) {
        if let Some(r) = self.rma.get() {
            let _ = r.progress();
        }
    }

    /// `MPI_Alloc_mem`: `size` bytes of the node's shared pool (at least one), which a
    /// window made on them later shares with the node's ranks.
    pub fn alloc_mem(&mut self, size: usize) -> Result<*mut u8> {
        let mem = self.rma()?.alloc_memory(size.max(1)).map_err(|e| {
            MpiError::new(Class::NoMem, format!("{size} bytes of shared memory: {e}"))
        })?;
        let p = mem.as_ptr();
        self.memories.insert(p as usize, mem);
        Ok(p)
    }

    /// `MPI_Free_mem`: false when `base` is not memory [`Mpi::alloc_mem`] handed out.
    /// A window made on it keeps it until the window is freed.
    pub fn free_mem(&mut self, base: *mut u8) -> bool {
        self.memories.remove(&(base as usize)).is_some()
    }

    /// The memory of [`Mpi::alloc_mem`] that holds `len` bytes at `p`, and where they
    /// start in it.
    fn memory_of(&self, p: *const u8, len: usize) -> Option<(&SharedMemory, usize)> {
        let (_, mem) = self.memories.range(..=p as usize).next_back()?;
        Some((mem, mem.offset_of(p, len)?))
    }

    /// `MPI_Win_create` on `size` bytes at `base` (displacements in units of `unit`
    /// bytes), collective over `comm`. Returns the window's id.
    ///
    /// # Safety
    ///
    /// The bytes stay allocated until the window is freed ([`Mpi::win_free`]), and the
    /// application reads and writes them only as MPI allows (other ranks write them).
    pub unsafe fn win_create(
        &mut self,
        base: *mut u8,
        size: usize,
        unit: u64,
        comm: usize,
    ) -> Result<usize> {
        self.make_win(comm, base, size, unit, Flavor::Create, None)
    }

    /// `MPI_Win_allocate`: a window on `size` new bytes of the node's shared pool.
    /// Returns the window's id and its first byte.
    pub fn win_allocate(
        &mut self,
        size: usize,
        unit: u64,
        comm: usize,
    ) -> Result<(usize, *mut u8)> {
        // Where the pool is full, private memory lent to quiver: every rank goes on to
        // the collective part either way.
        let (base, owned) = match self.rma()?.alloc_memory(size) {
            Ok(mem) => (mem.as_ptr(), Owned::Shared(mem)),
            Err(_) => {
                let mut words = vec![0u64; size.div_ceil(8)];
                (words.as_mut_ptr().cast(), Owned::Private(words))
            }
        };
        let w = self.make_win(comm, base, size, unit, Flavor::Allocate, Some(owned))?;
        Ok((w, base))
    }

    fn make_win(
        &mut self,
        comm: usize,
        base: *mut u8,
        size: usize,
        unit: u64,
        flavor: Flavor,
        owned: Option<Owned>,
    ) -> Result<usize> {
        check(unit > 0, Class::Disp, || {
            "the displacement unit must be positive".into()
        })?;
        self.rma()?;
        let wcomm = self.comm_dup(comm)?;
        // A window number that none of the members used yet.
        let mine = self.rma()?.next_window_number();
        let (agreed, _) = self.allreduce_max_min(wcomm, mine)?;
        let rma = self.rma()?;
        rma.skip_window_numbers(agreed)?;
        let control = rma.allocate(CONTROL_LEN)?;
        // No bytes: never a null pointer for quiver (the application's stays the
        // window's base).
        let lent = if size == 0 {
            std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
        } else {
            base
        };
        let data = match (&owned, self.memory_of(base, size)) {
            (Some(Owned::Shared(mem)), _) => rma.expose(mem, 0, size)?,
            (None, Some((mem, offset))) if size > 0 => rma.expose(mem, offset, size)?,
            // SAFETY: `win_create`'s caller keeps the bytes until the window is freed;
            // `win_allocate`'s are the window's own (`Win::_memory`), dropped after it.
            _ => unsafe { rma.register_borrowed(lent, size)? },
        };
        let mine: [u64; 3] = [
            unit,
            u64::from((base as usize).is_multiple_of(8)),
            size as u64,
        ];
        let n = self.comm(wcomm)?.size() as usize;
        let mut all = vec![[0u64; 3]; n];
        self.allgather_bytes(
            wcomm,
            crate::coll::bytes_of(&[mine]),
            crate::coll::bytes_of_mut(&mut all),
        )?;
        let win = Win {
            comm: wcomm,
            data,
            control,
            units: all.iter().map(|a| a[0]).collect(),
            aligned: all.iter().all(|a| a[1] == 1),
            sizes: all.iter().map(|a| a[2]).collect(),
            base,
            size,
            unit,
            flavor,
            _memory: owned,
            locks: HashMap::new(),
            name: String::new(),
        };
        Ok(crate::store(&mut self.wins, win))
    }

    /// Window `w`.
    pub fn win(&self, w: usize) -> Result<&Win> {
        self.wins
            .get(w)
            .and_then(Option::as_ref)
            .ok_or_else(|| MpiError::new(Class::Win, format!("window {w} does not exist")))
    }

    /// Window `w`, mutably.
    pub fn win_mut(&mut self, w: usize) -> Result<&mut Win> {
        self.wins
            .get_mut(w)
            .and_then(Option::as_mut)
            .ok_or_else(|| MpiError::new(Class::Win, format!("window {w} does not exist")))
    }

    /// `MPI_Win_free`: collective; every rank's accesses end first.
    pub fn win_free(&mut self, w: usize) -> Result<()> {
        let win = self.win(w)?;
        check(win.locks.is_empty(), Class::RmaSync, || {
            "the window is freed while this process holds a lock on it".into()
        })?;
        let comm = win.comm;
        let flushed = self.rma()?.flush_all();
        self.barrier(comm)?;
        // No rank accesses it any more: its parts go (the memory `MPI_Alloc_mem` gave
        // stays the application's).
        self.wins[w] = None;
        self.comm_free(comm)?;
        Ok(flushed?)
    }

    /// `MPI_Win_fence`: every access before it is complete everywhere after it.
    pub fn win_fence(&mut self, w: usize) -> Result<()> {
        let comm = self.win(w)?.comm;
        self.rma()?.flush_all()?;
        self.barrier(comm)
    }

    /// The window's rank `r` as a job rank, with the rank checked.
    fn target(&self, win: &Win, r: u32) -> Result<u32> {
        let comm = self.comm_any(win.comm)?;
        check(r < comm.size(), Class::Rank, || {
            format!("rank {r} is not in the window's group of {}", comm.size())
        })?;
        Ok(comm.job_rank(r))
    }

    /// Keeps the process's endpoints going while it waits for another rank.
    fn spin(&self, tries: &mut u32) {
        self.drive_all();
        *tries += 1;
        if *tries > SPINS {
            std::thread::yield_now();
        }
    }

    /// `MPI_Win_lock` on rank `r` (`nocheck`: `MPI_MODE_NOCHECK`, nothing is taken).
    pub fn win_lock(&mut self, w: usize, kind: LockType, r: u32, nocheck: bool) -> Result<()> {
        let win = self.win(w)?;
        let j = self.target(win, r)?;
        check(!win.locks.contains_key(&r), Class::RmaSync, || {
            format!("this process holds a lock on rank {r} of the window already")
        })?;
        let held = if nocheck {
            Held::Nothing
        } else {
            self.take_lock(win, j, kind)?;
            match kind {
                LockType::Shared => Held::Shared,
                LockType::Exclusive => Held::Exclusive,
            }
        };
        self.win_mut(w)?.locks.insert(r, held);
        Ok(())
    }

    fn take_lock(&self, win: &Win, j: u32, kind: LockType) -> Result<()> {
        let rma = self.rma()?;
        let mut tries = 0;
        loop {
            match kind {
                LockType::Shared => {
                    let was = rma.fetch_add(j, &win.control, LOCK, 1)?;
                    if was & EXCLUSIVE == 0 {
                        return Ok(());
                    }
                    // An exclusive holder: step back and try again.
                    rma.fetch_add(j, &win.control, LOCK, 1u64.wrapping_neg())?;
                }
                LockType::Exclusive => {
                    if rma.compare_swap(j, &win.control, LOCK, 0, EXCLUSIVE)? == 0 {
                        return Ok(());
                    }
                }
            }
            self.spin(&mut tries);
        }
    }

    /// `MPI_Win_unlock` of rank `r`: its accesses are complete at the target, then the
    /// lock goes.
    pub fn win_unlock(&mut self, w: usize, r: u32) -> Result<()> {
        let win = self.win(w)?;
        let j = self.target(win, r)?;
        let Some(&held) = win.locks.get(&r) else {
            return Err(MpiError::new(
                Class::RmaSync,
                format!("this process holds no lock on rank {r} of the window"),
            ));
        };
        let rma = self.rma()?;
        let flushed = rma.flush(j);
        let released = match held {
            Held::Shared => rma
                .fetch_add(j, &win.control, LOCK, 1u64.wrapping_neg())
                .map(drop),
            Held::Exclusive => rma
                .fetch_add(j, &win.control, LOCK, EXCLUSIVE.wrapping_neg())
                .map(drop),
            Held::Nothing => Ok(()),
        };
        self.win_mut(w)?.locks.remove(&r);
        flushed?;
        Ok(released?)
    }

    /// `MPI_Win_lock_all`: a shared lock on every rank.
    pub fn win_lock_all(&mut self, w: usize, nocheck: bool) -> Result<()> {
        let n = self.comm_any(self.win(w)?.comm)?.size();
        check(self.win(w)?.locks.is_empty(), Class::RmaSync, || {
            "this process holds a lock on the window already".into()
        })?;
        for r in 0..n {
            if let Err(e) = self.win_lock(w, LockType::Shared, r, nocheck) {
                // The locks taken go again.
                let _ = self.win_unlock_all(w);
                return Err(e);
            }
        }
        Ok(())
    }

    /// `MPI_Win_unlock_all`.
    pub fn win_unlock_all(&mut self, w: usize) -> Result<()> {
        let mut held: Vec<u32> = self.win(w)?.locks.keys().copied().collect();
        check(!held.is_empty(), Class::RmaSync, || {
            "this process holds no lock on the window".into()
        })?;
        held.sort_unstable();
        // Every put leaves before the first answer is waited for.
        let flushed = self.rma()?.flush_all();
        let mut first = flushed.err().map(MpiError::from);
        for r in held {
            if let Err(e) = self.win_unlock(w, r) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// `MPI_Win_flush`: every access of this process to rank `r` is complete there.
    pub fn win_flush(&self, w: usize, r: u32) -> Result<()> {
        let j = self.target(self.win(w)?, r)?;
        Ok(self.rma()?.flush(j)?)
    }

    /// `MPI_Win_flush_all`.
    pub fn win_flush_all(&self, w: usize) -> Result<()> {
        self.win(w)?;
        Ok(self.rma()?.flush_all()?)
    }

    /// `MPI_Win_flush_local(_all)`: every access of this process has let go of its
    /// buffers already (puts return once their source may be reused, gets once their
    /// data are in): only progress.
    pub fn win_flush_local(&self, w: usize) -> Result<()> {
        self.win(w)?;
        self.drive_rma();
        Ok(())
    }

    /// `MPI_Put` of `ocount` elements of `otype` at `origin` to `tcount` elements of
    /// `ttype` at displacement `disp` of rank `target`'s part.
    ///
    /// # Safety
    ///
    /// The origin's elements are readable.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn put(
        &self,
        w: usize,
        origin: *const u8,
        ocount: usize,
        otype: &Layout,
        target: Peer,
        disp: i64,
        tcount: usize,
        ttype: &Layout,
    ) -> Result<()> {
        let Some((win, j, at)) = self.access(w, target, disp)? else {
            return Ok(());
        };
        // SAFETY: the caller's promise.
        let data = unsafe { packed(origin, ocount, otype)? };
        same_size(data.len(), tcount, ttype)?;
        self.write_runs(win, j, at, tcount, ttype, &data)
    }

    /// `MPI_Get`: the other way.
    ///
    /// # Safety
    ///
    /// The origin's elements are writable and not borrowed elsewhere.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn get(
        &self,
        w: usize,
        origin: *mut u8,
        ocount: usize,
        otype: &Layout,
        target: Peer,
        disp: i64,
        tcount: usize,
        ttype: &Layout,
    ) -> Result<()> {
        let Some((win, j, at)) = self.access(w, target, disp)? else {
            return Ok(());
        };
        let len = otype.bytes(ocount)?;
        same_size(len, tcount, ttype)?;
        if otype.is_contiguous() && len > 0 {
            // Straight into the application's buffer.
            // SAFETY: the caller's promise: `ocount` writable elements at `origin`,
            // contiguous: `len` bytes.
            let dst = unsafe { std::slice::from_raw_parts_mut(origin, len) };
            return self.read_runs(win, j, at, tcount, ttype, dst);
        }
        let mut data = vec![0u8; len];
        self.read_runs(win, j, at, tcount, ttype, &mut data)?;
        // SAFETY: the caller's promise: `ocount` writable elements at `origin`.
        unsafe { otype.unpack(&data, origin) };
        Ok(())
    }

    /// Writes `data`, `tcount` packed elements of `ttype`, at byte `at` of job rank
    /// `j`'s part.
    fn write_runs(
        &self,
        win: &Win,
        j: u32,
        at: u64,
        tcount: usize,
        ttype: &Layout,
        data: &[u8],
    ) -> Result<()> {
        let rma = self.rma()?;
        for (off, range) in target_runs(at, tcount, ttype)? {
            rma.put(j, &win.data, off, &data[range])?;
        }
        Ok(())
    }

    /// Reads `tcount` elements of `ttype` at byte `at` of job rank `j`'s part into
    /// `dst`, packed.
    fn read_runs(
        &self,
        win: &Win,
        j: u32,
        at: u64,
        tcount: usize,
        ttype: &Layout,
        dst: &mut [u8],
    ) -> Result<()> {
        let rma = self.rma()?;
        for (off, range) in target_runs(at, tcount, ttype)? {
            rma.get(j, &win.data, off, &mut dst[range])?;
        }
        Ok(())
    }

    /// The window, the target's job rank and the byte its displacement names; `None`
    /// for `MPI_PROC_NULL`.
    fn access(&self, w: usize, target: Peer, disp: i64) -> Result<Option<(&Win, u32, u64)>> {
        Ok(self
            .access_rank(w, target, disp)?
            .map(|(win, _, j, at)| (win, j, at)))
    }

    /// [`Mpi::access`] with the target's rank in the window.
    fn access_rank(
        &self,
        w: usize,
        target: Peer,
        disp: i64,
    ) -> Result<Option<(&Win, u32, u32, u64)>> {
        let win = self.win(w)?;
        let r = match target {
            Peer::Rank(r) => r,
            Peer::Null => return Ok(None),
            Peer::Any => return Err(MpiError::new(Class::Rank, "MPI_ANY_SOURCE as a target")),
        };
        let j = self.target(win, r)?;
        let at = u64::try_from(disp)
            .ok()
            .and_then(|d| d.checked_mul(win.units[r as usize]))
            .ok_or_else(|| MpiError::new(Class::Disp, format!("displacement {disp}")))?;
        Ok(Some((win, r, j, at)))
    }

    /// `MPI_Accumulate`, `MPI_Get_accumulate` and `MPI_Fetch_and_op`: `tcount` elements
    /// of `ttype` at the target become `origin op target` (the origin's data, packed;
    /// none for `MPI_NO_OP`), element by element atomically with respect to other
    /// accumulates; `result` receives what was there before.
    ///
    /// # Safety
    ///
    /// `result`'s elements, when given, are writable and not borrowed elsewhere.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn accumulate(
        &self,
        w: usize,
        origin: &[u8],
        result: Option<(*mut u8, usize, &Layout)>,
        target: Peer,
        disp: i64,
        tcount: usize,
        ttype: &Layout,
        op: &Op,
    ) -> Result<()> {
        check(matches!(op, Op::Builtin(_)), Class::Op, || {
            "one-sided accumulates take MPI's operations only".into()
        })?;
        op.check(ttype.elem)?;
        let Some((win, r, j, at)) = self.access_rank(w, target, disp)? else {
            return Ok(());
        };
        let len = ttype.bytes(tcount)?;
        let no_op = matches!(op, Op::Builtin(Builtin::NoOp));
        if !no_op {
            same_size(origin.len(), tcount, ttype)?;
        }
        if let Some((_, n, layout)) = result {
            same_size(layout.bytes(n)?, tcount, ttype)?;
        }
        if len == 0 {
            return Ok(());
        }
        let runs = target_runs(at, tcount, ttype)?;
        let rma = self.rma()?;
        let Op::Builtin(b) = *op else {
            unreachable!("checked above")
        };
        // Packed bytes of a type of no one kind (replaced or fetched only) are bytes.
        let elem = match ttype.elem {
            Some(e) => crate::op::element(b, e)?,
            None => Element::Bytes { size: 1 },
        };
        let lock = (&win.control, MUTEX);
        let data = |range: std::ops::Range<usize>| if no_op { &[][..] } else { &origin[range] };
        // The target's bytes as they were, when asked for, in a buffer kept from call to
        // call (a fresh one of a large accumulate costs its page faults every time).
        let mut old = self.scratch.take();
        old.clear();
        old.resize(if result.is_some() { len } else { 0 }, 0);
        let fetch = result.is_some();
        let done = (|| {
            for (off, range) in runs {
                let Some(word_elem) = word_elem(ttype).filter(|_| win.aligned) else {
                    let f = fetch.then(|| &mut old[range.clone()]);
                    rma.accumulate(j, &win.data, off, elem, b, data(range), lock, f)?;
                    continue;
                };
                for k in (range.start..range.end).step_by(8) {
                    let at = off + (k - range.start) as u64;
                    if win.on_word(r, at) {
                        let v = if no_op { 0 } else { word(&origin[k..]) };
                        let was = self.word_op(win, j, at, op, word_elem, v)?;
                        if fetch {
                            old[k..k + 8].copy_from_slice(&was.to_ne_bytes());
                        }
                    } else {
                        let f = fetch.then(|| &mut old[k..k + 8]);
                        rma.accumulate(j, &win.data, at, elem, b, data(k..k + 8), lock, f)?;
                    }
                }
            }
            Ok(())
        })();
        if let (Ok(()), Some((buf, _, layout))) = (&done, result) {
            // SAFETY: the caller's promise.
            unsafe { layout.unpack(&old, buf) };
        }
        self.scratch.set(old);
        done
    }

    /// `MPI_Compare_and_swap` of one element of `ty`: the target's becomes `origin` if
    /// it is `compare`; `result` receives what it was.
    ///
    /// # Safety
    ///
    /// `origin`, `compare` and `result` hold one element of `ty` each, `result`
    /// writable.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn compare_and_swap(
        &self,
        w: usize,
        origin: *const u8,
        compare: *const u8,
        result: *mut u8,
        ty: &Layout,
        target: Peer,
        disp: i64,
    ) -> Result<()> {
        check(
            ty.is_contiguous() && ty.blocks.len() == 1,
            Class::Type,
            || "compare-and-swap takes one element of a predefined type".into(),
        )?;
        let Some((win, r, j, at)) = self.access_rank(w, target, disp)? else {
            return Ok(());
        };
        let n = ty.size;
        // SAFETY: the caller's promise: one element each.
        let (new, cmp) = unsafe {
            (
                std::slice::from_raw_parts(origin, n),
                std::slice::from_raw_parts(compare, n),
            )
        };
        let rma = self.rma()?;
        let old = if word_elem(ty).is_some() && n == 8 && win.on_word(r, at) {
            rma.compare_swap(j, &win.data, at, word(cmp), word(new))?
                .to_ne_bytes()
                .to_vec()
        } else {
            let mut old = vec![0u8; n];
            let size = u8::try_from(n).map_err(|_| {
                MpiError::new(Class::Type, "compare-and-swap of an element this large")
            })?;
            rma.compare_swap_elements(
                j,
                &win.data,
                at,
                Element::Bytes { size },
                cmp,
                new,
                (&win.control, MUTEX),
                &mut old,
            )?;
            old
        };
        // SAFETY: the caller's promise: one writable element.
        unsafe { std::ptr::copy_nonoverlapping(old.as_ptr(), result, n) };
        Ok(())
    }

    /// `op` with the 8-byte integer `v` (`elem`) on the aligned word at byte `at` of job
    /// rank `j`'s part ([`Win::on_word`]): quiver's atomics. Returns the word before.
    fn word_op(&self, win: &Win, j: u32, at: u64, op: &Op, elem: Elem, v: u64) -> Result<u64> {
        let rma = self.rma()?;
        Ok(match op {
            Op::Builtin(Builtin::Sum) => rma.fetch_add(j, &win.data, at, v)?,
            Op::Builtin(Builtin::Replace) => rma.swap(j, &win.data, at, v)?,
            Op::Builtin(Builtin::NoOp) => rma.fetch_add(j, &win.data, at, 0)?,
            _ => {
                // `v op current`, as the accumulate asks.
                let combine = |current: u64| -> Result<u64> {
                    let mut out = current.to_ne_bytes();
                    let inp = v.to_ne_bytes();
                    // SAFETY: one element of `elem` (8 bytes) in each.
                    unsafe { op.apply(elem, 1, inp.as_ptr(), out.as_mut_ptr(), 0)? };
                    Ok(u64::from_ne_bytes(out))
                };
                let mut cur = rma.fetch_add(j, &win.data, at, 0)?;
                loop {
                    let was = rma.compare_swap(j, &win.data, at, cur, combine(cur)?)?;
                    if was == cur {
                        break cur;
                    }
                    cur = was;
                }
            }
        })
    }
}

/// Fails unless `len` packed bytes are `count` elements of `layout`.
fn same_size(len: usize, count: usize, layout: &Layout) -> Result<()> {
    let want = layout.bytes(count)?;
    check(len == want, Class::Arg, || {
        format!("the origin has {len} bytes of data and the target {want}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints() -> Layout {
        Layout::builtin(Elem::Num(Num::I32))
    }

    #[test]
    fn a_contiguous_target_is_one_run_and_a_vector_one_per_block() {
        assert_eq!(target_runs(40, 3, &ints()).unwrap(), vec![(40, 0..12)]);
        // 3 blocks of 2 ints, one every 4 ints: 8 bytes every 16.
        let v = Layout::hvector(3, 2, 16, &ints()).unwrap();
        assert_eq!(
            target_runs(8, 1, &v).unwrap(),
            vec![(8, 0..8), (24, 8..16), (40, 16..24)]
        );
        // A type whose elements follow each other (an int 4 bytes after its address):
        // one run.
        let shifted = Layout::hindexed([(4isize, 1usize)], &ints()).unwrap();
        assert!(!shifted.is_contiguous());
        assert_eq!(target_runs(0, 3, &shifted).unwrap(), vec![(4, 0..12)]);
    }

    #[test]
    fn a_type_reaching_before_the_window_is_an_error() {
        let neg = Layout::hindexed([(-8isize, 1usize)], &ints()).unwrap();
        assert_eq!(target_runs(4, 1, &neg).unwrap_err().class(), Class::Disp);
        assert_eq!(target_runs(8, 1, &neg).unwrap(), vec![(0, 0..4)]);
    }

    #[test]
    fn only_8_byte_integers_take_quivers_atomics() {
        let longs = Layout::builtin(Elem::Num(Num::I64));
        let strided = Layout::hvector(2, 1, 16, &longs).unwrap();
        assert!(word_elem(&longs).is_some());
        assert!(word_elem(&strided).is_some());
        assert!(word_elem(&Layout::builtin(Elem::Num(Num::U64))).is_some());
        assert!(word_elem(&Layout::builtin(Elem::Num(Num::F64))).is_none());
        assert!(word_elem(&ints()).is_none());
    }
}
