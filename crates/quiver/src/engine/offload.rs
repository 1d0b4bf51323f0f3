//! The offload engine (`QUIVER_RELIABILITY=offload`, LCI's RX_ni): a progress thread
//! that owns an endpoint's network side — socket, receive pool, reliable channels,
//! retransmissions, timers and acknowledgements — so that the protocol keeps running
//! while the application computes or blocks elsewhere.
//!
//! The application thread and the engine share only two lock-free SPSC rings (the same
//! token rings, and the same wake-up protocol, as shared memory, in process memory):
//!
//! - **commands** (application → engine): `Send` (a message for a peer, copied once
//!   into the ring by `write`, which then returns), `Connect`, `Flush`, `Close`;
//! - **deliveries** (engine → application): received messages with their source, read
//!   in place by `read` and released when the view drops.
//!
//! Errors, counters and the flush state go through a mutex the application looks at
//! only when an atomic flag says there is news. Flow control carries across the rings:
//! a peer's closed window stops the engine taking commands (once its frames of the
//! round are sent: at most a window's worth waits for a peer before they are), so a
//! full command ring makes `write` wait; a full delivery ring stops the engine
//! delivering, so receive buffers stay taken and the sender runs out of credits.
//! Nothing is dropped.
//!
//! `QUIVER_OFFLOAD_CPU` pins the engine thread to one CPU.
//!
//! The engine thread can also serve a personality's protocol (a [`Service`], a `Send`
//! [`Protocol`]): every message that arrives over the network is handed to it there,
//! before delivery, and what it sends leaves from its [`Outbox`] on the same thread, so a
//! peer is answered while the application computes (the target side of a remote
//! operation, GAMMA's handlers). Messages from same-node peers travel shared memory to
//! the application's station and do not reach it.

use super::clock::ProtocolClock;
use super::driver::{Driver, Ready};
use super::protocol::{Disposition, Outbox, Protocol};
use super::stats::EndpointStats;
use super::wait::{backoff_until, Notifier, Poller};
use crate::addr::Source;
use crate::channel::reliable::Time;
use crate::config::WaitMode;
use crate::error::{Error, Result};
use crate::job::JobShared;
use crate::link::shm::ring::{Consumer, HeapEnd, HeapRing, Producer};
use crate::link::shm::wake::WakeLine;
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A protocol the offload engine's thread serves ([`super::station::Station::open_serving`]).
///
/// Its messages share the delivery ring with what it leaves for delivery: while the
/// application does not read, a message it delivered waits at the front once the ring is
/// full, and the service waits behind it (a service whose peers also send plain messages
/// needs an application that reads them).
pub(crate) type Service = Box<dyn Protocol + Send>;

/// How many messages a served protocol may queue (its outbox's bound): the engine hands
/// it no more messages while it holds this many.
const SERVICE_OUTBOX: usize = 4096;

/// A protocol on the engine thread, with its outbox and clock.
struct Served {
    protocol: Service,
    out: Outbox,
    clock: ProtocolClock,
    /// A range's chunk joined to its header (the engine's send takes one slice).
    joined: Vec<u8>,
    /// The protocol was handed the front ready message and left it for delivery (the
    /// delivery ring was full): it is not handed again.
    front_handled: bool,
}

/// Bytes of the record header the engine and the application put before a message:
/// kind (1), reserved (1), DPID (2), rank (4).
const REC_HDR: usize = 8;

const CMD_SEND: u8 = 1;
const CMD_CONNECT: u8 = 2;
const CMD_FLUSH: u8 = 3;
const CMD_CLOSE: u8 = 4;
const DELIVERY: u8 = 5;

fn rec_header(kind: u8, peer: Source) -> [u8; REC_HDR] {
    let mut h = [0u8; REC_HDR];
    h[0] = kind;
    h[2..4].copy_from_slice(&peer.dpid.to_le_bytes());
    h[4..8].copy_from_slice(&peer.rank.to_le_bytes());
    h
}

fn parse_header(b: &[u8]) -> (u8, Source) {
    let dpid = u16::from_le_bytes([b[2], b[3]]);
    let rank = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    (b[0], Source { rank, dpid })
}

/// How long the engine polls after its last piece of work before it sleeps, and how
/// long it sleeps at most while deliveries wait for room (the application frees room
/// without waking it).
const ENGINE_SPIN: Duration = Duration::from_micros(50);

