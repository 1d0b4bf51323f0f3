//! An endpoint's network link: UDP datagrams or raw Ethernet frames, behind one
//! interface so that the channel layer above runs unchanged over either.
//!
//! [`NetLink`] owns the receive memory: for UDP the endpoint's slot pool, which
//! `recvmmsg` fills; for Ethernet the receive ring that the kernel fills and the process
//! reads in place (Directed Point's token buffer pool). Either way a received frame is a
//! slot index and a length, read with [`NetLink::slot`] and given back with
//! [`NetLink::free_slot`].
//!
//! Which link an endpoint gets ([`choose`]): Ethernet when `QUIVER_TRANSPORT=eth`, or when
//! the rank runs on a node of an emulated cluster (`QUIVER_CLUSTER`, set by
//! `quiver run --cluster`) and the transport is left on `auto`; UDP otherwise. Ethernet
//! needs `CAP_NET_RAW` and an interface that carries the rank's address; where either is
//! missing the endpoint takes UDP and logs one line that says why.
//!
//! Each endpoint publishes its link in the rendezvous store under `net/RANK/DPID` as
//! `udp,ADDR:PORT,MAXDGRAM` or `eth,MAC,PORT,MAXDGRAM`; a sender splits messages into
//! datagrams no longer than the smaller of its own and the receiver's maximum, which
//! follow the MTU of each side's interface (jumbo frames included).

use super::auth::Authed;
use super::eth::{self, EthDest, EthLink, Interface, MacAddr};
use super::fault::Faulty;
use super::pair::{PairDest, PairLink};
use super::udp::{SlotPool, SockAddr, UdpLink};
use super::{Datagram, Link, LinkCaps, LinkCounters, LinkParams};
use crate::error::{Error, Result};
use crate::link::Transport;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// IPv4 and UDP headers, subtracted from the MTU to get the largest UDP payload.
const IPV4_UDP_HEADERS: usize = 28;
/// IPv6 and UDP headers.
const IPV6_UDP_HEADERS: usize = 48;
/// The largest UDP payload of all.
const UDP_MAX: usize = 65507;
/// Datagram size when the MTU cannot be found.
const FALLBACK_DATAGRAM: usize = 1472;

/// The network link of one endpoint.
///
/// An explicit tag (`repr(u8)`): with three variants the compiler otherwise encodes the
/// variant in a spare bit pattern of a field, and every match on the hot paths decoded it
/// (five instructions more per release than an explicit tag, measured by callgrind).
// Not boxed: an endpoint holds one link, and the pair's every poll would chase the box.
#[allow(clippy::large_enum_variant)]
#[repr(u8)]
pub(crate) enum NetLink {
    /// A UDP socket and the slot pool its datagrams land in.
    Udp { sock: UdpLink, pool: SlotPool },
    /// An `AF_PACKET` socket with memory-mapped rings.
    Eth(EthLink),
    /// Both: raw frames for what is short, UDP runs for what is long
    /// ([`PairLink`]; the default where raw Ethernet is).
    Pair(PairLink),
    /// Either of them behind a wrapper: a fault injector (`QUIVER_FAULTS`), frame
    /// authentication (`QUIVER_AUTH`), or both (authentication outside: what the
    /// injector corrupts must fail the tag).
    Wrapped(Box<Wrapped>),
}

/// A network link behind a wrapper ([`NetLink::Wrapped`]).
pub(crate) enum Wrapped {
    Faulty(Faulty<NetLink>),
    Authed(Authed<NetLink>),
}

impl Wrapped {
    /// The wrapped link.
    pub(crate) fn inner(&self) -> &NetLink {
        match self {
            Wrapped::Faulty(f) => f.inner(),
            Wrapped::Authed(a) => a.inner(),
        }
    }
}

/// Each call goes to the wrapper, which calls the link inside.
macro_rules! wrapped {
    ($self:ident, $w:ident => $call:expr) => {
        match $self {
            Wrapped::Faulty($w) => $call,
            Wrapped::Authed($w) => $call,
        }
    };
}

impl Link for Wrapped {
    type Dest = NetDest;

