//! The endpoint: receive side (shared-memory rings, UDP slot pool, ready queue), send
//! side (one connection per destination endpoint) and waiting.

use super::message::{Message, Token};
use super::{EndpointStats, Source};
use crate::channel::{Delivery, RxChannel};
use crate::engine::{backoff_until, Poller, Waitable, Waiter};
use crate::job::JobShared;
use crate::link::shm::{ShmRx, ShmTx};
use crate::link::udp::{Datagram, SlotPool, SockAddr, UdpLink};
use crate::wire::{self, Flags, FrameKind, Header, HEADER_LEN};
use crate::{Error, Result, Transport, TransportChoice};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often (in polls) a shared-memory reader also polls its UDP socket.
const UDP_POLL_EVERY: u32 = 16;

/// A Directed Point endpoint. See the [module documentation](crate::dm).
pub struct Endpoint {
    job: Arc<JobShared>,
    dpid: u16,
    inner: RefCell<Inner>,
    poller: Poller,
    waiter: Waiter,
    fd_exported: Cell<bool>,
}

// SAFETY: the endpoint owns its mappings, sockets and pool; the raw pointers inside
// (rings, pool slots) refer to memory that moves with it. It is not Sync: one thread at a
// time uses it, which is all that moving it to another thread allows.
unsafe impl Send for Endpoint {}

struct UdpSide {
    link: UdpLink,
    pool: SlotPool,
    channels: HashMap<Source, RxChannel>,
    scratch: Vec<Datagram>,
}

enum Conn {
    Shm(ShmTx),
    Udp {
        dest: SockAddr,
        template: Header,
        seq: u32,
    },
}

enum Ready {
    Slot {
        slot: u32,
        len: usize,
        source: Source,
    },
    Owned {
        data: Vec<u8>,
        source: Source,
    },
}

struct Inner {
    shm: Option<ShmRx>,
    udp: Option<UdpSide>,
    ready: VecDeque<Ready>,
    conns: Vec<(Source, Conn)>,
    conn_index: HashMap<Source, usize>,
    target: Option<usize>,
    held: VecDeque<Token>,
    errors: VecDeque<Error>,
    stats: EndpointStats,
    polls: u32,
}

impl Endpoint {
    pub(crate) fn open(job: Arc<JobShared>, dpid: u16) -> Result<Endpoint> {
        let cfg = &job.config;
        let me = job.rank;
        let shm = match cfg.transport {
            TransportChoice::Auto => Some(ShmRx::create(
                job.job_id,
                me,
                dpid,
                cfg.shm_slots,
                cfg.pool_size,
                cfg.max_message,
            )?),
            TransportChoice::Udp => None,
        };
        let needs_udp = cfg.transport == TransportChoice::Udp || job.node_count() > 1;
        let udp = if needs_udp {
            let link = UdpLink::bind(job.addrs[me as usize], cfg.udp_datagram)?;
            job.kv
                .put(&format!("udp/{me}/{dpid}"), &link.local_addr().to_string())?;
            Some(UdpSide {
                link,
                pool: SlotPool::new(cfg.pool_size, cfg.udp_datagram),
                channels: HashMap::new(),
                scratch: Vec::with_capacity(crate::link::udp::RECV_BATCH),
            })
        } else {
            None
        };
        let poller = Poller::new()?;
        if let Some(s) = &shm {
            poller.add(s.doorbell_fd())?;
        }
        if let Some(u) = &udp {
            poller.add(u.link.as_raw_fd())?;
        }
        // Make (NID, DPID) resolvable; the first rank of a node to open a DPID owns the name.
        let nid = job.nids[me as usize];
        job.kv
            .put_if_absent(&format!("dp/{nid}/{dpid}"), &me.to_string())?;
        Ok(Endpoint {
            waiter: Waiter { mode: cfg.wait },
            job,
            dpid,
            inner: RefCell::new(Inner {
                shm,
                udp,
                ready: VecDeque::new(),
                conns: Vec::new(),
                conn_index: HashMap::new(),
                target: None,
                held: VecDeque::new(),
                errors: VecDeque::new(),
                stats: EndpointStats::default(),
                polls: 0,
            }),
            poller,
            fd_exported: Cell::new(false),
        })
    }

    /// This endpoint's DPID.
    pub fn dpid(&self) -> u16 {
        self.dpid
    }

    /// This endpoint's rank.
    pub fn rank(&self) -> u32 {
        self.job.rank
    }

