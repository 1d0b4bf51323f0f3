//! Tagged send/receive with the Push-Pull protocol (the Push-Pull Messaging seed).
//!
//! A [`Tagged`] endpoint sends messages of any size to a rank with a tag, and receives
//! them into buffers the application posts, matched on (source, tag) with wildcards
//! ([`Src::Any`], [`Tag::Any`]). MPI's ordering rule holds: two messages from one sender
//! that both match a receive are received in the order they were sent (they travel one
//! FIFO Directed Point channel, and both the posted and the unexpected queue are searched
//! in order).
//!
//! The protocol, per message (`docs/DESIGN-NOTES.md` has the reasoning):
//!
//! 1. The sender **pushes** the first BTP(1) bytes with the message's header, then the
//!    next BTP(2) bytes, and returns to the application (Push-and-Acknowledge
//!    overlapping: the second push travels while the acknowledgement does).
//! 2. At the receiver, a push that matches a posted receive is copied straight into its
//!    buffer; otherwise it waits in the **pushed buffer** (the unexpected queue) until a
//!    receive is posted.
//! 3. Once matched, the receiver **pulls** the rest: on one node by a single copy across
//!    address spaces (a get of `rma`: cross-memory attach, `process_vm_readv` from the
//!    sender's buffer, or a read of its shared buffer), then a `Done` that completes the
//!    send; otherwise (network, or cross-memory attach
//!    not permitted) with a `Pull` acknowledgement, to which the sender answers with the
//!    requested bytes, written into the receive buffer as they arrive.
//! 4. Buffer preparation (touching the pages still to be transferred) is done after the
//!    first push is on its way, so it overlaps the transfer (address-translation
//!    masking).
//! 5. A large same-node pull is a **split copy** when the sender waits inside quiver
//!    meanwhile: the receiver reads units from the front, the sender writes units from
//!    the back (`process_vm_writev`) on its otherwise idle core, coordinated through a
//!    slot of the sender's shared board (`rma::split` has both halves). A sender busy
//!    elsewhere takes no unit and the receiver pulls alone (`QUIVER_SPLIT_COPY`).
//!
//! [`PushMode`] selects Push-Pull (BTP(1), BTP(2) from `QUIVER_BTP1` / `QUIVER_BTP2`),
//! Push-Zero (nothing pushed, everything pulled) or Push-All (everything pushed), at run
//! time (`QUIVER_PUSH`, [`Tagged::set_push`]).
//!
//! Non-blocking operations live in a [`Tagged::scope`], which guarantees that every
//! buffer handed to [`Scope::isend`] or [`Scope::irecv`] outlives the operation: when
//! the scope ends, pending receives that nothing matched are cancelled and every other
//! operation is waited for.

mod wire;

/// Bytes of the largest protocol header: a protocol message carries at most
/// `QUIVER_MAX_MESSAGE` minus this of payload.
pub const HEADER_LEN: usize = wire::MAX_HEADER;
/// Same-node pulls at least this long go to the pull thread when the offload engine
/// runs.
pub const PULL_THREAD_MIN: u64 = puller::MIN_OFFLOADED;
/// Messages longer than this push BTP(1) bytes only, not BTP(2): the second push hides
/// an acknowledgement's round trip, which matters next to a short pull but not next to
/// a long one, and its bytes cross the shared-memory ring (two copies that evict the
/// caches): at 1 MiB, pushing BTP(2) cost 12 % of the bandwidth on this machine
/// (`docs/PERFORMANCE.md`).
pub const SECOND_PUSH_MAX: usize = 256 << 10;
/// Same-node pulls at least this long are offered to the sender for a split copy
/// (shorter ones are over before a sender could join, and splitting costs a system
/// call per claim).
pub const SPLIT_MIN: u64 = rma::split::SPLIT_MIN;

use crate::dm::Endpoint;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::link::Transport;
use crate::rma::{self, puller, GetError, Got, Offer, Peer, Remote, Rma};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use wire::{Announce, Msg};

/// Which sender a receive accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Src {
    /// Any rank.
    Any,
    /// This rank only.
    Rank(u32),
}

impl From<u32> for Src {
    fn from(rank: u32) -> Src {
        Src::Rank(rank)
    }
}

/// Which tag a receive accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// Any tag.
    Any,
    /// This tag only.
    Is(u32),
}

impl From<u32> for Tag {
    fn from(tag: u32) -> Tag {
        Tag::Is(tag)
    }
}

pub use crate::config::PushMode;

/// What a completed operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The sender (of a receive) or the destination (of a send).
    pub peer: u32,
    /// The message's tag.
    pub tag: u32,
    /// The message's length in bytes.
    pub len: u64,
}

