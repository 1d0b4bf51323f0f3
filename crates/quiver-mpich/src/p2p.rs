//! Point-to-point calls: sends, receives, requests, probes.

use crate::abi::*;
use crate::handles::{
    self, comm_id, dest, recv_tag, req_id, send_tag, source, write_status, REQUEST,
};
use crate::types::slice;
use crate::{call, class_code, count, MPI_Status};
use quiver_mpi::{Class, MpiError, Status};
use std::ffi::{c_int, c_void};

/// `MPI_Send` and `MPI_Ssend` (`sync`: returns once a receive took the message).
#[allow(clippy::too_many_arguments)]
fn send(
    name: &str,
    buf: *const c_void,
    n: i64,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
    sync: bool,
) -> c_int {
    call(name, comm, |lib, types| {
        let (n, to, tag, c) = (
            count(n, "count")?,
            dest(to)?,
            send_tag(tag)?,
            comm_id(comm)?,
        );
        let l = types.get(dt)?;
        // SAFETY: MPI's contract: `n` elements of `dt` readable at `buf`.
        unsafe {
            if sync {
                lib.mpi.ssend(buf.cast(), n, l, to, tag, c)
            } else {
                lib.mpi.send(buf.cast(), n, l, to, tag, c)
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Send(
    buf: *const c_void,
    n: c_int,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
) -> c_int {
    send("MPI_Send", buf, n as i64, dt, to, tag, comm, false)
}

#[no_mangle]
pub extern "C" fn MPI_Send_c(
    buf: *const c_void,
    n: i64,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
) -> c_int {
    send("MPI_Send_c", buf, n, dt, to, tag, comm, false)
}

#[no_mangle]
pub extern "C" fn MPI_Ssend(
    buf: *const c_void,
    n: c_int,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
) -> c_int {
    send("MPI_Ssend", buf, n as i64, dt, to, tag, comm, true)
}

#[no_mangle]
pub extern "C" fn MPI_Rsend(
    buf: *const c_void,
    n: c_int,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
) -> c_int {
    MPI_Send(buf, n, dt, to, tag, comm)
}

fn recv(
    name: &str,
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    from: c_int,
    tag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    call(name, comm, |lib, types| {
        let (n, from, tag, c) = (
            count(n, "count")?,
            source(from)?,
            recv_tag(tag)?,
            comm_id(comm)?,
        );
        let l = types.get(dt)?;
        // SAFETY: MPI's contract: room for `n` elements of `dt` at `buf`.
        let r = unsafe { lib.mpi.recv(buf.cast(), n, l, from, tag, c) };
        finish(r, status)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Recv(
    buf: *mut c_void,
    n: c_int,
    dt: c_int,
    from: c_int,
    tag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    recv("MPI_Recv", buf, n as i64, dt, from, tag, comm, status)
}

#[no_mangle]
pub extern "C" fn MPI_Recv_c(
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    from: c_int,
    tag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    recv("MPI_Recv_c", buf, n, dt, from, tag, comm, status)
}

/// Writes a receive's status (also a failed one's, where it has one) and passes the
/// result on.
fn finish(r: Result<Status, MpiError>, status: *mut MPI_Status) -> Result<(), MpiError> {
    match r {
        Ok(s) => {
            // SAFETY: MPI's contract: an ignore value or a writable status.
            unsafe { write_status(status, &s, None) };
            Ok(())
        }
        Err(e) => {
            if let Some(s) = e.status() {
                // SAFETY: as above.
                unsafe { write_status(status, &s, None) };
            }
            Err(e)
        }
    }
}

/// Writes a new request's handle.
fn put_request(out: *mut c_int, id: usize) -> Result<(), MpiError> {
    let h = handles::handle(REQUEST, id)?;
    // SAFETY: MPI's contract: `out` is writable.
    unsafe { out.write(h) };
    Ok(())
}

/// `MPI_Isend` and `MPI_Issend` (`sync`: complete once a receive took the message).
#[allow(clippy::too_many_arguments)]
fn isend(
    name: &str,
    buf: *const c_void,
    n: i64,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
    req: *mut c_int,
    sync: bool,
) -> c_int {
    call(name, comm, |lib, types| {
        let (n, to, tag, c) = (
            count(n, "count")?,
            dest(to)?,
            send_tag(tag)?,
            comm_id(comm)?,
        );
        let l = types.get(dt)?;
        // SAFETY: MPI's contract: the elements stay readable until the request completes.
        let id = unsafe {
            if sync {
                lib.mpi.issend(buf.cast(), n, l, to, tag, c)
            } else {
                lib.mpi.isend(buf.cast(), n, l, to, tag, c)
            }
        }?;
        put_request(req, id)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Isend(
    buf: *const c_void,
    n: c_int,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
    req: *mut c_int,
) -> c_int {
    isend("MPI_Isend", buf, n as i64, dt, to, tag, comm, req, false)
}

#[no_mangle]
pub extern "C" fn MPI_Isend_c(
    buf: *const c_void,
    n: i64,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
    req: *mut c_int,
) -> c_int {
    isend("MPI_Isend_c", buf, n, dt, to, tag, comm, req, false)
}

#[no_mangle]
pub extern "C" fn MPI_Issend(
    buf: *const c_void,
    n: c_int,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
    req: *mut c_int,
) -> c_int {
    isend("MPI_Issend", buf, n as i64, dt, to, tag, comm, req, true)
}

#[no_mangle]
pub extern "C" fn MPI_Irsend(
    buf: *const c_void,
    n: c_int,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
    req: *mut c_int,
) -> c_int {
    MPI_Isend(buf, n, dt, to, tag, comm, req)
}

fn irecv(
    name: &str,
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    from: c_int,
    tag: c_int,
    comm: c_int,
    req: *mut c_int,
) -> c_int {
    call(name, comm, |lib, types| {
        let (n, from, tag, c) = (
            count(n, "count")?,
            source(from)?,
            recv_tag(tag)?,
            comm_id(comm)?,
        );
        let l = types.get(dt)?;
        // SAFETY: MPI's contract: the elements stay writable until the request completes.
        let id = unsafe { lib.mpi.irecv(buf.cast(), n, l, from, tag, c) }?;
        put_request(req, id)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Irecv(
    buf: *mut c_void,
    n: c_int,
    dt: c_int,
    from: c_int,
    tag: c_int,
    comm: c_int,
    req: *mut c_int,
) -> c_int {
    irecv("MPI_Irecv", buf, n as i64, dt, from, tag, comm, req)
}

#[no_mangle]
pub extern "C" fn MPI_Irecv_c(
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    from: c_int,
    tag: c_int,
    comm: c_int,
    req: *mut c_int,
) -> c_int {
    irecv("MPI_Irecv_c", buf, n, dt, from, tag, comm, req)
}

#[no_mangle]
pub extern "C" fn MPI_Wait(req: *mut c_int, status: *mut MPI_Status) -> c_int {
    call("MPI_Wait", MPI_COMM_WORLD, |lib, _| {
        // SAFETY: MPI's contract: `req` points at a request handle.
        let Some(id) = req_id(unsafe { req.read() })? else {
            // SAFETY: as in `finish`.
            unsafe { write_status(status, &Status::NULL, None) };
            return Ok(());
        };
        // SAFETY: as above, writable.
        unsafe { req.write(MPI_REQUEST_NULL) };
        finish(lib.mpi.wait(id), status)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Test(req: *mut c_int, flag: *mut c_int, status: *mut MPI_Status) -> c_int {
    call("MPI_Test", MPI_COMM_WORLD, |lib, _| {
        // SAFETY: MPI's contract: `req` points at a request handle, `flag` is writable.
        let Some(id) = req_id(unsafe { req.read() })? else {
            // SAFETY: as above.
            unsafe {
                flag.write(1);
                write_status(status, &Status::NULL, None);
            }
            return Ok(());
        };
        // A failure to make progress leaves the request as it was (still the caller's
        // to wait for); only a request found complete is spent.
        if !lib.mpi.peek(id)? {
            // SAFETY: as above.
            unsafe { flag.write(0) };
            return Ok(());
        }
        let r = lib.mpi.wait(id);
        // SAFETY: as above.
        unsafe {
            flag.write(1);
            req.write(MPI_REQUEST_NULL);
        }
        finish(r, status)
    })
}

/// The request ids of `n` handles at `reqs`.
fn ids(n: c_int, reqs: *const c_int) -> Result<Vec<Option<usize>>, MpiError> {
    let n = count(n, "count")?;
    // SAFETY: MPI's contract: `n` handles at `reqs`.
    unsafe { slice(reqs, n) }
        .iter()
        .map(|&h| req_id(h))
        .collect()
}

/// Writes the results of several requests: each status (with its `MPI_ERROR` when one
/// failed), the handles set to `MPI_REQUEST_NULL`; `MPI_ERR_IN_STATUS` if any failed.
fn finish_all(
    results: Vec<Result<Status, MpiError>>,
    which: &[usize],
    reqs: *mut c_int,
    statuses: *mut MPI_Status,
) -> Result<(), MpiError> {
    let mut failed = None;
    for (&i, r) in which.iter().zip(&results) {
        // SAFETY: MPI's contract: `i` indexes the caller's arrays.
        unsafe { reqs.add(i).write(MPI_REQUEST_NULL) };
        let (s, err) = match r {
            Ok(s) => (*s, MPI_SUCCESS),
            Err(e) => {
                failed.get_or_insert_with(|| e.clone());
                (e.status().unwrap_or(Status::NULL), class_code(e.class()))
            }
        };
        if !handles::ignored(statuses) {
            // SAFETY: as above.
            unsafe { write_status(statuses.add(i), &s, Some(err)) };
        }
    }
    match failed {
        None => Ok(()),
        // Reported as MPI_ERR_IN_STATUS (`in_status`); each status has its error.
        Some(e) => Err(MpiError::new(
            e.class(),
            format!("a request failed (its status says which): {}", e.message()),
        )),
    }
}

#[no_mangle]
pub extern "C" fn MPI_Waitall(n: c_int, reqs: *mut c_int, statuses: *mut MPI_Status) -> c_int {
    let rc = call("MPI_Waitall", MPI_COMM_WORLD, |lib, _| {
        let ids = ids(n, reqs)?;
        let results = lib.mpi.waitall(&ids);
        let which: Vec<usize> = (0..ids.len()).collect();
        finish_all(results, &which, reqs, statuses)
    });
    in_status(rc)
}

/// Several-request calls report a failure of one as `MPI_ERR_IN_STATUS`.
fn in_status(rc: c_int) -> c_int {
    if rc == MPI_SUCCESS {
        rc
    } else {
        MPI_ERR_IN_STATUS
    }
}

#[no_mangle]
pub extern "C" fn MPI_Testall(
    n: c_int,
    reqs: *mut c_int,
    flag: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    let rc = call("MPI_Testall", MPI_COMM_WORLD, |lib, _| {
        let ids = ids(n, reqs)?;
        match lib.mpi.testall(&ids)? {
            None => {
                // SAFETY: MPI's contract: `flag` is writable.
                unsafe { flag.write(0) };
                Ok(())
            }
            Some(results) => {
                // SAFETY: as above.
                unsafe { flag.write(1) };
                let which: Vec<usize> = (0..ids.len()).collect();
                finish_all(results, &which, reqs, statuses)
            }
        }
    });
    in_status(rc)
}

fn any(
    name: &str,
    n: c_int,
    reqs: *mut c_int,
    index: *mut c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
    block: bool,
) -> c_int {
    call(name, MPI_COMM_WORLD, |lib, _| {
        let ids = ids(n, reqs)?;
        let done = if block {
            lib.mpi.waitany(&ids)?
        } else if ids.iter().all(Option::is_none) {
            None
        } else {
            match lib.mpi.testany(&ids)? {
                Some(d) => Some(d),
                None => {
                    // SAFETY: MPI's contract: `flag` and `index` are writable.
                    unsafe {
                        flag.write(0);
                        index.write(MPI_UNDEFINED);
                    }
                    return Ok(());
                }
            }
        };
        if !flag.is_null() {
            // SAFETY: as above.
            unsafe { flag.write(1) };
        }
        match done {
            None => {
                // SAFETY: MPI's contract: `index` is writable.
                unsafe { index.write(MPI_UNDEFINED) };
                // SAFETY: as in `finish`.
                unsafe { write_status(status, &Status::NULL, None) };
                Ok(())
            }
            Some((i, r)) => {
                // SAFETY: MPI's contract: `index` writable, `i` indexes `reqs`.
                unsafe {
                    index.write(i as c_int);
                    reqs.add(i).write(MPI_REQUEST_NULL);
                }
                finish(r, status)
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Waitany(
    n: c_int,
    reqs: *mut c_int,
    index: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    any(
        "MPI_Waitany",
        n,
        reqs,
        index,
        std::ptr::null_mut(),
        status,
        true,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Testany(
    n: c_int,
    reqs: *mut c_int,
    index: *mut c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    any("MPI_Testany", n, reqs, index, flag, status, false)
}

fn some(
    name: &str,
    n: c_int,
    reqs: *mut c_int,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
    block: bool,
) -> c_int {
    let rc = call(name, MPI_COMM_WORLD, |lib, _| {
        let ids = ids(n, reqs)?;
        if ids.iter().all(Option::is_none) {
            // SAFETY: MPI's contract: `outcount` is writable.
            unsafe { outcount.write(MPI_UNDEFINED) };
            return Ok(());
        }
        loop {
            let mut which = Vec::new();
            let mut results = Vec::new();
            // A request whose progress fails is reported as completed with that error
            // (spent), like one whose wait fails: every request this pass took is
            // written out below, none is lost.
            for (i, id) in ids.iter().enumerate() {
                if let Some(id) = *id {
                    match lib.mpi.peek(id) {
                        Ok(false) => {}
                        Ok(true) => {
                            which.push(i);
                            results.push(lib.mpi.wait(id));
                        }
                        // A failure to make progress belongs to no request: none is
                        // spent by it (their buffers stay in use). What this pass took
                        // is reported; with nothing taken, the failure is.
                        Err(e) => {
                            if which.is_empty() {
                                return Err(e);
                            }
                            break;
                        }
                    }
                }
            }
            if which.is_empty() && block {
                continue;
            }
            // SAFETY: MPI's contract: `outcount` writable, `indices` has room for `n`.
            unsafe {
                outcount.write(which.len() as c_int);
                for (k, &i) in which.iter().enumerate() {
                    indices.add(k).write(i as c_int);
                }
            }
            // Statuses are written in completion order, not by request index.
            let compact: Vec<usize> = (0..which.len()).collect();
            for &i in &which {
                // SAFETY: as above.
                unsafe { reqs.add(i).write(MPI_REQUEST_NULL) };
            }
            let mut handles_copy = vec![MPI_REQUEST_NULL; which.len()];
            return finish_all(results, &compact, handles_copy.as_mut_ptr(), statuses);
        }
    });
    in_status(rc)
}

#[no_mangle]
pub extern "C" fn MPI_Waitsome(
    n: c_int,
    reqs: *mut c_int,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    some("MPI_Waitsome", n, reqs, outcount, indices, statuses, true)
}

#[no_mangle]
pub extern "C" fn MPI_Testsome(
    n: c_int,
    reqs: *mut c_int,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    some("MPI_Testsome", n, reqs, outcount, indices, statuses, false)
}

#[no_mangle]
pub extern "C" fn MPI_Request_get_status(
    req: c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    call("MPI_Request_get_status", MPI_COMM_WORLD, |lib, _| {
        let done = match req_id(req)? {
            None => Some(Status::NULL),
            Some(id) => lib.mpi.request_status(id)?,
        };
        // SAFETY: MPI's contract: `flag` is writable; the status as in `finish`.
        unsafe {
            flag.write(c_int::from(done.is_some()));
            if let Some(s) = done {
                write_status(status, &s, None);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Cancel(req: *mut c_int) -> c_int {
    call("MPI_Cancel", MPI_COMM_WORLD, |lib, _| {
        // SAFETY: MPI's contract: `req` points at a request handle.
        match req_id(unsafe { req.read() })? {
            Some(id) => lib.mpi.cancel(id),
            None => Err(MpiError::new(Class::Request, "MPI_REQUEST_NULL")),
        }
    })
}

#[no_mangle]
pub extern "C" fn MPI_Test_cancelled(status: *const MPI_Status, flag: *mut c_int) -> c_int {
    // SAFETY: MPI's contract: a status and a writable int.
    unsafe { flag.write((*status).count_hi_and_cancelled & 1) };
    MPI_SUCCESS
}

#[no_mangle]
pub extern "C" fn MPI_Request_free(req: *mut c_int) -> c_int {
    call("MPI_Request_free", MPI_COMM_WORLD, |lib, _| {
        // SAFETY: MPI's contract: `req` points at a request handle.
        let Some(id) = req_id(unsafe { req.read() })? else {
            return Err(MpiError::new(Class::Request, "MPI_REQUEST_NULL"));
        };
        // SAFETY: as above, writable.
        unsafe { req.write(MPI_REQUEST_NULL) };
        lib.mpi.request_free(id)
    })
}

fn sendrecv(
    name: &str,
    sbuf: *const c_void,
    sn: i64,
    sdt: c_int,
    to: c_int,
    stag: c_int,
    rbuf: *mut c_void,
    rn: i64,
    rdt: c_int,
    from: c_int,
    rtag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    call(name, comm, |lib, types| {
        let c = comm_id(comm)?;
        let (sn, to, stag) = (count(sn, "count")?, dest(to)?, send_tag(stag)?);
        let (rn, from, rtag) = (count(rn, "count")?, source(from)?, recv_tag(rtag)?);
        let (sl, rl) = (types.get(sdt)?, types.get(rdt)?);
        // SAFETY: MPI's contract: both buffers valid, apart.
        let r = unsafe {
            lib.mpi.sendrecv(
                sbuf.cast(),
                sn,
                sl,
                to,
                stag,
                rbuf.cast(),
                rn,
                rl,
                from,
                rtag,
                c,
            )
        };
        finish(r, status)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Sendrecv(
    sbuf: *const c_void,
    sn: c_int,
    sdt: c_int,
    to: c_int,
    stag: c_int,
    rbuf: *mut c_void,
    rn: c_int,
    rdt: c_int,
    from: c_int,
    rtag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    sendrecv(
        "MPI_Sendrecv",
        sbuf,
        sn as i64,
        sdt,
        to,
        stag,
        rbuf,
        rn as i64,
        rdt,
        from,
        rtag,
        comm,
        status,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Sendrecv_c(
    sbuf: *const c_void,
    sn: i64,
    sdt: c_int,
    to: c_int,
    stag: c_int,
    rbuf: *mut c_void,
    rn: i64,
    rdt: c_int,
    from: c_int,
    rtag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    sendrecv(
        "MPI_Sendrecv_c",
        sbuf,
        sn,
        sdt,
        to,
        stag,
        rbuf,
        rn,
        rdt,
        from,
        rtag,
        comm,
        status,
    )
}

fn sendrecv_replace(
    name: &str,
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    to: c_int,
    stag: c_int,
    from: c_int,
    rtag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    call(name, comm, |lib, types| {
        let c = comm_id(comm)?;
        let (n, to, stag, from, rtag) = (
            count(n, "count")?,
            dest(to)?,
            send_tag(stag)?,
            source(from)?,
            recv_tag(rtag)?,
        );
        let l = types.get(dt)?;
        // The outgoing data is copied (packed) first, so the receive may overwrite it.
        let mut out = Vec::new();
        // SAFETY: MPI's contract: `n` elements at `buf`.
        unsafe { l.pack(buf.cast(), n, &mut out) };
        let bytes = quiver_mpi::Layout::builtin(quiver_mpi::Elem::Bytes {
            size: 1,
            bitwise: false,
        });
        // SAFETY: `out` is ours; `buf` holds `n` writable elements.
        let r = unsafe {
            lib.mpi.sendrecv(
                out.as_ptr(),
                out.len(),
                &bytes,
                to,
                stag,
                buf.cast(),
                n,
                l,
                from,
                rtag,
                c,
            )
        };
        finish(r, status)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Sendrecv_replace(
    buf: *mut c_void,
    n: c_int,
    dt: c_int,
    to: c_int,
    stag: c_int,
    from: c_int,
    rtag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    sendrecv_replace(
        "MPI_Sendrecv_replace",
        buf,
        n as i64,
        dt,
        to,
        stag,
        from,
        rtag,
        comm,
        status,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Sendrecv_replace_c(
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    to: c_int,
    stag: c_int,
    from: c_int,
    rtag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    sendrecv_replace(
        "MPI_Sendrecv_replace_c",
        buf,
        n,
        dt,
        to,
        stag,
        from,
        rtag,
        comm,
        status,
    )
}

#[no_mangle]
pub extern "C" fn MPI_Iprobe(
    from: c_int,
    tag: c_int,
    comm: c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    call("MPI_Iprobe", comm, |lib, _| {
        let r = lib
            .mpi
            .iprobe(source(from)?, recv_tag(tag)?, comm_id(comm)?)?;
        // SAFETY: MPI's contract: `flag` is writable; the status as in `finish`.
        unsafe {
            flag.write(c_int::from(r.is_some()));
            if let Some(s) = r {
                write_status(status, &s, None);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Probe(
    from: c_int,
    tag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    call("MPI_Probe", comm, |lib, _| {
        let s = lib
            .mpi
            .probe(source(from)?, recv_tag(tag)?, comm_id(comm)?)?;
        // SAFETY: as in `finish`.
        unsafe { write_status(status, &s, None) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Ssend_c(
    buf: *const c_void,
    n: i64,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
) -> c_int {
    send("MPI_Ssend_c", buf, n, dt, to, tag, comm, true)
}

#[no_mangle]
pub extern "C" fn MPI_Rsend_c(
    buf: *const c_void,
    n: i64,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
) -> c_int {
    MPI_Send_c(buf, n, dt, to, tag, comm)
}

#[no_mangle]
pub extern "C" fn MPI_Issend_c(
    buf: *const c_void,
    n: i64,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
    req: *mut c_int,
) -> c_int {
    isend("MPI_Issend_c", buf, n, dt, to, tag, comm, req, true)
}

#[no_mangle]
pub extern "C" fn MPI_Irsend_c(
    buf: *const c_void,
    n: i64,
    dt: c_int,
    to: c_int,
    tag: c_int,
    comm: c_int,
    req: *mut c_int,
) -> c_int {
    MPI_Isend_c(buf, n, dt, to, tag, comm, req)
}

/// Writes a matched message's handle (`MPI_MESSAGE_NO_PROC` for `MPI_PROC_NULL`).
fn put_message(out: *mut c_int, id: Option<usize>) -> Result<(), MpiError> {
    let h = match id {
        Some(id) => handles::handle(REQUEST, id)?,
        None => MPI_MESSAGE_NO_PROC,
    };
    // SAFETY: MPI's contract: `out` is writable.
    unsafe { out.write(h) };
    Ok(())
}

#[no_mangle]
pub extern "C" fn MPI_Improbe(
    from: c_int,
    tag: c_int,
    comm: c_int,
    flag: *mut c_int,
    message: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    call("MPI_Improbe", comm, |lib, _| {
        let (from, tag, c) = (source(from)?, recv_tag(tag)?, comm_id(comm)?);
        let got = if from == quiver_mpi::Peer::Null {
            lib.mpi.comm(c)?;
            Some((Status::NULL, None))
        } else {
            lib.mpi.improbe(from, tag, c)?.map(|(s, id)| (s, Some(id)))
        };
        // SAFETY: MPI's contract: `flag` is writable; the status as in `finish`.
        unsafe { flag.write(c_int::from(got.is_some())) };
        if let Some((s, id)) = got {
            put_message(message, id)?;
            // SAFETY: as above.
            unsafe { write_status(status, &s, None) };
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn MPI_Mprobe(
    from: c_int,
    tag: c_int,
    comm: c_int,
    message: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    call("MPI_Mprobe", comm, |lib, _| {
        let (from, tag, c) = (source(from)?, recv_tag(tag)?, comm_id(comm)?);
        let (s, id) = if from == quiver_mpi::Peer::Null {
            lib.mpi.comm(c)?;
            (Status::NULL, None)
        } else {
            let (s, id) = lib.mpi.mprobe(from, tag, c)?;
            (s, Some(id))
        };
        put_message(message, id)?;
        // SAFETY: as in `finish`.
        unsafe { write_status(status, &s, None) };
        Ok(())
    })
}

/// The request of a matched message (`None`: `MPI_MESSAGE_NO_PROC`).
fn message_id(message: *mut c_int) -> Result<Option<usize>, MpiError> {
    // SAFETY: MPI's contract: `message` points at a message handle.
    let h = unsafe { message.read() };
    match h {
        MPI_MESSAGE_NO_PROC => Ok(None),
        MPI_MESSAGE_NULL => Err(MpiError::new(
            quiver_mpi::Class::Request,
            "MPI_MESSAGE_NULL",
        )),
        h => handles::index_of(h, REQUEST).map(Some).ok_or_else(|| {
            MpiError::new(
                quiver_mpi::Class::Request,
                format!("{h:#x} is not a message"),
            )
        }),
    }
}

/// The message handle once its message is being received.
fn spend_message(message: *mut c_int) {
    // SAFETY: MPI's contract: `message` points at a writable message handle.
    unsafe { message.write(MPI_MESSAGE_NULL) };
}

fn mrecv(
    name: &str,
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    message: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    call(name, MPI_COMM_WORLD, |lib, types| {
        let n = count(n, "count")?;
        let l = types.get(dt)?;
        let Some(msg) = message_id(message)? else {
            spend_message(message);
            // SAFETY: as in `finish`.
            unsafe { write_status(status, &Status::NULL, None) };
            return Ok(());
        };
        // SAFETY: MPI's contract: room for `n` elements at `buf`; waited for here.
        let req = unsafe { lib.mpi.imrecv(msg, buf.cast(), n, l) }?;
        // Checked and taken: the handle is spent only now (a refused receive leaves the
        // message to the caller).
        spend_message(message);
        finish(lib.mpi.wait(req), status)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Mrecv(
    buf: *mut c_void,
    n: c_int,
    dt: c_int,
    message: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    mrecv("MPI_Mrecv", buf, i64::from(n), dt, message, status)
}

#[no_mangle]
pub extern "C" fn MPI_Mrecv_c(
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    message: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    mrecv("MPI_Mrecv_c", buf, n, dt, message, status)
}

fn imrecv(
    name: &str,
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    message: *mut c_int,
    req: *mut c_int,
) -> c_int {
    call(name, MPI_COMM_WORLD, |lib, types| {
        let n = count(n, "count")?;
        let l = types.get(dt)?;
        let id = match message_id(message)? {
            // SAFETY: MPI's contract: room for `n` elements at `buf` until completion.
            Some(msg) => unsafe { lib.mpi.imrecv(msg, buf.cast(), n, l) }?,
            // A request of MPI_PROC_NULL: complete at once.
            // SAFETY: nothing is received.
            None => unsafe {
                lib.mpi.irecv(
                    buf.cast(),
                    0,
                    l,
                    quiver_mpi::Peer::Null,
                    quiver_mpi::TagSel::Any,
                    quiver_mpi::WORLD,
                )
            }?,
        };
        spend_message(message);
        put_request(req, id)
    })
}

#[no_mangle]
pub extern "C" fn MPI_Imrecv(
    buf: *mut c_void,
    n: c_int,
    dt: c_int,
    message: *mut c_int,
    req: *mut c_int,
) -> c_int {
    imrecv("MPI_Imrecv", buf, i64::from(n), dt, message, req)
}

#[no_mangle]
pub extern "C" fn MPI_Imrecv_c(
    buf: *mut c_void,
    n: i64,
    dt: c_int,
    message: *mut c_int,
    req: *mut c_int,
) -> c_int {
    imrecv("MPI_Imrecv_c", buf, n, dt, message, req)
}
