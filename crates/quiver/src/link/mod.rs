//! Link layer: transports that move frames between endpoints.
//!
//! Two kinds of route leave an endpoint, and they stay two:
//!
//! - [`shm`]: message-granular rings in shared memory between processes of one node,
//!   written directly by the sender. Already reliable and ordered, no wire header, no
//!   slot to give back to a pool: it does not fit the datagram model below, and is not
//!   forced into it.
//! - Datagram links, behind the [`Link`] trait: [`udp`], [`eth`] and the two together
//!   ([`pair`]: raw frames for what is short, UDP runs for what is long), through
//!   [`network::NetLink`], the production enum; the simulated network's link (`sim`,
//!   tests only), and [`fault::Faulty`], which wraps any of them to inject faults. What
//!   distinguishes them is written in [`LinkCaps`], so that the engine asks instead of
//!   matching on the transport.
#[cfg(not(loom))]
pub(crate) mod auth;
#[cfg(not(loom))]
pub mod cma;
#[cfg(not(loom))]
pub(crate) mod eth;
#[cfg(not(loom))]
pub mod fault;
#[cfg(not(loom))]
pub(crate) mod network;
#[cfg(not(loom))]
pub(crate) mod pair;
pub mod shm;
#[cfg(all(test, not(loom)))]
pub mod sim;
#[cfg(not(loom))]
pub mod udp;
// Compiled (and tested) always; the eth link calls it only with the feature.
#[cfg(not(loom))]
#[cfg_attr(not(feature = "eth-turnaround"), allow(dead_code))]
mod turnaround;

#[cfg(all(test, not(loom)))]
mod conformance;

#[cfg(not(loom))]
use crate::error;
#[cfg(not(loom))]
use std::time::Duration;

/// What opening an endpoint's network link takes ([`network::NetLink::open`]), built by
/// the layer above from its configuration: the link layer reads no configuration itself.
#[derive(Debug, Clone)]
pub(crate) struct LinkParams {
    /// Raw Ethernet is wanted, and by what (named in the line that says why it fell back
    /// to UDP); `None`: UDP.
    pub eth_wanted_by: Option<&'static str>,
    /// Send runs of equal datagrams with UDP segmentation offload.
    pub udp_gso: bool,
    /// Where raw Ethernet is opened, open UDP beside it for runs ([`pair::PairLink`];
    /// needs `udp_gso`).
    pub eth_udp_runs: bool,
    /// Receive coalesced runs with UDP receive offload while traffic streams.
    pub udp_gro: bool,
    /// Largest datagram, if fixed; else it follows the interface MTU.
    pub datagram: Option<usize>,
    /// Bytes of the receive pool (udp; at least four windows of datagrams).
    pub pool_size: usize,
    /// Channel window of a link that sends frame by frame.
    pub window: u16,
    /// Channel window of UDP that sends runs with segmentation offload.
    pub window_segmented: u16,
    /// Frames of the Ethernet receive ring, if fixed; else [`LinkParams::eth_ring_frames`].
    pub eth_ring: Option<usize>,
    /// Faults to inject into what the link sends ([`fault::Faulty`]).
    #[cfg(not(loom))]
    pub faults: Option<fault::FaultConfig>,
    /// The job's frame key, when frames are signed and checked (`auth::Authed`).
    pub auth_key: Option<[u8; 32]>,
    /// The job whose broadcasts the link receives (raw Ethernet joins the job's
    /// multicast group); `None`: none.
    pub group: Option<u32>,
}

#[cfg(not(loom))]
impl LinkParams {
    /// Parameters for a link in a test: udp with offloads, windows of 64 and 128 frames,
    /// a 1 MiB pool, no faults.
    #[cfg(test)]
    pub(crate) fn for_tests() -> LinkParams {
        LinkParams {
            eth_wanted_by: None,
            udp_gso: true,
            eth_udp_runs: false,
            udp_gro: true,
            datagram: None,
            pool_size: 1 << 20,
            window: 64,
            window_segmented: 128,
            eth_ring: None,
            faults: None,
            auth_key: None,
            group: None,
        }
    }

    /// Frames of the Ethernet receive ring of an endpoint with `remote_ranks` possible
    /// senders on other nodes and frames of `frame_bytes` ([`eth::ring_frames`]).
    pub(crate) fn eth_ring_frames(&self, remote_ranks: usize, frame_bytes: usize) -> usize {
        self.eth_ring
            .unwrap_or_else(|| eth::ring_frames(self.window, remote_ranks, frame_bytes))
    }
}

