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
use crate::link::Datagram;
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

/// EtherType of quiver frames (IEEE 802 local experimental EtherType 1).
pub(crate) const ETHERTYPE: u16 = 0x88B5;
/// Bytes in front of the quiver frame: Ethernet header, port and length.
pub(crate) const LINK_HEADER: usize = 18;
/// The link header's bytes after the Ethernet header (port and length).
const LINK_EXTRA: usize = LINK_HEADER - ETH_HLEN;

/// Ethernet header: two MACs and the EtherType.
const ETH_HLEN: usize = 14;
/// Offset of the quiver header's `dst_dpid` (u16 little-endian) in the Ethernet frame.
const DPID_AT: usize = LINK_HEADER + 4;
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

/// A 48-bit Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Why a string is not a MAC address. Converts into [`Error::Config`] and into `String`,
/// so that `?` works in either kind of caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MacParseError(String);

impl fmt::Display for MacParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MacParseError {}

impl From<MacParseError> for Error {
    fn from(e: MacParseError) -> Error {
        Error::Config(e.0)
    }
}

impl From<MacParseError> for String {
    fn from(e: MacParseError) -> String {
        e.0
    }
}

impl FromStr for MacAddr {
    type Err = MacParseError;

    /// Parses six two-digit hexadecimal bytes separated by colons (`02:42:ac:11:00:02`).
    fn from_str(s: &str) -> std::result::Result<MacAddr, MacParseError> {
        let bad = |why: &str| {
            MacParseError(format!(
                "{s:?} is not a MAC address ({why}; expected six two-digit hex bytes separated by colons, like 02:42:ac:11:00:02)"
            ))
        };
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for (i, byte) in mac.iter_mut().enumerate() {
            let p = parts
                .next()
                .ok_or_else(|| bad(&format!("{i} bytes instead of 6")))?;
            if p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(&format!("byte {} is {p:?}", i + 1)));
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| bad("bad hex digit"))?;
        }
        if parts.next().is_some() {
            return Err(bad("more than 6 bytes"));
        }
        Ok(MacAddr(mac))
    }
}

/// An interface found by address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Interface {
    pub name: String,
    pub index: u32,
    pub mac: MacAddr,
    pub mtu: usize,
}

impl Interface {
    /// The interface that carries IP address `ip` (getifaddrs), with its index, MAC
    /// (SIOCGIFHWADDR) and MTU (SIOCGIFMTU); Ok(None) if no interface has it.
    pub(crate) fn with_addr(ip: IpAddr) -> Result<Option<Interface>> {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs writes a list head into `list`; checked below.
        if unsafe { libc::getifaddrs(&mut list) } != 0 {
            return Err(Error::io("getifaddrs", io::Error::last_os_error()));
        }
        let mut found = None;
        let mut at = list;
        while !at.is_null() {
            // SAFETY: `at` is a node of the list getifaddrs returned, not yet freed.
            let ifa = unsafe { &*at };
            at = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
                continue;
            }
            // SAFETY: ifa_addr points to a sockaddr whose family says its real type; the
            // sockaddr_in/_in6 casts below are made only for the matching family.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
            let matches = match ip {
                IpAddr::V4(v4) if family == libc::AF_INET => {
                    // SAFETY: family AF_INET: the address is a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    sin.sin_addr.s_addr == u32::from_ne_bytes(v4.octets())
                }
                IpAddr::V6(v6) if family == libc::AF_INET6 => {
                    // SAFETY: family AF_INET6: the address is a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    sin6.sin6_addr.s6_addr == v6.octets()
                }
                _ => false,
            };
            if matches {
                // SAFETY: ifa_name is a NUL-terminated string owned by the list.
                let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
                found = Some(name.to_string_lossy().into_owned());
                break;
            }
        }
        // SAFETY: `list` came from getifaddrs and is freed once; no reference into it
        // outlives this point (the name was copied).
        unsafe { libc::freeifaddrs(list) };
        match found {
            Some(name) => Interface::by_name(&name).map(Some),
            None => Ok(None),
        }
    }

    /// The interface called `name`, with its index, MAC and MTU. An interface that is not
    /// Ethernet (or loopback) is an error.
    pub(crate) fn by_name(name: &str) -> Result<Interface> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
            return Err(Error::Config(format!(
                "{name:?} is not an interface name (1 to {} bytes, no NUL)",
                libc::IFNAMSIZ - 1
            )));
        }
        let cname = CString::new(name).expect("checked for NUL above");
        // SAFETY: cname is a valid NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(Error::io(
                format!("network interface {name:?}"),
                io::Error::last_os_error(),
            ));
        }
        // Any socket will do for the SIOCGIF* requests; a UDP one needs no privilege.
        // SAFETY: socket has no memory preconditions; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(Error::io(
                "socket for interface requests",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: raw is a fresh descriptor that nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(raw) };
        let ifreq = |request: libc::c_ulong, what: &str| -> Result<libc::ifreq> {
            // SAFETY: ifreq is plain data (a name and a union of plain data); zero is valid.
            let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
            for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
                *d = s as libc::c_char;
            }
            // SAFETY: the request reads the NUL-terminated name and writes into the union
            // of `req`, which is valid for the call.
            if unsafe { libc::ioctl(sock.as_raw_fd(), request as _, &mut req) } < 0 {
                return Err(Error::io(
                    format!("{what} of interface {name}"),
                    io::Error::last_os_error(),
                ));
            }
            Ok(req)
        };
        let hw = ifreq(libc::SIOCGIFHWADDR, "hardware address (SIOCGIFHWADDR)")?;
        // SAFETY: SIOCGIFHWADDR filled the ifru_hwaddr member of the union.
        let hw = unsafe { hw.ifr_ifru.ifru_hwaddr };
        if hw.sa_family != libc::ARPHRD_ETHER && hw.sa_family != libc::ARPHRD_LOOPBACK {
            return Err(Error::Config(format!(
                "interface {name} is not Ethernet (ARPHRD type {}): the raw Ethernet link needs an Ethernet interface",
                hw.sa_family
            )));
        }
        let mut mac = [0u8; 6];
        for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
            *d = *s as u8;
        }
        let mtu = ifreq(libc::SIOCGIFMTU, "MTU (SIOCGIFMTU)")?;
        // SAFETY: SIOCGIFMTU filled the ifru_mtu member of the union.
        let mtu = unsafe { mtu.ifr_ifru.ifru_mtu };
        Ok(Interface {
            name: name.to_owned(),
            index,
            mac: MacAddr(mac),
            mtu: mtu.max(0) as usize,
        })
    }
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

/// Shape of one ring as asked of the kernel: `block_nr` blocks of `block_size` bytes,
/// each holding `frames_per_block` frames of `frame_size` bytes (frames never straddle
/// blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    frame_size: usize,
    block_size: usize,
    block_nr: usize,
    frames_per_block: usize,
}