    fn caps(&self) -> LinkCaps {
        wrapped!(self, w => w.caps())
    }
    fn advertise(&self) -> String {
        wrapped!(self, w => w.advertise())
    }
    fn resolve(&self, advertised: &str) -> std::result::Result<NetDest, String> {
        wrapped!(self, w => w.resolve(advertised))
    }
    fn max_datagram_to(&self, to: &NetDest) -> usize {
        wrapped!(self, w => w.max_datagram_to(to))
    }
    fn broadcast_dest(&self) -> Option<NetDest> {
        wrapped!(self, w => w.broadcast_dest())
    }
    fn broadcast_medium(&self) -> &'static str {
        wrapped!(self, w => w.broadcast_medium())
    }
    fn sent_from(&self, slot: u32, to: &NetDest) -> bool {
        wrapped!(self, w => w.sent_from(slot, to))
    }
    fn recv_batch(&mut self, out: &mut Vec<Datagram>) -> Result<()> {
        wrapped!(self, w => w.recv_batch(out))
    }
    fn slot(&self, slot: u32) -> &[u8] {
        wrapped!(self, w => w.slot(slot))
    }
    fn free_slot(&mut self, slot: u32) {
        wrapped!(self, w => w.free_slot(slot))
    }
    fn send(&mut self, now: Duration, to: &NetDest, datagram: &[u8]) -> Result<()> {
        wrapped!(self, w => w.send(now, to, datagram))
    }
    fn send_batch(
        &mut self,
        now: Duration,
        to: &NetDest,
        datagrams: &[&[u8]],
        max_run: usize,
    ) -> Result<()> {
        wrapped!(self, w => w.send_batch(now, to, datagrams, max_run))
    }
    fn blocked_slot(&self) -> Option<u32> {
        wrapped!(self, w => w.blocked_slot())
    }
    fn next_approaching(&mut self) -> Option<u32> {
        wrapped!(self, w => w.next_approaching())
    }
    fn send_unfaulted(&mut self, now: Duration, to: &NetDest, datagram: &[u8]) -> Result<()> {
        wrapped!(self, w => w.send_unfaulted(now, to, datagram))
    }
    fn poll_timeout(&self) -> Option<Duration> {
        wrapped!(self, w => w.poll_timeout())
    }
    fn handle_timeout(&mut self, now: Duration) -> Result<()> {
        wrapped!(self, w => w.handle_timeout(now))
    }
    fn counters(&self) -> LinkCounters {
        wrapped!(self, w => w.counters())
    }
}

/// Where one peer endpoint's frames go, and the largest datagram it accepts.
#[derive(Clone)]
pub(crate) struct NetDest {
    pub(crate) to: DestAddr,
    pub(crate) max_datagram: usize,
}

#[derive(Clone)]
pub(crate) enum DestAddr {
    Udp(SockAddr),
    Eth(EthDest),
    /// A peer with both links, from a [`PairLink`].
    Pair(PairDest),
}

/// Where an endpoint's rank sits in its job, as far as its network link cares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    /// The rank's address.
    pub ip: IpAddr,
    /// The rank's place among the ranks of its node: Ethernet tells the endpoints of one
    /// node apart by it.
    pub port: u16,
    /// Ranks on other nodes: Ethernet sizes its receive ring by them.
    pub remote_ranks: usize,
    /// No other rank of the job shares the node: an Ethernet link may then do without
    /// its BPF filter.
    pub alone_on_node: bool,
}

impl NetLink {
    /// Opens the link `params` ask for, for endpoint `dpid` of a rank placed `at`.
    pub(crate) fn open(params: &LinkParams, at: Placement, dpid: u16) -> Result<NetLink> {
        let mut link = Self::open_plain(params, at, dpid)?;
        if let Some(cfg) = &params.faults {
            link = NetLink::Wrapped(Box::new(Wrapped::Faulty(Faulty::new(link, cfg.clone()))));
        }
        if let Some(key) = params.auth_key {
            link = NetLink::Wrapped(Box::new(Wrapped::Authed(Authed::new(link, key))));
        }
        Ok(link)
    }

    fn open_plain(params: &LinkParams, at: Placement, dpid: u16) -> Result<NetLink> {
        let ip = at.ip;
        if let Some(wanted_by) = params.eth_wanted_by {
            match open_eth(params, at, dpid) {
                Ok(link) => return Ok(link),
                Err(why) => fall_back_once(wanted_by, &why),
            }
        }
        let (mut sock, pool) = open_udp(params, ip)?;
        if let Some(job) = params.group {
            if let Err(e) = sock.join_group(job, ip) {
                // Broadcasts then go down a tree of unicasts (the link has no broadcast).
                tracing::debug!("{e}: broadcasts will go as unicasts");
            }
        }
        Ok(NetLink::Udp { sock, pool })
    }

