//! Element-wise arithmetic of the predefined reductions (MPI's `MPI_SUM`, `MPI_MAX`,
//! `MPI_MAXLOC`, ..., libfabric's `FI_SUM`, ...) on typed elements: what a target applies
//! for a remote accumulate ([`Rma::accumulate`](super::Rma::accumulate)), and what an MPI
//! library computes its reductions with.
//!
//! [`apply`] combines `inout[i] = in[i] op inout[i]` element by element over packed
//! elements, reading and writing unaligned (buffers of C programs, and window memory at
//! any offset, need not be aligned). Integer arithmetic wraps; floats follow IEEE. An
//! operation that is not defined on an element (a bitwise and of floats) is an
//! [`Undefined`] error before anything is written.
//!
//! The wire form of an [`Element`] is four bytes (`Element::encode`); one that does
//! not decode, or whose sizes disagree, is refused by the target, never applied.

/// A number the reductions compute on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Number {
    /// Signed integers of 1, 2, 4 and 8 bytes.
    I8 = 1,
    #[allow(missing_docs)]
    I16 = 2,
    #[allow(missing_docs)]
    I32 = 3,
    #[allow(missing_docs)]
    I64 = 4,
    /// Unsigned integers of 1, 2, 4 and 8 bytes.
    U8 = 5,
    #[allow(missing_docs)]
    U16 = 6,
    #[allow(missing_docs)]
    U32 = 7,
    #[allow(missing_docs)]
    U64 = 8,
    /// IEEE floats of 4 and 8 bytes.
    F32 = 9,
    #[allow(missing_docs)]
    F64 = 10,
    /// C's `_Bool` (and Fortran's LOGICAL of 1 byte): logical operations only.
    Bool = 11,
    /// Complex numbers of two `f32` or two `f64`: sums and products only.
    C32 = 12,
    #[allow(missing_docs)]
    C64 = 13,
}

impl Number {
    /// Its size in bytes.
    pub fn size(self) -> usize {
        match self {
            Number::I8 | Number::U8 | Number::Bool => 1,
            Number::I16 | Number::U16 => 2,
            Number::I32 | Number::U32 | Number::F32 => 4,
            Number::I64 | Number::U64 | Number::F64 | Number::C32 => 8,
            Number::C64 => 16,
        }
    }

    fn from_u8(b: u8) -> Option<Number> {
        use Number::*;
        [
            I8, I16, I32, I64, U8, U16, U32, U64, F32, F64, Bool, C32, C64,
        ]
        .into_iter()
        .find(|n| *n as u8 == b)
    }
}

/// One element an accumulate or a reduction combines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    /// A number.
    Num(Number),
    /// A (value, `int` index) pair of `MPI_MAXLOC` and `MPI_MINLOC`: the value first,
    /// the 4-byte index at byte `index_at`, `size` bytes in all (with C's padding).
    Pair {
        /// The value's type.
        value: Number,
        /// Where the index starts.
        index_at: u8,
        /// The pair's size.
        size: u8,
    },
    /// `size` bytes without arithmetic: bitwise operations, replacing and fetching only.
    Bytes {
        /// Bytes per element.
        size: u8,
    },
}

impl Element {
    /// Its size in bytes.
    pub fn size(self) -> usize {
        match self {
            Element::Num(n) => n.size(),
            Element::Pair { size, .. } | Element::Bytes { size } => usize::from(size),
        }
    }

    /// Its wire form: kind (a [`Number`], 14 a pair, 15 bytes), then the pair's value,
    /// index offset and size, or the bytes' size.
    pub(crate) fn encode(self) -> [u8; 4] {
        match self {
            Element::Num(n) => [n as u8, 0, 0, 0],
            Element::Pair {
                value,
                index_at,
                size,
            } => [14, value as u8, index_at, size],
            Element::Bytes { size } => [15, 0, 0, size],
        }
    }

    /// The element of a wire form, when it is one that makes sense (a pair's index
    /// inside it, after its value; no empty element).
    pub(crate) fn decode(b: [u8; 4]) -> Option<Element> {
        let e = match b[0] {
            14 => {
                let value = Number::from_u8(b[1])?;
                let (index_at, size) = (b[2], b[3]);
                if usize::from(index_at) < value.size()
                    || usize::from(index_at) + 4 > usize::from(size)
                {
                    return None;
                }
                Element::Pair {
                    value,
                    index_at,
                    size,
                }
            }
            15 if b[3] > 0 => Element::Bytes { size: b[3] },
            k => Element::Num(Number::from_u8(k)?),
        };
        Some(e)
    }
}

