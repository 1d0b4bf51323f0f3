//! GAMMA's active-message ports (the GAMMA seed): numbered ports bound to a destination,
//! a receive buffer, a receiver handler and an error handler.
//!
//! Every process of a job opens [`Ports`] on the same DPID and has ports 0 to 254
//! ([`RESERVED_PORT`], 255, is the library's). A port may be bound, at any time and
//! again, to any of:
//!
//! - a **destination**, port `p` of rank `r` ([`Bind::to`]), or port `p` of every other
//!   rank ([`Bind::to_all`], GAMMA's BROADCAST: down a binomial tree of unicasts): the
//!   header is computed and the routes connected once, when it is bound, and a send
//!   then names only the port and the data ([`Ports::send`]);
//! - a **receive buffer** the application hands over ([`Bind::buffer`]): a message
//!   arriving on the port is written into it, where it stays until the next one
//!   overwrites it, unless the handler re-binds the port to a fresh buffer first
//!   ([`Delivery::rebind`]);
//! - a **receiver handler** ([`Bind::handler`], a `Send` closure, called without any
//!   allocation): it runs once per message, just after the message is in the buffer,
//!   where progress runs: inside the application's next call of these ports (a send, a
//!   wait, a test or [`Ports::progress`]), and, with the offload engine
//!   (`QUIVER_RELIABILITY=offload`), on the engine's thread for messages from other
//!   nodes, as they arrive. It learns the port, the length and the
//!   sender, may read the message, re-bind the buffer, answer ([`Delivery::send`]) and
//!   signal the port ([`Delivery::signal`]). A port without a handler is signalled on
//!   every message;
//! - an **error handler** ([`Bind::on_error`]): a message for a port without a buffer,
//!   or longer than its buffer, and a failed destination reach it as a [`PortError`];
//!   nothing is dropped silently (without an error handler the error comes back from
//!   the next wait, test or progress, as [`Error::Port`]; a failed send also returns
//!   its error at once).
//!
//! [`Ports::wait`] is GAMMA's `gamma_wait(port, n)`: it waits until the port has been
//! signalled `n` times and consumes the signals, polling for a while (GAMMA's 50 µs by
//! default, [`Ports::set_wait`]) and then sleeping on the endpoint's descriptor; it has
//! a deadline form ([`Ports::wait_within`]) and a non-blocking one ([`Ports::test`]).
//!
//! Delivery copies once: from the receive ring, or from each frame of a message from
//! another node as it arrives (a message longer than a frame travels in pieces that are
//! written into the buffer in place, `wire::Piece`), and not at all when a sender of the
//! node writes straight into a [`PortBuffer`]. A buffer being written so is not shown or
//! handed back ([`Ports::read`], [`Ports::take_buffer`], a new binding) until its
//! message is complete.
//!
//! Flow control: a message stays in the endpoint's receive memory until its handler
//! returns, so a slow handler holds its senders back (their rings or credit windows
//! fill) and nothing is lost.
//!
//! Bind a port before peers send to it (a barrier after binding does it): a message
//! that finds its port without a buffer goes to the error path, and with the offload
//! engine messages from other nodes are delivered as soon as they arrive.
//!
//! The protocol is a personality on the engine's hook (`engine::protocol`): `table`
//! holds the ports and delivers what arrives (sans-IO), `app` the application's side
//! (binding, sending, progress, waiting), `wire` the 8-byte header. A message is at
//! most `QUIVER_MAX_MESSAGE` minus [`HEADER_LEN`] bytes.
//!
//! **Ports of another job** (GAMMA's MIMD jobs): two jobs that admit each other form a
//! joint job ([`crate::Job::invite`], [`crate::Job::join`]) and open ports on it, whose
//! ranks are both jobs' ([`crate::JointJob::rank_of`] names the other job's rank,
//! [`crate::JointJob::member`] says whom an [`Origin`] is):
//!
//! ```no_run
//! # fn main() -> quiver::Result<()> {
//! # let job = quiver::Job::from_env()?;
//! # let text_from_the_other_job = String::new();
//! // The guest job: the host gave it `job.invite()?.to_string()` out of band.
//! let invitation: quiver::Invitation = text_from_the_other_job.parse()?;
//! let joint = job.join(&invitation)?; // every rank of both jobs joins
//! let ports = quiver::ports::Ports::open(&joint, 7)?;
//! ports.bind(0).to(joint.rank_of(invitation.host_job(), 0)?, 3).apply()?;
//! joint.barrier_progressing(&[&ports])?;
//! ports.send(0, b"hello from the other job")?;
//! # Ok(()) }
//! ```
//!
//! What GAMMA has and these ports do not have yet is listed in `docs/DESIGN-NOTES.md`,
//! "GAMMA's ports".

