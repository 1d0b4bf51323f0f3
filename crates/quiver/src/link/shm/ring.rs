//! The single-producer single-consumer token ring: one per (sender endpoint, receiver
//! endpoint) channel, living in the receiver's shared-memory segment.
//!
//! The ring is Directed Point's token buffer pool carried over to shared memory: the
//! sender copies a message once, straight into the receiver's ring; the receiver reads it
//! in place and releases the token later. Records are variable-length:
//!
//! ```text
//! | header u64: kind << 56 | len | payload, padded to 8 bytes | header | ...
//! ```
//!
//! Guarantees and the memory-ordering contract:
//! - A record becomes visible to the consumer when the producer stores its header with
//!   `Release`; the consumer loads headers with `Acquire`, so the payload written before
//!   is visible. A zero header means "nothing yet".
//! - The producer only ever writes into free space (between its head and the consumer's
//!   published tail plus capacity). Before publishing a record it writes a zero header
//!   where the *next* record will start (free space too: the producer keeps 8 bytes of
//!   slack), so the consumer never mistakes stale bytes from an earlier lap for a header.
//! - A record never straddles the end of the ring: the producer writes a `WRAP` header
//!   and continues at offset 0 (after zeroing the header there).
//! - The producer also wraps early, past [`EARLY_WRAP_AT`] bytes into the ring, with a
//!   record of at most [`EARLY_WRAP_RECORD`] bytes, when the consumer has released
//!   everything pushed (as far as it published): a stream of small messages that the
//!   consumer keeps up with then cycles through the first few KiB, which stay in both
//!   cores' caches, instead of through the whole ring (4 MiB by default: every record a
//!   cache miss on both sides). Nothing unreleased may be left behind the wrap: a token
//!   held there would keep the tail, and the producer's room, at that spot of the ring
//!   until its release. A consumer that lags (a bulk transfer, held tokens) sees the
//!   whole ring as before.
//! - The consumer publishes its tail (`Release`) lazily: when an eighth of the ring has
//!   been freed, when it finds the ring empty, or when a batch of reads ends with
//!   everything read released; the producer reloads it (`Acquire`) only
//!   when its cached copy says the ring is full, or when it might wrap early. On the fast
//!   path each side touches the record's cache lines and nothing else: no lock,
//!   allocation or system call.
//! - Tokens may be released out of order; the tail advances over the released prefix.
//! - Headers read from shared memory are validated: a corrupt header is an error, never
//!   an out-of-bounds access.

use crate::sync::atomic::{AtomicU64, Ordering};
use std::collections::VecDeque;

/// Bytes of a record header.
pub(crate) const HDR: usize = 8;
const KIND_SHIFT: u32 = 56;
const KIND_MSG: u64 = 1;
const KIND_WRAP: u64 = 2;
const LEN_MASK: u64 = 0xffff_ffff;

/// How far into the ring the producer goes before it wraps early (if the consumer keeps
/// up); a quarter of a smaller ring.
pub(crate) const EARLY_WRAP_AT: usize = 16 << 10;
/// Largest record with which the producer wraps early: larger ones are bulk transfers,
/// whose consumer rarely keeps up (the producer would reload the tail for nothing). A
/// tagged 1 KiB message with its headers (1048 bytes) is just above: letting records of
/// up to 4 KiB wrap made MPI's 1 KiB ping-pong 5 % faster (0.315 -> 0.300 us) but
/// tagged bandwidth at 1-4 KiB 11-14 % slower (the tail reloaded per record behind a
/// lagging consumer; trying again only every 16 KiB cost the 8-byte message rate 20-30 %
/// instead), so it stays.
pub(crate) const EARLY_WRAP_RECORD: u64 = 1024;

/// Bytes a record of `len` payload bytes occupies.
pub(crate) fn stride(len: usize) -> usize {
    HDR + ((len + 7) & !7)
}

/// Largest payload a ring of `capacity` bytes can carry (capacity a power of two).
pub(crate) fn max_payload(capacity: usize) -> usize {
    capacity.saturating_sub(3 * HDR)
}

/// The ring's bytes: raw shared memory normally, loom-tracked words under the model checker.
pub(crate) struct RingMem {
    #[cfg(not(loom))]
    base: *mut u8,
    #[cfg(loom)]
    words: loom::sync::Arc<Vec<AtomicU64>>,
    capacity: usize,
}

// SAFETY: RingMem is a handle to memory shared between processes; all cross-thread
// access goes through atomics (headers) or is ordered by them (payload), as described in
// the module documentation.
#[cfg(not(loom))]
unsafe impl Send for RingMem {}

