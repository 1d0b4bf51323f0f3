//! Raw Ethernet with UDP beside it: one endpoint's network link of two sockets on one
//! interface, each carrying what it carries best.
//!
//! A raw frame has the lowest latency (no IP stack on either side, the receiver reads a
//! packet ring in memory), but it crosses the kernel one MTU-sized frame at a time: on a
//! veth at MTU 1500 about 300 MB/s, where TCP's and UDP's segmentation offload carry
//! 64 KiB through the stack at once. [`PairLink`] sends a lone frame and a short batch as
//! raw frames, and a batch of at least [`MIN_RUN`] datagrams, when its channel's pace
//! allows offloaded runs of at least [`MIN_PACE_RUN`]
//! ([`udp::run_limit`](super::udp::run_limit)), as UDP runs with `UDP_SEGMENT`. It
//! receives from both: the packet ring on every call, the UDP socket (a system call) on
//! every call while UDP traffic flows and on every [`COLD_EVERY`]th call otherwise.
//!
//! **Order.** The reliable channels repair reordering but read a hole reported by the
//! receiver as a loss (selective repeat resends at once what a later frame overtook), so
//! the link keeps each destination's frames in order as far as it can: once a run went
//! by UDP, everything to that destination goes by UDP for [`UDP_STICKS`] (a frame sent
//! by the faster path would otherwise overtake the run's tail). On a link of one queue
//! (a veth, the emulated clusters) the kernel passes the two sockets' frames in the order
//! they were sent, and the receiver reads the ring before the socket (and, when the ring
//! brought frames, the socket until it is empty, up to [`DRAIN_READS`] reads), so a
//! frame sent by raw Ethernet before a run is read before it, and one sent after it in
//! the same call or later. What is still read out of order (a receiver that did not look
//! at its socket for longer than [`UDP_STICKS`], a tail probe sent by raw Ethernet more
//! than that after the run, a NIC whose queues carry the two kinds of frame apart) makes
//! the sender resend the frames it overtook, up to a window of them: time, never data.
//! The link does not promise order ([`LinkCaps::ordered`](super::LinkCaps) is false).
//!
//! **Slots.** The ring's frames keep their numbers; the UDP pool's slots are numbered
//! from [`UDP_SLOTS`] on.
//!
//! **Peers.** The link advertises both addresses (`eth+udp,MAC,PORT,MAX,ADDR:PORT,MAX`);
//! a peer with one link of the two reaches it through that one (an endpoint that fell
//! back to UDP for want of `CAP_NET_RAW` included), and it reaches such a peer the same
//! way.

use super::eth::{EthDest, EthLink};
use super::udp::{SlotPool, SockAddr, UdpLink};
use super::Datagram;
use crate::error::Result;
use std::cell::Cell;
use std::time::Duration;

/// Slot numbers from here on are the UDP pool's (this plus the pool's slot), below it
/// the packet ring's frames. The top bit is the engine's
/// ([`EVACUATED`](crate::engine::core::EVACUATED)).
pub(crate) const UDP_SLOTS: u32 = 1 << 30;
/// Fewest datagrams a batch must hold to go by UDP.
pub(crate) const MIN_RUN: usize = 3;
/// Fewest datagrams its channel's pace must allow in one offloaded run
/// ([`udp::run_limit`](super::udp::run_limit)) for a batch to go by UDP: a link paced
/// in software (`tbf`) below a few Gbit/s cuts runs into frames on its own timer, and
/// raw frames carry more there.
pub(crate) const MIN_PACE_RUN: usize = 8;
/// After a run went by UDP, everything to its destination goes by UDP for this long.
pub(crate) const UDP_STICKS: Duration = Duration::from_millis(1);
/// Receive calls after the UDP socket last brought a datagram during which it is read
/// on every call.
const HOT_CALLS: u32 = 1024;
/// Otherwise the socket is read on every this many calls (a system call; the ring
/// costs a memory read).
pub(crate) const COLD_EVERY: u32 = 16;
/// Reads of the socket at most in a call whose ring brought frames.
pub(crate) const DRAIN_READS: usize = 4;

/// Raw Ethernet and UDP on one interface (module documentation).
pub(crate) struct PairLink {
    pub(super) eth: EthLink,
    pub(super) udp: UdpLink,
    pub(super) pool: SlotPool,
    /// Receive calls since the UDP socket last brought a datagram, as far as it was
    /// read (saturating).
    quiet: u32,
    /// Receive calls, for the cold cadence.
    calls: u32,
    /// Batches sent by UDP (for tests).
    udp_batches: Cell<u64>,
}

