//! What a window's bytes are: memory of the node's shared pool (a [`SharedObject`] the
//! node's ranks map, whole or a part of it: [`Rma::expose`]), or memory the
//! application handed over ([`Rma::register`]: a `Vec<u8>` that stays where it is,
//! reached by same-node ranks through cross-memory attach and by other nodes through
//! the target's engine; or bytes it only lends, [`Rma::register_borrowed`]).
//!
//! Guarantees: the bytes stay at one address for as long as any [`WindowMemory`]
//! reference lives. Allocated windows and registered `Vec`s start 8-byte aligned; a part
//! of shared memory or lent memory may start anywhere, so whoever makes a word atomic
//! checks its address (`access::aligned`). Registered memory goes back to the application only through
//! [`WindowMemory::take_back`], which the collective [`Rma::free`] calls once every
//! rank's operations on the window are done; dropped any other way it is leaked, never
//! freed, because a same-node rank could still write it by cross-memory attach and must
//! never write memory the allocator has handed to someone else.
//!
//! [`Rma::register`]: super::Rma::register
//! [`Rma::register_borrowed`]: super::Rma::register_borrowed
//! [`Rma::expose`]: super::Rma::expose
//! [`Rma::free`]: super::Rma::free

use super::window::SharedObject;
use std::sync::{Arc, Mutex};

/// The bytes of one of this rank's windows.
pub(crate) enum WindowMemory {
    /// `len` bytes at `offset` of an object of the node's shared pool (all of it for
    /// [`Rma::allocate`](super::Rma::allocate)'s windows).
    Shared {
        obj: Arc<SharedObject>,
        offset: usize,
        len: usize,
    },
    /// A `Vec<u8>` the application registered, taken apart (its parts are put back
    /// together only by `take_back`).
    Registered(Registered),
}

/// A registered `Vec<u8>`'s parts; `None` once given back, and for lent bytes
/// ([`WindowMemory::borrowed`]), which are never freed here.
pub(crate) struct Registered {
    ptr: *mut u8,
    len: usize,
    parts: Mutex<Option<(usize, usize)>>,
}

// SAFETY: the Vec's buffer is plain bytes owned by this value alone (the Vec was taken
// apart in `register`); every access through `ptr` is a raw copy or an atomic on
// bounds-checked offsets, which any thread may make, as on a shared object's mapping.
unsafe impl Send for Registered {}
// SAFETY: as above: nothing here hands out references into the buffer but atomics.
unsafe impl Sync for Registered {}

impl WindowMemory {
    /// All of `obj`.
    #[cfg(test)]
    pub(crate) fn shared(obj: SharedObject) -> WindowMemory {
        let len = obj.len();
        WindowMemory::Shared {
            obj: Arc::new(obj),
            offset: 0,
            len,
        }
    }

    /// Takes `v` over (the caller checked its alignment).
    pub(crate) fn register(v: Vec<u8>) -> WindowMemory {
        let mut v = std::mem::ManuallyDrop::new(v);
        let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
        WindowMemory::Registered(Registered {
            ptr,
            len,
            parts: Mutex::new(Some((len, cap))),
        })
    }

    /// `len` bytes at `ptr`, never given back nor freed here (memory the application
    /// lends, [`Rma::register_borrowed`](super::Rma::register_borrowed); the fuzz
    /// target's window in the middle of guard bytes).
    ///
    /// # Safety
    ///
    /// The caller owns the bytes and keeps them alive, unmoved and untouched otherwise
    /// (but by atomics and raw copies) while this value lives.
    pub(crate) unsafe fn borrowed(ptr: *mut u8, len: usize) -> WindowMemory {
        WindowMemory::Registered(Registered {
            ptr,
            len,
            parts: Mutex::new(None),
        })
    }

    /// The first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        match self {
            // `offset + len` lies inside the object (`Rma::expose` checked it).
            WindowMemory::Shared { obj, offset, .. } => obj.ptr().wrapping_add(*offset),
            WindowMemory::Registered(r) => r.ptr,
        }
    }

    /// Bytes of the window.
    pub(crate) fn len(&self) -> usize {
        match self {
            WindowMemory::Shared { len, .. } => *len,
            WindowMemory::Registered(r) => r.len,
        }
    }

    /// Whether the application registered it (rather than allocated it from the pool).
    pub(crate) fn is_registered(&self) -> bool {
        matches!(self, WindowMemory::Registered(_))
    }

    /// The registered `Vec` back, once; `None` for shared memory or when taken already.
    /// The caller guarantees that nobody reads or writes the bytes any more (no rank
    /// reaches the window, this value is dropped right after): the bytes are the
    /// application's again.
    pub(crate) fn take_back(&self) -> Option<Vec<u8>> {
        let WindowMemory::Registered(r) = self else {
            return None;
        };
        let (len, cap) = r.parts.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        // SAFETY: ptr, len and cap are the parts of the Vec taken apart in `register`,
        // put back together only here, once (the Option is taken under the lock).
        Some(unsafe { Vec::from_raw_parts(r.ptr, len, cap) })
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if self.parts.get_mut().is_ok_and(|p| p.is_some()) {
            tracing::warn!(
                "a registered window of {} bytes was dropped without Rma::free: its memory \
                 is leaked (a same-node rank could still write it)",
                self.len
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_memory_stays_put_and_comes_back_once() {
        let v: Vec<u8> = (0..100u8).collect();
        let at = v.as_ptr();
        let m = WindowMemory::register(v);
        assert!(m.is_registered());
        assert_eq!((m.ptr() as *const u8, m.len()), (at, 100));
        let back = m.take_back().expect("the Vec");
        assert_eq!(back, (0..100u8).collect::<Vec<_>>());
        assert!(m.take_back().is_none());
    }
}
