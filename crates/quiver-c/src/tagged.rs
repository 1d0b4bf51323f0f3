//! Tagged endpoints at the C boundary: `quiver_tagged` (blocking send and receive,
//! probes, non-blocking operations with requests, waits, cancel, abandon, push settings,
//! statistics, close) and `quiver_status`.
//!
//! A request is a number (`quiver_request`), not a pointer: the tagged handle keeps the
//! Rust `RawRequest` of every pending operation under a number unique in the process,
//! so that a completed, abandoned or foreign request given back is
//! `QUIVER_ERR_INVALID_ARGUMENT`, never a use of freed memory. Closing the endpoint
//! abandons what is pending (`Tagged`'s drop), after which the buffers are the caller's.
//!
//! A `Tagged` is neither `Send` nor `Sync` (it holds `RefCell`s and raw pointers into
//! the caller's buffers): every call checks that it runs on the thread that opened the
//! endpoint (`QUIVER_ERR_WRONG_THREAD` otherwise) before touching anything but that
//! thread's number.

use crate::endpoint::quiver_endpoint_counters;
use crate::error::{bytes, check_buffer, ffi, handle, quiver_error, Failure, Out, Outcome};
use crate::job::quiver_job;
use quiver_rs::tagged::{PushMode, RawRequest, SharedBuf, Src, Status, Tag, Tagged, TaggedStats};
use quiver_rs::Error;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Any sender: the wildcard rank of a receive or probe.
pub const QUIVER_ANY_SOURCE: u32 = u32::MAX;
/// Any tag: the wildcard tag of a receive or probe (sends may not use it).
pub const QUIVER_ANY_TAG: u32 = u32::MAX;

/// A pending non-blocking operation of a tagged endpoint. `QUIVER_REQUEST_NULL` is no
/// operation: completing calls (wait, a successful test, abandon) set the variable to
/// it, and waitany and waitall skip it.
#[allow(non_camel_case_types)]
pub type quiver_request = u64;
/// No request.
pub const QUIVER_REQUEST_NULL: quiver_request = 0;

/// Push BTP(1) + BTP(2) bytes and pull the rest (the default): `quiver_tagged_set_push`.
pub const QUIVER_PUSH_PULL: u32 = 0;
/// Push nothing; the receiver pulls the whole message.
pub const QUIVER_PUSH_ZERO: u32 = 1;
/// Push the whole message.
pub const QUIVER_PUSH_ALL: u32 = 2;

/// What a completed operation did. On `QUIVER_ERR_TRUNCATED`, `peer`, `tag` and `len`
/// describe the message (whose first bytes the buffer holds); on other errors `peer`
/// is `QUIVER_ANY_SOURCE`, `tag` `QUIVER_ANY_TAG` and `len` 0.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct quiver_status {
    /// The sender (of a receive) or the destination (of a send).
    pub peer: u32,
    /// The message's tag.
    pub tag: u32,
    /// The message's length in bytes (as sent: it may exceed the receive buffer).
    pub len: u64,
    /// The operation's result.
    pub error: quiver_error,
}

/// The counters of a tagged endpoint (`quiver_tagged_stats`); the fields of the Rust
/// `TaggedStats`, documented there.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct quiver_tagged_counters {
    /// Messages whose first push found no posted receive.
    pub unexpected: u64,
    /// Most bytes the pushed buffer held at once.
    pub pushed_buffer_peak: u64,
    /// Bytes pulled with one copy across address spaces.
    pub pulled_direct: u64,
    /// Bytes read in place from senders' shared buffers.
    pub pulled_shared: u64,
    /// Of `pulled_direct`, bytes pulled by the pull thread.
    pub pulled_on_thread: u64,
    /// Bytes pulled through `Pull` requests and `Data` messages.
    pub pulled_by_request: u64,
    /// Of `pulled_direct`, bytes the sender wrote during a split copy.
    pub pulled_split_by_sender: u64,
    /// Bytes this endpoint wrote into its receivers' buffers during split copies.
    pub split_helped: u64,
    /// Same-node transfers refused because the peer named another process.
    pub foreign_pids_refused: u64,
    /// Protocol messages dropped.
    pub dropped: u64,
    /// Sends that pushed nothing for lack of push credit.
    pub push_credit_exhausted: u64,
}

