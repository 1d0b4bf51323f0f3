#!/usr/bin/env bash
# One-sided operations inside the node, quiver's windows (`examples/rma_bench.rs`)
# beside Open MPI's passive-target RMA (`bench/progs/mpi_rma.c`, MPI_Win_allocate +
# MPI_Win_lock_all, Put/Get/Fetch_and_op each followed by MPI_Win_flush), in one run,
# alternating per repetition, both pinned to cores 0 and 1; then quiver over UDP on
# loopback (host reliability and the offload engine), where Open MPI has no counterpart;
# and, per size, process_vm_readv's bandwidth (`bench/progs/copy_bw.c cma`, the kernel's
# single copy between two processes: the issue's ceiling inside the node).
# Prints per figure the median over repetitions and the quiver / Open MPI ratio of each
# repetition (paired).
#
# usage: bash bench/rma.sh              (REPS=3; about 2 minutes)
# Raw records: target/bench-rma/records.tsv (system, figure, size, rep, value)
set -euo pipefail
REPS=${REPS:-3}
SIZES=${SIZES:-65536,1048576,16777216}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/bench-rma
mkdir -p "$out"
cd "$root"
source bench/lib.sh
command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null \
    || { echo "bench/rma.sh: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
building cargo build --release -q -p quiver-cli -p quiver --example rma_bench
mpicc.openmpi -O2 -o "$out/mpi_rma" bench/progs/mpi_rma.c
cc -O2 -o "$out/copy_bw" bench/progs/copy_bw.c
Q=$root/target/release/quiver
rec=$out/records.tsv
: > "$rec"

record() {   # record SYSTEM REP < json lines
    python3 -c '
import json, sys
system, rep = sys.argv[1:]
for line in sys.stdin:
    line = line.split("] ", 1)[-1]
    if not line.startswith("{"):
        continue
    o = json.loads(line)
    for k, v in o.items():
        if k not in ("bench", "size"):
            print(system, k, o["size"], rep, v, sep="\t")' "$1" "$2" >> "$rec"
}
quiver() {   # quiver SYSTEM REP [env...]
    local system=$1 rep=$2; shift 2
    locked env QUIVER_WAIT=spin "$@" "$Q" run -n 2 -- taskset -c 0,1 \
        "$root/target/release/examples/rma_bench" "$SIZES" 10000 20 | record "$system" "$rep"
}
mpi() {
    locked mpirun.openmpi --allow-run-as-root -n 2 --bind-to core "$out/mpi_rma" "$SIZES" 10000 20 \
        | record "Open MPI (osc over sm)" "$1"
}
for rep in $(seq "$REPS"); do
    echo "repetition $rep/$REPS" >&2
    if [ $((rep % 2)) = 1 ]; then quiver "quiver shm" "$rep"; mpi "$rep"
    else mpi "$rep"; quiver "quiver shm" "$rep"; fi
    for size in ${SIZES//,/ }; do   # the kernel's single copy, the target's ceiling
        v=$(locked "$out/copy_bw" cma "$size" 0 1 | sed -n 's/^MBps=//p')
        printf 'process_vm_readv\tget_MBps\t%s\t%s\t%s\n' "$size" "$rep" "$v" >> "$rec"
        printf 'process_vm_readv\tput_MBps\t%s\t%s\t%s\n' "$size" "$rep" "$v" >> "$rec"
    done
    quiver "quiver udp host" "$rep" QUIVER_TRANSPORT=udp QUIVER_RELIABILITY=host
    quiver "quiver udp offload" "$rep" QUIVER_TRANSPORT=udp QUIVER_RELIABILITY=offload
done

python3 - "$rec" <<'PY'
import sys, statistics as st
from collections import defaultdict
R = defaultdict(dict)
for line in open(sys.argv[1]):
    system, fig, size, rep, v = line.rstrip("\n").split("\t")
    R[(system, fig, int(size))][int(rep)] = float(v)
systems = ["quiver shm", "Open MPI (osc over sm)", "process_vm_readv", "quiver udp host", "quiver udp offload"]
print("| figure | size | " + " | ".join(systems) + " | quiver shm / Open MPI (per repetition) | quiver shm / process_vm_readv |")
print("|---|---|" + "---|" * (len(systems) + 2))
for fig, size in sorted({(k[1], k[2]) for k in R}, key=lambda x: (x[1], x[0])):
    cells = []
    for s in systems:
        d = R.get((s, fig, size), {})
        cells.append(f"{st.median(d.values()):g}" if d else "-")
    a, b = R.get((systems[0], fig, size), {}), R.get((systems[1], fig, size), {})
    r = [a[k] / b[k] for k in sorted(set(a) & set(b)) if b[k] > 0]
    ratio = f"{st.median(r):.2f} ({', '.join(f'{x:.2f}' for x in r)})" if r else "-"
    c = R.get((systems[2], fig, size), {})
    rc = [a[k] / c[k] for k in sorted(set(a) & set(c)) if c[k] > 0]
    cma = f"{st.median(rc):.2f} ({', '.join(f'{x:.2f}' for x in rc)})" if rc else "-"
    unit = "µs" if fig.endswith("_us") else "MB/s"
    print(f"| {fig} ({unit}) | {size} B | " + " | ".join(cells) + f" | {ratio} | {cma} |")
PY