    /// Sets the destination of [`Endpoint::write`] to endpoint `dpid` of node `nid` (the
    /// endpoint of the first rank on that node that opened `dpid`), connecting if needed.
    pub fn target(&self, nid: u32, dpid: u16) -> Result<()> {
        let timeout = self.job.config.connect_timeout;
        let rank = match self.job.kv.get(&format!("dp/{nid}/{dpid}"), timeout) {
            Ok(v) => v.parse::<u32>().map_err(|_| Error::Rendezvous {
                url: self.job.kv.url().to_string(),
                reason: format!("bad owner {v:?} for node {nid} DPID {dpid}"),
            })?,
            Err(Error::Timeout(_)) => {
                return Err(Error::NoSuchEndpoint {
                    nid,
                    dpid,
                    waited: timeout,
                })
            }
            Err(e) => return Err(e),
        };
        self.target_endpoint(rank, dpid)
    }

    /// Sets the destination to the endpoint with this endpoint's DPID on `rank`.
    pub fn target_rank(&self, rank: u32) -> Result<()> {
        self.target_endpoint(rank, self.dpid)
    }

    /// Sets the destination to endpoint `dpid` on `rank`, connecting if needed (waiting
    /// up to `QUIVER_CONNECT_TIMEOUT` for the peer to open it).
    pub fn target_endpoint(&self, rank: u32, dpid: u16) -> Result<()> {
        let peer = Source { rank, dpid };
        let idx = self.connect(peer)?;
        self.inner.borrow_mut().target = Some(idx);
        Ok(())
    }

    /// The transport used towards `rank`.
    pub fn transport_to(&self, rank: u32) -> Result<Transport> {
        if rank >= self.job.size {
            return Err(Error::NoSuchRank {
                rank,
                size: self.job.size,
            });
        }
        Ok(
            if self.job.config.transport == TransportChoice::Udp
                || self.job.nids[rank as usize] != self.job.nids[self.job.rank as usize]
            {
                Transport::Udp
            } else {
                Transport::Shm
            },
        )
    }

    fn connect(&self, peer: Source) -> Result<usize> {
        if let Some(&i) = self.inner.borrow().conn_index.get(&peer) {
            return Ok(i);
        }
        let me = Source {
            rank: self.job.rank,
            dpid: self.dpid,
        };
        let timeout = self.job.config.connect_timeout;
        let conn = match self.transport_to(peer.rank)? {
            Transport::Shm => Conn::Shm(ShmTx::connect(self.job.job_id, peer, me, timeout)?),
            Transport::Udp => {
                let key = format!("udp/{}/{}", peer.rank, peer.dpid);
                let addr = match self.job.kv.get(&key, timeout) {
                    Ok(a) => a,
                    Err(Error::Timeout(_)) => {
                        return Err(Error::PeerNotFound {
                            rank: peer.rank,
                            dpid: peer.dpid,
                            waited: timeout,
                        })
                    }
                    Err(e) => return Err(e),
                };
                let dest: SocketAddr = addr.parse().map_err(|_| Error::Rendezvous {
                    url: self.job.kv.url().to_string(),
                    reason: format!("bad UDP address {addr:?} for {key}"),
                })?;
                Conn::Udp {
                    dest: SockAddr::from(&dest),
                    template: Header {
                        kind: FrameKind::Data,
                        flags: Flags::EMPTY,
                        src_dpid: self.dpid,
                        dst_dpid: peer.dpid,
                        credits: 0,
                        src_rank: self.job.rank,
                        job_id: self.job.job_id,
                        token: self.job.token as u32,
                        seq: 0,
                        ack: 0,
                        checksum: 0,
                    },
                    seq: 0,
                }
            }
        };
        let mut inner = self.inner.borrow_mut();
        let i = inner.conns.len();
        inner.conns.push((peer, conn));
        inner.conn_index.insert(peer, i);
        Ok(i)
    }

    /// Sends one message to the target. Returns when `data` may be reused; waits (per
    /// `QUIVER_WAIT`) while the receiver's pool is full.
    pub fn write(&self, data: &[u8]) -> Result<()> {
        let max = self.job.config.max_message;
        if data.len() > max {
            return Err(Error::MessageTooLarge {
                len: data.len(),
                max,
            });
        }
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        let Some(idx) = inner.target else {
            return Err(Error::NoTarget);
        };
        let (_, conn) = &mut inner.conns[idx];
        match conn {
            Conn::Shm(tx) => {
                if data.len() > tx.max_message() {
                    return Err(Error::MessageTooLarge {
                        len: data.len(),
                        max: tx.max_message(),
                    });
                }
                if !tx.try_send(data)? {
                    inner.stats.send_stalls += 1;
                    let mut last_check = Instant::now();
                    backoff_until(self.waiter.mode, None, || {
                        if tx.try_send(data)? {
                            return Ok(Some(()));
                        }
                        if last_check.elapsed() > Duration::from_millis(10) {
                            last_check = Instant::now();
                            tx.check_peer()?;
                        }
                        Ok(None)
                    })?;
                }
            }
            Conn::Udp {
                dest,
                template,
                seq,
            } => {
                let udp = inner
                    .udp
                    .as_mut()
                    .expect("a UDP connection implies a UDP socket");
                let frames = udp.link.send_message(dest, template, seq, data)?;
                inner.stats.frames_sent += frames as u64;
            }
        }
        inner.stats.msgs_sent += 1;
        inner.stats.bytes_sent += data.len() as u64;
        Ok(())
    }

