//! The sans-IO core of an endpoint's network side: what a received frame means and what
//! to send, without a socket, a clock or a rendezvous store (the counterpart of
//! quinn-proto's `Endpoint`; [`super::driver::Driver`] is the I/O around it).
//!
//! [`Core`] owns the frame checks (decoding, job, token and address), the peer table
//! with one reliable channel ([`Duplex`]) and one reassembly channel ([`RxChannel`]) per
//! peer endpoint, delivery into [`Ready`] messages, the copies of frames evacuated from
//! a link's ring, and the timers' deadline. It reads received frames in the memory the
//! link lends it ([`SlotMemory`]): a frame it accepts, it gives back exactly once
//! (itself, or through the [`Ready`] message's release); a datagram it refuses
//! ([`Checked::Dropped`], [`Checked::Corrupted`]) the caller gives back. It never
//! receives, sends or reads a clock: time comes in as an argument, and what is to be
//! sent goes out as a [`Transmit`] the driver sends.
//!
//! One progress round calls it in this order (the driver's `progress`):
//!
//! 1. on a poll that received nothing, [`Core::evacuate`] for a slot the link's ring is
//!    stopped at, if any;
//! 2. [`Core::begin_round`]; then for every received datagram, [`Core::check`]; an
//!    accepted frame from a peer not in the table yet needs the driver to resolve its
//!    address ([`Core::add_peer`]); then [`Core::handle_frame`], which delivers a whole
//!    message taken in order at once and hands every other frame to its channel;
//! 3. [`Core::evacuate`] for every slot the link's ring is about to come round to;
//! 4. when a frame went to a channel or a timer is due, [`Core::handle_round`]: timers,
//!    delivery of in-order frames (reassembled when a message spans several), channel
//!    events;
//! 5. [`Core::poll_transmit`] for every peer, and the driver sends what it returns (then
//!    calls the link's own timeout when it holds frames back);
//! 6. [`Core::update_deadline`], with the link's own deadline when it holds frames back.
//!
//! Sending ([`Core::send_lone`], [`Core::send_part`], [`Core::send`]) is called between
//! rounds and followed by `poll_transmit` for the peer concerned; releasing
//! ([`Core::release_slot`], [`Core::release_owned`]) only credits the channel, whose
//! acknowledgement leaves with the next round.

use super::group::Members;
use super::stats::EndpointStats;
use crate::addr::Source;
use crate::channel::reliable::{
    self, earliest, AckStamp, ChannelError, Duplex, Event, PartialSend, Sack, SendError, Time,
    TxFrame,
};
use crate::channel::{Delivery, RxChannel, SpareBuffers};
use crate::error::{Error, Result};
use crate::link::udp;
use crate::link::Link;
use crate::wire::{self, DecodeError, Flags, FrameKind, Header};
use crate::FastMap;
use std::collections::VecDeque;

/// Marks the slot number of a frame copied out of the link's ring ([`Core::evacuate`]):
/// the low bits index the core's copies instead of the link's slots, which therefore
/// never have this bit set (a pair link numbers its UDP slots from
/// [`UDP_SLOTS`](crate::link::pair::UDP_SLOTS), below it).
pub(crate) const EVACUATED: u32 = 1 << 31;

/// The receive memory a link lends the core: a received frame stays in its slot until
/// the core (or the application, through a [`Ready::Slot`]) frees it.
pub(crate) trait SlotMemory {
    /// The bytes of received slot `slot`.
    fn slot(&self, slot: u32) -> &[u8];
    /// Gives slot `slot` back to the link.
    fn free_slot(&mut self, slot: u32);
}

impl<L: Link> SlotMemory for L {
    #[inline]
    fn slot(&self, slot: u32) -> &[u8] {
        Link::slot(self, slot)
    }

    #[inline]
    fn free_slot(&mut self, slot: u32) {
        Link::free_slot(self, slot)
    }
}

/// Who this endpoint is, and the limits it applies to what it receives.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub job_id: u32,
    /// The low 32 bits of the job's token, which every frame carries.
    pub token: u32,
    pub rank: u32,
    /// Ranks in the job: a frame from a rank beyond is misaddressed.
    pub size: u32,
    pub dpid: u16,
    /// The largest message delivered (`QUIVER_MAX_MESSAGE`).
    pub max_message: usize,
    /// The reliable channels' configuration (its `max_datagram` and `window` are set
    /// per peer and per link).
    pub reliable: reliable::Config,
    /// Frames in a channel's window, which the link's receive memory bounds.
    pub window: u16,
}

/// A received frame a channel holds: where it lies in receive memory, and what the first
/// decode found, so that delivery needs no second pass over the bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxFrame {
    pub(crate) slot: u32,
    pub(crate) seq: u32,
    pub(crate) flags: Flags,
    pub(crate) total_len: Option<u32>,
    pub(crate) data_off: u32,
    pub(crate) data_len: u32,
}

/// What a channel of the peer table is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    /// The one reliable channel with a peer endpoint, both ways.
    Unicast,
    /// This endpoint's group channel: its broadcasts, to the link's broadcast address
    /// (its `source` is [`Source::group`] of this endpoint's DPID).
    GroupTx,
    /// The group channel of root `source`, received here; this side only acknowledges,
    /// to the root's address.
    GroupRx,
}