mod app;
mod deposit;
mod mailbox;
#[cfg(test)]
mod sim_tests;
pub(crate) mod table;
pub(crate) mod tree;
mod wire;

use crate::config::WaitMode;
use crate::dm::Endpoint;
use crate::engine::protocol::Outbox;
use crate::error::{Error, Result};
pub use crate::error::{Origin, PortError};
use crate::job::Job;
use app::App;
use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use table::{Bound, ErrorFn, ReceiverFn, Served, Table, TableCell};

use deposit::MailboxArea;
pub use deposit::PortBuffer;

/// Ports per process (numbers 0 to 255).
pub const PORT_COUNT: usize = 256;
/// The port the library keeps for itself (GAMMA's barrier port); binding it, or sending
/// to it, is an error.
pub const RESERVED_PORT: u8 = 255;
/// Bytes of the header before each message's payload.
pub const HEADER_LEN: usize = wire::HEADER_LEN;
/// Rounds of the endpoint one [`Ports::progress`] (or [`Ports::test`]) makes at most.
pub const PROGRESS_ROUNDS: usize = 64;
/// Messages at least this long go straight into a same-node receiver's [`PortBuffer`]
/// when its port is armed; shorter ones are copied through the receive ring, which
/// costs less than the mailbox's cache lines at that size.
pub const DEPOSIT_MIN: usize = 2048;
/// How long [`Ports::wait`] polls before it sleeps, by default: GAMMA's bounded poll.
pub const DEFAULT_WAIT_SPIN: Duration = Duration::from_micros(50);

/// Counters of a process's ports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Messages sent through a port.
    pub sent: u64,
    /// Their payload bytes.
    pub bytes_sent: u64,
    /// Sends that found no room at their destination and waited (making progress)
    /// for it: the receiver held the sender back.
    pub send_waits: u64,
    /// Messages delivered into a port's buffer (or, empty, to a port).
    pub delivered: u64,
    /// Their payload bytes.
    pub bytes_delivered: u64,
    /// Broadcast messages forwarded to this rank's children in their root's tree.
    pub forwarded: u64,
    /// Broadcasts this rank sent through the link's own broadcast (one message to the
    /// engine's group channel for every other node, `QUIVER_NATIVE_BROADCAST`), not
    /// down its tree.
    pub native_broadcasts: u64,
    /// Of them, those written once into this rank's broadcast ring, where this node's
    /// ranks read them (large ones, with ranks on this node), instead of once into each
    /// one's receive ring.
    pub ring_broadcasts: u64,
    /// Messages this rank wrote straight into the receiver's buffer (a [`PortBuffer`] of
    /// a rank of this node, armed for it) rather than into its receive ring.
    pub deposits: u64,
    /// Messages delivered here that way: their sender wrote them into the port's buffer.
    pub deposited: u64,
    /// Messages that arrived while another rank was writing the port's buffer, held
    /// aside and delivered after its message (the rare case of the direct deposit).
    pub parked: u64,
    /// Messages from other nodes written into the port's buffer piece by piece, each
    /// piece from where its frame arrived (no reassembly copy).
    pub landed: u64,
    /// Port errors (each went to an error handler or came back from a call).
    pub errors: u64,
    /// Messages dropped because they were not well-formed port messages.
    pub malformed: u64,
}

/// A port's receive buffer: the application's memory, into which each message is
/// copied as it is delivered, or a [`PortBuffer`] of this node's shared memory
/// ([`Ports::buffer`]), into which a rank of this node writes its message directly
/// (the delivery then copies nothing; messages from other nodes are copied into it as
/// into the other). Bound with [`Bind::buffer`], which takes either.
#[derive(Debug)]
pub enum Buffer {
    /// Memory of the application's.
    Private(Vec<u8>),
    /// Memory this node's ranks can write.
    Shared(PortBuffer),
}