impl RingMem {
    /// A ring over `capacity` bytes at `base`; `capacity` is a power of two (positions
    /// wrap with a mask, not a division), at least 64.
    ///
    /// # Safety
    /// `base` must be 8-byte aligned, valid for reads and writes of `capacity` bytes for
    /// the life of the returned value, and used by at most one producer and one consumer.
    #[cfg(not(loom))]
    pub(crate) unsafe fn new(base: *mut u8, capacity: usize) -> RingMem {
        debug_assert!((base as usize).is_multiple_of(8) && capacity.is_power_of_two());
        RingMem { base, capacity }
    }

    /// A ring over loom-tracked memory (model checking only).
    #[cfg(loom)]
    pub(crate) fn new_loom(words: loom::sync::Arc<Vec<AtomicU64>>) -> RingMem {
        let capacity = words.len() * 8;
        RingMem { words, capacity }
    }

    #[inline]
    fn header(&self, idx: usize) -> &AtomicU64 {
        debug_assert!(idx.is_multiple_of(8) && idx + HDR <= self.capacity);
        #[cfg(not(loom))]
        {
            // SAFETY: idx is 8-aligned and idx + 8 <= capacity (callers keep indices
            // inside the ring), the memory is valid for the life of self (contract of
            // `new`), and AtomicU64 has the size and alignment of u64.
            unsafe { &*(self.base.add(idx) as *const AtomicU64) }
        }
        #[cfg(loom)]
        {
            &self.words[idx / 8]
        }
    }

    /// Copies `data` to offset `idx`, which lies in free space owned by the producer.
    #[inline]
    fn write_payload(&self, idx: usize, data: &[u8]) {
        debug_assert!(idx + data.len() <= self.capacity);
        #[cfg(not(loom))]
        // SAFETY: [idx, idx + len) lies inside the ring (checked by the producer before
        // calling), in free space that the consumer does not read until the record's
        // header is published with Release; `data` cannot overlap shared memory we own.
        unsafe {
            crate::link::copy_bytes(data.as_ptr(), self.base.add(idx), data.len())
        };
        #[cfg(loom)]
        for (i, chunk) in data.chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.words[idx / 8 + i].store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
    }

    /// Pointer to the payload at `idx` (valid while its token is held).
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn payload_ptr(&self, idx: usize) -> *const u8 {
        debug_assert!(idx <= self.capacity);
        // SAFETY: idx <= capacity, so the result stays inside (or one past) the mapping.
        unsafe { self.base.add(idx) }
    }

    /// Copies the payload at `idx` out (model checking only).
    #[cfg(loom)]
    pub(crate) fn read_payload(&self, idx: usize, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        let mut i = idx / 8;
        while out.len() < len {
            let w = self.words[i].load(Ordering::Relaxed).to_le_bytes();
            let take = (len - out.len()).min(8);
            out.extend_from_slice(&w[..take]);
            i += 1;
        }
        out
    }
}

/// Where the consumer publishes how far it has released: a cache line of its own in the
/// segment's slot table.
pub(crate) struct TailRef {
    #[cfg(not(loom))]
    ptr: *const AtomicU64,
    #[cfg(loom)]
    arc: loom::sync::Arc<AtomicU64>,
}

// SAFETY: the pointee is an atomic in shared memory that outlives this handle.
#[cfg(not(loom))]
unsafe impl Send for TailRef {}

impl TailRef {
    /// # Safety
    /// `ptr` must point to an AtomicU64 that stays mapped for the life of the value.
    #[cfg(not(loom))]
    pub(crate) unsafe fn new(ptr: *const AtomicU64) -> TailRef {
        TailRef { ptr }
    }
    #[cfg(loom)]
    pub(crate) fn new_loom(arc: loom::sync::Arc<AtomicU64>) -> TailRef {
        TailRef { arc }
    }
    #[inline]
    fn get(&self) -> &AtomicU64 {
        #[cfg(not(loom))]
        {
            // SAFETY: contract of `new`: the atomic stays mapped while self lives.
            unsafe { &*self.ptr }
        }
        #[cfg(loom)]
        {
            &self.arc
        }
    }
}

/// The sender's half of a ring. Its state (head, cached tail) lives in the sender.
pub(crate) struct Producer {
    mem: RingMem,
    tail: TailRef,
    head: u64,
    cached_tail: u64,
    /// [`EARLY_WRAP_AT`] for this ring's size.
    early_wrap_at: u64,
}

impl Producer {
    /// A producer starting at position 0 of a fresh (all-zero) ring.
    pub(crate) fn new(mem: RingMem, tail: TailRef) -> Producer {
        let cap = mem.capacity;
        Producer {
            mem,
            tail,
            head: 0,
            cached_tail: 0,
            early_wrap_at: EARLY_WRAP_AT.min(cap / 4) as u64,
        }
    }

