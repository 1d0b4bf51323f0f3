//! The Directed Point endpoint: its API (open, target, write, read, release, flush,
//! statistics, the pollable descriptor), the shared-memory fast paths inline on both
//! sides, and waiting. Routes, the receive side and the network driver are the engine's
//! (`engine::route`, `engine::driver`).

use super::message::Message;
use super::{EndpointStats, Source};
use crate::config::ReliabilityMode as Mode;
use crate::config::TransportChoice;
use crate::engine::driver::{self, Driver, Pace};
use crate::engine::offload::Offload;
use crate::engine::route::{self, Polled, Receivers, Route, Token};
use crate::engine::{backoff_until, Poller, Waitable, Waiter};
use crate::error::{Error, Result};
use crate::job::{Job, JobShared, Progress};
use crate::link::shm::{ShmRx, ShmTx};
use crate::link::Transport;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a waiting endpoint checks that the processes of its same-node peers live.
const LIVENESS_PERIOD: Duration = Duration::from_millis(100);

/// A Directed Point endpoint. See the [module documentation](crate::dm).
pub struct Endpoint {
    job: Arc<JobShared>,
    dpid: u16,
    inner: RefCell<Inner>,
    poller: Poller,
    waiter: Waiter,
    fd_exported: Cell<bool>,
    /// The transport of this endpoint's network link (UDP where it has none).
    net_transport: Transport,
    /// Runs on every error as it is delivered (see [`Endpoint::set_error_handler`]).
    error_handler: RefCell<Option<ErrorHandler>>,
}

/// A callback for the errors an endpoint reports.
type ErrorHandler = Box<dyn FnMut(&Error)>;

// SAFETY: the endpoint owns its mappings, sockets and pool; the raw pointers inside
// (rings, pool slots) refer to memory that moves with it. It is not Sync: one thread at a
// time uses it, which is all that moving it to another thread allows.
unsafe impl Send for Endpoint {}

struct Inner {
    /// The receive side: shared memory, the driver or the offload engine.
    rx: Receivers,
    routes: Vec<(Source, Route)>,
    route_index: HashMap<Source, usize>,
    target: Option<usize>,
    held: VecDeque<Token>,
    errors: VecDeque<Error>,
    stats: EndpointStats,
    /// Ranks found failed: every operation towards them fails.
    failed: HashSet<u32>,
    /// Liveness of same-node peers: empty polls since the last look at the clock, when
    /// the processes were last checked, and a request to check at the next poll.
    empty_polls: u32,
    liveness_at: Instant,
    liveness_due: bool,
}

impl Job {
    /// Opens endpoint `dpid` on this rank. A DPID can be open once per rank at a time.
    pub fn open(&self, dpid: u16) -> Result<Endpoint> {
        self.shared.reserve_dpid(dpid)?;
        Endpoint::open(self.shared.clone(), dpid).inspect_err(|_| self.shared.close_dpid(dpid))
    }
}

impl Progress for Endpoint {
    fn progress(&self) -> Result<()> {
        Endpoint::progress(self)
    }

    fn failed_ranks(&self) -> Vec<u32> {
        Endpoint::failed_ranks(self)
    }
}

impl Endpoint {
    pub(crate) fn open(job: Arc<JobShared>, dpid: u16) -> Result<Endpoint> {
        let cfg = &job.config;
        let me = job.rank;
        let shm = match cfg.transport {
            TransportChoice::Auto | TransportChoice::Eth => Some(ShmRx::create(
                job.job_id,
                me,
                dpid,
                cfg.shm_slots,
                cfg.pool_size,
                cfg.max_message,
            )?),
            TransportChoice::Udp => None,
        };
        let needs_udp = cfg.transport == TransportChoice::Udp || job.node_count() > 1;
        let offloaded = cfg.reliability == Mode::Offload;
        let udp = if needs_udp && !offloaded {
            Some(Driver::open(job.clone(), dpid)?)
        } else {
            None
        };
        let offload = if needs_udp && offloaded {
            Some(Offload::start(job.clone(), dpid)?)
        } else {
            None
        };
        let net_transport = match (&udp, &offload) {
            (Some(u), _) => u.transport(),
            (None, Some(o)) => o.transport(),
            (None, None) => Transport::Udp,
        };
        let poller = Poller::new()?;
        if let Some(s) = &shm {
            poller.add(s.doorbell_fd())?;
        }
        if let Some(u) = &udp {
            poller.add_with(u.fd(), u.caps().edge_triggered)?;
        }
        if let Some(o) = &offload {
            poller.add(o.bell_fd())?;
        }
        // Make (NID, DPID) resolvable; the first rank of a node to open a DPID owns the name.
        let nid = job.nids[me as usize];
        job.kv
            .put_if_absent(&format!("dp/{nid}/{dpid}"), &me.to_string())?;
        Ok(Endpoint {
            waiter: Waiter { mode: cfg.wait },
            job,
            dpid,
            inner: RefCell::new(Inner {
                rx: Receivers::new(shm, udp, offload),
                routes: Vec::new(),
                route_index: HashMap::new(),
                target: None,
                held: VecDeque::new(),
                errors: VecDeque::new(),
                stats: EndpointStats::default(),
                failed: HashSet::new(),
                empty_polls: 0,
                liveness_at: Instant::now(),
                liveness_due: false,
            }),
            poller,
            fd_exported: Cell::new(false),
            net_transport,
            error_handler: RefCell::new(None),
        })
    }

