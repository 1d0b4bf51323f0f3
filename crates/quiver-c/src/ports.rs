//! GAMMA's ports at the C boundary: `quiver_ports` (binding a port's destination, buffer,
//! handler and error handler; sending; waiting on a port's signals; reading the last
//! message) and `quiver_delivery`, what a receiver handler is handed.
//!
//! A port's receive buffer is the library's: `quiver_ports_bind_buffer` gives the port a
//! buffer of the length asked for; a handler reads the message in place
//! (`quiver_delivery_info`, valid until the handler returns) and the application copies
//! the last one out (`quiver_ports_read`). A handler is a C function with a context
//! pointer: it runs where progress runs, inside the application's next ports call on the
//! opening thread, or, with the offload engine (`QUIVER_RELIABILITY=offload`), on the
//! engine's thread for messages from other nodes, so its context must be usable from
//! that thread. A handler must not call `quiver_ports_*` functions: it uses the
//! `quiver_delivery_*` functions on the delivery it was handed (a ports call from inside a handler fails
//! with `QUIVER_ERR_INVALID_ARGUMENT`, or `QUIVER_ERR_WRONG_THREAD` on the engine's
//! thread).
//!
//! `Ports` is neither `Send` nor `Sync`: every call checks that it runs on the thread
//! that opened the handle (`QUIVER_ERR_WRONG_THREAD` otherwise).

use crate::error::{bytes, check_buffer, ffi, handle, quiver_error, Failure, Out, Outcome};
use crate::job::quiver_job;
use crate::tagged::this_thread;
use quiver_rs::ports::{Delivery, PortError, PortStats, Ports};
use quiver_rs::WaitMode;
use std::cell::Cell;
use std::ffi::c_void;
use std::time::Duration;

/// GAMMA's ports of one process (opaque), bound to the thread that opened them. Opened
/// by `quiver_ports_open`, closed by `quiver_ports_close`.
#[allow(non_camel_case_types)]
pub struct quiver_ports {
    /// The opening thread's number, read before anything else.
    thread: u64,
    /// A call on these ports is running (a handler it runs must not call in again).
    busy: Cell<bool>,
    ports: Ports,
}

/// Clears a handle's `busy` when the call ends, also by a panic.
struct Busy<'a>(&'a Cell<bool>);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// A message being delivered (opaque): what a receiver handler is handed, valid until
/// it returns.
#[allow(non_camel_case_types)]
pub struct quiver_delivery {
    _private: (),
}

/// A receiver handler: `delivery` is valid until it returns; `ctx` is the pointer given
/// with it to `quiver_ports_bind_handler`.
#[allow(non_camel_case_types)]
pub type quiver_port_handler =
    Option<unsafe extern "C" fn(delivery: *mut quiver_delivery, ctx: *mut c_void)>;

/// An error handler: `error` is valid until it returns.
#[allow(non_camel_case_types)]
pub type quiver_port_error_handler =
    Option<unsafe extern "C" fn(error: *const quiver_port_error, ctx: *mut c_void)>;

/// A message arrived on a port with no buffer bound (not delivered).
pub const QUIVER_PORT_NO_BUFFER: u32 = 1;
/// A message longer than the port's buffer arrived (not delivered, the buffer unchanged).
pub const QUIVER_PORT_OVERFLOW: u32 = 2;
/// A peer sent to the library's reserved port.
pub const QUIVER_PORT_RESERVED: u32 = 3;
/// A send through a port with no destination bound.
pub const QUIVER_PORT_NO_DESTINATION: u32 = 4;
/// The port's destination failed or closed.
pub const QUIVER_PORT_DESTINATION_FAILED: u32 = 5;
/// A send through the port failed for another reason.
pub const QUIVER_PORT_SEND_FAILED: u32 = 6;
/// A handler's answer found the outbox full (not sent).
pub const QUIVER_PORT_OUTBOX_FULL: u32 = 7;
/// An error of a kind this version of the C library has no number for.
pub const QUIVER_PORT_OTHER: u32 = 0;
/// The reserved port (GAMMA's barrier port): nobody binds it or sends to it.
#[allow(dead_code)] // read by C programs, through the header
pub const QUIVER_RESERVED_PORT: u8 = 255;

