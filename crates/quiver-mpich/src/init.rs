//! Starting and ending: `MPI_Init`, `MPI_Finalize`, the environment's queries, time,
//! errors and error handlers.

use crate::abi::*;
use crate::handles;
use crate::{call, class_code, Lib, AFTER, BEFORE, PHASE, RUNNING, STATE};
use quiver_mpi::{Class, Mpi, MpiError};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr};
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::Instant;

/// The thread level provided: MPI calls from the thread that initialised MPI only.
const PROVIDED: c_int = MPI_THREAD_FUNNELED;

fn init() -> c_int {
    if PHASE.load(Ordering::Relaxed) != BEFORE {
        crate::say!("quiver MPI: MPI_Init: called twice (or after MPI_Finalize)");
        std::process::exit(1);
    }
    // Time starts at initialisation.
    let _ = epoch();
    match Mpi::init() {
        Ok(mpi) => {
            let lib = ManuallyDrop::new(Lib {
                mpi,
                ops: Vec::new(),
                groups: Vec::new(),
                errhandlers: HashMap::new(),
                win_errhandlers: HashMap::new(),
                win_attrs: HashMap::new(),
                keyvals: Vec::new(),
                attrs: Vec::new(),
                messages: HashMap::new(),
            });
            STATE.with(|st| {
                *st.lib.borrow_mut() = Some(lib);
                *st.types.borrow_mut() = Some(ManuallyDrop::new(crate::types::Types::new()));
            });
            PHASE.store(RUNNING, Ordering::Relaxed);
            MPI_SUCCESS
        }
        Err(e) => {
            crate::say!("quiver MPI: MPI_Init: {e}");
            std::process::exit(1);
        }
    }
}

#[no_mangle]
pub extern "C" fn MPI_Init(_argc: *mut c_int, _argv: *mut *mut *mut c_char) -> c_int {
    init()
}

#[no_mangle]
pub extern "C" fn MPI_Init_thread(
    _argc: *mut c_int,
    _argv: *mut *mut *mut c_char,
    required: c_int,
    provided: *mut c_int,
) -> c_int {
    let rc = init();
    if !provided.is_null() {
        // SAFETY: MPI's contract: `provided` is writable.
        unsafe { provided.write(required.min(PROVIDED)) };
    }
    rc
}