    /// This endpoint's DPID.
    pub fn dpid(&self) -> u16 {
        self.dpid
    }

    /// This endpoint's rank.
    pub fn rank(&self) -> u32 {
        self.job.rank
    }

    /// Sets the destination of [`Endpoint::write`] to endpoint `dpid` of node `nid` (the
    /// endpoint of the first rank on that node that opened `dpid`), connecting if needed.
    pub fn target(&self, nid: u32, dpid: u16) -> Result<()> {
        let timeout = self.job.config.connect_timeout;
        let rank = match self.job.kv.get(&format!("dp/{nid}/{dpid}"), timeout) {
            Ok(v) => v.parse::<u32>().map_err(|_| Error::Rendezvous {
                url: self.job.kv.url().to_string(),
                reason: format!("bad owner {v:?} for node {nid} DPID {dpid}"),
            })?,
            Err(Error::Timeout(_)) => {
                return Err(Error::NoSuchEndpoint {
                    nid,
                    dpid,
                    waited: timeout,
                })
            }
            Err(e) => return Err(e),
        };
        self.target_endpoint(rank, dpid)
    }

    /// Sets the destination to the endpoint with this endpoint's DPID on `rank`.
    pub fn target_rank(&self, rank: u32) -> Result<()> {
        self.target_endpoint(rank, self.dpid)
    }

    /// Sets the destination to endpoint `dpid` on `rank`, connecting if needed (waiting
    /// up to `QUIVER_CONNECT_TIMEOUT` for the peer to open it).
    pub fn target_endpoint(&self, rank: u32, dpid: u16) -> Result<()> {
        let peer = Source { rank, dpid };
        let idx = self.connect(peer)?;
        self.inner.borrow_mut().target = Some(idx);
        Ok(())
    }

    /// The transport used towards `rank`.
    pub fn transport_to(&self, rank: u32) -> Result<Transport> {
        if rank >= self.job.size {
            return Err(Error::NoSuchRank {
                rank,
                size: self.job.size,
            });
        }
        Ok(
            if self.job.config.transport == TransportChoice::Udp
                || self.job.nids[rank as usize] != self.job.nids[self.job.rank as usize]
            {
                self.net_transport
            } else {
                Transport::Shm
            },
        )
    }

    fn connect(&self, peer: Source) -> Result<usize> {
        if let Some(&i) = self.inner.borrow().route_index.get(&peer) {
            return Ok(i);
        }
        let me = Source {
            rank: self.job.rank,
            dpid: self.dpid,
        };
        let timeout = self.job.config.connect_timeout;
        let route = match self.transport_to(peer.rank)? {
            Transport::Shm => Route::Shm(ShmTx::connect(self.job.job_id, peer, me, timeout)?),
            Transport::Udp | Transport::Eth if self.inner.borrow().rx.offload.is_some() => {
                self.await_net_peer(peer)?;
                let mut inner = self.inner.borrow_mut();
                let off = inner.rx.offload.as_mut().expect("checked above");
                off.connect(peer, self.waiter.mode)?;
                Route::Offload
            }
            Transport::Udp | Transport::Eth => {
                let mut guard = self.inner.borrow_mut();
                let udp = guard
                    .rx
                    .net
                    .as_mut()
                    .expect("a network transport implies the driver");
                Route::Net {
                    peer: udp.peer(peer, true)?,
                }
            }
        };
        let mut inner = self.inner.borrow_mut();
        let i = inner.routes.len();
        inner.routes.push((peer, route));
        inner.route_index.insert(peer, i);
        Ok(i)
    }

