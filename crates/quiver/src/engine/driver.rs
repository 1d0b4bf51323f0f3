//! The network side of an endpoint, as I/O around the sans-IO [`Core`]: the network
//! link (UDP or raw Ethernet, with its receive memory; behind a fault injector when one
//! is configured), the protocol clock, and the rendezvous lookups that resolve a new
//! peer's address.
//!
//! [`Driver`] is driven by whoever owns it: the endpoint itself inside every quiver call
//! (`host` and `none` reliability) or the offload engine's progress thread (`offload`).
//! A progress round receives a batch of datagrams, hands them to the core, and sends
//! what the core says to send; it never blocks. A whole message arriving in order, and
//! a message of one frame written while the window is open, take a shorter path through
//! the same channel state machine ([`Core::handle_frame`], [`Driver::write_lone`]).

use super::clock::{Clock, ProtocolClock};
use super::core::{source_of, Checked, Core, Identity, Role, Transmit};
pub(crate) use super::core::{Peer, Ready};
use super::stats::EndpointStats;
use crate::addr::Source;
use crate::channel::reliable::{PartialSend, Time};
use crate::error::{Error, Result};
use crate::job::JobShared;
use crate::link::network::{NetLink, Placement};
use crate::link::{Datagram, Link, LinkCaps};
use crate::wire::{Flags, Header};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// Idle network polls between two reads of the protocol clock (for timers).
const CLOCK_EVERY: u32 = 32;

/// The network side of an endpoint: its link (and the receive memory the link owns), the
/// clock, and the [`Core`] that decides.
///
/// Generic over the link and the clock, so that the simulator runs this very code over
/// [`crate::link::Link`]s in virtual time; production uses the defaults (monomorphized,
/// no dynamic dispatch).
pub(crate) struct Driver<L: Link = NetLink, C: Clock = ProtocolClock> {
    job: Arc<JobShared>,
    link: L,
    /// What the link guarantees (asked once, when it opens).
    caps: LinkCaps,
    core: Core<L::Dest>,
    scratch: Vec<Datagram>,
    /// The protocol clock ([`Time`] is measured from when the endpoint opened).
    clock: C,
    /// Idle polls since the clock was last read (idle polls read the clock only every
    /// [`CLOCK_EVERY`] rounds: timers need no finer grain, and a read, 10-20 ns, is a
    /// third of an empty poll).
    idle_polls: u32,
    /// The ring is stopped at this slot, which the application holds: nothing to move
    /// until the ring moves on.
    pinned: Option<u32>,
}

impl Driver {
    /// Opens the endpoint's link and publishes its address in the rendezvous.
    pub(crate) fn open(job: Arc<JobShared>, dpid: u16) -> Result<Driver> {
        let me = job.rank;
        let my_node = job.nids[me as usize];
        let remote_ranks = job.nids.iter().filter(|&&n| n != my_node).count();
        let at = Placement {
            ip: job.addrs[me as usize],
            port: job.node_port(me),
            remote_ranks,
            alone_on_node: remote_ranks + 1 == job.nids.len(),
        };
        let mut params = job.config.link_params();
        params.auth_key = job.config.auth.then_some(job.frame_key);
        params.group = Some(job.job_id);
        let link = NetLink::open(&params, at, dpid)?;
        let window = link.channel_window(&params);
        Driver::with_link(job, dpid, link, ProtocolClock::new(), window)
    }

    /// Which transport the link is.
    pub(crate) fn transport(&self) -> crate::link::Transport {
        self.link.transport()
    }

    /// The link's descriptor, for a poller.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.link.as_raw_fd()
    }

    /// The link's second descriptor, which a poller watches too, level-triggered (UDP's
    /// multicast group socket, a pair's UDP socket).
    pub(crate) fn second_fd(&self) -> Option<std::os::fd::RawFd> {
        self.link.second_fd()
    }
}

