//! The application's side of the ports: binding destinations (the route and header
//! computed once), sending through a port, progress (the table's [`Handler`] on the
//! station's hook) and waiting on a port's semaphore. It reaches the engine through a
//! [`Footing`]: the ports' endpoint in production, a bare station in the simulator.

use super::deposit::{MailboxArea, PeerDeposits};
use super::mailbox::MAX_CLAIMANT;
use super::table::{Bound, Handler, OnCell, RingReader, Table, TableCell};
use super::wire::Header;
use super::wire::{Deposited, Indirect, Piece, Release, FLUSH_RELEASES, PIECE_LEN};
use super::{PortError, DEPOSIT_MIN, RESERVED_PORT};

/// Pieces of a message from another node handed to the link together.
const PIECE_BATCH: usize = 64;
use crate::addr::Source;
use crate::config::WaitMode;
use crate::engine::protocol::Outbox;

use crate::engine::station::{drive_rearming, Footing};
use crate::error::{Error, Result};
use crate::rma::window::{Published, Windows, PUBLISHED_IDS};
use std::cell::OnceCell;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// The outbox's bound: none. It holds what handlers answer and the broadcasts this rank
/// forwards, each the consequence of one message delivered; the engine hands a protocol
/// no message while its outbox is full, so a bound could stop two processes from
/// reading while each waits for room in the other's ring, both outboxes full of answers
/// to the other (as tagged's outbox, `tagged::pushpull`). A slow destination makes this
/// rank's outbox grow instead.
const OUTBOX_ITEMS: usize = usize::MAX;

/// A broadcast at least this long goes to this node's ranks through the broadcast ring
/// (one copy written for all of them) rather than one copy into each one's ring.
pub(super) const RING_MIN: usize = 4 << 10;
/// Bytes of a rank's broadcast ring: a broadcast longer than a quarter of it goes as
/// copies (`table::RELEASE_BYTES` says why).
pub(super) const RING_BYTES: usize = 8 << 20;

/// The port table and the outbox of one process's ports.
pub(super) struct App {
    pub table: TableCell,
    pub out: RefCell<Outbox>,
    /// This rank's broadcast ring, once a broadcast used it: a shared buffer its node's
    /// ranks read (the table keeps which places they hold).
    ring: RefCell<Option<Published>>,
    /// The broadcast rings of this node's ranks, mapped here to be read.
    peer_rings: OnceCell<PeerRings>,
    /// The mailboxes and port buffers of this node's ranks, mapped here to be written.
    peer_deposits: OnceCell<PeerDeposits>,
    /// Ranks a message in pieces was left half sent to (a send that failed half-way):
    /// the next message to each goes in pieces too, whose start ends the half one at
    /// the receiver (which would otherwise hold that rank's later messages back).
    half_sent: RefCell<Vec<u32>>,
}

/// Where [`App::place_in_ring`] put a broadcast.
enum Placed {
    /// In the ring, there.
    At(Indirect),
    /// The ring does not apply (no same-node rank, or no ring): copies.
    NotHere,
    /// No room now (only when not waiting).
    Full,
}

/// The broadcast rings of this node's ranks, mapped on first use.
struct PeerRings(Windows);

impl Drop for App {
    fn drop(&mut self) {
        // Places the node's ranks still hold may not have been read yet: the ring keeps
        // its name until the job's clean-up (readers map it by name), else it goes now.
        if let Some(ring) = self.ring.get_mut().take() {
            if self.table.lock().ring.taken() > 0 {
                ring.keep_name();
            }
        }
    }
}

impl RingReader for PeerRings {
    fn read(&self, rank: u32, id: u32, offset: u64, dst: &mut [u8]) -> bool {
        id >= PUBLISHED_IDS && matches!(self.0.read(rank, id, offset, dst), Ok(true))
    }
}

impl App {
    /// The ports of rank `rank` of a job of `size` ranks, on DPID `dpid`, whose table
    /// only its own thread uses; with `mailboxes`, this node's senders find there the
    /// port buffers armed for their messages.
    pub(super) fn new(rank: u32, size: u32, dpid: u16, mailboxes: Option<MailboxArea>) -> App {
        let mut table = Table::new(rank, size, dpid);
        table.mailboxes = mailboxes;
        App::with(TableCell::Local(RefCell::new(table)))
    }