/// What goes to a port's error handler: `kind` (`QUIVER_PORT_*`), the port, and the
/// fields that kind has (the others 0): the peer's `rank` (the sender, or the failed
/// destination) and the port it sent through, the message's `len`, the buffer's
/// `capacity`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct quiver_port_error {
    pub kind: u32,
    pub port: u8,
    pub from_port: u8,
    pub rank: u32,
    pub len: u64,
    pub capacity: u64,
}

impl quiver_port_error {
    fn of(e: &PortError) -> quiver_port_error {
        let mut c = quiver_port_error {
            port: e.port(),
            ..Default::default()
        };
        match *e {
            PortError::NoBuffer { from, len, .. } | PortError::Reserved { from, len, .. } => {
                c.kind = if matches!(e, PortError::NoBuffer { .. }) {
                    QUIVER_PORT_NO_BUFFER
                } else {
                    QUIVER_PORT_RESERVED
                };
                (c.rank, c.from_port, c.len) = (from.rank, from.port, len as u64);
            }
            PortError::Overflow {
                from,
                len,
                capacity,
                ..
            } => {
                c.kind = QUIVER_PORT_OVERFLOW;
                (c.rank, c.from_port) = (from.rank, from.port);
                (c.len, c.capacity) = (len as u64, capacity as u64);
            }
            PortError::NoDestination { .. } => c.kind = QUIVER_PORT_NO_DESTINATION,
            PortError::DestinationFailed { rank, .. } => {
                (c.kind, c.rank) = (QUIVER_PORT_DESTINATION_FAILED, rank);
            }
            PortError::SendFailed { rank, .. } => {
                (c.kind, c.rank) = (QUIVER_PORT_SEND_FAILED, rank)
            }
            PortError::OutboxFull { .. } => c.kind = QUIVER_PORT_OUTBOX_FULL,
            _ => c.kind = QUIVER_PORT_OTHER,
        }
        c
    }
}

/// The counters of a process's ports (`quiver_ports_stats`); the fields of the Rust
/// `PortStats`, documented there.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct quiver_port_counters {
    pub sent: u64,
    pub bytes_sent: u64,
    pub send_waits: u64,
    pub delivered: u64,
    pub bytes_delivered: u64,
    pub forwarded: u64,
    pub errors: u64,
    pub malformed: u64,
    pub native_broadcasts: u64,
    pub ring_broadcasts: u64,
    pub deposits: u64,
    pub deposited: u64,
    pub parked: u64,
    pub landed: u64,
}

impl From<PortStats> for quiver_port_counters {
    fn from(s: PortStats) -> Self {
        quiver_port_counters {
            deposits: s.deposits,
            deposited: s.deposited,
            parked: s.parked,
            landed: s.landed,
            sent: s.sent,
            bytes_sent: s.bytes_sent,
            send_waits: s.send_waits,
            delivered: s.delivered,
            bytes_delivered: s.bytes_delivered,
            forwarded: s.forwarded,
            native_broadcasts: s.native_broadcasts,
            ring_broadcasts: s.ring_broadcasts,
            errors: s.errors,
            malformed: s.malformed,
        }
    }
}

/// A C handler and its context, called from the thread where progress runs.
#[derive(Clone, Copy)]
struct Callback<F> {
    f: F,
    ctx: *mut c_void,
}

// SAFETY: `F` is a C function pointer (Copy + Send); the context pointer is the C
// caller's, whose contract (quiver_ports_bind_handler's Safety) is that the handler may
// be called with it from the offload engine's thread; quiver only passes it back.
unsafe impl<F: Copy + Send> Send for Callback<F> {}

