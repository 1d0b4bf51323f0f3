//! The Push-Pull protocol of a tagged endpoint, message by message (the steps are in the
//! [module documentation](super)): starting sends (pushes, the split-copy offer) and
//! receives (matching through [`Matching`]), handling the protocol messages that arrive
//! (`Push`, `More`, `Pull`, `Data`, `Done`), the pull of a matched message (a get of
//! `rma` on one node, else a `Pull` request), and the outbox.
//!
//! What it owns: every operation from its start until its result is taken (`State::ops`),
//! the pushed buffer, the matched receives still expecting bytes, the sends waiting for
//! their receiver, and the outbox. What it guarantees: a handler never waits for a peer
//! (what a peer's channel cannot take now waits in the outbox, in order per
//! destination); a malformed message or one naming no known message is counted
//! (`dropped`) and dropped, never a panic; a receive buffer is written only inside its
//! capacity and only while its operation is pending.
//!
//! It drives the endpoint itself (reads, writes, waits): the protocol hook that would
//! let the engine drive it (stage C1 of the engine redesign) does not exist yet.

use super::matching::Matching;
use super::wire::{self, Announce, Msg};
use super::{PushMode, Src, Status, Tag, Tagged, TaggedStats, SECOND_PUSH_MAX};
use crate::error::{Error, Result};
use crate::link::Transport;
use crate::rma::{GetError, Got, Offer, Peer, Remote};
use std::collections::{HashMap, VecDeque};

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
    /// Protocol messages the handlers could not write at once (the peer's channel was
    /// full), per destination, in order: sent before anything else to that peer.
    outbox: HashMap<u32, VecDeque<OutItem>>,
    /// Receives whose pull the pull thread makes: operation → (source, message, offset,
    /// length).
    pulls: HashMap<u64, (u32, u64, u64, u64)>,
    pub(super) stats: TaggedStats,
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
            pulls: HashMap::new(),
            outbox: HashMap::new(),
            stats: TaggedStats::default(),
        }
    }
}

/// A send or a receive, from its start until its result is taken.
pub(super) enum Op {
    Send(SendOp),
    Recv(RecvOp),
}

