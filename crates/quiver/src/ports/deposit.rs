//! The shared memory of the direct deposit inside a node: the receiver's port buffers a
//! sender of the node can write ([`PortBuffer`]), the receiver's mailboxes
//! ([`MailboxArea`], one [`Mailbox`] per port), and a sender's mappings of its peers'
//! ones ([`PeerDeposits`]).
//!
//! Names: the objects are the job's shared buffers (`rma::window::name`) under numbers
//! of their own: a rank's mailboxes on DPID `d` are `MAILBOX_IDS | d` (known to every
//! sender without asking; ports reopened on the DPID make a new object of the same
//! name, and a sender still holding the old one finds it `CLOSED` and copies), its port
//! buffers `BUFFER_IDS | n` with `n` drawn from a counter of the process (never reused
//! while it runs). The broadcast ring's numbers (`app.rs`) keep bits 29 and 30 clear.
//!
//! Guarantees: a sender writes only a mapping it checked (the object is its own user's
//! with mode 0600, as every job object) and only inside it; a mailbox area shorter than
//! 256 mailboxes is refused; no value read from a peer's memory makes this module panic.

use super::mailbox::{Mailbox, WORDS};
use crate::error::{Error, Result};
use crate::rma::window::{SharedObject, PUBLISHED_IDS};
use crate::sync::atomic::AtomicU64;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};

/// Numbers of the mailbox areas (bits 29 and 30 set, the DPID below).
pub(super) const MAILBOX_IDS: u32 = PUBLISHED_IDS | 3 << 29;
/// Numbers of port buffers (bit 30 set, bit 29 clear, a counter below).
pub(super) const BUFFER_IDS: u32 = PUBLISHED_IDS | 1 << 30;
const BUFFER_COUNTER: u32 = (1 << 29) - 1;

/// Bytes of a mailbox area: a mailbox for each of the 256 ports.
const AREA_BYTES: usize = 256 * WORDS * 8;

/// Port buffers of peers a sender keeps mapped.
const PEER_BUFFERS_CACHED: usize = 16;

/// A receive buffer in this node's shared memory ([`crate::ports::Ports::buffer`]):
/// bound to a port, the node's other ranks write their messages straight into it, and
/// its handler reads them there (GAMMA's delivery without an intermediate copy). The
/// application owns it: bound, it belongs to the port; taken back (unbind, a handler's
/// rebind), it is the application's alone again, and nobody writes it any more.
/// Dereferences to its bytes; freed when dropped.
pub struct PortBuffer {
    map: SharedObject,
    id: u32,
}

// SAFETY: a PortBuffer owns its mapping; the bytes are reached through &self/&mut self
// only, and peers write them only while the port table holds the buffer armed (never
// while the application has it, see the module documentation of `mailbox`).
unsafe impl Send for PortBuffer {}

impl PortBuffer {
    /// A new buffer of `len` bytes (zero-filled) of `rank` of job `job_id`.
    pub(super) fn create(job_id: u32, rank: u32, len: usize) -> Result<PortBuffer> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        if n > BUFFER_COUNTER {
            return Err(Error::Config(
                "this process has made 2^29 port buffers".into(),
            ));
        }
        let id = BUFFER_IDS | n;
        // Reserved now (a full /dev/shm is an error here, not a SIGBUS at a write).
        let map = SharedObject::create(job_id, rank, id, len, false)?;
        Ok(PortBuffer { map, id })
    }

    /// Its number among the rank's shared buffers (what a mailbox names).
    pub(super) fn id(&self) -> u32 {
        self.id
    }
}

impl std::ops::Deref for PortBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is ours, readable and writable, for the life of self; no
        // peer writes it while a reference exists (the table hands out views only of a
        // buffer no sender holds a claim on).
        unsafe { std::slice::from_raw_parts(self.map.ptr(), self.map.len()) }
    }
}

impl std::ops::DerefMut for PortBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; &mut self makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr(), self.map.len()) }
    }
}

impl std::fmt::Debug for PortBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortBuffer")
            .field("len", &self.map.len())
            .finish()
    }
}

/// The mailboxes of a rank's ports: its own (created, unlinked when dropped), or a
/// peer's, mapped writable by a sender.
pub(super) struct MailboxArea {
    map: SharedObject,
}

impl MailboxArea {
    /// Creates the mailboxes of `rank`'s ports on `dpid` (all `IDLE`), replacing an
    /// object a previous opening left.
    pub(super) fn create(job_id: u32, rank: u32, dpid: u16) -> Result<MailboxArea> {
        let map = SharedObject::create(
            job_id,
            rank,
            MAILBOX_IDS | u32::from(dpid),
            AREA_BYTES,
            true,
        )?;
        Ok(MailboxArea { map })
    }

    /// Maps the mailboxes of peer `rank`'s ports on `dpid`, if it made them.
    pub(super) fn open_peer(job_id: u32, rank: u32, dpid: u16) -> Result<MailboxArea> {
        let map = SharedObject::open_peer(job_id, rank, MAILBOX_IDS | u32::from(dpid))?;
        if map.len() < AREA_BYTES {
            return Err(Error::Config(format!(
                "the mailboxes of rank {rank}: {} bytes, not a mailbox area",
                map.len()
            )));
        }
        Ok(MailboxArea { map })
    }

