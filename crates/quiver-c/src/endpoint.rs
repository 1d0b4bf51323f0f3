//! Directed Point endpoints at the C boundary: `quiver_endpoint` (open, target, write,
//! read, release, descriptor, progress, flush, statistics, error handler, close) and the
//! message view `quiver_message`.
//!
//! A message read is a view into the endpoint's token buffer pool: the Rust `Message` is
//! kept with `Message::hold` before the call returns, so its bytes stay where they are
//! until `quiver_endpoint_release` releases it (oldest held first, as `Endpoint::release`
//! does). An endpoint is `Send`, not `Sync`: one thread at a time may use it, and it may
//! change threads between calls.

use crate::error::{bytes, ffi, handle, put_ranks, quiver_error, Failure, Out, Outcome};
use crate::job::quiver_job;
use quiver_rs::{Endpoint, EndpointStats, Error, Message, Transport};
use std::ffi::{c_char, c_int, c_void, CString};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// A Directed Point endpoint (opaque). Opened by `quiver_endpoint_open`, closed by
/// `quiver_endpoint_close`.
#[allow(non_camel_case_types)]
pub struct quiver_endpoint {
    pub(crate) ep: Endpoint,
}

/// A received message: a view of its bytes in the endpoint's token buffer pool (no
/// copy). `data` stays valid, and the bytes unchanged, until the message is released
/// with `quiver_endpoint_release` (or the endpoint closed); `data` is NULL when `len` is
/// 0.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct quiver_message {
    /// The message's bytes.
    pub data: *const c_void,
    /// Its length in bytes.
    pub len: usize,
    /// The rank of the endpoint that sent it.
    pub source_rank: u32,
    /// The DPID of the endpoint that sent it.
    pub source_dpid: u16,
}

/// Shared memory (same node): `quiver_endpoint_transport_to`'s answer.
pub const QUIVER_TRANSPORT_SHM: u32 = 0;
/// UDP datagrams.
pub const QUIVER_TRANSPORT_UDP: u32 = 1;
/// Raw Ethernet frames.
pub const QUIVER_TRANSPORT_ETH: u32 = 2;

/// The counters of an endpoint (`quiver_endpoint_stats`); the fields of the Rust
/// `EndpointStats`, documented there.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct quiver_endpoint_counters {
    /// Messages written.
    pub msgs_sent: u64,
    /// Payload bytes written.
    pub bytes_sent: u64,
    /// Messages read.
    pub msgs_received: u64,
    /// Payload bytes read.
    pub bytes_received: u64,
    /// Network frames sent.
    pub frames_sent: u64,
    /// Network frames received.
    pub frames_received: u64,
    /// Ethernet frames the kernel dropped for a full receive ring.
    pub ring_drops: u64,
    /// Ethernet frames copied out of the receive ring before it came round to them.
    pub ring_evacuations: u64,
    /// Writes that found the receiver's pool full and waited.
    pub send_stalls: u64,
    /// Frames dropped because they did not decode.
    pub dropped_malformed: u64,
    /// Frames dropped because they belong to another job.
    pub dropped_foreign_job: u64,
    /// Frames of this job dropped for a wrong token.
    pub dropped_bad_token: u64,
    /// Frames dropped because they name another endpoint or an unknown rank.
    pub dropped_misaddressed: u64,
    /// Frames dropped because they did not come from their rank's address.
    pub dropped_spoofed: u64,
    /// Datagrams dropped for a wrong or missing authentication tag.
    pub dropped_unauthenticated: u64,
    /// Messages dropped because they exceed this endpoint's maximum.
    pub dropped_oversized: u64,
    /// Duplicate frames ignored.
    pub duplicates: u64,
    /// Frames detected as lost.
    pub lost_frames: u64,
    /// Shared-memory rings found corrupt.
    pub corrupt_rings: u64,
    /// Network frames sent again.
    pub retransmissions: u64,
    /// Expiries of the retransmission timers.
    pub timeouts: u64,
    /// Repairs started by a selective acknowledgement.
    pub fast_retransmits: u64,
    /// Network frames whose checksum did not match.
    pub checksum_failures: u64,
    /// Network frames that arrived ahead of a missing one.
    pub out_of_order: u64,
    /// Times a network sender found its window closed.
    pub credit_stalls: u64,
    /// Explicit acknowledgement frames sent.
    pub acks_sent: u64,
    /// Datagrams the fault injector dropped.
    pub faults_lost: u64,
    /// Datagrams the fault injector sent twice.
    pub faults_duplicated: u64,
    /// Datagrams the fault injector held back.
    pub faults_reordered: u64,
    /// Datagrams the fault injector corrupted.
    pub faults_corrupted: u64,
    /// Tail-loss probes sent (frames unacknowledged for two round trips, nothing after).
    pub tail_probes: u64,
}