    /// Waits up to `QUIVER_CONNECT_TIMEOUT` for `peer` to publish its network link.
    fn await_net_peer(&self, peer: Source) -> Result<()> {
        let timeout = self.job.config.connect_timeout;
        let key = driver::net_key(peer.rank, peer.dpid);
        match self.job.kv.get(&key, timeout) {
            Ok(_) => Ok(()),
            Err(Error::Timeout(_)) => Err(Error::PeerNotFound {
                rank: peer.rank,
                dpid: peer.dpid,
                waited: timeout,
            }),
            Err(e) => Err(e),
        }
    }

    /// Sends one message to the target. Returns when `data` may be reused; waits (per
    /// `QUIVER_WAIT`) while the receiver's pool is full.
    pub fn write(&self, data: &[u8]) -> Result<()> {
        self.write_to_target(&[], data, true)
            .map(|_| ())
            .map_err(|e| self.report(e))
    }

    /// Sends one message made of `head` followed by `body` (a gather write: over shared
    /// memory both are copied straight into the receiver's ring). For protocols that put
    /// a header of their own before a payload.
    pub fn write_parts(&self, head: &[u8], body: &[u8]) -> Result<()> {
        self.write_to_target(head, body, true)
            .map(|_| ())
            .map_err(|e| self.report(e))
    }

    /// Like [`Endpoint::write_parts`], but never waits: returns false, sending nothing,
    /// when the receiver's shared-memory ring (or the offload engine's command ring) is
    /// full. Over the network the message is accepted even when the channel's window is
    /// closed (it waits in the channel for credits). For protocols that must keep
    /// reading while they cannot write.
    pub fn try_write_parts(&self, head: &[u8], body: &[u8]) -> Result<bool> {
        self.write_to_target(head, body, false)
            .map_err(|e| self.report(e))
    }

    /// Sends one message to the target; with `wait` false, returns false instead of
    /// waiting for room. The common case, a shared-memory target with room, is done
    /// here without a call; everything else (and every error) in `write_slow`.
    #[inline(always)]
    fn write_to_target(&self, head: &[u8], data: &[u8], wait: bool) -> Result<bool> {
        if let Ok(mut guard) = self.inner.try_borrow_mut() {
            let inner = &mut *guard;
            if let (Some(idx), true) = (inner.target, inner.failed.is_empty()) {
                if let Some((_, Route::Shm(tx))) = inner.routes.get_mut(idx) {
                    let len = head.len() + data.len();
                    if len <= tx.max_message()
                        && len <= self.job.config.max_message
                        && matches!(tx.try_send_parts(head, data), Ok(true))
                    {
                        inner.stats.msgs_sent += 1;
                        inner.stats.bytes_sent += len as u64;
                        return Ok(true);
                    }
                }
            }
        }
        self.write_slow(head, data, wait)
    }

    /// [`Endpoint::write_to_target`] in full: every transport, waiting, errors.
    #[cold]
    #[inline(never)]
    fn write_slow(&self, head: &[u8], data: &[u8], wait: bool) -> Result<bool> {
        let max = self.job.config.max_message;
        if head.len() + data.len() > max {
            return Err(Error::MessageTooLarge {
                len: head.len() + data.len(),
                max,
            });
        }
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        let Some(idx) = inner.target else {
            return Err(Error::NoTarget);
        };
        if !inner.failed.is_empty() {
            let peer = inner.routes[idx].0;
            if inner.failed.contains(&peer.rank) {
                return Err(Error::PeerFailed {
                    rank: peer.rank,
                    dpid: peer.dpid,
                    reason: "found failed earlier".into(),
                });
            }
        }
        let (dest, route) = &mut inner.routes[idx];
        match route {
            Route::Offload => {
                let mut joined = Vec::new();
                let data = contiguous(head, data, &mut joined);
                let off = inner.rx.offload.as_mut().expect("an offload connection");
                if !wait {
                    if !off.try_send(*dest, data)? {
                        return Ok(false);
                    }
                } else if off.send(*dest, data, self.waiter.mode)? {
                    inner.stats.send_stalls += 1;
                }
            }
            Route::Shm(tx) => {
                if head.len() + data.len() > tx.max_message() {
                    return Err(Error::MessageTooLarge {
                        len: head.len() + data.len(),
                        max: tx.max_message(),
                    });
                }
                let send = |tx: &mut ShmTx| tx.try_send_parts(head, data);
                if !send(tx)? {
                    if !wait {
                        return Ok(false);
                    }
                    inner.stats.send_stalls += 1;
                    let mut last_check = Instant::now();
                    backoff_until(self.waiter.mode, None, || {
                        if send(tx)? {
                            return Ok(Some(()));
                        }
                        if last_check.elapsed() > Duration::from_millis(10) {
                            last_check = Instant::now();
                            tx.check_peer()?;
                        }
                        Ok(None)
                    })?;
                }
            }
            Route::Net { peer } => {
                let peer = *peer;
                drop(guard);
                self.write_net(peer, head, data, wait)?;
                return Ok(true);
            }
        }
        inner.stats.msgs_sent += 1;
        inner.stats.bytes_sent += (head.len() + data.len()) as u64;
        Ok(true)
    }

