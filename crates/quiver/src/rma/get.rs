//! The intra-node get: bytes of a same-node peer's memory into a local buffer, from the
//! peer's shared buffer, by cross-memory attach (alone, or as a split copy with the
//! peer), or on the pull thread; and the completions of the pull thread's gets.

use super::{puller, GetError, Got, Peer, Remote, SingleCopy};
use crate::link::cma::{CmaError, Piece};
use std::ops::Range;

impl SingleCopy {
    /// Copies the bytes of `peer` at `remote` into `dst` (`dst.len()` of them), and
    /// returns once every byte is in place ([`Got::Shared`], [`Got::Attached`]), or
    /// nothing was copied because no path reaches the peer ([`Got::Unreachable`]: the
    /// caller has the peer send them). Never [`Got::Queued`].
    // The blocking form, for the coming RMA personality; tagged starts its gets with
    // `start_get`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn get(&self, peer: Peer, remote: Remote, dst: &mut [u8]) -> Result<Got, GetError> {
        let len = dst.len() as u64;
        // SAFETY: `dst` is borrowed uniquely for the call: valid for `len` bytes that
        // nothing else in this process touches.
        unsafe { self.get_now(peer, remote, dst.as_mut_ptr(), len) }
    }

    /// Like [`SingleCopy::get`] into the `len` bytes at `dst`, but a large get by attach goes to
    /// the pull thread when it runs: then [`Got::Queued`], and [`SingleCopy::completed`] reports
    /// the end of get `op` (a number of the caller's).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes, which nothing else reads or writes
    /// until the get is over: when this returns, or for [`Got::Queued`] until
    /// [`SingleCopy::completed`] has reported `op`.
    pub(crate) unsafe fn start_get(
        &self,
        op: u64,
        peer: Peer,
        remote: Remote,
        dst: *mut u8,
        len: u64,
    ) -> Result<Got, GetError> {
        if let Remote::Memory { addr, .. } = remote {
            let mut puller = self.puller.borrow_mut();
            if let Some(p) = puller.as_mut() {
                if len >= puller::MIN_OFFLOADED {
                    // Checked once (a refused pid is counted once): get_now would say
                    // the same.
                    if !self.attachable(peer) {
                        return Ok(Got::Unreachable);
                    }
                    p.submit(puller::Job {
                        op,
                        pid: peer.pid,
                        remote: Piece {
                            addr,
                            len: len as usize,
                        },
                        dst: dst as usize,
                    })
                    .map_err(GetError::Thread)?;
                    return Ok(Got::Queued);
                }
            }
        }
        // SAFETY: contract of this function.
        unsafe { self.get_now(peer, remote, dst, len) }
    }

    /// A get the pull thread has finished, if any: its number, and [`Got::Attached`], or
    /// [`Got::Unreachable`] (attach was refused; nothing to rely on in the destination).
    pub(crate) fn completed(&self) -> Option<(u64, Result<Got, GetError>)> {
        let finished = match self.puller.borrow_mut().as_mut() {
            Some(p) if p.pending > 0 => p.try_finished(),
            _ => None,
        }?;
        let result = match finished.result {
            Ok(()) => Ok(Got::Attached),
            // Refused: recorded, so that later gets do not try again.
            Err(e) if e.unavailable().is_some() => {
                self.reach.cma.record(0, &e);
                Ok(Got::Unreachable)
            }
            Err(e) => Err(GetError::Attach(e)),
        };
        Some((finished.op, result))
    }

    /// # Safety
    /// As [`SingleCopy::start_get`], with the get over when this returns.
    unsafe fn get_now(
        &self,
        peer: Peer,
        remote: Remote,
        dst: *mut u8,
        len: u64,
    ) -> Result<Got, GetError> {
        match remote {
            Remote::Shared { window, offset } => {
                // SAFETY: contract of this function.
                let dst = unsafe { std::slice::from_raw_parts_mut(dst, len as usize) };
                Ok(match self.windows.read(peer.rank, window, offset, dst)? {
                    true => Got::Shared,
                    false => Got::Unreachable,
                })
            }
            Remote::Memory { addr, split } => {
                if !self.attachable(peer) {
                    return Ok(Got::Unreachable);
                }
                // SAFETY: dst is valid for len bytes that nothing else in this process
                // writes until the get is over (contract of this function).
                let outcome = match unsafe { self.split_get(peer, addr, split, dst, len) } {
                    Some(r) => r,
                    // SAFETY: dst is valid for len bytes (contract of this function); without
                    // a split nothing else writes them.
                    None => unsafe { self.read_range(peer.pid, addr, dst, 0..len) }.map(|_| ()),
                };
                match outcome {
                    Ok(()) => Ok(Got::Attached),
                    // Refused for good (logged once by the state).
                    Err(e) if e.unavailable().is_some() => Ok(Got::Unreachable),
                    Err(e) => Err(GetError::Attach(e)),
                }
            }
        }
    }

    /// Whether this endpoint reads `peer`'s memory by cross-memory attach (not its own:
    /// a message to itself is sent).
    fn attachable(&self, peer: Peer) -> bool {
        self.cma_on
            && self.reach.cma.is_usable()
            && peer.rank != self.rank
            && self.reaches(peer.rank, peer.pid)
    }

    /// Reads bytes `range` of the transfer that starts at `addr` in process `pid` into the
    /// same range of `dst`, with cross-memory attach.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `range.end` bytes, and nothing else may write
    /// `dst[range]` during the call.
    pub(super) unsafe fn read_range(
        &self,
        pid: u32,
        addr: u64,
        dst: *mut u8,
        range: Range<u64>,
    ) -> Result<usize, CmaError> {
        let n = (range.end - range.start) as usize;
        // SAFETY: contract of this function.
        let local = unsafe { std::slice::from_raw_parts_mut(dst.add(range.start as usize), n) };
        let remote = [Piece {
            addr: addr.saturating_add(range.start),
            len: n,
        }];
        self.reach.cma.read_from(pid, &remote, local)
    }
}
