//! Where the elements of a non-contiguous transfer lie (the deposit seed's strided and
//! indexed deposits, D4): `count` elements of `elem` bytes each, either at a fixed
//! stride from an offset (one level; with `elem` a whole row this is a 2-D block, with
//! `elem` one value it is a matrix transpose's column) or at a list of offsets. Both
//! sides of a transfer have a layout with the same element size and count; one copy
//! routine moves element `i` of one to element `i` of the other, which is how an origin
//! packs (to a dense layout), a target scatters (from one), and a same-node origin
//! writes straight from its layout into the window's.
//!
//! Every layout is checked before use: its furthest byte ([`Layout::end`], with
//! overflow) must lie inside the memory it describes.

/// The elements of one side of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout<'a> {
    /// Element `i` at `offset + i * stride`.
    Strided {
        offset: u64,
        stride: u64,
        elem: u64,
        count: u64,
    },
    /// Element `i` at `offsets[i]`.
    Indexed { offsets: &'a [u64], elem: u64 },
}

impl<'a> Layout<'a> {
    /// `count` elements of `elem` bytes packed one after the other from 0.
    pub(crate) fn dense(elem: u64, count: u64) -> Layout<'static> {
        Layout::Strided {
            offset: 0,
            stride: elem,
            elem,
            count,
        }
    }

    /// Bytes per element.
    pub(crate) fn elem(&self) -> u64 {
        match *self {
            Layout::Strided { elem, .. } | Layout::Indexed { elem, .. } => elem,
        }
    }

    /// Elements.
    pub(crate) fn count(&self) -> u64 {
        match *self {
            Layout::Strided { count, .. } => count,
            Layout::Indexed { offsets, .. } => offsets.len() as u64,
        }
    }

    /// Bytes of all elements together; `None` on overflow.
    pub(crate) fn bytes(&self) -> Option<u64> {
        self.elem().checked_mul(self.count())
    }

    /// Where element `i` (below `count`) starts. Overflow was excluded by [`end`].
    ///
    /// [`end`]: Layout::end
    pub(crate) fn at(&self, i: u64) -> u64 {
        match *self {
            Layout::Strided { offset, stride, .. } => offset + i * stride,
            Layout::Indexed { offsets, .. } => offsets[i as usize],
        }
    }

    /// One past the furthest byte of any element (0 without elements); `None` when that
    /// overflows.
    pub(crate) fn end(&self) -> Option<u64> {
        let elem = self.elem();
        if self.count() == 0 || elem == 0 {
            return Some(0);
        }
        match *self {
            Layout::Strided {
                offset,
                stride,
                count,
                ..
            } => stride
                .checked_mul(count - 1)?
                .checked_add(offset)?
                .checked_add(elem),
            Layout::Indexed { offsets, .. } => offsets
                .iter()
                .try_fold(0u64, |end, &o| Some(end.max(o.checked_add(elem)?))),
        }
    }

    /// Elements `from..from + n` of this layout.
    pub(crate) fn part(&self, from: u64, n: u64) -> Layout<'a> {
        match *self {
            Layout::Strided {
                offset,
                stride,
                elem,
                ..
            } => Layout::Strided {
                offset: offset + from * stride,
                stride,
                elem,
                count: n,
            },
            Layout::Indexed { offsets, elem } => Layout::Indexed {
                offsets: &offsets[from as usize..(from + n) as usize],
                elem,
            },
        }
    }
}

/// Copies element `i` of `src` (in the memory at `src_base`) to element `i` of `dst`
/// (at `dst_base`), for every element.
///
/// # Safety
/// Both layouts have the same element size and count; `src.end()` bytes are readable
/// from `src_base` and `dst.end()` bytes writable from `dst_base` (both checked by the
/// caller: `end` is `Some` and within each memory); the two memories do not overlap.
pub(crate) unsafe fn copy_elements(
    src_base: *const u8,
    src: Layout,
    dst_base: *mut u8,
    dst: Layout,
) {
    debug_assert_eq!((src.elem(), src.count()), (dst.elem(), dst.count()));
    // Nothing to move: and `end` said nothing of the offsets of an empty layout.
    if src.elem() == 0 || src.count() == 0 {
        return;
    }
    let elem = src.elem() as usize;
    // A dense run on both sides is one copy.
    if let (
        Layout::Strided {
            offset: so,
            stride: ss,
            ..
        },
        Layout::Strided {
            offset: d,
            stride: ds,
            ..
        },
    ) = (src, dst)
    {
        if ss == src.elem() && ds == dst.elem() {
            let len = elem * src.count() as usize;
            // SAFETY: the caller's contract: both ranges lie in their memories.
            unsafe {
                crate::link::copy_bytes(src_base.add(so as usize), dst_base.add(d as usize), len)
            };
            return;
        }
    }
    for i in 0..src.count() {
        // SAFETY: element i of each layout lies below its `end`, inside its memory.
        unsafe {
            crate::link::copy_bytes(
                src_base.add(src.at(i) as usize),
                dst_base.add(dst.at(i) as usize),
                elem,
            )
        };
    }
}

