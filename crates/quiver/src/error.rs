//! The error type of quiver: one enum whose variants say which peer, which variable or
//! which limit is involved, so that a user can act on the message.

use std::io;
use std::time::Duration;

/// Result alias used throughout quiver.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every error quiver reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A variable needed to join a job is not set.
    #[error("environment variable {var} is not set: {hint}")]
    MissingEnv {
        /// The variable's name.
        var: &'static str,
        /// What to set, and how.
        hint: String,
    },
    /// A variable is set to a value quiver cannot use.
    #[error("environment variable {var}={value:?} is invalid: {reason}")]
    InvalidEnv {
        /// The variable's name.
        var: String,
        /// The value found.
        value: String,
        /// Why it is rejected and what is accepted.
        reason: String,
    },
    /// Inconsistent configuration (set through the API or the environment).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The rendezvous store could not be reached or answered badly.
    #[error("rendezvous {url}: {reason}")]
    Rendezvous {
        /// The store's URL (`tcp://HOST:PORT` or `file:///DIR`).
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The launcher's key-value service (PMIx, PMI-2, PMI-1), through which the ranks
    /// of a job started by `mpirun`, `mpiexec` or `srun` find each other, failed or
    /// answered badly.
    #[error("launcher service {service}: {reason}")]
    Launcher {
        /// The service and how it was reached (`PMI-2 over descriptor 6 (PMI_FD)`).
        service: String,
        /// What went wrong.
        reason: String,
    },
    /// A message larger than the configured maximum.
    #[error("message of {len} bytes exceeds the maximum message size of {max} bytes (raise QUIVER_MAX_MESSAGE on every rank)")]
    MessageTooLarge {
        /// Length of the message.
        len: usize,
        /// The maximum the receiving endpoint accepts.
        max: usize,
    },
    /// `write` was called before `target`.
    #[error("no target: call target() or target_rank() before write()")]
    NoTarget,
    /// A rank outside `0..size`.
    #[error("rank {rank} does not exist: the job has {size} ranks")]
    NoSuchRank {
        /// The rank asked for.
        rank: u32,
        /// The job size.
        size: u32,
    },
    /// No endpoint (node, DPID) is known.
    #[error("no endpoint with DPID {dpid} on node {nid} was opened within {waited:?}")]
    NoSuchEndpoint {
        /// Node id.
        nid: u32,
        /// Endpoint id.
        dpid: u16,
        /// How long quiver waited for it to appear.
        waited: Duration,
    },
    /// The peer endpoint did not appear in time.
    #[error("endpoint (rank {rank}, DPID {dpid}) did not appear within {waited:?}; is it opened on that rank?")]
    PeerNotFound {
        /// Rank of the peer.
        rank: u32,
        /// DPID of the peer endpoint.
        dpid: u16,
        /// How long quiver waited.
        waited: Duration,
    },
    /// The DPID is already open in this process.
    #[error("DPID {dpid} is already open on this rank")]
    DpidInUse {
        /// The DPID.
        dpid: u16,
    },
    /// The peer endpoint was closed.
    #[error("endpoint (rank {rank}, DPID {dpid}) was closed by its owner")]
    PeerClosed {
        /// Rank of the peer.
        rank: u32,
        /// DPID of the peer endpoint.
        dpid: u16,
    },
    /// A peer failed: its process is gone (same node), or it was silent (no heartbeat)
    /// or left our frames unacknowledged for longer than `QUIVER_PEER_TIMEOUT`
    /// (network). Every later
    /// operation towards it fails the same way; other peers are not affected.
    #[error("rank {rank} (DPID {dpid}) failed: {reason}")]
    PeerFailed {
        /// Rank of the peer.
        rank: u32,
        /// DPID of the peer endpoint.
        dpid: u16,
        /// What was observed.
        reason: String,
    },
    /// The receiving endpoint's shared-memory area has no free sender slot.
    #[error("endpoint (rank {rank}, DPID {dpid}) has no free sender slot ({slots} in use); raise QUIVER_SHM_SLOTS")]
    TooManySenders {
        /// Rank of the receiver.
        rank: u32,
        /// DPID of the receiver.
        dpid: u16,
        /// Slots available.
        slots: u32,
    },
    /// A shared-memory segment is unusable (wrong magic, version or layout; too small).
    #[error("shared-memory segment {name}: {reason}")]
    Segment {
        /// Segment name under /dev/shm.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A shared-memory object this job needs belongs to another user, or others may
    /// open it: another user took the name first (or changed its mode). quiver neither
    /// reads nor writes it.
    #[error(
        "shared-memory object {name} belongs to uid {uid} with mode {mode:o}, not to this job's \
         user {expected} with mode 600: another user holds the name; remove it (as root or \
         as uid {uid}: rm /dev/shm{name}) or run the job under another job id"
    )]
    SegmentSquatted {
        /// The object's name under /dev/shm.
        name: String,
        /// Its owner.
        uid: u32,
        /// Its permission bits.
        mode: u32,
        /// The job's user (this process's).
        expected: u32,
    },
    /// A channel detected lost data (a gap in sequence numbers) and dropped the partial message.
    #[error("channel from rank {rank} DPID {dpid} lost {frames} frame(s)")]
    Lost {
        /// Rank of the sender.
        rank: u32,
        /// DPID of the sender.
        dpid: u16,
        /// Frames missing.
        frames: u32,
    },
    /// A network channel failed: a corrupted frame without retransmission
    /// (`QUIVER_RELIABILITY=none`), a peer that ignored flow control, or a peer that
    /// stopped answering.
    #[error("channel with rank {rank} DPID {dpid} failed: {reason}")]
    ChannelFailed {
        /// Rank of the peer.
        rank: u32,
        /// DPID of the peer endpoint.
        dpid: u16,
        /// What happened.
        reason: String,
    },
    /// A blocking call hit its deadline.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// A tagged message is longer than the receive buffer: the buffer holds its first
    /// `capacity` bytes and the rest is discarded.
    #[error("message of {len} bytes from rank {rank} (tag {tag}) truncated to the receive buffer of {capacity} bytes")]
    Truncated {
        /// Length of the message sent.
        len: u64,
        /// Length of the receive buffer.
        capacity: usize,
        /// Rank of the sender.
        rank: u32,
        /// Tag of the message.
        tag: u32,
    },
    /// A posted receive was cancelled before a message matched it.
    #[error("the receive was cancelled")]
    Cancelled,
    /// A tagged transfer failed in a way the protocol cannot repair (a same-node pull
    /// from a buffer that is not mapped, for instance).
    #[error("tagged-protocol failure with rank {rank}: {reason}")]
    Protocol {
        /// Rank of the peer.
        rank: u32,
        /// What is wrong with it.
        reason: String,
    },
    /// The endpoint is closed.
    #[error("the endpoint is closed")]
    Closed,
    /// A port error no error handler took (GAMMA's ports: a message for a port without
    /// a buffer or too long for it, a send through a port without a destination...).
    #[error(transparent)]
    Port(PortError),
    /// A one-sided operation on a window failed (`crate::rma`): refused by the target,
    /// or out of the window's bounds at the origin.
    #[error(transparent)]
    Rma(RmaError),
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What quiver was doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with what quiver was doing.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// True for errors after which the same call may succeed later (timeouts).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Timeout(_))
    }
}

