//! The Push-Pull protocol of a tagged endpoint (the steps are in the
//! [module documentation](super)), in two halves:
//!
//! - [`Handler`], the protocol on the engine's hook (`engine::protocol`): it handles the
//!   protocol messages that arrive (`Push`, `More`, `Pull`, `Data`, `Done`) where the
//!   station's progress runs, answers through the engine's outbox (a `Pull` is answered
//!   with a range of the send buffer, sent in chunks without a copy) and does no I/O: it
//!   matches, copies pushed bytes into receive buffers and records the pulls to make.
//!   The simulator runs it as it is (`sim_tests`).
//! - [`PushPull`], the application's side: starting sends (pushes, the split-copy offer)
//!   and receives (matching through [`Matching`]), making the recorded pulls (a get of
//!   `rma` on one node, else a `Pull` request), collecting the pull thread's gets, and
//!   the wait loops. It reaches the engine through a [`Footing`]: the endpoint's station
//!   (in production, the `dm::Endpoint` the tagged endpoint is opened on, whose error
//!   handler sees the errors) or a bare station (in the simulator).
//!
//! What it owns: every operation from its start until its result is taken (`State::ops`),
//! the pushed buffer, the matched receives still expecting bytes, the sends waiting for
//! their receiver, the pulls to make, and the outbox. What it guarantees: a handler never
//! waits for a peer (what a peer's route cannot take now waits in the outbox, in order
//! per destination); a malformed message or one naming no known message is counted
//! (`dropped`) and dropped, never a panic; a receive buffer is written only inside its
//! capacity and only while its operation is pending.

use super::matching::{Arrived, Matching};
use super::ops::Ops;
use super::select::{self, Pipeline, Way};
use super::wire::{self, Announce, Msg};
use super::{PushMode, Request, Src, Status, Tag, TaggedStats, Ticket, SECOND_PUSH_MAX};
use crate::addr::Source;
use crate::channel::reliable::Time;
use crate::config::Config;
use crate::engine::protocol::{Disposition, Outbox, Protocol};
use crate::engine::station::{frames_within, message_in_frames, Footing};
use crate::error::{Error, Result};
use crate::link::Transport;
use crate::rma::{GetError, Got, Offer, Peer, Remote, SingleCopy};
use crate::FastMap;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

/// The outbox's bound. Every item answers one operation of the application's (a `Pull`
/// of one of its sends, a `Pull` or `Done` of one of its receives), so the
/// application's operations bound what it holds; a bound below that could stop two ends
/// from reading while each waits for room in the other's ring, so none is set.
const OUTBOX_ITEMS: usize = usize::MAX;

/// The fewest bytes a frame of a pulled `Data` carries on a network channel: a frame
/// too small for that (a tiny MTU) answers in `State::chunk`s.
const MIN_ANSWER_CHUNK: usize = 512;

/// About how long a pulled `Data` is on a network channel (whole frames, at least
/// this): its reassembly copy waits for its last frame, so a 1 MiB `Data` delayed the
/// message's end by the copy of 1 MiB, while a `Data` per frame made the receive path
/// take a message per frame (and, both ways at 1 Gbit/s, filled the link only to 70 %).
/// 64 KiB is also the smallest reassembly buffer the channel keeps for the next message
/// (`channel::rx::SpareBuffers::MIN`): a shorter one would be allocated afresh each time.
const ANSWER_BYTES: usize = 64 << 10;

/// The protocol state of one tagged endpoint.
pub(super) struct State {
    pub(super) mode: PushMode,
    pub(super) btp1: usize,
    pub(super) btp2: usize,
    /// Largest payload of one protocol message.
    pub(super) chunk: usize,
    /// The pipelines (`select`) inside a node and between nodes.
    pipeline_shm: Pipeline,
    pipeline_net: Pipeline,
    next_msg: u64,
    pub(super) ops: Ops<Op>,
    /// Receives posted and not matched yet, and first pushes that found no posted
    /// receive (the pushed buffer).
    pub(super) matching: Matching<Unexpected>,
    /// Bytes the pushed buffer holds.
    pushed_bytes: u64,
    /// Matched receives still expecting bytes: (source, message) → operation.
    incoming: FastMap<(u32, u64), u64>,
    /// Sends waiting for their receiver's `Pull` or `Done`: (destination, message) →
    /// operation.
    outgoing: FastMap<(u32, u64), u64>,
    /// Matched receives too short for what their sender pushes: (source, message) → the
    /// end of the pushed bytes. Pushed bytes past the buffer are let go (not counted
    /// dropped) until the last of them has come.
    discarding: FastMap<(u32, u64), u64>,
    /// Matched receives whose rest is still to be pulled (`PushPull::make_pulls`), in
    /// the order they matched.
    to_pull: VecDeque<PullJob>,
    /// Receives whose pull the pull thread makes: operation → (source, message, offset,
    /// length).
    pulls: FastMap<u64, (u32, u64, u64, u64)>,
    pub(super) stats: TaggedStats,
    /// Operations completed so far (a drive of the station returns to the application
    /// after one: it may be the one the application waits for).
    completions: u64,
    /// Pushed bytes each sender may have in this endpoint's pushed buffer, and each
    /// receiver in its own (`Config::push_credit`).
    push_credit: u64,
    /// Per destination: pushed bytes sent and not yet given back by its receiver
    /// (`Credit`). A send pushes only while this stays within `push_credit`.
    push_in_flight: Vec<u64>,
    /// Per destination: the bytes of each `Data` that answers its `Pull` (0: not known
    /// yet, found by the first send to it: `PushPull::answer_chunk_to`). On a network
    /// channel about 64 KiB in whole frames ([`ANSWER_BYTES`]); on shared memory
    /// `chunk`.
    answer_chunks: Vec<u32>,
    /// Per source: pushed bytes received and not yet given back. More than
    /// `push_credit` is the sender's protocol error.
    push_owed: Vec<u64>,
    /// Per source: of `push_owed`, bytes that have left the pushed buffer (or never
    /// entered it), given back in the next `Credit`.
    push_freed: Vec<u64>,
    /// Errors the handler found, for the application's next call (a peer that pushed
    /// beyond its credit).
    errors: VecDeque<Error>,
}

impl State {
    /// A fresh endpoint's state in a job of `size` ranks, with the push mode, BTP(1),
    /// BTP(2), push credit and largest protocol message of `cfg`.
    pub(super) fn new(cfg: &Config, size: u32) -> State {
        let chunk = cfg.max_message - wire::MAX_HEADER;
        let ranks = size as usize;
        let btp1 = cfg.btp1.min(chunk);
        State {
            pipeline_shm: Pipeline::of(cfg, Transport::Shm, cfg.cma, btp1, chunk),
            pipeline_net: Pipeline::of(cfg, Transport::Udp, false, btp1, chunk),
            mode: cfg.push,
            btp1,
            btp2: cfg.btp2,
            chunk,
            next_msg: 0,
            ops: Ops::new(),
            matching: Matching::new(),
            pushed_bytes: 0,
            incoming: FastMap::default(),
            outgoing: FastMap::default(),
            discarding: FastMap::default(),
            to_pull: VecDeque::new(),
            pulls: FastMap::default(),
            stats: TaggedStats::default(),
            completions: 0,
            push_credit: cfg.push_credit as u64,
            push_in_flight: vec![0; ranks],
            answer_chunks: vec![0; ranks],
            push_owed: vec![0; ranks],
            push_freed: vec![0; ranks],
            errors: VecDeque::new(),
        }
    }

    /// Whether a message pushing `pushed` bytes to `dest` may push them: its receiver
    /// has credit for them, and they are at most a quarter of the credit (so that
    /// freed bytes are given back before a sender runs dry: `free_pushed`). Takes
    /// the credit if so.
    fn take_push_credit(&mut self, dest: u32, pushed: usize) -> bool {
        let limit = self.push_credit;
        let Some(in_flight) = self.push_in_flight.get_mut(dest as usize) else {
            return false;
        };
        let pushed = pushed as u64;
        if pushed > limit / 4 || *in_flight + pushed > limit {
            return false;
        }
        *in_flight += pushed;
        true
    }

    /// Whether `n` more pushed bytes from `source` stay within its credit.
    fn push_fits(&self, source: u32, n: usize) -> bool {
        self.push_owed
            .get(source as usize)
            .is_some_and(|&owed| owed + n as u64 <= self.push_credit)
    }

    /// `n` pushed bytes from `source` arrived: false (and an error for the application,
    /// the message dropped) if they exceed the sender's credit.
    #[inline(always)]
    fn charge_push(&mut self, source: u32, n: usize) -> bool {
        let limit = self.push_credit;
        let Some(owed) = self.push_owed.get_mut(source as usize) else {
            self.stats.dropped += 1;
            return false;
        };
        if *owed + n as u64 > limit {
            let beyond = *owed + n as u64 - limit;
            self.refuse_push(source, beyond);
            return false;
        }
        *owed += n as u64;
        true
    }

    /// A push from `source` came `beyond` bytes past its credit: dropped, and an error
    /// for the application.
    #[cold]
    fn refuse_push(&mut self, source: u32, beyond: u64) {
        self.stats.dropped += 1;
        self.errors.push_back(Error::Protocol {
            rank: source,
            reason: format!(
                "it pushed {beyond} bytes beyond its credit of {} (QUIVER_PUSH_CREDIT must be \
                 the same on every rank); the message was dropped",
                self.push_credit
            ),
        });
    }
}

/// `n` pushed bytes from `from` left the pushed buffer (or never entered it: they
/// matched at once, or were dropped): once a quarter of the credit is free, it goes
/// back to the sender.
#[inline]
fn free_pushed(st: &mut State, out: &mut Outbox, from: Source, n: usize) {
    let i = from.rank as usize;
    let (Some(freed), Some(owed)) = (st.push_freed.get_mut(i), st.push_owed.get_mut(i)) else {
        return;
    };
    *freed += n as u64;
    if *freed > 0 && *freed >= st.push_credit / 4 {
        let bytes = std::mem::take(freed);
        *owed = owed.saturating_sub(bytes);
        queue(out, &mut st.stats, from, &Msg::Credit { bytes });
    }
}

#[cfg(test)]
impl State {
    /// Whether nothing is left in flight: no operation, pushed message, expected byte,
    /// pull or truncated message's tail (after every result was taken).
    pub(super) fn is_quiet(&self) -> bool {
        self.ops.is_empty()
            && self.pushed_bytes == 0
            && self.incoming.is_empty()
            && self.outgoing.is_empty()
            && self.discarding.is_empty()
            && self.to_pull.is_empty()
            && self.pulls.is_empty()
            && self.errors.is_empty()
    }

    /// Bytes landed so far in receive `id`, once a message matched it and while its
    /// pull (if any) has been made.
    pub(super) fn landed_after_pull(&self, id: u64) -> Option<u64> {
        match self.ops.get(&id) {
            Some(Op::Recv(RecvOp {
                state: RecvState::Receiving(rc),
                ..
            })) if !self.to_pull.iter().any(|j| j.op == id) => Some(rc.landed),
            _ => None,
        }
    }

