//! Raw Ethernet transport: one `AF_PACKET` socket per endpoint, with memory-mapped
//! `TPACKET_V2` receive and transmit rings.
//!
//! This is the Directed Point token buffer pool on a stock kernel: the receive ring is a
//! fixed area shared by the kernel and the process, the kernel copies each arriving frame
//! of this endpoint into the next free slot of it, and the process reads the frame in
//! place, without a system call and without a further copy. Sending writes frames into
//! the transmit ring and kicks the whole batch with one `send` call.
//!
//! # Frame format
//!
//! ```text
//!  0  [u8; 6]  destination MAC
//!  6  [u8; 6]  source MAC
//! 12  u16 BE   EtherType ETHERTYPE (0x88B5, IEEE local experimental)
//! 14  u16 BE   port: the destination endpoint's port on its node
//! 16  u16 BE   length of the quiver frame that follows
//! 18  ...      quiver frame (32-byte header, dst_dpid u16 LE at 18 + 4, then the body)
//! ```
//!
//! Why the length: a NIC pads a frame shorter than 60 bytes with zeros, and the quiver
//! header has no length of its own, so without it the receiver would take the padding for
//! part of the body (an acknowledgement is a bare 32-byte header). A frame whose length
//! field exceeds what arrived is malformed.
//!
//! Why the port: every process of a node that opens an endpoint opens its own packet
//! socket on the same interface, and they all share that interface's MAC. A packet socket
//! bound to an EtherType gets a copy of every frame of that EtherType; the port (and the
//! `dst_dpid`) let each socket's BPF filter reject, inside the kernel, the frames meant for
//! the other endpoints, so that they never take a slot of this endpoint's ring nor wake it.
//! It plays the part of the UDP port.
//!
//! # What a link owns
//!
//! A receiving packet socket bound to (interface, `ETHERTYPE`), with its classic BPF
//! filter (accepting only frames with `pkt_type == PACKET_HOST`, our EtherType, our port
//! and our `dst_dpid`; this also excludes our own outgoing frames, broadcasts and frames
//! that a bridge floods to the wrong node; left out while the link is the only endpoint
//! on its node, when user space checks the packet type and the port, [`ProcessLinks`])
//! and the mapping of its receive ring; and a
//! transmitting packet socket of protocol 0 (it receives nothing) with the mapping of its
//! transmit ring. The receiving socket also sends a lone small frame by copy: a socket
//! with a transmit ring can only send from it, and sending on the socket the kernel has
//! just used to receive is cheaper than on a third one (PERFORMANCE, section 3). Dropping
//! the link unmaps both rings and closes both sockets.
//!
//! # Receive ring: who owns which frame
//!
//! Every frame of the ring belongs either to the kernel (`tp_status == TP_STATUS_KERNEL`)
//! or to the process (`TP_STATUS_USER` set). The kernel fills frames strictly in ring
//! order, at its head, and hands each over by setting `TP_STATUS_USER` after the data.
//! [`EthLink::recv_batch`] walks the same order with a read cursor, reads the status with
//! Acquire ordering and hands every frame it finds as a [`Datagram`] whose slot is the
//! frame's index; the bytes are read in place with [`EthLink::slot`].
//! [`EthLink::free_slot`] gives a frame back (`TP_STATUS_KERNEL`, Release ordering).
//!
//! Frames may be freed in any order, but neither side ever skips one: when the kernel's
//! head comes round to a frame that is still held, the kernel drops every frame that
//! arrives for this endpoint (counted by [`EthLink::ring_drops`]) until that frame is
//! freed, and the read cursor stops at the same frame. A held frame therefore costs
//! nothing until `slots() - 1` further frames have arrived behind it; a caller may keep a
//! frame for as long as it takes the ring to wrap round to it, and must copy out (or give
//! back) anything it means to keep longer, or the endpoint stops receiving. To give it
//! time, `recv_batch` reports a frame still held half a ring ahead of the one it hands
//! out ([`EthLink::next_approaching`]), and [`EthLink::blocked_slot`] the frame the
//! kernel is stopped at.
//!
//! Readiness: the descriptor ([`AsRawFd`]) polls readable when the kernel has not got
//! back the frame *before* its head, i.e. also while the newest frame has been taken by
//! `recv_batch` and is still held. A level-triggered waiter that holds the newest frame
//! would wake again at once; register the descriptor with `EPOLLET` (every arriving frame
//! wakes it) or free the newest frame before sleeping.
//!
//! # Transmit ring
//!
//! Frames are filled in ring order at a cursor: a frame is free when its status is
//! `TP_STATUS_AVAILABLE`, it is filled (link header, then the quiver frame), marked
//! `TP_STATUS_SEND_REQUEST` (Release), and one `send(fd, NULL, 0, MSG_DONTWAIT)` per batch
//! makes the kernel take every requested frame, in order, stopping at the first frame
//! that is not requested; since the cursor never skips a frame, the kernel never stops
//! behind a hole. A frame comes back `AVAILABLE` when the kernel has freed its buffer
//! (after the driver's completion). When the ring is full, the socket's send buffer is
//! full (`EAGAIN`) or the queueing discipline is (`ENOBUFS`: the kernel keeps the frame
//! requested for the next call), sending waits (spins, yields, then polls) and reports an
//! error after [`TX_STALL`] without progress.
//!
//! # Limits
//!
//! - Frames to this node's own MAC leave the NIC and do not come back (only `lo` loops
//!   them): endpoints of one node talk over shared memory.
//! - The link header has no length: a NIC pads a frame shorter than 60 bytes (a quiver
//!   frame shorter than 44 bytes) with zeros, and the receiver gets the padding as part
//!   of the quiver frame. Loopback, veth and bridges do not pad.

