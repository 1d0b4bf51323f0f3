"""The exceptions of quiver: every error of the library is a :class:`quiver.Error`.

The extension module raises these classes (it looks them up here by name). Errors about
the arguments themselves are Python's own: ``TypeError`` for an object without the
buffer protocol, ``BufferError`` for a buffer that is not contiguous or is read-only,
``ValueError``/``OverflowError`` for a rank or tag out of range.
"""

import builtins


class Error(Exception):
    """Base class of every error quiver reports."""


class ConfigError(Error):
    """A ``QUIVER_*`` variable is missing or invalid, or the configuration is inconsistent
    (for instance: started outside a job, without ``QUIVER_RENDEZVOUS``)."""


class RendezvousError(Error):
    """The rendezvous store could not be reached or answered badly."""


class RankError(Error, builtins.ValueError):
    """A rank outside ``0 .. size-1``."""


class MessageTooLargeError(Error, builtins.ValueError):
    """A message longer than ``QUIVER_MAX_MESSAGE`` (endpoints)."""


class NoTargetError(Error):
    """``Endpoint.write`` before ``target`` or ``target_rank``."""


class DpidInUseError(Error):
    """The DPID is already open on this rank."""


class PeerNotFoundError(Error):
    """The peer endpoint did not appear in time: is it opened on that rank?"""


class PeerClosedError(Error):
    """The peer endpoint was closed. ``rank`` says which."""


class PeerFailedError(Error):
    """A peer failed (its process is gone, or it stopped answering). ``rank`` says which;
    every later operation towards it fails the same way."""


class ChannelError(Error):
    """A network channel lost data or failed."""


class SharedMemoryError(Error):
    """A shared-memory segment is unusable, owned by someone else, or full of senders."""


class ProtocolError(Error):
    """A tagged transfer failed in a way the protocol cannot repair."""


class TruncatedError(Error):
    """A tagged message was longer than the receive buffer, which holds its start.
    Attributes: ``count`` (the message's length), ``capacity`` (the buffer's), ``source``,
    ``tag``."""


class CancelledError(Error):
    """The receive was cancelled before a message matched it."""


class ClosedError(Error):
    """The endpoint is closed (or was closed while the operation was pending)."""


class TimeoutError(Error, builtins.TimeoutError):
    """A call with a time limit hit it."""


class IoError(Error, builtins.OSError):
    """An operating-system call failed."""


class PortError(Error):
    """A port could not take a message or send one (no buffer bound, a message longer
    than the buffer, no destination bound, a failed destination) and no error handler
    took the error."""


class RmaError(Error):
    """A one-sided operation failed: a range outside the window, a misaligned word, a
    window the target does not have (never allocated, or freed), or a target that
    refused it."""


class ThreadError(Error):
    """An endpoint (or one of its requests) was used from a thread other than the one that
    opened it. Open one endpoint per thread (each with its own DPID)."""


__all__ = [
    "Error",
    "ConfigError",
    "RendezvousError",
    "RankError",
    "MessageTooLargeError",
    "NoTargetError",
    "DpidInUseError",
    "PeerNotFoundError",
    "PeerClosedError",
    "PeerFailedError",
    "ChannelError",
    "SharedMemoryError",
    "ProtocolError",
    "TruncatedError",
    "CancelledError",
    "ClosedError",
    "TimeoutError",
    "IoError",
    "PortError",
    "RmaError",
    "ThreadError",
]

# Shown as quiver.Error, quiver.TruncatedError... (the package re-exports them).
for _name in __all__:
    globals()[_name].__module__ = "quiver"
del _name
