//! The frame header: its kinds and flags, a checked view of the raw bytes, and the
//! validated representation.

use core::fmt;
use core::ops::{BitOr, BitOrAssign};

use super::{checksum, field, DecodeError, HEADER_LEN, VERSION};

const VERSION_SHIFT: u32 = 4;
const KIND_MASK: u8 = 0x0f;

/// What a frame carries (low nibble of byte 0).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A fragment of a Directed Message.
    Data = 1,
    /// An acknowledgement (body empty for now).
    Ack = 2,
    /// A liveness probe (body empty for now).
    Heartbeat = 3,
    /// The sender is closing the channel (body empty for now).
    Goodbye = 4,
}

impl FrameKind {
    /// Every kind, in numeric order.
    pub const ALL: [FrameKind; 4] = [
        FrameKind::Data,
        FrameKind::Ack,
        FrameKind::Heartbeat,
        FrameKind::Goodbye,
    ];
}

impl TryFrom<u8> for FrameKind {
    type Error = DecodeError;

    fn try_from(raw: u8) -> Result<Self, DecodeError> {
        match raw {
            1 => Ok(FrameKind::Data),
            2 => Ok(FrameKind::Ack),
            3 => Ok(FrameKind::Heartbeat),
            4 => Ok(FrameKind::Goodbye),
            other => Err(DecodeError::UnknownKind(other)),
        }
    }
}

/// The flags byte of a header: a set of the bits below, never anything else.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(u8);

impl Flags {
    /// No flag set.
    pub const EMPTY: Flags = Flags(0);
    /// First fragment of a message (`Data` only).
    pub const FIRST: Flags = Flags(0x01);
    /// Last fragment of a message (`Data` only).
    pub const LAST: Flags = Flags(0x02);
    /// The checksum field is valid and covers the frame.
    pub const CHECKSUM: Flags = Flags(0x04);
    /// The frame belongs to its sender's group channel: the one reliable stream in which
    /// a root sends to every member of its group at once (a link broadcast), and in which
    /// each member acknowledges to the root alone (`GROUP_REPLY`).
    pub const GROUP: Flags = Flags(0x08);
    /// The frame answers the receiver's group channel: a member's acknowledgement (and
    /// credits) of what the root broadcast.
    pub const GROUP_REPLY: Flags = Flags(0x10);
    /// `Ack` only: which block of 32 frames the selective-acknowledgement bitmap covers,
    /// a number from 0 to [`Flags::SACK_BLOCKS`] - 1 in the three high bits (block `k`:
    /// frames `ack + 1 + 32k` on), so that a hole longer than 32 frames (a burst lost
    /// whole, a segmentation-offload run) is reported at once rather than left to the
    /// retransmission timer.
    pub const SACK_BLOCK: Flags = Flags(0xe0);
    /// Blocks [`Flags::SACK_BLOCK`] can name.
    pub const SACK_BLOCKS: u32 = 8;
    /// Every defined flag.
    pub const ALL: Flags = Flags(0xff);

    /// The flags whose bits are `bits`, or `None` if `bits` has an undefined bit set
    /// (none is, since the SACK block took the three high bits: the kind of the frame
    /// decides which flags it may carry, `Header::from_view`).
    pub const fn from_bits(bits: u8) -> Option<Flags> {
        Some(Flags(bits))
    }

    /// The raw byte.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The block number of [`Flags::SACK_BLOCK`].
    pub const fn sack_block(self) -> u32 {
        (self.0 >> 5) as u32
    }

    /// `self` with [`Flags::SACK_BLOCK`] set to `block` (taken modulo
    /// [`Flags::SACK_BLOCKS`]).
    pub const fn with_sack_block(self, block: u32) -> Flags {
        Flags((self.0 & !Self::SACK_BLOCK.0) | (((block % Self::SACK_BLOCKS) as u8) << 5))
    }

    /// Whether every flag of `other` is set in `self`.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag of `other` is set in `self`.
    pub const fn intersects(self, other: Flags) -> bool {
        self.0 & other.0 != 0
    }

    /// `self` with the flags of `other` added.
    pub const fn union(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }

