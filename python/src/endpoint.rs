//! `quiver.Endpoint`: a Directed Point endpoint (target, write, read, descriptor,
//! counters, close). A read copies the message into a new `bytes` (and releases its
//! token at once); a write sends from any contiguous buffer without a copy on the
//! Python side.

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use quiver::{Endpoint, EndpointStats, Error, Message};

use crate::buffer::Buffer;
use crate::errors::{self, IntoPy};
use crate::thread::{detached, ThreadBound};
use crate::wait::{sliced, SLICE};

/// The sender of a message an endpoint read: ``rank`` and ``dpid``.
#[pyclass(module = "quiver", name = "Source", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash, Clone, Copy)]
pub struct PySource {
    /// Rank of the sending process.
    #[pyo3(get)]
    rank: u32,
    /// DPID of the sending endpoint.
    #[pyo3(get)]
    dpid: u16,
}

#[pymethods]
impl PySource {
    #[new]
    fn new(rank: u32, dpid: u16) -> PySource {
        PySource { rank, dpid }
    }

    fn __repr__(&self) -> String {
        format!("Source(rank={}, dpid={})", self.rank, self.dpid)
    }
}

/// A Directed Point endpoint (``job.open(dpid)``), used by the thread that opened it.
#[pyclass(module = "quiver", name = "Endpoint", frozen, weakref)]
pub struct PyEndpoint {
    ep: ThreadBound<RefCell<Option<Endpoint>>>,
    dpid: u16,
    rank: u32,
    /// The job's `QUIVER_CONNECT_TIMEOUT`: how long `flush` waits in all.
    connect_timeout: Duration,
}

const WHAT: &str = "endpoint";

impl PyEndpoint {
    pub fn open(py: Python<'_>, job: &quiver::Job, dpid: u16) -> PyResult<Py<PyEndpoint>> {
        let ep = py.detach(|| job.open(dpid)).py()?;
        let obj = Py::new(
            py,
            PyEndpoint {
                ep: ThreadBound::new(RefCell::new(Some(ep))),
                dpid,
                rank: job.rank(),
                connect_timeout: job.config().connect_timeout,
            },
        )?;
        crate::register(py, obj.bind(py).as_any())?;
        Ok(obj)
    }

    /// Runs `f` on the open endpoint (on its thread).
    fn with<R>(&self, f: impl FnOnce(&Endpoint) -> PyResult<R>) -> PyResult<R> {
        let cell = self.ep.get(WHAT)?;
        let guard = cell.try_borrow().map_err(|_| busy())?;
        let ep = guard.as_ref().ok_or_else(|| errors::closed(WHAT))?;
        f(ep)
    }
}

/// A call made while another call of the same endpoint is under way on its thread (from
/// a signal handler that runs between two slices of a wait).
fn busy() -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err(
        "the endpoint is being closed by another call under way on this thread",
    )
}

/// A message as Python sees it: its bytes and its source.
fn to_py(py: Python<'_>, msg: Message<'_>) -> (Py<PyBytes>, PySource) {
    let s = msg.source();
    let bytes = PyBytes::new(py, &msg).unbind();
    (
        bytes,
        PySource {
            rank: s.rank,
            dpid: s.dpid,
        },
    )
}

#[pymethods]
impl PyEndpoint {
    /// This endpoint's DPID.
    #[getter]
    fn dpid(&self) -> u16 {
        self.dpid
    }

    /// This endpoint's rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    /// Whether ``close`` was called.
    #[getter]
    fn closed(&self) -> PyResult<bool> {
        Ok(self
            .ep
            .get(WHAT)?
            .try_borrow()
            .map_err(|_| busy())?
            .is_none())
    }

    /// Sends later writes to endpoint ``dpid`` of node ``nid`` (waiting up to
    /// ``QUIVER_CONNECT_TIMEOUT`` for it to be opened).
    fn target(&self, py: Python<'_>, nid: u32, dpid: u16) -> PyResult<()> {
        self.with(|ep| {
            // SAFETY: the endpoint is this thread's; nothing of Python's is carried.
            unsafe { detached(py, ep, |ep| ep.target(nid, dpid)) }.py()
        })
    }

