//! Jobs at the C boundary: `quiver_job`, a process's membership in its job (rank, size,
//! nodes, barriers, failed ranks), created from the launcher's environment.
//!
//! A `quiver_job` owns a `quiver::Job`, which is `Send` and `Sync`: its calls may be made
//! from any thread, concurrently, except `quiver_job_free`. Endpoints opened from a job
//! do not borrow it (freeing the job first is allowed).

use crate::endpoint::quiver_endpoint;
use crate::error::{ffi, handle, put_ranks, quiver_error, Failure, Out};
use quiver_rs::{Invitation, Job, JointJob, Progress};
use std::ffi::{c_char, CStr, CString};

/// A process's membership in a job (opaque). Created by `quiver_job_from_env`, freed by
/// `quiver_job_free`.
#[allow(non_camel_case_types)]
pub struct quiver_job {
    pub(crate) job: Job,
    /// `Job::launcher`'s name, for `quiver_job_launcher`.
    launcher: CString,
    /// The two jobs, when this is a joint job (`quiver_job_join`).
    joint: Option<JointJob>,
}

impl quiver_job {
    fn new(job: Job, joint: Option<JointJob>) -> quiver_job {
        let launcher = CString::new(job.launcher().to_string()).unwrap_or_default();
        quiver_job {
            job,
            launcher,
            joint,
        }
    }
}

/// Bytes an invitation's text takes at most, with its NUL (`quiver_job_invite`).
pub const QUIVER_INVITATION_MAX: usize = 512;

/// Joins the job that the environment describes (`quiver run`, Open MPI's `mpirun`,
/// MPICH's Hydra, Slurm), with configuration from the `QUIVER_*` variables, and stores
/// its handle at `*job`. Outside a job: `QUIVER_ERR_ENV`, and the last error message
/// says how to start one.
///
/// Thread safety: any thread.
///
/// # Safety
///
/// `job` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_from_env(job: *mut *mut quiver_job) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or writable (the contract).
        let out = unsafe { Out::new(job, "job") }?;
        let j = Job::from_env()?;
        out.put(Box::into_raw(Box::new(quiver_job::new(j, None))));
        Ok(())
    })
}

/// Frees the job handle at `*job` and sets `*job` to NULL (a second call then gives
/// `QUIVER_ERR_NULL`). Endpoints opened from it stay open.
///
/// Thread safety: no other call may use the job meanwhile or after.
///
/// # Safety
///
/// `job` is NULL or points to NULL or to a handle from `quiver_job_from_env` not yet
/// freed.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_free(job: *mut *mut quiver_job) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a valid place holding a handle or NULL (the contract).
        let place = unsafe { job.as_mut() }.ok_or_else(|| Failure::null("job"))?;
        if place.is_null() {
            return Err(Failure::null("*job"));
        }
        let h = std::mem::replace(place, std::ptr::null_mut());
        // SAFETY: `h` came from Box::into_raw in quiver_job_from_env and is freed once:
        // the caller's variable no longer holds it.
        drop(unsafe { Box::from_raw(h) });
        Ok(())
    })
}

/// Runs a getter of the job: `value` of the handle at `job`, written at `out`.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `out` is NULL or writable.
unsafe fn get<T>(
    job: *const quiver_job,
    out: *mut T,
    what: &str,
    value: impl FnOnce(&quiver_job) -> T,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle (the contract).
        let j = unsafe { handle(job, "job") }?;
        // SAFETY: `out` is NULL or writable (the contract).
        let out = unsafe { Out::new(out, what) }?;
        out.put(value(j));
        Ok(())
    })
}