#[cfg(not(loom))]
/// What a datagram link guarantees and how it wants to be driven (DESIGN.md section 2: "a
/// transport says what it guarantees").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkCaps {
    /// Largest datagram the link receives (a receive slot's size).
    pub max_datagram: usize,
    /// Shortest datagram the link delivers.
    pub min_datagram: usize,
    /// The link delivers only datagrams that name the receiving endpoint: a wire header's
    /// `dst_dpid` (eth's BPF filter); the others carry whatever they are given.
    pub demuxes_dpid: bool,
    /// Looking for received datagrams costs no system call (a packet ring, the
    /// simulator): the engine may look at every poll.
    pub polls_in_memory: bool,
    /// Slots are filled in ring order, so a slot held too long stops reception
    /// ([`Link::blocked_slot`], [`Link::next_approaching`]): the engine copies out what it
    /// keeps before the ring comes round to it.
    pub ordered_slots: bool,
    /// A sleeper waits for the link's descriptor edge-triggered (a packet ring stays
    /// readable while its newest frame is held).
    pub edge_triggered: bool,
    /// Every datagram sent to a live peer arrives, once and intact (on a healthy host:
    /// loopback udp and eth, the simulator without faults); false when faults are
    /// injected. The reliable channels never rely on it; tests do.
    pub lossless: bool,
    /// Datagrams to one destination arrive in the order they were sent.
    pub ordered: bool,
    /// The link may hold a datagram back after `send` returns (injected delays), and
    /// sends it from [`Link::handle_timeout`] when [`Link::poll_timeout`] says; the driver
    /// calls those two only for such a link.
    pub holds_back: bool,
    /// The link sends runs of equal datagrams in one call (UDP segmentation offload).
    pub segments: bool,
    /// The link can send one datagram to every endpoint of the job's DPID on the other
    /// nodes at once ([`Link::broadcast_dest`]; GAMMA's native broadcast): raw Ethernet
    /// (a multicast frame), UDP over IPv4 (IP multicast) and the simulator.
    pub broadcast: bool,
}

#[cfg(not(loom))]
/// Counters a link keeps for the endpoint's statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LinkCounters {
    /// Frames the kernel dropped because the receive ring was full (eth).
    pub ring_drops: u64,
    /// Frames given back unread, addressed to another host or port (eth without filter).
    pub misaddressed: u64,
    /// What an injector did, when the link is wrapped in [`fault::Faulty`].
    pub faults: fault::FaultCounters,
    /// Datagrams dropped because their tag was wrong or missing (`auth::Authed`).
    pub unauthenticated: u64,
}

#[cfg(not(loom))]
/// A datagram link: sends datagrams to destinations it resolved from their advertised
/// form, and hands received datagrams out as slots of memory it owns until they are
/// given back.
///
/// Contract, which `conformance` tests for every implementation:
/// - `recv_batch` never blocks; it appends what has arrived, each datagram in its own
///   slot, readable with [`slot`](Link::slot) (its first `len` bytes) until
///   [`free_slot`](Link::free_slot). Slots not given back are never reused.
/// - A destination comes only from [`resolve`](Link::resolve) of what a peer's
///   [`advertise`](Link::advertise) produced; any other text is an error, never a panic.
/// - `now` is the caller's clock, passed in so that a wrapper that delays datagrams
///   ([`fault::Faulty`]) needs no clock of its own; such a link asks to be called back
///   with [`poll_timeout`](Link::poll_timeout) and [`handle_timeout`](Link::handle_timeout).
pub(crate) trait Link {
    /// Where datagrams to one peer go.
    type Dest: Clone;
    /// What the link guarantees.
    fn caps(&self) -> LinkCaps;
    /// What peers need to reach this link (the rendezvous value).
    fn advertise(&self) -> String;
    /// The destination a peer advertised.
    fn resolve(&self, advertised: &str) -> std::result::Result<Self::Dest, String>;
    /// Largest datagram to send to `to`: the smaller of its maximum and ours.
    fn max_datagram_to(&self, to: &Self::Dest) -> usize;
    /// With [`LinkCaps::broadcast`]: the destination whose every datagram reaches every
    /// endpoint of this job and DPID on the other nodes at once (GAMMA's native
    /// broadcast); `None` without.
    fn broadcast_dest(&self) -> Option<Self::Dest> {
        None
    }
    /// What carries [`broadcast_dest`](Link::broadcast_dest)'s datagrams: a peer hears
    /// them only if its link broadcasts over the same medium (raw Ethernet multicast and
    /// IP multicast do not reach each other).
    fn broadcast_medium(&self) -> &'static str {
        "link"
    }
    /// Whether the datagram in `slot` came from where `to` lives, as far as the link
    /// can tell (udp: the sender's IP address is `to`'s; its port is not checked, since
    /// a peer sends from a connected socket of its own). A link that cannot tell says
    /// true.
    fn sent_from(&self, slot: u32, to: &Self::Dest) -> bool {
        let _ = (slot, to);
        true
    }
    /// Appends the datagrams that have arrived, without blocking.
    fn recv_batch(&mut self, out: &mut Vec<Datagram>) -> error::Result<()>;
    /// The bytes of received slot `slot` (the datagram is its first `len` bytes).
    fn slot(&self, slot: u32) -> &[u8];
    /// Gives a received slot back for new datagrams.
    fn free_slot(&mut self, slot: u32);
    /// Sends one datagram.
    fn send(&mut self, now: Duration, to: &Self::Dest, datagram: &[u8]) -> error::Result<()>;
    /// Sends several datagrams to one destination, with as few system calls as the link
    /// allows (runs of at most `max_run` under segmentation offload); by default one by
    /// one.
    fn send_batch(
        &mut self,
        now: Duration,
        to: &Self::Dest,
        datagrams: &[&[u8]],
        _max_run: usize,
    ) -> error::Result<()> {
        for d in datagrams {
            self.send(now, to, d)?;
        }
        Ok(())
    }
    /// With [`LinkCaps::ordered_slots`]: the held slot at which reception has stopped.
    fn blocked_slot(&self) -> Option<u32> {
        None
    }
    /// With [`LinkCaps::ordered_slots`]: a held slot the ring comes round to soon.
    fn next_approaching(&mut self) -> Option<u32> {
        None
    }
    /// Sends one datagram past any fault injection: a closing endpoint's goodbye, which
    /// nothing would send again and which the injector left alone before it became a link.
    fn send_unfaulted(
        &mut self,
        now: Duration,
        to: &Self::Dest,
        datagram: &[u8],
    ) -> error::Result<()> {
        self.send(now, to, datagram)
    }
    /// When the link next needs [`handle_timeout`](Link::handle_timeout).
    fn poll_timeout(&self) -> Option<Duration> {
        None
    }
    /// Does what was due by `now` (sends delayed datagrams).
    fn handle_timeout(&mut self, _now: Duration) -> error::Result<()> {
        Ok(())
    }
    /// The link's counters.
    fn counters(&self) -> LinkCounters {
        LinkCounters::default()
    }
}