    /// The ports of a process whose table is `table`.
    pub(super) fn with(table: TableCell) -> App {
        App {
            table,
            out: RefCell::new(Outbox::new(OUTBOX_ITEMS)),
            ring: RefCell::new(None),
            peer_rings: OnceCell::new(),
            peer_deposits: OnceCell::new(),
            half_sent: RefCell::new(Vec::new()),
        }
    }

    /// Binds `port` to send to port `dest_port` of `rank` (connecting to it first).
    pub(super) fn bind_dest(
        &self,
        on: &impl Footing,
        port: u8,
        rank: u32,
        dest_port: u8,
    ) -> Result<()> {
        check_dest_port(dest_port)?;
        let station = on.station();
        let to = Source {
            rank,
            dpid: station.dpid(),
        };
        let route = station.connect(to).map_err(|e| on.report(e))?;
        let deposit = station.job().config.ports_deposit
            && station.job().rank <= MAX_CLAIMANT
            && station.transport_to(rank)? == crate::Transport::Shm
            && self.deposits(on).reaches(rank);
        let head = Header {
            dest_port,
            src_port: port,
            root: None,
            native: false,
            indirect: false,
        }
        .encode();
        let frame = station.frame_payload(route).filter(|&f| f > PIECE_LEN);
        self.table.lock().slots[usize::from(port)].dest = Some(Bound::One {
            to,
            head,
            route,
            deposit,
            frame,
        });
        Ok(())
    }

    /// Binds `port` to send to port `dest_port` of every other rank, natively where the
    /// link has a broadcast or every rank is on this node (one message to the engine's
    /// group channel for the other nodes; to this node's ranks one copy in this rank's
    /// broadcast ring when large, else one message each; unicasts to any rank whose
    /// link joined no group), else down the binomial tree rooted at this rank;
    /// connecting to every target first.
    pub(super) fn bind_all(&self, on: &impl Footing, port: u8, dest_port: u8) -> Result<()> {
        check_dest_port(dest_port)?;
        let (me, size) = {
            let t = self.table.lock();
            (t.rank, t.size)
        };
        let station = on.station();
        let wanted = station.job().config.native_broadcast;
        let group = wanted && station.connect_group().map_err(|e| on.report(e))?.is_some();
        let mut all_local = true;
        for rank in (0..size).filter(|&r| r != me) {
            all_local &= station.transport_to(rank)? == crate::Transport::Shm;
        }
        let native = wanted && (group || all_local);
        let unicast = match (native, group) {
            (false, _) => None,
            (true, true) => Some(station.group_unreached().map_err(|e| on.report(e))?),
            (true, false) => Some((0..size).filter(|&r| r != me).collect()),
        };
        let mut local = Vec::new();
        for &rank in unicast.iter().flatten() {
            if station.transport_to(rank)? == crate::Transport::Shm {
                local.push(rank);
            }
        }
        let targets = {
            let mut t = self.table.lock();
            t.native_unicast = unicast;
            t.native_local = local;
            t.native_group = group;
            t.broadcast_targets()
        };
        for to in targets {
            station.route_to(to).map_err(|e| on.report(e))?;
        }
        let head = Header {
            dest_port,
            src_port: port,
            root: Some(me),
            native,
            indirect: false,
        }
        .encode();
        self.table.lock().slots[usize::from(port)].dest = Some(Bound::All { head });
        Ok(())
    }

