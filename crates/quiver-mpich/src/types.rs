//! Datatypes: MPICH's builtin handles (their element kinds by name, their sizes from the
//! handle as MPICH encodes it) and the application's derived ones; the `MPI_Type_*`
//! calls.

use crate::abi::*;
use crate::handles::{self, DATATYPE};
use crate::{call_types, count, query, MPI_Status};
use quiver_mpi::{Class, Elem, Layout, MpiError, Num};
use std::ffi::{c_int, c_void};

/// The datatypes of a process.
pub(crate) struct Types {
    /// Builtins by the low byte of their handle (MPICH's index), with their handle.
    builtin: Vec<Option<(c_int, Layout)>>,
    /// The pair types of `MPI_MAXLOC`, by handle.
    pairs: Vec<(c_int, Layout)>,
    /// Derived types by index (`DATATYPE | index`).
    derived: Vec<Option<Layout>>,
}

/// The element kind of a builtin type, by its name's constant.
fn builtin_elem(h: c_int) -> Option<Elem> {
    let n = |k| Some(Elem::Num(k));
    match h {
        MPI_CHAR | MPI_PACKED | MPI_CHARACTER => Some(Elem::Bytes {
            size: 1,
            bitwise: false,
        }),
        MPI_BYTE => Some(Elem::Bytes {
            size: 1,
            bitwise: true,
        }),
        MPI_SIGNED_CHAR | MPI_INT8_T | MPI_INTEGER1 => n(Num::I8),
        MPI_UNSIGNED_CHAR | MPI_UINT8_T => n(Num::U8),
        MPI_SHORT | MPI_INT16_T | MPI_INTEGER2 => n(Num::I16),
        MPI_UNSIGNED_SHORT | MPI_UINT16_T => n(Num::U16),
        MPI_INT | MPI_INT32_T | MPI_INTEGER | MPI_INTEGER4 | MPI_LOGICAL | MPI_WCHAR => n(Num::I32),
        MPI_UNSIGNED | MPI_UINT32_T => n(Num::U32),
        MPI_LONG | MPI_LONG_LONG_INT | MPI_INT64_T | MPI_INTEGER8 | MPI_AINT | MPI_OFFSET
        | MPI_COUNT => n(Num::I64),
        MPI_UNSIGNED_LONG | MPI_UNSIGNED_LONG_LONG | MPI_UINT64_T => n(Num::U64),
        MPI_FLOAT | MPI_REAL | MPI_REAL4 => n(Num::F32),
        MPI_DOUBLE | MPI_DOUBLE_PRECISION | MPI_REAL8 => n(Num::F64),
        MPI_C_BOOL | MPI_CXX_BOOL => n(Num::Bool),
        MPI_C_FLOAT_COMPLEX | MPI_COMPLEX | MPI_CXX_FLOAT_COMPLEX => n(Num::C32),
        MPI_C_DOUBLE_COMPLEX | MPI_DOUBLE_COMPLEX | MPI_CXX_DOUBLE_COMPLEX => n(Num::C64),
        MPI_2INT => Some(Elem::Pair {
            value: Num::I32,
            index_at: 4,
            size: 8,
        }),
        _ => None,
    }
}

impl Types {
    pub(crate) fn new() -> Types {
        let pair = |value, index_at, size| {
            Layout::builtin(Elem::Pair {
                value,
                index_at,
                size,
            })
        };
        let mut builtin: Vec<Option<(c_int, Layout)>> = vec![None; 256];
        for h in BUILTIN_DATATYPES {
            // MPICH's builtin handles carry their size in bits 8-15 and an index in the
            // low byte (unique among them).
            let size = ((h >> 8) & 0xff) as usize;
            let elem = builtin_elem(h)
                .filter(|e| e.size() == size)
                .unwrap_or(Elem::Opaque { size });
            builtin[(h & 0xff) as usize] = Some((h, Layout::builtin(elem)));
        }
        Types {
            builtin,
            pairs: vec![
                (MPI_FLOAT_INT, pair(Num::F32, 4, 8)),
                (MPI_DOUBLE_INT, pair(Num::F64, 8, 16)),
                (MPI_LONG_INT, pair(Num::I64, 8, 16)),
                (MPI_SHORT_INT, pair(Num::I16, 4, 8)),
                (
                    MPI_LONG_DOUBLE_INT,
                    Layout::builtin(Elem::Opaque { size: 32 }),
                ),
            ],
            derived: Vec::new(),
        }
    }

