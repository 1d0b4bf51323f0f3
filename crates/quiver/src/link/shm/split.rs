//! A split copy: one large same-node transfer moved by both of its processes at once.
//!
//! A receiver pulls a message with cross-memory attach (`process_vm_readv`); a sender
//! that waits inside quiver meanwhile has an idle core. A [`SplitSlot`], one cache line
//! in the sender's shared memory, lets the two divide the transfer between them while it
//! runs: the transfer is cut into `units`, the receiver claims units from the front and
//! reads them, the sender claims units from the back and writes them
//! (`process_vm_writev`), and they meet wherever their speeds put the meeting point.
//! Nobody waits for a partner that does not come: a sender busy elsewhere claims
//! nothing and the receiver takes every unit itself; the receiver waits only for units
//! the sender has already claimed, which it is writing now.
//!
//! Protocol (all in one slot; `claims` holds `front << 32 | back`):
//! - The sender [`reset`](SplitSlot::reset)s the slot for message `msg` before it
//!   announces the message: `claims` = 0, so there is nothing to claim.
//! - The receiver [`open`](SplitSlot::open)s it: it writes where the bytes go
//!   (`dst`, `len`, `pid`), then publishes `claims` = `first << 32 | units` with
//!   `Release`, having claimed units `0..first` for itself in the same store.
//! - Each side claims with a compare-and-swap on `claims` (front up for the receiver,
//!   back down for the sender), so every unit is claimed exactly once. The sender reads
//!   `dst`, `len` and `pid` only after a successful claim (`Acquire`: it sees the
//!   receiver's writes that preceded its `Release`).
//! - The sender adds the units it has written to `helped` (`Release`) after writing
//!   them; a range it claimed but could not write is recorded in `failed` first, and
//!   counted as helped, so the receiver never waits for it and reads it itself.
//! - The receiver, once `front == back`, knows the sender's share (`units - back`) and
//!   waits until `helped` reaches it (`Acquire`: the sender's bytes are then in place).
//!   Only then does it tell the sender (`Done`, a message) that it is finished; the
//!   sender resets the slot for another message only after that.

use crate::sync::atomic::{AtomicU64, Ordering};
use std::ops::Range;

/// Bytes per unit of a split transfer. Claims take many units at once (see
/// [`SplitSlot::claim_front`]), so the unit only bounds how finely the two sides can
/// balance: the last unit of the slower side is what the other may wait for.
pub(crate) const UNIT: usize = 16 << 10;

/// Most units the sender claims at once (a sender preempted in the middle of a claim
/// holds at most this much of the transfer).
pub(crate) const SENDER_MAX_CLAIM: u32 = 16;

/// Units a transfer of `len` bytes is cut into.
#[cfg_attr(loom, allow(dead_code))] // the loom build leaves out the tagged layer
pub(crate) fn units_for(len: u64) -> Option<u32> {
    u32::try_from(len.div_ceil(UNIT as u64)).ok()
}

/// The byte range of units `r` within a transfer of `len` bytes.
#[cfg_attr(loom, allow(dead_code))] // the loom build leaves out the tagged layer
pub(crate) fn byte_range(r: &Range<u32>, len: u64) -> Range<u64> {
    let start = (u64::from(r.start) * UNIT as u64).min(len);
    let end = (u64::from(r.end) * UNIT as u64).min(len);
    start..end
}

fn split(claims: u64) -> (u32, u32) {
    ((claims >> 32) as u32, claims as u32)
}

fn join(front: u32, back: u32) -> u64 {
    (u64::from(front) << 32) | u64::from(back)
}

/// Half of `n`, rounded up.
fn half(n: u32) -> u32 {
    n.div_ceil(2)
}

/// Where the receiver wants the bytes: set by [`SplitSlot::open`], read by the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Destination {
    /// Address, in the receiver, of the transfer's first byte.
    pub dst: u64,
    /// Bytes of the transfer.
    pub len: u64,
    /// The receiver's process.
    pub pid: u32,
}

/// One transfer's shared state: a cache line in the sender's shared memory.
#[repr(C, align(64))]
pub(crate) struct SplitSlot {
    msg: AtomicU64,
    claims: AtomicU64,
    helped: AtomicU64,
    failed: AtomicU64,
    dst: AtomicU64,
    len: AtomicU64,
    pid: AtomicU64,
}

impl SplitSlot {
    /// A closed slot (model checking; in shared memory a zero-filled slot is the same).
    #[cfg(any(test, loom))]
    pub(crate) fn new() -> SplitSlot {
        SplitSlot {
            msg: AtomicU64::new(0),
            claims: AtomicU64::new(0),
            helped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dst: AtomicU64::new(0),
            len: AtomicU64::new(0),
            pid: AtomicU64::new(0),
        }
    }

    /// Sender: prepares the slot for message `msg` (nothing claimable until the
    /// receiver opens it). Only after the receiver of the previous message finished.
    pub(crate) fn reset(&self, msg: u64) {
        self.claims.store(0, Ordering::Relaxed);
        self.helped.store(0, Ordering::Relaxed);
        self.failed.store(0, Ordering::Relaxed);
        // Release: a receiver that reads this message number (it learns of the message
        // later still, through a channel that orders) also sees the zeroes above.
        self.msg.store(msg, Ordering::Release);
    }

