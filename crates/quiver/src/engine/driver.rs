//! The network side of an endpoint: its network link (UDP or raw Ethernet, with its
//! receive memory; behind a fault injector when one is configured), and one reliable
//! channel state machine ([`Duplex`]) per peer endpoint.
//!
//! [`Driver`] is driven by whoever owns it: the endpoint itself inside every quiver call
//! (`host` and `none` reliability) or the offload engine's progress thread (`offload`).
//! A progress round receives a batch of datagrams, checks and hands them to their
//! channels, turns in-order frames into [`Ready`] messages, fires due timers and sends
//! what the channels want sent. It never blocks. A whole message arriving in order, and
//! a message of one frame written while the window is open, take a shorter path through
//! the same channel state machine ([`Duplex::take_in_order`], [`Driver::write_lone`]).

use super::clock::{Clock, ProtocolClock};
use super::stats::EndpointStats;
use crate::addr::Source;
use crate::channel::reliable::{
    earliest, ChannelError, Duplex, Event, PartialSend, SendError, Time, TxFrame,
};
use crate::channel::{Delivery, RxChannel, SpareBuffers};
use crate::error::{Error, Result};
use crate::job::JobShared;
use crate::link::network::{NetDest, NetLink, Placement};
use crate::link::udp;
use crate::link::{Datagram, Link, LinkCaps};
use crate::wire::{self, DecodeError, Flags, FrameKind, Header};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// Idle network polls between two reads of the protocol clock (for timers).
const CLOCK_EVERY: u32 = 32;

/// The network side of an endpoint: its link (and the receive memory the link owns) and
/// one reliable channel state machine per peer endpoint.
///
/// Generic over the link and the clock, so that the simulator runs this very code over
/// [`crate::link::Link`]s in virtual time; production uses the defaults (monomorphized,
/// no dynamic dispatch).
pub(crate) struct Driver<L: Link = NetLink, C: Clock = ProtocolClock> {
    pub(super) job: Arc<JobShared>,
    pub(super) dpid: u16,
    pub(super) link: L,
    /// What the link guarantees (asked once, when it opens).
    pub(super) caps: LinkCaps,
    /// Frames each channel may have in flight ([`NetLink::channel_window`]).
    pub(super) window: u16,
    pub(super) peers: Vec<Peer<L::Dest>>,
    pub(super) peer_index: HashMap<Source, usize>,
    pub(super) scratch: Vec<Datagram>,
    /// The protocol clock ([`Time`] is measured from when the endpoint opened).
    pub(super) clock: C,
    /// Earliest deadline of any peer's timers or of the link (a fault injector's delayed
    /// datagrams).
    pub(super) next_deadline: Option<Time>,
    /// The protocol clock at the last progress round (idle polls read the clock only
    /// every [`CLOCK_EVERY`] rounds: timers need no finer grain, and a read, 10-20 ns,
    /// is a third of an empty poll).
    pub(super) last_now: Time,
    pub(super) idle_polls: u32,
    /// What one transmit hands the link, in order: data frames the channel keeps for
    /// retransmission (sent from there), and the other frames (acknowledgements,
    /// probes, unreliable frames), copied back to back into `gather`.
    pub(super) batch: Vec<BatchFrame>,
    pub(super) gather: Vec<u8>,
    /// Data frames received (not acknowledgements or heartbeats): a flush waits for
    /// these to stop.
    pub(super) data_frames: u64,
    /// Reassembly buffers of released messages, for the next long ones.
    pub(super) spares: SpareBuffers,
    /// A round that could not deliver left frames queued in their channels.
    pub(super) undelivered: bool,
    /// Frames copied out of the link's ring while a channel keeps them
    /// ([`Driver::evacuate`]); a kept frame names one by its index here with
    /// [`EVACUATED`] set.
    pub(super) evacuated: Vec<Option<Vec<u8>>>,
    /// The ring is stopped at this slot, which the application holds: nothing to move
    /// until the ring moves on.
    pub(super) pinned: Option<u32>,
    /// Frames [`Driver::evacuate`] copied out of the ring.
    pub(super) evacuations: u64,
}

/// Set in an [`RxFrame::slot`] that names a copy in [`Driver::evacuated`] rather than a
/// slot of the link (whose slots number far fewer).
pub(crate) const EVACUATED: u32 = 1 << 31;

