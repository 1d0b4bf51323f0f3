//! An endpoint's shared-memory receive area: a POSIX shared-memory object
//! `/dev/shm/quiver-UID-JOB-RANK-DPID`, mode 0600, created by the receiving endpoint and
//! attached by senders.
//!
//! Layout (all offsets fixed by the constants below; only plain data and atomics):
//!
//! ```text
//! page 0    SegHeader: magic, version, layout word, owner identity, geometry,
//!           `ready` (stored last, Release), `closed`; the wake-up line (armed,
//!           doorbell_pending); the slot-claim counter on a line of its own
//! page 1..  SlotCtl[slots]: per sender, a line written once at claim time and a line
//!           with the consumer's tail (written by the receiver only)
//! data      slots × ring_capacity bytes: one SPSC token ring per sender
//! ```
//!
//! Attaching checks magic, version, the layout word, the job id and that the file is as
//! large as the geometry says, so a segment of another version or another job is refused
//! with a clear error. Segments are unlinked when their endpoint closes; a segment whose
//! owner process died (crash, `kill -9`) is removed by [`cleanup_stale`], which every job
//! runs when it starts, and by the launcher at the end of a job.

use super::object;
use super::ring::{RingMem, TailRef};
use super::wake::WakeLine;
use crate::error::{Error, Result};
use std::ffi::CString;
use std::io;
use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const MAGIC: u64 = u64::from_le_bytes(*b"QUIVRSHM");
const VERSION: u32 = 1;
const PAGE: usize = 4096;
const CACHE_LINE: usize = 64;

/// Fixed header at offset 0 of every segment.
#[repr(C, align(64))]
pub(crate) struct SegHeader {
    magic: u64,
    version: u32,
    layout: u32,
    job_id: u32,
    owner_rank: u32,
    owner_pid: u32,
    owner_dpid: u16,
    _pad0: u16,
    owner_start_time: u64,
    slots: u32,
    _pad1: u32,
    ring_capacity: u64,
    max_message: u64,
    ready: AtomicU32,
    closed: AtomicU32,
    /// Wake-up line: written by the receiver (armed) and by senders (doorbell_pending).
    pub(crate) wake: WakeLine,
    claim: ClaimLine,
}

#[repr(C, align(64))]
struct ClaimLine {
    next_slot: AtomicU32,
}

/// Per-sender control block.
#[repr(C, align(64))]
pub(crate) struct SlotCtl {
    /// 0 free, 1 claimed, 2 ready (identity written).
    state: AtomicU32,
    src_rank: u32,
    src_dpid: u16,
    _pad: u16,
    src_pid: u32,
    /// The consumer's released position, on its own line.
    tail: TailLine,
}

#[repr(C, align(64))]
struct TailLine {
    tail: AtomicU64,
}

const SLOT_READY: u32 = 2;

fn layout_word() -> u32 {
    (size_of::<SegHeader>() as u32) << 16 | size_of::<SlotCtl>() as u32
}

/// Geometry of a segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub slots: u32,
    pub ring_capacity: usize,
}

