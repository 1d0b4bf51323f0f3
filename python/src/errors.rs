//! quiver's errors as Python exceptions: the classes of `quiver/_errors.py` (one
//! hierarchy under `quiver.Error`, documented there), chosen by the variant of
//! [`quiver::Error`], with the message quiver wrote and the attributes a program may act
//! on (`rank` of a failed or closed peer; `count`, `capacity`, `source`, `tag` of a
//! truncated message).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use quiver::Error;

/// `quiver._errors`, imported once.
static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// An instance of `quiver._errors.<class>` with `msg`, and attributes.
fn raise(py: Python<'_>, class: &str, msg: String, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    let made = || -> PyResult<PyErr> {
        let module = MODULE.get_or_try_init(py, || {
            PyModule::import(py, "quiver._errors").map(Bound::unbind)
        })?;
        let value = module.bind(py).getattr(class)?.call1((msg.clone(),))?;
        for (name, v) in attrs {
            value.setattr(*name, v)?;
        }
        Ok(PyErr::from_value(value))
    };
    // The classes come with the package; should they be missing, the message still
    // reaches the program.
    made().unwrap_or_else(|e| e)
}

/// The Python exception for `e`.
pub fn to_py(e: Error) -> PyErr {
    Python::attach(|py| {
        let msg = e.to_string();
        let int = |v: u64| v.into_pyobject(py).map(|o| o.into_any().unbind());
        let class = match &e {
            Error::MissingEnv { .. } | Error::InvalidEnv { .. } | Error::Config(_) => "ConfigError",
            Error::Rendezvous { .. } | Error::Launcher { .. } => "RendezvousError",
            Error::NoSuchRank { .. } => "RankError",
            Error::MessageTooLarge { .. } => "MessageTooLargeError",
            Error::NoTarget => "NoTargetError",
            Error::DpidInUse { .. } => "DpidInUseError",
            Error::NoSuchEndpoint { .. } | Error::PeerNotFound { .. } => "PeerNotFoundError",
            Error::PeerClosed { rank, .. } => {
                return raise(
                    py,
                    "PeerClosedError",
                    msg,
                    &[("rank", int(*rank as u64).unwrap())],
                )
            }
            Error::PeerFailed { rank, .. } => {
                return raise(
                    py,
                    "PeerFailedError",
                    msg,
                    &[("rank", int(*rank as u64).unwrap())],
                )
            }
            Error::Lost { .. } | Error::ChannelFailed { .. } => "ChannelError",
            Error::TooManySenders { .. }
            | Error::Segment { .. }
            | Error::SegmentSquatted { .. } => "SharedMemoryError",
            Error::Protocol { .. } => "ProtocolError",
            Error::Truncated {
                len,
                capacity,
                rank,
                tag,
            } => {
                let attrs = [
                    ("count", int(*len).unwrap()),
                    ("capacity", int(*capacity as u64).unwrap()),
                    ("source", int(*rank as u64).unwrap()),
                    ("tag", int(*tag as u64).unwrap()),
                ];
                return raise(py, "TruncatedError", msg, &attrs);
            }
            Error::Cancelled => "CancelledError",
            Error::Closed => "ClosedError",
            Error::Timeout(_) => "TimeoutError",
            Error::Io { .. } => "IoError",
            Error::Port(_) => "PortError",
            Error::Rma(_) => "RmaError",
            _ => "Error",
        };
        raise(py, class, msg, &[])
    })
}

/// `quiver.ThreadError`: `what` used from a thread other than its own.
pub fn thread_error(what: &str) -> PyErr {
    Python::attach(|py| {
        raise(
            py,
            "ThreadError",
            format!(
                "this {what} belongs to the thread (of the process) that opened it; open one \
                 endpoint per thread, and in a child made by fork() endpoints of its own \
                 (each with its own DPID)"
            ),
            &[],
        )
    })
}

/// `quiver.ClosedError` for an endpoint closed by `close()`.
pub fn closed(what: &str) -> PyErr {
    Python::attach(|py| raise(py, "ClosedError", format!("the {what} is closed"), &[]))
}

/// `quiver.ClosedError` for a request whose endpoint was closed before it completed.
pub fn closed_pending() -> PyErr {
    Python::attach(|py| {
        raise(
            py,
            "ClosedError",
            "the endpoint was closed before the operation completed".into(),
            &[],
        )
    })
}

/// A `ValueError` about an argument.
pub fn bad_arg(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// Extension of quiver's results: `.py()?` raises the Python exception.
pub trait IntoPy<T> {
    /// The value, or the Python exception for the error.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for quiver::Result<T> {
    #[inline]
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
