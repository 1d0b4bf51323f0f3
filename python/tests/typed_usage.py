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
    with job.ports(3) as ports:

        def on_message(d: quiver.Delivery) -> None:
            rank, port = d.origin
            d.send(1, d.data[::-1])
            d.signal()
            print(rank, port, len(d))

        ports.bind(0, buffer=64, handler=on_message, on_error=print)
        ports.bind(1, to=(1, 0))
        ports.bind(2, to_all=0)
        ports.send(1, np.arange(4, dtype=np.uint8))
        if ports.wait(0, timeout=1.0):
            got = ports.read(0)
            if got is not None:
                msg, (sender, sent_through) = got
                print(msg.hex(), sender, sent_through, ports.stats()["delivered"])
    with job.rma(4) as rma:
        w: quiver.Window = rma.allocate(1 << 16)
        rma.put(1, w, 0, np.arange(8, dtype=np.uint64))
        rma.flush(1)
        back = bytearray(64)
        rma.Get(1, w, 0, back)
        old: int = rma.fetch_add(0, w, 0, 1) + rma.combine(1, "max")
        rma.put_strided(1, w, (0, 64, 8, 4), np.zeros(4, dtype=np.uint64), 8)
        rma.get_indexed(1, w, [0, 8], back, [8, 0], 8)
        try:
            rma.get(1, w, 1 << 20, 1)
        except quiver.RmaError as e:
            print(e, old, w.word(0), len(w), w.read(0, 8).hex(), rma.stats()["puts"])
        rma.free(w)