    /// Sends `data` through `port`; with `block`, waits for room (making progress
    /// meanwhile, so two processes that both send never wait for each other), else
    /// returns `Ok(false)` when the route has none now. The buffer is reusable when this
    /// returns. A failure to reach the destination goes to the port's error handler too.
    /// Through a broadcast port the message goes to this rank's children in its tree
    /// (they forward it); without `block`, `Ok(false)` means no child took it, and once
    /// one has, the others are waited for.
    pub(super) fn send(
        &self,
        on: &impl Footing,
        port: u8,
        data: &[u8],
        block: bool,
    ) -> Result<bool> {
        let bound = self.table.lock().slots[usize::from(port)].dest;
        match bound {
            None => Err(Error::Port(PortError::NoDestination { port })),
            Some(Bound::One {
                to,
                head,
                route,
                deposit,
                frame,
            }) => {
                // Too long for a message is too long for a deposit (the copy path says so).
                let sent = (deposit
                    && data.len() >= DEPOSIT_MIN
                    && head.len() + data.len() <= on.station().job().config.max_message
                    && self.try_deposit(on, port, to, route, head[1], data)?)
                    || self.send_one(on, port, (to, route, frame), &head, data, block)?;
                if sent {
                    self.count_sent(data.len());
                }
                Ok(sent)
            }
            Some(Bound::All { head }) => {
                // Too large for a message is too large for every rank, whichever way it
                // would reach each (the ring would take it for this node's ranks).
                let max = on.station().job().config.max_message;
                if head.len() + data.len() > max {
                    return Err(Error::MessageTooLarge {
                        len: head.len() + data.len(),
                        max,
                    });
                }
                let (targets, local) = {
                    let t = self.table.lock();
                    (t.broadcast_targets(), t.native_local.clone())
                };
                // A large native broadcast reaches this node's ranks through the ring.
                let place = if data.len() >= RING_MIN && data.len() <= RING_BYTES / 4 {
                    match self.place_in_ring(on, data, &local, block)? {
                        Placed::At(place) => Some(place),
                        Placed::NotHere => None,
                        // Only without `block`: nothing was sent.
                        Placed::Full => return Ok(false),
                    }
                } else {
                    None
                };
                let indirect_head = place.and_then(|_| {
                    let (h, _) = Header::decode(&head)?;
                    Some(
                        Header {
                            indirect: true,
                            ..h
                        }
                        .encode(),
                    )
                });
                let station = on.station();
                // Once the ring holds it, the broadcast is under way: every send waits.
                let mut first = place.is_none();
                let mut failed = None;
                for to in targets {
                    let via_ring = place
                        .zip(indirect_head)
                        .filter(|_| local.contains(&to.rank));
                    let body;
                    let (head, data): (&[u8], &[u8]) = match &via_ring {
                        Some((place, ihead)) => {
                            body = place.encode();
                            (ihead, &body)
                        }
                        None => (&head, data),
                    };
                    let sent = station
                        .route_to(to)
                        .map_err(|e| self.send_failed(on, port, to.rank, e))
                        .and_then(|route| {
                            self.send_to(on, port, to, route, head, data, block || !first)
                        });
                    match sent {
                        Ok(false) => return Ok(false),
                        Ok(true) => first = false,
                        // The other children still get it (waiting for room: the send
                        // is under way), and the caller hears of the failure at the end.
                        Err(e) => {
                            first = false;
                            failed.get_or_insert(e);
                        }
                    }
                }
                self.count_sent(data.len());
                let mut t = self.table.lock();
                t.stats.native_broadcasts += u64::from(t.native_unicast.is_some());
                t.stats.ring_broadcasts += u64::from(place.is_some());
                drop(t);
                failed.map_or(Ok(true), Err)
            }
        }
    }

