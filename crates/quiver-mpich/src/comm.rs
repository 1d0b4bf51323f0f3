//! Communicators, groups and their attributes.

use crate::abi::*;
use crate::handles::{self, comm_handle, comm_id, GROUP};
use crate::types::slice;
use crate::{call, count, Lib};
use quiver_mpi::{Class, MpiError};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::AtomicI32;

#[no_mangle]
pub extern "C" fn MPI_Comm_size(comm: c_int, size: *mut c_int) -> c_int {
    call("MPI_Comm_size", comm, |lib, _| {
        let n = lib.mpi.comm(comm_id(comm)?)?.size();
        // SAFETY: MPI's contract: `size` is writable.
        unsafe { size.write(n as c_int) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_rank(comm: c_int, rank: *mut c_int) -> c_int {
    call("MPI_Comm_rank", comm, |lib, _| {
        let r = lib.mpi.comm(comm_id(comm)?)?.rank();
        // SAFETY: MPI's contract: `rank` is writable.
        unsafe { rank.write(r as c_int) };
        Ok(())
    })
}

/// Writes a new communicator's handle (`MPI_COMM_NULL` for none), with its parent's
/// error handler.
fn put_comm(
    lib: &mut Lib,
    parent: usize,
    id: Option<usize>,
    out: *mut c_int,
) -> Result<(), MpiError> {
    let h = match id {
        Some(c) => {
            if let Some(&eh) = lib.errhandlers.get(&parent) {
                lib.errhandlers.insert(c, eh);
            }
            comm_handle(c)?
        }
        None => MPI_COMM_NULL,
    };
    // SAFETY: MPI's contract: `out` is writable.
    unsafe { out.write(h) };
    Ok(())
}

#[no_mangle]
pub extern "C" fn MPI_Comm_dup(comm: c_int, new: *mut c_int) -> c_int {
    call("MPI_Comm_dup", comm, |lib, _| {
        let p = comm_id(comm)?;
        let c = lib.mpi.comm_dup(p)?;
        put_comm(lib, p, Some(c), new)?;
        copy_attrs(lib, p, c)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_split(comm: c_int, color: c_int, key: c_int, new: *mut c_int) -> c_int {
    call("MPI_Comm_split", comm, |lib, _| {
        let p = comm_id(comm)?;
        let color = match color {
            MPI_UNDEFINED => None,
            c if c >= 0 => Some(c as u32),
            c => return Err(MpiError::new(Class::Arg, format!("color {c} is negative"))),
        };
        let c = lib.mpi.comm_split(p, color, key)?;
        put_comm(lib, p, c, new)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_create(comm: c_int, group: c_int, new: *mut c_int) -> c_int {
    call("MPI_Comm_create", comm, |lib, _| {
        let p = comm_id(comm)?;
        let ranks = group_ranks(lib, group)?.to_vec();
        let c = lib.mpi.comm_create(p, ranks)?;
        put_comm(lib, p, c, new)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_free(comm: *mut c_int) -> c_int {
    call("MPI_Comm_free", MPI_COMM_WORLD, |lib, _| {
        // SAFETY: MPI's contract: `comm` points at a handle.
        let h = unsafe { comm.read() };
        let c = comm_id(h)?;
        if c <= quiver_mpi::SELF {
            return Err(MpiError::new(
                Class::Comm,
                "MPI_COMM_WORLD and MPI_COMM_SELF cannot be freed",
            ));
        }
        lib.mpi.comm(c)?;
        // The attributes' delete functions run first, with the communicator still
        // valid (they may use it); then it is freed.
        delete_attrs(lib, c, false);
        crate::defer(move || {
            let _ = call("MPI_Comm_free", MPI_COMM_WORLD, |lib, _| {
                lib.mpi.comm_free(c)?;
                lib.errhandlers.remove(&c);
                Ok(())
            });
        });
        // SAFETY: as above, writable.
        unsafe { comm.write(MPI_COMM_NULL) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_compare(a: c_int, b: c_int, result: *mut c_int) -> c_int {
    call("MPI_Comm_compare", a, |lib, _| {
        let (ga, gb) = (
            lib.mpi.comm(comm_id(a)?)?.group(),
            lib.mpi.comm(comm_id(b)?)?.group(),
        );
        let r = if a == b {
            MPI_IDENT
        } else {
            compare(ga, gb, MPI_CONGRUENT)
        };
        // SAFETY: MPI's contract: `result` is writable.
        unsafe { result.write(r) };
        Ok(())
    })
}

/// How two groups compare: `same` (MPI_IDENT for groups, MPI_CONGRUENT for
/// communicators) when equal in order, MPI_SIMILAR with the same members, else
/// MPI_UNEQUAL.
fn compare(a: &[u32], b: &[u32], same: c_int) -> c_int {
    if a == b {
        return same;
    }
    let (mut x, mut y) = (a.to_vec(), b.to_vec());
    x.sort_unstable();
    y.sort_unstable();
    if x == y {
        MPI_SIMILAR
    } else {
        MPI_UNEQUAL
    }
}

#[no_mangle]
pub extern "C" fn MPI_Comm_test_inter(comm: c_int, flag: *mut c_int) -> c_int {
    call("MPI_Comm_test_inter", comm, |lib, _| {
        lib.mpi.comm(comm_id(comm)?)?;
        // SAFETY: MPI's contract: `flag` is writable.
        unsafe { flag.write(0) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_set_name(comm: c_int, name: *const c_char) -> c_int {
    call("MPI_Comm_set_name", comm, |lib, _| {
        // SAFETY: MPI's contract: a NUL-terminated string.
        let s = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        lib.mpi.comm_mut(comm_id(comm)?)?.name = s;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_get_name(comm: c_int, name: *mut c_char, len: *mut c_int) -> c_int {
    call("MPI_Comm_get_name", comm, |lib, _| {
        let c = lib.mpi.comm(comm_id(comm)?)?;
        let s = match (comm, c.name.as_str()) {
            (MPI_COMM_WORLD, "") => "MPI_COMM_WORLD",
            (MPI_COMM_SELF, "") => "MPI_COMM_SELF",
            (_, s) => s,
        };
        // SAFETY: MPI's contract.
        unsafe { write_name(s, name, len) };
        Ok(())
    })
}

/// Writes object name `s` (cut to `MPI_MAX_OBJECT_NAME - 1` bytes) and its length: what
/// `MPI_Comm_get_name` and `MPI_Win_get_name` answer.
///
/// # Safety
///
/// `MPI_MAX_OBJECT_NAME` bytes writable at `name`, `len` writable.
pub(crate) unsafe fn write_name(s: &str, name: *mut c_char, len: *mut c_int) {
    let n = s.len().min(MPI_MAX_OBJECT_NAME as usize - 1);
    // SAFETY: the caller's promise; `n` < MPI_MAX_OBJECT_NAME.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast(), name, n);
        name.add(n).write(0);
        len.write(n as c_int);
    }
}

/// The values of the predefined attributes (MPI hands out pointers to them).
static TAG_UB: AtomicI32 = AtomicI32::new(handles::TAG_UB);
static HOST: AtomicI32 = AtomicI32::new(MPI_PROC_NULL);
static IO: AtomicI32 = AtomicI32::new(MPI_ANY_SOURCE);
static WTIME_IS_GLOBAL: AtomicI32 = AtomicI32::new(0);
static UNIVERSE_SIZE: AtomicI32 = AtomicI32::new(0);
static APPNUM: AtomicI32 = AtomicI32::new(0);

#[no_mangle]
pub extern "C" fn MPI_Comm_get_attr(
    comm: c_int,
    key: c_int,
    value: *mut c_void,
    flag: *mut c_int,
) -> c_int {
    call("MPI_Comm_get_attr", comm, |lib, _| {
        lib.mpi.comm(comm_id(comm)?)?;
        let at = match key {
            MPI_TAG_UB => Some(&TAG_UB),
            MPI_HOST => Some(&HOST),
            MPI_IO => Some(&IO),
            MPI_WTIME_IS_GLOBAL => Some(&WTIME_IS_GLOBAL),
            MPI_UNIVERSE_SIZE => {
                UNIVERSE_SIZE.store(
                    lib.mpi.job().size() as c_int,
                    std::sync::atomic::Ordering::Relaxed,
                );
                Some(&UNIVERSE_SIZE)
            }
            MPI_APPNUM => Some(&APPNUM),
            _ => None,
        };
        if let Some(a) = at {
            // SAFETY: MPI's contract: `value` points at a pointer, `flag` is writable.
            // An AtomicI32 has the layout of an int.
            unsafe {
                flag.write(1);
                value.cast::<*const AtomicI32>().write(a);
            }
            return Ok(());
        }
        let k = keyval_index(lib, key)?;
        let c = comm_id(comm)?;
        let got = lib
            .attrs
            .iter()
            .find(|(ac, ak, _)| (*ac, *ak) == (c, k))
            .map(|a| a.2);
        // SAFETY: as above.
        unsafe {
            flag.write(c_int::from(got.is_some()));
            if let Some(v) = got {
                value.cast::<*mut c_void>().write(v);
            }
        }
        Ok(())
    })
}

/// The job ranks of group handle `g`.
fn group_ranks(lib: &Lib, g: c_int) -> Result<&[u32], MpiError> {
    if g == MPI_GROUP_EMPTY {
        return Ok(&[]);
    }
    handles::index_of(g, GROUP)
        .and_then(|i| lib.groups.get(i))
        .and_then(Option::as_deref)
        .ok_or_else(|| MpiError::new(Class::Group, format!("{g:#x} is not a group")))
}

pub(crate) fn put_group(lib: &mut Lib, ranks: Vec<u32>, out: *mut c_int) -> Result<(), MpiError> {
    let i = quiver_mpi::store(&mut lib.groups, ranks);
    let h = handles::handle(GROUP, i)?;
    // SAFETY: MPI's contract: `out` is writable.
    unsafe { out.write(h) };
    Ok(())
}

#[no_mangle]
pub extern "C" fn MPI_Comm_group(comm: c_int, group: *mut c_int) -> c_int {
    call("MPI_Comm_group", comm, |lib, _| {
        let ranks = lib.mpi.comm(comm_id(comm)?)?.group().to_vec();
        put_group(lib, ranks, group)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Group_size(g: c_int, size: *mut c_int) -> c_int {
    call("MPI_Group_size", MPI_COMM_WORLD, |lib, _| {
        let n = group_ranks(lib, g)?.len();
        // SAFETY: MPI's contract: `size` is writable.
        unsafe { size.write(n as c_int) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Group_rank(g: c_int, rank: *mut c_int) -> c_int {
    call("MPI_Group_rank", MPI_COMM_WORLD, |lib, _| {
        let me = lib.mpi.job().rank();
        let r = group_ranks(lib, g)?
            .iter()
            .position(|&j| j == me)
            .map_or(MPI_UNDEFINED, |r| r as c_int);
        // SAFETY: MPI's contract: `rank` is writable.
        unsafe { rank.write(r) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Group_translate_ranks(
    a: c_int,
    n: c_int,
    ranks: *const c_int,
    b: c_int,
    out: *mut c_int,
) -> c_int {
    call("MPI_Group_translate_ranks", MPI_COMM_WORLD, |lib, _| {
        let n = count(n, "count")?;
        let (ga, gb) = (group_ranks(lib, a)?, group_ranks(lib, b)?);
        // SAFETY: MPI's contract: `n` ranks in, room for `n` out.
        let rs = unsafe { slice(ranks, n) };
        for (i, &r) in rs.iter().enumerate() {
            let t = if r == MPI_PROC_NULL {
                MPI_PROC_NULL
            } else {
                let j = usize::try_from(r)
                    .ok()
                    .and_then(|r| ga.get(r))
                    .ok_or_else(|| {
                        MpiError::new(Class::Rank, format!("rank {r} is not in the group"))
                    })?;
                gb.iter()
                    .position(|x| x == j)
                    .map_or(MPI_UNDEFINED, |p| p as c_int)
            };
            // SAFETY: as above.
            unsafe { out.add(i).write(t) };
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Group_incl(
    g: c_int,
    n: c_int,
    ranks: *const c_int,
    new: *mut c_int,
) -> c_int {
    call("MPI_Group_incl", MPI_COMM_WORLD, |lib, _| {
        let n = count(n, "count")?;
        let members = group_ranks(lib, g)?;
        // SAFETY: MPI's contract: `n` ranks.
        let rs = unsafe { slice(ranks, n) };
        let picked = rs
            .iter()
            .map(|&r| {
                usize::try_from(r)
                    .ok()
                    .and_then(|r| members.get(r).copied())
                    .ok_or_else(|| {
                        MpiError::new(Class::Rank, format!("rank {r} is not in the group"))
                    })
            })
            .collect::<Result<Vec<u32>, MpiError>>()?;
        put_group(lib, picked, new)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Group_excl(
    g: c_int,
    n: c_int,
    ranks: *const c_int,
    new: *mut c_int,
) -> c_int {
    call("MPI_Group_excl", MPI_COMM_WORLD, |lib, _| {
        let n = count(n, "count")?;
        let members = group_ranks(lib, g)?;
        // SAFETY: MPI's contract: `n` ranks.
        let rs = unsafe { slice(ranks, n) };
        let kept = members
            .iter()
            .enumerate()
            .filter(|(i, _)| !rs.contains(&(*i as c_int)))
            .map(|(_, &j)| j)
            .collect();
        put_group(lib, kept, new)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Group_compare(a: c_int, b: c_int, result: *mut c_int) -> c_int {
    call("MPI_Group_compare", MPI_COMM_WORLD, |lib, _| {
        let r = compare(group_ranks(lib, a)?, group_ranks(lib, b)?, MPI_IDENT);
        // SAFETY: MPI's contract: `result` is writable.
        unsafe { result.write(r) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Group_free(g: *mut c_int) -> c_int {
    call("MPI_Group_free", MPI_COMM_WORLD, |lib, _| {
        // SAFETY: MPI's contract: `g` points at a handle.
        let h = unsafe { g.read() };
        if h != MPI_GROUP_EMPTY {
            let i = handles::index_of(h, GROUP)
                .filter(|&i| lib.groups.get(i).is_some_and(Option::is_some));
            let i =
                i.ok_or_else(|| MpiError::new(Class::Group, format!("{h:#x} is not a group")))?;
            lib.groups[i] = None;
        }
        // SAFETY: as above, writable.
        unsafe { g.write(MPI_GROUP_NULL) };
        Ok(())
    })
}

/// An attribute key's copy function (`MPI_Comm_copy_attr_function`).
type CopyFn =
    unsafe extern "C" fn(c_int, c_int, *mut c_void, *mut c_void, *mut c_void, *mut c_int) -> c_int;
/// An attribute key's delete function (`MPI_Comm_delete_attr_function`).
type DeleteFn = unsafe extern "C" fn(c_int, c_int, *mut c_void, *mut c_void) -> c_int;

/// The high bits of attribute key handles (MPICH's "indirect" kind and keyval type bits).
const KEYVAL: c_int = 0xa400_0000_u32 as c_int;

/// An attribute key of the application's.
pub(crate) struct Keyval {
    copy: Option<CopyFn>,
    delete: Option<DeleteFn>,
    extra: *mut c_void,
    /// Freed by `MPI_Comm_free_keyval` (its attributes still use it).
    freed: bool,
}

/// The index of attribute key handle `h`.
fn keyval_index(lib: &Lib, h: c_int) -> Result<usize, MpiError> {
    handles::index_of(h, KEYVAL)
        .filter(|&i| lib.keyvals.get(i).is_some_and(Option::is_some))
        .ok_or_else(|| MpiError::new(Class::Arg, format!("{h:#x} is not an attribute key")))
}

/// Calls an attribute's delete function, once the call has let go of the state.
fn defer_delete(lib: &Lib, c: usize, k: usize, value: *mut c_void) {
    let Some(kv) = lib.keyvals.get(k).and_then(Option::as_ref) else {
        return;
    };
    if let (Some(f), Ok(comm), Ok(key)) = (kv.delete, comm_handle(c), handles::handle(KEYVAL, k)) {
        let extra = kv.extra as usize;
        let value = value as usize;
        crate::defer(move || {
            // SAFETY: MPI's contract for delete functions: called with the
            // communicator, the key, the value and the key's extra state.
            unsafe { f(comm, key, value as *mut c_void, extra as *mut c_void) };
        });
    }
}

/// Deletes every attribute of communicator `c` (`reverse`: the newest first).
pub(crate) fn delete_attrs(lib: &mut Lib, c: usize, reverse: bool) {
    let mut gone: Vec<(usize, usize, *mut c_void)> = Vec::new();
    lib.attrs.retain(|a| {
        if a.0 == c {
            gone.push(*a);
        }
        a.0 != c
    });
    if reverse {
        gone.reverse();
    }
    for &(c, k, v) in &gone {
        defer_delete(lib, c, k, v);
    }
    // Keys freed while these attributes used them go with the last of them.
    for (_, k, _) in gone {
        if lib.keyvals[k].as_ref().is_some_and(|kv| kv.freed) && !lib.attrs.iter().any(|a| a.1 == k)
        {
            lib.keyvals[k] = None;
        }
    }
}

/// Copies `parent`'s attributes to its duplicate `child` with their keys' copy
/// functions (run once the call has let go of the state; a copy that says so is set
/// on the child).
fn copy_attrs(lib: &Lib, parent: usize, child: usize) -> Result<(), MpiError> {
    for &(c, k, value) in &lib.attrs {
        let Some(kv) = lib.keyvals.get(k).and_then(Option::as_ref) else {
            continue;
        };
        if c != parent {
            continue;
        }
        let Some(f) = kv.copy else { continue };
        let (old, new, key) = (
            comm_handle(parent)?,
            comm_handle(child)?,
            handles::handle(KEYVAL, k)?,
        );
        let (extra, value) = (kv.extra as usize, value as usize);
        crate::defer(move || {
            let mut out: *mut c_void = std::ptr::null_mut();
            let mut flag: c_int = 0;
            // SAFETY: MPI's contract for copy functions: the old communicator, the key,
            // its extra state, the value, and where to put the copy and its flag.
            let rc = unsafe {
                f(
                    old,
                    key,
                    extra as *mut c_void,
                    value as *mut c_void,
                    (&mut out as *mut *mut c_void).cast(),
                    &mut flag,
                )
            };
            if rc == MPI_SUCCESS && flag != 0 {
                MPI_Comm_set_attr(new, key, out);
            }
        });
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn MPI_Comm_create_keyval(
    copy: Option<CopyFn>,
    delete: Option<DeleteFn>,
    keyval: *mut c_int,
    extra: *mut c_void,
) -> c_int {
    call("MPI_Comm_create_keyval", MPI_COMM_WORLD, |lib, _| {
        let i = quiver_mpi::store(
            &mut lib.keyvals,
            Keyval {
                copy,
                delete,
                extra,
                freed: false,
            },
        );
        let h = handles::handle(KEYVAL, i)?;
        // SAFETY: MPI's contract: `keyval` is writable.
        unsafe { keyval.write(h) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_free_keyval(keyval: *mut c_int) -> c_int {
    call("MPI_Comm_free_keyval", MPI_COMM_WORLD, |lib, _| {
        // SAFETY: MPI's contract: `keyval` points at a key handle.
        let k = keyval_index(lib, unsafe { keyval.read() })?;
        if lib.attrs.iter().any(|a| a.1 == k) {
            // Its attributes keep it until they are deleted.
            if let Some(kv) = lib.keyvals[k].as_mut() {
                kv.freed = true;
            }
        } else {
            lib.keyvals[k] = None;
        }
        // SAFETY: as above, writable.
        unsafe { keyval.write(MPI_KEYVAL_INVALID) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_set_attr(comm: c_int, key: c_int, value: *mut c_void) -> c_int {
    call("MPI_Comm_set_attr", comm, |lib, _| {
        let c = comm_id(comm)?;
        lib.mpi.comm(c)?;
        let k = keyval_index(lib, key)?;
        if let Some(at) = lib.attrs.iter().position(|a| (a.0, a.1) == (c, k)) {
            let (_, _, old) = lib.attrs.remove(at);
            defer_delete(lib, c, k, old);
        }
        lib.attrs.push((c, k, value));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Comm_delete_attr(comm: c_int, key: c_int) -> c_int {
    call("MPI_Comm_delete_attr", comm, |lib, _| {
        let c = comm_id(comm)?;
        let k = keyval_index(lib, key)?;
        // An attribute never set: nothing to delete (as MPICH).
        let Some(at) = lib.attrs.iter().position(|a| (a.0, a.1) == (c, k)) else {
            return Ok(());
        };
        let (_, _, old) = lib.attrs.remove(at);
        defer_delete(lib, c, k, old);
        if lib.keyvals[k].as_ref().is_some_and(|kv| kv.freed) && !lib.attrs.iter().any(|a| a.1 == k)
        {
            lib.keyvals[k] = None;
        }
        Ok(())
    })
}

/// `MPI_COMM_DUP_FN` (MPICH's header names this function): the copy is the value.
#[no_mangle]
pub extern "C" fn MPIR_Dup_fn(
    _comm: c_int,
    _key: c_int,
    _extra: *mut c_void,
    value: *mut c_void,
    out: *mut c_void,
    flag: *mut c_int,
) -> c_int {
    // SAFETY: MPI's contract for copy functions: `out` points at a pointer, `flag` at
    // an int.
    unsafe {
        out.cast::<*mut c_void>().write(value);
        flag.write(1);
    }
    MPI_SUCCESS
}
