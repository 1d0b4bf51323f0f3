//! Shared-memory transport between processes of one node.
//!
//! Each receiving endpoint owns a `segment`: one SPSC `ring` per sender, written
//! directly by that sender (one copy) and read in place by the receiver (zero copy).
//! A channel is FIFO because it is one ring. The fast path (push, pop, release) takes no
//! lock, allocates nothing and makes no system call; the `wake` protocol rings a
//! `doorbell` socket only when the receiver sleeps. `split` lets the two processes of a
//! large cross-memory transfer share the copy.
//!
//! Segments are private to the job's user (mode 0600), checked on attach (magic,
//! version, layout, job id, size), unlinked when the endpoint closes, and removed after a
//! crash by [`cleanup_stale`] or [`cleanup_job`], which remove the job's named objects
//! (`object`: shared buffers, split-copy boards) along with them.

#[cfg(not(loom))]
mod doorbell;
#[cfg(not(loom))]
pub(crate) mod object;
pub(crate) mod ring;
#[cfg(not(loom))]
mod segment;
pub(crate) mod split;
pub(crate) mod wake;

#[cfg(not(loom))]
pub use self::imp::*;
#[cfg(not(loom))]
pub(crate) use self::imp_crate::*;

#[cfg(not(loom))]
mod imp {
    pub use super::segment::{cleanup_dead_rank, cleanup_job, cleanup_stale, job_segments};
}

#[cfg(not(loom))]
mod imp_crate {
    use super::doorbell::{Bell, Doorbell};
    use super::ring::{self, Consumer, Producer, Record};
    pub(crate) use super::segment::{own_start_time, process_alive};
    use super::segment::{Geometry, Segment};
    use crate::addr::Source;
    use crate::error::{Error, Result};
    use std::os::fd::{AsRawFd, RawFd};
    use std::time::Duration;

    /// Ring bytes per sender for a given pool size: the next power of two (ring
    /// positions wrap with a mask; the segment is sparse, so unused bytes cost no memory).
    pub(crate) fn ring_capacity(pool_size: usize) -> usize {
        pool_size.max(64).next_power_of_two()
    }

    /// One sender's ring as seen by the receiver.
    struct RxChan {
        consumer: Consumer,
        source: Source,
        pid: u32,
        broken: bool,
        /// Its sender's process was found gone (reported once).
        dead: bool,
    }

    /// A message handed out by [`ShmRx::poll`].
    pub(crate) struct Received {
        pub chan: u32,
        pub token: u64,
        pub ptr: *const u8,
        pub len: usize,
        pub source: Source,
    }

    /// The receiving side of an endpoint on shared memory.
    pub(crate) struct ShmRx {
        chans: Vec<RxChan>,
        known_slots: u32,
        next_chan: usize,
        doorbell: Doorbell,
        max_message: usize,
        /// Rings found corrupt (counted once each).
        pub corrupt: u64,
        // Dropped last: the rings above point into it.
        seg: Segment,
    }

    impl ShmRx {
        pub(crate) fn create(
            job_id: u32,
            rank: u32,
            dpid: u16,
            slots: u32,
            pool_size: usize,
            max_message: usize,
        ) -> Result<ShmRx> {
            let geometry = Geometry {
                slots,
                ring_capacity: ring_capacity(pool_size),
            };
            let seg = Segment::create(job_id, rank, dpid, geometry, max_message)?;
            let doorbell = Doorbell::bind(job_id, rank, dpid)?;
            Ok(ShmRx {
                chans: Vec::new(),
                known_slots: 0,
                next_chan: 0,
                doorbell,
                max_message,
                corrupt: 0,
                seg,
            })
        }

        fn discover(&mut self) {
            let claimed = self.seg.claimed_slots();
            while self.known_slots < claimed {
                let Some((rank, dpid, pid, mem, tail)) = self.seg.ready_slot(self.known_slots)
                else {
                    return; // claimed but identity not yet written: next poll
                };
                self.chans.push(RxChan {
                    consumer: Consumer::new(mem, tail, self.max_message),
                    source: Source { rank, dpid },
                    pid,
                    broken: false,
                    dead: false,
                });
                self.known_slots += 1;
            }
        }

        /// The next message of any sender, round-robin across senders.
        #[inline(always)]
        pub(crate) fn poll(&mut self) -> Option<Received> {
            if self.seg.claimed_slots() > self.known_slots {
                self.discover();
            }
            let n = self.chans.len();
            let mut i = self.next_chan;
            for _ in 0..n {
                // Round-robin without a division: i stays in 0..n.
                if i >= n {
                    i = 0;
                }
                let chan = &mut self.chans[i];
                i += 1;
                if chan.broken {
                    continue;
                }
                match chan.consumer.try_pop() {
                    Ok(Some(Record { idx, len, token })) => {
                        self.next_chan = i;
                        return Some(Received {
                            chan: (i - 1) as u32,
                            token,
                            ptr: chan.consumer.mem().payload_ptr(idx),
                            len,
                            source: chan.source,
                        });
                    }
                    Ok(None) => {}
                    Err(c) => {
                        tracing::error!(
                            "shared-memory ring from rank {} DPID {} is corrupt (header {:#x} at {}); ignoring that sender",
                            chan.source.rank, chan.source.dpid, c.header, c.idx
                        );
                        chan.broken = true;
                        self.corrupt += 1;
                    }
                }
            }
            None
        }

