//! Datatypes: what a (buffer, count, datatype) triple means in bytes.
//!
//! A [`Layout`] lists the bytes of one element as blocks (displacement from the
//! element's start, length), with its extent (the distance from one element to the
//! next) and lower bound, as MPI defines them. Builtin types are one block; derived
//! types (contiguous, vector, hvector, indexed, resized) are built from others, with
//! adjacent blocks merged so that a derived type that is contiguous in fact is sent
//! without packing. Messages travel packed: [`Layout::pack`] gathers the blocks of a
//! buffer into bytes, [`Layout::unpack`] scatters them back. The element kind ([`Elem`])
//! says what reductions compute on; a type mixing kinds has none.

use crate::error::{check, Class, MpiError, Result};

/// A number a reduction computes on: quiver's, which its one-sided targets compute
/// with too.
pub use quiver::rma::reduce::Number as Num;

/// What one element of a type is, for reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// A number.
    Num(Num),
    /// A (value, int index) pair of `MPI_MAXLOC` and `MPI_MINLOC`: the value first, the
    /// index at byte `index_at`, `size` bytes in all (with C's padding).
    Pair {
        /// The value's type.
        value: Num,
        /// Where the `int` index starts.
        index_at: usize,
        /// The pair's size.
        size: usize,
    },
    /// Bytes without arithmetic (`MPI_BYTE`: bitwise operations only; `MPI_CHAR`,
    /// `MPI_PACKED`: none), of `size` bytes.
    Bytes {
        /// Bytes per element.
        size: usize,
        /// Whether bitwise operations apply (`MPI_BYTE`).
        bitwise: bool,
    },
    /// A type reductions do not apply to (`long double`, mixed structures).
    Opaque {
        /// Bytes per element.
        size: usize,
    },
}

impl Elem {
    /// Its size in bytes.
    pub fn size(self) -> usize {
        match self {
            Elem::Num(n) => n.size(),
            Elem::Pair { size, .. } | Elem::Bytes { size, .. } | Elem::Opaque { size } => size,
        }
    }
}

/// A run of bytes of an element: `len` bytes at `disp` from the element's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Displacement from the element's address (may be negative).
    pub disp: isize,
    /// Length in bytes.
    pub len: usize,
}

/// The bytes of one element of a datatype. See the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of data in one element (the sum of the blocks' lengths: `MPI_Type_size`).
    pub size: usize,
    /// The lower bound (`MPI_Type_get_extent`).
    pub lb: isize,
    /// The distance from one element to the next.
    pub extent: isize,
    /// The element's bytes, in the order they are packed (adjacent ones merged).
    pub blocks: Vec<Block>,
    /// The numbers the type is made of when it is made of one kind only (reductions
    /// apply to those).
    pub elem: Option<Elem>,
    /// Whether it was committed (`MPI_Type_commit`; builtins are).
    pub committed: bool,
}

impl Layout {
    /// A builtin type: one element of `elem`.
    pub fn builtin(elem: Elem) -> Layout {
        let size = elem.size();
        Layout {
            size,
            lb: 0,
            extent: size as isize,
            blocks: vec![Block { disp: 0, len: size }],
            elem: Some(elem),
            committed: true,
        }
    }

    /// Whether `count` elements are `count * size` bytes in a row from the buffer's
    /// address (sent and received without packing).
    pub fn is_contiguous(&self) -> bool {
        self.blocks.len() == 1 && self.blocks[0].disp == 0 && self.extent == self.size as isize
    }

    /// Bytes of data in `count` elements.
    pub fn bytes(&self, count: usize) -> Result<usize> {
        self.size.checked_mul(count).ok_or_else(|| {
            MpiError::new(
                Class::Count,
                format!("{count} elements of {} bytes overflow", self.size),
            )
        })
    }

    /// `count` elements of `old`, each `stride` bytes after the previous (`stride` is
    /// in bytes: `MPI_Type_create_hvector`; `MPI_Type_vector` multiplies by the old
    /// extent first), in blocks of `blocklen` consecutive elements.
    pub fn hvector(count: usize, blocklen: usize, stride: isize, old: &Layout) -> Result<Layout> {
        let starts = (0..count).map(|i| stride * i as isize);
        Layout::hindexed(starts.map(|s| (s, blocklen)), old)
    }

    /// Blocks of consecutive elements of `old`, each block `(displacement in bytes,
    /// elements)` (`MPI_Type_create_hindexed`; contiguous, vector and indexed are cases).
    pub fn hindexed(
        blocks: impl IntoIterator<Item = (isize, usize)>,
        old: &Layout,
    ) -> Result<Layout> {
        let mut out = Vec::new();
        let (mut lo, mut hi) = (isize::MAX, isize::MIN);
        let mut size = 0usize;
        for (start, n) in blocks {
            for j in 0..n {
                let at = start + old.extent * j as isize;
                for b in &old.blocks {
                    push_merged(
                        &mut out,
                        Block {
                            disp: at + b.disp,
                            len: b.len,
                        },
                    );
                }
                lo = lo.min(at + old.lb);
                hi = hi.max(at + old.lb + old.extent);
            }
            size = n
                .checked_mul(old.size)
                .and_then(|s| s.checked_add(size))
                .ok_or_else(|| MpiError::new(Class::Count, "datatype size overflows"))?;
        }
        if lo > hi {
            // No elements: an empty type.
            (lo, hi) = (0, 0);
        }
        Ok(Layout {
            size,
            lb: lo,
            extent: hi - lo,
            blocks: out,
            elem: old.elem,
            committed: false,
        })
    }