impl<L: Link, C: Clock> Driver<L, C> {
    /// A driver for endpoint `dpid` over `link`, whose channels have windows of `window`
    /// frames; publishes the link's address in the rendezvous.
    pub(crate) fn with_link(
        job: Arc<JobShared>,
        dpid: u16,
        link: L,
        clock: C,
        window: u16,
    ) -> Result<Driver<L, C>> {
        if link.caps().broadcast {
            // Before the link's address: whoever finds the address finds this too.
            job.kv
                .put(&group_key(job.rank, dpid), link.broadcast_medium())?;
        }
        job.kv.put(&net_key(job.rank, dpid), &link.advertise())?;
        let me = Identity {
            job_id: job.job_id,
            token: job.token as u32,
            rank: job.rank,
            size: job.size,
            dpid,
            max_message: job.config.max_message,
            reliable: job.config.reliable(),
            window,
        };
        Ok(Driver {
            caps: link.caps(),
            link,
            core: Core::new(me),
            scratch: Vec::with_capacity(crate::link::udp::RECV_BATCH),
            clock,
            idle_polls: 0,
            pinned: None,
            job,
        })
    }

    /// Index of the channel to endpoint `peer`, created on first use (the peer's address
    /// comes from the rendezvous store). `wait` says whether to wait for the peer to
    /// register (when targeting it, up to `QUIVER_CONNECT_TIMEOUT`) or not (when a frame
    /// claims to come from it: a peer registers before it sends, and a forged source must
    /// not stall us). A known peer is found inline (every received frame asks); only a new
    /// one goes to the rendezvous, out of line.
    ///
    /// [`Source::group`] names this endpoint's group channel, opened on first use
    /// ([`Driver::open_group`]).
    #[inline(always)]
    pub(crate) fn peer(&mut self, peer: Source, wait: bool) -> Result<usize> {
        match self.core.find_peer(peer) {
            Some(i) => Ok(i),
            None if peer.is_group() => self.open_group(),
            None => self.add_peer(peer, wait),
        }
    }

    /// Whether this endpoint can broadcast through its link: the link has a broadcast
    /// address and some rank of the job is reached over the network.
    pub(crate) fn can_broadcast(&self) -> bool {
        self.caps.broadcast && (0..self.job.size).any(|r| self.reaches_by_network(r))
    }

    /// Whether this endpoint reaches `rank` over the network (as the station routes it:
    /// another node's rank, or any other rank when the transport is forced to udp).
    fn reaches_by_network(&self, rank: u32) -> bool {
        let (me, nids) = (self.job.rank, &self.job.nids);
        rank != me
            && (self.job.config.transport == crate::config::TransportChoice::Udp
                || nids[rank as usize] != nids[me as usize])
    }

    /// This endpoint's group channel ([`super::group`]), opened on first use: its frames
    /// go to the link's broadcast address, and every endpoint of the same DPID reached
    /// over the network is a member (each gets a unicast channel, waiting for it to
    /// register as a send would). Endpoints of this node are not members: they are
    /// reached over shared memory, and a link does not hear its own node's broadcasts.
    #[inline(never)]
    fn open_group(&mut self) -> Result<usize> {
        if let Some(i) = self.core.group_channel() {
            return Ok(i);
        }
        let dpid = self.core.identity().dpid;
        let dest = match self.link.broadcast_dest() {
            Some(dest) if self.can_broadcast() => dest,
            _ => {
                return Err(Error::Config(
                    "a broadcast through the network link: it has no broadcast address, or \
                     no rank of the job is reached over the network"
                        .into(),
                ))
            }
        };
        let mut members = Vec::new();
        let mut max_datagram = self.link.max_datagram_to(&dest);
        for rank in 0..self.job.size {
            if self.reaches_by_network(rank) {
                let i = self.peer(Source { rank, dpid }, true)?;
                if !hears_group(&self.job, Source { rank, dpid })? {
                    // Its link joined no group: the caller reaches it by unicast.
                    continue;
                }
                max_datagram = max_datagram.min(self.link.max_datagram_to(self.core.peer_dest(i)));
                members.push(i);
            }
        }
        self.core.open_group(dest, max_datagram, &members)
    }

