//! One-sided operations at the C boundary: `quiver_rma` (a process's one-sided endpoint:
//! put, get, strided and indexed transfers, remote atomics, flush, the barrier and the
//! combining tree) and `quiver_window` (a window of the job, allocated from the node's
//! shared pool: this rank's part is read and written in place through the pointer of
//! `quiver_window_info`).
//!
//! Windows are allocated in the same order on every rank (`quiver_rma_allocate`, as
//! `MPI_Win_allocate`) and freed collectively (`quiver_rma_free`). Memory a C program
//! owns cannot be handed over as a window (Rust's `Rma::register` takes a `Vec`): allocate
//! the window and work in it.
//!
//! `Rma` is neither `Send` nor `Sync`: every call checks that it runs on the thread that
//! opened the handle (`QUIVER_ERR_WRONG_THREAD` otherwise); so do the window calls,
//! on the thread that allocated the window.

use crate::error::{bytes, check_buffer, ffi, handle, quiver_error, Failure, Out, Outcome};
use crate::job::quiver_job;
use crate::tagged::this_thread;
use quiver_rs::rma::{Combine, Rma, RmaStats, Strided, Window};

/// A process's one-sided endpoint (opaque), bound to the thread that opened it. Opened
/// by `quiver_rma_open`, closed by `quiver_rma_close`.
#[allow(non_camel_case_types)]
pub struct quiver_rma {
    /// The opening thread's number, read before anything else.
    thread: u64,
    rma: Rma,
}

/// A window of the job (opaque), this rank's part of it; bound to the thread that
/// allocated it. Made by `quiver_rma_allocate`, ended by `quiver_rma_free`.
#[allow(non_camel_case_types)]
pub struct quiver_window {
    thread: u64,
    window: Window,
}

/// A strided layout in a window: `count` elements of `elem` bytes, element `i` at byte
/// `offset + i * stride` (a column of a matrix, a 2-D block).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct quiver_strided {
    pub offset: u64,
    pub stride: u64,
    pub elem: u64,
    pub count: u64,
}

/// `quiver_rma_combine`: the sum (wrapping).
pub const QUIVER_COMBINE_SUM: u32 = 0;
/// `quiver_rma_combine`: the largest.
pub const QUIVER_COMBINE_MAX: u32 = 1;
/// `quiver_rma_combine`: the smallest.
pub const QUIVER_COMBINE_MIN: u32 = 2;
/// `quiver_rma_combine`: bitwise and.
pub const QUIVER_COMBINE_AND: u32 = 3;
/// `quiver_rma_combine`: bitwise or.
pub const QUIVER_COMBINE_OR: u32 = 4;

/// The counters of a process's one-sided endpoint (`quiver_rma_stats`); the fields of
/// the Rust `RmaStats`, documented there.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct quiver_rma_counters {
    pub puts: u64,
    pub gets: u64,
    pub atomics: u64,
    pub direct: u64,
    pub puts_applied: u64,
    pub served: u64,
    pub refused: u64,
    pub malformed: u64,
    pub accumulates: u64,
    pub busy: u64,
}

impl From<RmaStats> for quiver_rma_counters {
    fn from(s: RmaStats) -> Self {
        // Every field named: a new counter fails to compile here until C has it too.
        let RmaStats {
            puts,
            gets,
            atomics,
            accumulates,
            direct,
            puts_applied,
            served,
            busy,
            refused,
            malformed,
        } = s;
        quiver_rma_counters {
            puts,
            gets,
            atomics,
            direct,
            puts_applied,
            served,
            refused,
            malformed,
            accumulates,
            busy,
        }
    }
}

/// The handle behind `p` when this thread made it (`owner` reads its thread).
fn on_this_thread<'a, T>(
    h: Option<&'a T>,
    owner: impl Fn(&T) -> u64,
    what: &str,
) -> Result<&'a T, Failure> {
    let h = h.ok_or_else(|| Failure::null(what))?;
    if owner(h) != this_thread() {
        return Err(Failure {
            code: quiver_error::QUIVER_ERR_WRONG_THREAD,
            message: format!("{what} is used only by the thread that made it"),
        });
    }
    Ok(h)
}