/// A received datagram, as every network link hands it out: the slot that holds it
/// (a pool slot on udp, a ring frame on eth) and its length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Datagram {
    pub slot: u32,
    pub len: usize,
}

/// The transports quiver can use between two endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Shared-memory receive rings (same node).
    Shm,
    /// UDP datagrams.
    Udp,
    /// Raw Ethernet frames (`AF_PACKET`).
    Eth,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Shm => "shm",
            Transport::Udp => "udp",
            Transport::Eth => "eth",
        })
    }
}

/// `setsockopt(fd, level, opt, value)` for an option of any plain type (the socket
/// options of the network links).
pub(crate) fn setsockopt<T>(
    fd: &impl std::os::fd::AsRawFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: &T,
) -> std::io::Result<()> {
    // SAFETY: `value` is a valid T for the duration of the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            value as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// [`copy_bytes`] between slices: copies all of `src` to the start of `dst`, which must
/// be at least as long (a shorter one panics, as `copy_from_slice` does).
#[inline]
pub(crate) fn copy_into(dst: &mut [u8], src: &[u8]) {
    let dst = &mut dst[..src.len()];
    // SAFETY: `dst` and `src` are two live slices of `src.len()` bytes; `dst` is borrowed
    // mutably, so they cannot overlap.
    unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), src.len()) };
}