    /// A received frame of a group channel (`GROUP` or `GROUP_REPLY`), checked: a
    /// member's reply goes to this endpoint's group channel, a root's broadcast to the
    /// channel this endpoint receives it on (opened at its first frame, like a unicast
    /// channel). True when the round must run the channels. The slot is given back here
    /// unless a channel keeps the frame.
    #[inline(never)]
    fn group_frame(
        &mut self,
        slot: u32,
        h: &Header,
        rxf: super::core::RxFrame,
        ready: &mut VecDeque<Ready>,
        stats: &mut EndpointStats,
    ) -> bool {
        let src = source_of(h);
        if h.flags.contains(Flags::GROUP_REPLY) {
            let taken = match self.core.group_member(src) {
                Some(i) if !self.link.sent_from(slot, self.core.peer_dest(i)) => {
                    stats.dropped_spoofed += 1;
                    false
                }
                Some(_) if self.core.handle_group_reply(h) => true,
                _ => {
                    stats.dropped_misaddressed += 1;
                    false
                }
            };
            self.link.free_slot(slot);
            return taken;
        }
        if !self.reaches_by_network(src.rank) {
            // Our own broadcast, or one of a root on this node (which reaches us over
            // shared memory), looped back by the link (lo, IP multicast's loop).
            self.link.free_slot(slot);
            return false;
        }
        let i = match self.core.find_channel(src, Role::GroupRx) {
            Some(i) => i,
            None => match self.add_group_rx(src) {
                Ok(i) => i,
                Err(e) => {
                    tracing::debug!("broadcast from rank {} DPID {}: {e}", src.rank, src.dpid);
                    stats.dropped_misaddressed += 1;
                    self.link.free_slot(slot);
                    return false;
                }
            },
        };
        if !self.link.sent_from(slot, self.core.peer_dest(i)) {
            stats.dropped_spoofed += 1;
            self.link.free_slot(slot);
            return false;
        }
        self.core.handle_frame(i, h, rxf, ready, &mut self.link)
    }

    /// The channel on which this endpoint receives root `root`'s broadcasts, at its
    /// first frame: acknowledgements go to the root's address, from the rendezvous (not
    /// waited for: a root registers before it sends).
    #[inline(never)]
    fn add_group_rx(&mut self, root: Source) -> Result<usize> {
        let dest = match self.core.find_peer(root) {
            Some(i) => self.core.peer_dest(i).clone(),
            None => self.resolve(root, false)?,
        };
        let max_datagram = self.link.max_datagram_to(&dest);
        self.core
            .add_channel(root, Role::GroupRx, dest, max_datagram)
    }

    /// The part of [`Driver::peer`] for a peer not known yet: its address from the
    /// rendezvous, resolved by the link.
    #[inline(never)]
    fn add_peer(&mut self, peer: Source, wait: bool) -> Result<usize> {
        let dest = self.resolve(peer, wait)?;
        let max_datagram = self.link.max_datagram_to(&dest);
        self.core.add_peer(peer, dest, max_datagram)
    }

    /// Endpoint `peer`'s address: from the rendezvous (waiting for it to register, up to
    /// `QUIVER_CONNECT_TIMEOUT`, if `wait`), resolved by the link.
    fn resolve(&mut self, peer: Source, wait: bool) -> Result<L::Dest> {
        let timeout = self.job.config.connect_timeout;
        let key = net_key(peer.rank, peer.dpid);
        let not_found = || Error::PeerNotFound {
            rank: peer.rank,
            dpid: peer.dpid,
            waited: if wait { timeout } else { Duration::ZERO },
        };
        let addr = if wait {
            match self.job.kv.get(&key, timeout) {
                Ok(a) => a,
                Err(Error::Timeout(_)) => return Err(not_found()),
                Err(e) => return Err(e),
            }
        } else {
            self.job.kv.try_get(&key)?.ok_or_else(not_found)?
        };
        self.link
            .resolve(&addr)
            .map_err(|reason| Error::Rendezvous {
                url: self.job.kv.url().to_string(),
                reason: format!("{key}: {reason}"),
            })
    }