    /// Which transport this link is.
    pub(crate) fn transport(&self) -> Transport {
        match self {
            NetLink::Udp { .. } => Transport::Udp,
            NetLink::Eth(_) | NetLink::Pair(_) => Transport::Eth,
            NetLink::Wrapped(f) => f.inner().transport(),
        }
    }

    /// The window of this link's channels: UDP that sends runs with segmentation
    /// offload needs more frames in flight than a link that sends frame by frame. The
    /// endpoint asks once, when it opens the link, and keeps the answer even if the
    /// kernel refuses the offload later.
    pub(crate) fn channel_window(&self, params: &LinkParams) -> u16 {
        match self {
            NetLink::Udp { sock, .. } if sock.segments() => params.window_segmented,
            NetLink::Pair(_) => params.window_segmented,
            NetLink::Wrapped(f) => f.inner().channel_window(params),
            _ => params.window,
        }
    }
}

impl Link for NetLink {
    type Dest = NetDest;

    fn caps(&self) -> LinkCaps {
        match self {
            NetLink::Udp { sock, pool } => LinkCaps {
                max_datagram: pool.slot_size(),
                min_datagram: 0,
                demuxes_dpid: false,
                polls_in_memory: false,
                ordered_slots: false,
                edge_triggered: false,
                lossless: true,
                ordered: true,
                holds_back: false,
                segments: sock.segments(),
                broadcast: sock.group_fd().is_some(),
            },
            NetLink::Eth(e) => LinkCaps {
                max_datagram: e.max_datagram(),
                min_datagram: eth::MIN_FRAME,
                demuxes_dpid: true,
                polls_in_memory: true,
                ordered_slots: true,
                edge_triggered: true,
                lossless: true,
                ordered: true,
                holds_back: false,
                segments: false,
                broadcast: e.group_dest().is_some(),
            },
            NetLink::Pair(p) => LinkCaps {
                max_datagram: p.max_datagram(),
                min_datagram: eth::MIN_FRAME,
                demuxes_dpid: false,
                polls_in_memory: true,
                ordered_slots: true,
                edge_triggered: true,
                lossless: true,
                // Kept per destination as far as the link can (`pair`), not promised.
                ordered: false,
                holds_back: false,
                segments: p.udp.segments(),
                broadcast: p.eth.group_dest().is_some(),
            },
            NetLink::Wrapped(f) => f.caps(),
        }
    }

    fn advertise(&self) -> String {
        match self {
            NetLink::Udp { sock, pool } => {
                format!("udp,{},{}", sock.local_addr(), pool.slot_size())
            }
            NetLink::Eth(e) => format!("eth,{},{},{}", e.mac(), e.port(), e.max_datagram()),
            NetLink::Pair(p) => format!(
                "eth+udp,{},{},{},{},{}",
                p.eth.mac(),
                p.eth.port(),
                p.eth.max_datagram(),
                p.udp.local_addr(),
                p.pool.slot_size()
            ),
            NetLink::Wrapped(f) => f.advertise(),
        }
    }