impl Geometry {
    /// A ring of about `frames` frames of `frame_size` bytes (a multiple of
    /// `TPACKET_ALIGNMENT`). A block is the smallest power-of-two multiple of the page
    /// size that holds a frame, doubled (up to `MAX_BLOCK`) while more than an eighth of
    /// it would be left over.
    fn new(frame_size: usize, frames: usize, page: usize) -> Geometry {
        debug_assert_eq!(frame_size % libc::TPACKET_ALIGNMENT, 0);
        let mut block = page.max(frame_size.next_power_of_two());
        while block % frame_size > block / 8 && block < MAX_BLOCK {
            block *= 2;
        }
        let frames_per_block = block / frame_size;
        Geometry {
            frame_size,
            block_size: block,
            block_nr: frames.div_ceil(frames_per_block).max(1),
            frames_per_block,
        }
    }

    fn frames(&self) -> usize {
        self.frames_per_block * self.block_nr
    }

    fn bytes(&self) -> usize {
        self.block_size * self.block_nr
    }

    /// Byte offset of frame `i` in the ring.
    fn offset(&self, i: usize) -> usize {
        (i / self.frames_per_block) * self.block_size
            + (i % self.frames_per_block) * self.frame_size
    }

    fn req(&self) -> libc::tpacket_req {
        libc::tpacket_req {
            tp_block_size: self.block_size as libc::c_uint,
            tp_block_nr: self.block_nr as libc::c_uint,
            tp_frame_size: self.frame_size as libc::c_uint,
            tp_frame_nr: self.frames() as libc::c_uint,
        }
    }
}

/// Fewest channel windows the default receive ring holds ([`ring_frames`]).
pub const ETH_RING_MIN_WINDOWS: usize = 4;
/// Most bytes the default receive ring takes once it holds [`ETH_RING_MIN_WINDOWS`]
/// windows: the ring is memory the kernel pins, one per endpoint.
pub const ETH_RING_MAX_BYTES: usize = 4 << 20;

/// Frames of the default receive ring of an endpoint with `senders` possible senders on
/// other nodes (ranks of its own node talk over shared memory), each with a channel window
/// of `window` frames of `frame_bytes`: one window per sender, at least
/// [`ETH_RING_MIN_WINDOWS`] windows and, above that, at most [`ETH_RING_MAX_BYTES`].
///
/// Every sender's window fits, so that senders that all fill their windows at once lose
/// nothing (up to the cap; beyond it the ring drops and retransmission repairs). A larger
/// ring buys nothing else: the kernel writes each frame into the next slot in ring order,
/// so a large ring is walked through memory that has left the cache and costs each small
/// message a miss that a ring of a few hundred frames does not (docs/DESIGN-NOTES.md,
/// "Reliable network channels").
pub(crate) fn ring_frames(window: u16, senders: usize, frame_bytes: usize) -> usize {
    let window = usize::from(window);
    let least = window * ETH_RING_MIN_WINDOWS;
    let most = (ETH_RING_MAX_BYTES / frame_bytes.max(1)).max(least);
    (window * senders).clamp(least, most)
}

/// Bytes of one receive ring frame for an interface of `mtu` bytes: a received packet of
/// 14 + MTU bytes ends at `RX_NET + mtu`.
pub(crate) fn rx_frame_bytes(mtu: usize) -> usize {
    align(RX_NET + mtu)
}

/// The receive and transmit rings for an interface of `mtu` bytes and a receive ring of
/// about `rx_frames` frames (at least `MIN_RX_FRAMES`; rounded up to whole blocks); the
/// transmit ring holds `TX_FRAMES` frames or `TX_BYTES`, whichever is less.
fn layouts(mtu: usize, rx_frames: usize, page: usize) -> (Geometry, Geometry) {
    let rx = Geometry::new(rx_frame_bytes(mtu), rx_frames.max(MIN_RX_FRAMES), page);
    let tx_frame = align(TX_DATA + ETH_HLEN + mtu);
    let tx_frames = TX_FRAMES.min(TX_BYTES / tx_frame).max(1);
    let mut tx = Geometry::new(tx_frame, tx_frames, page);
    if tx.block_nr > 1 && tx.frames() > tx_frames {
        // Round down rather than up when several blocks are needed.
        tx.block_nr -= 1;
    }
    (rx, tx)
}

/// One ring and its mapping, which dropping the ring unmaps.
struct Ring {
    /// First byte of the ring's mapping, `geo.bytes()` long.
    base: NonNull<u8>,
    geo: Geometry,
}

impl Ring {
    /// Maps the ring that `fd` was given with PACKET_RX_RING or PACKET_TX_RING.
    fn map(fd: &OwnedFd, geo: Geometry) -> io::Result<Ring> {
        // SAFETY: a fresh shared mapping of the socket's ring; the result is checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                geo.bytes(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(map as *mut u8).expect("mmap does not return NULL on success");
        Ok(Ring { base, geo })
    }

    /// First byte of frame `i` (its `tpacket2_hdr`); aligned to `TPACKET_ALIGNMENT`.
    fn frame(&self, i: usize) -> *mut u8 {
        assert!(i < self.geo.frames(), "frame {i} outside the ring");
        // SAFETY: offset(i) + frame_size <= geo.bytes() for i < frames(), so the result
        // stays inside the ring's part of the mapping.
        unsafe { self.base.as_ptr().add(self.geo.offset(i)) }
    }

