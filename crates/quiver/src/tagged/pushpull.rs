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

use super::matching::Matching;
use super::wire::{self, Announce, Msg};
use super::{PushMode, Src, Status, Tag, TaggedStats, SECOND_PUSH_MAX};
use crate::addr::Source;
use crate::channel::reliable::Time;
use crate::engine::protocol::{Disposition, Outbox, Protocol};
use crate::engine::station::Footing;
use crate::error::{Error, Result};
use crate::link::Transport;
use crate::rma::{GetError, Got, Offer, Peer, Remote, Rma};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

/// The outbox's bound. Every item answers one operation of the application's (a `Pull`
/// of one of its sends, a `Pull` or `Done` of one of its receives), so the
/// application's operations bound what it holds; a bound below that could stop two ends
/// from reading while each waits for room in the other's ring, so none is set.
const OUTBOX_ITEMS: usize = usize::MAX;

/// The protocol state of one tagged endpoint.
pub(super) struct State {
    pub(super) mode: PushMode,
    pub(super) btp1: usize,
    pub(super) btp2: usize,
    /// Largest payload of one protocol message.
    pub(super) chunk: usize,
    next_op: u64,
    next_msg: u64,
    pub(super) ops: HashMap<u64, Op>,
    /// Receives posted and not matched yet, and first pushes that found no posted
    /// receive (the pushed buffer).
    pub(super) matching: Matching<Unexpected>,
    /// Bytes the pushed buffer holds.
    pushed_bytes: u64,
    /// Matched receives still expecting bytes: (source, message) → operation.
    incoming: HashMap<(u32, u64), u64>,
    /// Sends waiting for their receiver's `Pull` or `Done`: (destination, message) →
    /// operation.
    outgoing: HashMap<(u32, u64), u64>,
    /// Matched receives too short for what their sender pushes: (source, message) → the
    /// end of the pushed bytes. Pushed bytes past the buffer are let go (not counted
    /// dropped) until the last of them has come.
    discarding: HashMap<(u32, u64), u64>,
    /// Matched receives whose rest is still to be pulled (`PushPull::make_pulls`), in
    /// the order they matched.
    to_pull: VecDeque<PullJob>,
    /// Receives whose pull the pull thread makes: operation → (source, message, offset,
    /// length).
    pulls: HashMap<u64, (u32, u64, u64, u64)>,
    pub(super) stats: TaggedStats,
    /// Operations completed so far (a drive of the station returns to the application
    /// after one: it may be the one the application waits for).
    completions: u64,
}

impl State {
    /// A fresh endpoint's state: push mode `mode` with BTP(1) `btp1` and BTP(2) `btp2`;
    /// protocol messages of at most `max_message` bytes.
    pub(super) fn new(mode: PushMode, btp1: usize, btp2: usize, max_message: usize) -> State {
        let chunk = max_message - wire::MAX_HEADER;
        State {
            mode,
            btp1: btp1.min(chunk),
            btp2,
            chunk,
            next_op: 0,
            next_msg: 0,
            ops: HashMap::new(),
            matching: Matching::new(),
            pushed_bytes: 0,
            incoming: HashMap::new(),
            outgoing: HashMap::new(),
            discarding: HashMap::new(),
            to_pull: VecDeque::new(),
            pulls: HashMap::new(),
            stats: TaggedStats::default(),
            completions: 0,
        }
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
    }
}

/// A send or a receive, from its start until its result is taken.
pub(super) enum Op {
    Send(SendOp),
    Recv(RecvOp),
}

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
pub(super) struct Unexpected {
    pub(super) head: Announce,
    data: Vec<u8>,
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
    out: RefCell<Outbox>,
    /// Same-node pulls (shared buffers, cross-memory attach, split copies, the pull
    /// thread) and the sender's side of split copies.
    pub(super) rma: Rma,
    rank: u32,
}

impl PushPull {
    /// The protocol of rank `rank` in state `st`, pulling on one node through `rma`.
    pub(super) fn new(st: State, rma: Rma, rank: u32) -> PushPull {
        PushPull {
            st: RefCell::new(st),
            out: RefCell::new(Outbox::new(OUTBOX_ITEMS)),
            rma,
            rank,
        }
    }