    /// The destination a peer advertised, checked against this link's kind: a link
    /// reaches a pair's peer through the half it has, and a pair reaches either kind.
    fn resolve(&self, advertised: &str) -> std::result::Result<NetDest, String> {
        let fields: Vec<&str> = advertised.split(',').collect();
        let max_of = |s: &str| -> std::result::Result<usize, String> {
            s.parse::<usize>()
                .ok()
                .filter(|&m| (crate::wire::MIN_DATAGRAM..=u16::MAX as usize).contains(&m))
                .ok_or_else(|| format!("bad maximum datagram {s:?}"))
        };
        let eth_of = |mac: &str, port: &str, max: &str, ours: usize| {
            let mac: MacAddr = mac.parse().map_err(|e: eth::MacParseError| e.to_string())?;
            let port: u16 = port.parse().map_err(|_| format!("bad port {port:?}"))?;
            Ok::<_, String>((EthDest { mac, port }, max_of(max)?.min(ours)))
        };
        let udp_of = |addr: &str, max: &str, ours: usize| {
            let a: SocketAddr = addr
                .parse()
                .map_err(|_| format!("bad UDP address {addr:?}"))?;
            Ok::<_, String>((SockAddr::from(&a), max_of(max)?.min(ours)))
        };
        let (to, max_datagram) = match (self, fields.as_slice()) {
            (NetLink::Wrapped(f), _) => return f.resolve(advertised),
            (NetLink::Udp { pool, .. }, ["udp", addr, max]) => {
                let (a, max) = udp_of(addr, max, pool.slot_size())?;
                (DestAddr::Udp(a), max)
            }
            (NetLink::Eth(e), ["eth", mac, port, max]) => {
                let (d, max) = eth_of(mac, port, max, e.max_datagram())?;
                (DestAddr::Eth(d), max)
            }
            (NetLink::Pair(p), ["udp", addr, max]) => {
                let (a, max) = udp_of(addr, max, p.pool.slot_size())?;
                (DestAddr::Udp(a), max)
            }
            (NetLink::Pair(p), ["eth", mac, port, max]) => {
                let (d, max) = eth_of(mac, port, max, p.eth.max_datagram())?;
                (DestAddr::Eth(d), max)
            }
            // A pair's peer: both halves must make sense; a link of one kind takes its own.
            (_, ["eth+udp", mac, port, eth_max, addr, udp_max]) => {
                let (d, eth_max) = eth_of(mac, port, eth_max, usize::MAX)?;
                let (a, udp_max) = udp_of(addr, udp_max, usize::MAX)?;
                match self {
                    NetLink::Udp { pool, .. } => (DestAddr::Udp(a), udp_max.min(pool.slot_size())),
                    NetLink::Eth(e) => (DestAddr::Eth(d), eth_max.min(e.max_datagram())),
                    NetLink::Pair(p) => (
                        DestAddr::Pair(PairDest::new(d, a)),
                        eth_max.min(udp_max).min(p.max_datagram()),
                    ),
                    NetLink::Wrapped(f) => return f.resolve(advertised),
                }
            }
            (_, [kind, ..]) if ["udp", "eth", "eth+udp"].contains(kind) => {
                return Err(format!(
                    "the peer endpoint uses {kind} and this one {}: set QUIVER_TRANSPORT alike \
                     on every rank (an endpoint without CAP_NET_RAW falls back to udp)",
                    self.transport()
                ))
            }
            _ => return Err(format!("bad network address {advertised:?}")),
        };
        Ok(NetDest { to, max_datagram })
    }

    fn broadcast_dest(&self) -> Option<NetDest> {
        match self {
            NetLink::Udp { sock, pool } => sock.group_dest().map(|d| NetDest {
                to: DestAddr::Udp(d),
                max_datagram: pool.slot_size(),
            }),
            NetLink::Eth(e) => e.group_dest().map(|d| NetDest {
                to: DestAddr::Eth(d),
                max_datagram: e.max_datagram(),
            }),
            NetLink::Pair(p) => p.eth.group_dest().map(|d| NetDest {
                to: DestAddr::Eth(d),
                max_datagram: p.eth.max_datagram(),
            }),
            NetLink::Wrapped(w) => w.broadcast_dest(),
        }
    }

