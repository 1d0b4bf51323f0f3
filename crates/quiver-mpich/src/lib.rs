//! `libmpi.so.12`: MPI with MPICH's ABI on quiver (`quiver-mpi`).
//!
//! Binaries built against MPICH or Intel MPI (IMB, mpi4py's MPICH variant, the
//! application's own) load this library instead of MPICH's and run on quiver: its
//! handles, constants and `MPI_Status` are MPICH's, read from MPICH's header at build
//! time (`build.rs`, module [`abi`]). What is implemented works; every other function of
//! MPICH's `mpi_proto.h` exists, says once on stderr that quiver does not implement it,
//! and returns `MPI_ERR_UNSUPPORTED_OPERATION` (`stubs`, generated).
//!
//! Threads: `MPI_THREAD_FUNNELED`. The library's state lives on the thread that called
//! `MPI_Init` (quiver's endpoints stay on the thread that opened them); a call from
//! another thread is an error that says so.
//!
//! The parts: this file holds the library's state ([`Lib`], on the initialising
//! thread), the error path (error handlers, `MPI_Error_string`)
//! and the handle tables; `handles` decodes MPICH's handles; `init`, `p2p`, `coll`,
//! `types`, `comm`, `rma` the MPI calls of each area.

#![allow(non_snake_case, non_camel_case_types)]
// MPI's C functions take raw pointers from the application: each says what it needs
// of them in MPI's own terms (the MPI standard's), not a `# Safety` section each.
#![allow(
    clippy::missing_safety_doc,
    clippy::not_unsafe_ptr_arg_deref,
    clippy::too_many_arguments
)]

/// Writes one line to stderr in one `write`, so that the lines of ranks that share a
/// pipe never interleave (`eprintln!` writes a line in pieces).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}

mod coll;
mod comm;
mod handles;

pub use handles::{DataPtr, SENTINELS};
mod init;
mod p2p;
mod rma;
mod status;
mod types;

/// MPICH's constants, from its `mpi.h`.
#[allow(dead_code, clippy::all)]
pub mod abi {
    use std::ffi::c_int;
    include!(concat!(env!("OUT_DIR"), "/mpich_abi.rs"));
}

#[allow(clippy::all, unused_imports)]
mod stubs {
    use crate::abi::*;
    use crate::unsupported;
    use std::ffi::{c_int, c_void};
    include!(concat!(env!("OUT_DIR"), "/stubs.rs"));
}

use abi::*;
use quiver_mpi::{Class, Mpi, MpiError, Op};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Once;

/// MPICH's `MPI_Status`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MPI_Status {
    pub count_lo: c_int,
    pub count_hi_and_cancelled: c_int,
    pub MPI_SOURCE: c_int,
    pub MPI_TAG: c_int,
    pub MPI_ERROR: c_int,
}

/// Where the library is in its life.
static PHASE: AtomicU8 = AtomicU8::new(BEFORE);
const BEFORE: u8 = 0;
const RUNNING: u8 = 1;
const AFTER: u8 = 2;

/// A function of the application's to run once a call let go of the state.
type Deferred = Box<dyn FnOnce()>;

/// The library's state on the thread that called `MPI_Init`, in one thread-local (one
/// look-up per call: in a shared library each costs a `__tls_get_addr`) without drop
/// glue (no destructor to register; nothing is dropped at the thread's end: a process
/// that exits without `MPI_Finalize` does not wait for its endpoints' last answers
/// there).
pub(crate) struct State {
    /// Between `MPI_Init` and `MPI_Finalize`.
    pub(crate) lib: RefCell<Option<ManuallyDrop<Lib>>>,
    /// The datatypes, beside the rest so that an application's reduction function,
    /// which runs inside a collective, may ask about them (mpi4py's do:
    /// `MPI_Type_get_extent` before calling the Python function).
    pub(crate) types: RefCell<Option<ManuallyDrop<types::Types>>>,
    /// The application's functions a call must run once it let go of the state (an
    /// attribute's copy and delete functions, which may call MPI).
    deferred: RefCell<ManuallyDrop<Vec<Deferred>>>,
}

thread_local! {
    pub(crate) static STATE: State = const {
        State {
            lib: RefCell::new(None),
            types: RefCell::new(None),
            deferred: RefCell::new(ManuallyDrop::new(Vec::new())),
        }
    };
}

/// Runs `f` when the current call has let go of the state.
pub(crate) fn defer(f: impl FnOnce() + 'static) {
    STATE.with(|st| st.deferred.borrow_mut().push(Box::new(f)));
}

