//! `quiver.Request`: a non-blocking operation of a tagged endpoint, with mpi4py's calls
//! (`Wait`/`wait`, `Test`/`test`, `Cancel`/`cancel`, `Waitall`/`waitall`,
//! `Waitany`/`waitany`).
//!
//! A request holds what keeps its memory (the buffer's export, or the `bytes` of a
//! pickled object) until its operation completes. Once a wait or a test has reported
//! it, it is inactive (mpi4py's null request): waiting again returns at once, and
//! `waitany` passes over it. An interrupted wait (Ctrl-C) leaves it pending: wait again,
//! cancel it, or drop it. Dropped while pending, it becomes an orphan of its endpoint
//! (see `tagged`), which completes it in later calls or abandons it when closed.
//!
//! A request for a pickled object (`irecv`) knows no length before its message has
//! arrived: it posts its receive once a probe finds the message, sized to it.

use std::cell::RefCell;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use quiver::tagged::{RawRequest, Src, Status, Tag, Tagged};
use quiver::Error;

use crate::buffer::{new_bytes, Buffer};
use crate::errors::{self, IntoPy};
use crate::tagged::{loads, Orphan, PyStatus, PyTagged};
use crate::thread::{detached, ThreadBound};
use crate::wait::{sliced, SLICE};

/// mpi4py's `UNDEFINED`: the index `waitany` returns when every request is inactive.
pub const UNDEFINED: i64 = -32766;

/// How often a wait for several requests that cannot be waited for together (of several
/// endpoints, or receives of objects not yet found) looks at each.
const ROUND: Duration = Duration::from_millis(1);

/// What keeps a pending operation's memory alive and in place.
pub enum Keep {
    /// An export of the caller's buffer.
    Buffer(#[allow(dead_code)] Buffer),
    /// A `bytes`: a pickled object being sent, or one being received into.
    Bytes(Py<PyBytes>),
}

/// What a request does, for what its wait returns.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Send,
    RecvBuffer,
    RecvObject,
}

enum State {
    /// Started in quiver.
    Pending {
        raw: RawRequest,
        keep: Keep,
        kind: Kind,
    },
    /// A receive of an object whose message has not been found yet.
    Lazy { src: Src, tag: Tag },
    /// A `Lazy` receive cancelled, not reported yet.
    Cancelled,
    /// Reported (mpi4py's null request).
    Null,
}

/// A completed request: its status, and the object received (`None` but for `irecv`).
pub struct Outcome {
    status: PyStatus,
    value: Option<Py<PyAny>>,
}

impl Outcome {
    fn null() -> Outcome {
        Outcome {
            status: PyStatus::empty(),
            value: None,
        }
    }

    fn value(self, py: Python<'_>) -> Py<PyAny> {
        self.value.unwrap_or_else(|| py.None())
    }
}

/// A non-blocking operation (``Isend``, ``Irecv``, ``isend``, ``irecv``).
#[pyclass(module = "quiver", name = "Request", frozen)]
pub struct PyRequest {
    owner: Py<PyTagged>,
    st: ThreadBound<RefCell<State>>,
    kind: Kind,
}

const WHAT: &str = "request";

fn busy() -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err(
        "the request is in use by a call under way on this thread (a wait interrupted by a \
         signal handler that uses it?)",
    )
}

impl PyRequest {
    pub fn pending(
        owner: &Bound<'_, PyTagged>,
        raw: RawRequest,
        keep: Keep,
        kind: Kind,
    ) -> PyResult<Py<PyRequest>> {
        Py::new(
            owner.py(),
            PyRequest {
                owner: owner.clone().unbind(),
                st: ThreadBound::new(RefCell::new(State::Pending { raw, keep, kind })),
                kind,
            },
        )
    }

    pub fn lazy(owner: &Bound<'_, PyTagged>, src: Src, tag: Tag) -> PyResult<Py<PyRequest>> {
        Py::new(
            owner.py(),
            PyRequest {
                owner: owner.clone().unbind(),
                st: ThreadBound::new(RefCell::new(State::Lazy { src, tag })),
                kind: Kind::RecvObject,
            },
        )
    }

