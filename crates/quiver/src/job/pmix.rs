//! A PMIx client: how a process started by Open MPI's `mpirun` (PRRTE or ORTE) or by
//! `srun --mpi=pmix` reaches its launcher's key-value space (put, commit, fence, get).
//!
//! The PMIx client library (`libpmix.so.2`, Debian's `libpmix2`; another file with
//! `QUIVER_PMIX_LIB`) is loaded at run time, so that quiver builds and runs where it is
//! absent: [`Pmix::init`] then reports why it cannot be used, and the bootstrap falls
//! back to the next service.
//!
//! # Guarantees
//!
//! - Only the calls of the bootstrap are used (init, put, commit, fence and get with a
//!   timeout, finalize, and those that report errors and release values), through C
//!   types laid out as PMIx 4's `pmix_common.h` declares them (their sizes are checked
//!   at compile time).
//! - A value read back is copied out and freed at once; a value that is not a string is
//!   an [`Error::Launcher`].
//! - [`Pmix::finalize`] ends the library's use: its progress thread stops, and the
//!   library stays loaded (PMIx cannot be unloaded safely).

use std::ffi::{c_char, c_int, CStr, CString};

use crate::error::{Error, Result};

/// Where the library is looked for, in order, unless `QUIVER_PMIX_LIB` names it.
const LIBRARIES: [&str; 2] = ["libpmix.so.2", "libpmix.so"];

/// `PMIX_MAX_NSLEN + 1`.
const NSPACE_LEN: usize = 256;
/// `PMIX_SUCCESS`.
const SUCCESS: c_int = 0;
/// `PMIX_GLOBAL`: shared with every process of the job, on every node.
const SCOPE_GLOBAL: u8 = 3;
/// `PMIX_STRING`.
const TYPE_STRING: u16 = 3;

/// `pmix_proc_t`.
#[repr(C)]
struct Proc {
    nspace: [c_char; NSPACE_LEN],
    rank: u32,
}

/// The data of `pmix_value_t`: a union whose largest member (`pmix_envar_t`) is 24
/// bytes; only the string is used here.
#[repr(C)]
#[derive(Clone, Copy)]
union Data {
    string: *mut c_char,
    integer: c_int,
    _size: [u64; 3],
}

/// `pmix_value_t`.
#[repr(C)]
struct Value {
    kind: u16,
    data: Data,
}

/// `pmix_info_t`: a key, directives, a value.
#[repr(C)]
struct Info {
    key: [c_char; KEY_LEN],
    flags: u32,
    value: Value,
}

/// `PMIX_MAX_KEYLEN + 1`.
const KEY_LEN: usize = 512;
/// `PMIX_INT`.
const TYPE_INT: u16 = 6;

const _: () = assert!(std::mem::size_of::<Proc>() == 260);
const _: () = assert!(std::mem::size_of::<Value>() == 32);
const _: () = assert!(std::mem::size_of::<Info>() == 552);

impl Info {
    /// `PMIX_TIMEOUT` = `seconds` (an `int`; 0 would mean for ever, so at least 1).
    fn timeout(seconds: u64) -> Info {
        let mut key = [0 as c_char; KEY_LEN];
        for (k, b) in key.iter_mut().zip(b"pmix.timeout") {
            *k = *b as c_char;
        }
        let mut data = Data { _size: [0; 3] };
        data.integer = seconds.clamp(1, i32::MAX as u64) as c_int;
        Info {
            key,
            flags: 0,
            value: Value {
                kind: TYPE_INT,
                data,
            },
        }
    }
}

type InitFn = unsafe extern "C" fn(*mut Proc, *mut std::ffi::c_void, usize) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut Value) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type FenceFn = unsafe extern "C" fn(*const Proc, usize, *const std::ffi::c_void, usize) -> c_int;
type GetFn = unsafe extern "C" fn(
    *const Proc,
    *const c_char,
    *const std::ffi::c_void,
    usize,
    *mut *mut Value,
) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const std::ffi::c_void, usize) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type ValueDestructFn = unsafe extern "C" fn(*mut Value);

/// The library's entry points, resolved once.
struct Api {
    init: InitFn,
    put: PutFn,
    commit: CommitFn,
    fence: FenceFn,
    get: GetFn,
    finalize: FinalizeFn,
    error_string: ErrorStringFn,
    value_destruct: ValueDestructFn,
}

