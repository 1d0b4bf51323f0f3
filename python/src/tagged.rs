//! `quiver.Tagged`: tagged send and receive with mpi4py's names. The upper-case calls
//! (`Send`, `Recv`, `Isend`, `Irecv`, `Probe`, `Iprobe`) move the bytes of any
//! contiguous object with the buffer protocol where they lie; the lower-case ones
//! (`send`, `recv`, `isend`, `irecv`) pickle objects.
//!
//! Every operation is started with quiver's scope-free requests (`isend_raw`,
//! `irecv_raw`) on memory that a [`Buffer`] export (or a `bytes` the call holds) keeps
//! alive and in place until the operation is complete or abandoned. A blocking call
//! first looks whether its operation completed at once (a small send is pushed whole),
//! else waits in slices with the GIL released ([`sliced`]); when a signal handler
//! raises (Ctrl-C), the operation is abandoned before the exception propagates, so the
//! buffer is free again. A [`Request`](crate::request::PyRequest) holds its buffer
//! until it completes; one dropped while pending becomes an orphan of its endpoint,
//! which completes it (and then lets its buffer go) during later calls, or abandons it
//! when closed.

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict};
use quiver::tagged::{RawRequest, Src, Status, Tag, Tagged, TaggedStats};

use crate::buffer::{new_bytes, Buffer};
use crate::errors::{self, IntoPy};
use crate::request::{Keep, Kind, PyRequest};
use crate::thread::{detached, ThreadBound};
use crate::wait::sliced;

/// `source` of a receive that accepts any rank (mpi4py's `ANY_SOURCE`).
pub const ANY_SOURCE: i64 = -1;
/// `tag` of a receive that accepts any tag (mpi4py's `ANY_TAG`).
pub const ANY_TAG: i64 = -1;

const WHAT: &str = "tagged endpoint";

/// What a receive or probe found (or what a send did): ``source``, ``tag``, ``count``
/// (bytes), ``cancelled``. Pass one as ``status=`` to have it filled.
#[pyclass(module = "quiver", name = "Status")]
#[derive(Clone, Debug)]
pub struct PyStatus {
    /// The sender (of a receive) or the destination (of a send).
    #[pyo3(get, set)]
    pub source: i64,
    /// The message's tag.
    #[pyo3(get, set)]
    pub tag: i64,
    /// The message's length in bytes.
    #[pyo3(get, set)]
    pub count: u64,
    /// Whether the receive was cancelled (then nothing else is set).
    #[pyo3(get, set)]
    pub cancelled: bool,
}

impl PyStatus {
    pub fn empty() -> PyStatus {
        PyStatus {
            source: ANY_SOURCE,
            tag: ANY_TAG,
            count: 0,
            cancelled: false,
        }
    }

    pub fn of(s: Status) -> PyStatus {
        PyStatus {
            source: s.peer.into(),
            tag: s.tag.into(),
            count: s.len,
            cancelled: false,
        }
    }

    pub fn cancelled() -> PyStatus {
        PyStatus {
            cancelled: true,
            ..PyStatus::empty()
        }
    }

    /// Copies itself into `to`, if given.
    pub fn fill(&self, to: Option<&Bound<'_, PyStatus>>) -> PyResult<()> {
        if let Some(to) = to {
            *to.try_borrow_mut()? = self.clone();
        }
        Ok(())
    }
}

#[pymethods]
impl PyStatus {
    #[new]
    fn new() -> PyStatus {
        PyStatus::empty()
    }

    #[pyo3(name = "Get_source")]
    fn get_source(&self) -> i64 {
        self.source
    }

    #[pyo3(name = "Get_tag")]
    fn get_tag(&self) -> i64 {
        self.tag
    }

    /// The message's length in bytes.
    #[pyo3(name = "Get_count")]
    fn get_count(&self) -> u64 {
        self.count
    }

