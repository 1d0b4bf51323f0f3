//! The Directed Point endpoint: its API (open, target, write, read, release, flush,
//! statistics, the pollable descriptor, the error handler). Everything below the API is
//! the engine's [`Station`]: routes, the receive side, waiting, flushing, liveness; its
//! inline shared-memory fast paths run inside `write` and `read`.

use super::message::Message;
use super::{EndpointStats, Source};
use crate::engine::route::Received;
use crate::engine::station::{Footing, Station};
use crate::error::{Error, Result};
use crate::job::{Job, JobShared, Progress};
use crate::link::Transport;
use std::cell::{Cell, RefCell};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// A Directed Point endpoint. See the [module documentation](crate::dm).
pub struct Endpoint {
    station: Station,
    /// The route [`Endpoint::write`] sends on.
    target: Cell<Option<usize>>,
    /// Runs on every error as it is delivered (see [`Endpoint::set_error_handler`]).
    error_handler: RefCell<Option<ErrorHandler>>,
}

/// A callback for the errors an endpoint reports. `Send`, because the endpoint is: a
/// handler that holds an `Rc` or a `RefCell` shared with other code must not move to
/// another thread with it.
type ErrorHandler = Box<dyn FnMut(&Error) + Send>;

// SAFETY: the endpoint owns its mappings, sockets and pool; the raw pointers inside
// (rings, pool slots) refer to memory that moves with it, and its error handler is `Send`
// (`ErrorHandler`). It is not Sync: one thread at a time uses it, which is all that
// moving it to another thread allows.
unsafe impl Send for Endpoint {}

impl Job {
    /// Opens endpoint `dpid` on this rank. A DPID can be open once per rank at a time.
    pub fn open(&self, dpid: u16) -> Result<Endpoint> {
        self.shared.reserve_dpid(dpid)?;
        Endpoint::open(self.shared.clone(), dpid).inspect_err(|_| self.shared.close_dpid(dpid))
    }

    /// Opens endpoint `dpid` with `service` served on the offload engine's thread
    /// (`Station::open_serving`: it needs the offload engine and a network side, see
    /// [`Job::can_serve`]).
    pub(crate) fn open_serving(
        &self,
        dpid: u16,
        service: crate::engine::offload::Service,
    ) -> Result<Endpoint> {
        self.shared.reserve_dpid(dpid)?;
        Station::open_serving(self.shared.clone(), dpid, service)
            .map(Endpoint::on_station)
            .inspect_err(|_| self.shared.close_dpid(dpid))
    }