    /// Raw Ethernet multicast frames (eth, the pair) or IP multicast (udp).
    fn broadcast_medium(&self) -> &'static str {
        match self {
            NetLink::Udp { .. } => "ip",
            NetLink::Eth(_) | NetLink::Pair(_) => "eth",
            NetLink::Wrapped(w) => w.broadcast_medium(),
        }
    }

    fn max_datagram_to(&self, to: &NetDest) -> usize {
        match self {
            // A wrapper may take room of its own (an authentication tag).
            NetLink::Wrapped(w) => w.max_datagram_to(to),
            _ => to.max_datagram,
        }
    }

    fn sent_from(&self, slot: u32, to: &NetDest) -> bool {
        match (self, &to.to) {
            (NetLink::Udp { pool, .. }, DestAddr::Udp(a)) => pool.source(slot) == a.ip(),
            (NetLink::Pair(p), DestAddr::Udp(a)) => p.sent_from(slot, false, Some(a)),
            (NetLink::Pair(p), DestAddr::Pair(d)) => p.sent_from(slot, true, Some(&d.udp)),
            (NetLink::Pair(p), DestAddr::Eth(_)) => p.sent_from(slot, true, None),
            (NetLink::Wrapped(f), _) => f.sent_from(slot, to),
            _ => true,
        }
    }

    #[inline]
    fn recv_batch(&mut self, out: &mut Vec<Datagram>) -> Result<()> {
        match self {
            NetLink::Udp { sock, pool } => sock.recv_batch(pool, out),
            NetLink::Eth(e) => e.recv_batch(out),
            NetLink::Pair(p) => p.recv_batch(out),
            NetLink::Wrapped(f) => cold::recv_batch(f, out),
        }
    }

    #[inline]
    fn slot(&self, slot: u32) -> &[u8] {
        match self {
            NetLink::Udp { pool, .. } => pool.slot(slot),
            NetLink::Eth(e) => e.slot(slot),
            NetLink::Pair(p) => p.slot(slot),
            NetLink::Wrapped(f) => cold::slot(f, slot),
        }
    }

    #[inline]
    fn free_slot(&mut self, slot: u32) {
        // Eth asked first: a three-way match tests udp, then eth, and the eth release
        // paid the extra test (104.9 instructions against 100.9 with two variants).
        if let NetLink::Eth(e) = self {
            return e.free_slot(slot);
        }
        match self {
            NetLink::Udp { pool, .. } => pool.free_slot(slot),
            NetLink::Eth(e) => e.free_slot(slot),
            NetLink::Pair(p) => p.free_slot(slot),
            NetLink::Wrapped(f) => cold::free_slot(f, slot),
        }
    }

    #[inline]
    fn send(&mut self, now: Duration, dest: &NetDest, frame: &[u8]) -> Result<()> {
        match (self, &dest.to) {
            (NetLink::Udp { sock, .. }, DestAddr::Udp(a)) => sock.send_datagram(a, frame),
            (NetLink::Eth(e), DestAddr::Eth(d)) => e.send_datagram(d, frame),
            (NetLink::Pair(p), DestAddr::Pair(d)) => p.send(now, d, frame),
            (NetLink::Pair(p), DestAddr::Eth(d)) => p.eth.send_datagram(d, frame),
            (NetLink::Pair(p), DestAddr::Udp(a)) => p.udp.send_datagram(a, frame),
            (NetLink::Wrapped(f), _) => cold::send(f, now, dest, frame),
            _ => Err(mismatch()),
        }
    }

    /// Over UDP with segmentation offload, at most `max_run` datagrams per offloaded
    /// send (eth offloads nothing).
    fn send_batch(
        &mut self,
        now: Duration,
        dest: &NetDest,
        datagrams: &[&[u8]],
        max_run: usize,
    ) -> Result<()> {
        match (self, &dest.to) {
            (NetLink::Udp { sock, .. }, DestAddr::Udp(a)) => sock.send_batch(a, datagrams, max_run),
            (NetLink::Eth(e), DestAddr::Eth(d)) => e.send_batch(d, datagrams),
            (NetLink::Pair(p), DestAddr::Pair(d)) => p.send_batch(now, d, datagrams, max_run),
            (NetLink::Pair(p), DestAddr::Eth(d)) => p.eth.send_batch(d, datagrams),
            (NetLink::Pair(p), DestAddr::Udp(a)) => p.udp.send_batch(a, datagrams, max_run),
            (NetLink::Wrapped(f), _) => cold::send_batch(f, now, dest, datagrams, max_run),
            _ => Err(mismatch()),
        }
    }

    /// A packet ring is filled in order, a UDP pool from a free list, which no slot
    /// blocks ([`EthLink::blocked_slot`]).
    #[inline]
    fn blocked_slot(&self) -> Option<u32> {
        match self {
            NetLink::Udp { .. } => None,
            NetLink::Eth(e) => e.blocked_slot(),
            NetLink::Pair(p) => p.eth.blocked_slot(),
            NetLink::Wrapped(f) => cold::blocked_slot(f),
        }
    }

    /// [`EthLink::next_approaching`].
    #[inline]
    fn next_approaching(&mut self) -> Option<u32> {
        match self {
            NetLink::Udp { .. } => None,
            NetLink::Eth(e) => e.next_approaching(),
            NetLink::Pair(p) => p.eth.next_approaching(),
            NetLink::Wrapped(f) => cold::next_approaching(f),
        }
    }

    fn send_unfaulted(&mut self, now: Duration, dest: &NetDest, frame: &[u8]) -> Result<()> {
        match self {
            NetLink::Wrapped(f) => f.send_unfaulted(now, dest, frame),
            plain => plain.send(now, dest, frame),
        }
    }

    #[inline]
    fn poll_timeout(&self) -> Option<Duration> {
        match self {
            NetLink::Wrapped(f) => f.poll_timeout(),
            _ => None,
        }
    }

    fn handle_timeout(&mut self, now: Duration) -> Result<()> {
        match self {
            NetLink::Wrapped(f) => f.handle_timeout(now),
            _ => Ok(()),
        }
    }

    fn counters(&self) -> LinkCounters {
        match self {
            NetLink::Udp { .. } => LinkCounters::default(),
            NetLink::Eth(e) | NetLink::Pair(PairLink { eth: e, .. }) => LinkCounters {
                ring_drops: e.ring_drops(),
                misaddressed: e.misaddressed(),
                ..LinkCounters::default()
            },
            NetLink::Wrapped(f) => f.counters(),
        }
    }
}