impl From<EndpointStats> for quiver_endpoint_counters {
    fn from(s: EndpointStats) -> Self {
        // Destructured without `..`: a counter added to `EndpointStats` fails to compile
        // here until the C struct has it too.
        let EndpointStats {
            msgs_sent,
            bytes_sent,
            msgs_received,
            bytes_received,
            frames_sent,
            frames_received,
            ring_drops,
            ring_evacuations,
            send_stalls,
            dropped_malformed,
            dropped_foreign_job,
            dropped_bad_token,
            dropped_misaddressed,
            dropped_spoofed,
            dropped_unauthenticated,
            dropped_oversized,
            duplicates,
            lost_frames,
            corrupt_rings,
            retransmissions,
            timeouts,
            fast_retransmits,
            checksum_failures,
            out_of_order,
            credit_stalls,
            acks_sent,
            faults_lost,
            faults_duplicated,
            faults_reordered,
            faults_corrupted,
            tail_probes,
        } = s;
        quiver_endpoint_counters {
            msgs_sent,
            bytes_sent,
            msgs_received,
            bytes_received,
            frames_sent,
            frames_received,
            ring_drops,
            ring_evacuations,
            send_stalls,
            dropped_malformed,
            dropped_foreign_job,
            dropped_bad_token,
            dropped_misaddressed,
            dropped_spoofed,
            dropped_unauthenticated,
            dropped_oversized,
            duplicates,
            lost_frames,
            corrupt_rings,
            retransmissions,
            timeouts,
            fast_retransmits,
            checksum_failures,
            out_of_order,
            credit_stalls,
            acks_sent,
            faults_lost,
            faults_duplicated,
            faults_reordered,
            faults_corrupted,
            tail_probes,
        }
    }
}

/// A function that sees every error an endpoint delivers (see
/// `quiver_endpoint_set_error_handler`): its code, its message (valid during the call)
/// and the `user` pointer given with it.
#[allow(non_camel_case_types)]
pub type quiver_error_handler =
    Option<unsafe extern "C" fn(code: quiver_error, message: *const c_char, user: *mut c_void)>;

/// A C error handler with its user pointer.
struct CHandler {
    f: unsafe extern "C" fn(quiver_error, *const c_char, *mut c_void),
    user: *mut c_void,
}

// SAFETY: the caller of quiver_endpoint_set_error_handler promises (its Safety section)
// that the function and `user` may be used from whichever thread uses the endpoint,
// which is all that moving the handler with the endpoint requires.
unsafe impl Send for CHandler {}

impl CHandler {
    fn call(&self, e: &Error) {
        let message = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
        // SAFETY: the function and its user pointer are the caller's, valid for as long
        // as the endpoint (its Safety section); the message lives through the call.
        unsafe { (self.f)(quiver_error::of(e), message.as_ptr(), self.user) }
    }
}

/// The endpoint behind a handle argument.
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle that no other thread uses during `'a`.
unsafe fn endpoint<'a>(ep: *const quiver_endpoint) -> Result<&'a Endpoint, Failure> {
    // SAFETY: the contract is the caller's.
    unsafe { handle(ep, "ep") }.map(|h| &h.ep)
}

/// The view of `m` as C sees it, its token kept in the pool until released.
fn keep(m: Message<'_>) -> quiver_message {
    let view = quiver_message {
        data: if m.is_empty() {
            std::ptr::null()
        } else {
            m.as_ptr().cast()
        },
        len: m.len(),
        source_rank: m.source().rank,
        source_dpid: m.source().dpid,
    };
    // The token stays in the pool, the bytes where `data` points, until
    // `Endpoint::release` frees it.
    m.hold();
    view
}

/// Opens endpoint `dpid` of this rank and stores its handle at `*ep`. A DPID can be open
/// once per rank at a time (`QUIVER_ERR_DPID_IN_USE`).
///
/// Thread safety: any thread (the job may be shared); the new endpoint is the caller's.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `ep` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_open(
    job: *const quiver_job,
    dpid: u16,
    ep: *mut *mut quiver_endpoint,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle, `ep` NULL or writable (the contract).
        let (j, out) = unsafe { (handle(job, "job")?, Out::new(ep, "ep")?) };
        let e = j.job.open(dpid)?;
        out.put(Box::into_raw(Box::new(quiver_endpoint { ep: e })));
        Ok(())
    })
}

