//! The remote-operation protocol on the engine's hook (sans-IO): the target's half
//! applies what origins send to the windows this rank exposes (a put is copied into
//! the window from where its frame lies, a get answered in pieces, an atomic applied to
//! the word, an accumulate applied whole while its lock word is held, a flush answered), and the origin's half collects the answers to what this
//! rank asked for (and asks for the next chunk of a large get as its answer arrives).
//!
//! What it guarantees: nothing outside an exposed window is read or written (the
//! window's number and generation, the offset and the length are checked first); a
//! request that fails the checks is refused and counted, and its origin hears why (a
//! get's or an atomic's answer carries the status, a put's refusal comes back with the
//! origin's next flush); a message that is not a well-formed request or answer is
//! dropped and counted ([`Counters::malformed`]), as is an answer to nothing this rank
//! asked for. Requests from one origin are applied in the order they were sent (the
//! engine's channels keep order), so a flush is answered after every put before it.

use super::layout::{copy_elements, Layout};
use super::memory::WindowMemory;
use super::ops::{self, At, AtomicOp, Op, Status};
use super::reduce::{self, Element, Reduce};
#[cfg(test)]
use super::window::SharedObject;
use crate::addr::Source;
use crate::channel::reliable::Time;
use crate::engine::protocol::{Disposition, Outbox, Protocol};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

/// A window this rank exposes: its memory and generation.
pub(crate) struct Exposure {
    pub mem: Arc<WindowMemory>,
    pub generation: u32,
}

/// Where the answer to a get lands.
#[derive(Debug)]
pub(crate) enum Landing {
    /// A buffer the request owns ([`Rma::get_start`](super::Rma::get_start)), given back
    /// once the answer is in.
    Owned(Vec<u8>),
    /// The caller's own memory, lent by a blocking [`Rma::get`](super::Rma::get) for as
    /// long as it waits: the answer lands in its final place, with no copy after it.
    Lent(LentBytes),
}

/// `len` bytes at `ptr`, lent to a pending get ([`Landing::Lent`]).
#[derive(Debug)]
pub(crate) struct LentBytes {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the bytes are written only through the state's lock (`State::got`), by
// whichever thread drives the protocol; the lender waits meanwhile (`LentBytes::new`'s
// contract).
unsafe impl Send for LentBytes {}

impl LentBytes {
    /// Lends `bytes` to a pending get.
    ///
    /// # Safety
    /// The pending get holding this must be removed from [`State::pending`] (under the
    /// lock) before `bytes` is used again or goes away; nothing else may touch `bytes`
    /// meanwhile.
    pub(crate) unsafe fn new(bytes: &mut [u8]) -> LentBytes {
        LentBytes {
            ptr: bytes.as_mut_ptr(),
            len: bytes.len(),
        }
    }
}

impl Landing {
    fn len(&self) -> usize {
        match self {
            Landing::Owned(v) => v.len(),
            Landing::Lent(l) => l.len,
        }
    }

    /// The bytes the answer lands in.
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Landing::Owned(v) => v,
            // SAFETY: the lender keeps the bytes valid and untouched until it removed
            // this pending get, which is still in the state (`LentBytes::new`).
            Landing::Lent(l) => unsafe { std::slice::from_raw_parts_mut(l.ptr, l.len) },
        }
    }

    /// The owned buffer (empty for lent memory: it is the lender's already).
    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self {
            Landing::Owned(v) => v,
            Landing::Lent(_) => Vec::new(),
        }
    }
}

/// What the origin waits for, by request id.
#[derive(Debug)]
pub(crate) enum Pending {
    /// A get of `buf.len()` bytes: `left` of them not yet arrived; what is still to be
    /// asked of a large one.
    Get {
        buf: Landing,
        left: u64,
        status: Status,
        asking: Option<Asking>,
    },
    /// An atomic; its answer once it came.
    Atomic(Option<(Status, u64)>),
    /// An accumulate of `len` bytes; its answer once it came (the bytes before, when
    /// it fetched them).
    Accumulate {
        len: u64,
        fetch: bool,
        answer: Option<(Status, Vec<u8>)>,
    },
    /// A flush; the target's count of refused puts and the first's reason once it came.
    Flush(Option<(Status, u64)>),
}

/// The rest of a large get, asked a chunk at a time as the answer arrives: at most two
/// chunks are asked and not yet answered, so the target never has more than two chunks
/// of it to send. Answered whole, a get of 16 MiB had the target build all its frames
/// (4 ms) before it read another acknowledgement, and the link idled meanwhile
/// (DESIGN-NOTES, "Large gets in chunks").
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asking {
    /// Where the whole get starts.
    at: At,
    /// Bytes asked so far, from the start.
    asked: u64,
    piece: u32,
    chunk: u64,
}

/// Pieces per chunk of a large get (at 1440 bytes a piece, 184 KB: two chunks keep the
/// target's queue above a channel window while the next request travels).
pub(crate) const GET_CHUNK_PIECES: u64 = 128;

impl Pending {
    /// A get of `buf.len()` bytes at `at` asked under `id`, answered in pieces of at most
    /// `piece` bytes; and its first request, for up to two chunks of
    /// [`GET_CHUNK_PIECES`] pieces (the rest is asked as the answer arrives).
    pub(crate) fn get(id: u64, buf: Landing, at: At, piece: u32) -> (Pending, [u8; ops::GET_LEN]) {
        let len = buf.len() as u64;
        let chunk = u64::from(piece).clamp(MIN_PIECE, GET_PIECE) * GET_CHUNK_PIECES;
        let first = len.min(2 * chunk);
        let asking = (first < len).then_some(Asking {
            at,
            asked: first,
            piece,
            chunk,
        });
        let pending = Pending::Get {
            buf,
            left: len,
            status: Status::Done,
            asking,
        };
        (pending, ops::get(at, id, first, piece, 0))
    }

    /// Whether the answer is complete.
    pub(crate) fn done(&self) -> bool {
        match self {
            Pending::Get { left, status, .. } => *left == 0 || *status != Status::Done,
            Pending::Atomic(a) | Pending::Flush(a) => a.is_some(),
            Pending::Accumulate { answer, .. } => answer.is_some(),
        }
    }
}

/// Counters of both halves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub puts_applied: u64,
    pub bytes_put: u64,
    pub gets_served: u64,
    pub bytes_got: u64,
    pub atomics_served: u64,
    pub accumulates_served: u64,
    /// Accumulates answered [`Status::Busy`] (their origins ask again).
    pub busy: u64,
    pub notified: u64,
    pub refused: u64,
    pub malformed: u64,
}

/// One rank's state of the protocol: its exposed windows and its pending requests.
#[derive(Default)]
pub(crate) struct State {
    pub exposed: HashMap<u32, Exposure>,
    /// Puts refused per origin since its last flush: how many, and the first's reason.
    pub refused: HashMap<u32, (u64, Status)>,
    /// This rank's requests waiting for their answers, by id: the rank asked, and what.
    pub pending: HashMap<u64, (u32, Pending)>,
    /// Numbers of this rank's windows freed since the origin side last looked (it then
    /// forgets its mappings of the other ranks' parts of them).
    pub freed: Vec<u32>,
    pub counters: Counters,
    /// Barrier rounds other ranks reached that this rank has not consumed yet:
    /// (rank, episode, round).
    pub arrived: HashSet<(u32, u64, u8)>,
    /// The barrier episode this rank is in or last finished: rounds of episodes
    /// outside it and the next are dropped (a peer is never more than one ahead).
    pub episode: u64,
    /// Barrier rounds in this job at most: a round number at or above is dropped.
    pub max_rounds: u8,
    /// Combining-tree values that arrived and were not consumed yet: from children
    /// (child, episode) and from the parent (episode); episodes as for barriers.
    pub combined_up: HashMap<(u32, u64), u64>,
    pub combined_down: HashMap<u64, u64>,
    pub combining: u64,
    /// The longest answer this rank sends (its `max_message`): an accumulate that would
    /// need a longer one is refused. `None`: no limit (tests).
    pub max_answer: Option<usize>,
    /// Scratch of indexed requests' offsets and of packed get answers (kept: no
    /// allocation per request once they have grown).
    offsets: Vec<u64>,
    packed: Vec<u8>,
}

