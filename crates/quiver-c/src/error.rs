//! Errors at the C boundary: the stable codes (`quiver_error`), their strings, the
//! thread-local message of the last failure, and the one gate every entry point goes
//! through ([`ffi`]), which turns a `quiver::Error`, a bad argument or a Rust panic into
//! a code. Also the checked readings of the C caller's pointers (handles, output places,
//! buffers), so that a NULL gives `QUIVER_ERR_NULL` instead of a crash.
//!
//! Guarantees: no panic unwinds out of an entry point; every failure sets the message
//! that `quiver_last_error_message` returns on the failing thread; a code's value never
//! changes once released (new families get new values).

use quiver_rs::Error;
use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a call of the C library returns: `QUIVER_OK` (0), or the code of what went
/// wrong. The values are stable: they never change meaning, and new ones are added at
/// the end. `quiver_strerror` names a code; `quiver_last_error_message` tells the
/// details of the last failure of the calling thread.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum quiver_error {
    /// Success.
    QUIVER_OK = 0,
    /// A handle or another pointer that the call needs is NULL (this includes a handle
    /// closed through the same variable, which the close set to NULL).
    QUIVER_ERR_NULL = 1,
    /// An argument is out of its range: a wildcard where a value is needed, a length
    /// beyond what a buffer may have, a request this tagged endpoint does not know
    /// (completed already, or another endpoint's), an empty request list.
    QUIVER_ERR_INVALID_ARGUMENT = 2,
    /// quiver panicked inside the call (a bug in quiver: please report it with the
    /// message). The panic was stopped at the boundary; close the handle the call used.
    QUIVER_ERR_PANIC = 3,
    /// A tagged endpoint was used by another thread than the one that opened it.
    QUIVER_ERR_WRONG_THREAD = 4,
    /// A variable the job needs is missing or invalid (not started by a launcher,
    /// a bad `QUIVER_*` value).
    QUIVER_ERR_ENV = 10,
    /// Inconsistent configuration.
    QUIVER_ERR_CONFIG = 11,
    /// The job's rendezvous store could not be reached or answered badly.
    QUIVER_ERR_RENDEZVOUS = 12,
    /// A message larger than the maximum (`QUIVER_MAX_MESSAGE`).
    QUIVER_ERR_MESSAGE_TOO_LARGE = 13,
    /// A write before the endpoint's target was set.
    QUIVER_ERR_NO_TARGET = 14,
    /// A rank outside 0..size.
    QUIVER_ERR_NO_SUCH_RANK = 15,
    /// The endpoint named was not opened in time (`QUIVER_CONNECT_TIMEOUT`).
    QUIVER_ERR_NO_SUCH_ENDPOINT = 16,
    /// The DPID is already open on this rank.
    QUIVER_ERR_DPID_IN_USE = 17,
    /// The peer endpoint was closed.
    QUIVER_ERR_PEER_CLOSED = 18,
    /// A peer failed (its process died, or it stopped answering).
    QUIVER_ERR_PEER_FAILED = 19,
    /// The receiver has no free sender slot (`QUIVER_SHM_SLOTS`).
    QUIVER_ERR_TOO_MANY_SENDERS = 20,
    /// A shared-memory segment is unusable or belongs to someone else.
    QUIVER_ERR_SEGMENT = 21,
    /// Frames from a peer were lost (without retransmission).
    QUIVER_ERR_LOST = 22,
    /// A network channel failed.
    QUIVER_ERR_CHANNEL_FAILED = 23,
    /// A call with a time limit reached it; the same call may succeed later.
    QUIVER_ERR_TIMEOUT = 24,
    /// A tagged message was longer than the receive buffer, which holds its start.
    QUIVER_ERR_TRUNCATED = 25,
    /// A receive was cancelled before a message matched it.
    QUIVER_ERR_CANCELLED = 26,
    /// The tagged protocol failed with a peer in a way it cannot repair.
    QUIVER_ERR_PROTOCOL = 27,
    /// The endpoint is closed.
    QUIVER_ERR_CLOSED = 28,
    /// An operating-system call failed.
    QUIVER_ERR_IO = 29,
    /// An error of a kind this version of the C library has no code for yet.
    QUIVER_ERR_OTHER = 30,
    /// The launcher's key-value service (PMIx, PMI-2, PMI-1), through which the ranks
    /// of a job started by `mpirun`, `mpiexec` or `srun` find each other, failed.
    QUIVER_ERR_LAUNCHER = 31,
    /// A port could not take a message or send one (GAMMA's ports: no buffer bound, a
    /// message longer than the buffer, no destination bound, a failed destination) and
    /// no error handler took the error.
    QUIVER_ERR_PORT = 32,
    /// A one-sided operation on a window failed: no such window at the target, a range
    /// outside it, a misaligned atomic, or puts the target refused.
    QUIVER_ERR_RMA = 33,
}

