//! Synchronization decoupled from data (the deposit seed's D5): the fastest barrier
//! quiver can do for the ranks of an [`Rma`](super::Rma).
//!
//! - **Inside a node** the node's ranks meet on two cache lines of a shared object of
//!   the node's leader (its lowest rank): an arrival counter and an episode number.
//!   Every rank adds itself to the counter; when the node is the whole job the rank
//!   that arrives last resets it and publishes the episode, which the others wait for
//!   (it is running, where a leader waiting its turn for a core would cost a context
//!   switch); otherwise the leader does, once the count is the node's and the rounds
//!   between nodes are over. No system call unless a waiter sleeps (then the last
//!   arrival or the releasing rank rings its doorbell, as a send would).
//! - **Across nodes** the leaders run a dissemination barrier: in round `k` leader `i`
//!   sends an empty control message to leader `i + 2^k` and waits for the one from
//!   `i - 2^k`, ⌈log2 L⌉ rounds for L nodes, on the engine's channels (one frame each,
//!   the lone-frame path).
//! - **Combined** when both exist: the node's arrivals, then the leaders' rounds, then
//!   the node's release.
//!
//! Each barrier call is an episode, numbered the same on every rank; a control message
//! carries its episode and round, and the protocol keeps only those of the current and
//! the next episode (a rank is never more than one ahead). While waiting, the rank
//! makes progress on its `Rma` (other nodes' requests are served).

pub(super) use super::node_lines::NodeLines;
use super::window::{SharedObject, PUBLISHED_IDS};
use crate::error::{Error, Result};
use std::sync::atomic::AtomicU64;

/// Shared-object numbers of node barrier areas: `AREA_IDS | r`, `r` random.
pub(super) const AREA_IDS: u32 = PUBLISHED_IDS | 1 << 29 | 1 << 28;
/// Bytes of an area: the counter's line and the episode's line.
const AREA_LEN: usize = 128;

/// This rank's place in the job's barrier.
pub(super) struct Plan {
    /// The ranks of this rank's node (by the transport: ranks that reach each other by
    /// shared memory), in rank order; the first is the leader.
    pub local: Vec<u32>,
    /// Every node's leader, in rank order (this node's among them).
    pub leaders: Vec<u32>,
}

impl Plan {
    /// The plan from each rank's node (`node_of(r)`, `None` for a rank on a node of its
    /// own: forced UDP) for a job of `size` ranks, as seen by `me`.
    pub(super) fn new(me: u32, size: u32, node_of: impl Fn(u32) -> Option<u32>) -> Plan {
        let mine = node_of(me);
        let local = match mine {
            Some(n) => (0..size).filter(|&r| node_of(r) == Some(n)).collect(),
            None => vec![me],
        };
        let leaders = (0..size)
            .filter(|&r| match node_of(r) {
                Some(n) => (0..r).all(|q| node_of(q) != Some(n)),
                None => true,
            })
            .collect();
        Plan { local, leaders }
    }

    /// This node's leader.
    pub(super) fn leader(&self) -> u32 {
        self.local[0]
    }

    /// Rounds of the leaders' dissemination.
    pub(super) fn rounds(&self) -> u32 {
        let l = self.leaders.len() as u32;
        if l <= 1 {
            0
        } else {
            32 - (l - 1).leading_zeros()
        }
    }

    /// To whom leader `me` sends in round `k`, and from whom it waits.
    pub(super) fn partners(&self, me: u32, k: u32) -> (u32, u32) {
        let l = self.leaders.len();
        let i = self
            .leaders
            .iter()
            .position(|&r| r == me)
            .expect("a leader");
        let step = 1usize << k;
        (
            self.leaders[(i + step) % l],
            self.leaders[(i + l - step % l) % l],
        )
    }
}

/// The parent of `rank` in the binomial tree of `size` ranks rooted at 0 (`None` for
/// the root).
pub(super) fn tree_parent(rank: u32) -> Option<u32> {
    (rank > 0).then(|| rank & (rank - 1))
}