    pub(super) fn start_send(
        &self,
        on: &impl Footing,
        dest: u32,
        tag: u32,
        data: &[u8],
    ) -> Result<u64> {
        let station = on.station();
        let to = Source {
            rank: dest,
            dpid: station.dpid(),
        };
        // Connected (and checked) before anything is registered.
        let route = station.connect(to).map_err(|e| on.report(e))?;
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
            let state = if pushed == len {
                SendState::Done
            } else {
                SendState::Pending
            };
            st.ops.insert(
                id,
                Op::Send(SendOp {
                    dest,
                    tag,
                    msg,
                    ptr: data.as_ptr(),
                    len,
                    state,
                    answering: false,
                }),
            );
            if state == SendState::Pending {
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
            && station.transport_to(dest)? == Transport::Shm
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
        self.write_progressing(on, route, to, push.header().as_bytes(), push.data())?;
        let mut off = first;
        while off < pushed {
            let end = pushed.min(off + chunk);
            let more = Msg::More {
                msg,
                offset: off as u64,
                data: &data[off..end],
            };
            self.write_progressing(on, route, to, more.header().as_bytes(), more.data())?;
            off = end;
        }
        // Address-translation masking: the pushes are on their way; prepare the part the
        // receiver will pull now, off the critical path.
        touch_pages(&data[pushed..]);
        Ok(id)
    }

    pub(super) fn start_recv(
        &self,
        on: &impl Footing,
        ptr: *mut u8,
        cap: usize,
        src: Src,
        tag: Tag,
    ) -> Result<u64> {
        // Take in what has arrived first: a message already waiting must match before
        // this receive is queued behind it.
        self.progress(on)?;
        let found = {
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            let id = st.next_op;
            st.next_op += 1;
            st.ops.insert(
                id,
                Op::Recv(RecvOp {
                    ptr,
                    cap,
                    state: RecvState::Posted,
                }),
            );
            let found = st.matching.post(id, src, tag);
            if let Some(a) = &found {
                st.pushed_bytes -= a.msg.data.len() as u64;
                let from = Source {
                    rank: a.source,
                    dpid: on.station().dpid(),
                };
                begin_receive(
                    st,
                    &mut self.out.borrow_mut(),
                    id,
                    from,
                    &a.msg.head,
                    &a.msg.data,
                );
            }
            (id, found.is_some())
        };
        if found.1 {
            // The pull of a message that was waiting starts now, as it would have on
            // arrival, and its answer leaves at once (the receive may be complete
            // already, and its caller not come back for a while). The receive is
            // registered (and may be under way): its id must reach the caller, whose
            // wait or scope keeps the buffer until it ends. A failure of this pull ends
            // the receive itself (`make_pulls`); an error of the outbox (another peer's)
            // comes back from a later call.
            if let Err(e) = self.make_pulls(on).and_then(|_| self.send_outbox(on)) {
                tracing::debug!("tagged receive {}: {e}", found.0);
            }
        }
        Ok(found.0)
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
        for (to, key) in self.out.borrow_mut().drop_ranges() {
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
        let helped = self.rma.help();
        let collected = self.collect_pulls(on);
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
        Ok(handler.handled > 0 || out.sent() != sent)
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
                    r.state = RecvState::Done(Some(Err(e)));
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
                    r.state = RecvState::Done(Some(Err(Error::Protocol {
                        rank: source,
                        reason: format!("pulling message {msg}: {e}"),
                    })));
                    st.completions += 1;
                }
                Msg::Done { msg }
            }
        };
        queue(&mut self.out.borrow_mut(), &mut st.stats, to, &reply);
        true
    }

    /// Waits for the next protocol message (or pull completion, or room for the
    /// outbox) and handles it.
    pub(super) fn wait_message(&self, on: &impl Footing) -> Result<()> {
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
            .wait_for(|| Ok(self.poll(on)?.then_some(())), None)
    }

    /// Writes an application-initiated message (a push) on route `route` to `to`,
    /// waiting for room if needed but handling incoming messages and the outbox
    /// meanwhile, so that two ranks that both write never wait for each other. Nothing
    /// overtakes what the outbox holds for `to`.
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
            if !self.out.borrow().has_queued_for(to)
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
        let mut st = self.st.borrow_mut();
        let done = match st.ops.get_mut(&id)? {
            Op::Send(s) => match s.state {
                SendState::Pending => None,
                SendState::Done => Some(Ok(Status {
                    peer: s.dest,
                    tag: s.tag,
                    len: s.len as u64,
                })),
                SendState::Failed => Some(Err(Error::Protocol {
                    rank: s.dest,
                    reason: format!(
                        "the bytes of message {} the receiver asked for could not all be sent",
                        s.msg
                    ),
                })),
            },
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
    pub(super) fn test_op(&self, on: &impl Footing, id: u64) -> Result<bool> {
        self.progress(on)?;
        let st = self.st.borrow();
        Ok(match st.ops.get(&id) {
            Some(Op::Send(s)) => s.state != SendState::Pending,
            Some(Op::Recv(r)) => matches!(r.state, RecvState::Done(_)),
            None => true,
        })
    }

    pub(super) fn wait_op(&self, on: &impl Footing, id: u64) -> Result<Status> {
        if !self.st.borrow().ops.contains_key(&id) {
            return Err(Error::Config(format!(
                "operation {id} was already waited for"
            )));
        }
        // Looked at before every poll: many operations are complete when they start (a
        // send pushed whole, a receive of a message that waited), and the wait returns
        // as soon as a message was handled, which may have completed it.
        loop {
            if let Some(r) = self.take_if_done(id) {
                return r;
            }
            if !self.poll(on)? {
                self.wait_message(on)?;
            }
        }
    }

    /// Cancels receive `id` if nothing has matched it yet.
    pub(super) fn cancel_op(&self, id: u64) -> bool {
        let mut st = self.st.borrow_mut();
        if !st.matching.cancel(id) {
            return false;
        }
        if let Some(Op::Recv(r)) = st.ops.get_mut(&id) {
            r.state = RecvState::Done(Some(Err(Error::Cancelled)));
        }
        true
    }

    /// Whether operation `id` is still known (not taken by a wait).
    pub(super) fn is_pending(&self, id: u64) -> bool {
        self.st.borrow().ops.contains_key(&id)
    }
}

