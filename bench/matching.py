#!/usr/bin/env python3
"""bench/matching.py: tag matching under load, quiver beside Open MPI and MPICH.

The 8-byte ping-pong (one-way = round trip / 2, median) while each rank holds N
operations the ping-pong does not match, in one of three queues: N receives posted from
the peer for other tags (posted), N receives posted from any source for other tags
(wildcard), N arrived messages with other tags not yet received (unexpected); N = 0, 1,
64, 1024. quiver: `quiver bench match`; the MPIs: `osu_mpi match` (bench/progs/osu_mpi.c,
the same procedure). Systems alternate within each repetition; both processes are pinned
to cores 0 and 1. Prints one markdown table: median (min-max) over the repetitions.

usage: python3 bench/matching.py [--reps 3] [--out target/bench-matching]
"""

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUEUES = ("posted", "wildcard", "unexpected")
COUNTS = (0, 1, 64, 1024)


def quiver(q):
    out = subprocess.run(
        [q, "bench", "match", "--outstanding", ",".join(map(str, COUNTS)), "--format", "json"],
        capture_output=True, text=True, check=True).stdout
    got = {}
    for line in out.splitlines():
        if line.startswith("{"):
            v = json.loads(line)
            got[(v["queue"], v["outstanding"])] = v["latency_us_median"]
    return got


def mpi(launcher, exe):
    got = {}
    for queue in QUEUES:
        for n in COUNTS:
            out = subprocess.run(launcher + [exe, "match", queue, str(n), "1"],
                                 capture_output=True, text=True, timeout=300)
            m = re.search(r"oneway_us_median=([0-9.]+)", out.stdout)
            if out.returncode != 0 or not m:
                raise RuntimeError(f"{exe} match {queue} {n}: {out.stderr.strip()[-300:]}")
            got[(queue, n)] = float(m.group(1))
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "target" / "bench-matching"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "quiver-cli"], cwd=ROOT, check=True)
    systems = {"quiver tagged": lambda: quiver(str(ROOT / "target" / "release" / "quiver"))}
    for name, cc, launcher in (
            ("Open MPI", "mpicc.openmpi", ["mpirun.openmpi", "--allow-run-as-root", "-n", "2",
                                           "--bind-to", "core", "--map-by", "core"]),
            ("MPICH", "mpicc.mpich", ["mpirun.mpich", "-n", "2", "-bind-to", "core"])):
        if not shutil.which(cc) or not shutil.which(launcher[0]):
            print(f"{name}: skipped ({cc} or {launcher[0]} missing)", file=sys.stderr)
            continue
        exe = out / f"osu_mpi_{cc.split('.')[1]}"
        subprocess.run([cc, "-O2", "-o", str(exe), str(ROOT / "bench" / "progs" / "osu_mpi.c")],
                       check=True)
        systems[name] = lambda launcher=launcher, exe=str(exe): mpi(launcher, exe)
    runs = {name: [] for name in systems}
    names = list(systems)
    for rep in range(args.reps):
        order = names if rep % 2 == 0 else names[::-1]
        for name in order:
            print(f"repetition {rep + 1}/{args.reps}: {name}", file=sys.stderr)
            runs[name].append(systems[name]())
    (out / "runs.json").write_text(json.dumps(
        {n: [{f"{q} {c}": v for (q, c), v in r.items()} for r in rs] for n, rs in runs.items()},
        indent=1))
    head = "| queue | N | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (2 + len(names))]
    for queue in QUEUES:
        for n in COUNTS:
            cells = []
            for name in names:
                vs = [r[(queue, n)] for r in runs[name]]
                cells.append(f"{statistics.median(vs):.3f} ({min(vs):.3f}-{max(vs):.3f})")
            lines.append(f"| {queue} | {n} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