// YIELD: an idle engine and an application polling an empty delivery ring yield the CPU
// (sched_yield) instead of spinning. When the engine shares a CPU with the application
// (two ranks and two engines on two cores, or unpinned threads), spinning would hold the
// CPU for a whole time slice while the other side has the message: measured over UDP on
// this machine, 8 B ping-pong went from 6-10 ms to 9-16 us. Alone on its CPU, a yield
// returns at once (one system call).
const FULL_RECHECK: Duration = Duration::from_millis(1);

/// What the engine tells the application besides messages.
#[derive(Default)]
struct News {
    errors: VecDeque<Error>,
    /// The engine's network counters as of its last round of work.
    stats: EndpointStats,
    /// The last flush request completed, and how (`Some(e)`: a channel failed).
    flushed: u64,
    flush_error: Option<Error>,
    /// The engine thread has ended (after `Close`, or on a fatal error).
    stopped: bool,
    /// The longest message that reaches each connected peer in one frame.
    frames: HashMap<Source, usize>,
}

/// State shared by the application and the engine thread.
struct Shared {
    /// The engine sleeps on `engine_bell` after arming `engine_wake`.
    engine_wake: WakeLine,
    engine_bell: Notifier,
    /// The application sleeps on `app_bell` (through its endpoint's poller).
    app_wake: WakeLine,
    app_bell: Notifier,
    /// Set when `news` holds errors the application has not taken.
    has_errors: AtomicBool,
    news: Mutex<News>,
}

impl Shared {
    fn news(&self) -> MutexGuard<'_, News> {
        // A poisoned lock means the engine panicked while holding it; the data (counters,
        // errors) is still meaningful.
        self.news.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After a command: rings the engine's bell if it sleeps.
    fn wake_engine(&self) {
        if self.engine_wake.must_ring() {
            self.engine_bell.notify();
        }
    }

    fn wake_app(&self) {
        if self.app_wake.must_ring() {
            self.app_bell.notify();
        }
    }
}

/// The application's side of the offload engine, owned by the endpoint.
pub(crate) struct Offload {
    commands: HeapEnd<Producer>,
    deliveries: HeapEnd<Consumer>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    flush_seq: u64,
    max_message: usize,
    transport: crate::link::Transport,
    /// Whether the engine's link can broadcast ([`Driver::can_broadcast`]).
    broadcast: bool,
}

impl Offload {
    /// The transport of the engine's network link.
    pub(crate) fn transport(&self) -> crate::link::Transport {
        self.transport
    }

