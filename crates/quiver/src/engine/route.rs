//! An endpoint's routes: how it reaches each destination ([`Route`]), and what it owns to
//! reach them and to receive ([`Receivers`]): the shared-memory receive area, and the
//! network driver or the offload engine (which every network send and flush uses too),
//! polled in a fixed order, with the one release path for every kind of received
//! message ([`Token`]); and the search for same-node peers that are gone
//! ([`dead_peers`]; the endpoint decides when to look).
//!
//! Guarantees: a [`Received`] message's bytes stay where they are until its token is
//! given to [`Receivers::release`]; every token is released by the receiver it came from.

use super::clock::{Clock, ProtocolClock};
use super::driver::{Driver, Ready};
use super::offload::Offload;
use super::stats::EndpointStats;
use crate::addr::Source;
use crate::error::{Error, Result};
use crate::link::network::NetLink;
use crate::link::shm::{ShmRx, ShmTx};
use crate::link::Link;
use std::collections::VecDeque;

/// A shared-memory reader polls a UDP socket (a system call) only every this many polls.
const UDP_POLL_EVERY: u32 = 16;

/// How an endpoint reaches one destination.
// Not boxed: the shared-memory route is on the fast path of every write, and a pointer
// chase there costs more than the space a network route (an index) wastes.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Route {
    /// The receiver's shared-memory ring, written directly (same node).
    Shm(ShmTx),
    /// The driver's channel to peer `peer`.
    Net { peer: usize },
    /// Through the offload engine, which owns the channel.
    Offload,
}

/// Which pool memory a received message occupies.
pub(crate) enum Token {
    /// A record in shared-memory ring `chan`.
    Shm { chan: u32, token: u64 },
    /// A slot of the network link (pool slot or ring frame), read in place.
    Net { slot: u32, peer: u32 },
    /// A record in the offload engine's delivery ring.
    Offload { token: u64 },
    /// A reassembled multi-fragment message, or a frame copied out of a packet ring.
    /// The view points into this vector, which the token keeps alive (and releasing
    /// gives back to the driver's spare buffers); releasing a copied frame also credits
    /// its channel, `credit` (an index of the driver's peers).
    Owned { data: Vec<u8>, credit: Option<u32> },
}

/// A message taken from a receiver: its bytes (valid until its token is released), its
/// sender and its token.
pub(crate) struct Received {
    pub ptr: *const u8,
    pub len: usize,
    pub source: Source,
    pub token: Token,
}

/// What one poll of the receivers found.
pub(crate) enum Polled {
    /// A message.
    Message(Received),
    /// Nothing now.
    Nothing,
    /// Errors were queued (report them before anything else).
    Errors,
}

/// What an endpoint receives through: its shared-memory receive area, and its driver or
/// offload engine (through which it also sends to the network). Generic over the
/// driver's link and clock like the driver (the simulator's stations).
pub(crate) struct Receivers<L: Link = NetLink, C: Clock = ProtocolClock> {
    pub shm: Option<ShmRx>,
    pub net: Option<Driver<L, C>>,
    /// The network side run by the offload engine's thread (instead of `net`).
    pub offload: Option<Offload>,
    /// Messages the driver made ready, not yet handed out.
    pub ready: VecDeque<Ready>,
    polls: u32,
}

impl<L: Link, C: Clock> Receivers<L, C> {
    /// The receive side of an endpoint with these parts.
    pub(crate) fn new(
        shm: Option<ShmRx>,
        net: Option<Driver<L, C>>,
        offload: Option<Offload>,
    ) -> Self {
        Receivers {
            shm,
            net,
            offload,
            ready: VecDeque::new(),
            polls: 0,
        }
    }