    /// Sends `head` followed by `data` on the network channel to peer `peer` (the frames
    /// are built from both slices, never joined first). A writer that may wait hands
    /// the message to the channel a part at a time, one window ahead of what the window
    /// takes: each frame is built (the one copy) shortly before it can go, so a message
    /// many windows long neither waits in memory whole nor keeps the link idle while it
    /// is copied; once all of it is queued the writer waits until it may go, so that a
    /// fast writer waits for a slow reader instead of queueing without bound. A writer
    /// that may not wait queues the whole message; it goes out as credits return.
    ///
    /// If waiting fails half-way (the channel failed, the peer left), the frames already
    /// sent are a message without its end: the receiver drops them, and counts them
    /// malformed when the next message begins.
    fn write_net(&self, peer: usize, head: &[u8], data: &[u8], wait: bool) -> Result<()> {
        {
            // The common case, a message of one frame the window lets out now, in one step.
            let mut guard = self.inner.borrow_mut();
            let inner = &mut *guard;
            let net = inner
                .rx
                .net
                .as_mut()
                .expect("a network connection implies a link");
            if net.write_lone(peer, head, data, &mut inner.stats)? {
                inner.stats.msgs_sent += 1;
                inner.stats.bytes_sent += (head.len() + data.len()) as u64;
                return Ok(());
            }
        }
        let mut part = {
            let inner = self.inner.borrow();
            let net = inner
                .rx
                .net
                .as_ref()
                .expect("a network connection implies a link");
            net.begin_send(peer, head.len() + data.len())?
        };
        let pace = if wait { Pace::Window } else { Pace::Unbounded };
        let mut stalled = false;
        loop {
            let (queued, must_wait) = {
                let mut guard = self.inner.borrow_mut();
                let inner = &mut *guard;
                let udp = inner
                    .rx
                    .net
                    .as_mut()
                    .expect("a network connection implies a link");
                let step = udp.send_part(peer, (head, data), &mut part, pace, &mut inner.stats)?;
                let (queued, must_wait) = (step.queued, step.must_wait);
                if must_wait && !stalled {
                    stalled = true;
                    inner.stats.send_stalls += 1;
                }
                (queued, must_wait)
            };
            if must_wait {
                // The window is closed: make progress until it opens. Waits per the wait
                // mode, sleeping on the endpoint's descriptor, where the acknowledgement
                // that brings credits wakes it (a blind sleep let a 1 Gbit/s link idle).
                self.waiter.wait(&CreditWait { ep: self, peer }, None)?;
            }
            if queued {
                break;
            }
        }
        let mut inner = self.inner.borrow_mut();
        inner.stats.msgs_sent += 1;
        inner.stats.bytes_sent += (head.len() + data.len()) as u64;
        Ok(())
    }

