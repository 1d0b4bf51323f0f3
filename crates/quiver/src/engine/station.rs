//! One endpoint's station on the engine: what a personality's endpoint stands on below its
//! API. A [`Station`] owns the endpoint's routes to its destinations and its receive side
//! ([`Receivers`]: shared memory, the driver or the offload engine), its counters, the
//! errors waiting to be reported and the ranks found failed, the liveness watch over
//! same-node peers, the descriptor a caller may wait on, and how blocking calls wait.
//!
//! It sends a whole message on a route (waiting for room or credits when asked), polls
//! every receiver in a fixed order, releases tokens, flushes the network side, and on
//! drop lingers until what was written is acknowledged. The personality above decides
//! what a message means: `dm::Endpoint` wraps each [`Received`] in a `Message` and keeps
//! the current target; errors go up as values and the personality reports them.
//!
//! Guarantees: a received message's bytes stay in place until its token comes back to
//! [`Station::release_token`]; an operation towards a rank found failed fails; nothing
//! here waits without a bound except where the wait mode says so.

use super::clock::{Clock, ProtocolClock};
use super::driver::{self, Driver, Pace};
use super::offload::Offload;
use super::protocol::{Disposition, Outbox, Protocol};
use super::route::{self, Polled, Received, Receivers, Route, Token};
use super::stats::EndpointStats;
use super::{backoff_until, Poller, Waitable, Waiter};
use crate::addr::Source;
use crate::channel::reliable::Time;
use crate::config::ReliabilityMode as Mode;
use crate::config::TransportChoice;
use crate::error::{Error, Result};
use crate::job::JobShared;
use crate::link::network::NetLink;
use crate::link::shm::{ShmRx, ShmTx};
use crate::link::{Link, Transport};
use crate::FastMap;
use std::cell::{Cell, RefCell};
use std::collections::{HashSet, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a waiting endpoint checks that the processes of its same-node peers live.
const LIVENESS_PERIOD: Duration = Duration::from_millis(100);

/// How long [`Station::flush_within`] keeps answering after the last frame arrived:
/// several minimum retransmission timeouts, so a peer that lost our last acknowledgement
/// can still retransmit and be answered.
const QUIET: Duration = Duration::from_millis(20);

/// How long a closing endpoint waits for its last network frames to be acknowledged.
const LINGER: Duration = Duration::from_secs(2);

/// One endpoint's station on the engine (module documentation). Generic over the
/// driver's link and clock like the driver, so that the simulator runs whole stations;
/// endpoints use the defaults.
pub(crate) struct Station<L: Link = NetLink, C: Clock = ProtocolClock> {
    job: Arc<JobShared>,
    dpid: u16,
    inner: RefCell<Inner<L, C>>,
    poller: Poller,
    waiter: Waiter,
    fd_exported: Cell<bool>,
    /// The transport of this endpoint's network link (UDP where it has none).
    net_transport: Transport,
    /// The time a protocol driven here is told ([`Station::drive`]).
    clock: C,
}

struct Inner<L: Link, C: Clock> {
    /// The receive side: shared memory, the driver or the offload engine.
    rx: Receivers<L, C>,
    routes: Vec<(Source, Route)>,
    route_index: FastMap<Source, usize>,
    /// Tokens of messages the application keeps (`Message::hold`), oldest first.
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

/// What a personality's protocol stands on: a station, and where the errors met on the
/// way go (a `dm::Endpoint` passes them through its error handler and remembers failed
/// ranks; a bare station, as in the simulator, returns them as they are).
pub(crate) trait Footing {
    /// The station's link.
    type L: Link;
    /// The station's clock.
    type C: Clock;
    /// The station.
    fn station(&self) -> &Station<Self::L, Self::C>;
    /// An error on its way to the caller.
    fn report(&self, e: Error) -> Error {
        e
    }
}

impl<L: Link, C: Clock> Footing for Station<L, C> {
    type L = L;
    type C = C;

    fn station(&self) -> &Station<L, C> {
        self
    }
}

impl Station {
    /// Opens endpoint `dpid`'s receive side (a shared-memory area, and the network link
    /// with its driver or the offload engine where the job spans nodes or asks for UDP)
    /// and makes the endpoint resolvable by (NID, DPID).
    pub(crate) fn open(job: Arc<JobShared>, dpid: u16) -> Result<Station> {
        Station::open_with(job, dpid, None)
    }

    /// Like [`Station::open`], with `service` served on the offload engine's thread:
    /// every message that arrives over the network is handed to it there, and it
    /// answers from there, while the application computes; what it leaves for delivery
    /// (and what same-node peers send over shared memory) reaches this station's
    /// readers as usual. Needs the offload engine (`QUIVER_RELIABILITY=offload`) and a
    /// network side (`QUIVER_TRANSPORT=udp`, or a job across nodes): else
    /// [`Error::Config`].
    // GAMMA's ports serve their handlers with it (RMA's target side is next); the tests
    // serve a counter.
    pub(crate) fn open_serving(
        job: Arc<JobShared>,
        dpid: u16,
        service: super::offload::Service,
    ) -> Result<Station> {
        Station::open_with(job, dpid, Some(service))
    }

    /// Whether `job`'s endpoints can serve a protocol on the offload engine's thread: the
    /// engine runs (`QUIVER_RELIABILITY=offload`) and they have a network side.
    pub(crate) fn can_serve(job: &JobShared) -> bool {
        Station::needs_network(job) && job.config.reliability == Mode::Offload
    }

    /// Whether `job`'s endpoints have a network side (UDP asked for, or the job spans
    /// nodes).
    fn needs_network(job: &JobShared) -> bool {
        job.config.transport == TransportChoice::Udp || job.node_count() > 1
    }

    fn open_with(
        job: Arc<JobShared>,
        dpid: u16,
        service: Option<super::offload::Service>,
    ) -> Result<Station> {
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
        let needs_udp = Station::needs_network(&job);
        let offloaded = cfg.reliability == Mode::Offload;
        if service.is_some() && !(needs_udp && offloaded) {
            return Err(Error::Config(
                "a protocol served on the offload engine needs QUIVER_RELIABILITY=offload \
                 and a network side (QUIVER_TRANSPORT=udp, or a job across nodes)"
                    .into(),
            ));
        }
        let udp = if needs_udp && !offloaded {
            Some(Driver::open(job.clone(), dpid)?)
        } else {
            None
        };
        let offload = if needs_udp && offloaded {
            Some(Offload::start(job.clone(), dpid, service)?)
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
            if let Some(fd) = u.second_fd() {
                poller.add(fd)?;
            }
        }
        if let Some(o) = &offload {
            poller.add(o.bell_fd())?;
        }
        // Make (NID, DPID) resolvable; the first rank of a node to open a DPID owns the name.
        let nid = job.nids[me as usize];
        job.kv
            .put_if_absent(&format!("dp/{nid}/{dpid}"), &me.to_string())?;
        let rx = Receivers::new(shm, udp, offload);
        Ok(Station::assemble(
            job,
            dpid,
            rx,
            poller,
            net_transport,
            ProtocolClock::new(),
        ))
    }
}

impl<L: Link, C: Clock> Station<L, C> {
    /// A station whose only receiver and route is `driver` (no shared memory, no
    /// offload engine): the simulator's, whose links have no descriptor to sleep on.
    #[cfg(test)]
    pub(crate) fn with_driver(
        job: Arc<JobShared>,
        dpid: u16,
        driver: Driver<L, C>,
        clock: C,
    ) -> Result<Self> {
        let rx = Receivers::new(None, Some(driver), None);
        Ok(Station::assemble(
            job,
            dpid,
            rx,
            Poller::new()?,
            Transport::Udp,
            clock,
        ))
    }

    /// A station over receivers `rx`, waited on through `poller`.
    fn assemble(
        job: Arc<JobShared>,
        dpid: u16,
        rx: Receivers<L, C>,
        poller: Poller,
        net_transport: Transport,
        clock: C,
    ) -> Self {
        // The ranks sharing this machine: this node's, or every rank of an emulated
        // cluster (its nodes are namespaces of one machine).
        let me = job.nids[job.rank as usize];
        let local = if job.config.cluster.is_some() {
            job.nids.len()
        } else {
            job.nids.iter().filter(|&&n| n == me).count()
        };
        Station {
            waiter: Waiter {
                mode: job.config.wait,
                yields: super::wait::oversubscribed(local),
            },
            job,
            dpid,
            inner: RefCell::new(Inner {
                rx,
                routes: Vec::new(),
                route_index: FastMap::default(),
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
            clock,
        }
    }

    /// The job this endpoint belongs to.
    #[inline]
    pub(crate) fn job(&self) -> &Arc<JobShared> {
        &self.job
    }

    /// This endpoint's DPID.
    #[inline]
    pub(crate) fn dpid(&self) -> u16 {
        self.dpid
    }

    /// The transport used towards `rank`.
    pub(crate) fn transport_to(&self, rank: u32) -> Result<Transport> {
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

    /// The index of the route to endpoint `peer`, connecting first if there is none
    /// (waiting up to `QUIVER_CONNECT_TIMEOUT` for the peer to open it).
    /// A rank of the job only: [`Source::group`] is no rank (`NoSuchRank`), whatever
    /// a caller passes; the engine's own callers reach the group through
    /// [`route_to`](Self::route_to).
    pub(crate) fn connect(&self, peer: Source) -> Result<usize> {
        if let Some(&i) = self
            .inner
            .borrow()
            .route_index
            .get(&peer)
            .filter(|_| !peer.is_group())
        {
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

    /// The route to `to` for a protocol's own messages: [`connect`](Self::connect), or
    /// for [`Source::group`] (which only a protocol names, never a caller's rank) the
    /// group's route, an error where the link has no broadcast.
    pub(crate) fn route_to(&self, to: Source) -> Result<usize> {
        if !to.is_group() {
            return self.connect(to);
        }
        self.connect_group()?
            .ok_or_else(|| Error::Config("a broadcast through a network link that has none".into()))
    }

    /// The route to every endpoint of this DPID reached over the network at once,
    /// through the link's broadcast (the engine's group channel, [`super::group`]),
    /// opened on first use: waits for each of them to publish its link, as
    /// [`connect`](Self::connect) does. `None` when the link has no broadcast or no
    /// rank is reached over the network: then a broadcast goes as unicasts.
    pub(crate) fn connect_group(&self) -> Result<Option<usize>> {
        let group = Source::group(self.dpid);
        if let Some(&i) = self.inner.borrow().route_index.get(&group) {
            return Ok(Some(i));
        }
        let (offload, can) = {
            let inner = self.inner.borrow();
            match (&inner.rx.offload, &inner.rx.net) {
                (Some(off), _) => (true, off.can_broadcast()),
                (None, Some(net)) => (false, net.can_broadcast()),
                (None, None) => (false, false),
            }
        };
        if !can {
            return Ok(None);
        }
        let route = if offload {
            // The engine opens the channel without waiting: every member has published.
            for rank in 0..self.job.size {
                if rank != self.job.rank && self.transport_to(rank)? != Transport::Shm {
                    self.await_net_peer(Source {
                        rank,
                        dpid: self.dpid,
                    })?;
                }
            }
            let mut inner = self.inner.borrow_mut();
            let off = inner.rx.offload.as_mut().expect("checked above");
            off.connect(group, self.waiter.mode)?;
            Route::Offload
        } else {
            let mut guard = self.inner.borrow_mut();
            let net = guard.rx.net.as_mut().expect("checked above");
            Route::Net {
                peer: net.peer(group, true)?,
            }
        };
        let mut inner = self.inner.borrow_mut();
        let i = inner.routes.len();
        inner.routes.push((group, route));
        inner.route_index.insert(group, i);
        Ok(Some(i))
    }

    /// The ranks a broadcast through [`connect_group`](Self::connect_group)'s route
    /// does not reach, which the caller must reach by unicast: this node's (over shared
    /// memory) and those whose link joined no group. Call after `connect_group`.
    pub(crate) fn group_unreached(&self) -> Result<Vec<u32>> {
        let mut unreached = Vec::new();
        for rank in (0..self.job.size).filter(|&r| r != self.job.rank) {
            let peer = Source {
                rank,
                dpid: self.dpid,
            };
            if self.transport_to(rank)? == Transport::Shm || !driver::hears_group(&self.job, peer)?
            {
                unreached.push(rank);
            }
        }
        Ok(unreached)
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
}

/// Sending.
impl<L: Link, C: Clock> Station<L, C> {
    /// The common case of a send, inline in the personality's write: `head` then `data`
    /// to route `route` when it is a shared-memory ring with room, no rank has failed,
    /// and the message fits. False, having sent nothing, for everything else (then
    /// [`Station::send`]).
    #[inline(always)]
    pub(crate) fn try_send_inline(&self, route: usize, head: &[u8], data: &[u8]) -> bool {
        if let Ok(mut guard) = self.inner.try_borrow_mut() {
            let inner = &mut *guard;
            if inner.failed.is_empty() {
                if let Some((_, Route::Shm(tx))) = inner.routes.get_mut(route) {
                    let len = head.len() + data.len();
                    if len <= tx.max_message()
                        && len <= self.job.config.max_message
                        && matches!(tx.try_send_parts(head, data), Ok(true))
                    {
                        inner.count_sent(len);
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Whether `route` is a network channel of this process's own (not shared memory,
    /// a group or the offload engine's).
    pub(crate) fn is_network_channel(&self, route: usize) -> bool {
        matches!(
            self.inner.borrow().routes.get(route),
            Some((_, Route::Net { .. }))
        )
    }

    /// The longest message that reaches `route`'s peer in one frame of its network
    /// channel (a protocol that cuts its data into such pieces has each piece handed
    /// to the peer's protocol where its frame lies, with no reassembly copy); `None`
    /// for a route that is not a network channel (shared memory, a group), or one of
    /// the offload engine's that the engine has not set up within the connect timeout
    /// (or while it reports an error).
    pub(crate) fn frame_payload(&self, route: usize) -> Option<usize> {
        let inner = self.inner.borrow();
        match inner.routes.get(route) {
            Some((_, Route::Net { peer })) => inner.rx.net.as_ref().map(|n| n.lone_max(*peer)),
            Some((dest, Route::Offload)) if !dest.is_group() => {
                inner.rx.offload.as_ref().and_then(|off| {
                    off.frame_payload(*dest, self.waiter.mode, self.job.config.connect_timeout)
                })
            }
            _ => None,
        }
    }

    /// Sends `messages` (each a header and a body, each fitting one frame of a network
    /// route: [`Station::frame_payload`]) on route `route`, in order; on a network route
    /// they are handed to the link together and never wait (what the window does not
    /// take goes as credits return: check [`Station::send_backlogged`] between batches),
    /// on any other one by one as [`Station::send`] does, waiting for room (the offload
    /// engine's command ring: a caller that must not wait checks
    /// [`Station::send_backlogged`] first; the engine empties it unless a peer's window
    /// stays closed, which the peer's engine reopens without its application when the
    /// messages are a served protocol's, as ports' and RMA's are; a caller batches only
    /// on routes with a frame payload).
    pub(crate) fn send_batch(&self, route: usize, messages: &[(&[u8], &[u8])]) -> Result<()> {
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        let peer = match inner.routes.get(route) {
            Some((dest, Route::Net { peer })) => {
                inner.check_not_failed(dest)?;
                *peer
            }
            _ => {
                drop(guard);
                for &(head, body) in messages {
                    self.send(route, head, body, true)?;
                }
                return Ok(());
            }
        };
        let (net, stats) = inner.driver();
        net.send_batch(peer, messages, stats)?;
        for (head, body) in messages {
            inner.count_sent(head.len() + body.len());
        }
        Ok(())
    }

    /// Whether a writer that does not wait ([`Station::send`] with `wait` false) has a
    /// window's worth of frames queued on network route `route` already, waiting for
    /// credits: it should make progress before it queues more (so that its queue, and
    /// the bursts it sends when credits come back, stay one window long, as a waiting
    /// writer's do); on an offload route, whether the engine's command ring lacks room
    /// for a batch of pieces of one message ([`Station::send_batch`] would wait for it).
    /// False for every other route.
    pub(crate) fn send_backlogged(&self, route: usize) -> bool {
        let inner = self.inner.borrow();
        match inner.routes.get(route) {
            Some((_, Route::Net { peer })) => inner.rx.net.as_ref().is_some_and(|n| {
                let (waiting, window) = n.waiting_frames(*peer);
                waiting >= window
            }),
            Some((_, Route::Offload)) => inner
                .rx
                .offload
                .as_ref()
                .is_some_and(|off| !off.has_room_for_a_message()),
            _ => false,
        }
    }

    /// Whether this node runs more of the job's ranks than this process has cores (its
    /// waits yield the core between polls).
    pub(crate) fn oversubscribed(&self) -> bool {
        self.waiter.yields
    }

    /// Wakes the receiver at the end of shared-memory route `route` if it sleeps on its
    /// descriptor, without sending anything (after a write straight into its memory
    /// that it may be waiting for). Nothing for other routes: their messages wake.
    pub(crate) fn wake(&self, route: usize) {
        if let Ok(inner) = self.inner.try_borrow() {
            if let Some((_, Route::Shm(tx))) = inner.routes.get(route) {
                tx.wake();
            }
        }
    }

    /// Whether everything sent on shared-memory route `route` was read and released by
    /// its receiver (as far as it has told: it publishes its position lazily, so this
    /// may say false for a while after). False for every other route.
    pub(crate) fn route_drained(&self, route: usize) -> bool {
        match self.inner.try_borrow() {
            Ok(inner) => {
                matches!(inner.routes.get(route), Some((_, Route::Shm(tx))) if tx.drained())
            }
            Err(_) => false,
        }
    }

    /// Sends `head` followed by `data` as one message on route `route`, on every
    /// transport; with `wait` false, returns false instead of waiting for room (a full
    /// shared-memory ring or offload command ring; over the network the message is
    /// accepted even when the window is closed and waits in the channel for credits).
    #[cold]
    #[inline(never)]
    pub(crate) fn send(&self, route: usize, head: &[u8], data: &[u8], wait: bool) -> Result<bool> {
        self.check_len(head.len() + data.len())?;
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        if !inner.failed.is_empty() {
            let peer = inner.routes[route].0;
            inner.check_not_failed(&peer)?;
        }
        let (dest, how) = &mut inner.routes[route];
        match how {
            Route::Offload => {
                let off = inner.rx.offload.as_mut().expect("an offload connection");
                if !wait {
                    if !off.try_send(*dest, (head, data))? {
                        return Ok(false);
                    }
                } else if off.send(*dest, (head, data), self.waiter.mode)? {
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
                self.send_net(peer, head, data, wait)?;
                return Ok(true);
            }
        }
        inner.count_sent(head.len() + data.len());
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
    fn send_net(&self, peer: usize, head: &[u8], data: &[u8], wait: bool) -> Result<()> {
        {
            // The common case, a message of one frame the window lets out now, in one step.
            let mut inner = self.inner.borrow_mut();
            let (net, stats) = inner.driver();
            if net.write_lone(peer, head, data, stats)? {
                inner.count_sent(head.len() + data.len());
                return Ok(());
            }
        }
        let mut part = self
            .inner
            .borrow_mut()
            .driver()
            .0
            .begin_send(peer, head.len() + data.len())?;
        let pace = if wait { Pace::Window } else { Pace::Unbounded };
        let mut stalled = false;
        loop {
            let (queued, must_wait) = {
                let mut inner = self.inner.borrow_mut();
                let (net, stats) = inner.driver();
                let step = net.send_part(peer, (head, data), &mut part, pace, stats)?;
                if step.must_wait && !stalled {
                    stalled = true;
                    stats.send_stalls += 1;
                }
                (step.queued, step.must_wait)
            };
            if must_wait {
                // The window is closed: make progress until it opens. Waits per the wait
                // mode, sleeping on the endpoint's descriptor, where the acknowledgement
                // that brings credits wakes it (a blind sleep let a 1 Gbit/s link idle).
                self.waiter.wait(&CreditWait { at: self, peer }, None)?;
            }
            if queued {
                break;
            }
        }
        self.inner.borrow_mut().count_sent(head.len() + data.len());
        Ok(())
    }
}

/// What [`Station::queue_net`] did with a message.
enum NetQueue {
    /// Queued for this network peer, to be sent with the flush's other frames to it.
    Queued(usize),
    /// Not queued: a window's worth of frames already waits for this peer's window.
    Backlogged(usize),
    /// Not a network route: sent the ordinary way.
    NotNetwork,
}

/// Receiving, releasing and progress.
impl<L: Link, C: Clock> Station<L, C> {
    /// The next received message, if one is waiting, or the next error to report (as
    /// `Err`). Never blocks. Shared memory is polled inline (the fast path, as on the
    /// write side), then the network side.
    #[cfg(test)] // the personalities poll with `poll_into` or `drive`
    pub(crate) fn poll(&self) -> Result<Option<Received>> {
        self.poll_into(|r| r, |e| e)
    }

    /// [`Station::poll`], with the message made into what the personality hands out
    /// (`make`) where it is found: one copy of this function per personality, each
    /// building its value in place (a `Received` returned and then rebuilt into a
    /// `dm::Message` cost a shared-memory read 48 more instructions). An error the
    /// endpoint delivers (a channel's, a failed peer's) goes through `report` (the
    /// personality's error handler) once the station is free again; an error of the
    /// link's own calls is returned as it is.
    #[inline]
    pub(crate) fn poll_into<T>(
        &self,
        make: impl FnOnce(Received) -> T,
        report: impl FnOnce(Error) -> Error,
    ) -> Result<Option<T>> {
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        // Checked before popping: building and dropping an empty Option<Error> costs more
        // than the check on this path.
        if !inner.errors.is_empty() {
            if let Some(e) = inner.errors.pop_front() {
                drop(guard);
                return Err(report(e));
            }
        }
        if let Some(shm) = inner.rx.shm.as_mut() {
            if let Some(r) = shm.poll() {
                inner.stats.msgs_received += 1;
                inner.stats.bytes_received += r.len as u64;
                return Ok(Some(make(Received {
                    ptr: r.ptr,
                    len: r.len,
                    source: r.source,
                    token: Token::Shm {
                        chan: r.chan,
                        token: r.token,
                    },
                })));
            }
            inner.stats.corrupt_rings = shm.corrupt;
        }
        let queued = match inner.rx.poll_network(&mut inner.stats, &mut inner.errors)? {
            Polled::Message(r) => {
                inner.stats.msgs_received += 1;
                inner.stats.bytes_received += r.len as u64;
                return Ok(Some(make(r)));
            }
            Polled::Errors => inner.errors.pop_front(),
            Polled::Nothing => {
                inner.empty_polls = inner.empty_polls.wrapping_add(1);
                if inner.liveness_due || inner.empty_polls.is_multiple_of(1024) {
                    self.check_liveness(inner);
                    inner.errors.pop_front()
                } else {
                    None
                }
            }
        };
        drop(guard);
        match queued {
            Some(e) => Err(report(e)),
            None => Ok(None),
        }
    }

    /// For a caller that found nothing: if the descriptor was handed out, drains and
    /// re-enables the doorbells for the next message, and says to look once more (true:
    /// a sender may have published before the reset).
    #[inline]
    pub(crate) fn rearm_doorbells(&self) -> bool {
        if self.fd_exported.get() {
            self.inner.borrow().reset_doorbells();
            return true;
        }
        false
    }

    /// Waits per the wait mode (`QUIVER_WAIT`), at most `timeout`, until `poll` returns
    /// something: `poll` is the personality's own poll over [`Station::poll`] (or with
    /// work of its own on empty polls); sleeping is on the endpoint's descriptor, woken
    /// by what arrives, a protocol timer or the liveness watch.
    pub(crate) fn wait_for<T>(
        &self,
        poll: impl Fn() -> Result<Option<T>>,
        timeout: Option<Duration>,
    ) -> Result<T> {
        self.waiter.wait(&ReadWait { at: self, poll }, timeout)
    }

    /// [`Station::wait_for`] with wait mode `mode` instead of the endpoint's (GAMMA's
    /// ports poll for their own time before they sleep).
    pub(crate) fn wait_for_in<T>(
        &self,
        mode: crate::config::WaitMode,
        poll: impl Fn() -> Result<Option<T>>,
        timeout: Option<Duration>,
    ) -> Result<T> {
        let yields = self.waiter.yields;
        Waiter { mode, yields }.wait(&ReadWait { at: self, poll }, timeout)
    }

    /// The protocol hook, where progress runs ([`super::protocol`]): fires `protocol`'s
    /// timeout when it is due, hands it the messages waiting for this endpoint (each
    /// one it consumes released at once) while its outbox has room, and sends what `out`
    /// holds as far as the routes take it without waiting. Returns the first message the
    /// protocol leaves for delivery, or `None` once nothing waits (or the outbox is
    /// full, or the protocol wants no more for now: the rest waits for a later call).
    /// Errors as [`Station::poll_into`] reports
    /// them, through `report`.
    // Generic, not `dyn`: a personality's handler is called for every message, and a
    // concrete type lets its calls (uses_time, handle_message, wants_more) inline.
    pub(crate) fn drive<P: Protocol + ?Sized>(
        &self,
        protocol: &mut P,
        out: &mut Outbox,
        report: impl Fn(Error) -> Error,
    ) -> Result<Option<Received>> {
        // The clock is read only when something needs the time: a due timeout or a
        // message (an empty poll of a protocol without timers reads none).
        if let Some(at) = protocol.poll_timeout() {
            let now = self.clock.now();
            if at <= now {
                protocol.handle_timeout(now, out);
            }
        }
        if !out.is_empty() {
            self.send_outbox(protocol, out).map_err(&report)?;
        }
        let mut now = None;
        // This node's rings first, by the short path: a batch of small messages (a
        // window) spends most of its time here.
        let (mut consumed, delivered) = self.drive_rings(protocol, out, &report, &mut now)?;
        if delivered.is_some() {
            return Ok(delivered);
        }
        if consumed && !protocol.wants_more() {
            self.settle_rings();
            return Ok(None);
        }
        while !out.is_full() {
            let Some(r) = self.poll_into(|r| r, &report)? else {
                break;
            };
            consumed = true;
            let msg: &[u8] = if r.len == 0 {
                &[]
            } else {
                // SAFETY: a received message's bytes stay in place until its token is
                // released (`route::Received`), which happens after this borrow ends.
                unsafe { std::slice::from_raw_parts(r.ptr, r.len) }
            };
            let now = *now.get_or_insert_with(|| {
                if protocol.uses_time() {
                    self.clock.now()
                } else {
                    Time::ZERO
                }
            });
            match protocol.handle_message(now, r.source, msg, out) {
                Disposition::Consumed => self.release_token(r.token),
                // Its answers leave with the next call's first step.
                Disposition::Deliver => return Ok(Some(r)),
            }
            if !out.is_empty() {
                self.send_outbox(protocol, out).map_err(&report)?;
            }
            if !protocol.wants_more() {
                break;
            }
        }
        if consumed {
            self.settle_rings();
        }
        Ok(None)
    }

    /// A batch that stopped before the ring was found empty: the shared-memory senders
    /// learn how far it got (rings: `publish_if_caught_up`).
    fn settle_rings(&self) {
        if let Some(shm) = self.inner.borrow_mut().rx.shm.as_mut() {
            shm.settle();
        }
    }

    /// [`Station::drive`]'s loop over this node's rings alone: the same steps as the
    /// general loop (errors first, a message handed to `protocol` and released when
    /// consumed, the outbox sent after it, until the protocol wants no more or the
    /// outbox is full), without the general receive path's wrapping of each message.
    /// Stops at the first empty poll (leaving the network to the general loop), at an
    /// error queued for the general loop to report, at a message left for delivery,
    /// when the protocol wants no more, or when the outbox is full. Returns whether it
    /// consumed a message, and the message the protocol left for delivery.
    #[inline(always)]
    fn drive_rings<P: Protocol + ?Sized>(
        &self,
        protocol: &mut P,
        out: &mut Outbox,
        report: &impl Fn(Error) -> Error,
        now: &mut Option<Time>,
    ) -> Result<(bool, Option<Received>)> {
        let (mut count, mut bytes) = (0u64, 0u64);
        let mut delivered = None;
        while !out.is_full() {
            let r = {
                let mut guard = self.inner.borrow_mut();
                let inner = &mut *guard;
                if !inner.errors.is_empty() {
                    // The general loop reports them.
                    break;
                }
                let Some(shm) = inner.rx.shm.as_mut() else {
                    break;
                };
                match shm.poll() {
                    Some(r) => r,
                    None => {
                        // As the general poll does on an empty look at the rings.
                        inner.stats.corrupt_rings = shm.corrupt;
                        break;
                    }
                }
            };
            count += 1;
            bytes += r.len as u64;
            let msg: &[u8] = if r.len == 0 {
                &[]
            } else {
                // SAFETY: a ring's record stays in place until its token is released
                // (`Consumer::release`), which happens after this borrow ends.
                unsafe { std::slice::from_raw_parts(r.ptr, r.len) }
            };
            let at = *now.get_or_insert_with(|| {
                if protocol.uses_time() {
                    self.clock.now()
                } else {
                    Time::ZERO
                }
            });
            match protocol.handle_message(at, r.source, msg, out) {
                Disposition::Consumed => {
                    if let Some(shm) = self.inner.borrow_mut().rx.shm.as_mut() {
                        shm.release(r.chan, r.token);
                    }
                }
                Disposition::Deliver => {
                    delivered = Some(Received {
                        ptr: r.ptr,
                        len: r.len,
                        source: r.source,
                        token: Token::Shm {
                            chan: r.chan,
                            token: r.token,
                        },
                    });
                    break;
                }
            }
            if !out.is_empty() {
                if let Err(e) = self.send_outbox(protocol, out) {
                    self.count_received(count, bytes);
                    return Err(report(e));
                }
            }
            if !protocol.wants_more() {
                break;
            }
        }
        self.count_received(count, bytes);
        Ok((count > 0, delivered))
    }

    /// Counts `count` messages of `bytes` in all received (by [`Station::drive_rings`]).
    #[inline(always)]
    fn count_received(&self, count: u64, bytes: u64) {
        if count > 0 {
            let stats = &mut self.inner.borrow_mut().stats;
            stats.msgs_received += count;
            stats.bytes_received += bytes;
        }
    }

    /// Sends the outbox's items, in order per destination, until a route would make the
    /// sender wait (that destination waits, the others go on). An item that cannot be
    /// sent at all (its peer failed, it is too large, the peer does not exist) is
    /// dropped and the first such error returned, once: the items behind it still go; a
    /// range dropped so is reported to the protocol as not complete. The first message
    /// to a peer connects to it, which waits for the peer to open its endpoint (up to
    /// `QUIVER_CONNECT_TIMEOUT`), as any first write does.
    pub(crate) fn send_outbox<P: Protocol + ?Sized>(
        &self,
        protocol: &mut P,
        out: &mut Outbox,
    ) -> Result<()> {
        let mut first_err = None;
        // Network peers whose messages were queued and wait to be sent together.
        let mut queued: Vec<usize> = Vec::new();
        out.flush(
            protocol,
            |to, head, body| {
                let route = self.route_to(to)?;
                let (peer, taken) = match self.queue_net(route, head, body)? {
                    NetQueue::Queued(peer) => (peer, true),
                    // The rest waits in the outbox for the window to open.
                    NetQueue::Backlogged(peer) => (peer, false),
                    NetQueue::NotNetwork => return self.send(route, head, body, false),
                };
                if !queued.contains(&peer) {
                    queued.push(peer);
                }
                Ok(taken)
            },
            |e| {
                if let Error::PeerFailed { rank, .. } = &e {
                    self.mark_failed(*rank);
                }
                first_err.get_or_insert(e);
            },
        );
        for peer in queued {
            let mut inner = self.inner.borrow_mut();
            let (net, stats) = inner.driver();
            if let Err(e) = net.transmit_queued(peer, stats) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// A message of `len` bytes is no longer than the job's largest.
    fn check_len(&self, len: usize) -> Result<()> {
        let max = self.job.config.max_message;
        if len > max {
            return Err(Error::MessageTooLarge { len, max });
        }
        Ok(())
    }

    /// Queues `head` + `body` whole on `route`'s network channel without sending it yet,
    /// if `route` is a network route ([`Station::send_outbox`] then sends each peer's
    /// frames together, so that an answer of many one-frame pieces leaves as runs, not
    /// frame by frame). A window's worth of frames waiting for the peer's window is sent
    /// at once, and while it still waits nothing more is queued
    /// ([`NetQueue::Backlogged`]): a long range (a pulled message) is built a window
    /// ahead of what the link takes, as a waiting writer's message is
    /// ([`Station::send_net`]), instead of all of it before its first frame leaves. A
    /// peer that said goodbye with a window's worth waiting gets no more
    /// ([`Error::PeerClosed`]: its credits will never come).
    fn queue_net(&self, route: usize, head: &[u8], body: &[u8]) -> Result<NetQueue> {
        self.check_len(head.len() + body.len())?;
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        let peer = match &inner.routes[route] {
            (dest, Route::Net { peer }) => {
                inner.check_not_failed(dest)?;
                *peer
            }
            _ => return Ok(NetQueue::NotNetwork),
        };
        let (net, stats) = inner.driver();
        let (waiting, window) = net.waiting_frames(peer);
        if waiting >= window {
            let p = net.peer_at(peer);
            if p.closed {
                return Err(Error::PeerClosed {
                    rank: p.source.rank,
                    dpid: p.source.dpid,
                });
            }
            // A send error is not this message's: the flush's last transmit to the peer
            // meets it again and reports it.
            let sent = net.transmit_queued(peer, stats).is_ok();
            if !sent || net.waiting_frames(peer).0 >= window {
                return Ok(NetQueue::Backlogged(peer));
            }
        }
        net.queue_parts(peer, head, body)?;
        inner.count_sent(head.len() + body.len());
        Ok(NetQueue::Queued(peer))
    }

    /// Keeps a message's token until [`Station::release_held`].
    pub(crate) fn hold_token(&self, t: Token) {
        self.inner.borrow_mut().held.push_back(t);
    }

    /// Gives a received message's memory back to the receiver it came from.
    #[inline(always)]
    pub(crate) fn release_token(&self, t: Token) {
        self.inner.borrow_mut().rx.release(t);
    }

    /// Releases the `n` oldest held tokens; returns how many were released.
    pub(crate) fn release_held(&self, n: usize) -> usize {
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

    /// Tokens held and not yet released.
    pub(crate) fn held(&self) -> usize {
        self.inner.borrow().held.len()
    }

    /// One round of protocol work without taking a message out (module `dm`: `progress`).
    pub(crate) fn progress(&self) -> Result<()> {
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

    /// How long a caller sleeping on the descriptor itself may sleep before the protocol
    /// needs a round; `None`: no timer is running.
    pub(crate) fn poll_timeout(&self) -> Option<Duration> {
        self.inner
            .borrow()
            .rx
            .net
            .as_ref()
            .and_then(|u| u.time_to_deadline())
    }

    /// Waits, at most `timeout`, until everything sent over the network is acknowledged
    /// (or its receiver closed), sending pending acknowledgements at once; then, unless
    /// the offload engine answers peers meanwhile, until nothing has arrived for a
    /// quiet period.
    pub(crate) fn flush_within(&self, timeout: Duration) -> Result<()> {
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

    /// The endpoint's counters, with the driver's or the offload engine's.
    pub(crate) fn stats(&self) -> EndpointStats {
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

    /// Records that `rank` failed: every later operation towards it fails.
    pub(crate) fn mark_failed(&self, rank: u32) {
        if let Ok(mut inner) = self.inner.try_borrow_mut() {
            inner.failed.insert(rank);
        }
    }

    /// Whether the same-node endpoint `peer`, connected over shared memory, closed its
    /// endpoint or its process is gone (false for any other route, or none).
    pub(crate) fn shm_peer_gone(&self, peer: Source) -> bool {
        let inner = self.inner.borrow();
        match inner.route_index.get(&peer).map(|&i| &inner.routes[i].1) {
            Some(Route::Shm(tx)) => tx.check_peer().is_err(),
            _ => false,
        }
    }

    /// Whether `rank` was found failed (every operation towards it fails).
    pub(crate) fn has_failed(&self, rank: u32) -> bool {
        self.inner.borrow().failed.contains(&rank)
    }

    /// Ranks found failed, ascending.
    pub(crate) fn failed_ranks(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.inner.borrow().failed.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// Checks, at most every [`LIVENESS_PERIOD`], that the processes of same-node peers
    /// (senders to this endpoint, endpoints it targets) live; a dead one is reported once
    /// as [`Error::PeerFailed`] and every later operation towards it fails.
    fn check_liveness(&self, inner: &mut Inner<L, C>) {
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

impl<L: Link, C: Clock> AsRawFd for Station<L, C> {
    /// The endpoint's descriptor: readable when messages have arrived. Handing it out
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

impl<L: Link, C: Clock> Drop for Station<L, C> {
    fn drop(&mut self) {
        // Linger: what was written should arrive even if the process exits right after.
        // A backlog the peer is still taking (it shrank during the last linger period) is
        // waited for while it moves: a non-blocking write queues a whole message, which
        // can take longer than one period; a peer that stops answering fails its channel
        // after QUIVER_PEER_TIMEOUT, which ends the wait.
        if self.inner.borrow().rx.net.is_some() {
            let linger = LINGER.min(self.job.config.connect_timeout);
            let backlog = || {
                self.inner
                    .borrow()
                    .rx
                    .net
                    .as_ref()
                    .map_or(0, |n| n.backlog())
            };
            let mut left = backlog();
            loop {
                match self.flush_within(linger) {
                    Ok(()) => break,
                    Err(Error::Timeout(_)) => {
                        let now = backlog();
                        if now >= left {
                            tracing::debug!(
                                "closing endpoint DPID {}: {now} frames unacknowledged",
                                self.dpid
                            );
                            break;
                        }
                        left = now;
                    }
                    Err(e) => {
                        tracing::debug!("closing endpoint DPID {}: {e}", self.dpid);
                        break;
                    }
                }
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

impl<L: Link, C: Clock> Inner<L, C> {
    /// The driver of a network route, with the counters it adds to.
    fn driver(&mut self) -> (&mut Driver<L, C>, &mut EndpointStats) {
        let net = self
            .rx
            .net
            .as_mut()
            .expect("a network route implies the driver");
        (net, &mut self.stats)
    }

    /// `PeerFailed` when `peer`'s rank was found failed (every operation towards it
    /// fails).
    fn check_not_failed(&self, peer: &Source) -> Result<()> {
        if self.failed.contains(&peer.rank) {
            return Err(Error::PeerFailed {
                rank: peer.rank,
                dpid: peer.dpid,
                reason: "found failed earlier".into(),
            });
        }
        Ok(())
    }

    /// A message of `len` bytes was sent.
    #[inline(always)]
    fn count_sent(&mut self, len: usize) {
        self.stats.msgs_sent += 1;
        self.stats.bytes_sent += len as u64;
    }

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

/// Waiting for what the personality's `poll` returns, between the station and the wait
/// policy: wake-ups are armed before sleeping and disarmed after, unless the descriptor
/// was handed out.
struct ReadWait<'a, F, L: Link, C: Clock> {
    at: &'a Station<L, C>,
    poll: F,
}

impl<T, F: Fn() -> Result<Option<T>>, L: Link, C: Clock> Waitable for ReadWait<'_, F, L, C> {
    type Output = T;

    fn poll_once(&self) -> Result<Option<T>> {
        (self.poll)()
    }

    fn arm(&self) {
        arm(self.at);
    }

    fn disarm(&self) {
        disarm(self.at);
    }

    fn sleep(&self, timeout: Option<Duration>) -> Result<()> {
        if self.at.inner.borrow().has_ready() {
            return Ok(());
        }
        self.at.sleep_on_descriptor(timeout)
    }
}

/// Senders ring from now on, and the next poll looks at the network socket.
fn arm<L: Link, C: Clock>(at: &Station<L, C>) {
    {
        let inner = at.inner.borrow();
        inner.arm_wakeups();
        inner.reset_doorbells();
    }
    // Sleeping is about to happen: poll the UDP socket on the next attempt.
    at.inner.borrow_mut().rx.poll_net_next();
}

/// Back to polling, unless the descriptor was handed out.
fn disarm<L: Link, C: Clock>(at: &Station<L, C>) {
    if !at.fd_exported.get() {
        at.inner.borrow().disarm_wakeups();
    }
}

/// Waiting in a send for the credits of network channel `peer` (its window is closed):
/// each attempt makes protocol progress; sleeping is on the endpoint's descriptor, where
/// the acknowledgement that brings credits arrives.
struct CreditWait<'a, L: Link, C: Clock> {
    at: &'a Station<L, C>,
    peer: usize,
}

impl<L: Link, C: Clock> Waitable for CreditWait<'_, L, C> {
    type Output = ();

    fn poll_once(&self) -> Result<Option<()>> {
        let mut guard = self.at.inner.borrow_mut();
        let inner = &mut *guard;
        inner.rx.progress(&mut inner.stats, &mut inner.errors)?;
        let udp = inner
            .rx
            .net
            .as_ref()
            .expect("a network route implies the driver");
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
        arm(self.at);
    }

    fn disarm(&self) {
        disarm(self.at);
    }

    fn sleep(&self, timeout: Option<Duration>) -> Result<()> {
        // Messages waiting to be read do not end this wait: only credits do.
        self.at.sleep_on_descriptor(timeout)
    }
}

/// The bytes a message filling `frames` whole frames of `frame` bytes of payload each
/// (a [`Station::frame_payload`]) carries: a message of several frames spends the
/// length prefix of its first ([`crate::wire::fragments`]).
pub(crate) fn message_in_frames(frame: usize, frames: usize) -> usize {
    match frames {
        0 | 1 => frame * frames,
        n => n * frame - crate::wire::LENGTH_PREFIX_LEN,
    }
}

/// The most whole frames of `frame` bytes of payload a message of at most `len` bytes
/// fills: the inverse of [`message_in_frames`].
pub(crate) fn frames_within(frame: usize, len: usize) -> usize {
    match len.checked_sub(frame) {
        None => 0,
        Some(_) => ((len + crate::wire::LENGTH_PREFIX_LEN) / frame).max(1),
    }
}

/// The station's drive with `protocol` (`handled` reads how many messages it handled);
/// when it found nothing and the endpoint's descriptor was handed out, once more: a
/// sender may have published before the doorbells were reset.
pub(crate) fn drive_rearming<P: Protocol>(
    on: &impl Footing,
    protocol: &mut P,
    out: &mut Outbox,
    handled: impl Fn(&P) -> u64,
) -> Result<Option<Received>> {
    let station = on.station();
    let report = |e| on.report(e);
    let r = station.drive(protocol, out, report);
    if matches!(r, Ok(None)) && handled(protocol) == 0 && station.rearm_doorbells() {
        return station.drive(protocol, out, report);
    }
    r
}
