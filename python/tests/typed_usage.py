"""A program that uses the package as its stubs describe it: test_typing.py has mypy
check it (it is not run)."""

import numpy as np

import quiver


def main() -> None:
    job = quiver.Job.from_env()
    with job.tagged(1) as comm:
        st = quiver.Status()
        comm.Send(np.zeros(3), 1, 2)
        comm.Recv(bytearray(3), quiver.ANY_SOURCE, quiver.ANY_TAG, status=st)
        r = comm.Irecv(bytearray(3))
        i, obj = quiver.Request.waitany([r])
        n: int = st.count + i
        found = comm.Iprobe()
        if found is not None:
            print(found.source, n, obj)
        try:
            comm.recv(0)
        except quiver.TruncatedError as e:
            print(e)
        done: bool = quiver.Request.Waitall([comm.isend({"a": 1}, 1)])
        print(done)
    with job.open(2) as ep:
        ep.target_rank(1)
        ep.write(memoryview(b"x"))
        data, src = ep.read(timeout=1.0)
        print(data.decode(), src.rank, ep.stats()["msgs_sent"])
