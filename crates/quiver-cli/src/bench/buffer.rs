//! Message buffers of the benchmarks, page-aligned as OSU's and Intel's MPI benchmarks
//! align theirs, so that quiver is measured on the buffers the anchors use.
//!
//! Alignment matters for single copies across address spaces: the kernel's copy
//! (`process_vm_readv`, `rep movsb`) runs at a quarter of its speed on this machine's
//! CPUs when the destination is 1 to 31 bytes past the source modulo 4 KiB
//! (`docs/DESIGN-NOTES.md`, "Buffer alignment and single copies"). Two `Vec<u8>` from
//! the heap land anywhere modulo 4 KiB, so one run's 64 KiB figure depended on where
//! the allocator happened to put them.

/// A zero-initialized or filled byte buffer whose first byte is page-aligned.
pub struct PageAligned {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

/// The alignment of every buffer.
pub const PAGE: usize = 4096;

impl PageAligned {
    /// `len` bytes of `fill`.
    pub fn new(len: usize, fill: u8) -> PageAligned {
        let bytes = vec![fill; len + PAGE];
        let start = bytes.as_ptr().align_offset(PAGE).min(PAGE);
        PageAligned { bytes, start, len }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_on_a_page_and_hold_what_was_asked() {
        for len in [0, 1, 8, 4095, 4096, 65536 + 3] {
            let mut b = PageAligned::new(len, 7);
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 7));
            assert_eq!(b.as_mut_slice().as_ptr() as usize % PAGE, 0, "len {len}");
        }
    }
}