    /// Opens the endpoint's network side and starts its engine thread.
    /// With `service`, the engine thread serves that protocol (module documentation).
    pub(crate) fn start(
        job: Arc<JobShared>,
        dpid: u16,
        service: Option<Service>,
    ) -> Result<Offload> {
        let net = Driver::open(job.clone(), dpid)?;
        let transport = net.transport();
        let broadcast = net.can_broadcast();
        let max_message = job.config.max_message;
        let (commands, cmd_rx) = HeapRing::split(REC_HDR + max_message);
        let (delivery_tx, deliveries) = HeapRing::split(REC_HDR + max_message);
        let shared = Arc::new(Shared {
            engine_wake: WakeLine::new(),
            engine_bell: Notifier::new()?,
            app_wake: WakeLine::new(),
            app_bell: Notifier::new()?,
            has_errors: AtomicBool::new(false),
            news: Mutex::new(News::default()),
        });
        let poller = Poller::new()?;
        poller.add_with(net.fd(), net.caps().edge_triggered)?;
        if let Some(fd) = net.second_fd() {
            poller.add(fd)?;
        }
        poller.add(shared.engine_bell.as_raw_fd())?;
        let cpu = job.config.offload_cpu;
        let wait = job.config.wait;
        let engine_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("quiver-offload-{dpid}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    super::wait::pin_current_thread(cpu);
                }
                // Made here: a served protocol's outbox may hold ranges of memory
                // (raw pointers), which do not cross threads.
                let engine = Engine {
                    net,
                    commands: cmd_rx,
                    deliveries: delivery_tx,
                    shared: engine_shared,
                    poller,
                    ready: VecDeque::new(),
                    errors: VecDeque::new(),
                    stats: EndpointStats::default(),
                    blocked_on: None,
                    flush_pending: None,
                    closing: None,
                    reported: HashSet::new(),
                    wait,
                    served: service.map(|protocol| Served {
                        protocol,
                        out: Outbox::new(SERVICE_OUTBOX),
                        clock: ProtocolClock::new(),
                        joined: Vec::new(),
                        front_handled: false,
                    }),
                };
                engine.run();
            })
            .map_err(|e| Error::io("spawning the offload engine thread", e))?;
        Ok(Offload {
            transport,
            broadcast,
            commands,
            deliveries,
            shared,
            thread: Some(thread),
            flush_seq: 0,
            max_message,
        })
    }

    /// Whether the engine's link can broadcast ([`Driver::can_broadcast`]).
    pub(crate) fn can_broadcast(&self) -> bool {
        self.broadcast
    }

    /// The descriptor the application's poller watches for deliveries and errors.
    pub(crate) fn bell_fd(&self) -> i32 {
        self.shared.app_bell.as_raw_fd()
    }

    fn push(&mut self, kind: u8, peer: Source, body: &[u8], mode: WaitMode) -> Result<bool> {
        self.push_parts(kind, peer, (&[], body), mode)
    }

    /// [`Offload::push`] of a command whose body is `head` then `body` (copied once).
    fn push_parts(
        &mut self,
        kind: u8,
        peer: Source,
        (part, body): (&[u8], &[u8]),
        mode: WaitMode,
    ) -> Result<bool> {
        let head = rec_header(kind, peer);
        let mut stalled = false;
        if !self.commands.try_push3(&head, part, body) {
            stalled = true;
            let (commands, shared) = (&mut self.commands, &self.shared);
            backoff_until(mode, None, || {
                if commands.try_push3(&head, part, body) {
                    return Ok(Some(()));
                }
                // A failed channel may be why the engine stopped taking commands.
                if shared.has_errors.load(Ordering::Acquire) {
                    if let Some(e) = take_error_for(shared, peer) {
                        return Err(e);
                    }
                }
                if shared.news().stopped {
                    return Err(stopped());
                }
                Ok(None)
            })?;
        }
        self.shared.wake_engine();
        Ok(stalled)
    }

    /// Hands a message for `peer`, `head` then `data`, to the engine; returns once it is
    /// copied (true if the command ring was full and the call waited).
    pub(crate) fn send(
        &mut self,
        peer: Source,
        (head, data): (&[u8], &[u8]),
        mode: WaitMode,
    ) -> Result<bool> {
        self.check_len(head.len() + data.len())?;
        self.push_parts(CMD_SEND, peer, (head, data), mode)
    }

    /// Like [`Offload::send`] without waiting: false if the command ring is full.
    pub(crate) fn try_send(&mut self, peer: Source, (head, data): (&[u8], &[u8])) -> Result<bool> {
        self.check_len(head.len() + data.len())?;
        if !self
            .commands
            .try_push3(&rec_header(CMD_SEND, peer), head, data)
        {
            return Ok(false);
        }
        self.shared.wake_engine();
        Ok(true)
    }

    /// Whether the command ring has about room for a batch of commands as long as a
    /// message (half of it free): a caller that must not wait starts a batch only then
    /// (a batch that still finds it full waits for the rest).
    pub(crate) fn has_room_for_a_message(&self) -> bool {
        self.commands.half_free()
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len > self.max_message {
            return Err(Error::MessageTooLarge {
                len,
                max: self.max_message,
            });
        }
        Ok(())
    }

    /// The longest message that reaches `peer` in one frame of its channel, once the
    /// engine has set that channel up ([`Offload::connect`]): waits for it up to
    /// `timeout`; `None` if it did not come in that time, or the engine stopped or
    /// reported an error meanwhile (any: the caller then sends whole messages, which
    /// the engine cuts to frames itself).
    pub(crate) fn frame_payload(
        &self,
        peer: Source,
        mode: WaitMode,
        timeout: Duration,
    ) -> Option<usize> {
        let shared = &self.shared;
        backoff_until(mode, Some(timeout), || {
            let news = shared.news();
            if let Some(&n) = news.frames.get(&peer) {
                return Ok(Some(n));
            }
            if news.stopped || shared.has_errors.load(Ordering::Acquire) {
                return Err(stopped());
            }
            Ok(None)
        })
        .ok()
    }

    /// Asks the engine to set up the channel to `peer` (registered in the rendezvous).
    pub(crate) fn connect(&mut self, peer: Source, mode: WaitMode) -> Result<()> {
        self.push(CMD_CONNECT, peer, &[], mode).map(|_| ())
    }

    /// Waits until everything sent so far is acknowledged.
    pub(crate) fn flush(&mut self, timeout: Duration, mode: WaitMode) -> Result<()> {
        self.flush_seq += 1;
        let seq = self.flush_seq;
        let me = Source { rank: 0, dpid: 0 };
        self.push(CMD_FLUSH, me, &seq.to_le_bytes(), mode)?;
        let shared = &self.shared;
        backoff_until(mode, Some(timeout), || {
            let mut news = shared.news();
            if news.flushed >= seq {
                return match news.flush_error.take() {
                    Some(e) => Err(e),
                    None => Ok(Some(())),
                };
            }
            if news.stopped {
                return Err(stopped());
            }
            Ok(None)
        })
    }

    /// Errors the engine reported since the last call, oldest first.
    #[inline]
    pub(crate) fn take_errors(&self, into: &mut VecDeque<Error>) {
        if self.shared.has_errors.load(Ordering::Acquire) {
            let mut news = self.shared.news();
            into.extend(news.errors.drain(..));
            self.shared.has_errors.store(false, Ordering::Release);
        }
    }

    /// The next delivered message: (source, payload pointer, length, token).
    #[inline]
    pub(crate) fn try_pop(&mut self) -> Option<(Source, *const u8, usize, u64)> {
        let Some(rec) = self.deliveries.try_pop().ok().flatten() else {
            // The engine may need this CPU to make the message arrive (see YIELD).
            std::thread::yield_now();
            return None;
        };
        let ptr = self.deliveries.mem().payload_ptr(rec.idx);
        // SAFETY: the record's REC_HDR + len bytes lie inside the ring and stay unchanged
        // until its token is released; the engine writes every delivery with a header.
        let head = unsafe { std::slice::from_raw_parts(ptr, REC_HDR) };
        let (_, source) = parse_header(head);
        // SAFETY: as above, the payload follows the header inside the record.
        let payload = unsafe { ptr.add(REC_HDR) };
        Some((source, payload, rec.len - REC_HDR, rec.token))
    }

    pub(crate) fn release(&mut self, token: u64) {
        self.deliveries.release(token);
    }

    /// True when a message or an error waits.
    pub(crate) fn has_news(&self) -> bool {
        self.deliveries.has_data() || self.shared.has_errors.load(Ordering::Acquire)
    }

    /// About to sleep: from now on the engine rings the application's bell.
    pub(crate) fn arm(&self) {
        self.shared.app_wake.arm();
    }

    /// Drains the bell and lets the engine ring it again.
    pub(crate) fn reset_doorbell(&self) {
        self.shared.app_bell.drain();
        self.shared.app_wake.reset_after_drain();
    }

    pub(crate) fn disarm(&self) {
        self.shared.app_wake.disarm();
    }

    /// The engine's counters, with the application's own (messages and bytes) laid over.
    pub(crate) fn stats(&self, app: &EndpointStats) -> EndpointStats {
        let mut st = self.shared.news().stats.clone();
        st.msgs_sent = app.msgs_sent;
        st.bytes_sent = app.bytes_sent;
        st.msgs_received = app.msgs_received;
        st.bytes_received = app.bytes_received;
        st.send_stalls = app.send_stalls;
        st.corrupt_rings = app.corrupt_rings;
        st
    }

    /// Tells the engine to finish (linger up to `linger` for acknowledgements, say
    /// goodbye) and waits for its thread.
    pub(crate) fn close(&mut self, linger: Duration) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let me = Source { rank: 0, dpid: 0 };
        let ms = linger.as_millis().min(u64::MAX as u128) as u64;
        // The engine takes commands as long as it runs; if it has stopped, join at once.
        let _ = backoff_until(
            WaitMode::Block,
            Some(linger + Duration::from_secs(1)),
            || {
                if self
                    .commands
                    .try_push2(&rec_header(CMD_CLOSE, me), &ms.to_le_bytes())
                {
                    return Ok(Some(()));
                }
                Ok(self.shared.news().stopped.then_some(()))
            },
        );
        self.shared.engine_bell.notify();
        let _ = thread.join();
    }
}