    /// `old` with its lower bound and extent set (`MPI_Type_create_resized`).
    pub fn resized(old: &Layout, lb: isize, extent: isize) -> Layout {
        Layout {
            lb,
            extent,
            committed: false,
            ..old.clone()
        }
    }

    /// Appends the data of `count` elements at `buf` to `out`.
    ///
    /// # Safety
    ///
    /// Every block of the `count` elements at `buf` is readable.
    pub unsafe fn pack(&self, buf: *const u8, count: usize, out: &mut Vec<u8>) {
        out.reserve(self.size * count);
        if self.is_contiguous() && self.size > 0 {
            // One copy rather than one per element.
            // SAFETY: the caller promises the elements readable: contiguous, they are
            // `size * count` bytes from `buf`.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(buf, self.size * count) });
            return;
        }
        for i in 0..count {
            let elem = buf.wrapping_offset(self.extent * i as isize);
            for b in &self.blocks {
                // SAFETY: the caller promises each block of each element readable.
                let bytes =
                    unsafe { std::slice::from_raw_parts(elem.wrapping_offset(b.disp), b.len) };
                out.extend_from_slice(bytes);
            }
        }
    }

    /// Scatters `data` (packed elements; a partial last element is written as far as
    /// it goes) into the elements at `buf`.
    ///
    /// # Safety
    ///
    /// Every block of the elements `data` covers, at `buf`, is writable and not
    /// borrowed elsewhere.
    pub unsafe fn unpack(&self, data: &[u8], buf: *mut u8) {
        if self.is_contiguous() {
            // One copy rather than one per element.
            // SAFETY: the caller promises the elements `data` covers writable:
            // contiguous, they are `data.len()` bytes from `buf`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, data.len()) };
            return;
        }
        let mut from = 0;
        let mut i = 0isize;
        while from < data.len() {
            let elem = buf.wrapping_offset(self.extent * i);
            for b in &self.blocks {
                let n = b.len.min(data.len() - from);
                if n == 0 {
                    return;
                }
                // SAFETY: the caller promises the blocks of the elements `data` covers
                // writable; `from + n <= data.len()`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr().add(from),
                        elem.wrapping_offset(b.disp),
                        n,
                    )
                };
                from += n;
            }
            i += 1;
        }
    }

    /// Fails unless the type may be used in communication (committed).
    pub fn check_committed(&self) -> Result<()> {
        check(self.committed, Class::Type, || {
            "the datatype is not committed (MPI_Type_commit)".into()
        })
    }
}

/// Appends `b` to `out`, merged with the last block when it continues it.
fn push_merged(out: &mut Vec<Block>, b: Block) {
    if b.len == 0 {
        return;
    }
    if let Some(last) = out.last_mut() {
        if last.disp + last.len as isize == b.disp {
            last.len += b.len;
            return;
        }
    }
    out.push(b);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int() -> Layout {
        Layout::builtin(Elem::Num(Num::I32))
    }

    #[test]
    fn a_vector_packs_every_other_int_and_unpacks_them_back() {
        // 3 blocks of 2 ints, a block every 4 ints.
        let v = Layout::hvector(3, 2, 16, &int()).unwrap();
        assert_eq!(v.size, 24);
        assert_eq!((v.lb, v.extent), (0, 40));
        assert_eq!(v.blocks.len(), 3);
        assert!(!v.is_contiguous());
        let src: Vec<i32> = (0..10).collect();
        let mut packed = Vec::new();
        // SAFETY: the vector's blocks lie inside the 10 ints of `src`.
        unsafe { v.pack(src.as_ptr().cast(), 1, &mut packed) };
        let ints: Vec<i32> = packed
            .chunks(4)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(ints, [0, 1, 4, 5, 8, 9]);
        let mut dst = [-1i32; 10];
        // SAFETY: as above, into `dst`.
        unsafe { v.unpack(&packed, dst.as_mut_ptr().cast()) };
        assert_eq!(dst, [0, 1, -1, -1, 4, 5, -1, -1, 8, 9]);
    }

    #[test]
    fn a_vector_of_unit_stride_is_contiguous_and_a_resized_type_keeps_its_blocks() {
        let c = Layout::hvector(1, 4, 0, &int()).unwrap();
        assert!(c.is_contiguous());
        assert_eq!(c.size, 16);
        let r = Layout::resized(&int(), 0, 8);
        assert!(!r.is_contiguous());
        let src = [1i32, 2, 3, 4];
        let mut packed = Vec::new();
        // SAFETY: two elements of extent 8 at `src`: ints 0 and 2.
        unsafe { r.pack(src.as_ptr().cast(), 2, &mut packed) };
        assert_eq!(packed.len(), 8);
        assert_eq!(i32::from_ne_bytes(packed[4..8].try_into().unwrap()), 3);
    }
}