use crate::error::{Error, Result};
use crate::link::{setsockopt, Datagram};
use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod filter;
mod iface;
mod ring;
#[cfg(test)]
mod tests;

/// Tests that send raw frames on lo share it; a test that counts every frame a link
/// without its filter sees on lo holds it alone (the link conformance suite's eth cases
/// run in the same process).
#[cfg(test)]
pub(crate) static LO_RAW_TRAFFIC: std::sync::RwLock<()> = std::sync::RwLock::new(());

use self::filter::{attach_filter, ProcessLinks, PROCESS_LINKS};
pub(crate) use self::iface::{ip_addresses, Interface, MacAddr, MacParseError};
use self::ring::{layouts, Ring};
pub(crate) use self::ring::{ring_frames, rx_frame_bytes};
pub use self::ring::{ETH_RING_MAX_BYTES, ETH_RING_MIN_WINDOWS};

/// EtherType of quiver frames (IEEE 802 local experimental EtherType 1).
pub(crate) const ETHERTYPE: u16 = 0x88B5;
/// The port of a broadcast: a frame to a job's multicast address with this port reaches
/// every endpoint of its DPID on the segment (no endpoint has it: ports count the ranks
/// of one node).
pub(crate) const GROUP_PORT: u16 = u16::MAX;
/// Bytes in front of the quiver frame: Ethernet header, port and length.
pub(crate) const LINK_HEADER: usize = 18;
/// The link header's bytes after the Ethernet header (port and length).
const LINK_EXTRA: usize = LINK_HEADER - ETH_HLEN;

/// Ethernet header: two MACs and the EtherType.
const ETH_HLEN: usize = 14;
/// Offset of the quiver header's `dst_dpid` (u16 little-endian) in the Ethernet frame.
const DPID_AT: usize = LINK_HEADER + 4;
/// Shortest quiver frame the filter lets through: one that reaches its `dst_dpid`.
pub(crate) const MIN_FRAME: usize = DPID_AT + 2 - LINK_HEADER;
/// Smallest MTU that carries a quiver header behind the port.
const MIN_MTU: usize = LINK_EXTRA + crate::wire::HEADER_LEN;

/// `TPACKET_V2` of `<linux/if_packet.h>`: libc has it only as a variant of the enum
/// `tpacket_versions`.
const TPACKET_V2: libc::c_int = 1;
/// Timestamp bits the kernel may add to a transmit frame's status when it gives the frame
/// back (`AVAILABLE | TP_STATUS_TS_*`).
const TS_BITS: u32 =
    libc::TP_STATUS_TS_SOFTWARE | libc::TP_STATUS_TS_SYS_HARDWARE | libc::TP_STATUS_TS_RAW_HARDWARE;
/// Offset of the data in a transmit frame: the kernel reads it at
/// `TPACKET2_HDRLEN - sizeof(struct sockaddr_ll)` (no `PACKET_TX_HAS_OFF`).
const TX_DATA: usize = libc::TPACKET2_HDRLEN - std::mem::size_of::<libc::sockaddr_ll>();
/// Offset of the end of the Ethernet header in a receive frame: the kernel puts the
/// network header at `TPACKET_ALIGN(TPACKET2_HDRLEN + 16)`, the 14-byte MAC header just
/// in front of it (`tp_mac`), so a packet of 14 + MTU bytes ends at `RX_NET + MTU`.
const RX_NET: usize = align(libc::TPACKET2_HDRLEN + 16);
/// Offset of the `sockaddr_ll` the kernel writes behind the header of a receive frame.
const RX_SLL: usize = align(std::mem::size_of::<libc::tpacket2_hdr>());

/// Largest block asked for: the kernel allocates each block as one run of pages.
const MAX_BLOCK: usize = 4 << 20;
/// Fewest receive frames, whatever is asked for.
const MIN_RX_FRAMES: usize = 8;
/// Transmit ring: this many frames, at most `TX_BYTES`.
const TX_FRAMES: usize = 256;
const TX_BYTES: usize = 2 << 20;
/// How long sending waits for the kernel to take or give back a transmit frame.
const TX_STALL: Duration = Duration::from_secs(10);
/// A lone frame up to this long (link header included) is sent by copy through the
/// receiving socket instead of the transmit ring (see [`EthLink::send_copied`]).
const COPY_SEND_MAX: usize = 256;