        /// Senders whose process is gone, each reported once (with its pid). What they
        /// wrote before dying stays readable.
        pub(crate) fn dead_senders(&mut self) -> Vec<(Source, u32)> {
            let mut out = Vec::new();
            for c in self.chans.iter_mut().filter(|c| !c.dead) {
                if !super::segment::pid_alive(c.pid) {
                    c.dead = true;
                    out.push((c.source, c.pid));
                }
            }
            out
        }

        /// Whether any sender is being watched (so a sleeper should wake to check).
        pub(crate) fn has_senders(&self) -> bool {
            !self.chans.is_empty()
        }

        /// Whether any ring has a published record (no state change).
        pub(crate) fn has_data(&self) -> bool {
            self.chans
                .iter()
                .any(|c| !c.broken && c.consumer.has_data())
                || self.seg.claimed_slots() > self.known_slots
        }

        #[inline(always)]
        pub(crate) fn release(&mut self, chan: u32, token: u64) {
            if let Some(c) = self.chans.get_mut(chan as usize) {
                c.consumer.release(token);
            }
        }

        /// Tells the senders whose rings were read up to what was released
        /// ([`Consumer::publish_if_caught_up`]): at the end of a batch of reads.
        pub(crate) fn settle(&mut self) {
            for c in &mut self.chans {
                c.consumer.publish_if_caught_up();
            }
        }

        /// Arms the wake-up: senders ring the doorbell from now on.
        pub(crate) fn arm(&self) {
            self.seg.header().wake.arm();
        }
        pub(crate) fn disarm(&self) {
            self.seg.header().wake.disarm();
        }
        /// Drains the doorbell and re-enables ringing; re-check the rings afterwards.
        pub(crate) fn reset_doorbell(&self) {
            self.doorbell.drain();
            self.seg.header().wake.reset_after_drain();
        }
        pub(crate) fn doorbell_fd(&self) -> RawFd {
            self.doorbell.as_raw_fd()
        }
    }

    /// A sender's connection to one receiving endpoint.
    pub(crate) struct ShmTx {
        producer: Producer,
        bell: Bell,
        peer: Source,
        max_message: usize,
        // Dropped last: the producer points into it.
        seg: Segment,
    }

    impl ShmTx {
        pub(crate) fn connect(
            job_id: u32,
            peer: Source,
            me: Source,
            timeout: Duration,
        ) -> Result<ShmTx> {
            let seg = Segment::attach(job_id, peer.rank, peer.dpid, timeout)?;
            if seg.is_closed() {
                return Err(Error::PeerClosed {
                    rank: peer.rank,
                    dpid: peer.dpid,
                });
            }
            let (_, mem, tail) = seg.claim_slot(me.rank, me.dpid)?;
            let producer = Producer::new(mem, tail);
            let max_message = seg.max_message().min(producer.max_payload());
            let bell = Bell::new(job_id, peer.rank, peer.dpid)?;
            Ok(ShmTx {
                producer,
                bell,
                peer,
                max_message,
                seg,
            })
        }

        /// Largest message the receiver accepts.
        pub(crate) fn max_message(&self) -> usize {
            self.max_message
        }

        /// Whether the receiver has released everything pushed (as far as it published).
        pub(crate) fn drained(&self) -> bool {
            self.producer.drained()
        }

        /// Pushes one message made of `head` then `body` (`head` is usually empty);
        /// `Ok(false)` if the ring is full. Their lengths add up to at most
        /// max_message. A receiver that closed its endpoint is an error (the flag shares
        /// a read-mostly cache line with the segment's geometry, so the check is cheap).
        #[inline(always)]
        pub(crate) fn try_send_parts(&mut self, head: &[u8], body: &[u8]) -> Result<bool> {
            if self.seg.is_closed() {
                return Err(Error::PeerClosed {
                    rank: self.peer.rank,
                    dpid: self.peer.dpid,
                });
            }
            let pushed = if head.is_empty() {
                self.producer.try_push(body)
            } else {
                self.producer.try_push2(head, body)
            };
            if !pushed {
                return Ok(false);
            }
            if self.seg.header().wake.must_ring() {
                self.bell.ring();
            }
            Ok(true)
        }

        /// Wakes the receiver if it sleeps, as a send would, without sending anything
        /// (a protocol that wrote into the receiver's memory directly: a counter).
        pub(crate) fn wake(&self) {
            if self.seg.header().wake.must_ring() {
                self.bell.ring();
            }
        }

        /// Errors if the receiver closed its endpoint or its process is gone.
        pub(crate) fn check_peer(&self) -> Result<()> {
            if self.seg.is_closed() {
                return Err(Error::PeerClosed {
                    rank: self.peer.rank,
                    dpid: self.peer.dpid,
                });
            }
            if !self.seg.owner_alive() {
                return Err(Error::PeerFailed {
                    rank: self.peer.rank,
                    dpid: self.peer.dpid,
                    reason: format!("its process {} is gone", self.seg.owner_pid()),
                });
            }
            Ok(())
        }
    }

    #[allow(dead_code)]
    pub(crate) fn max_payload_for(pool_size: usize) -> usize {
        ring::max_payload(ring_capacity(pool_size))
    }
}
