//! Python's buffer protocol: the memory of a numpy array, a `bytearray`, a `memoryview`
//! or `bytes`, used where it lies (no copy on the Python side).
//!
//! A [`Buffer`] is an export of an object's buffer (`PyObject_GetBuffer`): while it
//! lives, the object stays alive and its memory stays where it is (a `bytearray` with
//! an export refuses to resize, a numpy array's data is never moved or freed while
//! referenced). quiver reads or writes that memory with the GIL released; another Python
//! thread that writes it meanwhile races with the transfer, as it would with mpi4py.
//!
//! Also: [`new_bytes`], a `bytes` object whose contents are received in place.

use std::ffi::c_char;

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// An export of an object's contiguous buffer (module documentation).
pub struct Buffer {
    /// Boxed: exporters may keep the view's address until it is released.
    view: Box<ffi::Py_buffer>,
}

impl Buffer {
    /// Exports `obj`'s buffer, which must be contiguous (C or Fortran order: either way
    /// its bytes are one range) and, if `writable`, writable. `what` names the call in
    /// the errors: `TypeError` for an object without the buffer protocol,
    /// `BufferError` for a buffer that is not contiguous or is read-only.
    #[inline]
    pub fn get(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<Buffer> {
        let mut view = Box::new(ffi::Py_buffer::new());
        let flags = if writable {
            ffi::PyBUF_STRIDES | ffi::PyBUF_WRITABLE
        } else {
            ffi::PyBUF_STRIDES
        };
        // With its format first, to refuse memory that holds Python objects; some
        // exporters refuse to describe their format (numpy's datetime64), then without.
        let mut with_format = true;
        let mut rc = export(obj, &mut view, flags | ffi::PyBUF_FORMAT);
        if rc != 0 {
            drop(PyErr::fetch(obj.py()));
            with_format = false;
            rc = export(obj, &mut view, flags);
        }
        if rc != 0 {
            let err = PyErr::fetch(obj.py());
            if err.is_instance_of::<PyTypeError>(obj.py()) {
                return Err(PyTypeError::new_err(format!(
                    "{what} needs an object with the buffer protocol (bytes, bytearray, \
                     memoryview, numpy array), not {}",
                    type_name(obj)
                )));
            }
            if writable {
                let e = PyBufferError::new_err(format!(
                    "{what} receives into its buffer, and this {} is read-only (use a \
                     bytearray or a writable array)",
                    type_name(obj)
                ));
                e.set_cause(obj.py(), Some(err));
                return Err(e);
            }
            return Err(err);
        }
        let buf = Buffer { view };
        let holds_objects = if with_format && !buf.view.format.is_null() {
            // SAFETY: a successful export with PyBUF_FORMAT sets `format` to a
            // NUL-terminated struct-module format string that lives as long as the view.
            let format = unsafe { std::ffi::CStr::from_ptr(buf.view.format) };
            format_holds_objects(&format.to_string_lossy())
        } else {
            obj.getattr("dtype")
                .and_then(|d| d.getattr("hasobject"))
                .and_then(|h| h.extract::<bool>())
                .unwrap_or(false)
        };
        if holds_objects {
            return Err(PyTypeError::new_err(format!(
                "{what} moves bytes, and this {} holds Python objects (numpy dtype object): \
                 their bytes are addresses in this process, meaningless in another (send the \
                 objects with the lowercase send/recv, which pickle them)",
                type_name(obj)
            )));
        }
        // SAFETY: the view was filled by a successful PyObject_GetBuffer.
        let contiguous = unsafe { ffi::PyBuffer_IsContiguous(&*buf.view, b'A' as c_char) } != 0;
        if !contiguous {
            return Err(PyBufferError::new_err(format!(
                "{what} needs a contiguous buffer, and this {} is not (numpy.ascontiguousarray \
                 makes a contiguous copy)",
                type_name(obj)
            )));
        }
        if writable && buf.view.readonly != 0 {
            return Err(PyBufferError::new_err(format!(
                "{what} receives into its buffer, and this {} is read-only (use a bytearray \
                 or a writable array)",
                type_name(obj)
            )));
        }
        Ok(buf)
    }

    /// The first byte.
    #[inline]
    pub fn ptr(&self) -> *mut u8 {
        self.view.buf.cast()
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.view.len as usize
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: the view holds a successful export (a failed one never becomes a
            // Buffer), released once, here, with the GIL held.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// `PyObject_GetBuffer(obj, view, flags)`: 0 when `view` was filled, else -1 with the
/// exception set (and `view` left unset, to be filled again or dropped unreleased).
fn export(
    obj: &Bound<'_, PyAny>,
    view: &mut ffi::Py_buffer,
    flags: std::ffi::c_int,
) -> std::ffi::c_int {
    // SAFETY: `obj` is a live object (the GIL is held, we have a `Bound`); `view` is a
    // Py_buffer that is not a live export (new, or left unset by a failed attempt).
    unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view, flags) }
}

/// Whether a struct-module format string describes Python objects (`O`), outside the
/// field names of a structure (`T{i:count:O:name:}`).
fn format_holds_objects(format: &str) -> bool {
    let mut in_name = false;
    format.chars().any(|c| {
        if c == ':' {
            in_name = !in_name;
            false
        } else {
            !in_name && c == 'O'
        }
    })
}

/// The name of `obj`'s type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

/// A `bytes` object of `len` bytes whose contents are not yet set, and its first byte:
/// the caller writes them all before anyone else sees the object (as C code building a
/// `bytes` does), the GIL released meanwhile if it likes.
pub fn new_bytes(py: Python<'_>, len: usize) -> PyResult<(Py<PyBytes>, *mut u8)> {
    let n = isize::try_from(len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("message too long"))?;
    // SAFETY: a null source asks for an uninitialised object of `n` bytes; the result is
    // checked before use and owned by the `Py` made from it.
    let obj = unsafe { ffi::PyBytes_FromStringAndSize(std::ptr::null(), n) };
    if obj.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `obj` is a new reference to a bytes object (checked non-null above).
    let bytes: Py<PyBytes> = unsafe { Py::from_owned_ptr(py, obj) };
    // SAFETY: `obj` is a bytes object; its storage lives as long as the object.
    let ptr = unsafe { ffi::PyBytes_AsString(obj) }.cast::<u8>();
    Ok((bytes, ptr))
}

#[cfg(test)]
mod tests {
    use super::format_holds_objects;

    #[test]
    fn formats_of_objects_are_told_from_the_others() {
        for f in ["O", "<O", "T{i:a:O:b:}", "2O"] {
            assert!(format_holds_objects(f), "{f}");
        }
        for f in ["B", "<d", "T{i:Oslo:d:b:}", "Zd", "?"] {
            assert!(!format_holds_objects(f), "{f}");
        }
    }
}
