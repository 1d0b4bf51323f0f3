//! DMSG, the deposit seed's library (D7, D8): data deposited with puts straight into its
//! final place, no per-transfer synchronization, global barriers between phases, and
//! congestion-control barriers inside an all-to-all.
//!
//! One communication step ([`alltoall`]) is, on every rank:
//!
//! 1. barrier A: every rank is done with the destination window, so no live data is
//!    overwritten;
//! 2. n-1 rounds that are permutations (in round `k` rank `i` deposits into rank
//!    `i XOR k` when n is a power of two, else `(i + k) mod n`: every rank receives from
//!    exactly one rank per round), with a flush and a barrier after every `r` rounds
//!    (`r = n - 1`: no congestion control);
//! 3. a flush of this rank's puts, then barrier B: every block is in place everywhere.
//!
//! The blocks go by [`Rma::put`] (same node: copied into the window directly; other
//! nodes: one-frame pieces scattered on arrival), or by [`Rma::put_strided`] when a
//! block is a strided layout of the destination ([`alltoall_strided`]: a transpose's
//! columns).

use super::{timed, Phases, Rma, Strided, Window};
use crate::error::{Error, Result};
use std::cell::Cell;

/// Which rank `me` deposits into in round `k` (1..n) of `n` ranks.
fn partner(me: u32, k: u32, n: u32) -> u32 {
    if n.is_power_of_two() {
        me ^ k
    } else {
        (me + k) % n
    }
}

/// One all-to-all step: block `j` of `src` (bytes `j * block ..`) lands at offset
/// `me * block` of `dst` on rank `j` (this rank's own block is copied locally), with a
/// flush and a barrier every `r` rounds (at least 1). Collective: every rank calls it
/// with the same `block` and `r`. Returns where the time went (barriers are control).
pub fn alltoall(rma: &Rma, src: &[u8], dst: &Window, block: usize, r: u32) -> Result<Phases> {
    let (me, n) = ranks(rma);
    if src.len() < block * n as usize || dst.len() < block * n as usize {
        return Err(Error::Config(format!(
            "alltoall of {n} blocks of {block} bytes: the source has {} bytes, the window {}",
            src.len(),
            dst.len()
        )));
    }
    let offset = |rank: u32| rank as usize * block;
    step(rma, r, |j| {
        let from = &src[offset(j)..offset(j) + block];
        if j == me {
            dst.write(offset(me), from)
        } else {
            rma.put(j, dst, offset(me) as u64, from)
        }
    })
}

/// [`alltoall`] with each block deposited as a strided layout of the destination:
/// `at(me)` on rank `j` (this rank's place in every destination, e.g. its columns of a
/// transposed matrix), the block's elements read from `src` at `src_offset(j)` with
/// `src_stride` between them.
pub fn alltoall_strided(
    rma: &Rma,
    src: &[u8],
    src_offset: impl Fn(u32) -> u64,
    src_stride: u64,
    dst: &Window,
    at: Strided,
    r: u32,
) -> Result<Phases> {
    step(rma, r, |j| {
        let from = src.get(src_offset(j) as usize..).ok_or_else(|| {
            Error::Config(format!("source offset {} past the buffer", src_offset(j)))
        })?;
        rma.put_strided(j, dst, at, from, src_stride)
    })
}

fn ranks(rma: &Rma) -> (u32, u32) {
    use crate::engine::station::Footing;
    let job = rma.endpoint().station().job();
    (job.rank, job.size)
}

/// Barrier A, the rounds (`deposit(j)` for this round's partner, this rank's own block
/// in round 0) with the congestion-control barriers, the flush and barrier B.
fn step(rma: &Rma, r: u32, mut deposit: impl FnMut(u32) -> Result<()>) -> Result<Phases> {
    let (me, n) = ranks(rma);
    let r = r.max(1);
    let (transfer, control) = (Cell::default(), Cell::default());
    timed(&control, || rma.barrier())?;
    timed(&transfer, || deposit(me))?;
    for k in 1..n {
        timed(&transfer, || deposit(partner(me, k, n)))?;
        if k % r == 0 && k < n - 1 {
            timed(&transfer, || rma.flush_all())?;
            timed(&control, || rma.barrier())?;
        }
    }
    timed(&transfer, || rma.flush_all())?;
    timed(&control, || rma.barrier())?;
    Ok(Phases {
        transfer: transfer.get(),
        control: control.get(),
        copy: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::partner;

    #[test]
    fn every_round_is_a_permutation_and_every_pair_meets_once() {
        for n in 1..=12u32 {
            let mut met = vec![vec![false; n as usize]; n as usize];
            for k in 1..n {
                let mut to: Vec<u32> = (0..n).map(|i| partner(i, k, n)).collect();
                for i in 0..n {
                    assert_ne!(to[i as usize], i, "n {n} round {k}");
                    assert!(!met[i as usize][to[i as usize] as usize]);
                    met[i as usize][to[i as usize] as usize] = true;
                }
                to.sort_unstable();
                assert_eq!(to, (0..n).collect::<Vec<_>>(), "n {n} round {k}");
            }
        }
    }
}
