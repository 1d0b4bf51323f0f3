//! One facade for the atomics used by lock-free shared-memory code: `std` normally,
//! `loom` under `--cfg loom`, so that the same code is model-checked.

#[cfg(loom)]
pub(crate) use loom::sync::atomic;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic;

/// Spin-loop hint (a `pause` instruction), or a loom yield under the model checker.
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