impl Buffer {
    /// The bytes, as a `Vec` (copied out of a shared buffer).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Buffer::Private(v) => v,
            Buffer::Shared(b) => b.to_vec(),
        }
    }
}

impl Default for Buffer {
    fn default() -> Self {
        Buffer::Private(Vec::new())
    }
}

impl From<Vec<u8>> for Buffer {
    fn from(v: Vec<u8>) -> Self {
        Buffer::Private(v)
    }
}

impl From<PortBuffer> for Buffer {
    fn from(b: PortBuffer) -> Self {
        Buffer::Shared(b)
    }
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            Buffer::Private(v) => v,
            Buffer::Shared(b) => b,
        }
    }
}

impl std::ops::DerefMut for Buffer {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Buffer::Private(v) => v,
            Buffer::Shared(b) => b,
        }
    }
}

/// A message just delivered, as its receiver handler sees it.
pub struct Delivery<'a> {
    table: &'a mut Table,
    port: u8,
    from: Origin,
    len: usize,
    out: &'a mut Outbox,
    signalled: bool,
    /// The buffer holding the message was re-bound or taken: it is no longer the port's.
    moved: bool,
}

impl Delivery<'_> {
    /// The port the message arrived on.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// Who sent it.
    pub fn origin(&self) -> Origin {
        self.from
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The message, in the port's buffer (empty once the buffer was re-bound or taken:
    /// the message is then in the buffer [`Delivery::rebind`] returned).
    pub fn data(&self) -> &[u8] {
        match &self.table.slots[usize::from(self.port)].buffer {
            Some(b) if !self.moved && b.len() >= self.len => &b[..self.len],
            _ => &[],
        }
    }

    /// The message, to change in place.
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (len, moved) = (self.len, self.moved);
        match &mut self.table.slots[usize::from(self.port)].buffer {
            Some(b) if !moved && b.len() >= len => &mut b[..len],
            _ => &mut [],
        }
    }

    /// Binds the port to `buffer` for the next message and returns the buffer that
    /// holds this one (empty when the port had none: an empty message needs none).
    pub fn rebind(&mut self, buffer: impl Into<Buffer>) -> Buffer {
        let slot = &mut self.table.slots[usize::from(self.port)];
        let old = slot.buffer.replace(buffer.into()).unwrap_or_default();
        self.len = self.len.min(old.len());
        self.moved = true;
        slot.forget_last();
        old
    }

    /// Takes the buffer that holds this message and leaves the port without one (the
    /// next message goes to the error handler unless a buffer is bound first).
    pub fn take_buffer(&mut self) -> Buffer {
        let slot = &mut self.table.slots[usize::from(self.port)];
        self.moved = true;
        slot.forget_last();
        slot.buffer.take().unwrap_or_default()
    }

    /// Signals the port: one more for [`Ports::wait`] to consume.
    pub fn signal(&mut self) {
        self.table.slots[usize::from(self.port)].signals += 1;
        self.signalled = true;
    }

    /// Sends `data` through `port` (to its bound destination) once the route has room:
    /// it is queued now, in order with this process's other answers to that destination,
    /// and leaves as progress runs. The handler must not wait, so this never does.
    /// Through a broadcast port it is queued for every target (the group and this node's
    /// other ranks, or this rank's children in its tree), or, when the outbox cannot take
    /// them all, for none ([`PortError::OutboxFull`]).
    pub fn send(&mut self, port: u8, data: &[u8]) -> std::result::Result<(), PortError> {
        let t = &mut *self.table;
        match t.slots[usize::from(port)].dest {
            None => return Err(PortError::NoDestination { port }),
            Some(Bound::One { to, head, .. }) => self
                .out
                .send(to, &head, data)
                .map_err(|_| PortError::OutboxFull { port })?,
            Some(Bound::All { head }) => {
                // All the targets or none: a retry must not send twice to some.
                let targets = t.broadcast_targets();
                if self.out.room() < targets.len() {
                    return Err(PortError::OutboxFull { port });
                }
                for to in targets {
                    self.out.forward(to, &head, data);
                }
                t.stats.native_broadcasts += u64::from(t.native_unicast.is_some());
            }
        }
        t.stats.sent += 1;
        t.stats.bytes_sent += data.len() as u64;
        Ok(())
    }
}