    /// The next message, if one is waiting. Never blocks.
    #[inline]
    pub fn try_read(&self) -> Result<Option<Message<'_>>> {
        if let Some(m) = self.poll_once()? {
            return Ok(Some(m));
        }
        if self.fd_exported.get() {
            // The descriptor was handed out: re-enable the doorbell for the next message,
            // then look once more (a sender may have published before the reset).
            if let Some(shm) = &self.inner.borrow().shm {
                shm.reset_doorbell();
            }
            return self.poll_once();
        }
        Ok(None)
    }

    /// The next message, waiting for it per the wait mode (`QUIVER_WAIT`).
    #[inline]
    pub fn read(&self) -> Result<Message<'_>> {
        if let Some(m) = self.poll_once()? {
            return Ok(m);
        }
        self.waiter.wait(&ReadWait(self), None)
    }

    /// The next message, waiting at most `timeout` ([`Error::Timeout`] then).
    pub fn read_timeout(&self, timeout: Duration) -> Result<Message<'_>> {
        self.waiter.wait(&ReadWait(self), Some(timeout))
    }

    /// Releases the `n` oldest tokens kept with [`Message::hold`]; returns how many were
    /// released (fewer if fewer are held).
    pub fn release(&self, n: usize) -> usize {
        let mut released = 0;
        while released < n {
            let Some(t) = self.inner.borrow_mut().held.pop_front() else {
                break;
            };
            self.release_token(t);
            released += 1;
        }
        released
    }

    /// Number of tokens kept with [`Message::hold`] and not yet released.
    pub fn held(&self) -> usize {
        self.inner.borrow().held.len()
    }

    /// The endpoint's counters.
    pub fn stats(&self) -> EndpointStats {
        self.inner.borrow().stats.clone()
    }

    /// Closes the endpoint: its receive area is removed and later writes to it fail.
    pub fn close(self) {}

    pub(crate) fn hold_token(&self, t: Token) {
        self.inner.borrow_mut().held.push_back(t);
    }

    #[inline]
    pub(crate) fn release_token(&self, t: Token) {
        let mut inner = self.inner.borrow_mut();
        match t {
            Token::Shm { chan, token } => {
                if let Some(shm) = inner.shm.as_mut() {
                    shm.release(chan, token);
                }
            }
            Token::Udp { slot } => {
                if let Some(udp) = inner.udp.as_mut() {
                    udp.pool.free_slot(slot);
                }
            }
            Token::Owned(_) => {}
        }
    }

    fn poll_once(&self) -> Result<Option<Message<'_>>> {
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        // Checked before popping: building and dropping an empty Option<Error> costs more
        // than the check on this path.
        if !inner.errors.is_empty() {
            if let Some(e) = inner.errors.pop_front() {
                return Err(e);
            }
        }
        if let Some(shm) = inner.shm.as_mut() {
            if let Some(r) = shm.poll() {
                inner.stats.msgs_received += 1;
                inner.stats.bytes_received += r.len as u64;
                return Ok(Some(Message {
                    ep: self,
                    ptr: r.ptr,
                    len: r.len,
                    source: r.source,
                    token: Some(Token::Shm {
                        chan: r.chan,
                        token: r.token,
                    }),
                }));
            }
            inner.stats.corrupt_rings = shm.corrupt;
        }
        if inner.ready.is_empty() {
            let Some(udp) = inner.udp.as_mut() else {
                return Ok(None);
            };
            inner.polls = inner.polls.wrapping_add(1);
            if inner.shm.is_some() && !inner.polls.is_multiple_of(UDP_POLL_EVERY) {
                return Ok(None);
            }
            self.ingest(udp, &mut inner.ready, &mut inner.stats, &mut inner.errors)?;
            if let Some(e) = inner.errors.pop_front() {
                return Err(e);
            }
        }
        let Some(r) = inner.ready.pop_front() else {
            return Ok(None);
        };
        inner.stats.msgs_received += 1;
        Ok(Some(match r {
            Ready::Slot { slot, len, source } => {
                inner.stats.bytes_received += len as u64;
                let udp = inner.udp.as_ref().expect("slot messages come from UDP");
                let ptr = udp.pool.slot(slot)[HEADER_LEN..].as_ptr();
                Message {
                    ep: self,
                    ptr,
                    len,
                    source,
                    token: Some(Token::Udp { slot }),
                }
            }
            Ready::Owned { data, source } => {
                inner.stats.bytes_received += data.len() as u64;
                Message {
                    ep: self,
                    ptr: data.as_ptr(),
                    len: data.len(),
                    source,
                    token: Some(Token::Owned(data)),
                }
            }
        }))
    }

    /// Receives a batch of datagrams and turns them into ready messages.
    fn ingest(
        &self,
        udp: &mut UdpSide,
        ready: &mut VecDeque<Ready>,
        stats: &mut EndpointStats,
        errors: &mut VecDeque<Error>,
    ) -> Result<()> {
        let mut batch = std::mem::take(&mut udp.scratch);
        batch.clear();
        let r = udp.link.recv_batch(&mut udp.pool, &mut batch);
        let job = &self.job;
        for d in &batch {
            stats.frames_received += 1;
            let keep = {
                let bytes = &udp.pool.slot(d.slot)[..d.len];
                match wire::decode(bytes) {
                    Err(_) => {
                        stats.dropped_malformed += 1;
                        false
                    }
                    Ok(frame) => {
                        let h = frame.header;
                        if h.job_id != job.job_id {
                            stats.dropped_foreign_job += 1;
                            false
                        } else if h.token != job.token as u32 {
                            stats.dropped_bad_token += 1;
                            false
                        } else if h.dst_dpid != self.dpid || h.src_rank >= job.size {
                            stats.dropped_misaddressed += 1;
                            false
                        } else if h.kind != FrameKind::Data {
                            false // control frames: used by the reliability layer
                        } else {
                            let source = Source {
                                rank: h.src_rank,
                                dpid: h.src_dpid,
                            };
                            let ch = udp.channels.entry(source).or_default();
                            let out = ch.on_data(
                                h.seq,
                                h.flags,
                                frame.total_len(),
                                frame.data(),
                                job.config.max_message,
                            );
                            if out.lost > 0 {
                                stats.lost_frames += out.lost as u64;
                                errors.push_back(Error::Lost {
                                    rank: source.rank,
                                    dpid: source.dpid,
                                    frames: out.lost,
                                });
                            }
                            stats.duplicates += out.duplicate as u64;
                            stats.dropped_oversized += out.oversized as u64;
                            stats.dropped_malformed += out.malformed as u64;
                            match out.delivery {
                                Delivery::None => false,
                                Delivery::InPlace => {
                                    ready.push_back(Ready::Slot {
                                        slot: d.slot,
                                        len: frame.data().len(),
                                        source,
                                    });
                                    true
                                }
                                Delivery::Assembled(data) => {
                                    ready.push_back(Ready::Owned { data, source });
                                    false
                                }
                            }
                        }
                    }
                }
            };
            if !keep {
                udp.pool.free_slot(d.slot);
            }
        }
        udp.scratch = batch;
        r
    }
}

