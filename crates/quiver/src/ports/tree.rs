//! The binomial tree a broadcast travels when the link has no broadcast of its own: the
//! ranks numbered from the root (`rel = (rank - root) mod n`); rank `rel` receives from
//! `rel` less its highest bit and sends to `rel + 2^k` for every `2^k > rel` below `n`,
//! the farthest first (its subtree is the largest). Every rank but the root is reached
//! exactly once, in at most ceil(log2 n) steps, and each rank always hears a root's
//! messages from the same parent, so they stay in order.

/// The rank `rank` hears root `root`'s broadcasts from, in a job of `n` ranks; `None`
/// for the root itself (or a rank outside the job).
pub(crate) fn parent(rank: u32, root: u32, n: u32) -> Option<u32> {
    if rank >= n || root >= n || rank == root {
        return None;
    }
    let rel = (rank + n - root) % n;
    let top = 1u32 << (31 - rel.leading_zeros());
    Some((rel - top + root) % n)
}

/// The ranks `rank` forwards root `root`'s broadcasts to, farthest first.
pub(crate) fn children(rank: u32, root: u32, n: u32) -> impl Iterator<Item = u32> + Clone {
    let valid = rank < n && root < n;
    let rel = if valid { (rank + n - root) % n } else { n };
    // Powers of two above rel, from the largest that stays below n down.
    (0..32u32)
        .rev()
        .map(|k| 1u64 << k)
        .filter(move |&step| valid && step > u64::from(rel) && u64::from(rel) + step < u64::from(n))
        .map(move |step| ((u64::from(rel) + step + u64::from(root)) % u64::from(n)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_but_the_root_is_reached_once_from_its_parent() {
        for n in 1..=70u32 {
            for root in 0..n {
                let mut reached = vec![0u32; n as usize];
                let mut frontier = vec![root];
                let mut steps = 0;
                while !frontier.is_empty() {
                    let mut next = Vec::new();
                    for &r in &frontier {
                        for c in children(r, root, n) {
                            assert_eq!(parent(c, root, n), Some(r), "n {n} root {root} child {c}");
                            reached[c as usize] += 1;
                            next.push(c);
                        }
                    }
                    frontier = next;
                    steps += 1;
                }
                for (r, &times) in reached.iter().enumerate() {
                    let want = u32::from(r as u32 != root);
                    assert_eq!(
                        times, want,
                        "n {n} root {root}: rank {r} reached {times} times"
                    );
                }
                // ceil(log2 n) forwarding steps, plus the last empty frontier.
                let log = 32 - (n - 1).leading_zeros();
                assert!(steps <= log + 1, "n {n} root {root}: {steps} steps");
            }
        }
    }

    #[test]
    fn the_root_sends_farthest_first_and_strangers_have_no_place() {
        assert_eq!(children(0, 0, 8).collect::<Vec<_>>(), vec![4, 2, 1]);
        assert_eq!(children(5, 3, 8).collect::<Vec<_>>(), vec![1]);
        assert_eq!(parent(3, 3, 8), None);
        assert_eq!(parent(9, 0, 8), None);
        assert_eq!(parent(1, 9, 8), None);
        assert_eq!(children(9, 0, 8).count(), 0);
        assert_eq!(children(0, 0, 1).count(), 0);
    }
}
