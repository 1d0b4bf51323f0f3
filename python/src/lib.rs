//! `quiver._quiver`, the extension module of the `quiver` Python package (which
//! re-exports it; `quiver/_quiver.pyi` has the signatures): quiver's jobs, Directed
//! Point endpoints, tagged endpoints with mpi4py's names, GAMMA's ports and one-sided
//! operations on windows.
//!
//! The modules: `job` (`quiver.Job`), `endpoint` (`quiver.Endpoint`), `tagged`
//! (`quiver.Tagged`, `quiver.Status`), `request` (`quiver.Request`), `ports`
//! (`quiver.Ports`, `quiver.Delivery`), `rma` (`quiver.Rma`, `quiver.Window`); beneath
//! them
//! `buffer` (the buffer protocol), `thread` (endpoints stay on the thread that opened
//! them; the GIL released on that thread), `wait` (waiting in slices, Ctrl-C) and
//! `errors` (the `quiver.Error` hierarchy). `docs/DESIGN-NOTES.md` ("Python bindings")
//! has the reasoning.

mod buffer;
mod endpoint;
mod errors;
mod job;
mod ports;
mod request;
mod rma;
mod tagged;
mod thread;
mod wait;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// The endpoints opened so far (a `weakref.WeakSet`), closed by `_close_all` when the
/// interpreter exits (the package registers it with `atexit`): a tagged endpoint's
/// close sends the answers its peers may still wait for.
static OPEN: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn open_set(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    let set = OPEN.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("weakref")?.getattr("WeakSet")?.call0()?.unbind())
    })?;
    Ok(set.bind(py))
}

/// Records an endpoint for `_close_all`.
fn register(py: Python<'_>, endpoint: &Bound<'_, PyAny>) -> PyResult<()> {
    open_set(py)?.call_method1("add", (endpoint,))?;
    Ok(())
}

/// Closes every endpoint still open that belongs to this thread of this process (at
/// exit). The set's order is arbitrary; each close stands on its own. Endpoints of other
/// threads (and, in a child made by `fork()`, the parent's) raise `ThreadError` and are
/// left as they are: their peers learn of their end from their liveness watch.
#[pyfunction]
fn _close_all(py: Python<'_>) -> PyResult<()> {
    let all =
        pyo3::types::PyList::new(py, open_set(py)?.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
    for ep in all.iter() {
        let _ = ep.call_method0("close");
    }
    Ok(())
}

#[pymodule]
fn _quiver(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<job::PyJob>()?;
    m.add_class::<endpoint::PyEndpoint>()?;
    m.add_class::<endpoint::PySource>()?;
    m.add_class::<tagged::PyTagged>()?;
    m.add_class::<tagged::PyStatus>()?;
    m.add_class::<request::PyRequest>()?;
    m.add_class::<ports::PyPorts>()?;
    m.add_class::<ports::PyDelivery>()?;
    m.add_class::<rma::PyRma>()?;
    m.add_class::<rma::PyWindow>()?;
    m.add("ANY_SOURCE", tagged::ANY_SOURCE)?;
    m.add("ANY_TAG", tagged::ANY_TAG)?;
    m.add("UNDEFINED", request::UNDEFINED)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(_close_all, m)?)?;
    Ok(())
}