    #[pyo3(name = "Is_cancelled")]
    fn is_cancelled(&self) -> bool {
        self.cancelled
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.extract::<PyStatus>().is_ok_and(|o| {
            (o.source, o.tag, o.count, o.cancelled)
                == (self.source, self.tag, self.count, self.cancelled)
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "Status(source={}, tag={}, count={}{})",
            self.source,
            self.tag,
            self.count,
            if self.cancelled {
                ", cancelled=True"
            } else {
                ""
            }
        )
    }
}

/// A rank to receive from: `ANY_SOURCE` or `0..`.
pub fn src_arg(source: i64, size: u32) -> PyResult<Src> {
    match source {
        ANY_SOURCE => Ok(Src::Any),
        0..=0xffff_ffff if source < i64::from(size) => Ok(Src::Rank(source as u32)),
        // No message ever comes from a rank the job does not have: mpi4py's ERR_RANK.
        0..=0xffff_ffff => Err(errors::to_py(quiver::Error::NoSuchRank {
            rank: source as u32,
            size,
        })),
        _ => Err(errors::bad_arg(format!(
            "source must be a rank (>= 0) or ANY_SOURCE ({ANY_SOURCE}), not {source}"
        ))),
    }
}

/// A tag to receive: `ANY_TAG` or `0..2**32`.
pub fn tag_arg(tag: i64) -> PyResult<Tag> {
    match tag {
        ANY_TAG => Ok(Tag::Any),
        0..=0xffff_ffff => Ok(Tag::Is(tag as u32)),
        _ => Err(errors::bad_arg(format!(
            "tag must be in 0 .. 2**32-1 or ANY_TAG ({ANY_TAG}), not {tag}"
        ))),
    }
}

/// A destination rank.
fn dest_arg(dest: i64) -> PyResult<u32> {
    u32::try_from(dest)
        .map_err(|_| errors::bad_arg(format!("dest must be a rank (>= 0), not {dest}")))
}

/// A tag to send with.
fn send_tag(tag: i64) -> PyResult<u32> {
    u32::try_from(tag)
        .map_err(|_| errors::bad_arg(format!("tag must be in 0 .. 2**32-1, not {tag}")))
}

/// `pickle.dumps(obj, HIGHEST_PROTOCOL)`.
fn dumps<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    static DUMPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = obj.py();
    let f = DUMPS.import(py, "pickle", "dumps")?;
    Ok(f.call1((obj, -1))?.cast_into::<PyBytes>()?)
}

/// `pickle.loads(data)`.
pub fn loads(py: Python<'_>, data: &Py<PyBytes>) -> PyResult<Py<PyAny>> {
    static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let f = LOADS.import(py, "pickle", "loads")?;
    Ok(f.call1((data,))?.unbind())
}

/// The endpoint and the requests dropped while pending (their buffers kept until they
/// complete). Field order matters: the endpoint (whose drop abandons every pending
/// operation) goes before the orphans' buffers.
pub struct Inner {
    pub t: RefCell<Option<Tagged>>,
    orphans: RefCell<Vec<Orphan>>,
}

/// A request dropped while pending, and what keeps its memory.
pub struct Orphan {
    pub raw: RawRequest,
    pub keep: Keep,
}

impl Inner {
    /// Lets go of the orphans that completed.
    fn reap(&self, t: &Tagged) {
        let list = match self.orphans.try_borrow_mut() {
            Ok(mut list) => std::mem::take(&mut *list),
            Err(_) => return, // a reap under way further up this thread's stack
        };
        let mut left = Vec::new();
        for o in list {
            match t.test_raw(&o.raw) {
                Ok(false) => left.push(o),
                // Complete (or failed: the failure is nobody's to see any more).
                Ok(true) | Err(_) => match t.wait_raw_within(&o.raw, Duration::ZERO) {
                    None => left.push(o),
                    Some(_) => drop(o.keep),
                },
            }
        }
        if let Ok(mut orphans) = self.orphans.try_borrow_mut() {
            orphans.extend(left);
        } else {
            // Only a buffer's release could have re-entered; keep them alive for ever
            // rather than free what quiver may still use.
            std::mem::forget(left);
        }
    }