// PACKET_QDISC_BYPASS is deliberately not set: it would hand frames straight to the
// driver, skipping the queueing discipline, and emulated links are shaped with tbf qdiscs
// that bypass would ignore. Without a qdisc (real NICs usually have one) it would save
// little next to the per-frame work of the ring.

const fn align(x: usize) -> usize {
    (x + libc::TPACKET_ALIGNMENT - 1) & !(libc::TPACKET_ALIGNMENT - 1)
}

/// The multicast address of job `job_id`'s broadcasts: locally administered (no
/// vendor's), multicast, with the job id in its last four bytes.
pub(crate) fn group_mac(job_id: u32) -> MacAddr {
    let id = job_id.to_be_bytes();
    MacAddr([0x03, 0x71, id[0], id[1], id[2], id[3]])
}

/// Where frames to one peer endpoint go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EthDest {
    pub mac: MacAddr,
    pub port: u16,
}

/// True when `e` says the process lacks the privilege to open a raw Ethernet link
/// (`EPERM`/`EACCES`: no `CAP_NET_RAW`): the caller then falls back to UDP.
pub(crate) fn is_permission(e: &Error) -> bool {
    match e {
        Error::Io { source, .. } => {
            source.kind() == io::ErrorKind::PermissionDenied
                || matches!(source.raw_os_error(), Some(libc::EPERM | libc::EACCES))
        }
        _ => false,
    }
}

/// An endpoint's two raw Ethernet sockets and their rings.
pub(crate) struct EthLink {
    /// The receive ring, mapped from `fd` (declared first: unmapped before the sockets
    /// close).
    rx: Ring,
    /// The transmit ring, mapped from `tx_fd`.
    tx: Ring,
    /// The receiving socket: bound to our EtherType, filtered (unless it is the only
    /// endpoint on its node, [`ProcessLinks`]). A lone small frame is sent through it by
    /// copy ([`EthLink::send_copied`]).
    fd: OwnedFd,
    /// The transmitting socket: protocol 0 (it receives nothing).
    tx_fd: OwnedFd,
    /// Next receive frame to look at.
    rx_cursor: usize,
    /// Receive frames handed out by `recv_batch` and not yet freed.
    held: Vec<bool>,
    /// How far ahead of the read cursor `recv_batch` looks for frames still held: half
    /// the ring.
    lookahead: usize,
    /// Held frames the kernel reaches within `lookahead` frames ([`EthLink::next_approaching`]).
    approaching: Vec<u32>,
    /// Next transmit frame to fill.
    tx_cursor: Cell<usize>,
    /// Frames the kernel dropped for want of a free receive frame, summed over the
    /// PACKET_STATISTICS reads (each read resets the kernel's counters).
    drops: Cell<u64>,
    mac: MacAddr,
    mtu: usize,
    port: u16,
    ifname: String,
    ifindex: libc::c_int,
    /// Frames sent by copy (for tests and diagnostics).
    copied: Cell<u64>,
    /// Frames given back unread because they were not ours ([`EthLink::rx_len`]).
    misaddressed: Cell<u64>,
    /// The multicast address of the job whose broadcasts this link receives
    /// ([`EthLink::join_group`]).
    group: Option<MacAddr>,
    /// Where the link is registered while open ([`ProcessLinks`]).
    registry: &'static Mutex<ProcessLinks>,
    #[cfg(feature = "eth-turnaround")]
    turnaround: super::turnaround::TurnaroundProbe,
}

// SAFETY: the raw pointers point into a mapping the link owns exclusively, and the kernel's
// side of the rings does not care which thread uses the socket: moving the link moves all of
// it. It is not Sync (Cell), so one thread at a time uses it.
unsafe impl Send for EthLink {}

impl EthLink {
    /// Opens a link on `iface` that receives the frames addressed to this interface's MAC
    /// with EtherType ETHERTYPE, port `port` and dst_dpid `dpid`, into a receive ring of
    /// `rx_frames` frames (rounded up to whole blocks; each frame holds a packet of the
    /// interface's MTU, [`rx_frame_bytes`]).
    ///
    /// Errors are [`Error::Io`] naming the step that failed ([`is_permission`] tells a
    /// missing `CAP_NET_RAW`), or [`Error::Config`] for an MTU too small for a quiver
    /// header.
    pub(crate) fn open(
        iface: &Interface,
        port: u16,
        dpid: u16,
        rx_frames: usize,
        alone_on_node: bool,
    ) -> Result<EthLink> {
        Self::open_with(iface, port, dpid, rx_frames, alone_on_node, &PROCESS_LINKS)
    }