/// One peer endpoint reached over the network (or, for a group channel, the group).
pub(crate) struct Peer<D> {
    pub(crate) source: Source,
    pub(crate) role: Role,
    pub(super) dest: D,
    pub(super) duplex: Duplex<RxFrame>,
    pub(super) rx: RxChannel,
    /// The peer said goodbye: nothing it has not acknowledged will be.
    pub(crate) closed: bool,
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

/// A message delivered to the endpoint, until the application releases it.
pub(crate) enum Ready {
    /// Read in place, in a slot of the link's receive memory.
    Slot {
        slot: u32,
        offset: usize,
        len: usize,
        source: Source,
        peer: u32,
    },
    /// In a buffer of its own: reassembled, or copied out of the ring.
    Owned {
        data: Vec<u8>,
        source: Source,
        /// The channel to credit when the message is released: a frame copied out of
        /// the ring still holds its receive buffer ([`Core::evacuate`]). `None` for a
        /// reassembled message, whose frames were credited as they were copied.
        credit: Option<u32>,
    },
}

/// This endpoint's group channel: its place in the peer table and its members.
struct GroupTx {
    peer: usize,
    members: Members,
}

/// What [`Core::check`] made of a datagram.
pub(crate) enum Checked {
    /// A frame of this job addressed to this endpoint, from `Header::src_rank` and
    /// `src_dpid` (whose peer may not be in the table yet).
    Frame(Header, RxFrame),
    /// Dropped and counted: the caller gives the slot back to the link.
    Dropped,
    /// Dropped as corrupted (its checksum failed), with the header it came with, which
    /// names this job, its token and this endpoint: the caller gives the slot back to the
    /// link and, if the header names a known peer whose address the datagram came from,
    /// tells that peer's channel ([`Core::report_corrupted`]).
    Corrupted(Header),
}

/// What [`Core::poll_transmit`] has for the driver to send to one peer.
pub(crate) enum Transmit<'a, D> {
    Nothing,
    /// One frame (the common case: a reply, an acknowledgement), with no list built.
    One(&'a D, &'a [u8]),
    /// Several frames, which the link sends in runs of at most `max_run` frames.
    Batch {
        dest: &'a D,
        frames: Vec<&'a [u8]>,
        max_run: usize,
    },
}

/// A frame of one transmit batch ([`Core::poll_transmit`]).
#[derive(Debug, Clone, Copy)]
enum BatchFrame {
    /// A data frame the channel keeps, by sequence number.
    Kept(u32),
    /// Bytes `start..end` of the gather buffer.
    Gathered(usize, usize),
}

/// The sans-IO core of an endpoint's network side (module documentation: what it owns
/// and the order of calls in a round).
pub(crate) struct Core<D> {
    me: Identity,
    peers: Vec<Peer<D>>,
    peer_index: FastMap<(Source, Role), usize>,
    /// This endpoint's group channel, once it broadcast.
    group: Option<GroupTx>,
    /// When the next round is needed: the earliest channel timer, or the link's when it
    /// holds frames back.
    next_deadline: Option<Time>,
    /// The time of the round in progress or the last one (releases use it: they need
    /// not read the clock).
    last_now: Time,
    /// Whether the round in progress may deliver messages.
    delivering: bool,
    /// Frames of a round that may not deliver are still queued in their channels: no
    /// later frame may overtake them by the whole-message path.
    undelivered: bool,
    /// Buffers of released reassembled messages, for the next long message.
    spares: SpareBuffers,
    /// Frames copied out of the link's ring, indexed by `slot & !EVACUATED`.
    evacuated: Vec<Option<Vec<u8>>>,
    batch: Vec<BatchFrame>,
    gather: Vec<u8>,
    /// Data frames received (a flush waits for them to stop).
    data_frames: u64,
    evacuations: u64,
}

impl<D> Core<D> {
    pub(crate) fn new(me: Identity) -> Core<D> {
        Core {
            me,
            peers: Vec::new(),
            peer_index: FastMap::default(),
            group: None,
            next_deadline: None,
            last_now: Time::ZERO,
            delivering: true,
            undelivered: false,
            spares: SpareBuffers::default(),
            evacuated: Vec::new(),
            batch: Vec::new(),
            gather: Vec::new(),
            data_frames: 0,
            evacuations: 0,
        }
    }

    /// Who this endpoint is.
    pub(crate) fn identity(&self) -> &Identity {
        &self.me
    }

    /// Checks that a datagram belongs here (this job, its token, this endpoint, a rank
    /// of the job) and only then decodes it (checksum, body). Counts and drops what does
    /// not belong or does not decode: a foreign frame costs no checksum and no peer
    /// hears of it. A corrupted frame whose header names this job, token and endpoint
    /// comes back as [`Checked::Corrupted`], for the caller to report (mode `none`
    /// reports it, `host` lets retransmission repair it).
    #[inline]
    pub(crate) fn check(&mut self, slot: u32, bytes: &[u8], stats: &mut EndpointStats) -> Checked {
        let h = match Header::parse(bytes) {
            Ok(h) => h,
            Err(_) => {
                stats.dropped_malformed += 1;
                return Checked::Dropped;
            }
        };
        if h.job_id != self.me.job_id {
            stats.dropped_foreign_job += 1;
            return Checked::Dropped;
        } else if h.token != self.me.token {
            stats.dropped_bad_token += 1;
            return Checked::Dropped;
        } else if h.dst_dpid != self.me.dpid || h.src_rank >= self.me.size {
            stats.dropped_misaddressed += 1;
            return Checked::Dropped;
        }
        let rxf = match wire::decode_parsed(h, bytes) {
            Ok(frame) => {
                let data = frame.data();
                RxFrame {
                    slot,
                    seq: frame.header.seq,
                    flags: frame.header.flags,
                    total_len: frame.total_len(),
                    data_off: (data.as_ptr() as usize - bytes.as_ptr() as usize) as u32,
                    data_len: data.len() as u32,
                }
            }
            Err(e) => {
                stats.dropped_malformed += 1;
                if let DecodeError::Checksum { .. } = e {
                    return Checked::Corrupted(h);
                }
                return Checked::Dropped;
            }
        };
        Checked::Frame(h, rxf)
    }

    /// Peer `i` sent a frame that failed its checksum ([`Checked::Corrupted`]): its
    /// channel hears of it.
    #[cold]
    pub(crate) fn report_corrupted(&mut self, now: Time, i: usize) {
        self.peers[i].duplex.handle_invalid(now);
    }

    /// Where peer `i` lives.
    #[inline]
    pub(crate) fn peer_dest(&self, i: usize) -> &D {
        &self.peers[i].dest
    }
}

/// The peer table.
impl<D> Core<D> {
    /// Index of a known peer's unicast channel: a scan while there are few (cheaper than
    /// hashing, on the path of every received frame), the map beyond.
    #[inline]
    pub(crate) fn find_peer(&self, src: Source) -> Option<usize> {
        self.find_channel(src, Role::Unicast)
    }