    /// Writes `data` once into this rank's broadcast ring for this node's ranks `local`
    /// that have not failed (creating the ring at its first use) and says where;
    /// [`Placed::NotHere`] when there are no such ranks or the ring cannot be made (the
    /// broadcast goes as copies), [`Placed::Full`], not `block`ing, when the ring has no
    /// room now. Blocking, it makes progress until the node's ranks give enough back.
    fn place_in_ring(
        &self,
        on: &impl Footing,
        data: &[u8],
        local: &[u32],
        block: bool,
    ) -> Result<Placed> {
        let station = on.station();
        let mut local: Vec<u32> = local
            .iter()
            .copied()
            .filter(|&r| !station.has_failed(r))
            .collect();
        if local.is_empty() {
            return Ok(Placed::NotHere);
        }
        let mut ring = self.ring.borrow_mut();
        if ring.is_none() {
            // A generation of this process in the number: ports reopened on the same
            // DPID get a ring of another name, which no reader confuses with the old one.
            static GENERATION: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let generation = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let id = PUBLISHED_IDS | (generation & 0x7fff) << 16 | u32::from(station.dpid());
            let job = station.job();
            match Published::create(job.job_id, job.rank, id, RING_BYTES) {
                Ok(r) => {
                    let mut t = self.table.lock();
                    t.ring.id = id;
                    t.ring.capacity = r.len() as u64;
                    *ring = Some(r);
                }
                Err(e) => {
                    tracing::debug!("the ports' broadcast ring: {e}; broadcasting copies");
                    return Ok(Placed::NotHere);
                }
            }
        }
        let r = ring.as_ref().expect("made above");
        let len = data.len() as u64;
        loop {
            let taken = self.table.lock().ring.take(len, &local);
            if let Some(offset) = taken {
                let written = r.write(offset as usize, data);
                debug_assert!(written, "a place the ring handed out is inside it");
                let id = self.table.lock().ring.id;
                return Ok(Placed::At(Indirect {
                    id,
                    offset,
                    len: data.len() as u32,
                }));
            }
            if !block {
                return Ok(Placed::Full);
            }
            // A rank that left without giving its places back never will: forgotten.
            let dpid = station.dpid();
            let gone: Vec<u32> = local
                .iter()
                .copied()
                .filter(|&rank| station.shm_peer_gone(Source { rank, dpid }))
                .collect();
            if !gone.is_empty() {
                let mut t = self.table.lock();
                for &rank in &gone {
                    t.ring.forget(rank);
                    t.native_local.retain(|&r| r != rank);
                }
                drop(t);
                local.retain(|r| !gone.contains(r));
                if local.is_empty() {
                    return Ok(Placed::NotHere);
                }
                continue;
            }
            // The node's ranks give places back as they copy: their releases arrive here.
            if !self.poll(on)? {
                std::thread::yield_now();
            }
        }
    }

    /// [`App::send`] of one message to one rank `to` on `route`: as one message, or, when
    /// it would span several frames of a network channel, in pieces of one frame each,
    /// which the receiver writes into its port's buffer as they arrive (no reassembly
    /// copy there). Once the first piece left, the others wait for room whatever
    /// `block` says: the message is under way.
    fn send_one(
        &self,
        on: &impl Footing,
        port: u8,
        (to, route, frame): (Source, usize, Option<usize>),
        head: &[u8],
        data: &[u8],
        block: bool,
    ) -> Result<bool> {
        let half_sent = || self.half_sent.borrow().contains(&to.rank);
        let frame = match frame {
            Some(frame) if head.len() + data.len() > frame || half_sent() => frame,
            _ => return self.send_to(on, port, to, route, head, data, block),
        };
        let station = on.station();
        let max = station.job().config.max_message;
        if head.len() + data.len() > max {
            return Err(Error::MessageTooLarge {
                len: head.len() + data.len(),
                max,
            });
        }
        let (Some((h, _)), Ok(total)) = (Header::decode(head), u32::try_from(data.len())) else {
            return self.send_to(on, port, to, route, head, data, block);
        };
        let chunk = frame - PIECE_LEN;
        // (An empty message is one empty piece: only after a half-sent one.)
        let mut parts = data
            .chunks(chunk)
            .chain(data.is_empty().then_some(&[][..]))
            .enumerate()
            .peekable();
        let mut first = true;
        let mut waited = false;
        while parts.peek().is_some() {
            // Nothing overtakes what a handler queued for the same destination, and at
            // most about a window waits in the channel (as a waiting writer's does).
            loop {
                let queued = {
                    let out = self.out.borrow();
                    !out.is_empty() && out.has_queued_for(to)
                };
                if !queued && !station.send_backlogged(route) {
                    break;
                }
                if first && !block {
                    return Ok(false);
                }
                if station.has_failed(to.rank) {
                    // Its frames wait in a channel that will never take them.
                    let e = Error::PeerFailed {
                        rank: to.rank,
                        dpid: to.dpid,
                        reason: "failed while a message to it was under way".into(),
                    };
                    return Err(self.send_failed(on, port, to.rank, e));
                }
                if !waited {
                    waited = true;
                    self.table.lock().stats.send_waits += 1;
                }
                match self.poll(on) {
                    Ok(true) => {}
                    Ok(false) => std::thread::yield_now(),
                    // Progress met the failure of another peer that no port sends to
                    // (those of the others go to their ports): the message under way is
                    // finished all the same; that peer stays failed for whatever reaches
                    // it next.
                    Err(e @ (Error::PeerFailed { rank, .. } | Error::PeerClosed { rank, .. }))
                        if !first && rank != to.rank =>
                    {
                        tracing::debug!("port {port}: {e} while a message was under way");
                        std::thread::yield_now();
                    }
                    Err(e) => {
                        if !first {
                            self.half_sent.borrow_mut().push(to.rank);
                        }
                        return Err(e);
                    }
                }
            }
            // A batch of pieces goes to the link together (one frame each).
            let mut heads = [[0; PIECE_LEN]; PIECE_BATCH];
            let mut bodies: [&[u8]; PIECE_BATCH] = [&[]; PIECE_BATCH];
            let mut n = 0;
            while n < PIECE_BATCH {
                let Some((k, part)) = parts.next() else {
                    break;
                };
                heads[n] = Piece {
                    dest_port: h.dest_port,
                    src_port: h.src_port,
                    // Below `total`, a u32.
                    offset: (k * chunk) as u32,
                    total,
                }
                .encode();
                bodies[n] = part;
                n += 1;
            }
            let batch: Vec<(&[u8], &[u8])> = (0..n).map(|i| (&heads[i][..], bodies[i])).collect();
            match station.send_batch(route, &batch) {
                Ok(()) => {}
                Err(e) => {
                    if !first || parts.peek().is_some() {
                        self.half_sent.borrow_mut().push(to.rank);
                    }
                    return Err(self.send_failed(on, port, to.rank, e));
                }
            }
            if first {
                // The start ended any half message at the receiver.
                self.half_sent.borrow_mut().retain(|&r| r != to.rank);
            }
            first = false;
        }
        Ok(true)
    }