#[no_mangle]
pub extern "C" fn MPI_Initialized(flag: *mut c_int) -> c_int {
    // SAFETY: MPI's contract: `flag` is writable.
    unsafe { flag.write(c_int::from(PHASE.load(Ordering::Relaxed) != BEFORE)) };
    MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Finalized(flag: *mut c_int) -> c_int {
    // SAFETY: MPI's contract: `flag` is writable.
    unsafe { flag.write(c_int::from(PHASE.load(Ordering::Relaxed) == AFTER)) };
    MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Finalize() -> c_int {
    // MPI deletes MPI_COMM_SELF's attributes first, in the reverse order of their
    // setting, while MPI still works (libraries hang their clean-up there).
    let _ = call("MPI_Finalize", MPI_COMM_WORLD, |lib, _| {
        crate::comm::delete_attrs(lib, quiver_mpi::SELF, true);
        Ok(())
    });
    let Some(lib) = STATE.with(|st| st.lib.try_borrow_mut().ok().and_then(|mut l| l.take())) else {
        crate::say!(
            "quiver MPI: MPI_Finalize: MPI is not initialised (or this is not MPI_Init's thread)"
        );
        return MPI_ERR_OTHER;
    };
    PHASE.store(AFTER, Ordering::Relaxed);
    if let Some(types) = STATE.with(|st| st.types.borrow_mut().take()) {
        drop(ManuallyDrop::into_inner(types));
    }
    match ManuallyDrop::into_inner(lib).mpi.finalize() {
        Ok(()) => MPI_SUCCESS,
        Err(e) => {
            crate::say!("quiver MPI: MPI_Finalize: {e}");
            class_code(e.class())
        }
    }
}

#[no_mangle]
pub extern "C" fn MPI_Abort(_comm: c_int, code: c_int) -> c_int {
    crate::say!("quiver MPI: MPI_Abort with code {code}");
    std::process::exit(if code == 0 { 1 } else { code });
}

#[no_mangle]
pub extern "C" fn MPI_Query_thread(provided: *mut c_int) -> c_int {
    // SAFETY: MPI's contract: `provided` is writable.
    unsafe { provided.write(PROVIDED) };
    MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Is_thread_main(flag: *mut c_int) -> c_int {
    // The thread that called MPI_Init is the one whose state is there.
    let main = STATE.with(|st| st.lib.try_borrow().map_or(true, |l| l.is_some()));
    // SAFETY: MPI's contract: `flag` is writable.
    unsafe { flag.write(c_int::from(main)) };
    MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Get_version(version: *mut c_int, subversion: *mut c_int) -> c_int {
    // SAFETY: MPI's contract: both are writable.
    unsafe {
        version.write(MPI_VERSION);
        subversion.write(MPI_SUBVERSION);
    }
    MPI_SUCCESS
}

/// Copies `s` with its terminating NUL into `buf` (at most `max` bytes) and its length
/// into `len`.
///
/// # Safety
///
/// `buf` has room for `max` bytes; `len` is writable.
unsafe fn write_string(s: &str, buf: *mut c_char, max: usize, len: *mut c_int) {
    let n = s.len().min(max.saturating_sub(1));
    // SAFETY: the caller's promise: room for `n + 1 <= max` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast(), buf, n);
        buf.add(n).write(0);
        if !len.is_null() {
            len.write(n as c_int);
        }
    }
}

#[no_mangle]
pub extern "C" fn MPI_Get_library_version(buf: *mut c_char, len: *mut c_int) -> c_int {
    let s = format!(
        "quiver MPI {} (MPICH ABI, libmpi.so.12)",
        env!("CARGO_PKG_VERSION")
    );
    // SAFETY: MPI's contract: MPI_MAX_LIBRARY_VERSION_STRING bytes at `buf`.
    unsafe { write_string(&s, buf, MPI_MAX_LIBRARY_VERSION_STRING as usize, len) };
    MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Get_processor_name(buf: *mut c_char, len: *mut c_int) -> c_int {
    let mut host = [0 as c_char; 256];
    // SAFETY: `host` has 256 bytes; gethostname writes at most that.
    let ok = unsafe { libc::gethostname(host.as_mut_ptr(), host.len() - 1) } == 0;
    let name = if ok {
        // SAFETY: `host` ends with a NUL (the last byte is never written).
        let c = unsafe { CStr::from_ptr(host.as_ptr()) };
        c.to_string_lossy().into_owned()
    } else {
        "localhost".into()
    };
    // SAFETY: MPI's contract: MPI_MAX_PROCESSOR_NAME bytes at `buf`.
    unsafe { write_string(&name, buf, MPI_MAX_PROCESSOR_NAME as usize, len) };
    MPI_SUCCESS
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

#[no_mangle]
pub extern "C" fn MPI_Wtime() -> f64 {
    epoch().elapsed().as_secs_f64()
}

#[no_mangle]
pub extern "C" fn MPI_Wtick() -> f64 {
    1e-9
}

#[no_mangle]
pub extern "C" fn MPI_Error_class(code: c_int, class: *mut c_int) -> c_int {
    // Error codes are their classes here.
    // SAFETY: MPI's contract: `class` is writable.
    unsafe { class.write(code) };
    MPI_SUCCESS
}

/// What each class means.
fn class_text(code: c_int) -> &'static str {
    match code {
        MPI_SUCCESS => "no error",
        MPI_ERR_BUFFER => "invalid buffer pointer",
        MPI_ERR_COUNT => "invalid count argument",
        MPI_ERR_TYPE => "invalid datatype",
        MPI_ERR_TAG => "invalid tag",
        MPI_ERR_COMM => "invalid communicator",
        MPI_ERR_RANK => "invalid rank",
        MPI_ERR_REQUEST => "invalid request",
        MPI_ERR_ROOT => "invalid root",
        MPI_ERR_GROUP => "invalid group",
        MPI_ERR_OP => "invalid operation",
        MPI_ERR_ARG => "invalid argument",
        MPI_ERR_TRUNCATE => "message truncated",
        MPI_ERR_OTHER => "other error",
        MPI_ERR_INTERN => "internal error",
        MPI_ERR_IN_STATUS => "error code is in status",
        MPI_ERR_NO_MEM => "out of memory",
        MPI_ERR_WIN => "invalid window",
        MPI_ERR_UNSUPPORTED_OPERATION => "operation not supported by quiver's MPI",
        _ => "unknown error",
    }
}

#[no_mangle]
pub extern "C" fn MPI_Error_string(code: c_int, buf: *mut c_char, len: *mut c_int) -> c_int {
    let last = STATE.with(|st| {
        let cell = &st.lib;
        cell.try_borrow()
            .ok()
            .and_then(|g| g.as_ref().and_then(|l| l.messages.get(&code).cloned()))
    });
    let s = match last {
        Some(m) => format!("{} ({m})", class_text(code)),
        None => class_text(code).to_string(),
    };
    // SAFETY: MPI's contract: MPI_MAX_ERROR_STRING bytes at `buf`.
    unsafe { write_string(&s, buf, MPI_MAX_ERROR_STRING as usize, len) };
    MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Comm_set_errhandler(comm: c_int, handler: c_int) -> c_int {
    call("MPI_Comm_set_errhandler", comm, |lib, _| {
        let c = handles::comm_id(comm)?;
        lib.mpi.comm(c)?;
        lib.errhandlers.insert(c, errhandler(handler)?);
        Ok(())
    })
}

/// Error handler `handler`, if it is one the library has (the predefined ones).
pub(crate) fn errhandler(handler: c_int) -> Result<c_int, MpiError> {
    match handler {
        MPI_ERRORS_ARE_FATAL | MPI_ERRORS_RETURN | MPI_ERRORS_ABORT => Ok(handler),
        _ => Err(MpiError::new(
            Class::Arg,
            "only MPI_ERRORS_ARE_FATAL, MPI_ERRORS_ABORT and MPI_ERRORS_RETURN are supported",
        )),
    }
}

#[no_mangle]
pub extern "C" fn MPI_Comm_get_errhandler(comm: c_int, handler: *mut c_int) -> c_int {
    call("MPI_Comm_get_errhandler", comm, |lib, _| {
        let c = handles::comm_id(comm)?;
        lib.mpi.comm(c)?;
        let h = lib
            .errhandlers
            .get(&c)
            .copied()
            .unwrap_or(MPI_ERRORS_ARE_FATAL);
        // SAFETY: MPI's contract: `handler` is writable.
        unsafe { handler.write(h) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Errhandler_free(handler: *mut c_int) -> c_int {
    // The predefined handlers are the only ones; freeing one forgets the handle.
    // SAFETY: MPI's contract: `handler` points at a handle.
    unsafe { handler.write(MPI_ERRHANDLER_NULL) };
    MPI_SUCCESS
}

/// Not the standard ABI (that is `libmpi_abi.so.1`'s): -1 and -1, as MPICH's
/// `libmpi.so.12` says.
#[no_mangle]
pub extern "C" fn MPI_Abi_get_version(major: *mut c_int, minor: *mut c_int) -> c_int {
    // SAFETY: MPI's contract: both are writable.
    unsafe {
        major.write(-1);
        minor.write(-1);
    }
    MPI_SUCCESS
}
