//! A port's mailbox for the direct deposit (GAMMA's sender that writes into the
//! receiver's bound buffer), inside one node: a cache line per port in the receiver's
//! shared memory, through which a sender of the node finds the buffer the receiver
//! armed, claims it, and says that it wrote it.
//!
//! The state word holds `generation << 32 | claimant << 8 | tag`:
//!
//! ```text
//!  IDLE --arm (receiver)--> ARMED --claim (a sender, CAS)--> CLAIMED --deposited (the claimant)--> DEPOSITED
//!    ^                        |                                 |                                    |
//!    +------ disarm (CAS) ----+        revoke (the claimant failed, CAS)                             |
//!    +---------------------------------------------------------- finish (receiver) -----------------+
//!  CLOSED: the receiver's ports closed; no claim succeeds (closing waits out a claim).
//! ```
//!
//! Guarantees: at most one sender claims an armed buffer, and only a buffer of the
//! generation it read (each arming draws a new generation, so a sender that read an old
//! arming fails its claim); the receiver takes an armed buffer back only with a CAS, so
//! it never takes back one a sender claimed, until the claimant says it wrote it or is
//! known to have failed; the claimant publishes the length and the bytes before its
//! release store of `DEPOSITED`, which the receiver reads with acquire. Only the
//! receiver leaves `IDLE` and `DEPOSITED`, only a sender leaves `ARMED` for `CLAIMED`,
//! only the claimant leaves `CLAIMED` (or the receiver, once it failed).
//!
//! A peer can write any word of this memory: whoever reads a word checks it (a length
//! beyond the armed capacity, a claimant that is not the rank that notifies, a
//! generation that does not match are refused by the port table), and no value makes
//! this module panic.

use crate::sync::atomic::{AtomicU64, Ordering};

/// Words of one port's mailbox: a cache line, so that ports do not share one.
pub(super) const WORDS: usize = 8;
const STATE: usize = 0;
const BUFFER: usize = 1;
const CAPACITY: usize = 2;
const LENGTH: usize = 3;

/// The largest rank that can claim (24 bits of the state word); higher ranks copy.
pub(super) const MAX_CLAIMANT: u32 = (1 << 24) - 1;

/// The tag of the state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tag {
    Idle,
    Armed,
    Claimed,
    Deposited,
    Closed,
    /// A value no state has (a peer wrote the word).
    Invalid,
}

impl Tag {
    fn code(self) -> u64 {
        match self {
            Tag::Idle => 0,
            Tag::Armed => 1,
            Tag::Claimed => 2,
            Tag::Deposited => 3,
            Tag::Closed => 4,
            Tag::Invalid => 0xff,
        }
    }

    fn of(code: u64) -> Tag {
        match code {
            0 => Tag::Idle,
            1 => Tag::Armed,
            2 => Tag::Claimed,
            3 => Tag::Deposited,
            4 => Tag::Closed,
            _ => Tag::Invalid,
        }
    }
}

/// A decoded state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct State {
    pub generation: u32,
    /// The claimant's rank (`CLAIMED`, `DEPOSITED`); 0 otherwise.
    pub claimant: u32,
    pub tag: Tag,
}

impl State {
    fn word(self) -> u64 {
        u64::from(self.generation) << 32
            | u64::from(self.claimant & MAX_CLAIMANT) << 8
            | self.tag.code()
    }

    fn of(word: u64) -> State {
        State {
            generation: (word >> 32) as u32,
            claimant: (word >> 8) as u32 & MAX_CLAIMANT,
            tag: Tag::of(word & 0xff),
        }
    }
}

/// What a sender's successful claim holds: the buffer it may write, up to `capacity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Claim {
    pub generation: u32,
    pub buffer: u32,
    pub capacity: u64,
}

/// One port's mailbox.
#[derive(Clone, Copy)]
pub(super) struct Mailbox<'a> {
    words: &'a [AtomicU64; WORDS],
}

