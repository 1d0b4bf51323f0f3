//! Collective calls and reduction operations.

use crate::abi::*;
use crate::handles::{self, comm_id, USER_OP};
use crate::types::slice;
use crate::{call, count, Lib};
use quiver_mpi::coll::Elems;
use quiver_mpi::{Builtin, Class, Elem, Layout, MpiError, Op};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// Whether a send buffer is `MPI_IN_PLACE`.
fn in_place(p: *const c_void) -> bool {
    p as isize == MPI_IN_PLACE
}

/// The operation of handle `h`.
pub(crate) fn op(lib: &Lib, h: c_int) -> Result<Op, MpiError> {
    let b = match h {
        MPI_MAX => Builtin::Max,
        MPI_MIN => Builtin::Min,
        MPI_SUM => Builtin::Sum,
        MPI_PROD => Builtin::Prod,
        MPI_LAND => Builtin::Land,
        MPI_BAND => Builtin::Band,
        MPI_LOR => Builtin::Lor,
        MPI_BOR => Builtin::Bor,
        MPI_LXOR => Builtin::Lxor,
        MPI_BXOR => Builtin::Bxor,
        MPI_MAXLOC => Builtin::Maxloc,
        MPI_MINLOC => Builtin::Minloc,
        MPI_REPLACE => Builtin::Replace,
        MPI_NO_OP => Builtin::NoOp,
        _ => {
            return handles::index_of(h, USER_OP)
                .and_then(|i| lib.ops.get(i).cloned().flatten())
                .ok_or_else(|| MpiError::new(Class::Op, format!("{h:#x} is not an operation")))
        }
    };
    Ok(Op::Builtin(b))
}

/// MPI's `MPI_User_function`.
type UserFunction = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut c_int);

/// MPI's `MPI_User_function_c` (counts of `MPI_Count`).
type UserFunctionC = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut i64, *mut c_int);

/// An application's function, in either of MPI's two signatures.
#[derive(Clone, Copy)]
enum UserFunc {
    Int(UserFunction),
    Wide(UserFunctionC),
}