/// A peer with both links.
#[derive(Clone)]
pub(crate) struct PairDest {
    pub(super) eth: EthDest,
    pub(super) udp: SockAddr,
    /// Until when frames to this peer go by UDP (the protocol clock's time).
    udp_until: Cell<Duration>,
}

impl PairDest {
    pub(super) fn new(eth: EthDest, udp: SockAddr) -> PairDest {
        PairDest {
            eth,
            udp,
            udp_until: Cell::new(Duration::ZERO),
        }
    }
}

impl PairLink {
    pub(super) fn new(eth: EthLink, udp: UdpLink, pool: SlotPool) -> PairLink {
        PairLink {
            eth,
            udp,
            pool,
            quiet: HOT_CALLS,
            calls: 0,
            udp_batches: Cell::new(0),
        }
    }

    /// The largest datagram both sockets take.
    pub(super) fn max_datagram(&self) -> usize {
        self.eth.max_datagram().min(self.pool.slot_size())
    }

    /// What arrived: the ring's frames, then the socket's datagrams when it is due
    /// (with frames from the ring, all it holds: they came first).
    #[inline]
    pub(super) fn recv_batch(&mut self, out: &mut Vec<Datagram>) -> Result<()> {
        let start = out.len();
        self.eth.recv_batch(out)?;
        self.calls = self.calls.wrapping_add(1);
        if self.quiet >= HOT_CALLS
            && !self.calls.is_multiple_of(COLD_EVERY)
            && !self.udp.holds_staged()
        {
            return Ok(());
        }
        let reads = if out.len() > start { DRAIN_READS } else { 1 };
        for _ in 0..reads {
            let from = out.len();
            let read = self.udp.recv_batch(&mut self.pool, out);
            // Numbered as the pool's even when the read failed after handing some out.
            for d in &mut out[from..] {
                d.slot |= UDP_SLOTS;
            }
            read?;
            if out.len() == from {
                self.quiet = self.quiet.saturating_add(1);
                break;
            }
            self.quiet = 0;
        }
        Ok(())
    }

    /// The bytes of a received slot, in the ring or in the pool.
    #[inline]
    pub(super) fn slot(&self, slot: u32) -> &[u8] {
        if slot < UDP_SLOTS {
            self.eth.slot(slot)
        } else {
            self.pool.slot(slot - UDP_SLOTS)
        }
    }

    /// Gives a received slot back (to the ring or to the pool).
    #[inline]
    pub(super) fn free_slot(&mut self, slot: u32) {
        if slot < UDP_SLOTS {
            self.eth.free_slot(slot)
        } else {
            self.pool.free_slot(slot - UDP_SLOTS)
        }
    }

    /// Whether a datagram in `slot` came from a peer with a raw link (`raw`) and UDP
    /// address `udp`: a ring frame from a peer with a raw link (raw Ethernet cannot tell
    /// more), a datagram by UDP from the peer's address.
    pub(super) fn sent_from(&self, slot: u32, raw: bool, udp: Option<&SockAddr>) -> bool {
        match (slot < UDP_SLOTS, udp) {
            (true, _) => raw,
            (false, Some(a)) => self.pool.source(slot - UDP_SLOTS) == a.ip(),
            (false, None) => false,
        }
    }

    /// Sends one datagram: by UDP while the destination's last run is recent, else as a
    /// raw frame.
    #[inline]
    pub(super) fn send(&self, now: Duration, to: &PairDest, frame: &[u8]) -> Result<()> {
        if now < to.udp_until.get() {
            self.udp.send_datagram(&to.udp, frame)
        } else {
            self.eth.send_datagram(&to.eth, frame)
        }
    }

    /// Sends a batch: by UDP runs when it holds [`MIN_RUN`] frames and its pace allows
    /// runs of [`MIN_PACE_RUN`] (which keeps the destination on UDP for
    /// [`UDP_STICKS`]), or while the destination is on UDP; else as raw frames.
    pub(super) fn send_batch(
        &self,
        now: Duration,
        to: &PairDest,
        datagrams: &[&[u8]],
        max_run: usize,
    ) -> Result<()> {
        let runs = datagrams.len() >= MIN_RUN && max_run >= MIN_PACE_RUN && self.udp.segments();
        if runs {
            to.udp_until.set(now + UDP_STICKS);
        }
        if runs || now < to.udp_until.get() {
            self.udp_batches.set(self.udp_batches.get() + 1);
            self.udp.send_batch(&to.udp, datagrams, max_run)
        } else {
            self.eth.send_batch(&to.eth, datagrams)
        }
    }

