//! The root's side of a group channel: what its members acknowledged, together.
//!
//! A group channel carries one root's broadcasts: every frame leaves once, to the link's
//! broadcast address, and reaches every member endpoint of the other nodes at once
//! (GAMMA's native broadcast). Each member receives the stream on an ordinary channel
//! of its own (a [`Duplex`](crate::channel::reliable::Duplex) whose frames carry
//! `GROUP_REPLY`) and acknowledges to the root alone, as it would a unicast sender: a
//! cumulative acknowledgement with its credits every half window (or after the delayed
//! acknowledgement), at once with a selective bitmap when a frame arrives out of order.
//!
//! [`Members`] turns those replies into what the root's sender needs:
//!
//! - **What the group acknowledged**: the smallest cumulative acknowledgement and the
//!   smallest credit limit over the live members ([`Members::agreed`]). The root's
//!   sender frees a frame only when every live member has it, and never sends past the
//!   slowest member's buffers: flow control holds the root back for its slowest reader.
//! - **Repairs**: a frame that a member reports missing (the holes of its bitmap) is
//!   sent again at once, to the whole group (a frame one member lost has often been
//!   lost by others behind the same switch; the others drop the copy as a duplicate),
//!   at most once per round trip whoever else reports it. The retransmission timer of
//!   the root's sender remains for a lost tail.
//! - **Members that are gone**: a member whose unicast channel failed or said goodbye
//!   no longer holds the group back ([`Members::set_live`]); the unicast channel reports
//!   its failure.
//!
//! No implosion: the root hears from each member about twice per window of frames, as
//! a unicast sender does from its one receiver, not once per frame per member; and a
//! loss costs one report from each member that saw it.

use crate::addr::Source;
use crate::channel::reliable::{seq_ahead, seq_lt, AckStamp, Sack, Time};
use std::collections::VecDeque;
use std::time::Duration;

/// One member of a group: its unicast channel and what it acknowledged.
#[derive(Debug, Clone)]
struct Member {
    source: Source,
    /// Index of its unicast channel in the core's peer table.
    peer: usize,
    /// Next frame it expects.
    ack: u32,
    /// The first frame it has no buffer for.
    limit: u32,
    live: bool,
}

/// The members of a root's group channel (module documentation).
#[derive(Debug)]
pub(crate) struct Members {
    members: Vec<Member>,
    /// Frames reported missing, to resend at the next transmit.
    repairs: Vec<u32>,
    /// Recent repairs and when they left: no frame is repaired twice within a round trip.
    repaired: VecDeque<(u32, Time)>,
    /// Repairs sent so far.
    repairs_sent: u64,
    /// Replies that acknowledged frames never sent (dropped).
    bad_replies: u64,
}

impl Members {
    /// The group of `members` (each with the index of its unicast channel), each assumed
    /// to have `window` buffers free and to expect frame 0, as every channel starts.
    pub(crate) fn new(members: impl IntoIterator<Item = (Source, usize)>, window: u16) -> Self {
        Members {
            members: members
                .into_iter()
                .map(|(source, peer)| Member {
                    source,
                    peer,
                    ack: 0,
                    limit: u32::from(window),
                    live: true,
                })
                .collect(),
            repairs: Vec::new(),
            repaired: VecDeque::new(),
            repairs_sent: 0,
            bad_replies: 0,
        }
    }

    /// Which member `source` is.
    pub(crate) fn index_of(&self, source: Source) -> Option<usize> {
        self.members.iter().position(|m| m.source == source)
    }

    /// How many members the group has (live or not).
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// The unicast channel of member `m`.
    pub(crate) fn peer_of(&self, m: usize) -> usize {
        self.members[m].peer
    }

    /// Member `m` counts (live) or no longer does (its channel failed or closed).
    pub(crate) fn set_live(&mut self, m: usize, live: bool) {
        self.members[m].live = live;
    }

