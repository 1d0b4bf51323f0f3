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
//!    A **synchronous** send (`ssend`, `issend`: MPI's `MPI_Ssend`) is a `Push` that its
//!    sender keeps open until a receive took it: the receiver answers `Done` at the match
//!    when nothing is left to pull, after the pull otherwise.
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
//!
//! The module's parts: this file holds the API ([`Tagged`], [`Scope`], [`Request`] and
//! their values); `matching` the posted and unexpected queues and the rule that pairs
//! them (sans-IO, where MPI's ordering rule is kept and property-tested); `pushpull` the
//! protocol: its handler of protocol messages runs on the engine's protocol hook
//! (`engine::protocol`, driven by the endpoint's station, answering through the
//! engine's outbox), the rest starts operations, makes pulls through `rma` and waits;
//! `wire` the protocol's messages. `sim_tests` runs the protocol over the simulated
//! network under seeded faults; `forged_pid_tests` has a rank forge a `Push` that names
//! another process than its own.

#[cfg(test)]
mod forged_pid_tests;
mod matching;
mod ops;
mod pushpull;
pub(crate) mod select;
#[cfg(test)]
mod sim_tests;
pub(crate) mod wire;

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
use crate::rma::{self, puller, SingleCopy};
use pushpull::{PushPull, State};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
    /// Same-node transfers refused because the peer named a process other than the one
    /// it proved to be (the nonce it published): a sender's `Push` whose pid is not its
    /// own (the pull went by request), or a receiver's split-copy slot naming another
    /// process (it read that part itself). Nothing of the named process was read or
    /// written; an honest peer never causes one.
    pub foreign_pids_refused: u64,
    /// Protocol messages dropped because they were malformed, named no known message,
    /// repeated or misplaced bytes, or pushed beyond their sender's credit.
    pub dropped: u64,
    /// Sends that pushed nothing because their receiver's pushed buffer had no room
    /// left for this endpoint (`QUIVER_PUSH_CREDIT`): the receiver pulled them whole.
    pub push_credit_exhausted: u64,
}

/// A tagged endpoint: a Directed Point endpoint that carries the Push-Pull protocol.
/// Every rank of the job opens one with the same DPID.
pub struct Tagged {
    /// The endpoint whose station carries the protocol (and whose error handler sees
    /// its errors).
    ep: Endpoint,
    /// The protocol, on the station's hook.
    pp: PushPull,
    /// Tells this endpoint's [`RawRequest`]s from other endpoints' (unique in the
    /// process).
    serial: u64,
    /// The list of a finished scope's operations, kept for the next scope (its memory
    /// would otherwise be allocated again, growing, in every window of operations).
    spare_list: RefCell<Vec<u64>>,
}

/// The next [`Tagged::serial`].
static SERIALS: AtomicU64 = AtomicU64::new(0);

pub use crate::rma::window::SharedBuf;

/// The application's calls, on the protocol.
impl Tagged {
    /// Starts a non-blocking send: a message that leaves whole in one push is complete
    /// at once and keeps no record (its request carries its status), unless the send is
    /// synchronous (`sync`: complete once a receive took it).
    fn start_send(&self, dest: u32, tag: u32, data: &[u8], sync: bool) -> Result<Ticket> {
        if !sync && self.pp.send_eager(&self.ep, dest, tag, data)? {
            return Ok(Ticket::Sent(Status {
                peer: dest,
                tag,
                len: data.len() as u64,
            }));
        }
        let id = self.pp.start_send(&self.ep, dest, tag, data, true, sync)?;
        Ok(Ticket::Op(id.expect("a send recorded whole has an id")))
    }

    #[inline]
    fn start_recv(&self, ptr: *mut u8, cap: usize, src: Src, tag: Tag) -> Result<u64> {
        self.pp.start_recv(&self.ep, ptr, cap, src, tag)
    }

    #[inline]
    fn wait_op(&self, id: u64) -> Result<Status> {
        self.pp.wait_op(&self.ep, id)
    }
}