    /// Whether the consumer has released everything pushed, as far as it published (its
    /// tail reloaded if the cached one says otherwise).
    #[inline]
    fn seen_drained(&mut self) -> bool {
        if self.cached_tail == self.head {
            return true;
        }
        // Acquire, as in `push_with`.
        self.cached_tail = self.tail.get().load(Ordering::Acquire);
        self.cached_tail == self.head
    }

    /// Largest payload this ring accepts.
    pub(crate) fn max_payload(&self) -> usize {
        max_payload(self.mem.capacity)
    }

    /// Whether at least half of the ring is free (as far as the consumer published its
    /// tail): about room for a batch of records as long as the longest record (the
    /// offload engine's command ring, whose capacity is twice that).
    #[cfg(not(loom))]
    pub(crate) fn half_free(&self) -> bool {
        let used = self.head - self.tail.get().load(Ordering::Acquire);
        used <= self.mem.capacity as u64 / 2
    }

    /// Whether the consumer has released every record pushed (as far as it published
    /// its tail; Acquire: what it read of them happened before).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn drained(&self) -> bool {
        self.tail.get().load(Ordering::Acquire) == self.head
    }

    /// Appends one record; returns false when the ring has no room (try again later).
    /// `data.len()` must not exceed [`Producer::max_payload`].
    #[inline]
    pub(crate) fn try_push(&mut self, data: &[u8]) -> bool {
        self.push_with(data.len(), |mem, at| mem.write_payload(at, data))
    }

    /// Appends one record made of `head` followed by `body` (a small header of the
    /// caller's and a message, copied once each); like [`Producer::try_push`].
    #[inline]
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn try_push2(&mut self, head: &[u8], body: &[u8]) -> bool {
        self.push_with(head.len() + body.len(), |mem, at| {
            mem.write_payload(at, head);
            mem.write_payload(at + head.len(), body);
        })
    }

    /// [`Producer::try_push2`] of a record made of three parts (a command's header, a
    /// message's header and its body: the offload engine's commands).
    #[cfg(not(loom))]
    #[inline]
    pub(crate) fn try_push3(&mut self, a: &[u8], b: &[u8], c: &[u8]) -> bool {
        self.push_with(a.len() + b.len() + c.len(), |mem, at| {
            mem.write_payload(at, a);
            mem.write_payload(at + a.len(), b);
            mem.write_payload(at + a.len() + b.len(), c);
        })
    }

    /// Reserves a record of `len` payload bytes, lets `write(mem, offset)` fill it, and
    /// publishes it.
    #[inline(always)]
    fn push_with(&mut self, len: usize, write: impl FnOnce(&RingMem, usize)) -> bool {
        debug_assert!(len <= self.max_payload());
        let cap = self.mem.capacity as u64;
        let rec = stride(len) as u64;
        let idx = self.head & (cap - 1);
        let contiguous = cap - idx;
        // Early (module documentation): nothing is unreleased, and the record and the
        // zero header after it fit before `idx`.
        let wrap = rec > contiguous
            || (rec <= EARLY_WRAP_RECORD
                && idx >= self.early_wrap_at
                && idx >= rec + HDR as u64
                && self.seen_drained());
        // Room for the record, the padding to the end if it must wrap, and the zeroed
        // header of the next record.
        let needed = if wrap { contiguous + rec } else { rec } + HDR as u64;
        if needed > cap - (self.head - self.cached_tail) {
            // Acquire pairs with the consumer's Release of its tail: the bytes it
            // released are no longer read and may be overwritten.
            self.cached_tail = self.tail.get().load(Ordering::Acquire);
            if needed > cap - (self.head - self.cached_tail) {
                return false;
            }
        }
        let mut at = idx as usize;
        if wrap {
            self.mem.header(0).store(0, Ordering::Relaxed);
            // Release: the zero at offset 0 is visible before the consumer follows WRAP.
            self.mem
                .header(at)
                .store(KIND_WRAP << KIND_SHIFT, Ordering::Release);
            self.head += contiguous;
            at = 0;
        }
        write(&self.mem, at + HDR);
        let next = (at + rec as usize) & (cap as usize - 1);
        self.mem.header(next).store(0, Ordering::Relaxed);
        // Release: payload and next zero header are visible before this header.
        self.mem
            .header(at)
            .store((KIND_MSG << KIND_SHIFT) | len as u64, Ordering::Release);
        self.head += rec;
        true
    }
}

