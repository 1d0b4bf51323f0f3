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
        self.next.set(id.checked_add(1).ok_or_else(|| {
            Error::Config("this endpoint has allocated 2^32 shared buffers".into())
        })?);
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
                match Mapping::open(&name, None) {
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
                dst.copy_from_slice(src);
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
