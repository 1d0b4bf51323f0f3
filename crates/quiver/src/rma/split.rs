//! Split copies: one large same-node get moved by both of its processes at once
//! (`link::shm::split` is the protocol of one slot).
//!
//! The getter reads units from the front while the peer, waiting inside quiver on its
//! otherwise idle core, writes units from the back (`process_vm_writev`), coordinated
//! through a slot of the peer's board: [`SLOTS`] [`SplitSlot`]s in a shared-memory object
//! of the peer, one per large transfer it has offered. This module holds both halves:
//! the offering side ([`SingleCopy::offer_split`], [`SingleCopy::help`], [`SingleCopy::end_split`]) and the
//! getting side (`SingleCopy::split_get`, which [`SingleCopy::get`] uses when the peer offered a slot).
//!
//! The board is `/quiver-UID-JOB-RANK-sDPID` (mode 0600, removed with the job's other
//! objects), created zero-filled by its endpoint and mapped writable by each getter on
//! first use. A slot number from a peer is checked against [`SLOTS`]; a slot that serves
//! another transfer is not opened (the getter then reads alone). The offering side writes
//! only into the process that the rank it offered to proved to be (its published nonce,
//! at the pid published with it): a slot naming another pid is refused and counted
//! (`SingleCopyStats::pids_refused`), and the getter reads those units itself. It writes only
//! inside the length it offered.

use super::{Offer, Peer, SingleCopy};
use crate::error::Result;
use crate::link::cma::{self, CmaError};
use crate::link::shm::object::{self, Mapping};
use crate::link::shm::split::{self, SplitSlot};

/// Slots of a board: large same-node transfers one endpoint can have offered at once
/// (more go without a split copy).
pub(crate) const SLOTS: usize = 64;

/// Gets at least this long are split copies when the peer offers one (shorter ones are
/// over before a peer could join, and splitting costs a system call per claim).
pub(crate) const SPLIT_MIN: u64 = 128 << 10;

/// A transfer this endpoint offered to split with its getter.
pub(super) struct Helping {
    slot: u16,
    dest: u32,
    msg: u64,
    /// The bytes offered, and their length.
    src: *const u8,
    avail: u64,
    /// A write failed or the getter asked for too much: no more claims in this slot.
    stopped: bool,
}

/// One endpoint's board, its own (with the free slots) or a peer's.
pub(crate) struct Board {
    map: Mapping,
    /// Free slot numbers (own board only).
    free: Vec<u16>,
    /// The object's name, when this process created it (and unlinks it).
    owned: Option<String>,
}

/// The board's name for endpoint `dpid` of `rank` in job `job_id`.
fn name(job_id: u32, rank: u32, dpid: u16) -> String {
    let uid = object::uid();
    format!("/quiver-{uid}-{job_id:08x}-{rank}-s{dpid}")
}

impl Board {
    /// Creates this endpoint's board, every slot free. A board left by an earlier
    /// process of the same rank (a crash) is replaced.
    pub(crate) fn create(job_id: u32, rank: u32, dpid: u16) -> Result<Board> {
        let name = name(job_id, rank, dpid);
        object::unlink(&name);
        let map = Mapping::open(&name, Some(SLOTS * std::mem::size_of::<SplitSlot>()))?;
        Ok(Board {
            map,
            free: (0..SLOTS as u16).rev().collect(),
            owned: Some(name),
        })
    }

    /// Maps the board of endpoint `dpid` of peer `rank`.
    pub(crate) fn open_peer(job_id: u32, rank: u32, dpid: u16) -> Result<Board> {
        Ok(Board {
            map: Mapping::open_writable(&name(job_id, rank, dpid))?,
            free: Vec::new(),
            owned: None,
        })
    }

    /// Slot `i`, if the board has it.
    pub(crate) fn slot(&self, i: u16) -> Option<&SplitSlot> {
        let i = usize::from(i);
        let size = std::mem::size_of::<SplitSlot>();
        if i >= SLOTS || (i + 1) * size > self.map.len() {
            return None;
        }
        // The mapping is page-aligned (every slot 64-byte aligned, as SplitSlot needs),
        // zero-filled at creation (all atomics 0: a valid slot), and only ever accessed
        // through the slots' atomics.
        // SAFETY: (i + 1) slots lie inside the mapping (checked), which lives as long as self.
        Some(unsafe { &*self.map.ptr().add(i * size).cast::<SplitSlot>() })
    }