    /// Index of the channel of `role` with `src` (for [`Role::GroupTx`], `src` is
    /// [`Source::group`] of this endpoint's DPID).
    #[inline]
    pub(crate) fn find_channel(&self, src: Source, role: Role) -> Option<usize> {
        if self.peers.len() <= 8 {
            self.peers
                .iter()
                .position(|p| p.source == src && p.role == role)
        } else {
            self.peer_index.get(&(src, role)).copied()
        }
    }

    /// Adds endpoint `source`, reached at `dest` with datagrams of at most
    /// `max_datagram` bytes, and returns its index.
    pub(crate) fn add_peer(
        &mut self,
        source: Source,
        dest: D,
        max_datagram: usize,
    ) -> Result<usize> {
        self.add_channel(source, Role::Unicast, dest, max_datagram)
    }

    /// Adds a channel of `role` with `source` at `dest`. A group channel has no
    /// liveness of its own (no heartbeats, no silence timeout): the unicast channels of
    /// its root and members watch the endpoints.
    pub(crate) fn add_channel(
        &mut self,
        source: Source,
        role: Role,
        dest: D,
        max_datagram: usize,
    ) -> Result<usize> {
        let mut reliable = reliable::Config {
            max_datagram,
            window: self.me.window,
            ..self.me.reliable.clone()
        };
        let mut template = self.header_to(FrameKind::Data, source.dpid);
        match role {
            Role::Unicast => {}
            Role::GroupTx | Role::GroupRx => {
                reliable.heartbeat = None;
                reliable.peer_timeout = None;
                // A member that stops answering holds the group back until its unicast
                // channel finds it gone (QUIVER_PEER_TIMEOUT), never fails the group.
                reliable.max_timeouts = u32::MAX;
                template.flags = if role == Role::GroupTx {
                    Flags::GROUP
                } else {
                    Flags::GROUP_REPLY
                };
            }
        }
        let duplex = Duplex::new(&reliable, template)
            .map_err(|e| Error::Config(format!("reliable channels: {e}")))?;
        let i = self.peers.len();
        self.peers.push(Peer {
            source,
            role,
            dest,
            duplex,
            rx: RxChannel::new(),
            closed: false,
        });
        self.peer_index.insert((source, role), i);
        Ok(i)
    }

    /// Peers in the table (indices run from 0).
    #[inline]
    pub(crate) fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Peer `i`, for its address and whether it said goodbye.
    #[inline]
    pub(crate) fn peer_at(&self, i: usize) -> &Peer<D> {
        &self.peers[i]
    }

    /// The header of a frame from this endpoint to endpoint `dst_dpid` (sequence,
    /// acknowledgement and checksum fields left for the channel to fill).
    fn header_to(&self, kind: FrameKind, dst_dpid: u16) -> Header {
        Header {
            kind,
            flags: Flags::EMPTY,
            src_dpid: self.me.dpid,
            dst_dpid,
            credits: 0,
            src_rank: self.me.rank,
            job_id: self.me.job_id,
            token: self.me.token,
            seq: 0,
            ack: 0,
            checksum: 0,
        }
    }

    /// The goodbye frame to every peer that has not said goodbye itself, so that none
    /// waits for this endpoint.
    pub(crate) fn goodbyes(&self) -> impl Iterator<Item = (&D, [u8; wire::HEADER_LEN])> {
        let unicast = |p: &&Peer<D>| p.role == Role::Unicast && !p.closed;
        self.peers.iter().filter(unicast).map(|p| {
            let mut bytes = [0u8; wire::HEADER_LEN];
            self.header_to(FrameKind::Goodbye, p.source.dpid)
                .emit_sealed(&mut bytes, &[]);
            (&p.dest, bytes)
        })
    }
}

/// Group channels ([`super::group`]): this endpoint's broadcasts, and what its members
/// acknowledge.
impl<D> Core<D> {
    /// The index of this endpoint's group channel, once opened.
    #[inline]
    pub(crate) fn group_channel(&self) -> Option<usize> {
        self.group.as_ref().map(|g| g.peer)
    }

    /// Opens this endpoint's group channel: frames of at most `max_datagram` bytes to
    /// `dest` (the link's broadcast address), acknowledged by the endpoints whose
    /// unicast channels are `members`.
    pub(crate) fn open_group(
        &mut self,
        dest: D,
        max_datagram: usize,
        members: &[usize],
    ) -> Result<usize> {
        let source = Source::group(self.me.dpid);
        let i = self.add_channel(source, Role::GroupTx, dest, max_datagram)?;
        let members = members.iter().map(|&m| (self.peers[m].source, m));
        self.group = Some(GroupTx {
            peer: i,
            members: Members::new(members, self.me.window),
        });
        Ok(i)
    }

    /// The unicast channel of group member `source`, if it is one (a reply to the group
    /// channel must come from that member's address).
    pub(crate) fn group_member(&self, source: Source) -> Option<usize> {
        let g = self.group.as_ref()?;
        g.members.index_of(source).map(|m| g.members.peer_of(m))
    }

    /// A member's reply to this endpoint's group channel (a checked `GROUP_REPLY` frame,
    /// from the member's address): its acknowledgement, credits and holes move the
    /// group. False when the sender is no member (the caller counts it).
    pub(crate) fn handle_group_reply(&mut self, h: &Header) -> bool {
        let now = self.last_now;
        let Some(g) = self.group.as_mut() else {
            return false;
        };
        let Some(m) = g.members.index_of(source_of(h)) else {
            return false;
        };
        // A member's side of the channel sends acknowledgements only; and where
        // checksums are on, an unsealed frame is not trusted.
        if h.kind != FrameKind::Ack
            || (self.me.reliable.checksums() && !h.flags.contains(Flags::CHECKSUM))
        {
            return true;
        }
        let sender = self.peers[g.peer].duplex.sender();
        let guard = sender.srtt().unwrap_or(self.me.reliable.rto_min / 2);
        let stamp = AckStamp {
            ack: h.ack,
            credits: h.credits,
        };
        g.members.handle_reply(
            m,
            now,
            (stamp, Sack::of(h.flags, h.seq)),
            sender.sent_end(),
            guard,
            |seq| sender.kept_frame(seq).is_some(),
        );
        self.settle_group();
        true
    }

