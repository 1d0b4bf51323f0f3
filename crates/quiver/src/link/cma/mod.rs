//! Cross-memory attach (CMA): single-copy transfers between processes of one node.
//!
//! This is the "cross-space zero buffer" of Push-Pull Messaging (section 4.2 of the
//! paper): a buffer is described by (address, length) [`Piece`]s, and the kernel copies
//! between the address spaces of two processes in one pass, with no intermediate shared
//! buffer. Where the paper walks page tables to get physical pieces, Linux's
//! `process_vm_readv(2)`/`process_vm_writev(2)` take *virtual* addresses and do the page
//! walk themselves, so a contiguous virtual buffer is one piece; a list of pieces is a
//! scatter/gather list (several user buffers, or a message spread over pool slots).
//!
//! What this module owns:
//!
//! - [`read_from`] and [`write_to`]: one transfer between a local contiguous buffer and
//!   a list of pieces in another process, split into system calls of at most
//!   [`IOV_MAX`] remote iovecs and [`MAX_BYTES_PER_CALL`] bytes, repeated after partial
//!   transfers until every byte has moved.
//! - [`CmaError`]: why a transfer failed, typed (not permitted, no such process, bad
//!   address, unsupported, malformed piece list, ...), and [`CmaError::unavailable`],
//!   which tells "CMA cannot work with this peer" from "this one transfer failed".
//! - The probe word ([`probe_target`], [`probe`]): a random nonce in a static of every
//!   process, whose address and value a process publishes so that a peer can check, with
//!   one 8-byte read, that CMA works *and* that the pid it holds names that very peer.
//! - [`CmaState`]: remembers per peer (or per process) that CMA is unavailable after
//!   the first refusal, logs that once (`tracing::warn!`), and refuses later transfers
//!   cheaply, so that the caller falls back to its two-copy path.
//! - [`yama`]: who may attach to this process: the ptracer exception Yama's
//!   `ptrace_scope = 1` asks for (the one peer process named, else any process of the
//!   user), or attach turned off where Yama forbids it (2 without `CAP_SYS_PTRACE`, 3);
//!   and [`allow_peers`], the explicit `PR_SET_PTRACER_ANY`.
//!
//! What it guarantees:
//!
//! - `Ok(n)` means all bytes moved: `n` equals the local buffer's length and the sum of
//!   the remote pieces' lengths. On an error, a prefix of the transfer may have moved
//!   ([`CmaError::BadAddress`] says how long); nothing else is promised about the
//!   destination.
//! - No input panics: a piece list that came over the network may be garbage. Lengths
//!   must add up to the local length ([`CmaError::LengthMismatch`] otherwise), every
//!   piece must fit the address space ([`CmaError::BadPiece`]), the pid must be a
//!   possible pid; an unmapped remote address is the kernel's `EFAULT`, reported as
//!   [`CmaError::BadAddress`].
//! - No system call gets more than [`IOV_MAX`] iovecs or more than
//!   [`MAX_BYTES_PER_CALL`] bytes (the kernel would fail the first and silently shorten
//!   the second).
//!
//! What it does not do: it does not know whether the peer has lent the remote buffer,
//! nor keep the peer alive. The protocol above must only transfer while the peer waits
//! for the transfer's completion (so the pieces stay valid and the pid cannot have been
//! reused by an unrelated process), and must stop using CMA towards a peer it knows has
//! exited.
//!
//! # Permissions
//!
//! The kernel checks `ptrace` access mode `PTRACE_MODE_ATTACH_REALCREDS` on the target
//! for every call. It fails with `EPERM` ([`CmaError::NotPermitted`]) when:
//!
//! - the target runs as another user, or changed credentials (set-uid) or made itself
//!   non-dumpable, and the caller lacks `CAP_SYS_PTRACE`;
//! - Yama's `kernel.yama.ptrace_scope` is 1 and the target is not a descendant of the
//!   caller (as with ranks started side by side by a launcher) and has not named a
//!   ptracer (quiver names one when it opens a tagged endpoint, see [`yama`]; or
//!   [`allow_peers`]); 2 (admin only) needs `CAP_SYS_PTRACE`; 3 forbids it for everyone;
//! - a container runtime's seccomp profile blocks the system calls (older Docker
//!   defaults), or the container lacks `CAP_SYS_PTRACE` where that is required:
//!   `--cap-add=SYS_PTRACE` or a profile that allows `process_vm_readv`/`writev`.
//!
//! A kernel built without `CONFIG_CROSS_MEMORY_ATTACH`, or a sandbox (gVisor, seccomp)
//! answering `ENOSYS`, gives [`CmaError::Unsupported`]. The pid is interpreted in the
//! caller's pid namespace; a pid that a peer reported about itself from another
//! namespace names another process or none, which [`probe`] detects.
//!
//! # Use
//!
//! ```ignore
//! // Each process, at start-up: let its peers read it, publish its probe word.
//! cma::yama::apply(cma::yama::decide(scope, cap, || peers));
//! publish(std::process::id(), cma::probe_target());
//! // Towards each same-node peer, once: detect (and log) whether CMA works.
//! let state = cma::CmaState::new();
//! state.probe(peer_pid, peer_target);
//! // Per large message:
//! if state.is_usable() && state.read_from(peer_pid, &pieces, &mut buf).is_ok() {
//!     // one copy done
//! } else {
//!     // two-copy path
//! }
//! ```