impl Drop for Offload {
    fn drop(&mut self) {
        self.close(Duration::ZERO);
    }
}

fn stopped() -> Error {
    Error::io(
        "offload engine",
        std::io::Error::other("the progress thread has stopped"),
    )
}

/// Takes the first reported failure of the channel to `peer`, if any.
fn take_error_for(shared: &Shared, peer: Source) -> Option<Error> {
    let mut news = shared.news();
    let i = news.errors.iter().position(|e| {
        matches!(e, Error::PeerFailed { rank, dpid, .. }
            | Error::ChannelFailed { rank, dpid, .. }
            | Error::PeerClosed { rank, dpid }
            if *rank == peer.rank && *dpid == peer.dpid)
    })?;
    let e = news.errors.remove(i);
    if news.errors.is_empty() {
        shared.has_errors.store(false, Ordering::Release);
    }
    e
}

/// The engine thread's state.
struct Engine {
    net: Driver,
    commands: HeapEnd<Consumer>,
    deliveries: HeapEnd<Producer>,
    shared: Arc<Shared>,
    poller: Poller,
    /// Messages received and not yet in the delivery ring (it was full).
    ready: VecDeque<Ready>,
    errors: VecDeque<Error>,
    stats: EndpointStats,
    /// A peer whose window closed: no command is taken until it opens (the application's
    /// writes then wait on the full command ring: the sender stalls on credits).
    blocked_on: Option<usize>,
    flush_pending: Option<u64>,
    /// A close was asked for: linger until everything is acknowledged or this instant.
    closing: Option<Instant>,
    /// Peers whose failure was already reported.
    reported: HashSet<Source>,
    wait: WaitMode,
    /// The protocol this thread serves, if any.
    served: Option<Served>,
}