    /// Whether this job's endpoints can serve a protocol on the offload engine's thread
    /// (`QUIVER_RELIABILITY=offload` and a network side).
    pub(crate) fn can_serve(&self) -> bool {
        Station::can_serve(&self.shared)
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

/// The protocols of the personalities opened on an endpoint (tagged) stand on its
/// station and report through its error handler.
impl Footing for Endpoint {
    type L = <Station as Footing>::L;
    type C = <Station as Footing>::C;

    fn station(&self) -> &Station {
        &self.station
    }

    fn report(&self, e: Error) -> Error {
        Endpoint::report(self, e)
    }
}

impl Endpoint {
    pub(crate) fn open(job: Arc<JobShared>, dpid: u16) -> Result<Endpoint> {
        Ok(Endpoint::on_station(Station::open(job, dpid)?))
    }

    fn on_station(station: Station) -> Endpoint {
        Endpoint {
            station,
            target: Cell::new(None),
            error_handler: RefCell::new(None),
        }
    }

    /// This endpoint's DPID.
    pub fn dpid(&self) -> u16 {
        self.station.dpid()
    }

    /// This endpoint's rank.
    pub fn rank(&self) -> u32 {
        self.station.job().rank
    }

    /// Sets the destination of [`Endpoint::write`] to endpoint `dpid` of node `nid` (the
    /// endpoint of the first rank on that node that opened `dpid`), connecting if needed.
    pub fn target(&self, nid: u32, dpid: u16) -> Result<()> {
        let job = self.station.job();
        let timeout = job.config.connect_timeout;
        let rank = match job.kv.get(&format!("dp/{nid}/{dpid}"), timeout) {
            Ok(v) => v.parse::<u32>().map_err(|_| Error::Rendezvous {
                url: job.kv.url().to_string(),
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
        self.target_endpoint(rank, self.dpid())
    }

    /// Sets the destination to endpoint `dpid` on `rank`, connecting if needed (waiting
    /// up to `QUIVER_CONNECT_TIMEOUT` for the peer to open it).
    pub fn target_endpoint(&self, rank: u32, dpid: u16) -> Result<()> {
        let route = self.station.connect(Source { rank, dpid })?;
        self.target.set(Some(route));
        Ok(())
    }

    /// The transport used towards `rank`.
    pub fn transport_to(&self, rank: u32) -> Result<Transport> {
        self.station.transport_to(rank)
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
    /// inline; everything else (and every error) in [`Station::send`].
    #[inline(always)]
    fn write_to_target(&self, head: &[u8], data: &[u8], wait: bool) -> Result<bool> {
        let Some(route) = self.target.get() else {
            return Err(self.no_target(head.len() + data.len()));
        };
        if self.station.try_send_inline(route, head, data) {
            return Ok(true);
        }
        self.station.send(route, head, data, wait)
    }

    /// Why a write without a target fails: too large for any target, or no target.
    #[cold]
    fn no_target(&self, len: usize) -> Error {
        let max = self.station.job().config.max_message;
        if len > max {
            Error::MessageTooLarge { len, max }
        } else {
            Error::NoTarget
        }
    }

    /// The next message, if one is waiting. Never blocks.
    #[inline]
    pub fn try_read(&self) -> Result<Option<Message<'_>>> {
        if let Some(m) = self.poll_once()? {
            return Ok(Some(m));
        }
        if self.station.rearm_doorbells() {
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
        self.station.wait_for(|| self.poll_once(), None)
    }

    /// The next message, waiting at most `timeout` ([`Error::Timeout`] then).
    pub fn read_timeout(&self, timeout: Duration) -> Result<Message<'_>> {
        self.station.wait_for(|| self.poll_once(), Some(timeout))
    }

    /// Releases the `n` oldest tokens kept with [`Message::hold`]; returns how many were
    /// released (fewer if fewer are held).
    pub fn release(&self, n: usize) -> usize {
        self.station.release_held(n)
    }

    /// How long a caller that waits on this endpoint's descriptor itself (in its own
    /// `poll`/`epoll` loop) may sleep before calling [`Endpoint::progress`] or
    /// [`Endpoint::try_read`] again: network channels have timers (retransmission,
    /// acknowledgement, probes) that a sleeping process must not miss. `None`: no timer
    /// is running. [`Endpoint::read`] handles this by itself.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.station.poll_timeout()
    }

    /// One round of protocol work without taking a message out: receive what arrived
    /// (it waits in the pool for `read`), acknowledge, retransmit, fire due timers.
    /// In `host` and `none` reliability network channels progress only inside quiver
    /// calls; call this while waiting for something else (see also
    /// [`crate::Job::barrier_progressing`]). With the offload engine it does nothing:
    /// the engine's thread makes progress.
    pub fn progress(&self) -> Result<()> {
        self.station.progress()
    }

    /// Waits until everything this endpoint sent over the network is acknowledged (or
    /// its receiver closed), sending pending acknowledgements at once. Call it before
    /// blocking outside quiver (a barrier of another library, a long computation): in
    /// `host` and `none` reliability, retransmissions and acknowledgements happen only
    /// while the process is inside quiver. Shared memory needs no flush.
    /// [`Error::Timeout`] after `QUIVER_CONNECT_TIMEOUT`.
    pub fn flush(&self) -> Result<()> {
        self.flush_within(self.station.job().config.connect_timeout)
    }

    /// Like [`Endpoint::flush`] with an explicit time limit.
    pub fn flush_within(&self, timeout: Duration) -> Result<()> {
        self.station.flush_within(timeout)
    }

    /// Number of tokens kept with [`Message::hold`] and not yet released.
    pub fn held(&self) -> usize {
        self.station.held()
    }

    /// The endpoint's counters.
    pub fn stats(&self) -> EndpointStats {
        self.station.stats()
    }

    /// Closes the endpoint: its receive area is removed and later writes to it fail.
    pub fn close(self) {}

    /// Registers a callback that runs on every error this endpoint delivers (from
    /// `read`, `try_read`, `progress`...), before the call returns it: channel failures,
    /// lost frames, failed peers. It runs on the caller's thread and must not use this
    /// endpoint. It is `Send` (the endpoint may move to another thread, taking its
    /// handler along): count with atomics, not with an `Rc`.
    ///
    /// ```
    /// # fn f(ep: &quiver::Endpoint) {
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// let seen = Arc::new(AtomicU32::new(0));
    /// let s = seen.clone();
    /// ep.set_error_handler(move |_| {
    ///     s.fetch_add(1, Ordering::Relaxed);
    /// });
    /// # }
    /// ```
    ///
    /// A handler that is not `Send` is refused at compile time:
    ///
    /// ```compile_fail,E0277
    /// # fn f(ep: &quiver::Endpoint) {
    /// let seen = std::rc::Rc::new(std::cell::Cell::new(0u32));
    /// let s = seen.clone();
    /// ep.set_error_handler(move |_| s.set(s.get() + 1));
    /// # }
    /// ```
    pub fn set_error_handler(&self, handler: impl FnMut(&Error) + Send + 'static) {
        *self.error_handler.borrow_mut() = Some(Box::new(handler));
    }

    /// Ranks this endpoint has found failed ([`Error::PeerFailed`] was reported for
    /// them): every operation towards them fails. Ascending.
    pub fn failed_ranks(&self) -> Vec<u32> {
        self.station.failed_ranks()
    }

    /// An error on its way to the caller: a failed rank is remembered, and the error
    /// handler sees it.
    fn report(&self, e: Error) -> Error {
        if let Error::PeerFailed { rank, .. } = &e {
            self.station.mark_failed(*rank);
        }
        if let Ok(mut h) = self.error_handler.try_borrow_mut() {
            if let Some(h) = h.as_mut() {
                h(&e);
            }
        }
        e
    }

    pub(crate) fn hold_token(&self, t: crate::engine::route::Token) {
        self.station.hold_token(t);
    }

    #[inline]
    pub(crate) fn release_token(&self, t: crate::engine::route::Token) {
        self.station.release_token(t);
    }

    /// One poll of the station: the errors the endpoint delivers go through the error
    /// handler; a failure of the link's own calls is returned as it is.
    #[inline]
    fn poll_once(&self) -> Result<Option<Message<'_>>> {
        self.station
            .poll_into(|r| self.message(r), |e| self.report(e))
    }

    /// A received message as the application sees it.
    #[inline]
    fn message(&self, r: Received) -> Message<'_> {
        Message {
            ep: self,
            ptr: r.ptr,
            len: r.len,
            source: r.source,
            token: Some(r.token),
        }
    }
}

impl AsRawFd for Endpoint {
    /// The endpoint's descriptor: readable when messages have arrived. After it signals,
    /// call [`Endpoint::try_read`] until it returns `None`. Handing the descriptor out
    /// makes senders on shared memory ring the doorbell for every batch of messages.
    fn as_raw_fd(&self) -> RawFd {
        self.station.as_raw_fd()
    }
}