    /// [`App::send`] of one message to `to` on `route`.
    #[allow(clippy::too_many_arguments)]
    fn send_to(
        &self,
        on: &impl Footing,
        port: u8,
        to: Source,
        route: usize,
        head: &[u8],
        data: &[u8],
        block: bool,
    ) -> Result<bool> {
        let station = on.station();
        let mut waited = false;
        loop {
            // Nothing overtakes what a handler queued for the same destination.
            let queued = {
                let out = self.out.borrow();
                !out.is_empty() && out.has_queued_for(to)
            };
            if !queued {
                if station.try_send_inline(route, head, data) {
                    break;
                }
                match station.send(route, head, data, false) {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => return Err(self.send_failed(on, port, to.rank, e)),
                }
            }
            if !block {
                return Ok(false);
            }
            if !waited {
                waited = true;
                self.table.lock().stats.send_waits += 1;
            }
            if !self.poll(on)? {
                std::thread::yield_now();
            }
        }
        Ok(true)
    }

    /// The mappings of this node's ranks' mailboxes and port buffers.
    fn deposits(&self, on: &impl Footing) -> &PeerDeposits {
        self.peer_deposits.get_or_init(|| {
            let station = on.station();
            PeerDeposits::new(station.job().job_id, station.dpid())
        })
    }

    /// Writes `data` straight into the buffer of port `dest_port` of `to` (on this
    /// node), when its mailbox offers one and nothing this process sent to `to` before
    /// is still unread (the deposit would overtake it: the receiver delivers a deposit
    /// when it reads its notice, which goes through the same ring as everything else);
    /// then sends the notice. False when it did not (the message goes by copy).
    fn try_deposit(
        &self,
        on: &impl Footing,
        port: u8,
        to: Source,
        route: usize,
        dest_port: u8,
        data: &[u8],
    ) -> Result<bool> {
        let station = on.station();
        if self.out.borrow().has_queued_for(to) || !station.route_drained(route) {
            return Ok(false);
        }
        let me = station.job().rank;
        let deposits = self.deposits(on);
        // A receiver holding messages aside (one of them may be this rank's, released
        // from the ring though not delivered: it raised the flag before) takes copies
        // only. Read after the ring's position, whose release the flag precedes.
        if deposits.receiver_parks(to.rank) {
            return Ok(false);
        }
        let len = data.len() as u64;
        let deposited = deposits.with_mailbox(to.rank, dest_port, |m| {
            let claim = m.claim(me, len)?;
            if !deposits.write(to.rank, claim.buffer, data) {
                m.abandon(me, claim);
                return None;
            }
            // False: taken back, the receiver found this rank failed (it will not read
            // the notice); sent by copy, in case it still reads.
            m.deposited(me, claim, len).then_some(claim)
        });
        let Some(Some(claim)) = deposited else {
            return Ok(false);
        };
        let notice = Deposited {
            dest_port,
            src_port: port,
            generation: claim.generation,
            len,
        }
        .encode();
        // The ring was empty: the notice fits at once, unless the receiver closed.
        if !station.try_send_inline(route, &notice, &[]) {
            if let Err(e) = station.send(route, &notice, &[], true) {
                return Err(self.send_failed(on, port, to.rank, e));
            }
        }
        self.table.lock().stats.deposits += 1;
        Ok(true)
    }