impl From<TaggedStats> for quiver_tagged_counters {
    fn from(s: TaggedStats) -> Self {
        // Destructured without `..`: a counter added to `TaggedStats` fails to compile
        // here until the C struct has it too.
        let TaggedStats {
            unexpected,
            pushed_buffer_peak,
            pulled_direct,
            pulled_shared,
            pulled_on_thread,
            pulled_by_request,
            pulled_split_by_sender,
            split_helped,
            foreign_pids_refused,
            dropped,
            push_credit_exhausted,
        } = s;
        quiver_tagged_counters {
            unexpected,
            pushed_buffer_peak,
            pulled_direct,
            pulled_shared,
            pulled_on_thread,
            pulled_by_request,
            pulled_split_by_sender,
            split_helped,
            foreign_pids_refused,
            dropped,
            push_credit_exhausted,
        }
    }
}

/// A tagged endpoint (opaque), bound to the thread that opened it. Opened by
/// `quiver_tagged_open`, closed by `quiver_tagged_close`.
#[allow(non_camel_case_types)]
pub struct quiver_tagged {
    /// The opening thread's number (`this_thread`), read before anything else.
    thread: u64,
    /// The pending operations the caller holds requests for, by request number.
    requests: RefCell<HashMap<u64, RawRequest>>,
    /// The buffers of `quiver_tagged_alloc_shared`, by address. Their lifetime is
    /// `tagged`'s in truth: the handle is boxed (`tagged` never moves) and `Drop` empties
    /// this table before `tagged` goes.
    shared: RefCell<HashMap<usize, SharedBuf<'static>>>,
    tagged: Tagged,
}

/// Closing: pending operations are abandoned (nothing reads or writes their buffers any
/// more), then the shared buffers are freed, then the endpoint itself goes (its drop
/// lingers for its peers' answers).
impl Drop for quiver_tagged {
    fn drop(&mut self) {
        for (_, raw) in self.requests.get_mut().drain() {
            self.tagged.abandon_raw(raw);
        }
        self.shared.get_mut().clear();
    }
}

/// Numbers of threads and of requests, unique in the process (0 is no request).
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// The calling thread's number (0, which no handle has, while its locals are torn down).
pub(crate) fn this_thread() -> u64 {
    THREAD.try_with(|t| *t).unwrap_or(0)
}

/// The tagged endpoint behind a handle argument, on its own thread.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle.
unsafe fn tagged<'a>(t: *const quiver_tagged) -> Result<&'a quiver_tagged, Failure> {
    if t.is_null() {
        return Err(Failure::null("t"));
    }
    // SAFETY: `t` is a live handle (the contract); `thread` is written once, before the
    // handle is handed out, so reading it from any thread is no race. Nothing else is
    // touched before the thread is known to be the owner's.
    let owner = unsafe { std::ptr::addr_of!((*t).thread).read() };
    if owner != this_thread() {
        return Err(Failure {
            code: quiver_error::QUIVER_ERR_WRONG_THREAD,
            message: "a tagged endpoint is used only by the thread that opened it".into(),
        });
    }
    // SAFETY: a live handle of this thread (checked above), so no other thread uses it.
    unsafe { handle(t, "t") }
}

/// Runs `body` on the tagged endpoint at `t`.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle.
unsafe fn with(
    t: *const quiver_tagged,
    body: impl FnOnce(&quiver_tagged) -> Outcome,
) -> quiver_error {
    ffi(|| {
        // SAFETY: the contract is the caller's.
        let h = unsafe { tagged(t) }?;
        body(h)
    })
}

fn src_of(rank: u32) -> Src {
    if rank == QUIVER_ANY_SOURCE {
        Src::Any
    } else {
        Src::Rank(rank)
    }
}

fn tag_of(tag: u32) -> Tag {
    if tag == QUIVER_ANY_TAG {
        Tag::Any
    } else {
        Tag::Is(tag)
    }
}

/// A send's tag: the wildcard is refused.
fn send_tag(tag: u32) -> Result<u32, Failure> {
    if tag == QUIVER_ANY_TAG {
        return Err(Failure::invalid(
            "QUIVER_ANY_TAG is for receives and probes; a send needs a tag below it",
        ));
    }
    Ok(tag)
}

/// The C status of a successful operation.
fn done_status(s: Status) -> quiver_status {
    quiver_status {
        peer: s.peer,
        tag: s.tag,
        len: s.len,
        error: quiver_error::QUIVER_OK,
    }
}

/// The C status of an operation's result (the truncated message's rank, tag and length
/// on `QUIVER_ERR_TRUNCATED`), and the result as an outcome.
fn status_of(r: Result<Status, Error>) -> (quiver_status, Outcome) {
    match r {
        Ok(s) => (done_status(s), Ok(())),
        Err(e) => {
            let mut st = quiver_status {
                peer: QUIVER_ANY_SOURCE,
                tag: QUIVER_ANY_TAG,
                len: 0,
                error: quiver_error::of(&e),
            };
            if let Error::Truncated { len, rank, tag, .. } = &e {
                (st.peer, st.tag, st.len) = (*rank, *tag, *len);
            }
            (st, Err(e.into()))
        }
    }
}