/// The handle behind an argument, on its own thread and not inside one of its calls (a
/// handler that calls back into its ports would find the table borrowed or locked).
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
unsafe fn ports<'a>(p: *const quiver_ports) -> Result<&'a quiver_ports, Failure> {
    if p.is_null() {
        return Err(Failure::null("p"));
    }
    // SAFETY: `p` is a live handle (the contract); `thread` is written once, before the
    // handle is handed out, so reading it from any thread is no race.
    let owner = unsafe { std::ptr::addr_of!((*p).thread).read() };
    if owner != this_thread() {
        return Err(Failure {
            code: quiver_error::QUIVER_ERR_WRONG_THREAD,
            message: "ports are used only by the thread that opened them".into(),
        });
    }
    // SAFETY: a live handle of this thread (checked above).
    let h = unsafe { handle(p, "p") }?;
    if h.busy.get() {
        return Err(Failure::invalid(
            "a ports call from inside a handler of the same ports: a handler uses the \
             quiver_delivery_* functions only",
        ));
    }
    Ok(h)
}

/// Runs `body` on the ports at `p`.
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
unsafe fn with(p: *const quiver_ports, body: impl FnOnce(&Ports) -> Outcome) -> quiver_error {
    ffi(|| {
        // SAFETY: the contract is the caller's.
        let h = unsafe { ports(p) }?;
        h.busy.set(true);
        let _busy = Busy(&h.busy);
        body(&h.ports)
    })
}

/// Opens the ports of this rank on endpoint `dpid` (every rank of the job uses the same
/// DPID) into `*p`.
///
/// Thread safety: any thread; the ports are then bound to it.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `p` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_open(
    job: *const quiver_job,
    dpid: u16,
    p: *mut *mut quiver_ports,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle, `p` NULL or writable (the contract).
        let (j, out) = unsafe { (handle(job, "job")?, Out::new(p, "p")?) };
        let ports = Ports::open(&j.job, dpid)?;
        out.put(Box::into_raw(Box::new(quiver_ports {
            thread: this_thread(),
            busy: Cell::new(false),
            ports,
        })));
        Ok(())
    })
}

/// Closes the ports at `*p` (answers handlers queued leave first, for up to a second)
/// and sets `*p` to NULL.
///
/// Thread safety: only the thread that opened them.
///
/// # Safety
///
/// `p` is NULL or points to NULL or to a live ports handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_close(p: *mut *mut quiver_ports) -> quiver_error {
    ffi(|| {
        // SAFETY: `p` is NULL or a valid place (the contract).
        let place = unsafe { p.as_mut() }.ok_or_else(|| Failure::null("p"))?;
        // SAFETY: `*place` is NULL or a live handle (the contract); checks the thread.
        unsafe { ports(*place) }?;
        let h = std::mem::replace(place, std::ptr::null_mut());
        // SAFETY: `h` came from Box::into_raw in quiver_ports_open, is dropped on its own
        // thread (checked) and once: the caller's variable no longer holds it.
        drop(unsafe { Box::from_raw(h) });
        Ok(())
    })
}

/// Binds `port` (0 to 254) to send to port `dest_port` of rank `rank` (connecting to it
/// first, as a first write does).
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_bind_to(
    p: *const quiver_ports,
    port: u8,
    rank: u32,
    dest_port: u8,
) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe {
        with(p, |ports| {
            Ok(ports.bind(port).to(rank, dest_port).apply()?)
        })
    }
}

/// Binds `port` to send to port `dest_port` of every other rank of the job (GAMMA's
/// BROADCAST: down a binomial tree of the job's channels, in order, once each).
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_bind_all(
    p: *const quiver_ports,
    port: u8,
    dest_port: u8,
) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe { with(p, |ports| Ok(ports.bind(port).to_all(dest_port).apply()?)) }
}

