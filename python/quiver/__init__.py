"""quiver for Python: the ranks of a job, Directed Point endpoints, tagged send and
receive with mpi4py's names, GAMMA's active-message ports and one-sided operations on
windows.

Started as a job (``quiver run -n 2 python3 prog.py``, or ``mpirun -n 2 python3 prog.py``)::

    import numpy as np
    import quiver

    job = quiver.Job.from_env()
    with job.tagged(1) as comm:              # every rank opens the same DPID
        if comm.rank == 0:
            comm.Send(np.arange(10.0), dest=1, tag=7)
            comm.send({"any": "picklable"}, dest=1)
        else:
            a = np.empty(10)
            comm.Recv(a, source=0, tag=7)    # received in place, no copy in Python
            obj = comm.recv(source=0)

Upper-case calls (``Send``, ``Recv``, ``Isend``, ``Irecv``, ``Probe``, ``Iprobe``) move
the bytes of any contiguous object with the buffer protocol (numpy arrays, ``bytearray``,
``memoryview``, ``bytes`` for sending) where they lie; lower-case ones (``send``,
``recv``, ``isend``, ``irecv``) pickle. Blocking calls release the GIL and answer Ctrl-C
(``KeyboardInterrupt``; ``Send``/``Recv``/``send``/``recv`` abandon their operation
first, ``Request.wait`` leaves it pending; ``target`` and a first send to a rank, which
wait for the peer's endpoint, notice it when they return). An endpoint, and its
requests, belong to the thread that opened it, in the process that opened it
(``ThreadError`` elsewhere, also in a child made by ``fork()``).

GAMMA's ports (``job.ports(dpid)``): a port is bound to a destination, a receive
buffer and handlers; a send names only the port::

    with job.ports(2) as ports:
        ports.bind(0, buffer=4096, handler=lambda d: d.signal())
        ports.bind(1, to=(1 - job.rank, 0))  # or to_all=0: a broadcast
        ports.barrier()                       # bound everywhere before anyone sends
        ports.send(1, b"hello")
        ports.wait(0)                         # the handler signalled
        data, (rank, port) = ports.read(0)

One-sided operations (``job.rma(dpid)``): every rank allocates its windows in the same
order, then reads and writes the others' parts::

    with job.rma(3) as rma:
        w = rma.allocate(1 << 20)             # this rank's part, zeroed
        rma.barrier()
        rma.put(1 - job.rank, w, 0, b"deposited")
        rma.flush(1 - job.rank)               # in the other rank's window now
        old = rma.fetch_add(0, w, 8, 1)       # a 64-bit word of rank 0's part
        rma.barrier()
        data = w.read(0, 9)                   # this rank's own part
        rma.free(w)                           # collective

Every error of the library is a :class:`quiver.Error` (see ``quiver._errors``).
"""

import atexit as _atexit

from ._errors import (
    Error,
    ConfigError,
    RendezvousError,
    RankError,
    MessageTooLargeError,
    NoTargetError,
    DpidInUseError,
    PeerNotFoundError,
    PeerClosedError,
    PeerFailedError,
    ChannelError,
    SharedMemoryError,
    ProtocolError,
    TruncatedError,
    CancelledError,
    ClosedError,
    TimeoutError,
    IoError,
    PortError,
    RmaError,
    ThreadError,
)
from ._quiver import (
    ANY_SOURCE,
    ANY_TAG,
    UNDEFINED,
    Delivery,
    Endpoint,
    Job,
    Ports,
    Request,
    Rma,
    Source,
    Status,
    Tagged,
    Window,
    __version__,
    _close_all,
)

# Endpoints still open when the interpreter exits are closed (a tagged endpoint's close
# sends the answers its peers may still wait for).
_atexit.register(_close_all)

__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "UNDEFINED",
    "Delivery",
    "Endpoint",
    "Job",
    "Ports",
    "Request",
    "Rma",
    "Source",
    "Status",
    "Tagged",
    "Window",
    "__version__",
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