/// Writes `st` at `status` when the caller wants it.
///
/// # Safety
///
/// `status` is NULL or writable.
unsafe fn put_status(status: *mut quiver_status, st: quiver_status) {
    // SAFETY: NULL or writable (the contract).
    if let Some(out) = unsafe { Out::optional(status) } {
        out.put(st);
    }
}

/// Opens the tagged endpoint `dpid` of this rank (every rank of the job opens the same
/// DPID) and stores its handle at `*t`. The handle belongs to the calling thread.
///
/// Thread safety: any thread (the job may be shared); the new endpoint is bound to it.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `t` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_open(
    job: *const quiver_job,
    dpid: u16,
    t: *mut *mut quiver_tagged,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle, `t` NULL or writable (the contract).
        let (j, out) = unsafe { (handle(job, "job")?, Out::new(t, "t")?) };
        let tagged = Tagged::open(&j.job, dpid)?;
        out.put(Box::into_raw(Box::new(quiver_tagged {
            thread: this_thread(),
            requests: RefCell::new(HashMap::new()),
            shared: RefCell::new(HashMap::new()),
            tagged,
        })));
        Ok(())
    })
}

/// Closes the tagged endpoint at `*t` and sets `*t` to NULL (a second close gives
/// `QUIVER_ERR_NULL`). Pending operations are abandoned first (their buffers are the
/// caller's again, their requests unknown); then the endpoint sends the answers its
/// peers wait for, for up to two seconds.
///
/// Thread safety: only the thread that opened it (`QUIVER_ERR_WRONG_THREAD`).
///
/// # Safety
///
/// `t` is NULL or points to NULL or to a live tagged handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_close(t: *mut *mut quiver_tagged) -> quiver_error {
    ffi(|| {
        // SAFETY: `t` is NULL or a valid place (the contract).
        let place = unsafe { t.as_mut() }.ok_or_else(|| Failure::null("t"))?;
        // SAFETY: `*place` is NULL or a live handle (the contract); checks the thread.
        unsafe { tagged(*place) }?;
        let h = std::mem::replace(place, std::ptr::null_mut());
        // SAFETY: `h` came from Box::into_raw in quiver_tagged_open, is dropped on its
        // own thread (checked), and freed once: the caller's variable no longer holds it.
        drop(unsafe { Box::from_raw(h) });
        Ok(())
    })
}

/// Sends the `len` bytes at `data` to rank `dest` with `tag`; returns when the buffer may
/// be reused. A message longer than what is pushed waits for the receiver to post a
/// matching receive: two ranks that both send such a message to each other before
/// receiving wait for ever (use `quiver_tagged_isend`).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `data` is readable for `len` bytes (NULL when
/// `len` is 0 is allowed).
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_send(
    t: *const quiver_tagged,
    dest: u32,
    tag: u32,
    data: *const c_void,
    len: usize,
) -> quiver_error {
    // SAFETY: the contract, passed on.
    unsafe { send(t, (dest, tag, data, len), false) }
}

/// Sends the `len` bytes at `data` to rank `dest` with `tag` synchronously (MPI's
/// `MPI_Ssend`): returns once a receive at `dest` has taken the message, never before,
/// whatever its length. Two ranks that both send this way to each other before receiving
/// wait for ever (use `quiver_tagged_issend`).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `data` is readable for `len` bytes (NULL when
/// `len` is 0 is allowed).
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_ssend(
    t: *const quiver_tagged,
    dest: u32,
    tag: u32,
    data: *const c_void,
    len: usize,
) -> quiver_error {
    // SAFETY: the contract, passed on.
    unsafe { send(t, (dest, tag, data, len), true) }
}