/// A protocol message waiting in the outbox.
pub(super) enum OutItem {
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

pub(super) struct SendOp {
    dest: u32,
    tag: u32,
    ptr: *const u8,
    len: usize,
    done: bool,
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

impl Tagged {
    pub(super) fn start_send(&self, dest: u32, tag: u32, data: &[u8]) -> Result<u64> {
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

    pub(super) fn start_recv(&self, ptr: *mut u8, cap: usize, src: Src, tag: Tag) -> Result<u64> {
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
                    state: RecvState::Posted,
                }),
            );
            id
        };
        let found = {
            let mut st = self.st.borrow_mut();
            let found = st.matching.post(id, src, tag);
            if let Some(a) = &found {
                st.pushed_bytes -= a.msg.data.len() as u64;
            }
            found
        };
        if let Some(a) = found {
            self.begin_or_fail(id, a.source, &a.msg.head, &a.msg.data);
        }
        Ok(id)
    }

    /// [`Tagged::begin_receive`]; a failure (a pull that cannot be made, a peer gone)
    /// completes receive `id` with the error instead of leaving it pending.
    fn begin_or_fail(&self, id: u64, source: u32, head: &Announce, have: &[u8]) {
        if let Err(e) = self.begin_receive(id, source, head, have) {
            let mut st = self.st.borrow_mut();
            st.incoming.remove(&(source, head.msg));
            if let Some(Op::Recv(r)) = st.ops.get_mut(&id) {
                r.state = RecvState::Done(Some(Err(e)));
            }
        }
    }

    /// A message matched receive `id`: copy what was pushed, pull the rest.
    fn begin_receive(&self, id: u64, source: u32, head: &Announce, have: &[u8]) -> Result<()> {
        let (ptr, cap) = {
            let st = self.st.borrow();
            let Some(Op::Recv(r)) = st.ops.get(&id) else {
                return Ok(());
            };
            (r.ptr, r.cap)
        };
        let expected = head.total.min(cap as u64);
        let n = have.len().min(cap);
        // SAFETY: the receive's buffer is valid for `cap` bytes until the operation
        // completes (its scope or blocking call outlives it); n <= cap.
        unsafe { std::ptr::copy_nonoverlapping(have.as_ptr(), ptr, n) };
        let mut landed = n as u64;
        // Bytes of the message past what was pushed, and inside the buffer.
        let pull_from = head.pushed;
        let pull_len = expected.saturating_sub(pull_from);
        let mut tell_done = head.total > head.pushed && pull_len == 0; // truncated: nothing to pull
        if pull_len > 0 {
            let same_node = source == self.rank || self.ep.transport_to(source)? == Transport::Shm;
            let got = if same_node {
                let peer = Peer {
                    rank: source,
                    pid: head.pid,
                };
                let at = head.addr.saturating_add(pull_from);
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
                            rank: source,
                            reason: format!("pulling message {}: {e}", head.msg),
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
                        .insert(id, (source, head.msg, pull_from, pull_len));
                }
                Got::Unreachable => {
                    let pull = Msg::Pull {
                        msg: head.msg,
                        offset: pull_from,
                        len: pull_len,
                    };
                    self.send_ctrl(source, &pull)?;
                    // Preparing the destination overlaps the pull request's round trip.
                    // SAFETY: [pull_from, pull_from + pull_len) lies inside the receive
                    // buffer (pull_from + pull_len = expected <= cap), valid until the
                    // receive completes; nothing writes it before the requested bytes come.
                    touch_pages(unsafe {
                        std::slice::from_raw_parts(ptr.add(pull_from as usize), pull_len as usize)
                    });
                }
            }
        }
        self.receiving(id, source, head, expected, landed, tell_done)
    }

    /// Receive `id` now takes message `u`: `landed` of its `expected` bytes are in the
    /// buffer; `tell_done` sends `Done` (the sender's buffer is no longer needed).
    fn receiving(
        &self,
        id: u64,
        source: u32,
        head: &Announce,
        expected: u64,
        landed: u64,
        tell_done: bool,
    ) -> Result<()> {
        if tell_done {
            let done = Msg::Done { msg: head.msg };
            self.send_ctrl(source, &done)?;
        }
        let mut st = self.st.borrow_mut();
        let Some(Op::Recv(r)) = st.ops.get_mut(&id) else {
            return Ok(());
        };
        r.state = RecvState::Receiving {
            source,
            tag: head.tag,
            total: head.total,
            expected,
            landed,
        };
        if !finish_if_complete(r) {
            st.incoming.insert((source, head.msg), id);
        }
        Ok(())
    }

    /// Handles one protocol message if one has arrived.
    pub(super) fn poll(&self) -> Result<bool> {
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
    pub(super) fn wait_message(&self) -> Result<()> {
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
                let matched = {
                    let mut st = self.st.borrow_mut();
                    let st = &mut *st;
                    let matched = st.matching.arrive(source, head.tag, || Unexpected {
                        head,
                        data: data.to_vec(),
                    });
                    if matched.is_none() {
                        st.stats.unexpected += 1;
                        st.pushed_bytes += data.len() as u64;
                        st.stats.pushed_buffer_peak =
                            st.stats.pushed_buffer_peak.max(st.pushed_bytes);
                    }
                    matched
                };
                if let Some(id) = matched {
                    self.begin_or_fail(id, source, &head, data);
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
    pub(super) fn take_if_done(&self, id: u64) -> Option<Result<Status>> {
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
    pub(super) fn test_op(&self, id: u64) -> Result<bool> {
        self.progress()?;
        let st = self.st.borrow();
        Ok(match st.ops.get(&id) {
            Some(Op::Send(s)) => s.done,
            Some(Op::Recv(r)) => matches!(r.state, RecvState::Done(_)),
            None => true,
        })
    }

    pub(super) fn wait_op(&self, id: u64) -> Result<Status> {
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