/// An initialised PMIx client.
pub(crate) struct Pmix {
    api: Api,
    /// This process's namespace (the job) and rank, as the server knows them.
    me: Proc,
    /// The library file that was loaded.
    library: String,
}

impl Pmix {
    /// Loads the library (`QUIVER_PMIX_LIB`, else [`LIBRARIES`]) and connects to the
    /// local PMIx server named by the launcher's `PMIX_*` variables.
    pub(crate) fn init(lib_override: Option<&str>) -> Result<Pmix> {
        let (lib, library) = load(lib_override)?;
        // SAFETY: each symbol is the PMIx 4 function of that name, whose C signature the
        // type it is read as repeats (pmix.h); `lib` is leaked below, so the pointers
        // stay valid for the life of the process.
        let api = unsafe {
            let sym = |name: &[u8]| -> Result<*const ()> {
                lib.get::<*const ()>(name)
                    .map(|s| *s)
                    .map_err(|e| Error::Launcher {
                        service: format!("PMIx ({library})"),
                        reason: format!(
                            "{} not found in the library: {e}",
                            String::from_utf8_lossy(&name[..name.len() - 1])
                        ),
                    })
            };
            Api {
                init: std::mem::transmute::<*const (), InitFn>(sym(b"PMIx_Init\0")?),
                put: std::mem::transmute::<*const (), PutFn>(sym(b"PMIx_Put\0")?),
                commit: std::mem::transmute::<*const (), CommitFn>(sym(b"PMIx_Commit\0")?),
                fence: std::mem::transmute::<*const (), FenceFn>(sym(b"PMIx_Fence\0")?),
                get: std::mem::transmute::<*const (), GetFn>(sym(b"PMIx_Get\0")?),
                finalize: std::mem::transmute::<*const (), FinalizeFn>(sym(b"PMIx_Finalize\0")?),
                error_string: std::mem::transmute::<*const (), ErrorStringFn>(sym(
                    b"PMIx_Error_string\0",
                )?),
                value_destruct: std::mem::transmute::<*const (), ValueDestructFn>(sym(
                    b"PMIx_Value_destruct\0",
                )?),
            }
        };
        // PMIx keeps threads and handlers that point into the library: never unload it.
        std::mem::forget(lib);
        let mut me = Proc {
            nspace: [0; NSPACE_LEN],
            rank: 0,
        };
        // SAFETY: `me` is a valid `pmix_proc_t` for the library to fill; no info array.
        let rc = unsafe { (api.init)(&mut me, std::ptr::null_mut(), 0) };
        let pmix = Pmix { api, me, library };
        pmix.check("PMIx_Init", rc)?;
        Ok(pmix)
    }

    /// This process's rank in its namespace.
    pub(crate) fn rank(&self) -> u32 {
        self.me.rank
    }