/// `quiver_tagged_send` (`sync`: `quiver_tagged_ssend`).
///
/// # Safety
///
/// As `quiver_tagged_send`.
unsafe fn send(
    t: *const quiver_tagged,
    (dest, tag, data, len): (u32, u32, *const c_void, usize),
    sync: bool,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        let tag = send_tag(tag)?;
        // SAFETY: `data` is readable for `len` bytes (the contract).
        let data = unsafe { bytes(data.cast(), len, "data") }?;
        Ok(if sync {
            h.tagged.ssend(dest, tag, data)
        } else {
            h.tagged.send(dest, tag, data)
        }?)
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Receives the first message that matches (`src`, `tag`; `QUIVER_ANY_SOURCE`,
/// `QUIVER_ANY_TAG` match any) into the `cap` bytes at `buf`; its status at `*status`
/// (if not NULL). `QUIVER_ERR_TRUNCATED` when it is longer than `cap`: `buf` holds its
/// start and the status its length.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `buf` is writable for `cap` bytes (NULL when
/// `cap` is 0 is allowed); `status` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_recv(
    t: *const quiver_tagged,
    buf: *mut c_void,
    cap: usize,
    src: u32,
    tag: u32,
    status: *mut quiver_status,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        let buf = buf.cast::<u8>();
        check_buffer(buf, cap, "buf")?;
        let slice: &mut [u8] = if cap == 0 {
            &mut []
        } else {
            // SAFETY: non-NULL (checked), writable for `cap` bytes and used by nobody
            // else during the call (the contract).
            unsafe { std::slice::from_raw_parts_mut(buf, cap) }
        };
        let (st, outcome) = status_of(h.tagged.recv(slice, src_of(src), tag_of(tag)));
        // SAFETY: `status` is NULL or writable (the contract).
        unsafe { put_status(status, st) };
        outcome
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Whether a message that matches (`src`, `tag`) has arrived, without receiving it:
/// `*found`, and its status at `*status` (if not NULL) when found.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `found` and `status` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_iprobe(
    t: *const quiver_tagged,
    src: u32,
    tag: u32,
    found: *mut bool,
    status: *mut quiver_status,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `found` is NULL or writable (the contract).
        let found = unsafe { Out::new(found, "found") }?;
        let s = h.tagged.iprobe(src_of(src), tag_of(tag))?;
        found.put(s.is_some());
        if let Some(s) = s {
            // SAFETY: `status` is NULL or writable (the contract).
            unsafe { put_status(status, done_status(s)) };
        }
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Waits for a message that matches (`src`, `tag`) and writes its status at `*status`
/// without receiving it.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `status` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_probe(
    t: *const quiver_tagged,
    src: u32,
    tag: u32,
    status: *mut quiver_status,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `status` is NULL or writable (the contract).
        let out = unsafe { Out::new(status, "status") }?;
        out.put(done_status(h.tagged.probe(src_of(src), tag_of(tag))?));
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Registers `raw` under a new request number.
fn register(h: &quiver_tagged, raw: RawRequest) -> quiver_request {
    let id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
    h.requests.borrow_mut().insert(id, raw);
    id
}

/// Takes the pending operation of request `id` out of the table.
fn take(h: &quiver_tagged, id: quiver_request) -> Result<RawRequest, Failure> {
    h.requests
        .borrow_mut()
        .remove(&id)
        .ok_or_else(|| unknown(id))
}

fn unknown(id: quiver_request) -> Failure {
    if id == QUIVER_REQUEST_NULL {
        Failure::invalid("the request is QUIVER_REQUEST_NULL")
    } else {
        Failure::invalid(format!(
            "request {id} is not pending on this tagged endpoint (completed or abandoned \
             already, or another endpoint's)"
        ))
    }
}

/// Starts sending the `len` bytes at `data` to `dest` with `tag` and stores the request
/// at `*req`. The buffer must stay unchanged until the request completes (a wait, a
/// test that says done) or is abandoned, or the endpoint is closed.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `data` is readable for `len` bytes, and not
/// written, until the operation ends as above; `req` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_isend(
    t: *const quiver_tagged,
    dest: u32,
    tag: u32,
    data: *const c_void,
    len: usize,
    req: *mut quiver_request,
) -> quiver_error {
    // SAFETY: the contract, passed on.
    unsafe { isend(t, (dest, tag, data, len), req, false) }
}

/// `quiver_tagged_isend` of a synchronous send (MPI's `MPI_Issend`): the request
/// completes once a receive at `dest` has taken the message, never before (one that no
/// receive takes never completes: `quiver_tagged_abandon` lets it go).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// As `quiver_tagged_isend`.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_issend(
    t: *const quiver_tagged,
    dest: u32,
    tag: u32,
    data: *const c_void,
    len: usize,
    req: *mut quiver_request,
) -> quiver_error {
    // SAFETY: the contract, passed on.
    unsafe { isend(t, (dest, tag, data, len), req, true) }
}