/// A received frame in the pool: its slot, and what the first decode found, so that
/// delivery needs no second pass over the bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxFrame {
    pub(crate) slot: u32,
    pub(crate) seq: u32,
    pub(crate) flags: Flags,
    pub(crate) total_len: Option<u32>,
    pub(crate) data_off: u32,
    pub(crate) data_len: u32,
}

/// The bytes of a kept frame: a slot of the link, or a copy moved out of it.
#[inline]
fn frame_bytes<'a, L: Link>(link: &'a L, evacuated: &'a [Option<Vec<u8>>], slot: u32) -> &'a [u8] {
    if slot & EVACUATED == 0 {
        link.slot(slot)
    } else {
        evacuated
            .get((slot & !EVACUATED) as usize)
            .and_then(Option::as_deref)
            .unwrap_or(&[])
    }
}

/// Gives back a kept frame: its slot to the link, or its copy.
#[inline]
fn free_frame<L: Link>(link: &mut L, evacuated: &mut [Option<Vec<u8>>], slot: u32) {
    if slot & EVACUATED == 0 {
        link.free_slot(slot);
    } else if let Some(copy) = evacuated.get_mut((slot & !EVACUATED) as usize) {
        *copy = None;
    }
}

impl<D> Peer<D> {
    /// Why this channel failed, as the endpoint reports it.
    pub(crate) fn failure(&self) -> Error {
        let why = self
            .duplex
            .failure()
            .unwrap_or(ChannelError::Unreachable { timeouts: 0 });
        channel_error(self.source, &why)
    }
}

/// One peer endpoint reached over the network.
pub(crate) struct Peer<D = NetDest> {
    pub(crate) source: Source,
    pub(super) dest: D,
    pub(super) duplex: Duplex<RxFrame>,
    pub(super) rx: RxChannel,
    /// The peer said goodbye: nothing it has not acknowledged will be.
    pub(crate) closed: bool,
}

pub(crate) enum Ready {
    Slot {
        slot: u32,
        offset: usize,
        len: usize,
        source: Source,
        peer: u32,
    },
    Owned {
        data: Vec<u8>,
        source: Source,
        /// The channel to credit when the message is released: a frame copied out of
        /// the ring still holds its receive buffer ([`Driver::evacuate`]). `None` for a
        /// reassembled message, whose frames were credited as they were copied.
        credit: Option<u32>,
    },
}