/// The Push-Pull protocol on the engine's hook: handles one protocol message at a time
/// with the endpoint's state (module documentation).
struct Handler<'a> {
    st: &'a mut State,
    /// The sender's side of split copies (`None` in the handler's own tests).
    rma: Option<&'a Rma>,
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

    fn wants_more(&self) -> bool {
        // Back to the application once an operation completed (it may be the one it
        // waits for); the rest waits for the next drive.
        self.st.completions == self.completions
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
    fn new(st: &'a mut State, rma: Option<&'a Rma>) -> Handler<'a> {
        let completions = st.completions;
        Handler {
            st,
            rma,
            handled: 0,
            completions,
        }
    }

    fn handle(&mut self, from: Source, bytes: &[u8], out: &mut Outbox) {
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
            Msg::Push { head, data } => {
                let matched = st.matching.arrive(source, head.tag, || Unexpected {
                    head,
                    data: data.to_vec(),
                });
                match matched {
                    Some(id) => begin_receive(st, out, id, from, &head, data),
                    None => {
                        st.stats.unexpected += 1;
                        st.pushed_bytes += data.len() as u64;
                        st.stats.pushed_buffer_peak =
                            st.stats.pushed_buffer_peak.max(st.pushed_bytes);
                    }
                }
            }
            Msg::More { msg, offset, data } | Msg::Data { msg, offset, data } => {
                let pulled = matches!(msg_in, Msg::Data { .. });
                // Pushed bytes of a truncated receive's message: the last lets it go.
                let discarded = !pulled
                    && match st.discarding.get(&(source, msg)) {
                        Some(&stop) => {
                            if offset + data.len() as u64 >= stop {
                                st.discarding.remove(&(source, msg));
                            }
                            true
                        }
                        None => false,
                    };
                if let Some(&id) = st.incoming.get(&(source, msg)) {
                    let Some(Op::Recv(r)) = st.ops.get_mut(&id) else {
                        return;
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
                    if finish_if_complete(r, &mut st.completions) {
                        st.incoming.remove(&(source, msg));
                    }
                } else if let Some(u) = st
                    .matching
                    .unexpected_mut(source, |u| u.head.msg == msg && !pulled)
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
                } else if !discarded {
                    st.stats.dropped += 1;
                }
            }
            Msg::Pull { msg, offset, len } => {
                let send =
                    st.outgoing
                        .get(&(source, msg))
                        .and_then(|&id| match st.ops.get_mut(&id) {
                            // One answer per send: a repeated `Pull` is a peer's error.
                            Some(Op::Send(s)) if !s.answering => Some((id, s)),
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
                // Answered with a range of the send buffer, sent in chunks as the route
                // takes them; the send completes after its last byte (`range_done`).
                // SAFETY: [offset, end) lies inside the send buffer (checked above), valid
                // until the send completes: not before the range is done (`answering`).
                let queued = unsafe { out.send_range(from, id, ptr, offset, end, st.chunk) };
                if queued.is_err() {
                    st.stats.dropped += 1;
                    if let Some(Op::Send(s)) = st.ops.get_mut(&id) {
                        s.answering = false;
                    }
                }
            }
            Msg::Done { msg } => match st.outgoing.get(&(source, msg)).copied() {
                // While a range of the buffer is being sent, only its end completes
                // the send (else the caller could free what the outbox still reads).
                Some(id) if !matches!(st.ops.get(&id), Some(Op::Send(s)) if s.answering) => {
                    complete_send(st, self.rma, source, msg, id)
                }
                _ => st.stats.dropped += 1,
            },
        }
    }
}