    /// Takes a free slot of this endpoint's board for message `msg` and resets it;
    /// `None` when every slot is in use.
    pub(crate) fn take(&mut self, msg: u64) -> Option<u16> {
        let i = self.free.pop()?;
        if let Some(slot) = self.slot(i) {
            slot.reset(msg);
        }
        Some(i)
    }

    /// Gives slot `i` back (its receiver has finished with it).
    pub(crate) fn give_back(&mut self, i: u16) {
        if usize::from(i) < SLOTS && !self.free.contains(&i) {
            self.free.push(i);
        }
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        if let Some(name) = &self.owned {
            object::unlink(name);
        }
    }
}

impl SingleCopy {
    /// Whether this endpoint would offer `rank` a split copy of a transfer of `len` bytes
    /// (split copies on, attach usable, not to itself, long enough); the caller checks
    /// that `rank` is on this node.
    pub(crate) fn may_split(&self, rank: u32, len: u64) -> bool {
        self.split_on
            && self.help_ok.get()
            && rank != self.rank
            && self.reach.cma.is_usable()
            && len >= SPLIT_MIN
    }

    /// Offers same-node peer `rank`, which will get `src` (transfer number `msg`, unique
    /// among this endpoint's transfers in flight), to split the copy: takes a slot of
    /// this endpoint's board for it. The slot, for the peer's [`Offer`]; `None` if
    /// [`SingleCopy::may_split`] says no or every slot is in use.
    ///
    /// # Safety
    /// `src` must stay valid, and unchanged, until [`SingleCopy::end_split`] for (`rank`, `msg`):
    /// [`SingleCopy::help`] writes from it meanwhile.
    pub(crate) unsafe fn offer_split(&self, rank: u32, msg: u64, src: &[u8]) -> Option<u16> {
        if !self.may_split(rank, src.len() as u64) {
            return None;
        }
        let i = self.board.borrow_mut().as_mut().and_then(|b| b.take(msg))?;
        self.helping.borrow_mut().push(Helping {
            slot: i,
            dest: rank,
            msg,
            src: src.as_ptr(),
            avail: src.len() as u64,
            stopped: false,
        });
        Some(i)
    }

    /// The transfer (`rank`, `msg`) is over (its getter said so): its slot, if it had
    /// one, is free again and its bytes are no longer used.
    pub(crate) fn end_split(&self, rank: u32, msg: u64) {
        let mut helping = self.helping.borrow_mut();
        if let Some(i) = helping.iter().position(|h| h.dest == rank && h.msg == msg) {
            let h = helping.swap_remove(i);
            if let Some(b) = self.board.borrow_mut().as_mut() {
                b.give_back(h.slot);
            }
        }
    }

    /// Whether this endpoint offered a split copy that a receiver may be reading
    /// (then [`SingleCopy::help`] has work to look for).
    #[inline]
    pub(crate) fn helping(&self) -> bool {
        !self.helping.borrow().is_empty()
    }

    /// Writes the units the getters left to this endpoint in the split copies they have
    /// opened. Returns whether it wrote (or tried to write) any.
    pub(crate) fn help(&self) -> bool {
        let mut helping = self.helping.borrow_mut();
        if helping.is_empty() {
            return false;
        }
        let board = self.board.borrow();
        let Some(board) = board.as_ref() else {
            return false;
        };
        let mut did = false;
        for h in helping.iter_mut().filter(|h| !h.stopped) {
            let Some(slot) = board.slot(h.slot) else {
                continue;
            };
            while self.help_ok.get() {
                let Some((units, d)) = slot.claim_back() else {
                    break;
                };
                did = true;
                let bytes = split::byte_range(&units, d.len);
                let n = (bytes.end - bytes.start) as usize;
                // The getter names the process to write into: only the one that rank
                // proved to be (its published nonce) is written; another is refused.
                let written = d.len <= h.avail && self.reaches(h.dest, d.pid) && {
                    let start = bytes.start as usize;
                    // SAFETY: bytes.end <= d.len <= avail: inside the offered bytes,
                    // valid until the transfer ends (contract of `offer_split`; it is in
                    // `helping` until then).
                    let local = unsafe { std::slice::from_raw_parts(h.src.add(start), n) };
                    let remote = [cma::Piece {
                        addr: d.dst.wrapping_add(bytes.start),
                        len: n,
                    }];
                    match cma::write_to(d.pid, &remote, local) {
                        Ok(w) if w == n => true,
                        r => {
                            tracing::info!(
                                "rank {}: writing into its buffer (split copy) failed ({:?}); \
                                 this endpoint stops helping its receivers",
                                h.dest,
                                r.err()
                            );
                            self.help_ok.set(false);
                            false
                        }
                    }
                };
                if written {
                    slot.helped(units);
                    self.count(|s| s.written_for_peers += n as u64);
                } else {
                    // At most one failed range per slot: the getter reads it itself.
                    slot.failed(units);
                    h.stopped = true;
                    break;
                }
            }
        }
        did
    }

