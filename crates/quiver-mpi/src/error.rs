//! MPI's errors as the core reports them: an error class (MPI's list, which every ABI
//! numbers its own way) and a sentence saying what went wrong.

use std::fmt;

/// MPI's error classes that the core reports. A front-end maps each to its ABI's number
/// (`MPI_ERR_COMM`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// An invalid buffer pointer.
    Buffer,
    /// An invalid count.
    Count,
    /// An invalid or uncommitted datatype.
    Type,
    /// An invalid tag.
    Tag,
    /// An invalid or freed communicator.
    Comm,
    /// An invalid rank.
    Rank,
    /// An invalid request.
    Request,
    /// An invalid root.
    Root,
    /// An invalid group.
    Group,
    /// An invalid reduction operation, or one not defined on the datatype.
    Op,
    /// An invalid argument of another kind.
    Arg,
    /// A message longer than its receive buffer.
    Truncate,
    /// A peer failed, or the network failed in a way the library could not repair.
    Other,
    /// A bug or an impossible state in the library.
    Intern,
    /// The library is not initialised, or already finalised.
    NotInitialized,
    /// An MPI call this library does not implement.
    Unsupported,
    /// An invalid window (one-sided).
    Win,
    /// A one-sided call out of its synchronization (an unlock without a lock, a window
    /// freed while locked).
    RmaSync,
    /// A one-sided access outside the target's window.
    RmaRange,
    /// An invalid displacement unit or target displacement.
    Disp,
    /// Memory could not be allocated.
    NoMem,
}

/// An MPI error: its class and what happened. One pointer wide (the details are
/// boxed), so that the core's results stay small on the paths that succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiError(Box<Details>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Details {
    class: Class,
    message: String,
    status: Option<crate::Status>,
}

impl MpiError {
    /// An error of `class` saying `message`.
    #[cold]
    pub fn new(class: Class, message: impl Into<String>) -> MpiError {
        MpiError(Box::new(Details {
            class,
            message: message.into(),
            status: None,
        }))
    }

    /// The error class.
    pub fn class(&self) -> Class {
        self.0.class
    }

    /// What happened, for `MPI_Error_string`.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The status of the receive that failed, where there is one (a truncated
    /// message's source, tag and the bytes received).
    pub fn status(&self) -> Option<crate::Status> {
        self.0.status
    }

    /// The error with `status` as its receive's status.
    pub fn with_status(mut self, status: Option<crate::Status>) -> MpiError {
        self.0.status = status;
        self
    }
}

impl fmt::Display for MpiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::error::Error for MpiError {}

/// quiver's errors in MPI's classes: a truncated message is `MPI_ERR_TRUNCATE`, the rest
/// (a failed peer, a network that gave up) `MPI_ERR_OTHER`, with quiver's sentence.
impl From<quiver::Error> for MpiError {
    fn from(e: quiver::Error) -> MpiError {
        let class = match e {
            quiver::Error::Truncated { .. } => Class::Truncate,
            quiver::Error::Rma(quiver::rma::RmaError::OutOfBounds { .. }) => Class::RmaRange,
            _ => Class::Other,
        };
        MpiError::new(class, format!("quiver: {e}"))
    }
}

/// The core's results.
pub type Result<T, E = MpiError> = std::result::Result<T, E>;

/// Fails with `class` and `message` unless `ok`.
pub(crate) fn check(ok: bool, class: Class, message: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(MpiError::new(class, message()))
    }
}