    /// Batches sent by UDP so far.
    #[cfg(test)]
    pub(crate) fn udp_batches(&self) -> u64 {
        self.udp_batches.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::network::{NetLink, Placement};
    use crate::link::{Link, LinkParams, Transport};
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicU16, Ordering};
    use std::time::Instant;

    const DPID: u16 = 0x5a5b;

    /// A link on loopback: raw Ethernet with UDP runs (`pair`), raw Ethernet alone, or
    /// UDP alone; `None` (said why) without `CAP_NET_RAW`.
    fn open(eth: bool, runs: bool) -> Option<NetLink> {
        static NEXT: AtomicU16 = AtomicU16::new(0);
        let params = LinkParams {
            eth_wanted_by: eth.then_some("the pair tests"),
            eth_udp_runs: runs,
            eth_ring: Some(256),
            ..LinkParams::for_tests()
        };
        let at = Placement {
            ip: IpAddr::from([127, 0, 0, 1]),
            port: (std::process::id() as u16)
                .wrapping_mul(64)
                .wrapping_add(48 + NEXT.fetch_add(1, Ordering::Relaxed)),
            remote_ranks: 1,
            alone_on_node: false,
        };
        let link = NetLink::open(&params, at, DPID).unwrap();
        if eth && link.transport() != Transport::Eth {
            crate::test_support::cannot_run(
                "raw Ethernet is not available here (needs CAP_NET_RAW)",
            );
            return None;
        }
        Some(link)
    }

    /// Held by each test: raw frames on lo are seen by a link without its filter in
    /// another test, which counts them.
    fn lo_traffic() -> std::sync::RwLockReadGuard<'static, ()> {
        crate::link::eth::LO_RAW_TRAFFIC
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// A datagram of `len` bytes naming DPID where a wire header does (the ring's
    /// filter), numbered `i`.
    fn datagram(i: u8, len: usize) -> Vec<u8> {
        let mut d = vec![i; len];
        d[4..6].copy_from_slice(&DPID.to_le_bytes());
        d
    }

    /// Receives `n` datagrams on `link`: for each, its first byte and whether it came
    /// by UDP.
    fn receive(link: &mut NetLink, n: usize) -> Vec<(u8, bool)> {
        let (mut got, mut batch) = (Vec::new(), Vec::new());
        let start = Instant::now();
        while got.len() < n {
            assert!(start.elapsed() < Duration::from_secs(5), "got {got:?}");
            batch.clear();
            link.recv_batch(&mut batch).unwrap();
            for d in &batch {
                got.push((link.slot(d.slot)[0], d.slot >= UDP_SLOTS));
                link.free_slot(d.slot);
            }
        }
        got
    }

    /// Two pair links and the first's destination for the second; `None` as [`open`].
    fn two_pairs() -> Option<(NetLink, NetLink, crate::link::network::NetDest)> {
        let (a, b) = (open(true, true)?, open(true, true)?);
        let to_b = a.resolve(&b.advertise()).unwrap();
        Some((a, b, to_b))
    }

    /// `n` datagrams of 600 bytes numbered from `first`.
    fn run(first: u8, n: u8) -> Vec<Vec<u8>> {
        (first..first + n).map(|i| datagram(i, 600)).collect()
    }

    fn udp_batches(link: &NetLink) -> u64 {
        match link {
            NetLink::Pair(p) => p.udp_batches(),
            _ => panic!("not a pair"),
        }
    }