    /// Hands the group channel's sender what its live members acknowledged together
    /// (a member whose unicast channel failed or closed no longer counts).
    fn settle_group(&mut self) {
        let Some(g) = self.group.as_mut() else {
            return;
        };
        for m in 0..g.members.len() {
            let p = &self.peers[g.members.peer_of(m)];
            g.members.set_live(m, !p.closed && !p.duplex.is_failed());
        }
        let p = &mut self.peers[g.peer];
        let sender = p.duplex.sender();
        let stamp = g
            .members
            .agreed(sender.oldest_unacked(), sender.sent_end(), self.me.window);
        p.duplex.handle_group_ack(self.last_now, stamp);
    }
}

/// Receiving: one round, in the order of the module documentation.
impl<D> Core<D> {
    /// Starts a round at `now`; `deliver` false (the offload engine's ring is full)
    /// leaves frames queued in their channels, and turns the whole-message path off
    /// until a round that delivers.
    #[inline]
    pub(crate) fn begin_round(&mut self, now: Time, deliver: bool) {
        self.last_now = now;
        self.delivering = deliver;
    }

    /// Hands a checked frame from peer `i` to its channel. A whole message taken in
    /// order, with nothing queued before it, goes to `ready` at once (header prediction:
    /// no queue, and no pass over every channel unless this one has something to send).
    /// True when the round must run the channels ([`Core::handle_round`]).
    #[inline]
    pub(crate) fn handle_frame(
        &mut self,
        i: usize,
        h: &Header,
        rxf: RxFrame,
        ready: &mut VecDeque<Ready>,
        mem: &mut impl SlotMemory,
    ) -> bool {
        let now = self.last_now;
        self.data_frames += u64::from(h.kind == FrameKind::Data);
        let p = &mut self.peers[i];
        if self.delivering
            && !self.undelivered
            && h.flags.contains(Flags::FIRST | Flags::LAST)
            && p.rx
                .takes_whole(h.seq, rxf.data_len as usize, self.me.max_message)
            && p.duplex.take_in_order(now, h)
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
                return true;
            }
            self.next_deadline = earliest(self.next_deadline, p.duplex.poll_timeout());
            return false;
        }
        if let Some(back) = p.duplex.handle_frame(now, h, rxf) {
            free_frame(mem, &mut self.evacuated, back.slot);
        }
        true
    }

    /// Runs the channels after the frames of a round (`touched`: some frame went to a
    /// channel) or when a timer is due: fires due timers, delivers in-order frames
    /// (reassembling messages of several frames) if the round may deliver, and turns
    /// channel events into errors.
    pub(crate) fn handle_round(
        &mut self,
        touched: bool,
        mem: &mut impl SlotMemory,
        ready: &mut VecDeque<Ready>,
        stats: &mut EndpointStats,
        errors: &mut VecDeque<Error>,
    ) {
        let (now, deliver) = (self.last_now, self.delivering);
        let due = self.next_deadline.is_some_and(|t| t <= now);
        // Frames left queued in their channels now are delivered by a later round that
        // may deliver; until then no frame may overtake them.
        if deliver {
            self.undelivered = false;
        } else if touched {
            self.undelivered = true;
        }
        let max_message = self.me.max_message;
        if self.group.is_some() {
            self.settle_group();
        }
        for (i, p) in self.peers.iter_mut().enumerate() {
            if due && p.duplex.poll_timeout().is_some_and(|t| t <= now) {
                p.duplex.handle_timeout(now);
            }
            while let Some(d) = deliver.then(|| p.duplex.poll_deliver()).flatten() {
                let (off, len) = (d.data_off as usize, d.data_len as usize);
                let data = &frame_bytes(mem, &self.evacuated, d.slot)[off..off + len];
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
                        free_frame(mem, &mut self.evacuated, d.slot);
                        p.duplex.handle_release(now, 1);
                    }
                    Delivery::None => {
                        free_frame(mem, &mut self.evacuated, d.slot);
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
    pub(crate) fn evacuate(
        &mut self,
        slot: u32,
        mem: &mut impl SlotMemory,
        ready: &mut VecDeque<Ready>,
    ) -> bool {
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
                    let data = mem.slot(slot)[offset..offset + len].to_vec();
                    *r = Ready::Owned {
                        data,
                        source,
                        credit: Some(peer),
                    };
                    mem.free_slot(slot);
                    self.evacuations += 1;
                    return true;
                }
            }
        }
        for p in &mut self.peers {
            if let Some(f) = p.duplex.kept_mut().find(|f| f.slot == slot) {
                let end = (f.data_off + f.data_len) as usize;
                let copy = mem.slot(slot)[..end].to_vec();
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
                mem.free_slot(slot);
                self.evacuations += 1;
                return true;
            }
        }
        false
    }

    /// Data frames received so far (a flush waits for them to stop).
    pub(crate) fn data_frames(&self) -> u64 {
        self.data_frames
    }
}

