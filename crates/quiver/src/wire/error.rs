//! Why a frame was rejected.

use super::{FrameKind, HEADER_LEN, VERSION};

/// A frame that [`decode`](super::decode) or [`Header::parse`](super::Header::parse)
/// refused. Every variant is fatal for that frame only: count it and drop the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The buffer is shorter than a header.
    #[error("frame of {len} bytes is shorter than the {HEADER_LEN}-byte header")]
    Truncated {
        /// Length of the buffer.
        len: usize,
    },
    /// The version nibble is not [`VERSION`].
    #[error("frame has wire format version {0}, this build speaks version {VERSION}")]
    BadVersion(u8),
    /// The kind nibble names no [`FrameKind`].
    #[error("frame has unknown kind {0}")]
    UnknownKind(u8),
    /// The flags byte has unknown bits, or bits that the frame's kind does not allow.
    #[error("frame has invalid flags {flags:#04x}: {reason}")]
    BadFlags {
        /// The flags byte found.
        flags: u8,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The body does not have the shape that the kind and flags require.
    #[error("{kind:?} frame with flags {flags:#04x} has a malformed {len}-byte body: {reason}")]
    BadBody {
        /// The frame's kind.
        kind: FrameKind,
        /// The frame's flags byte.
        flags: u8,
        /// Length of the body (the frame minus its header).
        len: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The CHECKSUM flag is clear but the checksum field is not zero: a corrupted flags
    /// byte, or a sender that does not follow the format.
    #[error("frame checksum field is {0:#010x} but the CHECKSUM flag is clear")]
    StrayChecksum(u32),
    /// The CHECKSUM flag is set and the checksum field does not match the frame.
    #[error("frame checksum mismatch: computed {expected:#010x}, header says {found:#010x}")]
    Checksum {
        /// The CRC32C computed over the received frame.
        expected: u32,
        /// The value in the header's checksum field.
        found: u32,
    },
}