/// Who sent a message: the rank and the port it sent through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The sender's rank.
    pub rank: u32,
    /// The port it sent through.
    pub port: u8,
}

/// Why a one-sided operation on a window failed (`crate::rma`). A request the origin
/// can check (the window's length is in its key) fails there, before anything is sent;
/// the target checks every request again and refuses what fails, and the origin hears
/// of it from the answer (a get, an atomic) or from its next flush (puts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RmaError {
    /// The target has no such window (never allocated there, or freed since).
    #[error("rank {rank} has no window {window} (never allocated, or freed)")]
    NoWindow {
        /// The target.
        rank: u32,
        /// The window's number.
        window: u32,
    },
    /// The range does not lie inside the window.
    #[error("{len} bytes at offset {offset} of window {window} of rank {rank} lie outside its {size} bytes")]
    OutOfBounds {
        /// The target.
        rank: u32,
        /// The window's number.
        window: u32,
        /// The range's offset.
        offset: u64,
        /// The range's length.
        len: u64,
        /// The window's length at the target.
        size: u64,
    },
    /// An atomic on a word that is not 8-byte aligned in the window.
    #[error(
        "offset {offset} of window {window} of rank {rank} is not 8-byte aligned for an atomic"
    )]
    Misaligned {
        /// The target.
        rank: u32,
        /// The window's number.
        window: u32,
        /// The word's offset.
        offset: u64,
    },
    /// Puts to `rank` since the last flush were refused there (the flush reports how
    /// many, and why the first was).
    #[error("rank {rank} refused {count} put(s) since the last flush: {reason}")]
    PutsRefused {
        /// The target.
        rank: u32,
        /// How many.
        count: u64,
        /// Why the first was.
        reason: String,
    },
    /// The two sides of a strided or indexed transfer disagree (element size or
    /// count), or the local side does not fit its buffer; nothing was sent.
    #[error("bad layout: {reason}")]
    BadLayout {
        /// What is wrong.
        reason: String,
    },
    /// An accumulate that cannot be applied: its operation is not defined on its
    /// element, its data is not a whole number of elements or does not match the range
    /// (said before anything is sent), or the target refused it for that reason.
    #[error("bad accumulate: {reason}")]
    BadAccumulate {
        /// What is wrong.
        reason: String,
    },
    /// The target answered with something the origin could not read.
    #[error("rank {rank} answered a one-sided request with an unknown status")]
    BadAnswer {
        /// The target.
        rank: u32,
    },
}