/// Copies `len` bytes from `src` to `dst` as `std::ptr::copy_nonoverlapping` does, but
/// around a slow case of the CPU's string copy: glibc's `memcpy` copies from a few KiB
/// on with `rep movsb`, which on this machine's AMD EPYC runs at a fraction of its speed
/// when the destination lies 1 to 63 bytes after the source modulo 4 KiB (an endpoint's
/// write of a page-aligned 64 KiB buffer lands 32 bytes after a page boundary of the
/// ring: 18-25 GB/s instead of 34-37; docs/DESIGN-NOTES.md, "Buffer alignment and single
/// copies"). There the copy goes in pieces of [`SHORT_DISTANCE_PIECE`] bytes, below the
/// size from which glibc uses `rep movsb` with AVX2 or wider, which it copies with
/// vector loads and stores. Copies from [`SHORT_DISTANCE_MAX`] on are left whole:
/// from a size that depends on the cache glibc copies with non-temporal stores, not
/// `rep movsb`, and pieces would lose that (1 MiB messages: 26-31 GB/s in pieces
/// against 35-36 whole).
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` valid for reads and `dst` for writes of
/// `len` bytes, the two ranges not overlapping.
#[inline]
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    if len <= SMALL_COPY_MAX {
        // SAFETY: the caller's contract.
        unsafe { copy_small(src, dst, len) };
        return;
    }
    if !in_pieces(src, dst, len) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let mut done = 0;
    while done < len {
        let n = SHORT_DISTANCE_PIECE.min(len - done);
        // SAFETY: done + n <= len: inside both ranges of the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), n) };
        done += n;
    }
}

/// Lengths [`copy_bytes`] copies inline, without a call to `memcpy` (which then costs
/// more than the copy: a small tagged message's landing, every message's header).
const SMALL_COPY_MAX: usize = 16;

/// [`copy_bytes`] of at most [`SMALL_COPY_MAX`] bytes: two loads that may overlap, then
/// two stores, of the widest word that fits (as `memcpy` does for these lengths).
///
/// # Safety
/// As [`copy_bytes`], and `len <= SMALL_COPY_MAX`.
#[inline(always)]
unsafe fn copy_small(src: *const u8, dst: *mut u8, len: usize) {
    // Each word below lies inside `src..src + len` or `dst..dst + len`: `len` is at least
    // its size, its start at most `len` minus its size. Both are read before either is
    // written.
    // SAFETY: those ranges are readable and writable, not overlapping (the caller's).
    unsafe {
        if len >= 8 {
            let a = src.cast::<u64>().read_unaligned();
            let b = src.add(len - 8).cast::<u64>().read_unaligned();
            dst.cast::<u64>().write_unaligned(a);
            dst.add(len - 8).cast::<u64>().write_unaligned(b);
        } else if len >= 4 {
            let a = src.cast::<u32>().read_unaligned();
            let b = src.add(len - 4).cast::<u32>().read_unaligned();
            dst.cast::<u32>().write_unaligned(a);
            dst.add(len - 4).cast::<u32>().write_unaligned(b);
        } else if len > 0 {
            // 1 to 3 bytes: the first, the middle and the last (some the same).
            let (a, b, c) = (*src, *src.add(len / 2), *src.add(len - 1));
            *dst = a;
            *dst.add(len / 2) = b;
            *dst.add(len - 1) = c;
        }
    }
}

/// Whether [`copy_bytes`] copies `len` bytes from `src` to `dst` in pieces: the
/// destination 1 to 63 bytes after the source modulo 4 KiB, at least two pieces long and
/// shorter than [`SHORT_DISTANCE_MAX`].
#[inline]
fn in_pieces(src: *const u8, dst: *const u8, len: usize) -> bool {
    let distance = (dst as usize).wrapping_sub(src as usize) & 4095;
    (2 * SHORT_DISTANCE_PIECE..SHORT_DISTANCE_MAX).contains(&len) && (1..64).contains(&distance)
}

/// Pieces [`copy_bytes`] copies in where `rep movsb` would be slow.
pub(crate) const SHORT_DISTANCE_PIECE: usize = 2048;
/// From this length on [`copy_bytes`] copies whole.
pub(crate) const SHORT_DISTANCE_MAX: usize = 1 << 20;

#[cfg(test)]
mod copy_tests {
    #[test]
    fn copies_are_exact_at_every_distance_and_length() {
        // Source and destination in one buffer, so that their distance modulo 4 KiB is
        // the one chosen: inside the slow window (copied in pieces) and outside it.
        let mut buf = vec![0u8; 64 << 10];
        for (i, b) in buf[..20_000].iter_mut().enumerate() {
            *b = (i * 7 + i / 251) as u8;
        }
        let src_end = 20_000;
        let want = buf[..src_end].to_vec();
        let base = 24 << 10; // a multiple of 4 KiB past the source
        for distance in [0usize, 1, 16, 31, 32, 63, 64, 100, 4095] {
            let small = 0..=super::SMALL_COPY_MAX + 1;
            for len in small.chain([100, 4095, 4096, 4097, 10_000, 16_000]) {
                let dst = base + distance;
                buf[src_end..].fill(0);
                let pieces = super::in_pieces(buf.as_ptr(), buf[dst..].as_ptr(), len);
                assert_eq!(
                    pieces,
                    (1..64).contains(&distance) && len >= 2 * super::SHORT_DISTANCE_PIECE,
                    "distance {distance}, {len} bytes"
                );
                let p = buf.as_mut_ptr();
                // SAFETY: [0, len) and [dst, dst + len) lie inside `buf` and do not
                // overlap (len <= 20 000 < 24 KiB <= dst).
                unsafe { super::copy_bytes(p, p.add(dst), len) };
                assert_eq!(
                    &buf[dst..dst + len],
                    &want[..len],
                    "distance {distance}, {len} bytes"
                );
                assert!(buf[src_end..dst].iter().all(|&b| b == 0));
                assert!(buf[dst + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