pub mod yama;

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Remote iovecs per system call at most: the kernel's `UIO_MAXIOV` (`IOV_MAX`); more
/// make the call fail with `EINVAL`.
pub const IOV_MAX: usize = 1024;

/// Bytes per system call at most. The kernel moves at most `MAX_RW_COUNT`
/// (`INT_MAX` rounded down to a page, about 2 GiB) per call and silently shortens
/// larger requests; 1 GiB is below that for every page size and still makes the cost
/// of the extra calls negligible.
pub const MAX_BYTES_PER_CALL: usize = 1 << 30;

/// An (address, length) piece of a buffer in some process's address space.
///
/// The address is a plain number: it is only dereferenced by the kernel, in the
/// address space of the process named with it, so a piece may be garbage without any
/// risk to this process (the transfer then fails with a typed error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Piece {
    /// Virtual address of the first byte, in the owning process.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
}

impl Piece {
    #[cfg(test)]
    /// The piece covering `buf` (in this process's address space).
    pub fn of(buf: &[u8]) -> Piece {
        Piece {
            addr: buf.as_ptr() as usize as u64,
            len: buf.len(),
        }
    }
}

#[cfg(test)]
/// The pieces describing the local buffer `buf`, to publish to a peer: one piece, as
/// the buffer is contiguous in virtual memory; none when it is empty. A scatter list
/// of several buffers is the concatenation of their pieces.
pub fn pieces_of(buf: &[u8]) -> Vec<Piece> {
    if buf.is_empty() {
        Vec::new()
    } else {
        vec![Piece::of(buf)]
    }
}

/// The total length of `pieces`, after checking each one: a piece must fit the address
/// space (its end must not pass the top of a pointer), and the total must fit in an
/// `isize` (the most a buffer, or one transfer, can hold).
///
/// Errors: [`CmaError::BadPiece`] naming the first piece that breaks a rule.
pub fn total_len(pieces: &[Piece]) -> Result<usize, CmaError> {
    let mut total: usize = 0;
    for (index, p) in pieces.iter().enumerate() {
        let fits = usize::try_from(p.addr)
            .ok()
            .and_then(|a| a.checked_add(p.len))
            .is_some();
        let sum = total
            .checked_add(p.len)
            .filter(|&s| s <= isize::MAX as usize);
        match (fits, sum) {
            (true, Some(s)) => total = s,
            _ => {
                return Err(CmaError::BadPiece {
                    index,
                    addr: p.addr,
                    len: p.len,
                })
            }
        }
    }
    Ok(total)
}