    /// Pushed bytes sent to `dest` that its receiver has not given back.
    pub(super) fn push_in_flight(&self, dest: u32) -> u64 {
        self.push_in_flight[dest as usize]
    }

    /// Pushed bytes received from `source` not given back yet.
    pub(super) fn push_owed(&self, source: u32) -> u64 {
        self.push_owed[source as usize]
    }
}

/// A send or a receive, from its start until its result is taken.
pub(super) enum Op {
    Send(SendOp),
    Recv(RecvOp),
}

// An operation and its id fill at most one cache line of the table.
const _: () = assert!(std::mem::size_of::<(u64, Op)>() <= 64);

pub(super) struct SendOp {
    dest: u32,
    tag: u32,
    /// The protocol's number of the message.
    msg: u64,
    ptr: *const u8,
    len: usize,
    state: SendState,
    /// A range of the buffer answers the receiver's `Pull` (in the outbox): the send
    /// completes when it is done, not before (a `Done` meanwhile is not believed), and
    /// a second `Pull` is refused.
    answering: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendState {
    /// The receiver may still read the buffer (or ask for its bytes).
    Pending,
    /// The receiver is done with it.
    Done,
    /// Its pulled bytes could not all be sent (the receiver's route failed).
    Failed,
}

pub(super) struct RecvOp {
    ptr: *mut u8,
    cap: usize,
    state: RecvState,
}

pub(super) enum RecvState {
    /// Waiting in the matching's queues for a message from `src` with `tag`.
    Posted {
        src: Src,
        tag: Tag,
    },
    /// Matched to a message that did not come whole. Boxed: the state of every other
    /// receive then fits, with its operation's id, in one cache line of the table.
    Receiving(Box<Receiving>),
    Done(Option<Outcome>),
}

/// A receive matched to message `msg` of `source`, whose bytes are landing.
pub(super) struct Receiving {
    source: u32,
    tag: u32,
    msg: u64,
    total: u64,
    /// Bytes that will land in the buffer: min(total, capacity).
    expected: u64,
    /// Distinct bytes landed in the buffer so far.
    landed: u64,
    /// Where the next pushed bytes (`More`) must start, and where they end: pushed
    /// bytes arrive in order, so a repeated or misplaced one is refused.
    push_next: u64,
    push_end: u64,
    /// Where the next pulled bytes (`Data`) must start (they arrive in order, up to
    /// `expected`).
    pull_next: u64,
    /// Whether the sender waits for this receive's word after the pull (its message was
    /// not pushed whole; a synchronous send pushed whole had its `Done` at the match).
    sender_waits: bool,
}

/// An operation's result as the table keeps it: the error boxed, so that what a
/// message's path writes and moves is three words, not the nine of a [`Result`] of
/// [`Error`] (a result becomes one again when the application takes it).
pub(super) type Outcome = std::result::Result<Status, Box<Error>>;

/// A first push that found no posted receive, with the pushed bytes that followed it.
pub(super) struct Unexpected {
    pub(super) head: Announce,
    data: Vec<u8>,
}

/// What a send pushes: `first` bytes with the announcement, then up to `pushed` in
/// `More` messages of `step` bytes.
#[derive(Clone, Copy)]
struct Pushes {
    first: usize,
    pushed: usize,
    step: usize,
    /// A synchronous send ([`wire::Announce::sync`]).
    sync: bool,
}

/// The rest of a matched message, to pull into receive `op`: bytes `from..from + len`
/// of message `head.msg` from `source`.
struct PullJob {
    op: u64,
    source: Source,
    head: Announce,
    from: u64,
    len: u64,
}

/// The Push-Pull protocol of one tagged endpoint: its state, its outbox and its
/// same-node pulls. Every call that moves bytes takes the [`Footing`] it runs on.
pub(super) struct PushPull {
    pub(super) st: RefCell<State>,
    pub(super) out: RefCell<Outbox>,
    /// Same-node pulls (shared buffers, cross-memory attach, split copies, the pull
    /// thread) and the sender's side of split copies.
    pub(super) rma: SingleCopy,
    rank: u32,
    /// This process's id, which a `Push` names for same-node pulls (read once: getpid
    /// is a system call).
    pid: u32,
    /// The station's route to each rank's endpoint once connected ([`NO_ROUTE`]
    /// before): a station's routes are never renumbered, and a send looks its route up
    /// here instead of in the station's map.
    routes: Box<[Cell<u32>]>,
}

/// Messages a drive of the station hands the handler before it returns to the
/// application once an operation completed (`Handler::wants_more`), as UCX's progress
/// reads up to 16 messages of a shared-memory queue per call.
const DRIVE_BATCH: usize = 16;

/// [`PushPull::routes`] of a rank not connected yet.
const NO_ROUTE: u32 = u32::MAX;

/// How a blocking receive that was not posted ended its wait ([`PushPull::recv`]).
pub(super) enum Direct {
    /// An `Eager` message landed in the buffer: the receive's result.
    Landed(Outcome),
    /// Another message came first: the receive is posted (operation `id`), and the
    /// message was handled after it.
    Posted(u64),
}

impl PushPull {
    /// The protocol of rank `rank` in state `st`, pulling on one node through `rma`.
    pub(super) fn new(st: State, rma: SingleCopy, rank: u32) -> PushPull {
        let ranks = st.push_in_flight.len();
        PushPull {
            routes: (0..ranks).map(|_| Cell::new(NO_ROUTE)).collect(),
            st: RefCell::new(st),
            out: RefCell::new(Outbox::new(OUTBOX_ITEMS)),
            rma,
            rank,
            pid: std::process::id(),
        }
    }

    /// The route to `dest`'s endpoint, connecting first if there is none (waiting up to
    /// `QUIVER_CONNECT_TIMEOUT` for the peer to open it).
    #[inline]
    fn route(&self, on: &impl Footing, dest: u32) -> Result<usize> {
        let cached = self.routes.get(dest as usize);
        if let Some(route) = cached.map(Cell::get).filter(|&r| r != NO_ROUTE) {
            return Ok(route as usize);
        }
        let station = on.station();
        let to = Source {
            rank: dest,
            dpid: station.dpid(),
        };
        let route = station.connect(to).map_err(|e| on.report(e))?;
        if let (Some(c), Ok(r)) = (cached, u32::try_from(route)) {
            c.set(r);
        }
        Ok(route)
    }

    /// The bytes of each `Data` answering `dest`'s `Pull` (on `route`): on a network
    /// channel a `Data` fills a whole number of frames, as many as make
    /// [`ANSWER_BYTES`] or the fewest beyond, but no more than `State::chunk`
    /// (`max_message`'s worth) holds; `State::chunk` on shared memory, on a route whose
    /// frame is not known (an offload engine that did not set it up in time), for a
    /// frame too small to carry [`MIN_ANSWER_CHUNK`] bytes and where not even one frame
    /// fits `State::chunk`.
    #[cold]
    fn answer_chunk_to(&self, on: &impl Footing, route: usize, dest: u32) -> Result<u32> {
        let station = on.station();
        let chunk = self.st.borrow().chunk;
        let chunk = match station.transport_to(dest).map_err(|e| on.report(e))? {
            Transport::Shm => chunk,
            _ => match station
                .frame_payload(route)
                .filter(|&f| f >= wire::DATA_HEADER + MIN_ANSWER_CHUNK)
            {
                Some(frame) => {
                    let fit = frames_within(frame, chunk + wire::DATA_HEADER);
                    match ANSWER_BYTES.div_ceil(frame).min(fit) {
                        0 => chunk,
                        n => message_in_frames(frame, n) - wire::DATA_HEADER,
                    }
                }
                None => chunk,
            },
        };
        // `max_message` is below 4 GiB (`MAX_MESSAGE_RANGE`).
        Ok(u32::try_from(chunk).unwrap_or(u32::MAX))
    }

    /// A blocking send of a message that leaves whole in one `Eager` push (push mode
    /// `Pull` or `All`, at most BTP(1) bytes, credit left at its receiver): it keeps no
    /// record and is complete once written. `Ok(false)`, having done nothing, for any
    /// other message ([`PushPull::start_send`] then).
    pub(super) fn send_eager(
        &self,
        on: &impl Footing,
        dest: u32,
        tag: u32,
        data: &[u8],
    ) -> Result<bool> {
        let route = self.route(on, dest)?;
        let len = data.len();
        let msg = {
            let mut st = self.st.borrow_mut();
            if st.mode == PushMode::Zero || len > st.btp1 || !st.take_push_credit(dest, len) {
                return Ok(false);
            }
            let msg = st.next_msg;
            st.next_msg += 1;
            msg
        };
        let to = Source {
            rank: dest,
            dpid: on.station().dpid(),
        };
        let head = wire::eager_header(tag, msg);
        if let Err(e) = self.write_progressing(on, route, to, &head, data) {
            // It did not leave: its bytes never reach the receiver's buffer.
            let mut st = self.st.borrow_mut();
            if let Some(c) = st.push_in_flight.get_mut(dest as usize) {
                *c = c.saturating_sub(len as u64);
            }
            return Err(e);
        }
        Ok(true)
    }