use quiver_error::*;

impl quiver_error {
    /// Every code, for `quiver_strerror` and the tests.
    pub(crate) const ALL: [quiver_error; 29] = [
        QUIVER_OK,
        QUIVER_ERR_NULL,
        QUIVER_ERR_INVALID_ARGUMENT,
        QUIVER_ERR_PANIC,
        QUIVER_ERR_WRONG_THREAD,
        QUIVER_ERR_ENV,
        QUIVER_ERR_CONFIG,
        QUIVER_ERR_RENDEZVOUS,
        QUIVER_ERR_MESSAGE_TOO_LARGE,
        QUIVER_ERR_NO_TARGET,
        QUIVER_ERR_NO_SUCH_RANK,
        QUIVER_ERR_NO_SUCH_ENDPOINT,
        QUIVER_ERR_DPID_IN_USE,
        QUIVER_ERR_PEER_CLOSED,
        QUIVER_ERR_PEER_FAILED,
        QUIVER_ERR_TOO_MANY_SENDERS,
        QUIVER_ERR_SEGMENT,
        QUIVER_ERR_LOST,
        QUIVER_ERR_CHANNEL_FAILED,
        QUIVER_ERR_TIMEOUT,
        QUIVER_ERR_TRUNCATED,
        QUIVER_ERR_CANCELLED,
        QUIVER_ERR_PROTOCOL,
        QUIVER_ERR_CLOSED,
        QUIVER_ERR_IO,
        QUIVER_ERR_OTHER,
        QUIVER_ERR_LAUNCHER,
        QUIVER_ERR_PORT,
        QUIVER_ERR_RMA,
    ];

    /// The code's description (`quiver_strerror`).
    fn describe(self) -> &'static CStr {
        match self {
            QUIVER_OK => c"success",
            QUIVER_ERR_NULL => c"a required handle or pointer is NULL",
            QUIVER_ERR_INVALID_ARGUMENT => c"invalid argument",
            QUIVER_ERR_PANIC => c"internal error: quiver panicked (a bug; please report it)",
            QUIVER_ERR_WRONG_THREAD => {
                c"a tagged endpoint was used by another thread than the one that opened it"
            }
            QUIVER_ERR_ENV => c"a job variable is missing or invalid",
            QUIVER_ERR_CONFIG => c"invalid configuration",
            QUIVER_ERR_RENDEZVOUS => c"the rendezvous store failed",
            QUIVER_ERR_MESSAGE_TOO_LARGE => c"message too large",
            QUIVER_ERR_NO_TARGET => c"no target: set one before writing",
            QUIVER_ERR_NO_SUCH_RANK => c"no such rank",
            QUIVER_ERR_NO_SUCH_ENDPOINT => c"no such endpoint",
            QUIVER_ERR_DPID_IN_USE => c"DPID already open on this rank",
            QUIVER_ERR_PEER_CLOSED => c"the peer endpoint was closed",
            QUIVER_ERR_PEER_FAILED => c"a peer failed",
            QUIVER_ERR_TOO_MANY_SENDERS => c"the receiver has no free sender slot",
            QUIVER_ERR_SEGMENT => c"unusable shared-memory segment",
            QUIVER_ERR_LOST => c"frames were lost",
            QUIVER_ERR_CHANNEL_FAILED => c"a network channel failed",
            QUIVER_ERR_TIMEOUT => c"timed out",
            QUIVER_ERR_TRUNCATED => c"message truncated to the receive buffer",
            QUIVER_ERR_CANCELLED => c"the receive was cancelled",
            QUIVER_ERR_PROTOCOL => c"tagged-protocol failure",
            QUIVER_ERR_CLOSED => c"the endpoint is closed",
            QUIVER_ERR_IO => c"an operating-system call failed",
            QUIVER_ERR_OTHER => c"an error this version of the C library has no code for",
            QUIVER_ERR_LAUNCHER => c"the launcher's key-value service (PMIx, PMI) failed",
            QUIVER_ERR_RMA => c"a one-sided operation on a window failed",
            QUIVER_ERR_PORT => {
                c"a port could not take or send a message, and no error handler took it"
            }
        }
    }

    /// The code of a `quiver::Error`, by its variant's family.
    pub(crate) fn of(e: &Error) -> quiver_error {
        match e {
            Error::MissingEnv { .. } | Error::InvalidEnv { .. } => QUIVER_ERR_ENV,
            Error::Config(_) => QUIVER_ERR_CONFIG,
            Error::Rendezvous { .. } => QUIVER_ERR_RENDEZVOUS,
            Error::Launcher { .. } => QUIVER_ERR_LAUNCHER,
            Error::MessageTooLarge { .. } => QUIVER_ERR_MESSAGE_TOO_LARGE,
            Error::NoTarget => QUIVER_ERR_NO_TARGET,
            Error::NoSuchRank { .. } => QUIVER_ERR_NO_SUCH_RANK,
            Error::NoSuchEndpoint { .. } | Error::PeerNotFound { .. } => {
                QUIVER_ERR_NO_SUCH_ENDPOINT
            }
            Error::DpidInUse { .. } => QUIVER_ERR_DPID_IN_USE,
            Error::PeerClosed { .. } => QUIVER_ERR_PEER_CLOSED,
            Error::PeerFailed { .. } => QUIVER_ERR_PEER_FAILED,
            Error::TooManySenders { .. } => QUIVER_ERR_TOO_MANY_SENDERS,
            Error::Segment { .. } | Error::SegmentSquatted { .. } => QUIVER_ERR_SEGMENT,
            Error::Lost { .. } => QUIVER_ERR_LOST,
            Error::ChannelFailed { .. } => QUIVER_ERR_CHANNEL_FAILED,
            Error::Timeout(_) => QUIVER_ERR_TIMEOUT,
            Error::Truncated { .. } => QUIVER_ERR_TRUNCATED,
            Error::Cancelled => QUIVER_ERR_CANCELLED,
            Error::Protocol { .. } => QUIVER_ERR_PROTOCOL,
            Error::Closed => QUIVER_ERR_CLOSED,
            Error::Io { .. } => QUIVER_ERR_IO,
            Error::Port(_) => QUIVER_ERR_PORT,
            Error::Rma(_) => QUIVER_ERR_RMA,
            // `quiver::Error` is non-exhaustive; `every_error_variant_has_a_code` (tests)
            // fails when a variant reaches this arm.
            _ => QUIVER_ERR_OTHER,
        }
    }
}