/// Closes the endpoint at `*ep` (its receive area is removed, later writes to it fail;
/// messages still held are released) and sets `*ep` to NULL, so that a second close
/// gives `QUIVER_ERR_NULL`.
///
/// Thread safety: no other call may use the endpoint meanwhile or after.
///
/// # Safety
///
/// `ep` is NULL or points to NULL or to a live endpoint handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_close(ep: *mut *mut quiver_endpoint) -> quiver_error {
    ffi(|| {
        // SAFETY: `ep` is NULL or a valid place (the contract).
        let place = unsafe { ep.as_mut() }.ok_or_else(|| Failure::null("ep"))?;
        if place.is_null() {
            return Err(Failure::null("*ep"));
        }
        let h = std::mem::replace(place, std::ptr::null_mut());
        // SAFETY: `h` came from Box::into_raw in quiver_endpoint_open and is freed once:
        // the caller's variable no longer holds it.
        drop(unsafe { Box::from_raw(h) });
        Ok(())
    })
}

/// Runs `body` on the endpoint at `ep`.
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle, used by no other thread during the call.
unsafe fn with(
    ep: *const quiver_endpoint,
    body: impl FnOnce(&Endpoint) -> Outcome,
) -> quiver_error {
    ffi(|| {
        // SAFETY: the contract is the caller's.
        let e = unsafe { endpoint(ep) }?;
        body(e)
    })
}

/// Writes `value(endpoint)` at `out`.
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle used by no other thread during the call;
/// `out` is NULL or writable.
unsafe fn get<T>(
    ep: *const quiver_endpoint,
    out: *mut T,
    what: &str,
    value: impl FnOnce(&Endpoint) -> Result<T, Failure>,
) -> quiver_error {
    let body = |e: &Endpoint| -> Outcome {
        // SAFETY: `out` is NULL or writable (the contract).
        let out = unsafe { Out::new(out, what) }?;
        out.put(value(e)?);
        Ok(())
    };
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, body) }
}

/// This endpoint's DPID, at `*dpid`.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `dpid` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_dpid(
    ep: *const quiver_endpoint,
    dpid: *mut u16,
) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { get(ep, dpid, "dpid", |e| Ok(e.dpid())) }
}

/// This endpoint's rank (the job's rank of this process), at `*rank`.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `rank` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_rank(
    ep: *const quiver_endpoint,
    rank: *mut u32,
) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { get(ep, rank, "rank", |e| Ok(e.rank())) }
}

/// Sets the destination of writes to endpoint `dpid` of node `nid` (of the first rank
/// on that node that opened it), connecting if needed. `QUIVER_ERR_NO_SUCH_ENDPOINT`
/// when none was opened within `QUIVER_CONNECT_TIMEOUT`.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_target(
    ep: *const quiver_endpoint,
    nid: u32,
    dpid: u16,
) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, |e| Ok(e.target(nid, dpid)?)) }
}

/// Sets the destination of writes to the endpoint with this endpoint's DPID on `rank`,
/// waiting up to `QUIVER_CONNECT_TIMEOUT` for it (`QUIVER_ERR_NO_SUCH_ENDPOINT`).
/// `QUIVER_ERR_NO_SUCH_RANK` outside 0..size.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_target_rank(
    ep: *const quiver_endpoint,
    rank: u32,
) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, |e| Ok(e.target_rank(rank)?)) }
}

/// Sets the destination of writes to endpoint `dpid` on `rank`, waiting up to
/// `QUIVER_CONNECT_TIMEOUT` for that rank to open it (`QUIVER_ERR_NO_SUCH_ENDPOINT`).
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_target_endpoint(
    ep: *const quiver_endpoint,
    rank: u32,
    dpid: u16,
) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, |e| Ok(e.target_endpoint(rank, dpid)?)) }
}

/// The transport used towards `rank` (`QUIVER_TRANSPORT_SHM`, `_UDP` or `_ETH`), at
/// `*transport`.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `transport` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_transport_to(
    ep: *const quiver_endpoint,
    rank: u32,
    transport: *mut u32,
) -> quiver_error {
    let value = |e: &Endpoint| {
        Ok(match e.transport_to(rank)? {
            Transport::Shm => QUIVER_TRANSPORT_SHM,
            Transport::Udp => QUIVER_TRANSPORT_UDP,
            Transport::Eth => QUIVER_TRANSPORT_ETH,
        })
    };
    // SAFETY: the contract is the caller's.
    unsafe { get(ep, transport, "transport", value) }
}