    /// Adopts a request dropped while pending; gives it back (the caller must then keep
    /// its memory for ever) when the list is in use.
    pub fn adopt(&self, o: Orphan) -> Result<(), Orphan> {
        match self.orphans.try_borrow_mut() {
            Ok(mut list) => {
                list.push(o);
                Ok(())
            }
            Err(_) => Err(o),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(t) = self.t.get_mut().take() {
            close_tagged(t);
        }
    }
}

/// Drops `t` (abandoning what is pending, lingering up to two seconds for the answers
/// peers wait for) with the GIL released.
fn close_tagged(t: Tagged) {
    Python::attach(|py| {
        // SAFETY: the endpoint is this thread's (an `Inner` is dropped on its thread
        // only, see ThreadBound); nothing of Python's is carried.
        unsafe { detached(py, t, drop) }
    });
}

/// A tagged endpoint (``job.tagged(dpid)`` or ``quiver.Tagged(job, dpid)``), used by the
/// thread that opened it.
#[pyclass(module = "quiver", name = "Tagged", frozen, weakref)]
pub struct PyTagged {
    inner: ThreadBound<Inner>,
    rank: u32,
    size: u32,
    dpid: u16,
}

/// A call made while another call of the same endpoint is under way on its thread (a
/// signal handler running between two slices of a wait closes it).
fn busy() -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err(
        "the tagged endpoint is in use by a call under way on this thread (closing it from a \
         signal handler while it waits?)",
    )
}

impl PyTagged {
    pub fn open(py: Python<'_>, job: &quiver::Job, dpid: u16) -> PyResult<Py<PyTagged>> {
        // SAFETY: the job is `Sync` and the endpoint made is kept on this thread;
        // nothing of Python's is carried.
        let t = unsafe { detached(py, job, |job| Tagged::open(job, dpid)) }.py()?;
        let obj = Py::new(
            py,
            PyTagged {
                inner: ThreadBound::new(Inner {
                    t: RefCell::new(Some(t)),
                    orphans: RefCell::new(Vec::new()),
                }),
                rank: job.rank(),
                size: job.size(),
                dpid,
            },
        )?;
        crate::register(py, obj.bind(py).as_any())?;
        Ok(obj)
    }

    /// Runs `f` with the open endpoint, on its thread, after letting go of the orphans
    /// that completed.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&Inner, &Tagged) -> PyResult<R>) -> PyResult<R> {
        let inner = self.inner.get(WHAT)?;
        let guard = inner.t.try_borrow().map_err(|_| busy())?;
        let t = guard.as_ref().ok_or_else(|| errors::closed(WHAT))?;
        if inner.orphans.try_borrow().is_ok_and(|o| !o.is_empty()) {
            inner.reap(t);
        }
        f(inner, t)
    }

    /// Whether the endpoint is open (`None`: not on its thread, or in use).
    pub fn inner_here(&self) -> Option<&Inner> {
        self.inner.try_get()
    }

    /// `send` (`sync`: `ssend`) of `obj` pickled to (`dest`, `tag`).
    fn send_obj_as(
        &self,
        py: Python<'_>,
        obj: &Bound<'_, PyAny>,
        (dest, tag): (i64, i64),
        sync: bool,
    ) -> PyResult<()> {
        let (dest, tag) = (dest_arg(dest)?, send_tag(tag)?);
        let data = dumps(obj)?;
        let bytes = data.as_bytes();
        self.with(|_, t| {
            // SAFETY: `data` (immutable, alive in this frame) outlives `finish`.
            let req =
                unsafe { Self::start_send(py, t, (dest, tag), bytes.as_ptr(), bytes.len(), sync) }?;
            finish(py, t, req).map(drop)
        })
    }

    /// `isend` (`sync`: `issend`) of `obj` pickled to (`dest`, `tag`).
    fn isend_obj_as(
        slf: &Bound<'_, Self>,
        obj: &Bound<'_, PyAny>,
        (dest, tag): (i64, i64),
        sync: bool,
    ) -> PyResult<Py<PyRequest>> {
        let (dest, tag) = (dest_arg(dest)?, send_tag(tag)?);
        let data = dumps(obj)?;
        let bytes = data.as_bytes();
        let raw = slf.get().with(|_, t| {
            // SAFETY: the request made below holds `data` until the send is complete or
            // abandoned.
            unsafe { Self::start_send(slf.py(), t, (dest, tag), bytes.as_ptr(), bytes.len(), sync) }
        })?;
        PyRequest::pending(slf, raw, Keep::Bytes(data.unbind()), Kind::Send)
    }

    /// `Send` (`sync`: `Ssend`) of `buf`'s bytes to (`dest`, `tag`).
    fn send_buf_as(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        (dest, tag): (i64, i64),
        sync: bool,
    ) -> PyResult<()> {
        let (dest, tag) = (dest_arg(dest)?, send_tag(tag)?);
        let b = Buffer::get(buf, false, if sync { "Ssend" } else { "Send" })?;
        self.with(|_, t| {
            // SAFETY: `b` keeps the bytes alive and in place until `finish` has
            // completed or abandoned the send.
            let req = unsafe { Self::start_send(py, t, (dest, tag), b.ptr(), b.len(), sync) }?;
            finish(py, t, req).map(drop)
        })
    }

    /// `Isend` (`sync`: `Issend`) of `buf`'s bytes to (`dest`, `tag`).
    fn isend_buf_as(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        (dest, tag): (i64, i64),
        sync: bool,
    ) -> PyResult<Py<PyRequest>> {
        let (dest, tag) = (dest_arg(dest)?, send_tag(tag)?);
        let b = Buffer::get(buf, false, if sync { "Issend" } else { "Isend" })?;
        let raw = slf.get().with(|_, t| {
            // SAFETY: the request made below holds `b` until the send is complete or
            // abandoned (by the request, its endpoint's orphan list, or the endpoint).
            unsafe { Self::start_send(slf.py(), t, (dest, tag), b.ptr(), b.len(), sync) }
        })?;
        PyRequest::pending(slf, raw, Keep::Buffer(b), Kind::Send)
    }

    /// Starts a send of `len` bytes at `ptr` (`sync`: complete once a receive took it),
    /// with the GIL released: the first send to a rank connects to it, which waits for
    /// the peer's endpoint to open (up to `QUIVER_CONNECT_TIMEOUT`), and a full ring
    /// makes the push wait for room; other Python threads run meanwhile.
    ///
    /// # Safety
    ///
    /// The bytes stay readable, and unwritten, until the request completes or is
    /// abandoned (or the endpoint is dropped).
    unsafe fn start_send(
        py: Python<'_>,
        t: &Tagged,
        (dest, tag): (u32, u32),
        ptr: *const u8,
        len: usize,
        sync: bool,
    ) -> PyResult<RawRequest> {
        // SAFETY: the closure carries an `&Tagged`, numbers and a pointer: nothing of
        // Python's. The pointer's bytes: the caller's promise.
        let started = unsafe {
            detached(py, (t, ptr), |(t, ptr)| {
                if sync {
                    t.issend_raw(dest, tag, ptr, len)
                } else {
                    t.isend_raw(dest, tag, ptr, len)
                }
            })
        };
        started.py()
    }
}