/// Why CMA cannot be used with a peer (as opposed to one transfer failing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// The kernel refused access (`EPERM`): ptrace rules, Yama, container, seccomp.
    NotPermitted,
    /// The system calls do not exist here (`ENOSYS`).
    Unsupported,
    /// The pid does not name the peer that published the probe word (it exited, lives in
    /// another pid namespace, or the pid was reused).
    NotThePeer,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unavailable::NotPermitted => "not permitted",
            Unavailable::Unsupported => "not supported",
            Unavailable::NotThePeer => "the pid does not name the peer",
        })
    }
}

/// Whether CMA towards a peer (or from this process) is known to work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// Not tried yet (or only transient errors so far).
    Unknown,
    /// A probe or a transfer has succeeded.
    Available,
    /// Found unusable; transfers are refused with [`CmaError::Disabled`].
    Unavailable(Unavailable),
}

/// Why a cross-memory transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum CmaError {
    /// The kernel refused access to the peer's memory (`EPERM`; `EACCES` is read the
    /// same).
    #[error(
        "cross-memory attach to process {pid} not permitted ({source}): the kernel's ptrace \
         access check failed (peer of another user or non-dumpable, Yama \
         kernel.yama.ptrace_scope >= 1 with a peer that named another tracer or none, or a \
         container without CAP_SYS_PTRACE or with a seccomp profile blocking \
         process_vm_readv/process_vm_writev); quiver names the tracer itself under \
         ptrace_scope 1 (a program may call quiver::admin::cma::allow_peers(), prctl \
         PR_SET_PTRACER_ANY), else set kernel.yama.ptrace_scope=0, or run the container with \
         --cap-add=SYS_PTRACE; until then large messages take the two-copy path"
    )]
    NotPermitted {
        /// The peer.
        pid: u32,
        /// The system call's error.
        source: io::Error,
    },
    /// No such process (`ESRCH`), or a pid that cannot exist (0, above `i32::MAX`).
    #[error(
        "cross-memory attach: no process {pid} (it exited, or lives in another pid namespace)"
    )]
    NoSuchProcess {
        /// The pid asked for.
        pid: u32,
    },
    /// A remote address is not mapped, or not writable for a write (`EFAULT`).
    #[error(
        "cross-memory attach: bad address {addr:#x} in process {pid} (not mapped, or not \
         writable for a write) after {done} bytes"
    )]
    BadAddress {
        /// The peer.
        pid: u32,
        /// The first remote address not transferred.
        addr: u64,
        /// Bytes transferred before it (the local buffer's prefix of this length moved).
        done: usize,
    },
    /// The system calls do not exist (`ENOSYS`): a kernel without
    /// `CONFIG_CROSS_MEMORY_ATTACH`, or a sandbox.
    #[error(
        "cross-memory attach not supported here ({source}): a kernel without \
         CONFIG_CROSS_MEMORY_ATTACH, or a sandbox or seccomp filter answering ENOSYS; large \
         messages take the two-copy path"
    )]
    Unsupported {
        /// The system call's error.
        source: io::Error,
    },
    /// The remote pieces and the local buffer differ in length.
    #[error(
        "cross-memory attach: the remote pieces hold {remote} bytes, the local buffer {local}"
    )]
    LengthMismatch {
        /// Sum of the remote pieces' lengths.
        remote: usize,
        /// Length of the local buffer.
        local: usize,
    },
    /// A piece does not fit the address space, or the pieces' total overflows `isize`.
    #[error(
        "cross-memory attach: piece {index} ({addr:#x}, {len} bytes) does not fit the address \
         space"
    )]
    BadPiece {
        /// Index of the piece in its list.
        index: usize,
        /// Its address.
        addr: u64,
        /// Its length.
        len: usize,
    },
    /// [`probe`] found that the process does not hold the probe word published by the
    /// peer: the pid names another process or none.
    #[error(
        "cross-memory attach: process {pid} is not the peer that published the probe word (it \
         exited, lives in another pid namespace, or the pid was reused)"
    )]
    NotThePeer {
        /// The pid probed.
        pid: u32,
    },
    /// Refused by a process that found CMA unavailable earlier (and said so in the
    /// log then).
    #[error("cross-memory attach disabled earlier ({reason}); use the copy path")]
    Disabled {
        /// What was found then.
        reason: Unavailable,
    },
    /// Any other failure of the system call (`ENOMEM`, `EINVAL`, no progress).
    #[error("cross-memory attach with process {pid}: {source}")]
    Io {
        /// The peer.
        pid: u32,
        /// The error.
        source: io::Error,
    },
}

