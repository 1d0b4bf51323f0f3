//! Reduction operations: MPI's predefined ones on the numbers they are defined for, and
//! the application's own (a function the front-end wraps).
//!
//! [`Op::apply`] combines `inout[i] = in[i] op inout[i]` element by element over packed
//! data, in the argument order MPI prescribes, so that a non-commutative operation sees
//! its operands in rank order when the caller feeds them so (`coll` does).

use crate::datatype::{Elem, Layout};
use crate::error::{Class, MpiError, Result};
use quiver::rma::reduce::{self, Element};
use std::sync::Arc;

/// MPI's predefined operations: quiver's reductions (a one-sided target applies them).
pub use quiver::rma::reduce::Reduce as Builtin;

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

fn undefined(op: Builtin, ty: &str) -> MpiError {
    let name = format!("{op:?}").to_uppercase();
    MpiError::new(Class::Op, format!("MPI_{name} is not defined on {ty}"))
}

/// The element quiver computes `op` on for MPI's `elem`: numbers and pairs as they are,
/// bytes with bitwise operations (`MPI_BYTE`) as bytes; other bytes and opaque
/// elements for replacing and fetching only.
pub(crate) fn element(op: Builtin, elem: Elem) -> Result<Element> {
    let small = |n: usize| u8::try_from(n).map_err(|_| undefined(op, "elements this large"));
    Ok(match elem {
        Elem::Num(n) => Element::Num(n),
        Elem::Pair {
            value,
            index_at,
            size,
        } => Element::Pair {
            value,
            index_at: small(index_at)?,
            size: small(size)?,
        },
        Elem::Bytes {
            size,
            bitwise: true,
        } => Element::Bytes { size: small(size)? },
        Elem::Bytes { size, .. } | Elem::Opaque { size }
            if matches!(op, Builtin::Replace | Builtin::NoOp) =>
        {
            Element::Bytes { size: small(size)? }
        }
        _ => return Err(undefined(op, "this datatype")),
    })
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
            Builtin::NoOp => Ok(()),
            Builtin::Replace => {
                // SAFETY: the caller promises `count` elements at both, apart.
                unsafe { std::ptr::copy_nonoverlapping(inp, inout, count * elem.size()) };
                Ok(())
            }
            _ => {
                let e = element(op, elem)?;
                // SAFETY: the caller's promise: `count` elements at both, apart.
                unsafe { reduce::apply(op, e, count, inp, inout) }
                    .map_err(|u| undefined(u.op, u.what))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Num;

    #[test]
    fn mpis_elements_compute_as_quivers() {
        let a = [1i32, 5, -3];
        let mut b = [10i32, 20, 30];
        let sum = Op::Builtin(Builtin::Sum);
        // SAFETY: three ints each.
        unsafe {
            sum.apply(
                Elem::Num(Num::I32),
                3,
                a.as_ptr().cast(),
                b.as_mut_ptr().cast(),
                0,
            )
        }
        .unwrap();
        assert_eq!(b, [11, 25, 27]);
        // A pair's index offset and size become quiver's bytes.
        let pair = Elem::Pair {
            value: Num::F32,
            index_at: 4,
            size: 8,
        };
        let a = [2.0f32.to_bits(), 7];
        let mut b = [1.0f32.to_bits(), 3];
        let maxloc = Op::Builtin(Builtin::Maxloc);
        // SAFETY: one pair each.
        unsafe { maxloc.apply(pair, 1, a.as_ptr().cast(), b.as_mut_ptr().cast(), 0) }.unwrap();
        assert_eq!(b, a);
        // Opaque elements are replaced, never combined.
        let opaque = Elem::Opaque { size: 3 };
        let mut c = [0u8; 3];
        // SAFETY: one 3-byte element each.
        unsafe {
            Op::Builtin(Builtin::Replace).apply(opaque, 1, [1u8, 2, 3].as_ptr(), c.as_mut_ptr(), 0)
        }
        .unwrap();
        assert_eq!(c, [1, 2, 3]);
        assert!(Op::Builtin(Builtin::Band).check(Some(opaque)).is_err());
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