    /// The next message, if one is waiting. Never blocks.
    #[inline]
    pub fn try_read(&self) -> Result<Option<Message<'_>>> {
        if let Some(m) = self.poll_once()? {
            return Ok(Some(m));
        }
        if self.fd_exported.get() {
            // The descriptor was handed out: re-enable the doorbell for the next message,
            // then look once more (a sender may have published before the reset).
            self.inner.borrow().reset_doorbells();
            return self.poll_once();
        }
        Ok(None)
    }

    /// The next message, waiting for it per the wait mode (`QUIVER_WAIT`).
    #[inline]
    pub fn read(&self) -> Result<Message<'_>> {
        if let Some(m) = self.poll_once()? {
            return Ok(m);
        }
        self.waiter.wait(&ReadWait(self), None)
    }

    /// Like [`Endpoint::read`], but runs `idle` on every poll that finds no message
    /// (work the caller does while it waits, such as helping a peer's copy); returns
    /// `None` as soon as `idle` returns true (it did something).
    pub(crate) fn read_or_idle(&self, idle: &dyn Fn() -> bool) -> Result<Option<Message<'_>>> {
        if let Some(m) = self.poll_once()? {
            return Ok(Some(m));
        }
        self.waiter.wait(
            &ReadOrIdle {
                read: ReadWait(self),
                idle,
            },
            None,
        )
    }

    /// The next message, waiting at most `timeout` ([`Error::Timeout`] then).
    pub fn read_timeout(&self, timeout: Duration) -> Result<Message<'_>> {
        self.waiter.wait(&ReadWait(self), Some(timeout))
    }

    /// Releases the `n` oldest tokens kept with [`Message::hold`]; returns how many were
    /// released (fewer if fewer are held).
    pub fn release(&self, n: usize) -> usize {
        let mut released = 0;
        while released < n {
            let Some(t) = self.inner.borrow_mut().held.pop_front() else {
                break;
            };
            self.release_token(t);
            released += 1;
        }
        released
    }

    /// How long a caller that waits on this endpoint's descriptor itself (in its own
    /// `poll`/`epoll` loop) may sleep before calling [`Endpoint::progress`] or
    /// [`Endpoint::try_read`] again: network channels have timers (retransmission,
    /// acknowledgement, probes) that a sleeping process must not miss. `None`: no timer
    /// is running. [`Endpoint::read`] handles this by itself.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.inner
            .borrow()
            .rx
            .net
            .as_ref()
            .and_then(|u| u.time_to_deadline())
    }

    /// One round of protocol work without taking a message out: receive what arrived
    /// (it waits in the pool for `read`), acknowledge, retransmit, fire due timers.
    /// In `host` and `none` reliability network channels progress only inside quiver
    /// calls; call this while waiting for something else (see also
    /// [`crate::Job::barrier_progressing`]). With the offload engine it does nothing:
    /// the engine's thread makes progress.
    pub fn progress(&self) -> Result<()> {
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        inner.rx.progress(&mut inner.stats, &mut inner.errors)?;
        if let Some(off) = inner.rx.offload.as_ref() {
            off.take_errors(&mut inner.errors);
        }
        // The errors wait for the next read; the failed ranks are known at once.
        for e in &inner.errors {
            if let Error::PeerFailed { rank, .. } = e {
                inner.failed.insert(*rank);
            }
        }
        Ok(())
    }

    /// Waits until everything this endpoint sent over the network is acknowledged (or
    /// its receiver closed), sending pending acknowledgements at once. Call it before
    /// blocking outside quiver (a barrier of another library, a long computation): in
    /// `host` and `none` reliability, retransmissions and acknowledgements happen only
    /// while the process is inside quiver. Shared memory needs no flush.
    /// [`Error::Timeout`] after `QUIVER_CONNECT_TIMEOUT`.
    pub fn flush(&self) -> Result<()> {
        self.flush_within(self.job.config.connect_timeout)
    }

    /// Like [`Endpoint::flush`] with an explicit time limit.
    pub fn flush_within(&self, timeout: Duration) -> Result<()> {
        if let Some(off) = self.inner.borrow_mut().rx.offload.as_mut() {
            // The engine keeps answering peers after this returns: no quiet period.
            return off.flush(timeout, self.waiter.mode);
        }
        {
            let mut guard = self.inner.borrow_mut();
            let inner = &mut *guard;
            let Some(udp) = inner.rx.net.as_mut() else {
                return Ok(());
            };
            udp.flush_acks(&mut inner.stats)?;
        }
        // Done when everything sent is acknowledged and nothing has arrived for QUIET:
        // like TCP's TIME_WAIT, the quiet period answers a peer whose last
        // acknowledgement from us was lost and that retransmits (else it would wait for
        // us in vain once we block elsewhere).
        let mut last_rx = (u64::MAX, Instant::now());
        backoff_until(self.waiter.mode, Some(timeout), || {
            let mut guard = self.inner.borrow_mut();
            let inner = &mut *guard;
            inner.rx.progress(&mut inner.stats, &mut inner.errors)?;
            let udp = inner.rx.net.as_mut().expect("checked above");
            if udp.data_frames() != last_rx.0 {
                last_rx = (udp.data_frames(), Instant::now());
            }
            let pending = udp.unacknowledged();
            Ok((!pending && last_rx.1.elapsed() >= QUIET).then_some(()))
        })?;
        // A channel that failed while flushing says so.
        let inner = self.inner.borrow();
        match inner.rx.net.as_ref().and_then(|u| u.failed_channel()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Number of tokens kept with [`Message::hold`] and not yet released.
    pub fn held(&self) -> usize {
        self.inner.borrow().held.len()
    }

    /// The endpoint's counters.
    pub fn stats(&self) -> EndpointStats {
        let inner = self.inner.borrow();
        let mut st = inner.stats.clone();
        if let Some(udp) = &inner.rx.net {
            udp.add_counters(&mut st);
        }
        if let Some(off) = &inner.rx.offload {
            st = off.stats(&st);
        }
        st
    }

    /// Closes the endpoint: its receive area is removed and later writes to it fail.
    pub fn close(self) {}

    /// Registers a callback that runs on every error this endpoint delivers (from
    /// `read`, `try_read`, `progress`...), before the call returns it: channel failures,
    /// lost frames, failed peers. It runs on the caller's thread and must not use this
    /// endpoint.
    pub fn set_error_handler(&self, handler: impl FnMut(&Error) + 'static) {
        *self.error_handler.borrow_mut() = Some(Box::new(handler));
    }

    /// Ranks this endpoint has found failed ([`Error::PeerFailed`] was reported for
    /// them): every operation towards them fails. Ascending.
    pub fn failed_ranks(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.inner.borrow().failed.iter().copied().collect();
        v.sort_unstable();
        v
    }

    fn report(&self, e: Error) -> Error {
        if let Error::PeerFailed { rank, .. } = &e {
            if let Ok(mut inner) = self.inner.try_borrow_mut() {
                inner.failed.insert(*rank);
            }
        }
        if let Ok(mut h) = self.error_handler.try_borrow_mut() {
            if let Some(h) = h.as_mut() {
                h(&e);
            }
        }
        e
    }

    /// Checks, at most every [`LIVENESS_PERIOD`], that the processes of same-node peers
    /// (senders to this endpoint, endpoints it targets) live; a dead one is reported once
    /// as [`Error::PeerFailed`] and every later operation towards it fails.
    fn check_liveness(&self, inner: &mut Inner) {
        let now = Instant::now();
        if now.duration_since(inner.liveness_at) < LIVENESS_PERIOD {
            return;
        }
        inner.liveness_at = now;
        inner.liveness_due = false;
        for (src, reason) in route::dead_peers(inner.rx.shm.as_mut(), &inner.routes) {
            if inner.failed.insert(src.rank) {
                inner.errors.push_back(Error::PeerFailed {
                    rank: src.rank,
                    dpid: src.dpid,
                    reason,
                });
            }
        }
    }

    pub(crate) fn hold_token(&self, t: Token) {
        self.inner.borrow_mut().held.push_back(t);
    }

    #[inline]
    pub(crate) fn release_token(&self, t: Token) {
        self.inner.borrow_mut().rx.release(t);
    }

    fn poll_once(&self) -> Result<Option<Message<'_>>> {
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        // Checked before popping: building and dropping an empty Option<Error> costs more
        // than the check on this path.
        if !inner.errors.is_empty() {
            if let Some(e) = inner.errors.pop_front() {
                drop(guard);
                return Err(self.report(e));
            }
        }
        // The shared-memory fast path, inline (as on the write side).
        if let Some(shm) = inner.rx.shm.as_mut() {
            if let Some(r) = shm.poll() {
                inner.stats.msgs_received += 1;
                inner.stats.bytes_received += r.len as u64;
                return Ok(Some(Message {
                    ep: self,
                    ptr: r.ptr,
                    len: r.len,
                    source: r.source,
                    token: Some(Token::Shm {
                        chan: r.chan,
                        token: r.token,
                    }),
                }));
            }
            inner.stats.corrupt_rings = shm.corrupt;
        }
        match inner.rx.poll_network(&mut inner.stats, &mut inner.errors)? {
            Polled::Message(r) => {
                inner.stats.msgs_received += 1;
                inner.stats.bytes_received += r.len as u64;
                Ok(Some(Message {
                    ep: self,
                    ptr: r.ptr,
                    len: r.len,
                    source: r.source,
                    token: Some(r.token),
                }))
            }
            Polled::Errors => {
                let e = inner.errors.pop_front();
                drop(guard);
                match e {
                    Some(e) => Err(self.report(e)),
                    None => Ok(None),
                }
            }
            Polled::Nothing => {
                inner.empty_polls = inner.empty_polls.wrapping_add(1);
                if inner.liveness_due || inner.empty_polls.is_multiple_of(1024) {
                    self.check_liveness(inner);
                    if let Some(e) = inner.errors.pop_front() {
                        drop(guard);
                        return Err(self.report(e));
                    }
                }
                Ok(None)
            }
        }
    }
}