    /// Member `m` acknowledged `stamp`, with selective bitmap `sack` (bit `i`: frame
    /// `stamp.ack + 1 + i` arrived). `sent_end` is the root's next frame never sent (a
    /// reply beyond it is a lie, dropped); `kept` says whether the root still holds a
    /// frame; `guard` is how long a repaired frame waits before another report can
    /// repair it again (a round trip).
    pub(crate) fn handle_reply(
        &mut self,
        m: usize,
        now: Time,
        (stamp, sack): (AckStamp, Sack),
        sent_end: u32,
        guard: Duration,
        kept: impl Fn(u32) -> bool,
    ) {
        let member = &mut self.members[m];
        if seq_lt(sent_end, stamp.ack) {
            self.bad_replies += 1;
            return;
        }
        if seq_lt(member.ack, stamp.ack) {
            member.ack = stamp.ack;
        }
        let limit = stamp.ack.wrapping_add(u32::from(stamp.credits));
        if seq_lt(member.limit, limit) {
            member.limit = limit;
        }
        if sack.is_empty() {
            return;
        }
        while self
            .repaired
            .front()
            .is_some_and(|&(_, at)| now.saturating_since(at) >= guard)
        {
            self.repaired.pop_front();
        }
        // Everything up to the highest frame reported received that the report leaves
        // out is missing, and so is the acknowledged frame itself.
        let missing = sack.missing(stamp.ack);
        for seq in missing {
            if kept(seq) && !self.repaired.iter().any(|&(s, _)| s == seq) {
                self.repaired.push_back((seq, now));
                self.repairs.push(seq);
            }
        }
    }

    /// What the group as a whole acknowledged: the smallest acknowledgement and credit
    /// limit over the live members (measured from `base`, the oldest frame the root
    /// still holds). With no live member left, everything sent is acknowledged and a
    /// `window` is open beyond it: nobody is left to wait for.
    pub(crate) fn agreed(&self, base: u32, sent_end: u32, window: u16) -> AckStamp {
        let live = || self.members.iter().filter(|m| m.live);
        let (Some(ack), Some(limit)) = (
            live().map(|m| m.ack).min_by_key(|&a| a.wrapping_sub(base)),
            live()
                .map(|m| m.limit)
                .min_by_key(|&l| l.wrapping_sub(base)),
        ) else {
            return AckStamp {
                ack: sent_end,
                credits: window,
            };
        };
        let credits = seq_ahead(ack, limit).unwrap_or(0).min(u32::from(u16::MAX));
        AckStamp {
            ack,
            credits: credits as u16,
        }
    }