impl Engine {
    fn run(mut self) {
        let mut last_work = Instant::now();
        let mut published = (u64::MAX, u64::MAX);
        loop {
            let mut work = false;
            match self.round() {
                Ok(w) => work = w,
                Err(e) => self.errors.push_back(e),
            }
            // Counters and errors to the application, when they changed.
            let marks = (self.stats.frames_received, self.stats.frames_sent);
            if !self.errors.is_empty() || marks != published || self.flush_pending.is_some() {
                published = marks;
                self.publish();
            }
            if let Some(until) = self.closing {
                if !self.net.unacknowledged() || Instant::now() >= until {
                    self.net.say_goodbye();
                    break;
                }
            }
            if work {
                last_work = Instant::now();
                continue;
            }
            let spin = match self.wait {
                WaitMode::Spin => Duration::MAX,
                WaitMode::Block => Duration::ZERO,
                WaitMode::Hybrid(_) => ENGINE_SPIN,
            };
            if last_work.elapsed() < spin {
                // See YIELD.
                std::thread::yield_now();
                continue;
            }
            self.sleep();
            last_work = Instant::now();
        }
        let mut news = self.shared.news();
        news.stopped = true;
        drop(news);
        self.shared.wake_app();
    }

    /// Sleeps until a datagram or a command arrives, or the protocol's next deadline.
    fn sleep(&mut self) {
        self.shared.engine_wake.arm();
        self.shared.engine_bell.drain();
        self.shared.engine_wake.reset_after_drain();
        if !self.commands.has_data() {
            let mut timeout = self.net.time_to_deadline();
            if let Some(s) = &self.served {
                if let Some(at) = s.protocol.poll_timeout() {
                    let wait = at.saturating_since(s.clock.now());
                    timeout = Some(timeout.map_or(wait, |t| t.min(wait)));
                }
            }
            if !self.ready.is_empty() || self.closing.is_some() {
                timeout = Some(timeout.map_or(FULL_RECHECK, |t| t.min(FULL_RECHECK)));
            }
            if let Err(e) = self.poller.wait(timeout) {
                self.errors.push_back(e);
            }
        }
        self.shared.engine_wake.disarm();
    }

    /// One round: take commands, run the network, deliver. Returns whether anything
    /// happened.
    fn round(&mut self) -> Result<bool> {
        let mut work = self.take_commands()?;
        let frames = self.stats.frames_received;
        let deliver = self.ready.is_empty();
        self.net
            .progress(&mut self.ready, &mut self.stats, &mut self.errors, deliver)?;
        work |= self.stats.frames_received != frames;
        work |= self.serve_timeout();
        work |= self.deliver();
        work |= self.send_served();
        self.check_channels();
        if let Some(seq) = self.flush_pending {
            if !self.net.unacknowledged() {
                self.flush_pending = None;
                let mut news = self.shared.news();
                news.flushed = seq;
                news.flush_error = self.net.failed_channel();
            }
        }
        Ok(work)
    }

    /// Takes the application's commands: the messages of a round are queued and each
    /// peer's frames sent together at the end (a burst of small messages leaves in one
    /// batch of the link, not a system call each), or as soon as a window's worth waits
    /// for one peer; once the frames sent leave a peer's window closed (the
    /// application's or a served protocol's), no command is taken until it opens.
    fn take_commands(&mut self) -> Result<bool> {
        let mut queued_for = Vec::new();
        let r = self.take_commands_queueing(&mut queued_for);
        let sent = self.transmit_queued(&queued_for);
        let work = r?;
        sent?;
        Ok(work)
    }