    #[test]
    fn long_batches_go_by_udp_and_keep_their_destination_there_for_a_while() {
        let _lo = lo_traffic();
        let Some((mut a, mut b, to_b)) = two_pairs() else {
            return;
        };
        assert!(matches!(to_b.to, crate::link::network::DestAddr::Pair(_)));
        let send_batch = |a: &mut NetLink, now: Duration, first: u8, n: u8, max_run: usize| {
            let frames = run(first, n);
            let parts: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            a.send_batch(now, &to_b, &parts, max_run).unwrap();
        };
        let t0 = Duration::from_secs(1);
        // A lone frame and a short batch: raw frames.
        a.send(t0, &to_b, &datagram(1, 100)).unwrap();
        send_batch(&mut a, t0, 2, (MIN_RUN - 1) as u8, 64);
        // A long batch whose pace allows only short runs (a slow paced link): raw frames.
        send_batch(&mut a, t0, 10, 20, MIN_PACE_RUN - 1);
        assert_eq!(udp_batches(&a), 0);
        let got = receive(&mut b, 1 + (MIN_RUN - 1) + 20);
        assert!(got.iter().all(|&(_, udp)| !udp), "{got:?}");
        // A long batch at a fast pace: UDP, and so is what follows it to that peer...
        send_batch(&mut a, t0, 40, 20, 64);
        a.send(t0 + UDP_STICKS / 2, &to_b, &datagram(60, 100))
            .unwrap();
        send_batch(&mut a, t0 + UDP_STICKS / 2, 61, 2, 64);
        let got = receive(&mut b, 23);
        assert!(got.iter().all(|&(_, udp)| udp), "{got:?}");
        // ... in order (one socket), ...
        let order: Vec<u8> = got.iter().map(|&(i, _)| i).collect();
        assert_eq!(order, (40..63).collect::<Vec<u8>>());
        // ... until it has been quiet for UDP_STICKS (counted from the run, not from
        // what went by UDP after it).
        a.send(t0 + UDP_STICKS, &to_b, &datagram(70, 100)).unwrap();
        assert_eq!(receive(&mut b, 1), [(70, false)]);
        assert_eq!(udp_batches(&a), 2);
    }

    #[test]
    fn a_pair_reaches_a_peer_of_either_kind_and_each_reaches_it() {
        let _lo = lo_traffic();
        let Some(mut pair) = open(true, true) else {
            return;
        };
        let mut peers = [open(true, false), open(false, false)].map(Option::unwrap);
        let dests: Vec<_> = peers
            .iter()
            .map(|p| pair.resolve(&p.advertise()).unwrap())
            .collect();
        for (i, peer) in peers.iter_mut().enumerate() {
            let udp = i == 1;
            assert!(!matches!(peer, NetLink::Pair(_)));
            // The pair sends even long batches by the peer's only link ...
            let to_peer = &dests[i];
            let frames = run(0, 20);
            let parts: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            pair.send_batch(Duration::ZERO, to_peer, &parts, 64)
                .unwrap();
            assert_eq!(receive(peer, 20).len(), 20);
            // ... and the peer reaches the pair by its own; a datagram by UDP is checked
            // against the peer's address, one by the ring is taken from a peer with a raw
            // link and not from one with UDP alone.
            let to_pair = peer.resolve(&pair.advertise()).unwrap();
            peer.send(Duration::ZERO, &to_pair, &datagram(7, 100))
                .unwrap();
            let mut batch = Vec::new();
            let start = Instant::now();
            while batch.is_empty() {
                assert!(start.elapsed() < Duration::from_secs(5));
                pair.recv_batch(&mut batch).unwrap();
            }
            let d = batch[0];
            assert_eq!((pair.slot(d.slot)[0], d.slot >= UDP_SLOTS), (7, udp));
            assert!(pair.sent_from(d.slot, to_peer));
            // Nor is it taken as the other kind of peer's.
            assert!(!pair.sent_from(d.slot, &dests[1 - i]));
            pair.free_slot(d.slot);
        }
    }

    #[test]
    fn a_quiet_socket_is_read_every_few_calls_and_a_busy_one_every_call() {
        let _lo = lo_traffic();
        let Some((mut a, mut b, to_b)) = two_pairs() else {
            return;
        };
        let frames = run(0, 4);
        let parts: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let mut batch = Vec::new();
        // Quiet: at least HOT_CALLS empty reads of the socket. A run by UDP then waits
        // at most COLD_EVERY calls.
        for _ in 0..HOT_CALLS * COLD_EVERY + COLD_EVERY {
            b.recv_batch(&mut batch).unwrap();
        }
        assert!(batch.is_empty());
        a.send_batch(Duration::ZERO, &to_b, &parts, 64).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let mut calls = 0;
        while batch.is_empty() {
            calls += 1;
            b.recv_batch(&mut batch).unwrap();
        }
        assert!(calls <= COLD_EVERY, "{calls} calls");
        for d in batch.drain(..) {
            b.free_slot(d.slot);
        }
        // Busy now: the next run is read by the first call after it arrived.
        a.send_batch(Duration::ZERO, &to_b, &parts, 64).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        b.recv_batch(&mut batch).unwrap();
        assert!(!batch.is_empty(), "a busy socket is read at once");
        for d in batch.drain(..) {
            b.free_slot(d.slot);
        }
    }
}
