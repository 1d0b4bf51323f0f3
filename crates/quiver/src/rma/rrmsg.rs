//! RRMSG, the deposit seed's request/response library (D7): every transfer is
//! synchronized pair by pair, as NX moved long messages on a Paragon. The sender keeps
//! the data in its own send buffer and asks; the receiver, once its receive is posted,
//! pulls the data from there (a get: the response that carries the buffer) into its
//! final place, then acknowledges, which frees the sender's buffer:
//!
//! 1. request: the sender writes (offset, length) into its slot of the receiver's
//!    control window and counts it there ([`Rma::put_notify`]);
//! 2. response with the data: the receiver reads the slot and gets the bytes from the
//!    sender's send window ([`Rma::get`]: request and answer on the wire);
//! 3. acknowledgement: the receiver counts in its slot of the sender's control window,
//!    for which the sender's `send` waits.
//!
//! So a `send` returns when the receiver has the data (a rendezvous; a rank does not
//! send to itself): order sends and
//! receives so that they meet (in an all-to-all's rounds, the lower rank of each pair
//! sends first), or a send waits for a receive that waits for it. The control messages
//! of every pair are independent, which is why the seed finds RRMSG slower than DMSG
//! and impossible to congestion-control with global barriers.

use super::{timed, Phases, Rma, Window};
use crate::error::{Error, Result};
use std::cell::Cell;
use std::time::Duration;

/// Bytes of one rank's slot in a control window: request word, offset, length (one
/// cache line), then the acknowledgement word (another).
const SLOT: u64 = 128;
const ACK: u64 = 64;

/// One rank's RRMSG endpoint over an [`Rma`]: its send buffer and its control window.
pub struct Rrmsg<'a> {
    rma: &'a Rma,
    send: Window,
    control: Window,
    transfer: Cell<Duration>,
    waiting: Cell<Duration>,
    copy: Cell<Duration>,
}

impl<'a> Rrmsg<'a> {
    /// Opens RRMSG on `rma` with a send buffer of `capacity` bytes (the longest message).
    /// Collective: it allocates two windows, in the same order on every rank.
    pub fn open(rma: &'a Rma, capacity: usize) -> Result<Rrmsg<'a>> {
        let size = {
            use crate::engine::station::Footing;
            rma.endpoint().station().job().size
        };
        Ok(Rrmsg {
            rma,
            send: rma.allocate(capacity)?,
            control: rma.allocate((u64::from(size) * SLOT) as usize)?,
            transfer: Cell::default(),
            waiting: Cell::default(),
            copy: Cell::default(),
        })
    }

    fn me(&self) -> u32 {
        use crate::engine::station::Footing;
        self.rma.endpoint().station().job().rank
    }

    /// Sends `data` to `to`: buffered here, requested there, returns once `to` pulled it.
    pub fn send(&self, to: u32, data: &[u8]) -> Result<()> {
        if data.len() > self.send.len() {
            return Err(Error::MessageTooLarge {
                len: data.len(),
                max: self.send.len(),
            });
        }
        // The copy into the send buffer (the seed's "buffering data at the sender").
        timed(&self.copy, || self.send.write(0, data))?;
        let slot = u64::from(self.me()) * SLOT;
        let mut request = [0u8; 16];
        request[8..].copy_from_slice(&(data.len() as u64).to_le_bytes());
        timed(&self.waiting, || {
            self.rma
                .put_notify(to, &self.control, slot + 8, &request, slot)?;
            // The receiver's acknowledgement frees the buffer.
            self.rma
                .wait_counter(&self.control, u64::from(to) * SLOT + ACK, 1)
        })
    }

    /// Where this endpoint's time went so far: pulls are transfer; requests,
    /// acknowledgements and the waits for them are control; the copy into the send
    /// buffer is copy.
    pub fn phases(&self) -> Phases {
        Phases {
            transfer: self.transfer.get(),
            control: self.waiting.get(),
            copy: self.copy.get(),
        }
    }

    /// Receives the next message from `from` into `dst`; returns its length. A message
    /// longer than `dst` fills it and is [`Error::Truncated`] (the sender is released
    /// all the same).
    pub fn recv(&self, from: u32, dst: &mut [u8]) -> Result<usize> {
        let slot = u64::from(from) * SLOT;
        timed(&self.waiting, || {
            self.rma.wait_counter(&self.control, slot, 1)
        })?;
        let mut request = [0u8; 16];
        self.control.read(slot as usize + 8, &mut request)?;
        let offset = u64::from_le_bytes(request[..8].try_into().expect("8 bytes"));
        let len = u64::from_le_bytes(request[8..].try_into().expect("8 bytes"));
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let n = len.min(dst.len());
        // The pull: the data moves straight into its final place.
        let pulled = timed(&self.transfer, || {
            self.rma.get(from, &self.send, offset, &mut dst[..n])
        });
        let ack = u64::from(self.me()) * SLOT + ACK;
        timed(&self.waiting, || {
            self.rma.put_notify(from, &self.control, ack, &[], ack)
        })?;
        pulled?;
        if n < len {
            return Err(Error::Truncated {
                len: len as u64,
                capacity: dst.len(),
                rank: from,
                tag: 0,
            });
        }
        Ok(len)
    }
}