    /// Starts sending `data` to `dest` with `tag`: the id of the operation, or `None`
    /// when `record_whole` is false and the message left whole in its first push (an
    /// eager message: complete when it leaves, nothing to answer, so a blocking send
    /// keeps no record of it).
    pub(super) fn start_send(
        &self,
        on: &impl Footing,
        dest: u32,
        tag: u32,
        data: &[u8],
        record_whole: bool,
        sync: bool,
    ) -> Result<Option<u64>> {
        let station = on.station();
        let to = Source {
            rank: dest,
            dpid: station.dpid(),
        };
        // Connected (and checked) before anything is registered.
        let route = self.route(on, dest)?;
        let len = data.len();
        // The pipeline of the route's transport, looked up only where it can matter
        // (push mode pull, longer than BTP(1)).
        let pipe = {
            let st = self.st.borrow();
            if st.mode == PushMode::Pull && len > st.btp1 {
                let transport = station.transport_to(dest).map_err(|e| on.report(e))?;
                if transport == Transport::Shm {
                    st.pipeline_shm
                } else {
                    st.pipeline_net
                }
            } else {
                st.pipeline_shm
            }
        };
        // Any send may end up pulled (a push without credit is): the size of the
        // answer's chunks to `dest` is found once, by its first send.
        if self.st.borrow().answer_chunks.get(dest as usize) == Some(&0) {
            let chunk = self.answer_chunk_to(on, route, dest)?;
            self.st.borrow_mut().answer_chunks[dest as usize] = chunk;
        }
        // Bytes of each `More` after the first push.
        let mut step = self.st.borrow().chunk;
        // Registered before the first write: while a write waits for room, incoming
        // messages are handled, and the receiver's `Pull` or `Done` may be among them.
        let (msg, id, first, pushed) = {
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            let msg = st.next_msg;
            st.next_msg += 1;
            let (mut first, mut pushed) = match st.mode {
                PushMode::Zero => (0, 0),
                PushMode::All => (len.min(st.chunk), len),
                PushMode::Pull => match select::way(len, st.btp1, pipe.max, pipe.chunk) {
                    Way::Eager => (len, len),
                    Way::Pipelined(c) => {
                        step = c;
                        (c.min(len), len)
                    }
                    Way::PushPull if len > SECOND_PUSH_MAX => (st.btp1, st.btp1),
                    Way::PushPull => (st.btp1, len.min(st.btp1.saturating_add(st.btp2))),
                },
            };
            if pushed > 0 && !st.take_push_credit(dest, pushed) {
                // The receiver's pushed buffer has no room for this sender: it pulls the
                // whole message once a receive takes it.
                (first, pushed) = (0, 0);
                st.stats.push_credit_exhausted += 1;
            }
            // A synchronous send waits for its receiver's word even when pushed whole.
            let state = if pushed == len && !sync {
                SendState::Done
            } else {
                SendState::Pending
            };
            if first == len && !record_whole && !sync {
                (msg, None, first, pushed)
            } else {
                let id = st.ops.insert(Op::Send(SendOp {
                    dest,
                    tag,
                    msg,
                    ptr: data.as_ptr(),
                    len,
                    state,
                    answering: false,
                }));
                if state == SendState::Pending {
                    st.outgoing.insert((dest, msg), id);
                }
                (msg, Some(id), first, pushed)
            }
        };
        let mut written = 0;
        let pushes = Pushes {
            first,
            pushed,
            step,
            sync,
        };
        match self.push(on, route, to, msg, tag, data, pushes, &mut written) {
            Ok(()) => Ok(id),
            Err(e) => {
                // The pushes that did not leave never reach the receiver's buffer.
                let mut st = self.st.borrow_mut();
                if let Some(c) = st.push_in_flight.get_mut(dest as usize) {
                    *c = c.saturating_sub((pushed - written) as u64);
                }
                // An eager message's one push did not leave: nothing else to undo.
                let Some(id) = id else {
                    return Err(e);
                };
                if written < pushed {
                    // Not whole after all: its receiver must hear `Abandon`, or a receive
                    // matching the pushes that left would wait for the rest for ever.
                    if let Some(Op::Send(s)) = st.ops.get_mut(&id) {
                        s.state = SendState::Pending;
                    }
                }
                drop(st);
                self.abandon(on, id);
                Err(e)
            }
        }
    }