    /// Receiver: opens the slot of message `msg` for a transfer of `units` units to
    /// `dest`, claiming the first half for itself. `None` (nothing changed) if the slot
    /// serves another message or was opened already, or `units` is 0.
    pub(crate) fn open(&self, msg: u64, units: u32, dest: Destination) -> Option<Range<u32>> {
        if units == 0
            || self.msg.load(Ordering::Acquire) != msg
            || self.claims.load(Ordering::Relaxed) != 0
        {
            return None;
        }
        self.dst.store(dest.dst, Ordering::Relaxed);
        self.len.store(dest.len, Ordering::Relaxed);
        self.pid.store(u64::from(dest.pid), Ordering::Relaxed);
        let first = half(units);
        // Release: the destination above is visible to a sender that claims.
        self.claims.store(join(first, units), Ordering::Release);
        Some(0..first)
    }

    /// Receiver: claims more units from the front. Half of what is left while the
    /// sender is taking units too; everything left when the sender has taken none (it is
    /// not inside quiver: splitting further would only add system calls). `None` when
    /// every unit is claimed; the sender's share is then `units - meeting point`, see
    /// [`SplitSlot::sender_share`].
    pub(crate) fn claim_front(&self, units: u32) -> Option<Range<u32>> {
        let mut cur = self.claims.load(Ordering::Relaxed);
        loop {
            let (front, back) = split(cur);
            if front >= back {
                return None;
            }
            let take = if back == units {
                back - front
            } else {
                half(back - front)
            };
            match self.claims.compare_exchange_weak(
                cur,
                join(front + take, back),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(front..front + take),
                Err(now) => cur = now,
            }
        }
    }

