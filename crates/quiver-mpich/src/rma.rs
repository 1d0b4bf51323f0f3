//! One-sided communication: `MPI_Alloc_mem`, windows, their synchronization, puts,
//! gets and accumulates (`quiver_mpi::rma`).
//!
//! `MPI_Alloc_mem` hands out memory of the node's shared pool once MPI is initialised
//! (before, and if the pool is full, `malloc`'s): `MPI_Free_mem` tells them apart by the
//! addresses it handed out ([`SHARED`]). Memory not given back before `MPI_Finalize`
//! stays mapped for the rest of the process.

use crate::abi::*;
use crate::comm::put_group;
use crate::handles::{self, dest, WIN};
use crate::{call, call_on, count, Lib, On};
use quiver_mpi::{Class, Flavor, Layout, LockType, MpiError, Op, Peer};
use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

/// The addresses `MPI_Alloc_mem` handed out from the shared pool and `MPI_Free_mem` has
/// not taken back (also after `MPI_Finalize`, when they must not reach `free`).
static SHARED: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

fn shared() -> std::sync::MutexGuard<'static, BTreeSet<usize>> {
    SHARED.lock().unwrap_or_else(|p| p.into_inner())
}

/// The values of a window's predefined attributes (MPI hands out pointers to them).
pub(crate) struct WinAttrs {
    size: isize,
    unit: c_int,
    flavor: c_int,
    model: c_int,
}