/// The fault-injecting variant's calls on the hot paths, out of line: `Faulty` calls back
/// into `NetLink`, and keeping that recursion out of the hot methods lets them inline into
/// the driver as they did when the link had two variants (callgrind, udp ping-pong: a
/// release took 104 instructions with the recursion inline, 93 without, and 88 once
/// the enum also had an explicit tag, as before the third variant).
mod cold {
    use super::{Datagram, Link, NetDest, Result, Wrapped};
    use std::time::Duration;

    #[cold]
    #[inline(never)]
    pub(super) fn recv_batch(f: &mut Wrapped, out: &mut Vec<Datagram>) -> Result<()> {
        f.recv_batch(out)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn slot(f: &Wrapped, slot: u32) -> &[u8] {
        f.slot(slot)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn free_slot(f: &mut Wrapped, slot: u32) {
        f.free_slot(slot)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn blocked_slot(f: &Wrapped) -> Option<u32> {
        f.blocked_slot()
    }

    #[cold]
    #[inline(never)]
    pub(super) fn next_approaching(f: &mut Wrapped) -> Option<u32> {
        f.next_approaching()
    }

    #[cold]
    #[inline(never)]
    pub(super) fn send(f: &mut Wrapped, now: Duration, dest: &NetDest, frame: &[u8]) -> Result<()> {
        f.send(now, dest, frame)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn send_batch(
        f: &mut Wrapped,
        now: Duration,
        dest: &NetDest,
        frames: &[&[u8]],
        max_run: usize,
    ) -> Result<()> {
        f.send_batch(now, dest, frames, max_run)
    }
}

fn mismatch() -> Error {
    Error::Config("a destination of the other network transport (internal error)".into())
}

impl NetLink {
    /// A second descriptor a waiter must watch beside [`AsRawFd::as_raw_fd`]'s, level
    /// triggered: the UDP link's multicast group socket, once joined, or a pair's UDP
    /// socket.
    pub(crate) fn second_fd(&self) -> Option<RawFd> {
        match self {
            NetLink::Udp { sock, .. } => sock.group_fd(),
            NetLink::Eth(_) => None,
            NetLink::Pair(p) => Some(p.udp.as_raw_fd()),
            NetLink::Wrapped(f) => f.inner().second_fd(),
        }
    }
}

impl AsRawFd for NetLink {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            NetLink::Udp { sock, .. } => sock.as_raw_fd(),
            NetLink::Eth(e) => e.as_raw_fd(),
            NetLink::Pair(p) => p.eth.as_raw_fd(),
            NetLink::Wrapped(f) => f.inner().as_raw_fd(),
        }
    }
}

/// A UDP socket on `ip` and its receive pool: at least four windows of datagrams.
fn open_udp(params: &LinkParams, ip: IpAddr) -> Result<(UdpLink, SlotPool)> {
    let sock = UdpLink::bind(ip, params.udp_gso, params.udp_gro)?;
    let max = match params.datagram {
        Some(d) => d,
        None => udp_datagram_for(ip),
    };
    let window = usize::from(if params.udp_gso {
        params.window_segmented
    } else {
        params.window
    });
    let pool_bytes = params.pool_size.max(max * 4 * window);
    Ok((sock, SlotPool::new(pool_bytes, max)))
}

/// The raw Ethernet link, with UDP beside it for runs ([`PairLink`]) when
/// `params.eth_udp_runs` and segmentation offload are on.
fn open_eth(params: &LinkParams, at: Placement, dpid: u16) -> Result<NetLink> {
    let pair = params.eth_udp_runs && params.udp_gso;
    // A pair's channels have the window of UDP runs, which the ring must hold too
    // (frames by UDP stop at runs' pace; the rest comes by the ring).
    let mut ring_params = params.clone();
    if pair {
        ring_params.window = params.window_segmented;
    }
    let eth = open_eth_only(&ring_params, at, dpid)?;
    if !pair {
        return Ok(NetLink::Eth(eth));
    }
    let (sock, pool) = open_udp(params, at.ip)?;
    Ok(NetLink::Pair(PairLink::new(eth, sock, pool)))
}

fn open_eth_only(params: &LinkParams, at: Placement, dpid: u16) -> Result<EthLink> {
    let mut iface = Interface::with_addr(at.ip)?.ok_or_else(|| {
        Error::Config(format!(
            "no network interface carries this rank's address {}",
            at.ip
        ))
    })?;
    if let Some(d) = params.datagram {
        // An explicit datagram size caps the frames as it caps UDP datagrams.
        iface.mtu = iface.mtu.min(d + 2);
    }
    // Each rank of another node may fill two windows here: its unicast channel's and,
    // once it broadcasts, its group channel's.
    let senders = at.remote_ranks * if params.group.is_some() { 2 } else { 1 };
    let frames = params.eth_ring_frames(senders, eth::rx_frame_bytes(iface.mtu));
    let mut link = EthLink::open(&iface, at.port, dpid, frames, at.alone_on_node)?;
    if let Some(job) = params.group {
        if let Err(e) = link.join_group(job) {
            // Broadcasts then go down a tree of unicasts (the link has no broadcast).
            tracing::warn!("{e}: broadcasts will go as unicasts");
        }
    }
    Ok(link)
}

/// Logs, once per process, why an endpoint that wanted Ethernet took UDP.
fn fall_back_once(wanted_by: &str, why: &Error) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        let hint = if eth::is_permission(why) {
            " (raw Ethernet needs CAP_NET_RAW)"
        } else {
            ""
        };
        tracing::warn!(
            "raw Ethernet asked for by {wanted_by} is not available{hint}: {why}; using udp"
        );
    }
}