/// The predefined reductions, and the two one-sided updates that are not reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reduce {
    #[allow(missing_docs)]
    Max = 1,
    #[allow(missing_docs)]
    Min = 2,
    #[allow(missing_docs)]
    Sum = 3,
    #[allow(missing_docs)]
    Prod = 4,
    /// Logical and, or, exclusive or.
    Land = 5,
    #[allow(missing_docs)]
    Lor = 6,
    #[allow(missing_docs)]
    Lxor = 7,
    /// Bitwise and, or, exclusive or.
    Band = 8,
    #[allow(missing_docs)]
    Bor = 9,
    #[allow(missing_docs)]
    Bxor = 10,
    /// The pair of the largest (smallest) value, with the smallest index among equals.
    Maxloc = 11,
    #[allow(missing_docs)]
    Minloc = 12,
    /// The incoming value replaces the target's (one-sided accumulate).
    Replace = 13,
    /// Nothing changes (one-sided fetch).
    NoOp = 14,
}

impl Reduce {
    pub(crate) fn from_u8(b: u8) -> Option<Reduce> {
        use Reduce::*;
        [
            Max, Min, Sum, Prod, Land, Lor, Lxor, Band, Bor, Bxor, Maxloc, Minloc, Replace, NoOp,
        ]
        .into_iter()
        .find(|r| *r as u8 == b)
    }
}

/// A reduction applied to an element it is not defined on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{op:?} is not defined on {what}")]
pub struct Undefined {
    /// The reduction.
    pub op: Reduce,
    /// What it was applied to.
    pub what: &'static str,
}

macro_rules! each {
    ($t:ty, $n:expr, $inp:expr, $io:expr, |$a:ident, $b:ident| $e:expr) => {{
        let (inp, io) = ($inp.cast::<$t>(), $io.cast::<$t>());
        for i in 0..$n {
            // SAFETY: `apply`'s caller promises `n` elements of this type at both
            // (read unaligned: buffers of C programs need not be aligned).
            unsafe {
                let $a = inp.add(i).read_unaligned();
                let $b = io.add(i).read_unaligned();
                io.add(i).write_unaligned($e);
            }
        }
    }};
}

macro_rules! int_ops {
    ($t:ty, $op:expr, $n:expr, $inp:expr, $io:expr) => {
        match $op {
            Reduce::Max => each!($t, $n, $inp, $io, |a, b| a.max(b)),
            Reduce::Min => each!($t, $n, $inp, $io, |a, b| a.min(b)),
            Reduce::Sum => each!($t, $n, $inp, $io, |a, b| a.wrapping_add(b)),
            Reduce::Prod => each!($t, $n, $inp, $io, |a, b| a.wrapping_mul(b)),
            Reduce::Land => each!($t, $n, $inp, $io, |a, b| ((a != 0) && (b != 0)) as $t),
            Reduce::Lor => each!($t, $n, $inp, $io, |a, b| ((a != 0) || (b != 0)) as $t),
            Reduce::Lxor => each!($t, $n, $inp, $io, |a, b| ((a != 0) != (b != 0)) as $t),
            Reduce::Band => each!($t, $n, $inp, $io, |a, b| a & b),
            Reduce::Bor => each!($t, $n, $inp, $io, |a, b| a | b),
            Reduce::Bxor => each!($t, $n, $inp, $io, |a, b| a ^ b),
            op => {
                return Err(Undefined {
                    op,
                    what: stringify!($t),
                })
            }
        }
    };
}

macro_rules! float_ops {
    ($t:ty, $op:expr, $n:expr, $inp:expr, $io:expr) => {
        match $op {
            Reduce::Max => each!($t, $n, $inp, $io, |a, b| if a > b { a } else { b }),
            Reduce::Min => each!($t, $n, $inp, $io, |a, b| if a < b { a } else { b }),
            Reduce::Sum => each!($t, $n, $inp, $io, |a, b| a + b),
            Reduce::Prod => each!($t, $n, $inp, $io, |a, b| a * b),
            op => {
                return Err(Undefined {
                    op,
                    what: stringify!($t),
                })
            }
        }
    };
}

macro_rules! complex_ops {
    ($t:ty, $op:expr, $n:expr, $inp:expr, $io:expr) => {
        match $op {
            Reduce::Sum => each!([$t; 2], $n, $inp, $io, |a, b| [a[0] + b[0], a[1] + b[1]]),
            Reduce::Prod => each!([$t; 2], $n, $inp, $io, |a, b| [
                a[0] * b[0] - a[1] * b[1],
                a[0] * b[1] + a[1] * b[0]
            ]),
            op => {
                return Err(Undefined {
                    op,
                    what: "complex numbers",
                })
            }
        }
    };
}

