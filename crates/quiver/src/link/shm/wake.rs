//! The wake-up protocol between senders and a sleeping receiver.
//!
//! Senders never make a system call while the receiver is polling. When the receiver
//! is about to sleep it *arms*; a sender that publishes a record and then finds the
//! receiver armed rings its doorbell socket, at most once per sleep (the
//! `doorbell_pending` flag). The receiver, on waking, drains the socket, clears the flag
//! and re-checks its rings before sleeping again.
//!
//! Why no wake-up is lost (both sides issue a SeqCst fence between their write and their
//! read — the store-buffering pattern): either the receiver's re-check after its fence
//! sees the sender's record, or the sender's read after its fence sees `armed == 1` and
//! `doorbell_pending == 0` and rings. `loom_tests` checks this under all interleavings.

use crate::sync::atomic::{fence, AtomicU32, Ordering};

/// The wake-up flags, on a cache line of their own in the receiver's segment.
#[repr(C, align(64))]
pub(crate) struct WakeLine {
    armed: AtomicU32,
    doorbell_pending: AtomicU32,
}

impl WakeLine {
    /// Fresh flags (unarmed, nothing pending); shared memory starts zeroed, which is the
    /// same state.
    pub(crate) fn new() -> WakeLine {
        WakeLine {
            armed: AtomicU32::new(0),
            doorbell_pending: AtomicU32::new(0),
        }
    }

    /// Sender, after publishing a record: whether it must ring the doorbell.
    #[inline]
    pub(crate) fn must_ring(&self) -> bool {
        fence(Ordering::SeqCst);
        self.armed.load(Ordering::Relaxed) != 0
            && self.doorbell_pending.swap(1, Ordering::SeqCst) == 0
    }

    /// Receiver: from now on, senders ring the doorbell.
    pub(crate) fn arm(&self) {
        self.armed.store(1, Ordering::SeqCst);
    }

    /// Receiver: back to polling; senders stop ringing.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn disarm(&self) {
        self.armed.store(0, Ordering::Relaxed);
    }

    /// Receiver, after draining the doorbell socket and before re-checking its rings.
    pub(crate) fn reset_after_drain(&self) {
        self.doorbell_pending.store(0, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::super::ring::{Consumer, Producer, RingMem, TailRef};
    use super::*;
    use crate::sync::atomic::{AtomicU64, AtomicUsize};
    use loom::sync::Arc;

    /// A receiver that goes to sleep after finding its ring empty is always woken: if it
    /// missed the record, the sender rang after the receiver drained its doorbell.
    #[test]
    fn no_lost_wakeup() {
        loom::model(|| {
            let mem: Arc<Vec<AtomicU64>> = Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
            let tail = Arc::new(AtomicU64::new(0));
            let wake = Arc::new(WakeLine::new());
            let doorbell = Arc::new(AtomicUsize::new(0)); // datagrams sent
            let mut p = Producer::new(
                RingMem::new_loom(mem.clone()),
                TailRef::new_loom(tail.clone()),
            );
            let mut c = Consumer::new(RingMem::new_loom(mem), TailRef::new_loom(tail), 64);

            let (w, d) = (wake.clone(), doorbell.clone());
            let sender = loom::thread::spawn(move || {
                assert!(p.try_push(b"ping"));
                if w.must_ring() {
                    d.fetch_add(1, Ordering::SeqCst);
                }
            });

            // Receiver: arm, drain, reset, re-check; sleep if still empty.
            wake.arm();
            let drained = doorbell.load(Ordering::SeqCst);
            wake.reset_after_drain();
            let got = c.try_pop().unwrap().is_some();
            sender.join().unwrap();
            if !got {
                assert!(
                    doorbell.load(Ordering::SeqCst) > drained,
                    "receiver sleeps with a record in its ring and no doorbell"
                );
            }
        });
    }
}