/// What goes to a port's error handler (GAMMA's ports, `crate::ports`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PortError {
    /// A message arrived on a port with no buffer bound; it was not delivered.
    #[error("a message of {len} bytes from rank {} (port {}) arrived on port {port}, which has no buffer bound", from.rank, from.port)]
    NoBuffer {
        /// The port.
        port: u8,
        /// The sender.
        from: Origin,
        /// The message's length.
        len: usize,
    },
    /// A message longer than the port's buffer arrived; it was not delivered and the
    /// buffer is unchanged.
    #[error("a message of {len} bytes from rank {} (port {}) does not fit port {port}'s buffer of {capacity} bytes", from.rank, from.port)]
    Overflow {
        /// The port.
        port: u8,
        /// The sender.
        from: Origin,
        /// The message's length.
        len: usize,
        /// The buffer's length.
        capacity: usize,
    },
    /// A peer sent to the library's reserved port.
    #[error("rank {} (port {}) sent {len} bytes to the reserved port {port}", from.rank, from.port)]
    Reserved {
        /// The port.
        port: u8,
        /// The sender.
        from: Origin,
        /// The message's length.
        len: usize,
    },
    /// A send through a port that has no destination bound.
    #[error("port {port} has no destination bound")]
    NoDestination {
        /// The port.
        port: u8,
    },
    /// The port's destination failed or closed: what was sent to it may not have been
    /// delivered, and sends through the port fail.
    #[error("the destination of port {port}, rank {rank}, failed or closed")]
    DestinationFailed {
        /// The port.
        port: u8,
        /// The destination's rank.
        rank: u32,
    },
    /// A send through the port failed for another reason (the call returned the error).
    #[error("a send through port {port} to rank {rank} failed: {reason}")]
    SendFailed {
        /// The port.
        port: u8,
        /// The destination's rank.
        rank: u32,
        /// What failed.
        reason: String,
    },
    /// A handler's answer found the outbox full (it holds answers until their routes
    /// have room); the answer was not sent.
    #[error("an answer through port {port} found the outbox full")]
    OutboxFull {
        /// The port.
        port: u8,
    },
}

impl PortError {
    /// The port the error is about.
    pub fn port(&self) -> u8 {
        match self {
            PortError::NoBuffer { port, .. }
            | PortError::Overflow { port, .. }
            | PortError::Reserved { port, .. }
            | PortError::NoDestination { port }
            | PortError::DestinationFailed { port, .. }
            | PortError::SendFailed { port, .. }
            | PortError::OutboxFull { port } => *port,
        }
    }
}