/// Counters of a tagged endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaggedStats {
    /// Messages whose first push found no posted receive (they waited in the pushed
    /// buffer).
    pub unexpected: u64,
    /// Most bytes the pushed buffer held at once.
    pub pushed_buffer_peak: u64,
    /// Bytes pulled with one copy across address spaces (cross-memory attach).
    pub pulled_direct: u64,
    /// Bytes read in place from senders' shared buffers ([`Tagged::alloc_shared`]).
    pub pulled_shared: u64,
    /// Of `pulled_direct`, bytes pulled by the pull thread (offload engine running).
    pub pulled_on_thread: u64,
    /// Bytes pulled through `Pull` requests and `Data` messages.
    pub pulled_by_request: u64,
    /// Of `pulled_direct`, bytes the sender wrote into this endpoint's buffers during a
    /// split copy.
    pub pulled_split_by_sender: u64,
    /// Bytes this endpoint wrote into its receivers' buffers during split copies.
    pub split_helped: u64,
    /// Protocol messages dropped because they were malformed or named no known message.
    pub dropped: u64,
}

/// A tagged endpoint: a Directed Point endpoint that carries the Push-Pull protocol.
/// Every rank of the job opens one with the same DPID.
pub struct Tagged {
    ep: Endpoint,
    rank: u32,
    st: RefCell<State>,
    /// Same-node pulls (shared buffers, cross-memory attach, split copies, the pull
    /// thread) and the sender's side of split copies.
    rma: Rma,
}

pub use crate::rma::window::SharedBuf;

struct State {
    mode: PushMode,
    btp1: usize,
    btp2: usize,
    /// Largest payload of one protocol message.
    chunk: usize,
    next_op: u64,
    next_msg: u64,
    ops: HashMap<u64, Op>,
    /// Receives posted and not matched yet, in posting order.
    posted: VecDeque<u64>,
    /// First pushes that found no posted receive, in arrival order: the pushed buffer.
    unexpected: VecDeque<Unexpected>,
    pushed_bytes: u64,
    /// Matched receives still expecting bytes: (source, message) → operation.
    incoming: HashMap<(u32, u64), u64>,
    /// Sends waiting for their receiver's `Pull` or `Done`: (destination, message) →
    /// operation.
    outgoing: HashMap<(u32, u64), u64>,
    /// Protocol messages the handlers could not write at once (the peer's channel was
    /// full), per destination, in order: sent before anything else to that peer.
    outbox: HashMap<u32, VecDeque<OutItem>>,
    /// Receives whose pull the pull thread makes: operation → (source, message, offset,
    /// length).
    pulls: HashMap<u64, (u32, u64, u64, u64)>,
    stats: TaggedStats,
}

enum Op {
    Send(SendOp),
    Recv(RecvOp),
}

/// A protocol message waiting in the outbox.
enum OutItem {
    /// A whole message (header and payload).
    Whole(Vec<u8>),
    /// The `Data` answer to a `Pull`: bytes `off..end` of send `op` (message `msg`),
    /// written in chunks straight from the send buffer; the send completes after the last.
    Range {
        msg: u64,
        op: u64,
        ptr: *const u8,
        off: u64,
        end: u64,
    },
}

struct SendOp {
    dest: u32,
    tag: u32,
    ptr: *const u8,
    len: usize,
    done: bool,
}

struct RecvOp {
    ptr: *mut u8,
    cap: usize,
    src: Src,
    tag: Tag,
    state: RecvState,
}

enum RecvState {
    Posted,
    Receiving {
        source: u32,
        tag: u32,
        total: u64,
        /// Bytes that will land in the buffer: min(total, capacity).
        expected: u64,
        landed: u64,
    },
    Done(Option<Result<Status>>),
}

/// A first push that found no posted receive, with the pushed bytes that followed it.
struct Unexpected {
    source: u32,
    head: Announce,
    data: Vec<u8>,
}

fn matches(src: Src, tag: Tag, source: u32, t: u32) -> bool {
    (src == Src::Any || src == Src::Rank(source)) && (tag == Tag::Any || tag == Tag::Is(t))
}

impl Tagged {
    /// Opens the tagged endpoint `dpid` of this rank (every rank uses the same DPID).
    pub fn open(job: &Job, dpid: u16) -> Result<Tagged> {
        let ep = job.open(dpid)?;
        let rma = Rma::open(job, dpid)?;
        let cfg = job.config();
        let chunk = cfg.max_message - wire::MAX_HEADER;
        Ok(Tagged {
            rank: job.rank(),
            ep,
            st: RefCell::new(State {
                mode: cfg.push,
                btp1: cfg.btp1.min(chunk),
                btp2: cfg.btp2,
                chunk,
                next_op: 0,
                next_msg: 0,
                ops: HashMap::new(),
                posted: VecDeque::new(),
                unexpected: VecDeque::new(),
                pushed_bytes: 0,
                incoming: HashMap::new(),
                outgoing: HashMap::new(),
                pulls: HashMap::new(),
                outbox: HashMap::new(),
                stats: TaggedStats::default(),
            }),
            rma,
        })
    }