/// Sending: what the personalities ask, and what the channels want on the wire.
impl<D> Core<D> {
    /// Everything peer `i`'s channel has to send now. Data frames are lent from the
    /// channel's own buffers (it keeps them for retransmission, untouched until it
    /// handles a frame from the peer); only the others, which the channel builds in one
    /// scratch buffer, are gathered here.
    pub(crate) fn poll_transmit(
        &mut self,
        i: usize,
        now: Time,
        stats: &mut EndpointStats,
    ) -> Transmit<'_, D> {
        self.batch.clear();
        self.gather.clear();
        if let Some(g) = self.group.as_mut().filter(|g| g.peer == i) {
            // Frames members reported missing go first, to the whole group.
            let duplex = &mut self.peers[i].duplex;
            for seq in g.members.take_repairs() {
                if duplex.note_repair(seq, now) {
                    g.members.count_repair();
                    stats.frames_sent += 1;
                    self.batch.push(BatchFrame::Kept(seq));
                }
            }
        }
        let p = &mut self.peers[i];
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
            [] => Transmit::Nothing,
            [one] => Transmit::One(&p.dest, bytes(one)),
            many => Transmit::Batch {
                dest: &p.dest,
                frames: many.iter().map(bytes).collect(),
                // Offloaded runs no longer on the wire than the channel's pace allows.
                max_run: udp::run_limit(self.me.window, sender.srtt()),
            },
        }
    }

    /// Whether peer `i`'s channel has something to send.
    #[inline]
    pub(crate) fn wants_transmit(&self, i: usize) -> bool {
        self.peers[i].duplex.wants_transmit()
    }

    /// A message of one frame to peer `i`, when the channel can take the common case
    /// ([`Duplex::send_lone`]): its frame, for the driver to send at once. `None`,
    /// having queued nothing, when the general path (`begin_send`, `send_part`) is
    /// needed.
    #[inline]
    pub(crate) fn send_lone(
        &mut self,
        i: usize,
        now: Time,
        head: &[u8],
        body: &[u8],
    ) -> Option<(&D, &[u8])> {
        let p = &mut self.peers[i];
        let frame = p.duplex.send_lone(now, head, body)?;
        Some((&p.dest, p.duplex.sender().frame_bytes(frame)))
    }

    /// The longest message that travels to peer `i` in one frame.
    pub(crate) fn lone_max(&self, i: usize) -> usize {
        self.peers[i].duplex.sender().lone_max()
    }

    /// Starts a message of `len` bytes to peer `i` on the general path.
    pub(crate) fn begin_send(&self, i: usize, len: usize) -> Result<PartialSend> {
        let p = &self.peers[i];
        match p.duplex.begin_send(len) {
            Ok(part) => Ok(part),
            Err(SendError::Failed) => Err(p.failure()),
            Err(SendError::TooLarge { len, max }) => Err(Error::MessageTooLarge { len, max }),
        }
    }

    /// Builds the next frames of the message `part` to peer `i`, up to `ahead` frames
    /// beyond the window: true once its last frame is built.
    pub(crate) fn send_part(
        &mut self,
        i: usize,
        now: Time,
        (head, data): (&[u8], &[u8]),
        part: &mut PartialSend,
        ahead: usize,
    ) -> bool {
        self.peers[i].duplex.send_part(now, head, data, part, ahead)
    }

    /// Queues a whole message to peer `i`, never waiting. `Ok(false)`: the channel has
    /// failed (reported by [`failure_of`](Self::failure_of)), and the message is dropped.
    pub(crate) fn send(&mut self, i: usize, now: Time, data: &[u8]) -> Result<bool> {
        match self.peers[i].duplex.send(now, data) {
            Ok(_) => Ok(true),
            Err(SendError::Failed) => Ok(false),
            Err(SendError::TooLarge { len, max }) => Err(Error::MessageTooLarge { len, max }),
        }
    }

    /// Frames built for peer `i` and waiting for its window, and the window's size.
    pub(crate) fn waiting_frames(&self, i: usize) -> (usize, usize) {
        (
            self.peers[i].duplex.sender().queued_frames(),
            usize::from(self.identity().window),
        )
    }

    /// Whether peer `i`'s window is closed (no credit left).
    #[inline]
    pub(crate) fn is_blocked(&self, i: usize) -> bool {
        self.peers[i].duplex.is_blocked()
    }

    /// Why peer `i`'s channel failed, as the endpoint reports it.
    pub(crate) fn failure_of(&self, i: usize) -> Error {
        self.peers[i].failure()
    }

    /// Asks every channel to acknowledge now (the start of a flush).
    pub(crate) fn flush_acks(&mut self) {
        for p in &mut self.peers {
            p.duplex.flush_ack();
        }
    }

    /// Whether some channel still has unacknowledged frames towards a live peer.
    pub(crate) fn unacknowledged(&self) -> bool {
        self.peers
            .iter()
            .any(|p| !p.closed && !p.duplex.is_idle() && !p.duplex.sender().is_failed())
    }

    /// Frames towards live peers not acknowledged yet: built and waiting for the window,
    /// or sent and unacknowledged.
    pub(crate) fn backlog(&self) -> u64 {
        self.peers
            .iter()
            .filter(|p| !p.closed && !p.duplex.sender().is_failed())
            .map(|p| {
                p.duplex.sender().queued_frames() as u64 + u64::from(p.duplex.sender().in_flight())
            })
            .sum()
    }

    /// The error of a channel whose peer stopped answering, if any.
    pub(crate) fn failed_channel(&self) -> Option<Error> {
        self.peers
            .iter()
            .find(|p| !p.closed && p.duplex.is_failed())
            .map(Peer::failure)
    }
}

/// Releasing what was delivered, and the deadline.
impl<D> Core<D> {
    /// The bytes of a ready message.
    #[inline]
    pub(crate) fn ready_bytes<'a>(mem: &'a impl SlotMemory, r: &'a Ready) -> &'a [u8] {
        match r {
            Ready::Slot {
                slot, offset, len, ..
            } => &mem.slot(*slot)[*offset..*offset + *len],
            Ready::Owned { data, .. } => data,
        }
    }

    /// A message read in place from `slot` is released: the slot goes back to the link,
    /// and its receive buffer is a credit for the sending peer.
    #[inline]
    pub(crate) fn release_slot(&mut self, mem: &mut impl SlotMemory, slot: u32, peer: u32) {
        mem.free_slot(slot);
        let now = self.last_now;
        if let Some(p) = self.peers.get_mut(peer as usize) {
            p.duplex.handle_release(now, 1);
        }
    }

    /// A message the core assembled or copied is released: a frame copied out of the
    /// ring gives its credit back, and the buffer assembles a later long message.
    pub(crate) fn release_owned(&mut self, data: Vec<u8>, credit: Option<u32>) {
        let now = self.last_now;
        if let Some(p) = credit.and_then(|i| self.peers.get_mut(i as usize)) {
            p.duplex.handle_release(now, 1);
        }
        self.spares.give(data);
    }

    /// When the next round is needed.
    #[inline]
    pub(crate) fn deadline(&self) -> Option<Time> {
        self.next_deadline
    }