/// A frame of one transmit batch ([`Driver::transmit`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum BatchFrame {
    /// A data frame the channel keeps, by sequence number.
    Kept(u32),
    /// Bytes `start..end` of the gather buffer.
    Gathered(usize, usize),
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
        let params = job.config.link_params();
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
        job.kv.put(&net_key(job.rank, dpid), &link.advertise())?;
        Ok(Driver {
            window,
            caps: link.caps(),
            link,
            peers: Vec::new(),
            peer_index: HashMap::new(),
            scratch: Vec::with_capacity(crate::link::udp::RECV_BATCH),
            clock,
            next_deadline: None,
            last_now: Time::ZERO,
            idle_polls: 0,
            batch: Vec::new(),
            gather: Vec::new(),
            data_frames: 0,
            spares: SpareBuffers::default(),
            undelivered: false,
            evacuated: Vec::new(),
            pinned: None,
            evacuations: 0,
            job,
            dpid,
        })
    }

    /// Index of the channel to endpoint `peer`, created on first use (the peer's address
    /// comes from the rendezvous store). `wait` says whether to wait for the peer to
    /// register (when targeting it, up to `QUIVER_CONNECT_TIMEOUT`) or not (when a frame
    /// claims to come from it: a peer registers before it sends, and a forged source must
    /// not stall us). A known peer is found inline (every received frame asks); only a new
    /// one goes to the rendezvous, out of line.
    #[inline]
    pub(crate) fn peer(&mut self, peer: Source, wait: bool) -> Result<usize> {
        match self.find_peer(peer) {
            Some(i) => Ok(i),
            None => self.add_peer(peer, wait),
        }
    }

    /// The part of [`Driver::peer`] for a peer not known yet.
    #[inline(never)]
    fn add_peer(&mut self, peer: Source, wait: bool) -> Result<usize> {
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
        let dest = self
            .link
            .resolve(&addr)
            .map_err(|reason| Error::Rendezvous {
                url: self.job.kv.url().to_string(),
                reason: format!("{key}: {reason}"),
            })?;
        let template = self.header_to(FrameKind::Data, peer.dpid);
        let reliable = crate::channel::reliable::Config {
            max_datagram: self.link.max_datagram_to(&dest),
            window: self.window,
            ..self.job.config.reliable()
        };
        let duplex = Duplex::new(&reliable, template)
            .map_err(|e| Error::Config(format!("reliable channels: {e}")))?;
        let i = self.peers.len();
        self.peers.push(Peer {
            source: peer,
            dest,
            duplex,
            rx: RxChannel::new(),
            closed: false,
        });
        self.peer_index.insert(peer, i);
        Ok(i)
    }

    /// One round of network progress: receive a batch of datagrams and hand them to
    /// their channels, turn in-order frames into ready messages, collect channel events,
    /// fire due timers and send what the channels want sent. A round whose frames were
    /// all whole messages taken in order, with nothing due and nothing to send, ends
    /// after the frames (`deliver` false, which the offload engine passes when its ring
    /// is full, leaves frames queued and turns that path off until they are delivered).
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
                if self.pinned != Some(slot) && !self.evacuate(slot, ready) {
                    self.pinned = Some(slot);
                }
            }
        } else {
            self.pinned = None;
        }
        if batch.is_empty() && self.next_deadline.is_none() {
            self.scratch = batch;
            return received;
        }
        if batch.is_empty() {
            self.idle_polls += 1;
            if self.idle_polls < CLOCK_EVERY {
                self.scratch = batch;
                return received;
            }
        }
        self.idle_polls = 0;
        let now = self.now();
        self.last_now = now;
        let (job_id, token, size) = (self.job.job_id, self.job.token as u32, self.job.size);
        let max_message = self.job.config.max_message;
        let mut touched = false;
        for d in &batch {
            stats.frames_received += 1;
            let bytes = &self.link.slot(d.slot)[..d.len];
            let decoded = match wire::decode(bytes) {
                Ok(frame) => {
                    let data = frame.data();
                    let rx = RxFrame {
                        slot: d.slot,
                        seq: frame.header.seq,
                        flags: frame.header.flags,
                        total_len: frame.total_len(),
                        data_off: (data.as_ptr() as usize - bytes.as_ptr() as usize) as u32,
                        data_len: data.len() as u32,
                    };
                    Ok((frame.header, rx))
                }
                Err(DecodeError::Checksum { .. }) => Err(Header::parse(bytes).ok()),
                Err(_) => Err(None),
            };
            let (h, rxf) = match decoded {
                Ok(x) => x,
                Err(parsed) => {
                    stats.dropped_malformed += 1;
                    // A corrupted frame of a known peer: its channel decides (mode none
                    // reports it; host lets retransmission repair it).
                    if let Some(h) = parsed.filter(|h| h.job_id == job_id) {
                        let src = Source {
                            rank: h.src_rank,
                            dpid: h.src_dpid,
                        };
                        if let Some(i) = self.find_peer(src) {
                            self.peers[i].duplex.handle_invalid(now);
                            touched = true;
                        }
                    }
                    self.link.free_slot(d.slot);
                    continue;
                }
            };
            let verdict = if h.job_id != job_id {
                stats.dropped_foreign_job += 1;
                None
            } else if h.token != token {
                stats.dropped_bad_token += 1;
                None
            } else if h.dst_dpid != self.dpid || h.src_rank >= size {
                stats.dropped_misaddressed += 1;
                None
            } else {
                let src = Source {
                    rank: h.src_rank,
                    dpid: h.src_dpid,
                };
                match self.peer(src, false) {
                    Ok(i) => Some(i),
                    Err(e) => {
                        tracing::debug!("frame from rank {} DPID {}: {e}", src.rank, src.dpid);
                        stats.dropped_misaddressed += 1;
                        None
                    }
                }
            };
            match verdict {
                Some(i) => {
                    self.data_frames += u64::from(h.kind == FrameKind::Data);
                    let p = &mut self.peers[i];
                    // A whole message in order, with nothing before it to deliver, goes
                    // to the application at once (header prediction): no queue, and no
                    // pass over every channel unless this one has something to send.
                    if deliver
                        && !self.undelivered
                        && h.flags.contains(Flags::FIRST | Flags::LAST)
                        && p.rx.takes_whole(h.seq, rxf.data_len as usize, max_message)
                        && p.duplex.take_in_order(now, &h)
                    {
                        p.rx.take_whole();
                        ready.push_back(Ready::Slot {
                            slot: rxf.slot,
                            offset: rxf.data_off as usize,
                            len: rxf.data_len as usize,
                            source: p.source,
                            peer: i as u32,
                        });
                        if p.duplex.wants_transmit() {
                            touched = true;
                        } else {
                            self.next_deadline =
                                earliest(self.next_deadline, p.duplex.poll_timeout());
                        }
                        continue;
                    }
                    touched = true;
                    if let Some(back) = p.duplex.handle_frame(now, &h, rxf) {
                        free_frame(&mut self.link, &mut self.evacuated, back.slot);
                    }
                }
                None => self.link.free_slot(d.slot),
            }
        }
        self.scratch = batch;
        while let Some(slot) = self.link.next_approaching() {
            self.evacuate(slot, ready);
        }
        received?;

        let due = self.next_deadline.is_some_and(|t| t <= now);
        if !touched && !due {
            return Ok(());
        }
        // Frames left queued in their channels now are delivered by a later round that
        // may deliver; until then no frame may overtake them.
        if deliver {
            self.undelivered = false;
        } else if touched {
            self.undelivered = true;
        }
        for (i, p) in self.peers.iter_mut().enumerate() {
            if due && p.duplex.poll_timeout().is_some_and(|t| t <= now) {
                p.duplex.handle_timeout(now);
            }
            while let Some(d) = deliver.then(|| p.duplex.poll_deliver()).flatten() {
                let (off, len) = (d.data_off as usize, d.data_len as usize);
                let data = &frame_bytes(&self.link, &self.evacuated, d.slot)[off..off + len];
                let out = p.rx.on_data(
                    d.seq,
                    d.flags,
                    d.total_len,
                    data,
                    max_message,
                    &mut self.spares,
                );
                stats.dropped_oversized += out.oversized as u64;
                stats.dropped_malformed += out.malformed as u64;
                match out.delivery {
                    Delivery::InPlace if d.slot & EVACUATED != 0 => {
                        let mut data = self
                            .evacuated
                            .get_mut((d.slot & !EVACUATED) as usize)
                            .and_then(Option::take)
                            .unwrap_or_default();
                        data.truncate(off + len);
                        data.drain(..off);
                        ready.push_back(Ready::Owned {
                            data,
                            source: p.source,
                            credit: Some(i as u32),
                        });
                    }
                    Delivery::InPlace => {
                        ready.push_back(Ready::Slot {
                            slot: d.slot,
                            offset: off,
                            len,
                            source: p.source,
                            peer: i as u32,
                        });
                    }
                    Delivery::Assembled(data) => {
                        ready.push_back(Ready::Owned {
                            data,
                            source: p.source,
                            credit: None,
                        });
                        free_frame(&mut self.link, &mut self.evacuated, d.slot);
                        p.duplex.handle_release(now, 1);
                    }
                    Delivery::None => {
                        free_frame(&mut self.link, &mut self.evacuated, d.slot);
                        p.duplex.handle_release(now, 1);
                    }
                }
            }
            while let Some(ev) = p.duplex.poll_event() {
                match ev {
                    Event::Error(ChannelError::Lost { count, .. }) => {
                        stats.lost_frames += count as u64;
                        errors.push_back(Error::Lost {
                            rank: p.source.rank,
                            dpid: p.source.dpid,
                            frames: count,
                        });
                    }
                    Event::Error(e) => errors.push_back(channel_error(p.source, &e)),
                    Event::PeerClosed => p.closed = true,
                }
            }
        }
        for i in 0..self.peers.len() {
            self.transmit(i, now, stats)?;
        }
        if self.caps.holds_back {
            self.link.handle_timeout(now.as_duration())?;
        }
        self.update_deadline();
        Ok(())
    }

    /// The link's receive ring comes round to `slot`, which we still hold, within half a
    /// ring of frames (or already has): from then on the kernel drops every frame behind
    /// it until it is free, the retransmission that would let a channel deliver it
    /// included. A frame the protocol keeps (held out of order, waiting for delivery, or
    /// delivered to `ready` and not yet read) is copied out and its slot given back; it
    /// keeps its sender's credit until the application releases the message. A frame
    /// the application holds (a live `Message`, `Message::hold`) cannot move: returns
    /// false, and the ring waits for its release.
    #[cold]
    #[inline(never)]
    fn evacuate(&mut self, slot: u32, ready: &mut VecDeque<Ready>) -> bool {
        for r in ready.iter_mut() {
            if let Ready::Slot {
                slot: s,
                offset,
                len,
                source,
                peer,
            } = *r
            {
                if s == slot {
                    let data = self.link.slot(slot)[offset..offset + len].to_vec();
                    *r = Ready::Owned {
                        data,
                        source,
                        credit: Some(peer),
                    };
                    self.link.free_slot(slot);
                    self.evacuations += 1;
                    return true;
                }
            }
        }
        for p in &mut self.peers {
            if let Some(f) = p.duplex.kept_mut().find(|f| f.slot == slot) {
                let end = (f.data_off + f.data_len) as usize;
                let copy = self.link.slot(slot)[..end].to_vec();
                let index = match self.evacuated.iter().position(Option::is_none) {
                    Some(i) => {
                        self.evacuated[i] = Some(copy);
                        i
                    }
                    None => {
                        self.evacuated.push(Some(copy));
                        self.evacuated.len() - 1
                    }
                };
                f.slot = EVACUATED | index as u32;
                self.link.free_slot(slot);
                self.evacuations += 1;
                return true;
            }
        }
        false
    }

    /// The header of a frame from this endpoint to endpoint `dst_dpid` (sequence,
    /// acknowledgement and checksum fields left for the channel to fill).
    fn header_to(&self, kind: FrameKind, dst_dpid: u16) -> Header {
        Header {
            kind,
            flags: Flags::EMPTY,
            src_dpid: self.dpid,
            dst_dpid,
            credits: 0,
            src_rank: self.job.rank,
            job_id: self.job.job_id,
            token: self.job.token as u32,
            seq: 0,
            ack: 0,
            checksum: 0,
        }
    }

    /// Tells every network peer that this endpoint is closing, so that none waits for it.
    pub(crate) fn say_goodbye(&mut self) {
        let now = self.now().as_duration();
        for p in self.peers.iter().filter(|p| !p.closed) {
            let h = self.header_to(FrameKind::Goodbye, p.source.dpid);
            let mut bytes = [0u8; wire::HEADER_LEN];
            h.emit_sealed(&mut bytes, &[]);
            let _ = self.link.send_unfaulted(now, &p.dest, &bytes);
        }
    }

    /// Sends every pending acknowledgement now (the start of a flush).
    pub(crate) fn flush_acks(&mut self, stats: &mut EndpointStats) -> Result<()> {
        for p in &mut self.peers {
            p.duplex.flush_ack();
        }
        let now = self.now();
        for i in 0..self.peers.len() {
            self.transmit(i, now, stats)?;
        }
        self.update_deadline();
        Ok(())
    }

    /// Whether some channel still has unacknowledged frames towards a live peer.
    pub(crate) fn unacknowledged(&self) -> bool {
        self.peers
            .iter()
            .any(|p| !p.closed && !p.duplex.is_idle() && !p.duplex.sender().is_failed())
    }

    /// The error of a channel whose peer stopped answering, if any.
    pub(crate) fn failed_channel(&self) -> Option<Error> {
        self.peers
            .iter()
            .find(|p| !p.closed && p.duplex.is_failed())
            .map(Peer::failure)
    }

    /// Adds the channels' and the fault injector's counters to `st`.
    pub(crate) fn add_counters(&self, st: &mut EndpointStats) {
        for p in &self.peers {
            let c = p.duplex.counters();
            st.retransmissions += c.retransmissions;
            st.timeouts += c.timeouts;
            st.fast_retransmits += c.fast_retransmits;
            st.checksum_failures += c.checksum_failures;
            st.duplicates += c.duplicates;
            st.out_of_order += c.out_of_order;
            st.credit_stalls += c.credit_stalls;
            st.acks_sent += c.acks_explicit;
        }
        let link = self.link.counters();
        st.ring_drops = link.ring_drops;
        st.ring_evacuations = self.evacuations;
        st.dropped_misaddressed += link.misaddressed;
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
    /// Starts a message of `len` bytes to peer `i` on the general path (after
    /// [`write_lone`](Self::write_lone) declined it).
    pub(crate) fn begin_send(&self, i: usize, len: usize) -> Result<PartialSend> {
        let p = &self.peers[i];
        match p.duplex.begin_send(len) {
            Ok(part) => Ok(part),
            Err(SendError::Failed) => Err(p.failure()),
            Err(SendError::TooLarge { len, max }) => Err(Error::MessageTooLarge { len, max }),
        }
    }

    /// Builds the next frames of the message `part` to peer `i` (as far ahead as `pace`
    /// says) and sends what the channel lets out.
    pub(crate) fn send_part(
        &mut self,
        i: usize,
        (head, data): (&[u8], &[u8]),
        part: &mut PartialSend,
        pace: Pace,
        stats: &mut EndpointStats,
    ) -> Result<PartSent> {
        let (ahead, wait) = match pace {
            Pace::Window => (usize::from(self.window), true),
            Pace::Unbounded => (usize::MAX, false),
        };
        let now = self.now();
        let queued = self.peers[i].duplex.send_part(now, head, data, part, ahead);
        self.transmit(i, now, stats)?;
        self.update_deadline();
        let must_wait = !queued || (wait && self.peers[i].duplex.is_blocked());
        Ok(PartSent { queued, must_wait })
    }

    /// Queues a whole message to peer `i` and sends what the window lets out: the
    /// offload engine's send, which never waits. `Ok(false)`: the channel has failed
    /// (reported by [`failure_of`](Self::failure_of)), and the message is dropped.
    pub(crate) fn send(
        &mut self,
        i: usize,
        data: &[u8],
        stats: &mut EndpointStats,
    ) -> Result<bool> {
        let now = self.now();
        match self.peers[i].duplex.send(now, data) {
            Ok(_) => {}
            Err(SendError::Failed) => return Ok(false),
            Err(SendError::TooLarge { len, max }) => {
                return Err(Error::MessageTooLarge { len, max });
            }
        }
        self.transmit(i, now, stats)?;
        self.update_deadline();
        Ok(true)
    }

    /// Whether peer `i`'s window is closed (no credit left).
    #[inline]
    pub(crate) fn is_blocked(&self, i: usize) -> bool {
        self.peers[i].duplex.is_blocked()
    }

    /// Peer `i`, for its address and whether it said goodbye.
    #[inline]
    pub(crate) fn peer_at(&self, i: usize) -> &Peer<L::Dest> {
        &self.peers[i]
    }

    /// Why peer `i`'s channel failed, as the endpoint reports it.
    pub(crate) fn failure_of(&self, i: usize) -> Error {
        self.peers[i].failure()
    }

    /// The bytes of a ready message.
    #[inline]
    pub(crate) fn ready_bytes<'a>(&'a self, r: &'a Ready) -> &'a [u8] {
        match r {
            Ready::Slot {
                slot, offset, len, ..
            } => &self.link.slot(*slot)[*offset..*offset + *len],
            Ready::Owned { data, .. } => data,
        }
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
        self.link.free_slot(slot);
        let now = self.last_now;
        if let Some(p) = self.peers.get_mut(peer as usize) {
            p.duplex.handle_release(now, 1);
        }
    }

    /// A message the driver assembled or copied is released: a frame copied out of the
    /// ring gives its credit back, and the buffer assembles a later long message.
    pub(crate) fn release_owned(&mut self, data: Vec<u8>, credit: Option<u32>) {
        let now = self.last_now;
        if let Some(p) = credit.and_then(|i| self.peers.get_mut(i as usize)) {
            p.duplex.handle_release(now, 1);
        }
        self.spares.give(data);
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
        self.data_frames
    }
}

