//! The entry points: each translates its arguments into MPICH's ABI, calls quiver's
//! `libmpi.so.12` (loaded privately on first use) and translates back what it wrote and
//! returned. See the [crate documentation](crate).

use crate::{abi, maps, mpich, say};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// quiver's `libmpi.so.12`, loaded on first use.
fn library() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    LIB.get_or_init(|| match load() {
        Ok(l) => l,
        Err(e) => {
            say(&format!("quiver MPI (libmpi_abi.so.1): {e}"));
            std::process::exit(1);
        }
    })
}

/// Loads `libmpi.so.12` from `QUIVER_MPI_LIB`, else from this library's directory, else
/// by name.
fn load() -> Result<libloading::Library, String> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("QUIVER_MPI_LIB") {
        candidates.push(std::path::PathBuf::from(dir).join("libmpi.so.12"));
    }
    if let Some(dir) = own_directory() {
        candidates.push(dir.join("libmpi.so.12"));
    }
    let mut tried = Vec::new();
    for path in candidates.iter().filter(|p| p.exists()) {
        // SAFETY: loading quiver's libmpi.so.12 runs no initialisers that depend on the
        // caller (it has none but Rust's).
        match unsafe { libloading::Library::new(path) } {
            Ok(l) => return Ok(l),
            Err(e) => tried.push(format!("{}: {e}", path.display())),
        }
    }
    Err(format!(
        "quiver's libmpi.so.12 is not beside libmpi_abi.so.1 ({}); set QUIVER_MPI_LIB to its \
         directory",
        if tried.is_empty() {
            "not found".to_string()
        } else {
            tried.join("; ")
        }
    ))
}

/// The directory this library was loaded from.
fn own_directory() -> Option<std::path::PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr writes `info` for an address inside a loaded object (this function).
    let ok = unsafe { libc::dladdr(own_directory as *const c_void, info.as_mut_ptr()) };
    if ok == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded: `info` is written, `dli_fname` a C string or null.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: as above.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    path.parent().map(|p| p.to_path_buf())
}

/// libmpi.so.12's function `$name` of C type `fn($t...) -> $r` (MPICH's mpi_proto.h),
/// looked up once.
macro_rules! mpich_fn {
    ($name:literal, fn($($t:ty),* $(,)?) -> $r:ty) => {{
        type F = unsafe extern "C" fn($($t),*) -> $r;
        // An item of its own: outside the caller's `unsafe` block.
        fn get() -> F {
            static PTR: OnceLock<F> = OnceLock::new();
            *PTR.get_or_init(|| {
                // SAFETY: libmpi.so.12 exports `$name` with C type F (MPICH's
                // mpi_proto.h); the library stays loaded for the process's life
                // (`library` keeps it).
                match unsafe { library().get::<F>(concat!($name, "\0").as_bytes()) } {
                    Ok(f) => *f,
                    Err(e) => {
                        say(&format!("quiver MPI (libmpi_abi.so.1): {}: {e}", $name));
                        std::process::exit(1);
                    }
                }
            })
        }
        get()
    }};
}

/// A handle of the standard ABI (a pointer-sized value).
type H = usize;

/// The handle tables: the standard's predefined handles (all below `PREDEFINED`) to
/// MPICH's, and back.
struct Tables {
    to_mpich: HashMap<H, c_int>,
    /// By the handle's type (MPICH gives handles of different types one number).
    from_mpich: HashMap<(&'static str, c_int), H>,
    /// MPICH's error class of each of the standard's, and back.
    error_to_mpich: HashMap<c_int, c_int>,
    error_from_mpich: HashMap<c_int, c_int>,
}

/// The standard's predefined handles are small numbers; the library's own handles (MPICH's
/// numbers, with their high bits set) are above.
const PREDEFINED: H = 0x1000;

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Tables {
            to_mpich: HashMap::new(),
            from_mpich: HashMap::new(),
            error_to_mpich: HashMap::new(),
            error_from_mpich: HashMap::new(),
        };
        for &(s, m, ty) in &maps::HANDLES {
            t.to_mpich.entry(s).or_insert(m);
            t.from_mpich.entry((ty, m)).or_insert(s);
        }
        for &(m, s) in &maps::ERRORS {
            t.error_to_mpich.entry(s).or_insert(m);
            t.error_from_mpich.entry(m).or_insert(s);
        }
        t
    })
}

/// MPICH's handle for handle `h`; `class` (the standard's error class) when it is none.
fn m(h: H, class: c_int) -> Result<c_int, c_int> {
    if h < PREDEFINED {
        return tables().to_mpich.get(&h).copied().ok_or(class);
    }
    // The library's own handles: MPICH's numbers as they were handed out.
    u32::try_from(h).map(|v| v as c_int).map_err(|_| class)
}

/// The types of handles, as `mpi_abi.h` names them.
const COMM: &str = "MPI_Comm";
const DATATYPE: &str = "MPI_Datatype";
const REQUEST: &str = "MPI_Request";
const WIN: &str = "MPI_Win";

/// The standard's handle for MPICH's handle `h` of type `ty`.
fn s(h: c_int, ty: &'static str) -> H {
    match tables().from_mpich.get(&(ty, h)) {
        Some(&v) => v,
        None => h as u32 as H,
    }
}

/// The standard's code for MPICH's return code `rc`.
fn rc(code: c_int) -> c_int {
    tables()
        .error_from_mpich
        .get(&code)
        .copied()
        .unwrap_or(code)
}

/// MPICH's code for the standard's `code`.
fn rc_to_mpich(code: c_int) -> c_int {
    tables().error_to_mpich.get(&code).copied().unwrap_or(code)
}

/// Maps the special values of `pairs` (standard, MPICH) in `v`, one way or the other.
fn special(v: c_int, pairs: &[(c_int, c_int)], to_mpich: bool) -> c_int {
    for &(a, b) in pairs {
        let (from, to) = if to_mpich { (a, b) } else { (b, a) };
        if v == from {
            return to;
        }
    }
    v
}