impl CmaError {
    /// `Some` when the error means CMA cannot work with this peer (so later transfers
    /// would fail the same way and the caller should switch to its copy path for good);
    /// `None` when only this transfer failed (a bad piece list, a dead peer, a transient
    /// kernel error).
    pub fn unavailable(&self) -> Option<Unavailable> {
        match self {
            CmaError::NotPermitted { .. } => Some(Unavailable::NotPermitted),
            CmaError::Unsupported { .. } => Some(Unavailable::Unsupported),
            CmaError::NotThePeer { .. } => Some(Unavailable::NotThePeer),
            CmaError::Disabled { reason } => Some(*reason),
            _ => None,
        }
    }

    /// Whether CMA is refused or missing here, so that the caller should take its copy
    /// path from now on: `self.unavailable().is_some()` (not permitted, not supported,
    /// not the peer, or disabled earlier). False for errors about one transfer.
    pub fn is_permission(&self) -> bool {
        self.unavailable().is_some()
    }
}

/// Copies the remote pieces of process `pid`, in order, into `local`
/// (`process_vm_readv`). Returns the number of bytes copied: `local.len()`.
///
/// `local.len()` must equal the sum of the pieces' lengths. With `pid` this process,
/// the pieces are read from this process's own memory.
pub fn read_from(pid: u32, remote: &[Piece], local: &mut [u8]) -> Result<usize, CmaError> {
    transfer(pid, remote, Local::Into(local), LIMITS)
}

/// Copies `local` into the remote pieces of process `pid`, in order
/// (`process_vm_writev`). Returns the number of bytes copied: `local.len()`.
///
/// `local.len()` must equal the sum of the pieces' lengths. The peer must have lent
/// the pieces for writing. With `pid` this process, this writes this process's own
/// memory behind the compiler's back, like writing `/proc/self/mem`: the pieces must
/// then not overlap memory that Rust code holds references to.
pub fn write_to(pid: u32, remote: &[Piece], local: &[u8]) -> Result<usize, CmaError> {
    transfer(pid, remote, Local::From(local), LIMITS)
}

/// Splitting limits of a transfer (smaller ones in tests exercise the splitting).
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Remote iovecs per call, at least 1.
    iovs: usize,
    /// Bytes per call, at least 1.
    bytes: usize,
}

const LIMITS: Limits = Limits {
    iovs: IOV_MAX,
    bytes: MAX_BYTES_PER_CALL,
};

/// The local side of a transfer: the destination of a read or the source of a write.
enum Local<'a> {
    Into(&'a mut [u8]),
    From(&'a [u8]),
}

impl Local<'_> {
    fn len(&self) -> usize {
        match self {
            Local::Into(b) => b.len(),
            Local::From(b) => b.len(),
        }
    }

    /// The iovec over `len` bytes at `at` (bounds-checked).
    fn iov(&mut self, at: usize, len: usize) -> libc::iovec {
        let base = match self {
            Local::Into(b) => b[at..at + len].as_mut_ptr(),
            // The kernel only reads through a write's local iovec.
            Local::From(b) => b[at..at + len].as_ptr().cast_mut(),
        };
        libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        }
    }
}

/// Where a transfer stands in its remote piece list.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    piece: usize,
    off: usize,
}

impl Cursor {
    /// Moves `n` bytes forward (`n` at most what is left).
    fn advance(&mut self, remote: &[Piece], mut n: usize) {
        while n > 0 {
            let room = remote[self.piece].len - self.off;
            if n < room {
                self.off += n;
                return;
            }
            n -= room;
            self.piece += 1;
            self.off = 0;
        }
    }