/// Runs `body` on the endpoint at `r`.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`.
unsafe fn with(r: *const quiver_rma, body: impl FnOnce(&Rma) -> Outcome) -> quiver_error {
    ffi(|| {
        // SAFETY: `r` is NULL or a live handle (the contract); `thread` is written once,
        // before the handle is handed out, so reading it from any thread is no race.
        let rma = on_this_thread(unsafe { r.as_ref() }, |h| h.thread, "r")?;
        body(&rma.rma)
    })
}

/// Runs `body` on the endpoint at `r` and the window at `w`.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`; `w` is NULL or a live `quiver_window`.
unsafe fn with_window(
    r: *const quiver_rma,
    w: *const quiver_window,
    body: impl FnOnce(&Rma, &Window) -> Outcome,
) -> quiver_error {
    // SAFETY: as for `with`, for both handles (the contract).
    unsafe {
        with(r, |rma| {
            let window = on_this_thread(w.as_ref(), |h| h.thread, "w")?;
            body(rma, &window.window)
        })
    }
}

/// Opens this process's one-sided endpoint on `dpid` (every rank of the job opens one
/// on the same DPID) into `*r`. With the offload engine (`QUIVER_RELIABILITY=offload`)
/// other nodes' requests are served on its thread; otherwise inside this process's
/// calls of its endpoint.
///
/// Thread safety: any thread; the endpoint is then bound to it.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `r` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_open(
    job: *const quiver_job,
    dpid: u16,
    r: *mut *mut quiver_rma,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle, `r` NULL or writable (the contract).
        let (j, out) = unsafe { (handle(job, "job")?, Out::new(r, "r")?) };
        let rma = Rma::open(&j.job, dpid)?;
        out.put(Box::into_raw(Box::new(quiver_rma {
            thread: this_thread(),
            rma,
        })));
        Ok(())
    })
}

/// Closes the endpoint at `*r` (small puts still combined leave first) and sets `*r` to
/// NULL. Free the windows first (`quiver_rma_free`, collective).
///
/// Thread safety: only the thread that opened it.
///
/// # Safety
///
/// `r` is NULL or points to NULL or to a live `quiver_rma`.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_close(r: *mut *mut quiver_rma) -> quiver_error {
    ffi(|| {
        // SAFETY: `r` is NULL or a valid place (the contract).
        let place = unsafe { r.as_mut() }.ok_or_else(|| Failure::null("r"))?;
        // SAFETY: `*place` is NULL or a live handle (the contract).
        on_this_thread(unsafe { place.as_ref() }, |h| h.thread, "r")?;
        let h = std::mem::replace(place, std::ptr::null_mut());
        // SAFETY: `h` came from Box::into_raw in quiver_rma_open, is dropped on its own
        // thread (checked) and once: the caller's variable no longer holds it.
        drop(unsafe { Box::from_raw(h) });
        Ok(())
    })
}

/// How waits poll before they sleep: `spin_us` microseconds, 0 to sleep at once, -1
/// never to sleep (by default as `QUIVER_WAIT` says).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_set_wait(r: *const quiver_rma, spin_us: i64) -> quiver_error {
    let body = |rma: &Rma| -> Outcome {
        rma.set_wait(crate::ports::wait_mode(spin_us)?);
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with(r, body) }
}

/// Allocates the job's next window, this rank's part `len` bytes (zeroed; each rank its
/// own length), into `*w`. Every rank allocates its windows in the same order.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`; `w` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_allocate(
    r: *const quiver_rma,
    len: usize,
    w: *mut *mut quiver_window,
) -> quiver_error {
    // SAFETY: `w` is NULL or writable (the contract).
    let out = match unsafe { Out::new(w, "w") } {
        Ok(o) => o,
        Err(f) => return ffi(|| Err(f)),
    };
    let body = |rma: &Rma| -> Outcome {
        let window = rma.allocate(len)?;
        out.put(Box::into_raw(Box::new(quiver_window {
            thread: this_thread(),
            window,
        })));
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with(r, body) }
}

