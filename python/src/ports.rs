//! `quiver.Ports`: GAMMA's active-message ports (`quiver::ports`) for Python.
//!
//! A port is bound with keywords (`to=(rank, port)`, `to_all=port`, `buffer=size`,
//! `handler=callable`, `on_error=callable`); a send names only the port and the data.
//! The receive buffer is the library's (a size, as in the C library): a message is
//! copied into it on arrival, and `read(port)` copies the last one out.
//!
//! **Handlers.** A Python handler is called with a [`PyDelivery`] that holds a copy of
//! the message (its port, its origin and its bytes) and records what the handler asks
//! for (`signal()`, `send(port, data)`); quiver carries those out when the handler
//! returns, in order. Nothing the handler keeps refers to quiver's memory, so keeping a
//! `Delivery` is harmless (its requests after the handler returned raise). The handler
//! runs where progress runs: inside this thread's next ports call, or, with the offload
//! engine (`QUIVER_RELIABILITY=offload`), on the engine's thread for messages from other
//! nodes, taking the GIL there. Every ports call therefore runs with the GIL released
//! (an engine thread waiting for the GIL while this thread waits for the port table
//! would deadlock). An exception a handler raises is kept and raised by this thread's
//! next ports call, before it does anything (the first one; later ones until then are
//! dropped, and counted in the stats as `handler_errors`). A handler answers through its
//! `Delivery`: a call of its own ports from inside it is refused (`RuntimeError`, kept
//! like any exception of the handler).

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use quiver::ports::{Delivery, Origin, PortError, Ports};

use crate::buffer::Buffer;
use crate::errors::{self, IntoPy};
use crate::thread::{detached, ThreadBound};
use crate::wait::sliced;

const WHAT: &str = "ports";

/// A message read from a port: its bytes and its origin `(rank, port)`.
type Received = (Py<PyBytes>, (u32, u8));

/// What handlers left for the application: the first exception not raised yet, and how
/// many were raised in all.
#[derive(Default)]
struct HandlerErrors {
    first: Option<PyErr>,
    count: u64,
}

type Shared = Arc<Mutex<HandlerErrors>>;

/// Keeps an exception a handler raised (module documentation).
fn keep(errors: &Shared, e: PyErr) {
    let mut g = errors.lock().unwrap_or_else(|p| p.into_inner());
    g.count += 1;
    if g.first.is_none() {
        g.first = Some(e);
    }
}

/// What a Python handler asked of its delivery, carried out when it returns.
enum Request {
    Signal,
    Send(u8, Vec<u8>),
}

/// A message delivered to a port, as its handler sees it (module documentation):
/// ``port``, ``origin`` (``(rank, port)``), ``data`` (a copy), ``signal()`` and
/// ``send(port, data)``.
#[pyclass(module = "quiver", name = "Delivery")]
pub struct PyDelivery {
    /// The port it was delivered to.
    #[pyo3(get)]
    port: u8,
    /// ``(rank, port)`` of the sender (the root, for a broadcast).
    #[pyo3(get)]
    origin: (u32, u8),
    data: Py<PyBytes>,
    requests: Vec<Request>,
    /// The handler returned: no more requests.
    done: bool,
}

#[pymethods]
impl PyDelivery {
    /// The message (a copy).
    #[getter]
    fn data(&self, py: Python<'_>) -> Py<PyBytes> {
        self.data.clone_ref(py)
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.data.bind(py).as_bytes().len()
    }

    /// Signals the port's semaphore (a ``wait`` on it counts one more).
    fn signal(&mut self) -> PyResult<()> {
        self.check()?;
        self.requests.push(Request::Signal);
        Ok(())
    }