    /// The layout of handle `h`.
    pub(crate) fn get(&self, h: c_int) -> Result<&Layout, MpiError> {
        if let Some(Some((bh, l))) = self.builtin.get((h & 0xff) as usize) {
            if *bh == h {
                return Ok(l);
            }
        }
        if let Some(i) = handles::index_of(h, DATATYPE) {
            if let Some(Some(l)) = self.derived.get(i) {
                return Ok(l);
            }
        }
        if let Some((_, l)) = self.pairs.iter().find(|(ph, _)| *ph == h) {
            return Ok(l);
        }
        Err(MpiError::new(
            Class::Type,
            format!("{h:#x} is not a datatype"),
        ))
    }

    fn add(&mut self, l: Layout) -> Result<c_int, MpiError> {
        let i = quiver_mpi::store(&mut self.derived, l);
        handles::handle(DATATYPE, i)
    }

    fn derived_mut(&mut self, h: c_int) -> Result<&mut Option<Layout>, MpiError> {
        handles::index_of(h, DATATYPE)
            .and_then(|i| self.derived.get_mut(i))
            .filter(|l| l.is_some())
            .ok_or_else(|| MpiError::new(Class::Type, format!("{h:#x} is not a derived datatype")))
    }
}

/// Writes a new type's handle, or fails.
fn create(
    types: &mut Types,
    old: c_int,
    out: *mut c_int,
    f: impl FnOnce(&Layout) -> Result<Layout, MpiError>,
) -> Result<(), MpiError> {
    let new = f(types.get(old)?)?;
    let h = types.add(new)?;
    // SAFETY: MPI's contract: `out` points at a writable handle.
    unsafe { out.write(h) };
    Ok(())
}