    /// Brings the deadline forward to `t` if that is earlier (never puts it back: a
    /// deadline that comes early costs one round that finds nothing due).
    #[inline]
    pub(crate) fn bring_deadline_forward(&mut self, t: Option<Time>) {
        self.next_deadline = earliest(self.next_deadline, t);
    }

    /// Peer `i`'s channel timers, brought into the deadline after a send.
    #[inline]
    pub(crate) fn note_timers_of(&mut self, i: usize) {
        let t = self.peers[i].duplex.poll_timeout();
        self.bring_deadline_forward(t);
    }

    /// Recomputes the deadline: the earliest channel timer, or `link`, the link's own
    /// deadline when it holds frames back.
    pub(crate) fn update_deadline(&mut self, link: Option<Time>) {
        let timers = self
            .peers
            .iter()
            .filter_map(|p| p.duplex.poll_timeout())
            .min();
        self.next_deadline = earliest(timers, link);
    }

    /// Adds the channels' counters to `st` (and the evacuations out of the ring).
    pub(crate) fn add_counters(&self, st: &mut EndpointStats) {
        for p in &self.peers {
            let c = p.duplex.counters();
            st.retransmissions += c.retransmissions;
            st.timeouts += c.timeouts;
            st.fast_retransmits += c.fast_retransmits;
            st.tail_probes += c.tail_probes;
            st.checksum_failures += c.checksum_failures;
            st.duplicates += c.duplicates;
            st.out_of_order += c.out_of_order;
            st.credit_stalls += c.credit_stalls;
            st.acks_sent += c.acks_explicit;
        }
        if let Some(g) = &self.group {
            // A repair is a fast retransmission to the whole group.
            st.fast_retransmits += g.members.repairs_sent();
            st.dropped_misaddressed += g.members.bad_replies();
        }
        st.ring_evacuations = self.evacuations;
    }
}

/// The bytes of a kept frame: in the link's slot, or in its copy.
#[inline]
fn frame_bytes<'a>(
    mem: &'a impl SlotMemory,
    evacuated: &'a [Option<Vec<u8>>],
    slot: u32,
) -> &'a [u8] {
    if slot & EVACUATED == 0 {
        mem.slot(slot)
    } else {
        evacuated
            .get((slot & !EVACUATED) as usize)
            .and_then(Option::as_deref)
            .unwrap_or(&[])
    }
}

/// Gives back a kept frame: its slot to the link, or its copy.
#[inline]
fn free_frame(mem: &mut impl SlotMemory, evacuated: &mut [Option<Vec<u8>>], slot: u32) {
    if slot & EVACUATED == 0 {
        mem.free_slot(slot);
    } else if let Some(copy) = evacuated.get_mut((slot & !EVACUATED) as usize) {
        *copy = None;
    }
}

/// The endpoint that sent a frame.
#[inline]
pub(crate) fn source_of(h: &Header) -> Source {
    Source {
        rank: h.src_rank,
        dpid: h.src_dpid,
    }
}

/// Turns a channel's failure into the error the endpoint reports.
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

#[cfg(test)]
mod tests {
    //! Two cores talk through plain memory: what one sends is copied into the other's
    //! "receive memory", with no link, socket or clock.

    use super::*;

    /// Receive memory: one buffer per slot, and which slots are free.
    #[derive(Default)]
    struct Memory {
        slots: Vec<Vec<u8>>,
        freed: Vec<bool>,
    }

    impl Memory {
        fn put(&mut self, bytes: &[u8]) -> u32 {
            self.slots.push(bytes.to_vec());
            self.freed.push(false);
            (self.slots.len() - 1) as u32
        }

        fn all_free(&self) -> bool {
            self.freed.iter().all(|&f| f)
        }
    }

    impl SlotMemory for Memory {
        fn slot(&self, slot: u32) -> &[u8] {
            assert!(
                !self.freed[slot as usize],
                "slot {slot} read after it was freed"
            );
            &self.slots[slot as usize]
        }

        fn free_slot(&mut self, slot: u32) {
            assert!(!self.freed[slot as usize], "slot {slot} freed twice");
            self.freed[slot as usize] = true;
        }
    }

    const JOB: u32 = 77;
    const TOKEN: u32 = 0xfeed_f00d;

    fn identity(rank: u32) -> Identity {
        Identity {
            job_id: JOB,
            token: TOKEN,
            rank,
            size: 2,
            dpid: 3,
            max_message: 1 << 20,
            reliable: reliable::Config::default(),
            window: 16,
        }
    }

    fn source(rank: u32) -> Source {
        Source { rank, dpid: 3 }
    }

    /// Rank 0 and rank 1, each knowing the other (its "address" is its rank).
    fn pair() -> (Core<u32>, Core<u32>) {
        let mut a = Core::new(identity(0));
        let mut b = Core::new(identity(1));
        assert_eq!(a.add_peer(source(1), 1, 1472).unwrap(), 0);
        assert_eq!(b.add_peer(source(0), 0, 1472).unwrap(), 0);
        (a, b)
    }

    /// Everything `from` has for its peer 0, as owned frames.
    fn drain(from: &mut Core<u32>, now: Time) -> Vec<Vec<u8>> {
        let mut stats = EndpointStats::default();
        match from.poll_transmit(0, now, &mut stats) {
            Transmit::Nothing => vec![],
            Transmit::One(_, f) => vec![f.to_vec()],
            Transmit::Batch { frames, .. } => frames.iter().map(|f| f.to_vec()).collect(),
        }
    }

    /// One round of `to` over `frames`, as the driver runs it; `deliver` false: a round
    /// that may not deliver (the offload engine's ring full).
    fn receive(
        to: &mut Core<u32>,
        mem: &mut Memory,
        now: Time,
        frames: &[Vec<u8>],
        ready: &mut VecDeque<Ready>,
        stats: &mut EndpointStats,
        deliver: bool,
    ) -> Vec<Error> {
        let mut errors = VecDeque::new();
        to.begin_round(now, deliver);
        let mut touched = false;
        for f in frames {
            let slot = mem.put(f);
            match to.check(slot, f, stats) {
                Checked::Frame(h, rxf) => {
                    let i = to.find_peer(source_of(&h)).expect("a known peer");
                    touched |= to.handle_frame(i, &h, rxf, ready, mem);
                }
                Checked::Dropped => mem.free_slot(slot),
                Checked::Corrupted(h) => {
                    if let Some(i) = to.find_peer(source_of(&h)) {
                        to.report_corrupted(now, i);
                        touched = true;
                    }
                    mem.free_slot(slot);
                }
            }
        }
        if touched || to.deadline().is_some_and(|t| t <= now) {
            to.handle_round(touched, mem, ready, stats, &mut errors);
        }
        errors.into()
    }