    /// Sends later writes to the endpoint with this DPID on ``rank`` (waiting up to
    /// ``QUIVER_CONNECT_TIMEOUT`` for it to be opened).
    fn target_rank(&self, py: Python<'_>, rank: u32) -> PyResult<()> {
        self.with(|ep| {
            // SAFETY: as in `target`.
            unsafe { detached(py, ep, |ep| ep.target_rank(rank)) }.py()
        })
    }

    /// Sends one message, the bytes of ``buf`` (any contiguous object with the buffer
    /// protocol), to the target. Returns when ``buf`` may be reused; waits
    /// (interruptible) while the receiver has no room.
    fn write(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        let b = Buffer::get(buf, false, "Endpoint.write")?;
        self.with(|ep| {
            let data = slice(&b);
            if ep.try_write_parts(&[], data).py()? {
                return Ok(());
            }
            // SAFETY: the endpoint and the bytes (of `b`, which outlives the wait) are
            // this thread's; nothing of Python's is carried.
            let r = unsafe {
                sliced(py, (ep, data), |(ep, data), slice| {
                    let until = Instant::now() + slice;
                    loop {
                        match ep.try_write_parts(&[], data) {
                            Ok(true) => return Some(Ok(())),
                            Err(e) => return Some(Err(e)),
                            Ok(false) if Instant::now() >= until => return None,
                            Ok(false) => std::thread::yield_now(),
                        }
                    }
                })
            };
            r?.py()
        })
    }

    /// The next message as ``(data, source)``: ``data`` a ``bytes``, ``source`` a
    /// ``Source``. Waits (interruptible) for one; with ``timeout`` (seconds),
    /// ``quiver.TimeoutError`` after that long.
    #[pyo3(signature = (timeout=None))]
    fn read(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<(Py<PyBytes>, PySource)> {
        let until = match timeout {
            None => None,
            // Further than an Instant reaches: no deadline.
            Some(s) => Instant::now().checked_add(seconds(s)?),
        };
        self.with(|ep| {
            if let Some(m) = ep.try_read().py()? {
                return Ok(to_py(py, m));
            }
            // SAFETY: the endpoint and the message it lends are this thread's; nothing
            // of Python's is carried.
            let got = unsafe {
                sliced(py, ep, |ep, slice| {
                    let limit = match until {
                        None => slice,
                        Some(t) => match t.checked_duration_since(Instant::now()) {
                            Some(left) => left.min(slice),
                            None => return Some(Err(Error::Timeout(seconds_of(timeout)))),
                        },
                    };
                    match ep.read_timeout(limit) {
                        Err(Error::Timeout(_)) if until.is_none_or(|t| Instant::now() < t) => None,
                        Err(Error::Timeout(_)) => Some(Err(Error::Timeout(seconds_of(timeout)))),
                        other => Some(other),
                    }
                })
            };
            Ok(to_py(py, got?.py()?))
        })
    }

    /// The next message as ``(data, source)`` if one is waiting, else ``None``; never
    /// blocks.
    fn try_read(&self, py: Python<'_>) -> PyResult<Option<(Py<PyBytes>, PySource)>> {
        self.with(|ep| Ok(ep.try_read().py()?.map(|m| to_py(py, m))))
    }

    /// One round of protocol work (acknowledgements, retransmissions) without reading.
    fn progress(&self) -> PyResult<()> {
        self.with(|ep| ep.progress().py())
    }

    /// Waits (interruptible) until everything sent over the network is acknowledged, up
    /// to ``QUIVER_CONNECT_TIMEOUT`` (``quiver.TimeoutError`` then).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let until = Instant::now().checked_add(self.connect_timeout);
        self.with(|ep| {
            // SAFETY: the step carries this thread's endpoint and numbers, nothing of
            // Python's; it returns a quiver result.
            let r = unsafe {
                sliced(py, ep, |ep, slice| {
                    let left = until.map_or(slice, |u| {
                        u.saturating_duration_since(Instant::now()).min(slice)
                    });
                    match ep.flush_within(left) {
                        Err(quiver::Error::Timeout(_))
                            if until.is_none_or(|u| Instant::now() < u) =>
                        {
                            None
                        }
                        other => Some(other),
                    }
                })
            }?;
            r.py()
        })
    }

    /// The endpoint's descriptor: readable when messages have arrived (for ``select``,
    /// ``selectors``, ``asyncio``); then call ``try_read`` until it returns ``None``.
    fn fileno(&self) -> PyResult<i32> {
        self.with(|ep| Ok(ep.as_raw_fd()))
    }