/// Sends the `len` bytes at `data` as one message to the target. Returns when the
/// buffer may be reused; waits (per `QUIVER_WAIT`) while the receiver's pool is full.
/// `QUIVER_ERR_NO_TARGET` before a target is set.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `data` is readable for `len` bytes (it may be
/// NULL when `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_write(
    ep: *const quiver_endpoint,
    data: *const c_void,
    len: usize,
) -> quiver_error {
    let body = |e: &Endpoint| -> Outcome {
        // SAFETY: `data` is readable for `len` bytes (the contract).
        let data = unsafe { bytes(data.cast(), len, "data") }?;
        Ok(e.write(data)?)
    };
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, body) }
}

/// Sends one message made of the `head_len` bytes at `head` followed by the `body_len`
/// bytes at `body` (a gather write: no copy to join them).
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `head` and `body` are readable for their
/// lengths (either may be NULL when its length is 0).
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_write_parts(
    ep: *const quiver_endpoint,
    head: *const c_void,
    head_len: usize,
    body: *const c_void,
    body_len: usize,
) -> quiver_error {
    let send = |e: &Endpoint| -> Outcome {
        // SAFETY: both are readable for their lengths (the contract).
        let (head, body) = unsafe {
            (
                bytes(head.cast(), head_len, "head")?,
                bytes(body.cast(), body_len, "body")?,
            )
        };
        Ok(e.write_parts(head, body)?)
    };
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, send) }
}

/// Like `quiver_endpoint_write`, but never waits: `*sent` is false, and nothing is sent,
/// when the receiver's shared-memory ring (or the offload engine's command ring) is
/// full. Over the network the message is accepted even when the channel's window is
/// closed.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `data` is readable for `len` bytes (it may be
/// NULL when `len` is 0); `sent` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_try_write(
    ep: *const quiver_endpoint,
    data: *const c_void,
    len: usize,
    sent: *mut bool,
) -> quiver_error {
    let value = |e: &Endpoint| {
        // SAFETY: `data` is readable for `len` bytes (the contract).
        let data = unsafe { bytes(data.cast(), len, "data") }?;
        Ok(e.try_write_parts(&[], data)?)
    };
    // SAFETY: the contract is the caller's.
    unsafe { get(ep, sent, "sent", value) }
}

/// Reads the next message into the view at `*msg`, waiting for it per the wait mode
/// (`QUIVER_WAIT`). The message stays in the pool, and `msg->data` valid, until released
/// with `quiver_endpoint_release`: release every message read, or the pool fills and
/// the senders stall.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `msg` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_read(
    ep: *const quiver_endpoint,
    msg: *mut quiver_message,
) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { get(ep, msg, "msg", |e| Ok(keep(e.read()?))) }
}

/// Like `quiver_endpoint_read`, waiting at most `timeout_us` microseconds
/// (`QUIVER_ERR_TIMEOUT` then, `*msg` untouched).
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `msg` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_read_timeout(
    ep: *const quiver_endpoint,
    timeout_us: u64,
    msg: *mut quiver_message,
) -> quiver_error {
    let limit = Duration::from_micros(timeout_us);
    // SAFETY: the contract is the caller's.
    unsafe { get(ep, msg, "msg", |e| Ok(keep(e.read_timeout(limit)?))) }
}

/// The next message if one is waiting, without waiting: `*found` says whether `*msg`
/// was filled (a message read must be released, as with `quiver_endpoint_read`).
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `msg` and `found` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_try_read(
    ep: *const quiver_endpoint,
    msg: *mut quiver_message,
    found: *mut bool,
) -> quiver_error {
    let body = |e: &Endpoint| -> Outcome {
        // SAFETY: both are NULL or writable (the contract).
        let (msg, found) = unsafe { (Out::new(msg, "msg")?, Out::new(found, "found")?) };
        let m = e.try_read()?;
        found.put(m.is_some());
        if let Some(m) = m {
            msg.put(keep(m));
        }
        Ok(())
    };
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, body) }
}

/// Releases the `n` oldest messages read and not yet released (their views become
/// invalid); `*released` (if not NULL) says how many were (fewer when fewer are held).
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `released` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_release(
    ep: *const quiver_endpoint,
    n: usize,
    released: *mut usize,
) -> quiver_error {
    let body = |e: &Endpoint| -> Outcome {
        // SAFETY: `released` is NULL or writable (the contract).
        let out = unsafe { Out::optional(released) };
        let done = e.release(n);
        if let Some(out) = out {
            out.put(done);
        }
        Ok(())
    };
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, body) }
}