/// Invites another job into a joint job with this one, whose ports (and endpoints) reach
/// both jobs' ranks: every rank calls it, and gets the same invitation, written at
/// `text` as a NUL-terminated string of at most `QUIVER_INVITATION_MAX` bytes (`len`
/// must be at least that). Hand it to the other job out of band (a file, a variable):
/// it carries the key of the joint job's store, so whoever holds it can join. Rank 0
/// serves that store from now on.
///
/// Thread safety: any thread; every call counts as one invitation of this process (the
/// ranks must call it in the same order).
///
/// # Safety
///
/// `job` is NULL or a live job handle; `text` is NULL or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_invite(
    job: *const quiver_job,
    text: *mut c_char,
    len: usize,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle (the contract).
        let j = unsafe { handle(job, "job") }?;
        if text.is_null() {
            return Err(Failure::null("text"));
        }
        if len < QUIVER_INVITATION_MAX {
            return Err(Failure::invalid(format!(
                "len is {len}; an invitation needs QUIVER_INVITATION_MAX ({QUIVER_INVITATION_MAX}) bytes"
            )));
        }
        let inv = j.job.invite()?.to_string();
        if inv.len() >= QUIVER_INVITATION_MAX {
            return Err(Failure::invalid(format!(
                "the invitation takes {} bytes, beyond QUIVER_INVITATION_MAX",
                inv.len() + 1
            )));
        }
        // SAFETY: `text` is writable for `len` bytes (the contract), and the invitation
        // and its NUL take at most QUIVER_INVITATION_MAX <= len bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(inv.as_ptr(), text.cast::<u8>(), inv.len());
            *text.add(inv.len()) = 0;
        }
        Ok(())
    })
}

/// Joins the joint job of the invitation `text` (from `quiver_job_invite`), as its host
/// (the job that issued it) or its guest (any other job): every rank of both jobs calls
/// it; it returns when all have (within `QUIVER_CONNECT_TIMEOUT`), with the joint job's
/// handle at `*joint` (free it with `quiver_job_free`). The host's ranks keep their
/// numbers there and the guest's follow (`quiver_job_joint_rank_of`). Open ports or
/// endpoints on it to reach the other job. `QUIVER_ERR_CONFIG` when the text is no
/// invitation, the jobs' settings differ, or another job took the invitation first;
/// `QUIVER_ERR_INVALID_ARGUMENT` when it is not UTF-8; `QUIVER_ERR_RENDEZVOUS` when the
/// joint job's store cannot be reached or no job came in time (the host keeps its
/// invitation and may call this again).
///
/// Thread safety: any thread.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `text` is NULL or a NUL-terminated string;
/// `joint` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_join(
    job: *const quiver_job,
    text: *const c_char,
    joint: *mut *mut quiver_job,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle (the contract).
        let j = unsafe { handle(job, "job") }?;
        if text.is_null() {
            return Err(Failure::null("text"));
        }
        // SAFETY: `text` is a NUL-terminated string (the contract).
        let text = unsafe { CStr::from_ptr(text) };
        let text = text
            .to_str()
            .map_err(|_| Failure::invalid("the invitation is not UTF-8"))?;
        // SAFETY: `joint` is NULL or writable (the contract).
        let out = unsafe { Out::new(joint, "joint") }?;
        let inv: Invitation = text.parse()?;
        let jj = j.job.join(&inv)?;
        out.put(Box::into_raw(Box::new(quiver_job::new(
            jj.job().clone(),
            Some(jj),
        ))));
        Ok(())
    })
}

/// The joint rank, at `*joint_rank`, of rank `rank` of job `job_id` (either job of the
/// joint job `joint`). `QUIVER_ERR_CONFIG` when `joint` is no joint job or `job_id`
/// neither of its jobs; `QUIVER_ERR_NO_SUCH_RANK` when that job has no such rank.
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `joint` is NULL or a live job handle; `joint_rank` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_joint_rank_of(
    joint: *const quiver_job,
    job_id: u32,
    rank: u32,
    joint_rank: *mut u32,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `joint` is NULL or a live handle (the contract).
        let j = unsafe { handle(joint, "joint") }?;
        // SAFETY: `joint_rank` is NULL or writable (the contract).
        let out = unsafe { Out::new(joint_rank, "joint_rank") }?;
        out.put(joint_of(j)?.rank_of(job_id, rank)?);
        Ok(())
    })
}

/// Who joint rank `joint_rank` of the joint job `joint` is: its job's id at `*job_id` and
/// its rank there at `*rank`. `QUIVER_ERR_CONFIG` when `joint` is no joint job,
/// `QUIVER_ERR_NO_SUCH_RANK` beyond its ranks.
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `joint` is NULL or a live job handle; `job_id` and `rank` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_joint_member(
    joint: *const quiver_job,
    joint_rank: u32,
    job_id: *mut u32,
    rank: *mut u32,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `joint` is NULL or a live handle (the contract).
        let j = unsafe { handle(joint, "joint") }?;
        // SAFETY: `job_id` and `rank` are NULL or writable (the contract).
        let (out_job, out_rank) = unsafe { (Out::new(job_id, "job_id")?, Out::new(rank, "rank")?) };
        let (job, r) = joint_of(j)?
            .member(joint_rank)
            .ok_or(quiver_rs::Error::NoSuchRank {
                rank: joint_rank,
                size: j.job.size(),
            })?;
        out_job.put(job);
        out_rank.put(r);
        Ok(())
    })
}

