//! PVM-like buffered messages, the deposit seed's postal library (D7): the application
//! packs its data into a send buffer (copy 1), [`Pvm::send`] returns at once (a send is
//! legal before the receive is posted: the message waits in the sender's queue and in
//! the receiver's system buffers), and the receiver unpacks it from the system buffer
//! into its arrays (copy 2). Every message synchronizes its pair implicitly: a chunk
//! goes only into a system-buffer slot the receiver has freed, and freeing it is a
//! control message back. This is the constant per-message overhead (buffer allocation
//! and implicit synchronization per transfer) that the seed finds limiting PVM.
//!
//! The data moves with the same deposit as DMSG and RRMSG ([`Rma::put_notify`]), so
//! the three libraries differ only in how they synchronize and copy, as in the seed:
//!
//! - every rank's **inbox** window holds, per sender, a word that counts its chunks
//!   and [`SLOTS`] slots of one chunk each (a 64-byte header with the message's length,
//!   then up to `chunk` bytes);
//! - a chunk is deposited into the next slot of the sender's row, its header last with
//!   a count of arrivals ([`Rma::put_notify`]);
//! - the receiver copies out of the slot in [`Received::unpack`] and, when a slot is
//!   used up, counts it freed in the sender's **control** window (its word for that
//!   receiver): the sender's credit.
//!
//! Messages longer than a chunk go chunk by chunk as credits come back: the sender's
//! queue is pushed by every call of this library on that rank (a receive waiting for a
//! message pushes this rank's own queued chunks meanwhile, so two ranks that send to
//! each other before receiving never wait for each other). Messages of a pair arrive in
//! the order they were sent. The waits poll (with a yield between rounds), as the
//! T3D's PVM did.

use super::{timed, Phases, Rma, Window};
use crate::error::{Error, Result};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// System-buffer slots per sender at each receiver.
pub const SLOTS: u64 = 2;
/// Bytes before a slot's data: the message's length (a cache line, so data is aligned).
const HEADER: u64 = 64;
/// A control word per cache line: in the inbox, arrivals from rank `s` at `s * LINE`
/// (before the slots); in the control window, slots freed by rank `r` at `r * LINE`.
const LINE: u64 = 64;

/// A message being built: [`SendBuffer::pack`] appends bytes (PVM's `pvm_pkbyte`).
#[derive(Debug, Default, Clone)]
pub struct SendBuffer {
    data: Vec<u8>,
    /// Time spent packing, counted in the endpoint's phases when it is sent.
    packing: Duration,
}

impl SendBuffer {
    /// An empty buffer (PVM's `pvm_initsend`).
    pub fn new() -> SendBuffer {
        SendBuffer::default()
    }

    /// Appends a copy of `bytes`.
    pub fn pack(&mut self, bytes: &[u8]) -> &mut SendBuffer {
        let t = Instant::now();
        self.data.extend_from_slice(bytes);
        self.packing += t.elapsed();
        self
    }

    /// The bytes packed so far.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether nothing is packed.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// A message handed to [`Pvm::send`] and not fully deposited yet.
struct Outgoing {
    data: Vec<u8>,
    /// Bytes deposited so far.
    sent: usize,
}

/// One rank's PVM-like endpoint over an [`Rma`] (module documentation).
pub struct Pvm<'a> {
    rma: &'a Rma,
    inbox: Window,
    control_words: Window,
    chunk: u64,
    me: u32,
    n: u32,
    /// Per destination: the messages queued, chunks deposited, slots it freed.
    queues: RefCell<Vec<VecDeque<Outgoing>>>,
    deposited: Vec<Cell<u64>>,
    freed: Vec<Cell<u64>>,
    /// Per source: chunks taken out of its row and freed (the slot of the chunk being
    /// read is this modulo SLOTS), whether a [`Received`] from it is open, and whether
    /// its stream broke (an error left a slot in an unknown state).
    taken: Vec<Cell<u64>>,
    open: Vec<Cell<bool>>,
    broken: Vec<Cell<bool>>,
    transfer: Cell<Duration>,
    control: Cell<Duration>,
    copy: Cell<Duration>,
}