/// The children of `rank` in that tree, nearest first.
pub(super) fn tree_children(rank: u32, size: u32) -> impl Iterator<Item = u32> {
    let low = if rank == 0 { 32 } else { rank.trailing_zeros() };
    (0..low)
        .map(move |k| rank as u64 + (1u64 << k))
        .take_while(move |&c| c < u64::from(size))
        .map(|c| c as u32)
}

/// The node's two shared cache lines.
pub(super) struct Area {
    mem: SharedObject,
}

impl Area {
    /// The leader's new area (`id` one of [`AREA_IDS`]).
    pub(super) fn create(job_id: u32, rank: u32, id: u32) -> Result<Area> {
        Ok(Area {
            mem: SharedObject::create(job_id, rank, id, AREA_LEN, true)?,
        })
    }

    /// The leader's area, mapped by another rank of the node.
    pub(super) fn open(job_id: u32, leader: u32, id: u32) -> Result<Area> {
        if id & AREA_IDS != AREA_IDS {
            return Err(Error::Config(format!(
                "{id} is not a barrier area's number"
            )));
        }
        let mem = SharedObject::open_peer(job_id, leader, id)?;
        if mem.len() < AREA_LEN {
            return Err(Error::Config("a barrier area that is too short".into()));
        }
        Ok(Area { mem })
    }

    fn word(&self, line: usize) -> &AtomicU64 {
        // SAFETY: the mapping is at least AREA_LEN bytes (checked when opened, or made
        // so), page-aligned, so line * 64 is an aligned word inside it; it lives as long
        // as `self`. Every access to the area is atomic.
        unsafe { &*(self.mem.ptr().add(line * 64) as *const AtomicU64) }
    }

    /// The area's lines for a node of `ranks` ranks.
    pub(super) fn lines(&self, ranks: u64) -> NodeLines<'_> {
        NodeLines::new(self.word(0), self.word(1), ranks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_and_leaders_follow_the_ranks_nodes() {
        // Ranks 0, 2, 4 on node 7, ranks 1, 3 on node 3, rank 5 alone.
        let nodes = [7, 3, 7, 3, 7, 9];
        let p = Plan::new(3, 6, |r| Some(nodes[r as usize]));
        assert_eq!(p.local, [1, 3]);
        assert_eq!(p.leaders, [0, 1, 5]);
        assert_eq!(p.leader(), 1);
        assert_eq!(p.rounds(), 2);
        assert_eq!(p.partners(1, 0), (5, 0));
        assert_eq!(p.partners(1, 1), (0, 5));
        // Forced UDP: every rank its own node.
        let p = Plan::new(2, 5, |_| None);
        assert_eq!(
            (p.local.clone(), p.leaders.len(), p.rounds()),
            (vec![2], 5, 3)
        );
        assert_eq!(p.partners(2, 2), (1, 3));
        assert_eq!(Plan::new(0, 1, |_| Some(0)).rounds(), 0);
    }

    #[test]
    fn the_tree_has_every_rank_once_and_is_log_deep() {
        for size in 1..=33u32 {
            let mut seen = vec![0u32; size as usize];
            seen[0] += 1;
            for r in 0..size {
                for c in tree_children(r, size) {
                    assert_eq!(tree_parent(c), Some(r), "size {size}");
                    seen[c as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "size {size}: {seen:?}");
            let depth = |mut r: u32| {
                let mut d = 0;
                while let Some(p) = tree_parent(r) {
                    r = p;
                    d += 1;
                }
                d
            };
            let max = (0..size).map(depth).max().unwrap();
            assert!(max <= 32 - size.leading_zeros(), "size {size}: depth {max}");
        }
    }

    #[test]
    fn dissemination_reaches_everyone_in_its_rounds() {
        // After ceil(log2 L) rounds every leader has heard, transitively, from all.
        for l in 1..=9u32 {
            let p = Plan::new(0, l, |_| None);
            let mut knows: Vec<u64> = (0..l).map(|i| 1 << i).collect();
            for k in 0..p.rounds() {
                let before = knows.clone();
                for me in 0..l {
                    let (_, from) = p.partners(me, k);
                    knows[me as usize] |= before[from as usize];
                }
            }
            assert!(knows.iter().all(|&k| k == (1 << l) - 1), "{l} leaders");
        }
    }
}