/// Frees the window at `*w` on every rank (collective: every rank calls it for the same
/// window; puts in flight are flushed and the ranks meet first) and sets `*w` to NULL,
/// also when it fails.
///
/// Thread safety: only the thread that opened the endpoint and allocated the window.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`; `w` is NULL or points to NULL or to a live
/// `quiver_window` of this endpoint.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_free(
    r: *const quiver_rma,
    w: *mut *mut quiver_window,
) -> quiver_error {
    ffi(|| {
        // SAFETY: the contract: NULL or live handles, `w` NULL or a valid place.
        let rma = on_this_thread(unsafe { r.as_ref() }, |h| h.thread, "r")?;
        // SAFETY: as above.
        let place = unsafe { w.as_mut() }.ok_or_else(|| Failure::null("w"))?;
        // SAFETY: as above.
        on_this_thread(unsafe { place.as_ref() }, |h| h.thread, "w")?;
        let h = std::mem::replace(place, std::ptr::null_mut());
        // SAFETY: `h` came from Box::into_raw in quiver_rma_allocate and is taken once
        // (the caller's variable no longer holds it).
        let window = unsafe { Box::from_raw(h) }.window;
        rma.rma.free(window)?;
        Ok(())
    })
}

/// This rank's part of window `w`: its number in the job, its length and where it lies
/// (`*base`, valid until the window is freed; read and write it in place, as other
/// ranks may with puts and gets: concurrent accesses to the same bytes are the
/// program's race). Any output may be NULL.
///
/// Thread safety: only the thread that allocated the window.
///
/// # Safety
///
/// `w` is NULL or a live `quiver_window`; each output is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_window_info(
    w: *const quiver_window,
    number: *mut u32,
    len: *mut usize,
    base: *mut *mut u8,
) -> quiver_error {
    ffi(|| {
        // SAFETY: the contract: NULL or a live handle.
        let h = on_this_thread(unsafe { w.as_ref() }, |h| h.thread, "w")?;
        // SAFETY: each output NULL or writable (the contract).
        unsafe {
            if let Some(o) = Out::optional(number) {
                o.put(h.window.number());
            }
            if let Some(o) = Out::optional(len) {
                o.put(h.window.len());
            }
            if let Some(o) = Out::optional(base) {
                o.put(h.window.as_ptr());
            }
        }
        Ok(())
    })
}

/// Puts the `len` bytes at `src` at `offset` of window `w` at `rank`. Returns once
/// `src` may be reused; `quiver_rma_flush` says when the bytes are in the window.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles; `src` NULL or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_put(
    r: *const quiver_rma,
    rank: u32,
    w: *const quiver_window,
    offset: u64,
    src: *const u8,
    len: usize,
) -> quiver_error {
    let body = |rma: &Rma, w: &Window| -> Outcome {
        // SAFETY: `src` readable for `len` bytes (the contract).
        let data = unsafe { bytes(src, len, "src") }?;
        Ok(rma.put(rank, w, offset, data)?)
    };
    // SAFETY: the caller's contract.
    unsafe { with_window(r, w, body) }
}

/// Puts the `len` bytes at `src` at `offset` of window `w` at `rank`, then adds 1 to the
/// 64-bit word at `counter` (8-byte aligned) of the same window, after the bytes are
/// in place: the target waits for arrivals with `quiver_rma_wait_counter`. `len` 0
/// only counts.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles; `src` NULL or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_put_notify(
    r: *const quiver_rma,
    rank: u32,
    w: *const quiver_window,
    offset: u64,
    src: *const u8,
    len: usize,
    counter: u64,
) -> quiver_error {
    let body = |rma: &Rma, w: &Window| -> Outcome {
        // SAFETY: `src` readable for `len` bytes (the contract).
        let data = unsafe { bytes(src, len, "src") }?;
        Ok(rma.put_notify(rank, w, offset, data, counter)?)
    };
    // SAFETY: the caller's contract.
    unsafe { with_window(r, w, body) }
}