    /// One round of network progress: receive a batch of datagrams and hand them to the
    /// core, move frames out of the way of the link's ring, let the core run its
    /// channels when a frame went to one or a timer is due, and send what they want
    /// sent. A round whose frames were all whole messages taken in order, with nothing
    /// due and nothing to send, ends after the frames (`deliver` false, which the
    /// offload engine passes when its ring is full, leaves frames queued and turns that
    /// path off until they are delivered).
    pub(crate) fn progress(
        &mut self,
        ready: &mut VecDeque<Ready>,
        stats: &mut EndpointStats,
        errors: &mut VecDeque<Error>,
        deliver: bool,
    ) -> Result<()> {
        let mut batch = std::mem::take(&mut self.scratch);
        batch.clear();
        let received = self.link.recv_batch(&mut batch);
        if batch.is_empty() {
            if let Some(slot) = self.link.blocked_slot() {
                if self.pinned != Some(slot) && !self.core.evacuate(slot, &mut self.link, ready) {
                    self.pinned = Some(slot);
                }
            }
            // Nothing due: no clock read. Timers pending: the clock every CLOCK_EVERY
            // idle polls.
            if self.core.deadline().is_none() || {
                self.idle_polls += 1;
                self.idle_polls < CLOCK_EVERY
            } {
                self.scratch = batch;
                return received;
            }
        } else {
            self.pinned = None;
        }
        self.idle_polls = 0;
        let now = self.now();
        self.core.begin_round(now, deliver);
        let mut touched = false;
        for d in &batch {
            stats.frames_received += 1;
            let bytes = &self.link.slot(d.slot)[..d.len];
            let (h, rxf) = match self.core.check(d.slot, bytes, stats) {
                Checked::Frame(h, rxf) if h.flags.intersects(Flags::GROUP | Flags::GROUP_REPLY) => {
                    touched |= self.group_frame(d.slot, &h, rxf, ready, stats);
                    continue;
                }
                Checked::Frame(h, rxf) => (h, rxf),
                Checked::Dropped => {
                    self.link.free_slot(d.slot);
                    continue;
                }
                Checked::Corrupted(h) => {
                    // Charged to a known peer's channel (the one the frame belongs to:
                    // a root's broadcasts have a channel of their own; a member's reply
                    // carries nothing to repair) only if it came from that peer's address.
                    let src = source_of(&h);
                    let channel = if h.flags.contains(Flags::GROUP) {
                        self.core.find_channel(src, Role::GroupRx)
                    } else if h.flags.contains(Flags::GROUP_REPLY) {
                        None
                    } else {
                        self.core.find_peer(src)
                    };
                    if let Some(i) = channel {
                        if self.link.sent_from(d.slot, self.core.peer_dest(i)) {
                            self.core.report_corrupted(now, i);
                            touched = true;
                        }
                    }
                    self.link.free_slot(d.slot);
                    continue;
                }
            };
            let i = match self.peer(source_of(&h), false) {
                Ok(i) => i,
                Err(e) => {
                    tracing::debug!("frame from rank {} DPID {}: {e}", h.src_rank, h.src_dpid);
                    stats.dropped_misaddressed += 1;
                    self.link.free_slot(d.slot);
                    continue;
                }
            };
            if !self.link.sent_from(d.slot, self.core.peer_dest(i)) {
                // Right job, token and rank, wrong sender: someone speaks in its name.
                stats.dropped_spoofed += 1;
                self.link.free_slot(d.slot);
                continue;
            }
            touched |= self.core.handle_frame(i, &h, rxf, ready, &mut self.link);
        }
        self.scratch = batch;
        while let Some(slot) = self.link.next_approaching() {
            self.core.evacuate(slot, &mut self.link, ready);
        }
        received?;

        let due = self.core.deadline().is_some_and(|t| t <= now);
        if !touched && !due {
            return Ok(());
        }
        self.core
            .handle_round(touched, &mut self.link, ready, stats, errors);
        for i in 0..self.core.peer_count() {
            self.transmit(i, now, stats)?;
        }
        if self.caps.holds_back {
            self.link.handle_timeout(now.as_duration())?;
        }
        self.update_deadline();
        Ok(())
    }

    /// Tells every network peer that this endpoint is closing, so that none waits for it.
    pub(crate) fn say_goodbye(&mut self) {
        let now = self.now().as_duration();
        for (dest, bytes) in self.core.goodbyes() {
            let _ = self.link.send_unfaulted(now, dest, &bytes);
        }
    }