/// Gives `port` a receive buffer of `len` bytes (zeroed; the library's, in the node's
/// shared memory where it can be, so that a sender of the node writes long messages
/// straight into it): messages arriving on the port are written into it, each over
/// the last.
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_bind_buffer(
    p: *const quiver_ports,
    port: u8,
    len: usize,
) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe {
        with(p, |ports| {
            check_buffer(std::ptr::NonNull::dangling().as_ptr(), len, "len")?;
            // In the node's shared memory where it can be (a sender of the node then
            // writes long messages straight into it), else private.
            let buffer: quiver_rs::ports::Buffer = match ports.buffer(len) {
                Ok(shared) => shared.into(),
                Err(_) => vec![0; len].into(),
            };
            Ok(ports.bind(port).buffer(buffer).apply()?)
        })
    }
}

/// Binds `handler` to `port`: it runs once per message delivered on the
/// port, just after the message is in the buffer, with `ctx`. A port without a handler
/// is signalled on every delivery; a handler signals with `quiver_delivery_signal`.
///
/// Thread safety: only the thread that opened the ports; the handler runs on that
/// thread inside its ports calls, or on the offload engine's thread
/// (`QUIVER_RELIABILITY=offload`) for messages from other nodes: `ctx` must be usable
/// there.
///
/// # Safety
///
/// `p` is NULL or a live ports handle; `handler` is NULL (`QUIVER_ERR_NULL`) or a
/// function that may be called with `ctx`, from the thread that opened the ports or
/// from the offload engine's, until the port is bound to another handler, unbound or
/// closed.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_bind_handler(
    p: *const quiver_ports,
    port: u8,
    handler: quiver_port_handler,
    ctx: *mut c_void,
) -> quiver_error {
    let body = |ports: &Ports| -> Outcome {
        // To remove a handler: quiver_ports_unbind, then bind again what stays.
        let f = handler.ok_or_else(|| Failure::null("handler"))?;
        let cb = Callback { f, ctx };
        ports
            .bind(port)
            .handler(move |d: &mut Delivery<'_>| {
                let cb = cb;
                // SAFETY: the C caller's contract: `f` may be called with `ctx`; the
                // delivery pointer is valid for this call (`d` lives across it) and is
                // read back only by the quiver_delivery_* functions.
                unsafe { (cb.f)(std::ptr::from_mut(d).cast::<quiver_delivery>(), cb.ctx) }
            })
            .apply()?;
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with(p, body) }
}

/// Binds `handler` as `port`'s error handler: it runs once per error of
/// the port (a message that found no buffer or too small a one, a failed destination),
/// with `ctx`. Without one, the error comes back from the next wait, test or progress
/// as `QUIVER_ERR_PORT`.
///
/// Thread safety: as `quiver_ports_bind_handler`.
///
/// # Safety
///
/// As `quiver_ports_bind_handler`.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_bind_error_handler(
    p: *const quiver_ports,
    port: u8,
    handler: quiver_port_error_handler,
    ctx: *mut c_void,
) -> quiver_error {
    let body = |ports: &Ports| -> Outcome {
        let f = handler.ok_or_else(|| Failure::null("handler"))?;
        let cb = Callback { f, ctx };
        ports
            .bind(port)
            .on_error(move |e: PortError| {
                let cb = cb;
                let c = quiver_port_error::of(&e);
                // SAFETY: the C caller's contract: `f` may be called with `ctx`; `c`
                // lives across the call.
                unsafe { (cb.f)(&c, cb.ctx) }
            })
            .apply()?;
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with(p, body) }
}

/// Removes every binding of `port` (its buffer is freed); signals not yet waited for
/// stay.
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_unbind(p: *const quiver_ports, port: u8) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe {
        with(p, |ports| {
            ports.unbind(port);
            Ok(())
        })
    }
}