    /// Sends ``data`` (any object with the buffer protocol) through ``port`` of this
    /// process, to that port's destination, once the handler returns (it never waits).
    fn send(&mut self, port: u8, data: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check()?;
        let buf = Buffer::get(data, false, "Delivery.send")?;
        // SAFETY: the export keeps the object's memory in place while `buf` lives.
        let bytes = unsafe { std::slice::from_raw_parts(buf.ptr(), buf.len()) }.to_vec();
        self.requests.push(Request::Send(port, bytes));
        Ok(())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Delivery(port={}, origin={:?}, {} bytes)",
            self.port,
            self.origin,
            self.data.bind(py).as_bytes().len()
        )
    }
}

impl PyDelivery {
    fn check(&self) -> PyResult<()> {
        if self.done {
            return Err(errors::bad_arg(
                "this delivery's handler has returned: signal and send only inside it".into(),
            ));
        }
        Ok(())
    }
}

/// The quiver handler around a Python callable.
fn handler_of(f: Py<PyAny>, errors: Shared) -> impl FnMut(&mut Delivery<'_>) + Send + 'static {
    move |d: &mut Delivery<'_>| {
        let requests = Python::attach(|py| -> PyResult<Vec<Request>> {
            let o = d.origin();
            let delivery = Bound::new(
                py,
                PyDelivery {
                    port: d.port(),
                    origin: (o.rank, o.port),
                    data: PyBytes::new(py, d.data()).unbind(),
                    requests: Vec::new(),
                    done: false,
                },
            )?;
            let called = f.call1(py, (&delivery,));
            let mut del = delivery.borrow_mut();
            del.done = true;
            let requests = std::mem::take(&mut del.requests);
            called.map(|_| requests)
        });
        match requests {
            Ok(requests) => {
                for r in requests {
                    match r {
                        Request::Signal => d.signal(),
                        Request::Send(port, data) => {
                            if let Err(e) = d.send(port, &data) {
                                keep(&errors, errors::to_py(quiver::Error::Port(e)));
                            }
                        }
                    }
                }
            }
            Err(e) => keep(&errors, e),
        }
    }
}

/// The quiver error handler around a Python callable: called with the `quiver.PortError`
/// the error would raise.
fn error_handler_of(f: Py<PyAny>, errors: Shared) -> impl FnMut(PortError) + Send + 'static {
    move |e: PortError| {
        let called = Python::attach(|py| {
            let exc = errors::to_py(quiver::Error::Port(e));
            f.call1(py, (exc.value(py),)).map(|_| ())
        });
        if let Err(e) = called {
            keep(&errors, e);
        }
    }
}

/// One process's ports on DPID ``dpid`` (``quiver.Ports(job, dpid)`` or
/// ``job.ports(dpid)``), used by the thread that opened them.
#[pyclass(module = "quiver", name = "Ports", frozen, weakref)]
pub struct PyPorts {
    ports: ThreadBound<std::cell::RefCell<Option<Ports>>>,
    job: quiver::Job,
    errors: Shared,
    dpid: u16,
}

impl PyPorts {
    pub fn open(py: Python<'_>, job: &quiver::Job, dpid: u16) -> PyResult<Py<PyPorts>> {
        // SAFETY: the job is `Sync` and the ports made are kept on this thread; nothing
        // of Python's is carried.
        let ports = unsafe { detached(py, job, |job| Ports::open(job, dpid)) }.py()?;
        let obj = Py::new(
            py,
            PyPorts {
                ports: ThreadBound::new(std::cell::RefCell::new(Some(ports))),
                job: job.clone(),
                errors: Shared::default(),
                dpid,
            },
        )?;
        crate::register(py, obj.bind(py).as_any())?;
        Ok(obj)
    }