    fn is_active(&self) -> PyResult<bool> {
        let st = self.st.get(WHAT)?.try_borrow().map_err(|_| busy())?;
        Ok(!matches!(*st, State::Null))
    }

    /// Moves the request on: its outcome once complete (it is then inactive), `None`
    /// while pending. With `wait`, waits (interruptible) for it.
    fn advance(&self, py: Python<'_>, wait: bool) -> PyResult<Option<Outcome>> {
        let cell = self.st.get(WHAT)?;
        let mut st = cell.try_borrow_mut().map_err(|_| busy())?;
        match &*st {
            State::Null => return Ok(Some(Outcome::null())),
            State::Cancelled => {
                *st = State::Null;
                return Ok(Some(Outcome {
                    status: PyStatus::cancelled(),
                    value: None,
                }));
            }
            _ => {}
        }
        let owner = self.owner.get();
        if closed(owner) {
            // The endpoint abandoned the operation when it closed: the memory is free.
            *st = State::Null;
            return Err(errors::closed_pending());
        }
        owner.with(|_, t| {
            if let State::Lazy { src, tag } = *st {
                let found = if wait {
                    Some(probe(py, t, src, tag)?)
                } else {
                    t.iprobe(src, tag).py()?
                };
                match found {
                    None => return Ok(None),
                    Some(found) => *st = post_object_recv(py, t, found)?,
                }
            }
            let State::Pending { raw, .. } = &*st else {
                unreachable!("a request is pending here")
            };
            let result = if wait {
                match t.wait_raw_within(raw, Duration::ZERO) {
                    Some(r) => r,
                    // SAFETY: the endpoint and the request are this thread's; nothing
                    // of Python's is carried. Interrupted, the request stays pending.
                    None => unsafe {
                        sliced(py, (t, raw), |(t, raw), slice| {
                            t.wait_raw_within(raw, slice)
                        })
                    }?,
                }
            } else {
                if !t.test_raw(raw).py()? {
                    return Ok(None);
                }
                match t.wait_raw_within(raw, Duration::ZERO) {
                    Some(r) => r,
                    None => return Ok(None),
                }
            };
            let State::Pending { keep, kind, .. } = std::mem::replace(&mut *st, State::Null) else {
                unreachable!("a request is pending here")
            };
            outcome(py, result, keep, kind).map(Some)
        })
    }

    /// Completes a request that `wait_any_raw_within` reported.
    fn complete(&self, py: Python<'_>, result: quiver::Result<Status>) -> PyResult<Outcome> {
        let mut st = self.st.get(WHAT)?.try_borrow_mut().map_err(|_| busy())?;
        match std::mem::replace(&mut *st, State::Null) {
            State::Pending { keep, kind, .. } => outcome(py, result, keep, kind),
            _ => unreachable!("only pending requests are waited for"),
        }
    }
}

/// Whether `owner` is closed (requests are used on its thread only, checked before).
fn closed(owner: &PyTagged) -> bool {
    owner
        .inner_here()
        .is_some_and(|i| i.t.try_borrow().is_ok_and(|t| t.is_none()))
}

/// Waits (interruptible) for a message matching (`src`, `tag`).
fn probe(py: Python<'_>, t: &Tagged, src: Src, tag: Tag) -> PyResult<Status> {
    if let Some(s) = t.iprobe(src, tag).py()? {
        return Ok(s);
    }
    // SAFETY: the endpoint is this thread's; nothing of Python's is carried.
    unsafe {
        sliced(py, t, |t, slice| {
            t.probe_within(src, tag, slice).transpose()
        })
    }?
    .py()
}