/// Runs what the call deferred.
#[inline]
fn run_deferred(st: &State) {
    if st.deferred.borrow().is_empty() {
        return;
    }
    run_deferred_now(st);
}

#[inline(never)]
fn run_deferred_now(st: &State) {
    loop {
        let f = {
            let mut d = st.deferred.borrow_mut();
            if d.is_empty() {
                return;
            }
            d.remove(0)
        };
        f();
    }
}

/// One process's MPI library: the core and the tables of handles the core does not
/// know (datatypes, operations, groups, error handlers).
pub(crate) struct Lib {
    pub(crate) mpi: Mpi,
    /// Applications' operations by index (`handles::USER_OP | index`).
    pub(crate) ops: Vec<Option<Op>>,
    /// Groups (job ranks) by index (`handles::GROUP | index`).
    pub(crate) groups: Vec<Option<Vec<u32>>>,
    /// The error handler of each communicator id (absent: `MPI_ERRORS_ARE_FATAL`).
    pub(crate) errhandlers: HashMap<usize, c_int>,
    /// The error handler of each window id (absent: `MPI_ERRORS_ARE_FATAL`).
    pub(crate) win_errhandlers: HashMap<usize, c_int>,
    /// The values of each window's predefined attributes.
    pub(crate) win_attrs: HashMap<usize, Box<rma::WinAttrs>>,
    /// Attribute keys of the application's by index (`comm::KEYVAL | index`).
    pub(crate) keyvals: Vec<Option<comm::Keyval>>,
    /// Attributes set on communicators: (communicator id, key index, value), in the
    /// order they were set.
    pub(crate) attrs: Vec<(usize, usize, *mut c_void)>,
    /// The last message of each error class, for `MPI_Error_string`.
    pub(crate) messages: HashMap<c_int, String>,
}

/// The number of an error class in MPICH's ABI.
pub(crate) fn class_code(c: Class) -> c_int {
    match c {
        Class::Buffer => MPI_ERR_BUFFER,
        Class::Count => MPI_ERR_COUNT,
        Class::Type => MPI_ERR_TYPE,
        Class::Tag => MPI_ERR_TAG,
        Class::Comm => MPI_ERR_COMM,
        Class::Rank => MPI_ERR_RANK,
        Class::Request => MPI_ERR_REQUEST,
        Class::Root => MPI_ERR_ROOT,
        Class::Group => MPI_ERR_GROUP,
        Class::Op => MPI_ERR_OP,
        Class::Arg => MPI_ERR_ARG,
        Class::Truncate => MPI_ERR_TRUNCATE,
        Class::Other => MPI_ERR_OTHER,
        Class::Intern => MPI_ERR_INTERN,
        Class::NotInitialized => MPI_ERR_OTHER,
        Class::Unsupported => MPI_ERR_UNSUPPORTED_OPERATION,
        Class::Win => MPI_ERR_WIN,
        Class::RmaSync => MPI_ERR_RMA_SYNC,
        Class::RmaRange => MPI_ERR_RMA_RANGE,
        Class::Disp => MPI_ERR_DISP,
        Class::NoMem => MPI_ERR_NO_MEM,
    }
}

/// The object whose error handler reports a call's error.
#[derive(Debug, Clone, Copy)]
pub(crate) enum On {
    /// A communicator's handle.
    Comm(c_int),
    /// A window's handle.
    Win(c_int),
}

/// Runs an MPI call `name` on the library's state and its datatypes: its error goes to
/// the error handler of communicator handle `comm` (fatal by default: the message on
/// stderr and the process exits, as MPI's `MPI_ERRORS_ARE_FATAL`), and becomes its
/// class's number.
pub(crate) fn call(
    name: &str,
    comm: c_int,
    f: impl FnOnce(&mut Lib, &types::Types) -> Result<(), MpiError>,
) -> c_int {
    call_on(name, On::Comm(comm), f)
}

/// [`call`] with the error handler of `on`.
pub(crate) fn call_on(
    name: &str,
    on: On,
    f: impl FnOnce(&mut Lib, &types::Types) -> Result<(), MpiError>,
) -> c_int {
    STATE.with(|st| {
        let rc = match st.types.try_borrow() {
            Ok(types) => with_lib(st, name, on, |lib| match types.as_deref() {
                Some(types) => f(lib, types),
                None => Err(MpiError::new(Class::Intern, "no datatype table")),
            }),
            Err(_) => fatal_or(
                name,
                MPI_ERR_OTHER,
                "called while datatypes are being made",
                true,
            ),
        };
        run_deferred(st);
        rc
    })
}