/// A failed call: its code and the message `quiver_last_error_message` will return.
#[derive(Debug)]
pub(crate) struct Failure {
    pub code: quiver_error,
    pub message: String,
}

impl Failure {
    /// A NULL where `what` (an argument's name) is needed.
    pub fn null(what: &str) -> Failure {
        Failure {
            code: QUIVER_ERR_NULL,
            message: format!("{what} is NULL"),
        }
    }

    /// An argument out of its range.
    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            code: QUIVER_ERR_INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure {
            code: quiver_error::of(&e),
            message: e.to_string(),
        }
    }
}

/// What an entry point's body returns.
pub(crate) type Outcome = Result<(), Failure>;

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error (interior NULs become spaces).
pub(crate) fn set_last(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // `try_with`: a call made while the thread's locals are being torn down (from
    // another destructor) records nothing rather than panicking.
    let _ = LAST.try_with(|last| {
        if let Ok(mut last) = last.try_borrow_mut() {
            *last = c;
        }
    });
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Runs one entry point's body: its failure becomes a code and this thread's last error
/// message; a panic is stopped here and becomes `QUIVER_ERR_PANIC`.
pub(crate) fn ffi(body: impl FnOnce() -> Outcome) -> quiver_error {
    // AssertUnwindSafe: after a panic the code is returned and the handle the call used
    // is documented as unusable (QUIVER_ERR_PANIC): nobody observes a broken invariant
    // through it unless the caller ignores that.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => QUIVER_OK,
        Ok(Err(f)) => {
            set_last(&f.message);
            f.code
        }
        Err(payload) => {
            set_last(&format!(
                "quiver panicked (a bug in quiver; please report it): {}",
                panic_text(&*payload)
            ));
            QUIVER_ERR_PANIC
        }
    }
}

/// The reference behind a handle argument, or `QUIVER_ERR_NULL`.
///
/// # Safety
///
/// `p` is NULL or points to a live `T` that nothing mutates during `'a`.
pub(crate) unsafe fn handle<'a, T>(p: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: per the contract, a non-NULL `p` points to a live `T`.
    unsafe { p.as_ref() }.ok_or_else(|| Failure::null(what))
}