/// The rendezvous key under which endpoint `dpid` of `rank` publishes its link.
pub(crate) fn net_key(rank: u32, dpid: u16) -> String {
    format!("net/{rank}/{dpid}")
}

pub(crate) fn channel_error(peer: Source, e: &ChannelError) -> Error {
    match e {
        ChannelError::Unreachable { .. } | ChannelError::Silent { .. } => Error::PeerFailed {
            rank: peer.rank,
            dpid: peer.dpid,
            reason: format!("{e} (QUIVER_PEER_TIMEOUT)"),
        },
        _ => Error::ChannelFailed {
            rank: peer.rank,
            dpid: peer.dpid,
            reason: e.to_string(),
        },
    }
}

impl<L: Link, C: Clock> Driver<L, C> {
    /// Index of a known peer: a scan while there are few (cheaper than hashing, on the
    /// path of every received frame), the map beyond.
    #[inline]
    pub(crate) fn find_peer(&self, src: Source) -> Option<usize> {
        if self.peers.len() <= 8 {
            self.peers.iter().position(|p| p.source == src)
        } else {
            self.peer_index.get(&src).copied()
        }
    }

    /// The protocol clock.
    pub(crate) fn now(&self) -> Time {
        self.clock.now()
    }

    /// Sends everything peer `i`'s channel has to send.
    pub(crate) fn transmit(
        &mut self,
        i: usize,
        now: Time,
        stats: &mut EndpointStats,
    ) -> Result<()> {
        let p = &mut self.peers[i];
        // Collect what the channel wants sent, then send it with as few system calls as
        // the link allows. Data frames are sent from the channel's own buffers (it keeps
        // them for retransmission, untouched until it handles a frame from the peer);
        // only the others, which the channel builds in one scratch buffer, are copied.
        self.batch.clear();
        self.gather.clear();
        while p.duplex.wants_transmit() {
            let Some(frame) = p.duplex.poll_transmit_kept(now) else {
                break;
            };
            stats.frames_sent += 1;
            match frame {
                TxFrame::Kept(seq) => self.batch.push(BatchFrame::Kept(seq)),
                TxFrame::Scratch => {
                    let start = self.gather.len();
                    self.gather
                        .extend_from_slice(p.duplex.sender().frame_bytes(frame));
                    self.batch
                        .push(BatchFrame::Gathered(start, self.gather.len()));
                }
            }
        }
        let sender = p.duplex.sender();
        let gather = &self.gather;
        let bytes = |o: &BatchFrame| match *o {
            BatchFrame::Kept(seq) => sender.frame_bytes(TxFrame::Kept(seq)),
            BatchFrame::Gathered(start, end) => &gather[start..end],
        };
        match self.batch.as_slice() {
            [] => Ok(()),
            // The common case (one reply, one acknowledgement) builds no list.
            [one] => self.link.send(now.as_duration(), &p.dest, bytes(one)),
            many => {
                let parts: Vec<&[u8]> = many.iter().map(bytes).collect();
                // Offloaded runs no longer on the wire than the channel's pace allows.
                let max_run = udp::run_limit(self.window, sender.srtt());
                self.link
                    .send_batch(now.as_duration(), &p.dest, &parts, max_run)
            }
        }
    }