/// A record handed to the reader.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Record {
    /// Offset of the payload in the ring.
    pub idx: usize,
    /// Payload length.
    pub len: usize,
    /// Token to pass to [`Consumer::release`].
    pub token: u64,
}

/// The ring holds a header that cannot have been written by a correct producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Corrupt {
    /// The offending header word.
    pub header: u64,
    /// Its offset in the ring.
    pub idx: usize,
}

/// The receiver's half of a ring.
pub(crate) struct Consumer {
    mem: RingMem,
    tail: TailRef,
    max_len: usize,
    read_pos: u64,
    released: u64,
    published: u64,
    /// End position and released flag of each record read and not yet passed by the tail.
    outstanding: VecDeque<(u64, bool)>,
    /// The common case kept out of `outstanding`: exactly one record is read and not
    /// released; its end position. When set, `outstanding` is empty.
    solo: Option<u64>,
    /// Token number of the oldest record not yet passed by the tail (`solo`'s, or
    /// `outstanding[0]`'s).
    first_token: u64,
}

impl Consumer {
    /// A consumer of a fresh ring; records longer than `max_len` are treated as corrupt.
    pub(crate) fn new(mem: RingMem, tail: TailRef, max_len: usize) -> Consumer {
        let max_len = max_len.min(max_payload(mem.capacity));
        Consumer {
            mem,
            tail,
            max_len,
            read_pos: 0,
            released: 0,
            published: 0,
            outstanding: VecDeque::new(),
            solo: None,
            first_token: 0,
        }
    }

    /// The ring's memory (for turning records into slices).
    pub(crate) fn mem(&self) -> &RingMem {
        &self.mem
    }

    /// Takes the next record, if one is published.
    #[inline(always)]
    pub(crate) fn try_pop(&mut self) -> Result<Option<Record>, Corrupt> {
        let cap = self.mem.capacity as u64;
        loop {
            let idx = (self.read_pos & (cap - 1)) as usize;
            // Acquire pairs with the producer's Release of this header.
            let h = self.mem.header(idx).load(Ordering::Acquire);
            if h == 0 {
                if self.published != self.released {
                    self.publish();
                }
                return Ok(None);
            }
            match h >> KIND_SHIFT {
                KIND_WRAP if h & LEN_MASK == 0 && idx != 0 => {
                    self.read_pos += cap - idx as u64;
                    self.push_outstanding(true);
                }
                KIND_MSG => {
                    let len = (h & LEN_MASK) as usize;
                    let rec = stride(len);
                    if len > self.max_len || idx + rec > cap as usize {
                        return Err(Corrupt { header: h, idx });
                    }
                    self.read_pos += rec as u64;
                    let token = self.push_outstanding(false);
                    return Ok(Some(Record {
                        idx: idx + HDR,
                        len,
                        token,
                    }));
                }
                _ => return Err(Corrupt { header: h, idx }),
            }
        }
    }

    #[inline]
    fn push_outstanding(&mut self, released: bool) -> u64 {
        if self.outstanding.is_empty() && self.solo.is_none() {
            // Nothing else is held: no queue needed.
            let token = self.first_token;
            if released {
                self.first_token += 1;
                self.released = self.read_pos;
                self.maybe_publish();
            } else {
                self.solo = Some(self.read_pos);
            }
            return token;
        }
        if let Some(end) = self.solo.take() {
            self.outstanding.push_back((end, false));
        }
        let token = self.first_token + self.outstanding.len() as u64;
        self.outstanding.push_back((self.read_pos, released));
        if released {
            self.advance();
        }
        token
    }

    /// Releases the record with `token`; unknown or repeated tokens are ignored.
    #[inline]
    pub(crate) fn release(&mut self, token: u64) {
        if token == self.first_token {
            if let Some(end) = self.solo.take() {
                self.first_token += 1;
                self.released = end;
                self.maybe_publish();
                return;
            }
            // The common case: the oldest record is released.
            if let Some((end, _)) = self.outstanding.pop_front() {
                self.first_token += 1;
                self.released = end;
                self.advance();
            }
            return;
        }
        let Some(i) = token.checked_sub(self.first_token) else {
            return;
        };
        if let Some(entry) = self.outstanding.get_mut(i as usize) {
            entry.1 = true;
            self.advance();
        }
    }

    fn advance(&mut self) {
        while let Some(&(end, true)) = self.outstanding.front() {
            self.outstanding.pop_front();
            self.first_token += 1;
            self.released = end;
        }
        self.maybe_publish();
    }

    /// Publishes the tail once an eighth of the ring has been freed since the last time.
    #[inline]
    fn maybe_publish(&mut self) {
        if self.released - self.published >= self.mem.capacity as u64 / 8 {
            self.publish();
        }
    }