    /// The same as ``fileno()``.
    #[getter]
    fn fd(&self) -> PyResult<i32> {
        self.fileno()
    }

    /// The endpoint's counters, as a ``dict`` of ``int``.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(|ep| Ok(ep.stats()))?;
        endpoint_stats(py, s)
    }

    /// Closes the endpoint (its receive area goes; later writes to it fail). Closing
    /// twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.ep.forked_away() {
            // The parent's endpoint, in a child made by fork(): left to the parent.
            return Ok(());
        }
        let cell = self.ep.get(WHAT)?;
        let ep = cell.try_borrow_mut().map_err(|_| busy())?.take();
        if let Some(ep) = ep {
            // SAFETY: the endpoint is this thread's; nothing of Python's is carried.
            unsafe { detached(py, ep, drop) };
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _ty: Option<&Bound<'_, PyAny>>,
        _value: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("Endpoint(rank={}, dpid={})", self.rank, self.dpid)
    }
}

/// The bytes of an exported buffer.
fn slice(b: &Buffer) -> &[u8] {
    if b.len() == 0 {
        return &[];
    }
    // SAFETY: the export keeps `len` bytes at `ptr` alive and in place for as long as
    // `b` lives, which the slice's lifetime is tied to.
    unsafe { std::slice::from_raw_parts(b.ptr(), b.len()) }
}

/// A time limit in seconds as a `Duration` (`ValueError` unless finite and >= 0).
pub fn seconds(s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        errors::bad_arg(format!(
            "timeout must be a finite number of seconds >= 0, not {s}"
        ))
    })
}

fn seconds_of(timeout: Option<f64>) -> Duration {
    timeout
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(SLICE)
}

/// Every counter of `s`, by name (the pattern lists them all: a new counter does not
/// compile until it is added here).
pub fn endpoint_stats(py: Python<'_>, s: EndpointStats) -> PyResult<Bound<'_, PyDict>> {
    let EndpointStats {
        msgs_sent,
        bytes_sent,
        msgs_received,
        bytes_received,
        frames_sent,
        frames_received,
        ring_drops,
        ring_evacuations,
        send_stalls,
        dropped_malformed,
        dropped_foreign_job,
        dropped_bad_token,
        dropped_misaddressed,
        dropped_spoofed,
        dropped_unauthenticated,
        dropped_oversized,
        duplicates,
        lost_frames,
        corrupt_rings,
        retransmissions,
        timeouts,
        fast_retransmits,
        checksum_failures,
        out_of_order,
        credit_stalls,
        acks_sent,
        faults_lost,
        faults_duplicated,
        faults_reordered,
        faults_corrupted,
        tail_probes,
    } = s;
    let d = PyDict::new(py);
    for (k, v) in [
        ("msgs_sent", msgs_sent),
        ("bytes_sent", bytes_sent),
        ("msgs_received", msgs_received),
        ("bytes_received", bytes_received),
        ("frames_sent", frames_sent),
        ("frames_received", frames_received),
        ("ring_drops", ring_drops),
        ("ring_evacuations", ring_evacuations),
        ("send_stalls", send_stalls),
        ("dropped_malformed", dropped_malformed),
        ("dropped_foreign_job", dropped_foreign_job),
        ("dropped_bad_token", dropped_bad_token),
        ("dropped_misaddressed", dropped_misaddressed),
        ("dropped_spoofed", dropped_spoofed),
        ("dropped_unauthenticated", dropped_unauthenticated),
        ("dropped_oversized", dropped_oversized),
        ("duplicates", duplicates),
        ("lost_frames", lost_frames),
        ("corrupt_rings", corrupt_rings),
        ("retransmissions", retransmissions),
        ("timeouts", timeouts),
        ("fast_retransmits", fast_retransmits),
        ("checksum_failures", checksum_failures),
        ("out_of_order", out_of_order),
        ("credit_stalls", credit_stalls),
        ("acks_sent", acks_sent),
        ("faults_lost", faults_lost),
        ("faults_duplicated", faults_duplicated),
        ("faults_reordered", faults_reordered),
        ("faults_corrupted", faults_corrupted),
        ("tail_probes", tail_probes),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}
