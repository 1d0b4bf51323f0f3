//! Reduction operations: MPI's predefined ones on the numbers they are defined for, and
//! the application's own (a function the front-end wraps).
//!
//! [`Op::apply`] combines `inout[i] = in[i] op inout[i]` element by element over packed
//! data, in the argument order MPI prescribes, so that a non-commutative operation sees
//! its operands in rank order when the caller feeds them so (`coll` does).

use crate::datatype::{Elem, Layout, Num};
use crate::error::{Class, MpiError, Result};
use std::sync::Arc;

/// MPI's predefined operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    #[allow(missing_docs)]
    Max,
    #[allow(missing_docs)]
    Min,
    #[allow(missing_docs)]
    Sum,
    #[allow(missing_docs)]
    Prod,
    /// Logical and, or, exclusive or.
    Land,
    #[allow(missing_docs)]
    Lor,
    #[allow(missing_docs)]
    Lxor,
    /// Bitwise and, or, exclusive or.
    Band,
    #[allow(missing_docs)]
    Bor,
    #[allow(missing_docs)]
    Bxor,
    /// The pair of the largest (smallest) value, with the smallest index among equals.
    Maxloc,
    #[allow(missing_docs)]
    Minloc,
    /// The incoming value replaces the target's (one-sided accumulate).
    Replace,
    /// Nothing changes (one-sided fetch).
    NoOp,
}

/// An application's reduction: `f(in, inout, count, datatype)` combines `count`
/// elements (the front-end passes its own handle of the datatype through).
pub type UserFn = Arc<dyn Fn(*const u8, *mut u8, usize, u64) + Send + Sync>;

/// A reduction operation.
#[derive(Clone)]
pub enum Op {
    /// One of MPI's.
    Builtin(Builtin),
    /// The application's, and whether it is commutative.
    User {
        /// The function.
        f: UserFn,
        /// Whether operands may be combined in any order.
        commute: bool,
    },
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Builtin(b) => write!(f, "{b:?}"),
            Op::User { commute, .. } => write!(f, "User {{ commute: {commute} }}"),
        }
    }
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
            Builtin::Max => each!($t, $n, $inp, $io, |a, b| a.max(b)),
            Builtin::Min => each!($t, $n, $inp, $io, |a, b| a.min(b)),
            Builtin::Sum => each!($t, $n, $inp, $io, |a, b| a.wrapping_add(b)),
            Builtin::Prod => each!($t, $n, $inp, $io, |a, b| a.wrapping_mul(b)),
            Builtin::Land => each!($t, $n, $inp, $io, |a, b| ((a != 0) && (b != 0)) as $t),
            Builtin::Lor => each!($t, $n, $inp, $io, |a, b| ((a != 0) || (b != 0)) as $t),
            Builtin::Lxor => each!($t, $n, $inp, $io, |a, b| ((a != 0) != (b != 0)) as $t),
            Builtin::Band => each!($t, $n, $inp, $io, |a, b| a & b),
            Builtin::Bor => each!($t, $n, $inp, $io, |a, b| a | b),
            Builtin::Bxor => each!($t, $n, $inp, $io, |a, b| a ^ b),
            _ => return Err(undefined($op, stringify!($t))),
        }
    };
}

macro_rules! float_ops {
    ($t:ty, $op:expr, $n:expr, $inp:expr, $io:expr) => {
        match $op {
            Builtin::Max => each!($t, $n, $inp, $io, |a, b| if a > b { a } else { b }),
            Builtin::Min => each!($t, $n, $inp, $io, |a, b| if a < b { a } else { b }),
            Builtin::Sum => each!($t, $n, $inp, $io, |a, b| a + b),
            Builtin::Prod => each!($t, $n, $inp, $io, |a, b| a * b),
            _ => return Err(undefined($op, stringify!($t))),
        }
    };
}

macro_rules! complex_ops {
    ($t:ty, $op:expr, $n:expr, $inp:expr, $io:expr) => {
        match $op {
            Builtin::Sum => each!([$t; 2], $n, $inp, $io, |a, b| [a[0] + b[0], a[1] + b[1]]),
            Builtin::Prod => each!([$t; 2], $n, $inp, $io, |a, b| [
                a[0] * b[0] - a[1] * b[1],
                a[0] * b[1] + a[1] * b[0]
            ]),
            _ => return Err(undefined($op, "complex")),
        }
    };
}

fn undefined(op: Builtin, ty: &str) -> MpiError {
    let name = format!("{op:?}").to_uppercase();
    MpiError::new(Class::Op, format!("MPI_{name} is not defined on {ty}"))
}