    /// Pushes the first `pushed` bytes of `data` (message `msg` with `tag`, `first` of
    /// them with its announcement, the rest in `More` of `step` bytes) on `route` to
    /// `to`; `written` counts the pushed bytes that left.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &self,
        on: &impl Footing,
        route: usize,
        to: Source,
        msg: u64,
        tag: u32,
        data: &[u8],
        Pushes {
            first,
            pushed,
            step,
            sync,
        }: Pushes,
        written: &mut usize,
    ) -> Result<()> {
        let (dest, len) = (to.rank, data.len());
        // A buffer from the shared pool is named by its number and the offset in it.
        let (seg, addr) = match self.rma.locate(data) {
            Remote::Shared { window, offset } => (window, offset),
            Remote::Memory { addr, .. } => (0, addr),
        };
        let rest = &data[pushed..];
        let slot = if seg == 0
            && self.rma.may_split(dest, rest.len() as u64)
            && on.station().transport_to(dest)? == Transport::Shm
        {
            // SAFETY: the send buffer outlives the send, which ends (`complete_send`
            // or `abandon` calls `end_split`) only after the receiver is done with it.
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
                pid: self.pid,
                seg,
                addr,
                sync,
            },
            data: &data[..first],
        };
        self.write_progressing(on, route, to, push.header().as_bytes(), push.data())?;
        *written = first;
        while *written < pushed {
            let end = pushed.min(*written + step);
            let more = Msg::More {
                msg,
                offset: *written as u64,
                data: &data[*written..end],
            };
            self.write_progressing(on, route, to, more.header().as_bytes(), more.data())?;
            *written = end;
        }
        // Address-translation masking: the pushes are on their way; prepare the part the
        // receiver will pull now, off the critical path.
        touch_pages(rest);
        Ok(())
    }

    /// A blocking receive ([`super::Tagged::recv`]) of the first message from `src`
    /// with `tag` into the `cap` bytes at `ptr`.
    ///
    /// While nothing else is under way (no receive posted, no waiting message it
    /// accepts, no send waiting for its receiver, no pull, nothing in the outbox), the
    /// receive is not posted at all: it waits for the next message, and an `Eager` one
    /// it accepts lands in the buffer at once, with no record of the operation. It is
    /// the message that the posted receive would have taken: no other receive could
    /// come first. Any other message posts the receive first and is then handled as
    /// the handler handles every message (so it may match the receive), and the wait
    /// goes on as a posted receive's.
    pub(super) fn recv(
        &self,
        on: &impl Footing,
        ptr: *mut u8,
        cap: usize,
        src: Src,
        tag: Tag,
    ) -> Result<Status> {
        if self.nothing_under_way(src, tag) {
            let direct = on
                .station()
                .wait_for(|| self.direct_step(on, ptr, cap, src, tag, None), None)?;
            return match direct {
                Direct::Landed(result) => result.map_err(|e| *e),
                Direct::Posted(id) => self.wait_op(on, id),
            };
        }
        let id = self.start_recv(on, ptr, cap, src, tag)?;
        self.wait_op(on, id)
    }

    /// Whether a receive for (`src`, `tag`) may wait without being posted
    /// ([`PushPull::recv`]): nothing is posted, nothing waiting matches it, and no
    /// work is left that only polling does (pulls, split copies, the outbox).
    pub(super) fn nothing_under_way(&self, src: Src, tag: Tag) -> bool {
        let st = self.st.borrow();
        st.matching.posted() == 0
            && st.matching.probe(src, tag).is_none()
            && self.no_work_but_receives(&st)
    }

    /// Whether no work is left that only polling does: no send waiting for its
    /// receiver, no pull to make or being made, no error to report, nothing in the
    /// outbox, no split copy.
    #[inline(always)]
    fn no_work_but_receives(&self, st: &State) -> bool {
        st.outgoing.is_empty()
            && st.to_pull.is_empty()
            && st.pulls.is_empty()
            && st.errors.is_empty()
            && self.out.borrow().is_empty()
            && !self.rma.busy()
    }

    /// One poll of a receive that waits alone, by the short path ([`PushPull::recv`]'s
    /// unposted wait with `posted` `None`, [`PushPull::wait_alone`]'s): the first message
    /// that arrived, if it is an `Eager` one the receive accepts, lands in its buffer
    /// straight from the ring (`Landed`; the receive `posted`, if any, is withdrawn from
    /// the queues and forgotten); any other message is handled as the handler handles
    /// every message, after the receive was posted (`Posted`: it may have matched it).
    /// `None` when nothing arrived.
    pub(super) fn direct_step(
        &self,
        on: &impl Footing,
        ptr: *mut u8,
        cap: usize,
        src: Src,
        tag: Tag,
        posted: Option<u64>,
    ) -> Result<Option<Direct>> {
        let station = on.station();
        let report = |e| on.report(e);
        let mut got = station.poll_into(|r| r, report)?;
        if got.is_none() && station.rearm_doorbells() {
            // The descriptor was handed out: a sender may have published before the
            // doorbells were reset.
            got = station.poll_into(|r| r, report)?;
        }
        let Some(r) = got else {
            return Ok(None);
        };
        let bytes: &[u8] = if r.len == 0 {
            &[]
        } else {
            // SAFETY: a received message's bytes stay in place until its token is
            // released (`route::Received`), which happens after their last use here.
            unsafe { std::slice::from_raw_parts(r.ptr, r.len) }
        };
        let source = r.source.rank;
        let landed = {
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            match wire::eager(bytes) {
                Some((t, _, data))
                    if super::matching::accepts(src, tag, source, t)
                        && st.push_fits(source, data.len()) =>
                {
                    let n = data.len();
                    // `charge_push` without its checks: the guard made them (it costs
                    // this path 9 instructions a round trip).
                    st.push_owed[source as usize] += n as u64;
                    // SAFETY: the caller's buffer holds `cap` bytes, valid and untouched
                    // by anyone else for the whole blocking receive; at most `cap` are
                    // written.
                    unsafe { crate::link::copy_bytes(data.as_ptr(), ptr, n.min(cap)) };
                    free_pushed(st, &mut self.out.borrow_mut(), r.source, n);
                    if let Some(id) = posted {
                        // Posted alone and unmatched ([`PushPull::alone_posted`]).
                        let withdrawn = st.matching.cancel(id, src, tag);
                        debug_assert!(withdrawn, "receive {id} was not posted");
                        st.ops.remove(&id);
                    }
                    Some(whole_result(source, t, n as u64, cap))
                }
                _ => None,
            }
        };
        if let Some(result) = landed {
            station.release_token(r.token);
            if !self.out.borrow().is_empty() {
                // A credit for the sender: an error is its peer's, reported through
                // the error handler; this receive is complete.
                let _ = self.send_outbox(on);
            }
            return Ok(Some(Direct::Landed(result)));
        }
        // Posted before the message is handled, as the posted receive's wait would
        // have handled it: it may be the one the receive takes.
        let id = match posted.map_or_else(|| self.start_recv(on, ptr, cap, src, tag), Ok) {
            Ok(id) => id,
            Err(e) => {
                station.release_token(r.token);
                return Err(e);
            }
        };
        {
            let mut st = self.st.borrow_mut();
            let mut out = self.out.borrow_mut();
            let mut handler = Handler::new(&mut st, Some(&self.rma));
            handler.handle_message(Time::ZERO, r.source, bytes, &mut out);
        }
        station.release_token(r.token);
        // What it answers leaves now. An error of the outbox is a peer's (reported
        // through the error handler; a failed peer is remembered for the calls that name
        // it); one the handler found comes back from the posted receive's wait.
        let _ = self.send_outbox(on);
        Ok(Some(Direct::Posted(id)))
    }

    pub(super) fn start_recv(
        &self,
        on: &impl Footing,
        ptr: *mut u8,
        cap: usize,
        src: Src,
        tag: Tag,
    ) -> Result<u64> {
        // Messages that arrived and were not handled yet need not be taken in first:
        // handled later, they meet the posted receives in posting order, and this one
        // last, as they would have met it here. A message already in the unexpected
        // queue is matched here.
        let mut st = self.st.borrow_mut();
        let id = st.ops.insert(Op::Recv(RecvOp {
            ptr,
            cap,
            state: RecvState::Posted { src, tag },
        }));
        if let Some(waiting) = st.matching.post(id, src, tag) {
            drop(st);
            self.receive_waiting(on, id, waiting);
        }
        Ok(id)
    }

    /// Receive `id`, just started, takes message `a`, which was waiting.
    #[inline(never)]
    fn receive_waiting(&self, on: &impl Footing, id: u64, a: Arrived<Unexpected>) {
        {
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            st.pushed_bytes -= a.msg.data.len() as u64;
            let from = Source {
                rank: a.source,
                dpid: on.station().dpid(),
            };
            let mut out = self.out.borrow_mut();
            free_pushed(st, &mut out, from, a.msg.data.len());
            begin_receive(st, &mut out, id, from, &a.msg.head, &a.msg.data);
        }
        // The pull of a message that was waiting starts now, as it would have on
        // arrival, and its answer leaves at once (the receive may be complete already,
        // and its caller not come back for a while). The receive is registered (and may
        // be under way): its id must reach the caller, whose wait or scope keeps the
        // buffer until it ends. A failure of this pull ends the receive itself
        // (`make_pulls`); an error of the outbox (another peer's) comes back from a
        // later call.
        if let Err(e) = self.make_pulls(on).and_then(|_| self.send_outbox(on)) {
            tracing::debug!("tagged receive {id}: {e}");
        }
    }

    /// Sends what the outbox holds as far as the routes take it now.
    fn send_outbox(&self, on: &impl Footing) -> Result<()> {
        let mut out = self.out.borrow_mut();
        if out.is_empty() {
            return Ok(());
        }
        let mut st = self.st.borrow_mut();
        let mut handler = Handler::new(&mut st, Some(&self.rma));
        on.station()
            .send_outbox(&mut handler, &mut out)
            .map_err(|e| on.report(e))
    }

    /// For a closing endpoint: sends what the outbox still holds (answers its peers
    /// wait for), making progress meanwhile, for at most `limit`.
    pub(super) fn linger(&self, on: &impl Footing, limit: std::time::Duration) {
        // A send still answering a `Pull` here was abandoned by a wait that returned
        // early with an error: its buffer may be gone. Only whole messages (`Done`,
        // `Pull`) are worth their peers' waiting.
        for (to, key) in self.out.borrow_mut().drop_ranges(|_| true) {
            let mut st = self.st.borrow_mut();
            if let Some(Op::Send(s)) = st.ops.get_mut(&key) {
                s.answering = false;
                s.state = SendState::Failed;
                let msg = s.msg;
                st.outgoing.remove(&(to.rank, msg));
            }
        }
        let start = std::time::Instant::now();
        while !self.out.borrow().is_empty() && start.elapsed() < limit {
            // A failed peer's error does not stop the answers to the others.
            if !matches!(self.poll(on), Ok(true)) {
                std::thread::yield_now();
            }
        }
    }

    /// Makes progress once: helps a receiver's split copy, finishes the pull thread's
    /// gets, makes the pulls of matched receives, and drives the station (sends what
    /// the outbox holds, handles every protocol message that has arrived). Returns
    /// whether anything happened.
    pub(super) fn poll(&self, on: &impl Footing) -> Result<bool> {
        let helped = self.rma.helping() && self.rma.help();
        let collected = self.rma.busy() && self.collect_pulls(on);
        let pulled = self.make_pulls(on)?;
        let drove = self.drive(on)?;
        Ok(helped || collected || pulled || drove)
    }

    /// One round of the station (it polls a UDP socket only now and then while it also
    /// serves shared memory), then [`PushPull::poll`] until nothing is left.
    pub(super) fn progress(&self, on: &impl Footing) -> Result<()> {
        on.station().progress()?;
        while self.poll(on)? {}
        Ok(())
    }

    /// Runs the handler on the station's hook; returns whether a message was handled or
    /// the outbox sent something.
    fn drive(&self, on: &impl Footing) -> Result<bool> {
        let station = on.station();
        let mut st = self.st.borrow_mut();
        let mut out = self.out.borrow_mut();
        let sent = out.sent();
        let mut handler = Handler::new(&mut st, Some(&self.rma));
        let report = |e| on.report(e);
        let mut delivered = station.drive(&mut handler, &mut out, report)?;
        if delivered.is_none() && handler.handled == 0 && station.rearm_doorbells() {
            // The descriptor was handed out: a sender may have published before the
            // doorbells were reset.
            delivered = station.drive(&mut handler, &mut out, report)?;
        }
        if let Some(r) = delivered {
            // The handler delivers nothing; kept for the protocol's contract.
            station.release_token(r.token);
        }
        let handled = handler.handled > 0;
        // An error the handler found goes to the application's next call: not to this
        // one when it completed an operation (a batch goes on after a completion, and
        // the wait would return that operation's result, the error only reported).
        let completed = handler.completions != handler.st.completions;
        if !completed {
            if let Some(e) = st.errors.pop_front() {
                return Err(on.report(e));
            }
        }
        Ok(handled || out.sent() != sent)
    }

    /// Makes the pulls of matched receives: a get of `rma` where the sender is on this
    /// node (at once, or queued on the pull thread), else a `Pull` request. Returns
    /// whether there was one.
    #[inline]
    fn make_pulls(&self, on: &impl Footing) -> Result<bool> {
        if self.st.borrow().to_pull.is_empty() {
            return Ok(false);
        }
        self.make_pulls_now(on)
    }

    fn make_pulls_now(&self, on: &impl Footing) -> Result<bool> {
        let mut any = false;
        loop {
            let Some(job) = self.st.borrow_mut().to_pull.pop_front() else {
                return Ok(any);
            };
            any = true;
            if let Err(e) = self.make_pull(on, &job) {
                let mut st = self.st.borrow_mut();
                st.incoming.remove(&(job.source.rank, job.head.msg));
                if let Some(Op::Recv(r)) = st.ops.get_mut(&job.op) {
                    r.state = RecvState::Done(Some(Err(Box::new(e))));
                    st.completions += 1;
                }
            }
            // Each pull's answer (its `Done`, or the `Pull` request) leaves before the next
            // pull: a sender waits for it, and several megabytes of pulls in a row kept
            // a window of senders idle (tagged bw, 1 MiB, -25 %).
            self.send_outbox(on)?;
        }
    }

    fn make_pull(&self, on: &impl Footing, job: &PullJob) -> Result<()> {
        let PullJob {
            op,
            source,
            ref head,
            from,
            len,
        } = *job;
        let ptr = {
            let st = self.st.borrow();
            let Some(Op::Recv(r)) = st.ops.get(&op) else {
                return Ok(());
            };
            r.ptr
        };
        let same_node =
            source.rank == self.rank || on.station().transport_to(source.rank)? == Transport::Shm;
        let got = if same_node {
            let peer = Peer {
                rank: source.rank,
                pid: head.pid,
            };
            let at = head.addr.saturating_add(from);
            let remote = if head.seg != 0 {
                Remote::Shared {
                    window: head.seg,
                    offset: at,
                }
            } else {
                Remote::Memory {
                    addr: at,
                    split: head.slot.checked_sub(1).map(|slot| Offer {
                        slot,
                        msg: head.msg,
                    }),
                }
            };
            // The destination, [from, from + len) of the receive buffer: from + len =
            // expected <= cap (`begin_receive`).
            let dst = ptr.wrapping_add(from as usize);
            // SAFETY: `dst` holds `len` bytes of the receive buffer, valid until the
            // receive completes, which is not before the pull is over (a queued one is
            // collected by `collect_pulls` first); only the pull writes it meanwhile.
            let got = unsafe { self.rma.start_get(op, peer, remote, dst, len) };
            match got {
                Ok(got) => got,
                // A shared buffer too short for the message: pulled by request.
                Err(GetError::OutOfBounds { .. }) => Got::Unreachable,
                Err(GetError::Thread(e)) => return Err(e),
                Err(GetError::Attach(e)) => {
                    return Err(Error::Protocol {
                        rank: source.rank,
                        reason: format!("pulling message {}: {e}", head.msg),
                    })
                }
            }
        } else {
            Got::Unreachable
        };
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let mut out = self.out.borrow_mut();
        match got {
            Got::Shared | Got::Attached => {
                if got == Got::Shared {
                    st.stats.pulled_shared += len;
                } else {
                    st.stats.pulled_direct += len;
                }
                queue(
                    &mut out,
                    &mut st.stats,
                    source,
                    &Msg::Done { msg: head.msg },
                );
                landed(st, op, source.rank, head.msg, len);
            }
            Got::Queued => {
                // The pull thread reports; `collect_pulls` finishes the receive.
                st.pulls.insert(op, (source.rank, head.msg, from, len));
            }
            Got::Unreachable => {
                let pull = Msg::Pull {
                    msg: head.msg,
                    offset: from,
                    len,
                };
                queue(&mut out, &mut st.stats, source, &pull);
                // Preparing the destination overlaps the pull request's round trip.
                // SAFETY: [from, from + len) lies inside the receive buffer (as above),
                // valid until the receive completes; nothing writes it meanwhile.
                let rest =
                    unsafe { std::slice::from_raw_parts(ptr.add(from as usize), len as usize) };
                touch_pages(rest);
            }
        }
        Ok(())
    }

    /// Finishes the receives whose pull the pull thread has made; returns whether there
    /// was one.
    fn collect_pulls(&self, on: &impl Footing) -> bool {
        let Some((op, result)) = self.rma.completed() else {
            return false;
        };
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let Some((source, msg, offset, len)) = st.pulls.remove(&op) else {
            return true;
        };
        let to = Source {
            rank: source,
            dpid: on.station().dpid(),
        };
        let reply = match result {
            // Refused: the two-copy path for this and later pulls.
            Ok(Got::Unreachable) => Msg::Pull { msg, offset, len },
            Ok(_) => {
                st.stats.pulled_direct += len;
                st.stats.pulled_on_thread += len;
                landed(st, op, source, msg, len);
                Msg::Done { msg }
            }
            Err(e) => {
                st.incoming.remove(&(source, msg));
                if let Some(Op::Recv(r)) = st.ops.get_mut(&op) {
                    r.state = RecvState::Done(Some(Err(Box::new(Error::Protocol {
                        rank: source,
                        reason: format!("pulling message {msg}: {e}"),
                    }))));
                    st.completions += 1;
                }
                Msg::Done { msg }
            }
        };
        queue(&mut self.out.borrow_mut(), &mut st.stats, to, &reply);
        true
    }

    /// Waits for the next protocol message (or pull completion, or room for the
    /// outbox), at most `timeout` ([`Error::Timeout`] then), and handles it.
    pub(super) fn wait_message(
        &self,
        on: &impl Footing,
        timeout: Option<std::time::Duration>,
    ) -> Result<()> {
        let busy = self.rma.busy()
            || !self.out.borrow().is_empty()
            || !self.st.borrow().to_pull.is_empty();
        if busy {
            // A pull is under way (its completion comes from a thread, not the
            // endpoint), or the outbox waits for room: poll, do not block.
            if !self.poll(on)? {
                std::thread::yield_now();
            }
            return Ok(());
        }
        // Sleeps per the wait mode until a poll does something (a receiver may open a
        // split copy meanwhile: every poll helps).
        on.station()
            .wait_for(|| Ok(self.poll(on)?.then_some(())), timeout)
    }

    /// Writes an application-initiated message (a push) on route `route` to `to`,
    /// waiting for room if needed but handling incoming messages and the outbox
    /// meanwhile, so that two ranks that both write never wait for each other. Nothing
    /// overtakes what the outbox holds for `to`: on a network channel the message
    /// goes into the outbox behind it (there it waits for the window, as a long range
    /// does, which the station builds a window ahead; waiting for the whole range
    /// would hold the application up for as long as the range takes), elsewhere the
    /// write waits until the outbox has nothing for `to`.
    fn write_progressing(
        &self,
        on: &impl Footing,
        route: usize,
        to: Source,
        head: &[u8],
        body: &[u8],
    ) -> Result<()> {
        let station = on.station();
        loop {
            let behind = self.out.borrow().has_queued_for(to);
            if behind
                && station.is_network_channel(route)
                && !station.has_failed(to.rank)
                && self.out.borrow_mut().send(to, head, body).is_ok()
            {
                return Ok(());
            }
            if !behind
                && (station.try_send_inline(route, head, body)
                    || station
                        .send(route, head, body, false)
                        .map_err(|e| on.report(e))?)
            {
                return Ok(());
            }
            if !self.poll(on)? {
                std::thread::yield_now();
            }
        }
    }

    /// The result of operation `id` if it is complete (it is then forgotten).
    pub(super) fn take_if_done(&self, id: u64) -> Option<Result<Status>> {
        self.take_if_known(id).flatten().map(|r| r.map_err(|e| *e))
    }

    /// [`PushPull::take_if_done`], `None` for an operation not known (never started,
    /// or its result already taken) and `Some(None)` for one still pending.
    #[inline(always)]
    fn take_if_known(&self, id: u64) -> Option<Option<Outcome>> {
        let mut st = self.st.borrow_mut();
        if !st.pulls.is_empty() && st.pulls.contains_key(&id) {
            // The pull thread still writes into its buffer (a receive its sender
            // abandoned meanwhile): not before `collect_pulls` has its report.
            return Some(None);
        }
        st.ops.take_if(id, take_result)
    }

    /// Takes, in order and under one look at the table, the results of the requests at
    /// the front of `reqs` that are this endpoint's and complete (a send complete at its
    /// start gives its status), until the first still pending or another endpoint's;
    /// returns how many it took. The same results as [`PushPull::take_if_done`] of each,
    /// in turn.
    pub(super) fn take_done_run(
        &self,
        reqs: &[Request<'_>],
        results: &mut Vec<Result<Status>>,
    ) -> usize {
        let mut st = self.st.borrow_mut();
        let mut taken = 0;
        for r in reqs {
            // A request of an outer scope may be another endpoint's, whose ids are its own.
            if !std::ptr::eq(&r.t.pp, self) {
                break;
            }
            let id = match r.ticket {
                Ticket::Sent(status) => {
                    results.push(Ok(status));
                    taken += 1;
                    continue;
                }
                Ticket::Op(id) => id,
            };
            if !st.pulls.is_empty() && st.pulls.contains_key(&id) {
                break;
            }
            match st.ops.take_if(id, take_result) {
                None => results.push(Err(waited_twice(id))),
                Some(Some(r)) => results.push(r.map_err(|e| *e)),
                Some(None) => break,
            }
            taken += 1;
        }
        taken
    }

    /// Whether operation `id` is complete (its result stays for `wait`).
    pub(super) fn test_op(&self, on: &impl Footing, id: u64) -> Result<bool> {
        self.progress(on)?;
        let st = self.st.borrow();
        if !st.pulls.is_empty() && st.pulls.contains_key(&id) {
            // The pull thread may still write into the buffer (a receive whose sender
            // abandoned it meanwhile is done, but not yet its buffer's).
            return Ok(false);
        }
        Ok(match st.ops.get(&id) {
            Some(Op::Send(s)) => s.state != SendState::Pending,
            Some(Op::Recv(r)) => matches!(r.state, RecvState::Done(_)),
            None => true,
        })
    }

    #[inline]
    pub(super) fn wait_op(&self, on: &impl Footing, id: u64) -> Result<Status> {
        match self.wait_op_until(on, id, None) {
            Some(r) => r,
            None => unreachable!("a wait without a deadline returns only when done"),
        }
    }

    /// Waits for operation `id` until `deadline` at most: its result when it completed
    /// (it is then forgotten), `None` when the deadline passed first (it stays pending).
    /// A wait that fails abandons the operation ([`PushPull::abandon`]).
    #[inline]
    pub(super) fn wait_op_until(
        &self,
        on: &impl Footing,
        id: u64,
        deadline: Option<std::time::Instant>,
    ) -> Option<Result<Status>> {
        // Looked at before every poll: many operations are complete when they start (a
        // send pushed whole, a receive of a message that waited), and the wait returns
        // as soon as a message was handled, which may have completed it.
        match self.take_if_known(id) {
            None => Some(Err(waited_twice(id))),
            Some(Some(r)) => Some(r.map_err(|e| *e)),
            Some(None) => self.wait_pending(on, id, deadline),
        }
    }

    /// [`PushPull::wait_op_until`] of an operation still pending.
    #[inline(never)]
    fn wait_pending(
        &self,
        on: &impl Footing,
        id: u64,
        deadline: Option<std::time::Instant>,
    ) -> Option<Result<Status>> {
        if deadline.is_none() {
            if let Some(done) = self.wait_alone(on, id) {
                return Some(done);
            }
        }
        loop {
            // Polled at least once whatever the deadline: a wait of zero still makes
            // progress, so that polling with it completes the operation.
            let step = match self.poll(on) {
                Ok(busy) => {
                    let left = match deadline {
                        None => None,
                        Some(at) => match at.checked_duration_since(std::time::Instant::now()) {
                            Some(left) if !left.is_zero() => Some(left),
                            _ => return self.take_if_done(id),
                        },
                    };
                    if busy {
                        Ok(())
                    } else {
                        match self.wait_message(on, left) {
                            Err(Error::Timeout(_)) => Ok(()),
                            other => other,
                        }
                    }
                }
                Err(e) => Err(e),
            };
            // After an error too: the buffer goes back to the caller, but an operation
            // that completed meanwhile gives its own result (the error went through the
            // error handler, and a failed rank is remembered).
            if let Some(r) = self.take_if_done(id) {
                return Some(r);
            }
            if let Err(e) = step {
                // First nothing may use the buffer any more.
                self.abandon(on, id);
                return Some(Err(e));
            }
        }
    }

    /// Waits for receive `id` by the short path while it is the only receive posted
    /// and nothing else is under way (as [`PushPull::recv`] does for a receive not yet
    /// posted: an `Eager` message it accepts lands from the ring, without the handler,
    /// the posted queue or the table): its result, or `None` as soon as it is not alone
    /// any more (the general wait goes on then). Errors end the operation as the general
    /// wait's do.
    fn wait_alone(&self, on: &impl Footing, id: u64) -> Option<Result<Status>> {
        let (ptr, cap, src, tag) = self.alone_posted(id)?;
        let station = on.station();
        let step = || match self.direct_step(on, ptr, cap, src, tag, Some(id))? {
            None => Ok(None),
            Some(Direct::Landed(result)) => Ok(Some(Some(result.map_err(|e| *e)))),
            Some(Direct::Posted(_)) => match self.take_if_done(id) {
                Some(done) => Ok(Some(Some(done))),
                None if self.alone_posted(id).is_some() => Ok(None),
                // Something else is under way now: the general wait.
                None => Ok(Some(None)),
            },
        };
        match station.wait_for(step, None) {
            Ok(done) => done,
            Err(e) => {
                if let Some(done) = self.take_if_done(id) {
                    return Some(done);
                }
                self.abandon(on, id);
                Some(Err(e))
            }
        }
    }

    /// The buffer and pattern of receive `id` if it is posted and alone: the only
    /// receive posted, and nothing else under way ([`PushPull::nothing_under_way`]).
    #[inline]
    fn alone_posted(&self, id: u64) -> Option<(*mut u8, usize, Src, Tag)> {
        let st = self.st.borrow();
        let Some(Op::Recv(RecvOp {
            ptr,
            cap,
            state: RecvState::Posted { src, tag },
        })) = st.ops.get(&id)
        else {
            return None;
        };
        let alone = st.matching.posted() == 1 && self.no_work_but_receives(&st);
        alone.then_some((*ptr, *cap, *src, *tag))
    }

    /// Whether nothing is under way: no operation recorded (pending or not yet waited
    /// for), no receive posted, no pull to make or being made, no answer queued, no
    /// error to report, no split copy.
    pub(super) fn idle(&self) -> bool {
        let st = self.st.borrow();
        st.ops.is_empty() && st.matching.posted() == 0 && self.no_work_but_receives(&st)
    }

    /// The ids of every operation not yet waited for.
    pub(super) fn pending_ops(&self) -> Vec<u64> {
        self.st.borrow().ops.keys().collect()
    }

    /// Ends operation `id` before it completed, because its wait returns early with an
    /// error and hands the buffer back: after this nothing reads or writes the buffer.
    /// A receive is withdrawn (posted) or let go (matched: its pull is dropped or, on
    /// the pull thread, waited for; bytes that arrive later are dropped; a sender
    /// waiting for word gets its `Done`). A send stops answering (the outbox's range of
    /// its buffer is dropped, its split copy ended) and its receiver hears `Abandon`,
    /// which fails the receive. A same-node receiver reading the buffer directly at
    /// that moment may read bytes the application has changed since (its receive
    /// fails if the `Abandon` comes before its pull ends).
    pub(super) fn abandon(&self, on: &impl Footing, id: u64) {
        // The pull thread may be writing into a receive's buffer: wait for its report.
        while self.st.borrow().pulls.contains_key(&id) {
            if !self.collect_pulls(on) {
                std::thread::yield_now();
            }
        }
        {
            let station = on.station();
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            let mut out = self.out.borrow_mut();
            let peer = |rank| Source {
                rank,
                dpid: station.dpid(),
            };
            match st.ops.remove(&id) {
                Some(Op::Recv(r)) => match r.state {
                    RecvState::Posted { src, tag } => {
                        st.matching.cancel(id, src, tag);
                    }
                    RecvState::Receiving(rc) => {
                        let Receiving {
                            source,
                            msg,
                            sender_waits,
                            ..
                        } = *rc;
                        st.incoming.remove(&(source, msg));
                        st.discarding.remove(&(source, msg));
                        st.to_pull.retain(|job| job.op != id);
                        if sender_waits && !station.has_failed(source) {
                            queue(&mut out, &mut st.stats, peer(source), &Msg::Done { msg });
                        }
                    }
                    RecvState::Done(_) => {}
                },
                Some(Op::Send(s)) if s.state == SendState::Pending => {
                    st.outgoing.remove(&(s.dest, s.msg));
                    self.rma.end_split(s.dest, s.msg);
                    if s.answering {
                        out.drop_ranges(|key| key == id);
                    }
                    if !station.has_failed(s.dest) {
                        let abandon = Msg::Abandon { msg: s.msg };
                        queue(&mut out, &mut st.stats, peer(s.dest), &abandon);
                    }
                }
                Some(Op::Send(_)) | None => {}
            }
        }
        // The peer waits for the answer queued above: on its way now, as far as the
        // routes take it, not at the endpoint's next call (which may be long: the
        // caller may go on with other endpoints). A failure surfaces at the next call.
        let _ = self.send_outbox(on);
    }

    /// Cancels receive `id` if nothing has matched it yet.
    pub(super) fn cancel_op(&self, id: u64) -> bool {
        let mut st = self.st.borrow_mut();
        // Only a posted receive is in the matching's queues.
        let Some(Op::Recv(RecvOp {
            state: RecvState::Posted { src, tag },
            ..
        })) = st.ops.get(&id)
        else {
            return false;
        };
        let (src, tag) = (*src, *tag);
        if !st.matching.cancel(id, src, tag) {
            return false;
        }
        if let Some(Op::Recv(r)) = st.ops.get_mut(&id) {
            r.state = RecvState::Done(Some(Err(Box::new(Error::Cancelled))));
        }
        true
    }

    /// Whether operation `id` is still known (not taken by a wait).
    pub(super) fn is_pending(&self, id: u64) -> bool {
        self.st.borrow().ops.contains_key(&id)
    }

    /// Whether any operation is under way (or its result not taken yet).
    pub(super) fn has_ops(&self) -> bool {
        !self.st.borrow().ops.is_empty()
    }
}