/// `quiver_tagged_isend` (`sync`: `quiver_tagged_issend`).
///
/// # Safety
///
/// As `quiver_tagged_isend`.
unsafe fn isend(
    t: *const quiver_tagged,
    (dest, tag, data, len): (u32, u32, *const c_void, usize),
    req: *mut quiver_request,
    sync: bool,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `req` is NULL or writable (the contract).
        let out = unsafe { Out::new(req, "req") }?;
        let tag = send_tag(tag)?;
        // SAFETY: `data` is readable for `len` bytes (the contract); this checks the
        // pointer and the length.
        unsafe { bytes(data.cast(), len, "data") }?;
        // SAFETY: `data` is readable for `len` bytes, and not written, until the
        // operation ends (the contract), which is what isend_raw and issend_raw ask.
        let raw = unsafe {
            if sync {
                h.tagged.issend_raw(dest, tag, data.cast(), len)
            } else {
                h.tagged.isend_raw(dest, tag, data.cast(), len)
            }
        }?;
        out.put(register(h, raw));
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Posts a receive of the first message that matches (`src`, `tag`) into the `cap`
/// bytes at `buf` and stores the request at `*req`. Nobody may read or write the buffer
/// until the request completes or is abandoned, or the endpoint is closed.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `buf` is writable for `cap` bytes, and used by
/// nobody else, until the operation ends as above; `req` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_irecv(
    t: *const quiver_tagged,
    buf: *mut c_void,
    cap: usize,
    src: u32,
    tag: u32,
    req: *mut quiver_request,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `req` is NULL or writable (the contract).
        let out = unsafe { Out::new(req, "req") }?;
        check_buffer(buf.cast(), cap, "buf")?;
        // SAFETY: `buf` is writable for `cap` bytes, by nobody else, until the operation
        // ends (the contract), which is what irecv_raw asks.
        let raw = unsafe {
            h.tagged
                .irecv_raw(buf.cast(), cap, src_of(src), tag_of(tag))
        }?;
        out.put(register(h, raw));
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Reads the request variable at `req`.
///
/// # Safety
///
/// `req` is NULL or readable and writable.
unsafe fn request_at(
    req: *mut quiver_request,
) -> Result<(Out<quiver_request>, quiver_request), Failure> {
    // SAFETY: NULL or readable and writable (the contract).
    let out = unsafe { Out::new(req, "req") }?;
    // SAFETY: non-NULL (checked) and readable (the contract).
    let id = unsafe { req.read() };
    Ok((out, id))
}

/// Makes progress and says at `*done` whether the operation of `*req` is complete. When
/// it is, `*req` becomes `QUIVER_REQUEST_NULL`, its status goes to `*status` (if not
/// NULL) and the call returns the operation's result (`QUIVER_ERR_TRUNCATED`...). An
/// error with `*done` false is the progress's: the request stays pending.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `req` and `done` are NULL or writable (`req`
/// readable); `status` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_test(
    t: *const quiver_tagged,
    req: *mut quiver_request,
    done: *mut bool,
    status: *mut quiver_status,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `done` is NULL or writable, `req` NULL or readable and writable (the
        // contract).
        let (done, (place, id)) = unsafe { (Out::new(done, "done")?, request_at(req)?) };
        let raw = take(h, id)?;
        let complete = match h.tagged.test_raw(&raw) {
            Ok(c) => c,
            Err(e) => {
                h.requests.borrow_mut().insert(id, raw);
                done.put(false);
                return Err(e.into());
            }
        };
        done.put(complete);
        if !complete {
            h.requests.borrow_mut().insert(id, raw);
            return Ok(());
        }
        place.put(QUIVER_REQUEST_NULL);
        let (st, outcome) = status_of(h.tagged.wait_raw(raw));
        // SAFETY: `status` is NULL or writable (the contract).
        unsafe { put_status(status, st) };
        outcome
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Waits for the operation of `*req` to complete, sets `*req` to `QUIVER_REQUEST_NULL`,
/// writes its status at `*status` (if not NULL) and returns its result. A wait that
/// fails ends the operation too (its buffer is the caller's again).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `req` is NULL or readable and writable; `status`
/// is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_wait(
    t: *const quiver_tagged,
    req: *mut quiver_request,
    status: *mut quiver_status,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `req` is NULL or readable and writable (the contract).
        let (place, id) = unsafe { request_at(req) }?;
        let raw = take(h, id)?;
        place.put(QUIVER_REQUEST_NULL);
        let (st, outcome) = status_of(h.tagged.wait_raw(raw));
        // SAFETY: `status` is NULL or writable (the contract).
        unsafe { put_status(status, st) };
        outcome
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Like `quiver_tagged_wait`, waiting at most `timeout_us` microseconds:
/// `QUIVER_ERR_TIMEOUT` when the operation is still pending then (`*req` stays valid:
/// wait again, test, cancel or abandon it; `*status` untouched).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// As `quiver_tagged_wait`.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_wait_timeout(
    t: *const quiver_tagged,
    req: *mut quiver_request,
    timeout_us: u64,
    status: *mut quiver_status,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `req` is NULL or readable and writable (the contract).
        let (place, id) = unsafe { request_at(req) }?;
        let raw = take(h, id)?;
        let limit = Duration::from_micros(timeout_us);
        let Some(r) = h.tagged.wait_raw_within(&raw, limit) else {
            h.requests.borrow_mut().insert(id, raw);
            return Err(Error::Timeout(limit).into());
        };
        place.put(QUIVER_REQUEST_NULL);
        let (st, outcome) = status_of(r);
        // SAFETY: `status` is NULL or writable (the contract).
        unsafe { put_status(status, st) };
        outcome
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// The request numbers of a C array: (index, number) of every entry that is not
/// `QUIVER_REQUEST_NULL`, each checked pending on `h` and present once.
///
/// # Safety
///
/// `reqs` is readable for `n` requests when `n` > 0.
unsafe fn active(
    h: &quiver_tagged,
    reqs: *mut quiver_request,
    n: usize,
) -> Result<Vec<(usize, quiver_request)>, Failure> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if reqs.is_null() {
        return Err(Failure::null("reqs"));
    }
    if n > isize::MAX as usize / std::mem::size_of::<quiver_request>() {
        return Err(Failure::invalid(format!(
            "{n} requests are more than memory holds"
        )));
    }
    // SAFETY: non-NULL, readable for `n` requests (the contract), `n` within an
    // allocation's size (checked).
    let ids = unsafe { std::slice::from_raw_parts(reqs, n) };
    let table = h.requests.borrow();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        if id == QUIVER_REQUEST_NULL {
            continue;
        }
        if !table.contains_key(&id) {
            let mut f = unknown(id);
            f.message = format!("reqs[{i}]: {}", f.message);
            return Err(f);
        }
        if !seen.insert(id) {
            return Err(Failure::invalid(format!(
                "reqs[{i}]: request {id} appears twice"
            )));
        }
        out.push((i, id));
    }
    Ok(out)
}

