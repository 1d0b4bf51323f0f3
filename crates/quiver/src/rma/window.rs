//! Shared buffers: memory a sender allocates from the job's shared pool
//! ([`Tagged::alloc_shared`](crate::tagged::Tagged::alloc_shared)) so that a same-node
//! receiver reads the pulled part in place, with one copy and without the permission that
//! cross-memory attach needs.
//!
//! A shared buffer is a named shared-memory object (`link::shm::object`)
//! `/quiver-UID-JOB-RANK-bN`, mapped by its owner and, on first use, by each receiver.
//! Buffer numbers are never reused within an endpoint, so a receiver's cached mapping
//! always names the buffer the sender meant. [`Windows`] keeps an endpoint's own buffers
//! (to name bytes inside them to a peer) and the peers' buffers it has mapped; a read
//! from a peer's buffer is checked against the buffer's size.

use super::GetError;
use crate::error::{Error, Result};
use crate::link::shm::object::{self, Mapping};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

/// Peers' shared buffers a receiver keeps mapped.
const PEER_BUFS_CACHED: usize = 16;

/// Buffer numbers from here on are [`Published`] ones, which their owner chooses; the
/// allocator's numbers stay below.
pub(crate) const PUBLISHED_IDS: u32 = 1 << 31;

/// The name of shared buffer `id` of `rank` in job `job_id`.
pub(crate) fn name(job_id: u32, rank: u32, id: u32) -> String {
    format!("/quiver-{}-{job_id:08x}-{rank}-b{id}", object::uid())
}

/// One endpoint's shared buffers, and the peers' buffers mapped here.
pub(crate) struct Windows {
    job_id: u32,
    rank: u32,
    /// This endpoint's live shared buffers: (address, length, number).
    own: RefCell<Vec<(usize, usize, u32)>>,
    next: Cell<u32>,
    /// Peers' shared buffers mapped here, most recent last: ((rank, number), mapping).
    peers: RefCell<VecDeque<((u32, u32), Mapping)>>,
}

/// Memory from the job's shared pool ([`Tagged::alloc_shared`](crate::tagged::Tagged::alloc_shared)):
/// a send from it is read in place by a same-node receiver. Dereferences to its bytes;
/// freed when dropped.
pub struct SharedBuf<'t> {
    windows: &'t Windows,
    map: Mapping,
    id: u32,
    name: String,
}

impl std::ops::Deref for SharedBuf<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is ours, readable and writable, for the life of self.
        unsafe { std::slice::from_raw_parts(self.map.ptr(), self.map.len()) }
    }
}

impl std::ops::DerefMut for SharedBuf<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; &mut self makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr(), self.map.len()) }
    }
}

impl Drop for SharedBuf<'_> {
    fn drop(&mut self) {
        self.windows.own.borrow_mut().retain(|b| b.2 != self.id);
        object::unlink(&self.name);
    }
}

impl Windows {
    pub(crate) fn new(job_id: u32, rank: u32) -> Windows {
        Windows {
            job_id,
            rank,
            own: RefCell::new(Vec::new()),
            next: Cell::new(1),
            peers: RefCell::new(VecDeque::new()),
        }
    }

    /// Allocates shared buffer of `len` bytes (zero-filled) under a new number.
    pub(crate) fn alloc(&self, len: usize) -> Result<SharedBuf<'_>> {
        let id = self.next.get();
        if id >= PUBLISHED_IDS {
            return Err(Error::Config(
                "this endpoint has allocated 2^31 shared buffers".into(),
            ));
        }
        self.next.set(id + 1);
        let name = name(self.job_id, self.rank, id);
        let map = Mapping::open(&name, Some(len))?;
        self.own.borrow_mut().push((map.ptr() as usize, len, id));
        Ok(SharedBuf {
            windows: self,
            map,
            id,
            name,
        })
    }

    /// The buffer number and offset of `data` when it lies inside one of this endpoint's
    /// shared buffers.
    pub(crate) fn locate(&self, data: &[u8]) -> Option<(u32, u64)> {
        let (at, len) = (data.as_ptr() as usize, data.len());
        self.own
            .borrow()
            .iter()
            .find(|&&(start, blen, _)| at >= start && at + len <= start + blen)
            .map(|&(start, _, id)| (id, (at - start) as u64))
    }

    /// Copies `dst.len()` bytes at `offset` of shared buffer `id` of `rank` into `dst`.
    /// `Ok(false)` (nothing copied) if the buffer cannot be mapped.
    pub(crate) fn read(
        &self,
        rank: u32,
        id: u32,
        offset: u64,
        dst: &mut [u8],
    ) -> std::result::Result<bool, GetError> {
        let mut bufs = self.peers.borrow_mut();
        let i = match bufs.iter().position(|(k, _)| *k == (rank, id)) {
            Some(i) => i,
            None => {
                let name = name(self.job_id, rank, id);
                // A published buffer is read whole, again and again: mapped at once.
                let open = if id >= PUBLISHED_IDS {
                    Mapping::open_populated
                } else {
                    Mapping::open
                };
                match open(&name, None) {
                    Ok(m) => {
                        if bufs.len() == PEER_BUFS_CACHED {
                            bufs.pop_front();
                        }
                        bufs.push_back(((rank, id), m));
                        bufs.len() - 1
                    }
                    Err(e) => {
                        tracing::debug!("shared buffer {name}: {e}; pulling by request");
                        return Ok(false);
                    }
                }
            }
        };
        let map = &bufs[i].1;
        match map.get(offset, dst.len()) {
            Some(src) => {
                // Around the CPU's slow string copy at short distances (`copy_bytes`): a
                // heap buffer's 16-byte offset from a page-aligned place cost 10x.
                crate::link::copy_into(dst, src);
                Ok(true)
            }
            None => Err(GetError::OutOfBounds {
                rank,
                window: id,
                offset,
                len: dst.len() as u64,
                size: map.len(),
            }),
        }
    }
}