    fn at(ms: u64) -> Time {
        Time::from_duration(std::time::Duration::from_millis(ms))
    }

    #[test]
    fn a_lone_frame_is_delivered_in_place_and_its_release_frees_the_slot() {
        let (mut a, mut b) = pair();
        let mut mem = Memory::default();
        let (dest, frame) = a.send_lone(0, at(1), b"head:", b"body").unwrap();
        assert_eq!(*dest, 1);
        let frame = frame.to_vec();
        let (mut ready, mut stats) = (VecDeque::new(), EndpointStats::default());
        let errors = receive(
            &mut b,
            &mut mem,
            at(2),
            &[frame],
            &mut ready,
            &mut stats,
            true,
        );
        assert!(errors.is_empty());
        assert_eq!(ready.len(), 1);
        let r = ready.pop_front().unwrap();
        assert_eq!(Core::<u32>::ready_bytes(&mem, &r), b"head:body");
        let Ready::Slot {
            slot,
            peer,
            source: from,
            ..
        } = r
        else {
            panic!("a whole frame is read in place");
        };
        assert_eq!(from, source(0));
        assert!(!mem.all_free());
        b.release_slot(&mut mem, slot, peer);
        assert!(mem.all_free());
        assert_eq!(b.data_frames(), 1);
    }

    #[test]
    fn frames_that_do_not_belong_are_dropped_and_counted() {
        let (mut a, mut b) = pair();
        let frame = a.send_lone(0, at(1), b"", b"x").unwrap().1.to_vec();
        let h = Header::parse(&frame).unwrap();
        let resealed = |edit: &dyn Fn(&mut Header)| {
            let mut h = h;
            edit(&mut h);
            let mut out = [0u8; wire::HEADER_LEN];
            let body = &frame[wire::HEADER_LEN..];
            h.emit_sealed(&mut out, &[body]);
            [&out[..], body].concat()
        };
        let frames = [
            resealed(&|h| h.job_id = JOB + 1),
            resealed(&|h| h.token = TOKEN ^ 1),
            resealed(&|h| h.dst_dpid = 4),
            resealed(&|h| h.src_rank = 2),
            frame[..5].to_vec(),
        ];
        let (mut mem, mut ready, mut stats) =
            (Memory::default(), VecDeque::new(), EndpointStats::default());
        let errors = receive(
            &mut b,
            &mut mem,
            at(2),
            &frames,
            &mut ready,
            &mut stats,
            true,
        );
        assert!(errors.is_empty() && ready.is_empty());
        assert_eq!(stats.dropped_foreign_job, 1);
        assert_eq!(stats.dropped_bad_token, 1);
        assert_eq!(stats.dropped_misaddressed, 2);
        assert_eq!(stats.dropped_malformed, 1);
        assert!(mem.all_free());
        assert_eq!(b.data_frames(), 0);
    }

    #[test]
    fn a_corrupted_frame_of_a_known_peer_reaches_its_channel() {
        let (mut a, mut b) = pair();
        let mut frame = a.send_lone(0, at(1), b"", b"payload").unwrap().1.to_vec();
        *frame.last_mut().unwrap() ^= 0x40;
        let (mut mem, mut stats) = (Memory::default(), EndpointStats::default());
        let slot = mem.put(&frame);
        let Checked::Corrupted(h) = b.check(slot, &frame, &mut stats) else {
            panic!("a corrupted frame of this job, token and endpoint")
        };
        b.report_corrupted(at(2), b.find_peer(source_of(&h)).expect("a known peer"));
        assert_eq!(stats.dropped_malformed, 1);
        let mut counters = EndpointStats::default();
        b.add_counters(&mut counters);
        assert_eq!(counters.checksum_failures, 1);
    }

    /// Issue 28, item 6: a corrupted frame that names this job but not its token (or
    /// not this endpoint) is nobody's: it is dropped as what it is, and no channel hears
    /// of it (with reliability `none`, hearing of it fails the channel).
    #[test]
    fn a_corrupted_frame_without_the_token_is_charged_to_no_peer() {
        let (mut a, mut b) = pair();
        let good = a.send_lone(0, at(1), b"", b"payload").unwrap().1.to_vec();
        let (mut mem, mut stats) = (Memory::default(), EndpointStats::default());
        for (field, counter) in [(16..20, "token"), (4..6, "endpoint")] {
            let mut frame = good.clone();
            frame[field.start] ^= 1;
            *frame.last_mut().unwrap() ^= 0x40;
            let slot = mem.put(&frame);
            assert!(
                matches!(b.check(slot, &frame, &mut stats), Checked::Dropped),
                "a frame with another {counter}"
            );
            mem.free_slot(slot);
        }
        assert_eq!(
            (stats.dropped_bad_token, stats.dropped_misaddressed),
            (1, 1)
        );
        assert_eq!(stats.dropped_malformed, 0, "no checksum was spent on them");
        let mut counters = EndpointStats::default();
        b.add_counters(&mut counters);
        assert_eq!(counters.checksum_failures, 0);
    }