    /// Takes `port`'s buffer back from this node's senders ([`Table::hold`]), making
    /// progress until one that holds it has delivered its message. Returns only once
    /// the buffer is the table's alone, with the first error the progress met (another
    /// peer failed, say). A claim that stays for the job's peer timeout (10 s by
    /// default: a sender stopped for that long, or a peer that wrote the word) is
    /// taken back, and its message, if it comes later, is refused; so is a message from
    /// another node landing in the buffer whose sender sent no piece for that long.
    /// Then runs `then` on the table under the same lock (with the offload engine, its
    /// thread could start writing a message into the buffer between two locks) and
    /// returns its result.
    #[inline]
    pub(super) fn hold_then<R>(
        &self,
        on: &impl Footing,
        port: u8,
        then: impl FnOnce(&mut Table) -> R,
    ) -> (R, Result<()>) {
        // Nearly always: nothing armed, or taken back at once (on every read).
        {
            let mut t = self.table.lock();
            if t.hold(port) {
                return (then(&mut t), Ok(()));
            }
        }
        self.hold_claimed(on, port, then)
    }

    /// [`App::hold_then`] of a buffer a sender holds now.
    #[cold]
    #[inline(never)]
    fn hold_claimed<R>(
        &self,
        on: &impl Footing,
        port: u8,
        then: impl FnOnce(&mut Table) -> R,
    ) -> (R, Result<()>) {
        let limit = on.station().job().config.peer_timeout;
        let mut first = None;
        let mut seen: Option<(super::mailbox::State, Instant)> = None;
        let mut landed: Option<((u32, u64, usize), Instant)> = None;
        loop {
            let (busy, landing) = {
                let mut t = self.table.lock();
                if t.hold(port) {
                    return (then(&mut t), first.map_or(Ok(()), Err));
                }
                (t.holder(port), t.landing_in(port))
            };
            // A message from another node landing in the buffer whose sender went
            // silent for the peer timeout is given up (its channel fails first when the
            // peer is gone; this is a peer that stopped sending pieces).
            match (landing, landed) {
                (Some(now), Some((was, since))) if now == was => {
                    if since.elapsed() > limit {
                        tracing::warn!(
                            "port {port}: rank {} left a message half sent for {limit:?}; given up",
                            now.0
                        );
                        let mut out = self.out.borrow_mut();
                        self.table.lock().give_up_landing(port, &mut out);
                        landed = None;
                    }
                }
                (Some(now), _) => landed = Some((now, Instant::now())),
                (None, _) => landed = None,
            }
            match (busy, seen) {
                (Some(s), Some((was, since))) if s == was => {
                    if since.elapsed() > limit {
                        tracing::warn!(
                            "port {port}: rank {} held its buffer for {limit:?}; taken back",
                            s.claimant
                        );
                        let mut out = self.out.borrow_mut();
                        self.table.lock().take_back(port, s, &mut out);
                        seen = None;
                    }
                }
                (Some(s), _) => seen = Some((s, Instant::now())),
                (None, _) => {}
            }
            match self.poll(on) {
                Ok(true) => {}
                Ok(false) => std::thread::yield_now(),
                Err(e) => {
                    first.get_or_insert(e);
                    std::thread::yield_now();
                }
            }
        }
    }

    /// One message of `len` bytes sent through a port (to one rank, or to all).
    fn count_sent(&self, len: usize) {
        let mut t = self.table.lock();
        t.stats.sent += 1;
        t.stats.bytes_sent += len as u64;
    }