/// Sends the `len` bytes at `data` through `port` to its destination; returns when the
/// buffer may be reused.
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle; `data` is readable for `len` bytes (NULL when
/// `len` is 0 is allowed).
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_send(
    p: *const quiver_ports,
    port: u8,
    data: *const c_void,
    len: usize,
) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe {
        with(p, |ports| {
            // SAFETY: `data` is readable for `len` bytes (the contract).
            let d = bytes(data.cast(), len, "data")?;
            Ok(ports.send(port, d)?)
        })
    }
}

/// Waits until `port` has been signalled `n` times and consumes the signals (GAMMA's
/// `gamma_wait`), running the handlers meanwhile.
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_wait(
    p: *const quiver_ports,
    port: u8,
    n: u64,
) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe { with(p, |ports| Ok(ports.wait(port, n)?)) }
}

/// Like `quiver_ports_wait`, at most `timeout_us` microseconds: `QUIVER_ERR_TIMEOUT`
/// when the signals had not come (none consumed).
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_wait_timeout(
    p: *const quiver_ports,
    port: u8,
    n: u64,
    timeout_us: u64,
) -> quiver_error {
    let body = |ports: &Ports| -> Outcome {
        let limit = Duration::from_micros(timeout_us);
        if ports.wait_within(port, n, limit)? {
            Ok(())
        } else {
            Err(quiver_rs::Error::Timeout(limit).into())
        }
    };
    // SAFETY: the caller's contract.
    unsafe { with(p, body) }
}

/// Makes progress once, then consumes `n` signals of `port` if it has them: `*done` 1,
/// else 0.
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle; `done` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_test(
    p: *const quiver_ports,
    port: u8,
    n: u64,
    done: *mut i32,
) -> quiver_error {
    let body = |ports: &Ports| -> Outcome {
        // SAFETY: `done` is NULL or writable (the contract).
        let out = unsafe { Out::new(done, "done") }?;
        out.put(i32::from(ports.test(port, n)?));
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with(p, body) }
}

/// Signals `port` once (as a handler's `quiver_delivery_signal`).
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_signal(p: *const quiver_ports, port: u8) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe {
        with(p, |ports| {
            ports.signal(port);
            Ok(())
        })
    }
}

/// Copies the last message delivered into `port`'s buffer to `dst` (at most `cap`
/// bytes): its length at `*len` and its sender at `*rank` (`QUIVER_ANY_SOURCE` and 0
/// when nothing was delivered since the buffer was bound). `QUIVER_ERR_TRUNCATED` when
/// `cap` is shorter than the message (`dst` holds its start).
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle; `dst` is writable for `cap` bytes (NULL when
/// `cap` is 0 is allowed); `len` and `rank` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_read(
    p: *const quiver_ports,
    port: u8,
    dst: *mut c_void,
    cap: usize,
    len: *mut usize,
    rank: *mut u32,
) -> quiver_error {
    let body = |ports: &Ports| -> Outcome {
        check_buffer(dst.cast(), cap, "dst")?;
        // SAFETY: `len` and `rank` are NULL or writable (the contract).
        let (len_out, rank_out) = unsafe { (Out::new(len, "len")?, Out::new(rank, "rank")?) };
        let dst: &mut [u8] = if cap == 0 {
            &mut []
        } else {
            // SAFETY: `dst` is writable for `cap` bytes (the contract; checked non-NULL
            // above) and does not overlap the port's buffer, which is the library's.
            unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), cap) }
        };
        let got = ports.read(port, dst).map(|(n, from)| (n, from.rank));
        let (n, from) = got.unwrap_or((0, crate::tagged::QUIVER_ANY_SOURCE));
        len_out.put(n);
        rank_out.put(from);
        if n > cap {
            return Err(Failure {
                code: quiver_error::QUIVER_ERR_TRUNCATED,
                message: format!("the message of {n} bytes on port {port} was truncated to {cap}"),
            });
        }
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with(p, body) }
}