/// The sentinel ranks of both ABIs.
const RANKS: [(c_int, c_int); 4] = [
    (abi::MPI_ANY_SOURCE, mpich::MPI_ANY_SOURCE),
    (abi::MPI_PROC_NULL, mpich::MPI_PROC_NULL),
    (abi::MPI_ROOT, mpich::MPI_ROOT),
    (abi::MPI_UNDEFINED, mpich::MPI_UNDEFINED),
];
const TAGS: [(c_int, c_int); 1] = [(abi::MPI_ANY_TAG, mpich::MPI_ANY_TAG)];
const THREADS: [(c_int, c_int); 4] = [
    (abi::MPI_THREAD_SINGLE, mpich::MPI_THREAD_SINGLE),
    (abi::MPI_THREAD_FUNNELED, mpich::MPI_THREAD_FUNNELED),
    (abi::MPI_THREAD_SERIALIZED, mpich::MPI_THREAD_SERIALIZED),
    (abi::MPI_THREAD_MULTIPLE, mpich::MPI_THREAD_MULTIPLE),
];
const COMPARISONS: [(c_int, c_int); 4] = [
    (abi::MPI_IDENT, mpich::MPI_IDENT),
    (abi::MPI_CONGRUENT, mpich::MPI_CONGRUENT),
    (abi::MPI_SIMILAR, mpich::MPI_SIMILAR),
    (abi::MPI_UNEQUAL, mpich::MPI_UNEQUAL),
];
const LOCKS: [(c_int, c_int); 2] = [
    (abi::MPI_LOCK_SHARED, mpich::MPI_LOCK_SHARED),
    (abi::MPI_LOCK_EXCLUSIVE, mpich::MPI_LOCK_EXCLUSIVE),
];
/// Window assertions: bits, each its own.
const MODES: [(c_int, c_int); 5] = [
    (abi::MPI_MODE_NOCHECK, mpich::MPI_MODE_NOCHECK),
    (abi::MPI_MODE_NOPRECEDE, mpich::MPI_MODE_NOPRECEDE),
    (abi::MPI_MODE_NOPUT, mpich::MPI_MODE_NOPUT),
    (abi::MPI_MODE_NOSTORE, mpich::MPI_MODE_NOSTORE),
    (abi::MPI_MODE_NOSUCCEED, mpich::MPI_MODE_NOSUCCEED),
];

fn rank(r: c_int) -> c_int {
    special(r, &RANKS, true)
}

fn tag(t: c_int) -> c_int {
    special(t, &TAGS, true)
}

fn modes(a: c_int) -> c_int {
    MODES
        .iter()
        .filter(|(s, _)| a & s != 0)
        .fold(0, |acc, (_, m)| acc | m)
}

/// `MPI_IN_PLACE` and `MPI_BOTTOM` as MPICH writes them.
fn buf(p: *const c_void) -> *const c_void {
    if p as isize == abi::MPI_IN_PLACE {
        mpich::MPI_IN_PLACE as *const c_void
    } else {
        p
    }
}

/// The standard's `MPI_Status`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MPI_Status {
    pub MPI_SOURCE: c_int,
    pub MPI_TAG: c_int,
    pub MPI_ERROR: c_int,
    /// MPICH's count (low and high words, the high one with the cancelled bit).
    pub MPI_internal: [c_int; 5],
}

/// MPICH's `MPI_Status`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct MpichStatus {
    count_lo: c_int,
    count_hi_and_cancelled: c_int,
    source: c_int,
    tag: c_int,
    error: c_int,
}

impl MpichStatus {
    fn of(s: &MPI_Status) -> MpichStatus {
        MpichStatus {
            count_lo: s.MPI_internal[0],
            count_hi_and_cancelled: s.MPI_internal[1],
            source: rank(s.MPI_SOURCE),
            tag: tag(s.MPI_TAG),
            error: rc_to_mpich(s.MPI_ERROR),
        }
    }

    /// Writes it to the standard's status at `out` (unless `MPI_STATUS_IGNORE`).
    ///
    /// # Safety
    ///
    /// `out` is null or points at a writable `MPI_Status`.
    unsafe fn write(&self, out: *mut MPI_Status) {
        if out.is_null() {
            return;
        }
        let s = MPI_Status {
            MPI_SOURCE: special(self.source, &RANKS, false),
            MPI_TAG: special(self.tag, &TAGS, false),
            MPI_ERROR: rc(self.error),
            MPI_internal: [self.count_lo, self.count_hi_and_cancelled, 0, 0, 0],
        };
        // SAFETY: the caller's promise.
        unsafe { out.write(s) };
    }
}

/// Runs `f`, whose handles were translated, returning the standard's code: a handle that
/// did not translate is its class's code.
fn call(f: impl FnOnce() -> Result<c_int, c_int>) -> c_int {
    match f() {
        Ok(code) => rc(code),
        Err(class) => class,
    }
}

// ------------------------------------------------------------------ the environment

#[no_mangle]
pub extern "C" fn MPI_Init(argc: *mut c_int, argv: *mut *mut *mut c_char) -> c_int {
    let init = mpich_fn!("MPI_Init", fn(*mut c_int, *mut *mut *mut c_char) -> c_int);
    // SAFETY: MPI's contract, passed on.
    rc(unsafe { init(argc, argv) })
}

#[no_mangle]
pub extern "C" fn MPI_Init_thread(
    argc: *mut c_int,
    argv: *mut *mut *mut c_char,
    required: c_int,
    provided: *mut c_int,
) -> c_int {
    let f = mpich_fn!(
        "MPI_Init_thread",
        fn(*mut c_int, *mut *mut *mut c_char, c_int, *mut c_int) -> c_int
    );
    let mut got = 0;
    // SAFETY: MPI's contract, passed on; `got` is ours.
    let code = unsafe { f(argc, argv, special(required, &THREADS, true), &mut got) };
    // SAFETY: MPI's contract: `provided` is writable.
    unsafe { provided.write(special(got, &THREADS, false)) };
    rc(code)
}