/// The largest UDP payload that fits the MTU of the interface carrying `ip`; on loopback
/// (udp between ranks of one host, a test path) the Ethernet size, as before MTUs were
/// followed: with 64 KiB datagrams every message is one frame read in place, so a
/// receiver that does not read holds a credit per message and its senders block after
/// a window of messages rather than a window of frames, which the conformance suite's
/// all-to-all under injected loss turned into a deadlock of ranks all blocked in `write`.
fn udp_datagram_for(ip: IpAddr) -> usize {
    if ip.is_loopback() {
        return FALLBACK_DATAGRAM;
    }
    let headers = if ip.is_ipv4() {
        IPV4_UDP_HEADERS
    } else {
        IPV6_UDP_HEADERS
    };
    match Interface::with_addr(ip) {
        Ok(Some(i)) if i.mtu > headers + crate::wire::MIN_DATAGRAM => {
            (i.mtu - headers).min(UDP_MAX)
        }
        _ => FALLBACK_DATAGRAM,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp_link(params: &LinkParams) -> NetLink {
        let at = Placement {
            ip: IpAddr::from([127, 0, 0, 1]),
            port: 0,
            remote_ranks: 1,
            alone_on_node: false,
        };
        NetLink::open(params, at, 0).unwrap()
    }

    #[test]
    fn udp_with_segmentation_offload_gets_the_larger_window() {
        let mut params = LinkParams::for_tests();
        assert_eq!(udp_link(&params).channel_window(&params), 128);
        params.udp_gso = false;
        assert_eq!(udp_link(&params).channel_window(&params), 64);
    }
}