impl Tagged {
    /// Opens the tagged endpoint `dpid` of this rank (every rank uses the same DPID).
    pub fn open(job: &Job, dpid: u16) -> Result<Tagged> {
        let ep = job.open(dpid)?;
        let rma = SingleCopy::open(job, dpid)?;
        let st = State::new(job.config(), job.size());
        Ok(Tagged {
            ep,
            pp: PushPull::new(st, rma, job.rank()),
            serial: SERIALS.fetch_add(1, Ordering::Relaxed),
            spare_list: RefCell::new(Vec::new()),
        })
    }

    /// Allocates `len` bytes from the job's shared pool (a shared-memory object of this
    /// endpoint, private to the job's user). A message sent from it to a rank of the
    /// same node is read in place by the receiver: one copy, no cross-memory attach
    /// needed. Zero-filled.
    pub fn alloc_shared(&self, len: usize) -> Result<SharedBuf<'_>> {
        self.pp.rma.alloc_shared(len)
    }

    /// The Directed Point endpoint underneath (its statistics, descriptor...). Its
    /// error handler ([`Endpoint::set_error_handler`]) sees the errors of this tagged
    /// endpoint's calls too, and runs inside them: it must use neither the endpoint nor
    /// the tagged endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Selects the push mode for later sends.
    pub fn set_push(&self, mode: PushMode) {
        self.pp.st.borrow_mut().mode = mode;
    }

    /// Sets BTP(1) and BTP(2) for later sends in [`PushMode::Pull`]; the pushed buffer
    /// holds at most BTP(1) + BTP(2) bytes per unexpected message.
    pub fn set_btp(&self, btp1: usize, btp2: usize) {
        let mut st = self.pp.st.borrow_mut();
        st.btp1 = btp1.min(st.chunk);
        st.btp2 = btp2;
    }

    /// The push mode and BTP(1), BTP(2) in force.
    pub fn push(&self) -> (PushMode, usize, usize) {
        let st = self.pp.st.borrow();
        (st.mode, st.btp1, st.btp2)
    }

    /// The endpoint's counters.
    pub fn stats(&self) -> TaggedStats {
        let mut stats = self.pp.st.borrow().stats.clone();
        let split = self.pp.rma.stats();
        stats.pulled_split_by_sender = split.written_by_peers;
        stats.split_helped = split.written_for_peers;
        stats.foreign_pids_refused = split.pids_refused;
        stats
    }

    /// Sends `data` to `dest` with `tag`; returns when the buffer may be reused (the
    /// receiver has pulled what was not pushed). Like MPI's rendezvous send, a message
    /// longer than what is pushed (BTP(1) + BTP(2); everything in Push-Zero) waits for
    /// the receiver to post a matching receive: two ranks that both `send` such a message
    /// to each other before receiving wait for ever. Use [`Scope::isend`] there.
    pub fn send(&self, dest: u32, tag: u32, data: &[u8]) -> Result<()> {
        if self.pp.send_eager(&self.ep, dest, tag, data)? {
            return Ok(());
        }
        match self
            .pp
            .start_send(&self.ep, dest, tag, data, false, false)?
        {
            Some(id) => self.wait_op(id).map(|_| ()),
            // Left whole in its first push: complete.
            None => Ok(()),
        }
    }

    /// Sends `data` to `dest` with `tag` synchronously (MPI's `MPI_Ssend`): returns once
    /// a receive at `dest` has taken the message (and the buffer may be reused), never
    /// before, whatever its length. Two ranks that both `ssend` to each other before
    /// receiving wait for ever.
    pub fn ssend(&self, dest: u32, tag: u32, data: &[u8]) -> Result<()> {
        match self.pp.start_send(&self.ep, dest, tag, data, true, true)? {
            Some(id) => self.wait_op(id).map(|_| ()),
            None => unreachable!("a synchronous send keeps its record"),
        }
    }

    /// Sends `data` to `dest` with `tag` if it leaves whole at once, as an eager message
    /// (push mode `Pull` or `All`, at most BTP(1) bytes, credit left at the receiver):
    /// `Ok(true)`, and the buffer may be reused. `Ok(false)`, having sent nothing, for
    /// any other message (then [`Tagged::send`] or [`Tagged::isend_raw`], which also try
    /// this first). For a caller that must know before it waits (MPI's blocking send,
    /// which drives its other endpoints while it waits but need not for this).
    pub fn try_send(&self, dest: u32, tag: u32, data: &[u8]) -> Result<bool> {
        self.pp.send_eager(&self.ep, dest, tag, data)
    }

    /// Receives the first message that matches (`src`, `tag`) into `buf`.
    /// [`Error::Truncated`] if it is longer than `buf` (which then holds its start).
    pub fn recv(&self, buf: &mut [u8], src: impl Into<Src>, tag: impl Into<Tag>) -> Result<Status> {
        self.pp.recv(
            &self.ep,
            buf.as_mut_ptr(),
            buf.len(),
            src.into(),
            tag.into(),
        )
    }

    /// The status of the first message that matches, without receiving it, if one has
    /// arrived.
    pub fn iprobe(&self, src: impl Into<Src>, tag: impl Into<Tag>) -> Result<Option<Status>> {
        let (src, tag) = (src.into(), tag.into());
        self.progress()?;
        let st = self.pp.st.borrow();
        Ok(st.matching.probe(src, tag).map(|u| Status {
            peer: u.source,
            tag: u.tag,
            len: u.msg.head.total,
        }))
    }

    /// Waits for a message that matches and returns its status without receiving it.
    pub fn probe(&self, src: impl Into<Src>, tag: impl Into<Tag>) -> Result<Status> {
        match self.probe_until(src.into(), tag.into(), None)? {
            Some(s) => Ok(s),
            None => unreachable!("a probe without a deadline returns only with a status"),
        }
    }

    /// Like [`Tagged::probe`], waiting at most `limit`: `None` if no message matched by
    /// then. Lets a binding check for interrupts while it waits.
    pub fn probe_within(
        &self,
        src: impl Into<Src>,
        tag: impl Into<Tag>,
        limit: Duration,
    ) -> Result<Option<Status>> {
        let deadline = Instant::now().checked_add(limit);
        self.probe_until(src.into(), tag.into(), deadline)
    }

    fn probe_until(&self, src: Src, tag: Tag, deadline: Option<Instant>) -> Result<Option<Status>> {
        loop {
            if let Some(s) = self.iprobe(src, tag)? {
                return Ok(Some(s));
            }
            let left = match left_until(deadline) {
                Ok(left) => left,
                Err(Passed) => return Ok(None),
            };
            match self.pp.wait_message(&self.ep, left) {
                Ok(()) | Err(Error::Timeout(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether this endpoint has nothing to do until a message arrives: no operation
    /// under way or not yet waited for, no answer queued for a peer, and no network
    /// timer running (acknowledgements, retransmissions, heartbeats: an endpoint with a
    /// network channel is never idle). A runtime that drives several endpoints from one
    /// thread may block on one while the others are idle; one that is not idle must be
    /// driven ([`Tagged::progress`]) meanwhile, since in `host` and `none` reliability
    /// nothing moves outside quiver's calls.
    pub fn idle(&self) -> bool {
        self.pp.idle() && self.ep.poll_timeout().is_none()
    }

    /// Handles every protocol message that has arrived; returns without waiting.
    pub fn progress(&self) -> Result<()> {
        self.pp.progress(&self.ep)
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
            // Empty: a finished scope clears it (a scope inside this one gets a new list).
            started: RefCell::new(std::mem::take(&mut *self.spare_list.borrow_mut())),
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
}

/// Non-blocking operations without a scope, for bindings to languages whose buffers
/// Rust's borrows cannot follow (the C library, Python). The caller promises what a
/// scope would check: a buffer stays valid, and untouched by anyone else, until its
/// operation is complete (its wait or [`Tagged::abandon_raw`] returned, or
/// [`Tagged::test_raw`] said so) or the tagged endpoint is dropped, which first
/// abandons every pending operation.
impl Tagged {
    fn raw(&self, ticket: Ticket) -> RawRequest {
        RawRequest {
            endpoint: self.serial,
            ticket,
        }
    }

    fn own(&self, req: &RawRequest) -> Result<Ticket> {
        if req.endpoint != self.serial {
            return Err(Error::Config(
                "the request belongs to another tagged endpoint".into(),
            ));
        }
        Ok(req.ticket)
    }

    /// Starts sending `len` bytes at `data` to `dest` with `tag`.
    ///
    /// # Safety
    ///
    /// `data..data + len` is readable, and nothing writes it, until the request is
    /// complete or the endpoint dropped (see the block's documentation).
    pub unsafe fn isend_raw(
        &self,
        dest: u32,
        tag: u32,
        data: *const u8,
        len: usize,
    ) -> Result<RawRequest> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.isend_raw_as(dest, tag, data, len, false) }
    }

    /// [`Tagged::isend_raw`] of a synchronous send ([`Tagged::ssend`], MPI's
    /// `MPI_Issend`): complete once a receive took the message (a message no receive
    /// takes is never complete: abandon it to let go).
    ///
    /// # Safety
    ///
    /// As [`Tagged::isend_raw`].
    pub unsafe fn issend_raw(
        &self,
        dest: u32,
        tag: u32,
        data: *const u8,
        len: usize,
    ) -> Result<RawRequest> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.isend_raw_as(dest, tag, data, len, true) }
    }

    /// [`Tagged::isend_raw`], synchronous or not.
    ///
    /// # Safety
    ///
    /// As [`Tagged::isend_raw`].
    unsafe fn isend_raw_as(
        &self,
        dest: u32,
        tag: u32,
        data: *const u8,
        len: usize,
        sync: bool,
    ) -> Result<RawRequest> {
        let data = if len == 0 {
            &[][..]
        } else {
            // SAFETY: the caller promises `len` readable bytes at `data` for as long as
            // the operation may read them; the slice lives only during this call, after
            // which the protocol keeps the range as a raw pointer.
            unsafe { std::slice::from_raw_parts(data, len) }
        };
        self.start_send(dest, tag, data, sync).map(|t| self.raw(t))
    }

    /// Posts a receive of the first message matching (`src`, `tag`) into the `cap`
    /// bytes at `buf`.
    ///
    /// # Safety
    ///
    /// `buf..buf + cap` is writable, and nobody else reads or writes it, until the
    /// request is complete or the endpoint dropped.
    pub unsafe fn irecv_raw(
        &self,
        buf: *mut u8,
        cap: usize,
        src: impl Into<Src>,
        tag: impl Into<Tag>,
    ) -> Result<RawRequest> {
        let buf = if cap == 0 {
            std::ptr::NonNull::dangling().as_ptr()
        } else {
            buf
        };
        self.start_recv(buf, cap, src.into(), tag.into())
            .map(|id| self.raw(Ticket::Op(id)))
    }

    /// Makes progress and says whether the operation is complete (its wait then returns
    /// at once, and its buffer is no longer used).
    pub fn test_raw(&self, req: &RawRequest) -> Result<bool> {
        self.test_ticket(self.own(req)?)
    }

    /// Waits for the operation to complete.
    pub fn wait_raw(&self, req: RawRequest) -> Result<Status> {
        self.wait_ticket(self.own(&req)?)
    }

    /// Waits at most `limit` for the operation: `None` if it is still pending then (wait
    /// again, or abandon it), otherwise its result (the request is then spent: a later
    /// wait of it is an error, but for a send that was complete when it started, whose
    /// request carries its status and gives it again). Lets a binding check for
    /// interrupts while it waits.
    pub fn wait_raw_within(&self, req: &RawRequest, limit: Duration) -> Option<Result<Status>> {
        let id = match self.own(req) {
            Ok(Ticket::Op(id)) => id,
            Ok(Ticket::Sent(status)) => return Some(Ok(status)),
            Err(e) => return Some(Err(e)),
        };
        let deadline = Instant::now().checked_add(limit);
        self.pp.wait_op_until(&self.ep, id, deadline)
    }

    /// Waits for one of `reqs` to complete and returns its index and result; that
    /// request is spent.
    pub fn wait_any_raw(&self, reqs: &[&RawRequest]) -> Result<(usize, Result<Status>)> {
        let tickets = reqs
            .iter()
            .map(|r| self.own(r))
            .collect::<Result<Vec<Ticket>>>()?;
        self.wait_any_ticket(&tickets)
    }

    /// Like [`Tagged::wait_any_raw`], waiting at most `limit`: `None` if none of `reqs`
    /// completed by then (they all stay pending).
    pub fn wait_any_raw_within(
        &self,
        reqs: &[&RawRequest],
        limit: Duration,
    ) -> Result<Option<(usize, Result<Status>)>> {
        let tickets = reqs
            .iter()
            .map(|r| self.own(r))
            .collect::<Result<Vec<Ticket>>>()?;
        self.wait_any_until(&tickets, Instant::now().checked_add(limit))
    }

    /// Cancels a receive that no message has matched yet; returns whether it did
    /// (waiting for it then gives [`Error::Cancelled`]).
    pub fn cancel_raw(&self, req: &RawRequest) -> bool {
        matches!(self.own(req), Ok(Ticket::Op(id)) if self.pp.cancel_op(id))
    }

    /// Ends the operation whether or not it is complete, so that its buffer may be
    /// reused at once: a receive is withdrawn (its sender, if matched, is answered), a
    /// send stops and its receiver's receive fails. For a wait interrupted by the user.
    pub fn abandon_raw(&self, req: RawRequest) {
        if let Ok(Ticket::Op(id)) = self.own(&req) {
            if self.pp.take_if_done(id).is_none() {
                self.pp.abandon(&self.ep, id);
            }
        }
    }

    fn wait_any_ticket(&self, tickets: &[Ticket]) -> Result<(usize, Result<Status>)> {
        match self.wait_any_until(tickets, None)? {
            Some(done) => Ok(done),
            None => unreachable!("a wait without a deadline returns only when one is done"),
        }
    }

    fn wait_any_until(
        &self,
        tickets: &[Ticket],
        deadline: Option<Instant>,
    ) -> Result<Option<(usize, Result<Status>)>> {
        if tickets.is_empty() {
            return Err(Error::Config("wait_any on no requests".into()));
        }
        loop {
            while self.pp.poll(&self.ep)? {}
            for (i, &ticket) in tickets.iter().enumerate() {
                let done = match ticket {
                    Ticket::Op(id) => self.pp.take_if_done(id),
                    Ticket::Sent(status) => Some(Ok(status)),
                };
                if let Some(r) = done {
                    return Ok(Some((i, r)));
                }
            }
            let left = match left_until(deadline) {
                Ok(left) => left,
                Err(Passed) => return Ok(None),
            };
            match self.pp.wait_message(&self.ep, left) {
                Ok(()) | Err(Error::Timeout(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// A deadline that has passed.
struct Passed;

/// The time left until `deadline` (`None`: no deadline, wait as long as it takes).
fn left_until(deadline: Option<Instant>) -> std::result::Result<Option<Duration>, Passed> {
    match deadline {
        None => Ok(None),
        Some(at) => match at.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => Ok(Some(left)),
            _ => Err(Passed),
        },
    }
}

/// A pending operation started by [`Tagged::isend_raw`] or [`Tagged::irecv_raw`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an operation's buffer is in use until it is waited for or abandoned"]
pub struct RawRequest {
    /// The [`Tagged::serial`] of the endpoint that started it.
    endpoint: u64,
    ticket: Ticket,
}

/// What a request stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ticket {
    /// Operation `id` of the protocol's table.
    Op(u64),
    /// A send that was complete when it started (it left whole in one push: nothing
    /// records it, nothing will answer it), with its status.
    Sent(Status),
}

/// Operations of the protocol's table waited for through tickets.
impl Tagged {
    fn test_ticket(&self, ticket: Ticket) -> Result<bool> {
        match ticket {
            Ticket::Op(id) => self.pp.test_op(&self.ep, id),
            Ticket::Sent(_) => Ok(true),
        }
    }

    fn wait_ticket(&self, ticket: Ticket) -> Result<Status> {
        match ticket {
            Ticket::Op(id) => self.wait_op(id),
            Ticket::Sent(status) => Ok(status),
        }
    }
}

/// A closing tagged endpoint first sends the answers its peers wait for (a `Done` for a
/// message it received, the bytes a receiver asked for), for up to two seconds; then its
/// endpoint lingers for the network's acknowledgements.
impl Drop for Tagged {
    fn drop(&mut self) {
        // Operations started without a scope and never waited for: their buffers are
        // the caller's again once the endpoint is gone.
        for id in self.pp.pending_ops() {
            self.pp.abandon(&self.ep, id);
        }
        self.pp.linger(&self.ep, LINGER);
    }
}

/// How long a closing tagged endpoint keeps trying to send its outbox.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// Non-blocking operations whose buffers outlive them; see [`Tagged::scope`].
pub struct Scope<'scope, 'env: 'scope> {
    t: &'env Tagged,
    started: RefCell<Vec<u64>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// The longest list of a scope's operations kept for the next scope.
const SPARE_LIST_MAX: usize = 4096;

/// A pending operation of a [`Scope`].
#[must_use = "an operation completes when waited for (or when its scope ends)"]
pub struct Request<'scope> {
    t: &'scope Tagged,
    ticket: Ticket,
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Starts sending `data` to `dest` with `tag`.
    pub fn isend(&'scope self, dest: u32, tag: u32, data: &'scope [u8]) -> Result<Request<'scope>> {
        self.isend_as(dest, tag, data, false)
    }

    /// Starts sending `data` to `dest` with `tag` synchronously: the request completes
    /// once a receive took the message ([`Tagged::ssend`]). The scope's end waits for it
    /// as for every request: a message no receive takes holds the scope for ever.
    pub fn issend(
        &'scope self,
        dest: u32,
        tag: u32,
        data: &'scope [u8],
    ) -> Result<Request<'scope>> {
        self.isend_as(dest, tag, data, true)
    }

    fn isend_as(
        &'scope self,
        dest: u32,
        tag: u32,
        data: &'scope [u8],
        sync: bool,
    ) -> Result<Request<'scope>> {
        let ticket = self.t.start_send(dest, tag, data, sync)?;
        if let Ticket::Op(id) = ticket {
            self.started.borrow_mut().push(id);
        }
        Ok(Request { t: self.t, ticket })
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
        Ok(Request {
            t: self.t,
            ticket: Ticket::Op(id),
        })
    }

    /// Waits for one of `reqs` to complete, removes it and returns its index (in `reqs`
    /// before removal) and result.
    pub fn wait_any(&self, reqs: &mut Vec<Request<'scope>>) -> Result<(usize, Result<Status>)> {
        let tickets: Vec<Ticket> = reqs.iter().map(|r| r.ticket).collect();
        let (i, r) = self.t.wait_any_ticket(&tickets)?;
        drop(reqs.remove(i));
        Ok((i, r))
    }

    /// Waits for every request; the results in order.
    pub fn wait_all(&self, reqs: Vec<Request<'scope>>) -> Vec<Result<Status>> {
        let mut results = Vec::with_capacity(reqs.len());
        let mut next = 0;
        while next < reqs.len() {
            // Those complete already, under one look at their endpoint's table (a
            // window's messages complete many at a time; a request of an outer scope may
            // be another endpoint's); then a wait, which makes progress, for the first
            // that is not.
            next += reqs[next].t.pp.take_done_run(&reqs[next..], &mut results);
            if let Some(r) = reqs.get(next) {
                results.push(r.t.wait_ticket(r.ticket));
                next += 1;
            }
        }
        results
    }

    /// Cancels what nothing matched and waits for the rest.
    fn finish(&self) -> Result<()> {
        let mut ids = std::mem::take(&mut *self.started.borrow_mut());
        let mut first_err = None;
        // Usually every operation was waited for, and no other is under way: nothing to
        // look up one by one.
        let pending = if self.t.pp.has_ops() { &ids[..] } else { &[] };
        for &id in pending {
            // Most were waited for already: one look at the table for them.
            if !self.t.pp.is_pending(id) {
                continue;
            }
            self.t.pp.cancel_op(id);
            if !self.t.pp.is_pending(id) {
                continue;
            }
            if let Err(e) = self.t.wait_op(id) {
                if !matches!(e, Error::Cancelled | Error::Truncated { .. }) {
                    first_err.get_or_insert(e);
                }
            }
        }
        if ids.capacity() <= SPARE_LIST_MAX {
            ids.clear();
            *self.t.spare_list.borrow_mut() = ids;
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
        self.t.test_ticket(self.ticket)
    }

    /// Waits for the operation to complete.
    pub fn wait(self) -> Result<Status> {
        self.t.wait_ticket(self.ticket)
    }

    /// Cancels a receive that no message has matched yet; returns whether it did
    /// (waiting for it then gives [`Error::Cancelled`]).
    pub fn cancel(&self) -> bool {
        matches!(self.ticket, Ticket::Op(id) if self.t.pp.cancel_op(id))
    }
}
