//! Blocking calls: they wait with the GIL released, in slices, and between two slices
//! take the GIL back to run the signal handlers (`check_signals`), so that Ctrl-C raises
//! `KeyboardInterrupt` within a slice. The caller ends what it waited for (quiver's
//! `abandon_raw`) before the exception propagates, so no buffer stays in use.

use std::time::Duration;

use pyo3::prelude::*;

use crate::thread::detached;

/// Longest wait with the GIL released: how late Ctrl-C may be noticed.
pub const SLICE: Duration = Duration::from_millis(50);

/// Calls `step(arg, SLICE)` with the GIL released until it returns `Some`, running the
/// signal handlers between calls; an exception they raise (`KeyboardInterrupt`) is
/// returned as `Err` and nothing more is waited for.
///
/// # Safety
///
/// `arg`, `step` and its results hold no Python object or token (see
/// [`detached`](crate::thread::detached)).
#[inline]
pub unsafe fn sliced<A: Copy, R>(
    py: Python<'_>,
    arg: A,
    mut step: impl FnMut(A, Duration) -> Option<R>,
) -> PyResult<R> {
    loop {
        // SAFETY: the caller's promise about `arg`, `step` and `R`.
        if let Some(r) = unsafe { detached(py, (arg, &mut step), |(a, s)| s(a, SLICE)) } {
            return Ok(r);
        }
        py.check_signals()?;
    }
}

/// Runs `f` on a thread of its own and waits for it in slices, running the signal
/// handlers between them, for blocking calls of quiver that have no bounded form (the
/// job's bootstrap and barrier): on `KeyboardInterrupt` the call goes on in the
/// background, its result unused.
pub fn on_helper_thread<R: Send + 'static>(
    py: Python<'_>,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> PyResult<R> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(format!("quiver {what}"))
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| {
            pyo3::exceptions::PyOSError::new_err(format!("cannot start a thread for {what}: {e}"))
        })?;
    loop {
        // SAFETY: the receiver is this thread's; nothing of Python's is carried.
        match unsafe { detached(py, &rx, |rx| rx.recv_timeout(SLICE)) } {
            Ok(r) => return Ok(r),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "{what} panicked"
                )))
            }
        }
    }
}