impl<'a> Pvm<'a> {
    /// Opens the library on `rma` with system-buffer slots of `chunk` bytes (a message
    /// of any length goes in chunks of this size). Collective: it allocates two windows,
    /// in the same order on every rank.
    pub fn open(rma: &'a Rma, chunk: usize) -> Result<Pvm<'a>> {
        if chunk == 0 {
            return Err(Error::Config("a PVM chunk needs at least 1 byte".into()));
        }
        let (me, n) = {
            use crate::engine::station::Footing;
            let job = rma.endpoint().station().job();
            (job.rank, job.size)
        };
        let chunk = chunk as u64;
        let too_large = || {
            Error::Config(format!(
                "{n} ranks' slots of {chunk} bytes do not fit memory"
            ))
        };
        let inbox = chunk
            .checked_next_multiple_of(64)
            .and_then(|c| c.checked_add(HEADER))
            .and_then(|slot| slot.checked_mul(SLOTS))
            .and_then(|row| row.checked_add(LINE))
            .and_then(|row| row.checked_mul(u64::from(n)))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(too_large)?;
        let cells = |v| (0..n).map(|_| Cell::new(v)).collect::<Vec<_>>();
        Ok(Pvm {
            rma,
            inbox: rma.allocate(inbox)?,
            control_words: rma.allocate((u64::from(n) * LINE) as usize)?,
            chunk,
            me,
            n,
            queues: RefCell::new((0..n).map(|_| VecDeque::new()).collect()),
            deposited: cells(0),
            freed: cells(0),
            taken: cells(0),
            open: (0..n).map(|_| Cell::new(false)).collect(),
            broken: (0..n).map(|_| Cell::new(false)).collect(),
            transfer: Cell::default(),
            control: Cell::default(),
            copy: Cell::default(),
        })
    }

    fn slot_size(&self) -> u64 {
        HEADER + self.chunk.next_multiple_of(64)
    }

    /// Where slot `k` of `sender`'s row starts in an inbox.
    fn slot(&self, sender: u32, k: u64) -> u64 {
        u64::from(self.n) * LINE + (u64::from(sender) * SLOTS + k % SLOTS) * self.slot_size()
    }

    /// Queues `message` for `to` and deposits what credits allow now; returns without
    /// waiting for the receiver (PVM's `pvm_send`). A rank does not send to itself.
    pub fn send(&self, to: u32, message: SendBuffer) -> Result<()> {
        if to >= self.n || to == self.me {
            return Err(Error::Config(format!(
                "PVM send from rank {} to rank {to} of {}: not another rank of the job",
                self.me, self.n
            )));
        }
        self.copy.set(self.copy.get() + message.packing);
        self.queues.borrow_mut()[to as usize].push_back(Outgoing {
            data: message.data,
            sent: 0,
        });
        self.push().map(drop)
    }

    /// Deposits queued chunks into every slot freed so far. Whether anything moved.
    fn push(&self) -> Result<bool> {
        let mut moved = false;
        let mut queues = self.queues.borrow_mut();
        for (to, queue) in queues.iter_mut().enumerate() {
            if queue.is_empty() {
                continue;
            }
            let to = to as u32;
            // Credits: slots `to` freed since the last look.
            let word = self.control_words.word(self.freed_word(to) as usize)?;
            let newly = word.swap(0, Ordering::Acquire);
            let freed = &self.freed[to as usize];
            freed.set(freed.get() + newly);
            let deposited = &self.deposited[to as usize];
            while let Some(out) = queue.front_mut() {
                if deposited.get() - freed.get() >= SLOTS {
                    break;
                }
                let k = deposited.get();
                let at = self.slot(self.me, k);
                let len = (out.data.len() - out.sent).min(self.chunk as usize);
                // The data, then the header with the count (which follows the data).
                timed(&self.transfer, || {
                    self.rma.put(
                        to,
                        &self.inbox,
                        at + HEADER,
                        &out.data[out.sent..out.sent + len],
                    )?;
                    self.rma.put_notify(
                        to,
                        &self.inbox,
                        at,
                        &(out.data.len() as u64).to_le_bytes(),
                        self.arrival_word(self.me),
                    )
                })?;
                deposited.set(k + 1);
                out.sent += len;
                moved = true;
                if out.sent == out.data.len() {
                    queue.pop_front();
                }
            }
        }
        Ok(moved)
    }

    /// The word that counts chunks from `sender` (in the receiver's inbox: a count
    /// goes with a put into the same window).
    fn arrival_word(&self, sender: u32) -> u64 {
        u64::from(sender) * LINE
    }

    /// The control word that counts slots freed by `receiver` (in the sender's window).
    fn freed_word(&self, receiver: u32) -> u64 {
        u64::from(receiver) * LINE
    }

    /// Waits for the next message from `from` (PVM's `pvm_recv`) and returns it for
    /// unpacking, pushing this rank's own queued chunks meanwhile.
    pub fn recv(&self, from: u32) -> Result<Received<'_, 'a>> {
        if from >= self.n || from == self.me {
            return Err(Error::Config(format!(
                "PVM receive at rank {} from rank {from} of {}: not another rank of the job",
                self.me, self.n
            )));
        }
        if self.broken[from as usize].get() {
            return Err(Error::Config(format!(
                "PVM messages from rank {from}: an earlier error broke the stream"
            )));
        }
        if self.open[from as usize].get() {
            return Err(Error::Config(format!(
                "PVM receive from rank {from}: its previous message is still open (drop it first)"
            )));
        }
        self.take_chunk(from)?;
        let mut len = [0u8; 8];
        self.inbox.read(
            self.slot(from, self.taken[from as usize].get()) as usize,
            &mut len,
        )?;
        self.open[from as usize].set(true);
        let mut m = Received {
            pvm: self,
            from,
            len: u64::from_le_bytes(len),
            unpacked: 0,
            in_slot: 0,
            holding: true,
            poisoned: false,
        };
        if m.len == 0 {
            m.release()?;
        }
        Ok(m)
    }

    /// Waits until the next chunk from `from` is in its slot (control time, but for
    /// this rank's own chunks deposited meanwhile).
    fn take_chunk(&self, from: u32) -> Result<()> {
        let word = self.inbox.word(self.arrival_word(from) as usize)?;
        let (start, transfer) = (Instant::now(), self.transfer.get());
        let r = loop {
            if word
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1))
                .is_ok()
            {
                break Ok(());
            }
            let pushed = match self.push() {
                Ok(p) => p,
                Err(e) => break Err(e),
            };
            if let Err(e) = self.rma.progress() {
                break Err(e);
            }
            if !pushed {
                std::thread::yield_now();
            }
        };
        let own = self.transfer.get() - transfer;
        self.control
            .set(self.control.get() + start.elapsed().saturating_sub(own));
        r
    }

    /// Frees the slot of `from`'s chunk taken last: a credit for the sender.
    fn free_slot(&self, from: u32) -> Result<()> {
        let word = self.freed_word(self.me);
        timed(&self.control, || {
            self.rma
                .put_notify(from, &self.control_words, word, &[], word)
        })?;
        let taken = &self.taken[from as usize];
        taken.set(taken.get() + 1);
        Ok(())
    }

    /// Where this endpoint's time went so far: depositing chunks is transfer; waiting
    /// for chunks and credits and returning credits is control; packing (counted when
    /// the buffer is sent) and unpacking are copy.
    pub fn phases(&self) -> Phases {
        Phases {
            transfer: self.transfer.get(),
            control: self.control.get(),
            copy: self.copy.get(),
        }
    }

    /// Waits until every message sent from here is deposited (chunks still queued go
    /// as their receivers free slots, which they do when they receive). Call it before
    /// dropping the endpoint: a message still queued then is lost.
    pub fn wait_sent(&self) -> Result<()> {
        let (start, transfer) = (Instant::now(), self.transfer.get());
        let r = (|| {
            while self.queues.borrow().iter().any(|q| !q.is_empty()) {
                if !self.push()? {
                    self.rma.progress()?;
                    std::thread::yield_now();
                }
            }
            Ok(())
        })();
        let own = self.transfer.get() - transfer;
        self.control
            .set(self.control.get() + start.elapsed().saturating_sub(own));
        r
    }
}