impl Op {
    /// Whether operands may be combined in any order.
    pub fn commutative(&self) -> bool {
        match self {
            Op::Builtin(_) => true,
            Op::User { commute, .. } => *commute,
        }
    }

    /// Fails unless the operation is defined on `elem` (checked before any data moves,
    /// so that every rank of a collective fails alike).
    pub fn check(&self, elem: Option<Elem>) -> Result<()> {
        let Op::Builtin(op) = self else { return Ok(()) };
        let Some(elem) = elem else {
            return match op {
                Builtin::Replace | Builtin::NoOp => Ok(()),
                _ => Err(MpiError::new(
                    Class::Op,
                    "reductions need a datatype of one kind of number",
                )),
            };
        };
        // A trial on one zeroed element says whether it is defined.
        let mut a = vec![0u8; elem.size()];
        let b = vec![0u8; elem.size()];
        // SAFETY: one element of `elem` in each.
        unsafe { Op::Builtin(*op).apply(elem, 1, b.as_ptr(), a.as_mut_ptr(), 0) }
    }

    /// Fails unless the operation can combine elements of `layout`: one of MPI's needs a
    /// type of one kind of number; an application's function sees the data as the type
    /// lays it out in memory, which the packed data the collectives move is only for a
    /// contiguous type (so here it needs one).
    pub fn check_layout(&self, layout: &Layout) -> Result<()> {
        match self {
            Op::Builtin(_) => self.check(layout.elem),
            Op::User { .. } if layout.is_contiguous() => Ok(()),
            Op::User { .. } => Err(MpiError::new(
                Class::Unsupported,
                "an application's reduction on a datatype that is not contiguous",
            )),
        }
    }

    /// `inout = in op inout` over `len` bytes of packed elements of `layout` (checked
    /// with [`Op::check_layout`]); an application's function gets the count of the
    /// type's elements, as MPI says.
    ///
    /// # Safety
    ///
    /// `len` bytes readable at `inp` and writable at `inout`, not overlapping.
    pub unsafe fn combine(
        &self,
        layout: &Layout,
        len: usize,
        inp: *const u8,
        inout: *mut u8,
        handle: u64,
    ) -> Result<()> {
        if layout.size == 0 || len == 0 {
            return Ok(());
        }
        let (elem, n) = match (self, layout.elem) {
            (Op::User { .. }, _) => (Elem::Opaque { size: layout.size }, len / layout.size),
            (Op::Builtin(_), Some(e)) => (e, len / e.size()),
            (Op::Builtin(_), None) => {
                return Err(MpiError::new(
                    Class::Op,
                    "reductions need a datatype of one kind of number",
                ))
            }
        };
        // SAFETY: the caller's promise: `n` elements of `elem` are `len` bytes.
        unsafe { self.apply(elem, n, inp, inout, handle) }
    }

    /// `inout[i] = in[i] op inout[i]` for `count` elements of `elem` (`handle`: the
    /// front-end's name of the datatype, for an application's function).
    ///
    /// # Safety
    ///
    /// `inp` holds `count` readable elements and `inout` `count` writable ones, not
    /// overlapping.
    pub unsafe fn apply(
        &self,
        elem: Elem,
        count: usize,
        inp: *const u8,
        inout: *mut u8,
        handle: u64,
    ) -> Result<()> {
        let op = match self {
            Op::User { f, .. } => {
                f(inp, inout, count, handle);
                return Ok(());
            }
            Op::Builtin(op) => *op,
        };
        match op {
            Builtin::NoOp => return Ok(()),
            Builtin::Replace => {
                // SAFETY: the caller promises `count` elements at both, apart.
                unsafe { std::ptr::copy_nonoverlapping(inp, inout, count * elem.size()) };
                return Ok(());
            }
            _ => {}
        }
        match elem {
            Elem::Num(Num::I8) => int_ops!(i8, op, count, inp, inout),
            Elem::Num(Num::I16) => int_ops!(i16, op, count, inp, inout),
            Elem::Num(Num::I32) => int_ops!(i32, op, count, inp, inout),
            Elem::Num(Num::I64) => int_ops!(i64, op, count, inp, inout),
            Elem::Num(Num::U8) => int_ops!(u8, op, count, inp, inout),
            Elem::Num(Num::U16) => int_ops!(u16, op, count, inp, inout),
            Elem::Num(Num::U32) => int_ops!(u32, op, count, inp, inout),
            Elem::Num(Num::U64) => int_ops!(u64, op, count, inp, inout),
            Elem::Num(Num::F32) => float_ops!(f32, op, count, inp, inout),
            Elem::Num(Num::F64) => float_ops!(f64, op, count, inp, inout),
            Elem::Num(Num::C32) => complex_ops!(f32, op, count, inp, inout),
            Elem::Num(Num::C64) => complex_ops!(f64, op, count, inp, inout),
            Elem::Num(Num::Bool) => match op {
                Builtin::Land | Builtin::Lor | Builtin::Lxor => int_ops!(u8, op, count, inp, inout),
                _ => return Err(undefined(op, "booleans")),
            },
            Elem::Bytes {
                size,
                bitwise: true,
            } => match op {
                Builtin::Band | Builtin::Bor | Builtin::Bxor => {
                    int_ops!(u8, op, count * size, inp, inout)
                }
                _ => return Err(undefined(op, "MPI_BYTE")),
            },
            Elem::Pair {
                value,
                index_at,
                size,
            } => {
                let max = match op {
                    Builtin::Maxloc => true,
                    Builtin::Minloc => false,
                    _ => return Err(undefined(op, "value-index pairs")),
                };
                for i in 0..count {
                    // SAFETY: the caller promises `count` pairs of `size` bytes at both.
                    unsafe {
                        pair_loc(value, index_at, inp.add(i * size), inout.add(i * size), max)?
                    };
                }
            }
            Elem::Bytes { .. } | Elem::Opaque { .. } => return Err(undefined(op, "this datatype")),
        }
        Ok(())
    }
}

