//! The node barrier's two shared lines and the protocol on them (`barrier.rs` keeps
//! them in the leader's shared object): apart, so that the loom model runs the same code
//! on loom's atomics (it is compiled alone under `--cfg loom`).

use crate::sync::atomic::{AtomicU64, Ordering};

/// The node barrier's protocol on its two lines: an arrival counter and the last
/// episode released. Every rank of the node [`arrive`](Self::arrive)s; the one that
/// releases (the last arrival, or the leader once [`all_in`](Self::all_in) and its
/// rounds between nodes are done) [`release`](Self::release)s; the others wait for
/// [`released`](Self::released). A rank adds itself for the next episode only after
/// it saw this one released, which comes after the count was reset.
pub(crate) struct NodeLines<'a> {
    count: &'a AtomicU64,
    released: &'a AtomicU64,
    ranks: u64,
}

impl<'a> NodeLines<'a> {
    /// The lines `count` and `released` of a node of `ranks` ranks.
    pub(crate) fn new(count: &'a AtomicU64, released: &'a AtomicU64, ranks: u64) -> Self {
        NodeLines {
            count,
            released,
            ranks,
        }
    }

    /// Adds this rank to the arrivals; true when it is the last of the node's.
    pub(crate) fn arrive(&self) -> bool {
        self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.ranks
    }

    /// Whether every rank of the node arrived (the leader's wait).
    pub(crate) fn all_in(&self) -> bool {
        self.count.load(Ordering::Acquire) == self.ranks
    }

    /// Ends episode `e` for the node: the count back to zero, then the episode.
    pub(crate) fn release(&self, e: u64) {
        self.count.store(0, Ordering::Relaxed);
        self.released.store(e, Ordering::Release);
    }

    /// Whether episode `e` was released.
    pub(crate) fn released(&self, e: u64) -> bool {
        self.released.load(Ordering::Acquire) >= e
    }
}

#[cfg(loom)]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// `ranks` threads run `episodes` barriers on one pair of lines, the releaser chosen
    /// as the barrier chooses it; none leaves an episode before every rank entered it.
    /// With `patient` false the waiters look once and stop (loom's explorer does not
    /// end when two threads spin while a third has the work: three ranks are checked
    /// so, over one episode, every look at every point).
    fn model(ranks: u64, episodes: u64, leader_releases: bool, patient: bool) {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(2);
        model.check(move || {
            let lines = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
            // Ranks that entered each episode.
            let entered = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
            let threads: Vec<_> = (0..ranks)
                .map(|rank| {
                    let (lines, entered) = (lines.clone(), entered.clone());
                    loom::thread::spawn(move || {
                        let node = NodeLines::new(&lines[0], &lines[1], ranks);
                        for e in 1..=episodes {
                            entered[(e - 1) as usize].fetch_add(1, Ordering::SeqCst);
                            let last = node.arrive();
                            let releases = if leader_releases { rank == 0 } else { last };
                            if releases {
                                while !node.all_in() {
                                    loom::thread::yield_now();
                                }
                                node.release(e);
                            } else {
                                while !node.released(e) {
                                    if !patient {
                                        return;
                                    }
                                    loom::thread::yield_now();
                                }
                            }
                            assert_eq!(
                                entered[(e - 1) as usize].load(Ordering::SeqCst),
                                ranks,
                                "a rank left episode {e} before every rank entered it"
                            );
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        });
    }

    // Two ranks over two episodes: a released rank arrives again while the other has
    // not seen the release (the count must have been reset first).
    #[test]
    fn loom_the_last_arrival_releases_the_node() {
        model(2, 2, false, true);
        model(3, 1, false, false);
    }

    #[test]
    fn loom_the_leader_releases_the_node_after_everyone_arrived() {
        model(2, 2, true, true);
        model(3, 1, true, false);
    }
}
