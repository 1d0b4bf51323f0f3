//! Matching of tagged messages to receives: the posted-receive queue, the unexpected
//! queue, and the rule that pairs them. Sans-IO: a plain value with no endpoint, no
//! clock and no interior mutability; the protocol (`pushpull`) feeds it arrivals and
//! posted receives and acts on what it decides.
//!
//! What it guarantees:
//!
//! - **One pairing each.** A message is matched to at most one receive and a receive to
//!   at most one message; a message that matched nothing stays in the unexpected queue
//!   until a receive takes it (nothing is lost), and a receive stays posted until a
//!   message matches it or it is cancelled.
//! - **MPI's order.** An arriving message goes to the earliest posted receive that
//!   accepts it; a new receive takes the earliest unexpected message it accepts. Since
//!   the messages of one sender arrive in the order they were sent (one FIFO channel),
//!   two messages from one sender that both match a receive are matched in send order.
//! - Never both a posted receive and an unexpected message that match each other.
//!
//! The unexpected messages carry a payload `M` of the caller's (for `pushpull`, the
//! announced header and the pushed bytes); it is built only when a message has to wait
//! ([`Matching::arrive`] takes a closure), so a message that matches a posted receive
//! costs no allocation here.

use super::{Src, Tag};
use std::collections::VecDeque;

/// Whether a receive for (`src`, `tag`) accepts a message from `source` with tag `t`.
pub(super) fn accepts(src: Src, tag: Tag, source: u32, t: u32) -> bool {
    (src == Src::Any || src == Src::Rank(source)) && (tag == Tag::Any || tag == Tag::Is(t))
}

/// A receive waiting for a message.
#[derive(Debug, Clone, Copy)]
struct Posted {
    id: u64,
    src: Src,
    tag: Tag,
}

/// A message that arrived before any receive accepted it.
#[derive(Debug)]
pub(super) struct Arrived<M> {
    pub source: u32,
    pub tag: u32,
    pub msg: M,
}

/// The posted and unexpected queues of one tagged endpoint.
#[derive(Debug)]
pub(super) struct Matching<M> {
    /// Receives posted and not matched yet, in posting order.
    posted: VecDeque<Posted>,
    /// Messages no receive has taken yet, in arrival order.
    unexpected: VecDeque<Arrived<M>>,
}

impl<M> Matching<M> {
    pub(super) fn new() -> Matching<M> {
        Matching {
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
        }
    }

    /// A message from `source` with `tag` arrived: the posted receive it matches (no
    /// longer posted), or `None`, and then the message, built by `msg`, waits in the
    /// unexpected queue.
    pub(super) fn arrive(&mut self, source: u32, tag: u32, msg: impl FnOnce() -> M) -> Option<u64> {
        let i = self
            .posted
            .iter()
            .position(|p| accepts(p.src, p.tag, source, tag));
        match i.and_then(|i| self.posted.remove(i)) {
            Some(p) => Some(p.id),
            None => {
                self.unexpected.push_back(Arrived {
                    source,
                    tag,
                    msg: msg(),
                });
                None
            }
        }
    }

    /// Receive `id` for (`src`, `tag`) is posted: the unexpected message it takes (no
    /// longer queued), or `None`, and then the receive waits in the posted queue. `id`
    /// must not be posted already.
    pub(super) fn post(&mut self, id: u64, src: Src, tag: Tag) -> Option<Arrived<M>> {
        let i = self
            .unexpected
            .iter()
            .position(|u| accepts(src, tag, u.source, u.tag));
        let found = i.and_then(|i| self.unexpected.remove(i));
        if found.is_none() {
            self.posted.push_back(Posted { id, src, tag });
        }
        found
    }

    /// The unexpected message a receive for (`src`, `tag`) would take now, left queued.
    pub(super) fn probe(&self, src: Src, tag: Tag) -> Option<&Arrived<M>> {
        self.unexpected
            .iter()
            .find(|u| accepts(src, tag, u.source, u.tag))
    }