    /// [`EthLink::open`] with the registry of the process's links given (tests use
    /// registries of their own).
    fn open_with(
        iface: &Interface,
        port: u16,
        dpid: u16,
        rx_frames: usize,
        alone_on_node: bool,
        registry: &'static Mutex<ProcessLinks>,
    ) -> Result<EthLink> {
        let name = &iface.name;
        if iface.mtu < MIN_MTU {
            return Err(Error::Config(format!(
                "interface {name} has an MTU of {} bytes; the raw Ethernet link needs at least {MIN_MTU}",
                iface.mtu
            )));
        }
        let fail = |what: &str, e: io::Error| {
            Error::io(format!("{what} (raw Ethernet link on {name})"), e)
        };
        // Protocol 0: the socket receives nothing until bind() names the EtherType, by
        // which time the filter is in place.
        // SAFETY: socket has no memory preconditions; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(fail(
                "opening an AF_PACKET socket",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: raw is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_VERSION, &TPACKET_V2)
            .map_err(|e| fail("PACKET_VERSION TPACKET_V2", e))?;
        // Spares the filter a run on every frame we send (kernel 4.20+; best effort).
        let _ = setsockopt(
            &fd,
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &1 as &libc::c_int,
        );

        // SAFETY: sysconf has no memory preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let (rx, tx) = layouts(iface.mtu, rx_frames, page);
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &rx.req()).map_err(|e| {
            let what = format!(
                "PACKET_RX_RING of {} frames of {} bytes",
                rx.frames(),
                rx.frame_size
            );
            fail(&what, e)
        })?;
        let rx_ring = Ring::map(&fd, rx).map_err(|e| {
            fail(
                &format!("mapping the {} bytes of the receive ring", rx.bytes()),
                e,
            )
        })?;
        // The transmit ring lives on a second socket, so that the receiving socket has no
        // transmit ring and can send a lone small frame by copy (a socket with a transmit
        // ring sends only from it). Protocol 0: it receives nothing.
        // SAFETY: socket has no memory preconditions; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(fail(
                "opening the transmitting AF_PACKET socket",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: raw is a fresh descriptor that nothing else owns.
        let tx_fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setsockopt(&tx_fd, libc::SOL_PACKET, libc::PACKET_VERSION, &TPACKET_V2)
            .map_err(|e| fail("PACKET_VERSION TPACKET_V2 (transmitting socket)", e))?;
        // The in-flight frames are charged to the send buffer: let a whole ring fly.
        set_sndbuf(&tx_fd, tx.bytes() + tx.frames() * 1024);
        setsockopt(&tx_fd, libc::SOL_PACKET, libc::PACKET_TX_RING, &tx.req()).map_err(|e| {
            let what = format!(
                "PACKET_TX_RING of {} frames of {} bytes",
                tx.frames(),
                tx.frame_size
            );
            fail(&what, e)
        })?;
        bind_to(&tx_fd, 0, iface.index)
            .map_err(|e| fail("binding the transmitting socket to the interface", e))?;
        let tx_ring = Ring::map(&tx_fd, tx).map_err(|e| {
            fail(
                &format!("mapping the {} bytes of the transmit ring", tx.bytes()),
                e,
            )
        })?;
        // Before the link exists, so that a failure here leaves the registry as it was;
        // from the link on, its Drop unregisters it.
        let filtered = {
            let mut links = registry.lock().unwrap_or_else(|e| e.into_inner());
            let (filtered, to_filter) = links.opening(alone_on_node, (fd.as_raw_fd(), port, dpid));
            if filtered {
                if let Err(e) = attach_filter(fd.as_fd(), port, dpid) {
                    links.closing(fd.as_raw_fd());
                    return Err(fail("SO_ATTACH_FILTER", e));
                }
            }
            for (other, port, dpid) in to_filter {
                // SAFETY: a registered descriptor stays open until its link's Drop has
                // unregistered it, under the lock we hold.
                let other = unsafe { BorrowedFd::borrow_raw(other) };
                if let Err(e) = attach_filter(other, port, dpid) {
                    tracing::warn!("a second raw Ethernet endpoint in this process: the first one's filter: {e}; it drops the frames of the others in user space");
                }
            }
            filtered
        };
        let link = EthLink {
            rx: rx_ring,
            tx: tx_ring,
            fd,
            tx_fd,
            rx_cursor: 0,
            held: vec![false; rx.frames()],
            lookahead: (rx.frames() / 2).max(1),
            approaching: Vec::new(),
            tx_cursor: Cell::new(0),
            drops: Cell::new(0),
            mac: iface.mac,
            mtu: iface.mtu,
            port,
            ifname: name.clone(),
            ifindex: iface.index as libc::c_int,
            copied: Cell::new(0),
            misaddressed: Cell::new(0),
            group: None,
            registry,
            #[cfg(feature = "eth-turnaround")]
            turnaround: Default::default(),
        };
        // Dropping `link` from here on unmaps both rings and closes both sockets.
        bind_to(&link.fd, ETHERTYPE, iface.index)
            .map_err(|e| fail("binding to the interface", e))?;
        tracing::debug!(
            iface = %name, port, dpid,
            filtered, rx_frames = rx.frames(), rx_frame = rx.frame_size, rx_block = rx.block_size,
            tx_frames = tx.frames(), tx_frame = tx.frame_size, tx_block = tx.block_size,
            "raw Ethernet link open"
        );
        Ok(link)
    }

    pub(crate) fn mac(&self) -> MacAddr {
        self.mac
    }

    /// Joins job `job_id`'s multicast group on the interface: the frames of its
    /// broadcasts ([`EthLink::group_dest`]) come in, even where the NIC filters
    /// multicast addresses (veth and bridges flood them anyway).
    pub(crate) fn join_group(&mut self, job_id: u32) -> Result<()> {
        let mac = group_mac(job_id);
        let mut mreq = libc::packet_mreq {
            mr_ifindex: self.ifindex,
            mr_type: libc::PACKET_MR_MULTICAST as libc::c_ushort,
            mr_alen: 6,
            mr_address: [0; 8],
        };
        mreq.mr_address[..6].copy_from_slice(&mac.0);
        setsockopt(
            &self.fd,
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mreq,
        )
        .map_err(|e| {
            Error::io(
                format!(
                    "joining multicast group {mac} (raw Ethernet link on {})",
                    self.ifname
                ),
                e,
            )
        })?;
        self.group = Some(mac);
        Ok(())
    }

    /// Where a broadcast to the group this link joined goes: every endpoint of the
    /// job's DPID on the segment, in one frame (this node's own endpoints excepted: a
    /// NIC does not hear what it sends).
    pub(crate) fn group_dest(&self) -> Option<EthDest> {
        Some(EthDest {
            mac: self.group?,
            port: GROUP_PORT,
        })
    }

    /// The port this link receives on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Largest quiver frame (header + body) that fits in one Ethernet frame: MTU - 4.
    pub(crate) fn max_datagram(&self) -> usize {
        (self.mtu - LINK_EXTRA).min(u16::MAX as usize)
    }

    /// Number of receive frames (slots); slot numbers are `0..slots()`.
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.rx.geo.frames()
    }

    /// Takes the received frames, in ring order, without blocking and without a system
    /// call: each becomes a `Datagram { slot, len }` whose bytes, the quiver frame, are
    /// `self.slot(slot)[..len]`. A frame shorter than `LINK_HEADER` or truncated is handed
    /// on with len 0. Every datagram's slot must be given back with `free_slot`.
    pub(crate) fn recv_batch(&mut self, out: &mut Vec<Datagram>) -> Result<()> {
        let frames = self.rx.geo.frames();
        // Stops at the first frame that is still held (the kernel is blocked there too) or
        // still the kernel's; at most one lap (frames not ours are given back at once, and
        // the kernel may fill them again behind us).
        for _ in 0..frames {
            let i = self.rx_cursor;
            if self.held[i] {
                break;
            }
            let status = self.rx.status(i).load(Ordering::Acquire);
            if status & libc::TP_STATUS_USER == 0 {
                break;
            }
            // A frame still held half a ring after it was handed out stops the kernel
            // when the ring comes round to it: say so while there is time to move it.
            let ahead = i + self.lookahead;
            let ahead = if ahead >= frames {
                ahead - frames
            } else {
                ahead
            };
            if self.held[ahead] {
                self.approaching.push(ahead as u32);
            }
            let Some(len) = self.rx_len(i, status) else {
                // Not ours: back to the kernel at once.
                self.rx
                    .status(i)
                    .store(libc::TP_STATUS_KERNEL, Ordering::Release);
                self.misaddressed.set(self.misaddressed.get() + 1);
                self.rx_cursor = if i + 1 == frames { 0 } else { i + 1 };
                continue;
            };
            #[cfg(feature = "eth-turnaround")]
            {
                let h = self.rx.header(i);
                // SAFETY: frame i carries TP_STATUS_USER: its header is ours to read.
                let (sec, nsec) = unsafe { ((*h).tp_sec, (*h).tp_nsec) };
                self.turnaround.received(sec, nsec);
            }
            self.held[i] = true;
            out.push(Datagram {
                slot: i as u32,
                len,
            });
            self.rx_cursor = if i + 1 == frames { 0 } else { i + 1 };
        }
        Ok(())
    }

    /// Length of the quiver frame in receive frame `i`, which we own; 0 for a frame too
    /// short or truncated; `None` for a frame that is not ours: not addressed to this
    /// host (a bridge floods frames it has not learned the way of) or to another port.
    /// The BPF filter refuses both already when the link has one ([`ProcessLinks`]).
    fn rx_len(&self, i: usize, status: u32) -> Option<usize> {
        let h = self.rx.header(i);
        // SAFETY: frame i carries TP_STATUS_USER (read with Acquire after the kernel's
        // release of the frame): its header is ours to read and the kernel does not touch
        // it until we give the frame back.
        let (len, snap, mac) = unsafe {
            (
                (*h).tp_len as usize,
                (*h).tp_snaplen as usize,
                (*h).tp_mac as usize,
            )
        };
        // SAFETY: as above; the kernel writes a sockaddr_ll right after the header
        // (TPACKET_ALIGN(sizeof(tpacket2_hdr)) = RX_SLL), inside the frame.
        let pkttype = unsafe {
            let sll = self.rx.frame(i).add(RX_SLL) as *const libc::sockaddr_ll;
            (*sll).sll_pkttype
        };
        if pkttype != libc::PACKET_HOST && pkttype != libc::PACKET_MULTICAST {
            return None;
        }
        let truncated = status & libc::TP_STATUS_COPY != 0 || snap < len;
        if truncated || len < LINK_HEADER || mac + len > self.rx.geo.frame_size {
            return Some(0);
        }
        // SAFETY: as above; the port and length fields lie inside the frame (mac +
        // LINK_HEADER <= mac + len <= frame_size).
        let (port, field) = unsafe {
            let at = self.rx.frame(i).add(mac + ETH_HLEN);
            (
                u16::from_be_bytes([at.read(), at.add(1).read()]),
                u16::from_be_bytes([at.add(2).read(), at.add(3).read()]) as usize,
            )
        };
        let wanted = if pkttype == libc::PACKET_HOST {
            self.port
        } else {
            GROUP_PORT
        };
        if port != wanted {
            return None;
        }
        // Padding after the frame is ignored; a length beyond what arrived is malformed.
        Some(if field > len - LINK_HEADER { 0 } else { field })
    }

    /// The room of a received frame from the start of its quiver frame to the end of the
    /// ring frame; `recv_batch` says how many bytes of it are the frame. Empty for a slot
    /// that is not handed out.
    pub(crate) fn slot(&self, slot: u32) -> &[u8] {
        let i = slot as usize;
        if !self.held.get(i).copied().unwrap_or(false) {
            return &[];
        }
        let frame = self.rx.frame(i);
        // SAFETY: the frame is held (TP_STATUS_USER, not yet given back): the kernel does
        // not write it.
        let mac = unsafe { (*(frame as *const libc::tpacket2_hdr)).tp_mac } as usize;
        let size = self.rx.geo.frame_size;
        let start = (mac + LINK_HEADER).min(size);
        // SAFETY: [start, size) lies inside frame i of the mapping; the kernel does not
        // write a frame that we hold, and giving it back (free_slot) takes &mut self, so
        // the slice cannot outlive the hold.
        unsafe { std::slice::from_raw_parts(frame.add(start), size - start) }
    }

    /// The next held frame that the kernel reaches within half a ring of frames, as
    /// `recv_batch` found them: its holder should copy it out and free it
    /// ([`EthLink::blocked_slot`] says when it is too late). A frame freed since is
    /// reported all the same (it is free then, so nobody holds it).
    #[inline]
    pub(crate) fn next_approaching(&mut self) -> Option<u32> {
        self.approaching.pop()
    }

    /// The frame the kernel is stopped at, or stops at with the next frame that arrives:
    /// the next one in ring order, when it is still held. Until it is freed the kernel
    /// drops every frame for this endpoint (`ring_drops`) and `recv_batch` finds nothing.
    #[inline]
    pub(crate) fn blocked_slot(&self) -> Option<u32> {
        self.held[self.rx_cursor].then_some(self.rx_cursor as u32)
    }

    /// Gives a received frame back to the kernel. Frames may be freed in any order.
    pub(crate) fn free_slot(&mut self, slot: u32) {
        let i = slot as usize;
        match self.held.get_mut(i) {
            Some(h) if *h => *h = false,
            // Giving back a frame we do not hold could hand the kernel a frame it filled
            // and we have not read yet, and desynchronise the cursor: refuse.
            _ => {
                debug_assert!(false, "slot {slot} freed but not held");
                return;
            }
        }
        self.rx
            .status(i)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
    }

    /// Sends frames to `dest`: each is written into the TX ring behind the link header,
    /// then one `send` call kicks the batch. A frame longer than `max_datagram` is an
    /// [`Error::Config`] and nothing is sent.
    pub(crate) fn send_batch(&self, dest: &EthDest, datagrams: &[&[u8]]) -> Result<()> {
        let max = self.max_datagram();
        if let Some(d) = datagrams.iter().find(|d| d.len() > max) {
            return Err(Error::Config(format!(
                "frame of {} bytes exceeds the largest raw Ethernet frame on {} ({max} bytes: MTU {} minus port and length)",
                d.len(),
                self.ifname,
                self.mtu
            )));
        }
        if datagrams.is_empty() {
            return Ok(());
        }
        if let [one] = datagrams {
            if self.send_copied(dest, one) {
                return Ok(());
            }
        }
        let mut head = self.link_header(dest, 0);
        let frames = self.tx.geo.frames();
        for d in datagrams {
            let i = self.tx_cursor.get();
            self.claim_tx(i)?;
            let frame = self.tx.frame(i);
            head[16..18].copy_from_slice(&(d.len() as u16).to_be_bytes());
            // SAFETY: frame i is AVAILABLE (claim_tx): the kernel neither reads nor writes
            // it until we request it below. TX_DATA + LINK_HEADER + d.len() <= TX_DATA +
            // 14 + MTU <= frame_size, so the writes stay inside the frame.
            unsafe {
                let data = frame.add(TX_DATA);
                std::ptr::copy_nonoverlapping(head.as_ptr(), data, LINK_HEADER);
                std::ptr::copy_nonoverlapping(d.as_ptr(), data.add(LINK_HEADER), d.len());
                (*(frame as *mut libc::tpacket2_hdr)).tp_len = (LINK_HEADER + d.len()) as u32;
            }
            self.tx
                .status(i)
                .store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
            self.tx_cursor.set(if i + 1 == frames { 0 } else { i + 1 });
        }
        self.kick()
    }

    /// The link header of a frame to `dest` carrying a quiver frame of `len` bytes:
    /// destination and source MAC, quiver's EtherType, the destination port, the length.
    fn link_header(&self, dest: &EthDest, len: usize) -> [u8; LINK_HEADER] {
        let mut head = [0u8; LINK_HEADER];
        head[..6].copy_from_slice(&dest.mac.0);
        head[6..12].copy_from_slice(&self.mac.0);
        head[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        head[14..16].copy_from_slice(&dest.port.to_be_bytes());
        head[16..18].copy_from_slice(&(len as u16).to_be_bytes());
        head
    }

    /// Sends a lone small frame by copy (`sendto` on the receiving socket, which has no
    /// transmit ring); false if it was not sent (too long, frames still waiting in the
    /// transmit ring, which it must not overtake, or the kernel had no room): the ring
    /// sends it then.
    /// A frame sent from the transmit ring lends its ring page to the packet, and veth
    /// copies that page into a fresh one when the packet crosses into another namespace;
    /// a copied frame skips both (the anchors' `afpacket_pingpong` sends this way).
    fn send_copied(&self, dest: &EthDest, d: &[u8]) -> bool {
        let len = LINK_HEADER + d.len();
        if len > COPY_SEND_MAX || self.tx_pending() {
            return false;
        }
        #[cfg(feature = "eth-turnaround")]
        self.turnaround.sending();
        let mut frame = [0u8; COPY_SEND_MAX];
        frame[..LINK_HEADER].copy_from_slice(&self.link_header(dest, d.len()));
        frame[LINK_HEADER..len].copy_from_slice(d);
        // SAFETY: sockaddr_ll is plain data; zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as libc::c_ushort;
        sll.sll_protocol = ETHERTYPE.to_be();
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&dest.mac.0);
        // SAFETY: frame[..len] and sll are valid for the duration of the call.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr() as *const libc::c_void,
                len,
                libc::MSG_DONTWAIT,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        let sent = n == len as isize;
        if sent {
            self.copied.set(self.copied.get() + 1);
        }
        sent
    }

    /// Sends one frame to `dest`.
    pub(crate) fn send_datagram(&self, dest: &EthDest, frame: &[u8]) -> Result<()> {
        self.send_batch(dest, &[frame])
    }

    /// Frames given back unread because they were addressed to another host or port
    /// (a link without its BPF filter gets them, [`ProcessLinks`]).
    pub(crate) fn misaddressed(&self) -> u64 {
        self.misaddressed.get()
    }

    /// Frames the kernel dropped because the receive ring was full (PACKET_STATISTICS
    /// tp_drops, accumulated).
    pub(crate) fn ring_drops(&self) -> u64 {
        // SAFETY: tpacket_stats is plain data; zero is valid.
        let mut st: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `st`.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                &mut st as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        if rc == 0 {
            self.drops.set(self.drops.get() + u64::from(st.tp_drops));
        }
        self.drops.get()
    }

    /// Waits until transmit frame `i` (the cursor's) is ours to fill.
    fn claim_tx(&self, i: usize) -> Result<()> {
        let status = self.tx.status(i);
        let mut kicked = false;
        let mut wait = Backoff::default();
        loop {
            match status.load(Ordering::Acquire) & !TS_BITS {
                // WRONG_FORMAT: the kernel refused the frame (the send that did so reported
                // the error, and `rejected` neutralised it); the frame is free again.
                libc::TP_STATUS_AVAILABLE | libc::TP_STATUS_WRONG_FORMAT => return Ok(()),
                // Requested and not taken yet: the ring is full of our own frames.
                libc::TP_STATUS_SEND_REQUEST if !kicked => {
                    self.kick()?;
                    kicked = true;
                }
                // Being sent: wait for the driver to give it back.
                _ => wait.wait(self, "a transmit frame to come free")?,
            }
        }
    }

    /// True while the last frame filled is still waiting for the kernel to take it.
    fn tx_pending(&self) -> bool {
        let frames = self.tx.geo.frames();
        let last = (self.tx_cursor.get() + frames - 1) % frames;
        self.tx.status(last).load(Ordering::Acquire) & !TS_BITS == libc::TP_STATUS_SEND_REQUEST
    }

    /// Makes the kernel take every requested transmit frame, waiting while the socket's
    /// send buffer or the queueing discipline is full.
    fn kick(&self) -> Result<()> {
        let mut wait = Backoff::default();
        loop {
            // SAFETY: a send with no data on a socket with a TX ring: the kernel reads the
            // requested frames from the ring; nothing of ours is passed.
            let n = unsafe {
                libc::send(
                    self.tx_fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                if !self.tx_pending() {
                    return Ok(());
                }
                // The kernel stopped early: the send buffer is full of frames in flight.
            } else {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // ENOBUFS: the qdisc dropped the frame; the kernel marked it requested
                    // again and will retry it.
                    Some(libc::EAGAIN | libc::ENOBUFS) => {}
                    _ => return Err(self.rejected(e)),
                }
            }
            wait.wait(self, "the kernel to take the requested transmit frames")?;
        }
    }

    /// After a failed send: a frame the kernel refused (TP_STATUS_WRONG_FORMAT, e.g.
    /// longer than an MTU lowered since `open`) stops the kernel at that frame, and every
    /// frame behind it would wait. Turn each refused frame into a harmless 16-byte frame
    /// (EtherType 0, which no protocol takes) and send again, then report the error once.
    fn rejected(&self, e: io::Error) -> Error {
        let mut neutralised = 0;
        for i in 0..self.tx.geo.frames() {
            let status = self.tx.status(i);
            if status.load(Ordering::Acquire) & !TS_BITS != libc::TP_STATUS_WRONG_FORMAT {
                continue;
            }
            let frame = self.tx.frame(i);
            // SAFETY: a WRONG_FORMAT frame is back in our hands (the kernel set the status
            // and stopped); the EtherType lies inside the frame's data.
            unsafe {
                let data = frame.add(TX_DATA);
                data.add(12).write(0);
                data.add(13).write(0);
                (*(frame as *mut libc::tpacket2_hdr)).tp_len = LINK_HEADER as u32;
            }
            status.store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
            neutralised += 1;
        }
        if neutralised > 0 {
            // Best effort: the frames behind go out now, or with the next batch.
            // SAFETY: as in kick.
            unsafe {
                libc::send(
                    self.tx_fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                )
            };
            tracing::warn!(iface = %self.ifname, frames = neutralised, "the kernel refused raw Ethernet frames: {e}");
        }
        Error::io(
            format!(
                "sending on the transmit ring of {} (MTU {} at open)",
                self.ifname, self.mtu
            ),
            e,
        )
    }
}

