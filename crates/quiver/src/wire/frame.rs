//! Whole frames: decoding with body validation, and the checksum.

use super::{field, DecodeError, Flags, FrameKind, Header, HEADER_LEN};

/// Length of the `u32` total-message-length prefix that opens the body of a `FIRST`-only
/// `Data` fragment.
pub const LENGTH_PREFIX_LEN: usize = 4;

/// A validated frame: its header and its body, borrowed from the datagram.
///
/// A `Frame` returned by [`decode`] satisfies the body rules of its kind (see the
/// [module documentation](super)); the accessors also behave (without panicking) on a
/// `Frame` built by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The validated header.
    pub header: Header,
    /// Everything after the header, including the length prefix of a `FIRST`-only
    /// fragment.
    pub body: &'a [u8],
}

impl<'a> Frame<'a> {
    /// The total length of the message this fragment starts: the length prefix of a
    /// `FIRST`-only `Data` fragment, the body length of a `FIRST | LAST` one; `None` for
    /// other fragments and other kinds.
    pub fn total_len(&self) -> Option<u32> {
        if self.header.kind != FrameKind::Data {
            return None;
        }
        let flags = self.header.flags;
        match (flags.contains(Flags::FIRST), flags.contains(Flags::LAST)) {
            (true, true) => u32::try_from(self.body.len()).ok(),
            (true, false) => {
                let (prefix, _) = self.body.split_first_chunk::<LENGTH_PREFIX_LEN>()?;
                Some(u32::from_le_bytes(*prefix))
            }
            _ => None,
        }
    }

    /// The message bytes this fragment carries: the body without the length prefix of a
    /// `FIRST`-only `Data` fragment; empty for kinds other than `Data`. Always a part of
    /// the body (an empty one at its end when there are no data), so that its offset in
    /// the datagram is `data().as_ptr() - datagram.as_ptr()`.
    pub fn data(&self) -> &'a [u8] {
        let none = &self.body[self.body.len()..];
        if self.header.kind != FrameKind::Data {
            return none;
        }
        if self.header.flags.contains(Flags::FIRST) && !self.header.flags.contains(Flags::LAST) {
            return self.body.get(LENGTH_PREFIX_LEN..).unwrap_or(none);
        }
        self.body
    }
}

/// Decodes one datagram: validates the header, then the checksum if the CHECKSUM flag is
/// set, then the body against the rules of its kind. Never panics.
pub fn decode(datagram: &[u8]) -> Result<Frame<'_>, DecodeError> {
    decode_parsed(Header::parse(datagram)?, datagram)
}

/// [`decode`] for a datagram whose header was parsed already (`header`, by
/// [`Header::parse`] of the same bytes): a receiver checks whom a frame is from and for
/// before it spends a checksum on it. Never panics.
pub fn decode_parsed(header: Header, datagram: &[u8]) -> Result<Frame<'_>, DecodeError> {
    let Some((head, body)) = datagram.split_first_chunk::<HEADER_LEN>() else {
        return Err(DecodeError::Truncated {
            len: datagram.len(),
        });
    };
    if header.flags.contains(Flags::CHECKSUM) {
        let expected = checksum(head, &[body]);
        if expected != header.checksum {
            return Err(DecodeError::Checksum {
                expected,
                found: header.checksum,
            });
        }
    }
    check_body(&header, body)?;
    Ok(Frame { header, body })
}

fn check_body(header: &Header, body: &[u8]) -> Result<(), DecodeError> {
    let bad = |reason| DecodeError::BadBody {
        kind: header.kind,
        flags: header.flags.bits(),
        len: body.len(),
        reason,
    };
    if header.kind != FrameKind::Data {
        return if body.is_empty() {
            Ok(())
        } else {
            Err(bad("this kind carries no body"))
        };
    }
    let flags = header.flags;
    match (flags.contains(Flags::FIRST), flags.contains(Flags::LAST)) {
        (true, true) => {
            if u32::try_from(body.len()).is_err() {
                return Err(bad("a message is at most 4 GiB - 1 bytes"));
            }
        }
        (true, false) => {
            let Some((prefix, data)) = body.split_first_chunk::<LENGTH_PREFIX_LEN>() else {
                return Err(bad("a first fragment starts with a 4-byte message length"));
            };
            let total = u32::from_le_bytes(*prefix);
            // Compared as u64 so that no length is truncated on any platform.
            if u64::from(total) <= data.len() as u64 {
                return Err(bad(
                    "the message length of a first fragment must exceed the data it carries",
                ));
            }
        }
        (false, _) => {
            if body.is_empty() {
                return Err(bad("a middle or last fragment carries at least one byte"));
            }
        }
    }
    Ok(())
}