/// Fails unless `op` is defined on `elem` (a trial on one zeroed element), and `elem`
/// makes sense (not empty; a pair's index inside it, after its value).
pub fn check(op: Reduce, elem: Element) -> Result<(), Undefined> {
    if Element::decode(elem.encode()) != Some(elem) {
        return Err(Undefined {
            op,
            what: "an element that is empty or whose index lies outside it",
        });
    }
    let mut a = [0u8; 256];
    let b = [0u8; 256];
    // SAFETY: an element is at most 255 bytes; one in each, apart.
    unsafe { apply(op, elem, 1, b.as_ptr(), a.as_mut_ptr()) }
}

/// `inout[i] = in[i] op inout[i]` for `count` elements of `elem`.
///
/// # Safety
///
/// `inp` holds `count` readable elements and `inout` `count` writable ones (element by
/// element: each is read whole before it is written, so the two may even overlap).
pub unsafe fn apply(
    op: Reduce,
    elem: Element,
    count: usize,
    inp: *const u8,
    inout: *mut u8,
) -> Result<(), Undefined> {
    match op {
        Reduce::NoOp => return Ok(()),
        Reduce::Replace => {
            // SAFETY: the caller promises `count` elements at both (a copy that allows
            // them to overlap: an origin's buffer may lie in its own window).
            unsafe { std::ptr::copy(inp, inout, count * elem.size()) };
            return Ok(());
        }
        _ => {}
    }
    match elem {
        Element::Num(Number::I8) => int_ops!(i8, op, count, inp, inout),
        Element::Num(Number::I16) => int_ops!(i16, op, count, inp, inout),
        Element::Num(Number::I32) => int_ops!(i32, op, count, inp, inout),
        Element::Num(Number::I64) => int_ops!(i64, op, count, inp, inout),
        Element::Num(Number::U8) => int_ops!(u8, op, count, inp, inout),
        Element::Num(Number::U16) => int_ops!(u16, op, count, inp, inout),
        Element::Num(Number::U32) => int_ops!(u32, op, count, inp, inout),
        Element::Num(Number::U64) => int_ops!(u64, op, count, inp, inout),
        Element::Num(Number::F32) => float_ops!(f32, op, count, inp, inout),
        Element::Num(Number::F64) => float_ops!(f64, op, count, inp, inout),
        Element::Num(Number::C32) => complex_ops!(f32, op, count, inp, inout),
        Element::Num(Number::C64) => complex_ops!(f64, op, count, inp, inout),
        Element::Num(Number::Bool) => match op {
            Reduce::Land | Reduce::Lor | Reduce::Lxor => int_ops!(u8, op, count, inp, inout),
            op => {
                return Err(Undefined {
                    op,
                    what: "booleans",
                })
            }
        },
        Element::Bytes { size } => match op {
            Reduce::Band | Reduce::Bor | Reduce::Bxor => {
                int_ops!(u8, op, count * usize::from(size), inp, inout)
            }
            op => return Err(Undefined { op, what: "bytes" }),
        },
        Element::Pair {
            value,
            index_at,
            size,
        } => {
            let max = match op {
                Reduce::Maxloc => true,
                Reduce::Minloc => false,
                op => {
                    return Err(Undefined {
                        op,
                        what: "value-index pairs",
                    })
                }
            };
            let (index_at, size) = (usize::from(index_at), usize::from(size));
            for i in 0..count {
                // SAFETY: the caller promises `count` pairs of `size` bytes at both.
                unsafe {
                    pair_loc(value, index_at, inp.add(i * size), inout.add(i * size), max)
                        .map_err(|what| Undefined { op, what })?
                };
            }
        }
    }
    Ok(())
}