/// `head` then `data` as one slice: `data` itself when there is no head, else both
/// copied into `buf` (the network paths take one contiguous message).
fn contiguous<'a>(head: &[u8], data: &'a [u8], buf: &'a mut Vec<u8>) -> &'a [u8] {
    if head.is_empty() {
        return data;
    }
    buf.extend_from_slice(head);
    buf.extend_from_slice(data);
    buf
}

impl AsRawFd for Endpoint {
    /// The endpoint's descriptor: readable when messages have arrived. After it signals,
    /// call [`Endpoint::try_read`] until it returns `None`. Handing the descriptor out
    /// makes senders on shared memory ring the doorbell for every batch of messages.
    fn as_raw_fd(&self) -> RawFd {
        if !self.fd_exported.replace(true) {
            let inner = self.inner.borrow();
            inner.arm_wakeups();
            inner.reset_doorbells();
        }
        self.poller.as_raw_fd()
    }
}

/// How long [`Endpoint::flush`] keeps answering after the last frame arrived: several
/// minimum retransmission timeouts, so a peer that lost our last acknowledgement can
/// still retransmit and be answered.
const QUIET: Duration = Duration::from_millis(20);

/// How long a closing endpoint waits for its last network frames to be acknowledged.
const LINGER: Duration = Duration::from_secs(2);

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Linger: what was written should arrive even if the process exits right after.
        if self.inner.borrow().rx.net.is_some() {
            let linger = LINGER.min(self.job.config.connect_timeout);
            if let Err(e) = self.flush_within(linger) {
                tracing::debug!("closing endpoint DPID {}: {e}", self.dpid);
            }
            if let Some(udp) = self.inner.borrow_mut().rx.net.as_mut() {
                udp.say_goodbye();
            }
        }
        if let Some(off) = self.inner.borrow_mut().rx.offload.as_mut() {
            off.close(LINGER.min(self.job.config.connect_timeout));
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            tracing::debug!(
                "closing endpoint rank {} DPID {}: {:?}",
                self.job.rank,
                self.dpid,
                self.stats()
            );
        }
        self.job.close_dpid(self.dpid);
    }
}