    /// Getter: reads `len` bytes at `addr` of `peer` into `dst` as a split copy with the
    /// peer, if it offered one; `None` if not (read alone). Returns after every byte is
    /// in place (or the read failed) and the peer no longer writes.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes that nothing else in this process
    /// writes until the call returns (the peer writes some through the kernel).
    pub(super) unsafe fn split_get(
        &self,
        peer: Peer,
        addr: u64,
        offer: Option<Offer>,
        dst: *mut u8,
        len: u64,
    ) -> Option<std::result::Result<(), CmaError>> {
        let offer = offer?;
        if !self.split_on || len < SPLIT_MIN {
            return None;
        }
        let units = split::units_for(len)?;
        let mut boards = self.peer_boards.borrow_mut();
        let board = boards
            .entry(peer.rank)
            .or_insert_with(|| {
                Board::open_peer(self.job.job_id, peer.rank, self.dpid)
                    .map_err(|e| tracing::debug!("rank {}: split-copy board: {e}", peer.rank))
                    .ok()
            })
            .as_ref()?;
        let slot = board.slot(offer.slot)?;
        let dest = split::Destination {
            dst: dst as u64,
            len,
            pid: std::process::id(),
        };
        let mut mine = slot.open(offer.msg, units, dest)?;
        let read = |units: &std::ops::Range<u32>| {
            // SAFETY: the units' bytes lie inside [0, len) of the destination (valid for
            // len bytes: contract of this function), and they are claimed by us alone:
            // nobody else writes them.
            unsafe { self.read_range(peer.pid, addr, dst, split::byte_range(units, len)) }
        };
        let mut result = Ok(());
        loop {
            // After a failure, go on claiming without reading: the split must end (and
            // the peer stop writing) before the buffer is handed back.
            if result.is_ok() {
                result = read(&mine).map(|_| ());
            }
            match slot.claim_front(units) {
                Some(next) => mine = next,
                None => break,
            }
        }
        let share = slot.sender_share(units);
        let mut spins: u32 = 0;
        let failed = loop {
            if let Some(f) = slot.sender_finished(share) {
                break f;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                if !crate::link::shm::process_alive(peer.pid, 0) {
                    // Gone in the middle of its units: they are ours now (and reading
                    // them fails, which fails the get).
                    break units - share..units;
                }
                // The peer may share this core.
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        };
        if result.is_ok() && !failed.is_empty() {
            result = read(&failed).map(|_| ());
        }
        let by_peer = split::byte_range(&(units - share..units), len);
        let failed = split::byte_range(&failed, len);
        self.count(|s| {
            s.written_by_peers += (by_peer.end - by_peer.start) - (failed.end - failed.start)
        });
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_given_back_and_shared_with_a_peer_mapping() {
        let job = 0x5917_0000 | std::process::id() & 0xffff;
        let mut own = Board::create(job, 3, 9).unwrap();
        let peer = Board::open_peer(job, 3, 9).unwrap();
        let a = own.take(11).unwrap();
        let b = own.take(12).unwrap();
        assert_ne!(a, b);
        // The peer's view is the same memory: it opens slot a for message 11 only.
        let dest = crate::link::shm::split::Destination {
            dst: 1,
            len: 1,
            pid: 1,
        };
        assert!(peer.slot(a).unwrap().open(12, 1, dest).is_none());
        assert!(peer.slot(a).unwrap().open(11, 1, dest).is_some());
        assert!(peer.slot(SLOTS as u16).is_none());
        own.give_back(a);
        own.give_back(a);
        let mut n = 0;
        while own.take(99).is_some() {
            n += 1;
        }
        assert_eq!(n, SLOTS - 1, "b is still in use; a was given back once");
        drop(peer);
        drop(own);
        assert!(
            Board::open_peer(job, 3, 9).is_err(),
            "unlinked with its owner"
        );
    }
}
