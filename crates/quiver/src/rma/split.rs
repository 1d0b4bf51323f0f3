//! The split-copy board of a tagged endpoint: [`SLOTS`] [`SplitSlot`]s in a
//! shared-memory object of the sender, one per large same-node message in flight, where
//! sender and receiver divide the pull of that message (see `link::shm::split`).
//!
//! The object is `/quiver-UID-JOB-RANK-sDPID` (mode 0600, removed with the job's other
//! objects), created zero-filled by the sending endpoint and mapped writable by each
//! receiver on first use. A slot number from a peer is checked against [`SLOTS`]; a slot
//! that serves another message is not opened (the receiver then pulls alone).

use crate::error::Result;
use crate::link::shm::object::{self, Mapping};
use crate::link::shm::split::SplitSlot;

/// Slots of a board: large same-node messages one endpoint can have in flight with a
/// split copy at once (more go without one).
pub(crate) const SLOTS: usize = 64;

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