/// The Push-Pull protocol on the engine's hook: handles one protocol message at a time
/// with the endpoint's state (module documentation).
struct Handler<'a> {
    st: &'a mut State,
    /// The sender's side of split copies (`None` in the handler's own tests).
    rma: Option<&'a SingleCopy>,
    /// Messages handled in this drive.
    handled: usize,
    /// `State::completions` when the drive began.
    completions: u64,
}

impl Protocol for Handler<'_> {
    fn handle_message(
        &mut self,
        _now: Time,
        from: Source,
        bytes: &[u8],
        out: &mut Outbox,
    ) -> Disposition {
        self.handled += 1;
        self.handle(from, bytes, out);
        Disposition::Consumed
    }

    fn uses_time(&self) -> bool {
        // No timers: a peer that fails is found by the engine's channels.
        false
    }

    fn wants_more(&self) -> bool {
        // Back to the application once an operation completed (it may be the one it
        // waits for) and a batch of messages was handled: the rest waits for the next
        // drive. The batch spreads a drive's and a wait's cost over the messages that
        // wait at once (a window of small messages), and delays the application by a
        // few messages' handling at most.
        self.st.completions == self.completions || self.handled < DRIVE_BATCH
    }

    fn range_header(&self, key: u64, offset: u64, _len: usize, head: &mut Vec<u8>) {
        // The range of send `key` starts at its buffer's first byte: the chunk's offset
        // is the offset in the message.
        if let Some(Op::Send(s)) = self.st.ops.get(&key) {
            let data = Msg::Data {
                msg: s.msg,
                offset,
                data: &[],
            };
            head.extend_from_slice(data.header().as_bytes());
        }
    }

    fn range_done(&mut self, to: Source, key: u64, complete: bool, _out: &mut Outbox) {
        let Some(Op::Send(s)) = self.st.ops.get_mut(&key) else {
            return;
        };
        s.answering = false;
        let msg = s.msg;
        if complete {
            complete_send(self.st, self.rma, to.rank, msg, key);
        } else {
            s.state = SendState::Failed;
            self.st.completions += 1;
            self.st.outgoing.remove(&(to.rank, msg));
            if let Some(rma) = self.rma {
                rma.end_split(to.rank, msg);
            }
        }
    }
}