    /// Publishes the tail if everything read is released and the producer has not been
    /// told: for a reader that stops after a batch without polling the ring empty, so
    /// that a producer that waits for it to catch up sees it did (and may wrap early).
    #[inline]
    pub(crate) fn publish_if_caught_up(&mut self) {
        if self.released == self.read_pos && self.published != self.released {
            self.publish();
        }
    }

    /// Publishes the released position to the producer now.
    pub(crate) fn publish(&mut self) {
        // Release: our reads of the released records happen before the producer reuses them.
        self.tail.get().store(self.released, Ordering::Release);
        self.published = self.released;
    }

    /// True when the next header is published (a cheap peek, no state change).
    #[inline]
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn has_data(&self) -> bool {
        let idx = (self.read_pos & (self.mem.capacity as u64 - 1)) as usize;
        self.mem.header(idx).load(Ordering::Acquire) != 0
    }
}

/// A ring in ordinary memory, shared by two threads of one process (the offload
/// engine's queues): the same records and protocol as a shared-memory ring.
#[cfg(not(loom))]
pub(crate) struct HeapRing {
    base: *mut u8,
    layout: std::alloc::Layout,
    capacity: usize,
}

// SAFETY: the memory is owned by the HeapRing and freed only when the last Arc to it
// goes; the producer and consumer access it under the ring protocol (atomics).
#[cfg(not(loom))]
unsafe impl Send for HeapRing {}
// SAFETY: as above: shared access goes through the ring protocol only.
#[cfg(not(loom))]
unsafe impl Sync for HeapRing {}

/// A producer or consumer of a [`HeapRing`], keeping the ring's memory alive.
#[cfg(not(loom))]
pub(crate) struct HeapEnd<T> {
    end: T,
    _ring: std::sync::Arc<HeapRing>,
}

#[cfg(not(loom))]
impl<T> std::ops::Deref for HeapEnd<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.end
    }
}

#[cfg(not(loom))]
impl<T> std::ops::DerefMut for HeapEnd<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.end
    }
}

#[cfg(not(loom))]
impl HeapRing {
    /// A fresh ring able to carry records of up to `max_len` payload bytes (its capacity
    /// is the next power of two of twice that, at least 4 KiB), as its two ends.
    pub(crate) fn split(max_len: usize) -> (HeapEnd<Producer>, HeapEnd<Consumer>) {
        let capacity = (2 * stride(max_len) + 4 * HDR)
            .next_power_of_two()
            .max(4096);
        // The consumer's tail lives on its own cache line after the records.
        let layout = std::alloc::Layout::from_size_align(capacity + 64, 64)
            .expect("ring size fits the address space");
        // SAFETY: the layout has a nonzero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        let ring = std::sync::Arc::new(HeapRing {
            base,
            layout,
            capacity,
        });
        // SAFETY: base is 64-aligned, zeroed and valid for capacity + 64 bytes until the
        // HeapRing is dropped, which happens after both ends (each holds an Arc).
        let (mem_p, mem_c) =
            unsafe { (RingMem::new(base, capacity), RingMem::new(base, capacity)) };
        // SAFETY: the tail word lies inside the allocation (at offset capacity, 8-aligned)
        // and lives as long as the ends.
        let tail =
            |r: &HeapRing| unsafe { TailRef::new(r.base.add(r.capacity) as *const AtomicU64) };
        let producer = Producer::new(mem_p, tail(&ring));
        let consumer = Consumer::new(mem_c, tail(&ring), max_len);
        (
            HeapEnd {
                end: producer,
                _ring: ring.clone(),
            },
            HeapEnd {
                end: consumer,
                _ring: ring,
            },
        )
    }
}