impl Inner {
    /// From now on, senders (shared-memory peers, the offload engine) ring the doorbell.
    fn arm_wakeups(&self) {
        if let Some(shm) = &self.rx.shm {
            shm.arm();
        }
        if let Some(off) = &self.rx.offload {
            off.arm();
        }
    }

    /// Back to polling: senders stop ringing.
    fn disarm_wakeups(&self) {
        if let Some(shm) = &self.rx.shm {
            shm.disarm();
        }
        if let Some(off) = &self.rx.offload {
            off.disarm();
        }
    }

    /// Drains the doorbells and re-enables them (a re-check of the queues must follow).
    fn reset_doorbells(&self) {
        if let Some(shm) = &self.rx.shm {
            shm.reset_doorbell();
        }
        if let Some(off) = &self.rx.offload {
            off.reset_doorbell();
        }
    }

    /// Whether something waits to be read without a network round.
    fn has_ready(&self) -> bool {
        !self.rx.ready.is_empty()
            || !self.errors.is_empty()
            || self.rx.shm.as_ref().is_some_and(|s| s.has_data())
            || self.rx.offload.as_ref().is_some_and(|o| o.has_news())
    }
}

/// Adapter between the endpoint and the wait policy.
struct ReadWait<'a>(&'a Endpoint);