/// Waits for `req` to complete (interruptible): done at once, or in slices with the GIL
/// released. On an exception from a signal handler the operation is abandoned first,
/// so that its memory is free when the exception propagates.
#[inline]
fn finish(py: Python<'_>, t: &Tagged, req: RawRequest) -> PyResult<Status> {
    if let Some(r) = t.wait_raw_within(&req, Duration::ZERO) {
        return r.py();
    }
    // SAFETY: the endpoint and the request are this thread's; nothing of Python's is
    // carried (the step returns quiver's own result).
    let waited = unsafe {
        sliced(py, (t, &req), |(t, req), slice| {
            t.wait_raw_within(req, slice)
        })
    };
    match waited {
        Ok(r) => r.py(),
        Err(interrupt) => {
            t.abandon_raw(req);
            Err(interrupt)
        }
    }
}

/// Waits for a message matching (`src`, `tag`) (interruptible) and returns its status.
fn probe(py: Python<'_>, t: &Tagged, src: Src, tag: Tag) -> PyResult<Status> {
    if let Some(s) = t.iprobe(src, tag).py()? {
        return Ok(s);
    }
    // SAFETY: the endpoint is this thread's; nothing of Python's is carried.
    let found = unsafe {
        sliced(py, t, |t, slice| {
            t.probe_within(src, tag, slice).transpose()
        })
    }?;
    found.py()
}

/// Receives the first message matching (`src`, `tag`) whole, into a new `bytes` of its
/// length (probed first), and returns it with its status.
fn recv_bytes(py: Python<'_>, t: &Tagged, src: Src, tag: Tag) -> PyResult<(Py<PyBytes>, Status)> {
    let found = probe(py, t, src, tag)?;
    let len = usize::try_from(found.len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("message too long"))?;
    let (bytes, ptr) = new_bytes(py, len)?;
    // SAFETY: `bytes` (owned here, seen by nobody else) holds `len` writable bytes at
    // `ptr` until `finish` returns, which completes or abandons the receive. The probed
    // message is the first from its sender with its tag: the receive takes it.
    let req = unsafe { t.irecv_raw(ptr, len, Src::Rank(found.peer), Tag::Is(found.tag)) }.py()?;
    let st = finish(py, t, req)?;
    Ok((bytes, st))
}