/// The memory of window `at` of length `len` in `state`, checked.
fn locate(
    exposed: &HashMap<u32, Exposure>,
    at: At,
    len: u64,
) -> Result<(&WindowMemory, usize), Status> {
    let w = exposed
        .get(&at.window)
        .filter(|w| w.generation == at.generation)
        .ok_or(Status::NoWindow)?;
    let end = at.offset.checked_add(len).ok_or(Status::OutOfBounds)?;
    if end > w.mem.len() as u64 {
        return Err(Status::OutOfBounds);
    }
    Ok((&w.mem, at.offset as usize))
}

/// The memory of window `at` (number and generation) when `layout` ends inside it.
fn window_for<'e>(
    exposed: &'e HashMap<u32, Exposure>,
    at: At,
    layout: Layout,
) -> Result<&'e WindowMemory, Status> {
    let w = exposed
        .get(&at.window)
        .filter(|w| w.generation == at.generation)
        .ok_or(Status::NoWindow)?;
    match layout.end() {
        Some(end) if end <= w.mem.len() as u64 => Ok(&w.mem),
        _ => Err(Status::OutOfBounds),
    }
}

/// Queues `bytes` for `from` as the answer to get `id`, in pieces of at most `piece`
/// bytes (clamped to [`MIN_PIECE`]..=[`GET_PIECE`]), the first at offset `base` of the
/// get; one empty piece for no bytes.
fn answer_in_pieces(
    from: Source,
    (id, base): (u64, u64),
    bytes: &[u8],
    piece: u32,
    out: &mut Outbox,
) {
    let piece = u64::from(piece).clamp(MIN_PIECE, GET_PIECE) as usize;
    if bytes.is_empty() {
        out.forward(from, &ops::got(Status::Done, id, base), &[]);
        return;
    }
    for (i, chunk) in bytes.chunks(piece).enumerate() {
        let offset = base.wrapping_add((i * piece) as u64);
        out.forward(from, &ops::got(Status::Done, id, offset), chunk);
    }
}

/// The 64-bit word at `at`, checked (in bounds, 8-byte aligned).
pub(crate) fn word(exposed: &HashMap<u32, Exposure>, at: At) -> Result<&AtomicU64, Status> {
    let (mem, offset) = locate(exposed, at, 8)?;
    // The word's address: a window may start anywhere (a part of shared memory, lent
    // memory).
    if !super::access::aligned(mem.ptr(), offset as u64) {
        return Err(Status::Misaligned);
    }
    // Every access to window words by the protocol is atomic.
    // SAFETY: offset + 8 <= the window's length (`locate`), the word's address 8-byte
    // aligned (checked); it lives while `exposed` holds it (the borrow).
    Ok(unsafe { &*(mem.ptr().add(offset) as *const AtomicU64) })
}

/// The longest accumulate one request carries (a longer one is several requests,
/// each atomic per element, as MPI asks): a target refuses more, so that no request
/// makes it build a larger answer.
pub(crate) const ACCUMULATE_MAX: u64 = 64 << 10;

/// Tries of a taken lock word before each next one yields the core (its holder may
/// share this core).
const LOCK_SPINS: u32 = 64;
/// Tries of a taken lock word by the target before it answers [`Status::Busy`] (and
/// serves other requests meanwhile): a holder combines in its own memory and lets go
/// within microseconds, but a word that a broken or lying rank keeps must not stop the
/// target from serving.
pub(crate) const SERVED_LOCK_TRIES: u32 = 4096;

/// What an accumulate does, checked: `op` (a [`Reduce`] or [`ops::CAS`]) on elements
/// of `elem`, `len` bytes, with `data` (the origin's elements; none for `NoOp`; the
/// compared then the new ones for a compare-and-swap).
pub(crate) fn check_accumulate(
    op: u8,
    elem: Element,
    len: u64,
    data_len: usize,
) -> Result<Option<Reduce>, Status> {
    let size = elem.size() as u64;
    if !len.is_multiple_of(size) || len > ACCUMULATE_MAX {
        return Err(Status::BadLength);
    }
    let (reduce, want) = match op {
        ops::CAS => (None, 2 * len),
        op => {
            let r = Reduce::from_u8(op).ok_or(Status::BadOp)?;
            reduce::check(r, elem).map_err(|_| Status::BadOp)?;
            (Some(r), if r == Reduce::NoOp { 0 } else { len })
        }
    };
    if data_len as u64 != want {
        return Err(Status::BadLength);
    }
    Ok(reduce)
}

/// Whether the lock word at `lock` lies in the `len` bytes at `at` (an update could
/// then write the word it holds).
pub(crate) fn lock_in_range(at: At, len: u64, lock: At) -> bool {
    (at.window, at.generation) == (lock.window, lock.generation)
        && lock.offset < at.offset.saturating_add(len)
        && at.offset < lock.offset.saturating_add(8)
}

/// A lock word held: let go when dropped (whatever happens while it is held).
struct Held<'a>(&'a AtomicU64);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.store(0, std::sync::atomic::Ordering::Release);
    }
}

