//! A received message: a view into the token buffer pool that owns its token.

use super::{Endpoint, Source};
use crate::engine::route::Token;
use std::fmt;

/// A zero-copy view of a received message in the endpoint's token buffer pool.
///
/// Dereferences to the message bytes. Dropping it releases its token; [`Message::hold`]
/// keeps the token until [`Endpoint::release`].
pub struct Message<'a> {
    pub(crate) ep: &'a Endpoint,
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
    pub(crate) source: Source,
    pub(crate) token: Option<Token>,
}

impl Message<'_> {
    /// The sending endpoint.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Keeps the token in the pool after the view is gone; free it (and others) with
    /// [`Endpoint::release`], oldest first, like DP's `dp_fsync`.
    pub fn hold(mut self) {
        if let Some(t) = self.token.take() {
            self.ep.hold_token(t);
        }
    }
}

impl std::ops::Deref for Message<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // The token is released only in Drop or by `hold` (which consumes the view), and
        // the pool lives as long as the endpoint, which this view borrows.
        // SAFETY: ptr/len describe pool memory of this message's unreleased token.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Message<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(t) = self.token.take() {
            self.ep.release_token(t);
        }
    }
}

impl fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("source", &self.source)
            .field("len", &self.len)
            .finish()
    }
}
