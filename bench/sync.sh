#!/usr/bin/env bash
# The deposit seed's E-D1 and the barrier part of E-D6: the synchronization cost of one
# all-to-all step with no data, per scheme (`examples/rma_sync.rs`: per-pair
# acknowledgements, a combining-tree round, `Rma::barrier`), against the number of
# ranks: inside the node (2, 4, 8 ranks on this machine's cores, with Open MPI's
# MPI_Barrier from `bench/progs/mpi_rma.c` beside them) and on unshaped emulated
# clusters of 2, 4, 8 nodes with one rank each (raw Ethernet; Open MPI's MPI_Barrier
# over ob1/tcp on the same links, mpirun in a management namespace as bench/bcast.sh
# runs it); inside the node also with every rank bound to a core (both systems) and
# with quiver's ranks unbound.
# Medians over REPS runs of each run's slowest-rank median (both systems:
# bench/progs/mpi_rma.c reduces its ranks' medians with MPI_MAX).
#
# usage: bash bench/sync.sh     (REPS=3; needs root for the clusters and Open MPI)
# Raw records: target/bench-sync/records.tsv (where, ranks, scheme, rep, µs)
set -euo pipefail
REPS=${REPS:-3}
RANKS=${RANKS:-2 4 8}
NODES=${NODES:-2 4 8}
ITERS=${ITERS:-2000}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/bench-sync
mkdir -p "$out"
cd "$root"
source bench/lib.sh
[ "$(id -u)" = 0 ] || { echo "bench/sync.sh: needs root (emulated clusters)" >&2; exit 1; }
command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null \
    || { echo "bench/sync.sh: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
building cargo build --release -q -p quiver-cli -p quiver --example rma_sync
mpicc.openmpi -O2 -o "$out/mpi_rma" bench/progs/mpi_rma.c
Q=$root/target/release/quiver
rec=$out/records.tsv
: > "$rec"
cluster=""
MG=qvsync-mg-$$
cleanup() {
    ip netns del "$MG" 2>/dev/null || true
    [ -n "$cluster" ] && "$Q" cluster down "$cluster" >/dev/null 2>&1
    true
}
trap cleanup EXIT INT TERM

quiver_sync() {   # quiver_sync WHERE N REP [quiver run args...]
    local where=$1 n=$2 rep=$3; shift 3
    locked "$Q" run -n "$n" "$@" -- "$root/target/release/examples/rma_sync" "$ITERS" \
        | sed 's/^\[0\] //' | grep '^{' | python3 -c '
import json, sys
where, n, rep = sys.argv[1:]
for line in sys.stdin:
    o = json.loads(line)
    print(where, n, "quiver " + o["scheme"], rep, o["us"], sep="\t")' "$where" "$n" "$rep" >> "$rec"
}
mpi_barrier() {   # mpi_barrier WHERE N REP SCHEME COMMAND...
    local where=$1 n=$2 rep=$3 scheme=$4; shift 4
    locked "$@" | grep rma_barrier | python3 -c '
import json, sys
where, n, rep, scheme = sys.argv[1:]
for line in sys.stdin:
    print(where, n, scheme, rep, json.loads(line)["barrier_us"], sep="\t")' "$where" "$n" "$rep" "$scheme" >> "$rec"
}

for n in $RANKS; do
    for rep in $(seq "$REPS"); do
        echo "[$(date +%H:%M:%S)] inside the node, $n ranks, repetition $rep" >&2
        # Both systems as a user runs them (quiver run pins ranks to cores when they
        # outnumber the cores; Open MPI binds none then), both with each rank bound to
        # one core (quiver run --pin; mpirun --bind-to core), and quiver unbound
        # (--no-pin) beside Open MPI's default: unbound, the scheduler sometimes stacks
        # three ranks on one core and the barrier's time jumps by a context switch.
        quiver_sync node "$n" "$rep"
        quiver_sync node-pinned "$n" "$rep" --pin
        quiver_sync node-unpinned "$n" "$rep" --no-pin
        mpi_barrier node "$n" "$rep" "Open MPI MPI_Barrier" \
            mpirun.openmpi --allow-run-as-root --oversubscribe -n "$n" "$out/mpi_rma" 64 "$ITERS" 2
        mpi_barrier node-pinned "$n" "$rep" "Open MPI MPI_Barrier" \
            mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to core:overload-allowed \
            -n "$n" "$out/mpi_rma" 64 "$ITERS" 2
    done
done
for n in $NODES; do
    cluster=qvsync$$-$n
    "$Q" cluster up "$cluster" --nodes "$n" >/dev/null
    mgmt_up "$MG" "$cluster" "$n" || { echo "bench/sync.sh: management namespace failed" >&2; exit 1; }
    # pt2pt: Open MPI's default one-sided components would share memory between the
    # namespaces of this one host (the barrier itself goes over ob1/tcp either way).
    mpi_on_cluster "$MG" "$cluster" "$n" "$out/mpi_rma" 64 "$ITERS" 2
    mpi=(); for a in "${MPI_CMD[@]}"; do mpi+=("$a"); [ "$a" = mpirun.openmpi ] && mpi+=(--mca osc pt2pt); done
    for rep in $(seq "$REPS"); do
        echo "[$(date +%H:%M:%S)] $n nodes, repetition $rep" >&2
        QUIVER_TRANSPORT=eth quiver_sync cluster "$n" "$rep" --cluster "$cluster"
        mpi_barrier cluster "$n" "$rep" "Open MPI MPI_Barrier" "${mpi[@]}"
    done
    ip netns del "$MG"
    "$Q" cluster down "$cluster" >/dev/null
    cluster=""
done

python3 - "$rec" <<'PY'
import sys, statistics as st
from collections import defaultdict
R = defaultdict(list)
for line in open(sys.argv[1]):
    where, n, scheme, rep, v = line.rstrip("\n").split("\t")
    R[(where, int(n), scheme)].append(float(v))
schemes = ["quiver pairwise", "quiver tree", "quiver barrier", "Open MPI MPI_Barrier"]
# quiver unbound is compared with Open MPI's default run (unbound when oversubscribed).
for n in {k[1] for k in R}:
    if ("node", n, "Open MPI MPI_Barrier") in R:
        R[("node-unpinned", n, "Open MPI MPI_Barrier")] = R[("node", n, "Open MPI MPI_Barrier")]
for where, title in [("node", "Inside the node (ranks on 2 cores), both as a user runs them"),
                     ("node-pinned", "Inside the node, each rank bound to one core (quiver run --pin, mpirun --bind-to core)"),
                     ("node-unpinned", "Inside the node, quiver run --no-pin beside Open MPI's default"),
                     ("cluster", "Emulated cluster, one rank per node, raw Ethernet")]:
    print(f"\n{title}: µs per step, median over repetitions (min-max)\n")
    print("| ranks | " + " | ".join(schemes) + " |")
    print("|---|" + "---|" * len(schemes))
    for n in sorted({k[1] for k in R if k[0] == where}):
        cells = []
        for s in schemes:
            v = R.get((where, n, s))
            cells.append(f"{st.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "-")
        print(f"| {n} | " + " | ".join(cells) + " |")
# The barrier against MPI_Barrier, repetition by repetition (records in run order).
print("\nquiver barrier / MPI_Barrier, paired by repetition: median (per repetition)\n")
for (where, n, s), q in sorted(R.items()):
    if s != "quiver barrier" or (where, n, "Open MPI MPI_Barrier") not in R:
        continue
    r = [a / b for a, b in zip(q, R[(where, n, "Open MPI MPI_Barrier")])]
    print(f"- {where}, {n} ranks: {st.median(r):.2f} ({', '.join(f'{x:.2f}' for x in r)})")
PY