/// A place the caller gave for a result: checked non-NULL, written with `put`.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// `p` checked; `QUIVER_ERR_NULL` names `what` when it is NULL.
    ///
    /// # Safety
    ///
    /// `p` is NULL or valid for writes of a `T` for as long as the `Out` lives (it may
    /// be uninitialised: `put` neither reads nor drops what is there).
    pub unsafe fn new(p: *mut T, what: &str) -> Result<Out<T>, Failure> {
        if p.is_null() {
            return Err(Failure::null(what));
        }
        Ok(Out(p))
    }

    /// `p` that may be NULL (an output the caller does not want): `None` then.
    ///
    /// # Safety
    ///
    /// As [`Out::new`].
    pub unsafe fn optional(p: *mut T) -> Option<Out<T>> {
        (!p.is_null()).then_some(Out(p))
    }

    /// Writes the result.
    pub fn put(&self, v: T) {
        // SAFETY: non-NULL (checked when made) and writable (the contract of `new`);
        // `write` neither reads nor drops the old contents.
        unsafe { self.0.write(v) }
    }
}

/// The `len` bytes at `data` as a slice: `len` 0 gives an empty slice whatever `data`
/// is; otherwise a NULL `data` is `QUIVER_ERR_NULL`.
///
/// # Safety
///
/// A non-NULL `data` is readable for `len` bytes and not written during `'a`.
pub(crate) unsafe fn bytes<'a>(
    data: *const u8,
    len: usize,
    what: &str,
) -> Result<&'a [u8], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(Failure::null(what));
    }
    if len > isize::MAX as usize {
        return Err(Failure::invalid(format!(
            "{what}: length {len} is too large"
        )));
    }
    // SAFETY: non-NULL, `len` readable bytes not written meanwhile (the contract), and
    // `len` fits an allocation (checked).
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

/// Checks a caller's writable buffer: `len` 0 is fine with any pointer, otherwise NULL
/// is `QUIVER_ERR_NULL` and a length beyond `isize::MAX` `QUIVER_ERR_INVALID_ARGUMENT`.
pub(crate) fn check_buffer(buf: *mut u8, len: usize, what: &str) -> Outcome {
    if len > 0 && buf.is_null() {
        return Err(Failure::null(what));
    }
    if len > isize::MAX as usize {
        return Err(Failure::invalid(format!(
            "{what}: length {len} is too large"
        )));
    }
    Ok(())
}

/// Writes up to `cap` of `ranks` at `out` and their number at `count`.
///
/// # Safety
///
/// `out` is writable for `cap` `u32`s when `cap` > 0.
pub(crate) unsafe fn put_ranks(
    ranks: &[u32],
    out: *mut u32,
    cap: usize,
    count: &Out<usize>,
) -> Outcome {
    if cap > 0 && out.is_null() {
        return Err(Failure::null("ranks"));
    }
    let n = ranks.len().min(cap);
    if n > 0 {
        // SAFETY: `out` is non-NULL and writable for `cap` >= `n` values (the contract);
        // the source is a Rust vector, which cannot overlap the caller's array.
        unsafe { std::ptr::copy_nonoverlapping(ranks.as_ptr(), out, n) };
    }
    count.put(ranks.len());
    Ok(())
}

/// A static description of a code, for any value of `code`: codes this library does not
/// know give `"unknown quiver error code"`. Never NULL; the string lives for ever.
///
/// Thread safety: any thread, at any time.
#[no_mangle]
pub extern "C" fn quiver_strerror(code: c_int) -> *const c_char {
    // Under catch_unwind like every entry point (nothing here is expected to panic).
    catch_unwind(|| {
        let known = quiver_error::ALL.iter().find(|c| **c as c_int == code);
        known.map_or(c"unknown quiver error code", |c| c.describe())
    })
    .unwrap_or(c"unknown quiver error code")
    .as_ptr()
}