#[cfg(not(loom))]
impl Drop for HeapRing {
    fn drop(&mut self) {
        // SAFETY: base was allocated with this layout in `split` and is freed once.
        unsafe { std::alloc::dealloc(self.base, self.layout) };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A ring over heap memory, for single-process tests.
    struct TestRing {
        _buf: Vec<u64>,
        _tail: Box<AtomicU64>,
    }

    fn ring(capacity: usize, max_len: usize) -> (TestRing, Producer, Consumer) {
        let mut buf = vec![0u64; capacity / 8];
        let tail = Box::new(AtomicU64::new(0));
        let base = buf.as_mut_ptr() as *mut u8;
        // SAFETY: buf and tail live in TestRing, returned alongside the halves and
        // dropped after them by the tests.
        let (p, c) = unsafe {
            (
                Producer::new(RingMem::new(base, capacity), TailRef::new(&*tail)),
                Consumer::new(RingMem::new(base, capacity), TailRef::new(&*tail), max_len),
            )
        };
        (
            TestRing {
                _buf: buf,
                _tail: tail,
            },
            p,
            c,
        )
    }

    fn read(c: &Consumer, r: Record) -> Vec<u8> {
        // SAFETY: the record is unreleased, so its bytes are stable and inside the ring.
        unsafe { std::slice::from_raw_parts(c.mem().payload_ptr(r.idx), r.len).to_vec() }
    }

    #[test]
    fn empty_ring_has_nothing() {
        let (_r, _p, mut c) = ring(256, 1000);
        assert!(c.try_pop().unwrap().is_none());
    }

    #[test]
    fn messages_keep_boundaries_and_order_across_wraps() {
        let (_r, mut p, mut c) = ring(256, 1000);
        for round in 0..200u32 {
            let len = (round as usize * 7) % 100;
            let msg: Vec<u8> = (0..len).map(|i| (i as u32 + round) as u8).collect();
            assert!(p.try_push(&msg), "round {round}");
            let r = c.try_pop().unwrap().expect("message");
            assert_eq!(read(&c, r), msg);
            c.release(r.token);
        }
    }

    #[test]
    fn small_messages_cycle_near_the_start_while_the_consumer_keeps_up() {
        let (_r, mut p, mut c) = ring(1 << 20, 1000);
        // A receiver that polls again finds the ring empty and publishes its tail.
        let furthest = stream_small(&mut p, &mut c, 20_000, true);
        // 20 000 records of 32 bytes would reach 640 KiB without early wraps.
        assert!(
            furthest < EARLY_WRAP_AT + 64,
            "records went as far as {furthest}"
        );
    }

    #[test]
    fn a_consumer_that_holds_or_lags_sees_the_whole_ring() {
        let cap = 1 << 20;
        let big = vec![9u8; 4 * EARLY_WRAP_AT];
        // Held: one small record kept while the others are read, released and
        // published; behind a wrap, it would leave the producer about its offset of room.
        let (_r, mut p, mut c) = ring(cap, 1 << 20);
        let small = |p: &mut Producer, n: u32| {
            for round in 0..n {
                assert!(p.try_push(&round.to_le_bytes().repeat(6)), "round {round}");
            }
        };
        // Up to just before the early wrap's start, all read and released (and
        // published: the last poll finds the ring empty).
        small(&mut p, 500);
        read_all(&mut c);
        // One record held just before that start, a few after it read and released.
        small(&mut p, 1);
        let held = c.try_pop().unwrap().unwrap();
        small(&mut p, 20);
        read_all(&mut c);
        assert!(
            p.head as usize > EARLY_WRAP_AT,
            "past the early wrap's start"
        );
        small(&mut p, 100);
        assert!(
            p.try_push(&big),
            "the ring's room is whole while a token is held"
        );
        // Lagging: everything released but nothing published yet (no empty poll, less
        // than an eighth of the ring): the producer keeps going through the ring.
        let (_r2, mut p2, mut c2) = ring(cap, 1000);
        let furthest = stream_small(&mut p2, &mut c2, 2_000, false);
        assert!(
            furthest > 2 * EARLY_WRAP_AT,
            "records stopped at {furthest}"
        );
        c.release(held.token);
        assert_eq!(read_all(&mut c).last(), Some(&big));
    }

    #[test]
    fn a_batch_that_caught_up_publishes_its_tail() {
        let (_r, mut p, mut c) = ring(1 << 20, 1000);
        for _ in 0..3 {
            assert!(p.try_push(&[1; 24]));
        }
        // Two read and released, without polling the ring empty: not published yet.
        for _ in 0..2 {
            let r = c.try_pop().unwrap().unwrap();
            c.release(r.token);
        }
        assert!(!p.drained());
        c.publish_if_caught_up();
        assert_eq!(
            c.tail.get().load(Ordering::Relaxed),
            64,
            "two records of 32 bytes"
        );
        // The third held: nothing more to publish until it is released.
        let held = c.try_pop().unwrap().unwrap();
        c.publish_if_caught_up();
        assert_eq!(c.tail.get().load(Ordering::Relaxed), 64);
        c.release(held.token);
        c.publish_if_caught_up();
        assert!(p.drained());
    }

    /// Pushes `rounds` records of 24 bytes, each read (checked) and released at once, and
    /// after each a poll of the empty ring if `poll_empty`; the furthest offset a record
    /// lay at.
    fn stream_small(p: &mut Producer, c: &mut Consumer, rounds: u32, poll_empty: bool) -> usize {
        let mut furthest = 0;
        for round in 0..rounds {
            let msg = round.to_le_bytes().repeat(6);
            assert!(p.try_push(&msg), "round {round}");
            let r = c.try_pop().unwrap().expect("message");
            furthest = furthest.max(r.idx);
            assert_eq!(read(c, r), msg);
            c.release(r.token);
            if poll_empty {
                assert!(c.try_pop().unwrap().is_none());
            }
        }
        furthest
    }

    /// Every record left, read and released in order.
    fn read_all(c: &mut Consumer) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(r) = c.try_pop().unwrap() {
            out.push(read(c, r));
            c.release(r.token);
        }
        out
    }