impl<'a> Handler<'a> {
    /// The handler over `st` for one drive (or one send of the outbox).
    fn new(st: &'a mut State, rma: Option<&'a SingleCopy>) -> Handler<'a> {
        let completions = st.completions;
        Handler {
            st,
            rma,
            handled: 0,
            completions,
        }
    }

    #[inline(always)]
    fn handle(&mut self, from: Source, bytes: &[u8], out: &mut Outbox) {
        // The most common message first, read without the general decoder.
        match wire::eager(bytes) {
            Some((tag, msg, data)) => handle_push(
                self.st,
                out,
                from,
                Announce::eager(tag, msg, data.len()),
                data,
            ),
            None => self.handle_other(from, bytes, out),
        }
    }

    /// Every message but an `Eager` one.
    #[inline(never)]
    fn handle_other(&mut self, from: Source, bytes: &[u8], out: &mut Outbox) {
        let source = from.rank;
        let st = &mut *self.st;
        let msg_in = match Msg::decode(bytes) {
            Ok(m) => m,
            Err(why) => {
                tracing::debug!("tagged message from rank {source} dropped: {why}");
                st.stats.dropped += 1;
                return;
            }
        };
        match msg_in {
            Msg::Push { head, data } => handle_push(st, out, from, head, data),
            Msg::More { msg, offset, data } => {
                if !st.charge_push(source, data.len()) {
                    return;
                }
                let n = data.len();
                // Pushed bytes of a truncated receive's message: the last lets it go.
                let discarded = match st.discarding.get(&(source, msg)) {
                    Some(&stop) => {
                        if offset.saturating_add(n as u64) >= stop {
                            st.discarding.remove(&(source, msg));
                        }
                        true
                    }
                    None => false,
                };
                if let Some(&id) = st.incoming.get(&(source, msg)) {
                    free_pushed(st, out, from, n);
                    let Some(Op::Recv(r)) = st.ops.get_mut(&id) else {
                        return;
                    };
                    if !land(r, Lane::Pushed, offset, data) {
                        st.stats.dropped += 1;
                        return;
                    }
                    if finish_if_complete(r, &mut st.completions) {
                        st.incoming.remove(&(source, msg));
                    }
                    return;
                }
                // More pushed bytes of a message still waiting for its receive: in
                // order, and no more than it announced.
                let kept = match st.matching.unexpected_mut(source, msg) {
                    Some(u)
                        if offset == u.data.len() as u64 && offset + n as u64 <= u.head.pushed =>
                    {
                        u.data.extend_from_slice(data);
                        Some(true)
                    }
                    Some(_) => Some(false),
                    None => None,
                };
                match kept {
                    Some(true) => {
                        st.pushed_bytes += n as u64;
                        st.stats.pushed_buffer_peak =
                            st.stats.pushed_buffer_peak.max(st.pushed_bytes);
                    }
                    Some(false) => {
                        st.stats.dropped += 1;
                        free_pushed(st, out, from, n);
                    }
                    None => {
                        free_pushed(st, out, from, n);
                        if !discarded {
                            st.stats.dropped += 1;
                        }
                    }
                }
            }
            Msg::Data { msg, offset, data } => {
                let Some(&id) = st.incoming.get(&(source, msg)) else {
                    st.stats.dropped += 1;
                    return;
                };
                let Some(Op::Recv(r)) = st.ops.get_mut(&id) else {
                    return;
                };
                if !land(r, Lane::Pulled, offset, data) {
                    st.stats.dropped += 1;
                    return;
                }
                st.stats.pulled_by_request += data.len() as u64;
                if finish_if_complete(r, &mut st.completions) {
                    st.incoming.remove(&(source, msg));
                }
            }
            Msg::Pull { msg, offset, len } => {
                let send =
                    st.outgoing
                        .get(&(source, msg))
                        .and_then(|&id| match st.ops.get_mut(&id) {
                            // One answer per send: a repeated `Pull` is a peer's error.
                            // And only while the send is pending: a send that
                            // completed has handed its buffer back.
                            Some(Op::Send(s)) if !s.answering && s.state == SendState::Pending => {
                                Some((id, s))
                            }
                            _ => None,
                        });
                let Some((id, s)) = send else {
                    st.stats.dropped += 1;
                    return;
                };
                let (ptr, total) = (s.ptr, s.len as u64);
                let Some(end) = offset.checked_add(len).filter(|&e| e <= total) else {
                    st.stats.dropped += 1;
                    return;
                };
                s.answering = true;
                let chunk = match st.answer_chunks.get(source as usize) {
                    Some(&c) if c > 0 => c as usize,
                    _ => st.chunk,
                };
                // Answered with a range of the send buffer, sent in chunks as the route
                // takes them; the send completes after its last byte (`range_done`).
                // SAFETY: [offset, end) lies inside the send buffer (checked above), valid
                // until the send completes or is abandoned: not before the range is done
                // (`answering`) or dropped (`PushPull::abandon`).
                let queued = unsafe { out.send_range(from, id, ptr, offset, end, chunk) };
                if queued.is_err() {
                    st.stats.dropped += 1;
                    if let Some(Op::Send(s)) = st.ops.get_mut(&id) {
                        s.answering = false;
                    }
                }
            }
            Msg::Done { msg } => match st.outgoing.get(&(source, msg)).copied() {
                // While a range of the buffer is being sent, only its end completes
                // the send (else the caller could free what the outbox still reads); a
                // receiver that gave up after its `Pull` sends this `Done` too.
                Some(id) if matches!(st.ops.get(&id), Some(Op::Send(s)) if s.answering) => {}
                Some(id) => complete_send(st, self.rma, source, msg, id),
                None => st.stats.dropped += 1,
            },
            Msg::Credit { bytes } => {
                if let Some(c) = st.push_in_flight.get_mut(source as usize) {
                    *c = c.saturating_sub(bytes);
                }
            }
            Msg::Abandon { msg } => {
                st.discarding.remove(&(source, msg));
                if let Some(id) = st.incoming.remove(&(source, msg)) {
                    st.to_pull.retain(|job| job.op != id);
                    if let Some(Op::Recv(r)) = st.ops.get_mut(&id) {
                        r.state = RecvState::Done(Some(Err(Box::new(Error::Protocol {
                            rank: source,
                            reason: format!(
                                "it abandoned message {msg} before it was received whole \
                                 (its wait returned early with an error)"
                            ),
                        }))));
                        st.completions += 1;
                    }
                } else if let Some(u) = st.matching.remove_unexpected(source, msg) {
                    st.pushed_bytes -= u.data.len() as u64;
                    free_pushed(st, out, from, u.data.len());
                }
            }
        }
    }
}

/// Which bytes of a message arrive: pushed ones (`Push`, `More`) or pulled ones (`Data`).
#[derive(Clone, Copy)]
enum Lane {
    Pushed,
    Pulled,
}