/// Waiting inside `send_batch`: spin a little, then yield, then poll the socket for
/// writability with a short timeout; an error after `TX_STALL`.
#[derive(Default)]
struct Backoff {
    rounds: u32,
    since: Option<Instant>,
}

impl Backoff {
    fn wait(&mut self, link: &EthLink, what: &str) -> Result<()> {
        self.rounds += 1;
        if self.rounds < 64 {
            std::hint::spin_loop();
            return Ok(());
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() > TX_STALL {
            return Err(Error::io(
                format!(
                    "raw Ethernet link on {}: waited {TX_STALL:?} for {what}",
                    link.ifname
                ),
                io::ErrorKind::TimedOut.into(),
            ));
        }
        if self.rounds < 256 {
            std::thread::yield_now();
            return Ok(());
        }
        let mut pfd = libc::pollfd {
            fd: link.tx_fd.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut pfd, 1, 1) };
        if ready > 0 {
            // Writable already (the send buffer has room): what we wait for is the driver
            // giving frames back, which wakes nobody; sleep a little.
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }
}

impl AsRawFd for EthLink {
    /// Polls readable when the frame before the kernel's receive head is not the
    /// kernel's: a frame waits, or the newest frame is still held (see the module doc:
    /// use `EPOLLET`).
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for EthLink {
    fn drop(&mut self) {
        #[cfg(feature = "eth-turnaround")]
        if let Some((mean, n)) = self.turnaround.mean_us() {
            tracing::info!("eth turnaround (kernel's frame stamp to the reply's sendto): mean {mean:.3} us over {n} replies");
        }
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .closing(self.fd.as_raw_fd());
        // The rings unmap, then the sockets close, as the fields drop.
    }
}

/// Binds a packet socket to interface `ifindex` and EtherType `protocol` (0: receive
/// nothing).
fn bind_to(fd: &OwnedFd, protocol: u16, ifindex: u32) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain data; zero is valid.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as libc::c_ushort;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex = ifindex as libc::c_int;
    // SAFETY: sll is a valid sockaddr_ll of the size passed.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sll as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Asks for a send buffer of `bytes` (forcing it where permitted); best effort.
fn set_sndbuf(fd: &OwnedFd, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    if setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &v).is_err() {
        let _ = setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, &v);
    }
}