#[no_mangle]
pub extern "C" fn MPI_Query_thread(provided: *mut c_int) -> c_int {
    let mut got = 0;
    // SAFETY: `got` is ours.
    let code = unsafe { mpich_fn!("MPI_Query_thread", fn(*mut c_int) -> c_int)(&mut got) };
    // SAFETY: MPI's contract: `provided` is writable.
    unsafe { provided.write(special(got, &THREADS, false)) };
    rc(code)
}

#[no_mangle]
pub extern "C" fn MPI_Finalize() -> c_int {
    // SAFETY: no arguments.
    rc(unsafe { mpich_fn!("MPI_Finalize", fn() -> c_int)() })
}

#[no_mangle]
pub extern "C" fn MPI_Initialized(flag: *mut c_int) -> c_int {
    // SAFETY: MPI's contract, passed on.
    rc(unsafe { mpich_fn!("MPI_Initialized", fn(*mut c_int) -> c_int)(flag) })
}

#[no_mangle]
pub extern "C" fn MPI_Finalized(flag: *mut c_int) -> c_int {
    // SAFETY: MPI's contract, passed on.
    rc(unsafe { mpich_fn!("MPI_Finalized", fn(*mut c_int) -> c_int)(flag) })
}

#[no_mangle]
pub extern "C" fn MPI_Abort(comm: H, code: c_int) -> c_int {
    call(|| {
        let c = m(comm, abi::MPI_ERR_COMM)?;
        // SAFETY: plain values.
        Ok(unsafe { mpich_fn!("MPI_Abort", fn(c_int, c_int) -> c_int)(c, code) })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Wtime() -> f64 {
    // SAFETY: no arguments.
    unsafe { mpich_fn!("MPI_Wtime", fn() -> f64)() }
}

#[no_mangle]
pub extern "C" fn MPI_Wtick() -> f64 {
    // SAFETY: no arguments.
    unsafe { mpich_fn!("MPI_Wtick", fn() -> f64)() }
}

#[no_mangle]
pub extern "C" fn MPI_Get_version(version: *mut c_int, subversion: *mut c_int) -> c_int {
    // SAFETY: MPI's contract, passed on.
    rc(unsafe {
        mpich_fn!("MPI_Get_version", fn(*mut c_int, *mut c_int) -> c_int)(version, subversion)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Get_library_version(version: *mut c_char, len: *mut c_int) -> c_int {
    // SAFETY: MPI's contract: MPI_MAX_LIBRARY_VERSION_STRING bytes (8192 in both ABIs).
    rc(unsafe {
        mpich_fn!(
            "MPI_Get_library_version",
            fn(*mut c_char, *mut c_int) -> c_int
        )(version, len)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Get_processor_name(name: *mut c_char, len: *mut c_int) -> c_int {
    // MPICH's MPI_MAX_PROCESSOR_NAME (128) is below the standard's (256): the buffer holds it.
    // SAFETY: MPI's contract, passed on.
    rc(unsafe {
        mpich_fn!(
            "MPI_Get_processor_name",
            fn(*mut c_char, *mut c_int) -> c_int
        )(name, len)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Abi_get_version(major: *mut c_int, minor: *mut c_int) -> c_int {
    // SAFETY: MPI's contract: both writable.
    unsafe {
        major.write(abi::MPI_ABI_VERSION);
        minor.write(abi::MPI_ABI_SUBVERSION);
    }
    abi::MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Error_string(code: c_int, text: *mut c_char, len: *mut c_int) -> c_int {
    // SAFETY: MPI's contract: MPI_MAX_ERROR_STRING bytes (512 in both ABIs).
    rc(unsafe {
        mpich_fn!(
            "MPI_Error_string",
            fn(c_int, *mut c_char, *mut c_int) -> c_int
        )(rc_to_mpich(code), text, len)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Error_class(code: c_int, class: *mut c_int) -> c_int {
    let mut got = 0;
    // SAFETY: `got` is ours.
    let r = unsafe {
        mpich_fn!("MPI_Error_class", fn(c_int, *mut c_int) -> c_int)(rc_to_mpich(code), &mut got)
    };
    // SAFETY: MPI's contract: `class` is writable.
    unsafe { class.write(rc(got)) };
    rc(r)
}

#[no_mangle]
pub extern "C" fn MPI_Comm_set_errhandler(comm: H, handler: H) -> c_int {
    call(|| {
        let (c, e) = (m(comm, abi::MPI_ERR_COMM)?, m(handler, abi::MPI_ERR_ARG)?);
        // SAFETY: plain values.
        Ok(unsafe { mpich_fn!("MPI_Comm_set_errhandler", fn(c_int, c_int) -> c_int)(c, e) })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Alloc_mem(size: isize, info: H, base: *mut c_void) -> c_int {
    call(|| {
        let i = m(info, abi::MPI_ERR_INFO)?;
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            mpich_fn!("MPI_Alloc_mem", fn(isize, c_int, *mut c_void) -> c_int)(size, i, base)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Free_mem(base: *mut c_void) -> c_int {
    // SAFETY: MPI's contract, passed on.
    rc(unsafe { mpich_fn!("MPI_Free_mem", fn(*mut c_void) -> c_int)(base) })
}

// ------------------------------------------------------------------ communicators

/// A query of communicator `comm` answering one `int`, mapped back through `pairs`.
fn comm_int(name: &str, comm: H, out: *mut c_int, pairs: &[(c_int, c_int)]) -> c_int {
    call(|| {
        let c = m(comm, abi::MPI_ERR_COMM)?;
        let f = match name {
            "size" => mpich_fn!("MPI_Comm_size", fn(c_int, *mut c_int) -> c_int),
            _ => mpich_fn!("MPI_Comm_rank", fn(c_int, *mut c_int) -> c_int),
        };
        let mut v = 0;
        // SAFETY: `v` is ours.
        let code = unsafe { f(c, &mut v) };
        // SAFETY: MPI's contract: `out` is writable.
        unsafe { out.write(special(v, pairs, false)) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_size(comm: H, size: *mut c_int) -> c_int {
    comm_int("size", comm, size, &[])
}

#[no_mangle]
pub extern "C" fn MPI_Comm_rank(comm: H, r: *mut c_int) -> c_int {
    comm_int("rank", comm, r, &RANKS)
}

/// Writes MPICH's handle `h` of type `ty` as the standard's to `out`.
///
/// # Safety
///
/// `out` is writable.
unsafe fn put_handle(out: *mut H, h: c_int, ty: &'static str) {
    // SAFETY: the caller's promise.
    unsafe { out.write(s(h, ty)) };
}

#[no_mangle]
pub extern "C" fn MPI_Comm_dup(comm: H, out: *mut H) -> c_int {
    call(|| {
        let c = m(comm, abi::MPI_ERR_COMM)?;
        let mut n = 0;
        // SAFETY: `n` is ours.
        let code = unsafe { mpich_fn!("MPI_Comm_dup", fn(c_int, *mut c_int) -> c_int)(c, &mut n) };
        // SAFETY: MPI's contract: `out` is writable.
        unsafe { put_handle(out, n, COMM) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_split(comm: H, color: c_int, key: c_int, out: *mut H) -> c_int {
    call(|| {
        let c = m(comm, abi::MPI_ERR_COMM)?;
        let color = special(color, &RANKS, true);
        let mut n = 0;
        // SAFETY: `n` is ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Comm_split",
                fn(c_int, c_int, c_int, *mut c_int) -> c_int
            )(c, color, key, &mut n)
        };
        // SAFETY: MPI's contract: `out` is writable.
        unsafe { put_handle(out, n, COMM) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_compare(a: H, b: H, result: *mut c_int) -> c_int {
    call(|| {
        let (a, b) = (m(a, abi::MPI_ERR_COMM)?, m(b, abi::MPI_ERR_COMM)?);
        let mut r = 0;
        // SAFETY: `r` is ours.
        let code = unsafe {
            mpich_fn!("MPI_Comm_compare", fn(c_int, c_int, *mut c_int) -> c_int)(a, b, &mut r)
        };
        // SAFETY: MPI's contract: `result` is writable.
        unsafe { result.write(special(r, &COMPARISONS, false)) };
        Ok(code)
    })
}

/// Frees the object behind `*h` with MPICH's `free`, writing back what it leaves there.
fn free_handle(
    h: *mut H,
    ty: &'static str,
    class: c_int,
    free: unsafe extern "C" fn(*mut c_int) -> c_int,
) -> c_int {
    call(|| {
        // SAFETY: MPI's contract: `h` points at a handle, writable.
        let mut v = m(unsafe { h.read() }, class)?;
        // SAFETY: `v` is ours.
        let code = unsafe { free(&mut v) };
        // SAFETY: as above.
        unsafe { put_handle(h, v, ty) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_free(comm: *mut H) -> c_int {
    free_handle(
        comm,
        COMM,
        abi::MPI_ERR_COMM,
        mpich_fn!("MPI_Comm_free", fn(*mut c_int) -> c_int),
    )
}

// ------------------------------------------------------------------ point-to-point

#[no_mangle]
pub extern "C" fn MPI_Send(
    b: *const c_void,
    n: c_int,
    dt: H,
    to: c_int,
    t: c_int,
    comm: H,
) -> c_int {
    call(|| {
        let (d, c) = (m(dt, abi::MPI_ERR_TYPE)?, m(comm, abi::MPI_ERR_COMM)?);
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            mpich_fn!(
                "MPI_Send",
                fn(*const c_void, c_int, c_int, c_int, c_int, c_int) -> c_int
            )(b, n, d, rank(to), t, c)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Ssend(
    b: *const c_void,
    n: c_int,
    dt: H,
    to: c_int,
    t: c_int,
    comm: H,
) -> c_int {
    call(|| {
        let (d, c) = (m(dt, abi::MPI_ERR_TYPE)?, m(comm, abi::MPI_ERR_COMM)?);
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            mpich_fn!(
                "MPI_Ssend",
                fn(*const c_void, c_int, c_int, c_int, c_int, c_int) -> c_int
            )(b, n, d, rank(to), t, c)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Recv(
    b: *mut c_void,
    n: c_int,
    dt: H,
    from: c_int,
    t: c_int,
    comm: H,
    status: *mut MPI_Status,
) -> c_int {
    call(|| {
        let (d, c) = (m(dt, abi::MPI_ERR_TYPE)?, m(comm, abi::MPI_ERR_COMM)?);
        let mut st = MpichStatus::default();
        // SAFETY: MPI's contract, passed on; `st` is ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Recv",
                fn(*mut c_void, c_int, c_int, c_int, c_int, c_int, *mut MpichStatus) -> c_int
            )(b, n, d, rank(from), tag(t), c, &mut st)
        };
        // SAFETY: MPI's contract: `status` is ignored (null) or writable.
        unsafe { st.write(status) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Sendrecv(
    sb: *const c_void,
    sn: c_int,
    sdt: H,
    to: c_int,
    stag: c_int,
    rb: *mut c_void,
    rn: c_int,
    rdt: H,
    from: c_int,
    rtag: c_int,
    comm: H,
    status: *mut MPI_Status,
) -> c_int {
    call(|| {
        let (sd, rd) = (m(sdt, abi::MPI_ERR_TYPE)?, m(rdt, abi::MPI_ERR_TYPE)?);
        let c = m(comm, abi::MPI_ERR_COMM)?;
        let mut st = MpichStatus::default();
        // SAFETY: MPI's contract, passed on; `st` is ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Sendrecv",
                fn(
                    *const c_void,
                    c_int,
                    c_int,
                    c_int,
                    c_int,
                    *mut c_void,
                    c_int,
                    c_int,
                    c_int,
                    c_int,
                    c_int,
                    *mut MpichStatus,
                ) -> c_int
            )(
                sb,
                sn,
                sd,
                rank(to),
                stag,
                rb,
                rn,
                rd,
                rank(from),
                tag(rtag),
                c,
                &mut st,
            )
        };
        // SAFETY: MPI's contract: `status` is ignored (null) or writable.
        unsafe { st.write(status) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Isend(
    b: *const c_void,
    n: c_int,
    dt: H,
    to: c_int,
    t: c_int,
    comm: H,
    req: *mut H,
) -> c_int {
    call(|| {
        let (d, c) = (m(dt, abi::MPI_ERR_TYPE)?, m(comm, abi::MPI_ERR_COMM)?);
        let mut r = 0;
        // SAFETY: MPI's contract, passed on; `r` is ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Isend",
                fn(*const c_void, c_int, c_int, c_int, c_int, c_int, *mut c_int) -> c_int
            )(b, n, d, rank(to), t, c, &mut r)
        };
        // SAFETY: MPI's contract: `req` is writable.
        unsafe { put_handle(req, r, REQUEST) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Irecv(
    b: *mut c_void,
    n: c_int,
    dt: H,
    from: c_int,
    t: c_int,
    comm: H,
    req: *mut H,
) -> c_int {
    call(|| {
        let (d, c) = (m(dt, abi::MPI_ERR_TYPE)?, m(comm, abi::MPI_ERR_COMM)?);
        let mut r = 0;
        // SAFETY: MPI's contract, passed on; `r` is ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Irecv",
                fn(*mut c_void, c_int, c_int, c_int, c_int, c_int, *mut c_int) -> c_int
            )(b, n, d, rank(from), tag(t), c, &mut r)
        };
        // SAFETY: MPI's contract: `req` is writable.
        unsafe { put_handle(req, r, REQUEST) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Wait(req: *mut H, status: *mut MPI_Status) -> c_int {
    call(|| {
        // SAFETY: MPI's contract: `req` points at a request, writable.
        let mut r = m(unsafe { req.read() }, abi::MPI_ERR_REQUEST)?;
        let mut st = MpichStatus::default();
        // SAFETY: `r` and `st` are ours.
        let code = unsafe {
            mpich_fn!("MPI_Wait", fn(*mut c_int, *mut MpichStatus) -> c_int)(&mut r, &mut st)
        };
        // SAFETY: as above; `status` is ignored (null) or writable.
        unsafe {
            put_handle(req, r, REQUEST);
            st.write(status);
        }
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Test(req: *mut H, flag: *mut c_int, status: *mut MPI_Status) -> c_int {
    call(|| {
        // SAFETY: MPI's contract: `req` points at a request, writable.
        let mut r = m(unsafe { req.read() }, abi::MPI_ERR_REQUEST)?;
        let mut st = MpichStatus::default();
        let mut done = 0;
        // SAFETY: `r`, `done` and `st` are ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Test",
                fn(*mut c_int, *mut c_int, *mut MpichStatus) -> c_int
            )(&mut r, &mut done, &mut st)
        };
        // SAFETY: as above; `flag` writable, `status` ignored (null) or writable.
        unsafe {
            put_handle(req, r, REQUEST);
            flag.write(done);
            if done != 0 {
                st.write(status);
            }
        }
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Waitall(n: c_int, reqs: *mut H, statuses: *mut MPI_Status) -> c_int {
    call(|| {
        let n = usize::try_from(n).map_err(|_| abi::MPI_ERR_COUNT)?;
        // SAFETY: MPI's contract: `n` requests at `reqs`, writable.
        let standard = unsafe { std::slice::from_raw_parts_mut(reqs, n) };
        let mut r = standard
            .iter()
            .map(|&h| m(h, abi::MPI_ERR_REQUEST))
            .collect::<Result<Vec<c_int>, c_int>>()?;
        let mut st = vec![MpichStatus::default(); n];
        // SAFETY: `r` and `st` are ours, `n` long.
        let code = unsafe {
            mpich_fn!(
                "MPI_Waitall",
                fn(c_int, *mut c_int, *mut MpichStatus) -> c_int
            )(n as c_int, r.as_mut_ptr(), st.as_mut_ptr())
        };
        for (i, (h, &v)) in standard.iter_mut().zip(&r).enumerate() {
            *h = s(v, REQUEST);
            if !statuses.is_null() {
                // SAFETY: MPI's contract: `n` writable statuses unless ignored.
                unsafe { st[i].write(statuses.add(i)) };
            }
        }
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Probe(from: c_int, t: c_int, comm: H, status: *mut MPI_Status) -> c_int {
    call(|| {
        let c = m(comm, abi::MPI_ERR_COMM)?;
        let mut st = MpichStatus::default();
        // SAFETY: `st` is ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Probe",
                fn(c_int, c_int, c_int, *mut MpichStatus) -> c_int
            )(rank(from), tag(t), c, &mut st)
        };
        // SAFETY: MPI's contract: `status` is ignored (null) or writable.
        unsafe { st.write(status) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Get_count(status: *const MPI_Status, dt: H, count: *mut c_int) -> c_int {
    call(|| {
        let d = m(dt, abi::MPI_ERR_TYPE)?;
        // SAFETY: MPI's contract: a status to read.
        let st = MpichStatus::of(unsafe { &*status });
        let mut n = 0;
        // SAFETY: `st` and `n` are ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Get_count",
                fn(*const MpichStatus, c_int, *mut c_int) -> c_int
            )(&st, d, &mut n)
        };
        // SAFETY: MPI's contract: `count` is writable.
        unsafe { count.write(special(n, &RANKS, false)) };
        Ok(code)
    })
}

// ------------------------------------------------------------------ collectives

#[no_mangle]
pub extern "C" fn MPI_Barrier(comm: H) -> c_int {
    call(|| {
        let c = m(comm, abi::MPI_ERR_COMM)?;
        // SAFETY: a plain value.
        Ok(unsafe { mpich_fn!("MPI_Barrier", fn(c_int) -> c_int)(c) })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Bcast(b: *mut c_void, n: c_int, dt: H, root: c_int, comm: H) -> c_int {
    call(|| {
        let (d, c) = (m(dt, abi::MPI_ERR_TYPE)?, m(comm, abi::MPI_ERR_COMM)?);
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            mpich_fn!(
                "MPI_Bcast",
                fn(*mut c_void, c_int, c_int, c_int, c_int) -> c_int
            )(b, n, d, rank(root), c)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Reduce(
    sb: *const c_void,
    rb: *mut c_void,
    n: c_int,
    dt: H,
    op: H,
    root: c_int,
    comm: H,
) -> c_int {
    call(|| {
        let (d, o) = (m(dt, abi::MPI_ERR_TYPE)?, m(op, abi::MPI_ERR_OP)?);
        let c = m(comm, abi::MPI_ERR_COMM)?;
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            mpich_fn!(
                "MPI_Reduce",
                fn(*const c_void, *mut c_void, c_int, c_int, c_int, c_int, c_int) -> c_int
            )(buf(sb), rb, n, d, o, rank(root), c)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Allreduce(
    sb: *const c_void,
    rb: *mut c_void,
    n: c_int,
    dt: H,
    op: H,
    comm: H,
) -> c_int {
    call(|| {
        let (d, o) = (m(dt, abi::MPI_ERR_TYPE)?, m(op, abi::MPI_ERR_OP)?);
        let c = m(comm, abi::MPI_ERR_COMM)?;
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            mpich_fn!(
                "MPI_Allreduce",
                fn(*const c_void, *mut c_void, c_int, c_int, c_int, c_int) -> c_int
            )(buf(sb), rb, n, d, o, c)
        })
    })
}

/// Gather and allgather (`root`: `None` for allgather).
fn gather(
    sb: *const c_void,
    sn: c_int,
    sdt: H,
    rb: *mut c_void,
    rn: c_int,
    rdt: H,
    root: Option<c_int>,
    comm: H,
) -> c_int {
    call(|| {
        let (sd, rd) = (m(sdt, abi::MPI_ERR_TYPE)?, m(rdt, abi::MPI_ERR_TYPE)?);
        let c = m(comm, abi::MPI_ERR_COMM)?;
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            match root {
                Some(r) => mpich_fn!(
                    "MPI_Gather",
                    fn(
                        *const c_void,
                        c_int,
                        c_int,
                        *mut c_void,
                        c_int,
                        c_int,
                        c_int,
                        c_int,
                    ) -> c_int
                )(buf(sb), sn, sd, rb, rn, rd, rank(r), c),
                None => mpich_fn!(
                    "MPI_Allgather",
                    fn(*const c_void, c_int, c_int, *mut c_void, c_int, c_int, c_int) -> c_int
                )(buf(sb), sn, sd, rb, rn, rd, c),
            }
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Gather(
    sb: *const c_void,
    sn: c_int,
    sdt: H,
    rb: *mut c_void,
    rn: c_int,
    rdt: H,
    root: c_int,
    comm: H,
) -> c_int {
    gather(sb, sn, sdt, rb, rn, rdt, Some(root), comm)
}

#[no_mangle]
pub extern "C" fn MPI_Allgather(
    sb: *const c_void,
    sn: c_int,
    sdt: H,
    rb: *mut c_void,
    rn: c_int,
    rdt: H,
    comm: H,
) -> c_int {
    gather(sb, sn, sdt, rb, rn, rdt, None, comm)
}

#[no_mangle]
pub extern "C" fn MPI_Alltoall(
    sb: *const c_void,
    sn: c_int,
    sdt: H,
    rb: *mut c_void,
    rn: c_int,
    rdt: H,
    comm: H,
) -> c_int {
    call(|| {
        let (sd, rd) = (m(sdt, abi::MPI_ERR_TYPE)?, m(rdt, abi::MPI_ERR_TYPE)?);
        let c = m(comm, abi::MPI_ERR_COMM)?;
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            mpich_fn!(
                "MPI_Alltoall",
                fn(*const c_void, c_int, c_int, *mut c_void, c_int, c_int, c_int) -> c_int
            )(buf(sb), sn, sd, rb, rn, rd, c)
        })
    })
}

// ------------------------------------------------------------------ datatypes

#[no_mangle]
pub extern "C" fn MPI_Type_size(dt: H, size: *mut c_int) -> c_int {
    call(|| {
        let d = m(dt, abi::MPI_ERR_TYPE)?;
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe { mpich_fn!("MPI_Type_size", fn(c_int, *mut c_int) -> c_int)(d, size) })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_contiguous(n: c_int, old: H, out: *mut H) -> c_int {
    call(|| {
        let o = m(old, abi::MPI_ERR_TYPE)?;
        let mut t = 0;
        // SAFETY: `t` is ours.
        let code = unsafe {
            mpich_fn!("MPI_Type_contiguous", fn(c_int, c_int, *mut c_int) -> c_int)(n, o, &mut t)
        };
        // SAFETY: MPI's contract: `out` is writable.
        unsafe { put_handle(out, t, DATATYPE) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_vector(
    n: c_int,
    blocklen: c_int,
    stride: c_int,
    old: H,
    out: *mut H,
) -> c_int {
    call(|| {
        let o = m(old, abi::MPI_ERR_TYPE)?;
        let mut t = 0;
        // SAFETY: `t` is ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Type_vector",
                fn(c_int, c_int, c_int, c_int, *mut c_int) -> c_int
            )(n, blocklen, stride, o, &mut t)
        };
        // SAFETY: MPI's contract: `out` is writable.
        unsafe { put_handle(out, t, DATATYPE) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_commit(dt: *mut H) -> c_int {
    call(|| {
        // SAFETY: MPI's contract: `dt` points at a datatype.
        let mut d = m(unsafe { dt.read() }, abi::MPI_ERR_TYPE)?;
        // SAFETY: `d` is ours.
        Ok(unsafe { mpich_fn!("MPI_Type_commit", fn(*mut c_int) -> c_int)(&mut d) })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_free(dt: *mut H) -> c_int {
    free_handle(
        dt,
        DATATYPE,
        abi::MPI_ERR_TYPE,
        mpich_fn!("MPI_Type_free", fn(*mut c_int) -> c_int),
    )
}

// ------------------------------------------------------------------ one-sided

#[no_mangle]
pub extern "C" fn MPI_Win_create(
    base: *mut c_void,
    size: isize,
    unit: c_int,
    info: H,
    comm: H,
    win: *mut H,
) -> c_int {
    call(|| {
        let (i, c) = (m(info, abi::MPI_ERR_INFO)?, m(comm, abi::MPI_ERR_COMM)?);
        let mut w = 0;
        // SAFETY: MPI's contract, passed on; `w` is ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Win_create",
                fn(*mut c_void, isize, c_int, c_int, c_int, *mut c_int) -> c_int
            )(base, size, unit, i, c, &mut w)
        };
        // SAFETY: MPI's contract: `win` is writable.
        unsafe { put_handle(win, w, WIN) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_allocate(
    size: isize,
    unit: c_int,
    info: H,
    comm: H,
    base: *mut c_void,
    win: *mut H,
) -> c_int {
    call(|| {
        let (i, c) = (m(info, abi::MPI_ERR_INFO)?, m(comm, abi::MPI_ERR_COMM)?);
        let mut w = 0;
        // SAFETY: MPI's contract, passed on; `w` is ours.
        let code = unsafe {
            mpich_fn!(
                "MPI_Win_allocate",
                fn(isize, c_int, c_int, c_int, *mut c_void, *mut c_int) -> c_int
            )(size, unit, i, c, base, &mut w)
        };
        // SAFETY: MPI's contract: `win` is writable.
        unsafe { put_handle(win, w, WIN) };
        Ok(code)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_free(win: *mut H) -> c_int {
    free_handle(
        win,
        WIN,
        abi::MPI_ERR_WIN,
        mpich_fn!("MPI_Win_free", fn(*mut c_int) -> c_int),
    )
}

/// A window call taking `(int, win)`: `MPI_Win_fence(assert)`, `MPI_Win_flush(rank)`,
/// `MPI_Win_unlock(rank)`, `MPI_Win_lock_all(assert)`.
fn win_int(win: H, v: c_int, f: unsafe extern "C" fn(c_int, c_int) -> c_int) -> c_int {
    call(|| {
        let w = m(win, abi::MPI_ERR_WIN)?;
        // SAFETY: plain values.
        Ok(unsafe { f(v, w) })
    })
}

/// A window call taking the window alone.
fn win_only(win: H, f: unsafe extern "C" fn(c_int) -> c_int) -> c_int {
    call(|| {
        let w = m(win, abi::MPI_ERR_WIN)?;
        // SAFETY: a plain value.
        Ok(unsafe { f(w) })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_fence(assert: c_int, win: H) -> c_int {
    win_int(
        win,
        modes(assert),
        mpich_fn!("MPI_Win_fence", fn(c_int, c_int) -> c_int),
    )
}

#[no_mangle]
pub extern "C" fn MPI_Win_flush(r: c_int, win: H) -> c_int {
    win_int(
        win,
        rank(r),
        mpich_fn!("MPI_Win_flush", fn(c_int, c_int) -> c_int),
    )
}

#[no_mangle]
pub extern "C" fn MPI_Win_flush_local(r: c_int, win: H) -> c_int {
    win_int(
        win,
        rank(r),
        mpich_fn!("MPI_Win_flush_local", fn(c_int, c_int) -> c_int),
    )
}

#[no_mangle]
pub extern "C" fn MPI_Win_unlock(r: c_int, win: H) -> c_int {
    win_int(
        win,
        rank(r),
        mpich_fn!("MPI_Win_unlock", fn(c_int, c_int) -> c_int),
    )
}

#[no_mangle]
pub extern "C" fn MPI_Win_lock_all(assert: c_int, win: H) -> c_int {
    win_int(
        win,
        modes(assert),
        mpich_fn!("MPI_Win_lock_all", fn(c_int, c_int) -> c_int),
    )
}

#[no_mangle]
pub extern "C" fn MPI_Win_unlock_all(win: H) -> c_int {
    win_only(win, mpich_fn!("MPI_Win_unlock_all", fn(c_int) -> c_int))
}

#[no_mangle]
pub extern "C" fn MPI_Win_flush_all(win: H) -> c_int {
    win_only(win, mpich_fn!("MPI_Win_flush_all", fn(c_int) -> c_int))
}

#[no_mangle]
pub extern "C" fn MPI_Win_flush_local_all(win: H) -> c_int {
    win_only(
        win,
        mpich_fn!("MPI_Win_flush_local_all", fn(c_int) -> c_int),
    )
}

#[no_mangle]
pub extern "C" fn MPI_Win_lock(kind: c_int, r: c_int, assert: c_int, win: H) -> c_int {
    call(|| {
        let w = m(win, abi::MPI_ERR_WIN)?;
        // SAFETY: plain values.
        Ok(unsafe {
            mpich_fn!("MPI_Win_lock", fn(c_int, c_int, c_int, c_int) -> c_int)(
                special(kind, &LOCKS, true),
                rank(r),
                modes(assert),
                w,
            )
        })
    })
}

/// `MPI_Put` and `MPI_Get`.
fn put_get(
    get: bool,
    ob: *mut c_void,
    on: c_int,
    odt: H,
    r: c_int,
    disp: isize,
    tn: c_int,
    tdt: H,
    win: H,
) -> c_int {
    call(|| {
        let (od, td) = (m(odt, abi::MPI_ERR_TYPE)?, m(tdt, abi::MPI_ERR_TYPE)?);
        let w = m(win, abi::MPI_ERR_WIN)?;
        let f = if get {
            mpich_fn!(
                "MPI_Get",
                fn(*mut c_void, c_int, c_int, c_int, isize, c_int, c_int, c_int) -> c_int
            )
        } else {
            mpich_fn!(
                "MPI_Put",
                fn(*mut c_void, c_int, c_int, c_int, isize, c_int, c_int, c_int) -> c_int
            )
        };
        // SAFETY: MPI's contract, passed on (a put only reads its origin).
        Ok(unsafe { f(ob, on, od, rank(r), disp, tn, td, w) })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Put(
    ob: *const c_void,
    on: c_int,
    odt: H,
    r: c_int,
    disp: isize,
    tn: c_int,
    tdt: H,
    win: H,
) -> c_int {
    put_get(false, ob.cast_mut(), on, odt, r, disp, tn, tdt, win)
}

#[no_mangle]
pub extern "C" fn MPI_Get(
    ob: *mut c_void,
    on: c_int,
    odt: H,
    r: c_int,
    disp: isize,
    tn: c_int,
    tdt: H,
    win: H,
) -> c_int {
    put_get(true, ob, on, odt, r, disp, tn, tdt, win)
}

#[no_mangle]
pub extern "C" fn MPI_Accumulate(
    ob: *const c_void,
    on: c_int,
    odt: H,
    r: c_int,
    disp: isize,
    tn: c_int,
    tdt: H,
    op: H,
    win: H,
) -> c_int {
    call(|| {
        let (od, td) = (m(odt, abi::MPI_ERR_TYPE)?, m(tdt, abi::MPI_ERR_TYPE)?);
        let (o, w) = (m(op, abi::MPI_ERR_OP)?, m(win, abi::MPI_ERR_WIN)?);
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            mpich_fn!(
                "MPI_Accumulate",
                fn(*const c_void, c_int, c_int, c_int, isize, c_int, c_int, c_int, c_int) -> c_int
            )(ob, on, od, rank(r), disp, tn, td, o, w)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Fetch_and_op(
    ob: *const c_void,
    rb: *mut c_void,
    dt: H,
    r: c_int,
    disp: isize,
    op: H,
    win: H,
) -> c_int {
    call(|| {
        let (d, o) = (m(dt, abi::MPI_ERR_TYPE)?, m(op, abi::MPI_ERR_OP)?);
        let w = m(win, abi::MPI_ERR_WIN)?;
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            mpich_fn!(
                "MPI_Fetch_and_op",
                fn(*const c_void, *mut c_void, c_int, c_int, isize, c_int, c_int) -> c_int
            )(ob, rb, d, rank(r), disp, o, w)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Compare_and_swap(
    ob: *const c_void,
    cb: *const c_void,
    rb: *mut c_void,
    dt: H,
    r: c_int,
    disp: isize,
    win: H,
) -> c_int {
    call(|| {
        let (d, w) = (m(dt, abi::MPI_ERR_TYPE)?, m(win, abi::MPI_ERR_WIN)?);
        // SAFETY: MPI's contract, passed on.
        Ok(unsafe {
            mpich_fn!(
                "MPI_Compare_and_swap",
                fn(*const c_void, *const c_void, *mut c_void, c_int, c_int, isize, c_int) -> c_int
            )(ob, cb, rb, d, rank(r), disp, w)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predefined_handles_pair_by_name_and_the_librarys_own_pass_through() {
        assert_eq!(m(abi::MPI_COMM_WORLD, -1), Ok(mpich::MPI_COMM_WORLD));
        assert_eq!(m(abi::MPI_DOUBLE, -1), Ok(mpich::MPI_DOUBLE));
        assert_eq!(m(abi::MPI_SUM, -1), Ok(mpich::MPI_SUM));
        // MPICH's MPI_MESSAGE_NULL is its MPI_REQUEST_NULL: the type tells them apart.
        assert_eq!(s(mpich::MPI_REQUEST_NULL, REQUEST), abi::MPI_REQUEST_NULL);
        assert_eq!(
            s(mpich::MPI_REQUEST_NULL, "MPI_Message"),
            abi::MPI_MESSAGE_NULL
        );
        assert_eq!(s(mpich::MPI_WIN_NULL, WIN), abi::MPI_WIN_NULL);
        // An unknown small value is an error of the class asked for.
        assert_eq!(m(0x3ff, 77), Err(77));
        // A communicator the library made (MPICH's shape: high bits set) round-trips.
        let mine = 0x8400_0003_u32 as c_int;
        assert_eq!(m(s(mine, COMM), -1), Ok(mine));
    }

    #[test]
    fn sentinels_and_error_classes_translate_both_ways() {
        assert_eq!(rank(abi::MPI_ANY_SOURCE), mpich::MPI_ANY_SOURCE);
        assert_eq!(rank(abi::MPI_PROC_NULL), mpich::MPI_PROC_NULL);
        assert_eq!(rank(5), 5);
        assert_eq!(tag(abi::MPI_ANY_TAG), mpich::MPI_ANY_TAG);
        assert_eq!(rc(mpich::MPI_ERR_TRUNCATE), abi::MPI_ERR_TRUNCATE);
        assert_eq!(rc_to_mpich(abi::MPI_ERR_RMA_SYNC), mpich::MPI_ERR_RMA_SYNC);
        assert_eq!(
            modes(abi::MPI_MODE_NOCHECK | abi::MPI_MODE_NOSUCCEED),
            mpich::MPI_MODE_NOCHECK | mpich::MPI_MODE_NOSUCCEED
        );
        let st = MpichStatus {
            count_lo: 12,
            count_hi_and_cancelled: 0,
            source: mpich::MPI_PROC_NULL,
            tag: mpich::MPI_ANY_TAG,
            error: mpich::MPI_SUCCESS,
        };
        let mut out = MPI_Status::default();
        // SAFETY: `out` is a status of ours.
        unsafe { st.write(&mut out) };
        assert_eq!(
            (out.MPI_SOURCE, out.MPI_TAG, out.MPI_internal[0]),
            (abi::MPI_PROC_NULL, abi::MPI_ANY_TAG, 12)
        );
        let back = MpichStatus::of(&out);
        assert_eq!(
            (back.source, back.tag, back.count_lo),
            (st.source, st.tag, 12)
        );
    }
}