    /// A send through `port` to `rank` failed with `e`: the port's error handler hears
    /// of it; `e` goes back to the caller.
    fn send_failed(&self, on: &impl Footing, port: u8, rank: u32, e: Error) -> Error {
        let pe = match &e {
            Error::PeerFailed { .. } | Error::PeerClosed { .. } => {
                PortError::DestinationFailed { port, rank }
            }
            other => PortError::SendFailed {
                port,
                rank,
                reason: other.to_string(),
            },
        };
        // The caller sees `e` now: the port's error handler hears of it too, but it is
        // not kept for a later call.
        let mut t = self.table.lock();
        if matches!(pe, PortError::DestinationFailed { .. }) {
            // A rank that is gone gives nothing back: its places free, and later
            // broadcasts hand it none.
            t.ring.forget(rank);
            t.native_local.retain(|&r| r != rank);
        }
        let _ = t.notify(pe);
        drop(t);
        on.report(e)
    }

    /// Makes progress once: sends what handlers queued, delivers what has arrived
    /// (running the handlers). Returns whether anything happened. A failed peer's error
    /// goes to the error handlers of the ports bound to it; it comes back from here only
    /// when none of them has one.
    pub(super) fn poll(&self, on: &impl Footing) -> Result<bool> {
        let station = on.station();
        let mut out = self.out.borrow_mut();
        let sent = out.sent();
        let (r, handled) = match &self.table {
            // Only this thread uses the table: borrowed once for the whole drive.
            TableCell::Local(cell) => {
                let mut table = cell.borrow_mut();
                let mut handler = Handler {
                    table: &mut table,
                    rings: Some(self.peer_rings(on)),
                    woke: false,
                    handled: 0,
                };
                let r = drive_rearming(on, &mut handler, &mut out, |h| h.handled);
                let handled = handler.handled;
                // What waited for a claim given back unused (or resolved with no new
                // message since) moves on.
                let moved = table.has_parked() && table.drain_parked(&mut out);
                (r, handled + u64::from(moved))
            }
            // With the offload engine, its thread delivers too: the table is taken per
            // message, not for the whole drive.
            TableCell::Shared(_) => {
                let mut handler = OnCell {
                    cell: &self.table,
                    rings: Some(self.peer_rings(on)),
                    woke: false,
                    handled: 0,
                };
                let r = drive_rearming(on, &mut handler, &mut out, |h| h.handled);
                (r, handler.handled)
            }
        };
        let busy = handled > 0 || out.sent() != sent;
        match r {
            Ok(Some(m)) => {
                // The handler consumes every message.
                station.release_token(m.token);
                Ok(busy)
            }
            Ok(None) => Ok(busy),
            Err(e) => self.peer_lost(e, &mut out),
        }
    }

    /// What [`App::poll`] does with an error of the engine: a failed or closed peer
    /// reaches every port bound to it (its error handler, or the application's next
    /// wait, test or progress); the error is returned only when no port sends to that
    /// rank, and every other error as it is.
    #[cold]
    #[inline(never)]
    fn peer_lost(&self, e: Error, out: &mut Outbox) -> Result<bool> {
        let rank = match &e {
            Error::PeerFailed { rank, .. } | Error::PeerClosed { rank, .. } => *rank,
            _ => return Err(e),
        };
        let mut table = self.table.lock();
        // A message it was writing into a buffer here is lost with it (a peer that
        // closed finishes what it claimed: its notice is in the ring).
        if matches!(e, Error::PeerFailed { .. }) {
            table.revoke_claims(rank, out);
        }
        // A message it was sending here in pieces will not be finished.
        table.abandon_landings(rank, out);
        // Its places in this rank's broadcast ring come back, and it gets no more.
        table.ring.forget(rank);
        table.native_local.retain(|&r| r != rank);
        let mut bound = false;
        for port in 0..RESERVED_PORT {
            let dest = table.slots[usize::from(port)].dest;
            if dest.is_some_and(|b| b.reaches(rank)) {
                table.report(PortError::DestinationFailed { port, rank });
                bound = true;
            }
        }
        if bound {
            Ok(true)
        } else {
            Err(e)
        }
    }