    /// Sends every pending acknowledgement now (the start of a flush).
    pub(crate) fn flush_acks(&mut self, stats: &mut EndpointStats) -> Result<()> {
        self.core.flush_acks();
        let now = self.now();
        for i in 0..self.core.peer_count() {
            self.transmit(i, now, stats)?;
        }
        self.update_deadline();
        Ok(())
    }

    /// Whether some channel still has unacknowledged frames towards a live peer.
    pub(crate) fn unacknowledged(&self) -> bool {
        self.core.unacknowledged()
    }

    /// Frames towards live peers not acknowledged yet ([`Core::backlog`]).
    pub(crate) fn backlog(&self) -> u64 {
        self.core.backlog()
    }

    /// The error of a channel whose peer stopped answering, if any.
    pub(crate) fn failed_channel(&self) -> Option<Error> {
        self.core.failed_channel()
    }

    /// Adds the core's and the link's counters (with the fault injector's) to `st`.
    pub(crate) fn add_counters(&self, st: &mut EndpointStats) {
        self.core.add_counters(st);
        let link = self.link.counters();
        st.ring_drops = link.ring_drops;
        st.dropped_misaddressed += link.misaddressed;
        st.dropped_unauthenticated = link.unauthenticated;
        st.faults_lost = link.faults.lost;
        st.faults_duplicated = link.faults.duplicated;
        st.faults_reordered = link.faults.reordered;
        st.faults_corrupted = link.faults.corrupted;
    }
}

/// How far ahead of the window [`Driver::send_part`] builds frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pace {
    /// A window ahead, and the writer waits for credits when the window closes (a
    /// blocking write).
    Window,
    /// Everything at once, never waiting (a non-blocking write).
    Unbounded,
}

/// What one step of a message of several frames did ([`Driver::send_part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartSent {
    /// The whole message is queued (its last frame built).
    pub queued: bool,
    /// The writer must make progress before going on: the window closed before the
    /// message was queued, or (when waiting) the channel has no credit left.
    pub must_wait: bool,
}

/// What the personalities call: sending, releasing and asking about peers. Nothing
/// outside the engine touches a channel or the link's slots directly.
impl<L: Link, C: Clock> Driver<L, C> {
    /// Sends a message of one frame to peer `i` at once, when the channel can take the
    /// common case ([`Core::send_lone`]): false, sending nothing, when the general path
    /// (`begin_send`, `send_part`) is needed. The deadline (the channel's timers, and
    /// the link's when it holds the frame back) is only brought forward here, never put
    /// back: a deadline that comes early costs one round that finds nothing due and
    /// recomputes.
    pub(crate) fn write_lone(
        &mut self,
        i: usize,
        head: &[u8],
        body: &[u8],
        stats: &mut EndpointStats,
    ) -> Result<bool> {
        let now = self.now();
        let Some((dest, frame)) = self.core.send_lone(i, now, head, body) else {
            return Ok(false);
        };
        stats.frames_sent += 1;
        self.link.send(now.as_duration(), dest, frame)?;
        if self.core.wants_transmit(i) {
            self.transmit(i, now, stats)?;
        }
        self.core.note_timers_of(i);
        if self.caps.holds_back {
            let link = self.link.poll_timeout().map(Time::from_duration);
            self.core.bring_deadline_forward(link);
        }
        Ok(true)
    }

    /// Frames built for peer `i` and waiting for its window, and the window's size.
    pub(crate) fn waiting_frames(&self, i: usize) -> (usize, usize) {
        self.core.waiting_frames(i)
    }

    /// The longest message that travels to peer `i` in one frame.
    pub(crate) fn lone_max(&self, i: usize) -> usize {
        self.core.lone_max(i)
    }

    /// Starts a message of `len` bytes to peer `i` on the general path (after
    /// [`write_lone`](Self::write_lone) declined it).
    pub(crate) fn begin_send(&self, i: usize, len: usize) -> Result<PartialSend> {
        self.core.begin_send(i, len)
    }