/// The ports of one process (module documentation).
pub struct Ports {
    /// The endpoint whose station carries the ports' messages (its error handler sees
    /// the errors of these calls too).
    ep: Endpoint,
    app: App,
    wait: Cell<WaitMode>,
}

/// A binding of a port being built ([`Ports::bind`]): what is not named stays as it is.
#[must_use = "a binding takes effect with apply()"]
pub struct Bind<'p> {
    ports: &'p Ports,
    port: u8,
    /// (rank, port), or (`None`, port) for every other rank.
    dest: Option<(Option<u32>, u8)>,
    buffer: Option<Buffer>,
    handler: Option<ReceiverFn>,
    on_error: Option<ErrorFn>,
}

impl Bind<'_> {
    /// Messages sent through the port go to port `port` of rank `rank`.
    pub fn to(mut self, rank: u32, port: u8) -> Self {
        self.dest = Some((Some(rank), port));
        self
    }

    /// Messages sent through the port go to port `port` of every other rank of the job
    /// (GAMMA's BROADCAST destination): down a binomial tree of the job's channels
    /// rooted at this rank, each rank forwarding to its children before its own handler
    /// runs, so every rank gets each message once and in this rank's order, over
    /// reliable channels. A rank that fails takes the copies for its subtree with it:
    /// the ports bound to all hear [`PortError::DestinationFailed`] where the failure
    /// is seen. The handler's [`Delivery::origin`] names the root.
    pub fn to_all(mut self, port: u8) -> Self {
        self.dest = Some((None, port));
        self
    }

    /// Messages arriving on the port are written into `buffer`, a `Vec` or a
    /// [`PortBuffer`] (the application gets it back from [`Ports::unbind`],
    /// [`Ports::take_buffer`] or a handler's [`Delivery::rebind`]).
    pub fn buffer(mut self, buffer: impl Into<Buffer>) -> Self {
        self.buffer = Some(buffer.into());
        self
    }

    /// `handler` runs once per message delivered on the port.
    pub fn handler(mut self, handler: impl FnMut(&mut Delivery<'_>) + Send + 'static) -> Self {
        self.handler = Some(Box::new(handler));
        self
    }

    /// `handler` runs once per error of the port.
    pub fn on_error(mut self, handler: impl FnMut(PortError) + Send + 'static) -> Self {
        self.on_error = Some(Box::new(handler));
        self
    }

    /// Applies the binding. A destination is connected to first (which waits for its
    /// endpoint to be open, as a first write does); nothing changes when that fails.
    /// The reserved port cannot be bound, nor named as a destination.
    pub fn apply(self) -> Result<()> {
        let Bind {
            ports,
            port,
            dest,
            buffer,
            handler,
            on_error,
        } = self;
        let buffer_changes = buffer.is_some();
        if port == RESERVED_PORT {
            return Err(Error::Config(format!(
                "port {RESERVED_PORT} is reserved for the library; bind ports 0 to {}",
                RESERVED_PORT - 1
            )));
        }
        match dest {
            Some((Some(rank), dest_port)) => {
                ports.app.bind_dest(&ports.ep, port, rank, dest_port)?
            }
            Some((None, dest_port)) => ports.app.bind_all(&ports.ep, port, dest_port)?,
            None => {}
        }
        let apply = |t: &mut Table| {
            let slot = &mut t.slots[usize::from(port)];
            if let Some(b) = buffer {
                slot.buffer = Some(b);
                slot.forget_last();
            }
            if let Some(h) = handler {
                slot.handler = Some(h);
            }
            if let Some(h) = on_error {
                slot.on_error = Some(h);
            }
            if t.slots[usize::from(port)].handler.is_some() {
                // A port without a handler is armed by a wait on it.
                t.arm(port);
            }
        };
        if buffer_changes {
            // A sender may be writing the old buffer: its message first.
            ports.with_held(port, apply);
        } else {
            apply(&mut ports.app.table.lock());
        }
        Ok(())
    }
}