/// Posts the receive of the object whose message `found` describes, into a new `bytes`
/// of its length.
fn post_object_recv(py: Python<'_>, t: &Tagged, found: Status) -> PyResult<State> {
    let len = usize::try_from(found.len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("message too long"))?;
    let (bytes, ptr) = new_bytes(py, len)?;
    // SAFETY: the state made below holds `bytes` (seen by nobody else until the receive
    // completes) until the receive is complete or abandoned. The probed message is the
    // first from its sender with its tag: the receive takes it.
    let raw = unsafe { t.irecv_raw(ptr, len, Src::Rank(found.peer), Tag::Is(found.tag)) }.py()?;
    Ok(State::Pending {
        raw,
        keep: Keep::Bytes(bytes),
        kind: Kind::RecvObject,
    })
}

/// The outcome of a completed operation; a cancelled receive completes with a status
/// that says so.
fn outcome(
    py: Python<'_>,
    result: quiver::Result<Status>,
    keep: Keep,
    kind: Kind,
) -> PyResult<Outcome> {
    let status = match result {
        Ok(s) => PyStatus::of(s),
        Err(Error::Cancelled) => {
            return Ok(Outcome {
                status: PyStatus::cancelled(),
                value: None,
            })
        }
        Err(e) => return Err(errors::to_py(e)),
    };
    let value = match (kind, &keep) {
        (Kind::RecvObject, Keep::Bytes(b)) => Some(loads(py, b)?),
        _ => None,
    };
    Ok(Outcome { status, value })
}

/// The requests of `reqs` that are pending in quiver on one endpoint, when all active
/// ones are (then one wait covers them all).
fn all_on_one(py: Python<'_>, reqs: &[Bound<'_, PyRequest>]) -> PyResult<Option<Vec<usize>>> {
    let mut owner: Option<*const PyTagged> = None;
    let mut on = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let r = r.get();
        let st = r.st.get(WHAT)?.try_borrow().map_err(|_| busy())?;
        match &*st {
            State::Null => {}
            State::Pending { .. } => {
                let o: *const PyTagged = r.owner.bind(py).get();
                if owner.is_some_and(|x| x != o) {
                    return Ok(None);
                }
                owner = Some(o);
                on.push(i);
            }
            State::Lazy { .. } | State::Cancelled => return Ok(None),
        }
    }
    Ok(Some(on))
}

/// Waits (interruptible) for one of `reqs`: its index and outcome; `None` when every
/// request is inactive.
fn wait_any(py: Python<'_>, reqs: &[Bound<'_, PyRequest>]) -> PyResult<Option<(usize, Outcome)>> {
    loop {
        let mut active = false;
        for (i, r) in reqs.iter().enumerate() {
            let r = r.get();
            if !r.is_active()? {
                continue;
            }
            active = true;
            if let Some(out) = r.advance(py, false)? {
                return Ok(Some((i, out)));
            }
        }
        if !active {
            return Ok(None);
        }
        match all_on_one(py, reqs)? {
            Some(on) if !on.is_empty() => {
                let first = reqs[on[0]].get();
                let owner = first.owner.get();
                if closed(owner) {
                    continue; // the next round reports it
                }
                let cells: Vec<_> = on
                    .iter()
                    .map(|&i| reqs[i].get().st.get(WHAT))
                    .collect::<PyResult<_>>()?;
                let done = owner.with(|_, t| {
                    let states = cells
                        .iter()
                        .map(|c| c.try_borrow().map_err(|_| busy()))
                        .collect::<PyResult<Vec<_>>>()?;
                    let raws: Vec<&RawRequest> = states
                        .iter()
                        .map(|s| match &**s {
                            State::Pending { raw, .. } => raw,
                            _ => unreachable!("all_on_one returned pending requests"),
                        })
                        .collect();
                    // SAFETY: the endpoint and the requests are this thread's; nothing of
                    // Python's is carried.
                    let got = unsafe {
                        detached(py, (t, &raws[..]), |(t, raws)| {
                            t.wait_any_raw_within(raws, SLICE)
                        })
                    };
                    got.py()
                })?;
                if let Some((k, result)) = done {
                    let i = on[k];
                    return Ok(Some((i, reqs[i].get().complete(py, result)?)));
                }
            }
            _ => {
                // Several endpoints, or objects not found yet: look at each in turn.
                // SAFETY: nothing is carried.
                unsafe { detached(py, (), |()| std::thread::sleep(ROUND)) };
            }
        }
        py.check_signals()?;
    }
}