    /// The namespace (the launcher's name of the job).
    pub(crate) fn namespace(&self) -> String {
        // SAFETY: PMIx_Init filled `nspace` with a NUL-terminated string of at most
        // PMIX_MAX_NSLEN characters; the last byte is still the zero it was created with.
        unsafe { CStr::from_ptr(self.me.nspace.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// The library file loaded.
    pub(crate) fn library(&self) -> &str {
        &self.library
    }

    /// Publishes `key` = `value` to the whole job, and commits it.
    pub(crate) fn put(&mut self, key: &str, value: &str) -> Result<()> {
        let ckey = self.cstring(key)?;
        let cvalue = self.cstring(value)?;
        let mut v = Value {
            kind: TYPE_STRING,
            data: Data {
                string: cvalue.as_ptr().cast_mut(),
            },
        };
        // SAFETY: `ckey` and the value's string are NUL-terminated and live across the
        // call; PMIx_Put copies the value (it does not keep the pointer).
        let rc = unsafe { (self.api.put)(SCOPE_GLOBAL, ckey.as_ptr(), &mut v) };
        self.check("PMIx_Put", rc)?;
        // SAFETY: no arguments.
        let rc = unsafe { (self.api.commit)() };
        self.check("PMIx_Commit", rc)
    }

    /// Waits for every process of the job, at most `limit`: what they committed is
    /// then visible.
    pub(crate) fn fence(&mut self, limit: std::time::Duration) -> Result<()> {
        let info = Info::timeout(limit.as_secs());
        // SAFETY: no processes (all of the caller's namespace: a null array with zero
        // length, as pmix.h allows) and one valid info, alive across the call.
        let rc = unsafe { (self.api.fence)(std::ptr::null(), 0, (&info as *const Info).cast(), 1) };
        self.check("PMIx_Fence", rc)
    }

    /// The string `key` put by `rank` of this job, waiting at most `limit` for it;
    /// `None` if it put none.
    pub(crate) fn get(
        &mut self,
        rank: u32,
        key: &str,
        limit: std::time::Duration,
    ) -> Result<Option<String>> {
        let info = Info::timeout(limit.as_secs());
        let ckey = self.cstring(key)?;
        let proc_ = Proc {
            nspace: self.me.nspace,
            rank,
        };
        let mut out: *mut Value = std::ptr::null_mut();
        // SAFETY: `proc_`, `ckey` and the one info are valid for the call; `out` receives
        // a value the library allocated (or stays null on failure).
        let rc = unsafe {
            let info = (&info as *const Info).cast();
            (self.api.get)(&proc_, ckey.as_ptr(), info, 1, &mut out)
        };
        /// `PMIX_ERR_NOT_FOUND`.
        const NOT_FOUND: c_int = -46;
        if rc == NOT_FOUND {
            return Ok(None);
        }
        self.check("PMIx_Get", rc)?;
        if out.is_null() {
            return Ok(None);
        }
        // SAFETY: on success `out` points to a `pmix_value_t` the library malloc'ed for
        // the caller, who releases it (PMIX_VALUE_RELEASE: PMIx_Value_destruct frees what
        // it holds, then the value itself is freed); the string is copied out first.
        let text = unsafe {
            let v = &*out;
            let text = if v.kind == TYPE_STRING && !v.data.string.is_null() {
                Some(CStr::from_ptr(v.data.string).to_string_lossy().into_owned())
            } else {
                None
            };
            let kind = v.kind;
            (self.api.value_destruct)(out);
            libc::free(out.cast());
            text.ok_or_else(|| Error::Launcher {
                service: self.service(),
                reason: format!("the value of {key} is of PMIx type {kind}, not a string"),
            })?
        };
        Ok(Some(text))
    }

    /// Ends this process's use of PMIx.
    pub(crate) fn finalize(self) -> Result<()> {
        // SAFETY: no info array.
        let rc = unsafe { (self.api.finalize)(std::ptr::null(), 0) };
        self.check("PMIx_Finalize", rc)
    }

    fn cstring(&self, s: &str) -> Result<CString> {
        CString::new(s).map_err(|_| Error::Config(format!("PMIx key or value {s:?} holds a NUL")))
    }

    fn check(&self, call: &str, rc: c_int) -> Result<()> {
        if rc == SUCCESS {
            return Ok(());
        }
        // SAFETY: PMIx_Error_string returns a static NUL-terminated string for any code.
        let text = unsafe {
            let p = (self.api.error_string)(rc);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(Error::Launcher {
            service: self.service(),
            reason: format!("{call} failed: {text} ({rc})"),
        })
    }

    fn service(&self) -> String {
        format!("PMIx ({})", self.library)
    }
}

/// Which library file [`Pmix::init`] would load, if one loads (it stays loaded, as
/// PMIx must).
pub(crate) fn loadable(lib_override: Option<&str>) -> Result<String> {
    load(lib_override).map(|(lib, name)| {
        std::mem::forget(lib);
        name
    })
}

/// Loads the PMIx library; the error says which files were tried and why they failed.
fn load(lib_override: Option<&str>) -> Result<(libloading::Library, String)> {
    let candidates: Vec<&str> = match lib_override {
        Some(l) => vec![l],
        None => LIBRARIES.to_vec(),
    };
    let mut why = Vec::new();
    for name in candidates {
        // SAFETY: loading runs the library's initialisers; libpmix's only set up its
        // own state (it is the library the launcher's PMIx server expects its clients
        // to load).
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return Ok((lib, name.to_string())),
            Err(e) => why.push(format!("{name}: {e}")),
        }
    }
    Err(Error::Launcher {
        service: "PMIx".into(),
        reason: format!(
            "the PMIx client library cannot be loaded ({}); install it (Debian: libpmix2) or \
             name it with QUIVER_PMIX_LIB",
            why.join("; ")
        ),
    })
}
