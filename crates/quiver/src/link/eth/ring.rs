//! The `TPACKET_V2` rings' geometry (how many blocks and frames of which size) and
//! [`Ring`], one mapped ring that unmaps itself on drop.

use super::*;

/// Shape of one ring as asked of the kernel: `block_nr` blocks of `block_size` bytes,
/// each holding `frames_per_block` frames of `frame_size` bytes (frames never straddle
/// blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Geometry {
    pub(super) frame_size: usize,
    pub(super) block_size: usize,
    pub(super) block_nr: usize,
    pub(super) frames_per_block: usize,
}

impl Geometry {
    /// A ring of about `frames` frames of `frame_size` bytes (a multiple of
    /// `TPACKET_ALIGNMENT`). A block is the smallest power-of-two multiple of the page
    /// size that holds a frame, doubled (up to `MAX_BLOCK`) while more than an eighth of
    /// it would be left over.
    pub(super) fn new(frame_size: usize, frames: usize, page: usize) -> Geometry {
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

    pub(super) fn frames(&self) -> usize {
        self.frames_per_block * self.block_nr
    }

    pub(super) fn bytes(&self) -> usize {
        self.block_size * self.block_nr
    }

    /// Byte offset of frame `i` in the ring.
    pub(super) fn offset(&self, i: usize) -> usize {
        (i / self.frames_per_block) * self.block_size
            + (i % self.frames_per_block) * self.frame_size
    }

    pub(super) fn req(&self) -> libc::tpacket_req {
        libc::tpacket_req {
            tp_block_size: self.block_size as libc::c_uint,
            tp_block_nr: self.block_nr as libc::c_uint,
            tp_frame_size: self.frame_size as libc::c_uint,
            tp_frame_nr: self.frames() as libc::c_uint,
        }
    }
}

/// Fewest channel windows the default receive ring holds (`ring_frames`).
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
pub(super) fn layouts(mtu: usize, rx_frames: usize, page: usize) -> (Geometry, Geometry) {
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
pub(super) struct Ring {
    /// First byte of the ring's mapping, `geo.bytes()` long.
    pub(super) base: NonNull<u8>,
    pub(super) geo: Geometry,
}

impl Ring {
    /// Maps the ring that `fd` was given with PACKET_RX_RING or PACKET_TX_RING.
    pub(super) fn map(fd: &OwnedFd, geo: Geometry) -> io::Result<Ring> {
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
    pub(super) fn frame(&self, i: usize) -> *mut u8 {
        assert!(i < self.geo.frames(), "frame {i} outside the ring");
        // SAFETY: offset(i) + frame_size <= geo.bytes() for i < frames(), so the result
        // stays inside the ring's part of the mapping.
        unsafe { self.base.as_ptr().add(self.geo.offset(i)) }
    }

    /// The status word of frame `i`, shared with the kernel.
    pub(super) fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: tp_status, the frame header's first u32, is 16-byte aligned (page-aligned
        // blocks, frame sizes multiples of 16), lives as long as the link's mapping, and is
        // only accessed atomically (the kernel uses READ_ONCE/WRITE_ONCE with barriers).
        unsafe { AtomicU32::from_ptr(self.frame(i) as *mut u32) }
    }

    pub(super) fn header(&self, i: usize) -> *mut libc::tpacket2_hdr {
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