/// Makes progress: delivers what has arrived (running the handlers), sends what they
/// queued. Returns the first port error no error handler took (`QUIVER_ERR_PORT`).
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_progress(p: *const quiver_ports) -> quiver_error {
    // SAFETY: the caller's contract.
    unsafe { with(p, |ports| Ok(ports.progress()?)) }
}

/// The wait mode of a `set_wait` call's `spin_us`: -1 never sleeps, 0 sleeps at once,
/// 1 to 1000000 polls that many microseconds first.
pub(crate) fn wait_mode(spin_us: i64) -> Result<WaitMode, Failure> {
    match spin_us {
        -1 => Ok(WaitMode::Spin),
        0 => Ok(WaitMode::Block),
        us if us > 0 && us <= 1_000_000 => Ok(WaitMode::Hybrid(Duration::from_micros(us as u64))),
        other => Err(Failure::invalid(format!(
            "spin_us {other}: expected -1, 0 or 1 to 1000000"
        ))),
    }
}

/// How waits poll before they sleep: `spin_us` microseconds (GAMMA's 50 by default), 0
/// to sleep at once, -1 never to sleep.
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_set_wait(
    p: *const quiver_ports,
    spin_us: i64,
) -> quiver_error {
    let body = |ports: &Ports| -> Outcome {
        ports.set_wait(wait_mode(spin_us)?);
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with(p, body) }
}

/// Waits until every rank of `job` has called a barrier as many times, keeping the ports
/// going meanwhile (delivering, and forwarding broadcasts others wait for): the ports'
/// `Job::barrier_progressing`. Port errors stay for the next wait, test or progress.
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle; `job` is NULL or the live job handle the ports
/// were opened with.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_barrier(
    p: *const quiver_ports,
    job: *const quiver_job,
) -> quiver_error {
    let body = |ports: &Ports| -> Outcome {
        // SAFETY: `job` is NULL or a live handle (the contract).
        let j = unsafe { handle(job, "job") }?;
        Ok(j.job.barrier_progressing(&[ports])?)
    };
    // SAFETY: the caller's contract.
    unsafe { with(p, body) }
}

/// The ports' counters, at `*stats`.
///
/// Thread safety: only the thread that opened the ports.
///
/// # Safety
///
/// `p` is NULL or a live ports handle; `stats` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_ports_stats(
    p: *const quiver_ports,
    stats: *mut quiver_port_counters,
) -> quiver_error {
    let body = |ports: &Ports| -> Outcome {
        // SAFETY: `stats` is NULL or writable (the contract).
        let out = unsafe { Out::new(stats, "stats") }?;
        out.put(ports.stats().into());
        Ok(())
    };
    // SAFETY: the caller's contract.
    unsafe { with(p, body) }
}

/// The delivery behind a handler's argument.
///
/// # Safety
///
/// `d` is NULL or the pointer a receiver handler was handed, during that call.
unsafe fn delivery<'a>(d: *mut quiver_delivery) -> Result<&'a mut Delivery<'a>, Failure> {
    // SAFETY: a non-NULL `d` is the `&mut Delivery` the handler closure passed, alive for
    // the handler's call (the contract).
    unsafe { d.cast::<Delivery<'a>>().as_mut() }.ok_or_else(|| Failure::null("d"))
}

/// What a handler's delivery carries: the port, the sender's rank (the root, for a
/// broadcast) and the port it sent through, the message's length, and its bytes in the
/// port's buffer (valid until the handler returns). Any output may be NULL.
///
/// Thread safety: inside the handler that was handed `d`.
///
/// # Safety
///
/// `d` is NULL or the delivery a running handler was handed; every output is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_delivery_info(
    d: *mut quiver_delivery,
    port: *mut u8,
    rank: *mut u32,
    from_port: *mut u8,
    len: *mut usize,
    data: *mut *const c_void,
) -> quiver_error {
    ffi(|| {
        // SAFETY: the caller's contract.
        let d = unsafe { delivery(d) }?;
        // SAFETY: each output is NULL or writable (the contract); NULL ones are skipped.
        unsafe {
            if let Some(p) = port.as_mut() {
                *p = d.port();
            }
            if let Some(r) = rank.as_mut() {
                *r = d.origin().rank;
            }
            if let Some(f) = from_port.as_mut() {
                *f = d.origin().port;
            }
            if let Some(l) = len.as_mut() {
                *l = d.len();
            }
            if let Some(b) = data.as_mut() {
                *b = d.data().as_ptr().cast();
            }
        }
        Ok(())
    })
}