    /// Allocates `len` bytes from the job's shared pool (a shared-memory object of this
    /// endpoint, private to the job's user). A message sent from it to a rank of the
    /// same node is read in place by the receiver: one copy, no cross-memory attach
    /// needed. Zero-filled.
    pub fn alloc_shared(&self, len: usize) -> Result<SharedBuf<'_>> {
        self.rma.alloc_shared(len)
    }

    /// The Directed Point endpoint underneath (its statistics, descriptor...).
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Selects the push mode for later sends.
    pub fn set_push(&self, mode: PushMode) {
        self.st.borrow_mut().mode = mode;
    }

    /// Sets BTP(1) and BTP(2) for later sends in [`PushMode::Pull`]; the pushed buffer
    /// holds at most BTP(1) + BTP(2) bytes per unexpected message.
    pub fn set_btp(&self, btp1: usize, btp2: usize) {
        let mut st = self.st.borrow_mut();
        st.btp1 = btp1.min(st.chunk);
        st.btp2 = btp2;
    }

    /// The push mode and BTP(1), BTP(2) in force.
    pub fn push(&self) -> (PushMode, usize, usize) {
        let st = self.st.borrow();
        (st.mode, st.btp1, st.btp2)
    }

    /// The endpoint's counters.
    pub fn stats(&self) -> TaggedStats {
        let mut stats = self.st.borrow().stats.clone();
        let split = self.rma.stats();
        stats.pulled_split_by_sender = split.written_by_peers;
        stats.split_helped = split.written_for_peers;
        stats
    }

    /// Sends `data` to `dest` with `tag`; returns when the buffer may be reused (the
    /// receiver has pulled what was not pushed). Like MPI's rendezvous send, a message
    /// longer than what is pushed (BTP(1) + BTP(2); everything in Push-Zero) waits for
    /// the receiver to post a matching receive: two ranks that both `send` such a message
    /// to each other before receiving wait for ever. Use [`Scope::isend`] there.
    pub fn send(&self, dest: u32, tag: u32, data: &[u8]) -> Result<()> {
        let id = self.start_send(dest, tag, data)?;
        self.wait_op(id).map(|_| ())
    }

    /// Receives the first message that matches (`src`, `tag`) into `buf`.
    /// [`Error::Truncated`] if it is longer than `buf` (which then holds its start).
    pub fn recv(&self, buf: &mut [u8], src: impl Into<Src>, tag: impl Into<Tag>) -> Result<Status> {
        let id = self.start_recv(buf.as_mut_ptr(), buf.len(), src.into(), tag.into())?;
        self.wait_op(id)
    }

    /// The status of the first message that matches, without receiving it, if one has
    /// arrived.
    pub fn iprobe(&self, src: impl Into<Src>, tag: impl Into<Tag>) -> Result<Option<Status>> {
        let (src, tag) = (src.into(), tag.into());
        self.progress()?;
        let st = self.st.borrow();
        Ok(st
            .unexpected
            .iter()
            .find(|u| matches(src, tag, u.source, u.head.tag))
            .map(|u| Status {
                peer: u.source,
                tag: u.head.tag,
                len: u.head.total,
            }))
    }

    /// Waits for a message that matches and returns its status without receiving it.
    pub fn probe(&self, src: impl Into<Src>, tag: impl Into<Tag>) -> Result<Status> {
        let (src, tag) = (src.into(), tag.into());
        loop {
            if let Some(s) = self.iprobe(src, tag)? {
                return Ok(s);
            }
            self.wait_message()?;
        }
    }

    /// Handles every protocol message that has arrived; returns without waiting.
    pub fn progress(&self) -> Result<()> {
        // One full round of the endpoint first (it polls a UDP socket only now and then
        // while it also serves shared memory).
        self.ep.progress()?;
        while self.poll()? {}
        Ok(())
    }

    /// Runs `f` with a [`Scope`] for non-blocking operations on buffers that outlive the
    /// scope. When `f` returns (or panics), receives that nothing matched are cancelled
    /// and every other operation started in the scope is waited for.
    pub fn scope<'env, T>(
        &'env self,
        f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T>,
    ) -> Result<T> {
        let scope = Scope {
            t: self,
            started: RefCell::new(Vec::new()),
            _scope: PhantomData,
            _env: PhantomData,
        };
        let guard = FinishOnDrop(&scope);
        let out = f(&scope);
        std::mem::forget(guard);
        let finished = scope.finish();
        let v = out?;
        finished?;
        Ok(v)
    }

    fn start_send(&self, dest: u32, tag: u32, data: &[u8]) -> Result<u64> {
        let len = data.len();
        // Registered before the first write: while a write waits for room, incoming
        // messages are handled, and the receiver's `Pull` or `Done` may be among them.
        let (msg, id, first, pushed, chunk) = {
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            let msg = st.next_msg;
            st.next_msg += 1;
            let (first, pushed) = match st.mode {
                PushMode::Zero => (0, 0),
                PushMode::All => (len.min(st.chunk), len),
                PushMode::Pull if len > SECOND_PUSH_MAX => (len.min(st.btp1), len.min(st.btp1)),
                PushMode::Pull => (len.min(st.btp1), len.min(st.btp1.saturating_add(st.btp2))),
            };
            let id = st.next_op;
            st.next_op += 1;
            let done = pushed == len;
            st.ops.insert(
                id,
                Op::Send(SendOp {
                    dest,
                    tag,
                    ptr: data.as_ptr(),
                    len,
                    done,
                }),
            );
            if !done {
                st.outgoing.insert((dest, msg), id);
            }
            (msg, id, first, pushed, st.chunk)
        };
        // A buffer from the shared pool is named by its number and the offset in it.
        let (seg, addr) = match self.rma.locate(data) {
            Remote::Shared { window, offset } => (window, offset),
            Remote::Memory { addr, .. } => (0, addr),
        };
        let rest = &data[pushed..];
        let slot = if seg == 0
            && self.rma.may_split(dest, rest.len() as u64)
            && self.ep.transport_to(dest)? == Transport::Shm
        {
            // SAFETY: the send buffer outlives the send, which ends (`complete_send`
            // calls `end_split`) only after the receiver is done with it.
            unsafe { self.rma.offer_split(dest, msg, rest) }.map_or(0, |i| i + 1)
        } else {
            0
        };
        let push = Msg::Push {
            head: Announce {
                slot,
                tag,
                msg,
                total: len as u64,
                pushed: pushed as u64,
                pid: std::process::id(),
                seg,
                addr,
            },
            data: &data[..first],
        };
        self.write_progressing(dest, push.header().as_bytes(), push.data())?;
        let mut off = first;
        while off < pushed {
            let end = pushed.min(off + chunk);
            let more = Msg::More {
                msg,
                offset: off as u64,
                data: &data[off..end],
            };
            self.write_progressing(dest, more.header().as_bytes(), more.data())?;
            off = end;
        }
        // Address-translation masking: the pushes are on their way; prepare the part the
        // receiver will pull now, off the critical path.
        touch_pages(&data[pushed..]);
        Ok(id)
    }

    fn start_recv(&self, ptr: *mut u8, cap: usize, src: Src, tag: Tag) -> Result<u64> {
        // Take in what has arrived first: a message already waiting must match before
        // this receive is queued behind it.
        self.progress()?;
        let id = {
            let mut st = self.st.borrow_mut();
            let id = st.next_op;
            st.next_op += 1;
            st.ops.insert(
                id,
                Op::Recv(RecvOp {
                    ptr,
                    cap,
                    src,
                    tag,
                    state: RecvState::Posted,
                }),
            );
            id
        };
        let found = {
            let mut st = self.st.borrow_mut();
            let i = st
                .unexpected
                .iter()
                .position(|u| matches(src, tag, u.source, u.head.tag));
            i.and_then(|i| st.unexpected.remove(i))
        };
        match found {
            Some(u) => {
                {
                    let mut st = self.st.borrow_mut();
                    st.pushed_bytes -= u.data.len() as u64;
                }
                self.begin_or_fail(id, &u, &u.data);
            }
            None => self.st.borrow_mut().posted.push_back(id),
        }
        Ok(id)
    }

    /// [`Tagged::begin_receive`]; a failure (a pull that cannot be made, a peer gone)
    /// completes receive `id` with the error instead of leaving it pending.
    fn begin_or_fail(&self, id: u64, u: &Unexpected, have: &[u8]) {
        if let Err(e) = self.begin_receive(id, u, have) {
            let mut st = self.st.borrow_mut();
            st.incoming.remove(&(u.source, u.head.msg));
            if let Some(Op::Recv(r)) = st.ops.get_mut(&id) {
                r.state = RecvState::Done(Some(Err(e)));
            }
        }
    }

    /// A message matched receive `id`: copy what was pushed, pull the rest.
    fn begin_receive(&self, id: u64, u: &Unexpected, have: &[u8]) -> Result<()> {
        let (ptr, cap) = {
            let st = self.st.borrow();
            let Some(Op::Recv(r)) = st.ops.get(&id) else {
                return Ok(());
            };
            (r.ptr, r.cap)
        };
        let expected = u.head.total.min(cap as u64);
        let n = have.len().min(cap);
        // SAFETY: the receive's buffer is valid for `cap` bytes until the operation
        // completes (its scope or blocking call outlives it); n <= cap.
        unsafe { std::ptr::copy_nonoverlapping(have.as_ptr(), ptr, n) };
        let mut landed = n as u64;
        // Bytes of the message past what was pushed, and inside the buffer.
        let pull_from = u.head.pushed;
        let pull_len = expected.saturating_sub(pull_from);
        let mut tell_done = u.head.total > u.head.pushed && pull_len == 0; // truncated: nothing to pull
        if pull_len > 0 {
            let same_node =
                u.source == self.rank || self.ep.transport_to(u.source)? == Transport::Shm;
            let got = if same_node {
                let peer = Peer {
                    rank: u.source,
                    pid: u.head.pid,
                };
                let at = u.head.addr.saturating_add(pull_from);
                let remote = if u.head.seg != 0 {
                    Remote::Shared {
                        window: u.head.seg,
                        offset: at,
                    }
                } else {
                    Remote::Memory {
                        addr: at,
                        split: u.head.slot.checked_sub(1).map(|slot| Offer {
                            slot,
                            msg: u.head.msg,
                        }),
                    }
                };
                // SAFETY: [pull_from, pull_from + pull_len) lies inside the receive buffer
                // (pull_from + pull_len = expected <= cap), valid until the receive
                // completes, which is not before the pull is over (a queued one is
                // collected by `collect_pulls` first); only the pull writes it meanwhile.
                let got = unsafe {
                    self.rma
                        .start_get(id, peer, remote, ptr.add(pull_from as usize), pull_len)
                };
                match got {
                    Ok(got) => got,
                    // A shared buffer too short for the message: pulled by request.
                    Err(GetError::OutOfBounds { .. }) => Got::Unreachable,
                    Err(GetError::Thread(e)) => return Err(e),
                    Err(GetError::Attach(e)) => {
                        return Err(Error::Protocol {
                            rank: u.source,
                            reason: format!("pulling message {}: {e}", u.head.msg),
                        })
                    }
                }
            } else {
                Got::Unreachable
            };
            match got {
                Got::Shared => {
                    landed += pull_len;
                    self.st.borrow_mut().stats.pulled_shared += pull_len;
                    tell_done = true;
                }
                Got::Attached => {
                    landed += pull_len;
                    self.st.borrow_mut().stats.pulled_direct += pull_len;
                    tell_done = true;
                }
                Got::Queued => {
                    // The pull thread reports; `collect_pulls` finishes the receive.
                    self.st
                        .borrow_mut()
                        .pulls
                        .insert(id, (u.source, u.head.msg, pull_from, pull_len));
                }
                Got::Unreachable => {
                    let pull = Msg::Pull {
                        msg: u.head.msg,
                        offset: pull_from,
                        len: pull_len,
                    };
                    self.send_ctrl(u.source, &pull)?;
                    // SAFETY: as above; the pull request is on its way, so preparing the
                    // destination overlaps its round trip.
                    touch_pages(unsafe {
                        std::slice::from_raw_parts(ptr.add(pull_from as usize), pull_len as usize)
                    });
                }
            }
        }
        self.receiving(id, u, expected, landed, tell_done)
    }

    /// Receive `id` now takes message `u`: `landed` of its `expected` bytes are in the
    /// buffer; `tell_done` sends `Done` (the sender's buffer is no longer needed).
    fn receiving(
        &self,
        id: u64,
        u: &Unexpected,
        expected: u64,
        landed: u64,
        tell_done: bool,
    ) -> Result<()> {
        if tell_done {
            let done = Msg::Done { msg: u.head.msg };
            self.send_ctrl(u.source, &done)?;
        }
        let mut st = self.st.borrow_mut();
        let Some(Op::Recv(r)) = st.ops.get_mut(&id) else {
            return Ok(());
        };
        r.state = RecvState::Receiving {
            source: u.source,
            tag: u.head.tag,
            total: u.head.total,
            expected,
            landed,
        };
        if !finish_if_complete(r) {
            st.incoming.insert((u.source, u.head.msg), id);
        }
        Ok(())
    }

    /// Handles one protocol message if one has arrived.
    fn poll(&self) -> Result<bool> {
        let helped = self.rma.help();
        let flushed = self.flush_outbox()? || helped;
        if self.collect_pulls()? {
            return Ok(true);
        }
        let Some(m) = self.ep.try_read()? else {
            return Ok(flushed);
        };
        let source = m.source().rank;
        self.handle(source, &m)?;
        Ok(true)
    }

    /// Finishes the receives whose pull the pull thread has made; returns whether there
    /// was one.
    fn collect_pulls(&self) -> Result<bool> {
        let Some((op, result)) = self.rma.completed() else {
            return Ok(false);
        };
        let Some((source, msg, offset, len)) = self.st.borrow_mut().pulls.remove(&op) else {
            return Ok(true);
        };
        let reply = match result {
            Ok(Got::Unreachable) => {
                // Refused: the two-copy path for this and later pulls.
                Msg::Pull { msg, offset, len }
            }
            Ok(_) => {
                let mut st = self.st.borrow_mut();
                let st = &mut *st;
                st.stats.pulled_direct += len;
                st.stats.pulled_on_thread += len;
                if let Some(Op::Recv(r)) = st.ops.get_mut(&op) {
                    if let RecvState::Receiving { landed, .. } = &mut r.state {
                        *landed += len;
                    }
                    if finish_if_complete(r) {
                        st.incoming.remove(&(source, msg));
                    }
                }
                Msg::Done { msg }
            }
            Err(e) => {
                let mut st = self.st.borrow_mut();
                st.incoming.remove(&(source, msg));
                if let Some(Op::Recv(r)) = st.ops.get_mut(&op) {
                    r.state = RecvState::Done(Some(Err(Error::Protocol {
                        rank: source,
                        reason: format!("pulling message {msg}: {e}"),
                    })));
                }
                Msg::Done { msg }
            }
        };
        self.send_ctrl(source, &reply)?;
        Ok(true)
    }

    /// Waits for the next protocol message and handles it.
    fn wait_message(&self) -> Result<()> {
        let busy = self.rma.busy() || !self.st.borrow().outbox.is_empty();
        if busy {
            // A pull is under way (its completion comes from a thread, not the
            // endpoint), or the outbox waits for room: poll, do not block.
            if !self.poll()? {
                std::thread::yield_now();
            }
            return Ok(());
        }
        // A receiver may open a split copy while we wait: help on every empty poll.
        let Some(m) = self.ep.read_or_idle(&|| self.rma.help())? else {
            return Ok(());
        };
        let source = m.source().rank;
        self.handle(source, &m)
    }

    fn handle(&self, source: u32, bytes: &[u8]) -> Result<()> {
        let msg_in = match Msg::decode(bytes) {
            Ok(m) => m,
            Err(why) => {
                tracing::debug!("tagged message from rank {source} dropped: {why}");
                self.st.borrow_mut().stats.dropped += 1;
                return Ok(());
            }
        };
        match msg_in {
            Msg::Push { head, data } => {
                let tag = head.tag;
                let u = Unexpected {
                    source,
                    head,
                    data: Vec::new(),
                };
                let matched = {
                    let mut st = self.st.borrow_mut();
                    let st = &mut *st;
                    let i = st.posted.iter().position(|id| match st.ops.get(id) {
                        Some(Op::Recv(r)) => matches(r.src, r.tag, source, tag),
                        _ => false,
                    });
                    i.and_then(|i| st.posted.remove(i))
                };
                match matched {
                    Some(id) => self.begin_or_fail(id, &u, data),
                    None => {
                        let mut st = self.st.borrow_mut();
                        st.stats.unexpected += 1;
                        st.pushed_bytes += data.len() as u64;
                        st.stats.pushed_buffer_peak =
                            st.stats.pushed_buffer_peak.max(st.pushed_bytes);
                        st.unexpected.push_back(Unexpected {
                            data: data.to_vec(),
                            ..u
                        });
                    }
                }
            }
            Msg::More { msg, offset, data } | Msg::Data { msg, offset, data } => {
                let pulled = matches!(msg_in, Msg::Data { .. });
                let mut st = self.st.borrow_mut();
                let st = &mut *st;
                if let Some(&id) = st.incoming.get(&(source, msg)) {
                    let Some(Op::Recv(r)) = st.ops.get_mut(&id) else {
                        return Ok(());
                    };
                    let n = (r.cap as u64).saturating_sub(offset).min(data.len() as u64);
                    if n > 0 {
                        // SAFETY: offset + n <= cap; the buffer is valid until the
                        // receive completes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                data.as_ptr(),
                                r.ptr.add(offset as usize),
                                n as usize,
                            )
                        };
                    }
                    if let RecvState::Receiving { landed, .. } = &mut r.state {
                        *landed += n;
                    }
                    if pulled {
                        st.stats.pulled_by_request += n;
                    }
                    if finish_if_complete(r) {
                        st.incoming.remove(&(source, msg));
                    }
                } else if let Some(u) = st
                    .unexpected
                    .iter_mut()
                    .find(|u| u.source == source && u.head.msg == msg && !pulled)
                {
                    // More pushed bytes of a message still waiting for its receive.
                    if offset == u.data.len() as u64 {
                        u.data.extend_from_slice(data);
                        st.pushed_bytes += data.len() as u64;
                        st.stats.pushed_buffer_peak =
                            st.stats.pushed_buffer_peak.max(st.pushed_bytes);
                    } else {
                        st.stats.dropped += 1;
                    }
                } else {
                    st.stats.dropped += 1;
                }
            }
            Msg::Pull { msg, offset, len } => {
                let (ptr, total, id) = {
                    let st = self.st.borrow();
                    match st
                        .outgoing
                        .get(&(source, msg))
                        .and_then(|id| st.ops.get(id).map(|op| (id, op)))
                    {
                        Some((&id, Op::Send(s))) => (s.ptr, s.len as u64, id),
                        _ => {
                            drop(st);
                            self.st.borrow_mut().stats.dropped += 1;
                            return Ok(());
                        }
                    }
                };
                let end = offset.checked_add(len).filter(|&e| e <= total);
                let Some(end) = end else {
                    self.st.borrow_mut().stats.dropped += 1;
                    return Ok(());
                };
                // Answered through the outbox, which writes as much as the channel takes
                // now and the rest later; the send completes after its last byte.
                self.st
                    .borrow_mut()
                    .outbox
                    .entry(source)
                    .or_default()
                    .push_back(OutItem::Range {
                        msg,
                        op: id,
                        ptr,
                        off: offset,
                        end,
                    });
                self.flush_outbox()?;
            }
            Msg::Done { msg } => {
                let id = self.st.borrow().outgoing.get(&(source, msg)).copied();
                match id {
                    Some(id) => self.complete_send(source, msg, id),
                    None => self.st.borrow_mut().stats.dropped += 1,
                }
            }
        }
        Ok(())
    }

    /// Writes a protocol message from a handler: at once if the peer's channel has room
    /// and nothing is queued for it, else into the outbox (a handler never waits for a
    /// peer that may itself be waiting for us).
    fn send_ctrl(&self, dest: u32, msg: &Msg<'_>) -> Result<()> {
        if self.try_write_now(dest, msg.header().as_bytes(), msg.data())? {
            return Ok(());
        }
        let mut whole = msg.header().as_bytes().to_vec();
        whole.extend_from_slice(msg.data());
        self.st
            .borrow_mut()
            .outbox
            .entry(dest)
            .or_default()
            .push_back(OutItem::Whole(whole));
        Ok(())
    }

    /// Writes a message to `dest` if nothing waits in its outbox (order) and its channel
    /// has room; returns whether it did.
    fn try_write_now(&self, dest: u32, head: &[u8], body: &[u8]) -> Result<bool> {
        let queued = self
            .st
            .borrow()
            .outbox
            .get(&dest)
            .is_some_and(|q| !q.is_empty());
        if queued {
            return Ok(false);
        }
        self.ep.target_rank(dest)?;
        self.ep.try_write_parts(head, body)
    }

    /// Writes what the outbox holds, in order per destination, as far as the channels
    /// take it; returns whether anything was written.
    fn flush_outbox(&self) -> Result<bool> {
        let dests: Vec<u32> = {
            let st = self.st.borrow();
            if st.outbox.is_empty() {
                return Ok(false);
            }
            st.outbox.keys().copied().collect()
        };
        let mut wrote = false;
        for dest in dests {
            self.ep.target_rank(dest)?;
            loop {
                let mut st = self.st.borrow_mut();
                let chunk = st.chunk as u64;
                let Some(q) = st.outbox.get_mut(&dest) else {
                    break;
                };
                let Some(item) = q.front_mut() else {
                    st.outbox.remove(&dest);
                    break;
                };
                match item {
                    OutItem::Whole(bytes) => {
                        if !self.ep.try_write_parts(&[], bytes)? {
                            break;
                        }
                        q.pop_front();
                    }
                    OutItem::Range {
                        msg,
                        op,
                        ptr,
                        off,
                        end,
                    } => {
                        let stop = (*end).min(*off + chunk);
                        // SAFETY: [off, stop) lies inside the send buffer (checked against
                        // its length when the `Pull` arrived), which stays valid until the
                        // send completes, after the last chunk.
                        let part = unsafe {
                            std::slice::from_raw_parts(
                                ptr.add(*off as usize),
                                (stop - *off) as usize,
                            )
                        };
                        let data = Msg::Data {
                            msg: *msg,
                            offset: *off,
                            data: part,
                        };
                        if !self.ep.try_write_parts(data.header().as_bytes(), part)? {
                            break;
                        }
                        *off = stop;
                        if *off == *end {
                            let (msg, op) = (*msg, *op);
                            q.pop_front();
                            drop(st);
                            self.complete_send(dest, msg, op);
                        }
                    }
                }
                wrote = true;
            }
        }
        Ok(wrote)
    }

    /// Writes an application-initiated message (a push), waiting for room if needed but
    /// handling incoming messages and the outbox meanwhile, so that two ranks that both
    /// write never wait for each other.
    fn write_progressing(&self, dest: u32, head: &[u8], body: &[u8]) -> Result<()> {
        loop {
            if self.try_write_now(dest, head, body)? {
                return Ok(());
            }
            if !self.poll()? {
                std::thread::yield_now();
            }
        }
    }

    fn complete_send(&self, dest: u32, msg: u64, id: u64) {
        self.rma.end_split(dest, msg);
        let mut st = self.st.borrow_mut();
        st.outgoing.remove(&(dest, msg));
        if let Some(Op::Send(s)) = st.ops.get_mut(&id) {
            s.done = true;
        }
    }

    /// The result of operation `id` if it is complete (it is then forgotten).
    fn take_if_done(&self, id: u64) -> Option<Result<Status>> {
        let mut st = self.st.borrow_mut();
        let done = match st.ops.get_mut(&id)? {
            Op::Send(s) if s.done => Some(Ok(Status {
                peer: s.dest,
                tag: s.tag,
                len: s.len as u64,
            })),
            Op::Recv(RecvOp {
                state: RecvState::Done(r),
                ..
            }) => Some(r.take().unwrap_or(Err(Error::Cancelled))),
            _ => None,
        };
        if done.is_some() {
            st.ops.remove(&id);
        }
        done
    }

    /// Whether operation `id` is complete (its result stays for `wait`).
    fn test_op(&self, id: u64) -> Result<bool> {
        self.progress()?;
        let st = self.st.borrow();
        Ok(match st.ops.get(&id) {
            Some(Op::Send(s)) => s.done,
            Some(Op::Recv(r)) => matches!(r.state, RecvState::Done(_)),
            None => true,
        })
    }

    fn wait_op(&self, id: u64) -> Result<Status> {
        if !self.st.borrow().ops.contains_key(&id) {
            return Err(Error::Config(format!(
                "operation {id} was already waited for"
            )));
        }
        loop {
            while self.poll()? {}
            if let Some(r) = self.take_if_done(id) {
                return r;
            }
            self.wait_message()?;
        }
    }

    /// Cancels receive `id` if nothing has matched it yet.
    fn cancel_op(&self, id: u64) -> bool {
        let mut st = self.st.borrow_mut();
        let Some(i) = st.posted.iter().position(|&p| p == id) else {
            return false;
        };
        st.posted.remove(i);
        if let Some(Op::Recv(r)) = st.ops.get_mut(&id) {
            r.state = RecvState::Done(Some(Err(Error::Cancelled)));
        }
        true
    }
}

