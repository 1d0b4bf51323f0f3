"""Tagged ping-pong between ranks 0 and 1 with numpy buffers (Send/Recv, no copy in
Python): rank 0 prints the one-way latency (half the round trip) per message size.

    quiver run -n 2 python3 examples/python/pingpong.py
    mpirun -n 2 python3 examples/python/pingpong.py --sizes 8,1K,1M --iters 2000

Each round trip is timed on rank 0 after untimed warm-up ones, as `quiver bench
pingpong --api tagged` does; the median and the minimum are printed (``--json``: one
JSON object per size). Every received message is checked once at the end of its size.
With ``--api endpoint`` the ping-pong uses a Directed Point endpoint instead (``write``
from the array, ``read`` returning a new ``bytes``), as ``quiver bench pingpong``
does with its default API.
"""

import argparse
import json
import sys
import time

import numpy as np

import quiver

TAG = 1


def parse_size(text):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    unit = text[-1:] if text[-1:] in units and text[-1:] != "" else ""
    return int(text[: len(text) - len(unit)]) * units[unit]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="0,8,64,1K,8K,64K,1M,4M",
                   help="message sizes, comma-separated (K, M suffixes)")
    p.add_argument("--iters", type=int, default=10000,
                   help="timed round trips per size (fewer for large sizes)")
    p.add_argument("--warmup", type=int, default=1000, help="untimed round trips first")
    p.add_argument("--json", action="store_true", help="one JSON object per size")
    p.add_argument("--dpid", type=int, default=7)
    p.add_argument("--api", choices=["tagged", "endpoint"], default="tagged")
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]

    job = quiver.Job.from_env()
    if job.size != 2:
        sys.exit(f"pingpong needs 2 ranks, not {job.size}")
    if args.api == "tagged":
        with job.tagged(args.dpid) as comm:
            run(args, job, sizes, comm.Send, comm.Recv)
    else:
        with job.open(args.dpid) as ep:
            ep.target_rank(1 - job.rank)
            # Flattened to bytes on arrival: the check compares the bytes.
            got = {}

            def send(buf, _peer, _tag):
                ep.write(buf)

            def recv(buf, _peer, _tag):
                got["last"] = ep.read()[0]

            run(args, job, sizes, send, recv, got)


def run(args, job, sizes, Send, Recv, got=None):
    peer = 1 - job.rank
    if job.rank == 0 and not args.json:
        print(f"{'bytes':>9} {'median us':>10} {'min us':>8}  "
              f"(one-way, {args.api}, {job.launcher})")
    for size in sizes:
        # Large messages: fewer rounds, so that each size takes about as long.
        iters = max(20, min(args.iters, (256 << 20) // max(size, 1)))
        warmup = max(2, min(args.warmup, iters // 10))
        # Each rank sends its own pattern and checks that it received the other's.
        mine = np.full(size, 0x5A + job.rank, dtype=np.uint8)
        theirs = np.full(size, 0x5A + peer, dtype=np.uint8).tobytes()
        ping = mine
        pong = np.empty(size, dtype=np.uint8)
        if job.rank == 1:
            for _ in range(warmup + iters):
                Recv(pong, peer, TAG)
                Send(ping, peer, TAG)
            received = got["last"] if got is not None else pong.tobytes()
            if received != theirs:
                sys.exit(f"size {size}: the ping differs from what rank 0 sent")
            continue
        clock = time.perf_counter_ns
        samples = []
        append = samples.append
        for i in range(warmup + iters):
            t0 = clock()
            Send(ping, peer, TAG)
            Recv(pong, peer, TAG)
            append(clock() - t0)
        received = got["last"] if got is not None else pong.tobytes()
        if received != theirs:
            sys.exit(f"size {size}: the pong differs from what rank 1 sent")
        timed = sorted(samples[warmup:])
        median = timed[len(timed) // 2] / 2e3
        least = timed[0] / 2e3
        if args.json:
            print(json.dumps({"bench": "pingpong", "api": f"python-{args.api}", "size": size,
                              "iters": iters, "latency_us_median": round(median, 4),
                              "latency_us_min": round(least, 4)}), flush=True)
        else:
            print(f"{size:>9} {median:>10.3f} {least:>8.3f}", flush=True)

if __name__ == "__main__":
    main()