/// Copies bytes `offset..offset + data.len()` of a message into receive `r`, if they
/// are the next ones of their lane (pushed bytes up to what the push announced, pulled
/// ones up to what the buffer expects); returns false, landing nothing, if they are not
/// (repeated, misplaced or too many: a peer's error), so no byte is counted twice.
fn land(r: &mut RecvOp, lane: Lane, offset: u64, data: &[u8]) -> bool {
    let RecvState::Receiving(rc) = &mut r.state else {
        return false;
    };
    let Receiving {
        expected,
        landed,
        push_next,
        push_end,
        pull_next,
        ..
    } = &mut **rc;
    let (next, end) = match lane {
        Lane::Pushed => (push_next, *push_end),
        Lane::Pulled => (pull_next, *expected),
    };
    let len = data.len() as u64;
    if offset != *next || offset + len > end {
        return false;
    }
    *next += len;
    // Pushed bytes past the buffer (a truncated receive) are let go.
    let n = (r.cap as u64).saturating_sub(offset).min(len);
    if n > 0 {
        // SAFETY: offset + n <= cap; the buffer is valid until the receive completes or
        // is abandoned (`PushPull::abandon`, after which nothing lands in it).
        unsafe { crate::link::copy_bytes(data.as_ptr(), r.ptr.add(offset as usize), n as usize) };
    }
    *landed += n;
    true
}

/// A first push (an `Eager` message is one, whole) of message `head.msg` from `from`:
/// the receive it matches begins, or it waits in the pushed buffer.
#[inline(always)]
fn handle_push(st: &mut State, out: &mut Outbox, from: Source, head: Announce, data: &[u8]) {
    if !st.charge_push(from.rank, data.len()) {
        return;
    }
    let matched = st
        .matching
        .arrive(from.rank, head.tag, head.msg, || Unexpected {
            head,
            data: data.to_vec(),
        });
    match matched {
        Some(id) => {
            free_pushed(st, out, from, data.len());
            begin_receive(st, out, id, from, &head, data)
        }
        None => {
            st.stats.unexpected += 1;
            st.pushed_bytes += data.len() as u64;
            st.stats.pushed_buffer_peak = st.stats.pushed_buffer_peak.max(st.pushed_bytes);
        }
    }
}

/// A message matched receive `id`: copies what was pushed, records the pull of the
/// rest (made by `PushPull::make_pulls`, outside the handler: it may attach to another
/// process), and tells a sender of a truncated message that nothing more is needed, and
/// the sender of a synchronous message pushed whole that it was taken. Every match of a
/// `Push` comes here, so a synchronous sender hears `Done` once, at the match or after
/// the pull, never before.
#[inline(always)]
fn begin_receive(
    st: &mut State,
    out: &mut Outbox,
    id: u64,
    from: Source,
    head: &Announce,
    have: &[u8],
) {
    if head.sync && head.pushed == head.total {
        // Its sender waits for word of this match; nothing is left to pull (a message
        // with more sends `Done` after its pull).
        queue(out, &mut st.stats, from, &Msg::Done { msg: head.msg });
    }
    if have.len() as u64 == head.total {
        receive_whole(st, id, from.rank, head.tag, have);
    } else {
        begin_partial_receive(st, out, id, from, head, have);
    }
}

/// Receive `id` matched a message that came whole with its announcement (an `Eager`
/// one, `data`, from `source` with `tag`, or a synchronous `Push`, whose `Done` the
/// caller queued): it is received with this copy.
#[inline(always)]
fn receive_whole(st: &mut State, id: u64, source: u32, tag: u32, data: &[u8]) {
    let Some(Op::Recv(r)) = st.ops.get_mut(&id) else {
        return;
    };
    let n = data.len().min(r.cap);
    // SAFETY: the receive's buffer is valid for `cap` bytes until the operation
    // completes (its scope or blocking call outlives it); n <= cap.
    unsafe { crate::link::copy_bytes(data.as_ptr(), r.ptr, n) };
    r.state = RecvState::Done(Some(whole_result(source, tag, data.len() as u64, r.cap)));
    st.completions += 1;
}

/// [`begin_receive`] of a message that did not come whole.
#[inline(never)]
fn begin_partial_receive(
    st: &mut State,
    out: &mut Outbox,
    id: u64,
    from: Source,
    head: &Announce,
    have: &[u8],
) {
    let Some(Op::Recv(r)) = st.ops.get_mut(&id) else {
        return;
    };
    let n = have.len().min(r.cap);
    let expected = head.total.min(r.cap as u64);
    // SAFETY: the receive's buffer is valid for `cap` bytes until the operation
    // completes (its scope or blocking call outlives it); n <= cap.
    unsafe { std::ptr::copy_nonoverlapping(have.as_ptr(), r.ptr, n) };
    // Bytes of the message past what was pushed, and inside the buffer.
    let pull_len = expected.saturating_sub(head.pushed);
    r.state = RecvState::Receiving(Box::new(Receiving {
        source: from.rank,
        tag: head.tag,
        msg: head.msg,
        total: head.total,
        expected,
        landed: n as u64,
        push_next: have.len() as u64,
        push_end: head.pushed,
        pull_next: head.pushed,
        sender_waits: head.total > head.pushed,
    }));
    if head.pushed > r.cap as u64 && (have.len() as u64) < head.pushed {
        // `More` messages will bring bytes past the buffer.
        st.discarding.insert((from.rank, head.msg), head.pushed);
    }
    if !finish_if_complete(r, &mut st.completions) {
        st.incoming.insert((from.rank, head.msg), id);
    }
    if pull_len > 0 {
        st.to_pull.push_back(PullJob {
            op: id,
            source: from,
            head: *head,
            from: head.pushed,
            len: pull_len,
        });
    } else if head.total > head.pushed {
        // Truncated: nothing to pull, but the sender waits for word.
        queue(out, &mut st.stats, from, &Msg::Done { msg: head.msg });
    }
}

/// `len` more bytes of message `msg` from `source` landed in receive `op`.
fn landed(st: &mut State, op: u64, source: u32, msg: u64, len: u64) {
    if let Some(Op::Recv(r)) = st.ops.get_mut(&op) {
        if let RecvState::Receiving(rc) = &mut r.state {
            rc.landed += len;
            // The pulled lane is complete: no `Data` may land in it any more.
            rc.pull_next = rc.expected;
        }
        if finish_if_complete(r, &mut st.completions) {
            st.incoming.remove(&(source, msg));
        }
    }
}

/// The receiver is done with send `id` (message `msg` to `dest`).
fn complete_send(st: &mut State, rma: Option<&SingleCopy>, dest: u32, msg: u64, id: u64) {
    if let Some(rma) = rma {
        rma.end_split(dest, msg);
    }
    st.outgoing.remove(&(dest, msg));
    if let Some(Op::Send(s)) = st.ops.get_mut(&id) {
        if s.state == SendState::Pending {
            s.state = SendState::Done;
            st.completions += 1;
        }
    }
}

/// Queues protocol message `msg` to `to` (the outbox is unbounded in practice:
/// [`OUTBOX_ITEMS`]; a refusal is counted as a dropped message).
fn queue(out: &mut Outbox, stats: &mut TaggedStats, to: Source, msg: &Msg<'_>) {
    if out.send(to, msg.header().as_bytes(), msg.data()).is_err() {
        stats.dropped += 1;
    }
}

/// Marks a receive complete once every expected byte has landed; returns whether it is.
fn finish_if_complete(r: &mut RecvOp, completions: &mut u64) -> bool {
    if let RecvState::Receiving(rc) = &r.state {
        if rc.landed >= rc.expected {
            r.state = RecvState::Done(Some(whole_result(rc.source, rc.tag, rc.total, r.cap)));
            *completions += 1;
            return true;
        }
    }
    false
}

/// The error of send `s`, whose pulled bytes could not all be sent.
#[cold]
fn send_failed(s: &SendOp) -> Box<Error> {
    Box::new(Error::Protocol {
        rank: s.dest,
        reason: format!(
            "the bytes of message {} the receiver asked for could not all be sent",
            s.msg
        ),
    })
}

/// The result of operation `op` if it is complete (taken out of it), else `None`.
#[inline(always)]
fn take_result(op: &mut Op) -> Option<Outcome> {
    match op {
        Op::Recv(RecvOp {
            state: RecvState::Done(r),
            ..
        }) => Some(match r.take() {
            Some(result) => result,
            // Taken before (never: a result is taken once, with the operation).
            None => Err(Box::new(Error::Cancelled)),
        }),
        Op::Recv(_) => None,
        Op::Send(s) => match s.state {
            SendState::Pending => None,
            SendState::Done => Some(Ok(Status {
                peer: s.dest,
                tag: s.tag,
                len: s.len as u64,
            })),
            SendState::Failed => Some(Err(send_failed(s))),
        },
    }
}

/// The error of a wait for operation `id`, whose result was taken already.
#[cold]
fn waited_twice(id: u64) -> Error {
    Error::Config(format!("operation {id} was already waited for"))
}

/// The result of a receive into `cap` bytes of a message of `total` bytes from `source`
/// with `tag`, every byte of it that fits landed.
#[inline]
fn whole_result(source: u32, tag: u32, total: u64, cap: usize) -> Outcome {
    if total > cap as u64 {
        Err(Box::new(Error::Truncated {
            len: total,
            capacity: cap,
            rank: source,
            tag,
        }))
    } else {
        Ok(Status {
            peer: source,
            tag,
            len: total,
        })
    }
}