    /// Sends a message of one frame to peer `i` at once, when the channel can take the
    /// common case ([`Duplex::send_lone`]): false, sending nothing, when the general path
    /// (`send_part`, then [`transmit`](Self::transmit)) is needed. The deadline (the
    /// channel's timers, and the link's when it holds the frame back) is only brought
    /// forward here, never put back: a deadline that comes early costs one round that
    /// finds nothing due and recomputes.
    pub(crate) fn write_lone(
        &mut self,
        i: usize,
        head: &[u8],
        body: &[u8],
        stats: &mut EndpointStats,
    ) -> Result<bool> {
        let now = self.now();
        let p = &mut self.peers[i];
        let Some(frame) = p.duplex.send_lone(now, head, body) else {
            return Ok(false);
        };
        stats.frames_sent += 1;
        self.link.send(
            now.as_duration(),
            &p.dest,
            p.duplex.sender().frame_bytes(frame),
        )?;
        if p.duplex.wants_transmit() {
            self.transmit(i, now, stats)?;
        }
        let p = &self.peers[i];
        self.next_deadline = earliest(self.next_deadline, p.duplex.poll_timeout());
        if self.caps.holds_back {
            let link = self.link.poll_timeout().map(Time::from_duration);
            self.next_deadline = earliest(self.next_deadline, link);
        }
        Ok(true)
    }

    pub(crate) fn update_deadline(&mut self) {
        let timers = self
            .peers
            .iter()
            .filter_map(|p| p.duplex.poll_timeout())
            .min();
        let link = if self.caps.holds_back {
            self.link.poll_timeout().map(Time::from_duration)
        } else {
            None
        };
        self.next_deadline = earliest(timers, link);
    }

    /// How long a sleeper may wait before the protocol needs attention.
    pub(crate) fn time_to_deadline(&self) -> Option<Duration> {
        let now = self.now();
        self.next_deadline
            .map(|t| t.as_duration().saturating_sub(now.as_duration()))
    }
}