/// The number of messages read and not yet released, at `*held`.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `held` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_held(
    ep: *const quiver_endpoint,
    held: *mut usize,
) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { get(ep, held, "held", |e| Ok(e.held())) }
}

/// The endpoint's descriptor, at `*fd`: readable when messages have arrived (for
/// `poll`/`epoll`). After it signals, call `quiver_endpoint_try_read` until it finds
/// nothing; sleep no longer than `quiver_endpoint_poll_timeout` says. The descriptor
/// belongs to the endpoint: do not close it.
///
/// Thread safety: one thread at a time per endpoint (any thread); the descriptor itself
/// may be polled from any thread.
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `fd` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_fd(
    ep: *const quiver_endpoint,
    fd: *mut c_int,
) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { get(ep, fd, "fd", |e| Ok(e.as_raw_fd())) }
}

/// How long, in microseconds, a caller that polls the descriptor itself may sleep
/// before calling `quiver_endpoint_progress` or `quiver_endpoint_try_read` again
/// (network channels have timers), at `*timeout_us`; -1 when no timer runs.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `timeout_us` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_poll_timeout(
    ep: *const quiver_endpoint,
    timeout_us: *mut i64,
) -> quiver_error {
    let value = |e: &Endpoint| {
        Ok(e.poll_timeout()
            .map_or(-1, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX)))
    };
    // SAFETY: the contract is the caller's.
    unsafe { get(ep, timeout_us, "timeout_us", value) }
}

/// One round of protocol work without taking a message out (receive, acknowledge,
/// retransmit, fire due timers); never blocks.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_progress(ep: *const quiver_endpoint) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, |e| Ok(e.progress()?)) }
}

/// Waits until everything this endpoint sent over the network is acknowledged; call it
/// before blocking outside quiver. `QUIVER_ERR_TIMEOUT` after `QUIVER_CONNECT_TIMEOUT`.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_flush(ep: *const quiver_endpoint) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, |e| Ok(e.flush()?)) }
}

/// Like `quiver_endpoint_flush` with a time limit of `timeout_us` microseconds.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_flush_timeout(
    ep: *const quiver_endpoint,
    timeout_us: u64,
) -> quiver_error {
    let limit = Duration::from_micros(timeout_us);
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, |e| Ok(e.flush_within(limit)?)) }
}

/// The endpoint's counters, at `*stats`.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_stats(
    ep: *const quiver_endpoint,
    stats: *mut quiver_endpoint_counters,
) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { get(ep, stats, "stats", |e| Ok(e.stats().into())) }
}

/// The ranks this endpoint found failed, ascending: the first `cap` at `ranks`, their
/// number at `*count` (which may exceed `cap`).
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `ranks` is writable for `cap` values (when
/// `cap` > 0); `count` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_failed_ranks(
    ep: *const quiver_endpoint,
    ranks: *mut u32,
    cap: usize,
    count: *mut usize,
) -> quiver_error {
    let body = |e: &Endpoint| -> Outcome {
        // SAFETY: `count` is NULL or writable (the contract).
        let count = unsafe { Out::new(count, "count") }?;
        // SAFETY: `ranks` is writable for `cap` values (the contract).
        unsafe { put_ranks(&e.failed_ranks(), ranks, cap, &count) }
    };
    // SAFETY: the contract is the caller's.
    unsafe { with(ep, body) }
}

/// Registers `handler`, which runs on every error this endpoint delivers (from reads,
/// writes, progress...) before the call returns it, with `user`. It runs on the thread
/// of that call and must not use this endpoint. NULL removes the handler.
///
/// Thread safety: one thread at a time per endpoint (any thread).
///
/// # Safety
///
/// `ep` is NULL or a live endpoint handle; `handler` and `user` stay usable, from any
/// thread that uses the endpoint, for as long as the endpoint is open.
#[no_mangle]
pub unsafe extern "C" fn quiver_endpoint_set_error_handler(
    ep: *const quiver_endpoint,
    handler: quiver_error_handler,
    user: *mut c_void,
) -> quiver_error {
    let body = |e: &Endpoint| -> Outcome {
        match handler {
            Some(f) => {
                let h = CHandler { f, user };
                e.set_error_handler(move |err| h.call(err));
            }
            None => e.set_error_handler(|_| {}),
        }
        Ok(())
    };
    // SAFETY: the contract is the caller's (the handler's is checked when it runs).
    unsafe { with(ep, body) }
}