    /// The status word of frame `i`, shared with the kernel.
    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: tp_status, the frame header's first u32, is 16-byte aligned (page-aligned
        // blocks, frame sizes multiples of 16), lives as long as the link's mapping, and is
        // only accessed atomically (the kernel uses READ_ONCE/WRITE_ONCE with barriers).
        unsafe { AtomicU32::from_ptr(self.frame(i) as *mut u32) }
    }

    fn header(&self, i: usize) -> *mut libc::tpacket2_hdr {
        self.frame(i) as *mut libc::tpacket2_hdr
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Ring::map` with this length and is unmapped
        // once; no slice into it outlives the ring (slices borrow the link that owns it).
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.geo.bytes()) };
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
        if pkttype != libc::PACKET_HOST {
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
        if port != self.port {
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

fn setsockopt<T>(
    fd: &impl AsRawFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: &T,
) -> io::Result<()> {
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
        Err(io::Error::last_os_error())
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

/// The classic BPF program that accepts what this endpoint must see: a frame for this
/// host (not outgoing, broadcast, multicast or another host's), of our EtherType, for
/// `port` and `dpid`. Offsets count from the Ethernet header; a load past the end of a
/// short frame rejects it.
fn filter(port: u16, dpid: u16) -> [libc::sock_filter; 10] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let ld_w_abs = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ld_h_abs = libc::BPF_LD | libc::BPF_H | libc::BPF_ABS;
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    // Each test jumps to the last instruction (reject) when it fails: jf = 8 - pc.
    [
        /* 0 */
        op(
            ld_w_abs,
            0,
            0,
            (libc::SKF_AD_OFF + libc::SKF_AD_PKTTYPE) as u32,
        ),
        /* 1 */ op(jeq, 0, 7, u32::from(libc::PACKET_HOST)),
        /* 2 */ op(ld_h_abs, 0, 0, 12),
        /* 3 */ op(jeq, 0, 5, u32::from(ETHERTYPE)),
        /* 4 */ op(ld_h_abs, 0, 0, 14),
        /* 5 */ op(jeq, 0, 3, u32::from(port)),
        // ldh loads big-endian; dst_dpid is little-endian on the wire.
        /* 6 */
        op(ld_h_abs, 0, 0, DPID_AT as u32),
        /* 7 */ op(jeq, 0, 1, u32::from(dpid.swap_bytes())),
        /* 8 */ op(ret, 0, 0, u32::MAX),
        /* 9 */ op(ret, 0, 0, 0),
    ]
}

fn attach_filter(fd: BorrowedFd<'_>, port: u16, dpid: u16) -> io::Result<()> {
    let mut prog = filter(port, dpid);
    let fprog = libc::sock_fprog {
        len: prog.len() as libc::c_ushort,
        filter: prog.as_mut_ptr(),
    };
    // The kernel copies the program during the call; `prog` outlives it.
    setsockopt(&fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

/// The raw Ethernet links open in this process, and those of them that run without
/// their BPF filter. The filter keeps the frames of the node's other endpoints out of a
/// link's ring, and costs every received frame a run (0.05 µs of a ping-pong through
/// 100 Mbit/s, PERFORMANCE section 3). A link whose rank is alone on its node, opened
/// while no other link is open in the process, has no other endpoint beside it and runs
/// without; `EthLink::rx_len` checks in user space what only the filter checked (the
/// frame is addressed to this host, and to our port). The next link to open in the
/// process attaches the filters of those first, since from then on every socket would
/// get the frames of all.
struct ProcessLinks {
    open: usize,
    unfiltered: Vec<(RawFd, u16, u16)>,
}

static PROCESS_LINKS: Mutex<ProcessLinks> = Mutex::new(ProcessLinks {
    open: 0,
    unfiltered: Vec::new(),
});

impl ProcessLinks {
    /// A link `(descriptor, port, dpid)` opens: whether it needs its filter, and the links
    /// that need theirs attached now.
    fn opening(
        &mut self,
        alone_on_node: bool,
        link: (RawFd, u16, u16),
    ) -> (bool, Vec<(RawFd, u16, u16)>) {
        self.open += 1;
        if alone_on_node && self.open == 1 {
            self.unfiltered.push(link);
            (false, Vec::new())
        } else {
            (true, std::mem::take(&mut self.unfiltered))
        }
    }

    /// The link with this descriptor closes (before the descriptor does).
    fn closing(&mut self, fd: RawFd) {
        self.open = self.open.saturating_sub(1);
        self.unfiltered.retain(|l| l.0 != fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    fn lo() -> Interface {
        Interface::by_name("lo").unwrap()
    }

    fn rand_u16() -> u16 {
        getrandom::u32().unwrap() as u16
    }

    /// A random port and dpid, with distinct bytes in the dpid (so that a byte-swapped
    /// dpid is another dpid).
    fn addr() -> (u16, u16) {
        let port = 1024 + rand_u16() % 60000;
        loop {
            let dpid = rand_u16();
            if dpid >> 8 != dpid & 0xff {
                return (port, dpid);
            }
        }
    }

    /// Opens a link on lo, or None (after saying so) without CAP_NET_RAW.
    fn open(port: u16, dpid: u16, ring_bytes: usize) -> Option<EthLink> {
        let lo = lo();
        match EthLink::open(&lo, port, dpid, ring_bytes / rx_frame_bytes(lo.mtu), false) {
            Ok(l) => Some(l),
            Err(e) if is_permission(&e) => {
                eprintln!("skipping: no CAP_NET_RAW ({e})");
                None
            }
            Err(e) => panic!("opening a raw link on lo: {e}"),
        }
    }

    /// A sending link (1 MiB ring) and a receiving link (`recv_ring`) on lo, with the
    /// receiver's port and DPID; `None` without CAP_NET_RAW.
    struct Ends {
        s: EthLink,
        r: EthLink,
        pr: u16,
        dr: u16,
    }

    fn ends(recv_ring: usize) -> Option<Ends> {
        let (ps, ds) = addr();
        let (pr, dr) = addr();
        let s = open(ps, ds, 1 << 20)?;
        let r = open(pr, dr, recv_ring)?;
        Some(Ends { s, r, pr, dr })
    }

    fn dest(port: u16) -> EthDest {
        EthDest {
            mac: MacAddr([0; 6]),
            port,
        }
    }

    struct Rng(u64);
    impl Rng {
        fn new() -> Rng {
            Rng(getrandom::u64().unwrap() | 1)
        }
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// A quiver-like frame: dst_dpid at 4, seq at 20, a body that depends on seq.
    fn frame(dpid: u16, seq: u32, len: usize) -> Vec<u8> {
        assert!(len >= 32);
        let mut f = vec![0u8; len];
        f[0] = 0x11;
        f[4..6].copy_from_slice(&dpid.to_le_bytes());
        f[20..24].copy_from_slice(&seq.to_le_bytes());
        f[24..28].copy_from_slice(&(len as u32).to_le_bytes());
        for (k, b) in f[32..].iter_mut().enumerate() {
            *b = (seq as usize)
                .wrapping_mul(131)
                .wrapping_add(k * 7 + (k >> 8)) as u8;
        }
        f
    }

    /// Checks a received frame byte for byte; returns its seq.
    fn check(got: &[u8], dpid: u16) -> u32 {
        assert!(got.len() >= 32, "frame of {} bytes", got.len());
        let seq = u32::from_le_bytes(got[20..24].try_into().unwrap());
        let len = u32::from_le_bytes(got[24..28].try_into().unwrap()) as usize;
        assert_eq!(got.len(), len, "length of frame {seq}");
        assert!(
            got == frame(dpid, seq, len).as_slice(),
            "bytes of frame {seq}"
        );
        seq
    }

    /// Busy-polls until `n` frames arrived (panics after WAIT).
    fn recv_n(link: &mut EthLink, n: usize) -> Vec<Datagram> {
        let mut out = Vec::new();
        let start = Instant::now();
        while out.len() < n {
            link.recv_batch(&mut out).unwrap();
            if start.elapsed() > WAIT {
                panic!("{} of {n} frames arrived", out.len());
            }
            std::thread::yield_now();
        }
        assert_eq!(out.len(), n, "more frames than sent");
        out
    }

    /// Receives `n` frames, checks them and their order from `first`, frees them.
    fn recv_check_free(link: &mut EthLink, dpid: u16, n: usize, first: u32) {
        for (k, d) in recv_n(link, n).into_iter().enumerate() {
            assert_eq!(check(&link.slot(d.slot)[..d.len], dpid), first + k as u32);
            link.free_slot(d.slot);
        }
    }

    /// Nothing more arrives within `ms`.
    fn quiet(link: &mut EthLink, ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
        let mut out = Vec::new();
        link.recv_batch(&mut out).unwrap();
        assert!(out.is_empty(), "unexpected frames: {out:?}");
    }

    /// Only the first link of a process whose rank is alone on its node goes without
    /// its filter; the next one to open has the filters of the others attached, and a
    /// closed link leaves the registry.
    #[test]
    fn only_a_lone_link_goes_without_its_filter() {
        let mut links = ProcessLinks {
            open: 0,
            unfiltered: Vec::new(),
        };
        assert_eq!(links.opening(true, (10, 0, 1)), (false, vec![]));
        assert_eq!(links.opening(true, (11, 0, 2)), (true, vec![(10, 0, 1)]));
        assert_eq!(links.opening(true, (12, 0, 3)), (true, vec![]));
        for fd in [10, 11, 12] {
            links.closing(fd);
        }
        assert_eq!((links.open, links.unfiltered.len()), (0, 0));
        // Another rank on the node: filtered from the start.
        assert_eq!(links.opening(false, (13, 1, 1)), (true, vec![]));
        links.closing(13);
        // A lone link that closes before the next opens is forgotten.
        assert_eq!(links.opening(true, (14, 0, 1)), (false, vec![]));
        links.closing(14);
        assert_eq!(links.opening(true, (14, 0, 2)), (false, vec![]));
        assert_eq!(links.unfiltered, vec![(14, 0, 2)]);
    }

    /// A link without its filter gets every quiver frame of the interface; it gives back
    /// unread, and counts, those for another host (a bridge floods what it has not
    /// learned; on lo a frame to another MAC comes back as PACKET_OTHERHOST) and those for
    /// another port, and hands out its own. A link with its filter never sees the others.
    #[test]
    fn a_link_without_its_filter_drops_frames_for_others_in_user_space() {
        let (ps, ds) = addr();
        let (pr, dr) = addr();
        let Some(s) = open(ps, ds, 1 << 20) else {
            return;
        };
        let lo = lo();
        let registry: &'static Mutex<ProcessLinks> =
            Box::leak(Box::new(Mutex::new(ProcessLinks {
                open: 0,
                unfiltered: Vec::new(),
            })));
        let mut bare = EthLink::open_with(&lo, pr, dr, 64, true, registry).unwrap();
        let mut filtered =
            EthLink::open_with(&lo, pr.wrapping_add(1), dr, 64, true, registry).unwrap();
        assert_eq!(registry.lock().unwrap().open, 2);
        // The second link attached the first one's filter: open a third registry to
        // have a bare link again.
        let registry2: &'static Mutex<ProcessLinks> =
            Box::leak(Box::new(Mutex::new(ProcessLinks {
                open: 0,
                unfiltered: Vec::new(),
            })));
        drop(bare);
        bare = EthLink::open_with(&lo, pr, dr, 64, true, registry2).unwrap();
        let other_host = EthDest {
            mac: MacAddr([0x02, 0, 0, 0, 0, 0x99]),
            port: pr,
        };
        s.send_datagram(&other_host, &frame(dr, 1, 64)).unwrap();
        s.send_datagram(&dest(pr.wrapping_add(1)), &frame(dr, 2, 64))
            .unwrap();
        s.send_datagram(&dest(pr), &frame(dr, 3, 64)).unwrap();
        let got = recv_n(&mut bare, 1);
        assert_eq!(check(&bare.slot(got[0].slot)[..got[0].len], dr), 3);
        bare.free_slot(got[0].slot);
        quiet(&mut bare, 20);
        assert_eq!(bare.misaddressed(), 2);
        // The filtered link (port pr + 1) got frame 2 only, through its filter.
        let got = recv_n(&mut filtered, 1);
        assert_eq!(check(&filtered.slot(got[0].slot)[..got[0].len], dr), 2);
        filtered.free_slot(got[0].slot);
        quiet(&mut filtered, 20);
        assert_eq!(filtered.misaddressed(), 0);
        drop((bare, filtered));
        assert_eq!(registry.lock().unwrap().open, 0);
        assert_eq!(registry2.lock().unwrap().open, 0);
    }

    /// The layouts satisfy what PACKET_RX_RING/PACKET_TX_RING check: page-multiple
    /// (power-of-two) blocks holding whole 16-byte-aligned frames, frame_nr equal to
    /// frames per block times blocks; and a frame holds 14 + MTU bytes.
    #[test]
    fn ring_geometry() {
        let page = 4096;
        for mtu in [MIN_MTU, 1500, 9000, 65536] {
            for ring_bytes in [0, 4 << 20, 16 << 20] {
                let (rx, tx) = layouts(mtu, ring_bytes / rx_frame_bytes(mtu), page);
                assert!(rx.frame_size >= RX_NET + mtu);
                assert!(tx.frame_size >= TX_DATA + ETH_HLEN + mtu);
                assert!(rx.frames() >= MIN_RX_FRAMES && rx.frames() >= ring_bytes / rx.frame_size);
                assert!(tx.frames() <= TX_FRAMES);
                assert!(tx.frames() * tx.frame_size <= TX_BYTES || tx.block_nr == 1);
                for g in [rx, tx] {
                    assert_eq!(g.frame_size % libc::TPACKET_ALIGNMENT, 0);
                    assert!(g.block_size.is_power_of_two() && g.block_size % page == 0);
                    assert!(g.frames_per_block >= 1);
                    assert!(g.frames_per_block * g.frame_size <= g.block_size);
                    assert!(
                        g.block_size % g.frame_size <= g.block_size / 8
                            || g.block_size >= MAX_BLOCK
                    );
                    let r = g.req();
                    assert_eq!(
                        r.tp_frame_nr,
                        r.tp_block_size / r.tp_frame_size * r.tp_block_nr
                    );
                    assert!(g.offset(g.frames() - 1) + g.frame_size <= g.bytes());
                }
                println!(
                    "mtu {mtu} ring_bytes {ring_bytes}: rx {} frames of {} in {} x {} ({} bytes); tx {} frames of {} in {} x {} ({} bytes)",
                    rx.frames(), rx.frame_size, rx.block_nr, rx.block_size, rx.bytes(),
                    tx.frames(), tx.frame_size, tx.block_nr, tx.block_size, tx.bytes()
                );
            }
        }
    }

    #[test]
    fn mac_parse_and_display() {
        let m: MacAddr = "02:42:AC:11:00:0f".parse().unwrap();
        assert_eq!(m, MacAddr([0x02, 0x42, 0xac, 0x11, 0x00, 0x0f]));
        assert_eq!(m.to_string(), "02:42:ac:11:00:0f");
        for bad in [
            "",
            "02:42:ac:11:00",
            "02:42:ac:11:00:0f:00",
            "2:42:ac:11:00:0f",
            "02-42-ac-11-00-0f",
            "02:42:ac:11:00:0g",
        ] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert!(e.to_string().contains("not a MAC address"), "{e}");
            assert!(matches!(Error::from(e.clone()), Error::Config(_)));
            assert_eq!(String::from(e.clone()), e.to_string());
        }
    }

    #[test]
    fn interface_with_addr_finds_lo() {
        let lo = Interface::with_addr("127.0.0.1".parse().unwrap())
            .unwrap()
            .expect("lo has 127.0.0.1");
        assert_eq!(lo.name, "lo");
        assert_eq!(lo.mac, MacAddr([0; 6]));
        let mtu: usize = std::fs::read_to_string("/sys/class/net/lo/mtu")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(lo.mtu, mtu);
        let index: u32 = std::fs::read_to_string("/sys/class/net/lo/ifindex")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(lo.index, index);
        assert_eq!(
            Interface::with_addr("192.0.2.201".parse().unwrap()).unwrap(),
            None
        );
        assert!(Interface::by_name("quiver-none0").is_err());
        assert!(matches!(
            Interface::by_name("a-name-far-too-long"),
            Err(Error::Config(_))
        ));
    }

    #[test]
    fn two_links_exchange_frames() {
        let (pa, da) = addr();
        let (pb, db) = addr();
        let Some(mut a) = open(pa, da, 4 << 20) else {
            return;
        };
        let Some(mut b) = open(pb, db, 4 << 20) else {
            return;
        };
        assert_eq!(a.mac(), MacAddr([0; 6]));
        let mut rng = Rng::new();
        for seq in 0..2000u32 {
            let fa = frame(db, seq, 32 + rng.below(3000));
            a.send_datagram(&dest(pb), &fa).unwrap();
            let d = recv_n(&mut b, 1)[0];
            assert_eq!(check(&b.slot(d.slot)[..d.len], db), seq);
            b.free_slot(d.slot);
            let fb = frame(da, seq, 32 + rng.below(3000));
            b.send_datagram(&dest(pa), &fb).unwrap();
            let d = recv_n(&mut a, 1)[0];
            assert_eq!(check(&a.slot(d.slot)[..d.len], da), seq);
            a.free_slot(d.slot);
        }
        quiet(&mut a, 20);
        quiet(&mut b, 0);
        assert_eq!(a.ring_drops() + b.ring_drops(), 0);
    }

    #[test]
    fn lone_small_frames_are_copied_and_keep_their_order_among_ring_batches() {
        let Some(Ends { s, mut r, pr, dr }) = ends(4 << 20) else {
            return;
        };
        let mut rng = Rng::new();
        let mut seq = 0u32;
        let mut sent = 0;
        for _ in 0..300 {
            match rng.below(3) {
                // A lone small frame: by copy.
                0 => {
                    s.send_datagram(&dest(pr), &frame(dr, seq, 32 + rng.below(200)))
                        .unwrap();
                    seq += 1;
                }
                // A lone large one: through the ring.
                1 => {
                    s.send_datagram(&dest(pr), &frame(dr, seq, 300 + rng.below(1000)))
                        .unwrap();
                    seq += 1;
                }
                // A batch of small ones: through the ring.
                _ => {
                    let batch: Vec<Vec<u8>> = (0..1 + rng.below(8))
                        .map(|i| frame(dr, seq + i as u32, 32 + rng.below(100)))
                        .collect();
                    let refs: Vec<&[u8]> = batch.iter().map(|f| f.as_slice()).collect();
                    s.send_batch(&dest(pr), &refs).unwrap();
                    seq += batch.len() as u32;
                }
            }
            let got = recv_n(&mut r, (seq - sent) as usize);
            for d in got {
                assert_eq!(check(&r.slot(d.slot)[..d.len], dr), sent, "order");
                r.free_slot(d.slot);
                sent += 1;
            }
        }
        assert!(s.copied.get() > 0, "no frame went by copy");
        assert!(s.copied.get() < u64::from(seq), "every frame went by copy");
    }

    #[test]
    fn filter_rejects_other_port_dpid_type_and_host() {
        let (port, dpid) = addr();
        let Some(mut r) = open(port, dpid, 1 << 20) else {
            return;
        };
        // A plain packet socket injects hand-made frames.
        // SAFETY: plain socket call, checked.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        assert!(raw >= 0, "{}", io::Error::last_os_error());
        // SAFETY: fresh descriptor.
        let raw = unsafe { OwnedFd::from_raw_fd(raw) };
        // The length field says `len`; `pad` bytes of zeros follow the body (as a NIC pads).
        let inject_raw =
            |dst: [u8; 6], ethertype: u16, port: u16, len: usize, body: &[u8], pad: usize| {
                let mut f = Vec::new();
                f.extend_from_slice(&dst);
                f.extend_from_slice(&[0; 6]);
                f.extend_from_slice(&ethertype.to_be_bytes());
                f.extend_from_slice(&port.to_be_bytes());
                f.extend_from_slice(&(len as u16).to_be_bytes());
                f.extend_from_slice(body);
                f.resize(f.len() + pad, 0);
                // SAFETY: zeroed sockaddr_ll is valid.
                let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                sll.sll_family = libc::AF_PACKET as u16;
                sll.sll_protocol = ethertype.to_be();
                sll.sll_ifindex = lo().index as i32;
                sll.sll_halen = 6;
                sll.sll_addr[..6].copy_from_slice(&dst);
                // SAFETY: f and sll are valid for the call.
                let n = unsafe {
                    libc::sendto(
                        raw.as_raw_fd(),
                        f.as_ptr().cast(),
                        f.len(),
                        0,
                        &sll as *const _ as *const libc::sockaddr,
                        std::mem::size_of::<libc::sockaddr_ll>() as u32,
                    )
                };
                assert_eq!(n, f.len() as isize, "{}", io::Error::last_os_error());
            };
        let inject = |dst: [u8; 6], ethertype: u16, port: u16, body: &[u8]| {
            inject_raw(dst, ethertype, port, body.len(), body, 0)
        };
        let host = [0u8; 6];
        inject(host, ETHERTYPE, port.wrapping_add(1), &frame(dpid, 1, 64));
        inject(host, ETHERTYPE, port, &frame(dpid ^ 0x0001, 2, 64));
        inject(host, ETHERTYPE, port, &frame(dpid ^ 0x0100, 3, 64));
        inject(host, ETHERTYPE, port, &frame(dpid.swap_bytes(), 4, 64));
        inject(host, ETHERTYPE + 1, port, &frame(dpid, 5, 64));
        inject([0xff; 6], ETHERTYPE, port, &frame(dpid, 6, 64)); // broadcast
        inject(
            [0x01, 0, 0x5e, 0, 0, 1],
            ETHERTYPE,
            port,
            &frame(dpid, 7, 64),
        ); // multicast
        inject([0x02, 0, 0, 0, 0, 1], ETHERTYPE, port, &frame(dpid, 8, 64)); // another host
        inject(host, ETHERTYPE, port, &dpid.to_le_bytes()[..1]); // too short for the dpid
                                                                 // The link's own sends to another port of this host.
        r.send_datagram(&dest(port.wrapping_add(1)), &frame(dpid, 9, 64))
            .unwrap();
        inject(host, ETHERTYPE, port, &frame(dpid, 10, 100));
        // Frames on lo are delivered in order: the good one is the first and only.
        let got = recv_n(&mut r, 1)[0];
        assert_eq!(check(&r.slot(got.slot)[..got.len], dpid), 10);
        r.free_slot(got.slot);
        quiet(&mut r, 50);
        // A frame sent to ourselves (same port and dpid) comes back: lo loops it.
        r.send_datagram(&dest(port), &frame(dpid, 11, 40)).unwrap();
        recv_check_free(&mut r, dpid, 1, 11);
        // Padding behind the frame (a NIC pads short frames) is not part of it.
        inject_raw(host, ETHERTYPE, port, 32, &frame(dpid, 12, 32), 10);
        recv_check_free(&mut r, dpid, 1, 12);
        // A length field beyond what arrived: handed on with length 0 (malformed).
        inject_raw(host, ETHERTYPE, port, 41, &frame(dpid, 13, 40), 0);
        let got = recv_n(&mut r, 1)[0];
        assert_eq!(
            got.len, 0,
            "a frame shorter than its length field is malformed"
        );
        r.free_slot(got.slot);
    }

    #[test]
    fn ring_wraps_many_times_with_frees_out_of_order() {
        let Some(Ends { s, mut r, pr, dr }) = ends(2 << 20) else {
            return;
        };
        let n = r.slots();
        let mut rng = Rng::new();
        // Held frames: (slot, seq, len); the kernel may fill up to the first held frame.
        let mut held: Vec<(u32, u32, usize)> = Vec::new();
        let mut seq = 0u32;
        let mut bufs: Vec<Vec<u8>> = Vec::new();
        while (seq as usize) < 40 * n {
            let cursor = r.rx_cursor;
            let room = held
                .iter()
                .map(|&(h, _, _)| (h as usize + n - cursor) % n)
                .min()
                .unwrap_or(n);
            if room > 0 {
                let k = 1 + rng.below(room);
                bufs.clear();
                for j in 0..k {
                    let len = if rng.below(50) == 0 {
                        s.max_datagram()
                    } else {
                        32 + rng.below(1500)
                    };
                    bufs.push(frame(dr, seq + j as u32, len));
                }
                let refs: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
                s.send_batch(&dest(pr), &refs).unwrap();
                for (j, d) in recv_n(&mut r, k).into_iter().enumerate() {
                    assert_eq!(d.slot as usize, (cursor + j) % n, "ring order");
                    assert_eq!(check(&r.slot(d.slot)[..d.len], dr), seq + j as u32);
                    held.push((d.slot, seq + j as u32, d.len));
                }
                seq += k as u32;
            }
            // Keep a random number of frames, free the others in random order.
            let keep = rng.below(n / 2 + 1);
            while held.len() > keep {
                let (slot, sq, len) = held.swap_remove(rng.below(held.len()));
                // Held frames are untouched by the kernel until freed.
                assert_eq!(check(&r.slot(slot)[..len], dr), sq);
                r.free_slot(slot);
            }
        }
        for (slot, _, _) in held.drain(..) {
            r.free_slot(slot);
        }
        assert_eq!(r.ring_drops(), 0);
        quiet(&mut r, 20);
    }

    #[test]
    fn held_frame_blocks_the_kernel_until_freed() {
        let Some(Ends { s, mut r, pr, dr }) = ends(1 << 20) else {
            return;
        };
        let n = r.slots() as u32;
        s.send_datagram(&dest(pr), &frame(dr, 0, 500)).unwrap();
        let first = recv_n(&mut r, 1)[0];
        assert_eq!(first.slot, 0);
        for seq in 1..n {
            s.send_datagram(&dest(pr), &frame(dr, seq, 500)).unwrap();
            recv_check_free(&mut r, dr, 1, seq);
        }
        // The kernel's head is back at slot 0, which we hold: these are dropped.
        assert_eq!(r.ring_drops(), 0);
        for seq in n..n + 5 {
            s.send_datagram(&dest(pr), &frame(dr, seq, 500)).unwrap();
        }
        let start = Instant::now();
        while r.ring_drops() < 5 {
            assert!(start.elapsed() < WAIT, "drops: {}", r.ring_drops());
            std::thread::yield_now();
        }
        assert_eq!(r.ring_drops(), 5);
        quiet(&mut r, 20);
        assert_eq!(
            check(&r.slot(first.slot)[..first.len], dr),
            0,
            "held frame intact"
        );
        r.free_slot(first.slot);
        // Traffic resumes at slot 0.
        let batch: Vec<Vec<u8>> = (0..3).map(|k| frame(dr, 100 + k, 700)).collect();
        let refs: Vec<&[u8]> = batch.iter().map(|b| b.as_slice()).collect();
        s.send_batch(&dest(pr), &refs).unwrap();
        let got = recv_n(&mut r, 3);
        assert_eq!(
            got.iter().map(|d| d.slot).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        for (k, d) in got.into_iter().enumerate() {
            assert_eq!(check(&r.slot(d.slot)[..d.len], dr), 100 + k as u32);
            r.free_slot(d.slot);
        }
        assert_eq!(r.ring_drops(), 5);
    }

    #[test]
    fn batch_larger_than_the_tx_ring() {
        let (ps, ds) = addr();
        let (pr, dr) = addr();
        let Some(s) = open(ps, ds, 1 << 20) else {
            return;
        };
        let tx = s.tx.geo.frames();
        let count = 3 * tx + 7;
        let frame_bytes = align(RX_NET + lo().mtu);
        let Some(mut r) = open(pr, dr, (count + 16) * frame_bytes) else {
            return;
        };
        assert!(r.slots() >= count);
        let mut rng = Rng::new();
        let bufs: Vec<Vec<u8>> = (0..count)
            .map(|k| {
                let len = if k % 10 == 0 {
                    s.max_datagram()
                } else {
                    32 + rng.below(9000)
                };
                frame(dr, k as u32, len)
            })
            .collect();
        let refs: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
        s.send_batch(&dest(pr), &refs).unwrap();
        recv_check_free(&mut r, dr, count, 0);
        assert_eq!(r.ring_drops(), 0);
        // And again, through the wrapped TX ring.
        s.send_batch(&dest(pr), &refs).unwrap();
        recv_check_free(&mut r, dr, count, 0);
    }

    #[test]
    fn largest_frame_passes_and_a_larger_one_is_refused() {
        let Some(Ends { s, mut r, pr, dr }) = ends(1 << 20) else {
            return;
        };
        assert_eq!(s.max_datagram(), (lo().mtu - LINK_EXTRA).min(65535));
        s.send_datagram(&dest(pr), &frame(dr, 1, s.max_datagram()))
            .unwrap();
        recv_check_free(&mut r, dr, 1, 1);
        let small = frame(dr, 2, 40);
        let big = frame(dr, 3, s.max_datagram() + 1);
        let e = s.send_batch(&dest(pr), &[&small, &big]).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert!(e.to_string().contains("exceeds"), "{e}");
        quiet(&mut r, 20);
        s.send_datagram(&dest(pr), &small).unwrap();
        recv_check_free(&mut r, dr, 1, 2);
    }

    /// A sender thread streams batches while the receiver checks every byte of what
    /// arrives: frames may be dropped when the receiver falls behind (counted), never
    /// corrupted or reordered.
    #[test]
    fn concurrent_stream_is_intact_and_in_order() {
        let Some(Ends { s, mut r, pr, dr }) = ends(4 << 20) else {
            return;
        };
        let total: u32 = std::env::var("QUIVER_ETH_STRESS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50_000);
        let sender = std::thread::spawn(move || {
            let mut rng = Rng::new();
            let mut seq = 0u32;
            while seq < total {
                let k = (1 + rng.below(64) as u32).min(total - seq);
                let bufs: Vec<Vec<u8>> = (seq..seq + k)
                    .map(|q| {
                        frame(
                            dr,
                            q,
                            32 + rng.below(if q % 7 == 0 { 20_000 } else { 1400 }),
                        )
                    })
                    .collect();
                let refs: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
                s.send_batch(&dest(pr), &refs).unwrap();
                seq += k;
            }
        });
        let mut out = Vec::new();
        let (mut got, mut last) = (0u64, None::<u32>);
        let mut idle = Instant::now();
        loop {
            r.recv_batch(&mut out).unwrap();
            if !out.is_empty() {
                idle = Instant::now();
            }
            for d in out.drain(..) {
                let q = check(&r.slot(d.slot)[..d.len], dr);
                assert!(last.is_none_or(|l| q > l), "frame {q} after {last:?}");
                last = Some(q);
                got += 1;
                r.free_slot(d.slot);
            }
            // Done at the last frame, or when the sender is done and nothing came for a
            // while (the last frames were dropped).
            if last == Some(total - 1)
                || (sender.is_finished() && idle.elapsed() > Duration::from_millis(100))
            {
                break;
            }
        }
        sender.join().unwrap();
        let drops = r.ring_drops();
        println!("stream: {got} of {total} frames received, {drops} dropped by the kernel");
        assert!(got > 0);
    }

    /// The descriptor polls readable while the newest frame is not the kernel's, even
    /// after recv_batch took it; edge-triggered epoll reports each arrival once.
    #[test]
    fn readiness_follows_the_newest_frame() {
        let Some(Ends { s, mut r, pr, dr }) = ends(1 << 20) else {
            return;
        };
        let readable = |r: &EthLink| {
            let mut p = libc::pollfd {
                fd: r.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        // SAFETY: plain epoll calls, checked.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        // SAFETY: fresh descriptor.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: 0,
        };
        // SAFETY: valid descriptors and event.
        let rc =
            unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, r.as_raw_fd(), &mut ev) };
        assert_eq!(rc, 0);
        let events = || {
            let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 2];
            // SAFETY: evs is writable for 2 events.
            unsafe { libc::epoll_wait(ep.as_raw_fd(), evs.as_mut_ptr(), 2, 0) }
        };
        assert!(!readable(&r));
        assert_eq!(events(), 0);
        s.send_datagram(&dest(pr), &frame(dr, 1, 64)).unwrap();
        let d = recv_n(&mut r, 1)[0];
        // Taken but held: still readable, level-triggered; the edge came once.
        assert!(readable(&r));
        assert_eq!(events(), 1);
        assert_eq!(events(), 0);
        r.free_slot(d.slot);
        assert!(!readable(&r));
        s.send_datagram(&dest(pr), &frame(dr, 2, 64)).unwrap();
        let d = recv_n(&mut r, 1)[0];
        assert_eq!(events(), 1);
        r.free_slot(d.slot);
    }

    /// Runs `f` on a thread of its own (capabilities and network namespaces are
    /// per-thread, so changing them there leaves the other tests alone).
    fn on_own_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(f).join().unwrap();
    }

    #[test]
    fn missing_cap_net_raw_is_recognised() {
        on_own_thread(|| {
            #[repr(C)]
            struct Header {
                version: u32,
                pid: i32,
            }
            #[repr(C)]
            #[derive(Clone, Copy, Default)]
            struct Data {
                effective: u32,
                permitted: u32,
                inheritable: u32,
            }
            const CAP_NET_RAW: u32 = 13;
            let mut h = Header {
                version: 0x2008_0522,
                pid: 0,
            };
            let mut d = [Data::default(); 2];
            // SAFETY: capget fills the header and two data structs (version 3).
            let rc = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
            assert_eq!(rc, 0, "{}", io::Error::last_os_error());
            d[0].effective &= !(1 << CAP_NET_RAW);
            // SAFETY: capset reads the header and two data structs; pid 0 is this thread.
            let rc = unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) };
            assert_eq!(rc, 0, "{}", io::Error::last_os_error());
            let (port, dpid) = addr();
            let lo = lo();
            match EthLink::open(&lo, port, dpid, (1 << 20) / rx_frame_bytes(lo.mtu), false) {
                Ok(_) => panic!("opened a raw link without CAP_NET_RAW"),
                Err(e) => assert!(is_permission(&e), "{e}"),
            }
        });
        assert!(!is_permission(&Error::Config("x".into())));
    }

    /// In a network namespace of its own, lowers lo's MTU under an open link: the kernel
    /// refuses the frame, the error comes back once, and the ring goes on.
    #[test]
    fn frame_refused_after_mtu_change_is_reported_and_the_ring_recovers() {
        on_own_thread(|| {
            // SAFETY: unshare affects only this thread (CLONE_NEWNET is per task).
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!(
                    "skipping: unshare(CLONE_NEWNET): {}",
                    io::Error::last_os_error()
                );
                return;
            }
            // SAFETY: plain socket call, checked.
            let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
            assert!(sock >= 0);
            // SAFETY: fresh descriptor.
            let sock = unsafe { OwnedFd::from_raw_fd(sock) };
            let set = |req: libc::c_ulong, fill: &dyn Fn(&mut libc::ifreq)| {
                // SAFETY: zeroed ifreq is valid.
                let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
                r.ifr_name[0] = b'l' as libc::c_char;
                r.ifr_name[1] = b'o' as libc::c_char;
                fill(&mut r);
                // SAFETY: r is a valid ifreq for the request.
                let rc = unsafe { libc::ioctl(sock.as_raw_fd(), req as _, &mut r) };
                assert_eq!(rc, 0, "{}", io::Error::last_os_error());
            };
            set(libc::SIOCSIFFLAGS, &|r| {
                r.ifr_ifru.ifru_flags =
                    (libc::IFF_UP | libc::IFF_LOOPBACK | libc::IFF_RUNNING) as libc::c_short
            });
            let Some(Ends { s, mut r, pr, dr }) = ends(1 << 20) else {
                return;
            };
            s.send_datagram(&dest(pr), &frame(dr, 1, 3000)).unwrap();
            recv_check_free(&mut r, dr, 1, 1);
            set(libc::SIOCSIFMTU, &|r| r.ifr_ifru.ifru_mtu = 1500);
            let e = s.send_datagram(&dest(pr), &frame(dr, 2, 3000)).unwrap_err();
            assert!(matches!(e, Error::Io { .. }), "{e}");
            // The refused frame went out as a runt that nobody takes; what follows flows.
            let bufs: Vec<Vec<u8>> = (3..3 + 2 * s.tx.geo.frames() as u32)
                .map(|k| frame(dr, k, 1000))
                .collect();
            for b in &bufs {
                s.send_datagram(&dest(pr), b).unwrap();
                let d = recv_n(&mut r, 1)[0];
                check(&r.slot(d.slot)[..d.len], dr);
                r.free_slot(d.slot);
            }
            quiet(&mut r, 20);
        });
    }

    /// Runs a command of iproute2 in this thread's network namespace; false (after
    /// saying why) if it cannot.
    fn ip_cmd(prog: &str, args: &str) -> bool {
        match std::process::Command::new(prog)
            .args(args.split(' '))
            .output()
        {
            Ok(o) if o.status.success() => true,
            Ok(o) => {
                eprintln!(
                    "skipping: {prog} {args}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                false
            }
            Err(e) => {
                eprintln!("skipping: {prog}: {e}");
                false
            }
        }
    }

    /// A veth pair shaped by a tbf qdisc with a short queue, as the emulated clusters
    /// are: the qdisc refuses frames (ENOBUFS) and fills the send buffer; send_batch
    /// waits and retries, and every frame arrives, in order, at the shaped rate.
    #[test]
    fn shaped_veth_applies_backpressure_without_loss() {
        on_own_thread(|| {
            // SAFETY: unshare affects only this thread (CLONE_NEWNET is per task); the
            // commands below are forked from it and run in its namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!(
                    "skipping: unshare(CLONE_NEWNET): {}",
                    io::Error::last_os_error()
                );
                return;
            }
            const RATE_MBIT: f64 = 100.0;
            if !(ip_cmd("ip", "link add qa type veth peer name qb")
                && ip_cmd("ip", "link set qa up")
                && ip_cmd("ip", "link set qb up")
                && ip_cmd(
                    "tc",
                    "qdisc add dev qa root tbf rate 100mbit burst 16kb limit 20000",
                ))
            {
                return;
            }
            let (qa, qb) = (
                Interface::by_name("qa").unwrap(),
                Interface::by_name("qb").unwrap(),
            );
            let (ps, ds) = addr();
            let (pr, dr) = addr();
            let count = 3000usize;
            let s = match EthLink::open(&qa, ps, ds, 662, false) {
                Ok(l) => l,
                Err(e) if is_permission(&e) => return,
                Err(e) => panic!("{e}"),
            };
            let mut r = EthLink::open(&qb, pr, dr, count + 64, false).unwrap();
            assert!(r.slots() >= count);
            let to = EthDest {
                mac: qb.mac,
                port: pr,
            };
            let bufs: Vec<Vec<u8>> = (0..count as u32).map(|k| frame(dr, k, 1400)).collect();
            let start = Instant::now();
            for chunk in bufs.chunks(64) {
                let refs: Vec<&[u8]> = chunk.iter().map(|b| b.as_slice()).collect();
                s.send_batch(&to, &refs).unwrap();
            }
            recv_check_free(&mut r, dr, count, 0);
            let took = start.elapsed().as_secs_f64();
            let wire = (count * (1400 + LINK_HEADER)) as f64 * 8.0 / (RATE_MBIT * 1e6);
            println!(
                "shaped veth: {count} frames in {took:.3} s (the shaped rate needs {wire:.3} s)"
            );
            assert!(
                took > 0.8 * wire,
                "the qdisc was bypassed: {took} s < {wire} s"
            );
            assert_eq!(r.ring_drops(), 0);
            quiet(&mut r, 20);
        });
    }

    // ---- Latency: not a test; `cargo test --release -p quiver --lib eth::tests::pingpong -- --ignored --nocapture`.

    const ROUNDS: usize = 200_000;
    const WARMUP: usize = 20_000;
    const PING: usize = 64;

    /// A plain packet socket (no rings) with the same filter, bound to lo.
    fn plain_socket(port: u16, dpid: u16) -> OwnedFd {
        // SAFETY: plain socket call, checked.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        assert!(raw >= 0);
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        attach_filter(fd.as_fd(), port, dpid).unwrap();
        setsockopt(
            &fd,
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &1 as &libc::c_int,
        )
        .unwrap();
        // SAFETY: zeroed sockaddr_ll is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETHERTYPE.to_be();
        sll.sll_ifindex = lo().index as i32;
        // SAFETY: valid sockaddr_ll.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0);
        fd
    }

    fn plain_send(fd: &OwnedFd, ifindex: i32, port: u16, body: &[u8]) {
        let mut f = [0u8; LINK_HEADER + PING];
        f[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        f[14..16].copy_from_slice(&port.to_be_bytes());
        f[16..18].copy_from_slice(&(body.len() as u16).to_be_bytes());
        f[18..].copy_from_slice(body);
        // SAFETY: zeroed sockaddr_ll is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETHERTYPE.to_be();
        sll.sll_ifindex = ifindex;
        sll.sll_halen = 6;
        // SAFETY: f and sll valid for the call.
        let n = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                f.as_ptr().cast(),
                f.len(),
                0,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(n, f.len() as isize);
    }

    fn plain_recv(fd: &OwnedFd) {
        let mut buf = [0u8; 2048];
        loop {
            // SAFETY: buf is writable for its length.
            let n = unsafe {
                libc::recv(
                    fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                return;
            }
        }
    }

    fn report(what: &str, per_round: &mut [f64]) {
        per_round.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let pct = |p: f64| per_round[((per_round.len() - 1) as f64 * p) as usize];
        let mean = per_round.iter().sum::<f64>() / per_round.len() as f64;
        println!(
            "{what}: round trip mean {:.2} us, p50 {:.2}, p99 {:.2}, p99.9 {:.2} (one way ~{:.2} us)",
            mean,
            pct(0.5),
            pct(0.99),
            pct(0.999),
            pct(0.5) / 2.0
        );
    }

    #[test]
    #[ignore]
    fn pingpong_latency() {
        let (pa, da) = addr();
        let (pb, db) = addr();
        // Ring path.
        {
            let Some(mut a) = open(pa, da, 1 << 20) else {
                return;
            };
            let Some(mut b) = open(pb, db, 1 << 20) else {
                return;
            };
            let echo = std::thread::spawn(move || {
                let mut out = Vec::new();
                let reply = frame(da, 0, PING);
                for _ in 0..ROUNDS + WARMUP {
                    while out.is_empty() {
                        b.recv_batch(&mut out).unwrap();
                    }
                    for d in out.drain(..) {
                        b.free_slot(d.slot);
                    }
                    b.send_datagram(&dest(pa), &reply).unwrap();
                }
            });
            let ping = frame(db, 0, PING);
            let mut out = Vec::new();
            let mut times = Vec::with_capacity(ROUNDS);
            for k in 0..ROUNDS + WARMUP {
                let t = Instant::now();
                a.send_datagram(&dest(pb), &ping).unwrap();
                while out.is_empty() {
                    a.recv_batch(&mut out).unwrap();
                }
                for d in out.drain(..) {
                    a.free_slot(d.slot);
                }
                if k >= WARMUP {
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            echo.join().unwrap();
            report("TPACKET_V2 rings", &mut times);
        }
        // Plain sendto/recv.
        {
            let a = plain_socket(pa, da);
            let b = plain_socket(pb, db);
            let ifindex = lo().index as i32;
            let echo = std::thread::spawn(move || {
                let reply = frame(da, 0, PING);
                for _ in 0..ROUNDS + WARMUP {
                    plain_recv(&b);
                    plain_send(&b, ifindex, pa, &reply);
                }
            });
            let ping = frame(db, 0, PING);
            let mut times = Vec::with_capacity(ROUNDS);
            for k in 0..ROUNDS + WARMUP {
                let t = Instant::now();
                plain_send(&a, ifindex, pb, &ping);
                plain_recv(&a);
                if k >= WARMUP {
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            echo.join().unwrap();
            report("plain AF_PACKET sendto/recv", &mut times);
        }
        // UDP on 127.0.0.1, for reference.
        {
            let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            a.set_nonblocking(true).unwrap();
            b.set_nonblocking(true).unwrap();
            let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
            let echo = std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                for _ in 0..ROUNDS + WARMUP {
                    while b.recv(&mut buf).is_err() {}
                    b.send_to(&buf[..PING], aa).unwrap();
                }
            });
            let ping = frame(db, 0, PING);
            let mut buf = [0u8; 2048];
            let mut times = Vec::with_capacity(ROUNDS);
            for k in 0..ROUNDS + WARMUP {
                let t = Instant::now();
                a.send_to(&ping, ba).unwrap();
                while a.recv(&mut buf).is_err() {}
                if k >= WARMUP {
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            echo.join().unwrap();
            report("UDP 127.0.0.1", &mut times);
        }
    }
}