    #[test]
    fn full_ring_refuses_until_released() {
        let (_r, mut p, mut c) = ring(128, 1000);
        let mut n = 0;
        while p.try_push(&[n as u8; 24]) {
            n += 1;
        }
        assert!(n >= 2, "ring took {n}");
        let r = c.try_pop().unwrap().unwrap();
        assert!(!p.try_push(&[0; 24]), "space reused before release");
        c.release(r.token);
        c.publish();
        assert!(p.try_push(&[0xee; 24]));
    }

    #[test]
    fn out_of_order_release_holds_the_tail() {
        let (_r, mut p, mut c) = ring(128, 1000);
        assert!(p.try_push(&[1; 16]));
        assert!(p.try_push(&[2; 16]));
        let a = c.try_pop().unwrap().unwrap();
        let b = c.try_pop().unwrap().unwrap();
        c.release(b.token);
        c.publish();
        assert_eq!(read(&c, a), vec![1; 16], "unreleased record overwritten");
        c.release(a.token);
        c.release(a.token); // repeated release is ignored
        c.publish();
        assert!(c.try_pop().unwrap().is_none());
    }

    #[test]
    fn corrupt_header_is_an_error() {
        let (_r, mut p, mut c) = ring(256, 64);
        assert!(p.try_push(&[0; 8]));
        // Overwrite the header with an impossible length.
        p.mem
            .header(0)
            .store((KIND_MSG << KIND_SHIFT) | 4096, Ordering::Release);
        assert!(c.try_pop().is_err());
        p.mem.header(0).store(7 << KIND_SHIFT, Ordering::Release);
        assert!(c.try_pop().is_err());
    }

    /// A record of three parts (the offload engine's commands) reads back as their
    /// concatenation, whatever the parts' lengths and alignment; and the producer says
    /// it has half the ring free only while at most half is taken.
    #[test]
    fn three_part_records_and_half_free() {
        let (_r, mut p, mut c) = ring(1024, 512);
        assert!(p.half_free(), "an empty ring");
        for (a, b, d) in [(3usize, 0usize, 5usize), (16, 9, 0), (1, 1, 1), (0, 0, 0)] {
            let (x, y, z) = (vec![0xa1u8; a], vec![0xb2u8; b], vec![0xc3u8; d]);
            assert!(p.try_push3(&x, &y, &z));
            let r = c.try_pop().unwrap().expect("the record");
            // SAFETY: the record is unreleased, so its bytes stay in place.
            let got = unsafe { std::slice::from_raw_parts(c.mem().payload_ptr(r.idx), r.len) };
            assert_eq!(got, [x, y, z].concat(), "parts of {a}, {b} and {d} bytes");
            c.release(r.token);
        }
        c.publish();
        assert!(p.half_free());
        // Records of 100 bytes (112 with the header and padding) until more than half
        // of the 1024 bytes is taken.
        let mut pushed = 0;
        while p.half_free() {
            assert!(p.try_push(&[7; 100]));
            pushed += 1;
        }
        assert_eq!(pushed, 5, "4 records (448 bytes) leave half free, 5 do not");
        let mut tokens = Vec::new();
        while let Some(r) = c.try_pop().unwrap() {
            tokens.push(r.token);
        }
        for t in tokens {
            c.release(t);
        }
        c.publish();
        assert!(p.half_free(), "released and published: free again");
    }