impl Ports {
    /// Opens the ports of this rank on endpoint `dpid` (every rank of the job uses the
    /// same DPID).
    /// With the offload engine (`QUIVER_RELIABILITY=offload`) and a network side, the
    /// handlers of messages from other nodes run on the engine's thread, as soon as they
    /// arrive, while the application computes; the handlers of same-node messages run
    /// inside the application's calls.
    pub fn open(job: &Job, dpid: u16) -> Result<Ports> {
        let (rank, size) = (job.rank(), job.size());
        let (ep, app) = if job.can_serve() {
            let table = Arc::new(Mutex::new(Table::new(rank, size, dpid)));
            let served = Box::new(Served {
                table: table.clone(),
            });
            (
                job.open_serving(dpid, served)?,
                App::with(TableCell::Shared(table)),
            )
        } else {
            // Made before the endpoint: a sender that connects finds them.
            let mailboxes = job
                .config()
                .ports_deposit
                .then(|| MailboxArea::create(job.job_id(), rank, dpid))
                .and_then(|made| {
                    made.map_err(|e| {
                        tracing::debug!("the ports' mailboxes: {e}; no direct deposit")
                    })
                    .ok()
                });
            (job.open(dpid)?, App::new(rank, size, dpid, mailboxes))
        };
        Ok(Ports {
            ep,
            app,
            wait: Cell::new(WaitMode::Hybrid(DEFAULT_WAIT_SPIN)),
        })
    }

    /// The endpoint underneath (its statistics, descriptor, error handler).
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// A receive buffer of `len` bytes in this node's shared memory, to bind to a port
    /// ([`Bind::buffer`]): this node's ranks then write their messages straight into it
    /// (GAMMA's delivery, with no copy on the receiving side), where the handler (or,
    /// after a wait, [`Ports::read`]) finds them. Messages of at least
    /// [`DEPOSIT_MIN`] bytes go that way, when the port is armed: always between two
    /// messages a handler takes, and while a [`Ports::wait`] on a port without a
    /// handler waits (so the message a wait returned for stays until the next wait).
    /// Without the offload engine only; otherwise it is an ordinary buffer.
    pub fn buffer(&self, len: usize) -> Result<PortBuffer> {
        use crate::engine::station::Footing;
        let job = self.ep.station().job();
        PortBuffer::create(job.job_id, job.rank, len)
    }

    /// Takes `port`'s buffer back from the senders that may write it, delivering a
    /// message one of them is writing first. An error of the progress made meanwhile
    /// (another peer failed) is logged; the buffer is taken back all the same.
    fn with_held<R>(&self, port: u8, then: impl FnOnce(&mut Table) -> R) -> R {
        let (r, held) = self.app.hold_then(&self.ep, port, then);
        if let Err(e) = held {
            tracing::debug!("port {port}: {e} while taking its buffer back");
        }
        r
    }