    /// The flags set in both `self` and `other`.
    pub const fn intersection(self, other: Flags) -> Flags {
        Flags(self.0 & other.0)
    }

    /// `self` with the flags of `other` removed.
    pub const fn difference(self, other: Flags) -> Flags {
        Flags(self.0 & !other.0)
    }

    /// Whether no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for Flags {
    type Output = Flags;

    fn bitor(self, rhs: Flags) -> Flags {
        self.union(rhs)
    }
}

impl BitOrAssign for Flags {
    fn bitor_assign(&mut self, rhs: Flags) {
        *self = self.union(rhs);
    }
}

impl fmt::Debug for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("EMPTY");
        }
        let names = [
            (Flags::FIRST, "FIRST"),
            (Flags::LAST, "LAST"),
            (Flags::CHECKSUM, "CHECKSUM"),
            (Flags::GROUP, "GROUP"),
            (Flags::GROUP_REPLY, "GROUP_REPLY"),
        ];
        let mut sep = "";
        for (flag, name) in names {
            if self.contains(flag) {
                write!(f, "{sep}{name}")?;
                sep = " | ";
            }
        }
        if self.sack_block() != 0 {
            write!(f, "{sep}SACK_BLOCK({})", self.sack_block())?;
        }
        Ok(())
    }
}

/// A checked view of a frame in a byte buffer: the buffer is known to hold at least
/// [`HEADER_LEN`] bytes, and each accessor reads or writes one field at its offset in
/// [`field`]. Nothing is validated beyond the length; see [`Header::parse`] and
/// [`decode`](super::decode) for that.
///
/// The body is everything after the header, so the view of a whole datagram gives the
/// whole body, and the view of a `[u8; HEADER_LEN]` gives an empty one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameView<T: AsRef<[u8]>> {
    // Invariant: buffer.as_ref().len() >= HEADER_LEN, checked by `new_checked`. Every
    // index below is a constant offset inside the header, so none of them can panic.
    buffer: T,
}

impl<T: AsRef<[u8]>> FrameView<T> {
    /// Wraps `buffer`, or fails with [`DecodeError::Truncated`] if it cannot hold a header.
    pub fn new_checked(buffer: T) -> Result<Self, DecodeError> {
        let len = buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(DecodeError::Truncated { len });
        }
        Ok(FrameView { buffer })
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn u8_at(&self, at: usize) -> u8 {
        self.buffer.as_ref()[at]
    }

