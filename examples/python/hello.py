"""Hello from every rank, and a greeting passed around a ring.

    quiver run -n 4 python3 examples/python/hello.py
    mpirun -n 4 python3 examples/python/hello.py
"""

import quiver


def main():
    job = quiver.Job.from_env()
    print(f"hello from rank {job.rank} of {job.size} on node {job.nid} ({job.launcher})")
    with job.tagged(1) as comm:
        if job.size > 1:
            right = (job.rank + 1) % job.size
            left = (job.rank - 1) % job.size
            if job.rank == 0:
                comm.send(["hello", 0], dest=right)
                greeting = comm.recv(source=left)
                print(f"rank 0: the greeting came back through {greeting[1:]}")
            else:
                greeting = comm.recv(source=left)
                comm.send(greeting + [job.rank], dest=right)
    job.barrier()


if __name__ == "__main__":
    main()