    /// A heap ring between two threads: records of two parts arrive whole, in order,
    /// across many wraps, with the consumer releasing out of order now and then.
    #[test]
    fn heap_ring_carries_two_part_records_between_threads() {
        const N: u32 = 100_000;
        let (mut tx, mut rx) = HeapRing::split(300);
        let producer = std::thread::spawn(move || {
            for i in 0..N {
                let body = vec![(i % 251) as u8; (i % 293) as usize];
                while !tx.try_push2(&i.to_le_bytes(), &body) {
                    std::thread::yield_now();
                }
            }
        });
        let mut held = None;
        let mut i = 0;
        while i < N {
            let Some(r) = rx.try_pop().unwrap() else {
                std::thread::yield_now();
                continue;
            };
            // SAFETY: the record is unreleased, so its bytes stay in place.
            let bytes = unsafe { std::slice::from_raw_parts(rx.mem().payload_ptr(r.idx), r.len) };
            assert_eq!(&bytes[..4], &i.to_le_bytes(), "record {i}");
            assert_eq!(bytes.len(), 4 + (i % 293) as usize, "record {i}");
            assert!(
                bytes[4..].iter().all(|&b| b == (i % 251) as u8),
                "record {i}"
            );
            // Hold every 7th record until the next one is read: out-of-order release.
            if i % 7 == 0 {
                if let Some(t) = held.replace(r.token) {
                    rx.release(t);
                }
            } else {
                rx.release(r.token);
                if let Some(t) = held.take() {
                    rx.release(t);
                }
            }
            i += 1;
        }
        producer.join().unwrap();
        assert!(rx.try_pop().unwrap().is_none());
    }

    proptest! {
        /// Any interleaving of pushes, pops and (possibly out-of-order) releases delivers
        /// every message once, in order, byte-identical.
        #[test]
        fn random_schedule_delivers_in_order(
            ops in proptest::collection::vec((0u8..4, 0usize..200), 1..400)
        ) {
            let (_r, mut p, mut c) = ring(512, 512);
            let mut sent: VecDeque<Vec<u8>> = VecDeque::new();
            let mut held: Vec<(Record, Vec<u8>)> = Vec::new();
            let mut counter = 0u8;
            for (op, len) in ops {
                match op {
                    0 | 1 => {
                        let len = len.min(p.max_payload());
                        let msg: Vec<u8> = (0..len).map(|_| { counter = counter.wrapping_add(1); counter }).collect();
                        if p.try_push(&msg) { sent.push_back(msg); }
                    }
                    2 => {
                        if let Some(r) = c.try_pop().unwrap() {
                            let expect = sent.pop_front().expect("delivered more than sent");
                            prop_assert_eq!(read(&c, r), expect.clone());
                            held.push((r, expect));
                        }
                    }
                    _ => {
                        if !held.is_empty() {
                            let (r, data) = held.remove(len % held.len());
                            prop_assert_eq!(read(&c, r), data);
                            c.release(r.token);
                        }
                    }
                }
            }
            for (r, data) in held.drain(..) {
                prop_assert_eq!(read(&c, r), data);
            }
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    fn halves(words: usize) -> (Producer, Consumer) {
        let mem: Arc<Vec<AtomicU64>> = Arc::new((0..words).map(|_| AtomicU64::new(0)).collect());
        let tail = Arc::new(AtomicU64::new(0));
        let p = Producer::new(
            RingMem::new_loom(mem.clone()),
            TailRef::new_loom(tail.clone()),
        );
        let c = Consumer::new(RingMem::new_loom(mem), TailRef::new_loom(tail), 1 << 20);
        (p, c)
    }

    /// Runs a producer of `msgs` and a consumer on a ring of `words` words under every
    /// interleaving; the consumer publishes after each release if `publish_each` (else
    /// only as it does by itself). Every message arrives once, in order, intact.
    fn deliver_in_order(words: usize, msgs: Vec<Vec<u8>>, publish_each: bool) {
        let (mut p, mut c) = halves(words);
        let expect = msgs.clone();
        let prod = loom::thread::spawn(move || {
            for m in &msgs {
                while !p.try_push(m) {
                    loom::thread::yield_now();
                }
            }
        });
        let mut got = 0;
        while got < expect.len() {
            match c.try_pop().expect("corrupt") {
                Some(r) => {
                    assert_eq!(c.mem().read_payload(r.idx, r.len), expect[got]);
                    c.release(r.token);
                    if publish_each {
                        c.publish();
                    }
                    got += 1;
                }
                None => loom::thread::yield_now(),
            }
        }
        prod.join().unwrap();
    }

    /// A tiny ring, so that records wrap and the producer waits for released space.
    #[test]
    fn spsc_ring_delivers_in_order_under_all_interleavings() {
        loom::model(|| {
            // 8 words = 64 bytes: max payload 40, so three 16-byte records force a wrap.
            deliver_in_order(8, vec![vec![1u8; 16], vec![2u8; 9], vec![3u8; 16]], true);
        });
    }

    /// Small records on a ring where the producer may wrap early (16 words = 128 bytes:
    /// early past 32 bytes, once everything is released), the consumer publishing only as
    /// it does by itself: the fourth record goes back to the start or after the third
    /// depending on the interleaving.
    #[test]
    fn early_wraps_deliver_in_order_under_all_interleavings() {
        loom::model(|| deliver_in_order(16, (1..=4u8).map(|i| vec![i; 8]).collect(), false));
    }
}