    /// Sends what was queued for `peers` (to every one of them, whatever fails: the
    /// first error is returned) and notes a peer whose window is then closed.
    fn transmit_queued(&mut self, peers: &[usize]) -> Result<()> {
        let mut first = Ok(());
        for &i in peers {
            if let Err(e) = self.net.transmit_queued(i, &mut self.stats) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
            if self.net.is_blocked(i) {
                self.blocked_on = Some(i);
            }
        }
        first
    }

    /// [`Engine::take_commands`]'s loop; the peers it queued messages for, and has not
    /// sent them to yet, in `queued_for`.
    fn take_commands_queueing(&mut self, queued_for: &mut Vec<usize>) -> Result<bool> {
        let mut work = false;
        loop {
            if let Some(i) = self.blocked_on {
                if self.net.is_blocked(i) && !self.net.peer_at(i).closed {
                    return Ok(work);
                }
                self.blocked_on = None;
            }
            let rec = match self.commands.try_pop() {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(work),
                Err(c) => {
                    // Only this process writes the ring: a bad record is a bug, not input.
                    unreachable!("offload command ring corrupt: {c:?}")
                }
            };
            work = true;
            let ptr = self.commands.mem().payload_ptr(rec.idx);
            // SAFETY: the record's bytes lie inside the ring and are not overwritten until
            // its token is released (below, after use).
            let bytes = unsafe { std::slice::from_raw_parts(ptr, rec.len) };
            let (kind, peer) = parse_header(bytes);
            let body = &bytes[REC_HDR..];
            if kind != CMD_SEND {
                // What follows (a flush, a close) comes after the messages before it; it
                // runs whatever their sending met (reported as the engine's other errors).
                if let Err(e) = self.transmit_queued(queued_for) {
                    self.errors.push_back(e);
                }
                queued_for.clear();
            }
            let r = match kind {
                CMD_SEND => self.queue_send(peer, body, queued_for),
                CMD_CONNECT => self.net.peer(peer, false).map(|i| {
                    // What the application's protocols cut their messages to.
                    let n = self.net.lone_max(i);
                    self.shared.news().frames.insert(peer, n);
                }),
                CMD_FLUSH => {
                    let seq = u64::from_le_bytes(body.try_into().unwrap_or_default());
                    self.flush_pending = Some(seq);
                    self.net.flush_acks(&mut self.stats)
                }
                CMD_CLOSE => {
                    let ms = u64::from_le_bytes(body.try_into().unwrap_or_default());
                    self.closing = Some(Instant::now() + Duration::from_millis(ms));
                    self.net.flush_acks(&mut self.stats)
                }
                _ => unreachable!("offload command kind {kind}"),
            };
            self.commands.release(rec.token);
            r?;
        }
    }

    /// Queues a message of the application's for `peer` (sent by
    /// [`Engine::transmit_queued`]), at once with those queued before it when a window's
    /// worth waits.
    fn queue_send(&mut self, peer: Source, data: &[u8], queued_for: &mut Vec<usize>) -> Result<()> {
        let i = self.net.peer(peer, false)?;
        if !self.net.queue(i, data)? {
            if self.reported.insert(peer) {
                self.errors.push_back(self.net.failure_of(i));
            }
            return Ok(());
        }
        self.queued(i, queued_for)
    }

    /// Moves received messages into the delivery ring while it has room. A message read
    /// in place from a pool slot is copied and its slot (a credit) freed at once.
    /// A served protocol sees each message first: one it consumes is released here.
    fn deliver(&mut self) -> bool {
        let mut moved = false;
        while let Some(r) = self.ready.front() {
            let source = match r {
                Ready::Slot { source, .. } | Ready::Owned { source, .. } => *source,
            };
            let data = self.net.ready_bytes(r);
            if let Some(s) = self.served.as_mut() {
                if !s.front_handled {
                    if s.out.is_full() {
                        // The rest waits until the outbox has room (`send_served`).
                        break;
                    }
                    let now = if s.protocol.uses_time() {
                        s.clock.now()
                    } else {
                        Time::ZERO
                    };
                    match s.protocol.handle_message(now, source, data, &mut s.out) {
                        Disposition::Consumed => {
                            moved = true;
                            if let Some(r) = self.ready.pop_front() {
                                self.net.release(r);
                            }
                            continue;
                        }
                        Disposition::Deliver => s.front_handled = true,
                    }
                }
            }
            if !self
                .deliveries
                .try_push2(&rec_header(DELIVERY, source), data)
            {
                break;
            }
            moved = true;
            if let Some(s) = self.served.as_mut() {
                s.front_handled = false;
            }
            // Copied into the ring: its slot or buffer goes back at once.
            if let Some(r) = self.ready.pop_front() {
                self.net.release(r);
            }
        }
        if moved {
            self.shared.wake_app();
        }
        moved
    }