/// Waits until the word at `counter` of this rank's part of window `w` holds at least
/// `n`, and takes `n` from it (making progress meanwhile).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_wait_counter(
    r: *const quiver_rma,
    w: *const quiver_window,
    counter: u64,
    n: u64,
) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe { with_window(r, w, |rma, w| Ok(rma.wait_counter(w, counter, n)?)) }
}

/// Copies `len` bytes at `offset` of window `w` at `rank` into `dst`; returns with them.
/// When it fails half-way (the target refused a later part, its rank failed) the start
/// of `dst` may hold bytes already.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles; `dst` NULL or writable for `len` bytes, which nothing
/// else touches during the call.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_get(
    r: *const quiver_rma,
    rank: u32,
    w: *const quiver_window,
    offset: u64,
    dst: *mut u8,
    len: usize,
) -> quiver_error {
    let body = |rma: &Rma, w: &Window| -> Outcome {
        check_buffer(dst, len, "dst")?;
        let out: &mut [u8] = if len == 0 {
            &mut []
        } else {
            // SAFETY: non-NULL (checked), writable for `len` bytes and untouched by
            // others during the call (the contract).
            unsafe { std::slice::from_raw_parts_mut(dst, len) }
        };
        Ok(rma.get(rank, w, offset, out)?)
    };
    // SAFETY: the caller's contract.
    unsafe { with_window(r, w, body) }
}

/// Copies the elements of `src` (element `i` at `i * src_stride`; `src_len` bytes in
/// all) to the strided layout `*dst` of window `w` at `rank`. Completion as
/// `quiver_rma_put`.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles; `dst` NULL or readable; `src` NULL or readable for
/// `src_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_put_strided(
    r: *const quiver_rma,
    rank: u32,
    w: *const quiver_window,
    dst: *const quiver_strided,
    src: *const u8,
    src_len: usize,
    src_stride: u64,
) -> quiver_error {
    let body = |rma: &Rma, w: &Window| -> Outcome {
        // SAFETY: `dst` NULL or readable, `src` readable for `src_len` (the contract).
        let (layout, data) = unsafe { (handle(dst, "dst")?, bytes(src, src_len, "src")?) };
        Ok(rma.put_strided(rank, w, strided(layout), data, src_stride)?)
    };
    // SAFETY: the caller's contract.
    unsafe { with_window(r, w, body) }
}

/// Copies the strided layout `*src` of window `w` at `rank` into `dst` (element `i` at
/// `i * dst_stride`; `dst_len` bytes in all).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles; `src` NULL or readable; `dst` NULL or writable for
/// `dst_len` bytes, which nothing else touches during the call.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_get_strided(
    r: *const quiver_rma,
    rank: u32,
    w: *const quiver_window,
    src: *const quiver_strided,
    dst: *mut u8,
    dst_len: usize,
    dst_stride: u64,
) -> quiver_error {
    let body = |rma: &Rma, w: &Window| -> Outcome {
        // SAFETY: `src` NULL or readable (the contract).
        let layout = unsafe { handle(src, "src") }?;
        let out = writable(dst, dst_len, "dst")?;
        Ok(rma.get_strided(rank, w, strided(layout), out, dst_stride)?)
    };
    // SAFETY: the caller's contract.
    unsafe { with_window(r, w, body) }
}