impl Drop for Pvm<'_> {
    fn drop(&mut self) {
        // Waiting here could wait for ever on a receiver that never receives.
        let queued: usize = self.queues.borrow().iter().map(VecDeque::len).sum();
        if queued > 0 {
            tracing::warn!("PVM endpoint dropped with {queued} messages not all deposited (call wait_sent first)");
        }
    }
}

/// A message from [`Pvm::recv`], unpacked in order with [`Received::unpack`]; one at a
/// time per sender. Dropped before it is all unpacked, the rest is skipped (its chunks
/// are still taken and their slots freed, so the pair's next message comes next). After
/// an error the sender's stream is broken: later receives from it fail.
pub struct Received<'p, 'a> {
    pvm: &'p Pvm<'a>,
    from: u32,
    len: u64,
    unpacked: u64,
    /// Bytes of the current chunk unpacked.
    in_slot: u64,
    /// Whether the current chunk's slot is still this message's (not freed yet).
    holding: bool,
    /// Whether an error left the slots in an unknown state.
    poisoned: bool,
}

impl Received<'_, '_> {
    /// The message's length.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes not unpacked yet.
    pub fn remaining(&self) -> usize {
        (self.len - self.unpacked) as usize
    }

    /// Copies the next `dst.len()` bytes of the message into `dst` (PVM's
    /// `pvm_upkbyte`); asking for more than remains is [`Error::Truncated`], with
    /// nothing copied.
    pub fn unpack(&mut self, dst: &mut [u8]) -> Result<()> {
        if self.poisoned {
            return Err(Error::Config(format!(
                "PVM message from rank {}: an earlier error broke it",
                self.from
            )));
        }
        if dst.len() as u64 > self.len - self.unpacked {
            return Err(Error::Truncated {
                len: self.len,
                capacity: self.remaining(),
                rank: self.from,
                tag: 0,
            });
        }
        let r = self.copy_out(dst);
        if r.is_err() {
            self.poison();
        }
        r
    }