    /// Runs `f` with the open ports, on their thread, with the GIL released, after
    /// raising what a handler raised since the last call, if anything (before the call,
    /// so that a call that did its work is not reported as failed). A call from inside a
    /// handler of these ports (on their thread) is refused: the port table is in use.
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&Ports) -> quiver::Result<R>) -> PyResult<R> {
        self.raise_kept()?;
        let cell = self.ports.get(WHAT)?;
        // Exclusive: a handler running inside this call that calls these ports again
        // finds the borrow taken (rather than the table's lock or RefCell, held).
        let guard = cell.try_borrow_mut().map_err(|_| busy())?;
        let ports = guard.as_ref().ok_or_else(|| errors::closed(WHAT))?;
        // SAFETY: the ports are this thread's; `f` and its result carry nothing of
        // Python's (handlers take the GIL themselves).
        unsafe { detached(py, (ports, f), |(p, f)| f(p)) }.py()
    }

    /// Raises the first exception a handler raised, if one is waiting.
    fn raise_kept(&self) -> PyResult<()> {
        let kept = self
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first
            .take();
        kept.map_or(Ok(()), Err)
    }
}

/// A call made while another call of the same ports is under way on its thread.
fn busy() -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err(
        "the ports are in use by a call under way on this thread (a call from one of their \
         handlers, or from a signal handler during a wait)",
    )
}

/// A port number of a call: 0 to 254 (255 is the library's).
fn port_arg(port: i64) -> PyResult<u8> {
    u8::try_from(port)
        .ok()
        .filter(|&p| p < quiver::ports::RESERVED_PORT)
        .ok_or_else(|| {
            errors::bad_arg(format!(
                "a port is 0 .. {} ({} is the library's), not {port}",
                quiver::ports::RESERVED_PORT - 1,
                quiver::ports::RESERVED_PORT
            ))
        })
}

#[pymethods]
impl PyPorts {
    #[new]
    fn new(py: Python<'_>, job: &crate::job::PyJob, dpid: u16) -> PyResult<Py<PyPorts>> {
        PyPorts::open(py, &job.job, dpid)
    }

    /// The DPID the ports are on.
    #[getter]
    fn dpid(&self) -> u16 {
        self.dpid
    }