/// The two jobs of a joint job's handle.
fn joint_of(j: &quiver_job) -> Result<&JointJob, Failure> {
    j.joint.as_ref().ok_or_else(|| {
        quiver_rs::Error::Config(format!(
            "job {} is not a joint job (quiver_job_join makes one)",
            j.job.job_id()
        ))
        .into()
    })
}

/// This process's rank, at `*rank`.
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `rank` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_rank(job: *const quiver_job, rank: *mut u32) -> quiver_error {
    // SAFETY: the caller's contract is `get`'s.
    unsafe { get(job, rank, "rank", |j| j.job.rank()) }
}

/// The number of ranks of the job, at `*size`.
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `size` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_size(job: *const quiver_job, size: *mut u32) -> quiver_error {
    // SAFETY: the caller's contract is `get`'s.
    unsafe { get(job, size, "size", |j| j.job.size()) }
}

/// The job's id, at `*id`.
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `id` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_id(job: *const quiver_job, id: *mut u32) -> quiver_error {
    // SAFETY: the caller's contract is `get`'s.
    unsafe { get(job, id, "id", |j| j.job.job_id()) }
}

/// The node id of this rank, at `*nid`.
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `nid` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_nid(job: *const quiver_job, nid: *mut u32) -> quiver_error {
    // SAFETY: the caller's contract is `get`'s.
    unsafe { get(job, nid, "nid", |j| j.job.nid()) }
}

/// The number of nodes the job spans, at `*count`.
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `count` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_node_count(
    job: *const quiver_job,
    count: *mut u32,
) -> quiver_error {
    // SAFETY: the caller's contract is `get`'s.
    unsafe {
        get(job, count, "count", |j| {
            u32::try_from(j.job.node_count()).unwrap_or(u32::MAX)
        })
    }
}

/// The name of the launcher that started the job (`"quiver run"`, `"Open MPI
/// (mpirun)"`, ...), at `*name`: a NUL-terminated string that lives as long as the
/// job handle.
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `name` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_launcher(
    job: *const quiver_job,
    name: *mut *const c_char,
) -> quiver_error {
    // SAFETY: the caller's contract is `get`'s.
    unsafe { get(job, name, "name", |j| j.launcher.as_ptr()) }
}

/// The node id of `rank`, at `*nid`; `QUIVER_ERR_NO_SUCH_RANK` outside 0..size.
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `nid` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_nid_of(
    job: *const quiver_job,
    rank: u32,
    nid: *mut u32,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle (the contract).
        let j = unsafe { handle(job, "job") }?;
        // SAFETY: `nid` is NULL or writable (the contract).
        let out = unsafe { Out::new(nid, "nid") }?;
        out.put(j.job.nid_of(rank)?);
        Ok(())
    })
}

/// Waits until every rank of the job has called `quiver_job_barrier` as many times
/// (through the rendezvous store: for set-up and tests, not for speed). Once endpoints
/// carry network traffic use `quiver_job_barrier_progressing`.
///
/// Thread safety: any thread; every call counts as one barrier of this process.
///
/// # Safety
///
/// `job` is NULL or a live job handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_barrier(job: *const quiver_job) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle (the contract).
        let j = unsafe { handle(job, "job") }?;
        j.job.barrier()?;
        Ok(())
    })
}