    /// Builds the next frames of the message `part` to peer `i` (as far ahead as `pace`
    /// says) and sends what the channel lets out.
    pub(crate) fn send_part(
        &mut self,
        i: usize,
        message: (&[u8], &[u8]),
        part: &mut PartialSend,
        pace: Pace,
        stats: &mut EndpointStats,
    ) -> Result<PartSent> {
        let (ahead, wait) = match pace {
            Pace::Window => (usize::from(self.core.identity().window), true),
            Pace::Unbounded => (usize::MAX, false),
        };
        let now = self.now();
        let queued = self.core.send_part(i, now, message, part, ahead);
        self.transmit(i, now, stats)?;
        self.update_deadline();
        let must_wait = !queued || (wait && self.core.is_blocked(i));
        Ok(PartSent { queued, must_wait })
    }

    /// Queues `messages` (each a header and a body) to peer `i`, one after the other,
    /// and then sends what the window lets out in one go (a batch for the link, where
    /// one frame at a time would cost a system call each). Never waits: what the window
    /// does not take goes as credits return.
    pub(crate) fn send_batch(
        &mut self,
        i: usize,
        messages: &[(&[u8], &[u8])],
        stats: &mut EndpointStats,
    ) -> Result<()> {
        let now = self.now();
        for &(head, body) in messages {
            let mut part = self.core.begin_send(i, head.len() + body.len())?;
            let queued = self
                .core
                .send_part(i, now, (head, body), &mut part, usize::MAX);
            debug_assert!(queued, "nothing limits how far ahead it builds");
        }
        self.transmit(i, now, stats)?;
        self.update_deadline();
        Ok(())
    }

    /// Queues a whole message to peer `i` without sending anything yet (the offload
    /// engine gathers a round's commands, then sends each peer's frames together:
    /// [`transmit_queued`](Self::transmit_queued)). `Ok(false)`: the channel has
    /// failed, and the message is dropped.
    pub(crate) fn queue(&mut self, i: usize, data: &[u8]) -> Result<bool> {
        let now = self.now();
        self.core.send(i, now, data)
    }

    /// Queues the message `head` + `body` to peer `i` whole, without sending anything
    /// yet (the station gathers a protocol's outbox, then sends each peer's frames
    /// together: [`transmit_queued`](Self::transmit_queued)).
    pub(crate) fn queue_parts(&mut self, i: usize, head: &[u8], body: &[u8]) -> Result<()> {
        let now = self.now();
        let mut part = self.core.begin_send(i, head.len() + body.len())?;
        let queued = self
            .core
            .send_part(i, now, (head, body), &mut part, usize::MAX);
        debug_assert!(queued, "nothing limits how far ahead it builds");
        Ok(())
    }

    /// Sends what the window lets out of the frames queued for peer `i`.
    pub(crate) fn transmit_queued(&mut self, i: usize, stats: &mut EndpointStats) -> Result<()> {
        let now = self.now();
        self.transmit(i, now, stats)?;
        self.update_deadline();
        Ok(())
    }

    /// Whether peer `i`'s window is closed (no credit left).
    #[inline]
    pub(crate) fn is_blocked(&self, i: usize) -> bool {
        self.core.is_blocked(i)
    }

    /// Peer `i`, for its address and whether it said goodbye.
    #[inline]
    pub(crate) fn peer_at(&self, i: usize) -> &Peer<L::Dest> {
        self.core.peer_at(i)
    }

    /// Why peer `i`'s channel failed, as the endpoint reports it.
    pub(crate) fn failure_of(&self, i: usize) -> Error {
        self.core.failure_of(i)
    }

    /// The bytes of a ready message.
    #[inline]
    pub(crate) fn ready_bytes<'a>(&'a self, r: &'a Ready) -> &'a [u8] {
        Core::<L::Dest>::ready_bytes(&self.link, r)
    }

    /// The bytes from `offset` of received slot `slot` (a message read in place).
    #[inline]
    pub(crate) fn slot_bytes(&self, slot: u32, offset: usize) -> &[u8] {
        &self.link.slot(slot)[offset..]
    }

    /// A message read in place from `slot` is released: the slot goes back to the link,
    /// and its receive buffer is a credit for the sending peer.
    #[inline]
    pub(crate) fn release_slot(&mut self, slot: u32, peer: u32) {
        self.core.release_slot(&mut self.link, slot, peer);
    }