    /// Binds ``port``: to a destination (``to=(rank, port)``, or ``to_all=port`` for port
    /// ``port`` of every other rank: a broadcast), a receive buffer of ``buffer`` bytes
    /// (the library's), a receiver ``handler`` (called with a ``Delivery``) and an error
    /// ``handler`` (``on_error``, called with the ``PortError``). What is not named
    /// stays as it was; bind before peers send to the port.
    #[pyo3(signature = (port, *, to=None, to_all=None, buffer=None, handler=None, on_error=None))]
    #[allow(clippy::too_many_arguments)] // Python's keywords
    fn bind(
        &self,
        py: Python<'_>,
        port: i64,
        to: Option<(u32, i64)>,
        to_all: Option<i64>,
        buffer: Option<usize>,
        handler: Option<Py<PyAny>>,
        on_error: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let port = port_arg(port)?;
        if to.is_some() && to_all.is_some() {
            return Err(errors::bad_arg(
                "bind takes to=(rank, port) or to_all=port, not both".into(),
            ));
        }
        let dest = match (to, to_all) {
            (Some((rank, p)), _) => Some((Some(rank), port_arg(p)?)),
            (None, Some(p)) => Some((None, port_arg(p)?)),
            (None, None) => None,
        };
        for (what, f) in [("handler", &handler), ("on_error", &on_error)] {
            if f.as_ref().is_some_and(|f| !f.bind(py).is_callable()) {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "{what} must be callable"
                )));
            }
        }
        let handler = handler.map(|f| handler_of(f, self.errors.clone()));
        let on_error = on_error.map(|f| error_handler_of(f, self.errors.clone()));
        let buffer = match buffer {
            Some(n) => {
                let mut b = Vec::new();
                b.try_reserve_exact(n).map_err(|_| {
                    pyo3::exceptions::PyMemoryError::new_err(format!("a port buffer of {n} bytes"))
                })?;
                b.resize(n, 0);
                Some(b)
            }
            None => None,
        };
        self.with(py, move |p| {
            let mut b = p.bind(port);
            b = match dest {
                Some((Some(rank), to)) => b.to(rank, to),
                Some((None, to)) => b.to_all(to),
                None => b,
            };
            if let Some(buf) = buffer {
                // In the node's shared memory where it can be (a sender of the node then
                // writes long messages straight into it), else the private one.
                b = match p.buffer(buf.len()) {
                    Ok(shared) => b.buffer(shared),
                    Err(_) => b.buffer(buf),
                };
            }
            if let Some(h) = handler {
                b = b.handler(h);
            }
            if let Some(h) = on_error {
                b = b.on_error(h);
            }
            b.apply()
        })
    }

    /// Unbinds ``port`` (its destination, buffer and handlers).
    fn unbind(&self, py: Python<'_>, port: i64) -> PyResult<()> {
        let port = port_arg(port)?;
        self.with(py, |p| {
            p.unbind(port);
            Ok(())
        })
    }

    /// Sends ``data`` (any object with the buffer protocol) through ``port`` to its
    /// destination, waiting (GIL released) for room; the buffer is reusable on return.
    fn send(&self, py: Python<'_>, port: i64, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let port = port_arg(port)?;
        let buf = Buffer::get(data, false, "Ports.send")?;
        let (ptr, len) = (buf.ptr() as usize, buf.len());
        let r = self.with(py, move |p| {
            // SAFETY: the export keeps the memory in place until `buf` is dropped,
            // after the call.
            let data = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            p.send(port, data)
        });
        drop(buf);
        r
    }

    /// Waits until ``port`` has been signalled ``n`` times and consumes the signals
    /// (polling briefly, then sleeping; Ctrl-C interrupts). With ``timeout`` (seconds):
    /// False when it passed first (nothing consumed).
    #[pyo3(signature = (port, n=1, timeout=None))]
    fn wait(&self, py: Python<'_>, port: i64, n: u64, timeout: Option<f64>) -> PyResult<bool> {
        let port = port_arg(port)?;
        let deadline = match timeout {
            // Beyond what the clock reaches: no deadline.
            Some(t) => std::time::Instant::now().checked_add(crate::endpoint::seconds(t)?),
            None => None,
        };
        self.raise_kept()?;
        let cell = self.ports.get(WHAT)?;
        let guard = cell.try_borrow_mut().map_err(|_| busy())?;
        let ports = guard.as_ref().ok_or_else(|| errors::closed(WHAT))?;
        // SAFETY: the ports are this thread's; nothing of Python's is carried.
        let r = unsafe {
            sliced(py, ports, |p, slice| {
                let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
                let within = left.map_or(slice, |l| l.min(slice));
                match p.wait_within(port, n, within) {
                    Ok(true) => Some(Ok(true)),
                    Ok(false) if left.is_some_and(|l| l <= slice) => Some(Ok(false)),
                    Ok(false) => None,
                    Err(e) => Some(Err(e)),
                }
            })
        };
        r?.py()
    }

    /// Whether ``port`` has been signalled ``n`` times; consumes the signals if so.
    /// Never waits (makes progress once).
    #[pyo3(signature = (port, n=1))]
    fn test(&self, py: Python<'_>, port: i64, n: u64) -> PyResult<bool> {
        let port = port_arg(port)?;
        self.with(py, |p| p.test(port, n))
    }

    /// Signals ``port`` (as a handler would).
    fn signal(&self, py: Python<'_>, port: i64) -> PyResult<()> {
        let port = port_arg(port)?;
        self.with(py, |p| {
            p.signal(port);
            Ok(())
        })
    }

    /// Signals of ``port`` not consumed yet.
    fn signals(&self, py: Python<'_>, port: i64) -> PyResult<u64> {
        let port = port_arg(port)?;
        self.with(py, |p| Ok(p.signals(port)))
    }

    /// The last message delivered into ``port``'s buffer and its origin
    /// (``(data, (rank, port))``), copied out; ``None`` if there is none.
    fn read(&self, py: Python<'_>, port: i64) -> PyResult<Option<Received>> {
        let port = port_arg(port)?;
        let got = self.with(py, |p| {
            // The buffer is at most what was bound: take it whole, then trim.
            let mut out = Vec::new();
            let read = loop {
                match p.read(port, &mut out) {
                    Some((len, o)) if len <= out.len() => break Some((len, o)),
                    Some((len, _)) => out.resize(len, 0),
                    None => break None,
                }
            };
            Ok(read.map(|(len, o): (usize, Origin)| {
                out.truncate(len);
                (out, (o.rank, o.port))
            }))
        })?;
        Ok(got.map(|(data, origin)| (PyBytes::new(py, &data).unbind(), origin)))
    }

    /// Makes progress once: sends what handlers queued, delivers what arrived (running
    /// the handlers).
    fn progress(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |p| p.progress())
    }

    /// Waits (making progress, so that broadcasts are forwarded and handlers answered)
    /// until every rank has called it as often.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let job = self.job.clone();
        self.with(py, move |p| {
            job.barrier_progressing(&[p as &dyn quiver::Progress])
        })
    }

    /// The ports' counters, as a dict (``sent``, ``delivered``, ``forwarded``,
    /// ``native_broadcasts``, ``ring_broadcasts``, ``errors``, ..., and ``handler_errors``: exceptions that
    /// Python handlers raised).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.with(py, |p| Ok(p.stats()))?;
        let quiver::ports::PortStats {
            sent,
            bytes_sent,
            send_waits,
            delivered,
            bytes_delivered,
            forwarded,
            native_broadcasts,
            ring_broadcasts,
            deposits,
            deposited,
            parked,
            landed,
            errors: port_errors,
            malformed,
        } = s;
        let handler_errors = self.errors.lock().unwrap_or_else(|p| p.into_inner()).count;
        let d = PyDict::new(py);
        for (k, v) in [
            ("sent", sent),
            ("bytes_sent", bytes_sent),
            ("send_waits", send_waits),
            ("delivered", delivered),
            ("bytes_delivered", bytes_delivered),
            ("forwarded", forwarded),
            ("native_broadcasts", native_broadcasts),
            ("ring_broadcasts", ring_broadcasts),
            ("deposits", deposits),
            ("deposited", deposited),
            ("parked", parked),
            ("landed", landed),
            ("errors", port_errors),
            ("malformed", malformed),
            ("handler_errors", handler_errors),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Closes the ports (what is queued is sent first, for up to the linger time).
    /// Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let cell = self.ports.get(WHAT)?;
        let ports = cell.try_borrow_mut().map_err(|_| busy())?.take();
        if let Some(p) = ports {
            // SAFETY: the ports are this thread's; nothing of Python's is carried.
            unsafe { detached(py, p, drop) };
        }
        Ok(())
    }

    fn __enter__(slf: Py<PyPorts>) -> Py<PyPorts> {
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
        format!(
            "Ports(rank={}, dpid={}{})",
            self.job.rank(),
            self.dpid,
            match self
                .ports
                .try_get()
                .map(|c| c.try_borrow().map(|g| g.is_none()))
            {
                Some(Ok(true)) => ", closed",
                _ => "",
            }
        )
    }
}

impl Drop for PyPorts {
    fn drop(&mut self) {
        // Closed on its thread with the GIL released (handlers may need it meanwhile);
        // elsewhere `ThreadBound` leaks it.
        if let Some(cell) = self.ports.try_get() {
            if let Some(p) = cell.borrow_mut().take() {
                Python::attach(|py| {
                    // SAFETY: the ports are this thread's (`try_get` gave them);
                    // nothing of Python's is carried.
                    unsafe { detached(py, p, drop) }
                });
            }
        }
    }
}