    /// Withdraws posted receive `id`; false if it is not posted (matched, cancelled, or
    /// never posted).
    pub(super) fn cancel(&mut self, id: u64) -> bool {
        match self.posted.iter().position(|p| p.id == id) {
            Some(i) => {
                self.posted.remove(i);
                true
            }
            None => false,
        }
    }

    /// The payload of the earliest unexpected message from `source` for which `f` holds
    /// (to add bytes that followed it).
    pub(super) fn unexpected_mut(&mut self, source: u32, f: impl Fn(&M) -> bool) -> Option<&mut M> {
        self.unexpected
            .iter_mut()
            .find(|u| u.source == source && f(&u.msg))
            .map(|u| &mut u.msg)
    }

    /// Takes the earliest unexpected message from `source` for which `f` holds out of
    /// the queue (its sender gave it up).
    pub(super) fn remove_unexpected(&mut self, source: u32, f: impl Fn(&M) -> bool) -> Option<M> {
        let i = self
            .unexpected
            .iter()
            .position(|u| u.source == source && f(&u.msg))?;
        self.unexpected.remove(i).map(|u| u.msg)
    }

    /// Receives posted and messages waiting.
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        (self.posted.len(), self.unexpected.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type M = Matching<&'static str>;

    #[test]
    fn a_message_waits_for_its_receive_and_a_receive_for_its_message() {
        let mut m = M::new();
        assert_eq!(m.arrive(1, 5, || "a"), None);
        assert_eq!(m.len(), (0, 1));
        assert!(
            m.post(10, Src::Rank(2), Tag::Is(5)).is_none(),
            "another sender"
        );
        assert!(
            m.post(11, Src::Rank(1), Tag::Is(6)).is_none(),
            "another tag"
        );
        let got = m.post(12, Src::Rank(1), Tag::Is(5)).unwrap();
        assert_eq!((got.source, got.tag, got.msg), (1, 5, "a"));
        assert_eq!(m.len(), (2, 0));
        assert_eq!(
            m.arrive(1, 6, || unreachable!("matched: not built")),
            Some(11)
        );
        assert_eq!(
            m.arrive(2, 5, || unreachable!("matched: not built")),
            Some(10)
        );
        assert_eq!(m.len(), (0, 0));
    }

    #[test]
    fn wildcards_accept_any_sender_or_tag() {
        let mut m = M::new();
        assert!(m.post(1, Src::Any, Tag::Is(3)).is_none());
        assert!(m.post(2, Src::Rank(4), Tag::Any).is_none());
        assert!(m.post(3, Src::Any, Tag::Any).is_none());
        assert_eq!(
            m.arrive(4, 3, || "x"),
            Some(1),
            "the earliest that accepts it"
        );
        assert_eq!(m.arrive(4, 9, || "x"), Some(2));
        assert_eq!(m.arrive(0, 0, || "x"), Some(3));
        assert_eq!(m.arrive(0, 0, || "y"), None);
        assert_eq!(m.post(5, Src::Any, Tag::Any).unwrap().msg, "y");
    }

    #[test]
    fn one_senders_messages_are_taken_in_send_order() {
        let mut m = M::new();
        m.arrive(1, 7, || "first");
        m.arrive(2, 7, || "other sender");
        m.arrive(1, 8, || "second");
        m.arrive(1, 7, || "third");
        let take = |m: &mut M, src, tag| m.post(0, src, tag).map(|a| a.msg);
        assert_eq!(take(&mut m, Src::Rank(1), Tag::Any), Some("first"));
        assert_eq!(take(&mut m, Src::Rank(1), Tag::Is(7)), Some("third"));
        assert_eq!(take(&mut m, Src::Any, Tag::Any), Some("other sender"));
        assert_eq!(take(&mut m, Src::Any, Tag::Any), Some("second"));
    }

    #[test]
    fn receives_are_matched_in_posting_order() {
        let mut m = M::new();
        m.post(1, Src::Any, Tag::Any);
        m.post(2, Src::Rank(1), Tag::Is(1));
        assert_eq!(m.arrive(1, 1, || ""), Some(1));
        assert_eq!(m.arrive(1, 1, || ""), Some(2));
    }

    #[test]
    fn probe_looks_without_taking() {
        let mut m = M::new();
        assert!(m.probe(Src::Any, Tag::Any).is_none());
        m.arrive(3, 1, || "a");
        m.arrive(2, 2, || "b");
        let p = m.probe(Src::Any, Tag::Is(2)).unwrap();
        assert_eq!((p.source, p.tag, p.msg), (2, 2, "b"));
        assert_eq!(m.probe(Src::Any, Tag::Any).unwrap().msg, "a");
        assert!(m.probe(Src::Rank(3), Tag::Is(2)).is_none());
        assert_eq!(m.len(), (0, 2));
    }

    #[test]
    fn cancel_withdraws_only_a_posted_receive() {
        let mut m = M::new();
        m.post(1, Src::Any, Tag::Any);
        m.post(2, Src::Any, Tag::Any);
        assert!(m.cancel(1));
        assert!(!m.cancel(1), "twice");
        assert!(!m.cancel(9), "never posted");
        assert_eq!(
            m.arrive(0, 0, || ""),
            Some(2),
            "the cancelled one is skipped"
        );
        assert!(!m.cancel(2), "matched");
        assert_eq!(m.len(), (0, 0));
    }

    #[test]
    fn bytes_that_follow_reach_the_waiting_message() {
        let mut m: Matching<(u64, Vec<u8>)> = Matching::new();
        m.arrive(1, 0, || (7, vec![1]));
        m.arrive(2, 0, || (7, vec![2]));
        m.unexpected_mut(2, |u| u.0 == 7).unwrap().1.push(3);
        assert!(m.unexpected_mut(1, |u| u.0 == 8).is_none());
        assert!(m.unexpected_mut(3, |u| u.0 == 7).is_none());
        assert_eq!(m.post(0, Src::Rank(2), Tag::Any).unwrap().msg.1, vec![2, 3]);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Arrive { source: u32, tag: u32 },
        Post { src: Src, tag: Tag },
        Cancel { nth: usize },
        Probe { src: Src, tag: Tag },
    }

    fn src() -> impl Strategy<Value = Src> {
        prop_oneof![1 => Just(Src::Any), 3 => (0..3u32).prop_map(Src::Rank)]
    }

    fn tag() -> impl Strategy<Value = Tag> {
        prop_oneof![1 => Just(Tag::Any), 3 => (0..3u32).prop_map(Tag::Is)]
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..3u32, 0..3u32).prop_map(|(source, tag)| Step::Arrive { source, tag }),
            4 => (src(), tag()).prop_map(|(src, tag)| Step::Post { src, tag }),
            1 => (0..64usize).prop_map(|nth| Step::Cancel { nth }),
            1 => (src(), tag()).prop_map(|(src, tag)| Step::Probe { src, tag }),
        ]
    }

    /// A message of the run: who sent it, its tag, its place among its sender's.
    struct Sent {
        source: u32,
        tag: u32,
        seq: u32,
        /// The step at which a receive took it.
        taken: Option<usize>,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Over any sequence of arrivals, posts (with wildcards), cancels and probes: no
        /// message is taken twice or lost, a receive takes the earliest message it
        /// accepts and a message the earliest receive that accepts it, and two messages
        /// from one sender that both match a receive are taken in send order.
        #[test]
        fn the_ordering_rule_holds_and_nothing_is_taken_twice_or_lost(
            steps in proptest::collection::vec(step(), 0..80)
        ) {
            let mut m: Matching<usize> = Matching::new();
            let mut sent: Vec<Sent> = Vec::new();
            let mut per_sender = [0u32; 3];
            // The receives: (src, tag, message taken), and the ones posted, in order.
            let mut recvs: Vec<(Src, Tag, Option<usize>)> = Vec::new();
            let mut pending_recvs: Vec<u64> = Vec::new();
            let mut pending_msgs: Vec<usize> = Vec::new();
            for (t, s) in steps.into_iter().enumerate() {
                match s {
                    Step::Arrive { source, tag } => {
                        let i = sent.len();
                        sent.push(Sent { source, tag, seq: per_sender[source as usize], taken: None });
                        per_sender[source as usize] += 1;
                        let first = pending_recvs.iter().copied().find(|&r| {
                            let (s, g, _) = recvs[r as usize];
                            accepts(s, g, source, tag)
                        });
                        match m.arrive(source, tag, || i) {
                            Some(r) => {
                                prop_assert_eq!(Some(r), first, "the earliest posted receive");
                                pending_recvs.retain(|&p| p != r);
                                prop_assert!(recvs[r as usize].2.is_none(), "a receive matched twice");
                                recvs[r as usize].2 = Some(i);
                                sent[i].taken = Some(t);
                            }
                            None => {
                                prop_assert_eq!(first, None, "queued though a receive accepts it");
                                pending_msgs.push(i);
                            }
                        }
                    }
                    Step::Post { src, tag } => {
                        let r = recvs.len() as u64;
                        recvs.push((src, tag, None));
                        let first = pending_msgs.iter().copied().find(|&i| {
                            accepts(src, tag, sent[i].source, sent[i].tag)
                        });
                        match m.post(r, src, tag) {
                            Some(a) => {
                                let i = a.msg;
                                prop_assert_eq!(Some(i), first, "the earliest waiting message");
                                prop_assert_eq!((a.source, a.tag), (sent[i].source, sent[i].tag));
                                prop_assert!(sent[i].taken.is_none(), "a message taken twice");
                                pending_msgs.retain(|&p| p != i);
                                sent[i].taken = Some(t);
                                recvs[r as usize].2 = Some(i);
                            }
                            None => {
                                prop_assert_eq!(first, None, "posted though a message waits for it");
                                pending_recvs.push(r);
                            }
                        }
                    }
                    Step::Cancel { nth } => {
                        if recvs.is_empty() {
                            prop_assert!(!m.cancel(0));
                            continue;
                        }
                        let r = (nth % recvs.len()) as u64;
                        let was_pending = pending_recvs.contains(&r);
                        prop_assert_eq!(m.cancel(r), was_pending);
                        pending_recvs.retain(|&p| p != r);
                    }
                    Step::Probe { src, tag } => {
                        let first = pending_msgs.iter().copied().find(|&i| {
                            accepts(src, tag, sent[i].source, sent[i].tag)
                        });
                        prop_assert_eq!(m.probe(src, tag).map(|a| a.msg), first);
                    }
                }
                prop_assert_eq!(m.len(), (pending_recvs.len(), pending_msgs.len()));
            }
            // Nothing lost: every message was taken once or still waits, in arrival order.
            let waiting: Vec<usize> = std::iter::from_fn(|| m.post(u64::MAX, Src::Any, Tag::Any).map(|a| a.msg)).collect();
            prop_assert_eq!(&waiting, &pending_msgs);
            for (i, s) in sent.iter().enumerate() {
                prop_assert!(s.taken.is_some() != waiting.contains(&i), "message {} lost or kept twice", i);
            }
            // MPI's rule, from the record alone: when a receive took a message, no earlier
            // message of the same sender that it also accepts was still waiting.
            for &(src, tag, taken) in &recvs {
                let Some(i) = taken else { continue };
                let when = sent[i].taken.unwrap();
                for e in sent.iter().filter(|e| e.source == sent[i].source && e.seq < sent[i].seq) {
                    if accepts(src, tag, e.source, e.tag) {
                        prop_assert!(
                            e.taken.is_some_and(|t| t < when),
                            "message {} of rank {} overtaken by message {}", e.seq, e.source, sent[i].seq
                        );
                    }
                }
            }
        }
    }
}
