//! The C library of quiver (`libquiver.so`, `libquiver.a`): every call of the Rust API
//! that C can express, as `quiver_object_verb` functions on opaque handles, with the
//! header `include/quiver.h` generated from this crate by cbindgen (`tests/header.rs`
//! fails when the checked-in header is stale, and `QUIVER_BLESS=1` rewrites it).
//!
//! The modules: [`error`] the codes, the last error's message and the gate every entry
//! point goes through (no panic crosses it); `job` jobs; `endpoint` Directed Point
//! endpoints (messages are views into the token buffer pool, held until released);
//! `tagged` tagged endpoints and their requests; `ports` GAMMA's ports and the
//! deliveries their handlers are handed; `rma` one-sided operations on windows.
//!
//! What every entry point guarantees: it returns a `quiver_error` (or, for the few that
//! return a value, a documented value) and never unwinds; a NULL handle or output
//! pointer is `QUIVER_ERR_NULL`, never a crash; a failure sets the calling thread's
//! `quiver_last_error_message`. What it cannot check is written in its `Safety`
//! section: a non-NULL handle must come from this library and not be closed, a buffer
//! must be as long as the length given, and the thread-safety rule stated on each call.

mod endpoint;
mod error;
mod job;
mod ports;
mod rma;
mod tagged;

/// The major version of the header (breaking changes of the ABI before 1.0 bump the
/// minor version).
pub const QUIVER_VERSION_MAJOR: u32 = 0;
/// The minor version of the header.
pub const QUIVER_VERSION_MINOR: u32 = 1;
/// The patch version of the header.
pub const QUIVER_VERSION_PATCH: u32 = 0;
/// The header's version as one number: MAJOR * 10000 + MINOR * 100 + PATCH. Compare it
/// with `quiver_version()`, the library's, to find a program run against another
/// library than the one it was compiled for.
pub const QUIVER_VERSION: u32 =
    QUIVER_VERSION_MAJOR * 10000 + QUIVER_VERSION_MINOR * 100 + QUIVER_VERSION_PATCH;

/// The library's version, MAJOR * 10000 + MINOR * 100 + PATCH (`QUIVER_VERSION` is the
/// header's).
///
/// Thread safety: any thread, at any time.
#[no_mangle]
pub extern "C" fn quiver_version() -> u32 {
    // A constant: the one entry point without `catch_unwind`, having nothing to catch.
    QUIVER_VERSION
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_macros_are_the_crate_version() {
        let v = |s: &str| s.parse::<u32>().expect("a number");
        assert_eq!(
            super::QUIVER_VERSION_MAJOR,
            v(env!("CARGO_PKG_VERSION_MAJOR"))
        );
        assert_eq!(
            super::QUIVER_VERSION_MINOR,
            v(env!("CARGO_PKG_VERSION_MINOR"))
        );
        assert_eq!(
            super::QUIVER_VERSION_PATCH,
            v(env!("CARGO_PKG_VERSION_PATCH"))
        );
        assert_eq!(super::quiver_version(), 100);
    }
}