/// The message of the last call on the calling thread that failed (what failed, with
/// which rank, variable or size), or `""` when none has failed. Never NULL; valid until
/// the next call on this thread that fails. A successful call leaves it as it is.
///
/// Thread safety: any thread; each thread has its own message.
#[no_mangle]
pub extern "C" fn quiver_last_error_message() -> *const c_char {
    // Under catch_unwind like every entry point (nothing here is expected to panic).
    catch_unwind(|| {
        LAST.try_with(|last| match last.try_borrow() {
            Ok(s) => s.as_ptr(),
            Err(_) => c"".as_ptr(),
        })
        // The CString's buffer stays where it is until the next `set_last` on this
        // thread replaces it.
        .unwrap_or(c"".as_ptr())
    })
    .unwrap_or(c"".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: quiver_last_error_message returns a valid NUL-terminated string.
        unsafe { CStr::from_ptr(quiver_last_error_message()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_a_code_and_a_message() {
        let code = ffi(|| panic!("boom at the boundary"));
        assert_eq!(code, QUIVER_ERR_PANIC);
        let msg = last();
        assert!(msg.contains("boom at the boundary"), "{msg}");
        assert!(msg.contains("quiver panicked"), "{msg}");
        // A formatted payload (a String) too.
        assert_eq!(ffi(|| panic!("rank {}", 7)), QUIVER_ERR_PANIC);
        assert!(last().contains("rank 7"));
    }

    #[test]
    fn a_failure_sets_the_message_and_success_keeps_it() {
        assert_eq!(ffi(|| Err(Failure::null("ep"))), QUIVER_ERR_NULL);
        assert_eq!(last(), "ep is NULL");
        assert_eq!(ffi(|| Ok(())), QUIVER_OK);
        assert_eq!(last(), "ep is NULL");
        let e = Error::NoSuchRank { rank: 9, size: 2 };
        assert_eq!(ffi(|| Err(e.into())), QUIVER_ERR_NO_SUCH_RANK);
        assert_eq!(last(), "rank 9 does not exist: the job has 2 ranks");
        // A NUL inside a message does not cut it.
        assert_eq!(
            ffi(|| Err(Failure::invalid("a\0b"))),
            QUIVER_ERR_INVALID_ARGUMENT
        );
        assert_eq!(last(), "a b");
    }

    #[test]
    fn each_thread_has_its_own_message() {
        assert_eq!(
            ffi(|| Err(Failure::invalid("main"))),
            QUIVER_ERR_INVALID_ARGUMENT
        );
        std::thread::spawn(|| {
            assert_eq!(last(), "");
            assert_eq!(
                ffi(|| Err(Failure::invalid("other"))),
                QUIVER_ERR_INVALID_ARGUMENT
            );
            assert_eq!(last(), "other");
        })
        .join()
        .unwrap();
        assert_eq!(last(), "main");
    }

    #[test]
    fn every_code_has_its_own_description_and_unknown_codes_one_too() {
        let mut seen = std::collections::HashSet::new();
        for c in quiver_error::ALL {
            // SAFETY: quiver_strerror returns a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(quiver_strerror(c as c_int)) };
            assert!(seen.insert(s.to_owned()), "{c:?} shares its description");
        }
        for bad in [-1, 5, 9, 34, 1000, c_int::MIN, c_int::MAX] {
            // SAFETY: as above.
            let s = unsafe { CStr::from_ptr(quiver_strerror(bad)) };
            assert_eq!(s, c"unknown quiver error code", "{bad}");
        }
    }

    #[test]
    fn codes_keep_their_values() {
        // The values are part of the ABI: a change here breaks compiled programs.
        let values: Vec<c_int> = quiver_error::ALL.iter().map(|c| *c as c_int).collect();
        let mut expected = vec![0, 1, 2, 3, 4];
        expected.extend(10..=33);
        assert_eq!(values, expected);
    }

    /// Every variant of `quiver::Error` is named in [`quiver_error::of`], so none falls
    /// to `QUIVER_ERR_OTHER` unnoticed (the enum is non-exhaustive: the compiler cannot
    /// tell).
    #[test]
    fn every_error_variant_has_a_code() {
        let core = include_str!("../../quiver/src/error.rs");
        let body = &core[core.find("pub enum Error {").expect("the Error enum")..];
        let body = &body[..body.find("\n}\n").expect("the enum's end")];
        let variants: Vec<&str> = body
            .lines()
            .filter(|l| l.starts_with("    ") && !l.starts_with("     "))
            .map(|l| l.trim())
            .filter(|l| l.chars().next().is_some_and(|c| c.is_ascii_uppercase()))
            .map(|l| l.split(|c: char| !c.is_alphanumeric()).next().unwrap_or(""))
            .collect();
        assert!(variants.len() >= 20, "read too few variants: {variants:?}");
        let mapping = include_str!("error.rs");
        let mapping = &mapping[mapping.find("pub(crate) fn of(").expect("of")..];
        let mapping = &mapping[..mapping.find("_ => QUIVER_ERR_OTHER").expect("the last arm")];
        for v in variants {
            assert!(
                mapping.contains(&format!("Error::{v} "))
                    || mapping.contains(&format!("Error::{v}(")),
                "quiver::Error::{v} has no code in quiver_error::of"
            );
        }
    }
}