/// Copies the elements of `src` (a layout in `from`) to the elements of `dst` (a layout
/// in `to`); false, having copied nothing, when either layout does not fit its memory or
/// the two disagree on element size or count.
pub(crate) fn copy_checked(from: &[u8], src: Layout, to: &mut [u8], dst: Layout) -> bool {
    let fits = |l: Layout, len: usize| l.end().is_some_and(|e| e <= len as u64);
    if (src.elem(), src.count()) != (dst.elem(), dst.count())
        || !fits(src, from.len())
        || !fits(dst, to.len())
    {
        return false;
    }
    // SAFETY: both layouts fit their slices (checked); `from` and `to` are distinct
    // borrows, so they do not overlap.
    unsafe { copy_elements(from.as_ptr(), src, to.as_mut_ptr(), dst) };
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The naive reference: element by element, with slices.
    fn reference(from: &[u8], src: Layout, to: &mut [u8], dst: Layout) {
        let e = src.elem() as usize;
        for i in 0..src.count() {
            let (s, d) = (src.at(i) as usize, dst.at(i) as usize);
            to[d..d + e].copy_from_slice(&from[s..s + e]);
        }
    }

    fn arb_strided(max_elem: u64, max_count: u64) -> impl Strategy<Value = (u64, u64, u64, u64)> {
        (0..64u64, 1..=max_elem, 0..=max_count).prop_flat_map(|(offset, elem, count)| {
            (Just(offset), elem..elem + 40, Just(elem), Just(count))
        })
    }

    proptest! {
        #[test]
        fn strided_and_indexed_copies_match_the_reference(
            (so, ss, elem, count) in arb_strided(24, 40),
            dst_stride_extra in 0..30u64,
            dst_offset in 0..50u64,
            shuffle in prop::collection::vec(any::<u16>(), 0..40),
        ) {
            let src = Layout::Strided { offset: so, stride: ss, elem, count };
            let from: Vec<u8> = (0..src.end().unwrap() as usize + 7).map(|i| (i * 13 + 5) as u8).collect();
            // Strided destination (non-overlapping: stride at least elem).
            let dst = Layout::Strided { offset: dst_offset, stride: elem + dst_stride_extra, elem, count };
            let mut a = vec![0u8; dst.end().unwrap() as usize + 3];
            let mut b = a.clone();
            prop_assert!(copy_checked(&from, src, &mut a, dst));
            reference(&from, src, &mut b, dst);
            prop_assert_eq!(&a, &b);
            // Indexed destination: a permutation of slots (like a transpose's scatter).
            let mut slots: Vec<u64> = (0..count).collect();
            for (i, s) in shuffle.iter().enumerate().take(slots.len()) {
                let j = *s as usize % slots.len();
                slots.swap(i, j);
            }
            let offsets: Vec<u64> = slots.iter().map(|k| dst_offset + k * elem).collect();
            let dst = Layout::Indexed { offsets: &offsets, elem };
            let mut a = vec![0u8; dst.end().unwrap() as usize + 3];
            let mut b = a.clone();
            prop_assert!(copy_checked(&from, src, &mut a, dst));
            reference(&from, src, &mut b, dst);
            prop_assert_eq!(&a, &b);
            // Packing and unpacking give the source back.
            let dense = Layout::dense(elem, count);
            let mut packed = vec![0u8; dense.end().unwrap() as usize];
            prop_assert!(copy_checked(&from, src, &mut packed, dense));
            let mut back = vec![0u8; from.len()];
            prop_assert!(copy_checked(&packed, dense, &mut back, src));
            let mut expect = vec![0u8; from.len()];
            reference(&from, src, &mut expect, src);
            prop_assert_eq!(back, expect);
        }

        #[test]
        fn a_layout_past_its_memory_copies_nothing(
            (so, ss, elem, count) in arb_strided(16, 20),
            short in 1..10usize,
        ) {
            prop_assume!(count > 0);
            let src = Layout::Strided { offset: so, stride: ss, elem, count };
            let end = src.end().unwrap() as usize;
            let from = vec![1u8; end - short.min(end)];
            let mut to = vec![0u8; (elem * count) as usize];
            prop_assert!(!copy_checked(&from, src, &mut to, Layout::dense(elem, count)));
            prop_assert!(to.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn ends_that_overflow_are_refused() {
        let huge = Layout::Strided {
            offset: 1,
            stride: u64::MAX / 2,
            elem: 8,
            count: 3,
        };
        assert_eq!(huge.end(), None);
        let offsets = [u64::MAX - 3];
        assert_eq!(
            Layout::Indexed {
                offsets: &offsets,
                elem: 8
            }
            .end(),
            None
        );
        assert_eq!(Layout::dense(8, 0).end(), Some(0));
        let mut to = [0u8; 8];
        assert!(!copy_checked(&[0; 64], huge, &mut to, Layout::dense(8, 3)));
    }
}