    #[test]
    fn a_long_message_is_reassembled_acknowledged_and_every_slot_freed() {
        let (mut a, mut b) = pair();
        let msg: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let mut part = a.begin_send(0, msg.len()).unwrap();
        assert!(a.send_part(0, at(1), (&[], &msg), &mut part, usize::MAX));
        let frames = drain(&mut a, at(1));
        assert!(frames.len() >= 4, "5000 bytes take several frames");
        let (mut mem, mut ready, mut stats) =
            (Memory::default(), VecDeque::new(), EndpointStats::default());
        let errors = receive(
            &mut b,
            &mut mem,
            at(2),
            &frames,
            &mut ready,
            &mut stats,
            true,
        );
        assert!(errors.is_empty());
        let Some(Ready::Owned { data, credit, .. }) = ready.pop_front() else {
            panic!("a message of several frames is assembled");
        };
        assert_eq!(data, msg);
        assert_eq!(credit, None);
        assert!(mem.all_free(), "reassembly gives every frame back");
        // The acknowledgement goes back and empties the sender's window.
        b.flush_acks();
        let acks = drain(&mut b, at(3));
        assert!(!acks.is_empty());
        assert!(a.unacknowledged());
        let mut amem = Memory::default();
        receive(
            &mut a,
            &mut amem,
            at(4),
            &acks,
            &mut VecDeque::new(),
            &mut stats,
            true,
        );
        assert!(!a.unacknowledged());
        assert!(amem.all_free());
    }

    #[test]
    fn evacuation_copies_a_ready_frame_out_and_keeps_its_credit() {
        let (mut a, mut b) = pair();
        let frame = a.send_lone(0, at(1), b"", b"keep me").unwrap().1.to_vec();
        let (mut mem, mut ready, mut stats) =
            (Memory::default(), VecDeque::new(), EndpointStats::default());
        receive(
            &mut b,
            &mut mem,
            at(2),
            &[frame],
            &mut ready,
            &mut stats,
            true,
        );
        let Some(&Ready::Slot { slot, .. }) = ready.front() else {
            panic!("read in place");
        };
        assert!(b.evacuate(slot, &mut mem, &mut ready));
        assert!(mem.all_free());
        let Some(Ready::Owned { data, credit, .. }) = ready.pop_front() else {
            panic!("copied out");
        };
        assert_eq!(data, b"keep me");
        assert_eq!(credit, Some(0));
        b.release_owned(data, credit);
        // A slot nobody holds is not the core's to move.
        let other = mem.put(b"unrelated");
        assert!(!b.evacuate(other, &mut mem, &mut ready));
    }

    /// The bytes of a ready message, and gives it back.
    fn take(core: &mut Core<u32>, mem: &mut Memory, r: Ready) -> Vec<u8> {
        let bytes = Core::<u32>::ready_bytes(mem, &r).to_vec();
        match r {
            Ready::Slot { slot, peer, .. } => core.release_slot(mem, slot, peer),
            Ready::Owned { data, credit, .. } => core.release_owned(data, credit),
        }
        bytes
    }

    #[test]
    fn a_frame_a_channel_keeps_is_copied_out_of_the_ring_and_delivered_in_order() {
        // Selective repeat: the receiver keeps a frame that arrives out of order.
        let selective = || Identity {
            reliable: reliable::Config {
                recovery: reliable::Recovery::Selective,
                ..reliable::Config::default()
            },
            ..identity(0)
        };
        let mut a = Core::new(selective());
        let mut b = Core::new(Identity {
            rank: 1,
            ..selective()
        });
        a.add_peer(source(1), 1, 1472).unwrap();
        b.add_peer(source(0), 0, 1472).unwrap();
        let first = a.send_lone(0, at(1), b"", b"first").unwrap().1.to_vec();
        let second = a.send_lone(0, at(1), b"", b"second").unwrap().1.to_vec();
        let (mut mem, mut ready, mut stats) =
            (Memory::default(), VecDeque::new(), EndpointStats::default());
        // The second arrives first: its channel keeps it, out of order.
        receive(
            &mut b,
            &mut mem,
            at(2),
            &[second],
            &mut ready,
            &mut stats,
            true,
        );
        assert!(ready.is_empty());
        // The ring comes round to it: copied out, its slot given back.
        assert!(b.evacuate(0, &mut mem, &mut ready));
        assert!(mem.all_free());
        let mut counters = EndpointStats::default();
        b.add_counters(&mut counters);
        assert_eq!(counters.ring_evacuations, 1);
        // The gap fills: both are delivered in order, the second from its copy, keeping
        // its credit until it is released.
        receive(
            &mut b,
            &mut mem,
            at(3),
            &[first],
            &mut ready,
            &mut stats,
            true,
        );
        assert_eq!(ready.len(), 2);
        let r = ready.pop_front().unwrap();
        assert_eq!(take(&mut b, &mut mem, r), b"first");
        let r = ready.pop_front().unwrap();
        assert!(matches!(
            r,
            Ready::Owned {
                credit: Some(0),
                ..
            }
        ));
        assert_eq!(take(&mut b, &mut mem, r), b"second");
        assert!(mem.all_free());
    }

    #[test]
    fn a_round_that_may_not_deliver_keeps_frames_queued_and_in_order() {
        let (mut a, mut b) = pair();
        let one = a.send_lone(0, at(1), b"", b"one").unwrap().1.to_vec();
        let two = a.send_lone(0, at(1), b"", b"two").unwrap().1.to_vec();
        let (mut mem, mut ready, mut stats) =
            (Memory::default(), VecDeque::new(), EndpointStats::default());
        // The offload engine's ring is full: nothing is delivered, even in order.
        receive(
            &mut b,
            &mut mem,
            at(2),
            &[one],
            &mut ready,
            &mut stats,
            false,
        );
        assert!(ready.is_empty());
        // The next frame may not overtake it by the whole-message path.
        receive(
            &mut b,
            &mut mem,
            at(3),
            &[two],
            &mut ready,
            &mut stats,
            true,
        );
        let got: Vec<Vec<u8>> = std::iter::from_fn(|| ready.pop_front())
            .map(|r| take(&mut b, &mut mem, r))
            .collect();
        assert_eq!(got, [b"one".to_vec(), b"two".to_vec()]);
        assert!(mem.all_free());
    }

    #[test]
    fn goodbyes_go_to_every_peer_that_has_not_left() {
        let (a, _) = pair();
        let byes: Vec<_> = a.goodbyes().collect();
        assert_eq!(byes.len(), 1);
        let (dest, bytes) = &byes[0];
        assert_eq!(**dest, 1);
        let frame = wire::decode(bytes).unwrap();
        assert_eq!(frame.header.kind, FrameKind::Goodbye);
        assert_eq!((frame.header.job_id, frame.header.token), (JOB, TOKEN));
    }
}