/// Applies a checked accumulate ([`check_accumulate`]) to the `len` bytes at `mem`
/// holding `lock` (compare-and-swap 0 to `holder`; every accumulate of the window takes
/// the same word, so concurrent ones are atomic per element): the bytes before go to
/// `old` first when given. The target's side and a same-node origin's direct update
/// alike. Gives up, changing nothing, after `tries` failed tries of the word when given
/// (false); otherwise waits for it.
///
/// # Safety
///
/// `mem` is `len` bytes of window memory, mapped for as long as the call lasts; `data`
/// and `old` as [`check_accumulate`] passed them (`old`: `len` bytes), neither of them
/// in those `len` bytes.
pub(crate) unsafe fn apply_locked(
    (lock, holder, tries): (&AtomicU64, u64, Option<u32>),
    mem: *mut u8,
    len: usize,
    (reduce, elem): (Option<Reduce>, Element),
    data: &[u8],
    old: Option<&mut [u8]>,
) -> bool {
    use std::sync::atomic::Ordering::{Acquire, Relaxed};
    let mut failed = 0u32;
    while lock.compare_exchange(0, holder, Acquire, Relaxed).is_err() {
        failed = failed.wrapping_add(1);
        if tries.is_some_and(|t| failed >= t) {
            return false;
        }
        if failed.is_multiple_of(LOCK_SPINS) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    let _held = Held(lock);
    if let Some(old) = old {
        // SAFETY: `len` bytes at `mem` (the caller's promise) into `old`'s `len`,
        // apart.
        unsafe { crate::link::copy_bytes(mem, old.as_mut_ptr(), len) };
    }
    let size = elem.size();
    match reduce {
        Some(r) => {
            // SAFETY: `len / size` elements at both (checked lengths).
            let applied = unsafe { reduce::apply(r, elem, len / size, data.as_ptr(), mem) };
            debug_assert!(applied.is_ok(), "checked by check_accumulate");
        }
        None => {
            let (compare, new) = data.split_at(len);
            let mut here = [0u8; 256];
            for k in (0..len).step_by(size) {
                // Read by copy: others may change the window's bytes (by its words'
                // atomics, or racing puts) while this compares them.
                // SAFETY: element `k` of the `len` bytes at `mem`; an element is at
                // most 255 bytes.
                unsafe { crate::link::copy_bytes(mem.add(k), here.as_mut_ptr(), size) };
                if here[..size] == compare[k..k + size] {
                    // SAFETY: as above.
                    unsafe { crate::link::copy_bytes(new[k..].as_ptr(), mem.add(k), size) };
                }
            }
        }
    }
    true
}

impl State {
    /// Handles one message from `from`: what a target applies and answers, what an
    /// origin waited for. True when it completed something the application may wait
    /// for.
    pub(crate) fn handle(&mut self, from: Source, msg: &[u8], out: &mut Outbox) -> bool {
        let Some(op) = ops::decode(msg) else {
            self.counters.malformed += 1;
            return false;
        };
        match op {
            Op::Put { at, data } => {
                match locate(&self.exposed, at, data.len() as u64) {
                    Ok((mem, offset)) => {
                        // Others touching these bytes meanwhile is the application's race.
                        // SAFETY: offset + len <= the mapping's length (checked); the
                        // mapping lives while `mem` is borrowed.
                        unsafe {
                            crate::link::copy_bytes(
                                data.as_ptr(),
                                mem.ptr().add(offset),
                                data.len(),
                            )
                        };
                        self.counters.puts_applied += 1;
                        self.counters.bytes_put += data.len() as u64;
                    }
                    Err(status) => self.refuse_put(from.rank, status),
                }
                false
            }
            Op::Get {
                at,
                id,
                len,
                piece,
                base,
            } => {
                self.serve_get(from, at, (id, base), len, piece, out);
                false
            }
            Op::Atomic { at, op, id, a, b } => {
                let word = AtomicOp::from_u8(op)
                    .ok_or(Status::BadOp)
                    .and_then(|op| Ok((op, word(&self.exposed, at)?)));
                let (status, value) = match word {
                    Ok((op, w)) => {
                        self.counters.atomics_served += 1;
                        (Status::Done, op.apply(w, a, b))
                    }
                    Err(s) => {
                        self.counters.refused += 1;
                        (s, 0)
                    }
                };
                out.forward(from, &ops::atomic_done(status, id, value), &[]);
                false
            }
            Op::PutStrided {
                at,
                stride,
                elem,
                count,
                data,
            } => {
                let dst = Layout::Strided {
                    offset: at.offset,
                    stride,
                    elem,
                    count,
                };
                self.put_layout(from.rank, at, dst, data);
                false
            }
            Op::PutIndexed {
                at,
                elem,
                offsets,
                data,
            } => {
                let mut offs = std::mem::take(&mut self.offsets);
                offs.clear();
                offs.extend(ops::offsets(offsets));
                self.put_layout(
                    from.rank,
                    at,
                    Layout::Indexed {
                        offsets: &offs,
                        elem,
                    },
                    data,
                );
                self.offsets = offs;
                false
            }
            Op::GetStrided {
                at,
                stride,
                elem,
                count,
                id,
                piece,
            } => {
                let src = Layout::Strided {
                    offset: at.offset,
                    stride,
                    elem,
                    count,
                };
                self.serve_layout_get(from, at, src, id, piece, out);
                false
            }
            Op::GetIndexed {
                at,
                elem,
                offsets,
                id,
                piece,
            } => {
                let mut offs = std::mem::take(&mut self.offsets);
                offs.clear();
                offs.extend(ops::offsets(offsets));
                let src = Layout::Indexed {
                    offsets: &offs,
                    elem,
                };
                self.serve_layout_get(from, at, src, id, piece, out);
                self.keep_offsets(offs);
                false
            }
            Op::Notify { at, add } => {
                match word(&self.exposed, at) {
                    Ok(w) => {
                        w.fetch_add(add, std::sync::atomic::Ordering::Release);
                        self.counters.notified += 1;
                    }
                    Err(status) => self.refuse_put(from.rank, status),
                }
                false
            }
            Op::CombineUp { episode, value } | Op::CombineDown { episode, value }
                if episode != self.combining && episode != self.combining + 1 =>
            {
                let _ = value;
                self.counters.malformed += 1;
                false
            }
            Op::CombineUp { episode, value } => {
                self.combined_up.insert((from.rank, episode), value);
                true
            }
            Op::CombineDown { episode, value } => {
                self.combined_down.insert(episode, value);
                true
            }
            Op::Barrier { round, episode } => {
                if (episode == self.episode || episode == self.episode + 1)
                    && round < self.max_rounds
                {
                    self.arrived.insert((from.rank, episode, round));
                    true
                } else {
                    self.counters.malformed += 1;
                    false
                }
            }
            Op::Combined { parts } => {
                // Each part is a put of its own, applied in order (none answers).
                for part in ops::parts(parts) {
                    match part {
                        Some(put) => {
                            self.handle(from, put, out);
                        }
                        None => self.counters.malformed += 1,
                    }
                }
                false
            }
            Op::Accumulate {
                at,
                op,
                fetch,
                elem,
                lock,
                id,
                len,
                data,
            } => {
                let mut old = std::mem::take(&mut self.packed);
                let status = match self.serve_accumulate(
                    from,
                    (at, lock),
                    (op, elem),
                    len,
                    data,
                    fetch.then_some(&mut old),
                ) {
                    Ok(()) => {
                        self.counters.accumulates_served += 1;
                        Status::Done
                    }
                    Err(Status::Busy) => {
                        old.clear();
                        self.counters.busy += 1;
                        Status::Busy
                    }
                    Err(s) => {
                        old.clear();
                        self.counters.refused += 1;
                        s
                    }
                };
                out.forward(from, &ops::accumulated(status, id), &old);
                old.clear();
                self.packed = old;
                false
            }
            Op::Accumulated { status, id, data } => self.answer(from.rank, id, |p| match p {
                Pending::Accumulate {
                    len,
                    fetch,
                    answer: a @ None,
                } if status != Status::Done
                    || data.len() as u64 == if *fetch { *len } else { 0 } =>
                {
                    *a = Some((status, data.to_vec()));
                    true
                }
                _ => false,
            }),
            Op::Flush { id } => {
                let (refused, status) =
                    self.refused.remove(&from.rank).unwrap_or((0, Status::Done));
                out.forward(from, &ops::flushed(status, id, refused), &[]);
                false
            }
            Op::Got {
                status,
                id,
                offset,
                data,
            } => self.got(from, (id, offset), status, data, out),
            Op::AtomicDone { status, id, value } => self.answer(from.rank, id, |p| match p {
                Pending::Atomic(a @ None) => {
                    *a = Some((status, value));
                    true
                }
                _ => false,
            }),
            Op::Flushed {
                status,
                id,
                refused,
            } => self.answer(from.rank, id, |p| match p {
                Pending::Flush(f @ None) => {
                    *f = Some((status, refused));
                    true
                }
                _ => false,
            }),
        }
    }

    /// Applies accumulate request `(op, elem)` of `len` bytes at `at`, holding the word
    /// at `lock`, from `from`; the bytes before into `old` when it fetches.
    fn serve_accumulate(
        &self,
        from: Source,
        (at, lock): (At, At),
        (op, elem): (u8, [u8; 4]),
        len: u64,
        data: &[u8],
        old: Option<&mut Vec<u8>>,
    ) -> Result<(), Status> {
        let elem = Element::decode(elem).ok_or(Status::BadOp)?;
        let reduce = check_accumulate(op, elem, len, data.len())?;
        let answer = ops::ACCUMULATED_LEN as u64 + if old.is_some() { len } else { 0 };
        if lock_in_range(at, len, lock) || self.max_answer.is_some_and(|m| answer > m as u64) {
            return Err(Status::BadLength);
        }
        let (mem, offset) = locate(&self.exposed, at, len)?;
        let lock = word(&self.exposed, lock)?;
        let old = old.map(|o| {
            o.clear();
            o.resize(len as usize, 0);
            o.as_mut_slice()
        });
        // SAFETY: offset + len <= the window's length (`locate`), mapped while `mem` is
        // borrowed; `data` (the request's) and `old` (this state's scratch) checked by
        // `check_accumulate` and sized above, neither in the window.
        let applied = unsafe {
            apply_locked(
                (lock, u64::from(from.rank) + 1, Some(SERVED_LOCK_TRIES)),
                mem.ptr().add(offset),
                len as usize,
                (reduce, elem),
                data,
                old,
            )
        };
        if applied {
            Ok(())
        } else {
            Err(Status::Busy)
        }
    }

    /// Keeps the offsets' scratch for the next request, unless one made it large.
    fn keep_offsets(&mut self, offs: Vec<u64>) {
        if offs.capacity() * 8 <= SCRATCH_KEPT {
            self.offsets = offs;
        }
    }

    fn refuse_put(&mut self, origin: u32, status: Status) {
        self.counters.refused += 1;
        let r = self.refused.entry(origin).or_insert((0, status));
        r.0 += 1;
    }

    /// Answers get `id` from `from`: the range (bytes `base..` of the get) in pieces of
    /// at most `piece` bytes (the origin's frame payload: each piece then lands in one
    /// frame), or its refusal.
    fn serve_get(
        &mut self,
        from: Source,
        at: At,
        (id, base): (u64, u64),
        len: u64,
        piece: u32,
        out: &mut Outbox,
    ) {
        match locate(&self.exposed, at, len) {
            Ok((mem, offset)) => {
                self.counters.gets_served += 1;
                self.counters.bytes_got += len;
                // A concurrent write by another party is the application's race.
                let start = mem.ptr().wrapping_add(offset);
                // SAFETY: offset + len <= the mapping's length (checked); read while `mem`
                // is borrowed (the outbox copies the bytes before this returns).
                let bytes = unsafe { std::slice::from_raw_parts(start, len as usize) };
                answer_in_pieces(from, (id, base), bytes, piece, out);
            }
            Err(status) => {
                self.counters.refused += 1;
                out.forward(from, &ops::got(status, id, base), &[]);
            }
        }
    }

    /// Applies the elements packed in `data` to layout `dst` of window `at`, or refuses.
    fn put_layout(&mut self, origin: u32, at: At, dst: Layout, data: &[u8]) {
        if dst.bytes() != Some(data.len() as u64) {
            self.counters.malformed += 1;
            return;
        }
        match window_for(&self.exposed, at, dst) {
            Ok(mem) => {
                // SAFETY: `dst` ends inside the mapping (`window_for`), the packed source
                // is exactly its elements (checked above); a frame never lies in a window.
                unsafe {
                    copy_elements(
                        data.as_ptr(),
                        Layout::dense(dst.elem(), dst.count()),
                        mem.ptr(),
                        dst,
                    )
                };
                self.counters.puts_applied += 1;
                self.counters.bytes_put += data.len() as u64;
            }
            Err(status) => self.refuse_put(origin, status),
        }
    }

    /// Answers a strided or indexed get: the elements of `src` packed, in pieces.
    fn serve_layout_get(
        &mut self,
        from: Source,
        at: At,
        src: Layout,
        id: u64,
        piece: u32,
        out: &mut Outbox,
    ) {
        let window = window_for(&self.exposed, at, src);
        // An answer is at most the window's length (a stride of 0 could ask for more).
        let bytes = src
            .bytes()
            .filter(|&b| window.as_ref().is_ok_and(|m| b <= m.len() as u64));
        match (window, bytes) {
            (Ok(mem), Some(len)) => {
                self.counters.gets_served += 1;
                self.counters.bytes_got += len;
                self.packed.clear();
                self.packed.resize(len as usize, 0);
                // SAFETY: `src` ends inside the mapping (checked), the packed buffer
                // holds exactly its elements.
                unsafe {
                    copy_elements(
                        mem.ptr(),
                        src,
                        self.packed.as_mut_ptr(),
                        Layout::dense(src.elem(), src.count()),
                    )
                };
                answer_in_pieces(from, (id, 0), &self.packed, piece, out);
                if self.packed.capacity() > SCRATCH_KEPT {
                    self.packed = Vec::new();
                }
            }
            (w, _) => {
                self.counters.refused += 1;
                let status = w.err().unwrap_or(Status::OutOfBounds);
                out.forward(from, &ops::got(status, id, 0), &[]);
            }
        }
    }

    /// A piece of the answer to get `id`, from `from`, at `offset` of the get; asks the
    /// next chunk of a large get when at most one is still to come.
    fn got(
        &mut self,
        from: Source,
        (id, offset): (u64, u64),
        status: Status,
        data: &[u8],
        out: &mut Outbox,
    ) -> bool {
        let malformed = &mut self.counters.malformed;
        match self.pending.get_mut(&id) {
            Some((
                target,
                Pending::Get {
                    buf,
                    left,
                    status: st,
                    asking,
                },
            )) if *target == from.rank && *left > 0 && *st == Status::Done => {
                if status != Status::Done {
                    *st = status;
                    return true;
                }
                // The target answers in order and the channel keeps it (so do the
                // chunks of a large get, asked one after the other on that channel):
                // each piece starts where the last ended (a duplicated or overlapping
                // piece from a peer that lies cannot mark bytes as arrived that never
                // came).
                let len = buf.len() as u64;
                let next = len - *left;
                let asked = asking.map_or(len, |a| a.asked);
                if offset != next || data.len() as u64 > asked - next {
                    *malformed += 1;
                    return false;
                }
                buf.bytes_mut()[offset as usize..offset as usize + data.len()]
                    .copy_from_slice(data);
                *left -= data.len() as u64;
                if let Some(a) = asking.as_mut() {
                    if a.asked - (len - *left) <= a.chunk {
                        let n = (len - a.asked).min(a.chunk);
                        let at = At {
                            offset: a.at.offset.wrapping_add(a.asked),
                            ..a.at
                        };
                        out.forward(from, &ops::get(at, id, n, a.piece, a.asked), &[]);
                        a.asked += n;
                        if a.asked == len {
                            *asking = None;
                        }
                    }
                }
                *left == 0
            }
            _ => {
                *malformed += 1;
                false
            }
        }
    }

    /// Fills pending request `id` with `fill`, when `rank` is the rank it asked (false:
    /// the answer does not fit what was asked, counted malformed).
    fn answer(&mut self, rank: u32, id: u64, fill: impl FnOnce(&mut Pending) -> bool) -> bool {
        let filled = self
            .pending
            .get_mut(&id)
            .is_some_and(|(target, p)| *target == rank && fill(p));
        if !filled {
            self.counters.malformed += 1;
        }
        filled
    }
}

/// Bytes of scratch kept between requests (a larger request's is freed after it).
const SCRATCH_KEPT: usize = 1 << 20;

/// The shortest piece of a get's answer, whatever the request asks for (a peer asking
/// for 1-byte pieces would make the target queue a message per byte).
pub(crate) const MIN_PIECE: u64 = 512;
/// The longest piece of a get's answer, whatever the request asks for.
pub(crate) const GET_PIECE: u64 = 64 << 10;

/// The protocol as the application's thread drives it: the shared state locked per
/// message (the offload engine's thread may be serving it too).
pub(crate) struct OnState<'a> {
    pub state: &'a Mutex<State>,
    /// Something the application may wait for completed in this drive.
    pub woke: bool,
    pub handled: u64,
}

