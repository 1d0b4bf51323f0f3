//! `quiver.Rma` and `quiver.Window`: one-sided operations on windows (`quiver::rma`) for
//! Python.
//!
//! Every rank opens `Rma` on the same DPID (`job.rma(dpid)`) and allocates its windows in
//! the same order (`allocate(n)`: this rank's part, `n` bytes, from the node's shared
//! pool). Data moves from and into any object with the buffer protocol, where it lies:
//! `put(rank, window, offset, data)`, `Get(rank, window, offset, buf)` (into a writable
//! buffer, as mpi4py's upper-case calls) or `get(rank, window, offset, n)` (new
//! `bytes`); strided and indexed layouts; remote atomics on 64-bit words returning the
//! old value; `flush`, `barrier`, `combine`. A window's own part is read and written
//! with `Window.read`, `Window.write` and `Window.word`. Every call runs with the GIL
//! released, on the thread that opened the endpoint (`ThreadError` elsewhere). Memory
//! of the program cannot become a window from Python (Rust's `Rma::register` takes a
//! `Vec`).

use std::cell::RefCell;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use quiver::rma::{Combine, Rma, Strided, Window};

use crate::buffer::{new_bytes, Buffer};
use crate::errors::{self, IntoPy};
use crate::thread::{detached, ThreadBound};

const WHAT: &str = "rma";

/// A window of the job, this rank's part of it (``rma.allocate(n)``); freed
/// collectively by ``rma.free(window)``.
#[pyclass(module = "quiver", name = "Window", frozen)]
pub struct PyWindow {
    window: ThreadBound<RefCell<Option<Window>>>,
}

impl PyWindow {
    /// Runs `f` with the window, on its thread.
    fn with<R>(&self, f: impl FnOnce(&Window) -> PyResult<R>) -> PyResult<R> {
        let cell = self.window.get("window")?;
        let guard = cell.borrow();
        let w = guard.as_ref().ok_or_else(|| errors::closed("window"))?;
        f(w)
    }
}

#[pymethods]
impl PyWindow {
    /// The window's number in the job (the same on every rank).
    #[getter]
    fn number(&self) -> PyResult<u32> {
        self.with(|w| Ok(w.number()))
    }

    /// Bytes of this rank's part.
    fn __len__(&self) -> PyResult<usize> {
        self.with(|w| Ok(w.len()))
    }

    /// ``n`` bytes at ``offset`` of this rank's part, copied out.
    fn read<'py>(&self, py: Python<'py>, offset: usize, n: usize) -> PyResult<Bound<'py, PyBytes>> {
        self.with(|w| {
            // Checked before anything is allocated: a length beyond the window raises.
            if offset.checked_add(n).is_none_or(|end| end > w.len()) {
                return Err(errors::to_py(quiver::Error::Rma(
                    quiver::rma::RmaError::OutOfBounds {
                        rank: u32::MAX,
                        window: w.number(),
                        offset: offset as u64,
                        len: n as u64,
                        size: w.len() as u64,
                    },
                )));
            }
            let mut out = vec![0u8; n];
            w.read(offset, &mut out).py()?;
            Ok(PyBytes::new(py, &out))
        })
    }

    /// Writes ``data`` (any object with the buffer protocol) at ``offset`` of this rank's
    /// part.
    fn write(&self, offset: usize, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let buf = Buffer::get(data, false, "Window.write")?;
        // SAFETY: the export keeps the memory in place while `buf` lives.
        let bytes = unsafe { std::slice::from_raw_parts(buf.ptr(), buf.len()) };
        self.with(|w| w.write(offset, bytes).py())
    }

    /// The 64-bit word at ``offset`` (8-byte aligned) of this rank's part, read
    /// atomically.
    fn word(&self, offset: usize) -> PyResult<u64> {
        self.with(|w| {
            Ok(w.word(offset)
                .py()?
                .load(std::sync::atomic::Ordering::Acquire))
        })
    }

    fn __repr__(&self) -> String {
        match self.with(|w| Ok((w.number(), w.len()))) {
            Ok((n, len)) => format!("Window(number={n}, len={len})"),
            Err(_) => "Window(freed)".into(),
        }
    }
}