/// A message matched receive `id`: copies what was pushed, records the pull of the
/// rest (made by `PushPull::make_pulls`, outside the handler: it may attach to another
/// process), and tells a sender of a truncated message that nothing more is needed.
fn begin_receive(
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
    let expected = head.total.min(r.cap as u64);
    let n = have.len().min(r.cap);
    // SAFETY: the receive's buffer is valid for `cap` bytes until the operation
    // completes (its scope or blocking call outlives it); n <= cap.
    unsafe { std::ptr::copy_nonoverlapping(have.as_ptr(), r.ptr, n) };
    // Bytes of the message past what was pushed, and inside the buffer.
    let pull_len = expected.saturating_sub(head.pushed);
    r.state = RecvState::Receiving {
        source: from.rank,
        tag: head.tag,
        total: head.total,
        expected,
        landed: n as u64,
    };
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
        if let RecvState::Receiving { landed, .. } = &mut r.state {
            *landed += len;
        }
        if finish_if_complete(r, &mut st.completions) {
            st.incoming.remove(&(source, msg));
        }
    }
}

/// The receiver is done with send `id` (message `msg` to `dest`).
fn complete_send(st: &mut State, rma: Option<&Rma>, dest: u32, msg: u64, id: u64) {
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
            *completions += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A send of 100 bytes to rank 1 waiting for its receiver (as `start_send` leaves it).
    fn pending_send(buf: &[u8]) -> State {
        let mut st = State::new(PushMode::Zero, 0, 0, 1024);
        st.ops.insert(
            0,
            Op::Send(SendOp {
                dest: 1,
                tag: 3,
                msg: 7,
                ptr: buf.as_ptr(),
                len: buf.len(),
                state: SendState::Pending,
                answering: false,
            }),
        );
        st.outgoing.insert((1, 7), 0);
        st
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
        let (mut out, peer) = (Outbox::new(16), Source { rank: 1, dpid: 2 });
        let mut h = alone(&mut st);
        let pull = message(Msg::Pull {
            msg: 7,
            offset: 0,
            len: 100,
        });
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
        assert_eq!(h.st.stats.dropped, 3);
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
        assert!(!h.wants_more(), "a completion returns to the application");
    }

    /// An answer that cannot be sent fails the send instead of leaving it pending.
    #[test]
    fn an_answer_dropped_fails_its_send() {
        let buf = vec![5u8; 10];
        let mut st = pending_send(&buf);
        let (mut out, peer) = (Outbox::new(16), Source { rank: 1, dpid: 2 });
        let mut h = alone(&mut st);
        let pull = message(Msg::Pull {
            msg: 7,
            offset: 0,
            len: 10,
        });
        let t = Time::from_duration(std::time::Duration::ZERO);
        h.handle_message(t, peer, &pull, &mut out);
        assert_eq!(out.advance(0, false), Some(0));
        h.range_done(peer, 0, false, &mut out);
        assert!(matches!(h.st.ops.get(&0), Some(Op::Send(s)) if s.state == SendState::Failed));
        assert!(h.st.outgoing.is_empty());
    }
}