/// Marks a receive complete once every expected byte has landed; returns whether it is.
fn finish_if_complete(r: &mut RecvOp) -> bool {
    if let RecvState::Receiving {
        source,
        tag,
        total,
        expected,
        landed,
    } = r.state
    {
        if landed >= expected {
            r.state = RecvState::Done(Some(if total > r.cap as u64 {
                Err(Error::Truncated {
                    len: total,
                    capacity: r.cap,
                    rank: source,
                    tag,
                })
            } else {
                Ok(Status {
                    peer: source,
                    tag,
                    len: total,
                })
            }));
            return true;
        }
    }
    false
}

/// Reads one byte per page of `data`, so that its pages are mapped before the transfer
/// needs them.
fn touch_pages(data: &[u8]) {
    for i in (0..data.len()).step_by(4096) {
        // SAFETY: i < data.len(): an in-bounds read of initialized memory.
        unsafe { std::ptr::read_volatile(data.as_ptr().add(i)) };
    }
}

/// Non-blocking operations whose buffers outlive them; see [`Tagged::scope`].
pub struct Scope<'scope, 'env: 'scope> {
    t: &'env Tagged,
    started: RefCell<Vec<u64>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// A pending operation of a [`Scope`].
#[must_use = "an operation completes when waited for (or when its scope ends)"]
pub struct Request<'scope> {
    t: &'scope Tagged,
    id: u64,
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Starts sending `data` to `dest` with `tag`.
    pub fn isend(&'scope self, dest: u32, tag: u32, data: &'scope [u8]) -> Result<Request<'scope>> {
        let id = self.t.start_send(dest, tag, data)?;
        self.started.borrow_mut().push(id);
        Ok(Request { t: self.t, id })
    }

    /// Posts a receive of the first message matching (`src`, `tag`) into `buf`.
    pub fn irecv(
        &'scope self,
        buf: &'scope mut [u8],
        src: impl Into<Src>,
        tag: impl Into<Tag>,
    ) -> Result<Request<'scope>> {
        let id = self
            .t
            .start_recv(buf.as_mut_ptr(), buf.len(), src.into(), tag.into())?;
        self.started.borrow_mut().push(id);
        Ok(Request { t: self.t, id })
    }

    /// Waits for one of `reqs` to complete, removes it and returns its index (in `reqs`
    /// before removal) and result.
    pub fn wait_any(&self, reqs: &mut Vec<Request<'scope>>) -> Result<(usize, Result<Status>)> {
        if reqs.is_empty() {
            return Err(Error::Config("wait_any on no requests".into()));
        }
        loop {
            while self.t.poll()? {}
            for i in 0..reqs.len() {
                if let Some(r) = self.t.take_if_done(reqs[i].id) {
                    drop(reqs.remove(i));
                    return Ok((i, r));
                }
            }
            self.t.wait_message()?;
        }
    }

    /// Waits for every request; the results in order.
    pub fn wait_all(&self, reqs: Vec<Request<'scope>>) -> Vec<Result<Status>> {
        reqs.into_iter().map(Request::wait).collect()
    }

    /// Cancels what nothing matched and waits for the rest.
    fn finish(&self) -> Result<()> {
        let ids = std::mem::take(&mut *self.started.borrow_mut());
        let mut first_err = None;
        for id in ids {
            self.t.cancel_op(id);
            if !self.t.st.borrow().ops.contains_key(&id) {
                continue;
            }
            if let Err(e) = self.t.wait_op(id) {
                if !matches!(e, Error::Cancelled | Error::Truncated { .. }) {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Finishes a scope whose closure panicked, so that no buffer is left referenced.
struct FinishOnDrop<'a, 'scope, 'env>(&'a Scope<'scope, 'env>);

impl Drop for FinishOnDrop<'_, '_, '_> {
    fn drop(&mut self) {
        let _ = self.0.finish();
    }
}

impl Request<'_> {
    /// Makes progress and says whether the operation is complete ([`Request::wait`]
    /// then returns its result at once).
    pub fn test(&self) -> Result<bool> {
        self.t.test_op(self.id)
    }

    /// Waits for the operation to complete.
    pub fn wait(self) -> Result<Status> {
        self.t.wait_op(self.id)
    }

    /// Cancels a receive that no message has matched yet; returns whether it did
    /// (waiting for it then gives [`Error::Cancelled`]).
    pub fn cancel(&self) -> bool {
        self.t.cancel_op(self.id)
    }
}
