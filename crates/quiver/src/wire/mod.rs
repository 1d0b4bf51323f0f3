//! Wire format of quiver's network transports (UDP now, raw Ethernet later).
//!
//! This module owns the byte layout of a frame and nothing else: it does no I/O, keeps no
//! state and allocates nothing. A frame is a fixed 32-byte header followed by a body whose
//! shape depends on the frame's kind. All integers are little-endian.
//!
//! ```text
//!  0  u8  version (high nibble, VERSION = 1) | kind (low nibble)
//!  1  u8  flags: FIRST = 0x01, LAST = 0x02, CHECKSUM = 0x04, GROUP = 0x08,
//!             GROUP_REPLY = 0x10 (not both); other bits must be 0
//!  2  u16 src_dpid
//!  4  u16 dst_dpid
//!  6  u16 credits      (flow-control credits, reserved: 0 for now)
//!  8  u32 src_rank
//! 12  u32 job_id
//! 16  u32 token        (per-job secret, low 32 bits of the job token)
//! 20  u32 seq          (per-channel sequence number of this frame)
//! 24  u32 ack          (cumulative acknowledgement, reserved)
//! 28  u32 checksum     (CRC32C over the header with this field zeroed, then the body,
//!                       when the CHECKSUM flag is set; 0 when it is clear)
//! ```
//!
//! A Directed Message travels as one or more `Data` fragments. A message that fits in one
//! datagram is a single `FIRST | LAST` fragment whose body is the whole message (possibly
//! empty). A longer message is a `FIRST` fragment whose body starts with the message's
//! total length as a `u32`, then zero or more middle fragments (no flag) and a `LAST`
//! fragment; every fragment after the first carries at least one byte. [`fragments`]
//! plans that split; reassembly belongs to the channel layer.
//!
//! The module follows the checked-view / validated-representation pattern:
//!
//! - [`FrameView`] is a view of a byte buffer that is known to hold at least a header. Its
//!   getters and setters read and write single fields at the offsets in [`field`]; they
//!   interpret nothing. Use it to patch a pre-computed header (sequence number, checksum).
//! - [`Header`] and [`Frame`] are validated representations: [`Header::parse`] and
//!   [`decode`] accept a buffer only if every field and the body are well formed, and
//!   [`Header::emit`] writes one back.
//!
//! Guarantees: decoding never trusts its input and never panics; every length is checked
//! before it is used, and a bad frame is reported as a [`DecodeError`] that says what is
//! wrong. A frame that [`decode`] accepts satisfies `Header::parse(emit(h)) == h` for its
//! header. Reserved fields (`credits`, `ack`) are carried, not interpreted. Whether a frame
//! belongs to this job (`job_id`, `token`) is for the layers above to check.

mod error;
mod fragment;
mod frame;
mod header;
#[cfg(test)]
mod tests;

pub use error::DecodeError;
pub use fragment::{fragment_count, fragments, Fragment, Fragments, MAX_MESSAGE, MIN_DATAGRAM};
pub use frame::{checksum, decode, decode_parsed, seal, Frame, LENGTH_PREFIX_LEN};
pub use header::{Flags, FrameKind, FrameView, Header};

/// Length of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 32;

/// The wire format version this module reads and writes (high nibble of byte 0).
pub const VERSION: u8 = 1;

/// Byte offsets of the header fields, from the start of the frame.
///
/// Each constant names the first byte of a field; the field's width is the width of its
/// type in [`Header`].
pub mod field {
    /// `u8`: version (high nibble) and kind (low nibble).
    pub const VERSION_KIND: usize = 0;
    /// `u8`: flag bits, see [`Flags`](super::Flags).
    pub const FLAGS: usize = 1;
    /// `u16`: endpoint (DPID) of the sender.
    pub const SRC_DPID: usize = 2;
    /// `u16`: endpoint (DPID) of the receiver.
    pub const DST_DPID: usize = 4;
    /// `u16`: flow-control credits (reserved).
    pub const CREDITS: usize = 6;
    /// `u32`: rank of the sender.
    pub const SRC_RANK: usize = 8;
    /// `u32`: job id.
    pub const JOB_ID: usize = 12;
    /// `u32`: low 32 bits of the job token.
    pub const TOKEN: usize = 16;
    /// `u32`: per-channel sequence number.
    pub const SEQ: usize = 20;
    /// `u32`: cumulative acknowledgement (reserved).
    pub const ACK: usize = 24;
    /// `u32`: CRC32C of the frame, valid when the CHECKSUM flag is set.
    pub const CHECKSUM: usize = 28;
}

// The checksum is the last field and the header has no padding.
const _: () = assert!(field::CHECKSUM + 4 == HEADER_LEN);