    /// The next message from the network side, once shared memory was found empty. An
    /// endpoint's receive order: shared memory every poll (the endpoint looks there itself,
    /// inline, as it writes there: a hop through [`Received`] cost its every read 22
    /// instructions), then the offload engine's delivery ring, then the driver: every poll
    /// when there is no shared memory or the link is read in memory, else every
    /// [`UDP_POLL_EVERY`]th (a system call; a packet ring costs a memory read, and every
    /// poll skipped there is added to the latency of the next frame, 0.2-0.3 µs on a veth
    /// ping-pong). Errors found on the way go to `errors`, and the poll stops there.
    #[inline]
    pub(crate) fn poll_network(
        &mut self,
        stats: &mut EndpointStats,
        errors: &mut VecDeque<Error>,
    ) -> Result<Polled> {
        if let Some(off) = self.offload.as_mut() {
            off.take_errors(errors);
            if !errors.is_empty() {
                return Ok(Polled::Errors);
            }
            if let Some((source, ptr, len, token)) = off.try_pop() {
                return Ok(Polled::Message(Received {
                    ptr,
                    len,
                    source,
                    token: Token::Offload { token },
                }));
            }
        }
        if self.ready.is_empty() {
            self.polls = self.polls.wrapping_add(1);
            let (shm, polls) = (self.shm.is_none(), self.polls);
            let due = |n: &Driver<L, C>| {
                shm || n.caps().polls_in_memory || polls.is_multiple_of(UDP_POLL_EVERY)
            };
            if let Some(net) = self.net.as_mut().filter(|n| due(n)) {
                net.progress(&mut self.ready, stats, errors, true)?;
                if !errors.is_empty() {
                    return Ok(Polled::Errors);
                }
            }
        }
        let Some(r) = self.ready.pop_front() else {
            return Ok(Polled::Nothing);
        };
        Ok(Polled::Message(match r {
            Ready::Slot {
                slot,
                offset,
                len,
                source,
                peer,
            } => {
                let net = self
                    .net
                    .as_ref()
                    .expect("slot messages come from the driver");
                Received {
                    ptr: net.slot_bytes(slot, offset).as_ptr(),
                    len,
                    source,
                    token: Token::Net { slot, peer },
                }
            }
            Ready::Owned {
                data,
                source,
                credit,
            } => Received {
                ptr: data.as_ptr(),
                len: data.len(),
                source,
                token: Token::Owned { data, credit },
            },
        }))
    }

    /// Gives a received message's memory back to the receiver it came from: the one
    /// release path of every kind of message. A ring's record inline (every message's
    /// path on shared memory), the others out of line.
    #[inline(always)]
    pub(crate) fn release(&mut self, t: Token) {
        match t {
            Token::Shm { chan, token } => {
                if let Some(shm) = self.shm.as_mut() {
                    shm.release(chan, token);
                }
            }
            other => self.release_other(other),
        }
    }

    /// [`Receivers::release`] of a token that is not a ring's.
    #[inline(never)]
    fn release_other(&mut self, t: Token) {
        match t {
            // Released inline by `release`: never here.
            Token::Shm { .. } => {}
            Token::Net { slot, peer } => {
                if let Some(net) = self.net.as_mut() {
                    net.release_slot(slot, peer);
                }
            }
            Token::Offload { token } => {
                if let Some(off) = self.offload.as_mut() {
                    off.release(token);
                }
            }
            Token::Owned { data, credit } => {
                if let Some(net) = self.net.as_mut() {
                    net.release_owned(data, credit);
                }
            }
        }
    }

    /// One progress round of the driver, if there is one (not with the offload engine,
    /// whose thread makes progress): what it makes ready waits here for `poll_network`.
    pub(crate) fn progress(
        &mut self,
        stats: &mut EndpointStats,
        errors: &mut VecDeque<Error>,
    ) -> Result<()> {
        match self.net.as_mut() {
            Some(net) => net.progress(&mut self.ready, stats, errors, true),
            None => Ok(()),
        }
    }

    /// The next poll looks at the driver, whatever the count (a reader about to sleep
    /// must not miss what the link holds).
    pub(crate) fn poll_net_next(&mut self) {
        self.polls = UDP_POLL_EVERY - 1;
    }
}

/// The same-node peers found gone since the last look: senders whose process left our
/// receive area, and receivers of our shm routes whose process is gone, each with why.
pub(crate) fn dead_peers(
    shm: Option<&mut ShmRx>,
    routes: &[(Source, Route)],
) -> Vec<(Source, String)> {
    let mut dead = Vec::new();
    if let Some(shm) = shm {
        for (src, pid) in shm.dead_senders() {
            dead.push((src, format!("its process {pid} is gone")));
        }
    }
    for (peer, route) in routes {
        if let Route::Shm(tx) = route {
            if let Err(Error::PeerFailed { reason, .. }) = tx.check_peer() {
                dead.push((*peer, reason));
            }
        }
    }
    dead
}