    /// The broadcast rings of this node's ranks, as the handlers read them.
    fn peer_rings(&self, on: &impl Footing) -> &PeerRings {
        self.peer_rings.get_or_init(|| {
            let job = on.station().job();
            PeerRings(Windows::new(job.job_id, job.rank))
        })
    }

    /// The first port error no error handler took.
    pub(super) fn take_error(&self) -> Result<()> {
        match self.table.lock().errors.pop_front() {
            Some(e) => Err(Error::Port(e)),
            None => Ok(()),
        }
    }

    /// Consumes `n` signals of `port` if it has them.
    pub(super) fn take_signals(&self, port: u8, n: u64) -> bool {
        let mut t = self.table.lock();
        let s = &mut t.slots[usize::from(port)].signals;
        if *s >= n {
            *s -= n;
            true
        } else {
            false
        }
    }

    /// Waits until `port` has `n` signals and consumes them, polling the way `mode`
    /// says; `Ok(false)` when `deadline` passed first (nothing consumed). A port error
    /// that no handler took ends the wait with that error.
    pub(super) fn wait(
        &self,
        on: &impl Footing,
        port: u8,
        n: u64,
        mode: WaitMode,
        deadline: Option<Instant>,
    ) -> Result<bool> {
        loop {
            {
                let mut t = self.table.lock();
                let s = &mut t.slots[usize::from(port)].signals;
                if *s >= n {
                    *s -= n;
                    return Ok(true);
                }
                if let Some(e) = t.errors.pop_front() {
                    return Err(Error::Port(e));
                }
                // Waiting for a message: the port's buffer is free for a sender of the
                // node to write it directly.
                t.arm(port);
            }
            if self.poll(on)? {
                continue;
            }
            let left = match deadline {
                None => None,
                Some(at) => match at.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(self.take_signals(port, n)),
                },
            };
            // Woken by what arrives: on this thread's receivers, or, with the offload
            // engine, by a handler that ran there (the engine wakes this thread after
            // each message it consumed).
            let ready = || {
                let busy = self.poll(on)?;
                let t = self.table.lock();
                let news = t.slots[usize::from(port)].signals >= n || !t.errors.is_empty();
                Ok((busy || news).then_some(()))
            };
            match on.station().wait_for_in(mode, ready, left) {
                Ok(()) | Err(Error::Timeout(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// How long a closing endpoint waits for what handlers queued to leave.
    pub(super) fn linger(&self, on: &impl Footing, limit: Duration) {
        let start = Instant::now();
        // The node's ranks holding places of this rank's ring are asked to give them
        // back now (they give them back in batches), so that the ring can go.
        let holders = {
            let t = self.table.lock();
            (t.ring.taken() > 0).then(|| (t.ring.id, t.native_local.clone()))
        };
        let dpid = on.station().dpid();
        // And this rank gives back what it copied from theirs, without being asked (the
        // roots may be closing too).
        let copied = self.table.lock().flush_all_copied();
        for (root, back) in copied {
            let to = Source { rank: root, dpid };
            self.out.borrow_mut().forward(to, &back.encode(), &[]);
        }
        if let Some((id, holders)) = holders {
            let ask = Release {
                id,
                offset: FLUSH_RELEASES,
            }
            .encode();
            let mut out = self.out.borrow_mut();
            for rank in holders {
                out.forward(Source { rank, dpid }, &ask, &[]);
            }
        }
        // No sender claims a buffer of this rank any more; one that holds one delivers
        // its message first (its notice is on the way).
        let done = || {
            let mut t = self.table.lock();
            t.close_mailboxes().is_empty() && self.out.borrow().is_empty() && t.ring.taken() == 0
        };
        while !done() && start.elapsed() < limit {
            if !matches!(self.poll(on), Ok(true)) {
                std::thread::yield_now();
            }
        }
    }
}

/// The reserved port is nobody's destination.
fn check_dest_port(dest_port: u8) -> Result<()> {
    if dest_port == RESERVED_PORT {
        return Err(Error::Config(format!(
            "port {RESERVED_PORT} is reserved for the library; bind to ports 0 to {}",
            RESERVED_PORT - 1
        )));
    }
    Ok(())
}