impl<'a> Waitable for ReadWait<'a> {
    type Output = Message<'a>;

    fn poll_once(&self) -> Result<Option<Message<'a>>> {
        self.0.poll_once()
    }

    fn arm(&self) {
        {
            let inner = self.0.inner.borrow();
            inner.arm_wakeups();
            inner.reset_doorbells();
        }
        // Sleeping is about to happen: poll the UDP socket on the next attempt.
        let mut inner = self.0.inner.borrow_mut();
        inner.rx.poll_net_next();
    }

    fn disarm(&self) {
        if !self.0.fd_exported.get() {
            self.0.inner.borrow().disarm_wakeups();
        }
    }

    fn sleep(&self, timeout: Option<Duration>) -> Result<()> {
        if self.0.inner.borrow().has_ready() {
            return Ok(());
        }
        self.0.sleep_on_descriptor(timeout)
    }
}

/// Waiting in `write` for the credits of network channel `peer` (its window is closed):
/// each attempt makes protocol progress; sleeping is on the endpoint's descriptor, where
/// the acknowledgement that brings credits arrives.
struct CreditWait<'a> {
    ep: &'a Endpoint,
    peer: usize,
}

impl Waitable for CreditWait<'_> {
    type Output = ();

    fn poll_once(&self) -> Result<Option<()>> {
        let mut guard = self.ep.inner.borrow_mut();
        let inner = &mut *guard;
        inner.rx.progress(&mut inner.stats, &mut inner.errors)?;
        let udp = inner
            .rx
            .net
            .as_ref()
            .expect("a network channel implies a link");
        if !udp.is_blocked(self.peer) {
            return Ok(Some(()));
        }
        let p = udp.peer_at(self.peer);
        if p.closed {
            // It said goodbye: the credits it owes will never come.
            return Err(Error::PeerClosed {
                rank: p.source.rank,
                dpid: p.source.dpid,
            });
        }
        let failed = inner.errors.iter().position(|e| {
            matches!(e, Error::ChannelFailed { rank, dpid, .. } | Error::PeerFailed { rank, dpid, .. }
                if *rank == p.source.rank && *dpid == p.source.dpid)
        });
        match failed.and_then(|i| inner.errors.remove(i)) {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    fn arm(&self) {
        ReadWait(self.ep).arm();
    }

    fn disarm(&self) {
        ReadWait(self.ep).disarm();
    }

    fn sleep(&self, timeout: Option<Duration>) -> Result<()> {
        // Messages waiting to be read do not end this wait: only credits do.
        self.ep.sleep_on_descriptor(timeout)
    }
}

impl Endpoint {
    /// Sleeps on the endpoint's descriptor until something arrives, `timeout` passes, a
    /// protocol timer is due (retransmission, acknowledgement, probe) or it is time to
    /// check that same-node peers live.
    fn sleep_on_descriptor(&self, timeout: Option<Duration>) -> Result<()> {
        let (protocol, watching) = {
            let inner = self.inner.borrow();
            let watching = inner.rx.shm.as_ref().is_some_and(|s| s.has_senders())
                || inner.routes.iter().any(|(_, c)| matches!(c, Route::Shm(_)));
            (
                inner.rx.net.as_ref().and_then(|u| u.time_to_deadline()),
                watching,
            )
        };
        let liveness = watching.then_some(LIVENESS_PERIOD);
        let timeout = [timeout, protocol, liveness].into_iter().flatten().min();
        let r = self.poller.wait(timeout);
        self.inner.borrow_mut().liveness_due = watching;
        r
    }
}

/// [`ReadWait`] with work of the caller's on every empty poll.
struct ReadOrIdle<'a, 'f> {
    read: ReadWait<'a>,
    idle: &'f dyn Fn() -> bool,
}

impl<'a> Waitable for ReadOrIdle<'a, '_> {
    type Output = Option<Message<'a>>;

    fn poll_once(&self) -> Result<Option<Option<Message<'a>>>> {
        if let Some(m) = self.read.poll_once()? {
            return Ok(Some(Some(m)));
        }
        Ok((self.idle)().then_some(None))
    }

    fn arm(&self) {
        self.read.arm();
    }

    fn disarm(&self) {
        self.read.disarm();
    }

    fn sleep(&self, timeout: Option<Duration>) -> Result<()> {
        self.read.sleep(timeout)
    }
}