#[pymethods]
impl PyTagged {
    /// Opens the tagged endpoint ``dpid`` of ``job`` (every rank opens the same DPID).
    #[new]
    fn new(
        py: Python<'_>,
        job: &Bound<'_, crate::job::PyJob>,
        dpid: u16,
    ) -> PyResult<Py<PyTagged>> {
        PyTagged::open(py, &job.get().job, dpid)
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> u32 {
        self.size
    }

    /// This endpoint's DPID.
    #[getter]
    fn dpid(&self) -> u16 {
        self.dpid
    }

    /// This rank (mpi4py's name).
    #[pyo3(name = "Get_rank")]
    fn get_rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks (mpi4py's name).
    #[pyo3(name = "Get_size")]
    fn get_size(&self) -> u32 {
        self.size
    }

    /// Whether ``close`` was called.
    #[getter]
    fn closed(&self) -> PyResult<bool> {
        let inner = self.inner.get(WHAT)?;
        Ok(inner.t.try_borrow().map_err(|_| busy())?.is_none())
    }

    /// Sends the bytes of ``buf`` (contiguous, buffer protocol) to ``dest`` with ``tag``;
    /// returns when ``buf`` may be reused (a message longer than what is pushed waits
    /// for its receive, as MPI's rendezvous sends do).
    #[pyo3(name = "Send", signature = (buf, dest, tag=0))]
    fn send_buf(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dest: i64,
        tag: i64,
    ) -> PyResult<()> {
        self.send_buf_as(py, buf, (dest, tag), false)
    }

    /// Sends the bytes of ``buf`` to ``dest`` with ``tag`` synchronously (MPI's
    /// ``Ssend``): returns once a receive at ``dest`` has taken the message, never before.
    #[pyo3(name = "Ssend", signature = (buf, dest, tag=0))]
    fn ssend_buf(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        dest: i64,
        tag: i64,
    ) -> PyResult<()> {
        self.send_buf_as(py, buf, (dest, tag), true)
    }

    /// Starts sending the bytes of ``buf`` to ``dest`` synchronously (MPI's ``Issend``):
    /// the request completes once a receive at ``dest`` has taken the message.
    #[pyo3(name = "Issend", signature = (buf, dest, tag=0))]
    fn issend_buf(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        dest: i64,
        tag: i64,
    ) -> PyResult<Py<PyRequest>> {
        Self::isend_buf_as(slf, buf, (dest, tag), true)
    }

    /// Receives the first message matching ``source`` and ``tag`` into ``buf``
    /// (contiguous, writable, buffer protocol); ``quiver.TruncatedError`` if it is longer
    /// (``buf`` then holds its start). Fills ``status`` if given.
    #[pyo3(name = "Recv", signature = (buf, source=ANY_SOURCE, tag=ANY_TAG, status=None))]
    fn recv_buf(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        source: i64,
        tag: i64,
        status: Option<&Bound<'_, PyStatus>>,
    ) -> PyResult<()> {
        let (src, tag) = (src_arg(source, self.size)?, tag_arg(tag)?);
        let b = Buffer::get(buf, true, "Recv")?;
        let st = self.with(|_, t| {
            // SAFETY: `b` keeps the bytes alive, writable and in place until `finish`
            // has completed or abandoned the receive; nothing else uses them meanwhile.
            let req = unsafe { t.irecv_raw(b.ptr(), b.len(), src, tag) }.py()?;
            finish(py, t, req)
        })?;
        if status.is_some() {
            PyStatus::of(st).fill(status)?;
        }
        Ok(())
    }

    /// Starts sending the bytes of ``buf`` to ``dest``; the request holds ``buf`` until it
    /// completes (do not write to ``buf`` meanwhile).
    #[pyo3(name = "Isend", signature = (buf, dest, tag=0))]
    fn isend_buf(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        dest: i64,
        tag: i64,
    ) -> PyResult<Py<PyRequest>> {
        Self::isend_buf_as(slf, buf, (dest, tag), false)
    }

    /// Posts a receive into ``buf`` (writable, contiguous) of the first message matching
    /// ``source`` and ``tag``; the request holds ``buf`` until it completes.
    #[pyo3(name = "Irecv", signature = (buf, source=ANY_SOURCE, tag=ANY_TAG))]
    fn irecv_buf(
        slf: &Bound<'_, Self>,
        buf: &Bound<'_, PyAny>,
        source: i64,
        tag: i64,
    ) -> PyResult<Py<PyRequest>> {
        let (src, tag) = (src_arg(source, slf.get().size)?, tag_arg(tag)?);
        let b = Buffer::get(buf, true, "Irecv")?;
        let raw = slf.get().with(|_, t| {
            // SAFETY: as in `Isend`; nothing else uses the bytes meanwhile.
            unsafe { t.irecv_raw(b.ptr(), b.len(), src, tag) }.py()
        })?;
        PyRequest::pending(slf, raw, Keep::Buffer(b), Kind::RecvBuffer)
    }

    /// Waits for a message matching ``source`` and ``tag`` and returns its ``Status``
    /// without receiving it (also filling ``status`` if given).
    #[pyo3(name = "Probe", signature = (source=ANY_SOURCE, tag=ANY_TAG, status=None))]
    fn probe_buf(
        &self,
        py: Python<'_>,
        source: i64,
        tag: i64,
        status: Option<&Bound<'_, PyStatus>>,
    ) -> PyResult<PyStatus> {
        let (src, tag) = (src_arg(source, self.size)?, tag_arg(tag)?);
        let st = PyStatus::of(self.with(|_, t| probe(py, t, src, tag))?);
        st.fill(status)?;
        Ok(st)
    }

    /// The ``Status`` of the first message matching ``source`` and ``tag`` if one has
    /// arrived, else ``None``; never blocks.
    #[pyo3(name = "Iprobe", signature = (source=ANY_SOURCE, tag=ANY_TAG, status=None))]
    fn iprobe_buf(
        &self,
        source: i64,
        tag: i64,
        status: Option<&Bound<'_, PyStatus>>,
    ) -> PyResult<Option<PyStatus>> {
        let (src, tag) = (src_arg(source, self.size)?, tag_arg(tag)?);
        let st = self.with(|_, t| t.iprobe(src, tag).py())?.map(PyStatus::of);
        if let Some(s) = &st {
            s.fill(status)?;
        }
        Ok(st)
    }

    /// Sends ``obj`` pickled to ``dest`` with ``tag``.
    #[pyo3(signature = (obj, dest, tag=0))]
    fn send(&self, py: Python<'_>, obj: &Bound<'_, PyAny>, dest: i64, tag: i64) -> PyResult<()> {
        self.send_obj_as(py, obj, (dest, tag), false)
    }

    /// Sends ``obj`` pickled to ``dest`` with ``tag`` synchronously: returns once a
    /// receive at ``dest`` has taken it.
    #[pyo3(signature = (obj, dest, tag=0))]
    fn ssend(&self, py: Python<'_>, obj: &Bound<'_, PyAny>, dest: i64, tag: i64) -> PyResult<()> {
        self.send_obj_as(py, obj, (dest, tag), true)
    }

    /// Receives a pickled object: the first message matching ``source`` and ``tag``,
    /// whatever its length. Fills ``status`` if given.
    #[pyo3(signature = (source=ANY_SOURCE, tag=ANY_TAG, status=None))]
    fn recv(
        &self,
        py: Python<'_>,
        source: i64,
        tag: i64,
        status: Option<&Bound<'_, PyStatus>>,
    ) -> PyResult<Py<PyAny>> {
        let (src, tag) = (src_arg(source, self.size)?, tag_arg(tag)?);
        let (bytes, st) = self.with(|_, t| recv_bytes(py, t, src, tag))?;
        PyStatus::of(st).fill(status)?;
        loads(py, &bytes)
    }

    /// Starts sending ``obj`` pickled; ``Request.wait()`` returns ``None``.
    #[pyo3(signature = (obj, dest, tag=0))]
    fn isend(
        slf: &Bound<'_, Self>,
        obj: &Bound<'_, PyAny>,
        dest: i64,
        tag: i64,
    ) -> PyResult<Py<PyRequest>> {
        Self::isend_obj_as(slf, obj, (dest, tag), false)
    }

    /// Starts sending ``obj`` pickled, synchronously: the request completes once a
    /// receive at ``dest`` has taken it.
    #[pyo3(signature = (obj, dest, tag=0))]
    fn issend(
        slf: &Bound<'_, Self>,
        obj: &Bound<'_, PyAny>,
        dest: i64,
        tag: i64,
    ) -> PyResult<Py<PyRequest>> {
        Self::isend_obj_as(slf, obj, (dest, tag), true)
    }

    /// A request for a pickled object matching ``source`` and ``tag``; ``Request.wait()``
    /// returns it. Its receive is posted when its message has arrived (found by a probe,
    /// whatever its length): receives posted meanwhile may take a message first.
    #[pyo3(signature = (source=ANY_SOURCE, tag=ANY_TAG))]
    fn irecv(slf: &Bound<'_, Self>, source: i64, tag: i64) -> PyResult<Py<PyRequest>> {
        let (src, tag) = (src_arg(source, slf.get().size)?, tag_arg(tag)?);
        slf.get().with(|_, _| Ok(()))?;
        PyRequest::lazy(slf, src, tag)
    }

    /// Handles every protocol message that has arrived; never blocks.
    fn progress(&self) -> PyResult<()> {
        self.with(|_, t| t.progress().py())
    }

    /// The descriptor of the endpoint underneath: readable when messages have arrived
    /// (then ``Iprobe``).
    fn fileno(&self) -> PyResult<i32> {
        self.with(|_, t| Ok(t.endpoint().as_raw_fd()))
    }

    /// The tagged endpoint's counters, as a ``dict`` of ``int``.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(|_, t| Ok(t.stats()))?;
        tagged_stats(py, s)
    }

    /// The counters of the Directed Point endpoint underneath, as a ``dict``.
    fn endpoint_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(|_, t| Ok(t.endpoint().stats()))?;
        crate::endpoint::endpoint_stats(py, s)
    }

