"""mpi4py as its users write it, on whichever libmpi.so.12 it loads, every result
checked: pickled objects (send/recv, isend/irecv, bcast, gather, allgather, alltoall,
reduce), buffers (Allreduce with a predefined and with a Python operation, which asks
MPI about the datatype from inside the reduction), Split and Dup, probes, a cancelled
receive. Prints "mpi4py checks: OK" on rank 0 when every check held on every rank."""
from array import array

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


# Objects.
right, left = (rank + 1) % size, (rank - 1) % size
req = comm.isend({"from": rank, "data": list(range(rank + 3))}, dest=right, tag=3)
got = comm.recv(source=left, tag=3)
req.wait()
check(got == {"from": left, "data": list(range(left + 3))}, f"ring object {got}")
check(comm.bcast({"root": size - 1} if rank == size - 1 else None, root=size - 1) == {"root": size - 1}, "bcast")
g = comm.gather(rank * rank, root=0)
check(rank != 0 or g == [r * r for r in range(size)], f"gather {g}")
check(comm.allgather(str(rank)) == [str(r) for r in range(size)], "allgather")
check(comm.alltoall([(rank, r) for r in range(size)]) == [(r, rank) for r in range(size)], "alltoall")
check(comm.reduce(rank + 1, op=MPI.SUM, root=0) in (None, size * (size + 1) // 2), "reduce")
check(comm.allreduce(rank, op=MPI.MAX) == size - 1, "allreduce max")

# Buffers, a predefined and a Python operation.
a = array("d", [rank + 0.5] * 4)
b = array("d", [0.0] * 4)
comm.Allreduce(a, b, op=MPI.SUM)
check(list(b) == [sum(r + 0.5 for r in range(size))] * 4, f"Allreduce {list(b)}")


def concat(inbuf, inoutbuf, datatype):
    # inout = in "then" inout, on pairs (value, scale): the ranks' digits in order.
    lb, extent = datatype.Get_extent()
    x = memoryview(inbuf).cast("B").cast("q")
    y = memoryview(inoutbuf).cast("B").cast("q")
    for i in range(0, len(y), 2):
        y[i] = x[i] * y[i + 1] + y[i]
        y[i + 1] = x[i + 1] * y[i + 1]


op = MPI.Op.Create(concat, commute=False)
pair = MPI.INT64_T.Create_contiguous(2).Commit()
mine = array("q", [rank + 1, 10])
out = array("q", [0, 0])
comm.Allreduce([mine, 1, pair], [out, 1, pair], op=op)
check(out[0] == int("".join(str(r + 1) for r in range(size))), f"Python operation {list(out)}")
op.Free()
pair.Free()

# Communicators.
half = comm.Split(rank % 2, -rank)
check(half.Get_size() == (size + 1 - rank % 2) // 2, "Split size")
check(half.allreduce(1) == half.Get_size(), "allreduce on a split")
dup = comm.Dup()
if size >= 2 and rank < 2:
    peer = 1 - rank
    r1 = dup.irecv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    comm.send("world", dest=peer, tag=1)
    dup.send("dup", dest=peer, tag=1)
    check(comm.recv(source=peer, tag=1) == "world", "message on the world")
    check(r1.wait() == "dup", "message on the duplicate")
    status = MPI.Status()
    comm.send(b"x" * 100, dest=peer, tag=9)
    comm.Probe(source=peer, tag=9, status=status)
    check(status.Get_source() == peer and status.Get_tag() == 9, "probe")
    comm.recv(source=peer, tag=9)
    # A receive nothing matches, cancelled.
    buf = bytearray(8)
    r = comm.Irecv(buf, source=peer, tag=12345)
    r.Cancel()
    st = MPI.Status()
    r.Wait(st)
    check(st.Is_cancelled(), "cancelled receive")
dup.Free()
half.Free()

total = comm.allreduce(len(failures))
if failures:
    print(f"rank {rank}: {failures}")
if rank == 0:
    print("mpi4py checks: OK" if total == 0 else f"mpi4py checks: {total} FAILED")