    fn u16_at(&self, at: usize) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    fn u32_at(&self, at: usize) -> u32 {
        let b = self.buffer.as_ref();
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// The version nibble.
    pub fn version(&self) -> u8 {
        self.u8_at(field::VERSION_KIND) >> VERSION_SHIFT
    }

    /// The kind nibble, not yet checked against [`FrameKind`].
    pub fn kind_raw(&self) -> u8 {
        self.u8_at(field::VERSION_KIND) & KIND_MASK
    }

    /// The flags byte, not yet checked against [`Flags`].
    pub fn flags_raw(&self) -> u8 {
        self.u8_at(field::FLAGS)
    }

    /// The sender's endpoint.
    pub fn src_dpid(&self) -> u16 {
        self.u16_at(field::SRC_DPID)
    }

    /// The receiver's endpoint.
    pub fn dst_dpid(&self) -> u16 {
        self.u16_at(field::DST_DPID)
    }

    /// The credits field.
    pub fn credits(&self) -> u16 {
        self.u16_at(field::CREDITS)
    }

    /// The sender's rank.
    pub fn src_rank(&self) -> u32 {
        self.u32_at(field::SRC_RANK)
    }

    /// The job id.
    pub fn job_id(&self) -> u32 {
        self.u32_at(field::JOB_ID)
    }

    /// The job token field.
    pub fn token(&self) -> u32 {
        self.u32_at(field::TOKEN)
    }

    /// The sequence number.
    pub fn seq(&self) -> u32 {
        self.u32_at(field::SEQ)
    }

    /// The acknowledgement field.
    pub fn ack(&self) -> u32 {
        self.u32_at(field::ACK)
    }

    /// The checksum field, as stored.
    pub fn checksum(&self) -> u32 {
        self.u32_at(field::CHECKSUM)
    }

    /// The header bytes.
    pub fn header(&self) -> [u8; HEADER_LEN] {
        let mut h = [0; HEADER_LEN];
        h.copy_from_slice(&self.buffer.as_ref()[..HEADER_LEN]);
        h
    }

    /// Everything after the header.
    pub fn body(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// The CRC32C of the frame as the checksum field should hold it: over the header with
    /// the checksum field zeroed, then the body.
    pub fn compute_checksum(&self) -> u32 {
        checksum(&self.header(), &[self.body()])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> FrameView<T> {
    fn set_u8(&mut self, at: usize, v: u8) {
        self.buffer.as_mut()[at] = v;
    }

    fn set_bytes<const N: usize>(&mut self, at: usize, v: [u8; N]) {
        self.buffer.as_mut()[at..at + N].copy_from_slice(&v);
    }

    /// Writes [`VERSION`] and `kind` into byte 0.
    pub fn set_kind(&mut self, kind: FrameKind) {
        self.set_u8(field::VERSION_KIND, (VERSION << VERSION_SHIFT) | kind as u8);
    }

    /// Writes the flags byte.
    pub fn set_flags(&mut self, flags: Flags) {
        self.set_u8(field::FLAGS, flags.bits());
    }

    /// Writes the sender's endpoint.
    pub fn set_src_dpid(&mut self, v: u16) {
        self.set_bytes(field::SRC_DPID, v.to_le_bytes());
    }

    /// Writes the receiver's endpoint.
    pub fn set_dst_dpid(&mut self, v: u16) {
        self.set_bytes(field::DST_DPID, v.to_le_bytes());
    }

    /// Writes the credits field.
    pub fn set_credits(&mut self, v: u16) {
        self.set_bytes(field::CREDITS, v.to_le_bytes());
    }

    /// Writes the sender's rank.
    pub fn set_src_rank(&mut self, v: u32) {
        self.set_bytes(field::SRC_RANK, v.to_le_bytes());
    }

    /// Writes the job id.
    pub fn set_job_id(&mut self, v: u32) {
        self.set_bytes(field::JOB_ID, v.to_le_bytes());
    }

    /// Writes the job token field.
    pub fn set_token(&mut self, v: u32) {
        self.set_bytes(field::TOKEN, v.to_le_bytes());
    }

    /// Writes the sequence number.
    pub fn set_seq(&mut self, v: u32) {
        self.set_bytes(field::SEQ, v.to_le_bytes());
    }

    /// Writes the acknowledgement field.
    pub fn set_ack(&mut self, v: u32) {
        self.set_bytes(field::ACK, v.to_le_bytes());
    }

    /// Writes the checksum field (and nothing else; see [`fill_checksum`](Self::fill_checksum)).
    pub fn set_checksum(&mut self, v: u32) {
        self.set_bytes(field::CHECKSUM, v.to_le_bytes());
    }

    /// The body, writable.
    pub fn body_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }

    /// Sets the CHECKSUM flag and writes the checksum of the frame as it is now (header
    /// and body); returns the checksum. Call it after every other field is final.
    pub fn fill_checksum(&mut self) -> u32 {
        let flags = self.flags_raw() | Flags::CHECKSUM.bits();
        self.set_u8(field::FLAGS, flags);
        let sum = self.compute_checksum();
        self.set_checksum(sum);
        sum
    }
}

/// A validated frame header.
///
/// `parse` accepts only the current [`VERSION`], a known [`FrameKind`] and defined
/// [`Flags`]; FIRST and LAST are accepted on `Data` frames only; the checksum field must
/// be zero unless the CHECKSUM flag is set (so that a flipped CHECKSUM bit is caught too).
/// `credits` and `ack` are carried as they are. The checksum itself is verified by
/// [`decode`](super::decode), which sees the body too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame carries.
    pub kind: FrameKind,
    /// FIRST / LAST (fragment position, `Data` only), CHECKSUM, and GROUP or
    /// GROUP_REPLY (the frame belongs to a group channel).
    pub flags: Flags,
    /// The sender's endpoint.
    pub src_dpid: u16,
    /// The receiver's endpoint.
    pub dst_dpid: u16,
    /// Flow-control credits (reserved: 0 for now).
    pub credits: u16,
    /// The sender's rank.
    pub src_rank: u32,
    /// The job id.
    pub job_id: u32,
    /// Low 32 bits of the job token.
    pub token: u32,
    /// Per-channel sequence number of this frame.
    pub seq: u32,
    /// Cumulative acknowledgement (reserved).
    pub ack: u32,
    /// CRC32C of the frame when `flags` has CHECKSUM; zero otherwise.
    pub checksum: u32,
}

impl Header {
    /// Reads and validates the header at the start of `bytes` (which may continue with a
    /// body; the body is not looked at).
    pub fn parse(bytes: &[u8]) -> Result<Header, DecodeError> {
        Header::from_view(&FrameView::new_checked(bytes)?)
    }

    /// Reads and validates the header of a view.
    pub fn from_view<T: AsRef<[u8]>>(view: &FrameView<T>) -> Result<Header, DecodeError> {
        if view.version() != VERSION {
            return Err(DecodeError::BadVersion(view.version()));
        }
        let kind = FrameKind::try_from(view.kind_raw())?;
        let raw = view.flags_raw();
        let flags = Flags::from_bits(raw).ok_or(DecodeError::BadFlags {
            flags: raw,
            reason: "undefined flag bits set",
        })?;
        if kind != FrameKind::Data && flags.intersects(Flags::FIRST | Flags::LAST) {
            return Err(DecodeError::BadFlags {
                flags: raw,
                reason: "FIRST and LAST are only valid on Data frames",
            });
        }
        if kind != FrameKind::Ack && flags.intersects(Flags::SACK_BLOCK) {
            return Err(DecodeError::BadFlags {
                flags: raw,
                reason: "a SACK block is only valid on Ack frames",
            });
        }
        if flags.contains(Flags::GROUP | Flags::GROUP_REPLY) {
            return Err(DecodeError::BadFlags {
                flags: raw,
                reason: "GROUP and GROUP_REPLY exclude each other",
            });
        }
        if !flags.contains(Flags::CHECKSUM) && view.checksum() != 0 {
            return Err(DecodeError::StrayChecksum(view.checksum()));
        }
        Ok(Header {
            kind,
            flags,
            src_dpid: view.src_dpid(),
            dst_dpid: view.dst_dpid(),
            credits: view.credits(),
            src_rank: view.src_rank(),
            job_id: view.job_id(),
            token: view.token(),
            seq: view.seq(),
            ack: view.ack(),
            checksum: view.checksum(),
        })
    }

    /// Writes every field, the checksum field as it is in `self` (for a frame without
    /// CHECKSUM, `parse` accepts only zero there).
    pub fn emit(&self, out: &mut [u8; HEADER_LEN]) {
        let mut view = FrameView { buffer: out };
        self.emit_into(&mut view);
    }

    /// Writes every field into the header of a view, the checksum field as it is in
    /// `self`; the body is left alone.
    pub fn emit_into<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut FrameView<T>) {
        view.set_kind(self.kind);
        view.set_flags(self.flags);
        view.set_src_dpid(self.src_dpid);
        view.set_dst_dpid(self.dst_dpid);
        view.set_credits(self.credits);
        view.set_src_rank(self.src_rank);
        view.set_job_id(self.job_id);
        view.set_token(self.token);
        view.set_seq(self.seq);
        view.set_ack(self.ack);
        view.set_checksum(self.checksum);
    }

    /// Writes the header with the CHECKSUM flag set and the checksum computed over it and
    /// the body given as `body_parts` (concatenated in order), whatever `self.flags` and
    /// `self.checksum` say; returns the checksum.
    pub fn emit_sealed(&self, out: &mut [u8; HEADER_LEN], body_parts: &[&[u8]]) -> u32 {
        self.emit(out);
        super::seal(out, body_parts)
    }
}