    /// The remote address of the next byte to transfer (skipping empty pieces).
    fn addr(&self, remote: &[Piece]) -> u64 {
        let mut c = *self;
        while c.piece < remote.len() && remote[c.piece].len == c.off {
            c.piece += 1;
            c.off = 0;
        }
        remote
            .get(c.piece)
            .map_or(0, |p| p.addr.wrapping_add(c.off as u64))
    }
}

/// The pid as the system calls take it; 0 and values above `i32::MAX` name no process
/// (0 would mean "the caller" to some calls, negatives process groups).
fn to_pid(pid: u32) -> Result<libc::pid_t, CmaError> {
    match libc::pid_t::try_from(pid) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(CmaError::NoSuchProcess { pid }),
    }
}

/// Maps a failed call's error to a [`CmaError`]; `addr` and `done` locate the failure.
fn classify(err: io::Error, pid: u32, addr: u64, done: usize) -> CmaError {
    match err.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => CmaError::NotPermitted { pid, source: err },
        Some(libc::ESRCH) => CmaError::NoSuchProcess { pid },
        Some(libc::EFAULT) => CmaError::BadAddress { pid, addr, done },
        Some(libc::ENOSYS) => CmaError::Unsupported { source: err },
        _ => CmaError::Io { pid, source: err },
    }
}

/// One transfer, split into calls within `limits` and repeated after partial ones.
fn transfer(
    pid: u32,
    remote: &[Piece],
    mut local: Local<'_>,
    limits: Limits,
) -> Result<usize, CmaError> {
    debug_assert!(limits.iovs >= 1 && limits.bytes >= 1);
    let total = total_len(remote)?;
    let len = local.len();
    if total != len {
        return Err(CmaError::LengthMismatch {
            remote: total,
            local: len,
        });
    }
    let sys_pid = to_pid(pid)?;
    if len == 0 {
        return Ok(0);
    }
    let mut at = Cursor { piece: 0, off: 0 };
    let mut done = 0usize;
    let mut riov: Vec<libc::iovec> = Vec::with_capacity(remote.len().min(limits.iovs));
    while done < len {
        // The next batch: up to `limits.iovs` non-empty iovecs and `limits.bytes` bytes.
        riov.clear();
        let mut batch = 0usize;
        let mut c = at;
        while riov.len() < limits.iovs && batch < limits.bytes && c.piece < remote.len() {
            let p = remote[c.piece];
            let take = (p.len - c.off).min(limits.bytes - batch);
            if take > 0 {
                // total_len checked that addr + len fits a usize, so this cannot wrap.
                let addr = p.addr as usize + c.off;
                riov.push(libc::iovec {
                    iov_base: std::ptr::without_provenance_mut(addr),
                    iov_len: take,
                });
                batch += take;
                c.off += take;
            }
            if c.off == p.len {
                c.piece += 1;
                c.off = 0;
            }
        }
        // Bytes are left (done < len == total), so the batch holds some.
        debug_assert!(batch > 0 && done + batch <= len);
        let liov = local.iov(done, batch);
        let n = loop {
            let r = match local {
                // With pid == ours the remote pieces alias no Rust reference the caller
                // holds unless the caller broke read_from's contract.
                // SAFETY: liov covers `batch` bytes of the borrowed destination, alive
                // for the call; riov holds riov.len() <= IOV_MAX initialised iovecs whose
                // addresses only the kernel dereferences, in `pid` (bad ones: EFAULT).
                Local::Into(_) => unsafe {
                    libc::process_vm_readv(
                        sys_pid,
                        &liov,
                        1,
                        riov.as_ptr(),
                        riov.len() as libc::c_ulong,
                        0,
                    )
                },
                // SAFETY: liov covers `batch` bytes of the borrowed source (only read),
                // alive for the call; riov holds riov.len() <= IOV_MAX initialised
                // iovecs whose addresses only the kernel dereferences, in `pid`.
                Local::From(_) => unsafe {
                    libc::process_vm_writev(
                        sys_pid,
                        &liov,
                        1,
                        riov.as_ptr(),
                        riov.len() as libc::c_ulong,
                        0,
                    )
                },
            };
            if r >= 0 {
                break r as usize;
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(classify(err, pid, at.addr(remote), done));
            }
        };
        if n == 0 {
            return Err(CmaError::Io {
                pid,
                source: io::Error::other(format!(
                    "the kernel transferred nothing of {batch} bytes at {:#x} after {done}",
                    at.addr(remote)
                )),
            });
        }
        // A partial transfer (fewer bytes than asked) resumes where it stopped.
        let n = n.min(batch);
        at.advance(remote, n);
        done += n;
    }
    Ok(done)
}