    /// A message the core assembled or copied is released: a frame copied out of the
    /// ring gives its credit back, and the buffer assembles a later long message.
    pub(crate) fn release_owned(&mut self, data: Vec<u8>, credit: Option<u32>) {
        self.core.release_owned(data, credit);
    }

    /// Releases a ready message (the offload engine, which copies each one out).
    pub(crate) fn release(&mut self, r: Ready) {
        match r {
            Ready::Slot { slot, peer, .. } => self.release_slot(slot, peer),
            Ready::Owned { data, credit, .. } => self.release_owned(data, credit),
        }
    }

    /// What the link guarantees.
    #[inline]
    pub(crate) fn caps(&self) -> &LinkCaps {
        &self.caps
    }

    /// Data frames received so far (a flush waits for them to stop).
    pub(crate) fn data_frames(&self) -> u64 {
        self.core.data_frames()
    }

    /// How long a sleeper may wait before the protocol needs attention.
    pub(crate) fn time_to_deadline(&self) -> Option<Duration> {
        let now = self.now();
        self.core
            .deadline()
            .map(|t| t.as_duration().saturating_sub(now.as_duration()))
    }
}

/// The driver's own I/O steps.
impl<L: Link, C: Clock> Driver<L, C> {
    /// The protocol clock.
    fn now(&self) -> Time {
        self.clock.now()
    }

    /// Sends everything peer `i`'s channel has to send, with as few system calls as the
    /// link allows.
    fn transmit(&mut self, i: usize, now: Time, stats: &mut EndpointStats) -> Result<()> {
        match self.core.poll_transmit(i, now, stats) {
            Transmit::Nothing => Ok(()),
            Transmit::One(dest, frame) => self.link.send(now.as_duration(), dest, frame),
            Transmit::Batch {
                dest,
                frames,
                max_run,
            } => self
                .link
                .send_batch(now.as_duration(), dest, &frames, max_run),
        }
    }

    /// Recomputes the deadline from the channels' timers and, when the link holds
    /// frames back, the link's.
    fn update_deadline(&mut self) {
        let link = if self.caps.holds_back {
            self.link.poll_timeout().map(Time::from_duration)
        } else {
            None
        };
        self.core.update_deadline(link);
    }
}

/// The rendezvous key under which endpoint `dpid` of `rank` says that its link hears the
/// job's broadcasts (it joined the group), published before its link's address.
pub(crate) fn group_key(rank: u32, dpid: u16) -> String {
    format!("grp/{rank}/{dpid}")
}

/// Whether endpoint `peer`, whose link's address is published already, hears this
/// rank's broadcasts on the same DPID: both links broadcast, over the same medium (a job
/// may mix raw Ethernet and udp endpoints: an eth rank whose peer fell back to udp). A
/// root reaches the others by unicast.
pub(crate) fn hears_group(job: &JobShared, peer: Source) -> Result<bool> {
    let theirs = job.kv.try_get(&group_key(peer.rank, peer.dpid))?;
    let ours = job.kv.try_get(&group_key(job.rank, peer.dpid))?;
    Ok(theirs.is_some() && theirs == ours)
}

/// The rendezvous key under which endpoint `dpid` of `rank` publishes its link.
pub(crate) fn net_key(rank: u32, dpid: u16) -> String {
    format!("net/{rank}/{dpid}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_hears_broadcasts_only_over_the_medium_of_ours() {
        let (jobs, _store) = crate::test_support::jobs(4, &crate::config::Config::default());
        let job = &jobs[0].shared;
        let dpid = 9;
        // Rank 1 multicasts raw frames as we do, rank 2 over IP (it fell back to udp),
        // rank 3 not at all.
        for (rank, medium) in [(0, "eth"), (1, "eth"), (2, "ip")] {
            job.kv.put(&group_key(rank, dpid), medium).unwrap();
        }
        let hears = |rank| hears_group(job, Source { rank, dpid }).unwrap();
        assert_eq!([hears(1), hears(2), hears(3)], [true, false, false]);
        // On a DPID whose link does not broadcast here, nobody is heard.
        let other = Source { rank: 1, dpid: 10 };
        job.kv.put(&group_key(1, 10), "eth").unwrap();
        assert!(!hears_group(job, other).unwrap());
    }
}