    /// Fires the served protocol's timeout when it is due.
    fn serve_timeout(&mut self) -> bool {
        let Some(s) = self.served.as_mut() else {
            return false;
        };
        let Some(at) = s.protocol.poll_timeout() else {
            return false;
        };
        let now = s.clock.now();
        if at > now {
            return false;
        }
        s.protocol.handle_timeout(now, &mut s.out);
        true
    }

    /// Sends what the served protocol's outbox holds, in order per destination, into
    /// the channels (which queue what their window does not take yet: nothing here
    /// waits). A message to a peer that cannot be reached is dropped with its error
    /// reported, a range then ends as not complete. Returns whether anything left.
    fn send_served(&mut self) -> bool {
        let Some(mut s) = self.served.take() else {
            return false;
        };
        let before = s.out.sent();
        let mut errors = Vec::new();
        let mut queued_for = Vec::new();
        let joined = &mut s.joined;
        s.out.flush(
            &mut *s.protocol,
            |to, head, body| {
                // The engine's send takes one slice: a range's chunk is joined to its
                // header (one copy, on the engine's core).
                let bytes = if head.is_empty() {
                    body
                } else {
                    joined.clear();
                    joined.extend_from_slice(head);
                    joined.extend_from_slice(body);
                    &joined[..]
                };
                // `None`: the window is closed, this destination waits for credits (the
                // acknowledgement that brings them wakes the engine).
                self.send_for_service(to, bytes, &mut queued_for)
                    .map(|sent| sent.is_some())
            },
            |e| errors.push(e),
        );
        // What was queued leaves together, as the application's commands do.
        if let Err(e) = self.transmit_queued(&queued_for) {
            errors.push(e);
        }
        // Work done: something left, or something was dropped (what a dropped range's
        // end queued then goes in the next round).
        let sent = s.out.sent() != before || !errors.is_empty();
        self.errors.extend(errors);
        self.served = Some(s);
        sent
    }

    /// Queues a served protocol's message to `peer` in its channel if the window is
    /// open (`Some`), else nothing (`None`); the error of a failed channel (reported once
    /// through the news as well) or of a peer that cannot be reached. Sent as
    /// [`Engine::queue_send`] sends (`queued_for`: the peers to send to at the end).
    fn send_for_service(
        &mut self,
        peer: Source,
        data: &[u8],
        queued_for: &mut Vec<usize>,
    ) -> Result<Option<()>> {
        let i = self.net.peer(peer, false)?;
        if self.net.is_blocked(i) && !self.net.peer_at(i).closed {
            return Ok(None);
        }
        if !self.net.queue(i, data)? {
            return Err(self.net.failure_of(i));
        }
        self.queued(i, queued_for)?;
        Ok(Some(()))
    }

    /// Peer `i` has a message queued: it is sent with the others at the end of the
    /// round (`queued_for`), or now when a window's worth waits for it.
    fn queued(&mut self, i: usize, queued_for: &mut Vec<usize>) -> Result<()> {
        if !queued_for.contains(&i) {
            queued_for.push(i);
        }
        let (waiting, window) = self.net.waiting_frames(i);
        if waiting >= window {
            queued_for.retain(|&q| q != i);
            self.transmit_queued(&[i])?;
        }
        Ok(())
    }

    /// Failed channels are reported once each.
    fn check_channels(&mut self) {
        for e in self.errors.iter() {
            if let Error::PeerFailed { rank, dpid, .. } = e {
                self.reported.insert(Source {
                    rank: *rank,
                    dpid: *dpid,
                });
            }
        }
    }

    /// Hands errors and counters to the application.
    fn publish(&mut self) {
        let mut st = self.stats.clone();
        self.net.add_counters(&mut st);
        let mut news = self.shared.news();
        news.stats = st;
        if !self.errors.is_empty() {
            news.errors.extend(self.errors.drain(..));
            self.shared.has_errors.store(true, Ordering::Release);
        }
        drop(news);
        self.shared.wake_app();
    }
}

#[cfg(test)]
mod tests {
    use super::super::protocol::{Disposition, Outbox, Protocol};
    use super::super::station::Station;
    use crate::addr::Source;
    use crate::channel::reliable::Time;
    use crate::config::{Config, ReliabilityMode, TransportChoice};
    use crate::error::Error;
    use std::sync::mpsc;
    use std::time::Duration;