/// The requests of a Python sequence.
fn requests<'py>(reqs: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyRequest>>> {
    reqs.try_iter()?
        .map(|r| Ok(r?.cast_into::<PyRequest>()?))
        .collect()
}

/// Fills `statuses[i]` (a list of `Status`, extended as needed) if given.
fn fill_at(statuses: Option<&Bound<'_, PyList>>, i: usize, s: &PyStatus) -> PyResult<()> {
    let Some(list) = statuses else {
        return Ok(());
    };
    if i < list.len() {
        s.fill(Some(list.get_item(i)?.cast::<PyStatus>()?))
    } else {
        list.append(Py::new(list.py(), s.clone())?)
    }
}

#[pymethods]
impl PyRequest {
    /// Waits (interruptible) for the operation; returns ``True``. Fills ``status``.
    #[pyo3(name = "Wait", signature = (status=None))]
    fn wait_upper(&self, py: Python<'_>, status: Option<&Bound<'_, PyStatus>>) -> PyResult<bool> {
        let out = self
            .advance(py, true)?
            .expect("a wait returns when complete");
        out.status.fill(status)?;
        Ok(true)
    }

    /// Waits (interruptible) for the operation; returns the object an ``irecv``
    /// received, else ``None``. Fills ``status``.
    #[pyo3(signature = (status=None))]
    fn wait(&self, py: Python<'_>, status: Option<&Bound<'_, PyStatus>>) -> PyResult<Py<PyAny>> {
        let out = self
            .advance(py, true)?
            .expect("a wait returns when complete");
        out.status.fill(status)?;
        Ok(out.value(py))
    }

    /// Whether the operation is complete (then the request is inactive). Fills
    /// ``status`` when it is.
    #[pyo3(name = "Test", signature = (status=None))]
    fn test_upper(&self, py: Python<'_>, status: Option<&Bound<'_, PyStatus>>) -> PyResult<bool> {
        Ok(match self.advance(py, false)? {
            Some(out) => {
                out.status.fill(status)?;
                true
            }
            None => false,
        })
    }

    /// ``(done, obj)``: whether the operation is complete, and what ``wait`` would return
    /// (``None`` while it is not).
    #[pyo3(signature = (status=None))]
    fn test(
        &self,
        py: Python<'_>,
        status: Option<&Bound<'_, PyStatus>>,
    ) -> PyResult<(bool, Py<PyAny>)> {
        Ok(match self.advance(py, false)? {
            Some(out) => {
                out.status.fill(status)?;
                (true, out.value(py))
            }
            None => (false, py.None()),
        })
    }

    /// Cancels a receive that no message has matched yet; returns whether it did (its
    /// wait then completes with ``status.cancelled``). Sends cannot be cancelled.
    fn cancel(&self) -> PyResult<bool> {
        let cell = self.st.get(WHAT)?;
        let mut st = cell.try_borrow_mut().map_err(|_| busy())?;
        match &*st {
            State::Lazy { .. } => {
                *st = State::Cancelled;
                Ok(true)
            }
            State::Pending { raw, kind, .. } if *kind != Kind::Send => {
                let owner = self.owner.get();
                if closed(owner) {
                    return Ok(false);
                }
                owner.with(|_, t| Ok(t.cancel_raw(raw)))
            }
            _ => Ok(false),
        }
    }

    /// The same as ``cancel()`` (mpi4py's name).
    #[pyo3(name = "Cancel")]
    fn cancel_upper(&self) -> PyResult<bool> {
        self.cancel()
    }

    /// Whether the request is still to be reported by a wait or a test.
    #[getter]
    fn active(&self) -> PyResult<bool> {
        self.is_active()
    }