    fn copy_out(&mut self, dst: &mut [u8]) -> Result<()> {
        let pvm = self.pvm;
        let mut done = 0;
        while done < dst.len() {
            if self.in_slot == pvm.chunk {
                self.next_chunk()?;
            }
            let n = (dst.len() - done).min((pvm.chunk - self.in_slot) as usize);
            let at = pvm.slot(self.from, pvm.taken[self.from as usize].get()) + HEADER;
            timed(&pvm.copy, || {
                pvm.inbox
                    .read((at + self.in_slot) as usize, &mut dst[done..done + n])
            })?;
            self.in_slot += n as u64;
            self.unpacked += n as u64;
            done += n;
        }
        if self.unpacked == self.len {
            self.release()?;
        }
        Ok(())
    }

    /// Frees the current chunk's slot and waits for the next chunk.
    fn next_chunk(&mut self) -> Result<()> {
        self.release()?;
        self.pvm.take_chunk(self.from)?;
        self.holding = true;
        self.in_slot = 0;
        Ok(())
    }

    /// Frees the current chunk's slot, once.
    fn release(&mut self) -> Result<()> {
        if self.holding {
            self.pvm.free_slot(self.from)?;
            self.holding = false;
        }
        Ok(())
    }

    fn poison(&mut self) {
        self.poisoned = true;
        self.pvm.broken[self.from as usize].set(true);
    }

    /// Skips the rest of the message and frees its last slot.
    fn finish(&mut self) -> Result<()> {
        let pvm = self.pvm;
        while self.unpacked < self.len {
            if self.in_slot == pvm.chunk {
                self.next_chunk()?;
            }
            let n = (self.len - self.unpacked).min(pvm.chunk - self.in_slot);
            self.in_slot += n;
            self.unpacked += n;
        }
        self.release()
    }
}

impl Drop for Received<'_, '_> {
    fn drop(&mut self) {
        // Skipping waits for the sender's chunks: not while unwinding, not once broken.
        if !self.poisoned && !std::thread::panicking() {
            if let Err(e) = self.finish() {
                tracing::warn!("PVM message from rank {}: {e}", self.from);
                self.poison();
            }
        } else if self.holding || self.unpacked < self.len {
            self.poison();
        }
        self.pvm.open[self.from as usize].set(false);
    }
}