    /// Closes the endpoint: pending operations are abandoned (their requests then raise
    /// ``quiver.ClosedError``), and it lingers up to two seconds to send the answers its
    /// peers wait for. Closing twice does nothing.
    fn close(&self) -> PyResult<()> {
        if self.inner.forked_away() {
            // The parent's endpoint, in a child made by fork(): not ours to close (a
            // `with` block that ends in the child leaves it to the parent).
            return Ok(());
        }
        let inner = self.inner.get(WHAT)?;
        let t = inner.t.try_borrow_mut().map_err(|_| busy())?.take();
        if let Some(t) = t {
            close_tagged(t);
        }
        // The endpoint abandoned what they wait for: their memory is free.
        if let Ok(mut orphans) = inner.orphans.try_borrow_mut() {
            let gone = std::mem::take(&mut *orphans);
            drop(orphans);
            drop(gone);
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        _ty: Option<&Bound<'_, PyAny>>,
        _value: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close()?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "Tagged(rank={}, size={}, dpid={})",
            self.rank, self.size, self.dpid
        )
    }
}

/// Every counter of `s`, by name (the pattern lists them all: a new counter does not
/// compile until it is added here).
fn tagged_stats(py: Python<'_>, s: TaggedStats) -> PyResult<Bound<'_, PyDict>> {
    let TaggedStats {
        unexpected,
        pushed_buffer_peak,
        pulled_direct,
        pulled_shared,
        pulled_on_thread,
        pulled_by_request,
        pulled_split_by_sender,
        split_helped,
        foreign_pids_refused,
        dropped,
        push_credit_exhausted,
    } = s;
    let d = PyDict::new(py);
    for (k, v) in [
        ("unexpected", unexpected),
        ("pushed_buffer_peak", pushed_buffer_peak),
        ("pulled_direct", pulled_direct),
        ("pulled_shared", pulled_shared),
        ("pulled_on_thread", pulled_on_thread),
        ("pulled_by_request", pulled_by_request),
        ("pulled_split_by_sender", pulled_split_by_sender),
        ("split_helped", split_helped),
        ("foreign_pids_refused", foreign_pids_refused),
        ("dropped", dropped),
        ("push_credit_exhausted", push_credit_exhausted),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}