impl Geometry {
    fn slot_table_offset() -> usize {
        PAGE
    }
    fn data_offset(&self) -> usize {
        round_up(PAGE + self.slots as usize * size_of::<SlotCtl>(), PAGE)
    }
    fn total_len(&self) -> usize {
        self.data_offset() + self.slots as usize * self.ring_capacity
    }
    /// Total length, or None if it overflows (a corrupt header).
    fn checked_total_len(&self) -> Option<usize> {
        let table = (self.slots as usize).checked_mul(size_of::<SlotCtl>())?;
        let data = round_up(PAGE.checked_add(table)?, PAGE);
        data.checked_add((self.slots as usize).checked_mul(self.ring_capacity)?)
    }
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// Name of the segment of endpoint (rank, dpid) of a job, as passed to `shm_open`.
pub(crate) fn segment_name(job_id: u32, rank: u32, dpid: u16) -> String {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    format!("/quiver-{uid}-{job_id:08x}-{rank}-{dpid}")
}

/// A mapped segment (either side).
pub(crate) struct Segment {
    base: *mut u8,
    len: usize,
    name: String,
    geometry: Geometry,
    owner: bool,
}

// SAFETY: the mapping is process-wide; concurrent access goes through atomics.
unsafe impl Send for Segment {}

impl Segment {
    /// Creates the receive area of endpoint (rank, dpid). A leftover segment of the same
    /// name whose owner died is replaced; one whose owner lives is [`Error::DpidInUse`];
    /// one of another user's is [`Error::SegmentSquatted`] (left alone).
    pub(crate) fn create(
        job_id: u32,
        rank: u32,
        dpid: u16,
        geometry: Geometry,
        max_message: usize,
    ) -> Result<Segment> {
        let name = segment_name(job_id, rank, dpid);
        let cname = CString::new(name.clone()).expect("segment names contain no NUL");
        let len = geometry.total_len();
        let mut tries = 0;
        let fd = loop {
            // SAFETY: cname is a valid NUL-terminated string.
            let fd = unsafe {
                libc::shm_open(
                    cname.as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd >= 0 {
                break fd;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::AlreadyExists {
                return Err(Error::io(format!("shm_open {name}"), err));
            }
            // Another user's object under this name is theirs: refused, never removed.
            object::check_existing(&name)?;
            tries += 1;
            if tries > 3 {
                return Err(Error::io(
                    format!("shm_open {name} (still there after removal)"),
                    err,
                ));
            }
            match owner_alive(&name) {
                Some(false) | None => {
                    // SAFETY: valid C string; unlinking a dead owner's segment (ours).
                    if unsafe { libc::shm_unlink(cname.as_ptr()) } != 0 {
                        let e = io::Error::last_os_error();
                        if e.kind() != io::ErrorKind::NotFound {
                            return Err(Error::io(format!("removing stale {name}"), e));
                        }
                    }
                }
                Some(true) => return Err(Error::DpidInUse { dpid }),
            }
        };
        // SAFETY: fd is a valid descriptor we own.
        let rc = unsafe { libc::ftruncate(fd, len as libc::off_t) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            // SAFETY: closing and unlinking what we just created.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(cname.as_ptr());
            }
            return Err(Error::io(
                format!("sizing shared-memory segment {name} to {len} bytes (is /dev/shm full?)"),
                err,
            ));
        }
        let base = map(fd, len, &name)?;
        let seg = Segment {
            base,
            len,
            name,
            geometry,
            owner: true,
        };
        let h = seg.header_mut_raw();
        // The magic goes last: a cleanup that reads the header (`owner_alive`) takes a
        // segment without it for one it cannot judge, never for a dead owner's (pid 0).
        // SAFETY: we own the fresh mapping; no other process uses it before `ready` is
        // set (attachers wait for it with Acquire).
        unsafe {
            (*h).version = VERSION;
            (*h).layout = layout_word();
            (*h).job_id = job_id;
            (*h).owner_rank = rank;
            (*h).owner_pid = std::process::id();
            (*h).owner_dpid = dpid;
            (*h).owner_start_time = process_start_time(std::process::id()).unwrap_or(0);
            (*h).slots = geometry.slots;
            (*h).ring_capacity = geometry.ring_capacity as u64;
            (*h).max_message = max_message as u64;
            std::sync::atomic::fence(Ordering::Release);
            (*h).magic = MAGIC;
        }
        // Release: the fields above are visible to any attacher that sees ready == 1.
        seg.header().ready.store(1, Ordering::Release);
        Ok(seg)
    }

    /// Attaches to the receive area of endpoint (rank, dpid), waiting up to `timeout`
    /// for it to be created.
    pub(crate) fn attach(job_id: u32, rank: u32, dpid: u16, timeout: Duration) -> Result<Segment> {
        let name = segment_name(job_id, rank, dpid);
        let cname = CString::new(name.clone()).expect("segment names contain no NUL");
        let start = Instant::now();
        let mut pause = Duration::from_micros(50);
        loop {
            // SAFETY: valid C string.
            let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
            if fd >= 0 {
                match Self::map_existing(fd, &name, job_id) {
                    Ok(Some(seg)) => return Ok(seg),
                    Ok(None) => {} // not initialised yet
                    Err(e) => return Err(e),
                }
            } else {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::NotFound {
                    return Err(Error::io(format!("shm_open {name}"), err));
                }
            }
            if start.elapsed() >= timeout {
                return Err(Error::PeerNotFound {
                    rank,
                    dpid,
                    waited: timeout,
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Maps an opened segment and validates it; `Ok(None)` if not yet initialised.
    fn map_existing(fd: i32, name: &str, job_id: u32) -> Result<Option<Segment>> {
        // Another user's segment under this job's name is never mapped, let alone
        // written.
        let st = match object::check_owned(fd, name) {
            Ok(st) => st,
            Err(e) => {
                // SAFETY: closing our descriptor.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        let len = st.st_size as usize;
        if len < PAGE {
            // SAFETY: closing our descriptor.
            unsafe { libc::close(fd) };
            return Ok(None); // the creator has not sized it yet
        }
        let base = map(fd, len, name)?;
        let bad = |reason: String| Error::Segment {
            name: name.to_string(),
            reason,
        };
        // SAFETY: the mapping is at least one page, enough for SegHeader, and stays
        // mapped while `probe` lives.
        let h = unsafe { &*(base as *const SegHeader) };
        let probe = Segment {
            base,
            len,
            name: name.to_string(),
            geometry: Geometry {
                slots: 0,
                ring_capacity: 0,
            },
            owner: false,
        };
        // Acquire pairs with the creator's Release of `ready`.
        if h.ready.load(Ordering::Acquire) != 1 {
            return Ok(None);
        }
        if h.magic != MAGIC {
            return Err(bad(format!(
                "bad magic {:#x}: not a quiver segment",
                h.magic
            )));
        }
        if h.version != VERSION || h.layout != layout_word() {
            return Err(bad(format!(
                "version {} layout {:#x}, this build expects version {VERSION} layout {:#x}: \
                 all ranks must run the same quiver build",
                h.version,
                h.layout,
                layout_word()
            )));
        }
        if h.job_id != job_id {
            return Err(bad(format!(
                "belongs to job {:#x}, not {job_id:#x}",
                h.job_id
            )));
        }
        let geometry = Geometry {
            slots: h.slots,
            ring_capacity: h.ring_capacity as usize,
        };
        if geometry.slots == 0
            || !geometry.ring_capacity.is_power_of_two()
            || geometry.ring_capacity < 64
            || geometry.checked_total_len().is_none_or(|total| total > len)
        {
            return Err(bad(format!(
                "geometry {} slots x {} bytes does not fit the {len}-byte segment",
                geometry.slots, geometry.ring_capacity
            )));
        }
        let mut seg = probe;
        seg.geometry = geometry;
        Ok(Some(seg))
    }

    pub(crate) fn header(&self) -> &SegHeader {
        // SAFETY: base points to a mapping of at least one page holding a SegHeader
        // (created by us or validated on attach) that lives as long as self.
        unsafe { &*(self.base as *const SegHeader) }
    }

    fn header_mut_raw(&self) -> *mut SegHeader {
        self.base as *mut SegHeader
    }

    #[cfg(test)]
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn owner_pid(&self) -> u32 {
        self.header().owner_pid
    }

    /// Whether the process that created this segment still runs (a recycled pid or a
    /// zombie counts as gone).
    pub(crate) fn owner_alive(&self) -> bool {
        let h = self.header();
        match process_start_time(h.owner_pid) {
            None => false,
            Some(t) => h.owner_start_time == 0 || t == h.owner_start_time,
        }
    }

    pub(crate) fn max_message(&self) -> usize {
        self.header().max_message as usize
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.header().closed.load(Ordering::Acquire) != 0
    }

    fn slot(&self, i: u32) -> &SlotCtl {
        assert!(i < self.geometry.slots);
        let off = Geometry::slot_table_offset() + i as usize * size_of::<SlotCtl>();
        // SAFETY: i < slots, and the slot table lies inside the mapping (checked against
        // the file length on attach, sized by us on create); SlotCtl is 64-aligned and
        // the table starts on a page boundary.
        unsafe { &*(self.base.add(off) as *const SlotCtl) }
    }

    fn ring_mem(&self, i: u32) -> RingMem {
        assert!(i < self.geometry.slots);
        let off = self.geometry.data_offset() + i as usize * self.geometry.ring_capacity;
        // SAFETY: the ring [off, off + capacity) lies inside the mapping (geometry checked
        // against the file length), off is page-aligned plus a multiple of 8, and the
        // mapping outlives the RingMem because callers keep the Segment alongside it.
        unsafe { RingMem::new(self.base.add(off), self.geometry.ring_capacity) }
    }

    fn tail_ref(&self, i: u32) -> TailRef {
        let slot = self.slot(i);
        // SAFETY: the atomic lives in the mapping, which outlives the TailRef (callers
        // keep the Segment alongside it).
        unsafe { TailRef::new(&slot.tail.tail as *const AtomicU64) }
    }

    /// Sender side: claims a slot and records who we are. Returns the slot's ring.
    pub(crate) fn claim_slot(
        &self,
        src_rank: u32,
        src_dpid: u16,
    ) -> Result<(u32, RingMem, TailRef)> {
        let h = self.header();
        let i = h.claim.next_slot.fetch_add(1, Ordering::AcqRel);
        if i >= self.geometry.slots {
            return Err(Error::TooManySenders {
                rank: h.owner_rank,
                dpid: h.owner_dpid,
                slots: self.geometry.slots,
            });
        }
        let slot = self.slot(i);
        let p = slot as *const SlotCtl as *mut SlotCtl;
        // SAFETY: slot i was handed to us alone by the fetch_add; the receiver reads these
        // plain fields only after it sees state == READY (Acquire), stored below (Release).
        unsafe {
            (*p).src_rank = src_rank;
            (*p).src_dpid = src_dpid;
            (*p).src_pid = std::process::id();
        }
        slot.state.store(SLOT_READY, Ordering::Release);
        Ok((i, self.ring_mem(i), self.tail_ref(i)))
    }

    /// Receiver side: number of slots claimed so far (some may not be ready yet). Inline:
    /// every shared-memory poll asks (out of line it cost a read about 6 instructions).
    #[inline]
    pub(crate) fn claimed_slots(&self) -> u32 {
        self.header()
            .claim
            .next_slot
            .load(Ordering::Acquire)
            .min(self.geometry.slots)
    }

    /// Receiver side: the identity (rank, DPID, pid) and ring of slot `i`, once its
    /// sender made it ready.
    pub(crate) fn ready_slot(&self, i: u32) -> Option<(u32, u16, u32, RingMem, TailRef)> {
        let slot = self.slot(i);
        // Acquire pairs with the sender's Release in claim_slot.
        if slot.state.load(Ordering::Acquire) != SLOT_READY {
            return None;
        }
        Some((
            slot.src_rank,
            slot.src_dpid,
            slot.src_pid,
            self.ring_mem(i),
            self.tail_ref(i),
        ))
    }

    /// Receiver side: marks the endpoint closed and removes the name.
    fn close_and_unlink(&self) {
        self.header().closed.store(1, Ordering::Release);
        if let Ok(c) = CString::new(self.name.clone()) {
            // SAFETY: valid C string.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owner {
            self.close_and_unlink();
        }
        // SAFETY: base/len describe a mapping we created with mmap and no reference into
        // it outlives self (rings and tails are dropped with their owners first).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

fn map(fd: i32, len: usize, name: &str) -> Result<*mut u8> {
    // SAFETY: mapping a shared-memory object we opened; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    let err = io::Error::last_os_error();
    // SAFETY: fd is ours; the mapping (if any) keeps the object alive.
    unsafe { libc::close(fd) };
    if p == libc::MAP_FAILED {
        return Err(Error::io(format!("mmap {name} ({len} bytes)"), err));
    }
    Ok(p as *mut u8)
}

/// Whether process `pid` runs (not gone, not a zombie).
pub(crate) fn pid_alive(pid: u32) -> bool {
    process_start_time(pid).is_some()
}

/// This process's start time as [`process_alive`] compares it (0 where it cannot be
/// read, which makes the comparison fall back to the pid alone).
pub(crate) fn own_start_time() -> u64 {
    process_start_time(std::process::id()).unwrap_or(0)
}

/// Whether the process `pid` that started at `start_time` (from [`own_start_time`] in
/// that process; 0 if unknown) still runs on this node: not gone, not a zombie, and not a
/// later process that got the same pid.
pub(crate) fn process_alive(pid: u32, start_time: u64) -> bool {
    match process_start_time(pid) {
        None => false,
        Some(t) => start_time == 0 || t == start_time,
    }
}

/// Start time of a live process in clock ticks since boot (field 22 of /proc/PID/stat),
/// used to tell a live owner from a recycled pid. None for a process that does not exist
/// or has died and awaits reaping (state Z or X).
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.get(stat.rfind(')')? + 2..)?.split_whitespace();
    if matches!(fields.next()?, "Z" | "X") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the owner of segment `name` (as passed to shm_open) is alive; None if the
/// segment cannot be read.
fn owner_alive(name: &str) -> Option<bool> {
    let path = format!("/dev/shm{name}");
    let bytes = read_prefix(&path, size_of::<SegHeader>())?;
    let word = |off: usize, n: usize| -> u64 {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&bytes[off..off + n]);
        u64::from_le_bytes(b)
    };
    if word(offset_of!(SegHeader, magic), 8) != MAGIC {
        return None;
    }
    let pid = word(offset_of!(SegHeader, owner_pid), 4) as u32;
    let start = word(offset_of!(SegHeader, owner_start_time), 8);
    Some(process_alive(pid, start))
}

fn read_prefix(path: &str, n: usize) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut buf = vec![0u8; n];
    f.read_exact(&mut buf).ok()?;
    Some(buf)
}

/// Removes this user's quiver segments whose owner process is dead (left by a crashed
/// job). Returns how many were removed. (Boards and shared buffers name no owner: a
/// live one of a rank without a segment, `QUIVER_TRANSPORT=udp`, of a job whose id an
/// earlier crashed run also used, cannot be told from a dead one; they go with their
/// rank in `cleanup_dead_rank`, where the job knows the rank failed.)
pub fn cleanup_stale() -> usize {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    remove_matching(&format!("quiver-{uid}-"), |name| {
        owner_alive(name) == Some(false)
    })
}

/// Removes every segment of job `job_id` owned by this user (after the job ended).
pub fn cleanup_job(job_id: u32) -> usize {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    remove_matching(&format!("quiver-{uid}-{job_id:08x}-"), |_| true)
}

/// Removes the objects of rank `rank` of job `job_id` (owned by this user) whose owner
/// process is dead: what a rank the job declared failed left behind when it was killed
/// without a launcher to clean up after it (`remove_dead`). Objects of a live owner
/// are kept, so a wrong guess about `rank` is harmless. Returns how many were removed.
pub fn cleanup_dead_rank(job_id: u32, rank: u32) -> usize {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    // The trailing '-' keeps rank 1 from matching rank 10's objects.
    remove_dead(&format!("quiver-{uid}-{job_id:08x}-{rank}-"))
}

/// Removes the dead among the objects whose names start with `prefix`. An endpoint's
/// segment names its owner in its header: it is dead when that process is. A split-copy
/// board (`…-RANK-sDPID`) and a shared window (`…-RANK-bID`) have no header: they are
/// dead when their rank's segments are (at least one dead, none alive), since the
/// process that made them made its endpoint's segment first. Anything else that cannot
/// be read is kept. Returns how many were removed.
fn remove_dead(prefix: &str) -> usize {
    // A board's or buffer's bytes are not a header, whatever they hold.
    let headerless = |n: &str| {
        n.rsplit_once('-').is_some_and(|(_, last)| {
            let digits = last.strip_prefix('s').or_else(|| last.strip_prefix('b'));
            digits.is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
    };
    let owners: Vec<(String, Option<bool>)> = list_segments(prefix)
        .into_iter()
        .map(|n| {
            let alive = if headerless(&n) {
                None
            } else {
                owner_alive(&format!("/{n}"))
            };
            (n, alive)
        })
        .collect();
    // Per rank (the name less its last part): whether a dead and a live segment exist.
    let rank_of = |n: &str| n.rsplit_once('-').map(|(rank, _)| rank.to_string());
    let mut ranks: std::collections::HashMap<String, (bool, bool)> = Default::default();
    for (n, alive) in &owners {
        if let (Some(rank), Some(alive)) = (rank_of(n), alive) {
            let e = ranks.entry(rank).or_default();
            if *alive {
                e.1 = true;
            } else {
                e.0 = true;
            }
        }
    }
    let dead: std::collections::HashSet<String> = owners
        .into_iter()
        .filter(|(n, alive)| match alive {
            Some(alive) => !alive,
            None => headerless(n) && rank_of(n).and_then(|r| ranks.get(&r)) == Some(&(true, false)),
        })
        .map(|(n, _)| format!("/{n}"))
        .collect();
    remove_matching(prefix, |name| dead.contains(name))
}

/// Names of this user's segments of job `job_id` that exist now (for tests and tools).
pub fn job_segments(job_id: u32) -> Vec<String> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let prefix = format!("quiver-{uid}-{job_id:08x}-");
    list_segments(&prefix)
}

fn list_segments(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

fn remove_matching(prefix: &str, pred: impl Fn(&str) -> bool) -> usize {
    let mut removed = 0;
    for file in list_segments(prefix) {
        let name = format!("/{file}");
        if pred(&name) {
            if let Ok(c) = CString::new(name) {
                // SAFETY: valid C string.
                if unsafe { libc::shm_unlink(c.as_ptr()) } == 0 {
                    removed += 1;
                }
            }
        }
    }
    removed
}

const _: () = {
    assert!(size_of::<SegHeader>() <= PAGE);
    assert!(size_of::<SlotCtl>().is_multiple_of(CACHE_LINE));
    assert!(offset_of!(SegHeader, wake) % CACHE_LINE == 0);
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Creates the shared-memory object `name` as another Unix user (`nobody`), readable
    /// and writable by everyone, as a squatter on a job's name would; false (after saying
    /// why, or failing under `.ci/run`) where this process cannot switch users.
    fn squat(name: &str) -> bool {
        use std::os::unix::process::CommandExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            crate::test_support::cannot_run("switching to a second user needs root");
            return false;
        }
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("umask 0; printf squat > /dev/shm{name}"))
            .uid(65534)
            .gid(65534)
            .status()
            .expect("run sh as nobody");
        assert!(status.success(), "nobody could not create /dev/shm{name}");
        true
    }

    /// A job's segment name held by another user: creating the segment fails at once
    /// with a typed error naming that user (it used to retry for ever), attaching to it
    /// is refused before anything maps it, and the squatter's object is left as it was.
    #[test]
    fn another_users_object_under_a_jobs_name_is_refused() {
        let j = job();
        let name = segment_name(j, 0, 9);
        if !squat(&name) {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(Segment::create(j, 0, 9, G, 1024).map(|_| ()));
        });
        let created = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("creating over a squatted name must not retry for ever");
        assert!(
            matches!(&created, Err(Error::SegmentSquatted { uid: 65534, .. })),
            "{created:?}"
        );
        let attached = Segment::attach(j, 0, 9, Duration::from_secs(20)).map(|_| ());
        assert!(
            matches!(&attached, Err(Error::SegmentSquatted { uid: 65534, .. })),
            "{attached:?}"
        );
        assert!(format!("{}", created.unwrap_err()).contains("uid 65534"));
        let left = std::fs::read(format!("/dev/shm{name}")).unwrap();
        assert_eq!(left, b"squat", "the squatter's object was changed");
        std::fs::remove_file(format!("/dev/shm{name}")).unwrap();
        // And the job's own objects (shared buffers, boards) are checked the same way.
        let obj = format!("/quiver-{}-{j:08x}-0-b1", object::uid());
        assert!(squat(&obj));
        for made in [
            object::Mapping::open(&obj, Some(4096)).map(|_| ()),
            object::Mapping::open(&obj, None).map(|_| ()),
            object::Mapping::open_writable(&obj).map(|_| ()),
        ] {
            assert!(
                matches!(&made, Err(Error::SegmentSquatted { uid: 65534, .. })),
                "{made:?}"
            );
        }
        std::fs::remove_file(format!("/dev/shm{obj}")).unwrap();
    }

    fn job() -> u32 {
        let mut b = [0u8; 4];
        getrandom::fill(&mut b).unwrap();
        u32::from_le_bytes(b) | 1
    }

    const G: Geometry = Geometry {
        slots: 4,
        ring_capacity: 4096,
    };

    #[test]
    fn create_attach_claim_and_unlink() {
        let j = job();
        let seg = Segment::create(j, 0, 7, G, 1024).unwrap();
        let peer = Segment::attach(j, 0, 7, Duration::from_secs(1)).unwrap();
        assert_eq!(peer.max_message(), 1024);
        let (i, _, _) = peer.claim_slot(3, 9).unwrap();
        assert_eq!(i, 0);
        assert_eq!(seg.claimed_slots(), 1);
        let (rank, dpid, pid, _, _) = seg.ready_slot(0).unwrap();
        assert_eq!(pid, std::process::id());
        assert!(seg.owner_alive() && pid_alive(pid));
        assert_eq!((rank, dpid), (3, 9));
        assert_eq!(job_segments(j).len(), 1);
        drop(seg);
        assert!(peer.is_closed());
        assert!(job_segments(j).is_empty());
    }

    #[test]
    fn slots_run_out_with_a_clear_error() {
        let j = job();
        let _seg = Segment::create(j, 1, 1, G, 1024).unwrap();
        let peer = Segment::attach(j, 1, 1, Duration::from_secs(1)).unwrap();
        for _ in 0..4 {
            peer.claim_slot(0, 0).unwrap();
        }
        let e = peer.claim_slot(0, 0).err().unwrap();
        assert!(e.to_string().contains("QUIVER_SHM_SLOTS"), "{e}");
    }

    #[test]
    fn attach_refuses_another_job_and_missing_segments() {
        let j = job();
        let _seg = Segment::create(j, 2, 2, G, 1024).unwrap();
        // Same name, wrong job id: simulate by attaching with a mismatching id through a
        // segment created under the other id's name.
        let other = Segment::create(j ^ 0x100, 2, 2, G, 1024).unwrap();
        let e = Segment::map_existing(
            {
                let c = CString::new(other.name().to_string()).unwrap();
                // SAFETY: valid C string.
                unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) }
            },
            other.name(),
            j,
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("belongs to job"), "{e}");
        let e = Segment::attach(j, 9, 9, Duration::from_millis(20))
            .err()
            .unwrap();
        assert!(
            matches!(
                e,
                Error::PeerNotFound {
                    rank: 9,
                    dpid: 9,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn bad_magic_is_refused() {
        let j = job();
        let seg = Segment::create(j, 3, 3, G, 1024).unwrap();
        // SAFETY: test-only corruption of our own segment's plain header field.
        unsafe { (*seg.header_mut_raw()).magic = 0xdead };
        let e = Segment::attach(j, 3, 3, Duration::from_millis(50))
            .err()
            .unwrap();
        assert!(e.to_string().contains("magic"), "{e}");
    }

    #[test]
    fn live_owner_keeps_its_name_and_dead_owner_is_cleaned() {
        let j = job();
        let _seg = Segment::create(j, 4, 4, G, 1024).unwrap();
        assert!(matches!(
            Segment::create(j, 4, 4, G, 1024),
            Err(Error::DpidInUse { dpid: 4 })
        ));
        assert_eq!(owner_alive(&segment_name(j, 4, 4)), Some(true));
        // A segment whose owner pid does not exist is stale.
        let j2 = job();
        let seg2 = Segment::create(j2, 5, 5, G, 1024).unwrap();
        // SAFETY: test-only edit of our own segment's plain header fields.
        unsafe { (*seg2.header_mut_raw()).owner_pid = 0x7fff_fff0 };
        std::mem::forget(seg2); // leak it as a crashed process would
        assert!(cleanup_stale() >= 1);
        assert!(job_segments(j2).is_empty());
        assert_eq!(job_segments(j).len(), 1);
    }

    #[test]
    fn the_dead_ranks_segments_go_and_the_live_ones_stay() {
        let j = job();
        // Rank 1 died (its segments' owner pid does not exist); ranks 10 and 2 live.
        for dpid in [1, 2] {
            let dead = Segment::create(j, 1, dpid, G, 1024).unwrap();
            // SAFETY: test-only edit of our own segment's plain header fields.
            unsafe { (*dead.header_mut_raw()).owner_pid = 0x7fff_fff0 };
            std::mem::forget(dead);
        }
        let _ten = Segment::create(j, 10, 1, G, 1024).unwrap();
        let _two = Segment::create(j, 2, 1, G, 1024).unwrap();
        assert_eq!(job_segments(j).len(), 4);
        assert_eq!(cleanup_dead_rank(j, 2), 0, "a live owner's segment is kept");
        assert_eq!(cleanup_dead_rank(j, 1), 2);
        let mut left = job_segments(j);
        left.sort();
        assert_eq!(left.len(), 2, "{left:?}");
        // Objects without an owner header (a split-copy board, a shared window) go with
        // their rank's dead segments, and stay with its live ones.
        let dead = Segment::create(j, 3, 1, G, 1024).unwrap();
        // SAFETY: test-only edit of our own segment's plain header fields.
        unsafe { (*dead.header_mut_raw()).owner_pid = 0x7fff_fff0 };
        std::mem::forget(dead);
        let uid = object::uid();
        let raw = |rank: u32, last: &str| format!("/dev/shm/quiver-{uid}-{j:08x}-{rank}-{last}");
        for (rank, last) in [(3, "s1"), (3, "b7"), (2, "s1"), (2, "b7"), (4, "s1")] {
            std::fs::write(raw(rank, last), b"").unwrap();
        }
        assert_eq!(cleanup_dead_rank(j, 2), 0, "rank 2's segment is alive");
        assert_eq!(
            cleanup_dead_rank(j, 4),
            0,
            "rank 4 has no segment: nothing says it is dead"
        );
        assert_eq!(cleanup_dead_rank(j, 3), 3, "its segment, board and window");
        assert!(std::path::Path::new(&raw(2, "s1")).exists());
        assert!(!std::path::Path::new(&raw(3, "b7")).exists());
        for (rank, last) in [(2, "s1"), (2, "b7"), (4, "s1")] {
            std::fs::remove_file(raw(rank, last)).unwrap();
        }
        assert!(
            left.iter()
                .all(|n| n.ends_with("-10-1") || n.ends_with("-2-1")),
            "{left:?}"
        );
        assert!(process_alive(std::process::id(), own_start_time()));
        assert!(process_alive(std::process::id(), 0));
        assert!(!process_alive(std::process::id(), own_start_time() + 1));
        assert!(!process_alive(0x7fff_fff0, 0));
    }
}