    /// Starts a binding of `port` (0 to 254); [`Bind::apply`] makes it take effect.
    pub fn bind(&self, port: u8) -> Bind<'_> {
        Bind {
            ports: self,
            port,
            dest: None,
            buffer: None,
            handler: None,
            on_error: None,
        }
    }

    /// Removes every binding of `port`; returns its buffer. Signals not yet waited for
    /// are kept. (A rank of this node writing a message into the port's shared buffer
    /// finishes first, and its message is delivered.)
    pub fn unbind(&self, port: u8) -> Option<Buffer> {
        self.with_held(port, |t| {
            let slot = &mut t.slots[usize::from(port)];
            slot.dest = None;
            slot.handler = None;
            slot.on_error = None;
            slot.forget_last();
            slot.buffer.take()
        })
    }

    /// Takes `port`'s buffer back, leaving the port without one.
    pub fn take_buffer(&self, port: u8) -> Option<Buffer> {
        self.with_held(port, |t| {
            let slot = &mut t.slots[usize::from(port)];
            slot.forget_last();
            slot.buffer.take()
        })
    }

    /// Copies the last message delivered into `port`'s buffer to the start of `dst`
    /// (as much as fits) and returns its whole length and its sender; `None` when
    /// nothing was delivered since the buffer was bound. The message stays until the
    /// next one on the port overwrites it: between a wait and this call nothing runs
    /// the handlers (without the offload engine), so it is the one the wait was
    /// signalled for. (A copy, not a view: the port's buffer is delivered into while the
    /// application runs when the offload engine serves the ports; a handler reads the
    /// message in place, [`Delivery::data`]. A port with a handler and a
    /// [`PortBuffer`] may be being written by a sender of the node: its message is
    /// delivered first.)
    pub fn read(&self, port: u8, dst: &mut [u8]) -> Option<(usize, Origin)> {
        self.with_held(port, |t| {
            let slot = &t.slots[usize::from(port)];
            let from = slot.last_from?;
            let bytes = slot.buffer.as_deref().unwrap_or_default();
            let msg = &bytes[..slot.last_len.min(bytes.len())];
            let n = msg.len().min(dst.len());
            dst[..n].copy_from_slice(&msg[..n]);
            Some((msg.len(), from))
        })
    }

    /// Sends `data` through `port` to its bound destination; returns when `data` may be
    /// reused (waiting, while making progress, for room at the destination). A failed
    /// destination also reaches the port's error handler.
    pub fn send(&self, port: u8, data: &[u8]) -> Result<()> {
        self.app.send(&self.ep, port, data, true).map(|_| ())
    }

    /// [`Ports::send`] without waiting: `Ok(false)` when the destination has no room
    /// now (nothing was sent). A message to another node that goes in pieces waits,
    /// once its first pieces left, until the rest are queued (it is under way).
    pub fn try_send(&self, port: u8, data: &[u8]) -> Result<bool> {
        self.app.send(&self.ep, port, data, false)
    }

    /// Signals `port` (as a handler's [`Delivery::signal`] does).
    pub fn signal(&self, port: u8) {
        self.app.table.lock().slots[usize::from(port)].signals += 1;
    }

    /// Signals of `port` not yet consumed.
    pub fn signals(&self, port: u8) -> u64 {
        self.app.table.lock().slots[usize::from(port)].signals
    }

    /// Waits until `port` has been signalled `n` times and consumes the signals
    /// (GAMMA's `gamma_wait`), running the handlers meanwhile. Polls for the time
    /// [`Ports::set_wait`] gives, then sleeps on the endpoint's descriptor.
    pub fn wait(&self, port: u8, n: u64) -> Result<()> {
        self.app
            .wait(&self.ep, port, n, self.wait.get(), None)
            .map(|_| ())
    }

    /// [`Ports::wait`] for at most `timeout`: `Ok(false)` when it passed first (no
    /// signal was consumed).
    pub fn wait_within(&self, port: u8, n: u64, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        self.app
            .wait(&self.ep, port, n, self.wait.get(), Some(deadline))
    }

    /// Makes progress once, then consumes `n` signals of `port` if it has them.
    pub fn test(&self, port: u8, n: u64) -> Result<bool> {
        self.progress()?;
        Ok(self.app.take_signals(port, n))
    }

    /// Makes progress: delivers what has arrived (running the handlers) and sends what
    /// handlers queued, for at most [`PROGRESS_ROUNDS`] rounds of the endpoint (a peer
    /// that keeps sending cannot hold the caller here). Returns the first port error no
    /// error handler took.
    pub fn progress(&self) -> Result<()> {
        self.app.take_error()?;
        for _ in 0..PROGRESS_ROUNDS {
            if !self.app.poll(&self.ep)? {
                break;
            }
        }
        self.app.take_error()
    }

    /// How [`Ports::wait`] waits: [`WaitMode::Hybrid`] with GAMMA's 50 µs by default.
    pub fn set_wait(&self, mode: WaitMode) {
        self.wait.set(mode);
    }

    /// The ports' counters.
    pub fn stats(&self) -> PortStats {
        self.app.table.lock().stats.clone()
    }
}

/// A job's barrier keeps the ports going while it waits (`Job::barrier_progressing`):
/// what arrives is delivered and broadcasts are forwarded; port errors stay for the
/// application's next call.
impl crate::job::Progress for Ports {
    fn progress(&self) -> Result<()> {
        for _ in 0..PROGRESS_ROUNDS {
            if !self.app.poll(&self.ep)? {
                break;
            }
        }
        Ok(())
    }

    fn failed_ranks(&self) -> Vec<u32> {
        self.ep.failed_ranks()
    }
}

impl Drop for Ports {
    fn drop(&mut self) {
        // Answers handlers queued are worth a moment: their peers may wait for them.
        self.app.linger(&self.ep, Duration::from_secs(1));
    }
}