impl<'a> Mailbox<'a> {
    pub(super) fn new(words: &'a [AtomicU64; WORDS]) -> Mailbox<'a> {
        Mailbox { words }
    }

    /// The state, read with acquire (what the writer of the state published before it
    /// is visible).
    pub(super) fn state(&self) -> State {
        State::of(self.words[STATE].load(Ordering::Acquire))
    }

    /// The length the claimant deposited (read after [`Mailbox::state`] said
    /// `DEPOSITED`).
    pub(super) fn length(&self) -> u64 {
        self.words[LENGTH].load(Ordering::Relaxed)
    }

    /// Receiver: arms the port with `buffer` of `capacity` bytes under `generation`. The
    /// receiver calls it only in a state it owns (`IDLE`, after it took a deposit or
    /// disarmed); false, nothing changed, in any other.
    pub(super) fn arm(&self, generation: u32, buffer: u32, capacity: u64) -> bool {
        let now = self.words[STATE].load(Ordering::Acquire);
        if State::of(now).tag != Tag::Idle {
            return false;
        }
        self.words[BUFFER].store(u64::from(buffer), Ordering::Relaxed);
        self.words[CAPACITY].store(capacity, Ordering::Relaxed);
        let armed = State {
            generation,
            claimant: 0,
            tag: Tag::Armed,
        };
        // Release: the buffer and capacity are visible to a sender that reads ARMED. A
        // CAS, not a store: a peer may have written the word meanwhile.
        self.words[STATE]
            .compare_exchange(now, armed.word(), Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Receiver: takes the armed buffer back (`ARMED` -> `IDLE`, or to `CLOSED` with
    /// `close`). Returns the state it found: `Armed` when it took it back (or `Idle` /
    /// `Closed`: nothing armed), else `Claimed` or `Deposited`: a sender has it.
    pub(super) fn disarm(&self, close: bool) -> State {
        loop {
            let now = self.words[STATE].load(Ordering::Acquire);
            let s = State::of(now);
            let to = match (s.tag, close) {
                (Tag::Armed, _) | (Tag::Idle | Tag::Invalid, true) => State {
                    generation: s.generation,
                    claimant: 0,
                    tag: if close { Tag::Closed } else { Tag::Idle },
                },
                // A peer's garbage: the receiver owns the word again.
                (Tag::Invalid, false) => State {
                    generation: s.generation,
                    claimant: 0,
                    tag: Tag::Idle,
                },
                _ => return s,
            };
            if self.words[STATE]
                .compare_exchange(now, to.word(), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return s;
            }
        }
    }

    /// Receiver: the deposit `s` (as [`Mailbox::state`] read it) was delivered; the port
    /// is `IDLE` again. False when the word changed meanwhile (a peer wrote it).
    pub(super) fn finish(&self, s: State) -> bool {
        let idle = State {
            generation: s.generation,
            claimant: 0,
            tag: Tag::Idle,
        };
        self.words[STATE]
            .compare_exchange(s.word(), idle.word(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Receiver: the claimant of `s` failed before it said it wrote: the buffer is taken
    /// back (`CLAIMED` -> `IDLE`). False when the claimant finished meanwhile.
    pub(super) fn revoke(&self, s: State) -> bool {
        self.finish(s)
    }

    /// Sender `me`: claims the armed buffer for `len` bytes. `None` when the port is not
    /// armed, the buffer is too small, or another sender (or a new arming) came first.
    pub(super) fn claim(&self, me: u32, len: u64) -> Option<Claim> {
        if me > MAX_CLAIMANT {
            return None;
        }
        let now = self.words[STATE].load(Ordering::Acquire);
        let s = State::of(now);
        if s.tag != Tag::Armed {
            return None;
        }
        let buffer = u32::try_from(self.words[BUFFER].load(Ordering::Relaxed)).ok()?;
        let capacity = self.words[CAPACITY].load(Ordering::Relaxed);
        if len > capacity {
            return None;
        }
        let claimed = State {
            generation: s.generation,
            claimant: me,
            tag: Tag::Claimed,
        };
        // The generation in the CAS: a buffer and capacity read from another arming than
        // the one claimed cannot be used (every arming draws a new generation).
        self.words[STATE]
            .compare_exchange(now, claimed.word(), Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        Some(Claim {
            generation: s.generation,
            buffer,
            capacity,
        })
    }

    /// Sender `me`: gives the claim back unused (it could not write the buffer); the port
    /// is armed again as it was. False when the receiver revoked it meanwhile.
    pub(super) fn abandon(&self, me: u32, claim: Claim) -> bool {
        let claimed = State {
            generation: claim.generation,
            claimant: me,
            tag: Tag::Claimed,
        };
        let armed = State {
            generation: claim.generation,
            claimant: 0,
            tag: Tag::Armed,
        };
        self.words[STATE]
            .compare_exchange(
                claimed.word(),
                armed.word(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Sender `me`: it wrote `len` bytes into the buffer of `claim`; the receiver may read
    /// them. False when the receiver revoked the claim (it thought this sender failed).
    pub(super) fn deposited(&self, me: u32, claim: Claim, len: u64) -> bool {
        self.words[LENGTH].store(len, Ordering::Relaxed);
        let claimed = State {
            generation: claim.generation,
            claimant: me,
            tag: Tag::Claimed,
        };
        let done = State {
            tag: Tag::Deposited,
            ..claimed
        };
        // Release: the bytes and the length are visible to the receiver that reads
        // DEPOSITED.
        self.words[STATE]
            .compare_exchange(
                claimed.word(),
                done.word(),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn words() -> [AtomicU64; WORDS] {
        std::array::from_fn(|_| AtomicU64::new(0))
    }

    #[test]
    fn a_deposit_goes_round_the_states() {
        let w = words();
        let m = Mailbox::new(&w);
        assert_eq!(m.claim(3, 8), None, "not armed");
        assert!(m.arm(1, 77, 64));
        assert_eq!(m.claim(3, 65), None, "too long");
        let c = m.claim(3, 64).expect("armed");
        assert_eq!((c.generation, c.buffer, c.capacity), (1, 77, 64));
        assert_eq!(m.claim(4, 8), None, "claimed already");
        assert!(m.abandon(3, c), "given back");
        assert_eq!(m.state().tag, Tag::Armed);
        let c = m.claim(3, 64).expect("armed again");
        assert_eq!(m.disarm(false).tag, Tag::Claimed, "not taken back");
        assert!(m.deposited(3, c, 10));
        let s = m.state();
        assert_eq!((s.tag, s.claimant, s.generation), (Tag::Deposited, 3, 1));
        assert_eq!(m.length(), 10);
        assert!(!m.arm(2, 77, 64), "the receiver takes the deposit first");
        assert!(m.finish(s));
        assert!(m.arm(2, 78, 64));
        assert_eq!(m.disarm(false).tag, Tag::Armed, "taken back");
        assert_eq!(m.claim(3, 8), None);
    }

    #[test]
    fn an_old_arming_cannot_be_claimed_and_a_revoked_claim_is_not_deposited() {
        let w = words();
        let m = Mailbox::new(&w);
        assert!(m.arm(1, 5, 16));
        let c = m.claim(2, 16).unwrap();
        let s = m.state();
        assert!(m.revoke(s), "the claimant failed");
        assert!(!m.deposited(2, c, 16), "too late");
        assert!(m.arm(2, 6, 16));
        // A claim with the first arming's generation fails.
        assert!(!m.deposited(2, c, 16));
        assert_eq!(m.state().tag, Tag::Armed);
        assert_eq!(m.disarm(true).tag, Tag::Armed);
        assert_eq!(m.state().tag, Tag::Closed);
        assert_eq!(m.claim(2, 1), None, "closed");
    }

    #[test]
    fn garbage_in_the_words_is_refused_not_followed() {
        let w = words();
        let m = Mailbox::new(&w);
        for word in [u64::MAX, 0xff, 0x1234_5678_9abc_def0, 1 << 40 | 1] {
            w[STATE].store(word, Ordering::Relaxed);
            w[BUFFER].store(u64::MAX, Ordering::Relaxed);
            w[CAPACITY].store(u64::MAX, Ordering::Relaxed);
            // An armed-looking word with a buffer number out of range: no claim.
            assert_eq!(m.claim(1, 8), None, "{word:#x}");
            m.disarm(false);
            assert!(matches!(
                m.state().tag,
                Tag::Idle | Tag::Claimed | Tag::Deposited
            ));
        }
        assert_eq!(
            m.claim(MAX_CLAIMANT + 1, 0),
            None,
            "a rank beyond 24 bits copies"
        );
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// One receiver taking the buffer back and re-arming it (a new generation) while two
    /// senders claim: no two claims of one arming, no claim of an arming the receiver
    /// took back, every claim's deposit completes, and the receiver sees each deposit's
    /// length whole when it reads DEPOSITED.
    #[test]
    fn loom_claims_race_rearming() {
        // Three threads: every interleaving with up to three preemptions (the whole
        // space took over four minutes; bugs of this size show within the bound).
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(|| {
            let w: Arc<[AtomicU64; WORDS]> = Arc::new(std::array::from_fn(|_| AtomicU64::new(0)));
            assert!(Mailbox::new(&w).arm(1, 10, 64));
            let senders: Vec<_> = (1..=2u32)
                .map(|me| {
                    let w = w.clone();
                    loom::thread::spawn(move || {
                        let m = Mailbox::new(&w);
                        let c = m.claim(me, 8)?;
                        assert!(m.deposited(me, c, u64::from(me) * 8));
                        Some((me, c))
                    })
                })
                .collect();
            let m = Mailbox::new(&w);
            // Take the first arming back if nobody claimed it, and arm a second one.
            let first = m.disarm(false);
            let rearmed = first.tag == Tag::Armed && m.arm(2, 11, 64);
            let claims: Vec<_> = senders
                .into_iter()
                .filter_map(|s| s.join().unwrap())
                .collect();
            for g in [1, 2] {
                assert!(
                    claims.iter().filter(|(_, c)| c.generation == g).count() <= 1,
                    "two claims of arming {g}: {claims:?}"
                );
            }
            if first.tag == Tag::Armed {
                assert!(
                    claims.iter().all(|(_, c)| c.generation != 1),
                    "arming 1 was taken back, yet claimed: {claims:?}"
                );
                assert!(rearmed);
            } else {
                assert!(claims.iter().any(|(_, c)| c.generation == 1));
            }
            let s = m.state();
            match claims.iter().find(|(_, c)| c.generation == s.generation) {
                Some(&(me, _)) => {
                    assert_eq!((s.tag, s.claimant), (Tag::Deposited, me));
                    assert_eq!(m.length(), u64::from(me) * 8);
                }
                None => assert_eq!(s.tag, Tag::Armed, "unclaimed"),
            }
        });
    }
}