/// A shared buffer under a number its owner chooses (at least [`PUBLISHED_IDS`]), for a
/// buffer a protocol publishes once under a well-known number (the ports' broadcast
/// ring): peers read it with [`Windows::read`] like any other. Only its owner writes
/// it, with [`Published::write`]; unlinked when dropped.
pub(crate) struct Published(SharedObject);

impl Published {
    /// Creates buffer `id` (at least [`PUBLISHED_IDS`]) of `len` bytes of `rank` in job
    /// `job_id`.
    pub(crate) fn create(job_id: u32, rank: u32, id: u32, len: usize) -> Result<Published> {
        SharedObject::create(job_id, rank, id, len, false).map(Published)
    }

    /// Bytes of the buffer.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Copies `data` to `offset`; false (nothing written) when it does not fit.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> bool {
        if offset
            .checked_add(data.len())
            .is_none_or(|end| end > self.0.len())
        {
            return false;
        }
        // SAFETY: offset + len <= the mapping's length; the mapping is this owner's and
        // writable (created here); readers read only ranges their owner handed them
        // after writing them (a protocol's ordering), so no read races this write.
        unsafe { crate::link::copy_bytes(data.as_ptr(), self.0.ptr().add(offset), data.len()) };
        true
    }

    /// Unmaps the buffer but leaves its name, for peers that still have to read it;
    /// the job's clean-up removes it with the job's other objects.
    pub(crate) fn keep_name(mut self) {
        self.0.owned = None;
    }
}

/// A named shared object of the job that a protocol lays out itself (the ports'
/// mailboxes and port buffers): created by its owner (unlinked when dropped) or mapped
/// writable by a peer of the node. Reached through its address; whoever lays it out
/// says how its bytes are shared (atomics, or one writer at a time).
pub(crate) struct SharedObject {
    map: Mapping,
    /// The owner's name, unlinked when dropped; `None` for a peer's mapping.
    owned: Option<String>,
}

// SAFETY: a handle to shared memory; what is shared through it and how is the user's
// contract (see the type's documentation), as for any process of the node.
unsafe impl Send for SharedObject {}
// SAFETY: as above.
unsafe impl Sync for SharedObject {}

impl SharedObject {
    /// Creates object `id` (at least [`PUBLISHED_IDS`]) of `len` bytes (zeroed, reserved
    /// and mapped at once) of `rank` in job `job_id`, replacing one a previous owner left
    /// under that name when `replace`.
    pub(crate) fn create(
        job_id: u32,
        rank: u32,
        id: u32,
        len: usize,
        replace: bool,
    ) -> Result<SharedObject> {
        if id < PUBLISHED_IDS {
            return Err(Error::Config(format!(
                "shared object number {id} is the allocator's"
            )));
        }
        let name = name(job_id, rank, id);
        if replace {
            object::unlink(&name);
        }
        // Reserved and mapped whole now: a full /dev/shm is an error here, not a
        // SIGBUS at the first write.
        let map = if len == 0 {
            Mapping::open(&name, Some(0))?
        } else {
            Mapping::open_populated(&name, Some(len))?
        };
        Ok(SharedObject {
            map,
            owned: Some(name),
        })
    }

    /// Maps object `id` of peer `rank` in job `job_id`, readable and writable (it must be
    /// this user's, mode 0600, as every object of the job).
    pub(crate) fn open_peer(job_id: u32, rank: u32, id: u32) -> Result<SharedObject> {
        let map = Mapping::open_writable(&name(job_id, rank, id))?;
        Ok(SharedObject { map, owned: None })
    }

    /// The first byte (page-aligned; dangling when empty).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.map.ptr()
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Removes the owner's name now (the mapping stays): no peer maps it any more.
    pub(crate) fn unlink(&self) {
        if let Some(name) = &self.owned {
            object::unlink(name);
        }
    }
}

impl Drop for SharedObject {
    fn drop(&mut self) {
        if let Some(name) = &self.owned {
            object::unlink(name);
        }
    }
}