    /// Waits (interruptible) for every request; returns their objects (``None`` for all
    /// but ``irecv``), in order. Fills ``statuses`` (a list, extended as needed).
    #[staticmethod]
    #[pyo3(signature = (requests, statuses=None))]
    fn waitall(
        py: Python<'_>,
        requests: &Bound<'_, PyAny>,
        statuses: Option<&Bound<'_, PyList>>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let reqs = self::requests(requests)?;
        let mut out = Vec::with_capacity(reqs.len());
        for (i, r) in reqs.iter().enumerate() {
            let o = r
                .get()
                .advance(py, true)?
                .expect("a wait returns when complete");
            fill_at(statuses, i, &o.status)?;
            out.push(o.value(py));
        }
        Ok(out)
    }

    /// Waits (interruptible) for every request; returns ``True``.
    #[staticmethod]
    #[pyo3(name = "Waitall", signature = (requests, statuses=None))]
    fn waitall_upper(
        py: Python<'_>,
        requests: &Bound<'_, PyAny>,
        statuses: Option<&Bound<'_, PyList>>,
    ) -> PyResult<bool> {
        Self::waitall(py, requests, statuses)?;
        Ok(true)
    }

    /// Waits (interruptible) for one of the requests; returns ``(index, obj)``, or
    /// ``(UNDEFINED, None)`` when none is active. Fills ``status``.
    #[staticmethod]
    #[pyo3(signature = (requests, status=None))]
    fn waitany(
        py: Python<'_>,
        requests: &Bound<'_, PyAny>,
        status: Option<&Bound<'_, PyStatus>>,
    ) -> PyResult<(i64, Py<PyAny>)> {
        let reqs = self::requests(requests)?;
        match wait_any(py, &reqs)? {
            Some((i, out)) => {
                out.status.fill(status)?;
                Ok((i as i64, out.value(py)))
            }
            None => {
                PyStatus::empty().fill(status)?;
                Ok((UNDEFINED, py.None()))
            }
        }
    }

    /// Waits (interruptible) for one of the requests; returns its index, or
    /// ``UNDEFINED`` when none is active.
    #[staticmethod]
    #[pyo3(name = "Waitany", signature = (requests, status=None))]
    fn waitany_upper(
        py: Python<'_>,
        requests: &Bound<'_, PyAny>,
        status: Option<&Bound<'_, PyStatus>>,
    ) -> PyResult<i64> {
        Ok(Self::waitany(py, requests, status)?.0)
    }

    fn __repr__(&self) -> String {
        let state = match self.st.try_get().map(|c| c.try_borrow()) {
            Some(Ok(s)) => match &*s {
                State::Pending { .. } | State::Lazy { .. } => "pending",
                State::Cancelled => "cancelled",
                State::Null => "inactive",
            },
            _ => "?",
        };
        let kind = match self.kind {
            Kind::Send => "send",
            Kind::RecvBuffer | Kind::RecvObject => "receive",
        };
        format!("<quiver.Request: {kind}, {state}>")
    }
}

impl Drop for PyRequest {
    fn drop(&mut self) {
        // On another thread the state leaks with its memory (ThreadBound).
        let Some(cell) = self.st.try_get() else {
            return;
        };
        let Ok(mut st) = cell.try_borrow_mut() else {
            return;
        };
        let State::Pending { raw, keep, .. } = std::mem::replace(&mut *st, State::Null) else {
            return;
        };
        Python::attach(|py| {
            let owner = self.owner.bind(py).get();
            let Some(inner) = owner.inner_here() else {
                std::mem::forget(keep);
                return;
            };
            let Ok(t) = inner.t.try_borrow() else {
                std::mem::forget(keep);
                return;
            };
            let Some(t) = t.as_ref() else {
                // Closed: the endpoint abandoned the operation, the memory is free.
                drop(keep);
                return;
            };
            if t.wait_raw_within(&raw, Duration::ZERO).is_some() {
                drop(keep); // it had completed
                return;
            }
            if let Err(o) = inner.adopt(Orphan { raw, keep }) {
                std::mem::forget(o.keep);
            }
        });
    }
}