/// Reads one byte per page of `data`, so that its pages are mapped before the transfer
/// needs them.
fn touch_pages(data: &[u8]) {
    for i in (0..data.len()).step_by(4096) {
        // SAFETY: i < data.len(): an in-bounds read of initialized memory.
        unsafe { std::ptr::read_volatile(data.as_ptr().add(i)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A send of 100 bytes to rank 1 waiting for its receiver (as `start_send` leaves it).
    fn pending_send(buf: &[u8]) -> State {
        let config = Config {
            push: PushMode::Zero,
            max_message: 1024,
            ..Config::default()
        };
        let mut st = State::new(&config, 2);
        let id = st.ops.insert(Op::Send(SendOp {
            dest: 1,
            tag: 3,
            msg: 7,
            ptr: buf.as_ptr(),
            len: buf.len(),
            state: SendState::Pending,
            answering: false,
        }));
        assert_eq!(id, 0, "the tests name the first operation 0");
        st.outgoing.insert((1, 7), id);
        st
    }

    /// The receiver's `Pull` of the first `len` bytes of message 7 (`pending_send`'s).
    fn pull_of_msg_7(len: u64) -> Vec<u8> {
        message(Msg::Pull {
            msg: 7,
            offset: 0,
            len,
        })
    }

    fn message(m: Msg<'_>) -> Vec<u8> {
        let mut v = m.header().as_bytes().to_vec();
        v.extend_from_slice(m.data());
        v
    }

    /// The handler on its own: no station, no `rma`.
    fn alone(st: &mut State) -> Handler<'_> {
        Handler::new(st, None)
    }

    fn pending(st: &State) -> bool {
        matches!(st.ops.get(&0), Some(Op::Send(s)) if s.state == SendState::Pending)
    }

    /// A lying receiver cannot make the sender give its buffer back while the outbox
    /// still reads it: a second `Pull` is dropped, and a `Done` during the answer does
    /// not complete the send; only the answer's end does. The handler runs alone here,
    /// with no station and no I/O.
    #[test]
    fn one_answer_per_send_whatever_the_receiver_sends() {
        let buf = vec![5u8; 100];
        let mut st = pending_send(&buf);
        let (mut out, peer) = (Outbox::new(16), PEER);
        let mut h = alone(&mut st);
        let pull = pull_of_msg_7(100);
        let t = Time::from_duration(std::time::Duration::ZERO);
        assert_eq!(
            h.handle_message(t, peer, &pull, &mut out),
            Disposition::Consumed
        );
        assert_eq!(out.len(), 1, "the answer is queued");
        h.handle_message(t, peer, &pull, &mut out);
        h.handle_message(t, peer, &message(Msg::Done { msg: 7 }), &mut out);
        // A Pull beyond the buffer is refused too.
        let far = message(Msg::Pull {
            msg: 7,
            offset: 50,
            len: 51,
        });
        h.handle_message(t, peer, &far, &mut out);
        assert_eq!(out.len(), 1, "one answer only");
        // The second `Pull` and the one beyond the buffer are dropped; the `Done` is
        // ignored (a receiver that gave up after its `Pull` sends one).
        assert_eq!(h.st.stats.dropped, 2);
        assert!(pending(h.st), "the send must wait for its answer's end");
        // The range ends: now the send completes.
        let Some((to, crate::engine::protocol::Next::Chunk { key, bytes, .. })) = out.next(0)
        else {
            panic!("a range is queued")
        };
        assert_eq!((to, key, bytes.len()), (peer, 0, 100));
        assert_eq!(out.advance(0, true), Some(0));
        h.range_done(peer, 0, true, &mut out);
        assert!(matches!(h.st.ops.get(&0), Some(Op::Send(s)) if s.state == SendState::Done));
        assert!(h.st.outgoing.is_empty());
        assert!(h.wants_more(), "a few messages are handled in a batch");
        h.handled = DRIVE_BATCH;
        assert!(
            !h.wants_more(),
            "a completion returns to the application after the batch"
        );
    }

    /// A `Pull` of a send that is no longer pending (here: failed, its record kept for
    /// its wait) is dropped: its buffer may be the caller's again, and a range in the
    /// outbox can outlast the call that queued it.
    #[test]
    fn a_pull_of_a_send_no_longer_pending_is_dropped() {
        let buf = vec![5u8; 100];
        let mut st = pending_send(&buf);
        if let Some(Op::Send(s)) = st.ops.get_mut(&0) {
            s.state = SendState::Failed;
        }
        let (mut out, peer) = (Outbox::new(16), PEER);
        let mut h = alone(&mut st);
        let pull = pull_of_msg_7(100);
        let t = Time::from_duration(std::time::Duration::ZERO);
        h.handle_message(t, peer, &pull, &mut out);
        assert!(out.is_empty(), "a range of a buffer handed back");
        assert_eq!(h.st.stats.dropped, 1);
    }

    /// An answer that cannot be sent fails the send instead of leaving it pending.
    #[test]
    fn an_answer_dropped_fails_its_send() {
        let buf = vec![5u8; 10];
        let mut st = pending_send(&buf);
        let (mut out, peer) = (Outbox::new(16), PEER);
        let mut h = alone(&mut st);
        let pull = pull_of_msg_7(10);
        let t = Time::from_duration(std::time::Duration::ZERO);
        h.handle_message(t, peer, &pull, &mut out);
        assert_eq!(out.advance(0, false), Some(0));
        h.range_done(peer, 0, false, &mut out);
        assert!(matches!(h.st.ops.get(&0), Some(Op::Send(s)) if s.state == SendState::Failed));
        assert!(h.st.outgoing.is_empty());
    }

    /// A fresh endpoint's state with `push_credit` bytes of credit per peer.
    fn fresh(push_credit: usize) -> State {
        let config = Config {
            max_message: 1024,
            push_credit,
            ..Config::default()
        };
        State::new(&config, 2)
    }

    /// A receive into `buf`, posted for any message (as `start_recv` leaves it).
    fn posted_recv(st: &mut State, buf: &mut [u8]) -> u64 {
        let id = st.ops.insert(Op::Recv(RecvOp {
            ptr: buf.as_mut_ptr(),
            cap: buf.len(),
            state: RecvState::Posted {
                src: Src::Any,
                tag: Tag::Any,
            },
        }));
        assert!(st.matching.post(id, Src::Any, Tag::Any).is_none());
        id
    }

    /// The first push of message `msg` (`total` bytes, `pushed` of them pushed).
    fn push(msg: u64, total: u64, pushed: u64, data: &[u8]) -> Vec<u8> {
        message(Msg::Push {
            head: Announce {
                slot: 0,
                tag: 3,
                msg,
                total,
                pushed,
                pid: 1,
                seg: 0,
                addr: 0,
                sync: false,
            },
            data,
        })
    }

    fn more(msg: u64, offset: u64, data: &[u8]) -> Vec<u8> {
        message(Msg::More { msg, offset, data })
    }

    fn data(msg: u64, offset: u64, data: &[u8]) -> Vec<u8> {
        message(Msg::Data { msg, offset, data })
    }

    const PEER: Source = Source { rank: 1, dpid: 2 };

    /// A peer (or a network) that repeats or misplaces bytes cannot complete a receive
    /// with holes: each lane's bytes land in order, once, and only inside what the push
    /// announced and the pull asked for.
    #[test]
    fn repeated_or_misplaced_bytes_never_count_twice() {
        let mut st = fresh(8 << 20);
        let mut buf = vec![0u8; 100];
        let id = posted_recv(&mut st, &mut buf);
        let mut out = Outbox::new(16);
        let mut h = alone(&mut st);
        // 20 bytes pushed (10 with the announcement), 80 to pull.
        h.handle(PEER, &push(1, 100, 20, &[1; 10]), &mut out);
        h.handle(PEER, &more(1, 10, &[2; 10]), &mut out);
        h.handle(PEER, &more(1, 10, &[2; 10]), &mut out); // repeated
        h.handle(PEER, &more(1, 20, &[2; 10]), &mut out); // beyond the announced push
        h.handle(PEER, &data(1, 20, &[3; 40]), &mut out);
        h.handle(PEER, &data(1, 20, &[3; 40]), &mut out); // repeated
        h.handle(PEER, &data(1, 70, &[3; 30]), &mut out); // past a gap
        h.handle(PEER, &data(1, 60, &[3; 41]), &mut out); // beyond the buffer's need
        assert_eq!(h.st.stats.dropped, 5);
        assert!(
            matches!(
                h.st.ops.get(&id),
                Some(Op::Recv(RecvOp {
                    state: RecvState::Receiving(rc),
                    ..
                })) if rc.landed == 60
            ),
            "the receive must wait for bytes 60..100"
        );
        h.handle(PEER, &data(1, 60, &[3; 40]), &mut out);
        let Some(Op::Recv(RecvOp {
            state: RecvState::Done(Some(Ok(status))),
            ..
        })) = h.st.ops.get(&id)
        else {
            panic!("the receive is complete")
        };
        assert_eq!(status.len, 100);
        let want: Vec<u8> = [[1u8; 10].as_slice(), &[2; 10], &[3; 80]].concat();
        assert_eq!(buf, want);
    }

    /// A message waiting for its receive grows only by the pushed bytes it announced,
    /// in order.
    #[test]
    fn a_waiting_message_grows_only_as_announced() {
        let mut st = fresh(8 << 20);
        let mut out = Outbox::new(16);
        let mut h = alone(&mut st);
        h.handle(PEER, &push(1, 1000, 30, &[1; 10]), &mut out);
        h.handle(PEER, &more(1, 10, &[2; 20]), &mut out);
        h.handle(PEER, &more(1, 30, &[2; 10]), &mut out); // beyond the announced push
        h.handle(PEER, &more(1, 5, &[2; 5]), &mut out); // misplaced
        h.handle(PEER, &more(1, 30, &[2; 1 << 9]), &mut out); // and again, bigger
        assert_eq!(h.st.pushed_bytes, 30);
        assert_eq!(h.st.stats.dropped, 3);
    }

    /// A sender that pushes beyond the credit its receiver gives it (a liar, or a rank
    /// configured differently) has the message dropped, and the application hears of
    /// it; the pushed buffer stays within the credit.
    #[test]
    fn pushes_beyond_the_credit_are_refused_and_reported() {
        let mut st = fresh(1000);
        let mut out = Outbox::new(16);
        let mut h = alone(&mut st);
        h.handle(PEER, &push(1, 600, 600, &[1; 600]), &mut out);
        h.handle(PEER, &push(2, 600, 600, &[1; 600]), &mut out);
        assert_eq!(h.st.pushed_bytes, 600);
        assert_eq!(h.st.stats.dropped, 1);
        assert!(
            matches!(h.st.errors.front(), Some(Error::Protocol { rank: 1, .. })),
            "{:?}",
            h.st.errors
        );
    }

    /// Pushed bytes that leave the pushed buffer (here: matched at once) go back to
    /// their sender as credit once a quarter of it is free; a sender's credit returns
    /// with it.
    #[test]
    fn credit_goes_back_as_the_pushed_buffer_empties() {
        let mut st = fresh(1000);
        let mut buf = vec![0u8; 300];
        posted_recv(&mut st, &mut buf);
        let mut out = Outbox::new(16);
        let mut h = alone(&mut st);
        h.handle(PEER, &push(1, 300, 300, &[1; 300]), &mut out);
        assert_eq!(out.len(), 1, "a credit is queued");
        let Some((to, crate::engine::protocol::Next::Whole(bytes))) = out.next(0) else {
            panic!("a whole message is queued")
        };
        assert_eq!(to, PEER);
        assert_eq!(Msg::decode(bytes), Ok(Msg::Credit { bytes: 300 }));
        assert_eq!(h.st.push_owed[1], 0);
        // The sender's side: 700 in flight, 300 come back.
        h.st.push_in_flight[1] = 700;
        h.handle(PEER, &message(Msg::Credit { bytes: 300 }), &mut out);
        assert_eq!(h.st.push_in_flight[1], 400);
        // Out of credit: 400 + 300 > 1000 - ... and more than a quarter is never pushed.
        assert!(h.st.take_push_credit(1, 250));
        assert!(!h.st.take_push_credit(1, 251));
        assert!(!h.st.take_push_credit(1, 2000));
    }
}