/// What a process publishes so that peers can [`probe`] it: the address of its probe
/// word and the word's value, a random nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProbeTarget {
    /// Address of the probe word in the publishing process.
    pub addr: u64,
    /// Its value (never 0).
    pub value: u64,
}

/// This process's probe word: 0 until [`probe_target`] sets it to a random nonce.
static PROBE_WORD: AtomicU64 = AtomicU64::new(0);

/// This process's probe target (the same for every call), to publish to its peers.
pub fn probe_target() -> ProbeTarget {
    let mut value = PROBE_WORD.load(Ordering::Acquire);
    if value == 0 {
        let fresh = getrandom::u64().unwrap_or_else(|_| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ (u64::from(std::process::id()) << 32) ^ 0x5155_4956_4552_434d
        });
        let fresh = fresh.max(1);
        value = match PROBE_WORD.compare_exchange(0, fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => fresh,
            Err(set) => set,
        };
    }
    ProbeTarget {
        addr: PROBE_WORD.as_ptr() as usize as u64,
        value,
    }
}

/// Checks that CMA to process `pid` works and that `pid` is the peer that published
/// `target`: reads the 8-byte probe word there and compares it with the published
/// value. Probing this process (`std::process::id()` and [`probe_target`]) checks only
/// that the system call exists and is allowed by any seccomp filter.
///
/// Errors: [`CmaError::NotPermitted`], [`CmaError::Unsupported`],
/// [`CmaError::NotThePeer`] (no such process, no word at that address, or another
/// value), and [`CmaError::Io`] for anything else.
pub fn probe(pid: u32, target: ProbeTarget) -> Result<(), CmaError> {
    let mut word = [0u8; 8];
    let piece = Piece {
        addr: target.addr,
        len: word.len(),
    };
    match read_from(pid, &[piece], &mut word) {
        Ok(_) if u64::from_ne_bytes(word) == target.value => Ok(()),
        Ok(_)
        | Err(
            CmaError::NoSuchProcess { .. }
            | CmaError::BadAddress { .. }
            | CmaError::BadPiece { .. },
        ) => Err(CmaError::NotThePeer { pid }),
        Err(e) => Err(e),
    }
}

/// Lets any process of this user read and write this process's memory with CMA (and
/// `ptrace` it) under Yama `ptrace_scope = 1`, where only ancestors could otherwise:
/// `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`, as Open MPI's vader transport does.
///
/// Security trade-off: any process running as the same user may then attach to this one
/// and read or change all its memory, as on a system without Yama. It does not help
/// under `ptrace_scope` 2 or 3, across users, or against seccomp.
///
/// Quiver does not need this call: opening a tagged endpoint names the job's one other
/// process on the node as the tracer, or any process only when there are several
/// (`docs/DESIGN-NOTES.md`, "What quiver changes in your process"). After this call
/// quiver never narrows the exception again.
///
/// Returns `Ok(true)` when the exception was set, `Ok(false)` when the kernel has no
/// Yama (`EINVAL`: nothing restricts same-user access then).
pub fn allow_peers() -> io::Result<bool> {
    yama::allow_any()
}

const UNKNOWN: u8 = 0;
const AVAILABLE: u8 = 1;
const NOT_PERMITTED: u8 = 2;
const UNSUPPORTED: u8 = 3;
const NOT_THE_PEER: u8 = 4;