    /// Sender: claims units from the back, if the slot is open and units are left;
    /// with where they go.
    pub(crate) fn claim_back(&self) -> Option<(Range<u32>, Destination)> {
        let mut cur = self.claims.load(Ordering::Relaxed);
        loop {
            let (front, back) = split(cur);
            if front >= back {
                return None;
            }
            let take = half(back - front).min(SENDER_MAX_CLAIM);
            match self.claims.compare_exchange_weak(
                cur,
                join(front, back - take),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    let dest = Destination {
                        dst: self.dst.load(Ordering::Relaxed),
                        len: self.len.load(Ordering::Relaxed),
                        pid: self.pid.load(Ordering::Relaxed) as u32,
                    };
                    return Some((back - take..back, dest));
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Sender: the units `r` (claimed by [`SplitSlot::claim_back`]) are written.
    pub(crate) fn helped(&self, r: Range<u32>) {
        self.helped
            .fetch_add(u64::from(r.end - r.start), Ordering::Release);
    }

    /// Sender: the units `r` could not be written; the receiver reads them itself.
    pub(crate) fn failed(&self, r: Range<u32>) {
        self.failed.store(join(r.start, r.end), Ordering::Relaxed);
        // Release (in `helped`): the receiver that sees the count sees the range.
        self.helped(r);
    }

    /// Receiver, once [`SplitSlot::claim_front`] returned `None`: the sender's share,
    /// in units.
    pub(crate) fn sender_share(&self, units: u32) -> u32 {
        let (front, _) = split(self.claims.load(Ordering::Relaxed));
        units.saturating_sub(front)
    }

    /// Receiver: whether the sender has written its `share` of units; if so, the units
    /// it failed to write (empty when none).
    pub(crate) fn sender_finished(&self, share: u32) -> Option<Range<u32>> {
        if self.helped.load(Ordering::Acquire) < u64::from(share) {
            return None;
        }
        let (start, end) = split(self.failed.load(Ordering::Relaxed));
        Some(start..end)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const DEST: Destination = Destination {
        dst: 0x1000,
        len: 10 * UNIT as u64,
        pid: 42,
    };

    #[test]
    fn a_slot_opens_only_for_its_message_and_once() {
        let s = SplitSlot::new();
        s.reset(7);
        assert_eq!(s.claim_back(), None, "closed: nothing to claim");
        assert_eq!(s.open(8, 10, DEST), None, "another message");
        assert_eq!(s.open(7, 0, DEST), None, "no units");
        assert_eq!(s.open(7, 10, DEST), Some(0..5));
        assert_eq!(s.open(7, 10, DEST), None, "opened already");
    }

    #[test]
    fn an_absent_sender_leaves_the_rest_to_the_receiver_in_one_claim() {
        let s = SplitSlot::new();
        s.reset(1);
        let units = 10;
        assert_eq!(s.open(1, units, DEST), Some(0..5));
        assert_eq!(s.claim_front(units), Some(5..10));
        assert_eq!(s.claim_front(units), None);
        assert_eq!(s.sender_share(units), 0);
        assert_eq!(s.sender_finished(0), Some(0..0));
    }

    #[test]
    fn both_sides_meet_and_every_unit_is_claimed_once() {
        let s = SplitSlot::new();
        s.reset(3);
        let units = 40;
        let mut owner = vec![0u8; units as usize];
        let mut mark = |r: Range<u32>, who: u8| {
            for u in r {
                assert_eq!(owner[u as usize], 0, "unit {u} claimed twice");
                owner[u as usize] = who;
            }
        };
        mark(s.open(3, units, DEST).unwrap(), 1);
        let (r, d) = s.claim_back().unwrap();
        assert_eq!(d, DEST);
        assert_eq!(r, 30..40, "half of what is left");
        mark(r.clone(), 2);
        s.helped(r);
        // The two alternate: the receiver claims, then the sender.
        while let Some(a) = s.claim_front(units) {
            mark(a, 1);
            if let Some((r, _)) = s.claim_back() {
                mark(r.clone(), 2);
                s.helped(r);
            }
        }
        while let Some((r, _)) = s.claim_back() {
            mark(r.clone(), 2);
            s.helped(r);
        }
        assert!(owner.iter().all(|&o| o != 0), "{owner:?}");
        let share = s.sender_share(units);
        assert_eq!(share as usize, owner.iter().filter(|&&o| o == 2).count());
        assert_eq!(s.sender_finished(share), Some(0..0));
        assert_eq!(s.sender_finished(share + 1), None);
    }

    #[test]
    fn the_sender_claims_at_most_its_maximum() {
        let s = SplitSlot::new();
        s.reset(1);
        s.open(1, 200, DEST).unwrap();
        let (r, _) = s.claim_back().unwrap();
        assert_eq!(r, 200 - SENDER_MAX_CLAIM..200);
    }

    #[test]
    fn a_failed_range_is_counted_and_reported() {
        let s = SplitSlot::new();
        s.reset(1);
        s.open(1, 8, DEST).unwrap();
        let (r, _) = s.claim_back().unwrap();
        assert_eq!(r, 6..8);
        assert_eq!(s.sender_finished(2), None);
        s.failed(r);
        while s.claim_front(8).is_some() {}
        assert_eq!(s.sender_share(8), 2);
        assert_eq!(s.sender_finished(2), Some(6..8));
    }

    #[test]
    fn units_and_byte_ranges() {
        assert_eq!(units_for(0), Some(0));
        assert_eq!(units_for(1), Some(1));
        assert_eq!(units_for(UNIT as u64 + 1), Some(2));
        assert_eq!(units_for(u64::MAX), None);
        let len = 2 * UNIT as u64 + 5;
        assert_eq!(byte_range(&(0..1), len), 0..UNIT as u64);
        assert_eq!(byte_range(&(2..3), len), 2 * UNIT as u64..len);
        assert_eq!(byte_range(&(0..3), len), 0..len);
    }
}

/// Model checks (`RUSTFLAGS="--cfg loom" cargo test -p quiver --lib --release loom`):
/// under every interleaving of a receiver and a sender, every unit is claimed by exactly
/// one side, and the receiver finishes only after the sender's units are written.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicU8;
    use loom::sync::Arc;
    use loom::thread;

    const DEST: Destination = Destination {
        dst: 0x1000,
        len: 4 * UNIT as u64,
        pid: 7,
    };

    fn model(units: u32, sender_fails: bool) {
        loom::model(move || {
            let slot = Arc::new(SplitSlot::new());
            slot.reset(5);
            // Each unit's "bytes": written once by whichever side claimed it.
            let bytes: Arc<Vec<AtomicU8>> =
                Arc::new((0..units).map(|_| AtomicU8::new(0)).collect());
            let sender = {
                let (slot, bytes) = (slot.clone(), bytes.clone());
                thread::spawn(move || {
                    // A sender polls a few times, as from a wait loop.
                    for _ in 0..3 {
                        if let Some((r, d)) = slot.claim_back() {
                            assert_eq!(d, DEST);
                            if sender_fails {
                                slot.failed(r);
                            } else {
                                for u in r.clone() {
                                    bytes[u as usize].fetch_add(1, Ordering::Relaxed);
                                }
                                slot.helped(r);
                            }
                        }
                        thread::yield_now();
                    }
                })
            };
            let mut r = slot.open(5, units, DEST).expect("opens");
            loop {
                for u in r {
                    bytes[u as usize].fetch_add(1, Ordering::Relaxed);
                }
                match slot.claim_front(units) {
                    Some(next) => r = next,
                    None => break,
                }
            }
            let share = slot.sender_share(units);
            let failed = loop {
                if let Some(f) = slot.sender_finished(share) {
                    break f;
                }
                thread::yield_now();
            };
            for u in failed {
                bytes[u as usize].fetch_add(1, Ordering::Relaxed);
            }
            // Finished: every unit is in place, exactly once.
            for (u, b) in bytes.iter().enumerate() {
                assert_eq!(b.load(Ordering::Relaxed), 1, "unit {u}");
            }
            sender.join().unwrap();
        });
    }

    #[test]
    fn loom_split_copy_claims_every_unit_once() {
        model(4, false);
    }

    #[test]
    fn loom_split_copy_recovers_a_failed_sender_range() {
        model(3, true);
    }
}