/// `MPI_MAXLOC` (`max`) or `MPI_MINLOC` of one pair into `io`.
///
/// # Safety
///
/// Both point at a pair: a `value` then a 4-byte index at `index_at`.
unsafe fn pair_loc(
    value: Number,
    index_at: usize,
    a: *const u8,
    io: *mut u8,
    max: bool,
) -> Result<(), &'static str> {
    // SAFETY: the caller promises a value at both addresses.
    let (x, y) = unsafe {
        match value {
            Number::F32 => (
                f64::from(a.cast::<f32>().read_unaligned()),
                f64::from(io.cast::<f32>().read_unaligned()),
            ),
            Number::F64 => (
                a.cast::<f64>().read_unaligned(),
                io.cast::<f64>().read_unaligned(),
            ),
            Number::I16 => (
                f64::from(a.cast::<i16>().read_unaligned()),
                f64::from(io.cast::<i16>().read_unaligned()),
            ),
            Number::I32 => (
                f64::from(a.cast::<i32>().read_unaligned()),
                f64::from(io.cast::<i32>().read_unaligned()),
            ),
            // Compared exactly (an f64 would round large longs).
            Number::I64 => {
                let (x, y) = (
                    a.cast::<i64>().read_unaligned(),
                    io.cast::<i64>().read_unaligned(),
                );
                (x.cmp(&y) as i32 as f64, 0.0)
            }
            _ => return Err("this pair"),
        }
    };
    // SAFETY: as above, the index follows at `index_at`.
    let (ia, iio) = unsafe {
        (
            a.add(index_at).cast::<i32>().read_unaligned(),
            io.add(index_at).cast::<i32>().read_unaligned(),
        )
    };
    let take = if x == y { ia < iio } else { (x > y) == max };
    if take {
        // SAFETY: as above; the whole pair is copied.
        unsafe { std::ptr::copy_nonoverlapping(a, io, index_at + 4) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_maxloc_combine_element_by_element() {
        let a = [1i32, 5, -3];
        let mut b = [10i32, 20, 30];
        // SAFETY: three ints each.
        unsafe {
            apply(
                Reduce::Sum,
                Element::Num(Number::I32),
                3,
                a.as_ptr().cast(),
                b.as_mut_ptr().cast(),
            )
        }
        .unwrap();
        assert_eq!(b, [11, 25, 27]);
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq)]
        struct DoubleInt(f64, i32);
        let pair = Element::Pair {
            value: Number::F64,
            index_at: 8,
            size: 16,
        };
        let a = [DoubleInt(2.0, 1), DoubleInt(1.0, 1), DoubleInt(3.0, 0)];
        let mut b = [DoubleInt(1.0, 0), DoubleInt(1.0, 0), DoubleInt(3.0, 4)];
        // SAFETY: three pairs each.
        unsafe {
            apply(
                Reduce::Maxloc,
                pair,
                3,
                a.as_ptr().cast(),
                b.as_mut_ptr().cast(),
            )
        }
        .unwrap();
        assert_eq!(b[0], DoubleInt(2.0, 1));
        assert_eq!(
            b[1],
            DoubleInt(1.0, 0),
            "equal values keep the smaller index"
        );
        assert_eq!(b[2], DoubleInt(3.0, 0));
    }

    #[test]
    fn an_operation_on_an_element_it_is_not_defined_for_is_undefined() {
        let e = check(Reduce::Band, Element::Num(Number::F64)).unwrap_err();
        assert_eq!(e.op, Reduce::Band);
        assert!(check(Reduce::Sum, Element::Num(Number::F64)).is_ok());
        assert!(check(Reduce::Bxor, Element::Bytes { size: 3 }).is_ok());
        assert!(check(Reduce::Sum, Element::Bytes { size: 1 }).is_err());
        assert!(check(Reduce::Replace, Element::Bytes { size: 7 }).is_ok());
        let bad_pair = Element::Pair {
            value: Number::U8,
            index_at: 4,
            size: 8,
        };
        assert!(check(Reduce::Maxloc, bad_pair).is_err());
        let outside = Element::Pair {
            value: Number::I32,
            index_at: 255,
            size: 8,
        };
        assert!(check(Reduce::Maxloc, outside).is_err());
        assert!(check(Reduce::Replace, Element::Bytes { size: 0 }).is_err());
    }

    #[test]
    fn elements_survive_their_wire_form_and_nonsense_does_not_decode() {
        let all = [
            Element::Num(Number::I8),
            Element::Num(Number::C64),
            Element::Num(Number::Bool),
            Element::Pair {
                value: Number::F64,
                index_at: 8,
                size: 16,
            },
            Element::Bytes { size: 255 },
        ];
        for e in all {
            assert_eq!(Element::decode(e.encode()), Some(e));
        }
        for b in [
            [0, 0, 0, 0],
            [16, 0, 0, 1],
            [15, 0, 0, 0],
            [14, 10, 4, 16],
            [14, 3, 4, 6],
            [14, 99, 4, 8],
        ] {
            assert_eq!(Element::decode(b), None, "{b:?}");
        }
        for r in 0..=255u8 {
            if let Some(op) = Reduce::from_u8(r) {
                assert_eq!(op as u8, r);
            }
        }
    }
}