/// The endpoints of a C array as `Progress` objects.
///
/// # Safety
///
/// `eps` is readable for `n` pointers when `n` > 0, each NULL or a live endpoint handle
/// that no other thread uses during `'a`.
unsafe fn progressing<'a>(
    eps: *const *const quiver_endpoint,
    n: usize,
) -> Result<Vec<&'a dyn Progress>, Failure> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if eps.is_null() {
        return Err(Failure::null("endpoints"));
    }
    if n > isize::MAX as usize / std::mem::size_of::<*const quiver_endpoint>() {
        return Err(Failure::invalid(format!(
            "{n} endpoints are more than memory holds"
        )));
    }
    // SAFETY: `eps` is non-NULL and readable for `n` pointers (the contract), `n` within
    // an allocation's size (checked).
    let ptrs = unsafe { std::slice::from_raw_parts(eps, n) };
    let mut out: Vec<&'a dyn Progress> = Vec::with_capacity(n);
    for (i, p) in ptrs.iter().enumerate() {
        // SAFETY: each is NULL or a live endpoint handle (the contract).
        let e = unsafe { handle(*p, &format!("endpoints[{i}]")) }?;
        out.push(&e.ep);
    }
    Ok(out)
}

/// Like `quiver_job_barrier`, while keeping the `n` endpoints at `eps` making progress
/// (their network channels go on acknowledging and retransmitting during the wait).
///
/// Thread safety: any thread; the endpoints must not be used by other threads meanwhile.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `eps` is readable for `n` pointers (when `n` >
/// 0), each NULL or a live endpoint handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_barrier_progressing(
    job: *const quiver_job,
    eps: *const *const quiver_endpoint,
    n: usize,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle (the contract).
        let j = unsafe { handle(job, "job") }?;
        // SAFETY: the array's contract is the caller's.
        let eps = unsafe { progressing(eps, n) }?;
        j.job.barrier_progressing(&eps)?;
        Ok(())
    })
}

/// A barrier among the ranks that have not failed (see the Rust `Job::barrier_live`):
/// waits for every rank that lives, declares failed the ranks the `n` endpoints at
/// `eps` found failed, and writes the job's failed ranks (ascending) as
/// `quiver_job_failed_ranks` does.
///
/// Thread safety: any thread; the endpoints must not be used by other threads meanwhile.
///
/// # Safety
///
/// As `quiver_job_barrier_progressing`; `ranks` is writable for `cap` values (when `cap`
/// > 0), `count` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_barrier_live(
    job: *const quiver_job,
    eps: *const *const quiver_endpoint,
    n: usize,
    ranks: *mut u32,
    cap: usize,
    count: *mut usize,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle (the contract).
        let j = unsafe { handle(job, "job") }?;
        // SAFETY: `count` is NULL or writable (the contract).
        let count = unsafe { Out::new(count, "count") }?;
        if cap > 0 && ranks.is_null() {
            return Err(Failure::null("ranks"));
        }
        // SAFETY: the array's contract is the caller's.
        let eps = unsafe { progressing(eps, n) }?;
        let failed = j.job.barrier_live(&eps)?;
        // SAFETY: `ranks` is writable for `cap` values (the contract).
        unsafe { put_ranks(&failed, ranks, cap, &count) }
    })
}

/// Records in the job's store that `rank` failed, so that every rank's failed list
/// shows it and no live barrier waits for it. `QUIVER_ERR_NO_SUCH_RANK` outside
/// 0..size.
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `job` is NULL or a live job handle.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_declare_failed(
    job: *const quiver_job,
    rank: u32,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle (the contract).
        let j = unsafe { handle(job, "job") }?;
        j.job.declare_failed(rank)?;
        Ok(())
    })
}

/// The ranks declared failed, ascending: the first `cap` of them at `ranks`, their
/// number at `*count` (which may exceed `cap`: call again with a larger array).
///
/// Thread safety: any thread, concurrently with the job's other calls.
///
/// # Safety
///
/// `job` is NULL or a live job handle; `ranks` is writable for `cap` values (when `cap`
/// > 0); `count` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn quiver_job_failed_ranks(
    job: *const quiver_job,
    ranks: *mut u32,
    cap: usize,
    count: *mut usize,
) -> quiver_error {
    ffi(|| {
        // SAFETY: `job` is NULL or a live handle (the contract).
        let j = unsafe { handle(job, "job") }?;
        // SAFETY: `count` is NULL or writable (the contract).
        let count = unsafe { Out::new(count, "count") }?;
        if cap > 0 && ranks.is_null() {
            return Err(Failure::null("ranks"));
        }
        let failed = j.job.failed_ranks()?;
        // SAFETY: `ranks` is writable for `cap` values (the contract).
        unsafe { put_ranks(&failed, ranks, cap, &count) }
    })
}