/// Signals the delivery's port once.
///
/// Thread safety: inside the handler that was handed `d`.
///
/// # Safety
///
/// `d` is NULL or the delivery a running handler was handed.
#[no_mangle]
pub unsafe extern "C" fn quiver_delivery_signal(d: *mut quiver_delivery) -> quiver_error {
    ffi(|| {
        // SAFETY: the caller's contract.
        unsafe { delivery(d) }?.signal();
        Ok(())
    })
}

/// Sends the `len` bytes at `data` through `port` (to its bound destination) from inside
/// a handler: queued now, in order with the process's other answers to that
/// destination, sent as progress runs; never waits.
///
/// Thread safety: inside the handler that was handed `d`.
///
/// # Safety
///
/// `d` is NULL or the delivery a running handler was handed; `data` is readable for
/// `len` bytes (NULL when `len` is 0 is allowed).
#[no_mangle]
pub unsafe extern "C" fn quiver_delivery_send(
    d: *mut quiver_delivery,
    port: u8,
    data: *const c_void,
    len: usize,
) -> quiver_error {
    ffi(|| {
        // SAFETY: the caller's contract.
        let d = unsafe { delivery(d) }?;
        // SAFETY: `data` is readable for `len` bytes (the contract).
        let bytes = unsafe { bytes(data.cast(), len, "data") }?;
        d.send(port, bytes)
            .map_err(|e| Failure::from(quiver_rs::Error::Port(e)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserved_port_is_the_librarys() {
        assert_eq!(QUIVER_RESERVED_PORT, quiver_rs::ports::RESERVED_PORT);
    }

    #[test]
    fn every_port_error_has_its_kind_and_fields() {
        use quiver_rs::ports::Origin;
        let from = Origin { rank: 3, port: 9 };
        let cases = [
            (
                PortError::NoBuffer {
                    port: 1,
                    from,
                    len: 5,
                },
                (QUIVER_PORT_NO_BUFFER, 3, 9, 5, 0),
            ),
            (
                PortError::Overflow {
                    port: 1,
                    from,
                    len: 5,
                    capacity: 4,
                },
                (QUIVER_PORT_OVERFLOW, 3, 9, 5, 4),
            ),
            (
                PortError::Reserved {
                    port: 1,
                    from,
                    len: 0,
                },
                (QUIVER_PORT_RESERVED, 3, 9, 0, 0),
            ),
            (
                PortError::NoDestination { port: 1 },
                (QUIVER_PORT_NO_DESTINATION, 0, 0, 0, 0),
            ),
            (
                PortError::DestinationFailed { port: 1, rank: 7 },
                (QUIVER_PORT_DESTINATION_FAILED, 7, 0, 0, 0),
            ),
            (
                PortError::SendFailed {
                    port: 1,
                    rank: 7,
                    reason: "x".into(),
                },
                (QUIVER_PORT_SEND_FAILED, 7, 0, 0, 0),
            ),
            (
                PortError::OutboxFull { port: 1 },
                (QUIVER_PORT_OUTBOX_FULL, 0, 0, 0, 0),
            ),
        ];
        for (e, (kind, rank, from_port, len, capacity)) in cases {
            let c = quiver_port_error::of(&e);
            assert_eq!(
                c,
                quiver_port_error {
                    kind,
                    port: 1,
                    from_port,
                    rank,
                    len,
                    capacity
                },
                "{e}"
            );
        }
    }
}