/// A strided layout given as ``(offset, stride, elem, count)``.
fn strided((offset, stride, elem, count): (u64, u64, u64, u64)) -> Strided {
    Strided {
        offset,
        stride,
        elem,
        count,
    }
}

/// One process's one-sided endpoint on DPID ``dpid`` (``quiver.Rma(job, dpid)`` or
/// ``job.rma(dpid)``), used by the thread that opened it.
#[pyclass(module = "quiver", name = "Rma", frozen, weakref)]
pub struct PyRma {
    rma: ThreadBound<RefCell<Option<Rma>>>,
    dpid: u16,
}

impl PyRma {
    pub fn open(py: Python<'_>, job: &quiver::Job, dpid: u16) -> PyResult<Py<PyRma>> {
        // SAFETY: the job is `Sync` and the endpoint made is kept on this thread; nothing
        // of Python's is carried.
        let rma = unsafe { detached(py, job, |job| Rma::open(job, dpid)) }.py()?;
        let obj = Py::new(
            py,
            PyRma {
                rma: ThreadBound::new(RefCell::new(Some(rma))),
                dpid,
            },
        )?;
        crate::register(py, obj.bind(py).as_any())?;
        Ok(obj)
    }

    /// Runs `f` with the endpoint, on its thread, with the GIL released.
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&Rma) -> quiver::Result<R>) -> PyResult<R> {
        let cell = self.rma.get(WHAT)?;
        let guard = cell.try_borrow().map_err(|_| errors::closed(WHAT))?;
        let rma = guard.as_ref().ok_or_else(|| errors::closed(WHAT))?;
        // SAFETY: the endpoint is this thread's; `f` and its result carry nothing of
        // Python's.
        unsafe { detached(py, (rma, f), |(r, f)| f(r)) }.py()
    }

    /// Runs `f` with the endpoint and `window`'s window, on their thread, with the GIL
    /// released.
    fn with_window<R>(
        &self,
        py: Python<'_>,
        window: &PyWindow,
        f: impl FnOnce(&Rma, &Window) -> quiver::Result<R>,
    ) -> PyResult<R> {
        let wguard = window.window.get("window")?.borrow();
        let w = wguard.as_ref().ok_or_else(|| errors::closed("window"))?;
        self.with(py, |r| f(r, w))
    }

    /// [`PyRma::with_window`] with the bytes of `data` (any object with the buffer
    /// protocol), exported for the call.
    fn with_bytes<R>(
        &self,
        py: Python<'_>,
        window: &PyWindow,
        (data, what): (&Bound<'_, PyAny>, &str),
        f: impl FnOnce(&Rma, &Window, &[u8]) -> quiver::Result<R>,
    ) -> PyResult<R> {
        let buf = Buffer::get(data, false, what)?;
        let (ptr, len) = (buf.ptr() as usize, buf.len());
        let r = self.with_window(py, window, move |r, w| {
            // (Another Python thread writing it meanwhile is the program's race on the
            // bytes, never a read outside them.)
            // SAFETY: the export keeps the memory in place until `buf` is dropped,
            // after the call.
            let data = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            f(r, w, data)
        });
        drop(buf);
        r
    }

    /// [`PyRma::with_window`] with the bytes of `buf` (any writable object with the
    /// buffer protocol) to write into, exported for the call.
    fn with_buffer<R>(
        &self,
        py: Python<'_>,
        window: &PyWindow,
        (buf, what): (&Bound<'_, PyAny>, &str),
        f: impl FnOnce(&Rma, &Window, &mut [u8]) -> quiver::Result<R>,
    ) -> PyResult<R> {
        let b = Buffer::get(buf, true, what)?;
        let (ptr, len) = (b.ptr() as usize, b.len());
        let r = self.with_window(py, window, move |r, w| {
            // (Another Python thread writing it meanwhile, the GIL released, is the
            // program's race on the bytes, as with mpi4py, never a write outside them.)
            // SAFETY: the export keeps the memory in place and writable until `b` is
            // dropped, after the call (resizing an exported object is refused).
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            f(r, w, dst)
        });
        drop(b);
        r
    }
}

#[pymethods]
impl PyRma {
    #[new]
    fn new(py: Python<'_>, job: &crate::job::PyJob, dpid: u16) -> PyResult<Py<PyRma>> {
        PyRma::open(py, &job.job, dpid)
    }

    /// The DPID the endpoint is on.
    #[getter]
    fn dpid(&self) -> u16 {
        self.dpid
    }

    /// Allocates the job's next window, this rank's part ``n`` bytes (zeroed). Every
    /// rank allocates its windows in the same order.
    fn allocate(&self, py: Python<'_>, n: usize) -> PyResult<PyWindow> {
        let w = self.with(py, |r| r.allocate(n))?;
        Ok(PyWindow {
            window: ThreadBound::new(RefCell::new(Some(w))),
        })
    }

    /// Frees ``window`` on every rank (collective: puts in flight are flushed and the
    /// ranks meet first). The window is unusable after, also when this raises.
    fn free(&self, py: Python<'_>, window: &PyWindow) -> PyResult<()> {
        let taken = window
            .window
            .get("window")?
            .borrow_mut()
            .take()
            .ok_or_else(|| errors::closed("window"))?;
        self.with(py, move |r| r.free(taken).map(|_| ()))
    }

    /// Puts ``data`` (any object with the buffer protocol) at ``offset`` of ``window`` at
    /// ``rank``; ``data`` is reusable on return, the bytes are in the window after
    /// ``flush(rank)``.
    fn put(
        &self,
        py: Python<'_>,
        rank: u32,
        window: &PyWindow,
        offset: u64,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.with_bytes(py, window, (data, "Rma.put"), |r, w, data| {
            r.put(rank, w, offset, data)
        })
    }

    /// Puts ``data`` at ``offset`` of ``window`` at ``rank``, then adds 1 to the word at
    /// ``counter`` of the same window once the bytes are in place (its target waits with
    /// ``wait_counter``).
    fn put_notify(
        &self,
        py: Python<'_>,
        rank: u32,
        window: &PyWindow,
        offset: u64,
        data: &Bound<'_, PyAny>,
        counter: u64,
    ) -> PyResult<()> {
        self.with_bytes(py, window, (data, "Rma.put_notify"), |r, w, data| {
            r.put_notify(rank, w, offset, data, counter)
        })
    }

    /// Waits until the word at ``counter`` of this rank's part of ``window`` holds at
    /// least ``n``, and takes ``n`` from it.
    #[pyo3(signature = (window, counter, n=1))]
    fn wait_counter(
        &self,
        py: Python<'_>,
        window: &PyWindow,
        counter: u64,
        n: u64,
    ) -> PyResult<()> {
        self.with_window(py, window, |r, w| r.wait_counter(w, counter, n))
    }

    /// Copies ``len(buf)`` bytes at ``offset`` of ``window`` at ``rank`` into ``buf``
    /// (any writable object with the buffer protocol).
    #[pyo3(name = "Get")]
    fn get_into(
        &self,
        py: Python<'_>,
        rank: u32,
        window: &PyWindow,
        offset: u64,
        buf: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.with_buffer(py, window, (buf, "Rma.Get"), |r, w, dst| {
            r.get(rank, w, offset, dst)
        })
    }

    /// ``n`` bytes at ``offset`` of ``window`` at ``rank``, as new ``bytes``.
    fn get<'py>(
        &self,
        py: Python<'py>,
        rank: u32,
        window: &PyWindow,
        offset: u64,
        n: usize,
    ) -> PyResult<Py<PyBytes>> {
        let (bytes, ptr) = new_bytes(py, n)?;
        let ptr = ptr as usize;
        self.with_window(py, window, move |r, w| {
            // SAFETY: a new bytes object of `n` bytes that nobody else sees yet.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, n) };
            r.get(rank, w, offset, dst)
        })?;
        Ok(bytes)
    }

    /// Copies the elements of ``data`` (element ``i`` at ``i * src_stride``) to the
    /// strided layout ``dst`` = ``(offset, stride, elem, count)`` of ``window`` at
    /// ``rank``.
    fn put_strided(
        &self,
        py: Python<'_>,
        rank: u32,
        window: &PyWindow,
        dst: (u64, u64, u64, u64),
        data: &Bound<'_, PyAny>,
        src_stride: u64,
    ) -> PyResult<()> {
        self.with_bytes(py, window, (data, "Rma.put_strided"), |r, w, data| {
            r.put_strided(rank, w, strided(dst), data, src_stride)
        })
    }

    /// Copies the strided layout ``src`` = ``(offset, stride, elem, count)`` of
    /// ``window`` at ``rank`` into ``buf`` (element ``i`` at ``i * dst_stride``).
    fn get_strided(
        &self,
        py: Python<'_>,
        rank: u32,
        window: &PyWindow,
        src: (u64, u64, u64, u64),
        buf: &Bound<'_, PyAny>,
        dst_stride: u64,
    ) -> PyResult<()> {
        self.with_buffer(py, window, (buf, "Rma.get_strided"), |r, w, dst| {
            r.get_strided(rank, w, strided(src), dst, dst_stride)
        })
    }

    /// Copies elements of ``elem`` bytes from ``data`` (element ``i`` at
    /// ``src_offsets[i]``) to ``window`` at ``rank`` (element ``i`` at
    /// ``dst_offsets[i]``).
    #[allow(clippy::too_many_arguments)] // the Rust call's, plus Python's
    fn put_indexed(
        &self,
        py: Python<'_>,
        rank: u32,
        window: &PyWindow,
        dst_offsets: Vec<u64>,
        data: &Bound<'_, PyAny>,
        src_offsets: Vec<u64>,
        elem: u64,
    ) -> PyResult<()> {
        self.with_bytes(py, window, (data, "Rma.put_indexed"), |r, w, data| {
            r.put_indexed(rank, w, &dst_offsets, data, &src_offsets, elem)
        })
    }

    /// Copies elements of ``elem`` bytes of ``window`` at ``rank`` (element ``i`` at
    /// ``src_offsets[i]``) into ``buf`` (element ``i`` at ``dst_offsets[i]``).
    #[allow(clippy::too_many_arguments)] // the Rust call's, plus Python's
    fn get_indexed(
        &self,
        py: Python<'_>,
        rank: u32,
        window: &PyWindow,
        src_offsets: Vec<u64>,
        buf: &Bound<'_, PyAny>,
        dst_offsets: Vec<u64>,
        elem: u64,
    ) -> PyResult<()> {
        self.with_buffer(py, window, (buf, "Rma.get_indexed"), |r, w, dst| {
            r.get_indexed(rank, w, &src_offsets, dst, &dst_offsets, elem)
        })
    }

    /// Adds ``value`` to the 64-bit word at ``offset`` (8-byte aligned) of ``window`` at
    /// ``rank``, atomically; returns the value before.
    fn fetch_add(
        &self,
        py: Python<'_>,
        rank: u32,
        window: &PyWindow,
        offset: u64,
        value: u64,
    ) -> PyResult<u64> {
        self.with_window(py, window, |r, w| r.fetch_add(rank, w, offset, value))
    }

    /// Writes ``desired`` to the word if it holds ``expected``, atomically; returns the
    /// value it held.
    fn compare_swap(
        &self,
        py: Python<'_>,
        rank: u32,
        window: &PyWindow,
        offset: u64,
        expected: u64,
        desired: u64,
    ) -> PyResult<u64> {
        self.with_window(py, window, |r, w| {
            r.compare_swap(rank, w, offset, expected, desired)
        })
    }

    /// Writes ``value`` to the word, atomically; returns the value before.
    fn swap(
        &self,
        py: Python<'_>,
        rank: u32,
        window: &PyWindow,
        offset: u64,
        value: u64,
    ) -> PyResult<u64> {
        self.with_window(py, window, |r, w| r.swap(rank, w, offset, value))
    }

    /// Returns once every put to ``rank`` is in its window (a refused put raises here).
    fn flush(&self, py: Python<'_>, rank: u32) -> PyResult<()> {
        self.with(py, |r| r.flush(rank))
    }

    /// ``flush`` of every rank.
    fn flush_all(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |r| r.flush_all())
    }

    /// Waits until every rank called it as often (it does not flush).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |r| r.barrier())
    }

    /// Combines ``value`` (a u64) from every rank with ``op`` (``"sum"``, ``"max"``,
    /// ``"min"``, ``"and"``, ``"or"``) and returns the result on every rank.
    #[pyo3(signature = (value, op="sum"))]
    fn combine(&self, py: Python<'_>, value: u64, op: &str) -> PyResult<u64> {
        let op = match op {
            "sum" => Combine::Sum,
            "max" => Combine::Max,
            "min" => Combine::Min,
            "and" => Combine::And,
            "or" => Combine::Or,
            other => {
                return Err(errors::bad_arg(format!(
                    "op {other:?}: expected \"sum\", \"max\", \"min\", \"and\" or \"or\""
                )))
            }
        };
        self.with(py, |r| r.combine(value, op))
    }

    /// Serves what other ranks asked and takes the answers that came, without waiting.
    fn progress(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |r| r.progress())
    }

    /// The endpoint's counters, as a dict (``puts``, ``gets``, ``atomics``,
    /// ``accumulates``, ``direct``, ``puts_applied``, ``served``, ``busy``, ``refused``,
    /// ``malformed``).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(py, |r| Ok(r.stats()))?;
        let quiver::rma::RmaStats {
            puts,
            gets,
            atomics,
            accumulates,
            direct,
            puts_applied,
            served,
            busy,
            refused,
            malformed,
        } = s;
        let d = PyDict::new(py);
        for (k, v) in [
            ("puts", puts),
            ("gets", gets),
            ("atomics", atomics),
            ("accumulates", accumulates),
            ("direct", direct),
            ("puts_applied", puts_applied),
            ("served", served),
            ("busy", busy),
            ("refused", refused),
            ("malformed", malformed),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Closes the endpoint (small puts still combined leave first). Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let cell = self.rma.get(WHAT)?;
        let rma = cell
            .try_borrow_mut()
            .map_err(|_| errors::closed(WHAT))?
            .take();
        if let Some(r) = rma {
            // SAFETY: the endpoint is this thread's; nothing of Python's is carried.
            unsafe { detached(py, r, drop) };
        }
        Ok(())
    }

    fn __enter__(slf: Py<PyRma>) -> Py<PyRma> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let closed = matches!(
            self.rma
                .try_get()
                .map(|c| c.try_borrow().map(|g| g.is_none())),
            Some(Ok(true))
        );
        format!(
            "Rma(dpid={}{})",
            self.dpid,
            if closed { ", closed" } else { "" }
        )
    }
}

impl Drop for PyRma {
    fn drop(&mut self) {
        // Closed on its thread with the GIL released; elsewhere `ThreadBound` leaks it.
        if let Some(cell) = self.rma.try_get() {
            if let Some(r) = cell.borrow_mut().take() {
                Python::attach(|py| {
                    // SAFETY: the endpoint is this thread's (`try_get` gave it);
                    // nothing of Python's is carried.
                    unsafe { detached(py, r, drop) }
                });
            }
        }
    }
}
