//! Endpoints stay on the thread that opened them, and their blocking calls release the
//! GIL on that thread.
//!
//! quiver's [`Endpoint`](quiver::Endpoint) is `Send` but not `Sync`, its
//! [`Tagged`](quiver::tagged::Tagged) neither (`RefCell`s, raw pointers into mappings
//! and into the buffers of pending operations). A Python object, though, may be reached
//! from any Python thread, and PyO3 requires a class to be `Send + Sync`. Two tools
//! bridge the gap:
//!
//! - [`ThreadBound`] holds a value that only the thread that made it may reach: any
//!   other thread gets [`ThreadError`](crate::errors) instead, and a `ThreadBound` dropped
//!   elsewhere leaks its value rather than drop it there. Hence the value is used, and
//!   dropped, on one thread only, as if it had never left it.
//! - [`detached`] runs a closure with the GIL released. `Python::detach` asks for `Send`
//!   (its stand-in for "holds nothing of Python's"), but it runs the closure on the
//!   calling thread; `detached` carries the thread's own non-`Send` values (an
//!   `&Tagged`, a received `Message`) through it, and the caller promises that they hold
//!   no Python object or token.
//!
//! While one thread waits with the GIL released, other Python threads run, but they
//! cannot reach its endpoint; the waiting thread's own signal handlers run only between
//! two slices of the wait (`wait`), when no call into quiver is under way.

use std::mem::ManuallyDrop;
use std::thread::ThreadId;

use pyo3::prelude::*;

thread_local! {
    /// This thread's id, read once (`std::thread::current()` clones a handle).
    static ID: ThreadId = std::thread::current().id();
}

/// The calling thread's id; `None` while the thread's locals are being destroyed.
fn current() -> Option<ThreadId> {
    ID.try_with(|id| *id).ok()
}

/// A value that only the thread that made it reaches (module documentation), in the
/// process that made it: a child made by `fork()` has a copy of the thread, with the
/// same id, but its endpoints are the parent's (their shared memory, their peers), so
/// in the child they are neither used nor closed.
pub struct ThreadBound<T> {
    owner: ThreadId,
    pid: u32,
    value: ManuallyDrop<T>,
}

// SAFETY: the value is reached only through `get`, which hands it out on the owner
// thread only, and dropped only on the owner thread (`Drop` leaks it elsewhere): moving
// or sharing the wrapper moves or shares nothing that another thread can use. References
// that `get` hands out are `&T`, which cannot leave the owner thread unless `T: Sync`.
unsafe impl<T> Send for ThreadBound<T> {}
// SAFETY: as above: another thread holding `&ThreadBound<T>` can reach no `&T`.
unsafe impl<T> Sync for ThreadBound<T> {}

impl<T> ThreadBound<T> {
    /// `value`, bound to the calling thread.
    pub fn new(value: T) -> ThreadBound<T> {
        let owner = current().unwrap_or_else(|| std::thread::current().id());
        ThreadBound {
            owner,
            pid: std::process::id(),
            value: ManuallyDrop::new(value),
        }
    }

    /// Whether the caller may reach the value: its thread, in its process.
    #[inline]
    fn here(&self) -> bool {
        current() == Some(self.owner) && std::process::id() == self.pid
    }

    /// The value, on its owner thread; [`ThreadError`](crate::errors) on any other.
    #[inline]
    pub fn get(&self, what: &str) -> PyResult<&T> {
        if self.here() {
            Ok(&self.value)
        } else {
            Err(crate::errors::thread_error(what))
        }
    }

    /// Whether this is a child made by `fork()` after the value was made: the value is
    /// the parent's, to be left alone.
    #[inline]
    pub fn forked_away(&self) -> bool {
        std::process::id() != self.pid
    }

    /// The value, on its owner thread only.
    #[inline]
    pub fn try_get(&self) -> Option<&T> {
        self.here().then_some(&*self.value)
    }
}

impl<T> Drop for ThreadBound<T> {
    fn drop(&mut self) {
        if self.here() {
            // SAFETY: dropped once, here, and never reached again (we are in its drop).
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
        // Elsewhere the value leaks: its pending operations keep their buffers, whose
        // exports leak with it; nothing is freed while quiver may still use it. In a
        // forked child, the parent's endpoints are left alone.
    }
}

/// Carries values through `Python::detach`, whose closure runs on the calling thread.
struct Here<T>(T);

// SAFETY: a `Here` is made and unwrapped by `detached` only, around a closure that
// `Python::detach` runs on the calling thread, before it returns: what it carries never
// reaches another thread.
unsafe impl<T> Send for Here<T> {}

impl<T> Here<T> {
    fn into_inner(self) -> T {
        self.0
    }
}

/// Runs `f(arg)` on this thread with the GIL released, for values that are not `Send`
/// because they must stay on this thread (module documentation).
///
/// # Safety
///
/// `arg`, `f` and what `f` returns hold no Python object or token (`Python`, `Bound`,
/// `Borrowed`, `PyRef`, ...): those need the GIL, which other threads hold meanwhile.
/// (`Py<T>` may be carried but not used.)
#[inline]
pub unsafe fn detached<A, R>(py: Python<'_>, arg: A, f: impl FnOnce(A) -> R) -> R {
    let carried = Here((arg, f));
    py.detach(move || {
        let (arg, f) = carried.into_inner();
        Here(f(arg))
    })
    .into_inner()
}