/// [`call`] for the calls that make or free datatypes.
pub(crate) fn call_types(
    name: &str,
    f: impl FnOnce(&mut types::Types) -> Result<(), MpiError>,
) -> c_int {
    STATE.with(|st| {
        let Ok(mut types) = st.types.try_borrow_mut() else {
            return fatal_or(
                name,
                MPI_ERR_OTHER,
                "called inside another MPI call (from a reduction's function?)",
                true,
            );
        };
        with_lib(st, name, On::Comm(MPI_COMM_WORLD), |_| {
            match types.as_deref_mut() {
                Some(types) => f(types),
                None => Err(MpiError::new(Class::Intern, "no datatype table")),
            }
        })
    })
}

/// The calls that only read datatypes: also from inside an application's reduction
/// function (its error then returns its code; no handler runs).
pub(crate) fn query(name: &str, f: impl FnOnce(&types::Types) -> Result<(), MpiError>) -> c_int {
    STATE.with(|st| {
        let result = match st.types.try_borrow() {
            Ok(types) => types.as_deref().map(f),
            Err(_) => Some(Err(MpiError::new(
                Class::Other,
                "called while datatypes are being made",
            ))),
        };
        match result {
            Some(Ok(())) => MPI_SUCCESS,
            Some(Err(e)) => match st.lib.try_borrow_mut() {
                Ok(mut guard) => match guard.as_mut() {
                    Some(lib) => lib.fail(name, On::Comm(MPI_COMM_WORLD), e),
                    None => class_code(e.class()),
                },
                // Inside a collective (a reduction's function): the code alone.
                Err(_) => class_code(e.class()),
            },
            // Not initialised: the same message as every other call.
            None => with_lib(st, name, On::Comm(MPI_COMM_WORLD), |_| Ok(())),
        }
    })
}

/// Runs `f` on the library's state (see [`call`]).
fn with_lib(
    st: &State,
    name: &str,
    on: On,
    f: impl FnOnce(&mut Lib) -> Result<(), MpiError>,
) -> c_int {
    let Ok(mut guard) = st.lib.try_borrow_mut() else {
        return fatal_or(
            name,
            MPI_ERR_OTHER,
            "called inside another MPI call (from a reduction's function?)",
            true,
        );
    };
    let Some(lib) = guard.as_mut() else {
        let why = match PHASE.load(Ordering::Relaxed) {
            BEFORE => "called before MPI_Init",
            AFTER => "called after MPI_Finalize",
            _ => "called from a thread other than MPI_Init's: quiver's MPI is MPI_THREAD_FUNNELED",
        };
        return fatal_or(name, MPI_ERR_OTHER, why, true);
    };
    match f(lib) {
        Ok(()) => MPI_SUCCESS,
        Err(e) => lib.fail(name, on, e),
    }
}

impl Lib {
    /// Reports `e` of call `name` through the error handler of `on`.
    pub(crate) fn fail(&mut self, name: &str, on: On, e: MpiError) -> c_int {
        let code = class_code(e.class());
        let handler = match on {
            On::Comm(h) => handles::comm_id(h)
                .ok()
                .and_then(|c| self.errhandlers.get(&c).copied()),
            On::Win(h) => handles::index_of(h, handles::WIN)
                .and_then(|w| self.win_errhandlers.get(&w).copied()),
        }
        .unwrap_or(MPI_ERRORS_ARE_FATAL);
        self.messages
            .insert(code, format!("{name}: {}", e.message()));
        fatal_or(name, code, e.message(), handler != MPI_ERRORS_RETURN)
    }
}

/// Returns `code`, or, when `fatal`, says what failed and ends the process.
fn fatal_or(name: &str, code: c_int, message: &str, fatal: bool) -> c_int {
    if fatal {
        crate::say!("quiver MPI: {name}: {message} (MPI_ERRORS_ARE_FATAL: exiting)");
        std::process::exit(1);
    }
    code
}

/// A function quiver does not implement: says so once on stderr.
pub(crate) fn unsupported(once: &Once, name: &str) {
    once.call_once(|| {
        crate::say!(
            "quiver MPI: {name} is not supported (it returns MPI_ERR_UNSUPPORTED_OPERATION)"
        )
    });
}

/// An argument that must not be negative, as a count.
pub(crate) fn count(n: impl Into<i64>, what: &str) -> Result<usize, MpiError> {
    let n = n.into();
    usize::try_from(n).map_err(|_| MpiError::new(Class::Count, format!("{what} {n} is negative")))
}
