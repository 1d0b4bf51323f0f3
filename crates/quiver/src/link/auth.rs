//! Authenticated frames (`QUIVER_AUTH=on`): a link that signs every datagram it sends
//! and checks every one it receives, for networks shared with hosts that are not
//! trusted. Without it a frame is the job's if it carries the job's id and 32-bit token
//! and comes from a rank's published address: enough against accidents (another job,
//! a stale process), not against a host that reads the wire or forges addresses.
//!
//! Each datagram gets a 16-byte tag appended: the first 16 bytes of the BLAKE3 keyed
//! hash of the datagram under the job's frame key (`JobShared::frame_key`, derived from
//! the store's secret, never sent). A received datagram whose tag is wrong or missing is
//! dropped and counted (`EndpointStats::dropped_unauthenticated`) before anything reads
//! it; the layers above see the datagram without its tag. Every rank of a job must use
//! the same setting (a signed frame is garbage to an unsigned endpoint, and the other
//! way round).
//!
//! What it does not do: hide the bytes (no encryption), or stop a recorded frame from
//! being sent again (the channels drop duplicates of frames in their window; a replay
//! long after may be taken for a new frame once sequence numbers wrap).

use super::{Datagram, Link, LinkCaps, LinkCounters};
use crate::error::Result;
use std::time::Duration;

/// Bytes of the tag appended to each datagram.
pub(crate) const TAG_LEN: usize = 16;

/// A link whose datagrams carry a keyed MAC ([module documentation](self)).
pub(crate) struct Authed<L: Link> {
    inner: L,
    key: [u8; 32],
    /// A signed datagram (or run of them) on its way out.
    scratch: Vec<u8>,
    /// Datagrams received with a wrong or missing tag.
    rejected: u64,
}

impl<L: Link> Authed<L> {
    /// Wraps `inner`, signing and checking with `key`.
    pub(crate) fn new(inner: L, key: [u8; 32]) -> Authed<L> {
        Authed {
            inner,
            key,
            scratch: Vec::new(),
            rejected: 0,
        }
    }

    /// The wrapped link.
    pub(crate) fn inner(&self) -> &L {
        &self.inner
    }

    fn tag(&self, bytes: &[u8]) -> [u8; TAG_LEN] {
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&blake3::keyed_hash(&self.key, bytes).as_bytes()[..TAG_LEN]);
        tag
    }

    /// Appends `datagram` and its tag to the scratch buffer.
    fn sign_into_scratch(&mut self, datagram: &[u8]) {
        let tag = self.tag(datagram);
        self.scratch.extend_from_slice(datagram);
        self.scratch.extend_from_slice(&tag);
    }

    /// Whether `datagram` (tag included) carries its own tag, in constant time.
    fn genuine(&self, datagram: &[u8]) -> bool {
        let Some(body_len) = datagram.len().checked_sub(TAG_LEN) else {
            return false;
        };
        let (body, tag) = datagram.split_at(body_len);
        let want = self.tag(body);
        tag.iter()
            .zip(want.iter())
            .fold(0u8, |d, (a, b)| d | (a ^ b))
            == 0
    }
}

impl<L: Link> Link for Authed<L> {
    type Dest = L::Dest;

    fn caps(&self) -> LinkCaps {
        let mut caps = self.inner.caps();
        caps.max_datagram -= TAG_LEN;
        caps.min_datagram = caps.min_datagram.saturating_sub(TAG_LEN);
        caps
    }

    fn advertise(&self) -> String {
        self.inner.advertise()
    }

    fn resolve(&self, advertised: &str) -> std::result::Result<L::Dest, String> {
        self.inner.resolve(advertised)
    }

    fn max_datagram_to(&self, to: &L::Dest) -> usize {
        self.inner.max_datagram_to(to) - TAG_LEN
    }

    fn broadcast_dest(&self) -> Option<L::Dest> {
        self.inner.broadcast_dest()
    }

    fn broadcast_medium(&self) -> &'static str {
        self.inner.broadcast_medium()
    }

    fn sent_from(&self, slot: u32, to: &L::Dest) -> bool {
        self.inner.sent_from(slot, to)
    }

    /// Receives what the inner link has, keeps what carries its tag (handed on without
    /// it) and gives the rest back at once.
    fn recv_batch(&mut self, out: &mut Vec<Datagram>) -> Result<()> {
        let from = out.len();
        let received = self.inner.recv_batch(out);
        let mut kept = from;
        for i in from..out.len() {
            let d = out[i];
            if self.genuine(&self.inner.slot(d.slot)[..d.len]) {
                out[kept] = Datagram {
                    slot: d.slot,
                    len: d.len - TAG_LEN,
                };
                kept += 1;
            } else {
                self.rejected += 1;
                self.inner.free_slot(d.slot);
            }
        }
        out.truncate(kept);
        received
    }

    fn slot(&self, slot: u32) -> &[u8] {
        self.inner.slot(slot)
    }

    fn free_slot(&mut self, slot: u32) {
        self.inner.free_slot(slot)
    }

    fn send(&mut self, now: Duration, to: &L::Dest, datagram: &[u8]) -> Result<()> {
        self.scratch.clear();
        self.sign_into_scratch(datagram);
        let signed = std::mem::take(&mut self.scratch);
        let sent = self.inner.send(now, to, &signed);
        self.scratch = signed;
        sent
    }

    fn send_batch(
        &mut self,
        now: Duration,
        to: &L::Dest,
        datagrams: &[&[u8]],
        max_run: usize,
    ) -> Result<()> {
        self.scratch.clear();
        let mut ends = Vec::with_capacity(datagrams.len());
        for d in datagrams {
            self.sign_into_scratch(d);
            ends.push(self.scratch.len());
        }
        let signed = std::mem::take(&mut self.scratch);
        let mut parts: Vec<&[u8]> = Vec::with_capacity(ends.len());
        let mut start = 0;
        for end in ends {
            parts.push(&signed[start..end]);
            start = end;
        }
        let sent = self.inner.send_batch(now, to, &parts, max_run);
        drop(parts);
        self.scratch = signed;
        sent
    }

    fn blocked_slot(&self) -> Option<u32> {
        self.inner.blocked_slot()
    }

    fn next_approaching(&mut self) -> Option<u32> {
        self.inner.next_approaching()
    }

    fn send_unfaulted(&mut self, now: Duration, to: &L::Dest, datagram: &[u8]) -> Result<()> {
        self.scratch.clear();
        self.sign_into_scratch(datagram);
        let signed = std::mem::take(&mut self.scratch);
        let sent = self.inner.send_unfaulted(now, to, &signed);
        self.scratch = signed;
        sent
    }

    fn poll_timeout(&self) -> Option<Duration> {
        self.inner.poll_timeout()
    }

    fn handle_timeout(&mut self, now: Duration) -> Result<()> {
        self.inner.handle_timeout(now)
    }

    fn counters(&self) -> LinkCounters {
        LinkCounters {
            unauthenticated: self.rejected,
            ..self.inner.counters()
        }
    }
}