#[no_mangle]
pub extern "C" fn MPI_Alloc_mem(size: isize, _info: c_int, base: *mut c_void) -> c_int {
    let mut from_pool = None;
    let rc = crate::STATE.with(|st| match st.lib.try_borrow_mut() {
        Ok(mut guard) => match guard.as_mut() {
            Some(lib) => {
                let Ok(n) = usize::try_from(size) else {
                    return lib.fail(
                        "MPI_Alloc_mem",
                        On::Comm(MPI_COMM_WORLD),
                        MpiError::new(Class::Arg, format!("size {size} is negative")),
                    );
                };
                match lib.mpi.alloc_mem(n) {
                    Ok(p) => {
                        from_pool = Some(p);
                        MPI_SUCCESS
                    }
                    Err(e) => {
                        static ONCE: std::sync::Once = std::sync::Once::new();
                        ONCE.call_once(|| {
                            crate::say!("quiver MPI: MPI_Alloc_mem: {e}; allocating with malloc")
                        });
                        MPI_SUCCESS
                    }
                }
            }
            None => MPI_SUCCESS,
        },
        Err(_) => MPI_SUCCESS,
    });
    if rc != MPI_SUCCESS {
        return rc;
    }
    let p = match from_pool {
        Some(p) => {
            shared().insert(p as usize);
            p.cast::<c_void>()
        }
        None => {
            let Ok(n) = usize::try_from(size) else {
                return MPI_ERR_ARG;
            };
            // SAFETY: malloc of any size; checked below.
            let p = unsafe { libc::malloc(n.max(1)) };
            if p.is_null() {
                return MPI_ERR_NO_MEM;
            }
            p
        }
    };
    // SAFETY: MPI's contract: `base` points at a writable pointer.
    unsafe { base.cast::<*mut c_void>().write(p) };
    MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Free_mem(base: *mut c_void) -> c_int {
    if shared().remove(&(base as usize)) {
        // After MPI_Finalize the memory stays mapped (the library let it go then).
        crate::STATE.with(|st| {
            if let Ok(mut guard) = st.lib.try_borrow_mut() {
                if let Some(lib) = guard.as_mut() {
                    lib.mpi.free_mem(base.cast());
                }
            }
        });
    } else {
        // SAFETY: MPI's contract: `base` came from MPI_Alloc_mem, which used malloc for
        // the addresses it did not record as shared.
        unsafe { libc::free(base) };
    }
    MPI_SUCCESS
}

/// The core's id of window handle `h`.
fn win_id(h: c_int) -> Result<usize, MpiError> {
    if h == MPI_WIN_NULL {
        return Err(MpiError::new(Class::Win, "MPI_WIN_NULL"));
    }
    handles::index_of(h, WIN)
        .ok_or_else(|| MpiError::new(Class::Win, format!("{h:#x} is not a window")))
}

/// Records window `w` made as `flavor`, and writes its handle to `out`.
fn put_win(lib: &mut Lib, w: usize, out: *mut c_int) -> Result<(), MpiError> {
    let h = handles::handle(WIN, w)?;
    // A new window in a reused slot starts with the default handler.
    lib.win_errhandlers.remove(&w);
    let win = lib.mpi.win(w)?;
    let (_, size, unit) = win.local();
    let attrs = Box::new(WinAttrs {
        size: size as isize,
        unit: unit as c_int,
        flavor: match win.flavor() {
            Flavor::Create => MPI_WIN_FLAVOR_CREATE,
            Flavor::Allocate => MPI_WIN_FLAVOR_ALLOCATE,
        },
        model: MPI_WIN_UNIFIED,
    });
    lib.win_attrs.insert(w, attrs);
    // SAFETY: MPI's contract: `out` is writable.
    unsafe { out.write(h) };
    Ok(())
}

/// `mpi.h`'s enums (its header declares them as enums, not macros).
const MPI_WIN_FLAVOR_CREATE: c_int = 1;
const MPI_WIN_FLAVOR_ALLOCATE: c_int = 2;
const MPI_WIN_UNIFIED: c_int = 2;

fn unit_of(unit: c_int) -> Result<u64, MpiError> {
    u64::try_from(unit)
        .ok()
        .filter(|&u| u > 0)
        .ok_or_else(|| MpiError::new(Class::Disp, format!("displacement unit {unit}")))
}

fn win_create(
    name: &str,
    base: *mut c_void,
    size: i64,
    unit: c_int,
    comm: c_int,
    win: *mut c_int,
) -> c_int {
    call(name, comm, |lib, _| {
        let (size, unit, c) = (
            count(size, "size")?,
            unit_of(unit)?,
            handles::comm_id(comm)?,
        );
        // SAFETY: MPI's contract: the window's memory stays until MPI_Win_free, and the
        // application accesses it as MPI's rules say.
        let w = unsafe { lib.mpi.win_create(base.cast(), size, unit, c)? };
        put_win(lib, w, win)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_create(
    base: *mut c_void,
    size: isize,
    unit: c_int,
    _info: c_int,
    comm: c_int,
    win: *mut c_int,
) -> c_int {
    win_create("MPI_Win_create", base, size as i64, unit, comm, win)
}

#[no_mangle]
pub extern "C" fn MPI_Win_create_c(
    base: *mut c_void,
    size: isize,
    unit: isize,
    _info: c_int,
    comm: c_int,
    win: *mut c_int,
) -> c_int {
    let unit = c_int::try_from(unit).unwrap_or(-1);
    win_create("MPI_Win_create_c", base, size as i64, unit, comm, win)
}

fn win_allocate(
    name: &str,
    size: i64,
    unit: c_int,
    comm: c_int,
    base: *mut c_void,
    win: *mut c_int,
) -> c_int {
    call(name, comm, |lib, _| {
        let (size, unit, c) = (
            count(size, "size")?,
            unit_of(unit)?,
            handles::comm_id(comm)?,
        );
        let (w, p) = lib.mpi.win_allocate(size, unit, c)?;
        // SAFETY: MPI's contract: `base` points at a writable pointer.
        unsafe { base.cast::<*mut c_void>().write(p.cast()) };
        put_win(lib, w, win)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_allocate(
    size: isize,
    unit: c_int,
    _info: c_int,
    comm: c_int,
    base: *mut c_void,
    win: *mut c_int,
) -> c_int {
    win_allocate("MPI_Win_allocate", size as i64, unit, comm, base, win)
}

#[no_mangle]
pub extern "C" fn MPI_Win_allocate_c(
    size: isize,
    unit: isize,
    _info: c_int,
    comm: c_int,
    base: *mut c_void,
    win: *mut c_int,
) -> c_int {
    let unit = c_int::try_from(unit).unwrap_or(-1);
    win_allocate("MPI_Win_allocate_c", size as i64, unit, comm, base, win)
}

/// Runs a call on window handle `win`: its errors go to the window's handler.
fn on_win(
    name: &str,
    win: c_int,
    f: impl FnOnce(&mut Lib, usize, &crate::types::Types) -> Result<(), MpiError>,
) -> c_int {
    call_on(name, On::Win(win), |lib, types| f(lib, win_id(win)?, types))
}

#[no_mangle]
pub extern "C" fn MPI_Win_free(win: *mut c_int) -> c_int {
    // SAFETY: MPI's contract: `win` points at a window handle, writable.
    let h = unsafe { win.read() };
    on_win("MPI_Win_free", h, |lib, w, _| {
        let freed = lib.mpi.win_free(w);
        if lib.mpi.win(w).is_err() {
            // Gone (a failed flush is reported, the window freed all the same): its
            // handle's attributes and handler go with it.
            lib.win_attrs.remove(&w);
            lib.win_errhandlers.remove(&w);
            // SAFETY: as above.
            unsafe { win.write(MPI_WIN_NULL) };
        }
        freed
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_fence(_assert: c_int, win: c_int) -> c_int {
    on_win("MPI_Win_fence", win, |lib, w, _| lib.mpi.win_fence(w))
}

#[no_mangle]
pub extern "C" fn MPI_Win_lock(kind: c_int, rank: c_int, assert: c_int, win: c_int) -> c_int {
    on_win("MPI_Win_lock", win, |lib, w, _| {
        let kind = match kind {
            MPI_LOCK_SHARED => LockType::Shared,
            MPI_LOCK_EXCLUSIVE => LockType::Exclusive,
            k => return Err(MpiError::new(Class::Arg, format!("lock type {k}"))),
        };
        match rank_of(rank)? {
            Some(r) => lib.mpi.win_lock(w, kind, r, assert & MPI_MODE_NOCHECK != 0),
            None => lib.mpi.win(w).map(drop),
        }
    })
}

/// A synchronization call's target rank; `None` for `MPI_PROC_NULL` (the call does
/// nothing, as MPICH's).
fn rank_of(rank: c_int) -> Result<Option<u32>, MpiError> {
    Ok(match dest(rank)? {
        Peer::Rank(r) => Some(r),
        _ => None,
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_unlock(rank: c_int, win: c_int) -> c_int {
    on_win("MPI_Win_unlock", win, |lib, w, _| match rank_of(rank)? {
        Some(r) => lib.mpi.win_unlock(w, r),
        None => lib.mpi.win(w).map(drop),
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_lock_all(assert: c_int, win: c_int) -> c_int {
    on_win("MPI_Win_lock_all", win, |lib, w, _| {
        lib.mpi.win_lock_all(w, assert & MPI_MODE_NOCHECK != 0)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_unlock_all(win: c_int) -> c_int {
    on_win("MPI_Win_unlock_all", win, |lib, w, _| {
        lib.mpi.win_unlock_all(w)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_flush(rank: c_int, win: c_int) -> c_int {
    on_win("MPI_Win_flush", win, |lib, w, _| match rank_of(rank)? {
        Some(r) => lib.mpi.win_flush(w, r),
        None => lib.mpi.win(w).map(drop),
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_flush_all(win: c_int) -> c_int {
    on_win("MPI_Win_flush_all", win, |lib, w, _| {
        lib.mpi.win_flush_all(w)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_flush_local(rank: c_int, win: c_int) -> c_int {
    on_win("MPI_Win_flush_local", win, |lib, w, _| {
        rank_of(rank)?;
        lib.mpi.win_flush_local(w)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_flush_local_all(win: c_int) -> c_int {
    on_win("MPI_Win_flush_local_all", win, |lib, w, _| {
        lib.mpi.win_flush_local(w)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_sync(win: c_int) -> c_int {
    on_win("MPI_Win_sync", win, |lib, w, _| {
        lib.mpi.win(w)?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Ok(())
    })
}

/// A one-sided call's origin: `count` elements of datatype handle `dt`.
fn origin(types: &crate::types::Types, n: i64, dt: c_int) -> Result<(usize, &Layout), MpiError> {
    let l = types.get(dt)?;
    l.check_committed()?;
    Ok((count(n, "count")?, l))
}

/// `MPI_Put` and (`get`) `MPI_Get`, with their `_c` twins.
fn put_get(
    name: &str,
    get: bool,
    (obuf, on, ot): (*mut c_void, i64, c_int),
    rank: c_int,
    disp: isize,
    (tn, tt): (i64, c_int),
    win: c_int,
) -> c_int {
    on_win(name, win, |lib, w, types| {
        let (on, ol) = origin(types, on, ot)?;
        let (tn, tl) = origin(types, tn, tt)?;
        let (to, disp) = (dest(rank)?, disp as i64);
        // SAFETY: MPI's contract: `on` elements of `ot` at `obuf`, readable for a put,
        // writable for a get.
        unsafe {
            if get {
                lib.mpi.get(w, obuf.cast(), on, ol, to, disp, tn, tl)
            } else {
                lib.mpi.put(w, obuf.cast(), on, ol, to, disp, tn, tl)
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Put(
    obuf: *const c_void,
    on: c_int,
    ot: c_int,
    rank: c_int,
    disp: isize,
    tn: c_int,
    tt: c_int,
    win: c_int,
) -> c_int {
    put_get(
        "MPI_Put",
        false,
        (obuf.cast_mut(), on.into(), ot),
        rank,
        disp,
        (tn.into(), tt),
        win,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Put_c(
    obuf: *const c_void,
    on: i64,
    ot: c_int,
    rank: c_int,
    disp: isize,
    tn: i64,
    tt: c_int,
    win: c_int,
) -> c_int {
    let o = (obuf.cast_mut(), on, ot);
    put_get("MPI_Put_c", false, o, rank, disp, (tn, tt), win)
}

#[no_mangle]
pub extern "C" fn MPI_Get(
    obuf: *mut c_void,
    on: c_int,
    ot: c_int,
    rank: c_int,
    disp: isize,
    tn: c_int,
    tt: c_int,
    win: c_int,
) -> c_int {
    put_get(
        "MPI_Get",
        true,
        (obuf, on.into(), ot),
        rank,
        disp,
        (tn.into(), tt),
        win,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Get_c(
    obuf: *mut c_void,
    on: i64,
    ot: c_int,
    rank: c_int,
    disp: isize,
    tn: i64,
    tt: c_int,
    win: c_int,
) -> c_int {
    put_get("MPI_Get_c", true, (obuf, on, ot), rank, disp, (tn, tt), win)
}

/// The builtin operation of handle `op` (one-sided accumulates take MPI's only).
fn rma_op(lib: &Lib, op: c_int) -> Result<Op, MpiError> {
    let o = crate::coll::op(lib, op)?;
    match o {
        Op::Builtin(_) => Ok(o),
        Op::User { .. } => Err(MpiError::new(
            Class::Op,
            "one-sided accumulates take MPI's predefined operations only",
        )),
    }
}

/// The accumulates: the origin (none for `MPI_Fetch_and_op`'s and `MPI_NO_OP`'s
/// absent data), the result buffer for the fetching ones.
#[allow(clippy::too_many_arguments)]
fn accumulate(
    name: &str,
    (obuf, on, ot): (*const c_void, i64, c_int),
    result: Option<(*mut c_void, i64, c_int)>,
    rank: c_int,
    disp: isize,
    (tn, tt): (i64, c_int),
    op: c_int,
    win: c_int,
) -> c_int {
    on_win(name, win, |lib, w, types| {
        let o = rma_op(lib, op)?;
        let (tn, tl) = origin(types, tn, tt)?;
        let no_op = matches!(o, Op::Builtin(quiver_mpi::op::Builtin::NoOp));
        let data = if no_op {
            std::borrow::Cow::Borrowed(&[][..])
        } else {
            let (on, ol) = origin(types, on, ot)?;
            // SAFETY: MPI's contract: `on` elements of `ot` readable at `obuf`, unchanged
            // during the call.
            unsafe { quiver_mpi::rma::packed(obuf.cast(), on, ol)? }
        };
        let result = match result {
            Some((rbuf, rn, rt)) => {
                let (rn, rl) = origin(types, rn, rt)?;
                Some((rbuf.cast::<u8>(), rn, rl))
            }
            None => None,
        };
        // SAFETY: MPI's contract: the result's elements writable.
        unsafe {
            lib.mpi
                .accumulate(w, &data, result, dest(rank)?, disp as i64, tn, tl, &o)
        }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Accumulate(
    obuf: *const c_void,
    on: c_int,
    ot: c_int,
    rank: c_int,
    disp: isize,
    tn: c_int,
    tt: c_int,
    op: c_int,
    win: c_int,
) -> c_int {
    let o = (obuf, on.into(), ot);
    accumulate(
        "MPI_Accumulate",
        o,
        None,
        rank,
        disp,
        (tn.into(), tt),
        op,
        win,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Accumulate_c(
    obuf: *const c_void,
    on: i64,
    ot: c_int,
    rank: c_int,
    disp: isize,
    tn: i64,
    tt: c_int,
    op: c_int,
    win: c_int,
) -> c_int {
    accumulate(
        "MPI_Accumulate_c",
        (obuf, on, ot),
        None,
        rank,
        disp,
        (tn, tt),
        op,
        win,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Get_accumulate(
    obuf: *const c_void,
    on: c_int,
    ot: c_int,
    rbuf: *mut c_void,
    rn: c_int,
    rt: c_int,
    rank: c_int,
    disp: isize,
    tn: c_int,
    tt: c_int,
    op: c_int,
    win: c_int,
) -> c_int {
    let (o, r) = ((obuf, on.into(), ot), Some((rbuf, rn.into(), rt)));
    accumulate(
        "MPI_Get_accumulate",
        o,
        r,
        rank,
        disp,
        (tn.into(), tt),
        op,
        win,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Get_accumulate_c(
    obuf: *const c_void,
    on: i64,
    ot: c_int,
    rbuf: *mut c_void,
    rn: i64,
    rt: c_int,
    rank: c_int,
    disp: isize,
    tn: i64,
    tt: c_int,
    op: c_int,
    win: c_int,
) -> c_int {
    let (o, r) = ((obuf, on, ot), Some((rbuf, rn, rt)));
    accumulate("MPI_Get_accumulate_c", o, r, rank, disp, (tn, tt), op, win)
}

#[no_mangle]
pub extern "C" fn MPI_Fetch_and_op(
    obuf: *const c_void,
    rbuf: *mut c_void,
    dt: c_int,
    rank: c_int,
    disp: isize,
    op: c_int,
    win: c_int,
) -> c_int {
    let (o, r) = ((obuf, 1, dt), Some((rbuf, 1, dt)));
    accumulate("MPI_Fetch_and_op", o, r, rank, disp, (1, dt), op, win)
}

#[no_mangle]
pub extern "C" fn MPI_Compare_and_swap(
    obuf: *const c_void,
    cbuf: *const c_void,
    rbuf: *mut c_void,
    dt: c_int,
    rank: c_int,
    disp: isize,
    win: c_int,
) -> c_int {
    on_win("MPI_Compare_and_swap", win, |lib, w, types| {
        let l = types.get(dt)?;
        // SAFETY: MPI's contract: one element of `dt` at each, the result writable.
        unsafe {
            lib.mpi.compare_and_swap(
                w,
                obuf.cast(),
                cbuf.cast(),
                rbuf.cast(),
                l,
                dest(rank)?,
                disp as i64,
            )
        }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_get_group(win: c_int, group: *mut c_int) -> c_int {
    on_win("MPI_Win_get_group", win, |lib, w, _| {
        let c = lib.mpi.win(w)?.comm();
        let ranks = lib.mpi.comm(c)?.group().to_vec();
        put_group(lib, ranks, group)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_get_attr(
    win: c_int,
    key: c_int,
    value: *mut c_void,
    flag: *mut c_int,
) -> c_int {
    on_win("MPI_Win_get_attr", win, |lib, w, _| {
        let base = lib.mpi.win(w)?.local().0;
        let a = lib
            .win_attrs
            .get(&w)
            .ok_or_else(|| MpiError::new(Class::Intern, "a window without attributes"))?;
        let v: *mut c_void = match key {
            MPI_WIN_BASE => base.cast(),
            MPI_WIN_SIZE => (&a.size as *const isize).cast_mut().cast(),
            MPI_WIN_DISP_UNIT => (&a.unit as *const c_int).cast_mut().cast(),
            MPI_WIN_CREATE_FLAVOR => (&a.flavor as *const c_int).cast_mut().cast(),
            MPI_WIN_MODEL => (&a.model as *const c_int).cast_mut().cast(),
            _ => {
                // SAFETY: MPI's contract: `flag` is writable.
                unsafe { flag.write(0) };
                return Ok(());
            }
        };
        // SAFETY: MPI's contract: `value` points at a writable pointer, `flag` is
        // writable. The values live as long as the window (boxed in the library).
        unsafe {
            value.cast::<*mut c_void>().write(v);
            flag.write(1);
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_set_name(win: c_int, name: *const c_char) -> c_int {
    on_win("MPI_Win_set_name", win, |lib, w, _| {
        // SAFETY: MPI's contract: a NUL-terminated string.
        let s = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        lib.mpi.win_mut(w)?.name = s;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_get_name(win: c_int, name: *mut c_char, len: *mut c_int) -> c_int {
    on_win("MPI_Win_get_name", win, |lib, w, _| {
        // SAFETY: MPI's contract: MPI_MAX_OBJECT_NAME bytes at `name`, `len` writable.
        unsafe { crate::comm::write_name(&lib.mpi.win(w)?.name, name, len) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_set_errhandler(win: c_int, handler: c_int) -> c_int {
    on_win("MPI_Win_set_errhandler", win, |lib, w, _| {
        lib.mpi.win(w)?;
        lib.win_errhandlers
            .insert(w, crate::init::errhandler(handler)?);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Win_get_errhandler(win: c_int, handler: *mut c_int) -> c_int {
    on_win("MPI_Win_get_errhandler", win, |lib, w, _| {
        lib.mpi.win(w)?;
        let h = lib
            .win_errhandlers
            .get(&w)
            .copied()
            .unwrap_or(MPI_ERRORS_ARE_FATAL);
        // SAFETY: MPI's contract: `handler` is writable.
        unsafe { handler.write(h) };
        Ok(())
    })
}