/// `MPI_MAXLOC` (`max`) or `MPI_MINLOC` of one pair into `io`.
///
/// # Safety
///
/// Both point at a pair: a `value` then an `int` at `index_at`.
unsafe fn pair_loc(
    value: Num,
    index_at: usize,
    a: *const u8,
    io: *mut u8,
    max: bool,
) -> Result<()> {
    // SAFETY: the caller promises a value at both addresses.
    let (x, y) = unsafe {
        match value {
            Num::F32 => (
                f64::from(a.cast::<f32>().read_unaligned()),
                f64::from(io.cast::<f32>().read_unaligned()),
            ),
            Num::F64 => (
                a.cast::<f64>().read_unaligned(),
                io.cast::<f64>().read_unaligned(),
            ),
            Num::I16 => (
                f64::from(a.cast::<i16>().read_unaligned()),
                f64::from(io.cast::<i16>().read_unaligned()),
            ),
            Num::I32 => (
                f64::from(a.cast::<i32>().read_unaligned()),
                f64::from(io.cast::<i32>().read_unaligned()),
            ),
            // Compared exactly (an f64 would round large longs).
            Num::I64 => {
                let (x, y) = (
                    a.cast::<i64>().read_unaligned(),
                    io.cast::<i64>().read_unaligned(),
                );
                (x.cmp(&y) as i32 as f64, 0.0)
            }
            _ => {
                return Err(undefined(
                    if max {
                        Builtin::Maxloc
                    } else {
                        Builtin::Minloc
                    },
                    "this pair",
                ))
            }
        }
    };
    // SAFETY: as above, the int index follows at `index_at`.
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
            Op::Builtin(Builtin::Sum).apply(
                Elem::Num(Num::I32),
                3,
                a.as_ptr().cast(),
                b.as_mut_ptr().cast(),
                0,
            )
        }
        .unwrap();
        assert_eq!(b, [11, 25, 27]);
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq)]
        struct DoubleInt(f64, i32);
        let pair = Elem::Pair {
            value: Num::F64,
            index_at: 8,
            size: 16,
        };
        let a = [DoubleInt(2.0, 1), DoubleInt(1.0, 1), DoubleInt(3.0, 0)];
        let mut b = [DoubleInt(1.0, 0), DoubleInt(1.0, 0), DoubleInt(3.0, 4)];
        // SAFETY: three pairs each.
        unsafe {
            Op::Builtin(Builtin::Maxloc).apply(pair, 3, a.as_ptr().cast(), b.as_mut_ptr().cast(), 0)
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
    fn an_operation_on_a_type_it_is_not_defined_for_is_an_op_error() {
        let e = Op::Builtin(Builtin::Band)
            .check(Some(Elem::Num(Num::F64)))
            .unwrap_err();
        assert_eq!(e.class(), Class::Op);
        assert!(Op::Builtin(Builtin::Sum)
            .check(Some(Elem::Num(Num::F64)))
            .is_ok());
        assert!(Op::Builtin(Builtin::Bxor)
            .check(Some(Elem::Bytes {
                size: 1,
                bitwise: true
            }))
            .is_ok());
        assert!(Op::Builtin(Builtin::Sum)
            .check(Some(Elem::Bytes {
                size: 1,
                bitwise: false
            }))
            .is_err());
    }
}
