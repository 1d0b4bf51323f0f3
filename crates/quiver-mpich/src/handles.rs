//! MPICH's handles and special values in the core's terms, and back.
//!
//! Builtin objects have MPICH's own handles (from `mpi.h`); objects the application
//! creates get handles of MPICH's shape (the kind's bits, an index below), so that a
//! program that looks at their bits (some do) sees what it would see with MPICH.

use crate::abi::*;
use crate::MPI_Status;
use quiver_mpi::{Class, MpiError, Peer, Status, TagSel};
use std::ffi::{c_int, c_void};

/// The high bits of the handles of communicators, requests, groups, operations, datatypes
/// and windows that the library creates (MPICH's "indirect" kind and each object's type
/// bits); the low 26 bits are an index.
pub const COMM: c_int = 0x8400_0000_u32 as c_int;
pub const REQUEST: c_int = 0xac00_0000_u32 as c_int;
pub const GROUP: c_int = 0x8800_0000_u32 as c_int;
pub const USER_OP: c_int = 0x9800_0000_u32 as c_int;
pub const DATATYPE: c_int = 0xcc00_0000_u32 as c_int;
pub const WIN: c_int = 0xa000_0000_u32 as c_int;
const INDEX: c_int = 0x03ff_ffff;
const KIND: c_int = !INDEX;

/// The index of a handle of `kind`, if it is one.
pub fn index_of(h: c_int, kind: c_int) -> Option<usize> {
    (h & KIND == kind).then_some((h & INDEX) as usize)
}

/// The handle of `index` of `kind`.
pub fn handle(kind: c_int, index: usize) -> Result<c_int, MpiError> {
    if index > INDEX as usize {
        return Err(MpiError::new(Class::Intern, "out of handles"));
    }
    Ok(kind | index as c_int)
}

/// The core's id of communicator handle `h`.
pub fn comm_id(h: c_int) -> Result<usize, MpiError> {
    match h {
        MPI_COMM_WORLD => Ok(quiver_mpi::WORLD),
        MPI_COMM_SELF => Ok(quiver_mpi::SELF),
        MPI_COMM_NULL => Err(MpiError::new(Class::Comm, "MPI_COMM_NULL")),
        _ => index_of(h, COMM)
            .ok_or_else(|| MpiError::new(Class::Comm, format!("{h:#x} is not a communicator"))),
    }
}

/// The handle of communicator id `c`.
pub fn comm_handle(c: usize) -> Result<c_int, MpiError> {
    match c {
        quiver_mpi::WORLD => Ok(MPI_COMM_WORLD),
        quiver_mpi::SELF => Ok(MPI_COMM_SELF),
        _ => handle(COMM, c),
    }
}

/// The request id of handle `h` (`None`: `MPI_REQUEST_NULL`).
pub fn req_id(h: c_int) -> Result<Option<usize>, MpiError> {
    if h == MPI_REQUEST_NULL {
        return Ok(None);
    }
    index_of(h, REQUEST)
        .map(Some)
        .ok_or_else(|| MpiError::new(Class::Request, format!("{h:#x} is not a request")))
}

/// A destination rank.
pub fn dest(r: c_int) -> Result<Peer, MpiError> {
    match r {
        MPI_PROC_NULL => Ok(Peer::Null),
        r if r >= 0 => Ok(Peer::Rank(r as u32)),
        r => Err(MpiError::new(
            Class::Rank,
            format!("rank {r} is not a destination"),
        )),
    }
}

/// A source rank (`MPI_ANY_SOURCE` allowed).
pub fn source(r: c_int) -> Result<Peer, MpiError> {
    match r {
        MPI_ANY_SOURCE => Ok(Peer::Any),
        r => dest(r),
    }
}

/// The largest tag (`MPI_TAG_UB`'s value).
pub const TAG_UB: c_int = c_int::MAX;

/// A send's tag.
pub fn send_tag(t: c_int) -> Result<u32, MpiError> {
    u32::try_from(t).map_err(|_| MpiError::new(Class::Tag, format!("tag {t} is negative")))
}

/// A receive's tag (`MPI_ANY_TAG` allowed).
pub fn recv_tag(t: c_int) -> Result<TagSel, MpiError> {
    if t == MPI_ANY_TAG {
        return Ok(TagSel::Any);
    }
    send_tag(t).map(TagSel::Is)
}

/// Whether a status pointer is one of the "ignore" values.
pub fn ignored(s: *const MPI_Status) -> bool {
    s.is_null() || s as isize == MPI_STATUS_IGNORE || s as isize == MPI_STATUSES_IGNORE
}

/// The status in MPICH's layout (`error`: the `MPI_ERROR` field, set only by the calls
/// that complete several requests).
pub fn to_status(s: &Status, error: Option<c_int>) -> MPI_Status {
    let bytes = s.bytes as i64;
    MPI_Status {
        count_lo: bytes as c_int,
        count_hi_and_cancelled: (((bytes >> 32) as c_int) << 1) | c_int::from(s.cancelled),
        MPI_SOURCE: match s.source {
            Peer::Rank(r) => r as c_int,
            Peer::Any => MPI_ANY_SOURCE,
            Peer::Null => MPI_PROC_NULL,
        },
        MPI_TAG: match s.tag {
            TagSel::Is(t) => t as c_int,
            TagSel::Any => MPI_ANY_TAG,
        },
        MPI_ERROR: error.unwrap_or(MPI_SUCCESS),
    }
}

/// Writes `s` to `out` unless it is an "ignore" value.
///
/// # Safety
///
/// `out` is an ignore value or points at a writable `MPI_Status`.
pub unsafe fn write_status(out: *mut MPI_Status, s: &Status, error: Option<c_int>) {
    if !ignored(out) {
        // SAFETY: the caller's promise.
        unsafe { out.write(to_status(s, error)) };
    }
}

/// Bytes a status says were received.
pub fn status_bytes(s: &MPI_Status) -> i64 {
    i64::from(s.count_lo as u32) | (i64::from(s.count_hi_and_cancelled >> 1) << 32)
}

/// An exported pointer variable of `mpi.h` (`MPI_UNWEIGHTED`, `MPI_F_STATUS_IGNORE`...).
#[repr(transparent)]
pub struct DataPtr(pub *mut c_void);

// SAFETY: the pointer is a constant address (of a sentinel in `SENTINELS`), never
// written, and nothing is read or written through it: sharing it between threads shares
// an integer.
unsafe impl Sync for DataPtr {}

/// What the exported pointer variables point at: one distinct address each.
pub static SENTINELS: [u64; 16] = [0; 16];