/// Copies `count` elements of `elem` bytes from `src` (element `i` at
/// `src_offsets[i]`) to window `w` at `rank` (element `i` at `dst_offsets[i]`).
/// Completion as `quiver_rma_put`.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles; `dst_offsets` and `src_offsets` NULL or readable for
/// `count` values; `src` NULL or readable for `src_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_put_indexed(
    r: *const quiver_rma,
    rank: u32,
    w: *const quiver_window,
    dst_offsets: *const u64,
    src: *const u8,
    src_len: usize,
    src_offsets: *const u64,
    count: usize,
    elem: u64,
) -> quiver_error {
    let body = |rma: &Rma, w: &Window| -> Outcome {
        // SAFETY: the lists readable for `count` values, `src` for `src_len` bytes.
        let (dsts, srcs, data) = unsafe {
            (
                offsets(dst_offsets, count, "dst_offsets")?,
                offsets(src_offsets, count, "src_offsets")?,
                bytes(src, src_len, "src")?,
            )
        };
        Ok(rma.put_indexed(rank, w, dsts, data, srcs, elem)?)
    };
    // SAFETY: the caller's contract.
    unsafe { with_window(r, w, body) }
}

/// Copies `count` elements of `elem` bytes of window `w` at `rank` (element `i` at
/// `src_offsets[i]`) into `dst` (element `i` at `dst_offsets[i]`; `dst_len` bytes).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles; `src_offsets` and `dst_offsets` NULL or readable for
/// `count` values; `dst` NULL or writable for `dst_len` bytes, which nothing else
/// touches during the call.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_get_indexed(
    r: *const quiver_rma,
    rank: u32,
    w: *const quiver_window,
    src_offsets: *const u64,
    dst: *mut u8,
    dst_len: usize,
    dst_offsets: *const u64,
    count: usize,
    elem: u64,
) -> quiver_error {
    let body = |rma: &Rma, w: &Window| -> Outcome {
        // SAFETY: the lists readable for `count` values (the contract).
        let (srcs, dsts) = unsafe {
            (
                offsets(src_offsets, count, "src_offsets")?,
                offsets(dst_offsets, count, "dst_offsets")?,
            )
        };
        let out = writable(dst, dst_len, "dst")?;
        Ok(rma.get_indexed(rank, w, srcs, out, dsts, elem)?)
    };
    // SAFETY: the caller's contract.
    unsafe { with_window(r, w, body) }
}

/// Adds `value` to the 64-bit word at `offset` (8-byte aligned) of window `w` at
/// `rank`, atomically; `*old` (may be NULL) gets the value before.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles; `old` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_fetch_add(
    r: *const quiver_rma,
    rank: u32,
    w: *const quiver_window,
    offset: u64,
    value: u64,
    old: *mut u64,
) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe { atomic(r, w, old, |rma, w| rma.fetch_add(rank, w, offset, value)) }
}

/// Writes `desired` to the 64-bit word at `offset` of window `w` at `rank` if it holds
/// `expected`, atomically; `*old` (may be NULL) gets the value it held (`expected` when
/// the swap happened).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles; `old` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_compare_swap(
    r: *const quiver_rma,
    rank: u32,
    w: *const quiver_window,
    offset: u64,
    expected: u64,
    desired: u64,
    old: *mut u64,
) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe {
        atomic(r, w, old, |rma, w| {
            rma.compare_swap(rank, w, offset, expected, desired)
        })
    }
}

/// Writes `value` to the 64-bit word at `offset` of window `w` at `rank`, atomically;
/// `*old` (may be NULL) gets the value before.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r`, `w` NULL or live handles; `old` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_swap(
    r: *const quiver_rma,
    rank: u32,
    w: *const quiver_window,
    offset: u64,
    value: u64,
    old: *mut u64,
) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe { atomic(r, w, old, |rma, w| rma.swap(rank, w, offset, value)) }
}

/// Returns once every put this rank issued to `rank` is in its window (a put the target
/// refused is reported here, as `QUIVER_ERR_RMA`).
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_flush(r: *const quiver_rma, rank: u32) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe { with(r, |rma| Ok(rma.flush(rank)?)) }
}