    /// Raises or lowers the flag that says this rank holds messages aside (the ports'
    /// table parks some): senders then deposit nothing. Release: raised before the
    /// parked message's slot is released, so a sender that saw its ring drained sees it.
    pub(super) fn set_parking(&self, on: bool) {
        self.parking_word()
            .store(u64::from(on), crate::sync::atomic::Ordering::Release);
    }

    /// Whether the flag is up (acquire).
    pub(super) fn parking(&self) -> bool {
        self.parking_word()
            .load(crate::sync::atomic::Ordering::Acquire)
            != 0
    }

    /// The flag's word: in the reserved port's line, which no mailbox uses.
    fn parking_word(&self) -> &AtomicU64 {
        let at = usize::from(super::RESERVED_PORT) * WORDS * 8 + (WORDS - 1) * 8;
        // SAFETY: as in `port`: inside the mapping (checked when mapped), 8-byte
        // aligned, alive as long as self, only ever accessed atomically.
        unsafe { &*(self.map.ptr().add(at) as *const AtomicU64) }
    }

    /// Port `port`'s mailbox.
    pub(super) fn port(&self, port: u8) -> Mailbox<'_> {
        // The mapping is page-aligned and at least AREA_BYTES long (checked when mapped).
        let at = usize::from(port) * WORDS * 8;
        // SAFETY: `at .. at + 64` lies in the live mapping, 8-byte aligned; every access
        // to it, in every process, is atomic (AtomicU64 has the layout of u64).
        let words = unsafe { &*(self.map.ptr().add(at) as *const [AtomicU64; WORDS]) };
        Mailbox::new(words)
    }
}

/// A sender's mappings of its peers' mailboxes and port buffers.
pub(super) struct PeerDeposits {
    job_id: u32,
    dpid: u16,
    /// Peers' mailbox areas by rank.
    areas: RefCell<Vec<(u32, MailboxArea)>>,
    /// Peers' port buffers, most recently used last.
    buffers: RefCell<VecDeque<((u32, u32), SharedObject)>>,
}

impl PeerDeposits {
    pub(super) fn new(job_id: u32, dpid: u16) -> PeerDeposits {
        PeerDeposits {
            job_id,
            dpid,
            areas: RefCell::new(Vec::new()),
            buffers: RefCell::new(VecDeque::new()),
        }
    }

    /// Whether `rank` has mailboxes here (mapping them on first use; a rank without
    /// is asked again at the next binding).
    pub(super) fn reaches(&self, rank: u32) -> bool {
        let mut areas = self.areas.borrow_mut();
        if areas.iter().any(|(r, _)| *r == rank) {
            return true;
        }
        match MailboxArea::open_peer(self.job_id, rank, self.dpid) {
            Ok(area) => {
                areas.push((rank, area));
                true
            }
            Err(e) => {
                tracing::debug!("mailboxes of rank {rank}: {e}; copying");
                false
            }
        }
    }

    /// Whether `rank` holds messages aside ([`MailboxArea::set_parking`]).
    pub(super) fn receiver_parks(&self, rank: u32) -> bool {
        let areas = self.areas.borrow();
        areas
            .iter()
            .find(|(r, _)| *r == rank)
            .is_none_or(|(_, a)| a.parking())
    }

    /// Runs `f` on `rank`'s mailbox of `port` (`None` when it has none).
    pub(super) fn with_mailbox<T>(
        &self,
        rank: u32,
        port: u8,
        f: impl FnOnce(Mailbox<'_>) -> T,
    ) -> Option<T> {
        let areas = self.areas.borrow();
        let (_, area) = areas.iter().find(|(r, _)| *r == rank)?;
        Some(f(area.port(port)))
    }

    /// Writes `data` at the start of port buffer `id` of `rank`; false (nothing written)
    /// when it cannot be mapped or is shorter.
    pub(super) fn write(&self, rank: u32, id: u32, data: &[u8]) -> bool {
        if id & !BUFFER_COUNTER != BUFFER_IDS {
            return false;
        }
        let mut bufs = self.buffers.borrow_mut();
        let i = match bufs.iter().position(|(k, _)| *k == (rank, id)) {
            Some(i) => {
                // Most recently used last.
                let hit = bufs.remove(i).expect("found at i");
                bufs.push_back(hit);
                bufs.len() - 1
            }
            None => match SharedObject::open_peer(self.job_id, rank, id) {
                Ok(m) => {
                    if bufs.len() == PEER_BUFFERS_CACHED {
                        bufs.pop_front();
                    }
                    bufs.push_back(((rank, id), m));
                    bufs.len() - 1
                }
                Err(e) => {
                    tracing::debug!("port buffer {id} of rank {rank}: {e}; copying");
                    return false;
                }
            },
        };
        let map = &bufs[i].1;
        if data.len() > map.len() {
            return false;
        }
        // SAFETY: data.len() <= the mapping's length; the mapping is writable and alive;
        // the receiver reads these bytes only after the claim's release (`mailbox`), and
        // no other sender writes them (one claim per arming).
        unsafe { crate::link::copy_bytes(data.as_ptr(), map.ptr(), data.len()) };
        true
    }
}