#[no_mangle]
pub extern "C" fn MPI_Type_size(dt: c_int, size: *mut c_int) -> c_int {
    query("MPI_Type_size", |types| {
        let s = types.get(dt)?.size;
        // SAFETY: MPI's contract: `size` is writable.
        unsafe { size.write(c_int::try_from(s).unwrap_or(MPI_UNDEFINED)) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_size_x(dt: c_int, size: *mut i64) -> c_int {
    query("MPI_Type_size_x", |types| {
        let s = types.get(dt)?.size;
        // SAFETY: MPI's contract: `size` is writable.
        unsafe { size.write(s as i64) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_get_extent(dt: c_int, lb: *mut isize, extent: *mut isize) -> c_int {
    query("MPI_Type_get_extent", |types| {
        let l = types.get(dt)?;
        // SAFETY: MPI's contract: both are writable.
        unsafe {
            lb.write(l.lb);
            extent.write(l.extent);
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_get_true_extent(dt: c_int, lb: *mut isize, extent: *mut isize) -> c_int {
    query("MPI_Type_get_true_extent", |types| {
        let l = types.get(dt)?;
        let lo = l.blocks.iter().map(|b| b.disp).min().unwrap_or(0);
        let hi = l
            .blocks
            .iter()
            .map(|b| b.disp + b.len as isize)
            .max()
            .unwrap_or(0);
        // SAFETY: MPI's contract: both are writable.
        unsafe {
            lb.write(lo);
            extent.write(hi - lo);
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_commit(dt: *mut c_int) -> c_int {
    call_types("MPI_Type_commit", |types| {
        // SAFETY: MPI's contract: `dt` points at a handle.
        let h = unsafe { dt.read() };
        if types.get(h)?.committed {
            return Ok(());
        }
        if let Some(l) = types.derived_mut(h)? {
            l.committed = true;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_free(dt: *mut c_int) -> c_int {
    call_types("MPI_Type_free", |types| {
        // SAFETY: MPI's contract: `dt` points at a handle.
        let h = unsafe { dt.read() };
        *types.derived_mut(h)? = None;
        // SAFETY: as above, writable.
        unsafe { dt.write(MPI_DATATYPE_NULL) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_dup(old: c_int, new: *mut c_int) -> c_int {
    call_types("MPI_Type_dup", |types| {
        create(types, old, new, |l| Ok(l.clone()))
    })
}

fn type_contiguous(name: &str, n: i64, old: c_int, new: *mut c_int) -> c_int {
    call_types(name, |types| {
        let n = count(n, "count")?;
        create(types, old, new, |l| {
            Layout::hindexed([(0, n)], l).map(uncommitted)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_contiguous(n: c_int, old: c_int, new: *mut c_int) -> c_int {
    type_contiguous("MPI_Type_contiguous", n as i64, old, new)
}

#[no_mangle]
pub extern "C" fn MPI_Type_contiguous_c(n: i64, old: c_int, new: *mut c_int) -> c_int {
    type_contiguous("MPI_Type_contiguous_c", n, old, new)
}

fn uncommitted(mut l: Layout) -> Layout {
    l.committed = false;
    l
}

fn type_vector(
    name: &str,
    n: i64,
    blocklen: i64,
    stride: i64,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    call_types(name, |types| {
        let (n, b) = (count(n, "count")?, count(blocklen, "block length")?);
        create(types, old, new, |l| {
            Layout::hvector(n, b, stride as isize * l.extent, l)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_vector(
    n: c_int,
    blocklen: c_int,
    stride: c_int,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    type_vector(
        "MPI_Type_vector",
        n as i64,
        blocklen as i64,
        stride as i64,
        old,
        new,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Type_vector_c(
    n: i64,
    blocklen: i64,
    stride: i64,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    type_vector("MPI_Type_vector_c", n, blocklen, stride, old, new)
}

fn type_create_hvector(
    name: &str,
    n: i64,
    blocklen: i64,
    stride: i64,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    call_types(name, |types| {
        let (n, b) = (count(n, "count")?, count(blocklen, "block length")?);
        create(types, old, new, |l| {
            Layout::hvector(n, b, stride as isize, l)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_create_hvector(
    n: c_int,
    blocklen: c_int,
    stride: isize,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    type_create_hvector(
        "MPI_Type_create_hvector",
        n as i64,
        blocklen as i64,
        stride as i64,
        old,
        new,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Type_create_hvector_c(
    n: i64,
    blocklen: i64,
    stride: i64,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    type_create_hvector("MPI_Type_create_hvector_c", n, blocklen, stride, old, new)
}

fn type_create_resized(name: &str, old: c_int, lb: i64, extent: i64, new: *mut c_int) -> c_int {
    call_types(name, |types| {
        create(types, old, new, |l| {
            Ok(Layout::resized(l, lb as isize, extent as isize))
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_create_resized(
    old: c_int,
    lb: isize,
    extent: isize,
    new: *mut c_int,
) -> c_int {
    type_create_resized(
        "MPI_Type_create_resized",
        old,
        lb as i64,
        extent as i64,
        new,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Type_create_resized_c(
    old: c_int,
    lb: i64,
    extent: i64,
    new: *mut c_int,
) -> c_int {
    type_create_resized("MPI_Type_create_resized_c", old, lb, extent, new)
}

#[no_mangle]
pub extern "C" fn MPI_Get_count(status: *const MPI_Status, dt: c_int, out: *mut c_int) -> c_int {
    query("MPI_Get_count", |types| {
        let size = types.get(dt)?.size as i64;
        // SAFETY: MPI's contract: a status and a writable int.
        let bytes = handles::status_bytes(unsafe { &*status });
        let n = if size == 0 {
            0
        } else if bytes % size != 0 {
            MPI_UNDEFINED
        } else {
            c_int::try_from(bytes / size).unwrap_or(MPI_UNDEFINED)
        };
        // SAFETY: as above.
        unsafe { out.write(n) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Get_elements(status: *const MPI_Status, dt: c_int, out: *mut c_int) -> c_int {
    query("MPI_Get_elements", |types| {
        let l = types.get(dt)?;
        let basic = l.elem.map_or(1, |e| e.size()) as i64;
        // SAFETY: MPI's contract: a status and a writable int.
        let bytes = handles::status_bytes(unsafe { &*status });
        let n = if basic == 0 || bytes % basic != 0 {
            MPI_UNDEFINED
        } else {
            c_int::try_from(bytes / basic).unwrap_or(MPI_UNDEFINED)
        };
        // SAFETY: as above.
        unsafe { out.write(n) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Get_address(location: *const c_void, address: *mut isize) -> c_int {
    // SAFETY: MPI's contract: `address` is writable.
    unsafe { address.write(location as isize) };
    MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Aint_add(base: isize, disp: isize) -> isize {
    base.wrapping_add(disp)
}

#[no_mangle]
pub extern "C" fn MPI_Aint_diff(a: isize, b: isize) -> isize {
    a.wrapping_sub(b)
}

/// `n` values at `p` (none when `n` is 0, whatever `p` is).
///
/// # Safety
///
/// `n` readable values at `p` when `n > 0`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if n == 0 {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(p, n) }
}

#[no_mangle]
pub extern "C" fn MPI_Type_size_c(dt: c_int, size: *mut i64) -> c_int {
    MPI_Type_size_x(dt, size)
}

#[no_mangle]
pub extern "C" fn MPI_Type_get_extent_c(dt: c_int, lb: *mut i64, extent: *mut i64) -> c_int {
    // MPI_Count and MPI_Aint are both 64 bits here.
    MPI_Type_get_extent(dt, lb.cast(), extent.cast())
}

#[no_mangle]
pub extern "C" fn MPI_Type_get_true_extent_c(dt: c_int, lb: *mut i64, extent: *mut i64) -> c_int {
    MPI_Type_get_true_extent(dt, lb.cast(), extent.cast())
}

/// Elements of `dt` in the bytes a status says were received (`per`: the bytes of one
/// element counted: the type's size, or its basic element's).
fn elements(
    name: &str,
    status: *const MPI_Status,
    dt: c_int,
    per: fn(&Layout) -> usize,
) -> Result<i64, MpiError> {
    let mut out = 0;
    let rc = query(name, |types| {
        let size = per(types.get(dt)?) as i64;
        // SAFETY: MPI's contract: `status` points at a status.
        let bytes = handles::status_bytes(unsafe { &*status });
        out = if size == 0 {
            0
        } else if bytes % size != 0 {
            i64::from(MPI_UNDEFINED)
        } else {
            bytes / size
        };
        Ok(())
    });
    if rc == MPI_SUCCESS {
        Ok(out)
    } else {
        Err(MpiError::new(Class::Type, "bad datatype"))
    }
}

#[no_mangle]
pub extern "C" fn MPI_Get_count_c(status: *const MPI_Status, dt: c_int, out: *mut i64) -> c_int {
    match elements("MPI_Get_count_c", status, dt, |l| l.size) {
        Ok(n) => {
            // SAFETY: MPI's contract: `out` is writable.
            unsafe { out.write(n) };
            MPI_SUCCESS
        }
        Err(_) => MPI_ERR_TYPE,
    }
}

#[no_mangle]
pub extern "C" fn MPI_Get_elements_c(status: *const MPI_Status, dt: c_int, out: *mut i64) -> c_int {
    match elements("MPI_Get_elements_c", status, dt, |l| {
        l.elem.map_or(1, |e| e.size())
    }) {
        Ok(n) => {
            // SAFETY: MPI's contract: `out` is writable.
            unsafe { out.write(n) };
            MPI_SUCCESS
        }
        Err(_) => MPI_ERR_TYPE,
    }
}

/// `MPI_Type_indexed` (`in_extents`: displacements in the old type's extents) and
/// `MPI_Type_create_hindexed` (in bytes), classic (`int` counts) or `_c` (`MPI_Count`).
fn indexed<L: Copy + Into<i64>, D: Copy + Into<i64>>(
    name: &str,
    n: i64,
    blocklens: *const L,
    displs: *const D,
    in_extents: bool,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    call_types(name, |types| {
        let n = count(n, "count")?;
        // SAFETY: MPI's contract: `n` block lengths and displacements.
        let (lens, ds) = unsafe { (slice(blocklens, n), slice(displs, n)) };
        let blocks = lens
            .iter()
            .zip(ds)
            .map(|(&b, &d)| Ok((d.into() as isize, count(b, "block length")?)))
            .collect::<Result<Vec<_>, MpiError>>()?;
        create(types, old, new, |l| {
            let scale = if in_extents { l.extent } else { 1 };
            Layout::hindexed(blocks.iter().map(|&(d, b)| (d * scale, b)), l)
        })
    })
}

#[no_mangle]
pub extern "C" fn MPI_Type_indexed(
    n: c_int,
    blocklens: *const c_int,
    displs: *const c_int,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    indexed(
        "MPI_Type_indexed",
        i64::from(n),
        blocklens,
        displs,
        true,
        old,
        new,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Type_indexed_c(
    n: i64,
    blocklens: *const i64,
    displs: *const i64,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    indexed("MPI_Type_indexed_c", n, blocklens, displs, true, old, new)
}

// MPI_Aint is a 64-bit integer here, as MPI_Count.
#[no_mangle]
pub extern "C" fn MPI_Type_create_hindexed(
    n: c_int,
    blocklens: *const c_int,
    displs: *const isize,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    indexed(
        "MPI_Type_create_hindexed",
        i64::from(n),
        blocklens,
        displs.cast::<i64>(),
        false,
        old,
        new,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Type_create_hindexed_c(
    n: i64,
    blocklens: *const i64,
    displs: *const i64,
    old: c_int,
    new: *mut c_int,
) -> c_int {
    indexed(
        "MPI_Type_create_hindexed_c",
        n,
        blocklens,
        displs,
        false,
        old,
        new,
    )
}