    /// The frames to repair now, in the order they were reported.
    pub(crate) fn take_repairs(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.repairs)
    }

    /// One repair taken went out (the frame was still kept).
    pub(crate) fn count_repair(&mut self) {
        self.repairs_sent += 1;
    }

    /// Repairs sent so far.
    pub(crate) fn repairs_sent(&self) -> u64 {
        self.repairs_sent
    }

    /// Replies dropped because they acknowledged frames never sent.
    pub(crate) fn bad_replies(&self) -> u64 {
        self.bad_replies
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(rank: u32) -> Source {
        Source { rank, dpid: 1 }
    }

    fn stamp(ack: u32, credits: u16) -> AckStamp {
        AckStamp { ack, credits }
    }

    fn at(us: u64) -> Time {
        Time::from_duration(Duration::from_micros(us))
    }

    const RTT: Duration = Duration::from_micros(100);

    #[test]
    fn the_group_acknowledges_what_its_slowest_live_member_has() {
        let mut g = Members::new([(src(1), 0), (src(2), 1), (src(3), 2)], 8);
        assert_eq!(g.agreed(0, 0, 8), stamp(0, 8));
        g.handle_reply(0, at(1), (stamp(5, 8), bits(0)), 6, RTT, |_| true);
        g.handle_reply(1, at(1), (stamp(3, 8), bits(0)), 6, RTT, |_| true);
        assert_eq!(g.agreed(0, 6, 8), stamp(0, 8), "member 3 has nothing yet");
        g.handle_reply(2, at(2), (stamp(4, 2), bits(0)), 6, RTT, |_| true);
        // Smallest ack 3 (member 2); smallest limit 8 (member 3: its first window, as
        // 4 + 2 is below it and a credit limit never moves back).
        assert_eq!(g.agreed(0, 6, 8), stamp(3, 5));
        g.set_live(1, false);
        assert_eq!(g.agreed(0, 6, 8), stamp(4, 4));
        g.set_live(0, false);
        g.set_live(2, false);
        assert_eq!(g.agreed(0, 6, 8), stamp(6, 8), "nobody left to wait for");
    }

    #[test]
    fn stale_replies_never_move_a_member_back_and_lies_are_dropped() {
        let mut g = Members::new([(src(1), 0)], 8);
        g.handle_reply(0, at(1), (stamp(5, 8), bits(0)), 6, RTT, |_| true);
        g.handle_reply(0, at(2), (stamp(2, 1), bits(0)), 6, RTT, |_| true);
        assert_eq!(g.agreed(0, 6, 8), stamp(5, 8));
        g.handle_reply(0, at(3), (stamp(9, 8), bits(0)), 6, RTT, |_| true);
        assert_eq!(g.bad_replies(), 1);
        assert_eq!(g.agreed(0, 6, 8), stamp(5, 8));
    }

    /// A report of the first block of 32 frames after the acknowledgement.
    fn bits(bits: u32) -> Sack {
        Sack { offset: 0, bits }
    }

    #[test]
    fn a_hole_longer_than_a_block_is_repaired_whole() {
        let mut g = Members::new([(src(1), 0)], 128);
        // Expects 10, has 10 + 1 + 64 and 10 + 1 + 66 (block 2): 10 to 74 and 76 are
        // missing.
        let sack = Sack {
            offset: 64,
            bits: 0b101,
        };
        g.handle_reply(0, at(10), (stamp(10, 16), sack), 100, RTT, |_| true);
        let want: Vec<u32> = (10..=74).chain([76]).collect();
        assert_eq!(g.take_repairs(), want);
    }

    #[test]
    fn holes_are_repaired_once_per_round_trip_whoever_reports_them() {
        let mut g = Members::new([(src(1), 0), (src(2), 1)], 16);
        // Member 1 expects 3 and has 5 and 7: 3, 4 and 6 are missing.
        let sack = (1 << 1) | (1 << 3);
        g.handle_reply(0, at(10), (stamp(3, 16), bits(sack)), 8, RTT, |_| true);
        assert_eq!(g.take_repairs(), vec![3, 4, 6]);
        // Member 2 reports 4 missing within the round trip: already on its way.
        g.handle_reply(1, at(50), (stamp(4, 16), bits(1)), 8, RTT, |_| true);
        assert_eq!(g.take_repairs(), Vec::<u32>::new());
        // A round trip later, a report repairs it again; a frame no longer kept never.
        g.handle_reply(1, at(200), (stamp(4, 16), bits(1)), 8, RTT, |s| s != 6);
        assert_eq!(g.take_repairs(), vec![4]);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let base = u32::MAX - 2;
        let mut g = Members::new([(src(1), 0), (src(2), 1)], 8);
        g.members.iter_mut().for_each(|m| {
            m.ack = base;
            m.limit = base.wrapping_add(8);
        });
        g.handle_reply(
            0,
            at(1),
            (stamp(base.wrapping_add(5), 8), bits(0)),
            4,
            RTT,
            |_| true,
        );
        g.handle_reply(
            1,
            at(1),
            (stamp(base.wrapping_add(1), 8), bits(0)),
            4,
            RTT,
            |_| true,
        );
        assert_eq!(g.agreed(base, 4, 8), stamp(base.wrapping_add(1), 8));
    }
}