fn op_create(name: &str, f: Option<UserFunc>, commute: c_int, out: *mut c_int) -> c_int {
    call(name, MPI_COMM_WORLD, |lib, _| {
        let f = f.ok_or_else(|| MpiError::new(Class::Arg, "a null function"))?;
        let wrapped: quiver_mpi::UserFn = Arc::new(move |inp, inout, n, dt| {
            let mut dt = dt as c_int;
            // A classic function's count is an int: the classic calls, whose counts are
            // ints, never reduce more elements than that.
            match f {
                UserFunc::Int(f) => {
                    let mut n = n as c_int;
                    // SAFETY: MPI's contract for user functions: `n` elements of `dt`
                    // at both (the function may ask about `dt`, nothing else of MPI).
                    unsafe { f(inp.cast_mut().cast(), inout.cast(), &mut n, &mut dt) }
                }
                UserFunc::Wide(f) => {
                    let mut n = n as i64;
                    // SAFETY: as above, with an MPI_Count.
                    unsafe { f(inp.cast_mut().cast(), inout.cast(), &mut n, &mut dt) }
                }
            }
        });
        let i = quiver_mpi::store(
            &mut lib.ops,
            Op::User {
                f: wrapped,
                commute: commute != 0,
            },
        );
        let h = handles::handle(USER_OP, i)?;
        // SAFETY: MPI's contract: `out` is writable.
        unsafe { out.write(h) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Op_create(f: Option<UserFunction>, commute: c_int, out: *mut c_int) -> c_int {
    op_create("MPI_Op_create", f.map(UserFunc::Int), commute, out)
}

#[no_mangle]
pub extern "C" fn MPI_Op_create_c(
    f: Option<UserFunctionC>,
    commute: c_int,
    out: *mut c_int,
) -> c_int {
    op_create("MPI_Op_create_c", f.map(UserFunc::Wide), commute, out)
}

#[no_mangle]
pub extern "C" fn MPI_Op_free(h: *mut c_int) -> c_int {
    call("MPI_Op_free", MPI_COMM_WORLD, |lib, _| {
        // SAFETY: MPI's contract: `h` points at a handle.
        let i = handles::index_of(unsafe { h.read() }, USER_OP)
            .filter(|&i| lib.ops.get(i).is_some_and(Option::is_some))
            .ok_or_else(|| MpiError::new(Class::Op, "not an operation the application created"))?;
        lib.ops[i] = None;
        // SAFETY: as above, writable.
        unsafe { h.write(MPI_OP_NULL) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Op_commutative(h: c_int, flag: *mut c_int) -> c_int {
    call("MPI_Op_commutative", MPI_COMM_WORLD, |lib, _| {
        let c = op(lib, h)?.commutative();
        // SAFETY: MPI's contract: `flag` is writable.
        unsafe { flag.write(c_int::from(c)) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Barrier(comm: c_int) -> c_int {
    call("MPI_Barrier", comm, |lib, _| {
        lib.mpi.barrier(comm_id(comm)?)
    })
}

fn bcast(name: &str, buf: *mut c_void, n: i64, dt: c_int, root: c_int, comm: c_int) -> c_int {
    call(name, comm, |lib, types| {
        let (n, root, c) = (
            count(n, "count")?,
            count(root, "root")? as u32,
            comm_id(comm)?,
        );
        let l = types.get(dt)?;
        // SAFETY: MPI's contract: `n` elements at `buf`.
        unsafe { lib.mpi.bcast(buf.cast(), n, l, root, c) }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Bcast(
    buf: *mut c_void,
    n: c_int,
    dt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    bcast("MPI_Bcast", buf, n as i64, dt, root, comm)
}

#[no_mangle]
pub extern "C" fn MPI_Bcast_c(
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    bcast("MPI_Bcast_c", buf, n, dt, root, comm)
}

fn reduce(
    name: &str,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: i64,
    dt: c_int,
    o: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    call(name, comm, |lib, types| {
        let (n, root, c) = (
            count(n, "count")?,
            count(root, "root")? as u32,
            comm_id(comm)?,
        );
        let op = op(lib, o)?;
        let l = types.get(dt)?;
        let send = (!in_place(sbuf)).then_some(sbuf.cast());
        // SAFETY: MPI's contract: `n` elements at each buffer.
        unsafe {
            lib.mpi
                .reduce(send, rbuf.cast(), n, l, &op, root, c, dt as u64)
        }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Reduce(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: c_int,
    dt: c_int,
    o: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    reduce("MPI_Reduce", sbuf, rbuf, n as i64, dt, o, root, comm)
}

#[no_mangle]
pub extern "C" fn MPI_Reduce_c(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: i64,
    dt: c_int,
    o: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    reduce("MPI_Reduce_c", sbuf, rbuf, n, dt, o, root, comm)
}

fn allreduce(
    name: &str,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: i64,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    call(name, comm, |lib, types| {
        let (n, c) = (count(n, "count")?, comm_id(comm)?);
        let op = op(lib, o)?;
        let l = types.get(dt)?;
        let send = (!in_place(sbuf)).then_some(sbuf.cast());
        // SAFETY: MPI's contract: `n` elements at each buffer.
        unsafe {
            lib.mpi
                .allreduce(send, rbuf.cast(), n, l, &op, c, dt as u64)
        }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Allreduce(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: c_int,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    allreduce("MPI_Allreduce", sbuf, rbuf, n as i64, dt, o, comm)
}

#[no_mangle]
pub extern "C" fn MPI_Allreduce_c(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: i64,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    allreduce("MPI_Allreduce_c", sbuf, rbuf, n, dt, o, comm)
}

fn reduce_local(
    name: &str,
    inbuf: *const c_void,
    inoutbuf: *mut c_void,
    n: i64,
    dt: c_int,
    o: c_int,
) -> c_int {
    call(name, MPI_COMM_WORLD, |lib, types| {
        let n = count(n, "count")?;
        let op = op(lib, o)?;
        let l = types.get(dt)?;
        if !l.is_contiguous() {
            return Err(MpiError::new(
                Class::Unsupported,
                "MPI_Reduce_local on a datatype that is not contiguous",
            ));
        }
        op.check_layout(l)?;
        let bytes = l.bytes(n)?;
        // SAFETY: MPI's contract: `n` elements (contiguous: `bytes`) at each buffer, apart.
        unsafe { op.combine(l, bytes, inbuf.cast(), inoutbuf.cast(), dt as u64) }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Reduce_local(
    inbuf: *const c_void,
    inoutbuf: *mut c_void,
    n: c_int,
    dt: c_int,
    o: c_int,
) -> c_int {
    reduce_local("MPI_Reduce_local", inbuf, inoutbuf, n as i64, dt, o)
}

#[no_mangle]
pub extern "C" fn MPI_Reduce_local_c(
    inbuf: *const c_void,
    inoutbuf: *mut c_void,
    n: i64,
    dt: c_int,
    o: c_int,
) -> c_int {
    reduce_local("MPI_Reduce_local_c", inbuf, inoutbuf, n, dt, o)
}

/// An array of counts or displacements of the application's: `int`s (the classic
/// calls) or 64-bit `MPI_Count`s and `MPI_Aint`s (the `_c` calls).
#[derive(Clone, Copy)]
enum Arr {
    Int(*const c_int),
    Wide(*const i64),
}

impl Arr {
    /// Its first `n` values.
    ///
    /// # Safety
    ///
    /// `n` values are readable there (when `n > 0`).
    unsafe fn values(self, n: usize) -> Vec<i64> {
        match self {
            // SAFETY: the caller's promise.
            Arr::Int(p) => unsafe { slice(p, n) }
                .iter()
                .map(|&v| i64::from(v))
                .collect(),
            // SAFETY: the caller's promise.
            Arr::Wide(p) => unsafe { slice(p, n) }.to_vec(),
        }
    }
}

/// `n` pieces of elements of `l`: `count` each, one after the other from `base`
/// (`counts` is `Err(count)`), or `counts[i]` at displacement `displs[i]` (in extents).
fn pieces(
    base: *const c_void,
    l: &Layout,
    n: usize,
    counts: Result<Arr, i64>,
    displs: Arr,
) -> Result<Vec<Elems<'_>>, MpiError> {
    let each: Result<(Vec<i64>, Vec<i64>), usize> = match counts {
        Err(c) => Err(count(c, "count")?),
        // SAFETY: MPI's contract: a count and a displacement per rank.
        Ok(p) => Ok(unsafe { (p.values(n), displs.values(n)) }),
    };
    (0..n)
        .map(|i| {
            let (count, at) = match &each {
                Err(c) => (*c, (i * c) as isize),
                Ok((ref counts, ref displs)) => {
                    (crate::count(counts[i], "count")?, displs[i] as isize)
                }
            };
            Ok(Elems {
                ptr: base.cast::<u8>().wrapping_offset(at * l.extent),
                count,
                layout: l,
            })
        })
        .collect()
}

#[no_mangle]
pub extern "C" fn MPI_Gather(
    sbuf: *const c_void,
    sn: c_int,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: c_int,
    rdt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    gatherv(
        "MPI_Gather",
        sbuf,
        i64::from(sn),
        sdt,
        rbuf,
        Err(i64::from(rn)),
        Arr::Int(std::ptr::null()),
        rdt,
        root,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Gather_c(
    sbuf: *const c_void,
    sn: i64,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: i64,
    rdt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    gatherv(
        "MPI_Gather_c",
        sbuf,
        sn,
        sdt,
        rbuf,
        Err(rn),
        Arr::Wide(std::ptr::null()),
        rdt,
        root,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Gatherv(
    sbuf: *const c_void,
    sn: c_int,
    sdt: c_int,
    rbuf: *mut c_void,
    rns: *const c_int,
    displs: *const c_int,
    rdt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    gatherv(
        "MPI_Gatherv",
        sbuf,
        i64::from(sn),
        sdt,
        rbuf,
        Ok(Arr::Int(rns)),
        Arr::Int(displs),
        rdt,
        root,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Gatherv_c(
    sbuf: *const c_void,
    sn: i64,
    sdt: c_int,
    rbuf: *mut c_void,
    rns: *const i64,
    displs: *const isize,
    rdt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    gatherv(
        "MPI_Gatherv_c",
        sbuf,
        sn,
        sdt,
        rbuf,
        Ok(Arr::Wide(rns)),
        Arr::Wide(displs.cast()),
        rdt,
        root,
        comm,
    )
}

fn gatherv(
    name: &str,
    sbuf: *const c_void,
    sn: i64,
    sdt: c_int,
    rbuf: *mut c_void,
    rns: Result<Arr, i64>,
    displs: Arr,
    rdt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    call(name, comm, |lib, types| {
        let (root, c) = (count(root, "root")? as u32, comm_id(comm)?);
        let (size, me) = {
            let cm = lib.mpi.comm(c)?;
            (cm.size() as usize, cm.rank())
        };
        let at_root = me == root;
        let send = if in_place(sbuf) && at_root {
            None
        } else {
            Some(Elems {
                ptr: sbuf.cast(),
                count: count(sn, "count")?,
                layout: types.get(sdt)?,
            })
        };
        let recv = if at_root {
            let rl = types.get(rdt)?;
            pieces(rbuf, rl, size, rns, displs)?
        } else {
            Vec::new()
        };
        let recv = if at_root { recv } else { Vec::new() };
        if !at_root {
            // SAFETY: MPI's contract: the send elements readable.
            return unsafe { lib.mpi.gatherv(send, &[], root, c) };
        }
        // SAFETY: MPI's contract: each piece writable, apart.
        unsafe { lib.mpi.gatherv(send, &recv, root, c) }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Scatter(
    sbuf: *const c_void,
    sn: c_int,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: c_int,
    rdt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    scatterv(
        "MPI_Scatter",
        sbuf,
        Err(i64::from(sn)),
        Arr::Int(std::ptr::null()),
        sdt,
        rbuf,
        i64::from(rn),
        rdt,
        root,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Scatter_c(
    sbuf: *const c_void,
    sn: i64,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: i64,
    rdt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    scatterv(
        "MPI_Scatter_c",
        sbuf,
        Err(sn),
        Arr::Wide(std::ptr::null()),
        sdt,
        rbuf,
        rn,
        rdt,
        root,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Scatterv(
    sbuf: *const c_void,
    sns: *const c_int,
    displs: *const c_int,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: c_int,
    rdt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    scatterv(
        "MPI_Scatterv",
        sbuf,
        Ok(Arr::Int(sns)),
        Arr::Int(displs),
        sdt,
        rbuf,
        i64::from(rn),
        rdt,
        root,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Scatterv_c(
    sbuf: *const c_void,
    sns: *const i64,
    displs: *const isize,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: i64,
    rdt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    scatterv(
        "MPI_Scatterv_c",
        sbuf,
        Ok(Arr::Wide(sns)),
        Arr::Wide(displs.cast()),
        sdt,
        rbuf,
        rn,
        rdt,
        root,
        comm,
    )
}

fn scatterv(
    name: &str,
    sbuf: *const c_void,
    sns: Result<Arr, i64>,
    displs: Arr,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: i64,
    rdt: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    call(name, comm, |lib, types| {
        let (root, c) = (count(root, "root")? as u32, comm_id(comm)?);
        let (size, me) = {
            let cm = lib.mpi.comm(c)?;
            (cm.size() as usize, cm.rank())
        };
        let at_root = me == root;
        let recv = if in_place(rbuf) && at_root {
            None
        } else {
            Some(Elems {
                ptr: rbuf.cast(),
                count: count(rn, "count")?,
                layout: types.get(rdt)?,
            })
        };
        let send = if at_root {
            let sl = types.get(sdt)?;
            pieces(sbuf, sl, size, sns, displs)?
        } else {
            Vec::new()
        };
        // SAFETY: MPI's contract: the pieces readable, `recv` writable.
        unsafe { lib.mpi.scatterv(&send, recv, root, c) }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Allgather(
    sbuf: *const c_void,
    sn: c_int,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: c_int,
    rdt: c_int,
    comm: c_int,
) -> c_int {
    allgatherv(
        "MPI_Allgather",
        sbuf,
        i64::from(sn),
        sdt,
        rbuf,
        Err(i64::from(rn)),
        Arr::Int(std::ptr::null()),
        rdt,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Allgather_c(
    sbuf: *const c_void,
    sn: i64,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: i64,
    rdt: c_int,
    comm: c_int,
) -> c_int {
    allgatherv(
        "MPI_Allgather_c",
        sbuf,
        sn,
        sdt,
        rbuf,
        Err(rn),
        Arr::Wide(std::ptr::null()),
        rdt,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Allgatherv(
    sbuf: *const c_void,
    sn: c_int,
    sdt: c_int,
    rbuf: *mut c_void,
    rns: *const c_int,
    displs: *const c_int,
    rdt: c_int,
    comm: c_int,
) -> c_int {
    allgatherv(
        "MPI_Allgatherv",
        sbuf,
        i64::from(sn),
        sdt,
        rbuf,
        Ok(Arr::Int(rns)),
        Arr::Int(displs),
        rdt,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Allgatherv_c(
    sbuf: *const c_void,
    sn: i64,
    sdt: c_int,
    rbuf: *mut c_void,
    rns: *const i64,
    displs: *const isize,
    rdt: c_int,
    comm: c_int,
) -> c_int {
    allgatherv(
        "MPI_Allgatherv_c",
        sbuf,
        sn,
        sdt,
        rbuf,
        Ok(Arr::Wide(rns)),
        Arr::Wide(displs.cast()),
        rdt,
        comm,
    )
}

fn allgatherv(
    name: &str,
    sbuf: *const c_void,
    sn: i64,
    sdt: c_int,
    rbuf: *mut c_void,
    rns: Result<Arr, i64>,
    displs: Arr,
    rdt: c_int,
    comm: c_int,
) -> c_int {
    call(name, comm, |lib, types| {
        let c = comm_id(comm)?;
        let (size, me) = {
            let cm = lib.mpi.comm(c)?;
            (cm.size() as usize, cm.rank() as usize)
        };
        let rl = types.get(rdt)?;
        let recv = pieces(rbuf, rl, size, rns, displs)?;
        let (mine, own) = if in_place(sbuf) {
            (recv[me], None)
        } else {
            let s = Elems {
                ptr: sbuf.cast(),
                count: count(sn, "count")?,
                layout: types.get(sdt)?,
            };
            (s, Some((s, recv[me])))
        };
        let send = vec![mine; size];
        // SAFETY: MPI's contract: the send elements readable, the pieces writable, apart.
        unsafe { lib.mpi.exchange(&send, &recv, own, c) }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Alltoall(
    sbuf: *const c_void,
    sn: c_int,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: c_int,
    rdt: c_int,
    comm: c_int,
) -> c_int {
    alltoallv(
        "MPI_Alltoall",
        sbuf,
        Err(i64::from(sn)),
        Arr::Int(std::ptr::null()),
        sdt,
        rbuf,
        Err(i64::from(rn)),
        Arr::Int(std::ptr::null()),
        rdt,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Alltoall_c(
    sbuf: *const c_void,
    sn: i64,
    sdt: c_int,
    rbuf: *mut c_void,
    rn: i64,
    rdt: c_int,
    comm: c_int,
) -> c_int {
    alltoallv(
        "MPI_Alltoall_c",
        sbuf,
        Err(sn),
        Arr::Wide(std::ptr::null()),
        sdt,
        rbuf,
        Err(rn),
        Arr::Wide(std::ptr::null()),
        rdt,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Alltoallv(
    sbuf: *const c_void,
    sns: *const c_int,
    sdispls: *const c_int,
    sdt: c_int,
    rbuf: *mut c_void,
    rns: *const c_int,
    rdispls: *const c_int,
    rdt: c_int,
    comm: c_int,
) -> c_int {
    alltoallv(
        "MPI_Alltoallv",
        sbuf,
        Ok(Arr::Int(sns)),
        Arr::Int(sdispls),
        sdt,
        rbuf,
        Ok(Arr::Int(rns)),
        Arr::Int(rdispls),
        rdt,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Alltoallv_c(
    sbuf: *const c_void,
    sns: *const i64,
    sdispls: *const isize,
    sdt: c_int,
    rbuf: *mut c_void,
    rns: *const i64,
    rdispls: *const isize,
    rdt: c_int,
    comm: c_int,
) -> c_int {
    alltoallv(
        "MPI_Alltoallv_c",
        sbuf,
        Ok(Arr::Wide(sns)),
        Arr::Wide(sdispls.cast()),
        sdt,
        rbuf,
        Ok(Arr::Wide(rns)),
        Arr::Wide(rdispls.cast()),
        rdt,
        comm,
    )
}

fn alltoallv(
    name: &str,
    sbuf: *const c_void,
    sns: Result<Arr, i64>,
    sd: Arr,
    sdt: c_int,
    rbuf: *mut c_void,
    rns: Result<Arr, i64>,
    rd: Arr,
    rdt: c_int,
    comm: c_int,
) -> c_int {
    call(name, comm, |lib, types| {
        let c = comm_id(comm)?;
        if in_place(sbuf) {
            return Err(MpiError::new(
                Class::Unsupported,
                "MPI_IN_PLACE in all-to-all",
            ));
        }
        let (size, me) = {
            let cm = lib.mpi.comm(c)?;
            (cm.size() as usize, cm.rank() as usize)
        };
        let (sl, rl) = (types.get(sdt)?, types.get(rdt)?);
        let send = pieces(sbuf, sl, size, sns, sd)?;
        let recv = pieces(rbuf.cast_const(), rl, size, rns, rd)?;
        // SAFETY: MPI's contract: the send pieces readable, the receive pieces writable.
        unsafe {
            lib.mpi
                .exchange(&send, &recv, Some((send[me], recv[me])), c)
        }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Reduce_scatter_block(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    rn: c_int,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    reduce_scatter(
        "MPI_Reduce_scatter_block",
        sbuf,
        rbuf,
        Err(i64::from(rn)),
        dt,
        o,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Reduce_scatter_block_c(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    rn: i64,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    reduce_scatter(
        "MPI_Reduce_scatter_block_c",
        sbuf,
        rbuf,
        Err(rn),
        dt,
        o,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Reduce_scatter(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    rns: *const c_int,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    reduce_scatter(
        "MPI_Reduce_scatter",
        sbuf,
        rbuf,
        Ok(Arr::Int(rns)),
        dt,
        o,
        comm,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Reduce_scatter_c(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    rns: *const i64,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    reduce_scatter(
        "MPI_Reduce_scatter_c",
        sbuf,
        rbuf,
        Ok(Arr::Wide(rns)),
        dt,
        o,
        comm,
    )
}

/// A reduction to rank 0 into a temporary, scattered from there.
fn reduce_scatter(
    name: &str,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    rns: Result<Arr, i64>,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    call(name, comm, |lib, types| {
        let c = comm_id(comm)?;
        let (size, me) = {
            let cm = lib.mpi.comm(c)?;
            (cm.size() as usize, cm.rank() as usize)
        };
        let op = op(lib, o)?;
        let l = types.get(dt)?;
        if !l.is_contiguous() {
            return Err(MpiError::new(
                Class::Unsupported,
                format!("{name} on a datatype that is not contiguous"),
            ));
        }
        let counts: Vec<usize> = match rns {
            Err(n) => vec![count(n, "count")?; size],
            // SAFETY: MPI's contract: a count per rank.
            Ok(p) => unsafe { p.values(size) }
                .into_iter()
                .map(|n| count(n, "count"))
                .collect::<Result<_, _>>()?,
        };
        let total: usize = counts.iter().sum();
        let mut tmp = vec![0u8; l.bytes(total)?];
        let send = if in_place(sbuf) {
            rbuf.cast_const().cast()
        } else {
            sbuf.cast()
        };
        // SAFETY: MPI's contract: `total` elements at the send buffer; `tmp` holds them.
        unsafe {
            lib.mpi
                .reduce(Some(send), tmp.as_mut_ptr(), total, l, &op, 0, c, dt as u64)
        }?;
        let bytes = Layout::builtin(Elem::Bytes {
            size: 1,
            bitwise: false,
        });
        let mut at = 0;
        let send_pieces: Vec<Elems<'_>> = counts
            .iter()
            .map(|&n| {
                let e = Elems {
                    ptr: tmp.as_ptr().wrapping_add(at),
                    count: n * l.size,
                    layout: &bytes,
                };
                at += n * l.size;
                e
            })
            .collect();
        let mine = Elems {
            ptr: rbuf.cast(),
            count: counts[me],
            layout: l,
        };
        let send_pieces = if me == 0 { send_pieces } else { Vec::new() };
        // SAFETY: `tmp` lives for the call; `rbuf` has room for this rank's count.
        unsafe { lib.mpi.scatterv(&send_pieces, Some(mine), 0, c) }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Scan(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: c_int,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    scan("MPI_Scan", sbuf, rbuf, i64::from(n), dt, o, comm, false)
}

#[no_mangle]
pub extern "C" fn MPI_Scan_c(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: i64,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    scan("MPI_Scan_c", sbuf, rbuf, n, dt, o, comm, false)
}

#[no_mangle]
pub extern "C" fn MPI_Exscan(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: c_int,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    scan("MPI_Exscan", sbuf, rbuf, i64::from(n), dt, o, comm, true)
}

#[no_mangle]
pub extern "C" fn MPI_Exscan_c(
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: i64,
    dt: c_int,
    o: c_int,
    comm: c_int,
) -> c_int {
    scan("MPI_Exscan_c", sbuf, rbuf, n, dt, o, comm, true)
}

fn scan(
    name: &str,
    sbuf: *const c_void,
    rbuf: *mut c_void,
    n: i64,
    dt: c_int,
    o: c_int,
    comm: c_int,
    exclusive: bool,
) -> c_int {
    call(name, comm, |lib, types| {
        let (n, c) = (count(n, "count")?, comm_id(comm)?);
        let op = op(lib, o)?;
        let l = types.get(dt)?;
        let send = (!in_place(sbuf)).then_some(sbuf.cast());
        // SAFETY: MPI's contract: `n` elements at each buffer.
        unsafe {
            lib.mpi
                .scan(send, rbuf.cast(), n, l, &op, c, dt as u64, exclusive)
        }
    })
}
