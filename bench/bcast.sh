#!/usr/bin/env bash
# Broadcast on emulated clusters of N = 2, 4, 8 nodes (one rank per node): quiver's
# ports broadcast (Bind::to_all; crates/quiver/examples/ports_bcast.rs) natively (one
# raw Ethernet multicast frame per fragment, the engine's group channel) and down a
# binomial tree of unicasts (QUIVER_NATIVE_BROADCAST=off), beside Open MPI's MPI_Bcast
# (ob1/tcp on the same cluster's links; bench/progs/mpi_bcast.c, the same method), the
# order rotating within each repetition. Per size: the time until rank 0 has every receiver's acknowledgement
# of a broadcast (the last receiver's arrival plus one hop back), and the throughput of
# windows of broadcasts. mpirun runs in a management namespace joined to every node by a
# veth of its own (10.79.K.0/24) that carries only its PMIx traffic. The machine has two
# cores: with 4 and 8 nodes the ranks share them (QUIVER_WAIT=hybrid, Open MPI yields
# when oversubscribed), so the larger clusters measure scheduling as much as the network.
# Every cluster and namespace made here is removed at exit.
#
# usage: bash bench/bcast.sh                 (REPS=3, LINK=1gbit; about 5 minutes)
#        NODES="2 4" REPS=1 LINK=unlimited bash bench/bcast.sh
#        WAIT=block bash bench/bcast.sh      (QUIVER_WAIT of quiver's ranks; default the
#                                             library's, hybrid:100)
#        TRANSPORT=udp bash bench/bcast.sh   (quiver over UDP: IP multicast natively;
#                                             default eth)
# Results: target/bench-bcast/records.tsv (nodes, size, system, figure, rep, value) and
#          the table printed at the end.
set -uo pipefail
REPS=${REPS:-3}
NODES=${NODES:-2 4 8}
LINK=${LINK:-1gbit}
WAIT=${WAIT:-}
TRANSPORT=${TRANSPORT:-eth}
SIZES=${SIZES:-8,1024,65536}
ITERS=${ITERS:-500}
WINDOW=${WINDOW:-16}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/bench-bcast
mkdir -p "$out"
cd "$root"
source bench/lib.sh
Q=$root/target/release/quiver
rec=$out/records.tsv
raw=$out/raw.log
: > "$rec"; : > "$raw"
MG=qvbc-mg-$$
cluster=""
die() { echo "bench/bcast.sh: $*" >&2; exit 1; }
cleanup() {
    ip netns del "$MG" 2>/dev/null
    [ -n "$cluster" ] && "$Q" cluster down "$cluster" >/dev/null 2>&1
    true
}
trap cleanup EXIT INT TERM
[ "$(id -u)" = 0 ] || die "needs root (emulated clusters)"
command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null \
    || die "needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
building cargo build --release -q -p quiver-cli -p quiver --example ports_bcast || die "build failed"
mpicc.openmpi -O2 -o "$out/mpi_bcast" bench/progs/mpi_bcast.c || die "mpicc failed"

mgmt() { mgmt_up "$MG" "$cluster" "$1" || die "management namespace for $1 nodes"; }

quiver_run() {   # quiver_run N REP on|off
    local n=$1 rep=$2 native=$3
    local cmd=(env QUIVER_TRANSPORT="$TRANSPORT" QUIVER_NATIVE_BROADCAST="$native" ${WAIT:+QUIVER_WAIT=$WAIT}
               "$Q" run --cluster "$cluster" -n "$n" --timeout 300 --
               "$root/target/release/examples/ports_bcast" "$SIZES" "$ITERS" "$WINDOW")
    echo "== $(show "${cmd[@]}")" >> "$raw"
    locked "${cmd[@]}" 2>> "$raw" | tee -a "$raw" | sed 's/^\[0\] //' | grep '^{' | python3 -c '
import json, sys
n, rep = sys.argv[1:]
for line in sys.stdin:
    o = json.loads(line)
    print(n, o["size"], o["system"], "last_us", rep, o["last_us_median"], sep="\t")
    print(n, o["size"], o["system"], "MBps", rep, o["bcast_MBps"], sep="\t")' "$n" "$rep" >> "$rec"
}

mpi_run() {   # mpi_run N REP
    local n=$1 rep=$2
    mpi_on_cluster "$MG" "$cluster" "$n" "$out/mpi_bcast" "$SIZES" "$ITERS" "$WINDOW"
    local cmd=("${MPI_CMD[@]}")
    echo "== $(show "${cmd[@]}")" >> "$raw"
    locked "${cmd[@]}" 2>> "$raw" | tee -a "$raw" | while read -r what size v; do
        case $what in
            last) printf '%s\t%s\tOpen MPI MPI_Bcast (ob1/tcp)\tlast_us\t%s\t%s\n' "$n" "$size" "$rep" "$v" ;;
            bw) printf '%s\t%s\tOpen MPI MPI_Bcast (ob1/tcp)\tMBps\t%s\t%s\n' "$n" "$size" "$rep" "$v" ;;
        esac
    done >> "$rec"
}

for n in $NODES; do
    cluster=qvbc$$-$n
    echo "[$(date +%H:%M:%S)] $n nodes, --link $LINK" >&2
    "$Q" cluster up "$cluster" --nodes "$n" --link "$LINK" >> "$raw" 2>&1 || die "quiver cluster up failed (see $raw)"
    mgmt "$n"
    for rep in $(seq "$REPS"); do
        case $((rep % 3)) in
            1) quiver_run "$n" "$rep" on; quiver_run "$n" "$rep" off; mpi_run "$n" "$rep" ;;
            2) quiver_run "$n" "$rep" off; mpi_run "$n" "$rep"; quiver_run "$n" "$rep" on ;;
            0) mpi_run "$n" "$rep"; quiver_run "$n" "$rep" on; quiver_run "$n" "$rep" off ;;
        esac
    done
    ip netns del "$MG" 2>/dev/null
    "$Q" cluster down "$cluster" >> "$raw" 2>&1
    cluster=""
done

python3 - "$rec" "$LINK, quiver over $TRANSPORT" <<'EOF'
import sys, statistics as st
from collections import defaultdict
R = defaultdict(dict)
for line in open(sys.argv[1]):
    n, size, system, fig, rep, v = line.rstrip("\n").split("\t")
    R[(int(n), int(size), system, fig)][int(rep)] = float(v)
q, t, m = "quiver ports (native)", "quiver ports (tree)", "Open MPI MPI_Bcast (ob1/tcp)"
print(f"Link {sys.argv[2]}; medians over repetitions; ratios paired per repetition "
      "(median, min-max).\n")
def med(d): return st.median(d.values()) if d else float("nan")
def paired(a, b):
    r = [a[k] / b[k] for k in sorted(set(a) & set(b)) if b[k] > 0]
    return f"{st.median(r):.2f} ({min(r):.2f}-{max(r):.2f})" if r else "-"
for fig, title, unit in [("last_us", "Time until rank 0 has every receiver's acknowledgement", "µs"),
                         ("MBps", "Broadcast throughput (windows of broadcasts)", "MB/s")]:
    print(f"{title} ({unit}):\n")
    print("| nodes | size | native | tree | Open MPI | native / tree | native / Open MPI |")
    print("|---|---|---|---|---|---|---|")
    for n, size in sorted({(k[0], k[1]) for k in R}):
        a, b, c = (R.get((n, size, s, fig), {}) for s in (q, t, m))
        print(f"| {n} | {size} | {med(a):.2f} | {med(b):.2f} | {med(c):.2f} | {paired(a, b)} | {paired(a, c)} |")
    print()
EOF