/// Waits for one of the `n` requests at `reqs` to complete (entries that are
/// `QUIVER_REQUEST_NULL` are skipped): its index goes to `*index`, its status to
/// `*status` (if not NULL), its entry becomes `QUIVER_REQUEST_NULL`, and the call
/// returns its result. `QUIVER_ERR_INVALID_ARGUMENT` when no entry is pending (or one
/// is unknown, or given twice). An error with `*index` untouched is the wait's own: every
/// request stays pending.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `reqs` is readable and writable for `n`
/// requests; `index` is NULL or writable; `status` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_waitany(
    t: *const quiver_tagged,
    reqs: *mut quiver_request,
    n: usize,
    index: *mut usize,
    status: *mut quiver_status,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `index` is NULL or writable (the contract).
        let index = unsafe { Out::new(index, "index") }?;
        // SAFETY: `reqs` is readable for `n` requests (the contract).
        let live = unsafe { active(h, reqs, n) }?;
        if live.is_empty() {
            return Err(Failure::invalid("waitany on no pending request"));
        }
        let mut taken: Vec<(usize, quiver_request, RawRequest)> = Vec::with_capacity(live.len());
        for (i, id) in live {
            // Present: `active` checked every number, each once.
            let raw = take(h, id)?;
            taken.push((i, id, raw));
        }
        let refs: Vec<&RawRequest> = taken.iter().map(|(_, _, raw)| raw).collect();
        let outcome = h.tagged.wait_any_raw(&refs);
        drop(refs);
        let put_back = |rest: Vec<(usize, quiver_request, RawRequest)>| {
            let mut table = h.requests.borrow_mut();
            for (_, id, raw) in rest {
                table.insert(id, raw);
            }
        };
        let (k, r) = match outcome {
            Ok(v) => v,
            Err(e) => {
                put_back(taken);
                return Err(e.into());
            }
        };
        // The completed request is spent: it leaves the table for good.
        let (i, _, _spent) = taken.swap_remove(k);
        put_back(taken);
        // SAFETY: `i` < `n`, and `reqs` is writable for `n` requests (the contract).
        unsafe { reqs.add(i).write(QUIVER_REQUEST_NULL) };
        index.put(i);
        let (st, outcome) = status_of(r);
        // SAFETY: `status` is NULL or writable (the contract).
        unsafe { put_status(status, st) };
        outcome
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Waits for every one of the `n` requests at `reqs` (entries that are
/// `QUIVER_REQUEST_NULL` are skipped), sets each to `QUIVER_REQUEST_NULL`, and writes
/// each status at `statuses[i]` (if `statuses` is not NULL; an entry that was
/// `QUIVER_REQUEST_NULL` gets `error` `QUIVER_OK` and `len` 0). Returns `QUIVER_OK` when
/// all succeeded, else the first failure's code (each status has its own). Nothing is
/// waited for when an entry is unknown or given twice (`QUIVER_ERR_INVALID_ARGUMENT`).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `reqs` is readable and writable for `n`
/// requests; `statuses` is NULL or writable for `n` statuses.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_waitall(
    t: *const quiver_tagged,
    reqs: *mut quiver_request,
    n: usize,
    statuses: *mut quiver_status,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `reqs` is readable for `n` requests (the contract).
        let live = unsafe { active(h, reqs, n) }?;
        let put = |i: usize, st: quiver_status| {
            if !statuses.is_null() {
                // SAFETY: `i` < `n`, and a non-NULL `statuses` is writable for `n`
                // statuses (the contract).
                unsafe { statuses.add(i).write(st) };
            }
        };
        let none = quiver_status {
            peer: QUIVER_ANY_SOURCE,
            tag: QUIVER_ANY_TAG,
            len: 0,
            error: quiver_error::QUIVER_OK,
        };
        (0..n).for_each(|i| put(i, none));
        let mut first: Outcome = Ok(());
        for (i, id) in live {
            // Present: `active` checked every number, each once.
            let raw = take(h, id)?;
            // SAFETY: `i` < `n`, and `reqs` is writable for `n` requests (the contract).
            unsafe { reqs.add(i).write(QUIVER_REQUEST_NULL) };
            let (st, outcome) = status_of(h.tagged.wait_raw(raw));
            put(i, st);
            if first.is_ok() {
                first = outcome;
            }
        }
        first
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Cancels the receive of `req` if no message has matched it yet: `*cancelled` (if not
/// NULL) says whether it did. The request stays pending: its wait then gives
/// `QUIVER_ERR_CANCELLED`. A send is never cancelled.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `cancelled` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_cancel(
    t: *const quiver_tagged,
    req: quiver_request,
    cancelled: *mut bool,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `cancelled` is NULL or writable (the contract).
        let out = unsafe { Out::optional(cancelled) };
        let table = h.requests.borrow();
        let raw = table.get(&req).ok_or_else(|| unknown(req))?;
        let did = h.tagged.cancel_raw(raw);
        if let Some(out) = out {
            out.put(did);
        }
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Ends the operation of `*req` whether or not it is complete, so that its buffer may
/// be reused at once, and sets `*req` to `QUIVER_REQUEST_NULL`: a receive is withdrawn,
/// a send stops (its receiver's receive fails). For a wait the user interrupted.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `req` is NULL or readable and writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_abandon(
    t: *const quiver_tagged,
    req: *mut quiver_request,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `req` is NULL or readable and writable (the contract).
        let (place, id) = unsafe { request_at(req) }?;
        let raw = take(h, id)?;
        place.put(QUIVER_REQUEST_NULL);
        h.tagged.abandon_raw(raw);
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Handles every protocol message that has arrived; never waits.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_progress(t: *const quiver_tagged) -> quiver_error {
    // SAFETY: the contract is the caller's.
    unsafe { with(t, |h| Ok(h.tagged.progress()?)) }
}

/// Selects the push mode of later sends: `QUIVER_PUSH_PULL`, `QUIVER_PUSH_ZERO` or
/// `QUIVER_PUSH_ALL` (`QUIVER_ERR_INVALID_ARGUMENT` otherwise).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_set_push(
    t: *const quiver_tagged,
    mode: u32,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        let mode = match mode {
            QUIVER_PUSH_PULL => PushMode::Pull,
            QUIVER_PUSH_ZERO => PushMode::Zero,
            QUIVER_PUSH_ALL => PushMode::All,
            other => {
                return Err(Failure::invalid(format!(
                    "push mode {other} is not a QUIVER_PUSH_* value"
                )))
            }
        };
        h.tagged.set_push(mode);
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Sets BTP(1) and BTP(2), the bytes pushed before the receiver pulls, for later sends
/// in `QUIVER_PUSH_PULL` mode (BTP(1) is capped at one protocol message's payload).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_set_btp(
    t: *const quiver_tagged,
    btp1: usize,
    btp2: usize,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        h.tagged.set_btp(btp1, btp2);
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// The push mode and BTP(1), BTP(2) in force, at `*mode`, `*btp1`, `*btp2` (each may be
/// NULL).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; the outputs are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_push(
    t: *const quiver_tagged,
    mode: *mut u32,
    btp1: *mut usize,
    btp2: *mut usize,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: each is NULL or writable (the contract).
        let (mode, btp1, btp2) = unsafe {
            (
                Out::optional(mode),
                Out::optional(btp1),
                Out::optional(btp2),
            )
        };
        let (m, b1, b2) = h.tagged.push();
        let m = match m {
            PushMode::Pull => QUIVER_PUSH_PULL,
            PushMode::Zero => QUIVER_PUSH_ZERO,
            PushMode::All => QUIVER_PUSH_ALL,
        };
        if let Some(o) = mode {
            o.put(m);
        }
        if let Some(o) = btp1 {
            o.put(b1);
        }
        if let Some(o) = btp2 {
            o.put(b2);
        }
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// The tagged endpoint's counters, at `*stats`.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_stats(
    t: *const quiver_tagged,
    stats: *mut quiver_tagged_counters,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `stats` is NULL or writable (the contract).
        let out = unsafe { Out::new(stats, "stats") }?;
        out.put(h.tagged.stats().into());
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// The counters of the Directed Point endpoint under the tagged endpoint, at `*stats`.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_endpoint_stats(
    t: *const quiver_tagged,
    stats: *mut quiver_endpoint_counters,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `stats` is NULL or writable (the contract).
        let out = unsafe { Out::new(stats, "stats") }?;
        out.put(h.tagged.endpoint().stats().into());
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// The descriptor of the endpoint under the tagged endpoint, at `*fd`: readable when
/// protocol messages have arrived; call `quiver_tagged_progress` (or test) after it
/// signals. It belongs to the endpoint: do not close it.
///
/// Thread safety: only the thread that opened the endpoint (the descriptor itself may be
/// polled anywhere).
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `fd` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_fd(t: *const quiver_tagged, fd: *mut c_int) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `fd` is NULL or writable (the contract).
        let out = unsafe { Out::new(fd, "fd") }?;
        out.put(h.tagged.endpoint().as_raw_fd());
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Allocates `len` bytes (zero-filled) from the job's shared pool and stores their
/// address at `*data`. A message sent from them to a rank of the same node is read in
/// place by the receiver (one copy, no cross-memory attach needed). Free them with
/// `quiver_tagged_free_shared`; closing the endpoint frees what is left.
/// `QUIVER_ERR_INVALID_ARGUMENT` when `len` is 0.
///
/// Thread safety: only the thread that opened the endpoint (the memory itself is the
/// caller's to share as it likes).
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; `data` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_alloc_shared(
    t: *const quiver_tagged,
    len: usize,
    data: *mut *mut c_void,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        // SAFETY: `data` is NULL or writable (the contract).
        let out = unsafe { Out::new(data, "data") }?;
        if len == 0 {
            return Err(Failure::invalid("a shared buffer of 0 bytes"));
        }
        let mut buf = h.tagged.alloc_shared(len)?;
        let at = buf.as_mut_ptr();
        // SAFETY: the buffer borrows `h.tagged`, which lives in the boxed handle and never
        // moves; the table that keeps the buffer is emptied before `tagged` is dropped
        // (`quiver_tagged`'s Drop), so the extended borrow never outlives it.
        let buf = unsafe { std::mem::transmute::<SharedBuf<'_>, SharedBuf<'static>>(buf) };
        h.shared.borrow_mut().insert(at as usize, buf);
        out.put(at.cast());
        Ok(())
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}

/// Frees the shared buffer at `data` (an address `quiver_tagged_alloc_shared` gave).
/// `QUIVER_ERR_INVALID_ARGUMENT` for any other address, or one freed already. No
/// operation may still use it.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `t` is NULL or a live tagged handle; no pending operation uses the buffer.
#[no_mangle]
pub unsafe extern "C" fn quiver_tagged_free_shared(
    t: *const quiver_tagged,
    data: *mut c_void,
) -> quiver_error {
    let body = |h: &quiver_tagged| -> Outcome {
        let buf = h.shared.borrow_mut().remove(&(data as usize));
        match buf {
            Some(buf) => {
                drop(buf);
                Ok(())
            }
            None => Err(Failure::invalid(format!(
                "{data:p} is not a shared buffer of this tagged endpoint"
            ))),
        }
    };
    // SAFETY: `t` is NULL or a live handle (the contract).
    unsafe { with(t, body) }
}