/// The CRC32C (Castagnoli) of a frame: over `header` with its checksum field treated as
/// zero, then over each of `body_parts` in order (the body may be given in pieces, as it
/// is sent with vectored I/O).
pub fn checksum(header: &[u8; HEADER_LEN], body_parts: &[&[u8]]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if body_parts.iter().map(|p| p.len()).sum::<usize>() <= small::MAX_BODY
        && std::arch::is_x86_feature_detected!("sse4.2")
    {
        // SAFETY: the CPU has SSE 4.2, checked just above.
        return unsafe { small::checksum(header, body_parts) };
    }
    let mut h = *header;
    h[field::CHECKSUM..field::CHECKSUM + 4].fill(0);
    let mut crc = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    crc.update(&h);
    for part in body_parts {
        crc.update(part);
    }
    // A CRC-32 digest's value fits 32 bits.
    crc.finalize() as u32
}

/// The checksum of small frames with the CPU's CRC32C instruction, eight bytes at a
/// time. crc-fast's carry-less multiplication wins on long frames, but each of its calls
/// first chooses an implementation and sets up its folding: about 250 instructions per
/// checksum of a 48-byte frame (callgrind), where this loop needs about 50. A ping-pong
/// message is checksummed twice, on sending and on receiving.
#[cfg(target_arch = "x86_64")]
mod small {
    use super::{field, HEADER_LEN};
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};

    /// Bodies up to this many bytes take this path: the two break even at 48-64 bytes
    /// of body, and crc-fast is faster from 128 (`small_checksum_speed` below).
    pub(super) const MAX_BODY: usize = 64;

    /// [`super::checksum`] by the CRC32C instruction.
    ///
    /// # Safety
    /// The CPU must have SSE 4.2.
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn checksum(header: &[u8; HEADER_LEN], body_parts: &[&[u8]]) -> u32 {
        let mut h = *header;
        h[field::CHECKSUM..field::CHECKSUM + 4].fill(0);
        let mut crc = update(u32::MAX, &h);
        for part in body_parts {
            crc = update(crc, part);
        }
        !crc
    }

    /// The CRC32C register after `bytes` (no inversion on either side).
    #[target_feature(enable = "sse4.2")]
    fn update(crc: u32, bytes: &[u8]) -> u32 {
        let mut crc = u64::from(crc);
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let w: [u8; 8] = w.try_into().unwrap_or_default();
            crc = _mm_crc32_u64(crc, u64::from_le_bytes(w));
        }
        // The instruction keeps the register in the low 32 bits.
        let mut crc = crc as u32;
        for &b in words.remainder() {
            crc = _mm_crc32_u8(crc, b);
        }
        crc
    }
}

/// Seals an emitted header: sets its CHECKSUM flag, then writes the [`checksum`] of the
/// header and `body_parts` into its checksum field; returns the checksum. Use it on a
/// pre-computed header after patching its per-frame fields.
pub fn seal(header: &mut [u8; HEADER_LEN], body_parts: &[&[u8]]) -> u32 {
    header[field::FLAGS] |= Flags::CHECKSUM.bits();
    let sum = checksum(header, body_parts);
    header[field::CHECKSUM..field::CHECKSUM + 4].copy_from_slice(&sum.to_le_bytes());
    sum
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{field, small, HEADER_LEN};
    use std::hint::black_box;
    use std::time::Instant;

    /// Where the CRC instruction loop stops beating crc-fast, a measurement (it checks
    /// only that both give the same sum): `cargo test --release -p quiver --lib
    /// small_checksum_speed -- --ignored --nocapture`, pinned to one core with
    /// `taskset -c 1`.
    #[test]
    #[ignore]
    fn small_checksum_speed() {
        if !std::arch::is_x86_feature_detected!("sse4.2") {
            return;
        }
        // The checksum field zero, as the small path reads it, so that crc-fast over the
        // same bytes gives the same sum.
        let mut head = [0x5a; HEADER_LEN];
        head[field::CHECKSUM..field::CHECKSUM + 4].fill(0);
        let body = vec![0xa5u8; 1024];
        let n = 1_000_000u32;
        for len in [16, 32, 48, 64, 128, 256, 512, 1024] {
            let body = &body[..len];
            let sum = |head: &[u8; HEADER_LEN], body: &[u8]| {
                let mut crc = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
                crc.update(head);
                crc.update(body);
                crc.finalize() as u32
            };
            // SAFETY: the CPU has SSE 4.2, checked above.
            assert_eq!(unsafe { small::checksum(&head, &[body]) }, sum(&head, body));
            let t = Instant::now();
            for _ in 0..n {
                // SAFETY: the CPU has SSE 4.2, checked above.
                black_box(unsafe { small::checksum(black_box(&head), &[black_box(body)]) });
            }
            let ours = t.elapsed().as_nanos() as f64 / f64::from(n);
            let t = Instant::now();
            for _ in 0..n {
                black_box(sum(black_box(&head), black_box(body)));
            }
            let theirs = t.elapsed().as_nanos() as f64 / f64::from(n);
            println!("body {len:5} B: CRC instruction {ours:6.1} ns, crc-fast {theirs:6.1} ns");
        }
    }
}