    const DPID: u16 = 9;

    /// `add` + a number: adds it and answers `sum` + the running total (consumed);
    /// anything else goes on to the application. Counts the threads it ran on.
    struct Counter {
        sum: u64,
        threads: mpsc::Sender<std::thread::ThreadId>,
    }

    impl Protocol for Counter {
        fn handle_message(
            &mut self,
            _now: Time,
            from: Source,
            msg: &[u8],
            out: &mut Outbox,
        ) -> Disposition {
            let _ = self.threads.send(std::thread::current().id());
            let Some(n) = msg.strip_prefix(b"add") else {
                return Disposition::Deliver;
            };
            self.sum += u64::from_le_bytes(n.try_into().expect("8 bytes"));
            out.send(from, b"sum", &self.sum.to_le_bytes())
                .expect("room: one answer per request");
            Disposition::Consumed
        }
    }

    fn config(reliability: ReliabilityMode) -> Config {
        Config {
            transport: TransportChoice::Udp,
            reliability,
            connect_timeout: Duration::from_secs(10),
            ..Config::default()
        }
    }

    /// Rank 1 serves a counter on its offload engine and its application thread then
    /// only sleeps: rank 0 still gets every running total, in order; the plain messages
    /// wait for rank 1's application, in order; the handler ran on the engine thread.
    #[test]
    fn a_protocol_served_on_the_engine_thread_answers_while_the_application_sleeps() {
        let (jobs, _server) = crate::test_support::jobs(2, &config(ReliabilityMode::Offload));
        let [j0, j1]: [crate::Job; 2] = jobs.try_into().ok().unwrap();
        let adds = 300u64;
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let (threads_tx, threads_rx) = mpsc::channel();
        let server = std::thread::spawn(move || {
            let counter = Counter {
                sum: 0,
                threads: threads_tx,
            };
            let st = Station::open_serving(j1.shared.clone(), DPID, Box::new(counter)).unwrap();
            // The application is elsewhere until the client has every answer.
            done_rx.recv().unwrap();
            let mut plain = 0u64;
            while plain < adds {
                let r = st
                    .wait_for(|| st.poll(), Some(Duration::from_secs(20)))
                    .unwrap();
                // SAFETY: valid until the token is released, below.
                let bytes = unsafe { std::slice::from_raw_parts(r.ptr, r.len) };
                plain += 1;
                assert_eq!(bytes[..3], *b"dm:");
                assert_eq!(bytes[3..], plain.to_le_bytes(), "plain messages in order");
                st.release_token(r.token);
            }
            (std::thread::current().id(), j1)
        });
        let st = Station::open(j0.shared.clone(), DPID).unwrap();
        let to1 = st
            .connect(Source {
                rank: 1,
                dpid: DPID,
            })
            .unwrap();
        let mut expected = 0;
        for i in 1..=adds {
            assert!(st.send(to1, b"add", &i.to_le_bytes(), true).unwrap());
            assert!(st.send(to1, b"dm:", &i.to_le_bytes(), true).unwrap());
            let r = st
                .wait_for(|| st.poll(), Some(Duration::from_secs(20)))
                .unwrap();
            // SAFETY: valid until the token is released, below.
            let bytes = unsafe { std::slice::from_raw_parts(r.ptr, r.len) };
            expected += i;
            assert_eq!(bytes[..3], *b"sum");
            assert_eq!(bytes[3..], expected.to_le_bytes(), "answer {i}");
            st.release_token(r.token);
        }
        done_tx.send(()).unwrap();
        let (app_thread, _j1) = server.join().unwrap();
        let ran_on: std::collections::HashSet<_> = threads_rx.try_iter().collect();
        assert_eq!(ran_on.len(), 1, "one engine thread");
        assert!(
            !ran_on.contains(&app_thread),
            "the handler ran on the application thread"
        );
        st.flush_within(Duration::from_secs(5)).unwrap();
        drop(j0);
    }

    /// Serving needs the offload engine and a network side: a typed error otherwise.
    #[test]
    fn serving_without_the_offload_engine_is_a_config_error() {
        let (jobs, _server) = crate::test_support::jobs(1, &config(ReliabilityMode::Host));
        let (threads, _) = mpsc::channel();
        let counter = Box::new(Counter { sum: 0, threads });
        match Station::open_serving(jobs[0].shared.clone(), DPID, counter) {
            Err(Error::Config(why)) => assert!(why.contains("QUIVER_RELIABILITY=offload"), "{why}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a service without the offload engine was accepted"),
        }
    }
}