/// Locks `state`, whatever a panicking holder left (the state is plain data, kept
/// consistent by every step).
pub(crate) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Protocol for OnState<'_> {
    fn handle_message(
        &mut self,
        _now: Time,
        from: Source,
        msg: &[u8],
        out: &mut Outbox,
    ) -> Disposition {
        self.handled += 1;
        self.woke |= lock(self.state).handle(from, msg, out);
        Disposition::Consumed
    }

    fn uses_time(&self) -> bool {
        false
    }

    fn wants_more(&self) -> bool {
        !self.woke
    }
}

/// The protocol as the offload engine's thread serves it: requests from other nodes
/// are applied there while the application computes, and answers to this rank's
/// requests are recorded there (the engine wakes the application after each message).
pub(crate) struct Served {
    pub state: Arc<Mutex<State>>,
}

impl Protocol for Served {
    fn handle_message(
        &mut self,
        _now: Time,
        from: Source,
        msg: &[u8],
        out: &mut Outbox,
    ) -> Disposition {
        lock(&self.state).handle(from, msg, out);
        Disposition::Consumed
    }

    fn uses_time(&self) -> bool {
        false
    }
}

/// What the fuzz target `rma_requests` drives (`crate::fuzzing::rma`).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzz {
    use super::*;

    /// What [`handle_all`] saw.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Counts {
        /// Messages handed to the state.
        pub handled: u64,
        /// Messages the state counted malformed.
        pub malformed: u64,
        /// Requests it refused (no window, out of bounds, misaligned).
        pub refused: u64,
        /// Puts it applied.
        pub puts_applied: u64,
        /// Gets and atomics it served.
        pub served: u64,
        /// Bytes the answers queued for the origins carry.
        pub answered_bytes: u64,
    }

    /// Bytes of the window, and of the guards on each side of it.
    const WINDOW: usize = 256;
    const GUARD: usize = 64;

    /// Hands the messages of `data` to the target and origin state of one rank that
    /// exposes window 3 (generation 77) of 256 bytes and waits for get 1 from rank 1 (a
    /// large one, 3 chunks of 64 KiB, asked two at a time, so that lying answers meet
    /// the continuation): records of the sender's rank (one byte), a length (two bytes,
    /// little-endian) and that many bytes of message. The window lies between guard
    /// bytes; panics if any of them changed (a request wrote outside the window), or if
    /// the get's answer was accepted past what was asked.
    pub fn handle_all(data: &[u8]) -> Counts {
        let mut arena = vec![0xa5u8; GUARD + WINDOW + GUARD];
        let window = arena[GUARD..].as_mut_ptr();
        // SAFETY: the window is bytes GUARD..GUARD + WINDOW of `arena`, which outlives
        // the state (dropped first, below) and is not touched meanwhile but through it.
        let mem = unsafe { WindowMemory::borrowed(window, WINDOW) };
        let mut s = State {
            max_rounds: 4,
            ..State::default()
        };
        s.exposed.insert(
            3,
            Exposure {
                mem: Arc::new(mem),
                generation: 77,
            },
        );
        let at = At {
            window: 3,
            generation: 77,
            offset: 0,
        };
        let get_len = 3 * GET_CHUNK_PIECES as usize * MIN_PIECE as usize;
        let (pending, _) = Pending::get(1, Landing::Owned(vec![0; get_len]), at, 512);
        s.pending.insert(1, (1, pending));
        let mut out = Outbox::new(usize::MAX);
        let mut rest = data;
        let mut c = Counts::default();
        while let [from, lo, hi, tail @ ..] = rest {
            let n = usize::from(u16::from_le_bytes([*lo, *hi])).min(tail.len());
            let (msg, next) = tail.split_at(n);
            rest = next;
            s.handle(
                Source {
                    rank: u32::from(*from % 8),
                    dpid: 1,
                },
                msg,
                &mut out,
            );
            c.handled += 1;
            // What the answers carry, taken out as the engine would.
            for i in 0..out.destinations() {
                while let Some((_, next)) = out.next(i) {
                    c.answered_bytes += match next {
                        crate::engine::protocol::Next::Whole(m) => m.len() as u64,
                        crate::engine::protocol::Next::Chunk { bytes, .. } => bytes.len() as u64,
                    };
                    out.advance(i, true);
                }
            }
            out.forget_empty();
        }
        if let Some((
            _,
            Pending::Get {
                buf, left, asking, ..
            },
        )) = s.pending.get(&1)
        {
            // What arrived never passes what was asked (two chunks, then one per chunk in).
            let asked = asking.map_or(buf.len() as u64, |a| a.asked);
            assert!(buf.len() as u64 - left <= asked && asked <= buf.len() as u64);
        }
        c.malformed = s.counters.malformed;
        c.refused = s.counters.refused;
        c.puts_applied = s.counters.puts_applied;
        c.served = s.counters.gets_served + s.counters.atomics_served;
        drop(s);
        assert!(
            arena[..GUARD].iter().all(|&b| b == 0xa5)
                && arena[GUARD + WINDOW..].iter().all(|&b| b == 0xa5),
            "a request wrote outside the window"
        );
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::protocol::{Next, Outbox};

    const ME: u32 = 0;

    fn state_with_window(len: usize) -> (State, At) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let job = 0x5e00_0000 | std::process::id() & 0xffff;
        let mem = SharedObject::create(job, ME, super::super::window::PUBLISHED_IDS | n, len, true)
            .expect("a shared object");
        let mut s = State::default();
        s.exposed.insert(
            3,
            Exposure {
                mem: Arc::new(WindowMemory::shared(mem)),
                generation: 77,
            },
        );
        (
            s,
            At {
                window: 3,
                generation: 77,
                offset: 0,
            },
        )
    }

    fn origin() -> Source {
        Source { rank: 1, dpid: 9 }
    }

    /// What the outbox holds for the origin, in order (and empties it).
    fn answers(out: &mut Outbox) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        while let Some((_, Next::Whole(m))) = out.next(0) {
            v.push(m.to_vec());
            out.advance(0, true);
        }
        out.forget_empty();
        v
    }

    #[test]
    fn the_fuzz_harness_applies_requests_inside_the_window_only() {
        let at = At {
            window: 3,
            generation: 77,
            offset: 250,
        };
        let mut data = Vec::new();
        let mut record = |from: u8, m: &[u8]| {
            data.push(from);
            data.extend_from_slice(&(m.len() as u16).to_le_bytes());
            data.extend_from_slice(m);
        };
        let mut edge = ops::put(at).to_vec();
        edge.extend_from_slice(&[1; 6]);
        record(1, &edge);
        let mut past = ops::put(at).to_vec();
        past.extend_from_slice(&[1; 7]);
        record(1, &past);
        record(2, &ops::get(At { offset: 0, ..at }, 9, 256, 100, 0));
        // Its second element would start at 300, past the window's end.
        let mut strided = ops::put_strided(At { offset: 0, ..at }, 300, 8, 2).to_vec();
        strided.extend_from_slice(&[2; 16]);
        record(2, &strided);
        record(3, b"M\0\0\0\0\0\0\0\xff\xff");
        let c = fuzz::handle_all(&data);
        assert_eq!((c.handled, c.puts_applied, c.served), (5, 1, 1));
        assert_eq!((c.refused, c.malformed), (2, 1), "{c:?}");
        assert!(c.answered_bytes >= 256, "{c:?}");
    }

    #[test]
    fn combined_puts_land_in_order_and_a_broken_part_drops_the_rest() {
        let (mut s, at) = state_with_window(4096);
        let mut out = Outbox::new(usize::MAX);
        let mut m = ops::combined().to_vec();
        ops::part(&mut m, &ops::put(At { offset: 8, ..at }), b"first");
        ops::part(&mut m, &ops::put(At { offset: 8, ..at }), b"again");
        let strided = ops::put_strided(At { offset: 100, ..at }, 16, 2, 3);
        ops::part(&mut m, &strided, b"aabbcc");
        assert!(!s.handle(origin(), &m, &mut out));
        let w = s.exposed[&3].mem.clone();
        let read = |off: usize, n: usize| {
            let mut v = vec![0u8; n];
            // SAFETY: off + n <= 4096, the window's length; nothing writes it meanwhile.
            unsafe { crate::link::copy_bytes(w.ptr().add(off), v.as_mut_ptr(), n) };
            v
        };
        // The later put to the same bytes wins: parts apply in order.
        assert_eq!(read(8, 5), b"again");
        assert_eq!(
            (read(100, 2), read(116, 2), read(132, 2)),
            (b"aa".to_vec(), b"bb".to_vec(), b"cc".to_vec())
        );
        assert_eq!(s.counters.malformed, 0);
        // A part that is not a put (a flush, another combined message), or whose length
        // runs past the end: counted, and nothing after it applied.
        for bad in [ops::flush(5).to_vec(), ops::combined().to_vec()] {
            let mut m = ops::combined().to_vec();
            ops::part(&mut m, &bad, &[]);
            ops::part(&mut m, &ops::put(At { offset: 200, ..at }), b"no");
            s.handle(origin(), &m, &mut out);
        }
        let mut m = ops::combined().to_vec();
        ops::part(&mut m, &ops::put(At { offset: 300, ..at }), b"yes");
        m.extend_from_slice(&1000u32.to_le_bytes());
        m.extend_from_slice(&ops::put(At { offset: 200, ..at }));
        s.handle(origin(), &m, &mut out);
        assert_eq!(read(200, 2), [0, 0]);
        assert_eq!(read(300, 3), b"yes");
        assert_eq!(s.counters.malformed, 3);
        assert!(answers(&mut out).is_empty());
    }

    #[test]
    fn a_put_lands_and_a_get_reads_it_back_in_pieces() {
        let (mut s, at) = state_with_window(200_000);
        let mut out = Outbox::new(usize::MAX);
        let data: Vec<u8> = (0..150_000u32).map(|i| (i % 251) as u8).collect();
        let mut put = ops::put(At { offset: 10, ..at }).to_vec();
        put.extend_from_slice(&data);
        assert!(!s.handle(origin(), &put, &mut out));
        assert_eq!(s.counters.puts_applied, 1);
        s.handle(
            origin(),
            &ops::get(At { offset: 10, ..at }, 5, data.len() as u64, 1 << 20, 0),
            &mut out,
        );
        // The origin's side of the same state collects the pieces.
        s.pending.insert(
            5,
            (
                1,
                Pending::Get {
                    buf: Landing::Owned(vec![0; data.len()]),
                    left: data.len() as u64,
                    status: Status::Done,
                    asking: None,
                },
            ),
        );
        let replies = answers(&mut out);
        assert_eq!(replies.len(), 3, "150 000 bytes in pieces of 64 KiB");
        let mut done = false;
        for r in &replies {
            done = s.handle(origin(), r, &mut out);
        }
        assert!(done);
        match s.pending.remove(&5) {
            Some((1, Pending::Get { buf, left: 0, .. })) => assert_eq!(buf.into_vec(), data),
            other => panic!("{other:?}"),
        }
    }

    /// The messages of two states' outboxes passed between them until nothing moves:
    /// `target` answers what `origin` asks. Returns the most answer bytes that were
    /// asked and not yet received at any time.
    fn exchange(origin_state: &mut State, target: &mut State, first: &[u8]) -> u64 {
        let (me, them) = (origin(), Source { rank: 2, dpid: 9 });
        let (mut to_target, mut to_origin) = (Outbox::new(usize::MAX), Outbox::new(usize::MAX));
        target.handle(me, first, &mut to_origin);
        let mut most = 0;
        loop {
            let answers = answers(&mut to_origin);
            if answers.is_empty() {
                return most;
            }
            let outstanding: u64 = answers
                .iter()
                .map(|a| (a.len() - ops::GOT_LEN) as u64)
                .sum();
            most = most.max(outstanding);
            // One answer at a time, as they arrive; requests go out as the origin asks.
            for a in &answers {
                origin_state.handle(them, a, &mut to_target);
                for r in self::answers(&mut to_target) {
                    target.handle(me, &r, &mut to_origin);
                }
            }
        }
    }

    #[test]
    fn a_large_get_is_asked_two_chunks_at_a_time() {
        let (mut target, at) = state_with_window(700_000);
        let mut origin_state = State::default();
        let data: Vec<u8> = (0..690_000u32).map(|i| (i % 253) as u8).collect();
        let mut put = ops::put(at).to_vec();
        put.extend_from_slice(&data);
        target.handle(origin(), &put, &mut Outbox::new(usize::MAX));
        // Pieces of 1000 bytes, chunks of 128 000: five chunks and a bit.
        let len = 5 * 128_000 + 777;
        let at5 = At { offset: 5, ..at };
        let (pending, first) = Pending::get(7, Landing::Owned(vec![0; len]), at5, 1000);
        origin_state.pending.insert(7, (2, pending));
        let most = exchange(&mut origin_state, &mut target, &first);
        assert_eq!(most, 2 * 128_000, "two chunks asked at most");
        assert_eq!(
            target.counters.gets_served, 5,
            "two chunks, then one at a time"
        );
        match origin_state.pending.remove(&7) {
            Some((
                2,
                Pending::Get {
                    buf,
                    left: 0,
                    status: Status::Done,
                    asking: None,
                },
            )) => {
                assert!(
                    buf.into_vec() == data[5..5 + len],
                    "the get read what the put wrote"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(origin_state.counters.malformed, 0);
        // A small get is one request; this one lands in memory the caller lent.
        let mut mine = [0u8; 5000];
        // SAFETY: `mine` is not touched until the pending get is removed, below.
        let lent = Landing::Lent(unsafe { LentBytes::new(&mut mine) });
        let (pending, first) = Pending::get(8, lent, at, 1000);
        origin_state.pending.insert(8, (2, pending));
        exchange(&mut origin_state, &mut target, &first);
        assert_eq!(target.counters.gets_served, 6);
        assert!(matches!(
            origin_state.pending.remove(&8),
            Some((2, Pending::Get { left: 0, .. }))
        ));
        assert!(mine[..] == data[..5000]);
    }

    #[test]
    fn a_chunked_get_stops_asking_when_refused_or_forgotten() {
        let (mut target, at) = state_with_window(700_000);
        let mut origin_state = State::default();
        let (pending, first) = Pending::get(7, Landing::Owned(vec![0; 600_000]), at, 1000);
        origin_state.pending.insert(7, (2, pending));
        let (me, them) = (origin(), Source { rank: 2, dpid: 9 });
        let (mut to_target, mut to_origin) = (Outbox::new(usize::MAX), Outbox::new(usize::MAX));
        target.handle(me, &first, &mut to_origin);
        // The window goes away after the first two chunks were served: the third is
        // refused, and the get ends with the refusal.
        target.exposed.clear();
        for a in answers(&mut to_origin) {
            origin_state.handle(them, &a, &mut to_target);
        }
        let asked = answers(&mut to_target);
        assert_eq!(asked.len(), 2, "chunks 3 and 4, each once one more was in");
        for r in &asked {
            target.handle(me, r, &mut to_origin);
        }
        let refusals = answers(&mut to_origin);
        assert_eq!(refusals.len(), 2);
        assert!(origin_state.handle(them, &refusals[0], &mut to_target));
        assert!(matches!(
            origin_state.pending[&7],
            (
                2,
                Pending::Get {
                    status: Status::NoWindow,
                    ..
                }
            )
        ));
        // The get is over: the second refusal answers nothing.
        assert!(!origin_state.handle(them, &refusals[1], &mut to_target));
        assert!(answers(&mut to_target).is_empty(), "nothing more asked");
        // A get nobody waits for any more (its request dropped): its answers are
        // counted, and ask for nothing.
        let (mut target, at) = state_with_window(700_000);
        let (pending, first) = Pending::get(9, Landing::Owned(vec![0; 600_000]), at, 1000);
        origin_state.pending.insert(9, (2, pending));
        target.handle(me, &first, &mut to_origin);
        origin_state.pending.remove(&9);
        let before = origin_state.counters.malformed;
        for a in answers(&mut to_origin) {
            assert!(!origin_state.handle(them, &a, &mut to_target));
        }
        assert_eq!(origin_state.counters.malformed - before, 256);
        assert!(answers(&mut to_target).is_empty());
    }

    #[test]
    fn requests_outside_a_window_are_refused_and_reported() {
        let (mut s, at) = state_with_window(4096);
        let mut out = Outbox::new(usize::MAX);
        let mut past_end = ops::put(At { offset: 4090, ..at }).to_vec();
        past_end.extend_from_slice(&[1; 7]);
        s.handle(origin(), &past_end, &mut out);
        let mut stale = ops::put(At {
            generation: 76,
            ..at
        })
        .to_vec();
        stale.push(1);
        s.handle(origin(), &stale, &mut out);
        let mut wrapping = ops::put(At {
            offset: u64::MAX - 2,
            ..at
        })
        .to_vec();
        wrapping.extend_from_slice(&[1; 8]);
        s.handle(origin(), &wrapping, &mut out);
        s.handle(origin(), &ops::flush(1), &mut out);
        s.handle(
            origin(),
            &ops::get(At { offset: 4000, ..at }, 2, 97, 1000, 0),
            &mut out,
        );
        s.handle(
            origin(),
            &ops::atomic(At { offset: 4, ..at }, AtomicOp::FetchAdd, 3, 1, 0),
            &mut out,
        );
        let replies = answers(&mut out);
        assert_eq!(
            ops::decode(&replies[0]),
            Some(Op::Flushed {
                status: Status::OutOfBounds,
                id: 1,
                refused: 3
            })
        );
        assert!(matches!(
            ops::decode(&replies[1]),
            Some(Op::Got {
                status: Status::OutOfBounds,
                id: 2,
                ..
            })
        ));
        assert_eq!(
            ops::decode(&replies[2]),
            Some(Op::AtomicDone {
                status: Status::Misaligned,
                id: 3,
                value: 0
            })
        );
        assert_eq!(s.counters.refused, 5);
        assert_eq!(s.counters.puts_applied, 0);
        // Nothing of the window was touched.
        let w = &s.exposed[&3].mem;
        // SAFETY: the mapping is 4096 bytes long and only this test uses it.
        let bytes = unsafe { std::slice::from_raw_parts(w.ptr(), w.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        // The next flush starts counting again.
        s.handle(origin(), &ops::flush(4), &mut out);
        assert_eq!(
            ops::decode(&answers(&mut out)[0]),
            Some(Op::Flushed {
                status: Status::Done,
                id: 4,
                refused: 0
            })
        );
    }

    #[test]
    fn atomics_apply_to_the_word_and_answer_the_old_value() {
        let (mut s, at) = state_with_window(64);
        let mut out = Outbox::new(usize::MAX);
        let w = At { offset: 8, ..at };
        s.handle(
            origin(),
            &ops::atomic(w, AtomicOp::FetchAdd, 1, 5, 0),
            &mut out,
        );
        s.handle(
            origin(),
            &ops::atomic(w, AtomicOp::CompareSwap, 2, 4, 9),
            &mut out,
        );
        s.handle(
            origin(),
            &ops::atomic(w, AtomicOp::CompareSwap, 3, 5, 9),
            &mut out,
        );
        s.handle(origin(), &ops::atomic(w, AtomicOp::Swap, 4, 1, 0), &mut out);
        let mut unknown = ops::atomic(w, AtomicOp::Swap, 5, 7, 0);
        unknown[1] = 42;
        s.handle(origin(), &unknown, &mut out);
        let mut replies = answers(&mut out);
        assert_eq!(
            ops::decode(&replies.pop().unwrap()),
            Some(Op::AtomicDone {
                status: Status::BadOp,
                id: 5,
                value: 0
            })
        );
        let values: Vec<u64> = replies
            .iter()
            .map(|r| match ops::decode(r) {
                Some(Op::AtomicDone {
                    status: Status::Done,
                    value,
                    ..
                }) => value,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(values, [0, 5, 5, 9]);
        assert_eq!(
            word(&s.exposed, w)
                .unwrap()
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }

    /// An accumulate request of `op` on `elem` at `offset` of `at`'s window, holding
    /// the word at 56; answered under `id`.
    fn acc(
        at: At,
        offset: u64,
        (op, elem): (u8, Element),
        id: u64,
        len: u64,
        fetch: bool,
        data: &[u8],
    ) -> Vec<u8> {
        let mut m = ops::accumulate(ops::AccumulateHead {
            at: At { offset, ..at },
            op,
            fetch,
            elem,
            lock: At { offset: 56, ..at },
            id,
            len,
        })
        .to_vec();
        m.extend_from_slice(data);
        m
    }

    fn accumulated(m: &[u8]) -> (Status, u64, Vec<u8>) {
        match ops::decode(m) {
            Some(Op::Accumulated { status, id, data }) => (status, id, data.to_vec()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn accumulates_apply_under_the_lock_and_answer_what_was_there() {
        use crate::rma::reduce::Number;
        let (mut s, at) = state_with_window(64);
        let mut out = Outbox::new(usize::MAX);
        let f64s = |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
        let sum = (Reduce::Sum as u8, Element::Num(Number::F64));
        let i16s = Element::Num(Number::I16);
        s.handle(
            origin(),
            &acc(at, 0, sum, 1, 16, true, &f64s(&[1.5, -2.0])),
            &mut out,
        );
        s.handle(
            origin(),
            &acc(at, 0, sum, 2, 16, false, &f64s(&[1.0, 1.0])),
            &mut out,
        );
        s.handle(
            origin(),
            &acc(
                at,
                0,
                (Reduce::NoOp as u8, Element::Num(Number::F64)),
                3,
                16,
                true,
                &[],
            ),
            &mut out,
        );
        let cas =
            |cmp: i16, new: i16| -> Vec<u8> { [cmp.to_ne_bytes(), new.to_ne_bytes()].concat() };
        s.handle(
            origin(),
            &acc(at, 16, (ops::CAS, i16s), 4, 2, true, &cas(0, 7)),
            &mut out,
        );
        s.handle(
            origin(),
            &acc(at, 16, (ops::CAS, i16s), 5, 2, true, &cas(0, 9)),
            &mut out,
        );
        let r: Vec<_> = answers(&mut out).iter().map(|m| accumulated(m)).collect();
        assert_eq!(r[0], (Status::Done, 1, vec![0; 16]), "the bytes before");
        assert_eq!(r[1], (Status::Done, 2, vec![]), "nothing fetched");
        assert_eq!(r[2], (Status::Done, 3, f64s(&[2.5, -1.0])));
        assert_eq!(r[3], (Status::Done, 4, 0i16.to_ne_bytes().to_vec()));
        assert_eq!(
            r[4],
            (Status::Done, 5, 7i16.to_ne_bytes().to_vec()),
            "no swap"
        );
        assert_eq!(s.counters.accumulates_served, 5);

        // Refusals touch nothing and say why.
        let mut bad_elem = acc(at, 0, sum, 10, 16, false, &[0; 16]);
        bad_elem[12..16].copy_from_slice(&[0, 0, 0, 0]);
        let refused = [
            (
                acc(
                    at,
                    0,
                    (99, Element::Num(Number::F64)),
                    6,
                    16,
                    false,
                    &[0; 16],
                ),
                Status::BadOp,
            ),
            (
                acc(
                    at,
                    0,
                    (Reduce::Band as u8, Element::Num(Number::F64)),
                    7,
                    16,
                    false,
                    &[0; 16],
                ),
                Status::BadOp,
            ),
            (acc(at, 0, sum, 8, 12, false, &[0; 12]), Status::BadLength),
            (acc(at, 0, sum, 9, 16, false, &[0; 8]), Status::BadLength),
            (bad_elem, Status::BadOp),
            (
                acc(at, 64, sum, 11, 16, false, &[0; 16]),
                Status::OutOfBounds,
            ),
            (
                acc(
                    at,
                    0,
                    sum,
                    12,
                    ACCUMULATE_MAX + 8,
                    false,
                    &vec![0; ACCUMULATE_MAX as usize + 8],
                ),
                Status::BadLength,
            ),
            (
                acc(
                    At {
                        generation: 78,
                        ..at
                    },
                    0,
                    sum,
                    13,
                    16,
                    false,
                    &[0; 16],
                ),
                Status::NoWindow,
            ),
        ];
        for (m, want) in &refused {
            s.handle(origin(), m, &mut out);
            let (status, _, data) = accumulated(&answers(&mut out)[0]);
            assert_eq!((status, data.len()), (*want, 0), "{want:?}");
        }
        let mut misaligned = acc(at, 0, sum, 14, 16, false, &[0; 16]);
        misaligned[32..40].copy_from_slice(&52u64.to_le_bytes());
        s.handle(origin(), &misaligned, &mut out);
        assert_eq!(accumulated(&answers(&mut out)[0]).0, Status::Misaligned);
        let (mem, _) = locate(&s.exposed, at, 64).unwrap();
        let mut now = [0u8; 18];
        // SAFETY: 18 bytes of the 64-byte window.
        unsafe { std::ptr::copy_nonoverlapping(mem.ptr(), now.as_mut_ptr(), 18) };
        assert_eq!(now[..16], f64s(&[2.5, -1.0])[..]);
        assert_eq!(now[16..], 7i16.to_ne_bytes());

        // A lock word inside the range, or an answer longer than this rank sends, is
        // refused.
        let mut over_lock = acc(at, 48, sum, 16, 16, false, &[0; 16]);
        over_lock[32..40].copy_from_slice(&56u64.to_le_bytes());
        s.handle(origin(), &over_lock, &mut out);
        assert_eq!(accumulated(&answers(&mut out)[0]).0, Status::BadLength);
        s.max_answer = Some(ops::ACCUMULATED_LEN + 15);
        s.handle(origin(), &acc(at, 0, sum, 17, 16, true, &[0; 16]), &mut out);
        assert_eq!(accumulated(&answers(&mut out)[0]).0, Status::BadLength);
        s.handle(
            origin(),
            &acc(at, 0, sum, 18, 16, false, &[0; 16]),
            &mut out,
        );
        assert_eq!(
            accumulated(&answers(&mut out)[0]).0,
            Status::Done,
            "no answer bytes"
        );
        s.max_answer = None;

        // A lock word that stays taken: the target tries a while, changes nothing and
        // answers that it was busy; once free, the same request applies.
        let window = s.exposed[&3].mem.clone();
        // SAFETY: bytes 56..64 of the window, 8-byte aligned (a shared object's start is
        // page-aligned); `window` keeps it mapped.
        let lock = unsafe { &*(window.ptr().add(56) as *const AtomicU64) };
        lock.store(5, std::sync::atomic::Ordering::Release);
        let request = acc(at, 0, sum, 19, 16, true, &f64s(&[1.0, 1.0]));
        s.handle(origin(), &request, &mut out);
        assert_eq!(
            accumulated(&answers(&mut out)[0]),
            (Status::Busy, 19, vec![])
        );
        assert_eq!(s.counters.busy, 1);
        assert_eq!(
            lock.load(std::sync::atomic::Ordering::Acquire),
            5,
            "still its holder's"
        );
        lock.store(0, std::sync::atomic::Ordering::Release);
        s.handle(origin(), &request, &mut out);
        assert_eq!(
            accumulated(&answers(&mut out)[0]),
            (Status::Done, 19, f64s(&[2.5, -1.0]))
        );
        assert_eq!(lock.load(std::sync::atomic::Ordering::Acquire), 0);
    }

    #[test]
    fn answers_to_nothing_asked_and_garbage_are_counted_not_applied() {
        let (mut s, _) = state_with_window(64);
        let mut out = Outbox::new(usize::MAX);
        assert!(!s.handle(origin(), &ops::atomic_done(Status::Done, 99, 1), &mut out));
        assert!(!s.handle(origin(), &ops::flushed(Status::Done, 98, 0), &mut out));
        let mut piece = ops::got(Status::Done, 97, 0).to_vec();
        piece.push(1);
        assert!(!s.handle(origin(), &piece, &mut out));
        assert!(!s.handle(origin(), b"Pjunk", &mut out));
        // A piece that would land past the buffer asked for.
        s.pending.insert(
            5,
            (
                1,
                Pending::Get {
                    buf: Landing::Owned(vec![0; 4]),
                    left: 4,
                    status: Status::Done,
                    asking: None,
                },
            ),
        );
        let mut over = ops::got(Status::Done, 5, 2).to_vec();
        over.extend_from_slice(&[7; 3]);
        assert!(!s.handle(origin(), &over, &mut out));
        // Pieces in order only: the first two bytes, then the same two again.
        let mut first = ops::got(Status::Done, 5, 0).to_vec();
        first.extend_from_slice(&[7; 2]);
        assert!(!s.handle(origin(), &first, &mut out));
        assert!(!s.handle(origin(), &first, &mut out));
        assert!(matches!(s.pending[&5], (1, Pending::Get { left: 2, .. })));
        // An answer from a rank that was not asked.
        let mut foreign = ops::got(Status::Done, 5, 2).to_vec();
        foreign.extend_from_slice(&[7; 2]);
        assert!(!s.handle(Source { rank: 2, dpid: 9 }, &foreign, &mut out));
        assert_eq!(s.counters.malformed, 7);
        assert!(answers(&mut out).is_empty());
    }
    #[test]
    fn strided_and_indexed_requests_land_where_they_say_or_are_refused() {
        let (mut s, at) = state_with_window(4096);
        let mut out = Outbox::new(usize::MAX);
        // Four 2-byte elements at a stride of 100 from 10.
        let mut m = ops::put_strided(At { offset: 10, ..at }, 100, 2, 4).to_vec();
        m.extend_from_slice(b"aabbccdd");
        s.handle(origin(), &m, &mut out);
        // Two 3-byte elements at 1000 and 2000.
        let mut m = Vec::new();
        ops::put_indexed(at, 3, &[2000, 1000], &mut m);
        m.extend_from_slice(b"xyzXYZ");
        s.handle(origin(), &m, &mut out);
        assert_eq!(s.counters.puts_applied, 2);
        let w = &s.exposed[&3].mem;
        // SAFETY: the mapping is 4096 bytes long and only this test uses it.
        let bytes = unsafe { std::slice::from_raw_parts(w.ptr(), w.len()) };
        assert_eq!(&bytes[10..12], b"aa");
        assert_eq!(&bytes[310..312], b"dd");
        assert_eq!(&bytes[1000..1003], b"XYZ");
        assert_eq!(&bytes[2000..2003], b"xyz");
        assert_eq!(bytes.iter().filter(|&&b| b != 0).count(), 14);
        // And read back, packed, by a strided and an indexed get.
        s.handle(
            origin(),
            &ops::get_strided(At { offset: 10, ..at }, 100, 2, 4, 7, 512),
            &mut out,
        );
        let mut g = Vec::new();
        ops::get_indexed(at, 3, &[1000, 2000], 8, 512, &mut g);
        s.handle(origin(), &g, &mut out);
        let replies = answers(&mut out);
        assert!(matches!(
            ops::decode(&replies[0]),
            Some(Op::Got {
                status: Status::Done,
                id: 7,
                offset: 0,
                data: b"aabbccdd"
            })
        ));
        assert!(matches!(
            ops::decode(&replies[1]),
            Some(Op::Got {
                status: Status::Done,
                id: 8,
                offset: 0,
                data: b"XYZxyz"
            })
        ));

        // Refused, the window untouched: a stride that overflows, an element past the
        // end, an index past the end, a get asking more than the window holds (stride
        // 0), a notify on a misaligned word.
        let before = bytes.to_vec();
        let mut m = ops::put_strided(At { offset: 1, ..at }, u64::MAX / 2, 1, 3).to_vec();
        m.extend_from_slice(b"123");
        s.handle(origin(), &m, &mut out);
        let mut m = ops::put_strided(At { offset: 4000, ..at }, 50, 1, 3).to_vec();
        m.extend_from_slice(b"123");
        s.handle(origin(), &m, &mut out);
        let mut m = Vec::new();
        ops::put_indexed(at, 8, &[0, 4090], &mut m);
        m.extend_from_slice(&[9; 16]);
        s.handle(origin(), &m, &mut out);
        s.handle(
            origin(),
            &ops::get_strided(at, 0, 8, 1 << 20, 9, 512),
            &mut out,
        );
        s.handle(origin(), &ops::notify(At { offset: 4, ..at }, 1), &mut out);
        s.handle(origin(), &ops::flush(10), &mut out);
        let replies = answers(&mut out);
        assert!(matches!(
            ops::decode(&replies[0]),
            Some(Op::Got {
                status: Status::OutOfBounds,
                id: 9,
                ..
            })
        ));
        assert_eq!(
            ops::decode(&replies[1]),
            Some(Op::Flushed {
                status: Status::OutOfBounds,
                id: 10,
                refused: 4
            })
        );
        assert_eq!(bytes, &before[..]);

        // Malformed: data that disagrees with the layout, an offset count that lies.
        let mut m = ops::put_strided(at, 8, 8, 2).to_vec();
        m.extend_from_slice(&[1; 15]);
        s.handle(origin(), &m, &mut out);
        let mut m = Vec::new();
        ops::put_indexed(at, 1, &[0, 1], &mut m);
        m[12] = 200; // claims 200 offsets
        s.handle(origin(), &m, &mut out);
        assert_eq!(s.counters.malformed, 2);
        assert_eq!(bytes, &before[..]);
    }

    #[test]
    fn empty_layouts_with_wild_offsets_touch_nothing() {
        // A review's inputs: an empty layout's `end` is 0 whatever its offsets say, so
        // the copy must not walk them (an overflow, or 2^64 steps outside the window).
        let (mut s, at) = state_with_window(64);
        let mut out = Outbox::new(usize::MAX);
        for (offset, stride, elem, count) in
            [(0, 1 << 63, 0, 3), (0, 1, 0, u64::MAX), (u64::MAX, 8, 8, 0)]
        {
            s.handle(
                origin(),
                &ops::put_strided(At { offset, ..at }, stride, elem, count),
                &mut out,
            );
            s.handle(
                origin(),
                &ops::get_strided(At { offset, ..at }, stride, elem, count, 1, 512),
                &mut out,
            );
        }
        let mut m = Vec::new();
        ops::put_indexed(at, 0, &[u64::MAX], &mut m);
        s.handle(origin(), &m, &mut out);
        let mut g = Vec::new();
        ops::get_indexed(at, 0, &[u64::MAX, 3], 2, 512, &mut g);
        s.handle(origin(), &g, &mut out);
        let w = &s.exposed[&3].mem;
        // SAFETY: the mapping is 64 bytes long and only this test uses it.
        let bytes = unsafe { std::slice::from_raw_parts(w.ptr(), w.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        // Every get is answered (with nothing), none refused.
        let replies = answers(&mut out);
        assert_eq!(replies.len(), 4);
        assert_eq!(s.counters.refused, 0);
    }

    #[test]
    fn barrier_rounds_outside_the_job_and_old_episodes_are_dropped() {
        let (mut s, _) = state_with_window(64);
        let mut out = Outbox::new(usize::MAX);
        s.max_rounds = 2;
        s.episode = 5;
        for (round, episode) in [(0, 5), (1, 6), (2, 5), (255, 6), (0, 4), (0, 7)] {
            s.handle(origin(), &ops::barrier(round, episode), &mut out);
        }
        assert_eq!(s.arrived.len(), 2);
        assert_eq!(s.counters.malformed, 4);
    }

    #[test]
    fn a_notify_counts_once_after_the_data() {
        let (mut s, at) = state_with_window(64);
        let mut out = Outbox::new(usize::MAX);
        let mut p = ops::put(At { offset: 16, ..at }).to_vec();
        p.extend_from_slice(b"data");
        s.handle(origin(), &p, &mut out);
        s.handle(origin(), &ops::notify(At { offset: 8, ..at }, 1), &mut out);
        s.handle(origin(), &ops::notify(At { offset: 8, ..at }, 1), &mut out);
        let w = word(&s.exposed, At { offset: 8, ..at }).unwrap();
        assert_eq!(w.load(std::sync::atomic::Ordering::Acquire), 2);
        assert_eq!(s.counters.notified, 2);
        assert!(answers(&mut out).is_empty(), "a notify has no answer");
    }
}