/// Remembers whether CMA works, for one peer or for this whole process: the first error
/// that shows it cannot ([`CmaError::unavailable`]) disables it for good and is logged
/// once (`tracing::warn!`); later transfers through this state fail at once with
/// [`CmaError::Disabled`], without a system call.
///
/// Hold one per peer when peers may differ (another user, another pid namespace); one
/// per process is enough when they cannot, and then the first refusal turns CMA off
/// towards every peer. Shared by `&`; all methods are thread-safe.
#[derive(Debug, Default)]
pub struct CmaState {
    state: AtomicU8,
}

impl CmaState {
    /// A state that has not tried CMA yet ([`Availability::Unknown`]).
    pub const fn new() -> CmaState {
        CmaState {
            state: AtomicU8::new(UNKNOWN),
        }
    }

    /// What is known so far.
    pub fn availability(&self) -> Availability {
        match self.state.load(Ordering::Relaxed) {
            AVAILABLE => Availability::Available,
            NOT_PERMITTED => Availability::Unavailable(Unavailable::NotPermitted),
            UNSUPPORTED => Availability::Unavailable(Unavailable::Unsupported),
            NOT_THE_PEER => Availability::Unavailable(Unavailable::NotThePeer),
            _ => Availability::Unknown,
        }
    }

    /// Whether a transfer is worth trying: not found unavailable.
    pub fn is_usable(&self) -> bool {
        !matches!(self.availability(), Availability::Unavailable(_))
    }

    #[cfg(test)]
    /// [`probe`]s process `pid` and records the outcome; returns what is known then.
    pub fn probe(&self, pid: u32, target: ProbeTarget) -> Availability {
        if let Availability::Unavailable(_) = self.availability() {
            return self.availability();
        }
        match probe(pid, target) {
            Ok(()) => self.mark_available(),
            Err(e) => {
                self.record(pid, &e);
            }
        }
        self.availability()
    }

    /// [`read_from`] unless disabled, recording the outcome.
    pub fn read_from(
        &self,
        pid: u32,
        remote: &[Piece],
        local: &mut [u8],
    ) -> Result<usize, CmaError> {
        self.check()?;
        self.note(pid, read_from(pid, remote, local))
    }

    /// [`write_to`] unless disabled, recording the outcome.
    pub fn write_to(&self, pid: u32, remote: &[Piece], local: &[u8]) -> Result<usize, CmaError> {
        self.check()?;
        self.note(pid, write_to(pid, remote, local))
    }

    /// Records a failure of a transfer made without this state: when `err` shows that CMA
    /// cannot work, disables it. Returns true when this call disabled it (and logged the
    /// warning); false when it was disabled already or `err` concerns one transfer only.
    pub fn record(&self, pid: u32, err: &CmaError) -> bool {
        let code = match err.unavailable() {
            Some(Unavailable::NotPermitted) => NOT_PERMITTED,
            Some(Unavailable::Unsupported) => UNSUPPORTED,
            Some(Unavailable::NotThePeer) => NOT_THE_PEER,
            None => return false,
        };
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            if cur != UNKNOWN && cur != AVAILABLE {
                return false;
            }
            match self
                .state
                .compare_exchange_weak(cur, code, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        tracing::warn!(
            pid,
            "cross-memory attach unavailable, falling back to the two-copy path: {err}"
        );
        true
    }

    fn check(&self) -> Result<(), CmaError> {
        match self.availability() {
            Availability::Unavailable(reason) => Err(CmaError::Disabled { reason }),
            _ => Ok(()),
        }
    }

    fn mark_available(&self) {
        let _ =
            self.state
                .compare_exchange(UNKNOWN, AVAILABLE, Ordering::Relaxed, Ordering::Relaxed);
    }

    fn note(&self, pid: u32, r: Result<usize, CmaError>) -> Result<usize, CmaError> {
        match &r {
            Ok(_) => self.mark_available(),
            Err(e) => {
                self.record(pid, e);
            }
        }
        r
    }
}

#[cfg(test)]
mod tests;
