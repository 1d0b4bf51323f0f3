//! One facade for the atomics used by lock-free shared-memory code: `std` normally,
//! `loom` under `--cfg loom`, so that the same code is model-checked.

#[cfg(loom)]
pub(crate) use loom::sync::atomic;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic;