impl AsRawFd for Endpoint {
    /// The endpoint's descriptor: readable when messages have arrived. After it signals,
    /// call [`Endpoint::try_read`] until it returns `None`. Handing the descriptor out
    /// makes senders on shared memory ring the doorbell for every batch of messages.
    fn as_raw_fd(&self) -> RawFd {
        if !self.fd_exported.replace(true) {
            if let Some(shm) = &self.inner.borrow().shm {
                shm.arm();
                shm.reset_doorbell();
            }
        }
        self.poller.as_raw_fd()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.job.close_dpid(self.dpid);
    }
}

/// Adapter between the endpoint and the wait policy.
struct ReadWait<'a>(&'a Endpoint);

impl<'a> Waitable for ReadWait<'a> {
    type Output = Message<'a>;

    fn poll_once(&self) -> Result<Option<Message<'a>>> {
        self.0.poll_once()
    }

    fn arm(&self) {
        if let Some(shm) = &self.0.inner.borrow().shm {
            shm.arm();
            shm.reset_doorbell();
        }
        // Sleeping is about to happen: poll the UDP socket on the next attempt.
        let mut inner = self.0.inner.borrow_mut();
        inner.polls = UDP_POLL_EVERY - 1;
    }

    fn disarm(&self) {
        if !self.0.fd_exported.get() {
            if let Some(shm) = &self.0.inner.borrow().shm {
                shm.disarm();
            }
        }
    }

    fn sleep(&self, timeout: Option<Duration>) -> Result<()> {
        let has_ready = {
            let inner = self.0.inner.borrow();
            !inner.ready.is_empty()
                || !inner.errors.is_empty()
                || inner.shm.as_ref().is_some_and(|s| s.has_data())
        };
        if has_ready {
            return Ok(());
        }
        self.0.poller.wait(timeout)
    }
}