/// `quiver_rma_flush` of every rank.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_flush_all(r: *const quiver_rma) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe { with(r, |rma| Ok(rma.flush_all()?)) }
}

/// Waits until every rank of the job called it (the fastest barrier quiver has: shared
/// cache lines inside a node, a dissemination between nodes). It does not flush.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_barrier(r: *const quiver_rma) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe { with(r, |rma| Ok(rma.barrier()?)) }
}

/// Combines `value` from every rank with `op` (`QUIVER_COMBINE_*`; up a binomial tree and back down);
/// `*result` gets the result on every rank. Every rank calls it with the same `op`.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`; `result` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_combine(
    r: *const quiver_rma,
    value: u64,
    op: u32,
    result: *mut u64,
) -> quiver_error {
    let body = |rma: &Rma| -> Outcome {
        // SAFETY: `result` NULL or writable (the contract).
        let out = unsafe { Out::new(result, "result") }?;
        let op = match op {
            QUIVER_COMBINE_SUM => Combine::Sum,
            QUIVER_COMBINE_MAX => Combine::Max,
            QUIVER_COMBINE_MIN => Combine::Min,
            QUIVER_COMBINE_AND => Combine::And,
            QUIVER_COMBINE_OR => Combine::Or,
            other => {
                return Err(Failure::invalid(format!(
                    "op {other}: not one of the QUIVER_COMBINE_* values"
                )))
            }
        };
        out.put(rma.combine(value, op)?);
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with(r, body) }
}

/// Serves what other ranks asked of this one and takes the answers that came, without
/// waiting.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_progress(r: *const quiver_rma) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe { with(r, |rma| Ok(rma.progress()?)) }
}

/// The endpoint's counters into `*out`.
///
/// Thread safety: only the thread that opened the endpoint.
///
/// # Safety
///
/// `r` is NULL or a live `quiver_rma`; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_rma_stats(
    r: *const quiver_rma,
    out: *mut quiver_rma_counters,
) -> quiver_error {
    let body = |rma: &Rma| -> Outcome {
        // SAFETY: `out` NULL or writable (the contract).
        unsafe { Out::new(out, "out") }?.put(rma.stats().into());
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with(r, body) }
}

/// A remote atomic's call: its old value into `*old` when given.
///
/// # Safety
///
/// As the calling function's.
unsafe fn atomic(
    r: *const quiver_rma,
    w: *const quiver_window,
    old: *mut u64,
    op: impl FnOnce(&Rma, &Window) -> quiver_rs::Result<u64>,
) -> quiver_error {
    let body = |rma: &Rma, w: &Window| -> Outcome {
        let v = op(rma, w)?;
        // SAFETY: `old` NULL or writable (the contract).
        if let Some(o) = unsafe { Out::optional(old) } {
            o.put(v);
        }
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with_window(r, w, body) }
}

fn strided(s: &quiver_strided) -> Strided {
    Strided {
        offset: s.offset,
        stride: s.stride,
        elem: s.elem,
        count: s.count,
    }
}

/// A caller's writable buffer as a slice (checked as `check_buffer` does).
fn writable<'a>(dst: *mut u8, len: usize, what: &str) -> Result<&'a mut [u8], Failure> {
    check_buffer(dst, len, what)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: non-NULL (checked); the calling function's contract makes it writable for
    // `len` bytes that nothing else touches during the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(dst, len) })
}

/// `count` offsets at `p`.
///
/// # Safety
///
/// `p` is NULL or readable for `count` values, not written during `'a`.
unsafe fn offsets<'a>(p: *const u64, count: usize, what: &str) -> Result<&'a [u64], Failure> {
    if count == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::null(what));
    }
    if count > isize::MAX as usize / 8 {
        return Err(Failure::invalid(format!(
            "{what}: {count} offsets are too many"
        )));
    }
    // SAFETY: non-NULL, `count` readable values (the contract), fitting an allocation.
    Ok(unsafe { std::slice::from_raw_parts(p, count) })
}
