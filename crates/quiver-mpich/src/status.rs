//! `MPI_Status`'s accessors (a status is the application's: these touch only it).

use crate::abi::*;
use crate::types::Types;
use crate::{query, MPI_Status};
use quiver_mpi::{Class, MpiError};
use std::ffi::c_int;

/// Runs `f` on the status at `s`, unless it is null.
fn with_status(s: *mut MPI_Status, f: impl FnOnce(&mut MPI_Status)) -> c_int {
    if s.is_null() || crate::handles::ignored(s) {
        return MPI_ERR_ARG;
    }
    // SAFETY: MPI's contract: a status the caller owns.
    f(unsafe { &mut *s });
    MPI_SUCCESS
}

/// Writes `v` to `out` unless it is null.
fn out(out: *mut c_int, v: c_int) -> c_int {
    if out.is_null() {
        return MPI_ERR_ARG;
    }
    // SAFETY: MPI's contract: `out` is writable.
    unsafe { out.write(v) };
    MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Status_set_source(s: *mut MPI_Status, v: c_int) -> c_int {
    with_status(s, |s| s.MPI_SOURCE = v)
}

#[no_mangle]
pub extern "C" fn MPI_Status_set_tag(s: *mut MPI_Status, v: c_int) -> c_int {
    with_status(s, |s| s.MPI_TAG = v)
}

#[no_mangle]
pub extern "C" fn MPI_Status_set_error(s: *mut MPI_Status, v: c_int) -> c_int {
    with_status(s, |s| s.MPI_ERROR = v)
}

#[no_mangle]
pub extern "C" fn MPI_Status_set_cancelled(s: *mut MPI_Status, flag: c_int) -> c_int {
    with_status(s, |s| {
        s.count_hi_and_cancelled = (s.count_hi_and_cancelled & !1) | c_int::from(flag != 0)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Status_get_source(s: *mut MPI_Status, v: *mut c_int) -> c_int {
    let mut got = 0;
    match with_status(s, |s| got = s.MPI_SOURCE) {
        MPI_SUCCESS => out(v, got),
        rc => rc,
    }
}

#[no_mangle]
pub extern "C" fn MPI_Status_get_tag(s: *mut MPI_Status, v: *mut c_int) -> c_int {
    let mut got = 0;
    match with_status(s, |s| got = s.MPI_TAG) {
        MPI_SUCCESS => out(v, got),
        rc => rc,
    }
}

#[no_mangle]
pub extern "C" fn MPI_Status_get_error(s: *mut MPI_Status, v: *mut c_int) -> c_int {
    let mut got = 0;
    match with_status(s, |s| got = s.MPI_ERROR) {
        MPI_SUCCESS => out(v, got),
        rc => rc,
    }
}

/// Sets the byte count of `count` elements of `dt`.
fn set_elements(name: &str, s: *mut MPI_Status, dt: c_int, count: i64) -> c_int {
    query(name, |types: &Types| {
        let size = types.get(dt)?.size as i64;
        let bytes = size
            .checked_mul(count)
            .filter(|b| *b >= 0)
            .ok_or_else(|| MpiError::new(Class::Count, format!("count {count}")))?;
        match with_status(s, |s| {
            s.count_lo = bytes as c_int;
            s.count_hi_and_cancelled =
                (((bytes >> 32) as c_int) << 1) | (s.count_hi_and_cancelled & 1);
        }) {
            MPI_SUCCESS => Ok(()),
            _ => Err(MpiError::new(Class::Arg, "a null status")),
        }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Status_set_elements(s: *mut MPI_Status, dt: c_int, count: c_int) -> c_int {
    set_elements("MPI_Status_set_elements", s, dt, i64::from(count))
}

#[no_mangle]
pub extern "C" fn MPI_Status_set_elements_x(s: *mut MPI_Status, dt: c_int, count: i64) -> c_int {
    set_elements("MPI_Status_set_elements_x", s, dt, count)
}

#[no_mangle]
pub extern "C" fn MPI_Status_set_elements_c(s: *mut MPI_Status, dt: c_int, count: i64) -> c_int {
    set_elements("MPI_Status_set_elements_c", s, dt, count)
}
